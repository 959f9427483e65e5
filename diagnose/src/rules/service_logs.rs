//! Read the service sidecars' logs: the edge's followed request traced into them, and
//! what their own line says about the local service. No trace of the request is a
//! finding only when the lines read reach back to the request's time.

use super::access::{edge_followed, entries_for, filter_text, followed, is_failure};
use super::coverage::{at_text, request_time, short_action, short_of};
use super::{MAX_QUOTED_LINES, Outcome, outcome, skipped, who};
use crate::accesslog::AccessLogEntry;
use crate::evidence::{DiagnosisInput, SidecarEvidence};
use crate::report::{StepName, Verdict};

pub(super) fn service_logs(input: &DiagnosisInput) -> Outcome {
    const NAME: StepName = StepName::ServiceLogs;
    let edge_last = edge_followed(input);
    if let Some(e) = &edge_last {
        if e.upstream_host.is_none() {
            return skipped(
                NAME,
                vec![format!(
                    "the edge's followed line for {} ({} {}) has upstream host '-': it never reached a service sidecar",
                    filter_text(input),
                    e.response_code,
                    e.flags_text()
                )],
                "Fix what the edge's line shows first.",
            );
        }
    }
    let edge_read = input.edge.as_ref().is_some_and(|e| e.log_lines.is_some());
    if edge_read && edge_last.is_none() {
        return skipped(
            NAME,
            vec![format!(
                "the edge's log has no line for {} to follow into the service sidecars",
                filter_text(input)
            )],
            "Fix what the edge's log shows first.",
        );
    }
    let request_id = edge_last.as_ref().and_then(|e| e.request_id.clone());
    let mut evidence = Vec::new();
    if let Some(e) = &edge_last {
        evidence.push(format!(
            "following the edge's line {} {} {} (request id {})",
            e.response_code,
            e.flags_text(),
            e.path.as_deref().unwrap_or("-"),
            request_id.as_deref().unwrap_or("-")
        ));
    }
    let mut read = 0;
    let mut traced = false;
    let mut failure: Option<ServiceFailure> = None;
    for side in &input.services {
        let Some(lines) = &side.log_lines else {
            continue;
        };
        read += 1;
        let me = who(side);
        let entries: Vec<_> = entries_for(input, lines)
            .into_iter()
            .filter(|(e, _)| request_id.is_none() || e.request_id == request_id)
            .collect();
        let Some((last, _)) = followed(&entries) else {
            continue;
        };
        traced = true;
        evidence.extend(
            entries
                .iter()
                .rev()
                .take(MAX_QUOTED_LINES)
                .rev()
                .map(|(_, l)| format!("{me} log: {l}")),
        );
        if is_failure(last) {
            failure.get_or_insert_with(|| service_failure(side, last));
        }
    }
    if read == 0 {
        return skipped(
            NAME,
            vec!["no service sidecar's log was read".into()],
            "Run the service's meshcat agents with --sidecar-log-file, or read the service sidecar's logs with the container runtime's log command.",
        );
    }
    if let Some(f) = failure {
        let mut o = outcome(NAME, Verdict::Fail, evidence, &f.action, f.finding);
        o.answered_by_service = f.answered_by_service;
        return o;
    }
    if !traced {
        let what = match (&request_id, &input.path) {
            (Some(id), _) => format!("request id {id}"),
            (None, Some(p)) => format!("path {p}"),
            (None, None) => "any request".to_owned(),
        };
        if edge_last.is_none() && input.path.is_none() {
            return skipped(
                NAME,
                vec![format!(
                    "no access line for {what} in {read} service sidecar logs, and no request to follow"
                )],
                "Replay the failing request and diagnose with its path.",
            );
        }
        evidence.push(format!(
            "no access line for {what} in {read} service sidecar logs"
        ));
        if let Some(at) = request_time(input) {
            let short = short_of(input.services.iter(), request_id.as_deref(), at);
            if !short.is_empty() {
                evidence.push(format!("the request was made at {}", at_text(at)));
                evidence.extend(short.iter().map(|(_, line)| line.clone()));
                return skipped(NAME, evidence, &short_action(&short));
            }
        }
        let host = edge_last
            .as_ref()
            .and_then(|e| e.upstream_host.clone())
            .map_or_else(String::new, |h| format!(" at {h}"));
        let mut o = outcome(
            NAME,
            Verdict::Fail,
            evidence,
            "The request never reached the service sidecar's HTTP layer: the likely cause is an mTLS problem between the edge and the sidecar; verify mTLS (ssl counters of both sides, TLS lines at debug level).",
            format!(
                "the service sidecar{host} shows no trace of the request: it failed between the edge and the sidecar."
            ),
        );
        // The failure lies on the link between the sidecars, where the mTLS check's
        // counters say more than the missing line.
        o.depth = StepName::Mtls.depth();
        return o;
    }
    outcome(
        NAME,
        Verdict::Pass,
        evidence,
        "None: the service sidecar served the request.",
        "",
    )
}

/// What a service sidecar's failing access line says.
struct ServiceFailure {
    action: String,
    finding: String,
    /// The local service answered the error, or did not answer in time.
    answered_by_service: bool,
}

/// The action and finding of a service sidecar's failing access line.
fn service_failure(side: &SidecarEvidence, e: &AccessLogEntry) -> ServiceFailure {
    let code = e.response_code;
    let flags = e.flags_text();
    let inst = &side.instance;
    let (action, finding, answered_by_service) = match e.upstream_host.as_deref() {
        None => (
            "Discovery problem from the sidecar to the service: set the local cluster's address explicitly (the instance's address and port).",
            format!(
                "the service sidecar {inst} has no endpoint for its local service: it answered {code} {flags} with upstream host '-'."
            ),
            false,
        ),
        Some(h) if e.has_flag("UF") => (
            "Start the local service, or make it listen on the local cluster's address; if it listens on another port, set the local cluster's port (the instance's address and port) to it.",
            format!(
                "the local service refuses connections at {h}: the service sidecar {inst} answered {code} {flags}."
            ),
            false,
        ),
        Some(h) if e.has_flag("UT") || e.has_flag("UC") || e.has_flag("UR") => (
            "The local service accepted the connection but did not answer in time or reset it: look at the service's own logs and load.",
            format!(
                "the local service at {h} timed out or reset the request: the service sidecar {inst} answered {code} {flags}."
            ),
            true,
        ),
        Some(h) => (
            "The local service answered the error itself: look at the service's own logs.",
            format!(
                "the local service at {h} answered {code} {flags} through the service sidecar {inst}."
            ),
            true,
        ),
    };
    ServiceFailure {
        action: action.to_owned(),
        finding,
        answered_by_service,
    }
}
