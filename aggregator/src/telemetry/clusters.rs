//! The per-cluster and per-edge series of the ops port (contract section 16), so
//! that an alert reaches the team that owns the cluster: each registered cluster's
//! status and live instances labelled with the catalog's `owner`, and each edge of
//! the dependency graph's requests and errors as counters.
//!
//! They are rendered at each scrape from the graph's snapshot (built once a second,
//! or afresh when the catalog moved since), straight into the text format. With
//! 10,000 clusters and 50,000 edges they are some 140,000 series: as the
//! `prometheus` crate's metric vectors they would be label maps kept in memory,
//! set again at every scrape and pruned of deleted clusters; rendered from the
//! snapshot they cost nothing between scrapes, the report path does no work for
//! them, and a deleted cluster's series are gone with it. `--cluster-metrics=false`
//! leaves them out.

use std::io::Write;

use meshcat_common::model::Status;

use crate::graph::{Built, Link, Node};

/// One family of these series: its name, its type and its help line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    pub name: &'static str,
    /// `gauge` or `counter`, as the `# TYPE` line says.
    pub kind: &'static str,
    pub help: &'static str,
}

/// `meshcat_cluster_status{zone,cluster,owner,status}`.
pub const CLUSTER_STATUS: Family = Family {
    name: "meshcat_cluster_status",
    kind: "gauge",
    help: "Status of each registered cluster: 1 for the current one of stable, warning and down, 0 for the other two.",
};

/// `meshcat_cluster_instances{zone,cluster,owner}`.
pub const CLUSTER_INSTANCES: Family = Family {
    name: "meshcat_cluster_instances",
    kind: "gauge",
    help: "Live instances of each registered cluster.",
};

/// `meshcat_edge_requests_total{source_zone,source,target_zone,target}`.
pub const EDGE_REQUESTS: Family = Family {
    name: "meshcat_edge_requests_total",
    kind: "counter",
    help: "Requests on each edge of the dependency graph, from the reports of the agents connected to this aggregator.",
};

/// `meshcat_edge_errors_total{source_zone,source,target_zone,target}`.
pub const EDGE_ERRORS: Family = Family {
    name: "meshcat_edge_errors_total",
    kind: "counter",
    help: "5xx answers and connect failures on each edge of the dependency graph, from the reports of the agents connected to this aggregator.",
};

/// `meshcat_certificate_expiry_timestamp_seconds{zone,cluster,owner}`.
pub const CERTIFICATE_EXPIRY: Family = Family {
    name: "meshcat_certificate_expiry_timestamp_seconds",
    kind: "gauge",
    help: "When the soonest-expiring identity certificate of each registered cluster's live instances expires, in seconds since the epoch (no series without one).",
};

/// `meshcat_cluster_identity{zone,cluster,owner,state}`.
pub const CLUSTER_IDENTITY: Family = Family {
    name: "meshcat_cluster_identity",
    kind: "gauge",
    help: "Identity state of each registered cluster whose live instances hold certificates: 1 for the worst state of its instances (ok, expiring, rotation-overdue, expired, none), 0 for the others.",
};

/// `meshcat_edge_tls_san_mismatch{source_zone,source,target_zone,target,owner}`.
pub const EDGE_TLS_MISMATCH: Family = Family {
    name: "meshcat_edge_tls_san_mismatch",
    kind: "gauge",
    help: "1 when the source's sidecars require SANs that the target's live instances do not present (a predicted mTLS failure), 0 when they match; one series per edge whose source checks SANs, owner the source's.",
};

/// `meshcat_sidecar_sync{zone,cluster,owner,state}`.
pub const SIDECAR_SYNC: Family = Family {
    name: "meshcat_sidecar_sync",
    kind: "gauge",
    help: "Instances of each cluster per sync state with the zone's control server (synced, stale, rejected, disconnected, unknown), derived by this replica.",
};

/// Appends `meshcat_sidecar_sync`: for every registered (zone, cluster) with
/// instances, one series per state (0 for the states none is in), labelled with its
/// owner (`owner` answers `None` for a cluster nobody registered: no series, as for
/// the other per-cluster series).
pub fn render_sync(
    counts: &std::collections::BTreeMap<(String, String, crate::sync::SyncState), u64>,
    owner: impl Fn(&str, &str) -> Option<String>,
    out: &mut Vec<u8>,
) {
    use crate::sync::SyncState;
    header(out, &SIDECAR_SYNC);
    let mut clusters: Vec<(&str, &str)> = counts
        .keys()
        .map(|(z, c, _)| (z.as_str(), c.as_str()))
        .collect();
    clusters.dedup();
    for (zone, cluster) in clusters {
        let Some(owner) = owner(zone, cluster) else {
            continue;
        };
        let mut l = Vec::with_capacity(64);
        label(&mut l, "zone", zone, true);
        label(&mut l, "cluster", cluster, false);
        label(&mut l, "owner", &owner, false);
        for state in SyncState::ALL {
            sample(out, SIDECAR_SYNC.name, &l, Some(("state", state.as_str())));
            let n = counts
                .get(&(zone.to_owned(), cluster.to_owned(), state))
                .copied()
                .unwrap_or(0);
            value(out, n);
        }
    }
}

/// Every family, in the order they are rendered.
pub const FAMILIES: [Family; 7] = [
    CLUSTER_STATUS,
    CLUSTER_INSTANCES,
    CERTIFICATE_EXPIRY,
    CLUSTER_IDENTITY,
    EDGE_REQUESTS,
    EDGE_ERRORS,
    EDGE_TLS_MISMATCH,
];

/// Bytes one series takes in the text format, about: to size the buffer once.
const SERIES_BYTES: usize = 120;

/// Appends the families of `graph` to a text exposition.
pub fn render(graph: &Built, out: &mut Vec<u8>) {
    let clusters: Vec<&Node> = graph
        .nodes
        .iter()
        .filter(|n| n.kind == "cluster" && n.registered)
        .collect();
    out.reserve(SERIES_BYTES * (clusters.len() * 4 + graph.links.len() * 2));
    // The labels of each cluster, written once for its four series.
    let labels: Vec<Vec<u8>> = clusters
        .iter()
        .map(|n| {
            let mut l = Vec::with_capacity(64);
            label(&mut l, "zone", &n.zone_name, true);
            label(&mut l, "cluster", &n.cluster_name, false);
            label(&mut l, "owner", &n.owner, false);
            l
        })
        .collect();
    header(out, &CLUSTER_STATUS);
    for (n, l) in clusters.iter().zip(&labels) {
        for s in Status::ALL {
            sample(out, CLUSTER_STATUS.name, l, Some(("status", s.as_str())));
            value(out, u64::from(n.status == Some(s)));
        }
    }
    header(out, &CLUSTER_INSTANCES);
    for (n, l) in clusters.iter().zip(&labels) {
        sample(out, CLUSTER_INSTANCES.name, l, None);
        value(out, n.instances);
    }
    header(out, &CERTIFICATE_EXPIRY);
    for (n, l) in clusters.iter().zip(&labels) {
        if let Some(ms) = n.cert_expires_ms {
            sample(out, CERTIFICATE_EXPIRY.name, l, None);
            value(out, u64::try_from(ms / 1000).unwrap_or(0));
        }
    }
    header(out, &CLUSTER_IDENTITY);
    for (n, l) in clusters.iter().zip(&labels) {
        if n.cert_expires_ms.is_none() {
            continue;
        }
        for s in meshcat_common::identity::CertState::ALL {
            sample(out, CLUSTER_IDENTITY.name, l, Some(("state", s.as_str())));
            value(out, u64::from(n.identity_state == s));
        }
    }
    let edge_labels: Vec<Vec<u8>> = graph
        .links
        .iter()
        .map(|link| {
            let (s, t) = (
                &graph.nodes[link.source as usize],
                &graph.nodes[link.target as usize],
            );
            let mut l = Vec::with_capacity(96);
            label(&mut l, "source_zone", &s.zone_name, true);
            label(&mut l, "source", within_zone(s), false);
            label(&mut l, "target_zone", &t.zone_name, false);
            label(&mut l, "target", within_zone(t), false);
            l
        })
        .collect();
    let mut edges = |family: &Family, count: fn(&Link) -> u64| {
        header(out, family);
        for (link, l) in graph.links.iter().zip(&edge_labels) {
            sample(out, family.name, l, None);
            value(out, count(link));
        }
    };
    edges(&EDGE_REQUESTS, |l| l.requests_total);
    edges(&EDGE_ERRORS, |l| l.errors_total);
    header(out, &EDGE_TLS_MISMATCH);
    for (link, l) in graph.links.iter().zip(&edge_labels) {
        let Some(tls) = graph.tls_identity(link) else {
            continue;
        };
        let source = &graph.nodes[link.source as usize];
        sample(
            out,
            EDGE_TLS_MISMATCH.name,
            l,
            Some(("owner", source.owner.as_str())),
        );
        value(out, u64::from(!tls.matches));
    }
}

/// A node's name within its zone: its id without `<zone>/`, so the cluster name,
/// or `external:<upstream>` for an external node (as the graph names it).
fn within_zone(n: &Node) -> &str {
    n.id.strip_prefix(n.zone_name.as_str())
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(&n.cluster_name)
}

fn header(out: &mut Vec<u8>, f: &Family) {
    let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
    let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
}

/// `name{labels[,extra]} ` (the value follows).
fn sample(out: &mut Vec<u8>, name: &str, labels: &[u8], extra: Option<(&str, &str)>) {
    out.extend_from_slice(name.as_bytes());
    out.push(b'{');
    out.extend_from_slice(labels);
    if let Some((k, v)) = extra {
        label(out, k, v, labels.is_empty());
    }
    out.extend_from_slice(b"} ");
}

fn value(out: &mut Vec<u8>, v: u64) {
    let _ = writeln!(out, "{v}");
}

/// `name="value"`, preceded by a comma unless it is the first, the value escaped as
/// the text format wants it (backslash, double quote and line feed).
fn label(out: &mut Vec<u8>, name: &str, value: &str, first: bool) {
    if !first {
        out.push(b',');
    }
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"=\"");
    if !value.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        out.extend_from_slice(value.as_bytes());
    } else {
        for b in value.bytes() {
            match b {
                b'\\' => out.extend_from_slice(b"\\\\"),
                b'"' => out.extend_from_slice(b"\\\""),
                b'\n' => out.extend_from_slice(b"\\n"),
                _ => out.push(b),
            }
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(zone: &str, cluster: &str, kind: &'static str, owner: &str) -> Node {
        let id = if kind == "external" {
            format!("{zone}/external:{cluster}")
        } else {
            format!("{zone}/{cluster}")
        };
        Node {
            id,
            kind,
            zone_name: zone.into(),
            cluster_name: cluster.into(),
            registered: kind == "cluster" && owner != "-",
            status: (kind == "cluster").then_some(Status::Warning),
            owner: owner.into(),
            instances: 2,
            drifted: false,
            cert_expires_ms: None,
            identity_state: meshcat_common::identity::CertState::None,
        }
    }

    fn link(source: u32, target: u32, requests_total: u64, errors_total: u64) -> Link {
        Link {
            requests_total,
            errors_total,
            observed: true,
            ..Link::new(source, target)
        }
    }

    #[test]
    fn clusters_and_edges_render_with_owners_and_escaped_labels() {
        // Sorted by id, as a build leaves them: a registered cluster whose owner
        // needs escaping, an external service and a cluster nobody registered.
        let mut a = node("z", "a", "cluster", "team \"a\"\\ops");
        a.cert_expires_ms = Some(1_796_110_222_500);
        a.identity_state = meshcat_common::identity::CertState::Expiring;
        let mut to_b = link(0, 2, 7, 0);
        to_b.tls_at = 0;
        let graph = Built {
            window_seconds: 60,
            error_ratio_warning: 0.05,
            nodes: vec![
                a,
                node("z", "api.example", "external", ""),
                node("z", "b", "cluster", "-"),
            ],
            links: vec![link(0, 1, 30, 3), to_b],
            tls: vec![meshcat_common::identity::TlsIdentity {
                expected_sans: vec!["spiffe://shop/sa/b".into()],
                presented_sans: vec!["spiffe://shop/sa/WRONG".into()],
                matches: false,
            }],
        };
        let mut out = Vec::new();
        render(&graph, &mut out);
        let text = String::from_utf8(out).unwrap();
        let owner = r#"owner="team \"a\"\\ops""#;
        for line in [
            format!(r#"meshcat_cluster_status{{zone="z",cluster="a",{owner},status="stable"}} 0"#),
            format!(r#"meshcat_cluster_status{{zone="z",cluster="a",{owner},status="warning"}} 1"#),
            format!(r#"meshcat_cluster_status{{zone="z",cluster="a",{owner},status="down"}} 0"#),
            format!(r#"meshcat_cluster_instances{{zone="z",cluster="a",{owner}}} 2"#),
            format!(
                r#"meshcat_certificate_expiry_timestamp_seconds{{zone="z",cluster="a",{owner}}} 1796110222"#
            ),
            format!(
                r#"meshcat_edge_tls_san_mismatch{{source_zone="z",source="a",target_zone="z",target="b",{owner}}} 1"#
            ),
            format!(r#"meshcat_cluster_identity{{zone="z",cluster="a",{owner},state="expiring"}} 1"#),
            format!(r#"meshcat_cluster_identity{{zone="z",cluster="a",{owner},state="ok"}} 0"#),
            r#"meshcat_edge_requests_total{source_zone="z",source="a",target_zone="z",target="external:api.example"} 30"#.into(),
            r#"meshcat_edge_errors_total{source_zone="z",source="a",target_zone="z",target="external:api.example"} 3"#.into(),
            r#"meshcat_edge_requests_total{source_zone="z",source="a",target_zone="z",target="b"} 7"#.into(),
            "# TYPE meshcat_edge_errors_total counter".into(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\nnot in\n{text}");
        }
        assert!(
            !text.contains(r#"cluster="b""#),
            "no cluster series for what nobody registered:\n{text}"
        );
        // One HELP and TYPE per family, every other line a sample.
        assert_eq!(text.matches("# TYPE ").count(), FAMILIES.len());
        assert_eq!(
            text.lines().filter(|l| !l.starts_with('#')).count(),
            3 + 1 + 1 + 5 + 2 * 2 + 1,
            "status, instances, expiry, identity; two edges' requests and errors; one mismatch"
        );
    }

    #[test]
    fn sync_series_are_one_per_state_of_each_registered_cluster() {
        use crate::sync::SyncState;
        let mut counts = std::collections::BTreeMap::new();
        counts.insert(("z".to_owned(), "orders".to_owned(), SyncState::Stale), 2);
        counts.insert(("z".to_owned(), "orders".to_owned(), SyncState::Synced), 1);
        counts.insert(("z".to_owned(), "gone".to_owned(), SyncState::Synced), 1);
        let mut out = Vec::new();
        render_sync(
            &counts,
            |_, c| (c == "orders").then(|| "team-\"o\"".to_owned()),
            &mut out,
        );
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(
            text.contains(r#"meshcat_sidecar_sync{zone="z",cluster="orders",owner="team-\"o\"",state="stale"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"state="rejected"} 0"#), "{text}");
        assert!(
            !text.contains("gone"),
            "an unregistered cluster has no series: {text}"
        );
    }
}
