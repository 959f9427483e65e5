//! The diagnosis's `control_server` step end to end (contract sections 5 and 17),
//! all real: the workspace's ADS server configures a real edge Envoy and a real
//! sidecar of payments and serves meshcat's zone; agents report both to a real
//! aggregator. A cluster the control server does not declare, and one it declares
//! without an endpoint, are the control server's fault (owner `platform`); payments,
//! declared with healthy endpoints and both sidecars synced, passes; the edge held
//! on an old snapshot is the edge sidecar's fault (its owner, since when, the
//! addresses it lacks and still has); then payments' own sidecar held is that
//! sidecar's fault (payments' owner).

use std::time::Duration;

use meshcat_control_server::{ClusterSpec, ControlServer, EndpointSpec, MeshSpec};
use meshcat_tests::xds::{XdsBootstrap, XdsEnvoy};
use meshcat_tests::{Catalog, MeshAgent, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(20);
const ZONE: &str = "zone-d";

/// payments at `addresses` (port 8080), idle without any endpoint.
fn spec(addresses: &[&str]) -> MeshSpec {
    MeshSpec {
        clusters: vec![
            ClusterSpec::new(
                "payments",
                addresses
                    .iter()
                    .map(|a| EndpointSpec::new(a, 8080))
                    .collect(),
            ),
            ClusterSpec::new("idle", Vec::new()),
        ],
        listeners: Vec::new(),
    }
}

/// An agent for `envoy` as `instance` of `cluster`, reading its log.
async fn agent(catalog: &Catalog, envoy: &XdsEnvoy, cluster: &str, instance: &str) -> MeshAgent {
    MeshAgent::start(&envoy.agent_args(catalog.agent_args(), (ZONE, cluster, instance)))
        .await
        .unwrap()
}

/// Waits until `instance` of `cluster` is listed in `state` by `GET /sync`.
async fn wait_state(catalog: &Catalog, cluster: &str, instance: &str, state: &str) {
    wait_for(&format!("{instance} {state}"), DEADLINE, || async {
        let (status, body) = catalog
            .get(&format!("/sync?zoneName={ZONE}&clusterName={cluster}"))
            .await
            .ok()?;
        assert_eq!(status, 200, "{body}");
        body["proxies"]
            .as_array()?
            .iter()
            .any(|p| p["instance"] == instance && p["state"] == state)
            .then_some(())
    })
    .await
    .unwrap();
}

/// The diagnosis of `cluster`, whose first step is `control_server`.
async fn diagnose(catalog: &Catalog, cluster: &str) -> Value {
    let (status, report) = catalog
        .get(&format!(
            "/diagnose/{cluster}?zoneName={ZONE}&symptom=no_healthy_upstream"
        ))
        .await
        .unwrap();
    assert_eq!(status, 200, "{report:#}");
    assert_eq!(report["steps"][0]["name"], "control_server", "{report:#}");
    report
}

fn control_step(report: &Value) -> &Value {
    &report["steps"][0]
}

fn conclusion(report: &Value) -> &str {
    report["conclusion"].as_str().unwrap_or("")
}

/// Asserts that the conclusion holds every one of `parts`.
fn assert_concludes(report: &Value, parts: &[&str]) {
    let text = conclusion(report);
    for part in parts {
        assert!(text.contains(part), "{part:?} not in {text:?}\n{report:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_diagnosis_names_the_control_server_or_the_sidecar_at_fault() {
    let server = ControlServer::start("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    server.set(spec(&["10.0.1.1", "10.0.1.2"]));
    let catalog = Catalog::start(|c| c.sync.grace = Duration::from_secs(1))
        .await
        .unwrap();
    catalog
        .register_zone_at(ZONE, server.local_addr(), "edge")
        .await
        .unwrap();
    for cluster in ["edge", "payments", "ghost", "idle"] {
        catalog
            .register_cluster(ZONE, cluster, json!({"owner": format!("team-{cluster}")}))
            .await
            .unwrap();
    }
    let edge_boot = XdsBootstrap::new("edge-0", "edge", server.local_addr());
    let payments_boot = XdsBootstrap::new("payments-0", "payments", server.local_addr());
    let (edge, payments) =
        tokio::join!(XdsEnvoy::start(&edge_boot), XdsEnvoy::start(&payments_boot));
    let (edge, payments) = (edge.unwrap(), payments.unwrap());
    let _agents = tokio::join!(
        agent(&catalog, &edge, "edge", "edge-0"),
        agent(&catalog, &payments, "payments", "payments-0"),
    );
    wait_state(&catalog, "edge", "edge-0", "synced").await;
    wait_state(&catalog, "payments", "payments-0", "synced").await;

    // A registered cluster the control server does not declare: its fault.
    let ghost = diagnose(&catalog, "ghost").await;
    assert_eq!(control_step(&ghost)["verdict"], "fail", "{ghost:#}");
    assert_eq!(ghost["rootCause"]["step"], "control_server", "{ghost:#}");
    assert_concludes(
        &ghost,
        &[
            "control_server failed: the control server at ",
            "does not declare ghost",
            "The fault is in the control server (owner platform).",
        ],
    );
    // Declared without an endpoint: its fault too.
    let idle = diagnose(&catalog, "idle").await;
    assert_concludes(
        &idle,
        &["declares idle without any endpoint", "(owner platform)"],
    );

    // Declared with healthy endpoints, both sidecars synced.
    let ok = diagnose(&catalog, "payments").await;
    let step = control_step(&ok);
    assert_eq!(step["verdict"], "pass", "{ok:#}");
    let evidence = step["evidence"].to_string();
    for part in [
        "control server declares payments: 2 endpoints, 2 healthy: 10.0.1.1:8080 HEALTHY, 10.0.1.2:8080 HEALTHY",
        "the edge sidecar edge-0 of cluster edge (owner team-edge): synced since ",
        "the service sidecar payments-0 of cluster payments (owner team-payments): synced since ",
    ] {
        assert!(evidence.contains(part), "{part:?}: {ok:#}");
    }

    // The edge held on the old snapshot while payments moves from 10.0.1.1 to
    // 10.0.1.3: the edge sidecar's fault, with its owner and since when.
    server.hold("edge-0");
    server.set(spec(&["10.0.1.2", "10.0.1.3"]));
    wait_state(&catalog, "edge", "edge-0", "stale").await;
    let stale = diagnose(&catalog, "payments").await;
    assert_eq!(control_step(&stale)["verdict"], "fail", "{stale:#}");
    assert_concludes(
        &stale,
        &[
            "control_server failed: the edge sidecar edge-0 of cluster edge is stale: its view of payments differs from the control server's since 20",
            "before the diagnosis): it lacks 10.0.1.3:8080, it still has 10.0.1.1:8080",
            "The fault is in that sidecar (owner team-edge), not in the control server.",
        ],
    );
    server.release("edge-0");
    wait_state(&catalog, "edge", "edge-0", "synced").await;

    // payments' own sidecar held while 10.0.1.4 joins: that sidecar's fault, with
    // payments' owner.
    server.hold("payments-0");
    server.set(spec(&["10.0.1.2", "10.0.1.3", "10.0.1.4"]));
    wait_state(&catalog, "payments", "payments-0", "stale").await;
    wait_state(&catalog, "edge", "edge-0", "synced").await;
    let own = diagnose(&catalog, "payments").await;
    assert_concludes(
        &own,
        &[
            "control_server failed: the service sidecar payments-0 of cluster payments is stale: its upstream payments differs from the control server's since 20",
            "it lacks 10.0.1.4:8080",
            "The fault is in that sidecar (owner team-payments), not in the control server.",
        ],
    );
    server.release("payments-0");
}
