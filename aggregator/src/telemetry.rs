//! meshcat's own metric families, each with its `register` function. Names carry the
//! `meshcat_` prefix, counters end in `_total`, durations are in seconds, and labels
//! stay low-cardinality (route templates, not paths). The one exception, the
//! per-cluster and per-edge series that alerts route by owner, is rendered from the
//! graph at each scrape ([`clusters`]).

pub mod clusters;

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use crate::store::Totals;
use meshcat_common::model::Status;

/// Metrics of the catalog API.
#[derive(Debug, Clone)]
pub struct ApiMetrics {
    /// Requests by route template, method and status code.
    requests: IntCounterVec,
    /// Request durations by route template and method.
    duration: HistogramVec,
    /// Open `GET /events` streams.
    pub event_streams: IntGauge,
    /// The request counter and duration histogram of each (route, method, code)
    /// answered so far: one lookup a request, where finding them in the families by
    /// their label values hashes the strings and locks each family's map.
    series: Arc<Series>,
}

type Series = DashMap<
    (&'static str, &'static str, u16),
    (IntCounter, Histogram),
    foldhash::fast::RandomState,
>;

/// Methods the API knows; any other is labelled `other` to bound cardinality.
const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"];

impl ApiMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<ApiMetrics> {
        let requests = IntCounterVec::new(
            Opts::new(
                "meshcat_api_requests_total",
                "Catalog API requests by route template, method and status code.",
            ),
            &["route", "method", "code"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "meshcat_api_request_duration_seconds",
                "Catalog API request durations by route template and method.",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5,
            ]),
            &["route", "method"],
        )?;
        let event_streams = IntGauge::new(
            "meshcat_event_streams",
            "Open GET /events streams (at most --max-event-streams).",
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(event_streams.clone()))?;
        Ok(ApiMetrics {
            requests,
            duration,
            event_streams,
            series: Arc::new(DashMap::with_hasher(Default::default())),
        })
    }

    /// Records one answered request.
    pub fn observe(&self, route: &'static str, method: &str, code: u16, took: Duration) {
        let method = METHODS
            .iter()
            .find(|m| **m == method)
            .copied()
            .unwrap_or("other");
        let key = (route, method, code);
        if let Some(series) = self.series.get(&key) {
            series.0.inc();
            series.1.observe(took.as_secs_f64());
            return;
        }
        let buf = itoa_code(code);
        let code = std::str::from_utf8(&buf).unwrap_or("000");
        let series = (
            self.requests.with_label_values(&[route, method, code]),
            self.duration.with_label_values(&[route, method]),
        );
        series.0.inc();
        series.1.observe(took.as_secs_f64());
        self.series.insert(key, series);
    }

    /// Requests answered so far on `route` by `method` with `code`.
    #[cfg(test)]
    pub fn count(&self, route: &str, method: &str, code: &str) -> u64 {
        self.requests
            .with_label_values(&[route, method, code])
            .get()
    }
}

/// A status code as three ASCII digits, without allocating.
fn itoa_code(code: u16) -> [u8; 3] {
    let c = code.min(999);
    [
        b'0' + (c / 100) as u8,
        b'0' + (c / 10 % 10) as u8,
        b'0' + (c % 10) as u8,
    ]
}

/// Gauges of the catalog's size, set from the store at each scrape.
#[derive(Debug, Clone)]
pub struct CatalogMetrics {
    zones: IntGauge,
    clusters: IntGauge,
    live_instances: IntGauge,
    clusters_by_status: IntGaugeVec,
    certificates: IntGaugeVec,
}

impl CatalogMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<CatalogMetrics> {
        let zones = IntGauge::new("meshcat_registered_zones", "Registered zones.")?;
        let clusters = IntGauge::new("meshcat_registered_clusters", "Registered clusters.")?;
        let live_instances = IntGauge::new(
            "meshcat_live_instances",
            "Instances reported within the TTL whose sidecar answered its last scrape.",
        )?;
        let clusters_by_status = IntGaugeVec::new(
            Opts::new(
                "meshcat_clusters_by_status",
                "Registered clusters by status.",
            ),
            &["status"],
        )?;
        registry.register(Box::new(zones.clone()))?;
        registry.register(Box::new(clusters.clone()))?;
        registry.register(Box::new(live_instances.clone()))?;
        registry.register(Box::new(clusters_by_status.clone()))?;
        let certificates = IntGaugeVec::new(
            Opts::new(
                "meshcat_certificates",
                "Certificates of the live instances by state (ok, expiring, rotation-overdue, expired; none counts no certificate and stays 0), read at the scrape.",
            ),
            &["state"],
        )?;
        for s in meshcat_common::identity::CertState::ALL {
            certificates.with_label_values(&[s.as_str()]);
        }
        registry.register(Box::new(certificates.clone()))?;
        Ok(CatalogMetrics {
            zones,
            clusters,
            live_instances,
            clusters_by_status,
            certificates,
        })
    }

    /// Sets `meshcat_certificates` from the counts by state.
    pub fn set_certificates(&self, counts: &[(meshcat_common::identity::CertState, u64)]) {
        for (state, n) in counts {
            self.certificates
                .with_label_values(&[state.as_str()])
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// Sets the gauges from the store's totals.
    pub fn set(&self, t: &Totals) {
        let g = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.zones.set(g(t.zones));
        self.clusters.set(g(t.clusters));
        self.live_instances.set(g(t.live_instances));
        for s in Status::ALL {
            self.clusters_by_status
                .with_label_values(&[s.as_str()])
                .set(g(t.by_status[crate::store::status_index(s)]));
        }
    }
}

/// Whether this aggregator is ready, as `GET /readyz` answers: an alert on a
/// replica that stays unready needs a series, not a probe.
#[derive(Debug, Clone)]
pub struct ReadinessMetrics {
    ready: IntGauge,
}

impl ReadinessMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<ReadinessMetrics> {
        let ready = IntGauge::new(
            "meshcat_ready",
            "1 while GET /readyz answers 200 (registrations loaded, listeners serving), else 0.",
        )?;
        registry.register(Box::new(ready.clone()))?;
        Ok(ReadinessMetrics { ready })
    }

    pub fn set(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }
}

/// Whether the registrations store takes writes, as its backend says at each
/// scrape: an alert on a full disk needs a series.
#[derive(Debug, Clone)]
pub struct StoreMetrics {
    writable: IntGauge,
}

impl StoreMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<StoreMetrics> {
        let writable = IntGauge::new(
            "meshcat_store_writable",
            "1 while the registrations store takes writes; 0 from a write refused for its storage (a full disk, etcd's space quota: answered 507 insufficient_storage) until it takes writes again.",
        )?;
        registry.register(Box::new(writable.clone()))?;
        Ok(StoreMetrics { writable })
    }

    pub fn set(&self, writable: bool) {
        self.writable.set(i64::from(writable));
    }
}

/// How the ops port's `/metrics` is served: renderings, each served to every scrape
/// until it is too old, and scrapes turned away past the bound.
#[derive(Debug, Clone)]
pub struct OpsMetrics {
    pub renders: IntCounter,
    pub busy: IntCounter,
}

impl OpsMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<OpsMetrics> {
        let renders = IntCounter::new(
            "meshcat_ops_metrics_renders_total",
            "Renderings of the ops port's /metrics; every scrape within a rendering's age is served that same body.",
        )?;
        let busy = IntCounter::new(
            "meshcat_ops_metrics_busy_total",
            "Scrapes of the ops port's /metrics answered 503 because as many as the bound were being served.",
        )?;
        registry.register(Box::new(renders.clone()))?;
        registry.register(Box::new(busy.clone()))?;
        Ok(OpsMetrics { renders, busy })
    }
}

/// Every family of the aggregator in one registry; other parts of the aggregator
/// register theirs into `registry` too.
#[derive(Debug, Clone)]
pub struct Telemetry {
    pub registry: Registry,
    pub api: ApiMetrics,
    pub catalog: CatalogMetrics,
    pub readiness: ReadinessMetrics,
    pub store: StoreMetrics,
    pub ops: OpsMetrics,
    pub peers: crate::store::peers::PeerSummaryChecks,
}

impl Telemetry {
    pub fn new() -> prometheus::Result<Telemetry> {
        let registry = Registry::new();
        let api = ApiMetrics::register(&registry)?;
        let catalog = CatalogMetrics::register(&registry)?;
        let readiness = ReadinessMetrics::register(&registry)?;
        let store = StoreMetrics::register(&registry)?;
        let ops = OpsMetrics::register(&registry)?;
        let peers = crate::store::peers::PeerSummaryChecks::register(&registry)?;
        Ok(Telemetry {
            registry,
            api,
            catalog,
            readiness,
            store,
            ops,
            peers,
        })
    }
}
