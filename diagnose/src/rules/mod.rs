//! The engine: seed section 7's checks, run in the seed's order for the symptom, each
//! turning evidence into a verdict, the lines it rests on and the next action. One
//! file per step of the playbook; this one runs them and holds what they share. The
//! zone's control server is read first among the discovery steps when the zone has a
//! view of it.

mod access;
mod control;
mod coverage;
mod discovery;
mod edge_logs;
mod metrics;
mod mtls;
mod routes;
mod service_logs;
#[cfg(test)]
mod tests;

use crate::evidence::{DiagnosisInput, Role, SidecarEvidence};
use crate::report::{DiagnosisReport, Failure, Step, StepName, Verdict};
use crate::symptom::Symptom;

pub use access::edge_weight;
pub use coverage::request_to_ask;

/// Suffix of the counters that rise while a secret (SDS) is missing.
const SECRETS_NOT_READY: &str = "_context_secrets_not_ready";
/// Most log lines of one kind quoted per sidecar.
const MAX_QUOTED_LINES: usize = 6;

const DISCOVERY_ABSENT: &str = "The cluster does not exist in this sidecar: verify that all mesh objects for the service exist (cluster, route and shared_rules objects) and that the control plane delivered them; then dump the sidecar configuration and compare it with the intended mesh configuration.";
const IDENTITY_ACTION: &str = "The fault is in the workload identity system: make sure its server and agents are running, then restart all pods.";

/// A check's result with the one-sentence finding the conclusion quotes.
struct Outcome {
    step: Step,
    finding: String,
    /// Where along the request the failure lies ([`StepName::depth`] unless the
    /// finding places it elsewhere: "no trace in the service sidecar" is a failure of
    /// the link between the sidecars).
    depth: u8,
    /// The failure is the service's own answer ([`Failure::answered_by_service`]).
    answered_by_service: bool,
}

fn outcome(
    name: StepName,
    verdict: Verdict,
    evidence: Vec<String>,
    action: &str,
    finding: impl Into<String>,
) -> Outcome {
    Outcome {
        step: Step::new(name, verdict, evidence, action),
        finding: finding.into(),
        depth: name.depth(),
        answered_by_service: false,
    }
}

/// A check skipped for lack of evidence: what was not read, and how to get it.
fn skipped(name: StepName, evidence: Vec<String>, action: &str) -> Outcome {
    outcome(name, Verdict::Skipped, evidence, action, "")
}

/// Runs the checks of the input's symptom (all of them when `None`) in the seed's
/// order and sums them up.
pub fn diagnose(input: &DiagnosisInput) -> DiagnosisReport {
    type Check = fn(&DiagnosisInput) -> Vec<Outcome>;
    // Only with a view of the zone's control server: without one the report is the
    // playbook's alone.
    let control_server: Check = |i| control::control_server(i).into_iter().collect();
    let discovery_edge: Check = |i| vec![discovery::edge_discovery(i)];
    let discovery_service: Check = |i| vec![discovery::service_discovery(i)];
    let mtls_check: Check = |i| vec![mtls::mtls(i)];
    let routes: Check = |i| vec![routes::edge_routes(i)];
    let logs_edge: Check = |i| vec![edge_logs::edge_logs(i)];
    let logs_service: Check = |i| vec![service_logs::service_logs(i)];
    let metric_checks: Check = metrics::metrics;
    // The seed's steps first, in its order (the control server's declaration before
    // what the sidecars discover of it); the log rules then follow the request
    // through both sidecars, which pinpoints what discovery alone cannot see (a dead
    // service behind a discovered host).
    let sidecar_checks = vec![
        control_server,
        discovery_edge,
        discovery_service,
        mtls_check,
        routes,
        logs_edge,
        logs_service,
    ];
    let checks: Vec<Check> = match input.symptom {
        Some(Symptom::UpstreamConnectError) => sidecar_checks,
        Some(Symptom::NoHealthyUpstream) => {
            vec![
                control_server,
                discovery_edge,
                discovery_service,
                logs_edge,
                logs_service,
            ]
        }
        Some(Symptom::Ingress502503) => vec![logs_edge, logs_service],
        Some(Symptom::MissingMetrics) => vec![metric_checks],
        None => [sidecar_checks, vec![metric_checks]].concat(),
    };
    let outcomes: Vec<Outcome> = checks.into_iter().flat_map(|c| c(input)).collect();
    let deepest = deepest_failure(&outcomes);
    let conclusion = conclude(&outcomes, deepest);
    let failure = deepest.map(|o| Failure {
        step: o.step.name,
        finding: o.finding.clone(),
        answered_by_service: o.answered_by_service,
    });
    DiagnosisReport {
        cluster: input.cluster.clone(),
        zone: input.zone.clone(),
        symptom: input.symptom,
        steps: outcomes.into_iter().map(|o| o.step).collect(),
        conclusion,
        hops: Vec::new(),
        root_cause: None,
        recent_changes: Vec::new(),
        failure,
    }
}

/// The deepest failure (on a tie, the check that ran first: it holds the more direct
/// fact, such as the ssl counter beside the missing trace).
fn deepest_failure(outcomes: &[Outcome]) -> Option<&Outcome> {
    outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| o.step.verdict == Verdict::Fail)
        .max_by_key(|(i, o)| (o.depth, std::cmp::Reverse(*i)))
        .map(|(_, o)| o)
}

/// Names the deepest failure with its finding and action; else says which checks
/// lacked evidence.
fn conclude(outcomes: &[Outcome], deepest: Option<&Outcome>) -> String {
    if let Some(o) = deepest {
        return format!("{} failed: {} {}", o.step.name, o.finding, o.step.action);
    }
    let skipped: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.step.verdict == Verdict::Skipped)
        .map(|o| o.step.name.as_str())
        .collect();
    if skipped.is_empty() {
        "All checks passed.".to_owned()
    } else {
        format!(
            "No check failed; skipped for lack of evidence: {}.",
            skipped.join(", ")
        )
    }
}

fn who(side: &SidecarEvidence) -> String {
    let role = match side.role {
        Role::Edge => "edge",
        Role::Service => "service",
    };
    format!("{role} {}", side.instance)
}

/// The message of an Envoy log line, without its time, thread and connection tags.
fn message_of(line: &str) -> &str {
    let msg = line.rsplit_once("] ").map_or(line, |(_, m)| m);
    msg.split_once("reason: ").map_or(msg, |(_, r)| r)
}

/// Whether a route's match takes `path` (prefix and exact path only; other matchers
/// are taken as matching, since they cannot be judged here).
fn route_matches(matcher: &str, path: &str) -> bool {
    if let Some(p) = matcher.strip_prefix("prefix ") {
        path.starts_with(p)
    } else if let Some(p) = matcher.strip_prefix("path ") {
        path.split('?').next() == Some(p)
    } else {
        true
    }
}
