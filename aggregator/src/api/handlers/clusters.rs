//! The cluster routes: list with filters, create (one or a bulk array), get,
//! replace, delete.

use super::*;

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
pub use meshcat_common::limits::MAX_BULK_CLUSTERS;

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
        WriteTokenMissing,
        StorageFull,
        (status = 409, description = "The cluster exists in that zone (or twice in the array).", body = ErrorBody),
        BodyRefused,
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
    params(ClusterPath, ZoneQuery, BlockingQuery),
    responses(
        (status = 200, description = "The records.", body = Vec<ClusterView>, headers(("X-Meshcat-Index" = u64, description = "The catalog index the answer was read at."))),
        NotFound,
    ),
)]
pub async fn get_cluster(
    State(s): Shared,
    caller: Caller,
    Valid(ClusterPath { cluster_name: name }): Valid<ClusterPath>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let zone = query::zone_name(q.as_deref())?;
    read_cluster(&s, &name, zone.as_deref(), caller.authorized)
}

/// The records of cluster `name` (in `zone` only, if given), as `GET
/// /clusters/{clusterName}` answers them once its name and query are checked; its
/// route and the catalog read's own path (`api::quick`) both answer with this.
pub(in crate::api) fn read_cluster(
    s: &AppState,
    name: &str,
    zone: Option<&str>,
    authorized: bool,
) -> Result<Response, ApiError> {
    match s.store.render_cluster(name, zone, authorized) {
        Some(body) => Ok(json_bytes(body.into())),
        None => Err(ApiError::no_cluster(name, zone)),
    }
}

#[utoipa::path(
    put,
    path = "/clusters/{clusterName}",
    summary = "Replace a cluster; the zone is the body's zoneName.",
    params(ClusterPath, ZoneQuery),
    request_body = ClusterRecord,
    responses(
        (status = 200, description = "The stored record.", body = ClusterRecord),
        WriteTokenMissing,
        StorageFull,
        NotFound,
        BodyRefused,
    ),
)]
pub async fn replace_cluster(
    State(s): Shared,
    _w: Writer,
    Valid(ClusterPath { cluster_name: name }): Valid<ClusterPath>,
    RawQuery(q): RawQuery,
    JsonBody(r): JsonBody<ClusterRecord>,
) -> Result<Json<ClusterRecord>, ApiError> {
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
    params(ClusterPath, RequiredZoneQuery),
    responses(
        (status = 200, description = "The deleted record.", body = ClusterRecord),
        WriteTokenMissing,
        StorageFull,
        NotFound,
        BodyRefused,
    ),
)]
pub async fn delete_cluster(
    State(s): Shared,
    _w: Writer,
    Valid(ClusterPath { cluster_name: name }): Valid<ClusterPath>,
    RawQuery(q): RawQuery,
) -> Result<Json<ClusterRecord>, ApiError> {
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
