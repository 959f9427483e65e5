//! Graph benchmark against a running aggregator (`--dev`, clusters registered
//! beforehand as `<prefix>-NNNNNN` in `zone-NN`, as `meshcat-bench-writes` names
//! them): simulated agents over the real QUIC ingest report one instance of every
//! cluster, first without upstream traffic, then each instance calling
//! `--upstreams` other clusters of its zone with moving counters. It measures:
//!
//! - the aggregator's resident memory with the clusters and no edges, then with
//!   the edges (after a whole graph window of traffic), each after the graph was
//!   read (gzip, as the measured requests read it), and again after the requests;
//!   the difference per edge is taken from the larger of the two;
//! - `GET /graph` over one keep-alive connection with `Accept-Encoding: gzip`, one
//!   request after the other for `--duration`: latency percentiles (time to the
//!   last byte of the body);
//! - with `--ops`, the ops port's `GET /metrics` with the per-cluster and per-edge
//!   series at this size: the exposition's size and series, `--scrapes` scrapes one
//!   after the other in identity encoding and as many with `Accept-Encoding: gzip`
//!   (time to the last byte, the aggregator's CPU per scrape), then as many gzip
//!   scrapes each after a registration change (so that each builds the graph
//!   afresh); its line reads `metrics: <bytes> bytes (<bytes> gzip), <series>
//!   series, ...`.
//!
//! The last line reads `graph: p99 <ms> ms, <bytes> bytes per edge, <nodes> nodes,
//! <edges> edges`.

// The figures on standard output are this program's whole purpose.
#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use meshcat_bench::process::{clock_ticks, cpu_ticks, memory_kib};
use meshcat_bench::sim::{self, SimAgent, Stats};
use meshcat_common::tls;
use serde_json::Value;

#[derive(Debug, Parser)]
#[command(about = "GET /graph latency and memory per edge with simulated agents.")]
struct Args {
    /// The aggregator's API.
    #[arg(long)]
    api: String,
    /// The aggregator's QUIC ingest.
    #[arg(long)]
    quic: SocketAddr,
    /// The aggregator's process, whose memory is read.
    #[arg(long)]
    pid: u32,
    /// The aggregator's data directory (`--dev`: the agent certificate).
    #[arg(long)]
    data_dir: PathBuf,
    /// Registered clusters, `<prefix>-NNNNNN` for N below this, in `zone-NN` (N mod zones).
    #[arg(long, default_value_t = 10_000)]
    clusters: usize,
    #[arg(long, default_value_t = 20)]
    zones: usize,
    #[arg(long, default_value = "svc")]
    prefix: String,
    /// Upstream clusters each instance calls: edges = clusters x upstreams.
    #[arg(long, default_value_t = 5)]
    upstreams: usize,
    /// Simulated agents; the instances (one per cluster) are spread over them.
    #[arg(long, default_value_t = 100)]
    agents: usize,
    #[arg(long, default_value = "5s", value_parser = meshcat_common::config::parse_positive_duration)]
    interval: Duration,
    /// Traffic before memory is read: the aggregator's graph window, so that every
    /// upstream holds a whole window of samples.
    #[arg(long, default_value = "60s", value_parser = meshcat_common::config::parse_positive_duration)]
    window: Duration,
    /// Time `GET /graph` is measured.
    #[arg(long, default_value = "20s", value_parser = meshcat_common::config::parse_positive_duration)]
    duration: Duration,
    /// The aggregator's ops base URL (http://host:port): `GET /metrics` is measured
    /// too.
    #[arg(long)]
    ops: Option<String>,
    /// Scrapes of `/metrics` measured in a row, then as many after a change each.
    #[arg(long, default_value_t = 20)]
    scrapes: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let files = tls::dev_setup(&args.data_dir)?;
    let client_tls = tls::client_config(&files.ca, Some((&files.agent_cert, &files.agent_key)))?;
    let stats = Arc::new(Stats::default());
    let stop = Arc::new(tokio::sync::Notify::new());
    let traffic = Arc::new(AtomicBool::new(false));
    let per_agent = args.clusters.div_ceil(args.agents);
    let name = |c: usize| format!("{}-{c:06}", args.prefix);
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    endpoint.set_default_client_config(client_tls);
    let mut tasks = Vec::new();
    for a in 0..args.agents {
        let instances = (a * per_agent..((a + 1) * per_agent).min(args.clusters))
            .map(|c| {
                // Calls stay in the zone: clusters c + k * zones share c's zone.
                let calls: Vec<String> = (1..=args.upstreams)
                    .map(|k| name((c + k * args.zones) % args.clusters))
                    .collect();
                sim::instance(
                    format!("zone-{:02}", c % args.zones),
                    name(c),
                    format!("{}-pod", name(c)),
                    a,
                    c,
                    &calls,
                )
            })
            .collect();
        let agent = SimAgent {
            id: format!("bench-graph-agent-{a}"),
            instances,
            interval: args.interval,
            traffic: traffic.clone(),
            deltas: true,
        };
        tasks.push(tokio::spawn(agent.run(
            endpoint.clone(),
            args.quic,
            stats.clone(),
            stop.clone(),
        )));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()?;
    let graph_url = format!("{}/graph", args.api);

    println!(
        "==> {} instances (one per cluster) from {} agents, no upstream traffic",
        args.clusters, args.agents
    );
    wait_reports(&stats, args.agents as u64 * 2, args.interval * 4).await?;
    // As long as with the edges below, so that both are read in a steady state.
    tokio::time::sleep(args.window).await;
    let (nodes, edges) = counts(&http, &graph_url).await?;
    let without = settled_rss(args.pid).await?;
    println!("graph: {nodes} nodes, {edges} edges; aggregator RSS {without} KiB");

    println!(
        "==> the same instances calling {} clusters each, for {:?} (the graph window)",
        args.upstreams, args.window
    );
    traffic.store(true, Ordering::Relaxed);
    let expected = (args.clusters * args.upstreams) as u64;
    let deadline = Instant::now() + args.interval * 6;
    let (mut nodes, mut edges) = (0, 0);
    while edges < expected {
        if Instant::now() > deadline {
            bail!("the graph shows {edges} of {expected} edges");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        (nodes, edges) = counts(&http, &graph_url).await?;
    }
    println!("graph: {nodes} nodes, {edges} edges");
    tokio::time::sleep(args.window).await;
    let (nodes, edges) = counts(&http, &graph_url).await?;
    let with = settled_rss(args.pid).await?;
    let per_edge = |rss: u64| (rss.saturating_sub(without)) as f64 * 1024.0 / edges.max(1) as f64;
    println!(
        "graph: {nodes} nodes, {edges} edges; aggregator RSS {with} KiB: {:.0} bytes per edge",
        per_edge(with)
    );

    println!(
        "==> GET /graph, one connection, Accept-Encoding: gzip, {:?}",
        args.duration
    );
    let mut latencies = Vec::new();
    let mut gzip_len = 0;
    let started = Instant::now();
    while started.elapsed() < args.duration {
        let t = Instant::now();
        let res = http
            .get(&graph_url)
            .header("accept-encoding", "gzip")
            .send()
            .await?;
        if res.headers().get("content-encoding").map(|v| v.as_bytes()) != Some(b"gzip") {
            bail!("GET /graph answered without gzip");
        }
        gzip_len = res.bytes().await?.len();
        latencies.push(t.elapsed());
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let pct = |p: f64| {
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i].as_secs_f64() * 1000.0
    };
    println!(
        "{} requests ({:.0}/s), body {gzip_len} bytes gzip; ms p50 {:.2} p90 {:.2} p99 {:.2} max {:.2}",
        latencies.len(),
        latencies.len() as f64 / elapsed,
        pct(0.5),
        pct(0.9),
        pct(0.99),
        pct(1.0)
    );
    // The steady state under reads: what the requests' renderings add counts too.
    let after = settled_rss(args.pid).await?;
    let per_edge = per_edge(with.max(after));
    let plain = http.get(&graph_url).send().await?.bytes().await?.len();
    println!(
        "aggregator RSS {without} KiB without the edges, {with} KiB with them, {after} KiB after the requests ({per_edge:.0} bytes per edge); identity body {plain} bytes"
    );
    let metrics = match &args.ops {
        Some(ops) => Some(measure_metrics(&http, ops, &args.api, args.pid, args.scrapes).await?),
        None => None,
    };
    println!(
        "reports accepted {}, rejected {}, errors {}",
        stats.accepted.load(Ordering::Relaxed),
        stats.rejected.load(Ordering::Relaxed),
        stats.errors.load(Ordering::Relaxed)
    );
    if let Some(line) = metrics {
        println!("{line}");
    }
    stop.notify_waiters();
    endpoint.close(0u32.into(), b"bench over");
    for t in tasks {
        t.abort();
    }
    println!(
        "graph: p99 {:.2} ms, {per_edge:.0} bytes per edge, {nodes} nodes, {edges} edges",
        pct(0.99)
    );
    Ok(())
}

/// The families of the per-cluster and per-edge series (`--cluster-metrics`).
const CLUSTER_FAMILIES: [&str; 4] = [
    "meshcat_cluster_status",
    "meshcat_cluster_instances",
    "meshcat_edge_requests_total",
    "meshcat_edge_errors_total",
];

/// Measures `GET /metrics` on the ops port: the exposition, `scrapes` scrapes in a
/// row in identity encoding and as many with `Accept-Encoding: gzip` (as Prometheus
/// scrapes), each with the aggregator's CPU time per scrape (less what it spends
/// meanwhile without scrapes), then `scrapes` gzip scrapes each after a
/// registration change. Returns the summary line.
async fn measure_metrics(
    http: &reqwest::Client,
    ops: &str,
    api: &str,
    pid: u32,
    scrapes: usize,
) -> anyhow::Result<String> {
    let url = format!("{ops}/metrics");
    let scrape = |gzip: bool| {
        let req = http.get(&url);
        let req = if gzip {
            req.header("accept-encoding", "gzip")
        } else {
            req
        };
        async move {
            let t = Instant::now();
            let res = req.send().await?.error_for_status()?;
            let gzipped =
                res.headers().get("content-encoding").map(|v| v.as_bytes()) == Some(b"gzip");
            if gzipped != gzip {
                bail!("GET /metrics answered gzip {gzipped} when asked {gzip}");
            }
            let body = res.bytes().await?;
            anyhow::Ok((t.elapsed(), body))
        }
    };
    // Scrapes in a row: their times, and the aggregator's CPU per scrape.
    let in_a_row = |gzip: bool| async move {
        let mut times = Vec::with_capacity(scrapes);
        let ticks = cpu_ticks(pid)?;
        let started = Instant::now();
        for _ in 0..scrapes {
            times.push(scrape(gzip).await?.0);
        }
        let (busy, spent) = (cpu_ticks(pid)? - ticks, started.elapsed());
        // The same time without scrapes: what the agents' reports cost meanwhile.
        let ticks = cpu_ticks(pid)?;
        tokio::time::sleep(spent).await;
        let idle = cpu_ticks(pid)? - ticks;
        let cpu_ms = busy.saturating_sub(idle) as f64 * 1000.0 / clock_ticks() / scrapes as f64;
        anyhow::Ok((times, cpu_ms))
    };
    let ms = |d: &[Duration], p: f64| {
        let mut d = d.to_vec();
        d.sort_unstable();
        let i = ((d.len() as f64 * p).ceil() as usize).clamp(1, d.len()) - 1;
        d[i].as_secs_f64() * 1000.0
    };
    let figures = |d: &[Duration]| {
        format!(
            "ms p50 {:.1} p90 {:.1} p99 {:.1} max {:.1}",
            ms(d, 0.5),
            ms(d, 0.9),
            ms(d, 0.99),
            ms(d, 1.0)
        )
    };

    let (_, body) = scrape(false).await?;
    let (_, zipped) = scrape(true).await?;
    println!("==> GET /metrics on the ops port, {scrapes} scrapes in a row, identity");
    let (plain, plain_cpu) = in_a_row(false).await?;
    println!(
        "{}; aggregator CPU {plain_cpu:.1} ms per scrape",
        figures(&plain)
    );
    println!("==> {scrapes} scrapes in a row, Accept-Encoding: gzip");
    let (gzip, gzip_cpu) = in_a_row(true).await?;
    println!(
        "{}; aggregator CPU {gzip_cpu:.1} ms per scrape",
        figures(&gzip)
    );
    println!("==> {scrapes} gzip scrapes, each after a registration change");
    let mut changed = Vec::with_capacity(scrapes);
    for i in 0..scrapes {
        http.post(format!("{api}/clusters"))
            .json(&serde_json::json!({
                "zoneName": "zone-00",
                "clusterName": format!("bench-metrics-{i:04}"),
                "name": "A cluster written to move the catalog index.",
                "owner": "team-bench",
            }))
            .send()
            .await?
            .error_for_status()?;
        changed.push(scrape(true).await?.0);
    }
    println!("{}", figures(&changed));

    let text = std::str::from_utf8(&body)?;
    let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    let ours: Vec<&&str> = samples
        .iter()
        .filter(|l| CLUSTER_FAMILIES.iter().any(|f| l.starts_with(f)))
        .collect();
    let ours_bytes: usize = ours.iter().map(|l| l.len() + 1).sum();
    println!(
        "exposition {} bytes, {} gzip; {} series, of which {} cluster and edge series in {ours_bytes} bytes ({:.0} bytes each)",
        body.len(),
        zipped.len(),
        samples.len(),
        ours.len(),
        ours_bytes as f64 / ours.len().max(1) as f64
    );
    Ok(format!(
        "metrics: {} bytes ({} gzip), {} series ({} cluster and edge); scrape p50 {:.1} ms p99 {:.1} ms ({plain_cpu:.1} ms CPU), gzip p50 {:.1} ms p99 {:.1} ms ({gzip_cpu:.1} ms CPU), after a change p50 {:.1} ms p99 {:.1} ms",
        body.len(),
        zipped.len(),
        samples.len(),
        ours.len(),
        ms(&plain, 0.5),
        ms(&plain, 0.99),
        ms(&gzip, 0.5),
        ms(&gzip, 0.99),
        ms(&changed, 0.5),
        ms(&changed, 0.99)
    ))
}

/// Waits until `n` reports were accepted (each agent's first ones).
async fn wait_reports(stats: &Stats, n: u64, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while stats.accepted.load(Ordering::Relaxed) < n {
        if Instant::now() > deadline {
            bail!(
                "{} of {n} reports accepted ({} rejected, {} errors, {} agents connected)",
                stats.accepted.load(Ordering::Relaxed),
                stats.rejected.load(Ordering::Relaxed),
                stats.errors.load(Ordering::Relaxed),
                stats.connected.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// The whole graph's node and edge counts, read as the measured requests read it
/// (gzip).
async fn counts(http: &reqwest::Client, url: &str) -> anyhow::Result<(u64, u64)> {
    let body = http
        .get(url)
        .header("accept-encoding", "gzip")
        .send()
        .await?
        .error_for_status()?
        .bytes()
        .await?;
    let g: Value = serde_json::from_reader(flate2::read::GzDecoder::new(&body[..]))?;
    let len = |k: &str| g[k].as_array().map_or(0, |a| a.len() as u64);
    Ok((len("nodes"), len("edges")))
}

/// The process's resident memory in KiB once it moved by less than 1 MiB over two
/// seconds (at most 30 s).
async fn settled_rss(pid: u32) -> anyhow::Result<u64> {
    let mut last = memory_kib(pid).context("aggregator memory")?.0;
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = memory_kib(pid)?.0;
        if now.abs_diff(last) < 1024 {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}
