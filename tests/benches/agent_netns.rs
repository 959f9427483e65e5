//! Benchmark of what entering a sidecar's network namespace costs the agent (contract
//! section 18): the agent's CPU per scrape round of 100 real Envoys, each in a network
//! namespace of its own (`unshare --net`, admin on its loopback), beside 100 real
//! Envoys on the root namespace's loopback. Each side is measured twice: with the
//! clients kept between rounds, as the scrape loop keeps them (the pool reuses each
//! sidecar's connections, so a namespace is entered once per connection), and with a
//! new client every round (every call opens a connection, so every connection enters
//! the namespace). Run with
//! `cargo bench -p meshcat-tests --bench agent_netns` (root, `unshare` and `ip`
//! needed); `MESHCAT_BENCH_SIDECARS` changes the 100.

// A benchmark's report is its standard output.
#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use meshcat_agent::envoy::EnvoyAdmin;
use meshcat_agent::metrics_object::HostSampler;
use meshcat_agent::ops_metrics::OpsMetrics;
use meshcat_agent::scrape::scrape_once;
use meshcat_agent::target::Target;
use meshcat_agent::topology::TopologyCache;
use meshcat_tests::{Bootstrap, Envoy};

/// Scrape rounds measured per case (after one round that opens the connections).
const ROUNDS: u32 = 10;
/// Envoys started at once.
const START_BATCH: usize = 10;

/// CPU time of this process, user and system, every thread's included, the ended
/// ones too (the threads that enter a namespace end after connecting, and their
/// time leaves `/proc/self/task`): `/proc/self/stat`, in clock ticks of 10 ms,
/// fine over rounds of 100 scrapes.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after_name
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

async fn start_all(n: usize, isolated: bool) -> anyhow::Result<Vec<Envoy>> {
    let mut envoys = Vec::with_capacity(n);
    while envoys.len() < n {
        let batch = START_BATCH.min(n - envoys.len());
        let started = futures::future::join_all((0..batch).map(|_| async {
            let b = Bootstrap::service_sidecar(SocketAddr::from(([127, 0, 0, 1], 9)), None);
            if isolated {
                Envoy::start_isolated(b).await
            } else {
                Envoy::start(b).await
            }
        }))
        .await;
        for e in started {
            envoys.push(e?);
        }
    }
    Ok(envoys)
}

fn targets(envoys: &[Envoy]) -> Vec<Target> {
    envoys
        .iter()
        .enumerate()
        .map(|(i, e)| Target {
            admin: e.admin_addr(),
            zone_name: "bench".into(),
            cluster_name: "c".into(),
            instance: format!("i-{i}"),
            log_file: None,
            local_cluster: None,
            netns: e.netns_path().map(meshcat_agent::envoy::Netns::pinned_now),
        })
        .collect()
}

/// One round: every target scraped once, all at once, as the agent's scrape loops do,
/// each with its sidecar's configuration known from the round before (steady state).
async fn round(
    clients: &[EnvoyAdmin],
    targets: &[Target],
    topologies: &mut [TopologyCache],
    host: &HostSampler,
) -> usize {
    let scrapes = clients
        .iter()
        .zip(targets)
        .zip(topologies.iter_mut())
        .map(|((c, t), topology)| scrape_once(c, t, host, None, topology));
    let reports = futures::future::join_all(scrapes).await;
    reports.iter().filter(|r| r.reachable).count()
}

fn clients(targets: &[Target], metrics: &OpsMetrics) -> Vec<EnvoyAdmin> {
    targets
        .iter()
        .map(|t| {
            let hook = metrics.netns_error_hook((&t.zone_name, &t.cluster_name, &t.instance));
            t.admin_client(Duration::from_secs(5), hook).unwrap()
        })
        .collect()
}

/// CPU per round with clients kept between rounds, then with new clients every round.
async fn measure(targets: &[Target]) -> (Duration, Duration) {
    let host = HostSampler::new();
    let metrics = OpsMetrics::new();
    let mut topologies: Vec<TopologyCache> =
        targets.iter().map(|_| TopologyCache::default()).collect();
    let kept = clients(targets, &metrics);
    let all = targets.len();
    assert_eq!(round(&kept, targets, &mut topologies, &host).await, all);
    let cpu = cpu_time();
    for _ in 0..ROUNDS {
        assert_eq!(round(&kept, targets, &mut topologies, &host).await, all);
    }
    let pooled = (cpu_time() - cpu) / ROUNDS;
    let cpu = cpu_time();
    for _ in 0..ROUNDS {
        let fresh = clients(targets, &metrics);
        assert_eq!(round(&fresh, targets, &mut topologies, &host).await, all);
    }
    let fresh = (cpu_time() - cpu) / ROUNDS;
    (pooled, fresh)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::var("MESHCAT_BENCH_SIDECARS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    println!("{n} sidecars per case, {ROUNDS} scrape rounds per measure");
    for (name, isolated) in [("loopback", false), ("netns", true)] {
        let t = Instant::now();
        let envoys = start_all(n, isolated).await?;
        println!(
            "{name}: {n} Envoys LIVE in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let (pooled, fresh) = measure(&targets(&envoys)).await;
        println!(
            "{name}: agent CPU per round of {n} scrapes: {:.1} ms with kept connections ({:.2} ms per sidecar), {:.1} ms with a new connection per call ({:.2} ms per sidecar)",
            pooled.as_secs_f64() * 1e3,
            pooled.as_secs_f64() * 1e3 / n as f64,
            fresh.as_secs_f64() * 1e3,
            fresh.as_secs_f64() * 1e3 / n as f64,
        );
        drop(envoys);
    }
    Ok(())
}
