//! meshcat aggregator: the service catalog (store, status rules), its REST API, the
//! ops endpoints and the process life cycle. This file wires the components (each
//! module below, built from its part of the [`config::Config`]) and serves them; no
//! component imports it, and only [`process`], the binary's entry point, calls it.
//! [`run`] takes already bound listeners and a shutdown future so tests bind port 0;
//! [`start`] is the convenience form.

pub mod api;
pub mod changes;
pub mod config;
pub mod control;
pub mod diagnosis;
pub mod edge;
pub mod graph;
pub mod history;
pub mod ingest;
pub mod ops;
pub mod peer_signature;
pub mod process;
mod redb_errors;
pub mod redb_file;
pub mod replica_status;
pub mod replicas;
pub mod sidecars;
pub mod status;
pub mod store;
pub mod sync;
pub mod telemetry;
pub mod ui;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use meshcat_common::config::TlsFiles;
use meshcat_common::wire::InstanceReport;

use crate::api::{AppState, EventStreams};
use crate::changes::DEFAULT_RETAINED;
use crate::config::Config;
use crate::diagnosis::DiagnosisTools;
use crate::ingest::{Ingest, IngestConfig};
use crate::ops::OpsState;
use crate::store::etcd::EtcdTlsFiles;
use crate::store::persist::PersistError;
use crate::store::{Instances, Store, StoreConfig, StoreSpec};
use crate::telemetry::Telemetry;

/// A small random generator (xorshift) for the tests that draw their cases: the same
/// cases on every run.
#[cfg(test)]
pub(crate) struct TestRng(pub u64);

#[cfg(test)]
impl TestRng {
    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// How often instances past their TTL are dropped.
pub const EXPIRY_PERIOD: Duration = Duration::from_millis(250);
/// Longest wait for in-flight requests after the shutdown signal.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(4);

/// Why the aggregator could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot open the registrations store: {0}")]
    Store(#[from] PersistError),
    #[error("cannot open the history: {0}")]
    History(#[from] history::HistoryError),
    #[error("cannot register metrics: {0}")]
    Telemetry(#[from] prometheus::Error),
    #[error("cannot bind {what} {addr}: {error}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        error: std::io::Error,
    },
    #[error("cannot use etcd: {0}")]
    Etcd(String),
    #[error("agent ingest cannot start: {0}")]
    Ingest(String),
    #[error("server error: {0}")]
    Serve(#[from] std::io::Error),
}

/// The parts every server of the aggregator shares.
#[derive(Debug, Clone)]
pub struct Aggregator {
    pub config: Config,
    pub store: Arc<Store>,
    pub instances: Arc<Instances>,
    /// Where the catalog, the instances, the sidecar layer and the diagnosis record
    /// what changed, when the history is on.
    pub history: Option<Arc<history::History>>,
    pub telemetry: Telemetry,
    /// The zones' control servers: one xDS stream and view per zone.
    pub controls: control::Controls,
    /// Each sidecar's sync with its zone's control server.
    pub sync: Arc<sync::Sync>,
}

impl Aggregator {
    /// Opens the store (loading the registrations) with the live instances beside
    /// it, the history and the metric registry.
    /// With an etcd store this only prepares the client: [`serve`] loads the
    /// catalog, and the replica is ready once it has. Call it within a runtime
    /// (on its blocking pool, as [`run`] does).
    pub fn open(config: Config) -> Result<Aggregator, RunError> {
        let (store, instances) = open_store(&config.store)?;
        let lag = config.events.lag;
        store.changes().configure(lag, lag.max(DEFAULT_RETAINED));
        let telemetry = Telemetry::new()?;
        let traffic = instances.traffic();
        traffic.set_max_edges_per_node(config.graph.max_edges_per_node);
        traffic.metrics().register(&telemetry.registry)?;
        let history = if config.history.is_on() {
            let metrics = history::HistoryMetrics::register(&telemetry.registry)?;
            let h = Arc::new(history::History::open(
                &config.store.data_dir,
                &config.history_file(),
                config.history,
                metrics,
            )?);
            let _ = store.set_history(h.clone());
            Some(h)
        } else {
            None
        };
        let controls = control::Controls::new(config.control.clone(), &telemetry.registry)
            .map_err(|e| RunError::Serve(std::io::Error::other(format!("control plane: {e}"))))?;
        let sync = Arc::new(sync::Sync::new(
            config.sync,
            store.changes().clone(),
            history.clone(),
        ));
        Ok(Aggregator {
            config,
            store: Arc::new(store),
            instances: Arc::new(instances),
            history,
            telemetry,
            controls,
            sync,
        })
    }
}

/// Opens the registrations where the configuration says they live, with the live
/// instances beside them.
fn open_store(config: &StoreConfig) -> Result<(Store, Instances), RunError> {
    let rules = config.rules;
    Ok(match &config.spec {
        StoreSpec::Redb => {
            let (store, instances) = Store::open(&config.data_dir, rules)?;
            let t = store.totals();
            info!(data_dir = %config.data_dir.display(), zones = t.zones, clusters = t.clusters, "Registrations loaded.");
            (store, instances)
        }
        StoreSpec::Etcd { endpoints, prefix } => {
            let tls = config.etcd_tls.as_ref().map(etcd_tls).transpose()?;
            let handle =
                tokio::runtime::Handle::try_current().map_err(|e| RunError::Etcd(e.to_string()))?;
            let etcd = handle
                .block_on(store::etcd::EtcdRegistrations::connect(
                    endpoints, prefix, tls,
                ))
                .map_err(|e| RunError::Etcd(e.to_string()))?;
            info!(endpoints = %endpoints.join(","), prefix = %prefix, "Registrations in etcd; loading.");
            Store::with_etcd(etcd, rules)
        }
    })
}

impl ingest::ReportSink for Instances {
    fn apply_report(
        &self,
        key: &str,
        instances: Vec<InstanceReport>,
        now: Instant,
        may_take: &dyn Fn(&str) -> bool,
        bounds: &ingest::InstanceBounds,
    ) -> Vec<ingest::InstanceRefusal> {
        Instances::apply_reports_guarded(self, key, instances, now, may_take, bounds)
    }

    fn agent_gone(&self, key: &str) {
        Instances::agent_gone(self, key);
    }

    fn reporter(&self, zone: &str, cluster: &str, instance: &str) -> Option<String> {
        Instances::reporter(self, zone, cluster, instance)
    }
}

/// Where the served ingest's accepted reports go: the live instances, then the sync
/// derivation, told which instances to look at again.
#[derive(Debug)]
struct Reports {
    instances: Arc<Instances>,
    sync: Arc<sync::Sync>,
}

impl ingest::ReportSink for Reports {
    fn apply_report(
        &self,
        key: &str,
        instances: Vec<InstanceReport>,
        now: Instant,
        may_take: &dyn Fn(&str) -> bool,
        bounds: &ingest::InstanceBounds,
    ) -> Vec<ingest::InstanceRefusal> {
        // The keys of the instances applied come from the reports themselves.
        self.instances
            .apply_reports_noting(key, instances, now, may_take, bounds, &mut |k| {
                self.sync.reported(k);
            })
    }

    fn agent_gone(&self, key: &str) {
        self.instances.agent_gone(key);
    }

    fn reporter(&self, zone: &str, cluster: &str, instance: &str) -> Option<String> {
        self.instances.reporter(zone, cluster, instance)
    }
}

/// Reads the etcd TLS files named by the configuration.
fn etcd_tls(files: &EtcdTlsFiles) -> Result<store::etcd::EtcdTls, RunError> {
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| RunError::Etcd(format!("{}: {e}", p.display())))
    };
    let ca_pem = files.ca.as_deref().map(read).transpose()?;
    let identity = match &files.identity {
        Some(TlsFiles { cert, key }) => Some((read(cert)?, read(key)?)),
        None => None,
    };
    Ok(store::etcd::EtcdTls { ca_pem, identity })
}

/// The QUIC ingest, ready to run, with its bound socket.
struct IngestParts {
    ingest: Ingest,
    socket: std::net::UdpSocket,
}

/// Prepares the agent ingest, or `None` when no agent credentials are configured
/// (no `--dev`, certificates or agent tokens): the catalog API still serves, and the
/// log says why no agent can connect.
fn prepare_ingest(agg: &Aggregator) -> Result<Option<IngestParts>, RunError> {
    let c = &agg.config.ingest;
    if !agg.config.dev && !c.has_credentials() {
        warn!(
            "Agent ingest is off: give --dev, or --tls-cert and --tls-key with --client-ca or --agent-token-file."
        );
        return Ok(None);
    }
    let (server, auth) = c
        .security(agg.config.dev, &agg.config.store.data_dir)
        .load()
        .map_err(|e| RunError::Ingest(e.to_string()))?;
    let config = IngestConfig {
        server,
        auth,
        limits: c.limits,
    };
    let sink: Arc<dyn ingest::ReportSink> = Arc::new(Reports {
        instances: agg.instances.clone(),
        sync: agg.sync.clone(),
    });
    let ingest = Ingest::new(config, sink, &agg.telemetry.registry)
        .map_err(|e| RunError::Ingest(e.to_string()))?;
    let socket = std::net::UdpSocket::bind(c.addr).map_err(|error| RunError::Bind {
        what: "quic",
        addr: c.addr,
        error,
    })?;
    Ok(Some(IngestParts { ingest, socket }))
}

/// Opens the store and serves until `shutdown` resolves.
pub async fn run(
    config: Config,
    api: TcpListener,
    ops: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let agg = tokio::task::spawn_blocking(move || Aggregator::open(config))
        .await
        .map_err(|e| RunError::Serve(std::io::Error::other(e)))??;
    serve(agg, api, ops, shutdown).await
}

/// Serves the API and the ops endpoints and runs expiry until `shutdown` resolves,
/// then drains in-flight requests for at most [`DRAIN_TIMEOUT`].
pub async fn serve(
    agg: Aggregator,
    api: TcpListener,
    ops: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let ingest = prepare_ingest(&agg)?;
    serve_with(agg, api, ops, ingest, shutdown).await
}

async fn serve_with(
    agg: Aggregator,
    api: TcpListener,
    ops: TcpListener,
    ingest: Option<IngestParts>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let agents = ingest.as_ref().map(|p| p.ingest.agents());
    let stopped = move |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let c = &agg.config;
    // Replicas that serve HTTPS reach each other over HTTPS.
    let peers = if agg.store.etcd().is_some() && c.api.tls.is_some() {
        api::forward::Peers::tls(c.replicas.peer_ca_file.as_deref()).map_err(|e| {
            RunError::Serve(std::io::Error::other(format!("peer replicas' TLS: {e}")))
        })?
    } else {
        api::forward::Peers::plain()
    };
    let diagnosis =
        DiagnosisTools::new(&c.diagnosis).map_err(|e| RunError::Serve(std::io::Error::other(e)))?;
    let graphs = Arc::new(
        graph::snapshot::Graphs::new(agg.instances.traffic().clone())
            .noting_in(agg.history.clone()),
    );
    let app_state = Arc::new(AppState {
        store: agg.store.clone(),
        instances: agg.instances.clone(),
        history: agg.history.clone(),
        tokens: c.tokens.clone(),
        metrics: agg.telemetry.api.clone(),
        peers: peers.clone(),
        agents: agents.clone(),
        diagnosis,
        events: EventStreams::new(c.events.clone(), stop_rx.clone()),
        graph: graphs.clone(),
        controls: agg.controls.clone(),
        sync: agg.sync.clone(),
    });
    let ops_state = Arc::new(OpsState {
        store: agg.store.clone(),
        instances: agg.instances.clone(),
        telemetry: agg.telemetry.clone(),
        ready: AtomicBool::new(false),
        cluster_series: c.ops.cluster_metrics.then(|| graphs.clone()),
        renderings: ops::Renderings::new(&c.ops),
        sync: agg.sync.clone(),
    });
    let api_addr = api.local_addr()?;
    let ops_addr = ops.local_addr()?;
    let limits = Arc::new(api::limits::Limits::new(
        c.api.request_timeout,
        c.api.max_concurrency,
    ));
    // The dashboard beside the API, outside its layers: its files need no token.
    let api_router =
        api::app_with_limits(app_state.clone(), c.api.max_body, limits.clone()).merge(ui::router());
    let api_app = api::QuickReads::new(api_router, app_state, limits);
    let api_tls = match &c.api.tls {
        Some(TlsFiles { cert, key }) => Some(
            api::tls::server_config(cert, key)
                .map_err(|e| RunError::Serve(std::io::Error::other(format!("API TLS: {e}"))))?,
        ),
        None => None,
    };
    let http_limits = c.http;
    let api_task = tokio::spawn(meshcat_common::http::serve(
        api,
        api_app,
        http_limits,
        api_tls.map(tokio_rustls::TlsAcceptor::from),
        stop_rx.clone(),
    ));
    let ops_task = tokio::spawn(meshcat_common::http::serve(
        ops,
        ops::app(ops_state.clone()),
        http_limits,
        None,
        stop_rx.clone(),
    ));
    let expiry_task = tokio::spawn(expire_loop(agg.instances.clone(), stop_rx.clone()));
    let graph_task = tokio::spawn(graph::snapshot::watch(
        agg.store.clone(),
        graphs,
        stop_rx.clone(),
    ));
    let sync_task = tokio::spawn(store::etcd::sync(
        agg.store.clone(),
        agg.instances.clone(),
        agg.telemetry.peers.clone(),
        stop_rx.clone(),
    ));
    let zones_task = tokio::spawn(follow_zones(
        agg.store.clone(),
        agg.instances.clone(),
        agg.controls.clone(),
        stop_rx.clone(),
    ));
    let sidecar_sync_task = tokio::spawn(sync::run(
        agg.sync.clone(),
        agg.instances.clone(),
        agg.controls.clone(),
        stop_rx.clone(),
    ));
    let history_task = agg
        .history
        .as_deref()
        .and_then(history::History::take_events)
        .map(|events| {
            tokio::spawn(history::publish_events(
                agg.store.changes().clone(),
                events,
                stop_rx.clone(),
            ))
        });
    // With etcd, the instances this replica's agents report are published for the
    // other replicas.
    let publish_task = agg.store.etcd().map(|e| {
        let (membership, publisher) = store::etcd::membership::membership(
            e.client(),
            e.prefix(),
            e.owner(),
            &c.replicas
                .advertise_addr
                .clone()
                .unwrap_or_else(|| api_addr.to_string()),
            c.store.rules,
        );
        let _ = agg.instances.set_membership(Arc::new(membership));
        tokio::spawn(publisher.run(stop_rx.clone()))
    });
    // With etcd, every replica draws the graph from its peers' traffic too.
    let traffic_task = agg.store.etcd().map(|_| {
        tokio::spawn(replicas::pull_traffic(
            replicas::Replicas::new(agg.store.clone(), peers.clone()),
            agg.instances.traffic().clone(),
            agg.telemetry.peers.clone(),
            stop_rx.clone(),
        ))
    });
    // With etcd, every replica shows its peers' sync states beside its own.
    let peer_sync_task = agg.store.etcd().map(|_| {
        tokio::spawn(replicas::pull_sync(
            replicas::Replicas::new(agg.store.clone(), peers.clone()),
            agg.sync.clone(),
            agg.telemetry.peers.clone(),
            stop_rx.clone(),
        ))
    });
    let ingest_task = ingest.map(|IngestParts { ingest, socket }| {
        tokio::spawn(ingest.run(socket, stopped(stop_rx.clone())))
    });
    let edge_task = agents.map(|agents| {
        tokio::spawn(edge::refresh_loop(
            agg.store.clone(),
            agg.instances.clone(),
            agents,
            c.diagnosis.edge_refresh,
            c.diagnosis.command_timeout,
            stop_rx.clone(),
        ))
    });
    // Warnings first: whoever waits for the addresses has read them by then.
    if c.dev {
        warn!(
            quic = %c.ingest.addr,
            "DEVELOPMENT MODE: self-signed certificates, not for production."
        );
        if c.tokens.write.is_none() {
            warn!("DEVELOPMENT MODE: no write token, anyone who reaches the API may write.");
        }
        for (what, addr) in &c.exposed {
            warn!(listener = what, %addr, "DEVELOPMENT MODE: the {what} listener is open beyond this machine.");
        }
    } else if c.tokens.write.is_none() {
        if c.tokens.anonymous_writes {
            warn!(
                "--allow-anonymous-writes: anyone who reaches the API may change the catalog and sidecars."
            );
        } else {
            info!("No write token: writes answer 403 writes_disabled.");
        }
    }

    // Ready before the addresses are logged: whoever reads them may probe at once.
    // With etcd, /readyz also waits for the catalog to be loaded.
    ops_state.ready.store(true, Ordering::Release);
    info!(api = %api_addr, tls = c.api.tls.is_some(), "Catalog API listening.");
    info!(ops = %ops_addr, "Ops endpoints listening.");

    shutdown.await;
    ops_state.ready.store(false, Ordering::Release);
    let _ = stop_tx.send(true);
    let drain = async {
        let (a, o, _, _, _, _, _) = tokio::join!(
            api_task,
            ops_task,
            expiry_task,
            graph_task,
            sync_task,
            zones_task,
            sidecar_sync_task
        );
        if let Some(t) = publish_task {
            let _ = t.await;
        }
        if let Some(t) = history_task {
            let _ = t.await;
        }
        if let Some(t) = traffic_task {
            let _ = t.await;
        }
        if let Some(t) = peer_sync_task {
            let _ = t.await;
        }
        if let Some(t) = edge_task {
            let _ = t.await;
        }
        if let Some(t) = ingest_task {
            match t.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(error = %e, "Agent ingest stopped with an error."),
                Err(e) => warn!(error = %e, "Agent ingest task failed."),
            }
        }
        for r in [a, o] {
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(error = %e, "Server stopped with an error."),
                Err(e) => warn!(error = %e, "Server task failed."),
            }
        }
    };
    if tokio::time::timeout(DRAIN_TIMEOUT, drain).await.is_err() {
        warn!("In-flight requests did not finish in time; stopping anyway.");
    }
    info!("Aggregator stopped.");
    Ok(())
}

/// How often the registered zones are compared with the control servers' streams.
const ZONES_PERIOD: Duration = Duration::from_millis(250);
/// Least time between two mappings of the zones whose clusters or listener
/// addresses changed: a burst of changes (a fleet's sidecars joining) is mapped
/// once, and an isolated change at once.
const REMAP_GAP: Duration = Duration::from_millis(250);

/// Keeps one control-server stream per registered zone (contract section 17): a new
/// zone connects, a replaced serverAddress or TLS file reconnects, a deleted zone's
/// stream closes (within [`ZONES_PERIOD`]); and shows each zone's view in the catalog
/// as it changes, and again when what maps it changes (a cluster registered in the
/// zone or deleted, a listener address of its sidecars come or gone: the catalog's
/// [`store::Remaps`]), at most every [`REMAP_GAP`].
async fn follow_zones(
    store: Arc<Store>,
    instances: Arc<Instances>,
    controls: control::Controls,
    mut stop: watch::Receiver<bool>,
) {
    let mut known: std::collections::BTreeMap<String, meshcat_common::model::ZoneRecord> =
        std::collections::BTreeMap::new();
    let mut changes = controls.subscribe();
    let mut tick = tokio::time::interval(ZONES_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The zones to map again, once the gap since the last mapping is over.
    let mut remap: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let gap = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(gap);
    let mut mapped = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = tick.tick() => {
                if !store.is_loaded() {
                    continue;
                }
                let zones: std::collections::BTreeMap<String, meshcat_common::model::ZoneRecord> =
                    store.zones().into_iter().map(|z| (z.zone_name.clone(), z)).collect();
                for (name, z) in &zones {
                    if known.get(name) != Some(z) {
                        controls.set_zone(z);
                    }
                }
                for name in known.keys().filter(|n| !zones.contains_key(*n)) {
                    controls.remove_zone(name);
                    instances.apply_declared(name, None);
                }
                known = zones;
            }
            due = instances.remaps().due(), if remap.is_empty() => {
                remap = due;
                gap.as_mut().reset(mapped + REMAP_GAP);
            }
            _ = &mut gap, if !remap.is_empty() => {
                for name in std::mem::take(&mut remap) {
                    if known.contains_key(&name) {
                        instances.apply_declared(&name, controls.view(&name));
                    }
                }
                mapped = tokio::time::Instant::now();
            }
            change = changes.recv() => match change {
                Ok(control::ControlChange::View { zone }) => {
                    if known.contains_key(&zone) {
                        instances.apply_declared(&zone, controls.view(&zone));
                    }
                }
                Ok(control::ControlChange::State { .. }) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    for name in known.keys() {
                        instances.apply_declared(name, controls.view(name));
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            },
        }
    }
    for name in known.keys() {
        controls.remove_zone(name);
    }
}

async fn expire_loop(instances: Arc<Instances>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(EXPIRY_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut names = tokio::time::interval(NAMES_SWEEP_PERIOD);
    names.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = Instant::now();
                instances.expire(now);
                // Certificate states that changed with time alone (one became
                // expiring, overdue, expired): their records and history follow.
                instances.identities().tick(now);
            }
            // Upstream cluster names no instance holds any more (their sidecars
            // left, or dropped the cluster) are forgotten.
            _ = names.tick() => store::clusterset::NAMES.sweep(),
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// How often unheld upstream cluster names are swept.
const NAMES_SWEEP_PERIOD: std::time::Duration = std::time::Duration::from_secs(60);

/// A running aggregator, for tests and embedding.
#[derive(Debug)]
pub struct RunningAggregator {
    pub api_addr: SocketAddr,
    /// `https` when the API is served over TLS.
    api_scheme: &'static str,
    pub ops_addr: SocketAddr,
    /// The agent ingest's UDP address, when agent credentials are configured.
    pub quic_addr: Option<SocketAddr>,
    /// The connected agents, to send them commands.
    pub agents: Option<ingest::Agents>,
    pub store: Arc<Store>,
    pub instances: Arc<Instances>,
    pub telemetry: Telemetry,
    /// Fires the shutdown.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: JoinHandle<Result<(), RunError>>,
}

impl RunningAggregator {
    pub fn api_url(&self) -> String {
        format!("{}://{}", self.api_scheme, self.api_addr)
    }

    pub fn ops_url(&self) -> String {
        format!("http://{}", self.ops_addr)
    }

    /// Stops the servers and waits for them.
    pub async fn stop(mut self) -> Result<(), RunError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        (&mut self.task)
            .await
            .map_err(|e| RunError::Serve(std::io::Error::other(e)))?
    }
}

/// Binds the configured addresses, opens the store and serves in the background.
pub async fn start(config: Config) -> Result<RunningAggregator, RunError> {
    let bind = |what: &'static str, addr: SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|error| RunError::Bind { what, addr, error })
    };
    let api = bind("api", config.api.addr).await?;
    let ops = bind("ops", config.ops_addr).await?;
    let api_addr = api.local_addr()?;
    let ops_addr = ops.local_addr()?;
    let agg = tokio::task::spawn_blocking(move || Aggregator::open(config))
        .await
        .map_err(|e| RunError::Serve(std::io::Error::other(e)))??;
    let ingest = prepare_ingest(&agg)?;
    let quic_addr = ingest.as_ref().map(|p| p.socket.local_addr()).transpose()?;
    let agents = ingest.as_ref().map(|p| p.ingest.agents());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let store = agg.store.clone();
    let instances = agg.instances.clone();
    let telemetry = agg.telemetry.clone();
    let api_scheme = if agg.config.api.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let task = tokio::spawn(serve_with(agg, api, ops, ingest, async move {
        let _ = rx.await;
    }));
    Ok(RunningAggregator {
        api_addr,
        api_scheme,
        ops_addr,
        quic_addr,
        agents,
        store,
        instances,
        telemetry,
        stop: Some(tx),
        task,
    })
}
