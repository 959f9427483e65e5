//! The history (contract section 15): what changed in the catalog and its sidecars,
//! and when, durable under `--data-dir` (`history.redb`, see [`log`]).
//!
//! Recording never waits: the points where something happens (the catalog's
//! registration and status paths, the live instances' paths, the sidecar commands, the
//! diagnosis) hand a [`Pending`] entry to a bounded queue with `try_send`, and one
//! writer thread ([`writer`]) stores what is queued in batches, one durable commit
//! each, at most [`writer::GATHER`] after the first entry of a batch. A full queue
//! drops the entry and counts it (`meshcat_history_dropped_total`): the ingest and the
//! API are never held up by the history. Stored entries reach `GET /events` as
//! `history` events through [`publish_events`]; a batch of them the feed has no room
//! for is counted (`meshcat_history_events_dropped_total`) and the streams that show
//! history are reset, so that their clients read the history again.

pub mod entry;
pub mod log;
pub mod metrics;
pub mod writer;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tracing::warn;

pub use entry::{ChangedBy, Detail, GroupDetail, Kind, LeftReason, Pending, StatusReason};
pub use log::{DB_FILE, Found, HistoryDb, HistoryError, Query, Retention, Row, replica_file};
pub use metrics::HistoryMetrics;
pub use writer::HistoryEvent;

use crate::changes::{Changes, Event};
use writer::Msg;

/// Default `--history-retention`.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default `--history-max-entries`.
pub const DEFAULT_MAX_ENTRIES: u64 = 1_000_000;
/// Entries queued for the writer at most: a burst this large (every instance of a
/// big fleet joining at once) is taken whole while the writer stores at its pace.
pub const QUEUE: usize = 65_536;
/// Stored batches queued for the change feed at most.
const EVENT_BATCHES: usize = 256;

/// How much history the aggregator keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryConfig {
    /// `--history-retention`: older entries are dropped.
    pub retention: Duration,
    /// `--history-max-entries`: beyond it the oldest are dropped; 0 keeps no history.
    pub max_entries: u64,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig {
            retention: DEFAULT_RETENTION,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

impl HistoryConfig {
    /// Whether any history is kept.
    pub fn is_on(&self) -> bool {
        self.max_entries > 0
    }
}

/// The history of one aggregator: the queue to its writer and its database for
/// queries. Dropping it stores what is queued and closes the database.
#[derive(Debug)]
pub struct History {
    queue: SyncSender<Msg>,
    db: HistoryDb,
    metrics: HistoryMetrics,
    /// When a dropped entry was last logged (ms since the epoch): at most one line a
    /// minute.
    warned_ms: AtomicI64,
    /// The stored entries for the change feed, until [`publish_events`] takes them.
    events: Mutex<Option<Feed>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl History {
    /// Opens the history `file` in `dir` and starts its writer.
    pub fn open(
        dir: &std::path::Path,
        file: &str,
        config: HistoryConfig,
        metrics: HistoryMetrics,
    ) -> Result<History, HistoryError> {
        let db = HistoryDb::open(dir, file)?;
        let appender = db.appender(Retention {
            max_age: config.retention,
            max_entries: config.max_entries,
        })?;
        let (queue, rx) = std::sync::mpsc::sync_channel(QUEUE);
        let (events_tx, batches) = mpsc::channel(EVENT_BATCHES);
        let missed = Arc::new(AtomicBool::new(false));
        let events_tx = writer::Events {
            tx: events_tx,
            missed: missed.clone(),
        };
        let m = metrics.clone();
        let writer = std::thread::Builder::new()
            .name("meshcat-history".into())
            .spawn(move || writer::run(appender, rx, events_tx, m))
            .map_err(HistoryError::Writer)?;
        let events = Feed { batches, missed };
        Ok(History {
            queue,
            db,
            metrics,
            warned_ms: AtomicI64::new(0),
            events: Mutex::new(Some(events)),
            writer: Some(writer),
        })
    }

    /// Queues `entry` for the writer, never waiting: with the queue full it is
    /// dropped and counted.
    pub fn record(&self, entry: Pending) {
        match self.queue.try_send(Msg::Entry(Box::new(entry))) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.metrics.dropped.inc();
                let now = entry::now_ms();
                let last = self.warned_ms.load(Ordering::Relaxed);
                if now - last >= 60_000
                    && self
                        .warned_ms
                        .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                {
                    warn!(
                        dropped_total = self.metrics.dropped.get(),
                        queue = QUEUE,
                        "History entries dropped: the writer's queue is full."
                    );
                }
            }
        }
    }

    /// Returns once everything recorded before the call is stored (or the writer
    /// is gone).
    pub fn flush(&self) {
        let (done, wait) = std::sync::mpsc::channel();
        if self.queue.send(Msg::Flush(done)).is_ok() {
            let _ = wait.recv();
        }
    }

    /// The database, for queries (each runs in its own read transaction).
    pub fn db(&self) -> &HistoryDb {
        &self.db
    }

    /// The stored entries for the change feed; once.
    pub fn take_events(&self) -> Option<Feed> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl Drop for History {
    fn drop(&mut self) {
        // Waits for room in the queue: the writer is draining it.
        let _ = self.queue.send(Msg::Stop);
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// The stored entries on their way to the change feed.
#[derive(Debug)]
pub struct Feed {
    batches: mpsc::Receiver<Vec<HistoryEvent>>,
    /// Set by the writer when a batch found no room.
    missed: Arc<AtomicBool>,
}

/// Sends each stored batch on the change feed as `history` events until `stop` turns
/// true, one change for a batch (the history is something a reader can see:
/// `GET /history`); only callers holding the read token see them. After a batch was
/// dropped on its way here, the streams that show history are reset first: their
/// clients missed entries.
pub async fn publish_events(
    changes: Arc<Changes>,
    mut events: Feed,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            batch = events.batches.recv() => match batch {
                Some(batch) => {
                    if events.missed.swap(false, Ordering::AcqRel) {
                        changes.reset_private_streams();
                    }
                    publish_batch(&changes, &batch);
                }
                None => return,
            },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// One stored batch as one change of `history` events.
fn publish_batch(changes: &Changes, batch: &[HistoryEvent]) {
    if batch.is_empty() {
        return;
    }
    let mut p = changes.begin(batch.len());
    let index = p.index();
    for e in batch {
        let cluster = (!e.cluster.is_empty()).then_some(e.cluster.as_str());
        p.push(Event::private("history", &e.zone, cluster, index, &e.json));
    }
    p.send();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored batch that finds the change feed full is counted, and the feed's
    /// next batch resets the streams that show history before it goes out.
    #[tokio::test]
    async fn events_the_feed_has_no_room_for_are_counted_and_reset_the_streams() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = HistoryMetrics::unregistered();
        let h = History::open(
            dir.path(),
            DB_FILE,
            HistoryConfig::default(),
            metrics.clone(),
        )
        .unwrap();
        // One entry a batch: nothing takes the feed yet, so the last finds it full.
        for _ in 0..=EVENT_BATCHES {
            h.record(Pending::new(
                Kind::ZoneRegistered,
                "z",
                "",
                "",
                Detail::Nothing {},
            ));
            h.flush();
        }
        assert_eq!(metrics.appended.get(), EVENT_BATCHES as u64 + 1);
        assert_eq!(metrics.events_dropped.get(), 1);
        assert_eq!(metrics.dropped.get(), 0, "the entries are stored");

        let changes = Arc::new(Changes::default());
        let mut sub = changes.subscribe(None);
        let (stop, stopping) = watch::channel(false);
        let task = tokio::spawn(publish_events(
            changes.clone(),
            h.take_events().unwrap(),
            stopping,
        ));
        let mut kinds = Vec::new();
        for _ in 0..3 {
            let change = sub.feed.recv().await.unwrap();
            kinds.push(change.events[0].kind);
        }
        assert_eq!(kinds, ["reset", "history", "history"]);
        stop.send(true).unwrap();
        task.await.unwrap();
    }
}
