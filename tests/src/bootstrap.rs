//! Envoy bootstraps for test meshes, built as JSON: listeners and admin on
//! 127.0.0.1 port 0, an access log whose lines carry the response code, response
//! flags, upstream host and path, and the topologies the tests use (a service
//! sidecar, an edge routing by prefix) with optional mTLS. Raw listeners, clusters
//! and HTTP filters let tests put an Envoy into a chosen failure.

use std::net::SocketAddr;
use std::path::Path;

use serde_json::{Value, json};

use crate::certs::{Identity, MeshCerts};

/// TLS material of one side of an mTLS hop.
#[derive(Debug, Clone)]
pub struct Tls {
    pub ca_file: std::path::PathBuf,
    pub identity: Identity,
    /// Client side: the SAN the server must present (none: any trusted certificate).
    pub expect_san: Option<String>,
    /// Client side: a URI SAN (a SPIFFE ID) the server must present, beside or
    /// instead of `expect_san`.
    pub expect_uri: Option<String>,
}

impl Tls {
    pub fn new(certs: &MeshCerts, identity: Identity, expect_san: Option<&str>) -> Self {
        Self {
            ca_file: certs.ca_file.clone(),
            identity,
            expect_san: expect_san.map(str::to_owned),
            expect_uri: None,
        }
    }

    /// The same, the client side requiring the URI SAN `uri` of the server.
    pub fn expecting_uri(mut self, uri: &str) -> Self {
        self.expect_uri = Some(uri.to_owned());
        self
    }

    fn common(&self) -> Value {
        let mut validation = json!({"trusted_ca": {"filename": self.ca_file}});
        let mut matchers = Vec::new();
        if let Some(san) = &self.expect_san {
            matchers.push(json!({"san_type": "DNS", "matcher": {"exact": san}}));
        }
        if let Some(uri) = &self.expect_uri {
            matchers.push(json!({"san_type": "URI", "matcher": {"exact": uri}}));
        }
        if !matchers.is_empty() {
            validation["match_typed_subject_alt_names"] = json!(matchers);
        }
        json!({
            "tls_certificates": [{
                "certificate_chain": {"filename": self.identity.cert_file},
                "private_key": {"filename": self.identity.key_file},
            }],
            "validation_context": validation,
        })
    }

    /// A listener's transport socket demanding a client certificate.
    pub fn downstream(&self) -> Value {
        json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                "require_client_certificate": true,
                "common_tls_context": self.common(),
            }
        })
    }

    /// A cluster's transport socket presenting this identity.
    pub fn upstream(&self) -> Value {
        let mut ctx = json!({
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": self.common(),
        });
        if let Some(san) = &self.expect_san {
            ctx["sni"] = json!(san);
        }
        json!({"name": "envoy.transport_sockets.tls", "typed_config": ctx})
    }
}

/// A route: requests whose path starts with `prefix` go to `cluster`.
#[derive(Debug, Clone)]
pub struct Route {
    pub prefix: String,
    pub cluster: String,
    /// Retry on connect failure and 503 (an edge's usual policy).
    pub retry: bool,
}

/// An HTTP listener with one connection manager.
#[derive(Debug, Clone)]
pub struct HttpListener {
    pub name: String,
    /// The connection manager's stat prefix (`http.<stat_prefix>.*`).
    pub stat_prefix: String,
    pub routes: Vec<Route>,
    /// Refuse routes to unknown clusters at start (Envoy's default) or not.
    pub validate_clusters: bool,
    /// HTTP filters placed before the router (for example ext_authz).
    pub filters: Vec<Value>,
    /// Downstream TLS.
    pub tls: Option<Tls>,
    /// Port to bind; 0 picks one (a restart reuses the learned port).
    pub port: u16,
}

impl HttpListener {
    pub fn new(name: &str, stat_prefix: &str) -> Self {
        Self {
            name: name.to_owned(),
            stat_prefix: stat_prefix.to_owned(),
            routes: Vec::new(),
            validate_clusters: true,
            filters: Vec::new(),
            tls: None,
            port: 0,
        }
    }

    pub fn route(mut self, prefix: &str, cluster: &str) -> Self {
        self.routes.push(Route {
            prefix: prefix.to_owned(),
            cluster: cluster.to_owned(),
            retry: false,
        });
        self
    }

    fn render(&self, access_log: &Path) -> Value {
        let routes: Vec<Value> = self
            .routes
            .iter()
            .map(|r| {
                let mut action = json!({"cluster": r.cluster});
                if r.retry {
                    action["retry_policy"] =
                        json!({"retry_on": "connect-failure,5xx", "num_retries": 2});
                }
                json!({"match": {"prefix": r.prefix}, "route": action})
            })
            .collect();
        let mut filters = self.filters.clone();
        filters.push(json!({
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
        }));
        let hcm = json!({
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": self.stat_prefix,
                "access_log": [{
                    "name": "envoy.access_loggers.file",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                        // Envoy's default line format, as sidecars write it
                        // unless told otherwise; the diagnosis parses it.
                        "path": access_log,
                    }
                }],
                "route_config": {
                    "name": format!("{}_routes", self.name),
                    "validate_clusters": self.validate_clusters,
                    "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}]
                },
                "http_filters": filters,
            }
        });
        let mut chain = json!({"filters": [hcm]});
        if let Some(tls) = &self.tls {
            chain["transport_socket"] = tls.downstream();
        }
        json!({
            "name": self.name,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": self.port}},
            "filter_chains": [chain],
        })
    }
}

/// A static cluster.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub name: String,
    /// Empty: a cluster without endpoints.
    pub endpoints: Vec<SocketAddr>,
    /// Upstream TLS.
    pub tls: Option<Tls>,
    /// Speak HTTP/2 upstream (gRPC services).
    pub http2: bool,
}

impl Cluster {
    pub fn new(name: &str, endpoints: &[SocketAddr]) -> Self {
        Self {
            name: name.to_owned(),
            endpoints: endpoints.to_vec(),
            tls: None,
            http2: false,
        }
    }

    fn render(&self) -> Value {
        let lb: Vec<Value> = self
            .endpoints
            .iter()
            .map(|a| {
                json!({"endpoint": {"address": {"socket_address": {
                    "address": a.ip().to_string(), "port_value": a.port()}}}})
            })
            .collect();
        let mut c = json!({
            "name": self.name,
            "connect_timeout": "1s",
            "type": "STATIC",
            "load_assignment": {"cluster_name": self.name, "endpoints": [{"lb_endpoints": lb}]},
        });
        if let Some(tls) = &self.tls {
            c["transport_socket"] = tls.upstream();
        }
        if self.http2 {
            c["typed_extension_protocol_options"] = json!({
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}
                }
            });
        }
        c
    }
}

/// An Envoy bootstrap under construction.
#[derive(Debug, Clone, Default)]
pub struct Bootstrap {
    pub listeners: Vec<HttpListener>,
    pub clusters: Vec<Cluster>,
    /// Listeners given as raw JSON (non-HTTP or unusual ones).
    pub raw_listeners: Vec<Value>,
    /// Clusters given as raw JSON (SDS, EDS, gRPC services...).
    pub raw_clusters: Vec<Value>,
    /// Stats flush interval in ms; histograms are only visible after a flush.
    pub stats_flush_ms: u64,
    /// Admin port; 0 picks one (a restart reuses the learned port).
    pub admin_port: u16,
    /// The node (id, cluster, metadata, locality); none: Envoy's empty node.
    pub node: Option<Value>,
}

impl Bootstrap {
    pub fn new() -> Self {
        Self {
            stats_flush_ms: 200,
            ..Self::default()
        }
    }

    pub fn listener(mut self, l: HttpListener) -> Self {
        self.listeners.push(l);
        self
    }

    pub fn cluster(mut self, c: Cluster) -> Self {
        self.clusters.push(c);
        self
    }

    /// A service's sidecar: listener `ingress` (stat prefix `ingress_http`) routing
    /// everything to cluster `local_service`, which points at `upstream`. With
    /// `tls`, the listener demands mTLS.
    pub fn service_sidecar(upstream: SocketAddr, tls: Option<Tls>) -> Self {
        let mut ingress = HttpListener::new("ingress", "ingress_http").route("/", "local_service");
        ingress.tls = tls;
        Self::new()
            .listener(ingress)
            .cluster(Cluster::new("local_service", &[upstream]))
    }

    /// A sidecar of `cluster` with its own node identity `node`: listener `ingress`
    /// routing `prefix` to cluster `local_service` at `upstream`. Two of them with
    /// the same prefix run the same configuration but for what is per instance (the
    /// node, the ports, the upstream address); another prefix is another route.
    pub fn routed_sidecar(upstream: SocketAddr, cluster: &str, node: &str, prefix: &str) -> Self {
        let mut b = Self::new()
            .listener(HttpListener::new("ingress", "ingress_http").route(prefix, "local_service"))
            .cluster(Cluster::new("local_service", &[upstream]));
        b.node =
            Some(serde_json::json!({"id": node, "cluster": cluster, "metadata": {"pod": node}}));
        b
    }

    /// An edge sidecar: listener `edge` (stat prefix `edge_http`) routing each
    /// `(prefix, cluster, sidecar address)` to a cluster of that name, retrying on
    /// connect failure and 503. With `tls`, each cluster presents it upstream.
    pub fn edge_sidecar(services: &[(&str, &str, SocketAddr)], tls: Option<Tls>) -> Self {
        let mut edge = HttpListener::new("edge", "edge_http");
        let mut b = Self::new();
        for (prefix, cluster, addr) in services {
            edge.routes.push(Route {
                prefix: (*prefix).to_owned(),
                cluster: (*cluster).to_owned(),
                retry: true,
            });
            let mut c = Cluster::new(cluster, &[*addr]);
            c.tls = tls.clone();
            b = b.cluster(c);
        }
        b.listener(edge)
    }

    /// The bootstrap as JSON, with every access log written to `access_log`.
    pub fn render(&self, access_log: &Path) -> Value {
        let mut listeners: Vec<Value> = self
            .listeners
            .iter()
            .map(|l| l.render(access_log))
            .collect();
        listeners.extend(self.raw_listeners.iter().cloned());
        let mut clusters: Vec<Value> = self.clusters.iter().map(Cluster::render).collect();
        clusters.extend(self.raw_clusters.iter().cloned());
        let mut b = json!({
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": self.admin_port}}},
            "stats_flush_interval": format!("{}s", self.stats_flush_ms as f64 / 1000.0),
            "static_resources": {"listeners": listeners, "clusters": clusters},
        });
        if let Some(node) = &self.node {
            b["node"] = node.clone();
        }
        b
    }
}
