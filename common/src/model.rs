//! The catalog model: cluster records, instances, zones and the summaries built over
//! them, with serde names exactly as the seed spells them (camelCase, `ownerURL`,
//! `clusterID`, `meshID`).
//!
//! Records are what operators register; the `*View` types are what read answers show
//! (a record plus live data the aggregator derives from agent reports).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

/// Treats an explicit JSON `null` like an absent field, so clients that send
/// `"owner": null` get the field's default rather than a type error.
fn null_as_default<'de, D, T>(de: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(de)?.unwrap_or_default())
}

/// A link shown beside a cluster (runbooks, dashboards, repositories).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ExternalLink {
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub link: String,
}

/// A registered service cluster: what an operator writes with `POST /clusters`.
///
/// Identified by (`zone_name`, `cluster_name`). Only those two and `name` are required;
/// every other field defaults (strings to "", integers to 0, booleans to false, arrays
/// to []). Integers are `i64` on the wire so that out-of-range values reach
/// [`crate::validate`] and get a sentence naming the field instead of a serde error.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(
    feature = "openapi",
    schema(
        description = "A registered service cluster, identified by (zoneName, clusterName). Only those two and name are required; every other field defaults (strings to \"\", integers to 0, booleans to false, arrays to [])."
    )
)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRecord {
    pub cluster_name: String,
    pub zone_name: String,
    pub name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub version: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub owner: String,
    #[serde(rename = "ownerURL", default, deserialize_with = "null_as_default")]
    pub owner_url: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub capability: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub runtime: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub documentation: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub description: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub prometheus_job: String,
    #[cfg_attr(feature = "openapi", schema(minimum = 0))]
    #[serde(default, deserialize_with = "null_as_default")]
    pub min_instances: i64,
    /// 0 means no upper bound.
    #[cfg_attr(feature = "openapi", schema(minimum = 0))]
    #[serde(default, deserialize_with = "null_as_default")]
    pub max_instances: i64,
    #[serde(default, deserialize_with = "null_as_default")]
    pub enable_instance_metrics: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    pub enable_historical_metrics: bool,
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 65535))]
    #[serde(default, deserialize_with = "null_as_default")]
    pub metrics_port: i64,
    #[serde(default, deserialize_with = "null_as_default")]
    pub protocols: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub external_links: Vec<ExternalLink>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub metrics_template: String,
    #[serde(rename = "clusterID", default, deserialize_with = "null_as_default")]
    pub cluster_id: String,
    #[serde(rename = "meshID", default, deserialize_with = "null_as_default")]
    pub mesh_id: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub api_endpoint: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub api_spec_endpoint: String,
    /// Beyond the seed's field list, so that the `businessImpact` filter has
    /// something to match (for example `low`, `medium`, `high`).
    #[serde(default, deserialize_with = "null_as_default")]
    pub business_impact: String,
    /// The clusters this one calls, as its owners declare them: a clusterName of the
    /// same zone or `zoneName/clusterName`; shown in the graph beside the observed
    /// calls. A dependency on a cluster nobody registered (yet) is accepted.
    #[serde(default, deserialize_with = "null_as_default")]
    pub dependencies: Vec<String>,
}

impl ClusterRecord {
    /// A record with the required fields set and everything else at its default.
    pub fn new(zone_name: &str, cluster_name: &str, name: &str) -> Self {
        Self {
            cluster_name: cluster_name.to_owned(),
            zone_name: zone_name.to_owned(),
            name: name.to_owned(),
            version: String::new(),
            owner: String::new(),
            owner_url: String::new(),
            capability: String::new(),
            runtime: String::new(),
            documentation: String::new(),
            description: String::new(),
            prometheus_job: String::new(),
            min_instances: 0,
            max_instances: 0,
            enable_instance_metrics: false,
            enable_historical_metrics: false,
            metrics_port: 0,
            protocols: Vec::new(),
            external_links: Vec::new(),
            dependencies: Vec::new(),
            metrics_template: String::new(),
            cluster_id: String::new(),
            mesh_id: String::new(),
            api_endpoint: String::new(),
            api_spec_endpoint: String::new(),
            business_impact: String::new(),
        }
    }
}

/// A running instance of a cluster, as read answers list it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    pub name: String,
    /// Milliseconds since the Unix epoch.
    pub start_time: i64,
    /// Who says the instance runs: an agent's report, or the zone's control server
    /// for a cluster no agent reports (contract section 17).
    #[serde(default)]
    pub source: InstanceSource,
    /// Its workload identity (contract section 19); null for a control server's
    /// endpoint.
    #[serde(default)]
    pub identity: Option<crate::identity::InstanceIdentity>,
}

/// Where a listed instance comes from.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceSource {
    /// A sidecar whose agent reports it.
    #[default]
    Agent,
    /// An endpoint of the zone's control server (`name` is its `address:port`).
    ControlServer,
}

impl InstanceSource {
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceSource::Agent => "agent",
            InstanceSource::ControlServer => "control-server",
        }
    }
}

/// What the zone's control server declares of a cluster (contract section 17):
/// false and 0 when it declares no such cluster or the zone has no view yet.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlane {
    pub declared: bool,
    pub endpoints: u64,
    pub healthy_endpoints: u64,
}

/// Health of a cluster, derived from its live instances (see `docs/status.md`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Stable,
    Warning,
    Down,
}

impl Status {
    pub const ALL: [Status; 3] = [Status::Stable, Status::Warning, Status::Down];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Stable => "stable",
            Status::Warning => "warning",
            Status::Down => "down",
        }
    }

    /// Parses exactly `stable`, `warning` or `down` (lower case only).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "stable" => Some(Status::Stable),
            "warning" => Some(Status::Warning),
            "down" => Some(Status::Down),
            _ => None,
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A cluster as read answers show it: the record plus what the caller may see of
/// its live state.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterView {
    #[serde(flatten)]
    pub record: ClusterRecord,
    /// Whether the caller may see this cluster's live data (see `docs/api.md`).
    pub authorized: bool,
    /// Live instances sorted by name; empty when `authorized` is false.
    pub instances: Vec<Instance>,
    pub status: Status,
    /// What the zone's control server declares of this cluster.
    #[serde(default)]
    pub control_plane: ControlPlane,
    /// Its live instances' workload identity (contract section 19); null when
    /// `authorized` is false.
    #[serde(default)]
    pub identity: Option<crate::identity::ClusterIdentity>,
}

/// A zone (mesh), registered by the address of the control server that manages it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ZoneRecord {
    pub zone_name: String,
    /// The edge sidecar's cluster: the one requests enter the mesh through.
    #[serde(default, deserialize_with = "null_as_default")]
    pub request_cluster: String,
    pub server_address: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub use_tls: bool,
    #[serde(default, deserialize_with = "null_as_default")]
    pub ca_path: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub cert_path: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub key_path: String,
}

impl ZoneRecord {
    /// A record with the required fields set, without TLS and without a request
    /// cluster.
    pub fn new(zone_name: &str, server_address: &str) -> Self {
        Self {
            zone_name: zone_name.to_owned(),
            request_cluster: String::new(),
            server_address: server_address.to_owned(),
            use_tls: false,
            ca_path: String::new(),
            cert_path: String::new(),
            key_path: String::new(),
        }
    }
}

/// Seed 2.4: the answer of `GET /zones/{zoneName}/metadata`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ZoneMetadata {
    pub zone_name: String,
    pub owners: Vec<String>,
    pub capabilities: Vec<String>,
    pub service_count: u64,
    pub stable_service_count: u64,
    pub warning_service_count: u64,
    pub down_service_count: u64,
    pub instance_count: u64,
}

/// Seed 2.5: the per-zone summary inside `zones` and `meshes` of `GET /summary`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ZoneSummary {
    pub zone_name: String,
    pub owners: Vec<String>,
    pub capabilities: Vec<String>,
    pub cluster_count: u64,
    pub cluster_stable_count: u64,
    pub cluster_warning_count: u64,
    pub cluster_down_count: u64,
    pub instance_count: u64,
}

impl From<&ZoneSummary> for ZoneMetadata {
    fn from(s: &ZoneSummary) -> Self {
        ZoneMetadata {
            zone_name: s.zone_name.clone(),
            owners: s.owners.clone(),
            capabilities: s.capabilities.clone(),
            service_count: s.cluster_count,
            stable_service_count: s.cluster_stable_count,
            warning_service_count: s.cluster_warning_count,
            down_service_count: s.cluster_down_count,
            instance_count: s.instance_count,
        }
    }
}

/// Seed 2.5: the overall `metadata` of `GET /summary`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct OverallSummary {
    pub zone_count: u64,
    pub owners: Vec<String>,
    pub capabilities: Vec<String>,
    pub cluster_count: u64,
    pub cluster_stable_count: u64,
    pub cluster_warning_count: u64,
    pub cluster_down_count: u64,
    pub instance_count: u64,
}

/// One zone's entry in `zones` (and `meshes`) of `GET /summary`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ZoneEntry {
    /// Keyed by clusterName.
    pub clusters: BTreeMap<String, ClusterView>,
    pub metadata: ZoneSummary,
}

/// Seed 2.5: the answer of `GET /summary`. `meshes` is the seed's other name for
/// `zones` and holds the same objects.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Summary {
    pub zones: BTreeMap<String, ZoneEntry>,
    pub metadata: OverallSummary,
    pub meshes: BTreeMap<String, ZoneEntry>,
}

/// Seed 2.6: the instance metrics object, a flat JSON object whose keys carry
/// slashes and dots. `docs/metrics-object.md` maps every key to its Envoy source.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct InstanceMetrics {
    #[serde(rename = "mesh-metrics-version")]
    pub mesh_metrics_version: String,
    #[serde(rename = "Total/requests")]
    pub total_requests: i64,
    #[serde(rename = "HTTP/requests")]
    pub http_requests: i64,
    #[serde(rename = "HTTPS/requests")]
    pub https_requests: i64,
    #[serde(rename = "RPC/requests")]
    pub rpc_requests: i64,
    #[serde(rename = "RPC_TLS/requests")]
    pub rpc_tls_requests: i64,
    #[serde(rename = "all/requests")]
    pub all_requests: i64,
    #[serde(rename = "all/routes")]
    pub all_routes: String,
    #[serde(rename = "all/latency_ms.avg")]
    pub latency_avg: f64,
    #[serde(rename = "all/latency_ms.count")]
    pub latency_count: i64,
    #[serde(rename = "all/latency_ms.max")]
    pub latency_max: i64,
    #[serde(rename = "all/latency_ms.min")]
    pub latency_min: i64,
    #[serde(rename = "all/latency_ms.sum")]
    pub latency_sum: i64,
    #[serde(rename = "all/latency_ms.p50")]
    pub latency_p50: i64,
    #[serde(rename = "all/latency_ms.p90")]
    pub latency_p90: i64,
    #[serde(rename = "all/latency_ms.p95")]
    pub latency_p95: i64,
    #[serde(rename = "all/latency_ms.p99")]
    pub latency_p99: i64,
    #[serde(rename = "all/latency_ms.p9990")]
    pub latency_p9990: i64,
    #[serde(rename = "all/latency_ms.p9999")]
    pub latency_p9999: i64,
    #[serde(rename = "all/errors.count")]
    pub errors_count: i64,
    #[serde(rename = "all/in_throughput")]
    pub in_throughput: i64,
    #[serde(rename = "all/out_throughput")]
    pub out_throughput: i64,
    #[serde(rename = "go_metrics/runtime/num_goroutines")]
    pub num_goroutines: i64,
    /// Milliseconds since the epoch.
    #[serde(rename = "system/start_time")]
    pub start_time: i64,
    #[serde(rename = "system/cpu.pct")]
    pub cpu_pct: f64,
    #[serde(rename = "system/cpu_cores")]
    pub cpu_cores: i64,
    pub os: String,
    pub os_arch: String,
    #[serde(rename = "system/memory/available")]
    pub memory_available: i64,
    #[serde(rename = "system/memory/used")]
    pub memory_used: i64,
    #[serde(rename = "process/memory/used")]
    pub process_memory_used: i64,
    #[serde(rename = "system/memory/used_percent")]
    pub memory_used_percent: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_record_uses_the_seed_names() {
        let mut r = ClusterRecord::new("z1", "c1", "Cluster one");
        r.owner_url = "https://example.com".into();
        r.cluster_id = "id".into();
        r.mesh_id = "m".into();
        let v = serde_json::to_value(&r).unwrap();
        for key in [
            "clusterName",
            "zoneName",
            "ownerURL",
            "clusterID",
            "meshID",
            "prometheusJob",
            "minInstances",
            "maxInstances",
            "enableInstanceMetrics",
            "enableHistoricalMetrics",
            "metricsPort",
            "externalLinks",
            "metricsTemplate",
            "apiEndpoint",
            "apiSpecEndpoint",
            "businessImpact",
        ] {
            assert!(v.get(key).is_some(), "missing {key} in {v}");
        }
    }

    #[test]
    fn null_fields_take_their_defaults() {
        let r: ClusterRecord = serde_json::from_str(
            r#"{"clusterName":"c","zoneName":"z","name":"n","owner":null,"minInstances":null,"protocols":null}"#,
        )
        .unwrap();
        assert_eq!(r, ClusterRecord::new("z", "c", "n"));
    }

    #[test]
    fn view_flattens_the_record() {
        let view = ClusterView {
            record: ClusterRecord::new("z", "c", "n"),
            authorized: true,
            instances: vec![Instance {
                name: "i".into(),
                start_time: 5,
                source: InstanceSource::ControlServer,
                identity: None,
            }],
            status: Status::Warning,
            control_plane: ControlPlane {
                declared: true,
                endpoints: 2,
                healthy_endpoints: 1,
            },
            identity: None,
        };
        let v = serde_json::to_value(&view).unwrap();
        assert_eq!(v["clusterName"], "c");
        assert_eq!(v["status"], "warning");
        assert_eq!(v["instances"][0]["startTime"], 5);
        assert_eq!(v["instances"][0]["source"], "control-server");
        assert_eq!(v["controlPlane"]["healthyEndpoints"], 1);
        let back: ClusterView = serde_json::from_value(v).unwrap();
        assert_eq!(back, view);
    }

    #[test]
    fn metrics_object_has_every_seed_key() {
        let v = serde_json::to_value(InstanceMetrics::default()).unwrap();
        let keys = [
            "mesh-metrics-version",
            "Total/requests",
            "HTTP/requests",
            "HTTPS/requests",
            "RPC/requests",
            "RPC_TLS/requests",
            "all/requests",
            "all/routes",
            "all/latency_ms.avg",
            "all/latency_ms.count",
            "all/latency_ms.max",
            "all/latency_ms.min",
            "all/latency_ms.sum",
            "all/latency_ms.p50",
            "all/latency_ms.p90",
            "all/latency_ms.p95",
            "all/latency_ms.p99",
            "all/latency_ms.p9990",
            "all/latency_ms.p9999",
            "all/errors.count",
            "all/in_throughput",
            "all/out_throughput",
            "go_metrics/runtime/num_goroutines",
            "system/start_time",
            "system/cpu.pct",
            "system/cpu_cores",
            "os",
            "os_arch",
            "system/memory/available",
            "system/memory/used",
            "process/memory/used",
            "system/memory/used_percent",
        ];
        let obj = v.as_object().unwrap();
        assert_eq!(obj.len(), keys.len());
        for k in keys {
            assert!(obj.contains_key(k), "missing {k}");
        }
    }
}

/// One entry of the aggregator's history (contract section 15): what changed, when,
/// where. `clusterName` and `instance` are empty where they do not apply; `detail`
/// depends on the kind (`changed` fields, start times, statuses, ...).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    /// Grows with every entry.
    pub id: u64,
    /// When it happened, in milliseconds since the epoch.
    pub at_ms: i64,
    /// `cluster-registered`, `instance-joined`, `status-changed`, ...
    pub kind: String,
    pub zone_name: String,
    #[serde(default)]
    pub cluster_name: String,
    #[serde(default)]
    pub instance: String,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    #[serde(default)]
    pub detail: serde_json::Value,
}
