//! The `meshcat` command: a thin client of the catalog API for operators. It asks the
//! aggregator to run a diagnosis (`GET /diagnose/{cluster}`) and prints the report as
//! the root cause (the conclusion) first, then a checklist, one line per step, with
//! evidence and next action indented under failures.
//! The exit status tells scripts whether every step passed.

use std::fmt::Write as _;
use std::time::Duration;

use meshcat_diagnose::{DiagnosisReport, Verdict};

/// Exit status when every step passed (or was skipped).
pub const EXIT_PASS: i32 = 0;
/// Exit status when at least one step failed.
pub const EXIT_FAIL: i32 = 1;
/// Exit status when the diagnosis could not be run (API unreachable, error answer).
pub const EXIT_ERROR: i32 = 2;

/// The diagnosis report as the API answers it (CONTRACT.md section 5), the type the
/// aggregator serializes.
pub type Report = DiagnosisReport;

/// Whether any step failed.
pub fn failed(report: &Report) -> bool {
    report.first_failure().is_some()
}

/// Renders the report for a terminal: the root cause and its owner first, the
/// clusters followed and the recent changes, then a checklist of the asked cluster's
/// steps.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let symptom = report.symptom.map_or("all checks", |s| s.as_str());
    let _ = writeln!(
        out,
        "Diagnosis of cluster {} in zone {} ({symptom})",
        report.cluster, report.zone
    );
    // The root cause first: an operator reads the answer before the checklist.
    if let Some(rc) = &report.root_cause {
        let owner = match (rc.owner.as_str(), rc.owner_url.as_str()) {
            ("", _) => "no owner registered".to_owned(),
            (o, "") => format!("owner {o}"),
            (o, url) => format!("owner {o} ({url})"),
        };
        let _ = writeln!(
            out,
            "Root cause: cluster {} in zone {}, {owner}",
            rc.cluster_name, rc.zone_name
        );
        let _ = writeln!(out, "  {} failed: {}", rc.step, rc.finding);
    }
    let _ = writeln!(out, "Conclusion: {}", report.conclusion);
    if report.hops.len() > 1 {
        let chain: Vec<String> = report
            .hops
            .iter()
            .map(|h| format!("{}/{}", h.zone_name, h.cluster_name))
            .collect();
        let _ = writeln!(out, "Followed: {}", chain.join(" -> "));
    }
    if !report.recent_changes.is_empty() {
        let _ = writeln!(out, "Recent changes (newest first):");
        for c in &report.recent_changes {
            let place = [c.cluster_name.as_str(), c.instance.as_str()]
                .into_iter()
                .filter(|p| !p.is_empty())
                .collect::<Vec<_>>()
                .join("/");
            let _ = writeln!(
                out,
                "  {} {} {}/{place} {}",
                c.at_ms, c.kind, c.zone_name, c.detail
            );
        }
    }
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
            if !step.action.is_empty() {
                let _ = writeln!(out, "         -> {}", step.action);
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
    /// Most clusters followed along failing calls (`maxHops`), the server's default
    /// when `None`.
    pub max_hops: Option<u8>,
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
    let hops = req.max_hops.map(|n| n.to_string());
    if let Some(n) = &hops {
        query.push(("maxHops", n));
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
    use meshcat_diagnose::{Hop, RootCause, StepName};

    use super::*;

    fn report(verdicts: &[Verdict]) -> Report {
        let mut r: Report = serde_json::from_value(serde_json::json!({
            "cluster": "svc-a",
            "zone": "z1",
            "symptom": "no_healthy_upstream",
            "steps": [],
            "conclusion": "done",
        }))
        .unwrap();
        r.steps = verdicts
            .iter()
            .zip(StepName::ALL)
            .enumerate()
            .map(|(i, (v, name))| {
                serde_json::from_value(serde_json::json!({
                    "name": name,
                    "verdict": v,
                    "evidence": [format!("evidence {i}")],
                    "action": format!("action {i}"),
                }))
                .unwrap()
            })
            .collect();
        r
    }

    #[test]
    fn failures_show_evidence_and_action() {
        let r = report(&[Verdict::Pass, Verdict::Fail, Verdict::Skipped]);
        assert!(failed(&r));
        let text = render(&r);
        assert!(text.contains("[pass] edge_discovery"));
        assert!(text.contains("[FAIL] service_discovery"));
        assert!(text.contains("| evidence 1"));
        assert!(text.contains("-> action 1"));
        assert!(text.contains("[skip] mtls"));
        assert!(!text.contains("evidence 0"), "evidence only under failures");
        let cause = text
            .find("Conclusion: done")
            .expect("the conclusion is printed");
        assert!(
            cause < text.find("[pass] edge_discovery").unwrap(),
            "conclusion first: {text}"
        );
        assert!(!text.contains("Root cause:"), "no root cause, none printed");
    }

    #[test]
    fn the_root_cause_and_its_owner_come_first() {
        let mut r = report(&[Verdict::Fail]);
        r.hops = ["svc-a", "svc-b"]
            .map(|c| Hop {
                zone_name: "z1".into(),
                cluster_name: c.into(),
                conclusion: String::new(),
            })
            .to_vec();
        r.root_cause = Some(RootCause {
            zone_name: "z1".into(),
            cluster_name: "svc-b".into(),
            owner: "team-b".into(),
            owner_url: "https://teams.example/b".into(),
            step: StepName::ServiceLogs,
            finding: "503 UF from 127.0.0.1:9".into(),
        });
        let text = render(&r);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1],
            "Root cause: cluster svc-b in zone z1, owner team-b (https://teams.example/b)"
        );
        assert_eq!(lines[2], "  service_logs failed: 503 UF from 127.0.0.1:9");
        assert!(text.contains("Followed: z1/svc-a -> z1/svc-b"), "{text}");
    }

    #[test]
    fn passing_report() {
        let r = report(&[Verdict::Pass, Verdict::Skipped]);
        assert!(!failed(&r));
    }
}
