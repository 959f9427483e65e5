//! Pods of one name in two namespaces, on one node, end to end: a real aggregator, one
//! DaemonSet-style agent (`--pods-file`) and two real Envoys whose pods are both named
//! `orders-1`, one in namespace `team-a`, one in `team-b`. Both are reported, each in
//! its own zone, and a log-level command through the aggregator's API reaches the
//! sidecar of the zone it names, and only that one (read back from each Envoy's
//! admin API).

use std::time::Duration;

use meshcat_tests::mesh::{instance_names, pods_flags};
use meshcat_tests::{Catalog, MeshAgent, Sidecar};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(20);

fn admin_port(sidecar: &Sidecar) -> String {
    let admin = sidecar.envoy.admin_addr();
    admin.rsplit_once(':').unwrap().1.to_owned()
}

/// A running pod named `orders-1` in `namespace`, whose sidecar's admin API listens on
/// 127.0.0.1 and `port`.
fn pod(namespace: &str, uid: &str, port: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": "orders-1", "namespace": namespace, "uid": uid,
                     "labels": {"meshcat.io/scrape": "true"},
                     "annotations": {"meshcat.io/cluster": "orders",
                                     "meshcat.io/admin-port": port}},
        "spec": {"containers": [{"name": "app"}, {"name": "envoy"}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1"}
    })
}

async fn level(sidecar: &Sidecar) -> Option<String> {
    sidecar.envoy.uniform_log_level().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_one_name_in_two_namespaces_are_both_reported_and_commanded_apart() {
    let catalog = Catalog::start(|_| {}).await.unwrap();
    for zone in ["team-a", "team-b"] {
        catalog.register_zone(zone, "edge").await.unwrap();
        catalog
            .register_cluster(zone, "orders", json!({}))
            .await
            .unwrap();
    }
    let a = Sidecar::start().await.unwrap();
    let b = Sidecar::start().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let pods = pods_flags(
        dir.path(),
        vec![
            pod("team-a", "uid-a", &admin_port(&a)),
            pod("team-b", "uid-b", &admin_port(&b)),
        ],
    )
    .unwrap();
    let mut args = catalog.agent_args();
    args.extend(pods);
    args.extend(["--interval", "200ms"].map(str::to_owned));
    let agent = MeshAgent::start(&args).await.unwrap();

    // Both pods are reported, each in its namespace's zone.
    for zone in ["team-a", "team-b"] {
        catalog
            .wait_cluster(
                &format!("orders-1 in {zone}"),
                zone,
                "orders",
                DEADLINE,
                |c| instance_names(c) == ["orders-1"],
            )
            .await
            .unwrap();
    }
    assert_eq!(level(&a).await.as_deref(), Some("info"));
    assert_eq!(level(&b).await.as_deref(), Some("info"));

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let url = |zone: &str| {
        format!(
            "{}/zones/{zone}/clusters/orders/instances/orders-1/logging",
            catalog.api_url()
        )
    };
    // team-b's sidecar, and only it.
    let r = http
        .put(format!("{}?level=debug", url("team-b")))
        .send()
        .await
        .unwrap();
    let status = r.status();
    assert_eq!(
        (status.as_u16(), r.text().await.unwrap().as_str()),
        (200, "debug")
    );
    assert_eq!(level(&b).await.as_deref(), Some("debug"));
    assert_eq!(
        level(&a).await.as_deref(),
        Some("info"),
        "team-a was changed"
    );

    // team-a's sidecar, and only it.
    let r = http
        .put(format!("{}?level=error", url("team-a")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(level(&a).await.as_deref(), Some("error"));
    assert_eq!(
        level(&b).await.as_deref(),
        Some("debug"),
        "team-b was changed"
    );

    // Reading goes to the right sidecar too.
    for (zone, want) in [("team-a", "error"), ("team-b", "debug")] {
        let r = http.get(url(zone)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{zone}");
        assert_eq!(r.text().await.unwrap(), want, "{zone}");
    }

    agent.stop().await.unwrap();
}
