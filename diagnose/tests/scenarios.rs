//! Runs the engine over evidence captured from real Envoy 1.40 failures
//! (`diagnose/scenarios/`, captured by `capture.sh` into `tests/fixtures/`). The
//! verdicts each scenario expects are its `scenario.json`'s `diagnosis`, which the
//! live end-to-end tests (`tests/tests/e2e_diagnose_scenarios.rs`) assert too.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use meshcat_diagnose::{
    DiagnosisInput, DiagnosisReport, Role, SidecarEvidence, StepName, Symptom, Verdict,
    classify_body, classify_response, diagnose,
};
use serde::Deserialize;

/// What the capture saw at the edge.
struct Response {
    code: u16,
    body: String,
    path: String,
}

fn fixtures_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn fixture_in(root: &Path, scenario: &str, file: &str) -> Option<String> {
    fs::read_to_string(root.join(scenario).join(file)).ok()
}

fn sidecar(root: &Path, scenario: &str, role: Role, side: &str, instance: &str) -> SidecarEvidence {
    let read = |kind: &str| {
        fixture_in(root, scenario, &format!("{side}.{kind}"))
            .unwrap_or_else(|| panic!("fixture {scenario}/{side}.{kind} missing"))
    };
    let mut s = SidecarEvidence::new(role, instance)
        .with_clusters_json(&read("clusters.json"))
        .unwrap()
        .with_config_dump_json(&read("config_dump.json"))
        .unwrap()
        .with_stats_json(&read("stats.json"))
        .unwrap()
        .with_log(&read("log"));
    if let Some(debug) = fixture_in(root, scenario, &format!("{side}.debug.log")) {
        s = s.with_debug_log(&debug);
    }
    s
}

fn load(scenario: &str) -> (DiagnosisInput, Response) {
    load_from(&fixtures_root(), scenario)
}

fn load_from(root: &Path, scenario: &str) -> (DiagnosisInput, Response) {
    let r: serde_json::Value =
        serde_json::from_str(&fixture_in(root, scenario, "response.json").unwrap()).unwrap();
    let response = Response {
        code: r["code"].as_u64().unwrap() as u16,
        body: r["body"].as_str().unwrap().to_owned(),
        path: r["path"].as_str().unwrap().to_owned(),
    };
    let mut input = DiagnosisInput::new("catalog", "local");
    input.edge = Some(sidecar(root, scenario, Role::Edge, "edge", "edge-0"));
    input.services = vec![sidecar(
        root,
        scenario,
        Role::Service,
        "service",
        "catalog-0",
    )];
    (input, response)
}

fn run(scenario: &str, symptom: Option<Symptom>, with_path: bool) -> DiagnosisReport {
    run_from(&fixtures_root(), scenario, symptom, with_path)
}

fn run_from(
    root: &Path,
    scenario: &str,
    symptom: Option<Symptom>,
    with_path: bool,
) -> DiagnosisReport {
    let (mut input, response) = load_from(root, scenario);
    input.symptom = symptom;
    if with_path {
        input.path = Some(response.path);
    }
    let report = diagnose(&input);
    // Every report is valid contract JSON.
    let json = serde_json::to_value(&report).unwrap();
    for key in ["cluster", "zone", "symptom", "steps", "conclusion"] {
        assert!(json.get(key).is_some(), "{key} missing in {json}");
    }
    report
}

fn verdicts(report: &DiagnosisReport) -> Vec<(&str, Verdict)> {
    report
        .steps
        .iter()
        .map(|s| (s.name.as_str(), s.verdict))
        .collect()
}

fn step<'a>(report: &'a DiagnosisReport, name: &str) -> &'a meshcat_diagnose::Step {
    report
        .step(name.parse().expect("a step name"))
        .unwrap_or_else(|| panic!("no step {name} in {report:#?}"))
}

fn evidence_has(report: &DiagnosisReport, name: &str, needle: &str) -> bool {
    step(report, name)
        .evidence
        .iter()
        .any(|e| e.contains(needle))
}

#[track_caller]
fn assert_evidence(report: &DiagnosisReport, name: &str, needle: &str) {
    assert!(
        evidence_has(report, name, needle),
        "step {name} has no evidence containing {needle:?}: {:#?}",
        step(report, name)
    );
}

/// The symptom the operator would report, recognised from the captured response.
fn symptom_of(scenario: &str) -> Option<Symptom> {
    let (_, r) = load(scenario);
    classify_response(r.code, &r.body)
}

#[track_caller]
fn assert_steps(report: &DiagnosisReport, want: &[(&str, Verdict)]) {
    assert_eq!(verdicts(report), want, "{report:#?}");
}

/// What the diagnosis finds in a scenario: the `diagnosis` of its `scenario.json`.
#[derive(Debug, Deserialize)]
struct Expected {
    /// The symptom diagnosed (`None`: every check).
    symptom: Option<Symptom>,
    /// The verdicts of the sidecar checks, in report order.
    verdicts: Vec<(StepName, Verdict)>,
}

fn expected(scenario: &str) -> Expected {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(scenario)
        .join("scenario.json");
    let spec: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&file).unwrap()).unwrap();
    serde_json::from_value(spec["diagnosis"].clone())
        .unwrap_or_else(|e| panic!("{}: diagnosis: {e}", file.display()))
}

/// The metrics checks depend on the cluster's record, not on the sidecars: a
/// scenario's expectation leaves them out.
fn is_metrics(step: StepName) -> bool {
    matches!(
        step,
        StepName::MetricsSettings | StepName::MetricsReporting | StepName::MetricsCollector
    )
}

/// Diagnoses `scenario` (with its path) for the symptom its `scenario.json` names and
/// checks the verdicts it expects.
#[track_caller]
fn run_expected(scenario: &str) -> DiagnosisReport {
    let want = expected(scenario);
    let r = run(scenario, want.symptom, true);
    let got: Vec<(StepName, Verdict)> = r
        .steps
        .iter()
        .filter(|s| !is_metrics(s.name))
        .map(|s| (s.name, s.verdict))
        .collect();
    assert_eq!(got, want.verdicts, "{scenario}: {r:#?}");
    r
}

use Verdict::{Fail, Pass, Skipped};

/// Every scenario of `diagnose/scenarios/`.
const SCENARIOS: [&str; 10] = [
    "healthy",
    "upstream_stopped",
    "no_endpoints",
    "route_to_missing_cluster",
    "cluster_not_routed",
    "untrusted_client_cert",
    "sds_dead",
    "ext_authz_dead",
    "wrong_local_port",
    "local_cluster_unset",
];

#[test]
fn every_scenario_has_fixtures() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut on_disk: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("scenario.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut listed: Vec<&str> = SCENARIOS.to_vec();
    listed.sort_unstable();
    assert_eq!(on_disk, listed);
}

#[test]
fn every_scenario_meets_its_expected_diagnosis() {
    for s in SCENARIOS {
        run_expected(s);
    }
}

/// Drives every scenario through freshly started real Envoys (capture.sh into a
/// temporary folder) and checks the engine reaches the same verdicts as on the
/// committed fixtures: the fixtures still show what Envoy does. Envoy is installed by
/// scripts/envoy.sh (or taken from MESHCAT_ENVOY); a missing Envoy fails the test.
#[test]
fn live_envoy_agrees_with_the_fixtures() {
    let out = tempfile::tempdir().unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/capture.sh");
    let capture = Command::new("bash")
        .arg(&script)
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("capture.sh runs");
    assert!(
        capture.status.success(),
        "capture.sh failed ({}):\n{}\n{}",
        capture.status,
        String::from_utf8_lossy(&capture.stdout),
        String::from_utf8_lossy(&capture.stderr)
    );
    for s in SCENARIOS {
        let (_, live) = load_from(out.path(), s);
        let (_, kept) = load(s);
        assert_eq!(live.code, kept.code, "{s}");
        let symptom = classify_response(live.code, &live.body);
        assert_eq!(symptom, classify_response(kept.code, &kept.body), "{s}");
        for sym in [symptom, None] {
            let now = run_from(out.path(), s, sym, true);
            let then = run(s, sym, true);
            assert_eq!(verdicts(&now), verdicts(&then), "{s} {sym:?}");
            assert_eq!(
                now.steps.iter().map(|st| &st.action).collect::<Vec<_>>(),
                then.steps.iter().map(|st| &st.action).collect::<Vec<_>>(),
                "{s} {sym:?}"
            );
        }
    }
}

#[test]
fn every_scenario_runs_without_symptom_and_without_path() {
    for s in SCENARIOS {
        let r = run(s, None, false);
        assert_eq!(r.symptom, None);
        assert_eq!(r.steps.len(), 9, "{s}");
        let failing = r.first_failure().map(|f| f.name);
        assert_eq!(failing.is_none(), s == "healthy", "{s}: {r:#?}");
        if failing.is_some() {
            // The conclusion is about one of the failed steps (the deepest).
            assert!(
                r.steps
                    .iter()
                    .filter(|st| st.verdict == Verdict::Fail)
                    .any(|st| r.conclusion.starts_with(&format!("{} failed: ", st.name))),
                "{s}: {}",
                r.conclusion
            );
        }
    }
}

#[test]
fn healthy_passes_every_check() {
    assert_eq!(symptom_of("healthy"), None);
    let r = run_expected("healthy");
    // Without the cluster's record the metrics checks lack their evidence.
    assert_eq!(
        verdicts(&r)[6..],
        [
            ("metrics_settings", Skipped),
            ("metrics_reporting", Skipped),
            ("metrics_collector", Skipped),
        ]
    );
    assert_evidence(&r, "edge_discovery", "catalog::127.0.0.1:");
    assert_evidence(&r, "edge_discovery", "cx_total=1");
    assert_evidence(&r, "service_discovery", "local_catalog::127.0.0.1:");
    assert_evidence(&r, "mtls", "cluster.catalog.ssl.handshake = 1");
    assert_evidence(&r, "mtls", ".ssl.handshake = 1");
    assert_evidence(&r, "edge_routes", "prefix /catalog/ -> cluster catalog");
    assert_evidence(&r, "edge_logs", "\"GET /catalog/items HTTP/1.1\" 200 -");
    assert_evidence(&r, "service_logs", "\"GET /catalog/items HTTP/1.1\" 200 -");
    let connect = run("healthy", Some(Symptom::UpstreamConnectError), true);
    assert!(connect.steps.iter().all(|s| s.verdict == Pass));
    assert_eq!(connect.conclusion, "All checks passed.");
}

#[test]
fn upstream_stopped_points_at_the_service_behind_its_sidecar() {
    assert_eq!(
        symptom_of("upstream_stopped"),
        Some(Symptom::UpstreamConnectError)
    );
    let r = run_expected("upstream_stopped");
    assert_evidence(&r, "service_discovery", "cx_connect_fail=3");
    assert_evidence(&r, "service_discovery", "connections to it fail");
    // Rule 6: the edge's 503 with a populated upstream host (Envoy flags it URX only).
    assert_evidence(&r, "edge_logs", "\" 503 URX ");
    assert!(
        step(&r, "edge_logs")
            .action
            .contains("check the service sidecar's logs")
    );
    // Rule 7: the service sidecar's 503 UF from its loopback instance.
    assert_evidence(&r, "service_logs", "\" 503 UF ");
    assert!(
        step(&r, "service_logs")
            .action
            .contains("Start the local service")
    );
    // The deepest failure names the dead service's address, not the edge's 503.
    assert!(
        r.conclusion.starts_with(
            "service_logs failed: the local service refuses connections at 127.0.0.1:"
        ),
        "{}",
        r.conclusion
    );
    assert!(r.conclusion.contains("503 UF"), "{}", r.conclusion);
}

#[test]
fn no_endpoints_is_a_discovery_problem() {
    assert_eq!(symptom_of("no_endpoints"), Some(Symptom::NoHealthyUpstream));
    let r = run_expected("no_endpoints");
    assert_evidence(&r, "edge_discovery", "lists catalog without any host line");
    assert!(
        step(&r, "edge_discovery")
            .action
            .contains("not linked to any instance")
    );
    // Rule 5: 503 UH with upstream host '-'.
    assert_evidence(&r, "edge_logs", "\" 503 UH ");
    assert!(
        step(&r, "edge_logs")
            .action
            .contains("verify that all mesh objects for the service exist")
    );
    assert!(r.conclusion.contains("has no endpoints"));
}

#[test]
fn route_to_missing_cluster_is_503_nc() {
    assert_eq!(
        symptom_of("route_to_missing_cluster"),
        Some(Symptom::Ingress502503)
    );
    let r = run_expected("route_to_missing_cluster");
    assert_evidence(&r, "edge_logs", "\" 503 NC ");
    assert!(r.conclusion.contains("names a cluster that does not exist"));
    let all = run("route_to_missing_cluster", None, true);
    assert_eq!(step(&all, "edge_discovery").verdict, Fail);
    assert_evidence(&all, "edge_discovery", "none named catalog");
    assert_eq!(step(&all, "edge_routes").verdict, Fail);
    assert_evidence(&all, "edge_routes", "no such cluster");
}

#[test]
fn cluster_not_routed_is_404_nr() {
    let (input, r) = load("cluster_not_routed");
    assert_eq!(r.code, 404);
    assert_eq!(classify_response(r.code, &r.body), None);
    // The only route sends traffic to weighted clusters: those are read too.
    let edge = input.edge.as_ref().unwrap();
    assert!(
        edge.routes_to("inventory")
            .any(|r| r.matcher == "prefix /inventory/")
    );
    let r = run_expected("cluster_not_routed");
    assert_evidence(&r, "edge_routes", "names catalog");
    assert_evidence(&r, "edge_logs", "\" 404 NR ");
    assert!(
        r.conclusion
            .starts_with("edge_routes failed: no route of the edge names catalog"),
        "{}",
        r.conclusion
    );
}

#[test]
fn untrusted_client_cert_fails_mtls_and_leaves_no_trace_in_the_sidecar() {
    assert_eq!(
        symptom_of("untrusted_client_cert"),
        Some(Symptom::UpstreamConnectError)
    );
    let r = run_expected("untrusted_client_cert");
    // Both sides' failure counters, named with their values.
    assert_evidence(
        &r,
        "mtls",
        "edge edge-0: cluster.catalog.ssl.connection_error = 3",
    );
    assert_evidence(&r, "mtls", "service catalog-0: listener.127.0.0.1_");
    assert_evidence(&r, "mtls", ".ssl.fail_verify_error = 3");
    // The debug window's TLS lines of both sides.
    assert_evidence(&r, "mtls", "TLSV1_ALERT_UNKNOWN_CA");
    assert_evidence(&r, "mtls", "CERTIFICATE_VERIFY_FAILED");
    assert!(
        step(&r, "mtls")
            .action
            .contains("does not trust the client's certificate")
    );
    // Rule 6 then rule 8: flags written URX,UF by Envoy, no line in the service sidecar.
    assert_evidence(&r, "edge_logs", "\" 503 URX,UF ");
    assert_evidence(&r, "service_logs", "no access line for request id");
    assert!(
        step(&r, "service_logs")
            .action
            .contains("mTLS problem between the edge and the sidecar")
    );
    assert!(r.conclusion.starts_with("mtls failed: "));
    assert!(
        r.conclusion.contains("ssl.connection_error = 3"),
        "{}",
        r.conclusion
    );
}

#[test]
fn sds_dead_blames_the_workload_identity_system() {
    assert_eq!(symptom_of("sds_dead"), Some(Symptom::UpstreamConnectError));
    let r = run_expected("sds_dead");
    assert_evidence(
        &r,
        "mtls",
        "cluster.catalog.client_ssl_socket_factory.upstream_context_secrets_not_ready = 3",
    );
    assert_evidence(&r, "mtls", "TLS error: Secret is not supplied by SDS");
    assert!(step(&r, "mtls").action.contains("workload identity system"));
    // Rule 4 over the edge's logs: the secrets stream closed with an upstream connect error.
    let ingress = run("sds_dead", Some(Symptom::Ingress502503), true);
    assert_eq!(step(&ingress, "edge_logs").verdict, Fail);
    assert_evidence(
        &ingress,
        "edge_logs",
        "StreamSecrets gRPC config stream to identity_agent closed",
    );
    assert_evidence(&ingress, "edge_logs", "initial fetch timed out");
    assert!(
        step(&ingress, "edge_logs")
            .action
            .contains("make sure its server and agents are running, then restart all pods")
    );
}

#[test]
fn ext_authz_dead_is_a_token_filter_failure() {
    assert_eq!(symptom_of("ext_authz_dead"), Some(Symptom::Ingress502503));
    let r = run_expected("ext_authz_dead");
    assert_evidence(&r, "edge_logs", "\" 503 UAEX ");
    assert!(
        step(&r, "edge_logs")
            .action
            .contains("token service and its sidecar are running")
    );
    // Discovery of the diagnosed service itself is fine.
    let all = run("ext_authz_dead", None, true);
    assert_eq!(step(&all, "edge_discovery").verdict, Pass);
    assert_eq!(all.first_failure().unwrap().name.as_str(), "edge_logs");
}

#[test]
fn wrong_local_port_is_a_loopback_503_in_the_service_sidecar() {
    assert_eq!(
        symptom_of("wrong_local_port"),
        Some(Symptom::UpstreamConnectError)
    );
    let r = run_expected("wrong_local_port");
    assert_evidence(&r, "service_logs", "\" 503 UF ");
    assert!(
        step(&r, "service_logs")
            .action
            .contains("local cluster's port")
    );
    // The edge's 503 is the dead port seen from afar: the conclusion names the port.
    assert!(
        r.conclusion.starts_with(
            "service_logs failed: the local service refuses connections at 127.0.0.1:"
        ),
        "{}",
        r.conclusion
    );
}

#[test]
fn local_cluster_unset_is_a_dash_503_in_the_service_sidecar() {
    assert_eq!(
        symptom_of("local_cluster_unset"),
        Some(Symptom::NoHealthyUpstream)
    );
    let r = run_expected("local_cluster_unset");
    assert_evidence(
        &r,
        "service_discovery",
        "lists local_catalog without any host line",
    );
    assert_evidence(&r, "service_logs", "\" 503 UH ");
    assert!(
        step(&r, "service_logs")
            .action
            .contains("set the local cluster's address explicitly")
    );
}

#[test]
fn classifies_the_captured_bodies() {
    let body = |s: &str| load(s).1.body;
    assert_eq!(
        classify_body(&body("upstream_stopped")),
        Some(Symptom::UpstreamConnectError)
    );
    // After retries Envoy words the reason differently; the prefix still matches.
    assert!(body("untrusted_client_cert").contains("retried and the latest reset reason"));
    assert_eq!(
        classify_body(&body("untrusted_client_cert")),
        Some(Symptom::UpstreamConnectError)
    );
    assert_eq!(
        classify_body(&body("no_endpoints")),
        Some(Symptom::NoHealthyUpstream)
    );
    assert_eq!(classify_body(&body("ext_authz_dead")), None);
    assert_eq!(classify_body(&body("healthy")), None);
}

#[test]
fn no_line_for_the_path_is_a_filter_chain_failure() {
    // The healthy edge served /catalog/; nothing ever asked for /orders/.
    let (mut input, _) = load("healthy");
    input.symptom = Some(Symptom::Ingress502503);
    input.path = Some("/orders/".into());
    let r = diagnose(&input);
    assert_steps(&r, &[("edge_logs", Fail), ("service_logs", Skipped)]);
    assert_evidence(&r, "edge_logs", "no access line for path /orders/");
    assert!(step(&r, "edge_logs").action.contains("token filter"));
    assert!(
        r.conclusion
            .contains("a filter of its chain failed before routing")
    );
}

#[test]
fn without_the_edge_log_the_service_log_is_searched_by_path() {
    // Rule 8 from the service side alone: the handshake failed, so no line exists.
    let (mut input, r) = load("untrusted_client_cert");
    input.edge.as_mut().unwrap().log_lines = None;
    input.path = Some(r.path);
    input.symptom = Some(Symptom::Ingress502503);
    let r = diagnose(&input);
    assert_steps(&r, &[("edge_logs", Skipped), ("service_logs", Fail)]);
    assert_evidence(&r, "service_logs", "no access line for path /catalog/items");
}

#[test]
fn parses_the_admin_documents() {
    let (input, _) = load("upstream_stopped");
    let svc = &input.services[0];
    let local = svc.cluster("local_catalog").unwrap();
    assert_eq!(local.hosts.len(), 1);
    let h = &local.hosts[0];
    assert!(h.address.starts_with("127.0.0.1:"));
    // One connection served the warm-up request; the edge's three attempts failed.
    assert_eq!(h.cx_connect_fail, 3);
    assert!(h.cx_total > h.cx_connect_fail);
    assert_eq!(h.health_flags, "healthy");
    let stats = svc.ssl_stats.as_ref().unwrap();
    assert!(
        stats
            .keys()
            .all(|k| k.contains("ssl") || k.contains("secrets"))
    );
    assert!(
        stats
            .iter()
            .any(|(k, v)| k.ends_with(".ssl.handshake") && *v >= 1)
    );
    let routes: Vec<_> = svc.routes_to("local_catalog").collect();
    assert_eq!(routes.len(), 1);
    assert_eq!(routes[0].route_config, "local_routes");
    assert!(
        SidecarEvidence::new(Role::Edge, "x")
            .with_clusters_json("{")
            .is_err()
    );
    assert!(
        SidecarEvidence::new(Role::Edge, "x")
            .with_stats_json("{}")
            .is_err()
    );
}
