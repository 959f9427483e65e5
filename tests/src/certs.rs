//! mTLS material for test meshes, generated with rcgen: one CA and a certificate
//! per identity, written as PEM files for Envoy to read.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

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
