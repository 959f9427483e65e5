//! What each zone's control server declares, shown in the catalog (contract section
//! 17): the clusters of a zone's view mapped to catalog clusters (the registered one
//! of the same name; else the cluster whose live instances' sidecars listen at one
//! of its endpoints' addresses, section 14's rule; else the service a mesh-specific
//! name stands for, [`meshcat_common::mesh_names`]; else itself), each entry's
//! `controlPlane` figures, and the
//! control server's live endpoints as the instances of a cluster no agent reports.
//! Declared clusters nobody registered are entries of their own, so `GET /services`
//! lists them. The view itself is shared, never copied: an entry holds the zone's
//! view and the names of its clusters that stand for the entry.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};

use meshcat_common::mesh_names::service_of;
use meshcat_common::model::ControlPlane;
use meshcat_common::wire::address_hash;

use super::publish::Touch;
use super::traffic::{AddressMap, address_key};
use super::{Entry, Instances, shared};
use crate::control::ZoneView;

/// The zones whose view's mapping may have changed since it was made: a cluster
/// registered in the zone or deleted from it, or a listener address of its sidecars
/// come or gone (the address rule), after the view was shown. Only zones shown with
/// a view are marked ([`Instances::apply_declared`] starts and stops that before it
/// reads what the mapping takes, so a change while it maps is marked too); the
/// control component's follower waits for them ([`Remaps::due`]) and maps their
/// views again.
#[derive(Debug, Default)]
pub struct Remaps {
    zones: Mutex<RemapZones>,
    /// Woken when a zone becomes due.
    due: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct RemapZones {
    /// The zones shown with a view.
    watched: HashSet<String>,
    /// Those marked since the follower last took them.
    due: BTreeSet<String>,
}

impl Remaps {
    fn lock(&self) -> std::sync::MutexGuard<'_, RemapZones> {
        self.zones.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes that what maps `zone`'s view moved.
    pub(super) fn moved(&self, zone: &str) {
        let mut z = self.lock();
        if z.watched.contains(zone) && !z.due.contains(zone) {
            z.due.insert(zone.to_owned());
            drop(z);
            self.due.notify_one();
        }
    }

    /// Starts (`true`) or stops watching `zone`.
    fn watch(&self, zone: &str, on: bool) {
        let mut z = self.lock();
        if on {
            if !z.watched.contains(zone) {
                z.watched.insert(zone.to_owned());
            }
        } else {
            z.watched.remove(zone);
            z.due.remove(zone);
        }
    }

    /// The zones due now, taken; empty when none is.
    pub fn take(&self) -> BTreeSet<String> {
        std::mem::take(&mut self.lock().due)
    }

    /// Waits until a zone is due, and takes the zones due.
    pub async fn due(&self) -> BTreeSet<String> {
        loop {
            let woken = self.due.notified();
            let due = self.take();
            if !due.is_empty() {
                return due;
            }
            woken.await;
        }
    }
}

/// A catalog cluster's part of its zone's view.
#[derive(Debug, Clone)]
pub(super) struct Declared {
    view: Arc<ZoneView>,
    /// The view's clusters that stand for this entry, by the view's own names.
    names: Box<[Arc<str>]>,
    endpoints: u64,
    /// Endpoints whose health is HEALTHY or UNKNOWN: the live ones.
    healthy: u64,
    /// The wrapping sum of the live endpoints' address hashes: whether the listed
    /// instances changed, without comparing them.
    live_digest: u64,
}

impl Declared {
    fn new(view: Arc<ZoneView>, names: Vec<Arc<str>>) -> Declared {
        let (mut endpoints, mut healthy, mut live_digest) = (0u64, 0u64, 0u64);
        for (address, _) in live_endpoints(&view, &names) {
            healthy += 1;
            live_digest = live_digest.wrapping_add(address_hash(address));
        }
        for name in &names {
            if let Some(c) = view.clusters.get(name) {
                endpoints += c.len() as u64;
            }
        }
        Declared {
            view,
            names: names.into_boxed_slice(),
            endpoints,
            healthy,
            live_digest,
        }
    }

    /// The view's clusters that stand for this entry.
    pub(super) fn names(&self) -> &[Arc<str>] {
        &self.names
    }

    /// Live endpoints, counted once per address.
    pub(super) fn live(&self) -> u64 {
        self.healthy
    }

    pub(super) fn control_plane(&self) -> ControlPlane {
        ControlPlane {
            declared: true,
            endpoints: self.endpoints,
            healthy_endpoints: self.healthy,
        }
    }

    /// The live endpoints by address, with when the view first listed each.
    pub(super) fn instances(&self) -> BTreeMap<&str, i64> {
        live_endpoints(&self.view, &self.names)
    }

    /// What a reader sees of it changed.
    fn differs(&self, other: &Declared) -> bool {
        (self.endpoints, self.healthy, self.live_digest)
            != (other.endpoints, other.healthy, other.live_digest)
    }
}

/// The live endpoints of `names` in `view`, one per address (the earliest first
/// sighting when several clusters list it).
fn live_endpoints<'a>(view: &'a ZoneView, names: &[Arc<str>]) -> BTreeMap<&'a str, i64> {
    let mut out: BTreeMap<&str, i64> = BTreeMap::new();
    for name in names {
        let Some(c) = view.clusters.get(name) else {
            continue;
        };
        for ep in c.endpoints().filter(|ep| ep.healthy) {
            out.entry(ep.address)
                .and_modify(|t| *t = (*t).min(ep.first_seen_ms))
                .or_insert(ep.first_seen_ms);
        }
    }
    out
}

/// `controlPlane` of an entry.
pub(super) fn control_plane(e: &Entry) -> ControlPlane {
    e.declared
        .as_ref()
        .map(Declared::control_plane)
        .unwrap_or_default()
}

impl Instances {
    /// Shows `view` as what the control server of `zone` declares, in place of what
    /// it declared before; `None` forgets the zone's view (the zone has none, or was
    /// deleted). Entries whose figures, instances or status moved are published.
    pub fn apply_declared(&self, zone: &str, view: Option<Arc<ZoneView>>) {
        self.memory.remaps.watch(zone, view.is_some());
        let _st = shared(&self.memory.state);
        let registered: BTreeSet<String> = self
            .memory
            .zones
            .get(zone)
            .map(|z| z.clusters.clone())
            .unwrap_or_default();
        let mut groups: BTreeMap<String, Vec<Arc<str>>> = BTreeMap::new();
        if let Some(v) = &view {
            let listening = self.listening(zone);
            for (raw, cluster) in &v.clusters {
                let name = if registered.contains(&**raw) {
                    &**raw
                } else {
                    cluster
                        .endpoints()
                        .find_map(|ep| listening.get(&address_key(ep.address)))
                        .and_then(|c| c.as_deref())
                        .unwrap_or_else(|| service_of(raw))
                };
                if meshcat_common::validate::is_valid_name(name) {
                    groups.entry(name.to_owned()).or_default().push(raw.clone());
                }
            }
        }
        let before: BTreeSet<String> = self
            .memory
            .declared
            .get(zone)
            .map(|s| s.clone())
            .unwrap_or_default();
        let mut touched = Vec::new();
        let mut visible = false;
        for name in before.iter().filter(|n| !groups.contains_key(*n)) {
            let shown = self.declare(zone, name, None);
            visible |= shown.is_some();
            touched.extend(shown.flatten());
        }
        let now: BTreeSet<String> = groups.keys().cloned().collect();
        for (name, raws) in groups {
            let declared = view.clone().map(|v| Declared::new(v, raws));
            let shown = self.declare(zone, &name, declared);
            visible |= shown.is_some();
            touched.extend(shown.flatten());
        }
        if now.is_empty() {
            self.memory.declared.remove(zone);
        } else {
            self.memory.declared.insert(zone.to_owned(), now);
        }
        if visible {
            self.memory.publish(&touched);
        }
    }

    /// The zones whose view's mapping may have changed since it was made.
    pub fn remaps(&self) -> &Remaps {
        &self.memory.remaps
    }

    /// Which cluster's live instances' sidecars listen at each address of `zone`
    /// (by [`address_key`]); `None` for an address two clusters' sidecars claim,
    /// which names neither.
    fn listening(&self, zone: &str) -> AddressMap<Option<String>> {
        let mut at: AddressMap<Option<String>> = AddressMap::default();
        self.traffic().view().each(|z, cluster, calls| {
            if z != zone {
                return;
            }
            for (key, _) in calls.listeners() {
                at.entry(key)
                    .and_modify(|owner| {
                        if owner.as_deref() != Some(cluster) {
                            *owner = None;
                        }
                    })
                    .or_insert_with(|| Some(cluster.to_owned()));
            }
        });
        at
    }

    /// Sets one entry's declared part. `None` when a reader sees no difference;
    /// `Some(touch)` when one does, with the cluster to publish when registered.
    fn declare(&self, zone: &str, name: &str, declared: Option<Declared>) -> Option<Option<Touch>> {
        let mut by_zone = self
            .memory
            .clusters
            .entry(name.to_owned())
            .or_insert_with(super::new_by_zone);
        let e = by_zone.entry(zone.to_owned()).or_insert_with(Entry::new);
        let before = (e.status, e.live());
        let moved = match (&e.declared, &declared) {
            (None, None) => false,
            (Some(a), Some(b)) => a.differs(b),
            _ => true,
        };
        e.declared = declared;
        self.memory.refresh(e, before);
        let shown = moved || before != (e.status, e.live());
        let registered = e.record.is_some();
        if registered {
            self.memory.count_change(zone, before, (e.status, e.live()));
        }
        if !registered && e.instances.is_empty() && e.declared.is_none() {
            by_zone.remove(zone);
        }
        let empty = by_zone.is_empty();
        drop(by_zone);
        if empty {
            self.memory.clusters.remove_if(name, |_, m| m.is_empty());
        }
        shown.then(|| registered.then(|| Touch::cluster(zone, name)))
    }
}
