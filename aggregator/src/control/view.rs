//! A zone's intended view as its control server declares it ([`ZoneView`]: the
//! clusters with their endpoints, the clusters it stopped declaring, the counts of
//! listeners and routes) and [`Held`], what one zone's stream keeps to build the next
//! view from an accepted response: the current view, each EDS cluster's service
//! name, each listener's route configuration names, the route configurations held.
//! A view is immutable once built; each accepted response builds a new one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use meshcat_common::wire::hosts_digest;

use super::decode::{self, ClusterDecl, ListenerDecl, RawEndpoint, Source};

/// How long a cluster the control server stopped declaring stays in
/// [`ZoneView::removed`].
pub const REMOVED_KEPT_MS: i64 = 3_600_000;
/// Most clusters [`ZoneView::removed`] holds; the oldest go first.
pub const MAX_REMOVED: usize = 10_000;
/// How many earlier endpoint sets a cluster keeps in [`ViewCluster::previous`].
pub const PREVIOUS_SETS: usize = 3;

/// What a zone's control server declares, as of its last accepted response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZoneView {
    /// Every declared cluster (CDS) by name. EDS clusters' endpoints come from EDS;
    /// STATIC, STRICT_DNS and LOGICAL_DNS clusters' from their inline
    /// `load_assignment` (a DNS cluster's as declared: names, not resolved).
    pub clusters: BTreeMap<String, ViewCluster>,
    /// Clusters the server stopped declaring, and when (ms since the epoch); each
    /// kept for [`REMOVED_KEPT_MS`], at most [`MAX_REMOVED`].
    pub removed: BTreeMap<String, i64>,
    /// Listeners declared (LDS).
    pub listeners: usize,
    /// Route configurations held: those received over RDS that a listener names, and
    /// the listeners' inline ones.
    pub routes: usize,
}

impl ZoneView {
    /// Endpoints over all clusters.
    pub fn endpoint_count(&self) -> usize {
        self.clusters.values().map(|c| c.endpoints.len()).sum()
    }
}

/// One declared cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ViewCluster {
    /// Sorted by address, distinct.
    pub endpoints: Vec<ViewEndpoint>,
    /// [`hosts_digest`] over the endpoints' addresses: equal to the digest an agent
    /// reports for a sidecar holding the same host set.
    pub digest: u64,
    /// Endpoints with health HEALTHY or UNKNOWN.
    pub healthy: u32,
    /// The digests and address sets of this cluster's last [`PREVIOUS_SETS`]
    /// distinct non-empty endpoint sets before the current one, newest first.
    pub previous: Vec<(u64, Arc<[String]>)>,
}

impl ViewCluster {
    /// The cluster with these endpoints, following `old` (the same cluster in the
    /// previous view): an address keeps its first-seen time, and `old`'s set goes
    /// to the front of `previous` when the set changed.
    pub fn build(raw: Vec<RawEndpoint>, old: Option<&ViewCluster>, now_ms: i64) -> ViewCluster {
        let mut raw = raw;
        // By address, the healthy entries of one address first, so the kept entry
        // of an address listed twice (two priorities) is a healthy one when any is.
        raw.sort_unstable_by(|a, b| {
            a.address
                .cmp(&b.address)
                .then_with(|| decode::is_healthy(b.health).cmp(&decode::is_healthy(a.health)))
        });
        raw.dedup_by(|later, kept| later.address == kept.address);
        let mut healthy = 0u32;
        let endpoints: Vec<ViewEndpoint> = raw
            .into_iter()
            .map(|r| {
                let ok = decode::is_healthy(r.health);
                healthy += u32::from(ok);
                let first_seen_ms = old
                    .and_then(|o| o.find(&r.address))
                    .map_or(now_ms, |e| e.first_seen_ms);
                ViewEndpoint {
                    address: r.address,
                    healthy: ok,
                    health: decode::health_text(r.health).to_owned(),
                    first_seen_ms,
                }
            })
            .collect();
        let digest = hosts_digest(endpoints.iter().map(|e| e.address.as_str()));
        let previous = match old {
            None => Vec::new(),
            Some(o) if o.digest == digest && o.endpoints.len() == endpoints.len() => {
                o.previous.clone()
            }
            Some(o) => {
                let mut previous = Vec::with_capacity(PREVIOUS_SETS);
                if !o.endpoints.is_empty() {
                    let set: Arc<[String]> =
                        o.endpoints.iter().map(|e| e.address.clone()).collect();
                    previous.push((o.digest, set));
                }
                for p in &o.previous {
                    if previous.len() >= PREVIOUS_SETS {
                        break;
                    }
                    if !previous.iter().any(|q| q.0 == p.0) {
                        previous.push(p.clone());
                    }
                }
                previous.retain(|p| p.0 != digest);
                previous
            }
        };
        ViewCluster {
            endpoints,
            digest,
            healthy,
            previous,
        }
    }

    /// The endpoint at `address`.
    pub fn find(&self, address: &str) -> Option<&ViewEndpoint> {
        self.endpoints
            .binary_search_by(|e| e.address.as_str().cmp(address))
            .ok()
            .map(|i| &self.endpoints[i])
    }
}

/// One endpoint of a declared cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ViewEndpoint {
    /// `ip:port`, IPv6 as `[::1]:80`, a pipe as `unix://path` (as Envoy's
    /// `/clusters` writes them).
    pub address: String,
    /// HEALTHY or UNKNOWN.
    pub healthy: bool,
    /// The EDS health status: `HEALTHY`, `UNHEALTHY`, `UNKNOWN`, `DRAINING`,
    /// `TIMEOUT`, `DEGRADED`.
    pub health: String,
    /// When the endpoint first appeared in this cluster's view (ms since the epoch).
    pub first_seen_ms: i64,
}

/// The bounds a view is held to.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub max_clusters: usize,
    pub max_endpoints: usize,
}

/// What a zone's stream holds beside the view to build the next one.
#[derive(Debug)]
pub struct Held {
    /// The current view.
    pub view: Arc<ZoneView>,
    /// Each EDS cluster's service name; `None` until the first CDS response of this
    /// holder (a view taken over from an earlier server address).
    eds: Option<BTreeMap<String, String>>,
    /// Each listener's RDS names and inline route configurations.
    listeners: BTreeMap<String, ListenerDecl>,
    /// The route configurations received over RDS that a listener names.
    routes: BTreeSet<String>,
}

impl Held {
    /// A holder starting from `seed` (the last view of the zone, if any).
    pub fn new(seed: Option<Arc<ZoneView>>) -> Held {
        Held {
            view: seed.unwrap_or_default(),
            eds: None,
            listeners: BTreeMap::new(),
            routes: BTreeSet::new(),
        }
    }

    /// The service names EDS is asked for, sorted and distinct.
    pub fn eds_names(&self) -> Vec<String> {
        let names: BTreeSet<&String> = self.eds.iter().flat_map(|m| m.values()).collect();
        names.into_iter().cloned().collect()
    }

    /// The route configuration names RDS is asked for, sorted and distinct.
    pub fn rds_names(&self) -> Vec<String> {
        let names: BTreeSet<&String> = self.listeners.values().flat_map(|l| l.rds.iter()).collect();
        names.into_iter().cloned().collect()
    }

    /// The view after a CDS response: every declared cluster, each EDS cluster with
    /// the endpoints held for its service, each inline cluster with its own.
    pub fn apply_clusters(
        &mut self,
        decls: Vec<ClusterDecl>,
        bounds: Bounds,
        now_ms: i64,
    ) -> Result<Arc<ZoneView>, String> {
        if decls.len() > bounds.max_clusters {
            return Err(decode::over_clusters(decls.len(), bounds.max_clusters));
        }
        let old = &self.view;
        let old_eds = self.eds.as_ref();
        // For each service, a cluster of the old view that holds its endpoints.
        let mut by_service: HashMap<&str, &str> = HashMap::new();
        if let Some(m) = old_eds {
            for (cluster, service) in m {
                by_service
                    .entry(service.as_str())
                    .or_insert(cluster.as_str());
            }
        }
        let mut eds = BTreeMap::new();
        let mut clusters = BTreeMap::new();
        let mut total = 0usize;
        for decl in decls {
            let old_cluster = old.clusters.get(&decl.name);
            let cluster = match decl.source {
                Source::Eds(service) => {
                    // The same cluster with the same service keeps its endpoints;
                    // a view taken over keeps them too until EDS answers.
                    let same = old_eds.is_none_or(|m| m.get(&decl.name) == Some(&service));
                    let held = if same { old_cluster } else { None }.or_else(|| {
                        by_service
                            .get(service.as_str())
                            .and_then(|c| old.clusters.get(*c))
                    });
                    eds.insert(decl.name.clone(), service);
                    match held {
                        Some(h) if old_cluster.is_some_and(|o| std::ptr::eq(o, h)) => h.clone(),
                        Some(h) => ViewCluster::build(raw_of(h), old_cluster, now_ms),
                        None => ViewCluster::build(Vec::new(), old_cluster, now_ms),
                    }
                }
                Source::Inline(raw) => ViewCluster::build(raw, old_cluster, now_ms),
                Source::None => ViewCluster::build(Vec::new(), old_cluster, now_ms),
            };
            total += cluster.endpoints.len();
            if total > bounds.max_endpoints {
                return Err(decode::over_endpoints(total, bounds.max_endpoints));
            }
            clusters.insert(decl.name, cluster);
        }
        let mut removed = old.removed.clone();
        for name in old.clusters.keys() {
            if !clusters.contains_key(name) {
                removed.insert(name.clone(), now_ms);
            }
        }
        removed.retain(|name, at| !clusters.contains_key(name) && now_ms - *at < REMOVED_KEPT_MS);
        trim_removed(&mut removed);
        let view = Arc::new(ZoneView {
            clusters,
            removed,
            listeners: old.listeners,
            routes: old.routes,
        });
        self.eds = Some(eds);
        self.view = view.clone();
        Ok(view)
    }

    /// The view after an EDS response: the clusters of each service it carries take
    /// its endpoints; the others keep theirs.
    pub fn apply_endpoints(
        &mut self,
        assignments: Vec<(String, Vec<RawEndpoint>)>,
        bounds: Bounds,
        now_ms: i64,
    ) -> Result<Arc<ZoneView>, String> {
        let Some(eds) = &self.eds else {
            // No CDS answer yet: nothing to place the endpoints in.
            return Ok(self.view.clone());
        };
        let mut by_service: HashMap<String, Vec<RawEndpoint>> = assignments.into_iter().collect();
        let mut clusters_of: HashMap<&str, Vec<&str>> = HashMap::new();
        for (cluster, service) in eds {
            clusters_of
                .entry(service.as_str())
                .or_default()
                .push(cluster.as_str());
        }
        let old = &self.view;
        let mut clusters = old.clusters.clone();
        for (service, names) in clusters_of {
            let Some(raw) = by_service.remove(service) else {
                continue;
            };
            for name in names {
                let built = ViewCluster::build(raw.clone(), old.clusters.get(name), now_ms);
                clusters.insert(name.to_owned(), built);
            }
        }
        let total: usize = clusters.values().map(|c| c.endpoints.len()).sum();
        if total > bounds.max_endpoints {
            return Err(decode::over_endpoints(total, bounds.max_endpoints));
        }
        let view = Arc::new(ZoneView {
            clusters,
            removed: old.removed.clone(),
            listeners: old.listeners,
            routes: old.routes,
        });
        self.view = view.clone();
        Ok(view)
    }

    /// The view after an LDS response: its listeners; the route configurations no
    /// listener names any more are let go.
    pub fn apply_listeners(&mut self, decls: Vec<ListenerDecl>) -> Arc<ZoneView> {
        self.listeners = decls.into_iter().map(|l| (l.name.clone(), l)).collect();
        let wanted: BTreeSet<String> = self.rds_names().into_iter().collect();
        self.routes.retain(|r| wanted.contains(r));
        self.recount()
    }

    /// The view after an RDS response: the named route configurations it carries are
    /// held.
    pub fn apply_routes(&mut self, names: Vec<String>) -> Arc<ZoneView> {
        let wanted: BTreeSet<String> = self.rds_names().into_iter().collect();
        self.routes
            .extend(names.into_iter().filter(|n| wanted.contains(n)));
        self.recount()
    }

    /// The current view with the listener and route counts of what is held.
    fn recount(&mut self) -> Arc<ZoneView> {
        let inline: usize = self.listeners.values().map(|l| l.inline_routes).sum();
        let (listeners, routes) = (self.listeners.len(), self.routes.len() + inline);
        if self.view.listeners != listeners || self.view.routes != routes {
            let mut view = ZoneView::clone(&self.view);
            view.listeners = listeners;
            view.routes = routes;
            self.view = Arc::new(view);
        }
        self.view.clone()
    }
}

/// A view cluster's endpoints as raw entries, to build another cluster from them.
fn raw_of(cluster: &ViewCluster) -> Vec<RawEndpoint> {
    use envoy_types::pb::envoy::config::core::v3::HealthStatus;
    cluster
        .endpoints
        .iter()
        .map(|e| RawEndpoint {
            address: e.address.clone(),
            health: HealthStatus::from_str_name(&e.health).unwrap_or(HealthStatus::Unknown),
        })
        .collect()
}

/// Drops the oldest removed clusters beyond [`MAX_REMOVED`].
fn trim_removed(removed: &mut BTreeMap<String, i64>) {
    if removed.len() <= MAX_REMOVED {
        return;
    }
    let mut times: Vec<i64> = removed.values().copied().collect();
    times.sort_unstable();
    let cut = times[removed.len() - MAX_REMOVED];
    removed.retain(|_, at| *at >= cut);
    // Ties at the cut may leave a few too many: drop them by name.
    while removed.len() > MAX_REMOVED {
        let Some(name) = removed
            .iter()
            .find(|(_, at)| **at == cut)
            .map(|(n, _)| n.clone())
        else {
            break;
        };
        removed.remove(&name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::HealthStatus;

    fn raw(addresses: &[(&str, HealthStatus)]) -> Vec<RawEndpoint> {
        addresses
            .iter()
            .map(|(a, h)| RawEndpoint {
                address: (*a).to_owned(),
                health: *h,
            })
            .collect()
    }

    const BOUNDS: Bounds = Bounds {
        max_clusters: 10,
        max_endpoints: 10,
    };

    #[test]
    fn a_cluster_is_sorted_distinct_and_remembers_its_earlier_sets() {
        use HealthStatus::*;
        let a = ViewCluster::build(
            raw(&[
                ("10.0.0.2:80", Unhealthy),
                ("10.0.0.1:80", Healthy),
                ("10.0.0.2:80", Unknown),
            ]),
            None,
            5,
        );
        let addresses: Vec<&str> = a.endpoints.iter().map(|e| e.address.as_str()).collect();
        assert_eq!(addresses, ["10.0.0.1:80", "10.0.0.2:80"]);
        assert_eq!(a.healthy, 2);
        assert_eq!(a.endpoints[1].health, "UNKNOWN");
        assert_eq!(a.digest, hosts_digest(["10.0.0.2:80", "10.0.0.1:80"]));
        let b = ViewCluster::build(raw(&[("10.0.0.1:80", Draining)]), Some(&a), 9);
        assert_eq!(b.endpoints[0].first_seen_ms, 5);
        assert!(!b.endpoints[0].healthy);
        assert_eq!(b.previous.len(), 1);
        assert_eq!(b.previous[0].0, a.digest);
        assert_eq!(&*b.previous[0].1, ["10.0.0.1:80", "10.0.0.2:80"]);
        // Back to the first set: it is current, not previous.
        let c = ViewCluster::build(
            raw(&[("10.0.0.1:80", Healthy), ("10.0.0.2:80", Healthy)]),
            Some(&b),
            10,
        );
        assert_eq!(c.previous.len(), 1);
        assert_eq!(c.previous[0].0, b.digest);
        // Health alone changing keeps the history.
        let d = ViewCluster::build(
            raw(&[("10.0.0.1:80", Unhealthy), ("10.0.0.2:80", Healthy)]),
            Some(&c),
            11,
        );
        assert_eq!(d.previous, c.previous);
    }

    #[test]
    fn clusters_endpoints_and_removals_build_the_view() {
        use HealthStatus::*;
        let mut held = Held::new(None);
        let decls = vec![
            ClusterDecl {
                name: "a".into(),
                source: Source::Eds("svc".into()),
            },
            ClusterDecl {
                name: "b".into(),
                source: Source::Inline(raw(&[("10.1.0.1:80", Healthy)])),
            },
        ];
        let v = held.apply_clusters(decls.clone(), BOUNDS, 1).unwrap();
        assert_eq!(v.clusters.len(), 2);
        assert_eq!(held.eds_names(), ["svc"]);
        let v = held
            .apply_endpoints(
                vec![("svc".into(), raw(&[("10.0.0.1:80", Healthy)]))],
                BOUNDS,
                2,
            )
            .unwrap();
        assert_eq!(v.clusters["a"].endpoints.len(), 1);
        assert_eq!(v.endpoint_count(), 2);
        // CDS again: the EDS cluster keeps its endpoints.
        let v = held.apply_clusters(decls[..1].to_vec(), BOUNDS, 3).unwrap();
        assert_eq!(v.clusters["a"].endpoints.len(), 1);
        assert_eq!(v.removed.get("b"), Some(&3));
        // Over the endpoint bound: refused, the view kept.
        let many: Vec<(String, HealthStatus)> = (0..11)
            .map(|i| (format!("10.2.0.{i}:80"), Healthy))
            .collect();
        let many: Vec<(&str, HealthStatus)> = many.iter().map(|(a, h)| (a.as_str(), *h)).collect();
        let err = held
            .apply_endpoints(vec![("svc".into(), raw(&many))], BOUNDS, 4)
            .unwrap_err();
        assert!(err.contains("11 endpoints"), "{err}");
        assert_eq!(held.view.clusters["a"].endpoints.len(), 1);
        // The cluster back: no longer removed.
        let v = held.apply_clusters(decls, BOUNDS, 5).unwrap();
        assert!(v.removed.is_empty());
    }

    #[test]
    fn listeners_name_the_routes_held() {
        let mut held = Held::new(None);
        let v = held.apply_listeners(vec![
            ListenerDecl {
                name: "l1".into(),
                rds: vec!["r1".into()],
                inline_routes: 1,
            },
            ListenerDecl {
                name: "l2".into(),
                rds: vec!["r1".into(), "r2".into()],
                inline_routes: 0,
            },
        ]);
        assert_eq!((v.listeners, v.routes), (2, 1));
        assert_eq!(held.rds_names(), ["r1", "r2"]);
        let v = held.apply_routes(vec!["r1".into(), "r2".into(), "other".into()]);
        assert_eq!(v.routes, 3);
        let v = held.apply_listeners(vec![ListenerDecl {
            name: "l2".into(),
            rds: vec!["r2".into()],
            inline_routes: 0,
        }]);
        assert_eq!((v.listeners, v.routes), (1, 1));
    }

    #[test]
    fn removed_clusters_are_bounded() {
        let mut removed: BTreeMap<String, i64> = (0..MAX_REMOVED + 5)
            .map(|i| (format!("c{i}"), i as i64))
            .collect();
        trim_removed(&mut removed);
        assert_eq!(removed.len(), MAX_REMOVED);
        assert!(!removed.contains_key("c0"));
    }
}
