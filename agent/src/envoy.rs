//! The client of one Envoy sidecar's admin API: every call has a timeout and a
//! limit on the size of the answer, and returns the models of [`model`]. Its
//! connections are opened in the agent's network namespace or, for a sidecar whose
//! admin stays on its pod's loopback, inside the sidecar's ([`netns`]).

pub mod certs;
pub mod clusters;
#[cfg(test)]
mod differential;
pub mod model;
pub mod netns;
pub mod xds;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use meshcat_common::level;
use meshcat_common::wire::ReportedCluster;

pub use netns::{Netns, NetnsError};

use clusters::ClustersReader;
use model::{ServerInfo, StatsResponse, StatsSnapshot};

/// Largest admin answer read, except `/config_dump` and the scrape's `/clusters`.
pub const MAX_ANSWER: usize = 8 << 20;
/// Largest `/clusters?format=json` the scrape reads. It is read as it arrives, never
/// held ([`clusters`]): the bound is on the time spent, not on memory. Envoy 1.40
/// writes 85 MB for 20,000 clusters of 5 idle hosts (about 850 bytes a host; a host
/// with traffic or a locality writes more): this leaves half again as much.
pub const MAX_CLUSTERS_ANSWER: usize = 128 << 20;
/// Largest `/config_dump` read.
pub const MAX_CONFIG_DUMP: usize = 32 << 20;

/// The stats the agent needs: inbound HTTP connection managers' request, error,
/// byte, TLS and latency stats, the server's memory and worker count, gRPC request
/// totals, each upstream cluster's requests, 5xx, connect failures, requests failed
/// waiting for a connection, request time and TLS handshakes (the graph), and the counters that move when the sidecar's
/// listeners, clusters, routes (RDS and scoped RDS), filters from extension config
/// discovery (ECDS) or secrets from SDS change (when to read `/config_dump` again,
/// [`crate::topology::config_version`]). Envoy applies it as an RE2 regex.
pub const STATS_FILTER: &str = r"^(http\.(.+)\.(downstream_rq_(total|5xx|time)|downstream_cx_(rx|tx)_bytes_total|downstream_cx_(ssl_)?total|(scoped_)?rds\..+\.config_reload)|extension_config_discovery\..+\.config_reload|server\.(concurrency|memory_allocated)|cluster\.(.+)\.(grpc\.(.+\.)?total|upstream_rq_(total|5xx|time|pending_failure_eject)|upstream_cx_connect_fail|ssl\.handshake|client_ssl_socket_factory\.ssl_context_update_by_sds)|listener\.(.+)\.server_ssl_socket_factory\.ssl_context_update_by_sds|listener_manager\.listener_(added|modified|removed|in_place_updated)|cluster_manager\.cluster_(added|modified|removed))$";

/// Why an admin call failed.
#[derive(Debug, thiserror::Error)]
pub enum EnvoyError {
    #[error("admin address {0:?} is not host:port")]
    Address(String),
    #[error("admin API at {addr} did not answer: {source}")]
    Transport {
        addr: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("admin API at {addr} did not answer within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
    /// The sidecar's network namespace could not be entered (contract section 18).
    /// Shared: the HTTP client hands its connector's error back only by reference.
    #[error("admin API at {addr}: {source}")]
    Netns {
        addr: String,
        #[source]
        source: Arc<NetnsError>,
    },
    #[error("admin API at {addr} answered {status} to {path}: {body}")]
    Status {
        addr: String,
        path: String,
        status: u16,
        body: String,
    },
    #[error("admin answer to {path} is over the limit of {limit} bytes")]
    TooLarge { path: String, limit: usize },
    #[error("admin answer cannot be parsed: {0}")]
    Parse(String),
    #[error("log level {0:?} is not one of error, warn, info, debug")]
    Level(String),
    #[error(transparent)]
    Certs(certs::CertsError),
}

/// Where a sidecar's admin API listens: `host:port`, inside the network namespace
/// `netns` when given (the pod's loopback, contract section 18), else in the agent's
/// own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminEndpoint {
    /// `host:port`, resolved (when a name) where the connection is opened.
    pub addr: String,
    /// The namespace every connection is opened in.
    pub netns: Option<Netns>,
}

/// Opens the admin connections of one sidecar: a plain TCP connection in the agent's
/// namespace, or one opened inside the sidecar's. The client's pool keeps them open
/// between scrapes, so a namespace is entered once per connection, not per request.
#[derive(Debug, Clone)]
struct AdminConnector {
    endpoint: Arc<AdminEndpoint>,
    /// Bounds the connection's opening (each address tried, inside a namespace).
    timeout: Duration,
}

impl tower::Service<http::Uri> for AdminConnector {
    type Response = TokioIo<tokio::net::TcpStream>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    /// Connects to the endpoint this connector was made for, whatever the URI says:
    /// one connector serves one sidecar.
    fn call(&mut self, _: http::Uri) -> Self::Future {
        let (endpoint, timeout) = (self.endpoint.clone(), self.timeout);
        Box::pin(async move {
            let stream = match &endpoint.netns {
                Some(ns) => netns::connect(ns, &endpoint.addr, timeout)
                    .await
                    .map_err(Arc::new)?,
                None => {
                    let s = tokio::time::timeout(
                        timeout,
                        tokio::net::TcpStream::connect(endpoint.addr.as_str()),
                    )
                    .await
                    .map_err(|_| {
                        std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
                    })??;
                    s.set_nodelay(true)?;
                    s
                }
            };
            Ok(TokioIo::new(stream))
        })
    }
}

/// Called with [`NetnsError::reason`] each time a connection fails because the
/// sidecar's namespace could not be entered: the agent counts them per target.
#[derive(Clone)]
pub struct NetnsErrorHook(Arc<dyn Fn(&'static str) + Send + Sync>);

impl NetnsErrorHook {
    pub fn new(f: impl Fn(&'static str) + Send + Sync + 'static) -> Self {
        NetnsErrorHook(Arc::new(f))
    }
}

impl std::fmt::Debug for NetnsErrorHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NetnsErrorHook")
    }
}

/// Where an answer's body goes as it arrives.
trait BodySink: Send {
    /// Envoy said it sends `len` bytes (within the limit).
    fn expect(&mut self, len: usize);
    fn take(&mut self, chunk: &[u8]) -> Result<(), EnvoyError>;
}

impl BodySink for Vec<u8> {
    fn expect(&mut self, len: usize) {
        // Sized once: a large answer is then never copied while it grows.
        self.reserve_exact(len);
    }

    fn take(&mut self, chunk: &[u8]) -> Result<(), EnvoyError> {
        self.extend_from_slice(chunk);
        Ok(())
    }
}

impl BodySink for ClustersReader {
    fn expect(&mut self, _: usize) {}

    fn take(&mut self, chunk: &[u8]) -> Result<(), EnvoyError> {
        self.feed(chunk)
    }
}

impl BodySink for certs::CertsReader {
    fn expect(&mut self, _: usize) {}

    fn take(&mut self, chunk: &[u8]) -> Result<(), EnvoyError> {
        self.feed(chunk).map_err(EnvoyError::Certs)
    }
}

/// Admin connections kept open per sidecar: a scrape makes four calls at once.
const POOL_IDLE_PER_SIDECAR: usize = 4;

/// A client of one sidecar's admin API. Cheap to clone.
#[derive(Debug, Clone)]
pub struct EnvoyAdmin {
    /// Where the admin API listens.
    endpoint: Arc<AdminEndpoint>,
    /// Bounds every call, from connecting to the last byte of the answer.
    timeout: Duration,
    /// HTTP/1.1 client over [`AdminConnector`], with its pool of kept-alive
    /// connections. It never follows a redirect, nor goes through a proxy the
    /// environment names (HTTP_PROXY and the like): an admin API never redirects, and
    /// following one, or a proxy, would let whoever answers on the admin address (which
    /// can come from a discovered pod) send the agent to any other host, or see every
    /// sidecar the agent watches.
    client: Client<AdminConnector, Empty<Bytes>>,
    /// Told of every namespace failure, when set.
    on_netns_error: Option<NetnsErrorHook>,
}

impl EnvoyAdmin {
    /// A client for the admin API at `addr` (`host:port`) in the agent's own network
    /// namespace, with a per-call timeout.
    pub fn new(addr: &str, timeout: Duration) -> Result<Self, EnvoyError> {
        Self::at(
            AdminEndpoint {
                addr: addr.to_owned(),
                netns: None,
            },
            timeout,
        )
    }

    /// A client for the admin API at `endpoint`, with a per-call timeout.
    pub fn at(endpoint: AdminEndpoint, timeout: Duration) -> Result<Self, EnvoyError> {
        let addr = &endpoint.addr;
        if addr
            .rsplit_once(':')
            .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        {
            return Err(EnvoyError::Address(addr.to_owned()));
        }
        let endpoint = Arc::new(endpoint);
        let connector = AdminConnector {
            endpoint: endpoint.clone(),
            timeout,
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(POOL_IDLE_PER_SIDECAR)
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Ok(Self {
            endpoint,
            timeout,
            client,
            on_netns_error: None,
        })
    }

    /// This client, telling `hook` of every namespace failure.
    pub fn observing_netns_errors(mut self, hook: NetnsErrorHook) -> Self {
        self.on_netns_error = Some(hook);
        self
    }

    /// The admin address this client talks to.
    pub fn addr(&self) -> &str {
        &self.endpoint.addr
    }

    /// The answer's bytes, read up to `limit`; a non-2xx status is an error carrying
    /// the first line of the body. The whole call, from connecting to the answer's last
    /// byte, is bounded by the client's timeout.
    async fn call_bytes(
        &self,
        post: bool,
        path: &str,
        limit: usize,
    ) -> Result<Vec<u8>, EnvoyError> {
        let mut body = Vec::new();
        self.call_into(post, path, limit, &mut body).await?;
        Ok(body)
    }

    /// The answer handed to `sink` as it arrives, up to `limit` bytes; a non-2xx status
    /// is an error carrying the first line of the body (which `sink` never sees). The
    /// whole call is bounded by the client's timeout.
    async fn call_into(
        &self,
        post: bool,
        path: &str,
        limit: usize,
        sink: &mut dyn BodySink,
    ) -> Result<(), EnvoyError> {
        tokio::time::timeout(self.timeout, self.call_unbounded(post, path, limit, sink))
            .await
            .map_err(|_| EnvoyError::Timeout {
                addr: self.endpoint.addr.clone(),
                timeout: self.timeout,
            })?
    }

    async fn call_unbounded(
        &self,
        post: bool,
        path: &str,
        limit: usize,
        sink: &mut dyn BodySink,
    ) -> Result<(), EnvoyError> {
        let addr = &self.endpoint.addr;
        let transport = |e: Box<dyn std::error::Error + Send + Sync>| EnvoyError::Transport {
            addr: addr.clone(),
            source: e,
        };
        let too_large = || EnvoyError::TooLarge {
            path: path.to_owned(),
            limit,
        };
        let req = http::Request::builder()
            .method(if post {
                http::Method::POST
            } else {
                http::Method::GET
            })
            .uri(format!("http://{addr}{path}"))
            .body(Empty::<Bytes>::new())
            .map_err(|e| transport(e.into()))?;
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| match netns_source(&e) {
                Some(ns) => {
                    if let (Some(hook), Some(reason)) = (&self.on_netns_error, ns.reason()) {
                        (hook.0)(reason);
                    }
                    EnvoyError::Netns {
                        addr: addr.clone(),
                        source: ns,
                    }
                }
                None => transport(e.into()),
            })?;
        let status = resp.status();
        let expected = resp
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .unwrap_or(0);
        if expected > limit as u64 {
            return Err(too_large());
        }
        // An error's body is kept for its message, not handed to the sink.
        let mut body = Vec::new();
        let sink: &mut dyn BodySink = if status.is_success() { sink } else { &mut body };
        sink.expect(expected as usize);
        let mut read = 0usize;
        let mut incoming = resp.into_body();
        while let Some(frame) = incoming.frame().await {
            let frame = frame.map_err(|e| transport(e.into()))?;
            if let Ok(chunk) = frame.into_data() {
                read += chunk.len();
                if read > limit {
                    return Err(too_large());
                }
                sink.take(&chunk)?;
            }
        }
        if !status.is_success() {
            return Err(EnvoyError::Status {
                addr: addr.clone(),
                path: path.to_owned(),
                status: status.as_u16(),
                body: String::from_utf8_lossy(&body)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .chars()
                    .take(200)
                    .collect(),
            });
        }
        Ok(())
    }

    /// The answer as text (invalid UTF-8 replaced, which Envoy does not send).
    async fn call(&self, post: bool, path: &str, limit: usize) -> Result<String, EnvoyError> {
        let body = self.call_bytes(post, path, limit).await?;
        Ok(String::from_utf8(body)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, EnvoyError> {
        let body = self.call_bytes(false, path, MAX_ANSWER).await?;
        serde_json::from_slice(&body).map_err(|e| EnvoyError::Parse(format!("{path}: {e}")))
    }

    /// `GET /server_info`.
    pub async fn server_info(&self) -> Result<ServerInfo, EnvoyError> {
        self.get_json("/server_info").await
    }

    /// `GET /listeners?format=json`: each listener's name and the address it is
    /// bound to (a configured port 0 shows as the port the kernel gave).
    pub async fn listeners(&self) -> Result<model::ListenersResponse, EnvoyError> {
        self.get_json("/listeners?format=json").await
    }

    /// `GET /clusters?format=json` as the wire reports it: each upstream cluster with
    /// its hosts' addresses and health, sorted by name, read as the answer arrives (up
    /// to [`MAX_CLUSTERS_ANSWER`]) without holding it.
    pub async fn clusters(&self) -> Result<Vec<ReportedCluster>, EnvoyError> {
        let mut reader = ClustersReader::new();
        self.call_into(
            false,
            "/clusters?format=json",
            MAX_CLUSTERS_ANSWER,
            &mut reader,
        )
        .await?;
        reader.finish()
    }

    /// `GET /certs`: the sidecar's distinct certificates, read as the answer arrives
    /// (up to [`certs::MAX_CERTS_ANSWER`]) without holding it.
    pub async fn certs(&self) -> Result<certs::CertsRead, EnvoyError> {
        let mut reader = certs::CertsReader::new();
        self.call_into(false, "/certs", certs::MAX_CERTS_ANSWER, &mut reader)
            .await?;
        reader.finish().map_err(EnvoyError::Certs)
    }

    /// The SDS secret of each certificate the sidecar took over SDS, by serial, from
    /// `GET /config_dump?resource=dynamic_active_secrets`.
    pub async fn sds_secrets(
        &self,
    ) -> Result<BTreeMap<String, meshcat_common::identity::SdsSecret>, EnvoyError> {
        let body = self
            .call_bytes(
                false,
                "/config_dump?resource=dynamic_active_secrets",
                MAX_ANSWER,
            )
            .await?;
        certs::sds_secrets(&body).map_err(EnvoyError::Certs)
    }

    /// `GET /stats?format=json&usedonly` with [`STATS_FILTER`] and detailed
    /// (cumulative, fine-grained) histogram buckets.
    pub async fn stats(&self) -> Result<StatsSnapshot, EnvoyError> {
        let r: StatsResponse = self.get_json(&stats_path()).await?;
        Ok(r.into())
    }

    /// `GET /stats?format=json&usedonly&filter=<regex>`: any stats by regex, for
    /// diagnosis (for example `ssl`).
    pub async fn stats_matching(&self, regex: &str) -> Result<StatsSnapshot, EnvoyError> {
        let path = format!(
            "/stats?format=json&usedonly&histogram_buckets=detailed&filter={}",
            encode_query(regex)
        );
        let r: StatsResponse = self.get_json(&path).await?;
        Ok(r.into())
    }

    /// `GET /stats?format=json&filter=<regex>`: the stats matching `regex`, those
    /// never used included (a gauge never set, which `usedonly` leaves out).
    pub async fn stats_including_unused(&self, regex: &str) -> Result<StatsSnapshot, EnvoyError> {
        let path = format!("/stats?format=json&filter={}", encode_query(regex));
        let r: StatsResponse = self.get_json(&path).await?;
        Ok(r.into())
    }

    /// Every logger's level, read with `POST /logging` (Envoy refuses GET).
    pub async fn loggers(&self) -> Result<BTreeMap<String, String>, EnvoyError> {
        let text = self.call(true, "/logging", MAX_ANSWER).await?;
        model::parse_loggers(&text)
    }

    /// The sidecar's level in Envoy's names (`warning`, not `warn`).
    pub async fn log_level(&self) -> Result<String, EnvoyError> {
        let loggers = self.loggers().await?;
        model::dominant_level(&loggers)
            .ok_or_else(|| EnvoyError::Parse("the logging answer lists no logger".into()))
    }

    /// Sets every logger to `level`, given in the seed's names
    /// (`error|warn|info|debug`) or Envoy's (`warning`).
    pub async fn set_log_level(&self, level: &str) -> Result<(), EnvoyError> {
        let envoy = envoy_level(level).ok_or_else(|| EnvoyError::Level(level.to_owned()))?;
        self.call(true, &format!("/logging?level={envoy}"), MAX_ANSWER)
            .await
            .map(drop)
    }

    /// `POST /reopen_logs`: Envoy's flush thread writes the buffered access lines to
    /// their files (it buffers them up to `--file-flush-interval-msec`, 10 s by
    /// default). The answer comes before the write: see
    /// [`EnvoyAdmin::access_log_bytes_buffered`].
    pub async fn flush_access_logs(&self) -> Result<(), EnvoyError> {
        self.call(true, "/reopen_logs", MAX_ANSWER).await.map(drop)
    }

    /// Bytes of access lines Envoy holds and has not written yet, over all its access
    /// log files (`filesystem.write_total_buffered`, lowered only after the write).
    pub async fn access_log_bytes_buffered(&self) -> Result<u64, EnvoyError> {
        let s = self.stats_matching("write_total_buffered$").await?;
        Ok(s.values
            .iter()
            .filter(|(n, _)| n.ends_with("write_total_buffered"))
            .map(|(_, v)| *v)
            .sum())
    }

    /// `GET /clusters?format=json` as Envoy wrote it, for the diagnosis.
    pub async fn clusters_text(&self) -> Result<String, EnvoyError> {
        self.call(false, "/clusters?format=json", MAX_ANSWER).await
    }

    /// `GET /stats?format=json&filter=ssl|secrets` as Envoy wrote it, zero counters
    /// included: the diagnosis names the failure counters that rose and shows the rest.
    pub async fn ssl_stats_text(&self) -> Result<String, EnvoyError> {
        let path = format!("/stats?format=json&filter={}", encode_query("ssl|secrets"));
        self.call(false, &path, MAX_ANSWER).await
    }

    /// Sets every logger to `level` given in Envoy's own names (all seven), so a
    /// debug window can restore any level it found, `trace` or `critical` included.
    pub async fn set_envoy_level(&self, level: &str) -> Result<(), EnvoyError> {
        const ENVOY_LEVELS: [&str; 7] = [
            "trace", "debug", "info", "warning", "error", "critical", "off",
        ];
        if !ENVOY_LEVELS.contains(&level) {
            return Err(EnvoyError::Level(level.to_owned()));
        }
        self.call(true, &format!("/logging?level={level}"), MAX_ANSWER)
            .await
            .map(drop)
    }

    /// `GET /config_dump` as JSON text.
    pub async fn config_dump(&self) -> Result<String, EnvoyError> {
        self.call(false, "/config_dump", MAX_CONFIG_DUMP).await
    }

    /// `GET /config_dump` as the bytes Envoy sent (JSON), for reading in place.
    pub async fn config_dump_bytes(&self) -> Result<Vec<u8>, EnvoyError> {
        self.call_bytes(false, "/config_dump", MAX_CONFIG_DUMP)
            .await
    }
}

/// The namespace failure a client error carries, when the connection failed there.
fn netns_source(e: &hyper_util::client::legacy::Error) -> Option<Arc<NetnsError>> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(ns) = c.downcast_ref::<Arc<NetnsError>>() {
            return Some(ns.clone());
        }
        cause = c.source();
    }
    None
}

/// The path of the scrape's `/stats` call: [`STATS_FILTER`], used stats only,
/// detailed histogram buckets.
pub fn stats_path() -> String {
    format!(
        "/stats?format=json&usedonly&histogram_buckets=detailed&filter={}",
        encode_query(STATS_FILTER)
    )
}

/// Envoy's name for a level the API accepts: the seed's four, plus `warning`
/// (the aggregator's commands carry Envoy's name).
pub fn envoy_level(level: &str) -> Option<&'static str> {
    level::envoy_name(level).or((level == "warning").then_some("warning"))
}

/// The seed's name for an Envoy level (`warning` reads `warn`); others unchanged.
pub fn seed_level(envoy: &str) -> &str {
    level::seed_name(envoy)
}

/// Percent-encodes a query value (RFC 3986 unreserved characters pass).
fn encode_query(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_translate_both_ways() {
        assert_eq!(envoy_level("warn"), Some("warning"));
        assert_eq!(envoy_level("debug"), Some("debug"));
        assert_eq!(envoy_level("trace"), None);
        assert_eq!(envoy_level("WARN"), None);
        assert_eq!(seed_level("warning"), "warn");
        assert_eq!(seed_level("critical"), "critical");
    }

    #[test]
    fn bad_addresses_are_refused() {
        let t = Duration::from_secs(1);
        assert!(EnvoyAdmin::new("127.0.0.1:9901", t).is_ok());
        assert!(EnvoyAdmin::new("127.0.0.1", t).is_err());
        assert!(EnvoyAdmin::new(":9901", t).is_err());
        assert!(EnvoyAdmin::new("h:99999", t).is_err());
    }

    #[test]
    fn query_encoding() {
        assert_eq!(encode_query(r"^a\.b|c$"), "%5Ea%5C.b%7Cc%24");
    }
}
