//! Serving the catalog REST API over TLS (`--api-tls-cert`, `--api-tls-key`): rustls
//! on each accepted TCP connection, then HTTP/1.1 with the same router as plain HTTP.
//! A handshake has a deadline, so a silent client cannot hold a connection open.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::debug;

use meshcat_common::tls::{TlsError, load_certs, load_key};

/// Time a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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

/// Serves `app` over TLS on `listener` until `stop` turns true; connections in
/// progress then finish their current request.
pub async fn serve(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    app: Router,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let acceptor = TlsAcceptor::from(config);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (tcp, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: the listener itself is fine.
                    debug!(error = %e, "API accept failed.");
                    continue;
                }
            },
            () = stopped(&mut stop) => break,
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        let mut stop = stop.clone();
        connections.spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    debug!(%remote, error = %e, "API TLS handshake failed.");
                    return;
                }
                Err(_) => {
                    debug!(%remote, "API TLS handshake timed out.");
                    return;
                }
            };
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                // A slow client cannot hold the connection with a half-sent head.
                .header_read_timeout(HANDSHAKE_TIMEOUT)
                .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app));
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        debug!(%remote, error = %e, "API connection ended with an error.");
                    }
                }
                () = stopped(&mut stop) => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
        // Reap finished connections so the set does not grow.
        while connections.try_join_next().is_some() {}
    }
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Resolves once the stop signal is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
