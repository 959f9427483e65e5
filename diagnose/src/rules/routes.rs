//! Verify the edge's routes: its `/config_dump` routes the service's cluster, for the
//! failing path when one is given.

use super::{DISCOVERY_ABSENT, Outcome, outcome, route_matches, skipped, who};
use crate::evidence::DiagnosisInput;
use crate::report::{StepName, Verdict};

pub(super) fn edge_routes(input: &DiagnosisInput) -> Outcome {
    const NAME: StepName = StepName::EdgeRoutes;
    let name = input.edge_name();
    let Some(edge) = input.edge.as_ref().filter(|e| e.routes.is_some()) else {
        return skipped(
            NAME,
            vec!["the edge sidecar's /config_dump was not read".into()],
            "Dump the edge sidecar's configuration and compare it with the intended mesh configuration.",
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
            return skipped(
                NAME,
                evidence,
                "Check the header-selected routes of the edge against the intended mesh configuration.",
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
