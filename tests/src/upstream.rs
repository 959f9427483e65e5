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

    /// Stops serving and closes the port (a dead upstream for the tests).
    pub async fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
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
