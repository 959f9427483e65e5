//! `GET /graph` (contract section 14): the dependency graph, whole, of one zone, or
//! around one cluster; live data, so the read token comes first.

use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Response;
use utoipa::IntoParams;

use super::auth::Reader;
use super::blocking::BlockingQuery;
use super::error::{ApiError, ErrorBody};
use super::query;
use super::responses::{NotFound, ReadTokenMissing};
use super::troubleshoot::Shared;
use crate::graph::{DEFAULT_DEPTH, GraphError, GraphView, MAX_DEPTH, Scope};

/// The query of `GET /graph`.
#[derive(Debug, Default, IntoParams)]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
pub struct GraphQuery {
    /// Only this zone's clusters and the edges that reach them.
    pub zone_name: Option<String>,
    /// Only the nodes within `depth` hops of this cluster (both directions); needs
    /// zoneName.
    pub cluster_name: Option<String>,
    /// Hops from clusterName (default 1).
    #[param(minimum = 1, maximum = 5)]
    pub depth: Option<u32>,
}

impl GraphQuery {
    fn parse(raw: Option<&str>) -> Result<Scope, ApiError> {
        let mut q = GraphQuery::default();
        for (k, v) in query::parse(raw, &["zoneName", "clusterName", "depth"])? {
            match k.as_str() {
                "zoneName" if q.zone_name.is_none() => q.zone_name = Some(query::name(&k, v)?),
                "clusterName" if q.cluster_name.is_none() => {
                    q.cluster_name = Some(query::name(&k, v)?)
                }
                "depth" if q.depth.is_none() => q.depth = Some(query::count(&k, &v, MAX_DEPTH)?),
                _ => return Err(query::twice(&k)),
            }
        }
        if q.cluster_name.is_some() && q.zone_name.is_none() {
            return Err(ApiError::bad_query(
                "Query parameter clusterName needs zoneName.",
            ));
        }
        if q.depth.is_some() && q.cluster_name.is_none() {
            return Err(ApiError::bad_query(
                "Query parameter depth needs clusterName.",
            ));
        }
        Ok(Scope {
            focus: q
                .cluster_name
                .map(|c| (c, q.depth.unwrap_or(DEFAULT_DEPTH))),
            zone: q.zone_name,
        })
    }
}

#[utoipa::path(
    get,
    path = "/graph",
    summary = "The dependency graph: who calls whom, observed by the sidecars over the graph window, beside the declared dependencies.",
    params(GraphQuery, BlockingQuery),
    responses(
        (status = 200, description = "Nodes sorted by id, edges by source then target; gzip-encoded when accepted. The traffic figures are at most 2 s old (about 1 s while the graph is read steadily).", body = GraphView, headers(("X-Meshcat-Index" = u64, description = "The catalog index the answer was read at."))),
        (status = 400, description = "Malformed query (clusterName without zoneName, depth out of 1 to 5).", body = ErrorBody),
        ReadTokenMissing,
        NotFound,
        (status = 500, description = "The graph could not be built (the aggregator's log says why).", body = ErrorBody),
    ),
)]
pub async fn graph(
    State(s): Shared,
    _r: Reader,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let scope = GraphQuery::parse(q.as_deref())?;
    let gzip = meshcat_common::http::accepts_gzip(&headers);
    match s.graph.answer(&s.store, scope.clone(), gzip).await {
        Ok(body) => Ok(super::handlers::json_encoded(body, gzip)),
        Err(GraphError::UnknownCluster) => {
            let (zone, (cluster, _)) = (
                scope.zone.unwrap_or_default(),
                scope.focus.unwrap_or_default(),
            );
            Err(ApiError::not_found(format!(
                "Cluster {cluster} is not in the graph of zone {zone}."
            )))
        }
        Err(GraphError::Unavailable) => Err(ApiError::internal()),
    }
}

/// `GET /peer/traffic`: the traffic this replica's agents reported, per cluster,
/// for a peer's graph. Answers only requests a peer signed (the forwarding layer
/// has checked them); anything else is told there is no such route.
pub async fn peer_traffic(
    State(s): Shared,
    granted: Option<axum::Extension<super::auth::Granted>>,
) -> Result<axum::Json<Vec<crate::store::traffic::ClusterTraffic>>, ApiError> {
    if granted.is_none() || s.store.etcd().is_none() {
        return Err(ApiError::not_found(format!(
            "No resource at GET {}.",
            crate::replicas::PEER_TRAFFIC
        )));
    }
    Ok(axum::Json(
        s.instances.traffic().summary(std::time::Instant::now()),
    ))
}

/// The query of `GET /clusters/{clusterName}/drift`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
pub struct DriftQuery {
    /// The cluster's zone.
    pub zone_name: String,
}

impl DriftQuery {
    fn parse(raw: Option<&str>) -> Result<DriftQuery, ApiError> {
        let q =
            super::query::RequiredZoneQuery::parse(raw, "Query parameter zoneName is required.")?;
        Ok(DriftQuery {
            zone_name: q.zone_name,
        })
    }
}

#[utoipa::path(
    get,
    path = "/clusters/{clusterName}/drift",
    summary = "Configuration drift: the cluster's live instances grouped by the hash of their sidecar's effective configuration.",
    params(super::paths::ClusterPath, DriftQuery),
    responses(
        (status = 200, description = "The groups, the largest first; without drift one group with every live instance and `differs` empty.", body = crate::store::drift::DriftView),
        (status = 400, description = "zoneName missing or malformed.", body = ErrorBody),
        ReadTokenMissing,
        NotFound,
    ),
)]
pub async fn drift(
    State(s): Shared,
    _r: Reader,
    super::paths::Valid(super::paths::ClusterPath {
        cluster_name: cluster,
    }): super::paths::Valid<super::paths::ClusterPath>,
    RawQuery(q): RawQuery,
) -> Result<axum::Json<crate::store::drift::DriftView>, ApiError> {
    let zone = DriftQuery::parse(q.as_deref())?.zone_name;
    s.instances
        .drift(&zone, &cluster)
        .map(axum::Json)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "Cluster {cluster} is neither registered nor reported in zone {zone}."
            ))
        })
}
