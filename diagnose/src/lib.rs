//! meshcat-diagnose: the mesh troubleshooting playbook (seed section 7, contract
//! section 5) as a pure function over evidence read from the sidecars.
//!
//! Callers collect the evidence (the agents scrape `/clusters`, `/config_dump`, ssl
//! stats and tail the sidecar logs), build a [`DiagnosisInput`] and call
//! [`diagnose`]; the zone's control server's view and the sidecars' sync with it
//! come in as [`ControlEvidence`]. Nothing here does I/O, so every rule is tested against captured
//! output of real Envoy failures.

pub mod accesslog;
pub mod collected;
pub mod evidence;
pub mod report;
pub mod rules;
pub mod symptom;

pub use collected::{EdgeChoice, choose_edge, failing_upstreams};
pub use evidence::{
    ControlEvidence, DeclaredCluster, DeclaredEndpoint, DiagnosisInput, EvidenceError,
    IdentityEvidence, MetricsEvidence, Role, SidecarEvidence, SidecarSync, StaleUpstream,
    SyncState, XdsRejection, reports_metrics,
};
pub use report::{
    DiagnosisReport, Failure, Hop, Reads, RootCause, Step, StepName, StepNameError, Verdict,
};
pub use rules::{diagnose, edge_weight, request_to_ask};
pub use symptom::{Symptom, SymptomError, classify_body, classify_response};
