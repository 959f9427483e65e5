//! The incremental ADS service (Delta xDS, `DeltaAggregatedResources`): one task per
//! stream, answering from the same snapshots as state of the world, with the same
//! hold, release and override, and the same per-node bookkeeping (what was sent,
//! ACKed and NACKed per type).
//!
//! - CDS and LDS are wildcard when the first request of the type subscribes no name
//!   (or `*`); EDS and RDS are by name, changed with `resource_names_subscribe` and
//!   `resource_names_unsubscribe`.
//! - Each resource's version is a hash of its encoded bytes
//!   ([`resource_version`]). A response carries only the resources the client does
//!   not have at that version and, in `removed_resources`, the ones it has that the
//!   snapshot no longer holds for its subscription; the first request's
//!   `initial_resource_versions` say what the client has already. The first request
//!   of each type is always answered, if only with nothing.
//! - One response per type is outstanding at a time: the next is built once the
//!   client answered. An ACK moves what the client has on; a NACK (`error_detail`)
//!   puts it back to what it was before that response, and the same snapshot is not
//!   sent again until the node's snapshot or its subscription changes. A name
//!   subscribed again is sent again, and so are the endpoints of a cluster a
//!   response updates (Envoy warms the updated cluster until they come, and does
//!   not ask for them again).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::Any;
use tokio::sync::mpsc;
use tonic::Status;

use crate::ads::{Answer, Session, Shared};
use crate::snapshot::{Snapshot, resource_version, type_url};

/// One type URL's subscription on one stream.
#[derive(Debug, Default)]
struct Sub {
    /// Every resource of the type (CDS and LDS only).
    wildcard: bool,
    /// The names subscribed to by name.
    names: BTreeSet<String>,
    /// What the client has: name and version, as of the responses sent.
    known: BTreeMap<String, String>,
    /// The response awaiting the client's answer.
    pending: Option<Pending>,
    /// The snapshot of the last NACKed response, until a change makes it worth
    /// another try.
    refused: Option<Arc<Snapshot>>,
    /// A response of this type was sent on this stream.
    answered: bool,
}

/// A response awaiting its ACK or NACK.
#[derive(Debug)]
struct Pending {
    nonce: String,
    snapshot: Arc<Snapshot>,
    /// How to put `known` back as it was before the response: per name its earlier
    /// version (`None`: it was not known), in the order they were changed.
    undo: Vec<(String, Option<String>)>,
}

/// One Delta xDS stream.
pub(crate) struct DeltaStream {
    shared: Arc<Shared>,
    tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    /// The node id, from the first request.
    node: Option<String>,
    /// Its `node.cluster`: which clusters it is served.
    node_cluster: String,
    subs: BTreeMap<String, Sub>,
    nonces: u64,
}

impl Session for DeltaStream {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;
    fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
    fn tx(&self) -> &mpsc::Sender<Result<DeltaDiscoveryResponse, Status>> {
        &self.tx
    }
    fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }
    fn on_request(&mut self, req: DeltaDiscoveryRequest) -> impl Future<Output = bool> + Send {
        DeltaStream::on_request(self, req)
    }
    fn types(&self) -> Vec<String> {
        self.subs.keys().cloned().collect()
    }
    fn push(&mut self, id: &str, type_url: &str) -> impl Future<Output = bool> + Send {
        DeltaStream::push(self, id, type_url)
    }
}

impl DeltaStream {
    pub(crate) fn new(
        shared: Arc<Shared>,
        tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    ) -> Self {
        Self {
            shared,
            tx,
            node: None,
            node_cluster: String::new(),
            subs: BTreeMap::new(),
            nonces: 0,
        }
    }

    /// Handles one request; false when the stream is gone.
    async fn on_request(&mut self, req: DeltaDiscoveryRequest) -> bool {
        let id = match &self.node {
            Some(id) => id.clone(),
            None => {
                let node = req.node.clone().unwrap_or_default();
                self.shared.connect(&node.id, &node.cluster, true);
                self.node = Some(node.id.clone());
                self.node_cluster = node.cluster;
                node.id
            }
        };
        let type_url = req.type_url.clone();
        if type_url.is_empty() {
            return true;
        }
        let first = !self.subs.contains_key(&type_url);
        let sub = self.subs.entry(type_url.clone()).or_default();

        // The answer to the outstanding response, if this is one.
        let mut answer = None;
        if !req.response_nonce.is_empty() {
            match sub.pending.take() {
                Some(p) if p.nonce == req.response_nonce => match &req.error_detail {
                    None => answer = Some(Answer::Ack(p.snapshot.version.clone())),
                    Some(error) => {
                        for (name, earlier) in p.undo.into_iter().rev() {
                            match earlier {
                                Some(v) => sub.known.insert(name, v),
                                None => sub.known.remove(&name),
                            };
                        }
                        tracing::warn!(
                            node = %id,
                            type_url = %type_url,
                            version = %p.snapshot.version,
                            nonce = %req.response_nonce,
                            error = %error.message,
                            "xDS update rejected (delta NACK)"
                        );
                        sub.refused = Some(p.snapshot);
                        answer = Some(Answer::Nack(error.message.clone()));
                    }
                },
                other => {
                    sub.pending = other;
                    tracing::debug!(node = %id, type_url = %type_url, nonce = %req.response_nonce, "stale nonce ignored");
                }
            }
        }

        // The subscription.
        let wildcard_type = type_url::is_wildcard_type(&type_url);
        let mut changed = false;
        if first {
            sub.wildcard = wildcard_type
                && (req.resource_names_subscribe.is_empty()
                    || req.resource_names_subscribe.iter().any(|n| n == "*"));
            sub.known = req.initial_resource_versions.into_iter().collect();
            changed = true;
        }
        for name in req.resource_names_subscribe {
            if name == "*" {
                changed |= wildcard_type && !sub.wildcard;
                sub.wildcard |= wildcard_type;
            } else if sub.names.insert(name.clone()) {
                changed = true;
            } else if !first {
                // Subscribed again: the client wants it sent again (Envoy does so
                // when a new watch takes a resource it holds, say the endpoints of
                // an updated cluster, and waits for it).
                sub.known.remove(&name);
                changed = true;
            }
        }
        for name in &req.resource_names_unsubscribe {
            if name == "*" {
                changed |= sub.wildcard;
                sub.wildcard = false;
            } else if sub.names.remove(name) {
                changed = true;
                if !sub.wildcard {
                    // The client lets go of it: nothing to remove later.
                    sub.known.remove(name);
                }
            }
        }
        if changed {
            sub.refused = None;
        }

        let names: Vec<String> = sub.names.iter().cloned().collect();
        self.shared.note_request(&id, &type_url, names, answer);
        self.push(&id, &type_url).await
    }

    /// Sends what the client lacks of `type_url` and what it has that is gone, when
    /// there is any (or nothing was sent yet) and no response is outstanding; false
    /// when the stream is gone.
    async fn push(&mut self, id: &str, type_url: &str) -> bool {
        let snapshot = self.shared.lock().effective(id);
        let Some(sub) = self.subs.get_mut(type_url) else {
            return true;
        };
        if sub.pending.is_some()
            || sub
                .refused
                .as_ref()
                .is_some_and(|r| Arc::ptr_eq(r, &snapshot))
        {
            return true;
        }
        let Some(all) = snapshot.resources.get(type_url) else {
            tracing::debug!(node = %id, type_url = %type_url, "unknown type not answered");
            return true;
        };
        let node_cluster = &self.node_cluster;
        let selected: Vec<(&String, &Any)> = if sub.wildcard {
            all.iter().collect()
        } else {
            sub.names
                .iter()
                .filter_map(|n| all.get_key_value(n))
                .collect()
        };
        let selected: Vec<(&String, &Any)> = selected
            .into_iter()
            .filter(|(n, _)| snapshot.serves(type_url, n, node_cluster))
            .collect();
        let mut resources = Vec::new();
        let mut undo = Vec::new();
        let mut present = BTreeSet::new();
        // Clusters the client has that this response changes.
        let mut updated = Vec::new();
        for (name, any) in selected {
            present.insert(name.as_str());
            let version = resource_version(any);
            if sub.known.get(name) == Some(&version) {
                continue;
            }
            resources.push(Resource {
                name: name.clone(),
                version: version.clone(),
                resource: Some(any.clone()),
                ..Default::default()
            });
            let earlier = sub.known.insert(name.clone(), version);
            if type_url == type_url::CLUSTER && earlier.is_some() {
                updated.push(name.clone());
            }
            undo.push((name.clone(), earlier));
        }
        let removed: Vec<String> = sub
            .known
            .keys()
            .filter(|n| !present.contains(n.as_str()))
            .cloned()
            .collect();
        for name in &removed {
            undo.push((name.clone(), sub.known.remove(name)));
        }
        if resources.is_empty() && removed.is_empty() && sub.answered {
            return true;
        }
        self.nonces += 1;
        let nonce = self.nonces.to_string();
        let (upserts, removals) = (resources.len(), removed.len());
        let response = DeltaDiscoveryResponse {
            system_version_info: snapshot.version.clone(),
            resources,
            type_url: type_url.to_owned(),
            removed_resources: removed,
            nonce: nonce.clone(),
            ..Default::default()
        };
        sub.pending = Some(Pending {
            nonce,
            snapshot: snapshot.clone(),
            undo,
        });
        sub.answered = true;
        self.shared.with_node(id, |n| {
            n.state
                .types
                .entry(type_url.to_owned())
                .or_default()
                .sent_version = snapshot.version.clone();
            n.served = Some(snapshot.clone());
        });
        // An updated cluster waits for its endpoints anew (Envoy does not ask for
        // them again over Delta xDS): send them again, after this response.
        if let Some(eds) = self.subs.get_mut(type_url::ENDPOINT) {
            for name in &updated {
                eds.known.remove(name);
            }
        }
        tracing::debug!(
            node = %id,
            type_url = %type_url,
            version = %snapshot.version,
            upserts,
            removals,
            "delta response sent"
        );
        self.tx.send(Ok(response)).await.is_ok()
    }
}
