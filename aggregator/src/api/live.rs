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
/// How often an event stream sends a comment line, by default.
pub const HEARTBEAT: Duration = Duration::from_secs(15);
/// How long an event stream gathers changes after a write, by default: at 1,000
/// streams and 100 changes/s it halves the aggregator's CPU (see
/// `docs/benchmarks.md`) and keeps an event within the 100 ms the contract allows.
pub const COALESCE: Duration = Duration::from_millis(50);

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

/// Takes `index` and `wait` out of a query; returns them and what is left.
#[allow(clippy::type_complexity)]
fn split_blocking(raw: &str) -> Result<(Option<u64>, Option<Duration>, String), ApiError> {
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

/// What a stream writes next: nothing, one shared frame (no copy, the common case),
/// or several frames joined.
#[derive(Debug, Default)]
enum Chunk {
    #[default]
    Empty,
    One(Bytes),
    Many(BytesMut),
}

impl Chunk {
    fn push(&mut self, frame: &Bytes) {
        *self = match std::mem::take(self) {
            Chunk::Empty => Chunk::One(frame.clone()),
            Chunk::One(first) => {
                let mut many = BytesMut::with_capacity(first.len() + frame.len());
                many.extend_from_slice(&first);
                many.extend_from_slice(frame);
                Chunk::Many(many)
            }
            Chunk::Many(mut many) => {
                many.extend_from_slice(frame);
                Chunk::Many(many)
            }
        }
    }

    /// Appends what one change shows a stream: its admitted events' frames.
    fn append(&mut self, change: &Change, filter: &Filter, authorized: bool) {
        for e in change.events.iter().filter(|e| filter.admits(e)) {
            self.push(match (&e.frame_unauthorized, authorized) {
                (Some(f), false) => f,
                _ => &e.frame,
            });
        }
    }

    fn is_empty(&self) -> bool {
        matches!(self, Chunk::Empty)
    }

    fn into_bytes(self) -> Option<Bytes> {
        match self {
            Chunk::Empty => None,
            Chunk::One(b) => Some(b),
            Chunk::Many(m) => Some(m.freeze()),
        }
    }
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
                set_once_u64("since", &v, &mut since)?;
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
    let stream = event_stream(
        sub,
        filter,
        caller.authorized,
        s.event_heartbeat,
        s.event_coalesce,
        s.stopping.clone(),
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

/// The body of one stream: the replay (or `reset`) in one chunk, then the changes'
/// frames, a comment line every `heartbeat`, `reset` then the end when the stream
/// fell behind the bounded feed, and the end when the process stops.
///
/// Writes are coalesced: a change that arrives `coalesce` or more after the stream's
/// last write is written at once; one that arrives sooner waits until `coalesce`
/// after that write, and goes out in one chunk with every change that arrived
/// meanwhile. An isolated change is never delayed, and under a steady flow a stream
/// costs one wake and one write per `coalesce`, not one per change.
fn event_stream(
    sub: crate::store::changes::Subscription,
    filter: Filter,
    authorized: bool,
    heartbeat: Duration,
    coalesce: Duration,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    use tokio::sync::broadcast::error::TryRecvError;
    use tokio::time::Instant;
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
        done: bool,
    }
    let first: Option<Bytes> = match &sub.replay {
        Some(changes) => {
            let mut out = Chunk::Empty;
            for c in changes {
                out.append(c, &filter, authorized);
            }
            out.into_bytes()
        }
        None => Some(Bytes::from_static(RESET)),
    };
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
        done: sub.replay.is_none(),
    };
    let replay = futures::stream::iter(first.map(Ok));
    let follow = futures::stream::unfold(live, move |mut l| async move {
        if l.done {
            return None;
        }
        let mut out = Chunk::Empty;
        loop {
            // Both are cancel-safe: a change is never lost to the heartbeat.
            tokio::select! {
                biased;
                r = l.feed.recv() => match r {
                    Ok(change) => out.append(&change, &l.filter, authorized),
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
            if out.is_empty() {
                // Nothing this stream shows: wait on.
                continue;
            }
            // Gather what arrives until `coalesce` after the last write.
            let gather_until = l.last_write + coalesce;
            if gather_until > Instant::now() {
                tokio::time::sleep_until(gather_until).await;
            }
            loop {
                match l.feed.try_recv() {
                    Ok(change) => out.append(&change, &l.filter, authorized),
                    Err(TryRecvError::Empty | TryRecvError::Closed) => break,
                    Err(TryRecvError::Lagged(_)) => {
                        out.push(&Bytes::from_static(RESET));
                        l.done = true;
                        break;
                    }
                }
            }
            l.last_write = Instant::now();
            let chunk = out.into_bytes().expect("a change was gathered");
            return Some((Ok(chunk), l));
        }
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
        (tx, event_stream(sub, filter, true, BEAT, GATHER, stopping))
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
        let s = event_stream(sub, Filter::default(), true, BEAT, GATHER, stopping);
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
}
