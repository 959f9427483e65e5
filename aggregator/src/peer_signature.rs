//! Signed requests between replicas (contract sections 10 and 13). A replica that
//! passes a request on to the replica owning an instance never sends the caller's
//! token: it authenticates the caller itself, and tells the owner which access it
//! granted in a header signed with the secret the replicas share through etcd. The
//! owner trusts that access only when the signature holds.
//!
//! The header, `x-meshcat-forwarded`, is one line of ASCII fields split by spaces:
//!
//! ```text
//! v1 <access> <timestamp ms> <nonce> <mac>
//! ```
//!
//! - `access`: `none`, `read` or `write`, what the front replica granted the caller;
//! - `timestamp`: milliseconds since the epoch when it was signed; the owner refuses
//!   one more than [`MAX_SKEW`] away from its own clock;
//! - `nonce`: 32 hex digits, random per request; the owner refuses a nonce it has
//!   seen within the skew window (a replay);
//! - `mac`: HMAC-SHA256 in hex, keyed with the shared secret, over the version, the
//!   method, the path, the query, the access, the timestamp and the nonce, each on a
//!   line of its own.
//!
//! The header is at most [`MAX_HEADER`] bytes; anything longer is refused before it
//! is looked at.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::hmac;

/// The header's version field.
const VERSION: &str = "v1";
/// Longest header value read: `v1` + access + 13-digit time + 32 + 64 hex digits and
/// spaces is about 120 bytes.
pub const MAX_HEADER: usize = 160;
/// How far a signature's time may be from the owner's clock, either way.
pub const MAX_SKEW: Duration = Duration::from_secs(30);
/// Most nonces remembered. Only requests with a valid signature are remembered, so
/// only replicas fill it; past it the oldest are forgotten early, and the time check
/// alone refuses their replays once they are stale.
pub const MAX_REMEMBERED: usize = 100_000;

/// What the front replica granted the caller (and what `GET /status` tells a caller
/// its own token grants).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    None,
    Read,
    Write,
}

impl Access {
    fn as_str(self) -> &'static str {
        match self {
            Access::None => "none",
            Access::Read => "read",
            Access::Write => "write",
        }
    }

    fn parse(s: &str) -> Option<Access> {
        match s {
            "none" => Some(Access::None),
            "read" => Some(Access::Read),
            "write" => Some(Access::Write),
            _ => None,
        }
    }
}

/// A parsed header, not yet verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    pub access: Access,
    pub timestamp_ms: u64,
    pub nonce: [u8; 16],
    pub mac: [u8; 32],
}

/// Why a signed request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the forwarding header is malformed")]
    Malformed,
    #[error("the forwarding signature does not match")]
    BadMac,
    #[error("the forwarding signature is stale")]
    Stale,
    #[error("the forwarding signature was used before")]
    Replayed,
}

fn hex_into(s: &str, out: &mut [u8]) -> Option<()> {
    let b = s.as_bytes();
    if b.len() != out.len() * 2 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    for (i, o) in out.iter_mut().enumerate() {
        *o = digit(b[2 * i])? << 4 | digit(b[2 * i + 1])?;
    }
    Some(())
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

impl Signature {
    /// Parses a header value. Reads nothing past [`MAX_HEADER`] bytes and allocates
    /// nothing.
    pub fn parse(value: &[u8]) -> Result<Signature, Refused> {
        if value.len() > MAX_HEADER {
            return Err(Refused::Malformed);
        }
        let text = std::str::from_utf8(value).map_err(|_| Refused::Malformed)?;
        let mut fields = text.split(' ');
        let mut next = || fields.next().ok_or(Refused::Malformed);
        if next()? != VERSION {
            return Err(Refused::Malformed);
        }
        let access = Access::parse(next()?).ok_or(Refused::Malformed)?;
        let ts = next()?;
        if ts.is_empty() || ts.len() > 15 || !ts.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Refused::Malformed);
        }
        let timestamp_ms = ts.parse().map_err(|_| Refused::Malformed)?;
        let mut nonce = [0; 16];
        hex_into(next()?, &mut nonce).ok_or(Refused::Malformed)?;
        let mut mac = [0; 32];
        hex_into(next()?, &mut mac).ok_or(Refused::Malformed)?;
        if fields.next().is_some() {
            return Err(Refused::Malformed);
        }
        Ok(Signature {
            access,
            timestamp_ms,
            nonce,
            mac,
        })
    }
}

/// What a signature covers.
#[derive(Debug, Clone, Copy)]
pub struct Signed<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
}

fn message(s: &Signed<'_>, access: Access, timestamp_ms: u64, nonce: &[u8; 16]) -> String {
    format!(
        "{VERSION}\n{}\n{}\n{}\n{}\n{timestamp_ms}\n{}",
        s.method,
        s.path,
        s.query,
        access.as_str(),
        hex(nonce)
    )
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Signs and verifies with one shared secret; remembers the nonces it accepted.
pub struct Signer {
    key: hmac::Key,
    seen: Mutex<Seen>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").finish_non_exhaustive()
    }
}

/// Nonces accepted, with when they may be forgotten, oldest first.
#[derive(Default)]
struct Seen {
    by_nonce: HashMap<[u8; 16], u64>,
    order: VecDeque<([u8; 16], u64)>,
}

impl Signer {
    pub fn new(secret: &[u8]) -> Signer {
        Signer {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
            seen: Mutex::new(Seen::default()),
        }
    }

    /// The header value of a request the caller was granted `access` for.
    pub fn sign(&self, what: &Signed<'_>, access: Access) -> String {
        self.sign_at(what, access, now_ms(), rand::random())
    }

    fn sign_at(&self, what: &Signed<'_>, access: Access, ts: u64, nonce: [u8; 16]) -> String {
        let tag = hmac::sign(&self.key, message(what, access, ts, &nonce).as_bytes());
        format!(
            "{VERSION} {} {ts} {} {}",
            access.as_str(),
            hex(&nonce),
            hex(tag.as_ref())
        )
    }

    /// Verifies a header value for this request: the access it grants, or why not.
    pub fn verify(&self, value: &[u8], what: &Signed<'_>) -> Result<Access, Refused> {
        self.verify_at(value, what, now_ms())
    }

    fn verify_at(&self, value: &[u8], what: &Signed<'_>, now: u64) -> Result<Access, Refused> {
        let sig = Signature::parse(value)?;
        let msg = message(what, sig.access, sig.timestamp_ms, &sig.nonce);
        // Constant time: ring compares the tags without an early exit.
        hmac::verify(&self.key, msg.as_bytes(), &sig.mac).map_err(|_| Refused::BadMac)?;
        let skew = u64::try_from(MAX_SKEW.as_millis()).unwrap_or(u64::MAX);
        if sig.timestamp_ms.abs_diff(now) > skew {
            return Err(Refused::Stale);
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        // Forget nonces whose signatures are stale by now: their replays fail the
        // time check.
        while seen
            .order
            .front()
            .is_some_and(|(_, until)| *until < now || seen.by_nonce.len() >= MAX_REMEMBERED)
        {
            let (nonce, _) = seen.order.pop_front().expect("checked");
            seen.by_nonce.remove(&nonce);
        }
        if seen.by_nonce.contains_key(&sig.nonce) {
            return Err(Refused::Replayed);
        }
        let until = sig.timestamp_ms.saturating_add(skew);
        seen.by_nonce.insert(sig.nonce, until);
        seen.order.push_back((sig.nonce, until));
        Ok(sig.access)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const WHAT: Signed<'static> = Signed {
        method: "GET",
        path: "/metrics/web/web-1",
        query: "zoneName=z",
    };

    #[test]
    fn a_signature_verifies_once_for_its_request_and_access_only() {
        let s = Signer::new(b"secret");
        let t = now_ms();
        let v = s.sign_at(&WHAT, Access::Read, t, [7; 16]);
        assert!(v.len() <= MAX_HEADER, "{}", v.len());
        assert_eq!(s.verify_at(v.as_bytes(), &WHAT, t), Ok(Access::Read));
        assert_eq!(
            s.verify_at(v.as_bytes(), &WHAT, t + 1),
            Err(Refused::Replayed)
        );
        // Another request, another secret, another access: the MAC fails.
        let v = s.sign_at(&WHAT, Access::Read, t, [8; 16]);
        for other in [
            Signed {
                method: "PUT",
                ..WHAT
            },
            Signed {
                path: "/metrics/web/web-2",
                ..WHAT
            },
            Signed {
                query: "zoneName=y",
                ..WHAT
            },
        ] {
            assert_eq!(s.verify_at(v.as_bytes(), &other, t), Err(Refused::BadMac));
        }
        assert_eq!(
            Signer::new(b"other").verify_at(v.as_bytes(), &WHAT, t),
            Err(Refused::BadMac)
        );
        let raised = v.replacen(" read ", " write ", 1);
        assert_eq!(
            s.verify_at(raised.as_bytes(), &WHAT, t),
            Err(Refused::BadMac)
        );
    }

    #[test]
    fn stale_and_future_signatures_are_refused() {
        let s = Signer::new(b"secret");
        let t = 1_800_000_000_000;
        let skew = MAX_SKEW.as_millis() as u64;
        let old = s.sign_at(&WHAT, Access::Write, t - skew - 1, [1; 16]);
        assert_eq!(s.verify_at(old.as_bytes(), &WHAT, t), Err(Refused::Stale));
        let ahead = s.sign_at(&WHAT, Access::Write, t + skew + 1, [2; 16]);
        assert_eq!(s.verify_at(ahead.as_bytes(), &WHAT, t), Err(Refused::Stale));
        let edge = s.sign_at(&WHAT, Access::Write, t - skew, [3; 16]);
        assert_eq!(s.verify_at(edge.as_bytes(), &WHAT, t), Ok(Access::Write));
    }

    #[test]
    fn remembered_nonces_stay_bounded() {
        let s = Signer::new(b"secret");
        let t = 1_800_000_000_000;
        for i in 0..(MAX_REMEMBERED as u64 + 10) {
            let mut nonce = [0; 16];
            nonce[..8].copy_from_slice(&i.to_le_bytes());
            let v = s.sign_at(&WHAT, Access::Read, t, nonce);
            assert_eq!(s.verify_at(v.as_bytes(), &WHAT, t), Ok(Access::Read));
        }
        let seen = s.seen.lock().unwrap();
        assert!(seen.by_nonce.len() <= MAX_REMEMBERED);
        assert_eq!(seen.by_nonce.len(), seen.order.len());
    }

    proptest! {
        /// Any bytes: no panic, and the parse reads nothing past the bound.
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let r = Signature::parse(&bytes);
            if bytes.len() > MAX_HEADER {
                prop_assert_eq!(r, Err(Refused::Malformed));
            }
        }

        /// Header-shaped text with any field values: no panic; a forged MAC never
        /// verifies.
        #[test]
        fn forged_headers_never_verify(
            access in "(none|read|write|[a-z]{0,6})",
            ts in "[0-9]{0,20}",
            nonce in "[0-9a-f]{0,40}",
            mac in "[0-9a-fA-F]{0,70}",
            extra in proptest::option::of("[ -~]{0,8}"),
        ) {
            let s = Signer::new(b"secret");
            let mut v = format!("v1 {access} {ts} {nonce} {mac}");
            if let Some(e) = extra {
                v.push(' ');
                v.push_str(&e);
            }
            prop_assert!(s.verify_at(v.as_bytes(), &WHAT, now_ms()).is_err());
        }

        /// A genuine signature survives any request fields (paths and queries with
        /// any text) and fails for any change of them.
        #[test]
        fn genuine_signatures_bind_their_request(
            path in "/[ -~]{0,60}",
            query in "[ -~]{0,60}",
            other in "[ -~]{1,10}",
        ) {
            let s = Signer::new(b"k");
            let what = Signed { method: "GET", path: &path, query: &query };
            let v = s.sign(&what, Access::Read);
            prop_assert!(v.len() <= MAX_HEADER);
            let moved = format!("{path}{other}");
            let changed = Signed { path: &moved, ..what };
            prop_assert_eq!(s.verify(v.as_bytes(), &changed), Err(Refused::BadMac));
            prop_assert_eq!(s.verify(v.as_bytes(), &what), Ok(Access::Read));
        }
    }
}
