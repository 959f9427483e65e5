//! What the aggregator collected from the sidecars, turned into the engine's input:
//! an agent's evidence answer read into [`SidecarEvidence`], and the choice among
//! several edge instances of the one whose evidence the edge checks read.

use std::collections::BTreeMap;

use meshcat_common::wire::EvidenceOutput;

use crate::accesslog;
use crate::evidence::{DiagnosisInput, Role, SidecarEvidence, bounded_lines};
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
        s.log_window = out.log_window.clone();
        s
    }

    /// Adds the lines of request `request_id` that a second ask of the agent
    /// answered (`out`, asked with that request id), with what that ask covered:
    /// the lines this evidence lacks go before its own, being older.
    pub fn add_request_lines(&mut self, request_id: &str, out: &EvidenceOutput) {
        let Some(found) = &out.log_lines else {
            return;
        };
        let lines = self.log_lines.get_or_insert_with(Vec::new);
        let mut added: Vec<String> = found
            .iter()
            .filter(|l| !lines.contains(l))
            .cloned()
            .collect();
        added.append(lines);
        *lines = bounded_lines(&added.join("\n"));
        if let Some(w) = &out.log_window {
            self.asked_request = Some((request_id.to_owned(), w.clone()));
        }
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

/// The upstream clusters whose calls failed in the sidecars' access lines (a 5xx
/// answer or a connect failure), with how many failing lines each: a line's upstream
/// host is looked up among the hosts of each cluster the same sidecar's `/clusters`
/// lists. Read from a calling cluster's sidecars, what its calls to others show.
pub fn failing_upstreams(sides: &[SidecarEvidence]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for side in sides {
        let (Some(lines), Some(clusters)) = (&side.log_lines, &side.clusters) else {
            continue;
        };
        let mut by_host: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for c in clusters {
            for h in &c.hosts {
                by_host.entry(h.address.as_str()).or_default().push(&c.name);
            }
        }
        for (e, _) in accesslog::parse_lines(lines.iter().map(String::as_str)) {
            let failed = e.response_code >= 500 || e.has_flag("UF") || e.has_flag("URX");
            let Some(names) = e
                .upstream_host
                .as_deref()
                .filter(|_| failed)
                .and_then(|h| by_host.get(h))
            else {
                continue;
            };
            for name in names {
                *out.entry((*name).to_owned()).or_insert(0) += 1;
            }
        }
    }
    out
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
    fn failing_calls_are_counted_by_the_upstream_their_host_belongs_to() {
        let cluster = |name: &str, address: &str| meshcat_common::wire::UpstreamCluster {
            name: name.into(),
            added_via_api: false,
            hosts: vec![meshcat_common::wire::UpstreamHost::idle(address)],
        };
        let line = |code: u16, flags: &str, host: &str| {
            format!(
                r#"[2026-11-21T23:58:15.589Z] "GET /x HTTP/1.1" {code} {flags} 0 19 0 - "-" "ua" "id" "a" "{host}""#
            )
        };
        let mut caller = SidecarEvidence::new(Role::Service, "svc-a-0");
        caller.clusters = Some(vec![
            cluster("b-out", "10.0.0.2:80"),
            cluster("c", "10.0.0.3:80"),
            cluster("local_service", "127.0.0.1:8080"),
        ]);
        caller.log_lines = Some(vec![
            line(200, "-", "127.0.0.1:8080"),
            line(503, "URX,UF", "10.0.0.2:80"),
            line(500, "-", "10.0.0.2:80"),
            line(200, "-", "10.0.0.3:80"),
            line(404, "-", "10.0.0.3:80"),
            line(503, "UH", "-"),
            "not an access line".into(),
        ]);
        // Without its /clusters, no host can be told to be an upstream's.
        let mut blind = caller.clone();
        blind.clusters = None;
        let got = failing_upstreams(&[caller, blind]);
        assert_eq!(got, BTreeMap::from([("b-out".to_owned(), 2)]));
        assert!(failing_upstreams(&[]).is_empty());
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
