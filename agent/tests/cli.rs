//! The `meshcat-agent` binary's command line: bad values exit 64 with one line,
//! `--help` and `--version` work, SIGTERM stops it with status 0.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_meshcat-agent"))
}

#[test]
fn bad_values_exit_64_with_one_line() {
    for args in [
        &["--interval", "soon"][..],
        &["--scrape-timeout", "0s"],
        &["--sidecar-admin", "no-port"],
        &["--ops-addr", "nowhere"],
        &["--log-format", "xml"],
        &["--no-such-flag"],
    ] {
        let out = agent().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
    let out = agent().env("MESHCAT_INTERVAL", "later").output().unwrap();
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn help_documents_every_flag_and_version_works() {
    let out = agent().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--aggregator",
        "--server-name",
        "--ca-file",
        "--cert",
        "--key",
        "--token-file",
        "--sidecar-admin",
        "--zone",
        "--cluster",
        "--instance",
        "--sidecar-log-file",
        "--targets-file",
        "--interval",
        "--scrape-timeout",
        "--ops-addr",
        "--log-format",
        "MESHCAT_SIDECAR_ADMIN",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
    let out = agent().arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn sigterm_stops_it_with_status_0() {
    let mut child = agent()
        .args([
            "--ops-addr",
            "127.0.0.1:0",
            "--sidecar-admin",
            "127.0.0.1:1",
            "--interval",
            "100ms",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it logs that it started, so the signal handler is installed.
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("Agent started.") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("agent starts");
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0));
            break;
        }
        assert!(Instant::now() < deadline, "agent did not stop within 5 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}
