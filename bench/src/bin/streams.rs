//! Event-stream bounds benchmark: what open `GET /events` streams cost a running
//! aggregator when some of them never read. It registers `--bulk` bulk
//! `POST /clusters` of `--bulk-size` records each (one change of that many events
//! each) and then `--singles` single `PUT`s, all within the retained window, then
//! opens `--readers` streams that read everything, then `--stalled` raw connections
//! that resume from the oldest retained id (`?since=` the index read before the
//! writes) and never read past the response head, then makes `--rate` changes a
//! second for `--duration` with all of them open. It reports the aggregator's
//! resident memory (`VmRSS`, `VmHWM` of `/proc/<pid>/status`) and CPU (utime +
//! stime of `/proc/<pid>/stat`) at each step, the answers the stalled connections
//! got, and what the readers received.

// A command-line benchmark: its report goes to stdout.
#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use meshcat_bench::process::{cpu_ticks, memory_mib};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Parser)]
struct Args {
    /// The aggregator's API, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    api: String,
    /// The aggregator's process id, for its CPU time and memory.
    #[arg(long)]
    pid: u32,
    /// Streams that read everything.
    #[arg(long, default_value_t = 1000)]
    readers: usize,
    /// Streams that resume from the oldest retained id and never read.
    #[arg(long, default_value_t = 200)]
    stalled: usize,
    /// Bulk `POST /clusters` before the streams open.
    #[arg(long, default_value_t = 3)]
    bulk: usize,
    /// Records per bulk write (at most 1000).
    #[arg(long, default_value_t = 1000)]
    bulk_size: usize,
    /// Single `PUT`s after the bulk writes (the window keeps 4,096 changes: the
    /// writes must stay below it for the first index to remain retained).
    #[arg(long, default_value_t = 1000)]
    singles: usize,
    /// Changes per second once every stream is open.
    #[arg(long, default_value_t = 100)]
    rate: u32,
    /// Seconds of changes once every stream is open.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Bytes of each record's description: with the default a bulk write of 1000
    /// records fits the default `--max-body` and is one change of about 1 MB of
    /// events.
    #[arg(long, default_value_t = 600)]
    description: usize,
    /// Receive buffer of each stalled connection (`SO_RCVBUF`), small as a client
    /// that means to hold the aggregator's memory would set it.
    #[arg(long, default_value_t = 4096)]
    stalled_rcvbuf: u32,
    /// Prefix of the zone and cluster names.
    #[arg(long, default_value = "bounds")]
    prefix: String,
    /// Clock ticks per second of `/proc/<pid>/stat` (`getconf CLK_TCK`).
    #[arg(long, default_value_t = 100)]
    clk_tck: u64,
}

fn record(prefix: &str, i: usize, version: u64, description: &str) -> Value {
    json!({
        "clusterName": format!("{prefix}-{i:05}"), "zoneName": format!("{prefix}-zone"),
        "name": format!("Service {i}"), "version": version.to_string(),
        "owner": format!("team-{}", i % 10), "capability": format!("cap-{}", i % 5),
        "documentation": "/docs/service", "description": description,
        "minInstances": 1, "protocols": ["http"], "businessImpact": "medium",
    })
}

/// Waits until the resident memory has not moved by more than 1 MiB for a second
/// (at most 60 s); answers it in MiB.
async fn settled_rss(pid: u32) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = memory_mib(pid)?.0;
    let mut stable_since = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = memory_mib(pid)?.0;
        if (now - last).abs() > 1.0 {
            last = now;
            stable_since = Instant::now();
        } else if stable_since.elapsed() >= Duration::from_secs(1) {
            return Ok(now);
        }
    }
    Ok(last)
}

fn cpu_s(ticks: u64, clk_tck: u64) -> f64 {
    ticks as f64 / clk_tck as f64
}

/// How a stalled stream began.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Start {
    /// Refused, with this status.
    Refused(u16),
    /// `reset`: the replay was not sent.
    Reset,
    /// The replay.
    Replay,
}

/// A connection that asked for a stream and reads only the response head and the
/// first bytes of the body (whether it starts with `reset`).
async fn open_stalled(
    addr: std::net::SocketAddr,
    since: u64,
    rcvbuf: u32,
) -> anyhow::Result<(Start, tokio::net::TcpStream)> {
    let sock = tokio::net::TcpSocket::new_v4()?;
    sock.set_recv_buffer_size(rcvbuf)?;
    let mut conn = sock.connect(addr).await?;
    conn.write_all(
        format!("GET /events?since={since} HTTP/1.1\r\nHost: meshcat\r\n\r\n").as_bytes(),
    )
    .await?;
    // Up to the end of the head, one byte at a time so nothing of the body is read.
    let mut head = Vec::with_capacity(256);
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 4096 || conn.read(&mut b).await? == 0 {
            bail!("no response head");
        }
        head.push(b[0]);
    }
    let status = String::from_utf8_lossy(&head)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if status != 200 {
        return Ok((Start::Refused(status), conn));
    }
    // The chunk size line, then the first event's name.
    let mut first = Vec::with_capacity(32);
    while first.len() < 24 {
        if conn.read(&mut b).await? == 0 {
            break;
        }
        first.push(b[0]);
    }
    let start = if String::from_utf8_lossy(&first).contains("event: reset") {
        Start::Reset
    } else {
        Start::Replay
    };
    Ok((start, conn))
}

/// Reads one stream to its end or until `stop`: bytes, `cluster` events and resets.
async fn read_stream(
    mut res: reqwest::Response,
    mut stop: tokio::sync::watch::Receiver<bool>,
    events: Arc<AtomicU64>,
    resets: Arc<AtomicU64>,
) {
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let chunk = tokio::select! {
            c = res.chunk() => c,
            _ = stop.wait_for(|s| *s) => return,
        };
        let Ok(Some(chunk)) = chunk else {
            return;
        };
        tail.extend_from_slice(&chunk);
        while let Some(end) = tail.windows(2).position(|w| w == b"\n\n") {
            if tail.starts_with(b"event: cluster\n") {
                events.fetch_add(1, Ordering::Relaxed);
            } else if tail.starts_with(b"event: reset") {
                resets.fetch_add(1, Ordering::Relaxed);
            }
            tail.drain(..end + 2);
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.bulk_size == 0 || args.bulk_size > 1000 || args.rate == 0 {
        bail!("--bulk-size must be 1 to 1000 and --rate at least 1");
    }
    if args.bulk + args.singles + 1 >= 4096 {
        bail!("--bulk + --singles must stay below the 4,096 retained changes");
    }
    let addr = args
        .api
        .strip_prefix("http://")
        .context("--api is http://host:port")?
        .trim_end_matches('/')
        .parse::<std::net::SocketAddr>()
        .context("--api is http://<ip>:<port>")?;
    let description = "d".repeat(args.description);
    let client = reqwest::Client::new();
    let prefix = args.prefix.clone();
    let zone = format!("{prefix}-zone");
    let (rss_start, _) = memory_mib(args.pid)?;

    // The oldest id a resume can name: the index before any write of this run.
    let r = client.get(format!("{}/summary", args.api)).send().await?;
    let oldest: u64 = r
        .headers()
        .get("x-meshcat-index")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .context("X-Meshcat-Index")?;

    let cpu_writes = cpu_ticks(args.pid)?;
    let r = client
        .post(format!("{}/zones", args.api))
        .json(&json!({"zoneName": zone, "serverAddress": "cp.mesh:50000"}))
        .send()
        .await?;
    if !r.status().is_success() {
        bail!("POST /zones answered {}", r.status());
    }
    let total = args.bulk * args.bulk_size;
    for b in 0..args.bulk {
        let batch: Vec<Value> = (b * args.bulk_size..(b + 1) * args.bulk_size)
            .map(|i| record(&prefix, i, 0, &description))
            .collect();
        let r = client
            .post(format!("{}/clusters", args.api))
            .json(&batch)
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("bulk POST /clusters answered {}", r.status());
        }
    }
    if total == 0 && args.singles > 0 {
        bail!("--singles needs clusters: --bulk at least 1");
    }
    // The single writes, 16 at a time.
    let mut next = 0usize;
    while next < args.singles {
        let mut batch = Vec::new();
        for v in next..(next + 16).min(args.singles) {
            let (client, api, prefix, zone, description) = (
                client.clone(),
                args.api.clone(),
                prefix.clone(),
                zone.clone(),
                description.clone(),
            );
            let i = v % total;
            batch.push(tokio::spawn(async move {
                client
                    .put(format!("{api}/clusters/{prefix}-{i:05}?zoneName={zone}"))
                    .json(&record(&prefix, i, v as u64 + 1, &description))
                    .send()
                    .await
                    .map(|r| r.status().is_success())
                    .unwrap_or(false)
            }));
        }
        next = (next + 16).min(args.singles);
        for w in batch {
            if !w.await? {
                bail!("PUT /clusters failed");
            }
        }
    }
    let cpu_written = cpu_ticks(args.pid)?;
    let rss_written = settled_rss(args.pid).await?;
    println!(
        "writes: {} bulk of {} records and {} single PUTs; aggregator RSS {rss_start:.1} MiB before, {rss_written:.1} MiB after ({:.2} s CPU)",
        args.bulk,
        args.bulk_size,
        args.singles,
        cpu_s(cpu_written - cpu_writes, args.clk_tck)
    );

    // The readers: each its own connection, from now on.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let events = Arc::new(AtomicU64::new(0));
    let resets = Arc::new(AtomicU64::new(0));
    let streams = reqwest::Client::new();
    let mut readers = Vec::with_capacity(args.readers);
    let cpu0 = cpu_ticks(args.pid)?;
    let t = Instant::now();
    for _ in 0..args.readers {
        let res = streams
            .get(format!("{}/events?zoneName={zone}", args.api))
            .send()
            .await
            .context("GET /events")?;
        if !res.status().is_success() {
            bail!("GET /events answered {}", res.status());
        }
        readers.push(tokio::spawn(read_stream(
            res,
            stop_rx.clone(),
            events.clone(),
            resets.clone(),
        )));
    }
    let opened = t.elapsed();
    let rss_readers = settled_rss(args.pid).await?;
    let cpu1 = cpu_ticks(args.pid)?;
    println!(
        "{} reading streams open in {:.1} s: aggregator RSS {rss_readers:.1} MiB (+{:.1}), {:.2} s CPU",
        args.readers,
        opened.as_secs_f64(),
        rss_readers - rss_written,
        cpu_s(cpu1 - cpu0, args.clk_tck)
    );

    // The stalled connections: resume from the oldest id, never read the body.
    let t = Instant::now();
    let mut stalled = Vec::with_capacity(args.stalled);
    let mut by_status = std::collections::BTreeMap::<Start, usize>::new();
    for _ in 0..args.stalled {
        let (status, conn) = open_stalled(addr, oldest, args.stalled_rcvbuf).await?;
        *by_status.entry(status).or_default() += 1;
        stalled.push(conn);
    }
    let opened = t.elapsed();
    let rss_stalled = settled_rss(args.pid).await?;
    let cpu2 = cpu_ticks(args.pid)?;
    println!(
        "{} stalled streams (since={oldest}) opened in {:.1} s, answers {by_status:?}: aggregator RSS {rss_stalled:.1} MiB (+{:.1} over the readers), {:.2} s CPU",
        args.stalled,
        opened.as_secs_f64(),
        rss_stalled - rss_readers,
        cpu_s(cpu2 - cpu1, args.clk_tck)
    );

    // Changes with every stream open.
    let changes = u64::from(args.rate) * args.duration;
    let mut tick = tokio::time::interval(Duration::from_secs(1) / args.rate);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let t = Instant::now();
    let mut writes = Vec::with_capacity(changes as usize);
    for v in 0..changes {
        tick.tick().await;
        let (client, api, prefix, zone, description) = (
            client.clone(),
            args.api.clone(),
            prefix.clone(),
            zone.clone(),
            description.clone(),
        );
        let i = v as usize % total.max(1);
        writes.push(tokio::spawn(async move {
            client
                .put(format!("{api}/clusters/{prefix}-{i:05}?zoneName={zone}"))
                .json(&record(&prefix, i, 1_000_000 + v, &description))
                .send()
                .await
                .map(|r| r.status().is_success())
                .unwrap_or(false)
        }));
    }
    let mut failed = 0;
    for w in writes {
        if !w.await? {
            failed += 1;
        }
    }
    let window = t.elapsed();
    let cpu3 = cpu_ticks(args.pid)?;
    // Readers get a bounded time for the last events.
    let want = changes * args.readers as u64;
    let deadline = Instant::now() + Duration::from_secs(5);
    while events.load(Ordering::Relaxed) < want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (rss_live, _) = memory_mib(args.pid)?;
    let cpu = cpu_s(cpu3 - cpu2, args.clk_tck);
    println!(
        "{changes} changes at {} /s over {:.1} s ({failed} failed): aggregator CPU {cpu:.2} s = {:.1} % of one core, RSS {rss_live:.1} MiB",
        args.rate,
        window.as_secs_f64(),
        100.0 * cpu / window.as_secs_f64()
    );
    println!(
        "readers received {} of {want} events, {} resets",
        events.load(Ordering::Relaxed),
        resets.load(Ordering::Relaxed)
    );

    // Close the stalled connections: what they held goes back.
    drop(stalled);
    let rss_closed = settled_rss(args.pid).await?;
    let (_, hwm) = memory_mib(args.pid)?;
    println!(
        "stalled connections closed: aggregator RSS {rss_closed:.1} MiB; high-water mark {hwm:.1} MiB"
    );
    let _ = stop_tx.send(true);
    for r in readers {
        r.await?;
    }
    Ok(())
}
