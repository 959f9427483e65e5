//! The drift hash: a short hash of a sidecar's effective configuration (its
//! `/config_dump`) without what is naturally different from one instance to the next,
//! so that the sidecars of one cluster that run the same configuration report the same
//! hash, plus one hash per resource kind (listeners, clusters, routes, secrets) that
//! says where two configurations differ.
//!
//! What is left out, section by section of the dump (docs/agent.md, "The drift hash",
//! says why):
//! - every section: the wrappers Envoy puts around each resource (`version_info`,
//!   `last_updated`, `client_status`, `error_state`): only the resource is hashed.
//!   Warming and draining listeners, warming clusters and warming secrets are left out
//!   (not yet or no longer in effect), and so is `EndpointsConfigDump` (endpoints are
//!   per instance, and only there with `?include_eds`).
//! - `BootstrapConfigDump`: `bootstrap.node` (id, cluster, metadata, locality, build),
//!   `bootstrap.admin`, and `bootstrap.static_resources` (its listeners, clusters and
//!   secrets are hashed from their own sections).
//! - listeners: `address`, `additional_addresses`; the inline `route_config` of HTTP
//!   connection managers (hashed under `routes`, from `RoutesConfigDump`, where Envoy
//!   lists it as a static route configuration) and their inline
//!   `scoped_routes.scoped_route_configurations_list` (under `routes` likewise).
//! - clusters: in `load_assignment.endpoints[].lb_endpoints[].endpoint` (and in
//!   `load_assignment.named_endpoints`): `address`, `additional_addresses`, `hostname`
//!   and `health_check_config.{address, port_value, hostname}`; the order of
//!   `endpoints` and of `lb_endpoints` (compared as sets).
//! - anywhere: the `path` of file access logs (`@type` `...FileAccessLog`), and the
//!   contents (`inline_bytes`, `inline_string`, `environment_variable`) of the data
//!   sources inside certificates and keys (`tls_certificate(s)`, `session_ticket_keys`,
//!   `generic_secret`): only that a value is set, and file names, are hashed. Trust
//!   (`validation_context`) is hashed whole: it is shared and public.
//!
//! Each resource is hashed alone, as it is read ([`meshcat_common::config_dump`]): the SHA-256
//! of its canonical JSON (keys sorted, no spaces). A kind's hash is the SHA-256 of its
//! resources' digests sorted by (name, digest), since Envoy's order of them carries no
//! meaning; the whole hash is the SHA-256 of the kinds' hashes, the bootstrap's fields'
//! digests and the other sections' digests (by `@type`, then digest: every section of
//! a type that Envoy writes more than once counts, in any order). Each is sent as its
//! first 8 bytes in 16 lowercase hex digits.

use std::collections::BTreeMap;

use ring::digest::{Context, SHA256};
use serde_json::Value;

use meshcat_common::config_dump::Item;

/// Depth beyond which a dump is not walked: real dumps are far shallower.
const MAX_DEPTH: usize = 64;
/// What replaces secret material: that a value was set is configuration, the value
/// itself is per instance (each sidecar's own certificate) or must not leave the host.
const MATERIAL: &str = "[material]";

/// The resource kinds hashed on their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ResourceKind {
    Listeners,
    Clusters,
    Routes,
    Secrets,
}

impl ResourceKind {
    pub const ALL: [ResourceKind; 4] = [
        ResourceKind::Listeners,
        ResourceKind::Clusters,
        ResourceKind::Routes,
        ResourceKind::Secrets,
    ];

    /// The kind's name on the wire and in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceKind::Listeners => "listeners",
            ResourceKind::Clusters => "clusters",
            ResourceKind::Routes => "routes",
            ResourceKind::Secrets => "secrets",
        }
    }
}

/// The drift hashes of one `/config_dump`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigHashes {
    /// The whole effective configuration (every kind, the bootstrap's remaining
    /// settings and any other section of the dump).
    pub config: String,
    /// One hash per kind, by [`ResourceKind::as_str`]; every kind is present (an empty
    /// kind hashes the empty list).
    pub kinds: BTreeMap<String, String>,
}

/// A full SHA-256 digest.
type Digest = [u8; 32];

/// Hashes the resources of one `/config_dump` as they are read, keeping only their
/// digests.
#[derive(Debug, Default)]
pub struct DriftHasher {
    /// Each kind's resources as (name, digest).
    kinds: BTreeMap<ResourceKind, Vec<(String, Digest)>>,
    /// The bootstrap's fields by name, without the node and admin.
    bootstrap: BTreeMap<String, Digest>,
    /// Sections of other types as (`@type`, digest), without their stamps. Envoy may
    /// write several sections of one type (an `EcdsConfigDump` per kind of discovered
    /// filter: HTTP, listener, network...), so every section's digest is kept.
    other: Vec<(String, Digest)>,
    /// The canonical text of the resource being hashed (kept to reuse its memory).
    text: String,
}

impl DriftHasher {
    /// Takes one resource of the dump.
    pub fn take(&mut self, item: Item) {
        let (kind, mut r) = match item {
            Item::Bootstrap(name, mut v) => {
                // Node identity and the admin listener are the instance's own.
                if name != "node" && name != "admin" {
                    scrub(&mut v, 0);
                    let d = self.digest(&v);
                    self.bootstrap.insert(name, d);
                }
                return;
            }
            Item::Section(ty, mut v) => {
                // Endpoints (only there with `?include_eds`) are upstream membership.
                if !ty.ends_with(".EndpointsConfigDump") {
                    strip_stamps(&mut v, 0);
                    scrub(&mut v, 0);
                    let d = self.digest(&v);
                    self.other.push((ty, d));
                }
                return;
            }
            Item::Listener(v) => (ResourceKind::Listeners, v),
            Item::Cluster(v) => (ResourceKind::Clusters, v),
            Item::RouteConfig(v) | Item::ScopedRoutes(v) => (ResourceKind::Routes, v),
            Item::Secret(v) => (ResourceKind::Secrets, v),
        };
        scrub(&mut r, 0);
        match kind {
            ResourceKind::Listeners => strip_listener(&mut r),
            ResourceKind::Clusters => strip_cluster(&mut r),
            ResourceKind::Routes | ResourceKind::Secrets => {}
        }
        let name = r
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let d = self.digest(&r);
        self.kinds.entry(kind).or_default().push((name, d));
    }

    fn digest(&mut self, v: &Value) -> Digest {
        self.text.clear();
        write_canonical(v, &mut self.text);
        let mut out = [0u8; 32];
        out.copy_from_slice(ring::digest::digest(&SHA256, self.text.as_bytes()).as_ref());
        out
    }

    /// The hashes of every resource taken; every kind is present (an empty kind
    /// hashes no digests).
    pub fn finish(mut self) -> ConfigHashes {
        let mut whole = Context::new(&SHA256);
        let mut kinds = BTreeMap::new();
        for kind in ResourceKind::ALL {
            let mut resources = self.kinds.remove(&kind).unwrap_or_default();
            resources.sort_unstable();
            let mut h = Context::new(&SHA256);
            for (_, d) in &resources {
                h.update(d);
            }
            let h = h.finish();
            whole.update(kind.as_str().as_bytes());
            whole.update(h.as_ref());
            kinds.insert(kind.as_str().to_owned(), hex8(h.as_ref()));
        }
        whole.update(b"bootstrap");
        for (name, d) in &self.bootstrap {
            whole.update(name.as_bytes());
            whole.update(d);
        }
        // By type, and the sections of one type in digest order: Envoy's order of
        // them (the order its filter kinds registered) carries no meaning.
        whole.update(b"other");
        self.other.sort_unstable();
        for (ty, d) in &self.other {
            whole.update(ty.as_bytes());
            whole.update(d);
        }
        ConfigHashes {
            config: hex8(whole.finish().as_ref()),
            kinds,
        }
    }
}

/// The first 8 bytes of a digest as 16 lowercase hex digits.
fn hex8(digest: &[u8]) -> String {
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// A listener without its socket addresses and its HTTP connection managers' inline
/// route configurations.
fn strip_listener(l: &mut Value) {
    if let Value::Object(m) = l {
        m.remove("address");
        m.remove("additional_addresses");
    }
    strip_inline_routes(l, 0);
}

fn strip_inline_routes(v: &mut Value, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    match v {
        Value::Object(m) => {
            let hcm = m
                .get("@type")
                .and_then(Value::as_str)
                .is_some_and(|t| t.ends_with(".HttpConnectionManager"));
            if hcm {
                m.remove("route_config");
                if let Some(Value::Object(s)) = m.get_mut("scoped_routes") {
                    s.remove("scoped_route_configurations_list");
                }
            }
            for child in m.values_mut() {
                strip_inline_routes(child, depth + 1);
            }
        }
        Value::Array(a) => {
            for child in a {
                strip_inline_routes(child, depth + 1);
            }
        }
        _ => {}
    }
}

/// A cluster without its endpoints' addresses, endpoints compared as sets.
fn strip_cluster(c: &mut Value) {
    let Some(la) = c.get_mut("load_assignment") else {
        return;
    };
    if let Some(Value::Array(groups)) = la.get_mut("endpoints") {
        for g in groups.iter_mut() {
            if let Some(Value::Array(lbs)) = g.get_mut("lb_endpoints") {
                for lb in lbs.iter_mut() {
                    if let Some(e) = lb.get_mut("endpoint") {
                        strip_endpoint(e);
                    }
                }
                lbs.sort_by_cached_key(canonical);
            }
        }
        groups.sort_by_cached_key(canonical);
    }
    if let Some(Value::Object(named)) = la.get_mut("named_endpoints") {
        for e in named.values_mut() {
            strip_endpoint(e);
        }
    }
}

fn strip_endpoint(e: &mut Value) {
    let Value::Object(m) = e else { return };
    for k in ["address", "additional_addresses", "hostname"] {
        m.remove(k);
    }
    if let Some(Value::Object(hc)) = m.get_mut("health_check_config") {
        for k in ["address", "port_value", "hostname"] {
            hc.remove(k);
        }
    }
}

/// Removes the version and time stamps of a section Envoy's dump wraps in its own way.
fn strip_stamps(v: &mut Value, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    match v {
        Value::Object(m) => {
            for k in [
                "version_info",
                "last_updated",
                "client_status",
                "error_state",
            ] {
                m.remove(k);
            }
            for child in m.values_mut() {
                strip_stamps(child, depth + 1);
            }
        }
        Value::Array(a) => {
            for child in a {
                strip_stamps(child, depth + 1);
            }
        }
        _ => {}
    }
}

/// Removes what is per instance or secret wherever it appears: file access-log paths,
/// and the contents of certificates' and keys' data sources.
fn scrub(v: &mut Value, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    match v {
        Value::Object(m) => {
            let file_log = m
                .get("@type")
                .and_then(Value::as_str)
                .is_some_and(|t| t.ends_with(".FileAccessLog"));
            if file_log {
                m.remove("path");
            }
            for (k, child) in m.iter_mut() {
                match k.as_str() {
                    "tls_certificate"
                    | "tls_certificates"
                    | "session_ticket_keys"
                    | "generic_secret" => hide_material(child, depth + 1),
                    _ => scrub(child, depth + 1),
                }
            }
        }
        Value::Array(a) => {
            for child in a {
                scrub(child, depth + 1);
            }
        }
        _ => {}
    }
}

/// Replaces the contents of every data source under `v` with a marker.
fn hide_material(v: &mut Value, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    match v {
        Value::Object(m) => {
            for (k, child) in m.iter_mut() {
                match k.as_str() {
                    "inline_bytes" | "inline_string" | "environment_variable" => {
                        *child = Value::String(MATERIAL.to_owned());
                    }
                    _ => hide_material(child, depth + 1),
                }
            }
        }
        Value::Array(a) => {
            for child in a {
                hide_material(child, depth + 1);
            }
        }
        _ => {}
    }
}

/// `v` as canonical JSON text ([`write_canonical`]).
fn canonical(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

/// Writes `v` as JSON text with object keys sorted and no spaces, the same for equal
/// values whatever order Envoy wrote keys in.
fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_canonical(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, child) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(child, out);
            }
            out.push(']');
        }
        Value::String(text) => write_string(text, out),
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// A JSON string literal, escaped as serde_json escapes it.
fn write_string(s: &str, out: &mut String) {
    let mut buf = Vec::with_capacity(s.len() + 2);
    serde_json::to_writer(&mut buf, s).expect("a string serializes");
    out.push_str(std::str::from_utf8(&buf).expect("serde_json writes UTF-8"));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The drift hashes of a whole dump, read as the agent reads it.
    fn config_hashes(dump: &Value) -> ConfigHashes {
        let mut h = DriftHasher::default();
        meshcat_common::config_dump::read(dump.to_string().as_bytes(), |item| h.take(item))
            .unwrap();
        h.finish()
    }

    /// Real Envoy 1.40 dumps (`agent/tests/fixtures/config_dumps/capture.py`).
    fn fixture(name: &str) -> Value {
        let path = format!(
            "{}/tests/fixtures/config_dumps/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    }

    /// The section of `d` whose `@type` ends with `ty`.
    fn section_mut<'a>(d: &'a mut Value, ty: &str) -> &'a mut Value {
        d["configs"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|c| c["@type"].as_str().unwrap().ends_with(ty))
            .unwrap()
    }

    #[test]
    fn instances_of_one_configuration_hash_the_same() {
        let a = fixture("orders_a");
        let b = fixture("orders_b");
        // The two differ: node, ports, endpoints, access-log paths, certificate, times.
        assert_ne!(a, b);
        let (ha, hb) = (config_hashes(&a), config_hashes(&b));
        assert_eq!(ha, hb);
        assert_eq!(ha.config.len(), 16);
        assert!(
            ha.config
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        let kinds: Vec<&str> = ha.kinds.keys().map(String::as_str).collect();
        assert_eq!(kinds, ["clusters", "listeners", "routes", "secrets"]);
    }

    #[test]
    fn a_changed_route_changes_the_hash_and_the_routes_kind_only() {
        let a = config_hashes(&fixture("orders_a"));
        let c = config_hashes(&fixture("orders_c_route_changed"));
        assert_ne!(a.config, c.config);
        let differs: Vec<&str> = ResourceKind::ALL
            .iter()
            .map(|k| k.as_str())
            .filter(|k| a.kinds[*k] != c.kinds[*k])
            .collect();
        assert_eq!(differs, ["routes"]);
    }

    /// Envoy writes one `EcdsConfigDump` per kind of discovered filter (here an HTTP
    /// filter and a listener filter): a change in either changes the whole hash, and
    /// their order does not.
    #[test]
    fn every_section_of_a_repeated_type_counts_in_any_order() {
        let d = fixture("ecds_two_filter_kinds");
        let ecds: Vec<usize> = d["configs"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .filter(|(_, c)| c["@type"].as_str().unwrap().ends_with(".EcdsConfigDump"))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(ecds.len(), 2, "one section per filter kind");
        let base = config_hashes(&d);
        for &i in &ecds {
            let mut e = d.clone();
            let filter = &mut e["configs"][i]["ecds_filters"][0]["ecds_filter"];
            let name = filter["name"].as_str().unwrap().to_owned();
            filter["name"] = format!("{name}_renamed").into();
            let h = config_hashes(&e);
            assert_ne!(h.config, base.config, "filter {name}");
            assert_eq!(h.kinds, base.kinds, "filter {name}");
        }
        let mut swapped = d.clone();
        swapped["configs"]
            .as_array_mut()
            .unwrap()
            .swap(ecds[0], ecds[1]);
        assert_ne!(swapped, d);
        assert_eq!(config_hashes(&swapped), base);
    }

    /// An edit of a dump, named for the test's messages.
    type Edit<'a> = (&'a str, &'a dyn Fn(&mut Value));
    /// An edit and the one kind it changes.
    type KindEdit<'a> = (&'a str, &'a dyn Fn(&mut Value), &'a str);

    #[test]
    fn each_left_out_field_is_really_left_out_and_the_rest_counts() {
        let a = fixture("orders_a");
        let base = config_hashes(&a);
        let changed = |edit: &dyn Fn(&mut Value)| {
            let mut d = a.clone();
            edit(&mut d);
            assert_ne!(d, a, "the edit changes the dump");
            config_hashes(&d)
        };
        // Per instance: the same hashes.
        let same: [Edit<'_>; 3] = [
            ("last_updated", &|d| {
                let s = section_mut(d, "ClustersConfigDump");
                s["static_clusters"][0]["last_updated"] = "2030-01-01T00:00:00Z".into();
            }),
            ("listener order", &|d| {
                let s = section_mut(d, "ListenersConfigDump");
                s["static_listeners"].as_array_mut().unwrap().reverse();
            }),
            ("private key marker", &|d| {
                let s = section_mut(d, "SecretsConfigDump");
                for sec in s["static_secrets"].as_array_mut().unwrap() {
                    // `get_mut`, not indexing: an index would add the key to the CA.
                    let key = sec["secret"]
                        .get_mut("tls_certificate")
                        .and_then(|c| c.get_mut("private_key"));
                    if let Some(pk) = key {
                        pk["inline_string"] = "another key".into();
                    }
                }
            }),
        ];
        for (what, edit) in same {
            assert_eq!(changed(edit), base, "{what}");
        }
        // Shared configuration: the hash and exactly one kind change.
        let differ: [KindEdit<'_>; 3] = [
            (
                "connect timeout",
                &|d| {
                    let s = section_mut(d, "ClustersConfigDump");
                    s["static_clusters"][0]["cluster"]["connect_timeout"] = "2s".into();
                },
                "clusters",
            ),
            (
                "stat prefix",
                &|d| {
                    let s = section_mut(d, "ListenersConfigDump");
                    let hcm = &mut s["static_listeners"][0]["listener"]["filter_chains"][0]["filters"]
                        [0]["typed_config"];
                    hcm["stat_prefix"] = "other".into();
                },
                "listeners",
            ),
            (
                "trusted CA file",
                &|d| {
                    let s = section_mut(d, "SecretsConfigDump");
                    for sec in s["static_secrets"].as_array_mut().unwrap() {
                        if let Some(vc) = sec["secret"].get_mut("validation_context") {
                            vc["trusted_ca"]["filename"] = "/etc/other-ca.pem".into();
                        }
                    }
                },
                "secrets",
            ),
        ];
        for (what, edit, kind) in differ {
            let h = changed(edit);
            assert_ne!(h.config, base.config, "{what}");
            let differs: Vec<&String> = h
                .kinds
                .keys()
                .filter(|k| h.kinds[*k] != base.kinds[*k])
                .collect();
            assert_eq!(differs, [kind], "{what}");
        }
        // The bootstrap's own settings count, in the whole hash only.
        let h = changed(&|d| {
            let s = section_mut(d, "BootstrapConfigDump");
            s["bootstrap"]["stats_flush_interval"] = "5s".into();
        });
        assert_ne!(h.config, base.config);
        assert_eq!(h.kinds, base.kinds);
    }

    /// Endpoints are compared as sets, within a locality and across localities. The
    /// endpoints differ in what is kept (weight, locality, priority), not only in their
    /// addresses (left out), so that an order that counted would show.
    #[test]
    fn endpoint_order_does_not_count() {
        let mut weighted = fixture("orders_a");
        let plain = config_hashes(&weighted);
        {
            let s = section_mut(&mut weighted, "ClustersConfigDump");
            let payments = s["static_clusters"]
                .as_array_mut()
                .unwrap()
                .iter_mut()
                .find(|c| c["cluster"]["name"] == "payments")
                .unwrap();
            let groups = payments["cluster"]["load_assignment"]["endpoints"]
                .as_array_mut()
                .unwrap();
            let lbs = groups[0]["lb_endpoints"].as_array_mut().unwrap();
            assert_eq!(lbs.len(), 2);
            for (i, lb) in lbs.iter_mut().enumerate() {
                lb["load_balancing_weight"] = (i + 1).into();
            }
            groups[0]["locality"] = serde_json::json!({"zone": "z1"});
            let mut other = groups[0].clone();
            other["locality"] = serde_json::json!({"zone": "z2"});
            other["priority"] = 1.into();
            groups.push(other);
        }
        let base = config_hashes(&weighted);
        assert_ne!(
            base.kinds["clusters"], plain.kinds["clusters"],
            "weights count"
        );
        let reordered = |edit: &dyn Fn(&mut Vec<Value>)| {
            let mut d = weighted.clone();
            let s = section_mut(&mut d, "ClustersConfigDump");
            for c in s["static_clusters"].as_array_mut().unwrap() {
                if let Some(groups) = c["cluster"]["load_assignment"]["endpoints"].as_array_mut() {
                    edit(groups);
                }
            }
            assert_ne!(d, weighted, "the edit changes the dump");
            config_hashes(&d)
        };
        let within = reordered(&|groups| {
            for g in groups {
                g["lb_endpoints"].as_array_mut().unwrap().reverse();
            }
        });
        assert_eq!(within, base, "lb_endpoints reversed");
        let across = reordered(&|groups| groups.reverse());
        assert_eq!(across, base, "localities reversed");
    }

    /// No secret material in what is hashed: the certificate and the (redacted) key
    /// are markers, the trusted CA's file name stays.
    #[test]
    fn secrets_are_hashed_without_their_material() {
        let d = fixture("orders_a");
        let section = d["configs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["@type"].as_str().unwrap().ends_with("SecretsConfigDump"))
            .unwrap();
        let mut all = String::new();
        for s in section["static_secrets"].as_array().unwrap() {
            let mut s = s["secret"].clone();
            scrub(&mut s, 0);
            all.push_str(&canonical(&s));
        }
        assert!(!all.contains("BEGIN CERTIFICATE"), "{all}");
        assert!(!all.contains("redacted"), "{all}");
        assert!(all.contains(MATERIAL) && all.contains("ca.pem"), "{all}");
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let a: Value =
            serde_json::from_str(r#"{"b":1,"a":{"d":[1,{"y":2,"x":"s"}],"c":null}}"#).unwrap();
        assert_eq!(
            canonical(&a),
            r#"{"a":{"c":null,"d":[1,{"x":"s","y":2}]},"b":1}"#
        );
    }
}
