//! meshcat-agent: watches the Envoy sidecars beside it. Scrapers ([`scrape`]) read
//! each sidecar's admin API ([`envoy`]) every interval and keep the latest report
//! per instance on the [`Board`]; the QUIC reporter sends the board's snapshots to
//! the aggregator; the ops port ([`ops`]) serves the agent's own metrics and the
//! sidecar log level. This file only wires them ([`run`]); no module imports it.

pub mod board;
pub mod commands;
pub mod config;
pub mod debugwindow;
pub mod discovery;
pub mod drift;
pub mod envoy;
pub mod identity;
pub mod logtail;
pub mod metrics_object;
pub mod ops;
pub mod ops_metrics;
pub mod report;
pub mod scrape;
pub mod sidecars;
pub mod state;
pub mod target;
pub mod topology;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

pub use board::Board;
pub use config::AgentConfig;
pub use envoy::EnvoyAdmin;
use scrape::TargetSource;
pub use state::{Agent, TargetChoice, TargetError};
pub use target::TargetKey;

/// How long shutdown waits for the ops server and scrapers to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(4);

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
    let agent = Agent::configured(
        config.scrape_timeout,
        config.certs_interval,
        config.tail_bounds(),
    );
    let source = match (&config.targets_file, &config.pods_file) {
        (Some(path), _) => TargetSource::File(path.clone()),
        (None, Some(path)) => TargetSource::Pods(scrape::PodSource {
            file: path.clone(),
            log_dir: config.pod_log_dir.clone(),
            proc_dir: config.pod_netns.then(|| config.proc_dir.clone()),
        }),
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
        .unwrap_or_else(|| format!("{}-{ops_port}", target::host_name()));
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
