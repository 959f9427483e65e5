//! Real Envoys configured over ADS by a control server: their bootstrap (ADS over
//! gRPC to a static HTTP/2 cluster `xds`, CDS and LDS from ADS, a node of their
//! own, admin on 127.0.0.1 port 0, static listeners and clusters when given) and
//! the process, spawned like [`crate::Envoy`]'s and killed when dropped, with
//! readers for what tests look at (hosts of a cluster, a listener's address, stats,
//! the log).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::bootstrap::Tls;
use crate::envoy::{Process, START_DEADLINE, envoy_binary, next_base_id, shared_memory_file};

/// What an ADS bootstrap says.
#[derive(Debug, Clone)]
pub struct XdsBootstrap {
    /// `node.id`.
    pub node_id: String,
    /// `node.cluster`.
    pub node_cluster: String,
    /// The control server.
    pub server: SocketAddr,
    /// TLS (with a client certificate) to the control server; none: plaintext HTTP/2.
    pub tls: Option<Tls>,
    /// The longest wait between reconnections to the control server.
    pub max_retry: Duration,
    /// Delta xDS (`DELTA_GRPC`) instead of state of the world.
    pub delta: bool,
    /// Listeners of the bootstrap itself (raw JSON), beside what LDS brings: a
    /// sidecar's static inbound listener, say, with its certificates over SDS.
    pub static_listeners: Vec<Value>,
    /// Clusters of the bootstrap itself (raw JSON) beside `xds`.
    pub static_clusters: Vec<Value>,
}

impl XdsBootstrap {
    /// A plaintext bootstrap for node `node_id` of `node_cluster`.
    pub fn new(node_id: &str, node_cluster: &str, server: SocketAddr) -> Self {
        Self {
            node_id: node_id.to_owned(),
            node_cluster: node_cluster.to_owned(),
            server,
            tls: None,
            max_retry: Duration::from_secs(1),
            delta: false,
            static_listeners: Vec::new(),
            static_clusters: Vec::new(),
        }
    }

    /// The bootstrap as JSON.
    pub fn render(&self) -> Value {
        let ads = json!({"ads": {}, "resource_api_version": "V3"});
        let max_ms = self.max_retry.as_millis().max(100);
        let mut xds = json!({
            "name": "xds",
            "connect_timeout": "1s",
            "type": "STATIC",
            "load_assignment": {"cluster_name": "xds", "endpoints": [{"lb_endpoints": [{
                "endpoint": {"address": {"socket_address": {
                    "address": self.server.ip().to_string(), "port_value": self.server.port()}}}
            }]}]},
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}
                }
            },
        });
        if let Some(tls) = &self.tls {
            let mut socket = tls.upstream();
            socket["typed_config"]["common_tls_context"]["alpn_protocols"] = json!(["h2"]);
            xds["transport_socket"] = socket;
        }
        let mut clusters = vec![xds];
        clusters.extend(self.static_clusters.iter().cloned());
        json!({
            "node": {"id": self.node_id, "cluster": self.node_cluster},
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
            "stats_flush_interval": "0.2s",
            "dynamic_resources": {
                "ads_config": {
                    "api_type": if self.delta { "DELTA_GRPC" } else { "GRPC" },
                    "transport_api_version": "V3",
                    "grpc_services": [{
                        "envoy_grpc": {"cluster_name": "xds"},
                        "retry_policy": {"retry_back_off": {
                            "base_interval": "0.1s",
                            "max_interval": format!("{}s", max_ms as f64 / 1000.0),
                        }},
                    }],
                },
                "cds_config": ads,
                "lds_config": ads,
            },
            "static_resources": {"clusters": clusters, "listeners": self.static_listeners},
        })
    }
}

/// A running Envoy configured over ADS, with its files in a temporary directory.
#[derive(Debug)]
pub struct XdsEnvoy {
    /// Killed (and its shared memory removed) on drop, before the directory goes.
    process: Process,
    dir: tempfile::TempDir,
    /// `node.id`.
    pub node_id: String,
    /// Admin API address.
    pub admin: SocketAddr,
}

impl XdsEnvoy {
    /// Starts Envoy with `bootstrap` and waits until its admin API answers (it
    /// becomes LIVE only once its first CDS and LDS responses arrive).
    pub async fn start(bootstrap: &XdsBootstrap) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("meshcat-xds-envoy-")
            .tempdir()?;
        let config = dir.path().join("bootstrap.json");
        std::fs::write(&config, serde_json::to_vec_pretty(&bootstrap.render())?)?;
        let admin_file = dir.path().join("admin-address.txt");
        let log_path = dir.path().join("envoy.log");
        let base_id = next_base_id();
        let mut cmd = Command::new(envoy_binary()?);
        cmd.arg("-c")
            .arg(&config)
            .arg("--base-id")
            .arg(base_id.to_string())
            .arg("--admin-address-path")
            .arg(&admin_file)
            .arg("--log-path")
            .arg(&log_path)
            .arg("--file-flush-interval-msec")
            .arg("100")
            .arg("--concurrency")
            .arg("1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let process = Process::spawn_leaving(cmd, Some(shared_memory_file(base_id)))?;
        let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        let waited = crate::wait_for("Envoy's admin address", START_DEADLINE, || async {
            if let Some(status) = process.exit_status() {
                return Some(Err(status));
            }
            std::fs::read_to_string(&admin_file)
                .ok()
                .and_then(|s| s.trim().parse::<SocketAddr>().ok())
                .map(Ok)
        })
        .await;
        let admin = match waited {
            Ok(Ok(admin)) => admin,
            Ok(Err(status)) => bail!("Envoy exited ({status}); its log:\n{}", log()),
            Err(e) => bail!("{e}; Envoy's log:\n{}", log()),
        };
        Ok(Self {
            process,
            dir,
            node_id: bootstrap.node_id.clone(),
            admin,
        })
    }

    /// The agent flags that scrape this sidecar (its admin API and its log) as
    /// `instance` of (`zone`, `cluster`) every 300 ms; the flags that reach the
    /// aggregator come first, in `reach`.
    pub fn agent_args(
        &self,
        mut reach: Vec<String>,
        (zone, cluster, instance): (&str, &str, &str),
    ) -> Vec<String> {
        reach.extend(
            [
                "--sidecar-admin",
                &self.admin.to_string(),
                "--sidecar-log-file",
                &self.log_path().display().to_string(),
                "--zone",
                zone,
                "--cluster",
                cluster,
                "--instance",
                instance,
                "--interval",
                "300ms",
                "--scrape-timeout",
                "1s",
            ]
            .map(str::to_owned),
        );
        reach
    }

    /// Envoy's own log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("envoy.log")
    }

    /// Envoy's own log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Whether the process still runs.
    pub fn is_running(&self) -> bool {
        self.process.exit_status().is_none()
    }

    /// GETs from the admin API within 2 s and returns the body.
    pub async fn admin_get(&self, path: &str) -> anyhow::Result<String> {
        let url = format!("http://{}{path}", self.admin);
        let call = async { anyhow::Ok(reqwest::get(url).await?.text().await?) };
        tokio::time::timeout(Duration::from_secs(2), call)
            .await
            .context("the admin API answers within 2 s")?
    }

    /// A counter or gauge by its full name (`/stats?filter=^name$`); None when absent.
    pub async fn stat(&self, name: &str) -> anyhow::Result<Option<u64>> {
        let text = self
            .admin_get(&format!("/stats?filter=^{}$", name.replace('.', "\\.")))
            .await?;
        Ok(text.lines().find_map(|l| {
            let (n, v) = l.split_once(": ")?;
            (n == name).then(|| v.trim().parse().ok())?
        }))
    }

    /// The hosts `/clusters` lists for `cluster` (empty when Envoy has no such cluster).
    pub async fn hosts(&self, cluster: &str) -> anyhow::Result<BTreeSet<SocketAddr>> {
        let text = self.admin_get("/clusters").await?;
        Ok(text
            .lines()
            .filter_map(|l| {
                let mut parts = l.split("::");
                (parts.next()? == cluster).then_some(())?;
                parts.next()?.parse::<SocketAddr>().ok()
            })
            .collect())
    }

    /// The address listener `name` is bound to (`/listeners`), once it is (a
    /// listener whose certificates come over SDS binds when they arrive).
    pub async fn listener(&self, name: &str) -> anyhow::Result<Option<SocketAddr>> {
        let v: Value = serde_json::from_str(&self.admin_get("/listeners?format=json").await?)?;
        Ok(v["listener_statuses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|l| l["name"] == name)
            .find_map(|l| {
                let sa = &l["local_address"]["socket_address"];
                let port = sa["port_value"].as_u64().filter(|p| *p != 0)?;
                format!("{}:{port}", sa["address"].as_str()?).parse().ok()
            }))
    }

    /// `control_plane.connected_state` (1 while the ADS stream is up).
    pub async fn connected(&self) -> anyhow::Result<bool> {
        Ok(self.stat("control_plane.connected_state").await? == Some(1))
    }
}
