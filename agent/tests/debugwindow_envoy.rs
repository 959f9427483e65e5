//! Debug windows against a real Envoy 1.40: the level reads debug during the window
//! and the previous level after it; Envoy's debug lines of the window are collected;
//! overlapping windows restore once; cancel restores at once; an asker that goes away
//! does not leave the sidecar at debug; a failed restore is retried. Also the TLS
//! matcher over a debug log captured from a real mTLS failure.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use meshcat_agent::debugwindow::{
    DebugWindowError, DebugWindows, LevelControl, TLS_MARKERS, is_tls_line,
};
use meshcat_agent::logtail::{LogTail, TailConfig};
use tokio_util::sync::CancellationToken;

mod support;

use support::Envoy;

/// The wait for Envoy's file flush (`support::FLUSH`) after a window.
const SETTLE: Duration = Duration::from_millis(700);

/// The level control the agent's admin client provides, over Envoy's admin API.
struct AdminLevel {
    client: reqwest::Client,
    base: String,
}

impl AdminLevel {
    fn new(envoy: &Envoy) -> Arc<AdminLevel> {
        Arc::new(AdminLevel {
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap(),
            base: format!("http://{}", envoy.admin),
        })
    }

    async fn level(&self) -> String {
        self.get_level().await.unwrap()
    }

    async fn get(&self, path: &str) {
        let r = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
}

/// The most common level in `POST /logging`'s `active loggers:` list.
fn dominant_level(text: &str) -> Option<String> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for line in text
        .lines()
        .skip_while(|l| !l.starts_with("active loggers:"))
    {
        let Some((_, level)) = line.trim().split_once(": ") else {
            continue;
        };
        match counts.iter_mut().find(|(l, _)| l == level) {
            Some((_, n)) => *n += 1,
            None => counts.push((level.to_owned(), 1)),
        }
    }
    counts.into_iter().max_by_key(|(_, n)| *n).map(|(l, _)| l)
}

impl LevelControl for AdminLevel {
    fn get_level(&self) -> BoxFuture<'static, Result<String, String>> {
        let req = self.client.post(format!("{}/logging", self.base));
        async move {
            let r = req.send().await.map_err(|e| e.to_string())?;
            let text = r.text().await.map_err(|e| e.to_string())?;
            dominant_level(&text).ok_or_else(|| format!("no level in {text:?}"))
        }
        .boxed()
    }

    fn set_level(&self, level: &str) -> BoxFuture<'static, Result<(), String>> {
        let req = self
            .client
            .post(format!("{}/logging?level={level}", self.base));
        async move {
            let r = req.send().await.map_err(|e| e.to_string())?;
            if r.status().is_success() {
                Ok(())
            } else {
                Err(format!("admin answered {}", r.status()))
            }
        }
        .boxed()
    }
}

/// Passes calls to Envoy, records each level set, and fails the first `fail_restores`
/// attempts at setting a level other than debug (an admin API that hiccups).
struct Recording {
    inner: Arc<AdminLevel>,
    sets: Mutex<Vec<String>>,
    fail_restores: Mutex<u32>,
}

impl Recording {
    fn new(inner: Arc<AdminLevel>, fail_restores: u32) -> Arc<Recording> {
        Arc::new(Recording {
            inner,
            sets: Mutex::new(Vec::new()),
            fail_restores: Mutex::new(fail_restores),
        })
    }

    fn sets(&self) -> Vec<String> {
        self.sets.lock().unwrap().clone()
    }
}

impl LevelControl for Recording {
    fn get_level(&self) -> BoxFuture<'static, Result<String, String>> {
        self.inner.get_level()
    }

    fn set_level(&self, level: &str) -> BoxFuture<'static, Result<(), String>> {
        self.sets.lock().unwrap().push(level.to_owned());
        if level != "debug" {
            let mut left = self.fail_restores.lock().unwrap();
            if *left > 0 {
                *left -= 1;
                return async { Err("admin API unavailable".to_owned()) }.boxed();
            }
        }
        self.inner.set_level(level)
    }
}

async fn wait_level(control: &AdminLevel, want: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if control.level().await == want {
            return;
        }
        assert!(Instant::now() < deadline, "level never read {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn tail_of(envoy: &Envoy, cancel: &CancellationToken) -> LogTail {
    let (tail, _task) = LogTail::spawn(
        TailConfig {
            poll_interval: Duration::from_millis(50),
            ..TailConfig::new(&envoy.log)
        },
        cancel.child_token(),
    );
    tail
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_raises_debug_collects_its_lines_and_restores() {
    let envoy = Envoy::start("warning");
    let admin = AdminLevel::new(&envoy);
    assert_eq!(admin.level().await, "warning");
    let cancel = CancellationToken::new();
    let tail = tail_of(&envoy, &cancel);
    let windows =
        DebugWindows::with_settle(admin.clone(), Some(tail.clone()), cancel.clone(), SETTLE);

    let w = windows.clone();
    let run = tokio::spawn(async move { w.run(Duration::from_secs(2)).await });
    wait_level(&admin, "debug", Duration::from_secs(5)).await;
    admin.get("/ready?marker=inside-the-window").await;
    let report = run.await.unwrap().expect("window ran");

    assert_eq!(report.summary.previous_level, "warning");
    assert!(report.summary.restored && !report.summary.cut_short && report.summary.log_tailed);
    assert!(report.summary.ended_at_ms - report.summary.started_at_ms >= 2_000);
    assert_eq!(admin.level().await, "warning");
    assert!(report.summary.line_count > 0);
    assert_eq!(
        report.summary.line_count,
        report.last_seq - report.after_seq
    );
    let window = windows.lines_of(&report);
    assert_eq!(window.len() as u64, report.summary.line_count);
    assert!(
        window
            .iter()
            .any(|l| l.text.contains("[debug]") && l.text.contains("marker=inside-the-window")),
        "Envoy's debug lines of the admin request are in the window"
    );
    // This Envoy has no TLS at all.
    assert_eq!(report.summary.tls_line_count, 0);
    assert!(report.summary.tls_lines.is_empty());
    cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_windows_join_and_restore_once() {
    let envoy = Envoy::start("warning");
    let admin = AdminLevel::new(&envoy);
    let control = Recording::new(admin.clone(), 0);
    let cancel = CancellationToken::new();
    let windows = DebugWindows::with_settle(
        control.clone(),
        Some(tail_of(&envoy, &cancel)),
        cancel.clone(),
        SETTLE,
    );

    let w = windows.clone();
    let first = tokio::spawn(async move { w.run(Duration::from_secs(1)).await });
    wait_level(&admin, "debug", Duration::from_secs(5)).await;
    let joined_at = Instant::now();
    let second = windows.run(Duration::from_secs(2)).await.expect("joined");
    assert!(
        joined_at.elapsed() >= Duration::from_secs(2),
        "the window lasts to the later end"
    );
    let first = first.await.unwrap().expect("first");
    assert_eq!(first, second, "both askers see the one window");
    assert_eq!(first.summary.previous_level, "warning");
    assert_eq!(control.sets(), ["debug", "warning"]);
    assert_eq!(admin.level().await, "warning");

    // A window after that one reads the restored level, not debug.
    let again = windows.run(Duration::from_secs(1)).await.unwrap();
    assert_eq!(again.summary.previous_level, "warning");
    assert_eq!(control.sets(), ["debug", "warning", "debug", "warning"]);
    cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_restores_at_once() {
    let envoy = Envoy::start("error");
    let admin = AdminLevel::new(&envoy);
    let cancel = CancellationToken::new();
    let windows = DebugWindows::with_settle(
        admin.clone(),
        Some(tail_of(&envoy, &cancel)),
        cancel.clone(),
        SETTLE,
    );
    let w = windows.clone();
    let run = tokio::spawn(async move { w.run(Duration::from_secs(300)).await });
    wait_level(&admin, "debug", Duration::from_secs(5)).await;

    let cancelled_at = Instant::now();
    cancel.cancel();
    let report = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("the window ends on cancel")
        .unwrap()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), windows.wait_restored())
        .await
        .unwrap();
    assert!(cancelled_at.elapsed() < Duration::from_secs(5));
    assert!(report.summary.cut_short && report.summary.restored);
    assert_eq!(report.summary.previous_level, "error");
    assert_eq!(admin.level().await, "error");
    assert_eq!(
        windows.run(Duration::from_secs(1)).await,
        Err(DebugWindowError::ShuttingDown)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_level_is_restored_when_the_asker_goes_away() {
    let envoy = Envoy::start("info");
    let admin = AdminLevel::new(&envoy);
    let cancel = CancellationToken::new();
    // No log file configured: the window still raises and restores the level.
    let windows = DebugWindows::with_settle(admin.clone(), None, cancel.clone(), SETTLE);
    let w = windows.clone();
    let asker = tokio::spawn(async move { w.run(Duration::from_secs(1)).await });
    wait_level(&admin, "debug", Duration::from_secs(5)).await;
    asker.abort();
    assert!(asker.await.unwrap_err().is_cancelled());
    wait_level(&admin, "info", Duration::from_secs(10)).await;

    let report = windows.run(Duration::from_secs(1)).await.unwrap();
    assert!(!report.summary.log_tailed);
    assert_eq!(report.summary.line_count, 0);
    assert_eq!(report.summary.previous_level, "info");
    cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_restore_is_retried_and_bad_lengths_touch_nothing() {
    let envoy = Envoy::start("warning");
    let admin = AdminLevel::new(&envoy);
    let control = Recording::new(admin.clone(), 2);
    let cancel = CancellationToken::new();
    let windows = DebugWindows::with_settle(control.clone(), None, cancel.clone(), SETTLE);

    for bad in [
        Duration::ZERO,
        Duration::from_millis(500),
        Duration::from_secs(301),
    ] {
        assert!(matches!(
            windows.run(bad).await,
            Err(DebugWindowError::Duration(_))
        ));
    }
    assert!(control.sets().is_empty());

    let report = windows.run(Duration::from_secs(1)).await.unwrap();
    assert!(report.summary.restored);
    assert_eq!(control.sets(), ["debug", "warning", "warning", "warning"]);
    assert_eq!(admin.level().await, "warning");
    cancel.cancel();
}

#[tokio::test]
async fn tls_lines_of_a_captured_mtls_failure_are_matched() {
    // Envoy's debug log captured during an edge to sidecar handshake with an
    // untrusted client certificate (diagnose/scenarios/untrusted_client_cert).
    let captured = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../diagnose/tests/fixtures/untrusted_client_cert/service.debug.log");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sidecar.log");
    std::fs::copy(&captured, &path).unwrap();
    let tail = LogTail::new(TailConfig::new(&path));
    tail.refresh().await;

    let expected = BufReader::new(std::fs::File::open(&captured).unwrap())
        .lines()
        .map(Result::unwrap)
        .filter(|l| TLS_MARKERS.iter().any(|m| l.contains(m)))
        .count();
    let matched: Vec<_> = tail
        .lines_since(0)
        .into_iter()
        .filter(|l| is_tls_line(&l.text))
        .collect();
    assert!(expected > 0, "the capture holds TLS lines");
    assert_eq!(matched.len(), expected);
    assert!(matched.iter().any(|l| l.text.contains("OPENSSL")));
}
