//! The reporter's own metrics: reports sent and failed, connection state, reconnects
//! and whether a snapshot is waiting to be delivered.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// Handles to the reporter's metrics; cheap to clone.
#[derive(Debug, Clone)]
pub struct ReporterMetrics {
    /// Reports the aggregator acknowledged.
    pub reports_sent: IntCounter,
    /// Reports that were refused, timed out or could not be sent.
    pub report_failures: IntCounter,
    /// 1 while the agent holds an accepted connection to the aggregator.
    pub connected: IntGauge,
    /// Connection attempts after the first.
    pub reconnects: IntCounter,
    /// 1 while the current state has not been delivered (outage, failed report); only
    /// the latest snapshot is ever kept, so this never exceeds 1.
    pub pending_snapshot: IntGauge,
    /// Bytes of instances sent, whole or as deltas.
    pub report_bytes: IntCounterVec,
    /// Instances sent, whole or as deltas.
    pub report_instances: IntCounterVec,
}

impl ReporterMetrics {
    /// Creates the families and registers them.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = ReporterMetrics {
            reports_sent: IntCounter::new(
                "meshcat_agent_reports_sent_total",
                "Reports acknowledged by the aggregator.",
            )?,
            report_failures: IntCounter::new(
                "meshcat_agent_report_failures_total",
                "Reports refused, timed out or not sent.",
            )?,
            connected: IntGauge::new(
                "meshcat_agent_connected",
                "Whether the agent is connected to the aggregator (0 or 1).",
            )?,
            reconnects: IntCounter::new(
                "meshcat_agent_reconnects_total",
                "Connection attempts to the aggregator after the first.",
            )?,
            pending_snapshot: IntGauge::new(
                "meshcat_agent_pending_snapshot",
                "Whether the current snapshot awaits delivery (0 or 1).",
            )?,
            report_bytes: IntCounterVec::new(
                Opts::new(
                    "meshcat_agent_report_bytes_total",
                    "Encoded bytes of the instances sent to the aggregator, by form (whole or delta).",
                ),
                &["form"],
            )?,
            report_instances: IntCounterVec::new(
                Opts::new(
                    "meshcat_agent_report_instances_total",
                    "Instances sent to the aggregator, by form (whole or delta).",
                ),
                &["form"],
            )?,
        };
        registry.register(Box::new(metrics.report_bytes.clone()))?;
        registry.register(Box::new(metrics.report_instances.clone()))?;
        registry.register(Box::new(metrics.reports_sent.clone()))?;
        registry.register(Box::new(metrics.report_failures.clone()))?;
        registry.register(Box::new(metrics.connected.clone()))?;
        registry.register(Box::new(metrics.reconnects.clone()))?;
        registry.register(Box::new(metrics.pending_snapshot.clone()))?;
        Ok(metrics)
    }
}

impl ReporterMetrics {
    /// Counts the instances of one report by form; answers its encoded size.
    pub fn observe_report(&self, instances: &[meshcat_common::wire::InstanceReport]) -> usize {
        let mut total = 0;
        for r in instances {
            let form = if r.delta.is_some() { "delta" } else { "whole" };
            let bytes = super::encoded_len(r);
            total += bytes;
            self.report_bytes
                .with_label_values(&[form])
                .inc_by(bytes as u64);
            self.report_instances.with_label_values(&[form]).inc();
        }
        total
    }
}
