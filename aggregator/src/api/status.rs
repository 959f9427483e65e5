//! `GET /status`: what this replica tells about itself, for `meshcat check`. It
//! answers every caller (each learns what its own token grants); it shows counts, no
//! live data of any cluster, and the zones agents report into without a
//! registration only to callers who may read live data. It walks every instance,
//! so it runs on the blocking pool.

use std::sync::Arc;

use axum::Json;
use axum::extract::{RawQuery, State};

use super::AppState;
use super::auth::CallerAccess;
use super::error::ApiError;
use crate::replica_status::{ReplicaStatus, replica_status};

#[utoipa::path(
    get,
    path = "/status",
    summary = "This replica's version, readiness, agents per zone, recent agent rejections (last 5 minutes) and what the caller's token grants. Zones agents report into without a registration are listed only to callers who may read live data (the read token, when one is configured).",
    responses((status = 200, description = "The replica's status; with replicas on etcd each answers for itself.", body = ReplicaStatus)),
)]
pub async fn status(
    State(s): State<Arc<AppState>>,
    caller: CallerAccess,
    RawQuery(q): RawQuery,
) -> Result<Json<ReplicaStatus>, ApiError> {
    super::query::parse(q.as_deref(), &[])?;
    let stopping = *s.events.stopping.borrow();
    let (store, instances, agents) = (s.store.clone(), s.instances.clone(), s.agents.clone());
    let now = std::time::Instant::now();
    let status = tokio::task::spawn_blocking(move || {
        replica_status(
            &store,
            &instances,
            agents.as_ref(),
            stopping,
            caller.access,
            caller.token,
            now,
        )
    })
    .await
    .map_err(|_| ApiError::internal())?;
    Ok(Json(status))
}
