//! `meshcat describe cluster NAME --zone Z`: everything an operator asks first about
//! one cluster, from five reads made at once: the record, what the zone's control
//! server declares of it and its instances (`GET /clusters/{c}`), each instance's
//! sync with the control server (`GET /sync`), callers and callees (`GET /graph`
//! around it, depth 1), drift (`GET /clusters/{c}/drift`) and the last 10 history
//! entries (`GET /clusters/{c}/history`). A section whose read fails says why and the
//! others are still shown; only the record is required.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write;

use meshcat_common::model::HistoryEntry;
use serde_json::Value;

use super::{Ctx, emit, graph, history};
use crate::args::DescribeWhat;
use crate::client::{Call, CliError};
use crate::control::{self, Proxy};
use crate::render::{self, Cell, Table, now_ms, paint, s};

/// History entries shown.
const HISTORY: u32 = 10;

pub async fn run(ctx: &Ctx, what: DescribeWhat, out: &mut dyn Write) -> Result<(), CliError> {
    let DescribeWhat::Cluster { name, zone } = what;
    let record = Call::new(&["clusters", &name]).q("zoneName", &zone);
    let graph = Call::new(&["graph"])
        .q("zoneName", &zone)
        .q("clusterName", &name)
        .q("depth", "1");
    let drift = Call::new(&["clusters", &name, "drift"]).q("zoneName", &zone);
    let history = Call::new(&["clusters", &name, "history"])
        .q("zoneName", &zone)
        .q("limit", HISTORY.to_string());
    let sync = async {
        let answer = control::read_sync(&ctx.api, Some(&zone), Some(&name), None).await?;
        control::sync_answer(&answer)
    };
    let (record, graph, drift, history, sync) = tokio::join!(
        ctx.api.get(&record),
        ctx.api.get(&graph),
        ctx.api.get(&drift),
        ctx.api.get(&history),
        sync,
    );
    let view = record?
        .as_array()
        .and_then(|a| a.first().cloned())
        .ok_or_else(|| CliError::Body {
            what: format!("GET /clusters/{name}"),
            reason: "an empty list".into(),
        })?;
    let sections = Sections {
        graph: graph.map_err(|e| e.to_string()),
        drift: drift.map_err(|e| e.to_string()),
        history: history
            .map_err(|e| e.to_string())
            .and_then(|h| history::entries(&h)),
        sync: sync.map(|a| a.proxies).map_err(|e| e.to_string()),
    };
    emit(out, &describe(&view, &sections, now_ms(), ctx.width))
}

/// The reads besides the record, each with its answer or why it failed.
#[derive(Debug)]
pub struct Sections {
    pub graph: Result<Value, String>,
    pub drift: Result<Value, String>,
    pub history: Result<Vec<HistoryEntry>, String>,
    /// The cluster's sidecars' sync, from `GET /sync`.
    pub sync: Result<Vec<Proxy>, String>,
}

/// Labels and keys of the record's fields, in the order shown; empty optional
/// fields are left out.
const FIELDS: &[(&str, &str, bool)] = &[
    ("Name", "name", true),
    ("Owner", "owner", true),
    ("Owner URL", "ownerURL", false),
    ("Version", "version", true),
    ("Capability", "capability", false),
    ("Business impact", "businessImpact", false),
    ("Runtime", "runtime", false),
    ("Description", "description", false),
    ("Documentation", "documentation", false),
    ("API endpoint", "apiEndpoint", false),
    ("API spec", "apiSpecEndpoint", false),
    ("Prometheus job", "prometheusJob", false),
    ("Metrics template", "metricsTemplate", false),
    ("Cluster ID", "clusterID", false),
    ("Mesh ID", "meshID", false),
];

const LABEL: usize = 18;

/// One `Label:  value` line; a value of several lines (a description) goes on
/// under its first line, indented to it.
fn field(out: &mut String, label: &str, value: &str) {
    let value = value.replace('\n', &format!("\n{:LABEL$}", ""));
    let _ = writeln!(
        out,
        "{}{value}",
        paint(render::BOLD, &format!("{label:<LABEL$}"))
    );
}

/// The description as text. What the API answered is [`render::cleaned`] first: its
/// text reaches the terminal with control characters escaped (a field's own lines
/// kept, indented).
pub fn describe(view: &Value, sections: &Sections, now: i64, width: Option<usize>) -> String {
    let mut out = String::new();
    let view = &render::cleaned(view, true);
    let zone = s(view, "zoneName");
    let cluster = s(view, "clusterName");
    field(&mut out, "Cluster:", cluster);
    field(&mut out, "Zone:", zone);
    for (label, key, always) in FIELDS {
        let v = s(view, key);
        if *always || !v.is_empty() {
            field(&mut out, &format!("{label}:"), &render::or_dash(v));
        }
    }
    let list = |key: &str| {
        view[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|v| v.as_str().unwrap_or("").to_owned())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    for (label, key) in [
        ("Protocols:", "protocols"),
        ("Dependencies:", "dependencies"),
    ] {
        let items = list(key);
        if !items.is_empty() {
            field(&mut out, label, &items.join(", "));
        }
    }
    for l in view["externalLinks"].as_array().into_iter().flatten() {
        field(
            &mut out,
            "Link:",
            &format!("{} {}", s(l, "name"), s(l, "link")),
        );
    }
    let (min, max) = (
        view["minInstances"].as_i64().unwrap_or(0),
        view["maxInstances"].as_i64().unwrap_or(0),
    );
    field(
        &mut out,
        "Instances wanted:",
        &if max > 0 {
            format!("{min} to {max}")
        } else {
            format!("at least {min}")
        },
    );
    field(
        &mut out,
        "Metrics:",
        &format!(
            "instance {}, historical {}, port {}",
            on_off(&view["enableInstanceMetrics"]),
            on_off(&view["enableHistoricalMetrics"]),
            view["metricsPort"].as_i64().unwrap_or(0)
        ),
    );

    if let Some(cp) = view["controlPlane"].as_object() {
        field(&mut out, "Control plane:", &control_plane(cp));
    }

    let status = s(view, "status");
    field(
        &mut out,
        "Status:",
        &format!(
            "{} ({})",
            paint(render::status_style(status), status),
            status_reason(view)
        ),
    );
    if let Some(id) = view["identity"].as_object() {
        field(&mut out, "Identity:", &identity(id, now));
    }
    let entries: &[HistoryEntry] = sections.history.as_deref().unwrap_or_default();
    if let Some(change) = entries.iter().find(|e| e.kind == "status-changed") {
        field(
            &mut out,
            "Last change:",
            &format!(
                "{} ago, {}",
                render::age(change.at_ms, now),
                render::clean(&history::detail(&change.kind, &change.detail))
            ),
        );
    }

    out.push('\n');
    let instances = view["instances"].as_array().map_or(&[][..], Vec::as_slice);
    if view["authorized"] == Value::Bool(false) {
        out.push_str("Instances: hidden (live data needs the read token)\n");
    } else if instances.is_empty() {
        out.push_str("Instances: none live\n");
    } else {
        let _ = writeln!(out, "Instances ({}):", instances.len());
        // Keyed by the name as the cleaned view writes it.
        let proxies: HashMap<String, &Proxy> = sections
            .sync
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|p| (render::clean_lines(&p.instance), p))
            .collect();
        let mut t = Table::new(&["NAME", "STARTED", "AGE", "SOURCE", "SYNC", "IDENTITY"]);
        let mut details = Vec::new();
        for i in instances {
            let start = i["startTime"].as_i64().unwrap_or(0);
            let name = s(i, "name");
            let source = match s(i, "source") {
                "" => "agent",
                other => other,
            };
            let proxy = proxies.get(name);
            let state = proxy.map_or("-", |p| p.state.as_str());
            let id_state = match s(&i["identity"], "state") {
                "" => "-",
                other => other,
            };
            let id_style = meshcat_common::identity::CertState::parse(id_state)
                .map_or(render::PLAIN, super::certs::state_style);
            t.row(vec![
                name.into(),
                render::time(start).into(),
                render::age(start, now).into(),
                source.into(),
                Cell::styled(state, render::sync_style(state)),
                Cell::styled(id_state, id_style),
            ]);
            if let Some(p) = proxy.filter(|p| !matches!(p.state.as_str(), "synced" | "unknown")) {
                details.push(format!(
                    "{name} {} since {}: {}",
                    p.state,
                    render::time(p.since_ms),
                    render::or_dash(&p.detail.text)
                ));
            }
        }
        out.push_str(&indent(&t.render(width.map(|w| w.saturating_sub(2)))));
        match &sections.sync {
            Ok(_) if details.is_empty() => {}
            Ok(_) => {
                out.push_str("Sync:\n");
                for d in details {
                    let _ = writeln!(out, "  {}", render::clean(&d));
                }
            }
            Err(why) => {
                let _ = writeln!(out, "Sync: unavailable: {}", render::clean(why));
            }
        }
    }

    out.push('\n');
    match &sections.graph {
        Ok(g) => {
            let g = &render::cleaned(g, false);
            let id = format!("{zone}/{cluster}");
            let window = g["windowSeconds"].as_u64().unwrap_or(0);
            let edges = g["edges"].as_array().map_or(&[][..], Vec::as_slice);
            for (title, mine, other) in [
                ("Callers", "target", "source"),
                ("Callees", "source", "target"),
            ] {
                let list: Vec<&Value> = edges.iter().filter(|e| s(e, mine) == id).collect();
                if list.is_empty() {
                    let _ = writeln!(out, "{title}: none");
                    continue;
                }
                let _ = writeln!(out, "{title} ({}):", list.len());
                let mut t =
                    Table::new(&[if title == "Callers" { "FROM" } else { "TO" }, "TRAFFIC"]);
                for e in list {
                    let style = if super::graph::failing(g, e) {
                        render::RED
                    } else {
                        render::PLAIN
                    };
                    t.row(vec![
                        s(e, other).into(),
                        Cell::styled(graph::edge_words(e, window), style),
                    ]);
                }
                out.push_str(&indent(&t.render(width.map(|w| w.saturating_sub(2)))));
            }
        }
        Err(why) => {
            let _ = writeln!(
                out,
                "Callers and callees: unavailable: {}",
                render::clean(why)
            );
        }
    }

    out.push('\n');
    match &sections.drift {
        Ok(d) => out.push_str(&drift(&render::cleaned(d, false))),
        Err(why) => {
            let _ = writeln!(out, "Drift: unavailable: {}", render::clean(why));
        }
    }

    out.push('\n');
    match &sections.history {
        Ok(_) if entries.is_empty() => out.push_str("History: no entries\n"),
        Ok(_) => {
            let _ = writeln!(out, "History (last {}, newest first):", entries.len());
            out.push_str(&indent(
                &history::table(entries, false).render(width.map(|w| w.saturating_sub(2))),
            ));
        }
        Err(why) => {
            let _ = writeln!(out, "History: unavailable: {}", render::clean(why));
        }
    }
    out
}

/// The cluster's identity in words: its state, its soonest expiry and its SPIFFE
/// IDs.
fn identity(id: &serde_json::Map<String, Value>, now: i64) -> String {
    let state = id.get("state").and_then(Value::as_str).unwrap_or("none");
    let mut words = paint(
        meshcat_common::identity::CertState::parse(state)
            .map_or(render::PLAIN, super::certs::state_style),
        state,
    );
    if let Some(at) = id.get("expiresAtMs").and_then(Value::as_i64) {
        let when = if at <= now {
            format!("expired {} ago", render::age(at, now))
        } else {
            format!("in {}", render::age(now, at))
        };
        let _ = write!(words, ", expires {} ({when})", render::time(at));
    }
    let ids: Vec<&str> = id
        .get("spiffeIds")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !ids.is_empty() {
        let _ = write!(words, ", {}", ids.join(" "));
    }
    words
}

/// What the zone's control server declares of the cluster, in words.
fn control_plane(cp: &serde_json::Map<String, Value>) -> String {
    if cp.get("declared") != Some(&Value::Bool(true)) {
        return "not declared by the zone's control server".into();
    }
    let n = |k: &str| cp.get(k).and_then(Value::as_u64).unwrap_or(0);
    let endpoints = n("endpoints");
    format!(
        "declared, {endpoints} endpoint{} ({} healthy)",
        if endpoints == 1 { "" } else { "s" },
        n("healthyEndpoints")
    )
}

fn on_off(v: &Value) -> &'static str {
    if v.as_bool().unwrap_or(false) {
        "on"
    } else {
        "off"
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// Why the cluster has its status, from the rules of `docs/status.md` and what the
/// view shows: the live instances against minInstances and maxInstances; a warning
/// within those bounds can only be the error ratio.
pub fn status_reason(view: &Value) -> String {
    if view["authorized"] == Value::Bool(false) {
        return "the reason needs the read token: instances are live data".into();
    }
    let live = view["instances"].as_array().map_or(0, Vec::len) as i64;
    let min = view["minInstances"].as_i64().unwrap_or(0);
    let max = view["maxInstances"].as_i64().unwrap_or(0);
    let n = |k: i64| format!("{k} live instance{}", if k == 1 { "" } else { "s" });
    match s(view, "status") {
        "down" => "no live instance".into(),
        "warning" if live < min => format!("{}, fewer than minInstances {min}", n(live)),
        "warning" if max > 0 && live > max => {
            format!("{}, more than maxInstances {max}", n(live))
        }
        "warning" => format!(
            "{}, but the error ratio of the last report window is above the warning threshold",
            n(live)
        ),
        "stable" => format!(
            "{} within the wanted count, error ratio under the warning threshold",
            n(live)
        ),
        other => format!("status {other}"),
    }
}

/// The drift section.
fn drift(d: &Value) -> String {
    let groups = d["groups"].as_array().map_or(&[][..], Vec::as_slice);
    let mut out = String::new();
    if d["drifted"] != Value::Bool(true) {
        // Without drift the answer has one group, with every live instance (an
        // empty list when none is live).
        let live = groups
            .iter()
            .any(|g| g["instances"].as_array().is_some_and(|a| !a.is_empty()));
        let hash = groups
            .first()
            .and_then(|g| g["configHash"].as_str())
            .map_or_else(String::new, |h| format!(" (configuration {h})"));
        let _ = writeln!(
            out,
            "Drift: none{}",
            if !live {
                ": no live instance".to_owned()
            } else {
                format!(": every live instance runs one configuration{hash}")
            }
        );
        return out;
    }
    let differs = render::strings(&d["differs"]);
    let _ = writeln!(
        out,
        "Drift: {} ({} configurations; {} differ)",
        paint(render::YELLOW, "drifted"),
        groups.len(),
        differs.join(", ")
    );
    for g in groups {
        let names = render::strings(&g["instances"]);
        let _ = writeln!(
            out,
            "  {}: {}",
            g["configHash"].as_str().unwrap_or("no hash reported"),
            names.join(", ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn view(status: &str, instances: usize, min: i64, max: i64) -> Value {
        let list: Vec<Value> = (0..instances)
            .map(|i| json!({"name": format!("catalog-{i}"), "startTime": 1_700_000_000_000i64}))
            .collect();
        json!({"zoneName": "local", "clusterName": "catalog", "name": "Catalog",
               "owner": "team-catalog", "ownerURL": "https://teams.example/catalog",
               "version": "1.4.2", "minInstances": min, "maxInstances": max,
               "dependencies": ["ledger"], "protocols": ["http"],
               "enableInstanceMetrics": true, "metricsPort": 9901,
               "authorized": true, "instances": list, "status": status})
    }

    #[test]
    fn status_reasons_follow_the_rules() {
        assert_eq!(status_reason(&view("down", 0, 1, 0)), "no live instance");
        assert_eq!(
            status_reason(&view("warning", 1, 2, 0)),
            "1 live instance, fewer than minInstances 2"
        );
        assert_eq!(
            status_reason(&view("warning", 3, 1, 2)),
            "3 live instances, more than maxInstances 2"
        );
        assert!(status_reason(&view("warning", 2, 1, 0)).contains("error ratio"));
        assert!(status_reason(&view("stable", 2, 1, 0)).starts_with("2 live instances within"));
        let mut hidden = view("stable", 0, 0, 0);
        hidden["authorized"] = json!(false);
        assert!(status_reason(&hidden).contains("read token"));
    }

    #[test]
    fn a_whole_description() {
        let graph = json!({"windowSeconds": 60, "errorRatioWarning": 0.05, "nodes": [], "edges": [
            {"source": "local/edge", "target": "local/catalog", "requests": 12, "rps": 0.2,
             "errors": 0, "errorRatio": 0.0, "p50Ms": 1.0, "p99Ms": 4.0, "tls": false,
             "observed": true, "declared": true, "lastSeenMs": 1},
            {"source": "local/catalog", "target": "local/ledger", "requests": 0, "rps": 0.0,
             "errors": 0, "errorRatio": 0.0, "p50Ms": null, "p99Ms": null, "tls": false,
             "observed": false, "declared": true, "lastSeenMs": null}]});
        let drift = json!({"drifted": true, "differs": ["routes"], "groups": [
            {"configHash": "3f2a", "instances": ["catalog-0"]},
            {"configHash": "9c1d", "instances": ["catalog-1"]}]});
        let history = json!([
            {"id": 2, "atMs": 1_700_000_300_000i64, "kind": "status-changed", "zoneName": "local",
             "clusterName": "catalog", "instance": "",
             "detail": {"from": "down", "to": "stable", "reason": "1 live instance"}},
            {"id": 1, "atMs": 1_700_000_000_000i64, "kind": "cluster-registered", "zoneName": "local",
             "clusterName": "catalog", "instance": "", "detail": {}}]);
        let sync = control::sync_answer(&json!({"index": 3, "proxies": [
            {"zoneName": "local", "clusterName": "catalog", "instance": "catalog-0",
             "state": "synced", "sinceMs": 1_700_000_000_000i64, "detail": {"text": ""}},
            {"zoneName": "local", "clusterName": "catalog", "instance": "catalog-1",
             "state": "stale", "sinceMs": 1_700_000_300_000i64,
             "detail": {"text": "cluster ledger: 1 missing (10.0.0.7:8080), 0 extra, since 22:18:20\u{1b}[2J"}}]}))
        .unwrap();
        let sections = Sections {
            graph: Ok(graph),
            drift: Ok(drift),
            history: history::entries(&history),
            sync: Ok(sync.proxies),
        };
        let now = 1_700_000_600_000;
        let mut v = view("stable", 2, 1, 0);
        v["controlPlane"] = json!({"declared": true, "endpoints": 3, "healthyEndpoints": 2});
        v["identity"] = json!({"state": "expiring", "expiresAtMs": now + 2 * 86_400_000,
            "spiffeIds": ["spiffe://local/sa/catalog"]});
        v["instances"][0]["identity"] = json!({"state": "expiring"});
        let text = anstream::adapter::strip_str(&describe(&v, &sections, now, None)).to_string();
        for want in [
            "Cluster:          catalog\n",
            "Zone:             local\n",
            "Owner:            team-catalog\n",
            "Owner URL:        https://teams.example/catalog\n",
            "Dependencies:     ledger\n",
            "Instances wanted: at least 1\n",
            "Status:           stable (2 live instances within",
            "Last change:      5m ago, down -> stable: 1 live instance\n",
            "Control plane:    declared, 3 endpoints (2 healthy)\n",
            "Instances (2):\n  NAME        STARTED                AGE   SOURCE   SYNC     IDENTITY\n  catalog-0   2023-11-14T22:13:20Z   10m   agent    synced   expiring\n  catalog-1   2023-11-14T22:13:20Z   10m   agent    stale    -\n",
            "Identity:         expiring, expires 2023-11-16T22:23:20Z (in 2d), spiffe://local/sa/catalog\n",
            "Sync:\n  catalog-1 stale since 2023-11-14T22:18:20Z: cluster ledger: 1 missing (10.0.0.7:8080), 0 extra, since 22:18:20\\u{1b}[2J\n",
            "Callers (1):\n  FROM         TRAFFIC\n  local/edge   12 requests (0.2/s), 0 errors (0.0%), p50 1ms, p99 4ms, plaintext, observed, declared\n",
            "Callees (1):\n  TO             TRAFFIC\n  local/ledger   0 requests",
            "Drift: drifted (2 configurations; routes differ)\n  3f2a: catalog-0\n  9c1d: catalog-1\n",
            "History (last 2, newest first):\n  TIME ",
            "cluster-registered",
        ] {
            assert!(text.contains(want), "{want:?} in:\n{text}");
        }
        assert!(
            !text.contains("Capability:"),
            "empty optional fields are left out: {text}"
        );

        let failed = Sections {
            graph: Err("GET /graph: A read token is configured (403 forbidden)".into()),
            drift: Ok(
                json!({"drifted": false, "differs": [], "groups": [{"configHash": "3f2a", "instances": ["catalog-0"]}]}),
            ),
            history: Err("GET /clusters/catalog/history: No resource (404 not_found)".into()),
            sync: Err("GET /sync: No resource (404 not_found)".into()),
        };
        let text =
            anstream::adapter::strip_str(&describe(&view("down", 0, 1, 0), &failed, now, None))
                .to_string();
        assert!(
            text.contains("Callers and callees: unavailable: GET /graph: A read token"),
            "{text}"
        );
        assert!(
            text.contains(
                "Drift: none: every live instance runs one configuration (configuration 3f2a)"
            ),
            "{text}"
        );
        assert!(text.contains("History: unavailable: "), "{text}");
        assert!(text.contains("Instances: none live"), "{text}");
        assert!(
            !text.contains("Control plane:") && !text.contains("Sync"),
            "an older aggregator's record, no instance to sync: {text}"
        );
    }

    /// Instances from the control server, when no agent reports the cluster: no
    /// sidecar, so no sync state; a sync read that failed is said under the table.
    #[test]
    fn instances_from_the_control_server_and_sync_unavailable() {
        let mut v = view("stable", 0, 1, 0);
        v["instances"] = json!([{"name": "10.0.0.7:8080", "startTime": 1_700_000_000_000i64,
                                 "source": "control-server"}]);
        v["controlPlane"] = json!({"declared": false, "endpoints": 0, "healthyEndpoints": 0});
        let sections = Sections {
            graph: Ok(json!({"edges": []})),
            drift: Ok(json!({"drifted": false, "groups": []})),
            history: Ok(Vec::new()),
            sync: Err("GET /sync: A read token is configured (403 forbidden)".into()),
        };
        let text = anstream::adapter::strip_str(&describe(&v, &sections, 1_700_000_060_000, None))
            .to_string();
        for want in [
            "Control plane:    not declared by the zone's control server\n",
            "  NAME            STARTED                AGE   SOURCE           SYNC   IDENTITY\n  10.0.0.7:8080   2023-11-14T22:13:20Z   60s   control-server   -      -\n",
            "Sync: unavailable: GET /sync: A read token is configured (403 forbidden)\n",
        ] {
            assert!(text.contains(want), "{want:?} in:\n{text}");
        }
    }

    /// Without drift the API answers one group of every live instance: an empty one
    /// when none is live.
    #[test]
    fn drift_with_no_live_instance_says_so() {
        for d in [
            json!({"drifted": false, "differs": [], "groups": [{"configHash": null, "instances": []}]}),
            json!({"drifted": false, "differs": [], "groups": []}),
        ] {
            let text = anstream::adapter::strip_str(&drift(&d)).to_string();
            assert_eq!(text, "Drift: none: no live instance\n", "{d}");
        }
    }
}
