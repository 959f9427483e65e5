//! The sync rule (contract section 17), without I/O: one instance's state and detail
//! from what its agent reports and its zone's view.
//!
//! - `unknown`: the zone has no view, or the sidecar has no configuration from xDS
//!   (its agent reports no connection state: static configuration only, or an agent
//!   that does not read it);
//! - `rejected`: a subscription's last update was rejected and no successful one
//!   followed (the agent tells which, `wire::XdsState::rejected`);
//! - `disconnected`: the sidecar says it is not connected to its control plane;
//! - `stale`: an upstream cluster both the sidecar and the view have whose host set
//!   differs from the view's endpoints for longer than the grace, or a cluster the
//!   sidecar still has that the control server stopped declaring longer ago;
//! - `synced`: none of these.
//!
//! Only clusters whose declared endpoints can be compared with a sidecar's hosts
//! are compared ([`ZoneView::comparable`]: EDS and STATIC ones). A STRICT_DNS or
//! LOGICAL_DNS cluster's view lists host names, never the addresses the sidecar
//! resolved them to, and an ORIGINAL_DST one lists none: their host sets are not
//! compared. A cluster the control server stopped declaring counts whatever its
//! type was.
//!
//! Host sets are compared by digest (`wire::hosts_digest`, the same sum on both
//! sides). The addresses missing and extra are named when the sidecar's digest is
//! that of one of the view's previous endpoint sets of the cluster (a sidecar held
//! on an older snapshot); otherwise only the counts are known.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::control::{ViewCluster, ZoneView};
use crate::store::SyncInput;

pub use meshcat_common::sync::{
    MAX_ADDRESSES, MAX_CLUSTERS, Rejection, StaleCluster, SyncDetail, SyncState,
};

fn detail(text: impl Into<String>) -> SyncDetail {
    SyncDetail {
        text: text.into(),
        ..SyncDetail::default()
    }
}

/// The state of `input` against `view` at `now` (ms). `mismatches` holds, per
/// upstream cluster whose host set differs, since when: kept by the caller between
/// calls and brought up to date here.
pub fn derive(
    view: Option<&ZoneView>,
    input: &SyncInput,
    mismatches: &mut BTreeMap<Arc<str>, i64>,
    now: i64,
    grace_ms: i64,
) -> (SyncState, SyncDetail) {
    let Some(view) = view else {
        mismatches.clear();
        return (
            SyncState::Unknown,
            detail("the zone's control server has sent no configuration yet"),
        );
    };
    let Some(xds) = &input.xds else {
        mismatches.clear();
        return (
            SyncState::Unknown,
            detail("the agent reports no xDS state for this sidecar"),
        );
    };
    let Some(connected) = xds.connected else {
        mismatches.clear();
        return (
            SyncState::Unknown,
            detail("the sidecar has no configuration from xDS (static configuration only)"),
        );
    };
    track(view, input, mismatches, now);
    if !xds.rejected.is_empty() {
        let rejections: Vec<Rejection> = xds
            .rejected
            .iter()
            .map(|r| Rejection {
                kind: r.kind.clone(),
                resource: r.resource.clone(),
                reason: r.reason.clone(),
                since_ms: r.since_ms,
            })
            .collect();
        let first = &rejections[0];
        let what = if first.resource.is_empty() {
            first.kind.clone()
        } else {
            format!("{} of {}", first.kind, first.resource)
        };
        let reason = if first.reason.is_empty() {
            "no reason in the sidecar's log".to_owned()
        } else {
            first.reason.clone()
        };
        let more = match rejections.len() {
            1 => String::new(),
            n => format!(" (and {} more)", n - 1),
        };
        return (
            SyncState::Rejected,
            SyncDetail {
                text: format!("the sidecar rejected the update of {what}: {reason}{more}"),
                clusters: Vec::new(),
                rejections,
            },
        );
    }
    if !connected {
        return (
            SyncState::Disconnected,
            detail("the sidecar is not connected to its control plane"),
        );
    }
    let stale: Vec<(&Arc<str>, i64)> = mismatches
        .iter()
        .filter(|(_, since)| now - **since >= grace_ms)
        .map(|(c, since)| (c, *since))
        .collect();
    if stale.is_empty() {
        return (SyncState::Synced, SyncDetail::default());
    }
    let clusters: Vec<StaleCluster> = stale
        .iter()
        .take(MAX_CLUSTERS)
        .map(|(name, since)| stale_cluster(view, input, name, *since))
        .collect();
    let first = &clusters[0];
    let mut text = if first.removed {
        format!(
            "cluster {} is no longer declared by the control server",
            first.cluster
        )
    } else {
        match (first.missing_count, first.extra_count) {
            (Some(m), Some(x)) => {
                let mut t = format!("cluster {}: {m} missing", first.cluster);
                if !first.missing.is_empty() {
                    t.push_str(&format!(" ({})", first.missing.join(", ")));
                }
                t.push_str(&format!(", {x} extra"));
                if !first.extra.is_empty() {
                    t.push_str(&format!(" ({})", first.extra.join(", ")));
                }
                t
            }
            _ => format!(
                "cluster {}: {} hosts where the control server lists {} endpoints",
                first.cluster, first.sidecar_hosts, first.control_endpoints
            ),
        }
    };
    if stale.len() > 1 {
        text.push_str(&format!(" (and {} more clusters)", stale.len() - 1));
    }
    (
        SyncState::Stale,
        SyncDetail {
            text,
            clusters,
            rejections: Vec::new(),
        },
    )
}

/// Brings `mismatches` up to date: a cluster whose digest differs from the view's
/// (or that the view dropped) keeps its first time, one that agrees, or whose
/// endpoints are not comparable (DNS), is dropped.
fn track(view: &ZoneView, input: &SyncInput, mismatches: &mut BTreeMap<Arc<str>, i64>, now: i64) {
    let mut differ: BTreeSet<&str> = BTreeSet::new();
    for held in input.clusters.iter() {
        let since = if let Some(v) = view.clusters.get(&*held.name) {
            if v.digest == held.hosts_digest || !view.comparable(&held.name) {
                continue;
            }
            now
        } else if let Some(removed) = view.removed.get(&*held.name) {
            (*removed).min(now)
        } else {
            continue;
        };
        differ.insert(&held.name);
        if !mismatches.contains_key(&*held.name) {
            mismatches.insert(held.name.clone(), since);
        }
    }
    mismatches.retain(|name, _| differ.contains(&**name));
}

fn stale_cluster(view: &ZoneView, input: &SyncInput, name: &str, since: i64) -> StaleCluster {
    let held = input.clusters.get(name);
    let sidecar_hosts = held.map_or(0, |h| u64::from(h.host_count));
    let Some(v) = view.clusters.get(name) else {
        return StaleCluster {
            cluster: name.to_owned(),
            since_ms: since,
            removed: true,
            missing: Vec::new(),
            missing_count: Some(0),
            extra: Vec::new(),
            extra_count: Some(sidecar_hosts),
            sidecar_hosts,
            control_endpoints: 0,
        };
    };
    let control_endpoints = v.len() as u64;
    let (missing, missing_count, extra, extra_count) =
        match held.and_then(|h| older_set(v, h.hosts_digest)) {
            Some(old) => {
                let now: BTreeSet<&str> = v.endpoints().map(|e| e.address).collect();
                let then: BTreeSet<&str> = old.iter().map(|a| &**a).collect();
                let missing: Vec<&str> = now.difference(&then).copied().collect();
                let extra: Vec<&str> = then.difference(&now).copied().collect();
                (
                    missing
                        .iter()
                        .take(MAX_ADDRESSES)
                        .map(|s| s.to_string())
                        .collect(),
                    Some(missing.len() as u64),
                    extra
                        .iter()
                        .take(MAX_ADDRESSES)
                        .map(|s| s.to_string())
                        .collect(),
                    Some(extra.len() as u64),
                )
            }
            None => (Vec::new(), None, Vec::new(), None),
        };
    StaleCluster {
        cluster: name.to_owned(),
        since_ms: since,
        removed: false,
        missing,
        missing_count,
        extra,
        extra_count,
        sidecar_hosts,
        control_endpoints,
    }
}

/// The view's earlier endpoint set of `v` whose digest is `digest`.
fn older_set(v: &ViewCluster, digest: u64) -> Option<&Arc<[Box<str>]>> {
    v.previous
        .iter()
        .find(|(d, _)| *d == digest)
        .map(|(_, s)| s)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use meshcat_common::wire::{ReportedCluster, XdsRejection, XdsState, hosts_digest};

    use super::*;
    use crate::ingest::InstanceKey;
    use crate::store::clusterset::ClusterSet;

    const GRACE: i64 = 30_000;

    fn cluster(addresses: &[&str], previous: &[&[&str]]) -> ViewCluster {
        let endpoints: Vec<(&str, bool)> = addresses.iter().map(|a| (*a, true)).collect();
        let mut c = ViewCluster::of(&endpoints, 0);
        assert_eq!(c.digest, hosts_digest(addresses.iter().copied()));
        c.previous = previous
            .iter()
            .map(|set| {
                (
                    hosts_digest(set.iter().copied()),
                    set.iter().map(|s| (*s).into()).collect(),
                )
            })
            .collect();
        c
    }

    fn view(clusters: Vec<(&str, ViewCluster)>, removed: &[(&str, i64)]) -> ZoneView {
        ZoneView {
            clusters: clusters
                .into_iter()
                .map(|(n, c)| (Arc::from(n), Arc::new(c)))
                .collect(),
            removed: removed.iter().map(|(n, t)| ((*n).to_owned(), *t)).collect(),
            incomparable: Default::default(),
            listeners: 0,
            routes: 0,
        }
    }

    fn input(clusters: &[(&str, &[&str])], xds: Option<XdsState>) -> SyncInput {
        let reported: Vec<ReportedCluster> = clusters
            .iter()
            .map(|(n, hosts)| {
                ReportedCluster::healthy(*n, hosts.iter().map(|h| (*h).to_owned()).collect())
            })
            .collect();
        SyncInput {
            key: InstanceKey::new("z", "c", "i"),
            clusters: Arc::new(ClusterSet::full(&reported, |_| false)),
            xds,
            owner: None,
        }
    }

    fn connected() -> Option<XdsState> {
        Some(XdsState {
            connected: Some(true),
            rejected: Vec::new(),
        })
    }

    #[test]
    fn without_a_view_or_an_xds_state_the_sync_is_unknown() {
        let mut m = BTreeMap::new();
        let i = input(&[("a", &["10.0.0.1:80"])], connected());
        assert_eq!(derive(None, &i, &mut m, 0, GRACE).0, SyncState::Unknown);
        let v = view(vec![("a", cluster(&["10.0.0.1:80"], &[]))], &[]);
        let old_agent = input(&[("a", &["10.0.0.1:80"])], None);
        assert_eq!(
            derive(Some(&v), &old_agent, &mut m, 0, GRACE).0,
            SyncState::Unknown
        );
        let static_only = input(
            &[("a", &["10.0.0.1:80"])],
            Some(XdsState {
                connected: None,
                rejected: Vec::new(),
            }),
        );
        let (state, detail) = derive(Some(&v), &static_only, &mut m, 0, GRACE);
        assert_eq!(state, SyncState::Unknown);
        assert!(detail.text.contains("static"), "{}", detail.text);
    }

    #[test]
    fn equal_host_sets_are_synced_and_a_difference_is_stale_only_after_the_grace() {
        let v = view(
            vec![(
                "a",
                cluster(
                    &["10.0.0.1:80", "10.0.0.2:80"],
                    &[&["10.0.0.1:80", "10.0.0.9:80"]],
                ),
            )],
            &[],
        );
        let mut m = BTreeMap::new();
        let same = input(&[("a", &["10.0.0.2:80", "10.0.0.1:80"])], connected());
        assert_eq!(
            derive(Some(&v), &same, &mut m, 0, GRACE).0,
            SyncState::Synced
        );
        assert!(m.is_empty());

        // Held on the previous endpoint set: named addresses once the grace is over.
        let held = input(&[("a", &["10.0.0.1:80", "10.0.0.9:80"])], connected());
        assert_eq!(
            derive(Some(&v), &held, &mut m, 1_000, GRACE).0,
            SyncState::Synced
        );
        assert_eq!(
            derive(Some(&v), &held, &mut m, 30_999, GRACE).0,
            SyncState::Synced
        );
        let (state, detail) = derive(Some(&v), &held, &mut m, 31_000, GRACE);
        assert_eq!(state, SyncState::Stale);
        let c = &detail.clusters[0];
        assert_eq!((c.cluster.as_str(), c.since_ms), ("a", 1_000));
        assert_eq!(c.missing, vec!["10.0.0.2:80"]);
        assert_eq!(c.extra, vec!["10.0.0.9:80"]);
        assert_eq!((c.missing_count, c.extra_count), (Some(1), Some(1)));
        assert!(detail.text.contains("10.0.0.2:80"), "{}", detail.text);

        // Catching up clears it at once.
        assert_eq!(
            derive(Some(&v), &same, &mut m, 32_000, GRACE).0,
            SyncState::Synced
        );
        assert!(m.is_empty());

        // A set the view never had: only the counts are known.
        let other = input(&[("a", &["10.9.9.9:80"])], connected());
        derive(Some(&v), &other, &mut m, 40_000, GRACE);
        let (state, detail) = derive(Some(&v), &other, &mut m, 70_000, GRACE);
        assert_eq!(state, SyncState::Stale);
        assert_eq!(detail.clusters[0].missing_count, None);
        assert_eq!(
            (
                detail.clusters[0].sidecar_hosts,
                detail.clusters[0].control_endpoints
            ),
            (1, 2)
        );
    }

    #[test]
    fn a_cluster_the_control_server_dropped_is_stale_from_when_it_was_dropped() {
        let v = view(vec![], &[("gone", 5_000)]);
        let mut m = BTreeMap::new();
        let i = input(
            &[("gone", &["10.0.0.1:80"]), ("static", &["127.0.0.1:1"])],
            connected(),
        );
        assert_eq!(
            derive(Some(&v), &i, &mut m, 20_000, GRACE).0,
            SyncState::Synced
        );
        let (state, detail) = derive(Some(&v), &i, &mut m, 35_000, GRACE);
        assert_eq!(state, SyncState::Stale);
        assert!(detail.clusters[0].removed);
        assert_eq!(detail.clusters[0].since_ms, 5_000);
        assert_eq!(
            detail.clusters.len(),
            1,
            "a cluster the view never had is not compared"
        );
    }

    #[test]
    fn a_dns_clusters_host_names_are_not_compared_but_its_removal_counts() {
        // The view lists the names a STRICT_DNS cluster declares; the sidecar holds
        // the addresses it resolved them to.
        let mut v = view(
            vec![
                ("dns", cluster(&["ledger.example.com:443"], &[])),
                ("eds", cluster(&["10.0.0.1:80"], &[])),
            ],
            &[("gone-dns", 5_000)],
        );
        v.incomparable.insert("dns".into());
        assert!(!v.comparable("dns") && v.comparable("eds") && v.comparable("other"));
        let mut m = BTreeMap::new();
        let i = input(
            &[
                ("dns", &["93.184.216.34:443", "93.184.216.35:443"]),
                ("eds", &["10.0.0.1:80"]),
            ],
            connected(),
        );
        assert_eq!(derive(Some(&v), &i, &mut m, 0, GRACE).0, SyncState::Synced);
        let (state, _) = derive(Some(&v), &i, &mut m, 10 * GRACE, GRACE);
        assert_eq!(state, SyncState::Synced);
        assert!(m.is_empty(), "{m:?}");

        // A comparable cluster that differs is still stale beside it.
        let differs = input(
            &[("dns", &["93.184.216.34:443"]), ("eds", &["10.0.0.9:80"])],
            connected(),
        );
        derive(Some(&v), &differs, &mut m, 0, GRACE);
        let (state, detail) = derive(Some(&v), &differs, &mut m, GRACE, GRACE);
        assert_eq!(state, SyncState::Stale);
        assert_eq!(detail.clusters.len(), 1);
        assert_eq!(detail.clusters[0].cluster, "eds");

        // A DNS cluster the control server stopped declaring counts as before.
        let mut m = BTreeMap::new();
        let kept = input(&[("gone-dns", &["93.184.216.34:443"])], connected());
        let (state, detail) = derive(Some(&v), &kept, &mut m, 40_000, GRACE);
        assert_eq!(state, SyncState::Stale);
        assert!(detail.clusters[0].removed);
        assert_eq!(detail.clusters[0].since_ms, 5_000);
    }

    #[test]
    fn a_rejection_comes_before_a_disconnection_and_names_the_reason() {
        let v = view(vec![("a", cluster(&["10.0.0.1:80"], &[]))], &[]);
        let mut m = BTreeMap::new();
        let rejected = input(
            &[("a", &["10.0.0.1:80"])],
            Some(XdsState {
                connected: Some(false),
                rejected: vec![XdsRejection {
                    kind: "clusters".into(),
                    resource: String::new(),
                    reason: "Proto constraint validation failed".into(),
                    since_ms: 7,
                    rejected_total: 1,
                    success_total: 3,
                }],
            }),
        );
        let (state, detail) = derive(Some(&v), &rejected, &mut m, 0, GRACE);
        assert_eq!(state, SyncState::Rejected);
        assert!(detail.text.contains("Proto constraint"), "{}", detail.text);
        assert_eq!(detail.rejections[0].since_ms, 7);
        let down = input(
            &[("a", &["10.0.0.1:80"])],
            Some(XdsState {
                connected: Some(false),
                rejected: Vec::new(),
            }),
        );
        assert_eq!(
            derive(Some(&v), &down, &mut m, 0, GRACE).0,
            SyncState::Disconnected
        );
    }
}
