//! The dashboard's dependency graph (contract section 14) in a real browser: Debian's
//! Chromium driven by Playwright (`tests/browser/graph.py`) against a real aggregator
//! with a read token, real agents and real Envoy sidecars. The mesh is the chain of
//! `e2e_graph`: edge -> svc-a -> svc-b, svc-a also calling a service nobody
//! registered and declaring svc-b plus `ghost`, which it never calls; svc-b's service
//! then dies so svc-a's edge to it carries errors. Traffic stops before the browser
//! starts and the graph window is long, so the figures the page shows hold still
//! while the script compares them with the API. The screenshots go to
//! `target/e2e-dashboard/` beside the dashboard test's (with
//! `MESHCAT_UPDATE_SCREENSHOT=1`, the graph also becomes `docs/dashboard-graph.png`).
//!
//! A second test registers a mesh big enough for the view's large-graph paths
//! (`tests/browser/graph_large.py`): the canvas drawn into pixels with the whole mesh
//! in sight, the hit test's spatial index, the list form's windowed tables.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use meshcat_tests::browser::{BrowserTools, output_dir};
use meshcat_tests::chain::{Chain, link, send};
use meshcat_tests::{Catalog, wait_for};
use serde_json::{Value, json};

const ZONE: &str = "zone-g";
const TOKEN: &str = "graph-view-e2e-token";
const DEADLINE: Duration = Duration::from_secs(45);
/// Longer than the whole test: no edge leaves the window while the page is checked.
const WINDOW: Duration = Duration::from_secs(900);
/// How long the edges' figures must hold still before the browser starts: a few
/// report intervals, so the last traffic has been reported.
const SETTLED: Duration = Duration::from_millis(1500);

async fn graph(catalog: &Catalog) -> Option<Value> {
    let (status, g) = catalog.get_as("/graph", Some(TOKEN)).await.ok()?;
    (status == 200).then_some(g)
}

/// The edges with their figures: what must hold still before the page is compared.
fn figures(g: &Value) -> Vec<(Value, Value, Value, Value, Value)> {
    g["edges"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["source"].clone(),
                e["target"].clone(),
                e["requests"].clone(),
                e["errors"].clone(),
                e["observed"].clone(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_graph_view_in_a_real_browser() {
    let tools = BrowserTools::find().await.unwrap();
    let catalog = Catalog::start(|c| {
        c.tokens.read = Some(TOKEN.into());
        c.store.rules.graph_window = WINDOW;
    })
    .await
    .unwrap();
    catalog.register_zone(ZONE, "edge").await.unwrap();
    catalog
        .register_cluster(ZONE, "edge", json!({"owner": "team-edge"}))
        .await
        .unwrap();
    catalog
        .register_cluster(
            ZONE,
            "svc-a",
            json!({"owner": "team-a", "dependencies": ["svc-b", "ghost"]}),
        )
        .await
        .unwrap();
    catalog
        .register_cluster(ZONE, "svc-b", json!({"owner": "team-b"}))
        .await
        .unwrap();

    let mut chain = Chain::start(&catalog, ZONE).await.unwrap();

    // Traffic until the sidecars' reports show the whole chain.
    let client = reqwest::Client::new();
    wait_for("the observed chain", DEADLINE, || async {
        let codes = chain.traffic(&client).await;
        assert!(codes.iter().all(|s| *s == 200), "{codes:?}");
        let g = graph(&catalog).await?;
        let observed = |s: &str, t: &str| link(&g, s, t).is_some_and(|e| e["observed"] == true);
        (observed("zone-g/edge", "zone-g/svc-a")
            && observed("zone-g/svc-a", "zone-g/svc-b")
            && observed("zone-g/svc-a", "zone-g/external:external-api"))
        .then_some(())
    })
    .await
    .unwrap();
    // svc-b's service dies: svc-a's calls to it fail.
    chain.b_service.stop().await;
    wait_for("errors on svc-a -> svc-b", DEADLINE, || async {
        send(&client, &format!("{}/b", chain.a.url("egress")), 3).await;
        let g = graph(&catalog).await?;
        let e = link(&g, "zone-g/svc-a", "zone-g/svc-b")?;
        (e["errors"].as_u64() > Some(0)).then_some(())
    })
    .await
    .unwrap();
    // No more traffic: wait until the reports carry the last of it.
    let last = RefCell::new((Vec::new(), Instant::now()));
    wait_for("the edges' figures to hold still", DEADLINE, || async {
        let now = figures(&graph(&catalog).await?);
        let mut last = last.borrow_mut();
        if now != last.0 {
            *last = (now, Instant::now());
            return None;
        }
        (last.1.elapsed() >= SETTLED).then_some(())
    })
    .await
    .unwrap();

    let out = output_dir();
    std::fs::create_dir_all(&out).unwrap();
    let spec = json!({
        "api": catalog.api_url(),
        "token": TOKEN,
        "chromium": tools.chromium,
        "out": out,
        "zone": ZONE,
    });
    let mut script = tools
        .run("graph.py", &[spec.to_string()])
        .expect("browser script starts");
    while let Some(line) = script
        .next_line(Duration::from_secs(240))
        .await
        .expect("browser script output")
    {
        eprintln!("graph.py says: {line}");
    }
    script.finish(Duration::from_secs(30)).await.unwrap();
    for view in [
        "graph.png",
        "cluster-calls.png",
        "graph-focus.png",
        "overview-200-zones.png",
        "phone-graph.png",
    ] {
        let len = std::fs::metadata(out.join(view)).map_or(0, |m| m.len());
        assert!(len > 1000, "screenshot {view} saved ({len} bytes)");
    }
    if std::env::var_os("MESHCAT_UPDATE_SCREENSHOT").is_some_and(|v| v == "1") {
        let docs =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/dashboard-graph.png");
        std::fs::copy(out.join("graph.png"), docs).unwrap();
    }
}

/// Clusters of the large mesh, in three zones; each declares three others, so the
/// mesh has three times as many edges: more than the canvas draws with its own paths
/// when all are in sight, and tables longer than the list form builds whole.
const LARGE_CLUSTERS: usize = 1500;
const LARGE_ZONES: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_graph_in_a_real_browser() {
    let tools = BrowserTools::find().await.unwrap();
    let catalog = Catalog::start(|_| {}).await.unwrap();
    let zone = |i: usize| format!("large-{}", i * LARGE_ZONES / LARGE_CLUSTERS);
    let name = |i: usize| format!("svc-{i:04}");
    for z in 0..LARGE_ZONES {
        catalog
            .register_zone(&zone(z * LARGE_CLUSTERS / LARGE_ZONES), "edge")
            .await
            .unwrap();
    }
    let records: Vec<Value> = (0..LARGE_CLUSTERS)
        .map(|i| {
            // The clusters 1, 7 and 31 further on: mostly in the zone, some across.
            let deps: Vec<String> = [1, 7, 31]
                .iter()
                .map(|off| {
                    let j = (i + off) % LARGE_CLUSTERS;
                    if zone(j) == zone(i) {
                        name(j)
                    } else {
                        format!("{}/{}", zone(j), name(j))
                    }
                })
                .collect();
            json!({"zoneName": zone(i), "clusterName": name(i), "name": name(i), "dependencies": deps})
        })
        .collect();
    for chunk in records.chunks(500) {
        catalog.create("/clusters", json!(chunk)).await.unwrap();
    }
    let out = output_dir();
    std::fs::create_dir_all(&out).unwrap();
    let spec = json!({
        "api": catalog.api_url(),
        "token": "",
        "chromium": tools.chromium,
        "out": out,
        "zone": zone(0),
        "nodes": LARGE_CLUSTERS,
        "edges": LARGE_CLUSTERS * 3,
    });
    let mut script = tools
        .run("graph_large.py", &[spec.to_string()])
        .expect("browser script starts");
    while let Some(line) = script
        .next_line(Duration::from_secs(240))
        .await
        .expect("browser script output")
    {
        eprintln!("graph_large.py says: {line}");
    }
    script.finish(Duration::from_secs(30)).await.unwrap();
    let len = std::fs::metadata(out.join("graph-large.png")).map_or(0, |m| m.len());
    assert!(len > 1000, "screenshot graph-large.png saved ({len} bytes)");
}
