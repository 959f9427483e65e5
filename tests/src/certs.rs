//! mTLS material for test meshes, generated with rcgen: one CA and a certificate
//! per identity, written as PEM files for Envoy to read.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// A CA that signs identity certificates, with its files on disk.
#[derive(Debug)]
pub struct MeshCerts {
    /// Directory of every PEM file.
    dir: PathBuf,
    /// The CA's parameters and key, to sign more identities.
    issuer: Issuer<'static, KeyPair>,
    /// `ca.pem`.
    pub ca_file: PathBuf,
}

/// The files of one identity.
#[derive(Debug, Clone)]
pub struct Identity {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The DNS name in its subject alternative names.
    pub san: String,
}

/// A certificate to issue: its subject alternative names and its validity.
#[derive(Debug, Clone)]
pub struct CertSpec {
    /// Names its files (`<name>.pem`, `<name>-key.pem`) and its common name.
    pub name: String,
    pub dns: Vec<String>,
    /// URI SANs, such as SPIFFE IDs.
    pub uris: Vec<String>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl CertSpec {
    /// `name` with the DNS SAN `dns` and the URI SAN `uri`, valid from 30 days ago
    /// for `left` from now.
    pub fn valid_for(name: &str, dns: &str, uri: &str, left: Duration) -> Self {
        let now = SystemTime::now();
        CertSpec {
            name: name.to_owned(),
            dns: vec![dns.to_owned()],
            uris: vec![uri.to_owned()],
            not_before: now - Duration::from_secs(30 * 86_400),
            not_after: now + left,
        }
    }

    /// The same, already expired `ago`.
    pub fn expired(name: &str, dns: &str, uri: &str, ago: Duration) -> Self {
        let now = SystemTime::now();
        CertSpec {
            not_after: now - ago,
            ..CertSpec::valid_for(name, dns, uri, Duration::ZERO)
        }
    }
}

/// `t` as rcgen takes it (whole seconds).
fn datetime(t: SystemTime) -> anyhow::Result<time::OffsetDateTime> {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    };
    Ok(time::OffsetDateTime::from_unix_timestamp(secs)?)
}

impl MeshCerts {
    /// A new CA named `name`, written to `<dir>/<name>-ca.pem`.
    pub fn new(dir: &Path, name: &str) -> anyhow::Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        let ca_file = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&ca_file, cert.pem())?;
        Ok(Self {
            dir: dir.to_owned(),
            issuer: Issuer::new(params, key),
            ca_file,
        })
    }

    /// A certificate as `spec` says (an X.509 v3 leaf, usable as server and client).
    pub fn issue(&self, spec: &CertSpec) -> anyhow::Result<Identity> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        for d in &spec.dns {
            params
                .subject_alt_names
                .push(SanType::DnsName(d.clone().try_into()?));
        }
        for u in &spec.uris {
            params
                .subject_alt_names
                .push(SanType::URI(u.clone().try_into()?));
        }
        params
            .distinguished_name
            .push(DnType::CommonName, &spec.name);
        params.not_before = datetime(spec.not_before)?;
        params.not_after = datetime(spec.not_after)?;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let cert_file = self.dir.join(format!("{}.pem", spec.name));
        let key_file = self.dir.join(format!("{}-key.pem", spec.name));
        std::fs::write(&cert_file, cert.pem())?;
        std::fs::write(&key_file, key.serialize_pem())?;
        Ok(Identity {
            cert_file,
            key_file,
            san: spec.dns.first().cloned().unwrap_or_default(),
        })
    }

    /// A certificate for `san` (a DNS name), usable as server and client.
    pub fn identity(&self, san: &str) -> anyhow::Result<Identity> {
        let mut params = CertificateParams::new(vec![san.to_owned()])?;
        params.distinguished_name.push(DnType::CommonName, san);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let cert_file = self.dir.join(format!("{san}.pem"));
        let key_file = self.dir.join(format!("{san}-key.pem"));
        std::fs::write(&cert_file, cert.pem())?;
        std::fs::write(&key_file, key.serialize_pem())?;
        Ok(Identity {
            cert_file,
            key_file,
            san: san.to_owned(),
        })
    }
}
