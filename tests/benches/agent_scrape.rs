//! Benchmark of the agent's scrape against a real Envoy with 1,000 upstream
//! clusters, each named by a route of an egress listener and each having carried
//! requests, so that every scrape reads 1,000 upstreams' traffic for the graph: CPU
//! time per scrape and parse (with the sidecar's configuration read before, as in
//! steady state, and with its `/config_dump` read and parsed again, as after a
//! configuration change), and the resident memory of the real `meshcat-agent`
//! binary scraping it every 5 s. Run with
//! `cargo build --release -p meshcat-agent && cargo bench -p meshcat-tests --bench agent_scrape`.

// A benchmark's report is its standard output.
#![allow(clippy::print_stdout)]

use std::time::Duration;

use meshcat_agent::envoy::EnvoyAdmin;
use meshcat_agent::metrics_object::HostSampler;
use meshcat_agent::scrape::scrape_once;
use meshcat_agent::target::Target;
use meshcat_agent::topology::TopologyCache;
use meshcat_tests::bootstrap::{Cluster, HttpListener};
use meshcat_tests::{Bootstrap, Envoy, Upstream};

const CLUSTERS: usize = 1_000;
const SCRAPES: u32 = 30;
/// Scrapes that read and parse `/config_dump` again.
const CONFIG_SCRAPES: u32 = 10;

/// CPU time this process's threads have run, in nanoseconds, from each thread's
/// `/proc/self/task/<tid>/schedstat` (the scheduler's own count: `/proc/self/stat`
/// counts in 10 ms clock ticks, coarser than a scrape).
fn cpu_time() -> Duration {
    let ns: u64 = std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    let mut b = Bootstrap::service_sidecar(upstream.addr, None);
    let mut egress = HttpListener::new("egress", "egress_http");
    for i in 0..CLUSTERS {
        let name = format!("service_{i:04}");
        egress = egress.route(&format!("/{name}/"), &name);
        b = b.cluster(Cluster::new(&name, &[upstream.addr]));
    }
    let envoy = Envoy::start(b.listener(egress)).await?;
    let client = reqwest::Client::new();
    for _ in 0..100 {
        client
            .get(format!("{}/x", envoy.url("ingress")))
            .send()
            .await?;
    }
    // Every upstream cluster carries requests: each is an upstream of the graph.
    for i in 0..CLUSTERS {
        client
            .get(format!("{}/service_{i:04}/x", envoy.url("egress")))
            .send()
            .await?;
    }
    for path in [
        "/clusters?format=json",
        &meshcat_agent::envoy::stats_path(),
        "/config_dump",
    ] {
        let size = envoy.admin_get(path).await?.len();
        println!(
            "answer {}: {size} bytes",
            path.split('&').next().unwrap_or(path)
        );
    }
    let admin = EnvoyAdmin::new(&envoy.admin_addr(), Duration::from_secs(5))?;
    let host = HostSampler::new();
    let target = Target {
        admin: envoy.admin_addr(),
        zone_name: "bench".into(),
        cluster_name: "bench".into(),
        instance: "bench".into(),
        ..Default::default()
    };
    let mut topology = TopologyCache::default();
    let mut last = scrape_once(&admin, &target, &host, None, &mut topology).await;
    assert!(last.reachable, "{:?}", last.error);
    assert_eq!(last.clusters.len(), CLUSTERS + 1);
    let cpu0 = cpu_time();
    let wall0 = std::time::Instant::now();
    for _ in 0..SCRAPES {
        last = scrape_once(&admin, &target, &host, Some(&last), &mut topology).await;
    }
    let cpu = (cpu_time() - cpu0) / SCRAPES;
    let wall = wall0.elapsed() / SCRAPES;
    // The 1,000 clusters and local_service, which the ingress listener calls.
    assert_eq!(
        last.upstreams.len(),
        CLUSTERS + 1,
        "every upstream carried traffic"
    );
    let routed = last
        .listeners
        .iter()
        .map(|l| l.clusters.len())
        .max()
        .unwrap_or(0);
    assert_eq!(routed, CLUSTERS, "the egress listener names every cluster");
    println!(
        "scrape+parse of {CLUSTERS} clusters, {} upstreams with traffic: CPU {cpu:?} per scrape (wall {wall:?})",
        last.upstreams.len()
    );
    let cpu0 = cpu_time();
    let wall0 = std::time::Instant::now();
    for _ in 0..CONFIG_SCRAPES {
        // A new cache: the configuration is read as after a change.
        let mut fresh = TopologyCache::default();
        last = scrape_once(&admin, &target, &host, Some(&last), &mut fresh).await;
    }
    let cpu = (cpu_time() - cpu0) / CONFIG_SCRAPES;
    let wall = wall0.elapsed() / CONFIG_SCRAPES;
    assert_eq!(last.listeners.len(), 2, "{:?}", last.error);
    println!(
        "scrape+parse with /config_dump read again ({CLUSTERS} routes): CPU {cpu:?} per scrape (wall {wall:?})"
    );

    let bin = std::env::var("MESHCAT_AGENT_BIN").unwrap_or_else(|_| {
        let target = std::env::var("CARGO_TARGET_DIR")
            .unwrap_or_else(|_| format!("{}/../target", env!("CARGO_MANIFEST_DIR")));
        format!("{target}/release/meshcat-agent")
    });
    // MESHCAT_AGENT_WRAPPER runs the agent under another program (for example
    // `valgrind --tool=massif --massif-out-file=/tmp/agent.massif`) to see where its
    // memory goes; the RSS figures are then the wrapper's.
    let wrapper: Vec<String> = std::env::var("MESHCAT_AGENT_WRAPPER")
        .map(|w| w.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    let (program, pre) = match wrapper.split_first() {
        Some((p, rest)) => (p.clone(), [rest, std::slice::from_ref(&bin)].concat()),
        None => (bin.clone(), Vec::new()),
    };
    let mut child = std::process::Command::new(&program)
        .args(&pre)
        .args([
            "--sidecar-admin",
            &envoy.admin_addr(),
            "--interval",
            "5s",
            "--ops-addr",
            "127.0.0.1:0",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot run {bin} (build it with --release): {e}"))?;
    let pid = child.id();
    let mut peak = 0;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        peak = peak.max(status_kib(pid, "VmRSS:"));
    }
    let hwm = status_kib(pid, "VmHWM:");
    // SIGTERM, so that the agent (and a wrapper's report) ends cleanly.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();
    println!(
        "agent RSS scraping every 5 s for 40 s: max VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        peak as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    Ok(())
}
