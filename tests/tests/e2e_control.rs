//! The zone's control server end to end (contract section 17), all real: the
//! workspace's ADS server serves two real Envoy sidecars and meshcat's zone at once;
//! agents report the sidecars to a real aggregator. The intended view reaches the
//! catalog (`/zones/{z}/control`, `controlPlane`, a declared cluster without agents
//! listed with the control server's endpoints, Istio's and Consul's names mapped to
//! their service); then the snapshot changes under them: a new endpoint reaches both
//! (`synced`), one sidecar held on the old snapshot is `stale` with the addresses it
//! misses, and with a cluster the control server removed, a cluster Envoy rejects makes that sidecar `rejected` with Envoy's reason,
//! and the control server stopped makes the zone `unreachable` and the sidecars
//! `disconnected`, both back when it returns. Three replicas on real etcd, each with
//! its own stream, answer the same `/sync`, view counts and `controlPlane`.

use std::time::Duration;

use meshcat_control_server::{ClusterSpec, ControlServer, EndpointSpec, MeshSpec};
use meshcat_tests::etcd::EtcdCluster;
use meshcat_tests::replicas::Replicas;
use meshcat_tests::xds::{XdsBootstrap, XdsEnvoy};
use meshcat_tests::{Catalog, MeshAgent, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);
const ZONE: &str = "zone-x";

fn spec(payments: &[&str]) -> MeshSpec {
    let endpoints = |addresses: &[&str], port| {
        addresses
            .iter()
            .map(|a| EndpointSpec::new(a, port))
            .collect::<Vec<_>>()
    };
    MeshSpec {
        clusters: vec![
            ClusterSpec::new("payments", endpoints(payments, 8080)),
            ClusterSpec::new("ledger", endpoints(&["10.0.2.1", "10.0.2.2"], 7000)),
            ClusterSpec::new(
                "outbound|9080||reviews.default.svc.cluster.local",
                endpoints(&["10.0.3.1"], 9080),
            ),
            ClusterSpec::new(
                "ratings.default.dc1.internal.5a6a5c2b-1d4f-0c3e-9b7a-2f3e4d5c6b7a.consul",
                endpoints(&["10.0.4.1", "10.0.4.2"], 9090),
            ),
        ],
        listeners: Vec::new(),
    }
}

async fn agent(catalog: &Catalog, envoy: &XdsEnvoy, instance: &str) -> MeshAgent {
    agent_with(catalog.agent_args(), envoy, instance).await
}

/// An agent for `envoy` as `instance` of orders, with `reach` to reach the aggregator.
async fn agent_with(reach: Vec<String>, envoy: &XdsEnvoy, instance: &str) -> MeshAgent {
    MeshAgent::start(&envoy.agent_args(reach, (ZONE, "orders", instance)))
        .await
        .unwrap()
}

/// The proxy `instance` of `GET /sync`, when listed.
async fn proxy(catalog: &Catalog, instance: &str) -> Option<Value> {
    let (status, body) = catalog
        .get(&format!("/sync?zoneName={ZONE}&clusterName=orders"))
        .await
        .ok()?;
    assert_eq!(status, 200, "{body}");
    body["proxies"]
        .as_array()?
        .iter()
        .find(|p| p["instance"] == instance)
        .cloned()
}

async fn wait_state(catalog: &Catalog, instance: &str, state: &str) -> Value {
    wait_for(&format!("{instance} {state}"), DEADLINE, || async {
        proxy(catalog, instance)
            .await
            .filter(|p| p["state"] == state)
    })
    .await
    .unwrap()
}

async fn control(catalog: &Catalog) -> Value {
    let (status, body) = catalog
        .get(&format!("/zones/{ZONE}/control"))
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_are_held_to_what_the_control_server_declares() {
    let server = ControlServer::start("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    server.set(spec(&["10.0.1.1", "10.0.1.2"]));
    let catalog = Catalog::start(|c| c.sync.grace = Duration::from_secs(1))
        .await
        .unwrap();
    catalog
        .register_zone_at(ZONE, server.local_addr(), "")
        .await
        .unwrap();
    for cluster in ["orders", "ledger"] {
        catalog
            .register_cluster(ZONE, cluster, json!({"owner": format!("team-{cluster}")}))
            .await
            .unwrap();
    }

    // The zone's view.
    let view = wait_for("the zone connected", DEADLINE, || async {
        let c = control(&catalog).await;
        (c["state"] == "connected" && c["clusters"] == 4 && c["endpoints"] == 7).then_some(c)
    })
    .await
    .unwrap();
    assert_eq!(view["error"], "", "{view}");
    assert!(
        view["versions"]["clusters"]
            .as_str()
            .is_some_and(|v| !v.is_empty()),
        "{view}"
    );
    assert!(view["connectedSinceMs"].as_i64().is_some(), "{view}");
    let (status, missing) = catalog.get("/zones/nowhere/control").await.unwrap();
    assert_eq!(status, 404, "{missing}");

    // A declared cluster no agent reports: the control server's endpoints are its
    // instances; Istio's name stands for its service.
    let ledger = wait_for("ledger's endpoints", DEADLINE, || async {
        let c = catalog.cluster(ZONE, "ledger").await.ok()?;
        (c["instances"].as_array()?.len() == 2).then_some(c)
    })
    .await
    .unwrap();
    assert_eq!(
        ledger["controlPlane"],
        json!({"declared": true, "endpoints": 2, "healthyEndpoints": 2}),
        "{ledger}"
    );
    assert_eq!(ledger["instances"][0]["name"], "10.0.2.1:7000", "{ledger}");
    assert_eq!(
        ledger["instances"][0]["source"], "control-server",
        "{ledger}"
    );
    assert_eq!(ledger["status"], "stable", "{ledger}");
    let (_, services) = catalog
        .get(&format!("/services?zoneName={ZONE}"))
        .await
        .unwrap();
    let reviews = services
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["clusterName"] == "reviews")
        .unwrap_or_else(|| panic!("reviews declared, not registered: {services}"));
    assert_eq!(reviews["controlPlane"]["endpoints"], 1, "{reviews}");
    let ratings = services
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["clusterName"] == "ratings")
        .unwrap_or_else(|| panic!("Consul's ratings declared, not registered: {services}"));
    assert_eq!(ratings["controlPlane"]["endpoints"], 2, "{ratings}");
    assert_eq!(
        ratings["instances"][1]["name"], "10.0.4.2:9090",
        "{ratings}"
    );

    // Two sidecars of orders take their configuration from it.
    let a = XdsEnvoy::start(&XdsBootstrap::new(
        "orders-a",
        "orders",
        server.local_addr(),
    ))
    .await
    .unwrap();
    let b = XdsEnvoy::start(&XdsBootstrap::new(
        "orders-b",
        "orders",
        server.local_addr(),
    ))
    .await
    .unwrap();
    let _agent_a = agent(&catalog, &a, "orders-a").await;
    let _agent_b = agent(&catalog, &b, "orders-b").await;
    wait_state(&catalog, "orders-a", "synced").await;
    wait_state(&catalog, "orders-b", "synced").await;
    let orders = catalog.cluster(ZONE, "orders").await.unwrap();
    assert_eq!(orders["controlPlane"]["declared"], false, "{orders}");
    assert_eq!(orders["instances"][0]["source"], "agent", "{orders}");

    // A new endpoint reaches both: still synced, and the view counts it.
    server.set(spec(&["10.0.1.1", "10.0.1.2", "10.0.1.3"]));
    wait_for("the new endpoint in the view", DEADLINE, || async {
        (control(&catalog).await["endpoints"] == 8).then_some(())
    })
    .await
    .unwrap();
    for envoy in [&a, &b] {
        wait_for("the new endpoint on the sidecar", DEADLINE, || async {
            (envoy.hosts("payments").await.ok()?.len() == 3).then_some(())
        })
        .await
        .unwrap();
    }
    // Both agents have reported the new host set once the sync index moved past
    // any stale state; neither ever left synced for longer than the grace.
    wait_state(&catalog, "orders-a", "synced").await;
    wait_state(&catalog, "orders-b", "synced").await;

    // orders-b held on that snapshot while the next one drops 10.0.1.1 and adds
    // 10.0.1.4: stale after the grace, naming both addresses.
    server.hold("orders-b");
    server.set(spec(&["10.0.1.2", "10.0.1.3", "10.0.1.4"]));
    let stale = wait_state(&catalog, "orders-b", "stale").await;
    let detail = &stale["detail"]["clusters"][0];
    assert_eq!(detail["cluster"], "payments", "{stale}");
    assert_eq!(detail["missing"], json!(["10.0.1.4:8080"]), "{stale}");
    assert_eq!(detail["extra"], json!(["10.0.1.1:8080"]), "{stale}");
    assert!(
        stale["detail"]["text"]
            .as_str()
            .unwrap()
            .contains("10.0.1.4:8080"),
        "{stale}"
    );
    assert_eq!(
        proxy(&catalog, "orders-a").await.unwrap()["state"],
        "synced"
    );
    catalog
        .wait_history_entry(
            "orders-b's sync-changed entry",
            &format!("/history?zoneName={ZONE}&kind=sync-changed"),
            DEADLINE,
            |e| e["instance"] == "orders-b" && e["detail"]["to"] == "stale",
        )
        .await
        .unwrap();
    server.release("orders-b");
    wait_state(&catalog, "orders-b", "synced").await;

    // A removed cluster: orders-a drops ledger with the control server, orders-b,
    // held, still has it: stale, the cluster named as no longer declared.
    server.hold("orders-b");
    let mut without_ledger = spec(&["10.0.1.2", "10.0.1.3", "10.0.1.4"]);
    without_ledger.clusters.retain(|c| c.name != "ledger");
    server.set(without_ledger);
    let stale = wait_state(&catalog, "orders-b", "stale").await;
    let detail = &stale["detail"]["clusters"][0];
    assert_eq!(detail["cluster"], "ledger", "{stale}");
    assert_eq!(detail["removed"], true, "{stale}");
    assert!(
        stale["detail"]["text"]
            .as_str()
            .unwrap()
            .contains("no longer declared"),
        "{stale}"
    );
    assert_eq!(
        proxy(&catalog, "orders-a").await.unwrap()["state"],
        "synced"
    );
    let ledger = catalog.cluster(ZONE, "ledger").await.unwrap();
    assert_eq!(ledger["controlPlane"]["declared"], false, "{ledger}");
    server.release("orders-b");
    server.set(spec(&["10.0.1.2", "10.0.1.3", "10.0.1.4"]));
    wait_state(&catalog, "orders-b", "synced").await;

    // A cluster orders-a rejects: rejected, with Envoy's reason from its log.
    let mut bad = spec(&["10.0.1.2", "10.0.1.3", "10.0.1.4"]);
    bad.clusters.push(ClusterSpec {
        connect_timeout_ms: 0,
        ..ClusterSpec::new("broken", Vec::new())
    });
    server.override_for("orders-a", Some(bad));
    let rejected = wait_state(&catalog, "orders-a", "rejected").await;
    let rejection = &rejected["detail"]["rejections"][0];
    assert_eq!(rejection["kind"], "clusters", "{rejected}");
    assert!(
        rejection["reason"]
            .as_str()
            .unwrap()
            .contains("ConnectTimeout"),
        "{rejected}"
    );
    server.override_for("orders-a", None);
    server.set(spec(&["10.0.1.2", "10.0.1.3", "10.0.1.5"]));
    wait_state(&catalog, "orders-a", "synced").await;

    // The control server stops: the zone is unreachable and the sidecars
    // disconnected; both come back with it.
    server.stop().await;
    wait_for("the zone unreachable", DEADLINE, || async {
        let c = control(&catalog).await;
        (c["state"] == "unreachable").then_some(c)
    })
    .await
    .unwrap();
    wait_state(&catalog, "orders-a", "disconnected").await;
    wait_state(&catalog, "orders-b", "disconnected").await;
    let ledger = catalog.cluster(ZONE, "ledger").await.unwrap();
    assert_eq!(
        ledger["controlPlane"]["endpoints"], 2,
        "the last good view is served: {ledger}"
    );
    server.restart().await.unwrap();
    wait_for("the zone connected again", DEADLINE, || async {
        (control(&catalog).await["state"] == "connected").then_some(())
    })
    .await
    .unwrap();
    wait_state(&catalog, "orders-a", "synced").await;
    wait_state(&catalog, "orders-b", "synced").await;
    catalog
        .wait_history_entry(
            "the zone's control-changed entry",
            &format!("/history?zoneName={ZONE}&kind=control-changed"),
            DEADLINE,
            |e| e["detail"]["to"] == "unreachable",
        )
        .await
        .unwrap();
}

/// The service `name` of `GET /services?zoneName=`, when listed.
async fn service(catalog: &Catalog, name: &str) -> Option<Value> {
    let (status, services) = catalog
        .get(&format!("/services?zoneName={ZONE}"))
        .await
        .ok()?;
    assert_eq!(status, 200, "{services}");
    services
        .as_array()?
        .iter()
        .find(|s| s["clusterName"] == name)
        .cloned()
}

/// A cluster registered after the view arrived is mapped as soon as it is
/// registered, while the view stays as it is: the control server's Consul name,
/// which stood for its service `ratings` unregistered, stands for itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_registered_after_the_view_arrived_is_mapped() {
    const CONSUL: &str = "ratings.default.dc1.internal.5a6a5c2b-1d4f-0c3e-9b7a-2f3e4d5c6b7a.consul";
    let server = ControlServer::start("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    server.set(spec(&["10.0.1.1"]));
    let catalog = Catalog::start(|_| {}).await.unwrap();
    catalog
        .register_zone_at(ZONE, server.local_addr(), "")
        .await
        .unwrap();
    wait_for("ratings declared", DEADLINE, || async {
        service(&catalog, "ratings")
            .await
            .filter(|s| s["controlPlane"]["endpoints"] == 2)
    })
    .await
    .unwrap();
    let versions = control(&catalog).await["versions"].clone();

    catalog
        .register_cluster(ZONE, CONSUL, json!({"owner": "team-ratings"}))
        .await
        .unwrap();
    let registered = catalog
        .wait_cluster("the Consul name declared", ZONE, CONSUL, DEADLINE, |c| {
            c["controlPlane"]["declared"] == true
        })
        .await
        .unwrap();
    assert_eq!(
        registered["controlPlane"],
        json!({"declared": true, "endpoints": 2, "healthyEndpoints": 2}),
        "{registered}"
    );
    assert_eq!(registered["owner"], "team-ratings", "{registered}");
    assert!(service(&catalog, "ratings").await.is_none());
    // No new view came meanwhile: the registration alone mapped it.
    assert_eq!(control(&catalog).await["versions"], versions);
}

const BIN: &str = env!("CARGO_BIN_EXE_replica-aggregator");

/// What replica `i` answers at `path` (asserting 200).
async fn on(set: &Replicas, i: usize, path: &str) -> Value {
    let (status, body) = set.get(i, path).await.unwrap();
    assert_eq!(status, 200, "replica {i} {path}: {body}");
    body
}

/// Whether every replica shows orders-a in `state` and all list the same proxies.
async fn replicas_agree(set: &Replicas, state: &str) -> Option<Vec<Value>> {
    let mut seen = Vec::new();
    for i in 0..3 {
        let sync = on(set, i, &format!("/sync?zoneName={ZONE}")).await;
        let proxies = sync["proxies"].as_array()?.clone();
        let a = proxies.iter().find(|p| p["instance"] == "orders-a")?;
        if a["state"] != state {
            return None;
        }
        seen.push(Value::Array(proxies));
    }
    seen.windows(2).all(|w| w[0] == w[1]).then_some(seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_keeps_its_own_stream_and_answers_the_same() {
    let server = ControlServer::start("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    server.set(spec(&["10.0.1.1", "10.0.1.2"]));
    let etcd = EtcdCluster::start().await.unwrap();
    let set = Replicas::start(BIN, 3, &etcd.store_url("/control"), &["--sync-grace", "1s"])
        .await
        .unwrap();
    let (status, body) = set
        .post(
            0,
            "/zones",
            &json!({"zoneName": ZONE, "serverAddress": server.local_addr().to_string()}),
        )
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");

    // Each replica connects on its own and holds the same view.
    for i in 0..3 {
        wait_for(&format!("replica {i} connected"), DEADLINE, || async {
            let c = on(&set, i, &format!("/zones/{ZONE}/control")).await;
            (c["state"] == "connected" && c["clusters"] == 4 && c["endpoints"] == 7).then_some(())
        })
        .await
        .unwrap();
    }
    wait_for("three streams at the control server", DEADLINE, || async {
        let meshcat = server
            .nodes()
            .iter()
            .filter(|n| n.id.starts_with(&format!("meshcat~{ZONE}~")))
            .count();
        (meshcat == 3).then_some(())
    })
    .await
    .unwrap();

    // One sidecar, its agent reporting to replica 1: every replica lists it synced.
    let envoy = XdsEnvoy::start(&XdsBootstrap::new(
        "orders-a",
        "orders",
        server.local_addr(),
    ))
    .await
    .unwrap();
    let _agent = agent_with(set.agent_args(&[1]), &envoy, "orders-a").await;
    wait_for("every replica lists orders-a synced", DEADLINE, || {
        replicas_agree(&set, "synced")
    })
    .await
    .unwrap();

    // Held on an old snapshot: stale on every replica, with the same detail.
    server.hold("orders-a");
    server.set(spec(&["10.0.1.2", "10.0.1.3"]));
    let agreed = wait_for("every replica lists orders-a stale", DEADLINE, || {
        replicas_agree(&set, "stale")
    })
    .await
    .unwrap();
    assert!(
        agreed[0].to_string().contains("10.0.1.3:8080"),
        "{}",
        agreed[0]
    );
    for i in 0..3 {
        wait_for(&format!("replica {i}'s view"), DEADLINE, || async {
            let services = on(&set, i, &format!("/services?zoneName={ZONE}")).await;
            let payments = services
                .as_array()?
                .iter()
                .find(|s| s["clusterName"] == "payments")?
                .clone();
            (payments["controlPlane"]["endpoints"] == 2
                && payments["instances"]
                    .as_array()?
                    .iter()
                    .any(|x| x["name"] == "10.0.1.3:8080"))
            .then_some(())
        })
        .await
        .unwrap();
    }
    server.release("orders-a");
    wait_for(
        "every replica lists orders-a synced again",
        DEADLINE,
        || replicas_agree(&set, "synced"),
    )
    .await
    .unwrap();
}
