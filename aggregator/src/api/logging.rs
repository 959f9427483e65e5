//! The sidecar log level per instance and per cluster, and timed debug windows
//! (contract section 5), through the sidecar layer: every live instance, this
//! replica's and its peers', is reached the same way.

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::future::join_all;
use meshcat_common::level;
use meshcat_common::wire::DebugWindowOutput;
use serde::Serialize;
use tracing::info;
use utoipa::openapi::schema::{Object, ObjectBuilder, Type};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::{Reader, Writer};
use super::error::{ApiError, ErrorBody};
use super::paths::{InstancePath, Valid, ZoneClusterPath};
use super::query;
use super::responses::{NotFound, ReadTokenMissing, SidecarFailed, WriteTokenMissing};
use super::troubleshoot::{
    MAX_DEBUG_SECONDS, Shared, cluster_or_404, ingest_off, sidecars, unexpected, zone_or_404,
};
use crate::sidecars::{Answer, Ask, SidecarError, Target, window_deadline};

mod outcome;

pub use outcome::{ClusterOutcome, InstanceOutcome};

/// Most instances named in one debug-window request.
pub const MAX_WINDOW_INSTANCES: usize = 64;

/// The query of the routes that set a log level.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LevelQuery {
    /// The level to set, one of the seed's four.
    #[param(schema_with = seed_levels, required = true)]
    pub level: &'static str,
}

fn seed_levels() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(level::SEED_LEVELS))
        .build()
}

fn level_query(raw: Option<&str>) -> Result<LevelQuery, ApiError> {
    let mut level = None;
    for (k, v) in query::parse(raw, &["level"])? {
        if level.is_some() {
            return Err(query::twice(&k));
        }
        level = Some(level::envoy_name(&v).map(level::seed_name).ok_or_else(|| {
            ApiError::bad_query(format!(
                "Query parameter level must be error, warn, info or debug, not {v:?}."
            ))
        })?);
    }
    let level = level.ok_or_else(|| ApiError::bad_query("Query parameter level is required."))?;
    Ok(LevelQuery { level })
}

/// The query of `POST .../debug-window`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DebugWindowQuery {
    /// How long the sidecars log at debug.
    #[param(minimum = 1, maximum = 300)]
    pub seconds: u32,
    /// Limit to these instances (repeatable); default every live instance.
    #[param(required = false)]
    pub instance: Vec<String>,
}

impl DebugWindowQuery {
    fn parse(raw: Option<&str>) -> Result<DebugWindowQuery, ApiError> {
        let mut seconds = None;
        let mut wanted: Vec<String> = Vec::new();
        for (k, v) in query::parse(raw, &["seconds", "instance"])? {
            if k == "seconds" {
                if seconds.is_some() {
                    return Err(query::twice(&k));
                }
                seconds = Some(seconds_value("seconds", &v)?);
            } else if wanted.len() == MAX_WINDOW_INSTANCES {
                return Err(ApiError::bad_query(format!(
                    "At most {MAX_WINDOW_INSTANCES} instances may be named."
                )));
            } else if !wanted.contains(&v) {
                wanted.push(v);
            }
        }
        let seconds =
            seconds.ok_or_else(|| ApiError::bad_query("Query parameter seconds is required."))?;
        Ok(DebugWindowQuery {
            seconds,
            instance: wanted,
        })
    }
}

fn text(level: String) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], level).into_response()
}

/// Asks one instance's sidecar for its level, or sets it; the level it has now. An
/// unknown zone is a 404.
async fn run_level_command(
    s: &AppState,
    (zone, cluster, instance): (&str, &str, &str),
    ask: Ask,
) -> Result<String, ApiError> {
    zone_or_404(s, zone)?;
    let sidecars = sidecars(s);
    let target = sidecars.target(zone, cluster, instance)?;
    match sidecars
        .run((zone, cluster), &target, ask, s.diagnosis.command_timeout)
        .await?
    {
        Answer::Level(l) => Ok(l),
        _ => Err(unexpected(instance)),
    }
}

/// `GET /zones/{zoneName}/clusters/{clusterName}/instances/{instanceId}/logging`.
#[utoipa::path(
    get,
    path = "/zones/{zoneName}/clusters/{clusterName}/instances/{instanceId}/logging",
    summary = "The sidecar log level of one instance, through its agent.",
    params(InstancePath),
    responses(
        (status = 200, description = "The level as text: error, warn, info, debug (or Envoy's trace, critical, off).", body = String, content_type = "text/plain"),
        ReadTokenMissing,
        SidecarFailed,
    ),
)]
pub async fn get_instance_logging(
    State(s): Shared,
    _r: Reader,
    Valid(InstancePath {
        zone_name: zone,
        cluster_name: cluster,
        instance_id: instance,
    }): Valid<InstancePath>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    query::parse(q.as_deref(), &[])?;
    let level = run_level_command(&s, (&zone, &cluster, &instance), Ask::GetLevel).await?;
    Ok(text(level))
}

/// `PUT /zones/{zoneName}/clusters/{clusterName}/instances/{instanceId}/logging?level=`.
#[utoipa::path(
    put,
    path = "/zones/{zoneName}/clusters/{clusterName}/instances/{instanceId}/logging",
    summary = "Set the sidecar log level of one instance (warn is sent to Envoy as warning).",
    params(InstancePath, LevelQuery),
    responses(
        (status = 200, description = "The level now, as text.", body = String, content_type = "text/plain"),
        (status = 400, description = "Missing or bad level.", body = ErrorBody),
        WriteTokenMissing,
        SidecarFailed,
    ),
)]
pub async fn put_instance_logging(
    State(s): Shared,
    _w: Writer,
    Valid(InstancePath {
        zone_name: zone,
        cluster_name: cluster,
        instance_id: instance,
    }): Valid<InstancePath>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let LevelQuery { level } = level_query(q.as_deref())?;
    let now = run_level_command(&s, (&zone, &cluster, &instance), Ask::SetLevel(level)).await?;
    info!(%zone, %cluster, %instance, level = %now, "Sidecar log level set through the API.");
    Ok(text(now))
}

/// `PUT /zones/{zoneName}/clusters/{clusterName}/logging?level=`: every live instance
/// at once, each with its own deadline.
#[utoipa::path(
    put,
    path = "/zones/{zoneName}/clusters/{clusterName}/logging",
    summary = "Set the sidecar log level of every live instance of a cluster at once.",
    params(ZoneClusterPath, LevelQuery),
    responses(
        (status = 200, description = "Per instance, the outcome (each instance has its own deadline).", body = ClusterOutcome),
        (status = 400, description = "Missing or bad level.", body = ErrorBody),
        WriteTokenMissing,
        NotFound,
    ),
)]
pub async fn put_cluster_logging(
    State(s): Shared,
    _w: Writer,
    Valid(ZoneClusterPath {
        zone_name: zone,
        cluster_name: cluster,
    }): Valid<ZoneClusterPath>,
    RawQuery(q): RawQuery,
) -> Result<Json<ClusterOutcome>, ApiError> {
    let LevelQuery { level } = level_query(q.as_deref())?;
    zone_or_404(&s, &zone)?;
    let sidecars = sidecars(&s);
    cluster_or_404(&sidecars, &zone, &cluster)?;
    let targets = sidecars.targets(&zone, &cluster);
    let deadline = s.diagnosis.command_timeout;
    let runs = targets.iter().map(|t| {
        let (sidecars, zone, cluster) = (&sidecars, zone.as_str(), cluster.as_str());
        async move {
            match sidecars
                .run((zone, cluster), t, Ask::SetLevel(level), deadline)
                .await
            {
                Ok(Answer::Level(now)) => InstanceOutcome {
                    level: Some(now),
                    ..InstanceOutcome::ok(&t.instance)
                },
                Ok(_) => InstanceOutcome::failed(&t.instance, &unexpected(&t.instance)),
                Err(e) => InstanceOutcome::failed(&t.instance, &e.into()),
            }
        }
    });
    let mut outcomes = join_all(runs).await;
    outcomes.sort_by(|a, b| a.instance.cmp(&b.instance));
    let answer = ClusterOutcome::new(zone, cluster, outcomes);
    info!(zone = %answer.zone_name, cluster = %answer.cluster_name, level, succeeded = answer.succeeded, failed = answer.failed, "Cluster log level set through the API.");
    Ok(Json(answer))
}

pub(super) fn seconds_value(name: &str, v: &str) -> Result<u32, ApiError> {
    v.parse::<u32>()
        .ok()
        .filter(|n| (1..=MAX_DEBUG_SECONDS).contains(n))
        .ok_or_else(|| {
            ApiError::bad_query(format!(
                "Query parameter {name} must be a whole number of seconds from 1 to {MAX_DEBUG_SECONDS}."
            ))
        })
}

/// `POST /zones/{zoneName}/clusters/{clusterName}/debug-window?seconds=N[&instance=I...]`.
#[utoipa::path(
    post,
    path = "/zones/{zoneName}/clusters/{clusterName}/debug-window",
    summary = "Run a timed debug window on the cluster's sidecars: debug for N seconds, then the previous level; answers the window's TLS lines.",
    params(ZoneClusterPath, DebugWindowQuery),
    responses(
        (status = 200, description = "Per instance, the outcome and the window's report.", body = ClusterOutcome),
        (status = 400, description = "Missing or bad seconds.", body = ErrorBody),
        WriteTokenMissing,
        NotFound,
        (status = 503, description = "Agent ingest is off.", body = ErrorBody),
    ),
)]
pub async fn post_debug_window(
    State(s): Shared,
    _w: Writer,
    Valid(ZoneClusterPath {
        zone_name: zone,
        cluster_name: cluster,
    }): Valid<ZoneClusterPath>,
    RawQuery(q): RawQuery,
) -> Result<Json<ClusterOutcome>, ApiError> {
    let DebugWindowQuery {
        seconds,
        instance: wanted,
    } = DebugWindowQuery::parse(q.as_deref())?;
    zone_or_404(&s, &zone)?;
    let sidecars = sidecars(&s);
    if !sidecars.ingest_on() {
        return Err(ingest_off());
    }
    cluster_or_404(&sidecars, &zone, &cluster)?;
    // Every live instance, or those named (one not live answers its own 404).
    let targets: Vec<Result<Target, SidecarError>> = if wanted.is_empty() {
        sidecars
            .targets(&zone, &cluster)
            .into_iter()
            .map(Ok)
            .collect()
    } else {
        wanted
            .iter()
            .map(|i| sidecars.target(&zone, &cluster, i))
            .collect()
    };
    let deadline = window_deadline(s.diagnosis.command_timeout, seconds);
    info!(%zone, %cluster, seconds, instances = targets.len(), "Debug window asked through the API.");
    let runs = targets.into_iter().zip(0..).map(|(t, n)| {
        let (sidecars, zone, cluster) = (&sidecars, zone.as_str(), cluster.as_str());
        let name = if wanted.is_empty() {
            t.as_ref().map(|t| t.instance.clone()).unwrap_or_default()
        } else {
            wanted[n].clone()
        };
        async move {
            let t = match t {
                Ok(t) => t,
                Err(e) => return InstanceOutcome::failed(&name, &e.into()),
            };
            match sidecars
                .run((zone, cluster), &t, Ask::DebugWindow { seconds }, deadline)
                .await
            {
                Ok(Answer::DebugWindow(w)) => InstanceOutcome {
                    debug_window: Some(w),
                    ..InstanceOutcome::ok(&name)
                },
                Ok(_) => InstanceOutcome::failed(&name, &unexpected(&name)),
                Err(e) => InstanceOutcome::failed(&name, &e.into()),
            }
        }
    });
    let outcomes = join_all(runs).await;
    Ok(Json(ClusterOutcome::new(zone, cluster, outcomes)))
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;

    #[test]
    fn levels_are_the_seeds_four() {
        assert_eq!(level_query(Some("level=warn")).unwrap().level, "warn");
        assert_eq!(level_query(Some("level=debug")).unwrap().level, "debug");
        for bad in [
            None,
            Some(""),
            Some("level="),
            Some("level=warning"),
            Some("level=INFO"),
            Some("level=info&level=info"),
            Some("lvl=info"),
        ] {
            let e = level_query(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad:?}");
        }
    }
}
