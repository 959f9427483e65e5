//! What a sidecar's log read covers, against the time of the request a check looks
//! for: a check that concludes from the absence of a line first makes sure the lines
//! it read reach back to the request (contract section 10, "Diagnosis evidence knows
//! what it covers"). A debug window or a busy sidecar can push a request's lines out
//! of what the agent holds or answers; a log rotated before the agent began reading
//! it never had them.

use meshcat_common::envoy_log::{line_time_ms, rfc3339_ms, rfc3339_text};
use meshcat_common::wire::WindowStart;

use super::access::edge_followed;
use super::who;
use crate::evidence::{DiagnosisInput, SidecarEvidence};

/// How far back one sidecar's log read reaches, and why no further.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reach {
    /// Ms since the epoch.
    pub from_ms: i64,
    pub why: Why,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// As the agent says.
    Agent {
        start: WindowStart,
        held_max_lines: u64,
    },
    /// An agent that does not say: the oldest line read, by the time it carries.
    OldestLine,
}

/// How far back `side`'s lines reach for the lines of `request_id` (any request's
/// access lines when `None`): the agent's window of the ask for that request when
/// there was one, else of its log; else the time of the oldest line that carries
/// one. `None` without lines or any time in them.
pub(super) fn reach(side: &SidecarEvidence, request_id: Option<&str>) -> Option<Reach> {
    let asked = side
        .asked_request
        .as_ref()
        .filter(|(id, _)| Some(id.as_str()) == request_id)
        .map(|(_, w)| w);
    if let Some(w) = asked.or(side.log_window.as_ref()) {
        return Some(Reach {
            from_ms: w.from_ms,
            why: Why::Agent {
                start: w.start,
                held_max_lines: w.held_max_lines,
            },
        });
    }
    let oldest = side
        .log_lines
        .as_ref()?
        .iter()
        .find_map(|l| line_time_ms(l))?;
    Some(Reach {
        from_ms: oldest,
        why: Why::OldestLine,
    })
}

/// The time of the request the edge's followed line records (its start time).
pub(super) fn request_time(input: &DiagnosisInput) -> Option<i64> {
    edge_followed(input).and_then(|e| rfc3339_ms(&e.start_time))
}

/// The request id of the edge's followed line when `side`'s log lacks its lines and
/// what the agent answered of it does not reach back to the request's time: the
/// lines to ask that agent for by id. `None` when the lines are there, when the
/// agent's answer covers the request (an absence there is real), or when the agent
/// did not say what it covers (an agent that would not understand the ask).
pub fn request_to_ask(input: &DiagnosisInput, side: &SidecarEvidence) -> Option<String> {
    let edge = edge_followed(input)?;
    let id = edge.request_id?;
    let at = rfc3339_ms(&edge.start_time)?;
    let lines = side.log_lines.as_ref()?;
    let window = side.log_window.as_ref()?;
    (window.from_ms > at && !lines.iter().any(|l| l.contains(&id))).then_some(id)
}

/// One evidence line per sidecar in `sides` whose log read does not reach back to
/// `at_ms` (the request's time).
pub(super) fn short_of<'a>(
    sides: impl Iterator<Item = &'a SidecarEvidence>,
    request_id: Option<&str>,
    at_ms: i64,
) -> Vec<(Reach, String)> {
    sides
        .filter_map(|side| {
            let r = reach(side, request_id)?;
            (r.from_ms > at_ms).then(|| (r, describe(side, r)))
        })
        .collect()
}

/// `side`'s reach in words when the agent left older lines out of it (its bound on
/// held lines, or the answer's): a request of unknown time may have been among them.
pub(super) fn cut_short(side: &SidecarEvidence) -> Option<(Reach, String)> {
    let r = reach(side, None)?;
    matches!(
        r.why,
        Why::Agent {
            start: WindowStart::Held | WindowStart::Answer,
            ..
        }
    )
    .then(|| (r, describe(side, r)))
}

/// `side`'s reach in words.
fn describe(side: &SidecarEvidence, r: Reach) -> String {
    let me = who(side);
    let from = rfc3339_text(r.from_ms);
    match r.why {
        Why::Agent {
            start: WindowStart::Held,
            held_max_lines,
        } => format!(
            "{me}: the log read reaches back to {from} only: the agent holds at most {held_max_lines} lines of it (--log-max-lines) and dropped the older ones"
        ),
        Why::Agent {
            start: WindowStart::Answer,
            ..
        } => format!(
            "{me}: the log read reaches back to {from} only: the evidence carries the newest access lines, and newer ones filled it"
        ),
        Why::Agent {
            start: WindowStart::Began,
            ..
        } => format!(
            "{me}: the log read reaches back to {from} only: the agent began reading it then (the agent started, or the log was rotated before)"
        ),
        Why::OldestLine => format!("{me}: the oldest log line read was written at {from}"),
    }
}

/// What to do when a log read does not reach back to the request: the fixes for the
/// reasons `short` gives.
pub(super) fn short_action(short: &[(Reach, String)]) -> String {
    let held = short
        .iter()
        .filter_map(|(r, _)| match r.why {
            Why::Agent {
                start: WindowStart::Held,
                held_max_lines,
            } => Some(held_max_lines),
            _ => None,
        })
        .max();
    let mut action = String::from(
        "Not concluded: the log read does not reach back to the request, so its absence says nothing. Replay the request and diagnose again with its path (path=) soon after it, so the agent answers that request's lines however busy the log is.",
    );
    if let Some(n) = held {
        action.push_str(&format!(
            " Raise the agent's --log-max-lines (now {n}) if the sidecar writes more lines than that between a request and its diagnosis."
        ));
    }
    action.push_str(
        " A debug window (debugSeconds) floods the sidecar's log: start it after the request and replay the request during it.",
    );
    action
}

/// The request's time in words.
pub(super) fn at_text(at_ms: i64) -> String {
    rfc3339_text(at_ms)
}
