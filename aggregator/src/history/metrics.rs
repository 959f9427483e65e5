//! The history's own metric families.

use prometheus::{IntCounter, IntGauge, Registry};

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
}

impl HistoryMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<HistoryMetrics> {
        let appended = IntCounter::new(
            "meshcat_history_appended_total",
            "History entries stored durably.",
        )?;
        let dropped = IntCounter::new(
            "meshcat_history_dropped_total",
            "History entries lost: the writer's queue was full or their commit failed.",
        )?;
        let entries = IntGauge::new(
            "meshcat_history_entries",
            "History entries held (at most --history-max-entries).",
        )?;
        let events_dropped = IntCounter::new(
            "meshcat_history_events_dropped_total",
            "Stored history entries whose history event was dropped: the change feed was behind.",
        )?;
        registry.register(Box::new(appended.clone()))?;
        registry.register(Box::new(events_dropped.clone()))?;
        registry.register(Box::new(dropped.clone()))?;
        registry.register(Box::new(entries.clone()))?;
        Ok(HistoryMetrics {
            appended,
            dropped,
            entries,
            events_dropped,
        })
    }

    /// Families no registry exposes, for a history without a process around it.
    pub fn unregistered() -> HistoryMetrics {
        HistoryMetrics::register(&Registry::new()).expect("a fresh registry takes them")
    }
}
