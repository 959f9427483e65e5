//! A zone's intended view as its control server declares it ([`ZoneView`]: the
//! clusters with their endpoints, the clusters it stopped declaring, which clusters'
//! endpoints can be compared with a sidecar's hosts, the counts of listeners and
//! routes) and [`Held`], what one zone's stream keeps to build the next view from an
//! accepted response: the current view, each EDS cluster's service name, each
//! listener's route configuration names, the route configurations held, and for
//! Delta xDS the version of each resource held. A state-of-the-world response
//! replaces a type's resources; a delta response changes the ones it names
//! (`change_*`: upserts and removals) and leaves the others as they are. A view is
//! immutable once built; each accepted response builds a new one.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use meshcat_common::wire::hosts_digest;

use envoy_types::pb::envoy::config::core::v3::HealthStatus;

use super::decode::{self, ClusterDecl, Kind, ListenerDecl, RawEndpoints, Source};

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
    /// `load_assignment` (a DNS cluster's as declared: names, not resolved). Names
    /// and clusters are shared: the next view copies only what changed, the stream
    /// keeps its EDS services and versions under the same names, and the catalog's
    /// entries name the clusters they stand for with them.
    pub clusters: BTreeMap<Arc<str>, Arc<ViewCluster>>,
    /// Clusters the server stopped declaring, and when (ms since the epoch); each
    /// kept for [`REMOVED_KEPT_MS`], at most [`MAX_REMOVED`].
    pub removed: BTreeMap<String, i64>,
    /// The declared clusters whose endpoint set cannot be compared with a sidecar's
    /// host set ([`ZoneView::comparable`]): STRICT_DNS and LOGICAL_DNS clusters (the
    /// view lists the host names, the sidecar the addresses it resolved them to),
    /// ORIGINAL_DST and custom clusters (no endpoints declared; the sidecar makes its
    /// hosts as connections come). EDS and STATIC clusters are comparable.
    pub incomparable: BTreeSet<String>,
    /// Listeners declared (LDS).
    pub listeners: usize,
    /// Route configurations held: those received over RDS that a listener names, and
    /// the listeners' inline ones.
    pub routes: usize,
}

impl ZoneView {
    /// Endpoints over all clusters.
    pub fn endpoint_count(&self) -> usize {
        self.clusters.values().map(|c| c.len()).sum()
    }

    /// Whether a sidecar's host set of `cluster` can be compared with the view's
    /// endpoints of it: an EDS or STATIC cluster, or one the view does not declare.
    pub fn comparable(&self, cluster: &str) -> bool {
        !self.incomparable.contains(cluster)
    }
}

/// One declared cluster. Its endpoints are kept in two allocations, whatever their
/// number: the addresses one after the other, and per endpoint where its address
/// ends, its health and when it was first seen ([`ViewCluster::endpoints`] reads
/// them as [`ViewEndpoint`]s). A view holds a hundred thousand endpoints for about
/// 16 bytes each beside their addresses, and no small allocation that would outlive
/// the ones decoding a response made around it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ViewCluster {
    /// The endpoints' addresses, sorted, distinct, one after the other.
    addresses: Box<str>,
    /// Per endpoint, in the addresses' order.
    slots: Box<[Slot]>,
    /// [`hosts_digest`] over the endpoints' addresses: equal to the digest an agent
    /// reports for a sidecar holding the same host set.
    pub digest: u64,
    /// Endpoints with health HEALTHY or UNKNOWN.
    pub healthy: u32,
    /// The digests and address sets of this cluster's last [`PREVIOUS_SETS`]
    /// distinct non-empty endpoint sets before the current one, newest first.
    pub previous: Vec<(u64, Arc<[Box<str>]>)>,
}

/// One endpoint of a [`ViewCluster`] as kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    /// When the endpoint first appeared in this cluster's view (ms since the epoch).
    first_seen_ms: i64,
    /// Where its address ends in [`ViewCluster::addresses`].
    end: u32,
    /// Its EDS health status.
    health: HealthStatus,
}

/// One endpoint of a declared cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewEndpoint<'a> {
    /// `ip:port`, IPv6 as `[::1]:80`, a pipe as `unix://path` (as Envoy's
    /// `/clusters` writes them).
    pub address: &'a str,
    /// HEALTHY or UNKNOWN.
    pub healthy: bool,
    /// The EDS health status: `HEALTHY`, `UNHEALTHY`, `UNKNOWN`, `DRAINING`,
    /// `TIMEOUT`, `DEGRADED`.
    pub health: &'static str,
    /// When the endpoint first appeared in this cluster's view (ms since the epoch).
    pub first_seen_ms: i64,
}

impl ViewCluster {
    /// The cluster with these endpoints, following `old` (the same cluster in the
    /// previous view): an address keeps its first-seen time, and `old`'s set goes
    /// to the front of `previous` when the set changed.
    pub fn build(raw: &RawEndpoints, old: Option<&ViewCluster>, now_ms: i64) -> ViewCluster {
        let mut raw: Vec<(&str, HealthStatus)> = raw.iter().collect();
        // By address, the healthy entries of one address first, so the kept entry
        // of an address listed twice (two priorities) is a healthy one when any is.
        raw.sort_unstable_by(|a, b| {
            a.0.cmp(b.0)
                .then_with(|| decode::is_healthy(b.1).cmp(&decode::is_healthy(a.1)))
        });
        raw.dedup_by(|later, kept| later.0 == kept.0);
        let mut addresses = String::with_capacity(raw.iter().map(|r| r.0.len()).sum());
        let mut healthy = 0u32;
        let slots: Box<[Slot]> = raw
            .iter()
            .map(|&(address, health)| {
                healthy += u32::from(decode::is_healthy(health));
                addresses.push_str(address);
                Slot {
                    first_seen_ms: old
                        .and_then(|o| o.find(address))
                        .map_or(now_ms, |e| e.first_seen_ms),
                    end: u32::try_from(addresses.len())
                        .expect("a cluster's addresses are under 4 GiB"),
                    health,
                }
            })
            .collect();
        let digest = hosts_digest(raw.iter().map(|r| r.0));
        let previous = match old {
            None => Vec::new(),
            Some(o) if o.digest == digest && o.len() == slots.len() => o.previous.clone(),
            Some(o) => {
                let mut previous = Vec::with_capacity(PREVIOUS_SETS);
                if !o.is_empty() {
                    let set: Arc<[Box<str>]> = o.endpoints().map(|e| e.address.into()).collect();
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
            addresses: addresses.into_boxed_str(),
            slots,
            digest,
            healthy,
            previous,
        }
    }

    /// Endpoints held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The endpoint `i` (in the addresses' order).
    fn at(&self, i: usize) -> ViewEndpoint<'_> {
        let slot = self.slots[i];
        let start = i.checked_sub(1).map_or(0, |p| self.slots[p].end as usize);
        ViewEndpoint {
            address: &self.addresses[start..slot.end as usize],
            healthy: decode::is_healthy(slot.health),
            health: decode::health_text(slot.health),
            first_seen_ms: slot.first_seen_ms,
        }
    }

    /// The endpoints, sorted by address.
    pub fn endpoints(&self) -> impl ExactSizeIterator<Item = ViewEndpoint<'_>> + '_ {
        (0..self.slots.len()).map(|i| self.at(i))
    }

    /// The endpoint at `address`.
    pub fn find(&self, address: &str) -> Option<ViewEndpoint<'_>> {
        let (mut lo, mut hi) = (0, self.slots.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.at(mid).address.cmp(address) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(self.at(mid)),
            }
        }
        None
    }

    /// A cluster of these endpoints (address, healthy), each first seen at
    /// `first_seen_ms`, for tests.
    #[cfg(test)]
    pub(crate) fn of(endpoints: &[(&str, bool)], first_seen_ms: i64) -> ViewCluster {
        let mut raw = RawEndpoints::default();
        for (address, healthy) in endpoints {
            let health = if *healthy {
                HealthStatus::Healthy
            } else {
                HealthStatus::Unhealthy
            };
            raw.push(address, health);
        }
        ViewCluster::build(&raw, None, first_seen_ms)
    }
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
    /// holder (a view taken over from an earlier server address). A service named
    /// as its cluster shares the cluster's name.
    eds: Option<BTreeMap<Arc<str>, Arc<str>>>,
    /// Each listener's RDS names and inline route configurations.
    listeners: BTreeMap<String, ListenerDecl>,
    /// The route configurations received over RDS that a listener names.
    routes: BTreeSet<String>,
    /// Per type (by [`Kind::index`]), the version a Delta xDS server gave each
    /// resource held, by name (a cluster's or a service's shares the view's name);
    /// what the stream tells the server it has when it subscribes again.
    versions: [BTreeMap<Arc<str>, Box<str>>; 4],
}

impl Held {
    /// A holder starting from `seed` (the last view of the zone, if any).
    pub fn new(seed: Option<Arc<ZoneView>>) -> Held {
        Held {
            view: seed.unwrap_or_default(),
            eds: None,
            listeners: BTreeMap::new(),
            routes: BTreeSet::new(),
            versions: Default::default(),
        }
    }

    /// The service names EDS is asked for, sorted and distinct.
    pub fn eds_names(&self) -> Vec<String> {
        let names: BTreeSet<&str> = self
            .eds
            .iter()
            .flat_map(|m| m.values())
            .map(|s| &**s)
            .collect();
        names.into_iter().map(str::to_owned).collect()
    }

    /// `name` as a shared name: the view's cluster of that name's, else a new one.
    fn name(&self, name: &str) -> Arc<str> {
        self.view
            .clusters
            .get_key_value(name)
            .map_or_else(|| Arc::from(name), |(k, _)| k.clone())
    }

    /// The route configuration names RDS is asked for, sorted and distinct.
    pub fn rds_names(&self) -> Vec<String> {
        let names: BTreeSet<&String> = self.listeners.values().flat_map(|l| l.rds.iter()).collect();
        names.into_iter().cloned().collect()
    }

    /// The view after a state-of-the-world CDS response: every declared cluster,
    /// each EDS cluster with the endpoints held for its service, each inline
    /// cluster with its own; the clusters it does not list are removed.
    pub fn apply_clusters(
        &mut self,
        decls: Vec<ClusterDecl>,
        bounds: Bounds,
        now_ms: i64,
    ) -> Result<Arc<ZoneView>, String> {
        if decls.len() > bounds.max_clusters {
            return Err(decode::over_clusters(decls.len(), bounds.max_clusters));
        }
        let listed: HashSet<&str> = decls.iter().map(|d| d.name.as_str()).collect();
        let gone: Vec<String> = self
            .view
            .clusters
            .keys()
            .filter(|n| !listed.contains(&***n))
            .map(|n| n.to_string())
            .collect();
        self.change_clusters(decls, &gone, bounds, now_ms)
    }

    /// The view after clusters changed: `upserts` are declared (new, or changed),
    /// `removals` no longer are, every other cluster stays as it is. An EDS cluster
    /// keeps the endpoints held for its service; an inline cluster takes its own.
    pub fn change_clusters(
        &mut self,
        upserts: Vec<ClusterDecl>,
        removals: &[String],
        bounds: Bounds,
        now_ms: i64,
    ) -> Result<Arc<ZoneView>, String> {
        let old = &self.view;
        let old_eds = self.eds.as_ref();
        // For each service, its shared name and a cluster of the old view that holds
        // its endpoints.
        let mut by_service: HashMap<&str, (&Arc<str>, &str)> = HashMap::new();
        if let Some(m) = old_eds {
            for (cluster, service) in m {
                by_service
                    .entry(&**service)
                    .or_insert((service, &**cluster));
            }
        }
        let mut eds = old_eds.cloned().unwrap_or_default();
        let mut clusters = old.clusters.clone();
        let mut incomparable = old.incomparable.clone();
        for name in removals {
            clusters.remove(name.as_str());
            eds.remove(name.as_str());
            incomparable.remove(name);
        }
        for decl in upserts {
            let name = self.name(&decl.name);
            let old_cluster = old.clusters.get(&name);
            let comparable = matches!(decl.source, Source::Eds(_) | Source::Inline(_));
            let cluster = match decl.source {
                Source::Eds(service) => {
                    // The same cluster with the same service keeps its endpoints;
                    // a view taken over keeps them too until EDS answers.
                    let same =
                        old_eds.is_none_or(|m| m.get(&name).is_some_and(|s| **s == *service));
                    let known = by_service.get(service.as_str());
                    let held = if same { old_cluster } else { None }
                        .or_else(|| known.and_then(|(_, c)| old.clusters.get(*c)));
                    let service = if service == *name {
                        name.clone()
                    } else {
                        known.map_or_else(|| Arc::from(service), |(s, _)| Arc::clone(s))
                    };
                    eds.insert(name.clone(), service);
                    match held {
                        Some(h) if old_cluster.is_some_and(|o| Arc::ptr_eq(o, h)) => h.clone(),
                        Some(h) => Arc::new(ViewCluster::build(
                            &raw_of(h),
                            old_cluster.map(|c| &**c),
                            now_ms,
                        )),
                        None => Arc::new(ViewCluster::build(
                            &RawEndpoints::default(),
                            old_cluster.map(|c| &**c),
                            now_ms,
                        )),
                    }
                }
                Source::Inline(raw) | Source::Dns(raw) => {
                    eds.remove(&name);
                    Arc::new(ViewCluster::build(&raw, old_cluster.map(|c| &**c), now_ms))
                }
                Source::None => {
                    eds.remove(&name);
                    Arc::new(ViewCluster::build(
                        &RawEndpoints::default(),
                        old_cluster.map(|c| &**c),
                        now_ms,
                    ))
                }
            };
            if comparable {
                incomparable.remove(&*name);
            } else {
                incomparable.insert(name.to_string());
            }
            clusters.insert(name, cluster);
        }
        if clusters.len() > bounds.max_clusters {
            return Err(decode::over_clusters(clusters.len(), bounds.max_clusters));
        }
        let total: usize = clusters.values().map(|c| c.len()).sum();
        if total > bounds.max_endpoints {
            return Err(decode::over_endpoints(total, bounds.max_endpoints));
        }
        let mut removed = old.removed.clone();
        for name in old.clusters.keys() {
            if !clusters.contains_key(name) {
                removed.insert(name.to_string(), now_ms);
            }
        }
        removed.retain(|name, at| {
            !clusters.contains_key(name.as_str()) && now_ms - *at < REMOVED_KEPT_MS
        });
        trim_removed(&mut removed);
        let view = Arc::new(ZoneView {
            clusters,
            removed,
            incomparable,
            listeners: old.listeners,
            routes: old.routes,
        });
        self.eds = Some(eds);
        self.view = view.clone();
        Ok(view)
    }

    /// The view after a state-of-the-world EDS response: the clusters of each
    /// service it carries take its endpoints; the others keep theirs.
    pub fn apply_endpoints(
        &mut self,
        assignments: Vec<(String, RawEndpoints)>,
        bounds: Bounds,
        now_ms: i64,
    ) -> Result<Arc<ZoneView>, String> {
        self.change_endpoints(assignments, &[], bounds, now_ms)
    }

    /// The view after endpoints changed: the clusters of each service of
    /// `assignments` take its endpoints, those of each service of `removals` (gone
    /// from the server) are left with none; the others keep theirs.
    pub fn change_endpoints(
        &mut self,
        assignments: Vec<(String, RawEndpoints)>,
        removals: &[String],
        bounds: Bounds,
        now_ms: i64,
    ) -> Result<Arc<ZoneView>, String> {
        let Some(eds) = &self.eds else {
            // No CDS answer yet: nothing to place the endpoints in.
            return Ok(self.view.clone());
        };
        let mut by_service: HashMap<String, RawEndpoints> = assignments.into_iter().collect();
        for service in removals {
            by_service.entry(service.clone()).or_default();
        }
        let mut clusters_of: HashMap<&str, Vec<&Arc<str>>> = HashMap::new();
        for (cluster, service) in eds {
            clusters_of.entry(&**service).or_default().push(cluster);
        }
        let old = &self.view;
        let mut clusters = old.clusters.clone();
        for (service, names) in clusters_of {
            let Some(raw) = by_service.remove(service) else {
                continue;
            };
            for name in names {
                let old_cluster = old.clusters.get(name).map(|c| &**c);
                let built = ViewCluster::build(&raw, old_cluster, now_ms);
                clusters.insert(name.clone(), Arc::new(built));
            }
        }
        let total: usize = clusters.values().map(|c| c.len()).sum();
        if total > bounds.max_endpoints {
            return Err(decode::over_endpoints(total, bounds.max_endpoints));
        }
        let view = Arc::new(ZoneView {
            clusters,
            removed: old.removed.clone(),
            incomparable: old.incomparable.clone(),
            listeners: old.listeners,
            routes: old.routes,
        });
        self.view = view.clone();
        Ok(view)
    }

    /// The view after a state-of-the-world LDS response: its listeners; the route
    /// configurations no listener names any more are let go.
    pub fn apply_listeners(&mut self, decls: Vec<ListenerDecl>) -> Arc<ZoneView> {
        self.listeners = decls.into_iter().map(|l| (l.name.clone(), l)).collect();
        self.after_listeners()
    }

    /// The view after listeners changed: `upserts` declared, `removals` gone, at
    /// most `max_listeners` in all; the route configurations no listener names any
    /// more are let go.
    pub fn change_listeners(
        &mut self,
        upserts: Vec<ListenerDecl>,
        removals: &[String],
        max_listeners: usize,
    ) -> Result<Arc<ZoneView>, String> {
        let mut listeners = self.listeners.clone();
        for name in removals {
            listeners.remove(name);
        }
        for l in upserts {
            listeners.insert(l.name.clone(), l);
        }
        if listeners.len() > max_listeners {
            return Err(format!(
                "{} listeners, over the bound of {max_listeners}",
                listeners.len()
            ));
        }
        self.listeners = listeners;
        Ok(self.after_listeners())
    }

    /// Lets go of the route configurations no listener names; the recounted view.
    fn after_listeners(&mut self) -> Arc<ZoneView> {
        let wanted: BTreeSet<String> = self.rds_names().into_iter().collect();
        self.routes.retain(|r| wanted.contains(r));
        self.recount()
    }

    /// The view after a state-of-the-world RDS response: the named route
    /// configurations it carries are held.
    pub fn apply_routes(&mut self, names: Vec<String>) -> Arc<ZoneView> {
        self.change_routes(names, &[])
    }

    /// The view after route configurations changed: those of `names` a listener
    /// names are held, those of `removals` no longer are.
    pub fn change_routes(&mut self, names: Vec<String>, removals: &[String]) -> Arc<ZoneView> {
        for name in removals {
            self.routes.remove(name);
        }
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

    /// What the stream tells a Delta xDS server it has of `kind` when it subscribes
    /// anew (`initial_resource_versions`): each cluster and listener held, each
    /// service and route configuration of `subscribed`, with the version the server
    /// gave it, or "" when none is known (a view taken over from an earlier server,
    /// a name not received yet), so that the server sends it again or says it is
    /// gone.
    pub fn initial_versions(&self, kind: Kind, subscribed: &[String]) -> HashMap<String, String> {
        let versions = &self.versions[kind.index()];
        let held: Vec<&str> = match kind {
            Kind::Clusters => self.view.clusters.keys().map(|n| &**n).collect(),
            Kind::Listeners => self.listeners.keys().map(String::as_str).collect(),
            Kind::Endpoints | Kind::Routes => subscribed.iter().map(String::as_str).collect(),
        };
        held.into_iter()
            .map(|n| {
                let version = versions.get(n).map_or_else(String::new, |v| v.to_string());
                (n.to_owned(), version)
            })
            .collect()
    }

    /// Records the versions of the resources of an accepted delta response of
    /// `kind` and forgets those of the resources it removed.
    pub fn set_versions(
        &mut self,
        kind: Kind,
        received: Vec<(String, String)>,
        removed: &[String],
    ) {
        for name in removed {
            self.versions[kind.index()].remove(name.as_str());
        }
        for (name, version) in received {
            let version = version.into_boxed_str();
            match self.versions[kind.index()].get_mut(name.as_str()) {
                Some(v) => *v = version,
                None => {
                    let name = self.name(&name);
                    self.versions[kind.index()].insert(name, version);
                }
            }
        }
    }

    /// Forgets the versions of `names` (no longer subscribed to).
    pub fn forget_versions(&mut self, kind: Kind, names: &[String]) {
        let versions = &mut self.versions[kind.index()];
        for name in names {
            versions.remove(name.as_str());
        }
    }

    /// Forgets every version (the stream speaks state of the world).
    pub fn clear_versions(&mut self) {
        self.versions = Default::default();
    }
}

/// A view cluster's endpoints as raw entries, to build another cluster from them.
fn raw_of(cluster: &ViewCluster) -> RawEndpoints {
    let mut raw = RawEndpoints::with_capacity(cluster.len());
    for (i, e) in cluster.endpoints().enumerate() {
        raw.push(e.address, cluster.slots[i].health);
    }
    raw
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

    fn raw(addresses: &[(&str, HealthStatus)]) -> RawEndpoints {
        let mut raw = RawEndpoints::default();
        for (a, h) in addresses {
            raw.push(a, *h);
        }
        raw
    }

    const BOUNDS: Bounds = Bounds {
        max_clusters: 10,
        max_endpoints: 10,
    };

    #[test]
    fn a_cluster_is_sorted_distinct_and_remembers_its_earlier_sets() {
        use HealthStatus::*;
        let a = ViewCluster::build(
            &raw(&[
                ("10.0.0.2:80", Unhealthy),
                ("10.0.0.1:80", Healthy),
                ("10.0.0.2:80", Unknown),
            ]),
            None,
            5,
        );
        let addresses: Vec<&str> = a.endpoints().map(|e| e.address).collect();
        assert_eq!(addresses, ["10.0.0.1:80", "10.0.0.2:80"]);
        assert_eq!(a.healthy, 2);
        assert_eq!(a.endpoints().nth(1).unwrap().health, "UNKNOWN");
        assert_eq!(a.digest, hosts_digest(["10.0.0.2:80", "10.0.0.1:80"]));
        assert_eq!(a.find("10.0.0.2:80").map(|e| e.first_seen_ms), Some(5));
        assert_eq!(a.find("10.0.0.3:80"), None);
        let b = ViewCluster::build(&raw(&[("10.0.0.1:80", Draining)]), Some(&a), 9);
        let first = b.endpoints().next().unwrap();
        assert_eq!(first.first_seen_ms, 5);
        assert!(!first.healthy);
        assert_eq!(first.health, "DRAINING");
        assert_eq!(b.previous.len(), 1);
        assert_eq!(b.previous[0].0, a.digest);
        assert_eq!(
            &*b.previous[0].1,
            ["10.0.0.1:80".into(), "10.0.0.2:80".into()] as [Box<str>; 2]
        );
        // Back to the first set: it is current, not previous.
        let c = ViewCluster::build(
            &raw(&[("10.0.0.1:80", Healthy), ("10.0.0.2:80", Healthy)]),
            Some(&b),
            10,
        );
        assert_eq!(c.previous.len(), 1);
        assert_eq!(c.previous[0].0, b.digest);
        // Health alone changing keeps the history.
        let d = ViewCluster::build(
            &raw(&[("10.0.0.1:80", Unhealthy), ("10.0.0.2:80", Healthy)]),
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
        assert_eq!(v.clusters["a"].len(), 1);
        assert_eq!(v.endpoint_count(), 2);
        // CDS again: the EDS cluster keeps its endpoints.
        let v = held.apply_clusters(decls[..1].to_vec(), BOUNDS, 3).unwrap();
        assert_eq!(v.clusters["a"].len(), 1);
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
        assert_eq!(held.view.clusters["a"].len(), 1);
        // The cluster back: no longer removed.
        let v = held.apply_clusters(decls, BOUNDS, 5).unwrap();
        assert!(v.removed.is_empty());
    }

    #[test]
    fn a_delta_changes_only_what_it_names() {
        use HealthStatus::*;
        let mut held = Held::new(None);
        let eds = |name: &str, service: &str| ClusterDecl {
            name: name.into(),
            source: Source::Eds(service.into()),
        };
        held.change_clusters(vec![eds("a", "svc-a"), eds("b", "svc-b")], &[], BOUNDS, 1)
            .unwrap();
        held.change_endpoints(
            vec![
                ("svc-a".into(), raw(&[("10.0.0.1:80", Healthy)])),
                ("svc-b".into(), raw(&[("10.0.1.1:80", Healthy)])),
            ],
            &[],
            BOUNDS,
            2,
        )
        .unwrap();
        // One endpoint set changes: the other cluster is untouched.
        let before = held.view.clone();
        let v = held
            .change_endpoints(
                vec![(
                    "svc-a".into(),
                    raw(&[("10.0.0.1:80", Healthy), ("10.0.0.2:80", Healthy)]),
                )],
                &[],
                BOUNDS,
                3,
            )
            .unwrap();
        assert_eq!(v.clusters["a"].len(), 2);
        assert_eq!(v.clusters["a"].endpoints().next().unwrap().first_seen_ms, 2);
        assert_eq!(v.clusters["b"], before.clusters["b"]);
        // A cluster changed (same service) keeps its endpoints; one removed is
        // remembered; a DNS cluster is declared but not comparable.
        let dns = ClusterDecl {
            name: "d".into(),
            source: Source::Dns(raw(&[("ledger.example.com:443", Unknown)])),
        };
        let v = held
            .change_clusters(vec![eds("a", "svc-a"), dns], &["b".into()], BOUNDS, 4)
            .unwrap();
        assert_eq!(
            v.clusters.keys().map(|k| &**k).collect::<Vec<_>>(),
            ["a", "d"]
        );
        assert_eq!(v.clusters["a"].len(), 2);
        assert_eq!(v.removed.get("b"), Some(&4));
        assert!(v.comparable("a") && !v.comparable("d"));
        assert_eq!(held.eds_names(), ["svc-a"]);
        // A service gone from the server leaves its clusters without endpoints.
        let v = held
            .change_endpoints(Vec::new(), &["svc-a".into()], BOUNDS, 5)
            .unwrap();
        assert!(v.clusters["a"].is_empty());
        // Over a bound: refused, the view kept.
        let many: Vec<ClusterDecl> = (0..10).map(|i| eds(&format!("m{i}"), "svc")).collect();
        let err = held.change_clusters(many, &[], BOUNDS, 6).unwrap_err();
        assert!(err.contains("12 clusters"), "{err}");
        assert_eq!(held.view.clusters.len(), 2);
        // The DNS cluster declared as STATIC again is comparable again; removed, it
        // leaves no trace among the incomparable.
        let v = held
            .change_clusters(
                vec![ClusterDecl {
                    name: "d".into(),
                    source: Source::Inline(RawEndpoints::default()),
                }],
                &[],
                BOUNDS,
                7,
            )
            .unwrap();
        assert!(v.comparable("d"));
        let v = held
            .change_clusters(
                vec![ClusterDecl {
                    name: "d".into(),
                    source: Source::None,
                }],
                &[],
                BOUNDS,
                8,
            )
            .unwrap();
        assert!(!v.comparable("d"));
        let v = held
            .change_clusters(Vec::new(), &["d".into()], BOUNDS, 9)
            .unwrap();
        assert!(v.incomparable.is_empty());
    }

    #[test]
    fn versions_say_what_a_new_stream_holds() {
        let mut held = Held::new(None);
        held.change_clusters(
            vec![
                ClusterDecl {
                    name: "a".into(),
                    source: Source::Eds("svc".into()),
                },
                ClusterDecl {
                    name: "b".into(),
                    source: Source::None,
                },
            ],
            &[],
            BOUNDS,
            1,
        )
        .unwrap();
        held.set_versions(
            Kind::Clusters,
            vec![("a".into(), "v1".into()), ("b".into(), "v2".into())],
            &[],
        );
        held.set_versions(Kind::Clusters, Vec::new(), &["b".into()]);
        let initial = held.initial_versions(Kind::Clusters, &[]);
        assert_eq!(initial.get("a").map(String::as_str), Some("v1"));
        assert_eq!(initial.get("b").map(String::as_str), Some(""));
        held.set_versions(Kind::Endpoints, vec![("svc".into(), "e1".into())], &[]);
        let eds = held.initial_versions(Kind::Endpoints, &["svc".into(), "new".into()]);
        assert_eq!(eds.len(), 2);
        assert_eq!(eds["svc"], "e1");
        assert_eq!(eds["new"], "");
        held.forget_versions(Kind::Endpoints, &["svc".into()]);
        assert_eq!(
            held.initial_versions(Kind::Endpoints, &["svc".into()])["svc"],
            ""
        );
        held.clear_versions();
        assert_eq!(held.initial_versions(Kind::Clusters, &[])["a"], "");
    }

    #[test]
    fn listeners_and_routes_change_by_name() {
        let mut held = Held::new(None);
        let l = |name: &str, rds: &[&str]| ListenerDecl {
            name: name.into(),
            rds: rds.iter().map(|r| (*r).to_owned()).collect(),
            inline_routes: 0,
        };
        let v = held
            .change_listeners(vec![l("l1", &["r1"]), l("l2", &["r2"])], &[], 10)
            .unwrap();
        assert_eq!((v.listeners, v.routes), (2, 0));
        let v = held.change_routes(vec!["r1".into(), "r2".into()], &[]);
        assert_eq!(v.routes, 2);
        let v = held.change_routes(Vec::new(), &["r2".into()]);
        assert_eq!(v.routes, 1);
        let v = held
            .change_listeners(Vec::new(), &["l1".into()], 10)
            .unwrap();
        assert_eq!((v.listeners, v.routes), (1, 0));
        let err = held
            .change_listeners(vec![l("l3", &[]), l("l4", &[])], &[], 2)
            .unwrap_err();
        assert!(err.contains("3 listeners"), "{err}");
        assert_eq!(held.view.listeners, 1);
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
