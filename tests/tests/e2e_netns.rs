//! Sidecars whose admin stays on their pod's loopback (contract section 18), end to
//! end: real Envoys in network namespaces of their own (`unshare --net`), a real
//! aggregator and the agent reaching each admin from inside its namespace.
//!
//! Each isolated Envoy's admin port is one that a decoy listener holds on the root
//! namespace's loopback, so the same `127.0.0.1:<port>` names two servers: the decoy
//! from outside, Envoy only from inside. Anything the agent learns from Envoy came
//! through the namespace.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use meshcat_tests::mesh::{instance_names, metric_sum, pods_flags};
use meshcat_tests::netns::{PodCgroup, http_in};
use meshcat_tests::{Bootstrap, Catalog, Envoy, MeshAgent, wait_for};
use serde_json::{Value, json};
use tokio::net::TcpListener;

const DEADLINE: Duration = Duration::from_secs(20);

/// A listener on the root namespace's loopback that accepts and closes every
/// connection: it holds the port an isolated Envoy's admin uses inside its namespace.
async fn decoy() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((conn, _)) = l.accept().await {
            drop(conn);
        }
    });
    (addr, task)
}

/// A sidecar in a namespace of its own, its admin on `127.0.0.1:<admin_port>` there.
async fn isolated_envoy(admin_port: u16) -> Envoy {
    let mut b = Bootstrap::service_sidecar(SocketAddr::from(([127, 0, 0, 1], 9)), None);
    b.admin_port = admin_port;
    Envoy::start_isolated(b).await.unwrap()
}

async fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap()
}

async fn registered(zone: &str, cluster: &str) -> Catalog {
    let catalog = Catalog::start(|_| {}).await.unwrap();
    catalog.register_zone(zone, cluster).await.unwrap();
    catalog
        .register_cluster(zone, cluster, json!({}))
        .await
        .unwrap();
    catalog
}

fn agent_flags(catalog: &Catalog, extra: &[&str]) -> Vec<String> {
    let mut args = catalog.agent_args();
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args.extend(["--interval", "200ms", "--scrape-timeout", "1s"].map(str::to_owned));
    args
}

async fn level_in(envoy: &Envoy) -> Option<String> {
    envoy.uniform_log_level().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_on_its_pods_loopback_is_reached_through_its_namespace() {
    let (decoy_addr, _decoy) = decoy().await;
    let envoy = isolated_envoy(decoy_addr.port()).await;
    let ns = envoy.netns_path().unwrap();
    let admin = envoy.admin_addr();
    assert_eq!(admin, decoy_addr.to_string());
    // From outside, the address is the decoy's; inside, it is Envoy's.
    assert!(
        reqwest::get(format!("http://{admin}/server_info"))
            .await
            .is_err(),
        "the root namespace reached an admin API at {admin}"
    );
    let info: Value =
        serde_json::from_str(&http_in(&ns, &admin, false, "/server_info").await.unwrap()).unwrap();
    assert_eq!(info["state"], "LIVE");

    let catalog = registered("mesh-a", "orders").await;
    // Without the namespace the agent meets the decoy: no instance.
    let blind = MeshAgent::start(&agent_flags(
        &catalog,
        &[
            "--sidecar-admin",
            &admin,
            "--zone",
            "mesh-a",
            "--cluster",
            "orders",
            "--instance",
            "blind-1",
        ],
    ))
    .await
    .unwrap();
    let agent = MeshAgent::start(&agent_flags(
        &catalog,
        &[
            "--sidecar-admin",
            &admin,
            "--sidecar-netns",
            ns.to_str().unwrap(),
            "--sidecar-log-file",
            envoy.log_path().to_str().unwrap(),
            "--zone",
            "mesh-a",
            "--cluster",
            "orders",
            "--instance",
            "orders-1",
        ],
    ))
    .await
    .unwrap();

    // The instance, its start time and its metrics object come from inside.
    let c = catalog
        .wait_cluster("orders-1 live", "mesh-a", "orders", DEADLINE, |c| {
            instance_names(c) == ["orders-1"]
        })
        .await
        .unwrap();
    let uptime_s = info["uptime_current_epoch"]
        .as_str()
        .and_then(|s| s.trim_end_matches('s').parse::<f64>().ok())
        .unwrap();
    let started = meshcat_tests::mesh::now_ms() - (uptime_s * 1000.0) as i64;
    let reported = c["instances"][0]["startTime"].as_i64().unwrap();
    assert!(
        (reported - started).abs() < 5_000,
        "{reported} vs {started}"
    );
    let (code, m) = catalog
        .get("/metrics/orders/orders-1?zoneName=mesh-a")
        .await
        .unwrap();
    assert_eq!(code, 200, "{m}");
    assert!(m["process/memory/used"].as_f64().unwrap() > 0.0, "{m}");
    assert_eq!(m["system/start_time"].as_i64(), Some(reported), "{m}");

    // The log level, both ways, read back inside the namespace.
    let http = http().await;
    let url = format!(
        "{}/zones/mesh-a/clusters/orders/instances/orders-1/logging",
        catalog.api_url()
    );
    assert_eq!(level_in(&envoy).await.as_deref(), Some("info"));
    for (set, envoy_name) in [("debug", "debug"), ("warn", "warning")] {
        let r = http.put(format!("{url}?level={set}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        assert_eq!(level_in(&envoy).await.as_deref(), Some(envoy_name));
        let got = http.get(&url).send().await.unwrap().text().await.unwrap();
        assert_eq!(got, set);
    }

    // The diagnosis reads its evidence inside, and its debug window sets and
    // restores the level there.
    let diagnose = format!(
        "{}/diagnose/orders?zoneName=mesh-a&debugSeconds=1",
        catalog.api_url()
    );
    let call = tokio::spawn({
        let http = http.clone();
        async move {
            let r = http.get(diagnose).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    });
    wait_for(
        "the debug window inside the namespace",
        DEADLINE,
        || async { (level_in(&envoy).await.as_deref() == Some("debug")).then_some(()) },
    )
    .await
    .unwrap();
    let (code, report) = call.await.unwrap();
    assert_eq!(code, 200, "{report}");
    let evidence = report["steps"].to_string();
    assert!(
        evidence.contains("local_service"),
        "no evidence from the sidecar's /clusters: {report}"
    );
    assert_eq!(level_in(&envoy).await.as_deref(), Some("warning"));

    // The blind agent never reached Envoy; the other entered its namespace cleanly.
    assert!(
        !instance_names(&catalog.cluster("mesh-a", "orders").await.unwrap())
            .contains(&"blind-1".to_owned())
    );
    let text = agent.metrics().await.unwrap();
    assert!(
        metric_sum(&text, "meshcat_agent_scrapes_total", &[("outcome", "ok")]).unwrap() >= 1.0,
        "{text}"
    );
    assert_eq!(
        metric_sum(&text, "meshcat_agent_netns_errors_total", &[]).unwrap_or(0.0),
        0.0,
        "{text}"
    );
    blind.stop().await.unwrap();
    agent.stop().await.unwrap();
}

/// The `GET /logging` error of the agent's ops port for `instance`.
async fn ops_error(agent: &MeshAgent, instance: &str) -> Value {
    let r = reqwest::get(format!("{}/logging?instance={instance}", agent.ops_url()))
        .await
        .unwrap();
    assert_eq!(r.status(), 502, "{instance}");
    r.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_or_false_namespace_fails_its_target_alone() {
    let (decoy_addr, _decoy) = decoy().await;
    let mut gone = isolated_envoy(decoy_addr.port()).await;
    let kept = isolated_envoy(decoy_addr.port()).await;
    let not_ns = tempfile::NamedTempFile::new().unwrap();
    let catalog = registered("mesh-b", "orders").await;
    let dir = tempfile::tempdir().unwrap();
    let targets = dir.path().join("targets.json");
    let target = |instance: &str, netns: &Path| {
        json!({"admin": decoy_addr.to_string(), "zoneName": "mesh-b", "clusterName": "orders",
               "instance": instance, "netns": netns})
    };
    std::fs::write(
        &targets,
        json!([
            target("gone-1", &gone.netns_path().unwrap()),
            target("kept-1", &kept.netns_path().unwrap()),
            target("file-1", not_ns.path()),
        ])
        .to_string(),
    )
    .unwrap();
    let agent = MeshAgent::start(&agent_flags(
        &catalog,
        &["--targets-file", targets.to_str().unwrap()],
    ))
    .await
    .unwrap();
    catalog
        .wait_cluster(
            "both namespaces reached",
            "mesh-b",
            "orders",
            DEADLINE,
            |c| instance_names(c) == ["gone-1", "kept-1"],
        )
        .await
        .unwrap();
    let e = ops_error(&agent, "file-1").await;
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("is not a network namespace"),
        "{e}"
    );

    // The pod dies: its namespace goes with it; the other sidecar is still reported.
    gone.kill();
    catalog
        .wait_cluster("gone-1 left", "mesh-b", "orders", DEADLINE, |c| {
            instance_names(c) == ["kept-1"]
        })
        .await
        .unwrap();
    let e = ops_error(&agent, "gone-1").await;
    assert!(e["error"].as_str().unwrap().contains("is gone"), "{e}");
    let text = wait_for("both reasons counted", DEADLINE, || async {
        let text = agent.metrics().await.ok()?;
        let count = |target, reason| {
            metric_sum(
                &text,
                "meshcat_agent_netns_errors_total",
                &[("target", target), ("reason", reason)],
            )
            .unwrap_or(0.0)
        };
        (count("gone-1", "gone") >= 1.0 && count("file-1", "not_netns") >= 1.0).then_some(text)
    })
    .await
    .unwrap();
    assert_eq!(
        metric_sum(
            &text,
            "meshcat_agent_netns_errors_total",
            &[("target", "kept-1")]
        )
        .unwrap_or(0.0),
        0.0,
        "{text}"
    );
    // Still reachable, still reported.
    let r = reqwest::get(format!("{}/logging?instance=kept-1", agent.ops_url()))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "info");
    agent.stop().await.unwrap();
}

/// A pod of the node, as `kubectl get pods -o json` lists it: Istio's sidecar, its
/// admin on the pod's loopback at Istio's port, no port annotation.
fn istio_pod(uid: &str) -> Value {
    json!({
        "metadata": {"name": "reviews-1", "namespace": "bookinfo", "uid": uid,
                     "labels": {"meshcat.io/scrape": "true"},
                     "annotations": {"meshcat.io/cluster": "reviews",
                                     "meshcat.io/mesh": "istio"}},
        "spec": {"containers": [{"name": "reviews"}, {"name": "istio-proxy"}]},
        "status": {"phase": "Running"}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_discovery_finds_each_pods_namespace_by_its_uid() {
    let uid = "6b1f0c3e-2d4a-4c5b-9e8f-7a6b5c4d3e2f";
    let mut envoy = isolated_envoy(15000).await;
    let mut cgroup = PodCgroup::place(envoy.pid().unwrap(), uid).unwrap();
    let catalog = registered("bookinfo", "reviews").await;
    let dir = tempfile::tempdir().unwrap();
    let mut flags = pods_flags(dir.path(), vec![istio_pod(uid)]).unwrap();
    flags.push("--pod-netns".into());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let agent = MeshAgent::start(&agent_flags(&catalog, &flags))
        .await
        .unwrap();
    catalog
        .wait_cluster("reviews-1 live", "bookinfo", "reviews", DEADLINE, |c| {
            instance_names(c) == ["reviews-1"]
        })
        .await
        .unwrap();

    // A command reaches it inside its namespace.
    let url = format!(
        "{}/zones/bookinfo/clusters/reviews/instances/reviews-1/logging",
        catalog.api_url()
    );
    let r = http()
        .await
        .put(format!("{url}?level=debug"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(level_in(&envoy).await.as_deref(), Some("debug"));

    // The pod's sidecar dies with its namespace while the pod is still listed: the
    // agent keeps the namespace it knew, finds it gone and reports the sidecar
    // unreachable at once (no wait for the instance's TTL).
    drop(cgroup);
    envoy.kill();
    catalog
        .wait_cluster("reviews-1 gone", "bookinfo", "reviews", DEADLINE, |c| {
            instance_names(c).is_empty()
        })
        .await
        .unwrap();
    wait_for("the gone namespace counted", DEADLINE, || async {
        let text = agent.metrics().await.ok()?;
        let gone = metric_sum(
            &text,
            "meshcat_agent_netns_errors_total",
            &[("target", "reviews-1"), ("reason", "gone")],
        )?;
        (gone >= 1.0).then_some(())
    })
    .await
    .unwrap();
    // It restarts (a new process in a new namespace): found again by the pod's UID,
    // without the pods file changing. The new process runs at its default level, so
    // what answers is the new sidecar.
    envoy.restart().await.unwrap();
    cgroup = PodCgroup::place(envoy.pid().unwrap(), uid).unwrap();
    catalog
        .wait_cluster("reviews-1 back", "bookinfo", "reviews", DEADLINE, |c| {
            instance_names(c) == ["reviews-1"]
        })
        .await
        .unwrap();
    let r = http().await.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "info");
    agent.stop().await.unwrap();
    drop(cgroup);
}
