//! meshcat-tests: the harness of the end-to-end tests. It runs real Envoy 1.40
//! processes on 127.0.0.1 with every port learned at run time ([`envoy`]), builds
//! their bootstraps for the mesh topologies the tests need ([`bootstrap`]), serves
//! a small real upstream ([`upstream`]), generates mTLS certificates ([`certs`]),
//! runs a whole meshcat (aggregator, agents, sidecars) on one machine ([`mesh`]), and
//! runs the real failure scenarios of `diagnose/scenarios/` ([`scenario`]) with a
//! whole troubleshooting stack around them ([`diagnose_stack`]), and runs
//! a real three-member etcd cluster ([`etcd`]) with aggregator replicas as processes
//! on it ([`replicas`]), reads `GET /events` streams ([`sse`]), and drives the
//! dashboard in a real browser ([`browser`]). The graph's tests share a three-tier
//! chain of sidecars ([`chain`]). Processes told their ports up front
//! take them from [`ports`]; promtool and a real Prometheus server are in
//! [`monitoring`]. Envoys in network namespaces of their own, and the pod cgroups
//! that name them, are in [`netns`]; a sidecar that knows 20,000 upstream clusters
//! is in [`large_sidecar`]; a small filesystem the full-disk tests fill and grow is
//! in [`tmpfs`]. Envoys whose certificates come over SDS from the test control
//! server's identity issuer, and what they show of them, are in [`identity`].

pub mod bootstrap;
pub mod browser;
pub mod certs;
pub mod chain;
pub mod cpu;
pub mod diagnose_stack;
pub mod envoy;
pub mod etcd;
pub mod identity;
pub mod large_sidecar;
pub mod mesh;
pub mod monitoring;
pub mod netns;
pub mod ports;
pub mod replicas;
pub mod scenario;
pub mod sse;
pub mod tmpfs;
pub mod upstream;
pub mod xds;

pub use bootstrap::Bootstrap;
pub use certs::MeshCerts;
pub use envoy::{Envoy, envoy_binary};
pub use mesh::{Catalog, MeshAgent, Sidecar};
pub use upstream::Upstream;

use std::time::{Duration, Instant};

/// Polls `check` until it returns `Some` or `deadline` passes; the error names `what`.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() > end {
            anyhow::bail!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
