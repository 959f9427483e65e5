//! Scraping: one task per target (sidecar) that scrapes its admin API every interval
//! into the [`Board`], and the manager that follows the targets' source (flags, a
//! targets file, or the node's pods) as it changes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use meshcat_common::wire::InstanceReport;
use tokio::sync::{Semaphore, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::board::{Board, Lease};
use crate::drift::{self, ConfigHashes};
use crate::envoy::xds::XdsTracker;
use crate::envoy::{EnvoyAdmin, EnvoyError, Netns, seed_level};
use crate::identity::IdentityReader;
use crate::logtail::LogTail;
use crate::metrics_object::{self, HostSampler};
use crate::state::Agent;
use crate::target::{Target, TargetKey, read_targets_file};
use crate::topology::{self, ReadFailure, Topology, TopologyCache};

/// Two start times closer than this are the same Envoy process: uptime has only
/// second precision, so the derived start time jitters between scrapes.
const START_TIME_JITTER_MS: i64 = 2_000;

/// Where the targets come from.
#[derive(Debug, Clone)]
pub enum TargetSource {
    /// Fixed by flags.
    Fixed(Vec<Target>),
    /// A file polled every interval.
    File(PathBuf),
    /// A pod list polled every interval, turned into targets by [`crate::discovery`].
    Pods(PodSource),
}

/// The node's pods as the DaemonSet discovers them.
#[derive(Debug, Clone)]
pub struct PodSource {
    /// The pod list (`--pods-file`).
    pub file: PathBuf,
    /// The node's container logs (`--pod-log-dir`).
    pub log_dir: PathBuf,
    /// The node's process list (`--proc-dir`) when each pod's admin is reached on its
    /// loopback inside its namespace (`--pod-netns`); its namespaces are looked up
    /// again every interval, since pods start and restart without the pod list
    /// changing.
    pub proc_dir: Option<PathBuf>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Scrapes one sidecar once, without its xDS state (`xds: None`). `previous` is the
/// last report of this target, used to keep the start time steady and the last
/// figures when the sidecar is unreachable.
pub async fn scrape_once(
    admin: &EnvoyAdmin,
    target: &Target,
    host: &HostSampler,
    previous: Option<&InstanceReport>,
    topology: &mut TopologyCache,
) -> InstanceReport {
    scrape(admin, target, host, previous, topology, None, None).await
}

/// The xDS side of a scrape: what was read of the sidecar's xDS state so far, and
/// the tail of its log, which names the reasons of rejections.
#[derive(Debug)]
pub struct XdsScrape<'a> {
    pub tracker: &'a mut XdsTracker,
    pub log: Option<&'a LogTail>,
}

/// [`scrape_once`] that reads the sidecar's xDS state as well (docs/agent.md, "xDS
/// state"), following it in `xds` from one scrape to the next.
pub async fn scrape_with_xds(
    admin: &EnvoyAdmin,
    target: &Target,
    host: &HostSampler,
    previous: Option<&InstanceReport>,
    topology: &mut TopologyCache,
    xds: XdsScrape<'_>,
) -> InstanceReport {
    scrape(admin, target, host, previous, topology, Some(xds), None).await
}

/// The identity side of a scrape: what was read of the sidecar's certificates so
/// far, and how often to read them again.
#[derive(Debug)]
pub struct IdentityScrape<'a> {
    pub reader: &'a mut IdentityReader,
    /// `--certs-interval`.
    pub interval: Duration,
}

/// [`scrape_with_xds`] that reads the sidecar's certificates as well when they are
/// due (docs/agent.md, "Certificates"), following them in `identity`.
pub async fn scrape_following(
    admin: &EnvoyAdmin,
    target: &Target,
    host: &HostSampler,
    previous: Option<&InstanceReport>,
    topology: &mut TopologyCache,
    xds: XdsScrape<'_>,
    identity: IdentityScrape<'_>,
) -> InstanceReport {
    scrape(
        admin,
        target,
        host,
        previous,
        topology,
        Some(xds),
        Some(identity),
    )
    .await
}

async fn scrape(
    admin: &EnvoyAdmin,
    target: &Target,
    host: &HostSampler,
    previous: Option<&InstanceReport>,
    topology: &mut TopologyCache,
    xds: Option<XdsScrape<'_>>,
    identity: Option<IdentityScrape<'_>>,
) -> InstanceReport {
    match scrape_fallible(admin, target, host, previous, topology, xds, identity).await {
        Ok(report) => report,
        Err(e) => {
            let mut report = previous.cloned().unwrap_or_else(|| {
                InstanceReport::unread(String::new(), String::new(), String::new())
            });
            report.zone_name.clone_from(&target.zone_name);
            report.cluster_name.clone_from(&target.cluster_name);
            report.instance.clone_from(&target.instance);
            report.admin_address.clone_from(&target.admin);
            report.reachable = false;
            report.error = Some(e.to_string());
            report
        }
    }
}

async fn scrape_fallible(
    admin: &EnvoyAdmin,
    target: &Target,
    host: &HostSampler,
    previous: Option<&InstanceReport>,
    topology: &mut TopologyCache,
    xds: Option<XdsScrape<'_>>,
    identity: Option<IdentityScrape<'_>>,
) -> Result<InstanceReport, EnvoyError> {
    // `/clusters` first, alone: Envoy answers admin calls one at a time on its main
    // thread, and a sidecar that knows 20,000 clusters takes over a second to write
    // this one; behind `/stats` it could outlast its timeout (docs/agent.md).
    let clusters = admin.clusters().await?;
    let (info, stats, level) = tokio::join!(admin.server_info(), admin.stats(), admin.log_level());
    let (info, stats) = (info?, stats?);
    let uptime = info.uptime()?;
    let mut start_time_ms = now_ms() - uptime.as_millis() as i64;
    let (mut metrics, totals) = metrics_object::compute(&stats, start_time_ms, &host.sample());
    // Only a previous answer of the same process may lend its start time: a sidecar
    // that stopped answering, or whose counters went backwards, was restarted, maybe
    // within the jitter of its old start.
    let same_process = |p: &&InstanceReport| {
        p.start_time_ms > 0 && p.reachable && p.requests_total <= totals.requests
    };
    if let Some(prev) = previous.filter(same_process)
        && (prev.start_time_ms - start_time_ms).abs() < START_TIME_JITTER_MS
    {
        start_time_ms = prev.start_time_ms;
        metrics.start_time = start_time_ms;
    }
    let version = topology::config_version(&stats, start_time_ms);
    if topology.stale(version) {
        read_topology(admin, target, version, start_time_ms, topology).await;
    }
    let level = match level {
        Ok(l) => Some(seed_level(&l).to_owned()),
        Err(e) => {
            debug!(instance = %target.instance, error = %e, "Log level not read.");
            None
        }
    };
    let xds = match xds {
        Some(x) => read_xds(admin, target, start_time_ms, x).await,
        None => None,
    };
    let identity = match identity {
        Some(IdentityScrape { reader, interval }) => {
            reader
                .refresh(
                    admin,
                    target,
                    Instant::now(),
                    (version, start_time_ms),
                    interval,
                )
                .await;
            reader.report(&topology.topology().expectations)
        }
        None => None,
    };
    Ok(InstanceReport {
        zone_name: target.zone_name.clone(),
        cluster_name: target.cluster_name.clone(),
        instance: target.instance.clone(),
        admin_address: target.admin.clone(),
        reachable: true,
        error: None,
        start_time_ms,
        server_state: info.state.clone(),
        envoy_version: info.release().to_owned(),
        log_level: level,
        requests_total: totals.requests,
        errors_5xx_total: totals.errors_5xx,
        metrics,
        clusters,
        upstreams: topology::upstream_traffic(&stats, &topology.topology().tls_clusters),
        listeners: topology.topology().listeners.clone(),
        local_cluster: target.local_cluster.clone(),
        config_hash: topology.hashes().map(|h| h.config.clone()),
        config_hashes: topology
            .hashes()
            .map(|h| h.kinds.clone())
            .unwrap_or_default(),
        seq: 0,
        delta: None,
        xds,
        identity,
    })
}

/// Reads the sidecar's xDS state, after taking the lines its log gained since the
/// last scrape; `None` when `/stats` did not answer.
async fn read_xds(
    admin: &EnvoyAdmin,
    target: &Target,
    start_time_ms: i64,
    xds: XdsScrape<'_>,
) -> Option<meshcat_common::wire::XdsState> {
    let XdsScrape { tracker, log } = xds;
    if let Some(tail) = log {
        let rejections = tracker.log_mut();
        if tail.last_seq() < rejections.seen() {
            // Another tail (another file): read it from its start.
            rejections.restart();
        }
        tail.scan_since(rejections.seen(), |l| {
            rejections.line(l.seq, l.read_at_ms, &l.text);
        });
        rejections.pause();
    }
    match tracker.read(admin, start_time_ms, now_ms()).await {
        Ok(state) => Some(state),
        Err(e) => {
            debug!(instance = %target.instance, error = %e, "Sidecar xDS state not read.");
            None
        }
    }
}

/// Reads the sidecar's `/config_dump` into `cache` (its topology and drift hashes).
/// A failed read leaves the last ones in place unless the sidecar restarted since
/// ([`TopologyCache::failed`]); it is tried again at the next scrape, or, when the dump
/// itself is at fault (too large, not a config dump), once the configuration moves,
/// logged once at WARN.
async fn read_topology(
    admin: &EnvoyAdmin,
    target: &Target,
    version: u64,
    start_time_ms: i64,
    cache: &mut TopologyCache,
) {
    let own_host = target
        .admin
        .rsplit_once(':')
        .map_or("", |(h, _)| h.trim_start_matches('[').trim_end_matches(']'))
        .to_owned();
    let (dump, listeners) = tokio::join!(admin.config_dump_bytes(), admin.listeners());
    let bound = match listeners {
        Ok(l) => l
            .listener_statuses
            .into_iter()
            .filter_map(|s| {
                let sa = s.local_address.socket_address?;
                Some((s.name, (sa.address, sa.port_value)))
            })
            .collect(),
        Err(e) => {
            debug!(instance = %target.instance, error = %e, "Sidecar /listeners not read.");
            Default::default()
        }
    };
    let read = match dump {
        Ok(text) => parse_dump(text, bound, own_host).await,
        Err(e) => Err(DumpError::Fetch(e)),
    };
    match read {
        Ok((t, hashes)) => {
            debug!(instance = %target.instance, listeners = t.listeners.len(), config_hash = %hashes.config, "Sidecar configuration read.");
            cache.store(version, start_time_ms, t, hashes);
        }
        Err(e) => {
            let failure = e.failure();
            match failure {
                ReadFailure::Lasting => {
                    warn!(instance = %target.instance, error = %e, "Sidecar /config_dump not read; read again when its configuration changes.");
                }
                ReadFailure::Passing => {
                    debug!(instance = %target.instance, error = %e, "Sidecar /config_dump not read.");
                }
            }
            cache.failed(version, start_time_ms, failure);
        }
    }
}

/// One large `/config_dump` parsed at a time in the whole agent: each parse holds its
/// dump's resources while it runs (megabytes for a big mesh), and sidecars that change
/// together (one control-plane push) would otherwise parse side by side, each on a
/// thread of its own with its own allocator arena.
static DUMP_PARSES: Semaphore = Semaphore::const_new(1);

/// Dumps up to this size are parsed on the runtime thread: at most about 20 ms of
/// CPU (about 5 ms per MB), and no thread of the blocking pool, whose allocator arena
/// glibc keeps after it ends (1.5 to 2.4 MiB more resident for a 1.8 MB dump, over
/// the agent's 20 MiB budget at its peak; docs/benchmarks.md). Larger ones, up to the
/// 32 MiB read limit, are parsed on the blocking pool, so that they hold back neither
/// the other sidecars' scrapes nor the connection to the aggregator.
const INLINE_PARSE_MAX: usize = 4 << 20;

/// Why a `/config_dump` read gave no topology.
#[derive(Debug, thiserror::Error)]
enum DumpError {
    #[error(transparent)]
    Fetch(EnvoyError),
    #[error("admin answer to /config_dump is not a config dump: {0}")]
    Json(#[from] meshcat_common::config_dump::Error),
    #[error("the parse of /config_dump ended early: {0}")]
    Stopped(#[from] tokio::task::JoinError),
    #[error("the parse of /config_dump panicked")]
    Panicked,
}

impl DumpError {
    /// Whether another try at the same configuration may succeed.
    fn failure(&self) -> ReadFailure {
        match self {
            DumpError::Fetch(EnvoyError::TooLarge { .. }) | DumpError::Json(_) => {
                ReadFailure::Lasting
            }
            // A parse that panicked would panic again on the same dump.
            DumpError::Panicked => ReadFailure::Lasting,
            DumpError::Stopped(e) if e.is_panic() => ReadFailure::Lasting,
            DumpError::Fetch(_) | DumpError::Stopped(_) => ReadFailure::Passing,
        }
    }
}

/// The topology and drift hashes of `text` (a `/config_dump`): on the runtime thread
/// up to [`INLINE_PARSE_MAX`], on the blocking pool above.
async fn parse_dump(
    text: Vec<u8>,
    bound: BTreeMap<String, (String, u32)>,
    own_host: String,
) -> Result<(Topology, ConfigHashes), DumpError> {
    parse_dump_within(text, bound, own_host, INLINE_PARSE_MAX).await
}

/// [`parse_dump`] with the largest dump parsed on the runtime thread given.
async fn parse_dump_within(
    text: Vec<u8>,
    bound: BTreeMap<String, (String, u32)>,
    own_host: String,
    inline_max: usize,
) -> Result<(Topology, ConfigHashes), DumpError> {
    let inline = text.len() <= inline_max;
    let parse = move || {
        let mut reader = topology::TopologyReader::new(&bound, &own_host);
        let mut hasher = drift::DriftHasher::default();
        let read = meshcat_common::config_dump::read(&text, |item| {
            reader.take(&item);
            hasher.take(item);
        });
        drop(text);
        read.map(|()| (reader.finish(), hasher.finish()))
    };
    if inline {
        // A panic stays this dump's failure, not the scrape loop's end.
        return std::panic::catch_unwind(std::panic::AssertUnwindSafe(parse))
            .map_err(|_| DumpError::Panicked)?
            .map_err(DumpError::from);
    }
    let permit = DUMP_PARSES.acquire().await.expect("never closed");
    let parse = tokio::task::spawn_blocking(move || {
        // Held by the parse itself: a scrape stopped while it runs (its target
        // removed) does not let another parse start beside it.
        let _permit = permit;
        parse()
    });
    Ok(parse.await??)
}

/// Scrapes `target` every `interval` until aborted.
async fn scrape_loop(agent: Agent, target: Target, interval: Duration, lease: Lease) {
    let admin = match agent.admin_client(&target) {
        Ok(a) => a,
        Err(e) => {
            error!(instance = %target.instance, error = %e, "Target cannot be scraped.");
            return;
        }
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut was_reachable = true;
    let mut failure_logged: Option<(String, Instant)> = None;
    let mut topology = TopologyCache::default();
    let mut xds = XdsTracker::default();
    let mut identity = IdentityReader::default();
    loop {
        ticker.tick().await;
        let started = Instant::now();
        let previous = agent.board().get(&target.key());
        let tail = agent.diagnostics().get(&target.key()).and_then(|d| d.tail);
        let report = scrape_following(
            &admin,
            &target,
            agent.host(),
            previous.as_ref(),
            &mut topology,
            XdsScrape {
                tracker: &mut xds,
                log: tail.as_ref(),
            },
            IdentityScrape {
                reader: &mut identity,
                interval: agent.certs_interval(),
            },
        )
        .await;
        let ok = report.reachable;
        let error = report.error.clone().unwrap_or_default();
        if let Some(crate::identity::ReadOutcome::Refused(reason)) = identity.take_outcome() {
            agent.ops_metrics().certs_refused(
                (&target.zone_name, &target.cluster_name, &target.instance),
                reason,
            );
        }
        // Recorded only while the target is current: a removal between the scrape
        // and here would otherwise see the report and its series come back.
        let taken = agent.board().put(lease, report, || {
            agent.ops_metrics().observe_scrape(
                (&target.zone_name, &target.cluster_name, &target.instance),
                ok,
                started.elapsed(),
            );
        });
        if !taken {
            return;
        }
        let netns = target
            .netns
            .as_ref()
            .map(|n| n.path().display().to_string());
        if ok && !was_reachable {
            info!(instance = %target.instance, admin = %target.admin, netns, "Sidecar answers again.");
            failure_logged = None;
        } else if !ok
            && (was_reachable
                || failure_logged.as_ref().is_some_and(|(said, at)| {
                    *said != error && at.elapsed() >= FAILURE_LOG_INTERVAL
                }))
        {
            // A failure is logged when it starts, and again when its cause changes
            // (the sidecar refuses, then its namespace is gone), at most once a minute.
            warn!(instance = %target.instance, admin = %target.admin, netns, %error, "Sidecar scrape failed.");
            failure_logged = Some((error, Instant::now()));
        }
        was_reachable = ok;
    }
}

/// Least time between two logged failures of one sidecar whose cause changed.
const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// The running scrapers, by (zone, cluster, instance).
#[derive(Debug, Default)]
struct Scrapers {
    /// Each running target with the task scraping it.
    running: BTreeMap<TargetKey, (Target, JoinHandle<()>)>,
}

impl Scrapers {
    /// Starts, restarts and stops tasks so that exactly `desired` run. Answers the
    /// stopped tasks (aborted; one may still finish the step it is in).
    fn reconcile(
        &mut self,
        agent: &Agent,
        desired: &[Target],
        interval: Duration,
        board: &Board,
    ) -> Vec<JoinHandle<()>> {
        let mut stopped = Vec::new();
        let wanted: BTreeMap<TargetKey, &Target> = desired.iter().map(|t| (t.key(), t)).collect();
        let stale: Vec<TargetKey> = self
            .running
            .iter()
            .filter(|(key, (t, _))| wanted.get(*key) != Some(&t))
            .map(|(key, _)| key.clone())
            .collect();
        for key in stale {
            if let Some((t, task)) = self.running.remove(&key) {
                task.abort();
                board.remove(&key);
                stopped.push(task);
                info!(instance = %t.instance, admin = %t.admin, zone = %t.zone_name, cluster = %t.cluster_name, "Target removed.");
            }
        }
        for (key, t) in wanted {
            if let std::collections::btree_map::Entry::Vacant(slot) = self.running.entry(key) {
                info!(instance = %t.instance, admin = %t.admin, zone = %t.zone_name, cluster = %t.cluster_name, "Target added.");
                let lease = board.lease(slot.key());
                let task = tokio::spawn(scrape_loop(agent.clone(), t.clone(), interval, lease));
                slot.insert((t.clone(), task));
            }
        }
        agent.set_targets(desired.to_vec());
        stopped
    }

    fn stop_all(&mut self) {
        for (_, (_, task)) in std::mem::take(&mut self.running) {
            task.abort();
        }
    }
}

/// What the last pod discovery made, so that a discovery repeated every interval
/// (`--pod-netns`) logs only what changed.
#[derive(Debug, Default)]
struct PodDiscovery {
    /// The targets last applied.
    targets: Option<Vec<Target>>,
    /// The notes last logged.
    notes: Vec<String>,
    /// The namespace last found for each pod UID (`--pod-netns`): a listed pod whose
    /// processes are gone keeps it, so that its sidecar is reported unreachable (the
    /// namespace is gone) rather than silently left out until its TTL.
    known: BTreeMap<String, Netns>,
}

impl PodDiscovery {
    /// Derives the targets of `list` and applies them when they changed, logging the
    /// notes (pods left out) when they changed.
    fn apply(
        &mut self,
        agent: &Agent,
        scrapers: &mut Scrapers,
        list: &crate::discovery::PodList,
        source: &PodSource,
        interval: Duration,
    ) {
        use crate::discovery::{AdminReach, checked_targets, podns};
        let file = source.file.as_path();
        let namespaces = match source.proc_dir.as_deref().map(podns::scan).transpose() {
            Ok(Some(mut found)) => {
                // A listed pod found before and not now keeps the namespace it had.
                let listed: std::collections::BTreeSet<String> = list
                    .items
                    .iter()
                    .filter_map(|p| podns::uid_key(&p.metadata.uid))
                    .collect();
                for (uid, ns) in std::mem::take(&mut self.known) {
                    found.entry(uid).or_insert(ns);
                }
                self.known = found
                    .iter()
                    .filter(|(uid, _)| listed.contains(*uid))
                    .map(|(u, n)| (u.clone(), n.clone()))
                    .collect();
                Some(found)
            }
            Ok(None) => None,
            Err(e) => {
                error!(proc_dir = ?source.proc_dir, error = %e, "The node's process list cannot be read; keeping the previous targets.");
                return;
            }
        };
        let reach = namespaces
            .as_ref()
            .map_or(AdminReach::PodIp, AdminReach::PodLoopback);
        match checked_targets(list, &source.log_dir, reach, file) {
            Ok(found) => {
                if found.notes != self.notes {
                    for note in &found.notes {
                        warn!(path = %file.display(), %note, "Pod discovery.");
                    }
                    self.notes = found.notes;
                }
                if self.targets.as_ref() != Some(&found.targets) {
                    info!(path = %file.display(), targets = found.targets.len(), "Pod targets found.");
                    scrapers.reconcile(agent, &found.targets, interval, agent.board());
                    self.targets = Some(found.targets);
                }
            }
            Err(e) => {
                error!(error = %e, "Pods file refused; keeping the previous targets.");
            }
        }
    }
}

/// A file's identity for change detection: modification time and length.
fn fingerprint(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Runs the scrapers of `source` until `stop` turns true, following the targets
/// file when there is one. `loaded` fires once the first targets are set (or their
/// file was refused), so that nothing is served before the agent knows its sidecars.
pub async fn manage(
    agent: Agent,
    source: TargetSource,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
    loaded: oneshot::Sender<()>,
) {
    let mut loaded = Some(loaded);
    let mut scrapers = Scrapers::default();
    let mut seen: Option<(SystemTime, u64)> = None;
    let mut pods: Option<crate::discovery::PodList> = None;
    let mut discovery = PodDiscovery::default();
    let mut first = true;
    loop {
        match &source {
            TargetSource::Fixed(targets) if first => {
                scrapers.reconcile(&agent, targets, interval, agent.board());
            }
            TargetSource::Fixed(_) => {}
            TargetSource::File(path) => {
                let now = fingerprint(path);
                if first || now != seen {
                    seen = now;
                    match read_targets_file(path) {
                        Ok(targets) => {
                            info!(path = %path.display(), targets = targets.len(), "Targets file loaded.");
                            scrapers.reconcile(&agent, &targets, interval, agent.board());
                        }
                        Err(e) => {
                            error!(error = %e, "Targets file refused; keeping the previous targets.");
                        }
                    }
                }
            }
            TargetSource::Pods(source) => {
                let file = &source.file;
                let now = fingerprint(file);
                let reread = first || now != seen;
                if reread {
                    seen = now;
                    match crate::discovery::read_pods_file(file) {
                        Ok(list) => {
                            info!(path = %file.display(), pods = list.items.len(), "Pods file loaded.");
                            pods = Some(list);
                        }
                        Err(e) => {
                            error!(error = %e, "Pods file refused; keeping the previous targets.");
                        }
                    }
                }
                if let Some(list) = &pods
                    && (reread || source.proc_dir.is_some())
                {
                    discovery.apply(&agent, &mut scrapers, list, source, interval);
                }
            }
        }
        first = false;
        if let Some(l) = loaded.take() {
            let _ = l.send(());
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    scrapers.stop_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_a_dump_at_fault_waits_for_the_next_change() {
        let too_large = EnvoyError::TooLarge {
            path: "/config_dump".into(),
            limit: crate::envoy::MAX_CONFIG_DUMP,
        };
        assert_eq!(DumpError::Fetch(too_large).failure(), ReadFailure::Lasting);
        let not_json = meshcat_common::config_dump::read(b"{\"configs\": [", |_| {}).unwrap_err();
        assert_eq!(DumpError::from(not_json).failure(), ReadFailure::Lasting);
        let status = EnvoyError::Status {
            addr: "127.0.0.1:9901".into(),
            path: "/config_dump".into(),
            status: 503,
            body: String::new(),
        };
        assert_eq!(DumpError::Fetch(status).failure(), ReadFailure::Passing);
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = closed.local_addr().unwrap().to_string();
        drop(closed);
        let admin = EnvoyAdmin::new(&addr, Duration::from_secs(2)).unwrap();
        let refused = admin.config_dump_bytes().await.unwrap_err();
        assert!(matches!(refused, EnvoyError::Transport { .. }), "{refused}");
        assert_eq!(DumpError::Fetch(refused).failure(), ReadFailure::Passing);
        let panicked = tokio::task::spawn_blocking(|| panic!("a parse that panics"))
            .await
            .unwrap_err();
        assert_eq!(DumpError::from(panicked).failure(), ReadFailure::Lasting);
    }

    /// A dump above the inline bound is parsed on the blocking pool (here the pool's
    /// only thread is busy: the parse waits while the runtime thread stays free); one
    /// within it is parsed at once on the runtime thread, with the same result.
    #[test]
    fn a_large_dump_is_parsed_off_the_runtime_thread() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .build()
            .unwrap();
        let path = format!(
            "{}/tests/fixtures/config_dumps/orders_a.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read(path).unwrap();
        assert!(text.len() <= INLINE_PARSE_MAX);
        let mut expected = drift::DriftHasher::default();
        meshcat_common::config_dump::read(&text, |item| expected.take(item)).unwrap();
        let expected = expected.finish();
        runtime.block_on(async {
            let (release, busy_until) = std::sync::mpsc::channel::<()>();
            let busy = tokio::task::spawn_blocking(move || busy_until.recv());
            // Within the bound: done at once although the pool is busy.
            let mut small =
                std::pin::pin!(parse_dump(text.clone(), BTreeMap::new(), "10.0.0.1".into()));
            match futures::poll!(small.as_mut()) {
                std::task::Poll::Ready(Ok((topology, hashes))) => {
                    assert_eq!(hashes, expected);
                    assert_eq!(topology.listeners.len(), 2);
                }
                other => panic!("a small dump is parsed inline: {other:?}"),
            }
            // Above the bound (0 here): it waits for the pool.
            let mut large = std::pin::pin!(parse_dump_within(
                text,
                BTreeMap::new(),
                "10.0.0.1".into(),
                0
            ));
            assert!(futures::poll!(large.as_mut()).is_pending());
            release.send(()).unwrap();
            busy.await.unwrap().unwrap();
            let (topology, hashes) = large.await.unwrap();
            assert_eq!(hashes, expected);
            assert_eq!(topology.listeners.len(), 2);
        });
    }

    /// Removals race scrapers that report as fast as they can (their sidecar refuses
    /// at once): once the stopped scrapers have ended, neither the removed target's
    /// report nor its scrape series may be there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_removed_target_never_comes_back() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let admin = closed.local_addr().unwrap().to_string();
        drop(closed);
        let agent = Agent::new(Duration::from_millis(200));
        let target = Target {
            admin,
            zone_name: "z".into(),
            cluster_name: "c".into(),
            instance: "a".into(),
            log_file: None,
            local_cluster: None,
            netns: None,
        };
        let interval = Duration::from_millis(1);
        let mut scrapers = Scrapers::default();
        for round in 0..100 {
            scrapers.reconcile(
                &agent,
                std::slice::from_ref(&target),
                interval,
                agent.board(),
            );
            tokio::time::timeout(Duration::from_secs(10), async {
                while agent.board().get(&target.key()).is_none() {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .expect("the scraper reports");
            for task in scrapers.reconcile(&agent, &[], interval, agent.board()) {
                let _ = task.await;
            }
            assert!(
                agent.board().get(&target.key()).is_none(),
                "round {round}: report back"
            );
            let m = agent.ops_metrics().render();
            assert!(
                !m.contains("target=\"a\""),
                "round {round}: series back: {m}"
            );
        }
    }
}
