//! Ingest benchmark: starts the ingest runner (or targets a running aggregator), then N
//! simulated agents — real quinn clients with agent certificates — each sending a
//! report of real-shaped instances every interval. Measures connections established,
//! reports accepted and rejected, report-to-acknowledgement latency (the ingest server
//! acknowledges after the sink applied the report, so this is report-to-visible) and
//! the ingest process's CPU from /proc/<pid>/stat and its resident memory (now and
//! peak) from /proc/<pid>/status.

// The figures on standard output are this program's whole purpose.
#![allow(clippy::print_stdout)]

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command as Process, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use meshcat_bench::process::{cpu_ticks, memory_kib};
use meshcat_common::model::InstanceMetrics;
use meshcat_common::tls;
use meshcat_common::transport::{read_frame, write_frame};
use meshcat_common::wire::{
    AgentMessage, DEFAULT_MAX_MESSAGE, Hello, InstanceReport, Report, ServerMessage,
    UpstreamCluster, UpstreamHost,
};
use rand::Rng;

#[derive(Debug, Parser)]
#[command(about = "Simulated agents against the QUIC ingest server.")]
struct Args {
    /// Simulated agents (one QUIC connection each).
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    /// Instances per report.
    #[arg(long, default_value_t = 10)]
    instances: usize,
    /// Time between reports of one agent.
    #[arg(long, default_value = "5s", value_parser = meshcat_common::config::parse_positive_duration)]
    interval: Duration,
    /// Measured time, after every agent connected and one interval of warm-up.
    #[arg(long, default_value = "30s", value_parser = meshcat_common::config::parse_positive_duration)]
    duration: Duration,
    /// Agents sharing one client UDP socket.
    #[arg(long, default_value_t = 250)]
    per_socket: usize,
    /// New connections per second during ramp-up.
    #[arg(long, default_value_t = 500)]
    connect_rate: u64,
    /// Dev-mode data directory (certificates); a temporary one when absent.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Worker threads of the ingest runner.
    #[arg(long, default_value_t = 1)]
    ingest_threads: usize,
    /// Target a running ingest server instead of starting the runner (needs --pid).
    #[arg(long, requires = "pid")]
    addr: Option<SocketAddr>,
    /// Process whose CPU is measured when --addr is given.
    #[arg(long)]
    pid: Option<u32>,
}

/// Shared counters of all simulated agents.
#[derive(Debug, Default)]
struct Stats {
    connected: AtomicU64,
    connect_failures: AtomicU64,
    accepted: AtomicU64,
    rejected: AtomicU64,
    errors: AtomicU64,
    /// Acknowledgement latencies in microseconds, while measuring.
    latencies: Mutex<Vec<u32>>,
    measuring: std::sync::atomic::AtomicBool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let tmp = std::env::temp_dir().join(format!("meshcat-bench-{}", std::process::id()));
    let data_dir = args.data_dir.clone().unwrap_or(tmp.clone());
    let files = tls::dev_setup(&data_dir)?;

    let (addr, pid, mut child) = match args.addr {
        Some(addr) => (addr, args.pid.context("--pid")?, None),
        None => {
            let exe = std::env::current_exe()?
                .parent()
                .context("binary directory")?
                .join("meshcat-bench-ingest");
            let mut child = Process::new(exe)
                .arg("--data-dir")
                .arg(&data_dir)
                .arg("--threads")
                .arg(args.ingest_threads.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .context("starting meshcat-bench-ingest")?;
            let mut out = BufReader::new(child.stdout.take().context("stdout")?);
            let mut line = String::new();
            out.read_line(&mut line)?;
            let addr: SocketAddr = line
                .trim()
                .strip_prefix("listening ")
                .context("runner did not say where it listens")?
                .parse()?;
            let pid = child.id();
            (addr, pid, Some((child, out)))
        }
    };

    let sample = AgentMessage::Report(Report {
        sent_at_ms: 0,
        instances: reports_for(0, args.instances),
    });
    println!(
        "report of {} instances: {} bytes framed",
        args.instances,
        meshcat_common::wire::encode(&sample, usize::MAX)?.len()
    );
    let client = tls::client_config(&files.ca, Some((&files.agent_cert, &files.agent_key)))?;
    let stats = Arc::new(Stats::default());
    let stop = Arc::new(tokio::sync::Notify::new());
    let mut endpoints = Vec::new();
    let mut tasks = Vec::new();
    let ramp_start = Instant::now();
    let gap = Duration::from_secs(1) / args.connect_rate.max(1) as u32;
    for i in 0..args.agents {
        if i % args.per_socket == 0 {
            let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
            endpoint.set_default_client_config(client.clone());
            endpoints.push(endpoint);
        }
        let endpoint = endpoints.last().expect("an endpoint").clone();
        let agent = SimAgent {
            id: format!("bench-agent-{i}"),
            instances: reports_for(i, args.instances),
            interval: args.interval,
        };
        tasks.push(tokio::spawn(agent.run(
            endpoint,
            addr,
            stats.clone(),
            stop.clone(),
        )));
        tokio::time::sleep(gap).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while (stats.connected.load(Ordering::Relaxed) + stats.connect_failures.load(Ordering::Relaxed))
        < args.agents as u64
    {
        if Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ramp = ramp_start.elapsed();
    let connected = stats.connected.load(Ordering::Relaxed);
    println!(
        "connected {connected}/{} in {:.1}s ({} failed)",
        args.agents,
        ramp.as_secs_f64(),
        stats.connect_failures.load(Ordering::Relaxed)
    );
    // One interval of warm-up so every agent is in its steady rhythm.
    tokio::time::sleep(args.interval).await;

    let cpu_before = cpu_ticks(pid)?;
    let own_before = cpu_ticks(std::process::id())?;
    let accepted_before = stats.accepted.load(Ordering::Relaxed);
    let rejected_before = stats.rejected.load(Ordering::Relaxed);
    stats.measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(args.duration).await;
    let elapsed = started.elapsed().as_secs_f64();
    stats.measuring.store(false, Ordering::Relaxed);
    let cpu_after = cpu_ticks(pid)?;
    let own_after = cpu_ticks(std::process::id())?;
    let accepted = stats.accepted.load(Ordering::Relaxed) - accepted_before;
    let rejected = stats.rejected.load(Ordering::Relaxed) - rejected_before;
    let ticks = clock_ticks();
    let cpu = (cpu_after - cpu_before) as f64 / ticks / elapsed * 100.0;
    let own_cpu = (own_after - own_before) as f64 / ticks / elapsed * 100.0;
    let mut lat = std::mem::take(&mut *stats.latencies.lock().expect("latencies"));
    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
        f64::from(lat[i]) / 1000.0
    };
    println!(
        "measured {elapsed:.1}s: reports accepted {accepted} ({:.0}/s, {:.0} instances/s), rejected {rejected}, errors {}",
        accepted as f64 / elapsed,
        accepted as f64 * args.instances as f64 / elapsed,
        stats.errors.load(Ordering::Relaxed)
    );
    println!(
        "ingest cpu {cpu:.1}% of one core (load generator {own_cpu:.0}%); ack latency ms p50 {:.2} p99 {:.2} max {:.2}",
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    let (rss, hwm) = memory_kib(pid)?;
    println!(
        "ingest memory: resident {:.0} MiB, peak {:.0} MiB",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );

    stop.notify_waiters();
    for endpoint in &endpoints {
        endpoint.close(0u32.into(), b"bench over");
    }
    for task in tasks {
        task.abort();
    }
    if let Some((mut child, mut out)) = child.take() {
        drop(child.stdin.take());
        let mut rest = String::new();
        while out.read_line(&mut rest)? > 0 {}
        print!("ingest runner: {rest}");
        std::io::stdout().flush()?;
        let status = child.wait()?;
        if !status.success() {
            bail!("ingest runner exited with {status}");
        }
    }
    if args.data_dir.is_none() {
        let _ = std::fs::remove_dir_all(tmp);
    }
    Ok(())
}

struct SimAgent {
    id: String,
    instances: Vec<InstanceReport>,
    interval: Duration,
}

impl SimAgent {
    async fn run(
        self,
        endpoint: quinn::Endpoint,
        addr: SocketAddr,
        stats: Arc<Stats>,
        stop: Arc<tokio::sync::Notify>,
    ) {
        // The control stream stays open for the connection's life.
        let (conn, _control) = match self.hello(&endpoint, addr).await {
            Ok(opened) => opened,
            Err(e) => {
                eprintln!("{}: {e:#}", self.id);
                stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        stats.connected.fetch_add(1, Ordering::Relaxed);
        // Spread the agents over the interval, as real ones started at random times.
        let offset = self.interval.mul_f64(rand::rng().random_range(0.0..1.0));
        tokio::time::sleep(offset).await;
        let mut ticker = tokio::time::interval(self.interval);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                () = stop.notified() => return,
            }
            let started = Instant::now();
            match send_report(&conn, &self.instances).await {
                Ok(true) => {
                    stats.accepted.fetch_add(1, Ordering::Relaxed);
                    if stats.measuring.load(Ordering::Relaxed) {
                        let us = started.elapsed().as_micros().min(u32::MAX as u128) as u32;
                        stats.latencies.lock().expect("latencies").push(us);
                    }
                }
                Ok(false) => {
                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("{}: {e:#}", self.id);
                    if conn.close_reason().is_some() {
                        return;
                    }
                }
            }
        }
    }

    async fn hello(
        &self,
        endpoint: &quinn::Endpoint,
        addr: SocketAddr,
    ) -> anyhow::Result<(quinn::Connection, (quinn::SendStream, quinn::RecvStream))> {
        let conn = endpoint.connect(addr, "localhost")?.await?;
        let (mut send, mut recv) = conn.open_bi().await?;
        let hello = AgentMessage::Hello(Hello {
            agent_id: self.id.clone(),
            agent_version: "bench".into(),
            token: None,
        });
        write_frame(&mut send, &hello, DEFAULT_MAX_MESSAGE).await?;
        match read_frame::<ServerMessage>(&mut recv, DEFAULT_MAX_MESSAGE).await? {
            Some(ServerMessage::Welcome { .. }) => Ok((conn, (send, recv))),
            other => bail!("hello refused: {other:?}"),
        }
    }
}

async fn send_report(
    conn: &quinn::Connection,
    instances: &[InstanceReport],
) -> anyhow::Result<bool> {
    let (mut send, mut recv) = conn.open_bi().await?;
    let report = AgentMessage::Report(Report {
        sent_at_ms: 0,
        instances: instances.to_vec(),
    });
    write_frame(&mut send, &report, DEFAULT_MAX_MESSAGE).await?;
    send.finish()?;
    match read_frame::<ServerMessage>(&mut recv, DEFAULT_MAX_MESSAGE).await? {
        Some(ServerMessage::ReportAccepted { .. }) => Ok(true),
        Some(ServerMessage::Rejected { .. }) => Ok(false),
        other => bail!("unexpected answer: {other:?}"),
    }
}

/// Real-shaped snapshots: filled metrics and a few upstream clusters with hosts.
fn reports_for(agent: usize, count: usize) -> Vec<InstanceReport> {
    (0..count)
        .map(|i| {
            let requests = 10_000 + (agent * 37 + i * 11) as i64;
            let metrics = InstanceMetrics {
                mesh_metrics_version: "1".into(),
                total_requests: requests,
                http_requests: requests,
                all_requests: requests,
                all_routes: "/".into(),
                latency_avg: 4.2,
                latency_count: requests,
                latency_max: 250,
                latency_min: 1,
                latency_sum: requests * 4,
                latency_p50: 3,
                latency_p90: 8,
                latency_p95: 12,
                latency_p99: 40,
                latency_p9990: 120,
                latency_p9999: 240,
                errors_count: requests / 100,
                in_throughput: requests * 900,
                out_throughput: requests * 4_000,
                num_goroutines: 2,
                start_time: 1_700_000_000_000,
                cpu_pct: 12.5,
                cpu_cores: 4,
                os: "linux".into(),
                os_arch: "x86_64".into(),
                memory_available: 8 << 30,
                memory_used: 4 << 30,
                process_memory_used: 48 << 20,
                memory_used_percent: 50.0,
                ..InstanceMetrics::default()
            };
            let clusters = ["local_service", "auth", "catalog", "edge"]
                .iter()
                .enumerate()
                .map(|(c, name)| UpstreamCluster {
                    name: (*name).into(),
                    added_via_api: c > 0,
                    hosts: (0..2)
                        .map(|h| UpstreamHost {
                            address: format!("10.{}.{}.{}:8080", c, agent % 250, h + 1),
                            cx_active: 3,
                            cx_connect_fail: 0,
                            cx_total: 120,
                            rq_active: 1,
                            rq_error: 2,
                            rq_total: 4_000,
                            health_flags: "healthy".into(),
                        })
                        .collect(),
                })
                .collect();
            InstanceReport {
                admin_address: "127.0.0.1:9901".into(),
                reachable: true,
                start_time_ms: 1_700_000_000_000,
                server_state: "LIVE".into(),
                envoy_version: "1.40.0/Clean/RELEASE/BoringSSL".into(),
                log_level: Some("info".into()),
                requests_total: requests as u64,
                errors_5xx_total: (requests / 100) as u64,
                metrics,
                clusters,
                ..InstanceReport::unread(
                    format!("zone-{}", agent % 4),
                    format!("service-{}", agent % 200),
                    format!("pod-{agent}-{i}"),
                )
            }
        })
        .collect()
}

/// Clock ticks per second (`getconf CLK_TCK`), 100 when it cannot be asked.
fn clock_ticks() -> f64 {
    Process::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}
