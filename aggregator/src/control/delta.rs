//! One Delta xDS session of a zone's stream (`DeltaAggregatedResources`): CDS and
//! LDS subscribed as wildcards, EDS and RDS by name, the names following the
//! clusters and listeners held (`resource_names_subscribe` /
//! `resource_names_unsubscribe`). Each response changes only what it names on the
//! held view (its resources upserted, its `removed_resources` taken away) and is
//! ACKed with its nonce; one that cannot be read or would take the view over a
//! bound is NACKed with the reason (`error_detail`, INVALID_ARGUMENT) and the last
//! good view kept. On a new connection the stream tells the server what it holds
//! (`initial_resource_versions`), so that only what changed meanwhile comes, and
//! what went away is removed. A server that answers the call with UNIMPLEMENTED
//! ends the session at once: the stream speaks state of the world to it.

use std::collections::BTreeSet;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use prost::Message;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tracing::{info, warn};

use super::decode::{self, DeltaResource, DeltaResponse, Kind};
use super::failure::Failure;
use super::stream::{DELTA, Protocol, Target, call, nack_detail, now_ms, wildcard};
use super::view::Held;
use super::zone::Zone;

/// How a Delta xDS session ended.
pub enum Outcome {
    /// The server does not offer Delta xDS: the call (or its stream, before any
    /// response) ended with UNIMPLEMENTED.
    Unimplemented(tonic::Status),
    /// The stream ended: whether it had a response, and why it ended.
    Ended(bool, Failure),
}

/// One type's subscription on this stream.
#[derive(Debug, Default)]
struct Sub {
    /// The names subscribed to (EDS and RDS).
    names: BTreeSet<String>,
    /// The first request of this type went out.
    started: bool,
}

/// A Delta xDS session on `channel`, until it ends.
pub async fn session(zone: &Zone, target: &Target, held: &mut Held, channel: Channel) -> Outcome {
    let (tx, rx) = mpsc::unbounded_channel::<DeltaDiscoveryRequest>();
    let requests =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
    let out = Sender {
        tx: &tx,
        node: &target.node,
    };
    let mut subs: [Sub; 4] = Default::default();
    for kind in Kind::ALL {
        let names = match kind {
            Kind::Endpoints => held.eds_names(),
            Kind::Routes => held.rds_names(),
            Kind::Clusters | Kind::Listeners => Vec::new(),
        };
        if wildcard(kind) || !names.is_empty() {
            out.first(kind, &mut subs[kind.index()], held, names);
        }
    }
    let mut inbound = match call::<_, DeltaResponse>(channel, target, DELTA, requests).await {
        Ok(r) => r,
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            return Outcome::Unimplemented(status);
        }
        Err(status) => return Outcome::Ended(false, Failure::of_status(&status)),
    };
    let mut connected = false;
    loop {
        let response = match inbound.message().await {
            Ok(Some(r)) => r,
            Ok(None) => {
                return Outcome::Ended(
                    connected,
                    Failure::unreachable("the control server closed the stream"),
                );
            }
            Err(status) if !connected && status.code() == tonic::Code::Unimplemented => {
                return Outcome::Unimplemented(status);
            }
            Err(status) => return Outcome::Ended(connected, Failure::of_status(&status)),
        };
        // Its resources, read one by one; one that does not decode ends the stream,
        // as a message that does not decode does.
        let read = match bodies(&response) {
            Ok(read) => read,
            Err(e) => {
                let failure = Failure::of_status(&tonic::Status::internal(e.to_string()));
                return Outcome::Ended(connected, failure);
            }
        };
        if !connected {
            connected = true;
            zone.up(now_ms(), Protocol::Delta.as_str());
            info!(zone = %zone.name, server = %target.record.server_address, protocol = "delta", "control server stream up");
        }
        handle(zone, target, held, &mut subs, &out, response, read);
    }
}

/// The bodies of a response's resources and their versions, in order; a resource
/// without a body only refreshes its TTL and is left out.
fn bodies(response: &DeltaResponse) -> Result<(Vec<Bytes>, Vec<String>), prost::DecodeError> {
    let mut bodies = Vec::with_capacity(response.resources.len());
    let mut versions = Vec::with_capacity(response.resources.len());
    for r in &response.resources {
        let r = DeltaResource::decode(r.clone())?;
        if let Some(body) = r.resource {
            decode::check_any(&body)?;
            bodies.push(body);
            versions.push(r.version);
        }
    }
    Ok((bodies, versions))
}

/// Applies one response onto the held view: ACKs it, or NACKs it with the reason;
/// subscribes EDS and RDS to the names the clusters and listeners now need.
fn handle(
    zone: &Zone,
    target: &Target,
    held: &mut Held,
    subs: &mut [Sub; 4],
    out: &Sender<'_>,
    response: DeltaResponse,
    (resources, versions): (Vec<Bytes>, Vec<String>),
) {
    let Some(kind) = Kind::of_url(&response.type_url) else {
        let reason = format!("a response of unknown type {:?}", response.type_url);
        warn!(zone = %zone.name, "NACK: {reason}");
        out.answer(response.type_url, response.nonce, Some(&reason));
        zone.refused(None, reason);
        return;
    };
    let now = now_ms();
    let bounds = target.bounds;
    drop(response.resources);
    let removed = &response.removed_resources;
    let result = match kind {
        Kind::Clusters => decode::clusters(&resources, bounds.max_clusters, bounds.max_endpoints)
            .and_then(|d| {
                let names: Vec<String> = d.iter().map(|c| c.name.clone()).collect();
                held.change_clusters(d, removed, bounds, now)
                    .map(|v| (v, names))
            }),
        Kind::Endpoints => {
            decode::load_assignments(&resources, bounds.max_endpoints).and_then(|a| {
                let names: Vec<String> = a.iter().map(|(n, _)| n.clone()).collect();
                held.change_endpoints(a, removed, bounds, now)
                    .map(|v| (v, names))
            })
        }
        Kind::Listeners => decode::listeners(&resources, bounds.max_clusters).and_then(|l| {
            let names: Vec<String> = l.iter().map(|l| l.name.clone()).collect();
            held.change_listeners(l, removed, bounds.max_clusters)
                .map(|v| (v, names))
        }),
        Kind::Routes => decode::route_configs(&resources, bounds.max_clusters).map(|r| {
            let names = r.clone();
            (held.change_routes(r, removed), names)
        }),
    };
    match result {
        Ok((view, names)) => {
            held.set_versions(kind, names.into_iter().zip(versions).collect(), removed);
            out.answer(kind.type_url().to_owned(), response.nonce, None);
            zone.accepted(kind, &response.system_version_info, view, now);
            let follow = match kind {
                Kind::Clusters => Some((Kind::Endpoints, held.eds_names())),
                Kind::Listeners => Some((Kind::Routes, held.rds_names())),
                _ => None,
            };
            if let Some((next, names)) = follow {
                out.follow(next, &mut subs[next.index()], held, names);
            }
        }
        Err(reason) => {
            let reason = format!(
                "NACKed {} version {:?}: {reason}",
                kind.label(),
                response.system_version_info
            );
            warn!(zone = %zone.name, "{reason}");
            out.answer(kind.type_url().to_owned(), response.nonce, Some(&reason));
            zone.refused(Some(kind), reason);
        }
    }
}

/// Puts requests on the stream.
struct Sender<'a> {
    tx: &'a mpsc::UnboundedSender<DeltaDiscoveryRequest>,
    node: &'a Node,
}

impl Sender<'_> {
    /// The first request of `kind`: a wildcard (CDS, LDS: no name) or `names`, with
    /// what the stream holds of the type.
    fn first(&self, kind: Kind, sub: &mut Sub, held: &Held, names: Vec<String>) {
        let initial = held.initial_versions(kind, &names);
        sub.started = true;
        self.send(DeltaDiscoveryRequest {
            node: Some(self.node.clone()),
            type_url: kind.type_url().to_owned(),
            resource_names_subscribe: names.clone(),
            initial_resource_versions: initial,
            ..DeltaDiscoveryRequest::default()
        });
        sub.names = names.into_iter().collect();
    }

    /// Subscribes `kind` to `names` (EDS, RDS): the first request, or the names
    /// added and those let go since the last one.
    fn follow(&self, kind: Kind, sub: &mut Sub, held: &mut Held, names: Vec<String>) {
        if !sub.started {
            if !names.is_empty() {
                self.first(kind, sub, held, names);
            }
            return;
        }
        let names: BTreeSet<String> = names.into_iter().collect();
        let subscribe: Vec<String> = names.difference(&sub.names).cloned().collect();
        let unsubscribe: Vec<String> = sub.names.difference(&names).cloned().collect();
        if subscribe.is_empty() && unsubscribe.is_empty() {
            return;
        }
        held.forget_versions(kind, &unsubscribe);
        self.send(DeltaDiscoveryRequest {
            node: Some(self.node.clone()),
            type_url: kind.type_url().to_owned(),
            resource_names_subscribe: subscribe,
            resource_names_unsubscribe: unsubscribe,
            ..DeltaDiscoveryRequest::default()
        });
        sub.names = names;
    }

    /// The ACK of the response `nonce` of `type_url`, or its NACK when `error` is
    /// given.
    fn answer(&self, type_url: String, nonce: String, error: Option<&str>) {
        self.send(DeltaDiscoveryRequest {
            node: Some(self.node.clone()),
            type_url,
            response_nonce: nonce,
            error_detail: error.map(nack_detail),
            ..DeltaDiscoveryRequest::default()
        });
    }

    fn send(&self, request: DeltaDiscoveryRequest) {
        // A closed stream shows as the inbound side's end.
        let _ = self.tx.send(request);
    }
}
