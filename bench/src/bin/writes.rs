//! Registration write benchmark: many concurrent writers (`--writers`, default 64)
//! each register clusters through `POST /clusters` on a running aggregator; every
//! write is acknowledged only after its durable commit, so writes per second measure
//! the store's commit path (group commit) under concurrency. `--bulk N` sends arrays
//! of N records instead (the all-or-nothing bulk form).

// A command-line benchmark: its report goes to stdout.
#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::{Value, json};

#[derive(Debug, Parser)]
struct Args {
    /// The aggregator's API, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    api: String,
    /// Concurrent writers, each on its own keep-alive connection.
    #[arg(long, default_value_t = 64)]
    writers: usize,
    /// Clusters to register.
    #[arg(long, default_value_t = 10_000)]
    clusters: usize,
    /// Zones they are spread over (created first).
    #[arg(long, default_value_t = 20)]
    zones: usize,
    /// Records per request: 1 posts single records, more posts arrays.
    #[arg(long, default_value_t = 1)]
    bulk: usize,
    /// Prefix of the cluster names, so that runs against one aggregator do not collide.
    #[arg(long, default_value = "w")]
    prefix: String,
}

fn record(prefix: &str, i: usize, zones: usize) -> Value {
    json!({
        "clusterName": format!("{prefix}-{i:06}"), "zoneName": format!("zone-{:02}", i % zones),
        "name": format!("Service {i}"), "version": format!("1.{}", i % 7),
        "owner": format!("team-{}", i % 50), "capability": format!("cap-{}", i % 30),
        "prometheusJob": format!("job-{i}"), "documentation": "/docs/service",
        "description": "A benchmark service.", "minInstances": 1, "maxInstances": 4,
        "protocols": ["http", "grpc"], "businessImpact": "medium",
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    if args.writers == 0 || args.bulk == 0 || args.zones == 0 {
        bail!("--writers, --bulk and --zones must be at least 1");
    }
    let client = reqwest::Client::new();
    for z in 0..args.zones {
        let r = client
            .post(format!("{}/zones", args.api))
            .json(&json!({"zoneName": format!("zone-{z:02}"), "serverAddress": format!("cp-{z}.mesh:50000")}))
            .send()
            .await
            .context("POST /zones")?;
        // An existing zone (409) is fine: runs may share an aggregator.
        if !(r.status().is_success() || r.status() == reqwest::StatusCode::CONFLICT) {
            bail!("POST /zones answered {}", r.status());
        }
    }
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.writers {
        let (args, next) = (args.clone(), next.clone());
        // One client per writer: its own connection, as separate callers would have.
        let client = reqwest::Client::new();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let first = next.fetch_add(args.bulk, Ordering::Relaxed);
                if first >= args.clusters {
                    break;
                }
                let last = (first + args.bulk).min(args.clusters);
                let body = if args.bulk == 1 {
                    record(&args.prefix, first, args.zones)
                } else {
                    Value::Array(
                        (first..last)
                            .map(|i| record(&args.prefix, i, args.zones))
                            .collect(),
                    )
                };
                let t = Instant::now();
                let r = client
                    .post(format!("{}/clusters", args.api))
                    .json(&body)
                    .send()
                    .await?;
                if r.status() != reqwest::StatusCode::CREATED {
                    bail!("POST /clusters answered {}", r.status());
                }
                latencies.push(t.elapsed());
            }
            Ok::<_, anyhow::Error>(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    println!(
        "{} clusters in {:.2} s by {} writers ({} per request): {:.0} durable writes/s; request latency p50 {:.2} ms, p99 {:.2} ms",
        args.clusters,
        elapsed,
        args.writers,
        args.bulk,
        args.clusters as f64 / elapsed,
        pct(0.5),
        pct(0.99)
    );
    Ok(())
}
