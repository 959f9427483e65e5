//! The heap the aggregator holds for a zone's control server view, counted exactly:
//! every allocation of this process goes through a counting allocator, so the figure
//! is what stays allocated, not what the allocator keeps of the pages it used
//! (`meshcat-bench-control connect` reads that, the resident set, from the real
//! binary).
//!
//! In one process: the workspace's control server serving `--clusters` EDS clusters
//! of `--endpoints` healthy endpoints each (the mesh of `meshcat-bench-agents
//! --write-mesh`); the aggregator's control component (Delta xDS, or state of the
//! world with `--sotw`) holding the zone's view; the catalog (a real store in a
//! temporary directory) showing the view's clusters, each an unregistered service;
//! and one build of the dependency graph, whose nodes now include those services.
//! Everything that exists before the zone connects (the server's snapshot, the empty
//! catalog) is counted before; the server is stopped before the count after, so its
//! per-stream state is not counted. Prints bytes per endpoint in all and per part:
//! the view, the catalog's entries, the graph.

// A benchmark reports on standard output.
#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use meshcat_aggregator::control::{ControlConfig, ControlState, Controls};
use meshcat_aggregator::graph::{self, Counters};
use meshcat_aggregator::store::{Rules, Store};
use meshcat_common::model::ZoneRecord;
use meshcat_control_server::{ControlServer, ServerOptions};

#[global_allocator]
static ALLOC: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

const ZONE: &str = "zone-0";

#[derive(Parser, Debug)]
#[command(about = "The heap held for a zone's control server view, counted exactly")]
struct Args {
    /// Clusters the control server declares.
    #[arg(long, default_value_t = 10_000)]
    clusters: usize,
    /// Endpoints of each cluster.
    #[arg(long, default_value_t = 10)]
    endpoints: usize,
    /// Speak state of the world instead of Delta xDS.
    #[arg(long)]
    sotw: bool,
    /// Longest wait for the whole view.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let total = args.clusters * args.endpoints;
    let server = ControlServer::start_with(
        "127.0.0.1:0".parse()?,
        None,
        ServerOptions { delta: !args.sotw },
    )
    .await?;
    server.set(meshcat_bench::sim::mesh_spec(args.clusters, args.endpoints));
    let dir = tempfile::tempdir()?;
    let (store, instances) = Store::open(dir.path(), Rules::defaults())?;
    let record = ZoneRecord::new(ZONE, &server.local_addr().to_string());
    store.writes().create_zone(record.clone())?;
    let registry = prometheus::Registry::new();
    let controls = Controls::new(
        ControlConfig {
            replica: "bench".into(),
            ..ControlConfig::default()
        },
        &registry,
    )?;

    let before = ALLOC.allocated();
    let started = Instant::now();
    controls.set_zone(&record);
    let mut changes = controls.subscribe();
    loop {
        let status = controls.status(ZONE).context("the zone is gone")?;
        if status.endpoints == total && status.clusters == args.clusters {
            println!(
                "view: {} clusters, {} endpoints over {} in {} ms",
                status.clusters,
                status.endpoints,
                status.protocol,
                started.elapsed().as_millis()
            );
            break;
        }
        if started.elapsed() > args.timeout {
            bail!("no whole view within {:?}: {status:?}", args.timeout);
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), changes.recv()).await;
    }
    let view = controls.view(ZONE).context("no view")?;
    instances.apply_declared(ZONE, Some(view.clone()));
    let built = graph::build(&store, instances.traffic(), Instant::now(), Counters::Leave);
    // The server's state for the stream goes with it; the stream's connection too.
    server.stop().await;
    loop {
        let status = controls.status(ZONE).context("the zone is gone")?;
        if status.state == ControlState::Unreachable {
            break;
        }
        if started.elapsed() > args.timeout {
            bail!("the stream did not end: {status:?}");
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), changes.recv()).await;
    }
    let held = ALLOC.allocated().saturating_sub(before);

    // Each part, by what goes when it is let go.
    let at = ALLOC.allocated();
    drop(built);
    let graph = at.saturating_sub(ALLOC.allocated());
    let at = ALLOC.allocated();
    instances.apply_declared(ZONE, None);
    let catalog = at.saturating_sub(ALLOC.allocated());
    let at = ALLOC.allocated();
    controls.remove_zone(ZONE);
    // The stream's task holds the view until it is aborted and dropped.
    let deadline = Instant::now() + args.timeout;
    while Arc::strong_count(&view) > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(view);
    let stream = at.saturating_sub(ALLOC.allocated());

    let per = |bytes: usize| bytes as f64 / total as f64;
    println!(
        "held: {:.1} MiB for {total} endpoints in {} clusters: {:.0} bytes per endpoint",
        held as f64 / (1024.0 * 1024.0),
        args.clusters,
        per(held)
    );
    println!(
        "  the view and the stream's state: {:.0} B/endpoint; the catalog's entries: {:.0}; the graph's nodes: {:.0}",
        per(stream),
        per(catalog),
        per(graph)
    );
    println!("figure heap_bytes_per_endpoint {:.0}", per(held));
    println!("figure heap_view_bytes_per_endpoint {:.0}", per(stream));
    println!("figure heap_catalog_bytes_per_endpoint {:.0}", per(catalog));
    println!("figure heap_graph_bytes_per_endpoint {:.0}", per(graph));
    Ok(())
}
