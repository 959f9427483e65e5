//! The live catalog over real HTTP (contract section 11): the index header, blocking
//! queries, and the `GET /events` stream (events, filters, replay, reset of a reader
//! that falls behind, and the read token), with a real agent and Envoy for status.

use std::time::{Duration, Instant};

use meshcat_tests::sse::{EventStream, Sse};
use meshcat_tests::{Catalog, MeshAgent, Sidecar};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DEADLINE: Duration = Duration::from_secs(20);
const TOKEN: &str = "read-77a1";
const WRITE_TOKEN: &str = "write-5c0e";

/// A `GET /events` stream of the catalog; every wait has the test's deadline.
struct Stream(EventStream);

impl std::ops::Deref for Stream {
    type Target = EventStream;
    fn deref(&self) -> &EventStream {
        &self.0
    }
}

impl Stream {
    async fn open(catalog: &Catalog, query: &str, headers: &[(&str, &str)]) -> Stream {
        let url = format!("{}/events{query}", catalog.api_url());
        Stream(EventStream::open(&url, headers).await.unwrap())
    }

    /// Reads until an event satisfies `want`; returns it. `None` when the stream ends.
    async fn until(&mut self, want: impl Fn(&Sse) -> bool) -> Option<Sse> {
        self.0.until(DEADLINE, want).await.unwrap()
    }
}

fn is_cluster(e: &Sse, name: &str) -> bool {
    e.event == "cluster" && e.data["clusterName"] == name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_header_and_blocking_queries() {
    let catalog = Catalog::start(|_| {}).await.unwrap();
    let client = reqwest::Client::new();
    let url = |p: &str| format!("{}{p}", catalog.api_url());
    let index_of = |r: &reqwest::Response| -> u64 {
        r.headers()["x-meshcat-index"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let mut first = 0;
    for p in [
        "/clusters",
        "/zones",
        "/summary",
        "/services",
        "/clusters?zoneName=z",
    ] {
        let r = client.get(url(p)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{p}");
        first = index_of(&r);
    }

    // Malformed index or wait: 400 with the error body.
    for q in [
        "index=x",
        "index=-1",
        "index=1&wait=soon",
        "index=1&wait=5d",
        "index=1&index=2",
    ] {
        let r = client
            .get(url(&format!("/clusters?{q}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{q}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["code"], "invalid_query", "{q}: {body}");
    }

    // Nothing changes: the answer comes after the wait with the same index.
    let start = Instant::now();
    let r = client
        .get(url(&format!("/zones?index={first}&wait=300ms")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(index_of(&r), first);
    assert!(start.elapsed() >= Duration::from_millis(300));

    // A change releases a waiting query at once, with a larger index and the new data.
    let blocked = tokio::spawn({
        let u = url(&format!("/zones?index={first}&wait=60s"));
        async move {
            let r = reqwest::get(u).await.unwrap();
            let i: u64 = r.headers()["x-meshcat-index"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            (i, r.json::<Value>().await.unwrap())
        }
    });
    catalog.register_zone("zone-b", "").await.unwrap();
    let (after, zones) = tokio::time::timeout(DEADLINE, blocked)
        .await
        .unwrap()
        .unwrap();
    assert!(after > first, "{after} > {first}");
    assert_eq!(zones[0]["zoneName"], "zone-b");

    // The filters still apply after index and wait are taken out.
    catalog
        .register_cluster("zone-b", "orders", json!({"owner": "team-o"}))
        .await
        .unwrap();
    let r = client
        .get(url("/clusters?owner=team-o&index=0&wait=1s"))
        .send()
        .await
        .unwrap();
    assert!(index_of(&r) > after);
    let list: Value = r.json().await.unwrap();
    assert_eq!(list[0]["clusterName"], "orders");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_follow_changes_with_filters_and_replay() {
    let catalog = Catalog::start(|_| {}).await.unwrap();
    let mut all = Stream::open(&catalog, "", &[]).await;
    let mut only_pay = Stream::open(&catalog, "?clusterName=pay", &[]).await;
    let mut zone_b = Stream::open(&catalog, "?zoneName=zone-b", &[]).await;

    catalog.register_zone("zone-a", "").await.unwrap();
    catalog.register_zone("zone-b", "").await.unwrap();
    catalog
        .register_cluster("zone-a", "pay", json!({"owner": "team-p"}))
        .await
        .unwrap();
    catalog
        .register_cluster("zone-b", "pay", json!({"owner": "team-p"}))
        .await
        .unwrap();
    catalog
        .register_cluster("zone-a", "cart", json!({}))
        .await
        .unwrap();

    let zone = all.until(|e| e.event == "zone").await.unwrap();
    assert_eq!(zone.data["zoneName"], "zone-a");
    assert_eq!(zone.data["serverAddress"], "control.local:50000");
    let cart = all.until(|e| is_cluster(e, "cart")).await.unwrap();
    // Exactly an element of GET /clusters.
    let (_, list) = catalog.get("/clusters?clusterName=cart").await.unwrap();
    assert_eq!(cart.data, list[0]);
    let summary = all.until(|e| e.event == "summary").await.unwrap();
    assert!(summary.data["clusterCount"].is_u64(), "{:?}", summary.data);
    // Events of one change share its index; summary follows with the same id.
    let cart_summary = all
        .seen
        .iter()
        .find(|e| e.event == "summary" && e.id == cart.id);
    let final_summary = match cart_summary {
        Some(s) => s.clone(),
        None => all
            .until(|e| e.event == "summary" && e.id == cart.id)
            .await
            .unwrap(),
    };
    assert_eq!(final_summary.data["clusterCount"], 3);
    assert_eq!(final_summary.data["zoneCount"], 2);

    // The cluster filter: only pay, from both zones, and no zone or summary events.
    only_pay
        .until(|e| is_cluster(e, "pay") && e.data["zoneName"] == "zone-b")
        .await
        .unwrap();
    assert!(
        only_pay.seen.iter().all(|e| is_cluster(e, "pay")),
        "{:?}",
        only_pay.seen
    );
    // The zone filter: zone-b's zone and cluster, nothing of zone-a.
    catalog
        .register_cluster("zone-b", "last", json!({}))
        .await
        .unwrap();
    zone_b.until(|e| is_cluster(e, "last")).await.unwrap();
    assert!(
        zone_b
            .seen
            .iter()
            .all(|e| e.event != "summary" && (e.data["zoneName"] == "zone-b")),
        "{:?}",
        zone_b.seen
    );
    assert!(zone_b.seen.iter().any(|e| e.event == "zone"));

    // Deletions.
    let r = reqwest::Client::new()
        .delete(format!(
            "{}/clusters/cart?zoneName=zone-a",
            catalog.api_url()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let gone = all.until(|e| e.event == "cluster-deleted").await.unwrap();
    assert_eq!(
        gone.data,
        json!({"clusterName": "cart", "zoneName": "zone-a"})
    );
    let r = reqwest::Client::new()
        .delete(format!("{}/zones/zone-b", catalog.api_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let zone_gone = all.until(|e| e.event == "zone-deleted").await.unwrap();
    assert_eq!(zone_gone.data, json!({"zoneName": "zone-b"}));
    let deleted_with_zone: Vec<&Sse> = all
        .seen
        .iter()
        .filter(|e| e.event == "cluster-deleted" && e.id == zone_gone.id)
        .collect();
    assert_eq!(deleted_with_zone.len(), 2, "{:?}", all.seen);

    // Replay from an id: exactly the later events, with Last-Event-ID or ?since=.
    let from = cart.id.unwrap();
    let later: Vec<(String, Option<u64>)> = all
        .seen
        .iter()
        .filter(|e| e.id.is_some_and(|i| i > from))
        .map(|e| (e.event.clone(), e.id))
        .collect();
    assert!(!later.is_empty());
    for (query, headers) in [
        (String::new(), vec![("last-event-id", from.to_string())]),
        (format!("?since={from}"), vec![]),
    ] {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut replay = Stream::open(&catalog, &query, &h).await;
        let last_id = later.last().unwrap().1;
        replay
            .until(|e| e.event == "zone-deleted" && e.id == last_id)
            .await
            .unwrap();
        let got: Vec<(String, Option<u64>)> = replay
            .seen
            .iter()
            .map(|e| (e.event.clone(), e.id))
            .collect();
        assert_eq!(got, later);
    }

    // An id older than the window (or from before a restart): reset, then closed.
    for id in ["1", "99999999999999999"] {
        let mut old = Stream::open(&catalog, "", &[("last-event-id", id)]).await;
        let e = old.until(|_| true).await.unwrap();
        assert_eq!(e.event, "reset");
        assert_eq!(e.data, json!({}));
        assert!(old.until(|_| true).await.is_none(), "closed after reset");
    }

    // A bad filter is a 400.
    let r = reqwest::get(format!("{}/events?zoneName=a%20b", catalog.api_url()))
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = reqwest::get(format!("{}/events?colour=red", catalog.api_url()))
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_falls_behind_gets_reset_and_is_closed() {
    let catalog = Catalog::start(|c| c.events.lag = 4).await.unwrap();
    catalog.register_zone("zone-s", "").await.unwrap();
    // A raw client with a tiny receive window that reads nothing for a while.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut conn = sock.connect(catalog.config.api.addr).await.unwrap();
    conn.write_all(b"GET /events HTTP/1.1\r\nHost: meshcat\r\n\r\n")
        .await
        .unwrap();
    let mut head = vec![0u8; 256];
    let n = conn.read(&mut head).await.unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"));

    // Big records make each change large, so the socket fills and the stream stalls.
    let long = "x".repeat(4000);
    let mut body = json!({"zoneName": "zone-s", "clusterName": "big", "name": "big"});
    for f in [
        "description",
        "documentation",
        "runtime",
        "ownerUrl",
        "metricsTemplate",
        "capability",
        "owner",
        "prometheusJob",
    ] {
        body[f] = json!(long);
    }
    // A link field takes a URL or a path.
    body["documentation"] = json!(format!("/{long}"));
    catalog.create("/clusters", body.clone()).await.unwrap();
    let client = reqwest::Client::new();
    for n in 0..400 {
        body["version"] = json!(n.to_string());
        let r = client
            .put(format!("{}/clusters/big", catalog.api_url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }

    // Now read: what was buffered, then `reset`, then the end of the stream.
    let mut all = Vec::new();
    let read = async {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = conn.read(&mut buf).await.unwrap();
            all.extend_from_slice(&buf[..n]);
            // The last chunk of a chunked body: the stream ended (the connection
            // itself stays open for another request).
            if n == 0 || all.ends_with(b"\r\n0\r\n\r\n") {
                break;
            }
        }
    };
    tokio::time::timeout(DEADLINE, read)
        .await
        .expect("the stream closes");
    let text = String::from_utf8_lossy(&all);
    assert!(text.contains("event: reset\ndata: {}\n\n"), "no reset");
    assert!(
        text.ends_with("event: reset\ndata: {}\n\n\r\n0\r\n\r\n"),
        "reset is the last event: {}",
        &text[text.len().saturating_sub(200)..]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_show_live_status_and_honour_the_read_token() {
    let catalog = Catalog::start(|c| {
        c.store.rules.instance_ttl = Duration::from_millis(900);
        c.tokens.read = Some(TOKEN.to_owned());
        c.tokens.write = Some(WRITE_TOKEN.to_owned());
    })
    .await
    .unwrap();
    let client = reqwest::Client::new();
    for (path, body) in [
        (
            "/zones",
            json!({"zoneName": "zone-t", "serverAddress": "control.local:50000", "requestCluster": "edge"}),
        ),
        (
            "/clusters",
            json!({"zoneName": "zone-t", "clusterName": "ledger", "name": "ledger", "owner": "team-l"}),
        ),
    ] {
        let r = client
            .post(format!("{}{path}", catalog.api_url()))
            .bearer_auth(WRITE_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "POST {path}");
    }
    let auth = format!("Bearer {TOKEN}");
    let mut with = Stream::open(&catalog, "?clusterName=ledger", &[("authorization", &auth)]).await;
    let mut without = Stream::open(&catalog, "?clusterName=ledger", &[]).await;
    // A wrong token is no token.
    let mut wrong = Stream::open(
        &catalog,
        "?clusterName=ledger",
        &[("authorization", "Bearer not-the-token")],
    )
    .await;
    // The write token grants what the read token grants.
    let write_auth = format!("Bearer {WRITE_TOKEN}");
    let mut writer = Stream::open(
        &catalog,
        "?clusterName=ledger",
        &[("authorization", &write_auth)],
    )
    .await;
    let sidecar = Sidecar::start().await.unwrap();
    let agent = MeshAgent::for_sidecar(&catalog, &sidecar, "zone-t", "ledger", "ledger-1", "300ms")
        .await
        .unwrap();

    let up = with
        .until(|e| is_cluster(e, "ledger") && e.data["status"] == "stable")
        .await
        .unwrap();
    assert_eq!(up.data["authorized"], true);
    assert_eq!(up.data["instances"][0]["name"], "ledger-1");
    let hidden = without
        .until(|e| is_cluster(e, "ledger") && e.data["status"] == "stable")
        .await
        .unwrap();
    assert_eq!(hidden.data["authorized"], false);
    assert_eq!(hidden.data["instances"], json!([]));
    assert_eq!(hidden.id, up.id);
    let wrong_view = wrong
        .until(|e| is_cluster(e, "ledger") && e.data["status"] == "stable")
        .await
        .unwrap();
    assert_eq!(wrong_view.data, hidden.data);
    let writer_view = writer
        .until(|e| is_cluster(e, "ledger") && e.data["status"] == "stable")
        .await
        .unwrap();
    assert_eq!(writer_view.data, up.data);

    // The agent goes: the status change is an event.
    agent.stop().await.unwrap();
    let down = with
        .until(|e| is_cluster(e, "ledger") && e.data["status"] == "down")
        .await
        .unwrap();
    assert_eq!(down.data["instances"], json!([]));
    // The last event matches what the route shows now.
    let (_, now) = catalog
        .get_as("/clusters/ledger", Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(down.data, now[0]);
}

/// Reads a raw event stream until `done` holds for all it read, within [`DEADLINE`];
/// answers the text.
async fn read_until(res: &mut reqwest::Response, done: impl Fn(&str) -> bool) -> String {
    let mut text = String::new();
    let deadline = Instant::now() + DEADLINE;
    while !done(&text) {
        let chunk = tokio::time::timeout_at(deadline.into(), res.chunk())
            .await
            .expect("a comment within the deadline")
            .unwrap()
            .expect("the stream stays open");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_gets_comment_lines() {
    let catalog = Catalog::start(|c| c.events.heartbeat = Duration::from_millis(200))
        .await
        .unwrap();
    let mut res = reqwest::get(format!("{}/events", catalog.api_url()))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // Nothing changes, so the only thing that can arrive is the keep-alive comment.
    let comments = |text: &str| text.lines().filter(|l| l.starts_with(':')).count();
    let text = read_until(&mut res, |text| comments(text) >= 2).await;
    assert!(comments(&text) >= 2);
    // Comments only: no event was made up.
    assert!(
        text.lines().all(|l| l.is_empty() || l.starts_with(':')),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_stream_gets_comment_lines_while_other_clusters_change() {
    let catalog = Catalog::start(|c| c.events.heartbeat = Duration::from_millis(300))
        .await
        .unwrap();
    catalog.register_zone("zone-h", "").await.unwrap();
    catalog
        .register_cluster("zone-h", "busy", json!({}))
        .await
        .unwrap();
    let mut res = reqwest::get(format!("{}/events?clusterName=quiet", catalog.api_url()))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // Another cluster changes more often than the heartbeat, all along: the filter
    // leaves every change out, and the comment must come anyway.
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let writer = {
        let url = format!("{}/clusters/busy?zoneName=zone-h", catalog.api_url());
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            let mut n = 0u64;
            loop {
                tokio::select! {
                    _ = stopped.wait_for(|s| *s) => return n,
                    _ = tick.tick() => {}
                }
                n += 1;
                let body = json!({"zoneName": "zone-h", "clusterName": "busy", "name": "busy", "version": n.to_string()});
                let r = client.put(&url).json(&body).send().await.unwrap();
                assert_eq!(r.status(), 200);
            }
        })
    };
    let text = read_until(&mut res, |text| text.lines().any(|l| l.starts_with(':'))).await;
    stop.send(true).unwrap();
    let writes = writer.await.unwrap();
    assert!(
        writes >= 2,
        "the other cluster changed meanwhile ({writes} writes)"
    );
    assert!(
        text.lines().all(|l| l.is_empty() || l.starts_with(':')),
        "{text}"
    );
}
