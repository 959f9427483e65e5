//! The ops port: Prometheus text exposition at `GET /metrics`, liveness at
//! `GET /healthz`, readiness at `GET /readyz`. The exposition is the registry's
//! families, then (only with `--cluster-metrics`) the per-cluster and per-edge series
//! rendered from the graph's snapshot of the catalog's current index, gzip-compressed
//! when the scraper accepts it (Prometheus does). [`OpsConfig`] says which of those
//! series it exposes.
//!
//! The port has no token, so what it serves is bounded: a rendering is served to
//! every scrape until it is [`OpsConfig::render_max_age`] old (one render, and one
//! compression, per that time however many scrapers ask; concurrent scrapes wait for
//! the one render under way), and at most [`OpsConfig::max_scrapes`] scrapes are
//! served at once: past them a scrape answers 503 with `Retry-After` at once.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use meshcat_common::http::accepts_gzip;
use prometheus::{Encoder, TextEncoder};
use tokio::sync::{Mutex, Semaphore};
use tracing::error;

use crate::graph::snapshot::Graphs;
use crate::store::Store;
use crate::telemetry::{Telemetry, clusters};

/// `--cluster-metrics`: off, since the per-cluster and per-edge series name
/// clusters, owners and who calls whom on a port without a token.
pub const DEFAULT_CLUSTER_METRICS: bool = false;
/// How long one rendering of `/metrics` is served to every scrape: Prometheus scrapes
/// every 15 s or more by default, so a scrape sees figures at most this old.
pub const DEFAULT_RENDER_MAX_AGE: Duration = Duration::from_secs(5);
/// Scrapes of `/metrics` served at once (two Prometheus servers of an HA pair, with
/// room to spare); past them a scrape answers 503.
pub const DEFAULT_MAX_SCRAPES: usize = 4;

/// What the ops endpoints expose, and how often they render it.
#[derive(Debug, Clone, Copy)]
pub struct OpsConfig {
    /// `--cluster-metrics`: the per-cluster and per-edge series on `/metrics`.
    pub cluster_metrics: bool,
    /// How long a rendering of `/metrics` is served again ([`DEFAULT_RENDER_MAX_AGE`];
    /// zero renders every scrape).
    pub render_max_age: Duration,
    /// Most scrapes of `/metrics` served at once ([`DEFAULT_MAX_SCRAPES`]).
    pub max_scrapes: usize,
}

impl Default for OpsConfig {
    fn default() -> Self {
        OpsConfig {
            cluster_metrics: DEFAULT_CLUSTER_METRICS,
            render_max_age: DEFAULT_RENDER_MAX_AGE,
            max_scrapes: DEFAULT_MAX_SCRAPES,
        }
    }
}

/// One rendering of the exposition, and its gzip form once a scraper asked for it.
#[derive(Debug)]
struct Rendered {
    /// When its figures were read.
    at: Instant,
    plain: Bytes,
    gzip: Option<Bytes>,
}

/// The last rendering and the bound on scrapes.
#[derive(Debug)]
pub struct Renderings {
    max_age: Duration,
    /// Held while a rendering is read, made or compressed: scrapes that come during a
    /// render wait for it and are served what it made.
    last: Mutex<Option<Rendered>>,
    scrapes: Semaphore,
}

impl Renderings {
    pub fn new(config: &OpsConfig) -> Renderings {
        Renderings {
            max_age: config.render_max_age,
            last: Mutex::new(None),
            scrapes: Semaphore::new(config.max_scrapes),
        }
    }

    /// `Retry-After` of a scrape turned away: the rendering's age, at least 1 s.
    fn retry_after(&self) -> u64 {
        self.max_age.as_secs_f64().ceil().max(1.0) as u64
    }
}

/// What the ops endpoints read.
#[derive(Debug)]
pub struct OpsState {
    pub store: Arc<Store>,
    /// The live instances, whose certificates `meshcat_certificates` counts.
    pub instances: Arc<crate::store::Instances>,
    pub telemetry: Telemetry,
    /// Set once every listener serves; ready also needs the registrations loaded
    /// (at once with redb, after the first etcd listing with etcd).
    pub ready: AtomicBool,
    /// The graph's snapshots, which the per-cluster and per-edge series are rendered
    /// from; `None` without `--cluster-metrics`.
    pub cluster_series: Option<Arc<Graphs>>,
    /// The rendering served to scrapes, and the bound on them.
    pub renderings: Renderings,
    /// The sidecars' sync, rendered per cluster beside the cluster series.
    pub sync: Arc<crate::sync::Sync>,
}

impl OpsState {
    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && self.store.is_loaded()
    }

    /// The exposition, gzip-compressed when `gzip`: the last rendering while it is
    /// young enough, else a new one.
    async fn exposition(&self, gzip: bool) -> Result<Bytes, StatusCode> {
        let mut last = self.renderings.last.lock().await;
        let now = Instant::now();
        let young = last
            .as_ref()
            .is_some_and(|r| now.saturating_duration_since(r.at) < self.renderings.max_age);
        if !young {
            *last = None;
            let plain = self.render().await?;
            *last = Some(Rendered {
                at: now,
                plain,
                gzip: None,
            });
        }
        let Some(r) = last.as_mut() else {
            return Err(StatusCode::INTERNAL_SERVER_ERROR);
        };
        if !gzip {
            return Ok(r.plain.clone());
        }
        if let Some(z) = &r.gzip {
            return Ok(z.clone());
        }
        let plain = r.plain.clone();
        let z = match tokio::task::spawn_blocking(move || compress(&plain)).await {
            Ok(Ok(z)) => Bytes::from(z),
            Ok(Err(e)) => {
                error!(error = %e, "Metrics cannot be compressed.");
                return Err(StatusCode::INTERNAL_SERVER_ERROR);
            }
            Err(e) => {
                error!(error = %e, "Metrics cannot be compressed.");
                return Err(StatusCode::INTERNAL_SERVER_ERROR);
            }
        };
        r.gzip = Some(z.clone());
        Ok(z)
    }

    /// Renders the exposition: the registry's families, then the cluster and edge
    /// series when they are on.
    async fn render(&self) -> Result<Bytes, StatusCode> {
        // Counted first, so that the rendering carries its own count.
        self.telemetry.ops.renders.inc();
        self.telemetry.catalog.set(&self.store.totals());
        let identities = self.instances.clone();
        let counts = tokio::task::spawn_blocking(move || identities.identities().counts())
            .await
            .map_err(|e| {
                error!(error = %e, "Certificates cannot be counted.");
                StatusCode::INTERNAL_SERVER_ERROR
            })?;
        self.telemetry.catalog.set_certificates(&counts);
        self.telemetry.readiness.set(self.is_ready());
        self.telemetry.store.set(self.store.writable());
        let families = self.telemetry.registry.gather();
        let mut buf = Vec::with_capacity(16 * 1024);
        if let Err(e) = TextEncoder::new().encode(&families, &mut buf) {
            error!(error = %e, "Metrics cannot be encoded.");
            return Err(StatusCode::INTERNAL_SERVER_ERROR);
        }
        // Without a graph (its build failed, which is logged), the cluster and edge
        // series are left out and the process's own series still answer.
        let snapshot = match &self.cluster_series {
            Some(graphs) => graphs.fresh(&self.store).await.ok(),
            None => None,
        };
        let Some(snapshot) = snapshot else {
            return Ok(Bytes::from(buf));
        };
        // The snapshot is shared and immutable: it is walked without any lock, on the
        // blocking pool since a large catalog takes milliseconds.
        let counts = self.sync.counts();
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            clusters::render(snapshot.graph(), &mut buf);
            clusters::render_sync(
                &counts,
                |zone, cluster| store.record(zone, cluster).map(|r| r.owner.clone()),
                &mut buf,
            );
            Bytes::from(buf)
        })
        .await
        .map_err(|e| {
            error!(error = %e, "Metrics cannot be rendered.");
            StatusCode::INTERNAL_SERVER_ERROR
        })
    }
}

/// The ops router.
pub fn app(state: Arc<OpsState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(State(s): State<Arc<OpsState>>, headers: HeaderMap) -> Response {
    let Ok(_permit) = s.renderings.scrapes.try_acquire() else {
        s.telemetry.ops.busy.inc();
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [
                (header::RETRY_AFTER, s.renderings.retry_after().to_string()),
                (header::CONTENT_TYPE, "text/plain; charset=utf-8".to_owned()),
            ],
            "busy: too many scrapes at once\n",
        )
            .into_response();
    };
    // Prometheus asks for gzip: the cluster and edge series of a large catalog are
    // megabytes of text that compress some 40 times.
    let gzip = accepts_gzip(&headers);
    let body = match s.exposition(gzip).await {
        Ok(body) => body,
        Err(status) => return status.into_response(),
    };
    let mut res = (
        [
            (
                header::CONTENT_TYPE,
                TextEncoder::new().format_type().to_owned(),
            ),
            (header::VARY, "accept-encoding".to_owned()),
        ],
        body,
    )
        .into_response();
    if gzip {
        res.headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    res
}

/// `text` gzip-compressed, at the fast level: a scrape waits for it.
fn compress(text: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(text.len() / 8),
        flate2::Compression::fast(),
    );
    gz.write_all(text)?;
    gz.finish()
}

async fn readyz(State(s): State<Arc<OpsState>>) -> Response {
    if s.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use meshcat_common::model::{ClusterRecord, ZoneRecord};
    use tower::ServiceExt;

    use super::*;
    use crate::store::Rules;

    fn state(dir: &std::path::Path, config: OpsConfig) -> Arc<OpsState> {
        let (store, instances) = Store::open(dir, Rules::defaults()).unwrap();
        store
            .writes()
            .create_zone(ZoneRecord {
                zone_name: "z".into(),
                request_cluster: "edge".into(),
                server_address: "cp:50000".into(),
                use_tls: false,
                ca_path: String::new(),
                cert_path: String::new(),
                key_path: String::new(),
            })
            .unwrap();
        let mut c = ClusterRecord::new("z", "orders", "Orders");
        c.owner = "team-orders".into();
        store.writes().create_cluster(c).unwrap();
        let sync = Arc::new(crate::sync::Sync::new(
            Default::default(),
            store.changes().clone(),
            None,
        ));
        let instances = Arc::new(instances);
        Arc::new(OpsState {
            sync,
            instances: instances.clone(),
            store: Arc::new(store),
            telemetry: Telemetry::new().unwrap(),
            ready: AtomicBool::new(true),
            cluster_series: config
                .cluster_metrics
                .then(|| Arc::new(Graphs::new(instances.traffic().clone()))),
            renderings: Renderings::new(&config),
        })
    }

    /// Cluster series on, every scrape rendered afresh.
    fn every_scrape(cluster_metrics: bool) -> OpsConfig {
        OpsConfig {
            cluster_metrics,
            render_max_age: Duration::ZERO,
            ..OpsConfig::default()
        }
    }

    /// The per-cluster series, one rendering served for an hour, at most
    /// `max_scrapes` scrapes at once.
    fn an_hour(max_scrapes: usize) -> OpsConfig {
        OpsConfig {
            cluster_metrics: true,
            render_max_age: Duration::from_secs(3600),
            max_scrapes,
        }
    }

    async fn request(state: &Arc<OpsState>, gzip: bool) -> Response {
        let mut req = Request::get("/metrics");
        if gzip {
            req = req.header(header::ACCEPT_ENCODING, "gzip");
        }
        app(state.clone())
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    async fn scrape(state: &Arc<OpsState>, gzip: bool) -> (Option<String>, String) {
        let res = request(state, gzip).await;
        assert_eq!(res.status(), StatusCode::OK);
        let encoding = res
            .headers()
            .get(header::CONTENT_ENCODING)
            .map(|v| v.to_str().unwrap().to_owned());
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let text = if encoding.is_some() {
            let mut out = String::new();
            flate2::read::GzDecoder::new(&body[..])
                .read_to_string(&mut out)
                .unwrap();
            out
        } else {
            String::from_utf8(body.to_vec()).unwrap()
        };
        (encoding, text)
    }

    /// The renderings an exposition says were made, itself included.
    fn renders(text: &str) -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix("meshcat_ops_metrics_renders_total "))
            .map(|v| v.parse().unwrap())
    }

    #[tokio::test]
    async fn the_exposition_carries_the_cluster_series_gzipped_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let s = state(dir.path(), every_scrape(true));
        let (encoding, plain) = scrape(&s, false).await;
        assert_eq!(encoding, None);
        let down = r#"meshcat_cluster_status{zone="z",cluster="orders",owner="team-orders",status="down"} 1"#;
        assert!(plain.lines().any(|l| l == down), "{plain}");
        assert!(plain.lines().any(|l| l == "meshcat_ready 1"), "{plain}");
        let (encoding, unzipped) = scrape(&s, true).await;
        assert_eq!(encoding.as_deref(), Some("gzip"));
        // The same but for the count of renderings, one more.
        assert_eq!(renders(&unzipped), Some(2));
        assert_eq!(
            unzipped.replace("renders_total 2", "renders_total 1"),
            plain
        );

        // A deleted cluster's series are gone from the next rendering.
        s.store.writes().delete_cluster("z", "orders").unwrap();
        let (_, after) = scrape(&s, true).await;
        assert!(!after.contains("orders"), "{after}");
        assert!(after.contains("# TYPE meshcat_cluster_status gauge"));
    }

    #[tokio::test]
    async fn by_default_no_cluster_series_and_no_owner() {
        let dir = tempfile::tempdir().unwrap();
        let config = OpsConfig::default();
        assert!(!config.cluster_metrics);
        let (_, text) = scrape(&state(dir.path(), config), true).await;
        for f in clusters::FAMILIES {
            assert!(!text.contains(f.name), "{}:\n{text}", f.name);
        }
        assert!(!text.contains("orders"), "{text}");
        assert!(text.contains("meshcat_registered_clusters 1"), "{text}");
    }

    #[tokio::test]
    async fn scrapes_within_the_age_are_served_one_rendering() {
        let dir = tempfile::tempdir().unwrap();
        let s = state(dir.path(), an_hour(DEFAULT_MAX_SCRAPES));
        let (_, first) = scrape(&s, false).await;
        assert_eq!(renders(&first), Some(1), "{first}");
        // What a new rendering would show differently: a new cluster and owner.
        let mut c = ClusterRecord::new("z", "payments", "Payments");
        c.owner = "team-payments".into();
        s.store.writes().create_cluster(c).unwrap();
        let (_, second) = scrape(&s, false).await;
        assert_eq!(second, first);
        let (encoding, unzipped) = scrape(&s, true).await;
        assert_eq!(encoding.as_deref(), Some("gzip"));
        assert_eq!(unzipped, first);
        assert_eq!(s.telemetry.ops.renders.get(), 1);

        // Rendered at every scrape when the age is zero.
        let dir = tempfile::tempdir().unwrap();
        let s = state(dir.path(), every_scrape(true));
        for n in 1..=3 {
            let (_, text) = scrape(&s, n % 2 == 0).await;
            assert_eq!(renders(&text), Some(n), "{text}");
        }
    }

    #[tokio::test]
    async fn scrapes_past_the_bound_answer_503_and_the_others_share_one_rendering() {
        let dir = tempfile::tempdir().unwrap();
        let s = state(dir.path(), an_hour(4));
        // Holding the rendering keeps the scrapes that come in waiting for it.
        let held = s.renderings.last.lock().await;
        let waiting: Vec<_> = (0..4)
            .map(|i| {
                let s = s.clone();
                tokio::spawn(async move { scrape(&s, i % 2 == 0).await.1 })
            })
            .collect();
        let all_in = async {
            while s.renderings.scrapes.available_permits() > 0 {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), all_in)
            .await
            .expect("the 4 scrapes hold every slot");
        let res = request(&s, true).await;
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            res.headers().get(header::RETRY_AFTER).unwrap(),
            HeaderValue::from_static("3600")
        );
        assert_eq!(s.telemetry.ops.busy.get(), 1);
        drop(held);
        let mut bodies = Vec::new();
        for w in waiting {
            bodies.push(w.await.unwrap());
        }
        assert!(bodies.iter().all(|b| *b == bodies[0]));
        assert_eq!(renders(&bodies[0]), Some(1), "{}", bodies[0]);
        // Rendered after the refusal, which it counts.
        assert!(bodies[0].contains("meshcat_ops_metrics_busy_total 1"));
        // Once they are served, scrapes are admitted again.
        assert_eq!(request(&s, true).await.status(), StatusCode::OK);
    }
}
