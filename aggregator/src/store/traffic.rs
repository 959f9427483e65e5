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

mod bounds;
mod ring;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use meshcat_common::wire::{InstanceReport, ListenerRoutes, UpstreamTraffic};

use super::clusterset::ClusterSet;
use super::declared::Remaps;

pub use bounds::{DEFAULT_MAX_EDGES_PER_NODE, GraphMetrics, Item, OTHER, Refusal};
pub use ring::{AddressMap, Window, address_key};
use ring::{Clock, Ring};

use crate::ingest::InstanceKey;
use crate::store::peers::{Dropped, shown};
use meshcat_common::validate::is_valid_name;

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
    /// The sidecar's start time as its last report said: a counter that first
    /// appears in a later report of the same sidecar counted from zero.
    start_time_ms: i64,
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
    /// away another instance's count of the same address. [`ROLLED_UP`] with no
    /// hosts: the upstream is summed into its cluster's [`OTHER`] calls.
    counted: u64,
}

/// [`InstanceUpstream::counted`] of an upstream summed into [`OTHER`] (which keeps
/// no hosts).
const ROLLED_UP: u64 = u64::MAX;

impl InstanceUpstream {
    /// Whether it is summed into its cluster's [`OTHER`] calls.
    fn rolled_up(&self) -> bool {
        self.hosts.is_empty() && self.counted == ROLLED_UP
    }
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
    /// The upstreams past `--max-edges-per-node`, summed.
    other: Option<Box<Calls>>,
}

// A mesh has one per edge and one per instance's upstream: kept small.
#[cfg(target_pointer_width = "64")]
const _: () =
    assert!(std::mem::size_of::<Calls>() <= 200 && std::mem::size_of::<InstanceUpstream>() <= 56);

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
    /// Boxed rather than a vector: a mesh has one per edge, and hosts change
    /// seldom.
    hosts: Box<[(u64, u32)]>,
    /// Requests and errors added by reports since the graph's last build claimed
    /// them. Atomic because the build claims them while reading the calls shared
    /// with other readers; reports add to them under the map's write guard.
    unclaimed: [AtomicU64; 2],
}

/// The latency and TLS that the reports of one bucket said. A mesh has two per edge:
/// 16 bytes each.
#[derive(Debug, Clone, Copy, Default)]
struct Recent {
    /// The bucket plus one, wrapping ([`tag`]; 0: never written).
    bucket: u32,
    p50: Micros,
    p99: Micros,
    tls: bool,
}

/// Bucket `bucket` as a [`Recent`] keeps it: plus one, in 32 bits (wrapping after
/// 2^32 buckets, 680 years of the default window; only the last two are compared).
fn tag(bucket: u64) -> u32 {
    (bucket as u32).wrapping_add(1)
}

/// A latency in whole microseconds, plus one; 0 when unknown. Of two, the higher
/// is their `max`, whether known or not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Micros(u32);

impl Micros {
    /// Unknown.
    pub const NONE: Micros = Micros(0);

    /// `ms` milliseconds, to the microsecond; unknown when none, not finite or
    /// negative.
    pub fn from_ms(ms: Option<f64>) -> Micros {
        match ms {
            Some(v) if v.is_finite() && v >= 0.0 => {
                Micros((v * 1000.0).round().min(f64::from(u32::MAX - 1)) as u32 + 1)
            }
            _ => Micros::NONE,
        }
    }

    /// In milliseconds; none when unknown.
    pub fn ms(self) -> Option<f64> {
        (self.0 != 0).then(|| f64::from(self.0 - 1) / 1000.0)
    }
}

impl Calls {
    fn new(name: Arc<str>) -> Self {
        Calls {
            name,
            instances: 0,
            ring: Ring::default(),
            recent: [Recent::default(); RECENT_BUCKETS],
            tls: false,
            hosts: Box::default(),
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
    /// [`RECENT_BUCKETS`] buckets up to it (and any after it: reports that came in
    /// while a build that started before them runs).
    fn recent(&self, now_bucket: u64) -> impl Iterator<Item = &Recent> {
        let now = tag(now_bucket);
        self.recent.iter().filter(move |r| {
            r.bucket != 0 && (now.wrapping_sub(r.bucket) as i32) < RECENT_BUCKETS as i32
        })
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
        let (p50, p99) = self.latency_micros(now_bucket);
        (p50.ms(), p99.ms())
    }

    /// [`Calls::latency`] as the graph keeps it.
    pub fn latency_micros(&self, now_bucket: u64) -> (Micros, Micros) {
        self.recent(now_bucket)
            .fold((Micros::NONE, Micros::NONE), |(p50, p99), r| {
                (p50.max(r.p50), p99.max(r.p99))
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
        if slot.bucket != tag(clock.bucket) {
            *slot = Recent {
                bucket: tag(clock.bucket),
                ..Recent::default()
            };
        }
        slot.p50 = slot.p50.max(Micros::from_ms(p50));
        slot.p99 = slot.p99.max(Micros::from_ms(p99));
        slot.tls |= tls;
        self.tls = tls;
    }

    /// Counts an instance's `hosts` (at most [`MAX_HOSTS`]); answers which of them
    /// were counted, bit `i` for `hosts[i]`.
    fn add_hosts(&mut self, hosts: &[u64]) -> u64 {
        let mut counted = 0;
        let mut kept = std::mem::take(&mut self.hosts).into_vec();
        for (bit, h) in hosts.iter().take(MAX_HOSTS).enumerate() {
            match kept.binary_search_by_key(h, |(k, _)| *k) {
                Ok(i) => kept[i].1 += 1,
                Err(i) if kept.len() < MAX_CLUSTER_HOSTS => kept.insert(i, (*h, 1)),
                // One matching host is all the graph needs; past the bound, none is kept.
                Err(_) => continue,
            }
            counted |= 1 << bit;
        }
        self.hosts = kept.into_boxed_slice();
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
                    let mut kept = std::mem::take(&mut self.hosts).into_vec();
                    kept.remove(i);
                    self.hosts = kept.into_boxed_slice();
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

    /// The calls to the upstreams past `--max-edges-per-node`, summed as [`OTHER`].
    pub fn other(&self) -> Option<&Calls> {
        self.other.as_deref()
    }

    /// The calls an instance's upstream `u` is counted in.
    fn calls_of(&mut self, u: &InstanceUpstream) -> Option<&mut Calls> {
        if u.rolled_up() {
            return self.other.as_deref_mut();
        }
        self.calls_mut(&u.name)
    }

    /// An instance lists `name`, new to it, with `hosts`: it joins the cluster's
    /// calls to `name`, or, when the cluster calls `max` other upstreams already,
    /// those summed as [`OTHER`] (without hosts: their edge goes to
    /// `external:other`). Answers the instance's upstream, its counters at `last`.
    fn enter(
        &mut self,
        name: &str,
        hosts: Box<[u64]>,
        last: (u64, u64),
        max: usize,
    ) -> InstanceUpstream {
        let i = match self.upstreams.binary_search_by(|c| (*c.name).cmp(name)) {
            Ok(i) => i,
            Err(i) if self.upstreams.len() < max => {
                let shared = super::clusterset::NAMES.intern(name);
                self.upstreams.insert(i, Calls::new(shared));
                i
            }
            Err(_) => {
                let other = self
                    .other
                    .get_or_insert_with(|| Box::new(Calls::new(Arc::from(OTHER))));
                other.instances += 1;
                return InstanceUpstream {
                    name: super::clusterset::NAMES.intern(name),
                    last,
                    hosts: Box::default(),
                    counted: ROLLED_UP,
                };
            }
        };
        let c = &mut self.upstreams[i];
        c.instances += 1;
        let counted = c.add_hosts(&hosts);
        InstanceUpstream {
            name: c.name.clone(),
            last,
            hosts,
            counted,
        }
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
        if u.rolled_up() {
            if let Some(other) = &mut self.other {
                other.instances -= 1;
                if other.instances == 0 {
                    self.other = None;
                }
            }
            return;
        }
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

    /// Adds an instance's listener; whether its address is new to the cluster.
    fn add_listener(&mut self, key: u64, l: &ListenerRoutes) -> bool {
        let mut new = false;
        self.listeners
            .entry(key)
            .and_modify(|(_, count)| *count += 1)
            .or_insert_with(|| {
                new = true;
                (l.clone(), 1)
            });
        new
    }

    /// Takes an instance's listener out; whether its address went from the cluster.
    fn remove_listener(&mut self, key: u64) -> bool {
        if let Some((_, count)) = self.listeners.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                self.listeners.remove(&key);
                return true;
            }
        }
        false
    }

    /// Takes everything `t` added out (the instance left); whether a listener
    /// address went from the cluster.
    fn remove_instance(&mut self, t: &InstanceTraffic) -> bool {
        self.instances -= 1;
        if let Some(l) = &t.local_cluster {
            self.remove_local(l);
        }
        let mut gone = false;
        for key in &t.listener_keys {
            gone |= self.remove_listener(*key);
        }
        for u in &t.upstreams {
            self.leave(u);
        }
        gone
    }
}

/// One peer's summary: its clusters' calls, by (zone, cluster).
type PeerCalls = Vec<((String, String), ClusterCalls)>;

/// Per zone of a peer's summary, a digest of which cluster's sidecars listen at
/// which addresses (zones without listeners left out): what the mapping of the
/// zone's control server view takes from it.
fn listening_by_zone(summary: &PeerCalls) -> BTreeMap<String, u64> {
    use std::hash::{Hash, Hasher};
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for ((zone, cluster), calls) in summary {
        if calls.listeners.is_empty() {
            continue;
        }
        let digest = out.entry(zone.clone()).or_default();
        for key in calls.listeners.keys() {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (key, cluster).hash(&mut h);
            *digest = digest.wrapping_add(h.finish());
        }
    }
    out
}

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
    /// `--max-edges-per-node`: most upstreams a cluster's calls keep apart.
    max_edges: AtomicUsize,
    /// What the bounds refused or summed.
    metrics: GraphMetrics,
    /// Marked with a zone when a listener address of its clusters comes or goes:
    /// the zone's control server view is mapped by them.
    remaps: Arc<Remaps>,
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
            max_edges: AtomicUsize::new(DEFAULT_MAX_EDGES_PER_NODE),
            metrics: GraphMetrics::default(),
            remaps: Arc::default(),
        }
    }

    /// The same, marking `remaps` with the zones whose listener addresses change.
    pub(super) fn remapping(self, remaps: Arc<Remaps>) -> Self {
        Traffic { remaps, ..self }
    }

    /// The graph window (`--graph-window`).
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Sets `--max-edges-per-node` (at least 1), before reports come in: a
    /// cluster's calls then keep at most `max` upstreams apart, and a graph build
    /// draws at most as many observed edges from one node; the rest is summed into
    /// its `external:other` edge.
    pub fn set_max_edges_per_node(&self, max: usize) {
        self.max_edges.store(max.max(1), Ordering::Relaxed);
    }

    /// `--max-edges-per-node`.
    pub fn max_edges_per_node(&self) -> usize {
        self.max_edges.load(Ordering::Relaxed)
    }

    /// The counters of what the graph's bounds refused or summed.
    pub fn metrics(&self) -> &GraphMetrics {
        &self.metrics
    }

    /// The window bucket `now` falls in: the graph's figures change with time only
    /// when it moves (a bucket leaves the window).
    pub fn bucket(&self, now: Instant) -> u64 {
        Clock::at(self.epoch, now, self.window).bucket
    }

    /// Whether no cluster's calls are held, this replica's or a peer's: the window
    /// moving on then changes nothing the graph shows.
    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
            && self
                .remote
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .is_empty()
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
        let clusters = super::clusterset::ClusterSet::full(&r.clusters, |_| true);
        self.record_with(r, &clusters, now);
    }

    /// [`Self::record`] with the instance's upstream clusters (their hosts) given.
    /// A delta report (`r.delta`) lists only the upstreams whose figures changed:
    /// the others keep theirs, those it removes go, and its listeners stay when
    /// it says they are unchanged. Answers how many upstreams the instance keeps.
    pub fn record_with(&self, r: &mut InstanceReport, clusters: &ClusterSet, now: Instant) -> u32 {
        let window = self.window;
        let key = InstanceKey::of(r);
        let delta = r.delta.as_ref();
        let removed: std::collections::HashSet<&str> = delta
            .map(|d| d.removed_upstreams.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let listeners_kept = delta.is_some_and(|d| d.listeners_unchanged);
        let held = self.instances.contains_key(&key);
        let nothing = r.upstreams.is_empty() && r.listeners.is_empty() && r.local_cluster.is_none();
        if nothing && (delta.is_none() || !held) {
            self.forget(&key);
            return 0;
        }
        let mut incoming = std::mem::take(&mut r.upstreams);
        // The agent cuts a longer list to the busiest: an upstream of a list at the
        // bound may have been left out of the last report, and is no new counter.
        let truncated = incoming.len() >= MAX_UPSTREAMS;
        incoming.truncate(MAX_UPSTREAMS);
        incoming.retain(|u| self.metrics.name_ok(Item::Upstream, &u.name));
        incoming.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        incoming.dedup_by(|a, b| a.name == b.name);
        let mut listeners = std::mem::take(&mut r.listeners);
        listeners.truncate(MAX_LISTENERS);
        // Only the sidecar's own addresses: another workload's would draw its
        // callers' edges to this cluster.
        listeners.retain(|l| {
            if !self.metrics.name_ok(Item::Listener, &l.address) {
                return false;
            }
            let own = bounds::own_address(&r.admin_address, &l.address);
            if !own {
                self.metrics.refuse(Item::Listener, Refusal::NotOwnAddress);
            }
            own
        });
        for l in &mut listeners {
            l.clusters.retain(|c| self.metrics.name_ok(Item::Route, c));
            l.clusters.truncate(MAX_LISTENER_CLUSTERS);
        }
        let listener_keys: Box<[u64]> = listeners.iter().map(|l| address_key(&l.address)).collect();
        let local_cluster: Option<Arc<str>> = r
            .local_cluster
            .take()
            .filter(|c| self.metrics.name_ok(Item::LocalCluster, c))
            .map(Arc::from);
        // The hosts of each upstream, found by name (a sidecar may list thousands).
        let hosts_of = |name: &str| -> Box<[u64]> {
            clusters
                .hosts_of(name)
                .iter()
                .take(MAX_HOSTS)
                .copied()
                .collect()
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
        // A counter that first appears in a later report of the same sidecar
        // started from zero since the last one (Envoy lists a cluster's counters
        // from its first request); in the first report of an instance, or of a
        // sidecar restarted since, it is where differences start.
        let baseline = joined || truncated || t.start_time_ms != r.start_time_ms;
        t.start_time_ms = r.start_time_ms;
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
        let mut addresses_moved = false;
        if !listeners_kept
            && (t.listener_keys != listener_keys || t.listener_routes != listener_routes)
        {
            // An address taken out and put back is no move.
            for key in &t.listener_keys {
                if c.remove_listener(*key) && !listener_keys.contains(key) {
                    addresses_moved = true;
                }
            }
            for (key, l) in listener_keys.iter().zip(&listeners) {
                if c.add_listener(*key, l) && !t.listener_keys.contains(key) {
                    addresses_moved = true;
                }
            }
            reshaped = true;
        }
        if !listeners_kept {
            t.listener_keys = listener_keys;
            t.listener_routes = listener_routes;
        }
        // Both sorted by name: one walk pairs each upstream with its previous state.
        let mut previous = std::mem::take(&mut t.upstreams).into_iter().peekable();
        let mut upstreams = Vec::with_capacity(incoming.len());
        for u in incoming {
            while let Some(gone) = previous.next_if(|p| *p.name < *u.name) {
                if delta.is_some() && !removed.contains(&*gone.name) {
                    upstreams.push(gone);
                    continue;
                }
                c.leave(&gone);
                reshaped = true;
            }
            let hosts = hosts_of(&u.name);
            // Each failed attempt once: the agent counts connect failures into
            // the errors (docs/wire.md, "Upstream traffic").
            let totals = (u.requests_total, u.errors_total);
            match previous.next_if(|p| *p.name == *u.name) {
                // New to the instance: counted from zero, unless this report is
                // where differences start.
                None => {
                    let added = if baseline { (0, 0) } else { totals };
                    let p = c.enter(&u.name, hosts, totals, self.max_edges_per_node());
                    if p.rolled_up() {
                        self.metrics.roll_up();
                    }
                    let calls = c.calls_of(&p).expect("an upstream entered has calls");
                    if added.0 > 0 || added.1 > 0 {
                        calls.report(clock, now, added, &u);
                    } else {
                        calls.note(clock, u.p50_ms, u.p99_ms, u.tls);
                    }
                    upstreams.push(p);
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
                    let rolled_up = p.rolled_up();
                    let calls = c.calls_of(&p).expect("a listed upstream has calls");
                    if !rolled_up && hosts != p.hosts {
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
            if delta.is_some() && !removed.contains(&*gone.name) {
                upstreams.push(gone);
                continue;
            }
            c.leave(&gone);
            reshaped = true;
        }
        if reshaped {
            // Upstreams come and go rarely; a mesh has one of these per edge.
            c.upstreams.shrink_to_fit();
        }
        t.upstreams = upstreams;
        let kept = u32::try_from(t.upstreams.len()).unwrap_or(u32::MAX);
        drop(c);
        drop(t);
        if reshaped {
            self.reshaped();
        }
        if addresses_moved {
            self.remaps.moved(&r.zone_name);
        }
        kept
    }

    /// How many upstreams instance `key` would keep once a delta that sends `sent`
    /// and removes `removed` is applied: the held ones it neither sends nor removes,
    /// and the distinct ones it sends (before their names are checked, so never
    /// fewer than [`Self::record_with`] keeps).
    pub fn upstreams_after(
        &self,
        key: &InstanceKey,
        sent: &[UpstreamTraffic],
        removed: &[String],
    ) -> usize {
        let sent: std::collections::HashSet<&str> = sent.iter().map(|u| u.name.as_str()).collect();
        let removed: std::collections::HashSet<&str> = removed.iter().map(String::as_str).collect();
        let left = self.instances.get(key).map_or(0, |t| {
            t.upstreams
                .iter()
                .filter(|u| !sent.contains(&*u.name) && !removed.contains(&*u.name))
                .count()
        });
        left + sent.len()
    }

    /// Notes a change that could change the graph's shape (an instance's identity,
    /// which its edges' `tlsIdentity` reads, among them).
    pub(super) fn reshaped(&self) {
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
        let mut addresses_moved = false;
        if let Some(mut c) = self.clusters.get_mut(&cluster) {
            addresses_moved = c.remove_instance(&t);
        }
        self.clusters.remove_if(&cluster, |_, c| c.instances == 0);
        self.reshaped();
        if addresses_moved {
            self.remaps.moved(&key.zone);
        }
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
                    // The upstreams summed as `other` travel under that name.
                    upstreams: c
                        .upstreams
                        .iter()
                        .chain(c.other())
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
    /// at `at`: the new summary is checked like an agent's report ([`check_cluster`]:
    /// names, counts, lengths), made whole, then takes the old one's place at once.
    /// Answers the parts it dropped; the rest applies.
    pub fn set_remote(&self, peer: &str, clusters: &[ClusterTraffic], at: Instant) -> Vec<Dropped> {
        let window = self.window;
        let clock = Clock::at(self.epoch, at, window);
        let mut dropped = Vec::new();
        let mut listed = std::collections::HashSet::new();
        let mut summary: PeerCalls = Vec::with_capacity(clusters.len().min(MAX_PEER_CLUSTERS));
        for (i, c) in clusters.iter().enumerate() {
            if i == MAX_PEER_CLUSTERS {
                dropped.push(Dropped::new(
                    "too_many_clusters",
                    format!("{} clusters past the first {i}", clusters.len() - i),
                ));
                break;
            }
            if let Err(d) = check_cluster(c) {
                dropped.push(d);
                continue;
            }
            if !listed.insert((c.zone_name.as_str(), c.cluster_name.as_str())) {
                dropped.push(Dropped::new("duplicate", cluster_named(c)));
                continue;
            }
            let mut item = |what: &str, name: &str| {
                let ok = is_item_name(name);
                if !ok {
                    dropped.push(Dropped::new(
                        "invalid_item",
                        format!("{what} {} of {}", shown(name), cluster_named(c)),
                    ));
                }
                ok
            };
            let mut calls = ClusterCalls {
                instances: 1,
                ..ClusterCalls::default()
            };
            // The instances of one cluster name one local cluster (their targets
            // are alike); the inbound listeners' routes name it too.
            let mut locals = c.local_clusters.iter().filter(|l| item("local cluster", l));
            if let Some(l) = locals.next() {
                calls.add_local(&Arc::from(l.as_str()));
            }
            // The others are only checked.
            let _ = locals.count();
            for l in c.listeners.iter().take(MAX_LISTENERS) {
                if !item("listener", &l.address) {
                    continue;
                }
                let routes = ListenerRoutes {
                    address: l.address.clone(),
                    clusters: l
                        .clusters
                        .iter()
                        .filter(|n| item("listener route", n))
                        .cloned()
                        .collect(),
                };
                calls.add_listener(address_key(&l.address), &routes);
            }
            let mut names: Vec<&UpstreamWindow> = c
                .upstreams
                .iter()
                .filter(|u| item("upstream", &u.name))
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
                let latency = |ms: Option<f64>| ms.filter(|v| v.is_finite() && *v >= 0.0);
                x.note(clock, latency(u.p50_ms), latency(u.p99_ms), u.tls);
            }
            calls.upstreams.shrink_to_fit();
            summary.push(((c.zone_name.clone(), c.cluster_name.clone()), calls));
        }
        let listening = listening_by_zone(&summary);
        let old = {
            let mut remote = self.remote.write().unwrap_or_else(PoisonError::into_inner);
            if summary.is_empty() {
                remote.remove(peer)
            } else {
                remote.insert(peer.to_owned(), Arc::new(summary))
            }
        };
        // A summary is the peer's whole view, replaced each time: its shape is not
        // compared, it may have changed.
        self.reshaped();
        let before = old.as_deref().map(listening_by_zone).unwrap_or_default();
        for zone in before.keys().chain(listening.keys()) {
            if before.get(zone) != listening.get(zone) {
                self.remaps.moved(zone);
            }
        }
        dropped
    }

    /// Forgets replica `peer`'s summary (it left).
    pub fn forget_remote(&self, peer: &str) {
        let old = self
            .remote
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(peer);
        self.reshaped();
        for zone in old
            .as_deref()
            .map(listening_by_zone)
            .unwrap_or_default()
            .keys()
        {
            self.remaps.moved(zone);
        }
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

/// Most clusters taken from one peer's summary: a replica has no more calling
/// clusters than the instances it can hold.
const MAX_PEER_CLUSTERS: usize = super::MAX_INSTANCES as usize;

/// Whether `name` may stand in an upstream, listener or local cluster list, as in an
/// agent's report: not empty, at most [`MAX_NAME`] bytes.
fn is_item_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME
}

/// `zone/cluster` of a peer's cluster, for the log.
fn cluster_named(c: &ClusterTraffic) -> String {
    format!("cluster {}/{}", shown(&c.zone_name), shown(&c.cluster_name))
}

/// Checks one cluster of a peer's summary as the ingest checks an instance of a
/// report, the cluster standing for one instance: its zone and cluster names, then
/// the per-instance bounds (upstream clusters; hosts per upstream as a cluster keeps
/// them, clusters per listener route). A cluster that fails is dropped whole.
pub fn check_cluster(c: &ClusterTraffic) -> Result<(), Dropped> {
    if !is_valid_name(&c.zone_name) || !is_valid_name(&c.cluster_name) {
        return Err(Dropped::new("invalid_name", cluster_named(c)));
    }
    if c.upstreams.len() > MAX_UPSTREAMS {
        return Err(Dropped::new(
            "too_many_upstream_clusters",
            format!(
                "{} with {} upstream clusters, over {MAX_UPSTREAMS}",
                cluster_named(c),
                c.upstreams.len()
            ),
        ));
    }
    let hosts = c.upstreams.iter().map(|u| u.hosts.len()).max().unwrap_or(0);
    let routes = c
        .listeners
        .iter()
        .map(|l| l.clusters.len())
        .max()
        .unwrap_or(0);
    if hosts > MAX_CLUSTER_HOSTS || routes > MAX_LISTENER_CLUSTERS {
        return Err(Dropped::new(
            "too_many_upstream_hosts",
            format!(
                "{} with {hosts} hosts on an upstream (at most {MAX_CLUSTER_HOSTS}) or {routes} clusters on a listener (at most {MAX_LISTENER_CLUSTERS})",
                cluster_named(c)
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshcat_common::wire::{ReportedCluster, UpstreamTraffic};

    const WIN: Duration = Duration::from_secs(60);

    /// A report of instance `instance` of z/a calling `b` with these counters.
    fn report_of(instance: &str, requests: u64, errors: u64) -> InstanceReport {
        InstanceReport {
            upstreams: vec![UpstreamTraffic {
                name: "b".into(),
                requests_total: requests,
                errors_total: errors,
                connect_fail_total: 0,
                p50_ms: Some(1.5),
                p99_ms: None,
                tls: false,
            }],
            // The sidecar is reached at its own address, where it listens.
            admin_address: "10.0.0.1:15000".into(),
            ..InstanceReport::unread("z".into(), "a".into(), instance.into())
        }
    }

    fn report(requests: u64, errors: u64) -> InstanceReport {
        report_of("a-1", requests, errors)
    }

    fn listing(address: &str) -> ReportedCluster {
        ReportedCluster::healthy("b", vec![address.to_owned()])
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

    /// A report of `instance` of z/a calling each of `names` with `requests` so far.
    fn calling(instance: &str, names: &[&str], requests: u64) -> InstanceReport {
        let mut r = report_of(instance, requests, 0);
        let one = r.upstreams[0].clone();
        r.upstreams = names
            .iter()
            .map(|n| UpstreamTraffic {
                name: (*n).into(),
                ..one.clone()
            })
            .collect();
        r
    }

    /// The requests within the window of z/a's calls to `name`.
    fn requests_to(t: &Traffic, name: &str, now: Instant) -> Option<u64> {
        let mut found = None;
        t.each(|_, _, c| {
            found = c
                .upstreams()
                .iter()
                .find(|u| u.name() == name)
                .map(|u| t.window_of(u, now).requests);
        });
        found
    }

    #[test]
    fn the_first_burst_to_a_new_upstream_counts_from_zero() {
        let t = Traffic::new(WIN);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let listeners = vec![ListenerRoutes {
            address: "10.0.0.1:80".into(),
            clusters: vec!["local".into()],
        }];
        // Reported once before any request to b (Envoy lists a cluster's counters
        // from its first request), then with the 20 requests that made them.
        let mut quiet = calling("a-1", &[], 0);
        quiet.listeners = listeners.clone();
        quiet.start_time_ms = 1_000;
        t.record(&mut quiet, at(0));
        let mut burst = report(20, 2);
        burst.listeners = listeners.clone();
        burst.start_time_ms = 1_000;
        t.record(&mut burst, at(1));
        let w = window(&t, at(1));
        assert_eq!((w.requests, w.errors, w.last_seen), (20, 2, Some(at(1))));
        let mut claimed = (0, 0);
        t.each(|_, _, c| claimed = c.upstreams()[0].claim());
        assert_eq!(claimed, (20, 2), "the edge's counters too");
        // A new instance's first counters may be its sidecar's whole life: they are
        // where its differences start.
        let mut other = calling("a-2", &["c"], 500);
        other.start_time_ms = 1_000;
        t.record(&mut other, at(2));
        assert_eq!(requests_to(&t, "c", at(2)), Some(0));
        // So are those that first appear after the sidecar restarted.
        let mut restarted = calling("a-1", &["b", "d"], 7);
        restarted.listeners = listeners;
        restarted.start_time_ms = 90_000;
        t.record(&mut restarted, at(3));
        assert_eq!(requests_to(&t, "d", at(3)), Some(0));
        assert_eq!(requests_to(&t, "b", at(3)), Some(27), "b restarted from 0");
    }

    #[test]
    fn a_clusters_callees_past_the_bound_are_summed_as_other() {
        let t = Traffic::new(WIN);
        t.set_max_edges_per_node(2);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // a-1 calls b and c, all the bound lets a's calls keep apart; a-2 calls c
        // too, and d and e, which are summed.
        for (s, n) in [(0, 100), (5, 130)] {
            t.record(&mut calling("a-1", &["b", "c"], n), at(s));
            t.record(&mut calling("a-2", &["c", "d", "e"], n), at(s));
        }
        t.each(|_, _, c| {
            let names: Vec<&str> = c.upstreams().iter().map(Calls::name).collect();
            assert_eq!(names, ["b", "c"]);
            let other = c.other().expect("d and e summed");
            assert_eq!(other.name(), OTHER);
            assert!(other.hosts().next().is_none());
            assert_eq!(t.window_of(other, at(5)).requests, 60);
        });
        assert_eq!(
            requests_to(&t, "c", at(5)),
            Some(60),
            "both instances' calls"
        );
        assert_eq!(t.metrics().rolled_up(), 2);
        // A peer is told the sum under its name.
        let summary = t.summary(at(5));
        let names: Vec<&str> = summary[0]
            .upstreams
            .iter()
            .map(|u| u.name.as_str())
            .collect();
        assert_eq!(names, ["b", "c", OTHER]);
        // Another report of a-2 keeps its upstreams where they are; its leaving
        // takes the sum with it.
        t.record(&mut calling("a-2", &["c", "d", "e"], 140), at(6));
        assert_eq!(t.metrics().rolled_up(), 2);
        t.forget(&InstanceKey::new("z", "a", "a-2"));
        t.each(|_, _, c| {
            assert!(c.other().is_none());
            assert_eq!(c.upstreams().len(), 2);
        });
    }

    /// Only held calls make the window's moving on matter to the graph: none before
    /// the first report, some while an instance or a peer's summary has them.
    #[test]
    fn empty_while_no_calls_are_held() {
        let t = Traffic::new(WIN);
        assert!(t.is_empty());
        let now = Instant::now();
        t.record(&mut calling("a-1", &["b"], 10), now);
        assert!(!t.is_empty());
        let summary = t.summary(now);
        t.forget(&InstanceKey::new("z", "a", "a-1"));
        assert!(t.is_empty());
        t.set_remote("r1", &summary, now);
        assert!(!t.is_empty());
        t.forget_remote("r1");
        assert!(t.is_empty());
    }

    #[test]
    fn empty_and_over_long_names_are_refused_and_counted() {
        let t = Traffic::new(WIN);
        let long = "x".repeat(MAX_NAME + 1);
        let mut r = calling("a-1", &["b", "", &long], 10);
        r.listeners = vec![
            ListenerRoutes {
                address: String::new(),
                clusters: vec!["local".into()],
            },
            ListenerRoutes {
                address: "10.0.0.1:80".into(),
                clusters: vec![String::new(), "local".into(), long.clone()],
            },
        ];
        r.local_cluster = Some(String::new());
        t.record(&mut r, Instant::now());
        t.each(|_, _, c| {
            let names: Vec<&str> = c.upstreams().iter().map(Calls::name).collect();
            assert_eq!(names, ["b"]);
            let listeners: Vec<&ListenerRoutes> = c.listeners().map(|(_, l)| l).collect();
            assert_eq!(
                listeners,
                [&ListenerRoutes {
                    address: "10.0.0.1:80".into(),
                    clusters: vec!["local".into()],
                }]
            );
            assert_eq!(c.local_clusters().count(), 0);
        });
        let m = t.metrics();
        for (item, why) in [
            (Item::Upstream, Refusal::Empty),
            (Item::Upstream, Refusal::TooLong),
            (Item::Listener, Refusal::Empty),
            (Item::Route, Refusal::Empty),
            (Item::Route, Refusal::TooLong),
            (Item::LocalCluster, Refusal::Empty),
        ] {
            assert_eq!(m.refused(item, why), 1, "{item:?} {why:?}");
        }
    }

    #[test]
    fn a_sidecar_keeps_only_listeners_at_its_own_address() {
        let t = Traffic::new(WIN);
        // Reached at 10.0.0.1: it listens there, and claims another workload's
        // address, its loopback (where nobody else calls it) and a wildcard.
        let mut r = report(10, 0);
        r.listeners = [
            "10.0.0.1:80",
            "10.0.0.2:80",
            "127.0.0.1:15001",
            "0.0.0.0:80",
        ]
        .map(|a| ListenerRoutes {
            address: a.into(),
            clusters: vec!["local".into()],
        })
        .to_vec();
        t.record(&mut r, Instant::now());
        t.each(|_, _, c| {
            let keys: Vec<u64> = c.listeners().map(|(k, _)| k).collect();
            assert_eq!(keys, [address_key("10.0.0.1:80")]);
        });
        assert_eq!(
            t.metrics().refused(Item::Listener, Refusal::NotOwnAddress),
            3
        );
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
            r.clusters = vec![ReportedCluster::healthy("b", addresses.to_vec())];
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

    #[test]
    fn a_peers_summary_is_checked_like_a_report() {
        let here = Traffic::new(WIN);
        let t0 = Instant::now();
        here.record(&mut report(100, 1), t0);
        here.record(&mut report(130, 4), t0 + Duration::from_secs(5));
        let now = t0 + Duration::from_secs(6);
        let good = here.summary(now).remove(0);
        let upstream = |name: String| UpstreamWindow {
            name,
            ..good.upstreams[0].clone()
        };
        let named = |cluster: &str| ClusterTraffic {
            cluster_name: cluster.into(),
            ..good.clone()
        };
        let bad_name = named("a\u{1b}[2J");
        let mut wide = named("wide");
        wide.upstreams = (0..=MAX_UPSTREAMS)
            .map(|i| upstream(format!("u{i}")))
            .collect();
        let mut hosts = named("hosts");
        hosts.upstreams[0].hosts = (0..=MAX_CLUSTER_HOSTS as u64).collect();
        let mut items = named("items");
        items.local_clusters = vec![String::new(), "local-items".into()];
        items.listeners = vec![
            ListenerRoutes {
                address: String::new(),
                clusters: vec!["items".into()],
            },
            ListenerRoutes {
                address: "10.0.0.9:80".into(),
                clusters: vec!["items".into(), "r".repeat(MAX_NAME + 1)],
            },
        ];
        items.upstreams.push(upstream("u".repeat(MAX_NAME + 1)));
        items.upstreams.push(upstream(String::new()));
        items.upstreams[0].p50_ms = Some(-1.0);
        let summary = vec![good.clone(), bad_name, wide, hosts, items, good.clone()];
        // Through JSON, as it travels between replicas.
        let summary: Vec<ClusterTraffic> =
            serde_json::from_slice(&serde_json::to_vec(&summary).unwrap()).unwrap();
        let there = Traffic::new(WIN);
        let dropped = there.set_remote("r1", &summary, now);
        let reasons: Vec<&str> = dropped.iter().map(|d| d.reason).collect();
        assert_eq!(
            reasons,
            [
                "invalid_name",
                "too_many_upstream_clusters",
                "too_many_upstream_hosts",
                "invalid_item",
                "invalid_item",
                "invalid_item",
                "invalid_item",
                "invalid_item",
                "duplicate",
            ],
            "{dropped:?}"
        );
        // The log shows names escaped.
        assert!(dropped[0].what.contains(r#""a\u{1b}[2J""#), "{dropped:?}");
        // The rest applies: the good cluster as it was sent, and the valid parts of
        // the other.
        let mut seen = BTreeMap::new();
        there.each(|zone, cluster, c| {
            let upstreams: Vec<String> =
                c.upstreams().iter().map(|u| u.name().to_owned()).collect();
            let locals: Vec<String> = c.local_clusters().map(str::to_owned).collect();
            let listeners: Vec<ListenerRoutes> = c.listeners().map(|(_, l)| l.clone()).collect();
            let p50 = c.upstreams()[0].latency(there.bucket(now)).0;
            seen.insert(
                format!("{zone}/{cluster}"),
                (upstreams, locals, listeners, p50),
            );
        });
        assert_eq!(seen.keys().collect::<Vec<_>>(), ["z/a", "z/items"]);
        let items = &seen["z/items"];
        assert_eq!(items.0, ["b"]);
        assert_eq!(items.1, ["local-items"]);
        assert_eq!(
            items.2,
            [ListenerRoutes {
                address: "10.0.0.9:80".into(),
                clusters: vec!["items".into()],
            }]
        );
        assert_eq!(items.3, None, "a negative latency is none");
        assert_eq!(seen["z/a"].3, Some(1.5));
        let mut w = Window::default();
        there.each(|_, cluster, c| {
            if cluster == "a" {
                w = there.window_of(&c.upstreams()[0], now);
            }
        });
        assert_eq!((w.requests, w.errors), (30, 3));
    }
}
