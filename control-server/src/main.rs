//! The `meshcat-control-server` program: serves a JSON [`MeshSpec`] file over ADS
//! (state of the world, and Delta xDS unless `--no-delta`), re-reading it on SIGHUP
//! or when its modification time changes, with an identity issuer whose
//! certificates it serves over SDS and rotates, and a small HTTP admin API
//! ([`meshcat_control_server::admin`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use clap::Parser;
use meshcat_common::config::{EXIT_USAGE, duration_text, parse_positive_duration};
use meshcat_control_server::{
    Ca, ControlServer, DEFAULT_CA_SECRET, DEFAULT_LIFETIME, DEFAULT_ROTATE_AT,
    GENERATED_CA_LIFETIME, IdentitySpec, IssuerOptions, MeshSpec, ServerOptions, ServerTls,
};
use tokio::signal::unix::{SignalKind, signal};

/// A small xDS control server (ADS: state of the world and Delta xDS) for meshcat's
/// demo mesh and tests, with an identity issuer that serves certificates over SDS
/// and rotates them.
#[derive(Debug, Parser)]
#[command(name = "meshcat-control-server", version)]
struct Args {
    /// Address the ADS gRPC server listens on.
    #[arg(long, default_value = "127.0.0.1:18000")]
    listen: SocketAddr,
    /// The mesh to serve: a JSON MeshSpec ({"clusters": [...], "listeners": [...]};
    /// a cluster may carry "tls" and "node_clusters", see docs/control-plane.md).
    /// Re-read on SIGHUP and when its modification time changes (checked every
    /// second); a file that does not parse is logged and the last good mesh kept.
    #[arg(long)]
    mesh: Option<PathBuf>,
    /// Address of the HTTP admin API: GET /nodes, POST /hold/{node}, POST
    /// /release/{node}; GET /identities, POST /rotate, POST /rotate/{secret}, POST
    /// /issue/{secret}?lifetime=, POST /rotation/stop, POST /rotation/start. None
    /// when not given.
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
    /// An identity the issuer keeps a certificate for, served over SDS (ADS) under
    /// its secret name: SECRET=SAN,SAN,... A SAN with "://" is a URI (a SPIFFE id),
    /// an IP address an IP SAN, one with "@" an email, anything else a DNS name.
    /// Repeat for more identities.
    #[arg(long = "identity", value_name = "SECRET=SAN,...", value_parser = parse_identity)]
    identities: Vec<IdentitySpec>,
    /// Lifetime of each certificate rotation issues (whole seconds).
    #[arg(long, value_name = "DURATION", default_value = duration_text(DEFAULT_LIFETIME), value_parser = parse_positive_duration)]
    identity_lifetime: Duration,
    /// Fraction of its lifetime after which a certificate is replaced and the new
    /// one pushed to every Envoy that subscribes to it (above 0, below 1).
    #[arg(long, value_name = "FRACTION", default_value_t = DEFAULT_ROTATE_AT)]
    rotate_at: f64,
    /// The issuer's CA certificate (PEM), with --ca-key. Without them a CA (ECDSA
    /// P-256, valid one year) is generated at start.
    #[arg(long, requires = "ca_key")]
    ca_cert: Option<PathBuf>,
    /// The CA's private key (PKCS#8 PEM).
    #[arg(long, requires = "ca_cert")]
    ca_key: Option<PathBuf>,
    /// Name of the SDS secret (a validation context) that carries the CA.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_CA_SECRET)]
    ca_secret: String,
}

fn parse_identity(s: &str) -> Result<IdentitySpec, String> {
    s.parse().map_err(|e| format!("{e}"))
}

/// Parses the command line; a bad value exits with 64 and one line saying why.
fn args() -> Args {
    match Args::try_parse() {
        Ok(a) => a,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            std::process::exit(0);
        }
        Err(e) => usage(e.to_string().lines().next().unwrap_or("bad command line")),
    }
}

fn usage(why: &str) -> ! {
    eprintln!(
        "meshcat-control-server: {}",
        why.trim_start_matches("error: ")
    );
    std::process::exit(EXIT_USAGE)
}

/// The issuer's CA: read from --ca-cert and --ca-key, else generated.
fn ca(args: &Args) -> anyhow::Result<Ca> {
    Ok(match (&args.ca_cert, &args.ca_key) {
        (Some(cert), Some(key)) => {
            let text = |p: &Path| {
                String::from_utf8(read(p)?).with_context(|| format!("{} is not PEM", p.display()))
            };
            Ca::from_pem(&text(cert)?, &text(key)?)?
        }
        _ => Ca::generate("meshcat-control-server CA", GENERATED_CA_LIFETIME)?,
    })
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
    let args = args();
    let issuer_options = IssuerOptions {
        lifetime: args.identity_lifetime,
        rotate_at: args.rotate_at,
        ca_secret: args.ca_secret.clone(),
    };
    if let Err(e) = issuer_options
        .check()
        .and_then(|()| issuer_options.check_identities(&args.identities))
    {
        usage(&e.to_string());
    }
    let ca = ca(&args).unwrap_or_else(|e| usage(&format!("{e:#}")));
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
    let ca_info = ca.info().clone();
    let issuer = server
        .start_issuer(ca, issuer_options, args.identities.clone())
        .unwrap_or_else(|e| usage(&e.to_string()));
    tracing::info!(
        ca = %ca_info.subject,
        ca_serial = %ca_info.serial,
        ca_secret = %args.ca_secret,
        identities = issuer.state().identities.len(),
        "identity issuer started"
    );
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
        let app = meshcat_control_server::admin::router(server.clone());
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
