//! The handlers of contract section 2: parse and check the request, ask the store,
//! shape the answer. Registration writes run on the blocking pool because they wait
//! for the durable commit.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, RawQuery, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use meshcat_common::model::{
    ClusterRecord, ClusterView, InstanceMetrics, Summary, ZoneMetadata, ZoneRecord,
};
use meshcat_common::validate::{self, MAX_TEXT_LEN, is_valid_name};
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
use super::query::{self, ClusterFilter, RequiredZoneQuery, ZoneQuery};
use crate::store::{Cached, CachedKind, Committed, MetricsLookup, Store, StoreError, Write};

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

/// Path parameters whose rejections become a 400 error body.
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(Params(v)),
            Err(e @ PathRejection::FailedToDeserializePathParams(_)) => Err(ApiError::bad_path(
                format!("The path is malformed: {}.", e.body_text()),
            )),
            Err(_) => Err(ApiError::bad_path("The path is malformed.")),
        }
    }
}

fn check_path_name(what: &str, v: &str) -> Result<(), ApiError> {
    if is_valid_name(v) {
        Ok(())
    } else {
        Err(ApiError::bad_path(format!(
            "{what} in the path must be 1 to 253 characters of letters, digits, '.', '_' and '-'."
        )))
    }
}

fn check_path_instance(v: &str) -> Result<(), ApiError> {
    if validate::is_valid_instance(v) {
        Ok(())
    } else {
        Err(ApiError::bad_path(
            "instanceId in the path must be 1 to 253 printable characters without '/' or spaces.",
        ))
    }
}

fn check_path_text(what: &str, v: &str) -> Result<(), ApiError> {
    if v.is_empty() || v.len() > MAX_TEXT_LEN {
        Err(ApiError::bad_path(format!(
            "{what} in the path must be 1 to {MAX_TEXT_LEN} bytes long."
        )))
    } else {
        Ok(())
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
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
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
    let mut res = json_bytes(body);
    res.headers_mut()
        .insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    if gzip {
        res.headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    res
}

// ---- clusters ---------------------------------------------------------------

#[utoipa::path(
    get,
    path = "/clusters",
    summary = "List registered clusters.",
    params(ClusterFilter, BlockingQuery),
    responses((status = 200, description = "Matching clusters sorted by (zoneName, clusterName).", body = Vec<ClusterView>, headers(("X-Meshcat-Index" = u64, description = "The catalog index the answer was read at.")))),
)]
pub async fn list_clusters(
    State(s): Shared,
    caller: Caller,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let f = ClusterFilter::parse(q.as_deref())?;
    if !f.admits_caller(caller.authorized) {
        return Ok(json_bytes(bytes::Bytes::from_static(b"[]")));
    }
    // Dashboards poll the whole list: it is served from a per-change cache.
    if f.is_unfiltered() {
        return Ok(cached(&s.store, CachedKind::AllClusters, caller, &headers).await);
    }
    let body = s
        .store
        .render_clusters(caller.authorized, |r, st| f.matches(r, st));
    Ok(json_bytes(body.into()))
}

fn check_cluster(r: &ClusterRecord) -> Result<(), ApiError> {
    validate::cluster(r).map_err(|e| ApiError::invalid(e.0))
}

/// Most records in one bulk `POST /clusters`.
pub const MAX_BULK_CLUSTERS: usize = 1000;

/// The body of `POST /clusters` and its answer: one record, or 1 to
/// [`MAX_BULK_CLUSTERS`] records registered all or nothing. The handler reads the
/// body as JSON first, so that a refusal names the record's index.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Registration {
    One(Box<ClusterRecord>),
    Many(Vec<ClusterRecord>),
}

impl utoipa::PartialSchema for Registration {
    fn schema() -> RefOr<Schema> {
        let record = || Ref::from_schema_name(ClusterRecord::name());
        OneOfBuilder::new()
            .item(record())
            .item(
                ArrayBuilder::new()
                    .items(record())
                    .min_items(Some(1))
                    .max_items(Some(MAX_BULK_CLUSTERS)),
            )
            .into()
    }
}

impl ToSchema for Registration {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((ClusterRecord::name().into(), ClusterRecord::schema()));
        ClusterRecord::schemas(schemas);
    }
}

/// `POST /clusters`: one record, or an array of records registered all or nothing.
#[utoipa::path(
    post,
    path = "/clusters",
    summary = "Register a cluster, or an array of 1 to 1000 clusters all or nothing (one durable commit; a refusal names the record's index and stores nothing).",
    request_body = Registration,
    responses(
        (status = 201, description = "The stored record, or the stored records in the order sent.", body = Registration),
        (status = 401, description = "A write token is configured and the request lacks it.", body = ErrorBody),
        (status = 409, description = "The cluster exists in that zone (or twice in the array).", body = ErrorBody),
        (status = 413, description = "The body is over --max-body.", body = ErrorBody),
        (status = 415, description = "The body is not JSON.", body = ErrorBody),
        (status = 422, description = "Well-formed but invalid.", body = ErrorBody),
    ),
)]
pub async fn create_cluster(
    State(s): Shared,
    _w: Writer,
    RawQuery(q): RawQuery,
    JsonBody(body): JsonBody<serde_json::Value>,
) -> Result<Response, ApiError> {
    no_query(q.as_deref())?;
    let serde_json::Value::Array(items) = body else {
        let r: ClusterRecord = serde_json::from_value(body)
            .map_err(|e| ApiError::invalid(format!("The body does not fit the record: {e}.")))?;
        check_cluster(&r)?;
        let stored = write_one(&s.store, Write::CreateCluster(r))
            .await?
            .into_cluster();
        info!(zone = %stored.zone_name, cluster = %stored.cluster_name, "Cluster registered.");
        return Ok((
            StatusCode::CREATED,
            Json(Registration::One(Box::new(stored))),
        )
            .into_response());
    };
    if items.is_empty() || items.len() > MAX_BULK_CLUSTERS {
        return Err(ApiError::invalid(format!(
            "A bulk registration holds 1 to {MAX_BULK_CLUSTERS} records, not {}.",
            items.len()
        )));
    }
    let mut records = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let r: ClusterRecord = serde_json::from_value(item)
            .map_err(|e| ApiError::invalid(format!("Record {i} does not fit the record: {e}.")))?;
        validate::cluster(&r).map_err(|e| ApiError::invalid(format!("Record {i}: {}", e.0)))?;
        records.push(r);
    }
    let batch = records.into_iter().map(Write::CreateCluster).collect();
    let stored: Vec<ClusterRecord> = s
        .store
        .commit_async(batch)
        .await
        .map_err(|(i, e)| {
            let mut e = ApiError::from(e);
            if !matches!(
                e.status,
                StatusCode::INTERNAL_SERVER_ERROR | StatusCode::SERVICE_UNAVAILABLE
            ) {
                e.message = format!("Record {i}: {}", e.message);
            }
            e
        })?
        .into_iter()
        .map(Committed::into_cluster)
        .collect();
    info!(clusters = stored.len(), "Clusters registered in bulk.");
    Ok((StatusCode::CREATED, Json(Registration::Many(stored))).into_response())
}

#[utoipa::path(
    get,
    path = "/clusters/{clusterName}",
    summary = "A cluster, one record per zone that has it.",
    params(("clusterName" = String, Path, description = "The cluster's clusterName."), ZoneQuery, BlockingQuery),
    responses(
        (status = 200, description = "The records.", body = Vec<ClusterView>, headers(("X-Meshcat-Index" = u64, description = "The catalog index the answer was read at."))),
        (status = 404, description = "Unknown resource.", body = ErrorBody),
    ),
)]
pub async fn get_cluster(
    State(s): Shared,
    caller: Caller,
    Params(name): Params<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    check_path_name("clusterName", &name)?;
    let zone = query::zone_name(q.as_deref())?;
    match s
        .store
        .render_cluster(&name, zone.as_deref(), caller.authorized)
    {
        Some(body) => Ok(json_bytes(body.into())),
        None => Err(ApiError::not_found(match zone {
            Some(z) => format!("Cluster {name} does not exist in zone {z}."),
            None => format!("Cluster {name} does not exist."),
        })),
    }
}

#[utoipa::path(
    put,
    path = "/clusters/{clusterName}",
    summary = "Replace a cluster; the zone is the body's zoneName.",
    params(("clusterName" = String, Path, description = "The cluster's clusterName."), ZoneQuery),
    request_body = ClusterRecord,
    responses(
        (status = 200, description = "The stored record.", body = ClusterRecord),
        (status = 401, description = "A write token is configured and the request lacks it.", body = ErrorBody),
        (status = 404, description = "Unknown resource.", body = ErrorBody),
        (status = 413, description = "The body is over --max-body.", body = ErrorBody),
        (status = 415, description = "The body is not JSON.", body = ErrorBody),
        (status = 422, description = "Well-formed but invalid.", body = ErrorBody),
    ),
)]
pub async fn replace_cluster(
    State(s): Shared,
    _w: Writer,
    Params(name): Params<String>,
    RawQuery(q): RawQuery,
    JsonBody(r): JsonBody<ClusterRecord>,
) -> Result<Json<ClusterRecord>, ApiError> {
    check_path_name("clusterName", &name)?;
    let zone = query::zone_name(q.as_deref())?;
    check_cluster(&r)?;
    if r.cluster_name != name {
        return Err(ApiError::invalid(format!(
            "clusterName {:?} in the body differs from {name:?} in the path.",
            r.cluster_name
        )));
    }
    if let Some(z) = zone.filter(|z| *z != r.zone_name) {
        return Err(ApiError::invalid(format!(
            "zoneName {:?} in the body differs from {z:?} in the query.",
            r.zone_name
        )));
    }
    let stored = write_one(&s.store, Write::ReplaceCluster(r))
        .await?
        .into_cluster();
    info!(zone = %stored.zone_name, cluster = %stored.cluster_name, "Cluster replaced.");
    Ok(Json(stored))
}

#[utoipa::path(
    delete,
    path = "/clusters/{clusterName}",
    summary = "Delete a cluster from a zone.",
    params(("clusterName" = String, Path, description = "The cluster's clusterName."), RequiredZoneQuery),
    responses(
        (status = 200, description = "The deleted record.", body = ClusterRecord),
        (status = 401, description = "A write token is configured and the request lacks it.", body = ErrorBody),
        (status = 404, description = "Unknown resource.", body = ErrorBody),
        (status = 413, description = "The body is over --max-body.", body = ErrorBody),
        (status = 415, description = "The body is not JSON.", body = ErrorBody),
        (status = 422, description = "Well-formed but invalid.", body = ErrorBody),
    ),
)]
pub async fn delete_cluster(
    State(s): Shared,
    _w: Writer,
    Params(name): Params<String>,
    RawQuery(q): RawQuery,
) -> Result<Json<ClusterRecord>, ApiError> {
    check_path_name("clusterName", &name)?;
    let RequiredZoneQuery { zone_name: zone } = RequiredZoneQuery::parse(
        q.as_deref(),
        "Query parameter zoneName is required to delete a cluster.",
    )?;
    let w = Write::DeleteCluster {
        zone,
        cluster: name,
    };
    let deleted = write_one(&s.store, w).await?.into_cluster();
    info!(zone = %deleted.zone_name, cluster = %deleted.cluster_name, "Cluster deleted.");
    Ok(Json(deleted))
}

// ---- instance metrics -----------------------------------------------------------

/// The answer of an instance metrics route; the caller was checked first (instance
/// metrics are live data: the read token, before anything else of the request).
fn metrics_answer(
    lookup: impl FnOnce() -> MetricsLookup,
    what: String,
    instance: &str,
) -> Result<Json<InstanceMetrics>, ApiError> {
    match lookup() {
        MetricsLookup::NoCluster => Err(ApiError::not_found(format!("{what} does not exist."))),
        MetricsLookup::NoInstance => Err(ApiError::not_found(format!(
            "{what} has no live instance {instance}."
        ))),
        MetricsLookup::Found(m) => Ok(Json(*m)),
    }
}

#[utoipa::path(
    get,
    path = "/metrics/{clusterName}/{instanceId}",
    summary = "Latest metrics of a live instance.",
    params(("clusterName" = String, Path, description = "The cluster's clusterName."), ("instanceId" = String, Path, description = "The instance name."), ZoneQuery),
    responses(
        (status = 200, description = "The instance's latest metrics (seed 2.6).", body = InstanceMetrics),
        (status = 403, description = "A read token is configured and the request lacks it.", body = ErrorBody),
        (status = 404, description = "Unknown resource.", body = ErrorBody),
    ),
)]
pub async fn metrics_by_cluster(
    State(s): Shared,
    _r: Reader,
    Params((cluster, instance)): Params<(String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Json<InstanceMetrics>, ApiError> {
    check_path_name("clusterName", &cluster)?;
    check_path_instance(&instance)?;
    let zone = query::zone_name(q.as_deref())?;
    let what = match &zone {
        Some(z) => format!("Cluster {cluster} in zone {z}"),
        None => format!("Cluster {cluster}"),
    };
    metrics_answer(
        || {
            s.store
                .instance_metrics(&cluster, zone.as_deref(), &instance)
        },
        what,
        &instance,
    )
}

#[utoipa::path(
    get,
    path = "/metrics/{name}/{version}/{instanceId}",
    summary = "Latest metrics of a live instance of the cluster with that name and version.",
    params(
        ("name" = String, Path, description = "The cluster's name field."),
        ("version" = String, Path, description = "The cluster's version field."),
        ("instanceId" = String, Path, description = "The instance name."),
    ),
    responses(
        (status = 200, description = "The instance's latest metrics (seed 2.6).", body = InstanceMetrics),
        (status = 403, description = "A read token is configured and the request lacks it.", body = ErrorBody),
        (status = 404, description = "Unknown resource.", body = ErrorBody),
    ),
)]
pub async fn metrics_by_version(
    State(s): Shared,
    _r: Reader,
    Params((name, version, instance)): Params<(String, String, String)>,
    RawQuery(q): RawQuery,
) -> Result<Json<InstanceMetrics>, ApiError> {
    check_path_text("name", &name)?;
    check_path_text("version", &version)?;
    check_path_instance(&instance)?;
    no_query(q.as_deref())?;
    metrics_answer(
        || {
            s.store
                .instance_metrics_by_version(&name, &version, &instance)
        },
        format!("A cluster named {name:?} with version {version:?}"),
        &instance,
    )
}

// ---- zones --------------------------------------------------------------------

#[utoipa::path(
    get,
    path = "/zones",
    summary = "List zones.",
    params(BlockingQuery),
    responses((status = 200, description = "Zones sorted by zoneName.", body = Vec<ZoneRecord>, headers(("X-Meshcat-Index" = u64, description = "The catalog index the answer was read at.")))),
)]
pub async fn list_zones(
    State(s): Shared,
    RawQuery(q): RawQuery,
) -> Result<Json<Vec<ZoneRecord>>, ApiError> {
    no_query(q.as_deref())?;
    Ok(Json(s.store.zones()))
}

#[utoipa::path(
    post,
    path = "/zones",
    summary = "Register a zone.",
    request_body = ZoneRecord,
    responses(
        (status = 201, description = "The stored zone.", body = ZoneRecord),
        (status = 401, description = "A write token is configured and the request lacks it.", body = ErrorBody),
        (status = 409, description = "The zone exists.", body = ErrorBody),
        (status = 413, description = "The body is over --max-body.", body = ErrorBody),
        (status = 415, description = "The body is not JSON.", body = ErrorBody),
        (status = 422, description = "Well-formed but invalid.", body = ErrorBody),
    ),
)]
pub async fn create_zone(
    State(s): Shared,
    _w: Writer,
    RawQuery(q): RawQuery,
    JsonBody(z): JsonBody<ZoneRecord>,
) -> Result<(StatusCode, Json<ZoneRecord>), ApiError> {
    no_query(q.as_deref())?;
    validate::zone(&z).map_err(|e| ApiError::invalid(e.0))?;
    let stored = blocking(&s.store, move |st| {
        validate::zone_files(&z).map_err(|e| StoreError::Invalid(e.0))?;
        st.create_zone(z)
    })
    .await?;
    info!(zone = %stored.zone_name, "Zone registered.");
    Ok((StatusCode::CREATED, Json(stored)))
}

#[utoipa::path(
    get,
    path = "/zones/{zoneName}",
    summary = "A zone.",
    params(("zoneName" = String, Path, description = "The zone's zoneName.")),
    responses(
        (status = 200, description = "The zone.", body = ZoneRecord),
        (status = 404, description = "Unknown resource.", body = ErrorBody),
    ),
)]
pub async fn get_zone(
    State(s): Shared,
    Params(name): Params<String>,
    RawQuery(q): RawQuery,
) -> Result<Json<ZoneRecord>, ApiError> {
    check_path_name("zoneName", &name)?;
    no_query(q.as_deref())?;
    s.store
        .zone(&name)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("Zone {name} does not exist.")))
}

#[utoipa::path(
    delete,
    path = "/zones/{zoneName}",
    summary = "Delete a zone and its clusters.",
    params(("zoneName" = String, Path, description = "The zone's zoneName.")),
    responses(
        (status = 200, description = "The deleted zone.", body = ZoneRecord),
        (status = 401, description = "A write token is configured and the request lacks it.", body = ErrorBody),
        (status = 404, description = "Unknown resource.", body = ErrorBody),
        (status = 413, description = "The body is over --max-body.", body = ErrorBody),
        (status = 415, description = "The body is not JSON.", body = ErrorBody),
        (status = 422, description = "Well-formed but invalid.", body = ErrorBody),
    ),
)]
pub async fn delete_zone(
    State(s): Shared,
    _w: Writer,
    Params(name): Params<String>,
    RawQuery(q): RawQuery,
) -> Result<Json<ZoneRecord>, ApiError> {
    check_path_name("zoneName", &name)?;
    no_query(q.as_deref())?;
    let deleted = write_one(&s.store, Write::DeleteZone(name))
        .await?
        .into_zone();
    info!(zone = %deleted.zone_name, "Zone deleted with its clusters.");
    Ok(Json(deleted))
}

#[utoipa::path(
    get,
    path = "/zones/{zoneName}/metadata",
    summary = "Counts over the zone's clusters (seed 2.4).",
    params(("zoneName" = String, Path, description = "The zone's zoneName.")),
    responses(
        (status = 200, description = "The zone metadata.", body = ZoneMetadata),
        (status = 404, description = "Unknown resource.", body = ErrorBody),
    ),
)]
pub async fn zone_metadata(
    State(s): Shared,
    Params(name): Params<String>,
    RawQuery(q): RawQuery,
) -> Result<Json<ZoneMetadata>, ApiError> {
    check_path_name("zoneName", &name)?;
    no_query(q.as_deref())?;
    s.store
        .zone_summary(&name)
        .map(|z| Json((&z).into()))
        .ok_or_else(|| ApiError::not_found(format!("Zone {name} does not exist.")))
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
