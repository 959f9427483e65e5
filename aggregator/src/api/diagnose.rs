//! `GET /diagnose/{clusterName}` (contract section 5): the query, checked after the
//! caller, handed to the diagnosis service ([`crate::diagnosis`]); and the replicas'
//! own evidence route, which a peer's diagnosis asks of the owner of an instance.

use std::time::Duration;

use axum::Json;
use axum::extract::{RawQuery, State};
use meshcat_common::wire::{EvidenceOutput, LineQuery};
use meshcat_diagnose::{DiagnosisReport, Symptom};
use tracing::warn;
use utoipa::IntoParams;

use super::auth::{DiagnoseCaller, Granted};
use super::error::{ApiError, ErrorBody};
use super::logging::seconds_value;
use super::paths::{ClusterPath, Valid};
use super::query;
use super::responses::NotFound;
use super::troubleshoot::{Shared, cluster_or_404, sidecars, unexpected, zone_or_404};
use crate::diagnosis::{
    DEFAULT_LOOKBACK, DEFAULT_MAX_HOPS, Diagnosis, EVIDENCE_LOG_LINES, MAX_HOPS, MAX_LOOKBACK,
    Request,
};
use crate::peer_signature::Access;
use crate::sidecars::{Answer, Ask, Owner, Target, window_deadline};

/// Longest `path` accepted by the diagnosis.
pub const MAX_PATH_LEN: usize = 2_048;

/// The query of `GET /diagnose/{clusterName}`.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
struct DiagnoseQuery {
    /// The zone of the cluster.
    #[param(rename = "zoneName")]
    zone: String,
    /// The failure as the operator sees it; without it every check runs.
    symptom: Option<Symptom>,
    /// Path of the failing request; the access lines of the cluster asked about are
    /// filtered on it (the clusters followed are read whole).
    path: Option<String>,
    /// Run a debug window of that many seconds on the sidecars of the cluster asked
    /// about and its edge before collecting; the clusters followed are read without
    /// one, so a diagnosis runs one window at most.
    #[param(minimum = 1, maximum = 300)]
    debug_seconds: Option<u32>,
    /// Most clusters diagnosed along a failing chain of calls, the one asked about
    /// included (default 3).
    #[param(minimum = 1, maximum = 5)]
    max_hops: Option<usize>,
    /// How far back `recentChanges` reach: a duration like 15m (the default), 2h, or
    /// 1d at most.
    #[param(value_type = Option<String>)]
    lookback: Option<Duration>,
}

fn diagnose_query(raw: Option<&str>) -> Result<DiagnoseQuery, ApiError> {
    let mut zone = None;
    let mut symptom = None;
    let mut path = None;
    let mut debug_seconds = None;
    let mut max_hops = None;
    let mut lookback = None;
    for (k, v) in query::parse(
        raw,
        &[
            "zoneName",
            "symptom",
            "path",
            "debugSeconds",
            "maxHops",
            "lookback",
        ],
    )? {
        let twice = || query::twice(&k);
        match k.as_str() {
            "zoneName" => {
                if zone.is_some() {
                    return Err(twice());
                }
                zone = Some(query::name(&k, v)?);
            }
            "symptom" => {
                if symptom.is_some() {
                    return Err(twice());
                }
                symptom =
                    Some(Symptom::from_query(Some(&v)).map_err(|e| {
                        ApiError::bad_query(format!("Query parameter symptom: {e}."))
                    })?);
            }
            "path" => {
                if path.is_some() {
                    return Err(twice());
                }
                if !v.is_empty() {
                    if !v.starts_with('/')
                        || v.len() > MAX_PATH_LEN
                        || v.contains(char::is_whitespace)
                    {
                        return Err(ApiError::bad_query(format!(
                            "Query parameter path must start with '/', hold no spaces and be at most {MAX_PATH_LEN} bytes."
                        )));
                    }
                    path = Some(v);
                }
            }
            "maxHops" => {
                if max_hops.is_some() {
                    return Err(twice());
                }
                let n = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_HOPS).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_query(format!(
                            "Query parameter maxHops must be an integer from 1 to {MAX_HOPS}."
                        ))
                    })?;
                max_hops = Some(n);
            }
            "lookback" => {
                if lookback.is_some() {
                    return Err(twice());
                }
                let d = meshcat_common::config::parse_duration(&v)
                    .ok()
                    .filter(|d| *d >= Duration::from_secs(1) && *d <= MAX_LOOKBACK)
                    .ok_or_else(|| {
                        ApiError::bad_query(format!(
                            "Query parameter lookback must be a duration from 1s to 1d, like 15m, not {v:?}."
                        ))
                    })?;
                lookback = Some(d);
            }
            _ => {
                if debug_seconds.is_some() {
                    return Err(twice());
                }
                debug_seconds = Some(seconds_value("debugSeconds", &v)?);
            }
        }
    }
    Ok(DiagnoseQuery {
        zone: zone.ok_or_else(|| ApiError::bad_query("Query parameter zoneName is required."))?,
        symptom: symptom.flatten(),
        path,
        debug_seconds,
        max_hops,
        lookback,
    })
}

/// The replicas' own route for diagnosis evidence (etcd store only, never in the
/// public API): a peer asks the owner of an instance for that sidecar's evidence.
pub const PEER_EVIDENCE: &str = crate::replicas::PEER_EVIDENCE;

/// `GET /peer/evidence?zoneName=&clusterName=&instance=[&path=][&debugSeconds=][&requestId=][&logOnly=true]`:
/// answers only requests forwarded by a peer (the forwarding layer has checked their
/// secret); anything else is told there is no such route.
pub async fn peer_evidence(
    State(s): Shared,
    granted: Option<axum::Extension<Granted>>,
    RawQuery(q): RawQuery,
) -> Result<Json<EvidenceOutput>, ApiError> {
    let Some(axum::Extension(Granted(access))) = granted.filter(|_| s.store.etcd().is_some())
    else {
        return Err(ApiError::not_found(format!(
            "No resource at GET {PEER_EVIDENCE}."
        )));
    };
    let mut zone = None;
    let mut cluster = None;
    let mut instance = None;
    let mut path = None;
    let mut debug_seconds = None;
    let mut lines = LineQuery::default();
    for (k, v) in query::parse(
        q.as_deref(),
        &[
            "zoneName",
            "clusterName",
            "instance",
            "path",
            "debugSeconds",
            "requestId",
            "logOnly",
        ],
    )? {
        match k.as_str() {
            "zoneName" => zone = Some(v),
            "clusterName" => cluster = Some(v),
            "instance" => instance = Some(v),
            "path" => path = Some(v),
            "requestId" => lines.request_id = Some(v),
            "logOnly" => lines.log_only = v == "true",
            _ => debug_seconds = Some(seconds_value("debugSeconds", &v)?),
        }
    }
    // Evidence is live data; a debug window changes the sidecar.
    let needed = if debug_seconds.is_some() {
        Access::Write
    } else {
        Access::Read
    };
    if access < needed {
        return Err(ApiError::forbidden());
    }
    let (Some(zone), Some(cluster), Some(instance)) = (zone, cluster, instance) else {
        return Err(ApiError::bad_query(
            "Query parameters zoneName, clusterName and instance are required.",
        ));
    };
    // Served here, on this replica's agent: a peer asks only the owner.
    let ask = Ask::Evidence {
        path,
        max_lines: EVIDENCE_LOG_LINES,
        debug_seconds,
        lines,
    };
    let deadline = window_deadline(s.diagnosis.command_timeout, debug_seconds.unwrap_or(0));
    let here = Target {
        instance: instance.clone(),
        owner: Owner::Here,
    };
    match sidecars(&s)
        .run((&zone, &cluster), &here, ask, deadline)
        .await?
    {
        Answer::Evidence(e) => Ok(Json(*e)),
        _ => Err(unexpected(&instance)),
    }
}

/// `GET /diagnose/{clusterName}?zoneName=&symptom=&path=[&debugSeconds=N]`.
#[utoipa::path(
    get,
    path = "/diagnose/{clusterName}",
    summary = "Run the mesh troubleshooting playbook for a cluster (contract section 5).",
    params(ClusterPath, DiagnoseQuery),
    responses(
        (status = 200, description = "The diagnosis report.", body = DiagnosisReport),
        (status = 400, description = "Malformed query, unknown symptom, or zoneName missing.", body = ErrorBody),
        (status = 401, description = "debugSeconds is given, a write token is configured and the request lacks it.", body = ErrorBody),
        (status = 403, description = "A read token is configured and the request lacks it, or debugSeconds is given and writes are disabled.", body = ErrorBody),
        NotFound,
    ),
)]
pub async fn diagnose(
    State(s): Shared,
    _c: DiagnoseCaller,
    Valid(ClusterPath {
        cluster_name: cluster,
    }): Valid<ClusterPath>,
    RawQuery(q): RawQuery,
) -> Result<Json<DiagnosisReport>, ApiError> {
    let q = diagnose_query(q.as_deref())?;
    let zone = zone_or_404(&s, &q.zone)?;
    let sidecars = sidecars(&s);
    cluster_or_404(&sidecars, &q.zone, &cluster)?;
    let diagnosis = Diagnosis {
        sidecars,
        store: s.store.clone(),
        instances: s.instances.clone(),
        history: s.history.clone(),
        graphs: s.graph.clone(),
        controls: s.controls.clone(),
        sync: s.sync.clone(),
        tools: s.diagnosis.clone(),
    };
    let request = Request {
        symptom: q.symptom,
        path: q.path,
        debug_seconds: q.debug_seconds,
        max_hops: q.max_hops.unwrap_or(DEFAULT_MAX_HOPS),
        lookback: q.lookback.unwrap_or(DEFAULT_LOOKBACK),
    };
    let report = diagnosis
        .run(&zone, &cluster, &request)
        .await
        .map_err(|e| {
            warn!(error = %e, "Diagnosis failed.");
            ApiError::internal()
        })?;
    Ok(Json(report))
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;

    #[test]
    fn diagnose_query_bounds() {
        let q = diagnose_query(Some(
            "zoneName=east&symptom=no_healthy_upstream&path=%2Fcatalog%2Fitems&debugSeconds=300",
        ))
        .unwrap();
        assert_eq!(q.zone, "east");
        assert_eq!(q.symptom, Some(Symptom::NoHealthyUpstream));
        assert_eq!(q.path.as_deref(), Some("/catalog/items"));
        assert_eq!(q.debug_seconds, Some(300));
        assert_eq!(q.max_hops, None);
        assert_eq!(q.lookback, None);
        assert_eq!(
            diagnose_query(Some("zoneName=east&lookback=1h"))
                .unwrap()
                .lookback,
            Some(Duration::from_secs(3600))
        );
        assert_eq!(
            diagnose_query(Some("zoneName=east&maxHops=5"))
                .unwrap()
                .max_hops,
            Some(5)
        );
        let all = diagnose_query(Some("zoneName=east&symptom=&path=")).unwrap();
        assert_eq!((all.symptom, all.path), (None, None));
        let e = diagnose_query(Some("zoneName=east&symptom=slow")).unwrap_err();
        assert!(e.message.contains("\"slow\""), "{}", e.message);
        for bad in [
            "",
            "symptom=ingress_502_503",
            "zoneName=a%20b",
            "zoneName=east&zoneName=west",
            "zoneName=east&debugSeconds=0",
            "zoneName=east&debugSeconds=301",
            "zoneName=east&debugSeconds=1.5",
            "zoneName=east&path=catalog",
            "zoneName=east&other=1",
            "zoneName=east&maxHops=0",
            "zoneName=east&maxHops=6",
            "zoneName=east&maxHops=2&maxHops=3",
            "zoneName=east&lookback=0s",
            "zoneName=east&lookback=2d",
            "zoneName=east&lookback=soon",
            "zoneName=east&lookback=1m&lookback=2m",
        ] {
            let e = diagnose_query(Some(bad)).err();
            assert_eq!(e.map(|e| e.status), Some(StatusCode::BAD_REQUEST), "{bad}");
        }
    }
}
