//! `meshcat check`: a checklist in the manner of `linkerd check`. It reads
//! `GET /status` (the replica's version, readiness, agents per zone, recent agent
//! rejections, what the token grants), the clusters that are down, the graph's
//! drifted nodes, each registered zone's control state (`GET /zones/{z}/control`)
//! and the sidecars that are stale or rejected (`GET /sync`), and prints one line
//! per item; any failed item makes the exit status 1 and is named at the end.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;

use serde_json::Value;

use super::{Ctx, emit};
use crate::client::{Call, CliError, is_not_found};
use crate::control::{self, Proxy, SyncAnswer, ZoneControl};
use crate::render::{self, paint, s};

/// Clusters named in one item at most.
const NAMED: usize = 5;

/// One item's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// Worth knowing, not a failure.
    Warn,
    Fail,
}

/// One line of the checklist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub verdict: Verdict,
    pub name: String,
    pub detail: String,
}

fn item(verdict: Verdict, name: impl Into<String>, detail: impl Into<String>) -> Item {
    Item {
        verdict,
        name: name.into(),
        detail: detail.into(),
    }
}

pub async fn run(ctx: &Ctx, out: &mut dyn Write) -> Result<(), CliError> {
    emit(out, &format!("meshcat check of {}\n\n", ctx.api.base()))?;
    let status = match ctx.api.get(&Call::new(&["status"])).await {
        Ok(s) => s,
        Err(e @ (CliError::Unreachable { .. } | CliError::Body { .. })) => {
            emit(
                out,
                &lines(&[item(Verdict::Fail, "API reachable", e.to_string())]),
            )?;
            return Err(e);
        }
        Err(e) => {
            let why = if is_not_found(&e) {
                format!("{e}: the aggregator is older than this meshcat (no GET /status)")
            } else {
                e.to_string()
            };
            let items = [
                item(Verdict::Ok, "API reachable", ""),
                item(Verdict::Fail, "API status", why),
            ];
            emit(out, &lines(&items))?;
            return Err(failed(&items));
        }
    };
    let down = Call::new(&["clusters"]).q("status", "down");
    let graph = Call::new(&["graph"]);
    let zones: Vec<String> = status["zones"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|z| z["registered"] == Value::Bool(true))
        .map(|z| s(z, "zoneName").to_owned())
        .collect();
    let sync = |state| async move {
        let answer = control::read_sync(&ctx.api, None, None, Some(state)).await?;
        control::sync_answer(&answer)
    };
    let certificates = Call::new(&["certificates"])
        .q("state", "expired")
        .q("state", "rotation-overdue")
        .q("state", "expiring");
    let (down, graph, controls, stale, rejected, certificates) = tokio::join!(
        ctx.api.get(&down),
        ctx.api.get(&graph),
        control::read_controls(&ctx.api, &zones),
        sync("stale"),
        sync("rejected"),
        ctx.api.get(&certificates),
    );
    let mut items = items(
        &status,
        env!("CARGO_PKG_VERSION"),
        down.map_err(|e| e.to_string()),
        graph.map_err(|e| (e.status(), e.to_string())),
    );
    items.push(control_item(
        zones
            .into_iter()
            .zip(controls.into_iter().map(refusal))
            .collect(),
    ));
    items.push(sync_item(refusal(stale), refusal(rejected)));
    items.push(identity_item(refusal(certificates)));
    emit(out, &lines(&items))?;
    let fails = items.iter().filter(|i| i.verdict == Verdict::Fail).count();
    emit(
        out,
        &if fails == 0 {
            format!(
                "\nStatus check results are {}\n",
                paint(render::GREEN, "ok")
            )
        } else {
            format!(
                "\nStatus check results: {} of {} failed\n",
                paint(render::RED, &fails.to_string()),
                items.len()
            )
        },
    )?;
    if fails > 0 {
        return Err(failed(&items));
    }
    Ok(())
}

/// A read's answer, or its refusal's status code and its words.
type Read<T> = Result<T, (Option<u16>, String)>;

fn refusal<T>(r: Result<T, CliError>) -> Read<T> {
    r.map_err(|e| (e.status(), e.to_string()))
}

/// "every zone's control server connected", from each registered zone's control
/// state: a zone passes connected, or `disabled` (the aggregator is told not to
/// connect); any other state fails, named with its error. Without the read token it
/// is not checked (a warning); neither is it against an aggregator that answers 404
/// for every zone (older than this `meshcat`). A single 404 among answers is a zone
/// deleted since `/status` was read, and is left out.
pub fn control_item(zones: Vec<(String, Read<ZoneControl>)>) -> Item {
    let name = "every zone's control server connected";
    if zones.is_empty() {
        return item(Verdict::Ok, name, "no zone is registered");
    }
    if zones.iter().any(|(_, r)| matches!(r, Err((Some(403), _)))) {
        return item(
            Verdict::Warn,
            name,
            "not checked: the control servers' state is live data and needs the read token",
        );
    }
    if zones.iter().all(|(_, r)| matches!(r, Err((Some(404), _)))) {
        return item(
            Verdict::Warn,
            name,
            "not checked: the aggregator is older than this meshcat (no GET /zones/{zoneName}/control)",
        );
    }
    let mut states: BTreeMap<&str, usize> = BTreeMap::new();
    let mut failing = Vec::new();
    for (zone, r) in &zones {
        match r {
            Ok(c) if c.passes() => *states.entry(c.state.as_str()).or_default() += 1,
            Ok(c) => {
                *states.entry(c.state.as_str()).or_default() += 1;
                failing.push(if c.error.is_empty() {
                    format!("zone {zone} {}", c.state)
                } else {
                    format!("zone {zone} {} ({})", c.state, c.error)
                });
            }
            Err((Some(404), _)) => {}
            Err((_, why)) => failing.push(format!("zone {zone}: cannot tell: {why}")),
        }
    }
    let counts = states
        .iter()
        .map(|(state, n)| format!("{n} {state}"))
        .collect::<Vec<_>>()
        .join(", ");
    if failing.is_empty() {
        item(Verdict::Ok, name, counts)
    } else {
        item(
            Verdict::Fail,
            name,
            format!(
                "{} of {} not connected: {}",
                failing.len(),
                zones.len(),
                names_with(&failing, "; ")
            ),
        )
    }
}

/// "no stale or rejected sidecar", from `GET /sync?state=stale` and
/// `?state=rejected`: the sidecars named, the first few, with their state. Without
/// the read token, or against an aggregator without `/sync`, not checked (a
/// warning).
pub fn sync_item(stale: Read<SyncAnswer>, rejected: Read<SyncAnswer>) -> Item {
    let name = "no stale or rejected sidecar";
    let (stale, rejected) = match (stale, rejected) {
        (Ok(a), Ok(b)) => (a, b),
        (Err((Some(403), _)), _) | (_, Err((Some(403), _))) => {
            return item(
                Verdict::Warn,
                name,
                "not checked: sync is live data and needs the read token",
            );
        }
        (Err((Some(404), _)), _) | (_, Err((Some(404), _))) => {
            return item(
                Verdict::Warn,
                name,
                "not checked: the aggregator is older than this meshcat (no GET /sync)",
            );
        }
        (Err((_, why)), _) | (_, Err((_, why))) => {
            return item(Verdict::Fail, name, format!("cannot tell: {why}"));
        }
    };
    let mut failing: Vec<Proxy> = stale
        .proxies
        .into_iter()
        .chain(rejected.proxies)
        .filter(Proxy::failing)
        .collect();
    if failing.is_empty() {
        return item(Verdict::Ok, name, "");
    }
    failing.sort_by(|a, b| {
        (&a.zone_name, &a.cluster_name, &a.instance).cmp(&(
            &b.zone_name,
            &b.cluster_name,
            &b.instance,
        ))
    });
    let refs: Vec<&Proxy> = failing.iter().collect();
    item(Verdict::Fail, name, super::sync::summary(&refs))
}

/// "no certificate expired, rotation-overdue or expiring", from `GET /certificates`
/// with those states: the certificates named, the first few, with their state.
/// Without the read token, or against an aggregator without `/certificates`, not
/// checked (a warning).
pub fn identity_item(answer: Read<Value>) -> Item {
    let name = "no certificate expired, rotation-overdue or expiring";
    let rows = match answer {
        Ok(rows) => rows,
        Err((Some(403), _)) => {
            return item(
                Verdict::Warn,
                name,
                "not checked: certificates are live data and need the read token",
            );
        }
        Err((Some(404), _)) => {
            return item(
                Verdict::Warn,
                name,
                "not checked: the aggregator is older than this meshcat (no GET /certificates)",
            );
        }
        Err((_, why)) => return item(Verdict::Fail, name, format!("cannot tell: {why}")),
    };
    let listed: Vec<String> = rows
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            format!(
                "{}/{}/{} {} ({})",
                s(r, "zoneName"),
                s(r, "clusterName"),
                s(r, "instance"),
                s(r, "role"),
                s(r, "state")
            )
        })
        .collect();
    if listed.is_empty() {
        item(Verdict::Ok, name, "")
    } else {
        item(
            Verdict::Fail,
            name,
            format!(
                "{} certificate{}: {}",
                listed.len(),
                plural(listed.len() as u64),
                names(&listed)
            ),
        )
    }
}

/// The error naming every failed item.
fn failed(items: &[Item]) -> CliError {
    let names: Vec<&str> = items
        .iter()
        .filter(|i| i.verdict == Verdict::Fail)
        .map(|i| i.name.as_str())
        .collect();
    CliError::Failed(format!("check failed: {}", names.join("; ")))
}

/// The checklist as text, one line per item (what an item quotes of the API's
/// answers with its control characters escaped).
pub fn lines(items: &[Item]) -> String {
    let mut out = String::new();
    for i in items {
        let mark = match i.verdict {
            Verdict::Ok => paint(render::GREEN, "[ok]  "),
            Verdict::Warn => paint(render::YELLOW, "[warn]"),
            Verdict::Fail => paint(render::RED, "[FAIL]"),
        };
        let name = render::clean(&i.name);
        if i.detail.is_empty() {
            let _ = writeln!(out, "{mark} {name}");
        } else {
            let _ = writeln!(out, "{mark} {name}: {}", render::clean(&i.detail));
        }
    }
    out
}

fn names(list: &[String]) -> String {
    names_with(list, ", ")
}

/// The first [`NAMED`] of `list` joined by `sep`, and how many more.
fn names_with(list: &[String], sep: &str) -> String {
    let mut text = list
        .iter()
        .take(NAMED)
        .cloned()
        .collect::<Vec<_>>()
        .join(sep);
    if list.len() > NAMED {
        let _ = write!(text, " and {} more", list.len() - NAMED);
    }
    text
}

/// The items from what the API answered: `GET /status`, the clusters that are down,
/// and the graph (or its refusal, with the status code).
pub fn items(
    status: &Value,
    cli_version: &str,
    down: Result<Value, String>,
    graph: Result<Value, (Option<u16>, String)>,
) -> Vec<Item> {
    let mut out = vec![item(Verdict::Ok, "API reachable", "")];
    let replica = status["replica"]
        .as_str()
        .map_or_else(String::new, |r| format!("replica {r}"));
    out.push(if status["ready"] == Value::Bool(true) {
        item(Verdict::Ok, "API ready", replica)
    } else {
        item(
            Verdict::Fail,
            "API ready",
            "the aggregator is starting (catalog not loaded) or stopping",
        )
    });
    let server = s(status, "version");
    out.push(item(
        if server == cli_version {
            Verdict::Ok
        } else {
            Verdict::Warn
        },
        "versions",
        format!("meshcat {cli_version}, aggregator {server}"),
    ));
    out.push(token(status));

    let zones = status["zones"].as_array().map_or(&[][..], Vec::as_slice);
    let ingest = status["ingest"] == Value::Bool(true);
    let registered: Vec<&Value> = zones
        .iter()
        .filter(|z| z["registered"] == Value::Bool(true))
        .collect();
    if registered.is_empty() {
        out.push(item(Verdict::Warn, "zones", "no zone is registered"));
    }
    for z in registered {
        let name = format!("zone {} has a connected agent", s(z, "zoneName"));
        let agents = z["agents"].as_u64().unwrap_or(0);
        let instances = z["instances"].as_u64().unwrap_or(0);
        let peers = z["peerInstances"].as_u64().unwrap_or(0);
        out.push(if agents > 0 {
            item(
                Verdict::Ok,
                name,
                format!(
                    "{agents} agent{} reporting {instances} instance{}",
                    plural(agents),
                    plural(instances)
                ),
            )
        } else if peers > 0 {
            item(
                Verdict::Ok,
                name,
                format!(
                    "{peers} instance{} reported through other replicas",
                    plural(peers)
                ),
            )
        } else if !ingest {
            item(
                Verdict::Fail,
                name,
                "agent ingest is off on this aggregator",
            )
        } else {
            item(
                Verdict::Fail,
                name,
                "no connected agent reports an instance of it",
            )
        });
    }
    // The aggregator names zones nobody registered only to callers who may read
    // live data.
    if s(status, "access") == "none" {
        out.push(item(
            Verdict::Warn,
            "zones without a registration",
            "not checked: the zones agents report into are live data and need the read token",
        ));
    }
    for z in zones
        .iter()
        .filter(|z| z["registered"] == Value::Bool(false))
    {
        out.push(item(
            Verdict::Warn,
            format!("zone {} is registered", s(z, "zoneName")),
            "agents report instances of it, but nobody registered it",
        ));
    }

    out.push(match down {
        Ok(list) => {
            let down: Vec<String> = list
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| format!("{}/{}", s(c, "zoneName"), s(c, "clusterName")))
                .collect();
            if down.is_empty() {
                item(Verdict::Ok, "no cluster down", "")
            } else {
                item(
                    Verdict::Fail,
                    "no cluster down",
                    format!("{} down: {}", down.len(), names(&down)),
                )
            }
        }
        Err(why) => item(
            Verdict::Fail,
            "no cluster down",
            format!("cannot tell: {why}"),
        ),
    });

    out.push(match graph {
        Ok(g) => {
            let drifted: Vec<String> = g["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|n| n["drifted"] == Value::Bool(true))
                .map(|n| s(n, "id").to_owned())
                .collect();
            if drifted.is_empty() {
                item(Verdict::Ok, "no drifted cluster", "")
            } else {
                item(
                    Verdict::Fail,
                    "no drifted cluster",
                    format!(
                        "{} drifted (instances run different configurations): {}",
                        drifted.len(),
                        names(&drifted)
                    ),
                )
            }
        }
        Err((Some(403), _)) => item(
            Verdict::Warn,
            "no drifted cluster",
            "not checked: drift is live data and needs the read token",
        ),
        Err((_, why)) => item(
            Verdict::Fail,
            "no drifted cluster",
            format!("cannot tell: {why}"),
        ),
    });

    let r = &status["rejections"];
    let total = r["total"].as_u64().unwrap_or(0);
    let window = r["windowSeconds"].as_u64().unwrap_or(0);
    let name = "no recent agent rejections";
    out.push(if total == 0 {
        item(
            Verdict::Ok,
            name,
            format!("none in the last {}", minutes(window)),
        )
    } else {
        let reasons: Vec<String> = r["byReason"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        item(
            Verdict::Fail,
            name,
            format!(
                "{total} in the last {}: {} (see the aggregator's log)",
                minutes(window),
                reasons.join(", ")
            ),
        )
    });
    out
}

fn minutes(seconds: u64) -> String {
    if seconds % 60 == 0 {
        format!("{}m", seconds / 60)
    } else {
        format!("{seconds}s")
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The token item from `access` (what the token grants) and `token` (whether the
/// aggregator knew it).
fn token(status: &Value) -> Item {
    let access = s(status, "access");
    let name = "token accepted";
    match (s(status, "token"), access) {
        ("refused", _) => item(
            Verdict::Fail,
            name,
            "the aggregator does not know this token (neither its read nor its write token)",
        ),
        (_, "none") => item(
            Verdict::Fail,
            name,
            "live data needs the read token: give it with --token-file",
        ),
        ("accepted", "write") => item(Verdict::Ok, name, "grants write"),
        ("accepted", _) => item(
            Verdict::Ok,
            name,
            "grants read (writes need the write token)",
        ),
        (_, "write") => item(
            Verdict::Ok,
            name,
            "none needed: the aggregator lets anyone write",
        ),
        (_, _) => item(
            Verdict::Ok,
            name,
            "none needed to read (writes need the write token)",
        ),
    }
}

#[cfg(test)]
mod identity_tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn certificates_that_need_action_fail_the_item() {
        assert_eq!(identity_item(Ok(json!([]))).verdict, Verdict::Ok);
        let failing = identity_item(Ok(json!([
            {"zoneName": "shop", "clusterName": "orders", "instance": "orders-1",
             "role": "chain", "state": "expired"}
        ])));
        assert_eq!(failing.verdict, Verdict::Fail);
        assert_eq!(
            failing.detail,
            "1 certificate: shop/orders/orders-1 chain (expired)"
        );
        assert_eq!(
            identity_item(Err((Some(403), "forbidden".into()))).verdict,
            Verdict::Warn
        );
        assert_eq!(
            identity_item(Err((Some(500), "boom".into()))).verdict,
            Verdict::Fail
        );
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn status() -> Value {
        json!({"version": "0.1.0", "replica": null, "store": "redb", "ready": true,
               "access": "write", "token": "accepted", "ingest": true, "agentsConnected": 1,
               "zones": [{"zoneName": "local", "registered": true, "agents": 1, "instances": 2, "peerInstances": 0}],
               "rejections": {"windowSeconds": 300, "total": 0, "byReason": {}}})
    }

    fn graph(drifted: bool) -> Value {
        json!({"nodes": [{"id": "local/catalog", "drifted": drifted}], "edges": []})
    }

    fn verdicts(items: &[Item]) -> Vec<(Verdict, String)> {
        items.iter().map(|i| (i.verdict, i.name.clone())).collect()
    }

    #[test]
    fn a_healthy_mesh_passes_every_item() {
        let items = items(&status(), "0.1.0", Ok(json!([])), Ok(graph(false)));
        assert!(items.iter().all(|i| i.verdict == Verdict::Ok), "{items:#?}");
        let text = anstream::adapter::strip_str(&lines(&items)).to_string();
        assert_eq!(
            text,
            "[ok]   API reachable\n\
             [ok]   API ready\n\
             [ok]   versions: meshcat 0.1.0, aggregator 0.1.0\n\
             [ok]   token accepted: grants write\n\
             [ok]   zone local has a connected agent: 1 agent reporting 2 instances\n\
             [ok]   no cluster down\n\
             [ok]   no drifted cluster\n\
             [ok]   no recent agent rejections: none in the last 5m\n"
        );
    }

    #[test]
    fn failures_are_named() {
        let mut st = status();
        st["zones"][0]["agents"] = json!(0);
        st["zones"][0]["instances"] = json!(0);
        st["rejections"] =
            json!({"windowSeconds": 300, "total": 3, "byReason": {"auth": 2, "decode": 1}});
        st["version"] = json!("0.2.0");
        st["token"] = json!("refused");
        st["access"] = json!("none");
        let items = items(
            &st,
            "0.1.0",
            Ok(json!([{"zoneName": "local", "clusterName": "catalog"}])),
            Ok(graph(true)),
        );
        assert_eq!(
            verdicts(&items),
            vec![
                (Verdict::Ok, "API reachable".into()),
                (Verdict::Ok, "API ready".into()),
                (Verdict::Warn, "versions".into()),
                (Verdict::Fail, "token accepted".into()),
                (Verdict::Fail, "zone local has a connected agent".into()),
                (Verdict::Warn, "zones without a registration".into()),
                (Verdict::Fail, "no cluster down".into()),
                (Verdict::Fail, "no drifted cluster".into()),
                (Verdict::Fail, "no recent agent rejections".into()),
            ]
        );
        assert_eq!(
            items[5].detail,
            "not checked: the zones agents report into are live data and need the read token"
        );
        assert_eq!(items[6].detail, "1 down: local/catalog");
        assert_eq!(
            items[8].detail,
            "3 in the last 5m: auth 2, decode 1 (see the aggregator's log)"
        );
        assert_eq!(
            failed(&items).to_string(),
            "check failed: token accepted; zone local has a connected agent; no cluster down; no drifted cluster; no recent agent rejections"
        );
    }

    #[test]
    fn replicas_and_missing_tokens() {
        let mut st = status();
        st["replica"] = json!("r2");
        st["zones"][0]["agents"] = json!(0);
        st["zones"][0]["peerInstances"] = json!(2);
        st["token"] = json!("absent");
        st["access"] = json!("read");
        let items = items(
            &st,
            "0.1.0",
            Ok(json!([])),
            Err((Some(403), "forbidden".into())),
        );
        assert_eq!(items[1].detail, "replica r2");
        assert_eq!(
            items[3].detail,
            "none needed to read (writes need the write token)"
        );
        assert_eq!(
            items[4],
            item(
                Verdict::Ok,
                "zone local has a connected agent",
                "2 instances reported through other replicas"
            )
        );
        assert_eq!(items[6].verdict, Verdict::Warn);
        st["ingest"] = json!(false);
        st["zones"][0]["peerInstances"] = json!(0);
        let items = super::items(&st, "0.1.0", Ok(json!([])), Ok(graph(false)));
        assert_eq!(items[4].detail, "agent ingest is off on this aggregator");
    }

    fn zone(state: &str, error: &str) -> Read<ZoneControl> {
        Ok(ZoneControl {
            state: state.into(),
            error: error.into(),
            ..ZoneControl::default()
        })
    }

    #[test]
    fn control_servers_connected_or_disabled_pass() {
        let ok = control_item(vec![
            ("shop".into(), zone("connected", "")),
            ("west".into(), zone("connected", "")),
            ("lab".into(), zone("disabled", "")),
        ]);
        assert_eq!(
            ok,
            item(
                Verdict::Ok,
                "every zone's control server connected",
                "2 connected, 1 disabled"
            )
        );
        let text = anstream::adapter::strip_str(&lines(&[ok])).to_string();
        assert_eq!(
            text,
            "[ok]   every zone's control server connected: 2 connected, 1 disabled\n"
        );
        assert_eq!(control_item(vec![]).verdict, Verdict::Ok);
    }

    #[test]
    fn a_zone_not_connected_is_named_with_its_state_and_error() {
        let bad = control_item(vec![
            ("shop".into(), zone("unreachable", "connection refused")),
            (
                "west".into(),
                zone("tls-error", "invalid peer certificate: UnknownIssuer"),
            ),
            ("east".into(), zone("connecting", "")),
            ("lab".into(), zone("connected", "")),
            ("gone".into(), Err((Some(404), "not found".into()))),
            (
                "odd".into(),
                Err((
                    Some(500),
                    "GET /zones/odd/control: boom (500 internal)".into(),
                )),
            ),
        ]);
        assert_eq!(bad.verdict, Verdict::Fail);
        assert_eq!(
            bad.detail,
            "4 of 6 not connected: zone shop unreachable (connection refused); \
             zone west tls-error (invalid peer certificate: UnknownIssuer); zone east connecting; \
             zone odd: cannot tell: GET /zones/odd/control: boom (500 internal)"
        );
        assert_eq!(
            failed(std::slice::from_ref(&bad)).to_string(),
            "check failed: every zone's control server connected"
        );
        // A hostile error is escaped on the line.
        let hostile = control_item(vec![("shop".into(), zone("rejected", "bad\n\u{1b}[2J"))]);
        let text = lines(&[hostile]);
        assert!(
            text.ends_with("zone shop rejected (bad\\n\\u{1b}[2J)\n"),
            "{text:?}"
        );
    }

    #[test]
    fn control_servers_not_checked_without_the_token_or_the_route() {
        let forbidden = control_item(vec![
            ("shop".into(), Err((Some(403), "forbidden".into()))),
            ("west".into(), Err((Some(403), "forbidden".into()))),
        ]);
        assert_eq!(forbidden.verdict, Verdict::Warn);
        assert!(forbidden.detail.contains("read token"), "{forbidden:?}");
        let older = control_item(vec![("shop".into(), Err((Some(404), "no route".into())))]);
        assert_eq!(older.verdict, Verdict::Warn);
        assert!(
            older.detail.contains("older than this meshcat"),
            "{older:?}"
        );
    }

    fn proxies(list: &[(&str, &str, &str)]) -> Read<SyncAnswer> {
        Ok(SyncAnswer {
            index: 3,
            proxies: list
                .iter()
                .map(|(cluster, instance, state)| Proxy {
                    zone_name: "shop".into(),
                    cluster_name: (*cluster).into(),
                    instance: (*instance).into(),
                    state: (*state).into(),
                    ..Proxy::default()
                })
                .collect(),
        })
    }

    #[test]
    fn stale_and_rejected_sidecars_are_named() {
        let name = "no stale or rejected sidecar";
        assert_eq!(
            sync_item(proxies(&[]), proxies(&[])),
            item(Verdict::Ok, name, "")
        );
        let failed = sync_item(
            proxies(&[("orders", "orders-2", "stale")]),
            proxies(&[("orders", "orders-1", "rejected")]),
        );
        assert_eq!(
            failed,
            item(
                Verdict::Fail,
                name,
                "1 stale, 1 rejected: shop/orders/orders-1 (rejected), shop/orders/orders-2 (stale)"
            )
        );
        let forbidden = sync_item(Err((Some(403), "forbidden".into())), proxies(&[]));
        assert_eq!(forbidden.verdict, Verdict::Warn);
        assert!(forbidden.detail.contains("read token"), "{forbidden:?}");
        let older = sync_item(proxies(&[]), Err((Some(404), "no route".into())));
        assert_eq!(older.verdict, Verdict::Warn);
        assert!(older.detail.contains("no GET /sync"), "{older:?}");
        let broken = sync_item(Err((None, "unreachable".into())), proxies(&[]));
        assert_eq!(
            broken,
            item(Verdict::Fail, name, "cannot tell: unreachable")
        );
    }
}
