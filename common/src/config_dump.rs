//! Envoy's `/config_dump`, read one resource at a time: the one reader of it, for the
//! agent (the graph's topology and the drift hash) and the aggregator (a zone's
//! clusters from its edge sidecar). A dump holds every listener, cluster, route
//! configuration and secret of the sidecar: megabytes on a big mesh, with each static
//! resource twice (in its section and in the bootstrap). Parsed whole into a
//! `serde_json::Value` it costs many times its size in memory. Here the sections and
//! their lists are only split (borrowed from the text, unparsed), and each resource is
//! parsed alone, handed to the caller and dropped.
//!
//! [`read`] gives what is in effect: a dynamic listener's `active_state` (not its
//! warming or draining state), active clusters and secrets (not warming ones).
//! [`read_declared`] also gives the warming clusters: those the sidecar was sent and
//! is still initialising, which a list of the services it knows counts.

use std::collections::BTreeMap;

use serde_json::Value;
use serde_json::value::RawValue;

/// One resource of the dump, parsed.
#[derive(Debug)]
pub enum Item {
    /// One top-level field of the bootstrap, by name; `static_resources` is not
    /// given (its listeners, clusters and secrets come from their own sections).
    Bootstrap(String, Value),
    Listener(Value),
    Cluster(Value),
    RouteConfig(Value),
    /// A scoped route configuration set: `{"name", "scoped_route_configs"}`.
    ScopedRoutes(Value),
    Secret(Value),
    /// A whole section of another type, with its `@type`.
    Section(String, Value),
}

/// Why a dump cannot be read.
pub type Error = serde_json::Error;

/// A JSON object's fields, their values unparsed.
type Fields<'a> = BTreeMap<String, &'a RawValue>;

/// Reads `text` (the body of `/config_dump`) and calls `f` with each resource in
/// effect: sections in the dump's order; within a section, its lists in a fixed order
/// (static before dynamic) and each list's resources in the dump's order; the
/// bootstrap's fields sorted by name.
pub fn read(text: &[u8], f: impl FnMut(Item)) -> Result<(), Error> {
    read_dump(text, false, f)
}

/// As [`read`], with the dynamic warming clusters given as [`Item::Cluster`] too,
/// after the active ones.
pub fn read_declared(text: &[u8], f: impl FnMut(Item)) -> Result<(), Error> {
    read_dump(text, true, f)
}

fn read_dump(text: &[u8], warming: bool, mut f: impl FnMut(Item)) -> Result<(), Error> {
    // An object's fields, not a struct: serde's derive also takes a struct from a
    // list of its fields' values, which would read a list as a dump.
    let dump: Fields<'_> = serde_json::from_slice(text)?;
    let configs: Vec<&RawValue> = match dump.get("configs") {
        Some(c) => serde_json::from_str(c.get())?,
        None => Vec::new(),
    };
    for raw in configs {
        let section: Fields<'_> = serde_json::from_str(raw.get())?;
        let ty: String = match section.get("@type") {
            Some(t) => serde_json::from_str(t.get())?,
            None => String::new(),
        };
        let short = ty.rsplit('.').next().unwrap_or("");
        match short {
            "BootstrapConfigDump" => {
                if let Some(b) = section.get("bootstrap") {
                    let fields: Fields<'_> = serde_json::from_str(b.get())?;
                    for (name, v) in fields {
                        if name != "static_resources" {
                            f(Item::Bootstrap(name, parse(v)?));
                        }
                    }
                }
            }
            "ListenersConfigDump" => {
                each(&section, "static_listeners", &["listener"], &mut |v| {
                    f(Item::Listener(v))
                })?;
                each(
                    &section,
                    "dynamic_listeners",
                    &["active_state", "listener"],
                    &mut |v| f(Item::Listener(v)),
                )?;
            }
            "ClustersConfigDump" => {
                let lists: &[&str] = if warming {
                    &[
                        "static_clusters",
                        "dynamic_active_clusters",
                        "dynamic_warming_clusters",
                    ]
                } else {
                    &["static_clusters", "dynamic_active_clusters"]
                };
                for key in lists {
                    each(&section, key, &["cluster"], &mut |v| f(Item::Cluster(v)))?;
                }
            }
            "RoutesConfigDump" => {
                for key in ["static_route_configs", "dynamic_route_configs"] {
                    each(&section, key, &["route_config"], &mut |v| {
                        f(Item::RouteConfig(v))
                    })?;
                }
            }
            "ScopedRoutesConfigDump" => {
                for key in [
                    "inline_scoped_route_configs",
                    "dynamic_scoped_route_configs",
                ] {
                    for item in list(&section, key)? {
                        let fields: Fields<'_> = serde_json::from_str(item.get())?;
                        let field = |k: &str| fields.get(k).map(|v| parse(v)).transpose();
                        f(Item::ScopedRoutes(serde_json::json!({
                            "name": field("name")?,
                            "scoped_route_configs": field("scoped_route_configs")?,
                        })));
                    }
                }
            }
            "SecretsConfigDump" => {
                for key in ["static_secrets", "dynamic_active_secrets"] {
                    each(&section, key, &["secret"], &mut |v| f(Item::Secret(v)))?;
                }
            }
            _ => f(Item::Section(ty.clone(), parse(raw)?)),
        }
    }
    Ok(())
}

fn parse(raw: &RawValue) -> Result<Value, Error> {
    serde_json::from_str(raw.get())
}

/// The elements of the section's list `key` (none when absent).
fn list<'a>(section: &Fields<'a>, key: &str) -> Result<Vec<&'a RawValue>, Error> {
    match section.get(key) {
        Some(l) => serde_json::from_str(l.get()),
        None => Ok(Vec::new()),
    }
}

/// Calls `f` with the resource at `path` inside each element of the section's list
/// `key`; elements without it are skipped.
fn each(
    section: &Fields<'_>,
    key: &str,
    path: &[&str],
    f: &mut dyn FnMut(Value),
) -> Result<(), Error> {
    'items: for item in list(section, key)? {
        let mut at = item;
        for step in path {
            let fields: Fields<'_> = serde_json::from_str(at.get())?;
            match fields.get(*step) {
                Some(v) => at = v,
                None => continue 'items,
            }
        }
        f(parse(at)?);
    }
    Ok(())
}

#[cfg(test)]
mod differential;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_read_from_its_section_and_the_rest_is_left_out() {
        let dump = serde_json::json!({"configs": [
            {"@type": "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump",
             "bootstrap": {"node": {"id": "n"}, "static_resources": {"listeners": [1]},
                           "stats_flush_interval": "5s"},
             "last_updated": "t"},
            {"@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
             "static_listeners": [{"listener": {"name": "s"}, "last_updated": "t"}],
             "dynamic_listeners": [
                {"name": "d", "active_state": {"listener": {"name": "d"}, "version_info": "1"}},
                {"name": "w", "warming_state": {"listener": {"name": "w"}}}]},
            {"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
             "static_clusters": [{"cluster": {"name": "c1"}}],
             "dynamic_active_clusters": [{"cluster": {"name": "c2"}}],
             "dynamic_warming_clusters": [{"cluster": {"name": "c3"}}]},
            {"@type": "type.googleapis.com/envoy.admin.v3.RoutesConfigDump",
             "static_route_configs": [{"route_config": {"name": "r"}}]},
            {"@type": "type.googleapis.com/envoy.admin.v3.ScopedRoutesConfigDump",
             "inline_scoped_route_configs": [{"name": "sc", "scoped_route_configs": [], "last_updated": "t"}]},
            {"@type": "type.googleapis.com/envoy.admin.v3.SecretsConfigDump",
             "static_secrets": [{"name": "x", "secret": {"name": "x"}}],
             "dynamic_warming_secrets": [{"name": "y", "secret": {"name": "y"}}]},
            {"@type": "type.googleapis.com/envoy.admin.v3.EcdsConfigDump", "ecds_filters": []}
        ]});
        let mut seen = Vec::new();
        read(dump.to_string().as_bytes(), |item| {
            seen.push(match item {
                Item::Bootstrap(k, _) => format!("bootstrap {k}"),
                Item::Listener(v) => format!("listener {}", v["name"]),
                Item::Cluster(v) => format!("cluster {}", v["name"]),
                Item::RouteConfig(v) => format!("route {}", v["name"]),
                Item::ScopedRoutes(v) => format!("scoped {}", v["name"]),
                Item::Secret(v) => format!("secret {}", v["name"]),
                Item::Section(t, _) => format!("section {t}"),
            });
        })
        .unwrap();
        assert_eq!(
            seen,
            [
                "bootstrap node",
                "bootstrap stats_flush_interval",
                "listener \"s\"",
                "listener \"d\"",
                "cluster \"c1\"",
                "cluster \"c2\"",
                "route \"r\"",
                "scoped \"sc\"",
                "secret \"x\"",
                "section type.googleapis.com/envoy.admin.v3.EcdsConfigDump",
            ]
        );
    }

    #[test]
    fn declared_clusters_count_the_warming_ones() {
        let dump = serde_json::json!({"configs": [
            {"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
             "static_clusters": [{"cluster": {"name": "c1"}}],
             "dynamic_active_clusters": [{"cluster": {"name": "c2"}}],
             "dynamic_warming_clusters": [{"cluster": {"name": "c3"}}]}]});
        let mut names = Vec::new();
        read_declared(dump.to_string().as_bytes(), |item| {
            if let Item::Cluster(c) = item {
                names.push(c["name"].as_str().unwrap_or_default().to_owned());
            }
        })
        .unwrap();
        assert_eq!(names, ["c1", "c2", "c3"]);
    }

    #[test]
    fn a_dump_that_is_not_json_is_an_error() {
        assert!(read(b"{\"configs\": [", |_| {}).is_err());
        assert!(read(b"\"text\"", |_| {}).is_err());
        // Found by the differential tests: a list was read as the dump whose
        // fields' values it lists.
        assert!(read(b"[]", |_| {}).is_err());
        assert!(read(b"[[{\"@type\": \"x\"}]]", |_| {}).is_err());
    }
}
