//! What the engine reads: per sidecar, its `/clusters?format=json`, the routes of its
//! `/config_dump`, its ssl and secrets stats, the tail of its log and an optional debug
//! window; plus the cluster's metrics settings, and what the zone's control server
//! declares for the cluster beside the sidecars' sync with it. Parsers turn the admin
//! API's JSON into these types; every input is bounded.

use std::collections::{BTreeMap, BTreeSet};

use meshcat_common::wire::{LogWindow, UpstreamCluster, UpstreamHost};
use serde_json::Value;

use crate::symptom::Symptom;

/// Most log lines kept per sidecar (the newest are kept).
pub const MAX_LOG_LINES: usize = 20_000;
/// Longest log line kept; longer lines are cut at a character boundary.
pub const MAX_LOG_LINE_LEN: usize = 8 * 1024;
/// Most clusters read from one `/clusters` document.
pub use meshcat_common::limits::MAX_SIDECAR_CLUSTERS as MAX_CLUSTERS;
/// Most route entries read from one `/config_dump`.
pub const MAX_ROUTES: usize = 50_000;
/// Most stats read from one `/stats` document.
pub const MAX_STATS: usize = 100_000;

/// Why an admin document could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    #[error("{what} is not valid JSON: {source}")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("{what} does not have the expected shape: {detail}")]
    Shape { what: &'static str, detail: String },
}

/// Which side of a request a sidecar stands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The zone's request cluster: where requests enter the mesh.
    Edge,
    /// A sidecar beside an instance of the diagnosed service.
    Service,
}

/// A route of a route configuration that sends traffic to a named cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteEntry {
    pub route_config: String,
    pub virtual_host: String,
    /// The route's match, as `prefix /catalog/` or `path /x`.
    pub matcher: String,
    pub cluster: String,
}

/// Everything read from one sidecar. `None` means "not collected", which makes the
/// checks that need it `skipped` rather than guess.
#[derive(Debug, Clone)]
pub struct SidecarEvidence {
    pub role: Role,
    /// Instance name, for the evidence lines.
    pub instance: String,
    /// `/clusters?format=json`, parsed.
    pub clusters: Option<Vec<UpstreamCluster>>,
    /// The routes of `/config_dump` that name clusters.
    pub routes: Option<Vec<RouteEntry>>,
    /// Whether some route picks its cluster from a header, so any cluster may be routed.
    pub dynamic_routes: bool,
    /// `/stats` filtered on `ssl` and `secrets`: name to value.
    pub ssl_stats: Option<BTreeMap<String, u64>>,
    /// The tail of the sidecar's log: access lines mixed with Envoy's own lines.
    pub log_lines: Option<Vec<String>>,
    /// Log lines written while the sidecar ran at debug level around a replayed request.
    pub debug_lines: Option<Vec<String>>,
    /// What the access lines of `log_lines` cover, as the agent says; `None` from an
    /// agent that does not say (the lines' own times are read instead).
    pub log_window: Option<LogWindow>,
    /// The lines of one request asked for by its id after the first read of the log
    /// missed it ([`SidecarEvidence::add_request_lines`]): the request id, and what
    /// that ask covered.
    pub asked_request: Option<(String, LogWindow)>,
}

impl SidecarEvidence {
    /// Evidence with nothing collected yet.
    pub fn new(role: Role, instance: impl Into<String>) -> Self {
        SidecarEvidence {
            role,
            instance: instance.into(),
            clusters: None,
            routes: None,
            dynamic_routes: false,
            ssl_stats: None,
            log_lines: None,
            debug_lines: None,
            log_window: None,
            asked_request: None,
        }
    }

    /// Adds the sidecar's `/clusters?format=json` document.
    pub fn with_clusters_json(mut self, json: &str) -> Result<Self, EvidenceError> {
        self.clusters = Some(parse_clusters_json(json)?);
        Ok(self)
    }

    /// Adds the routes of the sidecar's `/config_dump` (whole or trimmed).
    pub fn with_config_dump_json(mut self, json: &str) -> Result<Self, EvidenceError> {
        let dump: Value = serde_json::from_str(json).map_err(|source| EvidenceError::Json {
            what: "/config_dump",
            source,
        })?;
        let (routes, dynamic) = routes_of_config_dump(&dump);
        self.routes = Some(routes);
        self.dynamic_routes = dynamic;
        Ok(self)
    }

    /// Adds the sidecar's `/stats?format=json` (filtered or not; only ssl and
    /// secrets counters are kept).
    pub fn with_stats_json(mut self, json: &str) -> Result<Self, EvidenceError> {
        self.ssl_stats = Some(parse_ssl_stats_json(json)?);
        Ok(self)
    }

    /// Adds the tail of the sidecar's log.
    pub fn with_log(mut self, text: &str) -> Self {
        self.log_lines = Some(bounded_lines(text));
        self
    }

    /// Adds the lines of a debug window.
    pub fn with_debug_log(mut self, text: &str) -> Self {
        self.debug_lines = Some(bounded_lines(text));
        self
    }

    /// The cluster of that name, if the sidecar lists it.
    pub fn cluster(&self, name: &str) -> Option<&UpstreamCluster> {
        self.clusters.as_ref()?.iter().find(|c| c.name == name)
    }

    /// The routes naming `cluster`.
    pub fn routes_to<'a>(&'a self, cluster: &'a str) -> impl Iterator<Item = &'a RouteEntry> {
        self.routes
            .iter()
            .flatten()
            .filter(move |r| r.cluster == cluster)
    }
}

/// What the catalog and the metrics collector say about a cluster's metrics.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetricsEvidence {
    /// The cluster record's `enableInstanceMetrics`.
    pub enable_instance_metrics: bool,
    /// The cluster record's `prometheusJob`.
    pub prometheus_job: String,
    /// Live instances of the cluster.
    pub live_instances: usize,
    /// Of those, the ones whose last report carries metrics ([`reports_metrics`]).
    pub instances_with_metrics: usize,
    /// Names of some live instances that report none, for the evidence.
    pub silent_instances: Vec<String>,
    /// Whether Prometheus has an `up` series for the job, when it was asked.
    pub prometheus_up: Option<bool>,
}

/// Whether an instance's last report carries metrics: the agent computed the metrics
/// object (it is versioned) and the sidecar has at least one inbound HTTP connection
/// manager whose stats it was computed from (`all/routes` names them). A sidecar
/// without inbound HTTP stats, or an agent that never computed the object, reports
/// nothing a dashboard can show.
pub fn reports_metrics(m: &meshcat_common::model::InstanceMetrics) -> bool {
    !m.mesh_metrics_version.is_empty() && !m.all_routes.is_empty()
}

/// Everything one diagnosis reads.
#[derive(Debug, Clone)]
pub struct DiagnosisInput {
    pub cluster: String,
    pub zone: String,
    /// `None` runs every check.
    pub symptom: Option<Symptom>,
    /// The failing request's path, to filter access lines on.
    pub path: Option<String>,
    /// The sidecar of the zone's request cluster.
    pub edge: Option<SidecarEvidence>,
    /// The name the edge sidecar knows the cluster by (its Envoy cluster), when it
    /// is not the cluster's name: a calling cluster that reaches it through a
    /// listener address names it otherwise. The edge's checks look it up by this
    /// name.
    pub edge_cluster: Option<String>,
    /// The sidecars of the diagnosed cluster's instances.
    pub services: Vec<SidecarEvidence>,
    /// The service sidecar's cluster to its local instance. When `None`, the clusters
    /// the service sidecar's own routes name are taken.
    pub service_local_cluster: Option<String>,
    pub metrics: Option<MetricsEvidence>,
    /// What the zone's control server declares for the cluster and how the
    /// sidecars' configuration compares with it; `None` when the zone has no view of
    /// its control server (none is connected to, or none answered yet): the
    /// `control_server` step then does not run.
    pub control: Option<ControlEvidence>,
    /// What the catalog holds of the workload identity on the request's hop
    /// (contract section 19); `None` when neither side holds any.
    pub identity: Option<IdentityEvidence>,
}

impl DiagnosisInput {
    /// The name the edge sidecar knows the cluster by.
    pub fn edge_name(&self) -> &str {
        self.edge_cluster.as_deref().unwrap_or(&self.cluster)
    }

    /// An input with no evidence yet.
    pub fn new(cluster: impl Into<String>, zone: impl Into<String>) -> Self {
        DiagnosisInput {
            cluster: cluster.into(),
            zone: zone.into(),
            symptom: None,
            path: None,
            edge: None,
            edge_cluster: None,
            services: Vec::new(),
            service_local_cluster: None,
            metrics: None,
            control: None,
            identity: None,
        }
    }
}

/// Most instances of each side whose identity one diagnosis reads.
pub const MAX_IDENTITY_INSTANCES: usize = 16;

/// The workload identity on the request's hop, as the catalog holds it: the
/// caller's SAN expectations against what the diagnosed cluster's instances present,
/// and each side's certificates, with both owners.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentityEvidence {
    /// The calling cluster (the zone's request cluster, or the caller followed).
    pub caller: String,
    pub caller_owner: String,
    pub target_owner: String,
    /// The caller's matchers against the target's SANs; `None` when the caller
    /// checks no SAN of the target or the target presents no certificate.
    pub tls: Option<meshcat_common::identity::TlsIdentity>,
    /// Live instances of the caller and of the target with their identity (at most
    /// [`MAX_IDENTITY_INSTANCES`] each).
    pub callers: Vec<(String, meshcat_common::identity::InstanceIdentity)>,
    pub targets: Vec<(String, meshcat_common::identity::InstanceIdentity)>,
    /// When the identities were read, ms since the epoch (a certificate not valid
    /// yet then is named).
    pub read_at_ms: i64,
}

/// Most declared clusters one diagnosis reads (the names that stand for the cluster).
pub const MAX_DECLARED_CLUSTERS: usize = 16;
/// Most endpoints named per declared cluster (the counts cover them all).
pub const MAX_DECLARED_ENDPOINTS: usize = 8;
/// Most sidecars whose sync one diagnosis reads on each side (edge, service).
pub const MAX_SYNC_SIDECARS: usize = 16;

/// The zone's control server as meshcat holds it (contract section 17): its
/// connection, the clusters of its view that stand for the diagnosed cluster, and
/// the sync of the edge's and the service's sidecars with that view.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ControlEvidence {
    /// The zone's `serverAddress`.
    pub server_address: String,
    /// meshcat's stream to it: `connected`, `unreachable`, `tls-error`, ...
    pub state: String,
    /// The stream's last failure in words, "" when none.
    pub error: String,
    /// How many clusters the view holds.
    pub view_clusters: usize,
    /// The view's clusters that stand for the diagnosed cluster (its name, the
    /// edge's name for it, or a mesh-specific name of its service), at most
    /// [`MAX_DECLARED_CLUSTERS`].
    pub declared: Vec<DeclaredCluster>,
    /// The edge's sidecars (their detail cut to the diagnosed cluster's upstream)
    /// and the service's sidecars, at most [`MAX_SYNC_SIDECARS`] each.
    pub sidecars: Vec<SidecarSync>,
    /// When this was read, ms since the epoch.
    pub read_at_ms: i64,
}

/// A cluster the control server declares.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeclaredCluster {
    /// Its name at the control server.
    pub name: String,
    /// Every endpoint it lists, and those whose health is HEALTHY or UNKNOWN.
    pub endpoints: usize,
    pub healthy: usize,
    /// Some of them (at most [`MAX_DECLARED_ENDPOINTS`]).
    pub listed: Vec<DeclaredEndpoint>,
}

/// An endpoint the control server lists.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeclaredEndpoint {
    pub address: String,
    /// As the control server gives it (`HEALTHY`, `UNHEALTHY`, ...).
    pub health: String,
    pub healthy: bool,
}

/// One sidecar's sync, as `GET /sync` derives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarSync {
    pub role: Role,
    /// The catalog cluster the sidecar belongs to, and that cluster's owner ("" when
    /// none is registered): whose the sidecar is.
    pub cluster: String,
    pub owner: String,
    pub instance: String,
    pub state: SyncState,
    /// Since when it is in that state, ms since the epoch.
    pub since_ms: i64,
    /// The state's detail in words.
    pub text: String,
    /// Upstream clusters whose host set differs from the control server's (on an
    /// edge sidecar, only the diagnosed cluster's).
    pub stale: Vec<StaleUpstream>,
    /// Updates it rejected (on an edge sidecar, not those of another cluster's
    /// endpoints).
    pub rejections: Vec<XdsRejection>,
}

impl SidecarSync {
    /// A sidecar's sync with no detail.
    pub fn new(
        role: Role,
        (cluster, owner): (&str, &str),
        instance: &str,
        state: SyncState,
        since_ms: i64,
    ) -> Self {
        SidecarSync {
            role,
            cluster: cluster.to_owned(),
            owner: owner.to_owned(),
            instance: instance.to_owned(),
            state,
            since_ms,
            text: String::new(),
            stale: Vec::new(),
            rejections: Vec::new(),
        }
    }
}

/// An upstream cluster a sidecar holds otherwise than the control server declares,
/// and an update a sidecar rejected: the aggregator's own detail types.
pub use meshcat_common::sync::{
    Rejection as XdsRejection, StaleCluster as StaleUpstream, SyncState,
};

pub(crate) fn bounded_lines(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let skip = lines.len().saturating_sub(MAX_LOG_LINES);
    lines[skip..]
        .iter()
        .map(|l| truncate(l, MAX_LOG_LINE_LEN).to_owned())
        .collect()
}

/// Cuts `s` to at most `max` bytes at a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Parses `/clusters?format=json` (`cluster_statuses[].host_statuses[]`). Envoy omits
/// zero counters and writes values as strings.
pub fn parse_clusters_json(json: &str) -> Result<Vec<UpstreamCluster>, EvidenceError> {
    const WHAT: &str = "/clusters?format=json";
    let doc: Value =
        serde_json::from_str(json).map_err(|source| EvidenceError::Json { what: WHAT, source })?;
    let statuses = match doc.get("cluster_statuses") {
        None => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(EvidenceError::Shape {
                what: WHAT,
                detail: "cluster_statuses is not an array".into(),
            });
        }
    };
    let mut out = Vec::new();
    for c in statuses.iter().take(MAX_CLUSTERS) {
        let Some(name) = c.get("name").and_then(Value::as_str) else {
            return Err(EvidenceError::Shape {
                what: WHAT,
                detail: "a cluster has no name".into(),
            });
        };
        let hosts = c
            .get("host_statuses")
            .and_then(Value::as_array)
            .map(|hs| hs.iter().map(parse_host).collect())
            .unwrap_or_default();
        out.push(UpstreamCluster {
            name: name.to_owned(),
            added_via_api: c
                .get("added_via_api")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            hosts,
        });
    }
    Ok(out)
}

fn parse_host(h: &Value) -> UpstreamHost {
    let address = match h.pointer("/address/socket_address") {
        Some(sa) => format!(
            "{}:{}",
            sa.get("address").and_then(Value::as_str).unwrap_or("?"),
            sa.get("port_value").and_then(Value::as_u64).unwrap_or(0)
        ),
        None => h
            .pointer("/address/pipe/path")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_owned(),
    };
    let mut counters = BTreeMap::new();
    for s in h
        .get("stats")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(name) = s.get("name").and_then(Value::as_str) {
            let value = match s.get("value") {
                Some(Value::String(v)) => v.parse().unwrap_or(0),
                Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
                _ => 0,
            };
            counters.insert(name, value);
        }
    }
    let c = |n: &str| counters.get(n).copied().unwrap_or(0);
    UpstreamHost {
        address,
        cx_active: c("cx_active"),
        cx_connect_fail: c("cx_connect_fail"),
        cx_total: c("cx_total"),
        rq_active: c("rq_active"),
        rq_error: c("rq_error"),
        rq_total: c("rq_total"),
        health_flags: health_flags(h.get("health_status")),
    }
}

/// Envoy's health status as the text `/clusters` prints: `healthy`, or the failed
/// checks joined by `|`.
fn health_flags(status: Option<&Value>) -> String {
    let Some(Value::Object(m)) = status else {
        return "healthy".into();
    };
    let mut flags: Vec<String> = m
        .iter()
        .filter(|(_, v)| v.as_bool() == Some(true))
        .map(|(k, _)| k.clone())
        .collect();
    match m.get("eds_health_status").and_then(Value::as_str) {
        None | Some("HEALTHY") | Some("UNKNOWN") => {}
        Some(eds) => flags.push(format!("eds_{}", eds.to_lowercase())),
    }
    if flags.is_empty() {
        "healthy".into()
    } else {
        flags.join("|")
    }
}

/// Reads every route configuration of a config dump (static, dynamic, or inline in
/// listeners) and lists the clusters its routes name, weighted clusters included.
/// The second value says whether some route takes its cluster from a header.
pub fn routes_of_config_dump(dump: &Value) -> (Vec<RouteEntry>, bool) {
    let mut routes = Vec::new();
    let mut dynamic = false;
    let mut seen = BTreeSet::new();
    collect_route_configs(dump, &mut routes, &mut dynamic, &mut seen, 0);
    (routes, dynamic)
}

/// Depth beyond which a config dump is not walked: real dumps are far shallower.
const MAX_DEPTH: usize = 64;

fn collect_route_configs(
    v: &Value,
    routes: &mut Vec<RouteEntry>,
    dynamic: &mut bool,
    seen: &mut BTreeSet<String>,
    depth: usize,
) {
    if depth > MAX_DEPTH || routes.len() >= MAX_ROUTES {
        return;
    }
    match v {
        Value::Object(m) => {
            if let Some(Value::Array(vhosts)) = m.get("virtual_hosts") {
                let name = m.get("name").and_then(Value::as_str).unwrap_or("");
                // A route configuration inline in a listener also appears in the
                // routes dump; read each once.
                if name.is_empty() || seen.insert(name.to_owned()) {
                    read_route_config(name, vhosts, routes, dynamic);
                }
                return;
            }
            for child in m.values() {
                collect_route_configs(child, routes, dynamic, seen, depth + 1);
            }
        }
        Value::Array(a) => {
            for child in a {
                collect_route_configs(child, routes, dynamic, seen, depth + 1);
            }
        }
        _ => {}
    }
}

fn read_route_config(
    config: &str,
    vhosts: &[Value],
    routes: &mut Vec<RouteEntry>,
    dynamic: &mut bool,
) {
    for vh in vhosts {
        let vh_name = vh.get("name").and_then(Value::as_str).unwrap_or("");
        for r in vh
            .get("routes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(action) = r.get("route") else {
                continue;
            };
            let matcher = describe_match(r.get("match"));
            let mut push = |cluster: &str| {
                if routes.len() < MAX_ROUTES {
                    routes.push(RouteEntry {
                        route_config: config.to_owned(),
                        virtual_host: vh_name.to_owned(),
                        matcher: matcher.clone(),
                        cluster: cluster.to_owned(),
                    });
                }
            };
            if let Some(c) = action.get("cluster").and_then(Value::as_str) {
                push(c);
            }
            for wc in action
                .pointer("/weighted_clusters/clusters")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(c) = wc.get("name").and_then(Value::as_str) {
                    push(c);
                }
            }
            if action.get("cluster_header").is_some()
                || action.get("cluster_specifier_plugin").is_some()
                || action.get("inline_cluster_specifier_plugin").is_some()
            {
                *dynamic = true;
            }
        }
    }
}

fn describe_match(m: Option<&Value>) -> String {
    let Some(Value::Object(m)) = m else {
        return "any".into();
    };
    for key in [
        "prefix",
        "path",
        "safe_regex",
        "path_separated_prefix",
        "path_match_policy",
    ] {
        if let Some(v) = m.get(key) {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Object(o) => o
                    .get("regex")
                    .and_then(Value::as_str)
                    .map_or_else(|| v.to_string(), str::to_owned),
                other => other.to_string(),
            };
            return format!("{key} {}", truncate(&text, 256));
        }
    }
    "any".into()
}

/// Whether a stat is one the mTLS and secrets checks read.
pub fn is_ssl_stat(name: &str) -> bool {
    name.contains(".ssl.")
        || name.starts_with("ssl.")
        || name.ends_with("ssl_context_update_by_sds")
        || name.ends_with("_context_secrets_not_ready")
}

/// Parses `/stats?format=json` and keeps the ssl and secrets counters and gauges
/// (histograms are ignored).
pub fn parse_ssl_stats_json(json: &str) -> Result<BTreeMap<String, u64>, EvidenceError> {
    const WHAT: &str = "/stats?format=json";
    let doc: Value =
        serde_json::from_str(json).map_err(|source| EvidenceError::Json { what: WHAT, source })?;
    let Some(stats) = doc.get("stats").and_then(Value::as_array) else {
        return Err(EvidenceError::Shape {
            what: WHAT,
            detail: "no stats array".into(),
        });
    };
    Ok(stats
        .iter()
        .take(MAX_STATS)
        .filter_map(|s| {
            let name = s.get("name")?.as_str()?;
            let value = s.get("value")?.as_u64()?;
            is_ssl_stat(name).then(|| (name.to_owned(), value))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshcat_common::model::InstanceMetrics;

    #[test]
    fn metrics_are_reported_only_from_inbound_http_stats() {
        // What an agent sends before it ever computed the object.
        assert!(!reports_metrics(&InstanceMetrics::default()));
        let computed = InstanceMetrics {
            mesh_metrics_version: "1".into(),
            start_time: 1_700_000_000_000,
            ..InstanceMetrics::default()
        };
        // A live sidecar with a start time but no inbound HTTP connection manager.
        assert!(!reports_metrics(&computed));
        let serving = InstanceMetrics {
            all_routes: "ingress_http".into(),
            ..computed
        };
        assert!(reports_metrics(&serving));
    }
}
