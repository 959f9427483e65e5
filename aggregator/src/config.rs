//! The aggregator's command line (contract section 9): `meshcat-aggregator [serve]
//! [flags]`, every flag with a `MESHCAT_*` environment twin, validated once at start
//! into a [`Config`]. A bad value is one line on stderr and exit status 64. Each part
//! of the `Config` is a component's own configuration, defined with its defaults in
//! that component: this module only turns flags into them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use meshcat_common::config::{
    LogFormat, TlsFiles, duration_text, parse_bytes, parse_host_port, parse_positive_duration,
    parse_ratio, read_token_file, size_text,
};

use crate::api::events::EventsConfig;
use crate::api::{ApiConfig, Tokens};
use crate::diagnosis::DiagnosisConfig;
use crate::history::HistoryConfig;
use crate::ingest::{IngestLimits, IngestSettings};
use crate::ops::OpsConfig;
use crate::replicas::ReplicaConfig;
use crate::store::etcd::EtcdTlsFiles;
use crate::store::{self, Rules, StoreConfig, StoreSpec};

/// Largest accepted `--max-body`: request bodies are buffered whole in memory.
const MAX_BODY_CEILING: u64 = 64 << 20;
/// Largest accepted `--event-buffer`: each stream may queue that much.
const EVENT_BUFFER_CEILING: u64 = 64 << 20;

/// The aggregator's command line.
#[derive(Debug, Parser)]
#[command(
    name = "meshcat-aggregator",
    version,
    about = "meshcat aggregator: the service catalog REST API, the agent ingest (QUIC) and the ops endpoints.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Flags of `serve`, also accepted without the subcommand name.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Subcommands; `serve` is the default.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the catalog API, the agent ingest and the ops endpoints (the default).
    Serve(ServeArgs),
}

/// Flags of `serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address of the catalog REST API (TCP) [default: 0.0.0.0:9080; 127.0.0.1:9080 with --dev].
    #[arg(long, env = "MESHCAT_API_ADDR", value_name = "HOST:PORT")]
    pub api_addr: Option<SocketAddr>,
    /// Address of the agent ingest (QUIC over UDP) [default: 0.0.0.0:9443; 127.0.0.1:9443 with --dev].
    #[arg(long, env = "MESHCAT_QUIC_ADDR", value_name = "HOST:PORT")]
    pub quic_addr: Option<SocketAddr>,
    /// Address of the ops endpoints: Prometheus /metrics, /healthz, /readyz (TCP) [default: 0.0.0.0:9091; 127.0.0.1:9091 with --dev].
    #[arg(long, env = "MESHCAT_OPS_ADDR", value_name = "HOST:PORT")]
    pub ops_addr: Option<SocketAddr>,
    /// Serve on /metrics a series per registered cluster (status and live instances,
    /// labelled with its owner) and two per edge of the dependency graph (requests and
    /// errors), which the alerting rules use. The ops port has no token and these
    /// series name clusters, owners and who calls whom: off unless given
    /// (`--cluster-metrics` alone means true).
    #[arg(long, env = "MESHCAT_CLUSTER_METRICS", default_value_t = crate::ops::DEFAULT_CLUSTER_METRICS, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new(), value_name = "true|false")]
    pub cluster_metrics: bool,
    /// Directory of the durable registrations (zones and clusters).
    #[arg(
        long,
        env = "MESHCAT_DATA_DIR",
        default_value = "./meshcat-data",
        value_name = "DIR"
    )]
    pub data_dir: PathBuf,
    /// File holding the bearer token that every write requires: POST, PUT, DELETE, the
    /// logging PUTs, debug windows (none: writes answer 403 writes_disabled, unless
    /// --dev or --allow-anonymous-writes).
    #[arg(long, env = "MESHCAT_WRITE_TOKEN_FILE", value_name = "FILE")]
    pub write_token_file: Option<PathBuf>,
    /// File holding the bearer token that makes live data (instances, metrics) visible
    /// (none: every caller is authorized).
    #[arg(long, env = "MESHCAT_READ_TOKEN_FILE", value_name = "FILE")]
    pub read_token_file: Option<PathBuf>,
    /// An instance not reported within this time is dropped (like 500ms, 15s, 2m).
    #[arg(long, env = "MESHCAT_INSTANCE_TTL", default_value = store::DEFAULT_INSTANCE_TTL, value_parser = parse_positive_duration, value_name = "DURATION")]
    pub instance_ttl: Duration,
    /// Error ratio (5xx over requests, last report window) above which a cluster is in warning.
    #[arg(long, env = "MESHCAT_ERROR_RATIO_WARNING", default_value = store::DEFAULT_ERROR_RATIO_WARNING, value_parser = parse_ratio, value_name = "RATIO")]
    pub error_ratio_warning: f64,
    /// The dependency graph's window: an edge is observed when its upstream carried
    /// requests within it, and its figures are summed over it.
    #[arg(long, env = "MESHCAT_GRAPH_WINDOW", default_value = store::DEFAULT_GRAPH_WINDOW, value_parser = parse_positive_duration, value_name = "DURATION")]
    pub graph_window: Duration,
    /// A certificate with less than this left is expiring (when also less than half
    /// its lifetime is left, so that short-lived certificates are not always
    /// expiring).
    #[arg(long, env = "MESHCAT_CERT_WARNING", default_value = duration_text(meshcat_common::identity::DEFAULT_CERT_WARNING), value_parser = parse_positive_duration, value_name = "DURATION")]
    pub cert_warning: Duration,
    /// Fraction of its lifetime past which a certificate delivered over SDS and not
    /// replaced is rotation-overdue (the identity system stopped rotating).
    #[arg(long, env = "MESHCAT_CERT_ROTATION_OVERDUE", default_value_t = meshcat_common::identity::DEFAULT_ROTATION_OVERDUE, value_parser = parse_ratio, value_name = "RATIO")]
    pub cert_rotation_overdue: f64,
    /// Most callees one cluster keeps in the dependency graph (at most 10000): calls
    /// to further upstream clusters are summed into one edge to external:other.
    #[arg(long, env = "MESHCAT_MAX_EDGES_PER_NODE", default_value_t = crate::store::traffic::DEFAULT_MAX_EDGES_PER_NODE as u32, value_parser = clap::value_parser!(u32).range(1..=10_000), value_name = "N")]
    pub max_edges_per_node: u32,
    /// PEM certificate chain of the QUIC server.
    #[arg(long, env = "MESHCAT_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the QUIC server.
    #[arg(long, env = "MESHCAT_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA that signs agent certificates (mutual TLS).
    #[arg(long, env = "MESHCAT_CLIENT_CA", value_name = "FILE")]
    pub client_ca: Option<PathBuf>,
    /// File holding the shared token of token-authenticated agents.
    #[arg(long, env = "MESHCAT_AGENT_TOKEN_FILE", value_name = "FILE")]
    pub agent_token_file: Option<PathBuf>,
    /// Accept an agent certificate without any meshcat:zone: URI SAN as valid for every
    /// zone (by default such a certificate is refused).
    #[arg(long, env = "MESHCAT_ALLOW_ANY_ZONE_CERT")]
    pub allow_any_zone_cert: bool,
    /// Development mode: generate a self-signed CA, server and agent certificate under
    /// <data-dir>/dev/ and accept agents presenting that agent certificate.
    #[arg(long, env = "MESHCAT_DEV")]
    pub dev: bool,
    /// Without --write-token-file, accept writes from anyone (for a deployment behind
    /// an authenticating proxy); logged as a warning at start.
    #[arg(long, env = "MESHCAT_ALLOW_ANONYMOUS_WRITES")]
    pub allow_anonymous_writes: bool,
    /// PEM certificate chain of the catalog REST API: with --api-tls-key, the API is
    /// served over HTTPS only.
    #[arg(long, env = "MESHCAT_API_TLS_CERT", value_name = "FILE")]
    pub api_tls_cert: Option<PathBuf>,
    /// PEM private key of --api-tls-cert.
    #[arg(long, env = "MESHCAT_API_TLS_KEY", value_name = "FILE")]
    pub api_tls_key: Option<PathBuf>,
    /// PEM CA certificates that sign the other replicas' API certificates (default:
    /// the system's CA store). With --store etcd:// and --api-tls-cert, a replica
    /// forwards per-instance requests to their owner over HTTPS, verified against them.
    #[arg(long, env = "MESHCAT_PEER_CA_FILE", value_name = "FILE")]
    pub peer_ca_file: Option<PathBuf>,
    /// Time limit of an API request; a request past it answers 503 timeout. Event
    /// streams and blocking queries that wait (index the current index) are exempt,
    /// debug windows get their length on top.
    #[arg(long, env = "MESHCAT_API_REQUEST_TIMEOUT", default_value = duration_text(crate::api::DEFAULT_REQUEST_TIMEOUT), value_parser = parse_positive_duration, value_name = "DURATION")]
    pub api_request_timeout: Duration,
    /// Most API requests in progress at once; more answer 503 overloaded at once.
    /// Event streams and blocking queries that wait (index the current index) are not
    /// counted.
    #[arg(long, env = "MESHCAT_API_MAX_CONCURRENCY", default_value_t = crate::api::DEFAULT_MAX_CONCURRENCY as u32, value_parser = clap::value_parser!(u32).range(1..=1_000_000), value_name = "N")]
    pub api_max_concurrency: u32,
    /// Largest accepted request body (like 1MiB, 512KiB, 1048576).
    #[arg(long, env = "MESHCAT_MAX_BODY", default_value = "1MiB", value_parser = parse_bytes, value_name = "SIZE")]
    pub max_body: u64,
    /// Header timeout and connection bound of every HTTP listener (API and ops).
    #[command(flatten)]
    pub http: meshcat_common::http::ServerLimitArgs,
    /// Largest accepted agent message; a larger one is refused and counted, the
    /// agent's other messages are unaffected.
    #[arg(long, env = "MESHCAT_MAX_MESSAGE", default_value = size_text(meshcat_common::wire::DEFAULT_MAX_MESSAGE as u64), value_parser = parse_bytes, value_name = "SIZE")]
    pub max_message: u64,
    /// Connect to each zone's control server over xDS (ADS), holding the mesh's
    /// intended configuration beside what each sidecar has (contract section 17);
    /// false: never connect, every zone's control state is `disabled`.
    #[arg(long, env = "MESHCAT_CONTROL_PLANE", default_value_t = crate::control::DEFAULT_ENABLED, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new(), value_name = "true|false")]
    pub control_plane: bool,
    /// The node id meshcat presents to each zone's control server: `{zone}` is the
    /// zone's name, `{replica}` this replica (its --advertise-addr, else the host name).
    #[arg(long, env = "MESHCAT_CONTROL_NODE_ID", default_value = crate::control::DEFAULT_NODE_ID, value_name = "TEMPLATE")]
    pub control_node_id: String,
    /// Largest xDS response read from a control server; a larger one is refused
    /// (the zone `rejected`, its last good view kept).
    #[arg(long, env = "MESHCAT_MAX_CONTROL_MESSAGE", default_value = size_text(crate::control::DEFAULT_MAX_MESSAGE as u64), value_parser = parse_bytes, value_name = "SIZE")]
    pub max_control_message: u64,
    /// Most clusters (and listeners, and route configurations) one zone's view
    /// holds; endpoints are held to ten times as many. A response past it is NACKed
    /// and the last good view kept.
    #[arg(long, env = "MESHCAT_MAX_CONTROL_RESOURCES", default_value_t = crate::control::DEFAULT_MAX_CLUSTERS as u32, value_parser = clap::value_parser!(u32).range(1..), value_name = "N")]
    pub max_control_resources: u32,
    /// How long a sidecar's host set may differ from its control server's endpoints
    /// (or keep a cluster the control server dropped) before it is `stale`.
    #[arg(long, env = "MESHCAT_SYNC_GRACE", default_value = duration_text(crate::sync::DEFAULT_SYNC_GRACE), value_parser = parse_positive_duration, value_name = "DURATION")]
    pub sync_grace: Duration,
    /// Most upstream clusters one instance may report or have kept once a delta is
    /// applied (its upstreams with traffic and its listeners counted apart, the same
    /// way); an instance with more is refused alone (too_many_upstream_clusters), the
    /// rest of its report applies.
    #[arg(long, env = "MESHCAT_MAX_UPSTREAM_CLUSTERS", default_value_t = meshcat_common::limits::MAX_UPSTREAM_CLUSTERS as u32, value_parser = clap::value_parser!(u32).range(1..), value_name = "N")]
    pub max_upstream_clusters: u32,
    /// Most upstream hosts one instance may report or have kept over all its
    /// clusters, with the clusters its listeners name; an instance with more is
    /// refused alone (too_many_upstream_hosts).
    #[arg(long, env = "MESHCAT_MAX_UPSTREAM_HOSTS", default_value_t = crate::ingest::DEFAULT_MAX_UPSTREAM_HOSTS as u32, value_parser = clap::value_parser!(u32).range(1..), value_name = "N")]
    pub max_upstream_hosts: u32,
    /// Most instances the live connections of one agent credential (certificate or
    /// token) may hold, each counted from its first report until it goes unreported
    /// for --instance-ttl; further new instances are refused alone
    /// (too_many_credential_instances).
    #[arg(long, env = "MESHCAT_MAX_INSTANCES_PER_CREDENTIAL", default_value_t = crate::ingest::DEFAULT_MAX_CREDENTIAL_INSTANCES as u32, value_parser = clap::value_parser!(u32).range(1..), value_name = "N")]
    pub max_instances_per_credential: u32,
    /// Most instances one agent credential creates per minute, sustained (renamed
    /// instances count): a credential may create up to
    /// --max-instances-per-credential at once, then at this rate; past it new
    /// instances are refused alone (instance_rate).
    #[arg(long, env = "MESHCAT_MAX_NEW_INSTANCES_PER_MINUTE", default_value_t = crate::ingest::DEFAULT_MAX_NEW_INSTANCES_PER_MINUTE as u32, value_parser = clap::value_parser!(u32).range(1..), value_name = "N")]
    pub max_new_instances_per_minute: u32,
    /// Most agent connections of one credential; past it a new connection is
    /// refused (too_many_credential_connections), except an agent's reconnect.
    #[arg(long, env = "MESHCAT_MAX_CONNECTIONS_PER_CREDENTIAL", default_value_t = crate::ingest::DEFAULT_MAX_CREDENTIAL_CONNECTIONS as u32, value_parser = clap::value_parser!(u32).range(1..), value_name = "N")]
    pub max_connections_per_credential: u32,
    /// Most report streams of one agent credential in flight at once; past it a
    /// report is refused (too_many_credential_streams).
    #[arg(long, env = "MESHCAT_MAX_STREAMS_PER_CREDENTIAL", default_value_t = crate::ingest::DEFAULT_MAX_CREDENTIAL_STREAMS as u32, value_parser = clap::value_parser!(u32).range(1..), value_name = "N")]
    pub max_streams_per_credential: u32,
    /// How often the configuration of each zone's edge sidecar (its requestCluster)
    /// is fetched through its agent, so that GET /services lists the clusters it
    /// knows.
    #[arg(long, env = "MESHCAT_EDGE_REFRESH", default_value = "30s", value_parser = parse_positive_duration, value_name = "DURATION")]
    pub edge_refresh: Duration,
    /// Deadline of each command sent to an agent (log level, config dump, evidence).
    #[arg(long, env = "MESHCAT_COMMAND_TIMEOUT", default_value = "5s", value_parser = parse_positive_duration, value_name = "DURATION")]
    pub command_timeout: Duration,
    /// Most bytes one GET /events stream queues (like 256KiB, 1MiB; at most 64MiB): a
    /// resume whose replay is larger gets `reset` instead, and live changes are
    /// written in chunks of at most this size.
    #[arg(long, env = "MESHCAT_EVENT_BUFFER", default_value = size_text(crate::api::events::BUFFER as u64), value_parser = parse_bytes, value_name = "SIZE")]
    pub event_buffer: u64,
    /// Most GET /events streams open at once; more answer 503 overloaded.
    #[arg(long, env = "MESHCAT_MAX_EVENT_STREAMS", default_value_t = crate::api::events::MAX_STREAMS as u32, value_parser = clap::value_parser!(u32).range(1..=1_000_000), value_name = "N")]
    pub max_event_streams: u32,
    /// How often a GET /events stream sends a comment line, so proxies and clients
    /// keep it open (> 0).
    #[arg(long, env = "MESHCAT_EVENT_HEARTBEAT", default_value = duration_text(crate::api::events::HEARTBEAT), value_parser = parse_positive_duration, value_name = "DURATION")]
    pub event_heartbeat: Duration,
    /// How long a GET /events stream gathers changes after a write before it writes
    /// again (0 to 1s): an isolated change goes out at once, a steady flow in one
    /// write per period. Longer saves CPU with many streams, at up to this much delay.
    #[arg(long, env = "MESHCAT_EVENT_COALESCE", default_value = duration_text(crate::api::events::COALESCE), value_parser = parse_coalesce, value_name = "DURATION")]
    pub event_coalesce: Duration,
    /// Prometheus base URL (http://host:port); when set, the missing-metrics
    /// diagnosis asks it whether `up{job="<prometheusJob>"}` has a series.
    #[arg(long, env = "MESHCAT_PROMETHEUS_URL", value_parser = parse_http_url, value_name = "URL")]
    pub prometheus_url: Option<String>,
    /// Where registrations live: `redb` (one replica, <data-dir>/catalog.redb) or
    /// `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]` (any number of replicas; prefix
    /// /meshcat by default).
    #[arg(long, env = "MESHCAT_STORE", default_value = "redb", value_parser = parse_store, value_name = "redb|etcd://HOST:PORT[,...][/PREFIX]")]
    pub store: StoreSpec,
    /// PEM CA that signs the etcd members' certificates (turns on TLS to etcd).
    #[arg(long, env = "MESHCAT_ETCD_CA_FILE", value_name = "FILE")]
    pub etcd_ca_file: Option<PathBuf>,
    /// PEM client certificate presented to etcd (with --etcd-key).
    #[arg(long, env = "MESHCAT_ETCD_CERT", value_name = "FILE")]
    pub etcd_cert: Option<PathBuf>,
    /// PEM private key of --etcd-cert.
    #[arg(long, env = "MESHCAT_ETCD_KEY", value_name = "FILE")]
    pub etcd_key: Option<PathBuf>,
    /// This replica's catalog API address as its peers reach it (with an etcd store;
    /// default: --api-addr, which must then not be a wildcard address).
    #[arg(long, env = "MESHCAT_ADVERTISE_ADDR", value_parser = parse_host_port, value_name = "HOST:PORT")]
    pub advertise_addr: Option<String>,
    /// How long the history (<data-dir>/history.redb) keeps an entry (like 12h, 7d).
    #[arg(long, env = "MESHCAT_HISTORY_RETENTION", default_value = duration_text(crate::history::DEFAULT_RETENTION), value_parser = parse_positive_duration, value_name = "DURATION")]
    pub history_retention: Duration,
    /// Most entries the history keeps, the oldest dropped first (at most
    /// 100000000); 0 keeps no history.
    #[arg(long, env = "MESHCAT_HISTORY_MAX_ENTRIES", default_value_t = crate::history::DEFAULT_MAX_ENTRIES, value_parser = clap::value_parser!(u64).range(0..=100_000_000), value_name = "N")]
    pub history_max_entries: u64,
    /// Most bytes the history's entries take (like 512MiB, at least 1MiB), the
    /// oldest dropped first; keep it well within the data directory's volume.
    #[arg(long, env = "MESHCAT_HISTORY_MAX_BYTES", default_value = size_text(crate::history::DEFAULT_MAX_BYTES), value_parser = parse_history_bytes, value_name = "SIZE")]
    pub history_max_bytes: u64,
    /// Most `diagnosed` entries the history records a minute (at most 100000); past
    /// it diagnoses still run and answer, unrecorded (counted in
    /// meshcat_history_unrecorded_total).
    #[arg(long, env = "MESHCAT_HISTORY_MAX_DIAGNOSES", default_value_t = crate::history::DEFAULT_MAX_DIAGNOSES, value_parser = clap::value_parser!(u32).range(0..=100_000), value_name = "N")]
    pub history_max_diagnoses: u32,
    /// Log line format.
    #[arg(long, env = "MESHCAT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Longest accepted etcd key prefix: keys carry two names of up to 253 bytes too.
const MAX_PREFIX_LEN: usize = 256;
/// Most etcd endpoints in `--store`.
const MAX_ENDPOINTS: usize = 16;

/// `--history-max-bytes`: a size of at least 1 MiB.
fn parse_history_bytes(s: &str) -> Result<u64, String> {
    let n = parse_bytes(s)?;
    if n < 1 << 20 {
        return Err("must be at least 1MiB".into());
    }
    Ok(n)
}

/// `--event-coalesce`: 0 to 1 s.
fn parse_coalesce(s: &str) -> Result<Duration, String> {
    let d = meshcat_common::config::parse_duration(s)?;
    if d > Duration::from_secs(1) {
        return Err(format!("{s:?} is over 1s"));
    }
    Ok(d)
}

/// Parses `--store`.
pub fn parse_store(s: &str) -> Result<StoreSpec, String> {
    let s = s.trim();
    if s == "redb" {
        return Ok(StoreSpec::Redb);
    }
    let rest = s.strip_prefix("etcd://").ok_or_else(|| {
        format!("{s:?} is neither redb nor etcd://HOST:PORT[,HOST:PORT...][/PREFIX]")
    })?;
    let (hosts, prefix) = match rest.split_once('/') {
        Some((h, p)) => (h, format!("/{}", p.trim_end_matches('/'))),
        None => (rest, "/meshcat".to_owned()),
    };
    if prefix == "/"
        || prefix.len() > MAX_PREFIX_LEN
        || !prefix.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(format!(
            "etcd prefix {prefix:?} must be 1 to {MAX_PREFIX_LEN} printable characters after the /"
        ));
    }
    let endpoints = hosts
        .split(',')
        .map(|h| parse_host_port(h.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    if endpoints.len() > MAX_ENDPOINTS {
        return Err(format!("at most {MAX_ENDPOINTS} etcd endpoints"));
    }
    Ok(StoreSpec::Etcd { endpoints, prefix })
}

/// A configuration value that parses but cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    TokenFile(String),
    #[error("--{flag} {path}: cannot be read: {error}")]
    Unreadable {
        flag: &'static str,
        path: String,
        error: std::io::Error,
    },
    #[error("--tls-cert and --tls-key must be given together")]
    HalfTls,
    #[error("--api-tls-cert and --api-tls-key must be given together")]
    HalfApiTls,
    #[error("--max-body must be at most {MAX_BODY_CEILING} bytes")]
    MaxBody,
    #[error("--event-buffer must be at most {EVENT_BUFFER_CEILING} bytes")]
    EventBuffer,
    #[error("--max-message is too large for this machine")]
    MaxMessage,
    #[error("--data-dir {0} exists and is not a directory")]
    DataDir(String),
    #[error("--etcd-cert and --etcd-key must be given together")]
    HalfEtcdTls,
    #[error("--etcd-ca-file, --etcd-cert and --etcd-key need --store etcd://...")]
    EtcdTlsWithoutEtcd,
    #[error("--advertise-addr is needed with --store etcd:// when --api-addr is {0}")]
    NoAdvertise(SocketAddr),
    #[error(
        "--peer-ca-file needs --store etcd:// and --api-tls-cert: only replicas serving HTTPS forward over it"
    )]
    PeerCaUnused,
}

/// The validated configuration the aggregator runs with, one part per component;
/// each part is handed to its component whole (the table in docs/architecture.md,
/// "Configuration", says which flag lands where).
#[derive(Debug, Clone)]
pub struct Config {
    /// The catalog REST API.
    pub api: ApiConfig,
    /// Address of the ops endpoints (`--ops-addr`).
    pub ops_addr: SocketAddr,
    /// What the ops endpoints expose.
    pub ops: OpsConfig,
    /// The agent ingest (QUIC).
    pub ingest: IngestSettings,
    /// Where registrations live and the status rules.
    pub store: StoreConfig,
    /// How replicas sharing an etcd store reach each other.
    pub replicas: ReplicaConfig,
    /// Commands to sidecars and what is built on them: log levels, the diagnosis,
    /// the edge refresh.
    pub diagnosis: DiagnosisConfig,
    /// `GET /events` streams and the change feed behind them.
    pub events: EventsConfig,
    /// The history: how long and how much it keeps.
    pub history: HistoryConfig,
    /// Header timeout and connection bound of the API and ops listeners.
    pub http: meshcat_common::http::ServerLimits,
    /// The API's bearer tokens (never logged); writes are open without a write token
    /// with `--dev` or `--allow-anonymous-writes`.
    pub tokens: Tokens,
    /// `--dev`: development certificates, loopback addresses by default.
    pub dev: bool,
    /// Address flags given explicitly although `--dev` would bind loopback, and
    /// not on loopback: each is warned about at start.
    pub exposed: Vec<(&'static str, SocketAddr)>,
    pub log_format: LogFormat,
    /// The dependency graph's bounds.
    pub graph: crate::graph::GraphConfig,
    /// The zones' control servers.
    pub control: crate::control::ControlConfig,
    /// The sync of the sidecars with them.
    pub sync: crate::sync::SyncConfig,
}

impl Config {
    /// A configuration for tests and embedding: loopback port 0 everywhere, the given
    /// data directory, writes open to anyone unless a test sets a write token (the
    /// process default refuses them), every other value at its default.
    pub fn for_tests(data_dir: &Path) -> Config {
        let args = ServeArgs::try_parse_from_defaults().expect("defaults parse");
        let mut c = Config::from_args(args).expect("defaults are valid");
        let lo = SocketAddr::from(([127, 0, 0, 1], 0));
        c.api.addr = lo;
        c.ingest.addr = lo;
        c.ops_addr = lo;
        c.store.data_dir = data_dir.to_owned();
        c.tokens.anonymous_writes = true;
        c
    }

    /// Validates parsed flags: reads token files, checks certificate files exist.
    pub fn from_args(a: ServeArgs) -> Result<Config, ConfigError> {
        let token = |p: &Option<PathBuf>| -> Result<Option<String>, ConfigError> {
            p.as_deref()
                .map(read_token_file)
                .transpose()
                .map_err(ConfigError::TokenFile)
        };
        if a.tls_cert.is_some() != a.tls_key.is_some() {
            return Err(ConfigError::HalfTls);
        }
        if a.api_tls_cert.is_some() != a.api_tls_key.is_some() {
            return Err(ConfigError::HalfApiTls);
        }
        if a.etcd_cert.is_some() != a.etcd_key.is_some() {
            return Err(ConfigError::HalfEtcdTls);
        }
        let replicas_tls = a.store != StoreSpec::Redb && a.api_tls_cert.is_some();
        if a.peer_ca_file.is_some() && !replicas_tls {
            return Err(ConfigError::PeerCaUnused);
        }
        let etcd_tls = a.etcd_ca_file.is_some() || a.etcd_cert.is_some();
        if etcd_tls && a.store == StoreSpec::Redb {
            return Err(ConfigError::EtcdTlsWithoutEtcd);
        }
        // --dev binds loopback unless an address is given (contract section 10).
        let host: std::net::IpAddr = if a.dev {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv4Addr::UNSPECIFIED.into()
        };
        let mut exposed = Vec::new();
        let mut addr = |what: &'static str, given: Option<SocketAddr>, port: u16| match given {
            Some(addr) => {
                if a.dev && !addr.ip().is_loopback() {
                    exposed.push((what, addr));
                }
                addr
            }
            None => SocketAddr::new(host, port),
        };
        let api_addr = addr("api", a.api_addr, 9080);
        let quic_addr = addr("quic", a.quic_addr, 9443);
        let ops_addr = addr("ops", a.ops_addr, 9091);
        if a.store != StoreSpec::Redb
            && a.advertise_addr.is_none()
            && api_addr.ip().is_unspecified()
        {
            return Err(ConfigError::NoAdvertise(api_addr));
        }
        for (flag, path) in [
            ("tls-cert", &a.tls_cert),
            ("tls-key", &a.tls_key),
            ("client-ca", &a.client_ca),
            ("api-tls-cert", &a.api_tls_cert),
            ("api-tls-key", &a.api_tls_key),
            ("peer-ca-file", &a.peer_ca_file),
            ("etcd-ca-file", &a.etcd_ca_file),
            ("etcd-cert", &a.etcd_cert),
            ("etcd-key", &a.etcd_key),
        ] {
            if let Some(p) = path {
                std::fs::metadata(p).map_err(|error| ConfigError::Unreadable {
                    flag,
                    path: p.display().to_string(),
                    error,
                })?;
            }
        }
        if a.max_body > MAX_BODY_CEILING {
            return Err(ConfigError::MaxBody);
        }
        if a.event_buffer > EVENT_BUFFER_CEILING {
            return Err(ConfigError::EventBuffer);
        }
        if a.data_dir.exists() && !a.data_dir.is_dir() {
            return Err(ConfigError::DataDir(a.data_dir.display().to_string()));
        }
        let tokens = Tokens {
            write: token(&a.write_token_file)?,
            read: token(&a.read_token_file)?,
            anonymous_writes: a.dev || a.allow_anonymous_writes,
        };
        // Read now so a missing or empty file is a start-up error.
        token(&a.agent_token_file)?;
        let max_message = usize::try_from(a.max_message).map_err(|_| ConfigError::MaxMessage)?;
        Ok(Config {
            api: ApiConfig {
                addr: api_addr,
                tls: TlsFiles::pair(a.api_tls_cert, a.api_tls_key),
                request_timeout: a.api_request_timeout,
                max_concurrency: a.api_max_concurrency as usize,
                max_body: a.max_body as usize,
            },
            ops_addr,
            ops: OpsConfig {
                cluster_metrics: a.cluster_metrics,
                ..OpsConfig::default()
            },
            ingest: IngestSettings {
                addr: quic_addr,
                tls: TlsFiles::pair(a.tls_cert, a.tls_key),
                client_ca: a.client_ca,
                agent_token_file: a.agent_token_file,
                allow_any_zone_cert: a.allow_any_zone_cert,
                limits: IngestLimits {
                    max_message,
                    max_upstream_clusters: a.max_upstream_clusters as usize,
                    max_upstream_hosts: a.max_upstream_hosts as usize,
                    max_credential_instances: a.max_instances_per_credential as usize,
                    max_credential_connections: a.max_connections_per_credential as usize,
                    max_credential_streams: a.max_streams_per_credential as usize,
                    max_new_instances_per_minute: a.max_new_instances_per_minute as usize,
                    instance_ttl: a.instance_ttl,
                    ..IngestLimits::default()
                },
            },
            store: StoreConfig {
                spec: a.store,
                data_dir: a.data_dir,
                etcd_tls: if etcd_tls {
                    Some(EtcdTlsFiles {
                        ca: a.etcd_ca_file,
                        identity: TlsFiles::pair(a.etcd_cert, a.etcd_key),
                    })
                } else {
                    None
                },
                rules: Rules {
                    instance_ttl: a.instance_ttl,
                    error_ratio_warning: a.error_ratio_warning,
                    graph_window: a.graph_window,
                    identity: meshcat_common::identity::IdentityRules {
                        warning_ms: a.cert_warning.as_millis().min(i64::MAX as u128) as i64,
                        overdue_fraction: a.cert_rotation_overdue,
                    },
                },
            },
            replicas: ReplicaConfig {
                advertise_addr: a.advertise_addr.clone(),
                peer_ca_file: a.peer_ca_file,
            },
            diagnosis: DiagnosisConfig {
                command_timeout: a.command_timeout,
                edge_refresh: a.edge_refresh,
                prometheus_url: a.prometheus_url,
            },
            events: EventsConfig {
                heartbeat: a.event_heartbeat,
                coalesce: a.event_coalesce,
                buffer: a.event_buffer as usize,
                max_streams: a.max_event_streams as usize,
                lag: crate::changes::DEFAULT_BUFFER,
            },
            history: HistoryConfig {
                retention: a.history_retention,
                max_entries: a.history_max_entries,
                max_bytes: a.history_max_bytes,
                max_diagnoses: a.history_max_diagnoses,
            },
            http: a.http.limits(),
            tokens,
            dev: a.dev,
            exposed,
            log_format: a.log_format,
            graph: crate::graph::GraphConfig {
                max_edges_per_node: a.max_edges_per_node as usize,
            },
            control: crate::control::ControlConfig {
                enabled: a.control_plane,
                node_id: a.control_node_id,
                replica: replica_name(a.advertise_addr.as_deref(), api_addr.port()),
                max_message: usize::try_from(a.max_control_message).unwrap_or(usize::MAX),
                max_clusters: a.max_control_resources as usize,
                max_endpoints: (a.max_control_resources as usize).saturating_mul(10),
            },
            sync: crate::sync::SyncConfig {
                grace: a.sync_grace,
            },
        })
    }
}

/// `{replica}` of the control node id: the advertised address, else the host name
/// and the API port (replicas on one machine differ by port).
fn replica_name(advertise: Option<&str>, api_port: u16) -> String {
    if let Some(a) = advertise {
        return a.to_owned();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "meshcat".to_owned());
    format!("{host}:{api_port}")
}

impl Config {
    /// The history's file in the data directory: `history.redb`, or with an etcd
    /// store `history-<port>.redb` by the port of the advertised address (replicas
    /// on one machine may share the data directory; a restart keeps its port).
    pub fn history_file(&self) -> String {
        match self.store.spec {
            StoreSpec::Redb => crate::history::DB_FILE.to_owned(),
            StoreSpec::Etcd { .. } => {
                let port = self
                    .replicas
                    .advertise_addr
                    .as_deref()
                    .and_then(|a| a.rsplit_once(':'))
                    .and_then(|(_, p)| p.parse::<u16>().ok())
                    .unwrap_or(self.api.addr.port());
                crate::history::replica_file(port)
            }
        }
    }
}

impl ServeArgs {
    /// The flags with every value at its default (ignoring the environment).
    fn try_parse_from_defaults() -> Result<ServeArgs, clap::Error> {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            serve: ServeArgs,
        }
        // The environment twins would leak into tests that set MESHCAT_* variables.
        let mut cmd = <Only as clap::CommandFactory>::command();
        cmd = cmd.mut_args(|a| a.env(None::<&str>));
        let m = cmd.try_get_matches_from(["meshcat-aggregator"])?;
        <Only as clap::FromArgMatches>::from_arg_matches(&m).map(|o| o.serve)
    }
}

/// What `main` should do after parsing the command line.
#[derive(Debug)]
pub enum Action {
    Serve(Box<Config>),
}

/// Parses the process arguments. On `--help` or `--version` prints and exits 0; on a
/// bad value prints one line and exits 64.
pub fn parse_or_exit() -> Action {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                std::process::exit(0);
            }
            exit_usage(&first_line(&e.render().to_string()));
        }
    };
    let args = match cli.command {
        Some(Command::Serve(a)) => a,
        None => cli.serve,
    };
    match Config::from_args(args) {
        Ok(c) => Action::Serve(Box::new(c)),
        Err(e) => exit_usage(&format!("error: {e}")),
    }
}

fn first_line(s: &str) -> String {
    s.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("error: invalid command line")
        .to_owned()
}

fn exit_usage(line: &str) -> ! {
    eprintln!("{line}");
    std::process::exit(meshcat_common::config::EXIT_USAGE);
}

/// Checks an `http://` or `https://` base URL with a host; a trailing `/` is dropped.
pub fn parse_http_url(s: &str) -> Result<String, String> {
    let s = s.trim().trim_end_matches('/');
    let rest = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"))
        .ok_or_else(|| format!("{s:?} is not an http:// or https:// URL"))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    if host.is_empty() || rest.contains(char::is_whitespace) || s.len() > 2048 {
        return Err(format!(
            "{s:?} is not an http:// or https:// URL with a host"
        ));
    }
    Ok(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<ServeArgs, clap::Error> {
        let cli =
            Cli::try_parse_from(std::iter::once("meshcat-aggregator").chain(args.iter().copied()))?;
        Ok(match cli.command {
            Some(Command::Serve(a)) => a,
            None => cli.serve,
        })
    }

    #[test]
    fn event_stream_bounds_are_sizes_and_counts() {
        let d = Config::from_args(parse(&[]).unwrap()).unwrap();
        assert_eq!(d.events.buffer, 256 << 10);
        assert_eq!(d.events.max_streams, 1024);
        let a = parse(&["--event-buffer", "1MiB", "--max-event-streams", "2"]).unwrap();
        let c = Config::from_args(a).unwrap();
        assert_eq!((c.events.buffer, c.events.max_streams), (1 << 20, 2));
        let a = parse(&["--event-buffer", "65MiB"]).unwrap();
        assert!(matches!(
            Config::from_args(a),
            Err(ConfigError::EventBuffer)
        ));
    }

    /// The ingest counts an instance against its credential for the catalog's TTL:
    /// their defaults agree.
    #[test]
    fn the_ingest_and_the_catalog_share_the_instance_ttl() {
        assert_eq!(
            crate::ingest::DEFAULT_INSTANCE_TTL,
            crate::store::Rules::defaults().instance_ttl
        );
        let c = Config::from_args(parse(&["--instance-ttl", "40s"]).unwrap()).unwrap();
        assert_eq!(c.ingest.limits.instance_ttl, Duration::from_secs(40));
    }

    #[test]
    fn the_history_keeps_its_bounds_and_a_file_per_replica() {
        let d = Config::from_args(parse(&[]).unwrap()).unwrap();
        assert_eq!(d.history, HistoryConfig::default());
        assert_eq!(d.history.retention, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(d.history_file(), "history.redb");
        let a = parse(&["--history-retention", "12h", "--history-max-entries", "0"]).unwrap();
        let c = Config::from_args(a).unwrap();
        assert_eq!(c.history.retention, Duration::from_secs(12 * 3600));
        assert!(!c.history.is_on());
        assert!(parse(&["--history-retention", "0s"]).is_err());
        assert!(parse(&["--history-max-entries", "100000001"]).is_err());
        assert!(parse(&["--history-max-entries", "-1"]).is_err());
        assert_eq!(d.history.max_bytes, 512 << 20);
        assert_eq!(d.history.max_diagnoses, 60);
        let a = parse(&[
            "--history-max-bytes",
            "2GiB",
            "--history-max-diagnoses",
            "0",
        ])
        .unwrap();
        let c = Config::from_args(a).unwrap();
        assert_eq!(c.history.max_bytes, 2 << 30);
        assert_eq!(c.history.max_diagnoses, 0);
        assert!(parse(&["--history-max-bytes", "1KiB"]).is_err());
        assert!(parse(&["--history-max-diagnoses", "100001"]).is_err());
        let etcd = |extra: &[&str]| {
            let mut args = vec![
                "--store",
                "etcd://127.0.0.1:2379",
                "--api-addr",
                "127.0.0.1:9080",
            ];
            args.extend_from_slice(extra);
            Config::from_args(parse(&args).unwrap())
                .unwrap()
                .history_file()
        };
        assert_eq!(etcd(&[]), "history-9080.redb");
        assert_eq!(
            etcd(&["--advertise-addr", "10.0.0.7:19081"]),
            "history-19081.redb"
        );
    }

    /// The flags' defaults are the components' own: a component's default changed
    /// without its flag (or the other way round) fails here. (The status rules'
    /// flags take their defaults from `store` itself.)
    /// Every flag takes its default from the component's constant (as text for the
    /// durations and sizes): the parsed defaults are the components' own.
    #[test]
    fn flag_defaults_are_the_components_defaults() {
        let d = Config::from_args(parse(&[]).unwrap()).unwrap();
        assert_eq!(d.events, EventsConfig::default());
        assert_eq!(d.history, HistoryConfig::default());
        assert_eq!(d.ingest.limits, IngestLimits::default());
        assert_eq!(d.api.request_timeout, crate::api::DEFAULT_REQUEST_TIMEOUT);
        assert_eq!(d.api.max_concurrency, crate::api::DEFAULT_MAX_CONCURRENCY);
    }

    #[test]
    fn serve_is_optional() {
        let a = parse(&["--api-addr", "127.0.0.1:1"]).unwrap();
        assert_eq!(a.api_addr.map(|a| a.port()), Some(1));
        let b = parse(&[
            "serve",
            "--api-addr",
            "127.0.0.1:2",
            "--instance-ttl",
            "500ms",
        ])
        .unwrap();
        assert_eq!(b.api_addr.map(|a| a.port()), Some(2));
        assert_eq!(b.instance_ttl, Duration::from_millis(500));
    }

    #[test]
    fn cluster_metrics_are_off_unless_turned_on() {
        let on = |args: &[&str]| Config::from_args(parse(args).unwrap()).unwrap();
        assert!(!on(&[]).ops.cluster_metrics);
        assert!(on(&["--cluster-metrics"]).ops.cluster_metrics);
        assert!(on(&["--cluster-metrics", "--dev"]).ops.cluster_metrics);
        assert!(on(&["--cluster-metrics=true"]).ops.cluster_metrics);
        assert!(on(&["--cluster-metrics", "true"]).ops.cluster_metrics);
        assert!(!on(&["--cluster-metrics=false"]).ops.cluster_metrics);
        assert!(!on(&["--cluster-metrics", "false"]).ops.cluster_metrics);
        assert!(parse(&["--cluster-metrics=maybe"]).is_err());
        let d = on(&[]).ops;
        assert_eq!(d.render_max_age, crate::ops::DEFAULT_RENDER_MAX_AGE);
        assert_eq!(d.max_scrapes, crate::ops::DEFAULT_MAX_SCRAPES);
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(parse(&["--instance-ttl", "soon"]).is_err());
        assert!(parse(&["--error-ratio-warning", "2"]).is_err());
        assert!(parse(&["--max-body", "0"]).is_err());
        assert!(parse(&["--event-buffer", "0"]).is_err());
        assert!(parse(&["--event-buffer", "lots"]).is_err());
        assert!(parse(&["--max-event-streams", "0"]).is_err());
        assert!(parse(&["--api-addr", "nowhere"]).is_err());
    }

    #[test]
    fn store_is_redb_or_etcd_endpoints_with_a_prefix() {
        assert_eq!(parse_store("redb").unwrap(), StoreSpec::Redb);
        assert_eq!(
            parse_store("etcd://127.0.0.1:2379,etcd-1:2379/cat/").unwrap(),
            StoreSpec::Etcd {
                endpoints: vec!["127.0.0.1:2379".into(), "etcd-1:2379".into()],
                prefix: "/cat".into()
            }
        );
        assert_eq!(
            parse_store("etcd://[::1]:2379").unwrap(),
            StoreSpec::Etcd {
                endpoints: vec!["[::1]:2379".into()],
                prefix: "/meshcat".into()
            }
        );
        for bad in [
            "sqlite",
            "etcd://",
            "etcd://h",
            "etcd://h:99999",
            "etcd://h:1/",
            "etcd://a b:1",
        ] {
            assert!(parse_store(bad).is_err(), "{bad}");
        }
        let a = parse(&["--store", "etcd://127.0.0.1:2379"]).unwrap();
        assert!(matches!(
            Config::from_args(a),
            Err(ConfigError::NoAdvertise(_))
        ));
        let a = parse(&["--etcd-ca-file", "/etc/hostname"]).unwrap();
        assert!(matches!(
            Config::from_args(a),
            Err(ConfigError::EtcdTlsWithoutEtcd)
        ));
        // Replicas serving HTTPS forward over HTTPS, trusting the system's CA store
        // or the peers' CA; the CA alone means nothing.
        let tls = [
            "--store",
            "etcd://127.0.0.1:2379",
            "--advertise-addr",
            "10.0.0.1:9080",
            "--api-tls-cert",
            "/etc/hostname",
            "--api-tls-key",
            "/etc/hostname",
        ];
        let c = Config::from_args(parse(&tls).unwrap()).unwrap();
        assert_eq!(c.replicas.peer_ca_file, None);
        let mut with_ca = tls.to_vec();
        with_ca.extend(["--peer-ca-file", "/etc/hostname"]);
        let c = Config::from_args(parse(&with_ca).unwrap()).unwrap();
        assert_eq!(
            c.replicas.peer_ca_file.as_deref(),
            Some(Path::new("/etc/hostname"))
        );
        let a = parse(&["--peer-ca-file", "/etc/hostname"]).unwrap();
        assert!(matches!(
            Config::from_args(a),
            Err(ConfigError::PeerCaUnused)
        ));
    }

    #[test]
    fn dev_binds_loopback_unless_told() {
        let c = Config::from_args(parse(&["--dev"]).unwrap()).unwrap();
        for a in [c.api.addr, c.ingest.addr, c.ops_addr] {
            assert!(a.ip().is_loopback(), "{a}");
        }
        assert_eq!(
            (c.api.addr.port(), c.ingest.addr.port(), c.ops_addr.port()),
            (9080, 9443, 9091)
        );
        assert!(c.exposed.is_empty());
        let c = Config::from_args(parse(&["--dev", "--api-addr", "0.0.0.0:1"]).unwrap()).unwrap();
        assert_eq!(c.api.addr, "0.0.0.0:1".parse().unwrap());
        assert_eq!(c.exposed, vec![("api", c.api.addr)]);
        assert!(c.ops_addr.ip().is_loopback());
        let c = Config::from_args(parse(&[]).unwrap()).unwrap();
        assert!(c.api.addr.ip().is_unspecified() && c.ingest.addr.ip().is_unspecified());
        assert!(!c.tokens.anonymous_writes);
    }

    #[test]
    fn half_tls_is_refused() {
        let a = parse(&["--tls-cert", "/etc/hostname"]).unwrap();
        assert!(matches!(Config::from_args(a), Err(ConfigError::HalfTls)));
    }

    #[test]
    fn prometheus_url_is_an_http_base_url() {
        assert_eq!(
            parse_http_url("http://prometheus:9090/").unwrap(),
            "http://prometheus:9090"
        );
        assert!(parse_http_url("https://p.example.com/prom").is_ok());
        for bad in ["prometheus:9090", "ftp://p", "http://", "http:// p"] {
            assert!(parse_http_url(bad).is_err(), "{bad}");
        }
        let a = parse(&["--prometheus-url", "http://127.0.0.1:9090"]).unwrap();
        assert_eq!(
            Config::from_args(a)
                .unwrap()
                .diagnosis
                .prometheus_url
                .as_deref(),
            Some("http://127.0.0.1:9090")
        );
    }
}
