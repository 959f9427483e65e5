//! The ops port: Prometheus text exposition at `GET /metrics`, liveness at
//! `GET /healthz`, readiness at `GET /readyz`. The exposition is the registry's
//! families, then (unless `--cluster-metrics=false`) the per-cluster and per-edge
//! series rendered from the graph's snapshot of the catalog's current index.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::{Encoder, TextEncoder};
use tracing::error;

use crate::graph::snapshot::Graphs;
use crate::store::Store;
use crate::telemetry::{Telemetry, clusters};

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

async fn metrics(State(s): State<Arc<OpsState>>) -> Response {
    s.telemetry.catalog.set(&s.store.totals());
    s.telemetry.readiness.set(s.is_ready());
    let families = s.telemetry.registry.gather();
    let encoder = TextEncoder::new();
    let mut buf = Vec::with_capacity(16 * 1024);
    if let Err(e) = encoder.encode(&families, &mut buf) {
        error!(error = %e, "Metrics cannot be encoded.");
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    if let Some(graphs) = &s.cluster_series {
        // The snapshot is shared and immutable: it is walked without any lock, on
        // the blocking pool since a large catalog takes milliseconds.
        let snapshot = graphs.fresh(&s.store).await;
        buf = match tokio::task::spawn_blocking(move || {
            clusters::render(snapshot.graph(), &mut buf);
            buf
        })
        .await
        {
            Ok(buf) => buf,
            Err(e) => {
                error!(error = %e, "Cluster metrics cannot be rendered.");
                return StatusCode::INTERNAL_SERVER_ERROR.into_response();
            }
        };
    }
    (
        [(header::CONTENT_TYPE, encoder.format_type().to_owned())],
        buf,
    )
        .into_response()
}

async fn readyz(State(s): State<Arc<OpsState>>) -> Response {
    if s.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response()
    }
}
