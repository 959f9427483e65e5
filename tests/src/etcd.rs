//! A real etcd cluster for the replica tests: three members of Debian's `etcd` (3.4)
//! on 127.0.0.1 with ports learned at run time, each member stoppable and
//! restartable on its data directory (quorum-loss tests), all killed on drop.
//! Optionally its clients speak TLS and must present a client certificate.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::envoy::Process;
use crate::ports::free_port;
use crate::wait_for;

/// How long a member (or the cluster) gets to answer `/health`.
const HEALTH_DEADLINE: Duration = Duration::from_secs(30);

/// The etcd binary: `MESHCAT_ETCD`, else `etcd` on PATH, else `/usr/bin/etcd`. A
/// missing one fails the test with the way to install it: these tests never skip.
pub fn etcd_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("MESHCAT_ETCD").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("etcd"))
            .find(|p| p.is_file())
    });
    if let Some(p) =
        on_path.or_else(|| Some(PathBuf::from("/usr/bin/etcd")).filter(|p| p.is_file()))
    {
        return Ok(p);
    }
    bail!(
        "etcd not found{}: install Debian's etcd-server and etcd-client \
         (scripts/deps.sh etcd; scripts/test.sh does it)",
        if std::env::var("CI").as_deref() == Ok("true") {
            " under CI=true"
        } else {
            ""
        }
    )
}

/// One member: its ports, data directory and process.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Plain-HTTP `/health` and `/metrics`, also when clients speak TLS.
    metrics_port: u16,
    data_dir: PathBuf,
    log_file: PathBuf,
    process: Option<Process>,
}

/// The files of an etcd cluster whose clients speak TLS with client certificates.
#[derive(Debug, Clone)]
pub struct EtcdTlsFiles {
    /// The CA that signed the members' and the client's certificates.
    pub ca_file: PathBuf,
    /// The members' server certificate (for 127.0.0.1) and key.
    server: crate::certs::Identity,
    /// A client certificate the members accept, and its key.
    pub client: crate::certs::Identity,
}

/// A three-member etcd cluster on loopback.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    tls: Option<EtcdTlsFiles>,
    initial_cluster: String,
    /// `--quota-backend-bytes`, when not etcd's default.
    quota: Option<u64>,
    /// Holds every member's data and log; removed on drop.
    _dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl EtcdCluster {
    /// Starts three members and waits until the cluster answers with a leader.
    pub async fn start() -> anyhow::Result<EtcdCluster> {
        Self::start_n(3).await
    }

    /// Starts `n` members and waits until every one answers `/health`.
    pub async fn start_n(n: usize) -> anyhow::Result<EtcdCluster> {
        Self::start_with(n, false, None).await
    }

    /// Starts `n` members whose clients must speak TLS and present a certificate
    /// signed by the cluster's CA ([`Self::tls`]).
    pub async fn start_tls(n: usize) -> anyhow::Result<EtcdCluster> {
        Self::start_with(n, true, None).await
    }

    /// Starts one member whose space quota (`--quota-backend-bytes`) is `bytes`: past
    /// it etcd raises its `NOSPACE` alarm and refuses every write.
    pub async fn start_quota(bytes: u64) -> anyhow::Result<EtcdCluster> {
        Self::start_with(1, false, Some(bytes)).await
    }

    async fn start_with(n: usize, tls: bool, quota: Option<u64>) -> anyhow::Result<EtcdCluster> {
        let binary = etcd_binary()?;
        let dir = tempfile::Builder::new().prefix("meshcat-etcd-").tempdir()?;
        let tls = if tls {
            let certs = crate::certs::MeshCerts::new(dir.path(), "etcd")?;
            Some(EtcdTlsFiles {
                ca_file: certs.ca_file.clone(),
                server: certs.identity("127.0.0.1")?,
                client: certs.identity("meshcat-aggregator")?,
            })
        } else {
            None
        };
        let mut members = Vec::new();
        for i in 0..n {
            members.push(Member {
                name: format!("m{i}"),
                client_port: free_port()?,
                peer_port: free_port()?,
                metrics_port: free_port()?,
                data_dir: dir.path().join(format!("m{i}")),
                log_file: dir.path().join(format!("m{i}.log")),
                process: None,
            });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members,
            tls,
            initial_cluster,
            quota,
            _dir: dir,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(3))
                .build()?,
        };
        for i in 0..n {
            cluster.spawn(&binary, i)?;
        }
        for i in 0..n {
            cluster.wait_healthy(i).await?;
        }
        Ok(cluster)
    }

    fn spawn(&mut self, binary: &Path, i: usize) -> anyhow::Result<()> {
        let m = &mut self.members[i];
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", m.client_port);
        let metrics = format!("http://127.0.0.1:{}", m.metrics_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log_file)?;
        let mut cmd = Command::new(binary);
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-metrics-urls", &metrics])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "meshcat-test"])
            // Loopback: short heartbeats make leader changes quick, the election
            // timeout stays wide enough for a loaded two-core machine.
            .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
            // Bulk registrations are one transaction: room for 1000 records.
            .args(["--max-txn-ops", "4096"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .env("ETCD_UNSUPPORTED_ARCH", std::env::consts::ARCH);
        if let Some(bytes) = self.quota {
            cmd.arg("--quota-backend-bytes").arg(bytes.to_string());
        }
        if let Some(t) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&t.server.cert_file)
                .arg("--key-file")
                .arg(&t.server.key_file)
                .arg("--trusted-ca-file")
                .arg(&t.ca_file)
                .arg("--client-cert-auth");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log));
        m.process = Some(Process::spawn(cmd).context("cannot start etcd")?);
        Ok(())
    }

    /// Waits until member `i` answers `/health` with `true`. A member that exits
    /// (a port taken, a bad flag) fails at once; either failure quotes its log.
    async fn wait_healthy(&self, i: usize) -> anyhow::Result<()> {
        let m = &self.members[i];
        let url = format!("http://127.0.0.1:{}/health", m.metrics_port);
        let waited = wait_for(
            &format!("etcd member {i} healthy"),
            HEALTH_DEADLINE,
            || async {
                if let Some(status) = m.process.as_ref().and_then(|p| p.exit_status()) {
                    return Some(Err(status));
                }
                let r = self.http.get(&url).send().await.ok()?;
                let v: serde_json::Value = r.json().await.ok()?;
                (v["health"] == "true").then_some(Ok(()))
            },
        )
        .await;
        let failure = match waited {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(status)) => format!("etcd member {i} exited ({status})"),
            Err(timeout) => timeout.to_string(),
        };
        bail!(
            "{failure}; the end of its log {}:\n{}",
            m.log_file.display(),
            log_tail(&m.log_file)
        )
    }

    /// `host:port` of every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// Runs Debian's `etcdctl` (v3 API) against the cluster, with the client
    /// certificate when it speaks TLS, and answers what it printed. Tests use it to
    /// read and write keys as someone who reached etcd would.
    pub fn etcdctl(&self, args: &[&str]) -> anyhow::Result<String> {
        let bin = etcd_binary()?.with_file_name("etcdctl");
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let endpoints = self
            .endpoints()
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut cmd = Command::new(&bin);
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .arg("--command-timeout=5s");
        if let Some(t) = &self.tls {
            cmd.arg("--cacert")
                .arg(&t.ca_file)
                .arg("--cert")
                .arg(&t.client.cert_file)
                .arg("--key")
                .arg(&t.client.key_file);
        }
        let out = cmd
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", bin.display()))?;
        if !out.status.success() {
            bail!(
                "etcdctl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The TLS files, when the cluster was started with [`Self::start_tls`].
    pub fn tls(&self) -> Option<&EtcdTlsFiles> {
        self.tls.as_ref()
    }

    /// The aggregator's `--store` value for this cluster under `prefix`.
    pub fn store_url(&self, prefix: &str) -> String {
        format!("etcd://{}{prefix}", self.endpoints().join(","))
    }

    /// Kills member `i` (SIGKILL); its data directory stays.
    pub fn stop(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].process.take() {
            p.kill();
        }
    }

    /// Starts a stopped member again on its data directory and ports and waits until
    /// it answers `/health` (which needs a quorum).
    pub async fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        if self.members[i].process.is_some() {
            bail!("etcd member {i} is running");
        }
        self.spawn(&etcd_binary()?, i)?;
        Ok(())
    }

    /// Waits until every running member reports itself healthy (a leader exists).
    pub async fn wait_healthy_all(&self) -> anyhow::Result<()> {
        for (i, m) in self.members.iter().enumerate() {
            if m.process.is_some() {
                self.wait_healthy(i).await?;
            }
        }
        Ok(())
    }
}

/// The last lines of a log, for an error message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
