//! The routes of the zones' control servers (contract section 17): `GET
//! /zones/{zoneName}/control` (the zone's xDS connection and view) and `GET /sync`
//! (each sidecar's sync with it, on the sync index, with blocking queries). Both are
//! live data: the read token comes first.

use axum::Json;
use axum::extract::{RawQuery, State};
use serde::Serialize;
use utoipa::{IntoParams, ToSchema};

use super::auth::Reader;
use super::blocking::BlockingQuery;
use super::error::{ApiError, ErrorBody};
use super::paths::{Valid, ZonePath};
use super::query;
use super::responses::{NotFound, ReadTokenMissing};
use super::troubleshoot::{Shared, zone_or_404};
use crate::control::ControlStatus;
use crate::sync::{Proxy, SyncState};

#[utoipa::path(
    get,
    path = "/zones/{zoneName}/control",
    summary = "The zone's control server: the xDS connection's state, the last accepted versions and what the view holds.",
    params(ZonePath),
    responses(
        (status = 200, description = "The connection and the view; served from the last good view however slow or gone the control server is.", body = ControlStatus),
        ReadTokenMissing,
        NotFound,
    ),
)]
pub async fn zone_control(
    State(s): Shared,
    _r: Reader,
    Valid(p): Valid<ZonePath>,
    RawQuery(q): RawQuery,
) -> Result<Json<ControlStatus>, ApiError> {
    query::parse(q.as_deref(), &[])?;
    let record = zone_or_404(&s, &p.zone_name)?;
    Ok(Json(
        s.controls
            .status(&p.zone_name)
            .unwrap_or_else(|| s.controls.pending(&record)),
    ))
}

/// The query of `GET /sync`.
#[derive(Debug, Default, IntoParams)]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
pub struct SyncQuery {
    /// Only this zone's sidecars.
    pub zone_name: Option<String>,
    /// Only this cluster's sidecars.
    pub cluster_name: Option<String>,
    /// Only sidecars in this state.
    #[param(value_type = Option<String>)]
    pub state: Option<SyncState>,
}

impl SyncQuery {
    fn parse(raw: Option<&str>) -> Result<SyncQuery, ApiError> {
        let mut q = SyncQuery::default();
        for (k, v) in query::parse(raw, &["zoneName", "clusterName", "state"])? {
            match k.as_str() {
                "zoneName" if q.zone_name.is_none() => q.zone_name = Some(query::name(&k, v)?),
                "clusterName" if q.cluster_name.is_none() => {
                    q.cluster_name = Some(query::name(&k, v)?)
                }
                "state" if q.state.is_none() => {
                    q.state = Some(SyncState::parse(&v).ok_or_else(|| {
                        ApiError::bad_query(format!(
                            "Query parameter state must be synced, stale, rejected, disconnected or unknown, got {v:?}."
                        ))
                    })?)
                }
                _ => return Err(query::twice(&k)),
            }
        }
        Ok(q)
    }
}

/// `GET /sync`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncAnswer {
    /// The sync index the answer was read at.
    pub index: u64,
    #[schema(value_type = Vec<Object>)]
    pub proxies: Vec<Proxy>,
}

#[utoipa::path(
    get,
    path = "/sync",
    summary = "Each sidecar's sync with its zone's control server: synced, stale, rejected, disconnected or unknown, with the detail.",
    params(SyncQuery, BlockingQuery),
    responses(
        (status = 200, description = "Proxies sorted by zone, cluster and instance. The index is the sync index, which moves when a state changes (not the catalog index).", body = SyncAnswer, headers(("X-Meshcat-Index" = u64, description = "The sync index the answer was read at."))),
        (status = 400, description = "Malformed query.", body = ErrorBody),
        ReadTokenMissing,
    ),
)]
pub async fn sync(
    State(s): Shared,
    _r: Reader,
    RawQuery(q): RawQuery,
) -> Result<Json<SyncAnswer>, ApiError> {
    let q = SyncQuery::parse(q.as_deref())?;
    let (index, proxies) = s
        .sync
        .list(q.zone_name.as_deref(), q.cluster_name.as_deref(), q.state);
    Ok(Json(SyncAnswer { index, proxies }))
}

/// `GET /peer/sync`: the sync states of the instances this replica's agents report,
/// for a peer's `/sync`; held open until this replica's own sync index moves past
/// `index` (at most [`crate::replicas::SYNC_WAIT`]). Answers only requests a peer
/// signed; anything else is told there is no such route.
pub async fn peer_sync(
    State(s): Shared,
    granted: Option<axum::Extension<super::auth::Granted>>,
    RawQuery(q): RawQuery,
) -> Result<Json<crate::sync::OwnSync>, ApiError> {
    if granted.is_none() || s.store.etcd().is_none() {
        return Err(ApiError::not_found(format!(
            "No resource at GET {}.",
            crate::replicas::PEER_SYNC
        )));
    }
    let mut after = None;
    for (k, v) in query::parse(q.as_deref(), &["index"])? {
        match (k.as_str(), after) {
            ("index", None) => {
                after = Some(v.parse::<u64>().map_err(|_| {
                    ApiError::bad_query("Query parameter index must be one unsigned integer.")
                })?)
            }
            _ => return Err(query::twice(&k)),
        }
    }
    let (index, proxies) = s.sync.own_after(after, crate::replicas::SYNC_WAIT).await;
    Ok(Json(crate::sync::OwnSync { index, proxies }))
}
