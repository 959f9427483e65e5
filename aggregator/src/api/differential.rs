//! The API's query readers against a reference: each query decoded by
//! serde_urlencoded (the `application/x-www-form-urlencoded` reading of
//! form_urlencoded) into pairs, and those read plainly as the API reference says
//! (`docs/api.md`), on generated queries: percent escapes valid and not, `+`,
//! characters of every width, empty and repeated parameters, unknown ones, and
//! values past the bounds (docs/reliability.md, "Parsers").

use std::time::Duration;

use meshcat_common::differential::config;
use meshcat_common::model::Status;
use meshcat_common::validate::{MAX_TEXT_LEN, is_valid_name};
use proptest::prelude::*;

use super::blocking::{MAX_WAIT, parse_wait};
use super::events::{EventsQuery, parse_event_id};
use super::query::{CLUSTER_FILTERS, ClusterFilter, MAX_PARAMS};

/// The reference's pairs: what serde_urlencoded decodes.
fn pairs(raw: &str) -> Vec<(String, String)> {
    serde_urlencoded::from_str(raw).expect("form decoding takes any text")
}

/// `GET /clusters` filters, read plainly: every parameter one of the filters, at most
/// 256 of them, each value at most 4,096 bytes; `status` one of the statuses (by
/// serde's own reading of the enum), the booleans `true` or `false`.
fn cluster_filter(raw: &str) -> Result<ClusterFilter, ()> {
    let pairs = pairs(raw);
    if pairs.len() > MAX_PARAMS {
        return Err(());
    }
    let mut f = ClusterFilter::default();
    for (k, v) in pairs {
        if !CLUSTER_FILTERS.contains(&k.as_str()) || v.len() > MAX_TEXT_LEN {
            return Err(());
        }
        let boolean = |v: &str| v.parse::<bool>().map_err(drop);
        match k.as_str() {
            "status" => f.status.push(
                serde_json::from_value::<Status>(serde_json::Value::String(v)).map_err(drop)?,
            ),
            "clusterName" => f.cluster_name.push(v),
            "zoneName" => f.zone_name.push(v),
            "name" => f.name.push(v),
            "version" => f.version.push(v),
            "owner" => f.owner.push(v),
            "capability" => f.capability.push(v),
            "prometheusJob" => f.prometheus_job.push(v),
            "authorized" => f.authorized.push(boolean(&v)?),
            "enableInstanceMetrics" => f.enable_instance_metrics.push(boolean(&v)?),
            "enableHistoricalMetrics" => f.enable_historical_metrics.push(boolean(&v)?),
            "businessImpact" => f.business_impact.push(v),
            _ => f.protocols.push(v),
        }
    }
    Ok(f)
}

/// An event id: ASCII digits only, read as a `u64` by the standard library.
fn event_id(v: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(v).ok()?;
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// What `GET /events` asks for: zone, cluster, and the id it resumes after.
type Events = (Option<String>, Option<String>, Option<u64>);

/// `GET /events`: zoneName and clusterName each once and a valid name, `since` once
/// and an event id.
fn events_query(raw: &str) -> Result<Events, ()> {
    let pairs = pairs(raw);
    if pairs.len() > MAX_PARAMS {
        return Err(());
    }
    let (mut zone, mut cluster, mut since) = (None, None, None);
    for (k, v) in pairs {
        if v.len() > MAX_TEXT_LEN {
            return Err(());
        }
        match k.as_str() {
            "zoneName" | "clusterName" => {
                let slot = if k == "zoneName" {
                    &mut zone
                } else {
                    &mut cluster
                };
                if slot.is_some() || !is_valid_name(&v) {
                    return Err(());
                }
                *slot = Some(v);
            }
            "since" if since.is_none() => since = Some(event_id(v.as_bytes()).ok_or(())?),
            _ => return Err(()),
        }
    }
    Ok((zone, cluster, since))
}

/// A wait: at most 12 digits then `ms`, `s`, `m`, `h` or nothing (seconds), read by
/// humantime; longer than ten minutes is ten minutes.
fn wait(v: &str) -> Option<Duration> {
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (n, unit) = v.split_at(split);
    if n.is_empty() || n.len() > 12 || !matches!(unit, "" | "ms" | "s" | "m" | "h") {
        return None;
    }
    let text = if unit.is_empty() {
        format!("{n}s")
    } else {
        v.to_owned()
    };
    humantime::parse_duration(&text)
        .ok()
        .map(|d| d.min(MAX_WAIT))
}

/// A value: text of every kind, escaped as a client may escape it, or not.
fn value() -> impl Strategy<Value = String> {
    let raw = prop_oneof![
        4 => "[a-z0-9._-]{0,12}",
        1 => Just(String::new()),
        1 => prop_oneof![Just("stable"), Just("warning"), Just("down"), Just("Stable"), Just("true"), Just("false"), Just("1"), Just("yes")].prop_map(str::to_owned),
        1 => "[ -~é€😀]{0,10}",
        1 => (0usize..3).prop_map(|n| "x".repeat(MAX_TEXT_LEN - 1 + n)),
    ];
    (raw, 0u8..4).prop_map(|(v, how)| match how {
        // Escaped wholly, as form serializers write it.
        0 => form_urlencoded::byte_serialize(v.as_bytes()).collect(),
        // Percent escapes of every byte, upper or lower hex.
        1 => v.bytes().map(|b| format!("%{b:02x}")).collect(),
        // Raw, reserved characters and all.
        2 => v,
        // Broken escapes.
        _ => format!("{v}%{}", if v.len() % 2 == 0 { "zz" } else { "4" }),
    })
}

fn key(known: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        8 => proptest::sample::select(known).prop_map(str::to_owned),
        1 => "[a-zA-Z]{0,8}",
        1 => proptest::sample::select(known).prop_map(|k| k.replace('N', "%4E")),
    ]
}

/// A query of `known` parameters (and others), joined by `&` with empty parts and
/// parameters without `=` among them.
fn query(known: &'static [&'static str]) -> impl Strategy<Value = String> {
    let part = prop_oneof![
        12 => (key(known), value()).prop_map(|(k, v)| format!("{k}={v}")),
        1 => key(known),
        1 => Just(String::new()),
    ];
    prop_oneof![
        12 => proptest::collection::vec(part, 0..8).prop_map(|p| p.join("&")),
        1 => Just(vec!["owner=a"; MAX_PARAMS + 1].join("&")),
        1 => Just(vec!["owner=a"; MAX_PARAMS].join("&")),
    ]
}

proptest! {
    #![proptest_config(config(2_048))]

    #[test]
    fn cluster_filters_read_as_the_reference_reads_them(raw in query(CLUSTER_FILTERS)) {
        let got = ClusterFilter::parse(Some(&raw)).map_err(drop);
        prop_assert_eq!(got, cluster_filter(&raw), "{}", raw);
    }

    #[test]
    fn event_queries_read_as_the_reference_reads_them(
        raw in query(&["zoneName", "clusterName", "since"]),
    ) {
        let got = EventsQuery::parse(Some(&raw))
            .map(|q| (q.zone_name, q.cluster_name, q.since))
            .map_err(drop);
        prop_assert_eq!(got, events_query(&raw), "{}", raw);
    }

    #[test]
    fn event_ids_read_as_the_standard_library_reads_them(
        v in prop_oneof![
            "[0-9]{0,25}".prop_map(String::into_bytes),
            "[0-9+ -]{0,6}".prop_map(String::into_bytes),
            proptest::collection::vec(any::<u8>(), 0..24),
            any::<u64>().prop_map(|n| format!("000{n}").into_bytes()),
        ],
    ) {
        prop_assert_eq!(parse_event_id(&v), event_id(&v), "{:?}", String::from_utf8_lossy(&v));
    }

    #[test]
    fn waits_read_as_humantime_reads_them(
        v in prop_oneof![
            ("[0-9]{0,14}", prop_oneof![Just(""), Just("ms"), Just("s"), Just("m"), Just("h"), Just("d"), Just("sec"), Just(" s"), Just("S")])
                .prop_map(|(n, u)| format!("{n}{u}")),
            ".{0,8}",
        ],
    ) {
        prop_assert_eq!(parse_wait(&v), wait(&v), "{:?}", v);
    }
}
