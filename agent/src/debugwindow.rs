//! The timed debug window of one sidecar (contract section 5, verify mTLS): raise the
//! sidecar's log level to `debug` for a bounded time, restore the level it had before,
//! and hand back the tailed log lines of the window that name TLS failures.
//!
//! A window runs on a task owned by the agent, not by the request that asked for it:
//! the level is restored even if the asker (the aggregator, over QUIC) goes away. A
//! request arriving while a window runs joins it (the window lasts to the later end and
//! restores once, to the level before the first). On agent shutdown the level is
//! restored at once. A failed restore is retried with backoff, then logged as an error.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use meshcat_common::envoy_log::MAX_DEBUG_WINDOW_SECONDS;
use meshcat_common::wire::DebugWindowOutput;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::logtail::{LogTail, TailedLine, now_ms};

/// Shortest window a request may ask for.
pub const DEBUG_WINDOW_MIN: Duration = Duration::from_secs(1);
/// Longest window a request may ask for (the `--debug-window-max` bound).
pub const DEBUG_WINDOW_MAX: Duration = Duration::from_secs(MAX_DEBUG_WINDOW_SECONDS as u64);
/// Longest a window may grow to, from its start, by requests joining it.
pub const DEBUG_WINDOW_MAX_TOTAL: Duration = Duration::from_secs(600);
/// Default wait after the restore for lines the sidecar logged during the window but
/// had not flushed to its file yet.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(1);
/// Most TLS lines handed back; the count of all matches is reported beside them.
pub const MAX_TLS_LINES: usize = 100;
/// What marks a TLS failure in Envoy's debug log: both Envoy spellings and the seed's.
pub use meshcat_common::envoy_log::TLS_MARKERS;
/// Envoy's name of the level a window sets.
pub const DEBUG_LEVEL: &str = "debug";
/// Attempts at restoring the previous level before giving up.
const RESTORE_ATTEMPTS: u32 = 5;
/// Wait before the second restore attempt; doubled after each failure.
const RESTORE_BACKOFF: Duration = Duration::from_millis(100);
/// How often the window's new lines are scanned, so a flood that pushes them out of
/// the ring before the window ends is still matched.
const SCAN_INTERVAL: Duration = Duration::from_secs(1);

/// Reads and sets a sidecar's log level (through its admin API). Levels are Envoy's
/// names: trace, debug, info, warning, error, critical, off.
pub trait LevelControl: Send + Sync + 'static {
    /// The sidecar's current level.
    fn get_level(&self) -> BoxFuture<'static, Result<String, String>>;
    /// Sets the level of all the sidecar's loggers.
    fn set_level(&self, level: &str) -> BoxFuture<'static, Result<(), String>>;
}

/// Why a debug window did not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum DebugWindowError {
    #[error("a debug window of {0} ms is outside 1 to {max} seconds", max = MAX_DEBUG_WINDOW_SECONDS)]
    Duration(u128),
    #[error("cannot read the sidecar's log level: {0}")]
    GetLevel(String),
    #[error("cannot set the sidecar's log level to debug: {0}")]
    SetLevel(String),
    #[error("the agent is shutting down")]
    ShuttingDown,
    #[error("the debug window stopped unexpectedly")]
    Aborted,
}

/// What a debug window saw: the summary the agent answers with, and where the
/// window's lines stand in the tail.
#[derive(Debug, Clone, PartialEq)]
pub struct DebugWindowReport {
    /// The window's summary as the agent answers it: the level before the window, its
    /// times, whether the level was restored, and the lines naming TLS failures (the
    /// first [`MAX_TLS_LINES`]) with the count of all of them.
    pub summary: DebugWindowOutput,
    /// Sequence numbers of the window's lines in the tail: after `after_seq`, up to
    /// and including `last_seq`, for a reader that wants all of them.
    pub after_seq: u64,
    pub last_seq: u64,
}

/// Whether a log line names a TLS failure.
pub fn is_tls_line(text: &str) -> bool {
    TLS_MARKERS.iter().any(|m| text.contains(m))
}

/// Checks a requested window length against its bounds.
pub fn check_duration(d: Duration) -> Result<(), DebugWindowError> {
    if (DEBUG_WINDOW_MIN..=DEBUG_WINDOW_MAX).contains(&d) {
        Ok(())
    } else {
        Err(DebugWindowError::Duration(d.as_millis()))
    }
}

type Outcome = Option<Result<DebugWindowReport, DebugWindowError>>;

/// The debug windows of one sidecar. Clones share the same state.
#[derive(Clone)]
pub struct DebugWindows {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DebugWindows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DebugWindows")
            .field("tail", &self.inner.tail)
            .field("settle", &self.inner.settle)
            .finish_non_exhaustive()
    }
}

struct Inner {
    /// The sidecar's level.
    control: Arc<dyn LevelControl>,
    /// The sidecar's log, when one is configured.
    tail: Option<LogTail>,
    /// The agent's shutdown: ends a running window at once, refuses new ones.
    cancel: CancellationToken,
    /// Wait after the restore for lines still in the sidecar's write buffer.
    settle: Duration,
    /// The running window that new requests join, if any.
    active: Mutex<Option<Active>>,
    /// Held by a window from reading the level until it restored it, so a window
    /// never reads, as the level to restore, the debug level another one set.
    level_lock: tokio::sync::Mutex<()>,
    /// Numbers windows, so a finishing window clears only its own entry.
    next_id: Mutex<u64>,
}

/// A window that requests can still join.
struct Active {
    id: u64,
    started: Instant,
    /// When the window ends; joiners move it later.
    end: watch::Sender<Instant>,
    /// The window's outcome, once it is there.
    outcome: watch::Receiver<Outcome>,
}

impl DebugWindows {
    /// Windows of the sidecar behind `control`, whose log `tail` follows (if any),
    /// until `cancel`.
    pub fn new(
        control: Arc<dyn LevelControl>,
        tail: Option<LogTail>,
        cancel: CancellationToken,
    ) -> Self {
        Self::with_settle(control, tail, cancel, DEFAULT_SETTLE)
    }

    /// As [`DebugWindows::new`] with another wait for unflushed lines after the
    /// restore (Envoy's `--file-flush-interval-msec` when it writes a file itself).
    pub fn with_settle(
        control: Arc<dyn LevelControl>,
        tail: Option<LogTail>,
        cancel: CancellationToken,
        settle: Duration,
    ) -> Self {
        DebugWindows {
            inner: Arc::new(Inner {
                control,
                tail,
                cancel,
                settle,
                active: Mutex::new(None),
                level_lock: tokio::sync::Mutex::new(()),
                next_id: Mutex::new(0),
            }),
        }
    }

    /// Runs a window of `duration` (or joins the running one) and waits for its
    /// report. Dropping the returned future does not stop the window.
    pub async fn run(&self, duration: Duration) -> Result<DebugWindowReport, DebugWindowError> {
        check_duration(duration)?;
        if self.inner.cancel.is_cancelled() {
            return Err(DebugWindowError::ShuttingDown);
        }
        let mut outcome = self.start_or_join(duration);
        match outcome.wait_for(Option::is_some).await {
            Ok(o) => o.clone().unwrap_or(Err(DebugWindowError::Aborted)),
            Err(_) => Err(DebugWindowError::Aborted),
        }
    }

    /// All lines of a window this sidecar ran that the tail still holds (the diagnosis
    /// also reads the secrets-stream lines Envoy writes at debug level).
    pub fn lines_of(&self, report: &DebugWindowReport) -> Vec<TailedLine> {
        let Some(tail) = &self.inner.tail else {
            return Vec::new();
        };
        let mut lines = tail.lines_since(report.after_seq);
        lines.retain(|l| l.seq <= report.last_seq);
        lines
    }

    /// After the agent's cancel: resolves once no window holds the level raised.
    pub async fn wait_restored(&self) {
        let _turn = self.inner.level_lock.lock().await;
    }

    fn start_or_join(&self, duration: Duration) -> watch::Receiver<Outcome> {
        let now = Instant::now();
        let mut active = self.inner.active();
        if let Some(a) = active.as_ref() {
            let end = (now + duration).min(a.started + DEBUG_WINDOW_MAX_TOTAL);
            a.end.send_if_modified(|e| {
                let later = end > *e;
                if later {
                    *e = end;
                }
                later
            });
            info!(
                window = a.id,
                "Debug window request joined the running window."
            );
            return a.outcome.clone();
        }
        let id = {
            let mut n = self.inner.next_id.lock().unwrap_or_else(|p| p.into_inner());
            *n += 1;
            *n
        };
        let (end_tx, end_rx) = watch::channel(now + duration);
        let (outcome_tx, outcome_rx) = watch::channel(None);
        *active = Some(Active {
            id,
            started: now,
            end: end_tx,
            outcome: outcome_rx.clone(),
        });
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let result = inner.window(id, end_rx).await;
            inner.close(id);
            if let Err(e) = &result {
                warn!(window = id, error = %e, "Debug window did not run.");
            }
            // Nobody waiting is fine: the asker may have gone away.
            let _ = outcome_tx.send(Some(result));
        });
        outcome_rx
    }
}

impl Inner {
    fn active(&self) -> MutexGuard<'_, Option<Active>> {
        self.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops new requests from joining window `id`.
    fn close(&self, id: u64) {
        let mut active = self.active();
        if active.as_ref().is_some_and(|a| a.id == id) {
            *active = None;
        }
    }

    /// Window `id` lasts its length from now, when the sidecar is at debug: the
    /// time spent waiting for the level lock and reading the level moves its end
    /// (joiners' extensions included) and its total bound later by as much.
    fn count_from_now(&self, id: u64) {
        let mut active = self.active();
        if let Some(a) = active.as_mut().filter(|a| a.id == id) {
            let now = Instant::now();
            let waited = now.saturating_duration_since(a.started);
            a.started = now;
            a.end.send_modify(|e| *e += waited);
        }
    }

    /// Closes window `id` if its end has come; false when a joiner moved the end
    /// meanwhile. Checked under the lock joiners extend under, so none is lost.
    fn close_if_due(&self, id: u64, end: &watch::Receiver<Instant>) -> bool {
        let mut active = self.active();
        if *end.borrow() > Instant::now() {
            return false;
        }
        if active.as_ref().is_some_and(|a| a.id == id) {
            *active = None;
        }
        true
    }

    async fn window(
        &self,
        id: u64,
        mut end: watch::Receiver<Instant>,
    ) -> Result<DebugWindowReport, DebugWindowError> {
        let _turn = self.level_lock.lock().await;
        if self.cancel.is_cancelled() {
            return Err(DebugWindowError::ShuttingDown);
        }
        let previous = self
            .control
            .get_level()
            .await
            .map_err(DebugWindowError::GetLevel)?;
        if self.cancel.is_cancelled() {
            return Err(DebugWindowError::ShuttingDown);
        }
        let mut scan = Scan::default();
        if let Some(tail) = &self.tail {
            // Lines already in the file belong before the window.
            tail.refresh().await;
            scan.after_seq = tail.last_seq();
            scan.next_seq = scan.after_seq;
        }
        let started_at_ms = now_ms();
        self.control
            .set_level(DEBUG_LEVEL)
            .await
            .map_err(DebugWindowError::SetLevel)?;
        info!(window = id, previous_level = %previous, "Sidecar log level raised to debug for a debug window.");
        self.count_from_now(id);

        let mut tick = tokio::time::interval(SCAN_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let cut_short = loop {
            let until = *end.borrow_and_update();
            tokio::select! {
                _ = self.cancel.cancelled() => break true,
                _ = tokio::time::sleep_until(until) => {
                    if self.close_if_due(id, &end) {
                        break false;
                    }
                }
                _ = end.changed() => {}
                _ = tick.tick() => {
                    if let Some(tail) = &self.tail {
                        scan.collect(tail);
                    }
                }
            }
        };
        self.close(id);
        let restored = self.restore(id, &previous).await;
        let ended_at_ms = now_ms();
        if let Some(tail) = &self.tail {
            if !cut_short {
                tokio::select! {
                    _ = self.cancel.cancelled() => {}
                    _ = tokio::time::sleep(self.settle) => {}
                }
            }
            tail.refresh().await;
            scan.collect(tail);
            scan.last_seq = tail.last_seq();
        }
        Ok(DebugWindowReport {
            summary: DebugWindowOutput {
                previous_level: previous,
                started_at_ms,
                ended_at_ms,
                restored,
                cut_short,
                log_tailed: self.tail.is_some(),
                line_count: scan.last_seq.saturating_sub(scan.after_seq),
                tls_lines: scan.tls_lines,
                tls_line_count: scan.tls_line_count,
            },
            after_seq: scan.after_seq,
            last_seq: scan.last_seq.max(scan.after_seq),
        })
    }

    /// Sets `level` back, retrying with backoff; true when it took.
    async fn restore(&self, id: u64, level: &str) -> bool {
        let mut backoff = RESTORE_BACKOFF;
        for attempt in 1..=RESTORE_ATTEMPTS {
            match self.control.set_level(level).await {
                Ok(()) => {
                    info!(
                        window = id,
                        level, "Sidecar log level restored after the debug window."
                    );
                    return true;
                }
                Err(e) if attempt < RESTORE_ATTEMPTS => {
                    warn!(window = id, level, attempt, error = %e, "Restoring the sidecar log level failed; retrying.");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
                Err(e) => {
                    error!(window = id, level, attempts = attempt, error = %e, "Cannot restore the sidecar log level; it stays at debug.");
                }
            }
        }
        false
    }
}

/// The window's lines scanned so far.
#[derive(Debug, Default)]
struct Scan {
    /// Last line read before the window.
    after_seq: u64,
    /// Last line scanned.
    next_seq: u64,
    /// Last line read when the window's lines were collected.
    last_seq: u64,
    /// The text of the window's lines with a TLS marker, the first [`MAX_TLS_LINES`].
    tls_lines: Vec<String>,
    tls_line_count: u64,
}

impl Scan {
    fn collect(&mut self, tail: &LogTail) {
        for line in tail.lines_since(self.next_seq) {
            self.next_seq = line.seq;
            if is_tls_line(&line.text) {
                self.tls_line_count += 1;
                if self.tls_lines.len() < MAX_TLS_LINES {
                    self.tls_lines.push(line.text);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds() {
        assert!(check_duration(Duration::from_secs(1)).is_ok());
        assert!(check_duration(Duration::from_secs(300)).is_ok());
        assert_eq!(
            check_duration(Duration::from_millis(999)),
            Err(DebugWindowError::Duration(999))
        );
        assert!(check_duration(Duration::from_secs(301)).is_err());
        assert!(check_duration(Duration::ZERO).is_err());
    }

    #[test]
    fn tls_markers() {
        assert!(is_tls_line(
            "[debug][connection] remote address:127.0.0.1:4,TLS_error:|268435581:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED:TLS_error_end"
        ));
        assert!(is_tls_line(
            "[debug][config] TLS error: Secret is not supplied by SDS"
        ));
        assert!(!is_tls_line(
            "[2026-01-01T00:00:00.000Z] \"GET /x HTTP/1.1\" 503 UF"
        ));
    }
}
