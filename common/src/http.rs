//! Serving HTTP/1.1 with the bounds every meshcat listener keeps (contract section
//! 10): the aggregator's API (plain or TLS) and ops port, and the agent's ops port.
//!
//! - A connection that has not sent a whole request head within the header timeout
//!   is closed: a TLS handshake and each request head have that long, and so has an
//!   idle keep-alive connection to start its next request.
//! - At most `max_connections` connections are served at once. Past it the listener
//!   accepts no more until one ends: new ones wait in the kernel's backlog (and are
//!   refused by the kernel when that is full); nothing is read from them meanwhile.
//! - An accept that fails for want of a resource (descriptors, memory) pauses the
//!   loop briefly instead of spinning on the error, then goes on accepting; an accept
//!   error of one connection (reset before it was accepted) is skipped.

use std::convert::Infallible;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use hyper::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

/// Time a connection has to send a whole request head (`--header-timeout`).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once by one listener (`--max-connections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Pause after an accept failed for want of a resource.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The bounds of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    pub header_timeout: Duration,
    pub max_connections: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// The flags of [`ServerLimits`], for both binaries' command lines.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerLimitArgs {
    /// Close an HTTP connection that has not sent a whole request head (and TLS
    /// handshake) within this time; an idle keep-alive connection too.
    #[arg(
        long,
        env = "MESHCAT_HEADER_TIMEOUT",
        default_value = "10s",
        value_parser = crate::config::parse_positive_duration,
        value_name = "DURATION"
    )]
    pub header_timeout: Duration,
    /// Most HTTP connections each listener serves at once; past it new ones wait
    /// in the kernel's backlog until one ends.
    #[arg(
        long,
        env = "MESHCAT_MAX_CONNECTIONS",
        default_value_t = 4096,
        value_parser = clap::value_parser!(u32).range(1..=1_000_000),
        value_name = "N"
    )]
    pub max_connections: u32,
}

impl ServerLimitArgs {
    pub fn limits(&self) -> ServerLimits {
        ServerLimits {
            header_timeout: self.header_timeout,
            max_connections: self.max_connections as usize,
        }
    }
}

/// Whether an accept error is about one connection (skip it) rather than a shortage
/// of the process or the system (pause before the next accept).
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    ) || e.raw_os_error() == Some(libc::EPROTO)
}

/// What [`serve`] serves: an axum `Router`, or a service in front of one.
pub trait App:
    tower::Service<
        Request<Incoming>,
        Response = Response,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S> App for S where
    S: tower::Service<
            Request<Incoming>,
            Response = Response,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// Serves `app` on `listener` (over TLS when `tls` is given) until `stop` turns
/// true; connections in progress then finish their current request, and this
/// returns once they have.
pub async fn serve<S>(
    listener: TcpListener,
    app: S,
    limits: ServerLimits,
    tls: Option<TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
) -> io::Result<()>
where
    S: App,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut connections = tokio::task::JoinSet::new();
    let mut shortage_logged = false;
    loop {
        // A slot first: past the bound, nothing more is accepted.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = stopped(&mut stop) => break,
        };
        let (tcp, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) if is_connection_error(&e) => {
                    debug!(error = %e, "Accept failed for one connection.");
                    continue;
                }
                Err(e) => {
                    // Out of descriptors and the like: the listener is fine, the
                    // process is short. Say so once per shortage, and wait a little
                    // for connections to end rather than spin on the error.
                    if !shortage_logged {
                        warn!(error = %e, addr = ?listener.local_addr().ok(), "Accept failed; pausing before the next one.");
                        shortage_logged = true;
                    }
                    tokio::select! {
                        () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                        () = stopped(&mut stop) => break,
                    }
                }
            },
            () = stopped(&mut stop) => break,
        };
        shortage_logged = false;
        let app = app.clone();
        let tls = tls.clone();
        let stop = stop.clone();
        connections.spawn(async move {
            let _slot = slot;
            match tls {
                None => serve_connection(TokioIo::new(tcp), app, limits, remote, stop).await,
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(limits.header_timeout, acceptor.accept(tcp)).await;
                    match handshake {
                        Ok(Ok(stream)) => {
                            serve_connection(TokioIo::new(stream), app, limits, remote, stop).await;
                        }
                        Ok(Err(e)) => debug!(%remote, error = %e, "TLS handshake failed."),
                        Err(_) => debug!(%remote, "TLS handshake timed out."),
                    }
                }
            }
        });
        // Reap finished connections so the set does not grow.
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

async fn serve_connection<I, S>(
    io: I,
    app: S,
    limits: ServerLimits,
    remote: std::net::SocketAddr,
    mut stop: watch::Receiver<bool>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: App,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(io, TowerToHyperService::new(app));
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                debug!(%remote, error = %e, "Connection ended with an error.");
            }
        }
        () = stopped(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Whether a request's `Accept-Encoding` accepts gzip: a `gzip` coding (any case)
/// not refused with `q=0`.
pub fn accepts_gzip(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let coding = parts.next().unwrap_or("");
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    == Some(0.0)
            });
            coding.eq_ignore_ascii_case("gzip") && !refused
        })
}

/// Resolves once the stop signal is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_is_accepted_unless_absent_or_refused() {
        let with = |values: &[&str]| {
            let mut h = axum::http::HeaderMap::new();
            for v in values {
                h.append(
                    axum::http::header::ACCEPT_ENCODING,
                    axum::http::HeaderValue::from_str(v).unwrap(),
                );
            }
            accepts_gzip(&h)
        };
        assert!(with(&["gzip"]));
        assert!(with(&["br, GZIP;q=0.5"]));
        assert!(with(&["identity", "deflate, gzip"]));
        assert!(!with(&[]));
        assert!(!with(&["br, deflate"]));
        assert!(!with(&["gzip;q=0"]));
        assert!(!with(&["gzip; q= 0.0"]));
        assert!(!with(&["x-gzip"]));
    }
}
