//! The scrape's reading of a sidecar's certificates (contract section 19): Envoy's
//! `GET /certs` and, for the certificates it got over SDS, the secrets' names and
//! versions from `GET /config_dump?resource=dynamic_active_secrets`.
//!
//! Envoy lists one entry per TLS context in use, each with its CA and chain
//! certificates, so a certificate shared by the 20,000 clusters of a large mesh is
//! written 20,000 times (about 14 MB). [`CertsReader`] is fed the answer chunk by
//! chunk as it arrives: it follows the answer's top-level object and holds one TLS
//! context at a time, which it parses with serde and folds into the distinct
//! certificates (each once, by role and serial). Everything it hands to serde is
//! bounded; what it holds is at most [`MAX_CONTEXT`] bytes of one context and the
//! distinct certificates.

use std::collections::{BTreeMap, HashMap};

use meshcat_common::identity::{
    CertRole, MAX_CERTIFICATES, MAX_SAN_BYTES, MAX_SANS, MAX_SECRET_TEXT, MAX_SERIAL_DIGITS,
    ReportedCertificate, San, SanKind, SdsSecret, refusal, serial_hex,
};
use serde::Deserialize;
use serde_json::Value;

/// Largest `/certs` answer read (contract section 19): a sidecar of a 20,000-cluster
/// mesh with mTLS to each writes about 14 MB.
pub const MAX_CERTS_ANSWER: usize = 32 << 20;
/// Largest single TLS context entry, or other top-level value, of the answer: a real
/// one is a few hundred bytes per certificate.
pub const MAX_CONTEXT: usize = 1 << 20;

/// Why a `/certs` answer gave no certificates.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertsError {
    #[error("the /certs answer is not what Envoy writes: {0}")]
    Invalid(String),
    #[error("the /certs answer holds more than {MAX_CERTIFICATES} distinct certificates")]
    TooManyCertificates,
    #[error("a certificate in /certs has more than {MAX_SANS} subject alternative names")]
    TooManySans,
    #[error("a serial or subject alternative name in /certs is over its length bound")]
    TextTooLong,
    #[error("one TLS context of the /certs answer is over {MAX_CONTEXT} bytes")]
    ContextTooLarge,
}

impl CertsError {
    /// The reason the instance's certificates are reported refused with.
    pub fn reason(&self) -> &'static str {
        match self {
            CertsError::Invalid(_) => refusal::ANSWER_INVALID,
            CertsError::TooManyCertificates => refusal::TOO_MANY_CERTIFICATES,
            CertsError::TooManySans => refusal::TOO_MANY_SANS,
            CertsError::TextTooLong => refusal::TEXT_TOO_LONG,
            CertsError::ContextTooLarge => refusal::ANSWER_TOO_LARGE,
        }
    }
}

/// One TLS context of the answer.
#[derive(Debug, Deserialize)]
struct TlsContext {
    #[serde(default)]
    ca_cert: Vec<CertDetail>,
    #[serde(default)]
    cert_chain: Vec<CertDetail>,
}

/// One certificate as `/certs` describes it (`days_until_expiration` is left: the
/// state is taken from `expiration_time`).
#[derive(Debug, Deserialize)]
struct CertDetail {
    #[serde(default)]
    path: String,
    #[serde(default)]
    serial_number: String,
    #[serde(default)]
    subject_alt_names: Vec<SanEntry>,
    #[serde(default)]
    valid_from: Option<String>,
    #[serde(default)]
    expiration_time: Option<String>,
}

/// A SAN: Envoy writes one key of `dns`, `uri`, `ip_address`.
#[derive(Debug, Deserialize)]
struct SanEntry {
    dns: Option<String>,
    uri: Option<String>,
    ip_address: Option<String>,
}

/// Milliseconds since the epoch of an RFC 3339 time as Envoy writes them; 0 when
/// absent.
fn time_ms(t: Option<&str>) -> Result<i64, CertsError> {
    let Some(t) = t.filter(|t| !t.is_empty()) else {
        return Ok(0);
    };
    let at = humantime::parse_rfc3339_weak(t)
        .map_err(|e| CertsError::Invalid(format!("time {t:?}: {e}")))?;
    Ok(match at.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_millis().min(i64::MAX as u128) as i64,
        Err(e) => -(e.duration().as_millis().min(i64::MAX as u128) as i64),
    })
}

/// What a `/certs` answer gives: its distinct certificates, in the order first seen,
/// and whether any came inline (over SDS, or inline in the configuration), whose
/// secrets are then looked up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertsRead {
    pub certificates: Vec<ReportedCertificate>,
    pub inline: bool,
}

/// The distinct certificates of the contexts folded in.
#[derive(Debug, Default)]
struct Distinct {
    seen: HashMap<(CertRole, String), ()>,
    read: CertsRead,
}

impl Distinct {
    /// Folds one context's certificates in.
    fn take(&mut self, context: Value) -> Result<(), CertsError> {
        let context: TlsContext = serde_json::from_value(context)
            .map_err(|e| CertsError::Invalid(format!("a TLS context: {e}")))?;
        for (role, list) in [
            (CertRole::Ca, context.ca_cert),
            (CertRole::Chain, context.cert_chain),
        ] {
            for c in list {
                self.read.inline |= c.path == "<inline>";
                let key = (role, c.serial_number.to_ascii_lowercase());
                if self.seen.contains_key(&key) {
                    continue;
                }
                if self.read.certificates.len() >= MAX_CERTIFICATES {
                    return Err(CertsError::TooManyCertificates);
                }
                if c.subject_alt_names.len() > MAX_SANS {
                    return Err(CertsError::TooManySans);
                }
                let sans = c
                    .subject_alt_names
                    .into_iter()
                    .filter_map(|s| {
                        (s.dns.map(|v| San::new(SanKind::Dns, v)))
                            .or(s.uri.map(|v| San::new(SanKind::Uri, v)))
                            .or(s.ip_address.map(|v| San::new(SanKind::Ip, v)))
                    })
                    .collect::<Vec<_>>();
                if key.1.len() > MAX_SERIAL_DIGITS
                    || sans.iter().any(|s| s.value.len() > MAX_SAN_BYTES)
                {
                    return Err(CertsError::TextTooLong);
                }
                self.read.certificates.push(ReportedCertificate {
                    serial: key.1.clone(),
                    role,
                    sans,
                    valid_from_ms: time_ms(c.valid_from.as_deref())?,
                    expires_at_ms: time_ms(c.expiration_time.as_deref())?,
                    secret: None,
                });
                self.seen.insert(key, ());
            }
        }
        Ok(())
    }

    /// Forgets what was folded in (a repeated `certificates` key: the last wins, as
    /// in a parsed JSON object).
    fn clear(&mut self) {
        self.seen.clear();
        self.read = CertsRead::default();
    }
}

/// The distinct certificates of a whole `/certs` answer, read with serde alone: the
/// reference [`CertsReader`] is held to.
pub fn read_whole(text: &[u8]) -> Result<CertsRead, CertsError> {
    let v: Value = serde_json::from_slice(text).map_err(|e| CertsError::Invalid(e.to_string()))?;
    let Value::Object(mut root) = v else {
        return Err(CertsError::Invalid("not a JSON object".into()));
    };
    let mut out = Distinct::default();
    match root.remove("certificates") {
        None => {}
        Some(Value::Array(contexts)) => {
            for c in contexts {
                out.take(c)?;
            }
        }
        Some(_) => return Err(CertsError::Invalid("certificates is not an array".into())),
    }
    Ok(out.read)
}

/// Where [`CertsReader`] is in the answer's top-level object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum At {
    /// Before the object's `{`.
    #[default]
    Start,
    /// After `{`: a key or `}`.
    KeyOrEnd,
    /// After `,`: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After `:`: a value.
    Value,
    /// After a value: `,` or `}`.
    CommaOrEnd,
    /// After `[` of `certificates`: a context or `]`.
    ElementOrEnd,
    /// After `,` in `certificates`: a context.
    Element,
    /// After a context: `,` or `]`.
    ElementCommaOrEnd,
    /// After the object: white space only.
    Done,
}

/// What the token being collected into `buf` is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Token {
    #[default]
    None,
    Key,
    /// A value of another key (or a `certificates` that is no array), checked by
    /// serde and dropped.
    Other,
    /// One TLS context of `certificates`.
    Context,
}

/// A JSON value's extent, found as its bytes arrive.
#[derive(Debug, Clone, Copy, Default)]
struct Extent {
    started: bool,
    /// Open brackets (objects and arrays) not closed yet, and the most at once.
    depth: usize,
    max_depth: usize,
    in_string: bool,
    escaped: bool,
    /// A number or literal: it ends at the first byte that cannot follow a value.
    scalar: bool,
}

/// serde_json's bound on nesting, counted from the answer's root: a value nested
/// deeper is refused by the reference, and so here.
const MAX_NESTING: usize = 128;

/// Reads a `/certs` answer as it arrives: see the module's documentation. It agrees
/// with [`read_whole`] on every answer (the differential tests hold it to that), and
/// refuses one that breaks a bound as soon as it does.
#[derive(Debug, Default)]
pub struct CertsReader {
    at: At,
    token: Token,
    buf: Vec<u8>,
    extent: Extent,
    /// The key being read is `certificates`.
    certificates_key: bool,
    /// What is wrong with the last `certificates` seen, if anything: found at once
    /// but told at the end, since a later `certificates` would replace it.
    broken: Option<CertsError>,
    distinct: Distinct,
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

fn invalid(what: &str) -> CertsError {
    CertsError::Invalid(what.to_owned())
}

impl CertsReader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the next chunk of the answer. An error ends the reading: a bound broken
    /// (more certificates than kept, a context over [`MAX_CONTEXT`]) or bytes that
    /// are no JSON object.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), CertsError> {
        let mut i = 0;
        while i < chunk.len() {
            if self.token != Token::None {
                i += self.collect(&chunk[i..])?;
                continue;
            }
            let b = chunk[i];
            if is_space(b) {
                i += 1;
                continue;
            }
            let (next, token) = match (self.at, b) {
                (At::Start, b'{') => (At::KeyOrEnd, Token::None),
                (At::KeyOrEnd | At::Key, b'"') => (At::Colon, Token::Key),
                (At::KeyOrEnd | At::CommaOrEnd, b'}') => (At::Done, Token::None),
                (At::Colon, b':') => (At::Value, Token::None),
                (At::Value, b'[') if self.certificates_key => {
                    // The last `certificates` wins, as in a parsed object.
                    self.distinct.clear();
                    self.broken = None;
                    (At::ElementOrEnd, Token::None)
                }
                (At::Value, _) => (At::CommaOrEnd, Token::Other),
                (At::CommaOrEnd, b',') => (At::Key, Token::None),
                (At::ElementOrEnd | At::ElementCommaOrEnd, b']') => (At::CommaOrEnd, Token::None),
                (At::ElementOrEnd | At::Element, _) => (At::ElementCommaOrEnd, Token::Context),
                (At::ElementCommaOrEnd, b',') => (At::Element, Token::None),
                _ => return Err(invalid("a byte out of place in the answer's object")),
            };
            self.at = next;
            if token == Token::None {
                i += 1;
            } else {
                self.token = token;
                self.buf.clear();
                self.extent = Extent::default();
            }
        }
        Ok(())
    }

    /// Collects the current token's bytes from `bytes`; answers how many it took
    /// (a number's or literal's ending byte is left for [`Self::feed`]).
    fn collect(&mut self, bytes: &[u8]) -> Result<usize, CertsError> {
        for (n, &b) in bytes.iter().enumerate() {
            let e = &mut self.extent;
            if !e.started {
                e.started = true;
                match b {
                    b'{' | b'[' => {
                        e.depth = 1;
                        e.max_depth = 1;
                    }
                    b'"' => e.in_string = true,
                    b'}' | b']' | b',' | b':' => return Err(invalid("a value is missing")),
                    _ => e.scalar = true,
                }
            } else if e.scalar {
                if is_space(b) || matches!(b, b',' | b'}' | b']') {
                    self.end_token()?;
                    return Ok(n);
                }
            } else if e.in_string {
                if e.escaped {
                    e.escaped = false;
                } else if b == b'\\' {
                    e.escaped = true;
                } else if b == b'"' {
                    e.in_string = false;
                }
            } else {
                match b {
                    b'"' => e.in_string = true,
                    b'{' | b'[' => {
                        e.depth += 1;
                        e.max_depth = e.max_depth.max(e.depth);
                    }
                    b'}' | b']' => e.depth -= 1,
                    _ => {}
                }
            }
            if self.buf.len() >= MAX_CONTEXT {
                return Err(CertsError::ContextTooLarge);
            }
            self.buf.push(b);
            let e = &self.extent;
            if !e.scalar && !e.in_string && e.depth == 0 {
                self.end_token()?;
                return Ok(n + 1);
            }
        }
        Ok(bytes.len())
    }

    /// The token in `buf` is whole: read it.
    fn end_token(&mut self) -> Result<(), CertsError> {
        let token = std::mem::take(&mut self.token);
        // Nesting counted from the root: the object, and `certificates`' array.
        let outer = if token == Token::Context { 2 } else { 1 };
        if outer + self.extent.max_depth > MAX_NESTING {
            return Err(invalid("nested too deep"));
        }
        let json = |e: serde_json::Error| CertsError::Invalid(e.to_string());
        match token {
            Token::Key => {
                let key: String = serde_json::from_slice(&self.buf).map_err(json)?;
                self.certificates_key = key == "certificates";
            }
            Token::Other => {
                // Read as a value, as the reference reads it: skipping it would take
                // strings that are no UTF-8 or hold lone surrogates.
                serde_json::from_slice::<Value>(&self.buf).map_err(json)?;
                if self.certificates_key {
                    self.distinct.clear();
                    self.broken = Some(invalid("certificates is not an array"));
                }
            }
            Token::Context => {
                let context: Value = serde_json::from_slice(&self.buf).map_err(json)?;
                if self.broken.is_none()
                    && let Err(e) = self.distinct.take(context)
                {
                    // Past a bound nothing more is worth reading.
                    if matches!(e, CertsError::TooManyCertificates) {
                        return Err(e);
                    }
                    self.broken = Some(e);
                }
            }
            Token::None => {}
        }
        Ok(())
    }

    /// The distinct certificates of the whole answer.
    pub fn finish(self) -> Result<CertsRead, CertsError> {
        if self.at != At::Done || self.token != Token::None {
            return Err(invalid("the answer ends early"));
        }
        match self.broken {
            Some(e) => Err(e),
            None => Ok(self.distinct.read),
        }
    }
}

/// One SDS secret as `/config_dump?resource=dynamic_active_secrets` lists it (the
/// private key, which Envoy redacts anyway, is never read).
#[derive(Debug, Deserialize)]
struct DynamicSecret {
    #[serde(default)]
    name: String,
    #[serde(default)]
    version_info: String,
    #[serde(default)]
    last_updated: Option<String>,
    #[serde(default)]
    secret: Option<SecretBody>,
}

#[derive(Debug, Deserialize)]
struct SecretBody {
    #[serde(default)]
    tls_certificate: Option<TlsCertificate>,
    #[serde(default)]
    validation_context: Option<ValidationContext>,
}

#[derive(Debug, Deserialize)]
struct TlsCertificate {
    #[serde(default)]
    certificate_chain: Option<DataSource>,
}

#[derive(Debug, Deserialize)]
struct ValidationContext {
    #[serde(default)]
    trusted_ca: Option<DataSource>,
}

/// Envoy's `DataSource`: inline text, inline bytes (base64 in JSON), or a file (not
/// read: the agent may not see the sidecar's files).
#[derive(Debug, Deserialize)]
struct DataSource {
    inline_string: Option<String>,
    inline_bytes: Option<String>,
}

impl DataSource {
    fn pem(&self) -> Option<Vec<u8>> {
        if let Some(s) = &self.inline_string {
            return Some(s.as_bytes().to_vec());
        }
        let b = self.inline_bytes.as_ref()?;
        data_encoding::BASE64.decode(b.as_bytes()).ok()
    }
}

#[derive(Debug, Deserialize)]
struct SecretsDump {
    #[serde(default)]
    configs: Vec<DynamicSecret>,
}

/// The SDS secret of each certificate a sidecar took over SDS, by serial (as
/// [`serial_hex`] spells it), from its `/config_dump?resource=dynamic_active_secrets`.
/// Certificates that do not parse are left out: their certificate then shows as from
/// a file.
pub fn sds_secrets(text: &[u8]) -> Result<BTreeMap<String, SdsSecret>, CertsError> {
    let dump: SecretsDump =
        serde_json::from_slice(text).map_err(|e| CertsError::Invalid(e.to_string()))?;
    let mut out = BTreeMap::new();
    for s in dump.configs {
        let Some(body) = &s.secret else { continue };
        let sources = [
            body.tls_certificate
                .as_ref()
                .and_then(|t| t.certificate_chain.as_ref()),
            body.validation_context
                .as_ref()
                .and_then(|v| v.trusted_ca.as_ref()),
        ];
        let secret = SdsSecret {
            name: s.name.chars().take(MAX_SECRET_TEXT).collect(),
            version: s.version_info.chars().take(MAX_SECRET_TEXT).collect(),
            last_updated_ms: time_ms(s.last_updated.as_deref()).unwrap_or(0),
        };
        for pem in sources.into_iter().flatten().filter_map(DataSource::pem) {
            for block in x509_parser::pem::Pem::iter_from_buffer(&pem) {
                let Ok(block) = block else { break };
                if let Ok(cert) = block.parse_x509() {
                    out.entry(serial_hex(cert.raw_serial()))
                        .or_insert_with(|| secret.clone());
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!("{}/tests/fixtures/certs/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The answer split at every byte gives what serde gives of it whole.
    fn streamed(text: &[u8], chunk: usize) -> Result<CertsRead, CertsError> {
        let mut r = CertsReader::new();
        for c in text.chunks(chunk.max(1)) {
            r.feed(c)?;
        }
        r.finish()
    }

    /// Captured from Envoy 1.40: a listener requiring client certificates (svc-b's
    /// certificate) and two clusters presenting svc-a's, all under one CA: three
    /// contexts, three distinct certificates.
    #[test]
    fn a_real_answer_gives_each_certificate_once() {
        let text = fixture("listener_and_two_clusters.json");
        let whole = read_whole(&text).unwrap();
        assert!(!whole.inline);
        let certs = &whole.certificates;
        assert_eq!(certs.len(), 3);
        assert_eq!(
            (certs[0].role, certs[0].serial.as_str()),
            (CertRole::Ca, "2cb2faf5eea399dde9eb390a33d4747c07273a11")
        );
        assert!(certs[0].sans.is_empty());
        assert_eq!(certs[1].role, CertRole::Chain);
        assert_eq!(
            certs[1].sans,
            [
                San::new(SanKind::Dns, "svc-a.shop"),
                San::new(SanKind::Uri, "spiffe://shop.local/ns/shop/sa/svc-a"),
            ]
        );
        // 2026-12-01T07:30:22Z
        assert_eq!(certs[1].expires_at_ms, 1_796_110_222_000);
        assert_eq!(certs[1].valid_from_ms, 1_795_937_422_000);
        assert_eq!(certs[2].serial, "44bb3d710dac5769b9b1470a0fa782bf81d8bfe1");
        for chunk in 1..=text.len() {
            assert_eq!(
                streamed(&text, chunk).as_ref(),
                Ok(&whole),
                "chunks of {chunk}"
            );
        }
    }

    /// Captured from Envoy 1.40 fed over SDS by the test control server's issuer,
    /// after one rotation: `/certs` shows both certificates as `<inline>`, and the
    /// config dump's secrets (`svc` at version 2, `ca` at version 1) carry the PEMs
    /// whose serials name them.
    #[test]
    fn certificates_over_sds_are_named_by_their_secrets() {
        let read = read_whole(&fixture("sds_certs.json")).unwrap();
        assert!(read.inline);
        let serials: Vec<(CertRole, &str)> = read
            .certificates
            .iter()
            .map(|c| (c.role, c.serial.as_str()))
            .collect();
        assert_eq!(
            serials,
            [
                (CertRole::Ca, "017853aec603e3d32e829e14a4319c63"),
                (CertRole::Chain, "6beecfa65b79a38250b56cb4c2d3cdd0"),
            ]
        );
        let secrets = sds_secrets(&fixture("sds_secrets.json")).unwrap();
        assert_eq!(secrets.len(), 2, "{secrets:?}");
        for (c, (name, version)) in read.certificates.iter().zip([("ca", "1"), ("svc", "2")]) {
            let secret = &secrets[&c.serial];
            assert_eq!(
                (secret.name.as_str(), secret.version.as_str()),
                (name, version)
            );
            assert!(secret.last_updated_ms > 1_795_000_000_000, "{secret:?}");
        }
        // 2026-11-29T10:32:51.761Z
        assert_eq!(
            secrets["6beecfa65b79a38250b56cb4c2d3cdd0"].last_updated_ms,
            1_795_948_371_761
        );
    }

    #[test]
    fn a_bound_broken_ends_the_read_at_once() {
        let context = |i: usize| {
            format!(
                r#"{{"cert_chain":[{{"path":"<inline>","serial_number":"{i:04x}","subject_alt_names":[{{"uri":"spiffe://a/{i}"}}],"valid_from":"2026-01-01T00:00:00Z","expiration_time":"2027-01-01T00:00:00Z"}}]}}"#
            )
        };
        let answer = |n: usize| {
            let contexts: Vec<String> = (0..n).map(context).collect();
            format!(r#"{{"certificates":[{}]}}"#, contexts.join(","))
        };
        let ok = answer(MAX_CERTIFICATES);
        let read = streamed(ok.as_bytes(), 100).unwrap();
        assert_eq!(read.certificates.len(), MAX_CERTIFICATES);
        assert!(read.inline);
        let over = answer(MAX_CERTIFICATES + 1);
        assert_eq!(
            read_whole(over.as_bytes()),
            Err(CertsError::TooManyCertificates)
        );
        // The reader stops at the context past the bound, before the answer ends.
        let mut r = CertsReader::new();
        let cut = over.len() - 2;
        assert_eq!(
            r.feed(&over.as_bytes()[..cut]),
            Err(CertsError::TooManyCertificates)
        );
        // The same certificate in every context is one certificate.
        let same: Vec<String> = (0..1000).map(|_| context(7)).collect();
        let same = format!(r#"{{"certificates":[{}]}}"#, same.join(","));
        assert_eq!(
            streamed(same.as_bytes(), 4096).unwrap().certificates.len(),
            1
        );
        let sans: Vec<String> = (0..=MAX_SANS)
            .map(|i| format!(r#"{{"dns":"h{i}"}}"#))
            .collect();
        let many_sans = format!(
            r#"{{"certificates":[{{"cert_chain":[{{"serial_number":"01","subject_alt_names":[{}]}}]}}]}}"#,
            sans.join(",")
        );
        assert_eq!(
            streamed(many_sans.as_bytes(), 7),
            Err(CertsError::TooManySans)
        );
        let huge = format!(
            r#"{{"certificates":[{{"cert_chain":[],"x":"{}"}}]}}"#,
            "a".repeat(MAX_CONTEXT)
        );
        assert_eq!(
            streamed(huge.as_bytes(), 65536),
            Err(CertsError::ContextTooLarge)
        );
    }

    #[test]
    fn what_is_not_an_answer_is_refused_as_serde_refuses_it() {
        for bad in [
            &b""[..],
            b"[]",
            b"{",
            br#"{"certificates":[{}]"#,
            br#"{"certificates":[1]}"#,
            br#"{"certificates":null}"#,
            br#"{"certificates":[]} x"#,
            br#"{"certificates":[],}"#,
            br#"{"a":tru}"#,
            br#"{"a" 1}"#,
            // Found by the differential test: a lone surrogate, and bytes that are no
            // UTF-8, in a value of another key (skipping the value took them).
            br#"{"certificates":[],"cf":{"a":["\ud800"]}}"#,
            b"{\"x\":\"\xff\",\"certificates\":[]}",
        ] {
            assert!(read_whole(bad).is_err(), "{}", String::from_utf8_lossy(bad));
            assert!(
                streamed(bad, 1).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // Unknown keys and a repeated `certificates` (the last wins) are read alike.
        let odd = br#" { "x" : [1, {"y": "]}"}] , "certificates": [], "certificat\u0065s" : [ {"cert_chain": [{"serial_number": "AB", "valid_from": "2026-01-01T00:00:00Z"}]} ] , "z": -1.5e3 } "#;
        let whole = read_whole(odd).unwrap();
        assert_eq!(whole.certificates.len(), 1);
        assert_eq!(whole.certificates[0].serial, "ab");
        for chunk in 1..odd.len() {
            assert_eq!(
                streamed(odd, chunk).as_ref(),
                Ok(&whole),
                "chunks of {chunk}"
            );
        }
    }

    mod differential {
        //! The streaming reader against serde on generated answers: the same
        //! certificates on every answer serde reads, an error wherever serde's is one,
        //! whatever the chunks the answer arrives in.

        use proptest::prelude::*;
        use serde_json::{Value, json};

        use super::*;

        /// Text with escapes, quotes, unicode (astral included) and control bytes.
        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                "[a-z0-9.:/-]{0,16}",
                "\\PC{0,6}",
                Just("spiffe://shop/sa/\"q\"\\\u{1F600}\u{7}".to_owned()),
            ]
        }

        fn time() -> impl Strategy<Value = Value> {
            prop_oneof![
                4 => (0u64..4_000_000_000).prop_map(|s| {
                    json!(humantime::format_rfc3339_seconds(
                        std::time::UNIX_EPOCH + std::time::Duration::from_secs(s)
                    )
                    .to_string())
                }),
                1 => Just(Value::Null),
                1 => text().prop_map(Value::String),
                1 => Just(json!(12.5e3)),
            ]
        }

        fn any_json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(|n| json!(n)),
                any::<f64>()
                    .prop_filter("finite", |f| f.is_finite())
                    .prop_map(|f| json!(f)),
                text().prop_map(Value::String),
            ];
            leaf.prop_recursive(4, 16, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    prop::collection::btree_map(text(), inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        fn san() -> impl Strategy<Value = Value> {
            prop_oneof![
                text().prop_map(|v| json!({"dns": v})),
                text().prop_map(|v| json!({"uri": v})),
                text().prop_map(|v| json!({"ip_address": v})),
                any_json(),
            ]
        }

        fn cert() -> impl Strategy<Value = Value> {
            (
                prop_oneof![4 => "[0-9a-fA-F]{1,6}".prop_map(|s| json!(s)), 1 => any_json()],
                prop::collection::vec(san(), 0..4),
                time(),
                time(),
                prop::option::of(any_json()),
                any::<bool>(),
            )
                .prop_map(|(serial, sans, from, to, extra, inline)| {
                    let mut c = json!({
                        "path": if inline { "<inline>" } else { "/etc/certs/x.pem" },
                        "serial_number": serial,
                        "subject_alt_names": sans,
                        "days_until_expiration": "3",
                        "valid_from": from,
                        "expiration_time": to,
                    });
                    if let Some(e) = extra {
                        c["extra"] = e;
                    }
                    c
                })
        }

        fn context() -> impl Strategy<Value = Value> {
            prop_oneof![
                8 => (prop::collection::vec(cert(), 0..3), prop::collection::vec(cert(), 0..3))
                    .prop_map(|(ca, chain)| json!({"ca_cert": ca, "cert_chain": chain})),
                1 => any_json(),
            ]
        }

        fn answer() -> impl Strategy<Value = Vec<u8>> {
            (
                prop::collection::vec(context(), 0..6),
                prop::collection::btree_map("[a-z]{1,8}", any_json(), 0..3),
                any::<bool>(),
                prop_oneof![Just(""), Just(" "), Just("\n\t \r")],
            )
                .prop_map(|(contexts, extra, pretty, pad)| {
                    let mut root = serde_json::Map::new();
                    for (k, v) in extra {
                        root.insert(k, v);
                    }
                    root.insert("certificates".into(), Value::Array(contexts));
                    let root = Value::Object(root);
                    let text = if pretty {
                        serde_json::to_string_pretty(&root)
                    } else {
                        serde_json::to_string(&root)
                    }
                    .expect("values serialise");
                    format!("{pad}{text}{pad}").into_bytes()
                })
        }

        /// An answer, or one broken somewhere: cut, a byte changed, a byte added.
        fn input() -> impl Strategy<Value = Vec<u8>> {
            (
                answer(),
                0usize..4,
                any::<prop::sample::Index>(),
                any::<u8>(),
            )
                .prop_map(|(mut a, how, at, byte)| {
                    let i = at.index(a.len().max(1)).min(a.len());
                    match how {
                        1 => a.truncate(i),
                        2 if i < a.len() => a[i] = byte,
                        3 => a.insert(i, byte),
                        _ => {}
                    }
                    a
                })
        }

        proptest! {
            // The shared harness: 512 cases in the test command from the fixed seed,
            // `PROPTEST_CASES` for the long run, failures kept in
            // proptest-regressions/ (docs/reliability.md, "Parsers").
            #![proptest_config(meshcat_common::differential::config(512))]

            #[test]
            fn the_reader_agrees_with_serde(text in input(), chunk in 1usize..64) {
                let whole = read_whole(&text);
                let streamed = streamed(&text, chunk);
                match (&whole, &streamed) {
                    (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
                    (Err(_), Err(_)) => {}
                    _ => prop_assert!(
                        false,
                        "serde says {:?}, the reader says {:?} of {:?}",
                        whole,
                        streamed,
                        String::from_utf8_lossy(&text)
                    ),
                }
            }
        }
    }
}
