//! The agent's own Prometheus metrics, served on the ops port: scrapes and their
//! durations per target, the targets configured, and the connections that failed
//! because a sidecar's network namespace could not be entered.

use std::time::Duration;

use prometheus::{
    HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

use crate::envoy::NetnsErrorHook;
use crate::envoy::netns::REASONS;

/// The agent's own metrics, `meshcat_agent_` prefixed.
#[derive(Debug, Clone)]
pub struct OpsMetrics {
    /// Holds every family below; rendered by `GET /metrics`.
    registry: Registry,
    /// Scrapes by target (instance) and outcome (`ok`, `error`).
    scrapes: IntCounterVec,
    /// Scrape durations by target, in seconds.
    scrape_duration: HistogramVec,
    /// Targets currently configured.
    targets: IntGauge,
    /// Connections to a sidecar's admin that failed because its network namespace
    /// could not be entered, by target and reason ([`crate::envoy::netns::REASONS`]).
    netns_errors: IntCounterVec,
    /// Reads of a sidecar's certificates refused (over a bound, or not what Envoy
    /// writes), by target and reason ([`meshcat_common::identity::refusal`]).
    certs_refused: IntCounterVec,
}

impl Default for OpsMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl OpsMetrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let scrapes = IntCounterVec::new(
            Opts::new(
                "meshcat_agent_scrapes_total",
                "Sidecar admin scrapes by target (zone, cluster, instance) and outcome.",
            ),
            &["zone", "cluster", "target", "outcome"],
        )
        .unwrap_or_else(|e| unreachable_metric(e));
        let scrape_duration = HistogramVec::new(
            HistogramOpts::new(
                "meshcat_agent_scrape_duration_seconds",
                "Duration of sidecar admin scrapes.",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            &["zone", "cluster", "target"],
        )
        .unwrap_or_else(|e| unreachable_metric(e));
        let targets = IntGauge::new("meshcat_agent_targets", "Sidecars the agent scrapes.")
            .unwrap_or_else(|e| unreachable_metric(e));
        let netns_errors = IntCounterVec::new(
            Opts::new(
                "meshcat_agent_netns_errors_total",
                "Sidecar admin connections that failed because the sidecar's network namespace could not be entered, by target and reason (gone, not_netns, replaced, enter_failed).",
            ),
            &["zone", "cluster", "target", "reason"],
        )
        .unwrap_or_else(|e| unreachable_metric(e));
        let certs_refused = IntCounterVec::new(
            Opts::new(
                "meshcat_agent_certs_refused_total",
                "Reads of a sidecar's certificates that were refused, by target and reason (too_many_certificates, too_many_sans, certificate_text_too_long, certs_answer_too_large, certs_answer_invalid); the instance is reported with identity none and the reason.",
            ),
            &["zone", "cluster", "target", "reason"],
        )
        .unwrap_or_else(|e| unreachable_metric(e));
        for c in [
            Box::new(certs_refused.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(scrapes.clone()),
            Box::new(scrape_duration.clone()),
            Box::new(targets.clone()),
            Box::new(netns_errors.clone()),
        ] {
            if let Err(e) = registry.register(c) {
                tracing::error!(error = %e, "Metric not registered.");
            }
        }
        Self {
            registry,
            scrapes,
            scrape_duration,
            targets,
            netns_errors,
            certs_refused,
        }
    }

    /// Counts a refused read of the sidecar's (zone, cluster, instance) certificates.
    pub fn certs_refused(&self, (zone, cluster, instance): (&str, &str, &str), reason: &str) {
        self.certs_refused
            .with_label_values(&[zone, cluster, instance, reason])
            .inc();
    }

    /// A hook counting the namespace failures of the sidecar (zone, cluster,
    /// instance).
    pub fn netns_error_hook(
        &self,
        (zone, cluster, instance): (&str, &str, &str),
    ) -> NetnsErrorHook {
        let counter = self.netns_errors.clone();
        let labels = [zone.to_owned(), cluster.to_owned(), instance.to_owned()];
        NetnsErrorHook::new(move |reason| {
            counter
                .with_label_values(&[&labels[0], &labels[1], &labels[2], reason])
                .inc();
        })
    }

    /// Records one scrape of the sidecar (zone, cluster, instance).
    pub fn observe_scrape(
        &self,
        (zone, cluster, instance): (&str, &str, &str),
        ok: bool,
        took: Duration,
    ) {
        let outcome = if ok { "ok" } else { "error" };
        self.scrapes
            .with_label_values(&[zone, cluster, instance, outcome])
            .inc();
        self.scrape_duration
            .with_label_values(&[zone, cluster, instance])
            .observe(took.as_secs_f64());
    }

    /// Sets the number of configured targets.
    pub fn set_targets(&self, n: usize) {
        self.targets.set(n as i64);
    }

    /// Gives a new target its refusal counters at 0, one per reason, so that the
    /// first refusal is an increase a rule sees (a series that appears at 1 has none).
    pub fn add_target(&self, (zone, cluster, instance): (&str, &str, &str)) {
        for reason in meshcat_common::identity::refusal::ALL {
            self.certs_refused
                .with_label_values(&[zone, cluster, instance, reason]);
        }
    }

    /// Forgets the series of a removed target.
    pub fn forget_target(&self, (zone, cluster, instance): (&str, &str, &str)) {
        for outcome in ["ok", "error"] {
            let _ = self
                .scrapes
                .remove_label_values(&[zone, cluster, instance, outcome]);
        }
        let _ = self
            .scrape_duration
            .remove_label_values(&[zone, cluster, instance]);
        for reason in REASONS {
            let _ = self
                .netns_errors
                .remove_label_values(&[zone, cluster, instance, reason]);
        }
        for reason in meshcat_common::identity::refusal::ALL {
            let _ = self
                .certs_refused
                .remove_label_values(&[zone, cluster, instance, reason]);
        }
    }

    /// The registry other parts of the agent (the reporter) register into.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Prometheus text exposition of every family.
    pub fn render(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }
}

/// Metric definitions are constants; a failure here is a programming error that
/// the unit tests catch.
fn unreachable_metric(e: prometheus::Error) -> ! {
    panic!("invalid metric definition: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_with_the_prefix() {
        let m = OpsMetrics::new();
        m.observe_scrape(("z", "c", "pod-a"), true, Duration::from_millis(3));
        m.observe_scrape(("z", "c", "pod-a"), false, Duration::from_millis(30));
        // One instance name in another zone is a series of its own.
        m.observe_scrape(("y", "c", "pod-a"), true, Duration::from_millis(3));
        m.set_targets(1);
        let text = m.render();
        assert!(text.contains(
            "meshcat_agent_scrapes_total{cluster=\"c\",outcome=\"ok\",target=\"pod-a\",zone=\"z\"} 1"
        ));
        assert!(text.contains(
            "meshcat_agent_scrapes_total{cluster=\"c\",outcome=\"ok\",target=\"pod-a\",zone=\"y\"} 1"
        ));
        assert!(text.contains("meshcat_agent_scrape_duration_seconds_bucket"));
        assert!(text.contains("meshcat_agent_targets 1"));
        m.add_target(("z", "c", "pod-a"));
        let text = m.render();
        for reason in meshcat_common::identity::refusal::ALL {
            assert!(
                text.contains(&format!(
                    "meshcat_agent_certs_refused_total{{cluster=\"c\",reason=\"{reason}\",target=\"pod-a\",zone=\"z\"}} 0"
                )),
                "{text}"
            );
        }
        m.forget_target(("z", "c", "pod-a"));
        let left = m.render();
        assert!(!left.contains("zone=\"z\""), "{left}");
        assert!(left.contains("target=\"pod-a\",zone=\"y\""), "{left}");
    }
}
