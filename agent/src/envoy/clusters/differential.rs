//! The `/clusters` reader against a reference: the answer parsed whole by serde_json
//! and read by a plain walk over the value, on generated answers (docs/reliability.md,
//! "Parsers").
//!
//! What the reader keeps follows the path `cluster_statuses[].{name, added_via_api,
//! host_statuses[].{address.{socket_address.{address, port_value}, pipe.path},
//! health_status}}`. Values of another type than the one it reads there count as
//! absent; a `port_value` that is a number but not a whole one of 64 bits refuses the
//! answer. What it passes over (every other value) it checks only for balanced
//! brackets of the value's own kind and balanced strings, for speed (85 MB answers):
//! a fault inside such a value is an error or goes unseen, never a different answer.

use meshcat_common::differential::corrupt::{bad_value, is_invalid_json, mutate};
use meshcat_common::differential::json::{
    Json, any_value, number, object_with, render, style, text,
};
use meshcat_common::differential::{check_stream, config, cuts, same};
use meshcat_common::wire::{ReportedCluster, hosts_digest};
use proptest::prelude::*;
use serde_json::Value;

use super::{ClustersReader, Ctx, MAX_TOKEN};

/// Answers of at most this many bytes are also fed cut at every position.
const EVERY_CUT: usize = 256;

/// The reader fed `chunks`, its carried token checked against its bound after each.
fn read(chunks: &[&[u8]]) -> Result<Vec<ReportedCluster>, String> {
    let mut r = ClustersReader::new();
    for c in chunks {
        r.feed(c).map_err(|e| e.to_string())?;
        assert!(
            r.carry.len() <= MAX_TOKEN,
            "carried {} bytes",
            r.carry.len()
        );
    }
    r.finish().map_err(|e| e.to_string())
}

/// The reference: serde_json's value, walked as the reader's contract says.
fn reference(text: &[u8]) -> Result<Vec<ReportedCluster>, String> {
    let doc: Value = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    let root = doc.as_object().ok_or("the answer is not an object")?;
    let mut out = Vec::new();
    for c in root
        .get("cluster_statuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
    {
        let mut hosts: Vec<(String, bool)> = Vec::new();
        for h in c
            .get("host_statuses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object)
        {
            hosts.push((address(h.get("address"))?, healthy(h.get("health_status"))));
        }
        let name = c
            .get("name")
            .and_then(Value::as_str)
            .ok_or("a cluster has no name")?;
        hosts.sort();
        let mut addresses: Vec<String> = Vec::new();
        let mut healthy_count = 0u32;
        for (i, (a, ok)) in hosts.iter().enumerate() {
            if hosts.get(i + 1).is_some_and(|(next, _)| next == a) {
                continue;
            }
            healthy_count += u32::from(*ok);
            addresses.push(a.clone());
        }
        out.push(ReportedCluster {
            name: name.to_owned(),
            added_via_api: c
                .get("added_via_api")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            hosts_digest: hosts_digest(addresses.iter().map(String::as_str)),
            host_count: addresses.len() as u32,
            healthy_count,
            hosts: addresses,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// A host's address as Envoy's text output writes it.
fn address(a: Option<&Value>) -> Result<String, String> {
    let Some(a) = a.and_then(Value::as_object) else {
        return Ok("-".into());
    };
    if let Some(s) = a.get("socket_address").and_then(Value::as_object) {
        let ip = s.get("address").and_then(Value::as_str).unwrap_or("");
        let port = match s.get("port_value") {
            Some(Value::Number(n)) => n.as_u64().ok_or("a port that is not a whole number")?,
            _ => 0,
        };
        return Ok(if ip.contains(':') {
            format!("[{ip}]:{port}")
        } else {
            format!("{ip}:{port}")
        });
    }
    if let Some(p) = a.get("pipe").and_then(Value::as_object) {
        let path = p.get("path").and_then(Value::as_str).unwrap_or("");
        return Ok(format!("unix://{path}"));
    }
    Ok("-".into())
}

/// Healthy: no health flag set to `true`, and no EDS status but `HEALTHY`.
fn healthy(h: Option<&Value>) -> bool {
    let Some(h) = h.and_then(Value::as_object) else {
        return true;
    };
    h.iter().all(|(k, v)| match k.as_str() {
        "eds_health_status" => v.as_str().is_none_or(|s| s == "HEALTHY"),
        _ => v != &Value::Bool(true),
    })
}

/// Mostly the value the reader reads there, sometimes a value of any other type.
fn mostly(v: impl Strategy<Value = Json> + 'static) -> impl Strategy<Value = Json> {
    prop_oneof![12 => v, 1 => any_value(2, 3)]
}

fn ip() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>())
            .prop_map(|(a, b, c, d)| format!("{a}.{b}.{c}.{d}")),
        1 => Just("::1".to_owned()),
        1 => "fd00(:[0-9a-f]{1,4}){1,5}",
        1 => text(),
    ]
}

fn port() -> impl Strategy<Value = Json> {
    prop_oneof![
        8 => (0u32..=65_535).prop_map(Json::int),
        1 => number().prop_map(Json::Number),
    ]
}

fn socket() -> impl Strategy<Value = Json> {
    (
        proptest::option::weighted(0.95, mostly(ip().prop_map(Json::String))),
        proptest::option::weighted(0.95, mostly(port())),
    )
        .prop_flat_map(|(ip, port)| {
            object_with(vec![
                ("address", ip),
                ("port_value", port),
                ("resolver_name", None),
            ])
        })
}

fn host_address() -> impl Strategy<Value = Json> {
    prop_oneof![
        8 => socket().prop_flat_map(|s| object_with(vec![("socket_address", Some(s))])),
        1 => text().prop_flat_map(|p| {
            object_with(vec![("pipe", Some(Json::object([("path", Json::String(p))])))])
        }),
        1 => any_value(2, 3),
    ]
}

fn health() -> impl Strategy<Value = Json> {
    let eds = proptest::sample::select(
        &[
            "HEALTHY",
            "UNHEALTHY",
            "DRAINING",
            "TIMEOUT",
            "DEGRADED",
            "UNKNOWN",
        ][..],
    );
    (
        proptest::option::of(mostly(eds.prop_map(Json::str))),
        proptest::option::of(any::<bool>().prop_map(Json::Bool)),
        proptest::option::of(any::<bool>().prop_map(Json::Bool)),
    )
        .prop_flat_map(|(eds, active, outlier)| {
            object_with(vec![
                ("eds_health_status", eds),
                ("failed_active_health_check", active),
                ("failed_outlier_check", outlier),
            ])
        })
}

/// Counters as Envoy lists them: what the reader passes over most.
fn stats() -> impl Strategy<Value = Json> {
    proptest::collection::vec(
        (
            "[a-z_]{2,16}",
            proptest::option::of(number()),
            any::<bool>(),
        ),
        0..6,
    )
    .prop_map(|entries| {
        Json::Array(
            entries
                .into_iter()
                .map(|(name, value, gauge)| {
                    let mut f = vec![("name".to_owned(), Json::String(name))];
                    if let Some(v) = value {
                        f.push(("value".into(), Json::String(v)));
                    }
                    if gauge {
                        f.push(("type".into(), Json::str("GAUGE")));
                    }
                    Json::Object(f)
                })
                .collect(),
        )
    })
}

fn host() -> impl Strategy<Value = Json> {
    (
        proptest::option::weighted(0.95, host_address()),
        stats(),
        proptest::option::of(mostly(health())),
        any::<u32>(),
    )
        .prop_flat_map(|(address, stats, health, weight)| {
            object_with(vec![
                ("address", address),
                ("stats", Some(stats)),
                ("health_status", health),
                ("weight", Some(Json::int(weight))),
                ("locality", Some(Json::object::<&str>([]))),
            ])
        })
}

fn cluster() -> impl Strategy<Value = Json> {
    (
        proptest::option::weighted(0.97, mostly(text().prop_map(Json::String))),
        proptest::option::of(mostly(any::<bool>().prop_map(Json::Bool))),
        proptest::option::weighted(
            0.9,
            mostly(proptest::collection::vec(mostly(host()), 0..5).prop_map(Json::Array)),
        ),
    )
        .prop_flat_map(|(name, via, hosts)| {
            object_with(vec![
                ("name", name),
                ("added_via_api", via),
                ("host_statuses", hosts),
                ("observability_name", Some(Json::str("obs"))),
            ])
        })
}

fn answer() -> impl Strategy<Value = Json> {
    proptest::option::weighted(
        0.95,
        mostly(proptest::collection::vec(mostly(cluster()), 0..6).prop_map(Json::Array)),
    )
    .prop_flat_map(|clusters| object_with(vec![("cluster_statuses", clusters)]))
}

/// Puts `bad` in place of one value of `v` chosen by `pick` (taken modulo the number
/// of places): with `read`, among the values the reader reads (those directly in an
/// object or array it follows); else among those inside values it passes over.
fn plant(v: &Json, pick: usize, bad: &str, read: bool) -> Option<Json> {
    let mut places = Vec::new();
    collect_places(v, Some(Ctx::Root), &mut Vec::new(), &mut places);
    let places: Vec<&Vec<usize>> = places
        .iter()
        .filter(|(_, r)| *r == read)
        .map(|(p, _)| p)
        .collect();
    let path = places.get(pick % places.len().max(1))?;
    let mut out = v.clone();
    let mut at = &mut out;
    for &i in path.iter() {
        at = match at {
            Json::Array(items) => &mut items[i],
            Json::Object(fields) => &mut fields[i].1,
            _ => unreachable!("a path goes through containers"),
        };
    }
    *at = Json::Raw(bad.to_owned());
    Some(out)
}

/// The context of the child `key` (`None` for an element) of a container of context
/// `ctx`, when that child is a container the reader follows.
fn child_ctx(ctx: Ctx, key: Option<&str>, child: &Json) -> Option<Ctx> {
    let object = matches!(child, Json::Object(_));
    let array = matches!(child, Json::Array(_));
    match (ctx, key) {
        (Ctx::Root, Some("cluster_statuses")) if array => Some(Ctx::Clusters),
        (Ctx::Clusters, None) if object => Some(Ctx::Cluster),
        (Ctx::Cluster, Some("host_statuses")) if array => Some(Ctx::Hosts),
        (Ctx::Hosts, None) if object => Some(Ctx::Host),
        (Ctx::Host, Some("address")) if object => Some(Ctx::Address),
        (Ctx::Address, Some("socket_address")) if object => Some(Ctx::Socket),
        (Ctx::Address, Some("pipe")) if object => Some(Ctx::Pipe),
        (Ctx::Host, Some("health_status")) if object => Some(Ctx::Health),
        _ => None,
    }
}

/// Every value's path below `v` (of context `ctx`, `None` when the reader passes
/// over it), and whether the reader reads it (it is directly in a container the
/// reader follows).
fn collect_places(
    v: &Json,
    ctx: Option<Ctx>,
    path: &mut Vec<usize>,
    out: &mut Vec<(Vec<usize>, bool)>,
) {
    let children: Vec<(Option<&str>, &Json)> = match v {
        Json::Array(items) => items.iter().map(|c| (None, c)).collect(),
        Json::Object(fields) => fields.iter().map(|(k, c)| (Some(k.as_str()), c)).collect(),
        _ => Vec::new(),
    };
    for (i, (key, child)) in children.into_iter().enumerate() {
        path.push(i);
        out.push((path.clone(), ctx.is_some()));
        let inner = ctx.and_then(|c| child_ctx(c, key, child));
        collect_places(child, inner, path, out);
        path.pop();
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// Valid answers in any style and any cut: the reference's clusters.
    #[test]
    fn valid_answers_read_as_the_reference_reads_them(
        doc in answer(),
        style in style(),
        c in cuts(4_096),
    ) {
        let text = render(&doc, &style);
        let want = reference(text.as_bytes());
        check_stream(text.as_bytes(), &c, EVERY_CUT, read, &want)?;
    }

    /// A fault where the reader reads (a value in an object or array it follows) is
    /// an error, however the answer is cut.
    #[test]
    fn a_fault_where_it_reads_is_an_error(
        doc in answer(),
        style in style(),
        bad in bad_value(),
        pick in any::<usize>(),
        c in cuts(4_096),
    ) {
        let Some(faulty) = plant(&doc, pick, &bad, true) else {
            return Ok(());
        };
        let text = render(&faulty, &style);
        prop_assert!(is_invalid_json(text.as_bytes()));
        let want: Result<Vec<ReportedCluster>, String> = Err("invalid".into());
        check_stream(text.as_bytes(), &c, EVERY_CUT, read, &want)?;
    }

    /// An answer cut short, anywhere before its end, is an error.
    #[test]
    fn a_cut_answer_is_an_error(doc in answer(), style in style(), at in any::<usize>()) {
        let text = render(&doc, &style);
        let end = text.trim_end().len();
        let points: Vec<usize> = if end <= EVERY_CUT {
            (0..end).collect()
        } else {
            vec![at % end]
        };
        for p in points {
            prop_assert!(read(&[&text.as_bytes()[..p]]).is_err(), "cut at {p}: {:?}", &text[..p]);
        }
    }

    /// A fault inside a value the reader passes over is an error or unseen: never
    /// another answer than the reference gives without it.
    #[test]
    fn a_fault_where_it_passes_over_changes_no_answer(
        doc in answer(),
        style in style(),
        bad in bad_value(),
        pick in any::<usize>(),
        c in cuts(4_096),
    ) {
        let Some(faulty) = plant(&doc, pick, &bad, false) else {
            return Ok(());
        };
        let text = render(&faulty, &style);
        let want = reference(render(&doc, &style).as_bytes());
        for way in [vec![text.as_bytes()], meshcat_common::differential::chunks(text.as_bytes(), &c)] {
            let got = read(&way);
            if got.is_ok() {
                same(&got, &want)?;
            }
        }
    }

    /// Any change at any byte: never a panic, and the reference's answer whenever
    /// the change leaves valid JSON.
    #[test]
    fn any_change_never_panics(
        changed in (answer(), style()).prop_flat_map(|(doc, style)| mutate(render(&doc, &style).into_bytes())),
    ) {
        let got = read(&[&changed]);
        if !is_invalid_json(&changed) {
            same(&got, &reference(&changed))?;
        }
    }
}

/// Deep nesting in a value passed over costs no stack: the reader counts brackets.
#[test]
fn deep_nesting_is_passed_over() {
    let depth = 100_000;
    let text = format!(
        "{{\"cluster_statuses\":[{{\"name\":\"a\",\"deep\":{}{}}}]}}",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let got = read(&[text.as_bytes()]).unwrap();
    assert_eq!(got.len(), 1);
}
