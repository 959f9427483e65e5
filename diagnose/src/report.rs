//! The diagnosis report of contract section 5, as JSON:
//! `{"cluster","zone","symptom","steps":[{"name","verdict","evidence","action"}],"conclusion"}`.

use serde::{Deserialize, Serialize};

use crate::symptom::Symptom;

/// Most evidence lines one step carries; more are summarised in a last line.
pub const MAX_EVIDENCE: usize = 30;
/// Longest evidence line; longer lines (debug lines can be long) are cut.
pub const MAX_EVIDENCE_LEN: usize = 1024;

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
    /// The check could not run: its evidence was not collected or does not apply.
    Skipped,
}

/// One check of the playbook, with what it read and what to do next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// Stable name of the check (`edge_discovery`, `mtls`, ...).
    pub name: String,
    pub verdict: Verdict,
    /// The admin lines, counters and log lines the verdict rests on.
    pub evidence: Vec<String>,
    /// The next action in words.
    pub action: String,
}

impl Step {
    pub(crate) fn new(name: &str, verdict: Verdict, evidence: Vec<String>, action: &str) -> Self {
        let mut evidence: Vec<String> = evidence
            .into_iter()
            .map(|e| crate::evidence::truncate(&e, MAX_EVIDENCE_LEN).to_owned())
            .collect();
        if evidence.len() > MAX_EVIDENCE {
            let more = evidence.len() - (MAX_EVIDENCE - 1);
            evidence.truncate(MAX_EVIDENCE - 1);
            evidence.push(format!("... and {more} more"));
        }
        Step {
            name: name.to_owned(),
            verdict,
            evidence,
            action: action.to_owned(),
        }
    }
}

/// The answer of `GET /diagnose/{clusterName}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiagnosisReport {
    pub cluster: String,
    pub zone: String,
    /// The symptom diagnosed; `null` when every check ran.
    pub symptom: Option<Symptom>,
    /// The checks in the order they ran.
    pub steps: Vec<Step>,
    /// One sentence: the first failing check, or that all checks passed.
    pub conclusion: String,
}

impl DiagnosisReport {
    /// The first failing step, the one the conclusion is about.
    pub fn first_failure(&self) -> Option<&Step> {
        self.steps.iter().find(|s| s.verdict == Verdict::Fail)
    }

    /// The step of that name.
    pub fn step(&self, name: &str) -> Option<&Step> {
        self.steps.iter().find(|s| s.name == name)
    }
}
