//! The agent against real Envoy 1.40 sidecars: scraping with traffic driven
//! through them, unreachable sidecars, targets-file reload, the ops port's
//! `/logging` really changing Envoy's level, and the drift hash of sidecars that
//! share a configuration or not, read again after a change of scoped routes or of a
//! discovered filter.

use std::time::Duration;

use meshcat_agent::AgentConfig;
use meshcat_agent::envoy::EnvoyAdmin;
use meshcat_agent::metrics_object::{HostSampler, check_invariants};
use meshcat_agent::scrape::scrape_once;
use meshcat_agent::target::Target;
use meshcat_agent::topology::TopologyCache;
use meshcat_tests::bootstrap::{Cluster, HttpListener};
use meshcat_tests::{Bootstrap, Envoy, Upstream, wait_for};
use tokio::sync::oneshot;

const DEADLINE: Duration = Duration::from_secs(20);

fn target(envoy: &Envoy, instance: &str) -> Target {
    Target {
        admin: envoy.admin_addr(),
        zone_name: "zone-a".into(),
        cluster_name: "orders".into(),
        instance: instance.into(),
        log_file: Some(envoy.access_log_path()),
        local_cluster: None,
        netns: None,
    }
}

async fn service_envoy() -> (Upstream, Envoy) {
    let upstream = Upstream::start().await.unwrap();
    let envoy = Envoy::start(Bootstrap::service_sidecar(upstream.addr, None))
        .await
        .unwrap();
    (upstream, envoy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_counts_exact_requests_and_5xx() {
    let (upstream, envoy) = service_envoy().await;
    let client = reqwest::Client::new();
    let base = envoy.url("ingress");
    for _ in 0..17 {
        let r = client.get(format!("{base}/orders")).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    for _ in 0..3 {
        let r = client
            .get(format!("{base}/status/503"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 503);
    }
    assert_eq!(upstream.served(), 20);

    let admin = EnvoyAdmin::new(&envoy.admin_addr(), Duration::from_secs(2)).unwrap();
    let host = HostSampler::new();
    let t = target(&envoy, "orders-1");
    // Histograms reach the admin API at the next stats flush.
    let report = wait_for("latency histogram with 20 samples", DEADLINE, || async {
        let r = scrape_once(&admin, &t, &host, None, &mut TopologyCache::default()).await;
        (r.metrics.latency_count == 20).then_some(r)
    })
    .await
    .unwrap();
    assert!(report.reachable, "{:?}", report.error);
    assert_eq!(report.requests_total, 20);
    assert_eq!(report.errors_5xx_total, 3);
    assert_eq!(report.server_state, "LIVE");
    assert_eq!(report.envoy_version, "1.40.0");
    assert_eq!(report.log_level.as_deref(), Some("info"));
    let m = &report.metrics;
    assert_eq!(m.total_requests, 20);
    assert_eq!(m.all_requests, 20);
    assert_eq!(m.http_requests, 20);
    assert_eq!(m.errors_count, 3);
    assert_eq!(m.all_routes, "ingress_http");
    assert_eq!(m.num_goroutines, 2);
    assert!(m.in_throughput > 0 && m.out_throughput > 0);
    assert!(m.process_memory_used > 0);
    assert!(m.cpu_cores > 0 && m.memory_available > 0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        m.start_time > now - 120_000 && m.start_time <= now,
        "{}",
        m.start_time
    );
    check_invariants(m).unwrap();

    let local = report
        .clusters
        .iter()
        .find(|c| c.name == "local_service")
        .expect("local_service listed");
    assert_eq!(local.hosts, [upstream.addr.to_string()]);
    assert_eq!((local.host_count, local.healthy_count), (1, 1));
    assert_eq!(
        local.hosts_digest,
        meshcat_common::wire::hosts_digest([upstream.addr.to_string().as_str()])
    );

    // The graph's figures: the upstream cluster's counters and the listener that
    // routes to it, read from the real /stats and /config_dump.
    let up = report
        .upstreams
        .iter()
        .find(|u| u.name == "local_service")
        .expect("local_service carried traffic");
    assert_eq!((up.requests_total, up.errors_total), (20, 3));
    assert_eq!(up.connect_fail_total, 0);
    assert!(!up.tls);
    assert!(
        report
            .upstreams
            .iter()
            .all(|u| u.requests_total > 0 || u.connect_fail_total > 0)
    );
    let ingress = envoy.url("ingress");
    let ingress = ingress.trim_start_matches("http://");
    let listener = report
        .listeners
        .iter()
        .find(|l| l.address == ingress)
        .unwrap_or_else(|| panic!("listener {ingress} in {:?}", report.listeners));
    assert_eq!(listener.clusters, vec!["local_service".to_owned()]);

    // A second scrape keeps the same start time although uptime only has seconds.
    let again = scrape_once(
        &admin,
        &t,
        &host,
        Some(&report),
        &mut TopologyCache::default(),
    )
    .await;
    assert_eq!(again.start_time_ms, report.start_time_ms);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_sidecar_is_reported_as_such() {
    let (_upstream, mut envoy) = service_envoy().await;
    let admin = EnvoyAdmin::new(&envoy.admin_addr(), Duration::from_millis(500)).unwrap();
    let host = HostSampler::new();
    let t = target(&envoy, "orders-2");
    let good = scrape_once(&admin, &t, &host, None, &mut TopologyCache::default()).await;
    assert!(good.reachable);
    envoy.kill();
    let bad = scrape_once(
        &admin,
        &t,
        &host,
        Some(&good),
        &mut TopologyCache::default(),
    )
    .await;
    assert!(!bad.reachable);
    assert!(
        bad.error
            .as_deref()
            .unwrap_or("")
            .contains("did not answer"),
        "{:?}",
        bad.error
    );
    assert_eq!(bad.instance, "orders-2");
    assert_eq!(bad.start_time_ms, good.start_time_ms);
    envoy.restart().await.unwrap();
    let back = scrape_once(&admin, &t, &host, Some(&bad), &mut TopologyCache::default()).await;
    assert!(back.reachable, "{:?}", back.error);
}

/// A running agent (`meshcat_agent::run`) with its ops address and stop switch.
struct RunningAgent {
    ops: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl RunningAgent {
    async fn start(args: &[&str]) -> Self {
        let mut all = vec![
            "meshcat-agent",
            "--interval",
            "200ms",
            "--scrape-timeout",
            "1s",
        ];
        all.extend_from_slice(args);
        let config = AgentConfig::try_from_args(all).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ops = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(meshcat_agent::run(config, listener, async move {
            let _ = rx.await;
        }));
        Self {
            ops,
            stop: Some(tx),
            task,
        }
    }

    async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.ops))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    async fn stop(mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("agent stops within 5 s")
            .unwrap()
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_logging_changes_the_real_envoy_level() {
    let (_upstream, envoy) = service_envoy().await;
    let admin = envoy.admin_addr();
    let agent = RunningAgent::start(&["--sidecar-admin", &admin, "--instance", "pod-x"]).await;
    let client = reqwest::Client::new();
    let url = format!("{}/logging", agent.ops);

    let level = wait_for("GET /logging", DEADLINE, || async {
        let r = client.get(&url).send().await.ok()?;
        (r.status() == 200).then_some(r.text().await.ok()?)
    })
    .await
    .unwrap();
    assert_eq!(level, "info");

    let r = client
        .put(format!("{url}?level=warn"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        envoy.uniform_log_level().await.unwrap().as_deref(),
        Some("warning")
    );
    assert_eq!(
        client.get(&url).send().await.unwrap().text().await.unwrap(),
        "warn"
    );

    let r = client
        .put(format!("{url}?level=debug&instance=pod-x"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        envoy.uniform_log_level().await.unwrap().as_deref(),
        Some("debug")
    );

    for bad in ["trace", "warning", "WARN", ""] {
        let r = client
            .put(format!("{url}?level={bad}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "level {bad:?}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["code"], "bad_level");
        assert!(body["error"].is_string());
    }
    assert_eq!(
        envoy.uniform_log_level().await.unwrap().as_deref(),
        Some("debug")
    );

    let r = client
        .get(format!("{url}?instance=nobody"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    let text = wait_for("a successful scrape in /metrics", DEADLINE, || async {
        let m = agent.metrics().await;
        m.lines()
            .any(|l| {
                l.starts_with("meshcat_agent_scrapes_total{")
                    && l.contains("outcome=\"ok\"")
                    && l.contains("target=\"pod-x\"")
            })
            .then_some(m)
    })
    .await
    .unwrap();
    assert!(text.contains("meshcat_agent_targets 1"));
    assert!(text.contains("meshcat_agent_scrape_duration_seconds_bucket"));
    assert_eq!(
        reqwest::get(format!("{}/healthz", agent.ops))
            .await
            .unwrap()
            .status(),
        200
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_file_changes_are_followed() {
    let (_ua, a) = service_envoy().await;
    let (_ub, b) = service_envoy().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("targets.json");
    let write = |body: String| {
        // Write then rename so the agent never reads half a file.
        let tmp = dir.path().join("targets.tmp");
        std::fs::write(&tmp, body).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
    };
    let entry = |e: &Envoy, name: &str| {
        format!(
            r#"{{"admin":"{}","zoneName":"z","clusterName":"c","instance":"{name}"}}"#,
            e.admin_addr()
        )
    };
    write(format!("[{}]", entry(&a, "a")));
    let agent = RunningAgent::start(&["--targets-file", file.to_str().unwrap()]).await;
    let has = |m: &str, name: &str| m.contains(&format!("outcome=\"ok\",target=\"{name}\""));

    wait_for("target a scraped", DEADLINE, || async {
        let m = agent.metrics().await;
        (has(&m, "a") && m.contains("meshcat_agent_targets 1")).then_some(())
    })
    .await
    .unwrap();

    write(format!("[{},{}]", entry(&a, "a"), entry(&b, "b")));
    wait_for("target b added", DEADLINE, || async {
        let m = agent.metrics().await;
        (has(&m, "b") && m.contains("meshcat_agent_targets 2")).then_some(())
    })
    .await
    .unwrap();

    // A bad file keeps the previous targets.
    write("[{\"admin\": ".into());
    tokio::time::sleep(Duration::from_millis(800)).await;
    let m = agent.metrics().await;
    assert!(m.contains("meshcat_agent_targets 2"), "{m}");

    write(format!("[{}]", entry(&b, "b")));
    wait_for("target a removed", DEADLINE, || async {
        let m = agent.metrics().await;
        (!m.contains("target=\"a\"") && m.contains("meshcat_agent_targets 1")).then_some(())
    })
    .await
    .unwrap();

    // With one target left, /logging needs no instance.
    let r = reqwest::get(format!("{}/logging", agent.ops))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    agent.stop().await;
}

/// A service sidecar's bootstrap whose ingress routes `prefix` to its upstream, with
/// its own node identity.
fn orders_sidecar(upstream: &Upstream, node: &str, zone: &str, prefix: &str) -> Bootstrap {
    let mut b = Bootstrap::new()
        .listener(HttpListener::new("ingress", "ingress_http").route(prefix, "local_service"))
        .cluster(Cluster::new("local_service", &[upstream.addr]));
    b.node = Some(serde_json::json!({
        "id": node,
        "cluster": "orders",
        "metadata": {"pod": node},
        "locality": {"zone": zone},
    }));
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecars_of_one_configuration_share_the_drift_hash_and_a_changed_route_differs() {
    let (ua, ub, uc) = (
        Upstream::start().await.unwrap(),
        Upstream::start().await.unwrap(),
        Upstream::start().await.unwrap(),
    );
    let a = Envoy::start(orders_sidecar(&ua, "orders-a", "z1", "/"))
        .await
        .unwrap();
    let mut b = Envoy::start(orders_sidecar(&ub, "orders-b", "z2", "/"))
        .await
        .unwrap();
    // A restart pins the ports b learned into its bootstrap: its listener and admin
    // then carry their own port numbers where a's say 0.
    b.restart().await.unwrap();
    let c = Envoy::start(orders_sidecar(&uc, "orders-c", "z1", "/v2"))
        .await
        .unwrap();
    assert_ne!(a.listener("ingress").port(), b.listener("ingress").port());
    let dump = b.admin_get("/config_dump").await.unwrap();
    let port = format!("\"port_value\": {}", b.listener("ingress").port());
    assert!(
        dump.contains(&port),
        "b's listener port is in its configuration"
    );

    let host = HostSampler::new();
    let scrape = |envoy: &Envoy, instance: &str| {
        let t = target(envoy, instance);
        let admin = EnvoyAdmin::new(&envoy.admin_addr(), Duration::from_secs(2)).unwrap();
        let host = &host;
        async move {
            let mut cache = TopologyCache::default();
            let r = scrape_once(&admin, &t, host, None, &mut cache).await;
            assert!(r.reachable, "{:?}", r.error);
            // The hashes are kept with the topology until the configuration moves.
            assert_eq!(cache.hashes().map(|h| &h.config), r.config_hash.as_ref());
            let again = scrape_once(&admin, &t, host, Some(&r), &mut cache).await;
            assert_eq!(again.config_hash, r.config_hash);
            assert_eq!(again.config_hashes, r.config_hashes);
            r
        }
    };
    let (ra, rb, rc) = (
        scrape(&a, "orders-a").await,
        scrape(&b, "orders-b").await,
        scrape(&c, "orders-c").await,
    );

    let hash = ra.config_hash.clone().expect("a drift hash");
    assert_eq!(hash.len(), 16);
    assert!(
        hash.bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)),
        "{hash}"
    );
    let kinds: Vec<&str> = ra.config_hashes.keys().map(String::as_str).collect();
    assert_eq!(kinds, ["clusters", "listeners", "routes", "secrets"]);
    // Different node, admin port, listener port, upstream port and access-log path.
    assert_ne!(a.access_log_path(), b.access_log_path());
    assert_eq!(rb.config_hash, ra.config_hash);
    assert_eq!(rb.config_hashes, ra.config_hashes);

    assert_ne!(rc.config_hash, ra.config_hash);
    let differs: Vec<&str> = ra
        .config_hashes
        .iter()
        .filter(|(k, v)| rc.config_hashes.get(*k) != Some(v))
        .map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(differs, ["routes"]);
}

/// Resources a sidecar discovers from files (xDS from the filesystem): its scoped
/// routes (scoped RDS), their route configuration (RDS) and an HTTP filter (ECDS).
struct DiscoveredFiles {
    dir: tempfile::TempDir,
}

impl DiscoveredFiles {
    fn new() -> Self {
        let files = Self {
            dir: tempfile::Builder::new()
                .prefix("meshcat-xds-")
                .tempdir()
                .unwrap(),
        };
        files.write(
            "rds.json",
            &serde_json::json!({"resources": [{
                "@type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
                "name": "scoped_routes",
                "virtual_hosts": [{"name": "all", "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "local_service"}}]}],
            }]}),
        );
        files.scope_key("a");
        files.fault_limit(10);
        files
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// Replaces a file whole (write, then rename), as Envoy's file watch expects.
    fn write(&self, name: &str, resources: &serde_json::Value) {
        let tmp = self.dir.path().join(format!(".{name}"));
        std::fs::write(&tmp, resources.to_string()).unwrap();
        std::fs::rename(&tmp, self.dir.path().join(name)).unwrap();
    }

    /// The one scope's key.
    fn scope_key(&self, key: &str) {
        self.write(
            "srds.json",
            &serde_json::json!({"resources": [{
                "@type": "type.googleapis.com/envoy.config.route.v3.ScopedRouteConfiguration",
                "name": "scope",
                "route_configuration_name": "scoped_routes",
                "key": {"fragments": [{"string_key": key}]},
            }]}),
        );
    }

    /// The discovered fault filter's `max_active_faults`.
    fn fault_limit(&self, limit: u32) {
        self.write(
            "ecds.json",
            &serde_json::json!({"resources": [{
                "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
                "name": "fault",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
                    "max_active_faults": limit,
                },
            }]}),
        );
    }

    /// A listener whose connection manager (stat prefix `scoped_http`) takes its
    /// scopes, routes and fault filter from these files.
    fn listener(&self) -> serde_json::Value {
        let source =
            |file: &str| serde_json::json!({"path_config_source": {"path": self.path(file)}});
        serde_json::json!({
            "name": "scoped",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "scoped_http",
                    "scoped_routes": {
                        "name": "scopes",
                        "scope_key_builder": {"fragments": [
                            {"header_value_extractor": {"name": "x-scope", "index": 0}}]},
                        "rds_config_source": source("rds.json"),
                        "scoped_rds": {"scoped_rds_config_source": source("srds.json")},
                    },
                    "http_filters": [
                        {"name": "fault", "config_discovery": {
                            "config_source": source("ecds.json"),
                            "type_urls": ["type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"]}},
                        {"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
                    ],
                },
            }]}],
        })
    }
}

/// Waits until the sidecar's counter `name` reads `value`.
async fn counter_reaches(envoy: &Envoy, name: &str, value: u64) {
    let line = format!("{name}: {value}");
    wait_for(&line, DEADLINE, || async {
        let stats = envoy.admin_get("/stats?usedonly").await.ok()?;
        stats.lines().any(|l| l == line).then_some(())
    })
    .await
    .unwrap();
}

/// A change of the scoped routes (scoped RDS) or of a discovered filter (ECDS) moves
/// no listener, cluster or RDS counter: the scrape sees it by the `scoped_rds` and
/// `extension_config_discovery` reload counters and reads `/config_dump` again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_route_and_discovered_filter_changes_are_read_again() {
    let upstream = Upstream::start().await.unwrap();
    let files = DiscoveredFiles::new();
    let mut b = Bootstrap::service_sidecar(upstream.addr, None);
    b.raw_listeners.push(files.listener());
    // Envoy refuses scoped RDS without a node id and cluster.
    b.node = Some(serde_json::json!({"id": "orders-xds", "cluster": "orders"}));
    let envoy = Envoy::start(b).await.unwrap();
    let scopes = "http.scoped_http.scoped_rds.scopes.config_reload";
    let fault = "extension_config_discovery.http_filter.fault.config_reload";
    counter_reaches(&envoy, scopes, 1).await;
    counter_reaches(&envoy, fault, 1).await;

    let admin = EnvoyAdmin::new(&envoy.admin_addr(), Duration::from_secs(2)).unwrap();
    let host = HostSampler::new();
    let t = target(&envoy, "orders-xds");
    let mut cache = TopologyCache::default();
    let first = scrape_once(&admin, &t, &host, None, &mut cache).await;
    assert!(first.reachable, "{:?}", first.error);
    assert!(first.config_hash.is_some());

    files.scope_key("b");
    counter_reaches(&envoy, scopes, 2).await;
    let scoped = scrape_once(&admin, &t, &host, Some(&first), &mut cache).await;
    assert_ne!(scoped.config_hash, first.config_hash, "scopes read again");
    let differs: Vec<&str> = first
        .config_hashes
        .iter()
        .filter(|(k, v)| scoped.config_hashes.get(*k) != Some(v))
        .map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(differs, ["routes"]);

    files.fault_limit(11);
    counter_reaches(&envoy, fault, 2).await;
    let filtered = scrape_once(&admin, &t, &host, Some(&scoped), &mut cache).await;
    assert_ne!(
        filtered.config_hash, scoped.config_hash,
        "filter read again"
    );
    // A discovered filter is its own section of the dump: the whole hash only.
    assert_eq!(filtered.config_hashes, scoped.config_hashes);
}
