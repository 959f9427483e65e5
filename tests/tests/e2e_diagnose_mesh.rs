//! The diagnosis in meshes that look like production: several services behind one
//! edge with interleaved traffic, a failure diagnosed right after the request while
//! Envoy buffers its access log, a SAN mismatch, an upstream that fails only some
//! requests, two edge instances of which one saw the failure, and a healthy mesh
//! asked about every symptom. Each test asserts what the conclusion says: the
//! address, flags or counter of the cause.

use meshcat_tests::diagnose_stack::*;
use meshcat_tests::scenario::{Options, Scenario};
use serde_json::Value;

fn conclusion(r: &Value) -> &str {
    cause(r)
}

/// Whether any evidence line of any step contains `needle`.
fn any_evidence(r: &Value, needle: &str) -> bool {
    r["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["evidence"].as_array().into_iter().flatten())
        .any(|e| e.as_str().is_some_and(|e| e.contains(needle)))
}

#[track_caller]
fn assert_no_failed_step(r: &Value, what: &str) {
    for (name, verdict) in verdicts(r) {
        assert_ne!(verdict, "fail", "{what}: step {name} failed: {r:#}");
    }
    assert!(!conclusion(r).contains(" failed: "), "{what}: {r:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_services_behind_one_edge_keep_their_own_evidence() {
    let _turn = SERIAL.lock().await;
    let sc = Scenario::start("two_services").await.unwrap();
    let stack = Stack::start(&sc).await;
    stack.register("reviews").await;
    let dead = sc.value("DEAD_PORT").unwrap().to_owned();
    // Interleaved traffic: catalog fails, reviews answers, a reviews request is the
    // newest line of the edge.
    for _ in 0..2 {
        let (code, body) = sc.request("/catalog/items").await.unwrap();
        assert_eq!(code, 503, "{body}");
        let (code, body) = sc.request("/reviews/1").await.unwrap();
        assert_eq!(code, 200, "{body}");
    }
    let cause = format!(
        "service_logs failed: the local service refuses connections at 127.0.0.1:{dead}: the service sidecar catalog-0 answered 503 UF."
    );
    for q in [
        "&symptom=upstream_connect_error",
        "&symptom=upstream_connect_error&path=/catalog/items",
        "",
    ] {
        let r = stack.diagnose(q).await.1;
        assert!(conclusion(&r).starts_with(&cause), "{q}: {r:#}");
        assert!(!any_evidence(&r, "/reviews/"), "{q}: reviews' lines: {r:#}");
        assert_evidence(&r, "edge_logs", "\" 503 URX ");
    }
    let r = stack.diagnose("&symptom=upstream_connect_error").await.1;
    assert_evidence(
        &r,
        "edge_logs",
        "2 access lines for cluster catalog, 2 failing",
    );

    // And the other way: reviews' diagnosis reads only reviews' lines, which pass.
    for q in [
        "&symptom=upstream_connect_error",
        "&symptom=upstream_connect_error&path=/reviews/1",
    ] {
        let r = stack.diagnose_cluster("reviews", q).await;
        assert_eq!(verdict(&r, "edge_logs"), "pass", "{q}: {r:#}");
        assert_evidence(&r, "edge_logs", "\"GET /reviews/1 HTTP/1.1\" 200 ");
        assert!(
            !any_evidence(&r, "/catalog/"),
            "{q}: catalog's lines: {r:#}"
        );
        assert_no_failed_step(&r, q);
    }
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_is_seen_right_after_the_request_despite_the_access_log_buffer() {
    let _turn = SERIAL.lock().await;
    // Envoy's default flush interval: its access lines reach the file up to 10 s late.
    let mut sc = Scenario::start_with(
        "wrong_local_port",
        Options {
            flush_interval_ms: None,
        },
    )
    .await
    .unwrap();
    let stack = Stack::start(&sc).await;
    let dead = sc.value("DEAD_PORT").unwrap().to_owned();
    let (code, _) = sc.fail().await.unwrap();
    assert_eq!(code, 503);
    // Asked at once, without a path: the first answer already has the lines.
    let r = stack.diagnose("&symptom=upstream_connect_error").await.1;
    assert_evidence(&r, "edge_logs", "\"GET /catalog/items HTTP/1.1\" 503 URX ");
    assert_evidence(&r, "service_logs", "\" 503 UF ");
    assert!(
        conclusion(&r).starts_with(&format!(
            "service_logs failed: the local service refuses connections at 127.0.0.1:{dead}"
        )),
        "{r:#}"
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_san_mismatch_names_the_counter_and_the_san() {
    let _turn = SERIAL.lock().await;
    let mut sc = Scenario::start("san_mismatch").await.unwrap();
    let stack = Stack::start(&sc).await;
    let (_, body) = sc.fail().await.unwrap();
    assert!(body.starts_with("upstream connect error"), "{body}");
    let r = stack.diagnose("&symptom=upstream_connect_error").await.1;
    assert_eq!(verdict(&r, "mtls"), "fail", "{r:#}");
    assert_evidence(
        &r,
        "mtls",
        "edge edge-0: cluster.catalog.ssl.fail_verify_san = ",
    );
    // The catalog's identity inventory names the SANs first; the counter confirms.
    assert!(
        conclusion(&r).starts_with("mtls failed: edge's sidecars require a SAN matching ")
            && conclusion(&r).contains("TLS failure counters are raised (")
            && conclusion(&r).contains("cluster.catalog.ssl.fail_verify_san = ")
            && conclusion(&r).contains("subject alternative name"),
        "{r:#}"
    );
    // The service sidecar has no line: the request died in the handshake.
    assert_evidence(&r, "service_logs", "no access line for request id");
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_upstream_is_followed_through_its_failing_request() {
    let _turn = SERIAL.lock().await;
    let sc = Scenario::start("flapping_upstream").await.unwrap();
    let stack = Stack::start(&sc).await;
    let dead = sc.value("DEAD_PORT").unwrap().to_owned();
    // The local cluster alternates between a live and a dead endpoint: drive requests
    // until some passed, some failed, and the newest passed.
    let (mut ok, mut failed) = (0, 0);
    for _ in 0..20 {
        let (code, _) = sc.request(sc.path()).await.unwrap();
        match code {
            200 => ok += 1,
            503 => failed += 1,
            other => panic!("unexpected {other}"),
        }
        if code == 200 && failed > 0 {
            break;
        }
    }
    assert!(ok > 0 && failed > 0, "{ok} passed, {failed} failed");
    let r = stack.diagnose("&symptom=upstream_connect_error").await.1;
    assert_evidence(
        &r,
        "edge_logs",
        &format!(
            "{} access lines for cluster catalog, {failed} failing",
            ok + failed
        ),
    );
    assert!(
        conclusion(&r).starts_with(&format!(
            "service_logs failed: the local service refuses connections at 127.0.0.1:{dead}: the service sidecar catalog-0 answered 503 UF."
        )),
        "{r:#}"
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_edges_the_one_that_saw_the_failure_is_read() {
    let _turn = SERIAL.lock().await;
    let mut sc = Scenario::start("upstream_stopped").await.unwrap();
    sc.add_edge().await.unwrap();
    let mut stack = Stack::start(&sc).await;
    stack.add_agent(&sc.extra_edges[0].0, EDGE, "edge-1").await;
    let upstream = sc.upstream.as_ref().unwrap().addr;
    // edge-0 served the request before the service died; only edge-1 saw it fail.
    let (code, _) = sc.request(sc.path()).await.unwrap();
    assert_eq!(code, 200);
    sc.upstream.take().unwrap().stop().await;
    let (code, body) = sc
        .request_via(sc.extra_edges[0].1, sc.path())
        .await
        .unwrap();
    assert_eq!(code, 503, "{body}");
    let r = stack.diagnose("&symptom=upstream_connect_error").await.1;
    assert_evidence(&r, "edge_logs", "edge evidence from instance edge-1");
    assert_evidence(&r, "edge_logs", "edge-0: answered, but has no failing line");
    assert_evidence(&r, "edge_logs", "\" 503 URX ");
    assert!(
        conclusion(&r).starts_with(&format!(
            "service_logs failed: the local service refuses connections at {upstream}"
        )),
        "{r:#}"
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_mesh_fails_no_step_for_any_symptom() {
    let _turn = SERIAL.lock().await;
    let mut sc = Scenario::start("healthy").await.unwrap();
    let stack = Stack::start(&sc).await;
    let (code, _) = sc.fail().await.unwrap();
    assert_eq!(code, 200);
    // The sidecar's inbound stats reach the catalog with the agent's next report.
    stack
        .diagnose_until("&symptom=missing_metrics", |r| {
            verdict(r, "metrics_reporting") == "pass"
        })
        .await;
    for symptom in [
        "",
        "upstream_connect_error",
        "no_healthy_upstream",
        "ingress_502_503",
        "missing_metrics",
    ] {
        for path in ["", "&path=/catalog/items"] {
            let q = format!("&symptom={symptom}{path}");
            let r = stack.diagnose(&q).await.1;
            assert_no_failed_step(&r, &q);
            if symptom != "missing_metrics" {
                assert_eq!(verdict(&r, "edge_logs"), "pass", "{q}: {r:#}");
                assert_eq!(verdict(&r, "service_logs"), "pass", "{q}: {r:#}");
            }
        }
    }
    stack.stop().await;
}

/// No check of the request's way failed (the metrics checks are another chain: a
/// sidecar's inbound stats reach the catalog with its agent's next report), and
/// nothing blames mTLS.
#[track_caller]
fn assert_no_failed_request_step(r: &Value, what: &str) {
    for (name, verdict) in verdicts(r) {
        if !name.starts_with("metrics_") {
            assert_ne!(verdict, "fail", "{what}: step {name} failed: {r:#}");
        }
    }
    assert!(!conclusion(r).contains("mTLS"), "{what}: {r:#}");
}

/// How many lines the service sidecar wrote after its newest access line naming
/// `needle` (a request id or path); `None` before that line is in the file.
fn lines_after(sc: &Scenario, needle: &str) -> Option<usize> {
    let log = sc.service.log();
    let lines: Vec<&str> = log.lines().collect();
    let at = lines
        .iter()
        .rposition(|l| l.contains(needle) && l.contains(" HTTP/1.1\" "))?;
    Some(lines.len() - at - 1)
}

/// The request id of the edge's newest access line naming `path`.
fn edge_request_id(sc: &Scenario, path: &str) -> String {
    let log = sc.edge.log();
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains(path) && l.contains(" HTTP/1.1\" "))
        .unwrap_or_else(|| panic!("no edge line for {path}: {log}"));
    let quoted: Vec<&str> = line.split('"').collect();
    // `... "<forwarded for>" "<user agent>" "<request id>" "<authority>" "<host>"`.
    quoted[quoted.len() - 6].to_owned()
}

/// Sets the service sidecar's level through its admin API.
async fn set_service_level(sc: &Scenario, level: &str) {
    let r = reqwest::Client::new()
        .post(format!(
            "http://{}/logging?level={level}",
            sc.service.admin_addr()
        ))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
}

/// Floods the service sidecar's log with Envoy's own lines, as its admin traffic at
/// debug level does, until it wrote `at_least` lines after the access line naming
/// `needle`; then puts it back at info.
async fn flood_own_lines(sc: &Scenario, needle: &str, at_least: usize) {
    meshcat_tests::wait_for(
        "the request's access line in the service sidecar's log",
        std::time::Duration::from_secs(20),
        || async { lines_after(sc, needle) },
    )
    .await
    .unwrap();
    set_service_level(sc, "debug").await;
    meshcat_tests::wait_for(
        &format!("{at_least} lines of Envoy's own after the request"),
        std::time::Duration::from_secs(60),
        || async {
            for _ in 0..20 {
                sc.service
                    .admin_get("/stats?filter=^server\\.")
                    .await
                    .unwrap();
            }
            lines_after(sc, needle).filter(|n| *n >= at_least)
        },
    )
    .await
    .unwrap();
    set_service_level(sc, "info").await;
}

/// A request through the edge, then the service sidecar's log flooded after it:
/// first with Envoy's own lines (its admin traffic at debug level, more than an
/// evidence answer carries), then with other requests' access lines from another
/// edge (more than an answer carries, none of them followed by the diagnosis). The
/// request's lines are still found: picked apart from Envoy's own lines, then asked
/// for by request id; and by path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_after_the_request_leaves_its_lines_found() {
    let _turn = SERIAL.lock().await;
    let mut sc = Scenario::start("healthy").await.unwrap();
    sc.add_edge().await.unwrap();
    let stack = Stack::start(&sc).await;
    let (code, _) = sc.request("/catalog/items").await.unwrap();
    assert_eq!(code, 200);
    let id = edge_request_id(&sc, "/catalog/items");
    flood_own_lines(&sc, &id, 3_000).await;
    let r = stack.diagnose("").await.1;
    assert_eq!(verdict(&r, "service_logs"), "pass", "{r:#}");
    assert_evidence(&r, "service_logs", &format!("request id {id}"));
    assert_no_failed_request_step(&r, "after Envoy's own lines");

    // 2,100 other requests through the other edge: more access lines than one
    // answer carries (2,000), all after the request the edge-0 line names.
    let port = sc.extra_edges[0].1;
    let sc_ref = &sc;
    for _ in 0..(2_100 / 20) {
        let batch = (0..20).map(|i| async move {
            sc_ref
                .request_via(port, &format!("/catalog/other-{i}"))
                .await
                .unwrap()
        });
        for (code, body) in futures::future::join_all(batch).await {
            assert_eq!(code, 200, "{body}");
        }
    }
    meshcat_tests::wait_for(
        "the other requests' access lines in the service sidecar's log",
        std::time::Duration::from_secs(20),
        || async { lines_after(&sc, &id).filter(|n| *n >= 2_100) },
    )
    .await
    .unwrap();
    let r = stack.diagnose("").await.1;
    assert_eq!(verdict(&r, "service_logs"), "pass", "{r:#}");
    assert!(
        step(&r, "service_logs")["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().unwrap().contains(&id)
                && e.as_str().unwrap().contains("catalog-0 log:")),
        "the request's own line: {r:#}"
    );
    assert_no_failed_request_step(&r, "after other requests");
    let r = stack.diagnose("&path=/catalog/items").await.1;
    assert_eq!(verdict(&r, "service_logs"), "pass", "{r:#}");
    assert_no_failed_request_step(&r, "by path");
    stack.stop().await;
}

/// The service's agent holds only 300 lines of its sidecar's log: a flood after the
/// request pushes the request's lines out of what the agent holds. The diagnosis
/// cannot see the request either way, and says so: `service_logs` is skipped with
/// the window it had and the fixes, never failed, and nothing blames mTLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_does_not_reach_back_to_the_request_is_skipped_not_blamed() {
    let _turn = SERIAL.lock().await;
    let sc = Scenario::start("healthy").await.unwrap();
    let stack = Stack::start_with_service_flags(&sc, &["--log-max-lines", "300"]).await;
    let (code, _) = sc.request("/catalog/items").await.unwrap();
    assert_eq!(code, 200);
    let id = edge_request_id(&sc, "/catalog/items");
    flood_own_lines(&sc, &id, 1_000).await;
    for q in ["", "&symptom=upstream_connect_error"] {
        let r = stack.diagnose(q).await.1;
        assert_eq!(verdict(&r, "service_logs"), "skipped", "{q}: {r:#}");
        assert_evidence(&r, "service_logs", "the request was made at ");
        assert_evidence(
            &r,
            "service_logs",
            "service catalog-0: the log read reaches back to ",
        );
        assert_evidence(
            &r,
            "service_logs",
            "the agent holds at most 300 lines of it (--log-max-lines)",
        );
        let action = step(&r, "service_logs")["action"].as_str().unwrap();
        assert!(
            action.contains("--log-max-lines (now 300)") && action.contains("path="),
            "{action}"
        );
        assert_no_failed_request_step(&r, q);
    }
    stack.stop().await;
}
