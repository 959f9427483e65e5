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
//! - `sync-latency`: follows the zone's sidecars' sync states with blocking queries
//!   on `GET /sync` (`?index=N&wait=D`, answered as soon as the sync index moves) and
//!   records when each state change was first seen, until SIGTERM; then pairs each
//!   flip report of `meshcat-bench-agents --flip-instances` (its `--flip-log`) with
//!   the first answer showing the state it should cause: the time from an agent's
//!   report to `/sync`. An answer that comes back at once on a change adds one HTTP
//!   round trip to what it observes, which is part of the figure; plain reads of the
//!   same list, timed meanwhile, show that round trip.

// The figures on standard output are this program's whole purpose.
#![allow(clippy::print_stdout)]

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
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
    /// Follow the zone's sync states with blocking queries until SIGTERM, then time
    /// each flip report to the first answer of GET /sync showing its state.
    SyncLatency {
        /// The flip lines of meshcat-bench-agents --flip-log (`flip <instance>
        /// <state> <epoch_ms>`), read once the watch ends.
        #[arg(long)]
        flips: PathBuf,
        /// Follow every sidecar of the zone (`GET /sync?zoneName=`: each answer lists
        /// them all) instead of the stale ones only (`&state=stale`: a sidecar that
        /// leaves that list is counted `synced`, the only other state the flipping
        /// sidecars take).
        #[arg(long)]
        whole_zone: bool,
        /// Longest wait of one blocking query.
        #[arg(long, default_value = "5s", value_parser = meshcat_common::config::parse_positive_duration)]
        wait: Duration,
        /// Time between two plain reads of the same list, timed (the round trip a
        /// blocking query that answers at once adds).
        #[arg(long, default_value = "1s", value_parser = meshcat_common::config::parse_positive_duration)]
        probe: Duration,
        /// Longest watch, when no SIGTERM comes.
        #[arg(long, default_value = "30m", value_parser = meshcat_common::config::parse_positive_duration)]
        timeout: Duration,
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
        Command::SyncLatency {
            flips,
            whole_zone,
            wait,
            probe,
            timeout,
        } => {
            let watch = Watch {
                flips,
                whole_zone: *whole_zone,
                wait: *wait,
                probe: *probe,
                timeout: *timeout,
            };
            sync_latency(&client, &args, &watch).await
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

struct Watch<'a> {
    flips: &'a PathBuf,
    whole_zone: bool,
    wait: Duration,
    probe: Duration,
    timeout: Duration,
}

/// Milliseconds since the epoch, with the sub-millisecond part.
fn epoch_ms(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// The state changes seen, per instance, in the order seen: (state, when, ms since
/// the epoch).
type Seen = HashMap<String, Vec<(String, f64)>>;

async fn sync_latency(client: &reqwest::Client, args: &Args, w: &Watch<'_>) -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let list = if w.whole_zone {
        format!("{}/sync?zoneName={}", args.api, args.zone)
    } else {
        format!("{}/sync?zoneName={}&state=stale", args.api, args.zone)
    };
    // Plain reads of the same list, timed, beside the watch.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let round_trips = Arc::new(Mutex::new(Vec::new()));
    let prober = tokio::spawn(probe(
        client.clone(),
        list.clone(),
        w.probe,
        stopped,
        round_trips.clone(),
    ));

    let mut states: HashMap<String, String> = HashMap::new();
    let mut seen: Seen = HashMap::new();
    let (mut answers, mut changes, mut failures) = (0u64, 0u64, 0u64);
    let mut index: Option<u64> = None;
    let deadline = tokio::time::sleep(w.timeout);
    tokio::pin!(deadline);
    let started = Instant::now();
    loop {
        let url = match index {
            Some(i) => format!("{list}&index={i}&wait={}ms", w.wait.as_millis()),
            None => list.clone(),
        };
        let answer = tokio::select! {
            _ = term.recv() => break,
            () = &mut deadline => {
                println!("the watch ended after {:?} without SIGTERM", w.timeout);
                break;
            }
            a = get(client, &url) => a,
        };
        let at = epoch_ms(SystemTime::now());
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                failures += 1;
                eprintln!("{e:#}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        answers += 1;
        index = answer["index"].as_u64();
        let now: HashMap<String, String> = answer["proxies"]
            .as_array()
            .context("proxies")?
            .iter()
            .filter_map(|p| {
                Some((
                    p["instance"].as_str()?.to_owned(),
                    p["state"].as_str()?.to_owned(),
                ))
            })
            .collect();
        if !w.whole_zone {
            // Gone from the stale list: synced.
            for (instance, state) in &mut states {
                if state != "synced" && !now.contains_key(instance) {
                    "synced".clone_into(state);
                    seen.entry(instance.clone())
                        .or_default()
                        .push((state.clone(), at));
                    changes += 1;
                }
            }
        }
        for (instance, state) in now {
            if states.get(&instance) != Some(&state) {
                seen.entry(instance.clone())
                    .or_default()
                    .push((state.clone(), at));
                states.insert(instance, state);
                changes += 1;
            }
        }
    }
    let watched = started.elapsed();
    let _ = stop.send(true);
    prober.await?;

    let text = std::fs::read_to_string(w.flips)
        .with_context(|| format!("cannot read {}", w.flips.display()))?;
    let flips = parse_flips(&text);
    let paired = pair(&flips, &seen);
    println!(
        "watched {} for {:.1} s: {answers} answers, {changes} state changes seen, {failures} failed reads",
        list.strip_prefix(&args.api).unwrap_or(&list),
        watched.as_secs_f64()
    );
    let summary = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        format!(
            "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({})",
            quantile(v, 0.5),
            quantile(v, 0.99),
            quantile(v, 1.0),
            v.len()
        )
    };
    let mut all: Vec<f64> = paired.latencies.values().flatten().copied().collect();
    println!(
        "flip report sent -> GET /sync shows its state: {}; {} of {} flip reports not seen before the sidecar's next report",
        summary(&mut all),
        paired.missed,
        paired.flips
    );
    for (state, v) in &paired.latencies {
        let mut v = v.clone();
        println!("  to {state}: {}", summary(&mut v));
    }
    let mut rtt = std::mem::take(&mut *round_trips.lock().expect("round trips"));
    println!(
        "plain GET of the same list every {:?} meanwhile: {}",
        w.probe,
        summary(&mut rtt)
    );
    println!(
        "figure sync_report_p50_ms {:.1}\nfigure sync_report_p99_ms {:.1}\nfigure sync_report_max_ms {:.1}\nfigure sync_report_count {}\nfigure sync_report_missed {}\nfigure sync_rtt_p50_ms {:.1}\nfigure sync_rtt_p99_ms {:.1}",
        quantile(&all, 0.5),
        quantile(&all, 0.99),
        quantile(&all, 1.0),
        all.len(),
        paired.missed,
        quantile(&rtt, 0.5),
        quantile(&rtt, 0.99),
    );
    Ok(())
}

/// Times a plain read of `url` every `every` until `stop`, into `out` (ms).
async fn probe(
    client: reqwest::Client,
    url: String,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
    out: Arc<Mutex<Vec<f64>>>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        let started = Instant::now();
        if get(&client, &url).await.is_ok() {
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            out.lock().expect("round trips").push(ms);
        }
    }
}

/// One flip report of one instance.
#[derive(Debug, Clone, PartialEq)]
struct FlipLine {
    instance: String,
    state: String,
    at_ms: f64,
}

/// The `flip <instance> <state> <epoch_ms>` lines of `text`; others are skipped.
fn parse_flips(text: &str) -> Vec<FlipLine> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["flip", instance, state, at] => Some(FlipLine {
                    instance: (*instance).to_owned(),
                    state: (*state).to_owned(),
                    at_ms: at.parse().ok()?,
                }),
                _ => None,
            }
        })
        .collect()
}

#[derive(Debug, Default)]
struct Paired {
    /// The latencies (ms) per state caused.
    latencies: BTreeMap<String, Vec<f64>>,
    flips: usize,
    /// Flip reports whose state was not seen before the instance's next flip report
    /// (or the watch's end).
    missed: usize,
}

/// Pairs each flip report with the first change of its instance to its state seen
/// at or after its send time and before the instance's next flip report.
fn pair(flips: &[FlipLine], seen: &Seen) -> Paired {
    let mut by_instance: BTreeMap<&str, Vec<&FlipLine>> = BTreeMap::new();
    for f in flips {
        by_instance.entry(&f.instance).or_default().push(f);
    }
    let none = Vec::new();
    let mut out = Paired::default();
    for (instance, mut fl) in by_instance {
        fl.sort_by(|a, b| a.at_ms.total_cmp(&b.at_ms));
        let changes = seen.get(instance).unwrap_or(&none);
        for (j, f) in fl.iter().enumerate() {
            let next = fl.get(j + 1).map_or(f64::INFINITY, |n| n.at_ms);
            out.flips += 1;
            match changes
                .iter()
                .find(|(s, at)| *s == f.state && *at >= f.at_ms && *at < next)
            {
                Some((_, at)) => out
                    .latencies
                    .entry(f.state.clone())
                    .or_default()
                    .push(at - f.at_ms),
                None => out.missed += 1,
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flips_pair_with_the_first_change_to_their_state_before_the_next_flip() {
        let flips = parse_flips(
            "flipping sidecars\nflip pod-0-0 stale 1000.5\nflip pod-0-0 synced 6000\nflip pod-0-0 stale 11000\nflip pod-1-0 stale 2000\nflip pod-0-0 synced 16000\n",
        );
        assert_eq!(flips.len(), 5);
        let seen: Seen = HashMap::from([
            (
                "pod-0-0".to_owned(),
                vec![
                    ("synced".to_owned(), 500.0),
                    ("stale".to_owned(), 1010.5),
                    ("synced".to_owned(), 6020.0),
                    // The third flip's state seen only after the fourth was sent.
                    ("stale".to_owned(), 16_100.0),
                ],
            ),
            ("pod-1-0".to_owned(), vec![("stale".to_owned(), 2003.0)]),
        ]);
        let p = pair(&flips, &seen);
        assert_eq!(p.flips, 5);
        assert_eq!(p.missed, 2);
        assert_eq!(p.latencies["stale"], vec![10.0, 3.0]);
        assert_eq!(p.latencies["synced"], vec![20.0]);
    }

    #[test]
    fn time_stamps_parse() {
        let t = parse_rfc3339("2024-03-01T12:34:56.789012Z").unwrap();
        let d = t.duration_since(UNIX_EPOCH).unwrap();
        assert_eq!(d.as_secs(), 1_709_296_496);
        assert_eq!(d.subsec_micros(), 789_012);
        assert!(parse_rfc3339("not a time").is_none());
    }
}
