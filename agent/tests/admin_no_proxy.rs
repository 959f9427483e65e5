//! The `meshcat-agent` binary, started with `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`
//! (and their lower-case forms) naming a local listener that counts the connections
//! it gets, scrapes a real Envoy 1.40 directly: the scrape succeeds and the proxy
//! never sees a connection.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_meshcat-agent");
const DEADLINE: Duration = Duration::from_secs(20);

mod support;

use support::Envoy;

/// A TCP listener standing in for a proxy: counts every connection and closes it.
async fn counting_proxy() -> (String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    let task = tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            drop(conn);
        }
    });
    (url, seen, task)
}

/// The agent binary for `admin` with every proxy variable naming `proxy`; answers
/// the child and its ops port once it has started.
async fn start_agent(admin: &str, proxy: &str) -> (Child, u16) {
    let mut cmd = Command::new(BIN);
    cmd.env_clear()
        .env("MESHCAT_OPS_ADDR", "127.0.0.1:0")
        .env("MESHCAT_LOG_FORMAT", "json")
        .env("MESHCAT_SIDECAR_ADMIN", admin)
        .env("MESHCAT_INTERVAL", "200ms");
    for var in [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        cmd.env(var, proxy);
    }
    cmd.stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("meshcat-agent starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let port = tokio::time::timeout(DEADLINE, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if v["message"] == "Agent started." {
                let ops = v["ops"].as_str().unwrap().to_owned();
                return ops.rsplit_once(':').unwrap().1.parse::<u16>().unwrap();
            }
        }
        panic!("the agent exited before starting");
    })
    .await
    .expect("the agent starts within 20 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, port)
}

/// The value of `meshcat_agent_scrapes_total` with `outcome` in `metrics`.
fn scrapes(metrics: &str, outcome: &str) -> f64 {
    let label = format!("outcome=\"{outcome}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("meshcat_agent_scrapes_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_admin_calls_ignore_proxies_named_by_the_environment() {
    let envoy = Envoy::start("info");
    let (proxy, seen, proxy_task) = counting_proxy().await;
    let (mut agent, port) = start_agent(&envoy.admin, &proxy).await;
    let ops = format!("http://127.0.0.1:{port}");
    // The test's own client talks to the agent directly.
    let client = reqwest::Client::builder().no_proxy().build().unwrap();

    // Until a scrape ends, either way; a scrape through the proxy fails at once.
    let end = Instant::now() + DEADLINE;
    let metrics = loop {
        let text = client
            .get(format!("{ops}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if scrapes(&text, "ok") + scrapes(&text, "error") > 0.0 {
            break text;
        }
        assert!(Instant::now() < end, "no scrape within {DEADLINE:?}");
        tokio::task::yield_now().await;
    };
    assert_eq!(seen.load(Ordering::SeqCst), 0, "the proxy was used");
    assert!(scrapes(&metrics, "ok") > 0.0, "{metrics}");
    assert_eq!(scrapes(&metrics, "error"), 0.0, "{metrics}");
    // A command's admin call (the log level, read through the ops port) goes
    // directly too.
    let r = client.get(format!("{ops}/logging")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "info");
    assert_eq!(seen.load(Ordering::SeqCst), 0, "the proxy was used");

    agent.start_kill().unwrap();
    agent.wait().await.unwrap();
    proxy_task.abort();
}
