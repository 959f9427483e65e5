//! The agent's ops port: its own Prometheus metrics (`GET /metrics`), liveness
//! (`GET /healthz`) and seed 4.14's sidecar log level (`GET /logging`,
//! `PUT /logging?level=`), translated to Envoy's `POST /logging`. Changing the
//! sidecar's level is guarded by [`OpsAccess`]: the ops token when one is given,
//! else only a loopback listener accepts it.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State, rejection::QueryRejection};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::envoy::{EnvoyError, seed_level};
use crate::state::{Agent, TargetChoice};

/// The error body of every non-2xx answer: `{"error": "...", "code": "..."}`.
#[derive(Debug)]
pub struct OpsError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl OpsError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }
}

impl IntoResponse for OpsError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": self.message, "code": self.code});
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<EnvoyError> for OpsError {
    fn from(e: EnvoyError) -> Self {
        match e {
            EnvoyError::Level(_) => {
                OpsError::new(StatusCode::BAD_REQUEST, "bad_level", e.to_string())
            }
            other => OpsError::new(
                StatusCode::BAD_GATEWAY,
                "sidecar_unavailable",
                other.to_string(),
            ),
        }
    }
}

/// Query of `/logging`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingQuery {
    /// The level to set (PUT only): error, warn, info or debug.
    level: Option<String>,
    /// Which sidecar, when the agent has several.
    instance: Option<String>,
    /// Its zone, when sidecars of that name run in several zones.
    zone: Option<String>,
    /// Its cluster, when sidecars of that name run in several clusters.
    cluster: Option<String>,
}

impl LoggingQuery {
    fn choice(&self) -> TargetChoice<'_> {
        TargetChoice {
            zone: self.zone.as_deref(),
            cluster: self.cluster.as_deref(),
            instance: self.instance.as_deref(),
        }
    }
}

/// Who may change a sidecar through the ops port (contract section 10): with an ops
/// token, only requests carrying it as a bearer token; without one, any caller of a
/// loopback listener (the pod or host itself) and nobody on any other address.
#[derive(Clone)]
pub struct OpsAccess {
    /// SHA-256 of the ops token. Comparing digests rather than the tokens keeps the
    /// comparison's time independent of the token's length as well as its bytes.
    token_digest: Option<[u8; 32]>,
    /// Whether the ops listener is on a loopback address.
    loopback: bool,
}

impl std::fmt::Debug for OpsAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpsAccess")
            .field("token", &self.token_digest.is_some())
            .field("loopback", &self.loopback)
            .finish()
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

impl OpsAccess {
    /// The rule for a listener on `addr`, with the ops token if one is configured.
    pub fn new(addr: SocketAddr, token: Option<&str>) -> Self {
        Self {
            token_digest: token.map(|t| sha256(t.as_bytes())),
            loopback: addr.ip().is_loopback(),
        }
    }

    /// Whether changes are refused to every caller (no token, non-loopback listener).
    pub fn writes_disabled(&self) -> bool {
        self.token_digest.is_none() && !self.loopback
    }

    /// Admits or refuses a changing request by its headers.
    fn check(&self, headers: &HeaderMap) -> Result<(), OpsError> {
        match &self.token_digest {
            Some(want) => {
                if bearer(headers).is_some_and(|t| bool::from(sha256(t).ct_eq(want))) {
                    Ok(())
                } else {
                    Err(OpsError::new(
                        StatusCode::FORBIDDEN,
                        "forbidden",
                        "This route needs the agent's ops token as a bearer token.",
                    ))
                }
            }
            None if self.loopback => Ok(()),
            None => Err(OpsError::new(
                StatusCode::FORBIDDEN,
                "writes_disabled",
                "Changes are disabled: the ops listener is not on loopback and no ops token is configured.",
            )),
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let v = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = v.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| token.trim_ascii())
}

/// What the ops handlers share.
#[derive(Debug, Clone)]
struct OpsState {
    agent: Agent,
    access: Arc<OpsAccess>,
}

/// The ops router; `access` guards the routes that change a sidecar.
pub fn app(agent: Agent, access: OpsAccess) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/logging", get(get_logging).put(put_logging))
        .fallback(|| async { OpsError::new(StatusCode::NOT_FOUND, "not_found", "No such path.") })
        .with_state(OpsState {
            agent,
            access: Arc::new(access),
        })
}

async fn metrics(State(OpsState { agent, .. }): State<OpsState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        agent.ops_metrics().render(),
    )
        .into_response()
}

fn query(q: Result<Query<LoggingQuery>, QueryRejection>) -> Result<LoggingQuery, OpsError> {
    q.map(|Query(q)| q)
        .map_err(|e| OpsError::new(StatusCode::BAD_REQUEST, "bad_query", e.body_text()))
}

async fn get_logging(
    State(OpsState { agent, .. }): State<OpsState>,
    q: Result<Query<LoggingQuery>, QueryRejection>,
) -> Result<String, OpsError> {
    let q = query(q)?;
    let admin = agent
        .admin(&q.choice())
        .map_err(|e| OpsError::new(e.status(), e.code(), e.to_string()))?;
    let level = admin.log_level().await?;
    Ok(seed_level(&level).to_owned())
}

async fn put_logging(
    State(OpsState { agent, access }): State<OpsState>,
    headers: HeaderMap,
    q: Result<Query<LoggingQuery>, QueryRejection>,
) -> Result<String, OpsError> {
    // Authentication before anything about the request is looked at.
    access.check(&headers)?;
    let q = query(q)?;
    let level = q.level.clone().unwrap_or_default();
    if meshcat_common::level::envoy_name(&level).is_none() {
        return Err(OpsError::new(
            StatusCode::BAD_REQUEST,
            "bad_level",
            format!("Level {level:?} is not one of error, warn, info, debug."),
        ));
    }
    let admin = agent
        .admin(&q.choice())
        .map_err(|e| OpsError::new(e.status(), e.code(), e.to_string()))?;
    admin.set_log_level(&level).await?;
    Ok(level)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(header::AUTHORIZATION, a.parse().unwrap());
        }
        h
    }

    #[test]
    fn access_rules() {
        let lo: SocketAddr = "127.0.0.1:9092".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:9092".parse().unwrap();
        assert!(OpsAccess::new(lo, None).check(&headers(None)).is_ok());
        let open = OpsAccess::new(any, None);
        assert!(open.writes_disabled());
        assert!(open.check(&headers(Some("Bearer x"))).is_err());
        for addr in [lo, any] {
            let a = OpsAccess::new(addr, Some("s3cret"));
            assert!(!a.writes_disabled());
            assert!(a.check(&headers(Some("Bearer s3cret"))).is_ok());
            assert!(a.check(&headers(Some("bearer  s3cret "))).is_ok());
            for bad in [
                None,
                Some("Bearer s3cre"),
                Some("Bearer s3cret2"),
                Some("Bearer "),
                Some("s3cret"),
            ] {
                assert!(a.check(&headers(bad)).is_err(), "{bad:?} on {addr}");
            }
        }
    }
}
