//! The `meshcat` binary end to end, as an operator runs it: against a real aggregator
//! (write token set) with a real Envoy sidecar and its agent. One mesh serves the
//! whole story, in order: catalog as code from `examples/catalog/` (refused without
//! the token, dry run, create, re-apply, edits of a cluster and of a zone, prune, a
//! bad document), `get` in its three formats and colours only on a terminal,
//! `describe` with its history, `history` from the real history API, the sidecar's
//! log level through to Envoy, `graph`, a diagnosis's recent changes, `delete`,
//! `check` on a healthy mesh, `watch` (records and history entries) until SIGINT, and
//! `check` failing once the agent stops. Its aggregator runs with
//! `--control-plane=false` (the zones' control servers are names, not servers):
//! every zone's control state is `disabled`, which `get zones` shows and `check`
//! passes, and `sync` lists the sidecar as `unknown`. A zone whose control server
//! cannot be reached fails `check`, in a test of its own. Cheaper checks (completion
//! scripts, bad usage, an unreachable API, `inject`, which needs no API) have their
//! own tests.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use meshcat_tests::mesh::{Catalog, MeshAgent, Sidecar, metric_sum};
use meshcat_tests::wait_for;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

const TOKEN: &str = "e2e-write-token";
const DEADLINE: Duration = Duration::from_secs(30);

/// What a run of the binary left.
#[derive(Debug)]
struct Run {
    code: i32,
    out: String,
    err: String,
}

impl Run {
    fn lines(&self) -> Vec<&str> {
        self.out.lines().collect()
    }
}

fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_meshcat")
}

/// The binary with a clean environment: no `MESHCAT_*` or colour settings leak in.
fn command(args: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(binary());
    c.args(args)
        .env_remove("MESHCAT_API")
        .env_remove("MESHCAT_TOKEN_FILE")
        .env_remove("MESHCAT_TIMEOUT")
        .env_remove("NO_COLOR")
        .env_remove("CLICOLOR_FORCE")
        .env_remove("CLICOLOR")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    c
}

async fn run(args: &[&str]) -> Run {
    let out = tokio::time::timeout(Duration::from_secs(60), command(args).output())
        .await
        .expect("meshcat ends by itself")
        .expect("meshcat runs");
    Run {
        code: out.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs with `input` on standard input.
async fn run_with_input(args: &[&str], input: &[u8]) -> Run {
    let mut c = command(args);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("meshcat runs");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    // Written beside the wait: a large input fills the pipe before meshcat reads it.
    let writer = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let _ = stdin.write_all(&input).await;
    });
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("meshcat ends by itself")
        .expect("meshcat runs");
    writer.await.unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs with the API and the write token.
async fn admin(api: &str, token: &Path, args: &[&str]) -> Run {
    let token = token.display().to_string();
    let mut all = vec!["--api", api, "--token-file", token.as_str()];
    all.extend_from_slice(args);
    run(&all).await
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/catalog")
}

/// Rewrites a catalog file.
fn edit(path: &Path, f: impl FnOnce(String) -> String) {
    let text = std::fs::read_to_string(path).unwrap();
    let new = f(text.clone());
    assert_ne!(new, text, "the edit changes {}", path.display());
    std::fs::write(path, new).unwrap();
}

/// Drops the YAML document that holds `needle`.
fn without_document(text: String, needle: &str) -> String {
    text.split("\n---\n")
        .filter(|d| !d.contains(needle))
        .collect::<Vec<_>>()
        .join("\n---\n")
}

const CREATED: [&str; 8] = [
    "created zone/backoffice",
    "created zone/shop",
    "created cluster/backoffice/ledger",
    "created cluster/backoffice/reports",
    "created cluster/shop/catalog",
    "created cluster/shop/checkout",
    "created cluster/shop/edge",
    "created cluster/shop/reviews",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_command_line_against_a_live_mesh() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("write.token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let catalog = Catalog::start(|c| {
        c.tokens.write = Some(TOKEN.into());
        c.tokens.anonymous_writes = false;
        c.control.enabled = false;
    })
    .await
    .unwrap();
    let api = catalog.api_url();
    let files = dir.path().join("catalog");
    copy_dir(&examples(), &files);
    let files_arg = files.display().to_string();

    // Without the token the first write is refused: exit 1 with the API's message,
    // nothing written.
    let r = run(&["--api", &api, "apply", "-f", &files_arg]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.err
            .contains("zone/backoffice: POST /zones: This request needs a valid bearer token. (401 unauthorized)"),
        "{r:?}"
    );
    assert_eq!(catalog.get("/zones").await.unwrap().1, Value::Array(vec![]));

    // A dry run prints what it would do and writes nothing.
    let r = admin(&api, &token, &["apply", "-f", &files_arg, "--dry-run"]).await;
    assert_eq!((r.code, r.lines()), (0, CREATED.to_vec()), "{r:?}");
    assert_eq!(catalog.get("/zones").await.unwrap().1, Value::Array(vec![]));

    let r = admin(&api, &token, &["apply", "-f", &files_arg]).await;
    assert_eq!((r.code, r.lines()), (0, CREATED.to_vec()), "{r:?}");
    let (_, clusters) = catalog.get("/clusters").await.unwrap();
    assert_eq!(clusters.as_array().unwrap().len(), 6, "{clusters}");
    // Six clusters, one bulk POST /clusters.
    let posts = metric_sum(
        &catalog.ops_metrics().await.unwrap(),
        "meshcat_api_requests_total",
        &[("route", "/clusters"), ("method", "POST"), ("code", "201")],
    );
    assert_eq!(posts, Some(1.0));
    let reports = catalog.cluster("backoffice", "reports").await.unwrap();
    assert_eq!(
        reports["dependencies"],
        serde_json::json!(["ledger", "shop/catalog"])
    );

    // The same files again: nothing to do.
    let r = admin(&api, &token, &["apply", "-f", &files_arg]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.lines().len(), 8, "{r:?}");
    assert!(
        r.lines().iter().all(|l| l.starts_with("unchanged ")),
        "{r:?}"
    );

    // An edit is an update; under --dry-run it changes nothing.
    let shop = files.join("shop.yaml");
    edit(&shop, |t| {
        t.replacen("owner: team-catalog\n", "owner: team-search\n", 1)
    });
    for dry in [true, false] {
        let mut args = vec!["apply", "-f", &files_arg];
        if dry {
            args.push("--dry-run");
        }
        let r = admin(&api, &token, &args).await;
        assert_eq!(r.code, 0, "{r:?}");
        let updated: Vec<&str> = r
            .lines()
            .into_iter()
            .filter(|l| !l.starts_with("unchanged "))
            .collect();
        assert_eq!(updated, ["updated cluster/shop/catalog"], "{r:?}");
        let owner = catalog.cluster("shop", "catalog").await.unwrap()["owner"].clone();
        assert_eq!(
            owner,
            if dry { "team-catalog" } else { "team-search" },
            "dry run {dry}"
        );
    }

    // A zone edit is an update as well (PUT /zones/shop), written before any
    // cluster; under --dry-run nothing changes, and the zone keeps its clusters.
    let zones = files.join("zones.yaml");
    edit(&zones, |t| {
        t.replacen(
            "serverAddress: control.shop.svc:50000\n",
            "serverAddress: control.shop.svc:50001\n",
            1,
        )
    });
    for dry in [true, false] {
        let mut args = vec!["apply", "-f", &files_arg];
        if dry {
            args.push("--dry-run");
        }
        let r = admin(&api, &token, &args).await;
        assert_eq!(r.code, 0, "{r:?}");
        assert_eq!(
            &r.lines()[..2],
            ["unchanged zone/backoffice", "updated zone/shop"],
            "{r:?}"
        );
        assert!(
            r.lines()[2..].iter().all(|l| l.starts_with("unchanged ")),
            "{r:?}"
        );
        let (_, shop) = catalog.get("/zones/shop").await.unwrap();
        assert_eq!(
            shop["serverAddress"],
            if dry {
                "control.shop.svc:50000"
            } else {
                "control.shop.svc:50001"
            },
            "dry run {dry}"
        );
    }
    assert_eq!(
        catalog
            .get("/clusters?zoneName=shop")
            .await
            .unwrap()
            .1
            .as_array()
            .map(Vec::len),
        Some(4),
        "the shop's clusters stay"
    );

    // A cluster left out of the files stays, unless --prune.
    edit(&shop, |t| without_document(t, "clusterName: reviews"));
    let r = admin(&api, &token, &["apply", "-f", &files_arg]).await;
    assert!(
        r.lines().iter().all(|l| l.starts_with("unchanged ")),
        "{r:?}"
    );
    assert!(catalog.cluster("shop", "reviews").await.is_ok());
    let r = admin(&api, &token, &["apply", "-f", &files_arg, "--prune"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        r.lines().last(),
        Some(&"deleted cluster/shop/reviews"),
        "{r:?}"
    );
    assert_eq!(
        catalog
            .get("/clusters/reviews?zoneName=shop")
            .await
            .unwrap()
            .0,
        404
    );

    // A bad document: exit 2 naming the file, the document and why; the good
    // document beside it is not written either.
    let bad = files.join("bad.yaml");
    std::fs::write(
        &bad,
        "kind: Cluster\nzoneName: shop\nclusterName: search\nname: Search\n---\n\
         kind: Cluster\nzoneName: shop\nclusterName: broken\nname: Broken\nminInstances: 3\nmaxInstances: 1\n",
    )
    .unwrap();
    let r = admin(&api, &token, &["apply", "-f", &files_arg]).await;
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.out.is_empty(), "{r:?}");
    assert!(
        r.err.contains(&format!(
            "{}: document 2 (cluster/shop/broken): minInstances must not exceed maxInstances",
            bad.display()
        )),
        "{r:?}"
    );
    assert_eq!(
        catalog
            .get("/clusters/search?zoneName=shop")
            .await
            .unwrap()
            .0,
        404,
        "nothing written"
    );
    std::fs::remove_file(&bad).unwrap();

    get_in_three_formats(&catalog, &api).await;

    // The live part: a real Envoy for shop/catalog and its agent.
    let sidecar = Sidecar::start().await.unwrap();
    let agent = MeshAgent::for_sidecar(&catalog, &sidecar, "shop", "catalog", "catalog-0", "300ms")
        .await
        .unwrap();
    catalog
        .wait_cluster("catalog live", "shop", "catalog", DEADLINE, |c| {
            c["status"] == "stable"
        })
        .await
        .unwrap();

    // The entries of what just happened are stored a moment after it.
    catalog
        .wait_history_entry(
            "catalog's status change in the history",
            "/clusters/catalog/history?zoneName=shop",
            DEADLINE,
            |e| e["kind"] == "status-changed" && e["detail"]["to"] == "stable",
        )
        .await
        .unwrap();
    describe(&api).await;
    sync(&catalog, &api).await;
    history(&catalog, &api).await;
    log_level(&api, &token, &sidecar).await;
    graph(&catalog, &api).await;
    catalog
        .wait_history_entry(
            "the last log level change in the history",
            "/clusters/catalog/history?zoneName=shop&kind=log-level-changed",
            DEADLINE,
            |e| e["detail"]["to"] == "info",
        )
        .await
        .unwrap();
    diagnose(&api).await;

    // Down to what runs: the zone backoffice goes, and the shop keeps only catalog.
    let r = admin(&api, &token, &["delete", "zone", "backoffice"]).await;
    assert_eq!(
        (r.code, r.out.as_str()),
        (0, "deleted zone/backoffice\n"),
        "{r:?}"
    );
    assert_eq!(catalog.get("/zones/backoffice").await.unwrap().0, 404);
    std::fs::remove_file(files.join("backoffice.json")).unwrap();
    edit(&files.join("zones.yaml"), |t| {
        without_document(t, "zoneName: backoffice")
    });
    for gone in ["clusterName: edge", "clusterName: checkout"] {
        edit(&shop, |t| without_document(t, gone));
    }
    let r = admin(&api, &token, &["apply", "-f", &files_arg, "--prune"]).await;
    assert_eq!(
        (r.code, r.lines()),
        (
            0,
            vec![
                "unchanged zone/shop",
                "unchanged cluster/shop/catalog",
                "deleted cluster/shop/checkout",
                "deleted cluster/shop/edge",
            ]
        ),
        "{r:?}"
    );

    // A healthy mesh: every item passes.
    let r = admin(&api, &token, &["check"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    for want in [
        "[ok]   API reachable\n",
        "[ok]   API ready\n",
        "[ok]   token accepted: grants write\n",
        "[ok]   zone shop has a connected agent: 1 agent reporting 1 instance\n",
        "[ok]   no cluster down\n",
        "[ok]   no drifted cluster\n",
        "[ok]   no recent agent rejections: none in the last 5m\n",
        "[ok]   every zone's control server connected: 1 disabled\n",
        "[ok]   no stale or rejected sidecar\n",
        "Status check results are ok\n",
    ] {
        assert!(r.out.contains(want), "{want:?}: {r:?}");
    }

    watch(&api, &token).await;
    let r = admin(
        &api,
        &token,
        &["delete", "cluster", "search", "--zone", "shop"],
    )
    .await;
    assert_eq!(
        (r.code, r.out.as_str()),
        (0, "deleted cluster/shop/search\n"),
        "{r:?}"
    );
    let r = admin(
        &api,
        &token,
        &["delete", "cluster", "search", "--zone", "shop"],
    )
    .await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("(404 not_found)"), "{r:?}");

    // The agent stops: its zone has no agent and catalog is down; check says so.
    agent.stop().await.unwrap();
    catalog
        .wait_cluster("catalog down", "shop", "catalog", DEADLINE, |c| {
            c["status"] == "down"
        })
        .await
        .unwrap();
    let r = admin(&api, &token, &["check"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.out.contains(
            "[FAIL] zone shop has a connected agent: no connected agent reports an instance of it\n"
        ),
        "{r:?}"
    );
    assert!(
        r.out
            .contains("[FAIL] no cluster down: 1 down: shop/catalog\n"),
        "{r:?}"
    );
    assert!(
        r.err
            .contains("check failed: zone shop has a connected agent; no cluster down"),
        "{r:?}"
    );
}

/// `get clusters|zones|cluster` as tables, JSON (the API's answer) and YAML (the same
/// data), with filters; colours only on a terminal, and not under NO_COLOR.
async fn get_in_three_formats(catalog: &Catalog, api: &str) {
    let r = run(&["--api", api, "get", "clusters"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    let lines = r.lines();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["ZONE", "CLUSTER", "OWNER", "STATUS", "INSTANCES", "VERSION"]
    );
    assert_eq!(lines.len(), 6, "{r:?}");
    assert_eq!(
        lines[3].split_whitespace().collect::<Vec<_>>(),
        ["shop", "catalog", "team-search", "down", "0", "2.3.1"],
        "{r:?}"
    );
    assert!(!r.out.contains('\u{1b}'), "no colours into a pipe: {r:?}");

    for (args, path) in [
        (vec!["get", "clusters"], "/clusters"),
        (vec!["get", "zones"], "/zones"),
        (
            vec!["get", "cluster", "catalog", "--zone", "shop"],
            "/clusters/catalog?zoneName=shop",
        ),
        (
            vec!["get", "clusters", "--owner", "team-finance"],
            "/clusters?owner=team-finance",
        ),
    ] {
        let (_, want) = catalog.get(path).await.unwrap();
        for format in ["json", "yaml"] {
            let mut all = vec!["--api", api];
            all.extend_from_slice(&args);
            all.extend(["-o", format]);
            let r = run(&all).await;
            assert_eq!(r.code, 0, "{r:?}");
            let got: Value = if format == "json" {
                serde_json::from_str(&r.out).unwrap()
            } else {
                serde_saphyr::from_str(&r.out).unwrap()
            };
            assert_eq!(got, want, "{args:?} -o {format}");
        }
    }
    let r = run(&["--api", api, "get", "zones"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        r.lines()[0].split_whitespace().collect::<Vec<_>>(),
        [
            "ZONE",
            "SERVER-ADDRESS",
            "REQUEST-CLUSTER",
            "TLS",
            "CONTROL"
        ]
    );
    let shop = r
        .lines()
        .into_iter()
        .find(|l| l.starts_with("shop "))
        .unwrap_or_else(|| panic!("a row of zone shop: {r:?}"))
        .split_whitespace()
        .collect::<Vec<_>>();
    assert_eq!(shop[1], "control.shop.svc:50001", "{r:?}");
    assert_eq!(shop.last(), Some(&"disabled"), "{r:?}");
    assert!(r.err.is_empty(), "{r:?}");
    let r = run(&["--api", api, "get", "clusters", "--status", "stable"]).await;
    assert_eq!(r.lines().len(), 1, "only the header: {r:?}");
    let r = run(&["--api", api, "get", "cluster", "nope", "--zone", "shop"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("(404 not_found)"), "{r:?}");

    // On a terminal the statuses have colours, unless NO_COLOR is set to something
    // (an empty NO_COLOR is no setting, as no-color.org says).
    let line = format!("{} --api {api} get clusters", binary());
    for (no_color, coloured) in [(None, true), (Some("1"), false), (Some(""), true)] {
        let mut c = tokio::process::Command::new("script");
        c.args(["-qec", &line, "/dev/null"])
            .env_remove("CLICOLOR_FORCE")
            .env_remove("CLICOLOR")
            .env("TERM", "xterm")
            .stdin(Stdio::null());
        match no_color {
            Some(v) => c.env("NO_COLOR", v),
            None => c.env_remove("NO_COLOR"),
        };
        let out = c.output().await.expect("script(1) runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("catalog"), "{text}");
        assert_eq!(
            text.contains("\u{1b}["),
            coloured,
            "NO_COLOR={no_color:?}: {text:?}"
        );
    }
    // Into a pipe, CLICOLOR_FORCE=1 asks for colours, and NO_COLOR still wins.
    for (no_color, coloured) in [(false, true), (true, false)] {
        let mut c = command(&["--api", api, "get", "clusters"]);
        c.env("CLICOLOR_FORCE", "1");
        if no_color {
            c.env("NO_COLOR", "1");
        }
        let out = c.output().await.unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.contains("\u{1b}["),
            coloured,
            "CLICOLOR_FORCE=1 NO_COLOR={no_color}: {text:?}"
        );
    }
}

async fn describe(api: &str) {
    let r = run(&[
        "--api", api, "describe", "cluster", "catalog", "--zone", "shop",
    ])
    .await;
    assert_eq!(r.code, 0, "{r:?}");
    for want in [
        "Cluster:          catalog\n",
        "Zone:             shop\n",
        "Owner:            team-search\n",
        "Documentation:    https://docs.example.com/shop/catalog\n",
        "Link:             runbook https://runbooks.example.com/catalog\n",
        "Instances wanted: 1 to 6\n",
        "Status:           stable (1 live instance within the wanted count",
        "Control plane:    not declared by the zone's control server\n",
        "Instances (1):\n  NAME        STARTED ",
        "Callers (3):\n",
        "  shop/edge ",
        "Callees (1):\n  TO             TRAFFIC\n  shop/reviews   0 requests (0.0/s), 0 errors (0.0%), no traffic in the last 60s, declared\n",
        "Drift: none: every live instance runs one configuration (configuration ",
        "Last change:      ",
        " ago, down -> stable: 1 live instance",
        "\nHistory (last 4, newest first):\n  TIME ",
    ] {
        assert!(r.out.contains(want), "{want:?} in:\n{}", r.out);
    }
    assert!(!r.out.contains("unavailable"), "{}", r.out);
    // The cluster's own entries, newest first, from the real history API.
    let history = r.out.split("\nHistory (").nth(1).unwrap();
    let rows: Vec<Vec<&str>> = history
        .lines()
        .skip(2)
        .map(|l| l.split_whitespace().collect())
        .collect();
    let kinds: Vec<&str> = rows.iter().map(|r| r[1]).collect();
    assert_eq!(
        kinds,
        [
            "status-changed",
            "instance-joined",
            "cluster-updated",
            "cluster-registered"
        ],
        "{history}"
    );
    assert_eq!(rows[1][2], "catalog-0", "{history}");
    assert_eq!(rows[1][3], "started", "{history}");
    assert_eq!(rows[2][2..], ["-", "changed:", "owner"], "{history}");
    for row in &rows {
        assert!(
            row[0].ends_with('Z') && row[0].contains('T'),
            "a time: {history}"
        );
    }
    let instance = r
        .lines()
        .into_iter()
        .find(|l| l.trim_start().starts_with("catalog-0 "))
        .unwrap_or_else(|| panic!("an instance row: {}", r.out));
    let cells: Vec<&str> = instance.split_whitespace().collect();
    assert!(
        cells[1].ends_with('Z') && cells[1].contains('T'),
        "start time: {instance}"
    );
    assert!(
        cells[2].ends_with('s') || cells[2].ends_with('m'),
        "age: {instance}"
    );
    assert_eq!(
        cells[3..],
        ["agent", "unknown", "none"],
        "source, sync and identity (a sidecar without TLS): {instance}"
    );
    let r = run(&[
        "--api", api, "describe", "cluster", "nope", "--zone", "shop",
    ])
    .await;
    assert_eq!(r.code, 1, "{r:?}");
}

/// `meshcat sync`: the sidecar of shop/catalog, `unknown` with the control plane
/// off (no view to compare with), which does not fail it; its filters; `-o json`
/// is the API's answer.
async fn sync(catalog: &Catalog, api: &str) {
    let r = run(&["--api", api, "sync"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    let lines = r.lines();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["ZONE", "CLUSTER", "INSTANCE", "STATE", "SINCE", "DETAIL"],
        "{r:?}"
    );
    assert_eq!(lines.len(), 2, "{r:?}");
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        row[..4],
        ["shop", "catalog", "catalog-0", "unknown"],
        "{r:?}"
    );
    assert!(row[4].ends_with('Z') && row[4].contains('T'), "{r:?}");
    let r = run(&[
        "--api",
        api,
        "sync",
        "--zone",
        "shop",
        "--cluster",
        "catalog",
        "-o",
        "json",
    ])
    .await;
    assert_eq!(r.code, 0, "{r:?}");
    let got: Value = serde_json::from_str(&r.out).unwrap();
    let (_, want) = catalog
        .get("/sync?zoneName=shop&clusterName=catalog")
        .await
        .unwrap();
    assert_eq!(got["proxies"], want["proxies"], "{r:?}");
    assert_eq!(got["proxies"][0]["state"], "unknown", "{r:?}");
    for args in [
        ["--state", "stale", "--zone", "shop"],
        ["--zone", "backoffice", "--cluster", "ledger"],
    ] {
        let mut all = vec!["--api", api, "sync"];
        all.extend(args);
        let r = run(&all).await;
        assert_eq!((r.code, r.lines().len()), (0, 1), "only the header: {r:?}");
    }
    let r = run(&["--api", api, "sync", "--state", "lost"]).await;
    assert_eq!(r.code, 2, "{r:?}");
}

/// `meshcat history` shows the real history API's entries, the ones this story's own
/// actions made: as a table, as the API's JSON, and narrowed by zone, cluster and
/// time.
async fn history(catalog: &Catalog, api: &str) {
    let r = run(&["--api", api, "history"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    let rows: Vec<Vec<&str>> = r
        .lines()
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["TIME", "KIND", "ZONE", "CLUSTER", "INSTANCE", "DETAIL"],
        "{r:?}"
    );
    let has = |want: &[&str]| rows.iter().any(|row| row.get(1..=want.len()) == Some(want));
    for want in [
        &["zone-registered", "shop", "-", "-"][..],
        &["zone-registered", "backoffice", "-", "-"],
        &[
            "zone-updated",
            "shop",
            "-",
            "-",
            "changed:",
            "serverAddress",
        ],
        &["cluster-registered", "shop", "catalog", "-"],
        &[
            "cluster-updated",
            "shop",
            "catalog",
            "-",
            "changed:",
            "owner",
        ],
        &["cluster-deleted", "shop", "reviews", "-"],
        &["instance-joined", "shop", "catalog", "catalog-0", "started"],
        &[
            "status-changed",
            "shop",
            "catalog",
            "-",
            "down",
            "->",
            "stable:",
        ],
    ] {
        assert!(has(want), "{want:?} in:\n{}", r.out);
    }

    // -o json is the API's answer as is (read just before and just after: the
    // history is still, so both are the same).
    let (_, before) = catalog.get("/history").await.unwrap();
    let r = run(&["--api", api, "history", "-o", "json"]).await;
    let (_, after) = catalog.get("/history").await.unwrap();
    assert_eq!(r.code, 0, "{r:?}");
    let got: Value = serde_json::from_str(&r.out).unwrap();
    assert!(
        got == before || got == after,
        "{got:#} is neither of the API's answers"
    );
    assert!(got.as_array().is_some_and(|a| a.len() + 1 == rows.len()));

    // --zone, --cluster and --since narrow it as the API does.
    for (args, zone, cluster) in [
        (vec!["--zone", "backoffice"], Some("backoffice"), None),
        (vec!["--cluster", "catalog"], None, Some("catalog")),
        (
            vec!["--zone", "shop", "--cluster", "catalog", "--since", "1h"],
            Some("shop"),
            Some("catalog"),
        ),
    ] {
        let mut all = vec!["--api", api, "history"];
        all.extend(&args);
        let r = run(&all).await;
        assert_eq!(r.code, 0, "{r:?}");
        let lines = r.lines();
        assert!(lines.len() > 1, "{args:?}: entries: {r:?}");
        for line in &lines[1..] {
            let cells: Vec<&str> = line.split_whitespace().collect();
            if let Some(z) = zone {
                assert_eq!(cells[2], z, "{args:?}: {line}");
            }
            if let Some(c) = cluster {
                assert_eq!(cells[3], c, "{args:?}: {line}");
            }
        }
        let mut json = all.clone();
        json.extend(["-o", "json"]);
        let r = run(&json).await;
        let got: Value = serde_json::from_str(&r.out).unwrap();
        assert_eq!(
            got.as_array().map(Vec::len),
            Some(lines.len() - 1),
            "{args:?}"
        );
    }
    let r = run(&["--api", api, "history", "--since", "1h"]).await;
    assert_eq!(
        r.lines().len(),
        rows.len(),
        "the whole story is within the hour: {r:?}"
    );
    let r = run(&["--api", api, "history", "--zone", "shop", "-o", "yaml"]).await;
    let got: Value = serde_saphyr::from_str(&r.out).unwrap();
    assert!(
        got.as_array()
            .unwrap()
            .iter()
            .all(|e| e["zoneName"] == "shop"),
        "{got:#}"
    );
}

/// The level reaches the real Envoy: read through its admin API after each change.
async fn log_level(api: &str, token: &Path, sidecar: &Sidecar) {
    let envoy = || async { sidecar.envoy.uniform_log_level().await.unwrap() };
    let base = ["log-level"];
    let target = ["--zone", "shop", "--cluster", "catalog"];
    let with = |action: &[&'static str], extra: &[&'static str]| -> Vec<&'static str> {
        base.iter()
            .chain(action)
            .chain(&target)
            .chain(extra)
            .copied()
            .collect()
    };
    let r = admin(api, token, &with(&["get"], &[])).await;
    assert_eq!(
        (r.code, r.lines()),
        (0, vec!["INSTANCE    LEVEL", "catalog-0   info"]),
        "{r:?}"
    );
    assert_eq!(envoy().await.as_deref(), Some("info"));

    let r = admin(api, token, &with(&["set", "warn"], &[])).await;
    assert_eq!(
        (r.code, r.lines()),
        (0, vec!["INSTANCE    LEVEL", "catalog-0   warn"]),
        "{r:?}"
    );
    assert_eq!(envoy().await.as_deref(), Some("warning"));

    let r = admin(
        api,
        token,
        &with(&["set", "debug"], &["--instance", "catalog-0"]),
    )
    .await;
    assert_eq!(
        (r.code, r.lines()),
        (0, vec!["INSTANCE    LEVEL", "catalog-0   debug"]),
        "{r:?}"
    );
    assert_eq!(envoy().await.as_deref(), Some("debug"));
    let r = admin(api, token, &with(&["get"], &["--instance", "catalog-0"])).await;
    assert_eq!(
        r.lines(),
        ["INSTANCE    LEVEL", "catalog-0   debug"],
        "{r:?}"
    );
    let r = admin(api, token, &with(&["get"], &["-o", "json"])).await;
    assert_eq!(r.code, 0, "{r:?}");
    let got: Value = serde_json::from_str(&r.out).expect("log-level -o json is JSON");
    assert_eq!(
        got,
        json!([{"instance": "catalog-0", "level": "debug"}]),
        "{r:?}"
    );

    // Without the write token: refused, Envoy untouched.
    let mut args = vec!["--api", api];
    args.extend(with(&["set", "error"], &[]));
    let r = run(&args).await;
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.err.contains("(401 unauthorized)"), "{r:?}");
    assert_eq!(envoy().await.as_deref(), Some("debug"));
    // An unknown instance is the API's 404.
    let r = admin(api, token, &with(&["get"], &["--instance", "catalog-9"])).await;
    assert_eq!(r.code, 1, "{r:?}");
    let r = admin(api, token, &with(&["set", "info"], &[])).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(envoy().await.as_deref(), Some("info"));
}

async fn graph(catalog: &Catalog, api: &str) {
    let r = run(&["--api", api, "graph", "--zone", "shop", "-o", "json"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    let got: Value = serde_json::from_str(&r.out).unwrap();
    let (_, want) = catalog.get("/graph?zoneName=shop").await.unwrap();
    assert_eq!(got["nodes"], want["nodes"]);
    assert_eq!(
        got["edges"].as_array().map(Vec::len),
        want["edges"].as_array().map(Vec::len)
    );
    let r = run(&[
        "--api",
        api,
        "graph",
        "--zone",
        "shop",
        "--cluster",
        "catalog",
        "-o",
        "dot",
    ])
    .await;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.out.starts_with("digraph meshcat {\n"), "{r:?}");
    assert!(
        r.out.contains(
            "\"shop/catalog\" -> \"shop/reviews\" [label=\"0 req, 0.0% err\", style=dashed];"
        ),
        "{r:?}"
    );
    let r = run(&["--api", api, "graph"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.out.starts_with("NODE "), "{r:?}");
    assert!(r.out.contains("\nSOURCE "), "{r:?}");
    // --depth needs --cluster, which needs --zone: bad usage.
    let r = run(&["--api", api, "graph", "--depth", "2"]).await;
    assert_eq!(r.code, 2, "{r:?}");
}

/// A real diagnosis's recent changes print as `meshcat history` prints them: times,
/// kinds, places and details in words, not epoch milliseconds and JSON.
async fn diagnose(api: &str) {
    let r = run(&["--api", api, "diagnose", "catalog", "--zone", "shop"]).await;
    // The shop has no edge sidecar: steps fail, and the diagnosis still ran.
    assert!(matches!(r.code, 0 | 1), "{r:?}");
    let changes = r
        .out
        .split("Recent changes (newest first):\n")
        .nth(1)
        .unwrap_or_else(|| panic!("recent changes: {}", r.out));
    let changes = &changes[..changes.find("Checklist:").expect("the checklist follows")];
    let rows: Vec<Vec<&str>> = changes
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["TIME", "KIND", "ZONE", "CLUSTER", "INSTANCE", "DETAIL"],
        "{changes}"
    );
    for row in &rows[1..] {
        assert!(
            row[0].ends_with('Z') && row[0].contains('T'),
            "a time: {changes}"
        );
        assert_eq!(row[2..4], ["shop", "catalog"], "{changes}");
    }
    for want in [
        &[
            "log-level-changed",
            "shop",
            "catalog",
            "catalog-0",
            "debug",
            "->",
            "info",
            "by",
            "api",
        ][..],
        &[
            "status-changed",
            "shop",
            "catalog",
            "-",
            "down",
            "->",
            "stable:",
        ],
        &[
            "cluster-updated",
            "shop",
            "catalog",
            "-",
            "changed:",
            "owner",
        ],
        &["cluster-registered", "shop", "catalog", "-"],
    ] {
        assert!(
            rows.iter().any(|row| row.get(1..=want.len()) == Some(want)),
            "{want:?} in:\n{changes}"
        );
    }
    assert!(
        !changes.contains('{') && !changes.contains("shop/"),
        "no raw detail, no zone/ place: {changes}"
    );
}

/// `watch` prints a line for a change made while it runs and stops on SIGINT.
async fn watch(api: &str, token: &Path) {
    let mut child = command(&["--api", api, "watch", "--zone", "shop"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = tokio::time::timeout(DEADLINE, err.next_line())
        .await
        .expect("watch says it follows the stream")
        .unwrap()
        .unwrap_or_default();
    assert!(first.contains("watching the events of"), "{first}");
    let search = tempfile::NamedTempFile::with_suffix(".yaml").unwrap();
    std::fs::write(
        search.path(),
        "kind: Cluster\nzoneName: shop\nclusterName: search\nname: Search\nowner: team-search\n",
    )
    .unwrap();
    let r = admin(
        api,
        token,
        &["apply", "-f", &search.path().display().to_string()],
    )
    .await;
    assert_eq!(r.lines(), ["created cluster/shop/search"], "{r:?}");
    // Two lines tell of it: the cluster's record, and its history entry once stored.
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut record, mut entry) = (None, None);
    tokio::time::timeout(DEADLINE, async {
        while record.is_none() || entry.is_none() {
            let line = out.next_line().await.unwrap().expect("watch goes on");
            if line.contains(" cluster shop/search ") {
                record = Some(line);
            } else if line.contains(" history cluster-registered shop/search") {
                entry = Some(line);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the watch lines of cluster search: {record:?} {entry:?}"));
    let (record, entry) = (record.unwrap(), entry.unwrap());
    assert!(
        record.ends_with(" cluster shop/search down, 0 instances"),
        "{record}"
    );
    let cells: Vec<&str> = entry.split(' ').collect();
    assert_eq!(
        cells[1..],
        ["history", "cluster-registered", "shop/search"],
        "{entry}"
    );
    assert!(cells[0].ends_with('Z'), "{entry}");
    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .expect("watch stops on SIGINT")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let mut rest = String::new();
    let _ = err.into_inner().read_to_string(&mut rest).await;
    assert!(
        !rest.contains("meshcat: "),
        "no error on the way out: {rest}"
    );
}

#[tokio::test]
async fn completion_scripts_for_bash_zsh_and_fish() {
    for shell in ["bash", "zsh", "fish"] {
        let r = run(&["completion", shell]).await;
        assert_eq!(r.code, 0, "{r:?}");
        for word in [
            "meshcat",
            "apply",
            "log-level",
            "token-file",
            "prune",
            "inject",
            "ops-token-secret",
            "sync",
        ] {
            assert!(r.out.contains(word), "{shell} lacks {word}");
        }
        let script = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(script.path(), &r.out).unwrap();
        let check: &[&str] = match shell {
            "bash" => &["bash", "-n"],
            "zsh" => &["zsh", "-n"],
            _ => &["fish", "--no-execute"],
        };
        let parsed = std::process::Command::new(check[0])
            .args(&check[1..])
            .arg(script.path())
            .output();
        match parsed {
            Ok(o) => assert!(
                o.status.success(),
                "{shell} does not parse its script: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            // The test command installs zsh and fish (scripts/deps.sh shells); run
            // outside it, a shell that is not installed is not checked, except in CI.
            Err(e)
                if shell != "bash"
                    && e.kind() == std::io::ErrorKind::NotFound
                    && std::env::var_os("CI").is_none() => {}
            Err(e) => panic!("{shell}: {e}"),
        }
    }
    let r = run(&["completion", "tcsh"]).await;
    assert_eq!(r.code, 2, "{r:?}");
}

/// A zone whose control server refuses connections: `get zones` shows it
/// `unreachable`, and `check` fails naming the zone, its state and the error the
/// aggregator gives; with no sidecar, `sync` lists nothing and passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_server_that_cannot_be_reached_fails_check() {
    let catalog = Catalog::start(|_| {}).await.unwrap();
    let api = catalog.api_url();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = closed.local_addr().unwrap().to_string();
    drop(closed);
    catalog
        .create(
            "/zones",
            json!({"zoneName": "far", "serverAddress": server, "requestCluster": "edge"}),
        )
        .await
        .unwrap();
    let control = wait_for("zone far unreachable", DEADLINE, || async {
        let (_, c) = catalog.get("/zones/far/control").await.ok()?;
        (c["state"] == "unreachable").then_some(c)
    })
    .await
    .unwrap();
    let error = control["error"].as_str().unwrap().to_owned();
    assert!(!error.is_empty(), "{control}");

    let r = run(&["--api", &api, "get", "zones"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        r.lines()[1].split_whitespace().collect::<Vec<_>>(),
        ["far", server.as_str(), "edge", "no", "unreachable"],
        "{r:?}"
    );

    let r = run(&["--api", &api, "check"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    let want = format!(
        "[FAIL] every zone's control server connected: 1 of 1 not connected: zone far unreachable ({})\n",
        meshcat_cli::render::clean(&error)
    );
    assert!(r.out.contains(&want), "{want:?}: {r:?}");
    assert!(
        r.out.contains("[ok]   no stale or rejected sidecar\n"),
        "{r:?}"
    );
    assert!(
        r.err.contains("every zone's control server connected"),
        "{r:?}"
    );

    let r = run(&["--api", &api, "sync"]).await;
    assert_eq!((r.code, r.lines().len()), (0, 1), "only the header: {r:?}");
}

#[tokio::test]
async fn bad_usage_and_an_unreachable_api_exit_2() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let api = format!("http://127.0.0.1:{port}");
    let r = run(&["--api", &api, "get", "zones"]).await;
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.err
            .starts_with(&format!("meshcat: cannot reach the catalog API at {api}")),
        "{r:?}"
    );
    let r = run(&["--api", &api, "check"]).await;
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.out.contains("[FAIL] API reachable: cannot reach"),
        "{r:?}"
    );
    let r = run(&["--api", &api, "watch"]).await;
    assert_eq!(r.code, 2, "{r:?}");

    let dir = tempfile::tempdir().unwrap();
    for args in [
        vec!["get"],
        vec!["log-level", "set", "loud", "--zone", "z", "--cluster", "c"],
        vec!["describe", "cluster", "c"],
        vec!["--api", "not a url", "get", "zones"],
        vec!["--token-file", "/nonexistent/token", "get", "zones"],
        vec!["apply"],
    ] {
        let r = run(&args).await;
        assert_eq!(r.code, 2, "{args:?}: {r:?}");
    }
    // Files are read and checked before the API is asked anything.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let r = run(&["--api", &api, "apply", "-f", &empty.display().to_string()]).await;
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.err.contains("no Zone or Cluster document found"), "{r:?}");
}

/// The agent container of a workload that `inject` printed.
fn agent_of(workload: &Value) -> &Value {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "meshcat-agent")
        .unwrap_or_else(|| panic!("no meshcat-agent in {workload}"))
}

#[tokio::test]
async fn inject_adds_the_agent_to_workloads_and_nothing_else() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/inject_workloads.yaml");
    let fixture = fixture.display().to_string();
    // No API is asked: an unreachable one and a missing token file do not matter.
    let r = run(&[
        "--api",
        "http://127.0.0.1:1",
        "--token-file",
        "/nonexistent/token",
        "inject",
        "-f",
        &fixture,
        "--aggregator",
        "meshcat.example.com:9443",
    ])
    .await;
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        r.err.lines().collect::<Vec<_>>(),
        [
            "deployment \"catalog\" injected",
            "statefulset \"ledger\" injected",
            "daemonset \"node-exporter\" injected",
            "deployment \"reviews\" injected",
            "service \"catalog\" skipped: kind Service",
            "configmap \"catalog-config\" skipped: kind ConfigMap",
        ]
    );
    let docs: Vec<Value> = serde_saphyr::from_multiple(&r.out).expect("the output is YAML");
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "Deployment",
            "StatefulSet",
            "DaemonSet",
            "Deployment",
            "Service",
            "ConfigMap"
        ]
    );
    let admins: Vec<(&str, &str)> = docs[..4]
        .iter()
        .map(|w| {
            let a = agent_of(w);
            let cluster = a["args"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_str)
                .find_map(|a| a.strip_prefix("--cluster="))
                .unwrap();
            let admin = a["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == "MESHCAT_SIDECAR_ADMIN")
                .and_then(|e| e["value"].as_str())
                .unwrap();
            (cluster, admin)
        })
        .collect();
    assert_eq!(
        admins,
        [
            ("catalog", "127.0.0.1:15000"),
            ("ledger-db", "127.0.0.1:19100"),
            ("node-exporter", "127.0.0.1:19000"),
            ("reviews", "127.0.0.1:9901"),
        ]
    );
    let env: Vec<&Value> = agent_of(&docs[0])["env"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    assert!(
        env.contains(&&json!({"name": "MESHCAT_AGGREGATOR", "value": "meshcat.example.com:9443"})),
        "{env:?}"
    );
    assert!(
        env.contains(&&json!({"name": "MESHCAT_SERVER_NAME", "value": "meshcat.example.com"})),
        "{env:?}"
    );
    assert_eq!(docs[4]["spec"]["ports"][0]["targetPort"], "http");

    // Again through standard input: everything is injected already, and the output
    // is the same.
    let again = run_with_input(
        &[
            "inject",
            "-f",
            "-",
            "--aggregator",
            "meshcat.example.com:9443",
        ],
        r.out.as_bytes(),
    )
    .await;
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(again.out, r.out);
    assert_eq!(
        again
            .err
            .lines()
            .filter(|l| l.ends_with("skipped: already injected"))
            .count(),
        4,
        "{again:?}"
    );
}

#[tokio::test]
async fn inject_refuses_bad_input_and_prints_nothing() {
    let bad = b"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec: {template: {spec: {containers: [{name: web}]}}}\n---\njust a string\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: \"ds\\e[2J\"}\nspec: {selector: {}}\n";
    let r = run_with_input(&["inject", "-f", "-"], bad).await;
    assert_eq!(r.code, 2, "{r:?}");
    assert_eq!(r.out, "", "nothing printed when a document is refused");
    assert_eq!(
        r.err.lines().collect::<Vec<_>>(),
        [
            "meshcat: standard input: document 2: not a mapping (a Kubernetes object) but a string",
            "meshcat: standard input: document 3 (daemonset \"ds\\u{1b}[2J\"): no spec.template",
        ]
    );
    let big = vec![b'#'; (16 << 20) + 1];
    let r = run_with_input(&["inject", "-f", "-"], &big).await;
    assert_eq!(r.code, 2, "{r:?}");
    assert_eq!(r.err, "meshcat: standard input: larger than 16 MiB\n");
    let r = run(&["inject", "-f", "/nonexistent/app.yaml"]).await;
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.err.starts_with("meshcat: /nonexistent/app.yaml: "),
        "{r:?}"
    );
    for args in [
        &["inject"][..],
        &["inject", "-f", "-", "--ops-port", "0"],
        &["inject", "-f", "-", "--aggregator", "aggregator"],
        &["inject", "-f", "-", "--tls-secret", "Not_A_Name"],
    ] {
        let r = run(args).await;
        assert_eq!(r.code, 2, "{args:?}: {r:?}");
    }
}

/// `meshcat certs` and the identity item of `check` against real Envoys whose
/// certificates the test issues: one expires within the warning, the other is good
/// for months. The listing passes on what is fine and fails (exit 1), naming it, on
/// what needs action, whatever the format.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn certs_names_the_certificates_that_need_action() {
    use meshcat_tests::certs::CertSpec;
    use meshcat_tests::{Bootstrap, Envoy, MeshCerts, Upstream};
    const DAY: Duration = Duration::from_secs(86_400);
    let dir = tempfile::tempdir().unwrap();
    let certs = MeshCerts::new(dir.path(), "cli").unwrap();
    let catalog = Catalog::start(|c| c.control.enabled = false).await.unwrap();
    let api = catalog.api_url();
    catalog.register_zone("shop", "").await.unwrap();
    let upstream = Upstream::start().await.unwrap();
    let mut envoys = Vec::new();
    let mut agents = Vec::new();
    for (cluster, left) in [("orders", 3 * DAY), ("payments", 90 * DAY)] {
        catalog
            .register_cluster("shop", cluster, json!({"owner": format!("{cluster}-team")}))
            .await
            .unwrap();
        let id = certs
            .issue(&CertSpec::valid_for(
                cluster,
                &format!("{cluster}.shop"),
                &format!("spiffe://shop.local/ns/shop/sa/{cluster}"),
                left,
            ))
            .unwrap();
        let envoy = Envoy::start(Bootstrap::service_sidecar(
            upstream.addr,
            Some(meshcat_tests::bootstrap::Tls::new(&certs, id, None)),
        ))
        .await
        .unwrap();
        let args =
            catalog.sidecar_agent_args(&envoy, "shop", cluster, &format!("{cluster}-1"), "300ms");
        agents.push(MeshAgent::start(&args).await.unwrap());
        envoys.push(envoy);
    }
    wait_for("both chains listed", DEADLINE, || async {
        let (_, rows) = catalog.get("/certificates").await.ok()?;
        (rows
            .as_array()?
            .iter()
            .filter(|r| r["role"] == "chain")
            .count()
            == 2)
            .then_some(())
    })
    .await
    .unwrap();

    let r = run(&["--api", &api, "certs", "--zone", "shop"]).await;
    assert_eq!(r.code, 1, "{r:?}");
    let lines = r.lines();
    assert!(lines[0].starts_with("ZONE "), "{r:?}");
    let orders = lines
        .iter()
        .position(|l| l.contains("orders-1") && l.contains("chain"))
        .unwrap();
    let payments = lines
        .iter()
        .position(|l| l.contains("payments-1") && l.contains("chain"))
        .unwrap();
    assert!(orders < payments, "soonest expiry first: {r:?}");
    assert!(lines[orders].contains("expiring"), "{r:?}");
    assert!(
        r.err.contains("1 of 4 certificates needs action (0 expired, 0 rotation-overdue, 1 expiring): shop/orders/orders-1 chain (expiring, "),
        "{r:?}"
    );
    // What is fine passes; a window that reaches it fails, in JSON too.
    let r = run(&["--api", &api, "certs", "--cluster", "payments"]).await;
    assert_eq!(r.code, 0, "{r:?}");
    let r = run(&[
        "--api",
        &api,
        "certs",
        "--cluster",
        "payments",
        "--expiring",
        "120d",
        "-o",
        "json",
    ])
    .await;
    assert_eq!(r.code, 1, "{r:?}");
    let rows: Value = serde_json::from_str(&r.out).unwrap();
    assert_eq!(rows[0]["clusterName"], "payments", "{rows}");
    let wide = run(&["--api", &api, "certs", "-o", "wide", "--cluster", "orders"]).await;
    assert!(
        wide.out.contains("orders-team") && wide.out.contains("SERIAL"),
        "{wide:?}"
    );
    let bad = run(&["--api", &api, "certs", "--expiring", "soon"]).await;
    assert_eq!(bad.code, 2, "{bad:?}");

    let check = run(&["--api", &api, "check"]).await;
    assert_eq!(check.code, 1, "{check:?}");
    assert!(
        check.out.contains(
            "[FAIL] no certificate expired, rotation-overdue or expiring: 1 certificate: shop/orders/orders-1 chain (expiring)"
        ),
        "{check:?}"
    );
    let describe = run(&[
        "--api", &api, "describe", "cluster", "orders", "--zone", "shop",
    ])
    .await;
    assert!(
        describe
            .out
            .contains("Identity:         expiring, expires "),
        "{describe:?}"
    );
    drop((agents, envoys));
}
