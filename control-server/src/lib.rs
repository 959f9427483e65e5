//! A small xDS control server (ADS: state of the world, and Delta xDS unless turned
//! off) for meshcat's tests and its one-machine demo mesh: it serves real Envoy
//! sidecars and meshcat's own xDS client one shared [`MeshSpec`] snapshot, lets a
//! test hold a node on its old snapshot, serve one node a spec of its own, stop and
//! restart the server, and see per node what was sent, ACKed and NACKed, over
//! either protocol alike. Its identity issuer ([`ControlServer::start_issuer`])
//! serves workload certificates and their CA over SDS from the same snapshots and
//! rotates them; clusters name them in their TLS ([`UpstreamTlsSpec`]). The HTTP
//! admin API is [`admin::router`].
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use meshcat_control_server::{ClusterSpec, ControlServer, EndpointSpec, MeshSpec};
//! let server = ControlServer::start("127.0.0.1:0".parse()?, None).await?;
//! let version = server.set(MeshSpec {
//!     clusters: vec![ClusterSpec::new("orders", vec![EndpointSpec::new("127.0.0.1", 8080)])],
//!     listeners: vec![],
//! });
//! assert_eq!(version, "1");
//! # Ok(()) }
//! ```

pub mod admin;
mod ads;
mod delta;
mod identity;
mod snapshot;
mod spec;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

pub use ads::{NodeState, TypeState};
pub use identity::{
    Ca, CaInfo, CaState, DEFAULT_CA_SECRET, DEFAULT_LIFETIME, DEFAULT_ROTATE_AT,
    GENERATED_CA_LIFETIME, IdentityError, IdentityIssuer, IdentitySpec, IdentityState,
    IssuedCertificate, IssuerOptions, IssuerState, Rotation, San,
};
pub use snapshot::{Resources, Snapshot, Subscription, resource_version, type_url};
pub use spec::{
    CaSpec, ClusterSpec, DEFAULT_CONNECT_TIMEOUT_MS, EndpointSpec, Health, ListenerSpec, MeshSpec,
    RouteSpec, SanMatcherSpec, SanType, SecretKind, SecretSpec, StringMatch, UpstreamTlsSpec,
};

use ads::{Ads, Shared};

/// The largest request the server decodes.
const MAX_MESSAGE: usize = 64 * 1024 * 1024;
/// How long `stop` waits for connections to close before dropping them.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// How long `restart` retries binding the address it had.
const REBIND_DEADLINE: Duration = Duration::from_secs(5);

/// The server's certificate and key (PEM); with `client_ca_pem`, clients must
/// present a certificate it signed (mTLS).
#[derive(Clone)]
pub struct ServerTls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub client_ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .field("client_ca", &self.client_ca_pem.is_some())
            .finish()
    }
}

/// How a control server serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerOptions {
    /// Serve `DeltaAggregatedResources` (incremental ADS) beside
    /// `StreamAggregatedResources`; false: it answers UNIMPLEMENTED, as a server
    /// that speaks state of the world only does.
    pub delta: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self { delta: true }
    }
}

/// A running control server; a cheap handle (clones share the server). It stops
/// when the last handle is dropped.
#[derive(Debug, Clone)]
pub struct ControlServer {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tls: Option<ServerTls>,
    run: tokio::sync::Mutex<Option<Run>>,
    /// The identity issuer whose secrets it serves, once started (one at most).
    issuer: std::sync::Mutex<Option<IdentityIssuer>>,
}

/// One run of the gRPC server, from `start` or `restart` to `stop`.
#[derive(Debug)]
struct Run {
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(run) = self.run.get_mut().take() {
            run.cancel.cancel();
        }
    }
}

impl ControlServer {
    /// Binds `listen` (port 0 picks one) and serves ADS on it in a task, with TLS
    /// when `tls` is given, Delta xDS included. Until [`ControlServer::set`] the
    /// snapshot is empty (version "0").
    pub async fn start(listen: SocketAddr, tls: Option<ServerTls>) -> anyhow::Result<Self> {
        Self::start_with(listen, tls, ServerOptions::default()).await
    }

    /// [`ControlServer::start`] with `options`.
    pub async fn start_with(
        listen: SocketAddr,
        tls: Option<ServerTls>,
        options: ServerOptions,
    ) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(options.delta));
        let run = serve(listener, tls.as_ref(), &shared)?;
        tracing::info!(%addr, tls = tls.is_some(), delta = options.delta, "control server listening");
        Ok(Self {
            inner: Arc::new(Inner {
                shared,
                addr,
                tls,
                run: tokio::sync::Mutex::new(Some(run)),
                issuer: std::sync::Mutex::new(None),
            }),
        })
    }

    /// The address it serves on.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Turns Delta xDS on or off for the streams opened from now on (open ones
    /// go on); off, `DeltaAggregatedResources` answers UNIMPLEMENTED.
    pub fn set_delta(&self, on: bool) {
        self.inner.shared.set_delta(on);
        tracing::info!(delta = on, "delta xDS switched");
    }

    /// Whether new Delta xDS streams are served.
    pub fn delta(&self) -> bool {
        self.inner.shared.delta()
    }

    /// Publishes `spec` as the shared snapshot and returns its version ("1", "2",
    /// ...). Every connected node that is neither held nor overridden gets each type
    /// whose content changed.
    pub fn set(&self, spec: MeshSpec) -> String {
        let version = self.inner.shared.lock().publish_mesh(&spec);
        tracing::info!(%version, "snapshot published");
        self.inner.shared.snapshots_changed();
        version
    }

    /// Serves `secrets` (and no others) over SDS from now on, from the shared
    /// snapshot and every node's own spec, and returns the shared snapshot's new
    /// version. Nodes ask for secrets by name; a subscribed node gets the secrets it
    /// asked for whose content changed. A held node keeps the secrets it had.
    pub fn set_secrets(&self, secrets: Vec<SecretSpec>) -> String {
        self.inner.shared.publish_secrets(secrets)
    }

    /// Starts the server's identity issuer: `ca` issues a certificate for each of
    /// `identities`, served over SDS under its secret name beside the CA (a
    /// validation context secret named `options.ca_secret`), and rotates them. The
    /// issuer owns the server's secrets from then on ([`ControlServer::set_secrets`]
    /// would be overwritten at the next rotation). One issuer per server: a second
    /// call is an error. Needs a Tokio runtime.
    pub fn start_issuer(
        &self,
        ca: Ca,
        options: IssuerOptions,
        identities: Vec<IdentitySpec>,
    ) -> Result<IdentityIssuer, IdentityError> {
        let mut slot = self.inner.issuer.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return Err(IdentityError::BadOptions(
                "this control server has an identity issuer already".into(),
            ));
        }
        let issuer = IdentityIssuer::start(self.inner.shared.clone(), ca, options, identities)?;
        *slot = Some(issuer.clone());
        Ok(issuer)
    }

    /// The identity issuer, once started.
    pub fn issuer(&self) -> Option<IdentityIssuer> {
        self.inner
            .issuer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The version of the shared snapshot ("0" before any `set`).
    pub fn version(&self) -> String {
        self.inner.shared.lock().shared.version.clone()
    }

    /// Keeps `node_id` on the snapshot it has now: it gets nothing newer until
    /// [`ControlServer::release`].
    pub fn hold(&self, node_id: &str) {
        let mut state = self.inner.shared.lock();
        let current = state.current(node_id);
        state.pinned.insert(node_id.to_owned(), current);
        drop(state);
        tracing::info!(node = %node_id, "node held");
        self.inner.shared.snapshots_changed();
    }

    /// Lets a held node catch up at once.
    pub fn release(&self, node_id: &str) {
        let removed = self.inner.shared.lock().pinned.remove(node_id).is_some();
        if removed {
            tracing::info!(node = %node_id, "node released");
            self.inner.shared.snapshots_changed();
        }
    }

    /// `Some`: `node_id` is served `spec` instead of the shared snapshot (under a
    /// version `override-N`); `None`: back to the shared one. A held node stays held.
    pub fn override_for(&self, node_id: &str, spec: Option<MeshSpec>) {
        self.inner
            .shared
            .lock()
            .publish_override(node_id, spec.as_ref());
        self.inner.shared.snapshots_changed();
    }

    /// Closes the listener and every stream (clients see the connection drop) and
    /// waits until the server is down. Stopping a stopped server does nothing.
    pub async fn stop(&self) {
        let Some(run) = self.inner.run.lock().await.take() else {
            return;
        };
        run.cancel.cancel();
        let mut task = run.task;
        if tokio::time::timeout(STOP_GRACE, &mut task).await.is_err() {
            task.abort();
            let _ = task.await;
        }
        tracing::info!(addr = %self.inner.addr, "control server stopped");
    }

    /// Serves again on the same address with the same snapshots (stopping first if
    /// it is running).
    pub async fn restart(&self) -> anyhow::Result<()> {
        self.stop().await;
        let mut run = self.inner.run.lock().await;
        let deadline = tokio::time::Instant::now() + REBIND_DEADLINE;
        let listener = loop {
            match TcpListener::bind(self.inner.addr).await {
                Ok(l) => break l,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "address not free yet");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot listen on {}", self.inner.addr));
                }
            }
        };
        *run = Some(serve(
            listener,
            self.inner.tls.as_ref(),
            &self.inner.shared,
        )?);
        tracing::info!(addr = %self.inner.addr, "control server listening again");
        Ok(())
    }

    /// Whether it is serving (started or restarted, not stopped).
    pub async fn is_running(&self) -> bool {
        self.inner.run.lock().await.is_some()
    }

    /// Every connected node: per type URL the last version sent, the last version
    /// ACKed and the last NACK's error detail (over state of the world and Delta
    /// xDS alike; for Delta, a version is the snapshot's `system_version_info`).
    pub fn nodes(&self) -> Vec<NodeState> {
        self.inner.shared.lock().connected_nodes()
    }

    /// One connected node.
    pub fn node(&self, node_id: &str) -> Option<NodeState> {
        self.nodes().into_iter().find(|n| n.id == node_id)
    }

    /// Waits until `f(nodes())` holds, looking again on every connect, disconnect,
    /// response, ACK and NACK; an error after `timeout` names what the nodes were.
    pub async fn wait_until(
        &self,
        f: impl Fn(&[NodeState]) -> bool,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let mut events = self.inner.shared.events.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            events.borrow_and_update();
            let nodes = self.nodes();
            if f(&nodes) {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, events.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => anyhow::bail!(
                    "condition on the control server's nodes not met within {timeout:?}; nodes: {}",
                    serde_json::to_string(&nodes).unwrap_or_default()
                ),
            }
        }
    }
}

/// Serves ADS on `listener` until the returned run is cancelled.
fn serve(
    listener: TcpListener,
    tls: Option<&ServerTls>,
    shared: &Arc<Shared>,
) -> anyhow::Result<Run> {
    let cancel = CancellationToken::new();
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        let mut config =
            ServerTlsConfig::new().identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem));
        if let Some(ca) = &tls.client_ca_pem {
            config = config.client_ca_root(Certificate::from_pem(ca));
        }
        builder = builder.tls_config(config).context("TLS configuration")?;
    }
    let service = AggregatedDiscoveryServiceServer::new(Ads {
        shared: shared.clone(),
        cancel: cancel.clone(),
    })
    .max_decoding_message_size(MAX_MESSAGE);
    // The listener is dropped (closed) as soon as the run is cancelled.
    let incoming = futures::stream::unfold((listener, cancel.clone()), |(l, c)| async move {
        let conn = tokio::select! {
            () = c.cancelled() => return None,
            conn = l.accept() => conn,
        };
        let conn = conn.map(|(stream, _)| {
            let _ = stream.set_nodelay(true);
            stream
        });
        Some((conn, (l, c)))
    });
    let router = builder.add_service(service);
    let signal = cancel.clone().cancelled_owned();
    let task = tokio::spawn(async move {
        if let Err(e) = router.serve_with_incoming_shutdown(incoming, signal).await {
            tracing::error!(error = %e, "control server failed");
        }
    });
    Ok(Run { cancel, task })
}
