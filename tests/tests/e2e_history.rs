//! The history end to end (contract section 15) with real Envoys and agents: a
//! rollout of another route to one of two instances is a restart, a configuration
//! change naming `routes` and a drift that ends when the route is restored;
//! registration edits name their fields; a stopped sidecar leaves and moves the
//! status with its reason; log levels set through the API and a debug window are
//! recorded with who set them; a diagnosis gains the recent changes; filters,
//! limits, bad parameters and the read token; retention; SIGKILL of the aggregator
//! process; and replicas on etcd recording the same entries.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use meshcat_tests::etcd::EtcdCluster;
use meshcat_tests::mesh::now_ms;
use meshcat_tests::replicas::Replicas;
use meshcat_tests::sse::EventStream;
use meshcat_tests::{Bootstrap, Catalog, Envoy, MeshAgent, Sidecar, Upstream, wait_for};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(30);
const BIN: &str = env!("CARGO_BIN_EXE_replica-aggregator");
const TOKEN: &str = "read-h1st0ry";

/// The entries `path` answers (asserting 200), newest first.
async fn history(catalog: &Catalog, path: &str) -> Vec<Value> {
    let (status, body) = catalog.get(path).await.unwrap();
    assert_eq!(status, 200, "{path}: {body}");
    body.as_array().cloned().unwrap_or_default()
}

/// Waits for an entry of `path` that `want` accepts, and returns it.
async fn wait_entry(
    catalog: &Catalog,
    what: &str,
    path: &str,
    want: impl Fn(&Value) -> bool,
) -> Value {
    catalog
        .wait_history_entry(what, path, DEADLINE, want)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

fn kinds(entries: &[Value]) -> Vec<&str> {
    entries.iter().filter_map(|e| e["kind"].as_str()).collect()
}

fn ids(entries: &[Value]) -> Vec<u64> {
    entries.iter().filter_map(|e| e["id"].as_u64()).collect()
}

fn group_names(group: &Value) -> Vec<&str> {
    group["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_to_one_instance_is_a_restart_a_configuration_change_and_drift() {
    const ZONE: &str = "zone-h";
    let catalog = Catalog::start(|_| {}).await.unwrap();
    catalog.register_zone(ZONE, "edge").await.unwrap();
    catalog
        .register_cluster(ZONE, "orders", json!({"owner": "team-o"}))
        .await
        .unwrap();
    let (ua, ub) = (
        Upstream::start().await.unwrap(),
        Upstream::start().await.unwrap(),
    );
    let sidecar = |u: &Upstream, node: &str, prefix: &str| {
        Bootstrap::routed_sidecar(u.addr, "orders", node, prefix)
    };
    let a = Envoy::start(sidecar(&ua, "orders-a", "/")).await.unwrap();
    let mut b = Envoy::start(sidecar(&ub, "orders-b", "/")).await.unwrap();
    let mut events = EventStream::open(
        &format!(
            "{}/events?zoneName={ZONE}&clusterName=orders",
            catalog.api_url()
        ),
        &[],
    )
    .await
    .unwrap();
    let _a = MeshAgent::for_envoy(&catalog, &a, ZONE, "orders", "orders-a", "300ms")
        .await
        .unwrap();
    let _b = MeshAgent::for_envoy(&catalog, &b, ZONE, "orders", "orders-b", "300ms")
        .await
        .unwrap();
    let orders = "/clusters/orders/history?zoneName=zone-h&limit=1000";
    wait_for("both instances joined", DEADLINE, || async {
        let joined = history(&catalog, &format!("{orders}&kind=instance-joined")).await;
        let names: BTreeSet<&str> = joined
            .iter()
            .filter_map(|e| e["instance"].as_str())
            .collect();
        (names.len() == 2).then_some(())
    })
    .await
    .unwrap();
    // Each entry also went out on the stream as it was stored.
    let joined = events
        .until(DEADLINE, |e| {
            e.event == "history" && e.data["kind"] == "instance-joined"
        })
        .await
        .unwrap()
        .expect("the stream stays open");
    assert_eq!(joined.data["clusterName"], "orders", "{:?}", joined.data);
    assert!(joined.data["detail"]["startTime"].as_i64().unwrap() > 0);

    // orders-b is rolled out with another route: the old sidecar stops (its agent
    // reports it unreachable), the new one starts in its place.
    let rollout = now_ms();
    let since = format!("{orders}&since={rollout}");
    b.kill();
    wait_entry(
        &catalog,
        "orders-b stopped",
        &format!("{since}&kind=instance-left&instance=orders-b"),
        |e| e["detail"]["reason"] == "unreachable",
    )
    .await;
    b.restart_with(sidecar(&ub, "orders-b", "/v2"))
        .await
        .unwrap();
    let changed = wait_entry(
        &catalog,
        "orders-b's configuration changed",
        &format!("{since}&kind=config-changed"),
        |_| true,
    )
    .await;
    assert_eq!(changed["instance"], "orders-b", "{changed}");
    assert_eq!(
        changed["detail"]["resources"],
        json!(["routes"]),
        "{changed}"
    );
    assert_ne!(changed["detail"]["from"], changed["detail"]["to"]);
    let restarted = wait_entry(
        &catalog,
        "orders-b restarted",
        &format!("{since}&kind=instance-restarted&instance=orders-b"),
        |_| true,
    )
    .await;
    // Start times come from whole seconds of uptime: a quick restart may even
    // read as a slightly earlier start, but never as the same.
    assert_ne!(
        restarted["detail"]["startTime"], restarted["detail"]["previousStartTime"],
        "{restarted}"
    );
    assert!(restarted["detail"]["startTime"].as_i64().unwrap() > 0);
    let started = wait_entry(
        &catalog,
        "the drift started",
        &format!("{since}&kind=drift-started"),
        |_| true,
    )
    .await;
    let groups = started["detail"]["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{started}");
    let mut names: Vec<Vec<&str>> = groups.iter().map(group_names).collect();
    names.sort();
    assert_eq!(names, [["orders-a"], ["orders-b"]], "{started}");
    assert_eq!(
        groups
            .iter()
            .find(|g| group_names(g) == ["orders-b"])
            .unwrap()["configHash"],
        changed["detail"]["to"]
    );
    let (_, drift) = catalog
        .get("/clusters/orders/drift?zoneName=zone-h")
        .await
        .unwrap();
    assert_eq!(drift["drifted"], true, "{drift}");
    assert_eq!(drift["differs"], json!(["routes"]), "{drift}");
    events
        .until(DEADLINE, |e| {
            e.event == "history" && e.data["kind"] == "drift-started"
        })
        .await
        .unwrap()
        .expect("the stream stays open");

    // Restored: the drift ends (as the drifted sidecar stops) and orders-b runs the
    // first configuration again.
    let restore = now_ms();
    let since = format!("{orders}&since={restore}");
    b.kill();
    wait_entry(
        &catalog,
        "the drift ended",
        &format!("{since}&kind=drift-ended"),
        |_| true,
    )
    .await;
    b.restart_with(sidecar(&ub, "orders-b", "/")).await.unwrap();
    wait_entry(
        &catalog,
        "orders-b back on the first configuration",
        &format!("{since}&kind=config-changed"),
        |e| e["detail"]["to"] == changed["detail"]["from"],
    )
    .await;
    wait_for("one group again", DEADLINE, || async {
        let (_, d) = catalog
            .get("/clusters/orders/drift?zoneName=zone-h")
            .await
            .ok()?;
        (d["drifted"] == false && group_names(&d["groups"][0]) == ["orders-a", "orders-b"])
            .then_some(())
    })
    .await
    .unwrap();
    // Newest first, ids growing with time.
    let all = history(&catalog, orders).await;
    let all_ids = ids(&all);
    assert!(all_ids.windows(2).all(|w| w[0] > w[1]), "{all_ids:?}");
    let times: Vec<i64> = all.iter().filter_map(|e| e["atMs"].as_i64()).collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_stopped_sidecars_and_log_levels_are_recorded_with_their_reasons() {
    const ZONE: &str = "zone-p";
    let catalog = Catalog::start(|_| {}).await.unwrap();
    catalog.register_zone(ZONE, "edge").await.unwrap();
    let record = json!({"owner": "team-p", "minInstances": 2});
    catalog
        .register_cluster(ZONE, "pay", record.clone())
        .await
        .unwrap();
    let (mut s1, mut s2) = (
        Sidecar::start().await.unwrap(),
        Sidecar::start().await.unwrap(),
    );
    let _a1 = MeshAgent::for_sidecar(&catalog, &s1, ZONE, "pay", "pay-1", "300ms")
        .await
        .unwrap();
    let _a2 = MeshAgent::for_sidecar(&catalog, &s2, ZONE, "pay", "pay-2", "300ms")
        .await
        .unwrap();
    catalog
        .wait_cluster("pay stable", ZONE, "pay", DEADLINE, |c| {
            c["status"] == "stable"
        })
        .await
        .unwrap();
    let pay = "/clusters/pay/history?zoneName=zone-p";
    let http = reqwest::Client::new();
    let send =
        |method: Method, path: &str| http.request(method, format!("{}{path}", catalog.api_url()));

    // A registration edit names the fields it changed.
    let mut edited = record.clone();
    edited["owner"] = json!("team-q");
    edited["version"] = json!("2");
    edited["zoneName"] = json!(ZONE);
    edited["clusterName"] = json!("pay");
    edited["name"] = json!("pay");
    let r = send(Method::PUT, "/clusters/pay?zoneName=zone-p")
        .json(&edited)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let updated = wait_entry(
        &catalog,
        "the edit",
        &format!("{pay}&kind=cluster-updated"),
        |_| true,
    )
    .await;
    assert_eq!(updated["detail"], json!({"changed": ["owner", "version"]}));

    // A stopped sidecar leaves, and the status says why it moved.
    let stopped = now_ms();
    s2.envoy.kill();
    let left = wait_entry(
        &catalog,
        "pay-2 left",
        &format!("{pay}&kind=instance-left&since={stopped}"),
        |_| true,
    )
    .await;
    assert_eq!(left["instance"], "pay-2");
    assert_eq!(left["detail"], json!({"reason": "unreachable"}));
    let status = wait_entry(
        &catalog,
        "the status moved",
        &format!("{pay}&kind=status-changed&since={stopped}"),
        |_| true,
    )
    .await;
    assert_eq!(
        status["detail"],
        json!({"from": "stable", "to": "warning", "reason": "1 live instance, below minInstances 2"})
    );
    assert!(status["id"].as_u64() > left["id"].as_u64());

    // Levels set through the API, then a debug window, each with who set it.
    let level = "/zones/zone-p/clusters/pay/instances/pay-1/logging";
    for (set, expect) in [("debug", "debug"), ("info", "info")] {
        let r = send(Method::PUT, &format!("{level}?level={set}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.text().await.unwrap(), expect);
    }
    let r = send(
        Method::POST,
        "/zones/zone-p/clusters/pay/debug-window?seconds=1&instance=pay-1",
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let levels = wait_for("four level changes", DEADLINE, || async {
        let mut e = history(&catalog, &format!("{pay}&kind=log-level-changed")).await;
        e.reverse();
        (e.len() == 4).then_some(e)
    })
    .await
    .unwrap();
    let seen: Vec<(&str, &str, &str)> = levels
        .iter()
        .map(|e| {
            let d = &e["detail"];
            (
                d["from"].as_str().unwrap(),
                d["to"].as_str().unwrap(),
                d["by"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("info", "debug", "api"),
            ("debug", "info", "api"),
            ("info", "debug", "debug-window"),
            ("debug", "info", "debug-window"),
        ]
    );
    assert!(levels.iter().all(|e| e["instance"] == "pay-1"));
    let window = history(&catalog, &format!("{pay}&kind=debug-window")).await;
    assert_eq!(window.len(), 1);
    assert_eq!(window[0]["detail"], json!({"seconds": 1}));
    assert!(window[0]["id"].as_u64() < levels[2]["id"].as_u64());

    // A diagnosis carries the cluster's recent changes, newest first, and is
    // recorded itself.
    let (status, report) = catalog
        .get("/diagnose/pay?zoneName=zone-p&lookback=10m")
        .await
        .unwrap();
    assert_eq!(status, 200, "{report}");
    let recent = report["recentChanges"].as_array().unwrap();
    let recent_kinds = kinds(recent);
    for k in [
        "cluster-updated",
        "instance-left",
        "status-changed",
        "log-level-changed",
    ] {
        assert!(recent_kinds.contains(&k), "{k} in {recent_kinds:?}");
    }
    assert!(ids(recent).windows(2).all(|w| w[0] > w[1]));
    let diagnosed = wait_entry(
        &catalog,
        "the diagnosis recorded",
        &format!("{pay}&kind=diagnosed"),
        |_| true,
    )
    .await;
    // The entry names the cluster; the owner's text stays with the registration.
    let conclusion = diagnosed["detail"]["conclusion"].as_str().unwrap();
    assert!(conclusion.starts_with("pay"), "{diagnosed}");
    assert!(!diagnosed.to_string().contains("team-q"), "{diagnosed}");
    assert!(
        diagnosed["detail"].get("rootCause").is_some(),
        "{diagnosed}"
    );
    // A lookback that reaches only the last second holds none of the above.
    let (_, report) = catalog
        .get("/diagnose/pay?zoneName=zone-p&lookback=1s")
        .await
        .unwrap();
    let now_recent = kinds(report["recentChanges"].as_array().unwrap()).len();
    assert!(now_recent < recent.len(), "{report}");
    for bad in ["lookback=0s", "lookback=25h", "lookback=soon"] {
        let (status, body) = catalog
            .get(&format!("/diagnose/pay?zoneName=zone-p&{bad}"))
            .await
            .unwrap();
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains("lookback"),
            "{body}"
        );
    }
    s1.envoy.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_limits_bad_parameters_and_the_read_token() {
    // Without connections to the zones' (made-up) control servers: their state
    // changes would be entries too, at a time of their own.
    let catalog = Catalog::start(|c| {
        c.tokens.read = Some(TOKEN.into());
        c.control.enabled = false;
    })
    .await
    .unwrap();
    let catalog = &catalog;
    let get = |path: String| async move { catalog.get_as(&path, Some(TOKEN)).await.unwrap() };
    let mut authorized = EventStream::open(
        &format!("{}/events", catalog.api_url()),
        &[("authorization", &format!("Bearer {TOKEN}"))],
    )
    .await
    .unwrap();
    let mut anonymous = EventStream::open(&format!("{}/events", catalog.api_url()), &[])
        .await
        .unwrap();
    catalog.register_zone("z1", "edge").await.unwrap();
    catalog.register_zone("z2", "edge").await.unwrap();
    for c in ["c1", "c2", "c3", "c4"] {
        catalog.register_cluster("z1", c, json!({})).await.unwrap();
    }
    catalog
        .register_cluster("z2", "c1", json!({}))
        .await
        .unwrap();
    let all = wait_for("seven entries", DEADLINE, || async {
        let (_, body) = get("/history".into()).await;
        (body.as_array()?.len() == 7).then(|| body.as_array().unwrap().clone())
    })
    .await
    .unwrap();
    assert_eq!(
        kinds(&all),
        [
            "cluster-registered",
            "cluster-registered",
            "cluster-registered",
            "cluster-registered",
            "cluster-registered",
            "zone-registered",
            "zone-registered"
        ]
    );
    assert_eq!(all[6]["zoneName"], "z1");
    assert_eq!(all[6]["clusterName"], "");
    assert_eq!(all[6]["instance"], "");
    assert_eq!(all[6]["detail"], json!({}));
    let at = |i: usize| all[i]["atMs"].as_i64().unwrap();

    // The read token comes first, whatever else is wrong.
    for path in [
        "/history",
        "/history?limit=0",
        "/clusters/c1/history?nope=1",
    ] {
        for token in [None, Some("wrong")] {
            let (status, body) = catalog.get_as(path, token).await.unwrap();
            assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        }
    }

    // Filters.
    let (_, three) = get("/history?limit=3".into()).await;
    assert_eq!(ids(three.as_array().unwrap()), ids(&all[..3]));
    let (_, z2) = get("/history?zoneName=z2".into()).await;
    assert_eq!(
        kinds(z2.as_array().unwrap()),
        ["cluster-registered", "zone-registered"]
    );
    let (_, c1) = get("/history?clusterName=c1".into()).await;
    let zones: Vec<&str> = c1
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["zoneName"].as_str())
        .collect();
    assert_eq!(zones, ["z2", "z1"]);
    let (_, c1z1) = get("/clusters/c1/history?zoneName=z1".into()).await;
    assert_eq!(c1z1.as_array().unwrap().len(), 1);
    assert_eq!(c1z1[0]["zoneName"], "z1");
    let (_, zones) = get("/history?kind=zone-registered&kind=zone-deleted".into()).await;
    assert_eq!(zones.as_array().unwrap().len(), 2);
    // since inclusive, until exclusive: an entry's own time.
    let (_, from) = get(format!("/history?since={}", at(2))).await;
    assert!(ids(from.as_array().unwrap()).contains(&all[2]["id"].as_u64().unwrap()));
    assert!(
        from.as_array()
            .unwrap()
            .iter()
            .all(|e| e["atMs"].as_i64() >= Some(at(2)))
    );
    let (_, before) = get(format!("/history?until={}", at(2))).await;
    assert!(
        before
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["atMs"].as_i64() < Some(at(2)))
    );
    let (_, none) = get(format!("/history?since={}&until={}", at(0) + 1, at(0) + 1)).await;
    assert_eq!(none, json!([]));
    let (_, nobody) = get("/clusters/nobody/history".into()).await;
    assert_eq!(nobody, json!([]));

    // Bad parameters answer 400 naming them.
    for (path, named) in [
        ("/history?limit=0", "limit"),
        ("/history?limit=1001", "limit"),
        ("/history?kind=cluster", "kind"),
        ("/history?since=-5", "since"),
        ("/history?until=yesterday", "until"),
        ("/history?zoneName=a%20b", "zoneName"),
        ("/history?instance=a%2Fb", "instance"),
        ("/history?limit=1&limit=2", "limit"),
        ("/history?colour=red", "colour"),
        ("/clusters/c1/history?clusterName=c2", "clusterName"),
        ("/clusters/bad%20name/history", "clusterName"),
    ] {
        let (status, body) = get(path.into()).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body["code"].is_string(), "{path}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains(named),
            "{path}: {body}"
        );
    }

    // History events reach only callers holding the read token: the anonymous
    // stream, read past a change made after the last entry was streamed to the
    // other, holds none.
    authorized
        .until(DEADLINE, |e| {
            e.event == "history"
                && e.data["kind"] == "cluster-registered"
                && e.data["zoneName"] == "z2"
        })
        .await
        .unwrap()
        .expect("the stream stays open");
    catalog
        .register_cluster("z2", "c9", json!({}))
        .await
        .unwrap();
    anonymous
        .until(DEADLINE, |e| e.is_cluster("c9"))
        .await
        .unwrap()
        .expect("the stream stays open");
    assert!(
        anonymous.seen.iter().all(|e| e.event != "history"),
        "{:?}",
        anonymous.seen
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_drops_the_oldest_first() {
    // Without a connection to the zone's (made-up) control server: its state
    // changes would be entries too, at a time of their own.
    let mut catalog = Catalog::start(|c| {
        c.history.max_entries = 5;
        c.control.enabled = false;
    })
    .await
    .unwrap();
    catalog.register_zone("z", "edge").await.unwrap();
    for i in 0..8 {
        catalog
            .register_cluster("z", &format!("c{i}"), json!({}))
            .await
            .unwrap();
    }
    let kept = wait_for("five entries kept", DEADLINE, || async {
        let e = history(&catalog, "/history?limit=100").await;
        (e.len() == 5 && e[0]["clusterName"] == "c7").then_some(e)
    })
    .await
    .unwrap();
    let names: Vec<&str> = kept
        .iter()
        .filter_map(|e| e["clusterName"].as_str())
        .collect();
    assert_eq!(names, ["c7", "c6", "c5", "c4", "c3"]);
    assert_eq!(ids(&kept), [9, 8, 7, 6, 5]);

    // By age: entries older than the retention go as newer ones are stored (the
    // count no longer bounds them).
    catalog.stop().await.unwrap();
    catalog.config.history.retention = Duration::from_secs(2);
    catalog.config.history.max_entries = 1000;
    catalog.resume().await.unwrap();
    let mut n = 0;
    wait_for("entries older than 2 s dropped", DEADLINE, || {
        n += 1;
        let name = format!("d{n}");
        let catalog = &catalog;
        async move {
            catalog.register_cluster("z", &name, json!({})).await.ok()?;
            let e = history(catalog, "/history?limit=100").await;
            let names: Vec<&str> = e.iter().filter_map(|e| e["clusterName"].as_str()).collect();
            // The newest entries stay (this one may not be stored yet).
            (!names.iter().any(|n| n.starts_with('c')) && names.iter().any(|n| n.starts_with('d')))
                .then_some(())
        }
    })
    .await
    .unwrap();
    // Ids kept growing across the restart.
    let newest = history(&catalog, "/history?limit=1").await;
    assert!(newest[0]["id"].as_u64().unwrap() > 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_aggregator_loses_no_entry_older_than_a_second() {
    let mut set = Replicas::start(BIN, 1, "redb", &[]).await.unwrap();
    let (status, body) = set
        .post(
            0,
            "/zones",
            &json!({"zoneName": "z", "serverAddress": "cp.local:50000"}),
        )
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    // Registrations for 2.5 s, each with the moment it was acknowledged.
    // At most 900, so one answer of 1,000 holds them all; past them the process is
    // kept busy with reads until the kill.
    let mut acked: Vec<(String, Instant)> = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2500) {
        if acked.len() == 900 {
            set.readyz(0).await;
            continue;
        }
        let name = format!("c{}", acked.len());
        let (status, body) = set
            .post(
                0,
                "/clusters",
                &json!({"zoneName": "z", "clusterName": name, "name": name}),
            )
            .await
            .unwrap();
        assert_eq!(status, 201, "{body}");
        acked.push((name, Instant::now()));
    }
    set.replicas[0].kill();
    let killed = Instant::now();
    set.restart(0).unwrap();
    set.wait_ready(0).await.unwrap();
    let (status, body) = set
        .get(0, "/history?kind=cluster-registered&limit=1000")
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let stored: BTreeSet<&str> = body
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["clusterName"].as_str())
        .collect();
    let due: Vec<&str> = acked
        .iter()
        .filter(|(_, at)| killed.duration_since(*at) > Duration::from_secs(1))
        .map(|(n, _)| n.as_str())
        .collect();
    assert!(due.len() > 10, "only {} registrations", due.len());
    let lost: Vec<&&str> = due.iter().filter(|n| !stored.contains(**n)).collect();
    assert!(lost.is_empty(), "lost {lost:?} of {}", due.len());
    // Ids go on from the stored ones.
    let newest = body[0]["id"].as_u64().unwrap();
    let (status, _) = set
        .post(
            0,
            "/clusters",
            &json!({"zoneName": "z", "clusterName": "after", "name": "after"}),
        )
        .await
        .unwrap();
    assert_eq!(status, 201);
    let after = wait_for("the entry after the restart", DEADLINE, || async {
        let (_, b) = set.get(0, "/history?clusterName=after").await.ok()?;
        b[0]["id"].as_u64()
    })
    .await
    .unwrap();
    assert!(after > newest, "{after} after {newest}");
}

/// Replica `i`'s history of z/svc, oldest first.
async fn oldest_first(set: &Replicas, i: usize) -> Option<Vec<Value>> {
    let (_, b) = set.get(i, "/clusters/svc/history?zoneName=z").await.ok()?;
    let mut e = b.as_array()?.clone();
    e.reverse();
    Some(e)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_records_the_same_registrations_statuses_and_instances() {
    let etcd = EtcdCluster::start().await.unwrap();
    let store = etcd.store_url("/history");
    let mut set = Replicas::start(BIN, 2, &store, &[]).await.unwrap();
    let (s, b) = set
        .post(
            0,
            "/zones",
            &json!({"zoneName": "z", "serverAddress": "cp.local:50000"}),
        )
        .await
        .unwrap();
    assert_eq!(s, 201, "{b}");
    let svc = json!({"zoneName": "z", "clusterName": "svc", "name": "svc", "owner": "a"});
    let (s, b) = set.post(1, "/clusters", &svc).await.unwrap();
    assert_eq!(s, 201, "{b}");
    let mut edited = svc.clone();
    edited["owner"] = json!("b");
    let (s, b) = set
        .send(0, Method::PUT, "/clusters/svc?zoneName=z", Some(&edited))
        .await
        .unwrap();
    assert_eq!(s, 200, "{b}");
    // An instance reporting to replica 0, then leaving.
    let sidecar = Sidecar::start().await.unwrap();
    let mut args = set.agent_args(&[0]);
    args.extend(
        [
            "--sidecar-admin",
            &sidecar.envoy.admin_addr(),
            "--zone",
            "z",
            "--cluster",
            "svc",
            "--instance",
            "i1",
            "--interval",
            "300ms",
        ]
        .map(str::to_owned),
    );
    let agent = MeshAgent::start(&args).await.unwrap();
    let svc_history = "/clusters/svc/history?zoneName=z";
    let expected = [
        "cluster-registered",
        "cluster-updated",
        "instance-joined",
        "status-changed",
        "instance-left",
        "status-changed",
    ];
    for i in 0..2 {
        wait_for(&format!("i1 joined on replica {i}"), DEADLINE, || async {
            let e = oldest_first(&set, i).await?;
            (kinds(&e) == expected[..4]).then_some(())
        })
        .await
        .unwrap();
    }
    agent.stop().await.unwrap();
    for i in 0..2 {
        let e = wait_for(&format!("i1 left on replica {i}"), DEADLINE, || async {
            let e = oldest_first(&set, i).await?;
            (kinds(&e) == expected).then_some(e)
        })
        .await
        .unwrap();
        assert_eq!(e[1]["detail"], json!({"changed": ["owner"]}), "replica {i}");
        assert_eq!(e[2]["instance"], "i1");
        assert_eq!(e[3]["detail"]["to"], "stable", "replica {i}");
        assert_eq!(
            e[4]["detail"],
            json!({"reason": "disconnected"}),
            "replica {i}"
        );
        assert_eq!(e[5]["detail"]["to"], "down", "replica {i}");
    }
    let (_, on0) = set.get(0, svc_history).await.unwrap();
    // A restarted replica keeps its history.
    set.replicas[1].kill();
    set.restart(1).unwrap();
    set.wait_ready(1).await.unwrap();
    let kept = oldest_first(&set, 1).await.unwrap();
    assert_eq!(kinds(&kept), expected);
    // Reasons read the same on both replicas.
    let (_, on1) = set.get(1, svc_history).await.unwrap();
    let reasons = |v: &Value| -> Vec<Value> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| e["detail"].clone())
            .collect()
    };
    assert_eq!(reasons(&on0), reasons(&on1));
    // A new, empty replica shows what happens from its start only.
    let i = set.add(&store, &[]).unwrap();
    set.wait_ready(i).await.unwrap();
    let (s, fresh) = set.get(i, svc_history).await.unwrap();
    assert_eq!(s, 200);
    assert_eq!(
        fresh,
        json!([]),
        "a new replica starts with an empty history"
    );
    let (s, b) = set
        .send(i, Method::DELETE, "/clusters/svc?zoneName=z", None)
        .await
        .unwrap();
    assert!(s.is_success(), "{b}");
    for r in [0, 1, i] {
        wait_for(
            &format!("the deletion on replica {r}"),
            DEADLINE,
            || async {
                let (_, b) = set
                    .get(r, &format!("{svc_history}&kind=cluster-deleted"))
                    .await
                    .ok()?;
                (b.as_array()?.len() == 1).then_some(())
            },
        )
        .await
        .unwrap();
    }
}

/// What only the history shows (here: diagnoses, which any reader may run) moves
/// no catalog index: a blocking `GET /summary` from the index after a diagnosis
/// waits its whole wait and answers the same index. A `diagnosed` entry holds no
/// owner text, and past `--history-max-diagnoses` a minute diagnoses still answer
/// but are only counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diagnoses_move_no_index_hold_no_owner_text_and_are_bounded() {
    let catalog = Catalog::start(|c| c.history.max_diagnoses = 2)
        .await
        .unwrap();
    catalog.register_zone("zone-q", "edge").await.unwrap();
    catalog
        .register_cluster(
            "zone-q",
            "quiet",
            json!({"owner": "team-secret", "ownerURL": "https://teams.example/secret"}),
        )
        .await
        .unwrap();
    let quiet = "/clusters/quiet/history?zoneName=zone-q";
    wait_entry(&catalog, "the registration recorded", quiet, |e| {
        e["kind"] == "cluster-registered"
    })
    .await;
    let http = reqwest::Client::new();
    let summary = |query: String| {
        let http = http.clone();
        let url = format!("{}/summary{query}", catalog.api_url());
        async move {
            let r = http.get(url).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.headers()["x-meshcat-index"]
                .to_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        }
    };
    let index = summary(String::new()).await;
    let (status, report) = catalog
        .get("/diagnose/quiet?zoneName=zone-q")
        .await
        .unwrap();
    assert_eq!(status, 200, "{report}");
    let diagnosed = wait_entry(
        &catalog,
        "the diagnosis recorded",
        &format!("{quiet}&kind=diagnosed"),
        |_| true,
    )
    .await;
    assert!(
        !diagnosed.to_string().contains("team-secret"),
        "{diagnosed}"
    );
    assert!(
        !diagnosed.to_string().contains("teams.example"),
        "{diagnosed}"
    );
    let started = Instant::now();
    let after = summary(format!("?index={index}&wait=2s")).await;
    assert_eq!(after, index, "the diagnosis moved the catalog index");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "answered early"
    );

    // Three more: one recorded, two only counted; all answer.
    for _ in 0..3 {
        let (status, _) = catalog
            .get("/diagnose/quiet?zoneName=zone-q")
            .await
            .unwrap();
        assert_eq!(status, 200);
    }
    wait_entry(
        &catalog,
        "the second diagnosis recorded",
        &format!("{quiet}&kind=diagnosed"),
        |e| e["id"].as_u64() > diagnosed["id"].as_u64(),
    )
    .await;
    let metrics = catalog.ops_metrics().await.unwrap();
    let unrecorded = meshcat_tests::mesh::metric_sum(
        &metrics,
        "meshcat_history_unrecorded_total",
        &[("reason", "diagnoses")],
    );
    assert_eq!(unrecorded, Some(2.0), "{metrics}");
    let all = history(&catalog, &format!("{quiet}&kind=diagnosed")).await;
    assert_eq!(all.len(), 2, "{all:?}");
}
