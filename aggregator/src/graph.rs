//! The dependency graph (contract section 14): who calls whom, from what the
//! sidecars saw over the graph window, beside what the owners declared. Built on
//! demand from the store's registrations and the instances' traffic; a watcher on
//! the expiry tick moves the catalog index and sends a `graph` event when an edge
//! appears, disappears, or changes `observed` or `declared` (not when only its
//! figures move).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use meshcat_common::model::Status;
use serde::Serialize;

use crate::store::Store;

/// Default and largest `depth` of a focused graph.
pub const DEFAULT_DEPTH: u32 = 1;
pub const MAX_DEPTH: u32 = 5;

/// `GET /graph`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GraphView {
    /// The catalog index the graph was read at.
    pub index: u64,
    pub window_seconds: u64,
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
}

/// A cluster node's id, `<zone>/<cluster>`.
pub fn node_id(zone: &str, cluster: &str) -> String {
    format!("{zone}/{cluster}")
}

fn external_id(zone: &str, upstream: &str) -> String {
    format!("{zone}/external:{upstream}")
}

/// The whole graph at `now`.
pub fn build(store: &Store, now: Instant) -> (Vec<Node>, Vec<Edge>) {
    let window = store.graph_window();
    let facts = store.cluster_facts();
    let mut nodes: BTreeMap<String, Node> = facts
        .iter()
        .map(|f| {
            let id = node_id(&f.zone, &f.cluster);
            (
                id.clone(),
                Node {
                    id,
                    kind: "cluster",
                    zone_name: f.zone.clone(),
                    cluster_name: f.cluster.clone(),
                    registered: f.registered,
                    status: Some(f.status),
                    owner: f.owner.clone(),
                    instances: f.instances,
                    drifted: false,
                },
            )
        })
        .collect();
    // Who listens where, and which addresses other sidecars send traffic to.
    let mut listening: HashMap<String, (String, String)> = HashMap::new();
    let mut called: BTreeSet<String> = BTreeSet::new();
    store.each_traffic(|(zone, cluster, _), t| {
        for l in &t.listeners {
            listening.insert(l.address.clone(), (zone.clone(), cluster.clone()));
        }
        for u in t.upstreams.values() {
            called.extend(u.hosts.iter().cloned());
        }
    });
    let epoch_now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let mut edges: BTreeMap<(String, String), Edge> = BTreeMap::new();
    store.each_traffic(|(zone, cluster, _), t| {
        // The sidecar's own cluster: named by the target, or by the routes of a
        // listener other sidecars send traffic to (its inbound listener).
        let mut local: BTreeSet<&str> = t.local_cluster.iter().map(String::as_str).collect();
        for l in t.listeners.iter().filter(|l| called.contains(&l.address)) {
            local.extend(l.clusters.iter().map(String::as_str));
        }
        let source = node_id(zone, cluster);
        for (name, u) in &t.upstreams {
            if local.contains(name.as_str()) {
                continue;
            }
            let w = u.window(now, window);
            if w.requests + w.errors == 0 {
                continue;
            }
            let target = if nodes.contains_key(&node_id(zone, name))
                && nodes[&node_id(zone, name)].kind == "cluster"
            {
                node_id(zone, name)
            } else if let Some((z, c)) = u.hosts.iter().find_map(|h| listening.get(h)) {
                node_id(z, c)
            } else {
                let id = external_id(zone, name);
                nodes.entry(id.clone()).or_insert_with(|| Node {
                    id,
                    kind: "external",
                    zone_name: zone.clone(),
                    cluster_name: name.clone(),
                    registered: false,
                    status: None,
                    owner: String::new(),
                    instances: 0,
                    drifted: false,
                });
                external_id(zone, name)
            };
            let e = edges
                .entry((source.clone(), target.clone()))
                .or_insert_with(|| Edge {
                    source: source.clone(),
                    target,
                    requests: 0,
                    rps: 0.0,
                    errors: 0,
                    error_ratio: 0.0,
                    p50_ms: None,
                    p99_ms: None,
                    tls: false,
                    observed: true,
                    declared: false,
                    last_seen_ms: None,
                });
            e.requests += w.requests;
            e.errors += w.errors;
            e.p50_ms = max_opt(e.p50_ms, u.p50_ms);
            e.p99_ms = max_opt(e.p99_ms, u.p99_ms);
            e.tls |= u.tls;
            if let Some(at) = w.last_seen {
                let ms = epoch_now - now.saturating_duration_since(at).as_millis() as i64;
                e.last_seen_ms = Some(e.last_seen_ms.map_or(ms, |m| m.max(ms)));
            }
        }
    });
    for f in &facts {
        let source = node_id(&f.zone, &f.cluster);
        for (z, c) in &f.dependencies {
            let target = node_id(z, c);
            nodes.entry(target.clone()).or_insert_with(|| Node {
                id: target.clone(),
                kind: "cluster",
                zone_name: z.clone(),
                cluster_name: c.clone(),
                registered: false,
                status: Some(Status::Down),
                owner: String::new(),
                instances: 0,
                drifted: false,
            });
            edges
                .entry((source.clone(), target.clone()))
                .or_insert_with(|| Edge {
                    source: source.clone(),
                    target,
                    requests: 0,
                    rps: 0.0,
                    errors: 0,
                    error_ratio: 0.0,
                    p50_ms: None,
                    p99_ms: None,
                    tls: false,
                    observed: false,
                    declared: false,
                    last_seen_ms: None,
                })
                .declared = true;
        }
    }
    let secs = window.as_secs_f64().max(f64::MIN_POSITIVE);
    let edges = edges
        .into_values()
        .map(|mut e| {
            e.rps = e.requests as f64 / secs;
            e.error_ratio = if e.requests == 0 {
                0.0
            } else {
                (e.errors as f64 / e.requests as f64).min(1.0)
            };
            e
        })
        .collect();
    (nodes.into_values().collect(), edges)
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// The graph as `scope` asks for it.
pub fn view(store: &Store, scope: &Scope, now: Instant) -> Result<GraphView, GraphError> {
    let index = store.index();
    let (mut nodes, mut edges) = build(store, now);
    if let Some(zone) = &scope.zone {
        edges
            .retain(|e| zone_of(&e.source) == zone.as_str() || zone_of(&e.target) == zone.as_str());
        let ends: BTreeSet<&str> = edges
            .iter()
            .flat_map(|e| [e.source.as_str(), e.target.as_str()])
            .collect();
        let ends: BTreeSet<String> = ends.into_iter().map(str::to_owned).collect();
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
        let mut queue = VecDeque::from([(start.as_str(), 0u32)]);
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
        window_seconds: store.graph_window().as_secs(),
        nodes,
        edges,
    })
}

fn zone_of(id: &str) -> &str {
    id.split_once('/').map_or(id, |(z, _)| z)
}

/// Watches the graph's shape per zone: the edges with their `observed` and
/// `declared` flags.
#[derive(Debug, Default)]
pub struct Watcher {
    shapes: HashMap<String, u64>,
}

impl Watcher {
    /// The zones whose shape changed since the last call (at the first call, every
    /// zone with edges).
    pub fn changed(&mut self, store: &Store, now: Instant) -> Vec<String> {
        let (_, edges) = build(store, now);
        let mut by_zone: BTreeMap<&str, std::collections::hash_map::DefaultHasher> =
            BTreeMap::new();
        for e in &edges {
            for zone in [zone_of(&e.source), zone_of(&e.target)] {
                let h = by_zone.entry(zone).or_default();
                (&e.source, &e.target, e.observed, e.declared).hash(h);
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

/// How often the watcher looks.
pub const WATCH_PERIOD: Duration = Duration::from_secs(1);
