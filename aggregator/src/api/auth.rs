//! Bearer tokens: the read token decides `authorized` (who sees live data), the write
//! token guards POST, PUT and DELETE. Compared in constant time; never logged.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use subtle::ConstantTimeEq;

use super::AppState;
use super::error::ApiError;

/// The configured tokens.
#[derive(Clone, Default)]
pub struct Tokens {
    /// With a read token, only callers presenting it see live data.
    pub read: Option<String>,
    /// With a write token, only callers presenting it may change registrations.
    pub write: Option<String>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("read", &self.read.is_some())
            .field("write", &self.write.is_some())
            .finish()
    }
}

fn bearer(parts: &Parts) -> Option<&[u8]> {
    let v = parts.headers.get(AUTHORIZATION)?.as_bytes();
    let (scheme, token) = v.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| token.trim_ascii())
}

fn matches(expected: Option<&String>, parts: &Parts) -> bool {
    match expected {
        None => true,
        Some(want) => bearer(parts).is_some_and(|got| bool::from(got.ct_eq(want.as_bytes()))),
    }
}

/// The caller of a read: whether it may see live data.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub authorized: bool,
}

impl FromRequestParts<Arc<AppState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        Ok(Caller {
            authorized: matches(state.tokens.read.as_ref(), parts),
        })
    }
}

/// Proof that the caller may write; extracting it answers 401 otherwise.
#[derive(Debug, Clone, Copy)]
pub struct Writer;

impl FromRequestParts<Arc<AppState>> for Writer {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        if matches(state.tokens.write.as_ref(), parts) {
            Ok(Writer)
        } else {
            Err(ApiError::unauthorized())
        }
    }
}
