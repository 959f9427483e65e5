//! meshcat's own metrics against the real Prometheus tools (Debian's `prometheus`
//! package): both ops expositions pass `promtool check metrics`, a real Prometheus
//! server scrapes them and answers queries with the expected series and labels, and
//! every family either binary exposes is documented in docs/metrics.md. The
//! missing-metrics diagnosis asks that real Prometheus whether it scrapes a
//! cluster's job.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use meshcat_tests::monitoring::{Prometheus, check_metrics};
use meshcat_tests::ports::free_port;
use meshcat_tests::{Catalog, MeshAgent, Sidecar, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);

/// An aggregator with some API traffic and a real agent scraping a real sidecar.
struct Mesh {
    catalog: Catalog,
    agent: MeshAgent,
    _sidecar: Sidecar,
}

async fn mesh() -> Mesh {
    let catalog = Catalog::start(|c| {
        c.store.rules.instance_ttl = Duration::from_millis(900);
        // The shop is also the zone's edge: its configuration is fetched with a
        // command, so the command family shows too.
        c.diagnosis.edge_refresh = Duration::from_millis(300);
        // Every family is exposed and checked: the per-cluster ones too.
        c.ops.cluster_metrics = true;
    })
    .await
    .unwrap();
    catalog.register_zone("zone-p", "shop").await.unwrap();
    catalog
        .register_cluster("zone-p", "shop", json!({}))
        .await
        .unwrap();
    let sidecar = Sidecar::start().await.unwrap();
    let agent = MeshAgent::for_sidecar(&catalog, &sidecar, "zone-p", "shop", "shop-1", "300ms")
        .await
        .unwrap();
    sidecar.send("/", 5, 200).await.unwrap();
    catalog
        .wait_cluster("the agent reporting", "zone-p", "shop", DEADLINE, |c| {
            c["status"] == "stable"
        })
        .await
        .unwrap();
    wait_for("an edge refresh command", DEADLINE, || async {
        let text = catalog.ops_metrics().await.ok()?;
        text.contains(r#"meshcat_agent_commands_total{command="config_dump",outcome="ok"}"#)
            .then_some(())
    })
    .await
    .unwrap();
    assert_eq!(catalog.get("/clusters").await.unwrap().0, 200);
    assert_eq!(catalog.get("/no/such/path").await.unwrap().0, 404);
    Mesh {
        catalog,
        agent,
        _sidecar: sidecar,
    }
}

/// The metric families of an exposition, from its `# TYPE` lines.
fn families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_both_expositions_and_a_real_prometheus_scrapes_them() {
    let m = mesh().await;
    let aggregator = m.catalog.ops_metrics().await.unwrap();
    let agent = m.agent.metrics().await.unwrap();
    for (who, text) in [("aggregator", &aggregator), ("agent", &agent)] {
        if let Err(e) = check_metrics(text) {
            panic!("promtool check metrics refuses the {who}'s exposition:\n{e}\n{text}");
        }
    }

    let prometheus = Prometheus::start(&[
        ("meshcat-aggregator", m.catalog.config.ops_addr.to_string()),
        ("meshcat-agent", m.agent.ops.to_string()),
    ]);
    let up = prometheus.series("up == 1").await;
    let jobs: BTreeSet<&str> = up
        .iter()
        .filter_map(|s| s["metric"]["job"].as_str())
        .collect();
    if jobs.len() < 2 {
        // Both targets are scraped within a second of each other.
        let all = prometheus.series("count(up == 1) == 2").await;
        assert_eq!(all.len(), 1);
    }

    let connected = prometheus
        .series(r#"meshcat_agents_connected{job="meshcat-aggregator"}"#)
        .await;
    assert_eq!(connected[0]["value"][1], "1", "{connected:?}");

    let api = prometheus
        .series(r#"meshcat_api_requests_total{route="/clusters",method="GET",code="200"}"#)
        .await;
    assert!(api[0]["value"][1].as_str().unwrap().parse::<f64>().unwrap() >= 1.0);
    prometheus
        .series(r#"meshcat_api_requests_total{route="unmatched",code="404"}"#)
        .await;
    prometheus
        .series(r#"meshcat_clusters_by_status{status="stable"} == 1"#)
        .await;
    prometheus
        .series(r#"meshcat_api_request_duration_seconds_bucket{route="/clusters",le="+Inf"}"#)
        .await;

    let scrapes = prometheus
        .series(r#"meshcat_agent_scrapes_total{job="meshcat-agent",outcome="ok",target="shop-1"}"#)
        .await;
    assert!(
        scrapes[0]["value"][1]
            .as_str()
            .unwrap()
            .parse::<f64>()
            .unwrap()
            >= 1.0
    );
    prometheus
        .series(r#"meshcat_agent_connected{job="meshcat-agent"} == 1"#)
        .await;
    prometheus
        .series("rate(meshcat_agent_reports_sent_total[5s]) > 0")
        .await;
}

/// The family names documented in docs/metrics.md: every backticked `meshcat_*`
/// name in the first column of its tables.
fn documented_families() -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|n| n.starts_with("meshcat_"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exposed_family_is_documented() {
    let m = mesh().await;
    let documented = documented_families();
    // The control-plane families that have series only once a control server
    // answered: a zone whose control server does.
    let control =
        meshcat_control_server::ControlServer::start("127.0.0.1:0".parse().unwrap(), None)
            .await
            .unwrap();
    control.set(meshcat_control_server::MeshSpec {
        clusters: vec![meshcat_control_server::ClusterSpec::new(
            "payments",
            vec![meshcat_control_server::EndpointSpec::new("10.0.0.1", 8080)],
        )],
        listeners: Vec::new(),
    });
    m.catalog
        .register_zone_at("answered", control.local_addr(), "")
        .await
        .unwrap();
    let ops = wait_for("a control server's response counted", DEADLINE, || async {
        let text = m.catalog.ops_metrics().await.ok()?;
        text.contains("meshcat_control_plane_responses_total{")
            .then_some(text)
    })
    .await
    .unwrap();
    let mut exposed = families(&ops);
    exposed.extend(families(&m.agent.metrics().await.unwrap()));
    // A family that has series only once a sidecar's network namespace fails: an
    // agent whose one target names a namespace that is gone.
    let gone = MeshAgent::start(&[
        "--sidecar-admin",
        "127.0.0.1:9",
        "--sidecar-netns",
        "/proc/999999999/ns/net",
        "--interval",
        "100ms",
    ])
    .await
    .unwrap();
    let text = wait_for("a namespace failure counted", DEADLINE, || async {
        let text = gone.metrics().await.ok()?;
        text.contains("meshcat_agent_netns_errors_total{")
            .then_some(text)
    })
    .await
    .unwrap();
    exposed.extend(families(&text));
    gone.stop().await.unwrap();
    assert!(exposed.len() >= 15, "{exposed:?}");
    let missing: Vec<_> = exposed.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "families exposed but not in docs/metrics.md: {missing:?}"
    );
    let stale: Vec<_> = documented.difference(&exposed).collect();
    assert!(
        stale.is_empty(),
        "families in docs/metrics.md that neither binary exposes: {stale:?}"
    );
    for name in &exposed {
        assert!(name.starts_with("meshcat_"), "{name}");
    }
}

/// The verdict of step `name` in a diagnosis report.
fn verdict<'a>(report: &'a Value, name: &str) -> &'a str {
    report["steps"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == name))
        .and_then(|s| s["verdict"].as_str())
        .unwrap_or_else(|| panic!("no step {name} in {report:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_metrics_asks_a_real_prometheus_whether_it_scrapes_the_job() {
    const SCRAPED: &str = "meshcat-aggregator";
    const UNSCRAPED: &str = "cart-sidecars";
    // The aggregator must know Prometheus' URL when it starts, and Prometheus must
    // know the aggregator's ops address: the port is chosen first.
    let prometheus_port = free_port().unwrap();
    let catalog = Catalog::start(|c| {
        c.store.rules.instance_ttl = Duration::from_millis(900);
        c.diagnosis.prometheus_url = Some(format!("http://127.0.0.1:{prometheus_port}"));
    })
    .await
    .unwrap();
    catalog.register_zone("zone-m", "shop").await.unwrap();
    for (cluster, job) in [("shop", SCRAPED), ("cart", UNSCRAPED)] {
        catalog
            .register_cluster(
                "zone-m",
                cluster,
                json!({"enableInstanceMetrics": true, "prometheusJob": job}),
            )
            .await
            .unwrap();
    }
    // One real sidecar, read by two agents under the two clusters, so that both
    // clusters have a live instance reporting metrics.
    let sidecar = Sidecar::start().await.unwrap();
    let _shop = MeshAgent::for_sidecar(&catalog, &sidecar, "zone-m", "shop", "shop-1", "300ms")
        .await
        .unwrap();
    let _cart = MeshAgent::for_sidecar(&catalog, &sidecar, "zone-m", "cart", "cart-1", "300ms")
        .await
        .unwrap();
    for cluster in ["shop", "cart"] {
        catalog
            .wait_cluster("a live instance", "zone-m", cluster, DEADLINE, |c| {
                c["status"] == "stable"
            })
            .await
            .unwrap();
    }

    let prometheus = Prometheus::start_on(
        prometheus_port,
        &[(SCRAPED, catalog.config.ops_addr.to_string())],
    );
    prometheus
        .series(&format!(r#"up{{job="{SCRAPED}"}}"#))
        .await;

    let diagnose = |cluster: &str| {
        let path = format!("/diagnose/{cluster}?zoneName=zone-m&symptom=missing_metrics");
        let catalog = &catalog;
        async move {
            let (status, report) = catalog.get(&path).await.unwrap();
            assert_eq!(status, 200, "{report:#}");
            report
        }
    };

    // The sidecar serves a request, so it has inbound HTTP stats: both agents report
    // metrics once they scraped it again.
    sidecar.send("/", 1, 200).await.unwrap();
    for cluster in ["shop", "cart"] {
        wait_for("the instance to report metrics", DEADLINE, || async {
            let r = diagnose(cluster).await;
            (verdict(&r, "metrics_reporting") == "pass").then_some(())
        })
        .await
        .unwrap();
    }

    let shop = diagnose("shop").await;
    for step in ["metrics_settings", "metrics_reporting", "metrics_collector"] {
        assert_eq!(verdict(&shop, step), "pass", "{step}: {shop:#}");
    }
    assert_eq!(shop["conclusion"], "All checks passed.", "{shop:#}");
    let evidence = shop["steps"][2]["evidence"].to_string();
    assert!(evidence.contains(SCRAPED), "{shop:#}");

    let cart = diagnose("cart").await;
    assert_eq!(verdict(&cart, "metrics_settings"), "pass", "{cart:#}");
    assert_eq!(verdict(&cart, "metrics_reporting"), "pass", "{cart:#}");
    assert_eq!(verdict(&cart, "metrics_collector"), "fail", "{cart:#}");
    let collector = &cart["steps"][2];
    assert_eq!(collector["name"], "metrics_collector");
    assert!(
        collector["evidence"].to_string().contains(UNSCRAPED),
        "{cart:#}"
    );
    let action = collector["action"].as_str().unwrap();
    assert!(
        action.contains("namespace list") && action.contains("namespaces.names"),
        "{action}"
    );
    assert!(
        cart["conclusion"]
            .as_str()
            .unwrap()
            .contains("): metrics_collector failed"),
        "{cart:#}"
    );
}
