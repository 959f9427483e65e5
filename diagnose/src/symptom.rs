//! The symptoms an operator reports, and their recognition from a response body.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Prefix of the body Envoy answers when it cannot connect to an upstream. The seed
/// quotes `reset reason: connection failure`; Envoy 1.40 continues with
/// `reset reason: remote connection failure` or `retried and the latest reset
/// reason: ...`, so only the prefix is matched.
const CONNECT_ERROR_PREFIX: &str = "upstream connect error or disconnect/reset before headers";
/// Body Envoy answers when a cluster has no usable endpoint.
const NO_HEALTHY_UPSTREAM: &str = "no healthy upstream";

/// A failure as the operator sees it; it selects which checks run and in which order.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Symptom {
    /// Body `upstream connect error or disconnect/reset before headers. ...`.
    UpstreamConnectError,
    /// Body `no healthy upstream`.
    NoHealthyUpstream,
    /// The browser gets a 502 or 503 at the mesh's ingress.
    #[serde(rename = "ingress_502_503")]
    Ingress502503,
    /// The dashboard shows no metrics for the cluster.
    MissingMetrics,
}

/// A `symptom` value that names no known symptom.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown symptom {0:?}: expected upstream_connect_error, no_healthy_upstream, ingress_502_503 or missing_metrics"
)]
pub struct SymptomError(pub String);

impl Symptom {
    /// Every symptom, in the order of the seed's table.
    pub const ALL: [Symptom; 4] = [
        Symptom::UpstreamConnectError,
        Symptom::NoHealthyUpstream,
        Symptom::Ingress502503,
        Symptom::MissingMetrics,
    ];

    /// The query-string and JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            Symptom::UpstreamConnectError => "upstream_connect_error",
            Symptom::NoHealthyUpstream => "no_healthy_upstream",
            Symptom::Ingress502503 => "ingress_502_503",
            Symptom::MissingMetrics => "missing_metrics",
        }
    }

    /// Reads the `symptom` query value: absent or empty means "run all checks".
    pub fn from_query(value: Option<&str>) -> Result<Option<Symptom>, SymptomError> {
        match value.map(str::trim) {
            None | Some("") => Ok(None),
            Some(v) => v.parse().map(Some),
        }
    }
}

impl fmt::Display for Symptom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Symptom {
    type Err = SymptomError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Symptom::ALL
            .into_iter()
            .find(|sym| sym.as_str() == s)
            .ok_or_else(|| SymptomError(s.chars().take(64).collect()))
    }
}

/// Recognises the symptom from a response body, in the seed's wording (optionally
/// labelled `Message:`) and in real Envoy's.
pub fn classify_body(body: &str) -> Option<Symptom> {
    let body = body.trim_start();
    let body = body.strip_prefix("Message:").unwrap_or(body).trim_start();
    if body.starts_with(CONNECT_ERROR_PREFIX) {
        Some(Symptom::UpstreamConnectError)
    } else if body.starts_with(NO_HEALTHY_UPSTREAM) {
        Some(Symptom::NoHealthyUpstream)
    } else {
        None
    }
}

/// Recognises the symptom from a whole response: the body first, then any other 502
/// or 503 (Envoy answers `503 NC`, `503 UAEX` with an empty body) as an ingress failure.
pub fn classify_response(code: u16, body: &str) -> Option<Symptom> {
    classify_body(body).or(match code {
        502 | 503 => Some(Symptom::Ingress502503),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_query_values() {
        assert_eq!(Symptom::from_query(None), Ok(None));
        assert_eq!(Symptom::from_query(Some("")), Ok(None));
        for s in Symptom::ALL {
            assert_eq!(Symptom::from_query(Some(s.as_str())), Ok(Some(s)));
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{s}\""));
        }
        let err = Symptom::from_query(Some("slow")).unwrap_err();
        assert!(err.to_string().contains("\"slow\""));
    }

    #[test]
    fn classifies_seed_wording() {
        assert_eq!(
            classify_body(
                "Message: upstream connect error or disconnect/reset before headers. reset reason: connection failure"
            ),
            Some(Symptom::UpstreamConnectError)
        );
        assert_eq!(
            classify_body("Message: no healthy upstream"),
            Some(Symptom::NoHealthyUpstream)
        );
        assert_eq!(classify_body("ok"), None);
        assert_eq!(classify_response(502, ""), Some(Symptom::Ingress502503));
        assert_eq!(classify_response(404, ""), None);
    }
}
