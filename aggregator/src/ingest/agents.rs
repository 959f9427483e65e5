//! The registry of connected agents: the current connection of each session key
//! (credential and agent id), and commands sent to an agent on its control stream
//! with their replies matched by id under a deadline. Which session reports an
//! instance is the sink's to say.
//!
//! Sessions are keyed by credential and agent id (contract section 10): agents with
//! different credentials never collide, whatever ids they send, so no agent can keep
//! another credential's agent out or close its connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use meshcat_common::transport::code;
use meshcat_common::wire::{Command, CommandOutput, CommandReply, CommandRequest};
use tokio::sync::{mpsc, oneshot};

use super::ReportSink;
use super::metrics::IngestMetrics;

/// Commands awaiting a reply from one agent; more are refused as busy so a hung agent
/// cannot grow the aggregator's memory.
pub const MAX_PENDING_COMMANDS: usize = 64;

/// Why a command did not produce an output.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("no connected agent reports instance {instance} of cluster {cluster} in zone {zone}")]
    UnknownInstance {
        zone: String,
        cluster: String,
        instance: String,
    },
    #[error("the agent disconnected before answering")]
    AgentGone,
    #[error("the agent did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the agent has too many commands in progress")]
    Busy,
    #[error("the agent reported an error: {0}")]
    Failed(String),
}

impl CommandError {
    /// The one name of this error: the `outcome` label of
    /// `meshcat_agent_commands_total` and the API's error `code`.
    pub fn code(&self) -> &'static str {
        match self {
            CommandError::UnknownInstance { .. } => "unknown_instance",
            CommandError::AgentGone => "agent_gone",
            CommandError::Timeout(_) => "agent_timeout",
            CommandError::Busy => "agent_busy",
            CommandError::Failed(_) => "sidecar_error",
        }
    }
}

type ReplySender = oneshot::Sender<Result<CommandOutput, String>>;

/// What one connection counts against its credential's bound.
#[derive(Debug, Default)]
pub(crate) struct Reported {
    /// The instances this connection reported within the instance TTL, with when
    /// each was last reported: a keyed 64-bit hash of (zone, cluster, instance)
    /// each, not the names, which the live instances keep once (with 10 instances
    /// an agent the names cost more than the rest of the session).
    pub(crate) keys: HashMap<u64, std::time::Instant>,
    /// When `keys` was last pruned of instances reported longer ago than the TTL.
    pruned: Option<std::time::Instant>,
    /// Set when the connection ends, under the same lock a report is applied under:
    /// a report still in flight then is not applied after the connection's instances
    /// were dropped.
    pub(crate) closed: bool,
}

/// The key of an agent session: a tag of its credential, `:`, and its agent id. Agent
/// ids are names (`[A-Za-z0-9._-]`), so the first `:` ends the tag. The sink stores
/// this key as the reporter of the session's instances.
pub(crate) fn session_key(credential: &super::connection::Credential, agent_id: &str) -> String {
    use std::fmt::Write;
    let mut key = String::with_capacity(CREDENTIAL_TAG * 2 + 1 + agent_id.len());
    for b in &credential[..CREDENTIAL_TAG] {
        let _ = write!(key, "{b:02x}");
    }
    key.push(':');
    key.push_str(agent_id);
    key
}

/// Bytes of the credential's SHA-256 in a session key: 128 bits, so no one finds
/// another credential with the same tag.
const CREDENTIAL_TAG: usize = 16;

/// The credential tag of a session key (the whole key when it has none).
fn credential_tag(key: &str) -> &str {
    key.split_once(':').map_or(key, |(tag, _)| tag)
}

/// One authenticated agent connection.
#[derive(Debug)]
pub(crate) struct Session {
    /// [`session_key`] of the credential and the agent id.
    pub(crate) key: String,
    /// The credential that authenticated this connection.
    pub(crate) credential: super::connection::Credential,
    /// The instances of this connection's last accepted report, counted against its
    /// credential's bound, and whether the connection has ended.
    pub(crate) reported: Mutex<Reported>,
    /// The key of those hashes, random per connection so no one can aim at a collision
    /// (which would only let one instance go uncounted).
    pub(crate) reported_keys: std::hash::RandomState,
    /// Distinguishes a reconnected agent's new connection from its old one.
    conn_id: u64,
    connection: quinn::Connection,
    /// Feeds the task that writes to the agent's control stream.
    // Boxed: a channel allocates its slots in blocks of 32 whatever its bound, and a
    // request is a few hundred bytes; with one channel per agent that was about 9 KiB
    // of every connection's memory.
    commands: mpsc::Sender<Box<CommandRequest>>,
    /// Replies awaited, by command id.
    pending: Mutex<HashMap<u64, ReplySender>>,
    next_command: AtomicU64,
}

impl Reported {
    /// Forgets the instances not reported within `ttl` (the catalog drops them
    /// then too), at most every quarter of it; answers how many went.
    pub(crate) fn prune(&mut self, now: std::time::Instant, ttl: std::time::Duration) -> usize {
        if self
            .pruned
            .is_some_and(|p| now.saturating_duration_since(p) < ttl / 4)
        {
            return 0;
        }
        self.pruned = Some(now);
        let before = self.keys.len();
        self.keys
            .retain(|_, seen| now.saturating_duration_since(*seen) <= ttl);
        before - self.keys.len()
    }
}

impl Session {
    /// Hands an agent's reply to whoever awaits it; late replies are dropped.
    pub(crate) fn resolve(&self, reply: CommandReply) {
        let waiter = lock(&self.pending).remove(&reply.id);
        if let Some(waiter) = waiter {
            let _ = waiter.send(reply.outcome);
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere cannot leave these maps half-updated, so poisoning is ignored.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Removes a pending command when its caller stops waiting (deadline or drop).
struct PendingGuard<'a> {
    session: &'a Session,
    id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        lock(&self.session.pending).remove(&self.id);
    }
}

/// Connected agents; cheap to clone.
#[derive(Clone)]
pub struct Agents {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Agents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agents")
            .field("connected", &self.inner.by_agent.len())
            .finish_non_exhaustive()
    }
}

struct Inner {
    /// The current connection of each session key.
    by_agent: DashMap<String, Arc<Session>>,
    /// Says which agent reports an instance.
    sink: Arc<dyn ReportSink>,
    next_conn: AtomicU64,
    metrics: IngestMetrics,
}

impl Agents {
    pub fn new(metrics: IngestMetrics, sink: Arc<dyn ReportSink>) -> Self {
        Agents {
            inner: Arc::new(Inner {
                by_agent: DashMap::new(),
                sink,
                next_conn: AtomicU64::new(1),
                metrics,
            }),
        }
    }

    /// The current connection of the agent reporting this instance.
    fn session_of(&self, zone: &str, cluster: &str, instance: &str) -> Option<Arc<Session>> {
        let agent = self.inner.sink.reporter(zone, cluster, instance)?;
        self.inner.by_agent.get(&agent).map(|s| s.value().clone())
    }

    /// Number of agents connected now.
    pub fn connected(&self) -> usize {
        self.inner.by_agent.len()
    }

    /// Rejections of agents' connections and reports by reason over the last
    /// [`super::metrics::RECENT_REJECTIONS`], sorted by reason.
    pub fn recent_rejections(&self, now: std::time::Instant) -> Vec<(&'static str, u64)> {
        self.inner.metrics.recent_rejections.counts(now)
    }

    /// Whether some connected agent reports this instance.
    pub fn knows(&self, zone: &str, cluster: &str, instance: &str) -> bool {
        self.session_of(zone, cluster, instance).is_some()
    }

    /// Whether a hello of `agent_id` with `credential` replaces a live connection
    /// (a reconnect).
    pub(crate) fn replaces(
        &self,
        agent_id: &str,
        credential: &super::connection::Credential,
    ) -> bool {
        self.is_live(&session_key(credential, agent_id))
    }

    /// Whether the session of this key has a live connection.
    fn is_live(&self, key: &str) -> bool {
        self.inner
            .by_agent
            .get(key)
            .is_some_and(|s| s.connection.close_reason().is_none())
    }

    /// Whether a report of `session` may take over an instance whose stored reporter
    /// is `holder`: the holder is of the same credential, or has no live connection.
    /// An instance of a live connection of another credential is `instance_in_use`.
    pub(crate) fn may_take(&self, session: &Session, holder: &str) -> bool {
        credential_tag(holder) == credential_tag(&session.key) || !self.is_live(holder)
    }

    /// Registers a new connection. An older connection of the same credential and
    /// agent id is closed, since the agent has evidently moved on from it (a
    /// reconnect). Connections of other credentials are never touched, whatever id
    /// they gave.
    pub(crate) fn connect(
        &self,
        agent_id: &str,
        credential: super::connection::Credential,
        connection: quinn::Connection,
        commands: mpsc::Sender<Box<CommandRequest>>,
    ) -> Arc<Session> {
        let key = session_key(&credential, agent_id);
        let session = Arc::new(Session {
            key: key.clone(),
            credential,
            reported: Mutex::new(Reported::default()),
            reported_keys: std::hash::RandomState::new(),
            conn_id: self.inner.next_conn.fetch_add(1, Ordering::Relaxed),
            connection,
            commands,
            pending: Mutex::new(HashMap::new()),
            next_command: AtomicU64::new(1),
        });
        let old = self.inner.by_agent.insert(key, session.clone());
        if let Some(old) = old {
            old.connection
                .close(code::REPLACED.into(), b"replaced by a newer connection");
        }
        session
    }

    /// Forgets a closed connection. Returns whether it was the agent's current one
    /// (false when a newer connection replaced it, whose state must survive).
    pub(crate) fn disconnect(&self, session: &Arc<Session>) -> bool {
        let current = self
            .inner
            .by_agent
            .remove_if(&session.key, |_, s| s.conn_id == session.conn_id)
            .is_some();
        // Dropping the senders wakes every waiting caller with AgentGone.
        lock(&session.pending).clear();
        current
    }

    /// Runs a command on the agent that last reported this instance and waits for its
    /// answer until `deadline`. Never blocks other commands or reports.
    pub async fn command(
        &self,
        zone: &str,
        cluster: &str,
        instance: &str,
        cmd: Command,
        deadline: Duration,
    ) -> Result<CommandOutput, CommandError> {
        let name = cmd.name();
        let result = self
            .run_command(zone, cluster, instance, cmd, deadline)
            .await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.code(),
        };
        self.inner
            .metrics
            .agent_commands
            .with_label_values(&[name, outcome])
            .inc();
        result
    }

    async fn run_command(
        &self,
        zone: &str,
        cluster: &str,
        instance: &str,
        cmd: Command,
        deadline: Duration,
    ) -> Result<CommandOutput, CommandError> {
        let session = self.session_of(zone, cluster, instance).ok_or_else(|| {
            CommandError::UnknownInstance {
                zone: zone.to_owned(),
                cluster: cluster.to_owned(),
                instance: instance.to_owned(),
            }
        })?;
        let id = session.next_command.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = lock(&session.pending);
            if pending.len() >= MAX_PENDING_COMMANDS {
                return Err(CommandError::Busy);
            }
            pending.insert(id, tx);
        }
        let _guard = PendingGuard {
            session: &session,
            id,
        };
        let request = Box::new(CommandRequest {
            id,
            instance: instance.to_owned(),
            command: cmd,
            zone_name: zone.to_owned(),
            cluster_name: cluster.to_owned(),
        });
        let exchange = async {
            session
                .commands
                .send(request)
                .await
                .map_err(|_| CommandError::AgentGone)?;
            rx.await
                .map_err(|_| CommandError::AgentGone)?
                .map_err(CommandError::Failed)
        };
        tokio::time::timeout(deadline, exchange)
            .await
            .map_err(|_| CommandError::Timeout(deadline))?
    }
}
