//! Simulated agents: real quinn clients with the dev agent certificate, each sending
//! a report of real-shaped instances every interval, and the instances they report.
//! Shared by the ingest benchmark (`meshcat-bench-agents`) and the graph benchmark
//! (`meshcat-bench-graph`). Also the mesh a control server declares for sidecars
//! that take their configuration over xDS ([`mesh_spec`], [`xds_sidecar`]): one
//! definition of every cluster's hosts for both sides.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use meshcat_common::model::InstanceMetrics;
use meshcat_common::transport::{read_frame, write_frame};
use meshcat_common::wire::{
    AgentMessage, DEFAULT_MAX_MESSAGE, Hello, InstanceReport, ListenerRoutes, Report,
    ReportedCluster, ServerMessage, UpstreamTraffic, XdsState,
};
use meshcat_control_server::{ClusterSpec, EndpointSpec, MeshSpec};
use rand::Rng;

/// Shared counters of all simulated agents.
#[derive(Debug, Default)]
pub struct Stats {
    pub connected: AtomicU64,
    pub connect_failures: AtomicU64,
    pub accepted: AtomicU64,
    pub rejected: AtomicU64,
    /// Instances the aggregator refused alone, within accepted reports.
    pub refused_instances: AtomicU64,
    pub errors: AtomicU64,
    /// Acknowledgement latencies in microseconds, while measuring.
    pub latencies: Mutex<Vec<u32>>,
    pub measuring: AtomicBool,
    /// Encoded bytes and count of instances sent whole, and as deltas, while
    /// measuring; and the largest whole instance (a reconnect's cost).
    pub whole_bytes: AtomicU64,
    pub whole_sent: AtomicU64,
    pub delta_bytes: AtomicU64,
    pub delta_sent: AtomicU64,
    pub largest_whole: AtomicU64,
    pub largest_delta: AtomicU64,
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
    /// Whether steady reports are deltas against the acknowledged one, as the
    /// agent sends them (false: every report whole).
    pub deltas: bool,
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
        // The seq of each instance's acknowledged report; 0 before the first.
        let mut acked = vec![0u64; self.instances.len()];
        for sent in 0u64.. {
            tokio::select! {
                _ = ticker.tick() => {}
                () = stop.notified() => return,
            }
            let started = Instant::now();
            let report = self.report(sent, &acked);
            if stats.measuring.load(Ordering::Relaxed) {
                for r in &report {
                    let bytes = meshcat_common::wire::encoded_len(r) as u64;
                    let (total, count, largest) = if r.delta.is_some() {
                        (&stats.delta_bytes, &stats.delta_sent, &stats.largest_delta)
                    } else {
                        (&stats.whole_bytes, &stats.whole_sent, &stats.largest_whole)
                    };
                    total.fetch_add(bytes, Ordering::Relaxed);
                    count.fetch_add(1, Ordering::Relaxed);
                    largest.fetch_max(bytes, Ordering::Relaxed);
                }
            }
            let seqs: Vec<u64> = report.iter().map(|r| r.seq).collect();
            match send_report(&conn, report).await {
                Ok(Some(refused)) => {
                    stats
                        .refused_instances
                        .fetch_add(refused.len() as u64, Ordering::Relaxed);
                    for (i, seq) in seqs.into_iter().enumerate() {
                        let name = &self.instances[i].instance;
                        acked[i] = if refused.iter().any(|r| &r.instance == name) {
                            0
                        } else {
                            seq
                        };
                    }
                    stats.accepted.fetch_add(1, Ordering::Relaxed);
                    if stats.measuring.load(Ordering::Relaxed) {
                        let us = started.elapsed().as_micros().min(u32::MAX as u128) as u32;
                        stats.latencies.lock().expect("latencies").push(us);
                    }
                }
                Ok(None) => {
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
    fn report(&self, sent: u64, acked: &[u64]) -> Vec<InstanceReport> {
        let traffic = self.traffic.load(Ordering::Relaxed);
        self.instances
            .iter()
            .zip(acked)
            .map(|(i, &base)| {
                // Every instance's seq is the report number: unique and growing.
                let seq = sent + 1;
                if self.deltas && base > 0 {
                    // Nothing of the sidecar's configuration moves: only the
                    // upstreams' figures, which move with every report.
                    let mut d = InstanceReport {
                        seq,
                        upstreams: i.upstreams.clone(),
                        delta: Some(meshcat_common::wire::Delta {
                            base,
                            listeners_unchanged: true,
                            ..Default::default()
                        }),
                        ..InstanceReport::unread(
                            i.zone_name.clone(),
                            i.cluster_name.clone(),
                            i.instance.clone(),
                        )
                    };
                    d.admin_address.clone_from(&i.admin_address);
                    d.reachable = i.reachable;
                    d.start_time_ms = i.start_time_ms;
                    d.server_state.clone_from(&i.server_state);
                    d.envoy_version.clone_from(&i.envoy_version);
                    d.log_level.clone_from(&i.log_level);
                    d.requests_total = i.requests_total;
                    d.errors_5xx_total = i.errors_5xx_total;
                    d.metrics = i.metrics.clone();
                    d.local_cluster.clone_from(&i.local_cluster);
                    d.xds.clone_from(&i.xds);
                    if traffic {
                        for u in &mut d.upstreams {
                            u.requests_total += sent * REQUESTS_PER_REPORT;
                            u.errors_5xx_total += sent * ERRORS_PER_REPORT;
                        }
                    } else {
                        d.upstreams.clear();
                    }
                    return d;
                }
                let mut i = i.clone();
                i.seq = seq;
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

/// Sends one report; the instances refused (an empty list when all applied), or
/// `None` when the whole report was refused.
async fn send_report(
    conn: &quinn::Connection,
    instances: Vec<InstanceReport>,
) -> anyhow::Result<Option<Vec<meshcat_common::wire::RefusedInstance>>> {
    let (mut send, mut recv) = conn.open_bi().await?;
    let report = AgentMessage::Report(Report {
        sent_at_ms: 0,
        instances,
    });
    write_frame(&mut send, &report, DEFAULT_MAX_MESSAGE).await?;
    send.finish()?;
    match read_frame::<ServerMessage>(&mut recv, DEFAULT_MAX_MESSAGE).await? {
        Some(ServerMessage::ReportAccepted { refused, .. }) => Ok(Some(refused)),
        Some(ServerMessage::Rejected { .. }) => Ok(None),
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
        .map(|(c, name)| {
            let hosts = (0..2)
                .map(|h| {
                    if c == 0 {
                        "127.0.0.1:8080".to_owned()
                    } else {
                        format!("10.{}.{}.{}:15006", c % 250, agent % 250, h + 1)
                    }
                })
                .collect();
            ReportedCluster {
                added_via_api: c > 0,
                ..ReportedCluster::healthy(name.clone(), hosts)
            }
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
        // Reached at the pod's address, where its listeners are.
        admin_address: format!("{pod}:15000"),
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

/// A sidecar of a mesh without configuration scoping: instance `i` of
/// `instance(...)` that knows `clusters` upstream clusters in all, the added ones
/// idle with 5 hosts each, the same names in every such sidecar (as every sidecar of an Istio mesh
/// has every cluster of the mesh).
pub fn large(mut i: InstanceReport, clusters: usize) -> InstanceReport {
    let more = clusters.saturating_sub(i.clusters.len());
    i.clusters.extend((0..more).map(|c| {
        ReportedCluster::healthy(
            format!("outbound|8080||service-{c}.mesh.svc.cluster.local"),
            (0..5)
                .map(|h| {
                    format!(
                        "10.{}.{}.{}:8080",
                        100 + c / 65_536,
                        c / 256 % 256,
                        c % 256 + h
                    )
                })
                .collect(),
        )
    }));
    i
}

/// The port of every endpoint of [`mesh_spec`].
const MESH_PORT: u16 = 8080;

/// The name of cluster `c` of [`mesh_spec`]: `service-<c>`, the names the simulated
/// agents give their services and upstreams.
pub fn mesh_cluster_name(c: usize) -> String {
    format!("service-{c}")
}

/// The number of a [`mesh_cluster_name`].
pub fn mesh_cluster_index(name: &str) -> Option<usize> {
    name.strip_prefix("service-")?.parse().ok()
}

/// Endpoint `h` of mesh cluster `c` of clusters of `per` endpoints: an IP address
/// no other endpoint has (up to 2^24 endpoints in all).
fn mesh_ip(c: usize, h: usize, per: usize) -> String {
    let n = c * per + h;
    format!("10.{}.{}.{}", n >> 16 & 255, n >> 8 & 255, n & 255)
}

/// The endpoints (`ip:port`) of mesh cluster `c` with `per` endpoints a cluster,
/// as a sidecar in sync with [`mesh_spec`] holds them.
pub fn mesh_hosts(c: usize, per: usize) -> Vec<String> {
    (0..per)
        .map(|h| format!("{}:{MESH_PORT}", mesh_ip(c, h, per)))
        .collect()
}

/// The mesh a control server declares: `clusters` EDS clusters ([`mesh_cluster_name`])
/// of `per` healthy endpoints each ([`mesh_hosts`]), no listeners. The JSON of it is
/// `meshcat-control-server --mesh`'s file.
pub fn mesh_spec(clusters: usize, per: usize) -> MeshSpec {
    MeshSpec {
        clusters: (0..clusters)
            .map(|c| {
                ClusterSpec::new(
                    &mesh_cluster_name(c),
                    (0..per)
                        .map(|h| EndpointSpec::new(&mesh_ip(c, h, per), MESH_PORT))
                        .collect(),
                )
            })
            .collect(),
        listeners: Vec::new(),
    }
}

/// `i` as a sidecar connected to its control server over xDS and in sync with
/// [`mesh_spec`] (`per` endpoints a cluster): its agent reports the xDS state
/// (connected, nothing rejected), and each upstream cluster named as a mesh cluster
/// holds that cluster's hosts, the same in every sidecar.
pub fn xds_sidecar(mut i: InstanceReport, per: usize) -> InstanceReport {
    for c in &mut i.clusters {
        if let Some(n) = mesh_cluster_index(&c.name) {
            *c = ReportedCluster {
                added_via_api: c.added_via_api,
                ..ReportedCluster::healthy(c.name.clone(), mesh_hosts(n, per))
            };
        }
    }
    i.xds = Some(XdsState {
        connected: Some(true),
        rejected: Vec::new(),
    });
    i
}
