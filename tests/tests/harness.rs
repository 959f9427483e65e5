//! The harness's topologies work on a real Envoy: an edge routing by prefix to a
//! service sidecar over mTLS, and the refusal of an untrusted client certificate.

use meshcat_tests::bootstrap::Tls;
use meshcat_tests::{Bootstrap, Envoy, MeshCerts, Upstream, wait_for};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_to_sidecar_over_mtls_and_an_untrusted_client() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = MeshCerts::new(dir.path(), "mesh").unwrap();
    let rogue = MeshCerts::new(dir.path(), "rogue").unwrap();
    let upstream = Upstream::start().await.unwrap();

    let server_tls = Tls::new(&mesh, mesh.identity("orders.mesh").unwrap(), None);
    let sidecar = Envoy::start(Bootstrap::service_sidecar(upstream.addr, Some(server_tls)))
        .await
        .unwrap();
    let ingress = sidecar.listener("ingress");

    let edge_tls = Tls::new(
        &mesh,
        mesh.identity("edge.mesh").unwrap(),
        Some("orders.mesh"),
    );
    let edge = Envoy::start(Bootstrap::edge_sidecar(
        &[("/orders", "orders", ingress)],
        Some(edge_tls),
    ))
    .await
    .unwrap();
    let r = reqwest::get(format!("{}/orders/1", edge.url("edge")))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "ok\n");
    let r = reqwest::get(format!("{}/nothing", edge.url("edge")))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    // A client whose certificate another CA signed fails inside the handshake.
    let rogue_tls = Tls::new(
        &mesh,
        rogue.identity("intruder.mesh").unwrap(),
        Some("orders.mesh"),
    );
    let bad_edge = Envoy::start(Bootstrap::edge_sidecar(
        &[("/", "orders", ingress)],
        Some(rogue_tls),
    ))
    .await
    .unwrap();
    let r = reqwest::get(format!("{}/orders/2", bad_edge.url("edge")))
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let stats = sidecar
        .admin_get("/stats?filter=ssl.fail_verify_error")
        .await
        .unwrap();
    assert!(
        !stats.contains(": 0") && stats.contains("fail_verify_error"),
        "{stats}"
    );

    // Access log lines carry code, flags, upstream host and path.
    let line = wait_for(
        "edge access line with UF",
        Duration::from_secs(10),
        || async {
            bad_edge
                .access_log()
                .lines()
                .find(|l| l.contains("/orders/2"))
                .map(str::to_owned)
        },
    )
    .await
    .unwrap();
    assert!(line.contains(" 503 ") && line.contains("UF"), "{line}");
    assert!(line.contains(&format!("\"{ingress}\"")), "{line}");
    assert_eq!(upstream.served(), 1);
}
