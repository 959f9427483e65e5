//! The identity issuer: a CA ([`Ca`], generated or read from PEM files) that keeps
//! one X.509 v3 certificate per declared identity ([`IdentitySpec`]: an SDS secret
//! name and its SANs), serves each over SDS beside the CA (a validation context
//! secret) from the control server's snapshots, and rotates each when `rotate_at` of
//! its lifetime has passed, pushing the new certificate to every subscribed Envoy.
//! Rotation can be stopped (certificates then age and expire) and started again
//! (what is overdue is replaced at once), forced, and one certificate can be issued
//! once with a lifetime of its own. Private keys go only into SDS secrets: never
//! into a log line, a `Debug` output or an admin answer.

mod ca;
mod registry;
mod spec;

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;

pub use ca::{Ca, CaInfo, IssuedCertificate};
pub use registry::{CaState, IdentityState, IssuerState, Rotation};
pub use spec::{IdentitySpec, San};

use crate::ads::Shared;
use registry::Registry;

/// The lifetime of each certificate rotation issues, unless told otherwise.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// The fraction of its lifetime after which a certificate is replaced, unless told
/// otherwise.
pub const DEFAULT_ROTATE_AT: f64 = 0.5;
/// The name of the CA's validation context secret, unless told otherwise.
pub const DEFAULT_CA_SECRET: &str = "ca";
/// How long a generated CA is valid.
pub const GENERATED_CA_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long the rotation task waits after it failed to sign before it tries again.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// What can go wrong with identities.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("no identity has the secret {0:?}")]
    Unknown(String),
    #[error("bad identity: {0}")]
    BadIdentity(String),
    #[error("bad SAN: {0}")]
    BadSan(String),
    #[error("{0}")]
    BadOptions(String),
    #[error("the CA: {0}")]
    Ca(String),
    #[error("a certificate time is out of range")]
    BadTime,
    #[error("cannot sign the certificate: {0}")]
    Sign(#[from] rcgen::Error),
}

/// How an issuer issues and rotates.
#[derive(Debug, Clone, PartialEq)]
pub struct IssuerOptions {
    /// The lifetime of each certificate rotation issues (whole seconds).
    pub lifetime: Duration,
    /// The fraction of its lifetime after which a certificate is replaced (above 0,
    /// below 1).
    pub rotate_at: f64,
    /// The name of the validation context secret that carries the CA.
    pub ca_secret: String,
}

impl Default for IssuerOptions {
    fn default() -> Self {
        Self {
            lifetime: DEFAULT_LIFETIME,
            rotate_at: DEFAULT_ROTATE_AT,
            ca_secret: DEFAULT_CA_SECRET.to_owned(),
        }
    }
}

impl IssuerOptions {
    /// Whether the options hold together.
    pub fn check(&self) -> Result<(), IdentityError> {
        if !(self.rotate_at > 0.0 && self.rotate_at < 1.0) {
            return Err(IdentityError::BadOptions(format!(
                "rotate-at must be above 0 and below 1, not {}",
                self.rotate_at
            )));
        }
        if self.ca_secret.is_empty() {
            return Err(IdentityError::BadOptions(
                "the CA's secret needs a name".into(),
            ));
        }
        self.check_lifetime(self.lifetime)
    }

    /// Whether `identities` may be declared together: each secret name once, none
    /// the CA's.
    pub fn check_identities(&self, identities: &[IdentitySpec]) -> Result<(), IdentityError> {
        let mut seen = std::collections::BTreeSet::new();
        for spec in identities {
            if spec.secret == self.ca_secret {
                return Err(IdentityError::BadIdentity(format!(
                    "{}: that is the name of the CA's secret",
                    spec.secret
                )));
            }
            if !seen.insert(spec.secret.as_str()) {
                return Err(IdentityError::BadIdentity(format!(
                    "{}: declared twice",
                    spec.secret
                )));
            }
        }
        Ok(())
    }

    /// Whether a certificate may live `lifetime`: whole seconds, and rotation no
    /// sooner than a second after issue.
    pub fn check_lifetime(&self, lifetime: Duration) -> Result<(), IdentityError> {
        if lifetime.subsec_nanos() != 0 {
            return Err(IdentityError::BadOptions(format!(
                "a certificate lifetime is whole seconds, not {lifetime:?}"
            )));
        }
        if lifetime.mul_f64(self.rotate_at) < Duration::from_secs(1) {
            return Err(IdentityError::BadOptions(format!(
                "a lifetime of {lifetime:?} is too short: rotation at {} of it would come within a second",
                self.rotate_at
            )));
        }
        Ok(())
    }
}

/// A running issuer; a cheap handle (clones share it). Its rotation task ends when
/// the last handle is dropped.
#[derive(Debug, Clone)]
pub struct IdentityIssuer {
    inner: Arc<IssuerInner>,
}

#[derive(Debug)]
struct IssuerInner {
    registry: Mutex<Registry>,
    /// Where the secrets are published.
    shared: Arc<Shared>,
    /// Wakes the rotation task: rotation started or stopped, certificates replaced,
    /// the last handle dropped.
    wake: Arc<Notify>,
}

impl Drop for IssuerInner {
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

impl IdentityIssuer {
    /// Issues a certificate for each of `identities`, publishes them and the CA,
    /// and starts rotating them. Needs a Tokio runtime.
    pub(crate) fn start(
        shared: Arc<Shared>,
        ca: Ca,
        options: IssuerOptions,
        identities: Vec<IdentitySpec>,
    ) -> Result<Self, IdentityError> {
        options.check_identities(&identities)?;
        let mut registry = Registry::new(ca, options)?;
        let now = SystemTime::now();
        let rotations = identities
            .into_iter()
            .map(|spec| registry.declare(spec, now))
            .collect::<Result<Vec<_>, _>>()?;
        let issuer = Self {
            inner: Arc::new(IssuerInner {
                registry: Mutex::new(registry),
                shared,
                wake: Arc::new(Notify::new()),
            }),
        };
        // Published even without identities: the CA alone.
        issuer.publish(
            &mut issuer.registry(),
            rotations,
            "certificate issued",
            true,
        );
        tokio::spawn(rotate_when_due(
            Arc::downgrade(&issuer.inner),
            issuer.inner.wake.clone(),
        ));
        Ok(issuer)
    }

    /// The CA, every identity and whether rotation runs (no key material).
    pub fn state(&self) -> IssuerState {
        self.registry().state()
    }

    /// One identity, by its secret name.
    pub fn identity(&self, secret: &str) -> Option<IdentityState> {
        self.state()
            .identities
            .into_iter()
            .find(|i| i.secret == secret)
    }

    /// The CA certificate (PEM), for peers that take it from a file.
    pub fn ca_pem(&self) -> String {
        self.registry().ca_pem().to_owned()
    }

    /// Declares an identity (or gives a known one new SANs) and issues its
    /// certificate at once.
    pub fn declare(&self, spec: IdentitySpec) -> Result<Rotation, IdentityError> {
        self.one("certificate issued", |r, now| r.declare(spec, now))
    }

    /// Replaces `secret`'s certificate now (rotation running or not).
    pub fn rotate(&self, secret: &str) -> Result<Rotation, IdentityError> {
        self.one("certificate rotated (forced)", |r, now| {
            r.rotate(secret, now, None)
        })
    }

    /// Replaces every certificate now (rotation running or not).
    pub fn rotate_all(&self) -> Result<Vec<Rotation>, IdentityError> {
        self.apply("certificate rotated (forced)", Registry::rotate_all)
    }

    /// Replaces `secret`'s certificate now with one that lives `lifetime`; the
    /// rotation after it issues the usual lifetime again.
    pub fn issue(&self, secret: &str, lifetime: Duration) -> Result<Rotation, IdentityError> {
        self.one("certificate issued with a lifetime of its own", |r, now| {
            r.rotate(secret, now, Some(lifetime))
        })
    }

    /// Stops rotation: certificates age until they expire. Returns whether it ran.
    pub fn stop_rotation(&self) -> bool {
        let was = self.registry().set_rotation(false);
        tracing::info!(was_running = was, "certificate rotation stopped");
        self.inner.wake.notify_one();
        was
    }

    /// Starts rotation again and at once replaces every certificate whose rotation
    /// is overdue; returns those replacements.
    pub fn start_rotation(&self) -> Result<Vec<Rotation>, IdentityError> {
        let was = self.registry().set_rotation(true);
        tracing::info!(was_running = was, "certificate rotation started");
        self.apply("certificate rotated", Registry::rotate_due)
    }

    /// Whether rotation runs.
    pub fn rotation(&self) -> bool {
        self.registry().rotation()
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.inner
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn one(
        &self,
        what: &str,
        f: impl FnOnce(&mut Registry, SystemTime) -> Result<Rotation, IdentityError>,
    ) -> Result<Rotation, IdentityError> {
        let mut rotated = self.apply(what, |r, now| f(r, now).map(|one| vec![one]))?;
        Ok(rotated.remove(0))
    }

    /// Runs `f` on the registry and publishes what it issued, then lets the
    /// rotation task look at the schedule again.
    fn apply(
        &self,
        what: &str,
        f: impl FnOnce(&mut Registry, SystemTime) -> Result<Vec<Rotation>, IdentityError>,
    ) -> Result<Vec<Rotation>, IdentityError> {
        let result = self.run(what, f);
        self.inner.wake.notify_one();
        result
    }

    /// Runs `f` on the registry and publishes what it issued (the rotation task's
    /// own work: it does not wake itself).
    fn run(
        &self,
        what: &str,
        f: impl FnOnce(&mut Registry, SystemTime) -> Result<Vec<Rotation>, IdentityError>,
    ) -> Result<Vec<Rotation>, IdentityError> {
        let mut registry = self.registry();
        match f(&mut registry, SystemTime::now()) {
            Ok(rotations) => Ok(self.publish(&mut registry, rotations, what, false)),
            Err(e) => {
                // Whatever was replaced before the failure is served all the same.
                self.publish(&mut registry, Vec::new(), what, true);
                Err(e)
            }
        }
    }

    /// Publishes the registry's secrets when `rotations` issued anything (or
    /// `always`), and logs each rotation (never a key).
    fn publish(
        &self,
        registry: &mut Registry,
        mut rotations: Vec<Rotation>,
        what: &str,
        always: bool,
    ) -> Vec<Rotation> {
        if rotations.is_empty() && !always {
            return rotations;
        }
        let version = self.inner.shared.publish_secrets(registry.secrets());
        registry.published(&mut rotations, &version);
        for r in &rotations {
            tracing::info!(
                secret = %r.secret,
                serial = %r.serial,
                previous_serial = r.previous_serial.as_deref().unwrap_or(""),
                expires_at = %r.expires_at,
                %version,
                "{what}"
            );
        }
        rotations
    }
}

/// Replaces certificates as they fall due, until the issuer is dropped.
async fn rotate_when_due(issuer: Weak<IssuerInner>, wake: Arc<Notify>) {
    loop {
        let next = {
            let Some(inner) = issuer.upgrade() else {
                return;
            };
            let issuer = IdentityIssuer { inner };
            match issuer.run("certificate rotated", Registry::rotate_due) {
                Ok(_) => issuer.registry().next_due(),
                Err(e) => {
                    tracing::error!(error = %e, "certificate rotation failed; trying again");
                    Some(SystemTime::now() + RETRY_AFTER_FAILURE)
                }
            }
        };
        match next {
            Some(at) => {
                let wait = at
                    .duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO);
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}
