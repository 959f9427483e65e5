//! Configuration drift end to end (contract section 15) on real Envoys: instances of
//! one cluster whose sidecars differ only in what is per instance (node, ports,
//! upstream addresses) are not drifted; one with another route is, and the drift
//! names `routes`; the graph's node says so; when it leaves, the drift ends.

use std::time::Duration;

use meshcat_tests::{Bootstrap, Catalog, Envoy, MeshAgent, Upstream, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);
const ZONE: &str = "zone-d";

fn orders_sidecar(upstream: &Upstream, node: &str, prefix: &str) -> Bootstrap {
    Bootstrap::routed_sidecar(upstream.addr, "orders", node, prefix)
}

async fn agent(catalog: &Catalog, envoy: &Envoy, instance: &str) -> MeshAgent {
    MeshAgent::for_envoy(catalog, envoy, ZONE, "orders", instance, "300ms")
        .await
        .unwrap()
}

fn instances(group: &Value) -> Vec<&str> {
    group["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_with_another_route_are_drifted_and_per_instance_settings_are_not() {
    let catalog = Catalog::start(|_| {}).await.unwrap();
    catalog.register_zone(ZONE, "edge").await.unwrap();
    catalog
        .register_cluster(ZONE, "orders", json!({"owner": "team-o"}))
        .await
        .unwrap();
    let (ua, ub, uc) = (
        Upstream::start().await.unwrap(),
        Upstream::start().await.unwrap(),
        Upstream::start().await.unwrap(),
    );
    let a = Envoy::start(orders_sidecar(&ua, "orders-a", "/"))
        .await
        .unwrap();
    let b = Envoy::start(orders_sidecar(&ub, "orders-b", "/"))
        .await
        .unwrap();
    let c = Envoy::start(orders_sidecar(&uc, "orders-c", "/v2"))
        .await
        .unwrap();
    let _a = agent(&catalog, &a, "orders-a").await;
    let _b = agent(&catalog, &b, "orders-b").await;
    let drift = "/clusters/orders/drift?zoneName=zone-d";

    // Two instances, one configuration: one group with both, nothing differs.
    let same = wait_for("one group of two", DEADLINE, || async {
        let (s, d) = catalog.get(drift).await.ok()?;
        assert_eq!(s, 200, "{d}");
        (d["groups"].as_array()?.len() == 1
            && instances(&d["groups"][0]) == ["orders-a", "orders-b"]
            && d["groups"][0]["configHash"].is_string())
        .then_some(d)
    })
    .await
    .unwrap();
    assert_eq!(same["drifted"], false, "{same}");
    assert_eq!(same["differs"], json!([]), "{same}");

    // A third with another route: drifted, and the routes are what differ.
    let c_agent = agent(&catalog, &c, "orders-c").await;
    let drifted = wait_for("orders-c drifted", DEADLINE, || async {
        let (_, d) = catalog.get(drift).await.ok()?;
        (d["drifted"] == true).then_some(d)
    })
    .await
    .unwrap();
    assert_eq!(drifted["differs"], json!(["routes"]), "{drifted}");
    let groups = drifted["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{drifted}");
    assert_eq!(instances(&groups[0]), ["orders-a", "orders-b"], "{drifted}");
    assert_eq!(instances(&groups[1]), ["orders-c"], "{drifted}");
    assert_eq!(groups[0]["configHash"], same["groups"][0]["configHash"]);
    wait_for("the graph node drifted", DEADLINE, || async {
        let (_, g) = catalog.get("/graph?zoneName=zone-d").await.ok()?;
        let node = g["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["id"] == "zone-d/orders")?
            .clone();
        (node["drifted"] == true).then_some(())
    })
    .await
    .unwrap();

    // orders-c leaves: the drift ends.
    c_agent.stop().await.unwrap();
    wait_for("the drift ends", DEADLINE, || async {
        let (_, d) = catalog.get(drift).await.ok()?;
        (d["drifted"] == false && d["groups"].as_array()?.len() == 1).then_some(())
    })
    .await
    .unwrap();

    // Bad queries and unknown clusters.
    for (path, status) in [
        ("/clusters/orders/drift", 400),
        ("/clusters/orders/drift?zoneName=a%20b", 400),
        ("/clusters/nobody/drift?zoneName=zone-d", 404),
        ("/clusters/orders/drift?zoneName=zone-d&other=1", 400),
    ] {
        let (got, body) = catalog.get(path).await.unwrap();
        assert_eq!(got.as_u16(), status, "{path}: {body}");
    }
}
