//! Black-box tests of the catalog API over real HTTP on 127.0.0.1:0: every endpoint,
//! every filter, every error code, tokens, status and the ops port.

use std::path::Path;
use std::time::{Duration, Instant};

use meshcat_aggregator::config::Config;
use meshcat_aggregator::{RunningAggregator, start};
use meshcat_common::model::InstanceMetrics;
use meshcat_common::wire::InstanceReport;
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};

struct Api {
    agg: RunningAggregator,
    http: Client,
    base: String,
    token: Option<String>,
    _dir: tempfile::TempDir,
}

async fn start_with(tune: impl FnOnce(&mut Config, &Path)) -> Api {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::for_tests(&dir.path().join("data"));
    tune(&mut config, dir.path());
    let agg = start(config).await.unwrap();
    let base = agg.api_url();
    Api {
        agg,
        http: Client::new(),
        base,
        token: None,
        _dir: dir,
    }
}

async fn plain() -> Api {
    start_with(|_, _| {}).await
}

impl Api {
    async fn send(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.unwrap();
        let status = res.status();
        let text = res.text().await.unwrap();
        let v = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if !status.is_success() {
            assert_error_body(&v);
        }
        (status, v)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(Method::POST, path, Some(body)).await
    }

    async fn zone(&self, name: &str) {
        let (s, _) = self
            .post(
                "/zones",
                json!({"zoneName": name, "serverAddress": "cp:50000", "requestCluster": "edge"}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED);
    }

    async fn cluster(&self, body: Value) {
        let (s, v) = self.post("/clusters", body).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }

    /// Cluster names of a `GET /clusters` answer, as `zone/cluster`.
    async fn names(&self, query: &str) -> Vec<String> {
        let (s, v) = self.get(&format!("/clusters?{query}")).await;
        assert_eq!(s, StatusCode::OK, "{query}: {v}");
        v.as_array()
            .unwrap()
            .iter()
            .map(|c| {
                format!(
                    "{}/{}",
                    c["zoneName"].as_str().unwrap(),
                    c["clusterName"].as_str().unwrap()
                )
            })
            .collect()
    }
}

fn assert_error_body(v: &Value) {
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("error body is not an object: {v}"));
    assert_eq!(o.len(), 2, "{v}");
    assert!(o["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    let code = o["code"].as_str().unwrap();
    assert!(
        code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
        "{v}"
    );
}

fn report(
    zone: &str,
    cluster: &str,
    instance: &str,
    reachable: bool,
    req: u64,
    err: u64,
) -> InstanceReport {
    InstanceReport {
        admin_address: "127.0.0.1:9901".into(),
        reachable,
        start_time_ms: 1_700_000_000_000,
        server_state: "LIVE".into(),
        envoy_version: "1.40.0".into(),
        requests_total: req,
        errors_5xx_total: err,
        metrics: InstanceMetrics {
            mesh_metrics_version: "1".into(),
            total_requests: req as i64,
            all_requests: req as i64,
            ..InstanceMetrics::default()
        },
        ..InstanceReport::unread(zone.into(), cluster.into(), instance.into())
    }
}

#[tokio::test]
async fn zones_crud() {
    let api = plain().await;
    api.zone("zb").await;
    api.zone("za").await;
    let (s, v) = api
        .post("/zones", json!({"zoneName": "za", "serverAddress": "cp:1"}))
        .await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::CONFLICT, Some("conflict"))
    );
    let (s, v) = api.get("/zones").await;
    assert_eq!(s, StatusCode::OK);
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|z| z["zoneName"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["za", "zb"]);
    assert_eq!(
        v[0],
        json!({"zoneName": "za", "requestCluster": "edge", "serverAddress": "cp:50000",
               "useTls": false, "caPath": "", "certPath": "", "keyPath": ""})
    );
    let (s, v) = api.get("/zones/za").await;
    assert_eq!((s, v["zoneName"].as_str()), (StatusCode::OK, Some("za")));
    assert_eq!(api.get("/zones/nope").await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        api.get("/zones/nope/metadata").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        api.get("/zones/bad%20name").await.0,
        StatusCode::BAD_REQUEST
    );

    api.cluster(json!({"clusterName": "c1", "zoneName": "za", "name": "C1"}))
        .await;
    api.cluster(json!({"clusterName": "c1", "zoneName": "zb", "name": "C1"}))
        .await;
    let (s, v) = api.send(Method::DELETE, "/zones/za", None).await;
    assert_eq!((s, v["zoneName"].as_str()), (StatusCode::OK, Some("za")));
    assert_eq!(api.names("").await, ["zb/c1"]);
    assert_eq!(
        api.send(Method::DELETE, "/zones/za", None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(api.get("/zones/za").await.0, StatusCode::NOT_FOUND);
    api.agg.stop().await.unwrap();
}

/// `PUT /zones/{zoneName}` replaces the whole record and keeps the zone's clusters;
/// 404 for an absent zone, 422 for a body naming another zone or failing the rules
/// of `POST /zones` (the TLS files included); nothing is written when refused.
#[tokio::test]
async fn zones_are_replaced_whole() {
    let api = plain().await;
    api.zone("z").await;
    api.cluster(json!({"clusterName": "c", "zoneName": "z", "name": "C"}))
        .await;
    let put = |path: &'static str, body: Value| api.send(Method::PUT, path, Some(body));

    let (s, v) = put(
        "/zones/z",
        json!({"zoneName": "z", "serverAddress": "control.z:60000"}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        json!({"zoneName": "z", "requestCluster": "", "serverAddress": "control.z:60000",
               "useTls": false, "caPath": "", "certPath": "", "keyPath": ""}),
        "the whole record is replaced: requestCluster falls back to its default"
    );
    assert_eq!(api.get("/zones/z").await.1, v);
    assert_eq!(api.names("").await, ["z/c"], "its clusters stay");

    let (s, v) = put(
        "/zones/ghost",
        json!({"zoneName": "ghost", "serverAddress": "cp:1"}),
    )
    .await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    assert_eq!(api.get("/zones/ghost").await.0, StatusCode::NOT_FOUND);

    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("plain.txt");
    std::fs::write(&not_pem, "hello").unwrap();
    let not_pem = not_pem.display().to_string();
    for bad in [
        json!({"zoneName": "other", "serverAddress": "cp:1"}),
        json!({"zoneName": "z", "serverAddress": "no-port"}),
        json!({"zoneName": "z"}),
        json!({"zoneName": "z", "serverAddress": "cp:1", "useTls": true}),
        json!({"zoneName": "z", "serverAddress": "cp:1", "useTls": true,
               "caPath": not_pem, "certPath": not_pem, "keyPath": not_pem}),
    ] {
        let (s, v) = put("/zones/z", bad.clone()).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad} -> {v}");
    }
    let (_, v) = put(
        "/zones/z",
        json!({"zoneName": "other", "serverAddress": "cp:1"}),
    )
    .await;
    assert!(
        v["error"].as_str().unwrap().contains("differs"),
        "the mismatch is named: {v}"
    );
    // A 422 for an absent zone too: the body is checked before the zone is looked up.
    let (s, _) = put("/zones/ghost", json!({"zoneName": "ghost"})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        api.get("/zones/z").await.1["serverAddress"],
        "control.z:60000",
        "refused replacements wrote nothing"
    );

    let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let mut paths = Vec::new();
    for f in ["ca.pem", "cert.pem", "key.pem"] {
        let p = dir.path().join(f);
        std::fs::write(&p, pem).unwrap();
        paths.push(p.display().to_string());
    }
    let (s, v) = put(
        "/zones/z",
        json!({"zoneName": "z", "serverAddress": "10.0.0.1:443", "useTls": true,
               "caPath": paths[0], "certPath": paths[1], "keyPath": paths[2]}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(api.get("/zones/z").await.1["caPath"], paths[0]);
    let (s, v) = put(
        "/zones/z?zoneName=z",
        json!({"zoneName": "z", "serverAddress": "cp:1"}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
}

#[tokio::test]
async fn zone_validation() {
    let api = plain().await;
    for bad in [
        json!({"zoneName": "z", "serverAddress": "no-port"}),
        json!({"zoneName": "z", "serverAddress": "cp:0"}),
        json!({"zoneName": "bad name", "serverAddress": "cp:1"}),
        json!({"zoneName": "z", "serverAddress": "cp:1", "useTls": true}),
        json!({"zoneName": "z", "serverAddress": "cp:1", "useTls": true,
               "caPath": "/nonexistent/ca.pem", "certPath": "/nonexistent/c.pem", "keyPath": "/nonexistent/k.pem"}),
        json!({"serverAddress": "cp:1"}),
        json!({"zoneName": "z"}),
        json!({"zoneName": 5, "serverAddress": "cp:1"}),
    ] {
        let (s, v) = api.post("/zones", bad.clone()).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad} -> {v}");
    }
    let dir = tempfile::tempdir().unwrap();
    let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let mut paths = Vec::new();
    for f in ["ca.pem", "cert.pem", "key.pem"] {
        let p = dir.path().join(f);
        std::fs::write(&p, pem).unwrap();
        paths.push(p.display().to_string());
    }
    let not_pem = dir.path().join("plain.txt");
    std::fs::write(&not_pem, "hello").unwrap();
    let (s, _) = api
        .post(
            "/zones",
            json!({"zoneName": "t", "serverAddress": "10.0.0.1:443", "useTls": true,
            "caPath": not_pem.display().to_string(), "certPath": paths[1], "keyPath": paths[2]}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    // Only regular files up to 1 MiB are read; whatever else, one message that does
    // not tell which paths exist. A FIFO or /dev/zero must not hang or fill memory.
    let fifo = dir.path().join("fifo");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let big = dir.path().join("big.pem");
    let mut text = pem.as_bytes().to_vec();
    text.resize((1 << 20) + 1, b'A');
    std::fs::write(&big, text).unwrap();
    let mut messages = Vec::new();
    for ca in [
        fifo.display().to_string(),
        "/dev/zero".to_owned(),
        big.display().to_string(),
        dir.path().display().to_string(),
        "/nonexistent/ca.pem".to_owned(),
        not_pem.display().to_string(),
    ] {
        let (s, v) = api
            .post(
                "/zones",
                json!({"zoneName": "t", "serverAddress": "10.0.0.1:443", "useTls": true,
                "caPath": ca, "certPath": paths[1], "keyPath": paths[2]}),
            )
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{ca}: {v}");
        assert!(!v["error"].as_str().unwrap().contains(&ca), "{v}");
        messages.push(v["error"].clone());
    }
    messages.dedup();
    assert_eq!(messages.len(), 1, "{messages:?}");
    let (s, v) = api
        .post(
            "/zones",
            json!({"zoneName": "t", "serverAddress": "[::1]:443", "useTls": true,
            "caPath": paths[0], "certPath": paths[1], "keyPath": paths[2], "extra": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["caPath"], paths[0]);
    assert!(v.get("extra").is_none());
    assert_eq!(api.get("/zones").await.1.as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn clusters_crud() {
    let api = plain().await;
    api.zone("z1").await;
    api.zone("z2").await;
    let body = json!({"clusterName": "svc", "zoneName": "z1", "name": "Service", "owner": "team",
        "protocols": ["http"], "externalLinks": [{"name": "runbook", "link": "https://x"}],
        "unknownField": true});
    let (s, v) = api.post("/clusters", body.clone()).await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(v["owner"], "team");
    assert_eq!(v["version"], "");
    assert_eq!(v["minInstances"], 0);
    assert_eq!(v["enableInstanceMetrics"], false);
    assert!(v.get("unknownField").is_none());
    assert!(
        v.get("status").is_none(),
        "write answers echo the record only"
    );
    let (s, v) = api.post("/clusters", body.clone()).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::CONFLICT, Some("conflict"))
    );
    let (s, _) = api
        .post(
            "/clusters",
            json!({"clusterName": "svc", "zoneName": "nope", "name": "S"}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    api.cluster(json!({"clusterName": "svc", "zoneName": "z2", "name": "Service two"}))
        .await;

    let (s, v) = api.get("/clusters/svc").await;
    assert_eq!(s, StatusCode::OK);
    let arr = v.as_array().unwrap();
    assert_eq!(arr.len(), 2);
    assert_eq!(arr[0]["zoneName"], "z1");
    assert_eq!(arr[0]["authorized"], true);
    assert_eq!(arr[0]["instances"], json!([]));
    assert_eq!(arr[0]["status"], "down");
    assert_eq!(arr[0]["externalLinks"][0]["name"], "runbook");
    let (s, v) = api.get("/clusters/svc?zoneName=z2").await;
    assert_eq!((s, v.as_array().unwrap().len()), (StatusCode::OK, 1));
    assert_eq!(
        api.get("/clusters/svc?zoneName=z3").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(api.get("/clusters/none").await.0, StatusCode::NOT_FOUND);

    // PUT replaces the whole record.
    let (s, v) = api
        .send(
            Method::PUT,
            "/clusters/svc",
            Some(json!({"clusterName": "svc", "zoneName": "z1", "name": "Renamed"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (v["name"].as_str(), v["owner"].as_str()),
        (Some("Renamed"), Some(""))
    );
    assert_eq!(
        api.get("/clusters/svc?zoneName=z1").await.1[0]["name"],
        "Renamed"
    );
    let (s, _) = api
        .send(
            Method::PUT,
            "/clusters/svc",
            Some(json!({"clusterName": "other", "zoneName": "z1", "name": "X"})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let (s, _) = api
        .send(
            Method::PUT,
            "/clusters/ghost",
            Some(json!({"clusterName": "ghost", "zoneName": "z1", "name": "X"})),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = api
        .send(
            Method::PUT,
            "/clusters/svc",
            Some(json!({"clusterName": "svc", "zoneName": "zz", "name": "X"})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);

    // DELETE needs zoneName.
    let (s, v) = api.send(Method::DELETE, "/clusters/svc", None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("zoneName"));
    let (s, v) = api
        .send(Method::DELETE, "/clusters/svc?zoneName=z1", None)
        .await;
    assert_eq!((s, v["name"].as_str()), (StatusCode::OK, Some("Renamed")));
    assert_eq!(
        api.send(Method::DELETE, "/clusters/svc?zoneName=z1", None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(api.names("").await, ["z2/svc"]);
}

#[tokio::test]
async fn cluster_validation() {
    let api = plain().await;
    api.zone("z").await;
    for bad in [
        json!({"zoneName": "z", "name": "n"}),
        json!({"clusterName": "c", "name": "n"}),
        json!({"clusterName": "c", "zoneName": "z"}),
        json!({"clusterName": "", "zoneName": "z", "name": "n"}),
        json!({"clusterName": "a b", "zoneName": "z", "name": "n"}),
        json!({"clusterName": "x".repeat(254), "zoneName": "z", "name": "n"}),
        json!({"clusterName": "c", "zoneName": "z", "name": "n", "minInstances": -1}),
        json!({"clusterName": "c", "zoneName": "z", "name": "n", "maxInstances": -1}),
        json!({"clusterName": "c", "zoneName": "z", "name": "n", "minInstances": 3, "maxInstances": 2}),
        json!({"clusterName": "c", "zoneName": "z", "name": "n", "metricsPort": 65536}),
        json!({"clusterName": "c", "zoneName": "z", "name": "n", "minInstances": "two"}),
        json!({"clusterName": "c", "zoneName": "z", "name": "n", "protocols": "http"}),
        json!(["not", "an", "object"]),
    ] {
        let (s, v) = api.post("/clusters", bad.clone()).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{bad} -> {v}");
    }
    for ok in [
        json!({"clusterName": "x".repeat(253), "zoneName": "z", "name": "n"}),
        json!({"clusterName": "c0", "zoneName": "z", "name": "n", "minInstances": 5, "maxInstances": 0, "metricsPort": 65535}),
        json!({"clusterName": "c1", "zoneName": "z", "name": "n", "owner": null}),
    ] {
        api.cluster(ok).await;
    }
    assert_eq!(api.names("").await.len(), 3);

    // Link fields take web addresses (and, for the documentation fields, a path on
    // the same site) only; the answer names the field, and nothing is stored.
    for (field, value) in [
        ("ownerURL", json!("javascript:alert(1)")),
        ("apiEndpoint", json!("data:text/html,<script>x</script>")),
        ("documentation", json!("//evil.example.com/docs")),
        ("apiSpecEndpoint", json!("javascript:x")),
        ("ownerURL", json!("/team")),
    ] {
        let mut body = json!({"clusterName": "links", "zoneName": "z", "name": "n"});
        body[field] = value.clone();
        let (s, v) = api.post("/clusters", body).await;
        assert_eq!(
            s,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{field}={value} -> {v}"
        );
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{field} ")),
            "{v}"
        );
    }
    let (s, v) = api
        .post(
            "/clusters",
            json!({"clusterName": "links", "zoneName": "z", "name": "n",
                   "externalLinks": [{"name": "x", "link": "javascript:alert(1)"}]}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .starts_with("externalLinks[].link ")
    );
    assert_eq!(api.names("").await.len(), 3);
    api.cluster(json!({"clusterName": "links", "zoneName": "z", "name": "n",
        "ownerURL": "https://teams.example.com/web", "documentation": "/docs/web.md",
        "apiEndpoint": "http://web.z.svc:8080", "apiSpecEndpoint": "https://web.example.com/openapi.json",
        "externalLinks": [{"name": "runbook", "link": "https://runbooks.example.com/web"}]}))
        .await;
}

#[tokio::test]
async fn http_errors() {
    let api = start_with(|c, _| c.api.max_body = 1024).await;
    api.zone("z").await;
    let url = format!("{}/clusters", api.base);
    let send = |body: &'static str, ct: Option<&'static str>| {
        let mut r = api.http.post(&url).body(body);
        if let Some(ct) = ct {
            r = r.header("content-type", ct);
        }
        r.send()
    };
    let res = send("{not json", Some("application/json")).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(res.json::<Value>().await.unwrap()["code"], "invalid_json");
    let res = send(
        r#"{"clusterName":"c","zoneName":"z","name":"n"}"#,
        Some("text/plain"),
    )
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_error_body(&res.json().await.unwrap());
    let res = send(r#"{"clusterName":"c","zoneName":"z","name":"n"}"#, None)
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let big =
        json!({"clusterName": "c", "zoneName": "z", "name": "n", "description": "x".repeat(2000)});
    let res = api.http.post(&url).json(&big).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_error_body(&res.json().await.unwrap());
    assert_eq!(api.names("").await.len(), 0, "no partial write");

    let res = api.http.patch(&url).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED);
    let allow = res.headers()["allow"].to_str().unwrap().to_owned();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
    assert_error_body(&res.json().await.unwrap());
    let res = api
        .http
        .post(format!("{}/summary", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert!(res.headers().contains_key("allow"));

    let (s, v) = api.get("/no/such/path").await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    assert_eq!(api.get("/zones?bogus=1").await.0, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn every_filter() {
    let api = plain().await;
    api.zone("z1").await;
    api.zone("z2").await;
    api.cluster(json!({"clusterName": "a", "zoneName": "z1", "name": "Alpha", "version": "1.0",
        "owner": "team one", "capability": "search", "prometheusJob": "job-a", "enableInstanceMetrics": true,
        "businessImpact": "high", "protocols": ["http", "grpc"], "minInstances": 1})).await;
    api.cluster(json!({"clusterName": "b", "zoneName": "z1", "name": "Beta", "version": "2.0",
        "owner": "team-two", "capability": "Search", "prometheusJob": "job-b", "enableHistoricalMetrics": true,
        "businessImpact": "low", "protocols": ["tcp"]})).await;
    api.cluster(
        json!({"clusterName": "a", "zoneName": "z2", "name": "Alpha", "version": "2.0",
        "owner": "team one", "capability": "search", "businessImpact": "medium"}),
    )
    .await;
    api.agg
        .instances
        .apply_report("agent", report("z1", "a", "i1", true, 0, 0), Instant::now());

    let all = ["z1/a", "z1/b", "z2/a"];
    assert_eq!(api.names("").await, all);
    let cases: &[(&str, &[&str])] = &[
        ("status=stable", &["z1/a"]),
        ("status=down", &["z1/b", "z2/a"]),
        ("status=warning", &[]),
        ("status=stable&status=down", &all),
        ("clusterName=a", &["z1/a", "z2/a"]),
        ("zoneName=z2", &["z2/a"]),
        ("name=Alpha", &["z1/a", "z2/a"]),
        ("name=alpha", &[]),
        ("version=2.0", &["z1/b", "z2/a"]),
        ("owner=team%20one", &["z1/a", "z2/a"]),
        ("owner=team%20one&owner=team-two", &all),
        ("capability=search", &["z1/a", "z2/a"]),
        ("capability=Search", &["z1/b"]),
        ("prometheusJob=job-b", &["z1/b"]),
        ("authorized=true", &all),
        ("authorized=false", &[]),
        ("enableInstanceMetrics=true", &["z1/a"]),
        ("enableInstanceMetrics=false", &["z1/b", "z2/a"]),
        ("enableHistoricalMetrics=true", &["z1/b"]),
        ("businessImpact=high&businessImpact=low", &["z1/a", "z1/b"]),
        ("protocols=grpc", &["z1/a"]),
        ("protocols=tcp&protocols=http", &["z1/a", "z1/b"]),
        ("clusterName=a&zoneName=z1", &["z1/a"]),
        (
            "name=Alpha&version=2.0&owner=team%20one&status=down",
            &["z2/a"],
        ),
        (
            "clusterName=a&status=stable&protocols=http&authorized=true&businessImpact=high",
            &["z1/a"],
        ),
    ];
    for (q, want) in cases {
        assert_eq!(api.names(q).await, *want, "{q}");
    }
    for (q, param) in [
        ("status=Stable", "status"),
        ("status=", "status"),
        ("authorized=yes", "authorized"),
        ("enableInstanceMetrics=TRUE", "enableInstanceMetrics"),
        ("enableHistoricalMetrics=1", "enableHistoricalMetrics"),
        ("colour=red", "colour"),
        ("owner=x&Owner=y", "Owner"),
    ] {
        let (s, v) = api.get(&format!("/clusters?{q}")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{q}");
        assert!(v["error"].as_str().unwrap().contains(param), "{q}: {v}");
    }
}

#[tokio::test]
async fn status_instances_metrics_and_summaries() {
    let api = start_with(|c, _| c.store.rules.instance_ttl = Duration::from_millis(600)).await;
    api.zone("z").await;
    api.zone("empty").await;
    api.cluster(
        json!({"clusterName": "web", "zoneName": "z", "name": "Web", "version": "3",
        "owner": "o1", "capability": "cap", "minInstances": 2, "maxInstances": 3}),
    )
    .await;
    api.cluster(json!({"clusterName": "db", "zoneName": "z", "name": "DB", "owner": "o2"}))
        .await;
    let live = &api.agg.instances;
    let now = Instant::now();
    live.apply_report("a1", report("z", "web", "web-2", true, 0, 0), now);
    live.apply_report("a1", report("z", "web", "web-1", true, 0, 0), now);
    live.apply_report("a2", report("z", "db", "db-1", true, 100, 0), now);
    live.apply_report("a2", report("z", "db", "db-1", true, 200, 50), now);

    let (_, v) = api.get("/clusters/web").await;
    assert_eq!(v[0]["status"], "stable");
    // An instance whose sidecar reported no certificates has identity `none`.
    let none = json!({"state": "none", "sans": [], "expiresAtMs": null, "validFromMs": null,
        "source": null, "secret": null, "serial": null, "reason": null});
    assert_eq!(
        v[0]["instances"],
        json!([{"name": "web-1", "startTime": 1_700_000_000_000i64, "source": "agent", "identity": none},
        {"name": "web-2", "startTime": 1_700_000_000_000i64, "source": "agent", "identity": none}])
    );
    assert_eq!(api.get("/clusters/db").await.1[0]["status"], "warning");

    live.apply_report("a1", report("z", "web", "node-a:9901", false, 0, 0), now);
    assert_eq!(
        api.get("/metrics/web/node-a:9901").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        api.get("/metrics/web/a%20b").await.0,
        StatusCode::BAD_REQUEST
    );
    let (s, m) = api.get("/metrics/web/web-1").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(m["mesh-metrics-version"], "1");
    assert!(m.get("all/latency_ms.p9999").is_some());
    assert_eq!(
        api.get("/metrics/web/web-1?zoneName=z").await.0,
        StatusCode::OK
    );
    assert_eq!(
        api.get("/metrics/web/web-1?zoneName=empty").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(api.get("/metrics/web/web-9").await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        api.get("/metrics/nope/web-1").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(api.get("/metrics/Web/3/web-2").await.0, StatusCode::OK);
    assert_eq!(
        api.get("/metrics/Web/4/web-2").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        api.get("/metrics/Web/3/web-9").await.0,
        StatusCode::NOT_FOUND
    );

    let (s, md) = api.get("/zones/z/metadata").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        md,
        json!({"zoneName": "z", "owners": ["o1", "o2"], "capabilities": ["cap"],
        "serviceCount": 2, "stableServiceCount": 1, "warningServiceCount": 1, "downServiceCount": 0,
        "instanceCount": 3})
    );
    let (s, sum) = api.get("/summary").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(sum["zones"], sum["meshes"]);
    assert_eq!(
        sum["metadata"],
        json!({"zoneCount": 2, "owners": ["o1", "o2"], "capabilities": ["cap"],
        "clusterCount": 2, "clusterStableCount": 1, "clusterWarningCount": 1, "clusterDownCount": 0,
        "instanceCount": 3})
    );
    assert_eq!(sum["zones"]["z"]["metadata"]["clusterWarningCount"], 1);
    assert_eq!(sum["zones"]["z"]["clusters"]["web"]["status"], "stable");
    assert_eq!(sum["zones"]["empty"]["clusters"], json!({}));

    // An unreachable sidecar is not live.
    live.apply_report(
        "a1",
        report("z", "web", "web-2", false, 0, 0),
        Instant::now(),
    );
    assert_eq!(api.get("/clusters/web").await.1[0]["status"], "warning");
    assert_eq!(api.get("/metrics/web/web-2").await.0, StatusCode::NOT_FOUND);

    // Silence: the TTL drops every instance, within one expiry period.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, sum) = api.get("/summary").await;
        if sum["metadata"]["clusterDownCount"] == 2 {
            assert_eq!(sum["metadata"]["instanceCount"], 0);
            break;
        }
        assert!(Instant::now() < deadline, "instances never expired: {sum}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        api.get("/clusters?status=down")
            .await
            .1
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn services_lists_unregistered_clusters() {
    let api = plain().await;
    api.zone("z").await;
    api.zone("y").await;
    api.cluster(json!({"clusterName": "reg", "zoneName": "z", "name": "Registered"}))
        .await;
    api.agg
        .instances
        .apply_report("a", report("z", "seen", "s-1", true, 0, 0), Instant::now());
    api.agg
        .instances
        .set_edge_clusters("y", vec!["routed".into()]);
    let (s, v) = api.get("/services").await;
    assert_eq!(s, StatusCode::OK);
    let got: Vec<(String, String, String, String)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["zoneName"].as_str().unwrap().into(),
                c["clusterName"].as_str().unwrap().into(),
                c["name"].as_str().unwrap().into(),
                c["status"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("y".into(), "routed".into(), "routed".into(), "down".into()),
            ("z".into(), "reg".into(), "Registered".into(), "down".into()),
            ("z".into(), "seen".into(), "seen".into(), "stable".into()),
        ]
    );
    let (_, v) = api.get("/services?zoneName=z").await;
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(v[1]["instances"][0]["name"], "s-1");
    assert_eq!(v[1]["owner"], "");
    assert_eq!(api.get("/services?zone=z").await.0, StatusCode::BAD_REQUEST);
    // GET /clusters lists registered clusters only.
    assert_eq!(api.names("").await, ["z/reg"]);
}

#[tokio::test]
async fn tokens() {
    let mut api = start_with(|c, _| {
        c.tokens.write = Some("w-secret".into());
        c.tokens.read = Some("r-secret".into());
    })
    .await;
    let zone = json!({"zoneName": "z", "serverAddress": "cp:1"});
    let (s, v) = api.post("/zones", zone.clone()).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthorized"))
    );
    api.token = Some("wrong".into());
    assert_eq!(
        api.post("/zones", zone.clone()).await.0,
        StatusCode::UNAUTHORIZED
    );
    api.token = Some("w-secret".into());
    assert_eq!(api.post("/zones", zone).await.0, StatusCode::CREATED);
    api.cluster(json!({"clusterName": "c", "zoneName": "z", "name": "C"}))
        .await;
    api.token = None;
    assert_eq!(
        api.send(Method::DELETE, "/clusters/c?zoneName=z", None)
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        api.send(Method::PUT, "/clusters/c", Some(json!({})))
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    // A zone replacement needs the write token too, and it is asked for before the
    // path, the query and the body are looked at.
    for (path, body) in [
        (
            "/zones/z",
            json!({"zoneName": "z", "serverAddress": "cp:2"}),
        ),
        ("/zones/z", json!({})),
        ("/zones/bad%20name?bogus=1", json!({"zoneName": "other"})),
        (
            "/zones/ghost",
            json!({"zoneName": "ghost", "serverAddress": "cp:2"}),
        ),
    ] {
        for token in [None, Some("r-secret"), Some("wrong")] {
            api.token = token.map(str::to_owned);
            let (s, v) = api.send(Method::PUT, path, Some(body.clone())).await;
            assert_eq!(
                (s, v["code"].as_str()),
                (StatusCode::UNAUTHORIZED, Some("unauthorized")),
                "{path} {body} with {token:?}"
            );
        }
    }
    api.token = Some("w-secret".into());
    let (s, v) = api
        .send(
            Method::PUT,
            "/zones/z",
            Some(json!({"zoneName": "z", "serverAddress": "cp:2"})),
        )
        .await;
    assert_eq!(
        (s, v["serverAddress"].as_str()),
        (StatusCode::OK, Some("cp:2"))
    );
    api.token = None;
    api.agg
        .instances
        .apply_report("a", report("z", "c", "i", true, 0, 0), Instant::now());

    // Without the read token: metadata only.
    let (_, v) = api.get("/clusters/c").await;
    assert_eq!(
        (v[0]["authorized"].as_bool(), &v[0]["instances"]),
        (Some(false), &json!([]))
    );
    assert_eq!(api.names("authorized=false").await, ["z/c"]);
    assert!(api.names("authorized=true").await.is_empty());
    let (s, v) = api.get("/metrics/c/i").await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
    assert_eq!(
        api.get("/summary").await.1["zones"]["z"]["clusters"]["c"]["instances"],
        json!([])
    );
    assert_eq!(api.get("/services").await.1[0]["authorized"], false);

    // With it: live data too.
    api.token = Some("  r-secret".into());
    let (_, v) = api.get("/clusters/c").await;
    assert_eq!(v[0]["authorized"], true);
    assert_eq!(v[0]["instances"][0]["name"], "i");
    assert_eq!(api.names("authorized=true").await, ["z/c"]);
    assert_eq!(api.get("/metrics/c/i").await.0, StatusCode::OK);
    assert_eq!(
        api.get("/summary").await.1["zones"]["z"]["clusters"]["c"]["instances"][0]["name"],
        "i"
    );

    // A debug window changes sidecars: the read token is not enough, and the check
    // comes before the query is validated.
    for q in [
        "zoneName=z&symptom=no_healthy_upstream&debugSeconds=30",
        "zoneName=z&debugSeconds=oops",
    ] {
        let (s, v) = api.get(&format!("/diagnose/c?{q}")).await;
        assert_eq!(
            (s, v["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("unauthorized")),
            "{q}"
        );
    }
    // Authentication comes first on every live-data route: without the read token
    // the answer is 403 whatever else is wrong (a bad name, an unknown cluster or
    // instance, a bad query), so it tells nothing about what exists.
    api.token = None;
    for path in [
        "/metrics/nosuch/i",
        "/metrics/c/nosuch?zoneName=z",
        "/metrics/c/i?bogus=1",
        "/metrics/N/1.0/i",
        "/zones/z/clusters/c/instances/i/logging",
        "/zones/z/clusters/c/instances/i/logging?bogus=1",
        "/zones/bad%20zone/clusters/c/instances/i/logging",
        "/zones/nosuch/clusters/c/instances/i/logging",
        "/diagnose/c?zoneName=z",
        "/diagnose/bad%20name?zoneName=z",
        "/diagnose/c?zoneName=nosuch&symptom=nonsense",
        "/diagnose/c",
    ] {
        let (s, v) = api.get(path).await;
        assert_eq!(
            (s, v["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("forbidden")),
            "{path}"
        );
    }
    // HEAD is a read like GET.
    let head = api
        .http
        .head(format!("{}/metrics/nosuch/i", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), StatusCode::FORBIDDEN);

    // The write token grants what the read token grants.
    api.token = Some("w-secret".into());
    assert_eq!(api.get("/metrics/c/i").await.0, StatusCode::OK);
    let (s, v) = api.get("/diagnose/c?zoneName=z&debugSeconds=oops").await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_query"))
    );
}

/// Without a write token and without `--allow-anonymous-writes`, a zone replacement
/// is refused like every write, before anything else is looked at.
#[tokio::test]
async fn zone_replacement_without_a_write_token_is_disabled() {
    let api = start_with(|c, _| {
        c.tokens.write = None;
        c.tokens.anonymous_writes = false;
    })
    .await;
    api.agg
        .store
        .writes()
        .create_zone(
            serde_json::from_value(json!({"zoneName": "z", "serverAddress": "cp:1"})).unwrap(),
        )
        .unwrap();
    for (path, body) in [
        (
            "/zones/z",
            json!({"zoneName": "z", "serverAddress": "cp:2"}),
        ),
        ("/zones/ghost", json!({"zoneName": "other"})),
    ] {
        let (s, v) = api.send(Method::PUT, path, Some(body)).await;
        assert_eq!(
            (s, v["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("writes_disabled")),
            "{path}"
        );
    }
    assert_eq!(api.get("/zones/z").await.1["serverAddress"], "cp:1");
}

#[tokio::test]
async fn openapi_is_served() {
    let api = plain().await;
    let (s, v) = api.get("/openapi.json").await;
    assert_eq!(s, StatusCode::OK);
    assert!(v["openapi"].as_str().unwrap().starts_with("3."));
    assert!(v["paths"]["/clusters/{clusterName}"]["delete"].is_object());
}

#[tokio::test]
async fn ops_port() {
    let api = plain().await;
    api.zone("z").await;
    api.cluster(json!({"clusterName": "c", "zoneName": "z", "name": "C"}))
        .await;
    api.get("/clusters/c").await;
    api.get("/clusters/missing").await;
    let ops = api.agg.ops_url();
    let get = |p: &str| api.http.get(format!("{ops}{p}")).send();
    assert_eq!(get("/healthz").await.unwrap().status(), StatusCode::OK);
    assert_eq!(get("/readyz").await.unwrap().status(), StatusCode::OK);
    let res = get("/metrics").await.unwrap();
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = res.text().await.unwrap();
    for line in [
        r#"meshcat_api_requests_total{code="200",method="GET",route="/clusters/{clusterName}"} 1"#,
        r#"meshcat_api_requests_total{code="404",method="GET",route="/clusters/{clusterName}"} 1"#,
        r#"meshcat_api_requests_total{code="201",method="POST",route="/zones"} 1"#,
        "meshcat_registered_zones 1",
        "meshcat_registered_clusters 1",
        "meshcat_live_instances 0",
        r#"meshcat_clusters_by_status{status="down"} 1"#,
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(text.contains("meshcat_api_request_duration_seconds_bucket{method=\"GET\",route=\"/clusters/{clusterName}\""));
    api.agg.stop().await.unwrap();
}

#[tokio::test]
async fn large_answers_can_be_gzipped() {
    use std::io::Read;
    let api = plain().await;
    api.zone("z").await;
    api.cluster(json!({"clusterName": "c", "zoneName": "z", "name": "C"}))
        .await;
    for path in ["/summary", "/clusters"] {
        let plain = api.get(path).await.1;
        let res = api
            .http
            .get(format!("{}{path}", api.base))
            .header("accept-encoding", "br;q=1.0, gzip;q=0.8")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["content-encoding"], "gzip");
        assert_eq!(res.headers()["vary"], "accept-encoding");
        let raw = res.bytes().await.unwrap();
        let mut text = String::new();
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap(),
            plain,
            "{path}"
        );
        let res = api
            .http
            .get(format!("{}{path}", api.base))
            .header("accept-encoding", "gzip;q=0")
            .send()
            .await
            .unwrap();
        assert!(res.headers().get("content-encoding").is_none());
    }
}

#[tokio::test]
async fn bulk_registration_is_all_or_nothing() {
    let api = plain().await;
    api.zone("z").await;
    let c = |name: &str| json!({"zoneName": "z", "clusterName": name, "name": name});

    // One invalid record: nothing stored, the index named.
    let (s, v) = api
        .post(
            "/clusters",
            json!([c("a"), c("b"), {"zoneName": "z", "clusterName": "bad name", "name": "x"}]),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_error_body(&v);
    assert!(v["error"].as_str().unwrap().starts_with("Record 2:"), "{v}");
    assert!(api.names("").await.is_empty());

    // A record of a missing zone, or one twice: refused whole as well.
    let (s, v) = api
        .post(
            "/clusters",
            json!([c("a"), {"zoneName": "nowhere", "clusterName": "b", "name": "b"}]),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(v["error"].as_str().unwrap().starts_with("Record 1:"), "{v}");
    let (s, v) = api.post("/clusters", json!([c("a"), c("a")])).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert!(v["error"].as_str().unwrap().starts_with("Record 1:"), "{v}");
    let (s, v) = api.post("/clusters", json!([c("a"), 7])).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(v["error"].as_str().unwrap().starts_with("Record 1 "), "{v}");
    assert!(api.names("").await.is_empty());

    // Bounds on the count.
    let (s, _) = api.post("/clusters", json!([])).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let many: Vec<Value> = (0..1001).map(|i| c(&format!("c{i}"))).collect();
    let (s, v) = api.post("/clusters", Value::Array(many)).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(api.names("").await.is_empty());

    // All valid: 201 with the stored records in the order sent.
    let (s, v) = api.post("/clusters", json!([c("b"), c("a")])).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let sent: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["clusterName"].as_str().unwrap())
        .collect();
    assert_eq!(sent, ["b", "a"]);
    assert_eq!(api.names("").await, ["z/a", "z/b"]);
    // Now one of them exists: the next bulk naming it stores nothing.
    let (s, v) = api.post("/clusters", json!([c("c"), c("b")])).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(api.names("").await, ["z/a", "z/b"]);
}
