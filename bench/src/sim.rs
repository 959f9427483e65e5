//! Simulated agents: real quinn clients with the dev agent certificate, each sending
//! a report of real-shaped instances every interval, and the instances they report.
//! Shared by the ingest benchmark (`meshcat-bench-agents`) and the graph benchmark
//! (`meshcat-bench-graph`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use meshcat_common::model::InstanceMetrics;
use meshcat_common::transport::{read_frame, write_frame};
use meshcat_common::wire::{
    AgentMessage, DEFAULT_MAX_MESSAGE, Hello, InstanceReport, ListenerRoutes, Report,
    ServerMessage, UpstreamCluster, UpstreamHost, UpstreamTraffic,
};
use rand::Rng;

/// Shared counters of all simulated agents.
#[derive(Debug, Default)]
pub struct Stats {
    pub connected: AtomicU64,
    pub connect_failures: AtomicU64,
    pub accepted: AtomicU64,
    pub rejected: AtomicU64,
    pub errors: AtomicU64,
    /// Acknowledgement latencies in microseconds, while measuring.
    pub latencies: Mutex<Vec<u32>>,
    pub measuring: AtomicBool,
}

/// Requests each upstream cluster carries between two reports of an instance, and
/// of those, answered with a 5xx: the counters move on every report, as a busy
/// sidecar's do.
const REQUESTS_PER_REPORT: u64 = 250;
const ERRORS_PER_REPORT: u64 = 2;

/// One simulated agent.
#[derive(Debug)]
pub struct SimAgent {
    pub id: String,
    /// Its instances, with their upstreams' counters at the first report.
    pub instances: Vec<InstanceReport>,
    pub interval: Duration,
    /// Whether the reports carry the upstreams' traffic (when false they are sent
    /// without it, as an agent older than the graph would send them).
    pub traffic: Arc<AtomicBool>,
}

impl SimAgent {
    pub async fn run(
        self,
        endpoint: quinn::Endpoint,
        addr: SocketAddr,
        stats: Arc<Stats>,
        stop: Arc<tokio::sync::Notify>,
    ) {
        // The control stream stays open for the connection's life.
        let (conn, _control) = match self.hello(&endpoint, addr).await {
            Ok(opened) => opened,
            Err(e) => {
                eprintln!("{}: {e:#}", self.id);
                stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        stats.connected.fetch_add(1, Ordering::Relaxed);
        // Spread the agents over the interval, as real ones started at random times.
        let offset = self.interval.mul_f64(rand::rng().random_range(0.0..1.0));
        tokio::time::sleep(offset).await;
        let mut ticker = tokio::time::interval(self.interval);
        for sent in 0u64.. {
            tokio::select! {
                _ = ticker.tick() => {}
                () = stop.notified() => return,
            }
            let started = Instant::now();
            match send_report(&conn, self.report(sent)).await {
                Ok(true) => {
                    stats.accepted.fetch_add(1, Ordering::Relaxed);
                    if stats.measuring.load(Ordering::Relaxed) {
                        let us = started.elapsed().as_micros().min(u32::MAX as u128) as u32;
                        stats.latencies.lock().expect("latencies").push(us);
                    }
                }
                Ok(false) => {
                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("{}: {e:#}", self.id);
                    if conn.close_reason().is_some() {
                        return;
                    }
                }
            }
        }
    }

    /// The instances of the agent's `sent`-th report: the upstreams' counters moved
    /// by one report's traffic each time.
    fn report(&self, sent: u64) -> Vec<InstanceReport> {
        let traffic = self.traffic.load(Ordering::Relaxed);
        self.instances
            .iter()
            .map(|i| {
                let mut i = i.clone();
                if traffic {
                    for u in &mut i.upstreams {
                        u.requests_total += sent * REQUESTS_PER_REPORT;
                        u.errors_5xx_total += sent * ERRORS_PER_REPORT;
                    }
                } else {
                    i.upstreams.clear();
                }
                i
            })
            .collect()
    }

    async fn hello(
        &self,
        endpoint: &quinn::Endpoint,
        addr: SocketAddr,
    ) -> anyhow::Result<(quinn::Connection, (quinn::SendStream, quinn::RecvStream))> {
        let conn = endpoint.connect(addr, "localhost")?.await?;
        let (mut send, mut recv) = conn.open_bi().await?;
        let hello = AgentMessage::Hello(Hello {
            agent_id: self.id.clone(),
            agent_version: "bench".into(),
            token: None,
        });
        write_frame(&mut send, &hello, DEFAULT_MAX_MESSAGE).await?;
        match read_frame::<ServerMessage>(&mut recv, DEFAULT_MAX_MESSAGE).await? {
            Some(ServerMessage::Welcome { .. }) => Ok((conn, (send, recv))),
            other => bail!("hello refused: {other:?}"),
        }
    }
}

async fn send_report(
    conn: &quinn::Connection,
    instances: Vec<InstanceReport>,
) -> anyhow::Result<bool> {
    let (mut send, mut recv) = conn.open_bi().await?;
    let report = AgentMessage::Report(Report {
        sent_at_ms: 0,
        instances,
    });
    write_frame(&mut send, &report, DEFAULT_MAX_MESSAGE).await?;
    send.finish()?;
    match read_frame::<ServerMessage>(&mut recv, DEFAULT_MAX_MESSAGE).await? {
        Some(ServerMessage::ReportAccepted { .. }) => Ok(true),
        Some(ServerMessage::Rejected { .. }) => Ok(false),
        other => bail!("unexpected answer: {other:?}"),
    }
}

/// A real-shaped instance `instance` of (zone, cluster), agent number `agent`:
/// filled metrics, the sidecar's local cluster, and one upstream cluster with two
/// hosts and traffic for each name in `upstreams`; an inbound listener routing to
/// the local cluster and an outbound one routing to the upstreams, at the pod's own
/// address.
pub fn instance(
    zone: String,
    cluster: String,
    instance: String,
    agent: usize,
    seq: usize,
    upstreams: &[String],
) -> InstanceReport {
    let requests = 10_000 + (agent * 37 + seq * 11) as i64;
    let metrics = InstanceMetrics {
        mesh_metrics_version: "1".into(),
        total_requests: requests,
        http_requests: requests,
        all_requests: requests,
        all_routes: "/".into(),
        latency_avg: 4.2,
        latency_count: requests,
        latency_max: 250,
        latency_min: 1,
        latency_sum: requests * 4,
        latency_p50: 3,
        latency_p90: 8,
        latency_p95: 12,
        latency_p99: 40,
        latency_p9990: 120,
        latency_p9999: 240,
        errors_count: requests / 100,
        in_throughput: requests * 900,
        out_throughput: requests * 4_000,
        num_goroutines: 2,
        start_time: 1_700_000_000_000,
        cpu_pct: 12.5,
        cpu_cores: 4,
        os: "linux".into(),
        os_arch: "x86_64".into(),
        memory_available: 8 << 30,
        memory_used: 4 << 30,
        process_memory_used: 48 << 20,
        memory_used_percent: 50.0,
        ..InstanceMetrics::default()
    };
    let pod = format!("10.{}.{}.{}", agent / 250 % 250, agent % 250, seq % 250 + 1);
    let local = "local_service".to_owned();
    let clusters = std::iter::once(&local)
        .chain(upstreams)
        .enumerate()
        .map(|(c, name)| UpstreamCluster {
            name: name.clone(),
            added_via_api: c > 0,
            hosts: (0..2)
                .map(|h| UpstreamHost {
                    address: if c == 0 {
                        "127.0.0.1:8080".into()
                    } else {
                        format!("10.{}.{}.{}:15006", c % 250, agent % 250, h + 1)
                    },
                    cx_active: 3,
                    cx_connect_fail: 0,
                    cx_total: 120,
                    rq_active: 1,
                    rq_error: 2,
                    rq_total: 4_000,
                    health_flags: "healthy".into(),
                })
                .collect(),
        })
        .collect();
    let traffic = upstreams
        .iter()
        .map(|name| UpstreamTraffic {
            name: name.clone(),
            requests_total: 40_000,
            errors_5xx_total: 120,
            connect_fail_total: 0,
            p50_ms: Some(3.5),
            p99_ms: Some(41.0),
            tls: true,
        })
        .collect();
    let listeners = if upstreams.is_empty() {
        Vec::new()
    } else {
        vec![
            ListenerRoutes {
                address: format!("{pod}:15001"),
                clusters: upstreams.to_vec(),
            },
            ListenerRoutes {
                address: format!("{pod}:15006"),
                clusters: vec![local.clone()],
            },
        ]
    };
    InstanceReport {
        admin_address: "127.0.0.1:9901".into(),
        reachable: true,
        start_time_ms: 1_700_000_000_000,
        server_state: "LIVE".into(),
        envoy_version: "1.40.0/Clean/RELEASE/BoringSSL".into(),
        log_level: Some("info".into()),
        requests_total: requests as u64,
        errors_5xx_total: (requests / 100) as u64,
        metrics,
        clusters,
        upstreams: traffic,
        listeners,
        local_cluster: (!upstreams.is_empty()).then_some(local),
        ..InstanceReport::unread(zone, cluster, instance)
    }
}
