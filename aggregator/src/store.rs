//! The catalog: the registrations (zones and clusters, durable in redb or etcd) and
//! the read model, kept in one in-memory index beside the live instances. This file
//! owns that index and its shape (every known (zone, cluster) with its registration,
//! its reported instances and its status; the registered zones with their counters)
//! and the two types that write it:
//!
//! - [`Store`], the catalog: its registrations ([`registrations`], durable behind the
//!   [`Registrations`] trait, redb in [`persist`], etcd in [`etcd`]), shown in memory
//!   only after the durable commit, in commit order, and the answers read from the
//!   index ([`read`], rendered by [`render`], cached per generation);
//! - [`Instances`] ([`instances`]), the live instances: the reports of agents and
//!   peers, who reports each, expiry, their drift ([`drift`]) and the traffic their
//!   reports carry ([`traffic`]).
//!
//! A cluster's registration, its instances and its status share one entry under one
//! map guard, so a report's run of instances costs one lookup and a rendered view
//! always shows the status of the instances it lists; each writer changes only its
//! part and recomputes the status. Both move the catalog index (the change feed's,
//! [`crate::changes`]) where a fact a reader can see changed, through [`publish`].
//! How the catalog is opened and its rules are in [`config`].

mod aggregate;
pub mod clusterset;
mod config;
mod declared;
pub mod drift;
pub mod etcd;
pub mod identity;
mod instances;
pub mod peers;
pub mod persist;
pub mod publish;
mod read;
pub mod registrations;
mod render;
mod syncinput;
pub mod traffic;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bytes::Bytes;
use dashmap::DashMap;
use meshcat_common::model::{ClusterRecord, Status, ZoneRecord};
use tracing::warn;

pub use aggregate::{ZoneAggregate, status_index};
pub use config::{
    DEFAULT_ERROR_RATIO_WARNING, DEFAULT_GRAPH_WINDOW, DEFAULT_INSTANCE_TTL, Rules, StoreConfig,
    StoreSpec,
};
pub use declared::Remaps;
pub use instances::{
    InstanceKey, Instances, LiveInstance, LiveOwner, MAX_INSTANCES, Member, Membership,
    MetricsLookup, RemoteInstance, Reporter, ZoneReporters,
};
pub use persist::{PersistError, RedbRegistrations};
use read::ReadCache;
pub use read::{Cached, CachedKind, ClusterFacts, Totals};
use registrations::Sequencer;
pub use registrations::{Committed, Loaded, Refusal, Registrations, Write, Writes};
pub use syncinput::SyncInput;

use crate::changes::{self, Changes};
use crate::history::{Detail, History, Kind, Pending, StatusReason};
use crate::status::{self, Inputs};

/// Most clusters a zone's edge sidecar may contribute to `GET /services`.
pub use meshcat_common::limits::MAX_SIDECAR_CLUSTERS as MAX_EDGE_CLUSTERS;

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
    /// The store's storage is full: nothing was written. The cause, as a phrase.
    #[error("{0}")]
    Full(String),
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
    /// Live reported instances, kept with every change of `instances`.
    reported: u64,
    /// What the zone's control server declares of this cluster, when it does.
    declared: Option<declared::Declared>,
    /// Requests and 5xx answers in the last window, summed over the live instances and
    /// kept with every change of `instances`, so a report never rescans the cluster.
    window: (u64, u64),
    /// Whether the live instances ran more than one configuration when last looked
    /// at: the history notes when that flips.
    drifted: bool,
    /// What a certificate listing may skip here without looking at the instances.
    certs: identity::CertBounds,
}

impl Entry {
    /// Live instances: the reported ones, or, when no agent reports any, the control
    /// server's live endpoints (contract section 17).
    pub fn live(&self) -> u64 {
        if self.reported > 0 {
            self.reported
        } else {
            self.declared.as_ref().map_or(0, |d| d.live())
        }
    }

    fn new() -> Entry {
        Entry {
            record: None,
            record_json: Bytes::new(),
            instances: BTreeMap::new(),
            status: Status::Down,
            reported: 0,
            declared: None,
            window: (0, 0),
            drifted: false,
            certs: identity::CertBounds::NONE,
        }
    }

    /// Counts an instance in (`sign` 1) or out (`sign` -1) of the live sums.
    fn count(&mut self, i: &LiveInstance, add: bool) {
        if !i.is_live() {
            return;
        }
        if add {
            self.reported += 1;
            self.window.0 += i.window_requests;
            self.window.1 += i.window_errors;
        } else {
            self.reported -= 1;
            self.window.0 -= i.window_requests;
            self.window.1 -= i.window_errors;
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

/// One clusterName's entries by zoneName, sorted: a vector, as most clusters are in
/// one zone (a `BTreeMap` would allocate a whole node of eleven entries, about
/// 2 KiB, for each cluster's first).
type ByZone = litemap::LiteMap<String, Entry>;

/// A clusterName's entries before its first: room for one, and no more.
fn new_by_zone() -> ByZone {
    ByZone::with_capacity(1)
}

/// The in-memory index: what the catalog shows, shared by the catalog ([`Store`])
/// and the live instances ([`Instances`]), each writing its part of an entry.
#[derive(Debug)]
struct Memory {
    /// Registered zones by name.
    zones: DashMap<String, ZoneState>,
    /// Every known (zone, cluster), registered or only reported: by clusterName, then
    /// zoneName, so `GET /clusters/{name}` is one lookup.
    clusters: DashMap<String, ByZone>,
    /// Per zone, the clusters its edge sidecar has in its configuration.
    edge: DashMap<String, Vec<String>>,
    /// Per zone, the catalog clusters its control server's view declares.
    declared: DashMap<String, BTreeSet<String>>,
    /// Live instances over all entries, registered or not.
    live_total: AtomicU64,
    /// The etcd backend, when registrations live in etcd: its follower loads and
    /// updates memory, and until its first listing nothing shown is news.
    etcd: Option<Arc<etcd::EtcdRegistrations>>,
    /// Registration changes take it exclusively, reports shared: reports move the
    /// counters of their own entry under that entry's map guard, registrations move
    /// many at once.
    state: RwLock<()>,
    rules: Rules,
    /// The change feed: the catalog index, events, replay window, index watch.
    changes: Arc<Changes>,
    /// Where what changes is recorded, when the history is on (set once).
    history: OnceLock<Arc<History>>,
    /// When a live instance's certificate state next changes with time alone.
    identity_clock: identity::IdentityClock,
    /// The zones whose control server's view is to be mapped again: registrations
    /// and the traffic's listeners mark them.
    remaps: Arc<declared::Remaps>,
}

/// The catalog: the registrations and the answers read from them.
#[derive(Debug)]
pub struct Store {
    /// The index, shared with the live instances.
    memory: Arc<Memory>,
    /// The durable registrations.
    registrations: Box<dyn Registrations>,
    /// Shows committed registration changes in memory in their commit order.
    sequencer: Sequencer,
    /// Large answers by generation (the catalog index, moved by [`Memory::publish`]
    /// after every change a read answer could show).
    cache: ReadCache,
}

// The guarded value is `()`: a panic elsewhere leaves nothing inconsistent to see.
fn exclusive(m: &RwLock<()>) -> RwLockWriteGuard<'_, ()> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

fn shared(m: &RwLock<()>) -> RwLockReadGuard<'_, ()> {
    m.read().unwrap_or_else(|p| p.into_inner())
}

impl Store {
    /// Opens the redb registrations in `data_dir` and loads them; the live instances
    /// are kept beside them.
    pub fn open(data_dir: &Path, rules: Rules) -> Result<(Store, Instances), PersistError> {
        Store::with_registrations(Box::new(RedbRegistrations::open(data_dir)?), rules)
    }

    /// A catalog over any durable registrations backend, loaded from it, and the
    /// live instances beside it.
    pub fn with_registrations(
        registrations: Box<dyn Registrations>,
        rules: Rules,
    ) -> Result<(Store, Instances), PersistError> {
        let loaded = registrations.load()?;
        let (store, instances) = Store::empty(registrations, None, rules);
        let mut changes: Vec<Committed> =
            loaded.zones.into_iter().map(Committed::PutZone).collect();
        for c in loaded.clusters {
            if changes
                .iter()
                .any(|z| matches!(z, Committed::PutZone(z) if z.zone_name == c.zone_name))
            {
                changes.push(Committed::PutCluster(c));
            } else {
                warn!(zone = %c.zone_name, cluster = %c.cluster_name, "Stored cluster has no zone, skipped.");
            }
        }
        // Loading is not a change anyone could have seen: it moves no index.
        registrations::apply_quietly(&store, &changes);
        Ok((store, instances))
    }

    /// A catalog whose registrations live in etcd, and the live instances beside it.
    /// It starts empty and not loaded: [`etcd::sync`] loads it and then follows every
    /// change, on every replica.
    pub fn with_etcd(registrations: etcd::EtcdRegistrations, rules: Rules) -> (Store, Instances) {
        let shared = Arc::new(registrations);
        Store::empty(
            Box::new(etcd::EtcdBackend(shared.clone())),
            Some(shared),
            rules,
        )
    }

    fn empty(
        registrations: Box<dyn Registrations>,
        etcd: Option<Arc<etcd::EtcdRegistrations>>,
        rules: Rules,
    ) -> (Store, Instances) {
        let memory = Arc::new(Memory {
            zones: DashMap::new(),
            clusters: DashMap::new(),
            edge: DashMap::new(),
            declared: DashMap::new(),
            live_total: AtomicU64::new(0),
            etcd,
            state: RwLock::new(()),
            rules,
            changes: Arc::new(Changes::new(changes::start_index())),
            history: OnceLock::new(),
            identity_clock: identity::IdentityClock::default(),
            remaps: Arc::default(),
        });
        let store = Store {
            memory: memory.clone(),
            registrations,
            sequencer: Sequencer::default(),
            cache: ReadCache::default(),
        };
        (store, Instances::new(memory))
    }

    /// Records what changes, in the catalog and in the live instances, in `history`
    /// from now on (set once).
    pub fn set_history(&self, history: Arc<History>) -> Result<(), Arc<History>> {
        self.memory.history.set(history)
    }

    /// Whether registration writes are taken: `false` from a write refused for the
    /// store's storage (a full disk, etcd's space quota) until it heals.
    pub fn writable(&self) -> bool {
        self.registrations.writable()
    }

    /// The etcd backend, when registrations live in etcd.
    pub fn etcd(&self) -> Option<&etcd::EtcdRegistrations> {
        self.memory.etcd.as_deref()
    }

    /// Whether the registrations are in memory (always with redb; with etcd once the
    /// first listing is applied).
    pub fn is_loaded(&self) -> bool {
        self.memory.is_loaded()
    }

    pub fn rules(&self) -> Rules {
        self.memory.rules
    }
}

impl Memory {
    /// See [`Store::is_loaded`].
    fn is_loaded(&self) -> bool {
        self.etcd.as_deref().is_none_or(|e| e.is_loaded())
    }

    /// Records the entry `make` builds, when the history is on. Never waits.
    fn note(&self, make: impl FnOnce() -> Pending) {
        if let Some(h) = self.history.get() {
            h.record(make());
        }
    }

    /// The registration of (zone, cluster).
    fn record(&self, zone: &str, cluster: &str) -> Option<Arc<ClusterRecord>> {
        self.clusters
            .get(cluster)
            .and_then(|m| m.get(zone).and_then(|e| e.record.clone()))
    }

    /// Recomputes an entry's status from its live sums (no scan); keeps the global
    /// live total; notes a registered cluster's status change in the history.
    /// Returns the previous (status, live).
    fn refresh(&self, e: &mut Entry, before: (Status, u64)) -> (Status, u64) {
        self.refresh_noting(e, before, true)
    }

    /// [`Self::refresh`], noting the status change only when `note` (not for a
    /// cluster just registered, whose status nobody saw before, nor at loading).
    fn refresh_noting(&self, e: &mut Entry, before: (Status, u64), note: bool) -> (Status, u64) {
        let (min, max) = e.record.as_deref().map_or((0, 0), |r| {
            (r.min_instances.max(0) as u64, r.max_instances.max(0) as u64)
        });
        let inputs = Inputs {
            live: e.live(),
            min_instances: min,
            max_instances: max,
            window_requests: e.window.0,
            window_errors: e.window.1,
        };
        e.status = status::evaluate(inputs, self.rules.error_ratio_warning);
        if note
            && e.status != before.0
            && let Some(r) = &e.record
        {
            let (from, to) = (before.0, e.status);
            let error_ratio_warning = self.rules.error_ratio_warning;
            self.note(|| {
                Pending::new(
                    Kind::StatusChanged,
                    &r.zone_name,
                    &r.cluster_name,
                    "",
                    Detail::Status {
                        from,
                        to,
                        reason: StatusReason {
                            inputs,
                            error_ratio_warning,
                        },
                    },
                )
            });
        }
        let live = e.live();
        if live >= before.1 {
            self.live_total.fetch_add(live - before.1, Ordering::AcqRel);
        } else {
            self.live_total.fetch_sub(before.1 - live, Ordering::AcqRel);
        }
        before
    }

    /// Moves the zone's counters after a registered entry's (status, live) changed.
    fn count_change(&self, zone: &str, before: (Status, u64), after: (Status, u64)) {
        if before != after
            && let Some(mut z) = self.zones.get_mut(zone)
        {
            z.agg.change(before, after);
        }
    }
}

#[cfg(test)]
mod tests;
