//! The dependency graph (contract section 14): who calls whom, from what the
//! sidecars saw over the graph window, beside what the owners declared. Built from
//! the store's registrations and the instances' traffic once per [`WATCH_PERIOD`]
//! ([`snapshot`]): the build is kept as a shared snapshot that every `GET /graph`
//! reads until the next, and a watcher moves the catalog index and sends a `graph`
//! event when an edge appears, disappears, or changes `observed` or `declared` (not
//! when only its figures move). Each shared build also counts the traffic reported
//! since the last one on the edges it resolves: the edges' monotonic counters of the
//! ops port's `/metrics`.

pub mod snapshot;

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use meshcat_common::identity::TlsIdentity;
use meshcat_common::model::Status;
use serde::Serialize;

use crate::store::Store;
use crate::store::identity::{ClusterTls, compare};
use crate::store::traffic::{AddressMap, Micros, OTHER, Traffic};

/// The graph's bounds, from the command line.
#[derive(Debug, Clone, Copy)]
pub struct GraphConfig {
    /// `--max-edges-per-node`: most upstreams a cluster's calls keep apart, and
    /// most observed edges a build draws from one node; the rest is summed into
    /// its edge to `external:other`.
    pub max_edges_per_node: usize,
}

/// Default and largest `depth` of a focused graph.
pub const DEFAULT_DEPTH: u32 = 1;
pub const MAX_DEPTH: u32 = 5;

/// `GET /graph`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GraphView {
    /// The catalog index the graph was read at.
    pub index: u64,
    pub window_seconds: u64,
    /// `--error-ratio-warning`: an observed edge whose `errorRatio` is above it is
    /// failing, by the rule a cluster's status follows. The command line and the
    /// dashboard read it here rather than keep a threshold of their own.
    pub error_ratio_warning: f64,
    /// Sorted by id.
    pub nodes: Vec<Node>,
    /// Sorted by source, then target.
    pub edges: Vec<Edge>,
}

/// A cluster, or an upstream that is no cluster of the mesh (`external`).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// `<zone>/<cluster>`, or `<zone>/external:<upstream>`.
    pub id: String,
    /// `cluster` or `external`.
    pub kind: &'static str,
    pub zone_name: String,
    pub cluster_name: String,
    pub registered: bool,
    /// Null for an external node; `down` for a cluster known only from a declared
    /// dependency.
    pub status: Option<Status>,
    pub owner: String,
    /// Live instances.
    pub instances: u64,
    /// Whether the cluster's instances run different configurations.
    pub drifted: bool,
    /// The soonest expiry of its live instances' identity certificates (ms since
    /// the epoch), for `meshcat_certificate_expiry_timestamp_seconds`; not shown.
    #[serde(skip)]
    pub cert_expires_ms: Option<i64>,
    /// The worst identity state of its live instances, for `meshcat_cluster_identity`;
    /// not shown.
    #[serde(skip)]
    pub identity_state: meshcat_common::identity::CertState,
}

/// Calls from one node to another.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Edge {
    pub source: String,
    pub target: String,
    /// Requests within the window, summed over the source's instances.
    pub requests: u64,
    /// Requests per second over the window.
    pub rps: f64,
    /// 5xx answers and connect failures within the window.
    pub errors: u64,
    /// errors / requests (0 without requests).
    pub error_ratio: f64,
    /// The highest p50 and p99 of the source's instances over Envoy's last stats
    /// interval; null when unknown.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub tls: bool,
    /// Traffic within the window.
    pub observed: bool,
    /// The source's registration declares the target.
    pub declared: bool,
    /// When traffic was last seen (ms since the epoch); null when never within the
    /// window.
    pub last_seen_ms: Option<i64>,
    /// What the source's sidecars require of the target's certificates and what the
    /// target's instances present (contract section 19); absent when the source
    /// checks no SAN of the target or the target presents no certificate. An edge
    /// with `match: false` and no traffic is a predicted mTLS failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_identity: Option<TlsIdentity>,
}

/// What `GET /graph` asks for.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    pub zone: Option<String>,
    /// (cluster, depth); needs `zone`.
    pub focus: Option<(String, u32)>,
}

/// Why a graph cannot be answered.
#[derive(Debug, PartialEq, Eq)]
pub enum GraphError {
    /// The focused cluster is no node of the graph.
    UnknownCluster,
    /// The graph could not be built now (the failure is logged).
    Unavailable,
}

/// A cluster node's id, `<zone>/<cluster>`.
pub fn node_id(zone: &str, cluster: &str) -> String {
    format!("{zone}/{cluster}")
}

fn external_id(zone: &str, upstream: &str) -> String {
    format!("{zone}/external:{upstream}")
}

/// [`Link::last_seen_ms`] of a link without traffic in the window.
pub const NEVER: i64 = i64::MIN;

/// [`Link::tls_at`] of an edge without a `tlsIdentity`.
pub const NO_TLS: u32 = u32::MAX;

/// A node position that more than one cluster claims (a listener address two
/// clusters' sidecars both report): it resolves no edge.
const AMBIGUOUS: u32 = u32::MAX;

/// An edge as the graph keeps it: its ends as positions in the nodes, and the
/// figures `rps` and `errorRatio` are derived from when it is shown. A mesh has one
/// per edge in each snapshot: 80 bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    pub source: u32,
    pub target: u32,
    /// Requests and errors within the window.
    pub requests: u64,
    pub errors: u64,
    /// Requests and errors counted on the edge since this process started, the
    /// `meshcat_edge_*_total` counters: what the build claimed from the reports
    /// since the build before, to which the snapshot adds the previous snapshot's
    /// totals of the same edge ([`snapshot::Snapshot::count_from`]).
    pub requests_total: u64,
    pub errors_total: u64,
    /// The highest p50 and p99 of the source's instances.
    pub p50: Micros,
    pub p99: Micros,
    /// When traffic was last seen, ms since the epoch; [`NEVER`] when not within
    /// the window.
    pub last_seen_ms: i64,
    pub tls: bool,
    pub observed: bool,
    pub declared: bool,
    /// Its `tlsIdentity`, at this position of [`Built::tls`]; [`NO_TLS`] for none.
    pub tls_at: u32,
    /// The source's upstream cluster the edge was drawn from: the name the source's
    /// sidecars know the target by (its Envoy cluster), which is the target's
    /// clusterName when the edge was found by name and another when it was found
    /// through a listener address. Of several, the one that carried the most errors
    /// within the window, then the most requests. None for an edge only declared.
    pub via: Option<Arc<str>>,
}

#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Link>() <= 80);

impl Link {
    /// An edge from `source` to `target` with no figures, neither observed nor
    /// declared yet.
    pub(crate) fn new(source: u32, target: u32) -> Link {
        Link {
            source,
            target,
            requests: 0,
            errors: 0,
            requests_total: 0,
            errors_total: 0,
            p50: Micros::NONE,
            p99: Micros::NONE,
            last_seen_ms: NEVER,
            tls: false,
            observed: false,
            declared: false,
            tls_at: NO_TLS,
            via: None,
        }
    }

    /// Whether its `tlsIdentity` predicts a failed handshake.
    pub fn tls_mismatch(&self, graph: &Built) -> bool {
        graph.tls_identity(self).is_some_and(|t| !t.matches)
    }

    /// Adds another instance's share of the same edge, or its declaration (the
    /// figures and flags; which upstream the edge names is the build's choice).
    fn merge(&mut self, o: &Link) {
        // Claimed counters are agent-supplied differences: their sums saturate.
        self.requests = self.requests.saturating_add(o.requests);
        self.errors = self.errors.saturating_add(o.errors);
        self.requests_total = self.requests_total.saturating_add(o.requests_total);
        self.errors_total = self.errors_total.saturating_add(o.errors_total);
        self.p50 = self.p50.max(o.p50);
        self.p99 = self.p99.max(o.p99);
        self.last_seen_ms = self.last_seen_ms.max(o.last_seen_ms);
        self.tls |= o.tls;
        self.observed |= o.observed;
        self.declared |= o.declared;
    }
}

/// The whole graph: nodes sorted by id, links by (source, target).
#[derive(Debug, Clone, Default)]
pub struct Built {
    pub window_seconds: u64,
    /// The status rule's error-ratio threshold when the graph was built.
    pub error_ratio_warning: f64,
    pub nodes: Vec<Node>,
    pub links: Vec<Link>,
    /// The links' `tlsIdentity`, by [`Link::tls_at`]: only edges whose caller
    /// checks SANs have one.
    pub tls: Vec<TlsIdentity>,
}

/// One edge as `GET /graph` shows it, borrowed from a [`Built`] graph: the JSON of
/// [`Edge`].
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EdgeJson<'a> {
    source: &'a str,
    target: &'a str,
    requests: u64,
    rps: f64,
    errors: u64,
    error_ratio: f64,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    tls: bool,
    observed: bool,
    declared: bool,
    last_seen_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_identity: Option<&'a TlsIdentity>,
}

impl Built {
    /// A link's `tlsIdentity`, when it has one.
    pub fn tls_identity(&self, l: &Link) -> Option<&TlsIdentity> {
        self.tls.get(l.tls_at as usize)
    }

    /// The ids of a link's source and target.
    pub fn ends(&self, l: &Link) -> (&str, &str) {
        (
            self.nodes[l.source as usize].id.as_str(),
            self.nodes[l.target as usize].id.as_str(),
        )
    }

    /// Link `i` as shown.
    pub fn edge_json(&self, i: usize) -> EdgeJson<'_> {
        let l = &self.links[i];
        EdgeJson {
            source: &self.nodes[l.source as usize].id,
            target: &self.nodes[l.target as usize].id,
            requests: l.requests,
            rps: l.requests as f64 / (self.window_seconds as f64).max(f64::MIN_POSITIVE),
            errors: l.errors,
            error_ratio: if l.requests == 0 {
                0.0
            } else {
                (l.errors as f64 / l.requests as f64).min(1.0)
            },
            p50_ms: l.p50.ms(),
            p99_ms: l.p99.ms(),
            tls: l.tls,
            observed: l.observed,
            declared: l.declared,
            last_seen_ms: (l.last_seen_ms != NEVER).then_some(l.last_seen_ms),
            tls_identity: self.tls_identity(l),
        }
    }

    /// Link `i` as an owned [`Edge`].
    pub fn edge(&self, i: usize) -> Edge {
        let e = self.edge_json(i);
        Edge {
            source: e.source.to_owned(),
            target: e.target.to_owned(),
            requests: e.requests,
            rps: e.rps,
            errors: e.errors,
            error_ratio: e.error_ratio,
            p50_ms: e.p50_ms,
            p99_ms: e.p99_ms,
            tls: e.tls,
            observed: e.observed,
            declared: e.declared,
            last_seen_ms: e.last_seen_ms,
            tls_identity: e.tls_identity.cloned(),
        }
    }
}

/// Whether a build takes the traffic reported since the last build that took it
/// into its edges' counters (`requests_total`, `errors_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counters {
    /// For the build that becomes the shared snapshot: what it takes is counted
    /// once, on the edges it resolves.
    Claim,
    /// For a build that is thrown away after one use (a test's oracle): it leaves
    /// the counts to the next shared build, its counters are 0.
    Leave,
}

/// Names to node positions; foldhash rather than SipHash: the graph looks up every
/// upstream of every instance once a second.
type Positions = foldhash::HashMap<String, u32>;

/// Positions of a graph's nodes in the making, found by zone then name without
/// building their ids.
#[derive(Debug, Default)]
struct ByZone(foldhash::HashMap<String, Positions>);

impl ByZone {
    fn get(&self, zone: &str, name: &str) -> Option<u32> {
        self.0.get(zone)?.get(name).copied()
    }

    /// The nodes of `zone`, by name.
    fn zone(&self, zone: &str) -> Option<&Positions> {
        self.0.get(zone)
    }

    /// The position of (zone, name), or of `node()` added to `all` when missing.
    fn get_or_push(
        &mut self,
        all: &mut Vec<Node>,
        zone: &str,
        name: &str,
        node: impl FnOnce() -> Node,
    ) -> u32 {
        if let Some(at) = self.get(zone, name) {
            return at;
        }
        let at = all.len() as u32;
        all.push(node());
        self.0
            .entry(zone.to_owned())
            .or_default()
            .insert(name.to_owned(), at);
        at
    }
}

/// The links of a graph in the making, found by their ends.
struct Links {
    links: Vec<Link>,
    /// (source, target) to position in `links`.
    found: foldhash::HashMap<(u32, u32), usize>,
    /// The errors and requests of the upstream each link names (`via`), by position.
    via_figures: Vec<(u64, u64)>,
    /// The observed callees of each cluster node so far (`--max-edges-per-node`),
    /// by node position.
    callees: Vec<u32>,
}

impl Links {
    /// Room for `links` links from the first `sources` nodes.
    fn with_capacity(links: usize, sources: usize) -> Self {
        Links {
            links: Vec::with_capacity(links),
            found: foldhash::HashMap::with_capacity_and_hasher(links, Default::default()),
            via_figures: Vec::with_capacity(links),
            callees: vec![0; sources],
        }
    }

    fn has(&self, source: u32, target: u32) -> bool {
        self.found.contains_key(&(source, target))
    }

    /// Adds `l`, or merges it into the link of the same ends.
    fn add(&mut self, l: Link) {
        match self.found.entry((l.source, l.target)) {
            std::collections::hash_map::Entry::Occupied(at) => {
                let (at, figures) = (*at.get(), (l.errors, l.requests));
                let kept = &mut self.links[at];
                if let Some(name) = &l.via {
                    // The busier upstream; of two alike, the first name (a build's
                    // order of calls is no order).
                    let busier = kept.via.as_ref().is_none_or(|k| {
                        (figures, std::cmp::Reverse(&**name))
                            > (self.via_figures[at], std::cmp::Reverse(&**k))
                    });
                    if busier {
                        kept.via = Some(name.clone());
                        self.via_figures[at] = figures;
                    }
                }
                kept.merge(&l);
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(self.links.len());
                self.via_figures.push((l.errors, l.requests));
                self.links.push(l);
            }
        }
    }
}

/// The node of an upstream that is no cluster of the mesh.
fn external_node(zone: &str, upstream: &str) -> Node {
    Node {
        id: external_id(zone, upstream),
        kind: "external",
        zone_name: zone.to_owned(),
        cluster_name: upstream.to_owned(),
        registered: false,
        status: None,
        owner: String::new(),
        instances: 0,
        drifted: false,
        cert_expires_ms: None,
        identity_state: meshcat_common::identity::CertState::None,
    }
}

/// The node of a cluster known only from a declared dependency.
fn declared_node(zone: &str, cluster: &str) -> Node {
    Node {
        id: node_id(zone, cluster),
        kind: "cluster",
        zone_name: zone.to_owned(),
        cluster_name: cluster.to_owned(),
        registered: false,
        status: Some(Status::Down),
        owner: String::new(),
        instances: 0,
        drifted: false,
        cert_expires_ms: None,
        identity_state: meshcat_common::identity::CertState::None,
    }
}

/// The whole graph at `now`. Nodes and links are found by position: a mesh's graph
/// is built from every upstream of every live instance (hundreds of thousands on a
/// big mesh), once a second, so no id is built or compared per upstream.
pub fn build(store: &Store, traffic: &Traffic, now: Instant, counters: Counters) -> Built {
    let window = traffic.window();
    let facts = store.cluster_facts();
    let mut all: Vec<Node> = Vec::with_capacity(facts.len());
    let mut clusters = ByZone::default();
    let mut externals = ByZone::default();
    // What each cluster node presents and expects of TLS peers, by position (the
    // facts' nodes come first, in their order).
    let mut tls_of: Vec<Option<Arc<ClusterTls>>> = Vec::with_capacity(facts.len());
    for f in &facts {
        tls_of.push(f.tls.clone());
        clusters.get_or_push(&mut all, &f.zone, &f.cluster, || Node {
            id: node_id(&f.zone, &f.cluster),
            kind: "cluster",
            zone_name: f.zone.clone(),
            cluster_name: f.cluster.clone(),
            registered: f.registered,
            status: Some(f.status),
            owner: f.owner.clone(),
            instances: f.instances,
            drifted: f.drifted,
            cert_expires_ms: f.cert_expires_ms,
            identity_state: f.identity_state,
        });
    }
    // One view for every walk: a peer's summary replaced meanwhile shows in the
    // next build, whole.
    let calls = traffic.view();
    // Who listens where (by address key: upstream hosts are kept hashed), and
    // whether another sidecar sends traffic there.
    let mut listening: AddressMap<(u32, bool)> = AddressMap::default();
    calls.each(|zone, cluster, c| {
        if let Some(at) = clusters.get(zone, cluster) {
            for (key, _) in c.listeners() {
                // Claimed by two clusters, an address is neither's: it is no
                // sidecar's to draw another's callers to.
                listening
                    .entry(key)
                    .and_modify(|(owner, _)| {
                        if *owner != at {
                            *owner = AMBIGUOUS;
                        }
                    })
                    .or_insert((at, false));
            }
        }
    });
    calls.each(|_, _, c| {
        for u in c.upstreams() {
            for h in u.hosts() {
                if let Some((_, called)) = listening.get_mut(&h) {
                    *called = true;
                }
            }
        }
    });
    let epoch_now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    // Sized once: a mesh's links are hundreds of thousands, and a vector grown by
    // doubling would hold up to twice as many while the build runs.
    let mut upstreams = 0;
    calls.each(|_, _, c| upstreams += c.upstreams().len() + usize::from(c.other().is_some()));
    let declared: usize = facts.iter().map(|f| f.dependencies.len()).sum();
    let mut links = Links::with_capacity(upstreams + declared, all.len());
    let link = |source: u32, target: u32, observed: bool| Link {
        observed,
        declared: !observed,
        ..Link::new(source, target)
    };
    let now_bucket = traffic.bucket(now);
    let max_edges = traffic.max_edges_per_node();
    calls.each(|zone, cluster, c| {
        // The calls of a cluster no longer known (its last instance expired while the
        // graph was built) draw no edge.
        let Some(same_zone) = clusters.zone(zone) else {
            return;
        };
        let Some(source) = same_zone.get(cluster).copied() else {
            return;
        };
        // The sidecars' own cluster: named by their targets, or by the routes of a
        // listener other sidecars send traffic to (an inbound listener). A few
        // names: a list compares them fastest.
        let mut local: Vec<&str> = c.local_clusters().collect();
        for (key, l) in c.listeners() {
            if listening.get(&key).is_some_and(|(_, called)| *called) {
                for name in &l.clusters {
                    if !local.contains(&name.as_str()) {
                        local.push(name);
                    }
                }
            }
        }
        // The upstreams the cluster's calls keep apart, then those they sum as
        // `other` (past `--max-edges-per-node`).
        let summed = c.other().map(|u| (u, true));
        for (u, summed) in c.upstreams().iter().map(|u| (u, false)).chain(summed) {
            let name = u.name();
            // Claimed whatever becomes of it: the sidecar's own cluster is no edge,
            // and what it counted now is not counted later on one.
            let claimed = match counters {
                Counters::Claim => u.claim(),
                Counters::Leave => (0, 0),
            };
            if !summed && local.contains(&name) {
                continue;
            }
            let w = traffic.window_of(u, now);
            if w.requests == 0 && w.errors == 0 {
                continue;
            }
            let known = if summed {
                None
            } else {
                same_zone
                    .get(name)
                    .copied()
                    .or_else(|| {
                        u.hosts().find_map(|h| {
                            listening
                                .get(&h)
                                .map(|(at, _)| *at)
                                .filter(|at| *at != AMBIGUOUS)
                        })
                    })
                    .or_else(|| externals.get(zone, name))
            };
            // A callee past the source's `--max-edges-per-node` others is summed
            // into its `external:other` edge.
            let new = known.is_none_or(|t| !links.has(source, t));
            let full = new && links.callees[source as usize] as usize >= max_edges;
            let target = if summed || full {
                externals.get_or_push(&mut all, zone, OTHER, || external_node(zone, OTHER))
            } else {
                if new {
                    links.callees[source as usize] += 1;
                }
                known.unwrap_or_else(|| {
                    externals.get_or_push(&mut all, zone, name, || external_node(zone, name))
                })
            };
            let mut l = link(source, target, true);
            l.requests = w.requests;
            l.errors = w.errors;
            (l.requests_total, l.errors_total) = claimed;
            (l.p50, l.p99) = u.latency_micros(now_bucket);
            l.tls = u.tls(now_bucket);
            l.via = Some(u.shared_name().clone());
            l.last_seen_ms = w.last_seen.map_or(NEVER, |at| {
                epoch_now - now.saturating_duration_since(at).as_millis() as i64
            });
            links.add(l);
        }
    });
    for f in &facts {
        let source = clusters
            .get(&f.zone, &f.cluster)
            .expect("every cluster of the facts is a node");
        for (z, c) in &f.dependencies {
            let target = clusters.get_or_push(&mut all, z, c, || declared_node(z, c));
            links.add(link(source, target, false));
        }
    }
    let tls = compare_identities(&mut links, &mut all, &clusters, &tls_of);
    // The lookups go before the sorting, which allocates again.
    let Links {
        mut links,
        found,
        via_figures,
        callees,
    } = links;
    drop((found, via_figures, callees));
    // Nodes sorted by id, links by (source, target): then by their ends' positions.
    let mut order: Vec<u32> = (0..all.len() as u32).collect();
    order.sort_unstable_by(|a, b| all[*a as usize].id.cmp(&all[*b as usize].id));
    let mut position = vec![0u32; order.len()];
    for (new, old) in order.iter().enumerate() {
        position[*old as usize] = new as u32;
    }
    let mut all: Vec<Option<Node>> = all.into_iter().map(Some).collect();
    let nodes: Vec<Node> = order
        .iter()
        .map(|old| all[*old as usize].take().expect("each node once"))
        .collect();
    for l in &mut links {
        l.source = position[l.source as usize];
        l.target = position[l.target as usize];
    }
    links.sort_unstable_by_key(|l| (l.source, l.target));
    links.shrink_to_fit();
    Built {
        window_seconds: window.as_secs(),
        error_ratio_warning: store.rules().error_ratio_warning,
        nodes,
        links,
        tls,
    }
}

/// Gives each link whose source checks SANs of its target a `tlsIdentity`, and adds
/// an edge (neither observed nor declared) for each upstream cluster whose SAN
/// matchers the cluster it names does not satisfy: a predicted mTLS failure before
/// any request was sent (contract section 19). An upstream names a cluster of the
/// source's zone by its name, or by the service a mesh-specific name stands for
/// (Istio's `outbound|port||host`, Consul's `.consul` names). Sources with the same
/// expectations (every sidecar of a mesh without configuration scoping) are
/// compared once.
fn compare_identities(
    links: &mut Links,
    all: &mut [Node],
    clusters: &ByZone,
    tls_of: &[Option<Arc<ClusterTls>>],
) -> Vec<TlsIdentity> {
    let mut found: Vec<TlsIdentity> = Vec::new();
    let tls_at = |p: u32| tls_of.get(p as usize).and_then(Option::as_ref);
    for i in 0..links.links.len() {
        let l = &links.links[i];
        let (Some(source), Some(target)) = (tls_at(l.source), tls_at(l.target)) else {
            continue;
        };
        let upstream = l
            .via
            .as_deref()
            .unwrap_or(all[l.target as usize].cluster_name.as_str());
        let expected = source.expected_of(upstream);
        if let Some(t) = compare(&expected, target) {
            links.links[i].tls_at = found.len() as u32;
            found.push(t);
        }
    }
    // Sources grouped by zone and expectations: each group's upstreams resolved once.
    let mut groups: HashMap<(&str, Vec<usize>), Vec<u32>> = HashMap::new();
    for (at, tls) in tls_of.iter().enumerate() {
        let Some(tls) = tls.as_ref().filter(|t| !t.expectations.is_empty()) else {
            continue;
        };
        let key: Vec<usize> = tls
            .expectations
            .iter()
            .map(|e| Arc::as_ptr(e) as usize)
            .collect();
        groups
            .entry((all[at].zone_name.as_str(), key))
            .or_default()
            .push(at as u32);
    }
    let mut predicted: Vec<(u32, u32, TlsIdentity)> = Vec::new();
    for ((zone, _), sources) in &groups {
        let Some(tls) = tls_at(sources[0]) else {
            continue;
        };
        let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for set in &tls.expectations {
            for (upstream, _) in set.iter() {
                if !seen.insert(upstream) {
                    continue;
                }
                let service = meshcat_common::mesh_names::service_of(upstream);
                let Some(target) = clusters
                    .get(zone, upstream)
                    .or_else(|| clusters.get(zone, service))
                else {
                    continue;
                };
                let Some(target_tls) = tls_at(target) else {
                    continue;
                };
                if let Some(t) = compare(&tls.expected_of(upstream), target_tls)
                    && !t.matches
                {
                    for &source in sources {
                        if source != target && !links.has(source, target) {
                            predicted.push((source, target, t.clone()));
                        }
                    }
                }
            }
        }
    }
    predicted.sort_by_key(|(s, t, _)| (*s, *t));
    predicted.dedup_by_key(|(s, t, _)| (*s, *t));
    for (source, target, t) in predicted {
        let mut l = Link::new(source, target);
        l.tls = true;
        l.tls_at = found.len() as u32;
        found.push(t);
        links.add(l);
    }
    found
}

/// The graph as `scope` asks for it, built afresh: the oracle the snapshot's views
/// are checked against.
#[cfg(test)]
pub fn view(
    store: &Store,
    traffic: &Traffic,
    scope: &Scope,
    now: Instant,
) -> Result<GraphView, GraphError> {
    let index = store.index();
    let built = build(store, traffic, now, Counters::Leave);
    let mut nodes = built.nodes.clone();
    let mut edges: Vec<Edge> = (0..built.links.len()).map(|i| built.edge(i)).collect();
    if let Some(zone) = &scope.zone {
        edges
            .retain(|e| zone_of(&e.source) == zone.as_str() || zone_of(&e.target) == zone.as_str());
        let ends: std::collections::BTreeSet<&str> = edges
            .iter()
            .flat_map(|e| [e.source.as_str(), e.target.as_str()])
            .collect();
        let ends: std::collections::BTreeSet<String> =
            ends.into_iter().map(str::to_owned).collect();
        nodes.retain(|n| n.zone_name == *zone || ends.contains(&n.id));
    }
    if let (Some(zone), Some((cluster, depth))) = (&scope.zone, &scope.focus) {
        let start = node_id(zone, cluster);
        if !nodes.iter().any(|n| n.id == start && n.kind == "cluster") {
            return Err(GraphError::UnknownCluster);
        }
        let mut near: HashMap<&str, Vec<&str>> = HashMap::new();
        for e in &edges {
            near.entry(&e.source).or_default().push(&e.target);
            near.entry(&e.target).or_default().push(&e.source);
        }
        let mut seen: BTreeMap<String, u32> = BTreeMap::from([(start.clone(), 0)]);
        let mut queue = std::collections::VecDeque::from([(start.as_str(), 0u32)]);
        while let Some((id, d)) = queue.pop_front() {
            if d == *depth {
                continue;
            }
            for next in near.get(id).into_iter().flatten() {
                if !seen.contains_key(*next) {
                    seen.insert((*next).to_owned(), d + 1);
                    queue.push_back((next, d + 1));
                }
            }
        }
        nodes.retain(|n| seen.contains_key(&n.id));
        edges.retain(|e| seen.contains_key(&e.source) && seen.contains_key(&e.target));
    }
    Ok(GraphView {
        index,
        window_seconds: traffic.window().as_secs(),
        error_ratio_warning: store.rules().error_ratio_warning,
        nodes,
        edges,
    })
}

fn zone_of(id: &str) -> &str {
    id.split_once('/').map_or(id, |(z, _)| z)
}

/// Watches the graph's shape per zone: the edges with their `observed` and
/// `declared` flags and whether their `tlsIdentity` predicts a failure; and the
/// edges that do.
#[derive(Debug, Default)]
pub struct Watcher {
    shapes: HashMap<String, u64>,
    /// The edges (source id, target id) whose `tlsIdentity` did not match at the
    /// last look.
    mismatched: std::collections::BTreeSet<(String, String)>,
}

impl Watcher {
    /// The zones whose shape changed since the last call (at the first call, every
    /// zone with edges), given the graph's edges now.
    pub fn changed(&mut self, graph: &Built) -> Vec<String> {
        let mut by_zone: BTreeMap<&str, std::collections::hash_map::DefaultHasher> =
            BTreeMap::new();
        for l in &graph.links {
            let (s, t) = (
                &graph.nodes[l.source as usize],
                &graph.nodes[l.target as usize],
            );
            for zone in [zone_of(&s.id), zone_of(&t.id)] {
                let h = by_zone.entry(zone).or_default();
                (&s.id, &t.id, l.observed, l.declared, l.tls_mismatch(graph)).hash(h);
            }
        }
        let shapes: HashMap<String, u64> = by_zone
            .into_iter()
            .map(|(z, h)| (z.to_owned(), h.finish()))
            .collect();
        let mut changed: Vec<String> = shapes
            .iter()
            .filter(|(z, s)| self.shapes.get(*z) != Some(s))
            .map(|(z, _)| z.clone())
            .chain(
                self.shapes
                    .keys()
                    .filter(|z| !shapes.contains_key(*z))
                    .cloned(),
            )
            .collect();
        changed.sort();
        changed.dedup();
        self.shapes = shapes;
        changed
    }
}

impl Watcher {
    /// The history entries of the edges whose `tlsIdentity` started predicting a
    /// failed handshake since the last call (`tls-mismatch`), or matches again
    /// (`tls-match`). An edge that left the graph is forgotten without an entry.
    pub fn tls_changes(&mut self, graph: &Built) -> Vec<crate::history::Pending> {
        use crate::history::{Detail, Kind, Pending};
        let mut now = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        for l in &graph.links {
            let Some(t) = graph.tls_identity(l) else {
                continue;
            };
            let (s, target) = (
                &graph.nodes[l.source as usize],
                &graph.nodes[l.target as usize],
            );
            let key = (s.id.clone(), target.id.clone());
            let was = self.mismatched.contains(&key);
            let kind = match (was, t.matches) {
                (false, false) => Some(Kind::TlsMismatch),
                (true, true) => Some(Kind::TlsMatch),
                _ => None,
            };
            if let Some(kind) = kind {
                out.push(Pending::new(
                    kind,
                    &s.zone_name,
                    &s.cluster_name,
                    "",
                    Detail::Tls {
                        target: target.id.clone(),
                        expected_sans: t.expected_sans.clone(),
                        presented_sans: t.presented_sans.clone(),
                    },
                ));
            }
            if !t.matches {
                now.insert(key);
            }
        }
        self.mismatched = now;
        out
    }
}

/// How often the watcher looks.
pub const WATCH_PERIOD: Duration = Duration::from_secs(1);
