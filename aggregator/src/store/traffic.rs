//! What each instance's sidecar saw of its upstream clusters, over the graph window:
//! the differences between its reports' counters (a restarted sidecar counts from
//! zero again: its first counts are all new, never a negative spike), its latest
//! latency and TLS, the upstreams' host addresses, and its listeners. The graph
//! ([`crate::graph`]) is built from this and the registrations.
//!
//! One upstream of one instance is one edge's share, and a mesh has many: its state
//! is kept small and of a fixed size whatever the report interval. The window is
//! kept as [`WINDOW_BUCKETS`] buckets of a twelfth of it each, so the figures over
//! the window are exact to one bucket (5 s of the default 60 s); host addresses are
//! kept as 64-bit hashes, which is all the graph compares them by.
//!
//! The same differences are also kept apart until the graph's next build claims
//! them ([`UpstreamState::claim`]): the build adds them to the edge they belong to,
//! which is how the edges' `meshcat_edge_*_total` counters only ever grow, whatever
//! instances come and go (see `docs/metrics.md`).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use meshcat_common::wire::{InstanceReport, ListenerRoutes, UpstreamCluster, UpstreamTraffic};

use super::instances::InstanceKey;

/// Most upstream clusters kept per instance (the agent sends at most as many).
const MAX_UPSTREAMS: usize = 4096;
/// Most listeners kept per instance, and clusters per listener.
const MAX_LISTENERS: usize = 256;
const MAX_LISTENER_CLUSTERS: usize = 1024;
/// Most host addresses kept per upstream cluster.
const MAX_HOSTS: usize = 64;
/// Longest upstream cluster name or address kept.
const MAX_NAME: usize = 512;
/// Buckets of the graph window.
pub const WINDOW_BUCKETS: usize = 12;

/// One instance's traffic.
#[derive(Debug, Default)]
pub struct InstanceTraffic {
    pub local_cluster: Option<String>,
    pub listeners: Vec<ListenerRoutes>,
    /// The listeners' addresses as [`address_key`]s, in the same order.
    pub listener_keys: Box<[u64]>,
    /// Sorted by name.
    pub upstreams: Vec<UpstreamState>,
}

/// One upstream cluster of one instance.
#[derive(Debug, Default)]
pub struct UpstreamState {
    pub name: Box<str>,
    /// The counters of the last report: requests, and errors (5xx and connect
    /// failures).
    last: (u64, u64),
    /// Requests and errors added by the reports of each bucket, bucket `n` at
    /// `n % WINDOW_BUCKETS`.
    buckets: [(u32, u32); WINDOW_BUCKETS],
    /// The newest bucket written; older ones within the ring are its predecessors.
    head: u64,
    /// When the last report that added requests or errors arrived.
    last_seen: Option<Instant>,
    /// Requests and errors added by reports since the graph's last build claimed
    /// them. Atomic because the build claims them while reading the traffic
    /// shared with other readers; reports add to them under the map's write guard.
    unclaimed: [AtomicU64; 2],
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub tls: bool,
    /// The upstream's host addresses, as the sidecar's `/clusters` lists them,
    /// hashed by [`address_key`].
    pub hosts: Box<[u64]>,
}

/// An upstream's figures over the window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Window {
    pub requests: u64,
    pub errors: u64,
    /// When the last report that added requests or errors arrived.
    pub last_seen: Option<Instant>,
}

/// The key a host or listener address is compared by.
pub fn address_key(address: &str) -> u64 {
    // Fixed keys: the same address hashes alike in every call of the process.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    address.hash(&mut h);
    h.finish()
}

/// Hashes an [`address_key`] as itself: the key already is a hash, and the graph
/// looks up every upstream host of every instance once a second.
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

/// A map keyed by [`address_key`]s.
pub type AddressMap<V> =
    std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// Where in the windows' buckets `now` falls: buckets are numbered from `epoch`.
#[derive(Debug, Clone, Copy)]
struct Clock {
    bucket: u64,
}

impl Clock {
    fn at(epoch: Instant, now: Instant, window: Duration) -> Self {
        let width = (window.as_millis() / WINDOW_BUCKETS as u128).max(1);
        Clock {
            bucket: (now.saturating_duration_since(epoch).as_millis() / width) as u64,
        }
    }
}

impl UpstreamState {
    /// Adds one report's requests and errors in the bucket of `clock`.
    fn add(&mut self, clock: Clock, now: Instant, requests: u64, errors: u64) {
        let n = WINDOW_BUCKETS as u64;
        if clock.bucket > self.head {
            // The buckets between the newest written and this one saw no report.
            for b in (self.head + 1).max(clock.bucket.saturating_sub(n - 1))..=clock.bucket {
                self.buckets[(b % n) as usize] = (0, 0);
            }
            self.head = clock.bucket;
        } else if self.head - clock.bucket >= n {
            // Older than the whole window (a report applied late).
            return;
        }
        let slot = &mut self.buckets[(clock.bucket % n) as usize];
        let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        slot.0 = slot.0.saturating_add(clamp(requests));
        slot.1 = slot.1.saturating_add(clamp(errors));
        if requests + errors > 0 {
            self.last_seen = Some(self.last_seen.map_or(now, |t| t.max(now)));
        }
    }

    /// Takes the requests and errors reported since the last claim. Each report's
    /// differences are claimed once, by one build of the graph.
    pub fn claim(&self) -> (u64, u64) {
        (
            self.unclaimed[0].swap(0, Ordering::Relaxed),
            self.unclaimed[1].swap(0, Ordering::Relaxed),
        )
    }

    /// Requests and errors within `window` before `now` (to one bucket), from the
    /// buckets numbered from `epoch`.
    pub fn window(&self, epoch: Instant, now: Instant, window: Duration) -> Window {
        let n = WINDOW_BUCKETS as u64;
        let now_bucket = Clock::at(epoch, now, window).bucket;
        let mut w = Window::default();
        let oldest = now_bucket.saturating_sub(n - 1);
        for b in oldest.max(self.head.saturating_sub(n - 1))..=self.head.min(now_bucket) {
            let (r, e) = self.buckets[(b % n) as usize];
            w.requests += u64::from(r);
            w.errors += u64::from(e);
        }
        w.last_seen = self
            .last_seen
            .filter(|at| Clock::at(epoch, *at, window).bucket >= oldest);
        w
    }
}

/// The traffic of every instance that reported any, by (zone, cluster, instance).
#[derive(Debug)]
pub struct Traffic {
    instances: DashMap<InstanceKey, InstanceTraffic>,
    /// Peers' summaries, one pseudo-instance per (zone, cluster, peer).
    remote: DashMap<InstanceKey, InstanceTraffic>,
    /// Where the windows' buckets are numbered from.
    epoch: Instant,
    /// Moves whenever a change could change the graph's shape: an instance's
    /// traffic appearing or going, an upstream, host, listener or local cluster
    /// coming or going, or traffic on an upstream idle over the window. Figures
    /// moving alone leave it (see [`Traffic::shape`]).
    shape: AtomicU64,
}

impl Default for Traffic {
    fn default() -> Self {
        Traffic {
            instances: DashMap::new(),
            remote: DashMap::new(),
            epoch: Instant::now(),
            shape: AtomicU64::new(0),
        }
    }
}

impl Traffic {
    /// Takes one report's graph fields (its upstreams, listeners and local cluster,
    /// moved out of the report): adds each upstream's counter differences since the
    /// instance's previous report. A report without them (an agent older than the
    /// graph, or a sidecar that calls nothing) keeps nothing.
    pub fn record(&self, r: &mut InstanceReport, now: Instant, window: Duration) {
        let key = (
            r.zone_name.clone(),
            r.cluster_name.clone(),
            r.instance.clone(),
        );
        if r.upstreams.is_empty() && r.listeners.is_empty() && r.local_cluster.is_none() {
            if self.instances.remove(&key).is_some() {
                self.reshaped();
            }
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
        let local_cluster = r
            .local_cluster
            .take()
            .filter(|c| !c.is_empty() && c.len() <= MAX_NAME);
        let clock = Clock::at(self.epoch, now, window);
        let listener_keys: Box<[u64]> = listeners.iter().map(|l| address_key(&l.address)).collect();
        let mut reshaped = false;
        let mut t = self.instances.entry(key).or_insert_with(|| {
            reshaped = true;
            InstanceTraffic::default()
        });
        reshaped |= t.local_cluster != local_cluster
            || t.listener_keys != listener_keys
            || t.listeners
                .iter()
                .map(|l| &l.clusters)
                .ne(listeners.iter().map(|l| &l.clusters));
        t.local_cluster = local_cluster;
        t.listener_keys = listener_keys;
        t.listeners = listeners;
        // Both sorted by name: one walk pairs each upstream with its previous state.
        // An upstream the sidecar no longer lists (removed from its configuration) is
        // dropped: it carries nothing from now on.
        let mut previous = std::mem::take(&mut t.upstreams).into_iter().peekable();
        // The hosts of each upstream, found by name (a sidecar may list thousands).
        let mut listed: Vec<&UpstreamCluster> = r.clusters.iter().collect();
        listed.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let mut upstreams = Vec::with_capacity(incoming.len());
        for u in incoming {
            while previous.next_if(|p| *p.name < *u.name).is_some() {
                reshaped = true;
            }
            let state = previous.next_if(|p| *p.name == *u.name);
            let hosts = listed
                .binary_search_by(|c| c.name.as_str().cmp(&u.name))
                .ok()
                .map(|i| listed[i]);
            let (state, changed) = self.update(state, u, hosts, clock, now, window);
            reshaped |= changed;
            upstreams.push(state);
        }
        reshaped |= previous.next().is_some();
        t.upstreams = upstreams;
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

    /// An upstream's state after one report, and whether the report could change
    /// the graph's shape (a new upstream, other hosts, or traffic on an upstream
    /// idle over the window).
    fn update(
        &self,
        state: Option<UpstreamState>,
        u: UpstreamTraffic,
        listed: Option<&UpstreamCluster>,
        clock: Clock,
        now: Instant,
        window: Duration,
    ) -> (UpstreamState, bool) {
        let totals = (
            u.requests_total,
            u.errors_5xx_total.saturating_add(u.connect_fail_total),
        );
        let fresh = state.is_none();
        let mut s = state.unwrap_or_else(|| UpstreamState {
            name: u.name.into_boxed_str(),
            ..UpstreamState::default()
        });
        let added = if fresh {
            // Nothing to take a difference from: counted from the next report.
            (0, 0)
        } else if totals.0 < s.last.0 || totals.1 < s.last.1 {
            // The sidecar restarted: all it counted since is new.
            totals
        } else {
            (totals.0 - s.last.0, totals.1 - s.last.1)
        };
        s.last = totals;
        let mut reshaped = fresh;
        if added.0 + added.1 > 0 {
            let w = s.window(self.epoch, now, window);
            reshaped |= w.requests + w.errors == 0;
        }
        s.add(clock, now, added.0, added.1);
        for (slot, n) in s.unclaimed.iter_mut().zip([added.0, added.1]) {
            let v = slot.get_mut();
            *v = v.saturating_add(n);
        }
        s.p50_ms = u.p50_ms.filter(|v| v.is_finite());
        s.p99_ms = u.p99_ms.filter(|v| v.is_finite());
        s.tls = u.tls;
        if let Some(c) = listed {
            let hosts = c
                .hosts
                .iter()
                .filter(|h| h.address.len() <= MAX_NAME)
                .take(MAX_HOSTS)
                .map(|h| address_key(&h.address));
            if !hosts.clone().eq(s.hosts.iter().copied()) {
                s.hosts = hosts.collect();
                reshaped = true;
            }
        } else if !s.hosts.is_empty() {
            s.hosts = Box::default();
            reshaped = true;
        }
        (s, reshaped)
    }

    /// Forgets an instance (it left or expired).
    pub fn forget(&self, key: &InstanceKey) {
        if self.instances.remove(key).is_some() {
            self.reshaped();
        }
    }

    /// Calls `f` with every instance's traffic, this replica's and its peers'.
    pub fn each(&self, mut f: impl FnMut(&InstanceKey, &InstanceTraffic)) {
        for e in self.instances.iter().chain(self.remote.iter()) {
            f(e.key(), e.value());
        }
    }

    /// Where the windows' buckets are numbered from, for [`UpstreamState::window`].
    pub fn epoch(&self) -> Instant {
        self.epoch
    }
}

/// What one replica's agents saw of one cluster's calls over the window, summed
/// over the instances that report to it: what a peer needs to draw the same graph
/// (`GET /peer/traffic`). Figures are over the window, not counters.
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

impl UpstreamState {
    /// An upstream known only from a peer's summary received at `at`: its window
    /// figures in the bucket of the time traffic was last seen. It has nothing to
    /// claim: the peer's own edge counters count that traffic.
    fn from_window(u: &UpstreamWindow, epoch: Instant, at: Instant, window: Duration) -> Self {
        let seen = u
            .last_seen_ago_ms
            .and_then(|ms| at.checked_sub(Duration::from_millis(ms)))
            .unwrap_or(at);
        let mut s = UpstreamState {
            name: u.name.clone().into_boxed_str(),
            p50_ms: u.p50_ms.filter(|v| v.is_finite()),
            p99_ms: u.p99_ms.filter(|v| v.is_finite()),
            tls: u.tls,
            hosts: u.hosts.iter().take(MAX_HOSTS).copied().collect(),
            ..UpstreamState::default()
        };
        s.add(Clock::at(epoch, seen, window), seen, u.requests, u.errors);
        s
    }
}

impl Traffic {
    /// The traffic of the instances that report to this replica, per cluster, over
    /// `window` before `now`; peers' summaries are not included.
    pub fn summary(&self, now: Instant, window: Duration) -> Vec<ClusterTraffic> {
        let mut by_cluster: BTreeMap<(String, String), ClusterTraffic> = BTreeMap::new();
        for e in self.instances.iter() {
            let (zone, cluster, _) = e.key();
            let t = e.value();
            let c = by_cluster
                .entry((zone.clone(), cluster.clone()))
                .or_insert_with(|| ClusterTraffic {
                    zone_name: zone.clone(),
                    cluster_name: cluster.clone(),
                    local_clusters: Vec::new(),
                    listeners: Vec::new(),
                    upstreams: Vec::new(),
                });
            if let Some(local) = &t.local_cluster
                && !c.local_clusters.contains(local)
            {
                c.local_clusters.push(local.clone());
            }
            for l in &t.listeners {
                if !c.listeners.contains(l) {
                    c.listeners.push(l.clone());
                }
            }
            for u in &t.upstreams {
                let name = &*u.name;
                let w = u.window(self.epoch, now, window);
                let ago = w
                    .last_seen
                    .map(|at| now.saturating_duration_since(at).as_millis() as u64);
                match c.upstreams.iter_mut().find(|x| x.name == name) {
                    Some(x) => {
                        x.requests += w.requests;
                        x.errors += w.errors;
                        x.last_seen_ago_ms = match (x.last_seen_ago_ms, ago) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                        x.p50_ms = max_opt(x.p50_ms, u.p50_ms);
                        x.p99_ms = max_opt(x.p99_ms, u.p99_ms);
                        x.tls |= u.tls;
                        for h in &u.hosts {
                            if x.hosts.len() < MAX_HOSTS && !x.hosts.contains(h) {
                                x.hosts.push(*h);
                            }
                        }
                    }
                    None => c.upstreams.push(UpstreamWindow {
                        name: name.to_owned(),
                        requests: w.requests,
                        errors: w.errors,
                        last_seen_ago_ms: ago,
                        p50_ms: u.p50_ms,
                        p99_ms: u.p99_ms,
                        tls: u.tls,
                        hosts: u.hosts.to_vec(),
                    }),
                }
            }
        }
        by_cluster.into_values().collect()
    }

    /// Replaces what replica `peer` last said about its instances' traffic, received
    /// at `at`; each of its clusters shows in [`Traffic::each`] as one instance named
    /// after the peer.
    pub fn set_remote(
        &self,
        peer: &str,
        clusters: &[ClusterTraffic],
        at: Instant,
        window: Duration,
    ) {
        let instance = remote_instance(peer);
        self.remote.retain(|(_, _, i), _| *i != instance);
        for c in clusters {
            let mut t = InstanceTraffic {
                // The instances of one cluster name one local cluster (their
                // targets are alike); the inbound listeners' routes name it too.
                local_cluster: c
                    .local_clusters
                    .first()
                    .filter(|l| l.len() <= MAX_NAME)
                    .cloned(),
                listeners: c.listeners.iter().take(MAX_LISTENERS).cloned().collect(),
                listener_keys: Box::default(),
                upstreams: c
                    .upstreams
                    .iter()
                    .take(MAX_UPSTREAMS)
                    .filter(|u| !u.name.is_empty() && u.name.len() <= MAX_NAME)
                    .map(|u| UpstreamState::from_window(u, self.epoch, at, window))
                    .collect(),
            };
            t.upstreams.sort_unstable_by(|a, b| a.name.cmp(&b.name));
            t.upstreams.dedup_by(|a, b| a.name == b.name);
            t.listener_keys = t
                .listeners
                .iter()
                .map(|l| address_key(&l.address))
                .collect();
            self.remote.insert(
                (
                    c.zone_name.clone(),
                    c.cluster_name.clone(),
                    instance.clone(),
                ),
                t,
            );
        }
        // A summary is the peer's whole view, replaced each time: its shape is not
        // compared, it may have changed.
        self.reshaped();
    }

    /// Forgets replica `peer`'s summary (it left).
    pub fn forget_remote(&self, peer: &str) {
        let instance = remote_instance(peer);
        self.remote.retain(|(_, _, i), _| *i != instance);
        self.reshaped();
    }

    /// The peers whose summaries are held.
    pub fn remote_peers(&self) -> Vec<String> {
        let mut peers: Vec<String> = self
            .remote
            .iter()
            .filter_map(|e| e.key().2.strip_prefix(REMOTE_PREFIX).map(str::to_owned))
            .collect();
        peers.sort();
        peers.dedup();
        peers
    }
}

/// Instance names of peers' summaries start with this, which no agent's instance
/// name can (names are letters, digits, `.`, `_` and `-`).
const REMOTE_PREFIX: &str = "@replica:";

fn remote_instance(peer: &str) -> String {
    format!("{REMOTE_PREFIX}{peer}")
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// One (zone, cluster) as the graph shows it.
#[derive(Debug, Clone)]
pub struct ClusterFacts {
    pub zone: String,
    pub cluster: String,
    pub registered: bool,
    pub status: meshcat_common::model::Status,
    pub owner: String,
    /// Live instances.
    pub instances: u64,
    /// Declared dependencies as (zone, cluster).
    pub dependencies: Vec<(String, String)>,
    /// Whether its live instances run different configurations.
    pub drifted: bool,
}

impl super::Store {
    /// Every known (zone, cluster): registered, or with reported instances.
    pub fn cluster_facts(&self) -> Vec<ClusterFacts> {
        let mut out = Vec::new();
        for by_zone in self.clusters.iter() {
            for (zone, e) in by_zone.iter() {
                let registered = e.record.is_some() && self.zones.contains_key(zone);
                if !registered && e.instances.is_empty() {
                    continue;
                }
                let record = e.record.as_ref().filter(|_| registered);
                out.push(ClusterFacts {
                    zone: zone.clone(),
                    cluster: by_zone.key().clone(),
                    registered,
                    status: e.status,
                    owner: record.map(|r| r.owner.clone()).unwrap_or_default(),
                    instances: e.live,
                    drifted: super::drift::drifted(e.instances.values()),
                    dependencies: record
                        .map(|r| {
                            r.dependencies
                                .iter()
                                .filter_map(|d| meshcat_common::validate::dependency(zone, d))
                                .map(|(z, c)| (z.to_owned(), c.to_owned()))
                                .collect()
                        })
                        .unwrap_or_default(),
                });
            }
        }
        out
    }

    /// Calls `f` with every instance's traffic.
    pub fn each_traffic(&self, f: impl FnMut(&InstanceKey, &InstanceTraffic)) {
        self.traffic.each(f);
    }

    /// See [`Traffic::shape`].
    pub fn traffic_shape(&self) -> u64 {
        self.traffic.shape()
    }

    /// The window bucket `now` falls in: the graph's figures change with time only
    /// when it moves (a bucket leaves the window).
    pub fn graph_bucket(&self, now: Instant) -> u64 {
        Clock::at(self.traffic.epoch(), now, self.rules.graph_window).bucket
    }

    /// An upstream's figures over the graph window before `now`.
    pub fn traffic_window(&self, u: &UpstreamState, now: Instant) -> Window {
        u.window(self.traffic.epoch(), now, self.rules.graph_window)
    }

    /// The traffic this replica's agents reported, per cluster, for its peers.
    pub fn traffic_summary(&self, now: Instant) -> Vec<ClusterTraffic> {
        self.traffic.summary(now, self.graph_window())
    }

    /// Takes replica `peer`'s summary in, received at `at`.
    pub fn set_remote_traffic(&self, peer: &str, clusters: &[ClusterTraffic], at: Instant) {
        self.traffic
            .set_remote(peer, clusters, at, self.graph_window());
    }

    /// The store's traffic.
    pub fn traffic(&self) -> &Traffic {
        &self.traffic
    }

    /// The graph window (`--graph-window`).
    pub fn graph_window(&self) -> Duration {
        self.rules.graph_window
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshcat_common::wire::UpstreamTraffic;

    fn report(requests: u64, errors: u64) -> InstanceReport {
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
            ..InstanceReport::unread("z".into(), "a".into(), "a-1".into())
        }
    }

    fn window(t: &Traffic, now: Instant) -> Window {
        let mut w = Window::default();
        t.each(|_, i| w = i.upstreams[0].window(t.epoch(), now, Duration::from_secs(60)));
        w
    }

    #[test]
    fn counters_become_window_figures_and_a_restart_is_no_negative_spike() {
        let t = Traffic::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let win = Duration::from_secs(60);
        t.record(&mut report(100, 1), at(0), win);
        assert_eq!(
            window(&t, at(0)).requests,
            0,
            "nothing to take a difference from"
        );
        t.record(&mut report(130, 4), at(5), win);
        assert_eq!(
            (window(&t, at(5)).requests, window(&t, at(5)).errors),
            (30, 3)
        );
        // The sidecar restarted: its counters start again from zero.
        t.record(&mut report(7, 0), at(10), win);
        assert_eq!(
            (window(&t, at(10)).requests, window(&t, at(10)).errors),
            (37, 3)
        );
        // The window is kept in twelve buckets of 5 s: a sample counts until its
        // bucket leaves the window.
        t.record(&mut report(7, 0), at(65), win);
        let w = window(&t, at(65));
        assert_eq!((w.requests, w.errors, w.last_seen), (7, 0, Some(at(10))));
        t.record(&mut report(7, 0), at(70), win);
        let w = window(&t, at(70));
        assert_eq!((w.requests, w.errors, w.last_seen), (0, 0, None));
        // An agent older than the graph sends nothing: the instance is forgotten.
        t.record(
            &mut InstanceReport::unread("z".into(), "a".into(), "a-1".into()),
            at(71),
            win,
        );
        let mut n = 0;
        t.each(|_, _| n += 1);
        assert_eq!(n, 0);
    }

    #[test]
    fn the_shape_moves_with_what_can_change_an_edge_and_not_with_figures() {
        let t = Traffic::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let win = Duration::from_secs(60);
        let mut moved = {
            let mut last = t.shape();
            move |t: &Traffic| {
                let now = t.shape();
                let m = now != last;
                last = now;
                m
            }
        };
        t.record(&mut report(100, 1), at(0), win);
        assert!(moved(&t), "a new instance and upstream");
        t.record(&mut report(130, 1), at(5), win);
        assert!(moved(&t), "traffic on an idle upstream");
        t.record(&mut report(160, 2), at(10), win);
        assert!(!moved(&t), "figures alone");
        t.record(&mut report(160, 2), at(15), win);
        assert!(!moved(&t), "no traffic");
        let mut with_hosts = report(190, 2);
        with_hosts.clusters = vec![UpstreamCluster {
            name: "b".into(),
            added_via_api: false,
            hosts: vec![meshcat_common::wire::UpstreamHost {
                address: "10.0.0.2:80".into(),
                cx_active: 0,
                cx_connect_fail: 0,
                cx_total: 0,
                rq_active: 0,
                rq_error: 0,
                rq_total: 0,
                health_flags: "healthy".into(),
            }],
        }];
        t.record(&mut with_hosts, at(20), win);
        assert!(moved(&t), "other hosts");
        let mut with_listener = report(220, 2);
        with_listener.clusters = with_hosts.clusters.clone();
        with_listener.listeners = vec![ListenerRoutes {
            address: "10.0.0.1:80".into(),
            clusters: vec!["local".into()],
        }];
        t.record(&mut with_listener, at(25), win);
        assert!(moved(&t), "a listener");
        let mut other = report(10, 0);
        other.upstreams[0].name = "c".into();
        other.clusters = with_hosts.clusters.clone();
        other.listeners = with_listener.listeners.clone();
        t.record(&mut other, at(30), win);
        assert!(moved(&t), "an upstream gone and another new");
        t.forget(&("z".into(), "a".into(), "a-1".into()));
        assert!(moved(&t), "the instance gone");
        t.forget(&("z".into(), "a".into(), "a-1".into()));
        assert!(!moved(&t), "nothing more to forget");
    }

    #[test]
    fn a_peers_summary_shows_as_one_instance_with_the_same_figures() {
        let here = Traffic::default();
        let t0 = Instant::now();
        let win = Duration::from_secs(60);
        here.record(&mut report(100, 1), t0, win);
        here.record(&mut report(130, 4), t0 + Duration::from_secs(5), win);
        let now = t0 + Duration::from_secs(6);
        let summary = here.summary(now, win);
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
        let there = Traffic::default();
        there.set_remote("r1", &summary, now, win);
        let w = window(&there, now);
        assert_eq!((w.requests, w.errors), (30, 3));
        assert_eq!(w.last_seen, Some(t0 + Duration::from_secs(5)));
        assert_eq!(there.remote_peers(), ["r1"]);
        // A new summary replaces the old one; a peer that left is forgotten.
        there.set_remote("r1", &[], now, win);
        assert!(there.remote_peers().is_empty());
        there.set_remote("r1", &summary, now, win);
        there.forget_remote("r1");
        let mut n = 0;
        there.each(|_, _| n += 1);
        assert_eq!(n, 0);
    }
}
