//! The engine: seed section 7's checks, run in the seed's order for the symptom, each
//! turning evidence into a verdict, the lines it rests on and the next action.

use std::collections::BTreeSet;

use meshcat_common::wire::UpstreamCluster;

use crate::accesslog::{self, AccessLogEntry};
use crate::evidence::{DiagnosisInput, MetricsEvidence, Role, SidecarEvidence};
use crate::report::{DiagnosisReport, Step, StepName, Verdict};
use crate::symptom::Symptom;

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
/// Suffix of the counters that rise while a secret (SDS) is missing.
const SECRETS_NOT_READY: &str = "_context_secrets_not_ready";
/// Markers of TLS lines in Envoy's log (debug level); both Envoy spellings and the
/// seed's `TLS error`.
const TLS_MARKERS: [&str; 3] = ["TLS_error", "TLS error", "OPENSSL"];
/// Most log lines of one kind quoted per sidecar.
const MAX_QUOTED_LINES: usize = 6;

const DISCOVERY_ABSENT: &str = "The cluster does not exist in this sidecar: verify that all mesh objects for the service exist (cluster, route and shared_rules objects) and that the control plane delivered them; then dump the sidecar configuration and compare it with the intended mesh configuration.";
const DISCOVERY_NO_HOST: &str = "The cluster is not linked to any instance: check the route and shared_rules objects that link it to the sidecar and that the service's instances are registered and running.";
const DISCOVERY_UNHEALTHY: &str = "Hosts are discovered but none is healthy: look at the service's instances and their health checks.";
const IDENTITY_ACTION: &str = "The fault is in the workload identity system: make sure its server and agents are running, then restart all pods.";
const TLS_CONFIG_ACTION: &str = "With the workload identity system, troubleshoot it; without it, check the SSL configuration (trusted CA, certificate, subject alternative names) of the service sidecar's domain and of the edge's cluster to the sidecar.";
const SAN_ACTION: &str = "The client side expects a subject alternative name that the server's certificate does not carry: make the SAN matcher of the edge's cluster to the sidecar (match_typed_subject_alt_names) name the service certificate's SAN, or reissue the certificate with that SAN; with the workload identity system, check the identity it issues for the service.";
const UNTRUSTED_ACTION: &str = "The server side does not trust the client's certificate: give both sidecars certificates from the CA the other side trusts (trusted_ca of the service sidecar's domain), or troubleshoot the workload identity system that issues them.";
const TOKEN_FILTER_ACTION: &str = "A filter of the edge's chain (the token filter) failed: check that the token service and its sidecar are running, then troubleshoot the workload identity system, then verify discovery and mTLS from the edge to the token service.";
const COLLECTOR_ACTION_TAIL: &str = "to the namespace list under the pod discovery setting of the metrics collector's scrape configuration (kubernetes_sd_configs, role pod, namespaces.names) through the operator input configuration, then restart the collector.";

/// A check's result with the one-sentence finding the conclusion quotes.
struct Outcome {
    step: Step,
    finding: String,
    /// Where along the request the failure lies ([`StepName::depth`] unless the
    /// finding places it elsewhere: "no trace in the service sidecar" is a failure of
    /// the link between the sidecars).
    depth: u8,
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
    }
}

/// Runs the checks of the input's symptom (all of them when `None`) in the seed's
/// order and sums them up.
pub fn diagnose(input: &DiagnosisInput) -> DiagnosisReport {
    type Check = fn(&DiagnosisInput) -> Vec<Outcome>;
    let discovery_edge: Check = |i| vec![edge_discovery(i)];
    let discovery_service: Check = |i| vec![service_discovery(i)];
    let mtls_check: Check = |i| vec![mtls(i)];
    let routes: Check = |i| vec![edge_routes(i)];
    let logs_edge: Check = |i| vec![edge_logs(i)];
    let logs_service: Check = |i| vec![service_logs(i)];
    let metric_checks: Check = metrics;
    let checks: Vec<Check> = match input.symptom {
        // The seed's steps first, in its order; the log rules then follow the request
        // through both sidecars, which pinpoints what discovery alone cannot see (a
        // dead service behind a discovered host).
        Some(Symptom::UpstreamConnectError) => vec![
            discovery_edge,
            discovery_service,
            mtls_check,
            routes,
            logs_edge,
            logs_service,
        ],
        Some(Symptom::NoHealthyUpstream) => {
            vec![discovery_edge, discovery_service, logs_edge, logs_service]
        }
        Some(Symptom::Ingress502503) => vec![logs_edge, logs_service],
        Some(Symptom::MissingMetrics) => vec![metric_checks],
        None => vec![
            discovery_edge,
            discovery_service,
            mtls_check,
            routes,
            logs_edge,
            logs_service,
            metric_checks,
        ],
    };
    let outcomes: Vec<Outcome> = checks.into_iter().flat_map(|c| c(input)).collect();
    let conclusion = conclude(&outcomes);
    DiagnosisReport {
        cluster: input.cluster.clone(),
        zone: input.zone.clone(),
        symptom: input.symptom,
        steps: outcomes.into_iter().map(|o| o.step).collect(),
        conclusion,
    }
}

/// Names the deepest failure (on a tie, the check that ran first: it holds the more
/// direct fact, such as the ssl counter beside the missing trace), with its finding
/// and action; else says which checks lacked evidence.
fn conclude(outcomes: &[Outcome]) -> String {
    let deepest = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| o.step.verdict == Verdict::Fail)
        .max_by_key(|(i, o)| (o.depth, std::cmp::Reverse(*i)));
    if let Some((_, o)) = deepest {
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

fn host_line(cluster: &str, h: &meshcat_common::wire::UpstreamHost) -> String {
    let note = if h.cx_connect_fail > 0 {
        " (discovered, but connections to it fail)"
    } else {
        ""
    };
    format!(
        "{cluster}::{} cx_active={} cx_connect_fail={} cx_total={} rq_active={} rq_error={} rq_total={} health_flags={}{note}",
        h.address,
        h.cx_active,
        h.cx_connect_fail,
        h.cx_total,
        h.rq_active,
        h.rq_error,
        h.rq_total,
        h.health_flags
    )
}

/// Verdict of one sidecar's `/clusters` for one cluster name.
fn discover(
    side: &SidecarEvidence,
    clusters: &[UpstreamCluster],
    name: &str,
    evidence: &mut Vec<String>,
) -> Result<(), (&'static str, String)> {
    let me = who(side);
    let Some(c) = clusters.iter().find(|c| c.name == name) else {
        let mut names: Vec<&str> = clusters.iter().map(|c| c.name.as_str()).collect();
        names.sort_unstable();
        let shown = names
            .iter()
            .take(20)
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        evidence.push(format!(
            "{me}: /clusters lists {} clusters, none named {name} ({shown})",
            names.len()
        ));
        return Err((
            DISCOVERY_ABSENT,
            format!("the cluster {name} does not exist in the {me} sidecar."),
        ));
    };
    if c.hosts.is_empty() {
        evidence.push(format!(
            "{me}: /clusters lists {name} without any host line"
        ));
        return Err((
            DISCOVERY_NO_HOST,
            format!("the {me} sidecar lists {name} without a host: it has no endpoints."),
        ));
    }
    for h in &c.hosts {
        evidence.push(format!("{me}: {}", host_line(name, h)));
    }
    if c.hosts.iter().all(|h| h.health_flags != "healthy") {
        return Err((
            DISCOVERY_UNHEALTHY,
            format!("the {me} sidecar lists hosts for {name} but none is healthy."),
        ));
    }
    Ok(())
}

fn edge_discovery(input: &DiagnosisInput) -> Outcome {
    const NAME: StepName = StepName::EdgeDiscovery;
    let Some(edge) = &input.edge else {
        return outcome(
            NAME,
            Verdict::Skipped,
            vec!["no evidence from the edge sidecar (the zone's requestCluster)".into()],
            "Set the zone's requestCluster and run a meshcat agent beside its sidecar.",
            "",
        );
    };
    let Some(clusters) = &edge.clusters else {
        return outcome(
            NAME,
            Verdict::Skipped,
            vec![format!("{}: /clusters was not read", who(edge))],
            "Check that the agent beside the edge sidecar reaches its admin API.",
            "",
        );
    };
    let mut evidence = Vec::new();
    match discover(edge, clusters, &input.cluster, &mut evidence) {
        Ok(()) => outcome(
            NAME,
            Verdict::Pass,
            evidence,
            "None: the edge discovers the service.",
            "",
        ),
        Err((action, finding)) => outcome(NAME, Verdict::Fail, evidence, action, finding),
    }
}

/// The clusters of a service sidecar that lead to its local instance.
fn local_clusters(input: &DiagnosisInput, side: &SidecarEvidence) -> Vec<String> {
    if let Some(name) = &input.service_local_cluster {
        return vec![name.clone()];
    }
    let named: BTreeSet<String> = side
        .routes
        .iter()
        .flatten()
        .map(|r| r.cluster.clone())
        .collect();
    if named.is_empty() {
        vec![input.cluster.clone()]
    } else {
        named.into_iter().collect()
    }
}

fn service_discovery(input: &DiagnosisInput) -> Outcome {
    const NAME: StepName = StepName::ServiceDiscovery;
    let mut evidence = Vec::new();
    let mut failure = None;
    let mut read = 0;
    for side in &input.services {
        let Some(clusters) = &side.clusters else {
            evidence.push(format!("{}: /clusters was not read", who(side)));
            continue;
        };
        read += 1;
        for name in local_clusters(input, side) {
            if let Err(f) = discover(side, clusters, &name, &mut evidence) {
                failure.get_or_insert(f);
            }
        }
    }
    if let Some((action, finding)) = failure {
        return outcome(NAME, Verdict::Fail, evidence, action, finding);
    }
    if read == 0 {
        if input.services.is_empty() {
            evidence.push(format!(
                "no service sidecar of {} reported in zone {}",
                input.cluster, input.zone
            ));
        }
        return outcome(
            NAME,
            Verdict::Skipped,
            evidence,
            "Check that the service's pods run with their sidecar and a meshcat agent.",
            "",
        );
    }
    outcome(
        NAME,
        Verdict::Pass,
        evidence,
        "None: the service sidecars discover their local instance.",
        "",
    )
}

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

/// The message of an Envoy log line, without its time, thread and connection tags.
fn message_of(line: &str) -> &str {
    let msg = line.rsplit_once("] ").map_or(line, |(_, m)| m);
    msg.split_once("reason: ").map_or(msg, |(_, r)| r)
}

fn mtls(input: &DiagnosisInput) -> Outcome {
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
            let own_cluster = format!("cluster.{}.", input.cluster);
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
        return outcome(
            NAME,
            Verdict::Skipped,
            vec!["no ssl stats nor log lines were collected from either sidecar".into()],
            "Read /stats filtered on ssl from both sidecars, set debug level, repeat the failing request, restore the level and search the logs for TLS_error, TLS error or OPENSSL.",
            "",
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

fn edge_routes(input: &DiagnosisInput) -> Outcome {
    const NAME: StepName = StepName::EdgeRoutes;
    let name = &input.cluster;
    let Some(edge) = input.edge.as_ref().filter(|e| e.routes.is_some()) else {
        return outcome(
            NAME,
            Verdict::Skipped,
            vec!["the edge sidecar's /config_dump was not read".into()],
            "Dump the edge sidecar's configuration and compare it with the intended mesh configuration.",
            "",
        );
    };
    let me = who(edge);
    let routes: Vec<_> = edge.routes_to(name).collect();
    let mut evidence: Vec<String> = routes
        .iter()
        .map(|r| {
            format!(
                "{me}: route configuration {}, virtual host {}, {} -> cluster {}",
                r.route_config, r.virtual_host, r.matcher, r.cluster
            )
        })
        .collect();
    if routes.is_empty() {
        if edge.dynamic_routes {
            evidence.push(format!(
                "{me}: no route names {name}, but some routes pick their cluster from a header"
            ));
            return outcome(
                NAME,
                Verdict::Skipped,
                evidence,
                "Check the header-selected routes of the edge against the intended mesh configuration.",
                "",
            );
        }
        evidence.push(format!(
            "{me}: no route of {} routes in /config_dump names {name}",
            edge.routes.as_ref().map_or(0, Vec::len)
        ));
        return outcome(
            NAME,
            Verdict::Fail,
            evidence,
            "Add the route (route and shared_rules objects) that links the edge to the cluster, then compare the edge's configuration dump with the intended mesh configuration.",
            format!("no route of the edge names {name}: it is not routed, requests get 404 NR."),
        );
    }
    if let Some(path) = &input.path {
        if !routes.iter().any(|r| route_matches(&r.matcher, path)) {
            evidence.push(format!("{me}: no route naming {name} matches path {path}"));
            return outcome(
                NAME,
                Verdict::Fail,
                evidence,
                "Fix the route's match so the path reaches the cluster, then compare the edge's configuration dump with the intended mesh configuration.",
                format!("the edge routes {name}, but not for {path}."),
            );
        }
    }
    if edge.clusters.is_some() && edge.cluster(name).is_none() {
        evidence.push(format!(
            "{me}: the routes name {name} but /clusters has no such cluster (Envoy answers 503 NC)"
        ));
        return outcome(
            NAME,
            Verdict::Fail,
            evidence,
            DISCOVERY_ABSENT,
            format!("the edge routes to {name}, a cluster it does not have."),
        );
    }
    outcome(
        NAME,
        Verdict::Pass,
        evidence,
        "None: the edge's routes send the traffic to the cluster.",
        "",
    )
}

/// Access lines of a sidecar for the input's path (all of them without one), oldest
/// first.
fn entries_for<'a>(input: &DiagnosisInput, lines: &'a [String]) -> Vec<(AccessLogEntry, &'a str)> {
    accesslog::parse_lines(lines.iter().map(String::as_str))
        .into_iter()
        .filter(|(e, _)| input.path.as_deref().is_none_or(|p| e.matches_path(p)))
        .collect()
}

/// The clusters the edge's first route matching `path` sends to (several for weighted
/// clusters); `None` when no route takes the path or the routes were not read.
fn routed_to<'a>(edge: &'a SidecarEvidence, path: &str) -> Option<Vec<&'a str>> {
    let routes = edge.routes.as_ref()?;
    let first = routes.iter().find(|r| route_matches(&r.matcher, path))?;
    Some(
        routes
            .iter()
            .filter(|r| {
                r.route_config == first.route_config
                    && r.virtual_host == first.virtual_host
                    && r.matcher == first.matcher
            })
            .map(|r| r.cluster.as_str())
            .collect(),
    )
}

/// The edge's access lines that belong to the diagnosed cluster, oldest first. With a
/// path, the lines of that path. Without, the lines whose upstream host is one of
/// the cluster's hosts at the edge, or whose path the edge routes to the cluster
/// (a request that never reached a host: `503 UH`, `503 NC`) and whose host, if any,
/// belongs to no other cluster: never another cluster's traffic.
fn edge_entries<'a>(
    input: &DiagnosisInput,
    edge: &SidecarEvidence,
    lines: &'a [String],
) -> Vec<(AccessLogEntry, &'a str)> {
    let entries = entries_for(input, lines);
    if input.path.is_some() {
        return entries;
    }
    let name = input.cluster.as_str();
    let own: BTreeSet<&str> = edge
        .cluster(name)
        .into_iter()
        .flat_map(|c| c.hosts.iter().map(|h| h.address.as_str()))
        .collect();
    let others: BTreeSet<&str> = edge
        .clusters
        .iter()
        .flatten()
        .filter(|c| c.name != name)
        .flat_map(|c| c.hosts.iter().map(|h| h.address.as_str()))
        .collect();
    entries
        .into_iter()
        .filter(|(e, _)| match e.upstream_host.as_deref() {
            Some(h) if own.contains(h) => true,
            Some(h) if others.contains(h) => false,
            _ => e
                .path_only()
                .and_then(|p| routed_to(edge, p))
                .is_some_and(|cs| cs.contains(&name)),
        })
        .collect()
}

/// The line to follow among `entries`: the newest failing one, else the newest.
fn followed<'e, 'a>(
    entries: &'e [(AccessLogEntry, &'a str)],
) -> Option<&'e (AccessLogEntry, &'a str)> {
    entries
        .iter()
        .rev()
        .find(|(e, _)| is_failure(e))
        .or_else(|| entries.last())
}

/// The edge line the service checks follow.
fn edge_followed(input: &DiagnosisInput) -> Option<AccessLogEntry> {
    let edge = input.edge.as_ref()?;
    let lines = edge.log_lines.as_ref()?;
    let entries = edge_entries(input, edge, lines);
    followed(&entries).map(|(e, _)| e.clone())
}

/// How much an edge instance's log says about the diagnosis, for choosing among the
/// edge instances: `None` without a line for the cluster (or path); else whether the
/// followed line fails, and its start time. Larger is better: a failing line beats
/// any success, then the newer line wins.
pub fn edge_weight(input: &DiagnosisInput, edge: &SidecarEvidence) -> Option<(bool, String)> {
    let lines = edge.log_lines.as_ref()?;
    let entries = edge_entries(input, edge, lines);
    followed(&entries).map(|(e, _)| (is_failure(e), e.start_time.clone()))
}

/// How a set of lines is named in evidence.
fn filter_text(input: &DiagnosisInput) -> String {
    input.path.as_deref().map_or_else(
        || format!("cluster {}", input.cluster),
        |p| format!("path {p}"),
    )
}

fn is_failure(e: &AccessLogEntry) -> bool {
    e.response_code >= 500 || e.response_code == 0 || e.has_flag("NR") || e.has_flag("UAEX")
}

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

fn edge_logs(input: &DiagnosisInput) -> Outcome {
    const NAME: StepName = StepName::EdgeLogs;
    let edge = input.edge.as_ref();
    let Some((edge, lines)) = edge.and_then(|e| e.log_lines.as_ref().map(|l| (e, l))) else {
        return outcome(
            NAME,
            Verdict::Skipped,
            vec!["the edge sidecar's log was not read".into()],
            "Run the edge's meshcat agent with --sidecar-log-file, or read the edge sidecar's logs with the container runtime's log command.",
            "",
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
            return outcome(
                NAME,
                Verdict::Skipped,
                evidence,
                "Diagnose with the failing request's path, or let the edge's agent read its admin API.",
                "",
            );
        }
        if input.path.is_some() || input.symptom == Some(Symptom::Ingress502503) {
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
        return outcome(
            NAME,
            Verdict::Skipped,
            evidence,
            "Replay the failing request and read the edge's log again, filtered on its path.",
            "",
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
                match edge.cluster(&input.cluster) {
                    Some(c) if c.hosts.is_empty() => format!(
                        "the edge answered 503 {flags} with upstream host '-': its cluster {} has no endpoints.",
                        input.cluster
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
        if last.has_flag("UF") || last.has_flag("URX") || code == 503 {
            return outcome(
                NAME,
                Verdict::Fail,
                evidence,
                "Discovery from the edge to the sidecar works: check the service sidecar's logs.",
                format!("the edge answered {code} {flags} from the service sidecar {h}."),
            );
        }
    }
    outcome(
        NAME,
        Verdict::Fail,
        evidence,
        "Look at the edge's line: its response flags name the failure; then check the service sidecar's logs.",
        format!("the edge answered {code} {flags}."),
    )
}

fn service_logs(input: &DiagnosisInput) -> Outcome {
    const NAME: StepName = StepName::ServiceLogs;
    let edge_last = edge_followed(input);
    if let Some(e) = &edge_last {
        if e.upstream_host.is_none() {
            return outcome(
                NAME,
                Verdict::Skipped,
                vec![format!(
                    "the edge's followed line for {} ({} {}) has upstream host '-': it never reached a service sidecar",
                    filter_text(input),
                    e.response_code,
                    e.flags_text()
                )],
                "Fix what the edge's line shows first.",
                "",
            );
        }
    }
    let edge_read = input.edge.as_ref().is_some_and(|e| e.log_lines.is_some());
    if edge_read && edge_last.is_none() {
        return outcome(
            NAME,
            Verdict::Skipped,
            vec![format!(
                "the edge's log has no line for {} to follow into the service sidecars",
                filter_text(input)
            )],
            "Fix what the edge's log shows first.",
            "",
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
    let mut failure: Option<(String, String)> = None;
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
        return outcome(
            NAME,
            Verdict::Skipped,
            vec!["no service sidecar's log was read".into()],
            "Run the service's meshcat agents with --sidecar-log-file, or read the service sidecar's logs with the container runtime's log command.",
            "",
        );
    }
    if let Some((action, finding)) = failure {
        return outcome(NAME, Verdict::Fail, evidence, &action, finding);
    }
    if !traced {
        let what = match (&request_id, &input.path) {
            (Some(id), _) => format!("request id {id}"),
            (None, Some(p)) => format!("path {p}"),
            (None, None) => "any request".to_owned(),
        };
        if edge_last.is_none() && input.path.is_none() {
            return outcome(
                NAME,
                Verdict::Skipped,
                vec![format!(
                    "no access line for {what} in {read} service sidecar logs, and no request to follow"
                )],
                "Replay the failing request and diagnose with its path.",
                "",
            );
        }
        evidence.push(format!(
            "no access line for {what} in {read} service sidecar logs"
        ));
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

/// The action and finding of a service sidecar's failing access line.
fn service_failure(side: &SidecarEvidence, e: &AccessLogEntry) -> (String, String) {
    let code = e.response_code;
    let flags = e.flags_text();
    let inst = &side.instance;
    match e.upstream_host.as_deref() {
        None => (
            "Discovery problem from the sidecar to the service: set the local cluster's address explicitly (the instance's address and port).".to_owned(),
            format!(
                "the service sidecar {inst} has no endpoint for its local service: it answered {code} {flags} with upstream host '-'."
            ),
        ),
        Some(h) if e.has_flag("UF") => (
            "Start the local service, or make it listen on the local cluster's address; if it listens on another port, set the local cluster's port (the instance's address and port) to it.".to_owned(),
            format!(
                "the local service refuses connections at {h}: the service sidecar {inst} answered {code} {flags}."
            ),
        ),
        Some(h) if e.has_flag("UT") || e.has_flag("UC") || e.has_flag("UR") => (
            "The local service accepted the connection but did not answer in time or reset it: look at the service's own logs and load.".to_owned(),
            format!(
                "the local service at {h} timed out or reset the request: the service sidecar {inst} answered {code} {flags}."
            ),
        ),
        Some(h) => (
            "The local service answered the error itself: look at the service's own logs.".to_owned(),
            format!(
                "the local service at {h} answered {code} {flags} through the service sidecar {inst}."
            ),
        ),
    }
}

fn metrics(input: &DiagnosisInput) -> Vec<Outcome> {
    let Some(m) = &input.metrics else {
        return [
            StepName::MetricsSettings,
            StepName::MetricsReporting,
            StepName::MetricsCollector,
        ]
            .into_iter()
            .map(|name| {
                outcome(name, Verdict::Skipped,
                    vec!["the cluster's record and metrics state were not given".into()],
                    "Diagnose the missing_metrics symptom through the aggregator, which knows the cluster's record.", "")
            })
            .collect();
    };
    vec![
        metrics_settings(input, m),
        metrics_reporting(m),
        metrics_collector(input, m),
    ]
}

fn metrics_settings(input: &DiagnosisInput, m: &MetricsEvidence) -> Outcome {
    const NAME: StepName = StepName::MetricsSettings;
    let evidence = vec![
        format!("enableInstanceMetrics = {}", m.enable_instance_metrics),
        format!("prometheusJob = {:?}", m.prometheus_job),
    ];
    if m.enable_instance_metrics && !m.prometheus_job.is_empty() {
        return outcome(
            NAME,
            Verdict::Pass,
            evidence,
            "None: the cluster asks for instance metrics.",
            "",
        );
    }
    outcome(
        NAME,
        Verdict::Fail,
        evidence,
        "Set enableInstanceMetrics to true and prometheusJob to the collector's job of the cluster (PUT /clusters/{clusterName}).",
        format!(
            "the cluster {} does not ask for instance metrics or names no collector job.",
            input.cluster
        ),
    )
}

fn metrics_reporting(m: &MetricsEvidence) -> Outcome {
    const NAME: StepName = StepName::MetricsReporting;
    let mut evidence = vec![
        format!("live instances = {}", m.live_instances),
        format!("instances reporting metrics = {}", m.instances_with_metrics),
    ];
    if !m.silent_instances.is_empty() {
        evidence.push(format!(
            "no inbound HTTP metrics from: {}",
            m.silent_instances.join(", ")
        ));
    }
    if m.live_instances == 0 {
        return outcome(
            NAME,
            Verdict::Fail,
            evidence,
            "Start the service's instances with their sidecar and meshcat agent.",
            "the cluster has no live instance to take metrics from.",
        );
    }
    if m.instances_with_metrics < m.live_instances {
        return outcome(
            NAME,
            Verdict::Fail,
            evidence,
            "The silent instances' sidecars have no inbound HTTP stats: check that traffic reaches their inbound listener (an instance that served no request has nothing to show) and that their agents reach the sidecar's admin API (--sidecar-admin).",
            format!(
                "{} of {} live instances report no metrics{}.",
                m.live_instances - m.instances_with_metrics,
                m.live_instances,
                if m.silent_instances.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", m.silent_instances.join(", "))
                }
            ),
        );
    }
    outcome(
        NAME,
        Verdict::Pass,
        evidence,
        "None: every live instance reports metrics.",
        "",
    )
}

fn metrics_collector(input: &DiagnosisInput, m: &MetricsEvidence) -> Outcome {
    const NAME: StepName = StepName::MetricsCollector;
    let action = format!(
        "Add the namespace where the sidecars of {} run {COLLECTOR_ACTION_TAIL}",
        input.cluster
    );
    match m.prometheus_up {
        Some(true) => outcome(
            NAME,
            Verdict::Pass,
            vec![format!(
                "Prometheus has an up series for job {:?}",
                m.prometheus_job
            )],
            "None: the collector scrapes the job.",
            "",
        ),
        Some(false) => outcome(
            NAME,
            Verdict::Fail,
            vec![format!(
                "Prometheus has no up series for job {:?}",
                m.prometheus_job
            )],
            &action,
            format!(
                "the metrics collector does not scrape job {:?}: it does not watch the namespace of the sidecars.",
                m.prometheus_job
            ),
        ),
        None => outcome(
            NAME,
            Verdict::Skipped,
            vec!["Prometheus was not asked for the job's up series".into()],
            &action,
            "",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics_input(m: MetricsEvidence) -> DiagnosisInput {
        let mut input = DiagnosisInput::new("catalog", "east");
        input.symptom = Some(Symptom::MissingMetrics);
        input.metrics = Some(m);
        input
    }

    fn verdicts(r: &DiagnosisReport) -> Vec<(&str, Verdict)> {
        r.steps
            .iter()
            .map(|s| (s.name.as_str(), s.verdict))
            .collect()
    }

    #[test]
    fn missing_metrics_names_the_collector_namespace_list() {
        let r = diagnose(&metrics_input(MetricsEvidence {
            enable_instance_metrics: true,
            prometheus_job: "catalog".into(),
            live_instances: 2,
            instances_with_metrics: 2,
            silent_instances: Vec::new(),
            prometheus_up: Some(false),
        }));
        assert_eq!(
            verdicts(&r),
            [
                ("metrics_settings", Verdict::Pass),
                ("metrics_reporting", Verdict::Pass),
                ("metrics_collector", Verdict::Fail),
            ]
        );
        let action = &r.step(StepName::MetricsCollector).unwrap().action;
        assert!(action.contains("namespace list under the pod discovery setting"));
        assert!(action.contains("restart the collector"));
        assert!(r.conclusion.starts_with("metrics_collector failed: "));
    }

    #[test]
    fn missing_metrics_checks_settings_and_reporting_first() {
        let r = diagnose(&metrics_input(MetricsEvidence {
            enable_instance_metrics: false,
            prometheus_job: String::new(),
            live_instances: 3,
            instances_with_metrics: 1,
            silent_instances: vec!["catalog-1".into(), "catalog-2".into()],
            prometheus_up: None,
        }));
        assert_eq!(
            verdicts(&r),
            [
                ("metrics_settings", Verdict::Fail),
                ("metrics_reporting", Verdict::Fail),
                ("metrics_collector", Verdict::Skipped),
            ]
        );
        let settings = r.step(StepName::MetricsSettings).unwrap();
        assert!(
            settings
                .evidence
                .contains(&"enableInstanceMetrics = false".to_owned())
        );
        let reporting = r.step(StepName::MetricsReporting).unwrap();
        assert!(reporting.evidence[1].ends_with("= 1"));
        assert!(reporting.evidence[2].contains("catalog-1, catalog-2"));
        // Without Prometheus' answer the advice still names the namespace list.
        assert!(
            r.step(StepName::MetricsCollector)
                .unwrap()
                .action
                .contains("namespaces.names")
        );
        let none_live = diagnose(&metrics_input(MetricsEvidence {
            enable_instance_metrics: true,
            prometheus_job: "catalog".into(),
            ..MetricsEvidence::default()
        }));
        assert!(none_live.conclusion.contains("no live instance"));
    }

    #[test]
    fn without_evidence_every_check_is_skipped() {
        let r = diagnose(&DiagnosisInput::new("catalog", "east"));
        assert_eq!(r.steps.len(), 9);
        assert!(r.steps.iter().all(|s| s.verdict == Verdict::Skipped));
        assert!(r.conclusion.starts_with("No check failed; skipped"));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["symptom"], serde_json::Value::Null);
        assert_eq!(json["steps"][0]["verdict"], "skipped");
    }

    #[test]
    fn evidence_is_bounded() {
        let mut edge = SidecarEvidence::new(Role::Edge, "edge-0");
        let line = r#"[2026-11-21T23:58:15.589Z] "GET /catalog/items HTTP/1.1" 503 UH 0 19 0 - "-" "ua" "id" "h" "-""#;
        edge.log_lines = Some(vec![line.to_owned(); 500]);
        edge.debug_lines = Some(vec![format!("TLS_error: {}", "x".repeat(5000)); 200]);
        edge.ssl_stats = Some(
            (0..200)
                .map(|i| (format!("listener.l{i}.ssl.connection_error"), 1))
                .collect(),
        );
        let mut input = DiagnosisInput::new("catalog", "east");
        input.edge = Some(edge);
        let r = diagnose(&input);
        for s in &r.steps {
            assert!(
                s.evidence.len() <= crate::report::MAX_EVIDENCE,
                "{}",
                s.name
            );
            assert!(
                s.evidence
                    .iter()
                    .all(|e| e.len() <= crate::report::MAX_EVIDENCE_LEN)
            );
        }
        assert!(
            r.step(StepName::Mtls)
                .unwrap()
                .evidence
                .last()
                .unwrap()
                .starts_with("... and ")
        );
    }

    fn cluster(name: &str, hosts: &[&str]) -> UpstreamCluster {
        UpstreamCluster {
            name: name.into(),
            added_via_api: false,
            hosts: hosts
                .iter()
                .map(|a| meshcat_common::wire::UpstreamHost {
                    address: (*a).into(),
                    cx_active: 0,
                    cx_connect_fail: 0,
                    cx_total: 1,
                    rq_active: 0,
                    rq_error: 0,
                    rq_total: 1,
                    health_flags: "healthy".into(),
                })
                .collect(),
        }
    }

    fn access(path: &str, code: u16, flags: &str, id: &str, host: &str) -> String {
        format!(
            r#"[2026-11-21T23:58:15.589Z] "GET {path} HTTP/1.1" {code} {flags} 0 19 0 - "-" "ua" "{id}" "edge" "{host}""#
        )
    }

    /// An edge in front of catalog (through its sidecar at :2) and reviews (at :3),
    /// with interleaved traffic: catalog fails, reviews succeeds and is newest.
    fn two_services(diagnosed: &str) -> DiagnosisInput {
        let mut edge = SidecarEvidence::new(Role::Edge, "edge-0");
        edge.clusters = Some(vec![
            cluster("catalog", &["127.0.0.1:2"]),
            cluster("reviews", &["127.0.0.1:3"]),
        ]);
        edge.log_lines = Some(vec![
            access("/catalog/a", 200, "-", "c-ok", "127.0.0.1:2"),
            access("/catalog/a", 503, "URX", "c-bad", "127.0.0.1:2"),
            access("/reviews/b", 200, "-", "r-1", "127.0.0.1:3"),
            access("/catalog/a", 200, "-", "c-ok2", "127.0.0.1:2"),
            access("/reviews/b", 200, "-", "r-2", "127.0.0.1:3"),
        ]);
        let mut service = SidecarEvidence::new(Role::Service, format!("{diagnosed}-0"));
        service.log_lines = Some(vec![
            access("/catalog/a", 200, "-", "c-ok", "127.0.0.1:7"),
            access("/catalog/a", 503, "UF", "c-bad", "127.0.0.1:7"),
            access("/catalog/a", 200, "-", "c-ok2", "127.0.0.1:7"),
        ]);
        let mut input = DiagnosisInput::new(diagnosed, "east");
        input.symptom = Some(Symptom::UpstreamConnectError);
        input.edge = Some(edge);
        input.services = vec![service];
        input
    }

    #[test]
    fn edge_evidence_belongs_to_the_diagnosed_cluster() {
        let r = diagnose(&two_services("catalog"));
        let edge = r.step(StepName::EdgeLogs).unwrap();
        assert_eq!(edge.verdict, Verdict::Fail);
        assert!(
            edge.evidence.iter().all(|e| !e.contains("/reviews/")),
            "{edge:#?}"
        );
        assert!(
            edge.evidence
                .iter()
                .any(|e| e.contains("3 access lines for cluster catalog, 1 failing"))
        );
        // The newest failing line is followed, though a success came after it.
        let svc = r.step(StepName::ServiceLogs).unwrap();
        assert_eq!(svc.verdict, Verdict::Fail);
        assert!(svc.evidence.iter().any(|e| e.contains("request id c-bad")));
        assert!(
            r.conclusion.starts_with(
                "service_logs failed: the local service refuses connections at 127.0.0.1:7"
            ),
            "{}",
            r.conclusion
        );

        // The healthy neighbour is not blamed for catalog's failure.
        let mut reviews = two_services("reviews");
        reviews.services.clear();
        let r = diagnose(&reviews);
        let edge = r.step(StepName::EdgeLogs).unwrap();
        assert_eq!(edge.verdict, Verdict::Pass, "{edge:#?}");
        assert!(edge.evidence.iter().all(|e| !e.contains("/catalog/")));

        // A line that never reached a host belongs to the cluster its path routes to.
        let mut routed = two_services("catalog");
        let e = routed.edge.as_mut().unwrap();
        e.routes = Some(vec![crate::evidence::RouteEntry {
            route_config: "edge".into(),
            virtual_host: "mesh".into(),
            matcher: "prefix /catalog/".into(),
            cluster: "catalog".into(),
        }]);
        e.log_lines
            .as_mut()
            .unwrap()
            .push(access("/catalog/a", 503, "UH", "c-uh", "-"));
        e.log_lines
            .as_mut()
            .unwrap()
            .push(access("/other/a", 503, "UH", "o-uh", "-"));
        let r = diagnose(&routed);
        let edge = r.step(StepName::EdgeLogs).unwrap();
        assert!(
            edge.evidence
                .iter()
                .any(|e| e.contains("followed:") && e.contains("c-uh")),
            "{edge:#?}"
        );
        assert!(edge.evidence.iter().all(|e| !e.contains("o-uh")));
    }

    #[test]
    fn without_the_edge_admin_no_line_is_taken_for_the_cluster() {
        let mut input = two_services("catalog");
        input.symptom = Some(Symptom::Ingress502503);
        input.edge.as_mut().unwrap().clusters = None;
        let r = diagnose(&input);
        let edge = r.step(StepName::EdgeLogs).unwrap();
        assert_eq!(edge.verdict, Verdict::Skipped, "{edge:#?}");
        // With the path, the lines are the path's.
        input.path = Some("/catalog/a".into());
        let r = diagnose(&input);
        assert_eq!(r.step(StepName::EdgeLogs).unwrap().verdict, Verdict::Fail);
    }

    #[test]
    fn mtls_without_counters_or_debug_window_is_skipped() {
        let mut input = DiagnosisInput::new("catalog", "east");
        let mut edge = SidecarEvidence::new(Role::Edge, "edge-0");
        edge.log_lines = Some(vec!["[2026-11-21 23:58:20.695][1][info][main] up".into()]);
        input.edge = Some(edge);
        let r = diagnose(&input);
        assert_eq!(r.step(StepName::Mtls).unwrap().verdict, Verdict::Skipped);
    }
}
