//! `GET /events` (contract section 11), the Server-Sent Events stream of catalog
//! changes, bounded in number (`--max-event-streams`) and in what each may queue
//! (`--event-buffer`), with its configuration ([`EventsConfig`]) and defaults. The
//! index header and blocking queries of the read routes are in [`super::blocking`].

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::Stream;
use prometheus::IntGauge;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, ErrorBody};
use crate::changes::Change;

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

/// `GET /events` streams and the change feed behind them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventsConfig {
    /// `--event-heartbeat`: a comment line after this long without a write.
    pub heartbeat: Duration,
    /// `--event-coalesce`: how long a stream gathers changes after a write.
    pub coalesce: Duration,
    /// `--event-buffer`: bytes one stream may queue.
    pub buffer: usize,
    /// `--max-event-streams`: streams open at once.
    pub max_streams: usize,
    /// Changes a stream may fall behind before it gets `reset` (not a flag: the
    /// shared feed's length, lowered by tests).
    pub lag: usize,
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig {
            heartbeat: HEARTBEAT,
            coalesce: COALESCE,
            buffer: BUFFER,
            max_streams: MAX_STREAMS,
            lag: crate::changes::DEFAULT_BUFFER,
        }
    }
}

/// Tells the client to refetch; the stream ends after it.
const RESET: &[u8] = crate::changes::RESET_FRAME;
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

/// `GET /events`.
#[utoipa::path(
    get,
    path = "/events",
    summary = "Server-Sent Events stream of catalog changes: cluster, cluster-deleted, zone, zone-deleted, graph, history (with the read token), summary and reset events, each with the change's index as id.",
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
    sub: crate::changes::Subscription,
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
            match out.append(&change, from, &self.filter, authorized, buffer) {
                Some(rest) => self.carry = Some((change, rest)),
                // A `reset` it showed ends the stream.
                None if authorized
                    && change
                        .events
                        .iter()
                        .any(|e| e.kind == crate::changes::RESET) =>
                {
                    self.done = true;
                }
                None => {}
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
        // Take what arrived meanwhile, while the chunk has room (nothing after a
        // `reset`).
        while l.carry.is_none() && !l.done {
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

mod frames;
mod request;
#[cfg(test)]
mod tests;

use frames::{Chunk, Filter, TooLarge, replay};
pub use request::{EventsQuery, StreamEvent, StreamEventName, parse_event_id, parse_request};
