//! The command line of `meshcat`, as clap reads it: the flags every subcommand takes
//! (`--api`, `--token-file`, `--timeout`, each with its `MESHCAT_*` twin) and each
//! subcommand's own arguments. Subcommand arguments have no environment twins on
//! purpose: the agent reads `MESHCAT_ZONE`, `MESHCAT_CLUSTER` and `MESHCAT_INSTANCE`,
//! and a `meshcat` run beside an agent must not be narrowed by them silently.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use meshcat_common::config::{parse_aggregators, parse_positive_duration};
use meshcat_common::envoy_log::MAX_DEBUG_WINDOW_SECONDS;
use meshcat_common::validate::MAX_NAME_LEN;

/// meshcat: the service catalog and troubleshooting companion of an Envoy mesh.
#[derive(Debug, Parser)]
#[command(name = "meshcat", version, about)]
pub struct Cli {
    /// Base URL of the aggregator's catalog API.
    #[arg(
        long,
        env = "MESHCAT_API",
        default_value = "http://127.0.0.1:9080",
        global = true
    )]
    pub api: String,
    /// File holding the bearer token to send: the read token to see live data, the
    /// write token to change the catalog or a sidecar.
    #[arg(long, env = "MESHCAT_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// How long to wait for each answer (a diagnosis with a debug window takes
    /// longer). `watch` waits for events without end.
    #[arg(long, env = "MESHCAT_TIMEOUT", default_value = "60s", value_parser = parse_positive_duration, global = true)]
    pub timeout: Duration,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List zones (with their control servers' state) or clusters, or show one
    /// cluster, as a table, JSON or YAML.
    Get {
        #[command(subcommand)]
        what: GetWhat,
    },
    /// Describe a cluster: its record, what its zone's control server declares of
    /// it, instances with their source and sync, status and why, callers and
    /// callees, configuration drift and recent history.
    Describe {
        #[command(subcommand)]
        what: DescribeWhat,
    },
    /// Make the catalog match YAML or JSON files of Zone and Cluster documents.
    /// Everything is validated before anything is written; equal records are not
    /// written. Prints `created|updated|unchanged|deleted zone/<z>|cluster/<z>/<c>`.
    Apply(ApplyArgs),
    /// Delete a cluster from a zone, or a zone with all its clusters.
    Delete {
        #[command(subcommand)]
        what: DeleteWhat,
    },
    /// Read or set the log level of a cluster's sidecars (every instance, or one).
    LogLevel(LogLevelArgs),
    /// Show who calls whom: nodes and edges as tables, the API's JSON, or Graphviz dot.
    Graph(GraphArgs),
    /// Show what changed: the catalog's history, newest first.
    History(HistoryArgs),
    /// Print one line per catalog event as it happens, until interrupted (Ctrl-C).
    Watch(WatchArgs),
    /// Show each sidecar's sync with its zone's control server, in the manner of
    /// `istioctl proxy-status`. Exits 1 when a sidecar listed is stale or rejected.
    Sync(SyncArgs),
    /// List the mesh's workload certificates, soonest expiry first. Exits 1 when a
    /// listed certificate is expired, rotation-overdue, or expiring (by the
    /// aggregator's --cert-warning, or within --expiring).
    Certs(CertsArgs),
    /// Check the mesh in the manner of `linkerd check`: API reachable and ready,
    /// versions, token, agents per zone, clusters down or drifted, agent rejections,
    /// control servers connected, sidecars in sync. Exits 1 when an item fails.
    Check,
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Run the mesh troubleshooting playbook for a cluster and print a checklist.
    /// Exits 0 when every step passed, 1 when a step failed, 2 when the diagnosis
    /// could not be run.
    Diagnose(DiagnoseArgs),
    /// Print Kubernetes objects with the agent added as a sidecar container to every
    /// Deployment, StatefulSet and DaemonSet, in the manner of `linkerd inject`
    /// (`meshcat inject -f app.yaml | kubectl apply -f -`). Other objects pass through
    /// as they are. Reads only the file: no API is called.
    Inject(InjectArgs),
}

/// How records are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned columns with a header line, cut to the terminal's width.
    Table,
    /// What the API answers, as is (an array for lists).
    Json,
    /// The same data as YAML.
    Yaml,
}

/// The flag of commands that print records.
#[derive(Debug, Clone, Copy, Args)]
pub struct OutputArg {
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Format,
}

#[derive(Debug, Subcommand)]
pub enum GetWhat {
    /// Registered clusters (`ZONE CLUSTER OWNER STATUS INSTANCES VERSION`).
    Clusters {
        /// Only this zone's.
        #[arg(long)]
        zone: Option<String>,
        /// Only clusters with this status.
        #[arg(long, value_enum)]
        status: Option<StatusArg>,
        /// Only this owner's.
        #[arg(long)]
        owner: Option<String>,
        #[command(flatten)]
        output: OutputArg,
    },
    /// Registered zones (`ZONE SERVER-ADDRESS REQUEST-CLUSTER TLS CONTROL`).
    Zones {
        #[command(flatten)]
        output: OutputArg,
    },
    /// One cluster (one row per zone that has it without --zone).
    Cluster {
        /// The clusterName.
        name: String,
        /// Its zone.
        #[arg(long)]
        zone: Option<String>,
        #[command(flatten)]
        output: OutputArg,
    },
}

/// A cluster status, as the API spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusArg {
    Stable,
    Warning,
    Down,
}

impl StatusArg {
    pub fn as_str(self) -> &'static str {
        match self {
            StatusArg::Stable => "stable",
            StatusArg::Warning => "warning",
            StatusArg::Down => "down",
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum DescribeWhat {
    /// One cluster of one zone.
    Cluster {
        /// The clusterName.
        name: String,
        /// Its zone.
        #[arg(long)]
        zone: String,
    },
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// A YAML or JSON file, a directory (its .yaml, .yml and .json files), or `-`
    /// for YAML on standard input. Repeatable.
    #[arg(short = 'f', long = "filename", value_name = "PATH", required = true)]
    pub files: Vec<PathBuf>,
    /// Also delete the clusters of the zones the files name that the files do not list.
    #[arg(long)]
    pub prune: bool,
    /// Print what would be done and write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Subcommand)]
pub enum DeleteWhat {
    /// One cluster of one zone.
    Cluster {
        /// The clusterName.
        name: String,
        /// Its zone.
        #[arg(long)]
        zone: String,
    },
    /// A zone; its clusters are deleted with it.
    Zone {
        /// The zoneName.
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct LogLevelArgs {
    #[command(subcommand)]
    pub action: LogLevelAction,
}

#[derive(Debug, Subcommand)]
pub enum LogLevelAction {
    /// Print each instance's level.
    Get {
        #[command(flatten)]
        target: LogTarget,
    },
    /// Set the level of every instance (or of --instance).
    Set {
        /// The new level.
        #[arg(value_enum)]
        level: Level,
        #[command(flatten)]
        target: LogTarget,
    },
}

/// Whose sidecars.
#[derive(Debug, Args)]
pub struct LogTarget {
    /// The zone.
    #[arg(long)]
    pub zone: String,
    /// The cluster.
    #[arg(long)]
    pub cluster: String,
    /// Only this instance (every live instance of the cluster without it).
    #[arg(long)]
    pub instance: Option<String>,
    #[command(flatten)]
    pub output: OutputArg,
}

/// A sidecar log level, as the API spells it (`warn` is Envoy's `warning`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

#[derive(Debug, Args)]
pub struct GraphArgs {
    /// Only this zone's clusters and the edges that reach them.
    #[arg(long)]
    pub zone: Option<String>,
    /// Only the nodes around this cluster (needs --zone).
    #[arg(long, requires = "zone")]
    pub cluster: Option<String>,
    /// Hops around --cluster, 1 to 5 (the API's default is 1).
    #[arg(long, requires = "cluster", value_parser = clap::value_parser!(u32).range(1..=5))]
    pub depth: Option<u32>,
    /// table: nodes and edges; json: the API's graph object; dot: Graphviz input.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: GraphFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    Table,
    Json,
    Dot,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Only this zone's entries.
    #[arg(long)]
    pub zone: Option<String>,
    /// Only this cluster's entries.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Only entries from this long ago on (`30m`, `1h`, `2d`).
    #[arg(long, value_parser = parse_positive_duration)]
    pub since: Option<Duration>,
    /// At most this many entries, 1 to 1000 (the API's default is 100).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: Option<u32>,
    #[command(flatten)]
    pub output: OutputArg,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Only this zone's events.
    #[arg(long)]
    pub zone: Option<String>,
    /// Only this cluster's events.
    #[arg(long)]
    pub cluster: Option<String>,
    /// table: one line per event; json: one JSON object per event and line.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: WatchFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WatchFormat {
    Table,
    Json,
}

#[derive(Debug, Args)]
pub struct SyncArgs {
    /// Only this zone's sidecars.
    #[arg(long)]
    pub zone: Option<String>,
    /// Only this cluster's sidecars.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Only sidecars in this state.
    #[arg(long, value_enum)]
    pub state: Option<SyncStateArg>,
    #[command(flatten)]
    pub output: OutputArg,
}

/// A sidecar's sync state, as the API spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SyncStateArg {
    Synced,
    Stale,
    Rejected,
    Disconnected,
    Unknown,
}

impl SyncStateArg {
    pub fn as_str(self) -> &'static str {
        match self {
            SyncStateArg::Synced => "synced",
            SyncStateArg::Stale => "stale",
            SyncStateArg::Rejected => "rejected",
            SyncStateArg::Disconnected => "disconnected",
            SyncStateArg::Unknown => "unknown",
        }
    }
}

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Only this zone's instances.
    #[arg(long)]
    pub zone: Option<String>,
    /// Only this cluster's instances.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Only certificates that expire within this time (`7d`, `36h`), the expired
    /// ones included; each listed one then fails the command.
    #[arg(long, value_parser = parse_positive_duration)]
    pub expiring: Option<Duration>,
    /// table: one row per certificate; wide: with serial, secret, start and owner;
    /// json, yaml: the API's answer.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: CertsFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CertsFormat {
    Table,
    Wide,
    Json,
    Yaml,
}

#[derive(Debug, Args)]
pub struct DiagnoseArgs {
    /// The cluster (clusterName) to diagnose.
    pub cluster: String,
    /// The zone (mesh) the cluster belongs to.
    #[arg(long)]
    pub zone: String,
    /// The symptom seen: upstream_connect_error, no_healthy_upstream,
    /// ingress_502_503 or missing_metrics. Without it every check runs.
    #[arg(long)]
    pub symptom: Option<String>,
    /// The request path that fails, to filter the sidecar logs of the cluster on
    /// (the clusters followed are read whole).
    #[arg(long)]
    pub path: Option<String>,
    /// Raise the sidecars of the cluster and its edge to debug for that many seconds
    /// (1 to 300) before collecting, to catch TLS failures; replay the failing
    /// request meanwhile. The clusters followed are read without a window.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_DEBUG_WINDOW_SECONDS)))]
    pub debug_seconds: Option<u32>,
    /// Follow failing calls to the clusters called, diagnosing at most this many
    /// clusters in all (1 to 5; the server's default is 3).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=5))]
    pub max_hops: Option<u8>,
    /// text: a checklist; json: the API's report as is.
    #[arg(short, long, value_enum, default_value = "text")]
    pub output: DiagnoseFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiagnoseFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct InjectArgs {
    /// A YAML or JSON file of Kubernetes objects (documents separated by `---`, or a
    /// List), or `-` for standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: PathBuf,
    /// The agent's container image.
    #[arg(long, default_value = "meshcat:latest", value_parser = parse_image)]
    pub image: String,
    /// The aggregator's QUIC address (host:port), or a comma-separated list of
    /// replicas: the agent's MESHCAT_AGGREGATOR.
    #[arg(long, default_value = "meshcat-aggregator.meshcat.svc:9443", value_parser = parse_aggregators)]
    pub aggregator: String,
    /// The name the aggregator's certificate carries: the agent's
    /// MESHCAT_SERVER_NAME [default: the host of the first --aggregator address].
    #[arg(long, value_parser = parse_server_name)]
    pub server_name: Option<String>,
    /// The Secret holding the agent's client certificate and the aggregator's CA
    /// (keys tls.crt, tls.key, ca.crt), mounted at /etc/meshcat/tls.
    #[arg(long, default_value = "meshcat-agent-tls", value_parser = parse_object_name)]
    pub tls_secret: String,
    /// The Secret holding the bearer token of the agent's ops port (key ops-token),
    /// mounted at /etc/meshcat/ops-token.
    #[arg(long, default_value = "meshcat-agent-ops-token", value_parser = parse_object_name)]
    pub ops_token_secret: String,
    /// A ConfigMap of further MESHCAT_* settings the agent reads as environment
    /// (optional: the pod starts without it); the settings inject writes win over
    /// it. An empty value leaves it out.
    #[arg(long, default_value = "meshcat-agent-sidecar", value_parser = parse_config_map)]
    pub config_map: String,
    /// The agent's ops port (probes, /metrics, /logging) on the pod IP; it must not be
    /// a port of the pod's other containers.
    #[arg(long, default_value_t = 9092, value_parser = clap::value_parser!(u16).range(1..))]
    pub ops_port: u16,
}

/// The host of the first address of a list [`parse_aggregators`] checked (an IPv6
/// address without its brackets).
pub fn aggregator_host(list: &str) -> &str {
    let first = list.split(',').next().unwrap_or("");
    let host = first.rsplit_once(':').map_or(first, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// Checks a name the aggregator's certificate carries: a DNS name or an IP address,
/// printable ASCII without spaces.
pub fn parse_server_name(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > MAX_NAME_LEN || !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("{s:?} is not a DNS name or an IP address"));
    }
    Ok(s.to_owned())
}

/// Longest image reference taken.
const MAX_IMAGE: usize = 4096;

/// Checks a container image reference: printable ASCII without spaces.
pub fn parse_image(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > MAX_IMAGE || !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("{s:?} is not an image reference"));
    }
    Ok(s.to_owned())
}

/// Checks the name of a Secret or a ConfigMap as Kubernetes does (a DNS subdomain:
/// 1 to 253 lowercase letters, digits, `-` and `.`, starting and ending with a letter
/// or a digit).
pub fn parse_object_name(s: &str) -> Result<String, String> {
    let plain = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let ok = s.len() <= MAX_NAME_LEN
        && s.as_bytes().first().is_some_and(plain)
        && s.as_bytes().last().is_some_and(plain)
        && s.bytes().all(|b| plain(&b) || matches!(b, b'-' | b'.'));
    if ok {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is not a Kubernetes object name (lowercase letters, digits, - and .)"
        ))
    }
}

/// A ConfigMap name, or empty for none.
fn parse_config_map(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Ok(String::new())
    } else {
        parse_object_name(s)
    }
}
