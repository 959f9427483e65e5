//! The test control server (meshcat-control-server) with two real Envoy sidecars
//! over ADS: both get the clusters and endpoints, a new snapshot reaches both, a held
//! node keeps its old hosts until released, a spec of its own with a zero connect
//! timeout makes one Envoy NACK, and stopping the server disconnects both until it
//! is restarted. An Envoy over Delta xDS gets the same: only what changed, a removed
//! cluster, hold and release, a NACK with its reason.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use meshcat_control_server::{
    ClusterSpec, ControlServer, EndpointSpec, ListenerSpec, MeshSpec, NodeState, RouteSpec,
    type_url,
};
use meshcat_tests::wait_for;
use meshcat_tests::xds::{XdsBootstrap, XdsEnvoy};

const WAIT: Duration = Duration::from_secs(10);

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Cluster `orders` at `ports`, `users` at one endpoint, and listener `edge` routing
/// `/` to `orders`.
fn mesh(ports: &[u16]) -> MeshSpec {
    MeshSpec {
        clusters: vec![
            ClusterSpec::new(
                "orders",
                ports.iter().map(|p| EndpointSpec::from(addr(*p))).collect(),
            ),
            ClusterSpec::new("users", vec![EndpointSpec::new("127.0.0.1", 9101)]),
        ],
        listeners: vec![ListenerSpec {
            name: "edge".to_owned(),
            address: "127.0.0.1".to_owned(),
            port: 0,
            route_config: "edge-routes".to_owned(),
            routes: vec![RouteSpec::new("/", "orders")],
        }],
    }
}

fn set_of(ports: &[u16]) -> BTreeSet<SocketAddr> {
    ports.iter().map(|p| addr(*p)).collect()
}

/// Waits until `envoy` lists exactly `ports` as the hosts of `orders`.
async fn wait_hosts(envoy: &XdsEnvoy, ports: &[u16]) -> anyhow::Result<()> {
    let want = set_of(ports);
    let what = format!("{} to have orders hosts {want:?}", envoy.node_id);
    wait_for(&what, WAIT, || async {
        (envoy.hosts("orders").await.ok()? == want).then_some(())
    })
    .await
}

/// Whether `node` is connected and ACKed `version` of `type_url`.
fn acked(nodes: &[NodeState], node: &str, type_url: &str, version: &str) -> bool {
    nodes
        .iter()
        .any(|n| n.id == node && n.acked(type_url) == version)
}

/// Whether `node` is connected and ACKed `version` for every type.
fn acked_all(nodes: &[NodeState], node: &str, version: &str) -> bool {
    nodes
        .iter()
        .any(|n| n.id == node && type_url::ALL.iter().all(|t| n.acked(t) == version))
}

async fn wait_connected(envoy: &XdsEnvoy, up: bool) -> anyhow::Result<()> {
    let what = format!("{} connected_state {}", envoy.node_id, u8::from(up));
    wait_for(&what, WAIT, || async {
        (envoy.connected().await.ok()? == up).then_some(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_follow_the_control_server() -> anyhow::Result<()> {
    let server = ControlServer::start(addr(0), None).await?;
    assert_eq!(server.set(mesh(&[9001])), "1");
    let xds = server.local_addr();
    let (boot_a, boot_b) = (
        XdsBootstrap::new("sidecar-a", "edge", xds),
        XdsBootstrap::new("sidecar-b", "edge", xds),
    );
    let (a, b) = tokio::try_join!(XdsEnvoy::start(&boot_a), XdsEnvoy::start(&boot_b))?;

    // Both get every type (CDS, EDS, LDS, RDS) and list the EDS hosts.
    server
        .wait_until(
            |n| acked_all(n, "sidecar-a", "1") && acked_all(n, "sidecar-b", "1"),
            WAIT,
        )
        .await?;
    wait_hosts(&a, &[9001]).await?;
    wait_hosts(&b, &[9001]).await?;
    assert_eq!(
        b.hosts("users").await?,
        set_of(&[9101]),
        "every EDS cluster's hosts"
    );
    let node_a = server.node("sidecar-a").expect("sidecar-a connected");
    assert_eq!(node_a.cluster, "edge");
    assert_eq!(
        node_a
            .get(type_url::ENDPOINT)
            .map(|t| t.resource_names.len()),
        Some(2),
        "EDS asks for both clusters: {node_a:?}"
    );

    // A new endpoint reaches both; only EDS changed, so only EDS is sent again.
    assert_eq!(server.set(mesh(&[9001, 9002])), "2");
    wait_hosts(&a, &[9001, 9002]).await?;
    wait_hosts(&b, &[9001, 9002]).await?;
    server
        .wait_until(
            |n| {
                n.iter()
                    .filter(|n| n.acked(type_url::ENDPOINT) == "2")
                    .count()
                    == 2
            },
            WAIT,
        )
        .await?;
    for n in server.nodes() {
        assert_eq!(n.sent(type_url::CLUSTER), "1", "CDS unchanged: {n:?}");
    }

    // A held node keeps the hosts it has while the other gets the new ones.
    server.hold("sidecar-b");
    assert_eq!(server.set(mesh(&[9001, 9002, 9003])), "3");
    wait_hosts(&a, &[9001, 9002, 9003]).await?;
    server
        .wait_until(|n| acked(n, "sidecar-a", type_url::ENDPOINT, "3"), WAIT)
        .await?;
    let held = server.node("sidecar-b").expect("sidecar-b connected");
    assert!(held.held);
    assert_eq!(held.sent(type_url::ENDPOINT), "2", "{held:?}");
    assert_eq!(b.hosts("orders").await?, set_of(&[9001, 9002]));

    // Released, it catches up at once.
    server.release("sidecar-b");
    wait_hosts(&b, &[9001, 9002, 9003]).await?;
    server
        .wait_until(|n| acked(n, "sidecar-b", type_url::ENDPOINT, "3"), WAIT)
        .await?;

    // A spec of its own with a zero connect timeout: that Envoy rejects the cluster.
    let mut bad = mesh(&[9001, 9002, 9003]);
    bad.clusters[0].connect_timeout_ms = 0;
    server.override_for("sidecar-b", Some(bad));
    server
        .wait_until(
            |n| {
                n.iter()
                    .any(|n| n.id == "sidecar-b" && n.last_nack(type_url::CLUSTER).is_some())
            },
            WAIT,
        )
        .await?;
    let nacked = server.node("sidecar-b").expect("sidecar-b connected");
    let detail = nacked.last_nack(type_url::CLUSTER).unwrap_or_default();
    assert!(detail.contains("ConnectTimeout"), "{detail}");
    assert!(nacked.get(type_url::CLUSTER).is_some_and(|t| t.nacked));
    assert_eq!(nacked.acked(type_url::CLUSTER), "1");
    wait_for("sidecar-b's CDS update_rejected to move", WAIT, || async {
        (b.stat("cluster_manager.cds.update_rejected").await.ok()?? >= 1).then_some(())
    })
    .await?;
    wait_for(
        "sidecar-b's log to say the update was rejected",
        WAIT,
        || async { b.log().contains("rejected").then_some(()) },
    )
    .await?;
    assert_eq!(
        b.hosts("orders").await?,
        set_of(&[9001, 9002, 9003]),
        "the last good view stays"
    );
    let a_state = server.node("sidecar-a").expect("sidecar-a connected");
    assert_eq!(a_state.last_nack(type_url::CLUSTER), None, "{a_state:?}");
    assert_eq!(
        a.stat("cluster_manager.cds.update_rejected").await?,
        Some(0)
    );

    // Back on the shared snapshot, it ACKs again.
    server.override_for("sidecar-b", None);
    server
        .wait_until(
            |n| {
                n.iter().any(|n| {
                    n.id == "sidecar-b"
                        && n.sent(type_url::CLUSTER) == "3"
                        && n.get(type_url::CLUSTER).is_some_and(|t| !t.nacked)
                })
            },
            WAIT,
        )
        .await?;

    // Stopped, both lose their control plane; restarted, both come back.
    server.stop().await;
    tokio::try_join!(wait_connected(&a, false), wait_connected(&b, false))?;
    assert!(server.nodes().is_empty(), "{:?}", server.nodes());
    server.restart().await?;
    assert_eq!(server.local_addr(), xds);
    tokio::try_join!(wait_connected(&a, true), wait_connected(&b, true))?;
    server
        .wait_until(
            |n| acked_all(n, "sidecar-a", "3") && acked_all(n, "sidecar-b", "3"),
            WAIT,
        )
        .await?;
    assert!(a.is_running() && b.is_running());
    Ok(())
}

/// Whether `envoy` has a cluster named `name` (`/clusters` lists its settings even
/// without hosts).
async fn has_cluster(envoy: &XdsEnvoy, name: &str) -> bool {
    envoy
        .admin_get("/clusters")
        .await
        .is_ok_and(|t| t.lines().any(|l| l.split("::").next() == Some(name)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_over_delta_xds_follows_the_control_server() -> anyhow::Result<()> {
    let server = ControlServer::start(addr(0), None).await?;
    server.set(mesh(&[9001]));
    let boot = XdsBootstrap {
        delta: true,
        ..XdsBootstrap::new("sidecar-d", "edge", server.local_addr())
    };
    let envoy = XdsEnvoy::start(&boot).await?;
    wait_hosts(&envoy, &[9001]).await?;
    assert_eq!(envoy.hosts("users").await?, set_of(&[9101]));
    let node = server.node("sidecar-d").expect("sidecar-d connected");
    assert!(node.delta, "{node:?}");

    // A new endpoint, then a cluster removed: only what changed is sent, and the
    // removal reaches the sidecar.
    server.set(mesh(&[9001, 9002]));
    wait_hosts(&envoy, &[9001, 9002]).await?;
    let mut without_users = mesh(&[9001, 9002]);
    without_users.clusters.retain(|c| c.name != "users");
    server.set(without_users);
    wait_for("users removed from sidecar-d", WAIT, || async {
        (!has_cluster(&envoy, "users").await).then_some(())
    })
    .await?;
    assert!(has_cluster(&envoy, "orders").await);

    // Held, it keeps its hosts; released, it catches up.
    server.hold("sidecar-d");
    server.set(mesh(&[9001, 9002, 9003]));
    server
        .wait_until(|n| n.iter().any(|n| n.id == "sidecar-d" && n.held), WAIT)
        .await?;
    assert_eq!(envoy.hosts("orders").await?, set_of(&[9001, 9002]));
    server.release("sidecar-d");
    wait_hosts(&envoy, &[9001, 9002, 9003]).await?;
    // CDS and EDS are separate responses: users may come after orders' hosts.
    wait_for("users declared again on sidecar-d", WAIT, || async {
        has_cluster(&envoy, "users").await.then_some(())
    })
    .await?;

    // A cluster it cannot take: NACKed over Delta with Envoy's reason.
    let mut bad = mesh(&[9001, 9002, 9003]);
    bad.clusters[0].connect_timeout_ms = 0;
    server.override_for("sidecar-d", Some(bad));
    server
        .wait_until(
            |n| {
                n.iter()
                    .any(|n| n.id == "sidecar-d" && n.last_nack(type_url::CLUSTER).is_some())
            },
            WAIT,
        )
        .await?;
    let nacked = server.node("sidecar-d").expect("sidecar-d connected");
    let detail = nacked.last_nack(type_url::CLUSTER).unwrap_or_default();
    assert!(detail.contains("ConnectTimeout"), "{detail}");
    assert_eq!(
        envoy.hosts("orders").await?,
        set_of(&[9001, 9002, 9003]),
        "the last good view stays"
    );
    Ok(())
}
