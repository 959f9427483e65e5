//! The API's one error type: every non-2xx answer is `{"error": "<one sentence>",
//! "code": "<snake_case>"}` with the status code of contract section 2. Internal
//! details never reach the body; they go to the log.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tracing::error;

use crate::store::StoreError;

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    /// Stable machine-readable code, snake_case.
    pub code: &'static str,
    /// One sentence for a human.
    pub message: String,
}

/// The body of every error answer, named `Error` in the OpenAPI document.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Error)]
pub struct Body<'a> {
    /// One sentence for a human.
    error: &'a str,
    /// Stable machine-readable code, snake_case.
    code: &'a str,
}

/// [`Body`] as the OpenAPI annotations name it.
pub type ErrorBody = Body<'static>;

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_query(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", message)
    }

    pub fn bad_path(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// The zone `zone` is not registered.
    pub fn no_zone(zone: &str) -> ApiError {
        ApiError::not_found(format!("Zone {zone} does not exist."))
    }

    /// No cluster `cluster` is known (in `zone`, when one is named).
    pub fn no_cluster(cluster: &str, zone: Option<&str>) -> ApiError {
        ApiError::not_found(match zone {
            Some(z) => format!("Cluster {cluster} does not exist in zone {z}."),
            None => format!("Cluster {cluster} does not exist."),
        })
    }

    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            message,
        )
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "This request needs a valid bearer token.",
        )
    }

    /// Writes without a configured write token, outside `--dev` and without
    /// `--allow-anonymous-writes`.
    pub fn writes_disabled() -> ApiError {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "writes_disabled",
            "Writes are disabled: the aggregator has no write token (--write-token-file).",
        )
    }

    /// Over the API's concurrency limit (`--api-max-concurrency`).
    pub fn overloaded() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "Too many requests in progress; try again shortly.",
        )
    }

    /// Past the API's time limit (`--api-request-timeout`).
    pub fn timeout() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "timeout",
            "The request did not complete within the time limit.",
        )
    }

    pub fn forbidden() -> ApiError {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "Live data of this cluster needs the read token.",
        )
    }

    pub fn internal() -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "The request could not be completed; see the aggregator's log.",
        )
    }

    /// A write the store cannot keep: its storage is full (`cause`, a phrase).
    pub fn insufficient_storage(cause: &str) -> ApiError {
        ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "insufficient_storage",
            format!(
                "The write was not stored: {cause}. Reads go on; writes are taken again once space returns."
            ),
        )
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "This method is not allowed on this path; see the Allow header.",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res = (
            self.status,
            Json(Body {
                error: &self.message,
                code: self.code,
            }),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            res.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        res
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match e {
            StoreError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, "conflict", m),
            StoreError::NotFound(m) => ApiError::not_found(m),
            StoreError::Invalid(m) => ApiError::invalid(m),
            StoreError::Storage(e) => {
                error!(error = %e, "Registration could not be stored.");
                ApiError::internal()
            }
            StoreError::Unavailable(m) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", m)
            }
            StoreError::Full(cause) => ApiError::insufficient_storage(&cause),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> ApiError {
        let detail = r.body_text();
        // axum prefixes serde's message with its own sentence; keep serde's part.
        let detail = detail
            .split_once(": ")
            .map_or(detail.as_str(), |(_, d)| d)
            .trim_end_matches('.');
        match r.status() {
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                "The request body is over the size limit.",
            ),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "The request body must be JSON with Content-Type: application/json.",
            ),
            StatusCode::UNPROCESSABLE_ENTITY => {
                ApiError::invalid(format!("The body does not fit the record: {detail}."))
            }
            _ => ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("The body is not valid JSON: {detail}."),
            ),
        }
    }
}
