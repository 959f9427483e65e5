//! The ingest server over real QUIC on 127.0.0.1:0: authentication (agent certificates
//! and tokens), zone permissions, rejection of bad messages without harm to other
//! agents, and agent_gone on disconnect and goodbye. The clients here are raw quinn
//! connections so they can misbehave on purpose.

use std::path::{Path, PathBuf};

use futures::FutureExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meshcat_aggregator::ingest::{AgentAuth, Ingest, IngestConfig, RecordingSink, ReportSink};
use meshcat_common::tls::{self, ClientAuth, DevFiles};
use meshcat_common::transport::{read_frame, write_frame};
use meshcat_common::wire::{
    self, AgentMessage, DEFAULT_MAX_MESSAGE, Envelope, Hello, InstanceReport, Report, ServerMessage,
};
use prometheus::Registry;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
use tokio::sync::oneshot;

struct Server {
    addr: std::net::SocketAddr,
    sink: Arc<RecordingSink>,
    registry: Registry,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(config: IngestConfig) -> Server {
        let sink = Arc::new(RecordingSink::default());
        Server::start_with(config, sink.clone(), sink).await
    }

    /// Serves reports into `catalog` (the real live instances, say); `sink` is kept
    /// for the test's own helpers and sees nothing then.
    async fn start_with(
        config: IngestConfig,
        sink: Arc<RecordingSink>,
        catalog: Arc<dyn ReportSink>,
    ) -> Server {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let registry = Registry::new();
        let ingest = Ingest::new(config, catalog, &registry).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            ingest
                .run(socket, async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Server {
            addr,
            sink,
            registry,
            stop: Some(stop),
            task,
        }
    }

    fn metric(&self, name: &str, label: Option<(&str, &str)>) -> f64 {
        metric(&self.registry, name, label)
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("ingest stops by itself")
            .unwrap();
    }
}

/// Sums the samples of a metric in the text exposition, optionally with one label.
fn metric(registry: &Registry, name: &str, label: Option<(&str, &str)>) -> f64 {
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}{{")))
        .filter(|l| match label {
            None => true,
            Some((k, v)) => l.contains(&format!("{k}=\"{v}\"")),
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn instance(zone: &str, cluster: &str, name: &str) -> InstanceReport {
    InstanceReport {
        admin_address: "127.0.0.1:9901".into(),
        reachable: true,
        start_time_ms: 1_700_000_000_000,
        server_state: "LIVE".into(),
        envoy_version: "1.40.0".into(),
        log_level: Some("info".into()),
        requests_total: 10,
        errors_5xx_total: 1,
        ..InstanceReport::unread(zone.into(), cluster.into(), name.into())
    }
}

/// A raw agent connection.
struct Client {
    conn: quinn::Connection,
    _endpoint: quinn::Endpoint,
    control: Option<(quinn::SendStream, quinn::RecvStream)>,
}

async fn connect(
    addr: std::net::SocketAddr,
    ca: &Path,
    cert: Option<(&Path, &Path)>,
) -> Result<Client, String> {
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(tls::client_config(ca, cert).unwrap());
    let conn = endpoint
        .connect(addr, "localhost")
        .unwrap()
        .await
        .map_err(|e| e.to_string())?;
    Ok(Client {
        conn,
        _endpoint: endpoint,
        control: None,
    })
}

impl Client {
    /// Says hello; the answer's reason on refusal.
    async fn hello(&mut self, agent_id: &str, token: Option<&str>) -> Result<(), String> {
        let control = self.conn.open_bi().await.map_err(|e| e.to_string())?;
        self.hello_on(control, agent_id, token).await
    }

    /// Says hello on a control stream already opened.
    async fn hello_on(
        &mut self,
        (mut send, mut recv): (quinn::SendStream, quinn::RecvStream),
        agent_id: &str,
        token: Option<&str>,
    ) -> Result<(), String> {
        let hello = AgentMessage::Hello(Hello {
            agent_id: agent_id.into(),
            agent_version: "test".into(),
            token: token.map(str::to_owned),
        });
        write_frame(&mut send, &hello, DEFAULT_MAX_MESSAGE)
            .await
            .map_err(|e| e.to_string())?;
        match read_frame::<ServerMessage>(&mut recv, DEFAULT_MAX_MESSAGE).await {
            Ok(Some(ServerMessage::Welcome { .. })) => {
                self.control = Some((send, recv));
                Ok(())
            }
            Ok(Some(ServerMessage::Rejected { reason })) => Err(reason),
            other => Err(format!("{other:?}")),
        }
    }

    /// Sends raw bytes as a report stream and returns the aggregator's answer.
    async fn raw(&self, bytes: &[u8]) -> ServerMessage {
        let (mut send, mut recv) = self.conn.open_bi().await.unwrap();
        // The aggregator may stop the stream before all of an oversized body is sent.
        let _ = send.write_all(bytes).await;
        let _ = send.finish();
        read_frame::<ServerMessage>(&mut recv, DEFAULT_MAX_MESSAGE)
            .await
            .unwrap()
            .expect("an answer")
    }

    async fn report(&self, instances: Vec<InstanceReport>) -> ServerMessage {
        let msg = AgentMessage::Report(Report {
            sent_at_ms: 0,
            instances,
        });
        self.raw(&wire::encode(&msg, usize::MAX).unwrap()).await
    }

    async fn goodbye(&mut self) {
        let (send, _) = self.control.as_mut().unwrap();
        write_frame(send, &AgentMessage::Goodbye, DEFAULT_MAX_MESSAGE)
            .await
            .unwrap();
        let _ = send.finish();
    }
}

/// Whether the whole report was applied: acknowledged with no instance refused.
fn accepted(m: &ServerMessage) -> bool {
    matches!(m, ServerMessage::ReportAccepted { refused, .. } if refused.is_empty())
}

/// The reasons of the instances a report's answer refused, by instance name.
fn refusals(m: &ServerMessage) -> Vec<(String, String)> {
    match m {
        ServerMessage::ReportAccepted { refused, .. } => refused
            .iter()
            .map(|r| (r.instance.clone(), r.reason.clone()))
            .collect(),
        other => panic!("not acknowledged: {other:?}"),
    }
}

fn dev(dir: &Path) -> DevFiles {
    tls::dev_setup(dir).unwrap()
}

/// Development certificates in `dir`, and an ingest whose agents authenticate with
/// the `tokens` file's lines (`TOKEN [zone,...]`).
fn token_config(dir: &Path, tokens: &str) -> (DevFiles, IngestConfig) {
    let files = dev(dir);
    let path = dir.join("tokens");
    std::fs::write(&path, tokens).unwrap();
    let auth = AgentAuth::default().with_token_file(&path).unwrap();
    let server_tls =
        tls::server_config(&files.server_cert, &files.server_key, &ClientAuth::None).unwrap();
    (files, IngestConfig::new(server_tls, auth))
}

fn mtls_config(files: &DevFiles, ca: &Path) -> IngestConfig {
    let server = tls::server_config(
        &files.server_cert,
        &files.server_key,
        &ClientAuth::Required(ca.to_owned()),
    )
    .unwrap();
    IngestConfig::new(server, AgentAuth::certificates())
}

/// An operator CA and an agent certificate it signs, limited to the given zone URIs.
fn operator_ca(dir: &Path, zone_uris: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = zone_uris
        .iter()
        .map(|u| SanType::URI((*u).try_into().unwrap()))
        .collect();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let paths = (
        dir.join("op-ca.pem"),
        dir.join("op-agent.pem"),
        dir.join("op-agent-key.pem"),
    );
    std::fs::write(&paths.0, ca_cert.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

#[tokio::test]
async fn mtls_accepts_the_ca_signed_agent_and_refuses_others() {
    let dir = tempfile::tempdir().unwrap();
    let files = dev(dir.path());
    let server = Server::start(mtls_config(&files, &files.ca)).await;

    let mut good = connect(
        server.addr,
        &files.ca,
        Some((&files.agent_cert, &files.agent_key)),
    )
    .await
    .unwrap();
    good.hello("agent-a", None).await.unwrap();
    let answer = good.report(vec![instance("east", "web", "web-1")]).await;
    assert!(accepted(&answer), "{answer:?}");
    eventually("the report in the sink", || {
        server.sink.reports_of("agent-a") == 1
    })
    .await;

    // No client certificate: the handshake (or the first exchange) fails.
    let refused = match connect(server.addr, &files.ca, None).await {
        Err(_) => true,
        Ok(mut c) => c.hello("agent-b", None).await.is_err(),
    };
    assert!(refused, "an agent without a certificate was accepted");

    // A certificate from another CA.
    let foreign_dir = tempfile::tempdir().unwrap();
    let foreign = dev(foreign_dir.path());
    let refused = match connect(
        server.addr,
        &files.ca,
        Some((&foreign.agent_cert, &foreign.agent_key)),
    )
    .await
    {
        Err(_) => true,
        Ok(mut c) => c.hello("agent-c", None).await.is_err(),
    };
    assert!(refused, "an agent with a foreign certificate was accepted");
    eventually("handshake refusals counted", || {
        server.metric(
            "meshcat_reports_rejected_total",
            Some(("reason", "handshake")),
        ) >= 2.0
    })
    .await;
    assert_eq!(server.sink.reports_of("agent-b"), 0);
    assert_eq!(server.sink.reports_of("agent-c"), 0);
    server.stop().await;
}

#[tokio::test]
async fn certificate_zones_limit_reports() {
    let dir = tempfile::tempdir().unwrap();
    let files = dev(dir.path());
    let (ca, cert, key) = operator_ca(dir.path(), &["meshcat:zone:east"]);
    let server = Server::start(mtls_config(&files, &ca)).await;
    let mut agent = connect(server.addr, &files.ca, Some((&cert, &key)))
        .await
        .unwrap();
    agent.hello("scoped", None).await.unwrap();
    assert!(accepted(
        &agent.report(vec![instance("east", "web", "web-1")]).await
    ));
    let answer = agent
        .report(vec![
            instance("east", "web", "web-1"),
            instance("west", "web", "web-2"),
        ])
        .await;
    // The instance of the other zone is refused alone; the rest applies.
    assert_eq!(
        refusals(&answer),
        [("web-2".to_owned(), "forbidden_zone".to_owned())]
    );
    assert!(matches!(
        answer,
        ServerMessage::ReportAccepted { instances: 1, .. }
    ));
    assert_eq!(
        server.metric(
            "meshcat_reports_rejected_total",
            Some(("reason", "forbidden_zone"))
        ),
        1.0
    );
    assert_eq!(server.sink.reports_of("scoped"), 2);
    server.stop().await;
}

#[tokio::test]
async fn token_auth_accepts_known_tokens_and_enforces_their_zones() {
    let dir = tempfile::tempdir().unwrap();
    let (files, config) = token_config(dir.path(), "s3cret-east east\ns3cret-all\n");
    let server = Server::start(config).await;

    let mut wrong = connect(server.addr, &files.ca, None).await.unwrap();
    let reason = wrong
        .hello("intruder", Some("s3cret-eas"))
        .await
        .unwrap_err();
    assert!(reason.contains("authentication"), "{reason}");
    let mut none = connect(server.addr, &files.ca, None).await.unwrap();
    assert!(none.hello("intruder", None).await.is_err());
    assert_eq!(
        server.metric("meshcat_reports_rejected_total", Some(("reason", "auth"))),
        2.0
    );

    let mut east = connect(server.addr, &files.ca, None).await.unwrap();
    east.hello("east-agent", Some("s3cret-east")).await.unwrap();
    assert!(accepted(
        &east.report(vec![instance("east", "web", "web-1")]).await
    ));
    assert!(!accepted(
        &east.report(vec![instance("north", "web", "web-1")]).await
    ));
    let mut all = connect(server.addr, &files.ca, None).await.unwrap();
    all.hello("all-agent", Some("s3cret-all")).await.unwrap();
    assert!(accepted(
        &all.report(vec![instance("north", "web", "web-1")]).await
    ));
    assert_eq!(
        server.metric(
            "meshcat_reports_rejected_total",
            Some(("reason", "forbidden_zone"))
        ),
        1.0
    );
    assert_eq!(server.metric("meshcat_agents_connected", None), 2.0);
    server.stop().await;
}

#[tokio::test]
async fn bad_messages_are_refused_without_harm_to_other_agents() {
    let dir = tempfile::tempdir().unwrap();
    let files = dev(dir.path());
    let mut config = mtls_config(&files, &files.ca);
    config.limits.max_message = 64 * 1024;
    config.limits.max_instances = 100;
    let server = Server::start(config).await;
    let certs = Some((files.agent_cert.as_path(), files.agent_key.as_path()));
    let mut good = connect(server.addr, &files.ca, certs).await.unwrap();
    good.hello("good", None).await.unwrap();
    let mut bad = connect(server.addr, &files.ca, certs).await.unwrap();
    bad.hello("bad", None).await.unwrap();

    // Over the limit: announced as 1 MiB; refused from the prefix alone.
    let mut huge = (1u32 << 20).to_be_bytes().to_vec();
    huge.extend(std::iter::repeat_n(0u8, 200 * 1024));
    let answer = bad.raw(&huge).await;
    assert!(
        matches!(answer, ServerMessage::Rejected { .. }),
        "{answer:?}"
    );
    assert!(accepted(&good.report(vec![instance("z", "c", "i")]).await));

    // Another protocol version.
    let body = rmp_serde::to_vec(&Envelope {
        version: 99,
        message: AgentMessage::Goodbye,
    })
    .unwrap();
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend(body);
    let answer = bad.raw(&frame).await;
    assert!(
        matches!(&answer, ServerMessage::Rejected { reason } if reason.contains("version")),
        "{answer:?}"
    );

    // Garbage.
    let answer = bad.raw(b"\x00\x00\x00\x08\xc1\xc1garbage").await;
    assert!(
        matches!(answer, ServerMessage::Rejected { .. }),
        "{answer:?}"
    );

    // Bad names and too many instances.
    assert!(!accepted(
        &bad.report(vec![instance("z", "c/../x", "i")]).await
    ));
    let many = (0..101)
        .map(|i| instance("z", "c", &format!("i{i}")))
        .collect();
    assert!(!accepted(&bad.report(many).await));

    for reason in [
        "too_large",
        "version",
        "decode",
        "invalid_name",
        "too_many_instances",
    ] {
        assert_eq!(
            server.metric("meshcat_reports_rejected_total", Some(("reason", reason))),
            1.0,
            "{reason}"
        );
    }
    // Both agents are still connected and reporting.
    assert!(accepted(&good.report(vec![instance("z", "c", "i")]).await));
    assert!(accepted(&bad.report(vec![instance("z", "c", "j")]).await));
    assert_eq!(server.sink.reports_of("good"), 2);
    assert_eq!(server.sink.reports_of("bad"), 1);
    // The report whose one instance had a bad name was received, that instance
    // refused.
    assert_eq!(server.metric("meshcat_reports_received_total", None), 4.0);
    assert_eq!(server.metric("meshcat_agents_connected", None), 2.0);
    server.stop().await;
}

#[tokio::test]
async fn agent_gone_on_goodbye_and_on_disconnect() {
    let dir = tempfile::tempdir().unwrap();
    let files = dev(dir.path());
    let server = Server::start(mtls_config(&files, &files.ca)).await;
    let certs = Some((files.agent_cert.as_path(), files.agent_key.as_path()));

    let mut polite = connect(server.addr, &files.ca, certs).await.unwrap();
    polite.hello("polite", None).await.unwrap();
    assert!(accepted(
        &polite.report(vec![instance("z", "c", "p")]).await
    ));
    polite.goodbye().await;
    eventually("goodbye handled", || server.sink.is_gone("polite")).await;

    let mut abrupt = connect(server.addr, &files.ca, certs).await.unwrap();
    abrupt.hello("abrupt", None).await.unwrap();
    assert!(accepted(
        &abrupt.report(vec![instance("z", "c", "a")]).await
    ));
    abrupt.conn.close(7u32.into(), b"gone");
    eventually("disconnect handled", || server.sink.is_gone("abrupt")).await;
    eventually("no agent connected", || {
        server.metric("meshcat_agents_connected", None) == 0.0
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn a_reconnecting_agent_replaces_its_old_connection_without_agent_gone() {
    let dir = tempfile::tempdir().unwrap();
    let files = dev(dir.path());
    let server = Server::start(mtls_config(&files, &files.ca)).await;
    let certs = Some((files.agent_cert.as_path(), files.agent_key.as_path()));
    let mut old = connect(server.addr, &files.ca, certs).await.unwrap();
    old.hello("same", None).await.unwrap();
    let mut new = connect(server.addr, &files.ca, certs).await.unwrap();
    new.hello("same", None).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), old.conn.closed())
        .await
        .expect("the old connection is closed");
    assert!(accepted(&new.report(vec![instance("z", "c", "i")]).await));
    eventually("the old connection forgotten", || {
        server.metric("meshcat_agents_connected", None) == 1.0
    })
    .await;
    assert!(!server.sink.is_gone("same"));
    server.stop().await;
}

/// The credential tag of a session key (`<tag>:<agent id>`).
fn tag_of(key: &str) -> &str {
    key.split_once(':').map_or(key, |(tag, _)| tag)
}

/// Sessions are keyed by credential and agent id: an agent of another credential that
/// gives a live agent's id neither keeps it out nor closes it, and the instances a live
/// connection reports are not taken over by another credential (`instance_in_use`),
/// while the rest of that report applies. Reports go into the real live instances,
/// where the take-over is decided.
#[tokio::test]
async fn another_credential_can_neither_shut_out_an_agent_nor_take_its_instances() {
    let dir = tempfile::tempdir().unwrap();
    let (files, config) = token_config(dir.path(), "tok-a zone-a\ntok-b zone-a,zone-b\n");
    let rules = meshcat_aggregator::store::Rules {
        instance_ttl: Duration::from_secs(60),
        error_ratio_warning: 0.05,
        graph_window: std::time::Duration::from_secs(60),
        identity: Default::default(),
    };
    let (_store, instances) =
        meshcat_aggregator::store::Store::open(&dir.path().join("data"), rules).unwrap();
    let instances = Arc::new(instances);
    let server = Server::start_with(
        config,
        Arc::new(RecordingSink::default()),
        instances.clone(),
    )
    .await;
    let in_use = |server: &Server| {
        server.metric(
            "meshcat_reports_rejected_total",
            Some(("reason", "instance_in_use")),
        )
    };

    let mut holder = connect(server.addr, &files.ca, None).await.unwrap();
    holder.hello("pod", Some("tok-a")).await.unwrap();
    let web = || instance("zone-a", "web", "web-1");
    assert!(accepted(&holder.report(vec![web()]).await));
    let held_by = instances.reporter("zone-a", "web", "web-1").unwrap();

    // Same id, other credential: welcomed, and the holder's connection stays open.
    let mut other = connect(server.addr, &files.ca, None).await.unwrap();
    other.hello("pod", Some("tok-b")).await.unwrap();
    eventually("both connected", || {
        server.metric("meshcat_agents_connected", None) == 2.0
    })
    .await;
    assert!(holder.conn.close_reason().is_none());

    // Its report names the holder's instance and one of its own: the first is
    // refused, the second applies.
    let answer = other
        .report(vec![web(), instance("zone-b", "api", "api-1")])
        .await;
    assert!(
        matches!(answer, ServerMessage::ReportAccepted { instances: 1, .. }),
        "{answer:?}"
    );
    assert_eq!(in_use(&server), 1.0);
    assert_eq!(
        instances.reporter("zone-a", "web", "web-1").as_deref(),
        Some(held_by.as_str())
    );
    let other_key = instances.reporter("zone-b", "api", "api-1").unwrap();
    assert_ne!(tag_of(&other_key), tag_of(&held_by));
    // The holder goes on reporting and answering, untouched.
    assert!(matches!(
        holder.report(vec![web()]).await,
        ServerMessage::ReportAccepted { instances: 1, .. }
    ));

    // The other connection ends: only its own instance goes.
    other.conn.close(0u32.into(), b"bye");
    eventually("the other session's instance dropped", || {
        instances.reporter("zone-b", "api", "api-1").is_none()
    })
    .await;
    assert_eq!(
        instances.reporter("zone-a", "web", "web-1").as_deref(),
        Some(held_by.as_str())
    );

    // A reconnect of the holder's credential replaces its old connection and keeps
    // the instance.
    let mut again = connect(server.addr, &files.ca, None).await.unwrap();
    again.hello("pod", Some("tok-a")).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), holder.conn.closed())
        .await
        .expect("the older connection of the same credential is closed");
    assert!(accepted(&again.report(vec![web()]).await));

    // Once no live connection holds the instance, another credential may report it.
    again.goodbye().await;
    tokio::time::timeout(Duration::from_secs(5), again.conn.closed())
        .await
        .expect("goodbye closes the connection");
    eventually("the instance released", || {
        instances.reporter("zone-a", "web", "web-1").is_none()
    })
    .await;
    let mut next = connect(server.addr, &files.ca, None).await.unwrap();
    next.hello("pod", Some("tok-b")).await.unwrap();
    assert!(matches!(
        next.report(vec![web()]).await,
        ServerMessage::ReportAccepted { instances: 1, .. }
    ));
    assert_eq!(in_use(&server), 1.0);
    server.stop().await;
}

#[tokio::test]
async fn certificates_without_an_exact_zone_uri_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let files = dev(dir.path());
    for (i, (uris, allow_any, ok)) in [
        (&[][..], false, false),
        (&["meshcat:zones:east"][..], false, false),
        (&["Meshcat:zone:east"][..], false, false),
        (&["https://example.com/meshcat:zone:east"][..], false, false),
        (&[][..], true, true),
        (&["meshcat:zone:east"][..], false, true),
    ]
    .into_iter()
    .enumerate()
    {
        let sub = dir.path().join(i.to_string());
        std::fs::create_dir(&sub).unwrap();
        let (ca, cert, key) = operator_ca(&sub, uris);
        let mut config = mtls_config(&files, &ca);
        config.auth.any_zone_cert = allow_any;
        let server = Server::start(config).await;
        let mut agent = connect(server.addr, &files.ca, Some((&cert, &key)))
            .await
            .unwrap();
        let hello = agent.hello("a", None).await;
        assert_eq!(
            hello.is_ok(),
            ok,
            "{uris:?} allow_any={allow_any}: {hello:?}"
        );
        if ok {
            assert!(accepted(
                &agent.report(vec![instance("east", "web", "web-1")]).await
            ));
        } else {
            assert_eq!(
                server.metric("meshcat_reports_rejected_total", Some(("reason", "auth"))),
                1.0
            );
        }
        server.stop().await;
    }
}

fn upstream(clusters: usize, hosts_each: usize) -> Vec<wire::ReportedCluster> {
    (0..clusters)
        .map(|c| {
            wire::ReportedCluster::healthy(
                format!("up-{c}"),
                (0..hosts_each)
                    .map(|h| format!("10.0.{c}.{h}:80"))
                    .collect(),
            )
        })
        .collect()
}

#[tokio::test]
async fn an_instance_over_a_bound_is_refused_alone_and_the_rest_of_its_report_applies() {
    let dir = tempfile::tempdir().unwrap();
    let (files, config) = token_config(dir.path(), "tok-a zone-a\ntok-b zone-b\n");
    let mut config = config;
    config.limits.max_upstream_clusters = 3;
    config.limits.max_upstream_hosts = 4;
    let server = Server::start(config).await;
    let rejected =
        |reason| server.metric("meshcat_reports_rejected_total", Some(("reason", reason)));
    let mut a1 = connect(server.addr, &files.ca, None).await.unwrap();
    a1.hello("a-1", Some("tok-a")).await.unwrap();
    let small = || instance("zone-a", "web", "small");
    let with = |name: &str, clusters| {
        let mut r = instance("zone-a", "web", name);
        r.clusters = clusters;
        r
    };

    let wide = with("wide", upstream(4, 1));
    let crowded = with("crowded", upstream(2, 3));
    // The graph's fields count too: upstreams and listeners as clusters, the
    // clusters listeners name as hosts.
    let mut busy = instance("zone-a", "web", "busy");
    busy.upstreams = (0..4)
        .map(|c| wire::UpstreamTraffic {
            name: format!("up-{c}"),
            requests_total: 1,
            errors_total: 0,
            connect_fail_total: 0,
            p50_ms: None,
            p99_ms: None,
            tls: false,
        })
        .collect();
    let mut routed = with("routed", upstream(2, 2));
    routed.listeners = vec![wire::ListenerRoutes {
        address: "10.0.0.1:80".into(),
        clusters: vec!["up-0".into()],
    }];
    // Hosts sent without their addresses count by their number.
    let mut bare = upstream(1, 5);
    bare[0].hosts.clear();
    let bare = with("bare", bare);
    let answer = a1
        .report(vec![
            wide,
            small(),
            crowded,
            busy,
            routed,
            bare,
            with("fine", upstream(2, 2)),
        ])
        .await;
    assert!(
        matches!(answer, ServerMessage::ReportAccepted { instances: 2, .. }),
        "{answer:?}"
    );
    let refused = refusals(&answer);
    let refused: Vec<(&str, &str)> = refused
        .iter()
        .map(|(i, r)| (i.as_str(), r.as_str()))
        .collect();
    assert_eq!(
        refused,
        [
            ("wide", "too_many_upstream_clusters"),
            ("crowded", "too_many_upstream_hosts"),
            ("busy", "too_many_upstream_clusters"),
            ("routed", "too_many_upstream_hosts"),
            ("bare", "too_many_upstream_hosts"),
        ]
    );
    assert_eq!(rejected("too_many_upstream_clusters"), 2.0);
    assert_eq!(rejected("too_many_upstream_hosts"), 3.0);
    let applied: Vec<String> = server
        .sink
        .reports()
        .into_iter()
        .map(|(_, r)| r.instance)
        .collect();
    assert_eq!(applied, ["small", "fine"]);
    server.stop().await;
}

/// An instance that deltas grow, one per bounded set, and the report numbers it
/// and its neighbour have reached.
struct Grower {
    name: &'static str,
    seq: u64,
    /// The last report the aggregator applied: the base of the next delta.
    acked: u64,
}

impl Grower {
    fn whole(&mut self, f: impl FnOnce(&mut InstanceReport)) -> InstanceReport {
        self.seq += 1;
        let mut r = instance("zone-a", "web", self.name);
        r.seq = self.seq;
        f(&mut r);
        r
    }

    fn delta(&mut self, f: impl FnOnce(&mut InstanceReport, &mut wire::Delta)) -> InstanceReport {
        let mut d = wire::Delta {
            base: self.acked,
            listeners_unchanged: true,
            ..wire::Delta::default()
        };
        let mut r = self.whole(|_| {});
        f(&mut r, &mut d);
        r.delta = Some(d);
        r
    }
}

fn listeners(n: usize) -> Vec<wire::ListenerRoutes> {
    (0..n)
        .map(|i| wire::ListenerRoutes {
            address: format!("127.0.0.1:{}", 10_000 + i),
            clusters: vec![format!("route-{i}")],
        })
        .collect()
}

fn upstreams(names: std::ops::Range<usize>) -> Vec<wire::UpstreamTraffic> {
    names
        .map(|i| wire::UpstreamTraffic {
            name: format!("up-{i}"),
            requests_total: 1,
            errors_total: 0,
            connect_fail_total: 0,
            p50_ms: None,
            p99_ms: None,
            tls: false,
        })
        .collect()
}

/// Every per-instance bound holds on what the catalog keeps, not only on each
/// message: an instance that deltas grow past a bound (each delta under the bound
/// itself) is refused alone with the bound's reason, counted, the agent told in the
/// answer; what is kept of it stays as it was however many deltas follow, while its
/// neighbour on the same agent goes on being applied. Reports go over real QUIC into
/// the real live instances.
#[tokio::test]
async fn deltas_never_grow_an_instance_past_a_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (files, config) = token_config(dir.path(), "tok-a zone-a\n");
    let mut config = config;
    config.limits.max_upstream_clusters = 6;
    config.limits.max_upstream_hosts = 12;
    let rules = meshcat_aggregator::store::Rules {
        instance_ttl: Duration::from_secs(60),
        error_ratio_warning: 0.05,
        graph_window: std::time::Duration::from_secs(60),
        identity: Default::default(),
    };
    let (_store, instances) =
        meshcat_aggregator::store::Store::open(&dir.path().join("data"), rules).unwrap();
    let instances = Arc::new(instances);
    let server = Server::start_with(
        config,
        Arc::new(RecordingSink::default()),
        instances.clone(),
    )
    .await;
    let rejected =
        |reason| server.metric("meshcat_reports_rejected_total", Some(("reason", reason)));
    let mut agent = connect(server.addr, &files.ca, None).await.unwrap();
    agent.hello("a-1", Some("tok-a")).await.unwrap();
    let held = |name: &str| instances.held_size("zone-a", "web", name).unwrap();

    // The neighbour: whole once, then a steady delta in every report.
    let mut neighbour = Grower {
        name: "neighbour",
        seq: 0,
        acked: 0,
    };
    let first = neighbour.whole(|r| r.clusters = upstream(2, 1));
    assert!(accepted(&agent.report(vec![first]).await));
    neighbour.acked = neighbour.seq;
    // Sends `grower` beside the neighbour's steady delta; answers the grower's
    // refusal reason, if any. The neighbour is applied every time.
    let mut send = async |grower: InstanceReport| -> Option<String> {
        let steady = neighbour.delta(|_, _| {});
        let name = grower.instance.clone();
        let answer = agent.report(vec![grower, steady]).await;
        let refused = refusals(&answer);
        assert!(
            refused.iter().all(|(i, _)| *i == name),
            "the neighbour is refused: {refused:?}"
        );
        neighbour.acked = neighbour.seq;
        refused.into_iter().next().map(|(_, reason)| reason)
    };

    // Upstream clusters: 4, then 6 (the bound), then deltas of 1 and of 5 more.
    let mut g = Grower {
        name: "clusters",
        seq: 0,
        acked: 0,
    };
    assert_eq!(send(g.whole(|r| r.clusters = upstream(4, 1))).await, None);
    g.acked = g.seq;
    let grown = |from: usize, n: usize| -> Vec<wire::ReportedCluster> {
        (from..from + n)
            .map(|c| {
                wire::ReportedCluster::healthy(format!("up-{c}"), vec![format!("10.1.{c}.1:80")])
            })
            .collect()
    };
    assert_eq!(send(g.delta(|r, _| r.clusters = grown(4, 2))).await, None);
    g.acked = g.seq;
    assert_eq!(held("clusters").clusters, 6);
    for (from, n) in [(6, 1), (7, 5), (12, 6)] {
        let reason = send(g.delta(|r, _| r.clusters = grown(from, n))).await;
        assert_eq!(reason.as_deref(), Some("too_many_upstream_clusters"));
        assert_eq!(held("clusters").clusters, 6);
    }

    // Hosts: 4 clusters of 2 and a listener's route (9), then a cluster of 3 (12,
    // the bound), then one more host in a new cluster, and more hosts in a held one.
    let mut g = Grower {
        name: "hosts",
        seq: 0,
        acked: 0,
    };
    let whole = g.whole(|r| {
        r.clusters = upstream(4, 2);
        r.listeners = listeners(1);
    });
    assert_eq!(send(whole).await, None);
    g.acked = g.seq;
    let wide = |name: &str, hosts: usize| {
        wire::ReportedCluster::healthy(
            name.to_owned(),
            (0..hosts).map(|h| format!("10.2.0.{h}:80")).collect(),
        )
    };
    assert_eq!(
        send(g.delta(|r, _| r.clusters = vec![wide("big", 3)])).await,
        None
    );
    g.acked = g.seq;
    assert_eq!((held("hosts").cluster_hosts, held("hosts").routes), (11, 1));
    for cluster in [wide("more", 1), wide("up-0", 5)] {
        let reason = send(g.delta(|r, _| r.clusters = vec![cluster])).await;
        assert_eq!(reason.as_deref(), Some("too_many_upstream_hosts"));
        assert_eq!(held("hosts").cluster_hosts, 11);
    }
    // The listeners a delta leaves unchanged still count their routes.
    let reason = send(g.delta(|r, d| {
        r.clusters = vec![wide("up-1", 3)];
        d.listeners_unchanged = true;
    }))
    .await;
    assert_eq!(reason.as_deref(), Some("too_many_upstream_hosts"));

    // Listeners: 3, then 6 (the bound), then 7 and 20.
    let mut g = Grower {
        name: "listeners",
        seq: 0,
        acked: 0,
    };
    assert_eq!(send(g.whole(|r| r.listeners = listeners(3))).await, None);
    g.acked = g.seq;
    let relisted = |n| {
        move |r: &mut InstanceReport, d: &mut wire::Delta| {
            r.listeners = listeners(n);
            d.listeners_unchanged = false;
        }
    };
    assert_eq!(send(g.delta(relisted(6))).await, None);
    g.acked = g.seq;
    for n in [7, 20] {
        let reason = send(g.delta(relisted(n))).await;
        assert_eq!(reason.as_deref(), Some("too_many_upstream_clusters"));
        assert_eq!(held("listeners").listeners, 6);
    }

    // Upstreams with traffic: 4, then 6 (the bound), then 1 and 5 more.
    let mut g = Grower {
        name: "upstreams",
        seq: 0,
        acked: 0,
    };
    assert_eq!(send(g.whole(|r| r.upstreams = upstreams(0..4))).await, None);
    g.acked = g.seq;
    assert_eq!(
        send(g.delta(|r, _| r.upstreams = upstreams(4..6))).await,
        None
    );
    g.acked = g.seq;
    for range in [6..7, 7..12] {
        let reason = send(g.delta(|r, _| r.upstreams = upstreams(range))).await;
        assert_eq!(reason.as_deref(), Some("too_many_upstream_clusters"));
        assert_eq!(held("upstreams").upstreams, 6);
    }
    // Removing as many as it adds keeps it within the bound.
    let swap = g.delta(|r, d| {
        r.upstreams = upstreams(6..8);
        d.removed_upstreams = vec!["up-0".into(), "up-1".into()];
    });
    assert_eq!(send(swap).await, None);
    assert_eq!(held("upstreams").upstreams, 6);

    // A refused instance is sent whole next (the agent's side of a refusal): a
    // sidecar back within the bounds is applied again.
    let mut g = Grower {
        name: "clusters",
        seq: 100,
        acked: 0,
    };
    assert_eq!(send(g.whole(|r| r.clusters = upstream(3, 1))).await, None);
    assert_eq!(held("clusters").clusters, 3);

    assert_eq!(rejected("too_many_upstream_clusters"), 7.0);
    assert_eq!(rejected("too_many_upstream_hosts"), 3.0);
    let steady = instances
        .live_instance("zone-a", "web", "neighbour")
        .expect("the neighbour stays listed");
    assert_eq!(steady.seq, neighbour.acked);
    server.stop().await;
}

#[tokio::test]
async fn a_credential_is_bounded_in_instances_creation_rate_connections_and_streams() {
    let dir = tempfile::tempdir().unwrap();
    let (files, config) = token_config(dir.path(), "tok-a zone-a\ntok-b zone-b\n");
    let mut config = config;
    config.limits.max_credential_instances = 3;
    config.limits.max_new_instances_per_minute = 1;
    config.limits.max_credential_connections = 2;
    config.limits.max_credential_streams = 2;
    config.limits.instance_ttl = Duration::from_millis(400);
    let server = Server::start(config).await;
    let rejected =
        |reason| server.metric("meshcat_reports_rejected_total", Some(("reason", reason)));
    let web = |name: &str| instance("zone-a", "web", name);

    let mut a1 = connect(server.addr, &files.ca, None).await.unwrap();
    a1.hello("a-1", Some("tok-a")).await.unwrap();
    let mut a2 = connect(server.addr, &files.ca, None).await.unwrap();
    a2.hello("a-2", Some("tok-a")).await.unwrap();
    // Three instances over all the credential's connections; reporting one again
    // costs nothing.
    assert!(accepted(&a1.report(vec![web("w-1")]).await));
    assert!(accepted(&a2.report(vec![web("w-2"), web("w-3")]).await));
    assert!(accepted(&a2.report(vec![web("w-2"), web("w-3")]).await));
    let answer = a2.report(vec![web("w-3"), web("w-4")]).await;
    assert_eq!(
        refusals(&answer),
        [("w-4".to_owned(), "too_many_credential_instances".to_owned())]
    );
    assert_eq!(rejected("too_many_credential_instances"), 1.0);
    // An agent that renames its instances spends its budget: the old names count
    // until they go unreported for the TTL, and then the creation rate (one a
    // minute after the first three) holds it back.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = a2.report(vec![web("w-5")]).await;
        let reasons = refusals(&answer);
        if reasons == [("w-5".to_owned(), "instance_rate".to_owned())] {
            break;
        }
        assert_eq!(
            reasons,
            [("w-5".to_owned(), "too_many_credential_instances".to_owned())],
            "until the old names' TTL"
        );
        assert!(Instant::now() < deadline, "the old names never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Another credential has its own budget.
    let mut b = connect(server.addr, &files.ca, None).await.unwrap();
    b.hello("b-1", Some("tok-b")).await.unwrap();
    assert!(accepted(
        &b.report(vec![
            instance("zone-b", "web", "w-1"),
            instance("zone-b", "web", "w-2")
        ])
        .await
    ));

    // Two connections per credential; a reconnect replaces its own.
    let mut a3 = connect(server.addr, &files.ca, None).await.unwrap();
    let reason = a3.hello("a-3", Some("tok-a")).await.unwrap_err();
    assert!(reason.contains("too many connections"), "{reason}");
    assert_eq!(rejected("too_many_credential_connections"), 1.0);
    let mut again = connect(server.addr, &files.ca, None).await.unwrap();
    again.hello("a-1", Some("tok-a")).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), a1.conn.closed())
        .await
        .expect("the reconnect replaced the older connection");

    // Two report streams in flight per credential: two that never finish their
    // report hold both, and the next is refused while the connection lives on.
    let mut held = Vec::new();
    for _ in 0..2 {
        let (mut send, recv) = a2.conn.open_bi().await.unwrap();
        send.write_all(&1000u32.to_be_bytes()).await.unwrap();
        held.push((send, recv));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // Until the server has taken both held streams, a report still finds room.
        let answer = again.report(Vec::new()).await;
        if matches!(&answer, ServerMessage::Rejected { reason } if reason.contains("report streams"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a third report stream was never refused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(rejected("too_many_credential_streams") >= 1.0);
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !accepted(&again.report(Vec::new()).await) {
        assert!(
            Instant::now() < deadline,
            "the held streams were never given back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn before_authentication_a_peer_gets_a_small_hello_and_a_bounded_slot() {
    let dir = tempfile::tempdir().unwrap();
    let files = dev(dir.path());
    let certs = Some((files.agent_cert.as_path(), files.agent_key.as_path()));
    let mut config = mtls_config(&files, &files.ca);
    config.limits.max_pending = 1;
    config.limits.max_connections = 1;
    let server = Server::start(config).await;
    let rejected =
        |reason| server.metric("meshcat_reports_rejected_total", Some(("reason", reason)));

    // Before its hello a peer has the control stream alone: a second stream waits
    // for credit the server gives only once the agent is authenticated.
    let mut big = connect(server.addr, &files.ca, certs).await.unwrap();
    let control = big
        .conn
        .open_bi()
        .now_or_never()
        .expect("the control stream opens at once")
        .unwrap();
    assert!(
        big.conn.open_bi().now_or_never().is_none(),
        "a second stream opened before the hello"
    );
    // A hello over 4 KiB is refused, though far below --max-message.
    let reason = big
        .hello_on(control, "big", Some(&"x".repeat(5000)))
        .await
        .unwrap_err();
    assert!(
        reason.contains("limit") || reason.contains("large"),
        "{reason}"
    );
    assert_eq!(rejected("too_large"), 1.0);
    tokio::time::timeout(Duration::from_secs(5), big.conn.closed())
        .await
        .expect("the refused connection is closed");
    eventually("the refused connection no longer pending", || {
        server.metric("meshcat_ingest_pending_connections", None) == 0.0
    })
    .await;

    // One connection awaiting its hello holds the only pending slot: another is
    // refused before its handshake completes.
    let mut first = connect(server.addr, &files.ca, certs).await.unwrap();
    assert_eq!(
        server.metric("meshcat_ingest_pending_connections", None),
        1.0
    );
    assert!(connect(server.addr, &files.ca, certs).await.is_err());
    assert_eq!(rejected("too_many_pending"), 1.0);
    // Authenticated, it frees the slot and takes the one connection.
    first.hello("first", None).await.unwrap();
    let mut second = connect(server.addr, &files.ca, certs).await.unwrap();
    let reason = second.hello("second", None).await.unwrap_err();
    assert!(reason.contains("too many"), "{reason}");
    assert_eq!(rejected("too_many_connections"), 1.0);
    assert!(accepted(&first.report(vec![instance("z", "c", "i")]).await));
    server.stop().await;
}

#[tokio::test]
async fn a_peer_that_never_says_hello_is_closed_by_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let files = dev(dir.path());
    let certs = Some((files.agent_cert.as_path(), files.agent_key.as_path()));
    let mut config = mtls_config(&files, &files.ca);
    config.limits.hello_timeout = Duration::from_millis(300);
    config.limits.max_pending = 1;
    let server = Server::start(config).await;
    let silent = connect(server.addr, &files.ca, certs).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), silent.conn.closed())
        .await
        .expect("the server closes a connection without hello");
    eventually("hello_timeout counted", || {
        server.metric(
            "meshcat_reports_rejected_total",
            Some(("reason", "hello_timeout")),
        ) == 1.0
    })
    .await;
    // Its pending slot is free again.
    let mut next = connect(server.addr, &files.ca, certs).await.unwrap();
    next.hello("next", None).await.unwrap();
    server.stop().await;
}
