//! `GET /certificates` (contract section 19): the mesh's workload certificates, one
//! row per (live instance, certificate), sorted by expiry; live data, so the read
//! token comes first.

use std::time::Duration;

use axum::Json;
use axum::extract::{RawQuery, State};
use meshcat_common::identity::{CertState, CertificateRow};
use utoipa::IntoParams;
use utoipa::openapi::schema::{Array, ArrayBuilder, ObjectBuilder, Type};

use super::auth::Reader;
use super::error::{ApiError, ErrorBody};
use super::query;
use super::responses::ReadTokenMissing;
use super::troubleshoot::Shared;
use crate::store::identity::CertificateQuery;

/// `state`: repeatable, each one of the states.
fn states() -> Array {
    ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(CertState::ALL.map(CertState::as_str))),
        )
        .build()
}

/// The query of `GET /certificates`.
#[derive(Debug, Default, IntoParams)]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
pub struct CertificatesQuery {
    /// Only the certificates of this zone's instances.
    pub zone_name: Option<String>,
    /// Only the certificates of this cluster's instances.
    pub cluster_name: Option<String>,
    /// Only certificates in these states (repeatable: any of them).
    #[param(required = false, schema_with = states)]
    pub state: Vec<CertState>,
    /// Only certificates that expire before now plus this duration (like 36h, 7d;
    /// at most 10 years), the expired ones included.
    #[param(value_type = Option<String>)]
    pub expiring_within: Option<Duration>,
}

const PARAMS: &[&str] = &["zoneName", "clusterName", "state", "expiringWithin"];

/// Longest `expiringWithin`: ten years.
const MAX_WITHIN: Duration = Duration::from_secs(10 * 365 * 86_400);

impl CertificatesQuery {
    fn into_query(self) -> CertificateQuery {
        CertificateQuery {
            zone: self.zone_name,
            cluster: self.cluster_name,
            states: self.state,
            expiring_within: self.expiring_within,
        }
    }
}

/// Parses the query of `GET /certificates`.
pub fn parse(raw: Option<&str>) -> Result<CertificateQuery, ApiError> {
    let mut q = CertificatesQuery::default();
    for (k, v) in query::parse(raw, PARAMS)? {
        match k.as_str() {
            "zoneName" if q.zone_name.is_none() => q.zone_name = Some(query::name(&k, v)?),
            "clusterName" if q.cluster_name.is_none() => q.cluster_name = Some(query::name(&k, v)?),
            "state" => {
                let state = CertState::parse(&v).ok_or_else(|| {
                    ApiError::bad_query(format!(
                        "Query parameter state must be one of {}, not {v:?}.",
                        CertState::ALL.map(CertState::as_str).join(", ")
                    ))
                })?;
                if !q.state.contains(&state) {
                    q.state.push(state);
                }
            }
            "expiringWithin" if q.expiring_within.is_none() => {
                let d = meshcat_common::config::parse_duration(&v)
                    .ok()
                    .filter(|d| *d <= MAX_WITHIN)
                    .ok_or_else(|| {
                        ApiError::bad_query(format!(
                            "Query parameter expiringWithin must be a duration like 36h or 7d, at most 10 years, not {v:?}."
                        ))
                    })?;
                q.expiring_within = Some(d);
            }
            _ => return Err(query::twice(&k)),
        }
    }
    Ok(q.into_query())
}

#[utoipa::path(
    get,
    path = "/certificates",
    summary = "The workload certificates of every live instance, one row per (instance, certificate), soonest expiry first.",
    params(CertificatesQuery),
    responses(
        (status = 200, description = "Rows sorted by expiry, then zone, cluster, instance, role and serial. States are read now (docs/identity.md).", body = Vec<CertificateRow>),
        (status = 400, description = "A malformed or unknown parameter, named in the message.", body = ErrorBody),
        ReadTokenMissing,
    ),
)]
pub async fn certificates(
    State(s): Shared,
    _r: Reader,
    RawQuery(q): RawQuery,
) -> Result<Json<Vec<CertificateRow>>, ApiError> {
    let q = parse(q.as_deref())?;
    let instances = s.instances.clone();
    let rows = tokio::task::spawn_blocking(move || instances.identities().certificates(&q))
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "Certificate listing failed.");
            ApiError::internal()
        })?;
    Ok(Json(rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_read_or_refused_by_name() {
        let q = parse(Some(
            "zoneName=z&state=expiring&state=expired&expiringWithin=36h",
        ))
        .unwrap();
        assert_eq!(q.zone.as_deref(), Some("z"));
        assert_eq!(q.states, [CertState::Expiring, CertState::Expired]);
        assert_eq!(q.expiring_within, Some(Duration::from_secs(36 * 3600)));
        for bad in [
            "state=soon",
            "expiringWithin=tomorrow",
            "expiringWithin=20000d",
            "zoneName=a&zoneName=b",
            "zoneName=bad%20name",
            "owner=x",
        ] {
            assert!(parse(Some(bad)).is_err(), "{bad}");
        }
        assert!(parse(None).unwrap().states.is_empty());
    }
}
