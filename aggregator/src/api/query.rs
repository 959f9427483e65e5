//! Query strings: URL-decoding, refusing unknown parameters, and the filters of
//! `GET /clusters` (AND across names, any-of within a name, exact and case-sensitive).

use meshcat_common::model::{ClusterRecord, Status};
use meshcat_common::validate::{MAX_TEXT_LEN, is_valid_name};

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

/// The single optional `zoneName` parameter of several paths.
pub fn zone_name(raw: Option<&str>) -> Result<Option<String>, ApiError> {
    let mut zone = None;
    for (_, v) in parse(raw, &["zoneName"])? {
        if zone.is_some() {
            return Err(ApiError::bad_query(
                "Query parameter zoneName is given twice.",
            ));
        }
        if !is_valid_name(&v) {
            return Err(ApiError::bad_query(
                "Query parameter zoneName must be 1 to 253 characters of letters, digits, '.', '_' and '-'.",
            ));
        }
        zone = Some(v);
    }
    Ok(zone)
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

/// Parsed filters; an empty list means "any".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterFilter {
    pub status: Vec<Status>,
    pub cluster_name: Vec<String>,
    pub zone_name: Vec<String>,
    pub name: Vec<String>,
    pub version: Vec<String>,
    pub owner: Vec<String>,
    pub capability: Vec<String>,
    pub prometheus_job: Vec<String>,
    pub authorized: Vec<bool>,
    pub enable_instance_metrics: Vec<bool>,
    pub enable_historical_metrics: Vec<bool>,
    pub business_impact: Vec<String>,
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
