//! The instance metrics routes (seed 4.7): live data, the read token first.

use super::*;

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
