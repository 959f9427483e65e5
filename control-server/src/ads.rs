//! The ADS service: state of the world here (one task per stream that answers
//! subscriptions from the node's snapshot, follows ACKs and NACKs by nonce, pushes
//! each subscribed type whose content changed, and answers again a request that
//! repeats an answered nonce: Envoy's way of asking anew for what it holds, as
//! when an updated cluster takes the same endpoints), Delta xDS in
//! [`crate::delta`] (unless turned off, when it answers UNIMPLEMENTED); and the
//! state shared by every stream (snapshots, held and overridden nodes, what each
//! node was sent and ACKed).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures::Stream;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::snapshot::{Resources, Snapshot, Subscription};
use crate::spec::{MeshSpec, SecretSpec};

/// What one node was sent and answered for one type URL.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TypeState {
    /// The version of the last response sent ("" before any).
    pub sent_version: String,
    /// The version of the last response ACKed ("" before any).
    pub acked_version: String,
    /// The `error_detail` message of the last NACK, if any.
    pub last_nack: Option<String>,
    /// Whether the last answer to a response of this type was a NACK.
    pub nacked: bool,
    /// The names the node last asked for (empty: all, for CDS and LDS).
    pub resource_names: Vec<String>,
}

/// One connected node: per type URL what it was sent, ACKed and NACKed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NodeState {
    /// `node.id` of the first request of its stream.
    pub id: String,
    /// `node.cluster` of that request.
    pub cluster: String,
    /// Held on the snapshot it had ([`crate::ControlServer::hold`]).
    pub held: bool,
    /// Served a spec of its own ([`crate::ControlServer::override_for`]).
    pub overridden: bool,
    /// Its (last opened) stream is incremental: `DeltaAggregatedResources`.
    pub delta: bool,
    /// By type URL.
    pub types: BTreeMap<String, TypeState>,
}

impl NodeState {
    /// The state of one type URL, if the node subscribed to it.
    pub fn get(&self, type_url: &str) -> Option<&TypeState> {
        self.types.get(type_url)
    }

    /// The version last ACKed for `type_url` ("" when none).
    pub fn acked(&self, type_url: &str) -> &str {
        self.get(type_url).map_or("", |t| t.acked_version.as_str())
    }

    /// The version last sent for `type_url` ("" when none).
    pub fn sent(&self, type_url: &str) -> &str {
        self.get(type_url).map_or("", |t| t.sent_version.as_str())
    }

    /// The last NACK's error detail for `type_url`.
    pub fn last_nack(&self, type_url: &str) -> Option<&str> {
        self.get(type_url).and_then(|t| t.last_nack.as_deref())
    }
}

/// A node as the server tracks it, connected or not.
#[derive(Debug, Default)]
pub(crate) struct NodeEntry {
    /// Open streams with this node id.
    streams: usize,
    pub(crate) state: NodeState,
    /// The snapshot its stream last answered from.
    pub(crate) served: Option<Arc<Snapshot>>,
}

/// Snapshots and nodes, under one lock.
#[derive(Debug)]
pub(crate) struct State {
    /// Versions handed out to the shared snapshot (by a new mesh or new secrets).
    pub(crate) set_count: u64,
    /// Versions handed out to overrides.
    pub(crate) override_count: u64,
    pub(crate) shared: Arc<Snapshot>,
    /// The secrets every snapshot serves (the shared one and the overrides).
    pub(crate) secrets: Vec<SecretSpec>,
    pub(crate) overrides: HashMap<String, Arc<Snapshot>>,
    /// Held nodes and the snapshot each is held on.
    pub(crate) pinned: HashMap<String, Arc<Snapshot>>,
    nodes: BTreeMap<String, NodeEntry>,
}

impl State {
    /// Publishes `spec` as the shared snapshot, with the secrets served now; returns
    /// its version.
    pub(crate) fn publish_mesh(&mut self, spec: &MeshSpec) -> String {
        self.set_count += 1;
        let version = self.set_count.to_string();
        self.shared = Arc::new(Snapshot::build(spec, version.clone()).with_secrets(&self.secrets));
        version
    }

    /// Serves `spec` to `node` instead of the shared snapshot (`None`: the shared one
    /// again).
    pub(crate) fn publish_override(&mut self, node: &str, spec: Option<&MeshSpec>) {
        match spec {
            Some(spec) => {
                self.override_count += 1;
                let version = format!("override-{}", self.override_count);
                let snapshot = Snapshot::build(spec, version).with_secrets(&self.secrets);
                self.overrides.insert(node.to_owned(), Arc::new(snapshot));
            }
            None => {
                self.overrides.remove(node);
            }
        }
    }

    /// Serves `secrets` (and no others) from the shared snapshot and every override,
    /// each under a new version; returns the shared snapshot's.
    pub(crate) fn publish_secrets(&mut self, secrets: Vec<SecretSpec>) -> String {
        self.secrets = secrets;
        self.set_count += 1;
        let version = self.set_count.to_string();
        self.shared = Arc::new(self.renewed(&self.shared, version.clone()));
        let nodes: Vec<String> = self.overrides.keys().cloned().collect();
        for node in nodes {
            self.override_count += 1;
            let version = format!("override-{}", self.override_count);
            let renewed = self.renewed(&self.overrides[&node], version);
            self.overrides.insert(node, Arc::new(renewed));
        }
        version
    }

    /// `snapshot` with the secrets served now, under `version`.
    fn renewed(&self, snapshot: &Snapshot, version: String) -> Snapshot {
        Snapshot {
            version,
            ..snapshot.clone()
        }
        .with_secrets(&self.secrets)
    }

    /// The snapshot `node` is served now.
    pub(crate) fn effective(&self, node: &str) -> Arc<Snapshot> {
        self.pinned
            .get(node)
            .or_else(|| self.overrides.get(node))
            .unwrap_or(&self.shared)
            .clone()
    }

    /// The snapshot `node` has now: the one its stream last answered from, else the
    /// one it would be served.
    pub(crate) fn current(&self, node: &str) -> Arc<Snapshot> {
        self.nodes
            .get(node)
            .and_then(|n| n.served.clone())
            .unwrap_or_else(|| self.effective(node))
    }

    pub(crate) fn connected_nodes(&self) -> Vec<NodeState> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.streams > 0)
            .map(|(id, n)| {
                let mut s = n.state.clone();
                s.held = self.pinned.contains_key(id);
                s.overridden = self.overrides.contains_key(id);
                s
            })
            .collect()
    }
}

/// The state every stream shares, and the signals they wait on.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<State>,
    /// Moves when any node's effective snapshot may have changed.
    pub(crate) snapshots: watch::Sender<u64>,
    /// Moves on every connect, disconnect, response, ACK and NACK.
    pub(crate) events: watch::Sender<u64>,
    /// Whether `DeltaAggregatedResources` is served (else UNIMPLEMENTED).
    delta: AtomicBool,
}

impl Shared {
    pub(crate) fn new(delta: bool) -> Self {
        Self {
            state: Mutex::new(State {
                set_count: 0,
                override_count: 0,
                shared: Arc::new(Snapshot::empty("0".to_owned())),
                secrets: Vec::new(),
                overrides: HashMap::new(),
                pinned: HashMap::new(),
                nodes: BTreeMap::new(),
            }),
            snapshots: watch::channel(0).0,
            events: watch::channel(0).0,
            delta: AtomicBool::new(delta),
        }
    }

    /// Whether new Delta xDS streams are served.
    pub(crate) fn delta(&self) -> bool {
        self.delta.load(Ordering::Relaxed)
    }

    pub(crate) fn set_delta(&self, on: bool) {
        self.delta.store(on, Ordering::Relaxed);
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves `secrets` (and no others) from every snapshot; returns the shared
    /// snapshot's new version.
    pub(crate) fn publish_secrets(&self, secrets: Vec<SecretSpec>) -> String {
        let count = secrets.len();
        let version = self.lock().publish_secrets(secrets);
        tracing::info!(%version, secrets = count, "secrets published");
        self.snapshots_changed();
        version
    }

    /// Tells every stream to look at its node's snapshot again.
    pub(crate) fn snapshots_changed(&self) {
        self.snapshots.send_modify(|v| *v += 1);
        self.event();
    }

    fn event(&self) {
        self.events.send_modify(|v| *v += 1);
    }

    pub(crate) fn with_node(&self, id: &str, f: impl FnOnce(&mut NodeEntry)) {
        let mut state = self.lock();
        if let Some(n) = state.nodes.get_mut(id) {
            f(n);
        }
        drop(state);
        self.event();
    }

    /// Notes a request of node `id` for `type_url`: the names it subscribes to and,
    /// when it answers a response, its ACK or NACK.
    pub(crate) fn note_request(
        &self,
        id: &str,
        type_url: &str,
        names: Vec<String>,
        answer: Option<Answer>,
    ) {
        self.with_node(id, |n| {
            let t = n.state.types.entry(type_url.to_owned()).or_default();
            t.resource_names = names;
            match answer {
                Some(Answer::Ack(version)) => {
                    t.acked_version = version;
                    t.nacked = false;
                }
                Some(Answer::Nack(message)) => {
                    t.last_nack = Some(message);
                    t.nacked = true;
                }
                None => {}
            }
        });
    }

    /// A stream of node `id` opened (`delta`: an incremental one).
    pub(crate) fn connect(&self, id: &str, cluster: &str, delta: bool) {
        let mut state = self.lock();
        let n = state.nodes.entry(id.to_owned()).or_default();
        if n.streams == 0 {
            n.state = NodeState {
                id: id.to_owned(),
                cluster: cluster.to_owned(),
                ..NodeState::default()
            };
            n.served = None;
        }
        n.state.delta = delta;
        n.streams += 1;
        drop(state);
        tracing::info!(node = %id, cluster = %cluster, delta, "node connected");
        self.event();
    }

    pub(crate) fn disconnect(&self, id: &str) {
        self.with_node(id, |n| n.streams = n.streams.saturating_sub(1));
        tracing::info!(node = %id, "node stream closed");
    }
}

/// The gRPC service of one run of the server.
#[derive(Debug, Clone)]
pub(crate) struct Ads {
    pub(crate) shared: Arc<Shared>,
    /// Cancelled when this run stops: every stream ends.
    pub(crate) cancel: CancellationToken,
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaStream = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ResponseStream;
    type DeltaAggregatedResourcesStream = DeltaStream;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        let stream = AdsStream {
            shared: self.shared.clone(),
            tx,
            node: None,
            node_cluster: String::new(),
            subs: BTreeMap::new(),
            nonces: 0,
        };
        tokio::spawn(run(stream, request.into_inner(), self.cancel.clone()));
        let out = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        Ok(Response::new(Box::pin(out)))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaStream>, Status> {
        if !self.shared.delta() {
            return Err(Status::unimplemented(
                "Delta xDS is turned off on this control server",
            ));
        }
        let (tx, rx) = mpsc::channel(16);
        let stream = crate::delta::DeltaStream::new(self.shared.clone(), tx);
        tokio::spawn(run(stream, request.into_inner(), self.cancel.clone()));
        let out = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        Ok(Response::new(Box::pin(out)))
    }
}

/// One type URL's subscription on one stream.
#[derive(Debug, Default)]
struct Sub {
    names: Subscription,
    /// The nonce of the last response of this type.
    nonce: String,
    /// What the last response carried.
    sent: Option<Resources>,
    /// The client answered the last response (ACK or NACK).
    answered: bool,
}

/// One ADS stream.
struct AdsStream {
    shared: Arc<Shared>,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    /// The node id, from the first request.
    node: Option<String>,
    /// Its `node.cluster`: which clusters it is served.
    node_cluster: String,
    subs: BTreeMap<String, Sub>,
    nonces: u64,
}

/// A client's answer to a response, as the node's state records it: an ACK of a
/// version, or a NACK with its message.
pub(crate) enum Answer {
    Ack(String),
    Nack(String),
}

/// One stream's protocol (state of the world, or Delta): what a request does, and a
/// new snapshot; [`run`] drives it until the stream ends.
pub(crate) trait Session: Send {
    type Request: prost::Message + Default + Send + 'static;
    type Response: Send;
    fn shared(&self) -> &Arc<Shared>;
    fn tx(&self) -> &mpsc::Sender<Result<Self::Response, Status>>;
    /// The node id, from the first request.
    fn node(&self) -> Option<&str>;
    /// Handles one request; false when the stream is gone.
    fn on_request(&mut self, req: Self::Request) -> impl Future<Output = bool> + Send;
    /// The type URLs the client subscribed to.
    fn types(&self) -> Vec<String>;
    /// Sends what the client lacks of `type_url`, when anything; false when the
    /// stream is gone.
    fn push(&mut self, id: &str, type_url: &str) -> impl Future<Output = bool> + Send;
    /// Pushes every subscribed type after a new snapshot; false when the stream is
    /// gone.
    fn push_all(&mut self) -> impl Future<Output = bool> + Send {
        async move {
            let Some(id) = self.node().map(str::to_owned) else {
                return true;
            };
            for t in self.types() {
                if !self.push(&id, &t).await {
                    return false;
                }
            }
            true
        }
    }
}

/// Serves one stream: its requests and the snapshots published meanwhile, until the
/// client goes, the server stops (UNAVAILABLE) or the stream breaks.
pub(crate) async fn run<S: Session>(
    mut session: S,
    mut inbound: Streaming<S::Request>,
    cancel: CancellationToken,
) {
    let mut snapshots = session.shared().snapshots.subscribe();
    loop {
        tokio::select! {
            () = cancel.cancelled() => {
                let _ = session.tx().send(Err(Status::unavailable("control server stopped"))).await;
                break;
            }
            () = session.tx().closed() => break,
            msg = inbound.message() => match msg {
                Ok(Some(req)) => {
                    if !session.on_request(req).await {
                        break;
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    tracing::debug!(node = ?session.node(), %status, "stream ended");
                    break;
                }
            },
            changed = snapshots.changed() => {
                if changed.is_err() || !session.push_all().await {
                    break;
                }
            }
        }
    }
    if let Some(id) = session.node() {
        session.shared().disconnect(id);
    }
}

impl Session for AdsStream {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;
    fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
    fn tx(&self) -> &mpsc::Sender<Result<DiscoveryResponse, Status>> {
        &self.tx
    }
    fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }
    fn on_request(&mut self, req: DiscoveryRequest) -> impl Future<Output = bool> + Send {
        AdsStream::on_request(self, req)
    }
    fn types(&self) -> Vec<String> {
        self.subs.keys().cloned().collect()
    }
    fn push(&mut self, id: &str, type_url: &str) -> impl Future<Output = bool> + Send {
        AdsStream::push(self, id, type_url)
    }
}

impl AdsStream {
    /// Handles one request; false when the stream is gone.
    async fn on_request(&mut self, req: DiscoveryRequest) -> bool {
        let id = match &self.node {
            Some(id) => id.clone(),
            None => {
                let node = req.node.clone().unwrap_or_default();
                self.shared.connect(&node.id, &node.cluster, false);
                self.node = Some(node.id.clone());
                self.node_cluster = node.cluster;
                node.id
            }
        };
        let type_url = req.type_url.clone();
        if type_url.is_empty() {
            return true;
        }
        let sub = self.subs.entry(type_url.clone()).or_default();
        if !req.response_nonce.is_empty() && req.response_nonce != sub.nonce {
            tracing::debug!(node = %id, type_url = %type_url, nonce = %req.response_nonce, "stale nonce ignored");
            return true;
        }
        sub.names = Subscription::from_request(&type_url, &req.resource_names);
        let names = req.resource_names.clone();
        let mut answer = None;
        if !req.response_nonce.is_empty() {
            if sub.answered {
                // The last response's nonce again, already answered: not an ACK but a
                // new request for what the client has (Envoy sends one when a new
                // watch takes a resource it holds, say the endpoints of an updated
                // cluster, and waits for an answer): send it again.
                sub.sent = None;
            } else {
                sub.answered = true;
                answer = Some(match &req.error_detail {
                    Some(error) => {
                        tracing::warn!(
                            node = %id,
                            type_url = %type_url,
                            version = %req.version_info,
                            nonce = %req.response_nonce,
                            error = %error.message,
                            "xDS update rejected (NACK)"
                        );
                        Answer::Nack(error.message.clone())
                    }
                    None => Answer::Ack(req.version_info.clone()),
                });
            }
        }
        self.shared.note_request(&id, &type_url, names, answer);
        self.push(&id, &type_url).await
    }

    /// Sends `type_url` when nothing was sent yet or its content differs from the
    /// last response; false when the stream is gone.
    async fn push(&mut self, id: &str, type_url: &str) -> bool {
        let snapshot = self.shared.lock().effective(id);
        let Some(sub) = self.subs.get_mut(type_url) else {
            return true;
        };
        let Some(selected) = snapshot.select(type_url, &sub.names, &self.node_cluster) else {
            tracing::debug!(node = %id, type_url = %type_url, "unknown type not answered");
            return true;
        };
        if sub.sent.as_ref() == Some(&selected) {
            return true;
        }
        self.nonces += 1;
        let nonce = self.nonces.to_string();
        let response = DiscoveryResponse {
            version_info: snapshot.version.clone(),
            resources: selected.values().cloned().collect(),
            type_url: type_url.to_owned(),
            nonce: nonce.clone(),
            ..Default::default()
        };
        sub.nonce = nonce;
        sub.sent = Some(selected);
        sub.answered = false;
        self.shared.with_node(id, |n| {
            n.state
                .types
                .entry(type_url.to_owned())
                .or_default()
                .sent_version = snapshot.version.clone();
            n.served = Some(snapshot.clone());
        });
        tracing::debug!(node = %id, type_url = %type_url, version = %snapshot.version, "response sent");
        self.tx.send(Ok(response)).await.is_ok()
    }
}
