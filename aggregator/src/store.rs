//! The catalog: registered zones and clusters (in dashmap, durable in redb), the live
//! instances agents report (soft state), each cluster's status and the incremental
//! per-zone counters. Reads never wait on the disk; writers serialise on two locks:
//! one for registrations (held across the durable commit) and one for in-memory
//! changes (held for microseconds).

mod aggregate;
pub mod etcd;
pub mod persist;
mod render;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::DashMap;
use meshcat_common::model::{
    ClusterRecord, ClusterView, Instance, InstanceMetrics, OverallSummary, Status, Summary,
    ZoneEntry, ZoneRecord, ZoneSummary,
};
use meshcat_common::validate::is_valid_name;
use meshcat_common::wire::InstanceReport;
use tracing::{debug, warn};

pub use aggregate::{ZoneAggregate, status_index};
use persist::{Op, Persist, PersistError};

use crate::status::{self, Inputs};

/// Most clusters a zone's edge sidecar may contribute to `GET /services`.
pub const MAX_EDGE_CLUSTERS: usize = 10_000;
/// Whether `s` can name an instance: 1 to 253 printable ASCII characters without
/// `/` or spaces. Wider than cluster names because agents default to a host name
/// and admin port (`host:9901`) and pod names come from the orchestrator.
pub fn is_valid_instance(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= meshcat_common::validate::MAX_NAME_LEN
        && s.bytes().all(|b| b.is_ascii_graphic() && b != b'/')
}

/// Most reported instances kept at once: reports for further new instances are
/// dropped (and logged) until others expire, so no set of agents can exhaust memory.
pub const MAX_INSTANCES: u64 = 200_000;

/// Why a registration was refused.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Storage(#[from] PersistError),
    /// The shared store did not confirm the write in time: its outcome is unknown.
    #[error("{0}")]
    Unavailable(String),
}

/// Where registrations are durable.
#[derive(Debug)]
enum Backend {
    /// The embedded database: this process is the only writer.
    Redb(Persist),
    /// etcd, shared by every replica: memory follows its watch.
    Etcd(Box<etcd::EtcdRegistrations>),
}

/// Thresholds of the status rules.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// An instance not reported for this long is dropped.
    pub instance_ttl: Duration,
    /// Error ratio above which a cluster is in warning.
    pub error_ratio_warning: f64,
}

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

/// Everything known about one (zone, cluster).
#[derive(Debug, Clone)]
pub struct Entry {
    /// The registration, when an operator wrote one.
    pub record: Option<Arc<ClusterRecord>>,
    /// The registration's JSON, serialized once when stored (empty when unregistered).
    pub record_json: Bytes,
    /// Reported instances by name.
    pub instances: BTreeMap<String, LiveInstance>,
    /// Status by the rules, refreshed on every change of its inputs.
    pub status: Status,
    /// Live instances, refreshed with the status.
    pub live: u64,
}

impl Entry {
    fn new() -> Entry {
        Entry {
            record: None,
            record_json: Bytes::new(),
            instances: BTreeMap::new(),
            status: Status::Down,
            live: 0,
        }
    }
}

/// A registered zone with its counters.
#[derive(Debug, Clone)]
struct ZoneState {
    record: Arc<ZoneRecord>,
    agg: ZoneAggregate,
    /// Its registered clusters, for zone deletion and the summary.
    clusters: BTreeSet<String>,
}

/// Identifies one reported instance: (zone, cluster, instance).
type InstanceKey = (String, String, String);

/// What a metrics lookup found.
#[derive(Debug)]
pub enum MetricsLookup {
    NoCluster,
    NoInstance,
    Found(Box<InstanceMetrics>),
}

/// Which large answer [`Store::cached_body`] serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CachedKind {
    Summary,
    AllClusters,
}

/// A cached answer: its kind, the caller's authorization and its encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cached {
    pub kind: CachedKind,
    pub authorized: bool,
    pub gzip: bool,
}

impl Cached {
    fn slot(self) -> usize {
        (self.kind as usize) * 4 + usize::from(self.authorized) * 2 + usize::from(self.gzip)
    }
}

/// Totals for the ops exposition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub zones: u64,
    pub clusters: u64,
    pub live_instances: u64,
    pub by_status: [u64; 3],
}

/// The catalog.
#[derive(Debug)]
pub struct Store {
    /// Registered zones by name.
    zones: DashMap<String, ZoneState>,
    /// Every known (zone, cluster), registered or only reported: by clusterName, then
    /// zoneName, so `GET /clusters/{name}` is one lookup.
    clusters: DashMap<String, BTreeMap<String, Entry>>,
    /// The instances each agent reports, so `agent_gone` and expiry visit only those.
    agents: DashMap<String, HashSet<InstanceKey>>,
    /// Per zone, the clusters its edge sidecar has in its configuration.
    edge: DashMap<String, Vec<String>>,
    /// Live instances over all entries, registered or not.
    live_total: AtomicU64,
    /// Reported instances kept (live or not), bounded by [`MAX_INSTANCES`].
    instance_total: AtomicU64,
    /// The durable registrations.
    backend: Backend,
    /// Serialises registrations across their durable commit.
    registration: Mutex<()>,
    /// Serialises in-memory changes so the counters move consistently.
    state: Mutex<()>,
    /// Bumped after every change a read answer could show; keys the summary cache.
    generation: AtomicU64,
    /// Serialized bodies with their generation, by [`Cached::slot`].
    cache: Mutex<[Option<(u64, Bytes)>; 8]>,
    rules: Rules,
}

fn lock(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    // The guarded value is `()`: a panic elsewhere leaves nothing inconsistent to see.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Store {
    /// Opens the durable store in `data_dir` and loads its registrations.
    pub fn open(data_dir: &Path, rules: Rules) -> Result<Store, PersistError> {
        let persist = Persist::open(data_dir)?;
        let loaded = persist.load()?;
        let store = Store::empty(Backend::Redb(persist), rules);
        for z in loaded.zones {
            store.insert_zone(z);
        }
        for c in loaded.clusters {
            if !store.zones.contains_key(&c.zone_name) {
                warn!(zone = %c.zone_name, cluster = %c.cluster_name, "Stored cluster has no zone, skipped.");
                continue;
            }
            store.put_cluster_in_memory(c);
        }
        Ok(store)
    }

    /// A store whose registrations live in etcd. It starts empty and not loaded:
    /// [`etcd::sync`] loads the catalog and then follows every change.
    pub fn with_etcd(registrations: etcd::EtcdRegistrations, rules: Rules) -> Store {
        Store::empty(Backend::Etcd(Box::new(registrations)), rules)
    }

    fn empty(backend: Backend, rules: Rules) -> Store {
        Store {
            zones: DashMap::new(),
            clusters: DashMap::new(),
            agents: DashMap::new(),
            edge: DashMap::new(),
            live_total: AtomicU64::new(0),
            instance_total: AtomicU64::new(0),
            backend,
            registration: Mutex::new(()),
            state: Mutex::new(()),
            generation: AtomicU64::new(0),
            cache: Mutex::new(Default::default()),
            rules,
        }
    }

    /// The etcd side of the store, when registrations live in etcd.
    pub fn etcd(&self) -> Option<&etcd::EtcdRegistrations> {
        match &self.backend {
            Backend::Etcd(e) => Some(e),
            Backend::Redb(_) => None,
        }
    }

    /// Whether the registrations are in memory (always with redb; with etcd once the
    /// first listing is applied).
    pub fn is_loaded(&self) -> bool {
        self.etcd().is_none_or(|e| e.is_loaded())
    }

    fn persist(&self) -> &Persist {
        match &self.backend {
            Backend::Redb(p) => p,
            Backend::Etcd(_) => unreachable!("etcd writes return before reaching redb"),
        }
    }

    pub fn rules(&self) -> Rules {
        self.rules
    }

    /// Current change generation.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    // ---- registrations -------------------------------------------------------

    fn insert_zone(&self, z: ZoneRecord) {
        self.zones.insert(
            z.zone_name.clone(),
            ZoneState {
                record: Arc::new(z),
                agg: ZoneAggregate::default(),
                clusters: BTreeSet::new(),
            },
        );
    }

    /// Registers a zone. Blocks on the durable commit.
    pub fn create_zone(&self, z: ZoneRecord) -> Result<ZoneRecord, StoreError> {
        if let Some(e) = self.etcd() {
            return e.create_zone(z);
        }
        let _reg = lock(&self.registration);
        if self.zones.contains_key(&z.zone_name) {
            return Err(StoreError::Conflict(format!(
                "Zone {} already exists.",
                z.zone_name
            )));
        }
        self.persist().apply(&[Op::PutZone(&z)])?;
        let _st = lock(&self.state);
        self.insert_zone(z.clone());
        self.bump();
        Ok(z)
    }

    /// Deletes a zone and its clusters. Blocks on the durable commit.
    pub fn delete_zone(&self, name: &str) -> Result<ZoneRecord, StoreError> {
        if let Some(e) = self.etcd() {
            return e.delete_zone(name);
        }
        let _reg = lock(&self.registration);
        if !self.zones.contains_key(name) {
            return Err(StoreError::NotFound(format!("Zone {name} does not exist.")));
        }
        self.persist().apply(&[Op::DeleteZone(name)])?;
        let _st = lock(&self.state);
        let (_, zone) = self.zones.remove(name).expect("checked under the lock");
        for cluster in &zone.clusters {
            self.unregister_in_memory(name, cluster);
        }
        self.bump();
        Ok(Arc::unwrap_or_clone(zone.record))
    }

    /// Registers a cluster. Blocks on the durable commit.
    pub fn create_cluster(&self, c: ClusterRecord) -> Result<ClusterRecord, StoreError> {
        if let Some(e) = self.etcd() {
            return e.put_cluster(c, true);
        }
        let _reg = lock(&self.registration);
        self.require_zone(&c.zone_name)?;
        if self.is_registered(&c.zone_name, &c.cluster_name) {
            return Err(StoreError::Conflict(format!(
                "Cluster {} already exists in zone {}.",
                c.cluster_name, c.zone_name
            )));
        }
        self.write_cluster(c)
    }

    /// Replaces a registered cluster. Blocks on the durable commit.
    pub fn replace_cluster(&self, c: ClusterRecord) -> Result<ClusterRecord, StoreError> {
        if let Some(e) = self.etcd() {
            return e.put_cluster(c, false);
        }
        let _reg = lock(&self.registration);
        self.require_zone(&c.zone_name)?;
        if !self.is_registered(&c.zone_name, &c.cluster_name) {
            return Err(StoreError::NotFound(format!(
                "Cluster {} does not exist in zone {}.",
                c.cluster_name, c.zone_name
            )));
        }
        self.write_cluster(c)
    }

    /// Commits a cluster record, then shows it in memory. The caller holds the
    /// registration lock and has checked the zone and whether the cluster exists.
    fn write_cluster(&self, c: ClusterRecord) -> Result<ClusterRecord, StoreError> {
        self.persist().apply(&[Op::PutCluster(&c)])?;
        let _st = lock(&self.state);
        self.put_cluster_in_memory(c.clone());
        self.bump();
        Ok(c)
    }

    /// Deletes a registered cluster. Blocks on the durable commit.
    pub fn delete_cluster(&self, zone: &str, cluster: &str) -> Result<ClusterRecord, StoreError> {
        if let Some(e) = self.etcd() {
            return e.delete_cluster(zone, cluster);
        }
        let _reg = lock(&self.registration);
        let Some(record) = self.record(zone, cluster) else {
            return Err(StoreError::NotFound(format!(
                "Cluster {cluster} does not exist in zone {zone}."
            )));
        };
        self.persist()
            .apply(&[Op::DeleteCluster { zone, cluster }])?;
        let _st = lock(&self.state);
        self.unregister_in_memory(zone, cluster);
        if let Some(mut z) = self.zones.get_mut(zone) {
            z.clusters.remove(cluster);
        }
        self.bump();
        Ok(Arc::unwrap_or_clone(record))
    }

    // ---- registrations followed from a shared store ----------------------------

    /// Shows a zone written elsewhere (new, or its record replaced).
    fn apply_put_zone(&self, z: ZoneRecord) {
        let _st = lock(&self.state);
        match self.zones.get_mut(&z.zone_name) {
            Some(mut known) => known.record = Arc::new(z),
            None => self.insert_zone(z),
        }
        self.bump();
    }

    /// Forgets a zone deleted elsewhere, with its clusters' registrations.
    fn apply_delete_zone(&self, name: &str) {
        let _st = lock(&self.state);
        if let Some((_, zone)) = self.zones.remove(name) {
            for cluster in &zone.clusters {
                self.unregister_in_memory(name, cluster);
            }
            self.bump();
        }
    }

    /// Shows a cluster registration written elsewhere.
    fn apply_put_cluster(&self, c: ClusterRecord) {
        let _st = lock(&self.state);
        if !self.zones.contains_key(&c.zone_name) {
            warn!(zone = %c.zone_name, cluster = %c.cluster_name, "Cluster of an unknown zone ignored.");
            return;
        }
        self.put_cluster_in_memory(c);
        self.bump();
    }

    /// Forgets a cluster registration deleted elsewhere.
    fn apply_delete_cluster(&self, zone: &str, cluster: &str) {
        let _st = lock(&self.state);
        if self.is_registered(zone, cluster) {
            self.unregister_in_memory(zone, cluster);
        }
        if let Some(mut z) = self.zones.get_mut(zone) {
            z.clusters.remove(cluster);
        }
        self.bump();
    }

    /// Makes the registrations in memory exactly `zones` and `clusters` (a full
    /// listing of the shared store), keeping the live instances.
    fn apply_snapshot(&self, zones: Vec<ZoneRecord>, clusters: Vec<ClusterRecord>) {
        let keep_zones: HashSet<&str> = zones.iter().map(|z| z.zone_name.as_str()).collect();
        let keep_clusters: HashSet<(&str, &str)> = clusters
            .iter()
            .map(|c| (c.zone_name.as_str(), c.cluster_name.as_str()))
            .collect();
        let gone_zones: Vec<String> = self
            .zones
            .iter()
            .filter(|z| !keep_zones.contains(z.key().as_str()))
            .map(|z| z.key().clone())
            .collect();
        for z in gone_zones {
            self.apply_delete_zone(&z);
        }
        let mut gone_clusters = Vec::new();
        for z in self.zones.iter() {
            for c in &z.clusters {
                if !keep_clusters.contains(&(z.key().as_str(), c.as_str())) {
                    gone_clusters.push((z.key().clone(), c.clone()));
                }
            }
        }
        for (z, c) in gone_clusters {
            self.apply_delete_cluster(&z, &c);
        }
        for z in zones {
            self.apply_put_zone(z);
        }
        for c in clusters {
            self.apply_put_cluster(c);
        }
    }

    fn require_zone(&self, zone: &str) -> Result<(), StoreError> {
        if self.zones.contains_key(zone) {
            Ok(())
        } else {
            Err(StoreError::Invalid(format!("Zone {zone} does not exist.")))
        }
    }

    fn record(&self, zone: &str, cluster: &str) -> Option<Arc<ClusterRecord>> {
        self.clusters
            .get(cluster)
            .and_then(|m| m.get(zone).and_then(|e| e.record.clone()))
    }

    fn is_registered(&self, zone: &str, cluster: &str) -> bool {
        self.record(zone, cluster).is_some()
    }

    /// Sets the registration of (zone, cluster) in memory and moves the zone's
    /// counters; the caller holds the state lock (or is still loading).
    fn put_cluster_in_memory(&self, c: ClusterRecord) {
        let zone = c.zone_name.clone();
        let name = c.cluster_name.clone();
        let (old, new) = {
            let mut by_zone = self.clusters.entry(name.clone()).or_default();
            let e = by_zone.entry(zone.clone()).or_insert_with(Entry::new);
            let old = e.record.take().map(|r| (r, e.status, e.live));
            e.record_json = render::record_json(&c);
            e.record = Some(Arc::new(c));
            self.refresh(e);
            (old, (e.record.clone().expect("just set"), e.status, e.live))
        };
        if let Some(mut z) = self.zones.get_mut(&zone) {
            if let Some((r, s, l)) = old {
                z.agg.remove(&r, s, l);
            }
            z.agg.add(&new.0, new.1, new.2);
            z.clusters.insert(name);
        }
    }

    /// Drops the registration of (zone, cluster) from memory, keeping its reported
    /// instances as an unregistered cluster.
    fn unregister_in_memory(&self, zone: &str, cluster: &str) {
        let old = {
            let Some(mut by_zone) = self.clusters.get_mut(cluster) else {
                return;
            };
            let Some(e) = by_zone.get_mut(zone) else {
                return;
            };
            let old = e.record.take().map(|r| (r, e.status, e.live));
            e.record_json = Bytes::new();
            self.refresh(e);
            if e.instances.is_empty() {
                by_zone.remove(zone);
            }
            let empty = by_zone.is_empty();
            drop(by_zone);
            if empty {
                self.clusters.remove_if(cluster, |_, m| m.is_empty());
            }
            old
        };
        if let (Some((r, s, l)), Some(mut z)) = (old, self.zones.get_mut(zone)) {
            z.agg.remove(&r, s, l);
        }
    }

    /// Recomputes an entry's live count and status; keeps the global live total.
    /// Returns the previous (status, live).
    fn refresh(&self, e: &mut Entry) -> (Status, u64) {
        let before = (e.status, e.live);
        let (mut live, mut req, mut err) = (0u64, 0u64, 0u64);
        for i in e.instances.values().filter(|i| i.is_live()) {
            live += 1;
            req += i.window_requests;
            err += i.window_errors;
        }
        let (min, max) = e.record.as_deref().map_or((0, 0), |r| {
            (r.min_instances.max(0) as u64, r.max_instances.max(0) as u64)
        });
        e.live = live;
        e.status = status::evaluate(
            Inputs {
                live,
                min_instances: min,
                max_instances: max,
                window_requests: req,
                window_errors: err,
            },
            self.rules.error_ratio_warning,
        );
        if live >= before.1 {
            self.live_total.fetch_add(live - before.1, Ordering::AcqRel);
        } else {
            self.live_total.fetch_sub(before.1 - live, Ordering::AcqRel);
        }
        before
    }

    // ---- live instances -------------------------------------------------------

    /// Records one instance snapshot from an agent. Reports for clusters nobody
    /// registered are kept too: they show in `GET /services`.
    pub fn apply_report(&self, agent_id: &str, report: &InstanceReport, now: Instant) {
        for (field, ok) in [
            ("zoneName", is_valid_name(&report.zone_name)),
            ("clusterName", is_valid_name(&report.cluster_name)),
            ("instance", is_valid_instance(&report.instance)),
        ] {
            if !ok {
                let v = match field {
                    "zoneName" => &report.zone_name,
                    "clusterName" => &report.cluster_name,
                    _ => &report.instance,
                };
                warn!(%agent_id, field, value = %v.escape_debug(), "Instance report with an invalid name ignored.");
                return;
            }
        }
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
            if self.instance_total.load(Ordering::Acquire) >= MAX_INSTANCES {
                warn!(%agent_id, zone = %key.0, cluster = %key.1, instance = %key.2, limit = MAX_INSTANCES, "Instance report dropped: too many instances.");
                return;
            }
            self.instance_total.fetch_add(1, Ordering::AcqRel);
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
            e.instances.insert(
                key.2.clone(),
                LiveInstance {
                    agent_id: agent_id.to_owned(),
                    last_seen: now,
                    window_requests,
                    window_errors,
                    report: Arc::new(report.clone()),
                },
            );
            let before = self.refresh(e);
            let change = e
                .record
                .is_some()
                .then_some((before, (e.status, e.live)))
                .filter(|(b, a)| b != a);
            (visible || before.0 != e.status, previous_agent, change)
        };
        if let Some(other) = previous_agent
            && let Some(mut keys) = self.agents.get_mut(&other)
        {
            keys.remove(&key);
        }
        if let Some((before, after)) = change
            && let Some(mut z) = self.zones.get_mut(&key.0)
        {
            z.agg.change(before, after);
        }
        self.agents
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
        let Some((_, keys)) = self.agents.remove(agent_id) else {
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
        // This runs several times a second over every live instance: walk them in
        // place and clone only the keys of the stale ones.
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
            if let Some(mut keys) = self.agents.get_mut(&agent) {
                keys.remove(&key);
            }
            self.agents.remove_if(&agent, |_, keys| keys.is_empty());
        }
        if changed {
            self.bump();
        }
    }

    /// Removes one instance when `cond` holds; refreshes status and counters. The
    /// caller holds the state lock. Returns whether anything visible changed.
    fn drop_instance(&self, key: &InstanceKey, cond: impl Fn(&LiveInstance) -> bool) -> bool {
        let (changed, counters) = {
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
            self.instance_total.fetch_sub(1, Ordering::AcqRel);
            let before = self.refresh(e);
            let counters = e
                .record
                .is_some()
                .then_some((before, (e.status, e.live)))
                .filter(|(b, a)| b != a);
            let forget = e.record.is_none() && e.instances.is_empty();
            if forget {
                by_zone.remove(&key.0);
            }
            let empty = by_zone.is_empty();
            drop(by_zone);
            if empty {
                self.clusters.remove_if(&key.1, |_, m| m.is_empty());
            }
            (true, counters)
        };
        if let Some((before, after)) = counters
            && let Some(mut z) = self.zones.get_mut(&key.0)
        {
            z.agg.change(before, after);
        }
        changed
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

    // ---- reads ----------------------------------------------------------------

    fn view(record: &ClusterRecord, e: &Entry, authorized: bool) -> ClusterView {
        let instances = if authorized {
            e.instances
                .iter()
                .filter(|(_, i)| i.is_live())
                .map(|(name, i)| Instance {
                    name: name.clone(),
                    start_time: i.report.start_time_ms,
                })
                .collect()
        } else {
            Vec::new()
        };
        ClusterView {
            record: record.clone(),
            authorized,
            instances,
            status: e.status,
        }
    }

    /// Registered clusters matching `keep`, sorted by (zoneName, clusterName).
    pub fn list_clusters(
        &self,
        authorized: bool,
        keep: impl Fn(&ClusterRecord, Status) -> bool,
    ) -> Vec<ClusterView> {
        let mut out: Vec<ClusterView> = Vec::new();
        for by_zone in self.clusters.iter() {
            for e in by_zone.values() {
                if let Some(r) = &e.record
                    && keep(r, e.status)
                {
                    out.push(Self::view(r, e, authorized));
                }
            }
        }
        out.sort_unstable_by(|a, b| {
            (&a.record.zone_name, &a.record.cluster_name)
                .cmp(&(&b.record.zone_name, &b.record.cluster_name))
        });
        out
    }

    /// The registered clusters named `name`, one per zone (or only `zone`).
    pub fn get_cluster(
        &self,
        name: &str,
        zone: Option<&str>,
        authorized: bool,
    ) -> Vec<ClusterView> {
        let Some(by_zone) = self.clusters.get(name) else {
            return Vec::new();
        };
        by_zone
            .iter()
            .filter(|(z, _)| zone.is_none_or(|want| want == z.as_str()))
            .filter_map(|(_, e)| e.record.as_ref().map(|r| Self::view(r, e, authorized)))
            .collect()
    }

    /// Every zone record, sorted by name.
    pub fn zones(&self) -> Vec<ZoneRecord> {
        let mut out: Vec<ZoneRecord> = self.zones.iter().map(|z| (*z.record).clone()).collect();
        out.sort_unstable_by(|a, b| a.zone_name.cmp(&b.zone_name));
        out
    }

    pub fn zone(&self, name: &str) -> Option<ZoneRecord> {
        self.zones.get(name).map(|z| (*z.record).clone())
    }

    /// The zone's summary from its incremental counters.
    pub fn zone_summary(&self, name: &str) -> Option<ZoneSummary> {
        self.zones.get(name).map(|z| z.agg.summary(name))
    }

    /// Totals for the ops exposition, from the per-zone counters.
    pub fn totals(&self) -> Totals {
        let mut t = Totals {
            live_instances: self.live_total.load(Ordering::Acquire),
            ..Totals::default()
        };
        for z in self.zones.iter() {
            t.zones += 1;
            t.clusters += z.agg.clusters;
            for i in 0..3 {
                t.by_status[i] += z.agg.by_status[i];
            }
        }
        t
    }

    /// A body from the cache when it is of the current generation, else built and
    /// cached.
    fn cached(&self, slot: usize, build: impl FnOnce() -> Vec<u8>) -> Bytes {
        let generation = self.generation();
        {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((g, body)) = &cache[slot]
                && *g == generation
            {
                return body.clone();
            }
        }
        let body = Bytes::from(build());
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        // Keep the newest: a slower builder of an older generation must not win.
        if cache[slot].as_ref().is_none_or(|(g, _)| *g <= generation) {
            cache[slot] = Some((generation, body.clone()));
        }
        body
    }

    /// A large read answer served from the per-generation cache: `GET /summary` or
    /// the unfiltered `GET /clusters`, identity or gzip-encoded.
    pub fn cached_body(&self, which: Cached) -> Bytes {
        if which.gzip {
            let plain = Cached {
                gzip: false,
                ..which
            };
            return self.cached(which.slot(), || render::gzip(&self.cached_body(plain)));
        }
        self.cached(which.slot(), || match which.kind {
            CachedKind::Summary => self.render_summary(which.authorized),
            CachedKind::AllClusters => self.render_clusters(which.authorized, |_, _| true),
        })
    }

    /// The `GET /summary` body, serialized once per change generation.
    pub fn summary_body(&self, authorized: bool) -> Bytes {
        self.cached_body(Cached {
            kind: CachedKind::Summary,
            authorized,
            gzip: false,
        })
    }

    /// The `GET /clusters` body for the registered clusters matching `keep`, sorted
    /// by (zoneName, clusterName).
    pub fn render_clusters(
        &self,
        authorized: bool,
        keep: impl Fn(&ClusterRecord, Status) -> bool,
    ) -> Vec<u8> {
        let mut items: Vec<(String, String, Vec<u8>)> = Vec::new();
        for by_zone in self.clusters.iter() {
            for (zone, e) in by_zone.iter() {
                if let Some(r) = &e.record
                    && keep(r, e.status)
                {
                    let mut v = Vec::with_capacity(e.record_json.len() + 96);
                    render::write_view(&mut v, &e.record_json, e, authorized);
                    items.push((zone.clone(), by_zone.key().clone(), v));
                }
            }
        }
        items.sort_unstable_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        render::array(items.iter().map(|i| i.2.as_slice()))
    }

    /// The `GET /clusters/{name}` body: the registered clusters named `name`, one
    /// per zone (or only `zone`); `None` when there is none.
    pub fn render_cluster(
        &self,
        name: &str,
        zone: Option<&str>,
        authorized: bool,
    ) -> Option<Vec<u8>> {
        let by_zone = self.clusters.get(name)?;
        let mut out = Vec::with_capacity(1024);
        out.push(b'[');
        let mut any = false;
        for (z, e) in by_zone.iter() {
            if e.record.is_none() || zone.is_some_and(|want| want != z) {
                continue;
            }
            if any {
                out.push(b',');
            }
            any = true;
            render::write_view(&mut out, &e.record_json, e, authorized);
        }
        out.push(b']');
        any.then_some(out)
    }

    /// Renders the seed 2.5 summary from the counters and pre-serialized records.
    fn render_summary(&self, authorized: bool) -> Vec<u8> {
        // Copy each zone's counters and cluster names out first: no zone guard is held
        // while cluster entries are read.
        let mut zones: Vec<(String, ZoneAggregate, Vec<String>)> = self
            .zones
            .iter()
            .map(|z| {
                (
                    z.key().clone(),
                    z.agg.clone(),
                    z.clusters.iter().cloned().collect(),
                )
            })
            .collect();
        zones.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut overall = OverallSummary::default();
        let mut owners = BTreeSet::new();
        let mut capabilities = BTreeSet::new();
        let mut body = Vec::with_capacity(1 << 16);
        body.push(b'{');
        for (n, (zone, agg, names)) in zones.iter().enumerate() {
            overall.zone_count += 1;
            overall.cluster_count += agg.clusters;
            overall.cluster_stable_count += agg.by_status[0];
            overall.cluster_warning_count += agg.by_status[1];
            overall.cluster_down_count += agg.by_status[2];
            overall.instance_count += agg.instances;
            owners.extend(agg.owners().cloned());
            capabilities.extend(agg.capabilities().cloned());
            if n > 0 {
                body.push(b',');
            }
            serde_json::to_writer(&mut body, zone).expect("strings serialise");
            body.extend_from_slice(b":{\"clusters\":{");
            let mut first = true;
            for name in names {
                if let Some(by_zone) = self.clusters.get(name)
                    && let Some(e) = by_zone.get(zone)
                    && e.record.is_some()
                {
                    if !first {
                        body.push(b',');
                    }
                    first = false;
                    serde_json::to_writer(&mut body, name).expect("strings serialise");
                    body.push(b':');
                    render::write_view(&mut body, &e.record_json, e, authorized);
                }
            }
            body.extend_from_slice(b"},\"metadata\":");
            serde_json::to_writer(&mut body, &agg.summary(zone)).expect("summaries serialise");
            body.push(b'}');
        }
        body.push(b'}');
        overall.owners = owners.into_iter().collect();
        overall.capabilities = capabilities.into_iter().collect();
        let mut out = Vec::with_capacity(body.len() * 2 + 512);
        out.extend_from_slice(b"{\"zones\":");
        out.extend_from_slice(&body);
        out.extend_from_slice(b",\"metadata\":");
        serde_json::to_writer(&mut out, &overall).expect("summaries serialise");
        out.extend_from_slice(b",\"meshes\":");
        out.extend_from_slice(&body);
        out.push(b'}');
        out
    }

    /// Builds the seed 2.5 summary.
    pub fn summary(&self, authorized: bool) -> Summary {
        // Copy each zone's counters and cluster names out first: no zone guard is held
        // while cluster entries are read.
        let zones: Vec<(String, ZoneAggregate, Vec<String>)> = self
            .zones
            .iter()
            .map(|z| {
                (
                    z.key().clone(),
                    z.agg.clone(),
                    z.clusters.iter().cloned().collect(),
                )
            })
            .collect();
        let mut overall = OverallSummary::default();
        let mut owners = BTreeSet::new();
        let mut capabilities = BTreeSet::new();
        let mut out = BTreeMap::new();
        for (zone, agg, names) in zones {
            overall.zone_count += 1;
            overall.cluster_count += agg.clusters;
            overall.cluster_stable_count += agg.by_status[0];
            overall.cluster_warning_count += agg.by_status[1];
            overall.cluster_down_count += agg.by_status[2];
            overall.instance_count += agg.instances;
            owners.extend(agg.owners().cloned());
            capabilities.extend(agg.capabilities().cloned());
            let mut clusters = BTreeMap::new();
            for name in names {
                if let Some(by_zone) = self.clusters.get(&name)
                    && let Some(e) = by_zone.get(&zone)
                    && let Some(r) = &e.record
                {
                    clusters.insert(name, Self::view(r, e, authorized));
                }
            }
            let metadata = agg.summary(&zone);
            out.insert(zone, ZoneEntry { clusters, metadata });
        }
        overall.owners = owners.into_iter().collect();
        overall.capabilities = capabilities.into_iter().collect();
        Summary {
            meshes: out.clone(),
            zones: out,
            metadata: overall,
        }
    }

    /// `GET /services`: registered clusters plus clusters agents report or edge
    /// sidecars know that nobody registered, sorted by (zoneName, clusterName).
    pub fn services(&self, zone: Option<&str>, authorized: bool) -> Vec<ClusterView> {
        let mut out: BTreeMap<(String, String), ClusterView> = BTreeMap::new();
        for by_zone in self.clusters.iter() {
            for (z, e) in by_zone.iter() {
                if zone.is_some_and(|want| want != z) {
                    continue;
                }
                let record = match &e.record {
                    Some(r) => (**r).clone(),
                    None => ClusterRecord::new(z, by_zone.key(), by_zone.key()),
                };
                let view = Self::view(&record, e, authorized);
                out.insert((z.clone(), by_zone.key().clone()), view);
            }
        }
        let edges: Vec<(String, Vec<String>)> = self
            .edge
            .iter()
            .filter(|e| zone.is_none_or(|want| want == e.key()))
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect();
        for (z, names) in edges {
            for name in names {
                out.entry((z.clone(), name.clone()))
                    .or_insert_with(|| ClusterView {
                        record: ClusterRecord::new(&z, &name, &name),
                        authorized,
                        instances: Vec::new(),
                        status: Status::Down,
                    });
            }
        }
        out.into_values().collect()
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
                return MetricsLookup::Found(Box::new(i.report.metrics.clone()));
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

#[cfg(test)]
mod tests;
