//! The board: the latest report of every scraped sidecar, keyed by its zone, cluster
//! and instance name.
//! Scrapers write it; the QUIC reporter reads snapshots of it.
//!
//! Each scraper writes under a lease it got when its target was added. Removing a
//! target ends its lease in the same locked step that drops its report, so a scrape
//! still in flight when the target is removed (an aborted task finishes the
//! synchronous part after its last `.await`) cannot bring the report, or the
//! target's scrape metrics, back.

use std::collections::BTreeMap;
use std::sync::Mutex;

use meshcat_common::wire::InstanceReport;

use crate::target::TargetKey;

/// Latest [`InstanceReport`] per instance. Never held across `.await`.
#[derive(Debug, Default)]
pub struct Board {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Reports by (zone, cluster, instance); sorted so snapshots are stable.
    reports: BTreeMap<TargetKey, InstanceReport>,
    /// The lease of each current target.
    leases: BTreeMap<TargetKey, Lease>,
    /// The next lease handed out; never reused.
    next: u64,
}

/// The right of one scraper to write one instance's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease(u64);

impl Board {
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes `target` current and answers the lease its scraper writes under; an
    /// earlier lease of the same target ends.
    pub fn lease(&self, target: &TargetKey) -> Lease {
        let mut s = self.lock();
        s.next += 1;
        let lease = Lease(s.next);
        s.leases.insert(target.clone(), lease);
        lease
    }

    /// Replaces the report of the report's target if `lease` is still its lease, and
    /// then runs `also` under the same lock (so what it records cannot outlive a
    /// removal either). Answers whether the report was taken.
    pub fn put(&self, lease: Lease, report: InstanceReport, also: impl FnOnce()) -> bool {
        let key = TargetKey::of_report(&report);
        let mut s = self.lock();
        if s.leases.get(&key) != Some(&lease) {
            return false;
        }
        s.reports.insert(key, report);
        also();
        true
    }

    /// Forgets a target (it was removed) and ends its lease.
    pub fn remove(&self, target: &TargetKey) {
        let mut s = self.lock();
        s.reports.remove(target);
        s.leases.remove(target);
    }

    /// The report of one target.
    pub fn get(&self, target: &TargetKey) -> Option<InstanceReport> {
        self.lock().reports.get(target).cloned()
    }

    /// Every current report, sorted by zone, cluster and instance name.
    pub fn snapshot(&self) -> Vec<InstanceReport> {
        self.lock().reports.values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves a map that is still whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(instance: &str) -> InstanceReport {
        InstanceReport {
            admin_address: "127.0.0.1:9901".into(),
            reachable: true,
            start_time_ms: 1,
            server_state: "LIVE".into(),
            envoy_version: "1.40.0".into(),
            ..InstanceReport::unread("z".into(), "c".into(), instance.into())
        }
    }

    #[test]
    fn a_scrape_finishing_after_removal_is_dropped() {
        let board = Board::new();
        let a = TargetKey::new("z", "c", "a");
        let lease = board.lease(&a);
        let mut recorded = 0;
        assert!(board.put(lease, report("a"), || recorded += 1));
        // The target is removed while its scraper is between its scrape and its put.
        board.remove(&a);
        assert!(!board.put(lease, report("a"), || recorded += 1));
        assert!(board.snapshot().is_empty());
        assert_eq!(recorded, 1, "metrics of a removed target are not recorded");
        // Re-added with other settings: only the new scraper's lease writes.
        let new = board.lease(&a);
        assert!(!board.put(lease, report("a"), || {}));
        assert!(board.put(new, report("a"), || {}));
        assert_eq!(board.snapshot().len(), 1);
    }

    #[test]
    fn one_instance_name_in_two_zones_is_two_reports() {
        let board = Board::new();
        let mut other = report("a");
        other.zone_name = "y".into();
        let la = board.lease(&TargetKey::of_report(&report("a")));
        let lb = board.lease(&TargetKey::of_report(&other));
        assert!(board.put(la, report("a"), || {}));
        assert!(board.put(lb, other.clone(), || {}));
        assert_eq!(board.snapshot().len(), 2);
        // Neither lease writes the other's report.
        assert!(!board.put(la, other, || {}));
    }
}
