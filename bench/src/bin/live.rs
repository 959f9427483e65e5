//! Live-update benchmark: `--streams` open `GET /events` streams on a running
//! aggregator while `--rate` catalog changes a second (`PUT /clusters/{name}` of
//! `--clusters` registered clusters, each with a new `version`) go on for
//! `--duration`. It reports the aggregator's CPU over that window (utime + stime of
//! `/proc/<pid>/stat`), its resident memory (`VmRSS`, `VmHWM`) before and after
//! the streams opened and at the end, and the latency of each stream receiving each
//! change's event, as p50/p99/max: from the write's answer (the change was applied
//! before it; an event that arrives earlier counts as 0) and, as an upper bound,
//! from the write being sent.

// A command-line benchmark: its report goes to stdout.
#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use meshcat_bench::process::{cpu_ticks, memory_mib};
use serde_json::{Value, json};

#[derive(Debug, Parser)]
struct Args {
    /// The aggregator's API, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    api: String,
    /// The aggregator's process id, for its CPU time and memory.
    #[arg(long)]
    pid: u32,
    /// Open `GET /events` streams (0: the writes alone, as a baseline).
    #[arg(long, default_value_t = 1000)]
    streams: usize,
    /// Changes per second.
    #[arg(long, default_value_t = 100)]
    rate: u32,
    /// Seconds of changes.
    #[arg(long, default_value_t = 30)]
    duration: u64,
    /// Registered clusters the changes rotate over.
    #[arg(long, default_value_t = 100)]
    clusters: usize,
    /// Prefix of the zone and cluster names, so runs against one aggregator do not
    /// collide.
    #[arg(long, default_value = "live")]
    prefix: String,
    /// Clock ticks per second of `/proc/<pid>/stat` (`getconf CLK_TCK`).
    #[arg(long, default_value_t = 100)]
    clk_tck: u64,
}

fn record(prefix: &str, i: usize, version: u64) -> Value {
    json!({
        "clusterName": format!("{prefix}-{i:04}"), "zoneName": format!("{prefix}-zone"),
        "name": format!("Service {i}"), "version": version.to_string(),
        "owner": format!("team-{}", i % 10), "capability": format!("cap-{}", i % 5),
        "documentation": "/docs/service", "description": "A benchmark service.",
        "minInstances": 1, "protocols": ["http"], "businessImpact": "medium",
    })
}

/// Nanoseconds since `t0`.
fn since(t0: Instant) -> u64 {
    t0.elapsed().as_nanos() as u64
}

/// The version an event's data carries (`"version":"<n>"`), found without parsing
/// the whole record so that the reading side stays cheap.
fn version_of(block: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"version\":\"";
    let at = block.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let digits = &block[at..];
    let end = digits.iter().position(|b| !b.is_ascii_digit())?;
    std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
}

/// What one stream saw: each `cluster` event's version with the time it arrived
/// (nanoseconds since the start), and the resets.
#[derive(Default)]
struct Seen {
    events: Vec<(u64, u64)>,
    resets: usize,
}

/// Reads one stream until it has `expected` events or `stop` turns true.
async fn read_stream(
    mut res: reqwest::Response,
    t0: Instant,
    expected: usize,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Seen {
    let mut seen = Seen::default();
    let mut buf: Vec<u8> = Vec::new();
    while seen.events.len() < expected {
        let chunk = tokio::select! {
            c = res.chunk() => c,
            _ = stop.wait_for(|s| *s) => break,
        };
        let Ok(Some(chunk)) = chunk else {
            break;
        };
        let now = since(t0);
        buf.extend_from_slice(&chunk);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let block: Vec<u8> = buf.drain(..end + 2).collect();
            if block.starts_with(b"event: reset") {
                seen.resets += 1;
            }
            if !block.starts_with(b"event: cluster\n") {
                continue;
            }
            if let Some(v) = version_of(&block) {
                seen.events.push((v, now));
            }
        }
    }
    seen
}

fn quantile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    f64::from(sorted[i]) / 1000.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.rate == 0 || args.clusters == 0 || args.duration == 0 {
        bail!("--rate, --clusters and --duration must be at least 1");
    }
    let client = reqwest::Client::new();
    let prefix = args.prefix.clone();
    let zone = format!("{prefix}-zone");
    let r = client
        .post(format!("{}/zones", args.api))
        .json(&json!({"zoneName": zone, "serverAddress": "cp.mesh:50000"}))
        .send()
        .await
        .context("POST /zones")?;
    if !r.status().is_success() {
        bail!("POST /zones answered {}", r.status());
    }
    for i in 0..args.clusters {
        let r = client
            .post(format!("{}/clusters", args.api))
            .json(&record(&prefix, i, 0))
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("POST /clusters answered {}", r.status());
        }
    }
    let (rss_before, _) = memory_mib(args.pid)?;

    let changes = (u64::from(args.rate) * args.duration) as usize;
    // When each write was sent and answered (nanoseconds since t0), by version;
    // versions start at 1.
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..=changes).map(|_| AtomicU64::new(0)).collect());
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..=changes).map(|_| AtomicU64::new(0)).collect());
    let t0 = Instant::now();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // One client: each open stream holds its own connection, as separate browsers
    // would.
    let streams = reqwest::Client::new();
    let mut readers = Vec::with_capacity(args.streams);
    for _ in 0..args.streams {
        let res = streams
            .get(format!("{}/events?zoneName={zone}", args.api))
            .send()
            .await
            .context("GET /events")?;
        if !res.status().is_success() {
            bail!("GET /events answered {}", res.status());
        }
        readers.push(tokio::spawn(read_stream(res, t0, changes, stop_rx.clone())));
    }
    let (rss_open, _) = memory_mib(args.pid)?;
    println!(
        "{} streams open; aggregator RSS {rss_before:.1} MiB before, {rss_open:.1} MiB with them",
        args.streams
    );

    // The writes: one every 1/rate seconds, each on its own task so a slow commit
    // does not hold back the schedule.
    let failed = Arc::new(AtomicUsize::new(0));
    let cpu0 = cpu_ticks(args.pid)?;
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / args.rate);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut writes = Vec::with_capacity(changes);
    for v in 1..=changes as u64 {
        tick.tick().await;
        let (client, api, prefix, zone, sent, acked, failed) = (
            client.clone(),
            args.api.clone(),
            prefix.clone(),
            zone.clone(),
            sent.clone(),
            acked.clone(),
            failed.clone(),
        );
        let i = (v as usize) % args.clusters;
        writes.push(tokio::spawn(async move {
            sent[v as usize].store(since(t0), Ordering::Release);
            let r = client
                .put(format!("{api}/clusters/{prefix}-{i:04}?zoneName={zone}"))
                .json(&record(&prefix, i, v))
                .send()
                .await;
            match r {
                Ok(r) if r.status().is_success() => {
                    acked[v as usize].store(since(t0).max(1), Ordering::Release);
                }
                _ => {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for w in writes {
        w.await?;
    }
    let window = started.elapsed();
    let cpu1 = cpu_ticks(args.pid)?;

    // Stragglers get a bounded time after the last write; a stream that misses
    // events shows in the report.
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let _ = stop_tx.send(true);
    });
    let mut from_answer = Vec::new();
    let mut from_sent = Vec::new();
    let (mut early, mut resets, mut short, mut received) = (0usize, 0usize, 0usize, 0usize);
    for r in readers {
        let s = r.await?;
        resets += s.resets;
        if s.events.len() < changes {
            short += 1;
        }
        received += s.events.len();
        for (v, at) in s.events {
            let (Some(sent), Some(acked)) = (sent.get(v as usize), acked.get(v as usize)) else {
                continue;
            };
            let (sent, acked) = (sent.load(Ordering::Acquire), acked.load(Ordering::Acquire));
            if acked == 0 {
                continue;
            }
            // Before the write's answer: the change was applied, the answer was
            // still on its way.
            if at < acked {
                early += 1;
            }
            let us = |from: u64| (at.saturating_sub(from) / 1000).min(u64::from(u32::MAX)) as u32;
            from_answer.push(us(acked));
            from_sent.push(us(sent));
        }
    }
    let (rss_end, hwm) = memory_mib(args.pid)?;
    from_answer.sort_unstable();
    from_sent.sort_unstable();

    let cpu_s = (cpu1 - cpu0) as f64 / args.clk_tck as f64;
    println!(
        "changes: {changes} at {} /s over {:.1} s ({} failed)",
        args.rate,
        window.as_secs_f64(),
        failed.load(Ordering::Relaxed)
    );
    println!(
        "events received: {received} of {} ({early} before their write's answer), streams short of events: {short}, resets: {resets}",
        changes * args.streams
    );
    println!(
        "aggregator CPU: {cpu_s:.2} s over {:.1} s = {:.1} % of one core",
        window.as_secs_f64(),
        100.0 * cpu_s / window.as_secs_f64()
    );
    println!("aggregator RSS: {rss_end:.1} MiB at the end, high-water mark {hwm:.1} MiB");
    for (label, l) in [
        ("write answered -> event received", &from_answer),
        ("write sent -> event received", &from_sent),
    ] {
        println!(
            "{label}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            quantile(l, 0.50),
            quantile(l, 0.99),
            quantile(l, 1.0)
        );
    }
    Ok(())
}
