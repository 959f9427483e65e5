//! The `meshcat` binary against what others wrote: a real aggregator holding a
//! registration whose text carries terminal escapes (its table and text forms write
//! them escaped, `-o json|yaml` exactly), and hostile servers of its own: one whose
//! error message carries them, and event streams past the bound of one event, which
//! `meshcat watch` refuses with exit status 2.

use std::process::Stdio;
use std::time::Duration;

use meshcat_tests::mesh::Catalog;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// An owner that would write the clipboard (OSC 52 ended by BEL) and clear the
/// screen, with CSI as one C1 character and DEL.
const OWNER: &str = "team\u{1b}]52;c;aGFja2Vk\u{7}\u{1b}[2J\u{9b}31m-x\u{7f}";
const NAME: &str = "Catalog\u{1b}[8m\u{9b}2K\u{7f}";
const DESCRIPTION: &str = "first line\nsecond\u{1b}]0;title\u{7} line\u{9b}1A\tend";

/// Colours that meshcat itself writes (bold, dim, red, yellow, green, the reset).
const OUR_ESCAPES: [&str; 6] = [
    "\u{1b}[31m",
    "\u{1b}[32m",
    "\u{1b}[33m",
    "\u{1b}[1m",
    "\u{1b}[2m",
    "\u{1b}[0m",
];

#[derive(Debug)]
struct Run {
    code: i32,
    out: String,
    err: String,
}

/// The binary with a clean environment; `colour` forces colours into the pipe
/// (`CLICOLOR_FORCE=1`), so that what is written is what a terminal would get.
fn command(args: &[&str], colour: bool) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_meshcat"));
    c.args(args)
        .env_remove("MESHCAT_API")
        .env_remove("MESHCAT_TOKEN_FILE")
        .env_remove("MESHCAT_TIMEOUT")
        .env_remove("NO_COLOR")
        .env_remove("CLICOLOR")
        .env_remove("CLICOLOR_FORCE")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if colour {
        c.env("CLICOLOR_FORCE", "1");
    }
    c
}

async fn run(args: &[&str], colour: bool) -> Run {
    let out = tokio::time::timeout(Duration::from_secs(60), command(args, colour).output())
        .await
        .expect("meshcat ends by itself")
        .expect("meshcat runs");
    Run {
        code: out.status.code().unwrap_or(-1),
        // Lossless for the check: any invalid UTF-8 would show as U+FFFD and fail
        // the equality of the JSON round trip.
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The raw control characters of `text` (meshcat's own colours, newlines and tabs
/// aside).
fn raw_controls(text: &str) -> Vec<char> {
    let mut t = text.to_owned();
    for e in OUR_ESCAPES {
        t = t.replace(e, "");
    }
    t.chars()
        .filter(|c| c.is_control() && !matches!(c, '\n' | '\t'))
        .collect()
}

/// No raw control character in `text`: not the escape, BEL, C1 CSI or DEL of the
/// registration, nor any other; and no escape at all when colours were not asked.
fn assert_safe(what: &str, text: &str, colour: bool) {
    let raw = raw_controls(text);
    assert!(raw.is_empty(), "{what}: raw {raw:?} in {text:?}");
    if !colour {
        assert!(!text.contains('\u{1b}'), "{what}: {text:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_text_reaches_the_terminal_escaped_and_json_exact() {
    let catalog = Catalog::start(|_| {}).await.unwrap();
    let api = catalog.api_url();
    catalog.register_zone("shop", "edge").await.unwrap();
    catalog
        .register_cluster(
            "shop",
            "catalog",
            json!({"name": NAME, "owner": OWNER, "description": DESCRIPTION,
                   "dependencies": ["edge"]}),
        )
        .await
        .unwrap();
    catalog
        .register_cluster("shop", "edge", json!({"owner": OWNER}))
        .await
        .unwrap();

    let texts: [&[&str]; 6] = [
        &["get", "clusters"],
        &["get", "cluster", "catalog", "--zone", "shop"],
        &["describe", "cluster", "catalog", "--zone", "shop"],
        &["graph"],
        &["graph", "-o", "dot"],
        &["history"],
    ];
    for args in texts {
        for colour in [false, true] {
            let mut all = vec!["--api", api.as_str()];
            all.extend_from_slice(args);
            let r = run(&all, colour).await;
            assert_eq!(r.code, 0, "{args:?}: {r:?}");
            let what = format!("{args:?} (colours forced: {colour})");
            assert_safe(&what, &r.out, colour);
            assert_safe(&what, &r.err, colour);
            if !matches!(args, ["history"] | ["graph", "-o", "dot"]) {
                // The owner is there, escaped, whole.
                assert!(
                    r.out
                        .contains("team\\u{1b}]52;c;aGFja2Vk\\u{7}\\u{1b}[2J\\u{9b}31m-x\\u{7f}"),
                    "{what}: {}",
                    r.out
                );
            }
        }
    }
    // A description of two lines stays two lines, the second under the first.
    let all = [
        "--api",
        api.as_str(),
        "describe",
        "cluster",
        "catalog",
        "--zone",
        "shop",
    ];
    let r = run(&all, false).await;
    assert!(
        r.out.contains(
            "Description:      first line\n                  second\\u{1b}]0;title\\u{7} line\\u{9b}1A    end\n"
        ),
        "{}",
        r.out
    );
    // A table keeps one line per row.
    let r = run(&["--api", &api, "get", "clusters"], false).await;
    assert_eq!(r.out.lines().count(), 3, "{}", r.out);

    // The data forms are the API's answer exactly, without a raw control character.
    let (_, want) = catalog.get("/clusters").await.unwrap();
    assert_eq!(want[0]["owner"], OWNER, "{want}");
    for format in ["json", "yaml"] {
        for colour in [false, true] {
            let r = run(&["--api", &api, "get", "clusters", "-o", format], colour).await;
            assert_eq!(r.code, 0, "{r:?}");
            assert!(raw_controls(&r.out).is_empty(), "{format}: {:?}", r.out);
            let got: Value = if format == "json" {
                serde_json::from_str(&r.out).unwrap()
            } else {
                serde_saphyr::from_str(&r.out).unwrap()
            };
            assert_eq!(got, want, "-o {format}");
            let catalog = got
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["clusterName"] == "catalog")
                .unwrap();
            assert_eq!(catalog["owner"], OWNER);
            assert_eq!(catalog["name"], NAME);
            assert_eq!(catalog["description"], DESCRIPTION);
        }
    }
    let r = run(&["--api", &api, "graph", "-o", "json"], true).await;
    let got: Value = serde_json::from_str(&r.out).unwrap();
    assert!(
        got["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["owner"] == OWNER),
        "{got}"
    );
}

/// Serves every connection on `listener` with `head` then `body(i)` for i = 0, 1,
/// ... until the client leaves or `cap` bytes are sent, then closes it.
async fn serve(
    listener: TcpListener,
    head: &'static str,
    cap: usize,
    body: impl Fn(usize) -> Vec<u8> + Send + Sync + Copy + 'static,
) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            // The request head, at most 64 KiB.
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 64 << 10 {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            if conn.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let mut sent = 0;
            let mut i = 0;
            while sent < cap {
                let chunk = body(i);
                if chunk.is_empty() || conn.write_all(&chunk).await.is_err() {
                    return;
                }
                sent += chunk.len();
                i += 1;
            }
        });
    }
}

const STREAM: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";

/// `meshcat watch` against a server streaming `body`: its exit status and stderr.
async fn watch_against(body: impl Fn(usize) -> Vec<u8> + Send + Sync + Copy + 'static) -> Run {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = format!("http://{}", listener.local_addr().unwrap());
    // 64 MiB a connection: far past the bound, and an end should meshcat never stop.
    let server = tokio::spawn(serve(listener, STREAM, 64 << 20, body));
    let r = run(&["--api", &api, "watch"], false).await;
    server.abort();
    r
}

#[tokio::test]
async fn watch_stops_at_a_line_without_end() {
    let r = watch_against(|i| {
        if i == 0 {
            b"id: 1\nevent: cluster\ndata: ".to_vec()
        } else {
            vec![b'x'; 64 << 10]
        }
    })
    .await;
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.out.is_empty(), "{r:?}");
    assert!(
        r.err
            .contains("GET /events: the catalog API answered something unexpected: a line of the event stream is longer than 1 MiB"),
        "{r:?}"
    );
    assert!(!r.err.contains("reconnecting"), "{r:?}");
}

#[tokio::test]
async fn watch_stops_at_an_event_of_many_small_lines() {
    let r = watch_against(|i| {
        if i == 0 {
            b"id: 1\nevent: cluster\n".to_vec()
        } else {
            // 64 data lines of 1 KiB each per write, never a blank line.
            let line = format!("data: {}\n", "y".repeat(1018));
            line.repeat(64).into_bytes()
        }
    })
    .await;
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.out.is_empty(), "{r:?}");
    assert!(
        r.err
            .contains("an event of the stream is larger than 1 MiB"),
        "{r:?}"
    );
}

#[tokio::test]
async fn an_error_message_from_the_server_is_said_escaped() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = format!("http://{}", listener.local_addr().unwrap());
    let body = json!({"error": format!("no {OWNER}\r\nmore"), "code": "x\u{9b}2J"}).to_string();
    let head: &'static str = Box::leak(
        format!(
            "HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_boxed_str(),
    );
    let server = tokio::spawn(serve(listener, head, 0, |_| Vec::new()));
    for colour in [false, true] {
        let r = run(&["--api", &api, "get", "zones"], colour).await;
        assert_eq!(r.code, 1, "{r:?}");
        assert!(r.err.starts_with("meshcat: GET /zones: no team"), "{r:?}");
        assert!(r.err.contains("\\u{1b}]52;"), "{r:?}");
        assert_safe("the error", &r.err, colour);
    }
    server.abort();
}
