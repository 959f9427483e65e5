//! Snapshots: a [`MeshSpec`] turned into the Envoy resources it declares (Cluster,
//! ClusterLoadAssignment, Listener, RouteConfiguration as protobuf `Any`), under one
//! version, what a subscription gets from one, and each resource's own version
//! (for Delta xDS).

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, HealthStatus, SocketAddress,
    address, config_source, socket_address,
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
use envoy_types::pb::google::protobuf::{Any, Duration};
use prost::Message;

use crate::spec::{ClusterSpec, Health, ListenerSpec, MeshSpec};

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
    /// Every type a snapshot holds, in the order Envoy needs them.
    pub const ALL: [&str; 4] = [CLUSTER, ENDPOINT, LISTENER, ROUTE];

    /// Whether a subscription with no names asks for every resource of the type.
    pub fn is_wildcard_type(type_url: &str) -> bool {
        type_url == CLUSTER || type_url == LISTENER
    }
}

const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";

/// Resources of one type by name.
pub type Resources = BTreeMap<String, Any>;

/// The resources of one mesh under one version.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub version: String,
    /// By type URL (every type of [`type_url::ALL`] is present).
    pub resources: BTreeMap<&'static str, Resources>,
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
    /// The resources `spec` declares, under `version`.
    pub fn build(spec: &MeshSpec, version: String) -> Self {
        let mut resources: BTreeMap<&'static str, Resources> = type_url::ALL
            .iter()
            .map(|t| (*t, Resources::new()))
            .collect();
        for c in &spec.clusters {
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
        Self { version, resources }
    }

    /// An empty snapshot.
    pub fn empty(version: String) -> Self {
        Self::build(&MeshSpec::default(), version)
    }

    /// What `sub` gets of `type_url` (names absent from the snapshot are left out);
    /// `None` for a type a snapshot does not hold.
    pub fn select(&self, type_url: &str, sub: &Subscription) -> Option<Resources> {
        let all = self.resources.get(type_url)?;
        Some(if sub.wildcard {
            all.clone()
        } else {
            sub.names
                .iter()
                .filter_map(|n| all.get(n).map(|r| (n.clone(), r.clone())))
                .collect()
        })
    }

    /// The types whose resources differ between `self` and `other`.
    pub fn changed_types(&self, other: &Snapshot) -> Vec<&'static str> {
        type_url::ALL
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

fn cluster(c: &ClusterSpec) -> Cluster {
    let ms = c.connect_timeout_ms;
    Cluster {
        name: c.name.clone(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::EdsClusterConfig {
            eds_config: Some(ads()),
            service_name: String::new(),
        }),
        connect_timeout: Some(Duration {
            seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
            nanos: ((ms % 1000) * 1_000_000) as i32,
        }),
        ..Default::default()
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
        assert_eq!(s.select(type_url::CLUSTER, &cds).unwrap().len(), 2);
        let eds = Subscription::from_request(type_url::ENDPOINT, &["users".into(), "gone".into()]);
        assert!(!eds.wildcard);
        let picked = s.select(type_url::ENDPOINT, &eds).unwrap();
        assert_eq!(picked.keys().collect::<Vec<_>>(), vec!["users"]);
        let none = Subscription::from_request(type_url::ROUTE, &[]);
        assert!(s.select(type_url::ROUTE, &none).unwrap().is_empty());
        assert!(s.select("type.googleapis.com/other", &none).is_none());
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
}
