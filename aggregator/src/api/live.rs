//! Live reads (contract section 11): the `X-Meshcat-Index` header and blocking
//! queries (`?index=&wait=`) on the catalog's read routes, and `GET /events`, the
//! Server-Sent Events stream of catalog changes.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{MatchedPath, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures::Stream;
use meshcat_common::validate::is_valid_name;
use tokio::sync::broadcast::error::RecvError;

use super::AppState;
use super::auth::Caller;
use super::error::ApiError;
use super::query;
use crate::store::changes::Change;

/// The index header of the read routes.
pub const INDEX_HEADER: &str = "x-meshcat-index";
/// How long a blocking query waits without `wait`.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(5 * 60);
/// The longest wait; longer ones are cut to it.
pub const MAX_WAIT: Duration = Duration::from_secs(10 * 60);
/// How often an idle event stream sends a comment line, by default.
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// Read routes that carry the index and accept blocking queries.
pub const INDEXED: &[&str] = &[
    "/summary",
    "/clusters",
    "/clusters/{clusterName}",
    "/zones",
    "/services",
];

/// Parses a wait such as `500ms`, `5s`, `2m`, `1h` or a bare number of seconds.
pub fn parse_wait(v: &str) -> Option<Duration> {
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (n, unit) = v.split_at(split);
    if n.is_empty() || n.len() > 12 {
        return None;
    }
    let n: u64 = n.parse().ok()?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60)?),
        "h" => Duration::from_secs(n.checked_mul(3600)?),
        _ => return None,
    };
    Some(d.min(MAX_WAIT))
}

/// Takes `index` and `wait` out of a query; returns them and what is left.
#[allow(clippy::type_complexity)]
fn split_blocking(raw: &str) -> Result<(Option<u64>, Option<Duration>, String), ApiError> {
    let mut index = None;
    let mut wait = None;
    let mut rest = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(raw.as_bytes()) {
        match k.as_ref() {
            "index" => {
                let n = v
                    .parse::<u64>()
                    .ok()
                    .filter(|_| index.is_none())
                    .ok_or_else(|| {
                        ApiError::bad_query("Query parameter index must be one unsigned integer.")
                    })?;
                index = Some(n);
            }
            "wait" => {
                let d = parse_wait(&v).filter(|_| wait.is_none()).ok_or_else(|| {
                    ApiError::bad_query(
                        "Query parameter wait must be one duration such as 500ms, 5s or 2m.",
                    )
                })?;
                wait = Some(d);
            }
            _ => {
                rest.append_pair(&k, &v);
            }
        }
    }
    Ok((index, wait, rest.finish()))
}

/// Layer of the read routes: waits out a blocking query, then answers with the
/// index the data was read at.
pub async fn indexed(State(s): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let on_route = req.method() == Method::GET
        && req
            .extensions()
            .get::<MatchedPath>()
            .is_some_and(|p| INDEXED.contains(&p.as_str()));
    if !on_route {
        return next.run(req).await;
    }
    if let Some(raw) = req.uri().query().map(str::to_owned) {
        let (index, wait, rest) = match split_blocking(&raw) {
            Ok(v) => v,
            Err(e) => return e.into_response(),
        };
        if wait.is_some() && index.is_none() {
            return ApiError::bad_query("Query parameter wait needs index.").into_response();
        }
        // An index above this process's own was not issued by it (it comes from
        // before a restart or from another replica): waiting for it could last the
        // whole wait while the catalog changes, so the answer is immediate.
        if let Some(after) = index.filter(|after| *after <= s.store.index()) {
            let mut watch = s.store.changes().watch();
            let wait = wait.unwrap_or(DEFAULT_WAIT);
            // Timing out is an answer too: the unchanged index tells the client so.
            let _ = tokio::time::timeout(wait, watch.wait_for(|i| *i > after)).await;
        }
        let path = req.uri().path();
        let pq = if rest.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{rest}")
        };
        if let Ok(uri) = Uri::try_from(pq) {
            *req.uri_mut() = uri;
        }
    }
    let index = s.store.index();
    let mut res = next.run(req).await;
    if res.status().is_success() {
        res.headers_mut()
            .insert(INDEX_HEADER, HeaderValue::from(index));
    }
    res
}

/// What a stream shows: all events, or those of one zone and/or one cluster.
#[derive(Debug, Default)]
struct Filter {
    zone: Option<String>,
    cluster: Option<String>,
}

impl Filter {
    fn admits(&self, e: &crate::store::changes::Event) -> bool {
        if e.kind == "summary" {
            return self.zone.is_none() && self.cluster.is_none();
        }
        if self.zone.as_ref().is_some_and(|z| *z != e.zone) {
            return false;
        }
        match &self.cluster {
            None => true,
            Some(c) => e.cluster.as_ref() == Some(c),
        }
    }
}

/// What one change shows a stream: its admitted events' frames, joined (one write).
fn render(change: &Change, filter: &Filter, authorized: bool) -> Option<Bytes> {
    let mut frames = change.events.iter().filter(|e| filter.admits(e)).map(|e| {
        match (&e.frame_unauthorized, authorized) {
            (Some(f), false) => f,
            _ => &e.frame,
        }
    });
    let first = frames.next()?;
    let Some(second) = frames.next() else {
        // The common case: the shared frame itself, no copy.
        return Some(first.clone());
    };
    let mut out = BytesMut::from(&first[..]);
    out.extend_from_slice(second);
    for f in frames {
        out.extend_from_slice(f);
    }
    Some(out.freeze())
}

/// Tells the client to refetch; the stream ends after it.
const RESET: &[u8] = b"event: reset\ndata: {}\n\n";
/// The keep-alive comment line of an idle stream.
const COMMENT: &[u8] = b":\n\n";

/// `GET /events`.
pub async fn events(
    State(s): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let mut filter = Filter::default();
    let mut since = None;
    for (k, v) in query::parse(q.as_deref(), &["zoneName", "clusterName", "since"])? {
        let slot = match k.as_str() {
            "zoneName" => &mut filter.zone,
            "clusterName" => &mut filter.cluster,
            _ => {
                let n = v
                    .parse::<u64>()
                    .ok()
                    .filter(|_| since.is_none())
                    .ok_or_else(|| {
                        ApiError::bad_query("Query parameter since must be one unsigned integer.")
                    })?;
                since = Some(n);
                continue;
            }
        };
        if slot.is_some() || !is_valid_name(&v) {
            return Err(ApiError::bad_query(format!(
                "Query parameter {k} must be given once, 1 to 253 characters of letters, digits, '.', '_' and '-'."
            )));
        }
        *slot = Some(v);
    }
    if let Some(v) = headers.get("last-event-id") {
        // A header the client echoes back: ignore one that is not ours rather than fail.
        if let Some(n) = v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()) {
            since = since.or(Some(n));
        }
    }
    let sub = s.store.changes().subscribe(since);
    let stream = event_stream(sub, filter, caller.authorized, s.event_heartbeat);
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// The body of one stream: the replay (or `reset`), then each change's frames as
/// one chunk, a comment line after `heartbeat` without a write, and `reset` then
/// the end when the stream fell behind the bounded feed.
fn event_stream(
    sub: crate::store::changes::Subscription,
    filter: Filter,
    authorized: bool,
    heartbeat: Duration,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    enum St {
        Replay(std::vec::IntoIter<Bytes>),
        Live,
        Done,
    }
    let first: Vec<Bytes> = match &sub.replay {
        Some(changes) => changes
            .iter()
            .filter_map(|c| render(c, &filter, authorized))
            .collect(),
        None => vec![Bytes::from_static(RESET)],
    };
    let live = sub.replay.is_some();
    let state = (St::Replay(first.into_iter()), sub.feed, filter, live);
    futures::stream::unfold(state, move |(st, mut feed, filter, live)| async move {
        let mut st = st;
        // The comment is due `heartbeat` after the last write, whatever changes the
        // filter left out meanwhile.
        let due = tokio::time::Instant::now() + heartbeat;
        loop {
            match st {
                St::Replay(mut it) => match it.next() {
                    Some(b) => return Some((Ok(b), (St::Replay(it), feed, filter, live))),
                    None if live => st = St::Live,
                    None => return None,
                },
                // Receiving is cancel-safe: a change is never lost to the timeout.
                St::Live => match tokio::time::timeout_at(due, feed.recv()).await {
                    Err(_) => {
                        return Some((
                            Ok(Bytes::from_static(COMMENT)),
                            (St::Live, feed, filter, live),
                        ));
                    }
                    Ok(Ok(change)) => {
                        if let Some(b) = render(&change, &filter, authorized) {
                            return Some((Ok(b), (St::Live, feed, filter, live)));
                        }
                    }
                    // Fallen behind the bounded feed: tell the client to refetch, then
                    // close, so nothing piles up for it.
                    Ok(Err(RecvError::Lagged(_))) => {
                        return Some((
                            Ok(Bytes::from_static(RESET)),
                            (St::Done, feed, filter, live),
                        ));
                    }
                    Ok(Err(RecvError::Closed)) => return None,
                },
                St::Done => return None,
            }
        }
    })
}
