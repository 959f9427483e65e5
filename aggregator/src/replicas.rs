//! Replica topology and the typed client of peer replicas (etcd store). The replica
//! id, the peers' advertised addresses and the shared secret come from the store's
//! etcd connection; this module is the one place that builds a request to a peer,
//! signs it ([`crate::peer_signature`]) and reads the peer's answer into types:
//! an instance's log level, a debug window, a sidecar's diagnosis evidence and an
//! instance's metrics. The forwarding middleware (`api::forward`) and the sidecar
//! layer ([`crate::sidecars`]) both go through it. [`ReplicaConfig`] is how this
//! replica is reached and reaches its peers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderName, Method, Request, StatusCode, header};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::rt::TokioIo;
use meshcat_common::model::InstanceMetrics;
use meshcat_common::tls::TlsError;
use meshcat_common::wire::{DebugWindowOutput, EvidenceOutput, LineQuery};
use serde::Deserialize;
use tracing::warn;

use crate::peer_signature::{Access, Signed, Signer};
use crate::store::Store;
use crate::store::peers::PeerSummaryChecks;
use crate::store::traffic::{ClusterTraffic, Traffic};

/// Carries the signature of a forwarded request.
pub const FORWARDED: HeaderName = HeaderName::from_static("x-meshcat-forwarded");
/// The replicas' own route for diagnosis evidence (never in the public API): a peer
/// asks the owner of an instance for that sidecar's evidence.
pub const PEER_EVIDENCE: &str = "/peer/evidence";
/// The replicas' own route for the traffic their agents reported (never in the
/// public API): every replica draws the graph from its own and its peers' traffic.
pub const PEER_TRAFFIC: &str = "/peer/traffic";
/// How often a replica asks each peer for its traffic.
pub const TRAFFIC_PULL_PERIOD: Duration = Duration::from_secs(2);
/// The route a replica reads its peers' own sync states from (contract section 17):
/// answered once the peer's own sync index passes `index` (or after [`SYNC_WAIT`]).
pub const PEER_SYNC: &str = "/peer/sync";
/// How long a peer holds a `/peer/sync` read open waiting for a change.
pub const SYNC_WAIT: Duration = Duration::from_secs(10);

/// How replicas sharing an etcd store reach each other.
#[derive(Debug, Clone, Default)]
pub struct ReplicaConfig {
    /// `--advertise-addr`: this replica's API address as peers reach it (default:
    /// the API's address).
    pub advertise_addr: Option<String>,
    /// `--peer-ca-file`: CA of the other replicas' API certificates (HTTPS
    /// forwarding; default: the system's CA store).
    pub peer_ca_file: Option<PathBuf>,
}

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

/// Why a peer replica gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum PeerCallError {
    #[error("the replica {owner} serving this instance has no known address yet")]
    Unknown { owner: String },
    #[error("the replica {owner} serving this instance did not answer")]
    Unreachable { owner: String },
    /// The owner answered with an error of the API; passed on as it said it.
    #[error("{message}")]
    Answered {
        status: StatusCode,
        code: String,
        message: String,
    },
    #[error("the answer of replica {owner} is not readable: {why}")]
    Unreadable { owner: String, why: String },
}

/// The error body of the API (`{"error", "code"}`), as a peer sends it.
#[derive(Debug, Deserialize)]
struct ErrorBody {
    error: String,
    code: String,
}

/// One instance's part of a per-cluster answer, as a peer sends it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct InstancePart {
    status: u16,
    debug_window: Option<DebugWindowOutput>,
    error: Option<String>,
    code: Option<String>,
}

/// A per-cluster answer, as a peer sends it.
#[derive(Debug, Deserialize)]
struct ClusterPart {
    instances: Vec<InstancePart>,
}

/// What a path segment may hold unescaped: RFC 3986 unreserved characters.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn segment(v: &str) -> percent_encoding::PercentEncode<'_> {
    percent_encoding::utf8_percent_encode(v, SEGMENT)
}

/// The per-instance logging route of one instance. An instance name may hold `?`,
/// `#`, `&` or `%` (pod and host names are wide), so every part is escaped.
fn instance_logging_path(zone: &str, cluster: &str, instance: &str, level: Option<&str>) -> String {
    let path = format!(
        "/zones/{}/clusters/{}/instances/{}/logging",
        segment(zone),
        segment(cluster),
        segment(instance)
    );
    match level {
        None => path,
        Some(level) => {
            let query = form_urlencoded::Serializer::new(String::new())
                .append_pair("level", level)
                .finish();
            format!("{path}?{query}")
        }
    }
}

/// The debug-window route for one instance.
fn debug_window_path(zone: &str, cluster: &str, instance: &str, seconds: u32) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("seconds", &seconds.to_string())
        .append_pair("instance", instance)
        .finish();
    format!(
        "/zones/{}/clusters/{}/debug-window?{query}",
        segment(zone),
        segment(cluster)
    )
}

/// The metrics route of one instance.
fn metrics_path(zone: &str, cluster: &str, instance: &str) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("zoneName", zone)
        .finish();
    format!(
        "/metrics/{}/{}?{query}",
        segment(cluster),
        segment(instance)
    )
}

/// The peer evidence route of one instance.
fn evidence_path(
    zone: &str,
    cluster: &str,
    instance: &str,
    (path, lines): (Option<&str>, &LineQuery),
    debug_seconds: Option<u32>,
) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("zoneName", zone)
        .append_pair("clusterName", cluster)
        .append_pair("instance", instance);
    if let Some(p) = path {
        q.append_pair("path", p);
    }
    if let Some(n) = debug_seconds {
        q.append_pair("debugSeconds", &n.to_string());
    }
    if let Some(id) = &lines.request_id {
        q.append_pair("requestId", id);
    }
    if lines.log_only {
        q.append_pair("logOnly", "true");
    }
    format!("{PEER_EVIDENCE}?{}", q.finish())
}

/// One request to a peer, signed for the access the caller was granted.
#[derive(Debug)]
pub struct PeerRequest<'a> {
    pub method: Method,
    pub path_and_query: &'a str,
    pub access: Access,
    /// Headers beside the signature.
    pub headers: &'a [(HeaderName, header::HeaderValue)],
    pub body: Bytes,
}

/// Reaches the other replicas: their addresses and the secret come from the store's
/// etcd connection, the transport from [`Peers`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Replicas {
    store: Arc<Store>,
    peers: Peers,
}

impl Replicas {
    pub fn new(store: Arc<Store>, peers: Peers) -> Replicas {
        Replicas { store, peers }
    }

    /// The header that carries the signature of a request to a peer, for the
    /// access the caller was granted; `None` before the secret is known.
    pub fn signature(
        &self,
        method: &Method,
        path_and_query: &str,
        access: Access,
    ) -> Option<(HeaderName, header::HeaderValue)> {
        let signer: &Signer = self.store.etcd()?.signer()?;
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        let what = Signed {
            method: method.as_str(),
            path,
            query,
        };
        let value = header::HeaderValue::from_str(&signer.sign(&what, access)).ok()?;
        Some((FORWARDED, value))
    }

    /// The advertised API address of replica `owner`.
    pub fn address(&self, owner: &str) -> Option<String> {
        self.store.etcd()?.peer(owner)
    }

    /// Sends one signed request to replica `owner`; its raw answer.
    pub async fn send(
        &self,
        owner: &str,
        req: PeerRequest<'_>,
        timeout: Duration,
    ) -> Result<PeerResponse, PeerCallError> {
        let PeerRequest {
            method,
            path_and_query,
            access,
            headers,
            body,
        } = req;
        let unknown = || PeerCallError::Unknown {
            owner: owner.to_owned(),
        };
        let addr = self.address(owner).ok_or_else(unknown)?;
        let signature = self
            .signature(&method, path_and_query, access)
            .ok_or_else(unknown)?;
        let mut all = Vec::with_capacity(headers.len() + 1);
        all.push(signature);
        all.extend(headers.iter().cloned());
        self.peers
            .send(method, &addr, path_and_query, &all, body, timeout)
            .await
            .map_err(|e| {
                warn!(%owner, %addr, error = %e, "A request to a peer replica failed.");
                PeerCallError::Unreachable {
                    owner: owner.to_owned(),
                }
            })
    }

    /// A request without a body whose success answer is read by `read`.
    async fn call<T>(
        &self,
        owner: &str,
        method: Method,
        path_and_query: &str,
        access: Access,
        timeout: Duration,
        read: impl FnOnce(&Bytes) -> Result<T, String>,
    ) -> Result<T, PeerCallError> {
        let req = PeerRequest {
            method,
            path_and_query,
            access,
            headers: &[],
            body: Bytes::new(),
        };
        let r = self.send(owner, req, timeout).await?;
        if !r.status.is_success() {
            return Err(match serde_json::from_slice::<ErrorBody>(&r.body) {
                Ok(e) => PeerCallError::Answered {
                    status: r.status,
                    code: e.code,
                    message: e.error,
                },
                Err(e) => PeerCallError::Unreadable {
                    owner: owner.to_owned(),
                    why: format!("{} without an error body ({e})", r.status),
                },
            });
        }
        read(&r.body).map_err(|why| PeerCallError::Unreadable {
            owner: owner.to_owned(),
            why,
        })
    }

    /// The log level (the seed's name) of an instance `owner` serves.
    pub async fn log_level(
        &self,
        owner: &str,
        (zone, cluster, instance): (&str, &str, &str),
        timeout: Duration,
    ) -> Result<String, PeerCallError> {
        let path = instance_logging_path(zone, cluster, instance, None);
        self.call(owner, Method::GET, &path, Access::Read, timeout, text)
            .await
    }

    /// Sets the level (`seed_level`, the seed's name) of an instance `owner`
    /// serves; the level it has now.
    pub async fn set_log_level(
        &self,
        owner: &str,
        (zone, cluster, instance): (&str, &str, &str),
        seed_level: &str,
        timeout: Duration,
    ) -> Result<String, PeerCallError> {
        let path = instance_logging_path(zone, cluster, instance, Some(seed_level));
        self.call(owner, Method::PUT, &path, Access::Write, timeout, text)
            .await
    }

    /// Runs a debug window on an instance `owner` serves.
    pub async fn debug_window(
        &self,
        owner: &str,
        (zone, cluster, instance): (&str, &str, &str),
        seconds: u32,
        timeout: Duration,
    ) -> Result<DebugWindowOutput, PeerCallError> {
        let path = debug_window_path(zone, cluster, instance, seconds);
        let part = self
            .call(owner, Method::POST, &path, Access::Write, timeout, |b| {
                let mut c: ClusterPart = serde_json::from_slice(b).map_err(|e| e.to_string())?;
                c.instances
                    .pop()
                    .ok_or_else(|| "no instance in the answer".to_owned())
            })
            .await?;
        match part {
            InstancePart {
                status: 200,
                debug_window: Some(w),
                ..
            } => Ok(w),
            InstancePart {
                status,
                error,
                code,
                ..
            } => Err(PeerCallError::Answered {
                status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                code: code.unwrap_or_else(|| "owner_failed".to_owned()),
                message: error.unwrap_or_else(|| "The owning replica gave no reason.".to_owned()),
            }),
        }
    }

    /// A sidecar's diagnosis evidence, from the replica `owner` that serves it.
    pub async fn evidence(
        &self,
        owner: &str,
        (zone, cluster, instance): (&str, &str, &str),
        (path, lines): (Option<&str>, &LineQuery),
        debug_seconds: Option<u32>,
        timeout: Duration,
    ) -> Result<EvidenceOutput, PeerCallError> {
        // A debug window changes the sidecar: the caller was checked for that.
        let access = if debug_seconds.is_some() {
            Access::Write
        } else {
            Access::Read
        };
        let uri = evidence_path(zone, cluster, instance, (path, lines), debug_seconds);
        self.call(owner, Method::GET, &uri, access, timeout, json)
            .await
    }

    /// The traffic the agents of replica `owner` reported, per cluster, over the
    /// graph window.
    pub async fn traffic(
        &self,
        owner: &str,
        timeout: Duration,
    ) -> Result<Vec<ClusterTraffic>, PeerCallError> {
        self.call(
            owner,
            Method::GET,
            PEER_TRAFFIC,
            Access::Read,
            timeout,
            json,
        )
        .await
    }

    /// The sync states of the instances replica `owner`'s agents report, once its own
    /// sync index moves past `after` (at once without one).
    pub async fn sync(
        &self,
        owner: &str,
        after: Option<u64>,
    ) -> Result<crate::sync::OwnSync, PeerCallError> {
        let path = match after {
            Some(i) => format!("{PEER_SYNC}?index={i}"),
            None => PEER_SYNC.to_owned(),
        };
        self.call(
            owner,
            Method::GET,
            &path,
            Access::Read,
            SYNC_WAIT + Duration::from_secs(5),
            json,
        )
        .await
    }

    /// An instance's metrics, from the replica `owner` that serves it.
    pub async fn metrics(
        &self,
        owner: &str,
        (zone, cluster, instance): (&str, &str, &str),
        timeout: Duration,
    ) -> Result<InstanceMetrics, PeerCallError> {
        let path = metrics_path(zone, cluster, instance);
        self.call(owner, Method::GET, &path, Access::Read, timeout, json)
            .await
    }
}

fn text(b: &Bytes) -> Result<String, String> {
    Ok(String::from_utf8_lossy(b).trim().to_owned())
}

fn json<T: serde::de::DeserializeOwned>(b: &Bytes) -> Result<T, String> {
    serde_json::from_slice(b).map_err(|e| e.to_string())
}

/// Keeps the peers' traffic summaries fresh for the graph: asks every peer each
/// [`TRAFFIC_PULL_PERIOD`], all at once, and forgets the peers that left. A peer
/// that does not answer keeps its last summary until it is older than the graph
/// window (its edges then fade like any whose traffic stopped). A summary is checked
/// like an agent's report: the parts that fail are dropped, counted and logged in
/// `checks`, the rest applies ([`Traffic::set_remote`]).
pub async fn pull_traffic(
    replicas: Replicas,
    traffic: Arc<Traffic>,
    checks: PeerSummaryChecks,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(TRAFFIC_PULL_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut answered: std::collections::HashMap<String, std::time::Instant> =
        std::collections::HashMap::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let Some(etcd) = replicas.store.etcd() else {
            return;
        };
        let peers = etcd.peer_ids();
        let asked = futures::future::join_all(peers.iter().map(|p| {
            let replicas = &replicas;
            async move { (p, replicas.traffic(p, TRAFFIC_PULL_PERIOD).await) }
        }))
        .await;
        let now = std::time::Instant::now();
        for (peer, answer) in asked {
            match answer {
                Ok(clusters) => {
                    let dropped = traffic.set_remote(peer, &clusters, now);
                    checks.dropped("traffic", peer, &dropped);
                    answered.insert(peer.clone(), now);
                }
                Err(e) => warn!(%peer, error = %e, "A peer's traffic was not read."),
            }
        }
        let window = traffic.window();
        for peer in traffic.remote_peers() {
            let stale = answered
                .get(&peer)
                .is_none_or(|at| now.saturating_duration_since(*at) > window);
            if !peers.contains(&peer) || stale {
                traffic.forget_remote(&peer);
                answered.remove(&peer);
            }
        }
    }
}

/// Keeps every peer's own sync states beside this replica's: one long read per peer
/// that answers as soon as the peer's states change, so every replica's `GET /sync`
/// follows within moments. A peer's proxies that fail the checks are dropped and
/// counted; a peer that leaves is forgotten.
pub async fn pull_sync(
    replicas: Replicas,
    sync: Arc<crate::sync::Sync>,
    checks: PeerSummaryChecks,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut tasks: std::collections::HashMap<String, tokio::task::JoinHandle<()>> =
        std::collections::HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let Some(etcd) = replicas.store.etcd() else {
            break;
        };
        let peers = etcd.peer_ids();
        tasks.retain(|peer, task| {
            let keep = peers.contains(peer) && !task.is_finished();
            if !keep {
                task.abort();
                sync.forget_remote(peer);
            }
            keep
        });
        for peer in peers {
            if tasks.contains_key(&peer) {
                continue;
            }
            let (replicas, sync, checks) = (replicas.clone(), sync.clone(), checks.clone());
            let p = peer.clone();
            tasks.insert(
                peer,
                tokio::spawn(async move {
                    let mut after = None;
                    loop {
                        match replicas.sync(&p, after).await {
                            Ok(own) => {
                                let total = own.proxies.len();
                                let kept: Vec<crate::sync::Proxy> =
                                    own.proxies.into_iter().filter(|x| x.is_valid()).collect();
                                if kept.len() < total {
                                    let dropped: Vec<crate::store::peers::Dropped> = (kept.len()
                                        ..total)
                                        .map(|_| crate::store::peers::Dropped {
                                            reason: "invalid_item",
                                            what: "a sync state".to_owned(),
                                        })
                                        .collect();
                                    checks.dropped("sync", &p, &dropped);
                                }
                                sync.set_remote(&p, kept);
                                after = Some(own.index);
                            }
                            Err(e) => {
                                warn!(peer = %p, error = %e, "A peer's sync states were not read.");
                                after = None;
                                tokio::time::sleep(TRAFFIC_PULL_PERIOD).await;
                            }
                        }
                    }
                }),
            );
        }
    }
    for (_, task) in tasks {
        task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer path reads back, through the real routes, as the names it was built
    /// from, whatever an instance name holds.
    #[tokio::test]
    async fn peer_paths_carry_any_instance_name() {
        use axum::extract::{Path, RawQuery};
        use axum::routing::{get, post, put};
        use tower::ServiceExt;
        let echo = |Path(p): Path<Vec<String>>, RawQuery(q): RawQuery| async move {
            let mut parts = p;
            for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
                parts.push(format!("{k}={v}"));
            }
            parts.join("|")
        };
        let app = axum::Router::new()
            .route(
                "/zones/{zoneName}/clusters/{clusterName}/instances/{instanceId}/logging",
                put(echo),
            )
            .route(
                "/zones/{zoneName}/clusters/{clusterName}/debug-window",
                post(echo),
            )
            .route("/metrics/{clusterName}/{instanceId}", get(echo));
        for odd in [
            "pod-1",
            "h:9901",
            "p?level=off",
            "a&seconds=300",
            "x#y",
            "50%25",
            "~!$'()*+,;=@",
        ] {
            assert!(meshcat_common::validate::is_valid_instance(odd));
            for (method, uri, want) in [
                (
                    "PUT",
                    instance_logging_path("z", "c", odd, Some("warn")),
                    format!("z|c|{odd}|level=warn"),
                ),
                (
                    "POST",
                    debug_window_path("z", "c", odd, 30),
                    format!("z|c|seconds=30|instance={odd}"),
                ),
                (
                    "GET",
                    metrics_path("z", "c", odd),
                    format!("c|{odd}|zoneName=z"),
                ),
            ] {
                let req = axum::http::Request::builder()
                    .method(method)
                    .uri(&uri)
                    .body(axum::body::Body::empty())
                    .unwrap();
                let res = app.clone().oneshot(req).await.unwrap();
                assert_eq!(res.status(), StatusCode::OK, "{uri}");
                let body = axum::body::to_bytes(res.into_body(), 1 << 16)
                    .await
                    .unwrap();
                assert_eq!(String::from_utf8_lossy(&body), want, "{uri}");
            }
        }
    }
}
