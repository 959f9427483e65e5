//! LogTail over real files in temporary folders: appends, partial lines, a file that
//! appears late, the start-up backlog, truncation, rotation by rename, the bounds and
//! the filters, and the polling task.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use meshcat_agent::logtail::{LineFilter, LogTail, TailConfig, TailedLine};
use tokio_util::sync::CancellationToken;

fn append(path: &Path, text: &str) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

fn texts(lines: &[TailedLine]) -> Vec<String> {
    lines.iter().map(|l| l.text.clone()).collect()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test]
async fn appends_and_partial_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("envoy.log");
    append(&path, "one\ntwo\r\n");
    let tail = LogTail::new(TailConfig::new(&path));
    assert_eq!(tail.last_seq(), 0);
    tail.refresh().await;
    assert_eq!(texts(&tail.lines_since(0)), ["one", "two"]);
    assert_eq!(tail.last_seq(), 2);

    // A line still being written is held back until its newline.
    append(&path, "thr");
    tail.refresh().await;
    assert_eq!(tail.last_seq(), 2);
    append(&path, "ee\n\nfour\n");
    tail.refresh().await;
    let new = tail.lines_since(2);
    assert_eq!(texts(&new), ["three", "four"], "blank lines are dropped");
    assert_eq!(new[0].seq, 3);
    assert_eq!(new[1].seq, 4);
    assert!(new.iter().all(|l| !l.truncated && l.read_at_ms > 0));
    assert!(tail.lines_since(4).is_empty());
}

#[tokio::test]
async fn file_created_after_start_is_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("late.log");
    let tail = LogTail::new(TailConfig {
        initial_backlog: 4,
        ..TailConfig::new(&path)
    });
    tail.refresh().await;
    assert_eq!(tail.last_seq(), 0);
    append(&path, "first line of a new file\nsecond\n");
    tail.refresh().await;
    assert_eq!(
        texts(&tail.lines_since(0)),
        ["first line of a new file", "second"]
    );
}

#[tokio::test]
async fn existing_file_is_read_from_its_backlog_in_whole_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.log");
    let body: String = (0..100).map(|i| format!("line-{i:03}\n")).collect();
    fs::write(&path, &body).unwrap();
    // 9 bytes per line: a backlog of exactly three lines, and one that starts in the
    // middle of a line (whose rest is skipped).
    for backlog in [27, 31] {
        let tail = LogTail::new(TailConfig {
            initial_backlog: backlog,
            ..TailConfig::new(&path)
        });
        tail.refresh().await;
        assert_eq!(
            texts(&tail.lines_since(0)),
            ["line-097", "line-098", "line-099"],
            "backlog {backlog}"
        );
    }
}

#[tokio::test]
async fn truncation_in_place_restarts_at_the_beginning() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("copytruncate.log");
    append(&path, "a long line before the truncation\nanother one\n");
    let tail = LogTail::new(TailConfig::new(&path));
    tail.refresh().await;
    assert_eq!(tail.last_seq(), 2);

    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    append(&path, "after\n");
    tail.refresh().await;
    assert_eq!(texts(&tail.lines_since(2)), ["after"]);
    append(&path, "more\n");
    tail.refresh().await;
    assert_eq!(texts(&tail.lines_since(3)), ["more"]);
}

#[tokio::test]
async fn rotation_by_rename_follows_the_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("envoy.log");
    let rotated = dir.path().join("envoy.log.1");
    append(&path, "old-1\n");
    let tail = LogTail::new(TailConfig::new(&path));
    tail.refresh().await;

    // The writer keeps its handle on the renamed file for a while: what it writes
    // there before reopening is still read.
    let mut writer = OpenOptions::new().append(true).open(&path).unwrap();
    fs::rename(&path, &rotated).unwrap();
    writer.write_all(b"old-2\n").unwrap();
    tail.refresh().await;
    assert_eq!(texts(&tail.lines_since(1)), ["old-2"]);

    writer.write_all(b"old-3, unfinished").unwrap();
    drop(writer);
    append(&path, "new-1\nnew-2\n");
    tail.refresh().await;
    assert_eq!(
        texts(&tail.lines_since(2)),
        ["old-3, unfinished", "new-1", "new-2"]
    );
    append(&path, "new-3\n");
    tail.refresh().await;
    assert_eq!(texts(&tail.lines_since(5)), ["new-3"]);
}

#[tokio::test]
async fn bounds_on_lines_bytes_and_line_length() {
    let dir = tempfile::tempdir().unwrap();

    let by_count = dir.path().join("count.log");
    let body: String = (1..=12).map(|i| format!("n{i}\n")).collect();
    fs::write(&by_count, body).unwrap();
    let tail = LogTail::new(TailConfig {
        max_lines: 5,
        ..TailConfig::new(&by_count)
    });
    tail.refresh().await;
    let kept = tail.lines_since(0);
    assert_eq!(texts(&kept), ["n8", "n9", "n10", "n11", "n12"]);
    assert_eq!(kept[0].seq, 8);
    assert_eq!(tail.last_seq(), 12);
    assert_eq!(texts(&tail.lines_since(10)), ["n11", "n12"]);

    let by_bytes = dir.path().join("bytes.log");
    let body: String = (0..50).map(|i| format!("{i:010}\n")).collect();
    fs::write(&by_bytes, body).unwrap();
    let tail = LogTail::new(TailConfig {
        max_bytes: 105,
        ..TailConfig::new(&by_bytes)
    });
    tail.refresh().await;
    let (lines, bytes) = tail.held();
    assert_eq!((lines, bytes), (10, 100));
    assert_eq!(tail.lines_since(0)[9].text, "0000000049");

    let long = dir.path().join("long.log");
    let tail = LogTail::new(TailConfig {
        max_line_len: 16,
        ..TailConfig::new(&long)
    });
    // The long line arrives over several polls.
    append(&long, &"x".repeat(40));
    tail.refresh().await;
    append(&long, &format!("{}\nshort\n", "y".repeat(40)));
    tail.refresh().await;
    let got = tail.lines_since(0);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].text, "x".repeat(16));
    assert!(got[0].truncated);
    assert_eq!(got[1].text, "short");
    assert!(!got[1].truncated);
}

#[tokio::test]
async fn recent_filters_on_path_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    append(
        &path,
        "\"GET /catalog/a HTTP/1.1\" 503 UH\n\"GET /other HTTP/1.1\" 200 -\n\"GET /catalog/b HTTP/1.1\" 503 URX,UF\n",
    );
    let tail = LogTail::new(TailConfig::new(&path));
    tail.refresh().await;
    let catalog = LineFilter {
        contains: Some("/catalog/".into()),
        since_ms: None,
    };
    assert_eq!(tail.recent(&catalog, 10).len(), 2);
    let newest = tail.recent(&catalog, 1);
    assert_eq!(texts(&newest), ["\"GET /catalog/b HTTP/1.1\" 503 URX,UF"]);
    assert_eq!(tail.recent(&LineFilter::default(), 100).len(), 3);

    // Wait for the clock to move past the first batch's read time.
    let first_read = tail.lines_since(0)[2].read_at_ms;
    let deadline = Instant::now() + Duration::from_secs(5);
    while now_ms() <= first_read {
        assert!(Instant::now() < deadline, "clock did not move");
        tokio::task::yield_now().await;
    }
    let since = now_ms();
    append(&path, "\"GET /catalog/c HTTP/1.1\" 200 -\n");
    tail.refresh().await;
    let later = LineFilter {
        contains: Some("/catalog/".into()),
        since_ms: Some(since),
    };
    assert_eq!(
        texts(&tail.recent(&later, 10)),
        ["\"GET /catalog/c HTTP/1.1\" 200 -"]
    );
}

#[tokio::test]
async fn tailed_lines_round_trip_through_serde() {
    let line = TailedLine {
        seq: 7,
        read_at_ms: 1_700_000_000_000,
        text: "[debug][connection] TLS_error:|268435581".into(),
        truncated: false,
    };
    let json = serde_json::to_string(&line).unwrap();
    let back: TailedLine = serde_json::from_str(&json).unwrap();
    assert_eq!(back, line);
}

#[tokio::test]
async fn the_task_follows_the_file_until_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sidecar.log");
    let cancel = CancellationToken::new();
    let (tail, task) = LogTail::spawn(
        TailConfig {
            poll_interval: Duration::from_millis(20),
            ..TailConfig::new(&path)
        },
        cancel.clone(),
    );
    for i in 1..=3u64 {
        append(&path, &format!("written {i}\n"));
        let deadline = Instant::now() + Duration::from_secs(5);
        while tail.last_seq() < i {
            assert!(Instant::now() < deadline, "line {i} not read in time");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert_eq!(
        texts(&tail.lines_since(0)),
        ["written 1", "written 2", "written 3"]
    );
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the task stops on cancel")
        .unwrap();
}
