//! `GET /history` and `GET /clusters/{clusterName}/history` (contract section 15):
//! the history's entries, newest first, filtered; live data, so the read token
//! comes first. The answer is rendered from the stored entries as they are, the
//! query runs on the blocking pool (it reads the indexes and the entries from disk).

use axum::extract::{RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use meshcat_common::model::HistoryEntry;
use meshcat_common::validate::is_valid_instance;
use utoipa::IntoParams;
use utoipa::openapi::schema::{Array, ArrayBuilder, ObjectBuilder, Type};

use super::auth::Reader;
use super::error::{ApiError, ErrorBody};
use super::paths::{ClusterPath, Valid};
use super::query;
use super::responses::ReadTokenMissing;
use super::troubleshoot::Shared;
use crate::history::{Kind, Query};

/// Entries answered without `limit`.
pub const DEFAULT_LIMIT: usize = 100;
/// Most entries one answer holds.
pub const MAX_LIMIT: usize = 1000;

/// `kind`: repeatable, each one of the kinds.
fn kinds() -> Array {
    ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(Kind::ALL.map(Kind::as_str))),
        )
        .build()
}

/// The query of `GET /history`.
#[derive(Debug, Default, IntoParams)]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
pub struct HistoryQuery {
    /// Only the entries of this zone.
    pub zone_name: Option<String>,
    /// Only the entries of this cluster.
    pub cluster_name: Option<String>,
    /// Only the entries of this instance.
    pub instance: Option<String>,
    /// Only entries of these kinds (repeatable: any of them).
    #[param(required = false, schema_with = kinds)]
    pub kind: Vec<Kind>,
    /// Entries at or after this time, in ms since the epoch.
    #[param(minimum = 0)]
    pub since: Option<i64>,
    /// Entries before this time, in ms since the epoch.
    #[param(minimum = 0)]
    pub until: Option<i64>,
    /// Most entries answered, the newest (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// The query of `GET /clusters/{clusterName}/history`.
#[derive(Debug, Default, IntoParams)]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
pub struct ClusterHistoryQuery {
    /// Only the entries of the cluster in this zone (default: every zone).
    pub zone_name: Option<String>,
    /// Only the entries of this instance.
    pub instance: Option<String>,
    /// Only entries of these kinds (repeatable: any of them).
    #[param(required = false, schema_with = kinds)]
    pub kind: Vec<Kind>,
    /// Entries at or after this time, in ms since the epoch.
    #[param(minimum = 0)]
    pub since: Option<i64>,
    /// Entries before this time, in ms since the epoch.
    #[param(minimum = 0)]
    pub until: Option<i64>,
    /// Most entries answered, the newest (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

const PARAMS: &[&str] = &[
    "zoneName",
    "clusterName",
    "instance",
    "kind",
    "since",
    "until",
    "limit",
];

/// The parameters of `GET /clusters/{clusterName}/history`: the cluster is its path's.
const CLUSTER_PARAMS: &[&str] = &["zoneName", "instance", "kind", "since", "until", "limit"];

impl HistoryQuery {
    /// Parses a query of the `allowed` parameters.
    fn parse(raw: Option<&str>, allowed: &[&str]) -> Result<HistoryQuery, ApiError> {
        let mut q = HistoryQuery::default();
        for (k, v) in query::parse(raw, allowed)? {
            let time = |v: &str| {
                v.parse::<i64>().ok().filter(|t| *t >= 0).ok_or_else(|| {
                    ApiError::bad_query(format!(
                        "Query parameter {k} must be a time in milliseconds since the epoch, not {v:?}."
                    ))
                })
            };
            match k.as_str() {
                "zoneName" if q.zone_name.is_none() => q.zone_name = Some(query::name(&k, v)?),
                "clusterName" if q.cluster_name.is_none() => {
                    q.cluster_name = Some(query::name(&k, v)?)
                }
                "instance" if q.instance.is_none() => {
                    if !is_valid_instance(&v) {
                        return Err(ApiError::bad_query(
                            "Query parameter instance is not a valid instance name.",
                        ));
                    }
                    q.instance = Some(v);
                }
                "kind" => {
                    let kind = Kind::parse(&v).ok_or_else(|| {
                        ApiError::bad_query(format!(
                            "Query parameter kind must be one of {}, not {v:?}.",
                            Kind::ALL.map(Kind::as_str).join(", ")
                        ))
                    })?;
                    if !q.kind.contains(&kind) {
                        q.kind.push(kind);
                    }
                }
                "since" if q.since.is_none() => q.since = Some(time(&v)?),
                "until" if q.until.is_none() => q.until = Some(time(&v)?),
                "limit" if q.limit.is_none() => q.limit = Some(query::count(&k, &v, MAX_LIMIT)?),
                _ => return Err(query::twice(&k)),
            }
        }
        Ok(q)
    }

    fn into_query(self) -> Query {
        Query {
            zone: self.zone_name,
            cluster: self.cluster_name,
            instance: self.instance,
            kinds: self.kind,
            since: self.since,
            until: self.until,
            limit: self.limit.unwrap_or(DEFAULT_LIMIT),
        }
    }
}

impl ClusterHistoryQuery {
    fn parse(raw: Option<&str>) -> Result<ClusterHistoryQuery, ApiError> {
        let q = HistoryQuery::parse(raw, CLUSTER_PARAMS)?;
        Ok(ClusterHistoryQuery {
            zone_name: q.zone_name,
            instance: q.instance,
            kind: q.kind,
            since: q.since,
            until: q.until,
            limit: q.limit,
        })
    }

    fn into_query(self, cluster: String) -> Query {
        HistoryQuery {
            zone_name: self.zone_name,
            cluster_name: Some(cluster),
            instance: self.instance,
            kind: self.kind,
            since: self.since,
            until: self.until,
            limit: self.limit,
        }
        .into_query()
    }
}

/// Parses the query of `GET /history`.
fn parse(raw: Option<&str>) -> Result<Query, ApiError> {
    Ok(HistoryQuery::parse(raw, PARAMS)?.into_query())
}

#[utoipa::path(
    get,
    path = "/history",
    summary = "The history: what changed in the catalog and its sidecars, newest first.",
    params(HistoryQuery),
    responses(
        (status = 200, description = "Entries newest first, at most `limit`; empty when the history is off (--history-max-entries 0). A query examines at most 100,000 entries (the indexes give it those its filters name, and those of names that share their key): one that stopped there before it had `limit` entries answers those it found with the header `X-Meshcat-History-Incomplete`, the time (ms) of the last entry examined; older entries were not looked at (ask again with `until` set to it).", body = Vec<HistoryEntry>,
            headers(("X-Meshcat-History-Incomplete" = i64, description = "Set when the query stopped at its bound of examined entries: the time (ms since the epoch) of the last entry examined. Entries before it were not looked at."))),
        (status = 400, description = "A malformed parameter, named in the message.", body = ErrorBody),
        ReadTokenMissing,
    ),
)]
pub async fn history(
    State(s): Shared,
    _r: Reader,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let q = parse(q.as_deref())?;
    answer(&s, q).await
}

#[utoipa::path(
    get,
    path = "/clusters/{clusterName}/history",
    summary = "One cluster's history, newest first; a deleted cluster's entries stay until retention drops them.",
    params(ClusterPath, ClusterHistoryQuery),
    responses(
        (status = 200, description = "Entries newest first, at most `limit`. A query examines at most 100,000 entries: one that stopped there before it had `limit` entries answers those it found with the header `X-Meshcat-History-Incomplete`, as on `GET /history`.", body = Vec<HistoryEntry>,
            headers(("X-Meshcat-History-Incomplete" = i64, description = "Set when the query stopped at its bound of examined entries: the time (ms since the epoch) of the last entry examined. Entries before it were not looked at."))),
        (status = 400, description = "A malformed parameter, named in the message.", body = ErrorBody),
        ReadTokenMissing,
    ),
)]
pub async fn cluster_history(
    State(s): Shared,
    _r: Reader,
    Valid(ClusterPath {
        cluster_name: cluster,
    }): Valid<ClusterPath>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let q = ClusterHistoryQuery::parse(q.as_deref())?.into_query(cluster);
    answer(&s, q).await
}

/// The header of an answer whose query stopped at its bound of examined entries
/// ([`crate::history::log::MAX_EXAMINED`]): the time (ms) of the last entry
/// examined. Every entry the query admits at or after it is in the answer; older
/// ones were not looked at (ask again with `until` set to it).
pub const INCOMPLETE_HEADER: &str = "x-meshcat-history-incomplete";

/// The entries `q` asks for, as a JSON array.
async fn answer(s: &super::AppState, q: Query) -> Result<Response, ApiError> {
    let mut body = Vec::with_capacity(2 + q.limit.min(MAX_LIMIT) * 160);
    body.push(b'[');
    let mut incomplete = None;
    if let Some(h) = &s.history {
        let found = h.db().read(move |db| db.query(&q)).await.map_err(|e| {
            tracing::warn!(error = %e, "History query failed.");
            ApiError::internal()
        })?;
        for (n, row) in found.rows.iter().enumerate() {
            if n > 0 {
                body.push(b',');
            }
            crate::history::writer::write_json(&mut body, row.id, &row.stored());
        }
        incomplete = found.incomplete;
    }
    body.push(b']');
    let mut response = ([(header::CONTENT_TYPE, "application/json")], body).into_response();
    if let Some(at) = incomplete {
        response
            .headers_mut()
            .insert(INCOMPLETE_HEADER, header::HeaderValue::from(at));
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;

    #[test]
    fn parses_filters_and_bounds() {
        let q = parse(Some(
            "zoneName=z&clusterName=c&instance=i-1&kind=status-changed&kind=drift-started&kind=status-changed&since=5&until=9&limit=1000",
        ))
        .unwrap();
        assert_eq!(
            q,
            Query {
                zone: Some("z".into()),
                cluster: Some("c".into()),
                instance: Some("i-1".into()),
                kinds: vec![Kind::StatusChanged, Kind::DriftStarted],
                since: Some(5),
                until: Some(9),
                limit: 1000,
            }
        );
        assert_eq!(parse(None).unwrap().limit, DEFAULT_LIMIT);
        for (bad, named) in [
            ("limit=0", "limit"),
            ("limit=1001", "limit"),
            ("limit=ten", "limit"),
            ("since=-1", "since"),
            ("until=soon", "until"),
            ("kind=cluster", "kind"),
            ("zoneName=a%20b", "zoneName"),
            ("zoneName=a&zoneName=b", "zoneName"),
            ("since=1&since=2", "since"),
            ("colour=red", "colour"),
        ] {
            let e = parse(Some(bad)).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
            assert!(e.message.contains(named), "{bad}: {}", e.message);
        }
        // The cluster's route takes its cluster from the path.
        let e = ClusterHistoryQuery::parse(Some("clusterName=c")).unwrap_err();
        assert!(e.message.contains("clusterName"), "{}", e.message);
        let q = ClusterHistoryQuery::parse(Some("zoneName=z&limit=5"))
            .unwrap()
            .into_query("c".into());
        assert_eq!(
            (q.zone.as_deref(), q.cluster.as_deref(), q.limit),
            (Some("z"), Some("c"), 5)
        );
    }

    #[test]
    fn the_documented_parameters_are_the_parsed_ones() {
        let documented: Vec<String> = HistoryQuery::into_params(|| None)
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(documented, PARAMS);
        let documented: Vec<String> = ClusterHistoryQuery::into_params(|| None)
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(documented, CLUSTER_PARAMS);
    }
}
