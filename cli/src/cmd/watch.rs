//! `meshcat watch`: one line per event of `GET /events` (contract section 11) until
//! interrupted. A stream that ends or goes silent past its heartbeats is reopened
//! with `Last-Event-ID`, so nothing is missed while the aggregator keeps the events;
//! a `reset` (too far behind, or another replica) is printed and the stream is
//! reopened from now. SIGINT or SIGTERM ends it with status 0.

use std::io::Write;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use super::{Ctx, emit, history, output_closed};
use crate::args::{WatchArgs, WatchFormat};
use crate::client::{Api, Call, CliError, error_chain};
use crate::render::{self, now_ms, s};
use crate::sse::{Event, Parser};

/// Silence after which the stream is taken for dead: the aggregator sends a comment
/// every 15 s by default.
const IDLE: Duration = Duration::from_secs(60);
/// Reconnection delays: from the first, doubling up to the last.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

pub async fn run(ctx: &Ctx, args: WatchArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let api = ctx.api.streaming()?;
    let stop = stopped();
    tokio::pin!(stop);
    tokio::select! {
        r = follow(&api, &args, out) => r,
        () = &mut stop => Ok(()),
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn stopped() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// How one stream ended.
enum Ended {
    /// The server sent `reset`: reopen from now.
    Reset,
    /// It closed or went silent: reopen where it stopped. Whether it had delivered
    /// an event (a stream that did starts the retry delays over).
    Closed(String, bool),
}

/// Where to reopen the stream. A change's events share its index as their id, and
/// the server may split them over two writes, so a stream that breaks may have
/// delivered only part of the last change: the next one resumes after the change
/// before it (`Last-Event-ID: id - 1`) and leaves out the events of the last change
/// already printed, which the server sends again in the same order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Resume {
    /// The id of the last event printed.
    id: Option<u64>,
    /// How many events with that id were printed.
    printed: usize,
}

impl Resume {
    /// The `Last-Event-ID` to reopen with.
    pub fn last_event_id(&self) -> Option<String> {
        self.id.map(|id| id.saturating_sub(1).to_string())
    }

    /// How many events to leave out at the start of a reopened stream: those of the
    /// last change already printed.
    pub fn to_skip(&self) -> usize {
        self.printed
    }

    /// Takes an event of a stream opened with [`Self::last_event_id`], `skip` set by
    /// [`Self::to_skip`] when it opened: whether to print it.
    pub fn admit(&mut self, id: Option<&str>, skip: &mut usize) -> bool {
        let Some(id) = id.and_then(|i| i.parse::<u64>().ok()) else {
            return true;
        };
        if Some(id) == self.id {
            if *skip > 0 {
                *skip -= 1;
                return false;
            }
            self.printed += 1;
        } else {
            self.id = Some(id);
            self.printed = 1;
            *skip = 0;
        }
        true
    }
}

async fn follow(api: &Api, args: &WatchArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let mut resume = Resume::default();
    let mut opened_once = false;
    let mut delay = BACKOFF_MIN;
    loop {
        match stream(api, args, &mut opened_once, &mut resume, out).await {
            Ok(Ended::Reset) => {
                resume = Resume::default();
                delay = BACKOFF_MIN;
                continue;
            }
            Ok(Ended::Closed(why, delivered)) => {
                if delivered {
                    delay = BACKOFF_MIN;
                }
                eprintln!(
                    "meshcat: the event stream {}; reconnecting in {delay:?}.",
                    render::clean(&why)
                );
            }
            // Until a stream has opened, a refusal or an unreachable API is the
            // command's error; afterwards the aggregator may be restarting.
            Err(e) if !opened_once || matches!(e, CliError::Closed) => return Err(e),
            // A stream past the bounds of its events is not retried: the server
            // would send the same again.
            Err(e @ CliError::Body { .. }) => return Err(e),
            Err(e) => eprintln!(
                "meshcat: {}; reconnecting in {delay:?}.",
                render::clean(&e.to_string())
            ),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(BACKOFF_MAX);
    }
}

async fn stream(
    api: &Api,
    args: &WatchArgs,
    opened_once: &mut bool,
    resume: &mut Resume,
    out: &mut dyn Write,
) -> Result<Ended, CliError> {
    let call = Call::new(&["events"])
        .q_opt("zoneName", args.zone.clone())
        .q_opt("clusterName", args.cluster.clone());
    let since = resume.last_event_id();
    let mut headers = vec![("accept", "text/event-stream")];
    if let Some(id) = &since {
        headers.push(("last-event-id", id.as_str()));
    }
    let mut resp = api.send(Method::GET, &call, None, &headers).await?;
    if !*opened_once {
        eprintln!(
            "meshcat: watching the events of {} (Ctrl-C stops).",
            api.base()
        );
        *opened_once = true;
    }
    let mut parser = Parser::default();
    let mut skip = resume.to_skip();
    let mut delivered = false;
    loop {
        let chunk = match tokio::time::timeout(IDLE, resp.chunk()).await {
            Err(_) => {
                return Ok(Ended::Closed(format!("was silent for {IDLE:?}"), delivered));
            }
            Ok(Err(e)) => {
                return Ok(Ended::Closed(
                    format!("broke: {}", error_chain(&e)),
                    delivered,
                ));
            }
            Ok(Ok(None)) => return Ok(Ended::Closed("ended".into(), delivered)),
            Ok(Ok(Some(c))) => c,
        };
        let events = parser.push(&chunk).map_err(|e| CliError::Body {
            what: "GET /events".into(),
            reason: e.to_string(),
        })?;
        for e in events {
            if !resume.admit(e.id.as_deref(), &mut skip) {
                continue;
            }
            delivered = true;
            let text = match args.output {
                WatchFormat::Table => format!("{}\n", line(&e, now_ms())),
                WatchFormat::Json => format!("{}\n", render::json_text(&json_line(&e), false)),
            };
            emit(out, &text)?;
            if output_closed() {
                return Err(CliError::Closed);
            }
            if e.event == "reset" {
                return Ok(Ended::Reset);
            }
        }
    }
}

/// An event as one JSON object: `{"id", "event", "data"}`, data parsed when it is JSON.
pub fn json_line(e: &Event) -> Value {
    json!({
        "id": e.id,
        "event": e.event,
        "data": serde_json::from_str::<Value>(&e.data).unwrap_or_else(|_| Value::String(e.data.clone())),
    })
}

/// An event as one line: the time it arrived, its name, and what it says (the
/// server's text with its control characters escaped, newlines too: one event is
/// one line).
pub fn line(e: &Event, now: i64) -> String {
    let d = render::cleaned(&serde_json::from_str(&e.data).unwrap_or(Value::Null), false);
    let place = |d: &Value| {
        [s(d, "zoneName"), s(d, "clusterName"), s(d, "instance")]
            .into_iter()
            .filter(|p| !p.is_empty())
            .collect::<Vec<_>>()
            .join("/")
    };
    let what = match e.event.as_str() {
        "cluster" => {
            let status = s(&d, "status");
            let instances = if d["authorized"] == Value::Bool(false) {
                "instances hidden".to_owned()
            } else {
                let n = d["instances"].as_array().map_or(0, Vec::len);
                format!("{n} instance{}", if n == 1 { "" } else { "s" })
            };
            format!(
                "{} {}, {instances}",
                place(&d),
                render::paint(render::status_style(status), status)
            )
        }
        "cluster-deleted" | "zone-deleted" | "graph" => place(&d),
        "zone" => format!("{} (server {})", place(&d), s(&d, "serverAddress")),
        "summary" => format!(
            "{} clusters: {} stable, {} warning, {} down; {} instances",
            d["clusterCount"],
            d["clusterStableCount"],
            d["clusterWarningCount"],
            d["clusterDownCount"],
            d["instanceCount"]
        ),
        "history" => format!(
            "{} {} {}",
            s(&d, "kind"),
            place(&d),
            history::detail(s(&d, "kind"), &d["detail"])
        ),
        "sync" => {
            let state = s(&d, "state");
            format!(
                "{} {}{}",
                place(&d),
                render::paint(render::sync_style(state), state),
                history::colon(s(&d["detail"], "text"))
            )
        }
        "reset" => "events were missed; following from now on".to_owned(),
        _ => render::clean(&e.data).into_owned(),
    };
    format!("{} {} {what}", render::time(now), render::clean(&e.event))
        .trim_end()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream broken inside change 8 (two of its three events printed) reopens
    /// after change 7 and prints the third event of 8 once, then what follows.
    #[test]
    fn a_reopened_stream_prints_each_event_once() {
        let mut r = Resume::default();
        assert_eq!(r.last_event_id(), None);
        let mut skip = r.to_skip();
        let first: Vec<bool> = [Some("7"), None, Some("8"), Some("8")]
            .into_iter()
            .map(|id| r.admit(id, &mut skip))
            .collect();
        assert_eq!(first, [true, true, true, true]);
        assert_eq!(r.last_event_id().as_deref(), Some("7"));
        let mut skip = r.to_skip();
        let again: Vec<bool> = [Some("8"), Some("8"), Some("8"), Some("9"), Some("9")]
            .into_iter()
            .map(|id| r.admit(id, &mut skip))
            .collect();
        assert_eq!(again, [false, false, true, true, true]);
        assert_eq!(r.last_event_id().as_deref(), Some("8"));
        // The change printed whole is not in the replay (the server had moved on).
        let mut skip = r.to_skip();
        assert!(r.admit(Some("10"), &mut skip));
        assert!(r.admit(Some("10"), &mut skip));
    }

    fn event(name: &str, data: Value) -> Event {
        Event {
            id: Some("42".into()),
            event: name.into(),
            data: data.to_string(),
        }
    }

    #[test]
    fn one_line_per_event() {
        let now = 1_700_000_000_000;
        let plain = |e: &Event| anstream::adapter::strip_str(&line(e, now)).to_string();
        assert_eq!(
            plain(&event(
                "cluster",
                json!({"zoneName": "local", "clusterName": "catalog", "status": "stable",
                       "authorized": true, "instances": [{"name": "catalog-0", "startTime": 1}]})
            )),
            "2023-11-14T22:13:20Z cluster local/catalog stable, 1 instance"
        );
        assert_eq!(
            plain(&event(
                "cluster-deleted",
                json!({"zoneName": "local", "clusterName": "catalog"})
            )),
            "2023-11-14T22:13:20Z cluster-deleted local/catalog"
        );
        assert_eq!(
            plain(&event(
                "summary",
                json!({"zoneCount": 1, "clusterCount": 3, "clusterStableCount": 2,
                "clusterWarningCount": 1, "clusterDownCount": 0, "instanceCount": 4})
            )),
            "2023-11-14T22:13:20Z summary 3 clusters: 2 stable, 1 warning, 0 down; 4 instances"
        );
        assert_eq!(
            plain(&event(
                "history",
                json!({"id": 9, "atMs": now, "kind": "instance-left", "zoneName": "local",
                "clusterName": "catalog", "instance": "catalog-0", "detail": {"reason": "expired"}})
            )),
            "2023-11-14T22:13:20Z history instance-left local/catalog/catalog-0 reason: expired"
        );
        assert_eq!(
            plain(&event(
                "sync",
                json!({"zoneName": "local", "clusterName": "catalog", "instance": "catalog-0",
                "state": "rejected", "sinceMs": now,
                "detail": {"text": "clusters rejected: Proto constraint validation failed\n(x)",
                           "rejections": [{"kind": "clusters", "resource": "", "reason": "x", "sinceMs": now}]}})
            )),
            "2023-11-14T22:13:20Z sync local/catalog/catalog-0 rejected: clusters rejected: Proto constraint validation failed\\n(x)"
        );
        assert_eq!(
            plain(&event(
                "sync",
                json!({"zoneName": "local", "clusterName": "catalog", "instance": "catalog-0",
                "state": "synced", "sinceMs": now, "detail": {"text": ""}})
            )),
            "2023-11-14T22:13:20Z sync local/catalog/catalog-0 synced"
        );
        assert_eq!(
            plain(&event("reset", json!({}))),
            "2023-11-14T22:13:20Z reset events were missed; following from now on"
        );
        // A server's text is one line, its control characters escaped.
        let hostile = Event {
            id: None,
            event: "x\u{1b}]52;c;aGk=\u{7}".into(),
            data: "a\nb\u{9b}2J".into(),
        };
        assert_eq!(
            line(&hostile, now),
            "2023-11-14T22:13:20Z x\\u{1b}]52;c;aGk=\\u{7} a\\nb\\u{9b}2J"
        );
        assert_eq!(
            plain(&event(
                "cluster-deleted",
                json!({"zoneName": "z\u{7f}", "clusterName": "c\n"})
            )),
            "2023-11-14T22:13:20Z cluster-deleted z\\u{7f}/c\\n"
        );
        let j = json_line(&event("zone-deleted", json!({"zoneName": "z"})));
        assert_eq!(
            j,
            json!({"id": "42", "event": "zone-deleted", "data": {"zoneName": "z"}})
        );
    }
}
