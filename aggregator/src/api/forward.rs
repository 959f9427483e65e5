//! Forwarding to the owning replica (etcd store): an instance's metrics and its
//! sidecar's logging live with the replica its agent reports to. Any replica
//! answers these routes by passing the request on to the owner's advertised API
//! address. The caller's token never travels: this replica authenticates the caller
//! and signs, with the secret the replicas share through etcd, the request and the
//! access it granted ([`crate::peer_signature`]). The owner serves a request with a
//! valid signature itself, judged by that access alone, and never forwards it
//! again; a bad, stale or replayed signature is refused. A peer's answer is passed
//! on only as JSON or plain text. Replicas that serve their API over HTTPS forward
//! over HTTPS, verifying the owner's certificate against `--peer-ca-file`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::rt::TokioIo;
use meshcat_common::tls::TlsError;
use tracing::{debug, warn};

use super::AppState;
use super::auth::Granted;
use super::error::ApiError;
use crate::peer_signature::{Access, Signed, Signer};

/// Carries the signature of a forwarded request.
pub const FORWARDED: HeaderName = HeaderName::from_static("x-meshcat-forwarded");
/// Deadline of a forwarded request (the owner may run a command on a sidecar).
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest body forwarded: the per-instance routes take small JSON bodies.
const MAX_FORWARDED_BODY: usize = 64 << 10;

/// How this replica reaches its peers' APIs: one HTTP/1.1 exchange per forwarded
/// request (they are rare: per-instance reads and commands), over TLS when the
/// replicas serve HTTPS.
#[derive(Clone)]
pub struct Peers {
    tls: Option<tokio_rustls::TlsConnector>,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers")
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// A peer's answer.
#[derive(Debug)]
pub struct PeerResponse {
    pub status: StatusCode,
    pub content_type: Option<header::HeaderValue>,
    pub body: Bytes,
}

/// Why a peer gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("HTTP: {0}")]
    Http(String),
    #[error("the answer is over {MAX_PEER_ANSWER} bytes")]
    TooLarge,
}

/// Largest answer read from a peer (metrics of one instance, one sidecar's evidence).
pub const MAX_PEER_ANSWER: usize = 16 << 20;

/// Aborts the connection task when the exchange ends, whichever way.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Peers {
    /// Plain HTTP: the replicas serve their API without TLS.
    pub fn plain() -> Peers {
        Peers { tls: None }
    }

    /// HTTPS, trusting only the CA certificates in `ca_file` (`--peer-ca-file`), or
    /// without it the system's CA store; the peer's certificate must name the host of
    /// its advertised address.
    pub fn tls(ca_file: Option<&Path>) -> Result<Peers, TlsError> {
        meshcat_common::tls::install_crypto_provider();
        let mut roots = rustls::RootCertStore::empty();
        match ca_file {
            Some(ca_file) => {
                for cert in meshcat_common::tls::load_certs(ca_file)? {
                    roots
                        .add(cert)
                        .map_err(|e| TlsError::Config(format!("{}: {e}", ca_file.display())))?;
                }
            }
            None => {
                let system = rustls_native_certs::load_native_certs();
                // Unparsable entries of a system store are skipped, as TLS clients do.
                let (added, _) = roots.add_parsable_certificates(system.certs);
                if added == 0 {
                    let why = system
                        .errors
                        .first()
                        .map_or_else(|| "it holds no certificate".to_owned(), |e| e.to_string());
                    return Err(TlsError::Config(format!(
                        "the system's CA store cannot be used for peer replicas ({why}): give --peer-ca-file"
                    )));
                }
            }
        }
        let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Peers {
            tls: Some(tokio_rustls::TlsConnector::from(Arc::new(tls))),
        })
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// Sends one request to `addr` (`host:port`) and reads the whole answer, all
    /// within `timeout`.
    pub async fn send(
        &self,
        method: Method,
        addr: &str,
        path_and_query: &str,
        headers: &[(HeaderName, header::HeaderValue)],
        body: Bytes,
        timeout: Duration,
    ) -> Result<PeerResponse, PeerError> {
        let mut req = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(header::HOST, addr);
        for (name, value) in headers {
            req = req.header(name, value);
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| PeerError::Http(e.to_string()))?;
        tokio::time::timeout(timeout, self.exchange(addr, req))
            .await
            .map_err(|_| PeerError::Timeout(timeout))?
    }

    async fn exchange(
        &self,
        addr: &str,
        req: Request<Full<Bytes>>,
    ) -> Result<PeerResponse, PeerError> {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(PeerError::Connect)?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => round_trip(TokioIo::new(tcp), req).await,
            Some(connector) => {
                let name = server_name(addr)?;
                let tls = connector
                    .connect(name, tcp)
                    .await
                    .map_err(|e| PeerError::Tls(e.to_string()))?;
                round_trip(TokioIo::new(tls), req).await
            }
        }
    }
}

/// The name a peer's certificate must carry: the host of `host:port`.
fn server_name(addr: &str) -> Result<rustls::pki_types::ServerName<'static>, PeerError> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| PeerError::Tls(format!("{host}: {e}")))
}

async fn round_trip<I>(io: I, req: Request<Full<Bytes>>) -> Result<PeerResponse, PeerError>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let http = |e: hyper::Error| PeerError::Http(e.to_string());
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(http)?;
    let _conn = AbortOnDrop(tokio::spawn(async move {
        // Its error shows as the request's.
        let _ = conn.await;
    }));
    let res = sender.send_request(req).await.map_err(http)?;
    let (parts, body) = res.into_parts();
    let body = Limited::new(body, MAX_PEER_ANSWER)
        .collect()
        .await
        .map_err(|e| match e.downcast::<LengthLimitError>() {
            Ok(_) => PeerError::TooLarge,
            Err(e) => PeerError::Http(e.to_string()),
        })?
        .to_bytes();
    Ok(PeerResponse {
        status: parts.status,
        content_type: parts.headers.get(header::CONTENT_TYPE).cloned(),
        body,
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

/// Signs a request to a peer: the header that carries the signature.
fn sign(
    signer: &Signer,
    method: &Method,
    path_and_query: &str,
    access: Access,
) -> Result<(HeaderName, header::HeaderValue), ApiError> {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let what = Signed {
        method: method.as_str(),
        path,
        query,
    };
    let value = header::HeaderValue::from_str(&signer.sign(&what, access))
        .map_err(|_| ApiError::internal())?;
    Ok((FORWARDED, value))
}

/// Sends one request to replica `owner` as a forwarded request, signed with the
/// access the caller was granted here; its status and body text.
pub async fn to_replica(
    state: &AppState,
    owner: &str,
    method: Method,
    path_and_query: &str,
    access: Access,
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
    let (Some(addr), Some(signer)) = (etcd.peer(owner), etcd.signer()) else {
        return Err(unreachable());
    };
    let headers = vec![sign(signer, &method, path_and_query, access)?];
    let r = state
        .peers
        .send(
            method,
            &addr,
            path_and_query,
            &headers,
            Bytes::new(),
            timeout,
        )
        .await
        .map_err(|e| {
            warn!(%owner, %addr, error = %e, "Forwarding to the owning replica failed.");
            unreachable()
        })?;
    Ok((r.status, String::from_utf8_lossy(&r.body).into_owned()))
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

/// Passes per-instance requests on to the owning replica.
pub async fn to_owner(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(etcd) = state.store.etcd() else {
        return next.run(req).await;
    };
    if let Some(given) = req.headers().get(&FORWARDED).cloned() {
        // Forwarded by a peer: serve it here, judged by the access it was signed
        // with and nothing else, and never forward it again.
        let Some(access) = etcd
            .signer()
            .and_then(|signer| verify_forwarded(signer, &req, &given))
        else {
            return ApiError::forbidden().into_response();
        };
        let mut req = req;
        req.headers_mut().remove(header::AUTHORIZATION);
        req.extensions_mut().insert(Granted(access));
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
    let req = Request::from_parts(parts, body);
    let (Some(addr), Some(signer)) = (etcd.peer(&owner), etcd.signer()) else {
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
    let mut headers = Vec::with_capacity(3);
    match sign(signer, &parts.method, &path, access) {
        Ok(h) => headers.push(h),
        Err(e) => return e.into_response(),
    }
    for name in [header::CONTENT_TYPE, header::ACCEPT] {
        if let Some(v) = parts.headers.get(&name) {
            headers.push((name, v.clone()));
        }
    }
    match state
        .peers
        .send(
            parts.method.clone(),
            &addr,
            &path,
            &headers,
            body,
            FORWARD_TIMEOUT,
        )
        .await
    {
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
