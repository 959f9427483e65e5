//! The `meshcat-control-server` program: serves a JSON [`MeshSpec`] file over ADS
//! (state of the world, and Delta xDS unless `--no-delta`), re-reading it on SIGHUP
//! or when its modification time changes, with a small HTTP admin API (`GET
//! /nodes`, `POST /hold/{node}`, `POST /release/{node}`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use axum::Json;
use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::routing::{get, post};
use clap::Parser;
use meshcat_control_server::{ControlServer, MeshSpec, NodeState, ServerOptions, ServerTls};
use tokio::signal::unix::{SignalKind, signal};

/// A small xDS control server (ADS: state of the world and Delta xDS) for meshcat's
/// demo mesh and tests.
#[derive(Debug, Parser)]
#[command(name = "meshcat-control-server", version)]
struct Args {
    /// Address the ADS gRPC server listens on.
    #[arg(long, default_value = "127.0.0.1:18000")]
    listen: SocketAddr,
    /// The mesh to serve: a JSON MeshSpec ({"clusters": [...], "listeners": [...]}).
    /// Re-read on SIGHUP and when its modification time changes (checked every
    /// second); a file that does not parse is logged and the last good mesh kept.
    #[arg(long)]
    mesh: Option<PathBuf>,
    /// Address of the HTTP admin API: GET /nodes, POST /hold/{node}, POST
    /// /release/{node}. None when not given.
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// The server's certificate (PEM); with --tls-key, ADS is served over TLS.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The server certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// CA (PEM) that must have signed the clients' certificates (mTLS); needs
    /// --tls-cert and --tls-key.
    #[arg(long, requires = "tls_cert")]
    client_ca: Option<PathBuf>,
    /// Serve state-of-the-world ADS only: DeltaAggregatedResources answers
    /// UNIMPLEMENTED (clients that try Delta xDS first fall back).
    #[arg(long)]
    no_delta: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(ServerTls {
            cert_pem: read(cert)?,
            key_pem: read(key)?,
            client_ca_pem: args.client_ca.as_deref().map(read).transpose()?,
        }),
        _ => None,
    };
    let options = ServerOptions {
        delta: !args.no_delta,
    };
    let server = ControlServer::start_with(args.listen, tls, options).await?;
    if let Some(path) = &args.mesh {
        let spec = load(path)?;
        let version = server.set(spec);
        tracing::info!(file = %path.display(), %version, "mesh loaded");
        tokio::spawn(watch_mesh(server.clone(), path.clone()));
    }
    if let Some(addr) = args.admin {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (admin)"))?;
        tracing::info!(addr = %listener.local_addr()?, "admin API listening");
        let app = Router::new()
            .route("/nodes", get(nodes))
            .route("/hold/{node}", post(hold))
            .route("/release/{node}", post(release))
            .with_state(server.clone());
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "admin API failed");
            }
        });
    }
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    server.stop().await;
    Ok(())
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

fn load(path: &Path) -> anyhow::Result<MeshSpec> {
    serde_json::from_slice(&read(path)?)
        .with_context(|| format!("{} is not a mesh spec", path.display()))
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Publishes the mesh file again on SIGHUP and whenever its modification time moves.
async fn watch_mesh(server: ControlServer, path: PathBuf) {
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch SIGHUP");
            return;
        }
    };
    let mut seen = mtime(&path);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        let forced = tokio::select! {
            _ = hup.recv() => true,
            _ = tick.tick() => false,
        };
        let now = mtime(&path);
        if !forced && now == seen {
            continue;
        }
        seen = now;
        match load(&path) {
            Ok(spec) => {
                let version = server.set(spec);
                tracing::info!(file = %path.display(), %version, "mesh reloaded");
            }
            Err(e) => tracing::error!(
                error = format!("{e:#}"),
                "mesh not reloaded; the last one stays"
            ),
        }
    }
}

async fn nodes(State(server): State<ControlServer>) -> Json<Vec<NodeState>> {
    Json(server.nodes())
}

async fn hold(State(server): State<ControlServer>, UrlPath(node): UrlPath<String>) -> &'static str {
    server.hold(&node);
    "held\n"
}

async fn release(
    State(server): State<ControlServer>,
    UrlPath(node): UrlPath<String>,
) -> &'static str {
    server.release(&node);
    "released\n"
}
