//! Query strings: URL-decoding, refusing unknown parameters, and the filters of
//! `GET /clusters` (AND across names, any-of within a name, exact and case-sensitive).

use meshcat_common::model::{ClusterRecord, Status};
use meshcat_common::validate::{MAX_TEXT_LEN, is_valid_name};
use utoipa::IntoParams;

use super::error::ApiError;

/// Most parameters one query may carry.
pub const MAX_PARAMS: usize = 256;

/// Decodes `raw` into pairs, refusing parameters outside `allowed`.
pub fn parse(raw: Option<&str>, allowed: &[&str]) -> Result<Vec<(String, String)>, ApiError> {
    let mut out = Vec::new();
    for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        if out.len() == MAX_PARAMS {
            return Err(ApiError::bad_query(format!(
                "A query may carry at most {MAX_PARAMS} parameters."
            )));
        }
        if !allowed.contains(&k.as_ref()) {
            return Err(ApiError::bad_query(format!(
                "Unknown query parameter {:?}.",
                k.as_ref()
            )));
        }
        if v.len() > MAX_TEXT_LEN {
            return Err(ApiError::bad_query(format!(
                "Query parameter {k} is longer than {MAX_TEXT_LEN} bytes."
            )));
        }
        out.push((k.into_owned(), v.into_owned()));
    }
    Ok(out)
}

/// The answer to a parameter given twice.
pub fn twice(param: &str) -> ApiError {
    ApiError::bad_query(format!("Query parameter {param} is given twice."))
}

/// The value of a parameter that names a zone or a cluster, checked.
pub fn name(param: &str, v: String) -> Result<String, ApiError> {
    if is_valid_name(&v) {
        Ok(v)
    } else {
        Err(ApiError::bad_query(format!(
            "Query parameter {param} must be 1 to 253 characters of letters, digits, '.', '_' and '-'."
        )))
    }
}

/// The value of a parameter that is a whole number from 1 to `max`.
pub fn count<T>(param: &str, v: &str, max: T) -> Result<T, ApiError>
where
    T: std::str::FromStr + PartialOrd + From<u8> + std::fmt::Display + Copy,
{
    v.parse::<T>()
        .ok()
        .filter(|n| *n >= T::from(1) && *n <= max)
        .ok_or_else(|| {
            ApiError::bad_query(format!(
                "Query parameter {param} must be a whole number from 1 to {max}."
            ))
        })
}

/// The query of the routes that take an optional `zoneName`.
#[derive(Debug, Default, IntoParams)]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
pub struct ZoneQuery {
    /// Only this zone.
    pub zone_name: Option<String>,
}

impl ZoneQuery {
    /// Parses a query of at most one valid `zoneName`, refusing anything else.
    pub fn parse(raw: Option<&str>) -> Result<ZoneQuery, ApiError> {
        let mut zone = None;
        for (k, v) in parse(raw, &["zoneName"])? {
            if zone.is_some() {
                return Err(twice(&k));
            }
            zone = Some(name(&k, v)?);
        }
        Ok(ZoneQuery { zone_name: zone })
    }
}

/// The single optional `zoneName` parameter of several paths.
pub fn zone_name(raw: Option<&str>) -> Result<Option<String>, ApiError> {
    ZoneQuery::parse(raw).map(|q| q.zone_name)
}

/// The query of `DELETE /clusters/{clusterName}`: the zone is required.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
pub struct RequiredZoneQuery {
    /// The zone to delete the cluster from.
    pub zone_name: String,
}

impl RequiredZoneQuery {
    /// Parses like [`ZoneQuery`]; a missing `zoneName` is refused with `missing`.
    pub fn parse(raw: Option<&str>, missing: &str) -> Result<RequiredZoneQuery, ApiError> {
        match ZoneQuery::parse(raw)?.zone_name {
            Some(zone_name) => Ok(RequiredZoneQuery { zone_name }),
            None => Err(ApiError::bad_query(missing)),
        }
    }
}

/// The filter names of `GET /clusters`, exactly as the seed spells them.
pub const CLUSTER_FILTERS: &[&str] = &[
    "status",
    "clusterName",
    "zoneName",
    "name",
    "version",
    "owner",
    "capability",
    "prometheusJob",
    "authorized",
    "enableInstanceMetrics",
    "enableHistoricalMetrics",
    "businessImpact",
    "protocols",
];

/// Parsed filters; an empty list means "any". Each is exact and case-sensitive, and
/// a parameter given several times matches any of its values.
#[derive(Debug, Clone, Default, PartialEq, IntoParams)]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
pub struct ClusterFilter {
    /// The cluster's status.
    #[param(required = false)]
    pub status: Vec<Status>,
    #[param(required = false)]
    pub cluster_name: Vec<String>,
    #[param(required = false)]
    pub zone_name: Vec<String>,
    #[param(required = false)]
    pub name: Vec<String>,
    #[param(required = false)]
    pub version: Vec<String>,
    #[param(required = false)]
    pub owner: Vec<String>,
    #[param(required = false)]
    pub capability: Vec<String>,
    #[param(required = false)]
    pub prometheus_job: Vec<String>,
    /// Whether the caller may see the cluster's live data.
    #[param(required = false)]
    pub authorized: Vec<bool>,
    #[param(required = false)]
    pub enable_instance_metrics: Vec<bool>,
    #[param(required = false)]
    pub enable_historical_metrics: Vec<bool>,
    #[param(required = false)]
    pub business_impact: Vec<String>,
    /// Matches clusters whose protocols contain the value.
    #[param(required = false)]
    pub protocols: Vec<String>,
}

fn boolean(name: &str, v: &str) -> Result<bool, ApiError> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(ApiError::bad_query(format!(
            "Query parameter {name} must be true or false, got {v:?}."
        ))),
    }
}

fn any_of<T: PartialEq>(want: &[T], have: &T) -> bool {
    want.is_empty() || want.contains(have)
}

impl ClusterFilter {
    /// Parses the query of `GET /clusters`.
    pub fn parse(raw: Option<&str>) -> Result<ClusterFilter, ApiError> {
        let mut f = ClusterFilter::default();
        for (k, v) in parse(raw, CLUSTER_FILTERS)? {
            match k.as_str() {
                "status" => f.status.push(Status::parse(&v).ok_or_else(|| {
                    ApiError::bad_query(format!(
                        "Query parameter status must be stable, warning or down, got {v:?}."
                    ))
                })?),
                "clusterName" => f.cluster_name.push(v),
                "zoneName" => f.zone_name.push(v),
                "name" => f.name.push(v),
                "version" => f.version.push(v),
                "owner" => f.owner.push(v),
                "capability" => f.capability.push(v),
                "prometheusJob" => f.prometheus_job.push(v),
                "authorized" => f.authorized.push(boolean(&k, &v)?),
                "enableInstanceMetrics" => f.enable_instance_metrics.push(boolean(&k, &v)?),
                "enableHistoricalMetrics" => f.enable_historical_metrics.push(boolean(&k, &v)?),
                "businessImpact" => f.business_impact.push(v),
                "protocols" => f.protocols.push(v),
                other => {
                    return Err(ApiError::bad_query(format!(
                        "Unknown query parameter {other:?}."
                    )));
                }
            }
        }
        Ok(f)
    }

    /// Whether no filter is given at all.
    pub fn is_unfiltered(&self) -> bool {
        *self == ClusterFilter::default()
    }

    /// Whether a caller with this authorization can match at all.
    pub fn admits_caller(&self, authorized: bool) -> bool {
        any_of(&self.authorized, &authorized)
    }

    /// Whether a record in this status matches every given filter.
    pub fn matches(&self, r: &ClusterRecord, status: Status) -> bool {
        any_of(&self.status, &status)
            && any_of(&self.cluster_name, &r.cluster_name)
            && any_of(&self.zone_name, &r.zone_name)
            && any_of(&self.name, &r.name)
            && any_of(&self.version, &r.version)
            && any_of(&self.owner, &r.owner)
            && any_of(&self.capability, &r.capability)
            && any_of(&self.prometheus_job, &r.prometheus_job)
            && any_of(&self.enable_instance_metrics, &r.enable_instance_metrics)
            && any_of(
                &self.enable_historical_metrics,
                &r.enable_historical_metrics,
            )
            && any_of(&self.business_impact, &r.business_impact)
            && (self.protocols.is_empty() || self.protocols.iter().any(|p| r.protocols.contains(p)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_and_repeats() {
        let f =
            ClusterFilter::parse(Some("owner=team%20a&owner=b&status=down&protocols=h2")).unwrap();
        assert_eq!(f.owner, vec!["team a", "b"]);
        assert_eq!(f.status, vec![Status::Down]);
        let mut r = ClusterRecord::new("z", "c", "n");
        r.owner = "b".into();
        r.protocols = vec!["http".into(), "h2".into()];
        assert!(f.matches(&r, Status::Down));
        assert!(!f.matches(&r, Status::Stable));
    }

    #[test]
    fn the_documented_filters_are_the_parsed_ones() {
        use utoipa::IntoParams;
        let documented: Vec<String> = ClusterFilter::into_params(|| None)
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(documented, CLUSTER_FILTERS);
    }

    #[test]
    fn refuses_bad_values_naming_them() {
        for (q, word) in [
            ("status=Stable", "status"),
            ("authorized=yes", "authorized"),
            ("enableInstanceMetrics=1", "enableInstanceMetrics"),
            ("colour=red", "colour"),
        ] {
            let e = ClusterFilter::parse(Some(q)).unwrap_err();
            assert_eq!(e.status, 400);
            assert!(e.message.contains(word), "{q}: {}", e.message);
        }
    }
}
