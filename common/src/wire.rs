//! The agent ↔ aggregator protocol: message types and their MessagePack codec.
//! No I/O lives here; [`crate::transport`] moves the frames over quinn streams.
//!
//! A frame is a 4-byte big-endian length followed by that many bytes of MessagePack
//! (rmp-serde, compact array form) holding an [`Envelope`]: `[version, message]`.
//! The version is checked before the message is decoded, so a peer speaking another
//! version gets a clear refusal rather than a decode error.

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::identity::IdentityReport;
use crate::model::InstanceMetrics;

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 2;
/// ALPN of the QUIC connection.
pub const ALPN: &[u8] = b"meshcat/1";
/// Default largest frame body (4 MiB).
pub const DEFAULT_MAX_MESSAGE: usize = 4 << 20;

/// Every frame carries the protocol version beside its message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope<M> {
    pub version: u16,
    pub message: M,
}

/// Messages an agent sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AgentMessage {
    /// First message on a connection.
    Hello(Hello),
    /// Snapshots of the agent's instances, one per configured sidecar.
    Report(Report),
    /// The answer to a [`ServerMessage::Command`].
    CommandReply(CommandReply),
    /// The agent stops: its instances can be dropped without waiting for the TTL.
    Goodbye,
}

/// Messages the aggregator sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ServerMessage {
    /// The hello was accepted.
    Welcome { server_version: String },
    /// The connection is refused or a message was rejected; `reason` is one sentence.
    Rejected { reason: String },
    /// Run a command against one of the agent's sidecars.
    Command(CommandRequest),
    /// The report on this stream was handed to the catalog: `instances` of its
    /// instances applied, each of the others refused alone with its reason.
    ReportAccepted {
        instances: u32,
        refused: Vec<RefusedInstance>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// Stable identity of the agent (for example its pod or host name).
    pub agent_id: String,
    pub agent_version: String,
    /// Shared agent token, for setups without agent certificates.
    pub token: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// When the agent built the report, ms since the epoch.
    pub sent_at_ms: i64,
    pub instances: Vec<InstanceReport>,
}

/// One sidecar's snapshot. Counters are cumulative since the sidecar started, as
/// Envoy's own; the aggregator derives per-window figures from consecutive reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceReport {
    pub zone_name: String,
    pub cluster_name: String,
    pub instance: String,
    /// The sidecar's admin address as the agent reaches it.
    pub admin_address: String,
    /// Whether the sidecar answered this scrape; when false, `error` says why and the
    /// other figures are those of the last good scrape (or defaults).
    pub reachable: bool,
    pub error: Option<String>,
    /// Sidecar start, ms since the epoch (from `/server_info` uptime).
    pub start_time_ms: i64,
    /// `/server_info` state (LIVE, DRAINING, PRE_INITIALIZING, INITIALIZING).
    pub server_state: String,
    pub envoy_version: String,
    /// Envoy's current level of its default logger, when read.
    pub log_level: Option<String>,
    /// Downstream requests served by the sidecar's HTTP connection managers.
    pub requests_total: u64,
    /// Of those, answered with a 5xx.
    pub errors_5xx_total: u64,
    pub metrics: InstanceMetrics,
    /// The upstream clusters the sidecar knows, with their host sets; in a
    /// [`Delta`], only those that are new or whose host set changed.
    pub clusters: Vec<ReportedCluster>,
    /// The traffic to each upstream cluster that carried any; in a [`Delta`], only
    /// those whose figures changed.
    pub upstreams: Vec<UpstreamTraffic>,
    /// The sidecar's listeners with the clusters their routes name, as of its last
    /// configuration change; in a [`Delta`] with `listeners_unchanged`, empty.
    pub listeners: Vec<ListenerRoutes>,
    /// The sidecar's own (local) cluster, when its target names it.
    pub local_cluster: Option<String>,
    /// The drift hash: 16 lowercase hex digits of the sidecar's configuration without
    /// what is per instance (docs/agent.md, "The drift hash"). `None` until the agent
    /// read a `/config_dump`.
    pub config_hash: Option<String>,
    /// The same per resource kind (`listeners`, `clusters`, `routes`, `secrets`):
    /// which kinds two drifted instances differ in. Empty with no `config_hash`.
    pub config_hashes: BTreeMap<String, String>,
    /// This instance's report number on this connection, from 1; 0 in a snapshot
    /// that was never sent.
    pub seq: u64,
    /// `None`: the report holds the sidecar's whole state. Otherwise it holds only
    /// what changed since the acknowledged report `base` (docs/wire.md, "Deltas").
    pub delta: Option<Delta>,
    /// The sidecar's xDS state (contract section 17); `None` when the agent did not
    /// read it. Whole in every report, deltas included. Added last, with a default, so
    /// that a report without it (an older agent's) still decodes, as `None`.
    #[serde(default)]
    pub xds: Option<XdsState>,
    /// The sidecar's certificates and the SANs its upstreams expect (contract section
    /// 19). In a whole report, `None` when the agent has not read them; in a
    /// [`Delta`], `None` when they are as in the base. Added last, with a default, as
    /// `xds`.
    #[serde(default)]
    pub identity: Option<IdentityReport>,
}

/// Most rejected subscriptions an [`XdsState`] lists.
pub const MAX_XDS_REJECTIONS: usize = 64;

/// A sidecar's view of its control plane: whether its xDS stream is up, and which of
/// its subscriptions stand rejected (docs/agent.md, "xDS state").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct XdsState {
    /// `control_plane.connected_state`: `None` when the sidecar has no xDS stream
    /// (static configuration only).
    pub connected: Option<bool>,
    /// The subscriptions whose last update was rejected with no successful update
    /// since (at most [`MAX_XDS_REJECTIONS`], the newest first).
    pub rejected: Vec<XdsRejection>,
}

/// One subscription of a sidecar whose last update it rejected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XdsRejection {
    /// "clusters", "listeners", "endpoints" or "routes" (CDS, LDS, an EDS cluster, an
    /// RDS route configuration).
    pub kind: String,
    /// The EDS cluster or RDS route configuration; "" for CDS and LDS.
    pub resource: String,
    /// Envoy's reason from the sidecar's log (the text after the rejected resource),
    /// "" when the log is not read or holds none.
    pub reason: String,
    /// When the agent first saw this rejection, ms since the epoch.
    pub since_ms: i64,
    /// The subscription's `update_rejected` counter as last read.
    pub rejected_total: u64,
    /// The subscription's `update_success` counter as last read.
    pub success_total: u64,
}

/// What a delta report leaves out or takes away, against the acknowledged report
/// of the same instance numbered `base`. Every other field of the report is whole.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delta {
    /// The `seq` of the acknowledged report this one changes.
    pub base: u64,
    /// Upstream clusters the sidecar no longer has.
    pub removed_clusters: Vec<String>,
    /// Upstreams whose traffic figures are no longer listed (their cluster is gone).
    pub removed_upstreams: Vec<String>,
    /// The listeners are those of the base report (`listeners` is empty).
    pub listeners_unchanged: bool,
}

/// An instance of a report that the aggregator did not apply, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedInstance {
    pub zone_name: String,
    pub cluster_name: String,
    pub instance: String,
    /// A reason code (`too_many_upstream_clusters`, `stale_base`, ...; docs/wire.md).
    pub reason: String,
}

/// The reason code of a delta whose base the aggregator does not hold: the agent
/// sends the instance's whole state next.
pub const STALE_BASE: &str = "stale_base";

/// One upstream cluster of a report: its host set as a digest and a count, and
/// the hosts' addresses when they are sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportedCluster {
    pub name: String,
    pub added_via_api: bool,
    /// [`hosts_digest`] of the hosts' addresses.
    pub hosts_digest: u64,
    /// Hosts in the cluster, and of them those Envoy counts healthy.
    pub host_count: u32,
    pub healthy_count: u32,
    /// The hosts' addresses (`ip:port`), sorted; empty when not sent (a full report
    /// over the message budget sends the addresses only of upstreams with traffic).
    pub hosts: Vec<String>,
}

impl ReportedCluster {
    /// A cluster of healthy hosts at `addresses`, with their digest.
    pub fn healthy(name: impl Into<String>, addresses: Vec<String>) -> Self {
        let mut hosts = addresses;
        hosts.sort();
        hosts.dedup();
        let n = u32::try_from(hosts.len()).unwrap_or(u32::MAX);
        ReportedCluster {
            name: name.into(),
            added_via_api: false,
            hosts_digest: hosts_digest(hosts.iter().map(String::as_str)),
            host_count: n,
            healthy_count: n,
            hosts,
        }
    }

    /// Whether the hosts' addresses are in this entry.
    pub fn has_addresses(&self) -> bool {
        self.hosts.len() as u64 == u64::from(self.host_count)
    }

    /// Whether `other` describes the same host set and health (traffic figures are
    /// reported apart, in [`UpstreamTraffic`]).
    pub fn same_set(&self, other: &ReportedCluster) -> bool {
        self.hosts_digest == other.hosts_digest
            && self.host_count == other.host_count
            && self.healthy_count == other.healthy_count
            && self.added_via_api == other.added_via_api
    }
}

/// The digest of a host set: the wrapping sum, over the distinct addresses, of
/// [`address_hash`]. Independent of order, so the agent and a control server's
/// view compute it alike without sorting; 0 for no hosts.
pub fn hosts_digest<'a>(addresses: impl IntoIterator<Item = &'a str>) -> u64 {
    addresses
        .into_iter()
        .fold(0u64, |sum, a| sum.wrapping_add(address_hash(a)))
}

/// A 64-bit hash of one address (`ip:port`) that every build computes alike:
/// FNV-1a over its bytes, then the splitmix64 finaliser (docs/wire.md).
pub fn address_hash(address: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in address.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// One upstream cluster's traffic as the sidecar counted it: counters since the
/// sidecar started (the aggregator takes differences between reports), latency over
/// Envoy's last stats interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpstreamTraffic {
    pub name: String,
    /// Attempts: `cluster.<name>.upstream_rq_total` plus the requests that failed
    /// waiting for a connection (`upstream_rq_pending_failure_eject`), which never
    /// reach `upstream_rq_total` (a failed TLS handshake among them).
    pub requests_total: u64,
    /// Failed attempts, each once: the larger of `upstream_rq_5xx` and the 5xx
    /// answers of hosts plus the connect failures (docs/wire.md, "Upstream traffic").
    pub errors_total: u64,
    /// `cluster.<name>.upstream_cx_connect_fail`.
    pub connect_fail_total: u64,
    /// `cluster.<name>.upstream_rq_time` over the last interval, ms; `None` when no
    /// request completed in it.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Whether the connections use TLS (a TLS transport socket, or TLS handshakes).
    pub tls: bool,
}

/// One listener of a sidecar: the address it listens at (a wildcard address given
/// as the sidecar's own host) and the clusters its routes (or TCP proxies) name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerRoutes {
    pub address: String,
    pub clusters: Vec<String>,
}

impl InstanceReport {
    /// A sidecar nothing was read from: its names, unreachable, every figure empty.
    pub fn unread(zone_name: String, cluster_name: String, instance: String) -> Self {
        InstanceReport {
            zone_name,
            cluster_name,
            instance,
            admin_address: String::new(),
            reachable: false,
            error: None,
            start_time_ms: 0,
            server_state: String::new(),
            envoy_version: String::new(),
            log_level: None,
            requests_total: 0,
            errors_5xx_total: 0,
            metrics: InstanceMetrics::default(),
            clusters: Vec::new(),
            upstreams: Vec::new(),
            listeners: Vec::new(),
            local_cluster: None,
            config_hash: None,
            config_hashes: BTreeMap::new(),
            seq: 0,
            delta: None,
            xds: None,
            identity: None,
        }
    }
}

/// A cluster in the sidecar's `/clusters` output, with its hosts' counters: the
/// diagnosis's evidence (reports carry [`ReportedCluster`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamCluster {
    pub name: String,
    pub added_via_api: bool,
    pub hosts: Vec<UpstreamHost>,
}

/// A host of an upstream cluster with its counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamHost {
    pub address: String,
    pub cx_active: u64,
    pub cx_connect_fail: u64,
    pub cx_total: u64,
    pub rq_active: u64,
    pub rq_error: u64,
    pub rq_total: u64,
    /// Envoy's health flags (`healthy` when none are set).
    pub health_flags: String,
}

impl UpstreamHost {
    /// A healthy host at `address` whose counters are all 0, as Envoy lists a host
    /// that has carried nothing yet.
    pub fn idle(address: impl Into<String>) -> Self {
        UpstreamHost {
            address: address.into(),
            cx_active: 0,
            cx_connect_fail: 0,
            cx_total: 0,
            rq_active: 0,
            rq_error: 0,
            rq_total: 0,
            health_flags: "healthy".into(),
        }
    }
}

/// A command for one sidecar, named by its (zone, cluster, instance): one agent may
/// watch sidecars of one instance name in several zones (pods of one name in several
/// namespaces), and runs the command on the one whose three names all match.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandRequest {
    /// Correlates the reply; unique per connection.
    pub id: u64,
    /// The instance whose sidecar runs the command.
    pub instance: String,
    pub command: Command,
    /// The instance's zone. Added after `command`, so that the frame of an older
    /// aggregator (without it) still decodes: empty there, meaning any zone.
    #[serde(default)]
    pub zone_name: String,
    /// The instance's cluster; empty (any cluster) from an older aggregator.
    #[serde(default)]
    pub cluster_name: String,
}

/// What the aggregator can ask an agent to do against one sidecar.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Fetch the sidecar's `/config_dump`.
    ConfigDump,
    /// Read the sidecar's log level.
    GetLogLevel,
    /// Set the sidecar's log level (Envoy's names: `warning`, not `warn`).
    SetLogLevel { level: String },
    /// Run a timed debug window on the sidecar (set `debug`, keep it `seconds`,
    /// restore the previous level) and answer its TLS lines.
    DebugWindow { seconds: u32 },
    /// Collect what the diagnosis reads from the sidecar: `/clusters`, the routes of
    /// `/config_dump`, the ssl and secrets stats and log lines (the newest `max_lines`
    /// access lines, those naming `path` when given, and the newest `max_lines` of
    /// Envoy's own lines), after a debug window of `debug_seconds` when asked.
    Evidence {
        path: Option<String>,
        max_lines: u32,
        debug_seconds: Option<u32>,
        /// Added after `debug_seconds` and left out of the frame when `None`: an
        /// older agent decodes the frame of a command without it. With it, the
        /// agent picks the lines it names (a request's) from every line it holds and
        /// answers what its lines cover ([`EvidenceOutput::log_window`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lines: Option<LineQuery>,
    },
}

/// Which log lines an evidence command asks for beyond the newest ones. Its presence
/// also tells the agent that the asker reads [`EvidenceOutput::log_window`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineQuery {
    /// The lines naming this request id (the `x-request-id` of the edge's access
    /// line), taken from every line the agent holds however many came after them.
    pub request_id: Option<String>,
    /// Only the log lines: no admin documents and no debug window (a second look at
    /// a sidecar whose evidence was read already).
    pub log_only: bool,
}

/// What the access lines of an evidence answer cover: every access line the command
/// selects (those of its request id, else of its path, else all) that the agent read
/// at or after `from_ms` is in the answer. Before it, lines may be missing, for the
/// reason `start` gives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogWindow {
    /// Ms since the epoch.
    pub from_ms: i64,
    /// Why the lines begin there.
    pub start: WindowStart,
    /// The most lines the agent holds of this sidecar's log (`--log-max-lines`).
    pub held_max_lines: u64,
    /// When the agent had read the whole file, ms since the epoch: the window's end.
    pub to_ms: i64,
}

/// Why the lines of an answer begin where they do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WindowStart {
    /// The agent began reading the file there (its first line then, at the file's
    /// start or within its last MiB when the agent started): nothing read was lost.
    Began,
    /// The agent holds no older line: its bound on lines or bytes (`--log-max-lines`,
    /// `--log-max-bytes`) dropped the older ones.
    Held,
    /// The answer's own bound on lines or bytes left older selected lines out.
    Answer,
}

impl Command {
    /// Low-cardinality name for logs and metrics labels.
    pub fn name(&self) -> &'static str {
        match self {
            Command::ConfigDump => "config_dump",
            Command::GetLogLevel => "get_log_level",
            Command::SetLogLevel { .. } => "set_log_level",
            Command::DebugWindow { .. } => "debug_window",
            Command::Evidence { .. } => "evidence",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandReply {
    pub id: u64,
    pub outcome: Result<CommandOutput, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CommandOutput {
    /// JSON text of `/config_dump`.
    ConfigDump(String),
    LogLevel(String),
    DebugWindow(DebugWindowOutput),
    Evidence(EvidenceOutput),
}

/// What a debug window saw, as the aggregator hands it on.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DebugWindowOutput {
    /// The level before the window (Envoy's name), restored afterwards.
    pub previous_level: String,
    pub started_at_ms: i64,
    pub ended_at_ms: i64,
    /// Whether the previous level was set back.
    pub restored: bool,
    /// Whether the agent's shutdown ended the window early.
    pub cut_short: bool,
    /// Whether a log file is tailed for this sidecar (else no lines can be seen).
    pub log_tailed: bool,
    /// Lines read during the window.
    pub line_count: u64,
    /// The window's lines naming TLS failures (at most 100).
    pub tls_lines: Vec<String>,
    /// How many lines named TLS failures, including those not returned.
    pub tls_line_count: u64,
}

/// The evidence of one sidecar for the diagnosis. `None` means not collected; the
/// reason is in `errors`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct EvidenceOutput {
    /// `/clusters?format=json` as Envoy wrote it.
    pub clusters_json: Option<String>,
    /// `/config_dump` cut to its listeners, routes and clusters.
    pub config_dump_json: Option<String>,
    /// `/stats?format=json&filter=ssl|secrets`.
    pub stats_json: Option<String>,
    /// The newest lines of the sidecar's log; `None` without a log file.
    pub log_lines: Option<Vec<String>>,
    /// Every line read during the debug window, when one ran.
    pub debug_lines: Option<Vec<String>>,
    /// The debug window's summary, when one ran.
    pub debug_window: Option<DebugWindowOutput>,
    /// Why some evidence is missing, one sentence each.
    pub errors: Vec<String>,
    /// What the access lines cover. Answered only to a command with a
    /// [`LineQuery`], and left out of the frame when `None`, so that an aggregator
    /// that does not know it still decodes the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_window: Option<LogWindow>,
}

/// Why a frame was refused.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("message of {size} bytes is over the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
    #[error("protocol version {0} is not supported (this build speaks {PROTOCOL_VERSION})")]
    Version(u16),
    #[error("message cannot be decoded: {0}")]
    Decode(String),
    #[error("message cannot be encoded: {0}")]
    Encode(String),
}

impl WireError {
    /// Low-cardinality label for metrics of rejected messages.
    pub fn reason(&self) -> &'static str {
        match self {
            WireError::TooLarge { .. } => "too_large",
            WireError::Version(_) => "version",
            WireError::Decode(_) => "decode",
            WireError::Encode(_) => "encode",
        }
    }
}

/// The size of `value` encoded as inside a message, without encoding it into
/// memory; `usize::MAX` when it does not encode.
pub fn encoded_len<M: Serialize>(value: &M) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Counter(0);
    rmp_serde::encode::write(&mut c, value).map_or(usize::MAX, |()| c.0)
}

/// Encodes a message as a whole frame: length prefix and envelope.
pub fn encode<M: Serialize>(message: &M, limit: usize) -> Result<Vec<u8>, WireError> {
    let env = Envelope {
        version: PROTOCOL_VERSION,
        message,
    };
    let body = rmp_serde::to_vec(&env).map_err(|e| WireError::Encode(e.to_string()))?;
    if body.len() > limit {
        return Err(WireError::TooLarge {
            size: body.len(),
            limit,
        });
    }
    let len = u32::try_from(body.len()).map_err(|_| WireError::TooLarge {
        size: body.len(),
        limit,
    })?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Reads a frame's length prefix and checks it against the limit before anything
/// of that size is read.
pub fn frame_len(prefix: [u8; 4], limit: usize) -> Result<usize, WireError> {
    let size = u32::from_be_bytes(prefix) as usize;
    if size > limit {
        return Err(WireError::TooLarge { size, limit });
    }
    Ok(size)
}

/// Decodes a frame body (without its length prefix) in one pass: the version first,
/// then the message only when the version is this build's.
pub fn decode<M: DeserializeOwned>(body: &[u8]) -> Result<M, WireError> {
    match rmp_serde::from_slice::<Versioned<M>>(body) {
        Ok(Versioned::Current(m)) => Ok(m),
        Ok(Versioned::Other(v)) => Err(WireError::Version(v)),
        Err(e) => Err(WireError::Decode(e.to_string())),
    }
}

/// An envelope whose message is decoded only when its version is ours.
enum Versioned<M> {
    Current(M),
    Other(u16),
}

impl<'de, M: Deserialize<'de>> Deserialize<'de> for Versioned<M> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<M>(std::marker::PhantomData<M>);
        impl<'de, M: Deserialize<'de>> serde::de::Visitor<'de> for Visit<M> {
            type Value = Versioned<M>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a [version, message] envelope")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                use serde::de::Error;
                let version: u16 = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(0, &self))?;
                if version != PROTOCOL_VERSION {
                    while seq.next_element::<IgnoredAny>()?.is_some() {}
                    return Ok(Versioned::Other(version));
                }
                let message = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(1, &self))?;
                Ok(Versioned::Current(message))
            }
        }
        d.deserialize_tuple(2, Visit(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Agents of protocol version 1 sent every report whole, in another shape:
    /// their frames are refused by their version before anything is decoded.
    #[test]
    fn a_version_1_frame_is_refused_by_its_version() {
        let body = rmp_serde::to_vec(&Envelope {
            version: 1u16,
            message: AgentMessage::Goodbye,
        })
        .unwrap();
        let e = decode::<AgentMessage>(&body).unwrap_err();
        assert!(matches!(e, WireError::Version(1)), "{e}");
        assert_eq!(
            e.to_string(),
            "protocol version 1 is not supported (this build speaks 2)"
        );
    }

    #[test]
    fn a_delta_report_with_its_hashes_round_trips() {
        let mut report = InstanceReport::unread("z".into(), "c".into(), "i".into());
        report.seq = 9;
        report.config_hash = Some("0123456789abcdef".into());
        report.config_hashes = [("routes", "fedcba9876543210")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        report.clusters = vec![ReportedCluster::healthy(
            "orders",
            vec!["10.0.0.2:80".into(), "10.0.0.1:80".into()],
        )];
        report.delta = Some(Delta {
            base: 8,
            removed_clusters: vec!["gone".into()],
            removed_upstreams: vec!["gone".into()],
            listeners_unchanged: true,
        });
        let frame = encode(
            &AgentMessage::Report(Report {
                sent_at_ms: 1,
                instances: vec![report.clone()],
            }),
            DEFAULT_MAX_MESSAGE,
        )
        .unwrap();
        let AgentMessage::Report(back) = decode(&frame[4..]).unwrap() else {
            panic!("a report");
        };
        assert_eq!(back.instances, vec![report]);
        let ServerMessage::ReportAccepted { instances, refused } = decode(
            &encode(
                &ServerMessage::ReportAccepted {
                    instances: 1,
                    refused: vec![RefusedInstance {
                        zone_name: "z".into(),
                        cluster_name: "c".into(),
                        instance: "j".into(),
                        reason: STALE_BASE.into(),
                    }],
                },
                DEFAULT_MAX_MESSAGE,
            )
            .unwrap()[4..],
        )
        .unwrap() else {
            panic!("an acknowledgement");
        };
        assert_eq!((instances, refused[0].reason.as_str()), (1, STALE_BASE));
    }

    /// `xds` and then `identity` came last, with defaults: a report of an agent
    /// without them (elements fewer in the compact array) decodes with `None`; one
    /// with them round-trips.
    #[test]
    fn a_report_without_xds_or_identity_still_decodes() {
        let mut report = InstanceReport::unread("z".into(), "c".into(), "i".into());
        report.seq = 3;
        let new = rmp_serde::to_vec(&report).unwrap();
        // array 16 of 23 fields, the last two nil.
        assert_eq!(&new[..3], &[0xdc, 0x00, 23]);
        assert_eq!(&new[new.len() - 2..], &[0xc0, 0xc0]);
        for fields in [21, 22] {
            let mut old = new.clone();
            old[2] = fields;
            old.truncate(new.len() - (23 - usize::from(fields)));
            let back: InstanceReport = rmp_serde::from_slice(&old).unwrap();
            assert_eq!(back, report, "{fields} fields");
        }
        report.identity = Some(IdentityReport::new(
            vec![crate::identity::ReportedCertificate {
                serial: "44bb3d710dac5769b9b1470a0fa782bf81d8bfe0".into(),
                role: crate::identity::CertRole::Chain,
                sans: vec![crate::identity::San::new(
                    crate::identity::SanKind::Uri,
                    "spiffe://shop.local/ns/shop/sa/svc-a",
                )],
                valid_from_ms: 1_795_850_000_000,
                expires_at_ms: 1_796_110_222_000,
                secret: Some(crate::identity::SdsSecret {
                    name: "svc-a".into(),
                    version: "3".into(),
                    last_updated_ms: 1_795_850_000_500,
                }),
            }],
            vec![crate::identity::SanExpectation {
                cluster: "payments".into(),
                matchers: vec![crate::identity::SanMatcher::exact(
                    crate::identity::SanKind::Uri,
                    "spiffe://shop.local/ns/shop/sa/payments",
                )],
            }],
            None,
        ));

        report.xds = Some(XdsState {
            connected: Some(false),
            rejected: vec![XdsRejection {
                kind: "clusters".into(),
                resource: String::new(),
                reason: "payments: Proto constraint validation failed (ClusterValidationError.ConnectTimeout: value must be greater than 0s)".into(),
                since_ms: 1_795_801_037_377,
                rejected_total: 2,
                success_total: 2,
            }],
        });
        let frame = encode(
            &AgentMessage::Report(Report {
                sent_at_ms: 1,
                instances: vec![report.clone()],
            }),
            DEFAULT_MAX_MESSAGE,
        )
        .unwrap();
        let AgentMessage::Report(back) = decode(&frame[4..]).unwrap() else {
            panic!("a report");
        };
        assert_eq!(back.instances, vec![report]);
    }

    /// The digest is what docs/wire.md says, so that anyone holding a host set (a
    /// control server's view) computes the same: independent of order, 0 for none.
    #[test]
    fn the_host_set_digest_is_the_documented_one() {
        assert_eq!(hosts_digest([]), 0);
        let a = hosts_digest(["10.0.0.1:80", "10.0.0.2:80", "[fd00::1]:80"]);
        let b = hosts_digest(["[fd00::1]:80", "10.0.0.2:80", "10.0.0.1:80"]);
        assert_eq!(a, b);
        assert_ne!(a, hosts_digest(["10.0.0.1:80", "10.0.0.2:80"]));
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c; then the splitmix64 finaliser.
        let mut h: u64 = 0xaf63_dc4c_8601_ec8c;
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 31;
        assert_eq!(address_hash("a"), h);
        assert_eq!(
            hosts_digest(["a", "b"]),
            address_hash("a").wrapping_add(address_hash("b"))
        );
    }

    #[test]
    fn round_trip() {
        let msg = AgentMessage::Hello(Hello {
            agent_id: "a".into(),
            agent_version: "0.1.0".into(),
            token: None,
        });
        let frame = encode(&msg, DEFAULT_MAX_MESSAGE).unwrap();
        let len = frame_len(frame[..4].try_into().unwrap(), DEFAULT_MAX_MESSAGE).unwrap();
        assert_eq!(len, frame.len() - 4);
        let back: AgentMessage = decode(&frame[4..]).unwrap();
        assert_eq!(back, msg);
    }

    /// A command as peers before zone and cluster were added wrote and read it.
    #[derive(Debug, Serialize, Deserialize)]
    enum OldServerMessage {
        #[allow(dead_code)]
        Welcome {
            server_version: String,
        },
        #[allow(dead_code)]
        Rejected {
            reason: String,
        },
        Command(OldCommandRequest),
    }

    #[derive(Debug, Serialize, Deserialize)]
    struct OldCommandRequest {
        id: u64,
        instance: String,
        command: Command,
    }

    #[test]
    fn a_command_names_zone_cluster_and_instance_and_old_frames_still_decode() {
        let msg = ServerMessage::Command(CommandRequest {
            id: 7,
            instance: "orders-1".into(),
            command: Command::SetLogLevel {
                level: "debug".into(),
            },
            zone_name: "team-a".into(),
            cluster_name: "orders".into(),
        });
        let frame = encode(&msg, DEFAULT_MAX_MESSAGE).unwrap();
        assert_eq!(decode::<ServerMessage>(&frame[4..]).unwrap(), msg);

        // An older aggregator's frame: `[id, instance, command]`. It decodes with an
        // empty zone and cluster (the agent then matches on the instance alone).
        let old = OldServerMessage::Command(OldCommandRequest {
            id: 7,
            instance: "orders-1".into(),
            command: Command::GetLogLevel,
        });
        let frame = encode(&old, DEFAULT_MAX_MESSAGE).unwrap();
        assert_eq!(
            decode::<ServerMessage>(&frame[4..]).unwrap(),
            ServerMessage::Command(CommandRequest {
                id: 7,
                instance: "orders-1".into(),
                command: Command::GetLogLevel,
                zone_name: String::new(),
                cluster_name: String::new(),
            })
        );
        // The compact form: the new fields come last, after the three old ones.
        let body = rmp_serde::to_vec(&CommandRequest {
            id: 1,
            instance: "i".into(),
            command: Command::GetLogLevel,
            zone_name: "z".into(),
            cluster_name: "c".into(),
        })
        .unwrap();
        assert_eq!(body[0], 0x95, "an array of five fields");
        // An older agent refuses the longer array (rmp-serde checks the length): it
        // skips the command as one it does not understand, so aggregators are upgraded
        // after their agents.
        let frame = encode(&msg, DEFAULT_MAX_MESSAGE).unwrap();
        assert!(matches!(
            decode::<OldServerMessage>(&frame[4..]),
            Err(WireError::Decode(_))
        ));
    }

    /// `Command` and `EvidenceOutput` as they were before the line query and the
    /// log window: the variants in the same order, the older fields only.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum OldCommand {
        ConfigDump,
        GetLogLevel,
        SetLogLevel {
            level: String,
        },
        DebugWindow {
            seconds: u32,
        },
        Evidence {
            path: Option<String>,
            max_lines: u32,
            debug_seconds: Option<u32>,
        },
    }

    #[derive(Debug, PartialEq, Default, Serialize, Deserialize)]
    struct OldEvidenceOutput {
        clusters_json: Option<String>,
        config_dump_json: Option<String>,
        stats_json: Option<String>,
        log_lines: Option<Vec<String>>,
        debug_lines: Option<Vec<String>>,
        debug_window: Option<DebugWindowOutput>,
        errors: Vec<String>,
    }

    /// Without a line query the evidence command and its answer are the frames they
    /// were, both ways; with one, an older agent refuses the command (it skips it as
    /// one it does not understand), and an older aggregator never sees a log window
    /// since it never asks with a query.
    #[test]
    fn the_evidence_command_and_answer_keep_their_older_frames() {
        let plain = Command::Evidence {
            path: Some("/x".into()),
            max_lines: 2_000,
            debug_seconds: Some(3),
            lines: None,
        };
        let old = OldCommand::Evidence {
            path: Some("/x".into()),
            max_lines: 2_000,
            debug_seconds: Some(3),
        };
        assert_eq!(
            rmp_serde::to_vec(&plain).unwrap(),
            rmp_serde::to_vec(&old).unwrap()
        );
        let decoded: Command = rmp_serde::from_slice(&rmp_serde::to_vec(&old).unwrap()).unwrap();
        assert_eq!(decoded, plain);
        let asked = Command::Evidence {
            path: None,
            max_lines: 2_000,
            debug_seconds: None,
            lines: Some(LineQuery {
                request_id: Some("2bc35450".into()),
                log_only: true,
            }),
        };
        let body = rmp_serde::to_vec(&asked).unwrap();
        assert_eq!(rmp_serde::from_slice::<Command>(&body).unwrap(), asked);
        assert!(rmp_serde::from_slice::<OldCommand>(&body).is_err());

        let answer = EvidenceOutput {
            log_lines: Some(vec!["a line".into()]),
            errors: vec!["stats: timed out".into()],
            ..EvidenceOutput::default()
        };
        let old_answer = OldEvidenceOutput {
            log_lines: Some(vec!["a line".into()]),
            errors: vec!["stats: timed out".into()],
            ..OldEvidenceOutput::default()
        };
        assert_eq!(
            rmp_serde::to_vec(&answer).unwrap(),
            rmp_serde::to_vec(&old_answer).unwrap()
        );
        let windowed = EvidenceOutput {
            log_window: Some(LogWindow {
                from_ms: 1_700_000_000_000,
                start: WindowStart::Held,
                held_max_lines: 20_000,
                to_ms: 1_700_000_001_000,
            }),
            ..answer
        };
        let body = rmp_serde::to_vec(&windowed).unwrap();
        assert_eq!(
            rmp_serde::from_slice::<EvidenceOutput>(&body).unwrap(),
            windowed
        );
        // Read by an older agent's peer or aggregator: the frame of an older agent
        // decodes with no window.
        let old_body = rmp_serde::to_vec(&old_answer).unwrap();
        assert_eq!(
            rmp_serde::from_slice::<EvidenceOutput>(&old_body)
                .unwrap()
                .log_window,
            None
        );
    }

    #[test]
    fn refuses_other_versions_and_garbage() {
        let body = rmp_serde::to_vec(&Envelope {
            version: 99,
            message: AgentMessage::Goodbye,
        })
        .unwrap();
        assert!(matches!(
            decode::<AgentMessage>(&body),
            Err(WireError::Version(99))
        ));
        assert!(matches!(
            decode::<AgentMessage>(b"\xff\x00garbage"),
            Err(WireError::Decode(_))
        ));
    }

    #[test]
    fn refuses_large_frames_before_reading_them() {
        assert!(matches!(
            frame_len((10u32 << 20).to_be_bytes(), DEFAULT_MAX_MESSAGE),
            Err(WireError::TooLarge { .. })
        ));
        let big = AgentMessage::Report(Report {
            sent_at_ms: 0,
            instances: Vec::new(),
        });
        assert!(matches!(encode(&big, 2), Err(WireError::TooLarge { .. })));
    }
}
