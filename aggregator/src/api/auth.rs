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
use crate::peer_signature::Access;
use crate::replica_status::TokenCheck;

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

/// The access a peer replica granted the caller of a request it forwarded here,
/// from a verified signature (see [`crate::peer_signature`]). A request that carries
/// it is judged by it alone: it has no token of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted(pub Access);

impl Tokens {
    /// What the caller of a request may do, to tell the owning replica when the
    /// request is passed on.
    pub fn access(&self, parts: &Parts) -> Access {
        if self.check_write(parts).is_ok() {
            Access::Write
        } else if self.reads(parts) {
            Access::Read
        } else {
            Access::None
        }
    }

    /// Whether a request with these headers may write: `Err` is the answer otherwise.
    pub fn check_write(&self, parts: &Parts) -> Result<(), ApiError> {
        if let Some(Granted(access)) = parts.extensions.get::<Granted>() {
            return match access {
                Access::Write => Ok(()),
                _ if self.write.is_none() && !self.anonymous_writes => {
                    Err(ApiError::writes_disabled())
                }
                _ => Err(ApiError::unauthorized()),
            };
        }
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
        if let Some(Granted(access)) = parts.extensions.get::<Granted>() {
            return *access >= Access::Read;
        }
        matches(self.read.as_ref(), parts)
            || (self.write.is_some() && matches(self.write.as_ref(), parts))
    }
}

impl Tokens {
    /// Whether the caller's token is one this aggregator knows.
    pub fn check_token(&self, parts: &Parts) -> TokenCheck {
        if bearer(parts).is_none() {
            TokenCheck::Absent
        } else if self.read.is_none() && self.write.is_none() {
            TokenCheck::Unused
        } else if (self.read.is_some() && matches(self.read.as_ref(), parts))
            || (self.write.is_some() && matches(self.write.as_ref(), parts))
        {
            TokenCheck::Accepted
        } else {
            TokenCheck::Refused
        }
    }
}

/// What the caller's token grants and whether it was recognised; taken by
/// `GET /status`, which answers every caller.
#[derive(Debug, Clone, Copy)]
pub struct CallerAccess {
    pub access: Access,
    pub token: TokenCheck,
}

impl FromRequestParts<Arc<AppState>> for CallerAccess {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        Ok(CallerAccess {
            access: state.tokens.access(parts),
            token: state.tokens.check_token(parts),
        })
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

/// Proof that the caller may see live data; extracting it answers 403 otherwise.
/// Taken before anything else of a request, so a caller without the token learns
/// nothing from the validation of the rest.
#[derive(Debug, Clone, Copy)]
pub struct Reader;

impl FromRequestParts<Arc<AppState>> for Reader {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        if state.tokens.reads(parts) {
            Ok(Reader)
        } else {
            Err(ApiError::forbidden())
        }
    }
}

/// The caller of `GET /diagnose`: with `debugSeconds` in the query (the diagnosis
/// then turns sidecars to debug) it must hold the write token, else the read token.
/// Checked before the path and query are validated.
#[derive(Debug, Clone, Copy)]
pub struct DiagnoseCaller;

impl FromRequestParts<Arc<AppState>> for DiagnoseCaller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        let debug_window = parts.uri.query().is_some_and(|raw| {
            form_urlencoded::parse(raw.as_bytes()).any(|(k, _)| k == "debugSeconds")
        });
        if debug_window {
            state.tokens.check_write(parts)?;
        } else if !state.tokens.reads(parts) {
            return Err(ApiError::forbidden());
        }
        Ok(DiagnoseCaller)
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
