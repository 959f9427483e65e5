//! The sidecar log level and the debug window through the aggregator, against real
//! Envoys: per instance GET and PUT really change Envoy's level; the per-cluster PUT
//! answers every instance's outcome within the deadline even when one agent hangs;
//! a hung agent never blocks other requests; a debug window returns the TLS lines of
//! an untrusted client certificate and restores the level.

use std::time::{Duration, Instant};

use meshcat_tests::diagnose_stack::*;
use meshcat_tests::scenario::Scenario;
use meshcat_tests::wait_for;
use serde_json::Value;

fn instance_url(stack: &Stack, instance: &str) -> String {
    format!(
        "{}/zones/{ZONE}/clusters/{SERVICE}/instances/{instance}/logging",
        stack.api()
    )
}

async fn text(r: reqwest::Response) -> (u16, String) {
    let code = r.status().as_u16();
    (code, r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_level_through_the_aggregator_changes_envoy() {
    let _turn = SERIAL.lock().await;
    let sc = Scenario::start("healthy").await.unwrap();
    let stack = Stack::start(&sc).await;
    let url = instance_url(&stack, "catalog-0");
    let http = &stack.http;
    assert_eq!(
        text(http.get(&url).send().await.unwrap()).await,
        (200, "info".into())
    );

    let (code, body) = text(http.put(format!("{url}?level=warn")).send().await.unwrap()).await;
    assert_eq!((code, body.as_str()), (200, "warn"));
    assert_eq!(
        sc.service.uniform_log_level().await.unwrap().as_deref(),
        Some("warning"),
        "warn is sent to Envoy as warning"
    );
    assert_eq!(
        text(http.get(&url).send().await.unwrap()).await,
        (200, "warn".into())
    );
    let (code, _) = text(http.put(format!("{url}?level=debug")).send().await.unwrap()).await;
    assert_eq!(code, 200);
    assert_eq!(
        sc.service.uniform_log_level().await.unwrap().as_deref(),
        Some("debug")
    );
    // The edge was not touched.
    assert_eq!(
        sc.edge.uniform_log_level().await.unwrap().as_deref(),
        Some("info")
    );

    for bad in [
        "?level=verbose",
        "?level=warning",
        "?level=",
        "",
        "?level=info&level=debug",
        "?lvl=info",
    ] {
        let r = http.put(format!("{url}{bad}")).send().await.unwrap();
        assert_eq!(r.status(), 400, "{bad}");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"].is_string() && v["code"].is_string(), "{v}");
    }
    assert_eq!(
        sc.service.uniform_log_level().await.unwrap().as_deref(),
        Some("debug")
    );

    // Unknown zone, unknown instance: 404 with the error body, at once.
    for (u, what) in [
        (
            format!(
                "{}/zones/nowhere/clusters/{SERVICE}/instances/catalog-0/logging",
                stack.api()
            ),
            "zone",
        ),
        (instance_url(&stack, "catalog-9"), "instance"),
    ] {
        let r = http.get(&u).send().await.unwrap();
        assert_eq!(r.status(), 404, "{what}");
        let v: Value = r.json().await.unwrap();
        assert!(v["code"].is_string(), "{v}");
    }

    // The whole cluster at once.
    let r = http
        .put(format!(
            "{}/zones/{ZONE}/clusters/{SERVICE}/logging?level=error",
            stack.api()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["succeeded"], 1, "{v:#}");
    assert_eq!(v["instances"][0]["instance"], "catalog-0");
    assert_eq!(v["instances"][0]["level"], "error");
    assert_eq!(
        sc.service.uniform_log_level().await.unwrap().as_deref(),
        Some("error")
    );

    // An agent that is gone: its instance is no longer live, the answer is 404, not a hang.
    let agent = stack_agent(&stack);
    let mut stack = stack;
    stack.service_agent.take().unwrap().stop().await;
    let started = Instant::now();
    let r = stack.http.get(&agent).send().await.unwrap();
    assert!(matches!(r.status().as_u16(), 404 | 503), "{}", r.status());
    assert!(started.elapsed() < Duration::from_secs(6));
    stack.stop().await;
}

fn stack_agent(stack: &Stack) -> String {
    instance_url(stack, "catalog-0")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_agent_costs_only_its_own_deadline() {
    let _turn = SERIAL.lock().await;
    let sc = Scenario::start("healthy").await.unwrap();
    let stack = Stack::start_with(&sc, |c| {
        c.diagnosis.command_timeout = Duration::from_secs(2)
    })
    .await;
    let (stop_hung, hung_task) = hung_agent(&stack, SERVICE, "catalog-hung", "hung-agent");
    let instances = stack.agg.instances.clone();
    wait_for(
        "the hung agent's instance to be live",
        Duration::from_secs(20),
        || {
            let instances = instances.clone();
            async move {
                instances
                    .live_instance(ZONE, SERVICE, "catalog-hung")
                    .map(|_| ())
            }
        },
    )
    .await
    .unwrap();

    // A request to the hung instance waits for its deadline and answers 503 ...
    let http = stack.http.clone();
    let hung_url = instance_url(&stack, "catalog-hung");
    let started = Instant::now();
    let pending = tokio::spawn(async move { text(http.get(hung_url).send().await.unwrap()).await });
    // ... while the other instance and the catalog answer at once.
    for _ in 0..3 {
        let t = Instant::now();
        let (code, body) = text(
            stack
                .http
                .get(instance_url(&stack, "catalog-0"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!((code, body.as_str()), (200, "info"));
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        let t = Instant::now();
        let r = stack
            .http
            .get(format!("{}/zones", stack.api()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(t.elapsed() < Duration::from_secs(1));
    }
    let (code, body) = pending.await.unwrap();
    assert_eq!(code, 503, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["code"], "agent_timeout", "{v}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(5),
        "{waited:?}"
    );

    // The per-cluster PUT runs the instances concurrently, each with its deadline.
    let started = Instant::now();
    let r = stack
        .http
        .put(format!(
            "{}/zones/{ZONE}/clusters/{SERVICE}/logging?level=warn",
            stack.api()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        (v["succeeded"].as_u64(), v["failed"].as_u64()),
        (Some(1), Some(1)),
        "{v:#}"
    );
    let by_name = |n: &str| {
        v["instances"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["instance"] == n)
            .cloned()
            .unwrap_or_else(|| panic!("{n} missing in {v:#}"))
    };
    assert_eq!(by_name("catalog-0")["status"], 200);
    assert_eq!(by_name("catalog-0")["level"], "warn");
    assert_eq!(by_name("catalog-hung")["status"], 503);
    assert_eq!(by_name("catalog-hung")["code"], "agent_timeout");
    assert_eq!(
        sc.service.uniform_log_level().await.unwrap().as_deref(),
        Some("warning")
    );

    // The diagnosis reads what it can and says which instance did not answer.
    let (code, report) = stack
        .diagnose("&symptom=upstream_connect_error&path=/catalog/items")
        .await;
    assert_eq!(code, 200, "{report:#}");
    assert_eq!(verdict(&report, "edge_discovery"), "pass", "{report:#}");

    let _ = stop_hung.send(());
    let _ = tokio::time::timeout(Duration::from_secs(6), hung_task).await;
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_window_returns_tls_lines_and_restores_the_level() {
    let _turn = SERIAL.lock().await;
    let sc = Scenario::start("untrusted_client_cert").await.unwrap();
    let stack = Stack::start(&sc).await;
    let http = &stack.http;
    // Out of bounds: refused, the level untouched.
    for bad in ["?seconds=0", "?seconds=301", "?seconds=x", ""] {
        let r = http
            .post(format!(
                "{}/zones/{ZONE}/clusters/{SERVICE}/debug-window{bad}",
                stack.api()
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }
    assert_eq!(
        sc.service.uniform_log_level().await.unwrap().as_deref(),
        Some("info")
    );

    let url = format!(
        "{}/zones/{ZONE}/clusters/{SERVICE}/debug-window?seconds=2&instance=catalog-0",
        stack.api()
    );
    let client = http.clone();
    let window = tokio::spawn(async move { client.post(url).send().await.unwrap() });
    wait_level(&[&sc.service], "debug").await;
    let (code, _) = sc.request(sc.path()).await.unwrap();
    assert_eq!(code, 503);
    let r = window.await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let w = &v["instances"][0]["debugWindow"];
    assert_eq!(v["instances"][0]["status"], 200, "{v:#}");
    assert_eq!(w["previous_level"], "info", "{v:#}");
    assert_eq!(w["restored"], true);
    assert!(w["tls_line_count"].as_u64().unwrap() >= 1, "{v:#}");
    let lines: Vec<&str> = w["tls_lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("TLS_error") || l.contains("OPENSSL")),
        "{lines:#?}"
    );
    assert_eq!(
        sc.service.uniform_log_level().await.unwrap().as_deref(),
        Some("info")
    );

    // The window belongs to the agent: the asker going away does not leave debug on.
    let url = format!(
        "{}/zones/{ZONE}/clusters/{SERVICE}/debug-window?seconds=1",
        stack.api()
    );
    let short = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    assert!(
        short.post(url).send().await.is_err(),
        "the asker gives up early"
    );
    wait_level(&[&sc.service], "debug").await;
    wait_level(&[&sc.service], "info").await;

    // The agent stopping ends a running window at once and restores before it exits.
    let url = format!(
        "{}/zones/{ZONE}/clusters/{SERVICE}/debug-window?seconds=60",
        stack.api()
    );
    let client = stack.http.clone();
    let window = tokio::spawn(async move { client.post(url).send().await });
    wait_level(&[&sc.service], "debug").await;
    let mut stack = stack;
    let started = Instant::now();
    stack.service_agent.take().unwrap().stop().await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        sc.service.uniform_log_level().await.unwrap().as_deref(),
        Some("info"),
        "restored before the agent exited"
    );
    let answer = window.await.unwrap().unwrap();
    assert_eq!(answer.status(), 200);
    let v: Value = answer.json().await.unwrap();
    let outcome = &v["instances"][0];
    // Either the agent reported the window cut short, or it was gone before answering.
    assert!(
        outcome["debugWindow"]["cut_short"] == true || outcome["status"] == 503,
        "{v:#}"
    );
    stack.stop().await;
}
