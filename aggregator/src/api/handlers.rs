//! The handlers of contract section 2: parse and check the request, ask the store,
//! shape the answer. Registration writes run on the blocking pool because they wait
//! for the durable commit.

use std::sync::Arc;

use axum::Json;
use axum::extract::{FromRequest, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use meshcat_common::model::{
    ClusterRecord, ClusterView, InstanceMetrics, Summary, ZoneMetadata, ZoneRecord,
};
use meshcat_common::validate;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{error, info};
use utoipa::openapi::schema::{ArrayBuilder, OneOfBuilder, Schema};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

use super::AppState;
use super::auth::{Caller, Reader, Writer};
use super::blocking::BlockingQuery;
use super::error::{ApiError, ErrorBody};
use super::paths::{ClusterPath, MetricsByVersionPath, MetricsPath, Valid, ZonePath};
use super::query::{self, ClusterFilter, RequiredZoneQuery, ZoneQuery};
use super::responses::{BodyRefused, NotFound, ReadTokenMissing, StorageFull, WriteTokenMissing};
use crate::store::{Cached, CachedKind, Committed, MetricsLookup, Store, StoreError, Write};

mod clusters;
mod instances;
mod zones;

pub use clusters::*;
pub use instances::*;
pub use zones::*;

type Shared = State<Arc<AppState>>;

/// A JSON body whose rejections become [`ApiError`]s (400, 413, 415, 422).
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let Json(v) = Json::<T>::from_request(req, state).await?;
        Ok(JsonBody(v))
    }
}

fn no_query(raw: Option<&str>) -> Result<(), ApiError> {
    query::parse(raw, &[]).map(|_| ())
}

/// Runs a registration on the blocking pool: it waits for the durable commit.
async fn blocking<T: Send + 'static>(
    store: &Arc<Store>,
    f: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    let store = store.clone();
    match tokio::task::spawn_blocking(move || f(&store)).await {
        Ok(r) => r.map_err(ApiError::from),
        Err(e) => {
            error!(error = %e, "Registration task failed.");
            Err(ApiError::internal())
        }
    }
}

/// Commits one registration write; the task waits for the durable commit without
/// holding a thread.
async fn write_one(store: &Arc<Store>, w: Write) -> Result<Committed, ApiError> {
    let mut changes = store
        .commit_async(vec![w])
        .await
        .map_err(|(_, e)| ApiError::from(e))?;
    Ok(changes.swap_remove(0))
}

fn json_bytes(body: bytes::Bytes) -> Response {
    let mut res = Response::new(axum::body::Body::from(body));
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

// ---- summary ----------------------------------------------------------------

#[utoipa::path(
    get,
    path = "/summary",
    summary = "Summary of every zone (seed 2.5).",
    params(BlockingQuery),
    responses((status = 200, description = "The summary.", body = Summary, headers(("X-Meshcat-Index" = u64, description = "The catalog index the answer was read at.")))),
)]
pub async fn summary(
    State(s): Shared,
    caller: Caller,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    no_query(q.as_deref())?;
    Ok(cached(&s.store, CachedKind::Summary, caller, &headers).await)
}

/// A large answer from the store's per-change cache, gzip-encoded when accepted.
async fn cached(
    store: &Arc<Store>,
    kind: CachedKind,
    caller: Caller,
    headers: &HeaderMap,
) -> Response {
    let gzip = meshcat_common::http::accepts_gzip(headers);
    let body = store
        .cached_body_shared(Cached {
            kind,
            authorized: caller.authorized,
            gzip,
        })
        .await;
    json_encoded(body, gzip)
}

/// A JSON body that may be gzip-encoded (`gzip`), varying with `Accept-Encoding`.
pub(super) fn json_encoded(body: bytes::Bytes, gzip: bool) -> Response {
    let mut res = json_bytes(body);
    res.headers_mut()
        .insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    if gzip {
        res.headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    res
}

// ---- services and the document ----------------------------------------------------

#[utoipa::path(
    get,
    path = "/services",
    summary = "Every cluster that should be in the mesh, registered or only seen by agents and edge sidecars.",
    params(ZoneQuery, BlockingQuery),
    responses((status = 200, description = "Clusters sorted by (zoneName, clusterName).", body = Vec<ClusterView>, headers(("X-Meshcat-Index" = u64, description = "The catalog index the answer was read at.")))),
)]
pub async fn services(
    State(s): Shared,
    caller: Caller,
    RawQuery(q): RawQuery,
) -> Result<Json<Vec<ClusterView>>, ApiError> {
    let zone = query::zone_name(q.as_deref())?;
    Ok(Json(s.store.services(zone.as_deref(), caller.authorized)))
}

#[utoipa::path(
    get,
    path = "/openapi.json",
    summary = "This document.",
    responses((status = 200, description = "OpenAPI 3 document.", content_type = "application/json")),
)]
pub async fn openapi(RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    no_query(q.as_deref())?;
    Ok(json_bytes(super::openapi::document_bytes()))
}
