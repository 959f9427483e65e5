//! What the sidecars saw of their upstream clusters, over the graph window, kept per
//! calling cluster: the graph ([`crate::graph`]) is a graph of clusters, so each
//! report is folded into its cluster's calls as it arrives, and a build of the
//! graph walks clusters and their upstreams, never every instance.
//!
//! Per instance, only what taking its next report (or its leaving) back out needs:
//! each upstream's last counters (a restarted sidecar counts from zero again: its
//! first counts are all new, never a negative spike), its hosts, its listeners and
//! its local cluster. Per cluster ([`ClusterCalls`]): for each upstream the instances
//! that list it, the counter differences over the window ([`ring`]), the highest
//! recent latency, TLS, and the upstream's host addresses (as 64-bit keys, which is
//! all the graph compares them by); the instances' listeners and local clusters.
//! Traffic an instance reported stays in its cluster's window after the instance
//! left (it happened); an upstream no live instance lists any more is dropped.
//!
//! The same differences are also kept apart until the graph's next build claims
//! them ([`Calls::claim`]): the build adds them to the edge they belong to, which is
//! how the edges' `meshcat_edge_*_total` counters only ever grow, whatever instances
//! come and go (see `docs/metrics.md`).

mod ring;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use meshcat_common::wire::{InstanceReport, ListenerRoutes, UpstreamCluster, UpstreamTraffic};

pub use ring::{AddressMap, Window, address_key};
use ring::{Clock, Ring};

use crate::ingest::InstanceKey;

use meshcat_common::limits::{
    MAX_LISTENER_CLUSTERS, MAX_LISTENERS, MAX_UPSTREAM_CLUSTERS as MAX_UPSTREAMS,
};
/// Most host addresses kept per upstream cluster of an instance, and of a cluster
/// (its instances' together: one matching host is all the graph needs).
const MAX_HOSTS: usize = 64;
const MAX_CLUSTER_HOSTS: usize = 256;
// Which of an instance's hosts its cluster counts is a bit each of a `u64`.
const _: () = assert!(MAX_HOSTS <= u64::BITS as usize);
/// Longest upstream cluster name or address kept.
const MAX_NAME: usize = 512;
/// Buckets over which the highest latency reported is kept: the current one and the
/// one before, which hold each live instance's latest report when instances report
/// at least once a bucket (every 5 s against buckets of 5 s by default).
const RECENT_BUCKETS: usize = 2;

/// One instance's graph fields, as its last report left them: what is needed to take
/// its next report, or its leaving, out of its cluster's calls.
#[derive(Debug, Default)]
struct InstanceTraffic {
    local_cluster: Option<Arc<str>>,
    /// The listeners' addresses as [`address_key`]s (their routes are kept with the
    /// cluster's calls).
    listener_keys: Box<[u64]>,
    /// A hash of the listeners' routes, to tell when they change.
    listener_routes: u64,
    /// Sorted by name.
    upstreams: Vec<InstanceUpstream>,
}

/// One upstream cluster of one instance.
#[derive(Debug)]
struct InstanceUpstream {
    /// Shared with its cluster's [`Calls`].
    name: Arc<str>,
    /// The counters of the last report: requests, and errors (5xx and connect
    /// failures).
    last: (u64, u64),
    /// Its host addresses' keys, as the sidecar's `/clusters` lists them.
    hosts: Box<[u64]>,
    /// Which of `hosts` its cluster's calls count for it (bit `i` for `hosts[i]`):
    /// past [`MAX_CLUSTER_HOSTS`] a host is not kept, and its leaving must not take
    /// away another instance's count of the same address.
    counted: u64,
}

/// What the instances of one cluster (or a peer's summary of them) reported of
/// their calls, summed.
#[derive(Debug, Default)]
pub struct ClusterCalls {
    /// Instances whose graph fields are in.
    instances: u32,
    /// Local clusters the instances' targets name, and how many name each.
    local: Vec<(Arc<str>, u32)>,
    /// The instances' listeners by address key, and how many have each.
    listeners: AddressMap<(ListenerRoutes, u32)>,
    /// Sorted by name.
    upstreams: Vec<Calls>,
}

/// One upstream cluster of a cluster: its calls over the window.
#[derive(Debug)]
pub struct Calls {
    name: Arc<str>,
    /// Live instances that list it.
    instances: u32,
    ring: Ring,
    /// The highest p50 and p99 and whether TLS was used, per recent bucket.
    recent: [Recent; RECENT_BUCKETS],
    /// What the last report said of TLS: kept when no report is recent.
    tls: bool,
    /// Host address keys and how many instances list each, sorted by key.
    hosts: Vec<(u64, u32)>,
    /// Requests and errors added by reports since the graph's last build claimed
    /// them. Atomic because the build claims them while reading the calls shared
    /// with other readers; reports add to them under the map's write guard.
    unclaimed: [AtomicU64; 2],
}

/// The latency and TLS that the reports of one bucket said. A mesh has an entry per
/// edge: latencies are kept as `f64` with NaN for none, half an `Option<f64>`.
#[derive(Debug, Clone, Copy)]
struct Recent {
    /// The bucket, plus one (0: never written).
    bucket: u64,
    p50_ms: f64,
    p99_ms: f64,
    tls: bool,
}

impl Default for Recent {
    fn default() -> Self {
        Recent {
            bucket: 0,
            p50_ms: f64::NAN,
            p99_ms: f64::NAN,
            tls: false,
        }
    }
}

/// `v`, none when NaN.
fn known(v: f64) -> Option<f64> {
    (!v.is_nan()).then_some(v)
}

impl Calls {
    fn new(name: Arc<str>) -> Self {
        Calls {
            name,
            instances: 0,
            ring: Ring::default(),
            recent: [Recent::default(); RECENT_BUCKETS],
            tls: false,
            hosts: Vec::new(),
            unclaimed: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name, as its cluster's calls share it.
    pub fn shared_name(&self) -> &Arc<str> {
        &self.name
    }

    /// Its hosts' address keys.
    pub fn hosts(&self) -> impl Iterator<Item = u64> + '_ {
        self.hosts.iter().map(|(k, _)| *k)
    }

    /// The recent buckets' notes as of `now_bucket`: those of the last
    /// [`RECENT_BUCKETS`] buckets up to it.
    fn recent(&self, now_bucket: u64) -> impl Iterator<Item = &Recent> {
        let oldest = now_bucket.saturating_sub(RECENT_BUCKETS as u64 - 1) + 1;
        self.recent.iter().filter(move |r| r.bucket >= oldest)
    }

    /// Whether the connections use TLS: as any instance's reports within the recent
    /// buckets before `now_bucket` said, else as the last report said.
    pub fn tls(&self, now_bucket: u64) -> bool {
        let mut recent = self.recent(now_bucket).peekable();
        if recent.peek().is_none() {
            return self.tls;
        }
        recent.any(|r| r.tls)
    }

    /// The highest p50 and p99 the instances reported within the recent buckets
    /// before `now_bucket`; none when unknown.
    pub fn latency(&self, now_bucket: u64) -> (Option<f64>, Option<f64>) {
        self.recent(now_bucket).fold((None, None), |(p50, p99), r| {
            (max_opt(p50, known(r.p50_ms)), max_opt(p99, known(r.p99_ms)))
        })
    }

    /// Takes the requests and errors reported since the last claim. Each report's
    /// differences are claimed once, by one build of the graph.
    pub fn claim(&self) -> (u64, u64) {
        (
            self.unclaimed[0].swap(0, Ordering::Relaxed),
            self.unclaimed[1].swap(0, Ordering::Relaxed),
        )
    }

    /// Takes one report's differences in.
    fn report(&mut self, clock: Clock, now: Instant, added: (u64, u64), u: &UpstreamTraffic) {
        self.ring.add(clock, now, added.0, added.1);
        for (slot, n) in self.unclaimed.iter_mut().zip([added.0, added.1]) {
            let v = slot.get_mut();
            *v = v.saturating_add(n);
        }
        self.note(clock, u.p50_ms, u.p99_ms, u.tls);
    }

    /// Keeps what a report said of latency and TLS in its bucket.
    fn note(&mut self, clock: Clock, p50: Option<f64>, p99: Option<f64>, tls: bool) {
        let slot = &mut self.recent[(clock.bucket % RECENT_BUCKETS as u64) as usize];
        if slot.bucket != clock.bucket + 1 {
            *slot = Recent {
                bucket: clock.bucket + 1,
                ..Recent::default()
            };
        }
        let higher = |kept: f64, new: Option<f64>| {
            max_opt(known(kept), new.filter(|v| v.is_finite())).unwrap_or(f64::NAN)
        };
        slot.p50_ms = higher(slot.p50_ms, p50);
        slot.p99_ms = higher(slot.p99_ms, p99);
        slot.tls |= tls;
        self.tls = tls;
    }

    /// Counts an instance's `hosts` (at most [`MAX_HOSTS`]); answers which of them
    /// were counted, bit `i` for `hosts[i]`.
    fn add_hosts(&mut self, hosts: &[u64]) -> u64 {
        let mut counted = 0;
        for (bit, h) in hosts.iter().take(MAX_HOSTS).enumerate() {
            match self.hosts.binary_search_by_key(h, |(k, _)| *k) {
                Ok(i) => self.hosts[i].1 += 1,
                Err(i) if self.hosts.len() < MAX_CLUSTER_HOSTS => self.hosts.insert(i, (*h, 1)),
                // One matching host is all the graph needs; past the bound, none is kept.
                Err(_) => continue,
            }
            counted |= 1 << bit;
        }
        counted
    }

    /// Takes back the hosts of an instance that [`Calls::add_hosts`] counted.
    fn remove_hosts(&mut self, hosts: &[u64], counted: u64) {
        for (bit, h) in hosts.iter().take(MAX_HOSTS).enumerate() {
            if counted & (1 << bit) == 0 {
                continue;
            }
            if let Ok(i) = self.hosts.binary_search_by_key(h, |(k, _)| *k) {
                self.hosts[i].1 -= 1;
                if self.hosts[i].1 == 0 {
                    self.hosts.remove(i);
                }
            }
        }
    }
}

impl ClusterCalls {
    /// The local clusters its instances' targets name.
    pub fn local_clusters(&self) -> impl Iterator<Item = &str> {
        self.local.iter().map(|(n, _)| &**n)
    }

    /// Its instances' listeners, by address key.
    pub fn listeners(&self) -> impl Iterator<Item = (u64, &ListenerRoutes)> {
        self.listeners.iter().map(|(k, (l, _))| (*k, l))
    }

    /// Sorted by name.
    pub fn upstreams(&self) -> &[Calls] {
        &self.upstreams
    }

    fn calls_mut(&mut self, name: &str) -> Option<&mut Calls> {
        let i = self
            .upstreams
            .binary_search_by(|c| (*c.name).cmp(name))
            .ok()?;
        Some(&mut self.upstreams[i])
    }

    /// An instance lists `name` with `hosts`: the shared name to keep, and which of
    /// the hosts are counted ([`Calls::add_hosts`]).
    fn join(&mut self, name: &str, hosts: &[u64]) -> (Arc<str>, u64) {
        let i = match self.upstreams.binary_search_by(|c| (*c.name).cmp(name)) {
            Ok(i) => i,
            Err(i) => {
                self.upstreams.insert(i, Calls::new(Arc::from(name)));
                i
            }
        };
        let c = &mut self.upstreams[i];
        c.instances += 1;
        let counted = c.add_hosts(hosts);
        (c.name.clone(), counted)
    }

    /// An instance no longer lists `u`: dropped with the last one.
    fn leave(&mut self, u: &InstanceUpstream) {
        if let Ok(i) = self.upstreams.binary_search_by(|c| (*c.name).cmp(&u.name)) {
            let c = &mut self.upstreams[i];
            c.remove_hosts(&u.hosts, u.counted);
            c.instances -= 1;
            if c.instances == 0 {
                self.upstreams.remove(i);
            }
        }
    }

    fn add_local(&mut self, name: &Arc<str>) {
        match self.local.iter_mut().find(|(n, _)| n == name) {
            Some((_, count)) => *count += 1,
            None => self.local.push((name.clone(), 1)),
        }
    }

    fn remove_local(&mut self, name: &Arc<str>) {
        if let Some(i) = self.local.iter().position(|(n, _)| n == name) {
            self.local[i].1 -= 1;
            if self.local[i].1 == 0 {
                self.local.swap_remove(i);
            }
        }
    }

    fn add_listener(&mut self, key: u64, l: &ListenerRoutes) {
        self.listeners
            .entry(key)
            .and_modify(|(_, count)| *count += 1)
            .or_insert_with(|| (l.clone(), 1));
    }

    fn remove_listener(&mut self, key: u64) {
        if let Some((_, count)) = self.listeners.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                self.listeners.remove(&key);
            }
        }
    }

    /// Takes everything `t` added out (the instance left).
    fn remove_instance(&mut self, t: &InstanceTraffic) {
        self.instances -= 1;
        if let Some(l) = &t.local_cluster {
            self.remove_local(l);
        }
        for key in &t.listener_keys {
            self.remove_listener(*key);
        }
        for u in &t.upstreams {
            self.leave(u);
        }
    }
}

/// One peer's summary: its clusters' calls, by (zone, cluster).
type PeerCalls = Vec<((String, String), ClusterCalls)>;

/// The traffic of every calling cluster, and of the instances it sums.
#[derive(Debug)]
pub struct Traffic {
    instances: DashMap<InstanceKey, InstanceTraffic>,
    /// Keyed by (zone, cluster).
    clusters: DashMap<(String, String), ClusterCalls>,
    /// Peers' summaries by peer, each replaced whole: a build of the graph sees a
    /// peer's last summary or its new one, never a mix or a gap.
    remote: RwLock<BTreeMap<String, Arc<PeerCalls>>>,
    /// Where the windows' buckets are numbered from.
    epoch: Instant,
    /// Moves whenever a change could change the graph's shape: an instance's
    /// traffic appearing or going, an upstream, host, listener or local cluster
    /// coming or going, or traffic on an upstream idle over the window. Figures
    /// moving alone leave it (see [`Traffic::shape`]).
    shape: AtomicU64,
    /// The graph window (`--graph-window`): how long reported traffic counts.
    window: Duration,
}

impl Traffic {
    /// No traffic yet, counted over `window`.
    pub fn new(window: Duration) -> Self {
        Traffic {
            instances: DashMap::new(),
            clusters: DashMap::new(),
            remote: RwLock::default(),
            epoch: Instant::now(),
            shape: AtomicU64::new(0),
            window,
        }
    }

    /// The graph window (`--graph-window`).
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The window bucket `now` falls in: the graph's figures change with time only
    /// when it moves (a bucket leaves the window).
    pub fn bucket(&self, now: Instant) -> u64 {
        Clock::at(self.epoch, now, self.window).bucket
    }

    /// An upstream's figures over the window before `now`.
    pub fn window_of(&self, u: &Calls, now: Instant) -> Window {
        u.ring.window(self.epoch, now, self.window)
    }

    /// Takes one report's graph fields in (its upstreams, listeners and local
    /// cluster, moved out of the report): adds each upstream's counter differences
    /// since the instance's previous report to its cluster's calls. A report
    /// without them (an agent older than the graph, or a sidecar that calls
    /// nothing) takes the instance out.
    pub fn record(&self, r: &mut InstanceReport, now: Instant) {
        let window = self.window;
        let key = InstanceKey::of(r);
        if r.upstreams.is_empty() && r.listeners.is_empty() && r.local_cluster.is_none() {
            self.forget(&key);
            return;
        }
        let mut incoming = std::mem::take(&mut r.upstreams);
        incoming.truncate(MAX_UPSTREAMS);
        incoming.retain(|u| !u.name.is_empty() && u.name.len() <= MAX_NAME);
        incoming.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        incoming.dedup_by(|a, b| a.name == b.name);
        let mut listeners = std::mem::take(&mut r.listeners);
        listeners.truncate(MAX_LISTENERS);
        listeners.retain(|l| l.address.len() <= MAX_NAME);
        for l in &mut listeners {
            l.clusters.retain(|c| c.len() <= MAX_NAME);
            l.clusters.truncate(MAX_LISTENER_CLUSTERS);
        }
        let listener_keys: Box<[u64]> = listeners.iter().map(|l| address_key(&l.address)).collect();
        let local_cluster: Option<Arc<str>> = r
            .local_cluster
            .take()
            .filter(|c| !c.is_empty() && c.len() <= MAX_NAME)
            .map(Arc::from);
        // The hosts of each upstream, found by name (a sidecar may list thousands).
        let mut listed: Vec<&UpstreamCluster> = r.clusters.iter().collect();
        listed.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let hosts_of = |name: &str| -> Box<[u64]> {
            listed
                .binary_search_by(|c| c.name.as_str().cmp(name))
                .ok()
                .map(|i| {
                    listed[i]
                        .hosts
                        .iter()
                        .filter(|h| h.address.len() <= MAX_NAME)
                        .take(MAX_HOSTS)
                        .map(|h| address_key(&h.address))
                        .collect()
                })
                .unwrap_or_default()
        };
        let clock = Clock::at(self.epoch, now, window);
        let mut reshaped = false;
        // Lock order: the instance, then its cluster (as in `forget`).
        let mut t = self.instances.entry(key).or_insert_with(|| {
            reshaped = true;
            InstanceTraffic::default()
        });
        let joined = reshaped;
        let mut c = self
            .clusters
            .entry((r.zone_name.clone(), r.cluster_name.clone()))
            .or_default();
        if joined {
            c.instances += 1;
        }
        if t.local_cluster != local_cluster {
            if let Some(old) = &t.local_cluster {
                c.remove_local(old);
            }
            if let Some(new) = &local_cluster {
                c.add_local(new);
            }
            t.local_cluster = local_cluster;
            reshaped = true;
        }
        let listener_routes = {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for l in &listeners {
                std::hash::Hash::hash(&l.clusters, &mut h);
            }
            std::hash::Hasher::finish(&h)
        };
        if t.listener_keys != listener_keys || t.listener_routes != listener_routes {
            for key in &t.listener_keys {
                c.remove_listener(*key);
            }
            for (key, l) in listener_keys.iter().zip(&listeners) {
                c.add_listener(*key, l);
            }
            reshaped = true;
        }
        t.listener_keys = listener_keys;
        t.listener_routes = listener_routes;
        // Both sorted by name: one walk pairs each upstream with its previous state.
        let mut previous = std::mem::take(&mut t.upstreams).into_iter().peekable();
        let mut upstreams = Vec::with_capacity(incoming.len());
        for u in incoming {
            while let Some(gone) = previous.next_if(|p| *p.name < *u.name) {
                c.leave(&gone);
                reshaped = true;
            }
            let hosts = hosts_of(&u.name);
            let totals = (
                u.requests_total,
                u.errors_5xx_total.saturating_add(u.connect_fail_total),
            );
            match previous.next_if(|p| *p.name == *u.name) {
                // Nothing to take a difference from: counted from the next report.
                None => {
                    let (name, counted) = c.join(&u.name, &hosts);
                    if let Some(calls) = c.calls_mut(&u.name) {
                        calls.note(clock, u.p50_ms, u.p99_ms, u.tls);
                    }
                    upstreams.push(InstanceUpstream {
                        name,
                        last: totals,
                        hosts,
                        counted,
                    });
                    reshaped = true;
                }
                Some(mut p) => {
                    let added = if totals.0 < p.last.0 || totals.1 < p.last.1 {
                        // The sidecar restarted: all it counted since is new.
                        totals
                    } else {
                        (totals.0 - p.last.0, totals.1 - p.last.1)
                    };
                    p.last = totals;
                    let calls = c.calls_mut(&u.name).expect("a listed upstream has calls");
                    if hosts != p.hosts {
                        calls.remove_hosts(&p.hosts, p.counted);
                        p.counted = calls.add_hosts(&hosts);
                        p.hosts = hosts;
                        reshaped = true;
                    }
                    if added.0 > 0 || added.1 > 0 {
                        let w = calls.ring.window(self.epoch, now, window);
                        reshaped |= w.requests == 0 && w.errors == 0;
                    }
                    calls.report(clock, now, added, &u);
                    upstreams.push(p);
                }
            }
        }
        for gone in previous {
            c.leave(&gone);
            reshaped = true;
        }
        if reshaped {
            // Upstreams come and go rarely; a mesh has one of these per edge.
            c.upstreams.shrink_to_fit();
        }
        t.upstreams = upstreams;
        drop(c);
        drop(t);
        if reshaped {
            self.reshaped();
        }
    }

    /// Notes a change that could change the graph's shape.
    fn reshaped(&self) {
        self.shape.fetch_add(1, Ordering::Relaxed);
    }

    /// A number that moves whenever the traffic changed in a way that could change
    /// the graph's shape (an edge appearing or going); figures moving alone, or the
    /// window moving on, leave it.
    pub fn shape(&self) -> u64 {
        self.shape.load(Ordering::Relaxed)
    }

    /// Takes an instance out (it left or expired): its cluster's calls keep the
    /// traffic it reported, without its upstreams, hosts and listeners.
    pub fn forget(&self, key: &InstanceKey) {
        let Some((_, t)) = self.instances.remove(key) else {
            return;
        };
        let cluster = (key.zone.clone(), key.cluster.clone());
        if let Some(mut c) = self.clusters.get_mut(&cluster) {
            c.remove_instance(&t);
        }
        self.clusters.remove_if(&cluster, |_, c| c.instances == 0);
        self.reshaped();
    }

    /// Calls `f` with every cluster's calls, this replica's and its peers' (the graph
    /// build walks a [`Traffic::view`] instead).
    #[cfg(test)]
    pub fn each(&self, f: impl FnMut(&str, &str, &ClusterCalls)) {
        self.view().each(f);
    }

    /// This replica's calls, and the peers' summaries as they are now: walked
    /// several times, a view shows each peer's same summary every time.
    pub fn view(&self) -> TrafficView<'_> {
        TrafficView {
            local: &self.clusters,
            remote: self
                .remote
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .cloned()
                .collect(),
        }
    }

    /// Where the windows' buckets are numbered from.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }
}

/// The calls a build of the graph walks: this replica's clusters' (as they are when
/// walked) and the peers' summaries held when the view was taken.
#[derive(Debug)]
pub struct TrafficView<'a> {
    local: &'a DashMap<(String, String), ClusterCalls>,
    remote: Vec<Arc<PeerCalls>>,
}

impl TrafficView<'_> {
    /// Calls `f` with every cluster's calls, this replica's and its peers'.
    pub fn each(&self, mut f: impl FnMut(&str, &str, &ClusterCalls)) {
        for e in self.local.iter() {
            f(&e.key().0, &e.key().1, e.value());
        }
        for ((zone, cluster), calls) in self.remote.iter().flat_map(|p| p.iter()) {
            f(zone, cluster, calls);
        }
    }
}

/// What one replica's agents saw of one cluster's calls over the window: what a peer
/// needs to draw the same graph (`GET /peer/traffic`). Figures are over the window,
/// not counters.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterTraffic {
    pub zone_name: String,
    pub cluster_name: String,
    /// The instances' own local clusters (named by their targets).
    pub local_clusters: Vec<String>,
    pub listeners: Vec<ListenerRoutes>,
    pub upstreams: Vec<UpstreamWindow>,
}

/// One upstream cluster's figures over the window, summed over instances.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamWindow {
    pub name: String,
    pub requests: u64,
    pub errors: u64,
    /// How long before the summary the last traffic was reported; `None` when
    /// none within the window.
    pub last_seen_ago_ms: Option<u64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub tls: bool,
    /// The host addresses' keys ([`address_key`]).
    pub hosts: Vec<u64>,
}

impl Traffic {
    /// The calls of the clusters whose instances report to this replica, over the
    /// window before `now`; peers' summaries are not included.
    pub fn summary(&self, now: Instant) -> Vec<ClusterTraffic> {
        let window = self.window;
        let now_bucket = Clock::at(self.epoch, now, window).bucket;
        let mut out: Vec<ClusterTraffic> = self
            .clusters
            .iter()
            .map(|e| {
                let ((zone, cluster), c) = (e.key(), e.value());
                let mut listeners: Vec<ListenerRoutes> =
                    c.listeners.values().map(|(l, _)| l.clone()).collect();
                listeners.sort_by(|a, b| a.address.cmp(&b.address));
                ClusterTraffic {
                    zone_name: zone.clone(),
                    cluster_name: cluster.clone(),
                    local_clusters: c.local_clusters().map(str::to_owned).collect(),
                    listeners,
                    upstreams: c
                        .upstreams
                        .iter()
                        .map(|u| {
                            let w = u.ring.window(self.epoch, now, window);
                            let (p50_ms, p99_ms) = u.latency(now_bucket);
                            UpstreamWindow {
                                name: u.name.to_string(),
                                requests: w.requests,
                                errors: w.errors,
                                last_seen_ago_ms: w
                                    .last_seen
                                    .map(|at| now.saturating_duration_since(at).as_millis() as u64),
                                p50_ms,
                                p99_ms,
                                tls: u.tls(now_bucket),
                                hosts: u.hosts().collect(),
                            }
                        })
                        .collect(),
                }
            })
            .collect();
        out.sort_by(|a, b| (&a.zone_name, &a.cluster_name).cmp(&(&b.zone_name, &b.cluster_name)));
        out
    }

    /// Replaces what replica `peer` last said about its instances' traffic, received
    /// at `at`: the new summary is made whole, then takes the old one's place at
    /// once.
    pub fn set_remote(&self, peer: &str, clusters: &[ClusterTraffic], at: Instant) {
        let window = self.window;
        let clock = Clock::at(self.epoch, at, window);
        let mut summary: PeerCalls = Vec::with_capacity(clusters.len());
        for c in clusters {
            let mut calls = ClusterCalls {
                instances: 1,
                ..ClusterCalls::default()
            };
            // The instances of one cluster name one local cluster (their targets
            // are alike); the inbound listeners' routes name it too.
            if let Some(l) = c.local_clusters.first().filter(|l| l.len() <= MAX_NAME) {
                calls.add_local(&Arc::from(l.as_str()));
            }
            for l in c.listeners.iter().take(MAX_LISTENERS) {
                calls.add_listener(address_key(&l.address), l);
            }
            let mut names: Vec<&UpstreamWindow> = c
                .upstreams
                .iter()
                .take(MAX_UPSTREAMS)
                .filter(|u| !u.name.is_empty() && u.name.len() <= MAX_NAME)
                .collect();
            names.sort_unstable_by(|a, b| a.name.cmp(&b.name));
            names.dedup_by(|a, b| a.name == b.name);
            for u in names {
                let hosts: Vec<u64> = u.hosts.iter().take(MAX_HOSTS).copied().collect();
                calls.join(&u.name, &hosts);
                let x = calls.calls_mut(&u.name).expect("just joined");
                // Its window figures in the bucket of the time traffic was last
                // seen. It has nothing to claim: the peer's own edge counters count
                // that traffic.
                let seen = u
                    .last_seen_ago_ms
                    .and_then(|ms| at.checked_sub(Duration::from_millis(ms)))
                    .unwrap_or(at);
                x.ring.add(
                    Clock::at(self.epoch, seen, window),
                    seen,
                    u.requests,
                    u.errors,
                );
                x.note(clock, u.p50_ms, u.p99_ms, u.tls);
            }
            calls.upstreams.shrink_to_fit();
            summary.push(((c.zone_name.clone(), c.cluster_name.clone()), calls));
        }
        {
            let mut remote = self.remote.write().unwrap_or_else(PoisonError::into_inner);
            if summary.is_empty() {
                remote.remove(peer);
            } else {
                remote.insert(peer.to_owned(), Arc::new(summary));
            }
        }
        // A summary is the peer's whole view, replaced each time: its shape is not
        // compared, it may have changed.
        self.reshaped();
    }

    /// Forgets replica `peer`'s summary (it left).
    pub fn forget_remote(&self, peer: &str) {
        self.remote
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(peer);
        self.reshaped();
    }

    /// The peers whose summaries are held, sorted.
    pub fn remote_peers(&self) -> Vec<String> {
        self.remote
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshcat_common::wire::{UpstreamHost, UpstreamTraffic};

    const WIN: Duration = Duration::from_secs(60);

    /// A report of instance `instance` of z/a calling `b` with these counters.
    fn report_of(instance: &str, requests: u64, errors: u64) -> InstanceReport {
        InstanceReport {
            upstreams: vec![UpstreamTraffic {
                name: "b".into(),
                requests_total: requests,
                errors_5xx_total: errors,
                connect_fail_total: 0,
                p50_ms: Some(1.5),
                p99_ms: None,
                tls: false,
            }],
            ..InstanceReport::unread("z".into(), "a".into(), instance.into())
        }
    }

    fn report(requests: u64, errors: u64) -> InstanceReport {
        report_of("a-1", requests, errors)
    }

    fn listing(address: &str) -> UpstreamCluster {
        UpstreamCluster {
            name: "b".into(),
            added_via_api: false,
            hosts: vec![UpstreamHost::idle(address)],
        }
    }

    /// z/a's calls to its first upstream over the window before `now`.
    fn window(t: &Traffic, now: Instant) -> Window {
        let mut w = Window::default();
        t.each(|_, _, c| w = c.upstreams()[0].ring.window(t.epoch(), now, WIN));
        w
    }

    fn clusters(t: &Traffic) -> usize {
        let mut n = 0;
        t.each(|_, _, _| n += 1);
        n
    }

    #[test]
    fn counters_become_window_figures_and_a_restart_is_no_negative_spike() {
        let t = Traffic::new(WIN);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        t.record(&mut report(100, 1), at(0));
        assert_eq!(
            window(&t, at(0)).requests,
            0,
            "nothing to take a difference from"
        );
        t.record(&mut report(130, 4), at(5));
        assert_eq!(
            (window(&t, at(5)).requests, window(&t, at(5)).errors),
            (30, 3)
        );
        // The sidecar restarted: its counters start again from zero.
        t.record(&mut report(7, 0), at(10));
        assert_eq!(
            (window(&t, at(10)).requests, window(&t, at(10)).errors),
            (37, 3)
        );
        // A report counts until its bucket leaves the window.
        t.record(&mut report(7, 0), at(65));
        let w = window(&t, at(65));
        assert_eq!((w.requests, w.errors, w.last_seen), (7, 0, Some(at(10))));
        t.record(&mut report(7, 0), at(70));
        let w = window(&t, at(70));
        assert_eq!((w.requests, w.errors, w.last_seen), (0, 0, None));
        // An agent older than the graph sends nothing: the instance is taken out,
        // and with the last one its cluster.
        t.record(
            &mut InstanceReport::unread("z".into(), "a".into(), "a-1".into()),
            at(71),
        );
        assert_eq!(clusters(&t), 0);
    }

    #[test]
    fn a_clusters_instances_add_up_and_an_upstream_goes_with_its_last_instance() {
        let t = Traffic::new(WIN);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut one = report_of("a-1", 100, 0);
        one.clusters = vec![listing("10.0.0.2:80")];
        one.upstreams[0].p99_ms = Some(9.0);
        one.upstreams[0].tls = true;
        let mut two = report_of("a-2", 10, 0);
        two.clusters = vec![listing("10.0.0.3:80")];
        t.record(&mut one.clone(), at(0));
        t.record(&mut two.clone(), at(0));
        one.upstreams[0].requests_total = 150;
        two.upstreams[0].requests_total = 30;
        two.upstreams[0].p99_ms = Some(20.0);
        t.record(&mut one.clone(), at(5));
        t.record(&mut two.clone(), at(5));
        assert_eq!(clusters(&t), 1, "one cluster, two instances");
        let now_bucket = Clock::at(t.epoch(), at(5), WIN).bucket;
        t.each(|_, _, c| {
            let u = &c.upstreams()[0];
            assert_eq!(u.ring.window(t.epoch(), at(5), WIN).requests, 70);
            assert_eq!(
                u.latency(now_bucket),
                (Some(1.5), Some(20.0)),
                "the highest"
            );
            assert!(u.tls(now_bucket), "one instance uses TLS");
            assert_eq!(u.hosts().count(), 2, "both instances' hosts");
        });
        // a-2 leaves: what it reported stays in the window, its host goes.
        t.forget(&InstanceKey::new("z", "a", "a-2"));
        t.each(|_, _, c| {
            let u = &c.upstreams()[0];
            assert_eq!(u.ring.window(t.epoch(), at(6), WIN).requests, 70);
            assert_eq!(u.hosts().collect::<Vec<_>>(), [address_key("10.0.0.2:80")]);
        });
        // a-1 stops listing b: no live instance lists it, it goes.
        let mut none = report_of("a-1", 0, 0);
        none.upstreams[0].name = "c".into();
        t.record(&mut none, at(10));
        t.each(|_, _, c| {
            let names: Vec<&str> = c.upstreams().iter().map(Calls::name).collect();
            assert_eq!(names, ["c"]);
        });
        // Latency is kept over two buckets; past them it is unknown.
        t.record(&mut none, at(30));
        t.each(|_, _, c| {
            let later = Clock::at(t.epoch(), at(60), WIN).bucket;
            assert_eq!(c.upstreams()[0].latency(later), (None, None));
        });
    }

    #[test]
    fn the_shape_moves_with_what_can_change_an_edge_and_not_with_figures() {
        let t = Traffic::new(WIN);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut moved = {
            let mut last = t.shape();
            move |t: &Traffic| {
                let now = t.shape();
                let m = now != last;
                last = now;
                m
            }
        };
        t.record(&mut report(100, 1), at(0));
        assert!(moved(&t), "a new instance and upstream");
        t.record(&mut report(130, 1), at(5));
        assert!(moved(&t), "traffic on an idle upstream");
        t.record(&mut report(160, 2), at(10));
        assert!(!moved(&t), "figures alone");
        t.record(&mut report(160, 2), at(15));
        assert!(!moved(&t), "no traffic");
        let mut with_hosts = report(190, 2);
        with_hosts.clusters = vec![listing("10.0.0.2:80")];
        t.record(&mut with_hosts, at(20));
        assert!(moved(&t), "other hosts");
        let mut with_listener = report(220, 2);
        with_listener.clusters = with_hosts.clusters.clone();
        with_listener.listeners = vec![ListenerRoutes {
            address: "10.0.0.1:80".into(),
            clusters: vec!["local".into()],
        }];
        t.record(&mut with_listener, at(25));
        assert!(moved(&t), "a listener");
        let mut other = report(10, 0);
        other.upstreams[0].name = "c".into();
        other.clusters = with_hosts.clusters.clone();
        other.listeners = with_listener.listeners.clone();
        t.record(&mut other, at(30));
        assert!(moved(&t), "an upstream gone and another new");
        t.forget(&InstanceKey::new("z", "a", "a-1"));
        assert!(moved(&t), "the instance gone");
        t.forget(&InstanceKey::new("z", "a", "a-1"));
        assert!(!moved(&t), "nothing more to forget");
    }

    #[test]
    fn a_host_past_the_clusters_bound_is_not_taken_from_another_instance() {
        let t = Traffic::new(WIN);
        let now = Instant::now();
        let calling = |instance: &str, addresses: &[String]| {
            let mut r = report_of(instance, 10, 0);
            let mut l = listing("unused");
            let host = l.hosts[0].clone();
            l.hosts = addresses
                .iter()
                .map(|a| UpstreamHost {
                    address: a.clone(),
                    ..host.clone()
                })
                .collect();
            r.clusters = vec![l];
            r
        };
        let hosts_of = |t: &Traffic| {
            let mut hosts = Vec::new();
            t.each(|_, _, c| hosts = c.upstreams()[0].hosts().collect());
            hosts
        };
        // Four instances of 64 hosts each fill the cluster's 256.
        for i in 0..4 {
            let addresses: Vec<String> =
                (0..MAX_HOSTS).map(|h| format!("10.{i}.0.{h}:80")).collect();
            t.record(&mut calling(&format!("a-{i}"), &addresses), now);
        }
        assert_eq!(hosts_of(&t).len(), MAX_CLUSTER_HOSTS);
        let late = vec!["10.9.9.9:80".to_owned()];
        t.record(&mut calling("a-late", &late), now);
        assert!(
            !hosts_of(&t).contains(&address_key(&late[0])),
            "past the bound"
        );
        // Room again: another instance lists the same address and it is kept.
        t.forget(&InstanceKey::new("z", "a", "a-0"));
        t.record(&mut calling("a-other", &late), now);
        assert!(hosts_of(&t).contains(&address_key(&late[0])));
        // The instance whose host was never counted leaves: the other's stays.
        t.forget(&InstanceKey::new("z", "a", "a-late"));
        assert!(hosts_of(&t).contains(&address_key(&late[0])));
        // A host list that changes takes back only what was counted too.
        let mut again = calling("a-late", &late);
        t.record(&mut again, now);
        let mut moved = calling("a-late", &["10.9.9.8:80".to_owned()]);
        t.record(&mut moved, now);
        assert!(hosts_of(&t).contains(&address_key(&late[0])));
        t.forget(&InstanceKey::new("z", "a", "a-other"));
        assert!(!hosts_of(&t).contains(&address_key(&late[0])));
    }

    #[test]
    fn tls_is_what_the_recent_reports_said() {
        let t = Traffic::new(WIN);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let tls_at = |t: &Traffic, s: u64| {
            let bucket = Clock::at(t.epoch(), at(s), WIN).bucket;
            let mut tls = None;
            t.each(|_, _, c| tls = Some(c.upstreams()[0].tls(bucket)));
            tls.unwrap()
        };
        let mut r = report(100, 0);
        r.upstreams[0].tls = true;
        t.record(&mut r, at(5));
        assert!(tls_at(&t, 5));
        // TLS turned off; reports every 10 s land in every other 5 s bucket, so one
        // recent slot keeps the old report's note.
        for s in [10, 20, 30] {
            t.record(&mut report(100 + s, 0), at(s));
        }
        assert!(!tls_at(&t, 30), "the report of 5 s is no longer recent");
        // Without a recent report, the last one says.
        assert!(!tls_at(&t, 120));
        let mut r = report(200, 0);
        r.upstreams[0].tls = true;
        t.record(&mut r, at(125));
        assert!(tls_at(&t, 300));
    }

    #[test]
    fn a_peers_new_summary_takes_the_old_ones_place_at_once() {
        let here = Traffic::new(WIN);
        let t0 = Instant::now();
        for (n, at) in [(100, t0), (130, t0 + Duration::from_secs(5))] {
            for cluster in ["a", "b", "c", "d", "e", "f", "g", "h"] {
                let mut r = report(n, 1);
                r.cluster_name = cluster.into();
                here.record(&mut r, at);
            }
        }
        let now = t0 + Duration::from_secs(6);
        let summary = here.summary(now);
        assert_eq!(summary.len(), 8);
        let there = Traffic::new(WIN);
        there.set_remote("r1", &summary, now);
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..2_000 {
                    there.set_remote("r1", &summary, now);
                }
                done.store(true, Ordering::Relaxed);
            });
            let mut walks = 0;
            while !done.load(Ordering::Relaxed) || walks == 0 {
                // Walked twice, as a build walks the calls: the same summary.
                let view = there.view();
                for _ in 0..2 {
                    let mut seen = 0;
                    view.each(|_, _, c| seen += c.upstreams().len());
                    assert_eq!(seen, 8, "walk {walks}");
                }
                walks += 1;
            }
        });
    }

    #[test]
    fn counters_near_the_top_of_u64_saturate() {
        let t = Traffic::new(WIN);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        t.record(&mut report(0, 0), at(0));
        t.record(&mut report(u64::MAX, u64::MAX), at(5));
        let w = window(&t, at(5));
        let most = u64::from(u32::MAX);
        assert_eq!(
            (w.requests, w.errors, w.last_seen),
            (most, most, Some(at(5)))
        );
        let mut claimed = (0, 0);
        t.each(|_, _, c| claimed = c.upstreams()[0].claim());
        assert_eq!(claimed, (u64::MAX, u64::MAX));
        // A restart from near the top, then more on top of what is unclaimed.
        t.record(&mut report(u64::MAX - 1, u64::MAX - 1), at(10));
        t.record(&mut report(u64::MAX, u64::MAX), at(15));
        t.each(|_, _, c| claimed = c.upstreams()[0].claim());
        assert_eq!(claimed, (u64::MAX, u64::MAX));
        // Connect failures and 5xx answers add up to more than a u64.
        let mut both = report(u64::MAX, u64::MAX);
        both.upstreams[0].connect_fail_total = u64::MAX;
        t.record(&mut both, at(20));
        // A peer's summary with the largest figures.
        let mut summary = t.summary(at(20));
        summary[0].upstreams[0].requests = u64::MAX;
        summary[0].upstreams[0].errors = u64::MAX;
        let there = Traffic::new(WIN);
        there.set_remote("r1", &summary, at(20));
        let w = window(&there, at(20));
        assert_eq!((w.requests, w.errors), (most, most));
    }

    #[test]
    fn a_peers_summary_shows_as_the_same_figures() {
        let here = Traffic::new(WIN);
        let t0 = Instant::now();
        here.record(&mut report(100, 1), t0);
        here.record(&mut report(130, 4), t0 + Duration::from_secs(5));
        let now = t0 + Duration::from_secs(6);
        let summary = here.summary(now);
        assert_eq!(summary.len(), 1);
        assert_eq!(
            (
                summary[0].upstreams[0].requests,
                summary[0].upstreams[0].errors
            ),
            (30, 3)
        );
        assert_eq!(summary[0].upstreams[0].last_seen_ago_ms, Some(1000));
        // Through JSON, as it travels between replicas.
        let summary: Vec<ClusterTraffic> =
            serde_json::from_slice(&serde_json::to_vec(&summary).unwrap()).unwrap();
        let there = Traffic::new(WIN);
        there.set_remote("r1", &summary, now);
        let w = window(&there, now);
        assert_eq!((w.requests, w.errors), (30, 3));
        assert_eq!(w.last_seen, Some(t0 + Duration::from_secs(5)));
        assert_eq!(there.remote_peers(), ["r1"]);
        // A new summary replaces the old one; a peer that left is forgotten.
        there.set_remote("r1", &[], now);
        assert!(there.remote_peers().is_empty());
        there.set_remote("r1", &summary, now);
        there.forget_remote("r1");
        assert_eq!(clusters(&there), 0);
    }
}
