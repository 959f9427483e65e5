//! The graph as last built, shared by every `GET /graph` until the next build, with
//! its unfocused answers (whole, or one zone) rendered once per encoding.
//!
//! A build walks every upstream of every live instance (hundreds of thousands on a
//! big mesh), so the watcher ([`watch`]) looks every [`WATCH_PERIOD`] and rebuilds
//! only when the graph may differ or is wanted: when the traffic changed in a way
//! that could change its shape ([`Traffic::shape`]), when the window moved on
//! by a bucket while any calls are held (an edge may have aged out; figures change
//! with time only then),
//! when the catalog index moved, or when a request read the graph since the last
//! build (a steady reader sees figures about one period old). A request never reads
//! a snapshot older than [`MAX_AGE`] or of another catalog index: it builds one (one
//! build at a time; the requests that want it meanwhile wait for it). Answers read
//! from one snapshot are rendered for the next by the watcher, before a request
//! asks for them, so a reader that polls the graph does not pay for its
//! serialization.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::watch;

use super::{
    Built, Counters, EdgeJson, GraphError, GraphView, Node, Scope, WATCH_PERIOD, Watcher, build,
};
use crate::store::Store;
use crate::store::traffic::Traffic;

/// Most rendered answers kept per snapshot: the whole graph and zones, in two
/// encodings. Answers past it are rendered for each request.
const MAX_BODIES: usize = 64;

/// Oldest snapshot a request reads; an older one is built again first. Longer than
/// [`WATCH_PERIOD`], so that a reader the watcher keeps up with never waits.
pub const MAX_AGE: Duration = Duration::from_secs(2);

/// Which unfocused answer a rendered body is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct BodyKey {
    zone: Option<String>,
    gzip: bool,
}

/// A rendered answer, and whether a request read it (answers read from one
/// snapshot are rendered for the next ahead of time).
#[derive(Debug)]
struct Body {
    bytes: Bytes,
    read: bool,
}

/// The graph at one build (nodes sorted by id, links by source and target), the
/// links of each node for focused views, and the answers rendered so far.
#[derive(Debug)]
pub struct Snapshot {
    /// The catalog index the snapshot shows.
    index: u64,
    /// When it was built.
    built: Instant,
    graph: Built,
    /// The links touching node `i`, both directions, as ascending positions in
    /// `graph.links`: `near[near_at[i]..near_at[i + 1]]`.
    near_at: Vec<u32>,
    near: Vec<u32>,
    bodies: Mutex<HashMap<BodyKey, Body>>,
    /// One rendering of an unfocused answer at a time: requests for an answer being
    /// rendered wait for it instead of rendering it again.
    rendering: tokio::sync::Mutex<()>,
}

/// `GET /graph`'s answer, borrowing from the snapshot: the same JSON as
/// [`GraphView`]. Its nodes and edges are serialized as they are walked, so a
/// rendering holds no copy of the graph.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Answer<'a> {
    index: u64,
    window_seconds: u64,
    error_ratio_warning: f64,
    nodes: Part<'a, &'a Node>,
    edges: Part<'a, EdgeJson<'a>>,
}

/// The nodes or edges of an answer: the first `len` (all of them), or those at the
/// positions `only`.
struct Part<'a, T> {
    graph: &'a Built,
    len: usize,
    only: Option<&'a [u32]>,
    item: fn(&'a Built, usize) -> T,
}

impl<'a, T: Serialize> Serialize for Part<'a, T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (graph, item) = (self.graph, self.item);
        match self.only {
            Some(only) => s.collect_seq(only.iter().map(|&i| item(graph, i as usize))),
            None => s.collect_seq((0..self.len).map(|i| item(graph, i))),
        }
    }
}

impl Snapshot {
    /// A snapshot of `graph` at catalog index `index`.
    pub fn new(index: u64, graph: Built) -> Self {
        let mut near_at = vec![0u32; graph.nodes.len() + 1];
        let touching = |l: &super::Link| {
            [Some(l.source), (l.target != l.source).then_some(l.target)]
                .into_iter()
                .flatten()
        };
        for n in graph.links.iter().flat_map(touching) {
            near_at[n as usize + 1] += 1;
        }
        for i in 1..near_at.len() {
            near_at[i] += near_at[i - 1];
        }
        let mut fill = near_at.clone();
        let mut near = vec![0u32; near_at[graph.nodes.len()] as usize];
        for (e, l) in graph.links.iter().enumerate() {
            for n in touching(l) {
                near[fill[n as usize] as usize] = e as u32;
                fill[n as usize] += 1;
            }
        }
        Snapshot {
            index,
            built: Instant::now(),
            graph,
            near_at,
            near,
            bodies: Mutex::new(HashMap::new()),
            rendering: tokio::sync::Mutex::new(()),
        }
    }

    /// Builds the whole graph from the store now.
    pub fn build(store: &Store, traffic: &Traffic, counters: Counters) -> Self {
        let index = store.index();
        Snapshot::new(index, build(store, traffic, Instant::now(), counters))
    }

    /// Makes the edges' counters run on from `previous`'s: adds its totals of the
    /// same edge to what this build claimed. An edge that left the graph in between
    /// starts again from 0 when it comes back (Prometheus reads that as a counter
    /// reset).
    pub fn count_from(&mut self, previous: Option<&Snapshot>) {
        let Some(previous) = previous else {
            return;
        };
        let (g, p) = (&mut self.graph, &previous.graph);
        // Both sorted by (source id, target id): one walk pairs them.
        let mut before = p.links.iter().peekable();
        for i in 0..g.links.len() {
            let here = g.ends(&g.links[i]);
            while before.next_if(|l| p.ends(l) < here).is_some() {}
            let found = before.next_if(|l| p.ends(l) == here);
            if let Some(old) = found {
                let l = &mut g.links[i];
                l.requests_total = l.requests_total.saturating_add(old.requests_total);
                l.errors_total = l.errors_total.saturating_add(old.errors_total);
            }
        }
    }

    /// The catalog index the snapshot shows.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The graph itself: nodes sorted by id, links by source and target.
    pub fn graph(&self) -> &Built {
        &self.graph
    }

    pub fn edge_count(&self) -> usize {
        self.graph.links.len()
    }

    /// The graph as `scope` asks for it.
    pub fn view(&self, scope: &Scope) -> Result<GraphView, GraphError> {
        let (nodes, edges) = self.select(scope)?;
        Ok(GraphView {
            index: self.index,
            window_seconds: self.graph.window_seconds,
            error_ratio_warning: self.graph.error_ratio_warning,
            nodes: nodes
                .iter()
                .map(|&i| self.graph.nodes[i as usize].clone())
                .collect(),
            edges: edges.iter().map(|&i| self.graph.edge(i as usize)).collect(),
        })
    }

    /// The position of the node `zone/cluster` in the nodes (sorted by id).
    fn position_of(&self, zone: &str, cluster: &str) -> Option<usize> {
        let id = super::node_id(zone, cluster);
        self.graph
            .nodes
            .binary_search_by(|n| n.id.as_str().cmp(&id))
            .ok()
    }

    /// The links from the cluster `zone/cluster` with their targets, by target id;
    /// none when the cluster is no node.
    pub fn calls_from(&self, zone: &str, cluster: &str) -> Vec<(&super::Link, &Node)> {
        let Some(at) = self.position_of(zone, cluster) else {
            return Vec::new();
        };
        self.near_of(at as u32)
            .iter()
            .map(|&e| &self.graph.links[e as usize])
            .filter(|l| l.source as usize == at)
            .map(|l| (l, &self.graph.nodes[l.target as usize]))
            .collect()
    }

    /// `GET /graph`'s body for `scope`, gzip-compressed when asked: an unfocused one
    /// from the rendered answers (rendered and kept when missing), a focused one
    /// rendered now.
    pub fn answer(&self, scope: &Scope, gzip: bool) -> Result<Bytes, GraphError> {
        if scope.focus.is_some() {
            return Ok(self.render(scope, gzip)?.into());
        }
        let key = BodyKey {
            zone: scope.zone.clone(),
            gzip,
        };
        if let Some(body) = self.cached(&key) {
            return Ok(body);
        }
        let body = Bytes::from(self.render(scope, gzip)?);
        let mut bodies = self.bodies.lock().unwrap_or_else(PoisonError::into_inner);
        if bodies.len() < MAX_BODIES {
            bodies.insert(
                key,
                Body {
                    bytes: body.clone(),
                    read: true,
                },
            );
        }
        Ok(body)
    }

    /// An unfocused answer already rendered, marked as read.
    fn cached(&self, key: &BodyKey) -> Option<Bytes> {
        let mut bodies = self.bodies.lock().unwrap_or_else(PoisonError::into_inner);
        bodies.get_mut(key).map(|b| {
            b.read = true;
            b.bytes.clone()
        })
    }

    /// Renders ahead of time the unfocused answers that requests read from
    /// `previous`, before this snapshot is shown.
    fn render_read_in(&self, previous: &Snapshot) {
        let keys: Vec<BodyKey> = previous
            .bodies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(_, b)| b.read)
            .map(|(k, _)| k.clone())
            .collect();
        // Not shown yet: no request renders into this snapshot meanwhile.
        for key in keys {
            if self
                .bodies
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains_key(&key)
            {
                continue;
            }
            let scope = Scope {
                zone: key.zone.clone(),
                focus: None,
            };
            // Unfocused answers never fail: a zone without nodes answers empty.
            if let Ok(body) = self.render(&scope, key.gzip) {
                self.bodies
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(
                        key,
                        Body {
                            bytes: body.into(),
                            read: false,
                        },
                    );
            }
        }
    }

    fn render(&self, scope: &Scope, gzip: bool) -> Result<Vec<u8>, GraphError> {
        let g = &self.graph;
        let selected = match scope.zone {
            None => None,
            Some(_) => Some(self.select(scope)?),
        };
        let answer = Answer {
            index: self.index,
            window_seconds: g.window_seconds,
            error_ratio_warning: g.error_ratio_warning,
            nodes: Part {
                graph: g,
                len: g.nodes.len(),
                only: selected.as_ref().map(|(n, _)| n.as_slice()),
                item: |g, i| &g.nodes[i],
            },
            edges: Part {
                graph: g,
                len: g.links.len(),
                only: selected.as_ref().map(|(_, e)| e.as_slice()),
                item: Built::edge_json,
            },
        };
        if !gzip {
            return Ok(serde_json::to_vec(&answer).expect("the graph serializes"));
        }
        // Straight into the compressor: the whole graph's JSON is never held.
        let mut out = std::io::BufWriter::with_capacity(
            64 << 10,
            flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()),
        );
        serde_json::to_writer(&mut out, &answer).expect("the graph serializes");
        let encoder = out
            .into_inner()
            .map_err(|_| ())
            .expect("writing to memory cannot fail");
        Ok(encoder.finish().expect("writing to memory cannot fail"))
    }

    /// Whether link `e` is part of `zone`'s graph: one of its ends is in the zone.
    fn in_zone(&self, e: u32, zone: &str) -> bool {
        let l = &self.graph.links[e as usize];
        self.graph.nodes[l.source as usize].zone_name == zone
            || self.graph.nodes[l.target as usize].zone_name == zone
    }

    /// The positions of the nodes and edges `scope` shows, ascending (so sorted as
    /// the answer wants them).
    fn select(&self, scope: &Scope) -> Result<(Vec<u32>, Vec<u32>), GraphError> {
        let Some(zone) = scope.zone.as_deref() else {
            return Ok((
                (0..self.graph.nodes.len() as u32).collect(),
                (0..self.graph.links.len() as u32).collect(),
            ));
        };
        let Some((cluster, depth)) = &scope.focus else {
            let edges: Vec<u32> = (0..self.graph.links.len() as u32)
                .filter(|&e| self.in_zone(e, zone))
                .collect();
            let mut shown: Vec<bool> = self
                .graph
                .nodes
                .iter()
                .map(|n| n.zone_name == zone)
                .collect();
            for &e in &edges {
                let l = &self.graph.links[e as usize];
                shown[l.source as usize] = true;
                shown[l.target as usize] = true;
            }
            let nodes = (0..self.graph.nodes.len() as u32)
                .filter(|&n| shown[n as usize])
                .collect();
            return Ok((nodes, edges));
        };
        let start = self
            .position_of(zone, cluster)
            .filter(|&i| self.graph.nodes[i].kind == "cluster")
            .ok_or(GraphError::UnknownCluster)? as u32;
        // Breadth first over the zone's edges, both directions, `depth` hops.
        let mut seen: HashMap<u32, u32> = HashMap::from([(start, 0)]);
        let mut queue = std::collections::VecDeque::from([start]);
        while let Some(n) = queue.pop_front() {
            let d = seen[&n];
            if d == *depth {
                continue;
            }
            for &e in self.near_of(n) {
                if !self.in_zone(e, zone) {
                    continue;
                }
                let l = &self.graph.links[e as usize];
                let other = if l.source == n { l.target } else { l.source };
                if let std::collections::hash_map::Entry::Vacant(v) = seen.entry(other) {
                    v.insert(d + 1);
                    queue.push_back(other);
                }
            }
        }
        let mut nodes: Vec<u32> = seen.keys().copied().collect();
        nodes.sort_unstable();
        let mut edges: Vec<u32> = nodes
            .iter()
            .flat_map(|&n| self.near_of(n).iter().copied())
            .filter(|&e| {
                let l = &self.graph.links[e as usize];
                self.in_zone(e, zone)
                    && seen.contains_key(&l.source)
                    && seen.contains_key(&l.target)
            })
            .collect();
        edges.sort_unstable();
        edges.dedup();
        Ok((nodes, edges))
    }

    fn near_of(&self, n: u32) -> &[u32] {
        let n = n as usize;
        &self.near[self.near_at[n] as usize..self.near_at[n + 1] as usize]
    }
}

/// The latest snapshot, its builder and the watcher of the graph's shape.
#[derive(Debug)]
pub struct Graphs {
    /// The instances' traffic the graph is drawn from, beside the catalog each
    /// build is handed.
    traffic: Arc<Traffic>,
    latest: RwLock<Option<Arc<Snapshot>>>,
    /// One build at a time: requests that find the snapshot stale wait for the build
    /// under way, then read it. It also keeps the edges' counters whole: each build
    /// claims the traffic reported since the one before and runs on from the
    /// snapshot it replaces.
    building: tokio::sync::Mutex<()>,
    watcher: Mutex<Watcher>,
    /// Whether a request read the graph since the watcher last looked.
    read: AtomicBool,
    /// Where an edge's predicted mTLS failure and its end are noted (`tls-mismatch`,
    /// `tls-match`), when the history is on.
    history: Option<Arc<crate::history::History>>,
}

impl Graphs {
    /// No snapshot yet; graphs drawn from `traffic`.
    pub fn new(traffic: Arc<Traffic>) -> Self {
        Graphs {
            traffic,
            latest: RwLock::default(),
            building: tokio::sync::Mutex::default(),
            watcher: Mutex::default(),
            read: AtomicBool::default(),
            history: None,
        }
    }

    /// These graphs, noting in `history` each edge whose `tlsIdentity` starts or
    /// stops predicting a failed handshake.
    pub fn noting_in(mut self, history: Option<Arc<crate::history::History>>) -> Self {
        self.history = history;
        self
    }

    /// The latest snapshot when it shows `index` and is at most [`MAX_AGE`] old.
    fn latest_at(&self, index: u64) -> Option<Arc<Snapshot>> {
        self.latest
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|s| s.index == index && s.built.elapsed() <= MAX_AGE)
            .cloned()
    }

    /// Makes `snapshot` the latest; returns the one it replaces.
    fn install(&self, snapshot: Arc<Snapshot>) -> Option<Arc<Snapshot>> {
        self.latest
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(snapshot)
    }

    /// The latest snapshot, whatever catalog index it shows.
    fn latest(&self) -> Option<Arc<Snapshot>> {
        self.latest
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The snapshot of the catalog's current index: the latest, or one built now
    /// (on the blocking pool) when the catalog moved since it was built or it is
    /// older than [`MAX_AGE`]. Marks the graph read, so that the watcher builds it
    /// again at its next look. A build that fails (it panicked) is logged and
    /// answers [`GraphError::Unavailable`]; the latest snapshot stays as it was.
    pub async fn fresh(&self, store: &Arc<Store>) -> Result<Arc<Snapshot>, GraphError> {
        self.read.store(true, Ordering::Relaxed);
        if let Some(s) = self.latest_at(store.index()) {
            return Ok(s);
        }
        let _building = self.building.lock().await;
        // Whoever built before may have built this one.
        if let Some(s) = self.latest_at(store.index()) {
            return Ok(s);
        }
        let (from, traffic) = (store.clone(), self.traffic.clone());
        let mut snapshot =
            tokio::task::spawn_blocking(move || Snapshot::build(&from, &traffic, Counters::Claim))
                .await
                .map_err(|e| {
                    tracing::error!(error = %e, "Graph build failed.");
                    GraphError::Unavailable
                })?;
        snapshot.count_from(self.latest().as_deref());
        let snapshot = Arc::new(snapshot);
        self.install(snapshot.clone());
        Ok(snapshot)
    }

    /// `GET /graph`'s body for `scope` at the catalog's current index. Rendering is
    /// done on the blocking pool, an unfocused answer once per snapshot.
    pub async fn answer(
        &self,
        store: &Arc<Store>,
        scope: Scope,
        gzip: bool,
    ) -> Result<Bytes, GraphError> {
        let snapshot = self.fresh(store).await?;
        let _one = if scope.focus.is_none() {
            let key = BodyKey {
                zone: scope.zone.clone(),
                gzip,
            };
            if let Some(body) = snapshot.cached(&key) {
                return Ok(body);
            }
            Some(snapshot.rendering.lock().await)
        } else {
            None
        };
        let from = snapshot.clone();
        match tokio::task::spawn_blocking(move || from.answer(&scope, gzip)).await {
            Ok(answer) => answer,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    /// The watcher's tick: builds the graph, moves the catalog index and sends the
    /// `graph` events of the zones whose shape changed, makes the build the latest
    /// snapshot, and renders the answers read from the one it replaces. Called with
    /// `building` held, as [`watch`] does.
    pub fn rebuild(&self, store: &Store) {
        let before = store.index();
        let started = Instant::now();
        let graph = build(store, &self.traffic, started, Counters::Claim);
        tracing::debug!(
            nodes = graph.nodes.len(),
            edges = graph.links.len(),
            ms = started.elapsed().as_secs_f64() * 1e3,
            "Graph built."
        );
        let (changed, tls) = {
            let mut watcher = self.watcher.lock().unwrap_or_else(PoisonError::into_inner);
            (watcher.changed(&graph), watcher.tls_changes(&graph))
        };
        if let Some(history) = &self.history {
            for note in tls {
                history.record(note);
            }
        }
        // The snapshot shows the index of its own change only when nothing else
        // changed in between; otherwise it is older than the catalog and the next
        // request builds again.
        let index = match store.graph_changed(&changed) {
            Some((previous, index)) if previous == before => index,
            _ => before,
        };
        let mut snapshot = Snapshot::new(index, graph);
        let previous = self.latest();
        snapshot.count_from(previous.as_deref());
        // Rendered before the snapshot is shown, so that no request waits for it.
        if let Some(previous) = previous {
            snapshot.render_read_in(&previous);
        }
        self.install(Arc::new(snapshot));
    }
}

/// What the graph was last built from, as the watcher compares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Inputs {
    shape: u64,
    bucket: u64,
    index: u64,
}

/// Looks every [`WATCH_PERIOD`] until `stop` turns true, and rebuilds the graph when
/// its inputs moved or it was read since (see the module's documentation).
pub async fn watch(store: Arc<Store>, graphs: Arc<Graphs>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(WATCH_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<Inputs> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        // Read before the build: a change during it is seen at the next look. The
        // window moving on matters only when some calls are held (a mesh without
        // traffic is not built again every bucket, a walk of every cluster beside
        // the API's requests).
        let now = Inputs {
            shape: graphs.traffic.shape(),
            bucket: if graphs.traffic.is_empty() {
                0
            } else {
                graphs.traffic.bucket(Instant::now())
            },
            index: store.index(),
        };
        let read = graphs.read.swap(false, Ordering::Relaxed);
        if !read && last == Some(now) {
            continue;
        }
        last = Some(now);
        let _building = graphs.building.lock().await;
        let (g, s) = (graphs.clone(), store.clone());
        if let Err(e) = tokio::task::spawn_blocking(move || g.rebuild(&s)).await {
            tracing::warn!(error = %e, "Graph build failed.");
        }
    }
}

#[cfg(test)]
mod tests {
    use meshcat_common::model::{ClusterRecord, ZoneRecord};
    use meshcat_common::wire::{InstanceReport, ListenerRoutes, ReportedCluster, UpstreamTraffic};

    use super::*;
    use crate::store::{Instances, Rules};

    fn zone(name: &str) -> ZoneRecord {
        ZoneRecord {
            request_cluster: "edge".into(),
            ..ZoneRecord::new(name, "cp:50000")
        }
    }

    /// An instance of (zone, cluster) calling `upstreams` (name, host address) with
    /// `requests` so far, listening at `listen`.
    fn report(
        zone: &str,
        cluster: &str,
        upstreams: &[(&str, &str)],
        listen: Option<&str>,
        requests: u64,
    ) -> InstanceReport {
        InstanceReport {
            reachable: true,
            start_time_ms: 1_700_000_000_000,
            server_state: "LIVE".into(),
            clusters: upstreams
                .iter()
                .map(|(name, host)| ReportedCluster::healthy(*name, vec![(*host).to_owned()]))
                .collect(),
            upstreams: upstreams
                .iter()
                .map(|(name, _)| UpstreamTraffic {
                    name: (*name).into(),
                    requests_total: requests,
                    errors_total: requests / 10,
                    connect_fail_total: 0,
                    p50_ms: Some(2.0),
                    p99_ms: Some(9.0),
                    tls: false,
                })
                .collect(),
            listeners: listen
                .map(|a| {
                    vec![ListenerRoutes {
                        address: a.into(),
                        clusters: vec!["local_service".into()],
                    }]
                })
                .unwrap_or_default(),
            // Reached at the host it listens at, as an agent reaches a pod.
            admin_address: listen
                .and_then(|a| a.rsplit_once(':'))
                .map(|(host, _)| format!("{host}:15000"))
                .unwrap_or_default(),
            ..InstanceReport::unread(zone.into(), cluster.into(), format!("{cluster}-1"))
        }
    }

    /// A store with zone z and nothing else.
    fn empty() -> (tempfile::TempDir, Arc<Store>, Arc<Instances>) {
        let dir = tempfile::tempdir().unwrap();
        let (store, live) = Store::open(dir.path(), Rules::defaults()).unwrap();
        store.writes().create_zone(zone("z")).unwrap();
        (dir, Arc::new(store), Arc::new(live))
    }

    /// The observed edges of `g` as (source, target, requests).
    fn observed(g: &Built) -> Vec<(&str, &str, u64)> {
        g.links
            .iter()
            .filter(|l| l.observed)
            .map(|l| {
                let (s, t) = g.ends(l);
                (s, t, l.requests)
            })
            .collect()
    }

    /// Two zones: z/a calls z/b, z/c and an external service and declares z/b, a
    /// ghost and y/d; z/b calls z/c; z/c calls y/d through d's listener address; y/d
    /// calls an external service of its own.
    fn mesh() -> (tempfile::TempDir, Arc<Store>, Arc<Instances>) {
        let dir = tempfile::tempdir().unwrap();
        let (store, live) = Store::open(dir.path(), Rules::defaults()).unwrap();
        for z in ["z", "y"] {
            store.writes().create_zone(zone(z)).unwrap();
        }
        let mut a = ClusterRecord::new("z", "a", "A");
        a.dependencies = vec!["b".into(), "ghost".into(), "y/d".into()];
        store.writes().create_cluster(a).unwrap();
        for (z, c) in [("z", "b"), ("z", "c"), ("y", "d")] {
            store
                .writes()
                .create_cluster(ClusterRecord::new(z, c, c))
                .unwrap();
        }
        let reports = |n| {
            vec![
                report(
                    "z",
                    "a",
                    &[
                        ("b", "10.0.0.2:80"),
                        ("c", "10.0.0.3:80"),
                        ("ext", "1.1.1.1:443"),
                    ],
                    Some("10.0.0.1:80"),
                    n,
                ),
                report("z", "b", &[("c", "10.0.0.3:80")], Some("10.0.0.2:80"), n),
                report(
                    "z",
                    "c",
                    &[("d-out", "10.0.0.4:80")],
                    Some("10.0.0.3:80"),
                    n,
                ),
                report("y", "d", &[("e", "2.2.2.2:443")], Some("10.0.0.4:80"), n),
            ]
        };
        let now = Instant::now();
        live.apply_reports("agent", reports(100), now);
        live.apply_reports("agent", reports(150), now);
        (dir, Arc::new(store), Arc::new(live))
    }

    /// A view without the figures that depend on the clock of the build.
    fn timeless(mut v: GraphView) -> GraphView {
        for e in &mut v.edges {
            e.last_seen_ms = None;
        }
        v
    }

    fn scopes() -> Vec<Scope> {
        let mut out = vec![Scope::default()];
        for z in ["z", "y", "nowhere"] {
            out.push(Scope {
                zone: Some(z.into()),
                focus: None,
            });
        }
        for (z, c) in [
            ("z", "a"),
            ("z", "b"),
            ("z", "c"),
            ("z", "ghost"),
            ("y", "d"),
            ("z", "nobody"),
            ("z", "external:ext"),
            ("y", "a"),
        ] {
            for depth in 1..=3 {
                out.push(Scope {
                    zone: Some(z.into()),
                    focus: Some((c.into(), depth)),
                });
            }
        }
        out
    }

    #[test]
    fn the_build_finds_each_edge_by_name_listener_or_as_external_beside_the_declared() {
        let (_dir, store, live) = mesh();
        let g = build(&store, live.traffic(), Instant::now(), Counters::Leave);
        let ids: Vec<&str> = g.nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "y/d",
                "y/external:e",
                "z/a",
                "z/b",
                "z/c",
                "z/external:ext",
                "z/ghost"
            ]
        );
        let ghost = &g.nodes[6];
        assert_eq!(
            (ghost.kind, ghost.registered, ghost.status),
            ("cluster", false, Some(meshcat_common::model::Status::Down))
        );
        assert_eq!((g.nodes[1].kind, g.nodes[1].status), ("external", None));
        let edges: Vec<(&str, &str, u64, u64, bool, bool)> = (0..g.links.len())
            .map(|i| {
                let e = g.edge_json(i);
                let l = &g.links[i];
                (
                    e.source, e.target, l.requests, l.errors, l.observed, l.declared,
                )
            })
            .collect();
        // Each observed edge names the upstream it was drawn from; c reaches d
        // through d's listener, under its own name for it.
        let vias: Vec<(&str, &str, Option<&str>)> = g
            .links
            .iter()
            .map(|l| {
                let (source, target) = g.ends(l);
                (source, target, l.via.as_deref())
            })
            .collect();
        assert_eq!(
            vias,
            [
                ("y/d", "y/external:e", Some("e")),
                ("z/a", "y/d", None),
                ("z/a", "z/b", Some("b")),
                ("z/a", "z/c", Some("c")),
                ("z/a", "z/external:ext", Some("ext")),
                ("z/a", "z/ghost", None),
                ("z/b", "z/c", Some("c")),
                ("z/c", "y/d", Some("d-out")),
            ]
        );
        // Reports of 100 then 150 requests (a tenth of them 5xx): 50 and 5 in the
        // window, per instance and upstream.
        assert_eq!(
            edges,
            [
                ("y/d", "y/external:e", 50, 5, true, false),
                ("z/a", "y/d", 0, 0, false, true),
                ("z/a", "z/b", 50, 5, true, true),
                ("z/a", "z/c", 50, 5, true, false),
                ("z/a", "z/external:ext", 50, 5, true, false),
                ("z/a", "z/ghost", 0, 0, false, true),
                ("z/b", "z/c", 50, 5, true, false),
                // d-out's host is d's listener.
                ("z/c", "y/d", 50, 5, true, false),
            ]
        );
    }

    #[test]
    fn a_sidecar_cannot_draw_another_workloads_callers_to_itself() {
        // Which of two claims of one address a build met last was a matter of the
        // maps' order: every try starts afresh.
        for _ in 0..16 {
            let (_dir, store, live) = empty();
            let reports = |n| {
                // The tenant t, reached at 10.0.0.9, claims the victim b's address.
                let mut tenant = report("z", "t", &[], Some("10.0.0.2:80"), n);
                tenant.admin_address = "10.0.0.9:15000".into();
                vec![
                    // a calls b through b's address, under a name of its own.
                    report("z", "a", &[("to-b", "10.0.0.2:80")], None, n),
                    report("z", "b", &[], Some("10.0.0.2:80"), n),
                    tenant,
                ]
            };
            let now = Instant::now();
            live.apply_reports("agent", reports(100), now);
            live.apply_reports("agent", reports(150), now);
            let g = build(&store, live.traffic(), Instant::now(), Counters::Leave);
            assert_eq!(observed(&g), [("z/a", "z/b", 50)]);
            assert!(
                live.traffic().metrics().refused(
                    crate::store::traffic::Item::Listener,
                    crate::store::traffic::Refusal::NotOwnAddress
                ) >= 1
            );
        }
    }

    #[test]
    fn an_address_two_clusters_listen_at_draws_no_edge() {
        // Both reached on loopback (on one machine): each may claim it, neither wins.
        let (_dir, store, live) = empty();
        let reports = |n| {
            vec![
                report("z", "a", &[("to-b", "127.0.0.1:10002")], None, n),
                report("z", "b", &[], Some("127.0.0.1:10002"), n),
                report("z", "t", &[], Some("127.0.0.1:10002"), n),
            ]
        };
        let now = Instant::now();
        live.apply_reports("agent", reports(100), now);
        live.apply_reports("agent", reports(150), now);
        let g = build(&store, live.traffic(), Instant::now(), Counters::Leave);
        assert_eq!(observed(&g), [("z/a", "z/external:to-b", 50)]);
    }

    #[test]
    fn a_nodes_callees_past_the_bound_go_to_external_other() {
        let (_dir, store, live) = empty();
        live.traffic().set_max_edges_per_node(2);
        let calls = |n| {
            vec![report(
                "z",
                "a",
                &[
                    ("b", "10.0.0.2:80"),
                    ("c", "10.0.0.3:80"),
                    ("d", "10.0.0.4:80"),
                    ("e", "10.0.0.5:80"),
                ],
                None,
                n,
            )]
        };
        let now = Instant::now();
        live.apply_reports("agent", calls(100), now);
        live.apply_reports("agent", calls(150), now);
        let g = build(&store, live.traffic(), Instant::now(), Counters::Leave);
        assert_eq!(
            observed(&g),
            [
                ("z/a", "z/external:b", 50),
                ("z/a", "z/external:c", 50),
                ("z/a", "z/external:other", 100),
            ]
        );
        let other = g
            .nodes
            .iter()
            .find(|n| n.id == "z/external:other")
            .expect("the node of the sum");
        assert_eq!(other.kind, "external");
        assert_eq!(live.traffic().metrics().rolled_up(), 2);
    }

    #[test]
    fn the_first_burst_to_an_upstream_is_on_its_edge() {
        // a's sidecar reports before its first request to b, then with the 20
        // requests that made b's counters.
        let (_dir, store, live) = empty();
        let now = Instant::now();
        let quiet = report("z", "a", &[], Some("10.0.0.1:80"), 0);
        live.apply_reports("agent", vec![quiet], now);
        let burst = report("z", "a", &[("b", "10.0.0.2:80")], Some("10.0.0.1:80"), 20);
        live.apply_reports("agent", vec![burst], now);
        let graphs = Graphs::new(live.traffic().clone());
        graphs.rebuild(&store);
        let g = graphs.latest().expect("a snapshot");
        assert_eq!(observed(g.graph()), [("z/a", "z/external:b", 20)]);
        assert_eq!(totals(&graphs, "z/a", "z/external:b"), (20, 2));
    }

    #[test]
    fn every_scope_answers_as_a_build_from_the_store_does() {
        let (_dir, store, live) = mesh();
        let snapshot = Snapshot::build(&store, live.traffic(), Counters::Leave);
        assert!(snapshot.edge_count() >= 6, "{:?}", snapshot.graph.links);
        for scope in scopes() {
            let oracle =
                super::super::view(&store, live.traffic(), &scope, Instant::now()).map(timeless);
            assert_eq!(
                snapshot.view(&scope).map(timeless),
                oracle,
                "scope {scope:?}"
            );
            // The rendered body is the view's JSON, whatever the encoding.
            for gzip in [false, true] {
                let Ok(body) = snapshot.answer(&scope, gzip) else {
                    assert!(oracle.is_err());
                    continue;
                };
                let json = if gzip {
                    let mut out = Vec::new();
                    std::io::Read::read_to_end(
                        &mut flate2::read::GzDecoder::new(&body[..]),
                        &mut out,
                    )
                    .unwrap();
                    out
                } else {
                    body.to_vec()
                };
                assert_eq!(
                    serde_json::from_slice::<serde_json::Value>(&json).unwrap(),
                    serde_json::to_value(snapshot.view(&scope).unwrap()).unwrap(),
                    "scope {scope:?}, gzip {gzip}"
                );
            }
        }
    }

    /// The counters of edge (source, target) in `graphs`' latest snapshot.
    fn totals(graphs: &Graphs, source: &str, target: &str) -> (u64, u64) {
        let latest = graphs.latest().expect("a snapshot");
        let g = latest.graph();
        g.links
            .iter()
            .find(|l| g.ends(l) == (source, target))
            .map(|l| (l.requests_total, l.errors_total))
            .unwrap_or_else(|| panic!("no edge {source} -> {target}"))
    }

    #[test]
    fn edge_counters_only_grow_whoever_comes_and_goes() {
        let (_dir, store, live) = mesh();
        let graphs = Graphs::new(live.traffic().clone());
        // The mesh's instances reported 100 then 150 requests (a tenth of them
        // errors): the first report only sets where differences start.
        graphs.rebuild(&store);
        assert_eq!(totals(&graphs, "z/a", "z/b"), (50, 5));
        assert_eq!(totals(&graphs, "z/a", "z/external:ext"), (50, 5));
        assert_eq!(totals(&graphs, "z/a", "z/ghost"), (0, 0), "declared only");
        // A build thrown away takes nothing from the next one.
        let once = Snapshot::build(&store, live.traffic(), Counters::Leave);
        assert!(once.graph().links.iter().all(|l| l.requests_total == 0));
        graphs.rebuild(&store);
        assert_eq!(totals(&graphs, "z/a", "z/b"), (50, 5), "nothing new");

        // A second instance of a calls b too, under another agent, then leaves: what
        // it counted stays counted.
        let now = Instant::now();
        let second = |n| {
            let mut r = report("z", "a", &[("b", "10.0.0.2:80")], None, n);
            r.instance = "a-2".into();
            vec![r]
        };
        live.apply_reports("agent-2", second(1000), now);
        live.apply_reports("agent-2", second(1020), now);
        graphs.rebuild(&store);
        assert_eq!(totals(&graphs, "z/a", "z/b"), (70, 7));
        live.agent_gone("agent-2");
        graphs.rebuild(&store);
        assert_eq!(totals(&graphs, "z/a", "z/b"), (70, 7));

        // The first instance's sidecar restarts: its counters start from zero, and
        // what it counted since is new.
        let restarted = report(
            "z",
            "a",
            &[
                ("b", "10.0.0.2:80"),
                ("c", "10.0.0.3:80"),
                ("ext", "1.1.1.1:443"),
            ],
            Some("10.0.0.1:80"),
            30,
        );
        live.apply_reports("agent", vec![restarted], now);
        graphs.rebuild(&store);
        assert_eq!(totals(&graphs, "z/a", "z/b"), (100, 10));
    }

    #[test]
    fn an_edge_names_the_upstream_with_the_most_errors() {
        let (_dir, store, live) = mesh();
        // Another instance of a reaches b through its listener under another name,
        // with more errors than a-1's calls to b by name.
        let calls = |n| {
            let mut r = report("z", "a", &[("b-alias", "10.0.0.2:80")], None, n);
            r.instance = "a-2".into();
            vec![r]
        };
        let now = Instant::now();
        live.apply_reports("agent-2", calls(1000), now);
        live.apply_reports("agent-2", calls(2000), now);
        let snapshot = Snapshot::build(&store, live.traffic(), Counters::Leave);
        let from_a: Vec<(&str, u64, Option<&str>)> = snapshot
            .calls_from("z", "a")
            .into_iter()
            .map(|(l, n)| (n.id.as_str(), l.errors, l.via.as_deref()))
            .collect();
        assert_eq!(
            from_a,
            [
                ("y/d", 0, None),
                ("z/b", 105, Some("b-alias")),
                ("z/c", 5, Some("c")),
                ("z/external:ext", 5, Some("ext")),
                ("z/ghost", 0, None),
            ]
        );
        assert!(snapshot.calls_from("z", "nobody").is_empty());
    }

    #[test]
    fn an_edge_drawn_from_two_upstreams_saturates_its_counters() {
        let (_dir, store, live) = mesh();
        // a reaches b by name and through b's listener under another name, both
        // with counters near the top of a u64.
        let calls = |n| {
            let mut r = report(
                "z",
                "a",
                &[("b", "10.0.0.2:80"), ("b-out", "10.0.0.2:80")],
                Some("10.0.0.1:80"),
                n,
            );
            r.instance = "a-2".into();
            vec![r]
        };
        let now = Instant::now();
        live.apply_reports("agent-2", calls(0), now);
        live.apply_reports("agent-2", calls(u64::MAX), now);
        let graphs = Graphs::new(live.traffic().clone());
        graphs.rebuild(&store);
        assert_eq!(
            totals(&graphs, "z/a", "z/b"),
            (u64::MAX, 2 * (u64::MAX / 10) + 5)
        );
    }

    #[tokio::test]
    async fn a_catalog_change_is_seen_at_once_and_a_read_answer_is_rendered_ahead() {
        let (_dir, store, live) = mesh();
        let graphs = Arc::new(Graphs::new(live.traffic().clone()));
        // The watcher's first build sees every zone's edges: its own change.
        graphs.rebuild(&store);
        let first = graphs.fresh(&store).await.unwrap();
        assert_eq!(
            first.index(),
            store.index(),
            "the build shows its own change"
        );
        let whole = graphs.answer(&store, Scope::default(), true).await.unwrap();
        assert!(
            Arc::ptr_eq(&first, &graphs.fresh(&store).await.unwrap()),
            "no new build while the catalog stands still"
        );
        assert_eq!(
            whole,
            graphs.answer(&store, Scope::default(), true).await.unwrap(),
            "one rendering per snapshot"
        );

        // The next tick renders the answer read from the previous snapshot.
        graphs.rebuild(&store);
        let second = graphs.fresh(&store).await.unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
        assert!(
            second
                .cached(&BodyKey {
                    zone: None,
                    gzip: true
                })
                .is_some()
        );
        assert!(
            second
                .cached(&BodyKey {
                    zone: None,
                    gzip: false
                })
                .is_none(),
            "only what was read"
        );

        // A registration moves the index: the next request builds again and sees it.
        store
            .writes()
            .create_cluster(ClusterRecord::new("z", "late", "Late"))
            .unwrap();
        let third = graphs.fresh(&store).await.unwrap();
        assert_eq!(third.index(), store.index());
        assert!(
            third
                .view(&Scope {
                    zone: Some("z".into()),
                    focus: Some(("late".into(), 1)),
                })
                .is_ok()
        );
    }
}
