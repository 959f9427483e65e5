//! The ADS protocol of the control server seen from a gRPC client on the same
//! types: wildcard CDS and named EDS, ACKs that bring nothing again, pushes of only
//! what changed, a NACK with its error detail, hold and release, a per-node spec,
//! Delta answered Unimplemented, stop and restart on the same address, and mTLS
//! that refuses a client without a certificate.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use meshcat_control_server::{ClusterSpec, ControlServer, EndpointSpec, MeshSpec, type_url};
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

#[tokio::test]
async fn delta_is_unimplemented() -> anyhow::Result<()> {
    let server = ControlServer::start("127.0.0.1:0".parse()?, None).await?;
    let channel = Channel::from_shared(format!("http://{}", server.local_addr()))?
        .connect()
        .await?;
    let requests = futures::stream::iter(vec![DeltaDiscoveryRequest::default()]);
    let status = AggregatedDiscoveryServiceClient::new(channel)
        .delta_aggregated_resources(requests)
        .await
        .expect_err("Unimplemented");
    assert_eq!(status.code(), tonic::Code::Unimplemented);
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
