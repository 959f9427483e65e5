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

mod control_server {
    use super::*;
    use crate::evidence::{
        ControlEvidence, DeclaredCluster, DeclaredEndpoint, SidecarSync, StaleUpstream, SyncState,
        XdsRejection,
    };

    /// 2026-11-21T23:58:15Z
    const NOW: i64 = 1_795_305_495_000;

    fn declared(name: &str, health: &[&str]) -> DeclaredCluster {
        let listed: Vec<DeclaredEndpoint> = health
            .iter()
            .enumerate()
            .map(|(i, h)| DeclaredEndpoint {
                address: format!("10.0.1.{}:8080", i + 1),
                health: (*h).to_owned(),
                healthy: matches!(*h, "HEALTHY" | "UNKNOWN"),
            })
            .collect();
        DeclaredCluster {
            name: name.into(),
            endpoints: listed.len(),
            healthy: listed.iter().filter(|e| e.healthy).count(),
            listed,
        }
    }

    fn edge_sync(state: SyncState) -> SidecarSync {
        SidecarSync::new(
            Role::Edge,
            ("edge", "team-edge"),
            "edge-0",
            state,
            NOW - 5_000,
        )
    }

    fn service_sync(state: SyncState) -> SidecarSync {
        SidecarSync::new(
            Role::Service,
            ("catalog", "team-catalog"),
            "catalog-0",
            state,
            NOW - 5_000,
        )
    }

    /// catalog declared with two healthy endpoints, both sidecars synced.
    fn control() -> ControlEvidence {
        ControlEvidence {
            server_address: "istiod:15010".into(),
            state: "connected".into(),
            error: String::new(),
            view_clusters: 3,
            declared: vec![declared("catalog", &["HEALTHY", "HEALTHY"])],
            sidecars: vec![
                service_sync(SyncState::Synced),
                edge_sync(SyncState::Synced),
            ],
            read_at_ms: NOW,
        }
    }

    fn with(control: ControlEvidence) -> DiagnosisInput {
        let mut input = DiagnosisInput::new("catalog", "east");
        input.control = Some(control);
        input
    }

    fn step(r: &DiagnosisReport) -> &Step {
        r.step(StepName::ControlServer)
            .expect("a control_server step")
    }

    fn stale_catalog() -> StaleUpstream {
        StaleUpstream {
            cluster: "catalog".into(),
            since_ms: NOW - 12_000,
            missing: vec!["10.0.1.4:8080".into()],
            missing_count: Some(1),
            extra: vec!["10.0.1.1:8080".into()],
            extra_count: Some(1),
            sidecar_hosts: 2,
            control_endpoints: 2,
            ..StaleUpstream::default()
        }
    }

    #[test]
    fn without_a_view_the_step_does_not_run() {
        let r = diagnose(&DiagnosisInput::new("catalog", "east"));
        assert!(r.step(StepName::ControlServer).is_none());
        // With one, it runs first among the discovery steps, and only there.
        for (symptom, first) in [
            (None, true),
            (Some(Symptom::UpstreamConnectError), true),
            (Some(Symptom::NoHealthyUpstream), true),
            (Some(Symptom::Ingress502503), false),
            (Some(Symptom::MissingMetrics), false),
        ] {
            let mut input = with(control());
            input.symptom = symptom;
            let r = diagnose(&input);
            assert_eq!(
                r.steps[0].name == StepName::ControlServer,
                first,
                "{symptom:?}"
            );
            assert_eq!(r.step(StepName::ControlServer).is_some(), first);
        }
    }

    #[test]
    fn declared_with_healthy_endpoints_and_sidecars_synced_passes() {
        let r = diagnose(&with(control()));
        let s = step(&r);
        assert_eq!(s.verdict, Verdict::Pass, "{s:#?}");
        assert_eq!(
            s.evidence[0],
            "control server istiod:15010: connected; its view holds 3 clusters"
        );
        assert_eq!(
            s.evidence[1],
            "control server declares catalog: 2 endpoints, 2 healthy: 10.0.1.1:8080 HEALTHY, 10.0.1.2:8080 HEALTHY"
        );
        // The edge's sync first.
        assert!(
            s.evidence[2].starts_with(
                "the edge sidecar edge-0 of cluster edge (owner team-edge): synced since 2026-11-21T23:58:10Z (5s before the diagnosis)"
            ),
            "{s:#?}"
        );
        assert!(s.evidence[3].starts_with("the service sidecar catalog-0"));
        // An edge stale on another upstream holds this one as declared.
        let mut c = control();
        c.sidecars[1].state = SyncState::Stale;
        let r = diagnose(&with(c));
        assert_eq!(step(&r).verdict, Verdict::Pass);
        assert!(
            step(&r)
                .evidence
                .iter()
                .any(|e| e.contains("on other upstreams; its view of catalog equals"))
        );
    }

    #[test]
    fn a_cluster_the_control_server_does_not_declare_is_its_fault() {
        let mut c = control();
        c.declared.clear();
        // The edge has no such cluster either: the control server explains it.
        let mut input = with(c);
        let mut edge = SidecarEvidence::new(Role::Edge, "edge-0");
        edge.clusters = Some(vec![cluster("reviews", &["127.0.0.1:3"])]);
        input.edge = Some(edge);
        let r = diagnose(&input);
        assert_eq!(step(&r).verdict, Verdict::Fail);
        assert_eq!(
            r.step(StepName::EdgeDiscovery).unwrap().verdict,
            Verdict::Fail
        );
        assert!(
            r.conclusion.starts_with(
                "control_server failed: the control server at istiod:15010 does not declare catalog: none of the 3 clusters of its view stands for it. The fault is in the control server (owner platform). Platform: "
            ),
            "{}",
            r.conclusion
        );
        let f = r.failure.unwrap();
        assert_eq!(f.step, StepName::ControlServer);
        assert!(!f.answered_by_service);
        // Under the edge's own name for it, both are named; an old view says so.
        let mut c = control();
        c.declared.clear();
        c.state = "unreachable".into();
        c.error = "connection refused".into();
        let mut input = with(c);
        input.edge_cluster = Some("catalog-by-address".into());
        let r = diagnose(&input);
        assert!(
            r.conclusion
                .contains("does not declare catalog (the edge's catalog-by-address): none of the 3 clusters of its last good view"),
            "{}",
            r.conclusion
        );
        assert_eq!(
            step(&r).evidence[0],
            "control server istiod:15010: unreachable (connection refused); its last good view holds 3 clusters"
        );
    }

    #[test]
    fn no_endpoint_or_none_healthy_is_the_control_servers_fault() {
        let mut c = control();
        c.declared = vec![declared("catalog", &[])];
        let r = diagnose(&with(c));
        assert!(
            r.conclusion.contains(
                "the control server at istiod:15010 declares catalog without any endpoint. The fault is in the control server (owner platform)."
            ),
            "{}",
            r.conclusion
        );
        let mut c = control();
        c.declared = vec![
            declared(
                "outbound|80||catalog.default.svc.cluster.local",
                &["UNHEALTHY"],
            ),
            declared("catalog", &["DRAINING"]),
        ];
        let r = diagnose(&with(c));
        assert!(
            r.conclusion.contains(
                "declares outbound|80||catalog.default.svc.cluster.local, catalog with 2 endpoints, none healthy (10.0.1.1:8080 UNHEALTHY, 10.0.1.1:8080 DRAINING)"
            ),
            "{}",
            r.conclusion
        );
        assert!(r.conclusion.contains("health checks"));
    }

    #[test]
    fn an_edge_stale_on_the_cluster_is_the_edge_sidecars_fault() {
        let mut c = control();
        c.sidecars[1].state = SyncState::Stale;
        c.sidecars[1].stale = vec![stale_catalog()];
        // The edge sends to the address the control server no longer lists: its
        // line fails and the service sidecar never sees the request.
        let mut input = two_services("catalog");
        input.control = Some(c);
        let r = diagnose(&input);
        let s = step(&r);
        assert_eq!(s.verdict, Verdict::Fail);
        assert!(
            s.evidence.iter().any(|e| e.contains(
                "stale since 2026-11-21T23:58:10Z (5s before the diagnosis): catalog differs since 2026-11-21T23:58:03Z (12s before the diagnosis): it lacks 10.0.1.4:8080, it still has 10.0.1.1:8080"
            )),
            "{s:#?}"
        );
        // The local service refusing connections lies further on: it is named.
        assert!(
            r.conclusion.starts_with("service_logs failed: "),
            "{}",
            r.conclusion
        );
        // Without a trace in the service sidecar (the request went to an address
        // the control server no longer lists), the stale edge explains it.
        let mut no_trace = two_services("catalog");
        no_trace.services[0].log_lines = Some(Vec::new());
        no_trace.control = input.control.clone();
        let r = diagnose(&no_trace);
        assert_eq!(
            r.step(StepName::ServiceLogs).unwrap().verdict,
            Verdict::Fail
        );
        assert!(
            r.conclusion.starts_with(
                "control_server failed: the edge sidecar edge-0 of cluster edge is stale: its view of catalog differs from the control server's since 2026-11-21T23:58:03Z (12s before the diagnosis): it lacks 10.0.1.4:8080, it still has 10.0.1.1:8080, 2 hosts at the sidecar, 2 endpoints at the control server. The fault is in that sidecar (owner team-edge), not in the control server. The sidecar does not hold"
            ),
            "{}",
            r.conclusion
        );
    }

    #[test]
    fn a_rejection_names_the_sidecar_its_owner_and_envoys_reason() {
        let mut c = control();
        c.sidecars[0].state = SyncState::Rejected;
        c.sidecars[0].rejections = vec![XdsRejection {
            kind: "clusters".into(),
            resource: String::new(),
            reason: "Error adding/updating cluster(s) broken: Proto constraint validation failed (ClusterValidationError.ConnectTimeout)".into(),
            since_ms: NOW - 2_000,
        }];
        let r = diagnose(&with(c));
        assert!(
            r.conclusion.starts_with(
                "control_server failed: the service sidecar catalog-0 of cluster catalog rejected the control server's clusters update since 2026-11-21T23:58:13Z (2s before the diagnosis): Error adding/updating cluster(s) broken: Proto constraint validation failed (ClusterValidationError.ConnectTimeout). The fault is in that sidecar (owner team-catalog), not in the control server."
            ),
            "{}",
            r.conclusion
        );
        // An edge whose rejection concerns another cluster's endpoints (left out by
        // the caller) is not at fault for this one.
        let mut c = control();
        c.sidecars[1].state = SyncState::Rejected;
        let r = diagnose(&with(c));
        assert_eq!(step(&r).verdict, Verdict::Pass, "{:#?}", step(&r));
    }

    #[test]
    fn disconnected_sidecars_blame_the_sidecar_or_a_control_server_that_is_down() {
        let mut c = control();
        c.sidecars[0] = service_sync(SyncState::Disconnected);
        let r = diagnose(&with(c.clone()));
        assert!(
            r.conclusion.contains(
                "the service sidecar catalog-0 of cluster catalog is disconnected from its control plane since 2026-11-21T23:58:10Z (5s before the diagnosis), while the control server answers meshcat (connected). The fault is in that sidecar (owner team-catalog)"
            ),
            "{}",
            r.conclusion
        );
        c.state = "unreachable".into();
        c.error = "connection refused".into();
        c.sidecars[1] = edge_sync(SyncState::Disconnected);
        let r = diagnose(&with(c));
        assert!(
            r.conclusion.contains(
                "the control server at istiod:15010 is unreachable (connection refused) and the sidecars edge-0, catalog-0 are disconnected from it since 2026-11-21T23:58:10Z (5s before the diagnosis). The fault is in the control server (owner platform)."
            ),
            "{}",
            r.conclusion
        );
    }

    #[test]
    fn without_any_sidecars_sync_the_step_is_skipped() {
        let mut c = control();
        c.sidecars = vec![SidecarSync {
            text: "the sidecar has no configuration from xDS".into(),
            ..service_sync(SyncState::Unknown)
        }];
        let r = diagnose(&with(c.clone()));
        let s = step(&r);
        assert_eq!(s.verdict, Verdict::Skipped, "{s:#?}");
        assert!(
            s.evidence
                .iter()
                .any(|e| e.ends_with("unknown since 2026-11-21T23:58:10Z (5s before the diagnosis): the sidecar has no configuration from xDS")),
            "{s:#?}"
        );
        assert!(r.conclusion.contains("control_server"), "{}", r.conclusion);
        c.sidecars.clear();
        assert_eq!(step(&diagnose(&with(c))).verdict, Verdict::Skipped);
    }
}

mod coverage {
    use super::*;
    use meshcat_common::envoy_log::rfc3339_ms;
    use meshcat_common::wire::{EvidenceOutput, LogWindow, WindowStart};

    /// The time of the lines `access` writes.
    fn request_ms() -> i64 {
        rfc3339_ms("2026-11-21T23:58:15.589Z").unwrap()
    }

    fn window(from_ms: i64, start: WindowStart) -> LogWindow {
        LogWindow {
            from_ms,
            start,
            held_max_lines: 500,
            to_ms: from_ms + 60_000,
        }
    }

    /// An edge that served `GET /catalog/a` (request id `req-1`) through the
    /// service sidecar at :2, and that sidecar's log without the request's line:
    /// only lines of Envoy's own, the oldest written `own_from`.
    fn missing_trace(own_from: &str) -> DiagnosisInput {
        let mut edge = SidecarEvidence::new(Role::Edge, "edge-0");
        edge.clusters = Some(vec![cluster("catalog", &["127.0.0.1:2"])]);
        edge.log_lines = Some(vec![access("/catalog/a", 200, "-", "req-1", "127.0.0.1:2")]);
        let mut service = SidecarEvidence::new(Role::Service, "catalog-0");
        service.log_lines = Some(vec![
            format!("[{own_from}][7][debug][admin] [admin.cc:1] request complete: path: /stats"),
            "[2026-11-21 23:59:00.000][7][debug][admin] [admin.cc:1] request complete".into(),
        ]);
        let mut input = DiagnosisInput::new("catalog", "east");
        input.edge = Some(edge);
        input.services = vec![service];
        input
    }

    fn service_step(input: &DiagnosisInput) -> Step {
        diagnose(input).step(StepName::ServiceLogs).unwrap().clone()
    }

    #[test]
    fn no_trace_in_a_log_that_reaches_back_is_a_failure_between_the_sidecars() {
        // The sidecar's oldest line is older than the request: its absence counts.
        let input = missing_trace("2026-11-21 23:50:00.000");
        let r = diagnose(&input);
        let step = r.step(StepName::ServiceLogs).unwrap();
        assert_eq!(step.verdict, Verdict::Fail, "{step:#?}");
        assert!(r.conclusion.contains("mTLS problem"), "{}", r.conclusion);
        // So it does when the agent says its window reaches back to the request.
        let mut input = missing_trace("2026-11-21 23:58:50.000");
        input.services[0].log_window = Some(window(request_ms() - 1, WindowStart::Held));
        assert_eq!(service_step(&input).verdict, Verdict::Fail);
    }

    #[test]
    fn no_trace_in_a_log_that_does_not_reach_back_is_skipped_with_its_window() {
        // Without the agent's word, the oldest line read: written after the request.
        let input = missing_trace("2026-11-21 23:58:40.000");
        let r = diagnose(&input);
        let step = r.step(StepName::ServiceLogs).unwrap();
        assert_eq!(step.verdict, Verdict::Skipped, "{step:#?}");
        assert!(!r.conclusion.contains("mTLS"), "{}", r.conclusion);
        let says = |needle: &str| step.evidence.iter().any(|e| e.contains(needle));
        assert!(
            says("the request was made at 2026-11-21T23:58:15.589Z"),
            "{step:#?}"
        );
        assert!(
            says(
                "service catalog-0: the oldest log line read was written at 2026-11-21T23:58:40.000Z"
            ),
            "{step:#?}"
        );
        assert!(step.action.contains("path="), "{}", step.action);
        assert!(step.action.contains("debugSeconds"), "{}", step.action);

        // The agent's window: older lines dropped by its bound on held lines.
        let mut held = missing_trace("2026-11-21 23:50:00.000");
        held.services[0].log_window = Some(window(request_ms() + 1, WindowStart::Held));
        let step = service_step(&held);
        assert_eq!(step.verdict, Verdict::Skipped, "{step:#?}");
        assert!(
            step.evidence.iter().any(|e| e.contains(
                "the log read reaches back to 2026-11-21T23:58:15.590Z only: the agent holds at most 500 lines of it (--log-max-lines)"
            )),
            "{step:#?}"
        );
        assert!(
            step.action.contains("--log-max-lines (now 500)"),
            "{}",
            step.action
        );
        // Left out of the answer by newer lines, or begun after the request.
        for (start, words) in [
            (WindowStart::Answer, "newer ones filled it"),
            (WindowStart::Began, "the agent began reading it then"),
        ] {
            let mut input = missing_trace("2026-11-21 23:50:00.000");
            input.services[0].log_window = Some(window(request_ms() + 1, start));
            let step = service_step(&input);
            assert_eq!(step.verdict, Verdict::Skipped, "{start:?}: {step:#?}");
            assert!(
                step.evidence.iter().any(|e| e.contains(words)),
                "{start:?}: {step:#?}"
            );
            assert!(!step.action.contains("--log-max-lines"), "{}", step.action);
        }
    }

    #[test]
    fn the_lines_asked_by_request_id_decide() {
        let mut input = missing_trace("2026-11-21 23:50:00.000");
        input.services[0].log_window = Some(window(request_ms() + 1, WindowStart::Answer));
        assert_eq!(
            request_to_ask(&input, &input.services[0]).as_deref(),
            Some("req-1")
        );
        // The second ask found the request's line: traced.
        let mut found = input.clone();
        found.services[0].add_request_lines(
            "req-1",
            &EvidenceOutput {
                log_lines: Some(vec![access("/catalog/a", 200, "-", "req-1", "127.0.0.1:8")]),
                log_window: Some(window(request_ms() - 60_000, WindowStart::Held)),
                ..EvidenceOutput::default()
            },
        );
        assert_eq!(service_step(&found).verdict, Verdict::Pass);
        assert_eq!(request_to_ask(&found, &found.services[0]), None);
        // It reaches back and finds nothing: the absence is a finding.
        let mut absent = input.clone();
        absent.services[0].add_request_lines(
            "req-1",
            &EvidenceOutput {
                log_lines: Some(Vec::new()),
                log_window: Some(window(request_ms() - 60_000, WindowStart::Held)),
                ..EvidenceOutput::default()
            },
        );
        assert_eq!(service_step(&absent).verdict, Verdict::Fail);
        // It does not reach back either: skipped, with the ask's window.
        let mut short = input.clone();
        short.services[0].add_request_lines(
            "req-1",
            &EvidenceOutput {
                log_lines: Some(Vec::new()),
                log_window: Some(window(request_ms() + 5_000, WindowStart::Held)),
                ..EvidenceOutput::default()
            },
        );
        let step = service_step(&short);
        assert_eq!(step.verdict, Verdict::Skipped);
        assert!(
            step.evidence
                .iter()
                .any(|e| e.contains("reaches back to 2026-11-21T23:58:20.589Z only")),
            "{step:#?}"
        );

        // Nothing to ask: a window that covers the request, an agent that does not
        // say what it covers, or lines that hold the request id.
        let mut covered = input.clone();
        covered.services[0].log_window = Some(window(request_ms(), WindowStart::Held));
        assert_eq!(request_to_ask(&covered, &covered.services[0]), None);
        let mut silent = input.clone();
        silent.services[0].log_window = None;
        assert_eq!(request_to_ask(&silent, &silent.services[0]), None);
        let mut there = input;
        there.services[0].log_lines.as_mut().unwrap().push(access(
            "/catalog/a",
            200,
            "-",
            "req-1",
            "127.0.0.1:8",
        ));
        assert_eq!(request_to_ask(&there, &there.services[0]), None);
    }

    #[test]
    fn an_edge_without_the_paths_line_is_skipped_when_its_older_lines_were_dropped() {
        let mut input = missing_trace("2026-11-21 23:50:00.000");
        input.path = Some("/never/asked".into());
        let edge = |r: &DiagnosisReport| r.step(StepName::EdgeLogs).unwrap().verdict;
        input.edge.as_mut().unwrap().log_window = Some(window(request_ms(), WindowStart::Began));
        assert_eq!(edge(&diagnose(&input)), Verdict::Fail);
        input.edge.as_mut().unwrap().log_window = Some(window(request_ms(), WindowStart::Held));
        let r = diagnose(&input);
        assert_eq!(edge(&r), Verdict::Skipped, "{r:#?}");
        assert!(
            r.step(StepName::EdgeLogs)
                .unwrap()
                .action
                .contains("--log-max-lines (now 500)")
        );
    }
}
