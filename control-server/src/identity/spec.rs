//! A declared identity: the SDS secret name Envoys ask for and the subject
//! alternative names its certificates carry, read from `secret=san,san,...` (a SAN
//! with `://` is a URI, an IP address an IP SAN, one with `@` an email, anything
//! else a DNS name).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use super::IdentityError;

/// The longest secret name or SAN accepted.
const MAX_NAME: usize = 256;
/// The most SANs one identity may carry.
const MAX_SANS: usize = 32;

/// One identity the issuer keeps a certificate for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentitySpec {
    /// The SDS secret that carries its certificate and key.
    pub secret: String,
    /// In the order given.
    pub sans: Vec<San>,
}

/// A subject alternative name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum San {
    /// A URI, such as a SPIFFE id (`spiffe://local/ns/local/sa/catalog`).
    Uri(String),
    Dns(String),
    Ip(IpAddr),
    Email(String),
}

impl IdentitySpec {
    /// An identity whose SANs are read from `sans` as `--identity` reads them.
    pub fn new<S: AsRef<str>>(
        secret: &str,
        sans: impl IntoIterator<Item = S>,
    ) -> Result<Self, IdentityError> {
        let spec = Self {
            secret: secret.to_owned(),
            sans: sans
                .into_iter()
                .map(|s| s.as_ref().parse())
                .collect::<Result<_, _>>()?,
        };
        spec.check()?;
        Ok(spec)
    }

    fn check(&self) -> Result<(), IdentityError> {
        let bad = |why: String| Err(IdentityError::BadIdentity(why));
        let name_ok = |c: char| c.is_ascii_alphanumeric() || "-_.~".contains(c);
        if self.secret.is_empty()
            || self.secret.len() > MAX_NAME
            || !self.secret.chars().all(name_ok)
        {
            return bad(format!(
                "{:?}: a secret name is 1 to {MAX_NAME} letters, digits, '-', '_', '.' or '~'",
                self.secret
            ));
        }
        if self.sans.is_empty() || self.sans.len() > MAX_SANS {
            return bad(format!(
                "{}: an identity has 1 to {MAX_SANS} SANs",
                self.secret
            ));
        }
        Ok(())
    }
}

impl FromStr for IdentitySpec {
    type Err = IdentityError;

    /// `secret=san,san,...`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (secret, sans) = s.split_once('=').ok_or_else(|| {
            IdentityError::BadIdentity(format!(
                "{s:?}: write an identity as secret=san,san (e.g. catalog=spiffe://local/ns/local/sa/catalog,catalog.local)"
            ))
        })?;
        Self::new(secret.trim(), sans.split(',').map(str::trim))
    }
}

impl FromStr for San {
    type Err = IdentityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() || s.len() > MAX_NAME || !s.is_ascii() || s.contains(char::is_whitespace) {
            return Err(IdentityError::BadSan(format!(
                "{s:?}: a SAN is 1 to {MAX_NAME} ASCII characters without spaces"
            )));
        }
        Ok(if s.contains("://") {
            San::Uri(s.to_owned())
        } else if let Ok(ip) = s.parse::<IpAddr>() {
            San::Ip(ip)
        } else if s.contains('@') {
            San::Email(s.to_owned())
        } else {
            San::Dns(s.to_owned())
        })
    }
}

impl fmt::Display for San {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            San::Uri(v) | San::Dns(v) | San::Email(v) => f.write_str(v),
            San::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_reads_its_sans_by_their_look() {
        let spec: IdentitySpec =
            "catalog=spiffe://local/ns/local/sa/catalog, catalog.local,10.0.0.7,ops@local"
                .parse()
                .unwrap();
        assert_eq!(spec.secret, "catalog");
        assert_eq!(
            spec.sans,
            [
                San::Uri("spiffe://local/ns/local/sa/catalog".into()),
                San::Dns("catalog.local".into()),
                San::Ip("10.0.0.7".parse().unwrap()),
                San::Email("ops@local".into()),
            ]
        );
        assert_eq!(spec.sans[2].to_string(), "10.0.0.7");
    }

    #[test]
    fn bad_identities_are_named() {
        for bad in [
            "catalog",
            "=a.local",
            "cat alog=a.local",
            "catalog=",
            "catalog=a b",
            "catalog=é.local",
        ] {
            let err = bad.parse::<IdentitySpec>().unwrap_err().to_string();
            assert!(!err.is_empty(), "{bad}");
        }
        let many = format!(
            "x={}",
            (0..=MAX_SANS)
                .map(|i| format!("h{i}.local"))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert!(many.parse::<IdentitySpec>().is_err());
    }
}
