//! The agent's scrape of a sidecar that knows every cluster of a large mesh: one real
//! Envoy 1.40 with 20,000 static upstream clusters of 5 hosts (100,000 hosts, an
//! 85 MB `/clusters?format=json`), started once for this binary.

use std::time::Duration;

use meshcat_agent::envoy::EnvoyAdmin;
use meshcat_agent::metrics_object::HostSampler;
use meshcat_agent::scrape::scrape_once;
use meshcat_agent::target::Target;
use meshcat_agent::topology::TopologyCache;
use meshcat_common::limits::{MAX_UPSTREAM_CLUSTERS, MAX_UPSTREAM_HOSTS};
use meshcat_common::wire::{self, AgentMessage, DEFAULT_MAX_MESSAGE, Report, hosts_digest};
use meshcat_tests::Envoy;
use meshcat_tests::large_sidecar::{self, CLUSTERS, HOSTS};

/// Bounds each admin call: Envoy takes one to two seconds to write its 85 MB
/// `/clusters` on a busy machine.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_with_20000_clusters_is_reported_whole() {
    let expected = large_sidecar::clusters(CLUSTERS);
    let envoy = Envoy::start(large_sidecar::bootstrap(&expected))
        .await
        .unwrap();
    let admin = EnvoyAdmin::new(&envoy.admin_addr(), CALL_TIMEOUT).unwrap();
    let target = Target {
        admin: envoy.admin_addr(),
        zone_name: "zone-a".into(),
        cluster_name: "everything".into(),
        instance: "everything-1".into(),
        ..Default::default()
    };
    let host = HostSampler::new();
    let report = scrape_once(&admin, &target, &host, None, &mut TopologyCache::default()).await;
    assert!(report.reachable, "{:?}", report.error);
    assert_eq!(report.error, None);
    assert_eq!(report.server_state, "LIVE");

    // Every cluster, sorted by name, with its hosts, their digest and health.
    assert_eq!(report.clusters.len(), CLUSTERS);
    let mut expected = expected;
    expected.sort_by(|a, b| a.name.cmp(&b.name));
    let mut unhealthy = 0;
    for (got, want) in report.clusters.iter().zip(&expected) {
        assert_eq!(got.name, want.name);
        let addresses = want.addresses();
        assert_eq!(got.hosts, addresses, "{}", want.name);
        assert_eq!(
            got.hosts_digest,
            hosts_digest(addresses.iter().map(String::as_str)),
            "{}",
            want.name
        );
        assert_eq!(got.host_count as usize, HOSTS, "{}", want.name);
        assert_eq!(got.healthy_count as usize, want.healthy(), "{}", want.name);
        assert!(!got.added_via_api);
        unhealthy += HOSTS - want.healthy();
    }
    assert!(unhealthy > 0, "some hosts are not healthy");

    // Within what the aggregator takes by default, and one frame on the wire.
    let hosts: usize = report.clusters.iter().map(|c| c.host_count as usize).sum();
    assert_eq!(hosts, CLUSTERS * HOSTS);
    assert!(report.clusters.len() <= MAX_UPSTREAM_CLUSTERS);
    assert!(hosts <= MAX_UPSTREAM_HOSTS);
    let frame = wire::encode(
        &AgentMessage::Report(Report {
            sent_at_ms: 1,
            instances: vec![report.clone()],
        }),
        DEFAULT_MAX_MESSAGE,
    );
    assert!(frame.is_ok(), "{:?}", frame.err());

    // A second scrape reads the same.
    let again = scrape_once(
        &admin,
        &target,
        &host,
        Some(&report),
        &mut TopologyCache::default(),
    )
    .await;
    assert!(again.reachable, "{:?}", again.error);
    assert_eq!(again.clusters, report.clusters);
}
