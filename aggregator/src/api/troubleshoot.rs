//! What the troubleshooting routes of contract section 5 share: the sidecar layer
//! they reach sidecars through, and its errors as the API's. The routes themselves
//! are in [`super::logging`] (log levels and debug windows) and [`super::diagnose`]
//! (the diagnosis and the replicas' evidence route).
//!
//! Every command carries a deadline: an agent that is gone or hung costs its own
//! instance an error answer, never a hang and never another request's time.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use meshcat_common::model::ZoneRecord;

use super::AppState;
use super::error::ApiError;
use crate::ingest::CommandError;
use crate::replicas::{PeerCallError, Replicas};
use crate::sidecars::{SidecarError, Sidecars};

pub(super) type Shared = State<Arc<AppState>>;

/// Longest debug window one request may ask for, in seconds.
pub const MAX_DEBUG_SECONDS: u32 = meshcat_common::envoy_log::MAX_DEBUG_WINDOW_SECONDS;

/// The sidecar layer over this replica's agents and its peers.
pub(super) fn sidecars(s: &AppState) -> Sidecars {
    Sidecars::new(
        s.store.clone(),
        s.instances.clone(),
        s.history.clone(),
        s.agents.clone(),
        Replicas::new(s.store.clone(), s.peers.clone()),
    )
}

pub(super) fn ingest_off() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "ingest_off",
        "Agent ingest is off on this aggregator, so no sidecar can be reached.",
    )
}

impl From<SidecarError> for ApiError {
    fn from(e: SidecarError) -> ApiError {
        match e {
            SidecarError::IngestOff => ingest_off(),
            SidecarError::NotLive {
                zone,
                cluster,
                instance,
            } => ApiError::not_found(format!(
                "Instance {instance} of cluster {cluster} in zone {zone} is not live."
            )),
            SidecarError::Agent { instance, error } => command_error(&instance, &error),
            SidecarError::Unexpected { instance } => unexpected(&instance),
            SidecarError::Peer { instance, error } => match error {
                PeerCallError::Unknown { .. } => ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "owner_unreachable",
                    format!(
                        "Instance {instance} is served by a replica whose address is not known yet."
                    ),
                ),
                PeerCallError::Unreachable { owner } => ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "owner_unreachable",
                    format!("The replica {owner} serving instance {instance} did not answer."),
                ),
                PeerCallError::Answered {
                    status, message, ..
                } => ApiError::new(status, "owner_failed", message),
                PeerCallError::Unreadable { owner, why } => ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "owner_failed",
                    format!(
                        "The answer of replica {owner} for instance {instance} is not readable: {why}."
                    ),
                ),
            },
        }
    }
}

/// The error answer of a command that produced no output.
pub(super) fn command_error(instance: &str, e: &CommandError) -> ApiError {
    match e {
        CommandError::UnknownInstance { .. } => ApiError::new(
            StatusCode::NOT_FOUND,
            e.code(),
            format!("No connected agent reports instance {instance}."),
        ),
        CommandError::AgentGone => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            e.code(),
            format!("The agent of instance {instance} disconnected before answering."),
        ),
        CommandError::Timeout(d) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            e.code(),
            format!("The agent of instance {instance} did not answer within {d:?}."),
        ),
        CommandError::Busy => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            e.code(),
            format!("The agent of instance {instance} has too many commands in progress."),
        ),
        CommandError::Failed(msg) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            e.code(),
            format!(
                "The sidecar of instance {instance} failed the command: {}.",
                msg.trim_end_matches('.')
            ),
        ),
    }
}

pub(super) fn unexpected(instance: &str) -> ApiError {
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "agent_error",
        format!("The agent of instance {instance} answered with an unexpected output."),
    )
}

pub(super) fn zone_or_404(s: &AppState, zone: &str) -> Result<ZoneRecord, ApiError> {
    s.store.zone(zone).ok_or_else(|| ApiError::no_zone(zone))
}

/// A cluster is known in a zone when it is registered there or has live instances.
pub(super) fn cluster_or_404(
    sidecars: &Sidecars,
    zone: &str,
    cluster: &str,
) -> Result<(), ApiError> {
    if sidecars.knows(zone, cluster) {
        Ok(())
    } else {
        Err(ApiError::no_cluster(cluster, Some(zone)))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn command_errors_map_to_statuses() {
        let e = |c: CommandError| command_error("i-0", &c).status;
        assert_eq!(e(CommandError::AgentGone), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            e(CommandError::Timeout(Duration::from_secs(1))),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(e(CommandError::Busy), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e(CommandError::Failed("x".into())), StatusCode::BAD_GATEWAY);
        assert_eq!(
            e(CommandError::UnknownInstance {
                zone: "z".into(),
                cluster: "c".into(),
                instance: "i-0".into()
            }),
            StatusCode::NOT_FOUND
        );
    }

    /// The API's code and the metric's outcome are one name, pinned here.
    #[test]
    fn command_errors_answer_their_one_name() {
        for (e, code) in [
            (CommandError::AgentGone, "agent_gone"),
            (
                CommandError::Timeout(Duration::from_secs(1)),
                "agent_timeout",
            ),
            (CommandError::Busy, "agent_busy"),
            (CommandError::Failed("x".into()), "sidecar_error"),
        ] {
            assert_eq!(command_error("i-0", &e).code, code);
            assert_eq!(e.code(), code);
        }
    }
}
