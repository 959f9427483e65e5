//! A reader of `GET /events` (Server-Sent Events) for the live-catalog tests: parses
//! events out of the byte stream and waits, under a deadline, for one that matches.

use std::time::{Duration, Instant};

use serde_json::Value;

/// One parsed server-sent event.
#[derive(Debug, Clone)]
pub struct Sse {
    pub event: String,
    pub id: Option<u64>,
    pub data: Value,
}

impl Sse {
    /// A `cluster` event of cluster `name`.
    pub fn is_cluster(&self, name: &str) -> bool {
        self.event == "cluster" && self.data["clusterName"] == name
    }
}

/// Parses complete events out of `buf`, leaving a partial one in it. Comment lines
/// (keep-alives) make no event.
pub fn parse_events(buf: &mut String) -> Vec<Sse> {
    let mut out = Vec::new();
    while let Some(end) = buf.find("\n\n") {
        let block: String = buf.drain(..end + 2).collect();
        let (mut event, mut id, mut data) = (String::from("message"), None, String::new());
        let mut any = false;
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                event = v.trim().to_owned();
                any = true;
            } else if let Some(v) = line.strip_prefix("id:") {
                id = v.trim().parse().ok();
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push_str(v.strip_prefix(' ').unwrap_or(v));
                any = true;
            }
        }
        if any {
            out.push(Sse {
                event,
                id,
                data: serde_json::from_str(&data).unwrap_or(Value::Null),
            });
        }
    }
    out
}

/// An open `GET /events` stream.
#[derive(Debug)]
pub struct EventStream {
    body: reqwest::Response,
    buf: String,
    /// Events parsed but not yet looked at: one chunk may carry several.
    pending: std::collections::VecDeque<Sse>,
    /// Every event read so far, in order.
    pub seen: Vec<Sse>,
}

impl EventStream {
    /// Opens `url` (a full `.../events?...` address) with `headers`; fails unless it
    /// answers 200 `text/event-stream`.
    pub async fn open(url: &str, headers: &[(&str, &str)]) -> anyhow::Result<EventStream> {
        let mut req = reqwest::Client::new().get(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let res = req.send().await?;
        anyhow::ensure!(res.status() == 200, "GET {url}: {}", res.status());
        let kind = res
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        anyhow::ensure!(kind == "text/event-stream", "content type {kind}");
        Ok(EventStream {
            body: res,
            buf: String::new(),
            pending: Default::default(),
            seen: Vec::new(),
        })
    }

    /// Reads until an event satisfies `want` and returns it; `None` when the stream
    /// ends first, an error when `deadline` passes first.
    pub async fn until(
        &mut self,
        deadline: Duration,
        want: impl Fn(&Sse) -> bool,
    ) -> anyhow::Result<Option<Sse>> {
        let end = Instant::now() + deadline;
        loop {
            while let Some(e) = self.pending.pop_front() {
                self.seen.push(e.clone());
                if want(&e) {
                    return Ok(Some(e));
                }
            }
            let Ok(chunk) = tokio::time::timeout_at(end.into(), self.body.chunk()).await else {
                anyhow::bail!(
                    "no matching event within {deadline:?}; seen {:?}",
                    self.seen
                );
            };
            let Some(chunk) = chunk? else {
                return Ok(None);
            };
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
            self.pending.extend(parse_events(&mut self.buf));
        }
    }
}
