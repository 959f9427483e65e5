//! The `meshcat-agent` binary's ops port as an operator starts it, through the
//! `MESHCAT_*` environment: off loopback without a token it warns at start and refuses
//! `PUT /logging`; with `MESHCAT_OPS_TOKEN_FILE` only the token gets through; SIGTERM
//! stops it with status 0.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_meshcat-agent");

/// A running agent binary, its ops port and the log lines it wrote before starting.
struct Running {
    child: Child,
    port: u16,
    early_log: Vec<String>,
}

/// Starts the binary with `env` (the ops port on 0.0.0.0:0, no sidecar listening)
/// and waits for its "Agent started." line, which names the bound address.
async fn start(env: &[(&str, &str)]) -> Running {
    let mut cmd = Command::new(BIN);
    cmd.env_clear()
        .env("MESHCAT_OPS_ADDR", "0.0.0.0:0")
        .env("MESHCAT_LOG_FORMAT", "json")
        // Port 1 on loopback: nothing answers, so a change that passes the guard fails
        // at the sidecar (502), distinct from the guard's 403.
        .env("MESHCAT_SIDECAR_ADMIN", "127.0.0.1:1")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("meshcat-agent starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut early_log = Vec::new();
    let port = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if v["message"] == "Agent started." {
                let ops = v["ops"].as_str().unwrap().to_owned();
                return ops.rsplit_once(':').unwrap().1.parse::<u16>().unwrap();
            }
            early_log.push(line);
        }
        panic!("the agent exited before starting: {early_log:?}");
    })
    .await
    .expect("the agent starts within 20 s");
    // Keep reading so the agent never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Running {
        child,
        port,
        early_log,
    }
}

impl Running {
    async fn put_logging(&self, token: Option<&str>) -> (u16, String) {
        let mut req = reqwest::Client::new().put(format!(
            "http://127.0.0.1:{}/logging?level=debug",
            self.port
        ));
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let body: serde_json::Value = r.json().await.unwrap_or_default();
        (status, body["code"].as_str().unwrap_or_default().to_owned())
    }

    async fn stop(mut self) {
        let pid = self.child.id().unwrap().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .unwrap();
        assert!(sent.success());
        let status = tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .expect("the agent stops within 5 s of SIGTERM")
            .unwrap();
        assert_eq!(status.code(), Some(0));
    }
}

#[tokio::test]
async fn off_loopback_without_a_token_put_logging_is_refused_and_said_at_start() {
    let agent = start(&[]).await;
    assert!(
        agent
            .early_log
            .iter()
            .any(|l| l.contains("WARN") && l.contains("PUT /logging is refused")),
        "{:?}",
        agent.early_log
    );
    assert_eq!(
        agent.put_logging(None).await,
        (403, "writes_disabled".into())
    );
    assert_eq!(agent.put_logging(Some("guess")).await.0, 403);
    agent.stop().await;
}

#[tokio::test]
async fn with_an_ops_token_file_only_its_token_passes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ops-token");
    std::fs::write(&file, "0123456789abcdef\n").unwrap();
    let agent = start(&[("MESHCAT_OPS_TOKEN_FILE", file.to_str().unwrap())]).await;
    assert!(
        !agent
            .early_log
            .iter()
            .any(|l| l.contains("PUT /logging is refused")),
        "{:?}",
        agent.early_log
    );
    assert_eq!(agent.put_logging(None).await, (403, "forbidden".into()));
    assert_eq!(
        agent.put_logging(Some("0123456789abcde")).await,
        (403, "forbidden".into())
    );
    // The right token passes the guard; the (absent) sidecar is what fails then.
    assert_eq!(
        agent.put_logging(Some("0123456789abcdef")).await,
        (502, "sidecar_unavailable".into())
    );
    agent.stop().await;
}

/// Over raw TCP: the ops listener closes a connection that sends nothing and one that
/// sends half a request head once `MESHCAT_HEADER_TIMEOUT` has passed, and serves a
/// whole request as before.
#[tokio::test]
async fn the_ops_port_closes_connections_without_a_whole_head_in_time() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let agent = start(&[("MESHCAT_HEADER_TIMEOUT", "1s")]).await;
    let addr = format!("127.0.0.1:{}", agent.port);
    let mut silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut half = tokio::net::TcpStream::connect(&addr).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    // The bound is the test's patience, far past the 1 s timeout; the connections
    // end (EOF or reset) before it.
    for (what, conn) in [("silent", &mut silent), ("half a head", &mut half)] {
        let mut buf = [0u8; 1024];
        let ended = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "a {what} connection stayed open");
    }
    let mut whole = tokio::net::TcpStream::connect(&addr).await.unwrap();
    whole
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    whole.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    agent.stop().await;
}
