//! The aggregator's xDS client (`control`) against a real ADS server on port 0
//! (`meshcat-control-server`): the view fills and follows the server over Delta xDS
//! and over state of the world (a server with Delta turned off, which the client
//! falls back to), the state follows the connection (stop, restart, mTLS, a wrong
//! CA), a view over a bound is NACKed with its reason while the last good view is
//! kept, a zone moved to another server takes that server's view, and removing a
//! zone closes its stream.

use std::alloc::System;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use meshcat_aggregator::control::{
    ControlChange, ControlConfig, ControlState, ControlStatus, Controls, ZoneView,
};
use meshcat_common::model::ZoneRecord;
use meshcat_common::wire::hosts_digest;
use meshcat_control_server::{
    ClusterSpec, ControlServer, EndpointSpec, Health, ListenerSpec, MeshSpec, RouteSpec,
    ServerOptions, ServerTls, type_url,
};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use tokio::sync::broadcast;

/// Counts the bytes allocated, to weigh a view.
#[global_allocator]
static ALLOC: cap::Cap<System> = cap::Cap::new(System, usize::MAX);

/// How long any one wait may take before the test fails.
const WAIT: Duration = Duration::from_secs(20);

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn controls(config: ControlConfig) -> (Controls, prometheus::Registry) {
    let registry = prometheus::Registry::new();
    let controls = Controls::new(config, &registry).unwrap();
    (controls, registry)
}

/// A control server on port 0, with Delta xDS or without.
async fn server(delta: bool) -> ControlServer {
    ControlServer::start_with(local(), None, ServerOptions { delta })
        .await
        .unwrap()
}

/// The protocol the client speaks to a server with Delta xDS or without.
fn protocol(delta: bool) -> &'static str {
    if delta { "delta" } else { "sotw" }
}

fn config() -> ControlConfig {
    ControlConfig {
        replica: "r1".into(),
        ..ControlConfig::default()
    }
}

fn zone(name: &str, server: &ControlServer) -> ZoneRecord {
    ZoneRecord::new(name, &server.local_addr().to_string())
}

/// A cluster's endpoints: address, port, health.
type Endpoints<'a> = &'a [(&'a str, u16, Health)];

fn mesh(clusters: &[(&str, Endpoints<'_>)]) -> MeshSpec {
    MeshSpec {
        clusters: clusters
            .iter()
            .map(|(name, eps)| {
                ClusterSpec::new(
                    name,
                    eps.iter()
                        .map(|(ip, port, h)| EndpointSpec::new(ip, *port).with_health(*h))
                        .collect(),
                )
            })
            .collect(),
        listeners: Vec::new(),
    }
}

/// Waits until the zone's status satisfies `f`, looking again on every change of the
/// component (and every 100 ms, since an error's words may change within a state).
async fn wait_status(
    controls: &Controls,
    zone: &str,
    what: &str,
    f: impl Fn(&ControlStatus) -> bool,
) -> ControlStatus {
    let mut changes = controls.subscribe();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let status = controls.status(zone);
        if let Some(s) = status.as_ref().filter(|s| f(s)) {
            return s.clone();
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("zone {zone}: not {what} within {WAIT:?}; status: {status:?}");
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), changes.recv()).await;
    }
}

/// Waits for a `View` change of `zone` after which the view satisfies `f`.
async fn wait_view(
    controls: &Controls,
    changes: &mut broadcast::Receiver<ControlChange>,
    zone: &str,
    what: &str,
    f: impl Fn(&ZoneView) -> bool,
) -> std::sync::Arc<ZoneView> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = controls.view(zone).filter(|v| f(v)) {
            return v;
        }
        match tokio::time::timeout_at(deadline, changes.recv()).await {
            Ok(Ok(_) | Err(broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(broadcast::error::RecvError::Closed)) => panic!("the change feed closed"),
            Err(_) => panic!(
                "zone {zone}: the view never showed {what} within {WAIT:?}; view: {:?}",
                controls.view(zone)
            ),
        }
    }
}

fn connected(s: &ControlStatus) -> bool {
    s.state == ControlState::Connected
}

/// The value of the series of `name` with these labels, if the registry has it.
fn metric(registry: &prometheus::Registry, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn the_view_fills_and_follows_the_servers_snapshot_over_delta() {
    view_fills_and_follows(true).await;
}

#[tokio::test]
async fn the_view_fills_and_follows_the_servers_snapshot_over_sotw() {
    view_fills_and_follows(false).await;
}

async fn view_fills_and_follows(delta: bool) {
    let server = server(delta).await;
    let mut spec = mesh(&[
        (
            "orders",
            &[
                ("10.0.0.1", 8080, Health::Healthy),
                ("10.0.0.2", 8080, Health::Unhealthy),
            ],
        ),
        ("payments", &[("10.0.1.1", 9090, Health::Unknown)]),
    ]);
    spec.listeners.push(ListenerSpec {
        name: "ingress".into(),
        address: "127.0.0.1".into(),
        port: 10000,
        route_config: "ingress-routes".into(),
        routes: vec![RouteSpec::new("/", "orders")],
    });
    let version = server.set(spec.clone());
    let (controls, registry) = controls(config());
    let mut changes = controls.subscribe();
    controls.set_zone(&zone("z1", &server));

    let status = wait_status(&controls, "z1", "connected with the whole snapshot", |s| {
        connected(s)
            && s.versions.clusters == version
            && s.versions.endpoints == version
            && s.versions.listeners == version
            && s.versions.routes == version
    })
    .await;
    assert_eq!(status.server_address, server.local_addr().to_string());
    assert_eq!(status.protocol, protocol(delta));
    assert_eq!(status.error, "");
    assert!(status.connected_since_ms.is_some());
    assert!(status.last_update_ms.is_some());
    assert_eq!(
        (
            status.clusters,
            status.endpoints,
            status.listeners,
            status.routes
        ),
        (2, 3, 1, 1)
    );
    let view = controls.view("z1").unwrap();
    let orders = &view.clusters["orders"];
    let addresses: Vec<&str> = orders.endpoints().map(|e| e.address).collect();
    assert_eq!(addresses, ["10.0.0.1:8080", "10.0.0.2:8080"]);
    assert_eq!(orders.endpoints().next().unwrap().health, "HEALTHY");
    assert_eq!(orders.endpoints().nth(1).unwrap().health, "UNHEALTHY");
    assert!(
        orders.endpoints().next().unwrap().healthy && !orders.endpoints().nth(1).unwrap().healthy
    );
    assert_eq!(orders.healthy, 1);
    assert_eq!(orders.digest, hosts_digest(addresses.iter().copied()));
    assert_eq!(
        view.clusters["payments"].endpoints().next().unwrap().health,
        "UNKNOWN"
    );
    assert_eq!(view.clusters["payments"].healthy, 1);

    // What the server saw: meshcat's node, every type ACKed.
    server
        .wait_until(
            |nodes| {
                nodes.iter().any(|n| {
                    n.id == "meshcat~z1~r1"
                        && n.cluster == "meshcat"
                        && n.delta == delta
                        && type_url::ALL.iter().all(|t| n.acked(t) == version)
                })
            },
            WAIT,
        )
        .await
        .unwrap();
    assert_eq!(
        metric(
            &registry,
            "meshcat_control_plane_connected",
            &[("zone", "z1")]
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &registry,
            "meshcat_control_plane_resources",
            &[("zone", "z1"), ("type", "endpoints")]
        ),
        Some(3.0)
    );

    // A new endpoint shows; the old ones keep their first-seen time, and the old
    // set is remembered; the other cluster is as it was.
    let payments = view.clusters["payments"].clone();
    let first_seen = orders.endpoints().next().unwrap().first_seen_ms;
    let old_digest = orders.digest;
    spec.clusters[0]
        .endpoints
        .push(EndpointSpec::new("10.0.0.3", 8080));
    let version = server.set(spec);
    let view = wait_view(
        &controls,
        &mut changes,
        "z1",
        "a third orders endpoint",
        |v| v.clusters["orders"].len() == 3,
    )
    .await;
    let orders = &view.clusters["orders"];
    assert_eq!(orders.endpoints().nth(2).unwrap().address, "10.0.0.3:8080");
    assert_eq!(orders.endpoints().next().unwrap().first_seen_ms, first_seen);
    assert_eq!(orders.previous.first().map(|p| p.0), Some(old_digest));
    assert_eq!(view.clusters["payments"], payments);
    let status = wait_status(&controls, "z1", "at the new endpoints version", |s| {
        s.versions.endpoints == version
    })
    .await;
    assert_eq!(status.endpoints, 4);

    // A cluster the server stops declaring is remembered as removed.
    let version = server.set(mesh(&[("orders", &[("10.0.0.1", 8080, Health::Healthy)])]));
    let view = wait_view(&controls, &mut changes, "z1", "payments removed", |v| {
        !v.clusters.contains_key("payments")
    })
    .await;
    assert!(view.removed.contains_key("payments"));
    let status = wait_status(&controls, "z1", "at the last version", |s| {
        s.versions.clusters == version && s.listeners == 0 && s.routes == 0
    })
    .await;
    assert_eq!((status.clusters, status.endpoints), (1, 1));
    assert_eq!(status.protocol, protocol(delta));
    // The endpoints of the cluster removed are no longer asked for.
    server
        .wait_until(
            |nodes| {
                nodes.iter().any(|n| {
                    n.id == "meshcat~z1~r1"
                        && n.get(type_url::ENDPOINT)
                            .is_some_and(|t| t.resource_names == ["orders"])
                })
            },
            WAIT,
        )
        .await
        .unwrap();
    controls.remove_zone("z1");
    server.stop().await;
}

#[tokio::test]
async fn a_stopped_server_is_unreachable_then_connected_again() {
    let server = ControlServer::start(local(), None).await.unwrap();
    let orders: Endpoints<'_> = &[("10.0.0.1", 8080, Health::Healthy)];
    let payments: Endpoints<'_> = &[("10.0.1.1", 9090, Health::Healthy)];
    server.set(mesh(&[("orders", orders), ("payments", payments)]));
    let (controls, registry) = controls(config());
    controls.set_zone(&zone("z1", &server));
    let status = wait_status(&controls, "z1", "connected with two clusters", |s| {
        connected(s) && s.endpoints == 2
    })
    .await;
    assert_eq!(status.protocol, "delta");

    server.stop().await;
    let status = wait_status(&controls, "z1", "unreachable, connection refused", |s| {
        s.state == ControlState::Unreachable && s.error.contains("connection refused")
    })
    .await;
    assert_eq!(status.connected_since_ms, None);
    assert_eq!(status.protocol, "");
    // The last good view is still served.
    assert_eq!(status.endpoints, 2);
    assert_eq!(controls.view("z1").unwrap().clusters.len(), 2);
    assert_eq!(
        metric(
            &registry,
            "meshcat_control_plane_connected",
            &[("zone", "z1")]
        ),
        Some(0.0)
    );

    // Meanwhile a cluster goes and an endpoint changes: the stream, telling the
    // server what it holds, gets both once it is back.
    let version = server.set(mesh(&[("orders", &[("10.0.0.2", 8080, Health::Healthy)])]));
    server.restart().await.unwrap();
    let status = wait_status(&controls, "z1", "connected again, up to date", |s| {
        connected(s) && s.versions.clusters == version && s.versions.endpoints == version
    })
    .await;
    assert_eq!(status.error, "");
    assert_eq!(status.protocol, "delta");
    assert!(status.connected_since_ms.is_some());
    let view = controls.view("z1").unwrap();
    assert_eq!(
        view.clusters.keys().map(|k| &**k).collect::<Vec<_>>(),
        ["orders"]
    );
    assert_eq!(
        view.clusters["orders"].endpoints().next().unwrap().address,
        "10.0.0.2:8080"
    );
    assert!(view.removed.contains_key("payments"));
    controls.remove_zone("z1");
    server.stop().await;
}

#[tokio::test]
async fn a_server_without_delta_is_spoken_to_in_state_of_the_world() {
    let server = server(false).await;
    server.set(mesh(&[("orders", &[("10.0.0.1", 8080, Health::Healthy)])]));
    let (controls, _registry) = controls(config());
    let mut changes = controls.subscribe();
    controls.set_zone(&zone("z1", &server));
    let status = wait_status(&controls, "z1", "connected with a cluster", |s| {
        connected(s) && s.endpoints == 1
    })
    .await;
    assert_eq!(status.protocol, "sotw");
    assert_eq!(status.error, "");
    server
        .wait_until(
            |nodes| {
                nodes.iter().any(|n| {
                    n.id == "meshcat~z1~r1" && !n.delta && n.acked(type_url::CLUSTER) == "1"
                })
            },
            WAIT,
        )
        .await
        .unwrap();
    let version = server.set(mesh(&[(
        "orders",
        &[
            ("10.0.0.1", 8080, Health::Healthy),
            ("10.0.0.2", 8080, Health::Healthy),
        ],
    )]));
    wait_view(&controls, &mut changes, "z1", "a second endpoint", |v| {
        v.endpoint_count() == 2
    })
    .await;
    wait_status(&controls, "z1", "at the new version", |s| {
        s.versions.endpoints == version
    })
    .await;

    // The choice holds over a reconnect, even once the server offers Delta.
    server.set_delta(true);
    server.stop().await;
    wait_status(&controls, "z1", "unreachable", |s| {
        s.state == ControlState::Unreachable
    })
    .await;
    server.restart().await.unwrap();
    let status = wait_status(&controls, "z1", "connected again", connected).await;
    assert_eq!(status.protocol, "sotw");

    // A replaced zone record tries Delta again.
    let record = ZoneRecord {
        request_cluster: "edge".into(),
        ..zone("z1", &server)
    };
    controls.set_zone(&record);
    let status = wait_status(&controls, "z1", "connected over Delta", |s| {
        connected(s) && s.protocol == "delta" && s.endpoints == 2
    })
    .await;
    assert_eq!(status.error, "");
    controls.remove_zone("z1");
    server.stop().await;
}

#[tokio::test]
async fn a_zone_moved_to_another_server_takes_that_servers_view() {
    let first = server(true).await;
    first.set(mesh(&[
        ("orders", &[("10.0.0.1", 8080, Health::Healthy)]),
        ("payments", &[("10.0.1.1", 9090, Health::Healthy)]),
    ]));
    let second = server(true).await;
    second.set(mesh(&[
        (
            "orders",
            &[
                ("10.0.0.1", 8080, Health::Healthy),
                ("10.0.0.3", 8080, Health::Healthy),
            ],
        ),
        ("ledger", &[("10.0.2.1", 7070, Health::Healthy)]),
    ]));
    let (controls, _registry) = controls(config());
    let mut changes = controls.subscribe();
    controls.set_zone(&zone("z1", &first));
    wait_status(&controls, "z1", "connected to the first server", |s| {
        connected(s) && s.clusters == 2 && s.endpoints == 2
    })
    .await;

    controls.set_zone(&zone("z1", &second));
    let view = wait_view(
        &controls,
        &mut changes,
        "z1",
        "the second server's view",
        |v| v.clusters.keys().map(|k| &**k).eq(["ledger", "orders"]) && v.endpoint_count() == 3,
    )
    .await;
    assert!(view.removed.contains_key("payments"));
    assert_eq!(view.clusters["orders"].len(), 2);
    let status = wait_status(&controls, "z1", "connected to the second server", connected).await;
    assert_eq!(status.protocol, "delta");
    controls.remove_zone("z1");
    first.stop().await;
    second.stop().await;
}

/// A CA with its PEM file, to sign server and client certificates.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    file: PathBuf,
}

impl Ca {
    fn new(dir: &Path, name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        let cert = params.self_signed(&key).unwrap();
        let file = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&file, cert.pem()).unwrap();
        Ca {
            issuer: Issuer::new(params, key),
            file,
        }
    }

    /// A certificate for localhost and 127.0.0.1: (cert PEM, key PEM).
    fn leaf(&self) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![
            SanType::DnsName("localhost".try_into().unwrap()),
            SanType::IpAddress([127, 0, 0, 1].into()),
        ];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn pem(&self) -> Vec<u8> {
        std::fs::read(&self.file).unwrap()
    }
}

#[tokio::test]
async fn mtls_with_the_zones_files_connects_and_a_wrong_ca_is_a_tls_error() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "mesh");
    let (server_cert, server_key) = ca.leaf();
    let server = ControlServer::start(
        local(),
        Some(ServerTls {
            cert_pem: server_cert.into_bytes(),
            key_pem: server_key.into_bytes(),
            client_ca_pem: Some(ca.pem()),
        }),
    )
    .await
    .unwrap();
    server.set(mesh(&[("orders", &[("10.0.0.1", 8080, Health::Healthy)])]));
    let (client_cert, client_key) = ca.leaf();
    let cert_file = dir.path().join("client.pem");
    let key_file = dir.path().join("client-key.pem");
    std::fs::write(&cert_file, client_cert).unwrap();
    std::fs::write(&key_file, client_key).unwrap();
    let record = |name: &str, ca_file: &Path| ZoneRecord {
        use_tls: true,
        ca_path: ca_file.display().to_string(),
        cert_path: cert_file.display().to_string(),
        key_path: key_file.display().to_string(),
        ..zone(name, &server)
    };

    let (controls, _registry) = controls(config());
    controls.set_zone(&record("good", &ca.file));
    let status = wait_status(&controls, "good", "connected over mTLS", |s| {
        connected(s) && s.clusters == 1 && s.endpoints == 1
    })
    .await;
    assert!(status.connected_since_ms.is_some());

    let other = Ca::new(dir.path(), "other");
    controls.set_zone(&record("wrong", &other.file));
    let status = wait_status(&controls, "wrong", "a TLS error", |s| {
        s.state == ControlState::TlsError
    })
    .await;
    assert!(
        status.error.contains("UnknownIssuer"),
        "the error names the certificate problem: {}",
        status.error
    );
    assert!(controls.view("wrong").is_none());

    let missing = dir.path().join("missing.pem");
    controls.set_zone(&record("missing", &missing));
    let status = wait_status(&controls, "missing", "a TLS error", |s| {
        s.state == ControlState::TlsError
    })
    .await;
    assert!(status.error.contains("caPath"), "{}", status.error);

    // Fixing the zone's CA reconnects it.
    controls.set_zone(&record("wrong", &ca.file));
    wait_status(
        &controls,
        "wrong",
        "connected once its CA is right",
        connected,
    )
    .await;
    for z in ["good", "wrong", "missing"] {
        controls.remove_zone(z);
    }
    server.stop().await;
}

#[tokio::test]
async fn a_view_over_the_bound_is_nacked_and_the_last_good_view_kept_over_delta() {
    view_over_the_bound(true).await;
}

#[tokio::test]
async fn a_view_over_the_bound_is_nacked_and_the_last_good_view_kept_over_sotw() {
    view_over_the_bound(false).await;
}

async fn view_over_the_bound(delta: bool) {
    let server = server(delta).await;
    let good = server.set(mesh(&[("a", &[("10.0.0.1", 80, Health::Healthy)])]));
    let (controls, registry) = controls(ControlConfig {
        max_clusters: 2,
        ..config()
    });
    controls.set_zone(&zone("z1", &server));
    wait_status(&controls, "z1", "connected with one cluster", |s| {
        connected(s) && s.clusters == 1 && s.endpoints == 1
    })
    .await;

    let empty: Endpoints<'_> = &[];
    let a: Endpoints<'_> = &[("10.0.0.1", 80, Health::Healthy)];
    let bad = server.set(mesh(&[("a", a), ("b", empty), ("c", empty)]));
    server
        .wait_until(
            |nodes| {
                nodes.iter().any(|n| {
                    n.id == "meshcat~z1~r1" && n.get(type_url::CLUSTER).is_some_and(|t| t.nacked)
                })
            },
            WAIT,
        )
        .await
        .unwrap();
    let node = server.node("meshcat~z1~r1").unwrap();
    let reason = node.last_nack(type_url::CLUSTER).unwrap();
    assert!(
        reason.contains("3 clusters, over the bound of 2"),
        "{reason}"
    );
    assert_eq!(node.acked(type_url::CLUSTER), good);

    let status = wait_status(&controls, "z1", "rejected", |s| {
        s.state == ControlState::Rejected
    })
    .await;
    assert!(status.error.contains("over the bound"), "{}", status.error);
    assert!(
        status.error.contains(&format!("{bad:?}")),
        "{}",
        status.error
    );
    assert_eq!(status.versions.clusters, good);
    assert_eq!(status.protocol, protocol(delta));
    let view = controls.view("z1").unwrap();
    assert_eq!(view.clusters.len(), 1);
    assert_eq!(view.clusters["a"].len(), 1);
    assert_eq!(
        metric(
            &registry,
            "meshcat_control_plane_responses_total",
            &[("zone", "z1"), ("type", "clusters"), ("result", "nack")]
        ),
        Some(1.0)
    );

    // A later response within the bound is accepted again.
    let fixed = server.set(mesh(&[("a", empty), ("b", empty)]));
    let status = wait_status(&controls, "z1", "connected at the fixed version", |s| {
        connected(s) && s.versions.clusters == fixed && s.versions.endpoints == fixed
    })
    .await;
    assert_eq!((status.clusters, status.endpoints), (2, 0));
    let view = controls.view("z1").unwrap();
    assert!(
        view.clusters.keys().map(|k| &**k).eq(["a", "b"]),
        "{view:?}"
    );
    assert!(view.removed.is_empty(), "{view:?}");
    controls.remove_zone("z1");
    server.stop().await;
}

#[tokio::test]
async fn removing_a_zone_closes_its_stream() {
    let server = ControlServer::start(local(), None).await.unwrap();
    server.set(mesh(&[("a", &[("10.0.0.1", 80, Health::Healthy)])]));
    let (controls, registry) = controls(config());
    controls.set_zone(&zone("z1", &server));
    wait_status(&controls, "z1", "connected", connected).await;
    server
        .wait_until(|nodes| nodes.iter().any(|n| n.id == "meshcat~z1~r1"), WAIT)
        .await
        .unwrap();
    // The same record again does not reconnect.
    let since = controls.status("z1").unwrap().connected_since_ms;
    controls.set_zone(&zone("z1", &server));
    assert_eq!(controls.status("z1").unwrap().connected_since_ms, since);

    controls.remove_zone("z1");
    assert!(controls.status("z1").is_none());
    assert!(controls.view("z1").is_none());
    server
        .wait_until(|nodes| nodes.is_empty(), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(
        metric(
            &registry,
            "meshcat_control_plane_connected",
            &[("zone", "z1")]
        ),
        None
    );
    server.stop().await;
}

#[tokio::test]
async fn a_disabled_control_plane_never_connects() {
    let server = ControlServer::start(local(), None).await.unwrap();
    let (controls, _registry) = controls(ControlConfig {
        enabled: false,
        ..config()
    });
    controls.set_zone(&zone("z1", &server));
    let status = controls.status("z1").unwrap();
    assert_eq!(status.state, ControlState::Disabled);
    assert_eq!(status.state.as_str(), "disabled");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(server.nodes().is_empty());
    assert_eq!(controls.statuses().len(), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_response_over_the_message_bound_is_rejected_and_counted() {
    let server = ControlServer::start(local(), None).await.unwrap();
    let names: Vec<String> = (0..50).map(|i| format!("cluster-{i}")).collect();
    let empty: Endpoints<'_> = &[];
    let clusters: Vec<(&str, Endpoints<'_>)> = names.iter().map(|n| (n.as_str(), empty)).collect();
    server.set(mesh(&clusters));
    let (controls, registry) = controls(ControlConfig {
        max_message: 1024,
        ..config()
    });
    controls.set_zone(&zone("z1", &server));
    let status = wait_status(&controls, "z1", "rejected", |s| {
        s.state == ControlState::Rejected
    })
    .await;
    assert!(
        status.error.contains("--max-control-message"),
        "{}",
        status.error
    );
    assert!(controls.view("z1").is_none());
    assert!(
        metric(
            &registry,
            "meshcat_control_plane_responses_total",
            &[("zone", "z1"), ("type", "other"), ("result", "nack")]
        )
        .is_some_and(|n| n >= 1.0)
    );
    controls.remove_zone("z1");
    server.stop().await;
}

#[tokio::test]
async fn a_view_holds_at_most_200_bytes_per_endpoint() {
    const CLUSTERS: usize = 200;
    const PER_CLUSTER: usize = 100;
    let server = ControlServer::start(local(), None).await.unwrap();
    let spec = MeshSpec {
        clusters: (0..CLUSTERS)
            .map(|c| {
                let endpoints = (0..PER_CLUSTER)
                    .map(|e| EndpointSpec::new(&format!("10.{}.{}.{}", c / 250, c % 250, e), 8080))
                    .collect();
                ClusterSpec::new(&format!("service-{c}.prod"), endpoints)
            })
            .collect(),
        listeners: Vec::new(),
    };
    server.set(spec);
    let (controls, _registry) = controls(config());
    controls.set_zone(&zone("z1", &server));
    wait_status(&controls, "z1", "holding every endpoint", |s| {
        s.endpoints == CLUSTERS * PER_CLUSTER
    })
    .await;
    let view = controls.view("z1").unwrap();
    controls.remove_zone("z1");
    server.stop().await;
    // The stream task lets go of its copy once it is dropped.
    let deadline = tokio::time::Instant::now() + WAIT;
    while std::sync::Arc::strong_count(&view) > 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the view is still shared"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Nothing else runs on this thread between the two readings.
    let before = ALLOC.allocated();
    drop(view);
    let freed = before - ALLOC.allocated();
    let per_endpoint = freed / (CLUSTERS * PER_CLUSTER);
    eprintln!("the view holds {per_endpoint} bytes per endpoint ({freed} bytes in all)");
    assert!(
        per_endpoint <= 200,
        "{per_endpoint} bytes per endpoint ({freed} bytes in all)"
    );
}
