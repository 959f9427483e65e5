//! The aggregator's QUIC ingest server: accepts agent connections, authenticates them
//! (agent certificate or token), takes their reports off per-report streams into a
//! [`ReportSink`], and carries commands to agents on their control streams. Its
//! settings ([`IngestSettings`]: address, credentials, [`IngestLimits`]) and their
//! defaults are here. The wire protocol is described in `docs/wire.md`, the
//! security model in `docs/security.md`.

mod agents;
mod auth;
mod bounds;
mod budget;
mod connection;
mod metrics;
mod recording;
mod warnlimit;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use meshcat_common::config::TlsFiles;
use meshcat_common::transport::code;
use meshcat_common::wire::{DEFAULT_MAX_MESSAGE, InstanceReport};
use prometheus::Registry;
use tracing::{info, warn};

pub use agents::{Agents, CommandError, MAX_PENDING_COMMANDS};
pub use auth::{AgentAuth, AuthError, SecurityOptions, ZoneGrant, cert_grant};
pub use bounds::{Bounded, InstanceBounds, InstanceSize, OverBound};
pub use budget::{
    DEFAULT_MAX_CREDENTIAL_CONNECTIONS, DEFAULT_MAX_CREDENTIAL_STREAMS,
    DEFAULT_MAX_NEW_INSTANCES_PER_MINUTE,
};
pub use metrics::{IngestMetrics, RECENT_REJECTIONS};
pub use recording::{RecordingSink, agent_of};

/// Most instances one report may carry.
pub const DEFAULT_MAX_INSTANCES: usize = 1000;
/// Most upstream clusters one instance may report, by default.
pub use meshcat_common::limits::MAX_UPSTREAM_CLUSTERS as DEFAULT_MAX_UPSTREAM_CLUSTERS;
/// Most upstream hosts one instance may report, over all its clusters.
/// How long an instance counts against its credential after its last report when
/// no TTL is given: the catalog's default `--instance-ttl` (the configuration
/// checks that the two agree).
pub const DEFAULT_INSTANCE_TTL: Duration = Duration::from_secs(15);
pub const DEFAULT_MAX_UPSTREAM_HOSTS: usize = meshcat_common::limits::MAX_UPSTREAM_HOSTS;
/// Most distinct instances the live connections of one credential may report, so
/// one zone's credential cannot use up the live instances' global bound.
pub const DEFAULT_MAX_CREDENTIAL_INSTANCES: usize = 10_000;
/// Most agent connections served at once; more are refused at the handshake.
pub const DEFAULT_MAX_CONNECTIONS: usize = 20_000;
/// Most connections not yet authenticated (handshake and hello in progress); more are
/// refused before any TLS work.
pub const DEFAULT_MAX_PENDING_CONNECTIONS: usize = 1024;
/// Largest frame read before authentication: the hello.
pub const MAX_HELLO: usize = 4 << 10;
/// Time an agent has from its first packet to the end of its hello (handshake
/// included).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// One reported instance, as a report names it: the key of everything kept per
/// instance, and what the sink answers for an instance it did not apply.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceKey {
    pub zone: String,
    pub cluster: String,
    pub instance: String,
}

impl InstanceKey {
    pub fn new(zone: &str, cluster: &str, instance: &str) -> InstanceKey {
        InstanceKey {
            zone: zone.to_owned(),
            cluster: cluster.to_owned(),
            instance: instance.to_owned(),
        }
    }

    /// The key of the instance `report` is about.
    pub fn of(report: &InstanceReport) -> InstanceKey {
        InstanceKey::new(&report.zone_name, &report.cluster_name, &report.instance)
    }
}

/// An instance of a report that was not applied, and why (a reason code of
/// docs/wire.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRefusal {
    pub key: InstanceKey,
    pub reason: &'static str,
    /// Whether the instance stays this session's: the catalog keeps what it held of
    /// it (until the TTL), or the agent sends it whole next ([`STALE_BASE`]), so it
    /// stays counted against the session's credential.
    ///
    /// [`STALE_BASE`]: meshcat_common::wire::STALE_BASE
    pub kept: bool,
    /// The bound the instance would have passed, when that is why.
    pub over: Option<OverBound>,
}

/// Where accepted reports go (the live instances implement it). The sink owns which
/// session reports which instance; commands are routed by asking it. A session is
/// named by its key: a tag of its credential, `:`, and the agent id.
pub trait ReportSink: Send + Sync + 'static {
    /// Applies the instance snapshots of one accepted report of session `key`, taking
    /// them over. An instance whose current reporter is another session is taken over
    /// only when `may_take(reporter)` says so (the check and the take are one step),
    /// and one whose kept state would pass one of the `bounds` once the snapshot is
    /// applied is refused; the others are left as they are and answered.
    fn apply_report(
        &self,
        key: &str,
        instances: Vec<InstanceReport>,
        now: Instant,
        may_take: &dyn Fn(&str) -> bool,
        bounds: &InstanceBounds,
    ) -> Vec<InstanceRefusal>;
    /// The session's connection ended: its instances go.
    fn agent_gone(&self, key: &str);
    /// The key of the session that reports this instance now.
    fn reporter(&self, zone: &str, cluster: &str, instance: &str) -> Option<String>;
}

/// Why the ingest server could not run.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("cannot serve QUIC on the given socket: {0}")]
    Bind(#[from] std::io::Error),
    #[error("cannot register ingest metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Settings of the ingest server.
#[derive(Debug)]
pub struct IngestConfig {
    /// TLS and transport settings of the QUIC endpoint.
    pub server: quinn::ServerConfig,
    /// How agents authenticate and which zones they may report for.
    pub auth: AgentAuth,
    /// What agents and their reports are held to.
    pub limits: IngestLimits,
}

impl IngestConfig {
    /// Default limits around the given TLS configuration and authentication.
    pub fn new(server: quinn::ServerConfig, auth: AgentAuth) -> Self {
        IngestConfig {
            server,
            auth,
            limits: IngestLimits::default(),
        }
    }
}

/// What the ingest holds agents and their reports to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngestLimits {
    /// Largest message body accepted (`--max-message`).
    pub max_message: usize,
    /// Most instances in one report.
    pub max_instances: usize,
    /// Most upstream clusters per instance (`--max-upstream-clusters`).
    pub max_upstream_clusters: usize,
    /// Most upstream hosts per instance (`--max-upstream-hosts`).
    pub max_upstream_hosts: usize,
    /// Most instances reported by the live connections of one credential
    /// (`--max-instances-per-credential`).
    pub max_credential_instances: usize,
    /// Most connections of one credential (`--max-connections-per-credential`).
    pub max_credential_connections: usize,
    /// Most report streams of one credential in flight
    /// (`--max-streams-per-credential`).
    pub max_credential_streams: usize,
    /// Most instances one credential creates per minute, sustained
    /// (`--max-new-instances-per-minute`).
    pub max_new_instances_per_minute: usize,
    /// How long an instance counts against its credential after its last report
    /// (the catalog's `--instance-ttl`).
    pub instance_ttl: Duration,
    /// Most concurrent authenticated agent connections.
    pub max_connections: usize,
    /// Most connections not yet authenticated.
    pub max_pending: usize,
    /// Time allowed between the first packet and the end of the hello.
    pub hello_timeout: Duration,
}

impl IngestLimits {
    /// The per-instance bounds among these limits.
    pub fn instance_bounds(&self) -> InstanceBounds {
        InstanceBounds {
            max_upstream_clusters: self.max_upstream_clusters as u64,
            max_upstream_hosts: self.max_upstream_hosts as u64,
        }
    }
}

impl Default for IngestLimits {
    fn default() -> Self {
        IngestLimits {
            max_message: DEFAULT_MAX_MESSAGE,
            max_instances: DEFAULT_MAX_INSTANCES,
            max_upstream_clusters: DEFAULT_MAX_UPSTREAM_CLUSTERS,
            max_upstream_hosts: DEFAULT_MAX_UPSTREAM_HOSTS,
            max_credential_instances: DEFAULT_MAX_CREDENTIAL_INSTANCES,
            max_credential_connections: budget::DEFAULT_MAX_CREDENTIAL_CONNECTIONS,
            max_credential_streams: budget::DEFAULT_MAX_CREDENTIAL_STREAMS,
            max_new_instances_per_minute: budget::DEFAULT_MAX_NEW_INSTANCES_PER_MINUTE,
            instance_ttl: DEFAULT_INSTANCE_TTL,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_pending: DEFAULT_MAX_PENDING_CONNECTIONS,
            hello_timeout: HELLO_TIMEOUT,
        }
    }
}

/// The agent ingest: its address, how agents authenticate, what a report may hold.
#[derive(Debug, Clone)]
pub struct IngestSettings {
    /// `--quic-addr`.
    pub addr: SocketAddr,
    /// `--tls-cert` and `--tls-key`: the QUIC server's certificate.
    pub tls: Option<TlsFiles>,
    /// `--client-ca`: the CA of agent certificates.
    pub client_ca: Option<PathBuf>,
    /// `--agent-token-file`: token-authenticated agents (`TOKEN [zone,...|*]` lines).
    pub agent_token_file: Option<PathBuf>,
    /// `--allow-any-zone-cert`: an agent certificate without zone URIs grants every
    /// zone.
    pub allow_any_zone_cert: bool,
    /// `--max-message`, `--max-upstream-clusters`, `--max-upstream-hosts`,
    /// `--max-instances-per-credential`; the other limits at their defaults.
    pub limits: IngestLimits,
}

impl IngestSettings {
    /// Whether any agent credential is configured: without one (and without `--dev`)
    /// no agent can connect and the ingest stays off.
    pub fn has_credentials(&self) -> bool {
        self.tls.is_some() || self.client_ca.is_some() || self.agent_token_file.is_some()
    }

    /// The ingest's certificate and authentication options; `--dev` generates what is
    /// missing under `data_dir`.
    pub fn security(&self, dev: bool, data_dir: &Path) -> SecurityOptions {
        SecurityOptions {
            tls_cert: self.tls.as_ref().map(|t| t.cert.clone()),
            tls_key: self.tls.as_ref().map(|t| t.key.clone()),
            client_ca: self.client_ca.clone(),
            agent_token_file: self.agent_token_file.clone(),
            dev,
            data_dir: data_dir.to_owned(),
            allow_any_zone_cert: self.allow_any_zone_cert,
        }
    }
}

/// What every connection task shares.
struct Shared {
    auth: AgentAuth,
    max_message: usize,
    max_instances: usize,
    /// How large one instance may be, in a message and as kept.
    bounds: InstanceBounds,
    /// What each credential holds: connections, streams, instances.
    budgets: budget::Budgets,
    instance_ttl: Duration,
    hello_timeout: Duration,
    sink: Arc<dyn ReportSink>,
    agents: Agents,
    metrics: IngestMetrics,
    /// Authenticated connections being served, held below `max_connections`.
    open: AtomicUsize,
    max_connections: usize,
    /// Connections not yet authenticated, held below `max_pending`.
    pending: AtomicUsize,
    /// Bounds the warnings about refused peers and reports.
    refusals: warnlimit::WarnLimit,
}

/// The ingest server, ready to run on a socket.
pub struct Ingest {
    server: quinn::ServerConfig,
    max_pending: usize,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Ingest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingest")
            .field("max_connections", &self.shared.max_connections)
            .field("max_pending", &self.max_pending)
            .field("max_message", &self.shared.max_message)
            .field("max_instances", &self.shared.max_instances)
            .finish_non_exhaustive()
    }
}

impl Ingest {
    /// Registers the ingest metrics into `registry` and prepares the server.
    pub fn new(
        config: IngestConfig,
        sink: Arc<dyn ReportSink>,
        registry: &Registry,
    ) -> Result<Self, IngestError> {
        let metrics = IngestMetrics::register(registry)?;
        let IngestConfig {
            server,
            auth,
            limits,
        } = config;
        let shared = Arc::new(Shared {
            auth,
            max_message: limits.max_message,
            max_instances: limits.max_instances,
            bounds: limits.instance_bounds(),
            budgets: budget::Budgets::new(budget::CredentialLimits {
                instances: limits.max_credential_instances,
                connections: limits.max_credential_connections,
                streams: limits.max_credential_streams,
                new_per_minute: limits.max_new_instances_per_minute,
            }),
            instance_ttl: limits.instance_ttl,
            hello_timeout: limits.hello_timeout,
            sink: sink.clone(),
            agents: Agents::new(metrics.clone(), sink.clone()),
            metrics,
            open: AtomicUsize::new(0),
            max_connections: limits.max_connections,
            pending: AtomicUsize::new(0),
            refusals: warnlimit::WarnLimit::default(),
        });
        Ok(Ingest {
            server,
            max_pending: limits.max_pending,
            shared,
        })
    }

    /// The registry of connected agents, to send them commands.
    pub fn agents(&self) -> Agents {
        self.shared.agents.clone()
    }

    /// Serves agents on an already bound UDP socket until `shutdown` completes, then
    /// closes every connection and waits briefly for them to go.
    pub async fn run(
        self,
        socket: std::net::UdpSocket,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), IngestError> {
        let Ingest {
            server,
            max_pending,
            shared,
        } = self;
        let endpoint = quinn::Endpoint::new(
            quinn::EndpointConfig::default(),
            Some(server),
            socket,
            Arc::new(quinn::TokioRuntime),
        )?;
        info!(addr = %endpoint.local_addr()?, "Agent ingest listening.");
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                incoming = endpoint.accept() => {
                    let Some(incoming) = incoming else { break };
                    // Address validation: a peer must prove it receives at its source
                    // address (a stateless retry) before the server keeps any state
                    // or does any TLS work for it.
                    if !incoming.remote_address_validated() && incoming.may_retry() {
                        let _ = incoming.retry();
                        continue;
                    }
                    if shared.pending.load(Ordering::Relaxed) >= max_pending {
                        let remote = incoming.remote_address();
                        shared.refusals.warn(|suppressed| {
                            warn!(%remote, max_pending, suppressed, "Connection refused: too many connections awaiting authentication.");
                        });
                        shared.metrics.rejected("too_many_pending");
                        incoming.refuse();
                        continue;
                    }
                    shared.pending.fetch_add(1, Ordering::Relaxed);
                    let shared = shared.clone();
                    tokio::spawn(connection::serve(incoming, shared));
                }
                () = &mut shutdown => break,
            }
        }
        endpoint.close(code::SHUTDOWN.into(), b"aggregator shutting down");
        let _ = tokio::time::timeout(Duration::from_secs(2), endpoint.wait_idle()).await;
        info!("Agent ingest stopped.");
        Ok(())
    }
}
