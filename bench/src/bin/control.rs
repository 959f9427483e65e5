//! Benchmark of the zone's control server against a running aggregator:
//!
//! - `connect`: registers a zone whose `serverAddress` is a running control server
//!   and polls `GET /zones/{z}/control` until the whole view is in the catalog (the
//!   time from the registration), then reads the aggregator's resident memory once it
//!   settles, against the same before the registration: bytes per endpoint held.
//! - `change`: adds one endpoint to one cluster of the control server's mesh file,
//!   has the control server re-read it at once (SIGHUP), and polls the cluster's
//!   `controlPlane.endpoints` until it shows the new count, `--times` times; the
//!   control server's log line of each reload splits the time in two.
//! - `wait-view`: waits until a registered zone's whole view is in the catalog.
//! - `sync`: counts the zone's sidecars per sync state (`GET /sync`).

// The figures on standard output are this program's whole purpose.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use meshcat_bench::process::{clock_ticks, cpu_ticks, memory_kib};
use meshcat_control_server::{EndpointSpec, MeshSpec};
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(about = "The zone's control server against a running aggregator.")]
struct Args {
    /// The aggregator's API, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    api: String,
    /// The zone.
    #[arg(long, default_value = "zone-0")]
    zone: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Register the zone and time its whole view into the catalog; memory per endpoint.
    Connect {
        /// The control server's ADS address (the zone's serverAddress).
        #[arg(long)]
        server: String,
        /// The aggregator's process (memory from /proc).
        #[arg(long)]
        pid: u32,
        /// Clusters the control server declares.
        #[arg(long)]
        clusters: u64,
        /// Endpoints it declares over all clusters.
        #[arg(long)]
        endpoints: u64,
        /// Time between two reads of the zone's control state.
        #[arg(long, default_value = "10ms", value_parser = meshcat_common::config::parse_positive_duration)]
        poll: Duration,
        /// Longest wait for the whole view.
        #[arg(long, default_value = "120s", value_parser = meshcat_common::config::parse_positive_duration)]
        timeout: Duration,
    },
    /// Change one cluster's endpoints in the mesh file `--times` times.
    Change {
        /// The control server's mesh file.
        #[arg(long)]
        mesh: PathBuf,
        /// The control server's process (sent SIGHUP to re-read the file).
        #[arg(long)]
        control_pid: u32,
        /// The control server's log (its `mesh reloaded` lines).
        #[arg(long)]
        control_log: PathBuf,
        /// The cluster changed (registered in the zone first when absent).
        #[arg(long)]
        cluster: String,
        /// Changes, one endpoint added each time.
        #[arg(long, default_value_t = 20)]
        times: usize,
        /// Time between two reads of the cluster.
        #[arg(long, default_value = "5ms", value_parser = meshcat_common::config::parse_positive_duration)]
        poll: Duration,
        /// Pause after each change is seen, before the next.
        #[arg(long, default_value = "500ms", value_parser = meshcat_common::config::parse_positive_duration)]
        pause: Duration,
        /// Longest wait for one change.
        #[arg(long, default_value = "30s", value_parser = meshcat_common::config::parse_positive_duration)]
        timeout: Duration,
    },
    /// Wait until the zone's whole view is in the catalog (a zone registered before).
    WaitView {
        /// Clusters the control server declares.
        #[arg(long)]
        clusters: u64,
        /// Endpoints it declares over all clusters.
        #[arg(long)]
        endpoints: u64,
    },
    /// Count the zone's sidecars per sync state.
    Sync {
        /// Wait this long first.
        #[arg(long, default_value = "0s", value_parser = meshcat_common::config::parse_duration)]
        after: Duration,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = reqwest::Client::new();
    match &args.command {
        Command::Connect {
            server,
            pid,
            clusters,
            endpoints,
            poll,
            timeout,
        } => {
            let view = View {
                server,
                pid: *pid,
                clusters: *clusters,
                endpoints: *endpoints,
                poll: *poll,
                timeout: *timeout,
            };
            connect(&client, &args, &view).await
        }
        Command::Change {
            mesh,
            control_pid,
            control_log,
            cluster,
            times,
            poll,
            pause,
            timeout,
        } => {
            let change = Change {
                mesh,
                control_pid: *control_pid,
                control_log,
                cluster,
                times: *times,
                poll: *poll,
                pause: *pause,
                timeout: *timeout,
            };
            changes(&client, &args, &change).await
        }
        Command::WaitView {
            clusters,
            endpoints,
        } => {
            let url = format!("{}/zones/{}/control", args.api, args.zone);
            let started = Instant::now();
            loop {
                let c = get(&client, &url).await?;
                if c["state"] == "connected"
                    && c["clusters"].as_u64() == Some(*clusters)
                    && c["endpoints"].as_u64() == Some(*endpoints)
                {
                    println!(
                        "whole view of {} after {:.0} ms",
                        args.zone,
                        started.elapsed().as_secs_f64() * 1000.0
                    );
                    return Ok(());
                }
                if started.elapsed() > Duration::from_secs(120) {
                    bail!("no whole view after 120 s: {c}");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Command::Sync { after } => {
            tokio::time::sleep(*after).await;
            sync(&client, &args).await
        }
    }
}

struct View<'a> {
    server: &'a str,
    pid: u32,
    clusters: u64,
    endpoints: u64,
    poll: Duration,
    timeout: Duration,
}

async fn get(client: &reqwest::Client, url: &str) -> anyhow::Result<Value> {
    let r = client
        .get(url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    let status = r.status();
    let body: Value = r.json().await.with_context(|| format!("GET {url}"))?;
    if !status.is_success() {
        bail!("GET {url} answered {status}: {body}");
    }
    Ok(body)
}

async fn connect(client: &reqwest::Client, args: &Args, v: &View<'_>) -> anyhow::Result<()> {
    let before = settled_rss(v.pid).await?;
    println!(
        "aggregator resident before the zone: {:.1} MiB",
        before as f64 / 1024.0
    );
    let cpu_before = cpu_ticks(v.pid)?;
    let started = Instant::now();
    let r = client
        .post(format!("{}/zones", args.api))
        .json(&json!({"zoneName": args.zone, "serverAddress": v.server}))
        .send()
        .await
        .context("POST /zones")?;
    if r.status() != reqwest::StatusCode::CREATED {
        bail!("POST /zones answered {}: {}", r.status(), r.text().await?);
    }
    let url = format!("{}/zones/{}/control", args.api, args.zone);
    let (mut connected, mut all_clusters) = (None, None);
    let mut polls = 0u64;
    let whole = loop {
        let c = get(client, &url).await?;
        polls += 1;
        let at = started.elapsed();
        if connected.is_none() && c["state"] == "connected" {
            connected = Some(at);
        }
        if all_clusters.is_none() && c["clusters"].as_u64() == Some(v.clusters) {
            all_clusters = Some(at);
        }
        if c["state"] == "connected"
            && c["clusters"].as_u64() == Some(v.clusters)
            && c["endpoints"].as_u64() == Some(v.endpoints)
        {
            break at;
        }
        if at > v.timeout {
            bail!("no whole view after {:?}: {c}", v.timeout);
        }
        tokio::time::sleep(v.poll).await;
    };
    let cpu = (cpu_ticks(v.pid)? - cpu_before) as f64 / clock_ticks();
    let ms = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0);
    println!(
        "view: state connected at {:.0} ms, {} clusters at {:.0} ms, {} endpoints at {:.0} ms ({polls} polls every {:?}); aggregator CPU meanwhile {cpu:.2} s",
        ms(connected),
        v.clusters,
        ms(all_clusters),
        v.endpoints,
        ms(Some(whole)),
        v.poll
    );
    let after = settled_rss(v.pid).await?;
    let (_, hwm) = memory_kib(v.pid)?;
    let per = (after as f64 - before as f64) * 1024.0 / v.endpoints as f64;
    println!(
        "aggregator resident with the view: {:.1} MiB (+{:.1} MiB; peak {:.1} MiB)",
        after as f64 / 1024.0,
        (after as f64 - before as f64) / 1024.0,
        hwm as f64 / 1024.0
    );
    println!("figure view_ms {:.0}", whole.as_secs_f64() * 1000.0);
    println!("figure bytes_per_endpoint {per:.0}");
    println!("figure rss_before_mib {:.1}", before as f64 / 1024.0);
    println!("figure rss_after_mib {:.1}", after as f64 / 1024.0);
    Ok(())
}

/// VmRSS (KiB) of `pid` once it moved by less than 1 MiB over the last 2 s (at most
/// 60 s).
async fn settled_rss(pid: u32) -> anyhow::Result<u64> {
    const SAMPLES: usize = 8;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last: Vec<u64> = Vec::new();
    loop {
        last.push(memory_kib(pid)?.0);
        if last.len() > SAMPLES {
            last.remove(0);
        }
        let (lo, hi) = (
            last.iter().min().copied().unwrap_or(0),
            last.iter().max().copied().unwrap_or(0),
        );
        if (last.len() == SAMPLES && hi - lo < 1024) || Instant::now() > deadline {
            return Ok(last[last.len() - 1]);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

struct Change<'a> {
    mesh: &'a PathBuf,
    control_pid: u32,
    control_log: &'a PathBuf,
    cluster: &'a str,
    times: usize,
    poll: Duration,
    pause: Duration,
    timeout: Duration,
}

/// The cluster's `controlPlane.endpoints` in the zone, `None` when not mapped yet.
async fn control_endpoints(
    client: &reqwest::Client,
    args: &Args,
    cluster: &str,
) -> anyhow::Result<Option<u64>> {
    let url = format!("{}/clusters/{cluster}?zoneName={}", args.api, args.zone);
    let c = get(client, &url).await?;
    let cp = &c[0]["controlPlane"];
    Ok((cp["declared"] == true)
        .then(|| cp["endpoints"].as_u64())
        .flatten())
}

async fn changes(client: &reqwest::Client, args: &Args, c: &Change<'_>) -> anyhow::Result<()> {
    let mut mesh: MeshSpec = serde_json::from_slice(
        &std::fs::read(c.mesh).with_context(|| format!("cannot read {}", c.mesh.display()))?,
    )?;
    let index = mesh
        .clusters
        .iter()
        .position(|x| x.name == c.cluster)
        .with_context(|| format!("{} is not in the mesh", c.cluster))?;
    let r = client
        .post(format!("{}/clusters", args.api))
        .json(&json!({"clusterName": c.cluster, "zoneName": args.zone, "name": c.cluster}))
        .send()
        .await
        .context("POST /clusters")?;
    if !(r.status().is_success() || r.status() == reqwest::StatusCode::CONFLICT) {
        bail!(
            "POST /clusters answered {}: {}",
            r.status(),
            r.text().await?
        );
    }
    let mut expected = mesh.clusters[index].endpoints.len() as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while control_endpoints(client, args, c.cluster).await? != Some(expected) {
        if Instant::now() > deadline {
            bail!(
                "{} is not mapped to the control server's cluster",
                c.cluster
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let tmp = c.mesh.with_extension("next");
    let (mut total, mut reload, mut after_reload) = (Vec::new(), Vec::new(), Vec::new());
    for k in 0..c.times {
        mesh.clusters[index].endpoints.push(EndpointSpec::new(
            &format!("10.255.{}.{}", k / 250, k % 250 + 1),
            8080,
        ));
        expected += 1;
        std::fs::write(&tmp, serde_json::to_vec(&mesh)?)?;
        let log_len = std::fs::metadata(c.control_log)?.len();
        std::fs::rename(&tmp, c.mesh)?;
        let wall = SystemTime::now();
        let started = Instant::now();
        let status = std::process::Command::new("kill")
            .args(["-HUP", &c.control_pid.to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -HUP {} failed", c.control_pid);
        }
        let seen = loop {
            if control_endpoints(client, args, c.cluster).await? == Some(expected) {
                break started.elapsed();
            }
            if started.elapsed() > c.timeout {
                bail!("change {k} not seen after {:?}", c.timeout);
            }
            tokio::time::sleep(c.poll).await;
        };
        let ms = seen.as_secs_f64() * 1000.0;
        total.push(ms);
        match reloaded_at(c.control_log, log_len)? {
            Some(at) => {
                let at_ms = at
                    .duration_since(UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
                let wall_ms = wall
                    .duration_since(UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
                reload.push(at_ms - wall_ms);
                after_reload.push(ms - (at_ms - wall_ms));
            }
            None => println!("change {k}: no reload line in the control server's log"),
        }
        tokio::time::sleep(c.pause).await;
    }
    let summary = |name: &str, v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        println!(
            "{name}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} changes)",
            quantile(v, 0.5),
            quantile(v, 0.99),
            quantile(v, 1.0),
            v.len()
        );
    };
    summary(
        "file written + SIGHUP -> cluster's controlPlane.endpoints",
        &mut total,
    );
    summary(
        "file written + SIGHUP -> control server's 'mesh reloaded' log line",
        &mut reload,
    );
    summary(
        "'mesh reloaded' log line -> cluster's controlPlane.endpoints",
        &mut after_reload,
    );
    println!(
        "figure change_p50_ms {:.1}\nfigure change_p99_ms {:.1}\nfigure reload_p50_ms {:.1}\nfigure reload_p99_ms {:.1}\nfigure after_reload_p50_ms {:.1}\nfigure after_reload_p99_ms {:.1}",
        quantile(&total, 0.5),
        quantile(&total, 0.99),
        quantile(&reload, 0.5),
        quantile(&reload, 0.99),
        quantile(&after_reload, 0.5),
        quantile(&after_reload, 0.99),
    );
    Ok(())
}

/// The nearest-rank quantile `q` of sorted `v`; NaN when empty.
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// The time of the first `mesh reloaded` line of the control server's log after
/// byte `from`.
fn reloaded_at(log: &PathBuf, from: u64) -> anyhow::Result<Option<SystemTime>> {
    let text = std::fs::read(log)?;
    let rest = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default());
    Ok(rest
        .lines()
        .find(|l| l.contains("mesh reloaded"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(parse_rfc3339))
}

/// `2025-01-02T03:04:05.123456Z` (UTC, as tracing writes its time stamps).
fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(str::parse::<i64>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(str::parse::<u64>);
    let (h, min, sec) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let micros: u64 = format!("{frac:0<6}").get(..6)?.parse().ok()?;
    // Days from 1970-01-01 to the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    Some(
        UNIX_EPOCH
            + Duration::from_secs(days * 86_400 + h * 3600 + min * 60 + sec)
            + Duration::from_micros(micros),
    )
}

async fn sync(client: &reqwest::Client, args: &Args) -> anyhow::Result<()> {
    let s = get(client, &format!("{}/sync?zoneName={}", args.api, args.zone)).await?;
    let mut counts = std::collections::BTreeMap::<String, u64>::new();
    for p in s["proxies"].as_array().context("proxies")? {
        *counts
            .entry(p["state"].as_str().unwrap_or("?").to_owned())
            .or_default() += 1;
    }
    let text: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!(
        "sync states in {}: {}; load average {}",
        args.zone,
        text.join(", "),
        load.join(" ")
    );
    println!("figure sync_states {}", text.join(", "));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_stamps_parse() {
        let t = parse_rfc3339("2024-03-01T12:34:56.789012Z").unwrap();
        let d = t.duration_since(UNIX_EPOCH).unwrap();
        assert_eq!(d.as_secs(), 1_709_296_496);
        assert_eq!(d.subsec_micros(), 789_012);
        assert!(parse_rfc3339("not a time").is_none());
    }
}
