//! `meshcat history`: what changed, newest first (`GET /history`, contract section
//! 15), and the rendering of history entries that `describe`, `diagnose` (a
//! report's recent changes) and `watch` (`history` events) share.

use std::io::Write;
use std::time::Duration;

use meshcat_common::model::HistoryEntry;
use serde_json::Value;

use super::{Ctx, emit};
use crate::args::{Format, HistoryArgs};
use crate::client::{Call, CliError};
use crate::render::{self, Table, now_ms, or_dash};

pub async fn run(ctx: &Ctx, args: HistoryArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let since = args.since.map(|d| since_ms(now_ms(), d).to_string());
    let call = Call::new(&["history"])
        .q_opt("zoneName", args.zone)
        .q_opt("clusterName", args.cluster)
        .q_opt("since", since)
        .q_opt("limit", args.limit.map(|n| n.to_string()));
    let (answer, incomplete) = ctx
        .api
        .get_with_header(&call, "x-meshcat-history-incomplete")
        .await?;
    if let Some(at) = incomplete {
        eprintln!("{}", incomplete_note(&render::clean(&at)));
    }
    let text = match args.output.output {
        Format::Table => {
            let list = entries(&answer).map_err(|reason| CliError::Body {
                what: "GET /history".into(),
                reason,
            })?;
            table(&list, true).render(ctx.width)
        }
        f => render::data(&answer, f)?,
    };
    emit(out, &text)
}

/// What standard error says when the aggregator stopped its search at its bound of
/// examined entries (`X-Meshcat-History-Incomplete`, the time of the last one).
fn incomplete_note(at: &str) -> String {
    let when = at
        .parse::<i64>()
        .map_or_else(|_| at.to_owned(), render::time);
    format!(
        "meshcat: the aggregator searched the history back to {when} only (its bound of entries examined per query); narrow with --cluster or --since to see older entries."
    )
}

/// The start of a `--since` window, in ms since the epoch.
pub fn since_ms(now: i64, ago: Duration) -> i64 {
    now.saturating_sub(i64::try_from(ago.as_millis()).unwrap_or(i64::MAX))
        .max(0)
}

/// The entries of an answer of `GET /history` or `GET /clusters/{c}/history`: an
/// array of entries, newest first.
pub fn entries(answer: &Value) -> Result<Vec<HistoryEntry>, String> {
    serde_json::from_value(answer.clone()).map_err(|e| format!("not history entries: {e}"))
}

/// `TIME KIND ZONE CLUSTER INSTANCE DETAIL`; `describe` leaves out the zone and the
/// cluster (`whole` false), which it names already. `-` where an entry has no
/// cluster (a zone's own entries) or no instance.
pub fn table(entries: &[HistoryEntry], whole: bool) -> Table {
    let mut t = if whole {
        Table::new(&["TIME", "KIND", "ZONE", "CLUSTER", "INSTANCE", "DETAIL"])
    } else {
        Table::new(&["TIME", "KIND", "INSTANCE", "DETAIL"])
    };
    for e in entries {
        let mut row = vec![render::time(e.at_ms).into(), e.kind.as_str().into()];
        if whole {
            row.push(or_dash(&e.zone_name).into());
            row.push(or_dash(&e.cluster_name).into());
        }
        row.push(or_dash(&e.instance).into());
        row.push(detail(&e.kind, &e.detail).into());
        t.row(row);
    }
    t
}

/// An entry's detail in a few words, by kind (the fields of contract section 15);
/// a detail of another shape is written out as `key=value` pairs.
pub fn detail(kind: &str, d: &Value) -> String {
    let text = |k: &str| match &d[k] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    let list = |k: &str| {
        d[k].as_array().map(|a| {
            a.iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                .collect::<Vec<_>>()
                .join(", ")
        })
    };
    let known = match kind {
        "cluster-updated" | "zone-updated" => list("changed").map(|c| format!("changed: {c}")),
        "instance-joined" => d["startTime"]
            .as_i64()
            .map(|t| format!("started {}", render::time(t))),
        "instance-left" => Some(format!("reason: {}", text("reason"))),
        "instance-restarted" => d["startTime"].as_i64().map(|t| {
            let was = d["previousStartTime"]
                .as_i64()
                .map_or_else(String::new, |p| format!(" (was {})", render::time(p)));
            format!("started {}{was}", render::time(t))
        }),
        "status-changed" => Some(format!(
            "{} -> {}{}",
            text("from"),
            text("to"),
            colon(&text("reason"))
        )),
        "config-changed" => Some(format!(
            "{} -> {}{}",
            text("from"),
            text("to"),
            list("resources").map_or_else(String::new, |r| format!(" ({r})"))
        )),
        "log-level-changed" => Some(format!(
            "{} -> {} by {}",
            text("from"),
            text("to"),
            text("by")
        )),
        "debug-window" => Some(format!("{}s", text("seconds"))),
        "sync-changed" => Some(format!(
            "{} -> {}{}",
            text("from"),
            text("to"),
            colon(&text("detail"))
        )),
        "control-changed" => Some(format!(
            "{} -> {}{}",
            text("from"),
            text("to"),
            colon(&text("error"))
        )),
        "certificate-rotated" => Some(format!(
            "{} -> {}, expires {}{}",
            text("previousSerial"),
            text("serial"),
            d["expiresAtMs"]
                .as_i64()
                .map_or_else(String::new, render::time),
            colon(&text("secret"))
        )),
        "certificate-state" => Some(format!(
            "{} -> {}{}",
            text("from"),
            text("to"),
            d["expiresAtMs"]
                .as_i64()
                .map_or_else(String::new, |t| format!(", expires {}", render::time(t)))
        )),
        "tls-mismatch" | "tls-match" => Some(format!(
            "to {}: expects {}; presented {}",
            text("target"),
            list("expectedSans").unwrap_or_default(),
            list("presentedSans").unwrap_or_default()
        )),
        // A diagnosis without a symptom ran every check, as `diagnose` says it.
        "diagnosed" => Some(format!(
            "{}{}",
            Some(text("symptom"))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "all checks".into()),
            colon(&text("conclusion"))
        )),
        _ => None,
    };
    known.unwrap_or_else(|| pairs(d))
}

/// `: text`, or nothing when `text` is empty.
pub fn colon(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

/// `key=value ...` of an object (its text itself for anything else).
fn pairs(d: &Value) -> String {
    match d {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}={s}"),
                other => format!("{k}={other}"),
            })
            .collect::<Vec<_>>()
            .join(" "),
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Entries shaped as contract section 15 says, newest first.
    fn sample() -> Value {
        json!([
            {"id": 7, "atMs": 1_700_000_600_000i64, "kind": "status-changed", "zoneName": "local",
             "clusterName": "catalog", "instance": "",
             "detail": {"from": "stable", "to": "down", "reason": "no live instance"}},
            {"id": 6, "atMs": 1_700_000_500_000i64, "kind": "instance-left", "zoneName": "local",
             "clusterName": "catalog", "instance": "catalog-0", "detail": {"reason": "disconnected"}},
            {"id": 5, "atMs": 1_700_000_400_000i64, "kind": "cluster-updated", "zoneName": "local",
             "clusterName": "catalog", "instance": "", "detail": {"changed": ["owner", "version"]}},
            {"id": 4, "atMs": 1_700_000_300_000i64, "kind": "config-changed", "zoneName": "local",
             "clusterName": "catalog", "instance": "catalog-0",
             "detail": {"from": "3f2a", "to": "9c1d", "resources": ["listeners", "routes"]}},
            {"id": 3, "atMs": 1_700_000_200_000i64, "kind": "instance-joined", "zoneName": "local",
             "clusterName": "catalog", "instance": "catalog-0",
             "detail": {"startTime": 1_700_000_000_000i64}},
            {"id": 2, "atMs": 1_700_000_100_000i64, "kind": "zone-registered", "zoneName": "local",
             "clusterName": "", "instance": "", "detail": {}},
            {"id": 1, "atMs": 1_700_000_000_000i64, "kind": "log-level-changed", "zoneName": "local",
             "clusterName": "catalog", "instance": "catalog-0",
             "detail": {"from": "info", "to": "debug", "by": "api"}},
        ])
    }

    #[test]
    fn entries_render_newest_first_with_their_detail() {
        let list = entries(&sample()).unwrap();
        let text = anstream::adapter::strip_str(&table(&list, true).render(None)).to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 8, "{text}");
        assert!(lines[0].starts_with("TIME "), "{text}");
        assert!(
            lines[1].starts_with("2023-11-14T22:23:20Z   status-changed"),
            "{text}"
        );
        assert!(
            lines[1].ends_with("stable -> down: no live instance"),
            "{text}"
        );
        assert!(
            lines[2].ends_with("catalog-0   reason: disconnected"),
            "{text}"
        );
        assert!(lines[3].ends_with("changed: owner, version"), "{text}");
        assert!(
            lines[4].ends_with("3f2a -> 9c1d (listeners, routes)"),
            "{text}"
        );
        assert!(lines[5].ends_with("started 2023-11-14T22:13:20Z"), "{text}");
        assert!(
            lines[6].contains("zone-registered     local   -         -"),
            "{text}"
        );
        assert!(lines[7].ends_with("info -> debug by api"), "{text}");
    }

    #[test]
    fn unknown_shapes_are_written_out() {
        assert_eq!(detail("drift-started", &json!({"groups": 2})), "groups=2");
        assert_eq!(
            detail("something-new", &json!({"a": "b", "n": [1]})),
            "a=b n=[1]"
        );
        assert_eq!(
            detail(
                "instance-restarted",
                &json!({"startTime": 1_700_000_000_000i64, "previousStartTime": 1_699_999_000_000i64})
            ),
            "started 2023-11-14T22:13:20Z (was 2023-11-14T21:56:40Z)"
        );
        assert_eq!(
            detail(
                "diagnosed",
                &json!({"symptom": "no_healthy_upstream", "conclusion": "All checks passed."})
            ),
            "no_healthy_upstream: All checks passed."
        );
        assert_eq!(
            detail(
                "diagnosed",
                &json!({"symptom": null, "conclusion": "No check failed.", "rootCause": null})
            ),
            "all checks: No check failed."
        );
        assert_eq!(
            detail(
                "sync-changed",
                &json!({"from": "synced", "to": "stale",
                        "detail": "cluster payments: 1 missing (10.0.0.7:8080), 0 extra, since 12:01:03"})
            ),
            "synced -> stale: cluster payments: 1 missing (10.0.0.7:8080), 0 extra, since 12:01:03"
        );
        assert_eq!(
            detail(
                "control-changed",
                &json!({"from": "connected", "to": "unreachable", "error": "connection refused"})
            ),
            "connected -> unreachable: connection refused"
        );
        assert_eq!(
            detail(
                "control-changed",
                &json!({"from": "connecting", "to": "connected", "error": ""})
            ),
            "connecting -> connected"
        );
        assert_eq!(
            detail(
                "zone-updated",
                &json!({"changed": ["requestCluster", "serverAddress"]})
            ),
            "changed: requestCluster, serverAddress"
        );
        let e = entries(&json!({"entries": sample()})).unwrap_err();
        assert!(e.starts_with("not history entries: "), "{e}");
    }

    #[test]
    fn since_is_a_window_back_from_now() {
        assert_eq!(
            since_ms(10_000_000, Duration::from_secs(3600)),
            10_000_000 - 3_600_000
        );
        assert_eq!(since_ms(1000, Duration::from_secs(3600)), 0);
    }
}
