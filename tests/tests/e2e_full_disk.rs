//! A full disk, for real (contract section 10, round 4): the data directory on a
//! tmpfs the test mounts, fills to its last byte and grows while the aggregator runs;
//! etcd's own full disk through a tiny `--quota-backend-bytes`. A write that cannot be
//! stored answers 507 `insufficient_storage` naming the cause, never 500; reads,
//! ingest, live updates and the history's readers go on; `/readyz` stays 200 and
//! `meshcat_store_writable` says 0; once space returns, writes succeed again within
//! 10 s without a restart, and nothing acknowledged is lost, before or after.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use meshcat_aggregator::history::{
    DB_FILE, Detail, History, HistoryConfig, HistoryMetrics, Kind, Pending, Query,
};
use meshcat_tests::etcd::EtcdCluster;
use meshcat_tests::mesh::{instance_names, metric_sum};
use meshcat_tests::replicas::Replicas;
use meshcat_tests::sse::EventStream;
use meshcat_tests::tmpfs::Tmpfs;
use meshcat_tests::{Catalog, MeshAgent, Sidecar, wait_for};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The contract's bound on healing: writes succeed within this of space returning.
const HEAL: Duration = Duration::from_secs(10);
const DEADLINE: Duration = Duration::from_secs(20);

/// A registration of cluster `name` in zone `z`, with a description that makes each
/// record take a few KiB.
fn record(name: &str) -> Value {
    json!({
        "zoneName": "z", "clusterName": name, "name": name,
        "description": "x".repeat(4000),
    })
}

/// `POST /clusters` with `body`: the status and the answer.
async fn post(http: &reqwest::Client, api: &str, body: &Value) -> (StatusCode, Value) {
    let r = http
        .post(format!("{api}/clusters"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The cluster names `GET /clusters` lists.
async fn listed(http: &reqwest::Client, api: &str) -> BTreeSet<String> {
    let r = http.get(format!("{api}/clusters")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.json::<Vec<Value>>()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c["clusterName"].as_str().unwrap().to_owned())
        .collect()
}

/// A refusal for lack of space: 507, its code, the cause named.
fn assert_full(status: StatusCode, answer: &Value, cause: &str) {
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE, "{answer}");
    assert_eq!(answer["code"], "insufficient_storage", "{answer}");
    let message = answer["error"].as_str().unwrap_or_default();
    assert!(message.contains(cause), "the cause is not named: {message}");
}

/// Registers clusters until one is refused: every one before is acknowledged. The
/// refusal must be the full disk's 507, never another error.
async fn register_until_full(
    http: &reqwest::Client,
    api: &str,
    prefix: &str,
    cause: &str,
    acknowledged: &mut BTreeSet<String>,
) {
    for i in 0..5000 {
        let name = format!("{prefix}-{i}");
        let (status, answer) = post(http, api, &record(&name)).await;
        if status == StatusCode::CREATED {
            acknowledged.insert(name);
            continue;
        }
        assert_full(status, &answer, cause);
        return;
    }
    panic!("5000 registrations of a few KiB fitted on the full disk");
}

/// Polls registrations from the moment space returned until one is acknowledged,
/// within [`HEAL`]; answers how long it took.
async fn until_healed(
    http: &reqwest::Client,
    api: &str,
    prefix: &str,
    cause: &str,
    acknowledged: &mut BTreeSet<String>,
) -> Duration {
    let back = Instant::now();
    for i in 0.. {
        let name = format!("{prefix}-{i}");
        let (status, answer) = post(http, api, &record(&name)).await;
        if status == StatusCode::CREATED {
            acknowledged.insert(name);
            return back.elapsed();
        }
        assert_full(status, &answer, cause);
        assert!(
            back.elapsed() < HEAL,
            "writes still refused {HEAL:?} after space returned: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    unreachable!()
}

async fn ops_metric(http: &reqwest::Client, ops: &str, name: &str) -> Option<f64> {
    let text = http
        .get(format!("{ops}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    metric_sum(&text, name, &[])
}

/// Waits until `meshcat_store_writable` says `want`.
async fn writable(http: &reqwest::Client, ops: &str, want: bool) {
    let want = if want { 1.0 } else { 0.0 };
    wait_for(&format!("meshcat_store_writable {want}"), HEAL, || async {
        (ops_metric(http, ops, "meshcat_store_writable").await == Some(want)).then_some(())
    })
    .await
    .unwrap();
}

async fn readyz(http: &reqwest::Client, ops: &str) -> StatusCode {
    http.get(format!("{ops}/readyz"))
        .send()
        .await
        .unwrap()
        .status()
}

/// The embedded store on a tmpfs of 24 MiB: filled while the aggregator runs, the
/// registration that finds no space answers 507; reads, ingest (a real agent whose
/// sidecar joins while the disk is full), live updates and history reads go on;
/// grown to 96 MiB, writes come back without a restart, and a restart afterwards
/// finds every acknowledged registration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_507_keeps_reads_and_heals_without_a_restart() {
    // Declared first, so it is unmounted last, after the aggregator stopped.
    let disk = Tmpfs::mount(24).unwrap();
    let data = disk.path().join("data");
    let mut catalog = Catalog::start(|c| c.store.data_dir = data.clone())
        .await
        .unwrap();
    let (api, ops) = (catalog.api_url(), catalog.ops_url());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap();
    catalog.register_zone("z", "").await.unwrap();
    catalog
        .register_cluster("z", "web", json!({}))
        .await
        .unwrap();
    let mut acknowledged: BTreeSet<String> = ["web".to_owned()].into();
    assert_eq!(
        ops_metric(&http, &ops, "meshcat_store_writable").await,
        Some(1.0)
    );

    disk.fill().unwrap();
    register_until_full(
        &http,
        &api,
        "full",
        "No space left on device",
        &mut acknowledged,
    )
    .await;
    let (status, answer) = post(&http, &api, &record("refused")).await;
    assert_full(status, &answer, "No space left on device");
    // The ops port serves one rendering for a moment: the next one says so.
    writable(&http, &ops, false).await;
    assert_eq!(readyz(&http, &ops).await, StatusCode::OK, "ready for reads");
    assert_eq!(listed(&http, &api).await, acknowledged);
    let (status, _) = catalog.get("/history?limit=10").await.unwrap();
    assert_eq!(status, StatusCode::OK, "the history's readers go on");

    // Ingest and live updates go on: a sidecar joins while the disk is full, and a
    // stream open before sees its cluster change.
    let mut events = EventStream::open(&format!("{api}/events"), &[])
        .await
        .unwrap();
    let sidecar = Sidecar::start().await.unwrap();
    let _agent = MeshAgent::for_sidecar(&catalog, &sidecar, "z", "web", "web-1", "200ms")
        .await
        .unwrap();
    catalog
        .wait_cluster("the sidecar listed", "z", "web", DEADLINE, |c| {
            instance_names(c) == ["web-1"]
        })
        .await
        .unwrap();
    events
        .until(DEADLINE, |e| e.is_cluster("web"))
        .await
        .unwrap()
        .expect("a cluster event");

    disk.resize(96).unwrap();
    let took = until_healed(
        &http,
        &api,
        "back",
        "No space left on device",
        &mut acknowledged,
    )
    .await;
    eprintln!("writes taken again {took:?} after space returned");
    writable(&http, &ops, true).await;
    for i in 0..3 {
        let name = format!("after-{i}");
        let (status, answer) = post(&http, &api, &record(&name)).await;
        assert_eq!(status, StatusCode::CREATED, "{answer}");
        acknowledged.insert(name);
    }
    assert_eq!(listed(&http, &api).await, acknowledged);

    // Nothing acknowledged is lost: a restart reads every registration back.
    catalog.restart().await.unwrap();
    assert_eq!(listed(&http, &api).await, acknowledged);
}

/// The history on a full disk: once its commits find no space it stops appending,
/// counts what it dropped and says so (`meshcat_history_writable` 0), its readers go
/// on with everything stored before, and it appends again once space returns.
#[test]
fn the_history_on_a_full_disk_drops_counts_and_resumes() {
    let disk = Tmpfs::mount(16).unwrap();
    let metrics = HistoryMetrics::unregistered();
    let history = History::open(
        disk.path(),
        DB_FILE,
        HistoryConfig::default(),
        metrics.clone(),
    )
    .unwrap();
    let entry = |i: usize| {
        Pending::new(
            Kind::ClusterUpdated,
            "z",
            &format!("c-{i}"),
            "",
            Detail::Changed {
                changed: vec!["description".repeat(20); 8],
            },
        )
    };
    let all = Query {
        limit: 100_000,
        ..Query::default()
    };
    for i in 0..100 {
        history.record(entry(i));
    }
    history.flush();
    assert_eq!(metrics.appended.get(), 100);

    disk.fill().unwrap();
    // Batches until one finds no space (the database may have free pages left).
    let mut batches = 0;
    while metrics.writable.get() == 1 {
        batches += 1;
        assert!(batches < 1000, "the history never found the disk full");
        for i in 0..256 {
            history.record(entry(i));
        }
        history.flush();
    }
    let stored = metrics.appended.get();
    let dropped = metrics.dropped.get();
    assert!(dropped > 0);
    // More is dropped and counted, nothing appended; the readers see what was stored.
    history.record(entry(0));
    history.flush();
    assert_eq!(metrics.appended.get(), stored);
    assert_eq!(metrics.dropped.get(), dropped + 1);
    let before = history.db().query(&all).unwrap().rows;
    assert_eq!(before.len() as u64, stored);

    disk.resize(64).unwrap();
    let back = Instant::now();
    while metrics.appended.get() == stored {
        assert!(back.elapsed() < HEAL, "the history did not resume");
        history.record(entry(1));
        history.flush();
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "history appends again {:?} after space returned",
        back.elapsed()
    );
    assert_eq!(metrics.writable.get(), 1);
    let after = history.db().query(&all).unwrap().rows;
    assert!(after[0].id > before[0].id);
    // Everything stored before is still there.
    let ids: BTreeSet<u64> = after.iter().map(|r| r.id).collect();
    assert!(before.iter().all(|r| ids.contains(&r.id)));
}

/// etcd's full disk: with a tiny `--quota-backend-bytes` filled, etcd raises its
/// `NOSPACE` alarm and refuses every write ("etcdserver: mvcc: database space
/// exceeded"); a registration answers 507 naming it, reads and readiness go on, and
/// once an operator frees space (delete, compact, defragment, disarm the alarm) writes
/// succeed again within 10 s, with nothing acknowledged lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_out_of_space_answers_507_and_heals() {
    let etcd = EtcdCluster::start_quota(4 << 20).await.unwrap();
    let set = Replicas::start(
        env!("CARGO_BIN_EXE_replica-aggregator"),
        1,
        &etcd.store_url("/meshcat"),
        &[],
    )
    .await
    .unwrap();
    let (api, ops) = (set.replicas[0].api_url(), set.replicas[0].ops_url());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap();
    let (status, answer) = set
        .post(
            0,
            "/zones",
            &json!({"zoneName": "z", "serverAddress": "cp:50000"}),
        )
        .await
        .unwrap();
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let mut acknowledged = BTreeSet::new();
    for i in 0..3 {
        let name = format!("before-{i}");
        let (status, answer) = post(&http, &api, &record(&name)).await;
        assert_eq!(status, StatusCode::CREATED, "{answer}");
        acknowledged.insert(name);
    }

    // Someone else's keys fill etcd's quota.
    let filler = "f".repeat(100 << 10);
    let mut filled = false;
    for i in 0..200 {
        match etcd.etcdctl(&["put", &format!("/filler/{i}"), &filler]) {
            Ok(_) => {}
            Err(e) if e.to_string().contains("database space exceeded") => {
                filled = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(filled, "etcd's quota was never reached");
    let cause = "database space exceeded";
    let (status, answer) = post(&http, &api, &record("refused")).await;
    assert_full(status, &answer, cause);
    // The ops port serves one rendering for a moment: the next one says so.
    writable(&http, &ops, false).await;
    assert_eq!(readyz(&http, &ops).await, StatusCode::OK, "ready for reads");
    assert_eq!(listed(&http, &api).await, acknowledged);

    // The operator's way out: delete, compact, defragment, disarm.
    etcd.etcdctl(&["del", "--prefix", "/filler/"]).unwrap();
    let status: Value =
        serde_json::from_str(&etcd.etcdctl(&["endpoint", "status", "-w", "json"]).unwrap())
            .unwrap();
    let revision = status[0]["Status"]["header"]["revision"].as_i64().unwrap();
    etcd.etcdctl(&["compaction", &revision.to_string()])
        .unwrap();
    etcd.etcdctl(&["defrag"]).unwrap();
    etcd.etcdctl(&["alarm", "disarm"]).unwrap();
    writable(&http, &ops, true).await;
    let took = until_healed(&http, &api, "back", cause, &mut acknowledged).await;
    eprintln!("etcd writes taken again {took:?} after the alarm was disarmed");
    assert_eq!(listed(&http, &api).await, acknowledged);
}
