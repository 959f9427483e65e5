//! The mesh a control server declares: clusters with their endpoints and HTTP
//! listeners with their routes, as plain data (JSON through serde for the binary's
//! `--mesh` file).

use serde::{Deserialize, Serialize};

/// Everything a snapshot holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeshSpec {
    /// EDS clusters (CDS), each with its endpoints (EDS).
    #[serde(default)]
    pub clusters: Vec<ClusterSpec>,
    /// HTTP listeners (LDS), each naming a route configuration (RDS).
    #[serde(default)]
    pub listeners: Vec<ListenerSpec>,
}

/// An EDS cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    pub name: String,
    #[serde(default)]
    pub endpoints: Vec<EndpointSpec>,
    /// The cluster's connect timeout; 0 makes Envoy reject the cluster
    /// (`ClusterValidationError.ConnectTimeout`).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
}

/// The connect timeout of a cluster that names none.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 1000;

fn default_connect_timeout_ms() -> u64 {
    DEFAULT_CONNECT_TIMEOUT_MS
}

impl ClusterSpec {
    /// A cluster with the default connect timeout.
    pub fn new(name: &str, endpoints: Vec<EndpointSpec>) -> Self {
        Self {
            name: name.to_owned(),
            endpoints,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
        }
    }
}

/// One endpoint of a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointSpec {
    /// An IP address.
    pub address: String,
    pub port: u16,
    #[serde(default)]
    pub health: Health,
}

impl EndpointSpec {
    /// A healthy endpoint.
    pub fn new(address: &str, port: u16) -> Self {
        Self {
            address: address.to_owned(),
            port,
            health: Health::Healthy,
        }
    }

    /// This endpoint with another health status.
    pub fn with_health(mut self, health: Health) -> Self {
        self.health = health;
        self
    }
}

impl From<std::net::SocketAddr> for EndpointSpec {
    fn from(addr: std::net::SocketAddr) -> Self {
        Self::new(&addr.ip().to_string(), addr.port())
    }
}

/// An endpoint's health status as EDS carries it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    #[default]
    #[serde(alias = "HEALTHY")]
    Healthy,
    #[serde(alias = "UNHEALTHY")]
    Unhealthy,
    #[serde(alias = "UNKNOWN")]
    Unknown,
    #[serde(alias = "DRAINING")]
    Draining,
}

/// An HTTP connection manager listener whose routes come over RDS (ADS), with the
/// router filter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerSpec {
    pub name: String,
    /// The IP address it binds.
    pub address: String,
    /// The port it binds (0: one the kernel picks).
    pub port: u16,
    /// The name of its route configuration.
    pub route_config: String,
    /// The route configuration's routes (virtual host `*`), in order.
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
}

/// Requests whose path starts with `prefix` go to `cluster`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    pub prefix: String,
    pub cluster: String,
}

impl RouteSpec {
    pub fn new(prefix: &str, cluster: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            cluster: cluster.to_owned(),
        }
    }
}
