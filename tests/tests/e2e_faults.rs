//! Issue 3's fault tests with the whole aggregator and real agents: an aggregator
//! restart on the same ports and data directory, and malformed messages on the
//! ingest that are refused and counted while a real agent keeps reporting.

use std::path::Path;
use std::time::{Duration, Instant};

use meshcat_common::tls;
use meshcat_common::transport::{read_frame, write_frame};
use meshcat_common::wire::{AgentMessage, DEFAULT_MAX_MESSAGE, Envelope, Hello, ServerMessage};
use meshcat_tests::mesh::{instance_names, metric_sum};
use meshcat_tests::{Catalog, MeshAgent, Sidecar, wait_for};
use serde_json::json;

/// Report interval of the agents; the restart promise is two of them.
const INTERVAL: Duration = Duration::from_millis(500);
const TTL: Duration = Duration::from_millis(1500);
const DEADLINE: Duration = Duration::from_secs(20);
/// How long the aggregator stays down in the restart test.
const DOWNTIME: Duration = Duration::from_millis(1500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregator_restart_loses_nothing() {
    let mut catalog = Catalog::start(|c| c.store.rules.instance_ttl = TTL)
        .await
        .unwrap();
    catalog.register_zone("zone-r", "").await.unwrap();
    catalog
        .register_cluster(
            "zone-r",
            "cart",
            json!({"owner": "team-cart", "minInstances": 2}),
        )
        .await
        .unwrap();
    let a = Sidecar::start().await.unwrap();
    let b = Sidecar::start().await.unwrap();
    let _agent_a = MeshAgent::for_sidecar(&catalog, &a, "zone-r", "cart", "cart-a", "500ms")
        .await
        .unwrap();
    let _agent_b = MeshAgent::for_sidecar(&catalog, &b, "zone-r", "cart", "cart-b", "500ms")
        .await
        .unwrap();
    let before = catalog
        .wait_cluster("whole before restart", "zone-r", "cart", DEADLINE, |c| {
            c["status"] == "stable" && instance_names(c).len() == 2
        })
        .await
        .unwrap();

    let ports = (
        catalog.config.api.addr,
        catalog.config.ingest.addr,
        catalog.config.ops_addr,
    );
    catalog.stop().await.unwrap();
    // Down long enough for the agents to notice and retry in vain.
    tokio::time::sleep(DOWNTIME).await;
    catalog.resume().await.unwrap();
    let back = Instant::now();
    assert_eq!(
        (
            catalog.config.api.addr,
            catalog.config.ingest.addr,
            catalog.config.ops_addr
        ),
        ports
    );
    // Registrations come from the store at once.
    let (_, zones) = catalog.get("/zones").await.unwrap();
    assert_eq!(zones[0]["zoneName"], "zone-r", "{zones}");
    let reloaded = catalog.cluster("zone-r", "cart").await.unwrap();
    assert_eq!(reloaded["owner"], "team-cart");
    assert_eq!(reloaded["minInstances"], 2);

    // Instances come back from the agents.
    let after = catalog
        .wait_cluster("whole after restart", "zone-r", "cart", DEADLINE, |c| {
            c["status"] == "stable" && instance_names(c).len() == 2
        })
        .await
        .unwrap();
    let took = back.elapsed();
    eprintln!("catalog whole again {took:?} after the aggregator restart");
    assert!(
        took <= INTERVAL * 2,
        "catalog whole {took:?} after the restart"
    );
    assert_eq!(after["instances"], before["instances"]);
    let ops = catalog.ops_metrics().await.unwrap();
    assert_eq!(
        metric_sum(&ops, "meshcat_agents_connected", &[]),
        Some(2.0),
        "{ops}"
    );
}

/// A raw agent connection that can misbehave on purpose.
struct RawAgent {
    conn: quinn::Connection,
    _endpoint: quinn::Endpoint,
    /// Kept open: closing the control stream would end the session.
    _control: (quinn::SendStream, quinn::RecvStream),
}

impl RawAgent {
    async fn connect(catalog: &Catalog, agent_id: &str) -> RawAgent {
        let dev = catalog.data_dir().join("dev");
        let cert = dev.join("agent.pem");
        let key = dev.join("agent-key.pem");
        let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        endpoint.set_default_client_config(
            tls::client_config(&dev.join("ca.pem"), Some((Path::new(&cert), &key))).unwrap(),
        );
        let conn = endpoint
            .connect(catalog.config.ingest.addr, "localhost")
            .unwrap()
            .await
            .unwrap();
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        let hello = AgentMessage::Hello(Hello {
            agent_id: agent_id.into(),
            agent_version: "raw".into(),
            token: None,
        });
        write_frame(&mut send, &hello, DEFAULT_MAX_MESSAGE)
            .await
            .unwrap();
        let welcome = read_frame::<ServerMessage>(&mut recv, DEFAULT_MAX_MESSAGE)
            .await
            .unwrap();
        assert!(
            matches!(welcome, Some(ServerMessage::Welcome { .. })),
            "{welcome:?}"
        );
        RawAgent {
            conn,
            _endpoint: endpoint,
            _control: (send, recv),
        }
    }

    /// Sends `bytes` on a new report stream; the aggregator's answer.
    async fn send(&self, bytes: &[u8]) -> ServerMessage {
        let (mut send, mut recv) = self.conn.open_bi().await.unwrap();
        // The aggregator may stop an oversized stream before all of it is written.
        let _ = send.write_all(bytes).await;
        let _ = send.finish();
        read_frame::<ServerMessage>(&mut recv, DEFAULT_MAX_MESSAGE)
            .await
            .unwrap()
            .expect("an answer")
    }
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_refused_and_counted_while_a_real_agent_reports() {
    let catalog = Catalog::start(|c| {
        c.store.rules.instance_ttl = TTL;
        c.ingest.limits.max_message = 64 * 1024;
    })
    .await
    .unwrap();
    catalog.register_zone("zone-f", "").await.unwrap();
    catalog
        .register_cluster("zone-f", "billing", json!({"minInstances": 1}))
        .await
        .unwrap();
    let sidecar = Sidecar::start().await.unwrap();
    let agent = MeshAgent::for_sidecar(
        &catalog,
        &sidecar,
        "zone-f",
        "billing",
        "billing-1",
        "500ms",
    )
    .await
    .unwrap();
    catalog
        .wait_cluster(
            "the real agent reporting",
            "zone-f",
            "billing",
            DEADLINE,
            |c| c["status"] == "stable",
        )
        .await
        .unwrap();

    let raw = RawAgent::connect(&catalog, "raw-probe").await;
    // Over the limit: announced as 1 MiB, refused from its length prefix.
    let mut huge = (1u32 << 20).to_be_bytes().to_vec();
    huge.extend(std::iter::repeat_n(0u8, 128 * 1024));
    let answer = raw.send(&huge).await;
    assert!(
        matches!(answer, ServerMessage::Rejected { .. }),
        "{answer:?}"
    );
    // Another protocol version.
    let body = rmp_serde::to_vec(&Envelope {
        version: 99,
        message: AgentMessage::Goodbye,
    })
    .unwrap();
    let answer = raw.send(&frame(&body)).await;
    assert!(
        matches!(&answer, ServerMessage::Rejected { reason } if reason.contains("version")),
        "{answer:?}"
    );
    // Garbage bytes.
    let answer = raw.send(&frame(b"\xc1\xc1garbage")).await;
    assert!(
        matches!(answer, ServerMessage::Rejected { .. }),
        "{answer:?}"
    );

    let ops = catalog.ops_metrics().await.unwrap();
    for reason in ["too_large", "version", "decode"] {
        assert_eq!(
            metric_sum(
                &ops,
                "meshcat_reports_rejected_total",
                &[("reason", reason)]
            ),
            Some(1.0),
            "{reason}: {ops}"
        );
    }

    // The real agent keeps reporting, on the same connection.
    let received = |text: &str| metric_sum(text, "meshcat_reports_received_total", &[]);
    let now = received(&ops).unwrap();
    wait_for("more reports after the refusals", DEADLINE, || async {
        let ops = catalog.ops_metrics().await.ok()?;
        (received(&ops)? >= now + 3.0).then_some(())
    })
    .await
    .unwrap();
    let mine = agent.metrics().await.unwrap();
    assert_eq!(
        metric_sum(&mine, "meshcat_agent_connected", &[]),
        Some(1.0),
        "{mine}"
    );
    assert_eq!(
        metric_sum(&mine, "meshcat_agent_reconnects_total", &[]),
        Some(0.0),
        "{mine}"
    );
    let c = catalog.cluster("zone-f", "billing").await.unwrap();
    assert_eq!(instance_names(&c), ["billing-1"]);
    assert_eq!(c["status"], "stable");
    // The misbehaving connection survives its refused streams too.
    assert!(raw.conn.close_reason().is_none());
    agent.stop().await.unwrap();
}
