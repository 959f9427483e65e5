//! Issue 3 end to end: two real Envoy sidecars with agents reporting to the
//! aggregator over QUIC; instances, start times, the instance metrics object and
//! every status transition seen through the REST API.

use std::time::{Duration, Instant};

use meshcat_tests::mesh::{instance_names, start_time};
use meshcat_tests::{Catalog, MeshAgent, Sidecar};
use serde_json::{Value, json};

/// Report interval of the agents.
const INTERVAL: Duration = Duration::from_millis(300);
/// The aggregator's instance TTL: three intervals, as the defaults.
const TTL: Duration = Duration::from_millis(900);
/// Generous ceiling of every wait; the figures the contract promises are asserted
/// separately where they are measured.
const DEADLINE: Duration = Duration::from_secs(20);
/// What the contract promises for a status change: one report interval plus 1 s,
/// and an instance that stops reporting leaves after its TTL.
fn status_promise() -> Duration {
    INTERVAL + TTL + Duration::from_secs(1)
}

fn status_is(s: &'static str) -> impl Fn(&Value) -> bool {
    move |c| c["status"] == s
}

/// Checks the metrics object's keys against the requests sent and its invariants.
fn check_metrics(m: &Value, requests: i64, errors: i64) {
    assert_eq!(m["Total/requests"], requests, "{m}");
    assert_eq!(m["all/requests"], requests, "{m}");
    let parts: i64 = ["HTTP", "HTTPS", "RPC", "RPC_TLS"]
        .iter()
        .map(|p| m[format!("{p}/requests")].as_i64().unwrap())
        .sum();
    assert_eq!(parts, requests, "{m}");
    assert_eq!(m["all/errors.count"], errors, "{m}");
    assert_eq!(m["all/latency_ms.count"], requests, "{m}");
    let q = |k: &str| m[format!("all/latency_ms.{k}")].as_i64().unwrap();
    let chain = ["min", "p50", "p90", "p95", "p99", "p9990", "p9999", "max"].map(q);
    assert!(chain.windows(2).all(|w| w[0] <= w[1]), "{chain:?}");
    let avg = m["all/latency_ms.avg"].as_f64().unwrap();
    let expected = q("sum") as f64 / requests as f64;
    assert!(
        (avg - expected).abs() < 1e-6,
        "avg {avg} sum/count {expected}"
    );
    assert!(m["all/in_throughput"].as_i64().unwrap() > 0);
    assert!(m["system/start_time"].as_i64().unwrap() > 0);
    assert!(m["mesh-metrics-version"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_metrics_and_every_status_transition() {
    let catalog = Catalog::start(|c| c.store.rules.instance_ttl = TTL)
        .await
        .unwrap();
    catalog.register_zone("zone-a", "").await.unwrap();
    catalog
        .register_cluster(
            "zone-a",
            "orders",
            json!({"name": "Orders", "version": "1.2.0", "minInstances": 2}),
        )
        .await
        .unwrap();
    let mut a = Sidecar::start().await.unwrap();
    let mut b = Sidecar::start().await.unwrap();
    let interval = "300ms";
    let _agent_a = MeshAgent::for_sidecar(&catalog, &a, "zone-a", "orders", "orders-a", interval)
        .await
        .unwrap();
    let _agent_b = MeshAgent::for_sidecar(&catalog, &b, "zone-a", "orders", "orders-b", interval)
        .await
        .unwrap();

    // Both instances, with Envoy's start times, and stable.
    let c = catalog
        .wait_cluster("two instances, stable", "zone-a", "orders", DEADLINE, |c| {
            instance_names(c) == ["orders-a", "orders-b"] && c["status"] == "stable"
        })
        .await
        .unwrap();
    assert_eq!(c["authorized"], true);
    let start_a = start_time(&c, "orders-a").unwrap();
    assert!(
        a.started_at(start_a),
        "{start_a} vs {}..{}",
        a.started_after_ms,
        a.started_before_ms
    );
    assert!(b.started_at(start_time(&c, "orders-b").unwrap()));

    // Real traffic, counted exactly in each instance's metrics object.
    a.send("/orders", 25, 200).await.unwrap();
    b.send("/orders", 15, 200).await.unwrap();
    for (instance, n) in [("orders-a", 25), ("orders-b", 15)] {
        let path = format!("/metrics/orders/{instance}");
        let m = meshcat_tests::wait_for("the requests in the metrics object", DEADLINE, || async {
            let (s, m) = catalog.get(&path).await.ok()?;
            (s == 200 && m["all/latency_ms.count"] == n).then_some(m)
        })
        .await
        .unwrap();
        check_metrics(&m, n, 0);
        let (s, same) = catalog
            .get(&format!("/metrics/Orders/1.2.0/{instance}"))
            .await
            .unwrap();
        assert_eq!(s, 200);
        check_metrics(&same, n, 0);
        let (s, with_zone) = catalog
            .get(&format!("{path}?zoneName=zone-a"))
            .await
            .unwrap();
        assert_eq!(s, 200);
        assert_eq!(with_zone["Total/requests"], n);
    }
    assert_eq!(catalog.get("/metrics/orders/nobody").await.unwrap().0, 404);

    // 5xx traffic: warning from the error ratio while it lasts, stable after.
    let sending = tokio::spawn({
        let url = format!("{}/status/503", a.envoy.url("ingress"));
        async move {
            let client = reqwest::Client::new();
            loop {
                let _ = client.get(&url).send().await;
            }
        }
    });
    let warned = catalog
        .wait_cluster("warning from 5xx", "zone-a", "orders", DEADLINE, |c| {
            c["status"] == "warning"
        })
        .await;
    sending.abort();
    let c = warned.unwrap();
    assert_eq!(instance_names(&c).len(), 2, "both live: the ratio warned");
    catalog
        .wait_cluster(
            "stable once errors stop",
            "zone-a",
            "orders",
            DEADLINE,
            status_is("stable"),
        )
        .await
        .unwrap();
    let (_, m) = catalog.get("/metrics/orders/orders-a").await.unwrap();
    assert!(m["all/errors.count"].as_i64().unwrap() >= 20, "{m}");

    // One sidecar stops: warning (below minInstances) within the promise.
    a.envoy.kill();
    let t = Instant::now();
    let c = catalog
        .wait_cluster(
            "warning with one sidecar",
            "zone-a",
            "orders",
            DEADLINE,
            status_is("warning"),
        )
        .await
        .unwrap();
    let took = t.elapsed();
    assert!(took <= status_promise(), "warning after {took:?}");
    assert_eq!(instance_names(&c), ["orders-b"]);
    assert_eq!(
        catalog.get("/metrics/orders/orders-a").await.unwrap().0,
        404
    );

    // Both stop: down.
    b.envoy.kill();
    let t = Instant::now();
    let c = catalog
        .wait_cluster("down", "zone-a", "orders", DEADLINE, status_is("down"))
        .await
        .unwrap();
    let took = t.elapsed();
    assert!(took <= status_promise(), "down after {took:?}");
    assert!(instance_names(&c).is_empty());
    let (_, meta) = catalog.get("/zones/zone-a/metadata").await.unwrap();
    assert_eq!(meta["downServiceCount"], 1, "{meta}");
    assert_eq!(meta["instanceCount"], 0, "{meta}");

    // Restarted: stable again, with the new start times.
    let old_a = start_a;
    a.restart().await.unwrap();
    b.restart().await.unwrap();
    let t = Instant::now();
    let c = catalog
        .wait_cluster("stable after restart", "zone-a", "orders", DEADLINE, |c| {
            c["status"] == "stable" && instance_names(c).len() == 2
        })
        .await
        .unwrap();
    let took = t.elapsed();
    assert!(took <= status_promise(), "stable after {took:?}");
    let new_a = start_time(&c, "orders-a").unwrap();
    assert!(new_a > old_a, "new start {new_a} after old {old_a}");
    assert!(a.started_at(new_a));
    assert!(b.started_at(start_time(&c, "orders-b").unwrap()));
    let (_, meta) = catalog.get("/zones/zone-a/metadata").await.unwrap();
    assert_eq!(meta["stableServiceCount"], 1, "{meta}");
    assert_eq!(meta["instanceCount"], 2, "{meta}");
    let (_, list) = catalog.get("/clusters?status=stable").await.unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
}
