//! Runs the aggregator's commands against this agent's sidecars, and feeds the
//! reporter with the board's snapshots. Each command reaches the sidecar through the
//! admin API client of the target it names by zone, cluster and instance (a command of
//! an older aggregator names only the instance, and then reaches a sidecar only when
//! one alone has that name); the diagnosis commands also read the
//! target's log tail and run its debug windows ([`crate::sidecars`]).

use futures::FutureExt;
use futures::future::BoxFuture;
use std::time::Duration;

use meshcat_common::wire::{
    Command, CommandOutput, EvidenceOutput, InstanceReport, LineQuery, LogWindow,
};
use serde_json::Value;

use crate::debugwindow::is_tls_line;
use crate::envoy::{EnvoyAdmin, seed_level};
use crate::logtail::{Coverage, LogTail, TailedLine};
use crate::report::{CommandHandler, SnapshotSource};
use crate::state::{Agent, TargetChoice};
use crate::target::TargetKey;

impl SnapshotSource for Agent {
    fn snapshot(&self) -> Vec<InstanceReport> {
        self.board().snapshot()
    }
}

impl CommandHandler for Agent {
    fn handle(
        &self,
        target: TargetKey,
        cmd: Command,
    ) -> BoxFuture<'static, Result<CommandOutput, String>> {
        let agent = self.clone();
        async move { run(&agent, &target, cmd).await }.boxed()
    }
}

async fn run(agent: &Agent, named: &TargetKey, cmd: Command) -> Result<CommandOutput, String> {
    let choice = TargetChoice::of_command(&named.zone_name, &named.cluster_name, &named.instance);
    let target = agent.target(&choice).map_err(|e| e.to_string())?;
    let key = target.key();
    let admin = agent.admin_client(&target).map_err(|e| e.to_string())?;
    match cmd {
        Command::ConfigDump => admin
            .config_dump()
            .await
            .map(CommandOutput::ConfigDump)
            .map_err(|e| e.to_string()),
        Command::GetLogLevel => admin
            .log_level()
            .await
            .map(|l| CommandOutput::LogLevel(seed_level(&l).to_owned()))
            .map_err(|e| e.to_string()),
        Command::SetLogLevel { level } => {
            admin
                .set_log_level(&level)
                .await
                .map_err(|e| e.to_string())?;
            let now = admin.log_level().await.map_err(|e| e.to_string())?;
            Ok(CommandOutput::LogLevel(seed_level(&now).to_owned()))
        }
        Command::DebugWindow { seconds } => {
            let diag = agent
                .diagnostics()
                .get(&key)
                .ok_or_else(|| format!("no sidecar instance is {choice}"))?;
            let report = diag
                .windows
                .run(Duration::from_secs(u64::from(seconds)))
                .await
                .map_err(|e| e.to_string())?;
            Ok(CommandOutput::DebugWindow(report.summary))
        }
        Command::Evidence {
            path,
            max_lines,
            debug_seconds,
            lines,
        } => Ok(CommandOutput::Evidence(
            evidence(
                agent,
                &admin,
                &key,
                Wanted {
                    path: path.as_deref(),
                    max_lines,
                    query: lines.as_ref(),
                },
                debug_seconds,
            )
            .await,
        )),
    }
}

/// Most log lines one evidence answer carries.
pub const MAX_EVIDENCE_LINES: usize = 5_000;
/// Most bytes of log text one evidence answer carries (the reply must fit a frame
/// beside the admin documents).
pub const MAX_EVIDENCE_LOG_BYTES: usize = 1 << 20;
/// Longest log line carried; longer ones are cut.
pub const MAX_EVIDENCE_LINE_LEN: usize = 8 << 10;

/// The log lines an evidence command asks for.
#[derive(Debug, Clone, Copy)]
struct Wanted<'a> {
    path: Option<&'a str>,
    max_lines: u32,
    /// Present from an aggregator that reads the log window.
    query: Option<&'a LineQuery>,
}

/// Collects one sidecar's evidence; what cannot be read is named in `errors`
/// instead of failing the whole answer, so the diagnosis skips only what it lacks.
async fn evidence(
    agent: &Agent,
    admin: &EnvoyAdmin,
    target: &TargetKey,
    wanted: Wanted<'_>,
    debug_seconds: Option<u32>,
) -> EvidenceOutput {
    let mut out = EvidenceOutput::default();
    let diag = agent.diagnostics().get(target);
    let tail = diag.as_ref().and_then(|d| d.tail.clone());
    if wanted.query.is_some_and(|q| q.log_only) {
        out.errors.extend(freshen(admin, tail.as_ref()).await);
        log_evidence(&mut out, tail.as_ref(), wanted);
        return out;
    }
    if let Some(seconds) = debug_seconds {
        match &diag {
            Some(d) => match d.windows.run(Duration::from_secs(u64::from(seconds))).await {
                Ok(report) => {
                    let lines = d.windows.lines_of(&report);
                    out.debug_lines = Some(bounded(
                        lines
                            .iter()
                            .map(|l| l.text.as_str())
                            .filter(|t| is_debug_evidence(t)),
                        MAX_EVIDENCE_LINES,
                    ));
                    out.debug_window = Some(report.summary);
                }
                Err(e) => out.errors.push(format!("debug window: {e}")),
            },
            None => out
                .errors
                .push("debug window: the sidecar has no debug windows".into()),
        }
    }
    let (clusters, dump, stats, fresh) = tokio::join!(
        admin.clusters_text(),
        admin.config_dump(),
        admin.ssl_stats_text(),
        freshen(admin, tail.as_ref())
    );
    out.errors.extend(fresh);
    match clusters {
        Ok(t) => out.clusters_json = Some(t),
        Err(e) => out.errors.push(format!("/clusters: {e}")),
    }
    match dump {
        Ok(t) => out.config_dump_json = Some(trim_config_dump(t)),
        Err(e) => out.errors.push(format!("/config_dump: {e}")),
    }
    match stats {
        Ok(t) => out.stats_json = Some(t),
        Err(e) => out.errors.push(format!("/stats: {e}")),
    }
    log_evidence(&mut out, tail.as_ref(), wanted);
    out
}

/// Adds the log lines `wanted` names, and what they cover when the asker reads it.
fn log_evidence(out: &mut EvidenceOutput, tail: Option<&LogTail>, wanted: Wanted<'_>) {
    match tail {
        Some(tail) => {
            let (lines, coverage) = log_lines(tail, wanted);
            out.log_lines = Some(lines);
            if wanted.query.is_some() {
                out.log_window = Some(LogWindow {
                    from_ms: coverage.from_ms,
                    start: coverage.start,
                    held_max_lines: tail.max_lines() as u64,
                    to_ms: crate::logtail::now_ms(),
                });
            }
        }
        None => out
            .errors
            .push("log: no --sidecar-log-file (or logFile) is set for this sidecar".into()),
    }
}

/// Makes the tail hold the requests made until now: Envoy buffers file access logs
/// for up to `--file-flush-interval-msec` (10 s by default), so the sidecar is asked
/// to write them out (`POST /reopen_logs`), then the tail reads up to the size the
/// file has at that moment. Answers why the lines may be stale, if they may.
async fn freshen(admin: &EnvoyAdmin, tail: Option<&LogTail>) -> Vec<String> {
    let Some(tail) = tail else {
        return Vec::new();
    };
    let mut errors = Vec::new();
    let end = tokio::time::Instant::now() + CATCH_UP_LIMIT;
    match admin.flush_access_logs().await {
        Ok(()) => {
            // The flush thread writes after the admin answered: wait until it holds
            // nothing back, so the file's size below includes every line.
            if let Err(e) = flushed(admin, end).await {
                errors.push(format!("log: {e}; lines of the last 10 s may be missing"));
            }
        }
        Err(e) => errors.push(format!(
            "log: the sidecar did not flush its access logs ({e}); lines of the last 10 s may be missing"
        )),
    }
    let left = end.saturating_duration_since(tokio::time::Instant::now());
    if !tail.catch_up(left).await {
        errors.push(format!(
            "log: the tail did not reach the end of {} within {CATCH_UP_LIMIT:?}",
            tail.path().display()
        ));
    }
    errors
}

/// Waits until the sidecar's flush thread has written every buffered access line, or
/// `end`. Each look is one admin call: the loop waits on the sidecar's answer, and
/// between looks on a short pause, so a busy sidecar is not hammered.
async fn flushed(admin: &EnvoyAdmin, end: tokio::time::Instant) -> Result<(), String> {
    loop {
        let buffered = admin
            .access_log_bytes_buffered()
            .await
            .map_err(|e| format!("the sidecar's access log buffer could not be read ({e})"))?;
        if buffered == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= end {
            return Err(format!(
                "the sidecar still held {buffered} bytes of access lines after {CATCH_UP_LIMIT:?}"
            ));
        }
        tokio::time::sleep(FLUSH_LOOK_INTERVAL).await;
    }
}

/// Pause between two looks at the sidecar's access log buffer.
const FLUSH_LOOK_INTERVAL: Duration = Duration::from_millis(5);

/// Longest wait for the tail to read what the sidecar flushed: well inside the
/// aggregator's command deadline (5 s by default).
const CATCH_UP_LIMIT: Duration = Duration::from_secs(2);

/// Lines of a debug window the diagnosis reads: TLS failures and the secrets stream.
fn is_debug_evidence(text: &str) -> bool {
    is_tls_line(text)
        || text.contains("StreamSecrets")
        || text.contains("SecretDiscoveryService")
        || text.contains("initial fetch timed out")
}

/// The lines of the tail the diagnosis reads, oldest first: the newest access lines
/// (those naming the path when one is given; with a request id, every line naming
/// it instead), and apart from them the newest lines of Envoy's own, so that a
/// flood of either kind (a debug window's lines, a busy sidecar's requests) cannot
/// push the other out. Each kind is bounded by `max_lines` and half the answer's
/// bytes. Answers what the first kind covers.
fn log_lines(tail: &LogTail, wanted: Wanted<'_>) -> (Vec<String>, Coverage) {
    let max = usize::try_from(wanted.max_lines)
        .unwrap_or(usize::MAX)
        .min(MAX_EVIDENCE_LINES / 2);
    let half = MAX_EVIDENCE_LOG_BYTES / 2;
    let request_id = wanted.query.and_then(|q| q.request_id.as_deref());
    let is_request_line = |t: &str| match (request_id, wanted.path) {
        (Some(id), _) => t.contains(id),
        (None, Some(p)) => is_access_line(t) && t.contains(p),
        (None, None) => is_access_line(t),
    };
    let (requests, coverage) = tail.newest(is_request_line, max, half, MAX_EVIDENCE_LINE_LEN);
    let own = if wanted.query.is_some_and(|q| q.log_only) {
        Vec::new()
    } else {
        tail.newest(
            |t| !is_access_line(t) && !is_request_line(t),
            max,
            half,
            MAX_EVIDENCE_LINE_LEN,
        )
        .0
    };
    let mut lines: Vec<TailedLine> = requests.into_iter().chain(own).collect();
    lines.sort_by_key(|l| l.seq);
    let out = lines.iter().map(|l| cut(&l.text).to_owned()).collect();
    (out, coverage)
}

/// Whether a line is an access line of Envoy's default format (`... "GET /x HTTP/1.1" ...`).
fn is_access_line(text: &str) -> bool {
    text.contains(" HTTP/1") || text.contains(" HTTP/2") || text.contains(" HTTP/3")
}

/// At most `max` lines and [`MAX_EVIDENCE_LOG_BYTES`], each cut to
/// [`MAX_EVIDENCE_LINE_LEN`] at a character boundary.
fn bounded<'a>(lines: impl Iterator<Item = &'a str>, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut bytes = 0;
    for l in lines.take(max) {
        let l = cut(l);
        bytes += l.len();
        if bytes > MAX_EVIDENCE_LOG_BYTES {
            break;
        }
        out.push(l.to_owned());
    }
    out
}

/// `line` cut to [`MAX_EVIDENCE_LINE_LEN`] at a character boundary.
fn cut(line: &str) -> &str {
    let mut end = line.len().min(MAX_EVIDENCE_LINE_LEN);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

/// Keeps the listeners, routes and clusters of a config dump (what the routes check
/// reads), so secrets and the bootstrap never leave the agent and the answer stays
/// small. Text that is not a dump is passed on for the diagnosis to refuse.
fn trim_config_dump(text: String) -> String {
    let Ok(mut dump) = serde_json::from_str::<Value>(&text) else {
        return text;
    };
    if let Some(Value::Array(configs)) = dump.get_mut("configs") {
        configs.retain(|c| {
            c.get("@type").and_then(Value::as_str).is_some_and(|t| {
                t.ends_with("ListenersConfigDump")
                    || t.ends_with("RoutesConfigDump")
                    || t.ends_with("ScopedRoutesConfigDump")
                    || t.ends_with("ClustersConfigDump")
            })
        });
        return dump.to_string();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logtail::TailConfig;
    use crate::state::TargetError;
    use crate::target::Target;
    use meshcat_common::wire::WindowStart;

    fn target(zone: &str, instance: &str, port: u16) -> Target {
        Target {
            admin: format!("127.0.0.1:{port}"),
            zone_name: zone.into(),
            cluster_name: "c".into(),
            instance: instance.into(),
            log_file: None,
            local_cluster: None,
            netns: None,
        }
    }

    /// The debug window's answer as MessagePack, after the envelope's version: `Ok`,
    /// the `DebugWindow` variant, then `DebugWindowOutput` as an array of its nine
    /// fields in order, the TLS lines as plain text.
    const DEBUG_WINDOW_ANSWER: &[u8] = b"\x81\xa2Ok\x81\xabDebugWindow\x99\
          \xa7warning\
          \xcf\x00\x00\x01\x8b\xcf\xe5h\x00\
          \xcf\x00\x00\x01\x8b\xcf\xe5o\xd0\
          \xc3\xc2\xc3\
          \x03\
          \x91\xd9(TLS error: Secret is not supplied by SDS\
          \x01";

    #[test]
    fn the_debug_window_answer_keeps_its_encoding() {
        let report = crate::debugwindow::DebugWindowReport {
            summary: meshcat_common::wire::DebugWindowOutput {
                previous_level: "warning".into(),
                started_at_ms: 1_700_000_000_000,
                ended_at_ms: 1_700_000_002_000,
                restored: true,
                cut_short: false,
                log_tailed: true,
                line_count: 3,
                tls_lines: vec!["TLS error: Secret is not supplied by SDS".into()],
                tls_line_count: 1,
            },
            after_seq: 7,
            last_seq: 10,
        };
        let frame = meshcat_common::wire::encode(
            &Ok::<_, String>(CommandOutput::DebugWindow(report.summary)),
            1 << 20,
        )
        .unwrap();
        assert!(frame.ends_with(DEBUG_WINDOW_ANSWER), "{:?}", &frame[4..]);
    }

    #[tokio::test]
    async fn a_command_reaches_the_sidecar_of_its_zone_cluster_and_instance() {
        let agent = Agent::new(Duration::from_secs(1));
        agent.set_targets(vec![
            target("a", "orders-1", 1),
            target("b", "orders-1", 2),
            target("a", "other", 3),
        ]);
        let pick = |z: &str, c: &str, i: &str| {
            agent
                .target(&TargetChoice::of_command(z, c, i))
                .map(|t| t.admin)
        };
        assert_eq!(pick("a", "c", "orders-1").unwrap(), "127.0.0.1:1");
        assert_eq!(pick("b", "c", "orders-1").unwrap(), "127.0.0.1:2");
        assert!(matches!(
            pick("a", "d", "orders-1"),
            Err(TargetError::Unknown(_))
        ));
        assert!(matches!(
            pick("z", "c", "orders-1"),
            Err(TargetError::Unknown(_))
        ));
        // An older aggregator's command names the instance only: it runs when one
        // sidecar alone has that name, and is refused, never guessed, otherwise.
        assert_eq!(pick("", "", "other").unwrap(), "127.0.0.1:3");
        assert!(matches!(
            pick("", "", "orders-1"),
            Err(TargetError::SameName(_))
        ));
        // The ops port without a choice, with several targets.
        assert!(matches!(
            agent.target(&TargetChoice::default()),
            Err(TargetError::Ambiguous)
        ));
        // The diagnostics of both sidecars of one name are kept apart.
        let a = TargetKey::new("a", "c", "orders-1");
        let b = TargetKey::new("b", "c", "orders-1");
        assert!(agent.diagnostics().get(&a).is_some());
        assert!(agent.diagnostics().get(&b).is_some());
        agent.diagnostics().shutdown().await;
    }

    #[test]
    fn trims_the_config_dump_to_listeners_routes_and_clusters() {
        let dump = serde_json::json!({"configs": [
            {"@type": "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump", "bootstrap": {}},
            {"@type": "type.googleapis.com/envoy.admin.v3.RoutesConfigDump", "static_route_configs": []},
            {"@type": "type.googleapis.com/envoy.admin.v3.SecretsConfigDump", "static_secrets": []},
        ]});
        let out: Value = serde_json::from_str(&trim_config_dump(dump.to_string())).unwrap();
        assert_eq!(out["configs"].as_array().unwrap().len(), 1);
        assert_eq!(trim_config_dump("not json".into()), "not json");
    }

    #[test]
    fn bounds_lines() {
        let long = "é".repeat(MAX_EVIDENCE_LINE_LEN);
        let out = bounded([long.as_str(), "b", "c"].into_iter(), 2);
        assert_eq!(out.len(), 2);
        assert!(out[0].len() <= MAX_EVIDENCE_LINE_LEN);
        assert!(is_access_line(
            "[2026-01-01T00:00:00.000Z] \"GET /x HTTP/1.1\" 503 UF 0 91 1 - \"-\""
        ));
        assert!(!is_access_line(
            "[2026-01-01 00:00:00.000][7][info][main] starting"
        ));
    }

    /// A request's access line, then a flood: Envoy's own lines (a debug window) and
    /// other requests' access lines (a busy sidecar). Each kind is picked apart, so
    /// neither pushes the other out, and the request's lines are found by its id
    /// however many other access lines came after them.
    #[tokio::test]
    async fn a_flood_of_other_lines_does_not_push_the_requests_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sidecar.log");
        let access = |p: &str, id: &str| {
            format!(
                "[2026-01-01T00:00:00.000Z] \"GET {p} HTTP/1.1\" 200 - 0 2 1 1 \"-\" \"ua\" \"{id}\" \"a\" \"127.0.0.1:8\"\n"
            )
        };
        let mut text = access("/catalog/a", "req-1");
        for i in 0..50 {
            text.push_str(&format!(
                "[2026-01-01 00:00:01.000][7][debug][admin] [admin.cc:1] request {i}\n"
            ));
        }
        std::fs::write(&path, &text).unwrap();
        let tail = LogTail::new(TailConfig::new(&path));
        assert!(tail.catch_up(Duration::from_secs(5)).await);
        let query = LineQuery::default();
        let wanted = |max_lines, query| Wanted {
            path: None,
            max_lines,
            query,
        };
        let (lines, coverage) = log_lines(&tail, wanted(10, Some(&query)));
        assert!(lines.iter().any(|l| l.contains("req-1")), "{lines:?}");
        assert_eq!(lines.len(), 11);
        assert_eq!(coverage.start, WindowStart::Began);
        // Busy: more access lines of other requests than the answer carries.
        let mut busy = String::new();
        for i in 0..20 {
            busy.push_str(&access("/other", &format!("o-{i}")));
        }
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut f, busy.as_bytes()).unwrap();
        assert!(tail.catch_up(Duration::from_secs(5)).await);
        let (lines, coverage) = log_lines(&tail, wanted(10, Some(&query)));
        assert!(!lines.iter().any(|l| l.contains("req-1")));
        assert_eq!(coverage.start, WindowStart::Answer);
        // By its id, the request's line alone (and no Envoy line in a second look).
        let by_id = LineQuery {
            request_id: Some("req-1".into()),
            log_only: true,
        };
        let (lines, coverage) = log_lines(&tail, wanted(10, Some(&by_id)));
        assert_eq!(lines, [access("/catalog/a", "req-1").trim_end()]);
        assert_eq!(coverage.start, WindowStart::Began);
        // By its path, as the agent is asked with one.
        let by_path = Wanted {
            path: Some("/catalog/a"),
            max_lines: 10,
            query: Some(&query),
        };
        let (lines, _) = log_lines(&tail, by_path);
        assert_eq!(
            lines.iter().filter(|l| l.contains("/catalog/a")).count(),
            1,
            "{lines:?}"
        );
        assert!(!lines.iter().any(|l| l.contains("/other")));
    }
}
