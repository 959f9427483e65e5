//! The identity inventory at scale (contract section 19): the heap the aggregator
//! holds per certificate, counted exactly, and the latency of
//! `GET /certificates?state=expiring` over HTTP, at `--clusters` x `--instances`
//! live instances (100,000 by default).
//!
//! In one process: the aggregator's components opened as the binary opens them (a
//! real store in a temporary directory, no history, no control plane), every instance
//! reported once without any identity (counted before), then once more with its
//! certificates: a chain certificate with a DNS and a SPIFFE URI SAN delivered over
//! SDS, and the mesh's CA (counted after: the difference is what the identities
//! cost), and again with `--expectations` SAN expectations each (counted apart). Then
//! the API is served on a loopback port and `--requests` GETs are timed one after the
//! other. 1 % of the instances hold a certificate that is expiring, so the answer
//! lists `--clusters x --instances / 100` rows.
//!
//! Run with `cargo build --release -p meshcat-bench && target/release/meshcat-bench-certificates`.

// A benchmark reports on standard output.
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use clap::Parser;
use meshcat_aggregator::Aggregator;
use meshcat_aggregator::config::Config;
use meshcat_common::identity::{
    CertRole, IdentityReport, ReportedCertificate, San, SanExpectation, SanKind, SanMatcher,
    SdsSecret,
};
use meshcat_common::wire::InstanceReport;

#[global_allocator]
static ALLOC: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

#[derive(Parser, Debug)]
#[command(about = "Heap per certificate and GET /certificates latency at scale")]
struct Args {
    /// Clusters, each in zone `zone-<n mod 20>`.
    #[arg(long, default_value_t = 10_000)]
    clusters: usize,
    /// Instances of each cluster.
    #[arg(long, default_value_t = 10)]
    instances: usize,
    /// SAN expectations (upstream clusters with a matcher) of each instance.
    #[arg(long, default_value_t = 5)]
    expectations: usize,
    /// Timed requests.
    #[arg(long, default_value_t = 200)]
    requests: usize,
}

const DAY_MS: i64 = 86_400_000;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Instance `i` of cluster `c`, as an agent's whole report, with `identity`.
fn report(c: usize, i: usize, identity: Option<IdentityReport>) -> InstanceReport {
    let mut r = InstanceReport::unread(
        format!("zone-{}", c % 20),
        format!("svc-{c}"),
        format!("svc-{c}-{i}"),
    );
    r.reachable = true;
    r.start_time_ms = 1_700_000_000_000;
    r.server_state = "LIVE".into();
    r.identity = identity;
    r
}

/// The identity of instance `i` of cluster `c`: 1 % expiring, 5-day certificates
/// with 2 days left (past half their life, before the overdue point at 80 %), the
/// rest 30-day ones with 20 days left; and `expectations` upstreams' matchers.
fn identity(c: usize, i: usize, expectations: usize, now: i64) -> IdentityReport {
    let (left, lifetime) = if (c * 10 + i) % 100 == 0 {
        (2 * DAY_MS, 5 * DAY_MS)
    } else {
        (20 * DAY_MS, 30 * DAY_MS)
    };
    let zone = c % 20;
    let chain = ReportedCertificate {
        serial: format!("{:040x}", (c as u128) << 32 | i as u128),
        role: CertRole::Chain,
        sans: vec![
            San::new(SanKind::Dns, format!("svc-{c}.zone-{zone}.svc")),
            San::new(
                SanKind::Uri,
                format!("spiffe://cluster.local/ns/zone-{zone}/sa/svc-{c}"),
            ),
        ],
        valid_from_ms: now + left - lifetime,
        expires_at_ms: now + left,
        secret: Some(SdsSecret {
            name: "default".into(),
            version: "v1".into(),
            last_updated_ms: now + left - lifetime,
        }),
    };
    let ca = ReportedCertificate {
        serial: "6d657368636174206265636820636100".into(),
        role: CertRole::Ca,
        sans: Vec::new(),
        valid_from_ms: now - 365 * DAY_MS,
        expires_at_ms: now + 3650 * DAY_MS,
        secret: Some(SdsSecret {
            name: "ROOTCA".into(),
            version: "v1".into(),
            last_updated_ms: now - 365 * DAY_MS,
        }),
    };
    let expectations = (1..=expectations)
        .map(|k| {
            let callee = (c + k) % 10_000;
            SanExpectation {
                cluster: format!("svc-{callee}"),
                matchers: vec![SanMatcher::exact(
                    SanKind::Uri,
                    format!(
                        "spiffe://cluster.local/ns/zone-{}/sa/svc-{callee}",
                        callee % 20
                    ),
                )],
            }
        })
        .collect();
    IdentityReport::new(vec![chain, ca], expectations, None)
}

/// Reports every instance, one agent per cluster, with what `identity` gives.
fn report_all(
    agg: &Aggregator,
    a: &Args,
    identity: impl Fn(usize, usize) -> Option<IdentityReport>,
) {
    let now = Instant::now();
    for c in 0..a.clusters {
        let reports = (0..a.instances)
            .map(|i| report(c, i, identity(c, i)))
            .collect();
        agg.instances
            .apply_reports(&format!("agent-{c}"), reports, now);
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let dir = tempfile::tempdir()?;
    let mut config = Config::for_tests(dir.path());
    config.history.max_entries = 0;
    config.control.enabled = false;
    let agg = tokio::task::spawn_blocking(move || Aggregator::open(config)).await??;
    let total = a.clusters * a.instances;
    let now = now_ms();

    report_all(&agg, &a, |_, _| None);
    let bare = ALLOC.allocated();
    report_all(&agg, &a, |c, i| Some(identity(c, i, 0, now)));
    let with_certs = ALLOC.allocated();
    report_all(&agg, &a, |c, i| Some(identity(c, i, a.expectations, now)));
    let with_expectations = ALLOC.allocated();
    let certs = total * 2;
    println!(
        "heap: {total} instances, {certs} certificates: {} bytes per certificate ({:.1} MiB in all); \
         {} expectations per instance: {} bytes per instance more",
        (with_certs.saturating_sub(bare)) / certs,
        (with_certs.saturating_sub(bare)) as f64 / (1 << 20) as f64,
        a.expectations,
        (with_expectations.saturating_sub(with_certs)) / total,
    );

    let api = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let ops = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = api.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(meshcat_aggregator::serve(agg, api, ops, async move {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/certificates?state=expiring");
    let mut rows = 0;
    for _ in 0..5 {
        let body: serde_json::Value = client.get(&url).send().await?.json().await?;
        rows = body.as_array().map_or(0, Vec::len);
    }
    anyhow::ensure!(
        rows == total / 100,
        "GET /certificates?state=expiring lists {rows} rows, not the {} expiring certificates",
        total / 100
    );
    let mut took = Vec::with_capacity(a.requests);
    let mut bytes = 0;
    for _ in 0..a.requests {
        let started = Instant::now();
        let body = client.get(&url).send().await?.bytes().await?;
        took.push(started.elapsed());
        bytes = body.len();
    }
    took.sort();
    println!(
        "GET /certificates?state=expiring: {rows} rows ({bytes} bytes), {} requests one after the other: \
         p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        a.requests,
        percentile(&took, 0.5).as_secs_f64() * 1e3,
        percentile(&took, 0.99).as_secs_f64() * 1e3,
        took.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
    let _ = stop.send(());
    server.await??;
    Ok(())
}
