//! Tests of the real `meshcat-aggregator` binary: the command line (exit 64 on a bad
//! value, `--help`, environment twins), clean stop on SIGTERM, and durability of
//! acknowledged writes across SIGKILL.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_meshcat-aggregator");

/// A running aggregator process, killed when dropped.
struct Proc {
    child: Child,
    api: SocketAddr,
    ops: SocketAddr,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn command(data_dir: &Path) -> Command {
    let mut c = strict_command(data_dir);
    // These tests write without a token; the default refuses that.
    c.arg("--allow-anonymous-writes");
    c
}

/// The command line with the production defaults for writes.
fn strict_command(data_dir: &Path) -> Command {
    command_at(data_dir, "127.0.0.1:0")
}

/// The command line with the API on `api`.
fn command_at(data_dir: &Path, api: &str) -> Command {
    command_in(Command::new(BIN), data_dir, api)
}

/// The aggregator's arguments and environment on `c`, which runs the binary (itself,
/// or a program that runs it).
fn command_in(mut c: Command, data_dir: &Path, api: &str) -> Command {
    c.args(["serve", "--api-addr", api, "--ops-addr", "127.0.0.1:0"])
        .args([
            "--quic-addr",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--data-dir",
        ])
        .arg(data_dir)
        .env_remove("RUST_LOG")
        .env_remove("MESHCAT_ALLOW_ANONYMOUS_WRITES")
        .env_remove("MESHCAT_DEV")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// Starts the binary and reads the bound addresses from its JSON log.
fn spawn(data_dir: &Path) -> Proc {
    spawn_with(data_dir, &[])
}

fn spawn_with(data_dir: &Path, extra: &[&str]) -> Proc {
    spawn_logged(command(data_dir), extra).0
}

/// Starts `cmd` with `extra` flags; answers the process and the log lines from the
/// first one.
fn spawn_logged(cmd: Command, extra: &[&str]) -> (Proc, Vec<Value>) {
    let (p, lines, _) = spawn_watched(cmd, extra);
    (p, lines)
}

/// Like [`spawn_logged`], with the log lines that follow.
fn spawn_watched(mut cmd: Command, extra: &[&str]) -> (Proc, Vec<Value>, mpsc::Receiver<Value>) {
    let mut child = cmd.args(extra).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(&line)
                && tx.send(v).is_err()
            {
                // Keep draining so the child never blocks on a full pipe.
                continue;
            }
        }
    });
    let (mut api, mut ops) = (None, None);
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while api.is_none() || ops.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let v = rx
            .recv_timeout(left)
            .expect("aggregator did not log its addresses");
        lines.push(v.clone());
        if let Some(a) = v["api"].as_str() {
            api = a.parse().ok();
        }
        if let Some(o) = v["ops"].as_str() {
            ops = o.parse().ok();
        }
    }
    (
        Proc {
            child,
            api: api.unwrap(),
            ops: ops.unwrap(),
        },
        lines,
        rx,
    )
}

#[test]
fn bad_values_exit_64_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    for (args, env) in [
        (vec!["--instance-ttl", "soon"], None),
        (vec!["--error-ratio-warning", "7"], None),
        (vec!["--max-body", "lots"], None),
        (vec!["--api-addr", "not-an-address"], None),
        (vec!["--log-format", "xml"], None),
        (vec!["--no-such-flag"], None),
        (vec!["--write-token-file", "/nonexistent/token"], None),
        (vec!["--tls-cert", "/etc/hostname"], None),
        (vec![], Some(("MESHCAT_INSTANCE_TTL", "forever"))),
        (vec![], Some(("MESHCAT_OPS_ADDR", "nowhere"))),
    ] {
        let mut c = Command::new(BIN);
        c.args(&args).arg("--data-dir").arg(dir.path());
        if let Some((k, v)) = env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?} {env:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("error:"), "{stderr}");
    }
}

#[test]
fn help_documents_every_flag_with_its_environment_twin() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "api-addr",
        "quic-addr",
        "ops-addr",
        "data-dir",
        "write-token-file",
        "read-token-file",
        "instance-ttl",
        "error-ratio-warning",
        "tls-cert",
        "tls-key",
        "client-ca",
        "agent-token-file",
        "dev",
        "max-body",
        "header-timeout",
        "max-connections",
        "log-format",
    ] {
        assert!(help.contains(&format!("--{flag}")), "--{flag} missing");
        let env = format!("MESHCAT_{}", flag.to_uppercase().replace('-', "_"));
        assert!(help.contains(&env), "{env} missing");
    }
    let out = Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
}

#[tokio::test]
async fn sigterm_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let (mut p, _, log) = spawn_watched(command(dir.path()), &[]);
    let http = reqwest::Client::new();
    let ready = http
        .get(format!("http://{}/readyz", p.ops))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    // An open event stream ends with the process; it does not hold the drain.
    let mut events = http
        .get(format!("http://{}/events", p.api))
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), StatusCode::OK);
    let ok = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(status) = p.child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0));
            break;
        }
        assert!(Instant::now() < deadline, "still running 5 s after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The stream ended cleanly (no error, no keep-alive comment in the meantime) ...
    assert_eq!(events.chunk().await.unwrap(), None);
    // ... and every request finished within the drain. The process has exited, so
    // its log ends: this reads every line to the end.
    let late: Vec<Value> = log
        .iter()
        .filter(|v| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.contains("did not finish in time"))
        })
        .collect();
    assert!(late.is_empty(), "{late:?}");
}

/// What happened to one write of the burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Acked,
    Refused,
    Unknown,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let p = spawn(dir.path());
    let base = format!("http://{}", p.api);
    let http = reqwest::Client::new();
    let res = http
        .post(format!("{base}/zones"))
        .json(&json!({"zoneName": "z", "serverAddress": "cp:50000"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    // Clusters the burst deletes.
    for i in 0..20 {
        let res = http
            .post(format!("{base}/clusters"))
            .json(&json!({"clusterName": format!("old-{i}"), "zoneName": "z", "name": "old"}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
    }

    // A burst of concurrent creates and deletes; SIGKILL lands while it runs.
    const CREATES: usize = 300;
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut tasks = Vec::new();
    for i in 0..CREATES {
        let (http, base, done) = (http.clone(), base.clone(), done_tx.clone());
        tasks.push(tokio::spawn(async move {
            let res = http
                .post(format!("{base}/clusters"))
                .json(&json!({"clusterName": format!("new-{i}"), "zoneName": "z", "name": "new"}))
                .send()
                .await;
            let outcome = match res {
                Ok(r) if r.status() == StatusCode::CREATED => Outcome::Acked,
                Ok(r) if r.status().is_client_error() => Outcome::Refused,
                _ => Outcome::Unknown,
            };
            let _ = done.send(());
            (format!("new-{i}"), outcome, true)
        }));
    }
    for i in 0..20 {
        let (http, base, done) = (http.clone(), base.clone(), done_tx.clone());
        tasks.push(tokio::spawn(async move {
            let res = http
                .delete(format!("{base}/clusters/old-{i}?zoneName=z"))
                .send()
                .await;
            let outcome = match res {
                Ok(r) if r.status() == StatusCode::OK => Outcome::Acked,
                Ok(r) if r.status().is_client_error() => Outcome::Refused,
                _ => Outcome::Unknown,
            };
            let _ = done.send(());
            (format!("old-{i}"), outcome, false)
        }));
    }
    drop(done_tx);
    // Kill once a third of the burst has its answer, with the rest in flight.
    for _ in 0..(CREATES + 20) / 3 {
        done_rx.recv().await.unwrap();
    }
    let mut p = p;
    p.child.kill().unwrap();
    p.child.wait().unwrap();

    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let acked = results.iter().filter(|r| r.1 == Outcome::Acked).count();
    let unknown = results.iter().filter(|r| r.1 == Outcome::Unknown).count();
    eprintln!("burst: {acked} acknowledged, {unknown} without an answer");
    assert!(
        acked >= (CREATES + 20) / 3,
        "only {acked} writes were acknowledged"
    );

    let p2 = spawn(dir.path());
    let res = http
        .get(format!("http://{}/clusters", p2.api))
        .send()
        .await
        .unwrap();
    let present: BTreeSet<String> = res
        .json::<Vec<Value>>()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c["clusterName"].as_str().unwrap().to_owned())
        .collect();
    for (name, outcome, is_create) in &results {
        match (outcome, is_create) {
            (Outcome::Acked, true) => assert!(present.contains(name), "acknowledged {name} lost"),
            (Outcome::Acked, false) => assert!(
                !present.contains(name),
                "acknowledged delete of {name} lost"
            ),
            (Outcome::Refused, true) => assert!(!present.contains(name), "refused {name} stored"),
            (Outcome::Refused, false) => {
                assert!(present.contains(name), "refused delete of {name} applied")
            }
            (Outcome::Unknown, _) => {}
        }
    }
    // Nothing that was never written.
    for name in &present {
        assert!(
            results.iter().any(|r| &r.0 == name),
            "{name} was never written"
        );
    }
    let z = http
        .get(format!("http://{}/zones/z", p2.api))
        .send()
        .await
        .unwrap();
    assert_eq!(z.status(), StatusCode::OK);
}

#[tokio::test]
async fn token_files_are_read_and_trimmed() {
    let dir = tempfile::tempdir().unwrap();
    let write = dir.path().join("write-token");
    let read = dir.path().join("read-token");
    std::fs::write(&write, "  w-token\n").unwrap();
    std::fs::write(&read, "r-token\n\n").unwrap();
    let p = spawn_with(
        &dir.path().join("data"),
        &[
            "--write-token-file",
            write.to_str().unwrap(),
            "--read-token-file",
            read.to_str().unwrap(),
        ],
    );
    let http = reqwest::Client::new();
    let zones = format!("http://{}/zones", p.api);
    let body = json!({"zoneName": "z", "serverAddress": "cp:1"});
    let res = http.post(&zones).json(&body).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = http
        .post(&zones)
        .bearer_auth("w-token")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let res = http
        .post(format!("http://{}/clusters", p.api))
        .bearer_auth("w-token")
        .json(&json!({"clusterName": "c", "zoneName": "z", "name": "C"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let list = |token: Option<&'static str>| {
        let mut r = http.get(format!("http://{}/clusters", p.api));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    let v: Value = list(None).await.unwrap().json().await.unwrap();
    assert_eq!(v[0]["authorized"], false);
    let v: Value = list(Some("r-token")).await.unwrap().json().await.unwrap();
    assert_eq!(v[0]["authorized"], true);
}

fn warned(lines: &[Value], needle: &str) -> bool {
    lines
        .iter()
        .any(|l| l["level"] == "WARN" && l["message"].as_str().is_some_and(|m| m.contains(needle)))
}

#[tokio::test]
async fn without_a_write_token_writes_are_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let (p, lines) = spawn_logged(strict_command(&dir.path().join("data")), &[]);
    assert!(!warned(&lines, "anonymous"), "{lines:?}");
    let http = reqwest::Client::new();
    let api = format!("http://{}", p.api);
    let writes = [
        http.post(format!("{api}/zones"))
            .json(&json!({"zoneName": "z", "serverAddress": "cp:1"})),
        http.post(format!("{api}/clusters"))
            .json(&json!({"clusterName": "c", "zoneName": "z", "name": "C"})),
        http.delete(format!("{api}/zones/z")),
        http.put(format!("{api}/zones/z/clusters/c/logging"))
            .json(&json!({"level": "debug"})),
        http.post(format!("{api}/zones/z/clusters/c/debug-window"))
            .json(&json!({"seconds": 30})),
        http.get(format!(
            "{api}/diagnose/c?zoneName=z&symptom=no_healthy_upstream&debugSeconds=30"
        )),
    ];
    for req in writes {
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), StatusCode::FORBIDDEN);
        let v: Value = res.json().await.unwrap();
        assert_eq!(v["code"], "writes_disabled", "{v}");
    }
    // Reads stay open.
    let res = http.get(format!("{api}/zones")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    drop(p);

    let (p, lines) = spawn_logged(
        strict_command(&dir.path().join("data")),
        &["--allow-anonymous-writes"],
    );
    assert!(warned(&lines, "--allow-anonymous-writes"), "{lines:?}");
    let res = http
        .post(format!("http://{}/zones", p.api))
        .json(&json!({"zoneName": "z", "serverAddress": "cp:1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn dev_warns_about_a_listener_open_beyond_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (p, lines) = spawn_logged(strict_command(&data), &["--dev"]);
    assert!(!warned(&lines, "open beyond this machine"), "{lines:?}");
    // --dev keeps writes open for the quick start.
    let res = reqwest::Client::new()
        .post(format!("http://{}/zones", p.api))
        .json(&json!({"zoneName": "z", "serverAddress": "cp:1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    drop(p);
    let (_p, lines) = spawn_logged(command_at(&data, "0.0.0.0:0"), &["--dev"]);
    assert!(
        lines.iter().any(|l| l["level"] == "WARN"
            && l["listener"] == "api"
            && l["message"]
                .as_str()
                .is_some_and(|m| m.contains("open beyond this machine"))),
        "{lines:?}"
    );
}

#[test]
fn dev_listeners_default_to_loopback_in_help() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("127.0.0.1:9080 with --dev"), "{help}");
}

/// Sends `head` (and nothing more) on a new connection to `addr`.
async fn half_request(addr: SocketAddr, head: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp
}

/// Reads an HTTP/1.1 answer until the server closes; answers (status, body).
async fn read_answer(tcp: &mut (impl tokio::io::AsyncRead + Unpin)) -> (u16, String) {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), tcp.read_to_end(&mut out))
        .await
        .expect("an answer")
        .unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

const SLOW_POST: &str = "POST /zones HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{\"zoneName";

#[tokio::test]
async fn a_request_past_its_time_limit_answers_503_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let p = spawn_with(
        &dir.path().join("data"),
        &["--api-request-timeout", "300ms"],
    );
    // A body that never completes holds the request until the time limit.
    let mut tcp = half_request(p.api, SLOW_POST).await;
    let (status, body) = read_answer(&mut tcp).await;
    assert_eq!(status, 503, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["code"], "timeout");

    // A blocking query is bounded by its own wait, not by the time limit: it answers
    // 200 with the unchanged index after a wait longer than the limit.
    let zones = format!("http://{}/zones", p.api);
    let res = reqwest::get(&zones).await.unwrap();
    let index = res.headers()["x-meshcat-index"]
        .to_str()
        .unwrap()
        .to_owned();
    let res = reqwest::get(format!("{zones}?index={index}&wait=1s"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-meshcat-index"].to_str().unwrap(), index);
}

#[tokio::test]
async fn requests_over_the_concurrency_limit_answer_503_overloaded() {
    use futures::future::{Either, select};
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let p = spawn_with(&dir.path().join("data"), &["--api-max-concurrency", "1"]);
    // Two requests whose bodies do not complete: whichever arrives first holds the
    // only permit until its body ends, so the other is answered 503 at once.
    let (ra, mut wa) = half_request(p.api, SLOW_POST).await.into_split();
    let (rb, mut wb) = half_request(p.api, SLOW_POST).await.into_split();
    let answer = |mut r: tokio::net::tcp::OwnedReadHalf| async move { read_answer(&mut r).await };
    let (refused, holder, holder_write) =
        match select(Box::pin(answer(ra)), Box::pin(answer(rb))).await {
            Either::Left((a, b)) => (a, b, &mut wb),
            Either::Right((b, a)) => (b, a, &mut wa),
        };
    assert_eq!(refused.0, 503, "{refused:?}");
    let v: Value = serde_json::from_str(&refused.1).unwrap();
    assert_eq!(v["code"], "overloaded");
    // Finished, the holder is served and gives the permit back.
    let rest = format!("{:<90}", "\":\"z\",\"serverAddress\":\"cp:1\"}");
    holder_write.write_all(rest.as_bytes()).await.unwrap();
    let (status, body) = holder.await;
    assert_eq!(status, 201, "{body}");
    let res = reqwest::get(format!("http://{}/zones", p.api))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn the_api_is_served_over_tls_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let files = meshcat_common::tls::dev_setup(&dir.path().join("certs")).unwrap();
    let p = spawn_with(
        &dir.path().join("data"),
        &[
            "--api-tls-cert",
            files.server_cert.to_str().unwrap(),
            "--api-tls-key",
            files.server_key.to_str().unwrap(),
        ],
    );
    meshcat_common::tls::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    for c in meshcat_common::tls::load_certs(&files.ca).unwrap() {
        roots.add(c).unwrap();
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(p.api).await.unwrap();
    let mut tls = connector
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    {
        use tokio::io::AsyncWriteExt;
        tls.write_all(b"GET /zones HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
    }
    let (status, body) = read_answer(&mut tls).await;
    assert_eq!((status, body.as_str()), (200, "[]"));
    // Plain HTTP on the TLS port gets no answer.
    let plain = reqwest::Client::new()
        .get(format!("http://{}/zones", p.api))
        .timeout(Duration::from_secs(15))
        .send()
        .await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());
}

// ---- HTTP listeners: header timeout, connection bound, resource errors ------------

/// Whether the peer closes `s` (end of stream or reset) before `deadline`; whatever
/// it sends first is read and dropped.
fn closed_by_peer(s: &mut TcpStream, deadline: Duration) -> bool {
    let end = Instant::now() + deadline;
    let mut buf = [0u8; 4096];
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

/// Sends one whole request on a new connection and reads the answer's status line.
fn status_line(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.lines().next().unwrap_or_default().to_owned()
}

/// Over raw TCP: a connection that sends nothing, and one that sends half a request
/// head, are both closed by the header timeout, on the API and on the ops port; a
/// whole request is served as before.
#[test]
fn every_http_listener_closes_a_connection_without_a_whole_head_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let p = spawn_with(dir.path(), &["--header-timeout", "1s"]);
    for (addr, path) in [(p.api, "/summary"), (p.ops, "/healthz")] {
        let mut silent = TcpStream::connect(addr).unwrap();
        let mut half = TcpStream::connect(addr).unwrap();
        half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .unwrap();
        // The bound is the test's patience, far past the 1 s timeout.
        assert!(
            closed_by_peer(&mut silent, Duration::from_secs(20)),
            "{addr}: a silent connection stayed open"
        );
        assert!(
            closed_by_peer(&mut half, Duration::from_secs(20)),
            "{addr}: a half-sent head stayed open"
        );
        assert_eq!(status_line(addr, path), "HTTP/1.1 200 OK", "{addr}");
    }
}

/// With `--max-connections 2` and two connections held open, a third is not served
/// until one of them ends; then it is, and the listener goes on.
#[test]
fn past_max_connections_a_new_connection_waits_until_one_ends() {
    let dir = tempfile::tempdir().unwrap();
    let p = spawn_with(
        dir.path(),
        &["--max-connections", "2", "--header-timeout", "60s"],
    );
    let first = TcpStream::connect(p.api).unwrap();
    let second = TcpStream::connect(p.api).unwrap();
    let mut third = TcpStream::connect(p.api).unwrap();
    third
        .write_all(b"GET /summary HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    third
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 64];
    let early = third.read(&mut buf);
    assert!(
        matches!(&early, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "the third connection was served past the bound: {early:?}"
    );
    drop(first);
    third
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut answer = buf[..0].to_vec();
    third.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    drop(second);
    assert_eq!(status_line(p.api, "/summary"), "HTTP/1.1 200 OK");
}

/// CPU time (user and system) the process has used.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // Linux reports these in clock ticks of 1/100 s on every common configuration.
    Duration::from_millis(ticks * 10)
}

/// Run under a descriptor limit of 64, the aggregator runs out of descriptors when
/// many clients connect at once. Its accept loop then pauses instead of spinning on
/// the error (it uses next to no CPU while the shortage lasts), says so once, and
/// serves again once the connections are gone.
#[test]
fn a_listener_out_of_descriptors_pauses_and_serves_again_afterwards() {
    let dir = tempfile::tempdir().unwrap();
    let mut prlimit = Command::new("prlimit");
    prlimit.args(["--nofile=64:64", "--", BIN]);
    let limited = command_in(prlimit, dir.path(), "127.0.0.1:0");
    let (p, _, log) = spawn_watched(limited, &["--header-timeout", "60s"]);
    let mut held: Vec<TcpStream> = (0..150)
        .map(|_| TcpStream::connect(p.api).unwrap())
        .collect();
    // The shortage is logged once it happens.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = log
            .recv_timeout(left)
            .expect("no accept failure was logged");
        if line["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Accept failed"))
        {
            break;
        }
    }
    let pid = p.child.id();
    let before = cpu_time(pid);
    let window = Instant::now();
    // A measuring window, not a wait for anything: the shortage lasts throughout.
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_time(pid) - before;
    let elapsed = window.elapsed();
    assert!(
        used < elapsed / 5,
        "the accept loop used {used:?} of CPU in {elapsed:?} while out of descriptors"
    );
    held.clear();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let line = status_line(p.api, "/summary");
        if line == "HTTP/1.1 200 OK" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the listener did not serve again: {line:?}"
        );
    }
}
