//! Forwarding to the owning replica (etcd store): an instance's metrics and its
//! sidecar's logging live with the replica its agent reports to. Any replica
//! answers these routes by passing the request on to the owner's advertised API
//! address; which replica that is, the sidecar layer says
//! ([`crate::sidecars::Sidecars::serving`]). The caller's token never travels: this replica authenticates the caller
//! and signs, with the secret the replicas share through etcd, the request and the
//! access it granted ([`crate::peer_signature`]). The owner serves a request with a
//! valid signature itself, judged by that access alone, and never forwards it
//! again; a bad, stale or replayed signature is refused. A peer's answer is passed
//! on only as JSON or plain text. Replicas that serve their API over HTTPS forward
//! over HTTPS, verifying the owner's certificate against `--peer-ca-file`.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tracing::debug;

use super::AppState;
use super::auth::Granted;
use super::error::ApiError;
use super::troubleshoot::sidecars;
use crate::peer_signature::{Access, Signed, Signer};
use crate::replicas::{PeerCallError, PeerRequest, Replicas};
use crate::sidecars::{InstanceRef, Owner};

pub use crate::replicas::{FORWARDED, Peers};
/// Deadline of a forwarded request (the owner may run a command on a sidecar).
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest body forwarded: the per-instance routes take small JSON bodies.
const MAX_FORWARDED_BODY: usize = 64 << 10;

/// A path segment, percent-decoded as the router decodes it.
fn decoded(seg: &str) -> String {
    percent_encoding::percent_decode_str(seg)
        .decode_utf8_lossy()
        .into_owned()
}

fn instance_of(req: &Request) -> Option<InstanceRef> {
    let segs: Vec<&str> = req.uri().path().trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["metrics", cluster, instance] => {
            let zone = req.uri().query().and_then(|q| {
                form_urlencoded::parse(q.as_bytes())
                    .find(|(k, _)| k == "zoneName")
                    .map(|(_, v)| v.into_owned())
            });
            Some(InstanceRef::Cluster {
                zone,
                cluster: decoded(cluster),
                instance: decoded(instance),
            })
        }
        ["metrics", name, version, instance] => Some(InstanceRef::Version {
            name: decoded(name),
            version: decoded(version),
            instance: decoded(instance),
        }),
        [
            "zones",
            zone,
            "clusters",
            cluster,
            "instances",
            instance,
            "logging",
        ] => Some(InstanceRef::Cluster {
            zone: Some(decoded(zone)),
            cluster: decoded(cluster),
            instance: decoded(instance),
        }),
        _ => None,
    }
}

/// Checks the signature of a request a peer forwarded; the access it grants.
fn verify_forwarded(signer: &Signer, req: &Request, given: &header::HeaderValue) -> Option<Access> {
    let what = Signed {
        method: req.method().as_str(),
        path: req.uri().path(),
        query: req.uri().query().unwrap_or(""),
    };
    match signer.verify(given.as_bytes(), &what) {
        Ok(access) => Some(access),
        Err(e) => {
            debug!(error = %e, path = %req.uri().path(), "Forwarded request refused.");
            None
        }
    }
}

/// The content type a peer's answer is passed on with: JSON as JSON, anything else
/// as plain text, so no answer of a peer is served as a page on the API's origin.
fn passed_on_type(given: Option<&header::HeaderValue>) -> header::HeaderValue {
    let json = given
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    header::HeaderValue::from_static(if json {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    })
}

/// Passes per-instance requests on to the owning replica: the request to serve here
/// (`Ok`), or the answer (`Err`: the owner's, or a refusal).
pub async fn to_owner(state: &AppState, req: Request) -> Result<Request, Response> {
    let Some(etcd) = state.store.etcd() else {
        return Ok(req);
    };
    if let Some(given) = req.headers().get(&FORWARDED).cloned() {
        // Forwarded by a peer: serve it here, judged by the access it was signed
        // with and nothing else, and never forward it again.
        let Some(access) = etcd
            .signer()
            .and_then(|signer| verify_forwarded(signer, &req, &given))
        else {
            return Err(ApiError::forbidden().into_response());
        };
        let mut req = req;
        req.headers_mut().remove(header::AUTHORIZATION);
        req.extensions_mut().insert(Granted(access));
        return Ok(req);
    }
    // The sidecar layer says where an instance is served; this only carries it out.
    let Some(named) = instance_of(&req) else {
        return Ok(req);
    };
    let Owner::Replica(owner) = sidecars(state).serving(&named) else {
        return Ok(req);
    };
    // Boxed: the call to the owner is a large future, and every request served here
    // would carry its room otherwise.
    Err(Box::pin(forward(state, req, &owner, named.instance())).await)
}

/// Forwards `req`, about `instance`, to the replica `owner` and passes its answer on.
async fn forward(state: &AppState, req: Request, owner: &str, instance: &str) -> Response {
    // The caller's credentials first, as the owner would check them: a request the
    // owner would refuse is refused here, neither forwarded nor telling whether the
    // instance exists.
    // Reads (GET, HEAD) need the read token, anything else the write token.
    let (parts, body) = req.into_parts();
    let access = state.tokens.access(&parts);
    let allowed = match parts.method {
        Method::GET | Method::HEAD if access < Access::Read => Err(ApiError::forbidden()),
        Method::GET | Method::HEAD => Ok(()),
        _ => state.tokens.check_write(&parts),
    };
    if let Err(e) = allowed {
        return e.into_response();
    }
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
    let headers: Vec<_> = [header::CONTENT_TYPE, header::ACCEPT]
        .into_iter()
        .filter_map(|name| {
            let v = parts.headers.get(&name)?.clone();
            Some((name, v))
        })
        .collect();
    let replicas = Replicas::new(state.store.clone(), state.peers.clone());
    let req = PeerRequest {
        method: parts.method.clone(),
        path_and_query: &path,
        access,
        headers: &headers,
        body,
    };
    match replicas.send(owner, req, FORWARD_TIMEOUT).await {
        Ok(r) => {
            let mut res = Response::new(Body::from(r.body));
            *res.status_mut() = r.status;
            let headers = res.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                passed_on_type(r.content_type.as_ref()),
            );
            headers.insert(
                header::X_CONTENT_TYPE_OPTIONS,
                header::HeaderValue::from_static("nosniff"),
            );
            res
        }
        Err(PeerCallError::Unknown { .. }) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "owner_unreachable",
            format!("Instance {instance} is served by a replica whose address is not known yet."),
        )
        .into_response(),
        Err(_) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "owner_unreachable",
            format!("The replica serving instance {instance} did not answer."),
        )
        .into_response(),
    }
}
