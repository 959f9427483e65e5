//! A sidecar's sync with its zone's control server, as the aggregator derives it
//! and its readers (the diagnosis, peers) take it (contract section 17): the state,
//! and the detail behind it.

use serde::{Deserialize, Serialize};

/// Most addresses a stale cluster's detail names on each side.
pub const MAX_ADDRESSES: usize = 16;
/// Most clusters a stale instance's detail lists (the text counts them all).
pub const MAX_CLUSTERS: usize = 16;

/// A sidecar's sync state.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum SyncState {
    Synced,
    /// An upstream's host set differs from the control server's beyond the grace.
    Stale,
    /// It rejected an update, and no successful one of that subscription followed.
    Rejected,
    /// It is not connected to its control plane.
    Disconnected,
    /// No view, or no configuration from xDS.
    #[default]
    Unknown,
}

impl SyncState {
    pub const ALL: [SyncState; 5] = [
        SyncState::Synced,
        SyncState::Stale,
        SyncState::Rejected,
        SyncState::Disconnected,
        SyncState::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SyncState::Synced => "synced",
            SyncState::Stale => "stale",
            SyncState::Rejected => "rejected",
            SyncState::Disconnected => "disconnected",
            SyncState::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<SyncState> {
        SyncState::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// Why an instance is in its state: a line in words, and for `stale` and
/// `rejected` the clusters and rejections behind it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncDetail {
    pub text: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<StaleCluster>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejections: Vec<Rejection>,
}

/// An upstream cluster whose host set differs from the control server's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StaleCluster {
    pub cluster: String,
    /// Since when it differs, ms since the epoch.
    pub since_ms: i64,
    /// The control server no longer declares it.
    pub removed: bool,
    /// Endpoints the control server lists that the sidecar lacks (at most
    /// [`MAX_ADDRESSES`]); `missingCount` counts them all, null when unknown.
    pub missing: Vec<String>,
    pub missing_count: Option<u64>,
    /// Hosts the sidecar has that the control server no longer lists.
    pub extra: Vec<String>,
    pub extra_count: Option<u64>,
    /// The sidecar's hosts and the control server's endpoints, counted.
    pub sidecar_hosts: u64,
    pub control_endpoints: u64,
}

/// A rejected update, as the sidecar's agent reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rejection {
    /// `clusters`, `listeners`, `endpoints` or `routes`.
    pub kind: String,
    /// The EDS cluster or route configuration, "" for clusters and listeners.
    pub resource: String,
    /// Envoy's reason from the sidecar's log, "" when not read.
    pub reason: String,
    pub since_ms: i64,
}
