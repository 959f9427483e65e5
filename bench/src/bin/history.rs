//! History benchmark (`bench/history.sh`), in two steps:
//!
//! - `fill`: opens the history in `--data-dir` as the aggregator does
//!   (`meshcat_aggregator::history::History`: the bounded queue, the writer thread,
//!   a durable commit per batch) and records `--entries` entries shaped like a
//!   fleet's (instances joining, leaving and restarting, status changes with their
//!   reasons, configuration changes, edits, log levels over 1,000 clusters in 20
//!   zones with pod-like instance names), in bursts the queue takes whole, waiting
//!   for each burst to be stored. Prints appends per second (recording to durable)
//!   and the file's bytes per entry.
//! - `read`: `GET /history` of a running aggregator over that data directory, one
//!   request after the other over one keep-alive connection: the newest 100
//!   (`limit` default), then one cluster's and two kinds' newest 100. Prints latency
//!   percentiles (time to the last byte).

// The figures on standard output are this program's whole purpose.
#![allow(clippy::print_stdout)]

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use meshcat_aggregator::history::{
    ChangedBy, DB_FILE, Detail, History, HistoryConfig, HistoryDb, HistoryMetrics, Kind,
    LeftReason, Pending, StatusReason,
};
use meshcat_aggregator::status::Inputs;
use meshcat_common::model::Status;

#[derive(Debug, Parser)]
#[command(about = "History appends, size on disk and GET /history latency.")]
struct Args {
    #[command(subcommand)]
    step: Step,
}

#[derive(Debug, Subcommand)]
enum Step {
    /// Records entries into the history of a data directory.
    Fill {
        #[arg(long)]
        data_dir: PathBuf,
        #[arg(long, default_value_t = 1_000_000)]
        entries: u64,
        /// The history's --history-max-entries (default: --entries); fewer makes the
        /// fill evict the oldest as it goes, as a full history does.
        #[arg(long)]
        keep: Option<u64>,
        /// Entries recorded before waiting for them to be stored (at most the
        /// writer's queue, 65,536, so none is dropped).
        #[arg(long, default_value_t = 32_768)]
        burst: u64,
    },
    /// Reads GET /history of a running aggregator.
    Read {
        #[arg(long)]
        api: String,
        #[arg(long, default_value_t = 2_000)]
        requests: usize,
    },
}

const ZONES: u64 = 20;
const CLUSTERS: u64 = 1_000;

fn entry(n: u64) -> Pending {
    let cluster = n.wrapping_mul(2_654_435_761) % CLUSTERS;
    let zone = format!("zone-{:02}", cluster % ZONES);
    let name = format!("svc-{cluster:04}");
    let pod = format!("{name}-7d9f8c6b5-{:05x}", (n / 7) % 0xf_ffff);
    let start = 1_780_000_000_000 + n as i64 * 37;
    let hash = |k: u64| format!("{:016x}", k.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let (kind, instance, detail) = match n % 20 {
        0..=4 => (
            Kind::InstanceJoined,
            pod,
            Detail::Joined { start_time: start },
        ),
        5..=9 => (
            Kind::InstanceLeft,
            pod,
            Detail::Left {
                reason: [
                    LeftReason::Disconnected,
                    LeftReason::Expired,
                    LeftReason::Unreachable,
                ][(n % 3) as usize],
            },
        ),
        10..=13 => (
            Kind::StatusChanged,
            String::new(),
            Detail::Status {
                from: Status::Stable,
                to: Status::Warning,
                reason: StatusReason {
                    inputs: Inputs {
                        live: 1 + n % 3,
                        min_instances: 2 + n % 3,
                        ..Inputs::default()
                    },
                    error_ratio_warning: 0.05,
                },
            },
        ),
        14 | 15 => (
            Kind::ConfigChanged,
            pod,
            Detail::Config {
                from: hash(n),
                to: hash(n + 1),
                resources: vec!["routes".into()],
            },
        ),
        16 | 17 => (
            Kind::InstanceRestarted,
            pod,
            Detail::Restarted {
                start_time: start,
                previous_start_time: start - 86_400_000,
            },
        ),
        18 => (
            Kind::ClusterUpdated,
            String::new(),
            Detail::Changed {
                changed: vec!["owner".into(), "version".into()],
            },
        ),
        _ => (
            Kind::LogLevelChanged,
            pod,
            Detail::LogLevel {
                from: "info".into(),
                to: "debug".into(),
                by: ChangedBy::Api,
            },
        ),
    };
    Pending::new(kind, &zone, &name, &instance, detail)
}

fn fill(dir: &std::path::Path, entries: u64, keep: u64, burst: u64) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let metrics = HistoryMetrics::unregistered();
    let config = HistoryConfig {
        max_entries: keep,
        ..HistoryConfig::default()
    };
    let history = History::open(dir, DB_FILE, config, metrics.clone())?;
    let started = Instant::now();
    let mut n = 0;
    while n < entries {
        let end = (n + burst).min(entries);
        for i in n..end {
            history.record(entry(i));
        }
        history.flush();
        n = end;
    }
    let took = started.elapsed();
    drop(history);
    if metrics.dropped.get() > 0 {
        bail!("{} entries were dropped", metrics.dropped.get());
    }
    let held = HistoryDb::open(dir, DB_FILE)?.len()?;
    let file = std::fs::metadata(dir.join(DB_FILE))?;
    // The file grows in steps (doubling, then by region) and its unwritten part is
    // a hole: the blocks taken are what is on disk.
    let (on_disk, length) = (file.blocks() * 512, file.len());
    println!(
        "appended {entries} entries in {:.1}s: {:.0} appends/s (recorded, stored durably)",
        took.as_secs_f64(),
        entries as f64 / took.as_secs_f64()
    );
    println!(
        "{held} entries held in {:.1} MiB on disk (file length {:.1} MiB): {:.0} bytes per entry",
        on_disk as f64 / (1 << 20) as f64,
        length as f64 / (1 << 20) as f64,
        on_disk as f64 / held.max(1) as f64
    );
    Ok(())
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

async fn read(api: &str, requests: usize) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()?;
    for (what, path) in [
        ("newest 100", "/history"),
        ("one cluster's newest 100", "/history?clusterName=svc-0500"),
        (
            "two kinds' newest 100",
            "/history?kind=config-changed&kind=cluster-updated",
        ),
        (
            "one zone's newest 100 (no index: a scan)",
            "/history?zoneName=zone-07",
        ),
    ] {
        let url = format!("{api}{path}");
        let mut took = Vec::with_capacity(requests);
        let mut count = 0;
        for _ in 0..requests {
            let t = Instant::now();
            let r = http.get(&url).send().await?;
            if !r.status().is_success() {
                bail!("GET {url}: {}", r.status());
            }
            let body = r.bytes().await?;
            took.push(t.elapsed());
            count = serde_json::from_slice::<Vec<serde_json::Value>>(&body)
                .context("a JSON array")?
                .len();
        }
        took.sort_unstable();
        println!(
            "GET {path} ({what}, {count} entries): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {requests}",
            pct(&took, 0.5),
            pct(&took, 0.99),
            pct(&took, 1.0)
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Args::parse().step {
        Step::Fill {
            data_dir,
            entries,
            keep,
            burst,
        } => {
            let keep = keep.unwrap_or(entries);
            tokio::task::spawn_blocking(move || fill(&data_dir, entries, keep, burst)).await?
        }
        Step::Read { api, requests } => read(&api, requests).await,
    }
}
