//! The agent's command line (contract section 9): every flag has a `MESHCAT_*`
//! environment twin; values are checked once at start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use meshcat_common::config::{
    LogFormat, parse_aggregators, parse_bytes, parse_host_port, parse_positive_duration, size_text,
};

use crate::envoy::Netns;
use crate::logtail::{DEFAULT_MAX_BYTES, DEFAULT_MAX_LINES, MAX_HELD_BYTES, TailBounds};
use crate::target::{Target, host_name};

/// meshcat-agent: scrapes local Envoy sidecar admin APIs and reports them to the
/// meshcat aggregator over QUIC.
#[derive(Debug, Clone, Parser)]
#[command(name = "meshcat-agent", version, about, max_term_width = 100)]
pub struct AgentConfig {
    /// Aggregator QUIC address (host:port), or a comma-separated list of replicas:
    /// on losing its connection the agent moves to the next one.
    #[arg(long, env = "MESHCAT_AGGREGATOR", default_value = "127.0.0.1:9443", value_parser = parse_aggregators)]
    pub aggregator: String,
    /// Name the aggregator's certificate must carry.
    #[arg(long, env = "MESHCAT_SERVER_NAME", default_value = "localhost")]
    pub server_name: String,
    /// PEM file of the CA that signs the aggregator's certificate.
    #[arg(long, env = "MESHCAT_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// PEM certificate this agent presents (mTLS).
    #[arg(long, env = "MESHCAT_CERT", requires = "key")]
    pub cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, env = "MESHCAT_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
    /// File holding the shared agent token (instead of an agent certificate).
    #[arg(long, env = "MESHCAT_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Sidecar admin address (host:port); repeat (or comma-separate in the
    /// environment) for several sidecars.
    #[arg(long, env = "MESHCAT_SIDECAR_ADMIN", default_value = "127.0.0.1:9901", value_delimiter = ',', value_parser = parse_host_port)]
    pub sidecar_admin: Vec<String>,
    /// Zone (mesh) of the sidecars.
    #[arg(long, env = "MESHCAT_ZONE", default_value = "")]
    pub zone: String,
    /// Cluster (service) of the sidecars.
    #[arg(long, env = "MESHCAT_CLUSTER", default_value = "")]
    pub cluster: String,
    /// Instance name [default: POD_NAME, else host name and "-" and admin port]. With
    /// several sidecars, "-" and the admin port are appended to it.
    #[arg(long, env = "MESHCAT_INSTANCE")]
    pub instance: Option<String>,
    /// The sidecar's log file (Envoy --log-path or access log), tailed for diagnosis.
    #[arg(long, env = "MESHCAT_SIDECAR_LOG_FILE")]
    pub sidecar_log_file: Option<PathBuf>,
    /// Most lines of each sidecar's log the agent holds for the diagnosis (the oldest
    /// go first). A request older than the oldest line held cannot be traced: the
    /// diagnosis then skips its log checks and names this flag.
    #[arg(long, env = "MESHCAT_LOG_MAX_LINES", default_value_t = DEFAULT_MAX_LINES as u32, value_parser = clap::value_parser!(u32).range(1..=1_000_000), value_name = "N")]
    pub log_max_lines: u32,
    /// Most bytes of log text held per sidecar (at most 256MiB); the oldest lines go
    /// first.
    #[arg(long, env = "MESHCAT_LOG_MAX_BYTES", default_value = size_text(DEFAULT_MAX_BYTES as u64), value_parser = parse_held_bytes, value_name = "SIZE")]
    pub log_max_bytes: u64,
    /// The sidecar's own upstream cluster (the one that reaches the local service),
    /// left out of the dependency graph [default: found from the sidecar's inbound
    /// listener].
    #[arg(long, env = "MESHCAT_LOCAL_CLUSTER")]
    pub local_cluster: Option<String>,
    /// The network namespace the sidecar of --sidecar-admin lives in (a file such as
    /// /proc/<pid>/ns/net or /run/netns/<name>): every admin connection is opened
    /// inside it, so an admin on the pod's loopback is reached from the node. Needs
    /// CAP_SYS_ADMIN (and CAP_SYS_PTRACE for another process's /proc entry).
    #[arg(long, env = "MESHCAT_SIDECAR_NETNS")]
    pub sidecar_netns: Option<PathBuf>,
    /// JSON array of {"admin","zoneName","clusterName","instance","logFile","localCluster","netns"};
    /// re-read when it changes; replaces the single-target flags.
    #[arg(long, env = "MESHCAT_TARGETS_FILE")]
    pub targets_file: Option<PathBuf>,
    /// The node's pods as `kubectl get pods -o json` writes them (DaemonSet discovery),
    /// re-read when it changes; replaces the single-target flags. Pods labelled
    /// meshcat.io/scrape=true become targets: zone = namespace, admin = pod IP and
    /// meshcat.io/admin-port, cluster = meshcat.io/cluster, log file of the container
    /// meshcat.io/sidecar-container under --pod-log-dir.
    #[arg(long, env = "MESHCAT_PODS_FILE", conflicts_with = "targets_file")]
    pub pods_file: Option<PathBuf>,
    /// With --pods-file: reach each pod's sidecar admin at 127.0.0.1:<admin port> inside
    /// the pod's own network namespace, found in --proc-dir from a process whose cgroup
    /// names the pod's UID (for Istio, Consul and any mesh whose admin stays on the pod's
    /// loopback). Needs hostPID, CAP_SYS_ADMIN and CAP_SYS_PTRACE (the loopback-admin
    /// overlay).
    #[arg(long, env = "MESHCAT_POD_NETNS", requires_if("true", "pods_file"))]
    pub pod_netns: bool,
    /// The node's process list for --pod-netns: /proc with hostPID, or the host's /proc
    /// mounted elsewhere.
    #[arg(long, env = "MESHCAT_PROC_DIR", default_value = "/proc")]
    pub proc_dir: PathBuf,
    /// Folder of the node's container logs (kubelet's /var/log/pods) for --pods-file;
    /// a discovered log file must stay inside its own pod's folder there.
    #[arg(long, env = "MESHCAT_POD_LOG_DIR", default_value = "/var/log/pods")]
    pub pod_log_dir: PathBuf,
    /// Time between scrapes (and reports).
    #[arg(long, env = "MESHCAT_INTERVAL", default_value = "5s", value_parser = parse_positive_duration)]
    pub interval: Duration,
    /// Time between reads of each sidecar's certificates (/certs and its SDS secrets)
    /// when its configuration did not move; a configuration change (an SDS rotation
    /// included) or a restart reads them at the next scrape.
    #[arg(long, env = "MESHCAT_CERTS_INTERVAL", default_value = "60s", value_parser = parse_positive_duration)]
    pub certs_interval: Duration,
    /// Timeout of each admin API call.
    #[arg(long, env = "MESHCAT_SCRAPE_TIMEOUT", default_value = "2s", value_parser = parse_positive_duration)]
    pub scrape_timeout: Duration,
    /// Ops listener: GET /metrics, /healthz, GET and PUT /logging.
    #[arg(long, env = "MESHCAT_OPS_ADDR", default_value = "127.0.0.1:9092")]
    pub ops_addr: SocketAddr,
    /// File holding the bearer token that PUT /logging on the ops port must carry.
    /// Without it, PUT /logging answers 403 unless --ops-addr is a loopback address.
    #[arg(long, env = "MESHCAT_OPS_TOKEN_FILE")]
    pub ops_token_file: Option<PathBuf>,
    /// Header timeout and connection bound of the ops listener.
    #[command(flatten)]
    pub http: meshcat_common::http::ServerLimitArgs,
    /// Log format.
    #[arg(long, env = "MESHCAT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// A size of held log text: at least one byte, at most [`MAX_HELD_BYTES`].
fn parse_held_bytes(s: &str) -> Result<u64, String> {
    let n = parse_bytes(s)?;
    if n > MAX_HELD_BYTES as u64 {
        return Err(format!(
            "{s:?} is over {}",
            size_text(MAX_HELD_BYTES as u64)
        ));
    }
    Ok(n)
}

impl AgentConfig {
    /// How much of each sidecar's log is held.
    pub fn tail_bounds(&self) -> TailBounds {
        TailBounds {
            max_lines: self.log_max_lines as usize,
            max_bytes: usize::try_from(self.log_max_bytes).unwrap_or(MAX_HELD_BYTES),
        }
    }

    /// Parses the command line; on a bad value prints one line and exits 64, on
    /// `--help`/`--version` prints and exits 0.
    pub fn from_args() -> Self {
        match Self::try_parse() {
            Ok(c) => c,
            Err(e) if !e.use_stderr() => {
                let _ = e.print();
                std::process::exit(0);
            }
            Err(e) => {
                let text = e.to_string();
                let line = text.lines().next().unwrap_or("bad command line");
                eprintln!("meshcat-agent: {}", line.trim_start_matches("error: "));
                std::process::exit(meshcat_common::config::EXIT_USAGE);
            }
        }
    }

    /// Parses an explicit argument list (the first item is the program name).
    pub fn try_from_args<I, T>(args: I) -> Result<Self, String>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Self::try_parse_from(args).map_err(|e| e.to_string())
    }

    /// The targets given by the single-target flags (not `--targets-file`).
    pub fn flag_targets(&self) -> Vec<Target> {
        let base = self
            .instance
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok().filter(|s| !s.is_empty()));
        let several = self.sidecar_admin.len() > 1;
        self.sidecar_admin
            .iter()
            .map(|admin| {
                let port = admin.rsplit_once(':').map_or("", |(_, p)| p);
                let instance = match &base {
                    Some(b) if several => format!("{b}-{port}"),
                    Some(b) => b.clone(),
                    None => format!("{}-{port}", host_name()),
                };
                Target {
                    admin: admin.clone(),
                    zone_name: self.zone.clone(),
                    cluster_name: self.cluster.clone(),
                    instance,
                    log_file: self.sidecar_log_file.clone(),
                    local_cluster: self.local_cluster.clone(),
                    netns: self.sidecar_netns.clone().map(Netns::pinned_now),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_names() {
        let c = AgentConfig::try_parse_from([
            "meshcat-agent",
            "--sidecar-admin",
            "127.0.0.1:9901",
            "--sidecar-admin",
            "127.0.0.1:9902",
            "--instance",
            "pod-a",
            "--zone",
            "z",
        ])
        .unwrap();
        let t = c.flag_targets();
        assert_eq!(t[0].instance, "pod-a-9901");
        assert_eq!(t[1].instance, "pod-a-9902");
        assert_eq!(t[1].zone_name, "z");
        let one = AgentConfig::try_parse_from(["meshcat-agent", "--instance", "pod-b"]).unwrap();
        assert_eq!(one.flag_targets()[0].instance, "pod-b");
        assert!(AgentConfig::try_parse_from(["meshcat-agent", "--interval", "0s"]).is_err());
        // --pod-netns is for pod discovery; off, it asks for nothing.
        assert!(AgentConfig::try_parse_from(["meshcat-agent", "--pod-netns"]).is_err());
        let p = AgentConfig::try_parse_from([
            "meshcat-agent",
            "--pod-netns",
            "--pods-file",
            "/tmp/pods.json",
        ])
        .unwrap();
        assert!(p.pod_netns);
        assert!(AgentConfig::try_parse_from(["meshcat-agent", "--interval", "soon"]).is_err());
    }
}
