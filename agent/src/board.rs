//! The board: the latest report of every scraped sidecar, keyed by instance name.
//! Scrapers write it; the QUIC reporter reads snapshots of it.

use std::collections::BTreeMap;
use std::sync::Mutex;

use meshcat_common::wire::InstanceReport;

/// Latest [`InstanceReport`] per instance. Never held across `.await`.
#[derive(Debug, Default)]
pub struct Board {
    /// Reports by instance name; sorted so snapshots are stable.
    reports: Mutex<BTreeMap<String, InstanceReport>>,
}

impl Board {
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the report of `report.instance`.
    pub fn put(&self, report: InstanceReport) {
        self.lock().insert(report.instance.clone(), report);
    }

    /// Forgets an instance (its target was removed).
    pub fn remove(&self, instance: &str) {
        self.lock().remove(instance);
    }

    /// The report of one instance.
    pub fn get(&self, instance: &str) -> Option<InstanceReport> {
        self.lock().get(instance).cloned()
    }

    /// Every current report, sorted by instance name.
    pub fn snapshot(&self) -> Vec<InstanceReport> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, InstanceReport>> {
        // A panic elsewhere while holding the lock leaves a map that is still whole.
        self.reports.lock().unwrap_or_else(|p| p.into_inner())
    }
}
