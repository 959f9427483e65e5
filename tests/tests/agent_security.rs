//! The agent's side of the security defaults (contract section 10), over real
//! sockets and against a real Envoy: `PUT /logging` on the ops port needs the ops
//! token (or a loopback listener), and the admin client never follows a redirect.

use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use meshcat_agent::AgentConfig;
use meshcat_agent::envoy::{EnvoyAdmin, EnvoyError};
use meshcat_tests::{Bootstrap, Envoy, Upstream, wait_for};
use tokio::sync::oneshot;

const DEADLINE: Duration = Duration::from_secs(20);

/// An agent (`meshcat_agent::run`) whose ops listener is bound where the test says.
struct RunningAgent {
    /// Base URL of its ops port, reached over 127.0.0.1 whatever it is bound to.
    ops: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl RunningAgent {
    async fn start(bind: &str, args: &[&str]) -> Self {
        let mut all = vec!["meshcat-agent", "--interval", "200ms"];
        all.extend_from_slice(args);
        let config = AgentConfig::try_from_args(all).unwrap();
        let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let ops = format!("http://127.0.0.1:{port}");
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(meshcat_agent::run(config, listener, async move {
            let _ = rx.await;
        }));
        Self {
            ops,
            stop: Some(tx),
            task,
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("agent stops within 5 s")
            .unwrap()
            .unwrap();
    }
}

async fn sidecar() -> (Upstream, Envoy) {
    let upstream = Upstream::start().await.unwrap();
    let envoy = Envoy::start(Bootstrap::service_sidecar(upstream.addr, None))
        .await
        .unwrap();
    (upstream, envoy)
}

/// PUTs `level` through the agent's ops port with an optional bearer token; returns
/// the status and the body's `code`.
async fn put_level(ops: &str, level: &str, token: Option<&str>) -> (StatusCode, String) {
    let mut req = reqwest::Client::new().put(format!("{ops}/logging?level={level}"));
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let r = req.send().await.unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    let code = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v["code"].as_str().map(str::to_owned))
        .unwrap_or_default();
    (status, code)
}

async fn wait_scraped(agent: &RunningAgent) {
    wait_for("GET /logging answers", DEADLINE, || async {
        let r = reqwest::get(format!("{}/logging", agent.ops)).await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_logging_on_a_non_loopback_listener_needs_the_ops_token() {
    let (_upstream, envoy) = sidecar().await;
    let admin = envoy.admin_addr();

    // Bound to every address without a token: nobody may change the sidecar.
    let open = RunningAgent::start("0.0.0.0:0", &["--sidecar-admin", &admin]).await;
    wait_scraped(&open).await;
    let (status, code) = put_level(&open.ops, "debug", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(code, "writes_disabled");
    let (status, _) = put_level(&open.ops, "debug", Some("anything")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Refused before the query is looked at.
    let (status, _) = put_level(&open.ops, "nonsense", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        envoy.uniform_log_level().await.unwrap().as_deref(),
        Some("info")
    );
    // Reading stays open.
    let r = reqwest::get(format!("{}/logging", open.ops)).await.unwrap();
    assert_eq!(r.text().await.unwrap(), "info");
    open.stop().await;

    // With an ops token, only a request carrying exactly that token changes it.
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("ops-token");
    std::fs::write(&token_file, "correct-horse-battery\n").unwrap();
    let guarded = RunningAgent::start(
        "0.0.0.0:0",
        &[
            "--sidecar-admin",
            &admin,
            "--ops-token-file",
            token_file.to_str().unwrap(),
        ],
    )
    .await;
    wait_scraped(&guarded).await;
    for bad in [
        None,
        Some("correct-horse-batter"),
        Some("correct-horse-battery-staple"),
        Some("x"),
    ] {
        let (status, code) = put_level(&guarded.ops, "debug", bad).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{bad:?}");
        assert_eq!(code, "forbidden", "{bad:?}");
    }
    assert_eq!(
        envoy.uniform_log_level().await.unwrap().as_deref(),
        Some("info")
    );
    let (status, _) = put_level(&guarded.ops, "debug", Some("correct-horse-battery")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        envoy.uniform_log_level().await.unwrap().as_deref(),
        Some("debug")
    );
    guarded.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_logging_on_loopback_with_a_token_still_needs_it() {
    let (_upstream, envoy) = sidecar().await;
    let admin = envoy.admin_addr();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("ops-token");
    std::fs::write(&token_file, "t0ken").unwrap();
    let agent = RunningAgent::start(
        "127.0.0.1:0",
        &[
            "--sidecar-admin",
            &admin,
            "--ops-token-file",
            token_file.to_str().unwrap(),
        ],
    )
    .await;
    wait_scraped(&agent).await;
    let (status, _) = put_level(&agent.ops, "warn", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = put_level(&agent.ops, "warn", Some("t0ken")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        envoy.uniform_log_level().await.unwrap().as_deref(),
        Some("warning")
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_ops_token_file_stops_the_agent_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("ops-token");
    std::fs::write(&token_file, "  \n").unwrap();
    let config = AgentConfig::try_from_args([
        "meshcat-agent",
        "--ops-token-file",
        token_file.to_str().unwrap(),
    ])
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = meshcat_agent::run(config, listener, std::future::pending())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("is empty"), "{err}");
}

/// A listener that answers every request with a redirect to `to`.
async fn redirector(to: String) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().fallback(move |uri: axum::http::Uri| {
        let to = to.clone();
        async move {
            (
                StatusCode::FOUND,
                [(header::LOCATION, format!("{to}{}", uri.path()))],
            )
                .into_response()
        }
    });
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_client_does_not_follow_redirects() {
    // Where a redirect would lead: a real server counting what reaches it.
    let elsewhere = Upstream::start().await.unwrap();
    let (addr, task) = redirector(format!("http://{}", elsewhere.addr)).await;
    let admin = EnvoyAdmin::new(&addr.to_string(), Duration::from_secs(2)).unwrap();

    let err = admin.server_info().await.unwrap_err();
    assert!(
        matches!(err, EnvoyError::Status { status: 302, .. }),
        "{err}"
    );
    let err = admin.set_envoy_level("debug").await.unwrap_err();
    assert!(
        matches!(err, EnvoyError::Status { status: 302, .. }),
        "{err}"
    );
    assert!(admin.log_level().await.is_err());
    assert_eq!(elsewhere.served(), 0, "a redirect was followed");

    // Through a running agent too: its scrapes fail, nothing reaches the other server.
    let agent = RunningAgent::start("127.0.0.1:0", &["--sidecar-admin", &addr.to_string()]).await;
    wait_for("a failed scrape", DEADLINE, || async {
        let m = reqwest::get(format!("{}/metrics", agent.ops))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        m.contains("outcome=\"error\"").then_some(())
    })
    .await
    .unwrap();
    assert_eq!(elsewhere.served(), 0, "a redirect was followed");
    agent.stop().await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_pods_report_in_their_namespace_zone_whatever_they_annotate() {
    use meshcat_tests::mesh::instance_names;
    use meshcat_tests::{Catalog, MeshAgent, Sidecar};

    let catalog = Catalog::start(|_| {}).await.unwrap();
    for zone in ["team-a", "team-b"] {
        catalog.register_zone(zone, "edge").await.unwrap();
        catalog
            .register_cluster(zone, "orders", serde_json::json!({}))
            .await
            .unwrap();
    }
    let sidecar = Sidecar::start().await.unwrap();
    let admin_port = sidecar
        .envoy
        .admin_addr()
        .rsplit_once(':')
        .unwrap()
        .1
        .to_owned();

    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("pods");
    std::fs::create_dir_all(logs.join("team-a_orders-1_u1/envoy")).unwrap();
    let pods = dir.path().join("pods.json");
    let pod = serde_json::json!({
        "metadata": {"name": "orders-1", "namespace": "team-a", "uid": "u1",
                     "labels": {"meshcat.io/scrape": "true"},
                     "annotations": {"meshcat.io/zone": "team-b", "meshcat.io/cluster": "orders",
                                     "meshcat.io/admin-port": admin_port}},
        "spec": {"containers": [{"name": "app"}, {"name": "envoy"}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1"}
    });
    std::fs::write(
        &pods,
        serde_json::json!({"kind": "List", "items": [pod]}).to_string(),
    )
    .unwrap();

    let mut args = catalog.agent_args();
    args.extend(
        [
            "--pods-file",
            pods.to_str().unwrap(),
            "--pod-log-dir",
            logs.to_str().unwrap(),
            "--interval",
            "200ms",
        ]
        .map(str::to_owned),
    );
    let agent = MeshAgent::start(&args).await.unwrap();
    catalog
        .wait_cluster("orders-1 in team-a", "team-a", "orders", DEADLINE, |c| {
            instance_names(c) == ["orders-1"]
        })
        .await
        .unwrap();
    let b = catalog.cluster("team-b", "orders").await.unwrap();
    assert!(instance_names(&b).is_empty(), "{b}");
    agent.stop().await.unwrap();
}
