//! The answer of the per-cluster routes: one outcome per instance.

use super::*;

/// One instance's outcome in a per-cluster answer.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceOutcome {
    pub(super) instance: String,
    /// HTTP-like status of this instance's part: 200, or the error's status.
    pub(super) status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) level: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) debug_window: Option<DebugWindowOutput>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub(super) code: Option<&'static str>,
}

impl InstanceOutcome {
    pub(super) fn failed(instance: &str, e: &ApiError) -> Self {
        InstanceOutcome {
            instance: instance.to_owned(),
            status: e.status.as_u16(),
            level: None,
            debug_window: None,
            error: Some(e.message.clone()),
            code: Some(e.code),
        }
    }

    pub(super) fn ok(instance: &str) -> Self {
        InstanceOutcome {
            instance: instance.to_owned(),
            status: 200,
            level: None,
            debug_window: None,
            error: None,
            code: None,
        }
    }
}

/// The answer of the per-cluster routes.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterOutcome {
    pub(super) zone_name: String,
    pub(super) cluster_name: String,
    /// Instances whose part succeeded.
    pub(super) succeeded: usize,
    /// Instances whose part failed.
    pub(super) failed: usize,
    pub(super) instances: Vec<InstanceOutcome>,
}

impl ClusterOutcome {
    pub(super) fn new(zone: String, cluster: String, instances: Vec<InstanceOutcome>) -> Self {
        let succeeded = instances.iter().filter(|i| i.status == 200).count();
        ClusterOutcome {
            zone_name: zone,
            cluster_name: cluster,
            succeeded,
            failed: instances.len() - succeeded,
            instances,
        }
    }
}
