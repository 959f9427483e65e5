//! LogTail over a log folder that whoever runs the sidecar can write: a symbolic link
//! at the log's path (to a secret of the agent's) is never followed, a FIFO there
//! neither hangs the tail nor is read, and a rotation that puts a link in place of the
//! file is refused like a first open. A regular file that comes back is read again.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use meshcat_agent::logtail::{LineFilter, LogTail, TailConfig};

/// What a refresh may take at most; a refresh that blocks is a failure.
const REFRESH_LIMIT: Duration = Duration::from_secs(5);

fn append(path: &Path, text: &str) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

fn texts(tail: &LogTail) -> Vec<String> {
    tail.lines_since(0).into_iter().map(|l| l.text).collect()
}

/// A secret of the agent's (its key, its token) outside the log folder.
fn secret(dir: &Path) -> std::path::PathBuf {
    let secret = dir.join("agent-token");
    std::fs::write(&secret, "SECRET-TOKEN-1\nSECRET-KEY-LINE-2\n").unwrap();
    secret
}

fn assert_no_secret(tail: &LogTail) {
    let seen = texts(tail);
    assert!(
        seen.iter().all(|l| !l.contains("SECRET")),
        "the tail read the secret: {seen:?}"
    );
    assert!(
        tail.recent(
            &LineFilter {
                contains: Some("SECRET".into()),
                since_ms: None,
            },
            100
        )
        .is_empty()
    );
}

#[tokio::test]
async fn a_symbolic_link_at_the_log_path_is_not_followed() {
    let secrets = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let path = logs.path().join("envoy.log");
    symlink(secret(secrets.path()), &path).unwrap();

    let tail = LogTail::new(TailConfig::new(&path));
    for _ in 0..3 {
        tail.refresh().await;
    }
    assert_eq!(tail.last_seq(), 0);
    assert_no_secret(&tail);
    // Nothing the tail will read: catching up does not wait.
    assert!(tail.catch_up(Duration::from_secs(2)).await);
    assert_no_secret(&tail);

    // The link gives way to a real file: that one is read.
    std::fs::remove_file(&path).unwrap();
    append(&path, "real line\n");
    tail.refresh().await;
    assert_eq!(texts(&tail), ["real line"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_at_the_log_path_neither_hangs_nor_is_read() {
    let logs = tempfile::tempdir().unwrap();
    let path = logs.path().join("envoy.log");
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo");

    let tail = LogTail::new(TailConfig::new(&path));
    let refreshed = tokio::time::timeout(REFRESH_LIMIT, async {
        for _ in 0..3 {
            tail.refresh().await;
        }
    })
    .await;
    if refreshed.is_err() {
        // The tail is stuck opening the FIFO: open its other end so that the stuck
        // thread ends (and with it the test), then fail.
        let fifo = path.clone();
        tokio::task::spawn_blocking(move || {
            drop(OpenOptions::new().write(true).open(fifo));
        })
        .await
        .unwrap();
        panic!("a refresh of a FIFO did not end within {REFRESH_LIMIT:?}");
    }
    assert_eq!(tail.last_seq(), 0);
    assert!(tail.catch_up(Duration::from_secs(2)).await);
    assert_eq!(tail.last_seq(), 0);
}

#[tokio::test]
async fn a_rotation_that_puts_a_link_in_place_of_the_file_is_refused() {
    let secrets = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let path = logs.path().join("envoy.log");
    append(&path, "before rotation\n");
    let tail = LogTail::new(TailConfig::new(&path));
    tail.refresh().await;
    assert_eq!(texts(&tail), ["before rotation"]);

    // Rotated by rename; a link to the agent's secret takes the log's place. What the
    // writer still put into the old file is read; the link is not.
    std::fs::rename(&path, logs.path().join("envoy.log.1")).unwrap();
    append(&logs.path().join("envoy.log.1"), "last of the old file\n");
    symlink(secret(secrets.path()), &path).unwrap();
    for _ in 0..3 {
        tail.refresh().await;
    }
    assert_eq!(texts(&tail), ["before rotation", "last of the old file"]);
    assert_no_secret(&tail);

    // A link to a directory, then a link to another (regular) log: refused too.
    std::fs::remove_file(&path).unwrap();
    symlink(logs.path(), &path).unwrap();
    tail.refresh().await;
    std::fs::remove_file(&path).unwrap();
    symlink(logs.path().join("envoy.log.1"), &path).unwrap();
    tail.refresh().await;
    assert_eq!(texts(&tail), ["before rotation", "last of the old file"]);

    // A regular file again: followed from its beginning.
    std::fs::remove_file(&path).unwrap();
    append(&path, "after rotation\n");
    tail.refresh().await;
    assert_eq!(
        texts(&tail),
        ["before rotation", "last of the old file", "after rotation"]
    );
    assert_no_secret(&tail);
}

#[tokio::test]
async fn a_directory_at_the_log_path_is_not_read() {
    let logs = tempfile::tempdir().unwrap();
    let path = logs.path().join("envoy.log");
    std::fs::create_dir(&path).unwrap();
    let tail = LogTail::new(TailConfig::new(&path));
    tail.refresh().await;
    tail.refresh().await;
    assert_eq!(tail.last_seq(), 0);
    assert!(tail.catch_up(Duration::from_secs(2)).await);
}
