//! History benchmark (`bench/history.sh`), in two steps:
//!
//! - `fill`: opens the history in `--data-dir` as the aggregator does
//!   (`meshcat_aggregator::history::History`: the bounded queue, the writer thread,
//!   a durable commit per batch) and records `--entries` entries shaped like a
//!   fleet's (instances joining, leaving and restarting, status changes with their
//!   reasons, configuration changes, edits, log levels over 1,000 clusters in 20
//!   zones with pod-like instance names), in bursts the queue takes whole, waiting
//!   for each burst to be stored. Among them, at a sixth, half and five sixths of
//!   the entries held, two rare sets of three ([`rare`]): one in a zone, cluster and
//!   kind of its own, one of an instance and kind of its own whose zone and
//!   cluster are both common, but never together elsewhere. Prints appends per
//!   second (recording to durable) and the file's bytes per entry.
//! - `read`: `GET /history` of a running aggregator over that data directory, one
//!   request after the other over one keep-alive connection, for every filter the
//!   API offers alone and combined ([`FILTERS`]): the newest 100 of common ones,
//!   and the rare sets. Prints latency percentiles (time to the last byte) and
//!   how many entries each answered; fails when an answer is incomplete or a rare
//!   filter does not find exactly its three.
//! - `flood`: the history under a flood, as the aggregator records it
//!   (`History::record_instance` with the per-instance allowance,
//!   `History::record_diagnosis` with `--history-max-diagnoses`): `--instances`
//!   instances that flip on every report (`--report-every` of simulated time; each
//!   report alternately makes an instance leave, then join, restart and run another
//!   configuration), and diagnoses at the cap carrying 4 KiB conclusions, until the
//!   entries take `--max-bytes` or number `--max-entries` (or `--max-minutes` of
//!   simulated time). A reader
//!   asks for the newest 100 entries (`HistoryDb::query`, what `GET /history`
//!   runs) every 5 ms meanwhile. Prints the simulated time the byte budget took
//!   to fill, the changes the flood made against the entries it recorded, bytes per
//!   entry on disk and as counted, and the reader's latency percentiles.

// The figures on standard output are this program's whole purpose.
#![allow(clippy::print_stdout)]

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use meshcat_aggregator::history::{
    ChangedBy, DB_FILE, Detail, History, HistoryConfig, HistoryDb, HistoryMetrics, Kind,
    LeftReason, Pending, Query, StatusReason,
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
        /// The history's --history-max-bytes.
        #[arg(long, default_value_t = 64 << 30)]
        max_bytes: u64,
    },
    /// Floods a history with flapping instances and diagnoses until its byte
    /// budget is full, reading the newest entries meanwhile.
    Flood {
        #[arg(long)]
        data_dir: PathBuf,
        /// Instances that flip on every report.
        #[arg(long, default_value_t = 10_000)]
        instances: u64,
        /// Simulated time between two reports of an instance, in seconds.
        #[arg(long, default_value_t = 10)]
        report_every: u64,
        /// The history's --history-max-bytes.
        #[arg(long, default_value_t = 512 << 20)]
        max_bytes: u64,
        /// The history's --history-max-entries: the flood stops at whichever bound
        /// it reaches first.
        #[arg(long, default_value_t = 1_000_000)]
        max_entries: u64,
        /// The history's --history-max-diagnoses; the flood runs this many a minute.
        #[arg(long, default_value_t = 60)]
        diagnoses: u32,
        /// Simulated minutes after which the flood stops, full or not.
        #[arg(long, default_value_t = 600)]
        max_minutes: u64,
    },
    /// Reads GET /history of a running aggregator.
    Read {
        #[arg(long)]
        api: String,
        #[arg(long, default_value_t = 2_000)]
        requests: usize,
    },
}

/// The rare sets' names: the first set's zone, cluster and kind appear nowhere
/// else; the second's instance and kind appear nowhere else, its zone and cluster
/// are common but never together elsewhere (`svc-0500` is in `zone-00`).
const RARE_ZONE: &str = "zone-20";
const RARE_CLUSTER: &str = "svc-1000";
const RARE_KIND: Kind = Kind::ClusterRegistered;
const PAIR_ZONE: &str = "zone-07";
const PAIR_CLUSTER: &str = "svc-0500";
const PAIR_INSTANCE: &str = "svc-0500-rare-0";
const PAIR_KIND: Kind = Kind::DriftStarted;

/// Entry `n` of `entries` recorded, of which the last `keep` are held: a rare one
/// at a sixth, half and five sixths of those held (the first set there, the second
/// just after), else [`entry`].
fn rare(n: u64, entries: u64, keep: u64) -> Pending {
    let first = entries - keep;
    for at in [keep / 6, keep / 2, keep / 6 * 5] {
        if n == first + at {
            return Pending::new(RARE_KIND, RARE_ZONE, RARE_CLUSTER, "", Detail::Nothing {});
        }
        if n == first + at + 1 {
            return Pending::new(
                PAIR_KIND,
                PAIR_ZONE,
                PAIR_CLUSTER,
                PAIR_INSTANCE,
                Detail::Drift { groups: Vec::new() },
            );
        }
    }
    entry(n)
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
    // The kind by a hash of its own: a cluster's (and so a zone's) entries are of
    // every kind, as `cluster % ZONES` would follow `n % 20` otherwise.
    let (kind, instance, detail) = match (n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) % 20 {
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

fn fill(
    dir: &std::path::Path,
    entries: u64,
    keep: u64,
    burst: u64,
    max_bytes: u64,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let metrics = HistoryMetrics::unregistered();
    let config = HistoryConfig {
        max_entries: keep,
        max_bytes,
        ..HistoryConfig::default()
    };
    let history = History::open(dir, DB_FILE, config, metrics.clone())?;
    let started = Instant::now();
    let mut n = 0;
    while n < entries {
        let end = (n + burst).min(entries);
        for i in n..end {
            history.record(rare(i, entries, keep));
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

/// The flood's parameters.
struct Flood {
    instances: u64,
    report_every: Duration,
    max_bytes: u64,
    max_entries: u64,
    diagnoses: u32,
    max_minutes: u64,
}

/// The changes one report of instance `i` makes at report `tick`: it leaves on one
/// report, and joins, restarts and runs another configuration on the next.
fn flips(i: u64, tick: u64) -> Vec<Pending> {
    let cluster = i % CLUSTERS;
    let zone = format!("zone-{:02}", cluster % ZONES);
    let name = format!("svc-{cluster:04}");
    let pod = format!("{name}-7d9f8c6b5-{i:05x}");
    let start = 1_780_000_000_000 + tick as i64 * 10_000;
    let hash = |k: u64| format!("{:016x}", k.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let at = |kind, detail| Pending::new(kind, &zone, &name, &pod, detail);
    if (tick + i) % 2 == 1 {
        return vec![at(
            Kind::InstanceLeft,
            Detail::Left {
                reason: LeftReason::Unreachable,
            },
        )];
    }
    vec![
        at(Kind::InstanceJoined, Detail::Joined { start_time: start }),
        at(
            Kind::InstanceRestarted,
            Detail::Restarted {
                start_time: start,
                previous_start_time: start - 20_000,
            },
        ),
        at(
            Kind::ConfigChanged,
            Detail::Config {
                from: hash(tick),
                to: hash(tick + 1),
                resources: vec!["clusters".into(), "routes".into()],
            },
        ),
    ]
}

/// How often the flood's reader asks for the newest entries.
const READ_EVERY: Duration = Duration::from_millis(5);

fn flood(dir: &std::path::Path, f: &Flood) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let metrics = HistoryMetrics::unregistered();
    let config = HistoryConfig {
        max_bytes: f.max_bytes,
        max_entries: f.max_entries,
        max_diagnoses: f.diagnoses,
        ..HistoryConfig::default()
    };
    let history = History::open(dir, DB_FILE, config, metrics.clone())?;
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (db, stop) = (history.db().clone(), stop.clone());
        std::thread::spawn(move || {
            let newest = Query {
                limit: 100,
                ..Query::default()
            };
            let mut took = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let found = db.query(&newest).map(|f| f.rows.len());
                took.push(t.elapsed());
                if found.is_err() {
                    break;
                }
                // A dashboard's pace, not a spin: the reader leaves the writer its
                // core.
                std::thread::sleep(READ_EVERY);
            }
            took
        })
    };
    // 4 KiB of owner-like text in every conclusion: the writer caps it.
    let conclusion = format!(
        "svc-0001 in zone zone-01 (owner {}): failing",
        "o".repeat(4096)
    );
    let per_report = u64::from(f.diagnoses) * f.report_every.as_secs() / 60;
    let t0 = Instant::now();
    let started = Instant::now();
    let (mut tick, mut changes, mut diagnoses) = (0u64, 0u64, 0u64);
    let mut filled = None;
    while tick * f.report_every.as_secs() < f.max_minutes * 60 {
        let now = t0 + f.report_every * tick as u32;
        for i in 0..f.instances {
            for p in flips(i, tick) {
                changes += 1;
                history.record_instance(p, now);
            }
        }
        for d in 0..per_report {
            diagnoses += 1;
            history.record_diagnosis(
                Pending::new(
                    Kind::Diagnosed,
                    "zone-01",
                    &format!("svc-{:04}", d % CLUSTERS),
                    "",
                    Detail::Diagnosed {
                        symptom: None,
                        conclusion: conclusion.clone(),
                        root_cause: None,
                    },
                ),
                now,
            );
        }
        history.flush();
        tick += 1;
        let sim = tick * f.report_every.as_secs();
        if sim % 600 == 0 {
            println!(
                "  {} simulated minutes: {:.1} MiB counted, {:.0}s to run",
                sim / 60,
                metrics.bytes.get() as f64 / (1 << 20) as f64,
                started.elapsed().as_secs_f64()
            );
        }
        // Full once the next report's entries would not fit: eviction has begun.
        let by = if metrics.bytes.get() as u64 >= f.max_bytes / 100 * 99 {
            Some("byte budget")
        } else if metrics.entries.get() as u64 >= f.max_entries {
            Some("entry bound")
        } else {
            None
        };
        if let Some(by) = by {
            filled = Some((by, f.report_every * tick as u32, started.elapsed()));
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut took = reader.join().expect("the reader ends");
    let appended = metrics.appended.get();
    let unrecorded = metrics.unrecorded.with_label_values(&["flapping"]).get()
        + metrics.unrecorded.with_label_values(&["diagnoses"]).get();
    let bytes = metrics.bytes.get();
    drop(history);
    if metrics.dropped.get() > 0 {
        bail!("{} entries were dropped", metrics.dropped.get());
    }
    let held = HistoryDb::open(dir, DB_FILE)?.len()?;
    let file = std::fs::metadata(dir.join(DB_FILE))?;
    let simulated = f.report_every * tick as u32;
    match filled {
        Some((by, sim, real)) => println!(
            "{by} reached ({:.0} MiB, {} entries) after {:.1} simulated minutes ({:.1}s to run)",
            f.max_bytes as f64 / (1 << 20) as f64,
            f.max_entries,
            sim.as_secs_f64() / 60.0,
            real.as_secs_f64()
        ),
        None => println!(
            "no bound reached after {:.1} simulated minutes: {:.1} MiB counted",
            simulated.as_secs_f64() / 60.0,
            bytes as f64 / (1 << 20) as f64
        ),
    }
    let minutes = simulated.as_secs_f64() / 60.0;
    println!(
        "{} instances flipping every {}s: {changes} changes and {diagnoses} diagnoses ({:.0} a minute), {appended} entries recorded ({:.0} a minute), {unrecorded} counted only",
        f.instances,
        f.report_every.as_secs(),
        (changes + diagnoses) as f64 / minutes,
        appended as f64 / minutes
    );
    println!(
        "{held} entries held: {:.0} bytes per entry on disk ({:.1} MiB, file length {:.1} MiB), {:.0} as counted",
        (file.blocks() * 512) as f64 / held.max(1) as f64,
        (file.blocks() * 512) as f64 / (1 << 20) as f64,
        file.len() as f64 / (1 << 20) as f64,
        bytes as f64 / held.max(1) as f64
    );
    took.sort_unstable();
    if !took.is_empty() {
        println!(
            "newest 100 during the flood: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {} queries",
            pct(&took, 0.5),
            pct(&took, 0.99),
            pct(&took, 1.0),
            took.len()
        );
    }
    Ok(())
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

/// How many entries a filter finds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Finds {
    /// The newest 100 of many.
    Newest,
    /// Some, at most 100 (an instance's; one cluster's kind within a minute).
    Few,
    /// Exactly the three of a rare set.
    Three,
    /// None at all.
    Nothing,
}

/// Every filter `GET /history` offers, alone and combined: (what, query, how many
/// it finds). `{instance}` is one instance of the common entries, `{mid}` the time
/// of the rare sets' middle entry.
const FILTERS: &[(&str, &str, Finds)] = &[
    ("newest", "", Finds::Newest),
    ("zone", "zoneName=zone-07", Finds::Newest),
    ("cluster", "clusterName=svc-0500", Finds::Newest),
    ("instance", "instance={instance}", Finds::Few),
    ("kind", "kind=config-changed", Finds::Newest),
    (
        "two kinds",
        "kind=config-changed&kind=cluster-updated",
        Finds::Newest,
    ),
    ("since", "since={mid}", Finds::Newest),
    ("until", "until={mid}", Finds::Newest),
    (
        "since and until",
        "since={mid-60s}&until={mid}",
        Finds::Newest,
    ),
    (
        "zone, kind",
        "zoneName=zone-07&kind=status-changed",
        Finds::Newest,
    ),
    (
        "cluster, kind",
        "clusterName=svc-0500&kind=instance-left",
        Finds::Newest,
    ),
    (
        "cluster, two kinds",
        "clusterName=svc-0500&kind=instance-left&kind=config-changed",
        Finds::Newest,
    ),
    (
        "zone, cluster",
        "zoneName=zone-00&clusterName=svc-0500",
        Finds::Newest,
    ),
    (
        "cluster, instance",
        "clusterName={cluster}&instance={instance}",
        Finds::Few,
    ),
    (
        "zone, since and until",
        "zoneName=zone-07&since={mid-60s}&until={mid}",
        Finds::Newest,
    ),
    (
        "cluster, kind, since and until",
        "clusterName=svc-0500&kind=instance-joined&since={mid-60s}&until={mid}",
        Finds::Few,
    ),
    (
        "every filter",
        "zoneName={zone}&clusterName={cluster}&instance={instance}&kind={kind}&since=0&until={end}",
        Finds::Few,
    ),
    ("rare zone", "zoneName=zone-20", Finds::Three),
    ("rare cluster", "clusterName=svc-1000", Finds::Three),
    ("rare kind", "kind=cluster-registered", Finds::Three),
    ("rare instance", "instance=svc-0500-rare-0", Finds::Three),
    (
        "rare pair of common zone and cluster",
        "zoneName=zone-07&clusterName=svc-0500",
        Finds::Three,
    ),
    (
        "common zone, rare kind",
        "zoneName=zone-07&kind=drift-started",
        Finds::Three,
    ),
    (
        "common cluster, rare kind, since",
        "clusterName=svc-0500&kind=drift-started&since=0",
        Finds::Three,
    ),
    (
        "rare zone, common kind",
        "zoneName=zone-20&kind=instance-joined",
        Finds::Nothing,
    ),
    (
        "common zone and cluster never together",
        "zoneName=zone-03&clusterName=svc-0500",
        Finds::Nothing,
    ),
];

/// GET `url`: the entries and whether the answer says it is incomplete.
async fn entries(
    http: &reqwest::Client,
    url: &str,
) -> anyhow::Result<(Vec<serde_json::Value>, bool)> {
    let r = http.get(url).send().await?;
    if !r.status().is_success() {
        bail!("GET {url}: {}", r.status());
    }
    let incomplete = r.headers().contains_key("x-meshcat-history-incomplete");
    let body = r.bytes().await?;
    let entries =
        serde_json::from_slice::<Vec<serde_json::Value>>(&body).context("a JSON array")?;
    Ok((entries, incomplete))
}

async fn read(api: &str, requests: usize) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()?;
    // The names and times the filters take, from the log itself.
    let (pair, _) = entries(&http, &format!("{api}/history?instance={PAIR_INSTANCE}")).await?;
    let [_, mid, _] = pair.as_slice() else {
        bail!("the rare set is not there: {pair:?}");
    };
    let mid = mid["atMs"].as_i64().context("atMs")?;
    // An instance's entry before it: its names for the filters that take one.
    let (older, _) = entries(
        &http,
        &format!("{api}/history?until={mid}&limit=1&kind=instance-joined"),
    )
    .await?;
    let one = older
        .first()
        .context("an instance entry before the middle")?;
    let field = |k: &str| one[k].as_str().unwrap_or_default().to_owned();
    let (zone, cluster, instance, kind) = (
        field("zoneName"),
        field("clusterName"),
        field("instance"),
        field("kind"),
    );
    let mut worst: Option<(f64, &str)> = None;
    for (what, query, finds) in FILTERS {
        let query = query
            .replace("{instance}", &instance)
            .replace("{zone}", &zone)
            .replace("{cluster}", &cluster)
            .replace("{kind}", &kind)
            .replace("{mid-60s}", &(mid - 60_000).to_string())
            .replace("{mid}", &mid.to_string())
            .replace("{end}", &(mid + 1).to_string());
        let url = format!("{api}/history?{query}");
        let mut took = Vec::with_capacity(requests);
        let mut count = 0;
        for _ in 0..requests {
            let t = Instant::now();
            let (found, incomplete) = entries(&http, &url).await?;
            took.push(t.elapsed());
            if incomplete {
                bail!("GET {url}: an incomplete answer");
            }
            count = found.len();
        }
        let expected = match finds {
            Finds::Newest => count == 100,
            Finds::Few => (1..=100).contains(&count),
            Finds::Three => count == 3,
            Finds::Nothing => count == 0,
        };
        if !expected {
            bail!("GET {url}: {count} entries, where {finds:?} was expected");
        }
        took.sort_unstable();
        let p99 = pct(&took, 0.99);
        if worst.is_none_or(|(w, _)| p99 > w) {
            worst = Some((p99, what));
        }
        println!(
            "GET /history?{query} ({what}, {count} entries): p50 {:.2} ms, p99 {p99:.2} ms, max {:.2} ms over {requests}",
            pct(&took, 0.5),
            pct(&took, 1.0)
        );
    }
    if let Some((p99, what)) = worst {
        println!("worst p99 {p99:.2} ms ({what})");
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
            max_bytes,
        } => {
            let keep = keep.unwrap_or(entries);
            tokio::task::spawn_blocking(move || fill(&data_dir, entries, keep, burst, max_bytes))
                .await?
        }
        Step::Flood {
            data_dir,
            instances,
            report_every,
            max_bytes,
            max_entries,
            diagnoses,
            max_minutes,
        } => {
            let f = Flood {
                instances,
                report_every: Duration::from_secs(report_every.max(1)),
                max_bytes,
                max_entries,
                diagnoses,
                max_minutes,
            };
            tokio::task::spawn_blocking(move || flood(&data_dir, &f)).await?
        }
        Step::Read { api, requests } => read(&api, requests).await,
    }
}
