//! A sidecar that knows every cluster of a large mesh, end to end: one real Envoy
//! 1.40 with 20,000 upstream clusters and a small real sidecar, scraped by one real
//! agent that reports to a real aggregator over QUIC. The large sidecar does not take
//! the small one down with it, and once steady it costs a few hundred bytes a report.

use std::time::Duration;

use meshcat_tests::large_sidecar::{self, CLUSTERS};
use meshcat_tests::mesh::{Catalog, MeshAgent, Sidecar, instance_names, metric_sum};
use meshcat_tests::{Envoy, wait_for};

/// The most a steady report of one instance may cost on the wire.
const STEADY_REPORT_MAX: f64 = 64.0 * 1024.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_20000_cluster_sidecar_is_served_beside_a_small_one_and_reported_by_what_changed() {
    let large = Envoy::start(large_sidecar::bootstrap(&large_sidecar::clusters(CLUSTERS)))
        .await
        .unwrap();
    let small = Sidecar::start().await.unwrap();
    let catalog = Catalog::start(|_| {}).await.unwrap();
    catalog.register_zone("zone-a", "").await.unwrap();
    catalog
        .register_cluster("zone-a", "everything", serde_json::json!({}))
        .await
        .unwrap();
    catalog
        .register_cluster("zone-a", "small", serde_json::json!({}))
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let targets = dir.path().join("targets.json");
    std::fs::write(
        &targets,
        serde_json::json!([
            {"admin": large.admin_addr(), "zoneName": "zone-a", "clusterName": "everything",
             "instance": "everything-1"},
            {"admin": small.envoy.admin_addr(), "zoneName": "zone-a", "clusterName": "small",
             "instance": "small-1"},
        ])
        .to_string(),
    )
    .unwrap();
    let mut args = catalog.agent_args();
    args.extend(
        [
            "--targets-file",
            &targets.display().to_string(),
            "--interval",
            "1s",
            // Envoy takes a second or two to write its 85 MB `/clusters` on a busy
            // machine.
            "--scrape-timeout",
            "20s",
        ]
        .map(str::to_owned),
    );
    let agent = MeshAgent::start(&args).await.unwrap();

    // Both in the catalog, live.
    for (cluster, instance) in [("everything", "everything-1"), ("small", "small-1")] {
        catalog
            .wait_cluster(instance, "zone-a", cluster, Duration::from_secs(60), |c| {
                instance_names(c) == [instance]
            })
            .await
            .unwrap();
    }
    // The aggregator refused nothing.
    let ops = catalog.ops_metrics().await.unwrap();
    assert_eq!(
        metric_sum(&ops, "meshcat_reports_rejected_total", &[]).unwrap_or(0.0),
        0.0,
        "{ops}"
    );

    // Each instance went whole once, then as what changed: several steady reports
    // each, on average far under the bound (the large one's whole state is megabytes).
    let sent = |text: &str, name: &str, form: &str| {
        metric_sum(text, name, &[("form", form)]).unwrap_or(0.0)
    };
    let text = wait_for(
        "four steady reports of each instance",
        Duration::from_secs(60),
        || async {
            let text = agent.metrics().await.ok()?;
            (sent(&text, "meshcat_agent_report_instances_total", "delta") >= 8.0).then_some(text)
        },
    )
    .await
    .unwrap();
    assert_eq!(
        sent(&text, "meshcat_agent_report_instances_total", "whole"),
        2.0,
        "{text}"
    );
    let whole = sent(&text, "meshcat_agent_report_bytes_total", "whole");
    assert!(
        whole > 2_000_000.0,
        "the whole state of 20,000 clusters: {whole} bytes"
    );
    let deltas = sent(&text, "meshcat_agent_report_instances_total", "delta");
    let delta_bytes = sent(&text, "meshcat_agent_report_bytes_total", "delta");
    // Both instances report as often: were the large one's steady reports over the
    // bound, the mean would be over half of it.
    assert!(
        delta_bytes / deltas < STEADY_REPORT_MAX / 2.0,
        "{delta_bytes} bytes in {deltas} steady reports"
    );
    agent.stop().await.unwrap();
}
