//! Who an agent is and which zones it may report for: the agent token file, zone
//! grants carried by agent certificates (SAN URIs `meshcat:zone:<name>`), and the
//! assembly of the ingest TLS configuration from the aggregator's flags.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use meshcat_common::tls::{self, ClientAuth, TlsError, ZONE_URI_PREFIX};
use meshcat_common::validate::is_valid_name;
use rustls_pki_types::CertificateDer;
use subtle::ConstantTimeEq;
use x509_parser::extensions::GeneralName;

/// Longest token accepted in a token file or a hello.
pub const MAX_TOKEN_LEN: usize = 1024;
/// Most tokens a token file may hold.
pub const MAX_TOKENS: usize = 1024;

/// Why the agent authentication set-up could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot read agent token file {path}: {source}")]
    TokenFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("agent token file {path}, line {line}: {reason}")]
    TokenLine {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("agent token file {0} holds no token")]
    NoToken(PathBuf),
    #[error("--tls-cert and --tls-key are required unless --dev is given")]
    NoServerCert,
    #[error("agents cannot authenticate: give --client-ca, --agent-token-file or --dev")]
    NoAgentAuth,
}

/// The zones a credential may report for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZoneGrant {
    /// Every zone (`*`, or a credential that names no zone).
    All,
    /// Only these zones.
    Only(BTreeSet<String>),
}

impl ZoneGrant {
    pub fn allows(&self, zone: &str) -> bool {
        match self {
            ZoneGrant::All => true,
            ZoneGrant::Only(zones) => zones.contains(zone),
        }
    }

    fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut zones = BTreeSet::new();
        let mut any = false;
        for name in names {
            any = true;
            if name == "*" {
                return Ok(ZoneGrant::All);
            }
            if !is_valid_name(name) {
                return Err(format!("{name:?} is not a valid zone name"));
            }
            zones.insert(name.to_owned());
        }
        Ok(if any {
            ZoneGrant::Only(zones)
        } else {
            ZoneGrant::All
        })
    }
}

/// The zone grant carried by an agent certificate: its SAN URIs `meshcat:zone:<name>`
/// (`meshcat:zone:*` for all), the scheme and prefix matched exactly. A certificate
/// without any such URI (or with only misspelt ones) grants nothing, unless
/// `allow_any` (`--allow-any-zone-cert`) lets it report for every zone. An unparsable
/// certificate, or one naming an invalid zone, grants nothing.
pub fn cert_grant(cert: &CertificateDer<'_>, allow_any: bool) -> Option<ZoneGrant> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let mut uris = Vec::new();
    if let Ok(Some(san)) = parsed.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::URI(uri) = name
                && let Some(zone) = uri.strip_prefix(ZONE_URI_PREFIX)
            {
                uris.push(zone);
            }
        }
    }
    if uris.is_empty() {
        return allow_any.then_some(ZoneGrant::All);
    }
    ZoneGrant::from_names(uris).ok()
}

/// SHA-256 of `bytes`: what credentials are compared and told apart by.
pub fn digest(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// A token of the agent token file with the zones it grants.
struct TokenEntry {
    token: Vec<u8>,
    grant: ZoneGrant,
}

impl std::fmt::Debug for TokenEntry {
    // Tokens are secrets: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenEntry")
            .field("grant", &self.grant)
            .finish_non_exhaustive()
    }
}

/// How the ingest server authenticates agents beyond the TLS handshake.
#[derive(Debug, Default)]
pub struct AgentAuth {
    /// Whether client certificates are verified against an agent CA; a verified
    /// certificate authenticates the agent on its own.
    pub certificates: bool,
    /// Shared agent tokens accepted in the hello.
    tokens: Vec<TokenEntry>,
    /// Whether a certificate without any `meshcat:zone:` URI may report for every
    /// zone (`--allow-any-zone-cert`); otherwise it is refused.
    pub any_zone_cert: bool,
}

impl AgentAuth {
    /// Certificates only.
    pub fn certificates() -> Self {
        AgentAuth {
            certificates: true,
            tokens: Vec::new(),
            any_zone_cert: false,
        }
    }

    /// Adds the tokens of a token file: one per line, `TOKEN` or `TOKEN ZONES` where
    /// ZONES is `*` or a comma-separated list; blank lines and `#` comments are skipped.
    pub fn with_token_file(mut self, path: &Path) -> Result<Self, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::TokenFile {
            path: path.to_owned(),
            source,
        })?;
        let line_err = |line: usize, reason: String| AuthError::TokenLine {
            path: path.to_owned(),
            line,
            reason,
        };
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split_whitespace();
            let token = fields.next().unwrap_or_default();
            let zones = fields.next();
            if fields.next().is_some() {
                return Err(line_err(n + 1, "expected `TOKEN [ZONES]`".into()));
            }
            if token.len() > MAX_TOKEN_LEN {
                return Err(line_err(
                    n + 1,
                    format!("token longer than {MAX_TOKEN_LEN} bytes"),
                ));
            }
            let grant = match zones {
                None => ZoneGrant::All,
                Some(list) => {
                    ZoneGrant::from_names(list.split(',')).map_err(|r| line_err(n + 1, r))?
                }
            };
            if self.tokens.len() >= MAX_TOKENS {
                return Err(line_err(n + 1, format!("more than {MAX_TOKENS} tokens")));
            }
            self.tokens.push(TokenEntry {
                token: token.as_bytes().to_vec(),
                grant,
            });
        }
        if self.tokens.is_empty() {
            return Err(AuthError::NoToken(path.to_owned()));
        }
        Ok(self)
    }

    /// Whether agents can authenticate with a token.
    pub fn has_tokens(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// The grant of a hello token. Every entry is compared as a SHA-256 digest in
    /// constant time, so the answer's timing says nothing about which token came close
    /// nor how long the tokens are.
    pub fn token_grant(&self, token: &str) -> Option<ZoneGrant> {
        let got = digest(token.as_bytes());
        let mut found = None;
        for entry in &self.tokens {
            if bool::from(digest(&entry.token).as_slice().ct_eq(&got)) && found.is_none() {
                found = Some(entry.grant.clone());
            }
        }
        found
    }
}

/// The aggregator's flags that shape agent security.
#[derive(Debug, Clone, Default)]
pub struct SecurityOptions {
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub client_ca: Option<PathBuf>,
    pub agent_token_file: Option<PathBuf>,
    pub dev: bool,
    pub data_dir: PathBuf,
    /// `--allow-any-zone-cert`.
    pub allow_any_zone_cert: bool,
}

impl SecurityOptions {
    /// Builds the QUIC server configuration and the agent authentication. In dev mode
    /// the development certificates fill in whatever was not given.
    pub fn load(&self) -> Result<(quinn::ServerConfig, AgentAuth), AuthError> {
        let dev = if self.dev {
            Some(tls::dev_setup(&self.data_dir)?)
        } else {
            None
        };
        let (cert, key) = match (&self.tls_cert, &self.tls_key, &dev) {
            (Some(cert), Some(key), _) => (cert.clone(), key.clone()),
            (None, None, Some(dev)) => (dev.server_cert.clone(), dev.server_key.clone()),
            _ => return Err(AuthError::NoServerCert),
        };
        let client_ca = self
            .client_ca
            .clone()
            .or_else(|| dev.as_ref().map(|d| d.ca.clone()));
        let mut auth = AgentAuth {
            certificates: client_ca.is_some(),
            tokens: Vec::new(),
            any_zone_cert: self.allow_any_zone_cert,
        };
        if let Some(path) = &self.agent_token_file {
            auth = auth.with_token_file(path)?;
        }
        let client_auth = match (client_ca, auth.has_tokens()) {
            (Some(ca), true) => ClientAuth::Optional(ca),
            (Some(ca), false) => ClientAuth::Required(ca),
            (None, true) => ClientAuth::None,
            (None, false) => return Err(AuthError::NoAgentAuth),
        };
        let server = tls::server_config(&cert, &key, &client_auth)?;
        Ok((server, auth))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_file_lines_carry_zones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(
            &path,
            "# comment\n\n  all-zones  \nscoped east,west\nstar *\n",
        )
        .unwrap();
        let auth = AgentAuth::default().with_token_file(&path).unwrap();
        assert_eq!(auth.token_grant("all-zones"), Some(ZoneGrant::All));
        assert_eq!(auth.token_grant("star"), Some(ZoneGrant::All));
        let scoped = auth.token_grant("scoped").unwrap();
        assert!(scoped.allows("east") && scoped.allows("west") && !scoped.allows("north"));
        assert_eq!(auth.token_grant("scope"), None);
        assert_eq!(auth.token_grant(""), None);
    }

    #[test]
    fn bad_token_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        for bad in ["", "# only a comment\n", "t a b\n", "t bad/zone\n"] {
            std::fs::write(&path, bad).unwrap();
            assert!(
                AgentAuth::default().with_token_file(&path).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn security_options_need_a_server_certificate_and_a_way_to_authenticate() {
        let dir = tempfile::tempdir().unwrap();
        let none = SecurityOptions {
            data_dir: dir.path().to_owned(),
            ..SecurityOptions::default()
        };
        assert!(matches!(none.load(), Err(AuthError::NoServerCert)));
        let files = tls::dev_setup(&dir.path().join("other")).unwrap();
        let no_auth = SecurityOptions {
            tls_cert: Some(files.server_cert.clone()),
            tls_key: Some(files.server_key.clone()),
            ..none.clone()
        };
        assert!(matches!(no_auth.load(), Err(AuthError::NoAgentAuth)));
        let mtls = SecurityOptions {
            client_ca: Some(files.ca.clone()),
            ..no_auth
        };
        assert!(mtls.load().unwrap().1.certificates);
        let dev = SecurityOptions { dev: true, ..none };
        let (_, auth) = dev.load().unwrap();
        assert!(auth.certificates && !auth.has_tokens());
        assert!(dir.path().join("dev/agent-key.pem").is_file());
    }

    #[test]
    fn dev_agent_certificate_grants_every_zone() {
        let dir = tempfile::tempdir().unwrap();
        let files = tls::dev_setup(dir.path()).unwrap();
        let cert = tls::load_certs(&files.agent_cert).unwrap().remove(0);
        assert_eq!(cert_grant(&cert, false), Some(ZoneGrant::All));
    }
}
