//! What a `GET /events` asks for: its query, the id it resumes after, and the
//! stream's events as the OpenAPI document describes them.

use meshcat_common::validate::is_valid_name;
use utoipa::{IntoParams, ToSchema};

use super::super::error::ApiError;
use super::super::query;
use super::frames::Filter;

/// An event id as `?since=` or `Last-Event-ID` give it (the header trimmed of
/// blanks first): one unsigned integer in ASCII digits. Anything else (longer than a
/// u64 can be, a sign, other characters) is `None`; nothing is allocated.
pub fn parse_event_id(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // u64::MAX has 20 digits: past leading zeros, a longer value cannot be one.
    let significant = &v[v.iter().position(|b| *b != b'0').unwrap_or(v.len())..];
    if significant.len() > 20 {
        return None;
    }
    significant.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// What a `GET /events` asks for: its filter and the id it resumes after, from its
/// query and its `Last-Event-ID` header (`?since=` wins). A malformed query is an
/// error; a malformed header is ignored (the client echoes back what it was sent).
pub fn parse_request(
    query: Option<&str>,
    last_event_id: Option<&[u8]>,
) -> Result<(Filter, Option<u64>), ApiError> {
    let q = EventsQuery::parse(query)?;
    let filter = Filter {
        zone: q.zone_name,
        cluster: q.cluster_name,
    };
    let since = q
        .since
        .or_else(|| last_event_id.and_then(|v| parse_event_id(v.trim_ascii())));
    Ok((filter, since))
}

/// The query of `GET /events`.
#[derive(Debug, Default, IntoParams)]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
pub struct EventsQuery {
    /// Only the events of this zone.
    pub zone_name: Option<String>,
    /// Only the events of this cluster.
    pub cluster_name: Option<String>,
    /// Replay the changes after this index (like Last-Event-ID).
    pub since: Option<u64>,
}

impl EventsQuery {
    /// Parses the query alone; a malformed one is an error naming the parameter.
    pub fn parse(query: Option<&str>) -> Result<EventsQuery, ApiError> {
        let mut q = EventsQuery::default();
        let since = &mut q.since;
        for (k, v) in query::parse(query, &["zoneName", "clusterName", "since"])? {
            let slot = match k.as_str() {
                "zoneName" => &mut q.zone_name,
                "clusterName" => &mut q.cluster_name,
                _ => {
                    let n = parse_event_id(v.as_bytes())
                        .filter(|_| since.is_none())
                        .ok_or_else(|| {
                            ApiError::bad_query(
                                "Query parameter since must be one unsigned integer.",
                            )
                        })?;
                    *since = Some(n);
                    continue;
                }
            };
            if slot.is_some() || !is_valid_name(&v) {
                return Err(ApiError::bad_query(format!(
                    "Query parameter {k} must be given once, 1 to 253 characters of letters, digits, '.', '_' and '-'."
                )));
            }
            *slot = Some(v);
        }
        Ok(q)
    }
}

/// One event of the stream as the document describes it: an `event:` line, a `data:`
/// line and, except `reset`, the index of its change as `id:`.
#[derive(Debug, ToSchema)]
pub struct StreamEvent {
    #[schema(inline)]
    pub event: StreamEventName,
    /// JSON: a cluster as in GET /clusters, {clusterName, zoneName}, a zone record,
    /// {zoneName}, the summary's metadata, a history entry as in GET /history (only
    /// to callers holding the read token), or {} for reset.
    pub data: String,
    #[schema(pattern = "^[0-9]+$")]
    pub id: Option<String>,
}

/// The names of the stream's events.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "kebab-case")]
pub enum StreamEventName {
    Cluster,
    ClusterDeleted,
    Zone,
    ZoneDeleted,
    Graph,
    History,
    Summary,
    Reset,
}
