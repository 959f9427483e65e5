//! The ingest server's own metrics: connected agents, reports received and rejected
//! (by reason), instances reported and commands sent to agents (by command and outcome),
//! and the rejections of the last few minutes by reason, which `GET /status` (and so
//! `meshcat check`) reads without a Prometheus server.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// Every `reason` label of `meshcat_reports_rejected_total` (see `docs/wire.md`).
pub const REJECT_REASONS: [&str; 23] = [
    "too_large",
    "version",
    "decode",
    "truncated",
    "read",
    "unexpected_message",
    "too_many_instances",
    "invalid_name",
    "forbidden_zone",
    "handshake",
    "auth",
    "hello_timeout",
    "too_many_connections",
    "too_many_pending",
    "instance_in_use",
    "too_many_upstream_clusters",
    "too_many_upstream_hosts",
    "too_many_credential_instances",
    "closed",
    // An instance's certificates refused alone (contract section 19).
    "too_many_certificates",
    "too_many_sans",
    "certificate_text_too_long",
    "too_many_san_matchers",
];

/// Handles to the ingest metrics families; cheap to clone.
#[derive(Debug, Clone)]
pub struct IngestMetrics {
    /// Agents with an authenticated, open connection.
    pub agents_connected: IntGauge,
    /// Connections in their handshake or hello, not yet authenticated.
    pub pending_connections: IntGauge,
    /// Reports accepted and handed to the catalog.
    pub reports_received: IntCounter,
    /// Messages refused, by low-cardinality reason.
    pub reports_rejected: IntCounterVec,
    /// Instance snapshots carried by accepted reports.
    pub instances_reported: IntCounter,
    /// Commands sent to agents, by command name and outcome.
    pub agent_commands: IntCounterVec,
    /// The same rejections over the last [`RECENT_REJECTIONS`].
    pub recent_rejections: Arc<RecentRejections>,
}

impl IngestMetrics {
    /// Creates the families and registers them.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = IngestMetrics {
            agents_connected: IntGauge::new(
                "meshcat_agents_connected",
                "Agents with an authenticated QUIC connection.",
            )?,
            pending_connections: IntGauge::new(
                "meshcat_ingest_pending_connections",
                "QUIC connections in their handshake or hello, not yet authenticated.",
            )?,
            reports_received: IntCounter::new(
                "meshcat_reports_received_total",
                "Agent reports accepted.",
            )?,
            reports_rejected: IntCounterVec::new(
                Opts::new(
                    "meshcat_reports_rejected_total",
                    "Agent messages and connections refused, by reason.",
                ),
                &["reason"],
            )?,
            instances_reported: IntCounter::new(
                "meshcat_instances_reported_total",
                "Instance snapshots carried by accepted reports.",
            )?,
            agent_commands: IntCounterVec::new(
                Opts::new(
                    "meshcat_agent_commands_total",
                    "Commands sent to agents, by command and outcome.",
                ),
                &["command", "outcome"],
            )?,
            recent_rejections: Arc::new(RecentRejections::new(Instant::now())),
        };
        // Series for every reason exist from the start, so rates and alerts see zeros.
        for reason in REJECT_REASONS {
            metrics.reports_rejected.with_label_values(&[reason]);
        }
        registry.register(Box::new(metrics.agents_connected.clone()))?;
        registry.register(Box::new(metrics.pending_connections.clone()))?;
        registry.register(Box::new(metrics.reports_received.clone()))?;
        registry.register(Box::new(metrics.reports_rejected.clone()))?;
        registry.register(Box::new(metrics.instances_reported.clone()))?;
        registry.register(Box::new(metrics.agent_commands.clone()))?;
        Ok(metrics)
    }

    pub(crate) fn rejected(&self, reason: &str) {
        self.reports_rejected.with_label_values(&[reason]).inc();
        self.recent_rejections.record(reason, Instant::now());
    }
}

/// How far back "recent" rejections reach: long enough to hold an agent that retries
/// a refused connection with its longest backoff (30 s) several times over, short
/// enough that a problem fixed a few minutes ago no longer fails a check.
pub const RECENT_REJECTIONS: Duration = Duration::from_secs(300);

/// The recent window moves in steps of this much: a rejection leaves the count
/// between `RECENT_REJECTIONS - RECENT_STEP` and `RECENT_REJECTIONS` after it happened.
pub const RECENT_STEP: Duration = Duration::from_secs(10);

const STEPS: u64 = RECENT_REJECTIONS.as_secs() / RECENT_STEP.as_secs();

/// Rejections by reason over the last [`RECENT_REJECTIONS`], in steps of
/// [`RECENT_STEP`]: at most 30 steps of one counter per reason, whatever the rate.
#[derive(Debug)]
pub struct RecentRejections {
    /// Step numbers count from here.
    origin: Instant,
    /// (step number, counts in the order of [`REJECT_REASONS`]), oldest first.
    steps: Mutex<VecDeque<(u64, [u64; REJECT_REASONS.len()])>>,
}

impl RecentRejections {
    pub fn new(origin: Instant) -> Self {
        RecentRejections {
            origin,
            steps: Mutex::new(VecDeque::with_capacity(STEPS as usize + 1)),
        }
    }

    fn step(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_secs() / RECENT_STEP.as_secs()
    }

    /// Counts one rejection. Reasons outside [`REJECT_REASONS`] are counted only by
    /// the Prometheus family.
    pub fn record(&self, reason: &str, now: Instant) {
        let Some(i) = REJECT_REASONS.iter().position(|r| *r == reason) else {
            return;
        };
        let step = self.step(now);
        let mut steps = self.steps.lock().unwrap_or_else(|p| p.into_inner());
        match steps.back_mut() {
            Some((s, counts)) if *s == step => counts[i] += 1,
            _ => {
                let mut counts = [0; REJECT_REASONS.len()];
                counts[i] = 1;
                steps.push_back((step, counts));
            }
        }
        while steps.front().is_some_and(|(s, _)| s + STEPS <= step) {
            steps.pop_front();
        }
    }

    /// The rejections of the window ending at `now`, by reason (reasons with none
    /// left out), sorted by reason.
    pub fn counts(&self, now: Instant) -> Vec<(&'static str, u64)> {
        let step = self.step(now);
        let steps = self.steps.lock().unwrap_or_else(|p| p.into_inner());
        let mut sum = [0u64; REJECT_REASONS.len()];
        for (_, counts) in steps.iter().filter(|(s, _)| s + STEPS > step) {
            for (total, n) in sum.iter_mut().zip(counts) {
                *total += n;
            }
        }
        let mut out: Vec<(&'static str, u64)> = REJECT_REASONS
            .iter()
            .zip(sum)
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| (*r, n))
            .collect();
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_rejections_leave_the_window_after_five_minutes() {
        let t0 = Instant::now();
        let recent = RecentRejections::new(t0);
        recent.record("auth", t0);
        recent.record("auth", t0 + Duration::from_secs(1));
        recent.record("decode", t0 + Duration::from_secs(100));
        recent.record("not_a_reason", t0 + Duration::from_secs(100));
        assert_eq!(
            recent.counts(t0 + Duration::from_secs(100)),
            vec![("auth", 2), ("decode", 1)]
        );
        // Both auth rejections were in the first step: gone once it is 300 s old.
        assert_eq!(
            recent.counts(t0 + RECENT_REJECTIONS - Duration::from_millis(1)),
            vec![("auth", 2), ("decode", 1)]
        );
        assert_eq!(recent.counts(t0 + RECENT_REJECTIONS), vec![("decode", 1)]);
        assert!(recent.counts(t0 + Duration::from_secs(400)).is_empty());
        // Old steps are dropped as new ones come: the memory stays bounded.
        for s in 0..1000 {
            recent.record("auth", t0 + Duration::from_secs(s * 10));
        }
        assert!(recent.steps.lock().unwrap().len() <= STEPS as usize);
        assert_eq!(
            recent.counts(t0 + Duration::from_secs(9990)),
            vec![("auth", STEPS)]
        );
    }
}
