//! One zone's ADS stream: connecting (plaintext HTTP/2, or TLS with the zone's CA
//! as the only root and its client certificate), choosing the protocol, subscribing
//! (CDS and LDS wildcard, EDS for the EDS clusters' service names, RDS for the
//! route configurations the listeners name), ACKing each response that builds a
//! view and NACKing, with the reason, one that cannot be read or is over a bound,
//! and reconnecting with backoff. It runs until its task is aborted.
//!
//! Each connection tries Delta xDS first (`DeltaAggregatedResources`, the session
//! in `super::delta`). A server that answers it with UNIMPLEMENTED is spoken to in
//! state of the world (`StreamAggregatedResources`, the session here) on the same
//! connection at once, and on every later connection of this stream: the choice
//! holds until the zone's record is replaced or the aggregator restarts. Both
//! sessions keep the same [`Held`] view, bounds, states and failures.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
use envoy_types::pb::envoy::config::core::v3::{Locality, Node};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use meshcat_common::model::ZoneRecord;
use meshcat_common::validate::{MAX_ZONE_FILE, read_regular};
use tokio::sync::mpsc;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tracing::{debug, info, warn};

use super::decode::{self, Kind, SotwResponse};
use super::failure::Failure;
use super::view::{Bounds, Held};
use super::zone::Zone;

/// Longest a connection attempt (TCP, TLS, HTTP/2) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The first wait before reconnecting; it doubles after each failed attempt.
pub const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// The longest wait before reconnecting.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// HTTP/2 pings on an idle stream, so a server gone without a word is noticed.
const KEEPALIVE: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// The xDS protocol a stream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Incremental: `DeltaAggregatedResources`.
    Delta,
    /// State of the world: `StreamAggregatedResources`.
    Sotw,
}

impl Protocol {
    /// The word for it in `GET /zones/{z}/control`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Delta => "delta",
            Protocol::Sotw => "sotw",
        }
    }
}

/// What one zone's stream connects to and is held to.
#[derive(Debug, Clone)]
pub struct Target {
    pub record: ZoneRecord,
    pub node: Node,
    pub max_message: usize,
    pub bounds: Bounds,
}

/// The node meshcat presents to the zone's control server.
pub fn node(record: &ZoneRecord, id: String) -> Node {
    let cluster = if record.request_cluster.is_empty() {
        "meshcat"
    } else {
        &record.request_cluster
    };
    Node {
        id,
        cluster: cluster.to_owned(),
        locality: Some(Locality {
            zone: record.zone_name.clone(),
            ..Locality::default()
        }),
        user_agent_name: "meshcat".to_owned(),
        user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
            env!("CARGO_PKG_VERSION").to_owned(),
        )),
        ..Node::default()
    }
}

/// The zone's stream, reconnecting for ever: Delta xDS until the server answers it
/// UNIMPLEMENTED, state of the world from then on.
pub async fn run(zone: Arc<Zone>, target: Target) {
    let mut held = Held::new(zone.view());
    let mut protocol = Protocol::Delta;
    let mut backoff = BACKOFF_MIN;
    loop {
        let (connected, failure) = session(&zone, &target, &mut held, &mut protocol).await;
        if connected {
            backoff = BACKOFF_MIN;
            info!(zone = %zone.name, error = %failure.error, "control server stream ended");
        } else {
            debug!(zone = %zone.name, error = %failure.error, "cannot reach the control server");
        }
        zone.down(failure);
        tokio::time::sleep(jitter(backoff)).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// `base` give or take a fifth, at most [`BACKOFF_MAX`].
fn jitter(base: Duration) -> Duration {
    base.mul_f64(rand::random_range(0.8..1.2)).min(BACKOFF_MAX)
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// What the stream asked for of one type, and what it last ACKed.
#[derive(Debug, Default)]
struct Subscription {
    version: String,
    nonce: String,
    names: Vec<String>,
    /// A request of this type went out on this stream.
    sent: bool,
}

/// One connection, from connecting until its stream ends: whether it had a
/// response, and why it ended. Delta xDS first while `protocol` says so; on
/// UNIMPLEMENTED, state of the world on the same connection, remembered in
/// `protocol`.
async fn session(
    zone: &Zone,
    target: &Target,
    held: &mut Held,
    protocol: &mut Protocol,
) -> (bool, Failure) {
    let channel = match connect(&target.record).await {
        Ok(c) => c,
        Err(f) => return (false, f),
    };
    if *protocol == Protocol::Delta {
        match super::delta::session(zone, target, held, channel.clone()).await {
            super::delta::Outcome::Ended(connected, failure) => return (connected, failure),
            super::delta::Outcome::Unimplemented(status) => {
                info!(
                    zone = %zone.name,
                    server = %target.record.server_address,
                    status = %status.message(),
                    "the control server does not offer Delta xDS; speaking state of the world"
                );
                *protocol = Protocol::Sotw;
                held.clear_versions();
            }
        }
    }
    sotw(zone, target, held, channel).await
}

/// One state-of-the-world stream on `channel`, until it ends: whether it had a
/// response, and why it ended.
async fn sotw(zone: &Zone, target: &Target, held: &mut Held, channel: Channel) -> (bool, Failure) {
    let (tx, rx) = mpsc::unbounded_channel::<DiscoveryRequest>();
    let requests =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
    let mut subs: [Subscription; 4] = Default::default();
    subs[Kind::Endpoints.index()].names = held.eds_names();
    subs[Kind::Routes.index()].names = held.rds_names();
    let out = Sender {
        tx: &tx,
        node: &target.node,
    };
    for kind in Kind::ALL {
        let sub = &mut subs[kind.index()];
        if wildcard(kind) || !sub.names.is_empty() {
            out.request(kind, sub, None);
        }
    }
    let mut inbound = match call::<_, SotwResponse>(channel, target, SOTW, requests).await {
        Ok(r) => r,
        Err(status) => return (false, Failure::of_status(&status)),
    };
    let mut connected = false;
    loop {
        let response = match inbound.message().await {
            Ok(Some(r)) => r,
            Ok(None) => {
                return (
                    connected,
                    Failure::unreachable("the control server closed the stream"),
                );
            }
            Err(status) => return (connected, Failure::of_status(&status)),
        };
        // A resource that is no `Any` ends the stream, as a message that does not
        // decode does.
        if let Some(e) = response
            .resources
            .iter()
            .find_map(|r| decode::check_any(r).err())
        {
            return (
                connected,
                Failure::of_status(&tonic::Status::internal(e.to_string())),
            );
        }
        if !connected {
            connected = true;
            zone.up(now_ms(), Protocol::Sotw.as_str());
            info!(zone = %zone.name, server = %target.record.server_address, protocol = "sotw", "control server stream up");
        }
        handle(zone, target, held, &mut subs, &out, response);
    }
}

/// CDS and LDS ask for every resource; EDS and RDS for names.
pub(super) fn wildcard(kind: Kind) -> bool {
    matches!(kind, Kind::Clusters | Kind::Listeners)
}

/// Reads one response into the view: ACKs it, or NACKs it with the reason; asks
/// EDS and RDS again when the names they need changed.
fn handle(
    zone: &Zone,
    target: &Target,
    held: &mut Held,
    subs: &mut [Subscription; 4],
    out: &Sender<'_>,
    response: SotwResponse,
) {
    let Some(kind) = Kind::of_url(&response.type_url) else {
        let reason = format!("a response of unknown type {:?}", response.type_url);
        warn!(zone = %zone.name, "NACK: {reason}");
        out.send(DiscoveryRequest {
            version_info: String::new(),
            node: Some(target.node.clone()),
            resource_names: Vec::new(),
            type_url: response.type_url,
            response_nonce: response.nonce,
            error_detail: Some(nack_detail(&reason)),
            ..DiscoveryRequest::default()
        });
        zone.refused(None, reason);
        return;
    };
    let now = now_ms();
    let bounds = target.bounds;
    let resources = &response.resources;
    let result = match kind {
        Kind::Clusters => decode::clusters(resources, bounds.max_clusters, bounds.max_endpoints)
            .and_then(|d| held.apply_clusters(d, bounds, now)),
        Kind::Endpoints => decode::load_assignments(resources, bounds.max_endpoints)
            .and_then(|a| held.apply_endpoints(a, bounds, now)),
        Kind::Listeners => {
            decode::listeners(resources, bounds.max_clusters).map(|l| held.apply_listeners(l))
        }
        Kind::Routes => {
            decode::route_configs(resources, bounds.max_clusters).map(|r| held.apply_routes(r))
        }
    };
    let sub = &mut subs[kind.index()];
    sub.nonce = response.nonce;
    match result {
        Ok(view) => {
            sub.version = response.version_info;
            out.request(kind, sub, None);
            zone.accepted(kind, &sub.version, view, now);
            let follow = match kind {
                Kind::Clusters => Some((Kind::Endpoints, held.eds_names())),
                Kind::Listeners => Some((Kind::Routes, held.rds_names())),
                _ => None,
            };
            if let Some((next, names)) = follow {
                let sub = &mut subs[next.index()];
                if names != sub.names && (sub.sent || !names.is_empty()) {
                    sub.names = names;
                    out.request(next, sub, None);
                }
            }
        }
        Err(reason) => {
            let reason = format!(
                "NACKed {} version {:?}: {reason}",
                kind.label(),
                response.version_info
            );
            warn!(zone = %zone.name, "{reason}");
            out.request(kind, sub, Some(&reason));
            zone.refused(Some(kind), reason);
        }
    }
}

/// The `error_detail` of a NACK.
pub(super) fn nack_detail(reason: &str) -> RpcStatus {
    RpcStatus {
        code: INVALID_ARGUMENT,
        message: reason.to_owned(),
        details: Vec::new(),
    }
}

/// Puts requests on the stream.
struct Sender<'a> {
    tx: &'a mpsc::UnboundedSender<DiscoveryRequest>,
    node: &'a Node,
}

impl Sender<'_> {
    /// A request of `kind` with the subscription's names, last ACKed version and
    /// last nonce; a NACK when `error` is given.
    fn request(&self, kind: Kind, sub: &mut Subscription, error: Option<&str>) {
        sub.sent = true;
        self.send(DiscoveryRequest {
            version_info: sub.version.clone(),
            node: Some(self.node.clone()),
            resource_names: sub.names.clone(),
            type_url: kind.type_url().to_owned(),
            response_nonce: sub.nonce.clone(),
            error_detail: error.map(nack_detail),
            ..DiscoveryRequest::default()
        });
    }

    fn send(&self, request: DiscoveryRequest) {
        // A closed stream shows as the inbound side's end.
        let _ = self.tx.send(request);
    }
}

/// The ADS methods the stream calls.
pub(super) const SOTW: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
pub(super) const DELTA: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// Calls the ADS `method` on `channel` with `requests`: its responses read as
/// `Resp` (their resources left encoded), at most `target.max_message` bytes each.
pub(super) async fn call<Req, Resp>(
    channel: Channel,
    target: &Target,
    method: &'static str,
    requests: impl tonic::IntoStreamingRequest<Message = Req>,
) -> Result<tonic::Streaming<Resp>, tonic::Status>
where
    Req: prost::Message + Send + 'static,
    Resp: prost::Message + Default + Send + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(target.max_message)
        .max_encoding_message_size(usize::MAX);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {e}")))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(method);
    grpc.streaming(
        requests.into_streaming_request(),
        path,
        tonic_prost::ProstCodec::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

/// An HTTP/2 channel to the zone's control server.
async fn connect(record: &ZoneRecord) -> Result<Channel, Failure> {
    let scheme = if record.use_tls { "https" } else { "http" };
    let uri = format!("{scheme}://{}", record.server_address);
    let mut endpoint = Endpoint::from_shared(uri)
        .map_err(|e| Failure::unreachable(format!("serverAddress: {e}")))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    if record.use_tls {
        endpoint = endpoint
            .tls_config(tls_config(record)?)
            .map_err(|e| Failure::tls(Failure::of_error(&e).error))?;
    }
    match tokio::time::timeout(CONNECT_TIMEOUT + Duration::from_secs(1), endpoint.connect()).await {
        Err(_) => Err(Failure::unreachable("timed out")),
        Ok(Err(e)) => Err(Failure::of_error(&e)),
        Ok(Ok(channel)) => Ok(channel),
    }
}

/// The zone's TLS: its CA the only root, its certificate and key the client's
/// identity, the server's name the host of its address.
fn tls_config(record: &ZoneRecord) -> Result<ClientTlsConfig, Failure> {
    let read = |field: &str, path: &str| -> Result<Vec<u8>, Failure> {
        if path.is_empty() {
            return Err(Failure::tls(format!("{field} is empty")));
        }
        read_regular(Path::new(path), MAX_ZONE_FILE).ok_or_else(|| {
            Failure::tls(format!(
                "{field} {path:?} is not a readable regular file of at most 1 MiB"
            ))
        })
    };
    let ca = read("caPath", &record.ca_path)?;
    let mut config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name(host_of(&record.server_address))
        .timeout(CONNECT_TIMEOUT);
    if !record.cert_path.is_empty() || !record.key_path.is_empty() {
        let cert = read("certPath", &record.cert_path)?;
        let key = read("keyPath", &record.key_path)?;
        config = config.identity(Identity::from_pem(cert, key));
    }
    Ok(config)
}

/// The host of `host:port` (an IPv6 address without its brackets).
fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_and_the_host_follow_the_record() {
        let mut record = ZoneRecord::new("z1", "[::1]:18000");
        let n = node(&record, "meshcat~z1~r1".into());
        assert_eq!(n.cluster, "meshcat");
        assert_eq!(n.locality.unwrap().zone, "z1");
        assert_eq!(n.user_agent_name, "meshcat");
        record.request_cluster = "edge".into();
        assert_eq!(node(&record, String::new()).cluster, "edge");
        assert_eq!(host_of("[::1]:18000"), "::1");
        assert_eq!(host_of("cp.example:18000"), "cp.example");
    }

    #[test]
    fn backoff_jitter_stays_near_its_base() {
        for _ in 0..100 {
            let d = jitter(Duration::from_secs(10));
            assert!(d >= Duration::from_secs(8) && d <= Duration::from_secs(12));
            assert!(jitter(BACKOFF_MAX) <= BACKOFF_MAX);
        }
    }
}
