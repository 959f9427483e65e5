//! Aggregator replicas as real processes on one etcd cluster: each on its own
//! 127.0.0.1 ports (kept across restarts), all with `--dev` on one shared data
//! directory so the agents' development certificate is accepted by every replica.
//! A replica can be killed with SIGKILL and started again; all are killed on drop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use reqwest::StatusCode;
use serde_json::Value;

use meshcat_aggregator::api::forward::Peers;

use crate::ports::free_port;
use crate::wait_for;

/// How long a replica gets to become ready (it loads the catalog from etcd first).
pub const READY_DEADLINE: Duration = Duration::from_secs(30);

/// One replica process.
#[derive(Debug)]
pub struct Replica {
    pub api: SocketAddr,
    /// `https` when the replicas serve their API over TLS.
    scheme: &'static str,
    pub ops: SocketAddr,
    pub quic: SocketAddr,
    args: Vec<String>,
    log_file: PathBuf,
    /// Behind a lock so a test can kill it while other tasks use the replica.
    child: std::sync::Mutex<Option<Child>>,
}

impl Replica {
    pub fn api_url(&self) -> String {
        format!("{}://{}", self.scheme, self.api)
    }

    pub fn ops_url(&self) -> String {
        format!("http://{}", self.ops)
    }

    pub fn log_file(&self) -> &std::path::Path {
        &self.log_file
    }

    pub fn is_running(&self) -> bool {
        self.lock().is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Replica {
    /// SIGKILL: no goodbye to agents, no drain.
    pub fn kill(&self) {
        if let Some(mut c) = self.lock().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Replicas sharing one etcd prefix.
#[derive(Debug)]
pub struct Replicas {
    pub replicas: Vec<Replica>,
    binary: PathBuf,
    /// The shared data directory (development certificates); removed on drop.
    dir: tempfile::TempDir,
    http: reqwest::Client,
    scheme: &'static str,
    /// The API client when the replicas serve HTTPS.
    https: Option<Peers>,
    /// A bearer token sent with every API request, when set.
    pub token: Option<String>,
}

impl Replicas {
    /// Starts `n` replicas of `binary` (the test's `CARGO_BIN_EXE_replica-aggregator`)
    /// on `store` (an `etcd://` URL) with `extra` flags, and waits until each is ready.
    pub async fn start(
        binary: &str,
        n: usize,
        store: &str,
        extra: &[&str],
    ) -> anyhow::Result<Replicas> {
        Self::start_with(binary, n, store, extra, None).await
    }

    /// Like [`Replicas::start`], with the API served over HTTPS: `extra` carries the
    /// API TLS flags, and the test's client trusts the CA certificates in `api_ca`.
    pub async fn start_https(
        binary: &str,
        n: usize,
        store: &str,
        extra: &[&str],
        api_ca: &Path,
    ) -> anyhow::Result<Replicas> {
        Self::start_with(binary, n, store, extra, Some(api_ca)).await
    }

    async fn start_with(
        binary: &str,
        n: usize,
        store: &str,
        extra: &[&str],
        api_ca: Option<&Path>,
    ) -> anyhow::Result<Replicas> {
        let dir = tempfile::Builder::new()
            .prefix("meshcat-replicas-")
            .tempdir()?;
        // HTTPS through the aggregator's own peer client: reqwest here is built
        // without TLS, for the whole workspace.
        let https = match api_ca {
            Some(ca) => Some(Peers::tls(Some(ca))?),
            None => None,
        };
        let mut set = Replicas {
            replicas: Vec::new(),
            binary: PathBuf::from(binary),
            dir,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(15))
                .build()?,
            scheme: if https.is_some() { "https" } else { "http" },
            https,
            token: None,
        };
        for i in 0..n {
            set.add(store, extra)?;
            // The first replica writes the development certificates the others
            // read: wait for it before starting them.
            if i == 0 {
                set.wait_ready(0).await?;
            }
        }
        for i in 1..n {
            set.wait_ready(i).await?;
        }
        Ok(set)
    }

    /// Adds one more replica (started, not waited for); returns its index.
    pub fn add(&mut self, store: &str, extra: &[&str]) -> anyhow::Result<usize> {
        let i = self.replicas.len();
        let api = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let ops = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let quic = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--dev".into(),
            "--store".into(),
            store.into(),
            "--api-addr".into(),
            api.to_string(),
            "--advertise-addr".into(),
            api.to_string(),
            "--ops-addr".into(),
            ops.to_string(),
            "--quic-addr".into(),
            quic.to_string(),
            "--data-dir".into(),
            self.dir.path().display().to_string(),
            "--log-format".into(),
            "json".into(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        self.replicas.push(Replica {
            api,
            scheme: self.scheme,
            ops,
            quic,
            args,
            log_file: self.dir.path().join(format!("replica-{i}.log")),
            child: std::sync::Mutex::new(None),
        });
        self.spawn(i)?;
        Ok(i)
    }

    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let r = &mut self.replicas[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&r.log_file)?;
        let child = Command::new(&self.binary)
            .args(&r.args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("cannot start {}", self.binary.display()))?;
        *r.lock() = Some(child);
        Ok(())
    }

    /// Starts a killed replica again with the same flags and ports.
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        self.replicas[i].kill();
        self.spawn(i)
    }

    /// `GET /readyz` of replica `i`: its status, or `None` when it does not answer.
    pub async fn readyz(&self, i: usize) -> Option<StatusCode> {
        let url = format!("{}/readyz", self.replicas[i].ops_url());
        self.http.get(url).send().await.ok().map(|r| r.status())
    }

    /// Waits until replica `i` answers `/readyz` with 200.
    pub async fn wait_ready(&self, i: usize) -> anyhow::Result<()> {
        let log = self.replicas[i].log_file.display().to_string();
        wait_for(
            &format!("replica {i} ready (log {log})"),
            READY_DEADLINE,
            || async { (self.readyz(i).await == Some(StatusCode::OK)).then_some(()) },
        )
        .await
    }

    /// `GET path` on replica `i`: status and JSON body (`Null` when not JSON).
    pub async fn get(&self, i: usize, path: &str) -> anyhow::Result<(StatusCode, Value)> {
        self.send(i, reqwest::Method::GET, path, None).await
    }

    /// `method path` with a JSON body on replica `i`: status and JSON body.
    pub async fn send(
        &self,
        i: usize,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let bearer = match &self.token {
            Some(t) => Some(reqwest::header::HeaderValue::from_str(&format!(
                "Bearer {t}"
            ))?),
            None => None,
        };
        if let Some(https) = &self.https {
            let mut headers = Vec::new();
            if let Some(b) = &bearer {
                headers.push((reqwest::header::AUTHORIZATION, b.clone()));
            }
            let mut bytes = Vec::new();
            if let Some(b) = body {
                headers.push((
                    reqwest::header::CONTENT_TYPE,
                    reqwest::header::HeaderValue::from_static("application/json"),
                ));
                bytes = serde_json::to_vec(b)?;
            }
            let r = https
                .send(
                    method,
                    &self.replicas[i].api.to_string(),
                    path,
                    &headers,
                    bytes.into(),
                    Duration::from_secs(15),
                )
                .await?;
            return Ok((
                r.status,
                serde_json::from_slice(&r.body).unwrap_or(Value::Null),
            ));
        }
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.replicas[i].api_url()));
        if let Some(b) = body {
            req = req.json(b);
        }
        if let Some(b) = bearer {
            req = req.header(reqwest::header::AUTHORIZATION, b);
        }
        let r = req.send().await?;
        let status = r.status();
        Ok((status, r.json().await.unwrap_or(Value::Null)))
    }

    /// `POST path` on replica `i`.
    pub async fn post(
        &self,
        i: usize,
        path: &str,
        body: &Value,
    ) -> anyhow::Result<(StatusCode, Value)> {
        self.send(i, reqwest::Method::POST, path, Some(body)).await
    }

    /// The agent flags that reach replicas `order` (in that order) with the
    /// development certificates.
    pub fn agent_args(&self, order: &[usize]) -> Vec<String> {
        let dev = self.dir.path().join("dev");
        let file = |n: &str| dev.join(n).display().to_string();
        let list = order
            .iter()
            .map(|&i| self.replicas[i].quic.to_string())
            .collect::<Vec<_>>()
            .join(",");
        vec![
            "--aggregator".into(),
            list,
            "--ca-file".into(),
            file("ca.pem"),
            "--cert".into(),
            file("agent.pem"),
            "--key".into(),
            file("agent-key.pem"),
        ]
    }
}
