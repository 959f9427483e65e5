//! The issuer's CA: generated at start, or read from a PEM certificate and its key;
//! it signs X.509 v3 leaf certificates for identities (URI, DNS, IP and email SANs,
//! server and client use, a random serial).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SanType, SerialNumber,
};
use time::OffsetDateTime;

use super::IdentityError;
use super::spec::San;

/// Bytes of a serial number (RFC 5280 allows up to 20).
const SERIAL_BYTES: usize = 16;

/// A CA that signs identities.
pub struct Ca {
    /// Its parameters (subject, key identifier) and signing key.
    issuer: Issuer<'static, KeyPair>,
    /// Its certificate (PEM), the trust root peers verify with.
    cert_pem: String,
    /// What `GET /identities` shows of it.
    info: CaInfo,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("info", &self.info)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// A CA certificate's subject, serial and validity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaInfo {
    /// The subject's common name (or the whole subject when it has none).
    pub subject: String,
    /// Lower-case hex, as Envoy's `/certs` writes it.
    pub serial: String,
    pub valid_from: SystemTime,
    pub expires_at: SystemTime,
}

/// One certificate signed for an identity, with its private key. Its `Debug` never
/// shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedCertificate {
    /// Lower-case hex without separators, as Envoy's `/certs` writes it.
    pub serial: String,
    /// `notBefore`, to the second.
    pub valid_from: SystemTime,
    /// `notAfter`: `valid_from` plus the lifetime.
    pub expires_at: SystemTime,
    /// The leaf certificate (PEM).
    pub cert_pem: String,
    /// Its private key (PKCS#8 PEM): served over SDS only, never logged or shown.
    pub(crate) key_pem: String,
}

impl std::fmt::Debug for IssuedCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCertificate")
            .field("serial", &self.serial)
            .field("valid_from", &self.valid_from)
            .field("expires_at", &self.expires_at)
            .field("key", &"<redacted>")
            .finish()
    }
}

impl IssuedCertificate {
    /// `expires_at - valid_from`.
    pub fn lifetime(&self) -> Duration {
        self.expires_at
            .duration_since(self.valid_from)
            .unwrap_or_default()
    }
}

impl Ca {
    /// A new self-signed CA (ECDSA P-256) named `common_name`, valid from now (to the
    /// second) for `lifetime`.
    pub fn generate(common_name: &str, lifetime: Duration) -> Result<Self, IdentityError> {
        let valid_from = whole_second(SystemTime::now());
        let expires_at = valid_from + lifetime;
        let serial = random_serial();
        let mut params = CertificateParams::default();
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        params.not_before = datetime(valid_from)?;
        params.not_after = datetime(expires_at)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
            info: CaInfo {
                subject: common_name.to_owned(),
                serial: hex(&serial),
                valid_from,
                expires_at,
            },
        })
    }

    /// The CA of a PEM certificate and its private key (PKCS#8 PEM): the certificate
    /// must be a CA (basic constraints) and the key its own.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, IdentityError> {
        let bad = |why: String| IdentityError::Ca(why);
        let key = KeyPair::from_pem(key_pem).map_err(|e| bad(format!("the key: {e}")))?;
        let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
            .map_err(|e| bad(format!("the certificate is not PEM: {e}")))?;
        let x509 = pem
            .parse_x509()
            .map_err(|e| bad(format!("the certificate does not parse: {e}")))?;
        if !x509.is_ca() {
            return Err(bad("the certificate is not a CA (basic constraints)".into()));
        }
        if x509.public_key().subject_public_key.data.as_ref() != key.der_bytes() {
            return Err(bad("the key is not the certificate's".into()));
        }
        let subject = x509
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map_or_else(|| x509.subject().to_string(), str::to_owned);
        let time = |t: x509_parser::time::ASN1Time| {
            UNIX_EPOCH + Duration::from_secs(u64::try_from(t.timestamp()).unwrap_or(0))
        };
        let info = CaInfo {
            subject,
            serial: hex(trim_zeros(x509.raw_serial())),
            valid_from: time(x509.validity().not_before),
            expires_at: time(x509.validity().not_after),
        };
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)
            .map_err(|e| bad(format!("the certificate: {e}")))?;
        Ok(Self {
            issuer,
            cert_pem: cert_pem.to_owned(),
            info,
        })
    }

    /// The CA certificate (PEM).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Its subject, serial and validity.
    pub fn info(&self) -> &CaInfo {
        &self.info
    }

    /// A leaf certificate for `sans` named `common_name`, with a new key and a random
    /// serial, valid from `now` (to the second) for `lifetime`, for servers and
    /// clients alike.
    pub fn issue(
        &self,
        common_name: &str,
        sans: &[San],
        now: SystemTime,
        lifetime: Duration,
    ) -> Result<IssuedCertificate, IdentityError> {
        let valid_from = whole_second(now);
        let expires_at = valid_from + lifetime;
        let serial = random_serial();
        let mut params = CertificateParams::default();
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        params.not_before = datetime(valid_from)?;
        params.not_after = datetime(expires_at)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.subject_alt_names = sans.iter().map(san).collect::<Result<_, _>>()?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCertificate {
            serial: hex(&serial),
            valid_from,
            expires_at,
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn san(s: &San) -> Result<SanType, IdentityError> {
    let ia5 = |v: &str| {
        rcgen::string::Ia5String::try_from(v)
            .map_err(|_| IdentityError::BadSan(format!("{v:?} is not ASCII")))
    };
    Ok(match s {
        San::Uri(v) => SanType::URI(ia5(v)?),
        San::Dns(v) => SanType::DnsName(ia5(v)?),
        San::Ip(ip) => SanType::IpAddress(*ip),
        San::Email(v) => SanType::Rfc822Name(ia5(v)?),
    })
}

/// A serial of [`SERIAL_BYTES`] random bytes whose first byte is neither zero nor
/// has its top bit set: its DER integer is those bytes exactly, so that Envoy's hex
/// (which drops leading zero bytes) is their hex.
fn random_serial() -> [u8; SERIAL_BYTES] {
    let mut serial: [u8; SERIAL_BYTES] = rand::random();
    serial[0] = (serial[0] & 0x7f).max(1);
    serial
}

/// Lower-case hex without separators.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// A DER integer's bytes without the zero bytes that only keep it positive.
fn trim_zeros(bytes: &[u8]) -> &[u8] {
    let first = bytes
        .iter()
        .position(|b| *b != 0)
        .unwrap_or(bytes.len().saturating_sub(1));
    &bytes[first..]
}

/// `t` without its fraction of a second (X.509 times have whole seconds).
pub(crate) fn whole_second(t: SystemTime) -> SystemTime {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn datetime(t: SystemTime) -> Result<OffsetDateTime, IdentityError> {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    i64::try_from(secs)
        .ok()
        .and_then(|s| OffsetDateTime::from_unix_timestamp(s).ok())
        .ok_or(IdentityError::BadTime)
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::extensions::GeneralName;

    fn parse(pem: &str) -> Vec<u8> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        pem.contents
    }

    #[test]
    fn a_leaf_is_v3_with_its_sans_serial_and_lifetime() {
        let ca = Ca::generate("test CA", Duration::from_secs(3600)).unwrap();
        let now = UNIX_EPOCH + Duration::from_millis(1_800_000_000_750);
        let sans = [
            San::Uri("spiffe://local/ns/local/sa/catalog".into()),
            San::Dns("catalog.local".into()),
            San::Ip("127.0.0.1".parse().unwrap()),
        ];
        let leaf = ca
            .issue("catalog", &sans, now, Duration::from_secs(90))
            .unwrap();
        assert_eq!(
            leaf.valid_from,
            UNIX_EPOCH + Duration::from_secs(1_800_000_000)
        );
        assert_eq!(leaf.lifetime(), Duration::from_secs(90));
        assert_eq!(leaf.serial.len(), 2 * SERIAL_BYTES);
        assert!(
            leaf.serial
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)),
            "{}",
            leaf.serial
        );

        let der = parse(&leaf.cert_pem);
        let (_, x509) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert_eq!(x509.version(), x509_parser::x509::X509Version::V3);
        assert_eq!(hex(x509.raw_serial()), leaf.serial, "no leading zero byte");
        assert_eq!(x509.validity().not_before.timestamp(), 1_800_000_000);
        assert_eq!(x509.validity().not_after.timestamp(), 1_800_000_090);
        assert!(!x509.is_ca());
        assert_eq!(
            x509.issuer()
                .iter_common_name()
                .next()
                .unwrap()
                .as_str()
                .unwrap(),
            "test CA"
        );
        let names: Vec<String> = x509
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|n| match n {
                GeneralName::URI(u) => format!("uri:{u}"),
                GeneralName::DNSName(d) => format!("dns:{d}"),
                GeneralName::IPAddress(ip) => format!("ip:{ip:?}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            names,
            [
                "uri:spiffe://local/ns/local/sa/catalog",
                "dns:catalog.local",
                "ip:[127, 0, 0, 1]"
            ]
        );
        let eku = x509.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth);
        // Signed by the CA.
        let ca_der = parse(ca.cert_pem());
        let (_, ca_x509) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
        x509.verify_signature(Some(ca_x509.public_key())).unwrap();
    }

    #[test]
    fn two_leaves_have_two_serials_and_two_keys() {
        let ca = Ca::generate("test CA", Duration::from_secs(3600)).unwrap();
        let sans = [San::Dns("a.local".into())];
        let now = SystemTime::now();
        let a = ca.issue("a", &sans, now, Duration::from_secs(60)).unwrap();
        let b = ca.issue("a", &sans, now, Duration::from_secs(60)).unwrap();
        assert_ne!(a.serial, b.serial);
        assert_ne!(a.key_pem, b.key_pem);
        assert!(!format!("{a:?}").contains("PRIVATE"), "{a:?}");
    }

    #[test]
    fn a_ca_is_read_back_from_its_pem_and_signs() {
        let made = Ca::generate("file CA", Duration::from_secs(86_400)).unwrap();
        let key = made.issuer.key().serialize_pem();
        let ca = Ca::from_pem(made.cert_pem(), &key).unwrap();
        assert_eq!(ca.info(), made.info());
        let leaf = ca
            .issue(
                "x",
                &[San::Dns("x.local".into())],
                SystemTime::now(),
                Duration::from_secs(60),
            )
            .unwrap();
        let der = parse(&leaf.cert_pem);
        let (_, x509) = x509_parser::parse_x509_certificate(&der).unwrap();
        let ca_der = parse(ca.cert_pem());
        let (_, ca_x509) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
        x509.verify_signature(Some(ca_x509.public_key())).unwrap();

        let other = KeyPair::generate().unwrap().serialize_pem();
        let err = Ca::from_pem(made.cert_pem(), &other).unwrap_err();
        assert!(err.to_string().contains("not the certificate's"), "{err}");
        let not_ca = ca
            .issue(
                "y",
                &[San::Dns("y.local".into())],
                SystemTime::now(),
                Duration::from_secs(60),
            )
            .unwrap();
        let err = Ca::from_pem(&not_ca.cert_pem, &not_ca.key_pem).unwrap_err();
        assert!(err.to_string().contains("not a CA"), "{err}");
    }
}
