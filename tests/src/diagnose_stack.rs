//! A whole troubleshooting stack around a live scenario: an in-process aggregator
//! (`--dev`, short edge refresh), one in-process agent per sidecar tailing its log,
//! the zone (requestCluster = the edge) and the catalog cluster registered, with the
//! helpers the diagnosis tests read its reports with.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::scenario::{Diagnosis, Scenario, Sidecar};
use crate::wait_for;
use futures::future::BoxFuture;
use meshcat_agent::AgentConfig;
use meshcat_agent::report::{CommandHandler, Reporter, ReporterConfig, SnapshotSource};
use meshcat_aggregator::RunningAggregator;
use meshcat_aggregator::config::Config;
use meshcat_common::tls;
use meshcat_common::wire::{Command, CommandOutput, InstanceReport};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// The zone every stack registers.
pub const ZONE: &str = "local";
/// The edge's cluster (the zone's requestCluster).
pub const EDGE: &str = "edge";
/// The diagnosed service's cluster.
pub const SERVICE: &str = "catalog";

/// One Envoy-heavy test at a time: the machine has few cores.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A running agent (`meshcat_agent::run`).
#[derive(Debug)]
pub struct Agent {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Agent {
    /// Starts an agent reporting one sidecar to `agg` with the dev credentials.
    pub async fn start(
        agg: &RunningAggregator,
        data: &Path,
        sidecar: &Sidecar,
        cluster: &str,
        instance: &str,
    ) -> Agent {
        Self::start_with(agg, data, sidecar, (cluster, instance), &[]).await
    }

    /// As [`Agent::start`], with more flags.
    pub async fn start_with(
        agg: &RunningAggregator,
        data: &Path,
        sidecar: &Sidecar,
        (cluster, instance): (&str, &str),
        flags: &[&str],
    ) -> Agent {
        let dev = data.join("dev");
        let quic = agg.quic_addr.expect("ingest is on").to_string();
        let admin = sidecar.admin_addr();
        let log = sidecar.log_file.display().to_string();
        let args = vec![
            "meshcat-agent".to_owned(),
            "--aggregator".into(),
            quic,
            "--ca-file".into(),
            dev.join("ca.pem").display().to_string(),
            "--cert".into(),
            dev.join("agent.pem").display().to_string(),
            "--key".into(),
            dev.join("agent-key.pem").display().to_string(),
            "--sidecar-admin".into(),
            admin,
            "--zone".into(),
            ZONE.into(),
            "--cluster".into(),
            cluster.into(),
            "--instance".into(),
            instance.into(),
            "--sidecar-log-file".into(),
            log,
            "--interval".into(),
            "300ms".into(),
            "--scrape-timeout".into(),
            "2s".into(),
        ];
        let args: Vec<String> = args
            .into_iter()
            .chain(flags.iter().map(|f| (*f).to_owned()))
            .collect();
        let config = AgentConfig::try_from_args(args).expect("agent flags");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(meshcat_agent::run(config, listener, async move {
            let _ = rx.await;
        }));
        Agent {
            stop: Some(tx),
            task,
        }
    }

    /// Stops the agent and waits for it (it restores levels before it exits).
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        tokio::time::timeout(Duration::from_secs(6), &mut self.task)
            .await
            .expect("the agent stops within its grace")
            .expect("agent task")
            .expect("agent run");
    }
}

/// Aggregator, agents and registrations around a scenario.
#[derive(Debug)]
pub struct Stack {
    pub agg: RunningAggregator,
    pub data: tempfile::TempDir,
    pub edge_agent: Option<Agent>,
    pub service_agent: Option<Agent>,
    /// Agents added with [`Stack::add_agent`].
    pub extra_agents: Vec<Agent>,
    pub http: reqwest::Client,
}

impl Stack {
    /// Starts everything and waits until the edge and the service instance are live.
    pub async fn start(sc: &Scenario) -> Stack {
        Self::start_with(sc, |_| {}).await
    }

    /// As [`Stack::start`], with a chance to change the aggregator's configuration.
    pub async fn start_with(sc: &Scenario, tune: impl FnOnce(&mut Config)) -> Stack {
        Self::start_tuned(sc, tune, &[]).await
    }

    /// As [`Stack::start`], the service's agent run with more `flags`.
    pub async fn start_with_service_flags(sc: &Scenario, flags: &[&str]) -> Stack {
        Self::start_tuned(sc, |_| {}, flags).await
    }

    async fn start_tuned(
        sc: &Scenario,
        tune: impl FnOnce(&mut Config),
        service_flags: &[&str],
    ) -> Stack {
        let data = tempfile::tempdir().unwrap();
        let mut config = Config::for_tests(data.path());
        config.dev = true;
        config.diagnosis.edge_refresh = Duration::from_millis(500);
        config.diagnosis.command_timeout = Duration::from_secs(5);
        tune(&mut config);
        let agg = meshcat_aggregator::start(config)
            .await
            .expect("aggregator starts");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let api = agg.api_url();
        let r = http
            .post(format!("{api}/zones"))
            .json(&json!({"zoneName": ZONE, "serverAddress": "127.0.0.1:15010", "requestCluster": EDGE}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
        let r = http
            .post(format!("{api}/clusters"))
            .json(
                &json!({"clusterName": SERVICE, "zoneName": ZONE, "name": SERVICE,
                "enableInstanceMetrics": true, "prometheusJob": "catalog"}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
        let edge_agent = Agent::start(&agg, data.path(), &sc.edge, EDGE, "edge-0").await;
        let service_agent = Agent::start_with(
            &agg,
            data.path(),
            &sc.service,
            (SERVICE, "catalog-0"),
            service_flags,
        )
        .await;
        let instances = agg.instances.clone();
        wait_for(
            "the edge and service instances to be live",
            Duration::from_secs(30),
            || {
                let instances = instances.clone();
                async move {
                    (instances.live_instance(ZONE, EDGE, "edge-0").is_some()
                        && instances
                            .live_instance(ZONE, SERVICE, "catalog-0")
                            .is_some())
                    .then_some(())
                }
            },
        )
        .await
        .unwrap();
        Stack {
            agg,
            data,
            edge_agent: Some(edge_agent),
            service_agent: Some(service_agent),
            extra_agents: Vec::new(),
            http,
        }
    }

    /// Starts an agent for one more sidecar and waits until its instance is live.
    pub async fn add_agent(&mut self, sidecar: &Sidecar, cluster: &str, instance: &str) {
        let agent = Agent::start(&self.agg, self.data.path(), sidecar, cluster, instance).await;
        self.extra_agents.push(agent);
        self.wait_live(cluster, instance).await;
    }

    /// Waits until `instance` of `cluster` is live in the catalog.
    pub async fn wait_live(&self, cluster: &str, instance: &str) {
        let instances = self.agg.instances.clone();
        let (cluster, instance) = (cluster.to_owned(), instance.to_owned());
        wait_for(
            &format!("{instance} of {cluster} to be live"),
            Duration::from_secs(30),
            || {
                let (instances, cluster, instance) =
                    (instances.clone(), cluster.clone(), instance.clone());
                async move {
                    instances
                        .live_instance(ZONE, &cluster, &instance)
                        .is_some()
                        .then_some(())
                }
            },
        )
        .await
        .unwrap();
    }

    /// Registers one more cluster in the zone, metrics settings present.
    pub async fn register(&self, cluster: &str) {
        let r = self
            .http
            .post(format!("{}/clusters", self.api()))
            .json(
                &json!({"clusterName": cluster, "zoneName": ZONE, "name": cluster,
                "enableInstanceMetrics": true, "prometheusJob": cluster}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    }

    /// `GET /diagnose/{cluster}?zoneName=local&...` with the extra query `q`.
    pub async fn diagnose_cluster(&self, cluster: &str, q: &str) -> Value {
        let url = format!("{}/diagnose/{cluster}?zoneName={ZONE}{q}", self.api());
        let r = self.http.get(url).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.json().await.unwrap()
    }

    pub fn api(&self) -> String {
        self.agg.api_url()
    }

    /// `GET /diagnose/catalog?zoneName=local&...` with the extra query `q`.
    pub async fn diagnose(&self, q: &str) -> (u16, Value) {
        let url = format!("{}/diagnose/{SERVICE}?zoneName={ZONE}{q}", self.api());
        let r = self.http.get(url).send().await.unwrap();
        let code = r.status().as_u16();
        (code, r.json().await.unwrap())
    }

    /// Runs the diagnosis until `done` holds for its report (the agents' tails poll
    /// the logs), or returns the last report after 20 s for the assertions to name.
    pub async fn diagnose_until(&self, q: &str, done: impl Fn(&Value) -> bool) -> Value {
        let end = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (code, report) = self.diagnose(q).await;
            assert_eq!(code, 200, "{report}");
            if done(&report) || std::time::Instant::now() > end {
                return report;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Stops agents and aggregator.
    pub async fn stop(mut self) {
        let extra = std::mem::take(&mut self.extra_agents);
        for a in [self.edge_agent.take(), self.service_agent.take()]
            .into_iter()
            .flatten()
            .chain(extra)
        {
            a.stop().await;
        }
        self.agg.stop().await.expect("aggregator stops");
    }
}

/// The step named `name` of a report.
pub fn step<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["steps"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == name))
        .unwrap_or_else(|| panic!("no step {name} in {report:#}"))
}

/// The verdict of step `name`.
pub fn verdict<'a>(report: &'a Value, name: &str) -> &'a str {
    step(report, name)["verdict"].as_str().unwrap_or("")
}

/// The (name, verdict) pairs of a report.
pub fn verdicts(report: &Value) -> Vec<(String, String)> {
    report["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or("").to_owned(),
                s["verdict"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// Whether step `name` has an evidence line containing `needle`.
pub fn has_evidence(report: &Value, name: &str, needle: &str) -> bool {
    step(report, name)["evidence"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|e| e.as_str().is_some_and(|e| e.contains(needle)))
}

#[track_caller]
pub fn assert_evidence(report: &Value, name: &str, needle: &str) {
    assert!(
        has_evidence(report, name, needle),
        "step {name} has no evidence containing {needle:?}: {:#}",
        step(report, name)
    );
}

#[track_caller]
pub fn assert_verdicts(report: &Value, want: &[(&str, &str)]) {
    let got = verdicts(report);
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
    assert_eq!(got, want, "{report:#}");
}

/// The (name, verdict) pairs of a report's sidecar checks: all but the `metrics_*`
/// checks, which depend on the aggregator's record of the cluster rather than on the
/// scenario.
pub fn sidecar_verdicts(report: &Value) -> Vec<(String, String)> {
    verdicts(report)
        .into_iter()
        .filter(|(name, _)| !name.starts_with("metrics_"))
        .collect()
}

/// The conclusion's finding, after the root cause it starts with
/// (`<cluster> in zone <zone> (<owner>): `), which is checked against `rootCause`.
/// Without a root cause, the whole conclusion.
#[track_caller]
pub fn cause(report: &Value) -> &str {
    let conclusion = report["conclusion"].as_str().unwrap_or("");
    let root = &report["rootCause"];
    if root.is_null() {
        return conclusion;
    }
    let prefix = format!(
        "{} in zone {} (",
        root["clusterName"].as_str().unwrap_or(""),
        root["zoneName"].as_str().unwrap_or("")
    );
    assert!(
        conclusion.starts_with(&prefix),
        "the conclusion starts with the root cause {prefix}: {report:#}"
    );
    conclusion
        .split_once("): ")
        .map_or(conclusion, |(_, finding)| finding)
}

/// Asserts the verdicts a scenario's `scenario.json` expects of its diagnosis.
#[track_caller]
pub fn assert_diagnosis(report: &Value, want: &Diagnosis) {
    assert_eq!(sidecar_verdicts(report), want.verdicts, "{report:#}");
}

/// Waits until both sidecars of `sc` run at `level`.
pub async fn wait_level(sidecars: &[&Sidecar], level: &str) {
    for s in sidecars {
        wait_for(
            &format!("sidecar {} at level {level}", s.admin),
            Duration::from_secs(20),
            || async move {
                let now = s.uniform_log_level().await.ok()??;
                (now == level).then_some(())
            },
        )
        .await
        .unwrap();
    }
}

/// Reports one instance and never answers a command: an agent that hangs.
struct Hung(std::sync::Mutex<Vec<InstanceReport>>);

impl SnapshotSource for Hung {
    fn snapshot(&self) -> Vec<InstanceReport> {
        self.0.lock().unwrap().clone()
    }
}

impl CommandHandler for Hung {
    fn handle(
        &self,
        _target: meshcat_agent::TargetKey,
        _cmd: Command,
    ) -> BoxFuture<'static, Result<CommandOutput, String>> {
        Box::pin(futures::future::pending())
    }
}

/// Starts a real QUIC reporter, with the dev agent certificate, that reports
/// `instance` of `cluster` every 300 ms and never answers a command. Send on the
/// returned channel to stop it.
pub fn hung_agent(
    stack: &Stack,
    cluster: &str,
    instance: &str,
    agent_id: &str,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let dev = stack.data.path().join("dev");
    let client = tls::client_config(
        &dev.join("ca.pem"),
        Some((&dev.join("agent.pem"), &dev.join("agent-key.pem"))),
    )
    .unwrap();
    let quic = stack.agg.quic_addr.unwrap().to_string();
    let mut config = ReporterConfig::new(quic, "localhost", client, agent_id);
    config.interval = Duration::from_millis(300);
    let report = InstanceReport {
        admin_address: "127.0.0.1:9".into(),
        reachable: true,
        start_time_ms: 1_700_000_000_000,
        server_state: "LIVE".into(),
        envoy_version: "1.40.0".into(),
        log_level: Some("info".into()),
        ..InstanceReport::unread(ZONE.into(), cluster.into(), instance.into())
    };
    let hung = Arc::new(Hung(std::sync::Mutex::new(vec![report])));
    let reporter = Reporter::new(config, hung.clone(), hung, &prometheus::Registry::new()).unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(reporter.run(async move {
        let _ = rx.await;
    }));
    (tx, task)
}
