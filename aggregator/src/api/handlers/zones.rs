//! The zone routes: list, create, get, replace, delete, and a zone's metadata.

use super::*;
use crate::api::troubleshoot::zone_or_404;

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
        WriteTokenMissing,
        StorageFull,
        (status = 409, description = "The zone exists.", body = ErrorBody),
        BodyRefused,
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
        st.writes().create_zone(z)
    })
    .await?;
    info!(zone = %stored.zone_name, "Zone registered.");
    Ok((StatusCode::CREATED, Json(stored)))
}

#[utoipa::path(
    get,
    path = "/zones/{zoneName}",
    summary = "A zone.",
    params(ZonePath),
    responses(
        (status = 200, description = "The zone.", body = ZoneRecord),
        NotFound,
    ),
)]
pub async fn get_zone(
    State(s): Shared,
    Valid(ZonePath { zone_name: name }): Valid<ZonePath>,
    RawQuery(q): RawQuery,
) -> Result<Json<ZoneRecord>, ApiError> {
    no_query(q.as_deref())?;
    zone_or_404(&s, &name).map(Json)
}

#[utoipa::path(
    put,
    path = "/zones/{zoneName}",
    summary = "Replace a zone's record; its clusters stay.",
    params(ZonePath),
    request_body = ZoneRecord,
    responses(
        (status = 200, description = "The stored zone.", body = ZoneRecord),
        WriteTokenMissing,
        StorageFull,
        NotFound,
        BodyRefused,
    ),
)]
pub async fn replace_zone(
    State(s): Shared,
    _w: Writer,
    Valid(ZonePath { zone_name: name }): Valid<ZonePath>,
    RawQuery(q): RawQuery,
    JsonBody(z): JsonBody<ZoneRecord>,
) -> Result<Json<ZoneRecord>, ApiError> {
    no_query(q.as_deref())?;
    validate::zone(&z).map_err(|e| ApiError::invalid(e.0))?;
    if z.zone_name != name {
        return Err(ApiError::invalid(format!(
            "zoneName {:?} in the body differs from {name:?} in the path.",
            z.zone_name
        )));
    }
    let stored = blocking(&s.store, move |st| {
        validate::zone_files(&z).map_err(|e| StoreError::Invalid(e.0))?;
        st.writes().replace_zone(z)
    })
    .await?;
    info!(zone = %stored.zone_name, "Zone replaced.");
    Ok(Json(stored))
}

#[utoipa::path(
    delete,
    path = "/zones/{zoneName}",
    summary = "Delete a zone and its clusters.",
    params(ZonePath),
    responses(
        (status = 200, description = "The deleted zone.", body = ZoneRecord),
        WriteTokenMissing,
        StorageFull,
        NotFound,
        BodyRefused,
    ),
)]
pub async fn delete_zone(
    State(s): Shared,
    _w: Writer,
    Valid(ZonePath { zone_name: name }): Valid<ZonePath>,
    RawQuery(q): RawQuery,
) -> Result<Json<ZoneRecord>, ApiError> {
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
    params(ZonePath),
    responses(
        (status = 200, description = "The zone metadata.", body = ZoneMetadata),
        NotFound,
    ),
)]
pub async fn zone_metadata(
    State(s): Shared,
    Valid(ZonePath { zone_name: name }): Valid<ZonePath>,
    RawQuery(q): RawQuery,
) -> Result<Json<ZoneMetadata>, ApiError> {
    no_query(q.as_deref())?;
    s.store
        .zone_summary(&name)
        .map(|z| Json((&z).into()))
        .ok_or_else(|| ApiError::no_zone(&name))
}
