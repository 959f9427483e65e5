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
    params(MetricsPath, ZoneQuery),
    responses(
        (status = 200, description = "The instance's latest metrics (seed 2.6).", body = InstanceMetrics),
        ReadTokenMissing,
        NotFound,
    ),
)]
pub async fn metrics_by_cluster(
    State(s): Shared,
    _r: Reader,
    Valid(MetricsPath {
        cluster_name: cluster,
        instance_id: instance,
    }): Valid<MetricsPath>,
    RawQuery(q): RawQuery,
) -> Result<Json<InstanceMetrics>, ApiError> {
    let zone = query::zone_name(q.as_deref())?;
    let what = match &zone {
        Some(z) => format!("Cluster {cluster} in zone {z}"),
        None => format!("Cluster {cluster}"),
    };
    metrics_answer(
        || {
            s.instances
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
    params(MetricsByVersionPath),
    responses(
        (status = 200, description = "The instance's latest metrics (seed 2.6).", body = InstanceMetrics),
        ReadTokenMissing,
        NotFound,
    ),
)]
pub async fn metrics_by_version(
    State(s): Shared,
    _r: Reader,
    Valid(MetricsByVersionPath {
        name,
        version,
        instance_id: instance,
    }): Valid<MetricsByVersionPath>,
    RawQuery(q): RawQuery,
) -> Result<Json<InstanceMetrics>, ApiError> {
    no_query(q.as_deref())?;
    metrics_answer(
        || {
            s.instances
                .instance_metrics_by_version(&name, &version, &instance)
        },
        format!("A cluster named {name:?} with version {version:?}"),
        &instance,
    )
}
