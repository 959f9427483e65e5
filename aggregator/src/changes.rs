//! The catalog index and its change feed (contract section 11): every change a reader
//! can see moves the index and becomes a [`Change`] holding its events, already
//! rendered. Changes are kept in a bounded window (for `Last-Event-ID` replays) and
//! fanned out on a bounded broadcast channel (a subscriber that falls behind it is
//! told so and dropped, so a slow reader never costs unbounded memory). Blocking
//! queries wait on a watch of the index.
//!
//! The feed is fed by whoever changes something a reader can see (the catalog and
//! its live instances through `store`, the history through `history`) and knows none
//! of them: each numbers its change with [`Changes::begin`], renders its events for
//! that index while the feed is held, and sends them. What the indexed routes
//! (`/clusters`, `/zones`, `/summary`, `/services`) cannot show (a history entry)
//! goes beside the catalog's changes with [`Changes::begin_aside`]: it reaches the
//! streams and their replays under the index of the last catalog change, and never
//! moves the index, so a blocking query does not wake for it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::{broadcast, watch};

/// Changes kept for replays by default.
pub const DEFAULT_RETAINED: usize = 4096;
/// Changes a subscriber may fall behind by default before it is reset.
pub const DEFAULT_BUFFER: usize = 1024;

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
    /// An event every caller sees: `data` for callers holding the read token, and
    /// `unauthorized` for the others when it differs.
    pub fn new(
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

    /// An event only callers holding the read token see.
    pub fn private(
        kind: &'static str,
        zone: &str,
        cluster: Option<&str>,
        index: u64,
        data: &[u8],
    ) -> Event {
        Event {
            private: true,
            ..Event::new(kind, zone, cluster, index, data, None)
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
    /// The summary after the last change, so `summary` is sent only when it moved.
    last_summary: Vec<u8>,
    /// The index of the last change numbered.
    last: u64,
    /// Every change after this index that has events is in the window: a replay
    /// from an older id would miss some.
    floor: u64,
}

/// The change feed of one aggregator.
#[derive(Debug)]
pub struct Changes {
    feed: Mutex<Feed>,
    /// The index of the last change, read without the feed's lock (it keys the read
    /// caches).
    current: AtomicU64,
    index: watch::Sender<u64>,
}

impl Default for Changes {
    fn default() -> Self {
        Changes::new(start_index())
    }
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
            current: AtomicU64::new(start),
            index: watch::channel(start).0,
        }
    }

    fn feed(&self) -> MutexGuard<'_, Feed> {
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

    /// The catalog index: the index of the last change.
    pub fn index(&self) -> u64 {
        self.current.load(Ordering::Acquire)
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

    /// Numbers the next change and holds the feed until it is sent: the caller
    /// renders its events for [`Publishing::index`] meanwhile, so changes are
    /// numbered and sent in one order and each event shows the state after its
    /// change (or later). The caller holds no lock its events are rendered under.
    pub fn begin(&self, events: usize) -> Publishing<'_> {
        let mut feed = self.feed();
        let previous = feed.last;
        let index = self.number(&mut feed);
        Publishing {
            changes: self,
            feed,
            previous,
            index,
            aside: false,
            events: Vec::with_capacity(events),
        }
    }

    /// Holds the feed for events beside the catalog's changes: they take the
    /// index of the last change as their id and do not move the index (nothing a
    /// blocking query or the index header shows changed). They are kept for
    /// replays after that change: a resume from an earlier id replays them after
    /// it, one from that id does not (the client had them, or `reset` told it to
    /// read again).
    pub fn begin_aside(&self, events: usize) -> Publishing<'_> {
        let feed = self.feed();
        let index = feed.last;
        Publishing {
            changes: self,
            feed,
            previous: index,
            index,
            aside: true,
            events: Vec::with_capacity(events),
        }
    }

    /// Numbers the next change, under the feed's lock: its index, after the last.
    fn number(&self, f: &mut Feed) -> u64 {
        let index = next_index(f.last);
        self.current.store(index, Ordering::Release);
        f.last = index;
        index
    }

    /// Tells the streams that show private events (those holding the read token)
    /// that they missed some, dropped on their way to the feed: each gets `reset`
    /// and ends, whatever its filter, and no resume reaches back before this point
    /// (a client resuming from before is reset too).
    pub fn reset_private_streams(&self) {
        let mut f = self.feed();
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
        self.index.send_replace(index);
    }

    /// Moves the index without events (loading, which nobody could have watched);
    /// `summary` renders the summary as it is then, the one the next `summary`
    /// event is compared with.
    pub fn advance(&self, summary: impl FnOnce() -> Vec<u8>) {
        let mut f = self.feed();
        let index = self.number(&mut f);
        // Nothing before the load can be replayed.
        f.floor = index;
        f.last_summary = summary();
        self.index.send_replace(index);
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

/// A change numbered and not sent yet: it holds the feed, so nothing else is
/// numbered or sent meanwhile.
#[derive(Debug)]
#[must_use = "a numbered change reaches nobody until it is sent"]
pub struct Publishing<'a> {
    changes: &'a Changes,
    feed: MutexGuard<'a, Feed>,
    previous: u64,
    index: u64,
    /// Beside the catalog's changes: the index does not move.
    aside: bool,
    events: Vec<Event>,
}

impl Publishing<'_> {
    /// The change's index, the `id` of its events.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Adds an event, after those added before.
    pub fn push(&mut self, event: Event) {
        self.events.push(event);
    }

    /// Adds a `summary` event with `data` when it differs from the last summary
    /// sent.
    pub fn summary(&mut self, data: Vec<u8>) {
        if data != self.feed.last_summary {
            self.events
                .push(Event::new("summary", "", None, self.index, &data, None));
            self.feed.last_summary = data;
        }
    }

    /// Keeps the change in the window and sends it. A change no event shows is
    /// kept too, without events: its index may come back as a `since` (a reader's
    /// last index). Returns the index before the change and the change's own (the
    /// same, beside the catalog's changes).
    pub fn send(mut self) -> (u64, u64) {
        let index = self.index;
        let change = Arc::new(Change {
            index,
            events: std::mem::take(&mut self.events),
        });
        let f = &mut *self.feed;
        if self.aside {
            if change.events.is_empty() {
                return (index, index);
            }
            if f.window.len() >= f.retained {
                f.evict();
            }
            f.window.push_back(change.clone());
            let _ = f.tx.send(change);
            return (index, index);
        }
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
        (self.previous, index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(c: &Changes, aside: bool, kind: &'static str) -> u64 {
        let mut p = if aside { c.begin_aside(1) } else { c.begin(1) };
        let index = p.index();
        p.push(Event::new(kind, "z", None, index, b"{}", None));
        p.send();
        index
    }

    /// Events beside the catalog's changes reach the streams with the last
    /// change's index as id, move neither the index nor its watch, and are
    /// replayed after that change to a resume from before it.
    #[tokio::test]
    async fn events_aside_do_not_move_the_index() {
        let c = Changes::new(start_index());
        let mut watch = c.watch();
        let mut sub = c.subscribe(None);
        let zone = publish(&c, false, "zone");
        watch.borrow_and_update();
        let before = sub.feed.recv().await.unwrap();
        assert_eq!(before.index, zone);
        assert_eq!(publish(&c, true, "history"), zone);
        assert_eq!(publish(&c, true, "history"), zone);
        assert_eq!(c.index(), zone);
        assert!(!watch.has_changed().unwrap(), "no blocking query wakes");
        let h = sub.feed.recv().await.unwrap();
        assert_eq!((h.index, h.events[0].kind), (zone, "history"));
        assert!(
            std::str::from_utf8(&h.events[0].frame)
                .unwrap()
                .contains(&format!("id: {zone}\n"))
        );
        // A resume from before the change gets it and what went beside it; one
        // from the change itself gets nothing more.
        let kinds = |since| -> Vec<&'static str> {
            c.subscribe(Some(since))
                .replay
                .unwrap()
                .iter()
                .flat_map(|ch| ch.events.iter().map(|e| e.kind))
                .collect()
        };
        let start = c.feed().floor;
        assert_eq!(kinds(start), ["zone", "history", "history"]);
        assert!(kinds(zone).is_empty());
        // The next catalog change moves the index past it.
        let next = publish(&c, false, "zone");
        assert!(next > zone);
        assert!(watch.has_changed().unwrap());
        assert_eq!(kinds(zone), ["zone"]);
    }
}
