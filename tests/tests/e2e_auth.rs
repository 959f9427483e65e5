//! The read token end to end: with `--read-token-file`, live data reported by a real
//! agent is hidden from callers without the token and shown to those with it.

use std::time::Duration;

use meshcat_tests::mesh::instance_names;
use meshcat_tests::{Catalog, MeshAgent, Sidecar, wait_for};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(20);
const TOKEN: &str = "read-3f9a1c";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_are_hidden_without_the_read_token() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("read.token");
    std::fs::write(&token_file, format!("  {TOKEN}\n")).unwrap();
    // Read as the aggregator reads --read-token-file: surrounding whitespace trimmed.
    let read_token = meshcat_common::config::read_token_file(&token_file).unwrap();
    let catalog = Catalog::start(|c| {
        c.store.rules.instance_ttl = Duration::from_millis(900);
        c.tokens.read = Some(read_token);
    })
    .await
    .unwrap();
    catalog.register_zone("zone-t", "").await.unwrap();
    catalog
        .register_cluster(
            "zone-t",
            "ledger",
            json!({"name": "Ledger", "version": "2", "owner": "team-l"}),
        )
        .await
        .unwrap();
    let sidecar = Sidecar::start().await.unwrap();
    let _agent =
        MeshAgent::for_sidecar(&catalog, &sidecar, "zone-t", "ledger", "ledger-1", "300ms")
            .await
            .unwrap();

    // With the token: authorized, the instance and its metrics.
    let seen = wait_for("the instance seen with the token", DEADLINE, || async {
        let (_, list) = catalog.get_as("/clusters/ledger", Some(TOKEN)).await.ok()?;
        (instance_names(&list[0]) == ["ledger-1"]).then_some(list)
    })
    .await
    .unwrap();
    assert_eq!(seen[0]["authorized"], true);
    assert_eq!(seen[0]["status"], "stable");
    let (s, _) = catalog
        .get_as("/metrics/ledger/ledger-1", Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(s, 200);

    // Without it (or with a wrong one): metadata only.
    for token in [None, Some("wrong")] {
        for path in ["/clusters/ledger", "/clusters", "/services"] {
            let (s, list) = catalog.get_as(path, token).await.unwrap();
            assert_eq!(s, 200, "{path}");
            let c = &list[0];
            assert_eq!(c["authorized"], false, "{path}: {c}");
            assert_eq!(c["instances"], json!([]), "{path}: {c}");
            assert_eq!(c["owner"], "team-l");
            assert_eq!(c["status"], "stable", "status stays visible: {c}");
        }
        for path in ["/metrics/ledger/ledger-1", "/metrics/Ledger/2/ledger-1"] {
            let (s, body) = catalog.get_as(path, token).await.unwrap();
            assert_eq!(s, 403, "{path}");
            assert_eq!(body["code"], "forbidden");
        }
        let (_, summary) = catalog.get_as("/summary", token).await.unwrap();
        let c = &summary["zones"]["zone-t"]["clusters"]["ledger"];
        assert_eq!(c["authorized"], false, "{summary}");
        assert_eq!(c["instances"], json!([]), "{summary}");
    }
    let (_, hidden) = catalog.get("/clusters?authorized=false").await.unwrap();
    assert_eq!(hidden.as_array().unwrap().len(), 1);
    let (_, shown) = catalog
        .get_as("/clusters?authorized=true", Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(shown.as_array().unwrap().len(), 1);
    let (_, none) = catalog.get("/clusters?authorized=true").await.unwrap();
    assert_eq!(none, json!([]));
}
