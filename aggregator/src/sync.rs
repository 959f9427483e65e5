//! The sync of every sidecar with its zone's control server (contract section 17):
//! per live instance a state (`synced`, `stale`, `rejected`, `disconnected`,
//! `unknown`) with its detail, derived from what the instance's agent reports (its
//! xDS state, its upstream clusters' host-set digests) beside the zone's view
//! ([`crate::control`]). Nothing here speaks to a control plane's own API, so it
//! holds for every control plane.
//!
//! States move an index of their own (not the catalog's), which `GET /sync` answers
//! with and its blocking queries wait on; each change is a `sync` event on the change
//! feed (beside the catalog's changes, never moving its index), a `sync-changed`
//! history entry and a move of `meshcat_sidecar_sync`. The rule is in [`derive`]; the
//! loop that applies it on reports, view changes and the grace's end is [`run`].
//!
//! With replicas, each derives the sync of the instances its own agents report, and
//! shows its peers' (read from them as they change, [`Sync::set_remote`]) beside its
//! own, so every replica answers `GET /sync` alike.

pub mod derive;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use crate::changes::{self, Changes, Event};
use crate::control::{ControlChange, ControlState, Controls};
use crate::history::{Detail, History, Kind, Pending};
use crate::ingest::InstanceKey;
use crate::store::{Instances, SyncInput};

pub use derive::{SyncDetail, SyncState};

/// `--sync-grace` default: how long a sidecar's host set may differ from the control
/// server's before the sidecar is `stale`.
pub const DEFAULT_SYNC_GRACE: Duration = Duration::from_secs(30);
/// How often instances whose host sets differ are looked at again (the grace ends
/// at most this late) and gone instances forgotten.
const TICK: Duration = Duration::from_millis(500);
/// Reports queued for the derivation before the queue is dropped for a full pass.
const QUEUE: usize = 65_536;

/// The sync's settings, from its flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncConfig {
    pub grace: Duration,
}

impl Default for SyncConfig {
    fn default() -> Self {
        SyncConfig {
            grace: DEFAULT_SYNC_GRACE,
        }
    }
}

/// One sidecar's sync, as `GET /sync` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Proxy {
    pub zone_name: String,
    pub cluster_name: String,
    pub instance: String,
    pub state: SyncState,
    /// Since when the instance is in this state, ms since the epoch.
    pub since_ms: i64,
    pub detail: SyncDetail,
}

/// A replica's own sync states, as its peers read them (`/peer/sync`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwnSync {
    /// The replica's own sync index.
    pub index: u64,
    pub proxies: Vec<Proxy>,
}

/// Longest detail text a peer's proxy may carry.
const MAX_PEER_TEXT: usize = 4096;

impl Proxy {
    /// Whether a proxy a peer sent holds what this replica would: valid names, a
    /// detail of bounded size (peer summaries are checked like agents' reports).
    pub fn is_valid(&self) -> bool {
        use meshcat_common::validate::is_valid_name;
        let d = &self.detail;
        is_valid_name(&self.zone_name)
            && is_valid_name(&self.cluster_name)
            && !self.instance.is_empty()
            && self.instance.len() <= 253
            && d.text.len() <= MAX_PEER_TEXT
            && d.clusters.len() <= derive::MAX_CLUSTERS
            && d.rejections.len() <= meshcat_common::wire::MAX_XDS_REJECTIONS
            && d.clusters.iter().all(|c| {
                c.missing.len() <= derive::MAX_ADDRESSES && c.extra.len() <= derive::MAX_ADDRESSES
            })
    }
}

/// What is kept per instance.
#[derive(Debug, Clone)]
struct Tracked {
    proxy: Proxy,
    /// The upstream clusters whose host set differs from the view, since when (ms).
    mismatches: BTreeMap<Arc<str>, i64>,
}

/// The sync states of the live instances of this replica's agents.
#[derive(Debug)]
pub struct Sync {
    config: SyncConfig,
    states: DashMap<InstanceKey, Tracked>,
    index: AtomicU64,
    watch: watch::Sender<u64>,
    changes: Arc<Changes>,
    history: Option<Arc<History>>,
    /// Reported instances to derive again, sent by the ingest's sink.
    queue: mpsc::Sender<InstanceKey>,
    queued: std::sync::Mutex<Option<mpsc::Receiver<InstanceKey>>>,
    /// The queue overflowed: the next pass derives every instance.
    overflowed: std::sync::atomic::AtomicBool,
    /// The index of this replica's own states: what peers wait on.
    own: watch::Sender<u64>,
    /// Each peer's own proxies, as last read from it.
    remote: DashMap<String, Vec<Proxy>>,
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Sync {
    pub fn new(config: SyncConfig, changes: Arc<Changes>, history: Option<Arc<History>>) -> Sync {
        let start = changes::start_index();
        let (queue, rx) = mpsc::channel(QUEUE);
        Sync {
            config,
            states: DashMap::new(),
            index: AtomicU64::new(start),
            watch: watch::Sender::new(start),
            changes,
            history,
            queue,
            queued: std::sync::Mutex::new(Some(rx)),
            overflowed: std::sync::atomic::AtomicBool::new(false),
            own: watch::Sender::new(start),
            remote: DashMap::new(),
        }
    }

    /// This replica's own proxies (its agents' instances), sorted, with the index of
    /// its own states; waits up to `wait` for that index to pass `after` first.
    pub async fn own_after(&self, after: Option<u64>, wait: Duration) -> (u64, Vec<Proxy>) {
        if let Some(after) = after {
            let mut w = self.own.subscribe();
            let _ = tokio::time::timeout(wait, w.wait_for(|i| *i != after)).await;
        }
        let index = *self.own.borrow();
        let mut out: Vec<Proxy> = self.states.iter().map(|t| t.proxy.clone()).collect();
        sort(&mut out);
        (index, out)
    }

    /// Shows `peer`'s own proxies in place of what it said before; the changed ones
    /// are `sync` events here too (the peer records their history).
    pub fn set_remote(&self, peer: &str, proxies: Vec<Proxy>) {
        let before = self.remote.get(peer).map(|p| p.clone()).unwrap_or_default();
        if before == proxies {
            return;
        }
        let old: BTreeMap<(&str, &str, &str), &Proxy> = before
            .iter()
            .map(|p| ((&*p.zone_name, &*p.cluster_name, &*p.instance), p))
            .collect();
        let changed: Vec<Proxy> = proxies
            .iter()
            .filter(|p| old.get(&(&*p.zone_name, &*p.cluster_name, &*p.instance)) != Some(p))
            .cloned()
            .collect();
        self.remote.insert(peer.to_owned(), proxies);
        self.bump();
        for p in &changed {
            self.event(p);
        }
    }

    /// Forgets what a peer that left said.
    pub fn forget_remote(&self, peer: &str) {
        if self.remote.remove(peer).is_some() {
            self.bump();
        }
    }

    /// The sync index: moves when any state changes.
    pub fn index(&self) -> u64 {
        self.index.load(Ordering::Acquire)
    }

    /// A watch of [`Self::index`], for blocking queries.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.watch.subscribe()
    }

    /// Asks for `key` to be derived again (its agent reported it). Never waits.
    pub fn reported(&self, key: InstanceKey) {
        if self.queue.try_send(key).is_err() {
            self.overflowed.store(true, Ordering::Release);
        }
    }

    /// The proxies matching the filters, sorted by zone, cluster and instance, with
    /// the index they are as of.
    pub fn list(
        &self,
        zone: Option<&str>,
        cluster: Option<&str>,
        state: Option<SyncState>,
    ) -> (u64, Vec<Proxy>) {
        let index = self.index();
        let keep = |p: &Proxy| {
            zone.is_none_or(|z| z == p.zone_name)
                && cluster.is_none_or(|c| c == p.cluster_name)
                && state.is_none_or(|s| s == p.state)
        };
        let mut out: Vec<Proxy> = self
            .states
            .iter()
            .filter(|t| keep(&t.proxy))
            .map(|t| t.proxy.clone())
            .collect();
        for peer in self.remote.iter() {
            out.extend(peer.iter().filter(|p| keep(p)).cloned());
        }
        sort(&mut out);
        // An instance that just moved between replicas may be listed by both for a
        // moment: this replica's own state wins (it is listed first once sorted
        // stably, since its states came first).
        out.dedup_by(|b, a| {
            (&a.zone_name, &a.cluster_name, &a.instance)
                == (&b.zone_name, &b.cluster_name, &b.instance)
        });
        (index, out)
    }

    /// One instance's sync, when known.
    pub fn proxy(&self, key: &InstanceKey) -> Option<Proxy> {
        self.states.get(key).map(|t| t.proxy.clone())
    }

    /// Instances per (zone, cluster, state), for `meshcat_sidecar_sync`.
    pub fn counts(&self) -> BTreeMap<(String, String, SyncState), u64> {
        let mut out = BTreeMap::new();
        for t in self.states.iter() {
            let p = &t.proxy;
            *out.entry((p.zone_name.clone(), p.cluster_name.clone(), p.state))
                .or_insert(0) += 1;
        }
        out
    }

    /// Derives `input`'s state against `view` now, and keeps it. Instances another
    /// replica owns are that replica's to derive.
    fn observe(&self, input: &SyncInput, controls: &Controls, now: i64) {
        if input.owner.is_some() {
            self.forget(&input.key);
            return;
        }
        let view = controls.view(&input.key.zone);
        let grace = self.config.grace.as_millis() as i64;
        let existed = self.states.contains_key(&input.key);
        let (proxy, previous) = {
            let mut tracked = self
                .states
                .entry(input.key.clone())
                .or_insert_with(|| Tracked {
                    proxy: Proxy {
                        zone_name: input.key.zone.clone(),
                        cluster_name: input.key.cluster.clone(),
                        instance: input.key.instance.clone(),
                        state: SyncState::Unknown,
                        since_ms: now,
                        detail: SyncDetail::default(),
                    },
                    mismatches: BTreeMap::new(),
                });
            let previous = existed.then(|| tracked.proxy.clone());
            let (state, detail) =
                derive::derive(view.as_deref(), input, &mut tracked.mismatches, now, grace);
            let since_ms = match &previous {
                Some(p) if p.state == state => p.since_ms,
                _ => now,
            };
            tracked.proxy.state = state;
            tracked.proxy.since_ms = since_ms;
            tracked.proxy.detail = detail;
            (tracked.proxy.clone(), previous)
        };
        let changed = previous
            .as_ref()
            .is_none_or(|p| p.state != proxy.state || p.detail != proxy.detail);
        if changed {
            self.publish(&proxy, previous.as_ref().map(|p| p.state));
        }
    }

    /// Forgets an instance that is gone (or another replica's).
    fn forget(&self, key: &InstanceKey) {
        if self.states.remove(key).is_some() {
            self.bump_own();
        }
    }

    /// Moves this replica's own index (and so the merged one).
    fn bump_own(&self) {
        let next = (*self.own.borrow() + 1).max(changes::start_index());
        self.own.send_replace(next);
        self.bump();
    }

    fn bump(&self) -> u64 {
        let next = self
            .index
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
                Some((last + 1).max(changes::start_index()))
            })
            .map_or(0, |last| (last + 1).max(changes::start_index()));
        self.watch.send_replace(self.index());
        next
    }

    /// A `sync` event for `proxy` on the change feed.
    fn event(&self, proxy: &Proxy) {
        let data = serde_json::to_vec(proxy).expect("proxies serialise");
        let mut p = self.changes.begin_aside(1);
        let index = p.index();
        p.push(Event::private(
            "sync",
            &proxy.zone_name,
            Some(&proxy.cluster_name),
            index,
            &data,
        ));
        p.send();
    }

    /// Moves the indexes and tells the streams and the history.
    fn publish(&self, proxy: &Proxy, from: Option<SyncState>) {
        self.bump_own();
        self.event(proxy);
        // A new instance's first state is news only when it is not `synced`.
        let from = match from {
            Some(f) => f,
            None if proxy.state == SyncState::Synced => return,
            None => SyncState::Unknown,
        };
        if from == proxy.state {
            return;
        }
        if let Some(h) = &self.history {
            h.record_instance(
                Pending::new(
                    Kind::SyncChanged,
                    &proxy.zone_name,
                    &proxy.cluster_name,
                    &proxy.instance,
                    Detail::Sync {
                        from: from.as_str(),
                        to: proxy.state.as_str(),
                        detail: proxy.detail.text.clone(),
                    },
                ),
                Instant::now(),
            );
        }
    }

    /// Records a zone's control state change in the history.
    fn note_control(&self, zone: &str, from: ControlState, to: ControlState, error: &str) {
        if let Some(h) = &self.history {
            h.record(Pending::new(
                Kind::ControlChanged,
                zone,
                "",
                "",
                Detail::Control {
                    from: from.as_str(),
                    to: to.as_str(),
                    error: error.to_owned(),
                },
            ));
        }
    }
}

fn sort(proxies: &mut [Proxy]) {
    proxies.sort_by(|a, b| {
        (&a.zone_name, &a.cluster_name, &a.instance).cmp(&(
            &b.zone_name,
            &b.cluster_name,
            &b.instance,
        ))
    });
}

/// Derives the sync of this replica's instances for as long as `stop` is false:
/// each reported instance as its report arrives, every instance of a zone whose view
/// changed, and every half second the instances whose host sets differ (the grace
/// may have ended) and those that are gone. An instance that is only `unknown` waits
/// for its next report or view change: nothing else can move it.
pub async fn run(
    sync: Arc<Sync>,
    instances: Arc<Instances>,
    controls: Controls,
    mut stop: watch::Receiver<bool>,
) {
    let Some(mut queue) = sync.queued.lock().ok().and_then(|mut q| q.take()) else {
        return;
    };
    let mut control = controls.subscribe();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            key = queue.recv() => {
                let Some(key) = key else { return };
                let mut keys = BTreeSet::from([key]);
                while let Ok(k) = queue.try_recv() {
                    keys.insert(k);
                }
                let now = now_ms();
                for key in keys {
                    match instances.sync_input(&key) {
                        Some(input) => sync.observe(&input, &controls, now),
                        None => sync.forget(&key),
                    }
                }
            }
            change = control.recv() => match change {
                Ok(ControlChange::View { zone }) => derive_zone(&sync, &instances, &controls, Some(&zone)),
                Ok(ControlChange::State { zone, from, to, error }) => {
                    sync.note_control(&zone, from, to, &error);
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    derive_zone(&sync, &instances, &controls, None);
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
            _ = tick.tick() => {
                if sync.overflowed.swap(false, Ordering::AcqRel) {
                    derive_zone(&sync, &instances, &controls, None);
                    continue;
                }
                let now = now_ms();
                let pending: Vec<InstanceKey> = sync
                    .states
                    .iter()
                    .filter(|t| !t.mismatches.is_empty())
                    .map(|t| t.key().clone())
                    .collect();
                for key in pending {
                    match instances.sync_input(&key) {
                        Some(input) => sync.observe(&input, &controls, now),
                        None => sync.forget(&key),
                    }
                }
                let gone: Vec<InstanceKey> = sync
                    .states
                    .iter()
                    .map(|t| t.key().clone())
                    .filter(|k| instances.live_owner(&k.zone, &k.cluster, &k.instance).is_none())
                    .collect();
                for key in gone {
                    sync.forget(&key);
                }
            }
        }
    }
}

/// Derives every live instance of `zone` (every zone with `None`) again.
fn derive_zone(sync: &Sync, instances: &Instances, controls: &Controls, zone: Option<&str>) {
    let now = now_ms();
    for input in instances.sync_inputs(zone) {
        sync.observe(&input, controls, now);
    }
}
