//! Router tests through `tower::ServiceExt::oneshot`: the route table against the
//! router and the OpenAPI document, and property tests of the validators.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use meshcat_common::model::{ClusterRecord, ClusterView, ZoneRecord};
use proptest::prelude::*;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::*;
use crate::store::Rules;
use crate::telemetry::Telemetry;

fn router(dir: &std::path::Path) -> Router {
    app(
        state(
            dir,
            Tokens {
                anonymous_writes: true,
                ..Tokens::default()
            },
        ),
        1 << 20,
    )
}

fn state(dir: &std::path::Path, tokens: Tokens) -> Arc<AppState> {
    let (store, instances) = Store::open(dir, Rules::defaults()).unwrap();
    let graph = Arc::new(crate::graph::snapshot::Graphs::new(
        instances.traffic().clone(),
    ));
    let telemetry = Telemetry::new().unwrap();
    let controls = crate::control::Controls::new(
        crate::control::ControlConfig::default(),
        &telemetry.registry,
    )
    .unwrap();
    let sync = Arc::new(crate::sync::Sync::new(
        crate::sync::SyncConfig::default(),
        store.changes().clone(),
        None,
    ));
    Arc::new(AppState {
        store: Arc::new(store),
        instances: Arc::new(instances),
        history: None,
        tokens,
        metrics: telemetry.api,
        agents: None,
        peers: super::forward::Peers::plain(),
        diagnosis: crate::diagnosis::DiagnosisTools {
            command_timeout: std::time::Duration::from_secs(5),
            prometheus: None,
        },
        events: EventStreams::new(
            crate::api::events::EventsConfig::default(),
            tokio::sync::watch::channel(false).1,
        ),
        graph,
        controls,
        sync,
    })
}

async fn call(
    app: &Router,
    method: &str,
    uri: &str,
    body: Option<&[u8]>,
) -> (StatusCode, axum::http::HeaderMap, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    if body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    let req = req
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_vec())))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let v = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    (status, headers, v)
}

fn concrete(path: &str) -> String {
    path.split('/')
        .map(|s| if s.starts_with('{') { "x" } else { s })
        .collect::<Vec<_>>()
        .join("/")
}

fn is_error_body(v: &Value) -> bool {
    v.as_object().is_some_and(|o| {
        o.len() == 2
            && o.get("error").is_some_and(Value::is_string)
            && o.get("code").and_then(Value::as_str).is_some_and(|c| {
                !c.is_empty() && c.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            })
    })
}

#[tokio::test]
async fn router_serves_exactly_the_route_table() {
    let dir = tempfile::tempdir().unwrap();
    let app = router(dir.path());
    let paths: BTreeSet<&str> = ROUTES.iter().map(|(_, p)| *p).collect();
    for path in paths {
        // An event stream from an id older than the process answers reset and ends.
        let uri = if path == "/events" {
            "/events?since=1".to_owned()
        } else {
            concrete(path)
        };
        for method in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
            let (status, headers, body) = call(&app, method, &uri, None).await;
            let listed = ROUTES.contains(&(method, path));
            if listed {
                assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
                let fallback = body["error"]
                    .as_str()
                    .is_some_and(|e| e.starts_with("No resource at"));
                assert!(!fallback, "{method} {path} fell through to the fallback");
            } else {
                assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
                let allow = headers.get(header::ALLOW).unwrap().to_str().unwrap();
                for (m, _) in ROUTES.iter().filter(|(_, p)| *p == path) {
                    assert!(allow.contains(m), "{path}: Allow {allow:?} lacks {m}");
                }
            }
            if !status.is_success() {
                assert!(is_error_body(&body), "{method} {path}: {body}");
            }
        }
    }
    let (status, _, body) = call(&app, "GET", "/nowhere", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(is_error_body(&body));
}

/// `GET /status` answers every caller with this replica's facts; a single
/// aggregator without ingest has no agents and no rejections.
#[tokio::test]
async fn status_tells_the_replica_and_the_callers_access() {
    let dir = tempfile::tempdir().unwrap();
    let app = router(dir.path());
    let zone = br#"{"zoneName":"z","serverAddress":"cp:1"}"#;
    let (status, _, _) = call(&app, "POST", "/zones", Some(zone)).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, v) = call(&app, "GET", "/status", None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["replica"], Value::Null);
    assert_eq!(v["store"], "redb");
    assert_eq!(v["ready"], true);
    // No token configured, writes open: anyone may write, a token is not looked at.
    assert_eq!(v["access"], "write");
    assert_eq!(v["token"], "absent");
    assert_eq!(v["ingest"], false);
    assert_eq!(v["agentsConnected"], 0);
    assert_eq!(
        v["zones"],
        json!([{"zoneName": "z", "registered": true, "agents": 0, "instances": 0, "peerInstances": 0}])
    );
    assert_eq!(
        v["rejections"],
        json!({"windowSeconds": 300, "total": 0, "byReason": {}})
    );
    let (status, _, v) = call(&app, "GET", "/status?zoneName=z", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
}

/// With a read token configured, the zones agents report into without a
/// registration are live data: `GET /status` names them only to its holders.
#[tokio::test]
async fn status_names_unregistered_zones_only_to_readers() {
    let dir = tempfile::tempdir().unwrap();
    let st = state(
        dir.path(),
        Tokens {
            read: Some("r".into()),
            write: Some("w".into()),
            anonymous_writes: false,
        },
    );
    st.store
        .writes()
        .create_zone(ZoneRecord::new("z", "cp:1"))
        .unwrap();
    for zone in ["z", "elsewhere"] {
        let mut r = meshcat_common::wire::InstanceReport::unread(
            zone.into(),
            "c".into(),
            format!("{zone}-0"),
        );
        r.reachable = true;
        st.instances
            .apply_report("agent-1", r, std::time::Instant::now());
    }
    let app = app(st, 1 << 20);
    let zones = |token: Option<&'static str>| {
        let app = app.clone();
        async move {
            let mut req = Request::builder().uri("/status");
            if let Some(t) = token {
                req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
            }
            let res = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            let v: Value =
                serde_json::from_slice(&res.into_body().collect().await.unwrap().to_bytes())
                    .unwrap();
            v["zones"]
                .as_array()
                .unwrap()
                .iter()
                .map(|z| {
                    (
                        z["zoneName"].as_str().unwrap().to_owned(),
                        z["instances"].clone(),
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    let registered = vec![("z".to_owned(), json!(1))];
    let all = vec![
        ("elsewhere".to_owned(), json!(1)),
        ("z".to_owned(), json!(1)),
    ];
    assert_eq!(zones(None).await, registered);
    assert_eq!(zones(Some("nope")).await, registered);
    assert_eq!(zones(Some("r")).await, all);
    assert_eq!(zones(Some("w")).await, all);
}

#[test]
fn token_checks_tell_accepted_from_refused_and_unused() {
    use crate::replica_status::TokenCheck;
    let parts = |token: Option<&str>| {
        let mut b = Request::builder().uri("/status");
        if let Some(t) = token {
            b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        b.body(()).unwrap().into_parts().0
    };
    let none = Tokens::default();
    assert_eq!(none.check_token(&parts(None)), TokenCheck::Absent);
    assert_eq!(none.check_token(&parts(Some("x"))), TokenCheck::Unused);
    let both = Tokens {
        read: Some("r".into()),
        write: Some("w".into()),
        anonymous_writes: false,
    };
    assert_eq!(both.check_token(&parts(Some("r"))), TokenCheck::Accepted);
    assert_eq!(both.check_token(&parts(Some("w"))), TokenCheck::Accepted);
    assert_eq!(both.check_token(&parts(Some("x"))), TokenCheck::Refused);
    assert_eq!(both.check_token(&parts(None)), TokenCheck::Absent);
    let write_only = Tokens {
        write: Some("w".into()),
        ..Tokens::default()
    };
    assert_eq!(
        write_only.check_token(&parts(Some("r"))),
        TokenCheck::Refused
    );
}

#[test]
fn the_graphs_documented_age_is_the_snapshots() {
    let doc = openapi::document();
    let said = doc["paths"]["/graph"]["get"]["responses"]["200"]["description"]
        .as_str()
        .unwrap();
    let age = crate::graph::snapshot::MAX_AGE.as_secs();
    assert!(said.contains(&format!("at most {age} s old")), "{said}");
}

#[test]
fn openapi_document_matches_the_route_table() {
    let doc = openapi::document();
    assert_eq!(
        doc["openapi"].as_str().unwrap().split('.').next(),
        Some("3")
    );
    let documented: BTreeSet<(String, String)> = openapi::operations(&doc).into_iter().collect();
    let served: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    assert_eq!(documented, served);
    // The blocking-query parameters and the index header are on exactly the routes
    // the `indexed` layer serves.
    for (method, path) in &served {
        let op = &doc["paths"][path.as_str()][method.to_lowercase()];
        let params: BTreeSet<&str> = op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["name"].as_str())
            .collect();
        let indexed = method == "GET" && blocking::INDEXED.contains(&path.as_str());
        assert_eq!(
            params.contains("index") && params.contains("wait"),
            indexed,
            "{method} {path}: {params:?}"
        );
        assert_eq!(
            op["responses"]["200"]["headers"]
                .get("X-Meshcat-Index")
                .is_some(),
            indexed,
            "{method} {path}"
        );
        // The debug-window bounds are the handlers' own.
        for p in op["parameters"].as_array().into_iter().flatten() {
            if matches!(p["name"].as_str(), Some("seconds" | "debugSeconds")) {
                assert_eq!(p["schema"]["minimum"], json!(1), "{method} {path}");
                assert_eq!(
                    p["schema"]["maximum"],
                    json!(super::troubleshoot::MAX_DEBUG_SECONDS),
                    "{method} {path}"
                );
            }
        }
    }
    // Every $ref resolves.
    let text = doc.to_string();
    for part in text.split("\"#/components/schemas/").skip(1) {
        let name = part.split('"').next().unwrap();
        assert!(
            doc["components"]["schemas"].get(name).is_some(),
            "dangling $ref {name}"
        );
    }
}

/// The schemas name exactly the fields the types serialize (`ownerURL`, the metrics
/// object's slashed keys, ...).
#[test]
fn schemas_have_the_serialized_field_names() {
    use meshcat_common::model::{InstanceMetrics, OverallSummary, ZoneMetadata, ZoneSummary};
    let doc = openapi::document();
    let zone = ZoneRecord::new("z", "cp:1");
    for (name, value) in [
        ("ClusterRecord", json!(ClusterRecord::new("z", "c", "n"))),
        ("ZoneRecord", json!(zone)),
        ("InstanceMetrics", json!(InstanceMetrics::default())),
        ("ZoneMetadata", json!(ZoneMetadata::default())),
        ("ZoneSummary", json!(ZoneSummary::default())),
        ("OverallSummary", json!(OverallSummary::default())),
    ] {
        let documented: BTreeSet<&String> = doc["components"]["schemas"][name]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        let serialized: BTreeSet<&String> = value.as_object().unwrap().keys().collect();
        assert_eq!(documented, serialized, "{name}");
    }
}

/// The document's query parameters are the ones the handlers parse: each is accepted
/// by name, and one it does not list is refused naming it.
#[tokio::test]
async fn documented_query_parameters_are_the_parsed_ones() {
    let dir = tempfile::tempdir().unwrap();
    let app = router(dir.path());
    let doc = openapi::document();
    let record = br#"{"clusterName":"x","zoneName":"x","name":"n"}"#;
    let zone = br#"{"zoneName":"x","serverAddress":"cp:1"}"#;
    for (method, path) in openapi::operations(&doc) {
        let op = &doc["paths"][path.as_str()][method.to_lowercase()];
        let body: Option<&[u8]> = match (method.as_str(), path.as_str()) {
            ("POST", "/zones") | ("PUT", "/zones/{zoneName}") => Some(zone),
            ("POST" | "PUT", "/clusters" | "/clusters/{clusterName}") => Some(record),
            _ => None,
        };
        // An event stream from an id older than the process answers reset and ends.
        let base = if path == "/events" {
            "/events?since=1&".to_owned()
        } else {
            format!("{}?", concrete(&path))
        };
        let names = op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["in"] == "query")
            .filter_map(|p| p["name"].as_str());
        for name in names {
            let uri = format!("{base}{name}=x");
            let (_, _, v) = call(&app, &method, &uri, body).await;
            let refused = v["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("Unknown query parameter"));
            assert!(!refused, "{method} {uri}: {v}");
        }
        let uri = format!("{base}undocumented=x");
        let (status, _, v) = call(&app, &method, &uri, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {uri}: {v}");
        assert!(
            v["error"].as_str().unwrap().contains("undocumented"),
            "{method} {uri}: {v}"
        );
    }
}

mod props;

/// One answer whole: status, headers and body bytes.
async fn answer(
    app: &QuickReads,
    uri: &str,
    token: Option<&str>,
) -> (StatusCode, axum::http::HeaderMap, bytes::Bytes) {
    let mut req = Request::builder().uri(uri);
    if let Some(token) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let (parts, body) = res.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

/// A plain read of a cluster is answered in front of the router (`QuickReads`); the
/// same read with `index=0`, older than the catalog and so answered at once, goes to
/// the router. Both give the same status, headers and bytes, for a caller with the
/// read token, without it and with a wrong one, and the reads `QuickReads` passes on
/// (a percent-encoded name, a malformed or repeated `zoneName`, an unknown parameter,
/// a name too long) are answered by the router as before.
#[tokio::test]
async fn a_plain_cluster_read_answers_as_the_general_path_does() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = Tokens {
        read: Some("r".into()),
        anonymous_writes: true,
        ..Tokens::default()
    };
    let s = state(dir.path(), tokens);
    let metrics = s.metrics.clone();
    let limits = Arc::new(limits::Limits::new(DEFAULT_REQUEST_TIMEOUT, 64));
    let router = app_with_limits(s.clone(), 1 << 20, limits.clone());
    let app = QuickReads::new(router.clone(), s, limits);
    for (zone, cluster) in [("z", "a"), ("y", "a"), ("z", "b.c-d_e")] {
        let zone_body = serde_json::to_vec(&ZoneRecord::new(zone, "cp:1")).unwrap();
        call(&router, "POST", "/zones", Some(&zone_body)).await;
        let mut r = ClusterRecord::new(zone, cluster, "\"quoted\" \u{e9}");
        r.owner = "o".into();
        let body = serde_json::to_vec(&r).unwrap();
        let (status, _, _) = call(&router, "POST", "/clusters", Some(&body)).await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let quick = || super::quick::ANSWERED.with(std::cell::Cell::get);
    let long = format!("/clusters/{}", "a".repeat(254));
    for (path, taken) in [
        ("/clusters/a", true),
        ("/clusters/a?zoneName=z", true),
        ("/clusters/a?zoneName=x", true),
        ("/clusters/b.c-d_e", true),
        ("/clusters/ghost", true),
        ("/clusters/%61", false),
        ("/clusters/a?zoneName=", false),
        ("/clusters/a?zoneName=z&zoneName=y", false),
        ("/clusters/a?other=1", false),
        (long.as_str(), false),
    ] {
        for token in [None, Some("r"), Some("wrong")] {
            let before = quick();
            let first = answer(&app, path, token).await;
            assert_eq!(quick() - before, u64::from(taken), "{path}");
            let sep = if path.contains('?') { '&' } else { '?' };
            let general = answer(&app, &format!("{path}{sep}index=0"), token).await;
            assert_eq!(quick() - before, u64::from(taken), "{path}");
            assert_eq!(first, general, "{path} {token:?}");
        }
    }
    // The answers differ where they should: the read token shows live data.
    let (status, headers, body) = answer(&app, "/clusters/a", Some("r")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.contains_key("x-meshcat-index"));
    let views: Vec<ClusterView> = serde_json::from_slice(&body).unwrap();
    assert_eq!(views.len(), 2);
    assert!(views.iter().all(|v| v.authorized));
    let (status, _, body) = answer(&app, "/clusters/a?zoneName=z", None).await;
    assert_eq!(status, StatusCode::OK);
    let views: Vec<ClusterView> = serde_json::from_slice(&body).unwrap();
    assert!(views.len() == 1 && !views[0].authorized);
    let (status, headers, _) = answer(&app, "/clusters/ghost", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(!headers.contains_key("x-meshcat-index"));
    // Counted under the route whichever path answered: each read above twice for
    // each of 3 callers (4 found, one of them `%61`; 2 not found; 4 refused), and
    // the three reads since.
    let count = |code| metrics.count("/clusters/{clusterName}", "GET", code);
    assert_eq!(count("200"), 2 * 3 * 4 + 2);
    assert_eq!(count("404"), 2 * 3 * 2 + 1);
    assert_eq!(count("400"), 2 * 3 * 4);
}

/// Without a free permit of the concurrency limit, a plain read of a cluster is
/// answered `overloaded` like any request, and counted.
#[tokio::test]
async fn a_plain_cluster_read_holds_to_the_concurrency_limit() {
    let dir = tempfile::tempdir().unwrap();
    let s = state(
        dir.path(),
        Tokens {
            anonymous_writes: true,
            ..Tokens::default()
        },
    );
    let metrics = s.metrics.clone();
    let limits = Arc::new(limits::Limits::new(DEFAULT_REQUEST_TIMEOUT, 0));
    let app = QuickReads::new(
        app_with_limits(s.clone(), 1 << 20, limits.clone()),
        s,
        limits,
    );
    let (status, _, body) = answer(&app, "/clusters/a", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["code"], "overloaded");
    assert_eq!(metrics.count("/clusters/{clusterName}", "GET", "503"), 1);
}
