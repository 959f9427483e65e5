//! Replica write benchmark: concurrent writers register clusters through
//! `POST /clusters` on one replica (`--write`) and, after each acknowledgement, wait
//! until another replica (`--read`) shows the record. Reports acknowledged writes per
//! second and, per write, the acknowledgement latency and the write-to-visible
//! latency on the other replica (from sending the write until the other replica
//! answers it with 200), p50 and p99. Run it against any store: with `--read` equal
//! to `--write` it measures one replica.

// A command-line benchmark: its report goes to stdout.
#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::json;

#[derive(Debug, Parser)]
struct Args {
    /// The API of the replica written to, e.g. http://127.0.0.1:9080.
    #[arg(long)]
    write: String,
    /// The API of the replica read from.
    #[arg(long)]
    read: String,
    /// Concurrent writers.
    #[arg(long, default_value_t = 16)]
    writers: usize,
    /// Clusters to register.
    #[arg(long, default_value_t = 2000)]
    clusters: usize,
    /// Prefix of the cluster names, so that runs against one catalog do not collide.
    #[arg(long, default_value = "r")]
    prefix: String,
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1)))
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    if args.writers == 0 {
        bail!("--writers must be at least 1");
    }
    let client = reqwest::Client::new();
    let r = client
        .post(format!("{}/zones", args.write))
        .json(&json!({"zoneName": "bench", "serverAddress": "cp.mesh:50000"}))
        .send()
        .await
        .context("POST /zones")?;
    if !(r.status().is_success() || r.status() == reqwest::StatusCode::CONFLICT) {
        bail!("POST /zones answered {}", r.status());
    }
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.writers {
        let (args, next) = (args.clone(), next.clone());
        let (writer, reader) = (reqwest::Client::new(), reqwest::Client::new());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= args.clusters {
                    break;
                }
                let name = format!("{}-{i:06}", args.prefix);
                let body = json!({"zoneName": "bench", "clusterName": name, "name": name, "owner": "bench"});
                let t = Instant::now();
                let r = writer
                    .post(format!("{}/clusters", args.write))
                    .json(&body)
                    .send()
                    .await?;
                if r.status() != reqwest::StatusCode::CREATED {
                    bail!("POST /clusters answered {}", r.status());
                }
                let acked = t.elapsed();
                let url = format!("{}/clusters/{name}?zoneName=bench", args.read);
                loop {
                    if reader.get(&url).send().await?.status() == reqwest::StatusCode::OK {
                        break;
                    }
                    if t.elapsed() > Duration::from_secs(10) {
                        bail!("{name} not visible on {} after 10 s", args.read);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                out.push((acked, t.elapsed()));
            }
            Ok::<_, anyhow::Error>(out)
        }));
    }
    let mut acked = Vec::new();
    let mut visible = Vec::new();
    for t in tasks {
        for (a, v) in t.await?? {
            acked.push(a);
            visible.push(v);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    acked.sort_unstable();
    visible.sort_unstable();
    println!(
        "{} clusters by {} writers in {:.2} s: {:.0} acknowledged writes/s; ack p50 {:.2} ms p99 {:.2} ms; visible on {} p50 {:.2} ms p99 {:.2} ms",
        args.clusters,
        args.writers,
        elapsed,
        args.clusters as f64 / elapsed,
        pct(&acked, 0.5),
        pct(&acked, 0.99),
        args.read,
        pct(&visible, 0.5),
        pct(&visible, 0.99),
    );
    Ok(())
}
