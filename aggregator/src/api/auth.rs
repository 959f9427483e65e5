//! Bearer tokens: the read token decides `authorized` (who sees live data), the write
//! token guards every route that changes the catalog or a sidecar (contract section
//! 10). Without a write token, writes are refused with `writes_disabled` unless the
//! operator opened them (`--dev`, `--allow-anonymous-writes`). Tokens are compared as
//! SHA-256 digests in constant time, so neither their bytes nor their length leak
//! through timing; they are never logged.

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
    /// Without a write token, whether writes are open to anyone (`--dev` or
    /// `--allow-anonymous-writes`) rather than refused.
    pub anonymous_writes: bool,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("read", &self.read.is_some())
            .field("write", &self.write.is_some())
            .field("anonymous_writes", &self.anonymous_writes)
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

/// Whether `got` is `want`, in time independent of both: digests have a fixed length,
/// and comparing them in constant time tells nothing of the token's length or bytes.
pub fn token_eq(got: &[u8], want: &[u8]) -> bool {
    use ring::digest::{SHA256, digest};
    bool::from(
        digest(&SHA256, got)
            .as_ref()
            .ct_eq(digest(&SHA256, want).as_ref()),
    )
}

fn matches(expected: Option<&String>, parts: &Parts) -> bool {
    match expected {
        None => true,
        Some(want) => bearer(parts).is_some_and(|got| token_eq(got, want.as_bytes())),
    }
}

impl Tokens {
    /// Whether a request with these headers may write: `Err` is the answer otherwise.
    pub fn check_write(&self, parts: &Parts) -> Result<(), ApiError> {
        match &self.write {
            Some(_) if matches(self.write.as_ref(), parts) => Ok(()),
            Some(_) => Err(ApiError::unauthorized()),
            None if self.anonymous_writes => Ok(()),
            None => Err(ApiError::writes_disabled()),
        }
    }

    /// Whether the caller may see live data: the write token grants what the read
    /// token grants.
    pub(super) fn reads(&self, parts: &Parts) -> bool {
        matches(self.read.as_ref(), parts)
            || (self.write.is_some() && matches(self.write.as_ref(), parts))
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
            authorized: state.tokens.reads(parts),
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
        state.tokens.check_write(parts).map(|()| Writer)
    }
}

#[cfg(test)]
mod tests {
    use super::token_eq;

    #[test]
    fn tokens_compare_by_content_whatever_their_length() {
        assert!(token_eq(b"secret", b"secret"));
        assert!(!token_eq(b"secret", b"secret2"));
        assert!(!token_eq(b"", b"secret"));
        assert!(!token_eq(b"secreT", b"secret"));
    }
}
