//! Workload identity (contract section 19): the certificates a sidecar holds and the
//! subject alternative names (SANs) its TLS contexts require of the clusters it
//! calls, as an agent reports them ([`IdentityReport`]); the state of a certificate
//! ([`CertState`], [`IdentityRules`]); whether a caller's matchers accept what a
//! callee presents ([`Matchers`]); and the answers the catalog gives of them
//! ([`InstanceIdentity`], [`ClusterIdentity`], [`CertificateRow`], [`TlsIdentity`]).
//! No I/O lives here.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Most distinct certificates (by role and serial) reported and kept per instance.
pub const MAX_CERTIFICATES: usize = 64;
/// Most SANs of one certificate.
pub const MAX_SANS: usize = 32;
/// Longest SAN, in bytes.
pub const MAX_SAN_BYTES: usize = 256;
/// Most SAN matchers of one upstream cluster's TLS context.
pub const MAX_MATCHERS: usize = 32;
/// Longest serial number, in hex digits (RFC 5280 allows 20 octets, 40 digits).
pub const MAX_SERIAL_DIGITS: usize = 64;
/// Longest SDS secret name or version.
pub const MAX_SECRET_TEXT: usize = 256;

/// A reason an instance's certificates are not listed (docs/wire.md, "Identity").
pub mod refusal {
    /// More than [`super::MAX_CERTIFICATES`] distinct certificates.
    pub const TOO_MANY_CERTIFICATES: &str = "too_many_certificates";
    /// A certificate with more than [`super::MAX_SANS`] SANs.
    pub const TOO_MANY_SANS: &str = "too_many_sans";
    /// A SAN, serial, secret name or version longer than its bound.
    pub const TEXT_TOO_LONG: &str = "certificate_text_too_long";
    /// More upstream clusters with SAN matchers than the upstream bound, or a cluster
    /// with more than [`super::MAX_MATCHERS`] of them.
    pub const TOO_MANY_MATCHERS: &str = "too_many_san_matchers";
    /// The sidecar's `/certs` answer is over the agent's read limit.
    pub const ANSWER_TOO_LARGE: &str = "certs_answer_too_large";
    /// The sidecar's `/certs` answer is not what Envoy writes.
    pub const ANSWER_INVALID: &str = "certs_answer_invalid";
    /// Every reason.
    pub const ALL: [&str; 6] = [
        TOO_MANY_CERTIFICATES,
        TOO_MANY_SANS,
        TEXT_TOO_LONG,
        TOO_MANY_MATCHERS,
        ANSWER_TOO_LARGE,
        ANSWER_INVALID,
    ];
}

/// The type of a SAN, as Envoy's `/certs` and `match_typed_subject_alt_names` name
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum SanKind {
    Dns,
    Uri,
    Ip,
    Email,
}

/// One subject alternative name of a certificate.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct San {
    pub kind: SanKind,
    pub value: String,
}

impl San {
    pub fn new(kind: SanKind, value: impl Into<String>) -> Self {
        San {
            kind,
            value: value.into(),
        }
    }
}

/// Which list of a TLS context a certificate is in: the context's own certificate
/// chain (what the sidecar presents), or a CA it trusts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum CertRole {
    Chain,
    Ca,
}

impl CertRole {
    pub fn as_str(self) -> &'static str {
        match self {
            CertRole::Chain => "chain",
            CertRole::Ca => "ca",
        }
    }
}

/// Where a certificate came from: a file or the sidecar's static configuration
/// (rotated by hand), or an SDS secret (rotated by the identity system).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum CertSource {
    File,
    Sds,
}

impl CertSource {
    pub fn as_str(self) -> &'static str {
        match self {
            CertSource::File => "file",
            CertSource::Sds => "sds",
        }
    }
}

/// The SDS secret a certificate came in (`/config_dump?resource=dynamic_active_secrets`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SdsSecret {
    pub name: String,
    /// The secret's `version_info`.
    pub version: String,
    /// When the sidecar took this version (`last_updated`), ms since the epoch; 0
    /// when not given.
    pub last_updated_ms: i64,
}

/// One certificate of a sidecar, once however many of its TLS contexts use it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReportedCertificate {
    /// Lower-case hex as Envoy writes it in `/certs`.
    pub serial: String,
    pub role: CertRole,
    /// DNS first, as Envoy lists them.
    pub sans: Vec<San>,
    pub valid_from_ms: i64,
    pub expires_at_ms: i64,
    /// The SDS secret it came in; `None` for a file or static configuration.
    pub secret: Option<SdsSecret>,
}

impl ReportedCertificate {
    pub fn source(&self) -> CertSource {
        if self.secret.is_some() {
            CertSource::Sds
        } else {
            CertSource::File
        }
    }

    /// The times its state is read from.
    pub fn times(&self) -> CertTimes {
        CertTimes {
            valid_from_ms: self.valid_from_ms,
            expires_at_ms: self.expires_at_ms,
            sds: self.secret.is_some(),
        }
    }
}

/// How a SAN matcher compares (Envoy's `StringMatcher`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum MatchKind {
    Exact,
    Prefix,
    Suffix,
    Contains,
    /// `safe_regex`: RE2 syntax, matching the whole SAN.
    Regex,
}

/// One entry of a TLS context's `match_typed_subject_alt_names` (or of the older
/// `match_subject_alt_names`, which has no SAN type and matches SANs of any type).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SanMatcher {
    /// `None`: any type.
    pub san_type: Option<SanKind>,
    pub kind: MatchKind,
    pub value: String,
    pub ignore_case: bool,
}

impl SanMatcher {
    /// An exact matcher of a SAN of `kind`.
    pub fn exact(kind: SanKind, value: impl Into<String>) -> Self {
        SanMatcher {
            san_type: Some(kind),
            kind: MatchKind::Exact,
            value: value.into(),
            ignore_case: false,
        }
    }

    /// How the catalog shows it: an exact matcher as its value, the others as
    /// `prefix:`, `suffix:`, `contains:` or `regex:` and the value.
    pub fn display(&self) -> String {
        let kind = match self.kind {
            MatchKind::Exact => return self.value.clone(),
            MatchKind::Prefix => "prefix",
            MatchKind::Suffix => "suffix",
            MatchKind::Contains => "contains",
            MatchKind::Regex => "regex",
        };
        format!("{kind}:{}", self.value)
    }
}

/// The SAN matchers one upstream cluster's TLS context requires of the hosts it
/// connects to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SanExpectation {
    pub cluster: String,
    pub matchers: Vec<SanMatcher>,
}

/// What a sidecar shows of its workload identity; in a delta report `None` means as
/// in the base (docs/wire.md, "Identity").
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IdentityReport {
    /// Its distinct certificates, by role then serial.
    pub certificates: Vec<ReportedCertificate>,
    /// Per upstream cluster whose TLS context checks SANs, its matchers, by cluster.
    pub expectations: Vec<SanExpectation>,
    /// Why `certificates` is empty although the sidecar may have some: a reason of
    /// [`refusal`]; `None` when they were read whole.
    pub refused: Option<String>,
    /// A digest of the rest, by the agent: the identity is sent again only when it
    /// moves.
    pub digest: u64,
}

impl IdentityReport {
    /// The report of `certificates` and `expectations`, with its digest.
    pub fn new(
        certificates: Vec<ReportedCertificate>,
        expectations: Vec<SanExpectation>,
        refused: Option<String>,
    ) -> Self {
        let mut r = IdentityReport {
            certificates,
            expectations,
            refused,
            digest: 0,
        };
        r.digest = r.content_digest();
        r
    }

    /// FNV-1a over the MessagePack of everything but the digest: the same content
    /// gives the same digest in every build.
    pub fn content_digest(&self) -> u64 {
        let bytes = rmp_serde::to_vec(&(&self.certificates, &self.expectations, &self.refused))
            .unwrap_or_default();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    }

    /// The first bound this report breaks, as a [`refusal`] reason; `max_expectations`
    /// is the receiver's bound on upstream clusters.
    pub fn over_bound(&self, max_expectations: usize) -> Option<&'static str> {
        if self.certificates.len() > MAX_CERTIFICATES {
            return Some(refusal::TOO_MANY_CERTIFICATES);
        }
        for c in &self.certificates {
            if c.sans.len() > MAX_SANS {
                return Some(refusal::TOO_MANY_SANS);
            }
            let secret_long = c.secret.as_ref().is_some_and(|s| {
                s.name.len() > MAX_SECRET_TEXT || s.version.len() > MAX_SECRET_TEXT
            });
            if c.serial.len() > MAX_SERIAL_DIGITS
                || secret_long
                || c.sans.iter().any(|s| s.value.len() > MAX_SAN_BYTES)
            {
                return Some(refusal::TEXT_TOO_LONG);
            }
        }
        if self.expectations.len() > max_expectations
            || self
                .expectations
                .iter()
                .any(|e| e.matchers.len() > MAX_MATCHERS)
        {
            return Some(refusal::TOO_MANY_MATCHERS);
        }
        if self.expectations.iter().any(|e| {
            e.matchers.iter().any(|m| m.value.len() > MAX_SAN_BYTES)
                || e.cluster.is_empty()
                || e.cluster.len() > 1024
        }) {
            return Some(refusal::TEXT_TOO_LONG);
        }
        if let Some(r) = &self.refused
            && r.len() > 64
        {
            return Some(refusal::TEXT_TOO_LONG);
        }
        None
    }

    /// This report with its certificates refused for `reason` (its expectations kept
    /// when they are within their bounds).
    pub fn refusing(mut self, reason: &str, max_expectations: usize) -> Self {
        self.certificates = Vec::new();
        self.refused = Some(reason.to_owned());
        if self.over_bound(max_expectations).is_some() {
            self.expectations = Vec::new();
        }
        self.digest = self.content_digest();
        self
    }
}

/// The state of a certificate, or of an instance's identity: the first that holds
/// of none, expired, rotation-overdue, expiring, ok (docs/identity.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum CertState {
    /// No certificate.
    None,
    Expired,
    /// An SDS certificate past the overdue fraction of its lifetime and not replaced.
    RotationOverdue,
    /// Less than the warning left, and less than half its lifetime.
    Expiring,
    Ok,
}

impl CertState {
    pub const ALL: [CertState; 5] = [
        CertState::None,
        CertState::Expired,
        CertState::RotationOverdue,
        CertState::Expiring,
        CertState::Ok,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CertState::None => "none",
            CertState::Expired => "expired",
            CertState::RotationOverdue => "rotation-overdue",
            CertState::Expiring => "expiring",
            CertState::Ok => "ok",
        }
    }

    /// Parses exactly one of the five names.
    pub fn parse(s: &str) -> Option<Self> {
        CertState::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// How bad it is, for "the worst of": expired first, ok last.
    pub fn severity(self) -> u8 {
        match self {
            CertState::Expired => 4,
            CertState::RotationOverdue => 3,
            CertState::Expiring => 2,
            CertState::None => 1,
            CertState::Ok => 0,
        }
    }

    /// Whether a certificate in this state needs someone (what `meshcat certs`
    /// exits 1 on).
    pub fn needs_action(self) -> bool {
        matches!(
            self,
            CertState::Expired | CertState::RotationOverdue | CertState::Expiring
        )
    }
}

impl fmt::Display for CertState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The aggregator's thresholds (`--cert-warning`, `--cert-rotation-overdue`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IdentityRules {
    /// Less than this left is expiring (when also less than half the lifetime).
    pub warning_ms: i64,
    /// An SDS certificate older than this fraction of its lifetime is overdue.
    pub overdue_fraction: f64,
}

/// The default of `--cert-warning`: 7 days.
pub const DEFAULT_CERT_WARNING: std::time::Duration = std::time::Duration::from_secs(7 * 86_400);
/// The default of `--cert-rotation-overdue`.
pub const DEFAULT_ROTATION_OVERDUE: f64 = 0.8;

impl Default for IdentityRules {
    fn default() -> Self {
        IdentityRules {
            warning_ms: DEFAULT_CERT_WARNING.as_millis() as i64,
            overdue_fraction: DEFAULT_ROTATION_OVERDUE,
        }
    }
}

/// What a certificate's state depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CertTimes {
    pub valid_from_ms: i64,
    pub expires_at_ms: i64,
    /// Delivered over SDS (rotated by the identity system).
    pub sds: bool,
}

impl IdentityRules {
    /// The state of a certificate at `now_ms`.
    pub fn state(&self, c: CertTimes, now_ms: i64) -> CertState {
        if now_ms >= c.expires_at_ms {
            CertState::Expired
        } else if c.sds && now_ms >= self.overdue_at(c) {
            CertState::RotationOverdue
        } else if now_ms >= self.expiring_at(c) {
            CertState::Expiring
        } else {
            CertState::Ok
        }
    }

    /// When an SDS certificate becomes overdue.
    fn overdue_at(&self, c: CertTimes) -> i64 {
        let lifetime = (c.expires_at_ms - c.valid_from_ms).max(0);
        c.valid_from_ms
            .saturating_add((lifetime as f64 * self.overdue_fraction.clamp(0.0, 1.0)) as i64)
    }

    /// When a certificate starts expiring: less than the warning left and less than
    /// half its lifetime.
    fn expiring_at(&self, c: CertTimes) -> i64 {
        let lifetime = (c.expires_at_ms - c.valid_from_ms).max(0);
        (c.expires_at_ms.saturating_sub(self.warning_ms)).max(c.expires_at_ms - lifetime / 2)
    }

    /// Until when `c` is `ok`: its state is [`CertState::Ok`] exactly at the times
    /// before this.
    pub fn ok_until(&self, c: CertTimes) -> i64 {
        let mut until = c.expires_at_ms.min(self.expiring_at(c));
        if c.sds {
            until = until.min(self.overdue_at(c));
        }
        until
    }

    /// The first time after `now_ms` at which the state of `c` changes, if any.
    pub fn next_change(&self, c: CertTimes, now_ms: i64) -> Option<i64> {
        let mut times = vec![c.expires_at_ms, self.expiring_at(c)];
        if c.sds {
            times.push(self.overdue_at(c));
        }
        times.into_iter().filter(|t| *t > now_ms).min()
    }
}

/// A TLS context's matchers, ready to compare with SANs: regexes compiled once.
#[derive(Debug, Clone)]
pub struct Matchers {
    matchers: Vec<(SanMatcher, Option<regex::Regex>)>,
}

/// Largest compiled regex of a matcher: a hostile pattern costs at most this.
const REGEX_SIZE_LIMIT: usize = 256 << 10;

impl Matchers {
    pub fn new(matchers: &[SanMatcher]) -> Self {
        let matchers = matchers
            .iter()
            .map(|m| {
                let re = (m.kind == MatchKind::Regex).then(|| {
                    regex::RegexBuilder::new(&format!("^(?:{})$", m.value))
                        .case_insensitive(m.ignore_case)
                        .size_limit(REGEX_SIZE_LIMIT)
                        .build()
                        .ok()
                });
                (m.clone(), re.flatten())
            })
            .collect();
        Matchers { matchers }
    }

    /// Whether any matcher accepts any of `sans` (Envoy accepts a certificate when
    /// one of the context's matchers matches one of its SANs). No matchers: any.
    pub fn accept(&self, sans: &[San]) -> bool {
        self.matchers.is_empty()
            || self
                .matchers
                .iter()
                .any(|(m, re)| sans.iter().any(|s| matches(m, re.as_ref(), s)))
    }
}

fn matches(m: &SanMatcher, re: Option<&regex::Regex>, san: &San) -> bool {
    if m.san_type.is_some_and(|t| t != san.kind) {
        return false;
    }
    let (value, pattern) = (san.value.as_str(), m.value.as_str());
    let eq = |a: &str, b: &str| {
        if m.ignore_case {
            a.eq_ignore_ascii_case(b)
        } else {
            a == b
        }
    };
    let lower = |s: &str| {
        if m.ignore_case {
            s.to_ascii_lowercase()
        } else {
            s.to_owned()
        }
    };
    match m.kind {
        MatchKind::Exact => {
            eq(value, pattern)
                || (san.kind == SanKind::Dns && dns_wildcard_match(value, pattern, m.ignore_case))
        }
        MatchKind::Prefix => lower(value).starts_with(&lower(pattern)),
        MatchKind::Suffix => lower(value).ends_with(&lower(pattern)),
        MatchKind::Contains => lower(value).contains(&lower(pattern)),
        MatchKind::Regex => re.is_some_and(|re| re.is_match(value)),
    }
}

/// A wildcard DNS SAN (`*.example.com`) matches one label in its place, as Envoy's
/// DNS SAN check does for an exact matcher.
fn dns_wildcard_match(san: &str, name: &str, ignore_case: bool) -> bool {
    let Some(suffix) = san.strip_prefix("*.") else {
        return false;
    };
    let Some((label, rest)) = name.split_once('.') else {
        return false;
    };
    !label.is_empty()
        && if ignore_case {
            rest.eq_ignore_ascii_case(suffix)
        } else {
            rest == suffix
        }
}

/// `ms` (since the epoch) as an RFC 3339 time in UTC, to the second, as Envoy's
/// `/certs` writes times.
pub fn rfc3339(ms: i64) -> String {
    let at = if ms >= 0 {
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms as u64)
    } else {
        std::time::UNIX_EPOCH - std::time::Duration::from_millis(ms.unsigned_abs())
    };
    humantime::format_rfc3339_seconds(at).to_string()
}

/// Envoy's spelling of a serial number from its DER bytes: lower-case hex, two
/// digits a byte, without leading zero bytes ("0" for zero).
pub fn serial_hex(der_integer: &[u8]) -> String {
    let trimmed: &[u8] = match der_integer.iter().position(|b| *b != 0) {
        Some(i) => &der_integer[i..],
        None => return "0".to_owned(),
    };
    let mut out = String::with_capacity(trimmed.len() * 2);
    for b in trimmed {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// An instance's identity as the catalog shows it: its soonest-expiring chain
/// certificate and that certificate's state (`none` without one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InstanceIdentity {
    pub state: CertState,
    /// The certificate's SANs (DNS, URI and IP values).
    pub sans: Vec<String>,
    pub expires_at_ms: Option<i64>,
    pub valid_from_ms: Option<i64>,
    pub source: Option<CertSource>,
    /// The SDS secret's name, when it came over SDS.
    pub secret: Option<String>,
    pub serial: Option<String>,
    /// Why the certificates are not known, when they are refused or not read.
    pub reason: Option<String>,
}

impl InstanceIdentity {
    /// No certificate, for `reason`.
    pub fn none(reason: Option<String>) -> Self {
        InstanceIdentity {
            state: CertState::None,
            sans: Vec::new(),
            expires_at_ms: None,
            valid_from_ms: None,
            source: None,
            secret: None,
            serial: None,
            reason,
        }
    }
}

/// A cluster's identity: the distinct SPIFFE IDs (URI SANs) its live instances
/// present, the worst of their states and the soonest expiry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterIdentity {
    pub spiffe_ids: Vec<String>,
    pub state: CertState,
    pub expires_at_ms: Option<i64>,
}

/// One row of `GET /certificates`: one certificate of one instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CertificateRow {
    pub zone_name: String,
    pub cluster_name: String,
    pub instance: String,
    /// The cluster's owner ("" when unregistered).
    pub owner: String,
    pub role: CertRole,
    pub serial: String,
    pub sans: Vec<String>,
    pub valid_from_ms: i64,
    pub expires_at_ms: i64,
    pub source: CertSource,
    pub secret: Option<String>,
    pub state: CertState,
}

/// What a graph edge's caller requires of its target's certificates, what the
/// target's live instances present, and whether they agree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TlsIdentity {
    /// The caller's SAN matchers ([`SanMatcher::display`]).
    pub expected_sans: Vec<String>,
    /// The SANs of the target's live instances' chain certificates.
    pub presented_sans: Vec<String>,
    /// Whether every live target instance presents a SAN the caller accepts.
    #[serde(rename = "match")]
    pub matches: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400_000;

    fn times(valid_from_ms: i64, expires_at_ms: i64, sds: bool) -> CertTimes {
        CertTimes {
            valid_from_ms,
            expires_at_ms,
            sds,
        }
    }

    #[test]
    fn states_follow_the_contracts_order() {
        let rules = IdentityRules::default();
        // A year-long file certificate: ok until 7 days are left, then expiring.
        let year = times(0, 365 * DAY, false);
        assert_eq!(rules.state(year, 100 * DAY), CertState::Ok);
        assert_eq!(rules.state(year, 358 * DAY + 1), CertState::Expiring);
        assert_eq!(rules.state(year, 365 * DAY), CertState::Expired);
        // Files are never overdue, whatever their age.
        assert_eq!(rules.state(year, 350 * DAY), CertState::Ok);
        // A 24-hour SDS certificate is not always expiring: only its last half, and
        // past 80 % of its lifetime it is overdue instead.
        let day = times(0, DAY, true);
        assert_eq!(rules.state(day, DAY / 4), CertState::Ok);
        assert_eq!(rules.state(day, DAY / 2 + 1), CertState::Expiring);
        assert_eq!(rules.state(day, DAY * 8 / 10), CertState::RotationOverdue);
        assert_eq!(rules.state(day, DAY), CertState::Expired);
        assert_eq!(
            rules.next_change(day, 0),
            Some(DAY / 2),
            "expiring comes first"
        );
        assert_eq!(rules.next_change(day, DAY / 2), Some(DAY * 8 / 10));
        assert_eq!(rules.next_change(day, DAY * 9 / 10), Some(DAY));
        assert_eq!(rules.next_change(day, DAY), None);
    }

    #[test]
    fn a_certificate_is_ok_exactly_before_its_ok_until() {
        let rules = IdentityRules::default();
        for c in [
            times(0, 365 * DAY, false),
            times(0, DAY, true),
            times(0, DAY, false),
            times(5 * DAY, 4 * DAY, true),
            times(0, 0, false),
        ] {
            let until = rules.ok_until(c);
            for now in [
                -DAY,
                0,
                DAY / 4,
                DAY / 2,
                DAY * 8 / 10,
                DAY,
                358 * DAY,
                400 * DAY,
            ]
            .into_iter()
            .chain([until - 1, until, until + 1])
            {
                assert_eq!(
                    rules.state(c, now) == CertState::Ok,
                    now < until,
                    "{c:?} at {now}"
                );
            }
        }
    }

    #[test]
    fn matchers_follow_envoys_string_matcher() {
        let uri = |v: &str| San::new(SanKind::Uri, v);
        let dns = |v: &str| San::new(SanKind::Dns, v);
        let svc_a = [
            dns("svc-a.shop"),
            uri("spiffe://shop.local/ns/shop/sa/svc-a"),
        ];
        let m = |kind, value: &str, san_type| SanMatcher {
            san_type,
            kind,
            value: value.into(),
            ignore_case: false,
        };
        let accept = |ms: &[SanMatcher]| Matchers::new(ms).accept(&svc_a);
        assert!(accept(&[SanMatcher::exact(
            SanKind::Uri,
            "spiffe://shop.local/ns/shop/sa/svc-a"
        )]));
        assert!(!accept(&[SanMatcher::exact(
            SanKind::Uri,
            "spiffe://shop.local/ns/shop/sa/WRONG"
        )]));
        // The type must agree: a URI matcher does not look at DNS SANs.
        assert!(!accept(&[SanMatcher::exact(SanKind::Uri, "svc-a.shop")]));
        assert!(accept(&[m(MatchKind::Exact, "svc-a.shop", None)]));
        assert!(accept(&[m(
            MatchKind::Prefix,
            "spiffe://shop.local/",
            Some(SanKind::Uri)
        )]));
        assert!(accept(&[m(MatchKind::Suffix, ".shop", Some(SanKind::Dns))]));
        assert!(accept(&[m(MatchKind::Contains, "sa/svc", None)]));
        assert!(accept(&[m(MatchKind::Regex, "svc-.*", Some(SanKind::Dns))]));
        assert!(
            !accept(&[m(MatchKind::Regex, "svc-", Some(SanKind::Dns))]),
            "a regex matches the whole SAN"
        );
        assert!(
            !accept(&[m(MatchKind::Regex, "(", None)]),
            "an invalid regex matches nothing"
        );
        let mut ci = SanMatcher::exact(SanKind::Dns, "SVC-A.SHOP");
        assert!(!accept(std::slice::from_ref(&ci)));
        ci.ignore_case = true;
        assert!(accept(&[ci]));
        // A wildcard certificate.
        assert!(
            Matchers::new(&[SanMatcher::exact(SanKind::Dns, "a.shop")]).accept(&[dns("*.shop")])
        );
        assert!(
            !Matchers::new(&[SanMatcher::exact(SanKind::Dns, "a.b.shop")]).accept(&[dns("*.shop")])
        );
        assert!(
            Matchers::new(&[]).accept(&[]),
            "no matchers accept anything"
        );
    }

    #[test]
    fn times_are_written_as_envoy_writes_them() {
        assert_eq!(rfc3339(1_796_110_222_500), "2026-12-01T07:30:22Z");
    }

    #[test]
    fn serials_are_spelt_as_envoy_spells_them() {
        assert_eq!(serial_hex(&[0x00, 0x9f, 0x01]), "9f01");
        assert_eq!(serial_hex(&[0x0a, 0xbc]), "0abc");
        assert_eq!(serial_hex(&[0, 0]), "0");
    }

    #[test]
    fn a_report_over_a_bound_is_named_and_its_digest_follows_its_content() {
        let cert = |serial: &str| ReportedCertificate {
            serial: serial.into(),
            role: CertRole::Chain,
            sans: vec![San::new(SanKind::Uri, "spiffe://a/b")],
            valid_from_ms: 0,
            expires_at_ms: DAY,
            secret: None,
        };
        let ok = IdentityReport::new(vec![cert("01")], Vec::new(), None);
        assert_eq!(ok.over_bound(10), None);
        assert_eq!(ok.digest, ok.content_digest());
        assert_ne!(
            ok.digest,
            IdentityReport::new(vec![cert("02")], Vec::new(), None).digest
        );
        let many = IdentityReport::new(
            (0..=MAX_CERTIFICATES)
                .map(|i| cert(&format!("{i:02x}")))
                .collect(),
            Vec::new(),
            None,
        );
        assert_eq!(many.over_bound(10), Some(refusal::TOO_MANY_CERTIFICATES));
        let refused = many.refusing(refusal::TOO_MANY_CERTIFICATES, 10);
        assert!(refused.certificates.is_empty());
        assert_eq!(refused.over_bound(10), None);
        let mut long = cert("03");
        long.sans = vec![San::new(SanKind::Dns, "x".repeat(MAX_SAN_BYTES + 1))];
        assert_eq!(
            IdentityReport::new(vec![long], Vec::new(), None).over_bound(10),
            Some(refusal::TEXT_TOO_LONG)
        );
        let expectations = (0..11)
            .map(|i| SanExpectation {
                cluster: format!("c{i}"),
                matchers: vec![SanMatcher::exact(SanKind::Uri, "spiffe://a/b")],
            })
            .collect();
        assert_eq!(
            IdentityReport::new(Vec::new(), expectations, None).over_bound(10),
            Some(refusal::TOO_MANY_MATCHERS)
        );
    }
}
