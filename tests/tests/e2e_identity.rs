//! Workload identity on real Envoys (contract section 19): certificates the test
//! issues (one CA; chains with DNS and URI SANs; one expiring within the warning,
//! one already expired), a caller whose cluster requires a SPIFFE ID its target does
//! not present, and a sidecar with more certificates than an instance may report.
//! What the catalog shows of them: `GET /certificates`, identity on the records, the
//! predicted mTLS failure on the graph and in the diagnosis, the history, the
//! metrics, and the attempts of a failing handshake counted on the edge. And a
//! sidecar that takes its certificate over SDS from the test control server's
//! issuer: a rotation followed without waiting for `--certs-interval`, a stalled
//! rotation seen as rotation-overdue, and its recovery.

use std::time::Duration;

use meshcat_tests::bootstrap::{Cluster, HttpListener, Tls};
use meshcat_tests::certs::CertSpec;
use meshcat_tests::chain::{link, send};
use meshcat_tests::mesh::metric_sum;
use meshcat_tests::{Bootstrap, Catalog, Envoy, MeshAgent, MeshCerts, Upstream, wait_for};
use serde_json::{Value, json};

const ZONE: &str = "shop";
const DAY: Duration = Duration::from_secs(86_400);
const WAIT: Duration = Duration::from_secs(30);

fn spiffe(sa: &str) -> String {
    format!("spiffe://shop.local/ns/shop/sa/{sa}")
}

async fn agent(catalog: &Catalog, envoy: &Envoy, cluster: &str) -> MeshAgent {
    let args = catalog.sidecar_agent_args(envoy, ZONE, cluster, &format!("{cluster}-1"), "300ms");
    MeshAgent::start(&args).await.expect("agent starts")
}

/// The rows of `GET /certificates?<query>`.
async fn rows(catalog: &Catalog, query: &str) -> Vec<Value> {
    let (status, body) = catalog
        .get(&format!("/certificates?{query}"))
        .await
        .unwrap();
    assert_eq!(status, 200, "{query}: {body}");
    body.as_array().cloned().unwrap_or_default()
}

fn chains<'a>(rows: &'a [Value], cluster: &str) -> Vec<&'a Value> {
    rows.iter()
        .filter(|r| r["clusterName"] == cluster && r["role"] == "chain")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn certificates_san_expectations_and_failed_handshakes_are_seen_before_requests_fail() {
    let dir = tempfile::tempdir().unwrap();
    let certs = MeshCerts::new(dir.path(), "shop").unwrap();
    let issue = |spec: CertSpec| certs.issue(&spec).unwrap();
    let payments = issue(CertSpec::valid_for(
        "payments",
        "payments.shop",
        &spiffe("payments"),
        90 * DAY,
    ));
    let orders = issue(CertSpec::valid_for(
        "orders",
        "orders.shop",
        &spiffe("orders"),
        3 * DAY,
    ));
    let ledger = issue(CertSpec::expired(
        "ledger",
        "ledger.shop",
        &spiffe("ledger"),
        DAY,
    ));
    let edge_id = issue(CertSpec::valid_for(
        "edge",
        "edge.shop",
        &spiffe("edge"),
        90 * DAY,
    ));

    let catalog = Catalog::start(|c| c.ops.cluster_metrics = true)
        .await
        .unwrap();
    catalog.register_zone(ZONE, "edge").await.unwrap();
    for (cluster, owner) in [
        ("edge", "edge-team"),
        ("payments", "pay-team"),
        ("orders", "orders-team"),
        ("ledger", "ledger-team"),
    ] {
        catalog
            .register_cluster(ZONE, cluster, json!({"owner": owner}))
            .await
            .unwrap();
    }

    let mut services = Vec::new();
    let sidecar = |identity| {
        let tls = Tls::new(&certs, identity, None);
        async move {
            let upstream = Upstream::start().await.unwrap();
            let envoy = Envoy::start(Bootstrap::service_sidecar(upstream.addr, Some(tls)))
                .await
                .unwrap();
            (upstream, envoy)
        }
    };
    let (pay_up, pay) = sidecar(payments).await;
    let (orders_up, orders_env) = sidecar(orders).await;
    let (ledger_up, ledger_env) = sidecar(ledger).await;
    services.extend([pay_up, orders_up, ledger_up]);
    // The edge requires each service's SPIFFE ID; of orders, a wrong one.
    let mut edge_listener = HttpListener::new("edge", "edge_http");
    let mut bootstrap = Bootstrap::new();
    for (prefix, cluster, target, expect) in [
        ("/payments", "payments", &pay, spiffe("payments")),
        ("/orders", "orders", &orders_env, spiffe("WRONG")),
    ] {
        edge_listener = edge_listener.route(prefix, cluster);
        let mut c = Cluster::new(cluster, &[target.listener("ingress")]);
        c.tls = Some(Tls::new(&certs, edge_id.clone(), None).expecting_uri(&expect));
        bootstrap = bootstrap.cluster(c);
    }
    let edge = Envoy::start(bootstrap.listener(edge_listener))
        .await
        .unwrap();
    let _agents = [
        agent(&catalog, &edge, "edge").await,
        agent(&catalog, &pay, "payments").await,
        agent(&catalog, &orders_env, "orders").await,
        agent(&catalog, &ledger_env, "ledger").await,
    ];

    // Every sidecar's chain and CA certificates, each once per instance, soonest
    // expiry first.
    let all = wait_for("four chains in GET /certificates", WAIT, || async {
        let all = rows(&catalog, "").await;
        (all.iter().filter(|r| r["role"] == "chain").count() == 4).then_some(all)
    })
    .await
    .unwrap();
    assert_eq!(all.len(), 8, "a chain and the CA per instance: {all:#?}");
    let expiries: Vec<i64> = all
        .iter()
        .map(|r| r["expiresAtMs"].as_i64().unwrap())
        .collect();
    assert!(expiries.is_sorted(), "sorted by expiry: {expiries:?}");
    let ledger_row = chains(&all, "ledger")[0];
    assert_eq!(ledger_row["state"], "expired");
    assert_eq!(all[0], *ledger_row, "the expired one first");
    let orders_row = chains(&all, "orders")[0];
    assert_eq!(orders_row["state"], "expiring");
    assert_eq!(orders_row["owner"], "orders-team");
    assert_eq!(orders_row["source"], "file");
    assert_eq!(orders_row["secret"], Value::Null);
    assert_eq!(
        orders_row["sans"],
        json!(["orders.shop", spiffe("orders")]),
        "DNS first, as Envoy lists them"
    );
    assert!(
        orders_row["serial"]
            .as_str()
            .unwrap()
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "lower-case hex: {orders_row}"
    );
    assert_eq!(chains(&all, "payments")[0]["state"], "ok");
    let ca: Vec<&Value> = all.iter().filter(|r| r["role"] == "ca").collect();
    assert_eq!(ca.len(), 4);
    assert!(
        ca.iter()
            .all(|r| r["serial"] == ca[0]["serial"] && r["sans"] == json!([]))
    );

    // Filters.
    let expired = rows(&catalog, "state=expired").await;
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0]["clusterName"], "ledger");
    let soon = rows(&catalog, "expiringWithin=7d").await;
    let names: Vec<&str> = soon
        .iter()
        .map(|r| r["clusterName"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ledger", "orders"], "expired ones included");
    assert_eq!(
        rows(&catalog, "state=expiring&state=expired").await.len(),
        2
    );
    let of_payments = rows(&catalog, "zoneName=shop&clusterName=payments").await;
    assert_eq!(of_payments.len(), 2);
    assert!(of_payments.iter().all(|r| r["instance"] == "payments-1"));
    assert!(rows(&catalog, "zoneName=elsewhere").await.is_empty());
    for bad in [
        "state=soon",
        "expiringWithin=tomorrow",
        "owner=pay-team",
        "zoneName=a&zoneName=b",
    ] {
        let (status, body) = catalog.get(&format!("/certificates?{bad}")).await.unwrap();
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["code"], "invalid_query", "{bad}: {body}");
    }

    // The records: each instance's identity and the cluster's.
    let record = catalog.cluster(ZONE, "orders").await.unwrap();
    let instance = &record["instances"][0]["identity"];
    assert_eq!(instance["state"], "expiring", "{record}");
    assert_eq!(instance["serial"], orders_row["serial"]);
    assert_eq!(instance["expiresAtMs"], orders_row["expiresAtMs"]);
    assert_eq!(record["identity"]["state"], "expiring");
    assert_eq!(record["identity"]["spiffeIds"], json!([spiffe("orders")]));
    let ledger_record = catalog.cluster(ZONE, "ledger").await.unwrap();
    assert_eq!(ledger_record["identity"]["state"], "expired");
    assert_eq!(
        catalog.cluster(ZONE, "payments").await.unwrap()["identity"]["state"],
        "ok"
    );

    // The edge's expectation of orders is a predicted failure before any request:
    // an edge neither observed nor declared, carrying both sides' SANs.
    let graph = wait_for("the predicted mismatch on the graph", WAIT, || async {
        let (_, g) = catalog.get("/graph?zoneName=shop").await.ok()?;
        link(&g, "shop/edge", "shop/orders").is_some().then_some(g)
    })
    .await
    .unwrap();
    let predicted = link(&graph, "shop/edge", "shop/orders").unwrap();
    assert_eq!(predicted["observed"], false);
    assert_eq!(predicted["requests"], 0);
    assert_eq!(
        predicted["tlsIdentity"],
        json!({"expectedSans": [spiffe("WRONG")], "presentedSans": ["orders.shop", spiffe("orders")], "match": false})
    );
    assert!(
        link(&graph, "shop/edge", "shop/payments").is_none(),
        "a matching expectation draws no edge before traffic"
    );
    catalog
        .wait_history_entry("tls-mismatch", "/history?kind=tls-mismatch", WAIT, |e| {
            e["clusterName"] == "edge" && e["detail"]["target"] == "shop/orders"
        })
        .await
        .unwrap();
    catalog
        .wait_history_entry(
            "the expired certificate noted",
            "/history?kind=certificate-state&clusterName=ledger",
            WAIT,
            |e| e["detail"]["to"] == "expired" && e["instance"] == "ledger-1",
        )
        .await
        .unwrap();

    // Requests: every call to orders fails in the handshake, and the edge counts
    // each attempt once as a request and once as an error.
    let client = reqwest::Client::new();
    let statuses = send(&client, &format!("{}/orders/1", edge.url("edge")), 3).await;
    assert_eq!(statuses, [503, 503, 503]);
    assert_eq!(
        send(&client, &format!("{}/payments/1", edge.url("edge")), 2).await,
        [200, 200]
    );
    let failed = wait_for("the failed handshakes counted", WAIT, || async {
        let (_, g) = catalog.get("/graph?zoneName=shop").await.ok()?;
        let e = link(&g, "shop/edge", "shop/orders")?.clone();
        (e["requests"].as_u64()? >= 3).then_some(e)
    })
    .await
    .unwrap();
    assert_eq!(failed["errors"], failed["requests"], "{failed}");
    assert_eq!(failed["errorRatio"], 1.0);
    assert_eq!(failed["observed"], true);
    assert_eq!(failed["tlsIdentity"]["match"], false);
    let ok = wait_for("the payments edge", WAIT, || async {
        let (_, g) = catalog.get("/graph?zoneName=shop").await.ok()?;
        link(&g, "shop/edge", "shop/payments").cloned()
    })
    .await
    .unwrap();
    assert_eq!(ok["tlsIdentity"]["match"], true, "{ok}");
    assert_eq!(ok["errors"], 0);

    // The diagnosis names the mismatch, both sides' SANs and both owners.
    let (status, report) = catalog
        .get("/diagnose/orders?zoneName=shop&symptom=upstream_connect_error")
        .await
        .unwrap();
    assert_eq!(status, 200, "{report}");
    let mtls = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "mtls")
        .unwrap();
    assert_eq!(mtls["verdict"], "fail", "{mtls}");
    let conclusion = report["conclusion"].as_str().unwrap();
    for needle in [
        "mtls failed",
        &spiffe("WRONG"),
        &spiffe("orders"),
        "edge-team",
        "orders-team",
    ] {
        assert!(conclusion.contains(needle), "{needle} in {conclusion}");
    }
    // An expired certificate on the target's side is named the same way.
    let (_, ledger_report) = catalog
        .get("/diagnose/ledger?zoneName=shop&symptom=upstream_connect_error")
        .await
        .unwrap();
    let conclusion = ledger_report["conclusion"].as_str().unwrap_or_default();
    assert!(
        conclusion.contains("mtls failed") && conclusion.contains("expired at 20"),
        "{ledger_report}"
    );

    // The metrics an alert reads.
    let text = wait_for("certificate metrics", WAIT, || async {
        let t = catalog.ops_metrics().await.ok()?;
        (metric_sum(&t, "meshcat_certificates", &[("state", "expired")]) == Some(1.0)).then_some(t)
    })
    .await
    .unwrap();
    assert_eq!(
        metric_sum(&text, "meshcat_certificates", &[("state", "expiring")]),
        Some(1.0)
    );
    let ledger_expiry = ledger_row["expiresAtMs"].as_i64().unwrap() / 1000;
    assert_eq!(
        metric_sum(
            &text,
            "meshcat_certificate_expiry_timestamp_seconds",
            &[("cluster", "ledger"), ("owner", "ledger-team")]
        ),
        Some(ledger_expiry as f64)
    );
    assert_eq!(
        metric_sum(
            &text,
            "meshcat_edge_tls_san_mismatch",
            &[
                ("source", "edge"),
                ("target", "orders"),
                ("owner", "edge-team")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        metric_sum(
            &text,
            "meshcat_edge_tls_san_mismatch",
            &[("source", "edge"), ("target", "payments")]
        ),
        Some(0.0)
    );
    drop(services);
}

/// A sidecar with more distinct certificates than an instance may report has its
/// certificates refused alone: it stays listed with identity `none` and the reason,
/// the agent counts it, and its neighbour on the same agent keeps its identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sidecar_over_the_certificate_bound_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let certs = MeshCerts::new(dir.path(), "bound").unwrap();
    let catalog = Catalog::start(|_| {}).await.unwrap();
    catalog.register_zone(ZONE, "").await.unwrap();
    catalog
        .register_cluster(ZONE, "busy", json!({}))
        .await
        .unwrap();
    let upstream = Upstream::start().await.unwrap();
    // 65 clusters, each presenting a certificate of its own.
    let mut busy = Bootstrap::service_sidecar(upstream.addr, None);
    for i in 0..=meshcat_common::identity::MAX_CERTIFICATES {
        let id = certs
            .issue(&CertSpec::valid_for(
                &format!("client-{i}"),
                &format!("client-{i}.shop"),
                &spiffe(&format!("client-{i}")),
                30 * DAY,
            ))
            .unwrap();
        let mut c = Cluster::new(&format!("peer-{i}"), &[upstream.addr]);
        c.tls = Some(Tls::new(&certs, id, None));
        busy = busy.cluster(c);
    }
    let busy = Envoy::start(busy).await.unwrap();
    let quiet_id = certs
        .issue(&CertSpec::valid_for(
            "quiet",
            "quiet.shop",
            &spiffe("quiet"),
            30 * DAY,
        ))
        .unwrap();
    let quiet = Envoy::start(Bootstrap::service_sidecar(
        upstream.addr,
        Some(Tls::new(&certs, quiet_id, None)),
    ))
    .await
    .unwrap();
    // One agent for both sidecars.
    let mut args = catalog.agent_args();
    let targets = dir.path().join("targets.json");
    std::fs::write(
        &targets,
        json!([
            {"admin": busy.admin_addr(), "zoneName": ZONE, "clusterName": "busy", "instance": "busy-1"},
            {"admin": quiet.admin_addr(), "zoneName": ZONE, "clusterName": "busy", "instance": "quiet-1"},
        ])
        .to_string(),
    )
    .unwrap();
    args.extend([
        "--targets-file".to_owned(),
        targets.display().to_string(),
        "--interval".to_owned(),
        "300ms".to_owned(),
    ]);
    let agent = MeshAgent::start(&args).await.unwrap();
    let record = catalog
        .wait_cluster("both instances read", ZONE, "busy", WAIT, |c| {
            let ids: Vec<&Value> = c["instances"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|i| &i["identity"])
                .collect();
            ids.len() == 2
                && ids.iter().any(|i| i["reason"].is_string())
                && ids.iter().any(|i| i["state"] == "ok")
        })
        .await
        .unwrap();
    let instances = record["instances"].as_array().unwrap();
    let busy_identity = &instances.iter().find(|i| i["name"] == "busy-1").unwrap()["identity"];
    assert_eq!(busy_identity["state"], "none");
    assert_eq!(busy_identity["reason"], "too_many_certificates");
    let quiet_identity = &instances.iter().find(|i| i["name"] == "quiet-1").unwrap()["identity"];
    assert_eq!(
        quiet_identity["sans"],
        json!(["quiet.shop", spiffe("quiet")])
    );
    let rows = rows(&catalog, "clusterName=busy").await;
    assert!(rows.iter().all(|r| r["instance"] == "quiet-1"), "{rows:#?}");
    let metrics = agent.metrics().await.unwrap();
    assert!(
        metric_sum(
            &metrics,
            "meshcat_agent_certs_refused_total",
            &[("target", "busy-1"), ("reason", "too_many_certificates")]
        )
        .is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
}

/// One row of `rows` for `cluster`'s chain certificate with `serial`.
fn chain_with<'a>(rows: &'a [Value], cluster: &str, serial: &str) -> Option<&'a Value> {
    chains(rows, cluster)
        .into_iter()
        .find(|r| r["serial"] == serial)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rotations_over_sds_are_followed_and_a_stalled_rotation_is_overdue() {
    use meshcat_control_server::{Ca, ControlServer, IdentitySpec, IssuerOptions};
    use meshcat_tests::identity::start_mtls_sidecar;
    use meshcat_tests::xds::XdsBootstrap;

    let dir = tempfile::tempdir().unwrap();
    // Overdue past a quarter of a lifetime, so that a certificate issued for 40 s is
    // overdue from its 10th second and expires 30 s later.
    let catalog = Catalog::start(|c| {
        c.store.rules.identity.overdue_fraction = 0.25;
        c.store.rules.identity.warning_ms = 1_000;
    })
    .await
    .unwrap();
    catalog.register_zone(ZONE, "edge").await.unwrap();
    catalog
        .register_cluster(ZONE, "svc", json!({"owner": "svc-team"}))
        .await
        .unwrap();
    let server = ControlServer::start("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let ca = Ca::generate("shop mesh CA", DAY).unwrap();
    let issuer = server
        .start_issuer(
            ca,
            IssuerOptions {
                lifetime: Duration::from_secs(3_600),
                rotate_at: 0.2,
                ..IssuerOptions::default()
            },
            vec![IdentitySpec::new("svc", [spiffe("svc").as_str(), "svc.shop"]).unwrap()],
        )
        .unwrap();
    let upstream = Upstream::start().await.unwrap();
    let (svc, _) = start_mtls_sidecar(
        XdsBootstrap::new("svc-1", "svc", server.local_addr()),
        ("svc", "ca"),
        upstream.addr,
        &dir.path().join("svc-access.log"),
    )
    .await
    .unwrap();
    // Certificates are read again when the configuration moves, not on the hour.
    let mut args = svc.agent_args(catalog.agent_args(), (ZONE, "svc", "svc-1"));
    args.extend(["--certs-interval".to_owned(), "1h".to_owned()]);
    let _agent = MeshAgent::start(&args).await.unwrap();

    // The issued certificate, from its SDS secret.
    let first = issuer.identity("svc").unwrap();
    let row = wait_for("svc's first certificate", WAIT, || async {
        chain_with(
            &rows(&catalog, "clusterName=svc").await,
            "svc",
            &first.serial,
        )
        .cloned()
    })
    .await
    .unwrap();
    assert_eq!(row["source"], "sds", "{row}");
    assert_eq!(row["secret"], "svc", "{row}");
    assert_eq!(row["state"], "ok", "{row}");
    assert_eq!(row["expiresAtMs"], first.expires_at_ms, "{row}");

    // A rotation: the new certificate replaces the old one, and the history says so.
    let rotated = issuer.rotate("svc").unwrap();
    let entry = catalog
        .wait_history_entry(
            "the rotation noted",
            "/history?kind=certificate-rotated&clusterName=svc",
            WAIT,
            |e| e["detail"]["serial"] == rotated.serial.as_str(),
        )
        .await
        .unwrap();
    assert_eq!(entry["instance"], "svc-1");
    assert_eq!(entry["detail"]["previousSerial"], first.serial.as_str());
    assert_eq!(entry["detail"]["secret"], "svc");
    let now = rows(&catalog, "clusterName=svc").await;
    assert_eq!(
        chains(&now, "svc").len(),
        1,
        "the old certificate left: {now:#?}"
    );

    // Rotation stops with a certificate of 40 s in place: once past a quarter of its
    // lifetime, it is rotation-overdue without any new report.
    assert!(issuer.stop_rotation());
    let short = issuer.issue("svc", Duration::from_secs(40)).unwrap();
    wait_for("the short-lived certificate", WAIT, || async {
        chain_with(
            &rows(&catalog, "clusterName=svc").await,
            "svc",
            &short.serial,
        )
        .cloned()
    })
    .await
    .unwrap();
    let entry = catalog
        .wait_history_entry(
            "the overdue rotation noted",
            "/history?kind=certificate-state&clusterName=svc",
            WAIT,
            |e| e["detail"]["to"] == "rotation-overdue",
        )
        .await
        .unwrap();
    assert_eq!(entry["detail"]["serial"], short.serial.as_str());
    let overdue = rows(&catalog, "state=rotation-overdue").await;
    assert!(
        chain_with(&overdue, "svc", &short.serial).is_some(),
        "{overdue:#?}"
    );
    let (_, records) = catalog.get("/clusters/svc").await.unwrap();
    assert_eq!(
        records[0]["instances"][0]["identity"]["state"], "rotation-overdue",
        "{records:#}"
    );
    assert_eq!(
        records[0]["identity"]["state"], "rotation-overdue",
        "{records:#}"
    );

    // Rotation starts again: the overdue certificate is replaced at once.
    let replaced = issuer.start_rotation().unwrap();
    let new = replaced
        .iter()
        .find(|r| r.secret == "svc")
        .expect("the overdue certificate is replaced");
    let row = wait_for("the replacement", WAIT, || async {
        chain_with(&rows(&catalog, "clusterName=svc").await, "svc", &new.serial).cloned()
    })
    .await
    .unwrap();
    assert_eq!(row["state"], "ok", "{row}");
    catalog
        .wait_history_entry(
            "the state back to ok",
            "/history?kind=certificate-state&clusterName=svc",
            WAIT,
            |e| e["detail"]["from"] == "rotation-overdue" && e["detail"]["to"] == "ok",
        )
        .await
        .unwrap();
}
