//! The ops port: Prometheus text exposition at `GET /metrics`, liveness at
//! `GET /healthz`, readiness at `GET /readyz`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus::{Encoder, TextEncoder};
use tracing::error;

use crate::store::Store;
use crate::telemetry::Telemetry;

/// What the ops endpoints read.
#[derive(Debug)]
pub struct OpsState {
    pub store: Arc<Store>,
    pub telemetry: Telemetry,
    /// Set once every listener serves; ready also needs the registrations loaded
    /// (at once with redb, after the first etcd listing with etcd).
    pub ready: AtomicBool,
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
    let families = s.telemetry.registry.gather();
    let encoder = TextEncoder::new();
    let mut buf = Vec::with_capacity(16 * 1024);
    if let Err(e) = encoder.encode(&families, &mut buf) {
        error!(error = %e, "Metrics cannot be encoded.");
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    (
        [(header::CONTENT_TYPE, encoder.format_type().to_owned())],
        buf,
    )
        .into_response()
}

async fn readyz(State(s): State<Arc<OpsState>>) -> Response {
    if s.ready.load(Ordering::Acquire) && s.store.is_loaded() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response()
    }
}
