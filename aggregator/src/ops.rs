//! The ops port: Prometheus text exposition at `GET /metrics`, liveness at
//! `GET /healthz`, readiness at `GET /readyz`. The exposition is the registry's
//! families, then (unless `--cluster-metrics=false`) the per-cluster and per-edge
//! series rendered from the graph's snapshot of the catalog's current index,
//! gzip-compressed when the scraper accepts it (Prometheus does). [`OpsConfig`] says
//! which of those series it exposes.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use meshcat_common::http::accepts_gzip;
use prometheus::{Encoder, TextEncoder};
use tracing::error;

use crate::graph::snapshot::Graphs;
use crate::store::Store;
use crate::telemetry::{Telemetry, clusters};

/// What the ops endpoints expose.
#[derive(Debug, Clone, Copy)]
pub struct OpsConfig {
    /// `--cluster-metrics`: the per-cluster and per-edge series on `/metrics`.
    pub cluster_metrics: bool,
}

/// What the ops endpoints read.
#[derive(Debug)]
pub struct OpsState {
    pub store: Arc<Store>,
    pub telemetry: Telemetry,
    /// Set once every listener serves; ready also needs the registrations loaded
    /// (at once with redb, after the first etcd listing with etcd).
    pub ready: AtomicBool,
    /// The graph's snapshots, which the per-cluster and per-edge series are rendered
    /// from; `None` with `--cluster-metrics=false`.
    pub cluster_series: Option<Arc<Graphs>>,
}

impl OpsState {
    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && self.store.is_loaded()
    }
}

/// The ops router.
pub fn app(state: Arc<OpsState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(State(s): State<Arc<OpsState>>, headers: HeaderMap) -> Response {
    s.telemetry.catalog.set(&s.store.totals());
    s.telemetry.readiness.set(s.is_ready());
    let families = s.telemetry.registry.gather();
    let encoder = TextEncoder::new();
    let mut buf = Vec::with_capacity(16 * 1024);
    if let Err(e) = encoder.encode(&families, &mut buf) {
        error!(error = %e, "Metrics cannot be encoded.");
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    // Prometheus asks for gzip: the cluster and edge series of a large catalog are
    // megabytes of text that compress some 40 times.
    let gzip = accepts_gzip(&headers);
    // Without a graph (its build failed, which is logged), the cluster and edge
    // series are left out and the process's own series still answer.
    let snapshot = match &s.cluster_series {
        Some(graphs) => graphs.fresh(&s.store).await.ok(),
        None => None,
    };
    // The snapshot is shared and immutable: it is walked without any lock, on the
    // blocking pool since a large catalog takes milliseconds.
    let body = tokio::task::spawn_blocking(move || {
        if let Some(snapshot) = snapshot {
            clusters::render(snapshot.graph(), &mut buf);
        }
        if gzip { compress(&buf) } else { Ok(buf) }
    })
    .await;
    let body = match body {
        Ok(Ok(body)) => body,
        Ok(Err(e)) => {
            error!(error = %e, "Metrics cannot be compressed.");
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
        Err(e) => {
            error!(error = %e, "Metrics cannot be rendered.");
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
    };
    let mut res = (
        [
            (header::CONTENT_TYPE, encoder.format_type().to_owned()),
            (header::VARY, "accept-encoding".to_owned()),
        ],
        body,
    )
        .into_response();
    if gzip {
        res.headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    res
}

/// `text` gzip-compressed, at the fast level: a scrape waits for it.
fn compress(text: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(text.len() / 8),
        flate2::Compression::fast(),
    );
    gz.write_all(text)?;
    gz.finish()
}

async fn readyz(State(s): State<Arc<OpsState>>) -> Response {
    if s.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use meshcat_common::model::{ClusterRecord, ZoneRecord};
    use tower::ServiceExt;

    use super::*;
    use crate::store::Rules;

    fn state(dir: &std::path::Path, cluster_metrics: bool) -> Arc<OpsState> {
        let (store, instances) = Store::open(dir, Rules::defaults()).unwrap();
        store
            .create_zone(ZoneRecord {
                zone_name: "z".into(),
                request_cluster: "edge".into(),
                server_address: "cp:50000".into(),
                use_tls: false,
                ca_path: String::new(),
                cert_path: String::new(),
                key_path: String::new(),
            })
            .unwrap();
        let mut c = ClusterRecord::new("z", "orders", "Orders");
        c.owner = "team-orders".into();
        store.create_cluster(c).unwrap();
        Arc::new(OpsState {
            store: Arc::new(store),
            telemetry: Telemetry::new().unwrap(),
            ready: AtomicBool::new(true),
            cluster_series: cluster_metrics
                .then(|| Arc::new(Graphs::new(instances.traffic().clone()))),
        })
    }

    async fn scrape(state: &Arc<OpsState>, gzip: bool) -> (Option<String>, String) {
        let mut req = Request::get("/metrics");
        if gzip {
            req = req.header(header::ACCEPT_ENCODING, "gzip");
        }
        let res = app(state.clone())
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let encoding = res
            .headers()
            .get(header::CONTENT_ENCODING)
            .map(|v| v.to_str().unwrap().to_owned());
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let text = if encoding.is_some() {
            let mut out = String::new();
            flate2::read::GzDecoder::new(&body[..])
                .read_to_string(&mut out)
                .unwrap();
            out
        } else {
            String::from_utf8(body.to_vec()).unwrap()
        };
        (encoding, text)
    }

    #[tokio::test]
    async fn the_exposition_carries_the_cluster_series_gzipped_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let s = state(dir.path(), true);
        let (encoding, plain) = scrape(&s, false).await;
        assert_eq!(encoding, None);
        let down = r#"meshcat_cluster_status{zone="z",cluster="orders",owner="team-orders",status="down"} 1"#;
        assert!(plain.lines().any(|l| l == down), "{plain}");
        assert!(plain.lines().any(|l| l == "meshcat_ready 1"), "{plain}");
        let (encoding, unzipped) = scrape(&s, true).await;
        assert_eq!(encoding.as_deref(), Some("gzip"));
        assert_eq!(unzipped, plain);

        // A deleted cluster's series are gone from the next scrape.
        s.store.delete_cluster("z", "orders").unwrap();
        let (_, after) = scrape(&s, true).await;
        assert!(!after.contains("orders"), "{after}");
        assert!(after.contains("# TYPE meshcat_cluster_status gauge"));
    }

    #[tokio::test]
    async fn cluster_metrics_off_leaves_the_families_out() {
        let dir = tempfile::tempdir().unwrap();
        let (_, text) = scrape(&state(dir.path(), false), true).await;
        for f in clusters::FAMILIES {
            assert!(!text.contains(f.name), "{}:\n{text}", f.name);
        }
        assert!(text.contains("meshcat_registered_clusters 1"), "{text}");
    }
}
