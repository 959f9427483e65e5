//! The zones' control servers (contract section 17): for every zone one ADS stream
//! (`envoy.service.discovery.v3.AggregatedDiscoveryService`) to its `serverAddress`,
//! Delta xDS (`DeltaAggregatedResources`) where the server offers it and state of
//! the world (`StreamAggregatedResources`) where it answers Delta with
//! UNIMPLEMENTED; the zone's last good view of what the server declares
//! ([`ZoneView`]), and the stream's state ([`ControlStatus`], with the protocol it
//! speaks), with its config ([`ControlConfig`]) and defaults, its metrics, and a
//! feed of its changes ([`ControlChange`]). It is given the zones as values and
//! names no other component.
//!
//! - `decode`: the resources of a response read into the facts the view keeps;
//! - `view`: the view, and what a stream holds to build the next one (a whole type
//!   from a state-of-the-world response, the resources named from a delta one);
//! - `stream`: one zone's stream: connect, choose the protocol, subscribe, ACK /
//!   NACK, reconnect; the state-of-the-world session;
//! - `delta`: the Delta xDS session;
//! - `zone`: one zone's shared status and view, and the state it derives;
//! - `failure`: why a stream failed, in words;
//! - `metrics`: `meshcat_control_plane_*`.

mod decode;
mod delta;
mod failure;
mod metrics;
mod stream;
mod view;
mod zone;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use meshcat_common::model::ZoneRecord;
use serde::Serialize;
use tokio::runtime::Handle;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use utoipa::ToSchema;

pub use decode::Kind as ResourceType;
pub use metrics::ControlMetrics;
pub use stream::{BACKOFF_MAX, BACKOFF_MIN, CONNECT_TIMEOUT};
pub use view::{MAX_REMOVED, PREVIOUS_SETS, REMOVED_KEPT_MS, ViewCluster, ViewEndpoint, ZoneView};

use failure::Failure;
use view::Bounds;
use zone::Zone;

/// `--control-plane`: connect to the zones' control servers.
pub const DEFAULT_ENABLED: bool = true;
/// `--control-node-id`: the node id meshcat presents, `{zone}` and `{replica}`
/// replaced.
pub const DEFAULT_NODE_ID: &str = "meshcat~{zone}~{replica}";
/// `--max-control-message`: the largest xDS response read (64 MiB).
pub const DEFAULT_MAX_MESSAGE: usize = 64 << 20;
/// `--max-control-resources`: most clusters in one zone's view (listeners and route
/// configurations are held to it too).
pub const DEFAULT_MAX_CLUSTERS: usize = 100_000;
/// `--max-control-resources`: most endpoints in one zone's view.
pub const DEFAULT_MAX_ENDPOINTS: usize = 1_000_000;
/// Changes the feed holds for a slow subscriber before it lags.
pub const CHANGES_CAPACITY: usize = 1024;

/// How the aggregator connects to the zones' control servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlConfig {
    /// False: no zone ever connects; each is `disabled`.
    pub enabled: bool,
    /// The node id template: `{zone}` and `{replica}` are replaced.
    pub node_id: String,
    /// This replica's name, for `{replica}`.
    pub replica: String,
    /// The largest response read (gRPC decoding bound); a larger one ends the
    /// stream, counted, the zone `rejected`, the last good view kept.
    pub max_message: usize,
    /// Most clusters (and listeners, and route configurations) per zone.
    pub max_clusters: usize,
    /// Most endpoints per zone.
    pub max_endpoints: usize,
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig {
            enabled: DEFAULT_ENABLED,
            node_id: DEFAULT_NODE_ID.to_owned(),
            replica: String::new(),
            max_message: DEFAULT_MAX_MESSAGE,
            max_clusters: DEFAULT_MAX_CLUSTERS,
            max_endpoints: DEFAULT_MAX_ENDPOINTS,
        }
    }
}

impl ControlConfig {
    /// The node id for `zone`.
    pub fn node_id_for(&self, zone: &str) -> String {
        self.node_id
            .replace("{zone}", zone)
            .replace("{replica}", &self.replica)
    }
}

/// Where a zone's stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ControlState {
    /// The stream is up and its last responses were ACKed.
    Connected,
    /// The first attempt of the zone's configuration is under way.
    Connecting,
    /// The server cannot be reached or the stream broke; retrying.
    Unreachable,
    /// TLS failed: a zone file, or the certificates; retrying.
    TlsError,
    /// The last response of some type was refused (`error` says why).
    Rejected,
    /// `--control-plane=false`.
    Disabled,
}

impl ControlState {
    /// The state as the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            ControlState::Connected => "connected",
            ControlState::Connecting => "connecting",
            ControlState::Unreachable => "unreachable",
            ControlState::TlsError => "tls-error",
            ControlState::Rejected => "rejected",
            ControlState::Disabled => "disabled",
        }
    }
}

impl std::fmt::Display for ControlState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The last ACKed `version_info` per type ("" before any).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct Versions {
    pub clusters: String,
    pub endpoints: String,
    pub listeners: String,
    pub routes: String,
}

impl Versions {
    /// The version of `kind`.
    pub fn get(&self, kind: ResourceType) -> &str {
        match kind {
            ResourceType::Clusters => &self.clusters,
            ResourceType::Endpoints => &self.endpoints,
            ResourceType::Listeners => &self.listeners,
            ResourceType::Routes => &self.routes,
        }
    }

    fn slot(&mut self, kind: ResourceType) -> &mut String {
        match kind {
            ResourceType::Clusters => &mut self.clusters,
            ResourceType::Endpoints => &mut self.endpoints,
            ResourceType::Listeners => &mut self.listeners,
            ResourceType::Routes => &mut self.routes,
        }
    }
}

/// A zone's stream as `GET /zones/{z}/control` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlStatus {
    pub zone_name: String,
    pub server_address: String,
    pub state: ControlState,
    /// The xDS protocol of the stream: `delta` (Delta xDS) or `sotw` (state of the
    /// world, when the server answers Delta with UNIMPLEMENTED); "" while the
    /// stream is not up, or the zone is `disabled`.
    pub protocol: String,
    /// The last failure in words; "" when none.
    pub error: String,
    /// When the stream had its first response (ms since the epoch); `None` while
    /// it is not up.
    pub connected_since_ms: Option<i64>,
    /// When a response was last accepted.
    pub last_update_ms: Option<i64>,
    pub versions: Versions,
    /// What the view holds now.
    pub clusters: usize,
    pub endpoints: usize,
    pub listeners: usize,
    pub routes: usize,
}

impl ControlStatus {
    /// A zone in `state` whose view holds nothing yet.
    pub fn empty(zone: &str, server_address: &str, state: ControlState) -> ControlStatus {
        ControlStatus {
            zone_name: zone.to_owned(),
            server_address: server_address.to_owned(),
            state,
            protocol: String::new(),
            error: String::new(),
            connected_since_ms: None,
            last_update_ms: None,
            versions: Versions::default(),
            clusters: 0,
            endpoints: 0,
            listeners: 0,
            routes: 0,
        }
    }
}

/// What changed of a zone.
#[derive(Debug, Clone)]
pub enum ControlChange {
    /// Its state moved.
    State {
        zone: String,
        from: ControlState,
        to: ControlState,
        error: String,
    },
    /// It has a new view.
    View { zone: String },
}

/// The zones' streams and views; cheap to clone.
#[derive(Debug, Clone)]
pub struct Controls {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: ControlConfig,
    metrics: ControlMetrics,
    changes: broadcast::Sender<ControlChange>,
    zones: Mutex<HashMap<String, Entry>>,
    /// The runtime the streams run on (the one `new` was called on, else the one
    /// `set_zone` is called on).
    runtime: Option<Handle>,
}

/// One zone: its record, its shared state, its stream task.
#[derive(Debug)]
struct Entry {
    record: ZoneRecord,
    zone: Arc<Zone>,
    task: Option<JoinHandle<()>>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let zones = self.zones.get_mut().unwrap_or_else(|p| p.into_inner());
        for entry in zones.values() {
            entry.zone.retire();
        }
    }
}

impl Controls {
    /// The component, its metrics registered on `registry`.
    pub fn new(config: ControlConfig, registry: &prometheus::Registry) -> anyhow::Result<Controls> {
        let metrics = ControlMetrics::register(registry)?;
        let (changes, _) = broadcast::channel(CHANGES_CAPACITY);
        Ok(Controls {
            inner: Arc::new(Inner {
                config,
                metrics,
                changes,
                zones: Mutex::new(HashMap::new()),
                runtime: Handle::try_current().ok(),
            }),
        })
    }

    fn zones(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.inner.zones.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates or replaces a zone. A new zone connects; a replaced one reconnects
    /// only when its serverAddress, useTls, caPath, certPath, keyPath or
    /// requestCluster changed (keeping its last view until the new server's first
    /// accepted response).
    pub fn set_zone(&self, record: &ZoneRecord) {
        let mut zones = self.zones();
        let name = record.zone_name.as_str();
        let seed = match zones.get(name) {
            Some(e) if same_connection(&e.record, record) => return,
            Some(e) => e.zone.view(),
            None => None,
        };
        let from = zones.get(name).map(|e| e.zone.retire());
        let config = &self.inner.config;
        let zone = Arc::new(Zone::new(
            name,
            &record.server_address,
            !config.enabled,
            seed,
            self.inner.changes.clone(),
            self.inner.metrics.clone(),
        ));
        let to = zone.status().state;
        if let Some(from) = from.filter(|f| *f != to) {
            let _ = self.inner.changes.send(ControlChange::State {
                zone: name.to_owned(),
                from,
                to,
                error: String::new(),
            });
        }
        let task = if config.enabled {
            let target = stream::Target {
                record: record.clone(),
                node: stream::node(record, config.node_id_for(name)),
                max_message: config.max_message,
                bounds: Bounds {
                    max_clusters: config.max_clusters,
                    max_endpoints: config.max_endpoints,
                },
            };
            let run = stream::run(zone.clone(), target);
            match self
                .inner
                .runtime
                .clone()
                .or_else(|| Handle::try_current().ok())
            {
                Some(rt) => Some(rt.spawn(run)),
                None => {
                    zone.down(Failure::unreachable(
                        "no async runtime to run the stream on",
                    ));
                    None
                }
            }
        } else {
            None
        };
        zones.insert(
            name.to_owned(),
            Entry {
                record: record.clone(),
                zone,
                task,
            },
        );
    }

    /// Removes a zone: its stream is closed at once (the task aborted), its series
    /// taken off the metrics.
    pub fn remove_zone(&self, zone: &str) {
        let entry = self.zones().remove(zone);
        if let Some(entry) = entry {
            entry.zone.retire();
            self.inner.metrics.forget(zone);
            drop(entry);
        }
    }

    /// The zone's status; `None` for a zone never set (or removed).
    pub fn status(&self, zone: &str) -> Option<ControlStatus> {
        let z = self.zones().get(zone).map(|e| e.zone.clone());
        z.map(|z| z.status())
    }

    /// The status of a zone registered but not (yet) set: `connecting`, or
    /// `disabled` with `--control-plane=false`, nothing held.
    pub fn pending(&self, record: &ZoneRecord) -> ControlStatus {
        let state = if self.inner.config.enabled {
            ControlState::Connecting
        } else {
            ControlState::Disabled
        };
        ControlStatus::empty(&record.zone_name, &record.server_address, state)
    }

    /// The zone's last good view; `None` before its first accepted response.
    pub fn view(&self, zone: &str) -> Option<Arc<ZoneView>> {
        let z = self.zones().get(zone).map(|e| e.zone.clone());
        z.and_then(|z| z.view())
    }

    /// Every zone's status, by zone name.
    pub fn statuses(&self) -> Vec<ControlStatus> {
        let zones: Vec<Arc<Zone>> = self.zones().values().map(|e| e.zone.clone()).collect();
        let mut out: Vec<ControlStatus> = zones.iter().map(|z| z.status()).collect();
        out.sort_by(|a, b| a.zone_name.cmp(&b.zone_name));
        out
    }

    /// The feed of state moves and new views.
    pub fn subscribe(&self) -> broadcast::Receiver<ControlChange> {
        self.inner.changes.subscribe()
    }

    /// The component's config.
    pub fn config(&self) -> &ControlConfig {
        &self.inner.config
    }
}

/// Whether two records of a zone connect the same way.
fn same_connection(a: &ZoneRecord, b: &ZoneRecord) -> bool {
    a.server_address == b.server_address
        && a.use_tls == b.use_tls
        && a.ca_path == b.ca_path
        && a.cert_path == b.cert_path
        && a.key_path == b.key_path
        && a.request_cluster == b.request_cluster
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_id_template_names_zone_and_replica() {
        let config = ControlConfig {
            replica: "r1".into(),
            ..ControlConfig::default()
        };
        assert_eq!(config.node_id_for("z"), "meshcat~z~r1");
    }

    #[test]
    fn states_have_their_api_words() {
        for s in [
            ControlState::Connected,
            ControlState::Connecting,
            ControlState::Unreachable,
            ControlState::TlsError,
            ControlState::Rejected,
            ControlState::Disabled,
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
    }

    #[test]
    fn a_disabled_component_never_connects() {
        let registry = prometheus::Registry::new();
        let controls = Controls::new(
            ControlConfig {
                enabled: false,
                ..ControlConfig::default()
            },
            &registry,
        )
        .unwrap();
        controls.set_zone(&ZoneRecord::new("z", "127.0.0.1:1"));
        let status = controls.status("z").unwrap();
        assert_eq!(status.state, ControlState::Disabled);
        assert!(controls.view("z").is_none());
        controls.remove_zone("z");
        assert!(controls.status("z").is_none());
        assert!(controls.statuses().is_empty());
    }
}
