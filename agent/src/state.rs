//! The running agent's shared state ([`Agent`]): the board of latest reports, the
//! current targets, the agent's own metrics, the host sampler and each target's
//! diagnosis side; and how a command chooses its sidecar ([`TargetChoice`]).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::http::StatusCode;

use crate::board::Board;
use crate::envoy::{self, EnvoyAdmin, EnvoyError};
use crate::logtail::TailBounds;
use crate::metrics_object::HostSampler;
use crate::ops_metrics::OpsMetrics;
use crate::sidecars::Diagnostics;
use crate::target::Target;

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
    /// How often a sidecar's certificates are read when nothing moved
    /// (`--certs-interval`).
    certs_interval: Duration,
    /// Each target's log tail and debug windows, for the diagnosis commands.
    diagnostics: Diagnostics,
}

impl Agent {
    /// An agent with no targets yet, reading certificates at the default interval and
    /// holding each sidecar's log within the default bounds.
    pub fn new(scrape_timeout: Duration) -> Self {
        Self::configured(
            scrape_timeout,
            crate::identity::DEFAULT_CERTS_INTERVAL,
            TailBounds::default(),
        )
    }

    /// An agent with no targets yet, reading certificates every `certs_interval` and
    /// holding each sidecar's log within `tail_bounds`.
    pub fn configured(
        scrape_timeout: Duration,
        certs_interval: Duration,
        tail_bounds: TailBounds,
    ) -> Self {
        let ops_metrics = OpsMetrics::new();
        Self {
            inner: Arc::new(Inner {
                board: Board::new(),
                targets: RwLock::new(Vec::new()),
                ops_metrics: ops_metrics.clone(),
                host: HostSampler::new(),
                scrape_timeout,
                certs_interval,
                diagnostics: Diagnostics::new(scrape_timeout, ops_metrics.clone(), tail_bounds),
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

    /// `--certs-interval`.
    pub fn certs_interval(&self) -> Duration {
        self.inner.certs_interval
    }

    /// A client of `target`'s admin API with the agent's timeout, its namespace
    /// failures counted in the agent's metrics.
    pub fn admin_client(&self, target: &Target) -> Result<EnvoyAdmin, EnvoyError> {
        target.admin_client(
            self.scrape_timeout(),
            self.ops_metrics().netns_error_hook((
                &target.zone_name,
                &target.cluster_name,
                &target.instance,
            )),
        )
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
        fn key(t: &Target) -> (&str, &str, &str) {
            (&t.zone_name, &t.cluster_name, &t.instance)
        }
        for old in guard.iter() {
            if !targets.iter().any(|t| key(t) == key(old)) {
                self.ops_metrics().forget_target(key(old));
            }
        }
        for new in &targets {
            if !guard.iter().any(|t| key(t) == key(new)) {
                self.ops_metrics().add_target(key(new));
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
        Ok(self.admin_client(&target)?)
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
