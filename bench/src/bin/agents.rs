//! Ingest benchmark: starts the ingest runner (or targets a running aggregator), then N
//! simulated agents — real quinn clients with agent certificates — each sending a
//! report of real-shaped instances every interval, each instance with `--upstreams`
//! upstream clusters whose traffic counters move on every report. Measures connections established,
//! reports accepted and rejected, report-to-acknowledgement latency (the ingest server
//! acknowledges after the sink applied the report, so this is report-to-visible) and
//! the ingest process's CPU from /proc/<pid>/stat and its resident memory (now and
//! peak) from /proc/<pid>/status. With `--xds` the sidecars are connected to their
//! control server and in sync with the mesh `--write-mesh` writes (the control
//! server's `--mesh` file), so the aggregator compares every report with the view.
//! With `--flip-instances K` (and `--xds`), the first K instances of each of the
//! first `--flip-agents` agents alternate, report by report, between the mesh's host
//! set of their first upstream cluster (`synced`) and one lacking one of its
//! endpoints (`stale` once the aggregator's `--sync-grace` is over), the first report
//! matching in even-numbered agents and differing in odd-numbered ones (so that about
//! half of them are stale at any time); each such report sent in the measured time
//! writes `flip <instance> <synced|stale> <epoch_ms>` per flipping instance (the state
//! it should cause, and the wall clock just before the report is written to its QUIC
//! stream, ms since the epoch) to `--flip-log` or standard output, for
//! `meshcat-bench-control sync-latency`.

// The figures on standard output are this program's whole purpose.
#![allow(clippy::print_stdout)]

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command as Process, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use meshcat_bench::process::{clock_ticks, cpu_ticks, memory_kib};
use meshcat_bench::sim::{self, SimAgent, Stats};
use meshcat_common::tls;
use meshcat_common::wire::{AgentMessage, InstanceReport, Report};

#[derive(Debug, Parser)]
#[command(about = "Simulated agents against the QUIC ingest server.")]
struct Args {
    /// Simulated agents (one QUIC connection each).
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    /// Instances per report.
    #[arg(long, default_value_t = 10)]
    instances: usize,
    /// Upstream clusters with traffic per instance (0: reports as an agent older than
    /// the graph sends them).
    #[arg(long, default_value_t = 5)]
    upstreams: usize,
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
    /// Agents whose first instance is a sidecar of a mesh without configuration
    /// scoping, knowing --large-clusters idle upstream clusters.
    #[arg(long, default_value_t = 0)]
    large: usize,
    /// Upstream clusters (of 5 hosts each) of each large sidecar.
    #[arg(long, default_value_t = 20_000)]
    large_clusters: usize,
    /// Send every report whole (as agents of protocol version 1 did) instead of
    /// deltas against the acknowledged one.
    #[arg(long)]
    whole: bool,
    /// Zones the agents' services are spread over (`zone-<agent % zones>`).
    #[arg(long, default_value_t = 4)]
    zones: usize,
    /// Sidecars connected to their control server over xDS and in sync with the mesh
    /// of --write-mesh: the reports carry the xDS state, and each upstream cluster
    /// holds that mesh cluster's --mesh-endpoints hosts, the same in every sidecar.
    #[arg(long)]
    xds: bool,
    /// Endpoints of each cluster of the mesh (--xds, --write-mesh).
    #[arg(long, default_value_t = 10)]
    mesh_endpoints: usize,
    /// Clusters of the mesh --write-mesh writes (service-0 to service-<N-1>; the
    /// agents' services and upstreams are among the first 200).
    #[arg(long, default_value_t = 10_000)]
    mesh_clusters: usize,
    /// Write the mesh (a meshcat-control-server --mesh file, JSON) to this file and
    /// exit.
    #[arg(long)]
    write_mesh: Option<PathBuf>,
    /// Sidecars that flip (needs --xds): the first K instances of each of the first
    /// --flip-agents agents report, report by report, the mesh's host set of their
    /// first upstream cluster (synced) and one lacking one of its endpoints (stale once
    /// the aggregator's --sync-grace is over), the first report matching in
    /// even-numbered agents and differing in odd-numbered ones. Each such report sent
    /// in the measured time writes a line `flip <instance> <synced|stale> <epoch_ms>`
    /// per flipping instance: the state it should cause and the wall clock just before
    /// the report is written to its QUIC stream (ms since the epoch).
    #[arg(long, default_value_t = 0, value_name = "K")]
    flip_instances: usize,
    /// Agents with flipping sidecars (--flip-instances): the first N.
    #[arg(long, default_value_t = 1, value_name = "N")]
    flip_agents: usize,
    /// File the flip lines are written to (created or emptied); standard output when
    /// absent.
    #[arg(long)]
    flip_log: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.zones == 0 {
        bail!("--zones must be at least 1");
    }
    if args.flip_instances > 0 && !args.xds {
        bail!("--flip-instances needs --xds (the sidecars' host sets are the mesh's)");
    }
    if let Some(path) = &args.write_mesh {
        let mesh = sim::mesh_spec(args.mesh_clusters, args.mesh_endpoints);
        std::fs::write(path, serde_json::to_vec(&mesh)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!(
            "mesh of {} clusters, {} endpoints each, written to {}",
            args.mesh_clusters,
            args.mesh_endpoints,
            path.display()
        );
        return Ok(());
    }
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
        instances: reports_for(0, &args),
    });
    println!(
        "report of {} instances with {} upstreams each: {} bytes framed",
        args.instances,
        args.upstreams,
        meshcat_common::wire::encode(&sample, usize::MAX)?.len()
    );
    let flips = if args.flip_instances > 0 {
        let out: Box<dyn Write + Send> = match &args.flip_log {
            Some(path) => Box::new(std::io::LineWriter::new(
                std::fs::File::create(path)
                    .with_context(|| format!("cannot create {}", path.display()))?,
            )),
            None => Box::new(std::io::stdout()),
        };
        println!(
            "flipping sidecars: the first {} instance(s) of each of the first {} agents",
            args.flip_instances.min(args.instances),
            args.flip_agents.min(args.agents)
        );
        Some(sim::Flips::new(args.flip_instances, out))
    } else {
        None
    };
    let client = tls::client_config(&files.ca, Some((&files.agent_cert, &files.agent_key)))?;
    let stats = Arc::new(Stats::default());
    let stop = Arc::new(tokio::sync::Notify::new());
    let traffic = Arc::new(AtomicBool::new(true));
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
            instances: {
                let mut instances = reports_for(i, &args);
                // The large sidecars are spread over the agents.
                if args.large > 0
                    && i % (args.agents / args.large).max(1) == 0
                    && i / (args.agents / args.large).max(1) < args.large
                {
                    instances[0] = sim::large(instances[0].clone(), args.large_clusters);
                }
                instances
            },
            interval: args.interval,
            traffic: traffic.clone(),
            deltas: !args.whole,
        };
        let flipping = flips
            .clone()
            .filter(|_| i < args.flip_agents)
            .map(|f| f.with_differing_first(i % 2 == 1));
        tasks.push(tokio::spawn(agent.run_with(
            endpoint,
            addr,
            stats.clone(),
            stop.clone(),
            flipping,
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
        "measured {elapsed:.1}s: reports accepted {accepted} ({:.0}/s, {:.0} instances/s), rejected {rejected}, errors {}; instances refused alone since the start {}",
        accepted as f64 / elapsed,
        accepted as f64 * args.instances as f64 / elapsed,
        stats.errors.load(Ordering::Relaxed),
        stats.refused_instances.load(Ordering::Relaxed)
    );
    println!(
        "ingest cpu {cpu:.1}% of one core (load generator {own_cpu:.0}%); ack latency ms p50 {:.2} p99 {:.2} max {:.2}",
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    let per = |bytes: &std::sync::atomic::AtomicU64, n: &std::sync::atomic::AtomicU64| {
        let n = n.load(Ordering::Relaxed);
        if n == 0 {
            0.0
        } else {
            bytes.load(Ordering::Relaxed) as f64 / n as f64
        }
    };
    println!(
        "instances sent whole {} (mean {:.0} bytes, largest {} bytes), as deltas {} (mean {:.0} bytes, largest {} bytes)",
        stats.whole_sent.load(Ordering::Relaxed),
        per(&stats.whole_bytes, &stats.whole_sent),
        stats.largest_whole.load(Ordering::Relaxed),
        stats.delta_sent.load(Ordering::Relaxed),
        per(&stats.delta_bytes, &stats.delta_sent),
        stats.largest_delta.load(Ordering::Relaxed),
    );
    if args.large > 0 {
        let whole = meshcat_common::wire::encoded_len(&sim::large(
            reports_for(0, &args).remove(0),
            args.large_clusters,
        ));
        println!("a large sidecar's whole state (sent once per connection): {whole} bytes");
    }
    let (rss, hwm) = memory_kib(pid)?;
    println!(
        "ingest memory: resident {:.0} MiB, peak {:.0} MiB",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );

    stop.notify_waiters();
    if let Some(flips) = &flips {
        flips.flush().context("flip log")?;
    }
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

/// Real-shaped snapshots of agent `agent`'s `--instances` instances, one cluster
/// per agent (`service-<agent % 200>` in `zone-<agent % zones>`), each calling
/// `--upstreams` other services of its zone; with `--xds`, sidecars in sync with
/// the mesh.
fn reports_for(agent: usize, args: &Args) -> Vec<InstanceReport> {
    let service = agent % 200;
    let calls: Vec<String> = (1..=args.upstreams)
        .map(|k| sim::mesh_cluster_name((service + 4 * k) % 200))
        .collect();
    (0..args.instances)
        .map(|i| {
            let report = sim::instance(
                format!("zone-{}", agent % args.zones),
                sim::mesh_cluster_name(service),
                format!("pod-{agent}-{i}"),
                agent,
                i,
                &calls,
            );
            if args.xds {
                sim::xds_sidecar(report, args.mesh_endpoints)
            } else {
                report
            }
        })
        .collect()
}
