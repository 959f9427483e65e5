//! The access lines the log checks read: which of a sidecar's lines belong to the
//! diagnosis, and which one is followed.

use std::collections::BTreeSet;

use super::route_matches;
use crate::accesslog::{self, AccessLogEntry};
use crate::evidence::{DiagnosisInput, SidecarEvidence};

/// Access lines of a sidecar for the input's path (all of them without one), oldest
/// first.
pub(super) fn entries_for<'a>(
    input: &DiagnosisInput,
    lines: &'a [String],
) -> Vec<(AccessLogEntry, &'a str)> {
    accesslog::parse_lines(lines.iter().map(String::as_str))
        .into_iter()
        .filter(|(e, _)| input.path.as_deref().is_none_or(|p| e.matches_path(p)))
        .collect()
}

/// The clusters the edge's first route matching `path` sends to (several for weighted
/// clusters); `None` when no route takes the path or the routes were not read.
fn routed_to<'a>(edge: &'a SidecarEvidence, path: &str) -> Option<Vec<&'a str>> {
    let routes = edge.routes.as_ref()?;
    let first = routes.iter().find(|r| route_matches(&r.matcher, path))?;
    Some(
        routes
            .iter()
            .filter(|r| {
                r.route_config == first.route_config
                    && r.virtual_host == first.virtual_host
                    && r.matcher == first.matcher
            })
            .map(|r| r.cluster.as_str())
            .collect(),
    )
}

/// The edge's access lines that belong to the diagnosed cluster, oldest first. With a
/// path, the lines of that path. Without, the lines whose upstream host is one of
/// the cluster's hosts at the edge, or whose path the edge routes to the cluster
/// (a request that never reached a host: `503 UH`, `503 NC`) and whose host, if any,
/// belongs to no other cluster: never another cluster's traffic.
pub(super) fn edge_entries<'a>(
    input: &DiagnosisInput,
    edge: &SidecarEvidence,
    lines: &'a [String],
) -> Vec<(AccessLogEntry, &'a str)> {
    let entries = entries_for(input, lines);
    if input.path.is_some() {
        return entries;
    }
    let name = input.edge_name();
    let own: BTreeSet<&str> = edge
        .cluster(name)
        .into_iter()
        .flat_map(|c| c.hosts.iter().map(|h| h.address.as_str()))
        .collect();
    let others: BTreeSet<&str> = edge
        .clusters
        .iter()
        .flatten()
        .filter(|c| c.name != name)
        .flat_map(|c| c.hosts.iter().map(|h| h.address.as_str()))
        .collect();
    entries
        .into_iter()
        .filter(|(e, _)| match e.upstream_host.as_deref() {
            Some(h) if own.contains(h) => true,
            Some(h) if others.contains(h) => false,
            _ => e
                .path_only()
                .and_then(|p| routed_to(edge, p))
                .is_some_and(|cs| cs.contains(&name)),
        })
        .collect()
}

/// The line to follow among `entries`: the newest failing one, else the newest.
pub(super) fn followed<'e, 'a>(
    entries: &'e [(AccessLogEntry, &'a str)],
) -> Option<&'e (AccessLogEntry, &'a str)> {
    entries
        .iter()
        .rev()
        .find(|(e, _)| is_failure(e))
        .or_else(|| entries.last())
}

/// The edge line the service checks follow.
pub(super) fn edge_followed(input: &DiagnosisInput) -> Option<AccessLogEntry> {
    let edge = input.edge.as_ref()?;
    let lines = edge.log_lines.as_ref()?;
    let entries = edge_entries(input, edge, lines);
    followed(&entries).map(|(e, _)| e.clone())
}

/// How much an edge instance's log says about the diagnosis, for choosing among the
/// edge instances: `None` without a line for the cluster (or path); else whether the
/// followed line fails, and its start time. Larger is better: a failing line beats
/// any success, then the newer line wins.
pub fn edge_weight(input: &DiagnosisInput, edge: &SidecarEvidence) -> Option<(bool, String)> {
    let lines = edge.log_lines.as_ref()?;
    let entries = edge_entries(input, edge, lines);
    followed(&entries).map(|(e, _)| (is_failure(e), e.start_time.clone()))
}

/// How a set of lines is named in evidence.
pub(super) fn filter_text(input: &DiagnosisInput) -> String {
    input.path.as_deref().map_or_else(
        || format!("cluster {}", input.edge_name()),
        |p| format!("path {p}"),
    )
}

pub(super) fn is_failure(e: &AccessLogEntry) -> bool {
    e.response_code >= 500 || e.response_code == 0 || e.has_flag("NR") || e.has_flag("UAEX")
}
