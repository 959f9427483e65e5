//! Verify discovery: the edge's `/clusters` lists the service's cluster with healthy
//! hosts, and each service sidecar's lists its local cluster.

use std::collections::BTreeSet;

use meshcat_common::wire::{UpstreamCluster, UpstreamHost};

use super::{DISCOVERY_ABSENT, Outcome, outcome, skipped, who};
use crate::evidence::{DiagnosisInput, SidecarEvidence};
use crate::report::{StepName, Verdict};

const DISCOVERY_NO_HOST: &str = "The cluster is not linked to any instance: check the route and shared_rules objects that link it to the sidecar and that the service's instances are registered and running.";
const DISCOVERY_UNHEALTHY: &str = "Hosts are discovered but none is healthy: look at the service's instances and their health checks.";

fn host_line(cluster: &str, h: &UpstreamHost) -> String {
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

pub(super) fn edge_discovery(input: &DiagnosisInput) -> Outcome {
    const NAME: StepName = StepName::EdgeDiscovery;
    let Some(edge) = &input.edge else {
        return skipped(
            NAME,
            vec!["no evidence from the edge sidecar (the zone's requestCluster)".into()],
            "Set the zone's requestCluster and run a meshcat agent beside its sidecar.",
        );
    };
    let Some(clusters) = &edge.clusters else {
        return skipped(
            NAME,
            vec![format!("{}: /clusters was not read", who(edge))],
            "Check that the agent beside the edge sidecar reaches its admin API.",
        );
    };
    let mut evidence = Vec::new();
    match discover(edge, clusters, input.edge_name(), &mut evidence) {
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

pub(super) fn service_discovery(input: &DiagnosisInput) -> Outcome {
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
        return skipped(
            NAME,
            evidence,
            "Check that the service's pods run with their sidecar and a meshcat agent.",
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
