//! The agent's readers of the admin API's smaller answers and of Envoy's own log
//! against references, on generated input (docs/reliability.md, "Parsers"):
//! `/stats` (serde's reading of its value types, checked against a plain walk over
//! serde_json's value), the rejection records of Envoy's log and the stat names of
//! the xDS subscriptions (against the format Envoy writes, field by field), the
//! protobuf duration of `/server_info`, and the loggers of `POST /logging`.

use std::collections::BTreeMap;
use std::time::Duration;

use meshcat_common::differential::corrupt::{is_invalid_json, mutate};
use meshcat_common::differential::json::{
    Json, any_value, number, object_with, render, style, text,
};
use meshcat_common::differential::{config, same};
use proptest::prelude::*;
use serde_json::Value;

use super::model::{StatsResponse, StatsSnapshot, parse_loggers, parse_proto_duration};
use super::xds::{Kind, RejectionLog, Subscription, subscription_of};

/// What the agent reads of a `/stats` answer: the counters and gauges, and the
/// interval p50 and p99 of each histogram.
fn read_stats(text: &[u8]) -> Result<(BTreeMap<String, u64>, usize), String> {
    let r: StatsResponse = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    let snap = StatsSnapshot::from(r);
    Ok((snap.values, snap.histograms.len()))
}

/// The reference: the answer as serde_json's value, walked as the agent's model
/// says (a value that is a whole number of 64 bits is kept, any other value is
/// none; a name or histogram block of another type refuses the answer).
fn reference_stats(text: &[u8]) -> Result<(BTreeMap<String, u64>, usize), String> {
    let doc: Value = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    let doc = doc.as_object().ok_or("not an object")?;
    let mut values = BTreeMap::new();
    let mut histograms = std::collections::BTreeSet::new();
    let stats = match doc.get("stats") {
        None => return Ok((values, 0)),
        Some(s) => s.as_array().ok_or("stats is not a list")?,
    };
    for entry in stats {
        let entry = entry.as_object().ok_or("an entry is not an object")?;
        let name = match entry.get("name") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err("a name is not a string".into()),
        };
        let value = entry.get("value").and_then(Value::as_u64);
        if let (Some(name), Some(v)) = (name, value) {
            values.insert(name, v);
        }
        match entry.get("histograms") {
            None | Some(Value::Null) => {}
            Some(Value::Object(h)) => {
                for d in h
                    .get("details")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let name = d
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or("a histogram has no name")?;
                    if !name.starts_with("cluster.") {
                        histograms.insert(name.to_owned());
                    }
                }
            }
            Some(_) => return Err("histograms is not an object".into()),
        }
    }
    Ok((values, histograms.len()))
}

fn stat_value() -> impl Strategy<Value = Option<Json>> {
    proptest::option::weighted(
        0.9,
        prop_oneof![
            6 => any::<u64>().prop_map(Json::int),
            1 => any::<i64>().prop_map(Json::int),
            2 => number().prop_map(Json::Number),
            1 => text().prop_map(Json::String),
            1 => any_value(2, 3),
        ],
    )
}

fn stats_answer() -> impl Strategy<Value = Json> {
    let entry = prop_oneof![
        8 => ("[a-z_.]{1,24}", stat_value()).prop_flat_map(|(name, value)| {
            object_with(vec![("name", Some(Json::String(name))), ("value", value)])
        }),
        1 => proptest::collection::vec("[a-z_.]{1,16}", 0..4).prop_flat_map(|names| {
            let details = Json::Array(
                names
                    .into_iter()
                    .map(|n| Json::object([("name", Json::String(n)), ("totals", Json::Array(Vec::new()))]))
                    .collect(),
            );
            object_with(vec![
                ("histograms", Some(Json::object([("details", details), ("supported_percentiles", Json::Array(Vec::new()))]))),
            ])
        }),
    ];
    proptest::collection::vec(entry, 0..12)
        .prop_flat_map(|entries| object_with(vec![("stats", Some(Json::Array(entries)))]))
}

/// A rejection record as Envoy 1.40 writes it over several lines.
#[derive(Debug, Clone)]
struct Record {
    kind: Kind,
    resource: String,
    reason: String,
    at_ms: i64,
}

fn record() -> impl Strategy<Value = Record> {
    (
        proptest::sample::select(
            &[
                Kind::Clusters,
                Kind::Listeners,
                Kind::Endpoints,
                Kind::Routes,
            ][..],
        ),
        "[a-z0-9_.\"\\\\ é-]{1,16}",
        "[a-zA-Z0-9 ()=.,_-]{1,40}"
            .prop_map(|r| r.trim().to_owned())
            .prop_filter("a reason", |r| !r.is_empty()),
        (1_700_000_000_000i64..1_900_000_000_000),
    )
        .prop_map(|(kind, resource, reason, at_ms)| Record {
            kind,
            resource,
            reason,
            at_ms,
        })
}

/// `s` in protobuf's text form (C escapes; bytes past ASCII in octal, as
/// `DebugString` prints them).
fn c_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            0x20..=0x7e => out.push(char::from(b)),
            _ => out.push_str(&format!("\\{b:03o}")),
        }
    }
    out
}

/// The record's lines, as Envoy writes them.
fn write_record(r: &Record, tid: u32) -> Vec<String> {
    let url = match r.kind {
        Kind::Clusters => "envoy.config.cluster.v3.Cluster",
        Kind::Listeners => "envoy.config.listener.v3.Listener",
        Kind::Endpoints => "envoy.config.endpoint.v3.ClusterLoadAssignment",
        Kind::Routes => "envoy.config.route.v3.RouteConfiguration",
    };
    let stamp = meshcat_common::envoy_log::rfc3339_text(r.at_ms);
    let prefix = if r.kind == Kind::Listeners {
        format!("Error adding/updating listener(s) {}: ", r.resource)
    } else {
        String::new()
    };
    let field = if r.kind == Kind::Endpoints {
        "cluster_name"
    } else {
        "name"
    };
    vec![
        format!(
            "[{} {}][{tid}][warning][config] [source/extensions/config_subscription/grpc/grpc_subscription_impl.cc:160] gRPC config for type.googleapis.com/{url} rejected: {prefix}goo.gle/debugstr    ",
            &stamp[..10],
            &stamp[11..23]
        ),
        format!("{field}: \"{}\"", c_escape(&r.resource)),
        "type: STATIC".into(),
        "connect_timeout {".into(),
        "}".into(),
        format!(": {}", r.reason),
    ]
}

/// The reason the agent reports for `r`: Envoy's, with the listener's prefix, and
/// the resource in front for the kinds whose subscription names none.
fn reason_of(r: &Record) -> String {
    let reason = match r.kind {
        Kind::Listeners => format!(
            "Error adding/updating listener(s) {}: {}",
            r.resource, r.reason
        ),
        _ => r.reason.clone(),
    };
    if matches!(r.kind, Kind::Clusters | Kind::Listeners) && !reason.contains(&r.resource) {
        format!("{}: {reason}", r.resource)
    } else {
        reason
    }
}

proptest! {
    #![proptest_config(config(1_024))]

    #[test]
    fn stats_read_as_the_reference_reads_them(doc in stats_answer(), style in style()) {
        let text = render(&doc, &style);
        same(&read_stats(text.as_bytes()), &reference_stats(text.as_bytes()))?;
    }

    #[test]
    fn changed_stats_never_panic(
        changed in (stats_answer(), style()).prop_flat_map(|(d, s)| mutate(render(&d, &s).into_bytes())),
    ) {
        let got = read_stats(&changed);
        if is_invalid_json(&changed) {
            prop_assert!(got.is_err() || serde_json::from_slice::<serde::de::IgnoredAny>(&changed).is_ok());
        }
    }

    /// Records written as Envoy writes them, among its other lines, read back with
    /// their kind, resource, reason and time, however the lines are split between
    /// reads.
    #[test]
    fn rejection_records_read_back_as_written(
        records in proptest::collection::vec(record(), 1..5),
        pause_every in proptest::option::of(1usize..7),
    ) {
        let mut lines = vec!["[2026-11-27 17:36:58.327][16510][info][main] [source/server/server.cc:463] initializing epoch 0".to_owned()];
        for (i, r) in records.iter().enumerate() {
            lines.extend(write_record(r, 16_510 + i as u32));
            lines.push("[2026-11-27 17:37:02.300][16510][info][upstream] [source/common/upstream/cds_api_helper.cc:32] cds: add 1 cluster(s)".into());
        }
        let mut log = RejectionLog::default();
        for (i, l) in lines.iter().enumerate() {
            log.line(i as u64 + 1, 0, l);
            if pause_every.is_some_and(|n| (i + 1) % n == 0) {
                log.pause();
            }
        }
        log.pause();
        // The newest of each subscription is kept.
        let mut want: BTreeMap<(Kind, String), (String, i64)> = BTreeMap::new();
        for r in &records {
            let key = if matches!(r.kind, Kind::Clusters | Kind::Listeners) { String::new() } else { r.resource.clone() };
            want.insert((r.kind, key), (reason_of(r), r.at_ms));
        }
        let got: BTreeMap<(Kind, String), (String, i64)> = log
            .records()
            .map(|r| {
                let key = if matches!(r.kind, Kind::Clusters | Kind::Listeners) { String::new() } else { r.resource.clone() };
                ((r.kind, key), (r.reason.clone(), r.at_ms))
            })
            .collect();
        prop_assert_eq!(got, want);
        for r in log.records() {
            prop_assert!(records.iter().any(|w| w.resource == r.resource), "{:?}", r);
        }
    }

    /// Any lines: never a panic.
    #[test]
    fn any_log_lines_never_panic(lines in proptest::collection::vec(".{0,60}", 0..30)) {
        let mut log = RejectionLog::default();
        for (i, l) in lines.iter().enumerate() {
            log.line(i as u64 + 1, 0, l);
        }
        log.pause();
    }

    /// The stat names of each subscription, as Envoy names them, name it back; other
    /// names name none.
    #[test]
    fn subscription_stats_name_their_subscription(
        kind in proptest::sample::select(&[Kind::Clusters, Kind::Listeners, Kind::Endpoints, Kind::Routes][..]),
        resource in "[a-z0-9_-]{1,12}(\\.[a-z0-9_-]{1,8}){0,2}",
        prefix in "[a-z0-9_]{1,10}",
        counter in prop_oneof![Just("update_rejected"), Just("update_success"), Just("update_time"), Just("update_attempt")],
        other in "[a-z0-9_.]{0,30}",
    ) {
        let (name, resource) = match kind {
            Kind::Clusters => ("cluster_manager.cds".to_owned(), String::new()),
            Kind::Listeners => ("listener_manager.lds".to_owned(), String::new()),
            Kind::Endpoints => (format!("cluster.{resource}"), resource.clone()),
            Kind::Routes => (format!("http.{prefix}.rds.{resource}"), resource.clone()),
        };
        let stat = format!("{name}.{counter}");
        let want = Subscription { kind, resource };
        prop_assert_eq!(subscription_of(&stat), Some((want, name.as_str())));
        let got = subscription_of(&other);
        if !other.rsplit('.').next().unwrap_or("").starts_with("update_") {
            prop_assert_eq!(got, None);
        }
    }

    /// Protobuf JSON durations (`32s`, `1.500s`) read back to the millisecond; any
    /// text is an error or a duration, never a panic.
    #[test]
    fn proto_durations_read_back(secs in 0u64..10_000_000_000, ms in 0u32..1000, frac in any::<bool>(), junk in ".{0,16}") {
        let text = if frac { format!("{secs}.{ms:03}s") } else { format!("{secs}s") };
        let d = parse_proto_duration(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let want = Duration::from_secs(secs) + if frac { Duration::from_millis(u64::from(ms)) } else { Duration::ZERO };
        let diff = d.abs_diff(want);
        // A 64-bit float holds 10 billion seconds to within a few microseconds.
        prop_assert!(diff <= Duration::from_micros(10), "{} read as {:?}", text, d);
        let _ = parse_proto_duration(&junk);
        let _ = parse_proto_duration(&format!("{junk}s"));
    }

    /// The loggers of `POST /logging`, written as Envoy writes them, read back.
    #[test]
    fn loggers_read_back(loggers in proptest::collection::btree_map("[a-z_]{1,12}", prop_oneof![Just("trace"), Just("debug"), Just("info"), Just("warning"), Just("error")], 1..8)) {
        let mut text = String::from("active loggers:\n");
        for (n, l) in &loggers {
            text.push_str(&format!("  {n}: {l}\n"));
        }
        let got = parse_loggers(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let want: BTreeMap<String, String> = loggers.iter().map(|(n, l)| (n.clone(), (*l).to_owned())).collect();
        prop_assert_eq!(got, want);
    }
}

/// Found by the differential tests: a duration past what `Duration` holds
/// (`1e300s` from a hostile sidecar's `/server_info`) made the agent panic.
#[test]
fn a_duration_past_the_type_is_an_error() {
    for text in ["1e300s", "1e20s", "18446744073709551616s", "inf s", "NaNs"] {
        assert!(parse_proto_duration(text).is_err(), "{text}");
    }
}
