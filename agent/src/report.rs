//! The reporter: the agent's QUIC client to the aggregator. It says hello on a control
//! stream, sends the current snapshot of its sidecars every interval on a stream of
//! its own, runs the aggregator's commands (each in its own task) and answers them on
//! the control stream, reconnects with exponential backoff and jitter, and says
//! goodbye on shutdown. Outbound data is bounded: only the latest snapshot is ever
//! sent, nothing queues up while the aggregator is away.

mod delta;
mod telemetry;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use meshcat_common::transport::{TransportError, code, read_frame, write_frame};
use meshcat_common::wire::{
    AgentMessage, Command, CommandOutput, CommandReply, DEFAULT_MAX_MESSAGE, Hello, InstanceReport,
    RefusedInstance, Report, STALE_BASE, ServerMessage, WireError,
};

use delta::{Deltas, Prepared};
use prometheus::Registry;
use rand::Rng;
use tokio::sync::{Semaphore, mpsc};
use tracing::{Instrument, debug, info, info_span, warn};

pub use crate::target::TargetKey;

pub use telemetry::ReporterMetrics;

/// First reconnect delay; it doubles up to [`BACKOFF_MAX`].
pub const BACKOFF_MIN: Duration = Duration::from_millis(200);
/// Longest reconnect delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Longest time allowed for the QUIC handshake and the hello exchange (shorter
/// intervals shorten it, see [`ReporterConfig::connect_timeout`]).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Commands run at once; more are answered busy rather than queued.
pub const MAX_CONCURRENT_COMMANDS: usize = 16;

/// The source of the snapshots the reporter sends (the scraper's latest state).
pub trait SnapshotSource: Send + Sync + 'static {
    fn snapshot(&self) -> Vec<InstanceReport>;
}

/// Runs the aggregator's commands against the agent's sidecars.
pub trait CommandHandler: Send + Sync + 'static {
    /// Runs `cmd` on the sidecar `target` names (its zone and cluster are empty in
    /// a command of an aggregator older than those fields).
    fn handle(
        &self,
        target: TargetKey,
        cmd: Command,
    ) -> BoxFuture<'static, Result<CommandOutput, String>>;
}

/// Why a connection attempt or a session ended.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot resolve {0}")]
    Resolve(String),
    #[error("cannot open a UDP socket: {0}")]
    Endpoint(#[source] std::io::Error),
    #[error("cannot connect: {0}")]
    Connect(#[from] quinn::ConnectError),
    #[error("connection lost: {0}")]
    Connection(#[from] quinn::ConnectionError),
    #[error("the aggregator refused the agent: {0}")]
    Refused(String),
    #[error("the aggregator rejected the report: {0}")]
    Rejected(String),
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("the aggregator sent an unexpected message")]
    Unexpected,
    #[error("the aggregator did not answer in time")]
    Timeout,
}

impl ReportError {
    /// Whether the connection is still usable after this error.
    fn keeps_connection(&self) -> bool {
        matches!(
            self,
            ReportError::Rejected(_) | ReportError::Transport(TransportError::Wire(_))
        )
    }
}

/// Settings of the reporter.
#[derive(Debug, Clone)]
pub struct ReporterConfig {
    /// The aggregator's ingest address, `host:port` (resolved at each connection), or
    /// a comma-separated list of replicas tried in turn.
    pub aggregator: String,
    /// The name the aggregator's certificate must carry.
    pub server_name: String,
    /// TLS (trusted CA, optional client certificate) and transport settings.
    pub client: quinn::ClientConfig,
    /// Shared agent token sent in the hello, for token-authenticated setups.
    pub token: Option<String>,
    /// Stable identity of this agent.
    pub agent_id: String,
    /// Time between reports.
    pub interval: Duration,
    /// Largest message sent or accepted.
    pub max_message: usize,
    /// First and longest reconnect delays.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl ReporterConfig {
    /// Default interval (5 s), limits and backoff.
    pub fn new(
        aggregator: impl Into<String>,
        server_name: impl Into<String>,
        client: quinn::ClientConfig,
        agent_id: impl Into<String>,
    ) -> Self {
        ReporterConfig {
            aggregator: aggregator.into(),
            server_name: server_name.into(),
            client,
            token: None,
            agent_id: agent_id.into(),
            interval: Duration::from_secs(5),
            max_message: DEFAULT_MAX_MESSAGE,
            backoff_min: BACKOFF_MIN,
            backoff_max: BACKOFF_MAX,
        }
    }

    /// How long one report may wait for its acknowledgement before the connection is
    /// presumed dead: one interval (2 s to 10 s). A healthy aggregator acknowledges in
    /// milliseconds; a killed replica is thus noticed within two intervals of its death
    /// (the next report, then its deadline), before its instance lease (three intervals
    /// by default) runs out, so a replica's instances move without a gap.
    fn report_timeout(&self) -> Duration {
        self.interval
            .clamp(Duration::from_secs(2), Duration::from_secs(10))
    }

    /// Longest reconnect delay actually used: at most half an interval. With the
    /// attempt timeout below, an agent is back within about one and a half intervals
    /// of the aggregator's return however long it was away, which keeps the catalog's
    /// promise that a restarted aggregator is whole again within two intervals.
    fn backoff_cap(&self) -> Duration {
        self.backoff_max
            .min(self.interval / 2)
            .max(self.backoff_min)
    }

    /// Time allowed for one connection attempt (handshake and hello). A QUIC client
    /// whose first packets met no server only retries them on its own exponential
    /// timer (1 s, 2 s, 4 s...), so an attempt is cut after one interval and a fresh
    /// one started rather than waiting for that timer.
    fn connect_timeout(&self) -> Duration {
        self.interval
            .clamp(Duration::from_millis(250), CONNECT_TIMEOUT)
    }
}

/// How a session ended.
enum Ended {
    Shutdown,
    Lost(ReportError),
}

type Shutdown<'a> = Pin<&'a mut (dyn Future<Output = ()> + Send)>;

/// The reporter, ready to run.
pub struct Reporter {
    config: ReporterConfig,
    source: Arc<dyn SnapshotSource>,
    handler: Arc<dyn CommandHandler>,
    metrics: ReporterMetrics,
}

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reporter")
            .field("aggregator", &self.config.aggregator)
            .field("agent_id", &self.config.agent_id)
            .finish_non_exhaustive()
    }
}

impl Reporter {
    /// Registers the reporter's metrics into `registry`.
    pub fn new(
        config: ReporterConfig,
        source: Arc<dyn SnapshotSource>,
        handler: Arc<dyn CommandHandler>,
        registry: &Registry,
    ) -> Result<Self, prometheus::Error> {
        Ok(Reporter {
            config,
            source,
            handler,
            metrics: ReporterMetrics::register(registry)?,
        })
    }

    /// Reports until `shutdown` completes, reconnecting whenever the connection is
    /// lost; on shutdown says goodbye and closes the connection.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut shutdown: Shutdown<'_> = shutdown.as_mut();
        let mut delay = self.config.backoff_min;
        let mut first = true;
        let addresses: Vec<String> = self
            .config
            .aggregator
            .split(',')
            .map(|a| a.trim().to_owned())
            .filter(|a| !a.is_empty())
            .collect();
        let addresses = if addresses.is_empty() {
            vec![self.config.aggregator.clone()]
        } else {
            addresses
        };
        let mut current = 0usize;
        self.metrics.pending_snapshot.set(1);
        loop {
            if !first {
                self.metrics.reconnects.inc();
            }
            first = false;
            let addr = addresses[current % addresses.len()].clone();
            let span = info_span!("aggregator", addr = %addr);
            let (ended, established) = self
                .session(&addr, shutdown.as_mut())
                .instrument(span)
                .await;
            // Any replica serves the whole catalog: after a lost connection (or a
            // failed attempt) the next one is tried, within the capped backoff.
            current += 1;
            self.metrics.connected.set(0);
            self.metrics.pending_snapshot.set(1);
            // An aggregator that answers but refuses the agent will not change its
            // mind soon: such failures back off to the full `backoff_max`, not half an
            // interval.
            let refused = match ended {
                Ended::Shutdown => return,
                Ended::Lost(e) => {
                    if established {
                        delay = self.config.backoff_min;
                    }
                    warn!(error = %e, retry_in = ?delay, "Aggregator connection lost; reconnecting.");
                    matches!(e, ReportError::Refused(_))
                }
            };
            let sleep = jittered(delay);
            tokio::select! {
                () = tokio::time::sleep(sleep) => {}
                () = shutdown.as_mut() => return,
            }
            let cap = if refused {
                self.config.backoff_max
            } else {
                self.config.backoff_cap()
            };
            delay = (delay * 2).min(cap);
        }
    }

    /// One connection: hello, then reports and commands until it ends. Also says whether
    /// the hello was accepted, which resets the backoff.
    async fn session(&self, addr: &str, mut shutdown: Shutdown<'_>) -> (Ended, bool) {
        let connected = tokio::select! {
            c = tokio::time::timeout(self.config.connect_timeout(), self.connect(addr)) => match c {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => return (Ended::Lost(e), false),
                Err(_) => return (Ended::Lost(ReportError::Timeout), false),
            },
            () = shutdown.as_mut() => return (Ended::Shutdown, false),
        };
        let (endpoint, conn, send, recv) = connected;
        self.metrics.connected.set(1);
        info!(remote = %conn.remote_address(), "Connected to the aggregator.");

        let (control_tx, control_rx) = mpsc::channel::<AgentMessage>(MAX_CONCURRENT_COMMANDS);
        let max = self.config.max_message;
        let writer = tokio::spawn(write_control(send, control_rx, max).in_current_span());
        let reader = tokio::spawn(
            read_commands(recv, control_tx.clone(), self.handler.clone(), max).in_current_span(),
        );

        let mut ticker = tokio::time::interval(self.config.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A new connection starts from nothing: every instance is sent whole first.
        let mut deltas = Deltas::default();
        let ended = loop {
            tokio::select! {
                // The first tick is immediate: a (re)connected agent resends its state at once.
                _ = ticker.tick() => {
                    let sent = tokio::select! {
                        r = tokio::time::timeout(self.config.report_timeout(), self.send_report(&conn, &mut deltas)) => {
                            r.unwrap_or(Err(ReportError::Timeout))
                        }
                        () = shutdown.as_mut() => break Ended::Shutdown,
                    };
                    match sent {
                        Ok(instances) => {
                            self.metrics.reports_sent.inc();
                            self.metrics.pending_snapshot.set(0);
                            debug!(instances, "Report accepted.");
                        }
                        Err(e) => {
                            self.metrics.report_failures.inc();
                            self.metrics.pending_snapshot.set(1);
                            if !e.keeps_connection() {
                                break Ended::Lost(e);
                            }
                            warn!(error = %e, "Report failed.");
                        }
                    }
                }
                e = conn.closed() => break Ended::Lost(e.into()),
                () = shutdown.as_mut() => break Ended::Shutdown,
            }
        };
        reader.abort();
        match &ended {
            Ended::Shutdown => {
                // Goodbye lets the aggregator drop this agent's instances at once.
                let _ = control_tx.send(AgentMessage::Goodbye).await;
                drop(control_tx);
                let abort = writer.abort_handle();
                let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
                abort.abort();
                conn.close(code::OK.into(), b"goodbye");
                let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
                info!("Said goodbye to the aggregator.");
            }
            Ended::Lost(_) => {
                writer.abort();
                conn.close(code::PROTOCOL.into(), b"reconnecting");
            }
        }
        (ended, true)
    }

    async fn connect(
        &self,
        aggregator: &str,
    ) -> Result<
        (
            quinn::Endpoint,
            quinn::Connection,
            quinn::SendStream,
            quinn::RecvStream,
        ),
        ReportError,
    > {
        let addr = resolve(aggregator).await?;
        let bind: SocketAddr = if addr.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            ([0u16; 8], 0).into()
        };
        let mut endpoint = quinn::Endpoint::client(bind).map_err(ReportError::Endpoint)?;
        endpoint.set_default_client_config(self.config.client.clone());
        let conn = endpoint.connect(addr, &self.config.server_name)?.await?;
        let (mut send, mut recv) = conn.open_bi().await?;
        let hello = AgentMessage::Hello(Hello {
            agent_id: self.config.agent_id.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            token: self.config.token.clone(),
        });
        write_frame(&mut send, &hello, self.config.max_message).await?;
        match read_frame::<ServerMessage>(&mut recv, self.config.max_message).await {
            Ok(Some(ServerMessage::Welcome { .. })) => Ok((endpoint, conn, send, recv)),
            Ok(Some(ServerMessage::Rejected { reason })) => Err(ReportError::Refused(reason)),
            Ok(Some(_)) => Err(ReportError::Unexpected),
            Ok(None) => Err(match conn.close_reason() {
                Some(e) => e.into(),
                None => ReportError::Refused("connection closed before the welcome".into()),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Sends the current snapshot, whole or as what changed since what the
    /// aggregator acknowledged, in as many reports as the message limit needs
    /// (one after the other, each on its own stream). Answers how many instances
    /// the aggregator applied.
    async fn send_report(
        &self,
        conn: &quinn::Connection,
        deltas: &mut Deltas,
    ) -> Result<u32, ReportError> {
        let snapshot = self.source.snapshot();
        deltas.retain_current(&snapshot);
        let prepared = deltas.prepare(snapshot);
        let mut applied = 0;
        for batch in batches(prepared, self.config.max_message, deltas) {
            let (instances, pending): (Vec<InstanceReport>, Vec<delta::Pending>) =
                batch.into_iter().map(|p| (p.report, p.pending)).unzip();
            let bytes = self.metrics.observe_report(&instances);
            debug!(instances = instances.len(), bytes, "Sending a report.");
            match self.send_one(conn, instances).await {
                Ok((n, refused)) => {
                    applied += n;
                    for r in &refused {
                        // Once per instance and reason on a connection: a refused
                        // instance is sent, and refused, again every interval.
                        if r.reason != STALE_BASE && deltas.first_refusal(r) {
                            warn!(zone = %r.zone_name, cluster = %r.cluster_name, instance = %r.instance, reason = %r.reason, "The aggregator refused an instance; its other instances are reported.");
                        }
                    }
                    deltas.acknowledged(pending, &refused);
                }
                Err(e) => {
                    for p in &pending {
                        deltas.forget(p);
                    }
                    return Err(e);
                }
            }
        }
        Ok(applied)
    }

    /// Sends one report on a new stream and waits for its acknowledgement.
    async fn send_one(
        &self,
        conn: &quinn::Connection,
        instances: Vec<InstanceReport>,
    ) -> Result<(u32, Vec<RefusedInstance>), ReportError> {
        let report = AgentMessage::Report(Report {
            sent_at_ms: now_ms(),
            instances,
        });
        let (mut send, mut recv) = conn.open_bi().await?;
        if let Err(e) = write_frame(&mut send, &report, self.config.max_message).await {
            if let TransportError::Wire(WireError::TooLarge { .. }) = &e {
                warn!(error = %e, "Snapshot too large to send; raise --max-message on both sides.");
            }
            let _ = send.reset(code::TOO_LARGE.into());
            return Err(e.into());
        }
        let _ = send.finish();
        match read_frame::<ServerMessage>(&mut recv, self.config.max_message).await? {
            Some(ServerMessage::ReportAccepted { instances, refused }) => Ok((instances, refused)),
            Some(ServerMessage::Rejected { reason }) => Err(ReportError::Rejected(reason)),
            Some(_) => Err(ReportError::Unexpected),
            None => Err(match conn.close_reason() {
                Some(e) => e.into(),
                None => ReportError::Rejected("no acknowledgement".into()),
            }),
        }
    }
}

async fn resolve(addr: &str) -> Result<SocketAddr, ReportError> {
    tokio::net::lookup_host(addr)
        .await
        .map_err(|e| ReportError::Resolve(format!("{addr}: {e}")))?
        .next()
        .ok_or_else(|| ReportError::Resolve(format!("{addr}: no address")))
}

/// Writes the agent's control messages (command replies, goodbye) in order, then
/// finishes the stream when every sender is gone.
async fn write_control(
    mut send: quinn::SendStream,
    mut rx: mpsc::Receiver<AgentMessage>,
    max_message: usize,
) {
    while let Some(msg) = rx.recv().await {
        let last = matches!(msg, AgentMessage::Goodbye);
        if let Err(e) = write_frame(&mut send, &msg, max_message).await {
            match e {
                // An oversized reply is answered with an error instead, so the caller
                // is not left waiting for its deadline.
                TransportError::Wire(WireError::TooLarge { size, limit }) => {
                    if let AgentMessage::CommandReply(reply) = msg {
                        let reply = AgentMessage::CommandReply(CommandReply {
                            id: reply.id,
                            outcome: Err(format!(
                                "the answer of {size} bytes is over the message limit of {limit} bytes"
                            )),
                        });
                        if write_frame(&mut send, &reply, max_message).await.is_err() {
                            break;
                        }
                    }
                }
                e => {
                    debug!(error = %e, "Control stream write failed.");
                    break;
                }
            }
        }
        if last {
            break;
        }
    }
    let _ = send.finish();
}

/// Reads the aggregator's commands and runs each in its own task.
async fn read_commands(
    mut recv: quinn::RecvStream,
    replies: mpsc::Sender<AgentMessage>,
    handler: Arc<dyn CommandHandler>,
    max_message: usize,
) {
    let running = Arc::new(Semaphore::new(MAX_CONCURRENT_COMMANDS));
    loop {
        match read_frame::<ServerMessage>(&mut recv, max_message).await {
            Ok(Some(ServerMessage::Command(req))) => {
                let replies = replies.clone();
                let permit = running.clone().try_acquire_owned();
                let handler = handler.clone();
                let name = req.command.name();
                tokio::spawn(
                    async move {
                        let outcome = match permit {
                            Ok(_permit) => {
                                let target = TargetKey {
                                    zone_name: req.zone_name,
                                    cluster_name: req.cluster_name,
                                    instance: req.instance,
                                };
                                handler.handle(target, req.command).await
                            }
                            Err(_) => Err("the agent is busy with other commands".to_owned()),
                        };
                        if let Err(e) = &outcome {
                            warn!(command = name, error = %e, "Command failed.");
                        }
                        let reply = CommandReply {
                            id: req.id,
                            outcome,
                        };
                        let _ = replies.send(AgentMessage::CommandReply(reply)).await;
                    }
                    .in_current_span(),
                );
            }
            Ok(Some(ServerMessage::Rejected { reason })) => {
                warn!(%reason, "The aggregator rejected a message.");
            }
            Ok(Some(_)) => warn!("Unexpected message on the control stream."),
            Ok(None) => break,
            // The whole frame was read: a command this build does not know is skipped
            // (its caller times out) and the stream stays usable.
            Err(TransportError::Wire(e @ (WireError::Decode(_) | WireError::Version(_)))) => {
                warn!(error = %e, "Command not understood; skipped.");
            }
            Err(e) => {
                debug!(error = %e, "Control stream ended.");
                break;
            }
        }
    }
}

/// Full jitter over the upper half: spreads reconnecting agents without ever retrying
/// much sooner than the backoff asks.
/// Room left in a message for its instances: the envelope, the report's time and
/// the array headers take a few bytes.
const REPORT_OVERHEAD: usize = 64;

/// Encoded size of one instance, as inside a report.
fn encoded_len(r: &InstanceReport) -> usize {
    meshcat_common::wire::encoded_len(r)
}

/// Packs instances into reports that each fit the message limit, in order. An
/// instance too large on its own is sent without the host addresses of its idle
/// upstream clusters (their digests and counts stay); still too large, it is left
/// out, logged, and sent whole again next time.
fn batches(prepared: Vec<Prepared>, max_message: usize, deltas: &mut Deltas) -> Vec<Vec<Prepared>> {
    let room = max_message.saturating_sub(REPORT_OVERHEAD);
    let mut out: Vec<Vec<Prepared>> = Vec::new();
    let mut current: Vec<Prepared> = Vec::new();
    let mut used = 0;
    for mut p in prepared {
        let mut size = encoded_len(&p.report);
        if size > room {
            let used_upstreams: std::collections::HashSet<&str> =
                p.report.upstreams.iter().map(|u| u.name.as_str()).collect();
            let mut thinned = p.report.clusters.clone();
            for c in &mut thinned {
                if !used_upstreams.contains(c.name.as_str()) {
                    c.hosts = Vec::new();
                }
            }
            p.report.clusters = thinned;
            size = encoded_len(&p.report);
            if size > room {
                warn!(zone = %p.report.zone_name, cluster = %p.report.cluster_name, instance = %p.report.instance, size, limit = max_message, "Instance too large for one message even without idle hosts; not sent. Raise --max-message on both sides.");
                deltas.forget(&p.pending);
                continue;
            }
            debug!(instance = %p.report.instance, size, "Idle clusters' host addresses left out to fit the message limit.");
        }
        if used + size > room && !current.is_empty() {
            out.push(std::mem::take(&mut current));
            used = 0;
        }
        used += size;
        current.push(p);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

fn jittered(delay: Duration) -> Duration {
    let factor = rand::rng().random_range(0.5..=1.0);
    delay.mul_f64(factor)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_the_upper_half_of_the_delay() {
        let delay = Duration::from_millis(800);
        for _ in 0..1000 {
            let d = jittered(delay);
            assert!(d >= delay / 2 && d <= delay, "{d:?}");
        }
    }

    fn test_client() -> quinn::ClientConfig {
        quinn::ClientConfig::new(Arc::new(
            quinn::crypto::rustls::QuicClientConfig::try_from(
                rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_protocol_versions(&[&rustls::version::TLS13])
                .unwrap()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
            )
            .unwrap(),
        ))
    }

    #[test]
    fn report_timeout_follows_the_interval_within_bounds() {
        let client = test_client();
        let mut config = ReporterConfig::new("127.0.0.1:9443", "localhost", client, "a");
        assert_eq!(config.report_timeout(), Duration::from_secs(5));
        config.interval = Duration::from_millis(100);
        assert_eq!(config.report_timeout(), Duration::from_secs(2));
        config.interval = Duration::from_secs(3);
        assert_eq!(config.report_timeout(), Duration::from_secs(3));
        config.interval = Duration::from_secs(60);
        assert_eq!(config.report_timeout(), Duration::from_secs(10));
    }

    #[test]
    fn reconnect_delays_follow_the_interval() {
        let client = test_client();
        let mut config = ReporterConfig::new("127.0.0.1:9443", "localhost", client, "a");
        assert_eq!(config.backoff_cap(), Duration::from_millis(2500));
        assert_eq!(config.connect_timeout(), Duration::from_secs(5));
        config.interval = Duration::from_millis(300);
        assert_eq!(config.backoff_cap(), BACKOFF_MIN);
        assert_eq!(config.connect_timeout(), Duration::from_millis(300));
        config.interval = Duration::from_secs(300);
        assert_eq!(config.backoff_cap(), BACKOFF_MAX);
        assert_eq!(config.connect_timeout(), CONNECT_TIMEOUT);
    }
}
