//! Read models: every answer the API serves from the catalog (`GET /clusters`, one
//! cluster, `/summary`, `/zones`, `/services`, the ops totals), rendered from the
//! pre-serialized records ([`super::render`]), the per-generation cache of the
//! large ones, and each cluster's facts the graph is built from. Readers never take
//! the catalog's write lock. The serde views kept under `#[cfg(test)]` are the
//! oracle the rendered bytes are checked against.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use meshcat_common::model::{ClusterRecord, ClusterView, Status, ZoneRecord, ZoneSummary};

use super::{Store, ZoneAggregate, render};

/// Which large answer [`Store::cached_body_shared`] serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CachedKind {
    Summary,
    AllClusters,
}

/// A cached answer: its kind, the caller's authorization and its encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cached {
    pub kind: CachedKind,
    pub authorized: bool,
    pub gzip: bool,
}

impl Cached {
    fn slot(self) -> usize {
        (self.kind as usize) * 4 + usize::from(self.authorized) * 2 + usize::from(self.gzip)
    }
}

/// Totals for the ops exposition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub zones: u64,
    pub clusters: u64,
    pub live_instances: u64,
    pub by_status: [u64; 3],
}

/// One (zone, cluster) as the graph shows it.
#[derive(Debug, Clone)]
pub struct ClusterFacts {
    pub zone: String,
    pub cluster: String,
    pub registered: bool,
    pub status: Status,
    pub owner: String,
    /// Live instances.
    pub instances: u64,
    /// Declared dependencies as (zone, cluster).
    pub dependencies: Vec<(String, String)>,
    /// Whether its live instances run different configurations.
    pub drifted: bool,
    /// What its live instances present and expect of TLS peers, when any holds an
    /// identity.
    pub tls: Option<Arc<super::identity::ClusterTls>>,
    /// The soonest expiry of its live instances' identity certificates, ms since
    /// the epoch.
    pub cert_expires_ms: Option<i64>,
    /// The worst identity state of its live instances.
    pub identity_state: meshcat_common::identity::CertState,
}

/// Serialized bodies with their generation, by [`Cached::slot`].
#[derive(Debug, Default)]
pub(super) struct ReadCache {
    slots: Mutex<[Option<(u64, Bytes)>; 8]>,
    /// One builder per slot at a time: concurrent readers of a stale body wait for
    /// that one build instead of each building it.
    builders: [tokio::sync::Mutex<()>; 8],
}

impl Store {
    /// The registration of (zone, cluster).
    pub fn record(&self, zone: &str, cluster: &str) -> Option<Arc<ClusterRecord>> {
        self.memory.record(zone, cluster)
    }

    /// The clusters of `zone`'s control server view that stand for `cluster` in the
    /// catalog (its name, a sidecar's listener address, a mesh-specific name: the
    /// mapping of [`super::declared`]); empty when none does.
    pub fn declared_names(&self, zone: &str, cluster: &str) -> Vec<String> {
        self.memory
            .clusters
            .get(cluster)
            .and_then(|m| {
                m.get(zone).and_then(|e| {
                    let d = e.declared.as_ref()?;
                    Some(d.names().iter().map(|n| n.to_string()).collect())
                })
            })
            .unwrap_or_default()
    }

    /// Whether (zone, cluster) is registered.
    pub fn is_registered(&self, zone: &str, cluster: &str) -> bool {
        self.record(zone, cluster).is_some()
    }

    /// Every zone record, sorted by name.
    pub fn zones(&self) -> Vec<ZoneRecord> {
        let mut out: Vec<ZoneRecord> = self
            .memory
            .zones
            .iter()
            .map(|z| (*z.record).clone())
            .collect();
        out.sort_unstable_by(|a, b| a.zone_name.cmp(&b.zone_name));
        out
    }

    pub fn zone(&self, name: &str) -> Option<ZoneRecord> {
        self.memory.zones.get(name).map(|z| (*z.record).clone())
    }

    /// The zone's summary from its incremental counters.
    pub fn zone_summary(&self, name: &str) -> Option<ZoneSummary> {
        self.memory.zones.get(name).map(|z| z.agg.summary(name))
    }

    /// Totals for the ops exposition, from the per-zone counters.
    pub fn totals(&self) -> Totals {
        let mut t = Totals {
            live_instances: self.memory.live_total.load(Ordering::Acquire),
            ..Totals::default()
        };
        for z in self.memory.zones.iter() {
            t.zones += 1;
            t.clusters += z.agg.clusters;
            for i in 0..3 {
                t.by_status[i] += z.agg.by_status[i];
            }
        }
        t
    }

    /// A body from the cache when it is of the current generation, else built and
    /// cached.
    fn cached(&self, slot: usize, build: impl FnOnce() -> Vec<u8>) -> Bytes {
        let generation = self.index();
        {
            let cache = self.cache.slots.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((g, body)) = &cache[slot]
                && *g == generation
            {
                return body.clone();
            }
        }
        let body = Bytes::from(build());
        let mut cache = self.cache.slots.lock().unwrap_or_else(|p| p.into_inner());
        // Keep the newest: a slower builder of an older generation must not win.
        if cache[slot].as_ref().is_none_or(|(g, _)| *g <= generation) {
            cache[slot] = Some((generation, body.clone()));
        }
        body
    }

    /// A large read answer served from the per-generation cache: `GET /summary` or
    /// the unfiltered `GET /clusters`, identity or gzip-encoded.
    fn cached_body(&self, which: Cached) -> Bytes {
        if which.gzip {
            let plain = Cached {
                gzip: false,
                ..which
            };
            return self.cached(which.slot(), || render::gzip(&self.cached_body(plain)));
        }
        self.cached(which.slot(), || match which.kind {
            CachedKind::Summary => self.render_summary(which.authorized),
            CachedKind::AllClusters => self.render_clusters(which.authorized, |_, _| true),
        })
    }

    /// The cached body when it is of the current generation.
    fn fresh(&self, slot: usize) -> Option<Bytes> {
        let generation = self.index();
        let cache = self.cache.slots.lock().unwrap_or_else(|p| p.into_inner());
        cache[slot]
            .as_ref()
            .filter(|(g, _)| *g == generation)
            .map(|(_, b)| b.clone())
    }

    /// [`Self::cached_body`] for request handlers: a stale body is rebuilt once, on
    /// the blocking pool, however many requests want it meanwhile; they wait for that
    /// build without holding a runtime worker.
    pub async fn cached_body_shared(self: &Arc<Self>, which: Cached) -> Bytes {
        let slot = which.slot();
        if let Some(body) = self.fresh(slot) {
            return body;
        }
        let _building = self.cache.builders[slot].lock().await;
        // Whoever held the lock before may have built it.
        if let Some(body) = self.fresh(slot) {
            return body;
        }
        let store = self.clone();
        match tokio::task::spawn_blocking(move || store.cached_body(which)).await {
            Ok(body) => body,
            // The build panicked: build here rather than fail the request.
            Err(_) => self.cached_body(which),
        }
    }

    /// The `GET /clusters` body for the registered clusters matching `keep`, sorted
    /// by (zoneName, clusterName).
    pub fn render_clusters(
        &self,
        authorized: bool,
        keep: impl Fn(&ClusterRecord, Status) -> bool,
    ) -> Vec<u8> {
        let at = super::identity::IdentityAt::now(self.memory.rules.identity);
        let mut items: Vec<(String, String, Vec<u8>)> = Vec::new();
        for by_zone in self.memory.clusters.iter() {
            for (zone, e) in by_zone.iter() {
                if let Some(r) = &e.record
                    && keep(r, e.status)
                {
                    let mut v = Vec::with_capacity(e.record_json.len() + 96);
                    render::write_view(&mut v, &e.record_json, e, authorized, &at);
                    items.push((zone.clone(), by_zone.key().clone(), v));
                }
            }
        }
        items.sort_unstable_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        render::array(items.iter().map(|i| i.2.as_slice()))
    }

    /// The `GET /clusters/{name}` body: the registered clusters named `name`, one
    /// per zone (or only `zone`); `None` when there is none.
    pub fn render_cluster(
        &self,
        name: &str,
        zone: Option<&str>,
        authorized: bool,
    ) -> Option<Vec<u8>> {
        let at = super::identity::IdentityAt::now(self.memory.rules.identity);
        let by_zone = self.memory.clusters.get(name)?;
        let mut out = Vec::with_capacity(1024);
        out.push(b'[');
        let mut any = false;
        for (z, e) in by_zone.iter() {
            if e.record.is_none() || zone.is_some_and(|want| want != z) {
                continue;
            }
            if any {
                out.push(b',');
            }
            any = true;
            render::write_view(&mut out, &e.record_json, e, authorized, &at);
        }
        out.push(b']');
        any.then_some(out)
    }

    /// Each zone's counters and cluster names, copied out so that no zone guard is
    /// held while cluster entries are read.
    fn zone_snapshots(&self) -> Vec<(String, ZoneAggregate, Vec<String>)> {
        self.memory
            .zones
            .iter()
            .map(|z| {
                (
                    z.key().clone(),
                    z.agg.clone(),
                    z.clusters.iter().cloned().collect(),
                )
            })
            .collect()
    }

    /// Renders the seed 2.5 summary from the counters and pre-serialized records.
    fn render_summary(&self, authorized: bool) -> Vec<u8> {
        let at = super::identity::IdentityAt::now(self.memory.rules.identity);
        let mut zones = self.zone_snapshots();
        zones.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut totals = super::aggregate::OverallTotals::default();
        let mut body = Vec::with_capacity(1 << 16);
        body.push(b'{');
        for (n, (zone, agg, names)) in zones.iter().enumerate() {
            totals.add(agg);
            if n > 0 {
                body.push(b',');
            }
            serde_json::to_writer(&mut body, zone).expect("strings serialise");
            body.extend_from_slice(b":{\"clusters\":{");
            let mut first = true;
            for name in names {
                if let Some(by_zone) = self.memory.clusters.get(name)
                    && let Some(e) = by_zone.get(zone)
                    && e.record.is_some()
                {
                    if !first {
                        body.push(b',');
                    }
                    first = false;
                    serde_json::to_writer(&mut body, name).expect("strings serialise");
                    body.push(b':');
                    render::write_view(&mut body, &e.record_json, e, authorized, &at);
                }
            }
            body.extend_from_slice(b"},\"metadata\":");
            serde_json::to_writer(&mut body, &agg.summary(zone)).expect("summaries serialise");
            body.push(b'}');
        }
        body.push(b'}');
        let overall = totals.finish();
        let mut out = Vec::with_capacity(body.len() * 2 + 512);
        out.extend_from_slice(b"{\"zones\":");
        out.extend_from_slice(&body);
        out.extend_from_slice(b",\"metadata\":");
        serde_json::to_writer(&mut out, &overall).expect("summaries serialise");
        out.extend_from_slice(b",\"meshes\":");
        out.extend_from_slice(&body);
        out.push(b'}');
        out
    }

    /// Every known (zone, cluster): registered, or with reported instances.
    pub fn cluster_facts(&self) -> Vec<ClusterFacts> {
        let rules = self.memory.rules.identity;
        let now_ms = super::identity::now_ms();
        let mut out = Vec::new();
        for by_zone in self.memory.clusters.iter() {
            for (zone, e) in by_zone.iter() {
                let registered = e.record.is_some() && self.memory.zones.contains_key(zone);
                if !registered && e.instances.is_empty() && e.declared.is_none() {
                    continue;
                }
                let record = e.record.as_ref().filter(|_| registered);
                out.push(ClusterFacts {
                    zone: zone.clone(),
                    cluster: by_zone.key().clone(),
                    registered,
                    status: e.status,
                    owner: record.map(|r| r.owner.clone()).unwrap_or_default(),
                    instances: e.live(),
                    drifted: super::drift::drifted(e.instances.values()),
                    tls: super::identity::ClusterTls::of(e),
                    cert_expires_ms: super::identity::soonest_expiry(e, &rules, now_ms),
                    identity_state: super::identity::worst_state(e, &rules, now_ms),
                    dependencies: record
                        .map(|r| {
                            r.dependencies
                                .iter()
                                .filter_map(|d| meshcat_common::validate::dependency(zone, d))
                                .map(|(z, c)| (z.to_owned(), c.to_owned()))
                                .collect()
                        })
                        .unwrap_or_default(),
                });
            }
        }
        out
    }

    /// `GET /services`: registered clusters plus clusters agents report or edge
    /// sidecars know that nobody registered, sorted by (zoneName, clusterName).
    pub fn services(&self, zone: Option<&str>, authorized: bool) -> Vec<ClusterView> {
        let at = super::identity::IdentityAt::now(self.memory.rules.identity);
        let mut out: BTreeMap<(String, String), ClusterView> = BTreeMap::new();
        for by_zone in self.memory.clusters.iter() {
            for (z, e) in by_zone.iter() {
                if zone.is_some_and(|want| want != z) {
                    continue;
                }
                let record = match &e.record {
                    Some(r) => (**r).clone(),
                    None => ClusterRecord::new(z, by_zone.key(), by_zone.key()),
                };
                let view = render::view(&record, e, authorized, &at);
                out.insert((z.clone(), by_zone.key().clone()), view);
            }
        }
        let edges: Vec<(String, Vec<String>)> = self
            .memory
            .edge
            .iter()
            .filter(|e| zone.is_none_or(|want| want == e.key()))
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect();
        for (z, names) in edges {
            for name in names {
                out.entry((z.clone(), name.clone()))
                    .or_insert_with(|| ClusterView {
                        record: ClusterRecord::new(&z, &name, &name),
                        authorized,
                        instances: Vec::new(),
                        status: Status::Down,
                        control_plane: Default::default(),
                        identity: authorized.then(|| meshcat_common::identity::ClusterIdentity {
                            spiffe_ids: Vec::new(),
                            state: meshcat_common::identity::CertState::None,
                            expires_at_ms: None,
                        }),
                    });
            }
        }
        out.into_values().collect()
    }
}

/// The serde oracle of the rendered read paths: the same answers built as typed
/// views, slowly, for tests to compare with: `Oracle(&store).summary(true)`.
#[cfg(test)]
pub struct Oracle<'a>(pub &'a Store);

#[cfg(test)]
impl std::ops::Deref for Oracle<'_> {
    type Target = Store;

    fn deref(&self) -> &Store {
        self.0
    }
}

#[cfg(test)]
impl Oracle<'_> {
    /// The `GET /summary` body, serialized once per change generation.
    pub fn summary_body(&self, authorized: bool) -> Bytes {
        self.cached_body(Cached {
            kind: CachedKind::Summary,
            authorized,
            gzip: false,
        })
    }

    /// Registered clusters matching `keep`, sorted by (zoneName, clusterName).
    pub fn list_clusters(
        &self,
        authorized: bool,
        keep: impl Fn(&ClusterRecord, Status) -> bool,
    ) -> Vec<ClusterView> {
        let at = super::identity::IdentityAt::now(self.memory.rules.identity);
        let mut out: Vec<ClusterView> = Vec::new();
        for by_zone in self.memory.clusters.iter() {
            for e in by_zone.values() {
                if let Some(r) = &e.record
                    && keep(r, e.status)
                {
                    out.push(render::view(r, e, authorized, &at));
                }
            }
        }
        out.sort_unstable_by(|a, b| {
            (&a.record.zone_name, &a.record.cluster_name)
                .cmp(&(&b.record.zone_name, &b.record.cluster_name))
        });
        out
    }

    /// The registered clusters named `name`, one per zone (or only `zone`).
    pub fn get_cluster(
        &self,
        name: &str,
        zone: Option<&str>,
        authorized: bool,
    ) -> Vec<ClusterView> {
        let at = super::identity::IdentityAt::now(self.memory.rules.identity);
        let Some(by_zone) = self.memory.clusters.get(name) else {
            return Vec::new();
        };
        by_zone
            .iter()
            .filter(|(z, _)| zone.is_none_or(|want| want == z.as_str()))
            .filter_map(|(_, e)| {
                e.record
                    .as_ref()
                    .map(|r| render::view(r, e, authorized, &at))
            })
            .collect()
    }

    /// The seed 2.5 summary.
    pub fn summary(&self, authorized: bool) -> meshcat_common::model::Summary {
        let at = super::identity::IdentityAt::now(self.memory.rules.identity);
        use meshcat_common::model::{Summary, ZoneEntry};
        let zones = self.zone_snapshots();
        let mut totals = super::aggregate::OverallTotals::default();
        let mut out = BTreeMap::new();
        for (zone, agg, names) in zones {
            totals.add(&agg);
            let mut clusters = BTreeMap::new();
            for name in names {
                if let Some(by_zone) = self.memory.clusters.get(&name)
                    && let Some(e) = by_zone.get(&zone)
                    && let Some(r) = &e.record
                {
                    clusters.insert(name, render::view(r, e, authorized, &at));
                }
            }
            let metadata = agg.summary(&zone);
            out.insert(zone, ZoneEntry { clusters, metadata });
        }
        Summary {
            meshes: out.clone(),
            zones: out,
            metadata: totals.finish(),
        }
    }
}
