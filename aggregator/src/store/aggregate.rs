//! Incremental per-zone counters behind zone metadata and `GET /summary`: every
//! registration change and status change adjusts them, so summaries never rescan the
//! zone's clusters.

use std::collections::{BTreeMap, BTreeSet};

use meshcat_common::model::{ClusterRecord, OverallSummary, Status, ZoneSummary};

/// The counters of one zone over its registered clusters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZoneAggregate {
    /// Registered clusters.
    pub clusters: u64,
    /// Registered clusters per status, indexed by [`status_index`].
    pub by_status: [u64; 3],
    /// Live instances of the registered clusters.
    pub instances: u64,
    /// Distinct non-empty owners with the number of clusters naming each, so that
    /// removing a cluster knows whether the owner goes too.
    owners: BTreeMap<String, u64>,
    /// Distinct non-empty capabilities, counted like `owners`.
    capabilities: BTreeMap<String, u64>,
}

/// Position of a status in [`ZoneAggregate::by_status`].
pub fn status_index(s: Status) -> usize {
    match s {
        Status::Stable => 0,
        Status::Warning => 1,
        Status::Down => 2,
    }
}

fn count_in(map: &mut BTreeMap<String, u64>, key: &str) {
    if key.is_empty() {
        return;
    }
    // The name is copied only the first time it is counted.
    match map.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            map.insert(key.to_owned(), 1);
        }
    }
}

/// Adds names to a set, copying only those it does not hold yet.
fn union_into<'a>(set: &mut BTreeSet<String>, names: impl Iterator<Item = &'a String>) {
    for name in names {
        if !set.contains(name.as_str()) {
            set.insert(name.clone());
        }
    }
}

fn count_out(map: &mut BTreeMap<String, u64>, key: &str) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

impl ZoneAggregate {
    /// Counts a registered cluster in.
    pub fn add(&mut self, r: &ClusterRecord, status: Status, live: u64) {
        self.clusters += 1;
        self.by_status[status_index(status)] += 1;
        self.instances += live;
        count_in(&mut self.owners, &r.owner);
        count_in(&mut self.capabilities, &r.capability);
    }

    /// Counts a registered cluster out; the exact inverse of [`Self::add`].
    pub fn remove(&mut self, r: &ClusterRecord, status: Status, live: u64) {
        self.clusters = self.clusters.saturating_sub(1);
        let i = status_index(status);
        self.by_status[i] = self.by_status[i].saturating_sub(1);
        self.instances = self.instances.saturating_sub(live);
        count_out(&mut self.owners, &r.owner);
        count_out(&mut self.capabilities, &r.capability);
    }

    /// Moves one registered cluster from one status and live count to another.
    pub fn change(&mut self, old: (Status, u64), new: (Status, u64)) {
        let (o, n) = (status_index(old.0), status_index(new.0));
        self.by_status[o] = self.by_status[o].saturating_sub(1);
        self.by_status[n] += 1;
        self.instances = (self.instances + new.1).saturating_sub(old.1);
    }

    pub fn owners(&self) -> impl Iterator<Item = &String> {
        self.owners.keys()
    }

    pub fn capabilities(&self) -> impl Iterator<Item = &String> {
        self.capabilities.keys()
    }

    /// The seed 2.5 zone summary.
    pub fn summary(&self, zone: &str) -> ZoneSummary {
        ZoneSummary {
            zone_name: zone.to_owned(),
            owners: self.owners.keys().cloned().collect(),
            capabilities: self.capabilities.keys().cloned().collect(),
            cluster_count: self.clusters,
            cluster_stable_count: self.by_status[0],
            cluster_warning_count: self.by_status[1],
            cluster_down_count: self.by_status[2],
            instance_count: self.instances,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_and_remove_are_inverse() {
        let mut a = ClusterRecord::new("z", "a", "A");
        a.owner = "team-a".into();
        a.capability = "search".into();
        let mut b = ClusterRecord::new("z", "b", "B");
        b.owner = "team-a".into();
        let mut agg = ZoneAggregate::default();
        agg.add(&a, Status::Down, 0);
        agg.add(&b, Status::Stable, 2);
        let s = agg.summary("z");
        assert_eq!(s.owners, vec!["team-a"]);
        assert_eq!(s.capabilities, vec!["search"]);
        assert_eq!(
            (s.cluster_count, s.cluster_down_count, s.instance_count),
            (2, 1, 2)
        );
        agg.change((Status::Down, 0), (Status::Warning, 1));
        assert_eq!(agg.summary("z").cluster_warning_count, 1);
        agg.remove(&a, Status::Warning, 1);
        agg.remove(&b, Status::Stable, 2);
        assert_eq!(agg, ZoneAggregate::default());
    }
}

/// The summary's `metadata` over all zones, summed from their counters.
#[derive(Debug, Default)]
pub struct OverallTotals {
    sum: OverallSummary,
    owners: BTreeSet<String>,
    capabilities: BTreeSet<String>,
}

impl OverallTotals {
    /// Counts one zone in.
    pub fn add(&mut self, agg: &ZoneAggregate) {
        let s = &mut self.sum;
        s.zone_count += 1;
        s.cluster_count += agg.clusters;
        s.cluster_stable_count += agg.by_status[0];
        s.cluster_warning_count += agg.by_status[1];
        s.cluster_down_count += agg.by_status[2];
        s.instance_count += agg.instances;
        union_into(&mut self.owners, agg.owners());
        union_into(&mut self.capabilities, agg.capabilities());
    }

    /// The summed metadata, owners and capabilities in order.
    pub fn finish(self) -> OverallSummary {
        OverallSummary {
            owners: self.owners.into_iter().collect(),
            capabilities: self.capabilities.into_iter().collect(),
            ..self.sum
        }
    }
}
