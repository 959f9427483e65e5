//! meshcat-agent: watches the Envoy sidecars beside it. Scrapers ([`scrape`]) read
//! each sidecar's admin API ([`envoy`]) every interval and keep the latest report
//! per instance on the [`Board`]; the QUIC reporter sends the board's snapshots to
//! the aggregator; the ops port ([`ops`]) serves the agent's own metrics and the
//! sidecar log level.

pub mod board;
pub mod commands;
pub mod config;
pub mod config_dump;
pub mod debugwindow;
pub mod discovery;
pub mod drift;
pub mod envoy;
pub mod logtail;
pub mod metrics_object;
pub mod ops;
pub mod report;
pub mod scrape;
pub mod sidecars;
pub mod topology;

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::http::StatusCode;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

pub use board::Board;
pub use config::AgentConfig;
pub use envoy::EnvoyAdmin;
use metrics_object::HostSampler;
use ops::OpsMetrics;
pub use scrape::TargetKey;
use scrape::{Target, TargetSource};
use sidecars::Diagnostics;

/// How long shutdown waits for the ops server and scrapers to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(4);

/// Why a sidecar could not be chosen for a command.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("no sidecar instance is {0}")]
    Unknown(String),
    #[error("the agent scrapes several sidecars; choose one with ?instance=")]
    Ambiguous,
    #[error(
        "several sidecars are named {0:?} (in other zones or clusters); choose one with ?zone= and ?cluster="
    )]
    SameName(String),
    #[error("the agent has no sidecar to talk to")]
    None,
    #[error(transparent)]
    Envoy(#[from] envoy::EnvoyError),
}

impl TargetError {
    /// HTTP status for the ops port.
    pub fn status(&self) -> StatusCode {
        match self {
            TargetError::Unknown(_) | TargetError::None => StatusCode::NOT_FOUND,
            TargetError::Ambiguous | TargetError::SameName(_) => StatusCode::BAD_REQUEST,
            TargetError::Envoy(_) => StatusCode::BAD_GATEWAY,
        }
    }

    /// Error code for the ops port's `{"error","code"}` body.
    pub fn code(&self) -> &'static str {
        match self {
            TargetError::Unknown(_) | TargetError::None => "unknown_instance",
            TargetError::Ambiguous => "instance_required",
            TargetError::SameName(_) => "zone_required",
            TargetError::Envoy(_) => "sidecar_unavailable",
        }
    }
}

/// The running agent's shared state: cheap to clone, handed to the scrapers, the
/// ops server, and the QUIC reporter and its command handler.
#[derive(Debug, Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Latest report per instance.
    board: Board,
    /// Current targets, for choosing a sidecar by zone, cluster and instance name.
    targets: RwLock<Vec<Target>>,
    /// The agent's own metrics.
    ops_metrics: OpsMetrics,
    /// Host figures shared by every target's metrics object.
    host: HostSampler,
    /// Timeout of each admin call.
    scrape_timeout: Duration,
    /// Each target's log tail and debug windows, for the diagnosis commands.
    diagnostics: Diagnostics,
}

impl Agent {
    /// An agent with no targets yet.
    pub fn new(scrape_timeout: Duration) -> Self {
        let ops_metrics = OpsMetrics::new();
        Self {
            inner: Arc::new(Inner {
                board: Board::new(),
                targets: RwLock::new(Vec::new()),
                ops_metrics: ops_metrics.clone(),
                host: HostSampler::new(),
                scrape_timeout,
                diagnostics: Diagnostics::new(scrape_timeout, ops_metrics.clone()),
            }),
        }
    }

    /// The latest report of every instance; the reporter reads its snapshots.
    pub fn board(&self) -> &Board {
        &self.inner.board
    }

    /// The agent's own metrics.
    pub fn ops_metrics(&self) -> &OpsMetrics {
        &self.inner.ops_metrics
    }

    /// Each target's log tail and debug windows.
    pub fn diagnostics(&self) -> &Diagnostics {
        &self.inner.diagnostics
    }

    pub(crate) fn host(&self) -> &HostSampler {
        &self.inner.host
    }

    /// Timeout of each admin call.
    pub fn scrape_timeout(&self) -> Duration {
        self.inner.scrape_timeout
    }

    /// The current targets.
    pub fn targets(&self) -> Vec<Target> {
        self.inner
            .targets
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn set_targets(&self, targets: Vec<Target>) {
        let mut guard = self
            .inner
            .targets
            .write()
            .unwrap_or_else(|p| p.into_inner());
        for old in guard.iter() {
            let same = |t: &Target| {
                (&t.zone_name, &t.cluster_name, &t.instance)
                    == (&old.zone_name, &old.cluster_name, &old.instance)
            };
            if !targets.iter().any(same) {
                self.ops_metrics().forget_target((
                    &old.zone_name,
                    &old.cluster_name,
                    &old.instance,
                ));
            }
        }
        self.ops_metrics().set_targets(targets.len());
        self.inner.diagnostics.reconcile(&targets);
        *guard = targets;
    }

    /// The one target whose zone, cluster and instance name match those given (a
    /// name not given matches any); with none given, the only target. Sidecars of one
    /// instance name in several zones or clusters are told apart by those.
    pub fn target(&self, choice: &TargetChoice<'_>) -> Result<Target, TargetError> {
        let mut found = self.targets().into_iter().filter(|t| choice.matches(t));
        match (found.next(), found.next(), choice.instance) {
            (Some(t), None, _) => Ok(t),
            (None, _, None) if choice.zone.is_none() && choice.cluster.is_none() => {
                Err(TargetError::None)
            }
            (None, _, _) => Err(TargetError::Unknown(choice.to_string())),
            (Some(_), Some(_), Some(name)) => Err(TargetError::SameName(name.to_owned())),
            (Some(_), Some(_), None) => Err(TargetError::Ambiguous),
        }
    }

    /// An admin client for the sidecar `choice` names, for commands: log level,
    /// config dump, diagnosis.
    pub fn admin(&self, choice: &TargetChoice<'_>) -> Result<EnvoyAdmin, TargetError> {
        let target = self.target(choice)?;
        Ok(target.admin_client(self.scrape_timeout(), self.ops_metrics())?)
    }
}

/// Which sidecar a command is for: the names given must match, the others (`None`)
/// match any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetChoice<'a> {
    pub zone: Option<&'a str>,
    pub cluster: Option<&'a str>,
    pub instance: Option<&'a str>,
}

impl<'a> TargetChoice<'a> {
    /// The choice of a command from the aggregator: an empty zone or cluster (from an
    /// aggregator older than those fields) matches any.
    pub fn of_command(zone: &'a str, cluster: &'a str, instance: &'a str) -> Self {
        TargetChoice {
            zone: Some(zone).filter(|z| !z.is_empty()),
            cluster: Some(cluster).filter(|c| !c.is_empty()),
            instance: Some(instance),
        }
    }

    /// Whether `target` is one this choice names.
    pub fn matches(&self, target: &Target) -> bool {
        self.zone.is_none_or(|z| target.zone_name == z)
            && self.cluster.is_none_or(|c| target.cluster_name == c)
            && self.instance.is_none_or(|i| target.instance == i)
    }
}

impl std::fmt::Display for TargetChoice<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "named {:?}", self.instance.unwrap_or_default())?;
        if let Some(z) = self.zone {
            write!(f, " in zone {z:?}")?;
        }
        if let Some(c) = self.cluster {
            write!(f, " of cluster {c:?}")?;
        }
        Ok(())
    }
}

/// Runs the agent until `shutdown` resolves: the scrapers, the ops server on
/// `ops_listener`, and the QUIC reporter.
pub async fn run(
    config: AgentConfig,
    ops_listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Settings that can fail are read before any task starts.
    let ops_addr = ops_listener.local_addr()?;
    let ops_token = config
        .ops_token_file
        .as_deref()
        .map(meshcat_common::config::read_token_file)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let access = ops::OpsAccess::new(ops_addr, ops_token.as_deref());
    if access.writes_disabled() {
        warn!(
            ops = %ops_addr,
            "PUT /logging is refused with 403: the ops listener is not on loopback and no --ops-token-file is given."
        );
    }
    let agent = Agent::new(config.scrape_timeout);
    let source = match (&config.targets_file, &config.pods_file) {
        (Some(path), _) => TargetSource::File(path.clone()),
        (None, Some(path)) => TargetSource::Pods {
            file: path.clone(),
            log_dir: config.pod_log_dir.clone(),
            proc_dir: config.pod_netns.then(|| config.proc_dir.clone()),
        },
        (None, None) => TargetSource::Fixed(config.flag_targets()),
    };
    let (stop_tx, stop_rx) = watch::channel(false);

    let (loaded_tx, loaded) = tokio::sync::oneshot::channel();
    let scrapers = tokio::spawn(scrape::manage(
        agent.clone(),
        source,
        config.interval,
        stop_rx.clone(),
        loaded_tx,
    ));
    // The ops port and the reporter start with the first targets known: a command
    // that arrives at once must not find "no sidecar" while the targets file loads.
    let _ = loaded.await;

    let reporter = match reporter_config(&config, ops_addr.port())? {
        Some(rc) => {
            let reporter = report::Reporter::new(
                rc,
                Arc::new(agent.clone()),
                Arc::new(agent.clone()),
                agent.ops_metrics().registry(),
            )?;
            let mut stop = stop_rx.clone();
            Some(tokio::spawn(reporter.run(async move {
                let _ = stop.wait_for(|s| *s).await;
            })))
        }
        None => {
            warn!(
                "Reporting is off: give --ca-file (the CA of the aggregator's certificate) to report to the aggregator."
            );
            None
        }
    };

    let ops = tokio::spawn(meshcat_common::http::serve(
        ops_listener,
        ops::app(agent.clone(), access),
        config.http.limits(),
        None,
        stop_rx.clone(),
    ));
    info!(ops = %ops_addr, interval = ?config.interval, "Agent started.");

    shutdown.await;
    let _ = stop_tx.send(true);
    let stopped = tokio::time::timeout(SHUTDOWN_GRACE, async {
        // Debug windows end at once and their levels come back before the agent exits.
        agent.diagnostics().shutdown().await;
        let _ = scrapers.await;
        let _ = ops.await;
        if let Some(r) = reporter {
            let _ = r.await;
        }
    })
    .await;
    if stopped.is_err() {
        warn!("Agent tasks did not stop in time; exiting anyway.");
    }
    info!("Agent stopped.");
    Ok(())
}

/// The reporter's settings from the command line, or `None` without `--ca-file`.
/// The agent's identity is `POD_NAME` when set, else the host name and the ops port
/// (unique per host, stable across restarts with a fixed port).
fn reporter_config(
    config: &AgentConfig,
    ops_port: u16,
) -> anyhow::Result<Option<report::ReporterConfig>> {
    let Some(ca) = &config.ca_file else {
        return Ok(None);
    };
    let identity = match (&config.cert, &config.key) {
        (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
        _ => None,
    };
    let client = meshcat_common::tls::client_config(ca, identity)?;
    let agent_id = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("{}-{ops_port}", config::host_name()));
    let mut rc =
        report::ReporterConfig::new(&config.aggregator, &config.server_name, client, agent_id);
    rc.interval = config.interval;
    rc.token = config
        .token_file
        .as_deref()
        .map(meshcat_common::config::read_token_file)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    Ok(Some(rc))
}
