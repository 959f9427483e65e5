//! A sidecar's workload identity as the agent reports it (contract section 19): its
//! certificates from `/certs` (read on the first scrape, every `--certs-interval`,
//! and again as soon as its configuration moves, which an SDS rotation does), the
//! SDS secrets they came in, and the SAN matchers each of its upstream clusters'
//! TLS contexts requires, from the `/config_dump` the topology reads
//! ([`crate::topology::san_expectation`]).

use std::time::{Duration, Instant};

use meshcat_common::identity::{IdentityReport, SanExpectation};
use tracing::{debug, warn};

use crate::envoy::{EnvoyAdmin, EnvoyError};
use crate::target::Target;

/// The default of `--certs-interval`.
pub const DEFAULT_CERTS_INTERVAL: Duration = Duration::from_secs(60);

/// What was last read of one sidecar's certificates, and when to read them again.
#[derive(Debug, Default)]
pub struct IdentityReader {
    /// When `/certs` was last read, and at which configuration version and sidecar
    /// start.
    read: Option<(Instant, u64, i64)>,
    /// The certificates last read, with their SDS secrets; or why they are refused.
    certificates: Option<Result<Vec<meshcat_common::identity::ReportedCertificate>, String>>,
    /// The refusal last logged, so that a lasting one is logged once.
    logged: Option<String>,
    /// The outcome of the last [`Self::refresh`], for the agent's metrics.
    outcome: Option<ReadOutcome>,
}

/// What one read gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOutcome {
    /// Not due: what was read before stands.
    Kept,
    Read,
    /// Refused for a bound or a malformed answer, with the reason.
    Refused(&'static str),
    /// The sidecar did not answer; the last read stands.
    Failed,
}

impl IdentityReader {
    /// Whether `/certs` is to be read now: never read, `interval` passed, or the
    /// sidecar's configuration or process changed since.
    pub fn due(&self, now: Instant, version: u64, start_time_ms: i64, interval: Duration) -> bool {
        match self.read {
            None => true,
            Some((at, v, start)) => {
                v != version || start != start_time_ms || now.duration_since(at) >= interval
            }
        }
    }

    /// Reads the sidecar's certificates (and its SDS secrets when some came inline)
    /// when due.
    pub async fn refresh(
        &mut self,
        admin: &EnvoyAdmin,
        target: &Target,
        now: Instant,
        version: (u64, i64),
        interval: Duration,
    ) -> ReadOutcome {
        if !self.due(now, version.0, version.1, interval) {
            return ReadOutcome::Kept;
        }
        let read = read_certificates(admin).await;
        let outcome = match read {
            Ok(certs) => {
                self.certificates = Some(Ok(certs));
                self.logged = None;
                ReadOutcome::Read
            }
            Err(EnvoyError::Certs(e)) => {
                let reason = e.reason();
                if self.logged.as_deref() != Some(reason) {
                    warn!(zone = %target.zone_name, cluster = %target.cluster_name, instance = %target.instance, %reason, error = %e, "Sidecar certificates refused; its identity is reported as none with the reason.");
                    self.logged = Some(reason.to_owned());
                }
                self.certificates = Some(Err(reason.to_owned()));
                ReadOutcome::Refused(reason)
            }
            Err(EnvoyError::TooLarge { .. }) => {
                let reason = meshcat_common::identity::refusal::ANSWER_TOO_LARGE;
                if self.logged.as_deref() != Some(reason) {
                    warn!(zone = %target.zone_name, cluster = %target.cluster_name, instance = %target.instance, %reason, limit = crate::envoy::certs::MAX_CERTS_ANSWER, "Sidecar /certs answer over the limit; its identity is reported as none with the reason.");
                    self.logged = Some(reason.to_owned());
                }
                self.certificates = Some(Err(reason.to_owned()));
                ReadOutcome::Refused(reason)
            }
            Err(e) => {
                debug!(instance = %target.instance, error = %e, "Sidecar certificates not read.");
                // A restarted sidecar's old certificates are not its own any more.
                if self.read.is_some_and(|(_, _, start)| start != version.1) {
                    self.certificates = None;
                }
                return ReadOutcome::Failed;
            }
        };
        self.read = Some((now, version.0, version.1));
        self.outcome = Some(outcome);
        outcome
    }

    /// The outcome of the last read since this was last asked.
    pub fn take_outcome(&mut self) -> Option<ReadOutcome> {
        self.outcome.take()
    }

    /// The identity to report with the sidecar's SAN `expectations`; `None` until
    /// the certificates were read once.
    pub fn report(&self, expectations: &[SanExpectation]) -> Option<IdentityReport> {
        let (certificates, refused) = match self.certificates.as_ref()? {
            Ok(c) => (c.clone(), None),
            Err(reason) => (Vec::new(), Some(reason.clone())),
        };
        Some(IdentityReport::new(
            certificates,
            expectations.to_vec(),
            refused,
        ))
    }
}

/// The sidecar's distinct certificates, each with the SDS secret it came in.
async fn read_certificates(
    admin: &EnvoyAdmin,
) -> Result<Vec<meshcat_common::identity::ReportedCertificate>, EnvoyError> {
    let crate::envoy::certs::CertsRead {
        certificates: mut certs,
        inline,
    } = admin.certs().await?;
    if inline {
        match admin.sds_secrets().await {
            Ok(secrets) => {
                for c in &mut certs {
                    c.secret = secrets.get(&c.serial).cloned();
                }
            }
            Err(e) => debug!(error = %e, "SDS secrets not read; certificates shown as from files."),
        }
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_are_read_again_when_due() {
        let mut r = IdentityReader::default();
        let t0 = Instant::now();
        let interval = Duration::from_secs(60);
        assert!(r.due(t0, 1, 100, interval), "never read");
        r.read = Some((t0, 1, 100));
        assert!(!r.due(t0 + Duration::from_secs(59), 1, 100, interval));
        assert!(
            r.due(t0 + interval, 1, 100, interval),
            "the interval passed"
        );
        assert!(r.due(t0, 2, 100, interval), "the configuration moved");
        assert!(r.due(t0, 1, 200, interval), "the sidecar restarted");
        assert_eq!(r.report(&[]), None, "nothing read yet");
        r.certificates = Some(Err("too_many_certificates".into()));
        let refused = r.report(&[]).unwrap();
        assert!(refused.certificates.is_empty());
        assert_eq!(refused.refused.as_deref(), Some("too_many_certificates"));
    }
}
