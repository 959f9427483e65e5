//! The ingest server's own metrics: connected agents, reports received and rejected
//! (by reason), instances reported and commands sent to agents (by command and outcome).

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// Every `reason` label of `meshcat_reports_rejected_total` (see `docs/wire.md`).
pub const REJECT_REASONS: [&str; 19] = [
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
    }
}
