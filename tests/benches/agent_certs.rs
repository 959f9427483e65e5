//! Benchmark of the agent's reading of sidecars' certificates (contract section 19)
//! against real Envoys whose certificates the benchmark issues.
//!
//! - `SIDECARS` (100) sidecars of two TLS contexts each (a listener that requires a
//!   client certificate and a cluster presenting one, from one CA): the CPU time of
//!   one `/certs` read, of one scrape round over every sidecar with their
//!   certificates read (as at each `--certs-interval`, or after a rotation) and
//!   without (every other scrape), and, from the real `meshcat-agent` binary
//!   reporting them to a real aggregator, the bytes its whole and its steady (delta)
//!   reports cost per instance: a steady report carries no certificate.
//! - One sidecar of a mesh with mTLS to each of `MTLS_CLUSTERS` (20,000) upstream
//!   clusters, all presenting the same certificate: Envoy's answer to `/certs`
//!   (about 14 MB: one entry per TLS context) and the CPU time of one read.
//!
//! Run with
//! `cargo build --release -p meshcat-agent && cargo bench -p meshcat-tests --bench agent_certs`;
//! `MESHCAT_CERTS_BENCH=many` or `=large` runs one of the two.

// A benchmark's report is its standard output.
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use meshcat_agent::envoy::EnvoyAdmin;
use meshcat_agent::envoy::xds::XdsTracker;
use meshcat_agent::identity::IdentityReader;
use meshcat_agent::metrics_object::HostSampler;
use meshcat_agent::scrape::{IdentityScrape, XdsScrape, scrape_following, scrape_once};
use meshcat_agent::target::Target;
use meshcat_agent::topology::TopologyCache;
use meshcat_tests::bootstrap::{Cluster, Tls};
use meshcat_tests::certs::{CertSpec, Identity};
use meshcat_tests::cpu::{machine_line, thread_cpu_time};
use meshcat_tests::mesh::metric_sum;
use meshcat_tests::{Bootstrap, Catalog, Envoy, MeshAgent, MeshCerts, Upstream, wait_for};

const SIDECARS: usize = 100;
const MTLS_CLUSTERS: usize = 20_000;
/// Envoys started at once.
const START_BATCH: usize = 10;
/// Rounds measured per case.
const ROUNDS: u32 = 10;
const DAY: Duration = Duration::from_secs(86_400);

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let which = std::env::var("MESHCAT_CERTS_BENCH").unwrap_or_default();
    println!("{}", machine_line());
    let dir = tempfile::tempdir()?;
    let certs = MeshCerts::new(dir.path(), "bench")?;
    if which.is_empty() || which == "many" {
        many_sidecars(&certs).await?;
    }
    if which.is_empty() || which == "large" {
        large_sidecar(&certs).await?;
    }
    Ok(())
}

fn issue(certs: &MeshCerts, name: &str) -> anyhow::Result<Identity> {
    certs.issue(&CertSpec::valid_for(
        name,
        &format!("{name}.bench"),
        &format!("spiffe://bench.local/ns/bench/sa/{name}"),
        30 * DAY,
    ))
}

fn target(envoy: &Envoy, i: usize) -> Target {
    Target {
        admin: envoy.admin_addr(),
        zone_name: "bench".into(),
        cluster_name: format!("svc-{i}"),
        instance: format!("svc-{i}-1"),
        ..Default::default()
    }
}

async fn many_sidecars(certs: &MeshCerts) -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    let mut envoys = Vec::with_capacity(SIDECARS);
    let started = Instant::now();
    while envoys.len() < SIDECARS {
        let batch = START_BATCH.min(SIDECARS - envoys.len());
        let mut starting = Vec::new();
        for _ in 0..batch {
            let i = envoys.len() + starting.len();
            let id = issue(certs, &format!("svc-{i}"))?;
            let mut b =
                Bootstrap::service_sidecar(upstream.addr, Some(Tls::new(certs, id.clone(), None)));
            let mut peer = Cluster::new("peer", &[upstream.addr]);
            peer.tls = Some(Tls::new(certs, id, None));
            b = b.cluster(peer);
            starting.push(Envoy::start(b));
        }
        for e in futures::future::join_all(starting).await {
            envoys.push(e?);
        }
    }
    println!(
        "{SIDECARS} sidecars of 2 TLS contexts started in {:.1} s; /certs of one is {} bytes",
        started.elapsed().as_secs_f64(),
        envoys[0].admin_get("/certs").await?.len()
    );
    let admins: Vec<EnvoyAdmin> = envoys
        .iter()
        .map(|e| EnvoyAdmin::new(&e.admin_addr(), Duration::from_secs(5)))
        .collect::<Result<_, _>>()?;
    // Connections opened before anything is timed.
    for a in &admins {
        a.certs().await?;
    }
    let cpu0 = thread_cpu_time();
    for _ in 0..ROUNDS {
        for a in &admins {
            let read = a.certs().await?;
            assert_eq!(read.certificates.len(), 2, "a chain and its CA");
        }
    }
    let per_read = (thread_cpu_time() - cpu0) / (ROUNDS * SIDECARS as u32);
    println!(
        "one /certs read (2 TLS contexts, 2 distinct certificates): {:.1} µs of CPU",
        per_read.as_secs_f64() * 1e6
    );

    let host = HostSampler::new();
    let targets: Vec<Target> = envoys
        .iter()
        .enumerate()
        .map(|(i, e)| target(e, i))
        .collect();
    let mut fleet = Fleet {
        admins: &admins,
        targets: &targets,
        topologies: (0..SIDECARS).map(|_| TopologyCache::default()).collect(),
        trackers: (0..SIDECARS).map(|_| XdsTracker::default()).collect(),
        readers: (0..SIDECARS).map(|_| IdentityReader::default()).collect(),
    };
    fleet.round(&host, true).await;
    let mut cpu = [Duration::ZERO; 2];
    for _ in 0..ROUNDS {
        for (k, with_certs) in [false, true].into_iter().enumerate() {
            let cpu0 = thread_cpu_time();
            fleet.round(&host, with_certs).await;
            cpu[k] += thread_cpu_time() - cpu0;
        }
    }
    let [without, with] = cpu.map(|c| c / ROUNDS);
    println!(
        "scrape round over {SIDECARS} sidecars: {:.1} ms of CPU without reading certificates, {:.1} ms reading them (+{:.1} ms, {:.1} µs per sidecar)",
        without.as_secs_f64() * 1e3,
        with.as_secs_f64() * 1e3,
        with.saturating_sub(without).as_secs_f64() * 1e3,
        with.saturating_sub(without).as_secs_f64() * 1e6 / SIDECARS as f64,
    );

    // The real agent binary reporting them: what a whole and a steady report cost.
    let catalog = Catalog::start(|_| {}).await?;
    let targets_file = tempfile::NamedTempFile::new()?;
    let list: Vec<serde_json::Value> = targets
        .iter()
        .map(|t| {
            serde_json::json!({"admin": t.admin, "zoneName": t.zone_name,
                "clusterName": t.cluster_name, "instance": t.instance})
        })
        .collect();
    std::fs::write(targets_file.path(), serde_json::to_vec(&list)?)?;
    let mut args = catalog.agent_args();
    args.extend([
        "--targets-file".to_owned(),
        targets_file.path().display().to_string(),
        "--interval".to_owned(),
        "1s".to_owned(),
    ]);
    let agent = MeshAgent::start(&args).await?;
    let sent = |text: &str, name: &str, form: &str| metric_sum(text, name, &[("form", form)]);
    let text = wait_for(
        "20 reports of every instance",
        Duration::from_secs(120),
        || async {
            let t = agent.metrics().await.ok()?;
            (sent(&t, "meshcat_agent_report_instances_total", "delta")? >= 20.0 * SIDECARS as f64)
                .then_some(t)
        },
    )
    .await?;
    let per = |form: &str| {
        sent(&text, "meshcat_agent_report_bytes_total", form).unwrap_or(0.0)
            / sent(&text, "meshcat_agent_report_instances_total", form).unwrap_or(1.0)
    };
    let (_, rows) = catalog.get("/certificates").await?;
    println!(
        "reports of the agent binary: {:.0} bytes per instance whole (certificates included), {:.0} bytes per instance steady (delta, no certificate); the aggregator lists {} certificates",
        per("whole"),
        per("delta"),
        rows.as_array().map_or(0, Vec::len)
    );
    agent.stop().await?;
    Ok(())
}

/// The sidecars of one scrape round and what the scrapes follow from one to the next.
struct Fleet<'a> {
    admins: &'a [EnvoyAdmin],
    targets: &'a [Target],
    topologies: Vec<TopologyCache>,
    trackers: Vec<XdsTracker>,
    readers: Vec<IdentityReader>,
}

impl Fleet<'_> {
    /// Scrapes every sidecar once, with its certificates read (due at every scrape)
    /// or without.
    async fn round(&mut self, host: &HostSampler, with_certs: bool) {
        for i in 0..self.admins.len() {
            let (admin, target) = (&self.admins[i], &self.targets[i]);
            let r = if with_certs {
                scrape_following(
                    admin,
                    target,
                    host,
                    None,
                    &mut self.topologies[i],
                    XdsScrape {
                        tracker: &mut self.trackers[i],
                        log: None,
                    },
                    IdentityScrape {
                        reader: &mut self.readers[i],
                        interval: Duration::ZERO,
                    },
                )
                .await
            } else {
                scrape_once(admin, target, host, None, &mut self.topologies[i]).await
            };
            assert!(r.reachable, "{:?}", r.error);
        }
    }
}

async fn large_sidecar(certs: &MeshCerts) -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    let id = issue(certs, "large")?;
    let mut b = Bootstrap::service_sidecar(upstream.addr, None);
    for i in 0..MTLS_CLUSTERS {
        let mut c = Cluster::new(&format!("service_{i:05}"), &[upstream.addr]);
        c.tls = Some(Tls::new(certs, id.clone(), None));
        b = b.cluster(c);
    }
    let started = Instant::now();
    let envoy = Envoy::start(b).await?;
    // About 14 MB: longer than the harness's 2 s for an admin call on a busy machine.
    let answer = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?
        .get(format!("http://{}/certs", envoy.admin_addr()))
        .send()
        .await?
        .bytes()
        .await?
        .len();
    println!(
        "a sidecar with mTLS to {MTLS_CLUSTERS} clusters: started in {:.1} s, /certs is {:.1} MB",
        started.elapsed().as_secs_f64(),
        answer as f64 / 1e6
    );
    let admin = EnvoyAdmin::new(&envoy.admin_addr(), Duration::from_secs(30))?;
    admin.certs().await?;
    let reads = 5;
    let (cpu0, wall0) = (thread_cpu_time(), Instant::now());
    for _ in 0..reads {
        let read = admin.certs().await?;
        assert_eq!(
            read.certificates.len(),
            2,
            "one chain and its CA, however many contexts"
        );
    }
    println!(
        "one /certs read of it: {:.1} ms of the agent's CPU, {:.1} ms in all (Envoy writing it included)",
        (thread_cpu_time() - cpu0).as_secs_f64() * 1e3 / f64::from(reads),
        wall0.elapsed().as_secs_f64() * 1e3 / f64::from(reads),
    );
    Ok(())
}
