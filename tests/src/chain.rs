//! The three-tier chain the graph's tests run on real Envoys: an edge sidecar routing
//! `/` to `svc-a`, whose sidecar routes `/b` to `svc-b` and `/ext` to an unregistered
//! external service, each sidecar with an agent reporting every 300 ms.

use serde_json::Value;

use crate::bootstrap::{Cluster, HttpListener};
use crate::{Bootstrap, Catalog, Envoy, MeshAgent, Upstream};

/// The chain's sidecars, services and agents; dropping it stops them.
#[derive(Debug)]
pub struct Chain {
    pub edge: Envoy,
    pub a: Envoy,
    pub b: Envoy,
    /// The service behind `svc-b`'s sidecar (stop it to make B fail).
    pub b_service: Upstream,
    pub a_service: Upstream,
    pub external: Upstream,
    pub agents: Vec<MeshAgent>,
}

impl Chain {
    /// Starts the chain's sidecars and their agents for `zone` (whose clusters the
    /// caller registers as it needs).
    pub async fn start(catalog: &Catalog, zone: &str) -> anyhow::Result<Chain> {
        Chain::start_with(catalog, zone, "svc-b").await
    }

    /// As [`Chain::start`], with `svc-a`'s sidecar naming its cluster to `svc-b`'s
    /// listener `b_upstream` (the graph then links them by that address, not by
    /// name, unless it is `svc-b`).
    pub async fn start_with(
        catalog: &Catalog,
        zone: &str,
        b_upstream: &str,
    ) -> anyhow::Result<Chain> {
        let b_service = Upstream::start().await?;
        let b = Envoy::start(Bootstrap::service_sidecar(b_service.addr, None)).await?;
        let external = Upstream::start().await?;
        let a_service = Upstream::start().await?;
        let a = Envoy::start(
            Bootstrap::service_sidecar(a_service.addr, None)
                .listener(
                    HttpListener::new("egress", "egress_http")
                        .route("/b", b_upstream)
                        .route("/ext", "external-api"),
                )
                .cluster(Cluster::new(b_upstream, &[b.listener("ingress")]))
                .cluster(Cluster::new("external-api", &[external.addr])),
        )
        .await?;
        let edge = Envoy::start(Bootstrap::edge_sidecar(
            &[("/", "svc-a", a.listener("ingress"))],
            None,
        ))
        .await?;
        let mut agents = Vec::new();
        for (envoy, cluster) in [(&edge, "edge"), (&a, "svc-a"), (&b, "svc-b")] {
            agents.push(agent(catalog, envoy, zone, cluster).await?);
        }
        Ok(Chain {
            edge,
            a,
            b,
            b_service,
            a_service,
            external,
            agents,
        })
    }

    /// Sends requests along each hop once: through the edge, A to B and A to the
    /// external service; answers every status.
    pub async fn traffic(&self, client: &reqwest::Client) -> Vec<u16> {
        let mut out = send(client, &format!("{}/orders", self.edge.url("edge")), 3).await;
        out.extend(send(client, &format!("{}/b", self.a.url("egress")), 3).await);
        out.extend(send(client, &format!("{}/ext", self.a.url("egress")), 2).await);
        out
    }
}

/// An agent for `envoy` as `<cluster>-1` of (zone, cluster), tailing its access log.
async fn agent(
    catalog: &Catalog,
    envoy: &Envoy,
    zone: &str,
    cluster: &str,
) -> anyhow::Result<MeshAgent> {
    let mut args =
        catalog.sidecar_agent_args(envoy, zone, cluster, &format!("{cluster}-1"), "300ms");
    args.extend([
        "--sidecar-log-file".to_owned(),
        envoy.access_log_path().display().to_string(),
    ]);
    MeshAgent::start(&args).await
}

/// Sends `n` GET requests to `url` one after the other; answers their statuses.
pub async fn send(client: &reqwest::Client, url: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let status = match client.get(url).send().await {
            Ok(r) => r.status().as_u16(),
            Err(_) => 0,
        };
        out.push(status);
    }
    out
}

/// The edge `source -> target` of a `GET /graph` answer.
pub fn link<'a>(g: &'a Value, source: &str, target: &str) -> Option<&'a Value> {
    g["edges"]
        .as_array()?
        .iter()
        .find(|e| e["source"] == source && e["target"] == target)
}

/// The node `id` of a `GET /graph` answer.
pub fn node<'a>(g: &'a Value, id: &str) -> Option<&'a Value> {
    g["nodes"].as_array()?.iter().find(|n| n["id"] == id)
}
