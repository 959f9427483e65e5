//! `GET /clusters/{clusterName}`, the catalog's most frequent read, answered in front
//! of the router.
//!
//! Every other request is routed by axum (the path's parameters decoded into the
//! request's extensions) and passes the layers of [`super::Shared`]: request metrics,
//! the time and concurrency limits, forwarding to the owning replica, the catalog
//! index, then the route's boxed handler and its extractors. Each is a future moved
//! into its parent or a box; for a read that is one map lookup and a record kept
//! serialized they cost more than the read itself (docs/benchmarks.md, "Instructions
//! per read, counted"). [`QuickReads`] answers a read of a cluster that needs none of
//! their choices synchronously, doing what each of them does for it:
//!
//! - it is the request the router would give that route: `GET` of `/clusters/` and
//!   one segment, which axum would decode into `clusterName`;
//! - it is counted and timed in the request metrics, under its route;
//! - it is refused `overloaded` when the concurrency limit is reached, by the limit's
//!   layer; below the limit it takes no permit, since a synchronous answer is in
//!   progress only while a worker thread runs it, and it has no point at which the
//!   time limit could stop it;
//! - it is served here, as the forwarding layer serves every cluster read: only a
//!   request about an instance goes to the replica that serves it;
//! - its answer carries the catalog index read before the record, as the index layer
//!   sets it;
//! - the record is the one the route's handler renders, by the same function
//!   ([`super::handlers::read_cluster`]), for the caller the read token says.
//!
//! Anything that needs a choice of those layers goes to the router, which answers it
//! as it answers every request: another method or path, a blocking query or any query
//! but one valid `zoneName`, a name that is not a valid name as written
//! (percent-encoded, too long, or with other characters: the route's extractor words
//! the error), a request a peer forwarded to a replica (its signature decides its
//! access), or no free permit (the limit's layer answers `overloaded`). The API tests
//! compare both paths' answers byte for byte.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::Router;
use axum::body::HttpBody;
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use futures::future::Either;
use meshcat_common::validate::is_valid_name;

use super::AppState;
use super::blocking::Index;
use super::forward::FORWARDED;
use super::limits::Limits;
use super::query::ZoneQuery;

/// The route answered here.
pub const ROUTE: &str = "/clusters/{clusterName}";

/// The API's service: a plain read of a cluster answered here, every other request
/// passed to the router. One `Arc`: hyper clones the service for each request, and
/// each count it moves is a cache line the worker threads pass between them.
#[derive(Clone)]
pub struct QuickReads(Arc<Inner>);

struct Inner {
    router: Router,
    state: Arc<AppState>,
    limits: Arc<Limits>,
}

impl std::fmt::Debug for QuickReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuickReads").finish_non_exhaustive()
    }
}

impl QuickReads {
    /// In front of `router`, the API's router over `state` held to `limits`.
    pub fn new(router: Router, state: Arc<AppState>, limits: Arc<Limits>) -> Self {
        QuickReads(Arc::new(Inner {
            router,
            state,
            limits,
        }))
    }
}

impl<B> tower::Service<axum::http::Request<B>> for QuickReads
where
    Router: tower::Service<axum::http::Request<B>, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<
        std::future::Ready<Result<Response, Infallible>>,
        <Router as tower::Service<axum::http::Request<B>>>::Future,
    >;

    /// Always ready, as the router is.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        let quick = &*self.0;
        if req.method() != Method::GET || !req.uri().path().starts_with(PREFIX) {
            return Either::Right(quick.router.clone().call(req));
        }
        let start = Instant::now();
        let (parts, body) = req.into_parts();
        match read(&quick.state, &quick.limits, &parts) {
            Some(res) => {
                let code = res.status().as_u16();
                let took = start.elapsed();
                quick.state.metrics.observe(ROUTE, "GET", code, took);
                #[cfg(test)]
                ANSWERED.with(|n| n.set(n.get() + 1));
                Either::Left(std::future::ready(Ok(res)))
            }
            None => Either::Right(quick.router.clone().call(Request::from_parts(parts, body))),
        }
    }
}

/// The path of [`ROUTE`] before its name.
const PREFIX: &str = "/clusters/";

/// The answer to a plain read of a cluster, or `None` for the router.
fn read(state: &AppState, limits: &Limits, parts: &Parts) -> Option<Response> {
    // One segment, as the route matches it, and the name axum's `Path` would decode
    // from it: a valid name has no '/' and nothing to decode.
    let name = parts
        .uri
        .path()
        .strip_prefix(PREFIX)
        .filter(|name| is_valid_name(name))?;
    // Only a replica judges a forwarded request by its signature; a lone aggregator
    // serves it as any other.
    if state.store.etcd().is_some() && parts.headers.contains_key(&FORWARDED) {
        return None;
    }
    let ZoneQuery { zone_name: zone } = ZoneQuery::parse(parts.uri.query()).ok()?;
    // Over the limit, the limit's layer refuses it. Under it, the read holds no
    // permit: it is in progress only while a worker thread runs it, start to end,
    // and taking one would make the threads contend for the limit's counter on
    // every read.
    if limits.in_flight.available_permits() == 0 {
        return None;
    }
    let index = Index::at(state.store.index());
    let authorized = state.tokens.reads(parts);
    let res = match super::handlers::read_cluster(state, name, zone.as_deref(), authorized) {
        Ok(res) => res,
        Err(e) => e.into_response(),
    };
    let mut res = index.answer(res);
    // Last, as axum's route sets it once the layers are done.
    if let Some(length) = HttpBody::size_hint(res.body()).exact() {
        res.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    Some(res)
}

#[cfg(test)]
thread_local! {
    /// Reads answered here on this thread, for the tests to tell which path answered.
    pub(super) static ANSWERED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}
