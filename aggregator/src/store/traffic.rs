//! What each instance's sidecar saw of its upstream clusters, over the graph window:
//! the differences between its reports' counters (a restarted sidecar counts from
//! zero again: its first counts are all new, never a negative spike), its latest
//! latency and TLS, the upstreams' host addresses, and its listeners. The graph
//! ([`crate::graph`]) is built from this and the registrations.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use meshcat_common::wire::{InstanceReport, ListenerRoutes};

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

/// One instance's traffic.
#[derive(Debug, Default)]
pub struct InstanceTraffic {
    pub local_cluster: Option<String>,
    pub listeners: Vec<ListenerRoutes>,
    pub upstreams: BTreeMap<String, UpstreamState>,
}

/// One upstream cluster of one instance.
#[derive(Debug, Default)]
pub struct UpstreamState {
    /// The counters of the last report: requests, and errors (5xx and connect
    /// failures).
    last: (u64, u64),
    /// (when, requests, errors) added by each report within the window.
    samples: VecDeque<(Instant, u64, u64)>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub tls: bool,
    /// The upstream's host addresses, as the sidecar's `/clusters` lists them.
    pub hosts: Vec<String>,
}

/// An upstream's figures over the window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Window {
    pub requests: u64,
    pub errors: u64,
    /// When the last report that added requests or errors arrived.
    pub last_seen: Option<Instant>,
}

impl UpstreamState {
    /// Requests and errors within `window` before `now`.
    pub fn window(&self, now: Instant, window: Duration) -> Window {
        let mut w = Window::default();
        for &(at, r, e) in &self.samples {
            if now.saturating_duration_since(at) <= window {
                w.requests += r;
                w.errors += e;
                if r + e > 0 {
                    w.last_seen = Some(at);
                }
            }
        }
        w
    }
}

/// The traffic of every instance that reported any, by (zone, cluster, instance).
#[derive(Debug, Default)]
pub struct Traffic {
    instances: DashMap<InstanceKey, InstanceTraffic>,
    /// Peers' summaries, one pseudo-instance per (zone, cluster, peer).
    remote: DashMap<InstanceKey, InstanceTraffic>,
}

impl Traffic {
    /// Takes one report in: adds each upstream's counter differences since the
    /// instance's previous report, dropping samples older than `window`. A report
    /// without upstreams and listeners (an agent older than the graph, or a sidecar
    /// that calls nothing) keeps nothing.
    pub fn record(&self, r: &InstanceReport, now: Instant, window: Duration) {
        let key = (
            r.zone_name.clone(),
            r.cluster_name.clone(),
            r.instance.clone(),
        );
        if r.upstreams.is_empty() && r.listeners.is_empty() && r.local_cluster.is_none() {
            self.instances.remove(&key);
            return;
        }
        let mut t = self.instances.entry(key).or_default();
        t.local_cluster = r
            .local_cluster
            .as_ref()
            .filter(|c| !c.is_empty() && c.len() <= MAX_NAME)
            .cloned();
        t.listeners = r
            .listeners
            .iter()
            .take(MAX_LISTENERS)
            .filter(|l| l.address.len() <= MAX_NAME)
            .map(|l| ListenerRoutes {
                address: l.address.clone(),
                clusters: l
                    .clusters
                    .iter()
                    .filter(|c| c.len() <= MAX_NAME)
                    .take(MAX_LISTENER_CLUSTERS)
                    .cloned()
                    .collect(),
            })
            .collect();
        let mut seen = Vec::with_capacity(r.upstreams.len());
        for u in r.upstreams.iter().take(MAX_UPSTREAMS) {
            if u.name.is_empty() || u.name.len() > MAX_NAME {
                continue;
            }
            seen.push(u.name.as_str());
            let totals = (
                u.requests_total,
                u.errors_5xx_total.saturating_add(u.connect_fail_total),
            );
            let fresh = !t.upstreams.contains_key(&u.name);
            let s = t.upstreams.entry(u.name.clone()).or_default();
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
            s.samples.push_back((now, added.0, added.1));
            while s
                .samples
                .front()
                .is_some_and(|(at, _, _)| now.saturating_duration_since(*at) > window)
            {
                s.samples.pop_front();
            }
            s.p50_ms = u.p50_ms.filter(|v| v.is_finite());
            s.p99_ms = u.p99_ms.filter(|v| v.is_finite());
            s.tls = u.tls;
            s.hosts = r
                .clusters
                .iter()
                .find(|c| c.name == u.name)
                .map(|c| {
                    c.hosts
                        .iter()
                        .take(MAX_HOSTS)
                        .filter(|h| h.address.len() <= MAX_NAME)
                        .map(|h| h.address.clone())
                        .collect()
                })
                .unwrap_or_default();
        }
        // An upstream the sidecar no longer lists (removed from its configuration)
        // carries nothing from now on.
        t.upstreams.retain(|name, _| seen.contains(&name.as_str()));
    }

    /// Forgets an instance (it left or expired).
    pub fn forget(&self, key: &InstanceKey) {
        self.instances.remove(key);
    }

    /// Calls `f` with every instance's traffic, this replica's and its peers'.
    pub fn each(&self, mut f: impl FnMut(&InstanceKey, &InstanceTraffic)) {
        for e in self.instances.iter().chain(self.remote.iter()) {
            f(e.key(), e.value());
        }
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
    pub hosts: Vec<String>,
}

impl UpstreamState {
    /// An upstream known only from a peer's summary received at `at`: its window
    /// figures as one sample at the time traffic was last seen.
    fn from_window(u: &UpstreamWindow, at: Instant) -> UpstreamState {
        let seen = u
            .last_seen_ago_ms
            .and_then(|ms| at.checked_sub(Duration::from_millis(ms)))
            .unwrap_or(at);
        UpstreamState {
            last: (0, 0),
            samples: VecDeque::from([(seen, u.requests, u.errors)]),
            p50_ms: u.p50_ms.filter(|v| v.is_finite()),
            p99_ms: u.p99_ms.filter(|v| v.is_finite()),
            tls: u.tls,
            hosts: u
                .hosts
                .iter()
                .take(MAX_HOSTS)
                .filter(|h| h.len() <= MAX_NAME)
                .cloned()
                .collect(),
        }
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
            for (name, u) in &t.upstreams {
                let w = u.window(now, window);
                let ago = w
                    .last_seen
                    .map(|at| now.saturating_duration_since(at).as_millis() as u64);
                match c.upstreams.iter_mut().find(|x| x.name == *name) {
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
                                x.hosts.push(h.clone());
                            }
                        }
                    }
                    None => c.upstreams.push(UpstreamWindow {
                        name: name.clone(),
                        requests: w.requests,
                        errors: w.errors,
                        last_seen_ago_ms: ago,
                        p50_ms: u.p50_ms,
                        p99_ms: u.p99_ms,
                        tls: u.tls,
                        hosts: u.hosts.clone(),
                    }),
                }
            }
        }
        by_cluster.into_values().collect()
    }

    /// Replaces what replica `peer` last said about its instances' traffic, received
    /// at `at`; each of its clusters shows in [`Traffic::each`] as one instance named
    /// after the peer.
    pub fn set_remote(&self, peer: &str, clusters: &[ClusterTraffic], at: Instant) {
        let instance = remote_instance(peer);
        self.remote.retain(|(_, _, i), _| *i != instance);
        for c in clusters {
            let t = InstanceTraffic {
                // The instances of one cluster name one local cluster (their
                // targets are alike); the inbound listeners' routes name it too.
                local_cluster: c
                    .local_clusters
                    .first()
                    .filter(|l| l.len() <= MAX_NAME)
                    .cloned(),
                listeners: c.listeners.iter().take(MAX_LISTENERS).cloned().collect(),
                upstreams: c
                    .upstreams
                    .iter()
                    .take(MAX_UPSTREAMS)
                    .filter(|u| !u.name.is_empty() && u.name.len() <= MAX_NAME)
                    .map(|u| (u.name.clone(), UpstreamState::from_window(u, at)))
                    .collect(),
            };
            self.remote.insert(
                (
                    c.zone_name.clone(),
                    c.cluster_name.clone(),
                    instance.clone(),
                ),
                t,
            );
        }
    }

    /// Forgets replica `peer`'s summary (it left).
    pub fn forget_remote(&self, peer: &str) {
        let instance = remote_instance(peer);
        self.remote.retain(|(_, _, i), _| *i != instance);
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

    /// The traffic this replica's agents reported, per cluster, for its peers.
    pub fn traffic_summary(&self, now: Instant) -> Vec<ClusterTraffic> {
        self.traffic.summary(now, self.graph_window())
    }

    /// The store's traffic, to take peers' summaries in.
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
        t.each(|_, i| w = i.upstreams["b"].window(now, Duration::from_secs(60)));
        w
    }

    #[test]
    fn counters_become_window_figures_and_a_restart_is_no_negative_spike() {
        let t = Traffic::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let win = Duration::from_secs(60);
        t.record(&report(100, 1), at(0), win);
        assert_eq!(
            window(&t, at(0)).requests,
            0,
            "nothing to take a difference from"
        );
        t.record(&report(130, 4), at(5), win);
        assert_eq!(
            (window(&t, at(5)).requests, window(&t, at(5)).errors),
            (30, 3)
        );
        // The sidecar restarted: its counters start again from zero.
        t.record(&report(7, 0), at(10), win);
        assert_eq!(
            (window(&t, at(10)).requests, window(&t, at(10)).errors),
            (37, 3)
        );
        // Past the window, the old samples no longer count.
        t.record(&report(7, 0), at(70), win);
        let w = window(&t, at(70));
        assert_eq!((w.requests, w.errors), (7, 0));
        assert_eq!(w.last_seen, Some(at(10)));
        // An agent older than the graph sends nothing: the instance is forgotten.
        t.record(
            &InstanceReport::unread("z".into(), "a".into(), "a-1".into()),
            at(71),
            win,
        );
        let mut n = 0;
        t.each(|_, _| n += 1);
        assert_eq!(n, 0);
    }

    #[test]
    fn a_peers_summary_shows_as_one_instance_with_the_same_figures() {
        let here = Traffic::default();
        let t0 = Instant::now();
        let win = Duration::from_secs(60);
        here.record(&report(100, 1), t0, win);
        here.record(&report(130, 4), t0 + Duration::from_secs(5), win);
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
        let mut n = 0;
        there.each(|_, _| n += 1);
        assert_eq!(n, 0);
    }
}
