//! The control-plane client's metrics: whether each zone's stream is connected, the
//! responses it ACKed and NACKed by type, and the resources each zone's view holds.

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

use super::decode::Kind;

/// The `type` label of a response whose type is not known (an unknown type URL, a
/// message over the size bound).
pub const OTHER_TYPE: &str = "other";

/// Handles to the families; cheap to clone.
#[derive(Debug, Clone)]
pub struct ControlMetrics {
    /// `meshcat_control_plane_connected{zone}`: 1 while the zone's stream is up.
    pub connected: IntGaugeVec,
    /// `meshcat_control_plane_responses_total{zone,type,result}`, result `ack` or
    /// `nack`.
    pub responses: IntCounterVec,
    /// `meshcat_control_plane_resources{zone,type}`: what the view holds.
    pub resources: IntGaugeVec,
}

impl ControlMetrics {
    /// Creates the families and registers them.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = ControlMetrics {
            connected: IntGaugeVec::new(
                Opts::new(
                    "meshcat_control_plane_connected",
                    "1 while the zone's xDS stream to its control server is up, else 0.",
                ),
                &["zone"],
            )?,
            responses: IntCounterVec::new(
                Opts::new(
                    "meshcat_control_plane_responses_total",
                    "xDS responses from the zone's control server, by type and result (ack, nack).",
                ),
                &["zone", "type", "result"],
            )?,
            resources: IntGaugeVec::new(
                Opts::new(
                    "meshcat_control_plane_resources",
                    "Resources in the zone's view of its control server, by type.",
                ),
                &["zone", "type"],
            )?,
        };
        registry.register(Box::new(metrics.connected.clone()))?;
        registry.register(Box::new(metrics.responses.clone()))?;
        registry.register(Box::new(metrics.resources.clone()))?;
        Ok(metrics)
    }

    /// Counts a response.
    pub fn response(&self, zone: &str, kind: &str, ack: bool) {
        let result = if ack { "ack" } else { "nack" };
        self.responses
            .with_label_values(&[zone, kind, result])
            .inc();
    }

    /// Sets the resource counts of a zone's view.
    pub fn held(&self, zone: &str, counts: [usize; 4]) {
        for (kind, n) in Kind::ALL.into_iter().zip(counts) {
            self.resources
                .with_label_values(&[zone, kind.label()])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Takes every series of a zone away.
    pub fn forget(&self, zone: &str) {
        let _ = self.connected.remove_label_values(&[zone]);
        let kinds = Kind::ALL.map(Kind::label);
        for kind in kinds.iter().chain(&[OTHER_TYPE]) {
            for result in ["ack", "nack"] {
                let _ = self.responses.remove_label_values(&[zone, kind, result]);
            }
        }
        for kind in kinds {
            let _ = self.resources.remove_label_values(&[zone, kind]);
        }
    }
}
