//! The catalog REST API (contract section 2): the route table, the router, the
//! layers every route shares (body limit, request metrics, JSON 404 and 405), and its
//! configuration ([`ApiConfig`]).

mod auth;
pub mod blocking;
mod certificates;
mod control;
mod diagnose;
#[cfg(test)]
mod differential;
mod error;
pub mod events;
pub mod forward;
mod graph;
mod handlers;
mod history;
pub mod limits;
mod logging;
pub mod openapi;
mod paths;
pub mod query;
mod quick;
pub mod responses;
mod status;
pub mod tls;
mod troubleshoot;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use meshcat_common::config::TlsFiles;

pub use auth::{CallerAccess, Tokens};
pub use error::ApiError;
pub use quick::QuickReads;

use crate::diagnosis::DiagnosisTools;
use crate::history::History;
use crate::ingest::Agents;
use crate::store::{Instances, Store};
use crate::telemetry::ApiMetrics;

/// Every (method, path template) the API serves. The router and the OpenAPI
/// document are both checked against this table.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/summary"),
    ("GET", "/clusters"),
    ("POST", "/clusters"),
    ("GET", "/clusters/{clusterName}"),
    ("PUT", "/clusters/{clusterName}"),
    ("DELETE", "/clusters/{clusterName}"),
    ("GET", "/clusters/{clusterName}/drift"),
    ("GET", "/clusters/{clusterName}/history"),
    ("GET", "/metrics/{clusterName}/{instanceId}"),
    ("GET", "/metrics/{name}/{version}/{instanceId}"),
    ("GET", "/zones"),
    ("POST", "/zones"),
    ("GET", "/zones/{zoneName}"),
    ("PUT", "/zones/{zoneName}"),
    ("DELETE", "/zones/{zoneName}"),
    ("GET", "/zones/{zoneName}/metadata"),
    ("GET", "/zones/{zoneName}/control"),
    ("GET", "/sync"),
    ("GET", "/services"),
    (
        "GET",
        "/zones/{zoneName}/clusters/{clusterName}/instances/{instanceId}/logging",
    ),
    (
        "PUT",
        "/zones/{zoneName}/clusters/{clusterName}/instances/{instanceId}/logging",
    ),
    ("PUT", "/zones/{zoneName}/clusters/{clusterName}/logging"),
    (
        "POST",
        "/zones/{zoneName}/clusters/{clusterName}/debug-window",
    ),
    ("GET", "/diagnose/{clusterName}"),
    ("GET", "/graph"),
    ("GET", "/history"),
    ("GET", "/certificates"),
    ("GET", "/status"),
    ("GET", "/openapi.json"),
    ("GET", "/events"),
];

/// What every handler shares.
#[derive(Debug)]
pub struct AppState {
    pub store: Arc<Store>,
    /// The live instances beside the catalog.
    pub instances: Arc<Instances>,
    /// The history, when it is on.
    pub history: Option<Arc<History>>,
    pub tokens: Tokens,
    pub metrics: ApiMetrics,
    /// How forwarded requests reach the other replicas (etcd store).
    pub peers: forward::Peers,
    /// Connected agents, for commands to sidecars; `None` when ingest is off.
    pub agents: Option<Agents>,
    /// The sidecar commands' deadline and the diagnosis's Prometheus client.
    pub diagnosis: DiagnosisTools,
    /// `GET /events`: the streams' bounds and the open streams.
    pub events: EventStreams,
    /// `GET /graph`: the latest graph snapshot, rebuilt by the graph watcher.
    pub graph: Arc<crate::graph::snapshot::Graphs>,
    /// The zones' control servers: their connections and views.
    pub controls: crate::control::Controls,
    /// Each sidecar's sync with its zone's control server.
    pub sync: Arc<crate::sync::Sync>,
}

/// The catalog REST API.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// `--api-addr`.
    pub addr: SocketAddr,
    /// `--api-tls-cert` and `--api-tls-key`: the API is served over HTTPS only.
    pub tls: Option<TlsFiles>,
    /// `--api-request-timeout`.
    pub request_timeout: Duration,
    /// `--api-max-concurrency`.
    pub max_concurrency: usize,
    /// `--max-body`.
    pub max_body: usize,
}

/// What `GET /events` streams share.
#[derive(Debug)]
pub struct EventStreams {
    /// Heartbeat, coalescing and buffer of each stream.
    pub config: events::EventsConfig,
    /// The open event streams, at most `--max-event-streams`.
    pub open: events::Streams,
    /// Turns true when the process stops: event streams end then, instead of holding
    /// the graceful shutdown until its drain timeout. A closed channel never stops them.
    pub stopping: tokio::sync::watch::Receiver<bool>,
}

impl EventStreams {
    pub fn new(config: events::EventsConfig, stopping: tokio::sync::watch::Receiver<bool>) -> Self {
        EventStreams {
            open: events::Streams::new(config.max_streams),
            config,
            stopping,
        }
    }
}

/// The API router over its state, with the default time and concurrency limits.
pub fn app(state: Arc<AppState>, max_body: usize) -> Router {
    app_with_limits(
        state,
        max_body,
        Arc::new(limits::Limits::new(
            DEFAULT_REQUEST_TIMEOUT,
            DEFAULT_MAX_CONCURRENCY,
        )),
    )
}

/// Default `--api-request-timeout`.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `--api-max-concurrency`.
pub const DEFAULT_MAX_CONCURRENCY: usize = 1024;

/// The API router over its state, held to `limits`.
pub fn app_with_limits(
    state: Arc<AppState>,
    max_body: usize,
    limits: Arc<limits::Limits>,
) -> Router {
    use diagnose as d;
    use handlers as h;
    use logging as l;
    Router::new()
        .route("/summary", get(h::summary))
        .route("/clusters", get(h::list_clusters).post(h::create_cluster))
        .route(
            "/clusters/{clusterName}",
            get(h::get_cluster)
                .put(h::replace_cluster)
                .delete(h::delete_cluster),
        )
        .route(
            "/metrics/{clusterName}/{instanceId}",
            get(h::metrics_by_cluster),
        )
        .route(
            "/metrics/{name}/{version}/{instanceId}",
            get(h::metrics_by_version),
        )
        .route("/zones", get(h::list_zones).post(h::create_zone))
        .route(
            "/zones/{zoneName}",
            get(h::get_zone).put(h::replace_zone).delete(h::delete_zone),
        )
        .route("/zones/{zoneName}/metadata", get(h::zone_metadata))
        .route("/zones/{zoneName}/control", get(control::zone_control))
        .route("/sync", get(control::sync))
        .route("/services", get(h::services))
        .route(
            "/zones/{zoneName}/clusters/{clusterName}/instances/{instanceId}/logging",
            get(l::get_instance_logging).put(l::put_instance_logging),
        )
        .route(
            "/zones/{zoneName}/clusters/{clusterName}/logging",
            put(l::put_cluster_logging),
        )
        .route(
            "/zones/{zoneName}/clusters/{clusterName}/debug-window",
            post(l::post_debug_window),
        )
        .route("/diagnose/{clusterName}", get(d::diagnose))
        .route("/graph", get(graph::graph))
        .route("/status", get(status::status))
        .route("/clusters/{clusterName}/drift", get(graph::drift))
        .route("/history", get(history::history))
        .route("/certificates", get(certificates::certificates))
        .route(
            "/clusters/{clusterName}/history",
            get(history::cluster_history),
        )
        .route("/openapi.json", get(h::openapi))
        .route(d::PEER_EVIDENCE, get(d::peer_evidence))
        .route(crate::replicas::PEER_TRAFFIC, get(graph::peer_traffic))
        .route(crate::replicas::PEER_SYNC, get(control::peer_sync))
        .route("/events", get(events::events))
        .fallback(no_route)
        // One layer (axum boxes every route again for each): the body limit, then
        // the rest.
        .layer(
            tower::ServiceBuilder::new()
                .layer(DefaultBodyLimit::max(max_body))
                .layer(SharedLayers(Arc::new((state.clone(), limits)))),
        )
        .with_state(state)
}

async fn no_route(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("No resource at {method} {}.", uri.path()))
}

/// The layers every route shares, in the order a request meets them: request
/// metrics ([`track`]), the time and concurrency limits ([`limits::enforce`]),
/// forwarding to the owning replica ([`forward::to_owner`]), the JSON 405
/// ([`json_method_not_allowed`]) and the catalog index with blocking queries
/// ([`blocking::indexed`]). One layer written as a service rather than five
/// `middleware::from_fn`: each of those clones the routes below it, boxes them and
/// boxes a future for every request, which cost a small read more than its answer
/// does (see docs/benchmarks.md, "Catalog API"). A plain read of a cluster is
/// answered before the router and these, doing what each does for it
/// ([`QuickReads`]).
#[derive(Clone)]
struct SharedLayers(Arc<(Arc<AppState>, Arc<limits::Limits>)>);

impl<S> tower::Layer<S> for SharedLayers {
    type Service = Shared<S>;

    fn layer(&self, inner: S) -> Shared<S> {
        Shared {
            inner,
            layers: self.clone(),
        }
    }
}

/// A route under [`SharedLayers`].
#[derive(Clone)]
struct Shared<S> {
    inner: S,
    layers: SharedLayers,
}

impl<S> tower::Service<Request> for Shared<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response;
    type Error = Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        // The service that was polled ready serves this request; a clone stays.
        let clone = self.inner.clone();
        let route = std::mem::replace(&mut self.inner, clone);
        let layers = self.layers.0.clone();
        Box::pin(async move {
            let (state, limits) = &*layers;
            Ok(track(state, req, |req| {
                limits::enforce(limits, &state.store, &state.sync, req, |req| {
                    serve(state, req, route)
                })
            })
            .await)
        })
    }
}

/// A request within the limits: passed on to the owning replica, or through the
/// catalog index to its route.
async fn serve<S>(state: &AppState, req: Request, mut route: S) -> Response
where
    S: tower::Service<Request, Response = Response, Error = Infallible>,
{
    let req = match forward::to_owner(state, req).await {
        Ok(req) => req,
        Err(answer) => return answer,
    };
    let res = match blocking::indexed(state, req).await {
        Ok((req, index)) => match route.call(req).await {
            Ok(res) => index.answer(res),
            Err(never) => match never {},
        },
        Err(refused) => refused,
    };
    json_method_not_allowed(res)
}

/// axum answers a wrong method with an empty 405; give it the error body.
fn json_method_not_allowed(res: Response) -> Response {
    if res.status() != StatusCode::METHOD_NOT_ALLOWED
        || res.headers().contains_key(header::CONTENT_TYPE)
    {
        return res;
    }
    let mut out = ApiError::method_not_allowed().into_response();
    // axum adds `Allow` outside the route's layers when it is not already there.
    if let Some(allow) = res.headers().get(header::ALLOW) {
        out.headers_mut().insert(header::ALLOW, allow.clone());
    }
    out
}

/// Counts requests by route template, method and status, and times them.
async fn track<F: Future<Output = Response>>(
    state: &AppState,
    req: Request,
    next: impl FnOnce(Request) -> F,
) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| route_label(p.as_str()));
    let method = req.method().clone();
    let start = Instant::now();
    let res = next(req).await;
    state.metrics.observe(
        route,
        method.as_str(),
        res.status().as_u16(),
        start.elapsed(),
    );
    res
}

/// Maps a matched path to its static template so labels stay low-cardinality.
fn route_label(path: &str) -> &'static str {
    ROUTES
        .iter()
        .find(|(_, p)| *p == path)
        .map_or("unmatched", |(_, p)| *p)
}

#[cfg(test)]
mod tests;
