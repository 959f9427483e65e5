//! What the aggregator collected from the sidecars, turned into the engine's input:
//! an agent's evidence answer read into [`SidecarEvidence`], and the choice among
//! several edge instances of the one whose evidence the edge checks read.

use meshcat_common::wire::EvidenceOutput;

use crate::evidence::{DiagnosisInput, Role, SidecarEvidence};
use crate::rules::edge_weight;

impl SidecarEvidence {
    /// Reads an agent's evidence answer. What the agent could not read, and what
    /// fails to parse, is noted as `instance: why`; the rest is kept.
    pub fn from_output(
        role: Role,
        instance: &str,
        out: &EvidenceOutput,
        notes: &mut Vec<String>,
    ) -> SidecarEvidence {
        let mut s = SidecarEvidence::new(role, instance);
        for e in &out.errors {
            notes.push(format!("{instance}: {e}"));
        }
        let mut parsed =
            |s: &mut SidecarEvidence, r: Result<SidecarEvidence, crate::EvidenceError>| match r {
                Ok(v) => *s = v,
                Err(e) => notes.push(format!("{instance}: {e}")),
            };
        if let Some(t) = &out.clusters_json {
            let r = s.clone().with_clusters_json(t);
            parsed(&mut s, r);
        }
        if let Some(t) = &out.config_dump_json {
            let r = s.clone().with_config_dump_json(t);
            parsed(&mut s, r);
        }
        if let Some(t) = &out.stats_json {
            let r = s.clone().with_stats_json(t);
            parsed(&mut s, r);
        }
        if let Some(lines) = &out.log_lines {
            s = s.with_log(&lines.join("\n"));
        }
        if let Some(lines) = &out.debug_lines {
            s = s.with_debug_log(&lines.join("\n"));
        }
        s
    }
}

/// The edge instance whose evidence the edge checks read, and why each other
/// instance that answered was passed over.
#[derive(Debug, Clone)]
pub struct EdgeChoice {
    pub chosen: Option<(String, SidecarEvidence)>,
    pub passed_over: Vec<String>,
}

/// Chooses, among the edge instances that answered (in the order they were asked),
/// the one whose log speaks most for the diagnosis ([`edge_weight`]: a failing line
/// for the cluster or path beats any success, then the newer line wins; the first
/// asked wins a tie). With several edges only one may have seen the failure.
pub fn choose_edge(input: &DiagnosisInput, answered: Vec<(String, SidecarEvidence)>) -> EdgeChoice {
    let mut weighed: Vec<_> = answered
        .into_iter()
        .map(|(instance, ev)| {
            let weight = edge_weight(input, &ev);
            (instance, ev, weight)
        })
        .collect();
    let best = weighed
        .iter()
        .enumerate()
        .max_by_key(|(n, (_, _, w))| (w.clone(), std::cmp::Reverse(*n)))
        .map(|(n, _)| n);
    let Some(best) = best else {
        return EdgeChoice {
            chosen: None,
            passed_over: Vec::new(),
        };
    };
    let (instance, ev, weight) = weighed.remove(best);
    let passed_over = weighed
        .iter()
        .map(|(other, _, w)| {
            let why = match (&weight, w) {
                (Some((true, _)), Some((false, _)) | None) => {
                    "has no failing line for the diagnosis"
                }
                (_, None) => "has no line for the diagnosis",
                _ => "has an older line",
            };
            format!("{other}: answered, but {why}")
        })
        .collect();
    EdgeChoice {
        chosen: Some((instance, ev)),
        passed_over,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_agent_could_not_read_is_noted_and_the_rest_kept() {
        let out = EvidenceOutput {
            errors: vec!["stats: timed out".into()],
            clusters_json: Some("not json".into()),
            log_lines: Some(vec!["a line".into()]),
            ..EvidenceOutput::default()
        };
        let mut notes = Vec::new();
        let ev = SidecarEvidence::from_output(Role::Edge, "edge-1", &out, &mut notes);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes.iter().all(|n| n.starts_with("edge-1: ")), "{notes:?}");
        assert!(ev.log_lines.is_some());
    }

    #[test]
    fn without_a_line_for_the_diagnosis_the_first_asked_is_chosen() {
        let input = DiagnosisInput::new("catalog", "east");
        let quiet = |name: &str| (name.to_owned(), SidecarEvidence::new(Role::Edge, name));
        let choice = choose_edge(&input, vec![quiet("edge-1"), quiet("edge-2")]);
        assert_eq!(choice.chosen.map(|(i, _)| i).as_deref(), Some("edge-1"));
        assert_eq!(
            choice.passed_over,
            ["edge-2: answered, but has no line for the diagnosis"]
        );
        let none = choose_edge(&input, Vec::new());
        assert!(none.chosen.is_none() && none.passed_over.is_empty());
    }
}
