//! A sidecar's xDS state (contract section 17): whether its stream to the control
//! plane is up, and which of its subscriptions (CDS, LDS, each EDS cluster, each RDS
//! route configuration) stand rejected, with Envoy's reason taken from the sidecar's
//! log ([`RejectionLog`]). [`XdsTracker`] reads it from `/stats` at a cost that does
//! not grow with the sidecar's clusters: one request for the connection gauge and the
//! `update_rejected` counters (`usedonly` lists only those that moved), and a second
//! one only for the subscriptions whose counter moved or that stand rejected
//! (docs/agent.md, "xDS state").

use std::collections::HashMap;

use meshcat_common::envoy_log::{envoy_time_ms, strip_cri_prefix};
use meshcat_common::wire::{MAX_XDS_REJECTIONS, XdsRejection, XdsState};

use super::model::StatsSnapshot;
use super::{EnvoyAdmin, EnvoyError};

/// The first request's filter (RE2): the connection gauge and every
/// `update_rejected` counter of the four kinds of subscription.
pub const XDS_STATS_FILTER: &str = r"^(control_plane\.connected_state|(cluster_manager\.cds|listener_manager\.lds|cluster\..+|http\..+\.rds\..+)\.update_rejected)$";
/// The second request's filter when more subscriptions need it than are named one by
/// one: every subscription's `update_success` and `update_time`.
const ALL_SUCCESS_FILTER: &str = r"^(cluster_manager\.cds|listener_manager\.lds|cluster\..+|http\..+\.rds\..+)\.update_(success|time)$";
/// The gauge that says whether the xDS stream is up.
const CONNECTED_STATE: &str = "control_plane.connected_state";
/// Most subscriptions named one by one in the second request (the regex travels in
/// the URL); more read [`ALL_SUCCESS_FILTER`] instead.
const MAX_NAMED: usize = 64;
/// Most rejections the log keeps (the newest per kind and resource).
const MAX_RECORDS: usize = 256;
/// Most lines of one record read; the rest of a longer one is dropped.
const MAX_RECORD_LINES: usize = 512;
/// Longest reason kept, in bytes.
const MAX_REASON: usize = 1024;
/// Protobuf's marker before a message printed in text form (`DebugString`).
const DEBUG_STRING_MARKER: &str = "goo.gle/debugstr";
/// What Envoy logs, at warning level, when it rejects an update.
const REJECTED_PREFIX: &str = "gRPC config for ";
const REJECTED_INFIX: &str = " rejected: ";

/// The kind of an xDS subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// CDS.
    Clusters,
    /// LDS.
    Listeners,
    /// EDS, one subscription per cluster.
    Endpoints,
    /// RDS, one subscription per route configuration.
    Routes,
}

impl Kind {
    /// The name the wire gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Clusters => "clusters",
            Kind::Listeners => "listeners",
            Kind::Endpoints => "endpoints",
            Kind::Routes => "routes",
        }
    }

    /// The kind of the resources of `type_url` (`type.googleapis.com/envoy.config...`).
    fn of_type_url(type_url: &str) -> Option<Kind> {
        match type_url.rsplit('/').next()? {
            "envoy.config.cluster.v3.Cluster" => Some(Kind::Clusters),
            "envoy.config.listener.v3.Listener" => Some(Kind::Listeners),
            "envoy.config.endpoint.v3.ClusterLoadAssignment" => Some(Kind::Endpoints),
            "envoy.config.route.v3.RouteConfiguration" => Some(Kind::Routes),
            _ => None,
        }
    }

    /// Whether one subscription holds every resource of the kind (CDS, LDS), rather
    /// than one resource (EDS, RDS).
    fn wildcard(self) -> bool {
        matches!(self, Kind::Clusters | Kind::Listeners)
    }
}

/// One subscription: its kind, and its resource for EDS and RDS ("" for CDS, LDS).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Subscription {
    pub kind: Kind,
    pub resource: String,
}

/// The subscription a stat belongs to, with the stat's prefix (the name without its
/// last part), when the stat is one of a subscription's `update_*`.
pub(crate) fn subscription_of(stat: &str) -> Option<(Subscription, &str)> {
    let (prefix, counter) = stat.rsplit_once('.')?;
    if !counter.starts_with("update_") {
        return None;
    }
    let (kind, resource) = match prefix {
        "cluster_manager.cds" => (Kind::Clusters, ""),
        "listener_manager.lds" => (Kind::Listeners, ""),
        _ => {
            if let Some(rest) = prefix.strip_prefix("http.") {
                // `http.<stat prefix>.rds.<route configuration>`.
                let (_, route) = rest.split_once(".rds.")?;
                (Kind::Routes, route)
            } else {
                (Kind::Endpoints, prefix.strip_prefix("cluster.")?)
            }
        }
    };
    if resource.is_empty() && !kind.wildcard() {
        return None;
    }
    let sub = Subscription {
        kind,
        resource: resource.to_owned(),
    };
    Some((sub, prefix))
}

/// `s` with every ASCII character that is not a letter, digit or `_` escaped for
/// RE2.
fn escape_re2(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if (c.is_ascii_punctuation() && c != '_') || c == ' ' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The second request's filter: the `update_success` and `update_time` of the
/// subscriptions whose stats start with `prefixes`.
fn success_filter(prefixes: &[&str]) -> String {
    if prefixes.len() > MAX_NAMED {
        return ALL_SUCCESS_FILTER.to_owned();
    }
    let named: Vec<String> = prefixes.iter().map(|p| escape_re2(p)).collect();
    format!(r"^({})\.update_(success|time)$", named.join("|"))
}

/// A subscription as last read.
#[derive(Debug, Clone)]
struct Tracked {
    rejected: u64,
    success: u64,
    /// Set while the subscription stands rejected.
    standing: Option<Standing>,
    /// Set while a rejection came with a successful update in the same interval and
    /// the log has not yet told which came last.
    undecided: Option<Undecided>,
}

/// A rejection whose order against a successful update the log has yet to tell:
/// Envoy writes its log in batches (`--file-flush-interval-msec`, 10 s by default),
/// so the line can come a scrape or two after the counter moved.
#[derive(Debug, Clone, Copy)]
struct Undecided {
    /// The subscription's last successful update then (`update_time`).
    last_success_ms: Option<i64>,
    /// Past this (agent's clock) the rejection is taken to have come first.
    until_ms: i64,
}

/// How long a rejection waits for its log line (Envoy's default flush interval of
/// 10 s, and the scrapes around it).
const LOG_LAG_MS: i64 = 30_000;

#[derive(Debug, Clone, Copy)]
struct Standing {
    /// When the agent first saw the rejection, ms since the epoch.
    since_ms: i64,
    /// `update_success` then: a higher one ends the rejection.
    success_at: u64,
}

/// Follows one sidecar's xDS state from scrape to scrape. A new tracker (an agent
/// restart) or a sidecar restart starts from what the stats and the log say then.
#[derive(Debug, Default)]
pub struct XdsTracker {
    /// Every subscription whose `update_rejected` is above 0.
    subs: HashMap<Subscription, Tracked>,
    /// The start time of the Envoy process the state was read from.
    start_time_ms: i64,
    /// That process has no connection gauge: no xDS stream (static configuration).
    static_only: bool,
    /// When the last read of that process was taken (agent's clock, ms), `None`
    /// before the first: a subscription found then is first seen, one found later
    /// had no rejection at the last read.
    last_read_ms: Option<i64>,
    /// The rejections the sidecar's log holds.
    log: RejectionLog,
}

/// The `update_rejected` counters above 0, with each subscription's stat prefix.
fn rejected_counts(stats: &StatsSnapshot) -> Vec<(Subscription, String, u64)> {
    stats
        .values
        .iter()
        .filter(|(name, v)| **v > 0 && name.ends_with(".update_rejected"))
        .filter_map(|(name, v)| {
            let (sub, prefix) = subscription_of(name)?;
            Some((sub, prefix.to_owned(), *v))
        })
        .collect()
}

impl XdsTracker {
    /// The rejections read from the sidecar's log, to hand it the log's lines.
    pub fn log_mut(&mut self) -> &mut RejectionLog {
        &mut self.log
    }

    /// The rejections read from the sidecar's log.
    pub fn log(&self) -> &RejectionLog {
        &self.log
    }

    /// Reads the sidecar's xDS state through `admin`. `start_time_ms` names the Envoy
    /// process (a new one starts over); `now_ms` dates rejections first seen now.
    pub async fn read(
        &mut self,
        admin: &EnvoyAdmin,
        start_time_ms: i64,
        now_ms: i64,
    ) -> Result<XdsState, EnvoyError> {
        if start_time_ms != self.start_time_ms {
            self.subs.clear();
            self.static_only = false;
            self.last_read_ms = None;
            self.start_time_ms = start_time_ms;
        }
        let first = admin.stats_matching(XDS_STATS_FILTER).await?;
        let connected = match first.values.get(CONNECTED_STATE) {
            Some(v) => Some(*v != 0),
            None if self.static_only => None,
            None => {
                // `usedonly` leaves out a gauge never set: a stream that never came
                // up. Only a sidecar without xDS has no gauge at all, and keeps
                // none until it restarts.
                let exact = format!("^{}$", escape_re2(CONNECTED_STATE));
                let all = admin.stats_including_unused(&exact).await?;
                let v = all.values.get(CONNECTED_STATE).map(|v| *v != 0);
                self.static_only = v.is_none();
                v
            }
        };
        let counts = rejected_counts(&first);
        let need: Vec<&str> = counts
            .iter()
            .filter(|(sub, _, rejected)| {
                self.subs.get(sub).is_none_or(|t| {
                    t.rejected != *rejected || t.standing.is_some() || t.undecided.is_some()
                })
            })
            .map(|(_, prefix, _)| prefix.as_str())
            .collect();
        let second = if need.is_empty() {
            StatsSnapshot::default()
        } else {
            admin.stats_matching(&success_filter(&need)).await?
        };
        Ok(self.update(connected, counts, &second, now_ms))
    }

    /// Takes one read: `counts` from the first request, `second` holding the
    /// `update_success` and `update_time` of the subscriptions that needed them.
    fn update(
        &mut self,
        connected: Option<bool>,
        counts: Vec<(Subscription, String, u64)>,
        second: &StatsSnapshot,
        now_ms: i64,
    ) -> XdsState {
        let mut next = HashMap::with_capacity(counts.len());
        let mut rejected = Vec::new();
        for (sub, prefix, rejected_total) in counts {
            let success = second
                .values
                .get(&format!("{prefix}.update_success"))
                .copied();
            let last_success_ms = second
                .values
                .get(&format!("{prefix}.update_time"))
                .and_then(|v| i64::try_from(*v).ok());
            let tracked = match self.subs.remove(&sub) {
                // The same process, its counters moved on (or not).
                Some(t)
                    if rejected_total >= t.rejected && success.is_none_or(|s| s >= t.success) =>
                {
                    let success = success.unwrap_or(t.success);
                    let mut undecided = None;
                    let standing = if rejected_total > t.rejected {
                        // A rejection since the last read. A success in the same
                        // interval came before or after it: the log tells which,
                        // now or once its line is written.
                        let still = success == t.success
                            || self.log.newer_than(&sub, last_success_ms).is_some();
                        if !still {
                            undecided = Some(Undecided {
                                last_success_ms,
                                until_ms: now_ms + LOG_LAG_MS,
                            });
                        }
                        still.then_some(Standing {
                            since_ms: match t.standing {
                                Some(s) if success == t.success => s.since_ms,
                                _ => now_ms,
                            },
                            success_at: success,
                        })
                    } else if let Some(u) = t.undecided.filter(|u| now_ms <= u.until_ms)
                        && success == t.success
                    {
                        // No new success meanwhile: the log line, once it is here,
                        // says the rejection came last.
                        if self.log.newer_than(&sub, u.last_success_ms).is_some() {
                            Some(Standing {
                                since_ms: now_ms,
                                success_at: success,
                            })
                        } else {
                            undecided = Some(u);
                            None
                        }
                    } else {
                        t.standing.filter(|s| success <= s.success_at)
                    };
                    Tracked {
                        rejected: rejected_total,
                        success,
                        standing,
                        undecided,
                    }
                }
                // Not rejected at the last read, or first seen (the agent or the
                // sidecar restarted, or the counters went back).
                _ => {
                    let success = success.unwrap_or(0);
                    let logged = self.log.newer_than(&sub, last_success_ms).is_some();
                    let still = match self.last_read_ms {
                        // Rejected since the last read: it stands unless a successful
                        // update came in the same interval, and then the log tells
                        // which came last.
                        Some(last) => logged || last_success_ms.is_none_or(|t| t <= last),
                        // First seen: only a rejection the log holds, newer than the
                        // last successful update, stands; else this is the baseline.
                        None => logged,
                    };
                    let standing = still.then_some(Standing {
                        since_ms: now_ms,
                        success_at: success,
                    });
                    // Rejected since the last read with a success in the interval:
                    // the log may not have the line yet.
                    let undecided = (!still && self.last_read_ms.is_some()).then_some(Undecided {
                        last_success_ms,
                        until_ms: now_ms + LOG_LAG_MS,
                    });
                    Tracked {
                        rejected: rejected_total,
                        success,
                        standing,
                        undecided,
                    }
                }
            };
            if let Some(s) = tracked.standing {
                let reason = self
                    .log
                    .newer_than(&sub, last_success_ms)
                    .map(|r| r.reason.clone())
                    .unwrap_or_default();
                rejected.push(XdsRejection {
                    kind: sub.kind.as_str().to_owned(),
                    resource: sub.resource.clone(),
                    reason,
                    since_ms: s.since_ms,
                    rejected_total: tracked.rejected,
                    success_total: tracked.success,
                });
            }
            next.insert(sub, tracked);
        }
        self.subs = next;
        self.last_read_ms = Some(now_ms);
        rejected.sort_by(|a, b| {
            b.since_ms
                .cmp(&a.since_ms)
                .then_with(|| (&a.kind, &a.resource).cmp(&(&b.kind, &b.resource)))
        });
        rejected.truncate(MAX_XDS_REJECTIONS);
        XdsState {
            connected,
            rejected,
        }
    }
}

/// A rejection as the sidecar's log tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRejection {
    pub kind: Kind,
    /// The rejected resource's name when the record prints it ("" when not).
    pub resource: String,
    /// Envoy's reason: the text after the rejected resource.
    pub reason: String,
    /// When Envoy wrote it, ms since the epoch (its time stamp, read as UTC, else
    /// the container runtime's, else when the agent read the line).
    pub at_ms: i64,
}

/// A record whose lines are still being read.
#[derive(Debug)]
struct OpenRecord {
    kind: Kind,
    at_ms: i64,
    /// The text after `rejected: `, then each following line.
    lines: Vec<String>,
    /// Whether the first line carries [`DEBUG_STRING_MARKER`].
    marked: bool,
}

/// The rejections of a sidecar's log, parsed line by line as the agent reads them:
/// Envoy writes one over several lines (`gRPC config for <type> rejected: `, the
/// rejected resource in protobuf text form, then `: <reason>`). Keeps the newest per
/// kind and resource, at most 256.
#[derive(Debug, Default)]
pub struct RejectionLog {
    /// The newest rejection per (kind, resource); the resource is "" for CDS and LDS,
    /// and for EDS and RDS records that do not name theirs.
    records: HashMap<(Kind, String), LogRejection>,
    open: Option<OpenRecord>,
    /// The sequence number of the last line taken.
    seen: u64,
}

impl RejectionLog {
    /// The sequence number of the last line taken (0 before the first).
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Starts over from the log's beginning (another log file).
    pub fn restart(&mut self) {
        self.open = None;
        self.seen = 0;
    }

    /// Takes line `seq` of the log (read by the agent at `read_at_ms`).
    pub fn line(&mut self, seq: u64, read_at_ms: i64, text: &str) {
        self.seen = seq;
        let (runtime_ms, text) = strip_cri_prefix(text);
        if starts_entry(text) {
            self.close();
            let Some(at) = text.find(REJECTED_PREFIX) else {
                return;
            };
            let rest = &text[at + REJECTED_PREFIX.len()..];
            let Some((type_url, message)) = rest.split_once(REJECTED_INFIX) else {
                return;
            };
            let Some(kind) = Kind::of_type_url(type_url) else {
                return;
            };
            self.open = Some(OpenRecord {
                kind,
                at_ms: envoy_time_ms(text).or(runtime_ms).unwrap_or(read_at_ms),
                marked: message.contains(DEBUG_STRING_MARKER),
                lines: vec![message.to_owned()],
            });
        } else if let Some(open) = &mut self.open {
            if open.lines.len() < MAX_RECORD_LINES {
                open.lines.push(text.to_owned());
            }
            // The reason ends the record when the resource came before it.
            if open.marked && text.starts_with(": ") {
                self.close();
            }
        }
    }

    /// The lines read so far end here: a record that can hold no more lines (no
    /// resource printed) is complete; one still waiting for its reason stays open.
    pub fn pause(&mut self) {
        if self.open.as_ref().is_some_and(|o| !o.marked) {
            self.close();
        }
    }

    fn close(&mut self) {
        let Some(open) = self.open.take() else {
            return;
        };
        let record = open.finish();
        let key = (record.kind, record.key_resource().to_owned());
        self.records.insert(key, record);
        if self.records.len() > MAX_RECORDS {
            let oldest = self
                .records
                .iter()
                .min_by_key(|(_, r)| r.at_ms)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.records.remove(&k);
            }
        }
    }

    /// The newest rejection of `sub` written after `after_ms` (any, when `None`).
    pub fn newer_than(&self, sub: &Subscription, after_ms: Option<i64>) -> Option<&LogRejection> {
        let own = self.records.get(&(sub.kind, sub.resource.clone()));
        // A record of EDS or RDS that does not name its resource may be this one's.
        let unnamed = (!sub.kind.wildcard())
            .then(|| self.records.get(&(sub.kind, String::new())))
            .flatten();
        [own, unnamed]
            .into_iter()
            .flatten()
            .filter(|r| after_ms.is_none_or(|t| r.at_ms > t))
            .max_by_key(|r| r.at_ms)
    }

    /// Every rejection kept.
    pub fn records(&self) -> impl Iterator<Item = &LogRejection> {
        self.records.values()
    }
}

impl LogRejection {
    /// The resource the record is kept under: its own for EDS and RDS, "" for the
    /// subscriptions of every cluster or listener.
    fn key_resource(&self) -> &str {
        if self.kind.wildcard() {
            ""
        } else {
            &self.resource
        }
    }
}

impl OpenRecord {
    /// The record's resource and reason. Envoy 1.40 writes
    /// `<prefix>goo.gle/debugstr`, the resource in text form over several lines, then
    /// `: <reason>`; the prefix names listeners (`Error adding/updating listener(s)
    /// <name>: `). Without a resource printed, the whole message is the reason.
    fn finish(self) -> LogRejection {
        let OpenRecord {
            kind, at_ms, lines, ..
        } = self;
        let first = lines.first().map(String::as_str).unwrap_or_default();
        let reason_at = lines
            .iter()
            .skip(1)
            .position(|l| l.starts_with(": "))
            .map(|i| i + 1);
        let (prefix, resource_lines, tail): (&str, Vec<&str>, Vec<&str>) =
            match (first.find(DEBUG_STRING_MARKER), reason_at) {
                (Some(m), Some(r)) => (
                    &first[..m],
                    lines[1..r].iter().map(String::as_str).collect(),
                    lines[r..].iter().map(String::as_str).collect(),
                ),
                (Some(m), None) => (
                    &first[..m],
                    lines[1..].iter().map(String::as_str).collect(),
                    Vec::new(),
                ),
                (None, Some(r)) => (
                    "",
                    lines[..r].iter().map(String::as_str).collect(),
                    lines[r..].iter().map(String::as_str).collect(),
                ),
                (None, None) => ("", Vec::new(), lines.iter().map(String::as_str).collect()),
            };
        let field = if kind == Kind::Endpoints {
            "cluster_name"
        } else {
            "name"
        };
        let resource = resource_lines
            .iter()
            .find_map(|l| text_field(l, field))
            .unwrap_or_default();
        let tail = tail
            .iter()
            .map(|l| l.strip_prefix(": ").unwrap_or(l).trim())
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        let prefix = prefix.trim();
        let mut reason = match (prefix.is_empty(), tail.is_empty()) {
            (true, _) => tail,
            (false, true) => prefix.trim_end_matches(':').to_owned(),
            (false, false) => format!("{prefix} {tail}"),
        };
        // CDS and LDS name no resource on the wire: the reason names it.
        if kind.wildcard() && !resource.is_empty() && !reason.contains(resource.as_str()) {
            reason = format!("{resource}: {reason}");
        }
        truncate(&mut reason, MAX_REASON);
        LogRejection {
            kind,
            resource,
            reason,
            at_ms,
        }
    }
}

/// The value of a top-level string field of a message in protobuf text form
/// (`name: "payments"`, no indentation), its C escapes decoded: `\"`, `\\`, `\n` and
/// the others, and the octal (`\303\251`) and hex escapes `DebugString` writes the
/// bytes of a name past ASCII with.
fn text_field(line: &str, field: &str) -> Option<String> {
    let value = line.strip_prefix(field)?.strip_prefix(": \"")?.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < value.len() {
        let b = value[i];
        i += 1;
        match b {
            b'"' => return Some(String::from_utf8_lossy(&out).into_owned()),
            b'\\' => {
                let e = *value.get(i)?;
                i += 1;
                match e {
                    b'0'..=b'7' => {
                        let mut n = u32::from(e - b'0');
                        for _ in 0..2 {
                            match value.get(i) {
                                Some(d @ b'0'..=b'7') => {
                                    n = n * 8 + u32::from(d - b'0');
                                    i += 1;
                                }
                                _ => break,
                            }
                        }
                        out.push(u8::try_from(n).ok()?);
                    }
                    b'x' => {
                        let hex = |b: u8| char::from(b).to_digit(16);
                        let mut n = hex(*value.get(i)?)?;
                        i += 1;
                        if let Some(d) = value.get(i).and_then(|&b| hex(b)) {
                            n = n * 16 + d;
                            i += 1;
                        }
                        out.push(n as u8);
                    }
                    b'n' => out.push(b'\n'),
                    b'r' => out.push(b'\r'),
                    b't' => out.push(b'\t'),
                    b'a' => out.push(0x07),
                    b'b' => out.push(0x08),
                    b'f' => out.push(0x0c),
                    b'v' => out.push(0x0b),
                    other => out.push(other),
                }
            }
            other => out.push(other),
        }
    }
    None
}

fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// Whether `line` starts an entry of Envoy's log (its default format starts each
/// with `[<date> <time>]`) rather than continuing the one before.
fn starts_entry(line: &str) -> bool {
    let b = line.as_bytes();
    b.first() == Some(&b'[') && b.get(1).is_some_and(u8::is_ascii_digit)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Envoy 1.40's own log while an ADS server sent it, in turn, a cluster with
    /// `connect_timeout: 0s`, endpoints on port 70000, a virtual host without a name,
    /// a connection manager without a stat prefix, all good again, then the bad
    /// cluster again (captured, `agent/tests/fixtures/xds/README.md`).
    fn captured() -> String {
        let path = format!(
            "{}/tests/fixtures/xds/envoy_rejections.log",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(path).unwrap()
    }

    fn parse(text: &str, pause_every: Option<usize>) -> RejectionLog {
        let mut log = RejectionLog::default();
        for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
            log.line(i as u64 + 1, 0, line);
            if pause_every.is_some_and(|n| (i + 1) % n == 0) {
                log.pause();
            }
        }
        log.pause();
        log
    }

    fn ms(stamp: &str) -> i64 {
        envoy_time_ms(&format!("[{stamp}]")).unwrap()
    }

    fn sub(kind: Kind, resource: &str) -> Subscription {
        Subscription {
            kind,
            resource: resource.into(),
        }
    }

    #[test]
    fn the_captured_rejections_are_read_with_their_resource_reason_and_time() {
        let log = parse(&captured(), None);
        let mut records: Vec<&LogRejection> = log.records().collect();
        records.sort_by_key(|r| r.at_ms);
        let got: Vec<(Kind, &str, &str, i64)> = records
            .iter()
            .map(|r| (r.kind, r.resource.as_str(), r.reason.as_str(), r.at_ms))
            .collect();
        assert_eq!(
            got,
            [
                (
                    Kind::Endpoints,
                    "orders",
                    "Proto constraint validation failed (ClusterLoadAssignmentValidationError.Endpoints[0]: embedded message failed validation | caused by LocalityLbEndpointsValidationError.LbEndpoints[0]: embedded message failed validation | caused by LbEndpointValidationError.Endpoint: embedded message failed validation | caused by EndpointValidationError.Address: embedded message failed validation | caused by AddressValidationError.SocketAddress: embedded message failed validation | caused by SocketAddressValidationError.PortValue: value must be less than or equal to 65535)",
                    ms("2026-11-27 17:37:05.267"),
                ),
                (
                    Kind::Routes,
                    "local_route",
                    "Proto constraint validation failed (RouteConfigurationValidationError.VirtualHosts[0]: embedded message failed validation | caused by VirtualHostValidationError.Name: value length must be at least 1 characters)",
                    ms("2026-11-27 17:37:08.322"),
                ),
                (
                    Kind::Listeners,
                    "",
                    "Error adding/updating listener(s) ingress: Proto constraint validation failed (HttpConnectionManagerValidationError.StatPrefix: value length must be at least 1 characters)",
                    ms("2026-11-27 17:37:11.349"),
                ),
                // The newest of the two cluster rejections is kept.
                (
                    Kind::Clusters,
                    "payments",
                    "payments: Proto constraint validation failed (ClusterValidationError.ConnectTimeout: value must be greater than 0s)",
                    ms("2026-11-27 17:37:17.377"),
                ),
            ]
        );
        assert_eq!(ms("2026-11-27 17:37:17.377"), 1_795_801_037_377);
    }

    /// The agent reads the log as it is written: a record may be split between two
    /// reads, and the lines of other entries (the access log) come between records.
    #[test]
    fn records_split_between_reads_are_read_whole() {
        let whole = parse(&captured(), None);
        for every in [1, 2, 3, 7] {
            let split = parse(&captured(), Some(every));
            let mut a: Vec<_> = whole.records().cloned().collect();
            let mut b: Vec<_> = split.records().cloned().collect();
            a.sort_by_key(|r| r.at_ms);
            b.sort_by_key(|r| r.at_ms);
            assert_eq!(a, b, "paused every {every} lines");
        }
    }

    /// In a pod's log file each line carries the container runtime's prefix.
    #[test]
    fn container_runtime_prefixes_are_read_through() {
        let text: String = captured()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| format!("2026-11-27T17:37:20.000000001Z stderr F {l}\n"))
            .collect();
        let plain = parse(&captured(), None);
        let cri = parse(&text, None);
        let mut a: Vec<_> = plain.records().cloned().collect();
        let mut b: Vec<_> = cri.records().cloned().collect();
        a.sort_by_key(|r| r.at_ms);
        b.sort_by_key(|r| r.at_ms);
        assert_eq!(a, b);
    }

    /// Found by the differential tests: a name past ASCII, which `DebugString`
    /// prints in octal escapes, was read as the escapes' digits.
    #[test]
    fn escaped_names_are_decoded() {
        assert_eq!(
            text_field("name: \"caf\\303\\251 \\\"x\\\" \\x41\\n\"", "name").as_deref(),
            Some("café \"x\" A\n")
        );
        assert_eq!(text_field("name: \"unended", "name"), None);
        assert_eq!(text_field("name: \"\\777\"", "name"), None);
    }

    #[test]
    fn stats_name_their_subscription() {
        let cases = [
            (
                "cluster_manager.cds.update_rejected",
                Kind::Clusters,
                "",
                "cluster_manager.cds",
            ),
            (
                "listener_manager.lds.update_success",
                Kind::Listeners,
                "",
                "listener_manager.lds",
            ),
            (
                "cluster.orders.update_time",
                Kind::Endpoints,
                "orders",
                "cluster.orders",
            ),
            (
                "cluster.outbound|80||a.b.svc.update_rejected",
                Kind::Endpoints,
                "outbound|80||a.b.svc",
                "cluster.outbound|80||a.b.svc",
            ),
            (
                "http.ingress.rds.local_route.update_rejected",
                Kind::Routes,
                "local_route",
                "http.ingress.rds.local_route",
            ),
        ];
        for (stat, kind, resource, prefix) in cases {
            assert_eq!(
                subscription_of(stat),
                Some((sub(kind, resource), prefix)),
                "{stat}"
            );
        }
        assert_eq!(subscription_of("control_plane.connected_state"), None);
        assert_eq!(subscription_of("http.ingress.downstream_rq_total"), None);
        assert_eq!(
            success_filter(&["cluster.outbound|80||a.b", "cluster_manager.cds"]),
            r"^(cluster\.outbound\|80\|\|a\.b|cluster_manager\.cds)\.update_(success|time)$"
        );
        let many: Vec<String> = (0..=MAX_NAMED).map(|i| format!("cluster.c{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(success_filter(&many), ALL_SUCCESS_FILTER);
    }

    fn snapshot(values: &[(&str, u64)]) -> StatsSnapshot {
        StatsSnapshot {
            values: values.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            ..StatsSnapshot::default()
        }
    }

    fn counts(values: &[(&str, u64)]) -> Vec<(Subscription, String, u64)> {
        rejected_counts(&snapshot(values))
    }

    /// The counters as the captured sidecar moved them (CDS: a rejection, then a
    /// success, then a rejection again).
    #[test]
    fn a_rejection_stands_until_a_success_follows_it() {
        let mut t = XdsTracker::default();
        let cds = "cluster_manager.cds";
        let success = |n: u64| snapshot(&[("cluster_manager.cds.update_success", n)]);
        // Nothing rejected yet.
        let s = t.update(Some(true), counts(&[]), &StatsSnapshot::default(), 1_000);
        assert_eq!(
            s,
            XdsState {
                connected: Some(true),
                rejected: vec![]
            }
        );
        // The counter rose from nothing: a rejection, with no log to name why.
        let s = t.update(
            Some(true),
            counts(&[(&format!("{cds}.update_rejected"), 1)]),
            &success(1),
            2_000,
        );
        assert_eq!(s.rejected.len(), 1);
        let r = &s.rejected[0];
        assert_eq!(
            (r.kind.as_str(), r.resource.as_str(), r.reason.as_str()),
            ("clusters", "", "")
        );
        assert_eq!(
            (r.since_ms, r.rejected_total, r.success_total),
            (2_000, 1, 1)
        );
        // Still rejected while nothing moves: since stays.
        let s = t.update(
            Some(true),
            counts(&[(&format!("{cds}.update_rejected"), 1)]),
            &success(1),
            3_000,
        );
        assert_eq!(s.rejected[0].since_ms, 2_000);
        // A success clears it.
        let s = t.update(
            Some(true),
            counts(&[(&format!("{cds}.update_rejected"), 1)]),
            &success(2),
            4_000,
        );
        assert!(s.rejected.is_empty());
        // A rejection again.
        let s = t.update(
            Some(true),
            counts(&[(&format!("{cds}.update_rejected"), 2)]),
            &success(2),
            5_000,
        );
        assert_eq!(s.rejected[0].since_ms, 5_000);
        // A rejection and a success in one interval, and no log: not rejected.
        let s = t.update(
            Some(true),
            counts(&[(&format!("{cds}.update_rejected"), 3)]),
            &success(3),
            6_000,
        );
        assert!(s.rejected.is_empty());
        // Two EDS clusters rejected for the first time: one has had a successful
        // update since the last read (which came last is unknown: not rejected), the
        // other not (rejected).
        let eds = counts(&[
            (&format!("{cds}.update_rejected"), 3),
            ("cluster.a.update_rejected", 1),
            ("cluster.b.update_rejected", 1),
        ]);
        let second = snapshot(&[
            ("cluster.a.update_success", 2),
            ("cluster.a.update_time", 6_500),
            ("cluster.b.update_success", 1),
            ("cluster.b.update_time", 100),
        ]);
        let s = t.update(Some(true), eds, &second, 7_000);
        let got: Vec<(&str, &str, i64)> = s
            .rejected
            .iter()
            .map(|r| (r.kind.as_str(), r.resource.as_str(), r.since_ms))
            .collect();
        assert_eq!(got, [("endpoints", "b", 7_000)]);
    }

    /// A rejection and a successful update in one interval, the log's line not yet
    /// written (Envoy writes its log in batches): undecided, then rejected once the
    /// line comes; a success before the line, or no line within the wait, leaves it
    /// as the baseline. The line is the captured sidecar's cluster rejection of
    /// 17:37:17.377, after a success at 17:37:17.000.
    #[test]
    fn a_rejection_waits_for_its_late_log_line() {
        let rejected = |n: u64| counts(&[("cluster_manager.cds.update_rejected", n)]);
        let second = |n: u64, at: i64| {
            snapshot(&[
                ("cluster_manager.cds.update_success", n),
                ("cluster_manager.cds.update_time", at as u64),
            ])
        };
        let success_at = 1_795_801_037_000;
        let read_at = success_at + 1_000;
        for (line_comes, success_after, wait, want) in [
            // The line comes by the next read: rejected from then.
            (true, false, 5_000, true),
            // A success before the line's read: the newer success wins.
            (true, true, 5_000, false),
            // No line within the wait: the baseline.
            (false, false, LOG_LAG_MS + 1_000, false),
        ] {
            let case = format!("line {line_comes}, success after {success_after}, wait {wait}");
            let mut t = XdsTracker::default();
            let s = t.update(
                Some(true),
                rejected(0),
                &second(1, success_at - 10_000),
                read_at - 5_000,
            );
            assert!(s.rejected.is_empty(), "{case}");
            // Rejected, and a success in the same interval; the log has no line yet.
            let s = t.update(Some(true), rejected(1), &second(2, success_at), read_at);
            assert!(s.rejected.is_empty(), "{case}: undecided is not rejected");
            if line_comes {
                for (i, line) in captured().lines().enumerate() {
                    t.log_mut().line(i as u64 + 1, 0, line);
                }
                t.log_mut().pause();
            }
            let success = if success_after { 3 } else { 2 };
            let later = read_at + wait;
            let s = t.update(Some(true), rejected(1), &second(success, success_at), later);
            assert_eq!(s.rejected.len(), usize::from(want), "{case}: {s:?}");
            if want {
                assert_eq!(s.rejected[0].since_ms, later, "{case}");
                assert!(
                    s.rejected[0].reason.ends_with(
                        "(ClusterValidationError.ConnectTimeout: value must be greater than 0s)"
                    ),
                    "{case}: {s:?}"
                );
            }
            // Decided either way: no longer waiting for the log.
            assert!(t.subs.values().all(|s| s.undecided.is_none()), "{case}");
        }
    }

    /// After an agent restart the counters say a subscription was rejected once; the
    /// log decides whether that still stands: a rejection newer than the last
    /// successful update does, an older one is the baseline.
    #[test]
    fn a_rejection_first_seen_stands_only_when_the_log_says_so() {
        let rejected = [
            ("cluster_manager.cds.update_rejected", 2),
            ("cluster.orders.update_rejected", 1),
            ("http.ingress.rds.local_route.update_rejected", 1),
        ];
        // Stats of the captured sidecar after its last cluster rejection (17:37:17):
        // CDS last succeeded at 17:37:14, EDS and RDS too, after their rejections.
        let second = snapshot(&[
            ("cluster_manager.cds.update_success", 2),
            ("cluster_manager.cds.update_time", 1_795_801_034_364),
            ("cluster.orders.update_success", 2),
            ("cluster.orders.update_time", 1_795_801_034_379),
            ("http.ingress.rds.local_route.update_success", 2),
            (
                "http.ingress.rds.local_route.update_time",
                1_795_801_034_385,
            ),
        ]);
        let mut t = XdsTracker::default();
        for (i, line) in captured()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
        {
            t.log_mut().line(i as u64 + 1, 0, line);
        }
        t.log_mut().pause();
        let s = t.update(Some(true), counts(&rejected), &second, 9_000);
        assert_eq!(s.rejected.len(), 1, "{s:?}");
        let r = &s.rejected[0];
        assert_eq!(r.kind, "clusters");
        assert!(
            r.reason.ends_with(
                "(ClusterValidationError.ConnectTimeout: value must be greater than 0s)"
            ),
            "{}",
            r.reason
        );
        assert_eq!(
            (r.since_ms, r.rejected_total, r.success_total),
            (9_000, 2, 2)
        );
        // Without the log, first-seen counters are the baseline.
        let mut bare = XdsTracker::default();
        assert!(
            bare.update(Some(true), counts(&rejected), &second, 9_000)
                .rejected
                .is_empty()
        );
    }

    #[test]
    fn at_most_the_newest_rejections_are_listed() {
        let mut t = XdsTracker::default();
        let names: Vec<String> = (0..100)
            .map(|i| format!("cluster.c{i:03}.update_rejected"))
            .collect();
        let values: Vec<(&str, u64)> = names.iter().map(|n| (n.as_str(), 1)).collect();
        // First seen without a log: the baseline; then each rejected again.
        t.update(Some(true), counts(&values), &StatsSnapshot::default(), 1);
        let again: Vec<(&str, u64)> = names.iter().map(|n| (n.as_str(), 2)).collect();
        let s = t.update(Some(true), counts(&again), &StatsSnapshot::default(), 2);
        assert_eq!(s.rejected.len(), MAX_XDS_REJECTIONS);
        assert_eq!(s.rejected[0].resource, "c000");
    }
}
