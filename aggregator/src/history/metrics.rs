//! The history's own metric families.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

#[derive(Debug, Clone)]
pub struct HistoryMetrics {
    /// Entries stored durably.
    pub appended: IntCounter,
    /// Entries lost: the writer's queue was full (recording never waits), or their
    /// commit failed.
    pub dropped: IntCounter,
    /// Entries held after the last commit.
    pub entries: IntGauge,
    /// Stored entries whose `history` event was dropped: the change feed had no
    /// room for their batch.
    pub events_dropped: IntCounter,
    /// Bytes the entries held take, as the byte bound counts them.
    pub bytes: IntGauge,
    /// Whether the history's storage takes writes: 0 from a commit refused for
    /// its storage (a full disk) until it heals.
    pub writable: IntGauge,
    /// Entries not recorded one by one, by reason: `flapping` (an instance past its
    /// allowance a minute, summed into `instance-flapping`) or `diagnoses` (past
    /// `--history-max-diagnoses`).
    pub unrecorded: IntCounterVec,
}

impl HistoryMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<HistoryMetrics> {
        let appended = IntCounter::new(
            "meshcat_history_appended_total",
            "History entries stored durably.",
        )?;
        let dropped = IntCounter::new(
            "meshcat_history_dropped_total",
            "History entries lost: the writer's queue was full, or their commit failed or was refused (a full disk, see meshcat_history_writable).",
        )?;
        let entries = IntGauge::new(
            "meshcat_history_entries",
            "History entries held (at most --history-max-entries).",
        )?;
        let events_dropped = IntCounter::new(
            "meshcat_history_events_dropped_total",
            "Stored history entries whose history event was dropped: the change feed was behind.",
        )?;
        let bytes = IntGauge::new(
            "meshcat_history_bytes",
            "Bytes the history's entries take as --history-max-bytes counts them.",
        )?;
        let writable = IntGauge::new(
            "meshcat_history_writable",
            "1 while the history's storage takes writes; 0 from a commit it refused (a full disk: entries are dropped and counted) until it takes writes again.",
        )?;
        let unrecorded = IntCounterVec::new(
            Opts::new(
                "meshcat_history_unrecorded_total",
                "History entries not recorded one by one: an instance past its allowance a minute (reason flapping, summed into instance-flapping) or diagnoses past --history-max-diagnoses (reason diagnoses).",
            ),
            &["reason"],
        )?;
        // Both reasons are exposed from the start, at 0.
        for reason in ["flapping", "diagnoses"] {
            unrecorded.with_label_values(&[reason]);
        }
        registry.register(Box::new(bytes.clone()))?;
        registry.register(Box::new(writable.clone()))?;
        registry.register(Box::new(unrecorded.clone()))?;
        registry.register(Box::new(appended.clone()))?;
        registry.register(Box::new(events_dropped.clone()))?;
        registry.register(Box::new(dropped.clone()))?;
        registry.register(Box::new(entries.clone()))?;
        Ok(HistoryMetrics {
            appended,
            dropped,
            entries,
            events_dropped,
            bytes,
            writable,
            unrecorded,
        })
    }

    /// Families no registry exposes, for a history without a process around it.
    pub fn unregistered() -> HistoryMetrics {
        HistoryMetrics::register(&Registry::new()).expect("a fresh registry takes them")
    }
}
