//! Reading the resources of one xDS response into the few facts the view keeps: per
//! cluster where its endpoints come from (EDS and its service name, the inline
//! `load_assignment` of STATIC clusters, or that of STRICT_DNS / LOGICAL_DNS
//! clusters, host names rather than the addresses a sidecar resolves), per load
//! assignment its endpoints (address and health), per listener the route
//! configurations its HTTP connection managers name, per route configuration its
//! name. A response is read with its resources left encoded ([`DeltaResponse`],
//! [`SotwResponse`]: slices of the received message, not copies), and each
//! resource is decoded on its own and dropped as soon as it is read: a response of
//! a hundred thousand endpoints never exists decoded at once.

use std::collections::BTreeSet;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{Address, HealthStatus};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use bytes::Bytes;
use prost::Message;

/// The `Any` type of a resource wrapped in `envoy.service.discovery.v3.Resource`.
const RESOURCE_WRAPPER: &str = "envoy.service.discovery.v3.Resource";
/// The `Any` type of an HTTP connection manager's filter configuration.
const HCM: &str =
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";

/// The four resource types the stream subscribes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Clusters,
    Endpoints,
    Listeners,
    Routes,
}

impl Kind {
    pub const ALL: [Kind; 4] = [
        Kind::Clusters,
        Kind::Endpoints,
        Kind::Listeners,
        Kind::Routes,
    ];

    /// The type URL of the resource type.
    pub fn type_url(self) -> &'static str {
        match self {
            Kind::Clusters => "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            Kind::Endpoints => "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
            Kind::Listeners => "type.googleapis.com/envoy.config.listener.v3.Listener",
            Kind::Routes => "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
        }
    }

    /// The kind of a type URL, if it is one of the four.
    pub fn of_url(url: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.type_url() == url)
    }

    /// The word for the type in metrics and `versions`.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Clusters => "clusters",
            Kind::Endpoints => "endpoints",
            Kind::Listeners => "listeners",
            Kind::Routes => "routes",
        }
    }

    /// The type's position in [`Kind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The endpoints of one load assignment as it lists them, in its order: their
/// addresses one after the other in one string, each with where it ends and its
/// health. Two allocations however many endpoints: a view of a hundred thousand is
/// read without a string each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawEndpoints {
    /// `ip:port`, `[ip6]:port`, or `unix://path` (the form of Envoy's `/clusters`),
    /// one after the other.
    text: String,
    /// Per endpoint, where its address ends in `text`, and its health.
    ends: Vec<(u32, HealthStatus)>,
}

impl RawEndpoints {
    /// Room for `n` endpoints.
    pub fn with_capacity(n: usize) -> RawEndpoints {
        RawEndpoints {
            text: String::with_capacity(n * 16),
            ends: Vec::with_capacity(n),
        }
    }

    /// Adds the endpoint `address` with `health`.
    pub fn push(&mut self, address: &str, health: HealthStatus) {
        self.text.push_str(address);
        self.close(health);
    }

    /// Ends the address written at the end of `text` since the last one.
    fn close(&mut self, health: HealthStatus) {
        let end = u32::try_from(self.text.len()).expect("a response is under 4 GiB");
        self.ends.push((end, health));
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Each endpoint's address and health, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, HealthStatus)> + '_ {
        let mut start = 0;
        self.ends.iter().map(move |&(end, health)| {
            let address = &self.text[start..end as usize];
            start = end as usize;
            (address, health)
        })
    }
}

/// Where a declared cluster's endpoints come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// EDS, under this service name (the cluster's name when it sets none).
    Eds(String),
    /// Its own `load_assignment` (STATIC).
    Inline(RawEndpoints),
    /// Its own `load_assignment` of host names a sidecar resolves (STRICT_DNS,
    /// LOGICAL_DNS): not the host set the sidecar ends up with.
    Dns(RawEndpoints),
    /// No endpoints the control server lists (ORIGINAL_DST, a custom cluster type).
    None,
}

/// One cluster of a CDS response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterDecl {
    pub name: String,
    pub source: Source,
}

/// One listener of an LDS response: the route configurations it needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenerDecl {
    pub name: String,
    /// The names its HTTP connection managers ask of RDS.
    pub rds: Vec<String>,
    /// Its HTTP connection managers with an inline route configuration.
    pub inline_routes: usize,
}

/// `envoy.service.discovery.v3.DeltaDiscoveryResponse` with its resources left
/// encoded: the fields the stream reads.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeltaResponse {
    #[prost(string, tag = "1")]
    pub system_version_info: String,
    /// Each an encoded `envoy.service.discovery.v3.Resource` ([`DeltaResource`]).
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub resources: Vec<Bytes>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, repeated, tag = "6")]
    pub removed_resources: Vec<String>,
    #[prost(string, tag = "5")]
    pub nonce: String,
}

/// `envoy.service.discovery.v3.Resource` with its body left encoded: what the
/// stream reads of it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeltaResource {
    #[prost(string, tag = "1")]
    pub version: String,
    /// An encoded `google.protobuf.Any`; none when the resource only refreshes its
    /// TTL.
    #[prost(bytes = "bytes", optional, tag = "2")]
    pub resource: Option<Bytes>,
}

/// `envoy.service.discovery.v3.DiscoveryResponse` with its resources left
/// encoded: the fields the stream reads.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SotwResponse {
    #[prost(string, tag = "1")]
    pub version_info: String,
    /// Each an encoded `google.protobuf.Any`.
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub resources: Vec<Bytes>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
}

/// `google.protobuf.Any` with its value a slice of the response.
#[derive(Clone, PartialEq, prost::Message)]
struct Packed {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "bytes", tag = "2")]
    value: Bytes,
}

/// `envoy.service.discovery.v3.Resource` wrapping a resource in an `Any`: its name
/// and body.
#[derive(Clone, PartialEq, prost::Message)]
struct Wrapped {
    #[prost(string, tag = "3")]
    name: String,
    #[prost(message, optional, tag = "2")]
    resource: Option<Packed>,
}

/// Whether `any` is an encoded `Any` (its payload is read later, for its type).
pub fn check_any(any: &Bytes) -> Result<(), prost::DecodeError> {
    Packed::decode(any.clone()).map(drop)
}

/// The payload of the encoded `Any` `any` if it is a resource of `kind` (bare, or
/// wrapped in a `Resource`), else why not.
fn payload(any: &Bytes, kind: Kind, at: usize) -> Result<Bytes, String> {
    let any = Packed::decode(any.clone())
        .map_err(|e| format!("{} resource #{at}: cannot decode it: {e}", kind.label()))?;
    packed(any, kind, at)
}

fn packed(any: Packed, kind: Kind, at: usize) -> Result<Bytes, String> {
    let name = type_name(&any.type_url);
    if name == RESOURCE_WRAPPER {
        let wrapped = Wrapped::decode(any.value)
            .map_err(|e| format!("{} resource #{at}: cannot decode it: {e}", kind.label()))?;
        let inner = wrapped.resource.ok_or_else(|| {
            format!(
                "{} resource #{at} ({}): an empty Resource",
                kind.label(),
                wrapped.name
            )
        })?;
        return packed(inner, kind, at);
    }
    if name != type_name(kind.type_url()) {
        return Err(format!(
            "{} resource #{at} has type {:?}, not {}",
            kind.label(),
            any.type_url,
            kind.type_url()
        ));
    }
    Ok(any.value)
}

/// The message name of a type URL: what follows its last `/`.
fn type_name(url: &str) -> &str {
    url.rsplit_once('/').map_or(url, |(_, n)| n)
}

/// The clusters of a CDS response. Refuses an undecodable cluster, one without a
/// name, a name twice, and more than `max_clusters` clusters or `max_endpoints`
/// inline endpoints.
pub fn clusters(
    resources: &[Bytes],
    max_clusters: usize,
    max_endpoints: usize,
) -> Result<Vec<ClusterDecl>, String> {
    if resources.len() > max_clusters {
        return Err(over_clusters(resources.len(), max_clusters));
    }
    let mut out = Vec::with_capacity(resources.len());
    let mut names = BTreeSet::new();
    let mut inline = 0usize;
    for (at, any) in resources.iter().enumerate() {
        let bytes = payload(any, Kind::Clusters, at)?;
        let cluster = Cluster::decode(bytes)
            .map_err(|e| format!("clusters resource #{at}: cannot decode it: {e}"))?;
        if cluster.name.is_empty() {
            return Err(format!("clusters resource #{at}: a cluster without a name"));
        }
        if !names.insert(cluster.name.clone()) {
            return Err(format!("duplicate cluster {}", cluster.name));
        }
        let kind = match &cluster.cluster_discovery_type {
            None => Some(DiscoveryType::Static),
            Some(ClusterDiscoveryType::Type(t)) => Some(
                DiscoveryType::try_from(*t)
                    .map_err(|_| format!("cluster {}: unknown discovery type {t}", cluster.name))?,
            ),
            Some(ClusterDiscoveryType::ClusterType(_)) => None,
        };
        let source = match kind {
            Some(DiscoveryType::Eds) => {
                let service = cluster
                    .eds_cluster_config
                    .as_ref()
                    .map(|c| c.service_name.as_str())
                    .filter(|s| !s.is_empty())
                    .unwrap_or(&cluster.name);
                Source::Eds(service.to_owned())
            }
            Some(
                t @ (DiscoveryType::Static | DiscoveryType::StrictDns | DiscoveryType::LogicalDns),
            ) => {
                let eps = match &cluster.load_assignment {
                    Some(cla) => endpoints_of(cla, max_endpoints.saturating_sub(inline))
                        .map_err(|e| format!("cluster {}: {e}", cluster.name))?,
                    None => RawEndpoints::default(),
                };
                inline += eps.len();
                if t == DiscoveryType::Static {
                    Source::Inline(eps)
                } else {
                    Source::Dns(eps)
                }
            }
            Some(DiscoveryType::OriginalDst) | None => Source::None,
        };
        out.push(ClusterDecl {
            name: cluster.name,
            source,
        });
    }
    Ok(out)
}

/// The load assignments of an EDS response: (cluster name, endpoints). Refuses an
/// undecodable one and more than `max_endpoints` endpoints in all.
pub fn load_assignments(
    resources: &[Bytes],
    max_endpoints: usize,
) -> Result<Vec<(String, RawEndpoints)>, String> {
    let mut out = Vec::with_capacity(resources.len());
    let mut total = 0usize;
    for (at, any) in resources.iter().enumerate() {
        let bytes = payload(any, Kind::Endpoints, at)?;
        let cla = ClusterLoadAssignment::decode(bytes)
            .map_err(|e| format!("endpoints resource #{at}: cannot decode it: {e}"))?;
        let eps = endpoints_of(&cla, max_endpoints.saturating_sub(total))
            .map_err(|e| format!("endpoints of {}: {e}", cla.cluster_name))?;
        total += eps.len();
        out.push((cla.cluster_name, eps));
    }
    Ok(out)
}

/// The listeners of an LDS response. Refuses an undecodable listener (or HTTP
/// connection manager), one without a name, a name twice, and more than
/// `max_listeners`.
pub fn listeners(resources: &[Bytes], max_listeners: usize) -> Result<Vec<ListenerDecl>, String> {
    if resources.len() > max_listeners {
        return Err(format!(
            "{} listeners, over the bound of {max_listeners}",
            resources.len()
        ));
    }
    let mut out = Vec::with_capacity(resources.len());
    let mut names = BTreeSet::new();
    for (at, any) in resources.iter().enumerate() {
        let bytes = payload(any, Kind::Listeners, at)?;
        let listener = Listener::decode(bytes)
            .map_err(|e| format!("listeners resource #{at}: cannot decode it: {e}"))?;
        if listener.name.is_empty() {
            return Err(format!(
                "listeners resource #{at}: a listener without a name"
            ));
        }
        if !names.insert(listener.name.clone()) {
            return Err(format!("duplicate listener {}", listener.name));
        }
        let mut decl = ListenerDecl {
            name: listener.name.clone(),
            ..ListenerDecl::default()
        };
        let chains = listener
            .filter_chains
            .iter()
            .chain(listener.default_filter_chain.as_ref());
        let typed = chains
            .flat_map(|c| c.filters.iter())
            .filter_map(|f| match &f.config_type {
                Some(ConfigType::TypedConfig(any)) => Some(any),
                _ => None,
            })
            .chain(
                listener
                    .api_listener
                    .as_ref()
                    .and_then(|a| a.api_listener.as_ref()),
            );
        for any in typed {
            if type_name(&any.type_url) != HCM {
                continue;
            }
            let hcm = HttpConnectionManager::decode(any.value.as_slice()).map_err(|e| {
                format!(
                    "listener {}: cannot decode its HttpConnectionManager: {e}",
                    listener.name
                )
            })?;
            match hcm.route_specifier {
                Some(RouteSpecifier::Rds(rds)) if !rds.route_config_name.is_empty() => {
                    decl.rds.push(rds.route_config_name);
                }
                Some(RouteSpecifier::RouteConfig(_)) => decl.inline_routes += 1,
                _ => {}
            }
        }
        out.push(decl);
    }
    Ok(out)
}

/// The names of the route configurations of an RDS response. Refuses an
/// undecodable one and more than `max_routes`.
pub fn route_configs(resources: &[Bytes], max_routes: usize) -> Result<Vec<String>, String> {
    if resources.len() > max_routes {
        return Err(format!(
            "{} route configurations, over the bound of {max_routes}",
            resources.len()
        ));
    }
    let mut out = Vec::with_capacity(resources.len());
    for (at, any) in resources.iter().enumerate() {
        let bytes = payload(any, Kind::Routes, at)?;
        let route = RouteConfiguration::decode(bytes)
            .map_err(|e| format!("routes resource #{at}: cannot decode it: {e}"))?;
        out.push(route.name);
    }
    Ok(out)
}

/// Why a view of `n` clusters is refused.
pub fn over_clusters(n: usize, max: usize) -> String {
    format!("{n} clusters, over the bound of {max} (--max-control-resources)")
}

/// Why a view of `n` endpoints is refused.
pub fn over_endpoints(n: usize, max: usize) -> String {
    format!("{n} endpoints, over the bound of {max} (--max-control-resources)")
}

/// The endpoints of a load assignment, at most `budget` of them. An endpoint whose
/// address is not a socket address with a port value or a pipe (a named port, an
/// internal address) is left out.
fn endpoints_of(cla: &ClusterLoadAssignment, budget: usize) -> Result<RawEndpoints, String> {
    let count: usize = cla.endpoints.iter().map(|l| l.lb_endpoints.len()).sum();
    if count > budget {
        return Err(format!(
            "{count} endpoints, over what --max-control-resources leaves ({budget})"
        ));
    }
    let mut out = RawEndpoints::with_capacity(count);
    for lb in cla.endpoints.iter().flat_map(|l| l.lb_endpoints.iter()) {
        let endpoint = match &lb.host_identifier {
            Some(HostIdentifier::Endpoint(e)) => Some(e),
            Some(HostIdentifier::EndpointName(name)) => cla.named_endpoints.get(name),
            None => None,
        };
        let Some(address) = endpoint.and_then(|e| e.address.as_ref()) else {
            continue;
        };
        if write_address(&mut out.text, address) {
            let health = HealthStatus::try_from(lb.health_status).unwrap_or(HealthStatus::Unknown);
            out.close(health);
        }
    }
    Ok(out)
}

/// Writes an address as Envoy's `/clusters` writes it to `out`: `ip:port`,
/// `[ip6]:port`, `unix://path`; false (nothing written) for another kind.
fn write_address(out: &mut String, address: &Address) -> bool {
    use std::fmt::Write;
    let written = match address.address.as_ref() {
        Some(AddressKind::SocketAddress(s)) => {
            let Some(PortSpecifier::PortValue(port)) = s.port_specifier else {
                return false;
            };
            if s.address.contains(':') {
                write!(out, "[{}]:{port}", s.address)
            } else {
                write!(out, "{}:{port}", s.address)
            }
        }
        Some(AddressKind::Pipe(p)) => write!(out, "unix://{}", p.path),
        Some(AddressKind::EnvoyInternalAddress(_)) | None => return false,
    };
    written.is_ok()
}

/// The text of an endpoint's health status (`HEALTHY`, `UNKNOWN`, ...).
pub fn health_text(health: HealthStatus) -> &'static str {
    health.as_str_name()
}

/// Whether an endpoint with this status takes traffic: HEALTHY or UNKNOWN.
pub fn is_healthy(health: HealthStatus) -> bool {
    matches!(health, HealthStatus::Healthy | HealthStatus::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::cluster::v3::cluster::EdsClusterConfig;
    use envoy_types::pb::envoy::config::core::v3::SocketAddress;
    use envoy_types::pb::envoy::config::endpoint::v3::{Endpoint, LbEndpoint, LocalityLbEndpoints};
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse, Resource,
    };
    use envoy_types::pb::google::protobuf::Any;

    /// `m` in an `Any` of `url`, encoded.
    fn any<M: Message>(url: &str, m: &M) -> Bytes {
        Any {
            type_url: url.to_owned(),
            value: m.encode_to_vec(),
        }
        .encode_to_vec()
        .into()
    }

    fn lb(ip: &str, port: u32, health: HealthStatus) -> LbEndpoint {
        LbEndpoint {
            host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                address: Some(Address {
                    address: Some(AddressKind::SocketAddress(SocketAddress {
                        address: ip.to_owned(),
                        port_specifier: Some(PortSpecifier::PortValue(port)),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            health_status: health as i32,
            ..Default::default()
        }
    }

    #[test]
    fn clusters_say_where_their_endpoints_come_from() {
        let eds = Cluster {
            name: "a".into(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
            eds_cluster_config: Some(EdsClusterConfig {
                service_name: "svc-a".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let stat = Cluster {
            name: "b".into(),
            load_assignment: Some(ClusterLoadAssignment {
                cluster_name: "b".into(),
                endpoints: vec![LocalityLbEndpoints {
                    lb_endpoints: vec![lb("::1", 80, HealthStatus::Unknown)],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let dns = Cluster {
            name: "c".into(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(
                DiscoveryType::StrictDns as i32,
            )),
            ..stat.clone()
        };
        let url = Kind::Clusters.type_url();
        let got = clusters(&[any(url, &eds), any(url, &stat), any(url, &dns)], 10, 10).unwrap();
        assert_eq!(got[0].source, Source::Eds("svc-a".into()));
        let mut inline = RawEndpoints::default();
        inline.push("[::1]:80", HealthStatus::Unknown);
        assert_eq!(got[1].source, Source::Inline(inline));
        assert!(matches!(&got[2].source, Source::Dns(eps) if eps.len() == 1));
        assert!(clusters(&[any(url, &eds), any(url, &eds)], 10, 10).is_err());
        assert!(clusters(&[any(url, &eds), any(url, &stat)], 1, 10).is_err());
        assert!(clusters(&[any(url, &stat)], 10, 0).is_err());
        let wrong = any(Kind::Listeners.type_url(), &eds);
        assert!(clusters(&[wrong], 10, 10).unwrap_err().contains("has type"));
        let junk = Any {
            type_url: url.to_owned(),
            value: vec![0xff, 0xff, 0xff],
        }
        .encode_to_vec()
        .into();
        assert!(
            clusters(&[junk], 10, 10)
                .unwrap_err()
                .contains("cannot decode")
        );
        // Wrapped in a Resource, the same.
        let wrapped = Resource {
            name: "a".into(),
            resource: Some(Any {
                type_url: url.to_owned(),
                value: eds.encode_to_vec(),
            }),
            ..Default::default()
        };
        let got = clusters(&[any(RESOURCE_WRAPPER, &wrapped)], 10, 10).unwrap();
        assert_eq!(got[0].source, Source::Eds("svc-a".into()));
        let empty = Resource {
            name: "a".into(),
            ..Default::default()
        };
        let err = clusters(&[any(RESOURCE_WRAPPER, &empty)], 10, 10).unwrap_err();
        assert!(err.contains("(a): an empty Resource"), "{err}");
    }

    /// The responses read with their resources encoded hold what the full
    /// messages hold, the resources as they were sent.
    #[test]
    fn responses_read_lean_hold_what_the_full_messages_hold() {
        let url = Kind::Endpoints.type_url();
        let cla = ClusterLoadAssignment {
            cluster_name: "svc".into(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![
                    lb("10.0.0.1", 80, HealthStatus::Healthy),
                    lb("10.0.0.2", 80, HealthStatus::Draining),
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let body = Any {
            type_url: url.to_owned(),
            value: cla.encode_to_vec(),
        };
        let full = DeltaDiscoveryResponse {
            system_version_info: "v7".into(),
            resources: vec![
                Resource {
                    name: "svc".into(),
                    version: "r1".into(),
                    resource: Some(body.clone()),
                    ..Default::default()
                },
                Resource {
                    name: "ttl-only".into(),
                    version: "r2".into(),
                    ..Default::default()
                },
            ],
            type_url: url.into(),
            removed_resources: vec!["gone".into()],
            nonce: "n1".into(),
            ..Default::default()
        };
        let lean = DeltaResponse::decode(Bytes::from(full.encode_to_vec())).unwrap();
        assert_eq!(
            (
                lean.system_version_info.as_str(),
                lean.type_url.as_str(),
                lean.nonce.as_str()
            ),
            ("v7", url, "n1")
        );
        assert_eq!(lean.removed_resources, ["gone"]);
        let resources: Vec<DeltaResource> = lean
            .resources
            .iter()
            .map(|r| DeltaResource::decode(r.clone()).unwrap())
            .collect();
        assert_eq!(resources[0].version, "r1");
        assert_eq!(
            resources[0].resource.as_deref(),
            Some(&body.encode_to_vec()[..])
        );
        assert_eq!(
            (resources[1].version.as_str(), &resources[1].resource),
            ("r2", &None)
        );
        let got = load_assignments(&[resources[0].resource.clone().unwrap()], 10).unwrap();
        assert_eq!(got[0].0, "svc");
        let read: Vec<(&str, HealthStatus)> = got[0].1.iter().collect();
        assert_eq!(
            read,
            [
                ("10.0.0.1:80", HealthStatus::Healthy),
                ("10.0.0.2:80", HealthStatus::Draining)
            ]
        );

        let full = DiscoveryResponse {
            version_info: "v8".into(),
            resources: vec![body.clone()],
            type_url: url.into(),
            nonce: "n2".into(),
            ..Default::default()
        };
        let lean = SotwResponse::decode(Bytes::from(full.encode_to_vec())).unwrap();
        assert_eq!(
            (
                lean.version_info.as_str(),
                lean.type_url.as_str(),
                lean.nonce.as_str()
            ),
            ("v8", url, "n2")
        );
        assert_eq!(lean.resources, [Bytes::from(body.encode_to_vec())]);
    }
}
