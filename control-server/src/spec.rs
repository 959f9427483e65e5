//! The mesh a control server declares: clusters with their endpoints (and the TLS
//! they speak upstream) and HTTP listeners with their routes, as plain data (JSON
//! through serde for the binary's `--mesh` file); and the secrets it serves over SDS.

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
    /// TLS to its endpoints (an `UpstreamTlsContext`); none: plaintext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<UpstreamTlsSpec>,
    /// How long an upstream connection may stay idle before Envoy closes it (the
    /// next request then opens one, with a new TLS handshake: a certificate that
    /// expired or no longer matches fails it); none: Envoy's default (1 h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// Served (CDS and EDS) only to the nodes whose `node.cluster` is one of these,
    /// say only the edge for a cluster that presents the edge's certificate; empty:
    /// to every node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_clusters: Vec<String>,
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
            tls: None,
            idle_timeout_ms: None,
            node_clusters: Vec::new(),
        }
    }

    /// This cluster served only to nodes of these node clusters.
    pub fn for_node_clusters(mut self, node_clusters: &[&str]) -> Self {
        self.node_clusters = node_clusters.iter().map(|c| (*c).to_owned()).collect();
        self
    }

    /// This cluster speaking `tls` to its endpoints.
    pub fn with_tls(mut self, tls: UpstreamTlsSpec) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// The TLS a cluster speaks to its endpoints: the client certificate it presents,
/// the CA its endpoints' certificates must chain to, and the SANs one of which they
/// must carry. In JSON:
///
/// ```json
/// {"certificate_sds": "edge", "ca": {"sds": "ca"},
///  "match_sans": [{"san_type": "URI", "matcher": {"exact": "spiffe://local/ns/local/sa/catalog"}}]}
/// ```
///
/// With the CA over SDS the matchers go under
/// `combined_validation_context.default_validation_context` beside
/// `validation_context_sds_secret_config` (Istio's shape); with a file or inline CA,
/// under `validation_context` with its `trusted_ca`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsSpec {
    /// The SDS secret (a `tls_certificate`, over ADS) presented as the client
    /// certificate; none: no client certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_sds: Option<String>,
    /// Where the CA comes from; none: the endpoints' certificates are not verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<CaSpec>,
    /// The endpoint's certificate must carry a SAN that one of these matches (Envoy
    /// refuses matchers without a CA).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_sans: Vec<SanMatcherSpec>,
    /// The SNI sent in the handshake; none: no SNI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
}

impl UpstreamTlsSpec {
    /// Envoy's usual mesh shape: the client certificate `certificate` and the CA
    /// `ca` both over SDS, the endpoint's certificate required to carry `uri` (an
    /// exact URI SAN, a SPIFFE id).
    pub fn sds(certificate: &str, ca: &str, uri: &str) -> Self {
        Self {
            certificate_sds: Some(certificate.to_owned()),
            ca: Some(CaSpec::Sds(ca.to_owned())),
            match_sans: vec![SanMatcherSpec::new(
                SanType::Uri,
                StringMatch::Exact(uri.to_owned()),
            )],
            sni: None,
        }
    }
}

/// Where a TLS context's CA (its `trusted_ca`) comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum CaSpec {
    /// A `validation_context` secret of this name over SDS (ADS).
    Sds(String),
    /// A PEM file on the Envoy's machine.
    File(String),
    /// PEM text, inline.
    Pem(String),
}

/// One entry of `match_typed_subject_alt_names`: a SAN type and how its value must
/// match, as Envoy writes it (`{"san_type": "URI", "matcher": {"prefix": "spiffe://local/"}}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SanMatcherSpec {
    pub san_type: SanType,
    pub matcher: StringMatch,
}

impl SanMatcherSpec {
    pub fn new(san_type: SanType, matcher: StringMatch) -> Self {
        Self { san_type, matcher }
    }
}

/// The kind of subject alternative name a matcher looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SanType {
    #[serde(rename = "URI")]
    Uri,
    #[serde(rename = "DNS")]
    Dns,
    #[serde(rename = "IP_ADDRESS", alias = "IP")]
    IpAddress,
    #[serde(rename = "EMAIL")]
    Email,
}

/// How a string must match (Envoy's `StringMatcher`, case-sensitive); `safe_regex`
/// is RE2 syntax and must match the whole value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum StringMatch {
    Exact(String),
    Prefix(String),
    Suffix(String),
    Contains(String),
    SafeRegex(String),
}

/// A secret served over SDS: a certificate with its private key, or a CA to verify
/// peers with. Its `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretSpec {
    /// The name Envoys ask for (`SdsSecretConfig.name`).
    pub name: String,
    pub kind: SecretKind,
}

/// What a secret holds, inline.
#[derive(Clone, PartialEq, Eq)]
pub enum SecretKind {
    /// A `tls_certificate`: the chain (leaf first) and its private key, PEM.
    Certificate { chain_pem: String, key_pem: String },
    /// A `validation_context` whose `trusted_ca` is these PEM certificates.
    TrustedCa { ca_pem: String },
}

impl SecretSpec {
    /// A certificate secret.
    pub fn certificate(name: &str, chain_pem: String, key_pem: String) -> Self {
        Self {
            name: name.to_owned(),
            kind: SecretKind::Certificate { chain_pem, key_pem },
        }
    }

    /// A validation context secret.
    pub fn trusted_ca(name: &str, ca_pem: String) -> Self {
        Self {
            name: name.to_owned(),
            kind: SecretKind::TrustedCa { ca_pem },
        }
    }
}

impl std::fmt::Debug for SecretSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            SecretKind::Certificate { chain_pem, .. } => {
                format!("certificate ({} bytes, key redacted)", chain_pem.len())
            }
            SecretKind::TrustedCa { ca_pem } => format!("trusted CA ({} bytes)", ca_pem.len()),
        };
        f.debug_struct("SecretSpec")
            .field("name", &self.name)
            .field("kind", &kind)
            .finish()
    }
}

impl std::fmt::Debug for SecretKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretKind::Certificate { .. } => f.write_str("Certificate { .. }"),
            SecretKind::TrustedCa { .. } => f.write_str("TrustedCa { .. }"),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tls_cluster_reads_as_documented() {
        let json = r#"{"name": "catalog", "endpoints": [{"address": "127.0.0.1", "port": 18010}],
            "tls": {"certificate_sds": "edge", "ca": {"sds": "ca"},
                    "match_sans": [{"san_type": "URI", "matcher": {"exact": "spiffe://local/ns/local/sa/catalog"}},
                                   {"san_type": "IP", "matcher": {"prefix": "127."}}]}}"#;
        let c: ClusterSpec = serde_json::from_str(json).unwrap();
        let tls = c.tls.clone().unwrap();
        assert_eq!(
            tls.match_sans[0],
            UpstreamTlsSpec::sds("edge", "ca", "spiffe://local/ns/local/sa/catalog").match_sans[0]
        );
        assert_eq!(tls.match_sans[1].san_type, SanType::IpAddress);
        let back: ClusterSpec = serde_json::from_value(serde_json::to_value(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        // A plaintext cluster writes no `tls`.
        let plain = serde_json::to_value(ClusterSpec::new("x", vec![])).unwrap();
        assert!(plain.get("tls").is_none(), "{plain}");
    }

    #[test]
    fn unknown_tls_fields_are_refused() {
        for bad in [
            r#"{"name": "x", "tls": {"certificate": "edge"}}"#,
            r#"{"name": "x", "tls": {"ca": {"sds": "ca", "file": "/ca.pem"}}}"#,
            r#"{"name": "x", "tls": {"match_sans": [{"san_type": "URI", "matcher": {"glob": "*"}}]}}"#,
            r#"{"name": "x", "tls": {"match_sans": [{"san_type": "OTHER", "matcher": {"exact": "a"}}]}}"#,
        ] {
            assert!(serde_json::from_str::<ClusterSpec>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_secrets_debug_shows_no_key() {
        let s =
            SecretSpec::certificate("edge", "CHAIN".into(), "-----BEGIN PRIVATE KEY-----".into());
        let debug = format!("{s:?} {:?}", s.kind);
        assert!(!debug.contains("PRIVATE"), "{debug}");
        assert!(debug.contains("edge"), "{debug}");
    }
}
