//! The test control server's identity issuer with real Envoys: a service sidecar
//! whose inbound listener takes its certificate and CA over SDS (state of the
//! world) and an edge whose CDS cluster presents its own certificate and checks
//! the service's SPIFFE id (Delta xDS). `/certs` shows the issued serials as
//! `<inline>`, the config dump names each secret with its version, a forced
//! rotation reaches the sidecar, a SAN matcher that does not match fails the hop
//! with 503 `UF`; with a short lifetime, rotation replaces certificates on
//! schedule, a stopped rotation lets one expire (Envoy serves it, a new handshake
//! through the edge fails), and a started one replaces it.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use meshcat_control_server::{
    Ca, CaSpec, ClusterSpec, ControlServer, EndpointSpec, IdentityIssuer, IdentitySpec,
    IssuerOptions, MeshSpec, SanMatcherSpec, SanType, StringMatch, UpstreamTlsSpec,
};
use meshcat_tests::identity::{
    active_secrets, certs, http_listener, start_mtls_sidecar, wait_chain_serial,
};
use meshcat_tests::xds::{XdsBootstrap, XdsEnvoy};
use meshcat_tests::{Upstream, wait_for};

const WAIT: Duration = Duration::from_secs(20);
const SVC_URI: &str = "spiffe://test/ns/test/sa/svc";
const EDGE_URI: &str = "spiffe://test/ns/test/sa/edge";

fn identities() -> Vec<IdentitySpec> {
    vec![
        IdentitySpec::new("svc", [SVC_URI, "svc.test"]).unwrap(),
        IdentitySpec::new("edge", [EDGE_URI, "edge.test"]).unwrap(),
    ]
}

fn options(lifetime: Duration) -> IssuerOptions {
    IssuerOptions {
        lifetime,
        ..IssuerOptions::default()
    }
}

/// The service sidecar `svc-1`: mTLS with certificate `svc` and CA `ca` over SDS.
async fn service_sidecar(
    server: &ControlServer,
    upstream: SocketAddr,
    dir: &Path,
    delta: bool,
) -> anyhow::Result<(XdsEnvoy, SocketAddr)> {
    let boot = XdsBootstrap {
        delta,
        ..XdsBootstrap::new("svc-1", "svc", server.local_addr())
    };
    start_mtls_sidecar(boot, ("svc", "ca"), upstream, &dir.join("svc-access.log")).await
}

/// The mesh: cluster `svc` at `addr`, over TLS with `tls`.
fn mesh(addr: SocketAddr, tls: UpstreamTlsSpec) -> MeshSpec {
    MeshSpec {
        clusters: vec![
            ClusterSpec::new("svc", vec![EndpointSpec::from(addr)])
                .with_tls(tls)
                .for_node_clusters(&["edge"]),
        ],
        listeners: vec![],
    }
}

/// GET `url`: the status and the body.
async fn get(url: &str) -> Option<(u16, String)> {
    let response = reqwest::get(url).await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.ok()?))
}

async fn wait_status(url: &str, want: u16) -> anyhow::Result<String> {
    wait_for(&format!("{url} to answer {want}"), WAIT, || async {
        get(url)
            .await
            .filter(|(s, _)| *s == want)
            .map(|(_, body)| body)
    })
    .await
}

async fn wait_serial(envoy: &XdsEnvoy, serial: &str) -> anyhow::Result<()> {
    wait_chain_serial(envoy, serial, WAIT).await
}

fn current(issuer: &IdentityIssuer, secret: &str) -> meshcat_control_server::IdentityState {
    issuer.identity(secret).expect("a declared identity")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mtls_hop_takes_its_certificates_over_sds_and_follows_rotation() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server = ControlServer::start("127.0.0.1:0".parse()?, None).await?;
    let ca = Ca::generate("test mesh CA", Duration::from_secs(86_400))?;
    let issuer = server.start_issuer(ca, options(Duration::from_secs(3600)), identities())?;
    let upstream = Upstream::start().await?;
    let (svc, svc_addr) = service_sidecar(&server, upstream.addr, dir.path(), false).await?;
    server.set(mesh(svc_addr, UpstreamTlsSpec::sds("edge", "ca", SVC_URI)));
    let edge_log = dir.path().join("edge-access.log");
    let edge = XdsEnvoy::start(&XdsBootstrap {
        delta: true,
        static_listeners: vec![http_listener("edge", "svc", None, &edge_log)],
        ..XdsBootstrap::new("edge-1", "edge", server.local_addr())
    })
    .await?;
    let edge_addr = wait_for("the edge listener", WAIT, || async {
        edge.listener("edge").await.ok().flatten()
    })
    .await?;
    let url = format!("http://{edge_addr}/");
    assert_eq!(wait_status(&url, 200).await?, "ok\n");

    // /certs: the issued serials, inline (over SDS), with their SANs and validity.
    let svc_id = current(&issuer, "svc");
    let shown = certs(&svc).await?;
    assert_eq!(
        shown.chain_serials(),
        BTreeSet::from([svc_id.serial.clone()])
    );
    let leaf = &shown.chain[0];
    assert_eq!(leaf.path, "<inline>");
    assert_eq!(leaf.sans, ["dns:svc.test", &format!("uri:{SVC_URI}")]);
    assert_eq!(leaf.valid_from, svc_id.valid_from);
    assert_eq!(leaf.expiration_time, svc_id.expires_at);
    let ca_serial = issuer.state().ca.serial;
    assert!(
        shown
            .ca
            .iter()
            .all(|c| c.serial == ca_serial && c.path == "<inline>"),
        "{shown:?}"
    );
    let edge_id = current(&issuer, "edge");
    assert!(
        certs(&edge)
            .await?
            .chain_serials()
            .contains(&edge_id.serial),
        "the edge presents its own certificate"
    );

    // The config dump names each secret with the version of the response that first
    // carried its content (over state of the world, a snapshot version).
    let secrets = active_secrets(&svc).await?;
    let svc_secret = secrets
        .iter()
        .find(|s| s.name == "svc")
        .expect("secret svc");
    assert_eq!(svc_secret.kind, "tls_certificate");
    let version = |v: &str| v.parse::<u64>().ok();
    assert!(
        version(&svc_secret.version_info)
            .is_some_and(|v| v >= 1 && Some(v) <= version(&server.version())),
        "{secrets:?}"
    );
    assert_eq!(svc_secret.private_key.as_deref(), Some("[redacted]"));
    assert!(
        secrets
            .iter()
            .any(|s| s.name == "ca" && s.kind == "validation_context"),
        "{secrets:?}"
    );
    let edge_secrets = active_secrets(&edge).await?;
    assert!(
        edge_secrets
            .iter()
            .any(|s| s.name == "edge" && !s.version_info.is_empty()),
        "{edge_secrets:?}"
    );

    // A forced rotation: a new serial, pushed, with a new version.
    let rotated = issuer.rotate("svc")?;
    assert_eq!(
        rotated.previous_serial.as_deref(),
        Some(svc_id.serial.as_str())
    );
    assert_ne!(rotated.serial, svc_id.serial);
    wait_serial(&svc, &rotated.serial).await?;
    let secrets = active_secrets(&svc).await?;
    let svc_secret = secrets
        .iter()
        .find(|s| s.name == "svc")
        .expect("secret svc");
    assert_eq!(svc_secret.version_info, rotated.version);
    assert_ne!(rotated.version, svc_id.version);
    assert_eq!(wait_status(&url, 200).await?, "ok\n");

    // The edge expects a SAN the service does not present: 503, UF, fail_verify_san.
    let other = "spiffe://test/ns/test/sa/other";
    server.set(mesh(svc_addr, UpstreamTlsSpec::sds("edge", "ca", other)));
    let body = wait_status(&url, 503).await?;
    assert!(body.contains("upstream connect error"), "{body}");
    wait_for("the edge's access line with UF", WAIT, || async {
        std::fs::read_to_string(&edge_log)
            .ok()?
            .lines()
            .any(|l| l.contains(" 503 UF "))
            .then_some(())
    })
    .await?;
    wait_for("cluster.svc.ssl.fail_verify_san to count", WAIT, || async {
        (edge.stat("cluster.svc.ssl.fail_verify_san").await.ok()?? > 0).then_some(())
    })
    .await?;

    // A prefix matcher with the CA inline (a plain validation context): 200 again.
    server.set(mesh(
        svc_addr,
        UpstreamTlsSpec {
            certificate_sds: Some("edge".into()),
            ca: Some(CaSpec::Pem(issuer.ca_pem())),
            match_sans: vec![SanMatcherSpec::new(
                SanType::Uri,
                StringMatch::Prefix("spiffe://test/".into()),
            )],
            sni: Some("svc.test".into()),
        },
    ));
    assert_eq!(wait_status(&url, 200).await?, "ok\n");
    assert!(svc.is_running() && edge.is_running());
    Ok(())
}

fn millis_now() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(u64::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_rotation_lets_a_certificate_expire_and_started_rotation_replaces_it()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server = ControlServer::start("127.0.0.1:0".parse()?, None).await?;
    let ca = Ca::generate("test mesh CA", Duration::from_secs(86_400))?;
    // A 4 s lifetime, replaced after 2 s.
    let issuer = server.start_issuer(ca, options(Duration::from_secs(4)), identities())?;
    let upstream = Upstream::start().await?;
    let (svc, svc_addr) = service_sidecar(&server, upstream.addr, dir.path(), true).await?;
    // An edge whose idle connections close after 300 ms: each request after a pause
    // makes a new handshake with the certificates of the moment.
    let mut cluster = mesh(svc_addr, UpstreamTlsSpec::sds("edge", "ca", SVC_URI));
    cluster.clusters[0].idle_timeout_ms = Some(300);
    server.set(cluster);
    let edge = XdsEnvoy::start(&XdsBootstrap {
        static_listeners: vec![http_listener(
            "edge",
            "svc",
            None,
            &dir.path().join("edge-access.log"),
        )],
        ..XdsBootstrap::new("edge-1", "edge", server.local_addr())
    })
    .await?;
    let edge_addr = wait_for("the edge listener", WAIT, || async {
        edge.listener("edge").await.ok().flatten()
    })
    .await?;
    let url = format!("http://{edge_addr}/");
    wait_status(&url, 200).await?;

    // Rotation on schedule: the sidecar is given a serial it did not have.
    let first = wait_for("svc to show the current serial", WAIT, || async {
        let id = current(&issuer, "svc");
        certs(&svc)
            .await
            .ok()?
            .chain_serials()
            .contains(&id.serial)
            .then_some(id)
    })
    .await?;
    let second = wait_for("a scheduled rotation of svc", WAIT, || async {
        let id = current(&issuer, "svc");
        (id.serial != first.serial).then_some(id)
    })
    .await?;
    assert!(second.rotations > first.rotations);
    assert!(
        second.valid_from_ms >= first.rotate_after_ms,
        "{first:?} {second:?}"
    );
    assert_eq!(second.lifetime_seconds, 4);
    wait_serial(&svc, &second.serial).await?;

    // Stopped: the certificate passes its rotation point and expires, unreplaced.
    assert!(issuer.stop_rotation());
    assert!(!issuer.state().rotation);
    let kept = current(&issuer, "svc");
    wait_for("the kept certificate to expire", WAIT, || async {
        (millis_now() > kept.expires_at_ms + 500).then_some(())
    })
    .await?;
    let after = current(&issuer, "svc");
    assert_eq!(after.serial, kept.serial, "no rotation while stopped");
    assert_eq!(after.rotations, kept.rotations);
    let shown = certs(&svc).await?;
    assert_eq!(shown.chain_serials(), BTreeSet::from([kept.serial.clone()]));
    assert_eq!(shown.chain[0].days_until_expiration, "0", "{shown:?}");
    // Envoy serves it still, and a new handshake refuses it.
    let body = wait_status(&url, 503).await?;
    assert!(body.contains("upstream connect error"), "{body}");
    wait_for(
        "cluster.svc.ssl.fail_verify_error to count",
        WAIT,
        || async {
            (edge
                .stat("cluster.svc.ssl.fail_verify_error")
                .await
                .ok()??
                > 0)
            .then_some(())
        },
    )
    .await?;

    // Started: the overdue certificate is replaced at once and pushed.
    let caught_up = issuer.start_rotation()?;
    let svc_rotation = caught_up
        .iter()
        .find(|r| r.secret == "svc")
        .expect("svc replaced at once");
    assert_eq!(
        svc_rotation.previous_serial.as_deref(),
        Some(kept.serial.as_str())
    );
    assert_eq!(caught_up.len(), 2, "edge was overdue too: {caught_up:?}");
    wait_serial(&svc, &svc_rotation.serial).await?;
    assert_eq!(wait_status(&url, 200).await?, "ok\n");
    Ok(())
}
