//! The `meshcat` command: a thin client of the catalog API for operators. It asks the
//! aggregator to run a diagnosis (`GET /diagnose/{cluster}`) and prints the report as
//! the root cause (the conclusion) first, then a checklist, one line per step, with
//! evidence and next action indented under failures.
//! The exit status tells scripts whether every step passed.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Deserialize;

/// Exit status when every step passed (or was skipped).
pub const EXIT_PASS: i32 = 0;
/// Exit status when at least one step failed.
pub const EXIT_FAIL: i32 = 1;
/// Exit status when the diagnosis could not be run (API unreachable, error answer).
pub const EXIT_ERROR: i32 = 2;

/// The diagnosis report as the API answers it (CONTRACT.md section 5).
#[derive(Debug, Clone, Deserialize)]
pub struct Report {
    pub cluster: String,
    pub zone: String,
    pub symptom: Option<String>,
    pub steps: Vec<Step>,
    pub conclusion: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Step {
    pub name: String,
    pub verdict: Verdict,
    #[serde(default)]
    pub evidence: Vec<String>,
    #[serde(default)]
    pub action: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
    Skipped,
}

impl Report {
    /// Whether any step failed.
    pub fn failed(&self) -> bool {
        self.steps.iter().any(|s| s.verdict == Verdict::Fail)
    }
}

/// Renders the report as a checklist for a terminal.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let symptom = report.symptom.as_deref().unwrap_or("all checks");
    let _ = writeln!(
        out,
        "Diagnosis of cluster {} in zone {} ({symptom})",
        report.cluster, report.zone
    );
    // The root cause first: an operator reads the answer before the checklist.
    let _ = writeln!(out, "Root cause: {}", report.conclusion);
    let _ = writeln!(out, "Checklist:");
    for step in &report.steps {
        let mark = match step.verdict {
            Verdict::Pass => "[pass]",
            Verdict::Fail => "[FAIL]",
            Verdict::Skipped => "[skip]",
        };
        let _ = writeln!(out, "  {mark} {}", step.name);
        if step.verdict == Verdict::Fail {
            for line in &step.evidence {
                let _ = writeln!(out, "         | {line}");
            }
            if let Some(action) = step.action.as_deref().filter(|a| !a.is_empty()) {
                let _ = writeln!(out, "         -> {action}");
            }
        }
    }
    out
}

/// Why the diagnosis could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("cannot reach the catalog API at {url}: {source}")]
    Unreachable { url: String, source: reqwest::Error },
    #[error("the catalog API answered {status}: {message}")]
    Api { status: u16, message: String },
    #[error("the catalog API answered something that is not a diagnosis report: {0}")]
    Body(String),
}

/// What to diagnose and where.
#[derive(Debug, Clone)]
pub struct DiagnoseRequest {
    pub api: String,
    pub token: Option<String>,
    pub cluster: String,
    pub zone: String,
    pub symptom: Option<String>,
    pub path: Option<String>,
    /// Run a debug window of that many seconds on every sidecar read.
    pub debug_seconds: Option<u32>,
    pub timeout: Duration,
}

/// Calls `GET /diagnose/{cluster}` and returns the raw JSON body and the parsed report.
pub async fn fetch(req: &DiagnoseRequest) -> Result<(serde_json::Value, Report), CliError> {
    let base = req.api.trim_end_matches('/');
    let url = format!("{base}/diagnose/{}", req.cluster);
    let mut query = vec![("zoneName", req.zone.as_str())];
    if let Some(s) = &req.symptom {
        query.push(("symptom", s));
    }
    if let Some(p) = &req.path {
        query.push(("path", p));
    }
    let seconds = req.debug_seconds.map(|n| n.to_string());
    if let Some(n) = &seconds {
        query.push(("debugSeconds", n));
    }
    let client = reqwest::Client::builder()
        .timeout(req.timeout)
        .build()
        .map_err(|source| CliError::Unreachable {
            url: url.clone(),
            source,
        })?;
    let mut call = client.get(&url).query(&query);
    if let Some(t) = &req.token {
        call = call.bearer_auth(t);
    }
    let resp = call.send().await.map_err(|source| CliError::Unreachable {
        url: url.clone(),
        source,
    })?;
    let status = resp.status().as_u16();
    let body: serde_json::Value = resp
        .json()
        .await
        .map_err(|e| CliError::Body(e.to_string()))?;
    if !(200..300).contains(&status) {
        let message = body
            .get("error")
            .and_then(|v| v.as_str())
            .unwrap_or("no error message")
            .to_owned();
        return Err(CliError::Api { status, message });
    }
    let report: Report =
        serde_json::from_value(body.clone()).map_err(|e| CliError::Body(e.to_string()))?;
    Ok((body, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(verdicts: &[Verdict]) -> Report {
        Report {
            cluster: "svc-a".into(),
            zone: "z1".into(),
            symptom: Some("no_healthy_upstream".into()),
            steps: verdicts
                .iter()
                .enumerate()
                .map(|(i, v)| Step {
                    name: format!("step {i}"),
                    verdict: *v,
                    evidence: vec![format!("evidence {i}")],
                    action: Some(format!("action {i}")),
                })
                .collect(),
            conclusion: "done".into(),
        }
    }

    #[test]
    fn failures_show_evidence_and_action() {
        let r = report(&[Verdict::Pass, Verdict::Fail, Verdict::Skipped]);
        assert!(r.failed());
        let text = render(&r);
        assert!(text.contains("[pass] step 0"));
        assert!(text.contains("[FAIL] step 1"));
        assert!(text.contains("| evidence 1"));
        assert!(text.contains("-> action 1"));
        assert!(text.contains("[skip] step 2"));
        assert!(!text.contains("evidence 0"), "evidence only under failures");
        let cause = text
            .find("Root cause: done")
            .expect("the root cause is printed");
        assert!(
            cause < text.find("[pass] step 0").unwrap(),
            "cause first: {text}"
        );
    }

    #[test]
    fn passing_report() {
        let r = report(&[Verdict::Pass, Verdict::Skipped]);
        assert!(!r.failed());
    }
}
