//! Workload identity in the dashboard (contract sections 12 and 19) in a real
//! browser: Debian's Chromium driven by Playwright (`tests/browser/identity.py`)
//! against a real aggregator with a read token and real Envoys whose certificates
//! the test issues: `orders` expiring within the warning, `payments` good for
//! months, and an edge whose cluster to `orders` requires a SPIFFE ID that orders
//! does not present. The script checks the cluster rows' identity, the overview's
//! list of certificates needing action, each instance's identity and the graph's
//! mismatched edge against the API. Screenshots go to `target/e2e-dashboard/`.

use std::time::Duration;

use meshcat_tests::bootstrap::{Cluster, HttpListener, Tls};
use meshcat_tests::browser::{BrowserTools, output_dir};
use meshcat_tests::certs::CertSpec;
use meshcat_tests::{Bootstrap, Catalog, Envoy, MeshAgent, MeshCerts, Upstream, wait_for};
use serde_json::json;

const ZONE: &str = "zone-i";
const TOKEN: &str = "dashboard-identity-e2e-token";
const DEADLINE: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);

fn spiffe(sa: &str) -> String {
    format!("spiffe://zone-i.local/ns/zone-i/sa/{sa}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_in_a_real_browser() {
    let tools = BrowserTools::find().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let certs = MeshCerts::new(dir.path(), "dash").unwrap();
    let catalog = Catalog::start(|c| c.tokens.read = Some(TOKEN.into()))
        .await
        .unwrap();
    catalog.register_zone(ZONE, "edge").await.unwrap();
    for cluster in ["edge", "orders", "payments"] {
        catalog
            .register_cluster(ZONE, cluster, json!({"owner": format!("team-{cluster}")}))
            .await
            .unwrap();
    }
    let upstream = Upstream::start().await.unwrap();
    let mut sidecars = Vec::new();
    for (cluster, left) in [("orders", 3 * DAY), ("payments", 90 * DAY)] {
        let id = certs
            .issue(&CertSpec::valid_for(
                cluster,
                &format!("{cluster}.zone-i"),
                &spiffe(cluster),
                left,
            ))
            .unwrap();
        let envoy = Envoy::start(Bootstrap::service_sidecar(
            upstream.addr,
            Some(Tls::new(&certs, id, None)),
        ))
        .await
        .unwrap();
        sidecars.push((cluster, envoy));
    }
    let edge_id = certs
        .issue(&CertSpec::valid_for(
            "edge",
            "edge.zone-i",
            &spiffe("edge"),
            90 * DAY,
        ))
        .unwrap();
    let mut edge = Bootstrap::new();
    let mut listener = HttpListener::new("edge", "edge_http");
    for (cluster, envoy) in &sidecars {
        listener = listener.route(&format!("/{cluster}"), cluster);
        let mut c = Cluster::new(cluster, &[envoy.listener("ingress")]);
        let expect = if *cluster == "orders" {
            spiffe("WRONG")
        } else {
            spiffe(cluster)
        };
        c.tls = Some(Tls::new(&certs, edge_id.clone(), None).expecting_uri(&expect));
        edge = edge.cluster(c);
    }
    let edge = Envoy::start(edge.listener(listener)).await.unwrap();
    let mut agents = Vec::new();
    for (cluster, envoy) in sidecars
        .iter()
        .map(|(c, e)| (*c, e))
        .chain([("edge", &edge)])
    {
        let args =
            catalog.sidecar_agent_args(envoy, ZONE, cluster, &format!("{cluster}-1"), "300ms");
        agents.push(MeshAgent::start(&args).await.unwrap());
    }
    wait_for("the mismatched edge on the graph", DEADLINE, || async {
        let (_, g) = catalog
            .get_as(&format!("/graph?zoneName={ZONE}"), Some(TOKEN))
            .await
            .ok()?;
        g["edges"]
            .as_array()?
            .iter()
            .any(|e| e["target"] == format!("{ZONE}/orders") && e["tlsIdentity"]["match"] == false)
            .then_some(())
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
        "expiring": "orders",
        "fine": "payments",
        "caller": "edge",
    });
    let script = tools
        .run("identity.py", &[spec.to_string()])
        .expect("browser script starts");
    script.finish(Duration::from_secs(180)).await.unwrap();
    drop((agents, sidecars, edge));
}
