//! Workload identity over SDS: the bootstrap pieces of Envoys whose certificates
//! and CA come from the test control server's identity issuer (a static inbound
//! listener demanding client certificates, with its certificate and CA over SDS;
//! a static cluster), a service sidecar built of them, and readers of what an
//! Envoy shows of them (`/certs`, and the SDS secrets of
//! `/config_dump?resource=dynamic_active_secrets`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::xds::{XdsBootstrap, XdsEnvoy};

/// Starts a service sidecar from `bootstrap` (its node, control server and
/// protocol) with listener `ingress` demanding mTLS, presenting the certificate of
/// secret `secret` and trusting the CA of secret `ca`, both over SDS, routing to
/// `upstream` (static cluster `app`), its access lines in `access_log`; waits until
/// the listener is bound (once its secrets arrived) and returns its address.
pub async fn start_mtls_sidecar(
    mut bootstrap: XdsBootstrap,
    (secret, ca): (&str, &str),
    upstream: SocketAddr,
    access_log: &Path,
) -> anyhow::Result<(XdsEnvoy, SocketAddr)> {
    bootstrap.static_listeners.push(http_listener(
        "ingress",
        "app",
        Some(downstream_tls_sds(secret, ca)),
        access_log,
    ));
    bootstrap
        .static_clusters
        .push(static_cluster("app", upstream));
    let envoy = XdsEnvoy::start(&bootstrap).await?;
    let what = format!(
        "{}'s listener ingress to bind (its secrets arrived)",
        envoy.node_id
    );
    let addr = crate::wait_for(&what, crate::envoy::START_DEADLINE, || async {
        envoy.listener("ingress").await.ok().flatten()
    })
    .await?;
    Ok((envoy, addr))
}

/// Waits until `envoy`'s `/certs` shows `serial` as its only chain certificate;
/// the error shows what it does show.
pub async fn wait_chain_serial(
    envoy: &XdsEnvoy,
    serial: &str,
    deadline: Duration,
) -> anyhow::Result<()> {
    let want = BTreeSet::from([serial.to_owned()]);
    let what = format!("{} to show serial {serial}", envoy.node_id);
    let waited = crate::wait_for(&what, deadline, || async {
        (certs(envoy).await.ok()?.chain_serials() == want).then_some(())
    })
    .await;
    if let Err(e) = waited {
        anyhow::bail!("{e}; /certs shows {:?}", certs(envoy).await);
    }
    Ok(())
}

/// `{"name": secret, "sds_config": ADS}`: a secret asked for over the bootstrap's ADS
/// stream.
pub fn sds(secret: &str) -> Value {
    json!({"name": secret, "sds_config": {"ads": {}, "resource_api_version": "V3"}})
}

/// A listener's transport socket that presents the certificate of secret `cert`
/// and demands a client certificate signed by the CA of secret `ca`, both over SDS.
pub fn downstream_tls_sds(cert: &str, ca: &str) -> Value {
    json!({
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "require_client_certificate": true,
            "common_tls_context": {
                "tls_certificate_sds_secret_configs": [sds(cert)],
                "validation_context_sds_secret_config": sds(ca),
            },
        }
    })
}

/// An HTTP listener `name` on 127.0.0.1 port 0 that routes every request to
/// `cluster` (which may come later over CDS), with `transport_socket` when given;
/// its access lines (Envoy's default format, with the response flags) go to
/// `access_log`.
pub fn http_listener(
    name: &str,
    cluster: &str,
    transport_socket: Option<Value>,
    access_log: &Path,
) -> Value {
    let mut chain = json!({"filters": [{
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": name,
            "access_log": [{
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                    "path": access_log,
                }
            }],
            "route_config": {
                "name": name,
                "validate_clusters": false,
                "virtual_hosts": [{"name": name, "domains": ["*"], "routes": [
                    {"match": {"prefix": "/"}, "route": {"cluster": cluster}}
                ]}],
            },
            "http_filters": [{
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
            }],
        }
    }]});
    if let Some(socket) = transport_socket {
        chain["transport_socket"] = socket;
    }
    json!({
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
        "filter_chains": [chain],
    })
}

/// A static plaintext cluster `name` with one endpoint.
pub fn static_cluster(name: &str, endpoint: SocketAddr) -> Value {
    json!({
        "name": name,
        "connect_timeout": "1s",
        "type": "STATIC",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{
            "endpoint": {"address": {"socket_address": {
                "address": endpoint.ip().to_string(), "port_value": endpoint.port()}}}
        }]}]},
    })
}

/// One certificate as `/certs` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownCert {
    /// A file's path, or `<inline>` for one that came over SDS.
    pub path: String,
    /// Lower-case hex.
    pub serial: String,
    /// As Envoy writes them: `uri:...`, `dns:...`, `ip_address:...`.
    pub sans: Vec<String>,
    /// RFC 3339.
    pub valid_from: String,
    /// RFC 3339.
    pub expiration_time: String,
    /// Whole days, `"0"` once expired.
    pub days_until_expiration: String,
}

/// What `/certs` lists over every TLS context (a context used twice is listed twice).
#[derive(Debug, Clone, Default)]
pub struct ShownCerts {
    /// `ca_cert` entries.
    pub ca: Vec<ShownCert>,
    /// `cert_chain` entries (the leaf of each context).
    pub chain: Vec<ShownCert>,
}

impl ShownCerts {
    /// The distinct serials of the chain certificates.
    pub fn chain_serials(&self) -> BTreeSet<String> {
        self.chain.iter().map(|c| c.serial.clone()).collect()
    }
}

/// Reads `/certs`.
pub async fn certs(envoy: &XdsEnvoy) -> anyhow::Result<ShownCerts> {
    let v: Value = serde_json::from_str(&envoy.admin_get("/certs").await?)?;
    let mut shown = ShownCerts::default();
    for context in v["certificates"].as_array().into_iter().flatten() {
        for (key, into) in [("ca_cert", &mut shown.ca), ("cert_chain", &mut shown.chain)] {
            for c in context[key].as_array().into_iter().flatten() {
                let text = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
                let sans = c["subject_alt_names"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.as_object())
                    .flat_map(|o| {
                        o.iter()
                            .map(|(k, v)| format!("{k}:{}", v.as_str().unwrap_or_default()))
                    })
                    .collect();
                into.push(ShownCert {
                    path: text("path"),
                    serial: text("serial_number"),
                    sans,
                    valid_from: text("valid_from"),
                    expiration_time: text("expiration_time"),
                    days_until_expiration: text("days_until_expiration"),
                });
            }
        }
    }
    Ok(shown)
}

/// One SDS secret an Envoy holds (`dynamic_active_secrets`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveSecret {
    pub name: String,
    pub version_info: String,
    pub last_updated: String,
    /// `tls_certificate` or `validation_context`.
    pub kind: String,
    /// The private key as the dump shows it (Envoy writes `[redacted]`).
    pub private_key: Option<String>,
}

/// Reads `/config_dump?resource=dynamic_active_secrets`.
pub async fn active_secrets(envoy: &XdsEnvoy) -> anyhow::Result<Vec<ActiveSecret>> {
    let v: Value = serde_json::from_str(
        &envoy
            .admin_get("/config_dump?resource=dynamic_active_secrets")
            .await?,
    )?;
    Ok(v["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let secret = &c["secret"];
            let kind = ["tls_certificate", "validation_context"]
                .into_iter()
                .find(|k| !secret[*k].is_null())
                .unwrap_or_default();
            let key = &secret["tls_certificate"]["private_key"];
            ActiveSecret {
                name: c["name"].as_str().unwrap_or_default().to_owned(),
                version_info: c["version_info"].as_str().unwrap_or_default().to_owned(),
                last_updated: c["last_updated"].as_str().unwrap_or_default().to_owned(),
                kind: kind.to_owned(),
                private_key: (!key.is_null()).then(|| {
                    key["inline_string"]
                        .as_str()
                        .map_or_else(|| key.to_string(), str::to_owned)
                }),
            }
        })
        .collect())
}
