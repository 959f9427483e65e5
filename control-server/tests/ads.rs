//! The ADS protocol of the control server seen from a gRPC client on the same
//! types: wildcard CDS and named EDS, ACKs that bring nothing again, pushes of only
//! what changed, a NACK with its error detail, hold and release, a per-node spec,
//! stop and restart on the same address, and mTLS that refuses a client without a
//! certificate; over Delta xDS, initial resource versions, only the resources that
//! changed, removals, a NACK that puts back what the client has, and Delta turned
//! off answered Unimplemented; a request for what the client has answered again
//! over both; secrets (SDS) by name over both, pushed again when the identity
//! issuer rotates them.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{Secret, secret};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use meshcat_control_server::{
    Ca, ClusterSpec, ControlServer, EndpointSpec, IdentitySpec, IssuerOptions, MeshSpec, type_url,
};
use prost::Message;
use tokio::sync::mpsc;
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(5);

fn mesh(ports: &[u16]) -> MeshSpec {
    MeshSpec {
        clusters: vec![ClusterSpec::new(
            "orders",
            ports
                .iter()
                .map(|p| EndpointSpec::new("127.0.0.1", *p))
                .collect(),
        )],
        listeners: vec![],
    }
}

/// One ADS stream as a client drives it.
struct Client {
    tx: mpsc::UnboundedSender<DiscoveryRequest>,
    rx: tonic::Streaming<DiscoveryResponse>,
    node: String,
}

impl Client {
    async fn connect(server: &ControlServer, node: &str) -> anyhow::Result<Self> {
        let channel = Channel::from_shared(format!("http://{}", server.local_addr()))?
            .connect()
            .await?;
        let (tx, rx) = mpsc::unbounded_channel::<DiscoveryRequest>();
        let requests =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
        let client = Self {
            tx,
            rx: AggregatedDiscoveryServiceClient::new(channel)
                .stream_aggregated_resources(requests)
                .await?
                .into_inner(),
            node: node.to_owned(),
        };
        Ok(client)
    }

    fn send(
        &self,
        type_url: &str,
        names: &[&str],
        answer: Option<&DiscoveryResponse>,
        nack: Option<&str>,
    ) {
        let req = DiscoveryRequest {
            node: Some(Node {
                id: self.node.clone(),
                cluster: "test".to_owned(),
                ..Default::default()
            }),
            type_url: type_url.to_owned(),
            resource_names: names.iter().map(|n| (*n).to_owned()).collect(),
            version_info: answer.map(|r| r.version_info.clone()).unwrap_or_default(),
            response_nonce: answer.map(|r| r.nonce.clone()).unwrap_or_default(),
            error_detail: nack.map(|m| RpcStatus {
                code: 3,
                message: m.to_owned(),
                details: vec![],
            }),
            ..Default::default()
        };
        self.tx.send(req).expect("stream open");
    }

    async fn recv(&mut self) -> anyhow::Result<DiscoveryResponse> {
        tokio::time::timeout(WAIT, self.rx.message())
            .await??
            .ok_or_else(|| anyhow::anyhow!("stream ended"))
    }
}

fn endpoints(r: &DiscoveryResponse) -> usize {
    r.resources
        .iter()
        .map(|a| {
            ClusterLoadAssignment::decode(&*a.value)
                .expect("a ClusterLoadAssignment")
                .endpoints[0]
                .lb_endpoints
                .len()
        })
        .sum()
}

#[tokio::test]
async fn state_of_the_world_over_one_stream() -> anyhow::Result<()> {
    let server = ControlServer::start("127.0.0.1:0".parse()?, None).await?;
    assert_eq!(server.set(mesh(&[9001])), "1");
    let mut c = Client::connect(&server, "n1").await?;

    c.send(type_url::CLUSTER, &[], None, None);
    let cds = c.recv().await?;
    assert_eq!(
        (cds.type_url.as_str(), cds.version_info.as_str()),
        (type_url::CLUSTER, "1")
    );
    assert_eq!(cds.resources.len(), 1);
    c.send(type_url::CLUSTER, &[], Some(&cds), None);
    c.send(type_url::ENDPOINT, &["orders", "absent"], None, None);
    let eds = c.recv().await?;
    assert_eq!(
        eds.type_url,
        type_url::ENDPOINT,
        "an ACK brings nothing again"
    );
    assert_eq!(endpoints(&eds), 1);
    c.send(type_url::ENDPOINT, &["orders", "absent"], Some(&eds), None);
    server
        .wait_until(
            |n| {
                n.iter().any(|n| {
                    n.acked(type_url::ENDPOINT) == "1" && n.acked(type_url::CLUSTER) == "1"
                })
            },
            WAIT,
        )
        .await?;

    // Only EDS changed: only EDS comes.
    assert_eq!(server.set(mesh(&[9001, 9002])), "2");
    let eds2 = c.recv().await?;
    assert_eq!(
        (eds2.type_url.as_str(), eds2.version_info.as_str()),
        (type_url::ENDPOINT, "2")
    );
    assert_eq!(endpoints(&eds2), 2);
    c.send(type_url::ENDPOINT, &["orders"], Some(&eds2), None);

    // A NACK keeps the ACKed version and records the detail; nothing is resent.
    let mut bad = mesh(&[9001, 9002]);
    bad.clusters[0].connect_timeout_ms = 0;
    server.override_for("n1", Some(bad));
    let cds2 = c.recv().await?;
    assert_eq!(
        (cds2.type_url.as_str(), cds2.version_info.as_str()),
        (type_url::CLUSTER, "override-1")
    );
    c.send(
        type_url::CLUSTER,
        &[],
        Some(&DiscoveryResponse {
            version_info: cds.version_info.clone(),
            nonce: cds2.nonce.clone(),
            ..Default::default()
        }),
        Some("connect timeout must be > 0"),
    );
    server
        .wait_until(
            |n| {
                n.iter()
                    .any(|n| n.last_nack(type_url::CLUSTER) == Some("connect timeout must be > 0"))
            },
            WAIT,
        )
        .await?;
    let n1 = server.node("n1").expect("connected");
    assert!(n1.overridden);
    assert_eq!(n1.acked(type_url::CLUSTER), "1");
    assert_eq!(n1.sent(type_url::CLUSTER), "override-1");
    server.override_for("n1", None);
    let cds3 = c.recv().await?;
    assert_eq!(
        (cds3.type_url.as_str(), cds3.version_info.as_str()),
        (type_url::CLUSTER, "2")
    );
    c.send(type_url::CLUSTER, &[], Some(&cds3), None);

    // Held: nothing newer comes; released: it catches up.
    server.hold("n1");
    assert_eq!(server.set(mesh(&[9003])), "3");
    assert!(server.node("n1").expect("connected").held);
    server.release("n1");
    let eds3 = c.recv().await?;
    assert_eq!(
        (eds3.type_url.as_str(), eds3.version_info.as_str()),
        (type_url::ENDPOINT, "3")
    );

    // Stop ends the stream with an error; restart serves the same snapshot again.
    server.stop().await;
    let ended = tokio::time::timeout(WAIT, c.rx.message()).await?;
    assert!(ended.is_err() || matches!(ended, Ok(None)), "{ended:?}");
    server.wait_until(|n| n.is_empty(), WAIT).await?;
    server.restart().await?;
    let mut c = Client::connect(&server, "n1").await?;
    c.send(type_url::CLUSTER, &[], None, None);
    assert_eq!(c.recv().await?.version_info, "3");
    Ok(())
}

/// One Delta xDS stream as a client drives it.
struct DeltaClient {
    tx: mpsc::UnboundedSender<DeltaDiscoveryRequest>,
    rx: tonic::Streaming<DeltaDiscoveryResponse>,
}

impl DeltaClient {
    async fn connect(server: &ControlServer) -> Result<Self, tonic::Status> {
        let channel = Channel::from_shared(format!("http://{}", server.local_addr()))
            .expect("a URL")
            .connect()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let (tx, rx) = mpsc::unbounded_channel::<DeltaDiscoveryRequest>();
        let requests =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
        let rx = AggregatedDiscoveryServiceClient::new(channel)
            .delta_aggregated_resources(requests)
            .await?
            .into_inner();
        Ok(Self { tx, rx })
    }

    fn send(&self, req: DeltaDiscoveryRequest) {
        self.tx
            .send(DeltaDiscoveryRequest {
                node: Some(Node {
                    id: "d1".to_owned(),
                    cluster: "test".to_owned(),
                    ..Default::default()
                }),
                ..req
            })
            .expect("stream open");
    }

    fn subscribe(&self, type_url: &str, names: &[&str], initial: &[(&str, &str)]) {
        self.send(DeltaDiscoveryRequest {
            type_url: type_url.to_owned(),
            resource_names_subscribe: names.iter().map(|n| (*n).to_owned()).collect(),
            initial_resource_versions: initial
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            ..Default::default()
        });
    }

    fn ack(&self, r: &DeltaDiscoveryResponse) {
        self.send(DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        });
    }

    fn nack(&self, r: &DeltaDiscoveryResponse, message: &str) {
        self.send(DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            error_detail: Some(RpcStatus {
                code: 3,
                message: message.to_owned(),
                details: vec![],
            }),
            ..Default::default()
        });
    }

    async fn recv(&mut self) -> anyhow::Result<DeltaDiscoveryResponse> {
        tokio::time::timeout(WAIT, self.rx.message())
            .await??
            .ok_or_else(|| anyhow::anyhow!("stream ended"))
    }
}

/// A response's type, version, resource names and removed names.
fn delta_of(r: &DeltaDiscoveryResponse) -> (&str, &str, Vec<&str>, Vec<&str>) {
    (
        r.type_url.as_str(),
        r.system_version_info.as_str(),
        r.resources.iter().map(|x| x.name.as_str()).collect(),
        r.removed_resources.iter().map(String::as_str).collect(),
    )
}

fn two_clusters(ports: &[u16]) -> MeshSpec {
    let mut spec = mesh(ports);
    spec.clusters.push(ClusterSpec::new("users", vec![]));
    spec
}

#[tokio::test]
async fn delta_sends_only_what_changed() -> anyhow::Result<()> {
    let server = ControlServer::start("127.0.0.1:0".parse()?, None).await?;
    assert!(server.delta());
    assert_eq!(server.set(mesh(&[9001])), "1");
    let mut c = DeltaClient::connect(&server).await?;

    // Wildcard CDS; a resource the client says it has that is gone is removed.
    c.subscribe(type_url::CLUSTER, &[], &[("stale", "x")]);
    let cds = c.recv().await?;
    assert_eq!(
        delta_of(&cds),
        (type_url::CLUSTER, "1", vec!["orders"], vec!["stale"])
    );
    let orders_version = cds.resources[0].version.clone();
    assert_eq!(
        orders_version,
        meshcat_control_server::resource_version(cds.resources[0].resource.as_ref().unwrap())
    );
    c.ack(&cds);
    c.subscribe(type_url::ENDPOINT, &["orders", "absent"], &[]);
    let eds = c.recv().await?;
    assert_eq!(
        delta_of(&eds),
        (type_url::ENDPOINT, "1", vec!["orders"], vec![])
    );
    c.ack(&eds);
    server
        .wait_until(
            |n| {
                n.iter().any(|n| {
                    n.id == "d1"
                        && n.delta
                        && n.acked(type_url::CLUSTER) == "1"
                        && n.acked(type_url::ENDPOINT) == "1"
                })
            },
            WAIT,
        )
        .await?;
    let d1 = server.node("d1").expect("connected");
    assert_eq!(
        d1.get(type_url::ENDPOINT).unwrap().resource_names,
        ["absent", "orders"]
    );

    // Only an endpoint changed: only that load assignment comes.
    assert_eq!(server.set(mesh(&[9001, 9002])), "2");
    let eds2 = c.recv().await?;
    assert_eq!(
        delta_of(&eds2),
        (type_url::ENDPOINT, "2", vec!["orders"], vec![])
    );
    c.ack(&eds2);
    // A cluster added: only it comes, then its endpoints once subscribed.
    assert_eq!(server.set(two_clusters(&[9001, 9002])), "3");
    let cds3 = c.recv().await?;
    assert_eq!(
        delta_of(&cds3),
        (type_url::CLUSTER, "3", vec!["users"], vec![])
    );
    c.ack(&cds3);
    c.subscribe(type_url::ENDPOINT, &["users"], &[]);
    let eds3 = c.recv().await?;
    assert_eq!(
        delta_of(&eds3),
        (type_url::ENDPOINT, "3", vec!["users"], vec![])
    );
    c.ack(&eds3);

    // A NACK is recorded, nothing is sent again, and what the client has goes back
    // to before the refused response.
    let mut bad = two_clusters(&[9001, 9002]);
    bad.clusters[0].connect_timeout_ms = 0;
    server.override_for("d1", Some(bad));
    let refused = c.recv().await?;
    assert_eq!(
        delta_of(&refused),
        (type_url::CLUSTER, "override-1", vec!["orders"], vec![])
    );
    assert_ne!(refused.resources[0].version, orders_version);
    // The endpoints of the cluster it updates come again: Envoy warms an updated
    // cluster until they do, and does not ask for them.
    let endpoints_again = c.recv().await?;
    assert_eq!(
        delta_of(&endpoints_again),
        (type_url::ENDPOINT, "override-1", vec!["orders"], vec![])
    );
    c.ack(&endpoints_again);
    c.nack(&refused, "connect timeout must be > 0");
    server
        .wait_until(
            |n| {
                n.iter().any(|n| {
                    n.last_nack(type_url::CLUSTER) == Some("connect timeout must be > 0")
                        && n.get(type_url::CLUSTER).is_some_and(|t| t.nacked)
                })
            },
            WAIT,
        )
        .await?;
    let d1 = server.node("d1").expect("connected");
    assert_eq!(d1.acked(type_url::CLUSTER), "3");
    assert_eq!(d1.sent(type_url::CLUSTER), "override-1");
    server.override_for("d1", None);
    // Removed: the cluster and its load assignment, and nothing of orders, which
    // the client still has as it was.
    assert_eq!(server.set(mesh(&[9001, 9002])), "4");
    let cds4 = c.recv().await?;
    assert_eq!(
        delta_of(&cds4),
        (type_url::CLUSTER, "4", vec![], vec!["users"])
    );
    c.ack(&cds4);
    let eds4 = c.recv().await?;
    assert_eq!(
        delta_of(&eds4),
        (type_url::ENDPOINT, "4", vec![], vec!["users"])
    );
    c.ack(&eds4);

    // Held: nothing newer comes; released: it catches up.
    server.hold("d1");
    assert_eq!(server.set(mesh(&[9003])), "5");
    assert!(server.node("d1").expect("connected").held);
    server.release("d1");
    let eds5 = c.recv().await?;
    assert_eq!(
        delta_of(&eds5),
        (type_url::ENDPOINT, "5", vec!["orders"], vec![])
    );
    c.ack(&eds5);

    // A new stream that has everything at its version is answered with nothing.
    drop(c);
    server
        .wait_until(|n| n.iter().all(|n| n.id != "d1"), WAIT)
        .await?;
    let mut c = DeltaClient::connect(&server).await?;
    c.subscribe(type_url::CLUSTER, &["*"], &[("orders", &orders_version)]);
    assert_eq!(
        delta_of(&c.recv().await?),
        (type_url::CLUSTER, "5", vec![], vec![])
    );
    Ok(())
}

#[tokio::test]
async fn a_request_for_what_the_client_has_is_answered_again() -> anyhow::Result<()> {
    let server = ControlServer::start("127.0.0.1:0".parse()?, None).await?;
    server.set(mesh(&[9001]));

    // State of the world: the answered nonce again is a new request, not an ACK.
    let mut c = Client::connect(&server, "n1").await?;
    c.send(type_url::ENDPOINT, &["orders"], None, None);
    let eds = c.recv().await?;
    c.send(type_url::ENDPOINT, &["orders"], Some(&eds), None);
    c.send(type_url::ENDPOINT, &["orders"], Some(&eds), None);
    let again = c.recv().await?;
    assert_eq!(
        (again.type_url.as_str(), again.version_info.as_str()),
        (type_url::ENDPOINT, "1")
    );
    assert_ne!(again.nonce, eds.nonce);
    assert_eq!(endpoints(&again), 1);
    // Its ACK is an ACK: nothing comes, until the snapshot changes.
    c.send(type_url::ENDPOINT, &["orders"], Some(&again), None);
    server.set(mesh(&[9001, 9002]));
    let next = c.recv().await?;
    assert_eq!(next.version_info, "2");

    // Delta: a name subscribed again is sent again.
    let mut d = DeltaClient::connect(&server).await?;
    d.subscribe(type_url::ENDPOINT, &["orders"], &[]);
    let first = d.recv().await?;
    d.ack(&first);
    d.subscribe(type_url::ENDPOINT, &["orders"], &[]);
    let resent = d.recv().await?;
    assert_eq!(
        delta_of(&resent),
        (type_url::ENDPOINT, "2", vec!["orders"], vec![])
    );
    assert_eq!(resent.resources[0].version, first.resources[0].version);
    Ok(())
}

#[tokio::test]
async fn delta_turned_off_is_unimplemented() -> anyhow::Result<()> {
    let server = ControlServer::start_with(
        "127.0.0.1:0".parse()?,
        None,
        meshcat_control_server::ServerOptions { delta: false },
    )
    .await?;
    assert!(!server.delta());
    let status = DeltaClient::connect(&server)
        .await
        .err()
        .expect("Unimplemented");
    assert_eq!(status.code(), tonic::Code::Unimplemented);
    // State of the world is served still.
    server.set(mesh(&[9001]));
    let mut c = Client::connect(&server, "n1").await?;
    c.send(type_url::CLUSTER, &[], None, None);
    assert_eq!(c.recv().await?.version_info, "1");
    // Turned on, new streams are served.
    server.set_delta(true);
    let mut d = DeltaClient::connect(&server).await?;
    d.subscribe(type_url::CLUSTER, &[], &[]);
    assert_eq!(
        delta_of(&d.recv().await?),
        (type_url::CLUSTER, "1", vec!["orders"], vec![])
    );
    Ok(())
}

/// The names of the secrets in `resources`, and each certificate's PEM (the CA's
/// for a validation context).
fn secrets(resources: &[Any]) -> Vec<(String, String)> {
    resources
        .iter()
        .map(|a| {
            assert_eq!(a.type_url, type_url::SECRET);
            let s = Secret::decode(&*a.value).expect("a Secret");
            let inline = |d: Option<DataSource>| match d.and_then(|d| d.specifier) {
                Some(data_source::Specifier::InlineString(text)) => text,
                other => panic!("not inline: {other:?}"),
            };
            let pem = match s.r#type {
                Some(secret::Type::TlsCertificate(c)) => {
                    assert!(inline(c.private_key).contains("PRIVATE KEY"));
                    inline(c.certificate_chain)
                }
                Some(secret::Type::ValidationContext(v)) => inline(v.trusted_ca),
                other => panic!("unexpected secret {other:?}"),
            };
            (s.name, pem)
        })
        .collect()
}

#[tokio::test]
async fn secrets_are_served_by_name_and_pushed_when_rotated() -> anyhow::Result<()> {
    let server = ControlServer::start("127.0.0.1:0".parse()?, None).await?;
    let ca = Ca::generate("test CA", Duration::from_secs(3600))?;
    let issuer = server.start_issuer(
        ca,
        IssuerOptions::default(),
        vec![
            IdentitySpec::new("svc", ["spiffe://test/ns/test/sa/svc"])?,
            IdentitySpec::new("edge", ["spiffe://test/ns/test/sa/edge"])?,
        ],
    )?;
    let issued = issuer.identity("svc").expect("svc");

    // State of the world: no name, no secret (not a wildcard type); by name, those.
    let mut c = Client::connect(&server, "n1").await?;
    c.send(type_url::SECRET, &[], None, None);
    let none = c.recv().await?;
    assert!(none.resources.is_empty(), "{none:?}");
    c.send(type_url::SECRET, &["svc", "ca"], Some(&none), None);
    let sds = c.recv().await?;
    assert_eq!(sds.version_info, issued.version);
    let got = secrets(&sds.resources);
    assert_eq!(
        got.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["ca", "svc"]
    );
    assert_eq!(got[0].1, issuer.ca_pem());
    c.send(type_url::SECRET, &["svc", "ca"], Some(&sds), None);

    // Delta: by name too.
    let mut d = DeltaClient::connect(&server).await?;
    d.subscribe(type_url::SECRET, &["svc"], &[]);
    let first = d.recv().await?;
    assert_eq!(
        delta_of(&first),
        (
            type_url::SECRET,
            issued.version.as_str(),
            vec!["svc"],
            vec![]
        )
    );
    d.ack(&first);

    // A rotation reaches both, with the new certificate under a new version.
    let rotated = issuer.rotate("svc")?;
    let sds2 = c.recv().await?;
    assert_eq!(sds2.version_info, rotated.version);
    let got2 = secrets(&sds2.resources);
    assert_ne!(got2[1].1, got[1].1, "a new certificate");
    assert_eq!(got2[0].1, got[0].1, "the same CA");
    c.send(type_url::SECRET, &["svc", "ca"], Some(&sds2), None);
    let second = d.recv().await?;
    assert_eq!(
        delta_of(&second),
        (
            type_url::SECRET,
            rotated.version.as_str(),
            vec!["svc"],
            vec![]
        )
    );
    assert_ne!(second.resources[0].version, first.resources[0].version);
    d.ack(&second);

    // Another identity's rotation is not sent to the delta client, which asked only
    // for svc: the next response it gets is svc's next rotation.
    issuer.rotate("edge")?;
    let again = issuer.rotate("svc")?;
    let third = d.recv().await?;
    assert_eq!(
        delta_of(&third),
        (
            type_url::SECRET,
            again.version.as_str(),
            vec!["svc"],
            vec![]
        )
    );
    Ok(())
}

/// A CA and a certificate it signed for `localhost`, as PEM.
fn ca_and_leaf() -> anyhow::Result<(String, String, String)> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate()?;
    let ca_pem = ca.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])?.signed_by(&key, &issuer)?;
    Ok((ca_pem, leaf.pem(), key.serialize_pem()))
}

#[tokio::test]
async fn mtls_needs_a_client_certificate() -> anyhow::Result<()> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let (ca, cert, key) = ca_and_leaf()?;
    let tls = meshcat_control_server::ServerTls {
        cert_pem: cert.clone().into_bytes(),
        key_pem: key.clone().into_bytes(),
        client_ca_pem: Some(ca.clone().into_bytes()),
    };
    let server = ControlServer::start("127.0.0.1:0".parse()?, Some(tls)).await?;
    server.set(mesh(&[9001]));
    let url = format!("https://localhost:{}", server.local_addr().port());
    let base = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca))
        .domain_name("localhost");

    let request = || {
        futures::stream::iter(vec![DiscoveryRequest {
            node: Some(Node {
                id: "tls".to_owned(),
                ..Default::default()
            }),
            type_url: type_url::CLUSTER.to_owned(),
            ..Default::default()
        }])
    };
    let with_cert = Channel::from_shared(url.clone())?
        .tls_config(base.clone().identity(Identity::from_pem(&cert, &key)))?
        .connect()
        .await?;
    let mut stream = AggregatedDiscoveryServiceClient::new(with_cert)
        .stream_aggregated_resources(request())
        .await?
        .into_inner();
    let cds = tokio::time::timeout(WAIT, stream.message()).await??;
    assert_eq!(cds.map(|r| r.version_info).as_deref(), Some("1"));

    let refused = async {
        let channel = Channel::from_shared(url)?
            .tls_config(base)?
            .connect()
            .await?;
        let mut stream = AggregatedDiscoveryServiceClient::new(channel)
            .stream_aggregated_resources(request())
            .await?
            .into_inner();
        anyhow::Ok(stream.message().await?)
    };
    let outcome = tokio::time::timeout(WAIT, refused).await?;
    assert!(outcome.is_err(), "no client certificate: {outcome:?}");
    Ok(())
}
