//! Read the edge's log: the access line of the failing request and what its code,
//! flags and upstream host say, with the workload identity system's own lines.

use std::collections::BTreeSet;

use super::access::{edge_entries, filter_text, followed, is_failure};
use super::coverage::{cut_short, short_action};
use super::{
    IDENTITY_ACTION, MAX_QUOTED_LINES, Outcome, SECRETS_NOT_READY, message_of, outcome, skipped,
    who,
};
use crate::evidence::{DiagnosisInput, SidecarEvidence};
use crate::report::{StepName, Verdict};
use crate::symptom::Symptom;

const TOKEN_FILTER_ACTION: &str = "A filter of the edge's chain (the token filter) failed: check that the token service and its sidecar are running, then troubleshoot the workload identity system, then verify discovery and mTLS from the edge to the token service.";

/// Evidence that the workload identity system is at fault: secrets stream closed with
/// an upstream connect error, initial fetch of secrets timed out, or secrets-not-ready
/// counters.
fn identity_evidence(side: &SidecarEvidence) -> Vec<String> {
    let me = who(side);
    let mut out: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    for l in side.log_lines.iter().chain(&side.debug_lines).flatten() {
        let sds_closed = (l.contains("StreamSecrets") || l.contains("SecretDiscoveryService"))
            && l.contains("closed")
            && l.contains("upstream connect error");
        let fetch_timeout = l.contains("initial fetch timed out") && l.contains("Secret");
        if (sds_closed || fetch_timeout) && seen.insert(message_of(l).to_owned()) {
            out.push(format!("{me} log: {l}"));
        }
    }
    out.truncate(MAX_QUOTED_LINES);
    for (name, value) in side.ssl_stats.iter().flatten() {
        if name.ends_with(SECRETS_NOT_READY) && *value > 0 {
            out.push(format!("{me}: {name} = {value}"));
        }
    }
    out
}

/// Places an edge line's failure at the depth of the check that owns its cause (a
/// `404 NR` is a routing failure, a `503 UH` a discovery one), so the conclusion
/// names that check's more direct fact when it failed too.
fn routing(mut o: Outcome, owner: StepName) -> Outcome {
    o.depth = owner.depth();
    o
}

pub(super) fn edge_logs(input: &DiagnosisInput) -> Outcome {
    const NAME: StepName = StepName::EdgeLogs;
    let edge = input.edge.as_ref();
    let Some((edge, lines)) = edge.and_then(|e| e.log_lines.as_ref().map(|l| (e, l))) else {
        return skipped(
            NAME,
            vec!["the edge sidecar's log was not read".into()],
            "Run the edge's meshcat agent with --sidecar-log-file, or read the edge sidecar's logs with the container runtime's log command.",
        );
    };
    let me = who(edge);
    let entries = edge_entries(input, edge, lines);
    let identity = identity_evidence(edge);
    let filter = filter_text(input);
    let mut evidence: Vec<String> = entries
        .iter()
        .rev()
        .take(MAX_QUOTED_LINES)
        .rev()
        .map(|(_, l)| format!("{me} log: {l}"))
        .collect();
    let chosen = followed(&entries);
    if let Some((_, line)) = chosen {
        let failing = entries.iter().filter(|(e, _)| is_failure(e)).count();
        evidence.push(format!(
            "{me}: {} access lines for {filter}, {failing} failing; followed: {line}",
            entries.len()
        ));
    }
    let Some((last, _)) = chosen else {
        evidence.push(format!(
            "{me}: no access line for {filter} among {} log lines",
            lines.len()
        ));
        evidence.extend(identity.iter().cloned());
        if !identity.is_empty() {
            return outcome(
                NAME,
                Verdict::Fail,
                evidence,
                IDENTITY_ACTION,
                "the edge has no line for the request and its secrets (SDS) stream is failing.",
            );
        }
        if input.path.is_none() && edge.clusters.is_none() && edge.routes.is_none() {
            evidence.push(format!(
                "{me}: without its /clusters or /config_dump no line can be told to be {}'s",
                input.cluster
            ));
            return skipped(
                NAME,
                evidence,
                "Diagnose with the failing request's path, or let the edge's agent read its admin API.",
            );
        }
        if input.path.is_some() || input.symptom == Some(Symptom::Ingress502503) {
            // Without a line there is no request time to compare with: a log read
            // whose older lines were dropped may have lost the request's.
            if let Some(short) = cut_short(edge) {
                evidence.push(short.1.clone());
                return skipped(NAME, evidence, &short_action(&[short]));
            }
            return outcome(
                NAME,
                Verdict::Fail,
                evidence,
                TOKEN_FILTER_ACTION,
                format!(
                    "the edge wrote no access line for {filter}: a filter of its chain failed before routing."
                ),
            );
        }
        return skipped(
            NAME,
            evidence,
            "Replay the failing request and read the edge's log again, filtered on its path.",
        );
    };
    let code = last.response_code;
    let flags = last.flags_text();
    let host = last.upstream_host.as_deref();
    if !is_failure(last) {
        return outcome(
            NAME,
            Verdict::Pass,
            evidence,
            "None: the edge's requests for the cluster succeeded.",
            "",
        );
    }
    if last.has_flag("UAEX") {
        let finding = format!("the edge's token filter answered {code} UAEX.");
        evidence.extend(identity.iter().cloned());
        let action = if identity.is_empty() {
            TOKEN_FILTER_ACTION
        } else {
            IDENTITY_ACTION
        };
        return outcome(NAME, Verdict::Fail, evidence, action, finding);
    }
    if last.has_flag("NC") {
        return routing(
            outcome(
                NAME,
                Verdict::Fail,
                evidence,
                "The route names a cluster that does not exist: create the cluster (or fix the route) and verify that all mesh objects for the service exist.",
                format!(
                    "the edge answered {code} NC: its route names a cluster that does not exist."
                ),
            ),
            StepName::EdgeRoutes,
        );
    }
    if last.has_flag("NR") {
        return routing(
            outcome(
                NAME,
                Verdict::Fail,
                evidence,
                "No route of the edge takes the path: add the route (route and shared_rules objects) to the service's cluster.",
                format!("the edge answered {code} NR: no route takes {filter}."),
            ),
            StepName::EdgeRoutes,
        );
    }
    if !identity.is_empty() {
        evidence.extend(identity);
        return outcome(
            NAME,
            Verdict::Fail,
            evidence,
            IDENTITY_ACTION,
            format!("the edge answered {code} {flags} while its secrets (SDS) stream fails."),
        );
    }
    if code == 503 && (last.has_flag("UH") || host.is_none()) {
        return routing(
            outcome(
                NAME,
                Verdict::Fail,
                evidence,
                "Discovery problem: verify that all mesh objects for the service exist (cluster, route, shared_rules, domain and listener objects) and that instances are registered.",
                match edge.cluster(input.edge_name()) {
                    Some(c) if c.hosts.is_empty() => format!(
                        "the edge answered 503 {flags} with upstream host '-': its cluster {} has no endpoints.",
                        input.edge_name()
                    ),
                    _ => format!(
                        "the edge answered 503 {flags} with upstream host '-': a discovery problem."
                    ),
                },
            ),
            StepName::EdgeDiscovery,
        );
    }
    if let Some(h) = host {
        let connect_failed = last.has_flag("UF") || last.has_flag("URX");
        if connect_failed || code == 503 {
            let mut o = outcome(
                NAME,
                Verdict::Fail,
                evidence,
                "Discovery from the edge to the sidecar works: check the service sidecar's logs.",
                format!("the edge answered {code} {flags} from the service sidecar {h}."),
            );
            // Without a connection failure, the 503 came back from the service.
            o.answered_by_service = !connect_failed;
            return o;
        }
    }
    let mut o = outcome(
        NAME,
        Verdict::Fail,
        evidence,
        "Look at the edge's line: its response flags name the failure; then check the service sidecar's logs.",
        format!("the edge answered {code} {flags}."),
    );
    // A 5xx from a host (an error answered, or a timeout): the service's answer.
    o.answered_by_service = code >= 500 && host.is_some();
    o
}
