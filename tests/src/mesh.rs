//! A whole meshcat on one machine for end-to-end tests: the aggregator in
//! development mode ([`Catalog`], restartable on the same ports and data directory),
//! in-process agents reporting to it over real QUIC ([`MeshAgent`]), and service
//! sidecars (a real Envoy in front of a sample upstream, [`Sidecar`]).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use meshcat_aggregator::RunningAggregator;
use meshcat_aggregator::config::Config;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::{Bootstrap, Envoy, Upstream, wait_for};

/// Milliseconds since the epoch, as instance start times are written.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Sums the samples of `name` in a Prometheus text exposition whose labels include
/// every `labels` pair; `None` when no sample matches.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (label_part, value) = match rest.strip_prefix('{') {
            Some(r) => match r.split_once("} ") {
                Some((l, v)) => (l, v),
                None => continue,
            },
            None => match rest.strip_prefix(' ') {
                Some(v) => ("", v),
                None => continue,
            },
        };
        if labels
            .iter()
            .all(|(k, v)| label_part.contains(&format!("{k}=\"{v}\"")))
            && let Ok(v) = value.trim().parse::<f64>()
        {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// The aggregator under test, with `--dev` so agents authenticate with the
/// generated agent certificate.
#[derive(Debug)]
pub struct Catalog {
    /// The configuration it runs with; after the first start its addresses are the
    /// bound ones, so a restart reuses the same ports.
    pub config: Config,
    /// The running aggregator, `None` while stopped.
    running: Option<RunningAggregator>,
    /// Holds the data directory when the catalog made its own.
    _dir: Option<tempfile::TempDir>,
    /// One client for every API call.
    client: reqwest::Client,
}

impl Catalog {
    /// Starts an aggregator in development mode on 127.0.0.1 port 0 with a fresh data
    /// directory; `tune` adjusts the configuration first (TTL, tokens, refresh...).
    pub async fn start(tune: impl FnOnce(&mut Config)) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("meshcat-e2e-").tempdir()?;
        let mut config = Config::for_tests(dir.path());
        config.dev = true;
        tune(&mut config);
        let mut catalog = Catalog {
            config,
            running: None,
            _dir: Some(dir),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
        };
        catalog.launch().await?;
        Ok(catalog)
    }

    async fn launch(&mut self) -> anyhow::Result<()> {
        let running = meshcat_aggregator::start(self.config.clone()).await?;
        self.config.api.addr = running.api_addr;
        self.config.ops_addr = running.ops_addr;
        self.config.ingest.addr = running.quic_addr.context("agent ingest is off")?;
        self.running = Some(running);
        Ok(())
    }

    /// Stops the aggregator (its listeners close; the data directory stays).
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(r) = self.running.take() {
            tokio::time::timeout(Duration::from_secs(6), r.stop())
                .await
                .context("aggregator stops within 6 s")??;
        }
        Ok(())
    }

    /// Starts it again on the same API, ops and QUIC ports with the same data directory.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop().await?;
        self.launch().await
    }

    /// Starts a stopped aggregator again on the same ports and data directory.
    pub async fn resume(&mut self) -> anyhow::Result<()> {
        if self.running.is_some() {
            bail!("the aggregator is running");
        }
        self.launch().await
    }

    /// The running aggregator.
    pub fn running(&self) -> &RunningAggregator {
        self.running.as_ref().expect("aggregator running")
    }

    pub fn api_url(&self) -> String {
        format!("http://{}", self.config.api.addr)
    }

    pub fn ops_url(&self) -> String {
        format!("http://{}", self.config.ops_addr)
    }

    pub fn data_dir(&self) -> &Path {
        &self.config.store.data_dir
    }

    /// The agent flags for one sidecar, `envoy`, as `instance` of (zone, cluster),
    /// scraped every `interval`, reporting to this aggregator ([`Self::agent_args`]).
    pub fn sidecar_agent_args(
        &self,
        envoy: &Envoy,
        zone: &str,
        cluster: &str,
        instance: &str,
        interval: &str,
    ) -> Vec<String> {
        let mut args = self.agent_args();
        args.extend(
            [
                "--sidecar-admin",
                &envoy.admin_addr(),
                "--zone",
                zone,
                "--cluster",
                cluster,
                "--instance",
                instance,
                "--interval",
                interval,
            ]
            .map(str::to_owned),
        );
        args
    }

    /// The agent flags that reach this aggregator with the development certificates.
    pub fn agent_args(&self) -> Vec<String> {
        let dev = self.config.store.data_dir.join("dev");
        let file = |n: &str| dev.join(n).display().to_string();
        vec![
            "--aggregator".into(),
            self.config.ingest.addr.to_string(),
            "--ca-file".into(),
            file("ca.pem"),
            "--cert".into(),
            file("agent.pem"),
            "--key".into(),
            file("agent-key.pem"),
        ]
    }

    /// `GET path` on the API, optionally with a bearer token: status and JSON body
    /// (`Null` when the body is not JSON).
    pub async fn get_as(
        &self,
        path: &str,
        token: Option<&str>,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let mut req = self.client.get(format!("{}{path}", self.api_url()));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await?;
        let status = r.status();
        let body = r.json::<Value>().await.unwrap_or(Value::Null);
        Ok((status, body))
    }

    /// `GET path` on the API without a token.
    pub async fn get(&self, path: &str) -> anyhow::Result<(StatusCode, Value)> {
        self.get_as(path, None).await
    }

    /// `POST path` with a JSON body; fails unless the answer is 201.
    pub async fn create(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let r = self
            .client
            .post(format!("{}{path}", self.api_url()))
            .json(&body)
            .send()
            .await?;
        let status = r.status();
        let answer = r.json::<Value>().await.unwrap_or(Value::Null);
        if status != StatusCode::CREATED {
            bail!("POST {path} answered {status}: {answer}");
        }
        Ok(answer)
    }

    /// Registers a zone with `request_cluster` as its edge.
    pub async fn register_zone(&self, zone: &str, request_cluster: &str) -> anyhow::Result<()> {
        self.create(
            "/zones",
            json!({"zoneName": zone, "serverAddress": "control.local:50000", "requestCluster": request_cluster}),
        )
        .await
        .map(drop)
    }

    /// Registers `zone` managed by the control server at `server` (its
    /// serverAddress), with `request_cluster`.
    pub async fn register_zone_at(
        &self,
        zone: &str,
        server: std::net::SocketAddr,
        request_cluster: &str,
    ) -> anyhow::Result<()> {
        self.create(
            "/zones",
            json!({"zoneName": zone, "serverAddress": server.to_string(), "requestCluster": request_cluster}),
        )
        .await
        .map(drop)
    }

    /// Registers a cluster of `zone`; `extra` fields are merged into the record.
    pub async fn register_cluster(
        &self,
        zone: &str,
        cluster: &str,
        extra: Value,
    ) -> anyhow::Result<()> {
        let mut body = json!({"zoneName": zone, "clusterName": cluster, "name": cluster});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        self.create("/clusters", body).await.map(drop)
    }

    /// The cluster record of (zone, cluster) as read through `GET /clusters/{c}`.
    pub async fn cluster(&self, zone: &str, cluster: &str) -> anyhow::Result<Value> {
        let (status, body) = self
            .get(&format!("/clusters/{cluster}?zoneName={zone}"))
            .await?;
        if status != StatusCode::OK {
            bail!("GET /clusters/{cluster} answered {status}: {body}");
        }
        Ok(body.get(0).cloned().unwrap_or(Value::Null))
    }

    /// Waits until the cluster record satisfies `check`, and returns it.
    pub async fn wait_cluster(
        &self,
        what: &str,
        zone: &str,
        cluster: &str,
        deadline: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let last = std::sync::Mutex::new(Value::Null);
        let found = wait_for(what, deadline, || async {
            let c = self.cluster(zone, cluster).await.ok()?;
            let ok = check(&c);
            *last.lock().unwrap_or_else(|p| p.into_inner()) = c.clone();
            ok.then_some(c)
        })
        .await;
        found.with_context(|| {
            format!(
                "last seen: {}",
                last.lock().unwrap_or_else(|p| p.into_inner())
            )
        })
    }

    /// Waits until the history answer of `path` (`/history?...` or
    /// `/clusters/{c}/history?...`) holds an entry that `want` accepts, and returns
    /// it: entries are stored a moment after what they tell happened.
    pub async fn wait_history_entry(
        &self,
        what: &str,
        path: &str,
        deadline: Duration,
        want: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let last = std::sync::Mutex::new(Value::Null);
        let found = wait_for(what, deadline, || async {
            let (status, entries) = self.get(path).await.ok()?;
            let hit = (status == StatusCode::OK)
                .then(|| entries.as_array()?.iter().find(|e| want(e)).cloned())
                .flatten();
            *last.lock().unwrap_or_else(|p| p.into_inner()) = entries;
            hit
        })
        .await;
        found.with_context(|| {
            format!(
                "last seen: {}",
                last.lock().unwrap_or_else(|p| p.into_inner())
            )
        })
    }

    /// The aggregator's own Prometheus exposition.
    pub async fn ops_metrics(&self) -> anyhow::Result<String> {
        Ok(self
            .client
            .get(format!("{}/metrics", self.ops_url()))
            .send()
            .await?
            .text()
            .await?)
    }
}

/// Names of a cluster record's instances.
pub fn instance_names(cluster: &Value) -> Vec<String> {
    cluster["instances"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The start time of `instance` in a cluster record.
pub fn start_time(cluster: &Value, instance: &str) -> Option<i64> {
    cluster["instances"]
        .as_array()?
        .iter()
        .find(|i| i["name"] == instance)?["startTime"]
        .as_i64()
}

/// An agent running in this process (`meshcat_agent::run`) with its own ops port
/// and shutdown.
#[derive(Debug)]
pub struct MeshAgent {
    /// Its ops listener.
    pub ops: SocketAddr,
    /// Fires its shutdown.
    stop: Option<oneshot::Sender<()>>,
    /// The agent task.
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl MeshAgent {
    /// Starts an agent with `args` (flags after the program name).
    pub async fn start<S: AsRef<str>>(args: &[S]) -> anyhow::Result<Self> {
        let all = std::iter::once("meshcat-agent").chain(args.iter().map(AsRef::as_ref));
        let config = meshcat_agent::AgentConfig::try_from_args(all).map_err(anyhow::Error::msg)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let ops = listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(meshcat_agent::run(config, listener, async move {
            let _ = rx.await;
        }));
        Ok(Self {
            ops,
            stop: Some(tx),
            task: Some(task),
        })
    }

    /// Starts an agent for one sidecar reporting to `catalog` every `interval`.
    pub async fn for_sidecar(
        catalog: &Catalog,
        sidecar: &Sidecar,
        zone: &str,
        cluster: &str,
        instance: &str,
        interval: &str,
    ) -> anyhow::Result<Self> {
        Self::for_envoy(catalog, &sidecar.envoy, zone, cluster, instance, interval).await
    }

    /// Starts an agent for any Envoy reporting to `catalog` every `interval`.
    pub async fn for_envoy(
        catalog: &Catalog,
        envoy: &Envoy,
        zone: &str,
        cluster: &str,
        instance: &str,
        interval: &str,
    ) -> anyhow::Result<Self> {
        let mut args = catalog.sidecar_agent_args(envoy, zone, cluster, instance, interval);
        args.extend(["--scrape-timeout", "1s"].map(str::to_owned));
        Self::start(&args).await
    }

    pub fn ops_url(&self) -> String {
        format!("http://{}", self.ops)
    }

    /// The agent's own Prometheus exposition.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        Ok(reqwest::get(format!("{}/metrics", self.ops_url()))
            .await?
            .text()
            .await?)
    }

    /// Stops the agent (it says goodbye) and waits up to 5 s for it.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown().await
    }

    async fn shutdown(&mut self) -> anyhow::Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .context("agent stops within 5 s")???;
        }
        Ok(())
    }
}

impl Drop for MeshAgent {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// A service's sidecar: a real Envoy (`Bootstrap::service_sidecar`) in front of a
/// sample upstream, with the wall-clock window in which Envoy last started.
#[derive(Debug)]
pub struct Sidecar {
    pub upstream: Upstream,
    pub envoy: Envoy,
    /// Milliseconds since the epoch just before the last (re)start of Envoy.
    pub started_after_ms: i64,
    /// Milliseconds since the epoch once it was LIVE.
    pub started_before_ms: i64,
    /// One client for the traffic.
    client: reqwest::Client,
}

impl Sidecar {
    pub async fn start() -> anyhow::Result<Self> {
        let upstream = Upstream::start().await?;
        let started_after_ms = now_ms();
        let envoy = Envoy::start(Bootstrap::service_sidecar(upstream.addr, None)).await?;
        Ok(Self {
            upstream,
            envoy,
            started_after_ms,
            started_before_ms: now_ms(),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()?,
        })
    }

    /// Restarts Envoy (same ports) and records the new start window.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.envoy.kill();
        self.started_after_ms = now_ms();
        self.envoy.restart().await?;
        self.started_before_ms = now_ms();
        Ok(())
    }

    /// Whether `start_ms` is this Envoy's start, to within a second.
    pub fn started_at(&self, start_ms: i64) -> bool {
        start_ms >= self.started_after_ms - 1000 && start_ms <= self.started_before_ms + 1000
    }

    /// Sends `n` requests for `path` through the sidecar's ingress listener; fails
    /// unless each answers `expect`.
    pub async fn send(&self, path: &str, n: usize, expect: u16) -> anyhow::Result<()> {
        let url = format!("{}{path}", self.envoy.url("ingress"));
        for _ in 0..n {
            let r = self.client.get(&url).send().await?;
            if r.status().as_u16() != expect {
                bail!("GET {url} answered {} instead of {expect}", r.status());
            }
        }
        Ok(())
    }
}

/// A node's pod list as a DaemonSet agent reads it (`--pods-file`), written under
/// `dir` with `pods` as its items, beside an empty folder of container logs
/// (`--pod-log-dir`): the agent flags that point at both.
pub fn pods_flags(dir: &Path, pods: Vec<Value>) -> anyhow::Result<Vec<String>> {
    let logs = dir.join("pods");
    std::fs::create_dir_all(&logs)?;
    let file = dir.join("pods.json");
    std::fs::write(&file, json!({"kind": "List", "items": pods}).to_string())?;
    Ok(vec![
        "--pods-file".into(),
        file.display().to_string(),
        "--pod-log-dir".into(),
        logs.display().to_string(),
    ])
}
