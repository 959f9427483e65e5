//! What one replica tells about itself (`GET /status`, read by `meshcat check`): its
//! version, whether it is ready, who reports each zone's instances, the agent
//! rejections of the last minutes, and what the caller's token grants.
//!
//! With replicas on etcd every replica answers for itself: its own readiness, the
//! agents connected to it and the rejections it made; the instances other replicas'
//! agents report show in `peerInstances` (from what those replicas publish in etcd),
//! so a zone whose agents all report to another replica still shows as reported.

use std::time::Instant;

use serde::Serialize;
use utoipa::ToSchema;

use crate::ingest::Agents;
use crate::ingest::RECENT_REJECTIONS;
use crate::peer_signature::Access;
use crate::store::{Instances, Store, ZoneReporters};

/// The answer of `GET /status`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    /// The aggregator's version.
    pub version: String,
    /// This replica's id among the replicas sharing etcd; null with the embedded store.
    pub replica: Option<String>,
    /// `redb` (one aggregator) or `etcd` (replicas).
    pub store: StoreKind,
    /// The catalog is loaded and the process is not stopping: what `/readyz` on the
    /// ops port also requires.
    pub ready: bool,
    /// What the caller's token grants.
    pub access: Access,
    /// Whether the caller's token is one this aggregator knows.
    pub token: TokenCheck,
    /// Whether agent ingest runs on this replica (it needs agent credentials).
    pub ingest: bool,
    /// Agents with an open, authenticated connection to this replica.
    pub agents_connected: u64,
    /// Per zone, who reports its instances: every registered zone, and the zones
    /// agents report into without a registration when the caller may read live
    /// data (the read token, when one is configured).
    pub zones: Vec<ZoneReporters>,
    /// Agent connections and reports this replica refused recently.
    pub rejections: Rejections,
}

/// What became of the bearer token a caller sent, for `GET /status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TokenCheck {
    /// No `Authorization: Bearer` header.
    Absent,
    /// It is the read or the write token.
    Accepted,
    /// Tokens are configured and it is neither.
    Refused,
    /// No token is configured: the token is not looked at.
    Unused,
}

/// Which registrations backend the replica runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Redb,
    Etcd,
}

/// Rejections over the last `windowSeconds`, by the reasons of
/// `meshcat_reports_rejected_total`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rejections {
    /// How far back the count reaches (300 s, in steps of 10 s).
    pub window_seconds: u64,
    pub total: u64,
    /// Reasons with at least one rejection, sorted by reason.
    pub by_reason: std::collections::BTreeMap<String, u64>,
}

/// Builds this replica's status for a caller granted `access`, whose token came out
/// as `token`. It walks every instance: call it on the blocking pool.
pub fn replica_status(
    store: &Store,
    instances: &Instances,
    agents: Option<&Agents>,
    stopping: bool,
    access: Access,
    token: TokenCheck,
    now: Instant,
) -> ReplicaStatus {
    let by_reason: std::collections::BTreeMap<String, u64> = agents
        .map(|a| a.recent_rejections(now))
        .unwrap_or_default()
        .into_iter()
        .map(|(r, n)| (r.to_owned(), n))
        .collect();
    ReplicaStatus {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        replica: store.etcd().map(|e| e.owner().to_owned()),
        store: if store.etcd().is_some() {
            StoreKind::Etcd
        } else {
            StoreKind::Redb
        },
        ready: store.is_loaded() && !stopping,
        access,
        token,
        ingest: agents.is_some(),
        agents_connected: agents.map_or(0, |a| a.connected() as u64),
        // Names agents report that nobody registered are live data.
        zones: instances.reporters_by_zone(access >= Access::Read),
        rejections: Rejections {
            window_seconds: RECENT_REJECTIONS.as_secs(),
            total: by_reason.values().sum(),
            by_reason,
        },
    }
}
