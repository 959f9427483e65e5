//! `GET /services` end to end: clusters that agents report but nobody registered,
//! and the clusters the zone's edge sidecar (its requestCluster) has in its
//! configuration, learnt from a real Envoy's config dump through its agent.

use std::time::Duration;

use meshcat_tests::mesh::instance_names;
use meshcat_tests::{Bootstrap, Catalog, Envoy, MeshAgent, Sidecar, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(20);

fn find<'a>(list: &'a Value, zone: &str, cluster: &str) -> Option<&'a Value> {
    list.as_array()?
        .iter()
        .find(|c| c["zoneName"] == zone && c["clusterName"] == cluster)
}

/// An unregistered cluster as `GET /services` must show it: its name, empty metadata.
fn assert_unregistered(c: &Value) {
    assert_eq!(c["name"], c["clusterName"], "{c}");
    for key in ["version", "owner", "capability", "runtime", "prometheusJob"] {
        assert_eq!(c[key], "", "{key}: {c}");
    }
    assert_eq!(c["minInstances"], 0, "{c}");
    assert_eq!(c["protocols"], json!([]), "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_lists_reported_and_edge_clusters_nobody_registered() {
    let catalog = Catalog::start(|c| {
        c.store.rules.instance_ttl = Duration::from_millis(900);
        c.diagnosis.edge_refresh = Duration::from_millis(300);
    })
    .await
    .unwrap();
    catalog.register_zone("zone-s", "edge").await.unwrap();
    catalog
        .register_cluster("zone-s", "payments", json!({"owner": "team-pay"}))
        .await
        .unwrap();

    // A service sidecar whose cluster nobody registered.
    let inventory = Sidecar::start().await.unwrap();
    let _inventory_agent = MeshAgent::for_sidecar(
        &catalog,
        &inventory,
        "zone-s",
        "inventory",
        "inventory-1",
        "300ms",
    )
    .await
    .unwrap();
    // The zone's edge: routes to payments (registered) and search (nobody's).
    let svc = inventory.envoy.listener("ingress");
    let edge = Envoy::start(Bootstrap::edge_sidecar(
        &[("/pay", "payments", svc), ("/search", "search", svc)],
        None,
    ))
    .await
    .unwrap();
    let args = catalog.sidecar_agent_args(&edge, "zone-s", "edge", "edge-1", "300ms");
    let _edge_agent = MeshAgent::start(&args).await.unwrap();

    let services = wait_for("edge and reported clusters listed", DEADLINE, || async {
        let (s, list) = catalog.get("/services").await.ok()?;
        (s == 200
            && find(&list, "zone-s", "search").is_some()
            && find(&list, "zone-s", "inventory").is_some_and(|c| c["status"] == "stable")
            && find(&list, "zone-s", "edge").is_some_and(|c| c["status"] == "stable"))
        .then_some(list)
    })
    .await
    .unwrap();

    let names: Vec<(&str, &str)> = services
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["zoneName"].as_str().unwrap(),
                c["clusterName"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("zone-s", "edge"),
            ("zone-s", "inventory"),
            ("zone-s", "payments"),
            ("zone-s", "search"),
        ],
        "sorted, each once"
    );

    let inv = find(&services, "zone-s", "inventory").unwrap();
    assert_unregistered(inv);
    assert_eq!(instance_names(inv), ["inventory-1"]);
    assert_eq!(inv["authorized"], true);
    assert!(inv["instances"][0]["startTime"].as_i64().unwrap() > 0);

    let search = find(&services, "zone-s", "search").unwrap();
    assert_unregistered(search);
    assert_eq!(search["instances"], json!([]));
    assert_eq!(search["status"], "down");

    let edge_rec = find(&services, "zone-s", "edge").unwrap();
    assert_unregistered(edge_rec);
    assert_eq!(instance_names(edge_rec), ["edge-1"]);

    // The registered one keeps its metadata; the edge knows it but adds nothing.
    let pay = find(&services, "zone-s", "payments").unwrap();
    assert_eq!(pay["owner"], "team-pay");
    assert_eq!(pay["name"], "payments");

    // Filtered by zone; unregistered clusters stay out of the zone's counts.
    let (_, same) = catalog.get("/services?zoneName=zone-s").await.unwrap();
    assert_eq!(same.as_array().unwrap().len(), 4);
    let (_, none) = catalog.get("/services?zoneName=elsewhere").await.unwrap();
    assert_eq!(none, json!([]));
    let (_, meta) = catalog.get("/zones/zone-s/metadata").await.unwrap();
    assert_eq!(meta["serviceCount"], 1, "{meta}");
    let (_, list) = catalog.get("/clusters").await.unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
}
