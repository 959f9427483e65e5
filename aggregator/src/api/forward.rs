//! Forwarding to the owning replica (etcd store): an instance's metrics and its
//! sidecar's logging live with the replica its agent reports to. Any replica
//! answers these routes by passing the request on to the owner's advertised API
//! address, with the caller's headers and a header carrying the secret the
//! replicas share through etcd. The owner serves a request bearing that header
//! itself and never forwards it again; a wrong secret is refused.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;
use tracing::warn;

use super::AppState;
use super::error::ApiError;

/// Carries the replicas' shared secret on a forwarded request.
pub const FORWARDED: HeaderName = HeaderName::from_static("x-meshcat-forwarded");
/// Deadline of a forwarded request (the owner may run a command on a sidecar).
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest body forwarded: the per-instance routes take small JSON bodies.
const MAX_FORWARDED_BODY: usize = 64 << 10;

fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .timeout(FORWARD_TIMEOUT)
            .build()
            .expect("an HTTP client without TLS builds")
    })
}

/// The instance a per-instance route names.
enum Named {
    /// (zone, cluster, instance): `GET /metrics/{cluster}/{instance}` (zone from
    /// `zoneName`) and `/zones/{zone}/clusters/{cluster}/instances/{instance}/logging`.
    Cluster(Option<String>, String, String),
    /// (name, version, instance): `GET /metrics/{name}/{version}/{instance}`.
    Version(String, String, String),
}

/// A path segment, percent-decoded as the router decodes it.
fn decoded(seg: &str) -> String {
    percent_encoding::percent_decode_str(seg)
        .decode_utf8_lossy()
        .into_owned()
}

fn instance_of(req: &Request) -> Option<Named> {
    let segs: Vec<&str> = req.uri().path().trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["metrics", cluster, instance] => {
            let zone = req.uri().query().and_then(|q| {
                form_urlencoded::parse(q.as_bytes())
                    .find(|(k, _)| k == "zoneName")
                    .map(|(_, v)| v.into_owned())
            });
            Some(Named::Cluster(zone, decoded(cluster), decoded(instance)))
        }
        ["metrics", name, version, instance] => Some(Named::Version(
            decoded(name),
            decoded(version),
            decoded(instance),
        )),
        [
            "zones",
            zone,
            "clusters",
            cluster,
            "instances",
            instance,
            "logging",
        ] => Some(Named::Cluster(
            Some(decoded(zone)),
            decoded(cluster),
            decoded(instance),
        )),
        _ => None,
    }
}

/// Sends one request to replica `owner` as a forwarded request (with the shared
/// secret and the caller's authorization); its status and body text.
pub async fn to_replica(
    state: &AppState,
    owner: &str,
    method: reqwest::Method,
    path_and_query: &str,
    authorization: Option<&header::HeaderValue>,
    timeout: Duration,
) -> Result<(StatusCode, String), ApiError> {
    let unreachable = || {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "owner_unreachable",
            format!("The replica {owner} serving this instance did not answer."),
        )
    };
    let etcd = state.store.etcd().ok_or_else(unreachable)?;
    let (Some(addr), Some(secret)) = (etcd.peer(owner), etcd.secret()) else {
        return Err(unreachable());
    };
    let mut req = client()
        .request(method, format!("http://{addr}{path_and_query}"))
        .timeout(timeout)
        .header(&FORWARDED, secret);
    if let Some(a) = authorization {
        req = req.header(header::AUTHORIZATION, a);
    }
    let r = req.send().await.map_err(|e| {
        warn!(%owner, %addr, error = %e, "Forwarding to the owning replica failed.");
        unreachable()
    })?;
    let status = r.status();
    Ok((status, r.text().await.unwrap_or_default()))
}

/// Passes per-instance requests on to the owning replica.
pub async fn to_owner(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(etcd) = state.store.etcd() else {
        return next.run(req).await;
    };
    if let Some(given) = req.headers().get(&FORWARDED) {
        // Forwarded by a peer: serve it here, never forward it again.
        let ok = etcd
            .secret()
            .is_some_and(|s| bool::from(s.as_bytes().ct_eq(given.as_bytes())));
        if !ok {
            return ApiError::forbidden().into_response();
        }
        return next.run(req).await;
    }
    let owned = match instance_of(&req) {
        Some(Named::Cluster(zone, cluster, instance)) => state
            .store
            .remote_owner(zone.as_deref(), &cluster, &instance)
            .map(|o| (o, instance)),
        Some(Named::Version(name, version, instance)) => state
            .store
            .remote_owner_by_version(&name, &version, &instance)
            .map(|o| (o, instance)),
        None => None,
    };
    let Some((owner, instance)) = owned else {
        return next.run(req).await;
    };
    let (Some(addr), Some(secret)) = (etcd.peer(&owner), etcd.secret()) else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "owner_unreachable",
            format!("Instance {instance} is served by a replica whose address is not known yet."),
        )
        .into_response();
    };
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let Ok(body) = axum::body::to_bytes(body, MAX_FORWARDED_BODY).await else {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            "The request body is over the size limit.",
        )
        .into_response();
    };
    let mut out = client()
        .request(parts.method.clone(), format!("http://{addr}{path}"))
        .header(&FORWARDED, secret)
        .body(body);
    for name in [header::AUTHORIZATION, header::CONTENT_TYPE, header::ACCEPT] {
        if let Some(v) = parts.headers.get(&name) {
            out = out.header(name, v);
        }
    }
    match out.send().await {
        Ok(r) => {
            let status = r.status();
            let content_type = r.headers().get(header::CONTENT_TYPE).cloned();
            let bytes = r.bytes().await.unwrap_or_default();
            let mut res = Response::new(Body::from(bytes));
            *res.status_mut() = status;
            if let Some(ct) = content_type {
                res.headers_mut().insert(header::CONTENT_TYPE, ct);
            }
            res
        }
        Err(e) => {
            warn!(%owner, %addr, error = %e, "Forwarding to the owning replica failed.");
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                "owner_unreachable",
                format!("The replica serving instance {instance} did not answer."),
            )
            .into_response()
        }
    }
}
