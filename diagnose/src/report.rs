//! The diagnosis report of contract section 5, as JSON:
//! `{"cluster","zone","symptom","steps":[{"name","verdict","evidence","action"}],"conclusion"}`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use meshcat_common::model::HistoryEntry;

use crate::symptom::Symptom;

/// The checks of the playbook. The name is the type, so the aggregator and the CLI
/// refer to a check by this enum, never by a string that a rename would silently break.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepName {
    /// The zone's control server declares the cluster with healthy endpoints, and the
    /// edge's and the service's sidecars hold what it declares.
    ControlServer,
    /// The edge sidecar's `/clusters` lists the cluster with hosts.
    EdgeDiscovery,
    /// The service sidecars' `/clusters` list their local cluster with hosts.
    ServiceDiscovery,
    /// ssl counters of both sides and TLS lines of the debug window.
    Mtls,
    /// The edge's `/config_dump` has a route naming the cluster.
    EdgeRoutes,
    /// The edge's access lines for the cluster (or the path).
    EdgeLogs,
    /// The service sidecars' access lines of the request the edge line names.
    ServiceLogs,
    /// The cluster record asks for instance metrics.
    MetricsSettings,
    /// The live instances' sidecars report inbound HTTP metrics.
    MetricsReporting,
    /// The metrics collector scrapes the cluster's job.
    MetricsCollector,
}

/// A step name that names no check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown step {0:?}")]
pub struct StepNameError(pub String);

impl StepName {
    /// Every check: the playbook's in the order a diagnosis without symptom runs
    /// them, then `control_server`, which runs before them when the zone has a view
    /// of its control server.
    pub const ALL: [StepName; 10] = [
        StepName::EdgeDiscovery,
        StepName::ServiceDiscovery,
        StepName::Mtls,
        StepName::EdgeRoutes,
        StepName::EdgeLogs,
        StepName::ServiceLogs,
        StepName::MetricsSettings,
        StepName::MetricsReporting,
        StepName::MetricsCollector,
        StepName::ControlServer,
    ];

    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            StepName::ControlServer => "control_server",
            StepName::EdgeDiscovery => "edge_discovery",
            StepName::ServiceDiscovery => "service_discovery",
            StepName::Mtls => "mtls",
            StepName::EdgeRoutes => "edge_routes",
            StepName::EdgeLogs => "edge_logs",
            StepName::ServiceLogs => "service_logs",
            StepName::MetricsSettings => "metrics_settings",
            StepName::MetricsReporting => "metrics_reporting",
            StepName::MetricsCollector => "metrics_collector",
        }
    }

    /// Which sidecar's evidence the check reads: the notes on evidence that could not
    /// be collected go to the checks that lacked it.
    pub fn reads(self) -> Reads {
        match self {
            StepName::ControlServer => Reads::ControlServer,
            StepName::EdgeDiscovery | StepName::EdgeRoutes | StepName::EdgeLogs => Reads::Edge,
            StepName::ServiceDiscovery | StepName::ServiceLogs => Reads::Services,
            StepName::Mtls => Reads::EdgeAndServices,
            StepName::MetricsSettings | StepName::MetricsReporting | StepName::MetricsCollector => {
                Reads::Metrics
            }
        }
    }

    /// How far along a request's way through the mesh the check looks: the edge's
    /// routes, its discovery and its log, then the link between the sidecars, then
    /// the service sidecar and its local service. The conclusion names the deepest
    /// failure, since what fails further on explains what an earlier step sees (an
    /// edge `503 URX` is the service's refused connection seen from afar). The
    /// control server's configuration is what the sidecars route and connect by: a
    /// cluster it does not declare, or an edge that did not take its update, explains
    /// what the edge's checks see and a request that never reached the service's
    /// sidecar or failed its handshake (sent to an address it no longer lists); it
    /// does not explain the service sidecar's local cluster or the local service,
    /// which rank deeper. The metrics checks are another chain, ranked below every
    /// request check.
    pub fn depth(self) -> u8 {
        match self {
            StepName::MetricsCollector => 0,
            StepName::MetricsReporting => 1,
            StepName::MetricsSettings => 2,
            StepName::EdgeRoutes => 10,
            StepName::EdgeDiscovery => 11,
            StepName::EdgeLogs => 12,
            StepName::Mtls => 13,
            StepName::ControlServer => 14,
            StepName::ServiceDiscovery => 15,
            StepName::ServiceLogs => 16,
        }
    }
}

/// The evidence a check reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    Edge,
    Services,
    EdgeAndServices,
    Metrics,
    /// The zone's control server's view and the sidecars' sync with it.
    ControlServer,
}

impl fmt::Display for StepName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for StepName {
    type Err = StepNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StepName::ALL
            .into_iter()
            .find(|n| n.as_str() == s)
            .ok_or_else(|| StepNameError(s.chars().take(64).collect()))
    }
}

/// Most evidence lines one step carries; more are summarised in a last line.
pub const MAX_EVIDENCE: usize = 30;
/// Longest evidence line; longer lines (debug lines can be long) are cut.
pub const MAX_EVIDENCE_LEN: usize = 1024;

/// The outcome of one check.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
    /// The check could not run: its evidence was not collected or does not apply.
    Skipped,
}

/// One check of the playbook, with what it read and what to do next.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// Which check this is; serialised as its stable name (`edge_discovery`, ...).
    pub name: StepName,
    pub verdict: Verdict,
    /// The admin lines, counters and log lines the verdict rests on.
    pub evidence: Vec<String>,
    /// The next action in words.
    pub action: String,
}

impl Step {
    pub(crate) fn new(
        name: StepName,
        verdict: Verdict,
        evidence: Vec<String>,
        action: &str,
    ) -> Self {
        let mut evidence: Vec<String> = evidence
            .into_iter()
            .map(|e| crate::evidence::truncate(&e, MAX_EVIDENCE_LEN).to_owned())
            .collect();
        if evidence.len() > MAX_EVIDENCE {
            let more = evidence.len() - (MAX_EVIDENCE - 1);
            evidence.truncate(MAX_EVIDENCE - 1);
            evidence.push(format!("... and {more} more"));
        }
        Step {
            name,
            verdict,
            evidence,
            action: action.to_owned(),
        }
    }
}

/// The answer of `GET /diagnose/{clusterName}`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiagnosisReport {
    pub cluster: String,
    pub zone: String,
    /// The symptom diagnosed; `null` when every check ran.
    pub symptom: Option<Symptom>,
    /// The checks in the order they ran.
    pub steps: Vec<Step>,
    /// The deepest failing check with its concrete fact and action, or that no check
    /// failed. Across hops it starts with the root cause's cluster and owner.
    pub conclusion: String,
    /// The clusters the diagnosis followed, in order, starting with the one asked
    /// about (contract section 5, "Across hops").
    #[serde(default)]
    pub hops: Vec<Hop>,
    /// The deepest cluster whose own checks fail; `null` when no check failed.
    #[serde(default, rename = "rootCause")]
    pub root_cause: Option<RootCause>,
    /// History entries (section 15) of the clusters in `hops` from the lookback
    /// before the diagnosis, newest first.
    #[serde(default, rename = "recentChanges")]
    pub recent_changes: Vec<HistoryEntry>,
    /// The deepest failing check of this cluster and its finding, which the root
    /// cause quotes; not part of the answer.
    #[serde(skip)]
    pub failure: Option<Failure>,
}

/// A cluster the diagnosis followed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hop {
    pub zone_name: String,
    pub cluster_name: String,
    /// That cluster's own conclusion.
    #[serde(default)]
    pub conclusion: String,
}

/// The cluster a failure comes from, and whose it is.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RootCause {
    pub zone_name: String,
    pub cluster_name: String,
    /// The owner of the cluster's record ("" when unregistered).
    pub owner: String,
    #[serde(rename = "ownerURL")]
    pub owner_url: String,
    /// Its deepest failing check.
    pub step: StepName,
    /// That check's concrete fact (address, flags or counter).
    pub finding: String,
}

/// A cluster's deepest failing check and its finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub step: StepName,
    pub finding: String,
    /// The failure is an answer of the cluster's service itself: an error it
    /// answered, or a request it did not answer in time. A failing call of the
    /// service to another cluster can explain it, where it cannot explain a failure
    /// on the mesh's way to the service (discovery, routes, mTLS, a refused
    /// connection).
    pub answered_by_service: bool,
}

impl DiagnosisReport {
    /// The first failing step in the order the checks ran.
    pub fn first_failure(&self) -> Option<&Step> {
        self.steps.iter().find(|s| s.verdict == Verdict::Fail)
    }

    /// The step of that name.
    pub fn step(&self, name: StepName) -> Option<&Step> {
        self.steps.iter().find(|s| s.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names_round_trip() {
        for n in StepName::ALL {
            assert_eq!(n.as_str().parse::<StepName>(), Ok(n));
            assert_eq!(serde_json::to_string(&n).unwrap(), format!("\"{n}\""));
        }
        assert!("edge".parse::<StepName>().is_err());
    }
}
