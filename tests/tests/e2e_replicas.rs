//! Replicas on etcd (contract section 13): a real three-member etcd cluster on
//! loopback and aggregator replicas as real processes. Writes on one replica (zone
//! replacements included) show on the others within 1 s, create conflicts answer 409 from any replica, nothing
//! acknowledged is lost when a replica is killed, quorum loss turns writes into 503
//! while reads and readiness stay, and a replica started while etcd is down is not
//! ready until it has loaded the catalog. A `GET /events` stream on one replica
//! follows registrations and instances that arrive through another.

use std::collections::BTreeSet;
use std::time::Duration;

use meshcat_tests::etcd::EtcdCluster;
use meshcat_tests::mesh::metric_sum;
use meshcat_tests::replicas::Replicas;
use meshcat_tests::sse::EventStream;
use meshcat_tests::wait_for;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_replica-aggregator");
/// Contract section 13: a write is visible on every replica within 1 s.
const VISIBLE: Duration = Duration::from_secs(1);
/// Contract section 13: 503 within 10 s of quorum loss, writes back within 10 s.
const QUORUM: Duration = Duration::from_secs(10);
/// Contract section 15: an entry is durable within 1 s, and so readable.
const HISTORY: Duration = Duration::from_secs(1);

fn zone(name: &str) -> Value {
    json!({"zoneName": name, "serverAddress": "control.local:50000", "requestCluster": "edge"})
}

fn cluster(zone: &str, name: &str) -> Value {
    json!({"zoneName": zone, "clusterName": name, "name": name, "owner": "team"})
}

/// The (zone, cluster) names registered on replica `i`.
/// An agent for `sidecar` as instance i1 of cluster svc in zone z, reporting to the
/// replicas `order` every `interval`, with `extra` flags.
async fn svc_agent(
    set: &Replicas,
    order: &[usize],
    sidecar: &meshcat_tests::Sidecar,
    interval: &str,
    extra: &[&str],
) -> anyhow::Result<meshcat_tests::MeshAgent> {
    agent_of(set, order, sidecar, "svc", interval, extra).await
}

/// Sets the level `info` on every instance of z/`cluster` through replica
/// `level_via`, and opens a 1 s debug window on them through replica `window_via`:
/// each reaches instance i1, the one live instance, and succeeds.
async fn cluster_commands_reach_i1(
    set: &Replicas,
    (level_via, window_via): (usize, usize),
    cluster: &str,
) -> anyhow::Result<()> {
    let level = format!("/zones/z/clusters/{cluster}/logging?level=info");
    let (s, body) = set.send(level_via, Method::PUT, &level, None).await?;
    assert_eq!(s, StatusCode::OK, "replica {level_via}: {body}");
    assert_eq!(body["succeeded"], 1, "replica {level_via}: {body}");
    assert_eq!(body["instances"][0]["instance"], "i1", "{body}");
    assert_eq!(body["instances"][0]["level"], "info", "{body}");
    let window = format!("/zones/z/clusters/{cluster}/debug-window?seconds=1");
    let (s, body) = set.send(window_via, Method::POST, &window, None).await?;
    assert_eq!(s, StatusCode::OK, "replica {window_via}: {body}");
    assert_eq!(body["succeeded"], 1, "replica {window_via}: {body}");
    assert!(body["instances"][0]["debugWindow"].is_object(), "{body}");
    Ok(())
}

/// API requests replica `i` answered 401 or 403, from its ops metrics: a request
/// refused by the replica it reached never reaches the owner and leaves this as it
/// is. Also the number of the rendering they come from
/// (`meshcat_ops_metrics_renders_total`): with `after`, waits for a newer rendering
/// than that, one made after every request sent before the call (a rendering is
/// served again for a few seconds).
async fn refused_requests(
    set: &Replicas,
    i: usize,
    after: Option<f64>,
) -> anyhow::Result<(f64, f64)> {
    let url = format!("{}/metrics", set.replicas[i].ops_url());
    let text = wait_for(
        "a new rendering of /metrics",
        Duration::from_secs(30),
        || async {
            let text = reqwest::get(&url).await.ok()?.text().await.ok()?;
            let rendering = metric_sum(&text, "meshcat_ops_metrics_renders_total", &[])?;
            (after.is_none_or(|a| rendering > a)).then_some((rendering, text))
        },
    )
    .await?;
    let (rendering, text) = text;
    let refused = text
        .lines()
        .filter(|l| {
            l.starts_with("meshcat_api_requests_total")
                && (l.contains("code=\"401\"") || l.contains("code=\"403\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    Ok((rendering, refused))
}

/// The flags that reach an etcd cluster started with TLS through its client
/// certificate.
fn etcd_client_flags(tls: &meshcat_tests::etcd::EtcdTlsFiles) -> Vec<String> {
    let path = |p: &std::path::Path| p.display().to_string();
    vec![
        "--etcd-ca-file".into(),
        path(&tls.ca_file),
        "--etcd-cert".into(),
        path(&tls.client.cert_file),
        "--etcd-key".into(),
        path(&tls.client.key_file),
    ]
}

/// Writes the API's read and write tokens into files in `dir`; the flags naming them.
fn token_flags(dir: &std::path::Path, read: &str, write: &str) -> anyhow::Result<Vec<String>> {
    let (read_file, write_file) = (dir.join("read-token"), dir.join("write-token"));
    std::fs::write(&read_file, format!("{read}\n"))?;
    std::fs::write(&write_file, format!("{write}\n"))?;
    Ok(vec![
        "--read-token-file".into(),
        read_file.display().to_string(),
        "--write-token-file".into(),
        write_file.display().to_string(),
    ])
}

/// Flags as the replica harness takes them.
fn strs(flags: &[String]) -> Vec<&str> {
    flags.iter().map(String::as_str).collect()
}

/// An agent reporting `sidecar` as instance i1 of `cluster` in zone z.
async fn agent_of(
    set: &Replicas,
    order: &[usize],
    sidecar: &meshcat_tests::Sidecar,
    cluster: &str,
    interval: &str,
    extra: &[&str],
) -> anyhow::Result<meshcat_tests::MeshAgent> {
    let mut args = set.agent_args(order);
    let admin = sidecar.envoy.admin_addr();
    let flags = [
        "--sidecar-admin",
        admin.as_str(),
        "--zone",
        "z",
        "--cluster",
        cluster,
        "--instance",
        "i1",
        "--interval",
        interval,
    ];
    args.extend(flags.iter().chain(extra).map(|f| (*f).to_owned()));
    meshcat_tests::MeshAgent::start(&args).await
}

async fn registered(set: &Replicas, i: usize) -> anyhow::Result<BTreeSet<(String, String)>> {
    let (status, body) = set.get(i, "/clusters").await?;
    anyhow::ensure!(status == StatusCode::OK, "GET /clusters: {status} {body}");
    Ok(body
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["zoneName"].as_str().unwrap_or_default().to_owned(),
                c["clusterName"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_show_on_every_replica_and_conflicts_answer_409_anywhere() -> anyhow::Result<()> {
    let etcd = EtcdCluster::start().await?;
    let set = Replicas::start(BIN, 3, &etcd.store_url("/visible"), &[]).await?;

    // A zone written on replica 0 shows on 1 and 2 within 1 s.
    let (s, body) = set.post(0, "/zones", &zone("z1")).await?;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    for i in [1, 2] {
        wait_for(&format!("zone z1 on replica {i}"), VISIBLE, || async {
            let (s, _) = set.get(i, "/zones/z1").await.ok()?;
            (s == StatusCode::OK).then_some(())
        })
        .await?;
    }
    // The writer reads its own write at once.
    assert_eq!(set.get(0, "/zones/z1").await?.0, StatusCode::OK);

    // A cluster written on replica 1 shows on 0 and 2 within 1 s, with its record.
    let (s, body) = set.post(1, "/clusters", &cluster("z1", "c1")).await?;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    for i in [0, 2] {
        let found = wait_for(&format!("cluster c1 on replica {i}"), VISIBLE, || async {
            let (s, b) = set.get(i, "/clusters/c1?zoneName=z1").await.ok()?;
            (s == StatusCode::OK).then_some(b)
        })
        .await?;
        assert_eq!(found[0]["owner"], "team", "{found}");
    }

    // Creating what exists answers 409 on every replica.
    for i in 0..3 {
        let (s, body) = set.post(i, "/zones", &zone("z1")).await?;
        assert_eq!(s, StatusCode::CONFLICT, "replica {i}: {body}");
        assert_eq!(body["code"], "conflict");
        let (s, _) = set.post(i, "/clusters", &cluster("z1", "c1")).await?;
        assert_eq!(s, StatusCode::CONFLICT, "replica {i}");
    }

    // Three replicas racing to create one cluster: exactly one wins, two get 409.
    let race = {
        let set = &set;
        futures::future::join_all(
            (0..3).map(|i| async move { set.post(i, "/clusters", &cluster("z1", "raced")).await }),
        )
        .await
    };
    let codes: Vec<StatusCode> = race
        .into_iter()
        .map(|r| r.map(|(s, _)| s))
        .collect::<Result<_, _>>()?;
    assert_eq!(
        codes.iter().filter(|s| **s == StatusCode::CREATED).count(),
        1,
        "{codes:?}"
    );
    assert_eq!(
        codes.iter().filter(|s| **s == StatusCode::CONFLICT).count(),
        2,
        "{codes:?}"
    );

    // A cluster in a zone that does not exist is refused everywhere.
    let (s, _) = set.post(2, "/clusters", &cluster("nozone", "c")).await?;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);

    // Replace on 2, delete on 0: both follow everywhere.
    let mut changed = cluster("z1", "c1");
    changed["owner"] = json!("other-team");
    let (s, body) = set
        .send(2, Method::PUT, "/clusters/c1?zoneName=z1", Some(&changed))
        .await?;
    assert!(s.is_success(), "PUT: {s} {body}");
    wait_for("replaced record on replica 0", VISIBLE, || async {
        let (_, b) = set.get(0, "/clusters/c1?zoneName=z1").await.ok()?;
        (b[0]["owner"] == "other-team").then_some(())
    })
    .await?;

    // A zone replaced on 1 shows on 0 and 2 within 1 s, with its clusters, and every
    // replica records it in its own history; an absent zone answers 404 anywhere.
    let mut moved = zone("z1");
    moved["serverAddress"] = json!("control.moved:60000");
    let (s, body) = set.send(1, Method::PUT, "/zones/z1", Some(&moved)).await?;
    assert_eq!(s, StatusCode::OK, "PUT /zones/z1: {body}");
    assert_eq!(body["serverAddress"], "control.moved:60000");
    for i in [0, 2] {
        wait_for(
            &format!("replaced zone on replica {i}"),
            VISIBLE,
            || async {
                let (_, b) = set.get(i, "/zones/z1").await.ok()?;
                (b["serverAddress"] == "control.moved:60000").then_some(())
            },
        )
        .await?;
    }
    for i in 0..3 {
        assert!(
            registered(&set, i)
                .await?
                .contains(&("z1".into(), "c1".into())),
            "replica {i} keeps the zone's cluster"
        );
        let entry = wait_for(
            &format!("zone-updated in replica {i}'s history"),
            HISTORY,
            || async {
                let (_, b) = set.get(i, "/history?kind=zone-updated").await.ok()?;
                b.as_array().filter(|a| !a.is_empty()).cloned()
            },
        )
        .await?;
        assert_eq!(entry.len(), 1, "replica {i}: {entry:?}");
        assert_eq!(entry[0]["zoneName"], "z1");
        assert_eq!(entry[0]["detail"], json!({"changed": ["serverAddress"]}));
        let (s, body) = set
            .send(i, Method::PUT, "/zones/ghost", Some(&zone("ghost")))
            .await?;
        assert_eq!(s, StatusCode::NOT_FOUND, "replica {i}: {body}");
    }

    let (s, body) = set
        .send(0, Method::DELETE, "/clusters/c1?zoneName=z1", None)
        .await?;
    assert!(s.is_success(), "DELETE: {s} {body}");
    for i in [1, 2] {
        wait_for(&format!("c1 gone on replica {i}"), VISIBLE, || async {
            let (s, _) = set.get(i, "/clusters/c1?zoneName=z1").await.ok()?;
            (s == StatusCode::NOT_FOUND).then_some(())
        })
        .await?;
    }
    // Deleting a zone deletes its clusters on every replica.
    let (s, _) = set.send(1, Method::DELETE, "/zones/z1", None).await?;
    assert!(s.is_success());
    for i in 0..3 {
        wait_for(
            &format!("z1 and its clusters gone on {i}"),
            VISIBLE,
            || async {
                let (s, _) = set.get(i, "/zones/z1").await.ok()?;
                let left = registered(&set, i).await.ok()?;
                (s == StatusCode::NOT_FOUND && left.is_empty()).then_some(())
            },
        )
        .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_loses_no_acknowledged_write_and_reloads_everything() -> anyhow::Result<()>
{
    let etcd = EtcdCluster::start().await?;
    let store = etcd.store_url("/killed");
    let mut set = Replicas::start(BIN, 3, &store, &[]).await?;
    let (s, _) = set.post(0, "/zones", &zone("z")).await?;
    assert_eq!(s, StatusCode::CREATED);
    wait_for("zone on replica 2", VISIBLE, || async {
        (set.get(2, "/zones/z").await.ok()?.0 == StatusCode::OK).then_some(())
    })
    .await?;

    // Writers on every replica; replica 2 is killed while they run. Every write
    // that was answered 201 must exist afterwards; the others may or may not.
    let writers = {
        let set = &set;
        futures::future::join_all((0..3).map(|i| async move {
            let mut acked = Vec::new();
            for n in 0..40 {
                let name = format!("w{i}-{n}");
                match set.post(i, "/clusters", &cluster("z", &name)).await {
                    Ok((StatusCode::CREATED, _)) => acked.push(("z".to_owned(), name)),
                    // Replica 2 is gone: its writer stops.
                    Err(_) if i == 2 => break,
                    Ok((s, b)) => panic!("replica {i} answered {s}: {b}"),
                    Err(e) => panic!("replica {i}: {e}"),
                }
            }
            acked
        }))
    };
    let killer = async {
        // Kill once replica 2 acknowledged some writes, so the kill lands mid-stream.
        wait_for("writes on replica 2", Duration::from_secs(30), || async {
            let n = registered(&set, 2).await.ok()?.len();
            (n >= 5).then_some(())
        })
        .await
        .expect("replica 2 writes");
        set.replicas[2].kill();
    };
    let (acked, ()) = tokio::join!(writers, killer);
    let acked: BTreeSet<(String, String)> = acked.into_iter().flatten().collect();
    assert!(acked.len() >= 80, "writes acknowledged: {}", acked.len());
    // A write acknowledged by one replica shows on the others within 1 s (the last
    // ones were acknowledged just now).
    for i in [0, 1] {
        let shown = wait_for(&format!("every acknowledged write on {i}"), VISIBLE, || {
            let acked = &acked;
            let set = &set;
            async move {
                acked
                    .is_subset(&registered(set, i).await.ok()?)
                    .then_some(())
            }
        })
        .await;
        if shown.is_err() {
            let have = registered(&set, i).await?;
            let missing: Vec<_> = acked.difference(&have).collect();
            panic!("replica {i} lacks {missing:?} after {VISIBLE:?}");
        }
    }

    // Restarted, it reloads everything (including writes made while it was down).
    let (s, _) = set
        .post(0, "/clusters", &cluster("z", "while-down"))
        .await?;
    assert_eq!(s, StatusCode::CREATED);
    set.restart(2)?;
    set.wait_ready(2).await?;
    let have = registered(&set, 2).await?;
    let missing: Vec<_> = acked.difference(&have).collect();
    assert!(missing.is_empty(), "restarted replica lacks {missing:?}");
    assert!(have.contains(&("z".to_owned(), "while-down".to_owned())));
    assert_eq!(have, registered(&set, 0).await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_loss_refuses_writes_keeps_reads_and_readiness() -> anyhow::Result<()> {
    let mut etcd = EtcdCluster::start().await?;
    let store = etcd.store_url("/quorum");
    let mut set = Replicas::start(BIN, 2, &store, &[]).await?;
    assert_eq!(
        set.post(0, "/zones", &zone("z")).await?.0,
        StatusCode::CREATED
    );
    assert_eq!(
        set.post(0, "/clusters", &cluster("z", "before")).await?.0,
        StatusCode::CREATED
    );
    wait_for("cluster on replica 1", VISIBLE, || async {
        let (s, _) = set.get(1, "/clusters/before").await.ok()?;
        (s == StatusCode::OK).then_some(())
    })
    .await?;

    etcd.stop(1);
    etcd.stop(2);
    // Writes answer 503 store_unavailable within 10 s, on every replica.
    for i in [0, 1] {
        let started = std::time::Instant::now();
        let (s, body) = set
            .post(i, "/clusters", &cluster("z", &format!("during-{i}")))
            .await?;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "replica {i}: {body}");
        assert_eq!(body["code"], "store_unavailable", "{body}");
        assert!(
            started.elapsed() < QUORUM,
            "503 after {:?}",
            started.elapsed()
        );
    }
    // Reads answer from memory; readiness stays.
    for i in [0, 1] {
        let (s, body) = set.get(i, "/clusters/before").await?;
        assert_eq!(s, StatusCode::OK, "{body}");
        assert_eq!(set.readyz(i).await, Some(StatusCode::OK));
    }

    // A replica started while etcd has no quorum is not ready: it has no catalog.
    let late = set.add(&store, &[])?;
    wait_for(
        "late replica answers /readyz",
        Duration::from_secs(20),
        || async { set.readyz(late).await },
    )
    .await
    .map(|s| assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE))?;

    etcd.restart(1).await?;
    etcd.restart(2).await?;
    etcd.wait_healthy_all().await?;
    // Writes work again within 10 s of quorum coming back.
    let mut n = 0;
    wait_for("writes accepted again", QUORUM, || {
        n += 1;
        let name = format!("after-{n}");
        let set = &set;
        async move {
            let (s, _) = set.post(0, "/clusters", &cluster("z", &name)).await.ok()?;
            (s == StatusCode::CREATED).then_some(())
        }
    })
    .await?;
    // The late replica loads the catalog and becomes ready.
    set.wait_ready(late).await?;
    let have = registered(&set, late).await?;
    assert!(
        have.contains(&("z".to_owned(), "before".to_owned())),
        "{have:?}"
    );
    Ok(())
}

/// etcd's current revision, through member `endpoint`'s JSON gateway.
async fn etcd_revision(endpoint: &str) -> anyhow::Result<i64> {
    let r: Value = reqwest::Client::new()
        .post(format!("http://{endpoint}/v3/kv/range"))
        .json(&json!({"key": "AA==", "limit": 1}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    r["header"]["revision"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no revision in {r}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_while_history_is_compacted_shows_exactly_etcd_again()
-> anyhow::Result<()> {
    let mut etcd = EtcdCluster::start().await?;
    let eps = etcd.endpoints();
    // Replica 0 reaches members 0 and 1; replica 1 only member 2, so stopping that
    // member cuts replica 1 off while the cluster keeps its quorum.
    let mut set = Replicas::start(
        BIN,
        1,
        &format!("etcd://{},{}/compact", eps[0], eps[1]),
        &[],
    )
    .await?;
    let cut = set.add(&format!("etcd://{}/compact", eps[2]), &[])?;
    set.wait_ready(cut).await?;
    assert_eq!(
        set.post(0, "/zones", &zone("z")).await?.0,
        StatusCode::CREATED
    );
    for name in ["kept", "gone"] {
        assert_eq!(
            set.post(0, "/clusters", &cluster("z", name)).await?.0,
            StatusCode::CREATED
        );
    }
    let before: BTreeSet<_> = [("z", "gone"), ("z", "kept")]
        .map(|(z, c)| (z.to_owned(), c.to_owned()))
        .into();
    wait_for("both clusters on the cut replica", VISIBLE * 5, || async {
        (registered(&set, cut).await.ok()? == before).then_some(())
    })
    .await?;

    etcd.stop(2);
    // Member 2 may have led: the others elect a leader before writes go on (a write
    // during the election may time out, as with any lost leader).
    etcd.wait_healthy_all().await?;
    // While it is cut off: a delete, a create, a replace, and the history of all
    // of them compacted away, so resuming its watch where it stopped is impossible.
    let (s, body) = set
        .send(0, Method::DELETE, "/clusters/gone?zoneName=z", None)
        .await?;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(
        set.post(0, "/clusters", &cluster("z", "new")).await?.0,
        StatusCode::CREATED
    );
    let mut kept = cluster("z", "kept");
    kept["owner"] = json!("another-team");
    let (s, body) = set
        .send(0, Method::PUT, "/clusters/kept", Some(&kept))
        .await?;
    assert_eq!(s, StatusCode::OK, "{body}");
    let revision = etcd_revision(&eps[0]).await?;
    reqwest::Client::new()
        .post(format!("http://{}/v3/kv/compaction", eps[0]))
        .json(&json!({"revision": revision.to_string(), "physical": true}))
        .send()
        .await?
        .error_for_status()?;
    // Nothing of it shows on the cut replica yet.
    assert_eq!(registered(&set, cut).await?, before);

    etcd.restart(2).await?;
    etcd.wait_healthy_all().await?;
    let after: BTreeSet<_> = [("z", "kept"), ("z", "new")]
        .map(|(z, c)| (z.to_owned(), c.to_owned()))
        .into();
    wait_for(
        "the cut replica lists etcd again",
        Duration::from_secs(20),
        || async { (registered(&set, cut).await.ok()? == after).then_some(()) },
    )
    .await?;
    let (s, c) = set.get(cut, "/clusters/kept").await?;
    assert_eq!(s, StatusCode::OK, "{c}");
    assert_eq!(c[0]["owner"], "another-team", "{c}");
    // And it follows the watch again from there.
    assert_eq!(
        set.post(0, "/clusters", &cluster("z", "later")).await?.0,
        StatusCode::CREATED
    );
    wait_for("a later write on the cut replica", VISIBLE * 5, || async {
        (set.get(cut, "/clusters/later").await.ok()?.0 == StatusCode::OK).then_some(())
    })
    .await?;
    Ok(())
}

/// Status and instance names of (zone, cluster) on replica `i`.
async fn shown(
    set: &Replicas,
    i: usize,
    zone: &str,
    name: &str,
) -> Option<(String, Vec<String>, Value)> {
    let (s, body) = set
        .get(i, &format!("/clusters/{name}?zoneName={zone}"))
        .await
        .ok()?;
    if s != StatusCode::OK {
        return None;
    }
    let c = body.get(0)?.clone();
    Some((
        c["status"].as_str()?.to_owned(),
        meshcat_tests::mesh::instance_names(&c),
        c,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_shows_every_instance_and_a_killed_owner_hands_over() -> anyhow::Result<()> {
    // The defaults: `--instance-ttl` 15 s, agent interval 5 s. A killed replica is
    // noticed within two intervals (the next report goes unacknowledged for one
    // interval), the next replica is tried at once, and the dead replica's lease,
    // kept alive every second, ends at least 14 s after its death.
    const TTL: Duration = Duration::from_secs(15);
    const INTERVAL: &str = "5s";
    let etcd = EtcdCluster::start().await?;
    let set = Replicas::start(BIN, 3, &etcd.store_url("/instances"), &[]).await?;
    assert_eq!(
        set.post(0, "/zones", &zone("z")).await?.0,
        StatusCode::CREATED
    );
    let mut svc = cluster("z", "svc");
    svc["minInstances"] = json!(1);
    svc["version"] = json!("1.0");
    assert_eq!(set.post(0, "/clusters", &svc).await?.0, StatusCode::CREATED);

    // One real sidecar, its agent reporting to replica 2 first, then 0, then 1.
    let sidecar = meshcat_tests::Sidecar::start().await?;
    let agent = svc_agent(
        &set,
        &[2, 0, 1],
        &sidecar,
        INTERVAL,
        &["--scrape-timeout", "1s"],
    )
    .await?;

    // Every replica shows the instance with the same status and start time.
    let mut seen = Vec::new();
    for i in 0..3 {
        let (status, names, c) = wait_for(
            &format!("i1 on replica {i}"),
            Duration::from_secs(20),
            || async {
                shown(&set, i, "z", "svc")
                    .await
                    .filter(|(_, n, _)| n == &["i1"])
            },
        )
        .await?;
        seen.push((status, meshcat_tests::mesh::start_time(&c, "i1")));
        let _ = names;
    }
    assert!(seen.iter().all(|s| *s == seen[0]), "{seen:?}");
    assert_eq!(seen[0].0, "stable", "{seen:?}");
    let start = seen[0].1.expect("start time");
    assert!(sidecar.started_at(start), "start time {start}");

    // Metrics and the sidecar's log level through replicas that do not own it
    // (the agent reports to replica 2): forwarded to the owner.
    sidecar.send("/", 3, 200).await?;
    for i in [0, 1] {
        let (s, m) = set.get(i, "/metrics/svc/i1?zoneName=z").await?;
        assert_eq!(s, StatusCode::OK, "replica {i}: {m}");
        assert!(m.is_object(), "replica {i}: {m}");
        let (s, m) = set.get(i, "/metrics/svc/1.0/i1").await?;
        assert_eq!(s, StatusCode::OK, "replica {i} by version: {m}");
        assert!(m.is_object(), "replica {i} by version: {m}");
    }
    let (s, _) = set.get(2, "/metrics/svc/i1?zoneName=z").await?;
    assert_eq!(s, StatusCode::OK);
    let (s, body) = set
        .send(
            0,
            Method::PUT,
            "/zones/z/clusters/svc/instances/i1/logging?level=debug",
            None,
        )
        .await?;
    assert_eq!(s, StatusCode::OK, "{body}");
    // Read back through another non-owner, and from Envoy itself.
    let level = reqwest::get(format!(
        "{}/zones/z/clusters/svc/instances/i1/logging",
        set.replicas[1].api_url()
    ))
    .await?
    .text()
    .await?;
    assert_eq!(level.trim(), "debug");
    let envoy_levels = reqwest::Client::new()
        .post(format!("http://{}/logging", sidecar.envoy.admin_addr()))
        .send()
        .await?
        .text()
        .await?;
    assert!(envoy_levels.contains("debug"), "{envoy_levels}");
    // The cluster-wide level change through a non-owner reaches the owner's instance,
    // and so does a debug window.
    cluster_commands_reach_i1(&set, (1, 0), "svc").await?;
    // The diagnosis through a non-owner reads the owner's sidecar evidence: the
    // same verdicts as through the owner, and the instance named in its evidence.
    let mut verdicts = Vec::new();
    for i in [0, 2] {
        let (s, report) = set.get(i, "/diagnose/svc?zoneName=z").await?;
        assert_eq!(s, StatusCode::OK, "replica {i}: {report}");
        let text = report.to_string();
        assert!(
            !text.contains("cluster svc has no live instance"),
            "replica {i} missed the instance: {report}"
        );
        assert!(
            text.contains("service i1: local_service::"),
            "replica {i} read no sidecar evidence: {report}"
        );
        assert!(
            text.contains("live instances = 1"),
            "replica {i} missed the instance's metrics: {report}"
        );
        let steps: Vec<(String, String)> = report["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .map(|st| (st["name"].to_string(), st["verdict"].to_string()))
            .collect();
        verdicts.push(steps);
    }
    assert_eq!(verdicts[0], verdicts[1]);
    // The replicas' evidence route answers peers only.
    let (s, body) = set
        .get(0, "/peer/evidence?zoneName=z&clusterName=svc&instance=i1")
        .await?;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");
    // A forged forwarding header is refused.
    let forged = reqwest::Client::new()
        .get(format!(
            "{}/metrics/svc/i1?zoneName=z",
            set.replicas[1].api_url()
        ))
        .header("x-meshcat-forwarded", "not-the-secret")
        .send()
        .await?;
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);

    // The owner (replica 2) is killed: the agent moves on within two intervals, the
    // instance stays shown on 0 and 1 and the cluster never shows down.
    set.replicas[2].kill();
    let deadline = TTL + Duration::from_secs(2 * 5);
    let until = std::time::Instant::now() + deadline + Duration::from_secs(1);
    while std::time::Instant::now() < until {
        for i in [0, 1] {
            let (status, names, c) = shown(&set, i, "z", "svc").await.expect("cluster shown");
            assert_ne!(status, "down", "replica {i} showed svc down: {c}");
            assert_eq!(names, ["i1"], "replica {i}: {c}");
            assert_eq!(meshcat_tests::mesh::start_time(&c, "i1"), Some(start));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Past the dead owner's lease, the instance is still there: its new replica
    // published it.
    for i in [0, 1] {
        let (status, names, _) = shown(&set, i, "z", "svc").await.expect("cluster shown");
        assert_eq!((status.as_str(), names), ("stable", vec!["i1".to_owned()]));
    }
    agent.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_over_tls_reach_etcd_with_a_client_certificate_and_forward_over_https()
-> anyhow::Result<()> {
    let etcd = EtcdCluster::start_tls(1).await?;
    let tls = etcd.tls().expect("a TLS cluster").clone();
    let ca = tls.ca_file.display().to_string();
    let store = etcd.store_url("/tls");
    // Every replica's API over HTTPS, with a certificate for its advertised address
    // signed by a CA the others trust.
    let certs_dir = tempfile::tempdir()?;
    let api_ca = meshcat_tests::certs::MeshCerts::new(certs_dir.path(), "api")?;
    let api_id = api_ca.identity("127.0.0.1")?;
    let api_cert = api_id.cert_file.display().to_string();
    let api_key = api_id.key_file.display().to_string();
    let peer_ca = api_ca.ca_file.display().to_string();
    // API tokens: a non-owner refuses a caller the owner would refuse without
    // forwarding it.
    let mut api_tls: Vec<String> = [
        "--api-tls-cert",
        &api_cert,
        "--api-tls-key",
        &api_key,
        "--peer-ca-file",
        &peer_ca,
    ]
    .map(str::to_owned)
    .into();
    api_tls.extend(token_flags(
        certs_dir.path(),
        "replica-read-token",
        "replica-write-token",
    )?);
    let flags = [etcd_client_flags(&tls), api_tls.clone()].concat();
    let mut set = Replicas::start_https(BIN, 2, &store, &strs(&flags), &api_ca.ca_file).await?;
    set.token = Some("replica-write-token".into());
    // A write through one replica is committed over TLS and read by the other's watch.
    assert_eq!(
        set.post(0, "/zones", &zone("z")).await?.0,
        StatusCode::CREATED
    );
    wait_for("zone z on replica 1", VISIBLE * 5, || async {
        (set.get(1, "/zones/z").await.ok()?.0 == StatusCode::OK).then_some(())
    })
    .await?;
    // The API speaks only TLS.
    let plain = reqwest::get(format!("http://{}/zones", set.replicas[0].api)).await;
    assert!(
        plain.is_err() || !plain.as_ref().is_ok_and(|r| r.status().is_success()),
        "plain HTTP answered: {plain:?}"
    );

    // An instance reported to replica 0 is read through replica 1: forwarded to its
    // owner over HTTPS, the owner's certificate verified against --peer-ca-file.
    assert_eq!(
        set.post(0, "/clusters", &cluster("z", "svc")).await?.0,
        StatusCode::CREATED
    );
    let sidecar = meshcat_tests::Sidecar::start().await?;
    let agent = svc_agent(&set, &[0], &sidecar, "1s", &[]).await?;
    wait_for("i1 on replica 1", Duration::from_secs(20), || async {
        shown(&set, 1, "z", "svc")
            .await
            .filter(|(_, n, _)| n == &["i1"])
    })
    .await?;
    let (s, m) = set.get(1, "/metrics/svc/i1?zoneName=z").await?;
    assert_eq!(s, StatusCode::OK, "{m}");
    assert!(m.is_object(), "{m}");
    // The read token is enough to read it through the non-owner.
    set.token = Some("replica-read-token".into());
    let (s, m) = set.get(1, "/metrics/svc/i1?zoneName=z").await?;
    assert_eq!(s, StatusCode::OK, "{m}");
    // Without a token, or with the read token for a change, the non-owner answers
    // as the owner would, and the owner (replica 0) never sees the request.
    let (rendering, before) = refused_requests(&set, 0, None).await?;
    let (s, body) = set
        .send(
            1,
            Method::PUT,
            "/zones/z/clusters/svc/instances/i1/logging?level=debug",
            None,
        )
        .await?;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{body}");
    set.token = None;
    let (s, body) = set.get(1, "/metrics/svc/i1?zoneName=z").await?;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(
        refused_requests(&set, 0, Some(rendering)).await?.1,
        before,
        "a refused request was forwarded"
    );
    set.token = Some("replica-write-token".into());
    agent.stop().await?;

    // Without a client certificate etcd refuses the replica: it answers on its API
    // but is never handed the catalog, and its writes are not acknowledged.
    let bare_flags = [vec!["--etcd-ca-file".to_owned(), ca], api_tls].concat();
    let bare = set.add(&store, &strs(&bare_flags))?;
    let status = wait_for(
        "the replica without a certificate answers",
        Duration::from_secs(20),
        || async { set.readyz(bare).await },
    )
    .await?;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (s, body) = set.post(bare, "/zones", &zone("y")).await?;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["code"], "store_unavailable", "{body}");
    assert_eq!(set.get(0, "/zones/y").await?.0, StatusCode::NOT_FOUND);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_one_replica_follows_changes_made_through_another() -> anyhow::Result<()> {
    // Generous for a real sidecar and agent on a loaded machine; the stream waits on
    // the event itself, never on time.
    const EVENT: Duration = Duration::from_secs(20);
    let etcd = EtcdCluster::start_n(1).await?;
    let set = Replicas::start(BIN, 2, &etcd.store_url("/events"), &[]).await?;
    assert_eq!(
        set.post(0, "/zones", &zone("z")).await?.0,
        StatusCode::CREATED
    );
    wait_for("zone on replica 1", VISIBLE, || async {
        (set.get(1, "/zones/z").await.ok()?.0 == StatusCode::OK).then_some(())
    })
    .await?;
    // The stream is on replica 1; every write and the agent go through replica 0.
    let url = format!("{}/events?zoneName=z", set.replicas[1].api_url());
    let mut b = EventStream::open(&url, &[]).await?;

    let mut svc = cluster("z", "svc");
    svc["minInstances"] = json!(1);
    assert_eq!(set.post(0, "/clusters", &svc).await?.0, StatusCode::CREATED);
    let created = b
        .until(EVENT, |e| e.is_cluster("svc"))
        .await?
        .expect("cluster event");
    assert_eq!(created.data["zoneName"], "z");
    assert_eq!(created.data["owner"], "team");
    assert_eq!(created.data["status"], "down");
    assert_eq!(created.data["instances"], json!([]));

    // An agent reporting to replica 0 only: replica 1's stream shows its instance
    // and the status it makes.
    let sidecar = meshcat_tests::Sidecar::start().await?;
    let agent = svc_agent(&set, &[0], &sidecar, "500ms", &[]).await?;
    let up = b
        .until(EVENT, |e| {
            e.is_cluster("svc")
                && e.data["status"] == "stable"
                && e.data["instances"][0]["name"] == "i1"
        })
        .await?
        .expect("instance event");
    let start = up.data["instances"][0]["startTime"]
        .as_i64()
        .expect("start time");
    assert!(sidecar.started_at(start), "start time {start}");
    assert!(up.id > created.id, "{:?} after {:?}", up.id, created.id);
    // The event matches what replica 1 answers now.
    let (_, now) = set.get(1, "/clusters/svc?zoneName=z").await?;
    assert_eq!(up.data, now[0]);

    // Deleted through replica 0: replica 1's stream says so.
    let (s, body) = set
        .send(0, Method::DELETE, "/clusters/svc?zoneName=z", None)
        .await?;
    assert!(s.is_success(), "DELETE: {s} {body}");
    let gone = b
        .until(EVENT, |e| e.event == "cluster-deleted")
        .await?
        .expect("cluster-deleted event");
    assert_eq!(gone.data, json!({"clusterName": "svc", "zoneName": "z"}));
    assert!(gone.id > up.id);
    agent.stop().await?;
    Ok(())
}

/// The request head a stand-in for the owning replica received, and the answer it
/// gave: an HTML page, which must never be served on the API's origin.
async fn stand_in_owner(
    listener: tokio::net::TcpListener,
) -> anyhow::Result<(String, tokio::net::TcpStream)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut conn, _) = listener.accept().await?;
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf).await?;
        anyhow::ensure!(n > 0, "the request ended before its head");
        head.extend_from_slice(&buf[..n]);
    }
    let page = "<html><script>alert(1)</script></html>";
    let answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
        page.len()
    );
    conn.write_all(answer.as_bytes()).await?;
    Ok((String::from_utf8_lossy(&head).into_owned(), conn))
}

/// Replicas on etcd with TLS and client certificates. A request passed on to the
/// owning replica never carries the caller's token: it carries the access the front
/// replica granted, signed with the replicas' secret, and a signature is good once.
/// Whoever rewrites a replica's address in etcd gets no token, only a signed request;
/// an address that is not `host:port` is ignored; an answer that is not JSON goes out
/// as plain text. A HEAD without a token is refused by the front replica too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_requests_are_signed_never_carry_the_token_and_replay_fails() -> anyhow::Result<()>
{
    let etcd = EtcdCluster::start_tls(1).await?;
    let tls = etcd.tls().expect("a TLS cluster").clone();
    let tokens = tempfile::tempdir()?;
    let flags = [
        etcd_client_flags(&tls),
        token_flags(tokens.path(), "sig-read-token", "sig-write-token")?,
    ]
    .concat();
    let mut set = Replicas::start(BIN, 2, &etcd.store_url("/sig"), &strs(&flags)).await?;
    set.token = Some("sig-write-token".into());
    assert_eq!(
        set.post(0, "/zones", &zone("z")).await?.0,
        StatusCode::CREATED
    );
    assert_eq!(
        set.post(0, "/clusters", &cluster("z", "svc")).await?.0,
        StatusCode::CREATED
    );
    let sidecar = meshcat_tests::Sidecar::start().await?;
    let agent = svc_agent(&set, &[0], &sidecar, "1s", &[]).await?;
    wait_for("i1 on replica 1", Duration::from_secs(20), || async {
        shown(&set, 1, "z", "svc")
            .await
            .filter(|(_, n, _)| n == &["i1"])
    })
    .await?;
    let metrics = "/metrics/svc/i1?zoneName=z";

    // Through the non-owner: a read with the read token, a change with the write
    // token, each on the access it was granted.
    set.token = Some("sig-read-token".into());
    let (s, m) = set.get(1, metrics).await?;
    assert_eq!(s, StatusCode::OK, "{m}");
    let logging = "/zones/z/clusters/svc/instances/i1/logging";
    let (s, body) = set
        .send(1, Method::PUT, &format!("{logging}?level=debug"), None)
        .await?;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{body}");
    set.token = Some("sig-write-token".into());
    let (s, body) = set
        .send(1, Method::PUT, &format!("{logging}?level=debug"), None)
        .await?;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(
        sidecar.envoy.uniform_log_level().await?.as_deref(),
        Some("debug"),
        "the owner's sidecar got the level"
    );

    // A HEAD without a token is refused by the replica it reached; the owner never
    // sees it.
    let (rendering, before) = refused_requests(&set, 0, None).await?;
    let head = reqwest::Client::new()
        .head(format!("{}{metrics}", set.replicas[1].api_url()))
        .send()
        .await?;
    assert_eq!(head.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        refused_requests(&set, 0, Some(rendering)).await?.1,
        before,
        "a HEAD was forwarded"
    );

    // Someone who reached etcd points the owner's address at a host of theirs.
    let listing = etcd.etcdctl(&["get", "--prefix", "/sig/replicas/"])?;
    let lines: Vec<&str> = listing.lines().collect();
    let owner_key = lines
        .chunks(2)
        .find(|kv| kv.get(1) == Some(&set.replicas[0].api.to_string().as_str()))
        .map(|kv| kv[0].to_owned())
        .ok_or_else(|| anyhow::anyhow!("replica 0 not registered: {listing}"))?;
    let rogue = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let rogue_addr = rogue.local_addr()?.to_string();
    etcd.etcdctl(&["put", &owner_key, &rogue_addr])?;
    let caught = tokio::spawn(stand_in_owner(rogue));
    set.token = Some("sig-read-token".into());
    let answer = wait_for(
        "the rewritten address in use",
        Duration::from_secs(10),
        || async {
            let r = reqwest::Client::new()
                .get(format!("{}{metrics}", set.replicas[1].api_url()))
                .bearer_auth("sig-read-token")
                .send()
                .await
                .ok()?;
            (r.status() == StatusCode::OK
                && r.headers()
                    .get("content-type")
                    .is_some_and(|t| t.as_bytes().starts_with(b"text/plain")))
            .then_some(r)
        },
    )
    .await?;
    assert_eq!(
        answer
            .headers()
            .get("x-content-type-options")
            .map(|v| v.as_bytes()),
        Some(&b"nosniff"[..])
    );
    let (head, _conn) = caught.await??;
    let head_lower = head.to_ascii_lowercase();
    assert!(
        !head_lower.contains("authorization") && !head.contains("sig-read-token"),
        "the caller's token travelled: {head}"
    );
    let signature = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("x-meshcat-forwarded:")
                .then(|| l.split_once(':').map(|(_, v)| v.trim().to_owned()))
        })
        .flatten()
        .ok_or_else(|| anyhow::anyhow!("no signature: {head}"))?;
    assert!(signature.starts_with("v1 read "), "{signature}");

    // An address that is not host:port is not taken: nothing is forwarded.
    etcd.etcdctl(&["put", &owner_key, "http://127.0.0.1:1/evil"])?;
    wait_for(
        "the bad address refused",
        Duration::from_secs(10),
        || async {
            let (s, body) = set.get(1, metrics).await.ok()?;
            (s == StatusCode::SERVICE_UNAVAILABLE && body["code"] == "owner_unreachable")
                .then_some(())
        },
    )
    .await?;
    etcd.etcdctl(&["put", &owner_key, &set.replicas[0].api.to_string()])?;

    // The owner takes the intercepted signature once, without any token, and never
    // again; the bare shared secret, as older replicas sent it, is refused.
    let direct = |value: &str| {
        reqwest::Client::new()
            .get(format!("{}{metrics}", set.replicas[0].api_url()))
            .header("x-meshcat-forwarded", value)
            .send()
    };
    assert_eq!(direct(&signature).await?.status(), StatusCode::OK);
    assert_eq!(direct(&signature).await?.status(), StatusCode::FORBIDDEN);
    let secret = etcd.etcdctl(&["get", "--print-value-only", "/sig/secret"])?;
    assert_eq!(direct(secret.trim()).await?.status(), StatusCode::FORBIDDEN);
    agent.stop().await?;
    Ok(())
}

/// A cluster nobody registered, whose only instance reports to replica 0, is known to
/// every replica: through replicas 1 and 2 (which do not own the instance) the
/// diagnosis reads its sidecar, and its log level and a debug window reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unregistered_cluster_owned_by_a_peer_is_reachable_through_every_replica()
-> anyhow::Result<()> {
    let etcd = EtcdCluster::start().await?;
    let mut set = Replicas::start(BIN, 3, &etcd.store_url("/ghost"), &[]).await?;
    set.token = None;
    assert_eq!(
        set.post(0, "/zones", &zone("z")).await?.0,
        StatusCode::CREATED
    );
    let sidecar = meshcat_tests::Sidecar::start().await?;
    let agent = agent_of(&set, &[0], &sidecar, "ghost", "1s", &[]).await?;
    for i in [1, 2] {
        wait_for(
            "the unregistered cluster on a peer",
            Duration::from_secs(20),
            || async {
                let (s, body) = set.get(i, "/services?zoneName=z").await.ok()?;
                (s == StatusCode::OK
                    && body
                        .as_array()?
                        .iter()
                        .any(|c| c["clusterName"] == "ghost" && c["instances"][0]["name"] == "i1"))
                .then_some(())
            },
        )
        .await?;
    }
    for i in [1, 2] {
        let (s, report) = set.get(i, "/diagnose/ghost?zoneName=z").await?;
        assert_eq!(s, StatusCode::OK, "replica {i}: {report}");
        assert!(
            report.to_string().contains("i1"),
            "replica {i}: the diagnosis did not read i1: {report}"
        );
        cluster_commands_reach_i1(&set, (i, i), "ghost").await?;
    }
    assert_eq!(
        sidecar.envoy.uniform_log_level().await?.as_deref(),
        Some("info")
    );
    agent.stop().await?;
    Ok(())
}

/// Contract section 14 on replicas: svc-a's agent reports to replica 0, svc-b's to
/// replica 1, and svc-a's sidecar names svc-b otherwise (`b-upstream`), so the edge
/// is found only through svc-b's listener, which another replica holds. Every
/// replica answers the same graph.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_answers_the_same_graph() -> anyhow::Result<()> {
    use meshcat_tests::bootstrap::{Cluster, HttpListener};
    use meshcat_tests::{Bootstrap, Envoy, Upstream};

    let etcd = EtcdCluster::start().await?;
    let mut set =
        Replicas::start(BIN, 3, &etcd.store_url("/graph"), &["--cluster-metrics"]).await?;
    set.token = None;
    assert_eq!(
        set.post(0, "/zones", &zone("z")).await?.0,
        StatusCode::CREATED
    );
    for (name, deps) in [("svc-a", json!(["svc-b"])), ("svc-b", json!([]))] {
        let mut c = cluster("z", name);
        c["dependencies"] = deps;
        assert_eq!(set.post(1, "/clusters", &c).await?.0, StatusCode::CREATED);
    }
    let b_service = Upstream::start().await?;
    let b = Envoy::start(Bootstrap::service_sidecar(b_service.addr, None)).await?;
    let a_service = Upstream::start().await?;
    let a = Envoy::start(
        Bootstrap::service_sidecar(a_service.addr, None)
            .listener(HttpListener::new("egress", "egress_http").route("/b", "b-upstream"))
            .cluster(Cluster::new("b-upstream", &[b.listener("ingress")])),
    )
    .await?;
    let agent_a = graph_agent(&set, 0, &a, "svc-a").await?;
    let agent_b = graph_agent(&set, 1, &b, "svc-b").await?;
    let client = reqwest::Client::new();
    // The shape every replica must agree on: edges with their flags, nodes with
    // their live instances.
    let shape = |g: &Value| -> Option<(Vec<Value>, Vec<Value>)> {
        let edges = g["edges"]
            .as_array()?
            .iter()
            .map(|e| json!([e["source"], e["target"], e["observed"], e["declared"]]))
            .collect();
        let nodes = g["nodes"]
            .as_array()?
            .iter()
            .map(|n| json!([n["id"], n["instances"]]))
            .collect();
        Some((edges, nodes))
    };
    let want = (
        vec![json!(["z/svc-a", "z/svc-b", true, true])],
        vec![json!(["z/svc-a", 1]), json!(["z/svc-b", 1])],
    );
    for i in 0..3 {
        let g = wait_for(
            &format!("replica {i}'s graph"),
            Duration::from_secs(30),
            || async {
                for _ in 0..3 {
                    let r = client.get(format!("{}/b", a.url("egress"))).send().await;
                    assert_eq!(r.ok()?.status(), 200);
                }
                let (s, g) = set.get(i, "/graph").await.ok()?;
                (s == StatusCode::OK && shape(&g).as_ref() == Some(&want)).then_some(g)
            },
        )
        .await?;
        let e = &g["edges"][0];
        assert!(e["requests"].as_u64() > Some(0), "replica {i}: {g}");
    }

    // The ops port (docs/metrics.md, "With replicas on etcd"): every replica
    // exposes the same cluster series; the edge's counters count each replica's
    // own agents, so only replica 0, where svc-a's agent reports, counts its calls.
    let scrape = |i: usize| {
        let url = format!("{}/metrics", set.replicas[i].ops_url());
        let client = &client;
        async move { client.get(url).send().await?.text().await }
    };
    let cluster_lines = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("meshcat_cluster_"))
            .map(str::to_owned)
            .collect()
    };
    let edge = [
        ("source_zone", "z"),
        ("source", "svc-a"),
        ("target_zone", "z"),
        ("target", "svc-b"),
    ];
    let texts = wait_for(
        "the same cluster series on every replica",
        Duration::from_secs(30),
        || async {
            let mut texts = Vec::new();
            for i in 0..3 {
                texts.push(scrape(i).await.ok()?);
            }
            let first = cluster_lines(&texts[0]);
            let stable = r#"meshcat_cluster_status{zone="z",cluster="svc-a",owner="team",status="stable"} 1"#;
            (first.iter().any(|l| l == stable)
                && texts.iter().all(|t| cluster_lines(t) == first))
            .then_some(texts)
        },
    )
    .await?;
    let counted: Vec<f64> = texts
        .iter()
        .map(|t| metric_sum(t, "meshcat_edge_requests_total", &edge).unwrap_or(f64::NAN))
        .collect();
    assert!(counted[0] > 0.0, "{counted:?}");
    assert_eq!(&counted[1..], [0.0, 0.0], "{counted:?}");
    agent_a.stop().await?;
    agent_b.stop().await?;
    Ok(())
}

/// An agent of `envoy` as the one instance of `cluster` in zone z, reporting to
/// replica `i`.
async fn graph_agent(
    set: &Replicas,
    i: usize,
    envoy: &meshcat_tests::Envoy,
    cluster: &str,
) -> anyhow::Result<meshcat_tests::MeshAgent> {
    let mut args = set.agent_args(&[i]);
    args.extend(
        [
            "--sidecar-admin",
            &envoy.admin_addr(),
            "--zone",
            "z",
            "--cluster",
            cluster,
            "--instance",
            &format!("{cluster}-1"),
            "--interval",
            "300ms",
        ]
        .map(str::to_owned),
    );
    meshcat_tests::MeshAgent::start(&args).await
}

/// `GET /status` on replicas (what `meshcat check` reads): each answers for itself.
/// The agent reports to replica 0, which counts it among its agents; replica 1 shows
/// the zone's instance as reported through a peer, so the zone is still seen as
/// reported there. Each names itself and its store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_replica_tells_its_own_agents_and_the_instances_its_peers_report() -> anyhow::Result<()>
{
    let etcd = EtcdCluster::start().await?;
    let set = Replicas::start(BIN, 2, &etcd.store_url("/status"), &[]).await?;
    assert_eq!(
        set.post(0, "/zones", &zone("z")).await?.0,
        StatusCode::CREATED
    );
    let sidecar = meshcat_tests::Sidecar::start().await?;
    let agent = agent_of(&set, &[0], &sidecar, "svc", "1s", &[]).await?;
    let zone_z = |status: &Value| {
        status["zones"]
            .as_array()
            .and_then(|z| z.iter().find(|z| z["zoneName"] == "z").cloned())
    };
    let on_peer = wait_for(
        "the instance in replica 1's status",
        Duration::from_secs(20),
        || async {
            let (s, body) = set.get(1, "/status").await.ok()?;
            (s == StatusCode::OK && zone_z(&body)?["peerInstances"] == 1).then_some(body)
        },
    )
    .await?;
    assert_eq!(
        zone_z(&on_peer),
        Some(
            json!({"zoneName": "z", "registered": true, "agents": 0, "instances": 0, "peerInstances": 1})
        ),
        "{on_peer}"
    );
    assert_eq!(on_peer["agentsConnected"], 0, "{on_peer}");
    let (s, own) = set.get(0, "/status").await?;
    assert_eq!(s, StatusCode::OK, "{own}");
    assert_eq!(
        zone_z(&own),
        Some(
            json!({"zoneName": "z", "registered": true, "agents": 1, "instances": 1, "peerInstances": 0})
        ),
        "{own}"
    );
    assert_eq!(own["agentsConnected"], 1, "{own}");
    for status in [&own, &on_peer] {
        assert_eq!(status["store"], "etcd", "{status}");
        assert_eq!(status["ready"], true, "{status}");
        assert!(status["replica"].is_string(), "{status}");
    }
    assert_ne!(own["replica"], on_peer["replica"]);
    agent.stop().await?;
    Ok(())
}

/// Contract section 19: the same identity inventory on every replica. The agent of a
/// sidecar with a certificate reports to replica 0; every replica lists the same
/// certificates, shows the same identity on the record, and counts them alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_lists_the_same_certificates() -> anyhow::Result<()> {
    use meshcat_tests::bootstrap::Tls;
    use meshcat_tests::certs::CertSpec;
    use meshcat_tests::{Bootstrap, Envoy, MeshCerts, Upstream};

    let etcd = EtcdCluster::start().await?;
    let mut set =
        Replicas::start(BIN, 3, &etcd.store_url("/certs"), &["--cluster-metrics"]).await?;
    set.token = None;
    assert_eq!(
        set.post(0, "/zones", &zone("z")).await?.0,
        StatusCode::CREATED
    );
    assert_eq!(
        set.post(1, "/clusters", &cluster("z", "svc")).await?.0,
        StatusCode::CREATED
    );
    let dir = tempfile::tempdir()?;
    let certs = MeshCerts::new(dir.path(), "replicas")?;
    let id = certs.issue(&CertSpec::valid_for(
        "svc",
        "svc.z",
        "spiffe://z.local/ns/z/sa/svc",
        Duration::from_secs(3 * 86_400),
    ))?;
    let upstream = Upstream::start().await?;
    let envoy = Envoy::start(Bootstrap::service_sidecar(
        upstream.addr,
        Some(Tls::new(&certs, id, None)),
    ))
    .await?;
    let agent = graph_agent(&set, 0, &envoy, "svc").await?;
    let mut answers = Vec::new();
    for i in 0..3 {
        let rows = wait_for(
            &format!("replica {i}'s certificates"),
            Duration::from_secs(30),
            || async {
                let (s, rows) = set.get(i, "/certificates").await.ok()?;
                (s == StatusCode::OK && rows.as_array()?.len() == 2).then_some(rows)
            },
        )
        .await?;
        let (_, record) = set.get(i, "/clusters/svc?zoneName=z").await?;
        assert_eq!(
            record[0]["identity"]["state"], "expiring",
            "replica {i}: {record}"
        );
        assert_eq!(
            record[0]["instances"][0]["identity"]["serial"],
            rows.as_array()
                .unwrap()
                .iter()
                .find(|r| r["role"] == "chain")
                .unwrap()["serial"],
            "replica {i}"
        );
        answers.push(rows);
    }
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:#?}");
    assert_eq!(answers[0][0]["state"], "expiring", "{}", answers[0]);
    for i in 0..3 {
        let url = format!("{}/metrics", set.replicas[i].ops_url());
        let text = reqwest::get(url).await?.text().await?;
        assert_eq!(
            metric_sum(&text, "meshcat_certificates", &[("state", "expiring")]),
            Some(1.0),
            "replica {i}"
        );
        assert_eq!(
            metric_sum(
                &text,
                "meshcat_cluster_identity",
                &[("cluster", "svc"), ("state", "expiring")]
            ),
            Some(1.0),
            "replica {i}"
        );
    }
    agent.stop().await?;
    Ok(())
}
