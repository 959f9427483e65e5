//! TLS for the agent ↔ aggregator QUIC link, in one place: the process-wide crypto
//! provider, PEM loading, the quinn server and client configurations (TLS 1.3 only,
//! ALPN `meshcat/1`) and the development-mode certificate set written under
//! `<data-dir>/dev/`.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tracing::{info, warn};

use crate::wire::ALPN;

/// SAN URI prefix naming a zone an agent certificate may report for.
pub const ZONE_URI_PREFIX: &str = "meshcat:zone:";

/// How long a connection may stay silent before it is considered dead. Agents send
/// keep-alives well within it.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Keep-alive period of agents, so an idle control connection survives NATs and the
/// aggregator's idle timeout.
pub const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// What a server connection accepts before its agent is authenticated: the control
/// stream alone, and this many bytes of data in flight over the whole connection
/// (the hello is at most 4 KiB). Quinn's defaults (8 streams of 1.25 MB each) would let
/// an unauthenticated peer make the server buffer 10 MB.
pub const PRE_AUTH_STREAMS: u32 = 1;
/// See [`PRE_AUTH_STREAMS`].
pub const PRE_AUTH_RECEIVE_WINDOW: u32 = 16 << 10;
/// Streams an authenticated agent may have open at once: the control stream plus a
/// few reports in flight; agents never need more.
pub const AGENT_STREAMS: u32 = 8;

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid TLS configuration: {0}")]
    Config(String),
    #[error("cannot generate development certificates: {0}")]
    Generate(String),
}

/// Installs the ring crypto provider as the process default, once. Both binaries and
/// every test call it; a provider installed earlier by anyone is accepted.
pub fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // An error only means a provider is already installed, which is what we want.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads every certificate of a PEM file.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| TlsError::Read {
            path: path.to_owned(),
            reason: e.to_string(),
        })?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Read {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// Reads the first private key (PKCS#8, PKCS#1 or SEC1) of a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::Read {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| TlsError::Config(format!("{}: {e}", path.display())))?;
    }
    Ok(roots)
}

/// How the aggregator's QUIC endpoint authenticates agents at the TLS layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificates: agents authenticate with a token in their hello.
    None,
    /// Client certificates signed by this CA are verified when presented; agents without
    /// one must authenticate with a token.
    Optional(PathBuf),
    /// Every agent must present a certificate signed by this CA.
    Required(PathBuf),
}

/// The QUIC server configuration of the aggregator's ingest endpoint.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_auth: &ClientAuth,
) -> Result<quinn::ServerConfig, TlsError> {
    install_crypto_provider();
    let chain = load_certs(cert)?;
    let key = load_key(key)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Optional(ca) | ClientAuth::Required(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider());
            let verifier = if matches!(client_auth, ClientAuth::Optional(_)) {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut tls = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    tls.max_early_data_size = 0;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_idle_timeout(Some(
            IDLE_TIMEOUT.try_into().expect("idle timeout fits a VarInt"),
        ))
        // Until the hello authenticates the agent (then the ingest raises both with
        // `Connection::set_max_concurrent_bi_streams` and `set_receive_window`).
        .max_concurrent_bidi_streams(PRE_AUTH_STREAMS.into())
        .receive_window(PRE_AUTH_RECEIVE_WINDOW.into())
        .max_concurrent_uni_streams(0u32.into())
        // Per-connection memory, which a fleet of agents multiplies: no unreliable
        // datagrams (unused), no batched sends (each connection would keep a send
        // buffer sized for a whole segment-offload batch), no path MTU probing.
        .datagram_receive_buffer_size(None)
        .datagram_send_buffer_size(0)
        .enable_segmentation_offload(false)
        .mtu_discovery_config(None);
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// The QUIC client configuration of an agent: trust `ca_file`, present `cert`/`key`
/// when both are given.
pub fn client_config(
    ca_file: &Path,
    cert_and_key: Option<(&Path, &Path)>,
) -> Result<quinn::ClientConfig, TlsError> {
    install_crypto_provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots(ca_file)?);
    let mut tls = match cert_and_key {
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .map_err(|e| TlsError::Config(e.to_string()))?,
        None => builder.with_no_client_auth(),
    };
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_idle_timeout(Some(
            IDLE_TIMEOUT.try_into().expect("idle timeout fits a VarInt"),
        ))
        .keep_alive_interval(Some(KEEP_ALIVE))
        // The aggregator talks back only on the agent's control stream.
        .max_concurrent_bidi_streams(0u32.into())
        .max_concurrent_uni_streams(0u32.into());
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// The development-mode certificate set under `<data-dir>/dev/`.
#[derive(Debug, Clone)]
pub struct DevFiles {
    /// The self-signed CA that signs the other two certificates.
    pub ca: PathBuf,
    /// Server certificate for `localhost` and `127.0.0.1`.
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// Agent certificate allowed to report for every zone.
    pub agent_cert: PathBuf,
    pub agent_key: PathBuf,
}

impl DevFiles {
    /// The file names under `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        DevFiles {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server-key.pem"),
            agent_cert: dir.join("agent.pem"),
            agent_key: dir.join("agent-key.pem"),
        }
    }

    fn all(&self) -> [&PathBuf; 5] {
        [
            &self.ca,
            &self.server_cert,
            &self.server_key,
            &self.agent_cert,
            &self.agent_key,
        ]
    }
}

/// Writes the development certificates into `<data_dir>/dev/` on first use and reuses
/// them afterwards, so agents configured with the dev CA keep working across restarts.
/// Logs loudly: dev mode is not for production.
pub fn dev_setup(data_dir: &Path) -> Result<DevFiles, TlsError> {
    let dir = data_dir.join("dev");
    let files = DevFiles::in_dir(&dir);
    if files.all().iter().all(|p| p.is_file()) {
        warn!(dir = %dir.display(), "Development mode is on: reusing self-signed certificates; do not use in production.");
        return Ok(files);
    }
    fs::create_dir_all(&dir).map_err(|source| TlsError::Write {
        path: dir.clone(),
        source,
    })?;
    // Keys are written into this folder: a symbolic link planted in its place would
    // send them elsewhere.
    if fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(TlsError::Write {
            path: dir,
            source: std::io::Error::other("is a symbolic link; refusing to write keys through it"),
        });
    }
    let generate = |e: rcgen::Error| TlsError::Generate(e.to_string());

    let ca_key = KeyPair::generate().map_err(generate)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "meshcat development CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(generate)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let server_key = KeyPair::generate().map_err(generate)?;
    let mut server_params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .map_err(generate)?;
    server_params
        .distinguished_name
        .push(DnType::CommonName, "meshcat aggregator (development)");
    server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = server_params
        .signed_by(&server_key, &issuer)
        .map_err(generate)?;

    let agent_key = KeyPair::generate().map_err(generate)?;
    let mut agent_params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    agent_params
        .distinguished_name
        .push(DnType::CommonName, "meshcat agent (development)");
    agent_params.subject_alt_names = vec![SanType::URI(
        format!("{ZONE_URI_PREFIX}*").try_into().map_err(generate)?,
    )];
    agent_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let agent_cert = agent_params
        .signed_by(&agent_key, &issuer)
        .map_err(generate)?;

    write_file(&files.ca, &ca_cert.pem(), false)?;
    write_file(&files.server_cert, &server_cert.pem(), false)?;
    write_file(&files.server_key, &server_key.serialize_pem(), true)?;
    write_file(&files.agent_cert, &agent_cert.pem(), false)?;
    write_file(&files.agent_key, &agent_key.serialize_pem(), true)?;
    warn!(dir = %dir.display(), "Development mode is on: wrote a self-signed CA, server and agent certificates; do not use in production.");
    info!(ca = %files.ca.display(), cert = %files.agent_cert.display(), key = %files.agent_key.display(), "Agents connect with these development files.");
    Ok(files)
}

fn write_file(path: &Path, contents: &str, secret: bool) -> Result<(), TlsError> {
    let err = |source| TlsError::Write {
        path: path.to_owned(),
        source,
    };
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    // O_NOFOLLOW: a symbolic link planted at a key's path (by anyone who can write the
    // data directory) must not make the aggregator overwrite, or expose its key
    // through, the file the link names; opening a link fails with ELOOP instead.
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW);
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    let mut file = options.open(path).map_err(err)?;
    // The mode of `open` applies only to a new file; a key file left by an earlier,
    // interrupted start is narrowed too (on the open descriptor, not the path).
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(fs::Permissions::from_mode(0o600))
            .map_err(err)?;
    }
    #[cfg(not(unix))]
    let _ = secret;
    file.write_all(contents.as_bytes()).map_err(err)?;
    file.sync_all().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_files_are_written_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let files = dev_setup(dir.path()).unwrap();
        let first = fs::read_to_string(&files.ca).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for key in [&files.server_key, &files.agent_key] {
                let mode = fs::metadata(key).unwrap().permissions().mode();
                assert_eq!(mode & 0o777, 0o600, "{}", key.display());
            }
        }
        let again = dev_setup(dir.path()).unwrap();
        assert_eq!(fs::read_to_string(&again.ca).unwrap(), first);
        server_config(
            &files.server_cert,
            &files.server_key,
            &ClientAuth::Required(files.ca.clone()),
        )
        .unwrap();
        client_config(&files.ca, Some((&files.agent_cert, &files.agent_key))).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn dev_files_are_not_written_through_symbolic_links() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim.txt");
        fs::write(&victim, "precious\n").unwrap();
        let dev = dir.path().join("data").join("dev");
        fs::create_dir_all(&dev).unwrap();
        std::os::unix::fs::symlink(&victim, dev.join("server-key.pem")).unwrap();
        let err = dev_setup(&dir.path().join("data")).unwrap_err();
        assert!(err.to_string().contains("server-key.pem"), "{err}");
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");

        // A symbolic link in place of the dev folder is refused too.
        let elsewhere = dir.path().join("elsewhere");
        fs::create_dir_all(&elsewhere).unwrap();
        let data2 = dir.path().join("data2");
        fs::create_dir_all(&data2).unwrap();
        std::os::unix::fs::symlink(&elsewhere, data2.join("dev")).unwrap();
        assert!(dev_setup(&data2).is_err());
        assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);

        // A key file left readable by an interrupted start is narrowed to 0600.
        let data3 = dir.path().join("data3");
        fs::create_dir_all(data3.join("dev")).unwrap();
        let stale = data3.join("dev").join("agent-key.pem");
        fs::write(&stale, "half").unwrap();
        fs::set_permissions(&stale, fs::Permissions::from_mode(0o644)).unwrap();
        dev_setup(&data3).unwrap();
        assert_eq!(
            fs::metadata(&stale).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn missing_files_are_reported_with_their_path() {
        let err = load_certs(Path::new("/nonexistent/ca.pem")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ca.pem"));
    }
}
