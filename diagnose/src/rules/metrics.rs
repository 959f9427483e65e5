//! The missing-metrics checks: the cluster's settings, the instances reporting, and
//! the collector scraping the job.

use super::{Outcome, outcome, skipped};
use crate::evidence::{DiagnosisInput, MetricsEvidence};
use crate::report::{StepName, Verdict};

const COLLECTOR_ACTION_TAIL: &str = "to the namespace list under the pod discovery setting of the metrics collector's scrape configuration (kubernetes_sd_configs, role pod, namespaces.names) through the operator input configuration, then restart the collector.";

pub(super) fn metrics(input: &DiagnosisInput) -> Vec<Outcome> {
    let Some(m) = &input.metrics else {
        return [
            StepName::MetricsSettings,
            StepName::MetricsReporting,
            StepName::MetricsCollector,
        ]
            .into_iter()
            .map(|name| {
                skipped(
                    name,
                    vec!["the cluster's record and metrics state were not given".into()],
                    "Diagnose the missing_metrics symptom through the aggregator, which knows the cluster's record.",
                )
            })
            .collect();
    };
    vec![
        metrics_settings(input, m),
        metrics_reporting(m),
        metrics_collector(input, m),
    ]
}

fn metrics_settings(input: &DiagnosisInput, m: &MetricsEvidence) -> Outcome {
    const NAME: StepName = StepName::MetricsSettings;
    let evidence = vec![
        format!("enableInstanceMetrics = {}", m.enable_instance_metrics),
        format!("prometheusJob = {:?}", m.prometheus_job),
    ];
    if m.enable_instance_metrics && !m.prometheus_job.is_empty() {
        return outcome(
            NAME,
            Verdict::Pass,
            evidence,
            "None: the cluster asks for instance metrics.",
            "",
        );
    }
    outcome(
        NAME,
        Verdict::Fail,
        evidence,
        "Set enableInstanceMetrics to true and prometheusJob to the collector's job of the cluster (PUT /clusters/{clusterName}).",
        format!(
            "the cluster {} does not ask for instance metrics or names no collector job.",
            input.cluster
        ),
    )
}

fn metrics_reporting(m: &MetricsEvidence) -> Outcome {
    const NAME: StepName = StepName::MetricsReporting;
    let mut evidence = vec![
        format!("live instances = {}", m.live_instances),
        format!("instances reporting metrics = {}", m.instances_with_metrics),
    ];
    if !m.silent_instances.is_empty() {
        evidence.push(format!(
            "no inbound HTTP metrics from: {}",
            m.silent_instances.join(", ")
        ));
    }
    if m.live_instances == 0 {
        return outcome(
            NAME,
            Verdict::Fail,
            evidence,
            "Start the service's instances with their sidecar and meshcat agent.",
            "the cluster has no live instance to take metrics from.",
        );
    }
    if m.instances_with_metrics < m.live_instances {
        return outcome(
            NAME,
            Verdict::Fail,
            evidence,
            "The silent instances' sidecars have no inbound HTTP stats: check that traffic reaches their inbound listener (an instance that served no request has nothing to show) and that their agents reach the sidecar's admin API (--sidecar-admin).",
            format!(
                "{} of {} live instances report no metrics{}.",
                m.live_instances - m.instances_with_metrics,
                m.live_instances,
                if m.silent_instances.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", m.silent_instances.join(", "))
                }
            ),
        );
    }
    outcome(
        NAME,
        Verdict::Pass,
        evidence,
        "None: every live instance reports metrics.",
        "",
    )
}

fn metrics_collector(input: &DiagnosisInput, m: &MetricsEvidence) -> Outcome {
    const NAME: StepName = StepName::MetricsCollector;
    let action = format!(
        "Add the namespace where the sidecars of {} run {COLLECTOR_ACTION_TAIL}",
        input.cluster
    );
    match m.prometheus_up {
        Some(true) => outcome(
            NAME,
            Verdict::Pass,
            vec![format!(
                "Prometheus has an up series for job {:?}",
                m.prometheus_job
            )],
            "None: the collector scrapes the job.",
            "",
        ),
        Some(false) => outcome(
            NAME,
            Verdict::Fail,
            vec![format!(
                "Prometheus has no up series for job {:?}",
                m.prometheus_job
            )],
            &action,
            format!(
                "the metrics collector does not scrape job {:?}: it does not watch the namespace of the sidecars.",
                m.prometheus_job
            ),
        ),
        None => skipped(
            NAME,
            vec!["Prometheus was not asked for the job's up series".into()],
            &action,
        ),
    }
}
