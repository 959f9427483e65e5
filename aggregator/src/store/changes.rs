//! The catalog index and its change feed (contract section 11): every change a reader
//! can see moves the index by one and becomes a [`Change`] holding its events, already
//! rendered. Changes are kept in a bounded window (for `Last-Event-ID` replays) and
//! fanned out on a bounded broadcast channel (a subscriber that falls behind it is
//! told so and dropped, so a slow reader never costs unbounded memory). Blocking
//! queries wait on a watch of the index.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use meshcat_common::model::OverallSummary;
use tokio::sync::{broadcast, watch};

use super::{Store, render};

/// Changes kept for replays by default.
pub const DEFAULT_RETAINED: usize = 4096;
/// Changes a subscriber may fall behind by default before it is reset.
pub const DEFAULT_BUFFER: usize = 1024;

/// What a change touched; the events are rendered from the state after it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Touch {
    /// A registered cluster, created, replaced, deleted, or whose live part moved.
    Cluster(String, String),
    /// A zone, created or deleted.
    Zone(String),
    /// The shape of a zone's part of the dependency graph.
    Graph(String),
}

impl Touch {
    pub fn cluster(zone: &str, cluster: &str) -> Touch {
        Touch::Cluster(zone.to_owned(), cluster.to_owned())
    }

    /// A deleted zone and the clusters that went with it.
    pub fn zone_and_clusters<'a>(
        zone: &str,
        clusters: impl IntoIterator<Item = &'a String>,
    ) -> Vec<Touch> {
        let mut out: Vec<Touch> = clusters
            .into_iter()
            .map(|c| Touch::cluster(zone, c))
            .collect();
        out.push(Touch::Zone(zone.to_owned()));
        out
    }
}

/// Microseconds since the epoch: the index a change takes unless the previous one is
/// already there or later ([`next_index`]).
pub fn start_index() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The index of the change after `last`: the current microsecond since the epoch, or
/// `last + 1` when that is later. Indexes so follow the clock: an index from before a
/// restart is older than every one after it, and two replicas issue indexes of the
/// same moments rather than overlapping runs of small numbers, so an id a process did
/// not issue is almost never one it did (each process checks, see
/// [`Changes::subscribe`]). It stays below 2^53 for centuries, so a browser reads it
/// as a number exactly.
fn next_index(last: u64) -> u64 {
    (last + 1).max(start_index())
}

/// The kind of the event that ends a stream: its client must read everything again.
pub const RESET: &str = "reset";
/// The whole `reset` event; it carries no id.
pub const RESET_FRAME: &[u8] = b"event: reset\ndata: {}\n\n";

/// One event of a change, as the stream sends it.
#[derive(Debug)]
pub struct Event {
    /// `cluster`, `cluster-deleted`, `zone`, `zone-deleted`, `graph`, `history`,
    /// `summary`, or [`RESET`] (every stream it reaches shows it and ends).
    pub kind: &'static str,
    /// Zone it concerns (empty for `summary`), for `?zoneName=`.
    pub zone: String,
    /// Cluster it concerns, for `?clusterName=`.
    pub cluster: Option<String>,
    /// The whole event as the stream sends it (`event`, `id`, `data` lines), for a
    /// caller holding the read token: rendered once, shared by every stream.
    pub frame: Bytes,
    /// The same for other callers, when it differs (`authorized`, `instances`).
    pub frame_unauthorized: Option<Bytes>,
    /// Shown only to callers holding the read token (live data: `history`).
    pub private: bool,
}

/// One rendered event: `data` is compact JSON, one line.
fn frame(kind: &str, index: u64, data: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(data.len() + kind.len() + 40);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\nid: ");
    out.extend_from_slice(index.to_string().as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

impl Event {
    fn new(
        kind: &'static str,
        zone: &str,
        cluster: Option<&str>,
        index: u64,
        data: &[u8],
        unauthorized: Option<&[u8]>,
    ) -> Event {
        Event {
            kind,
            zone: zone.to_owned(),
            cluster: cluster.map(str::to_owned),
            frame: frame(kind, index, data),
            frame_unauthorized: unauthorized.map(|d| frame(kind, index, d)),
            private: false,
        }
    }
}

/// One change: its index and its events, in order.
#[derive(Debug)]
pub struct Change {
    pub index: u64,
    pub events: Vec<Event>,
}

/// A subscription: the retained changes after the asked index (or `None` when they
/// are no longer all retained), then the live feed.
#[derive(Debug)]
pub struct Subscription {
    pub replay: Option<Vec<Arc<Change>>>,
    pub feed: broadcast::Receiver<Arc<Change>>,
}

#[derive(Debug)]
struct Feed {
    window: VecDeque<Arc<Change>>,
    retained: usize,
    tx: broadcast::Sender<Arc<Change>>,
    /// The summary metadata after the last change, so `summary` is sent only when it moved.
    last_summary: Vec<u8>,
    /// The index of the last change numbered.
    last: u64,
    /// Every change after this index that has events is in the window: a replay
    /// from an older id would miss some.
    floor: u64,
}

/// The change feed of one store.
#[derive(Debug)]
pub struct Changes {
    feed: Mutex<Feed>,
    index: watch::Sender<u64>,
}

impl Changes {
    pub fn new(start: u64) -> Changes {
        Changes {
            feed: Mutex::new(Feed {
                window: VecDeque::new(),
                retained: DEFAULT_RETAINED,
                tx: broadcast::channel(DEFAULT_BUFFER).0,
                last_summary: Vec::new(),
                last: start,
                floor: start,
            }),
            index: watch::channel(start).0,
        }
    }

    fn feed(&self) -> std::sync::MutexGuard<'_, Feed> {
        // A panic while publishing leaves at worst a missing change: readers reset.
        self.feed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets how many changes a subscriber may fall behind and how many are kept for
    /// replays. Called once at start, before anyone subscribes.
    pub fn configure(&self, buffer: usize, retained: usize) {
        let mut f = self.feed();
        f.tx = broadcast::channel(buffer.max(1)).0;
        f.retained = retained.max(1);
        while f.window.len() > f.retained {
            f.evict();
        }
    }

    /// A watch of the catalog index, for blocking queries.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.index.subscribe()
    }

    /// Subscribes to the changes after `since` (replaying them from the window) or
    /// to the changes from now on. `since` must be an index this process issued and
    /// still holds (a change in the window, or the oldest it can replay from);
    /// anything else (an id from before a restart, from another replica, or older
    /// than the window) has no replay: the caller must read everything again.
    pub fn subscribe(&self, since: Option<u64>) -> Subscription {
        let f = self.feed();
        // Subscribing under the same lock that publishes: nothing falls between the
        // replay and the feed.
        let feed = f.tx.subscribe();
        let replay = match since {
            None => Some(Vec::new()),
            Some(since) if since == f.floor || f.issued(since) => Some(
                f.window
                    .iter()
                    .filter(|c| c.index > since && !c.events.is_empty())
                    .cloned()
                    .collect(),
            ),
            Some(_) => None,
        };
        Subscription { replay, feed }
    }
}

impl Feed {
    /// Whether `index` is a change in the window (the window is in index order).
    fn issued(&self, index: u64) -> bool {
        self.window
            .binary_search_by_key(&index, |c| c.index)
            .is_ok()
    }

    fn evict(&mut self) {
        if let Some(old) = self.window.pop_front() {
            self.floor = old.index;
        }
    }
}

fn kind_json(v: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(v).expect("events serialise")
}

impl Store {
    /// The change feed.
    pub fn changes(&self) -> &Changes {
        &self.changes
    }

    /// The catalog index.
    pub fn index(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Moves the index and publishes what `touched` shows now. Numbering, rendering
    /// and sending happen under the feed's lock, so changes are numbered and sent in
    /// one order and each event shows the state after its change (or later). The
    /// caller holds no map guard of the catalog. A cluster or zone touched more than
    /// once (an agent gone with many instances of one cluster) gets one event.
    /// Returns the index before the change and the change's own.
    pub(super) fn publish(&self, touched: &[Touch]) -> (u64, u64) {
        let mut f = self.feed_lock();
        let previous = f.last;
        let index = self.number(&mut f);
        let mut events = Vec::with_capacity(touched.len() + 1);
        let mut seen = std::collections::HashSet::with_capacity(touched.len());
        for t in touched {
            if seen.insert(t) {
                events.push(self.event(t, index));
            }
        }
        let summary = serde_json::to_vec(&self.overall()).expect("summaries serialise");
        if summary != f.last_summary {
            events.push(Event::new("summary", "", None, index, &summary, None));
            f.last_summary = summary;
        }
        // A change no event shows (only `GET /services` moved) is kept too, without
        // events: its index may come back as a `since` (a reader's last index).
        self.push_change(&mut f, index, events);
        (previous, index)
    }

    /// Numbers the next change, under the feed's lock: its index, after the last.
    fn number(&self, f: &mut Feed) -> u64 {
        let index = next_index(f.last);
        self.generation.store(index, Ordering::Release);
        f.last = index;
        index
    }

    /// Keeps change `index` in the window and sends it; the caller holds the feed's
    /// lock and has numbered the change.
    fn push_change(&self, f: &mut Feed, index: u64, events: Vec<Event>) {
        let change = Arc::new(Change { index, events });
        if f.window.len() >= f.retained {
            f.evict();
        }
        f.window.push_back(change.clone());
        if !change.events.is_empty() {
            // No subscriber is not an error: the change is retained for later ones.
            let _ = f.tx.send(change);
        }
        // Under the lock too: the watch never moves backwards.
        self.changes.index.send_replace(index);
    }

    /// Sends stored history entries as `history` events, one change for the batch
    /// (the history is something a reader can see: `GET /history`). Only callers
    /// holding the read token see them.
    pub fn publish_history(&self, entries: &[crate::history::HistoryEvent]) {
        if entries.is_empty() {
            return;
        }
        let mut f = self.feed_lock();
        let index = self.number(&mut f);
        let events = entries
            .iter()
            .map(|e| Event {
                kind: "history",
                zone: e.zone.clone(),
                cluster: (!e.cluster.is_empty()).then(|| e.cluster.clone()),
                frame: frame("history", index, &e.json),
                frame_unauthorized: None,
                private: true,
            })
            .collect();
        self.push_change(&mut f, index, events);
    }

    /// Tells the streams that show history (those holding the read token) that
    /// they missed `history` events, dropped on their way to the feed: each gets
    /// `reset` and ends, whatever its filter, and no resume reaches back before
    /// this point (a client resuming from before is reset too).
    pub fn reset_history_streams(&self) {
        let mut f = self.feed_lock();
        let index = self.number(&mut f);
        f.window.clear();
        f.floor = index;
        let reset = Event {
            kind: RESET,
            zone: String::new(),
            cluster: None,
            frame: Bytes::from_static(RESET_FRAME),
            frame_unauthorized: None,
            private: true,
        };
        // Not kept for replays: a resume from `index` on starts after it.
        let _ = f.tx.send(Arc::new(Change {
            index,
            events: vec![reset],
        }));
        self.changes.index.send_replace(index);
    }

    /// Moves the index without events (loading, which nobody could have watched).
    pub(super) fn advance(&self) {
        let mut f = self.feed_lock();
        let index = self.number(&mut f);
        // Nothing before the load can be replayed.
        f.floor = index;
        f.last_summary = serde_json::to_vec(&self.overall()).expect("summaries serialise");
        self.changes.index.send_replace(index);
    }

    /// The event `t` shows now, as change `index`.
    fn event(&self, t: &Touch, index: u64) -> Event {
        match t {
            Touch::Zone(zone) => match self.zones.get(zone) {
                Some(z) => Event::new("zone", zone, None, index, &kind_json(&*z.record), None),
                None => Event::new(
                    "zone-deleted",
                    zone,
                    None,
                    index,
                    &kind_json(&serde_json::json!({ "zoneName": zone })),
                    None,
                ),
            },
            Touch::Cluster(zone, cluster) => {
                let rendered = self.clusters.get(cluster).and_then(|m| {
                    m.get(zone).filter(|e| e.record.is_some()).map(|e| {
                        let mut auth = Vec::with_capacity(e.record_json.len() + 96);
                        render::write_view(&mut auth, &e.record_json, e, true);
                        let mut unauth = Vec::with_capacity(e.record_json.len() + 64);
                        render::write_view(&mut unauth, &e.record_json, e, false);
                        (auth, unauth)
                    })
                });
                match rendered {
                    Some((data, unauth)) => {
                        Event::new("cluster", zone, Some(cluster), index, &data, Some(&unauth))
                    }
                    None => Event::new(
                        "cluster-deleted",
                        zone,
                        Some(cluster),
                        index,
                        &kind_json(&serde_json::json!({
                            "clusterName": cluster,
                            "zoneName": zone,
                        })),
                        None,
                    ),
                }
            }
            Touch::Graph(zone) => Event::new(
                "graph",
                zone,
                None,
                index,
                &kind_json(&serde_json::json!({ "zoneName": zone })),
                None,
            ),
        }
    }

    /// Moves the index and sends a `graph` event for each zone whose part of the
    /// dependency graph changed shape. Returns the index before the change and the
    /// change's own; nothing when no zone changed.
    pub fn graph_changed(&self, zones: &[String]) -> Option<(u64, u64)> {
        if zones.is_empty() {
            return None;
        }
        let touched: Vec<Touch> = zones.iter().map(|z| Touch::Graph(z.clone())).collect();
        let _st = super::shared(&self.state);
        Some(self.publish(&touched))
    }

    fn feed_lock(&self) -> std::sync::MutexGuard<'_, Feed> {
        self.changes.feed()
    }

    /// The summary's `metadata`, from the per-zone counters only.
    pub fn overall(&self) -> OverallSummary {
        let mut totals = super::aggregate::OverallTotals::default();
        for z in self.zones.iter() {
            totals.add(&z.agg);
        }
        totals.finish()
    }
}
