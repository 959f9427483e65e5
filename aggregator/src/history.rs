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
//! history are reset, so that their clients read the history again. Those events
//! do not move the catalog index (contract section 11): they carry the index of
//! the last catalog change, so a blocking query never wakes for them.
//!
//! The history is bounded in entries, age and bytes ([`log::Retention`]), each
//! detail string is cut to [`entry::MAX_DETAIL_STRING`], and [`limit`] bounds how
//! fast one instance or the diagnoses add entries.

pub mod entry;
mod index;
pub mod limit;
pub mod log;
pub mod metrics;
pub mod writer;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tracing::warn;

pub use entry::{ChangedBy, Detail, GroupDetail, Kind, LeftReason, Pending, StatusReason};
pub use limit::{DEFAULT_MAX_DIAGNOSES, Rates};
pub use log::{DB_FILE, Found, HistoryDb, HistoryError, Query, Retention, Row, replica_file};
pub use metrics::HistoryMetrics;
pub use writer::HistoryEvent;

use crate::changes::{Changes, Event};
use writer::Msg;

/// Default `--history-retention`.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default `--history-max-entries`.
pub const DEFAULT_MAX_ENTRIES: u64 = 1_000_000;
/// Default `--history-max-bytes`: half the volume the manifests give the data
/// directory (1 GiB), which leaves room for the catalog, for the pages a commit
/// writes before it frees the old ones, and for redb's own bookkeeping.
pub const DEFAULT_MAX_BYTES: u64 = 512 << 20;
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
    /// `--history-max-bytes`: beyond it the oldest are dropped.
    pub max_bytes: u64,
    /// `--history-max-diagnoses`: `diagnosed` entries recorded a minute at most.
    pub max_diagnoses: u32,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig {
            retention: DEFAULT_RETENTION,
            max_entries: DEFAULT_MAX_ENTRIES,
            max_bytes: DEFAULT_MAX_BYTES,
            max_diagnoses: DEFAULT_MAX_DIAGNOSES,
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
    /// How fast one instance, and the diagnoses, may add entries.
    rates: Arc<Rates>,
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
            max_bytes: config.max_bytes,
        })?;
        let rates = Arc::new(Rates::new(config.max_diagnoses));
        let (queue, rx) = std::sync::mpsc::sync_channel(QUEUE);
        let (events_tx, batches) = mpsc::channel(EVENT_BATCHES);
        let missed = Arc::new(AtomicBool::new(false));
        let events_tx = writer::Events {
            tx: events_tx,
            missed: missed.clone(),
        };
        let m = metrics.clone();
        let r = rates.clone();
        let writer = std::thread::Builder::new()
            .name("meshcat-history".into())
            .spawn(move || writer::run(appender, rx, events_tx, m, &r))
            .map_err(HistoryError::Writer)?;
        let events = Feed { batches, missed };
        Ok(History {
            queue,
            db,
            metrics,
            warned_ms: AtomicI64::new(0),
            events: Mutex::new(Some(events)),
            rates,
            writer: Some(writer),
        })
    }

    /// Records `entry`, about one instance, at `now` (the time of the report that
    /// showed it), within the instance's allowance a minute ([`limit`]): past it the
    /// change is counted, and the minute's count is recorded as one
    /// `instance-flapping` entry once the minute is over.
    pub fn record_instance(&self, entry: Pending, now: Instant) {
        let admitted = self.rates.instance(&entry, now);
        for summary in admitted.due {
            self.record(summary);
        }
        if admitted.record {
            self.record(entry);
        } else {
            self.metrics
                .unrecorded
                .with_label_values(&["flapping"])
                .inc();
        }
    }

    /// Records a `diagnosed` entry at `now`, unless `--history-max-diagnoses`
    /// were recorded within the minute: then it is only counted.
    pub fn record_diagnosis(&self, entry: Pending, now: Instant) {
        if self.rates.diagnosis(now) {
            self.record(entry);
        } else {
            self.metrics
                .unrecorded
                .with_label_values(&["diagnoses"])
                .inc();
        }
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
/// true, beside the catalog's changes: they do not move the catalog index (only
/// `GET /history` shows them, never `/summary` or the other indexed routes), and
/// carry the index of the last catalog change as their id. Only callers holding
/// the read token see them. After a batch was
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

/// One stored batch as `history` events beside the catalog's changes.
fn publish_batch(changes: &Changes, batch: &[HistoryEvent]) {
    if batch.is_empty() {
        return;
    }
    let mut p = changes.begin_aside(batch.len());
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
