//! The REST API's request time limit and concurrency limit (contract section 10).
//!
//! Both are one middleware so long-lived requests are told apart in one place: a
//! `GET /events` stream (bounded by `--max-event-streams`) and a blocking query that
//! waits (`GET` of an indexed read route whose `index` is the current index) are
//! exempt from both. Any other `index` (older, newer than this process issued, or
//! malformed) answers at once and is held to both like any read, and `index` on any
//! other route or method buys nothing. A request that runs a
//! debug window (`debugSeconds` on `GET /diagnose`, `seconds` on `POST .../debug-window`)
//! gets the window's length on top of the time limit. Over the concurrency limit a
//! request is answered 503 `overloaded` at once rather than queued, and one past its
//! time limit 503 `timeout`.

use std::future::Future;
use std::time::Duration;

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use super::blocking::{INDEXED, SYNC_ROUTE, blocking_query, waits};
use super::error::ApiError;
use crate::store::Store;
use crate::sync::Sync;

/// The limits every API request is held to.
#[derive(Debug)]
pub struct Limits {
    /// Time limit of an ordinary request.
    pub timeout: Duration,
    /// Permits of requests in progress.
    pub in_flight: Semaphore,
}

impl Limits {
    pub fn new(timeout: Duration, max_concurrency: usize) -> Self {
        Limits {
            timeout,
            in_flight: Semaphore::new(max_concurrency),
        }
    }
}

/// How a request is held to the limits.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    /// A stream or a blocking query: neither limit applies.
    LongLived,
    /// Limited, with this much extra time.
    Limited(Duration),
}

/// How a request with this method, matched route, path and query is held, the
/// catalog index being `current`.
fn kind(
    method: &Method,
    route: Option<&str>,
    path: &str,
    query: Option<&str>,
    current: u64,
) -> Kind {
    let get = method == Method::GET;
    if get && route == Some("/events") {
        return Kind::LongLived;
    }
    // Exempt only what `blocking::indexed` will wait on: the same parse, the same test.
    // Anything it answers at once (an older or newer index, a malformed query) is an
    // ordinary read.
    if get
        && route.is_some_and(|r| INDEXED.contains(&r))
        && let Ok(blocking) = blocking_query(query.unwrap_or(""))
        && let Some(index) = blocking.index
        && waits(index, current)
    {
        return Kind::LongLived;
    }
    let mut extra = Duration::ZERO;
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match &*k {
            "debugSeconds" => extra = extra.max(seconds(&v)),
            "seconds" if path.ends_with("/debug-window") => extra = extra.max(seconds(&v)),
            _ => {}
        }
    }
    Kind::Limited(extra)
}

/// A window length as the handlers accept it (1 to 300 s); anything else adds nothing,
/// since the handler refuses it at once.
fn seconds(v: &str) -> Duration {
    v.parse::<u64>()
        .ok()
        .filter(|n| (1..=u64::from(super::troubleshoot::MAX_DEBUG_SECONDS)).contains(n))
        .map_or(Duration::ZERO, Duration::from_secs)
}

/// Holds a request to the limits; `next` serves it.
pub async fn enforce<F: Future<Output = Response>>(
    limits: &Limits,
    store: &Store,
    sync: &Sync,
    req: Request,
    next: impl FnOnce(Request) -> F,
) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let Kind::Limited(extra) = kind(
        req.method(),
        route,
        req.uri().path(),
        req.uri().query(),
        if route == Some(SYNC_ROUTE) {
            sync.index()
        } else {
            store.index()
        },
    ) else {
        return next(req).await;
    };
    let Ok(_permit) = limits.in_flight.try_acquire() else {
        return ApiError::overloaded().into_response();
    };
    match tokio::time::timeout(limits.timeout + extra, next(req)).await {
        Ok(res) => res,
        Err(_) => ApiError::timeout().into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The catalog index of these tests.
    const NOW: u64 = 4;

    fn kind(method: &Method, route: Option<&str>, path: &str, query: Option<&str>) -> Kind {
        super::kind(method, route, path, query, NOW)
    }

    #[test]
    fn long_lived_requests_are_told_apart() {
        let get = |route: &str, query: Option<&str>| kind(&Method::GET, Some(route), route, query);
        assert_eq!(get("/events", None), Kind::LongLived);
        assert_eq!(get("/clusters", Some("index=4&wait=30s")), Kind::LongLived);
        assert_eq!(get("/zones", Some("index=4")), Kind::LongLived);
        assert_eq!(
            get("/clusters/{clusterName}", Some("zoneName=z&index=4")),
            Kind::LongLived
        );
        assert_eq!(
            get("/clusters", Some("zoneName=z")),
            Kind::Limited(Duration::ZERO)
        );
        // `wait` alone is refused by the route; it buys no exemption.
        assert_eq!(
            get("/zones", Some("wait=5s")),
            Kind::Limited(Duration::ZERO)
        );
        assert_eq!(
            get(
                "/diagnose/{clusterName}",
                Some("zoneName=z&debugSeconds=120")
            ),
            Kind::Limited(Duration::from_secs(120))
        );
        assert_eq!(
            kind(
                &Method::POST,
                Some("/zones/{zoneName}/clusters/{clusterName}/debug-window"),
                "/zones/z/clusters/c/debug-window",
                Some("seconds=30")
            ),
            Kind::Limited(Duration::from_secs(30))
        );
        assert_eq!(
            get("/diagnose/{clusterName}", Some("debugSeconds=100000")),
            Kind::Limited(Duration::ZERO)
        );
    }

    #[test]
    fn index_exempts_only_blocking_reads() {
        let limited = Kind::Limited(Duration::ZERO);
        // A write, a route without blocking queries, an unknown path, another method.
        assert_eq!(
            kind(
                &Method::POST,
                Some("/clusters"),
                "/clusters",
                Some("index=1")
            ),
            limited
        );
        let diag = "/diagnose/{clusterName}";
        assert_eq!(
            kind(&Method::GET, Some(diag), "/diagnose/c", Some("index=1")),
            limited
        );
        assert_eq!(
            kind(&Method::GET, None, "/nowhere", Some("index=1")),
            limited
        );
        assert_eq!(
            kind(&Method::POST, Some("/events"), "/events", None),
            limited
        );
        let metrics = "/metrics/{clusterName}/{instanceId}";
        assert_eq!(
            kind(&Method::GET, Some(metrics), "/metrics/c/i", Some("wait=1m")),
            limited
        );
    }

    /// Only a query that will wait is exempt: any other `index` answers at once and
    /// is an ordinary read, held to both limits.
    #[test]
    fn only_a_query_that_waits_is_exempt() {
        let limited = Kind::Limited(Duration::ZERO);
        let get = |query: &str| kind(&Method::GET, Some("/clusters"), "/clusters", Some(query));
        assert_eq!(get("index=4"), Kind::LongLived);
        assert_eq!(get("wait=1s&index=4"), Kind::LongLived);
        for query in [
            // Older: the data already moved past it.
            "index=0",
            "index=3&wait=10m",
            // Newer than this process issued: answered at once.
            "index=5",
            "index=18446744073709551615",
            // Malformed or repeated: 400 at once.
            "index=",
            "index=-1",
            "index=4x",
            "index=4&index=4",
            "index=4&wait=forever",
            "index=4&wait=1s&wait=2s",
        ] {
            assert_eq!(get(query), limited, "{query}");
        }
        // The same index on another route or method buys nothing.
        assert_eq!(
            kind(
                &Method::GET,
                Some("/openapi.json"),
                "/openapi.json",
                Some("index=4")
            ),
            limited
        );
        assert_eq!(
            kind(
                &Method::HEAD,
                Some("/clusters"),
                "/clusters",
                Some("index=4")
            ),
            limited
        );
    }
}
