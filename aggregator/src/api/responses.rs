//! The error answers many routes share, as OpenAPI response sets: a route's
//! annotation names the set instead of repeating each status and sentence. They are
//! documentation only; the answers themselves are [`super::ApiError`]s.

use utoipa::IntoResponses;

use super::error::ErrorBody;

/// A write without the write token.
#[derive(Debug, IntoResponses)]
#[response(
    status = 401,
    description = "A write token is configured and the request lacks it."
)]
pub struct WriteTokenMissing(pub ErrorBody);

/// Live data without the read token.
#[derive(Debug, IntoResponses)]
#[response(
    status = 403,
    description = "A read token is configured and the request lacks it."
)]
pub struct ReadTokenMissing(pub ErrorBody);

/// A zone, cluster or instance that does not exist.
#[derive(Debug, IntoResponses)]
#[response(status = 404, description = "Unknown resource.")]
pub struct NotFound(pub ErrorBody);

/// A registration write the store could not keep.
#[derive(Debug, IntoResponses)]
#[response(
    status = 507,
    description = "The store's storage is full (a full disk, etcd's space quota): nothing was stored, and writes are taken again once space returns."
)]
pub struct StorageFull(pub ErrorBody);

/// A JSON body refused.
#[derive(Debug, IntoResponses)]
pub enum BodyRefused {
    #[response(status = 413, description = "The body is over --max-body.")]
    TooLarge(ErrorBody),
    #[response(status = 415, description = "The body is not JSON.")]
    NotJson(ErrorBody),
    #[response(status = 422, description = "Well-formed but invalid.")]
    Invalid(ErrorBody),
}

/// A command to one sidecar that did not succeed.
#[derive(Debug, IntoResponses)]
pub enum SidecarFailed {
    #[response(
        status = 404,
        description = "Unknown zone or no live instance of that name."
    )]
    NoInstance(ErrorBody),
    #[response(status = 502, description = "The sidecar failed the command.")]
    Failed(ErrorBody),
    #[response(
        status = 503,
        description = "The instance's agent is gone, hung past the deadline, busy, or ingest is off."
    )]
    Unreachable(ErrorBody),
}
