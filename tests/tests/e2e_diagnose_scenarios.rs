//! Each failure scenario of `diagnose/scenarios/` run live, end to end: real Envoys
//! put into the failure, in-process agents tailing their logs, an in-process
//! aggregator, and `GET /diagnose` asserted as the fixture tests assert the engine:
//! the verdicts each scenario expects are its `scenario.json`'s `diagnosis`, read by
//! both suites. Scenarios run one at a time (they share the machine's few cores).

use meshcat_tests::diagnose_stack::*;
use meshcat_tests::scenario::{Diagnosis, Scenario};

/// Starts `name`, its stack, and puts it into its failure; answers the edge's body.
async fn failing(name: &str) -> (Scenario, Stack, String) {
    let mut sc = Scenario::start(name).await.unwrap();
    let stack = Stack::start(&sc).await;
    let (_, body) = sc.fail().await.unwrap();
    (sc, stack, body)
}

/// The query of the diagnosis `sc` expects (its path and symptom), and what it finds.
fn expected(sc: &Scenario) -> (String, Diagnosis) {
    let want = sc.diagnosis().unwrap();
    let mut q = format!("&path={}", sc.path());
    if let Some(s) = &want.symptom {
        q.push_str(&format!("&symptom={s}"));
    }
    (q, want)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_passes_every_sidecar_check() {
    let _turn = SERIAL.lock().await;
    let (sc, stack, _) = failing("healthy").await;
    let (q, want) = expected(&sc);
    // The sidecar's inbound stats reach the catalog with the agent's next report.
    let r = stack
        .diagnose_until(&q, |r| {
            verdict(r, "service_logs") == "pass" && verdict(r, "metrics_reporting") == "pass"
        })
        .await;
    assert_diagnosis(&r, &want);
    // The cluster is registered with its metrics settings; no Prometheus is set.
    assert_eq!(
        verdicts(&r)[6..],
        [
            ("metrics_settings".to_owned(), "pass".to_owned()),
            ("metrics_reporting".to_owned(), "pass".to_owned()),
            ("metrics_collector".to_owned(), "skipped".to_owned()),
        ]
    );
    assert_eq!(r["cluster"], "catalog");
    assert_eq!(r["zone"], "local");
    assert!(r["symptom"].is_null());
    assert_evidence(&r, "edge_discovery", "catalog::127.0.0.1:");
    assert_evidence(&r, "service_discovery", "local_catalog::127.0.0.1:");
    assert_evidence(&r, "mtls", "cluster.catalog.ssl.handshake = 1");
    assert_evidence(&r, "edge_routes", "prefix /catalog/ -> cluster catalog");
    assert_evidence(&r, "edge_logs", "\"GET /catalog/items HTTP/1.1\" 200 -");
    assert_evidence(&r, "service_logs", "\"GET /catalog/items HTTP/1.1\" 200 -");
    // Why the collector check was skipped is said in its evidence.
    assert_evidence(&r, "metrics_collector", "--prometheus-url");
    // A path with no access line is a filter-chain failure (rule 3).
    let none = stack
        .diagnose("&path=/catalog/never-requested&symptom=ingress_502_503")
        .await
        .1;
    assert_eq!(verdict(&none, "edge_logs"), "fail", "{none:#}");
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_stopped_points_at_the_service_behind_its_sidecar() {
    let _turn = SERIAL.lock().await;
    let mut sc = Scenario::start("upstream_stopped").await.unwrap();
    let upstream = sc.upstream.as_ref().unwrap().addr;
    let stack = Stack::start(&sc).await;
    let (_, body) = sc.fail().await.unwrap();
    assert!(body.starts_with("upstream connect error"), "{body}");
    let (q, want) = expected(&sc);
    let r = stack
        .diagnose_until(&q, |r| verdict(r, "service_logs") == "fail")
        .await;
    assert_diagnosis(&r, &want);
    assert_evidence(&r, "service_discovery", "connections to it fail");
    assert_evidence(&r, "edge_logs", "\" 503 URX ");
    assert_evidence(&r, "service_logs", "\" 503 UF ");
    assert!(
        step(&r, "service_logs")["action"]
            .as_str()
            .unwrap()
            .contains("Start the local service")
    );
    // The conclusion names the dead service's address, not the edge's 503.
    assert!(
        cause(&r).starts_with(&format!(
            "service_logs failed: the local service refuses connections at {upstream}: the service sidecar catalog-0 answered 503 UF."
        )),
        "{r:#}"
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_endpoints_is_a_discovery_problem() {
    let _turn = SERIAL.lock().await;
    let (sc, stack, body) = failing("no_endpoints").await;
    assert_eq!(body, "no healthy upstream");
    let (q, want) = expected(&sc);
    let r = stack
        .diagnose_until(&q, |r| has_evidence(r, "edge_logs", "\" 503 UH "))
        .await;
    assert_diagnosis(&r, &want);
    assert_evidence(&r, "edge_discovery", "lists catalog without any host line");
    assert_evidence(&r, "edge_logs", "\" 503 UH ");
    assert!(
        r["conclusion"]
            .as_str()
            .unwrap()
            .contains("has no endpoints")
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_to_missing_cluster_is_503_nc() {
    let _turn = SERIAL.lock().await;
    let (sc, stack, _) = failing("route_to_missing_cluster").await;
    let (q, want) = expected(&sc);
    let r = stack
        .diagnose_until(&q, |r| has_evidence(r, "edge_logs", "\" 503 NC "))
        .await;
    assert_diagnosis(&r, &want);
    assert_evidence(&r, "edge_logs", "\" 503 NC ");
    assert!(
        r["conclusion"]
            .as_str()
            .unwrap()
            .contains("names a cluster that does not exist")
    );
    let all = stack.diagnose(&format!("&path={}", sc.path())).await.1;
    assert_eq!(verdict(&all, "edge_discovery"), "fail", "{all:#}");
    assert_evidence(&all, "edge_discovery", "none named catalog");
    assert_eq!(verdict(&all, "edge_routes"), "fail");
    assert_evidence(&all, "edge_routes", "no such cluster");
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_not_routed_is_404_nr() {
    let _turn = SERIAL.lock().await;
    let (sc, stack, _) = failing("cluster_not_routed").await;
    let (q, want) = expected(&sc);
    let r = stack
        .diagnose_until(&q, |r| has_evidence(r, "edge_logs", "\" 404 NR "))
        .await;
    assert_diagnosis(&r, &want);
    assert_evidence(&r, "edge_routes", "names catalog");
    assert!(cause(&r).starts_with("edge_routes failed: no route of the edge names catalog"));
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_client_cert_fails_mtls_with_a_debug_window() {
    let _turn = SERIAL.lock().await;
    let sc = Scenario::start("untrusted_client_cert").await.unwrap();
    let stack = Stack::start(&sc).await;
    let (q, want) = expected(&sc);
    // The diagnosis runs a debug window on both sidecars; the request is replayed
    // while they run at debug.
    let url = format!(
        "{}/diagnose/catalog?zoneName=local{q}&debugSeconds=3",
        stack.api()
    );
    let http = stack.http.clone();
    let call = tokio::spawn(async move {
        let r = http.get(url).send().await.unwrap();
        (
            r.status().as_u16(),
            r.json::<serde_json::Value>().await.unwrap(),
        )
    });
    wait_level(&[&sc.edge, &sc.service], "debug").await;
    let (code, body) = sc.request(sc.path()).await.unwrap();
    assert_eq!(code, 503, "{body}");
    let (status, r) = call.await.unwrap();
    assert_eq!(status, 200, "{r:#}");
    assert_diagnosis(&r, &want);
    assert_evidence(
        &r,
        "mtls",
        "edge edge-0: cluster.catalog.ssl.connection_error = ",
    );
    assert_evidence(&r, "mtls", ".ssl.fail_verify_error = ");
    assert!(
        has_evidence(&r, "mtls", "CERTIFICATE_VERIFY_FAILED")
            || has_evidence(&r, "mtls", "TLSV1_ALERT_UNKNOWN_CA"),
        "no TLS line from the debug window: {r:#}"
    );
    assert_evidence(&r, "edge_logs", "\" 503 URX,UF ");
    assert_evidence(&r, "service_logs", "no access line for request id");
    assert!(cause(&r).starts_with("mtls failed: "));
    // The windows are over: both sidecars are back at their level.
    assert_eq!(
        sc.edge.uniform_log_level().await.unwrap().as_deref(),
        Some("info")
    );
    assert_eq!(
        sc.service.uniform_log_level().await.unwrap().as_deref(),
        Some("info")
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sds_dead_blames_the_workload_identity_system() {
    let _turn = SERIAL.lock().await;
    let (sc, stack, body) = failing("sds_dead").await;
    assert!(body.starts_with("upstream connect error"), "{body}");
    let (q, want) = expected(&sc);
    let r = stack
        .diagnose_until(&q, |r| verdict(r, "edge_logs") == "fail")
        .await;
    assert_diagnosis(&r, &want);
    assert_evidence(
        &r,
        "mtls",
        "cluster.catalog.client_ssl_socket_factory.upstream_context_secrets_not_ready = ",
    );
    assert!(
        step(&r, "mtls")["action"]
            .as_str()
            .unwrap()
            .contains("workload identity system")
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext_authz_dead_is_a_token_filter_failure() {
    let _turn = SERIAL.lock().await;
    let (sc, stack, _) = failing("ext_authz_dead").await;
    let (q, want) = expected(&sc);
    let r = stack
        .diagnose_until(&q, |r| has_evidence(r, "edge_logs", "\" 503 UAEX "))
        .await;
    assert_diagnosis(&r, &want);
    assert_evidence(&r, "edge_logs", "\" 503 UAEX ");
    assert!(
        step(&r, "edge_logs")["action"]
            .as_str()
            .unwrap()
            .contains("token service and its sidecar are running")
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_local_port_is_a_loopback_503_in_the_service_sidecar() {
    let _turn = SERIAL.lock().await;
    let (sc, stack, body) = failing("wrong_local_port").await;
    assert!(body.starts_with("upstream connect error"), "{body}");
    let (q, want) = expected(&sc);
    let r = stack
        .diagnose_until(&q, |r| verdict(r, "service_logs") == "fail")
        .await;
    assert_diagnosis(&r, &want);
    assert_evidence(&r, "service_logs", "\" 503 UF ");
    let dead = sc.value("DEAD_PORT").unwrap();
    assert!(
        cause(&r).starts_with(&format!(
            "service_logs failed: the local service refuses connections at 127.0.0.1:{dead}"
        )),
        "{r:#}"
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_cluster_unset_is_a_dash_503_in_the_service_sidecar() {
    let _turn = SERIAL.lock().await;
    let (sc, stack, body) = failing("local_cluster_unset").await;
    assert_eq!(body, "no healthy upstream");
    let (q, want) = expected(&sc);
    let r = stack
        .diagnose_until(&q, |r| verdict(r, "service_logs") == "fail")
        .await;
    assert_diagnosis(&r, &want);
    assert_evidence(
        &r,
        "service_discovery",
        "lists local_catalog without any host line",
    );
    assert_evidence(&r, "service_logs", "\" 503 UH ");
    stack.stop().await;
}
