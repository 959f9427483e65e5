//! The one way to reach a sidecar. Each live instance of a (zone, cluster) is either
//! served here (its agent is connected to this aggregator) or by a peer replica
//! (etcd store); [`Sidecars::targets`] says which, and [`Sidecars::run`] is the only
//! place that branches between the local agent and the owning replica. The log
//! level, debug windows and diagnosis evidence all go through it, so every route and
//! the diagnosis see the same instances, this replica's and its peers' alike.

use std::sync::Arc;
use std::time::Duration;

use meshcat_common::level;
use meshcat_common::wire::{Command, CommandOutput, DebugWindowOutput, EvidenceOutput, LineQuery};

use crate::history::{ChangedBy, Detail, History, Kind, Pending};
use crate::ingest::{Agents, CommandError};
use crate::replicas::{PeerCallError, Replicas};
use crate::store::{Instances, Store};

/// Time beyond a debug window's length an agent gets to restore the level, wait for
/// the sidecar's last lines (1 s) and answer.
pub const WINDOW_GRACE: Duration = Duration::from_secs(5);

/// The deadline of a command that runs a debug window of `seconds` (none: 0).
pub fn window_deadline(command_timeout: Duration, seconds: u32) -> Duration {
    if seconds == 0 {
        command_timeout
    } else {
        command_timeout + Duration::from_secs(u64::from(seconds)) + WINDOW_GRACE
    }
}

/// Time a peer replica gets beyond a command's own deadline to answer.
pub const PEER_GRACE: Duration = Duration::from_secs(2);

/// Where a live instance's sidecar is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// Through the agent connected to this aggregator.
    Here,
    /// Through the replica of this id, whose agent reports it.
    Replica(String),
}

/// One instance as a per-instance request names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceRef {
    /// By (zone, cluster, instance); without a zone, the first zone by name that has
    /// the instance.
    Cluster {
        zone: Option<String>,
        cluster: String,
        instance: String,
    },
    /// By the cluster's name and version, and the instance.
    Version {
        name: String,
        version: String,
        instance: String,
    },
}

impl InstanceRef {
    /// The instance's name.
    pub fn instance(&self) -> &str {
        match self {
            InstanceRef::Cluster { instance, .. } | InstanceRef::Version { instance, .. } => {
                instance
            }
        }
    }
}

/// A live instance and where its sidecar is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub instance: String,
    pub owner: Owner,
}

/// What the sidecar layer can ask of a sidecar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// Its log level (answered with the seed's name).
    GetLevel,
    /// Set its level (the seed's name: `error`, `warn`, `info`, `debug`).
    SetLevel(&'static str),
    /// A timed debug window.
    DebugWindow { seconds: u32 },
    /// The diagnosis's evidence, after a debug window of `debug_seconds` when given;
    /// `lines` names the lines of one request and asks what the lines cover.
    Evidence {
        path: Option<String>,
        max_lines: u32,
        debug_seconds: Option<u32>,
        lines: LineQuery,
    },
}

/// What a sidecar answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Level(String),
    DebugWindow(DebugWindowOutput),
    Evidence(Box<EvidenceOutput>),
}

/// Why a sidecar gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    #[error("agent ingest is off on this aggregator, so no sidecar can be reached")]
    IngestOff,
    #[error("instance {instance} of cluster {cluster} in zone {zone} is not live")]
    NotLive {
        zone: String,
        cluster: String,
        instance: String,
    },
    #[error("{instance}: {error}")]
    Agent {
        instance: String,
        error: CommandError,
    },
    #[error("{instance}: the agent answered with an unexpected output")]
    Unexpected { instance: String },
    #[error("{instance}: {error}")]
    Peer {
        instance: String,
        error: PeerCallError,
    },
}

/// The sidecars of the catalog's live instances; cheap to build and to clone.
#[derive(Debug, Clone)]
pub struct Sidecars {
    store: Arc<Store>,
    instances: Arc<Instances>,
    /// Where log-level changes and debug windows are recorded, when the history is
    /// on.
    history: Option<Arc<History>>,
    agents: Option<Agents>,
    replicas: Replicas,
}

impl Sidecars {
    pub fn new(
        store: Arc<Store>,
        instances: Arc<Instances>,
        history: Option<Arc<History>>,
        agents: Option<Agents>,
        replicas: Replicas,
    ) -> Sidecars {
        Sidecars {
            store,
            instances,
            history,
            agents,
            replicas,
        }
    }

    /// Every live instance of (zone, cluster), by name, with where it is reached.
    pub fn targets(&self, zone: &str, cluster: &str) -> Vec<Target> {
        self.instances
            .live_owners(zone, cluster)
            .into_iter()
            .map(|live| Target {
                instance: live.instance,
                owner: live.owner.map_or(Owner::Here, Owner::Replica),
            })
            .collect()
    }

    /// One instance of (zone, cluster) and where it is reached: live here, or owned by
    /// another replica.
    pub fn target(
        &self,
        zone: &str,
        cluster: &str,
        instance: &str,
    ) -> Result<Target, SidecarError> {
        match self.instances.live_owner(zone, cluster, instance) {
            Some(owner) => Ok(Target {
                instance: instance.to_owned(),
                owner: owner.map_or(Owner::Here, Owner::Replica),
            }),
            None => Err(SidecarError::NotLive {
                zone: zone.to_owned(),
                cluster: cluster.to_owned(),
                instance: instance.to_owned(),
            }),
        }
    }

    /// Where a request about one instance is served: here, unless another replica
    /// owns the instance (an instance of this replica, or none, is served here).
    pub fn serving(&self, named: &InstanceRef) -> Owner {
        let remote = match named {
            InstanceRef::Cluster {
                zone,
                cluster,
                instance,
            } => self
                .instances
                .remote_owner(zone.as_deref(), cluster, instance),
            InstanceRef::Version {
                name,
                version,
                instance,
            } => self
                .instances
                .remote_owner_by_version(name, version, instance),
        };
        remote.map_or(Owner::Here, Owner::Replica)
    }

    /// Whether (zone, cluster) is known: registered, or with a live instance here or
    /// on a peer.
    pub fn knows(&self, zone: &str, cluster: &str) -> bool {
        self.store.is_registered(zone, cluster)
            || !self.instances.live_owners(zone, cluster).is_empty()
    }

    /// Whether commands can reach any sidecar through this aggregator's agents.
    pub fn ingest_on(&self) -> bool {
        self.agents.is_some()
    }

    /// The replicas, for what is asked of peers beyond sidecars (instance metrics).
    pub fn replicas(&self) -> &Replicas {
        &self.replicas
    }

    /// Asks one sidecar, within `deadline`: through this aggregator's agent, or
    /// through the replica that owns the instance.
    pub async fn run(
        &self,
        (zone, cluster): (&str, &str),
        target: &Target,
        ask: Ask,
        deadline: Duration,
    ) -> Result<Answer, SidecarError> {
        let instance = target.instance.as_str();
        match &target.owner {
            Owner::Here => {
                self.run_here((zone, cluster, instance), ask, deadline)
                    .await
            }
            Owner::Replica(owner) => {
                let at = (zone, cluster, instance);
                let r = &self.replicas;
                // The owner runs the command under the same deadline; the answer
                // still has to travel back.
                let deadline = deadline + PEER_GRACE;
                let answer = match ask {
                    Ask::GetLevel => r.log_level(owner, at, deadline).await.map(Answer::Level),
                    Ask::SetLevel(l) => r
                        .set_log_level(owner, at, l, deadline)
                        .await
                        .map(Answer::Level),
                    Ask::DebugWindow { seconds } => r
                        .debug_window(owner, at, seconds, deadline)
                        .await
                        .map(Answer::DebugWindow),
                    Ask::Evidence {
                        path,
                        debug_seconds,
                        lines,
                        ..
                    } => r
                        .evidence(
                            owner,
                            at,
                            (path.as_deref(), &lines),
                            debug_seconds,
                            deadline,
                        )
                        .await
                        .map(|e| Answer::Evidence(Box::new(e))),
                };
                answer.map_err(|error| SidecarError::Peer {
                    instance: instance.to_owned(),
                    error,
                })
            }
        }
    }

    /// Runs `ask` through this replica's agent. Changes of the sidecar's level are
    /// noted in the history here, where the command reaches the sidecar (the
    /// instance's owner): the level before (asked first), a debug window when it
    /// starts and the level it restores when it ends.
    async fn run_here(
        &self,
        (zone, cluster, instance): (&str, &str, &str),
        ask: Ask,
        deadline: Duration,
    ) -> Result<Answer, SidecarError> {
        let agents = self.agents.as_ref().ok_or(SidecarError::IngestOff)?;
        let window = match &ask {
            Ask::DebugWindow { seconds } => Some(*seconds),
            Ask::Evidence { debug_seconds, .. } => *debug_seconds,
            _ => None,
        };
        let changes_level = window.is_some() || matches!(ask, Ask::SetLevel(_));
        let before = if changes_level && self.history.is_some() {
            match agents
                .command(zone, cluster, instance, Command::GetLogLevel, deadline)
                .await
            {
                Ok(CommandOutput::LogLevel(l)) => Some(level::seed_name(&l).to_owned()),
                _ => None,
            }
        } else {
            None
        };
        let note = |kind: Kind, detail: Detail| {
            if let Some(h) = &self.history {
                h.record(Pending::new(kind, zone, cluster, instance, detail));
            }
        };
        let level_changed = |from: &str, to: &str, by: ChangedBy| {
            if from != to {
                note(
                    Kind::LogLevelChanged,
                    Detail::LogLevel {
                        from: from.to_owned(),
                        to: to.to_owned(),
                        by,
                    },
                );
            }
        };
        if let Some(seconds) = window {
            note(Kind::DebugWindow, Detail::DebugWindow { seconds });
            if let Some(b) = &before {
                level_changed(b, "debug", ChangedBy::DebugWindow);
            }
        }
        // The level a finished window set back.
        let restored = |w: &DebugWindowOutput| {
            if w.restored {
                level_changed(
                    "debug",
                    level::seed_name(&w.previous_level),
                    ChangedBy::DebugWindow,
                );
            }
        };
        let command = match ask {
            Ask::GetLevel => Command::GetLogLevel,
            Ask::SetLevel(seed) => Command::SetLogLevel {
                level: level::envoy_name(seed).unwrap_or(seed).to_owned(),
            },
            Ask::DebugWindow { seconds } => Command::DebugWindow { seconds },
            Ask::Evidence {
                path,
                max_lines,
                debug_seconds,
                lines,
            } => Command::Evidence {
                path,
                max_lines,
                debug_seconds,
                lines: Some(lines),
            },
        };
        let out = agents
            .command(zone, cluster, instance, command, deadline)
            .await
            .map_err(|error| SidecarError::Agent {
                instance: instance.to_owned(),
                error,
            })?;
        match out {
            CommandOutput::LogLevel(l) => {
                let now = level::seed_name(&l).to_owned();
                if let (true, Some(b)) = (changes_level, &before) {
                    level_changed(b, &now, ChangedBy::Api);
                }
                Ok(Answer::Level(now))
            }
            CommandOutput::DebugWindow(w) => {
                restored(&w);
                Ok(Answer::DebugWindow(w))
            }
            CommandOutput::Evidence(e) => {
                if let Some(w) = &e.debug_window {
                    restored(w);
                }
                Ok(Answer::Evidence(Box::new(e)))
            }
            CommandOutput::ConfigDump(_) => Err(SidecarError::Unexpected {
                instance: instance.to_owned(),
            }),
        }
    }
}
