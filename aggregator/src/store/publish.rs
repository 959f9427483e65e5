//! What the catalog shows on the change feed ([`crate::changes`]): each change of
//! registrations, live instances or the graph's shape names what it touched
//! ([`Touch`]), and the index's `publish` renders those clusters and zones as they
//! are now, with the summary when it moved, as one change.

use std::sync::Arc;

use meshcat_common::model::OverallSummary;

use super::{Memory, Store, render};
use crate::changes::{Changes, Event};

/// What a change touched; the events are rendered from the state after it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Touch {
    /// A registered cluster, created, replaced, deleted, or whose live part moved.
    Cluster(String, String),
    /// A zone, created or deleted.
    Zone(String),
    /// The shape of a zone's part of the dependency graph.
    Graph(String),
}

impl Touch {
    pub fn cluster(zone: &str, cluster: &str) -> Touch {
        Touch::Cluster(zone.to_owned(), cluster.to_owned())
    }

    /// A deleted zone and the clusters that went with it.
    pub fn zone_and_clusters<'a>(
        zone: &str,
        clusters: impl IntoIterator<Item = &'a String>,
    ) -> Vec<Touch> {
        let mut out: Vec<Touch> = clusters
            .into_iter()
            .map(|c| Touch::cluster(zone, c))
            .collect();
        out.push(Touch::Zone(zone.to_owned()));
        out
    }
}

fn kind_json(v: &impl serde::Serialize) -> Vec<u8> {
    serde_json::to_vec(v).expect("events serialise")
}

impl Store {
    /// The change feed the catalog publishes on.
    pub fn changes(&self) -> &Arc<Changes> {
        &self.memory.changes
    }

    /// The catalog index.
    pub fn index(&self) -> u64 {
        self.memory.changes.index()
    }

    /// Moves the index and sends a `graph` event for each zone whose part of the
    /// dependency graph changed shape. Returns the index before the change and the
    /// change's own; nothing when no zone changed.
    pub fn graph_changed(&self, zones: &[String]) -> Option<(u64, u64)> {
        if zones.is_empty() {
            return None;
        }
        let touched: Vec<Touch> = zones.iter().map(|z| Touch::Graph(z.clone())).collect();
        let _st = super::shared(&self.memory.state);
        Some(self.memory.publish(&touched))
    }
}

impl Memory {
    /// Moves the index and publishes what `touched` shows now. Numbering, rendering
    /// and sending happen while the feed is held, so changes are numbered and sent
    /// in one order and each event shows the state after its change (or later). The
    /// caller holds no map guard of the catalog. A cluster or zone touched more than
    /// once (an agent gone with many instances of one cluster) gets one event.
    /// Returns the index before the change and the change's own.
    pub(super) fn publish(&self, touched: &[Touch]) -> (u64, u64) {
        let mut p = self.changes.begin(touched.len() + 1);
        let index = p.index();
        let mut seen = std::collections::HashSet::with_capacity(touched.len());
        for t in touched {
            if seen.insert(t) {
                p.push(self.event(t, index));
            }
        }
        p.summary(serde_json::to_vec(&self.overall()).expect("summaries serialise"));
        p.send()
    }

    /// Moves the index without events (loading, which nobody could have watched).
    pub(super) fn advance(&self) {
        self.changes
            .advance(|| serde_json::to_vec(&self.overall()).expect("summaries serialise"));
    }

    /// The event `t` shows now, as change `index`.
    fn event(&self, t: &Touch, index: u64) -> Event {
        match t {
            Touch::Zone(zone) => match self.zones.get(zone) {
                Some(z) => Event::new("zone", zone, None, index, &kind_json(&*z.record), None),
                None => Event::new(
                    "zone-deleted",
                    zone,
                    None,
                    index,
                    &kind_json(&serde_json::json!({ "zoneName": zone })),
                    None,
                ),
            },
            Touch::Cluster(zone, cluster) => {
                let at = super::identity::IdentityAt::now(self.rules.identity);
                let rendered = self.clusters.get(cluster).and_then(|m| {
                    m.get(zone).filter(|e| e.record.is_some()).map(|e| {
                        let mut auth = Vec::with_capacity(e.record_json.len() + 96);
                        render::write_view(&mut auth, &e.record_json, e, true, &at);
                        let mut unauth = Vec::with_capacity(e.record_json.len() + 64);
                        render::write_view(&mut unauth, &e.record_json, e, false, &at);
                        (auth, unauth)
                    })
                });
                match rendered {
                    Some((data, unauth)) => {
                        Event::new("cluster", zone, Some(cluster), index, &data, Some(&unauth))
                    }
                    None => Event::new(
                        "cluster-deleted",
                        zone,
                        Some(cluster),
                        index,
                        &kind_json(&serde_json::json!({
                            "clusterName": cluster,
                            "zoneName": zone,
                        })),
                        None,
                    ),
                }
            }
            Touch::Graph(zone) => Event::new(
                "graph",
                zone,
                None,
                index,
                &kind_json(&serde_json::json!({ "zoneName": zone })),
                None,
            ),
        }
    }

    /// The summary's `metadata`, from the per-zone counters only.
    fn overall(&self) -> OverallSummary {
        let mut totals = super::aggregate::OverallTotals::default();
        for z in self.zones.iter() {
            totals.add(&z.agg);
        }
        totals.finish()
    }
}
