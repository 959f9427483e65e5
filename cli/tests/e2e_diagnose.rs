//! `meshcat diagnose` end to end: the real binary against an in-process aggregator
//! and agents beside the live `healthy` scenario's Envoys. Checks the checklist text,
//! `--output json`, and the exit codes (0 all passed, 1 a step failed, 2 API error).

use std::time::Duration;

use meshcat_tests::diagnose_stack::*;
use meshcat_tests::scenario::Scenario;
use serde_json::{Value, json};

/// Runs the CLI; answers (exit code, stdout, stderr).
async fn meshcat(args: &[&str]) -> (i32, String, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_meshcat"))
            .args(args)
            .env_remove("MESHCAT_API")
            .env_remove("MESHCAT_TOKEN_FILE")
            .output(),
    )
    .await
    .expect("the CLI ends by itself")
    .expect("the CLI runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diagnose_prints_a_checklist_and_exits_by_verdict() {
    let mut sc = Scenario::start("healthy").await.unwrap();
    let stack = Stack::start(&sc).await;
    sc.fail().await.unwrap();
    let api = stack.api();
    // The sidecar's inbound stats reach the catalog with the agent's next report.
    stack
        .diagnose_until("&path=/catalog/items", |r| {
            verdict(r, "service_logs") == "pass" && verdict(r, "metrics_reporting") == "pass"
        })
        .await;

    let (code, out, err) = meshcat(&[
        "--api",
        &api,
        "diagnose",
        SERVICE,
        "--zone",
        ZONE,
        "--path",
        "/catalog/items",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("Diagnosis of cluster catalog in zone local (all checks)"),
        "{out}"
    );
    for step in [
        "edge_discovery",
        "service_discovery",
        "mtls",
        "edge_routes",
        "edge_logs",
        "service_logs",
    ] {
        assert!(out.contains(&format!("[pass] {step}")), "{step}: {out}");
    }
    assert!(out.contains("[skip] metrics_collector"), "{out}");
    // The conclusion comes before the checklist; nothing failed, so no root cause.
    assert!(!out.contains("Root cause: "), "{out}");
    let cause = out.find("Conclusion: ").expect("a conclusion line");
    assert!(cause < out.find("[pass] edge_discovery").unwrap(), "{out}");

    let (code, out, err) = meshcat(&[
        "--api",
        &api,
        "diagnose",
        SERVICE,
        "--zone",
        ZONE,
        "--symptom",
        "upstream_connect_error",
        "--path",
        "/catalog/items",
        "--output",
        "json",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).expect("json output");
    assert_eq!(v["cluster"], "catalog");
    assert_eq!(v["symptom"], "upstream_connect_error");
    assert_eq!(v["steps"].as_array().unwrap().len(), 6, "{v:#}");
    assert_eq!(v["conclusion"], "All checks passed.");

    // Metrics switched off for the cluster: the missing-metrics check fails, exit 1.
    let r = stack
        .http
        .put(format!("{api}/clusters/{SERVICE}"))
        .json(
            &json!({"clusterName": SERVICE, "zoneName": ZONE, "name": SERVICE,
            "enableInstanceMetrics": false}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (code, out, err) = meshcat(&[
        "--api",
        &api,
        "diagnose",
        SERVICE,
        "--zone",
        ZONE,
        "--symptom",
        "missing_metrics",
    ])
    .await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("[FAIL] metrics_settings"), "{out}");
    let cause = out
        .find("Root cause: cluster catalog in zone local, ")
        .expect("the cluster is the root cause");
    assert!(
        out[cause..]
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("  metrics_settings failed: "),
        "the failed setting follows the root cause: {out}"
    );
    assert!(
        cause < out.find("[FAIL] metrics_settings").unwrap(),
        "{out}"
    );
    assert!(out.contains("-> "), "the action is printed: {out}");

    // API errors: unknown zone (404), unknown symptom (400), no API at all: exit 2.
    for args in [
        vec![
            "--api",
            api.as_str(),
            "diagnose",
            SERVICE,
            "--zone",
            "nowhere",
        ],
        vec![
            "--api",
            api.as_str(),
            "diagnose",
            SERVICE,
            "--zone",
            ZONE,
            "--symptom",
            "slow",
        ],
    ] {
        let (code, out, err) = meshcat(&args).await;
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.starts_with("meshcat: "), "{err}");
    }
    let (_, _, err) = meshcat(&[
        "--api",
        &api,
        "diagnose",
        SERVICE,
        "--zone",
        ZONE,
        "--symptom",
        "slow",
    ])
    .await;
    assert!(err.contains("slow"), "the bad symptom is named: {err}");
    stack.stop().await;
    let (code, _, err) = meshcat(&["--api", &api, "diagnose", SERVICE, "--zone", ZONE]).await;
    assert_eq!(code, 2, "{err}");
}
