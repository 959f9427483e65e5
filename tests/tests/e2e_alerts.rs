//! The series that alerts route by owner (contract section 16), end to end on real
//! Envoys: svc-a (owner team-a) calls svc-b (owner team-b) through its sidecar's
//! egress listener, each sidecar read by a real agent. With `--cluster-metrics`, the
//! aggregator's ops `/metrics` carries each cluster's status and instances with its
//! owner and the edge's counters, valid for `promtool check metrics`; the counters
//! only grow, the status flips when svc-a's agent stops, a deleted cluster's series
//! go. Without it (the default: the ops port has no token) no series names a
//! cluster or an owner. The alerting rules and the Grafana
//! dashboard of `deploy/kubernetes/monitoring/` name only series that this real
//! aggregator exposes, and a real Prometheus evaluating the rules on its series
//! finds the owner of each cluster and edge.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use meshcat_aggregator::config::Config;
use meshcat_tests::bootstrap::{Cluster, HttpListener};
use meshcat_tests::mesh::metric_sum;
use meshcat_tests::monitoring::{Prometheus, check_metrics};
use meshcat_tests::{Bootstrap, Catalog, Envoy, MeshAgent, Upstream, wait_for};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(30);
const ZONE: &str = "zone-al";

/// svc-a calling svc-b, both registered with an owner, each sidecar with its agent.
struct Mesh {
    catalog: Catalog,
    /// svc-a's sidecar: its `egress` listener routes `/b` to svc-b.
    a: Envoy,
    b_service: Upstream,
    agent_a: Option<MeshAgent>,
    _agent_b: MeshAgent,
    _a_service: Upstream,
    _b: Envoy,
    client: reqwest::Client,
}

async fn mesh(tune: impl FnOnce(&mut Config)) -> Mesh {
    let catalog = Catalog::start(|c| {
        c.store.rules.instance_ttl = Duration::from_millis(900);
        tune(c);
    })
    .await
    .unwrap();
    catalog.register_zone(ZONE, "edge").await.unwrap();
    for (cluster, owner) in [("svc-a", "team-a"), ("svc-b", "team-b")] {
        catalog
            .register_cluster(ZONE, cluster, json!({ "owner": owner }))
            .await
            .unwrap();
    }
    let b_service = Upstream::start().await.unwrap();
    let b = Envoy::start(Bootstrap::service_sidecar(b_service.addr, None))
        .await
        .unwrap();
    let a_service = Upstream::start().await.unwrap();
    let a = Envoy::start(
        Bootstrap::service_sidecar(a_service.addr, None)
            .listener(HttpListener::new("egress", "egress_http").route("/b", "svc-b"))
            .cluster(Cluster::new("svc-b", &[b.listener("ingress")])),
    )
    .await
    .unwrap();
    let agent_a = MeshAgent::for_envoy(&catalog, &a, ZONE, "svc-a", "svc-a-1", "300ms")
        .await
        .unwrap();
    let agent_b = MeshAgent::for_envoy(&catalog, &b, ZONE, "svc-b", "svc-b-1", "300ms")
        .await
        .unwrap();
    Mesh {
        catalog,
        a,
        b_service,
        agent_a: Some(agent_a),
        _agent_b: agent_b,
        _a_service: a_service,
        _b: b,
        client: reqwest::Client::new(),
    }
}

impl Mesh {
    /// Sends `n` requests from svc-a to svc-b; their status codes.
    async fn call_b(&self, n: usize) -> Vec<u16> {
        let url = format!("{}/b", self.a.url("egress"));
        let mut codes = Vec::with_capacity(n);
        for _ in 0..n {
            codes.push(
                self.client
                    .get(&url)
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16(),
            );
        }
        codes
    }

    /// Calls svc-b until the edge svc-a -> svc-b shows in `/metrics` with more
    /// than `requests` requests (`errors` errors), each answer checked by
    /// `expect`; the exposition then.
    async fn traffic_until(
        &self,
        requests: f64,
        errors: f64,
        expect: impl Fn(u16) -> bool,
    ) -> String {
        wait_for("the edge's counters to move", DEADLINE, || async {
            let codes = self.call_b(3).await;
            assert!(codes.iter().all(|c| expect(*c)), "{codes:?}");
            let text = self.catalog.ops_metrics().await.ok()?;
            let (r, e) = edge(&text);
            (r? > requests && e? > errors).then_some(text)
        })
        .await
        .unwrap()
    }
}

const EDGE: [(&str, &str); 4] = [
    ("source_zone", ZONE),
    ("source", "svc-a"),
    ("target_zone", ZONE),
    ("target", "svc-b"),
];

/// The edge svc-a -> svc-b's requests and errors in an exposition.
fn edge(text: &str) -> (Option<f64>, Option<f64>) {
    (
        metric_sum(text, "meshcat_edge_requests_total", &EDGE),
        metric_sum(text, "meshcat_edge_errors_total", &EDGE),
    )
}

/// `meshcat_cluster_status` of (cluster, owner, status).
fn status(text: &str, cluster: &str, owner: &str, status: &str) -> Option<f64> {
    metric_sum(
        text,
        "meshcat_cluster_status",
        &[
            ("zone", ZONE),
            ("cluster", cluster),
            ("owner", owner),
            ("status", status),
        ],
    )
}

fn instances(text: &str, cluster: &str, owner: &str) -> Option<f64> {
    metric_sum(
        text,
        "meshcat_cluster_instances",
        &[("zone", ZONE), ("cluster", cluster), ("owner", owner)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_and_edge_series_carry_the_owner_and_follow_the_mesh() {
    let mut m = mesh(|c| c.ops.cluster_metrics = true).await;
    let text = m.traffic_until(0.0, -1.0, |c| c == 200).await;
    if let Err(e) = check_metrics(&text) {
        panic!("promtool check metrics refuses the exposition:\n{e}\n{text}");
    }
    for (cluster, owner) in [("svc-a", "team-a"), ("svc-b", "team-b")] {
        let text = wait_for("both clusters stable", DEADLINE, || async {
            let text = m.catalog.ops_metrics().await.ok()?;
            (status(&text, cluster, owner, "stable") == Some(1.0)).then_some(text)
        })
        .await
        .unwrap();
        assert_eq!(status(&text, cluster, owner, "warning"), Some(0.0));
        assert_eq!(status(&text, cluster, owner, "down"), Some(0.0));
        assert_eq!(instances(&text, cluster, owner), Some(1.0), "{text}");
    }
    let (requests, errors) = edge(&text);
    assert_eq!(errors, Some(0.0), "{text}");

    // More calls: the counter grows.
    let text = m.traffic_until(requests.unwrap(), -1.0, |c| c == 200).await;
    let (requests, _) = edge(&text);

    // svc-b's service dies: the calls fail, and the errors are counted while the
    // requests go on growing.
    m.b_service.stop().await;
    let text = m.traffic_until(requests.unwrap(), 0.0, |c| c >= 500).await;
    let (requests, errors) = edge(&text);
    let (requests, errors) = (requests.unwrap(), errors.unwrap());
    assert!(errors <= requests, "{text}");

    // Scrapes in a row never see the counters go down.
    let mut last = (requests, errors);
    for _ in 0..5 {
        m.call_b(2).await;
        let (r, e) = edge(&m.catalog.ops_metrics().await.unwrap());
        let now = (r.unwrap(), e.unwrap());
        assert!(now.0 >= last.0 && now.1 >= last.1, "{last:?} then {now:?}");
        last = now;
    }

    // svc-a's agent stops: its instance leaves, svc-a is down with no instance, and
    // the edge, which no live instance calls any more, leaves the graph and the
    // exposition together.
    m.agent_a.take().unwrap().stop().await.unwrap();
    let text = wait_for("svc-a down", DEADLINE, || async {
        let text = m.catalog.ops_metrics().await.ok()?;
        (status(&text, "svc-a", "team-a", "down") == Some(1.0)).then_some(text)
    })
    .await
    .unwrap();
    assert_eq!(status(&text, "svc-a", "team-a", "stable"), Some(0.0));
    assert_eq!(instances(&text, "svc-a", "team-a"), Some(0.0), "{text}");
    let (_, g) = m.catalog.get("/graph").await.unwrap();
    let from_a = format!("{ZONE}/svc-a");
    assert!(
        !g["edges"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["source"] == from_a.as_str()),
        "{g}"
    );
    assert_eq!(edge(&text), (None, None), "{text}");

    // svc-b is deleted: its cluster series are gone from the next rendering (its
    // agent still reports it, but nobody owns it any more).
    let deleted = m
        .client
        .delete(format!(
            "{}/clusters/svc-b?zoneName={ZONE}",
            m.catalog.api_url()
        ))
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    let text = wait_for("a deleted cluster without series", DEADLINE, || async {
        let text = m.catalog.ops_metrics().await.ok()?;
        (!text.contains(r#"cluster="svc-b""#)).then_some(text)
    })
    .await
    .unwrap();
    assert_eq!(status(&text, "svc-a", "team-a", "down"), Some(1.0));
    check_metrics(&text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_no_series_names_a_cluster_an_edge_or_an_owner() {
    let m = mesh(|_| {}).await;
    // The edge exists: the graph shows it.
    wait_for("the edge in the graph", DEADLINE, || async {
        assert!(m.call_b(3).await.iter().all(|c| *c == 200));
        let (_, g) = m.catalog.get("/graph").await.ok()?;
        g["edges"]
            .as_array()?
            .iter()
            .any(|e| {
                e["source"] == format!("{ZONE}/svc-a")
                    && e["target"] == format!("{ZONE}/svc-b")
                    && e["requests"].as_u64() > Some(0)
            })
            .then_some(())
    })
    .await
    .unwrap();
    m.catalog
        .wait_cluster("svc-a stable", ZONE, "svc-a", DEADLINE, |c| {
            c["status"] == "stable"
        })
        .await
        .unwrap();
    let text = m.catalog.ops_metrics().await.unwrap();
    for word in [
        "meshcat_cluster_status",
        "meshcat_cluster_instances",
        "meshcat_edge_requests_total",
        "meshcat_edge_errors_total",
        "team-a",
        "team-b",
        "svc-a",
        "svc-b",
    ] {
        assert!(!text.contains(word), "{word} in:\n{text}");
    }
    // The rest of the exposition is there.
    assert_eq!(
        metric_sum(&text, "meshcat_clusters_by_status", &[("status", "stable")]),
        Some(2.0),
        "{text}"
    );
    check_metrics(&text).unwrap();
}

/// Every `meshcat_*` metric name in a file of the repository (PromQL in a rules
/// file or a dashboard): words starting with `meshcat_`, which no other name in
/// those files does (recorded series are named `meshcat:...`).
fn names_in(path: &str) -> BTreeSet<String> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{path}: {e}"));
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.split(|c: char| !word(c))
        .filter(|w| w.starts_with("meshcat_"))
        .map(str::to_owned)
        .collect()
}

/// The names of the samples and families of an exposition.
fn exposed(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| match l.strip_prefix("# TYPE ") {
            Some(rest) => rest.split_whitespace().next(),
            None if l.starts_with('#') => None,
            None => l.split(['{', ' ']).next(),
        })
        .map(str::to_owned)
        .collect()
}

const RULES: &str = "deploy/kubernetes/monitoring/alerts.yml";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rules_and_the_dashboard_name_only_series_the_aggregator_exposes() {
    let m = mesh(|c| c.ops.cluster_metrics = true).await;
    let text = m.traffic_until(0.0, -1.0, |c| c == 200).await;
    let exposed = exposed(&text);
    for path in [RULES, "deploy/kubernetes/monitoring/dashboard.json"] {
        let used = names_in(path);
        assert!(
            used.len() >= 5,
            "{path} names too few series to be checked: {used:?}"
        );
        let unknown: Vec<&String> = used.difference(&exposed).collect();
        assert!(
            unknown.is_empty(),
            "{path} names series the aggregator does not expose: {unknown:?}\nexposed: {exposed:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_with_the_rules_finds_the_owners_of_clusters_and_edges() {
    let m = mesh(|c| c.ops.cluster_metrics = true).await;
    m.traffic_until(0.0, -1.0, |c| c == 200).await;
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(RULES);
    let prometheus = Prometheus::with_rules(
        &[("meshcat", m.catalog.config.ops_addr.to_string())],
        &[&rules],
    );
    prometheus
        .series(&format!(
            r#"meshcat:cluster_status:max{{zone="{ZONE}",cluster="svc-a",owner="team-a",status="stable"}} == 1"#
        ))
        .await;
    // The edge's errors would go to the target's owner.
    let owner = prometheus
        .series(r#"meshcat:edge_owner{source="svc-a",target="svc-b"}"#)
        .await;
    assert_eq!(owner.len(), 1, "{owner:?}");
    assert_eq!(owner[0]["metric"]["owner"], "team-b", "{owner:?}");
    assert_eq!(owner[0]["metric"]["owner_of"], "target", "{owner:?}");
    // With calls going on, the edge has an error ratio: 0, all calls answered.
    let ratio = wait_for("the edge's error ratio", DEADLINE, || async {
        assert!(m.call_b(3).await.iter().all(|c| *c == 200));
        prometheus
            .query(r#"meshcat:edge_error_ratio:rate5m{source="svc-a",target="svc-b"}"#)
            .await
            .filter(|r| !r.is_empty())
    })
    .await
    .unwrap();
    assert_eq!(ratio[0]["value"][1], "0", "{ratio:?}");
}
