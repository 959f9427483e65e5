//! schemathesis (PyPI, installed into `.venv` by `scripts/test.sh`) against a real
//! aggregator's `GET /openapi.json`, with the write token so every route is reached:
//! no answer is a 5xx, and every answer's status, content type and body are true to
//! the document. Under `CI=true` a missing schemathesis fails the test.

use std::path::{Path, PathBuf};
use std::time::Duration;

use meshcat_aggregator::config::Config;
use serde_json::json;

/// `MESHCAT_SCHEMATHESIS`, else `<workspace>/.venv/bin/schemathesis`.
fn schemathesis() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MESHCAT_SCHEMATHESIS").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/schemathesis");
    p.is_file().then_some(p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_is_true_to_its_openapi_document() {
    let Some(st) = schemathesis() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "schemathesis is missing: scripts/test.sh installs it into .venv"
        );
        eprintln!("skipped: schemathesis not installed (scripts/test.sh installs it)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::for_tests(dir.path());
    config.dev = true;
    config.tokens.write = Some("st-write".into());
    config.tokens.read = Some("st-read".into());
    let agg = meshcat_aggregator::start(config).await.unwrap();
    let api = agg.api_url();
    // Some registrations, so lookups find something as well as nothing.
    let http = reqwest::Client::new();
    for (path, body) in [
        ("/zones", json!({"zoneName": "z", "serverAddress": "cp:1"})),
        (
            "/clusters",
            json!({"clusterName": "c", "zoneName": "z", "name": "C"}),
        ),
    ] {
        let res = http
            .post(format!("{api}{path}"))
            .bearer_auth("st-write")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(res.status().is_success(), "{path}: {}", res.status());
    }

    // The catalog keeps changing while schemathesis runs: it learns values from the
    // answers, the current index in `GET /graph`'s body among them, and sends one back
    // as a blocking query's `index`, which rightly waits for the next change (up to
    // `wait`, 10 minutes at most). With a change every half second, such a request
    // answers within the request timeout like any other. Schemathesis may delete
    // the churn zone it also learns about: then the churn registers it again, which
    // is a change too.
    let (stop_churn, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let churn = {
        let (http, api) = (http.clone(), api.clone());
        tokio::spawn(async move {
            let write = |method: reqwest::Method, path: &str, body: serde_json::Value| {
                let call = http
                    .request(method, format!("{api}{path}"))
                    .bearer_auth("st-write")
                    .json(&body)
                    .send();
                async move { call.await.is_ok_and(|r| r.status().is_success()) }
            };
            let mut changes = 0u64;
            loop {
                let cluster = json!({"clusterName": "churn", "zoneName": "churn", "name": "Churn", "description": changes.to_string()});
                let changed = write(reqwest::Method::PUT, "/clusters/churn", cluster.clone()).await
                    || {
                        write(
                            reqwest::Method::POST,
                            "/zones",
                            json!({"zoneName": "churn", "serverAddress": "cp:1"}),
                        )
                        .await;
                        write(reqwest::Method::POST, "/clusters", cluster).await
                    };
                changes += u64::from(changed);
                tokio::select! {
                    _ = &mut stopped => return changes,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        })
    };

    // Every route but the event stream, which never ends by itself: reading one takes
    // a whole request timeout, so it gets its own short run below.
    run(
        &st,
        dir.path(),
        &api,
        &[
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            "25",
            "--request-timeout",
            "20",
            "--exclude-path",
            "/events",
        ],
    )
    .await;
    // `GET /events`: the events read within the timeout are checked against the
    // document (names, data, ids).
    run(
        &st,
        dir.path(),
        &api,
        &[
            "--phases",
            "examples,fuzzing",
            "--max-examples",
            "10",
            "--request-timeout",
            "2",
            "--include-path",
            "/events",
        ],
    )
    .await;
    stop_churn.send(()).unwrap();
    let changes = churn.await.unwrap();
    assert!(changes > 1, "the catalog changed during the run");
    agg.stop().await.unwrap();
}

/// Runs schemathesis against `api` with the write token, the checks and `extra`
/// flags; fails the test on any problem found.
async fn run(st: &Path, dir: &Path, api: &str, extra: &[&str]) {
    let mut args = vec![
        "run".to_owned(),
        format!("{api}/openapi.json"),
        "--header".into(),
        "Authorization: Bearer st-write".into(),
        "--checks".into(),
        "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance".into(),
        // A fixed seed: the same cases every run, so a failure reproduces.
        "--seed".into(),
        "20261122".into(),
        "--workers".into(),
        "1".into(),
        "--no-color".into(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let run = tokio::process::Command::new(st)
        .args(&args)
        .env("SCHEMATHESIS_HOOKS", "")
        // Its cache of found failures goes with the test's directory, not the tree.
        .current_dir(dir)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(600), run)
        .await
        .expect("schemathesis ends by itself")
        .expect("schemathesis runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "schemathesis found problems:\n{text}");
    assert!(text.contains("passed"), "{text}");
}
