//! Verify mTLS: the ssl counters of both sidecars and the TLS lines of a debug window.

use std::collections::BTreeSet;

use meshcat_common::envoy_log::TLS_MARKERS;

use super::{
    IDENTITY_ACTION, MAX_QUOTED_LINES, Outcome, SECRETS_NOT_READY, message_of, outcome, skipped,
    who,
};
use crate::evidence::{DiagnosisInput, Role, SidecarEvidence};
use crate::report::{StepName, Verdict};

/// Stat suffixes whose non-zero value is a TLS failure.
const SSL_FAILURES: [&str; 6] = [
    "ssl.connection_error",
    "ssl.fail_verify_cert_hash",
    "ssl.fail_verify_error",
    "ssl.fail_verify_no_cert",
    "ssl.fail_verify_san",
    "ssl.no_certificate",
];
/// Stat suffixes shown as context beside the failures.
const SSL_CONTEXT: [&str; 3] = [
    "ssl.handshake",
    "ssl.session_reused",
    "ssl_context_update_by_sds",
];

const TLS_CONFIG_ACTION: &str = "With the workload identity system, troubleshoot it; without it, check the SSL configuration (trusted CA, certificate, subject alternative names) of the service sidecar's domain and of the edge's cluster to the sidecar.";
const SAN_ACTION: &str = "The client side expects a subject alternative name that the server's certificate does not carry: make the SAN matcher of the edge's cluster to the sidecar (match_typed_subject_alt_names) name the service certificate's SAN, or reissue the certificate with that SAN; with the workload identity system, check the identity it issues for the service.";
const UNTRUSTED_ACTION: &str = "The server side does not trust the client's certificate: give both sidecars certificates from the CA the other side trusts (trusted_ca of the service sidecar's domain), or troubleshoot the workload identity system that issues them.";

fn tls_lines(side: &SidecarEvidence) -> Vec<String> {
    let lines = side.debug_lines.as_ref().or(side.log_lines.as_ref());
    let mut seen = BTreeSet::new();
    lines
        .into_iter()
        .flatten()
        .filter(|l| TLS_MARKERS.iter().any(|m| l.contains(m)))
        // Envoy repeats one failure on several lines (socket, pool, router); quote
        // each message once.
        .filter(|l| seen.insert(message_of(l).to_owned()))
        .take(MAX_QUOTED_LINES)
        .map(|l| format!("{} log: {l}", who(side)))
        .collect()
}

/// What the catalog's identity inventory says of the hop before any stats or log
/// is read: a SAN the caller requires and the target does not present, or a
/// certificate on either side that is expired or not valid yet. `None` when it
/// predicts no failure.
fn predicted(input: &DiagnosisInput) -> Option<Outcome> {
    const NAME: StepName = StepName::Mtls;
    let id = input.identity.as_ref()?;
    let (caller, target) = (id.caller.as_str(), input.cluster.as_str());
    let owned = |owner: &str| {
        if owner.is_empty() {
            "no owner registered".to_owned()
        } else {
            format!("owner {owner}")
        }
    };
    let owners = format!(
        "caller {caller} ({}), target {target} ({})",
        owned(&id.caller_owner),
        owned(&id.target_owner)
    );
    if let Some(tls) = id.tls.as_ref().filter(|t| !t.matches) {
        let expected = tls.expected_sans.join(", ");
        let presented = tls.presented_sans.join(", ");
        return Some(outcome(
            NAME,
            Verdict::Fail,
            vec![
                format!("{caller} requires of {target} a SAN matching: {expected}"),
                format!("{target}'s live instances present: {presented}"),
                owners.clone(),
            ],
            SAN_ACTION,
            format!(
                "{caller}'s sidecars require a SAN matching {expected} but {target}'s certificates present {presented}: the handshake fails ({owners})."
            ),
        ));
    }
    let bad = |side: &str, (instance, i): &(String, meshcat_common::identity::InstanceIdentity)| {
        let not_yet = i.valid_from_ms.is_some_and(|t| t > id.read_at_ms);
        let expired = i.state == meshcat_common::identity::CertState::Expired;
        (expired || not_yet).then(|| {
            let serial = i.serial.as_deref().unwrap_or("?");
            let at = meshcat_common::identity::rfc3339;
            let when = if expired {
                format!("expired at {}", at(i.expires_at_ms.unwrap_or(0)))
            } else {
                format!("not valid until {}", at(i.valid_from_ms.unwrap_or(0)))
            };
            format!("{side} {instance}: certificate {serial} {when}")
        })
    };
    let found: Vec<String> = id
        .callers
        .iter()
        .filter_map(|i| bad(caller, i))
        .chain(id.targets.iter().filter_map(|i| bad(target, i)))
        .collect();
    if found.is_empty() {
        return None;
    }
    let named = found.first().cloned().unwrap_or_default();
    let mut evidence = found;
    evidence.push(owners.clone());
    Some(outcome(
        NAME,
        Verdict::Fail,
        evidence,
        EXPIRED_ACTION,
        format!("{named}: its peers refuse it in the handshake ({owners})."),
    ))
}

const EXPIRED_ACTION: &str = "Replace the certificate: with the workload identity system, check that it still rotates (meshcat certs lists rotation-overdue certificates); for a certificate from a file, issue a new one and reload the sidecar.";

pub(super) fn mtls(input: &DiagnosisInput) -> Outcome {
    let seen = observed(input);
    let Some(mut predicted) = predicted(input) else {
        return seen;
    };
    // The prediction names the cause; what the sidecars counted or logged of it
    // follows as its confirmation.
    if seen.step.verdict == Verdict::Fail {
        predicted.step.evidence.extend(seen.step.evidence);
        predicted.finding = format!("{} {}", predicted.finding, seen.finding);
    }
    predicted
}

/// What the sidecars' ssl counters and TLS lines say of the hop.
fn observed(input: &DiagnosisInput) -> Outcome {
    const NAME: StepName = StepName::Mtls;
    let mut evidence = Vec::new();
    let mut failures = Vec::new();
    let mut secrets_missing = false;
    let mut collected = false;
    let mut tls_seen = false;
    for side in input.edge.iter().chain(&input.services) {
        let me = who(side);
        if let Some(stats) = &side.ssl_stats {
            collected = true;
            let mut any_ssl = false;
            // An edge talks to every service of the mesh: only its listeners and its
            // cluster to the diagnosed service speak for this diagnosis.
            let own_cluster = format!("cluster.{}.", input.edge_name());
            let relevant = stats.iter().filter(|(name, _)| {
                side.role == Role::Service
                    || !name.starts_with("cluster.")
                    || name.starts_with(&own_cluster)
            });
            for (name, value) in relevant {
                if name.contains(".ssl.") || name.starts_with("ssl.") {
                    any_ssl = true;
                }
                if SSL_FAILURES.iter().any(|s| name.ends_with(s)) && *value > 0 {
                    failures.push(format!("{me}: {name} = {value}"));
                } else if name.ends_with(SECRETS_NOT_READY) && *value > 0 {
                    secrets_missing = true;
                    failures.push(format!("{me}: {name} = {value}"));
                } else if SSL_CONTEXT.iter().any(|s| name.ends_with(s)) {
                    evidence.push(format!("{me}: {name} = {value}"));
                }
            }
            if !any_ssl {
                evidence.push(format!(
                    "{me}: no ssl.* counters (no TLS handshake attempted yet, or its secrets were never supplied)"
                ));
            }
        }
        // Info-level log lines carry no TLS failure, so they do not make the check
        // pass: only counters or a debug window do.
        if side.debug_lines.is_some() {
            collected = true;
        }
        if side.debug_lines.is_none() {
            evidence.push(format!(
                "{me}: no debug window collected; TLS lines appear at debug level only"
            ));
        }
        let lines = tls_lines(side);
        if lines
            .iter()
            .any(|l| l.contains("Secret is not supplied by SDS"))
        {
            secrets_missing = true;
        }
        tls_seen |= !lines.is_empty();
        failures.extend(lines);
    }
    if !collected && failures.is_empty() {
        return skipped(
            NAME,
            vec!["no ssl stats nor log lines were collected from either sidecar".into()],
            "Read /stats filtered on ssl from both sidecars, set debug level, repeat the failing request, restore the level and search the logs for TLS_error, TLS error or OPENSSL.",
        );
    }
    if failures.is_empty() {
        return outcome(
            NAME,
            Verdict::Pass,
            evidence,
            "None: no TLS failure counter is raised and no TLS error was logged.",
            "",
        );
    }
    let counted = failures.iter().filter(|f| !f.contains(" log: ")).count();
    failures.extend(evidence);
    if secrets_missing {
        outcome(
            NAME,
            Verdict::Fail,
            failures,
            IDENTITY_ACTION,
            "the sidecar's certificates were never supplied by the secrets (SDS) server.",
        )
    } else {
        let counters: Vec<&str> = failures
            .iter()
            .filter(|f| !f.contains(" log: "))
            .map(String::as_str)
            .collect();
        let named = counters
            .iter()
            .take(3)
            .copied()
            .collect::<Vec<_>>()
            .join("; ");
        let finding = match (counted, tls_seen) {
            (0, _) => "TLS errors were logged during the debug window.".to_owned(),
            (_, false) => format!("TLS failure counters are raised ({named})."),
            (_, true) => {
                format!("TLS failure counters are raised ({named}) and TLS errors were logged.")
            }
        };
        let action = if counters.iter().any(|c| c.contains("fail_verify_san")) {
            SAN_ACTION
        } else if counters
            .iter()
            .any(|c| c.contains("fail_verify_error") || c.contains("fail_verify_no_cert"))
        {
            UNTRUSTED_ACTION
        } else {
            TLS_CONFIG_ACTION
        };
        outcome(NAME, Verdict::Fail, failures, action, finding)
    }
}
