//! The agent's reading of a sidecar's xDS state (contract section 17) against real
//! Envoy 1.40 sidecars: one configured over ADS by the workspace's control server
//! (connected; a cluster it rejects, with Envoy's reason from its log; cleared by a
//! good snapshot; an agent restart that finds the rejection standing; the control
//! server stopped and back), and one with a static configuration only.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use meshcat_agent::envoy::EnvoyAdmin;
use meshcat_agent::envoy::xds::XdsTracker;
use meshcat_agent::logtail::{LogTail, TailConfig};
use meshcat_agent::metrics_object::HostSampler;
use meshcat_agent::scrape::{XdsScrape, scrape_with_xds};
use meshcat_agent::target::Target;
use meshcat_agent::topology::TopologyCache;
use meshcat_common::wire::{InstanceReport, XdsState};
use meshcat_control_server::{ClusterSpec, ControlServer, EndpointSpec, MeshSpec};
use meshcat_tests::xds::{XdsBootstrap, XdsEnvoy};
use meshcat_tests::{Bootstrap, Envoy, Upstream};

const DEADLINE: Duration = Duration::from_secs(30);
const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// One sidecar as a scrape loop of the agent sees it: its admin client, its target,
/// and what the agent keeps between scrapes.
struct Scraper {
    admin: EnvoyAdmin,
    target: Target,
    host: HostSampler,
    topology: TopologyCache,
    xds: XdsTracker,
    /// The sidecar's log, read up to its end before each scrape.
    tail: Option<LogTail>,
    last: Option<InstanceReport>,
}

impl Scraper {
    fn new(admin: &str, log: Option<std::path::PathBuf>) -> Self {
        Scraper {
            admin: EnvoyAdmin::new(admin, Duration::from_secs(2)).unwrap(),
            target: Target {
                admin: admin.to_owned(),
                zone_name: "zone-a".into(),
                cluster_name: "orders".into(),
                instance: "orders-1".into(),
                log_file: log.clone(),
                local_cluster: None,
                netns: None,
            },
            host: HostSampler::new(),
            topology: TopologyCache::default(),
            xds: XdsTracker::default(),
            tail: log.map(|p| LogTail::new(TailConfig::new(p))),
            last: None,
        }
    }

    async fn scrape(&mut self) -> InstanceReport {
        if let Some(tail) = &self.tail {
            assert!(tail.catch_up(Duration::from_secs(5)).await, "log read");
        }
        let report = scrape_with_xds(
            &self.admin,
            &self.target,
            &self.host,
            self.last.as_ref(),
            &mut self.topology,
            XdsScrape {
                tracker: &mut self.xds,
                log: self.tail.as_ref(),
            },
        )
        .await;
        assert!(report.reachable, "{:?}", report.error);
        self.last = Some(report.clone());
        report
    }

    /// Scrapes until the report's xDS state satisfies `f`.
    async fn until(&mut self, what: &str, f: impl Fn(&XdsState) -> bool) -> XdsState {
        let end = Instant::now() + DEADLINE;
        loop {
            let report = self.scrape().await;
            if let Some(state) = report.xds.as_ref().filter(|s| f(s)) {
                return state.clone();
            }
            assert!(
                Instant::now() < end,
                "timed out waiting for {what}; last xDS state {:?}",
                report.xds
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn mesh(connect_timeout_ms: u64) -> MeshSpec {
    MeshSpec {
        clusters: vec![
            ClusterSpec::new("orders", vec![EndpointSpec::new("127.0.0.1", 10_001)]),
            ClusterSpec {
                connect_timeout_ms,
                ..ClusterSpec::new("payments", vec![EndpointSpec::new("127.0.0.1", 10_002)])
            },
        ],
        listeners: vec![],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ads_sidecar_reports_its_connection_and_rejections() {
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = ControlServer::start(listen, None).await.unwrap();
    server.set(mesh(1_000));
    let envoy = XdsEnvoy::start(&XdsBootstrap::new(
        "orders-1",
        "orders",
        server.local_addr(),
    ))
    .await
    .unwrap();
    let mut agent = Scraper::new(&envoy.admin.to_string(), Some(envoy.log_path()));

    // Connected, nothing rejected, the clusters from CDS.
    agent
        .until("connected", |s| s.connected == Some(true))
        .await;
    let report = agent.scrape().await;
    assert_eq!(report.xds.as_ref().unwrap().rejected, []);
    assert!(
        report
            .clusters
            .iter()
            .any(|c| c.name == "payments" && c.added_via_api)
    );

    // One sidecar is served a cluster it rejects.
    let before = now_ms();
    server.override_for("orders-1", Some(mesh(0)));
    server
        .wait_until(
            |nodes| {
                nodes
                    .iter()
                    .any(|n| n.id == "orders-1" && n.get(CDS).is_some_and(|t| t.nacked))
            },
            DEADLINE,
        )
        .await
        .unwrap();
    let seen = agent
        .until("the cluster rejection", |s| !s.rejected.is_empty())
        .await;
    // Envoy writes its log a little after it counts the rejection: the reason may
    // come a scrape later, for the same rejection (same since).
    let state = agent
        .until("the rejection's reason", |s| {
            s.rejected.first().is_some_and(|r| !r.reason.is_empty())
        })
        .await;
    assert_eq!(state.connected, Some(true));
    assert_eq!(state.rejected.len(), 1, "{state:?}");
    let r = &state.rejected[0];
    assert_eq!(r.since_ms, seen.rejected[0].since_ms);
    assert_eq!((r.kind.as_str(), r.resource.as_str()), ("clusters", ""));
    assert_eq!(
        r.reason,
        "payments: Proto constraint validation failed (ClusterValidationError.ConnectTimeout: value must be greater than 0s)"
    );
    assert!(r.since_ms >= before && r.since_ms <= now_ms(), "{r:?}");
    assert!(r.rejected_total >= 1 && r.success_total >= 1, "{r:?}");
    // It stands while nothing changes, since the same time.
    let again = agent.scrape().await.xds.unwrap();
    assert_eq!(again.rejected, state.rejected);

    // An agent restarted now finds the rejection standing through the sidecar's log
    // (newer than the last successful update); without the log it is the baseline.
    let mut restarted = Scraper::new(&envoy.admin.to_string(), Some(envoy.log_path()));
    let first = restarted.scrape().await.xds.unwrap();
    assert_eq!(first.rejected.len(), 1, "{first:?}");
    assert_eq!(first.rejected[0].reason, r.reason);
    let mut blind = Scraper::new(&envoy.admin.to_string(), None);
    let first = blind.scrape().await.xds.unwrap();
    assert_eq!(
        first,
        XdsState {
            connected: Some(true),
            rejected: vec![]
        }
    );

    // A good snapshot clears it.
    server.override_for("orders-1", None);
    let cleared = agent
        .until("the rejection cleared", |s| s.rejected.is_empty())
        .await;
    assert_eq!(cleared.connected, Some(true));
    assert!(
        restarted
            .until("the rejection cleared", |s| s.rejected.is_empty())
            .await
            .rejected
            .is_empty()
    );

    // The control server gone: disconnected; back: connected.
    server.stop().await;
    agent
        .until("disconnected", |s| s.connected == Some(false))
        .await;
    server.restart().await.unwrap();
    let back = agent
        .until("connected again", |s| s.connected == Some(true))
        .await;
    assert_eq!(back.rejected, []);
    assert!(envoy.is_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_sidecar_has_no_xds_stream() {
    let upstream = Upstream::start().await.unwrap();
    let envoy = Envoy::start(Bootstrap::service_sidecar(upstream.addr, None))
        .await
        .unwrap();
    let mut agent = Scraper::new(&envoy.admin_addr(), Some(envoy.log_path()));
    for _ in 0..2 {
        let report = agent.scrape().await;
        assert_eq!(
            report.xds,
            Some(XdsState {
                connected: None,
                rejected: vec![]
            })
        );
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
