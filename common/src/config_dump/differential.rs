//! The `/config_dump` reader against a reference: the dump parsed whole by
//! serde_json and walked plainly, on generated dumps (docs/reliability.md,
//! "Parsers"). The reader splits sections and lists unparsed and parses each
//! resource alone; what it does not parse it still checks for JSON's grammar, but
//! (as serde_json when it passes over a value) not that a `\u` escape of a surrogate
//! half has its other half.

use proptest::prelude::*;
use serde_json::Value;

use super::{Item, read, read_declared};
use crate::differential::corrupt::{is_invalid_json, mutate};
use crate::differential::json::{Json, any_value, object_with, render, style, text};
use crate::differential::{config, same};

/// What a reader gives, comparable: each item's kind, name and value.
fn items(text: &[u8], declared: bool) -> Result<Vec<(String, Value)>, String> {
    let mut out = Vec::new();
    let f = |item: Item| {
        out.push(match item {
            Item::Bootstrap(k, v) => (format!("bootstrap {k}"), v),
            Item::Listener(v) => ("listener".into(), v),
            Item::Cluster(v) => ("cluster".into(), v),
            Item::RouteConfig(v) => ("route".into(), v),
            Item::ScopedRoutes(v) => ("scoped".into(), v),
            Item::Secret(v) => ("secret".into(), v),
            Item::Section(t, v) => (format!("section {t}"), v),
        })
    };
    let r = if declared {
        read_declared(text, f)
    } else {
        read(text, f)
    };
    r.map(|()| out).map_err(|e| e.to_string())
}

/// The reference: the whole dump as one value, walked as the reader's contract says.
fn reference(text: &[u8], declared: bool) -> Result<Vec<(String, Value)>, String> {
    let doc: Value = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    let doc = doc.as_object().ok_or("the dump is not an object")?;
    let mut out = Vec::new();
    let configs = match doc.get("configs") {
        None => return Ok(out),
        Some(c) => c.as_array().ok_or("configs is not a list")?,
    };
    for section in configs {
        let section = section.as_object().ok_or("a section is not an object")?;
        let ty = match section.get("@type") {
            None => "",
            Some(t) => t.as_str().ok_or("@type is not a string")?,
        };
        let list = |key: &str| -> Result<Vec<Value>, String> {
            match section.get(key) {
                None => Ok(Vec::new()),
                Some(l) => l
                    .as_array()
                    .cloned()
                    .ok_or_else(|| format!("{key} is not a list")),
            }
        };
        let each = |key: &str,
                    path: &[&str],
                    out: &mut Vec<(String, Value)>,
                    kind: &str|
         -> Result<(), String> {
            'items: for item in list(key)? {
                let mut at = &item;
                for step in path {
                    let fields = at.as_object().ok_or("an item is not an object")?;
                    match fields.get(*step) {
                        Some(v) => at = v,
                        None => continue 'items,
                    }
                }
                out.push((kind.to_owned(), at.clone()));
            }
            Ok(())
        };
        match ty.rsplit('.').next().unwrap_or("") {
            "BootstrapConfigDump" => {
                if let Some(b) = section.get("bootstrap") {
                    let b = b.as_object().ok_or("bootstrap is not an object")?;
                    let mut fields: Vec<(&String, &Value)> = b.iter().collect();
                    fields.sort_by(|a, b| a.0.cmp(b.0));
                    for (k, v) in fields {
                        if k != "static_resources" {
                            out.push((format!("bootstrap {k}"), v.clone()));
                        }
                    }
                }
            }
            "ListenersConfigDump" => {
                each("static_listeners", &["listener"], &mut out, "listener")?;
                each(
                    "dynamic_listeners",
                    &["active_state", "listener"],
                    &mut out,
                    "listener",
                )?;
            }
            "ClustersConfigDump" => {
                each("static_clusters", &["cluster"], &mut out, "cluster")?;
                each("dynamic_active_clusters", &["cluster"], &mut out, "cluster")?;
                if declared {
                    each(
                        "dynamic_warming_clusters",
                        &["cluster"],
                        &mut out,
                        "cluster",
                    )?;
                }
            }
            "RoutesConfigDump" => {
                each("static_route_configs", &["route_config"], &mut out, "route")?;
                each(
                    "dynamic_route_configs",
                    &["route_config"],
                    &mut out,
                    "route",
                )?;
            }
            "ScopedRoutesConfigDump" => {
                for key in [
                    "inline_scoped_route_configs",
                    "dynamic_scoped_route_configs",
                ] {
                    for item in list(key)? {
                        let item = item.as_object().ok_or("an item is not an object")?;
                        let field = |k: &str| item.get(k).cloned().unwrap_or(Value::Null);
                        out.push((
                            "scoped".into(),
                            serde_json::json!({
                                "name": field("name"),
                                "scoped_route_configs": field("scoped_route_configs"),
                            }),
                        ));
                    }
                }
            }
            "SecretsConfigDump" => {
                each("static_secrets", &["secret"], &mut out, "secret")?;
                each("dynamic_active_secrets", &["secret"], &mut out, "secret")?;
            }
            _ => out.push((format!("section {ty}"), Value::Object(section.clone()))),
        }
    }
    Ok(out)
}

/// A resource: mostly an object with a name, sometimes any value.
fn resource() -> impl Strategy<Value = Json> {
    prop_oneof![
        4 => (text(), any_value(1, 3)).prop_flat_map(|(name, body)| {
            object_with(vec![("name", Some(Json::String(name))), ("body", Some(body))])
        }),
        1 => any_value(1, 3),
    ]
}

/// An element of a section's list: the resource under `key`, or under `outer` then
/// `key`, beside other fields; sometimes without it, or not an object.
fn element(outer: Option<&'static str>, key: &'static str) -> impl Strategy<Value = Json> {
    let wrapped = (resource(), any::<bool>()).prop_flat_map(move |(r, has)| {
        let inner = object_with(vec![
            (key, has.then_some(r)),
            ("version_info", Some(Json::str("1"))),
        ]);
        inner.prop_flat_map(move |inner| match outer {
            Some(o) => object_with(vec![(o, Some(inner)), ("name", Some(Json::str("n")))]).boxed(),
            None => Just(inner).boxed(),
        })
    });
    prop_oneof![12 => wrapped, 1 => any_value(1, 3)]
}

fn list(outer: Option<&'static str>, key: &'static str) -> impl Strategy<Value = Option<Json>> {
    proptest::option::weighted(
        0.4,
        prop_oneof![
            12 => proptest::collection::vec(element(outer, key), 0..3).prop_map(Json::Array),
            1 => any_value(1, 2),
        ],
    )
}

fn type_url() -> impl Strategy<Value = Option<Json>> {
    let known = proptest::sample::select(
        &[
            "BootstrapConfigDump",
            "ListenersConfigDump",
            "ClustersConfigDump",
            "RoutesConfigDump",
            "ScopedRoutesConfigDump",
            "SecretsConfigDump",
            "EcdsConfigDump",
        ][..],
    );
    proptest::option::weighted(
        0.95,
        prop_oneof![
            12 => known.prop_map(|t| Json::String(format!("type.googleapis.com/envoy.admin.v3.{t}"))),
            1 => text().prop_map(Json::String),
            1 => any_value(1, 2),
        ],
    )
}

fn section() -> impl Strategy<Value = Json> {
    (
        type_url(),
        proptest::option::of(prop_oneof![
            6 => any_value(2, 3).prop_map(|v| match v {
                Json::Object(f) => Json::Object(f),
                other => Json::object([("node", other)]),
            }),
            1 => any_value(1, 2),
        ]),
        (
            list(None, "listener"),
            list(Some("active_state"), "listener"),
        ),
        (
            list(None, "cluster"),
            list(None, "cluster"),
            list(None, "cluster"),
        ),
        (list(None, "route_config"), list(None, "route_config")),
        (list(None, "secret"), list(None, "secret")),
        list(None, "scoped_route_configs"),
    )
        .prop_flat_map(
            |(ty, boot, (sl, dl), (sc, dac, dwc), (sr, dr), (ss, ds), scoped)| {
                object_with(vec![
                    ("@type", ty),
                    ("bootstrap", boot),
                    ("static_listeners", sl),
                    ("dynamic_listeners", dl),
                    ("static_clusters", sc),
                    ("dynamic_active_clusters", dac),
                    ("dynamic_warming_clusters", dwc),
                    ("static_route_configs", sr),
                    ("dynamic_route_configs", dr),
                    ("static_secrets", ss),
                    ("dynamic_active_secrets", ds),
                    ("inline_scoped_route_configs", scoped),
                ])
            },
        )
}

fn dump() -> impl Strategy<Value = Json> {
    prop_oneof![
        12 => proptest::option::weighted(0.95, proptest::collection::vec(section(), 0..3).prop_map(Json::Array))
            .prop_flat_map(|configs| object_with(vec![("configs", configs)])),
        1 => any_value(2, 3),
    ]
}

proptest! {
    #![proptest_config(config(256))]

    /// Valid dumps in any style: the reference's items, in its order.
    #[test]
    fn valid_dumps_read_as_the_reference_reads_them(doc in dump(), style in style(), declared in any::<bool>()) {
        let text = render(&doc, &style);
        same(&items(text.as_bytes(), declared), &reference(text.as_bytes(), declared))?;
    }

    /// Any change at any byte: never a panic; the reference's items when the change
    /// leaves valid JSON; an error when it breaks JSON's grammar.
    #[test]
    fn any_change_never_panics(
        changed in (dump(), style()).prop_flat_map(|(doc, style)| mutate(render(&doc, &style).into_bytes())),
        declared in any::<bool>(),
    ) {
        let got = items(&changed, declared);
        if !is_invalid_json(&changed) {
            same(&got, &reference(&changed, declared))?;
        } else if got.is_ok() {
            // Taken only when the grammar holds and a surrogate half stands alone
            // where nothing is parsed.
            let grammar = serde_json::from_slice::<serde::de::IgnoredAny>(&changed).is_ok()
                && std::str::from_utf8(&changed).is_ok();
            prop_assert!(grammar, "invalid JSON read: {:?}", String::from_utf8_lossy(&changed));
        }
    }
}
