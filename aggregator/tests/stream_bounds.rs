//! Black-box tests of the bounds on long-lived requests (contract section 10), over
//! raw TCP against the real `meshcat-aggregator` binary, configured through the
//! flags' environment twins: at most `--max-event-streams` event streams, a resume
//! whose replay is larger than `--event-buffer` answered with `reset`, and `index=`
//! exempt from the concurrency limit only for a blocking query that waits.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_meshcat-aggregator");
/// How long any condition of these tests may take to come true.
const DEADLINE: Duration = Duration::from_secs(20);

/// A running aggregator process, killed when dropped.
struct Proc {
    child: Child,
    api: SocketAddr,
    ops: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the binary on loopback port 0 with `env` set and reads its addresses from
/// its JSON log.
fn spawn(env: &[(&str, &str)]) -> Proc {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new(BIN);
    c.args([
        "serve",
        "--api-addr",
        "127.0.0.1:0",
        "--ops-addr",
        "127.0.0.1:0",
    ])
    .args(["--quic-addr", "127.0.0.1:0", "--log-format", "json"])
    .arg("--allow-anonymous-writes")
    .arg("--data-dir")
    .arg(dir.path().join("data"))
    .env_remove("RUST_LOG")
    .envs(env.iter().copied())
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            // Keep draining so the child never blocks on a full pipe.
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                let _ = tx.send(v);
            }
        }
    });
    let (mut api, mut ops) = (None, None);
    let deadline = Instant::now() + DEADLINE;
    while api.is_none() || ops.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let v = rx
            .recv_timeout(left)
            .expect("the aggregator logs its addresses");
        if let Some(a) = v["api"].as_str() {
            api = a.parse().ok();
        }
        if let Some(o) = v["ops"].as_str() {
            ops = o.parse().ok();
        }
    }
    Proc {
        child,
        api: api.unwrap(),
        ops: ops.unwrap(),
        _dir: dir,
    }
}

/// A response head read off a raw connection, and the body bytes read with it.
struct Head {
    status: u16,
    head: String,
    rest: Vec<u8>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// Sends `request` (a whole request, head and body) on a new connection and reads
/// the response head.
async fn open(addr: SocketAddr, request: &str) -> (TcpStream, Head) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(request.as_bytes()).await.unwrap();
    let head = read_head(&mut conn).await;
    (conn, head)
}

async fn read_head(conn: &mut TcpStream) -> Head {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = tokio::time::timeout(DEADLINE, async {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                return end;
            }
            let n = conn.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed before the response head");
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .expect("a response head");
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap();
    Head {
        status,
        head,
        rest: buf[end + 4..].to_vec(),
    }
}

/// `GET path` on a new connection.
async fn get(addr: SocketAddr, path: &str, headers: &str) -> (TcpStream, Head) {
    open(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: meshcat\r\n{headers}\r\n"),
    )
    .await
}

/// Reads a response body of `Content-Length` bytes.
async fn read_body(conn: &mut TcpStream, head: Head) -> Value {
    let len: usize = head.header("content-length").unwrap().parse().unwrap();
    let mut body = head.rest;
    let mut chunk = [0u8; 4096];
    tokio::time::timeout(DEADLINE, async {
        while body.len() < len {
            let n = conn.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed before the body's end");
            body.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .expect("the body");
    serde_json::from_slice(&body).unwrap()
}

/// Reads a stream's (chunked) body until `done` holds for what was read so far, as
/// text, chunk framing included; answers it.
async fn read_until(
    conn: &mut TcpStream,
    mut seen: Vec<u8>,
    done: impl Fn(&str) -> bool,
) -> String {
    let mut chunk = [0u8; 16384];
    tokio::time::timeout(DEADLINE, async {
        loop {
            let text = String::from_utf8_lossy(&seen).into_owned();
            if done(&text) {
                return text;
            }
            let n = conn.read(&mut chunk).await.unwrap();
            if n == 0 {
                return text;
            }
            seen.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .expect("the stream went on")
}

/// The last chunk of a chunked body: the stream ended (the connection stays open).
const END: &str = "\r\n0\r\n\r\n";
const RESET: &str = "event: reset\ndata: {}\n\n";

/// A write through the API (an ordinary client), checked.
async fn write(p: &Proc, path: &str, body: Value) {
    let r = reqwest::Client::new()
        .post(format!("http://{}{path}", p.api))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "POST {path}: {}", r.text().await.unwrap());
}

/// The catalog index now.
async fn index(p: &Proc) -> u64 {
    let r = reqwest::get(format!("http://{}/summary", p.api))
        .await
        .unwrap();
    r.headers()["x-meshcat-index"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// The events named `name` in a stream's text (chunk framing included): each from
/// its `event:` line to the blank line that ends it.
fn events<'a>(body: &'a str, name: &str) -> Vec<&'a str> {
    let head = format!("event: {name}\n");
    body.match_indices(&head)
        .map(|(at, _)| {
            let rest = &body[at..];
            &rest[..rest.find("\n\n").unwrap_or(rest.len())]
        })
        .collect()
}

fn cluster(name: &str, description: &str) -> Value {
    json!({"zoneName": "z", "clusterName": name, "name": name, "description": description})
}

/// The value of the gauge `name` on the ops port.
async fn gauge(p: &Proc, name: &str) -> Option<i64> {
    let text = reqwest::get(format!("http://{}/metrics", p.ops))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_past_the_cap_is_refused_until_one_closes() {
    // A short heartbeat: a stream whose client left is noticed at its next write.
    let p = spawn(&[
        ("MESHCAT_MAX_EVENT_STREAMS", "2"),
        ("MESHCAT_EVENT_HEARTBEAT", "100ms"),
    ]);
    let (first, h) = get(p.api, "/events", "").await;
    assert_eq!(h.status, 200);
    let (_second, h) = get(p.api, "/events", "").await;
    assert_eq!(h.status, 200);

    let (mut third, h) = get(p.api, "/events", "").await;
    assert_eq!(h.status, 503, "{}", h.head);
    let body = read_body(&mut third, h).await;
    assert_eq!(body["code"], "overloaded", "{body}");
    assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()));
    assert_eq!(gauge(&p, "meshcat_event_streams").await, Some(2));

    // One client goes away: its place comes back once the stream notices.
    drop(first);
    let deadline = Instant::now() + DEADLINE;
    while gauge(&p, "meshcat_event_streams").await != Some(1) {
        assert!(Instant::now() < deadline, "the closed stream is given up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_fourth, h) = get(p.api, "/events", "").await;
    assert_eq!(h.status, 200, "{}", h.head);
}

/// With the default buffer (256 KiB): a bulk write of 1000 records is one change of
/// several hundred KiB of events, so a resume from before it is `reset`; a resume
/// from after it replays the rest and goes on live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_past_the_default_buffer_gets_reset_and_one_within_it_replays() {
    let p = spawn(&[]);
    let before = index(&p).await;
    write(
        &p,
        "/zones",
        json!({"zoneName": "z", "serverAddress": "cp:1"}),
    )
    .await;
    let text = "d".repeat(300);
    let bulk: Vec<Value> = (0..1000)
        .map(|i| cluster(&format!("bulk-{i:04}"), &text))
        .collect();
    write(&p, "/clusters", Value::Array(bulk)).await;
    let after = index(&p).await;
    write(&p, "/clusters", cluster("late", "")).await;

    for (path, header) in [
        (format!("/events?since={before}"), String::new()),
        ("/events".to_owned(), format!("Last-Event-ID: {before}\r\n")),
    ] {
        let (mut conn, h) = get(p.api, &path, &header).await;
        assert_eq!(h.status, 200);
        let body = read_until(&mut conn, h.rest, |t| {
            t.ends_with(END) || t.contains("event: cluster")
        })
        .await;
        assert!(
            body.ends_with(&format!("{RESET}{END}")),
            "{path} {header}: reset, then the end: {}",
            &body[..body.len().min(300)]
        );
        assert!(!body.contains("event: cluster"), "nothing replayed");
    }

    let (mut conn, h) = get(p.api, "/events", &format!("Last-Event-ID: {after}\r\n")).await;
    assert_eq!(h.status, 200);
    let body = read_until(&mut conn, h.rest, |t| t.contains("\"late\"")).await;
    assert!(body.contains("event: cluster\nid: "), "{body}");
    // The history's entries of the bulk write are changes of their own, recorded
    // after it: they may come after `after`; the bulk's cluster events may not.
    assert!(
        !events(&body, "cluster").iter().any(|e| e.contains("bulk-")),
        "only what came after {after}: {body}"
    );
    assert!(!body.contains("reset"), "{body}");
    // Live from there on.
    write(&p, "/clusters", cluster("later", "")).await;
    let body = read_until(&mut conn, body.into_bytes(), |t| t.contains("\"later\"")).await;
    assert!(!body.contains("reset"), "{body}");
}

/// `--event-buffer 4KiB`: a dozen registrations are more than a resume may queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_event_buffer_bounds_what_a_resume_replays() {
    let p = spawn(&[("MESHCAT_EVENT_BUFFER", "4KiB")]);
    let before = index(&p).await;
    write(
        &p,
        "/zones",
        json!({"zoneName": "z", "serverAddress": "cp:1"}),
    )
    .await;
    for i in 0..12 {
        write(
            &p,
            "/clusters",
            cluster(&format!("c-{i:02}"), &"d".repeat(300)),
        )
        .await;
    }
    let last = index(&p).await;
    write(&p, "/clusters", cluster("c-12", "")).await;

    let (mut conn, h) = get(p.api, &format!("/events?since={before}"), "").await;
    assert_eq!(h.status, 200);
    let body = read_until(&mut conn, h.rest, |t| t.ends_with(END)).await;
    assert!(body.ends_with(&format!("{RESET}{END}")), "{body}");
    assert!(!body.contains("event: cluster"), "{body}");

    let (mut conn, h) = get(p.api, &format!("/events?since={last}"), "").await;
    assert_eq!(h.status, 200);
    let body = read_until(&mut conn, h.rest, |t| t.contains("event: summary")).await;
    assert!(body.contains("\"c-12\""), "{body}");
    // As above: the history's entry of c-11 may come after `last`, its cluster
    // event may not.
    assert!(
        !events(&body, "cluster")
            .iter()
            .any(|e| e.contains("\"c-11\""))
            && !body.contains("reset"),
        "{body}"
    );
}

/// With the concurrency limit taken (one permit, held by a write whose body has not
/// all arrived), `?index=` that answers at once is refused like any read, while a
/// blocking query at the current index is exempt and waits for the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_blocking_query_that_waits_is_exempt_from_the_concurrency_limit() {
    let p = spawn(&[("MESHCAT_API_MAX_CONCURRENCY", "1")]);
    write(
        &p,
        "/zones",
        json!({"zoneName": "z", "serverAddress": "cp:1"}),
    )
    .await;
    let now = index(&p).await;

    // A blocking query at the current index: it waits.
    let mut blocking = TcpStream::connect(p.api).await.unwrap();
    blocking
        .write_all(
            format!("GET /clusters?index={now}&wait=60s HTTP/1.1\r\nHost: meshcat\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();

    // A write that holds the only permit: its body is one byte short. It is held
    // once an ordinary read is refused; a write that lost the race for the permit to
    // a read (and was answered 503 itself) is sent again.
    let body = serde_json::to_string(&cluster("slow", "")).unwrap();
    let send_slow = || async {
        let mut slow = TcpStream::connect(p.api).await.unwrap();
        slow.write_all(
            format!(
                "POST /clusters HTTP/1.1\r\nHost: meshcat\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
                body.len(),
                &body[..body.len() - 1]
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        slow
    };
    let mut slow = send_slow().await;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (mut conn, h) = get(p.api, "/clusters", "").await;
        if h.status == 503 {
            assert_eq!(read_body(&mut conn, h).await["code"], "overloaded");
            break;
        }
        assert!(Instant::now() < deadline, "the slow write takes the permit");
        let mut probe = [0u8; 1];
        if slow.try_read(&mut probe).is_ok() {
            slow = send_slow().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Any `index` that answers at once is an ordinary read: refused.
    for query in [
        "index=0".to_owned(),
        format!("index={}&wait=1s", now - 1),
        format!("index={}", now + 1_000_000_000),
        "index=banana".to_owned(),
    ] {
        let (mut conn, h) = get(p.api, &format!("/clusters?{query}"), "").await;
        assert_eq!(h.status, 503, "?{query}: {}", h.head);
        assert_eq!(
            read_body(&mut conn, h).await["code"],
            "overloaded",
            "?{query}"
        );
    }

    // The blocking query has not answered: nothing changed.
    let mut probe = [0u8; 1];
    assert!(
        matches!(blocking.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the blocking query waits"
    );

    // The write completes: the permit is free, the index moves, the query answers.
    slow.write_all(&body.as_bytes()[body.len() - 1..])
        .await
        .unwrap();
    let h = read_head(&mut slow).await;
    assert_eq!(h.status, 201, "{}", h.head);
    let h = read_head(&mut blocking).await;
    assert_eq!(h.status, 200, "{}", h.head);
    let moved: u64 = h.header("x-meshcat-index").unwrap().parse().unwrap();
    assert!(moved > now, "answered after the change: {moved} > {now}");
}
