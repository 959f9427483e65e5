//! The writer thread: takes what was recorded from the bounded queue, gathers it for
//! at most [`GATHER`] after the first entry (or [`MAX_BATCH`] entries), stores the
//! batch in one durable commit, then hands the stored entries to the change feed as
//! `history` events. Retention runs with every commit and every
//! [`EXPIRE_EVERY`] when nothing happens, at once again while it is behind (a long
//! downtime or a lowered limit is caught up in short commits). A batch of events
//! the change feed has no room for is counted (`meshcat_history_events_dropped_total`),
//! logged, and makes the event streams that show history `reset`. Every detail is
//! cut to [`super::entry::MAX_DETAIL_STRING`] here, off the paths that record, and
//! the `instance-flapping` summaries of instances that went quiet are added here
//! ([`super::limit::Rates::sweep`]). While the storage refuses writes (a full disk),
//! batches are dropped and counted (`meshcat_history_dropped_total`,
//! `meshcat_history_writable` 0) and the database is healed every
//! [`crate::redb_file::RETRY`], so appending resumes once space returns.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc::error::TrySendError;
use tracing::{error, warn};

use super::entry::{Pending, Stored, now_ms};
use super::limit::Rates;
use super::log::{Appender, HistoryError};
use super::metrics::HistoryMetrics;
use crate::redb_file::RETRY;

/// How long the writer gathers entries after the first of a batch: an entry is
/// durable within this plus one commit (a few ms), far inside the second the
/// contract allows, and a burst costs one fsync per period.
pub const GATHER: Duration = Duration::from_millis(50);
/// Most entries in one commit.
pub const MAX_BATCH: usize = 8192;
/// How often retention runs when no entry arrives.
pub const EXPIRE_EVERY: Duration = Duration::from_secs(30);

/// What the queue carries.
#[derive(Debug)]
pub(super) enum Msg {
    Entry(Box<Pending>),
    /// Commit what is queued, then answer.
    Flush(std::sync::mpsc::Sender<()>),
    /// Commit what is queued and stop.
    Stop,
}

/// One stored entry as the change feed sends it.
#[derive(Debug, Clone)]
pub struct HistoryEvent {
    pub zone: String,
    pub cluster: String,
    /// The entry's JSON, as `GET /history` answers it.
    pub json: Bytes,
}

/// Stored batches on their way to the change feed, and the mark of a batch that
/// found no room there.
#[derive(Debug, Clone)]
pub struct Events {
    pub(super) tx: tokio::sync::mpsc::Sender<Vec<HistoryEvent>>,
    /// Set when a batch was dropped; taken by [`super::publish_events`].
    pub(super) missed: Arc<AtomicBool>,
}

/// Most WARN lines about dropped event batches: one a minute.
const WARN_EVERY: Duration = Duration::from_secs(60);

pub(super) fn run(
    mut log: Appender,
    rx: Receiver<Msg>,
    events: Events,
    metrics: HistoryMetrics,
    rates: &Rates,
) {
    metrics.entries.set(log.len() as i64);
    metrics.bytes.set(log.bytes() as i64);
    metrics.writable.set(1);
    let mut batch: Vec<Pending> = Vec::with_capacity(256);
    let mut warned = Warned::default();
    loop {
        let mut stopping = false;
        let mut flushed = None;
        // Retention that is behind goes on as soon as nothing is queued; storage
        // that refuses writes is healed while nothing is.
        let wait = if log.behind() {
            Duration::ZERO
        } else if !log.writable() {
            RETRY
        } else {
            EXPIRE_EVERY
        };
        match rx.recv_timeout(wait) {
            Ok(Msg::Entry(p)) => batch.push(*p),
            Ok(Msg::Flush(done)) => flushed = Some(done),
            Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => stopping = true,
            Err(RecvTimeoutError::Timeout) => {
                if !log.writable() {
                    let _ = log.heal();
                    metrics.writable.set(i64::from(log.writable()));
                }
                batch.extend(rates.sweep(Instant::now()));
                if batch.is_empty() {
                    // Retention waits for the storage to take writes again.
                    if !log.writable() {
                        continue;
                    }
                    match log.expire(now_ms()) {
                        Ok(0) => {}
                        Ok(_) => {
                            metrics.entries.set(log.len() as i64);
                            metrics.bytes.set(log.bytes() as i64);
                        }
                        Err(e) => warn!(error = %e, "History retention failed; tried again later."),
                    }
                    continue;
                }
            }
        }
        let until = Instant::now() + GATHER;
        while !stopping && flushed.is_none() && batch.len() < MAX_BATCH {
            match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(Msg::Entry(p)) => batch.push(*p),
                Ok(Msg::Flush(done)) => flushed = Some(done),
                Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => stopping = true,
                Err(RecvTimeoutError::Timeout) => break,
            }
        }
        batch.extend(rates.sweep(Instant::now()));
        if stopping {
            // Whatever was recorded before the stop is stored too.
            while let Ok(msg) = rx.try_recv() {
                match msg {
                    Msg::Entry(p) => batch.push(*p),
                    Msg::Flush(done) => drop(done),
                    Msg::Stop => {}
                }
            }
        }
        commit(&mut log, &mut batch, &events, &metrics, &mut warned);
        if let Some(done) = flushed {
            let _ = done.send(());
        }
        if stopping {
            return;
        }
    }
}

/// When the writer last warned, per cause: at most one line a minute each.
#[derive(Debug, Default)]
struct Warned {
    events: Option<Instant>,
    unstored: Option<Instant>,
}

/// Whether a warning last given at `at` may be given again now (and notes it).
fn due(at: &mut Option<Instant>) -> bool {
    let due = at.is_none_or(|t| t.elapsed() >= WARN_EVERY);
    if due {
        *at = Some(Instant::now());
    }
    due
}

fn commit(
    log: &mut Appender,
    batch: &mut Vec<Pending>,
    events: &Events,
    metrics: &HistoryMetrics,
    warned: &mut Warned,
) {
    for p in batch.iter_mut() {
        p.detail.cap();
    }
    for chunk in batch.chunks(MAX_BATCH) {
        let mut out = Vec::with_capacity(chunk.len());
        let stored = log.append(chunk, now_ms(), |id, s| {
            out.push(HistoryEvent {
                zone: s.zone.to_owned(),
                cluster: s.cluster.to_owned(),
                json: Bytes::from(json(id, &s)),
            });
        });
        match stored {
            Ok(()) => {
                metrics.appended.inc_by(chunk.len() as u64);
                // A full feed only costs the events (the entries are stored): counted,
                // logged, and the streams are told. A closed one has no streams left.
                if let Err(TrySendError::Full(lost)) = events.tx.try_send(out) {
                    events.missed.store(true, Ordering::Release);
                    metrics.events_dropped.inc_by(lost.len() as u64);
                    if due(&mut warned.events) {
                        warn!(
                            dropped_total = metrics.events_dropped.get(),
                            "History events dropped: the change feed is behind. The entries are stored; event streams that show history get reset."
                        );
                    }
                }
            }
            // The storage refuses writes (its failure and its healing are logged
            // where they happen): the entries are counted, and a line a minute says so.
            Err(HistoryError::Unwritable(cause)) => {
                metrics.dropped.inc_by(chunk.len() as u64);
                if due(&mut warned.unstored) {
                    warn!(
                        dropped_total = metrics.dropped.get(),
                        cause = %cause,
                        "History entries dropped: its storage refuses writes. Appending resumes once it takes them again."
                    );
                }
            }
            Err(e) => {
                metrics.dropped.inc_by(chunk.len() as u64);
                error!(entries = chunk.len(), error = %e, "History entries not stored.");
            }
        }
    }
    metrics.entries.set(log.len() as i64);
    metrics.bytes.set(log.bytes() as i64);
    metrics.writable.set(i64::from(log.writable()));
    batch.clear();
}

/// The entry as `GET /history` answers it: the fields of
/// [`meshcat_common::model::HistoryEntry`] in its order, the detail as stored.
pub fn json(id: u64, s: &Stored<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(96 + s.detail.len());
    write_json(&mut out, id, s);
    out
}

/// Appends [`json`]'s rendering to `out`.
pub fn write_json(out: &mut Vec<u8>, id: u64, s: &Stored<'_>) {
    let string = |out: &mut Vec<u8>, v: &str| {
        serde_json::to_writer(&mut *out, v).expect("strings serialise");
    };
    out.extend_from_slice(b"{\"id\":");
    out.extend_from_slice(id.to_string().as_bytes());
    out.extend_from_slice(b",\"atMs\":");
    out.extend_from_slice(s.at_ms.to_string().as_bytes());
    out.extend_from_slice(b",\"kind\":\"");
    out.extend_from_slice(s.kind.as_str().as_bytes());
    out.extend_from_slice(b"\",\"zoneName\":");
    string(out, s.zone);
    out.extend_from_slice(b",\"clusterName\":");
    string(out, s.cluster);
    out.extend_from_slice(b",\"instance\":");
    string(out, s.instance);
    out.extend_from_slice(b",\"detail\":");
    if s.detail.is_empty() {
        out.extend_from_slice(b"{}");
    } else {
        out.extend_from_slice(s.detail);
    }
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::entry::Kind;

    /// The rendering is the model's, field for field.
    #[test]
    fn rendered_json_is_the_models() {
        let s = Stored {
            at_ms: 1_712_345_678_901,
            kind: Kind::InstanceRestarted,
            zone: "zone-a",
            cluster: "orders",
            instance: "orders-\"7\"",
            detail: br#"{"startTime":2,"previousStartTime":1}"#,
        };
        let ours: serde_json::Value = serde_json::from_slice(&json(42, &s)).unwrap();
        let model = serde_json::to_value(s.to_entry(42)).unwrap();
        assert_eq!(ours, model);
        let back: meshcat_common::model::HistoryEntry =
            serde_json::from_slice(&json(42, &s)).unwrap();
        assert_eq!(back, s.to_entry(42));
    }
}
