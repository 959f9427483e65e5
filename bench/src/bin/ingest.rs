//! Ingest runner for the benchmark: the real QUIC ingest server (dev-mode TLS, agent
//! certificates) with a sink that only counts, so the figures measure ingest alone
//! without the catalog store. Prints `listening <addr>` once bound, serves until its
//! standard input closes, then prints its counters as `reports=.. instances=..`.

use std::io::BufRead;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Parser;
use meshcat_aggregator::ingest::{Ingest, IngestConfig, ReportSink, SecurityOptions};
use meshcat_common::wire::InstanceReport;

#[derive(Debug, Parser)]
#[command(about = "Runs the real ingest server with a counting sink, for the benchmark.")]
struct Args {
    /// UDP address to serve on.
    #[arg(long, default_value = "127.0.0.1:0")]
    addr: std::net::SocketAddr,
    /// Where the development certificates live (created on first use).
    #[arg(long)]
    data_dir: PathBuf,
    /// Tokio worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Most concurrent agent connections.
    #[arg(long, default_value_t = 20_000)]
    max_connections: usize,
}

/// Counts what reaches the catalog's side of the ingest server.
#[derive(Debug, Default)]
struct CountingSink {
    /// Instance snapshots applied.
    instances: AtomicU64,
    /// Agents reported gone.
    gone: AtomicU64,
}

impl ReportSink for CountingSink {
    fn apply_report(
        &self,
        _key: &str,
        instances: Vec<InstanceReport>,
        _now: Instant,
        _may_take: &dyn Fn(&str) -> bool,
        _bounds: &meshcat_aggregator::ingest::InstanceBounds,
    ) -> Vec<meshcat_aggregator::ingest::InstanceRefusal> {
        for report in &instances {
            // Touch the data as a store would, so the work is not optimised away.
            std::hint::black_box(report.metrics.total_requests);
        }
        self.instances
            .fetch_add(instances.len() as u64, Ordering::Relaxed);
        Vec::new()
    }
    fn agent_gone(&self, _key: &str) {
        self.gone.fetch_add(1, Ordering::Relaxed);
    }
    fn reporter(&self, _zone: &str, _cluster: &str, _instance: &str) -> Option<String> {
        // The runner sends no commands.
        None
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let security = SecurityOptions {
        dev: true,
        data_dir: args.data_dir.clone(),
        ..SecurityOptions::default()
    };
    let (server, auth) = security.load()?;
    let mut config = IngestConfig::new(server, auth);
    config.limits.max_connections = args.max_connections;
    // The benchmark connects its whole fleet at once.
    config.limits.max_pending = args.max_connections;
    let sink = Arc::new(CountingSink::default());
    let registry = prometheus::Registry::new();
    let ingest = Ingest::new(config, sink.clone(), &registry)?;
    let socket = std::net::UdpSocket::bind(args.addr)?;
    let addr = socket.local_addr()?;
    let stdin_closed = async {
        // Blocking read of stdin on its own thread; EOF means the benchmark is over.
        let _ = tokio::task::spawn_blocking(|| {
            let stdin = std::io::stdin();
            for line in stdin.lock().lines() {
                if line.is_err() {
                    break;
                }
            }
        })
        .await;
    };
    let write = |line: String| {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    write(format!("listening {addr}"));
    ingest.run(socket, stdin_closed).await?;
    let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather())?;
    let reports = sample(&text, "meshcat_reports_received_total ") as u64;
    let rejected = sample(&text, "meshcat_reports_rejected_total") as u64;
    let reasons: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("meshcat_reports_rejected_total{"))
        .collect();
    write(format!(
        "reports={reports} instances={} rejected={rejected} gone={} {}",
        sink.instances.load(Ordering::Relaxed),
        sink.gone.load(Ordering::Relaxed),
        reasons.join(" ")
    ));
    Ok(())
}

/// Sums the samples of the lines starting with `prefix`.
fn sample(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
