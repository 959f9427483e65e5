//! Live instances: the snapshots agents report, which agent reports each instance
//! (the one owner of that fact: the ingest routes commands by asking here), the
//! instance budget, expiry past the TTL, the edge clusters reported per zone, and the
//! [`Membership`] seam where a replica publishes the instances it owns.

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use dashmap::DashMap;
use meshcat_common::model::InstanceMetrics;
use meshcat_common::validate::is_valid_name;
use meshcat_common::wire::InstanceReport;
use tracing::{debug, warn};

use super::read::MetricsLookup;
use super::{Entry, MAX_EDGE_CLUSTERS, Store, lock};

/// Most reported instances kept at once: reports for further new instances are
/// dropped (and logged) until others expire, so no set of agents can exhaust memory.
pub const MAX_INSTANCES: u64 = 200_000;

/// Identifies one reported instance: (zone, cluster, instance).
pub(super) type InstanceKey = (String, String, String);

/// One instance as its agent last reported it.
#[derive(Debug, Clone)]
pub struct LiveInstance {
    /// The agent that reports it; `agent_gone` drops only that agent's instances.
    pub agent_id: String,
    /// When the last report arrived, for the TTL.
    pub last_seen: Instant,
    /// Requests in the window between the last two reports.
    pub window_requests: u64,
    /// 5xx answers in the same window.
    pub window_errors: u64,
    /// The last report itself (metrics, upstream clusters, admin address).
    pub report: Arc<InstanceReport>,
}

impl LiveInstance {
    /// Live: reported within the TTL (expiry removes the others) and reachable.
    pub fn is_live(&self) -> bool {
        self.report.reachable
    }
}

/// An instance this replica owns, as published to its peers.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    pub zone: &'a str,
    pub cluster: &'a str,
    pub instance: &'a str,
    pub agent_id: &'a str,
    pub start_time_ms: i64,
    pub reachable: bool,
    pub window_requests: u64,
    pub window_errors: u64,
}

/// Where a replica publishes instance membership so that replicas sharing a backend
/// show the same instances. A single aggregator has none.
pub trait Membership: Send + Sync + fmt::Debug {
    /// An owned instance was reported (new, or with new status inputs).
    fn publish(&self, member: Member<'_>);
    /// An owned instance is gone (expired, or its agent left).
    fn withdraw(&self, zone: &str, cluster: &str, instance: &str);
}

/// Who reports what.
#[derive(Debug, Default)]
pub(super) struct Live {
    /// The instances each agent reports, so `agent_gone` visits only those.
    agents: DashMap<String, HashSet<InstanceKey>>,
    /// Reported instances kept (live or not), bounded by [`MAX_INSTANCES`].
    total: AtomicU64,
    /// Where owned instances are published, when replicas share them.
    membership: OnceLock<Arc<dyn Membership>>,
}

impl Store {
    /// Publishes owned instances through `m` from now on (set once).
    pub fn set_membership(&self, m: Arc<dyn Membership>) -> Result<(), Arc<dyn Membership>> {
        self.live.membership.set(m)
    }

    /// Records one instance snapshot from an agent; its names were validated by the
    /// ingest. Reports for clusters nobody registered are kept too: they show in
    /// `GET /services`.
    pub fn apply_report(&self, agent_id: &str, report: InstanceReport, now: Instant) {
        let key: InstanceKey = (
            report.zone_name.clone(),
            report.cluster_name.clone(),
            report.instance.clone(),
        );
        let _st = lock(&self.state);
        let known = self.clusters.get(&key.1).is_some_and(|m| {
            m.get(&key.0)
                .is_some_and(|e| e.instances.contains_key(&key.2))
        });
        if !known {
            if self.live.total.load(Ordering::Acquire) >= MAX_INSTANCES {
                warn!(%agent_id, zone = %key.0, cluster = %key.1, instance = %key.2, limit = MAX_INSTANCES, "Instance report dropped: too many instances.");
                return;
            }
            self.live.total.fetch_add(1, Ordering::AcqRel);
        }
        let (visible, previous_agent, change) = {
            let mut by_zone = self.clusters.entry(key.1.clone()).or_default();
            let e = by_zone.entry(key.0.clone()).or_insert_with(Entry::new);
            let prev = e.instances.get(&key.2);
            let (window_requests, window_errors) = match prev {
                Some(p) if report.requests_total >= p.report.requests_total => (
                    report.requests_total - p.report.requests_total,
                    report
                        .errors_5xx_total
                        .saturating_sub(p.report.errors_5xx_total),
                ),
                // A restarted sidecar counts from zero again: all it counted is new.
                Some(_) => (report.requests_total, report.errors_5xx_total),
                None => (0, 0),
            };
            let visible = match prev {
                None => report.reachable,
                Some(p) => {
                    p.report.reachable != report.reachable
                        || p.report.start_time_ms != report.start_time_ms
                }
            };
            let previous_agent = prev
                .filter(|p| p.agent_id != agent_id)
                .map(|p| p.agent_id.clone());
            if let Some(m) = self.live.membership.get() {
                m.publish(Member {
                    zone: &key.0,
                    cluster: &key.1,
                    instance: &key.2,
                    agent_id,
                    start_time_ms: report.start_time_ms,
                    reachable: report.reachable,
                    window_requests,
                    window_errors,
                });
            }
            e.instances.insert(
                key.2.clone(),
                LiveInstance {
                    agent_id: agent_id.to_owned(),
                    last_seen: now,
                    window_requests,
                    window_errors,
                    report: Arc::new(report),
                },
            );
            let before = self.refresh(e);
            let change = e.record.is_some().then_some((before, (e.status, e.live)));
            (visible || before.0 != e.status, previous_agent, change)
        };
        if let Some(other) = previous_agent
            && let Some(mut keys) = self.live.agents.get_mut(&other)
        {
            keys.remove(&key);
        }
        if let Some((before, after)) = change {
            self.count_change(&key.0, before, after);
        }
        self.live
            .agents
            .entry(agent_id.to_owned())
            .or_default()
            .insert(key);
        if visible {
            self.bump();
        }
    }

    /// Drops an agent's instances at once (it said goodbye or its connection closed).
    pub fn agent_gone(&self, agent_id: &str) {
        let _st = lock(&self.state);
        let Some((_, keys)) = self.live.agents.remove(agent_id) else {
            return;
        };
        let mut changed = false;
        for key in keys {
            changed |= self.drop_instance(&key, |i| i.agent_id == agent_id);
        }
        if changed {
            self.bump();
        }
    }

    /// Drops instances not reported within the TTL.
    pub fn expire(&self, now: Instant) {
        let ttl = self.rules.instance_ttl;
        let _st = lock(&self.state);
        let mut stale: Vec<(String, InstanceKey)> = Vec::new();
        for by_zone in self.clusters.iter() {
            for (zone, e) in by_zone.value() {
                for (name, i) in &e.instances {
                    if now.saturating_duration_since(i.last_seen) > ttl {
                        let key = (zone.clone(), by_zone.key().clone(), name.clone());
                        stale.push((i.agent_id.clone(), key));
                    }
                }
            }
        }
        let mut changed = false;
        for (agent, key) in stale {
            debug!(%agent, zone = %key.0, cluster = %key.1, instance = %key.2, "Instance expired.");
            changed |=
                self.drop_instance(&key, |i| now.saturating_duration_since(i.last_seen) > ttl);
            if let Some(mut keys) = self.live.agents.get_mut(&agent) {
                keys.remove(&key);
            }
            self.live
                .agents
                .remove_if(&agent, |_, keys| keys.is_empty());
        }
        if changed {
            self.bump();
        }
    }

    /// Removes one instance when `cond` holds; refreshes status and counters. The
    /// caller holds the state lock. Returns whether anything visible changed.
    fn drop_instance(
        &self,
        key: &InstanceKey,
        cond: impl Fn(&super::LiveInstance) -> bool,
    ) -> bool {
        let counters = {
            let Some(mut by_zone) = self.clusters.get_mut(&key.1) else {
                return false;
            };
            let Some(e) = by_zone.get_mut(&key.0) else {
                return false;
            };
            if !e.instances.get(&key.2).is_some_and(&cond) {
                return false;
            }
            e.instances.remove(&key.2);
            self.live.total.fetch_sub(1, Ordering::AcqRel);
            let before = self.refresh(e);
            let counters = e.record.is_some().then_some((before, (e.status, e.live)));
            let forget = e.record.is_none() && e.instances.is_empty();
            if forget {
                by_zone.remove(&key.0);
            }
            let empty = by_zone.is_empty();
            drop(by_zone);
            if empty {
                self.clusters.remove_if(&key.1, |_, m| m.is_empty());
            }
            counters
        };
        if let Some(m) = self.live.membership.get() {
            m.withdraw(&key.0, &key.1, &key.2);
        }
        if let Some((before, after)) = counters {
            self.count_change(&key.0, before, after);
        }
        true
    }

    /// The agent that reports this instance now, for routing commands to it.
    pub fn reporter(&self, zone: &str, cluster: &str, instance: &str) -> Option<String> {
        self.clusters.get(cluster).and_then(|m| {
            m.get(zone)
                .and_then(|e| e.instances.get(instance))
                .map(|i| i.agent_id.clone())
        })
    }

    /// Sets the clusters a zone's edge sidecar has in its configuration.
    pub fn set_edge_clusters(&self, zone: &str, mut clusters: Vec<String>) {
        clusters.retain(|c| is_valid_name(c));
        clusters.sort();
        clusters.dedup();
        clusters.truncate(MAX_EDGE_CLUSTERS);
        let _st = lock(&self.state);
        let same = self.edge.get(zone).is_some_and(|c| *c == clusters);
        if !same {
            if clusters.is_empty() {
                self.edge.remove(zone);
            } else {
                self.edge.insert(zone.to_owned(), clusters);
            }
            self.bump();
        }
    }

    /// The latest metrics of a live instance of cluster `name` (in `zone`, or the
    /// first zone by name that has it).
    pub fn instance_metrics(
        &self,
        name: &str,
        zone: Option<&str>,
        instance: &str,
    ) -> MetricsLookup {
        let Some(by_zone) = self.clusters.get(name) else {
            return MetricsLookup::NoCluster;
        };
        let mut any = false;
        for (z, e) in by_zone.iter() {
            if zone.is_some_and(|want| want != z) {
                continue;
            }
            any = true;
            if let Some(i) = e.instances.get(instance).filter(|i| i.is_live()) {
                return MetricsLookup::Found(Box::new(metrics_of(i)));
            }
        }
        if any {
            MetricsLookup::NoInstance
        } else {
            MetricsLookup::NoCluster
        }
    }

    /// Like [`Self::instance_metrics`], finding registered clusters by their `name`
    /// and `version` fields.
    pub fn instance_metrics_by_version(
        &self,
        name: &str,
        version: &str,
        instance: &str,
    ) -> MetricsLookup {
        let mut candidates: Vec<(String, String)> = Vec::new();
        for by_zone in self.clusters.iter() {
            for (z, e) in by_zone.iter() {
                if e.record
                    .as_ref()
                    .is_some_and(|r| r.name == name && r.version == version)
                {
                    candidates.push((z.clone(), by_zone.key().clone()));
                }
            }
        }
        if candidates.is_empty() {
            return MetricsLookup::NoCluster;
        }
        candidates.sort();
        for (z, c) in candidates {
            if let MetricsLookup::Found(m) = self.instance_metrics(&c, Some(&z), instance) {
                return MetricsLookup::Found(m);
            }
        }
        MetricsLookup::NoInstance
    }

    /// The last reports of a cluster's live instances, sorted by instance name (the
    /// instances map is ordered).
    pub fn live_instances(&self, zone: &str, cluster: &str) -> Vec<Arc<InstanceReport>> {
        self.clusters
            .get(cluster)
            .and_then(|m| {
                m.get(zone).map(|e| {
                    e.instances
                        .values()
                        .filter(|i| i.is_live())
                        .map(|i| i.report.clone())
                        .collect::<Vec<_>>()
                })
            })
            .unwrap_or_default()
    }

    /// The last report of a live instance, for commands and diagnosis.
    pub fn live_instance(
        &self,
        zone: &str,
        cluster: &str,
        instance: &str,
    ) -> Option<Arc<InstanceReport>> {
        self.clusters.get(cluster).and_then(|m| {
            m.get(zone)
                .and_then(|e| e.instances.get(instance))
                .filter(|i| i.is_live())
                .map(|i| i.report.clone())
        })
    }
}

fn metrics_of(i: &LiveInstance) -> InstanceMetrics {
    i.report.metrics.clone()
}
