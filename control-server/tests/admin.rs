//! The admin API of the control server and its identity issuer, called through its
//! router: the identities with their serials and validity and whether rotation
//! runs, forced rotations (all, or one secret), a certificate issued once with a
//! lifetime of its own, rotation stopped and started, 404 for an unknown secret or
//! a server without an issuer, 400 for a bad lifetime, and no key material in any
//! answer. The program itself refuses bad identity flags with exit code 64, and
//! docs/configuration.md documents every flag it offers.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use meshcat_control_server::{Ca, ControlServer, IdentitySpec, IssuerOptions, admin};
use serde_json::Value;
use tower::ServiceExt;

async fn call(server: &ControlServer, method: &str, uri: &str) -> (StatusCode, Value) {
    let response = admin::router(server.clone())
        .oneshot(
            Request::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .expect("a request"),
        )
        .await
        .expect("an answer");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    assert!(!text.contains("PRIVATE KEY"), "{uri}: {text}");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn server_with_issuer() -> anyhow::Result<ControlServer> {
    let server = ControlServer::start("127.0.0.1:0".parse()?, None).await?;
    server.start_issuer(
        Ca::generate("admin test CA", Duration::from_secs(86_400))?,
        IssuerOptions {
            lifetime: Duration::from_secs(3600),
            ..IssuerOptions::default()
        },
        vec![
            IdentitySpec::new(
                "catalog",
                ["spiffe://local/ns/local/sa/catalog", "catalog.local"],
            )?,
            IdentitySpec::new("edge", ["spiffe://local/ns/local/sa/edge"])?,
        ],
    )?;
    Ok(server)
}

#[tokio::test]
async fn identities_are_shown_rotated_and_issued_once() -> anyhow::Result<()> {
    let server = server_with_issuer().await?;
    let (status, state) = call(&server, "GET", "/identities").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(state["rotation"], true);
    assert_eq!(state["lifetimeSeconds"], 3600);
    assert_eq!(state["rotateAt"], 0.5);
    assert_eq!(state["ca"]["secret"], "ca");
    assert_eq!(state["ca"]["subject"], "admin test CA");
    let catalog = &state["identities"][0];
    assert_eq!(catalog["secret"], "catalog");
    assert_eq!(
        catalog["sans"],
        serde_json::json!(["spiffe://local/ns/local/sa/catalog", "catalog.local"])
    );
    let serial = catalog["serial"].as_str().expect("a serial").to_owned();
    assert_eq!(serial.len(), 32);
    assert!(
        serial
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    );
    assert_eq!(catalog["lifetimeSeconds"], 3600);
    assert_eq!(
        catalog["expiresAtMs"].as_u64().unwrap() - catalog["validFromMs"].as_u64().unwrap(),
        3_600_000
    );
    assert_eq!(
        catalog["rotateAfterMs"].as_u64().unwrap() - catalog["validFromMs"].as_u64().unwrap(),
        1_800_000
    );
    assert!(catalog["expiresAt"].as_str().unwrap().ends_with('Z'));
    assert_eq!(catalog["rotations"], 0);

    // One secret, forced.
    let (status, rotated) = call(&server, "POST", "/rotate/catalog").await;
    assert_eq!(status, StatusCode::OK, "{rotated}");
    assert_eq!(rotated["secret"], "catalog");
    assert_eq!(rotated["previousSerial"], serial.as_str());
    assert_ne!(rotated["serial"], serial.as_str());
    assert_eq!(rotated["version"], server.version());
    // Every secret.
    let (status, all) = call(&server, "POST", "/rotate").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(all.as_array().map(Vec::len), Some(2), "{all}");
    // Once, with a lifetime of its own.
    let (status, once) = call(&server, "POST", "/issue/edge?lifetime=90s").await;
    assert_eq!(status, StatusCode::OK, "{once}");
    assert_eq!(
        once["expiresAtMs"].as_u64().unwrap() - once["validFromMs"].as_u64().unwrap(),
        90_000
    );
    let (_, state) = call(&server, "GET", "/identities").await;
    assert_eq!(state["identities"][1]["lifetimeSeconds"], 90);
    assert_eq!(state["identities"][1]["rotations"], 2);

    // Errors.
    let (status, err) = call(&server, "POST", "/rotate/orders").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(err["error"].as_str().unwrap().contains("orders"), "{err}");
    let (status, err) = call(&server, "POST", "/issue/edge?lifetime=soon").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    let (status, err) = call(&server, "POST", "/issue/edge?lifetime=1s").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    Ok(())
}

#[tokio::test]
async fn rotation_is_stopped_and_started() -> anyhow::Result<()> {
    let server = server_with_issuer().await?;
    let (status, stopped) = call(&server, "POST", "/rotation/stop").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stopped["rotation"], false);
    assert_eq!(stopped["wasRunning"], true);
    let (_, state) = call(&server, "GET", "/identities").await;
    assert_eq!(state["rotation"], false);
    assert!(!server.issuer().expect("an issuer").rotation());
    // Forced rotation works while stopped.
    let (status, _) = call(&server, "POST", "/rotate/edge").await;
    assert_eq!(status, StatusCode::OK);
    let (status, started) = call(&server, "POST", "/rotation/start").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(started["rotation"], true);
    assert_eq!(started["wasRunning"], false);
    assert_eq!(started["rotated"], serde_json::json!([]), "nothing overdue");
    Ok(())
}

#[tokio::test]
async fn a_server_without_an_issuer_says_so() -> anyhow::Result<()> {
    let server = ControlServer::start("127.0.0.1:0".parse()?, None).await?;
    let (status, err) = call(&server, "GET", "/identities").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        err["error"]
            .as_str()
            .unwrap()
            .contains("no identity issuer")
    );
    let (status, nodes) = call(&server, "GET", "/nodes").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(nodes, serde_json::json!([]));
    Ok(())
}

#[test]
fn bad_identity_flags_exit_64() {
    for args in [
        &["--rotate-at", "1.5"][..],
        &["--identity", "catalog"],
        &["--identity-lifetime", "1s"],
        &["--identity", "ca=spiffe://local/ns/local/sa/ca"],
        &[
            "--ca-cert",
            "/nonexistent/ca.pem",
            "--ca-key",
            "/nonexistent/ca-key.pem",
        ],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_meshcat-control-server"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .expect("the program runs");
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.starts_with("meshcat-control-server: "),
            "{args:?}: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    }
}

#[test]
fn every_flag_is_documented() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_meshcat-control-server"))
        .arg("--help")
        .output()
        .expect("the program runs");
    let help = String::from_utf8_lossy(&help.stdout);
    let offered: std::collections::BTreeSet<&str> = help
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .filter_map(|l| l.split([' ', ',']).next())
        .filter(|f| !matches!(*f, "help" | "version"))
        .collect();
    assert!(offered.len() >= 13, "{offered:?}");
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md"),
    )
    .expect("docs/configuration.md");
    let section = docs
        .split("\n## ")
        .find(|s| s.starts_with("meshcat-control-server"))
        .expect("a meshcat-control-server section");
    let documented: std::collections::BTreeSet<&str> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `--")?.split('`').next())
        .collect();
    assert_eq!(offered, documented);
}
