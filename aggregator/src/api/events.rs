//! Live reads (contract section 11): the `X-Meshcat-Index` header and blocking
//! queries (`?index=&wait=`) on the catalog's read routes, and `GET /events`, the
//! Server-Sent Events stream of catalog changes, bounded in number
//! (`--max-event-streams`) and in what each may queue (`--event-buffer`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{MatchedPath, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::Stream;
use meshcat_common::validate::is_valid_name;
use prometheus::IntGauge;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, ErrorBody};
use super::query;
use crate::store::changes::{Change, Event};

/// The index header of the read routes.
pub const INDEX_HEADER: &str = "x-meshcat-index";
/// How long a blocking query waits without `wait`.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(5 * 60);
/// The longest wait; longer ones are cut to it.
pub const MAX_WAIT: Duration = Duration::from_secs(10 * 60);
/// How often an event stream sends a comment line, by default.
pub const HEARTBEAT: Duration = Duration::from_secs(15);
/// How long an event stream gathers changes after a write, by default: at 1,000
/// streams and 100 changes/s it halves the aggregator's CPU (see
/// `docs/benchmarks.md`) and keeps an event within the 100 ms the contract allows.
pub const COALESCE: Duration = Duration::from_millis(50);
/// Bytes one event stream may queue, by default (`--event-buffer`).
pub const BUFFER: usize = 256 << 10;
/// Event streams open at once, by default (`--max-event-streams`).
pub const MAX_STREAMS: usize = 1024;

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

/// Sets `slot` from query parameter `name`: one unsigned integer, given once.
fn set_once_u64(name: &str, v: &str, slot: &mut Option<u64>) -> Result<(), ApiError> {
    let n = v
        .parse::<u64>()
        .ok()
        .filter(|_| slot.is_none())
        .ok_or_else(|| {
            ApiError::bad_query(format!(
                "Query parameter {name} must be one unsigned integer."
            ))
        })?;
    *slot = Some(n);
    Ok(())
}

/// The blocking-query parameters of the read routes in [`INDEXED`].
#[derive(Debug, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BlockingQuery {
    /// Blocking query: answer once the catalog index exceeds this (or after wait).
    pub index: Option<u64>,
    /// Longest wait of a blocking query, such as 500ms, 5s or 2m (default 5m, at most
    /// 10m).
    #[param(value_type = Option<String>, pattern = "^[0-9]{1,12}(ms|s|m|h)?$")]
    pub wait: Option<Duration>,
}

/// Takes `index` and `wait` out of a query; returns them and what is left.
pub(super) fn split_blocking(raw: &str) -> Result<(BlockingQuery, String), ApiError> {
    let mut index = None;
    let mut wait = None;
    let mut rest = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(raw.as_bytes()) {
        match k.as_ref() {
            "index" => set_once_u64("index", &v, &mut index)?,
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
    Ok((BlockingQuery { index, wait }, rest.finish()))
}

/// Whether a blocking query for `index` waits, the catalog index being `current`.
/// Only the current index waits: the data has moved past an older one, and a newer
/// one was not issued by this process (it comes from before a restart or from
/// another replica), so waiting for it could last the whole wait while the catalog
/// changes. Both answer at once. The limits middleware exempts exactly these.
pub fn waits(index: u64, current: u64) -> bool {
    index == current
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
        let (BlockingQuery { index, wait }, rest) = match split_blocking(&raw) {
            Ok(v) => v,
            Err(e) => return e.into_response(),
        };
        if wait.is_some() && index.is_none() {
            return ApiError::bad_query("Query parameter wait needs index.").into_response();
        }
        // Any other index answers at once (see `waits`).
        if let Some(after) = index.filter(|after| waits(*after, s.store.index())) {
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
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Filter {
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

/// The frame of `e` a caller sees: the read-token one or the anonymous one.
fn frame_of(e: &Event, authorized: bool) -> &Bytes {
    match (&e.frame_unauthorized, authorized) {
        (Some(f), false) => f,
        _ => &e.frame,
    }
}

/// What a stream writes next: nothing, one shared frame (no copy, the common case),
/// or several frames joined, never more than the stream's buffer.
#[derive(Debug, Default)]
enum Chunk {
    #[default]
    Empty,
    One(Bytes),
    Many(Vec<u8>),
}

impl Chunk {
    fn len(&self) -> usize {
        match self {
            Chunk::Empty => 0,
            Chunk::One(b) => b.len(),
            Chunk::Many(m) => m.len(),
        }
    }

    /// Adds `frame`; a joined chunk grows by doubling, but never past `limit` (or
    /// what it holds, if more) in capacity.
    fn push(&mut self, frame: &Bytes, limit: usize) {
        *self = match std::mem::take(self) {
            Chunk::Empty => Chunk::One(frame.clone()),
            Chunk::One(first) => {
                let mut many = Vec::with_capacity(first.len() + frame.len());
                many.extend_from_slice(&first);
                many.extend_from_slice(frame);
                Chunk::Many(many)
            }
            Chunk::Many(mut many) => {
                let need = many.len() + frame.len();
                if need > many.capacity() {
                    let grown = (many.capacity() * 2).min(limit).max(need);
                    many.reserve_exact(grown - many.len());
                }
                many.extend_from_slice(frame);
                Chunk::Many(many)
            }
        }
    }

    /// Appends what one change shows a stream (its admitted events' frames) from
    /// its event `from` on, while the chunk stays within `limit` bytes: answers the
    /// first event left out, if any. A frame is always taken into an empty chunk
    /// (alone it is shared, not copied), so every call makes progress.
    fn append(
        &mut self,
        change: &Change,
        from: usize,
        filter: &Filter,
        authorized: bool,
        limit: usize,
    ) -> Option<usize> {
        for (i, e) in change.events.iter().enumerate().skip(from) {
            if !filter.admits(e) {
                continue;
            }
            let frame = frame_of(e, authorized);
            if !self.is_empty() && self.len() + frame.len() > limit {
                return Some(i);
            }
            self.push(frame, limit);
        }
        None
    }

    fn is_empty(&self) -> bool {
        matches!(self, Chunk::Empty)
    }

    fn into_bytes(self) -> Option<Bytes> {
        match self {
            Chunk::Empty => None,
            Chunk::One(b) => Some(b),
            Chunk::Many(m) => Some(Bytes::from(m)),
        }
    }
}

/// A replay larger than the stream's buffer: the stream sends `reset` instead.
#[derive(Debug, PartialEq, Eq)]
struct TooLarge;

/// The replay of `changes` for one stream: the frames it admits, joined (`None`
/// when there are none), or [`TooLarge`] when they come to more than `limit` bytes.
/// The size is summed first, stopping at the first frame past the limit, so nothing
/// is copied for a replay that does not fit and a replay that fits is copied once.
fn replay(
    changes: &[Arc<Change>],
    filter: &Filter,
    authorized: bool,
    limit: usize,
) -> Result<Option<Bytes>, TooLarge> {
    let frames = || {
        changes
            .iter()
            .flat_map(|c| c.events.iter())
            .filter(|e| filter.admits(e))
            .map(|e| frame_of(e, authorized))
    };
    let (mut count, mut len) = (0usize, 0usize);
    for f in frames() {
        count += 1;
        len += f.len();
        if len > limit {
            return Err(TooLarge);
        }
    }
    Ok(match count {
        0 => None,
        // One frame: shared, not copied.
        1 => frames().next().cloned(),
        _ => {
            let mut out = Vec::with_capacity(len);
            for f in frames() {
                out.extend_from_slice(f);
            }
            Some(Bytes::from(out))
        }
    })
}

/// Tells the client to refetch; the stream ends after it.
const RESET: &[u8] = b"event: reset\ndata: {}\n\n";
/// The keep-alive comment line of an idle stream.
const COMMENT: &[u8] = b":\n\n";

/// The open event streams: at most `--max-event-streams`, counted in
/// `meshcat_event_streams`.
#[derive(Debug, Clone)]
pub struct Streams {
    permits: Arc<Semaphore>,
}

impl Streams {
    pub fn new(max: usize) -> Streams {
        Streams {
            permits: Arc::new(Semaphore::new(max)),
        }
    }

    /// A place for one more stream, or `None` when all are taken.
    fn open(&self, gauge: &IntGauge) -> Option<Slot> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        gauge.inc();
        Some(Slot {
            _permit: permit,
            gauge: gauge.clone(),
        })
    }
}

/// One open stream's place: its body holds it, so it is given back when the stream
/// ends or the client goes away (the body is dropped either way).
#[derive(Debug)]
struct Slot {
    _permit: OwnedSemaphorePermit,
    gauge: IntGauge,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// Over `--max-event-streams`.
fn too_many_streams() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        "Too many event streams are open; try again shortly.",
    )
}

/// An event id as `?since=` or `Last-Event-ID` give it (the header trimmed of
/// blanks first): one unsigned integer in ASCII digits. Anything else (longer than a
/// u64 can be, a sign, other characters) is `None`; nothing is allocated.
pub fn parse_event_id(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // u64::MAX has 20 digits: past leading zeros, a longer value cannot be one.
    let significant = &v[v.iter().position(|b| *b != b'0').unwrap_or(v.len())..];
    if significant.len() > 20 {
        return None;
    }
    significant.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// What a `GET /events` asks for: its filter and the id it resumes after, from its
/// query and its `Last-Event-ID` header (`?since=` wins). A malformed query is an
/// error; a malformed header is ignored (the client echoes back what it was sent).
pub fn parse_request(
    query: Option<&str>,
    last_event_id: Option<&[u8]>,
) -> Result<(Filter, Option<u64>), ApiError> {
    let q = EventsQuery::parse(query)?;
    let filter = Filter {
        zone: q.zone_name,
        cluster: q.cluster_name,
    };
    let since = q
        .since
        .or_else(|| last_event_id.and_then(|v| parse_event_id(v.trim_ascii())));
    Ok((filter, since))
}

/// The query of `GET /events`.
#[derive(Debug, Default, IntoParams)]
#[into_params(parameter_in = Query, rename_all = "camelCase")]
pub struct EventsQuery {
    /// Only the events of this zone.
    pub zone_name: Option<String>,
    /// Only the events of this cluster.
    pub cluster_name: Option<String>,
    /// Replay the changes after this index (like Last-Event-ID).
    pub since: Option<u64>,
}

impl EventsQuery {
    /// Parses the query alone; a malformed one is an error naming the parameter.
    pub fn parse(query: Option<&str>) -> Result<EventsQuery, ApiError> {
        let mut q = EventsQuery::default();
        let since = &mut q.since;
        for (k, v) in query::parse(query, &["zoneName", "clusterName", "since"])? {
            let slot = match k.as_str() {
                "zoneName" => &mut q.zone_name,
                "clusterName" => &mut q.cluster_name,
                _ => {
                    let n = parse_event_id(v.as_bytes())
                        .filter(|_| since.is_none())
                        .ok_or_else(|| {
                            ApiError::bad_query(
                                "Query parameter since must be one unsigned integer.",
                            )
                        })?;
                    *since = Some(n);
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
        Ok(q)
    }
}

/// One event of the stream as the document describes it: an `event:` line, a `data:`
/// line and, except `reset`, the index of its change as `id:`.
#[derive(Debug, ToSchema)]
pub struct StreamEvent {
    #[schema(inline)]
    pub event: StreamEventName,
    /// JSON: a cluster as in GET /clusters, {clusterName, zoneName}, a zone record,
    /// {zoneName}, the summary's metadata, or {} for reset.
    pub data: String,
    #[schema(pattern = "^[0-9]+$")]
    pub id: Option<String>,
}

/// The names of the stream's events.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "kebab-case")]
pub enum StreamEventName {
    Cluster,
    ClusterDeleted,
    Zone,
    ZoneDeleted,
    Summary,
    Reset,
}

/// `GET /events`.
#[utoipa::path(
    get,
    path = "/events",
    summary = "Server-Sent Events stream of catalog changes: cluster, cluster-deleted, zone, zone-deleted, summary and reset events, each with the change's index as id.",
    params(
        EventsQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this index (`since` wins)."),
    ),
    responses(
        (status = 200, description = "The event stream; comment lines keep an idle stream open.", body = StreamEvent, content_type = "text/event-stream"),
        (status = 400, description = "Malformed query.", body = ErrorBody),
        (status = 503, description = "Too many event streams open (--max-event-streams).", body = ErrorBody),
    )
)]
pub async fn events(
    State(s): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let last_event_id = headers.get("last-event-id").map(HeaderValue::as_bytes);
    let (filter, since) = parse_request(q.as_deref(), last_event_id)?;
    let slot = s
        .events
        .open
        .open(&s.metrics.event_streams)
        .ok_or_else(too_many_streams)?;
    let sub = s.store.changes().subscribe(since);
    let stream = event_stream(
        sub,
        filter,
        caller.authorized,
        Bounds {
            heartbeat: s.events.config.heartbeat,
            coalesce: s.events.config.coalesce,
            buffer: s.events.config.buffer,
        },
        s.events.stopping.clone(),
        Some(slot),
    );
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// How a stream paces and bounds what it writes.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    /// A comment line after this long without a write.
    heartbeat: Duration,
    /// How long changes are gathered after a write.
    coalesce: Duration,
    /// The most bytes the stream queues: its replay, or one chunk of live changes.
    buffer: usize,
}

/// The body of one stream: the replay (or `reset`) in one chunk, then the changes'
/// frames, a comment line every `heartbeat`, `reset` then the end when the stream
/// fell behind the bounded feed, and the end when the process stops. A replay
/// larger than `buffer` is `reset` and the end.
///
/// Writes are coalesced: a change that arrives `coalesce` or more after the stream's
/// last write is written at once; one that arrives sooner waits until `coalesce`
/// after that write, and goes out in one chunk with every change that arrived
/// meanwhile. An isolated change is never delayed, and under a steady flow a stream
/// costs one wake and one write per `coalesce`, not one per change. A chunk never
/// joins more than `buffer` bytes: what does not fit (the rest of a bulk write's
/// change, the changes after it) is written next, as soon as the client takes the
/// chunk, and stays meanwhile in the shared feed, not in the stream.
fn event_stream(
    sub: crate::store::changes::Subscription,
    filter: Filter,
    authorized: bool,
    bounds: Bounds,
    mut stopping: tokio::sync::watch::Receiver<bool>,
    slot: Option<Slot>,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    use tokio::sync::broadcast::error::TryRecvError;
    use tokio::time::Instant;
    let Bounds {
        heartbeat,
        coalesce,
        buffer,
    } = bounds;
    struct Live {
        feed: tokio::sync::broadcast::Receiver<Arc<Change>>,
        filter: Filter,
        /// The keep-alive: a comment every `heartbeat`, a timer per stream rather than
        /// a timeout per change (a stream takes one timer registration per
        /// heartbeat, not one per change it waits for).
        beat: tokio::time::Interval,
        /// Resolves when the process stops.
        stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
        last_write: Instant,
        /// A change whose events did not all fit in the last chunk, and the first
        /// event left out: written first, at once.
        carry: Option<(Arc<Change>, usize)>,
        done: bool,
        /// The stream's place among `--max-event-streams`, given back with the body.
        _slot: Option<Slot>,
    }
    impl Live {
        /// Appends `change` from its event `from` to `out`, keeping what does not fit.
        fn take(
            &mut self,
            out: &mut Chunk,
            change: Arc<Change>,
            from: usize,
            authorized: bool,
            buffer: usize,
        ) {
            if let Some(rest) = out.append(&change, from, &self.filter, authorized, buffer) {
                self.carry = Some((change, rest));
            }
        }
    }
    let (first, done) = match &sub.replay {
        Some(changes) => match replay(changes, &filter, authorized, buffer) {
            Ok(first) => (first, false),
            Err(TooLarge) => (Some(Bytes::from_static(RESET)), true),
        },
        None => (Some(Bytes::from_static(RESET)), true),
    };
    // The replayed changes are not held past this point.
    drop(sub.replay);
    let mut beat = tokio::time::interval_at(Instant::now() + heartbeat, heartbeat);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop = Box::pin(async move {
        if stopping.wait_for(|s| *s).await.is_err() {
            // Nobody can stop it any more: never.
            std::future::pending::<()>().await;
        }
    });
    let live = Live {
        feed: sub.feed,
        filter,
        beat,
        stop,
        // Long enough ago that the first change goes out at once.
        last_write: Instant::now() - coalesce,
        carry: None,
        done,
        _slot: slot,
    };
    let replay = futures::stream::iter(first.map(Ok));
    let follow = futures::stream::unfold(live, move |mut l| async move {
        if l.done {
            return None;
        }
        let mut out = Chunk::Empty;
        if let Some((change, from)) = l.carry.take() {
            // The rest of what was gathered: it was due with the last write.
            l.take(&mut out, change, from, authorized, buffer);
        } else {
            loop {
                // Both are cancel-safe: a change is never lost to the heartbeat.
                tokio::select! {
                    biased;
                    r = l.feed.recv() => match r {
                        Ok(change) => l.take(&mut out, change, 0, authorized, buffer),
                        // Fallen behind the bounded feed: tell the client to refetch,
                        // then close, so nothing piles up for it.
                        Err(RecvError::Lagged(_)) => {
                            l.done = true;
                            return Some((Ok(Bytes::from_static(RESET)), l));
                        }
                        Err(RecvError::Closed) => return None,
                    },
                    _ = l.beat.tick() => return Some((Ok(Bytes::from_static(COMMENT)), l)),
                    // The process stops: end the stream (the client reconnects, to
                    // another replica or to this one once it is back).
                    () = &mut l.stop => return None,
                }
                if !out.is_empty() {
                    break;
                }
                // Nothing this stream shows: wait on.
            }
            // Gather what arrives until `coalesce` after the last write.
            let gather_until = l.last_write + coalesce;
            if l.carry.is_none() && gather_until > Instant::now() {
                tokio::time::sleep_until(gather_until).await;
            }
        }
        // Take what arrived meanwhile, while the chunk has room.
        while l.carry.is_none() {
            match l.feed.try_recv() {
                Ok(change) => l.take(&mut out, change, 0, authorized, buffer),
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
                Err(TryRecvError::Lagged(_)) => {
                    out.push(&Bytes::from_static(RESET), usize::MAX);
                    l.done = true;
                    break;
                }
            }
        }
        l.last_write = Instant::now();
        let chunk = out.into_bytes().expect("a change was gathered");
        Some((Ok(chunk), l))
    });
    futures::StreamExt::chain(replay, follow)
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use tokio::sync::broadcast;
    use tokio::time::Instant;

    use super::*;
    use crate::store::changes::{Event, Subscription};

    const BEAT: Duration = Duration::from_secs(15);
    const GATHER: Duration = Duration::from_millis(50);

    fn bounds(buffer: usize) -> Bounds {
        Bounds {
            heartbeat: BEAT,
            coalesce: GATHER,
            buffer,
        }
    }

    fn change(index: u64, cluster: &str) -> Arc<Change> {
        let frame =
            format!("event: cluster\nid: {index}\ndata: {{\"clusterName\":\"{cluster}\"}}\n\n");
        Arc::new(Change {
            index,
            events: vec![Event {
                kind: "cluster",
                zone: "z".into(),
                cluster: Some(cluster.into()),
                frame: Bytes::from(frame),
                frame_unauthorized: None,
            }],
        })
    }

    fn stream(
        buffer: usize,
        filter: Filter,
    ) -> (
        broadcast::Sender<Arc<Change>>,
        impl Stream<Item = Result<Bytes, Infallible>>,
    ) {
        let (tx, feed) = broadcast::channel(buffer);
        let sub = Subscription {
            replay: Some(Vec::new()),
            feed,
        };
        let stopping = tokio::sync::watch::channel(false).1;
        (
            tx,
            event_stream(sub, filter, true, bounds(BUFFER), stopping, None),
        )
    }

    fn text(b: Option<Result<Bytes, Infallible>>) -> String {
        let Ok(b) = b.expect("the stream goes on");
        String::from_utf8(b.to_vec()).unwrap()
    }

    /// On the paused clock: an isolated change leaves at once; changes that follow
    /// within the gathering period leave together, once it is over.
    #[tokio::test(start_paused = true)]
    async fn a_lone_change_leaves_at_once_and_a_burst_in_one_write() {
        let (tx, s) = stream(16, Filter::default());
        let mut s = std::pin::pin!(s);
        let t0 = Instant::now();
        tx.send(change(1, "a")).unwrap();
        let first = text(s.next().await);
        assert!(
            first.contains("id: 1\n") && !first.contains("id: 2"),
            "{first}"
        );
        assert_eq!(Instant::now(), t0, "no delay for a lone change");

        for i in 2..=4 {
            tx.send(change(i, "a")).unwrap();
        }
        let burst = text(s.next().await);
        assert_eq!(burst.matches("event: cluster").count(), 3, "{burst}");
        assert_eq!(
            Instant::now(),
            t0 + GATHER,
            "gathered until the period ended"
        );

        // Long after the last write, a change leaves at once again.
        tokio::time::advance(GATHER * 2).await;
        let t1 = Instant::now();
        tx.send(change(5, "a")).unwrap();
        assert!(text(s.next().await).contains("id: 5\n"));
        assert_eq!(Instant::now(), t1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_stream_gets_a_comment_every_heartbeat_whatever_the_filter_leaves_out() {
        let filter = Filter {
            zone: None,
            cluster: Some("quiet".into()),
        };
        let (tx, s) = stream(16, filter);
        let mut s = std::pin::pin!(s);
        let t0 = Instant::now();
        tx.send(change(1, "busy")).unwrap();
        assert_eq!(text(s.next().await), ":\n\n");
        assert_eq!(Instant::now(), t0 + BEAT);
        tx.send(change(2, "quiet")).unwrap();
        assert!(text(s.next().await).contains("id: 2\n"));
        assert_eq!(text(s.next().await), ":\n\n");
        assert_eq!(Instant::now(), t0 + BEAT * 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_ends_when_the_process_stops() {
        let (tx, feed) = broadcast::channel(4);
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let sub = Subscription {
            replay: Some(Vec::new()),
            feed,
        };
        let s = event_stream(sub, Filter::default(), true, bounds(BUFFER), stopping, None);
        let mut s = std::pin::pin!(s);
        tx.send(change(1, "a")).unwrap();
        assert!(text(s.next().await).contains("id: 1\n"));
        let t0 = Instant::now();
        stop.send(true).unwrap();
        assert!(s.next().await.is_none());
        assert_eq!(
            Instant::now(),
            t0,
            "ended at once, not at the next heartbeat"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_falls_behind_while_gathering_gets_reset_and_ends() {
        let (tx, s) = stream(2, Filter::default());
        let mut s = std::pin::pin!(s);
        tx.send(change(1, "a")).unwrap();
        assert!(text(s.next().await).contains("id: 1\n"));
        // More changes than the buffer holds arrive within the gathering period.
        tx.send(change(2, "a")).unwrap();
        let next = s.next();
        let mut next = std::pin::pin!(next);
        assert!(futures::poll!(next.as_mut()).is_pending());
        for i in 3..=6 {
            tx.send(change(i, "a")).unwrap();
        }
        let last = text(next.await);
        assert!(last.contains("id: 2\n"), "{last}");
        assert!(last.ends_with("event: reset\ndata: {}\n\n"), "{last}");
        assert!(s.next().await.is_none(), "closed after reset");
    }

    /// A change of `n` events (a bulk write), each frame `len` bytes long.
    fn bulk(index: u64, n: usize, len: usize) -> Arc<Change> {
        let events = (0..n)
            .map(|i| {
                let head = format!("event: cluster\nid: {index}\ndata: {{\"n\":{i},\"pad\":\"");
                let pad = len - head.len() - "\"}\n\n".len();
                Event {
                    kind: "cluster",
                    zone: "z".into(),
                    cluster: Some(format!("c{i}")),
                    frame: Bytes::from(format!("{head}{}\"}}\n\n", "x".repeat(pad))),
                    frame_unauthorized: None,
                }
            })
            .collect();
        Arc::new(Change { index, events })
    }

    fn resumed(
        replay: Vec<Arc<Change>>,
        filter: Filter,
        buffer: usize,
    ) -> impl Stream<Item = Result<Bytes, Infallible>> {
        let (_tx, feed) = broadcast::channel(4);
        let sub = Subscription {
            replay: Some(replay),
            feed,
        };
        let stopping = tokio::sync::watch::channel(false).1;
        event_stream(sub, filter, true, bounds(buffer), stopping, None)
    }

    #[tokio::test(start_paused = true)]
    async fn a_replay_within_the_buffer_is_one_chunk_and_a_larger_one_is_reset_and_the_end() {
        let window = vec![bulk(1, 10, 100), bulk(2, 10, 100)];
        let s = resumed(window.clone(), Filter::default(), 2000);
        let mut s = std::pin::pin!(s);
        let first = text(s.next().await);
        assert_eq!(first.len(), 2000);
        assert_eq!(first.matches("event: cluster").count(), 20);

        let s = resumed(window.clone(), Filter::default(), 1999);
        let mut s = std::pin::pin!(s);
        assert_eq!(text(s.next().await), "event: reset\ndata: {}\n\n");
        assert!(s.next().await.is_none(), "closed after reset");

        // What counts is what the stream shows: its filter's events only.
        let one = Filter {
            zone: None,
            cluster: Some("c3".into()),
        };
        let s = resumed(window, one, 200);
        let mut s = std::pin::pin!(s);
        let first = text(s.next().await);
        assert_eq!(first.matches("event: cluster").count(), 2, "{first}");
    }

    #[test]
    fn a_replay_stops_measuring_at_the_first_frame_past_the_buffer() {
        let window = vec![bulk(1, 1000, 1000), bulk(2, 1000, 1000)];
        assert_eq!(
            replay(&window, &Filter::default(), true, 4096),
            Err(TooLarge)
        );
        assert_eq!(replay(&[], &Filter::default(), true, 4096), Ok(None));
        // A single frame is shared, not copied.
        let one = bulk(3, 1, 100);
        let got = replay(std::slice::from_ref(&one), &Filter::default(), true, 4096)
            .unwrap()
            .unwrap();
        assert_eq!(got.as_ptr(), one.events[0].frame.as_ptr());
    }

    /// A bulk write larger than the buffer goes out in chunks within it, every event
    /// in order, without `reset`; a lone frame larger than the buffer goes out alone.
    #[tokio::test(start_paused = true)]
    async fn live_changes_are_written_in_chunks_within_the_buffer() {
        let (tx, feed) = broadcast::channel(16);
        let sub = Subscription {
            replay: Some(Vec::new()),
            feed,
        };
        let stopping = tokio::sync::watch::channel(false).1;
        let s = event_stream(sub, Filter::default(), true, bounds(350), stopping, None);
        let mut s = std::pin::pin!(s);
        tx.send(bulk(1, 10, 100)).unwrap();
        tx.send(bulk(2, 5, 100)).unwrap();
        tx.send(bulk(3, 1, 1000)).unwrap();
        tx.send(bulk(4, 1, 100)).unwrap();
        let mut chunks = Vec::new();
        while chunks
            .iter()
            .map(|c: &String| c.matches("event: cluster").count())
            .sum::<usize>()
            < 17
        {
            chunks.push(text(s.next().await));
        }
        let sizes: Vec<usize> = chunks.iter().map(String::len).collect();
        // 3 frames of 100 fit in 350: 10 + 5 events go 3, 3, 3, 3, 3; then the
        // 1000-byte frame alone, then the last.
        assert_eq!(sizes, [300, 300, 300, 300, 300, 1000, 100], "{chunks:?}");
        let ids: Vec<u64> = chunks
            .concat()
            .lines()
            .filter_map(|l| l.strip_prefix("id: "))
            .map(|v| v.parse().unwrap())
            .collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(ids, sorted, "in order");
        assert!(!chunks.concat().contains("reset"));
    }

    #[tokio::test]
    async fn streams_past_the_cap_are_refused_until_one_ends() {
        let gauge = IntGauge::new("streams", "open").unwrap();
        let streams = Streams::new(2);
        let a = streams.open(&gauge).unwrap();
        let b = streams.open(&gauge).unwrap();
        assert!(streams.open(&gauge).is_none());
        assert_eq!(gauge.get(), 2);
        // The body holds the place: dropping it gives it back.
        let (_tx, feed) = broadcast::channel(1);
        let sub = Subscription {
            replay: Some(Vec::new()),
            feed,
        };
        let stopping = tokio::sync::watch::channel(false).1;
        let body = event_stream(
            sub,
            Filter::default(),
            true,
            bounds(BUFFER),
            stopping,
            Some(a),
        );
        assert!(streams.open(&gauge).is_none());
        drop(body);
        assert_eq!(gauge.get(), 1);
        let c = streams.open(&gauge).unwrap();
        drop((b, c));
        assert_eq!(gauge.get(), 0);
    }

    #[test]
    fn resume_points_come_from_since_or_a_well_formed_header() {
        let p = |q: Option<&str>, h: Option<&[u8]>| parse_request(q, h).map(|(_, s)| s);
        assert_eq!(p(Some("since=7"), None), Ok(Some(7)));
        assert_eq!(p(Some("since=7"), Some(b"9")), Ok(Some(7)));
        assert_eq!(p(None, Some(b" 9 ")), Ok(Some(9)));
        assert_eq!(p(None, Some(b"nine")), Ok(None));
        assert_eq!(p(None, Some(b"18446744073709551616")), Ok(None));
        for bad in [
            "since=",
            "since=-1",
            "since=+1",
            "since=1&since=1",
            "since=%201",
        ] {
            assert!(p(Some(bad), None).is_err(), "{bad}");
        }
    }
}
