//! The dashboard (contract section 12) in a real browser: Debian's Chromium driven by
//! Playwright (`tests/browser/dashboard.py`) against a real aggregator with read and
//! write tokens, real agents and real Envoy sidecars (two of one cluster on
//! different routes, drifted). The script checks the page against the API; this side
//! builds the mesh, stops an agent when the script asks,
//! and keeps the screenshots in `target/e2e-dashboard/` (with
//! `MESHCAT_UPDATE_SCREENSHOT=1`, the overview also becomes `docs/dashboard.png`,
//! the README's picture).

use std::time::Duration;

use meshcat_tests::browser::{BrowserTools, output_dir};
use meshcat_tests::mesh::instance_names;
use meshcat_tests::{Bootstrap, Catalog, Envoy, MeshAgent, Sidecar, Upstream, wait_for};
use serde_json::{Value, json};

const ZONE: &str = "east";
const TOKEN: &str = "dashboard-e2e-token";
const INTERVAL: &str = "300ms";
/// Long beside the interval so a loaded machine never expires a reporting instance
/// while the page is compared with the API; a stopped agent's instances leave at
/// once (its connection ends), not after the TTL.
const TTL: Duration = Duration::from_secs(5);
const DEADLINE: Duration = Duration::from_secs(30);
/// Requests sent through the busy cluster's first sidecar.
const REQUESTS: i64 = 7;
/// Registered clusters beyond the three with a story, so the table has more rows
/// than it renders.
const FILLER: usize = 300;

async fn post(catalog: &Catalog, path: &str, body: Value) -> anyhow::Result<()> {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", catalog.api_url()))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await?;
    anyhow::ensure!(r.status() == 201, "POST {path}: {}", r.status());
    Ok(())
}

/// The cluster record of `name` in the zone, as a token holder reads it.
async fn record(catalog: &Catalog, name: &str) -> Option<Value> {
    let (_, v) = catalog
        .get_as(&format!("/clusters/{name}?zoneName={ZONE}"), Some(TOKEN))
        .await
        .ok()?;
    v.get(0).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_a_real_browser() {
    let tools = BrowserTools::find().await.unwrap();
    let catalog = Catalog::start(|c| {
        c.store.rules.instance_ttl = TTL;
        c.tokens.read = Some(TOKEN.into());
        c.tokens.write = Some(TOKEN.into());
    })
    .await
    .unwrap();
    for zone in [ZONE, "west"] {
        post(
            &catalog,
            "/zones",
            json!({"zoneName": zone, "serverAddress": "control.local:50000"}),
        )
        .await
        .unwrap();
    }
    let cluster = |name: &str, extra: Value| {
        let mut b =
            json!({"zoneName": ZONE, "clusterName": name, "name": name, "version": "1.4.2"});
        if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        b
    };
    let named = json!([
        cluster(
            "shop",
            json!({"name": "Storefront", "owner": "team-web", "capability": "checkout",
            "minInstances": 1, "businessImpact": "high", "documentation": "https://docs.example/shop"})
        ),
        cluster(
            "catalog",
            json!({"owner": "team-data", "capability": "product-search",
            "minInstances": 2, "businessImpact": "medium"})
        ),
        cluster(
            "billing",
            json!({"owner": "team-money", "capability": "invoicing", "minInstances": 1})
        ),
        cluster(
            "ledger",
            json!({"owner": "team-books", "capability": "accounts"})
        ),
    ]);
    post(&catalog, "/clusters", named).await.unwrap();
    let filler: Vec<Value> = (0..FILLER)
        .map(|i| {
            json!({"zoneName": "west", "clusterName": format!("svc-{i:04}"), "name": format!("Service {i}"),
                "owner": format!("team-{}", i % 7), "capability": format!("cap-{}", i % 11)})
        })
        .collect();
    post(&catalog, "/clusters", Value::Array(filler))
        .await
        .unwrap();

    // shop: two instances, stable; catalog: one of two wanted, warning; billing: down.
    let shop_a = Sidecar::start().await.unwrap();
    let shop_b = Sidecar::start().await.unwrap();
    let catalog_a = Sidecar::start().await.unwrap();
    let _agent_shop_a = MeshAgent::for_sidecar(&catalog, &shop_a, ZONE, "shop", "shop-a", INTERVAL)
        .await
        .unwrap();
    let _agent_shop_b = MeshAgent::for_sidecar(&catalog, &shop_b, ZONE, "shop", "shop-b", INTERVAL)
        .await
        .unwrap();
    let agent_catalog =
        MeshAgent::for_sidecar(&catalog, &catalog_a, ZONE, "catalog", "catalog-a", INTERVAL)
            .await
            .unwrap();
    shop_a.send("/", REQUESTS as usize, 200).await.unwrap();
    // ledger: two instances whose sidecars route differently, drifted.
    let (ledger_up_a, ledger_up_b) = (
        Upstream::start().await.unwrap(),
        Upstream::start().await.unwrap(),
    );
    let ledger_a = Envoy::start(Bootstrap::routed_sidecar(
        ledger_up_a.addr,
        "ledger",
        "ledger-a",
        "/",
    ))
    .await
    .unwrap();
    let ledger_b = Envoy::start(Bootstrap::routed_sidecar(
        ledger_up_b.addr,
        "ledger",
        "ledger-b",
        "/v2",
    ))
    .await
    .unwrap();
    let _agent_ledger_a =
        MeshAgent::for_envoy(&catalog, &ledger_a, ZONE, "ledger", "ledger-a", INTERVAL)
            .await
            .unwrap();
    let _agent_ledger_b =
        MeshAgent::for_envoy(&catalog, &ledger_b, ZONE, "ledger", "ledger-b", INTERVAL)
            .await
            .unwrap();

    wait_for("shop stable with two instances", DEADLINE, || async {
        let c = record(&catalog, "shop").await?;
        (c["status"] == "stable" && instance_names(&c) == ["shop-a", "shop-b"]).then_some(())
    })
    .await
    .unwrap();
    wait_for("catalog in warning with one instance", DEADLINE, || async {
        let c = record(&catalog, "catalog").await?;
        (c["status"] == "warning" && instance_names(&c) == ["catalog-a"]).then_some(())
    })
    .await
    .unwrap();
    wait_for("ledger drifted", DEADLINE, || async {
        let (_, d) = catalog
            .get_as(
                &format!("/clusters/ledger/drift?zoneName={ZONE}"),
                Some(TOKEN),
            )
            .await
            .ok()?;
        (d["drifted"] == true).then_some(())
    })
    .await
    .unwrap();
    wait_for("shop-a's metrics count every request", DEADLINE, || async {
        let (_, m) = catalog
            .get_as(
                &format!("/metrics/shop/shop-a?zoneName={ZONE}"),
                Some(TOKEN),
            )
            .await
            .ok()?;
        (m["Total/requests"] == REQUESTS).then_some(())
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
        "statuses": {"shop": "stable", "catalog": "warning", "billing": "down"},
        "searches": ["shop", "team-data", "invoicing", "svc-000"],
        "busy": "shop",
        "busyInstance": "shop-a",
        "busyRequests": REQUESTS,
        // A registration edit of the busy cluster, made while its view is open.
        "busyEdit": cluster(
            "shop",
            json!({"name": "Storefront", "owner": "team-web", "capability": "checkout",
            "minInstances": 1, "businessImpact": "high", "documentation": "https://docs.example/shop",
            "version": "1.4.3"})
        ),
        "drifted": "ledger",
        "stop": "catalog",
    });
    let mut script = tools
        .run("dashboard.py", &[spec.to_string()])
        .expect("browser script starts");
    let mut agent_catalog = Some(agent_catalog);
    while let Some(line) = script
        .next_line(Duration::from_secs(240))
        .await
        .expect("browser script output")
    {
        if line == "STOP catalog" {
            if let Some(a) = agent_catalog.take() {
                a.stop().await.unwrap();
            }
            script.answer("stopped").await.unwrap();
        }
    }
    script.finish(Duration::from_secs(30)).await.unwrap();
    assert!(
        agent_catalog.is_none(),
        "the script asked for the agent to stop"
    );
    for view in [
        "overview.png",
        "cluster.png",
        "cluster-drift.png",
        "diagnosis.png",
        "token-dialog.png",
        "phone-overview.png",
        "phone-cluster.png",
        "overview-after-stop.png",
    ] {
        let len = std::fs::metadata(out.join(view)).map_or(0, |m| m.len());
        assert!(len > 1000, "screenshot {view} saved ({len} bytes)");
    }
    if std::env::var_os("MESHCAT_UPDATE_SCREENSHOT").is_some_and(|v| v == "1") {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/dashboard.png");
        std::fs::copy(out.join("overview.png"), docs).unwrap();
    }
}
