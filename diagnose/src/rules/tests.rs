//! The engine over hand-built evidence.

use meshcat_common::wire::{UpstreamCluster, UpstreamHost};

use super::*;
use crate::evidence::MetricsEvidence;

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
            .map(|a| UpstreamHost {
                cx_total: 1,
                rq_total: 1,
                ..UpstreamHost::idle(*a)
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
    let mtls = r.step(StepName::Mtls).unwrap();
    assert_eq!(mtls.verdict, Verdict::Skipped);
    // The advice names every marker the TLS lines are searched for.
    for m in meshcat_common::envoy_log::TLS_MARKERS {
        assert!(mtls.action.contains(m), "{m}: {}", mtls.action);
    }
}

#[test]
fn every_tls_marker_marks_a_tls_line() {
    for m in meshcat_common::envoy_log::TLS_MARKERS {
        let mut edge = SidecarEvidence::new(Role::Edge, "edge-0");
        edge.debug_lines = Some(vec![format!(
            "[2026-11-21 23:58:20.695][1][debug][connection] {m}: handshake failed"
        )]);
        let mut input = DiagnosisInput::new("catalog", "east");
        input.edge = Some(edge);
        let r = diagnose(&input);
        assert_eq!(
            r.step(StepName::Mtls).unwrap().verdict,
            Verdict::Fail,
            "{m}"
        );
    }
}

/// A caller's sidecar in the edge's role, reaching `svc-b` (its sidecar at :9)
/// under its own name `b-by-address`, with a failing call and a TLS failure on
/// that cluster.
fn caller_naming_it_otherwise() -> DiagnosisInput {
    let mut caller = SidecarEvidence::new(Role::Edge, "svc-a-0");
    caller.clusters = Some(vec![
        cluster("b-by-address", &["127.0.0.1:9"]),
        cluster("other", &["127.0.0.1:4"]),
    ]);
    caller.routes = Some(vec![crate::evidence::RouteEntry {
        route_config: "egress".into(),
        virtual_host: "all".into(),
        matcher: "prefix /b".into(),
        cluster: "b-by-address".into(),
    }]);
    caller.log_lines = Some(vec![
        access("/b/items", 200, "-", "b-ok", "127.0.0.1:9"),
        access("/b/items", 503, "URX,UF", "b-bad", "127.0.0.1:9"),
        access("/other", 200, "-", "o-ok", "127.0.0.1:4"),
    ]);
    caller.ssl_stats = Some(
        [("cluster.b-by-address.ssl.connection_error".to_owned(), 2)]
            .into_iter()
            .collect(),
    );
    let mut input = DiagnosisInput::new("svc-b", "east");
    input.edge = Some(caller);
    input
}

#[test]
fn the_edges_checks_ask_for_the_cluster_by_the_edges_own_name_for_it() {
    // By the catalog's name, the caller's sidecar knows no such cluster.
    let r = diagnose(&caller_naming_it_otherwise());
    let discovery = r.step(StepName::EdgeDiscovery).unwrap();
    assert_eq!(discovery.verdict, Verdict::Fail, "{discovery:#?}");
    assert!(r.conclusion.contains("does not exist"), "{}", r.conclusion);

    let mut input = caller_naming_it_otherwise();
    input.edge_cluster = Some("b-by-address".into());
    let r = diagnose(&input);
    assert_eq!(
        verdicts(&r)[..5],
        [
            ("edge_discovery", Verdict::Pass),
            ("service_discovery", Verdict::Skipped),
            ("mtls", Verdict::Fail),
            ("edge_routes", Verdict::Pass),
            ("edge_logs", Verdict::Fail),
        ],
        "{r:#?}"
    );
    let mtls = r.step(StepName::Mtls).unwrap();
    assert!(
        mtls.evidence
            .iter()
            .any(|e| e.contains("cluster.b-by-address.ssl.connection_error = 2")),
        "{mtls:#?}"
    );
    let logs = r.step(StepName::EdgeLogs).unwrap();
    assert!(
        logs.evidence
            .iter()
            .any(|e| e.contains("2 access lines for cluster b-by-address, 1 failing")),
        "{logs:#?}"
    );
    assert!(logs.evidence.iter().all(|e| !e.contains("o-ok")));
    let failure = r.failure.unwrap();
    assert_eq!(failure.step, StepName::Mtls);
    assert!(!failure.answered_by_service);
}

#[test]
fn a_failure_the_service_answered_is_told_from_one_on_its_way() {
    let service_line = |code: u16, flags: &str, host: &str| {
        let mut input = two_services("catalog");
        input.services[0].log_lines = Some(vec![access("/catalog/a", code, flags, "c-bad", host)]);
        diagnose(&input).failure.unwrap()
    };
    // The local service answered the error, or did not answer in time.
    for (code, flags) in [(500, "-"), (503, "-"), (504, "UT"), (503, "UC")] {
        let f = service_line(code, flags, "127.0.0.1:7");
        assert_eq!(f.step, StepName::ServiceLogs, "{code} {flags}");
        assert!(f.answered_by_service, "{code} {flags}: {f:?}");
    }
    // It refused the connection, or the sidecar has no endpoint for it.
    for (flags, host) in [("UF", "127.0.0.1:7"), ("UH", "-")] {
        let f = service_line(503, flags, host);
        assert_eq!(f.step, StepName::ServiceLogs, "{flags}");
        assert!(!f.answered_by_service, "{flags}: {f:?}");
    }
    // From the edge's line alone (no service log read).
    let edge_line = |code: u16, flags: &str, host: &str| {
        let mut input = two_services("catalog");
        input.services.clear();
        let edge = input.edge.as_mut().unwrap();
        edge.log_lines = Some(vec![access("/catalog/a", code, flags, "c-bad", host)]);
        // A line that reached no host is the cluster's by its route.
        edge.routes = Some(vec![crate::evidence::RouteEntry {
            route_config: "edge".into(),
            virtual_host: "mesh".into(),
            matcher: "prefix /catalog/".into(),
            cluster: "catalog".into(),
        }]);
        diagnose(&input).failure.unwrap()
    };
    for (code, flags, by_service) in [
        (503, "-", true),
        (500, "-", true),
        (504, "UT", true),
        (503, "URX,UF", false),
        (503, "UH", false),
    ] {
        let host = if flags == "UH" { "-" } else { "127.0.0.1:2" };
        let f = edge_line(code, flags, host);
        assert_eq!(f.answered_by_service, by_service, "{code} {flags}: {f:?}");
    }
}
