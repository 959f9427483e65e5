//! Snapshots: a [`MeshSpec`] turned into the Envoy resources it declares (Cluster,
//! with its `UpstreamTlsContext` when it speaks TLS, ClusterLoadAssignment,
//! Listener, RouteConfiguration as protobuf `Any`) and the secrets served beside it
//! (SDS `Secret`), under one version, what a subscription gets from one, and each
//! resource's own version (for Delta xDS).

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, DataSource, HealthStatus,
    SocketAddress, TransportSocket, address, config_source, data_source, socket_address,
    transport_socket,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route, route_action,
    route_match,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager, http_filter,
};
use envoy_types::pb::envoy::config::core::v3::{
    Http1ProtocolOptions, HttpProtocolOptions as CommonHttpProtocolOptions,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::explicit_http_config::ProtocolConfig;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
    ExplicitHttpConfig, UpstreamProtocolOptions,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::common_tls_context::{
    CombinedCertificateValidationContext, ValidationContextType,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, SdsSecretConfig, Secret, SubjectAltNameMatcher,
    TlsCertificate, UpstreamTlsContext, secret, subject_alt_name_matcher,
};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::{RegexMatcher, StringMatcher};
use envoy_types::pb::google::protobuf::{Any, Duration};
use prost::Message;

use crate::spec::{
    CaSpec, ClusterSpec, Health, ListenerSpec, MeshSpec, SanMatcherSpec, SanType, SecretKind,
    SecretSpec, StringMatch, UpstreamTlsSpec,
};

/// The type URLs of the resources a snapshot holds.
pub mod type_url {
    /// CDS.
    pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    /// EDS.
    pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
    /// LDS.
    pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
    /// RDS.
    pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
    /// SDS: certificates and CAs, asked for by name by the nodes that speak TLS.
    pub const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
    /// The mesh's configuration types, which every ADS node subscribes to, in the
    /// order Envoy needs them.
    pub const ALL: [&str; 4] = [CLUSTER, ENDPOINT, LISTENER, ROUTE];
    /// Every type a snapshot holds: the configuration types and secrets.
    pub const SERVED: [&str; 5] = [CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET];

    /// Whether a subscription with no names asks for every resource of the type.
    pub fn is_wildcard_type(type_url: &str) -> bool {
        type_url == CLUSTER || type_url == LISTENER
    }
}

const HTTP_PROTOCOL_OPTIONS_KEY: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
const HTTP_PROTOCOL_OPTIONS_TYPE: &str =
    "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
const UPSTREAM_TLS_TYPE: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";
const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";

/// Resources of one type by name.
pub type Resources = BTreeMap<String, Any>;

/// The resources of one mesh under one version.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub version: String,
    /// By type URL (every type of [`type_url::SERVED`] is present).
    pub resources: BTreeMap<&'static str, Resources>,
    /// By cluster name, the node clusters its CDS and EDS resources are served to
    /// (a cluster absent here: every node).
    pub audiences: BTreeMap<String, Vec<String>>,
}

/// The names a subscription asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subscription {
    /// Every resource of the type (CDS and LDS with no names, or `*`).
    pub wildcard: bool,
    pub names: BTreeSet<String>,
}

impl Subscription {
    /// The subscription a request's `resource_names` make for `type_url`.
    pub fn from_request(type_url: &str, names: &[String]) -> Self {
        let wildcard = type_url::is_wildcard_type(type_url)
            && (names.is_empty() || names.iter().any(|n| n == "*"));
        Self {
            wildcard,
            names: names.iter().filter(|n| *n != "*").cloned().collect(),
        }
    }
}

impl Snapshot {
    /// The resources `spec` declares, under `version`, with no secrets.
    pub fn build(spec: &MeshSpec, version: String) -> Self {
        let mut resources: BTreeMap<&'static str, Resources> = type_url::SERVED
            .iter()
            .map(|t| (*t, Resources::new()))
            .collect();
        let mut audiences = BTreeMap::new();
        for c in &spec.clusters {
            if !c.node_clusters.is_empty() {
                audiences.insert(c.name.clone(), c.node_clusters.clone());
            }
            let clusters = resources.entry(type_url::CLUSTER).or_default();
            clusters.insert(c.name.clone(), any(type_url::CLUSTER, &cluster(c)));
            let endpoints = resources.entry(type_url::ENDPOINT).or_default();
            endpoints.insert(c.name.clone(), any(type_url::ENDPOINT, &load_assignment(c)));
        }
        for l in &spec.listeners {
            let listeners = resources.entry(type_url::LISTENER).or_default();
            listeners.insert(l.name.clone(), any(type_url::LISTENER, &listener(l)));
            let routes = resources.entry(type_url::ROUTE).or_default();
            routes.insert(
                l.route_config.clone(),
                any(type_url::ROUTE, &route_configuration(l)),
            );
        }
        Self {
            version,
            resources,
            audiences,
        }
    }

    /// An empty snapshot.
    pub fn empty(version: String) -> Self {
        Self::build(&MeshSpec::default(), version)
    }

    /// This snapshot serving `secrets` (and no others) over SDS.
    pub fn with_secrets(mut self, secrets: &[SecretSpec]) -> Self {
        let resources = secrets
            .iter()
            .map(|s| (s.name.clone(), any(type_url::SECRET, &secret(s))))
            .collect();
        self.resources.insert(type_url::SECRET, resources);
        self
    }

    /// What `sub` of a node of `node_cluster` gets of `type_url` (names absent from
    /// the snapshot, or not served to that node, are left out); `None` for a type a
    /// snapshot does not hold.
    pub fn select(
        &self,
        type_url: &str,
        sub: &Subscription,
        node_cluster: &str,
    ) -> Option<Resources> {
        let all = self.resources.get(type_url)?;
        let serves = |name: &String| self.serves(type_url, name, node_cluster);
        Some(if sub.wildcard {
            all.iter()
                .filter(|(n, _)| serves(n))
                .map(|(n, r)| (n.clone(), r.clone()))
                .collect()
        } else {
            sub.names
                .iter()
                .filter(|n| serves(n))
                .filter_map(|n| all.get(n).map(|r| (n.clone(), r.clone())))
                .collect()
        })
    }

    /// Whether a node of `node_cluster` is served resource `name` of `type_url`.
    pub fn serves(&self, type_url: &str, name: &str, node_cluster: &str) -> bool {
        if type_url != type_url::CLUSTER && type_url != type_url::ENDPOINT {
            return true;
        }
        self.audiences
            .get(name)
            .is_none_or(|a| a.iter().any(|c| c == node_cluster))
    }

    /// The types whose resources differ between `self` and `other`.
    pub fn changed_types(&self, other: &Snapshot) -> Vec<&'static str> {
        type_url::SERVED
            .iter()
            .copied()
            .filter(|t| self.resources.get(t) != other.resources.get(t))
            .collect()
    }
}

/// A resource's own version for Delta xDS: FNV-1a (64 bits) over its encoded bytes,
/// as 16 hex digits. Equal content, equal version, whatever the snapshot.
pub fn resource_version(resource: &Any) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in &resource.value {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn any<M: Message>(type_url: &str, m: &M) -> Any {
    Any {
        type_url: type_url.to_owned(),
        value: m.encode_to_vec(),
    }
}

fn ads() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
            AggregatedConfigSource {},
        )),
        ..Default::default()
    }
}

fn socket(address: &str, port: u16) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: address.to_owned(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
            ..Default::default()
        })),
    }
}

fn duration(ms: u64) -> Duration {
    Duration {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// HTTP/1.1 upstream with connections closed after `idle_ms` idle.
fn idle_timeout(idle_ms: u64) -> Any {
    any(
        HTTP_PROTOCOL_OPTIONS_TYPE,
        &HttpProtocolOptions {
            common_http_protocol_options: Some(CommonHttpProtocolOptions {
                idle_timeout: Some(duration(idle_ms)),
                ..Default::default()
            }),
            upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                        Http1ProtocolOptions::default(),
                    )),
                },
            )),
            ..Default::default()
        },
    )
}

fn cluster(c: &ClusterSpec) -> Cluster {
    Cluster {
        name: c.name.clone(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::EdsClusterConfig {
            eds_config: Some(ads()),
            service_name: String::new(),
        }),
        connect_timeout: Some(duration(c.connect_timeout_ms)),
        typed_extension_protocol_options: c
            .idle_timeout_ms
            .map(|ms| (HTTP_PROTOCOL_OPTIONS_KEY.to_owned(), idle_timeout(ms)))
            .into_iter()
            .collect(),
        transport_socket: c.tls.as_ref().map(|tls| TransportSocket {
            name: "envoy.transport_sockets.tls".to_owned(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(any(
                UPSTREAM_TLS_TYPE,
                &upstream_tls(tls),
            ))),
        }),
        ..Default::default()
    }
}

/// An SDS secret config: `name` over ADS.
fn sds(name: &str) -> SdsSecretConfig {
    SdsSecretConfig {
        name: name.to_owned(),
        sds_config: Some(ads()),
    }
}

fn upstream_tls(tls: &UpstreamTlsSpec) -> UpstreamTlsContext {
    let matchers: Vec<SubjectAltNameMatcher> = tls.match_sans.iter().map(san_matcher).collect();
    let validation = |trusted_ca: Option<DataSource>| CertificateValidationContext {
        trusted_ca,
        match_typed_subject_alt_names: matchers.clone(),
        ..Default::default()
    };
    let validation_context_type = match &tls.ca {
        None if matchers.is_empty() => None,
        None => Some(ValidationContextType::ValidationContext(validation(None))),
        Some(CaSpec::Sds(name)) => Some(ValidationContextType::CombinedValidationContext(
            CombinedCertificateValidationContext {
                default_validation_context: Some(validation(None)),
                validation_context_sds_secret_config: Some(sds(name)),
                ..Default::default()
            },
        )),
        Some(CaSpec::File(path)) => Some(ValidationContextType::ValidationContext(validation(
            Some(data_source(data_source::Specifier::Filename(path.clone()))),
        ))),
        Some(CaSpec::Pem(pem)) => Some(ValidationContextType::ValidationContext(validation(Some(
            data_source(data_source::Specifier::InlineString(pem.clone())),
        )))),
    };
    UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_sds_secret_configs: tls
                .certificate_sds
                .iter()
                .map(|n| sds(n))
                .collect(),
            validation_context_type,
            ..Default::default()
        }),
        sni: tls.sni.clone().unwrap_or_default(),
        ..Default::default()
    }
}

fn san_matcher(m: &SanMatcherSpec) -> SubjectAltNameMatcher {
    let san_type = match m.san_type {
        SanType::Uri => subject_alt_name_matcher::SanType::Uri,
        SanType::Dns => subject_alt_name_matcher::SanType::Dns,
        SanType::IpAddress => subject_alt_name_matcher::SanType::IpAddress,
        SanType::Email => subject_alt_name_matcher::SanType::Email,
    };
    let pattern = match &m.matcher {
        StringMatch::Exact(v) => MatchPattern::Exact(v.clone()),
        StringMatch::Prefix(v) => MatchPattern::Prefix(v.clone()),
        StringMatch::Suffix(v) => MatchPattern::Suffix(v.clone()),
        StringMatch::Contains(v) => MatchPattern::Contains(v.clone()),
        StringMatch::SafeRegex(v) => MatchPattern::SafeRegex(RegexMatcher {
            regex: v.clone(),
            ..Default::default()
        }),
    };
    SubjectAltNameMatcher {
        san_type: san_type as i32,
        matcher: Some(StringMatcher {
            match_pattern: Some(pattern),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn data_source(specifier: data_source::Specifier) -> DataSource {
    DataSource {
        specifier: Some(specifier),
        ..Default::default()
    }
}

fn secret(s: &SecretSpec) -> Secret {
    let inline = |text: &str| {
        Some(data_source(data_source::Specifier::InlineString(
            text.to_owned(),
        )))
    };
    let r#type = match &s.kind {
        SecretKind::Certificate { chain_pem, key_pem } => {
            secret::Type::TlsCertificate(TlsCertificate {
                certificate_chain: inline(chain_pem),
                private_key: inline(key_pem),
                ..Default::default()
            })
        }
        SecretKind::TrustedCa { ca_pem } => {
            secret::Type::ValidationContext(CertificateValidationContext {
                trusted_ca: inline(ca_pem),
                ..Default::default()
            })
        }
    };
    Secret {
        name: s.name.clone(),
        r#type: Some(r#type),
    }
}

fn health(h: Health) -> HealthStatus {
    match h {
        Health::Healthy => HealthStatus::Healthy,
        Health::Unhealthy => HealthStatus::Unhealthy,
        Health::Unknown => HealthStatus::Unknown,
        Health::Draining => HealthStatus::Draining,
    }
}

fn load_assignment(c: &ClusterSpec) -> ClusterLoadAssignment {
    let lb_endpoints = c
        .endpoints
        .iter()
        .map(|e| LbEndpoint {
            health_status: health(e.health) as i32,
            host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                address: Some(socket(&e.address, e.port)),
                ..Default::default()
            })),
            ..Default::default()
        })
        .collect();
    ClusterLoadAssignment {
        cluster_name: c.name.clone(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints,
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn listener(l: &ListenerSpec) -> Listener {
    let router = HttpFilter {
        name: "envoy.filters.http.router".to_owned(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(
            ROUTER_TYPE,
            &Router::default(),
        ))),
        ..Default::default()
    };
    let hcm = HttpConnectionManager {
        stat_prefix: l.name.clone(),
        codec_type: http_connection_manager::CodecType::Auto as i32,
        route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
            config_source: Some(ads()),
            route_config_name: l.route_config.clone(),
        })),
        http_filters: vec![router],
        ..Default::default()
    };
    Listener {
        name: l.name.clone(),
        address: Some(socket(&l.address, l.port)),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.http_connection_manager".to_owned(),
                config_type: Some(filter::ConfigType::TypedConfig(any(HCM_TYPE, &hcm))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn route_configuration(l: &ListenerSpec) -> RouteConfiguration {
    let routes = l
        .routes
        .iter()
        .map(|r| Route {
            r#match: Some(RouteMatch {
                path_specifier: Some(route_match::PathSpecifier::Prefix(r.prefix.clone())),
                ..Default::default()
            }),
            action: Some(route::Action::Route(RouteAction {
                cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(r.cluster.clone())),
                ..Default::default()
            })),
            ..Default::default()
        })
        .collect();
    RouteConfiguration {
        name: l.route_config.clone(),
        virtual_hosts: vec![VirtualHost {
            name: "all".to_owned(),
            domains: vec!["*".to_owned()],
            routes,
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{EndpointSpec, RouteSpec};

    fn mesh(port: u16, timeout_ms: u64, prefix: &str) -> MeshSpec {
        let mut c = ClusterSpec::new("orders", vec![EndpointSpec::new("127.0.0.1", port)]);
        c.connect_timeout_ms = timeout_ms;
        MeshSpec {
            clusters: vec![c, ClusterSpec::new("users", vec![])],
            listeners: vec![ListenerSpec {
                name: "edge".to_owned(),
                address: "127.0.0.1".to_owned(),
                port: 0,
                route_config: "edge-routes".to_owned(),
                routes: vec![RouteSpec::new(prefix, "orders")],
            }],
        }
    }

    #[test]
    fn only_the_types_whose_content_changed_differ() {
        let a = Snapshot::build(&mesh(8080, 1000, "/"), "1".into());
        assert!(
            a.changed_types(&Snapshot::build(&mesh(8080, 1000, "/"), "2".into()))
                .is_empty()
        );
        let endpoint = Snapshot::build(&mesh(8081, 1000, "/"), "2".into());
        assert_eq!(a.changed_types(&endpoint), vec![type_url::ENDPOINT]);
        let timeout = Snapshot::build(&mesh(8080, 0, "/"), "2".into());
        assert_eq!(a.changed_types(&timeout), vec![type_url::CLUSTER]);
        let route = Snapshot::build(&mesh(8080, 1000, "/api"), "2".into());
        assert_eq!(a.changed_types(&route), vec![type_url::ROUTE]);
        let empty = Snapshot::empty("2".into());
        assert_eq!(a.changed_types(&empty), type_url::ALL.to_vec());
    }

    #[test]
    fn subscriptions_select_by_name_or_wildcard() {
        let s = Snapshot::build(&mesh(8080, 1000, "/"), "1".into());
        let cds = Subscription::from_request(type_url::CLUSTER, &[]);
        assert!(cds.wildcard);
        assert_eq!(s.select(type_url::CLUSTER, &cds, "edge").unwrap().len(), 2);
        let eds = Subscription::from_request(type_url::ENDPOINT, &["users".into(), "gone".into()]);
        assert!(!eds.wildcard);
        let picked = s.select(type_url::ENDPOINT, &eds, "edge").unwrap();
        assert_eq!(picked.keys().collect::<Vec<_>>(), vec!["users"]);
        let none = Subscription::from_request(type_url::ROUTE, &[]);
        assert!(s.select(type_url::ROUTE, &none, "edge").unwrap().is_empty());
        assert!(
            s.select("type.googleapis.com/other", &none, "edge")
                .is_none()
        );
    }

    #[test]
    fn a_cluster_for_some_node_clusters_is_served_to_them_alone() {
        let mut spec = mesh(8080, 1000, "/");
        spec.clusters[0] = spec.clusters[0].clone().for_node_clusters(&["edge"]);
        let s = Snapshot::build(&spec, "1".into());
        let cds = Subscription::from_request(type_url::CLUSTER, &[]);
        let names = |node: &str| -> Vec<String> {
            s.select(type_url::CLUSTER, &cds, node)
                .unwrap()
                .into_keys()
                .collect()
        };
        assert_eq!(names("edge"), ["orders", "users"]);
        assert_eq!(names("orders"), ["users"]);
        let eds = Subscription::from_request(type_url::ENDPOINT, &["orders".into()]);
        assert!(
            s.select(type_url::ENDPOINT, &eds, "orders")
                .unwrap()
                .is_empty()
        );
        assert_eq!(s.select(type_url::ENDPOINT, &eds, "edge").unwrap().len(), 1);
        assert!(s.serves(type_url::ROUTE, "orders", "orders"));
    }

    #[test]
    fn a_resource_version_follows_its_content() {
        let a = Snapshot::build(&mesh(8080, 1000, "/"), "1".into());
        let b = Snapshot::build(&mesh(8081, 1000, "/"), "2".into());
        let version = |s: &Snapshot, t: &str, n: &str| resource_version(&s.resources[t][n]);
        assert_eq!(
            version(&a, type_url::CLUSTER, "orders"),
            version(&b, type_url::CLUSTER, "orders")
        );
        assert_ne!(
            version(&a, type_url::ENDPOINT, "orders"),
            version(&b, type_url::ENDPOINT, "orders")
        );
        assert_eq!(version(&a, type_url::ENDPOINT, "orders").len(), 16);
    }

    #[test]
    fn resources_decode_as_what_the_spec_says() {
        let s = Snapshot::build(&mesh(8080, 1500, "/"), "1".into());
        let c = Cluster::decode(&*s.resources[type_url::CLUSTER]["orders"].value).unwrap();
        assert_eq!(
            c.connect_timeout,
            Some(Duration {
                seconds: 1,
                nanos: 500_000_000
            })
        );
        let cla = ClusterLoadAssignment::decode(&*s.resources[type_url::ENDPOINT]["orders"].value)
            .unwrap();
        assert_eq!(cla.endpoints[0].lb_endpoints.len(), 1);
        let rc = RouteConfiguration::decode(&*s.resources[type_url::ROUTE]["edge-routes"].value)
            .unwrap();
        assert_eq!(rc.virtual_hosts[0].domains, vec!["*"]);
    }

    fn tls_cluster(tls: UpstreamTlsSpec) -> UpstreamTlsContext {
        let mut spec = mesh(8080, 1000, "/");
        spec.clusters[0].tls = Some(tls);
        let s = Snapshot::build(&spec, "1".into());
        let c = Cluster::decode(&*s.resources[type_url::CLUSTER]["orders"].value).unwrap();
        let socket = c.transport_socket.expect("a transport socket");
        assert_eq!(socket.name, "envoy.transport_sockets.tls");
        let Some(transport_socket::ConfigType::TypedConfig(any)) = socket.config_type else {
            panic!("no typed config");
        };
        assert_eq!(any.type_url, UPSTREAM_TLS_TYPE);
        UpstreamTlsContext::decode(&*any.value).unwrap()
    }

    #[test]
    fn an_idle_timeout_closes_idle_upstream_connections() {
        let mut spec = mesh(8080, 1000, "/");
        spec.clusters[0].idle_timeout_ms = Some(2500);
        let s = Snapshot::build(&spec, "1".into());
        let c = Cluster::decode(&*s.resources[type_url::CLUSTER]["orders"].value).unwrap();
        let any = &c.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS_KEY];
        assert_eq!(any.type_url, HTTP_PROTOCOL_OPTIONS_TYPE);
        let options = HttpProtocolOptions::decode(&*any.value).unwrap();
        assert_eq!(
            options.common_http_protocol_options.unwrap().idle_timeout,
            Some(Duration {
                seconds: 2,
                nanos: 500_000_000
            })
        );
        assert!(
            options.upstream_protocol_options.is_some(),
            "required by Envoy"
        );
        let users = Cluster::decode(&*s.resources[type_url::CLUSTER]["users"].value).unwrap();
        assert!(users.typed_extension_protocol_options.is_empty());
    }

    #[test]
    fn a_cluster_with_its_ca_over_sds_has_istios_shape() {
        let ctx = tls_cluster(UpstreamTlsSpec::sds(
            "edge",
            "ca",
            "spiffe://local/ns/local/sa/orders",
        ));
        let common = ctx.common_tls_context.unwrap();
        assert_eq!(common.tls_certificate_sds_secret_configs[0].name, "edge");
        assert_eq!(
            common.tls_certificate_sds_secret_configs[0].sds_config,
            Some(ads())
        );
        let Some(ValidationContextType::CombinedValidationContext(combined)) =
            common.validation_context_type
        else {
            panic!("not a combined validation context");
        };
        assert_eq!(
            combined.validation_context_sds_secret_config.unwrap().name,
            "ca"
        );
        let default = combined.default_validation_context.unwrap();
        assert_eq!(default.trusted_ca, None);
        let m = &default.match_typed_subject_alt_names[0];
        assert_eq!(m.san_type, subject_alt_name_matcher::SanType::Uri as i32);
        assert_eq!(
            m.matcher.as_ref().unwrap().match_pattern,
            Some(MatchPattern::Exact(
                "spiffe://local/ns/local/sa/orders".into()
            ))
        );
    }

    #[test]
    fn a_cluster_with_a_file_or_inline_ca_has_a_validation_context() {
        let ctx = tls_cluster(UpstreamTlsSpec {
            certificate_sds: None,
            ca: Some(CaSpec::File("/etc/ca.pem".into())),
            match_sans: vec![
                SanMatcherSpec::new(SanType::Dns, StringMatch::Suffix(".local".into())),
                SanMatcherSpec::new(SanType::Uri, StringMatch::SafeRegex("spiffe://.*".into())),
            ],
            sni: Some("orders.local".into()),
        });
        assert_eq!(ctx.sni, "orders.local");
        let common = ctx.common_tls_context.unwrap();
        assert!(common.tls_certificate_sds_secret_configs.is_empty());
        let Some(ValidationContextType::ValidationContext(v)) = common.validation_context_type
        else {
            panic!("not a validation context");
        };
        assert_eq!(
            v.trusted_ca.unwrap().specifier,
            Some(data_source::Specifier::Filename("/etc/ca.pem".into()))
        );
        assert_eq!(v.match_typed_subject_alt_names.len(), 2);
        let regex = &v.match_typed_subject_alt_names[1].matcher.as_ref().unwrap();
        assert!(
            matches!(&regex.match_pattern, Some(MatchPattern::SafeRegex(r)) if r.regex == "spiffe://.*")
        );

        let inline = tls_cluster(UpstreamTlsSpec {
            ca: Some(CaSpec::Pem("PEM".into())),
            ..UpstreamTlsSpec::default()
        });
        let Some(ValidationContextType::ValidationContext(v)) =
            inline.common_tls_context.unwrap().validation_context_type
        else {
            panic!("not a validation context");
        };
        assert_eq!(
            v.trusted_ca.unwrap().specifier,
            Some(data_source::Specifier::InlineString("PEM".into()))
        );
    }

    #[test]
    fn secrets_are_served_inline_and_change_alone() {
        let spec = mesh(8080, 1000, "/");
        let plain = Snapshot::build(&spec, "1".into());
        let secrets = [
            SecretSpec::certificate("edge", "CHAIN".into(), "KEY".into()),
            SecretSpec::trusted_ca("ca", "CA".into()),
        ];
        let with = Snapshot::build(&spec, "2".into()).with_secrets(&secrets);
        assert_eq!(plain.changed_types(&with), vec![type_url::SECRET]);
        let edge = Secret::decode(&*with.resources[type_url::SECRET]["edge"].value).unwrap();
        assert_eq!(edge.name, "edge");
        let Some(secret::Type::TlsCertificate(cert)) = edge.r#type else {
            panic!("not a certificate");
        };
        let inline = |d: Option<DataSource>| d.and_then(|d| d.specifier);
        assert_eq!(
            inline(cert.certificate_chain),
            Some(data_source::Specifier::InlineString("CHAIN".into()))
        );
        assert_eq!(
            inline(cert.private_key),
            Some(data_source::Specifier::InlineString("KEY".into()))
        );
        let ca = Secret::decode(&*with.resources[type_url::SECRET]["ca"].value).unwrap();
        let Some(secret::Type::ValidationContext(v)) = ca.r#type else {
            panic!("not a validation context");
        };
        assert_eq!(
            inline(v.trusted_ca),
            Some(data_source::Specifier::InlineString("CA".into()))
        );
        // Secrets are asked for by name: no name, no secret.
        let none = Subscription::from_request(type_url::SECRET, &[]);
        assert!(!none.wildcard);
        assert!(
            with.select(type_url::SECRET, &none, "edge")
                .unwrap()
                .is_empty()
        );
        let one = Subscription::from_request(type_url::SECRET, &["ca".into()]);
        assert_eq!(
            with.select(type_url::SECRET, &one, "edge").unwrap().len(),
            1
        );
    }
}
