//! The memory the aggregator holds per edge of the dependency graph, in one process
//! without the network: every allocation goes through a counting allocator around
//! mimalloc (the aggregator's), so it prints both what stays allocated (the live
//! heap, counted exactly) and the resident memory that costs with mimalloc. Set
//! mimalloc's options with its environment variables (`MIMALLOC_PURGE_DELAY`, ...)
//! to see what they change. `meshcat-bench-graph` reads the resident memory of the
//! real binary, with the ingest's connections and buffers.
//!
//! The mesh of `bench/graph.sh`: a real store in a temporary directory with
//! `--clusters` clusters in `--zones` zones, one instance of each reported by
//! `--agents` agents with the reports of `meshcat-bench-graph` (the simulator's
//! instances, each calling `--upstreams` clusters of its zone), applied to the live
//! instances directly. First `--reports` reports without upstream traffic, then as
//! many with the upstreams' counters moving on every report; after each report the
//! graph is built again while the last build is still held, as the aggregator's
//! snapshots are. Prints what the second state holds beyond the first, per edge: in
//! all, in the store (each cluster's calls and each instance's share of them), in one
//! built graph, and resident.

// A benchmark reports on standard output.
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use meshcat_aggregator::graph::{self, Counters};
use meshcat_aggregator::store::{Rules, Store, Write};
use meshcat_common::model::{ClusterRecord, ZoneRecord};
use meshcat_common::wire::InstanceReport;

#[global_allocator]
static ALLOC: cap::Cap<mimalloc::MiMalloc> = cap::Cap::new(mimalloc::MiMalloc, usize::MAX);

#[derive(Parser, Debug)]
#[command(about = "The memory held per edge of the dependency graph: live heap and resident")]
struct Args {
    #[arg(long, default_value_t = 10_000)]
    clusters: usize,
    #[arg(long, default_value_t = 20)]
    zones: usize,
    /// Clusters of its zone each instance calls.
    #[arg(long, default_value_t = 5)]
    upstreams: usize,
    #[arg(long, default_value_t = 100)]
    agents: usize,
    /// Reports of each state, a graph built after each.
    #[arg(long, default_value_t = 6)]
    reports: u64,
    /// How long the resident memory is left to settle before it is read.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    settle: Duration,
}

/// What one state of the mesh holds: the heap and resident memory with its last
/// graph, the heap of that graph, and the graph's size.
struct State {
    heap: usize,
    rss: u64,
    graph: usize,
    nodes: usize,
    links: usize,
    observed: usize,
}

/// This process's resident memory in bytes.
fn resident() -> anyhow::Result<u64> {
    Ok(meshcat_bench::process::memory_kib(std::process::id())?.0 * 1024)
}

/// Requests and errors each upstream carries between two reports (as the simulator's).
const REQUESTS_PER_REPORT: u64 = 250;
const ERRORS_PER_REPORT: u64 = 2;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let (store, instances) = Store::open(dir.path(), Rules::defaults())?;
    let name = |c: usize| format!("svc-{c:06}");
    let zone = |c: usize| format!("zone-{:02}", c % args.zones);
    store
        .commit(
            (0..args.zones)
                .map(|z| Write::CreateZone(ZoneRecord::new(&zone(z), "control.local:50000")))
                .collect(),
        )
        .map_err(|(_, e)| e)?;
    for chunk in (0..args.clusters).collect::<Vec<_>>().chunks(500) {
        store
            .commit(
                chunk
                    .iter()
                    .map(|&c| {
                        Write::CreateCluster(ClusterRecord::new(&zone(c), &name(c), &name(c)))
                    })
                    .collect(),
            )
            .map_err(|(_, e)| e)?;
    }
    let per_agent = args.clusters.div_ceil(args.agents);
    let agents: Vec<Vec<InstanceReport>> = (0..args.agents)
        .map(|a| {
            (a * per_agent..((a + 1) * per_agent).min(args.clusters))
                .map(|c| {
                    let calls: Vec<String> = (1..=args.upstreams)
                        .map(|k| name((c + k * args.zones) % args.clusters))
                        .collect();
                    meshcat_bench::sim::instance(
                        zone(c),
                        name(c),
                        format!("{}-pod", name(c)),
                        a,
                        c,
                        &calls,
                    )
                })
                .collect()
        })
        .collect();
    let report = |traffic: bool, seq: u64| {
        let now = Instant::now();
        for (a, reports) in agents.iter().enumerate() {
            let reports = reports
                .iter()
                .map(|i| {
                    let mut i = i.clone();
                    i.seq = seq;
                    if traffic {
                        for u in &mut i.upstreams {
                            u.requests_total += seq * REQUESTS_PER_REPORT;
                            u.errors_total += seq * ERRORS_PER_REPORT;
                        }
                    } else {
                        i.upstreams.clear();
                    }
                    i
                })
                .collect();
            instances.apply_reports(&format!("bench-graph-agent-{a}"), reports, now);
        }
    };
    // Each state: its reports, each followed by a build while the last is held;
    // then what it holds (read with its last graph), and that graph's part.
    let mut seq = 0;
    let mut state = |traffic: bool| -> anyhow::Result<State> {
        let mut held = None;
        for _ in 0..args.reports {
            seq += 1;
            report(traffic, seq);
            let built = graph::build(&store, instances.traffic(), Instant::now(), Counters::Leave);
            held = Some(built);
            // Reports a few milliseconds apart are as far apart as any for the figures.
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(args.settle);
        let (heap, rss) = (ALLOC.allocated(), resident()?);
        let built = held.context("a graph was built")?;
        let observed = built.links.iter().filter(|l| l.observed).count();
        let (nodes, links) = (built.nodes.len(), built.links.len());
        drop(built);
        Ok(State {
            heap,
            rss,
            graph: heap.saturating_sub(ALLOC.allocated()),
            nodes,
            links,
            observed,
        })
    };
    let without = state(false)?;
    let with = state(true)?;
    let edges = with.observed;
    anyhow::ensure!(edges > 0, "no observed edge");
    let per = |bytes: usize, less: usize| (bytes as f64 - less as f64) / edges as f64;
    println!(
        "{} nodes, {} edges ({edges} observed); heap {} bytes without traffic, {} with; resident {} and {} bytes",
        with.nodes, with.links, without.heap, with.heap, without.rss, with.rss
    );
    println!(
        "graph memory per edge: heap {:.0} bytes ({:.0} in the store, {:.0} in one built graph), resident {:.0} bytes",
        per(with.heap, without.heap),
        per(with.heap - with.graph, without.heap - without.graph),
        per(with.graph, without.graph),
        per(with.rss as usize, without.rss as usize)
    );
    Ok(())
}
