//! The `meshcat-agent` binary, started with `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`
//! (and their lower-case forms) naming a local listener that counts the connections
//! it gets, scrapes a real Envoy 1.40 directly: the scrape succeeds and the proxy
//! never sees a connection.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_meshcat-agent");
const DEADLINE: Duration = Duration::from_secs(20);

fn envoy_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("MESHCAT_ENVOY").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/envoy.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/envoy.sh");
    assert!(
        out.status.success(),
        "scripts/envoy.sh could not install Envoy"
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// A real Envoy with only its admin API, under a thread that lives as long as this
/// value (Envoy exits when its spawning thread does: `PR_SET_PDEATHSIG`).
struct Envoy {
    admin: String,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Envoy {
    fn start() -> Envoy {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("bootstrap.yaml");
        std::fs::write(
            &config,
            "admin:\n  address:\n    socket_address: { address: 127.0.0.1, port_value: 0 }\n",
        )
        .unwrap();
        let addr_file = dir.path().join("admin-address");
        let out = std::fs::File::create(dir.path().join("envoy.out")).unwrap();
        // A port the kernel just handed out is a base id no other Envoy here uses.
        let base_id = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cmd = std::process::Command::new(envoy_binary());
        cmd.arg("-c")
            .arg(&config)
            .arg("--admin-address-path")
            .arg(&addr_file)
            .arg("--base-id")
            .arg(base_id.to_string())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let (spawned_tx, spawned_rx) = mpsc::channel();
        let thread = std::thread::spawn(move || match cmd.spawn() {
            Ok(mut child) => {
                let _ = spawned_tx.send(Ok(()));
                let _ = stop_rx.recv();
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_file(format!(
                    "/dev/shm/envoy_shared_memory_{}",
                    u32::from(base_id) * 10
                ));
            }
            Err(e) => {
                let _ = spawned_tx.send(Err(e));
            }
        });
        spawned_rx.recv().unwrap().expect("spawn envoy");
        let deadline = Instant::now() + Duration::from_secs(30);
        let admin = loop {
            if let Ok(a) = std::fs::read_to_string(&addr_file)
                && !a.trim().is_empty()
            {
                break a.trim().to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "envoy did not start: {}",
                std::fs::read_to_string(dir.path().join("envoy.out")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Envoy {
            admin,
            stop: Some(stop_tx),
            thread: Some(thread),
            _dir: dir,
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

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
    let envoy = Envoy::start();
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
