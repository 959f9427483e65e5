//! The dependency graph end to end (contract section 14) on real Envoys: a chain
//! edge -> svc-a -> svc-b, where svc-a also calls a service nobody registered and
//! declares svc-b plus a dependency it never calls. Then svc-b's service dies and
//! svc-a's edge to it shows the errors.

use std::time::Duration;

use meshcat_tests::chain::{Chain, link, node, send};
use meshcat_tests::{Catalog, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);
const ZONE: &str = "zone-g";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_graph_shows_observed_and_declared_calls_and_a_failing_hop() {
    let catalog = Catalog::start(|_| {}).await.unwrap();
    catalog.register_zone(ZONE, "edge").await.unwrap();
    catalog
        .register_cluster(
            ZONE,
            "svc-a",
            json!({"owner": "team-a", "dependencies": ["svc-b", "ghost"]}),
        )
        .await
        .unwrap();
    catalog
        .register_cluster(
            ZONE,
            "svc-b",
            json!({"owner": "team-b", "ownerURL": "https://teams.example/b"}),
        )
        .await
        .unwrap();
    // A declared dependency is stored and echoed like every field.
    let a = catalog.cluster(ZONE, "svc-a").await.unwrap();
    assert_eq!(a["dependencies"], json!(["svc-b", "ghost"]), "{a}");

    let mut chain = Chain::start(&catalog, ZONE).await.unwrap();
    let client = reqwest::Client::new();
    let (_, before) = catalog.get("/graph").await.unwrap();
    let before_index = before["index"].as_u64().unwrap();
    // Traffic goes on while the agents report: each edge needs two reports that
    // differ.
    let graph = wait_for("the observed chain", DEADLINE, || async {
        let codes = chain.traffic(&client).await;
        assert!(codes.iter().all(|s| *s == 200), "{codes:?}");
        let (status, g) = catalog.get("/graph").await.ok()?;
        assert_eq!(status, 200);
        let observed = |s: &str, t: &str| {
            link(&g, s, t)
                .is_some_and(|e| e["observed"] == true && e["requests"].as_u64() > Some(0))
        };
        (observed("zone-g/edge", "zone-g/svc-a")
            && observed("zone-g/svc-a", "zone-g/svc-b")
            && observed("zone-g/svc-a", "zone-g/external:external-api"))
        .then_some(g)
    })
    .await
    .unwrap();

    assert!(
        graph["index"].as_u64().unwrap() > before_index,
        "the index moves with new edges"
    );
    assert_eq!(graph["windowSeconds"], 60);
    // Nodes: the three clusters, the declared-only one and the external service.
    let a_node = node(&graph, "zone-g/svc-a").unwrap();
    assert_eq!(a_node["kind"], "cluster");
    assert_eq!(a_node["owner"], "team-a");
    assert_eq!(a_node["registered"], true);
    assert_eq!(a_node["instances"], 1);
    let ghost = node(&graph, "zone-g/ghost").expect("declared-only node");
    assert_eq!(
        (ghost["registered"].clone(), ghost["status"].clone()),
        (json!(false), json!("down"))
    );
    let ext = node(&graph, "zone-g/external:external-api").expect("external node");
    assert_eq!(ext["kind"], "external");
    assert_eq!(ext["status"], Value::Null);
    assert_eq!(ext["owner"], "");
    assert_eq!(ext["instances"], 0);
    let edge_node = node(&graph, "zone-g/edge").expect("edge node");
    assert_eq!(edge_node["registered"], false);
    // Edges: declared and observed told apart, no sidecar's local cluster.
    let ab = link(&graph, "zone-g/svc-a", "zone-g/svc-b").unwrap();
    assert_eq!(
        (ab["declared"].clone(), ab["errors"].clone()),
        (json!(true), json!(0)),
        "{ab}"
    );
    assert_eq!(ab["errorRatio"], 0.0);
    assert_eq!(ab["tls"], false);
    assert!(ab["lastSeenMs"].as_i64().is_some(), "{ab}");
    let ea = link(&graph, "zone-g/edge", "zone-g/svc-a").unwrap();
    assert_eq!(ea["declared"], false, "observed but not declared: {ea}");
    let ag = link(&graph, "zone-g/svc-a", "zone-g/ghost").unwrap();
    assert_eq!(
        (
            ag["observed"].clone(),
            ag["declared"].clone(),
            ag["requests"].clone()
        ),
        (json!(false), json!(true), json!(0))
    );
    let ids: Vec<&str> = graph["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert!(
        !ids.iter().any(|id| id.contains("local_service")),
        "local clusters are no nodes: {ids:?}"
    );
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "nodes sorted by id");
    assert!(
        graph["edges"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["source"] != e["target"])
    );

    // Focus: svc-b with depth 1 has svc-a only; depth 2 reaches the edge too.
    let (_, near) = catalog
        .get("/graph?zoneName=zone-g&clusterName=svc-b")
        .await
        .unwrap();
    let ids: Vec<&str> = near["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["zone-g/svc-a", "zone-g/svc-b"], "{near}");
    let (_, far) = catalog
        .get("/graph?zoneName=zone-g&clusterName=svc-b&depth=2")
        .await
        .unwrap();
    assert!(
        node(&far, "zone-g/edge").is_some() && node(&far, "zone-g/ghost").is_some(),
        "{far}"
    );
    // Bad queries.
    for (q, status) in [
        ("clusterName=svc-b", 400),
        ("zoneName=zone-g&clusterName=svc-b&depth=6", 400),
        ("zoneName=zone-g&clusterName=nobody", 404),
        ("zoneName=zone-g&zoneName=zone-h", 400),
        ("other=1", 400),
    ] {
        let (got, body) = catalog.get(&format!("/graph?{q}")).await.unwrap();
        assert_eq!(got.as_u16(), status, "{q}: {body}");
    }

    // svc-b's service dies: svc-a's calls to it fail, and its edge shows the errors
    // within one window.
    chain.b_service.stop().await;
    let failing = wait_for("errors on svc-a -> svc-b", DEADLINE, || async {
        let codes = send(&client, &format!("{}/b", chain.a.url("egress")), 3).await;
        assert!(codes.iter().all(|c| *c >= 500), "{codes:?}");
        let (_, g) = catalog.get("/graph").await.ok()?;
        let e = link(&g, "zone-g/svc-a", "zone-g/svc-b")?.clone();
        (e["errors"].as_u64() > Some(0)).then_some(e)
    })
    .await
    .unwrap();
    let ratio = failing["errorRatio"].as_f64().unwrap();
    assert!(ratio > 0.0 && ratio <= 1.0, "{failing}");

    // The diagnosis of svc-a follows its failing calls to svc-b, whose own checks
    // find the dead service behind its sidecar: the root cause, with its owner.
    let dead = chain.b_service.addr.to_string();
    let (status, report) = catalog
        .get("/diagnose/svc-a?zoneName=zone-g")
        .await
        .unwrap();
    assert_eq!(status, 200, "{report:#}");
    let hops: Vec<(&str, &str)> = report["hops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["zoneName"].as_str().unwrap(),
                h["clusterName"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(hops, [(ZONE, "svc-a"), (ZONE, "svc-b")], "{report:#}");
    let root = &report["rootCause"];
    assert_eq!(
        (
            root["zoneName"].as_str(),
            root["clusterName"].as_str(),
            root["owner"].as_str(),
            root["ownerURL"].as_str()
        ),
        (
            Some(ZONE),
            Some("svc-b"),
            Some("team-b"),
            Some("https://teams.example/b")
        ),
        "{report:#}"
    );
    assert!(
        root["finding"].as_str().unwrap().contains(&dead),
        "the finding names svc-b's dead local address {dead}: {report:#}"
    );
    let conclusion = report["conclusion"].as_str().unwrap();
    assert!(
        conclusion.starts_with("svc-b in zone zone-g (owner team-b"),
        "{conclusion}"
    );
    assert!(conclusion.contains(&dead), "{conclusion}");
    // The recent changes are the history of the clusters followed, newest first.
    let recent = report["recentChanges"].as_array().unwrap();
    let clusters: std::collections::BTreeSet<&str> = recent
        .iter()
        .filter_map(|e| e["clusterName"].as_str())
        .collect();
    assert_eq!(
        clusters,
        ["svc-a", "svc-b"].into_iter().collect(),
        "{report:#}"
    );
    let ids: Vec<u64> = recent.iter().filter_map(|e| e["id"].as_u64()).collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "{ids:?}");
    // maxHops=1 keeps to the cluster asked about.
    let (_, one) = catalog
        .get("/diagnose/svc-a?zoneName=zone-g&maxHops=1")
        .await
        .unwrap();
    assert_eq!(one["hops"].as_array().map(Vec::len), Some(1), "{one:#}");
    // Its root cause is then its own failing check (svc-a names no metrics job),
    // never the cluster it was not allowed to follow.
    let root = &one["rootCause"];
    assert_eq!(
        (
            root["clusterName"].as_str(),
            root["owner"].as_str(),
            root["step"].as_str()
        ),
        (Some("svc-a"), Some("team-a"), Some("metrics_settings")),
        "{one:#}"
    );
}

/// Envoy lists an upstream's counters from its first request on: the graph counts
/// that first burst whole on every hop, whenever the agents' scrapes fall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_burst_on_each_hop_is_counted_whole() {
    const ZONE: &str = "zone-f";
    const BURST: usize = 20;
    let catalog = Catalog::start(|_| {}).await.unwrap();
    catalog.register_zone(ZONE, "edge").await.unwrap();
    for cluster in ["svc-a", "svc-b"] {
        catalog
            .register_cluster(ZONE, cluster, json!({"owner": "team-a"}))
            .await
            .unwrap();
    }
    let chain = Chain::start(&catalog, ZONE).await.unwrap();
    // Every sidecar reported before the first request.
    wait_for("the chain's instances", DEADLINE, || async {
        let (_, g) = catalog.get("/graph").await.ok()?;
        ["edge", "svc-a", "svc-b"]
            .iter()
            .all(|c| node(&g, &format!("{ZONE}/{c}")).is_some_and(|n| n["instances"] == 1))
            .then_some(())
    })
    .await
    .unwrap();
    let client = reqwest::Client::new();
    for path in [
        format!("{}/orders", chain.edge.url("edge")),
        format!("{}/b", chain.a.url("egress")),
        format!("{}/ext", chain.a.url("egress")),
    ] {
        let codes = send(&client, &path, BURST).await;
        assert!(codes.iter().all(|c| *c == 200), "{path}: {codes:?}");
    }
    let hops = [
        ("zone-f/edge", "zone-f/svc-a"),
        ("zone-f/svc-a", "zone-f/svc-b"),
        ("zone-f/svc-a", "zone-f/external:external-api"),
    ];
    let counted = |g: &Value| -> Vec<Option<u64>> {
        hops.iter()
            .map(|(s, t)| link(g, s, t).and_then(|e| e["requests"].as_u64()))
            .collect()
    };
    let whole = wait_for("the first burst on every hop", DEADLINE, || async {
        let (_, g) = catalog.get("/graph").await.ok()?;
        counted(&g)
            .iter()
            .all(|n| *n == Some(BURST as u64))
            .then_some(())
    })
    .await;
    if whole.is_err() {
        let (_, g) = catalog.get("/graph").await.unwrap();
        panic!("{:?} of {BURST} on {hops:?}: {g}", counted(&g));
    }
}

/// The chain with svc-a's sidecar reaching svc-b through its listener address under
/// its own cluster name: the graph links them by address, and the diagnosis of the
/// hop asks svc-a's sidecar under that name. Then svc-a's own service dies too: its
/// failure is its own, and svc-b's failing calls do not take the root cause away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hop_found_by_address_is_diagnosed_under_the_callers_name_and_an_own_failure_stays_root()
{
    const ZONE: &str = "zone-l";
    let catalog = Catalog::start(|_| {}).await.unwrap();
    catalog.register_zone(ZONE, "edge").await.unwrap();
    for (cluster, owner) in [("svc-a", "team-a"), ("svc-b", "team-b")] {
        catalog
            .register_cluster(ZONE, cluster, json!({"owner": owner}))
            .await
            .unwrap();
    }
    let mut chain = Chain::start_with(&catalog, ZONE, "b-by-address")
        .await
        .unwrap();
    let client = reqwest::Client::new();
    wait_for("svc-a -> svc-b linked by address", DEADLINE, || async {
        let codes = chain.traffic(&client).await;
        assert!(codes.iter().all(|s| *s == 200), "{codes:?}");
        let (_, g) = catalog.get("/graph").await.ok()?;
        let ab = link(&g, "zone-l/svc-a", "zone-l/svc-b")?;
        (ab["observed"] == true && ab["requests"].as_u64() > Some(0)).then_some(())
    })
    .await
    .unwrap();

    chain.b_service.stop().await;
    wait_for("errors on svc-a -> svc-b", DEADLINE, || async {
        let codes = send(&client, &format!("{}/b", chain.a.url("egress")), 3).await;
        assert!(codes.iter().all(|c| *c >= 500), "{codes:?}");
        let (_, g) = catalog.get("/graph").await.ok()?;
        let e = link(&g, "zone-l/svc-a", "zone-l/svc-b")?;
        (e["errors"].as_u64() > Some(0)).then_some(())
    })
    .await
    .unwrap();
    let (status, report) = catalog
        .get("/diagnose/svc-a?zoneName=zone-l")
        .await
        .unwrap();
    assert_eq!(status, 200, "{report:#}");
    let hops: Vec<&str> = report["hops"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["clusterName"].as_str())
        .collect();
    assert_eq!(hops, ["svc-a", "svc-b"], "{report:#}");
    // svc-a's sidecar discovers svc-b as b-by-address: the hop finds svc-b's dead
    // service behind its sidecar, not a cluster missing by the catalog's name.
    let dead = chain.b_service.addr.to_string();
    let root = &report["rootCause"];
    assert_eq!(
        (
            root["clusterName"].as_str(),
            root["owner"].as_str(),
            root["step"].as_str()
        ),
        (Some("svc-b"), Some("team-b"), Some("service_logs")),
        "{report:#}"
    );
    assert!(
        root["finding"].as_str().unwrap().contains(&dead),
        "{report:#}"
    );
    let b_hop = report["hops"][1]["conclusion"].as_str().unwrap();
    assert!(!b_hop.contains("does not exist"), "{b_hop}");

    // svc-a's own service dies: requests through the edge fail in svc-a's sidecar.
    chain.a_service.stop().await;
    let codes = send(&client, &format!("{}/orders", chain.edge.url("edge")), 3).await;
    assert!(codes.iter().all(|c| *c >= 500), "{codes:?}");
    let (status, report) = catalog
        .get("/diagnose/svc-a?zoneName=zone-l")
        .await
        .unwrap();
    assert_eq!(status, 200, "{report:#}");
    assert_eq!(
        report["hops"].as_array().map(Vec::len),
        Some(1),
        "a failure of its own is not followed: {report:#}"
    );
    let own = chain.a_service.addr.to_string();
    let root = &report["rootCause"];
    assert_eq!(
        (root["clusterName"].as_str(), root["step"].as_str()),
        (Some("svc-a"), Some("service_logs")),
        "{report:#}"
    );
    assert!(
        root["finding"].as_str().unwrap().contains(&own),
        "{report:#}"
    );
    assert!(
        report["conclusion"]
            .as_str()
            .unwrap()
            .starts_with("svc-a in zone zone-l (owner team-a)"),
        "{report:#}"
    );
}
