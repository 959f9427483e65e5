//! The dashboard's view of the zone's control server (contract sections 12 and 17)
//! in a real browser: Debian's Chromium driven by Playwright
//! (`tests/browser/control.py`) against a real aggregator with a read token, the
//! workspace's ADS server serving the zone and a real Envoy sidecar, whose agent
//! reports it. The script checks the zone's control state and the sidecar's sync
//! state against the API; this side changes the control server when the script
//! asks: `HOLD` holds the sidecar on its snapshot and moves an endpoint (the sidecar
//! turns `stale`), `STOP` stops the control server (the zone turns `unreachable`).
//! Screenshots go to `target/e2e-dashboard/`.

use std::time::Duration;

use meshcat_control_server::{ClusterSpec, ControlServer, EndpointSpec, MeshSpec};
use meshcat_tests::browser::{BrowserTools, output_dir};
use meshcat_tests::xds::{XdsBootstrap, XdsEnvoy};
use meshcat_tests::{Catalog, MeshAgent, wait_for};
use serde_json::{Value, json};

const ZONE: &str = "zone-c";
const TOKEN: &str = "dashboard-control-e2e-token";
const DEADLINE: Duration = Duration::from_secs(30);
/// The cluster whose sidecar the agent reports, and that sidecar.
const CLUSTER: &str = "orders";
const INSTANCE: &str = "orders-a";
/// A cluster the control server declares and no agent reports.
const DECLARED: &str = "ledger";

/// The mesh the control server declares: `payments` at `payments`' addresses.
fn spec(payments: &[&str]) -> MeshSpec {
    MeshSpec {
        clusters: vec![
            ClusterSpec::new(
                "payments",
                payments
                    .iter()
                    .map(|a| EndpointSpec::new(a, 8080))
                    .collect(),
            ),
            ClusterSpec::new(
                DECLARED,
                vec![
                    EndpointSpec::new("10.0.2.1", 7000),
                    EndpointSpec::new("10.0.2.2", 7000),
                ],
            ),
        ],
        listeners: Vec::new(),
    }
}

async fn get(catalog: &Catalog, path: &str) -> Option<Value> {
    let (status, body) = catalog.get_as(path, Some(TOKEN)).await.ok()?;
    (status == 200).then_some(body)
}

async fn sync_state(catalog: &Catalog) -> Option<String> {
    let body = get(
        catalog,
        &format!("/sync?zoneName={ZONE}&clusterName={CLUSTER}"),
    )
    .await?;
    body["proxies"]
        .as_array()?
        .iter()
        .find(|p| p["instance"] == INSTANCE)
        .and_then(|p| p["state"].as_str().map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_and_sync_states_in_a_real_browser() {
    let tools = BrowserTools::find().await.unwrap();
    let server = ControlServer::start("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    server.set(spec(&["10.0.1.1", "10.0.1.2"]));
    let catalog = Catalog::start(|c| {
        c.sync.grace = Duration::from_secs(1);
        c.tokens.read = Some(TOKEN.into());
    })
    .await
    .unwrap();
    catalog
        .register_zone_at(ZONE, server.local_addr(), "")
        .await
        .unwrap();
    for cluster in [CLUSTER, DECLARED] {
        catalog
            .register_cluster(ZONE, cluster, json!({"owner": format!("team-{cluster}")}))
            .await
            .unwrap();
    }

    let envoy = XdsEnvoy::start(&XdsBootstrap::new(INSTANCE, CLUSTER, server.local_addr()))
        .await
        .unwrap();
    let args = envoy.agent_args(catalog.agent_args(), (ZONE, CLUSTER, INSTANCE));
    let _agent = MeshAgent::start(&args).await.unwrap();

    wait_for("the zone connected", DEADLINE, || async {
        let c = get(&catalog, &format!("/zones/{ZONE}/control")).await?;
        (c["state"] == "connected").then_some(())
    })
    .await
    .unwrap();
    wait_for("the sidecar synced", DEADLINE, || async {
        (sync_state(&catalog).await? == "synced").then_some(())
    })
    .await
    .unwrap();
    wait_for("ledger's endpoints as its instances", DEADLINE, || async {
        let c = get(&catalog, &format!("/clusters/{DECLARED}?zoneName={ZONE}")).await?;
        (c[0]["instances"].as_array()?.len() == 2).then_some(())
    })
    .await
    .unwrap();

    let out = output_dir();
    std::fs::create_dir_all(&out).unwrap();
    let spec_arg = json!({
        "api": catalog.api_url(),
        "token": TOKEN,
        "chromium": tools.chromium,
        "out": out,
        "zone": ZONE,
        "cluster": CLUSTER,
        "instance": INSTANCE,
        "declared": DECLARED,
        "serverAddress": server.local_addr().to_string(),
        // The endpoint the held sidecar misses once the snapshot moves on.
        "moved": "10.0.1.3:8080",
    });
    let mut script = tools
        .run("control.py", &[spec_arg.to_string()])
        .expect("browser script starts");
    let mut asked = Vec::new();
    while let Some(line) = script
        .next_line(Duration::from_secs(180))
        .await
        .expect("browser script output")
    {
        match line.as_str() {
            "HOLD" => {
                server.hold(INSTANCE);
                server.set(spec(&["10.0.1.2", "10.0.1.3"]));
                script.answer("held").await.unwrap();
            }
            "STOP" => {
                server.stop().await;
                script.answer("stopped").await.unwrap();
            }
            _ => continue,
        }
        asked.push(line);
    }
    script.finish(Duration::from_secs(30)).await.unwrap();
    assert_eq!(asked, ["HOLD", "STOP"], "the script asked for both changes");
    for view in [
        "control-hidden.png",
        "control-overview.png",
        "control-cluster.png",
        "control-stale.png",
        "control-unreachable.png",
        "control-phone.png",
    ] {
        let len = std::fs::metadata(out.join(view)).map_or(0, |m| m.len());
        assert!(len > 1000, "screenshot {view} saved ({len} bytes)");
    }
}
