//! A sample upstream service: a real HTTP server on 127.0.0.1:0 that answers 200
//! `ok`, or the status named by `/status/{code}`, and counts what it served.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use tokio::sync::oneshot;

/// A running sample upstream; stops when dropped or on [`Upstream::stop`].
#[derive(Debug)]
pub struct Upstream {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Requests served so far.
    served: Arc<AtomicU64>,
    /// Fires the server's graceful stop.
    stop: Option<oneshot::Sender<()>>,
    /// The server task, awaited on stop so the port is really closed.
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Upstream {
    /// Starts on 127.0.0.1:0.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let served = Arc::new(AtomicU64::new(0));
        let app = Router::new()
            .route("/status/{code}", get(status))
            .fallback(get(|State(n): State<Arc<AtomicU64>>| async move {
                n.fetch_add(1, Ordering::Relaxed);
                "ok\n"
            }))
            .with_state(served.clone());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(Self {
            addr,
            served,
            stop: Some(tx),
            task: Some(task),
        })
    }

    /// Requests served so far.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Stops serving and closes the port and every connection (a dead upstream for
    /// the tests): once it returns, nothing answers, not even a connection a proxy's
    /// pool keeps alive. The graceful stop ends when the last connection has closed:
    /// at once here, as the handlers answer at once and the tests' clients send
    /// whole requests. Aborting the server instead left each connection's own task
    /// serving until it saw the stop, and a request sent right after `stop` could
    /// still be answered 200.
    pub async fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn status(State(n): State<Arc<AtomicU64>>, Path(code): Path<u16>) -> (StatusCode, String) {
    n.fetch_add(1, Ordering::Relaxed);
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST);
    (status, format!("status {code}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    const GET: &[u8] = b"GET / HTTP/1.1\r\nhost: upstream\r\n\r\n";

    /// A kept-alive connection (as Envoy's pool holds) answers nothing once `stop`
    /// has returned: a test that stops a service and then sends traffic sees only
    /// failures. Many rounds, as a late close shows only when the connection's task
    /// runs late (with both cores busy, the abort-based stop failed within 200).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_kept_alive_connection_answers_after_stop() {
        for round in 0..500 {
            let mut up = Upstream::start().await.unwrap();
            let mut conn = TcpStream::connect(up.addr).await.unwrap();
            conn.write_all(GET).await.unwrap();
            let mut answer = Vec::new();
            let mut buf = [0u8; 1024];
            while !answer.ends_with(b"\r\n\r\nok\n") {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed before the first answer");
                answer.extend_from_slice(&buf[..n]);
            }
            up.stop().await;
            // The write may land in the socket's buffer before the reset comes back.
            let _ = conn.write_all(GET).await;
            let n = conn.read(&mut buf).await.unwrap_or(0);
            assert_eq!(
                n,
                0,
                "round {round}: answered after stop: {}",
                String::from_utf8_lossy(&buf[..n])
            );
        }
    }
}
