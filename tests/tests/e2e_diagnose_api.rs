//! `GET /diagnose` around the live `healthy` scenario: the request's errors (unknown
//! zone or cluster 404, bad symptom 400 naming it), missing evidence (no edge, a
//! Prometheus that does not answer) reported as skipped steps saying why, and the
//! missing-metrics symptom.

use std::time::{Duration, Instant};

use meshcat_tests::diagnose_stack::*;
use meshcat_tests::ports::free_port;
use meshcat_tests::scenario::Scenario;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diagnose_errors_missing_evidence_and_missing_metrics() {
    let _turn = SERIAL.lock().await;
    let mut sc = Scenario::start("healthy").await.unwrap();
    let dead = free_port().unwrap();
    let mut stack = Stack::start_with(&sc, |c| {
        c.diagnosis.prometheus_url = Some(format!("http://127.0.0.1:{dead}"));
    })
    .await;
    sc.fail().await.unwrap();
    let api = stack.api();
    let get = |url: String| {
        let http = stack.http.clone();
        async move {
            let r = http.get(url).send().await.unwrap();
            let code = r.status().as_u16();
            (code, r.json::<Value>().await.unwrap())
        }
    };

    // Request errors.
    let (code, v) = get(format!("{api}/diagnose/{SERVICE}?zoneName=nowhere")).await;
    assert_eq!((code, v["code"].is_string()), (404, true), "{v}");
    let (code, v) = get(format!("{api}/diagnose/unknown?zoneName={ZONE}")).await;
    assert_eq!(code, 404, "{v}");
    let (code, v) = get(format!(
        "{api}/diagnose/{SERVICE}?zoneName={ZONE}&symptom=slow_requests"
    ))
    .await;
    assert_eq!(code, 400, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("slow_requests"),
        "{v}"
    );
    for bad in [
        "",
        "?zoneName=local&debugSeconds=0",
        "?zoneName=local&debugSeconds=301",
        "?zoneName=local&path=nopath",
        "?zoneName=local&color=red",
    ] {
        let (code, v) = get(format!("{api}/diagnose/{SERVICE}{bad}")).await;
        assert_eq!(code, 400, "{bad}: {v}");
    }

    // Missing metrics: the record's settings, the reporting instance, and a collector
    // that does not answer (skipped, saying so).
    // The sidecar's inbound stats appear once it served a request and the agent
    // reported them.
    let r = stack
        .diagnose_until("&symptom=missing_metrics", |r| {
            verdict(r, "metrics_reporting") == "pass"
        })
        .await;
    assert_verdicts(
        &r,
        &[
            ("metrics_settings", "pass"),
            ("metrics_reporting", "pass"),
            ("metrics_collector", "skipped"),
        ],
    );
    assert_evidence(&r, "metrics_collector", "did not answer");

    // An instance whose sidecar reports no inbound HTTP stats (its metrics object is
    // empty) makes the reporting check fail, naming it; it passes again once gone.
    let (stop_silent, silent_task) = hung_agent(&stack, SERVICE, "catalog-silent", "silent-agent");
    let instances = stack.agg.instances.clone();
    meshcat_tests::wait_for(
        "the silent instance to be live",
        Duration::from_secs(20),
        || {
            let instances = instances.clone();
            async move {
                instances
                    .live_instance(ZONE, SERVICE, "catalog-silent")
                    .is_some()
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    let r = stack.diagnose("&symptom=missing_metrics").await.1;
    assert_eq!(verdict(&r, "metrics_reporting"), "fail", "{r:#}");
    assert_evidence(
        &r,
        "metrics_reporting",
        "no inbound HTTP metrics from: catalog-silent",
    );
    assert!(
        r["conclusion"]
            .as_str()
            .unwrap()
            .contains("1 of 2 live instances report no metrics (catalog-silent)"),
        "{r:#}"
    );
    let _ = stop_silent.send(());
    silent_task.await.unwrap();
    meshcat_tests::wait_for(
        "the silent instance to leave",
        Duration::from_secs(20),
        || {
            let instances = instances.clone();
            async move {
                instances
                    .live_instance(ZONE, SERVICE, "catalog-silent")
                    .is_none()
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    let r = stack.diagnose("&symptom=missing_metrics").await.1;
    assert_eq!(verdict(&r, "metrics_reporting"), "pass", "{r:#}");
    let put = stack
        .http
        .put(format!("{api}/clusters/{SERVICE}"))
        .json(&json!({"clusterName": SERVICE, "zoneName": ZONE, "name": SERVICE, "enableInstanceMetrics": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let r = stack.diagnose("&symptom=missing_metrics").await.1;
    assert_eq!(verdict(&r, "metrics_settings"), "fail", "{r:#}");
    assert!(cause(&r).starts_with("metrics_settings failed"), "{r:#}");

    // The edge's agent goes away: the edge's checks are skipped, saying why; the
    // service's checks still run.
    stack.edge_agent.take().unwrap().stop().await;
    let instances = stack.agg.instances.clone();
    meshcat_tests::wait_for(
        "the edge to leave the catalog",
        Duration::from_secs(20),
        || {
            let instances = instances.clone();
            async move {
                instances
                    .live_instance(ZONE, EDGE, "edge-0")
                    .is_none()
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    let started = Instant::now();
    let r = stack
        .diagnose("&symptom=upstream_connect_error&path=/catalog/items")
        .await
        .1;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(verdict(&r, "edge_discovery"), "skipped", "{r:#}");
    assert_evidence(
        &r,
        "edge_discovery",
        "the edge cluster edge has no live instance",
    );
    assert_eq!(verdict(&r, "service_discovery"), "pass", "{r:#}");
    assert_eq!(verdict(&r, "edge_routes"), "skipped");
    stack.stop().await;
}
