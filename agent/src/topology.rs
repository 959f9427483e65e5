//! What the graph needs from one sidecar: each upstream cluster's traffic (from the
//! stats of every scrape) and the sidecar's listeners with the clusters their routes
//! name, plus which clusters use TLS (from `/config_dump`, read again only when
//! [`config_version`] moves: a configuration change or a restart). The drift hashes
//! ([`crate::drift`]) are computed at that same read and kept beside the topology.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use meshcat_common::identity::{
    MAX_MATCHERS, MAX_SAN_BYTES, MatchKind, SanExpectation, SanKind, SanMatcher,
};
use meshcat_common::wire::{ListenerRoutes, UpstreamTraffic};
use serde_json::Value;

use crate::drift::ConfigHashes;
use crate::envoy::model::StatsSnapshot;
use meshcat_common::config_dump::Item;

use meshcat_common::limits::{
    MAX_LISTENER_CLUSTERS, MAX_LISTENERS, MAX_UPSTREAM_CLUSTERS as MAX_UPSTREAMS,
};

/// Depth beyond which a config dump is not walked: real dumps are far shallower.
const MAX_DEPTH: usize = 64;

/// The sidecar's configuration as the graph reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    pub listeners: Vec<ListenerRoutes>,
    /// Clusters whose transport socket is TLS.
    pub tls_clusters: BTreeSet<String>,
    /// The SAN matchers of each upstream cluster whose TLS context checks SANs, by
    /// cluster name (at most as many as upstream clusters are reported).
    pub expectations: Vec<SanExpectation>,
}

/// The topology and drift hashes of the last `/config_dump` read and the
/// configuration counters it was read at; one per scraped sidecar.
#[derive(Debug, Default)]
pub struct TopologyCache {
    /// The configuration version of the last read that succeeded.
    read_at: Option<u64>,
    /// The configuration version at which a read failed for good ([`ReadFailure::Lasting`]):
    /// the same dump would fail again, so it is not fetched until the version moves.
    failed_at: Option<u64>,
    /// The start time of the sidecar process the topology and hashes were read from.
    read_from: Option<i64>,
    topology: Topology,
    /// `None` until a dump was read: a sidecar whose configuration is unknown has no
    /// hash rather than the hash of nothing.
    hashes: Option<ConfigHashes>,
}

/// How a `/config_dump` read failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFailure {
    /// Another try may succeed (no answer, a timeout, an error status): read again at
    /// the next scrape.
    Passing,
    /// The dump itself is at fault (over the size limit, not a config dump): the same
    /// configuration would fail again, so it is read again only once it changes.
    Lasting,
}

impl TopologyCache {
    /// Whether `/config_dump` is to be read at `version`: the configuration changed
    /// since the last read (or none was made), and no read failed for good at it.
    pub fn stale(&self, version: u64) -> bool {
        self.read_at != Some(version) && self.failed_at != Some(version)
    }

    /// Keeps `topology` and `hashes`, read when the configuration counters were at
    /// `version` from the sidecar process started at `start_time_ms`.
    pub fn store(
        &mut self,
        version: u64,
        start_time_ms: i64,
        topology: Topology,
        hashes: ConfigHashes,
    ) {
        self.read_at = Some(version);
        self.failed_at = None;
        self.read_from = Some(start_time_ms);
        self.topology = topology;
        self.hashes = Some(hashes);
    }

    /// Records a read that failed at `version` of the sidecar process started at
    /// `start_time_ms`. What was read from the same process stays (its last known
    /// configuration); what was read from an earlier process (the sidecar restarted)
    /// is dropped: it describes a configuration that no longer runs.
    pub fn failed(&mut self, version: u64, start_time_ms: i64, failure: ReadFailure) {
        if failure == ReadFailure::Lasting {
            self.failed_at = Some(version);
        }
        if self.read_from.is_some_and(|t| t != start_time_ms) {
            self.read_at = None;
            self.read_from = None;
            self.topology = Topology::default();
            self.hashes = None;
        }
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    pub fn hashes(&self) -> Option<&ConfigHashes> {
        self.hashes.as_ref()
    }
}

/// A number that changes when the sidecar's listeners, clusters, routes, discovered
/// filters or SDS secrets change: Envoy's counters of listener and cluster additions,
/// modifications and removals, of route reloads (`http.<prefix>.rds.<name>.config_reload`
/// and `http.<prefix>.scoped_rds.<name>.config_reload`), of filter configurations
/// reloaded by ECDS (`extension_config_discovery.<kind>.<name>.config_reload`) and of TLS
/// contexts updated by SDS, with the sidecar's start time (a restarted sidecar counts
/// from zero again). [`crate::envoy::STATS_FILTER`] asks Envoy for them.
pub fn config_version(stats: &StatsSnapshot, start_time_ms: i64) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    start_time_ms.hash(&mut h);
    for (name, v) in &stats.values {
        let reload = name.ends_with(".config_reload");
        let config = name.starts_with("listener_manager.listener_")
            || name.starts_with("cluster_manager.cluster_")
            || (reload && name.starts_with("http."))
            || (reload && name.starts_with("extension_config_discovery."))
            || name.ends_with("_ssl_socket_factory.ssl_context_update_by_sds");
        if config {
            name.hash(&mut h);
            v.hash(&mut h);
        }
    }
    h.finish()
}

/// The traffic of each upstream cluster that carried requests or failed to connect,
/// from one scrape's stats. A cluster is named by what lies between `cluster.` and a
/// known suffix, so names with dots (`outbound|80||a.b.svc`) stay whole.
///
/// Every attempt counts as a request and every failed one as one error (contract
/// section 19): a request that never reached a host (its connection failed, a TLS
/// handshake refused the host's certificate) is in neither `upstream_rq_total` nor,
/// once, in the 5xx and connect-failure counters, but in
/// `upstream_rq_pending_failure_eject` and, with its local 503, in `upstream_rq_5xx`.
/// So requests are `upstream_rq_total` plus the ejected ones, and errors the larger of
/// the 5xx answers and the 5xx answers from hosts plus the connect failures (a connect
/// failure retried on another host is an error with no 503 of its own).
pub fn upstream_traffic(
    stats: &StatsSnapshot,
    tls_clusters: &BTreeSet<String>,
) -> Vec<UpstreamTraffic> {
    #[derive(Default)]
    struct Counters {
        requests: u64,
        errors: u64,
        connect_fail: u64,
        ejected: u64,
        handshakes: u64,
    }
    let mut by_name: BTreeMap<&str, Counters> = BTreeMap::new();
    for (name, v) in &stats.values {
        let Some(rest) = name.strip_prefix("cluster.") else {
            continue;
        };
        let (cluster, slot): (&str, fn(&mut Counters) -> &mut u64) =
            if let Some(c) = rest.strip_suffix(".upstream_rq_total") {
                (c, |c| &mut c.requests)
            } else if let Some(c) = rest.strip_suffix(".upstream_rq_5xx") {
                (c, |c| &mut c.errors)
            } else if let Some(c) = rest.strip_suffix(".upstream_cx_connect_fail") {
                (c, |c| &mut c.connect_fail)
            } else if let Some(c) = rest.strip_suffix(".upstream_rq_pending_failure_eject") {
                (c, |c| &mut c.ejected)
            } else if let Some(c) = rest.strip_suffix(".ssl.handshake") {
                (c, |c| &mut c.handshakes)
            } else {
                continue;
            };
        *slot(by_name.entry(cluster).or_default()) = *v;
    }
    let mut out: Vec<UpstreamTraffic> = by_name
        .into_iter()
        .filter(|(_, c)| c.requests > 0 || c.connect_fail > 0)
        .map(|(name, c)| {
            let (p50_ms, p99_ms) = stats
                .interval_p50_p99
                .get(&format!("cluster.{name}.upstream_rq_time"))
                .copied()
                .unwrap_or((None, None));
            UpstreamTraffic {
                name: name.to_owned(),
                requests_total: c.requests.saturating_add(c.ejected),
                errors_total: c.errors.max(
                    c.errors
                        .saturating_sub(c.ejected)
                        .saturating_add(c.connect_fail),
                ),
                connect_fail_total: c.connect_fail,
                p50_ms,
                p99_ms,
                tls: c.handshakes > 0 || tls_clusters.contains(name),
            }
        })
        .collect();
    if out.len() > MAX_UPSTREAMS {
        out.sort_by_key(|u| std::cmp::Reverse(u.requests_total));
        out.truncate(MAX_UPSTREAMS);
        out.sort_by(|a, b| a.name.cmp(&b.name));
    }
    out
}

/// Reads the listeners, their routes' clusters and the TLS clusters from the
/// resources of a `/config_dump` ([`meshcat_common::config_dump::read`]), one at a time. A
/// listener's address is the one it is bound to (`bound`, from `/listeners`, by
/// listener name), else the configured one; a wildcard host (`0.0.0.0`, `::`) is
/// given as `own_host`, the host the sidecar is reached at, so that other sidecars'
/// upstream host addresses can match it. Only the sidecar's own addresses are kept
/// ([`own_address`]): a listener at another workload's address (a configuration
/// may name any) would draw that workload's callers to this sidecar's cluster.
#[derive(Debug)]
pub struct TopologyReader<'a> {
    bound: &'a BTreeMap<String, (String, u32)>,
    own_host: &'a str,
    /// The clusters each route configuration names, by its name: listeners that name
    /// theirs (RDS) are resolved at the end, whatever the order of the dump.
    route_clusters: BTreeMap<String, BTreeSet<String>>,
    /// Each listener's address, the clusters its filters name inline, and the route
    /// configurations it names.
    listeners: Vec<(String, BTreeSet<String>, BTreeSet<String>)>,
    tls_clusters: BTreeSet<String>,
    expectations: Vec<SanExpectation>,
}

impl<'a> TopologyReader<'a> {
    pub fn new(bound: &'a BTreeMap<String, (String, u32)>, own_host: &'a str) -> Self {
        TopologyReader {
            bound,
            own_host,
            route_clusters: BTreeMap::new(),
            listeners: Vec::new(),
            tls_clusters: BTreeSet::new(),
            expectations: Vec::new(),
        }
    }

    /// Takes what the topology needs from one resource.
    pub fn take(&mut self, item: &Item) {
        match item {
            Item::Listener(l) => {
                if self.listeners.len() >= MAX_LISTENERS {
                    return;
                }
                let name = l.get("name").and_then(Value::as_str).unwrap_or("");
                let Some(address) = self
                    .bound
                    .get(name)
                    .map(|(h, p)| socket_address(h, u64::from(*p), self.own_host))
                    .or_else(|| listener_address(l, self.own_host))
                    .filter(|a| own_address(a, self.own_host))
                else {
                    return;
                };
                let mut names = Names::default();
                collect_clusters(l, &mut names, 0);
                self.listeners
                    .push((address, names.clusters, names.route_configs));
            }
            Item::RouteConfig(rc) => {
                if let Some(name) = rc.get("name").and_then(Value::as_str) {
                    let mut names = Names::default();
                    collect_clusters(rc, &mut names, 0);
                    self.route_clusters.insert(name.to_owned(), names.clusters);
                }
            }
            Item::Cluster(c) => {
                let tls = c
                    .get("transport_socket")
                    .and_then(|t| t.get("name"))
                    .and_then(Value::as_str)
                    .is_some_and(|n| n.contains("tls"));
                if tls && let Some(name) = c.get("name").and_then(Value::as_str) {
                    self.tls_clusters.insert(name.to_owned());
                }
                if self.expectations.len() < MAX_UPSTREAMS
                    && let Some(e) = san_expectation(c)
                {
                    self.expectations.push(e);
                }
            }
            _ => {}
        }
    }

    /// The topology of every resource taken.
    pub fn finish(self) -> Topology {
        let route_clusters = self.route_clusters;
        let mut listeners: Vec<ListenerRoutes> = self
            .listeners
            .into_iter()
            .map(|(address, mut clusters, route_configs)| {
                for rc in &route_configs {
                    if let Some(named) = route_clusters.get(rc) {
                        clusters.extend(named.iter().cloned());
                    }
                }
                ListenerRoutes {
                    address,
                    clusters: clusters.into_iter().take(MAX_LISTENER_CLUSTERS).collect(),
                }
            })
            .collect();
        listeners.sort_by(|a, b| a.address.cmp(&b.address));
        listeners.dedup_by(|a, b| a.address == b.address);
        let mut expectations = self.expectations;
        expectations.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        expectations.dedup_by(|a, b| a.cluster == b.cluster);
        Topology {
            listeners,
            tls_clusters: self.tls_clusters,
            expectations,
        }
    }
}

/// Whether the sidecar reached at `own_host` may report a listener at `address`
/// (`host:port`, `[host]:port`): its host is `own_host`, or a loopback address
/// (the aggregator takes those only from a sidecar it is told is reached on
/// loopback).
fn own_address(address: &str, own_host: &str) -> bool {
    let Some((host, _)) = address.rsplit_once(':') else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match (
        host.parse::<std::net::IpAddr>(),
        own_host.parse::<std::net::IpAddr>(),
    ) {
        (Ok(h), _) if h.is_loopback() => true,
        (Ok(h), Ok(own)) => h == own,
        _ => host.eq_ignore_ascii_case(own_host),
    }
}

/// `host:port` of a listener's socket address, a wildcard host replaced by `own_host`.
fn listener_address(l: &Value, own_host: &str) -> Option<String> {
    let sa = l.get("address")?.get("socket_address")?;
    let host = sa.get("address")?.as_str()?;
    let port = sa.get("port_value")?.as_u64()?;
    Some(socket_address(host, port, own_host))
}

/// `host:port` (`[host]:port` for IPv6), a wildcard host replaced by `own_host`.
fn socket_address(host: &str, port: u64, own_host: &str) -> String {
    let host = match host {
        "0.0.0.0" | "::" | "" => own_host,
        h => h,
    };
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// What a listener or route configuration names.
#[derive(Debug, Default)]
struct Names {
    clusters: BTreeSet<String>,
    /// Route configurations named through RDS (`rds.route_config_name`).
    route_configs: BTreeSet<String>,
}

/// The clusters a resource's filters name: TCP proxies' `cluster`, routes' `cluster`
/// and weighted clusters' names, and the route configurations HTTP connection
/// managers name (`rds.route_config_name`).
fn collect_clusters(v: &Value, out: &mut Names, depth: usize) {
    if depth > MAX_DEPTH || out.clusters.len() >= MAX_LISTENER_CLUSTERS {
        return;
    }
    match v {
        Value::Object(m) => {
            if let Some(name) = m
                .get("rds")
                .and_then(|r| r.get("route_config_name"))
                .and_then(Value::as_str)
            {
                out.route_configs.insert(name.to_owned());
            }
            for (k, child) in m {
                match (k.as_str(), child) {
                    // A route's or a TCP proxy's target.
                    ("cluster", Value::String(c)) => {
                        out.clusters.insert(c.clone());
                    }
                    ("weighted_clusters", w) => {
                        for c in w
                            .get("clusters")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                        {
                            if let Some(n) = c.get("name").and_then(Value::as_str) {
                                out.clusters.insert(n.to_owned());
                            }
                        }
                    }
                    // Not targets: access log and tracing sinks, filter services.
                    ("access_log" | "tracing" | "http_filters" | "transport_socket", _) => {}
                    _ => collect_clusters(child, out, depth + 1),
                }
            }
        }
        Value::Array(a) => {
            for child in a {
                collect_clusters(child, out, depth + 1);
            }
        }
        _ => {}
    }
}

/// The SAN matchers an upstream cluster's TLS context requires, from the cluster as
/// its sidecar's `/config_dump` holds it: under `transport_socket` or any TLS entry of
/// `transport_socket_matches` (Istio's shape), in the context's `validation_context`
/// or `combined_validation_context.default_validation_context`. `None` for a cluster
/// without TLS or whose context checks no SAN, and for one over [`MAX_MATCHERS`]
/// (left out rather than cut, which would predict failures that do not happen).
pub fn san_expectation(cluster: &Value) -> Option<SanExpectation> {
    let name = cluster.get("name")?.as_str()?;
    let sockets = std::iter::once(cluster.get("transport_socket"))
        .chain(
            cluster
                .get("transport_socket_matches")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|m| m.get("transport_socket")),
        )
        .flatten();
    let mut matchers = Vec::new();
    for socket in sockets {
        let Some(tls) = socket.get("typed_config").filter(|c| {
            c.get("@type")
                .and_then(Value::as_str)
                .is_some_and(|t| t.ends_with(".UpstreamTlsContext"))
        }) else {
            continue;
        };
        let Some(common) = tls.get("common_tls_context") else {
            continue;
        };
        let contexts = [
            common.get("validation_context"),
            common
                .get("combined_validation_context")
                .and_then(|c| c.get("default_validation_context")),
        ];
        for vc in contexts.into_iter().flatten() {
            for m in vc
                .get("match_typed_subject_alt_names")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let san_type = match m.get("san_type").and_then(Value::as_str) {
                    Some("DNS") => Some(SanKind::Dns),
                    Some("URI") => Some(SanKind::Uri),
                    Some("IP_ADDRESS") => Some(SanKind::Ip),
                    Some("EMAIL") => Some(SanKind::Email),
                    // OTHER_NAME and unknown types are not in /certs: never matched.
                    _ => continue,
                };
                if let Some(matcher) = m.get("matcher").and_then(|s| string_matcher(s, san_type)) {
                    matchers.push(matcher);
                }
            }
            for m in vc
                .get("match_subject_alt_names")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(matcher) = string_matcher(m, None) {
                    matchers.push(matcher);
                }
            }
        }
    }
    matchers.sort();
    matchers.dedup();
    if matchers.is_empty()
        || matchers.len() > MAX_MATCHERS
        || matchers.iter().any(|m| m.value.len() > MAX_SAN_BYTES)
    {
        return None;
    }
    Some(SanExpectation {
        cluster: name.to_owned(),
        matchers,
    })
}

/// Envoy's `StringMatcher` as a [`SanMatcher`] of SANs of `san_type` (any: `None`).
fn string_matcher(m: &Value, san_type: Option<SanKind>) -> Option<SanMatcher> {
    let ignore_case = m.get("ignore_case").and_then(Value::as_bool) == Some(true);
    let (kind, value) = [
        ("exact", MatchKind::Exact),
        ("prefix", MatchKind::Prefix),
        ("suffix", MatchKind::Suffix),
        ("contains", MatchKind::Contains),
    ]
    .into_iter()
    .find_map(|(key, kind)| Some((kind, m.get(key)?.as_str()?.to_owned())))
    .or_else(|| {
        let re = m.get("safe_regex")?.get("regex")?.as_str()?;
        Some((MatchKind::Regex, re.to_owned()))
    })?;
    Some(SanMatcher {
        san_type,
        kind,
        value,
        ignore_case,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matchers_are_read_from_every_shape_of_an_upstream_tls_context() {
        let tls = |validation: Value| {
            serde_json::json!({
                "name": "typed_config",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                    "common_tls_context": validation,
                }
            })
        };
        let plain = serde_json::json!({
            "name": "payments",
            "transport_socket": tls(serde_json::json!({"validation_context": {
                "trusted_ca": {"filename": "/ca.pem"},
                "match_typed_subject_alt_names": [
                    {"san_type": "URI", "matcher": {"exact": "spiffe://shop/sa/payments"}},
                    {"san_type": "DNS", "matcher": {"safe_regex": {"regex": "pay-.*"}, "ignore_case": true}},
                    {"san_type": "OTHER_NAME", "matcher": {"exact": "x"}}
                ]
            }})),
        });
        let e = san_expectation(&plain).unwrap();
        assert_eq!(e.cluster, "payments");
        assert_eq!(
            e.matchers,
            vec![
                SanMatcher {
                    san_type: Some(SanKind::Dns),
                    kind: MatchKind::Regex,
                    value: "pay-.*".into(),
                    ignore_case: true,
                },
                SanMatcher::exact(SanKind::Uri, "spiffe://shop/sa/payments"),
            ]
        );
        // Istio: the CA over SDS, matchers in the combined context, the TLS socket
        // in a transport socket match beside a plaintext one.
        let istio = serde_json::json!({
            "name": "outbound|8080||reviews.shop.svc.cluster.local",
            "transport_socket_matches": [
                {"name": "tlsMode-istio", "match": {"tlsMode": "istio"},
                 "transport_socket": tls(serde_json::json!({"combined_validation_context": {
                    "default_validation_context": {"match_subject_alt_names": [
                        {"exact": "spiffe://cluster.local/ns/shop/sa/reviews"}]},
                    "validation_context_sds_secret_config": {"name": "ROOTCA"}}}))},
                {"name": "tlsMode-disabled", "transport_socket": {"name": "envoy.transport_sockets.raw_buffer"}}
            ]
        });
        let e = san_expectation(&istio).unwrap();
        assert_eq!(e.matchers.len(), 1);
        assert_eq!(e.matchers[0].san_type, None, "the older field has no type");
        // No TLS, or TLS that checks no SAN: no expectation.
        assert!(san_expectation(&serde_json::json!({"name": "plain"})).is_none());
        let ca_only = serde_json::json!({"name": "c", "transport_socket": tls(
            serde_json::json!({"validation_context": {"trusted_ca": {"filename": "/ca.pem"}}}))});
        assert!(san_expectation(&ca_only).is_none());
        // Too many matchers: left out, not cut.
        let many: Vec<Value> = (0..=MAX_MATCHERS)
            .map(|i| serde_json::json!({"san_type": "DNS", "matcher": {"exact": format!("h{i}")}}))
            .collect();
        let over = serde_json::json!({"name": "c", "transport_socket": tls(
            serde_json::json!({"validation_context": {"match_typed_subject_alt_names": many}}))});
        assert!(san_expectation(&over).is_none());
    }

    fn stats(values: &[(&str, u64)]) -> StatsSnapshot {
        StatsSnapshot {
            values: values.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect(),
            ..StatsSnapshot::default()
        }
    }

    /// A topology and hashes as a read gives them, told apart by `hash`.
    fn read(hash: &str) -> (Topology, ConfigHashes) {
        let topology = Topology {
            listeners: vec![ListenerRoutes {
                address: "10.0.0.1:8080".into(),
                clusters: vec!["payments".into()],
            }],
            tls_clusters: BTreeSet::new(),
            expectations: Vec::new(),
        };
        let hashes = ConfigHashes {
            config: hash.into(),
            kinds: BTreeMap::new(),
        };
        (topology, hashes)
    }

    /// The listeners of a dump as a sidecar reached at `own_host` reports them.
    fn listeners_of(dump: &[u8], own_host: &str) -> Vec<ListenerRoutes> {
        let bound = BTreeMap::new();
        let mut reader = TopologyReader::new(&bound, own_host);
        meshcat_common::config_dump::read(dump, |item| reader.take(&item)).unwrap();
        reader.finish().listeners
    }

    #[test]
    fn a_listener_at_another_workloads_address_is_not_reported() {
        let path = format!(
            "{}/tests/fixtures/config_dumps/orders_a.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let real = std::fs::read(path).unwrap();
        let addresses = |dump: &[u8], own: &str| -> Vec<String> {
            listeners_of(dump, own)
                .into_iter()
                .map(|l| l.address)
                .collect()
        };
        // The captured sidecar listens on loopback, where its agent reaches it.
        assert_eq!(
            addresses(&real, "127.0.0.1"),
            ["127.0.0.1:34173", "127.0.0.1:51685"]
        );
        // The same configuration with its outbound listener at the address of
        // another workload (its payments endpoint, 10.1.0.1:8443): that one is
        // left out, whether the sidecar is reached on loopback or at its pod IP.
        let mut dump: Value = serde_json::from_slice(&real).unwrap();
        fn move_listener(v: &mut Value) {
            match v {
                Value::Object(m) => {
                    let sa = m.get_mut("socket_address");
                    if let Some(sa) = sa.filter(|sa| sa["port_value"] == 51685) {
                        sa["address"] = "10.1.0.1".into();
                        sa["port_value"] = 8443.into();
                    }
                    m.values_mut().for_each(move_listener);
                }
                Value::Array(a) => a.iter_mut().for_each(move_listener),
                _ => {}
            }
        }
        move_listener(&mut dump);
        let claiming = serde_json::to_vec(&dump).unwrap();
        assert_eq!(addresses(&claiming, "127.0.0.1"), ["127.0.0.1:34173"]);
        assert_eq!(addresses(&claiming, "10.1.0.7"), ["127.0.0.1:34173"]);
        // At its own pod IP it is reported.
        assert_eq!(
            addresses(&claiming, "10.1.0.1"),
            ["10.1.0.1:8443", "127.0.0.1:34173"]
        );
    }

    #[test]
    fn a_dump_at_fault_is_not_fetched_again_until_the_configuration_moves() {
        let mut cache = TopologyCache::default();
        assert!(cache.stale(1));
        cache.failed(1, 1_000, ReadFailure::Lasting);
        assert!(!cache.stale(1), "the same dump is not fetched again");
        assert!(cache.stale(2), "a changed configuration is");
        cache.failed(2, 1_000, ReadFailure::Passing);
        assert!(
            cache.stale(2),
            "a passing failure is tried at the next scrape"
        );
        let (t, h) = read("a");
        cache.store(2, 1_000, t.clone(), h.clone());
        assert!(!cache.stale(2));
        // The same process: its last configuration read stays.
        cache.failed(3, 1_000, ReadFailure::Lasting);
        assert!(!cache.stale(3));
        assert!(cache.stale(4));
        assert_eq!(cache.hashes(), Some(&h));
        assert_eq!(cache.topology(), &t);
        // A read that succeeds again forgets the failure.
        let (t, h) = read("b");
        cache.store(4, 1_000, t, h.clone());
        assert!(cache.stale(3));
        assert_eq!(cache.hashes(), Some(&h));
    }

    #[test]
    fn a_restarted_sidecar_whose_dump_fails_keeps_nothing_of_the_old_process() {
        for failure in [ReadFailure::Passing, ReadFailure::Lasting] {
            let mut cache = TopologyCache::default();
            let (t, h) = read("a");
            cache.store(1, 1_000, t, h);
            cache.failed(2, 60_000, failure);
            assert_eq!(cache.hashes(), None, "{failure:?}");
            assert_eq!(cache.topology(), &Topology::default(), "{failure:?}");
            assert_eq!(cache.stale(2), failure == ReadFailure::Passing);
            assert!(cache.stale(1), "{failure:?}");
        }
    }

    #[test]
    fn the_config_version_moves_with_configuration_counters_and_restarts_only() {
        let base = [
            ("listener_manager.listener_added", 2),
            ("cluster_manager.cluster_added", 3),
            ("http.ingress_http.rds.routes.config_reload", 1),
            ("http.ingress_http.scoped_rds.scoped.config_reload", 1),
            (
                "extension_config_discovery.http_filter.fault.config_reload",
                1,
            ),
            (
                "extension_config_discovery.tcp_listener_filter.tls_inspector.config_reload",
                1,
            ),
            (
                "cluster.payments.client_ssl_socket_factory.ssl_context_update_by_sds",
                1,
            ),
            (
                "listener.10.0.0.1_8443.server_ssl_socket_factory.ssl_context_update_by_sds",
                1,
            ),
            ("cluster.payments.upstream_rq_total", 10),
        ];
        let v = config_version(&stats(&base), 1_000);
        let with = |i: usize, value: u64| {
            let mut s = base;
            s[i].1 = value;
            config_version(&stats(&s), 1_000)
        };
        let traffic = base.len() - 1;
        for (i, (name, _)) in base.iter().enumerate().take(traffic) {
            assert_ne!(with(i, 9), v, "{name}");
        }
        assert_eq!(with(traffic, 99), v, "traffic is not configuration");
        assert_ne!(config_version(&stats(&base), 2_000), v, "a restart");
    }
}
