//! The sidecar of a mesh without configuration scoping (Istio's default gives every
//! sidecar every cluster of the mesh): a real Envoy with [`CLUSTERS`] static upstream
//! clusters of [`HOSTS`] hosts each, on 10.x addresses that nobody answers. Nothing
//! connects to them (no health checks, no traffic). Some hosts carry an EDS health
//! status other than healthy, so that healthy counts differ between clusters.

use serde_json::{Value, json};

use crate::bootstrap::Bootstrap;

/// Upstream clusters of the large sidecar: the most a sidecar is served with by
/// default.
pub const CLUSTERS: usize = 20_000;
/// Hosts of each of them.
pub const HOSTS: usize = 5;

/// One upstream cluster as the bootstrap gives it.
#[derive(Debug, Clone)]
pub struct LargeCluster {
    pub name: String,
    /// Each host's `ip:port` and whether Envoy counts it healthy.
    pub hosts: Vec<(String, bool)>,
}

impl LargeCluster {
    /// The hosts' addresses, sorted.
    pub fn addresses(&self) -> Vec<String> {
        let mut a: Vec<String> = self.hosts.iter().map(|(a, _)| a.clone()).collect();
        a.sort();
        a
    }

    pub fn healthy(&self) -> usize {
        self.hosts.iter().filter(|(_, ok)| *ok).count()
    }
}

/// The EDS health status of host `h` of cluster `i`: a few in 13 unhealthy or
/// draining (which Envoy does not count healthy), the rest unset (healthy).
fn health_status(i: usize, h: usize) -> Option<&'static str> {
    match (i * HOSTS + h) % 13 {
        0 => Some("UNHEALTHY"),
        1 => Some("DRAINING"),
        _ => None,
    }
}

/// `n` clusters named as Istio names them (`outbound|8080||svc-00042.ns-42.svc.cluster.local`),
/// each with [`HOSTS`] distinct addresses.
pub fn clusters(n: usize) -> Vec<LargeCluster> {
    (0..n)
        .map(|i| LargeCluster {
            name: format!("outbound|8080||svc-{i:05}.ns-{}.svc.cluster.local", i % 50),
            hosts: (0..HOSTS)
                .map(|h| {
                    let address = format!("10.{}.{}.{}:8080", 1 + i / 250, i % 250, 1 + h);
                    (address, health_status(i, h).is_none())
                })
                .collect(),
        })
        .collect()
}

/// A bootstrap whose upstream clusters are `clusters`, static, without listeners.
pub fn bootstrap(clusters: &[LargeCluster]) -> Bootstrap {
    let mut b = Bootstrap::new();
    // Stats are read by the scrape, not waited on: a slow flush spares the CPU.
    b.stats_flush_ms = 5_000;
    b.raw_clusters = clusters
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let endpoints: Vec<Value> = c
                .hosts
                .iter()
                .enumerate()
                .map(|(h, (address, _))| {
                    let (ip, port) = address.rsplit_once(':').expect("ip:port");
                    let mut e = json!({"endpoint": {"address": {"socket_address": {
                        "address": ip, "port_value": port.parse::<u16>().expect("a port")}}}});
                    if let Some(status) = health_status(i, h) {
                        e["health_status"] = json!(status);
                    }
                    e
                })
                .collect();
            json!({
                "name": c.name,
                "connect_timeout": "1s",
                "type": "STATIC",
                "load_assignment": {"cluster_name": c.name, "endpoints": [{"lb_endpoints": endpoints}]},
            })
        })
        .collect();
    b
}
