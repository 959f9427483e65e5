//! The declared identities, the certificate each has now and when rotation replaces
//! it; what they serve over SDS (each certificate, and the CA as a validation
//! context) and what the admin API shows of them. No I/O and no clock of its own:
//! every call says what time it is, so the schedule is tested as plain data.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::ca::{Ca, IssuedCertificate};
use super::spec::IdentitySpec;
use super::{IdentityError, IssuerOptions};
use crate::spec::SecretSpec;

/// The identities of one issuer.
#[derive(Debug)]
pub(crate) struct Registry {
    ca: Ca,
    options: IssuerOptions,
    /// Whether certificates are replaced when due.
    rotation: bool,
    /// By secret name.
    entries: BTreeMap<String, Entry>,
}

/// One identity and its current certificate.
#[derive(Debug)]
struct Entry {
    spec: IdentitySpec,
    cert: IssuedCertificate,
    /// When rotation replaces `cert`: `rotate_at` of its lifetime after `valid_from`.
    rotate_after: SystemTime,
    /// Certificates issued for it after the first.
    rotations: u64,
    /// The snapshot version that first served `cert` ("" until published).
    version: String,
}

/// One certificate issued: for a new identity, a rotation, or on demand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rotation {
    pub secret: String,
    /// The serial of the certificate it replaced; none for a new identity.
    pub previous_serial: Option<String>,
    /// When the replaced certificate expires (RFC 3339).
    pub previous_expires_at: Option<String>,
    /// Lower-case hex, as Envoy's `/certs` writes it.
    pub serial: String,
    /// RFC 3339, UTC, to the second (as Envoy's `/certs` writes `valid_from`).
    pub valid_from: String,
    /// RFC 3339 (Envoy's `expiration_time`).
    pub expires_at: String,
    pub valid_from_ms: u64,
    pub expires_at_ms: u64,
    /// The snapshot version that serves it (Envoy's `version_info` of the secret
    /// over state-of-the-world ADS).
    pub version: String,
}

/// What `GET /identities` answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IssuerState {
    /// Whether certificates are replaced when due.
    pub rotation: bool,
    /// The lifetime of each certificate rotation issues.
    pub lifetime_seconds: u64,
    /// The fraction of its lifetime after which a certificate is replaced.
    pub rotate_at: f64,
    pub ca: CaState,
    /// Sorted by secret name.
    pub identities: Vec<IdentityState>,
}

/// The CA, served as the validation context secret `secret`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CaState {
    pub secret: String,
    pub subject: String,
    pub serial: String,
    pub valid_from: String,
    pub expires_at: String,
    pub valid_from_ms: u64,
    pub expires_at_ms: u64,
}

/// One identity and its current certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityState {
    pub secret: String,
    /// As declared: URIs, DNS names, IP addresses, emails.
    pub sans: Vec<String>,
    pub serial: String,
    pub valid_from: String,
    pub expires_at: String,
    pub valid_from_ms: u64,
    pub expires_at_ms: u64,
    /// This certificate's lifetime (`expiresAt - validFrom`).
    pub lifetime_seconds: u64,
    /// When rotation replaces it (or would, while rotation is stopped).
    pub rotate_after: String,
    pub rotate_after_ms: u64,
    /// Certificates issued for it after the first.
    pub rotations: u64,
    /// The snapshot version that first served this certificate.
    pub version: String,
}

impl Registry {
    /// No identity yet, rotation running.
    pub(crate) fn new(ca: Ca, options: IssuerOptions) -> Result<Self, IdentityError> {
        options.check()?;
        Ok(Self {
            ca,
            options,
            rotation: true,
            entries: BTreeMap::new(),
        })
    }

    /// Issues a certificate for `spec` (a new identity, or new SANs for a known one).
    pub(crate) fn declare(
        &mut self,
        spec: IdentitySpec,
        now: SystemTime,
    ) -> Result<Rotation, IdentityError> {
        self.options.check_identities(std::slice::from_ref(&spec))?;
        let cert = self
            .ca
            .issue(&spec.secret, &spec.sans, now, self.options.lifetime)?;
        let previous = self.entries.remove(&spec.secret);
        let secret = spec.secret.clone();
        let entry = Entry {
            rotate_after: self.rotate_after(&cert),
            spec,
            cert,
            rotations: previous.as_ref().map_or(0, |p| p.rotations + 1),
            version: String::new(),
        };
        let rotation = rotation(&entry, previous.as_ref().map(|p| &p.cert));
        self.entries.insert(secret, entry);
        Ok(rotation)
    }

    /// Replaces `secret`'s certificate now with one of `lifetime` (none: the
    /// configured one), whether rotation runs or not.
    pub(crate) fn rotate(
        &mut self,
        secret: &str,
        now: SystemTime,
        lifetime: Option<Duration>,
    ) -> Result<Rotation, IdentityError> {
        let lifetime = lifetime.unwrap_or(self.options.lifetime);
        self.options.check_lifetime(lifetime)?;
        let entry = self
            .entries
            .get(secret)
            .ok_or_else(|| IdentityError::Unknown(secret.to_owned()))?;
        let cert = self
            .ca
            .issue(&entry.spec.secret, &entry.spec.sans, now, lifetime)?;
        let rotate_after = self.rotate_after(&cert);
        let entry = self.entries.get_mut(secret).expect("looked up above");
        let previous = std::mem::replace(&mut entry.cert, cert);
        entry.rotate_after = rotate_after;
        entry.rotations += 1;
        entry.version.clear();
        Ok(rotation(entry, Some(&previous)))
    }

    /// Replaces every certificate now.
    pub(crate) fn rotate_all(&mut self, now: SystemTime) -> Result<Vec<Rotation>, IdentityError> {
        let names: Vec<String> = self.entries.keys().cloned().collect();
        names
            .iter()
            .map(|name| self.rotate(name, now, None))
            .collect()
    }

    /// Replaces the certificates whose rotation is due at `now`, if rotation runs.
    pub(crate) fn rotate_due(&mut self, now: SystemTime) -> Result<Vec<Rotation>, IdentityError> {
        if !self.rotation {
            return Ok(Vec::new());
        }
        let due: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| e.rotate_after <= now)
            .map(|(name, _)| name.clone())
            .collect();
        due.iter()
            .map(|name| self.rotate(name, now, None))
            .collect()
    }

    /// When the next rotation is due; none while rotation is stopped or there is
    /// no identity.
    pub(crate) fn next_due(&self) -> Option<SystemTime> {
        if !self.rotation {
            return None;
        }
        self.entries.values().map(|e| e.rotate_after).min()
    }

    /// Starts or stops rotation; returns whether it ran.
    pub(crate) fn set_rotation(&mut self, on: bool) -> bool {
        std::mem::replace(&mut self.rotation, on)
    }

    pub(crate) fn rotation(&self) -> bool {
        self.rotation
    }

    /// Notes that `rotations` are served from snapshot `version`.
    pub(crate) fn published(&mut self, rotations: &mut [Rotation], version: &str) {
        for r in rotations {
            r.version = version.to_owned();
            if let Some(e) = self.entries.get_mut(&r.secret) {
                if e.cert.serial == r.serial {
                    e.version = version.to_owned();
                }
            }
        }
    }

    /// What the issuer serves over SDS: the CA (a validation context) and each
    /// identity's certificate and key.
    pub(crate) fn secrets(&self) -> Vec<SecretSpec> {
        let mut secrets = vec![SecretSpec::trusted_ca(
            &self.options.ca_secret,
            self.ca.cert_pem().to_owned(),
        )];
        secrets.extend(self.entries.values().map(|e| {
            SecretSpec::certificate(
                &e.spec.secret,
                e.cert.cert_pem.clone(),
                e.cert.key_pem.clone(),
            )
        }));
        secrets
    }

    /// The CA certificate (PEM).
    pub(crate) fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// What the admin API shows: no key material.
    pub(crate) fn state(&self) -> IssuerState {
        let ca = self.ca.info();
        IssuerState {
            rotation: self.rotation,
            lifetime_seconds: self.options.lifetime.as_secs(),
            rotate_at: self.options.rotate_at,
            ca: CaState {
                secret: self.options.ca_secret.clone(),
                subject: ca.subject.clone(),
                serial: ca.serial.clone(),
                valid_from: rfc3339(ca.valid_from),
                expires_at: rfc3339(ca.expires_at),
                valid_from_ms: ms(ca.valid_from),
                expires_at_ms: ms(ca.expires_at),
            },
            identities: self
                .entries
                .values()
                .map(|e| IdentityState {
                    secret: e.spec.secret.clone(),
                    sans: e.spec.sans.iter().map(ToString::to_string).collect(),
                    serial: e.cert.serial.clone(),
                    valid_from: rfc3339(e.cert.valid_from),
                    expires_at: rfc3339(e.cert.expires_at),
                    valid_from_ms: ms(e.cert.valid_from),
                    expires_at_ms: ms(e.cert.expires_at),
                    lifetime_seconds: e.cert.lifetime().as_secs(),
                    rotate_after: rfc3339(e.rotate_after),
                    rotate_after_ms: ms(e.rotate_after),
                    rotations: e.rotations,
                    version: e.version.clone(),
                })
                .collect(),
        }
    }

    fn rotate_after(&self, cert: &IssuedCertificate) -> SystemTime {
        cert.valid_from + cert.lifetime().mul_f64(self.options.rotate_at)
    }
}

fn rotation(entry: &Entry, previous: Option<&IssuedCertificate>) -> Rotation {
    Rotation {
        secret: entry.spec.secret.clone(),
        previous_serial: previous.map(|p| p.serial.clone()),
        previous_expires_at: previous.map(|p| rfc3339(p.expires_at)),
        serial: entry.cert.serial.clone(),
        valid_from: rfc3339(entry.cert.valid_from),
        expires_at: rfc3339(entry.cert.expires_at),
        valid_from_ms: ms(entry.cert.valid_from),
        expires_at_ms: ms(entry.cert.expires_at),
        version: entry.version.clone(),
    }
}

/// RFC 3339, UTC, to the second.
fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Milliseconds since the Unix epoch.
fn ms(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SecretKind;

    const T0: u64 = 1_800_000_000;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(T0 + secs)
    }

    fn registry(lifetime: u64, rotate_at: f64) -> Registry {
        let ca = Ca::generate("test CA", Duration::from_secs(365 * 86_400)).unwrap();
        Registry::new(
            ca,
            IssuerOptions {
                lifetime: Duration::from_secs(lifetime),
                rotate_at,
                ca_secret: "ca".into(),
            },
        )
        .unwrap()
    }

    fn spec(name: &str) -> IdentitySpec {
        IdentitySpec::new(
            name,
            [
                format!("spiffe://local/ns/local/sa/{name}"),
                format!("{name}.local"),
            ],
        )
        .unwrap()
    }

    #[test]
    fn a_certificate_is_replaced_at_its_fraction_of_lifetime() {
        let mut r = registry(100, 0.5);
        let first = r.declare(spec("catalog"), at(0)).unwrap();
        assert_eq!(first.previous_serial, None);
        assert_eq!(first.valid_from_ms, (T0) * 1000);
        assert_eq!(first.expires_at_ms, (T0 + 100) * 1000);
        assert_eq!(first.expires_at, "2027-01-15T08:01:40Z");
        assert_eq!(r.next_due(), Some(at(50)));

        assert!(r.rotate_due(at(49)).unwrap().is_empty());
        let rotated = r.rotate_due(at(50)).unwrap();
        assert_eq!(rotated.len(), 1);
        let second = &rotated[0];
        assert_eq!(
            second.previous_serial.as_deref(),
            Some(first.serial.as_str())
        );
        assert_eq!(
            second.previous_expires_at.as_deref(),
            Some(first.expires_at.as_str())
        );
        assert_ne!(second.serial, first.serial);
        assert_eq!(second.valid_from_ms, (T0 + 50) * 1000);
        assert_eq!(second.expires_at_ms, (T0 + 150) * 1000);
        assert_eq!(r.next_due(), Some(at(100)));
        let state = r.state().identities.remove(0);
        assert_eq!(state.rotations, 1);
        assert_eq!(state.rotate_after_ms, (T0 + 100) * 1000);
        assert_eq!(state.lifetime_seconds, 100);
    }

    #[test]
    fn stopped_rotation_lets_certificates_age_and_start_catches_up() {
        let mut r = registry(10, 0.5);
        let first = r.declare(spec("edge"), at(0)).unwrap();
        assert!(r.set_rotation(false));
        assert_eq!(r.next_due(), None);
        assert!(r.rotate_due(at(5)).unwrap().is_empty());
        assert!(
            r.rotate_due(at(60)).unwrap().is_empty(),
            "expired, not replaced"
        );
        assert_eq!(r.state().identities[0].serial, first.serial);
        assert!(!r.state().rotation);

        assert!(!r.set_rotation(true));
        assert_eq!(r.next_due(), Some(at(5)), "overdue");
        let caught_up = r.rotate_due(at(60)).unwrap();
        assert_eq!(caught_up.len(), 1);
        assert_eq!(caught_up[0].valid_from_ms, (T0 + 60) * 1000);
    }

    #[test]
    fn forced_and_one_off_certificates() {
        let mut r = registry(3600, 0.5);
        r.declare(spec("catalog"), at(0)).unwrap();
        r.declare(spec("reviews"), at(0)).unwrap();
        r.set_rotation(false);
        // Forced, rotation running or not.
        let all = r.rotate_all(at(1)).unwrap();
        assert_eq!(
            all.iter().map(|r| r.secret.as_str()).collect::<Vec<_>>(),
            ["catalog", "reviews"]
        );
        // A lifetime of its own, once: the next rotation goes back to the usual one.
        let short = r
            .rotate("catalog", at(2), Some(Duration::from_secs(90)))
            .unwrap();
        assert_eq!(short.expires_at_ms - short.valid_from_ms, 90_000);
        r.set_rotation(true);
        assert_eq!(r.next_due(), Some(at(47)));
        let next = r.rotate_due(at(47)).unwrap();
        assert_eq!(next[0].expires_at_ms - next[0].valid_from_ms, 3_600_000);

        let unknown = r.rotate("orders", at(3), None).unwrap_err();
        assert!(matches!(unknown, IdentityError::Unknown(_)), "{unknown}");
        for bad in [Duration::from_secs(1), Duration::from_millis(2500)] {
            let err = r.rotate("catalog", at(3), Some(bad)).unwrap_err();
            assert!(matches!(err, IdentityError::BadOptions(_)), "{err}");
        }
        let ca_name = r.declare(spec("ca"), at(3)).unwrap_err();
        assert!(
            matches!(ca_name, IdentityError::BadIdentity(_)),
            "{ca_name}"
        );
    }

    #[test]
    fn secrets_carry_the_ca_and_each_certificate_and_the_state_no_key() {
        let mut r = registry(3600, 0.5);
        let mut issued = vec![r.declare(spec("catalog"), at(0)).unwrap()];
        r.published(&mut issued, "7");
        assert_eq!(issued[0].version, "7");
        let secrets = r.secrets();
        assert_eq!(
            secrets.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["ca", "catalog"]
        );
        assert!(
            matches!(&secrets[0].kind, SecretKind::TrustedCa { ca_pem } if ca_pem == r.ca_pem())
        );
        let SecretKind::Certificate { chain_pem, key_pem } = &secrets[1].kind else {
            panic!("{:?}", secrets[1]);
        };
        assert!(chain_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(key_pem.contains("PRIVATE KEY"));
        assert!(!format!("{secrets:?}").contains("PRIVATE KEY"));

        let state = r.state();
        assert_eq!(state.identities[0].version, "7");
        assert_eq!(
            state.identities[0].sans,
            ["spiffe://local/ns/local/sa/catalog", "catalog.local"]
        );
        assert_eq!(state.ca.secret, "ca");
        assert_eq!(state.ca.subject, "test CA");
        let json = serde_json::to_string(&state).unwrap();
        assert!(!json.contains("PRIVATE"), "{json}");
        assert!(
            json.contains("\"validFrom\":\"2027-01-15T08:00:00Z\""),
            "{json}"
        );
    }

    #[test]
    fn options_are_checked() {
        let ca = || Ca::generate("test CA", Duration::from_secs(86_400)).unwrap();
        for (lifetime, rotate_at) in [(100, 0.0), (100, 1.0), (100, f64::NAN), (1, 0.5)] {
            let options = IssuerOptions {
                lifetime: Duration::from_secs(lifetime),
                rotate_at,
                ca_secret: "ca".into(),
            };
            assert!(
                Registry::new(ca(), options).is_err(),
                "{lifetime} {rotate_at}"
            );
        }
    }
}
