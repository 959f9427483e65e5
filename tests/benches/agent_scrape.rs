//! Benchmark of the agent's scrape against real Envoys.
//!
//! - A sidecar with 1,000 upstream clusters, each named by a route of an egress
//!   listener and each having carried requests, so that every scrape reads 1,000
//!   upstreams' traffic for the graph: CPU time per scrape and parse (with the
//!   sidecar's configuration read before, as in steady state, and with its
//!   `/config_dump` read and parsed again, as after a configuration change), and the
//!   resident memory of the real `meshcat-agent` binary scraping it every 5 s.
//! - A sidecar of a mesh without configuration scoping: 20,000 static upstream
//!   clusters of 5 hosts ([`meshcat_tests::large_sidecar`]): how long Envoy takes to
//!   start and to answer, the sizes of its answers, CPU time per scrape, and the
//!   real agent binary's CPU per scrape and resident memory scraping it every 5 s.
//!
//! Run with
//! `cargo build --release -p meshcat-agent && cargo bench -p meshcat-tests --bench agent_scrape`;
//! `MESHCAT_SCRAPE_BENCH=small` or `=large` runs one of the two.

// A benchmark's report is its standard output.
#![allow(clippy::print_stdout)]

use std::time::Duration;

use meshcat_agent::envoy::EnvoyAdmin;
use meshcat_agent::metrics_object::HostSampler;
use meshcat_agent::scrape::scrape_once;
use meshcat_agent::target::Target;
use meshcat_agent::topology::TopologyCache;
use meshcat_tests::bootstrap::{Cluster, HttpListener};
use meshcat_tests::cpu::{machine_line, process_cpu, status_kib, thread_cpu_time as cpu_time};
use meshcat_tests::large_sidecar;
use meshcat_tests::{Bootstrap, Envoy, Upstream};

const CLUSTERS: usize = 1_000;
const SCRAPES: u32 = 30;
/// Scrapes that read and parse `/config_dump` again.
const CONFIG_SCRAPES: u32 = 10;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let which = std::env::var("MESHCAT_SCRAPE_BENCH").unwrap_or_default();
    println!("{}", machine_line());
    if which.is_empty() || which == "small" {
        small_sidecar().await?;
    }
    if which.is_empty() || which == "large" {
        large_sidecar().await?;
    }
    Ok(())
}

async fn small_sidecar() -> anyhow::Result<()> {
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

    let agent = run_agent(&envoy.admin_addr(), &[], 8).await?;
    println!(
        "agent RSS scraping every 5 s for 40 s: max VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        agent.peak_kib as f64 / 1024.0,
        agent.hwm_kib as f64 / 1024.0
    );
    Ok(())
}

/// What the real agent binary used while it ran.
struct AgentRun {
    /// Largest VmRSS seen, sampled every 5 s.
    peak_kib: u64,
    /// VmHWM at the end.
    hwm_kib: u64,
    /// Its CPU time (user and system) from the first sample (after its first
    /// scrapes) to the last.
    cpu: Duration,
    /// Scrapes that succeeded in that time.
    scrapes_ok: u64,
}

/// The agent's successful scrapes so far, from its ops port.
async fn scrapes_ok(ops: std::net::SocketAddr) -> anyhow::Result<u64> {
    Ok(reqwest::get(format!("http://{ops}/metrics"))
        .await?
        .text()
        .await?
        .lines()
        .filter(|l| l.starts_with("meshcat_agent_scrapes_total") && l.contains("outcome=\"ok\""))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum())
}

/// Runs the real `meshcat-agent` scraping `admin` every 5 s (with `args` added)
/// for `periods` intervals.
async fn run_agent(admin: &str, args: &[&str], periods: u32) -> anyhow::Result<AgentRun> {
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
    let ops = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let mut child = std::process::Command::new(&program)
        .args(&pre)
        .args([
            "--sidecar-admin",
            admin,
            "--interval",
            "5s",
            "--ops-addr",
            &ops.to_string(),
        ])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot run {bin} (build it with --release): {e}"))?;
    let pid = child.id();
    let mut peak = 0;
    let mut first = None;
    for _ in 0..periods {
        tokio::time::sleep(Duration::from_secs(5)).await;
        peak = peak.max(status_kib(pid, "VmRSS:"));
        if first.is_none() {
            first = Some((process_cpu(pid), scrapes_ok(ops).await.unwrap_or(0)));
        }
    }
    let hwm = status_kib(pid, "VmHWM:");
    let (cpu0, ok0) = first.unwrap_or_default();
    let cpu = process_cpu(pid).saturating_sub(cpu0);
    let ok = scrapes_ok(ops).await?.saturating_sub(ok0);
    // SIGTERM, so that the agent (and a wrapper's report) ends cleanly.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();
    Ok(AgentRun {
        peak_kib: peak,
        hwm_kib: hwm,
        cpu,
        scrapes_ok: ok,
    })
}

/// Scrapes of the large sidecar measured in this process.
const LARGE_SCRAPES: u32 = 10;

async fn large_sidecar() -> anyhow::Result<()> {
    let clusters = large_sidecar::clusters(large_sidecar::CLUSTERS);
    let hosts = large_sidecar::CLUSTERS * large_sidecar::HOSTS;
    let started = std::time::Instant::now();
    let envoy = Envoy::start(large_sidecar::bootstrap(&clusters)).await?;
    println!(
        "Envoy with {} static clusters, {hosts} hosts: LIVE after {:.1} s",
        large_sidecar::CLUSTERS,
        started.elapsed().as_secs_f64()
    );
    drop(clusters);
    let client = reqwest::Client::new();
    for path in [
        "/clusters?format=json",
        &meshcat_agent::envoy::stats_path(),
        "/config_dump",
    ] {
        let t = std::time::Instant::now();
        let body = client
            .get(format!("http://{}{path}", envoy.admin_addr()))
            .send()
            .await?
            .bytes()
            .await?;
        println!(
            "answer {}: {} bytes in {:.2} s",
            path.split('&').next().unwrap_or(path),
            body.len(),
            t.elapsed().as_secs_f64()
        );
        if path.starts_with("/clusters") {
            // The reader alone, on the answer in memory.
            let cpu0 = cpu_time();
            for _ in 0..5 {
                let read = meshcat_agent::envoy::clusters::read_clusters(&body)?;
                assert_eq!(read.len(), large_sidecar::CLUSTERS);
            }
            println!(
                "reading that answer in memory: CPU {:?}",
                (cpu_time() - cpu0) / 5
            );
        }
    }
    // A call may take Envoy a few seconds here: the bench measures the agent, not
    // the default timeout.
    let admin = EnvoyAdmin::new(&envoy.admin_addr(), Duration::from_secs(30))?;
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
    assert_eq!(last.clusters.len(), large_sidecar::CLUSTERS);
    let cpu0 = cpu_time();
    let wall0 = std::time::Instant::now();
    for _ in 0..LARGE_SCRAPES {
        last = scrape_once(&admin, &target, &host, Some(&last), &mut topology).await;
        assert!(last.reachable, "{:?}", last.error);
    }
    let cpu = (cpu_time() - cpu0) / LARGE_SCRAPES;
    let wall = wall0.elapsed() / LARGE_SCRAPES;
    println!(
        "scrape+parse of {} clusters, {hosts} hosts: CPU {cpu:?} per scrape (wall {wall:?}, most of it Envoy writing /clusters)",
        last.clusters.len()
    );
    let cpu0 = cpu_time();
    let t = std::time::Instant::now();
    let listed = admin.clusters().await?;
    let cpu = cpu_time() - cpu0;
    println!(
        "/clusters alone, read as it arrives: CPU {cpu:?} (wall {:?}), {} clusters",
        t.elapsed(),
        listed.len()
    );
    drop(listed);

    let periods = 8;
    // No aggregator answers there: the agent's CPU is its scrapes'.
    let agent = run_agent(
        &envoy.admin_addr(),
        &["--scrape-timeout", "30s", "--aggregator", "127.0.0.1:9"],
        periods,
    )
    .await?;
    let ok = agent.scrapes_ok;
    println!(
        "agent scraping it every 5 s for {} s: after its first scrape, {ok} scrapes ok in CPU {:?} ({:?} per scrape, 10 ms ticks); max VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        periods * 5,
        agent.cpu,
        agent.cpu / u32::try_from(ok.max(1)).unwrap_or(1),
        agent.peak_kib as f64 / 1024.0,
        agent.hwm_kib as f64 / 1024.0
    );
    Ok(())
}
