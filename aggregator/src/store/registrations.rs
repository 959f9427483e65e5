//! Registrations: the zone and cluster records operators write. Owns their durable
//! backend seam ([`Registrations`]: load everything at start, conditional writes
//! checked and committed in one durable transaction per batch, zone deletion cascading
//! to its clusters) and the one path that shows committed changes in the in-memory
//! index ([`Store::apply_changes`]), used alike by local writes after their commit and
//! by changes another replica committed (a backend's watch).

use std::fmt;
use std::sync::{Arc, Condvar, Mutex};

use bytes::Bytes;
use meshcat_common::model::{ClusterRecord, ZoneRecord};
use tracing::warn;

use super::persist::PersistError;
use super::publish::Touch;
use super::{Entry, Store, StoreError, ZoneAggregate, ZoneState, exclusive, render};
use crate::history::{Detail, Kind, Pending};
use crate::redb_file::Unwritable;

/// One conditional write; a batch of them is committed all or nothing.
#[derive(Debug, Clone)]
pub enum Write {
    /// Create a zone; refused with a conflict when it exists.
    CreateZone(ZoneRecord),
    /// Replace an existing zone's record (its clusters stay); refused when it does not
    /// exist.
    ReplaceZone(ZoneRecord),
    /// Delete a zone and every cluster in it; refused when it does not exist.
    DeleteZone(String),
    /// Create a cluster in an existing zone; refused with a conflict when it exists.
    CreateCluster(ClusterRecord),
    /// Replace an existing cluster; refused when it does not exist.
    ReplaceCluster(ClusterRecord),
    /// Delete an existing cluster.
    DeleteCluster { zone: String, cluster: String },
}

/// A committed change, as the in-memory index applies it.
#[derive(Debug, Clone, PartialEq)]
pub enum Committed {
    /// A zone was created or replaced.
    PutZone(ZoneRecord),
    /// A zone and every cluster in it are gone; carries the zone's last record.
    DeleteZone(ZoneRecord),
    /// A cluster was created or replaced.
    PutCluster(ClusterRecord),
    /// A cluster is gone; carries its last record.
    DeleteCluster(ClusterRecord),
}

impl Committed {
    /// The record a cluster write committed (created, replaced or deleted).
    pub fn into_cluster(self) -> ClusterRecord {
        match self {
            Committed::PutCluster(c) | Committed::DeleteCluster(c) => c,
            other => unreachable!("a cluster write committed {other:?}"),
        }
    }

    /// The record a zone write committed (created, replaced or deleted).
    pub fn into_zone(self) -> ZoneRecord {
        match self {
            Committed::PutZone(z) | Committed::DeleteZone(z) => z,
            other => unreachable!("a zone write committed {other:?}"),
        }
    }
}

/// What a backend did with one batch.
#[derive(Debug)]
pub enum Outcome {
    /// Durably committed. `seq` is the batch's place in this backend's commit order:
    /// 1, 2, 3, ... over every committed batch since it was opened.
    Committed { seq: u64, changes: Vec<Committed> },
    /// Nothing was written: write number `index` of the batch was refused.
    Refused { index: usize, error: Refusal },
}

/// Why a write was refused; the message names the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// It exists already (a create).
    Conflict(String),
    /// It does not exist (a replace or a delete).
    NotFound(String),
    /// The zone a cluster write names does not exist.
    NoZone(String),
}

impl From<Refusal> for StoreError {
    fn from(r: Refusal) -> StoreError {
        match r {
            Refusal::Conflict(m) => StoreError::Conflict(m),
            Refusal::NotFound(m) => StoreError::NotFound(m),
            Refusal::NoZone(m) => StoreError::Invalid(m),
        }
    }
}

/// Where a submitted batch's outcome goes; called once, on the backend's committer.
pub type Done = Box<dyn FnOnce(Result<Outcome, PersistError>) + Send>;

/// Everything stored, as read at start.
#[derive(Debug, Default)]
pub struct Loaded {
    pub zones: Vec<ZoneRecord>,
    pub clusters: Vec<ClusterRecord>,
}

/// A durable home for registrations. Each write is checked against the stored state
/// inside the transaction that commits it, so the conditions hold across every
/// process sharing the backend; a batch is acknowledged only after its durable commit.
pub trait Registrations: Send + Sync + fmt::Debug {
    /// Reads every stored registration (at start).
    fn load(&self) -> Result<Loaded, PersistError>;

    /// Checks and commits `batch` all or nothing. A backend may commit several
    /// callers' batches in one transaction, each still all or nothing.
    fn commit(&self, batch: Vec<Write>) -> Result<Outcome, PersistError>;

    /// Starts committing `batch` like [`Self::commit`] without blocking the caller:
    /// `done` gets the outcome when the commit is over. A backend that cannot do this
    /// gives both back, and the caller commits on a thread that may block.
    fn submit(&self, batch: Vec<Write>, done: Done) -> Result<(), (Vec<Write>, Done)> {
        Err((batch, done))
    }

    /// Whether the backend takes writes: `false` from a write refused for its
    /// storage (full, or failed) until the backend heals.
    fn writable(&self) -> bool {
        true
    }

    /// Whether committed changes reach memory through the backend's own follower (a
    /// watch shared by every replica, applied in the backend's order) rather than
    /// from [`Store::commit`]; such a backend returns from `commit` once its follower
    /// has shown the batch here.
    fn followed(&self) -> bool {
        false
    }
}

/// The refusal messages, shared by every backend so the API answers alike.
impl Refusal {
    pub fn zone_exists(zone: &str) -> Refusal {
        Refusal::Conflict(format!("Zone {zone} already exists."))
    }
    pub fn no_zone(zone: &str) -> Refusal {
        Refusal::NotFound(format!("Zone {zone} does not exist."))
    }
    pub fn cluster_needs_zone(zone: &str) -> Refusal {
        Refusal::NoZone(format!("Zone {zone} does not exist."))
    }
    pub fn cluster_exists(zone: &str, cluster: &str) -> Refusal {
        Refusal::Conflict(format!("Cluster {cluster} already exists in zone {zone}."))
    }
    pub fn no_cluster(zone: &str, cluster: &str) -> Refusal {
        Refusal::NotFound(format!("Cluster {cluster} does not exist in zone {zone}."))
    }
}

/// Shows committed batches in memory in their commit order, whichever caller thread
/// wakes first: two writes of one record committed together must not show swapped.
///
/// Flat combining: a caller leaves its batch waiting under its sequence number, and
/// whichever caller finds the next number waiting shows every consecutive batch
/// waiting, then wakes the others once. The callers of one group commit (up to
/// 64 batches answered together) therefore wake about once each, instead of once for
/// every commit shown before theirs.
#[derive(Debug)]
pub(super) struct Sequencer<T = Arc<Vec<Committed>>> {
    state: Mutex<SequencerState<T>>,
    /// Wakes blocked callers when a showing run ends.
    turn: Condvar,
    /// Wakes waiting tasks when a showing run ends (its value counts the runs).
    runs: tokio::sync::watch::Sender<u64>,
}

#[derive(Debug)]
struct SequencerState<T> {
    /// The last commit sequence number shown.
    shown: u64,
    /// Batches committed and not shown yet, by sequence number.
    waiting: std::collections::BTreeMap<u64, T>,
    /// A caller is showing waiting batches (outside the lock).
    showing: bool,
}

impl<T> Default for Sequencer<T> {
    fn default() -> Self {
        Sequencer {
            state: Mutex::new(SequencerState {
                shown: 0,
                waiting: Default::default(),
                showing: false,
            }),
            turn: Condvar::new(),
            runs: tokio::sync::watch::Sender::new(0),
        }
    }
}

/// Marks a sequence number shown even when showing it panicked, so later commits are
/// never stuck behind it.
struct Shown<'a, T> {
    seq: &'a Sequencer<T>,
    n: u64,
}

impl<T> Drop for Shown<'_, T> {
    fn drop(&mut self) {
        let mut st = self.seq.lock();
        st.shown = st.shown.max(self.n);
    }
}

/// Ends a caller's showing run, also when showing panicked, and wakes the waiters.
struct Showing<'a, T> {
    seq: &'a Sequencer<T>,
}

impl<T> Drop for Showing<'_, T> {
    fn drop(&mut self) {
        self.seq.lock().showing = false;
        self.seq.turn.notify_all();
        self.seq.runs.send_modify(|n| *n = n.wrapping_add(1));
    }
}

impl<T> Sequencer<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, SequencerState<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Shows batch `n` with `show` after every batch before it, and returns once it is
    /// shown (by this caller or another).
    fn show_in_turn(&self, n: u64, batch: T, show: impl Fn(&T)) {
        let mut st = self.lock();
        st.waiting.insert(n, batch);
        while st.shown < n {
            if st.showing || !st.waiting.contains_key(&(st.shown + 1)) {
                st = self.turn.wait(st).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            st.showing = true;
            drop(st);
            self.show_run(&show);
            st = self.lock();
        }
    }

    /// [`Self::show_in_turn`] for a task: it waits without blocking its thread (a
    /// run it shows itself runs on its thread).
    async fn show_in_turn_async(&self, n: u64, batch: T, show: impl Fn(&T)) {
        self.lock().waiting.insert(n, batch);
        loop {
            // Subscribed before the check, so a run ending after it wakes this task.
            let mut runs = self.runs.subscribe();
            {
                let mut st = self.lock();
                if st.shown >= n {
                    return;
                }
                if !st.showing && st.waiting.contains_key(&(st.shown + 1)) {
                    st.showing = true;
                    drop(st);
                    self.show_run(&show);
                    continue;
                }
            }
            // The sender lives in `self`: `changed` cannot fail while it is borrowed.
            let _ = runs.changed().await;
        }
    }

    /// Shows every consecutive waiting batch; the caller has set `showing`.
    fn show_run(&self, show: &impl Fn(&T)) {
        let _run = Showing { seq: self };
        loop {
            let mut locked = self.lock();
            let next = locked.shown + 1;
            let Some(batch) = locked.waiting.remove(&next) else {
                break;
            };
            drop(locked);
            let _shown = Shown { seq: self, n: next };
            show(&batch);
        }
    }
}

/// A committed batch: shown already, or to be shown in its turn.
enum Settled {
    Shown(Vec<Committed>),
    InTurn(u64, Arc<Vec<Committed>>),
}

/// The answer of a registration whose task panicked or was cancelled.
fn task_failed<T>(e: tokio::task::JoinError) -> Result<T, (usize, StoreError)> {
    let why = format!("registration task failed: {e}");
    Err((0, StoreError::Storage(PersistError::Group(why))))
}

/// The changes of a shown batch: whoever showed it has dropped its copy by then.
fn unshare(changes: Arc<Vec<Committed>>) -> Vec<Committed> {
    Arc::try_unwrap(changes).unwrap_or_else(|shared| (*shared).clone())
}

impl Store {
    /// Commits a batch durably, then shows it in memory in commit order. Blocks on
    /// the commit. A refusal carries the index of the refused write.
    pub fn commit(&self, batch: Vec<Write>) -> Result<Vec<Committed>, (usize, StoreError)> {
        match self.settle(self.registrations.commit(batch))? {
            Settled::Shown(changes) => Ok(changes),
            Settled::InTurn(seq, changes) => {
                self.sequencer
                    .show_in_turn(seq, changes.clone(), |c| self.apply_changes(c));
                Ok(unshare(changes))
            }
        }
    }

    /// [`Self::commit`] for a request task: with a backend that takes batches without
    /// blocking (redb), the task waits for the commit and its turn without holding a
    /// thread; otherwise the commit runs on the blocking pool. The commit and its
    /// showing run in a task of their own, so a caller that goes away (a client
    /// hanging up) cannot leave a committed batch unshown and the later ones waiting
    /// behind it.
    pub async fn commit_async(
        self: &Arc<Self>,
        batch: Vec<Write>,
    ) -> Result<Vec<Committed>, (usize, StoreError)> {
        let store = Arc::clone(self);
        tokio::spawn(async move { store.commit_in_task(batch).await })
            .await
            .unwrap_or_else(task_failed)
    }

    async fn commit_in_task(
        self: Arc<Self>,
        batch: Vec<Write>,
    ) -> Result<Vec<Committed>, (usize, StoreError)> {
        let (reply, outcome) = tokio::sync::oneshot::channel();
        let done: Done = Box::new(move |r| {
            let _ = reply.send(r);
        });
        let outcome = match self.registrations.submit(batch, done) {
            Ok(()) => outcome
                .await
                .unwrap_or_else(|_| Err(PersistError::committer_stopped())),
            Err((batch, _)) => {
                return tokio::task::spawn_blocking(move || self.commit(batch))
                    .await
                    .unwrap_or_else(task_failed);
            }
        };
        match self.settle(outcome)? {
            Settled::Shown(changes) => Ok(changes),
            Settled::InTurn(seq, changes) => {
                self.sequencer
                    .show_in_turn_async(seq, changes.clone(), |c| self.apply_changes(c))
                    .await;
                Ok(unshare(changes))
            }
        }
    }

    /// What a backend's outcome leaves to do: nothing (refused, or shown by the
    /// backend's follower), or showing the batch in its turn.
    fn settle(
        &self,
        outcome: Result<Outcome, PersistError>,
    ) -> Result<Settled, (usize, StoreError)> {
        match outcome {
            Err(PersistError::Unavailable(m)) => Err((0, StoreError::Unavailable(m))),
            Err(PersistError::Unwritable(cause @ Unwritable::Full(_))) => {
                Err((0, StoreError::Full(cause.to_string())))
            }
            Err(e) => Err((0, StoreError::Storage(e))),
            Ok(Outcome::Refused { index, error }) => Err((index, error.into())),
            Ok(Outcome::Committed { changes, .. }) if self.registrations.followed() => {
                Ok(Settled::Shown(changes))
            }
            Ok(Outcome::Committed { seq, changes }) => Ok(Settled::InTurn(seq, Arc::new(changes))),
        }
    }

    fn commit_one(&self, w: Write) -> Result<Committed, StoreError> {
        let mut changes = self.commit(vec![w]).map_err(|(_, e)| e)?;
        Ok(changes.swap_remove(0))
    }

    /// Shows committed changes in memory: this process's own writes after their
    /// commit, or changes that arrive from elsewhere (another replica's writes seen
    /// through the backend), in their commit order. This is the one point where
    /// registrations change, so it publishes them on the change feed: on every
    /// replica, whichever wrote them.
    pub fn apply_changes(&self, changes: &[Committed]) {
        // Until the first listing from a shared backend is in, nobody reads the
        // catalog: the listing is a load, not a change.
        self.apply(changes, self.is_loaded());
    }

    /// Shows `changes`; with `publish` (not at loading) they are changes a reader
    /// sees: published on the feed and noted in the history.
    fn apply(&self, changes: &[Committed], publish: bool) {
        let _st = exclusive(&self.memory.state);
        let mut touched = Vec::new();
        let note = |kind: Kind, zone: &str, cluster: &str, detail: Detail| {
            if publish {
                self.memory
                    .note(|| Pending::new(kind, zone, cluster, "", detail));
            }
        };
        for change in changes {
            match change {
                Committed::PutZone(z) => {
                    // A listing after a lost watch puts every record again: only what
                    // differs is a change.
                    let old = self
                        .memory
                        .zones
                        .get(&z.zone_name)
                        .map(|old| old.record.clone());
                    if old.as_deref().is_none_or(|old| *old != *z) {
                        touched.push(Touch::Zone(z.zone_name.clone()));
                    }
                    match &old {
                        None => note(Kind::ZoneRegistered, &z.zone_name, "", Detail::Nothing {}),
                        Some(old) if **old != *z => note(
                            Kind::ZoneUpdated,
                            &z.zone_name,
                            "",
                            Detail::Changed {
                                changed: changed_fields(&**old, z),
                            },
                        ),
                        Some(_) => {}
                    }
                    self.put_zone_in_memory(z.clone());
                }
                Committed::DeleteZone(z) => {
                    if let Some((_, zone)) = self.memory.zones.remove(&z.zone_name) {
                        for cluster in &zone.clusters {
                            self.unregister_in_memory(&z.zone_name, cluster);
                            note(
                                Kind::ClusterDeleted,
                                &z.zone_name,
                                cluster,
                                Detail::Nothing {},
                            );
                        }
                        note(Kind::ZoneDeleted, &z.zone_name, "", Detail::Nothing {});
                        touched.extend(Touch::zone_and_clusters(&z.zone_name, &zone.clusters));
                    }
                }
                Committed::PutCluster(c) => {
                    if self.memory.zones.contains_key(&c.zone_name) {
                        let old = self.record(&c.zone_name, &c.cluster_name);
                        if old.as_deref().is_none_or(|old| *old != *c) {
                            touched.push(Touch::cluster(&c.zone_name, &c.cluster_name));
                        }
                        match &old {
                            None => note(
                                Kind::ClusterRegistered,
                                &c.zone_name,
                                &c.cluster_name,
                                Detail::Nothing {},
                            ),
                            Some(old) if **old != *c => note(
                                Kind::ClusterUpdated,
                                &c.zone_name,
                                &c.cluster_name,
                                Detail::Changed {
                                    changed: changed_fields(&**old, c),
                                },
                            ),
                            Some(_) => {}
                        }
                        // A status moved by the new bounds is noted after the update.
                        self.put_cluster_in_memory(c.clone(), publish && old.is_some());
                    } else {
                        warn!(zone = %c.zone_name, cluster = %c.cluster_name, "Cluster of an unknown zone not shown.");
                    }
                }
                Committed::DeleteCluster(c) => {
                    if self.is_registered(&c.zone_name, &c.cluster_name) {
                        touched.push(Touch::cluster(&c.zone_name, &c.cluster_name));
                        note(
                            Kind::ClusterDeleted,
                            &c.zone_name,
                            &c.cluster_name,
                            Detail::Nothing {},
                        );
                    }
                    self.unregister_in_memory(&c.zone_name, &c.cluster_name);
                    if let Some(mut z) = self.memory.zones.get_mut(&c.zone_name)
                        && z.clusters.remove(&c.cluster_name)
                    {
                        self.memory.remaps.moved(&c.zone_name);
                    }
                }
            }
        }
        if touched.is_empty() {
            return;
        }
        if publish {
            self.memory.publish(&touched);
        } else {
            self.memory.advance();
        }
    }

    fn put_zone_in_memory(&self, z: ZoneRecord) {
        let record = Arc::new(z);
        if let Some(mut existing) = self.memory.zones.get_mut(&record.zone_name) {
            existing.record = record;
            return;
        }
        self.memory.zones.insert(
            record.zone_name.clone(),
            ZoneState {
                record,
                agg: ZoneAggregate::default(),
                clusters: Default::default(),
            },
        );
    }

    /// Sets the registration of (zone, cluster) in memory and moves the zone's
    /// counters; the caller holds the state lock. A status change is noted in the
    /// history when `note_status`.
    fn put_cluster_in_memory(&self, c: ClusterRecord, note_status: bool) {
        let zone = c.zone_name.clone();
        let name = c.cluster_name.clone();
        let (old, new) = {
            let mut by_zone = self
                .memory
                .clusters
                .entry(name.clone())
                .or_insert_with(super::new_by_zone);
            let e = by_zone.entry(zone.clone()).or_insert_with(Entry::new);
            let old = e.record.take().map(|r| (r, e.status, e.live()));
            e.record_json = render::record_json(&c);
            e.record = Some(Arc::new(c));
            self.memory
                .refresh_noting(e, (e.status, e.live()), note_status);
            (
                old,
                (e.record.clone().expect("just set"), e.status, e.live()),
            )
        };
        if let Some(mut z) = self.memory.zones.get_mut(&zone) {
            if let Some((r, s, l)) = old {
                z.agg.remove(&r, s, l);
            }
            z.agg.add(&new.0, new.1, new.2);
            if z.clusters.insert(name) {
                // The name rule of the mapping now finds it.
                self.memory.remaps.moved(&zone);
            }
        }
    }

    /// Drops the registration of (zone, cluster) from memory, keeping its reported
    /// instances as an unregistered cluster.
    fn unregister_in_memory(&self, zone: &str, cluster: &str) {
        let old = {
            let Some(mut by_zone) = self.memory.clusters.get_mut(cluster) else {
                return;
            };
            let Some(e) = by_zone.get_mut(zone) else {
                return;
            };
            let old = e.record.take().map(|r| (r, e.status, e.live()));
            e.record_json = Bytes::new();
            self.memory.refresh(e, (e.status, e.live()));
            if e.instances.is_empty() && e.declared.is_none() {
                by_zone.remove(zone);
            }
            let empty = by_zone.is_empty();
            drop(by_zone);
            if empty {
                self.memory.clusters.remove_if(cluster, |_, m| m.is_empty());
            }
            old
        };
        if let (Some((r, s, l)), Some(mut z)) = (old, self.memory.zones.get_mut(zone)) {
            z.agg.remove(&r, s, l);
        }
    }
}

/// Single writes, for tests: the API commits its [`Write`]s itself
/// ([`Store::commit_async`]), and registers and replaces zones with
/// [`Store::create_zone`] and [`Store::replace_zone`].
#[cfg(test)]
impl Store {}

/// The fields of a record (zone or cluster) that differ between `old` and `new`, by
/// the names the API gives them, sorted.
fn changed_fields<T: serde::Serialize>(old: &T, new: &T) -> Vec<String> {
    let (Ok(serde_json::Value::Object(old)), Ok(serde_json::Value::Object(new))) =
        (serde_json::to_value(old), serde_json::to_value(new))
    else {
        return Vec::new();
    };
    let mut names: Vec<String> = old
        .iter()
        .filter(|(k, v)| new.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .chain(new.keys().filter(|k| !old.contains_key(*k)).cloned())
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_fields_are_named_as_the_api_names_them() {
        let old = ClusterRecord::new("z", "c", "n");
        let mut new = old.clone();
        new.owner = "team-b".into();
        new.min_instances = 2;
        new.owner_url = "https://team-b.example".into();
        assert_eq!(
            changed_fields(&old, &new),
            vec!["minInstances", "owner", "ownerURL"]
        );
        assert!(changed_fields(&old, &old).is_empty());
        let zone = ZoneRecord {
            zone_name: "z".into(),
            request_cluster: "edge".into(),
            server_address: "cp:1".into(),
            use_tls: false,
            ca_path: String::new(),
            cert_path: String::new(),
            key_path: String::new(),
        };
        let moved = ZoneRecord {
            server_address: "cp:2".into(),
            request_cluster: String::new(),
            ..zone.clone()
        };
        assert_eq!(
            changed_fields(&zone, &moved),
            vec!["requestCluster", "serverAddress"]
        );
    }

    #[test]
    fn the_sequencer_shows_commits_in_order() {
        for _ in 0..50 {
            let seq = Arc::new(Sequencer::<u64>::default());
            let order = Arc::new(Mutex::new(Vec::new()));
            let threads: Vec<_> = (1..=64u64)
                .rev()
                .map(|n| {
                    let (seq, order) = (seq.clone(), order.clone());
                    std::thread::spawn(move || {
                        seq.show_in_turn(n, n, |b| order.lock().unwrap().push(*b));
                        // Returned: its own batch is shown.
                        assert!(order.lock().unwrap().contains(&n));
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(*order.lock().unwrap(), (1..=64).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_batch_whose_showing_panicked_does_not_stop_the_next() {
        let seq = Arc::new(Sequencer::<u64>::default());
        let shown = Arc::new(Mutex::new(Vec::new()));
        let first = {
            let (seq, shown) = (seq.clone(), shown.clone());
            std::thread::spawn(move || {
                seq.show_in_turn(1, 1, |b| {
                    shown.lock().unwrap().push(*b);
                    panic!("showing failed");
                })
            })
        };
        assert!(first.join().is_err());
        seq.show_in_turn(2, 2, |b| shown.lock().unwrap().push(*b));
        assert_eq!(*shown.lock().unwrap(), vec![1, 2]);
    }
}

/// Shows changes without publishing their events (loading at start).
pub(super) fn apply_quietly(store: &Store, changes: &[Committed]) {
    store.apply(changes, false);
}

/// Single registration writes, each its own durable commit, blocking on it:
/// `store.writes().create_cluster(record)`. A batch is [`Store::commit`].
#[derive(Debug, Clone, Copy)]
pub struct Writes<'a>(&'a Store);

impl Store {
    /// Single writes, each its own commit (see [`Writes`]).
    pub fn writes(&self) -> Writes<'_> {
        Writes(self)
    }
}

impl Writes<'_> {
    /// Registers a zone. Blocks on the durable commit.
    pub fn create_zone(&self, z: ZoneRecord) -> Result<ZoneRecord, StoreError> {
        Ok(self.0.commit_one(Write::CreateZone(z))?.into_zone())
    }

    /// Replaces a registered zone's record; its clusters stay. Blocks on the durable
    /// commit.
    pub fn replace_zone(&self, z: ZoneRecord) -> Result<ZoneRecord, StoreError> {
        Ok(self.0.commit_one(Write::ReplaceZone(z))?.into_zone())
    }

    /// Registers a cluster. Blocks on the durable commit.
    pub fn create_cluster(&self, c: ClusterRecord) -> Result<ClusterRecord, StoreError> {
        Ok(self.0.commit_one(Write::CreateCluster(c))?.into_cluster())
    }

    /// Registers clusters all or nothing, in one durable commit. A refusal carries the
    /// index of the refused record.
    pub fn create_clusters(
        &self,
        cs: Vec<ClusterRecord>,
    ) -> Result<Vec<ClusterRecord>, (usize, StoreError)> {
        let changes = self
            .0
            .commit(cs.into_iter().map(Write::CreateCluster).collect())?;
        Ok(changes.into_iter().map(Committed::into_cluster).collect())
    }

    /// Replaces a registered cluster. Blocks on the durable commit.
    pub fn replace_cluster(&self, c: ClusterRecord) -> Result<ClusterRecord, StoreError> {
        Ok(self.0.commit_one(Write::ReplaceCluster(c))?.into_cluster())
    }

    /// Deletes a registered cluster. Blocks on the durable commit.
    pub fn delete_cluster(&self, zone: &str, cluster: &str) -> Result<ClusterRecord, StoreError> {
        let w = Write::DeleteCluster {
            zone: zone.to_owned(),
            cluster: cluster.to_owned(),
        };
        Ok(self.0.commit_one(w)?.into_cluster())
    }

    /// Deletes a zone and its clusters. Blocks on the durable commit.
    pub fn delete_zone(&self, name: &str) -> Result<ZoneRecord, StoreError> {
        Ok(self
            .0
            .commit_one(Write::DeleteZone(name.to_owned()))?
            .into_zone())
    }
}
