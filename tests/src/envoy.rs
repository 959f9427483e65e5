//! A real Envoy process for tests. Envoy 1.40 sets `PR_SET_PDEATHSIG`, so each
//! process is spawned from a dedicated thread that owns the `Child` and lives
//! until the handle is dropped (which kills Envoy). Ports are learned from Envoy:
//! the admin address from `--admin-address-path`, listeners from
//! `/listeners?format=json`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::bootstrap::Bootstrap;

/// How long an Envoy gets to become LIVE.
pub const START_DEADLINE: Duration = Duration::from_secs(30);

/// The Envoy binary: `MESHCAT_ENVOY`, else the one `scripts/envoy.sh` installs into
/// `<workspace>/.venv`. A missing binary is an error that says how to install it:
/// tests never skip silently.
pub fn envoy_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("MESHCAT_ENVOY").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!(
            "MESHCAT_ENVOY={} is not a file; run scripts/envoy.sh",
            p.display()
        );
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let lib = root.join(".venv/lib");
    if let Ok(dir) = std::fs::read_dir(&lib) {
        for entry in dir.flatten() {
            let candidate = entry.path().join("site-packages/envoy/_bin/envoy");
            if entry.file_name().to_string_lossy().starts_with("python") && candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    bail!(
        "Envoy not found: set MESHCAT_ENVOY or run scripts/envoy.sh to install it into {}",
        root.join(".venv").display()
    )
}

/// Base ids must differ between Envoys running at once (shared memory names).
pub(crate) fn next_base_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    (std::process::id() % 100_000) * 100 + NEXT.fetch_add(1, Ordering::Relaxed) % 100
}

/// The shared memory file an Envoy started with `--base-id base_id` creates (its hot
/// restart region, `base_id * 10 + restart epoch`). A killed Envoy leaves it behind.
pub(crate) fn shared_memory_file(base_id: u32) -> PathBuf {
    PathBuf::from(format!(
        "/dev/shm/envoy_shared_memory_{}",
        u64::from(base_id) * 10
    ))
}

/// The thread that owns a running Envoy process.
#[derive(Debug)]
pub(crate) struct Process {
    /// Sends the kill order.
    kill: mpsc::Sender<()>,
    /// Joins once Envoy is reaped.
    thread: Option<JoinHandle<()>>,
    /// Receives Envoy's exit status if it exits on its own.
    exited: mpsc::Receiver<String>,
    /// The process's id.
    pub(crate) pid: u32,
}

impl Process {
    pub(crate) fn spawn(cmd: Command) -> anyhow::Result<Self> {
        Self::spawn_leaving(cmd, None)
    }

    /// Like [`Process::spawn`]; `leftover` (a file the process leaves when killed) is
    /// removed once it has exited.
    pub(crate) fn spawn_leaving(
        mut cmd: Command,
        leftover: Option<PathBuf>,
    ) -> anyhow::Result<Self> {
        let (kill_tx, kill_rx) = mpsc::channel::<()>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<u32, String>>();
        let (exit_tx, exit_rx) = mpsc::channel::<String>();
        let thread = std::thread::spawn(move || {
            let mut child = match cmd.spawn() {
                Ok(c) => {
                    let _ = ready_tx.send(Ok(c.id()));
                    c
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    let _ = exit_tx.send(status.to_string());
                    break;
                }
                match kill_rx.recv_timeout(Duration::from_millis(50)) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
            if let Some(f) = leftover {
                let _ = std::fs::remove_file(f);
            }
        });
        match ready_rx.recv() {
            Ok(Ok(pid)) => Ok(Self {
                kill: kill_tx,
                thread: Some(thread),
                exited: exit_rx,
                pid,
            }),
            Ok(Err(e)) => bail!("cannot start Envoy: {e}"),
            Err(_) => bail!("the Envoy thread ended before starting Envoy"),
        }
    }

    pub(crate) fn exit_status(&self) -> Option<String> {
        self.exited.try_recv().ok()
    }

    pub(crate) fn kill(&mut self) {
        let _ = self.kill.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A running (or stopped) Envoy with its files in its own temporary directory.
#[derive(Debug)]
pub struct Envoy {
    /// What it runs; ports are pinned to the learned ones after the first start.
    bootstrap: Bootstrap,
    /// Holds the bootstrap, logs and admin address file; removed on drop.
    dir: tempfile::TempDir,
    /// The process, when running.
    process: Option<Process>,
    /// Admin API address.
    pub admin: SocketAddr,
    /// Listener addresses by listener name.
    pub listeners: BTreeMap<String, SocketAddr>,
    /// Whether it runs in a network namespace of its own (loopback only), reached
    /// from the test through that namespace.
    isolated: bool,
}

impl Envoy {
    /// Starts Envoy with `bootstrap` and waits until it is LIVE.
    pub async fn start(bootstrap: Bootstrap) -> anyhow::Result<Self> {
        Self::start_in(bootstrap, false).await
    }

    /// Starts Envoy in a network namespace of its own (`unshare --net`, loopback up),
    /// like a pod's sidecar whose admin stays on the pod's loopback: nothing outside
    /// the namespace reaches its ports. Needs root, `unshare` (util-linux) and `ip`
    /// (iproute2); a missing one is an error, never a skip.
    pub async fn start_isolated(bootstrap: Bootstrap) -> anyhow::Result<Self> {
        for (tool, version) in [("unshare", "--version"), ("ip", "-V")] {
            let found = Command::new(tool)
                .arg(version)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !found {
                bail!(
                    "{tool} is needed to start an Envoy in a network namespace of its own (Debian: util-linux, iproute2)"
                );
            }
        }
        Self::start_in(bootstrap, true).await
    }

    async fn start_in(bootstrap: Bootstrap, isolated: bool) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("meshcat-envoy-")
            .tempdir()?;
        let mut envoy = Self {
            bootstrap,
            dir,
            process: None,
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            listeners: BTreeMap::new(),
            isolated,
        };
        envoy.launch().await?;
        Ok(envoy)
    }

    /// The process's id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.pid)
    }

    /// The network namespace file of an Envoy started with [`Envoy::start_isolated`]
    /// (`/proc/<pid>/ns/net`), while running.
    pub fn netns_path(&self) -> Option<PathBuf> {
        self.pid()
            .filter(|_| self.isolated)
            .map(|pid| PathBuf::from(format!("/proc/{pid}/ns/net")))
    }

    /// Envoy's own log (`--log-path`).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("envoy.log")
    }

    /// The access log of every HTTP listener.
    pub fn access_log_path(&self) -> PathBuf {
        self.dir.path().join("access.log")
    }

    /// A directory for files the test wants beside this Envoy.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The admin address as `host:port`.
    pub fn admin_addr(&self) -> String {
        self.admin.to_string()
    }

    /// A listener's address; panics with the known names if absent.
    pub fn listener(&self, name: &str) -> SocketAddr {
        *self
            .listeners
            .get(name)
            .unwrap_or_else(|| panic!("no listener {name:?}; have {:?}", self.listeners.keys()))
    }

    /// `http://<listener address>` of a listener.
    pub fn url(&self, listener: &str) -> String {
        format!("http://{}", self.listener(listener))
    }

    /// Envoy's own log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The access log so far.
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.access_log_path()).unwrap_or_default()
    }

    async fn launch(&mut self) -> anyhow::Result<()> {
        let bin = envoy_binary()?;
        let admin_file = self.dir.path().join("admin-address.txt");
        let _ = std::fs::remove_file(&admin_file);
        let config = self.dir.path().join("bootstrap.json");
        let json = self.bootstrap.render(&self.access_log_path());
        std::fs::write(&config, serde_json::to_vec_pretty(&json)?)?;
        let mut cmd = if self.isolated {
            // unshare and sh exec in turn, so Envoy is the spawned process itself (its
            // parent-death signal follows the spawning thread) and its PID names the
            // namespace.
            let mut c = Command::new("unshare");
            c.args([
                "--net",
                "--",
                "sh",
                "-c",
                r#"ip link set lo up && exec "$0" "$@""#,
            ])
            .arg(bin);
            c
        } else {
            Command::new(bin)
        };
        let base_id = next_base_id();
        cmd.arg("-c")
            .arg(&config)
            .arg("--base-id")
            .arg(base_id.to_string())
            .arg("--admin-address-path")
            .arg(&admin_file)
            .arg("--log-path")
            .arg(self.log_path())
            .arg("--file-flush-interval-msec")
            .arg("200")
            .arg("--concurrency")
            .arg("2")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.process = Some(Process::spawn_leaving(
            cmd,
            Some(shared_memory_file(base_id)),
        )?);
        let deadline = Instant::now() + START_DEADLINE;
        let admin = loop {
            if let Some(status) = self.process.as_ref().and_then(Process::exit_status) {
                self.process = None;
                bail!(
                    "Envoy exited ({status}) before it was ready; its log:\n{}",
                    tail(&self.log())
                );
            }
            if let Some(addr) = std::fs::read_to_string(&admin_file)
                .ok()
                .and_then(|s| s.trim().parse::<SocketAddr>().ok())
            {
                break addr;
            }
            if Instant::now() > deadline {
                bail!(
                    "Envoy did not write its admin address in time; its log:\n{}",
                    tail(&self.log())
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        self.admin = admin;
        loop {
            if let Some(status) = self.process.as_ref().and_then(Process::exit_status) {
                self.process = None;
                bail!(
                    "Envoy exited ({status}) while starting; its log:\n{}",
                    tail(&self.log())
                );
            }
            let live = async {
                let text = self.admin_request(false, "/server_info").await.ok()?;
                let v: serde_json::Value = serde_json::from_str(&text).ok()?;
                Some(v["state"] == "LIVE")
            };
            if live.await == Some(true) {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "Envoy did not become LIVE in time; its log:\n{}",
                    tail(&self.log())
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let v: serde_json::Value =
            serde_json::from_str(&self.admin_request(false, "/listeners?format=json").await?)?;
        self.listeners.clear();
        for l in v["listener_statuses"].as_array().into_iter().flatten() {
            let sa = &l["local_address"]["socket_address"];
            let addr: SocketAddr = format!(
                "{}:{}",
                sa["address"].as_str().unwrap_or_default(),
                sa["port_value"].as_u64().unwrap_or_default()
            )
            .parse()
            .context("listener address")?;
            self.listeners
                .insert(l["name"].as_str().unwrap_or_default().to_owned(), addr);
        }
        // A restart keeps the ports the first start learned.
        self.bootstrap.admin_port = admin.port();
        for l in &mut self.bootstrap.listeners {
            if let Some(addr) = self.listeners.get(&l.name) {
                l.port = addr.port();
            }
        }
        Ok(())
    }

    /// Whether the process is running.
    pub fn is_running(&self) -> bool {
        self.process
            .as_ref()
            .is_some_and(|p| p.exit_status().is_none())
    }

    /// Kills Envoy (SIGKILL) and waits until it is gone; its ports close.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }

    /// Kills and starts again on the same admin and listener ports.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.launch().await
    }

    /// Kills and starts again with another configuration, on the same admin port
    /// and the same ports for listeners of the same names (a rollout of a new
    /// configuration to this sidecar).
    pub async fn restart_with(&mut self, mut bootstrap: Bootstrap) -> anyhow::Result<()> {
        self.kill();
        bootstrap.admin_port = self.bootstrap.admin_port;
        for l in &mut bootstrap.listeners {
            if let Some(old) = self.bootstrap.listeners.iter().find(|o| o.name == l.name) {
                l.port = old.port;
            }
        }
        self.bootstrap = bootstrap;
        self.launch().await
    }

    /// POSTs to the admin API and returns the body (for example `/logging`).
    pub async fn admin_post(&self, path: &str) -> anyhow::Result<String> {
        self.admin_request(true, path).await
    }

    /// GETs from the admin API and returns the body.
    pub async fn admin_get(&self, path: &str) -> anyhow::Result<String> {
        self.admin_request(false, path).await
    }

    /// One admin call within 2 s, from inside Envoy's namespace when it has its own.
    async fn admin_request(&self, post: bool, path: &str) -> anyhow::Result<String> {
        let call = async {
            match self.netns_path() {
                Some(ns) => crate::netns::http_in(&ns, &self.admin_addr(), post, path).await,
                None => {
                    let url = format!("http://{}{path}", self.admin);
                    let client = reqwest::Client::new();
                    let req = if post {
                        client.post(url)
                    } else {
                        client.get(url)
                    };
                    Ok(req.send().await?.text().await?)
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(2), call)
            .await
            .context("the admin API answers within 2 s")?
    }

    /// The level every logger has, read with `POST /logging` (None when mixed).
    pub async fn uniform_log_level(&self) -> anyhow::Result<Option<String>> {
        let text = self.admin_post("/logging").await?;
        let levels: std::collections::BTreeSet<&str> = text
            .lines()
            .skip_while(|l| l.trim() != "active loggers:")
            .skip(1)
            .filter_map(|l| l.trim().split_once(": ").map(|(_, lvl)| lvl))
            .collect();
        Ok(if levels.len() == 1 {
            levels.into_iter().next().map(str::to_owned)
        } else {
            None
        })
    }
}

/// The last lines of a log, for error messages.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
