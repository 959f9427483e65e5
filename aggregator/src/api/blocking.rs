//! The catalog index on the read routes (contract section 11): the
//! `X-Meshcat-Index` header, and blocking queries (`?index=&wait=`) that answer once
//! the index moves past the one given.

use std::time::Duration;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue, Method, Uri};
use axum::response::{IntoResponse, Response};
use utoipa::IntoParams;

use super::AppState;
use super::error::ApiError;

/// The index header of the read routes (a `HeaderName` made once, not parsed from a
/// string on every answer).
pub static INDEX_HEADER: HeaderName = HeaderName::from_static("x-meshcat-index");
/// How long a blocking query waits without `wait`.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(5 * 60);
/// The longest wait; longer ones are cut to it.
pub const MAX_WAIT: Duration = Duration::from_secs(10 * 60);

/// Read routes that carry the index and accept blocking queries.
pub const INDEXED: &[&str] = &[
    "/summary",
    "/clusters",
    "/clusters/{clusterName}",
    "/zones",
    "/services",
    "/graph",
    "/sync",
];

/// The route whose index is the sync index (contract section 17), not the catalog's.
pub const SYNC_ROUTE: &str = "/sync";

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
    let mut rest = form_urlencoded::Serializer::new(String::new());
    let blocking = scan_blocking(raw, Some(&mut rest))?;
    Ok((blocking, rest.finish()))
}

/// `index` and `wait` of a query, checked as [`split_blocking`] checks them, without
/// copying the rest (the limits layer needs only these).
pub(super) fn blocking_query(raw: &str) -> Result<BlockingQuery, ApiError> {
    scan_blocking(raw, None)
}

/// Reads `index` and `wait` from a query, appending every other pair to `rest` when
/// given.
fn scan_blocking(
    raw: &str,
    mut rest: Option<&mut form_urlencoded::Serializer<'_, String>>,
) -> Result<BlockingQuery, ApiError> {
    let mut index = None;
    let mut wait = None;
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
                if let Some(rest) = rest.as_mut() {
                    rest.append_pair(&k, &v);
                }
            }
        }
    }
    Ok(BlockingQuery { index, wait })
}

/// Whether a blocking query for `index` waits, the catalog index being `current`.
/// Only the current index waits: the data has moved past an older one, and a newer
/// one was not issued by this process (it comes from before a restart or from
/// another replica), so waiting for it could last the whole wait while the catalog
/// changes. Both answer at once. The limits middleware exempts exactly these.
pub fn waits(index: u64, current: u64) -> bool {
    index == current
}

/// The catalog index a read route's answer carries: the index read once a blocking
/// query's wait is over (none off the read routes).
#[derive(Debug)]
pub struct Index(Option<u64>);

impl Index {
    /// The answer read at `index`.
    pub fn at(index: u64) -> Index {
        Index(Some(index))
    }

    /// Answers with the index, when the answer is a success.
    pub fn answer(self, mut res: Response) -> Response {
        thread_local! {
            /// The last index answered on this thread, as a header value: the index
            /// moves far less often than reads are answered, and a header value
            /// made from a number is an allocation each time.
            static LAST: std::cell::RefCell<Option<(u64, HeaderValue)>> =
                const { std::cell::RefCell::new(None) };
        }
        if let Some(index) = self.0
            && res.status().is_success()
        {
            let value = LAST.with_borrow_mut(|last| match last {
                Some((i, v)) if *i == index => v.clone(),
                _ => last.insert((index, HeaderValue::from(index))).1.clone(),
            });
            res.headers_mut().insert(INDEX_HEADER.clone(), value);
        }
        res
    }
}

/// Before a read route: waits out a blocking query and takes `index` and `wait` out
/// of the query. The request to serve and the index it is read at, or the answer to
/// a malformed query.
pub async fn indexed(s: &AppState, mut req: Request) -> Result<(Request, Index), Response> {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let on_route = req.method() == Method::GET && route.is_some_and(|p| INDEXED.contains(&p));
    if !on_route {
        return Ok((req, Index(None)));
    }
    let sync = route == Some(SYNC_ROUTE);
    let current = || {
        if sync {
            s.sync.index()
        } else {
            s.store.index()
        }
    };
    if let Some(raw) = req.uri().query().map(str::to_owned) {
        let (BlockingQuery { index, wait }, rest) =
            split_blocking(&raw).map_err(|e| e.into_response())?;
        if wait.is_some() && index.is_none() {
            return Err(ApiError::bad_query("Query parameter wait needs index.").into_response());
        }
        // Any other index answers at once (see `waits`).
        if let Some(after) = index.filter(|after| waits(*after, current())) {
            let mut watch = if sync {
                s.sync.watch()
            } else {
                s.store.changes().watch()
            };
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
    let index = current();
    Ok((req, Index(Some(index))))
}
