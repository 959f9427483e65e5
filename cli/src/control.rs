//! The answers about the zones' control servers (contract section 17) as `meshcat`
//! reads them: `GET /zones/{z}/control` ([`ZoneControl`]) and `GET /sync`
//! ([`SyncAnswer`], one [`Proxy`] per sidecar), and the reads that fetch them. Every
//! field has a default and states are kept as the API spells them, so an answer with
//! a field or a state this `meshcat` does not know still reads.

use futures::{StreamExt, stream};
use serde::Deserialize;

use crate::client::{Api, Call, CliError};

/// Zones whose control state is read at once.
pub const CONCURRENT_READS: usize = 8;

/// The sync states that make `meshcat sync` and `meshcat check` fail.
pub const FAILING: [&str; 2] = ["stale", "rejected"];

/// `GET /zones/{z}/control`: the zone's xDS connection and what its view holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ZoneControl {
    pub zone_name: String,
    pub server_address: String,
    /// `connected`, `connecting`, `unreachable`, `tls-error`, `rejected` or
    /// `disabled`.
    pub state: String,
    /// The last failure in words; "" when none.
    pub error: String,
    pub connected_since_ms: Option<i64>,
    pub last_update_ms: Option<i64>,
    pub versions: Versions,
    pub clusters: u64,
    pub endpoints: u64,
    pub listeners: u64,
    pub routes: u64,
}

impl ZoneControl {
    /// Whether the zone passes `check`: connected, or never meant to connect.
    pub fn passes(&self) -> bool {
        matches!(self.state.as_str(), "connected" | "disabled")
    }
}

/// The last accepted `version_info` per xDS type.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Versions {
    pub clusters: String,
    pub endpoints: String,
    pub listeners: String,
    pub routes: String,
}

/// `GET /sync`: the sync index and the sidecars, sorted by zone, cluster, instance.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct SyncAnswer {
    pub index: u64,
    pub proxies: Vec<Proxy>,
}

/// One sidecar's sync with its zone's control server.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Proxy {
    pub zone_name: String,
    pub cluster_name: String,
    pub instance: String,
    /// `synced`, `stale`, `rejected`, `disconnected` or `unknown`.
    pub state: String,
    /// Since when it is in this state, ms since the epoch.
    pub since_ms: i64,
    pub detail: ProxyDetail,
}

impl Proxy {
    /// Whether its state makes `sync` and `check` fail (stale or rejected).
    pub fn failing(&self) -> bool {
        FAILING.contains(&self.state.as_str())
    }

    /// `zone/cluster/instance`.
    pub fn place(&self) -> String {
        format!("{}/{}/{}", self.zone_name, self.cluster_name, self.instance)
    }
}

/// Why a sidecar is in its state: one line in words, and the figures behind it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ProxyDetail {
    pub text: String,
    /// For `stale`: each upstream cluster that differs from the control server.
    pub clusters: Vec<StaleCluster>,
    /// For `rejected`: each update the sidecar refused.
    pub rejections: Vec<Rejection>,
}

/// An upstream cluster whose host set differs from the control server's endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StaleCluster {
    pub cluster: String,
    pub since_ms: i64,
    /// At most 16 addresses the sidecar lacks.
    pub missing: Vec<String>,
    pub missing_count: Option<u64>,
    /// At most 16 addresses the control server no longer lists.
    pub extra: Vec<String>,
    pub extra_count: Option<u64>,
    /// The control server stopped declaring the cluster.
    pub removed: bool,
}

/// An update a sidecar refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Rejection {
    pub kind: String,
    pub resource: String,
    pub reason: String,
    pub since_ms: i64,
}

/// Reads `/sync` as it came, for `-o json|yaml`, and as [`SyncAnswer`].
pub fn sync_answer(value: &serde_json::Value) -> Result<SyncAnswer, CliError> {
    serde_json::from_value(value.clone()).map_err(|e| CliError::Body {
        what: "GET /sync".into(),
        reason: format!("not a sync answer: {e}"),
    })
}

/// `GET /sync` with its filters, as the API answers it.
pub async fn read_sync(
    api: &Api,
    zone: Option<&str>,
    cluster: Option<&str>,
    state: Option<&str>,
) -> Result<serde_json::Value, CliError> {
    let call = Call::new(&["sync"])
        .q_opt("zoneName", zone)
        .q_opt("clusterName", cluster)
        .q_opt("state", state);
    api.get(&call).await
}

/// `GET /zones/{z}/control` of each zone, [`CONCURRENT_READS`] at a time; the
/// answers in the order of `zones`.
pub async fn read_controls(api: &Api, zones: &[String]) -> Vec<Result<ZoneControl, CliError>> {
    stream::iter(zones)
        .map(|z| async move {
            let what = format!("GET /zones/{z}/control");
            let v = api.get(&Call::new(&["zones", z, "control"])).await?;
            serde_json::from_value(v).map_err(|e| CliError::Body {
                what,
                reason: format!("not a control state: {e}"),
            })
        })
        .buffered(CONCURRENT_READS)
        .collect()
        .await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn answers_read_with_nulls_missing_fields_and_unknown_states() {
        let c: ZoneControl = serde_json::from_value(json!({
            "zoneName": "shop", "serverAddress": "cp:18000", "state": "connected", "error": "",
            "connectedSinceMs": null, "lastUpdateMs": 5,
            "versions": {"clusters": "v1", "endpoints": "v2", "listeners": "", "routes": ""},
            "clusters": 3, "endpoints": 7, "listeners": 1, "routes": 1, "later": true}))
        .unwrap();
        assert_eq!(c.connected_since_ms, None);
        assert_eq!(c.versions.endpoints, "v2");
        assert!(c.passes());
        let s = sync_answer(&json!({"index": 4, "proxies": [
            {"zoneName": "shop", "clusterName": "orders", "instance": "orders-1",
             "state": "stale", "sinceMs": 10,
             "detail": {"text": "cluster payments: 1 missing", "clusters": [
                {"cluster": "payments", "sinceMs": 9, "missing": ["10.0.0.7:8080"],
                 "missingCount": 1, "extra": [], "extraCount": null, "removed": false}]}},
            {"zoneName": "shop", "clusterName": "orders", "instance": "orders-2",
             "state": "paused", "sinceMs": 10, "detail": {"text": ""}}]}))
        .unwrap();
        assert_eq!(s.index, 4);
        assert!(s.proxies[0].failing());
        assert_eq!(s.proxies[0].detail.clusters[0].missing_count, Some(1));
        assert_eq!(s.proxies[0].detail.clusters[0].extra_count, None);
        assert!(
            !s.proxies[1].failing(),
            "a state this meshcat does not know"
        );
        assert_eq!(s.proxies[1].place(), "shop/orders/orders-2");
        assert!(sync_answer(&json!({"proxies": {"a": 1}})).is_err());
        assert!(sync_answer(&json!("no")).is_err());
    }
}
