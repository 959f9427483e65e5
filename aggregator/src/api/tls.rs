//! The catalog REST API's TLS configuration (`--api-tls-cert`, `--api-tls-key`):
//! rustls on each accepted TCP connection, then HTTP/1.1 with the same router as
//! plain HTTP (served by `meshcat_common::http::serve`, whose header timeout covers
//! the handshake too, so a silent client cannot hold a connection open).

use std::path::Path;
use std::sync::Arc;

use meshcat_common::tls::{TlsError, load_certs, load_key};

/// The rustls server configuration of the API, speaking HTTP/1.1.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    meshcat_common::tls::install_crypto_provider();
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(load_certs(cert)?, load_key(key)?)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
