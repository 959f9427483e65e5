//! A [`ReportSink`] that records what the ingest hands it, for exercising the ingest
//! server (and the agent's reporter against it) without a catalog: the reports with
//! the session key that sent each, and the sessions that ended. It routes commands to
//! the session of an instance's latest report and never refuses an instance.

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use meshcat_common::wire::InstanceReport;

use super::{InstanceBounds, InstanceRefusal, ReportSink};

/// Records reports and ended sessions.
#[derive(Debug, Default)]
pub struct RecordingSink {
    reports: Mutex<Vec<(String, InstanceReport)>>,
    gone: Mutex<Vec<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The agent id of a session key (`<credential tag>:<agent id>`).
pub fn agent_of(key: &str) -> &str {
    key.split_once(':').map_or(key, |(_, id)| id)
}

impl RecordingSink {
    /// Every instance snapshot received, with the session key that sent it.
    pub fn reports(&self) -> Vec<(String, InstanceReport)> {
        lock(&self.reports).clone()
    }

    /// How many instance snapshots were received.
    pub fn count(&self) -> usize {
        lock(&self.reports).len()
    }

    /// How many instance snapshots the agent of this id sent.
    pub fn reports_of(&self, agent: &str) -> usize {
        lock(&self.reports)
            .iter()
            .filter(|(key, _)| agent_of(key) == agent)
            .count()
    }

    /// Whether a session of the agent of this id ended.
    pub fn is_gone(&self, agent: &str) -> bool {
        lock(&self.gone).iter().any(|key| agent_of(key) == agent)
    }
}

impl ReportSink for RecordingSink {
    fn apply_report(
        &self,
        key: &str,
        instances: Vec<InstanceReport>,
        _now: Instant,
        _may_take: &dyn Fn(&str) -> bool,
        _bounds: &InstanceBounds,
    ) -> Vec<InstanceRefusal> {
        lock(&self.reports).extend(instances.into_iter().map(|r| (key.to_owned(), r)));
        Vec::new()
    }

    fn agent_gone(&self, key: &str) {
        lock(&self.gone).push(key.to_owned());
    }

    fn reporter(&self, zone: &str, cluster: &str, instance: &str) -> Option<String> {
        lock(&self.reports)
            .iter()
            .rev()
            .find(|(_, r)| {
                r.zone_name == zone && r.cluster_name == cluster && r.instance == instance
            })
            .map(|(key, _)| key.clone())
    }
}
