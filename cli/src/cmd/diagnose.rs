//! `meshcat diagnose`: asks the aggregator to run a diagnosis
//! (`GET /diagnose/{cluster}`) and prints the report as the root cause (the
//! conclusion) first, then a checklist, one line per step, with evidence and next
//! action indented under failures. Exits 0 when every step passed, 1 when a step
//! failed, 2 when the diagnosis could not be run (any refusal of the API included).

use std::fmt::Write as _;
use std::io::Write;

use meshcat_diagnose::{DiagnosisReport, Verdict};

use super::{Ctx, emit, history};
use crate::args::{DiagnoseArgs, DiagnoseFormat, Format};
use crate::client::{Call, CliError};
use crate::render;

/// The diagnosis report as the API answers it (CONTRACT.md section 5), the type the
/// aggregator serializes.
pub type Report = DiagnosisReport;

pub async fn run(ctx: &Ctx, args: DiagnoseArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let call = Call::new(&["diagnose", &args.cluster])
        .q("zoneName", &args.zone)
        .q_opt("symptom", args.symptom)
        .q_opt("path", args.path)
        .q_opt("debugSeconds", args.debug_seconds.map(|n| n.to_string()))
        .q_opt("maxHops", args.max_hops.map(|n| n.to_string()));
    let raw = ctx.api.get(&call).await.map_err(|e| match e {
        CliError::Api { .. } => CliError::NotRun(e.to_string()),
        other => other,
    })?;
    // The report's text is shown on a terminal: its strings with control characters
    // escaped (`-o json` prints the answer as it came).
    let report: Report =
        serde_json::from_value(render::cleaned(&raw, false)).map_err(|e| CliError::Body {
            what: format!("GET /diagnose/{}", args.cluster),
            reason: format!("not a diagnosis report: {e}"),
        })?;
    let text = match args.output {
        DiagnoseFormat::Text => render(&report, ctx.width),
        DiagnoseFormat::Json => render::data(&raw, Format::Json)?,
    };
    emit(out, &text)?;
    match report.first_failure() {
        Some(step) => Err(CliError::Failed(format!(
            "the diagnosis of cluster {} failed at {}",
            report.cluster,
            step.name.as_str()
        ))),
        None => Ok(()),
    }
}

/// Whether any step failed.
pub fn failed(report: &Report) -> bool {
    report.first_failure().is_some()
}

/// Renders the report for a terminal: the root cause and its owner first, the
/// clusters followed and the recent changes (the table of `meshcat history`, cut
/// to `width` when given), then a checklist of the asked cluster's steps.
pub fn render(report: &Report, width: Option<usize>) -> String {
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
        let table = history::table(&report.recent_changes, true);
        for line in table.render(width.map(|w| w.saturating_sub(2))).lines() {
            let _ = writeln!(out, "  {line}");
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
        let text = render(&r, None);
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
        let text = render(&r, None);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1],
            "Root cause: cluster svc-b in zone z1, owner team-b (https://teams.example/b)"
        );
        assert_eq!(lines[2], "  service_logs failed: 503 UF from 127.0.0.1:9");
        assert!(text.contains("Followed: z1/svc-a -> z1/svc-b"), "{text}");
    }

    /// The answer of `GET /diagnose/catalog?zoneName=local` on the local mesh
    /// (deploy/local) after a zone and a cluster edit and two log levels set.
    const AFTER_EDITS: &str =
        include_str!("../../tests/fixtures/diagnose_catalog_after_edits.json");

    #[test]
    fn recent_changes_print_as_meshcat_history_prints_them() {
        let r: Report = serde_json::from_str(AFTER_EDITS).unwrap();
        assert_eq!(r.recent_changes.len(), 7);
        let text = anstream::adapter::strip_str(&render(&r, None)).to_string();
        let block = text
            .split_once("Recent changes (newest first):\n")
            .and_then(|(_, rest)| rest.split_once("Checklist:\n"))
            .map(|(block, _)| block)
            .unwrap_or_else(|| panic!("{text}"));
        // Indented under its title, as the history table.
        let want = [
            "TIME                   KIND                 ZONE    CLUSTER   INSTANCE    DETAIL",
            "2026-11-26T10:59:20Z   diagnosed            local   catalog   -           all checks: No check failed; skipped for lack of evidence: metrics_collector.",
            "2026-11-26T10:59:17Z   log-level-changed    local   catalog   catalog-1   warn -> info by api",
            "2026-11-26T10:59:16Z   log-level-changed    local   catalog   catalog-1   info -> warn by api",
            "2026-11-26T10:59:14Z   cluster-updated      local   catalog   -           changed: version",
            "2026-11-26T10:57:39Z   status-changed       local   catalog   -           down -> stable: 1 live instance, within its bounds; 0 requests in the last window, fewer than the 20 an error ratio needs",
            "2026-11-26T10:57:39Z   instance-joined      local   catalog   catalog-1   started 2026-11-26T10:57:36Z",
            "2026-11-26T10:57:37Z   cluster-registered   local   catalog   -",
        ];
        let got: Vec<&str> = block.lines().collect();
        assert_eq!(got, want.map(|l| format!("  {l}")));
        // On a terminal the table is cut to its width, indent included.
        let narrow = anstream::adapter::strip_str(&render(&r, Some(80))).to_string();
        for line in narrow.lines().filter(|l| l.contains("   local   ")) {
            assert!(line.chars().count() <= 80, "{line:?}");
        }
    }

    #[test]
    fn passing_report() {
        let r = report(&[Verdict::Pass, Verdict::Skipped]);
        assert!(!failed(&r));
    }
}
