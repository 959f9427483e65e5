//! The control server's HTTP admin API: its nodes (`GET /nodes`, `POST
//! /hold/{node}`, `POST /release/{node}`) and its identity issuer (`GET
//! /identities`, `POST /rotate[/{secret}]`, `POST /issue/{secret}?lifetime=`,
//! `POST /rotation/stop`, `POST /rotation/start`). Answers are JSON; an error is
//! `{"error": "..."}` with 400 (a bad lifetime), 404 (no such secret, or no issuer)
//! or 500. No answer carries key material.

use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::ControlServer;
use crate::ads::NodeState;
use crate::identity::{IdentityError, IdentityIssuer, IssuerState, Rotation};

/// The admin API of `server`.
pub fn router(server: ControlServer) -> Router {
    Router::new()
        .route("/nodes", get(nodes))
        .route("/hold/{node}", post(hold))
        .route("/release/{node}", post(release))
        .route("/identities", get(identities))
        .route("/rotate", post(rotate_all))
        .route("/rotate/{secret}", post(rotate))
        .route("/issue/{secret}", post(issue))
        .route("/rotation/stop", post(stop_rotation))
        .route("/rotation/start", post(start_rotation))
        .with_state(server)
}

/// An admin answer that failed.
#[derive(Debug)]
pub struct AdminError {
    status: StatusCode,
    message: String,
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        #[derive(Serialize)]
        struct Body {
            error: String,
        }
        (
            self.status,
            Json(Body {
                error: self.message,
            }),
        )
            .into_response()
    }
}

impl From<IdentityError> for AdminError {
    fn from(e: IdentityError) -> Self {
        let status = match &e {
            IdentityError::Unknown(_) => StatusCode::NOT_FOUND,
            IdentityError::BadOptions(_)
            | IdentityError::BadIdentity(_)
            | IdentityError::BadSan(_) => StatusCode::BAD_REQUEST,
            IdentityError::Ca(_) | IdentityError::BadTime | IdentityError::Sign(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        Self {
            status,
            message: e.to_string(),
        }
    }
}

fn issuer(server: &ControlServer) -> Result<IdentityIssuer, AdminError> {
    server.issuer().ok_or_else(|| AdminError {
        status: StatusCode::NOT_FOUND,
        message: "this control server runs no identity issuer".into(),
    })
}

async fn nodes(State(server): State<ControlServer>) -> Json<Vec<NodeState>> {
    Json(server.nodes())
}

async fn hold(State(server): State<ControlServer>, Path(node): Path<String>) -> &'static str {
    server.hold(&node);
    "held\n"
}

async fn release(State(server): State<ControlServer>, Path(node): Path<String>) -> &'static str {
    server.release(&node);
    "released\n"
}

async fn identities(State(server): State<ControlServer>) -> Result<Json<IssuerState>, AdminError> {
    Ok(Json(issuer(&server)?.state()))
}

async fn rotate_all(
    State(server): State<ControlServer>,
) -> Result<Json<Vec<Rotation>>, AdminError> {
    Ok(Json(issuer(&server)?.rotate_all()?))
}

async fn rotate(
    State(server): State<ControlServer>,
    Path(secret): Path<String>,
) -> Result<Json<Rotation>, AdminError> {
    Ok(Json(issuer(&server)?.rotate(&secret)?))
}

/// `POST /issue/{secret}?lifetime=90s`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IssueQuery {
    /// A duration like `90s`, `10m` or `2h`; none: the issuer's lifetime.
    lifetime: Option<String>,
}

async fn issue(
    State(server): State<ControlServer>,
    Path(secret): Path<String>,
    Query(query): Query<IssueQuery>,
) -> Result<Json<Rotation>, AdminError> {
    let issuer = issuer(&server)?;
    let lifetime = match &query.lifetime {
        Some(text) => humantime::parse_duration(text.trim()).map_err(|e| AdminError {
            status: StatusCode::BAD_REQUEST,
            message: format!("lifetime {text:?} is not a duration like 90s, 10m or 2h ({e})"),
        })?,
        None => Duration::from_secs(issuer.state().lifetime_seconds),
    };
    Ok(Json(issuer.issue(&secret, lifetime)?))
}

/// What stopping or starting rotation answers.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct RotationSwitch {
    /// Whether rotation runs now.
    rotation: bool,
    /// Whether it ran before.
    was_running: bool,
    /// The certificates replaced at once because their rotation was overdue.
    rotated: Vec<Rotation>,
}

async fn stop_rotation(
    State(server): State<ControlServer>,
) -> Result<Json<RotationSwitch>, AdminError> {
    let was_running = issuer(&server)?.stop_rotation();
    Ok(Json(RotationSwitch {
        rotation: false,
        was_running,
        rotated: Vec::new(),
    }))
}

async fn start_rotation(
    State(server): State<ControlServer>,
) -> Result<Json<RotationSwitch>, AdminError> {
    let issuer = issuer(&server)?;
    let was_running = issuer.rotation();
    let rotated = issuer.start_rotation()?;
    Ok(Json(RotationSwitch {
        rotation: true,
        was_running,
        rotated,
    }))
}
