//! Simulated agents: real quinn clients with the dev agent certificate, each sending
//! a report of real-shaped instances every interval, and the instances they report.
//! Shared by the ingest benchmark (`meshcat-bench-agents`) and the graph benchmark
//! (`meshcat-bench-graph`). Also the mesh a control server declares for sidecars
//! that take their configuration over xDS ([`mesh_spec`], [`xds_sidecar`]): one
//! definition of every cluster's hosts for both sides, and sidecars whose host set
//! alternates between the mesh's and another one report by report ([`Flips`]), for
//! the time from a report to `GET /sync`.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

/// Sidecars whose host set of one upstream cluster alternates, report by report,
/// between the mesh's and one that lacks one of its endpoints: the first `instances`
/// instances of an agent run with [`SimAgent::run_with`]. Their first report
/// matches the mesh (`synced`), the second differs (`stale` once the aggregator's
/// `--sync-grace` is over), and so on; or the other way round with
/// `differing_first`, which spreads the stale ones over time when half the agents
/// take it (each agent's reports come at their own phase within the interval, and a
/// sidecar's states repeat every two reports). The flipped cluster is the first of the
/// instance's clusters named as a mesh cluster ([`mesh_cluster_name`]), so the
/// instances are [`xds_sidecar`]s. Each such report sent while the agents measure
/// writes one line per flipping instance,
/// `flip <instance> <synced|stale> <epoch_ms>`: the state the report should cause
/// and the wall clock just before the report is written to its QUIC stream, in ms
/// since the epoch with three decimals.
#[derive(Clone)]
pub struct Flips {
    /// Flipping instances of each agent run with these flips (its first ones).
    pub instances: usize,
    /// The first report differs from the mesh, the second matches, and so on.
    pub differing_first: bool,
    out: Arc<Mutex<Box<dyn Write + Send>>>,
}

impl std::fmt::Debug for Flips {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flips")
            .field("instances", &self.instances)
            .field("differing_first", &self.differing_first)
            .finish_non_exhaustive()
    }
}

impl Flips {
    /// The first `instances` instances flip, the first report matching; their lines
    /// go to `out`.
    pub fn new(instances: usize, out: Box<dyn Write + Send>) -> Flips {
        Flips {
            instances,
            differing_first: false,
            out: Arc::new(Mutex::new(out)),
        }
    }

    /// Writes the line of one flip report of `instance`, sent at `at`.
    fn note(&self, instance: &str, state: &str, at: SystemTime) {
        let ms = at
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        let line = format!("flip {instance} {state} {ms:.3}\n");
        let mut out = self.out.lock().expect("flip log");
        if let Err(e) = out.write_all(line.as_bytes()).and_then(|()| out.flush()) {
            eprintln!("cannot write a flip line: {e}");
        }
    }

    /// These flips, the first report differing when `yes`.
    pub fn with_differing_first(self, yes: bool) -> Flips {
        Flips {
            differing_first: yes,
            ..self
        }
    }

    /// Flushes what was written.
    pub fn flush(&self) -> std::io::Result<()> {
        self.out.lock().expect("flip log").flush()
    }
}

/// One flipping instance: where its flipped cluster is, and its two host sets.
#[derive(Debug)]
struct Flip {
    /// The cluster's position among the instance's clusters.
    at: usize,
    matching: ReportedCluster,
    differing: ReportedCluster,
}

impl Flip {
    /// The flip of `i`, when it has a cluster named as a mesh cluster.
    fn of(i: &InstanceReport) -> Option<Flip> {
        let at = i
            .clusters
            .iter()
            .position(|c| mesh_cluster_index(&c.name).is_some())?;
        let matching = i.clusters[at].clone();
        // One endpoint of the mesh's missing (one unknown to it when it has none).
        let hosts = match matching.hosts.split_last() {
            Some((_, rest)) => rest.to_vec(),
            None => vec!["192.0.2.1:8080".to_owned()],
        };
        let differing = ReportedCluster {
            added_via_api: matching.added_via_api,
            ..ReportedCluster::healthy(matching.name.clone(), hosts)
        };
        Some(Flip {
            at,
            matching,
            differing,
        })
    }

    /// Puts the cluster's host set of the report of phase `phase` (the report's
    /// number from 0, plus one when the first differs: the odd ones differ) into `r`,
    /// whole or a delta. The state it should cause.
    fn apply(&self, r: &mut InstanceReport, phase: u64) -> &'static str {
        let (cluster, state) = if phase % 2 == 1 {
            (&self.differing, "stale")
        } else {
            (&self.matching, "synced")
        };
        if r.delta.is_some() {
            // Listed in every delta: its host set changed since the base (the report
            // before), or the base was refused and it is sent again.
            r.clusters.push(cluster.clone());
        } else if let Some(c) = r.clusters.get_mut(self.at) {
            c.clone_from(cluster);
        }
        state
    }
}

impl SimAgent {
    pub async fn run(
        self,
        endpoint: quinn::Endpoint,
        addr: SocketAddr,
        stats: Arc<Stats>,
        stop: Arc<tokio::sync::Notify>,
    ) {
        self.run_with(endpoint, addr, stats, stop, None).await;
    }

    /// [`Self::run`], the agent's first instances flipping as `flips` says.
    pub async fn run_with(
        self,
        endpoint: quinn::Endpoint,
        addr: SocketAddr,
        stats: Arc<Stats>,
        stop: Arc<tokio::sync::Notify>,
        flips: Option<Flips>,
    ) {
        let first = flips.as_ref().map_or(0, |f| u64::from(f.differing_first));
        let flipping: Vec<Flip> = flips.as_ref().map_or_else(Vec::new, |f| {
            self.instances
                .iter()
                .take(f.instances)
                .map_while(Flip::of)
                .collect()
        });
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
            let mut report = self.report(sent, &acked);
            let states: Vec<&str> = report
                .iter_mut()
                .zip(&flipping)
                .map(|(r, f)| f.apply(r, sent + first))
                .collect();
            let noted = stats.measuring.load(Ordering::Relaxed);
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
            let mut written = None;
            let answer = send_report(&conn, report, &mut written).await;
            if let (Some(flips), Some(at), true) = (&flips, written, noted) {
                for (i, state) in states.iter().enumerate() {
                    flips.note(&self.instances[i].instance, state, at);
                }
            }
            match answer {
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
                            u.errors_total += sent * ERRORS_PER_REPORT;
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
                        u.errors_total += sent * ERRORS_PER_REPORT;
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
/// `None` when the whole report was refused. `written` is set to the wall clock
/// just before the report is written to its stream.
async fn send_report(
    conn: &quinn::Connection,
    instances: Vec<InstanceReport>,
    written: &mut Option<SystemTime>,
) -> anyhow::Result<Option<Vec<meshcat_common::wire::RefusedInstance>>> {
    let (mut send, mut recv) = conn.open_bi().await?;
    let report = AgentMessage::Report(Report {
        sent_at_ms: 0,
        instances,
    });
    *written = Some(SystemTime::now());
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
            errors_total: 120,
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
