//! The Prometheus tools from Debian's `prometheus` package, found on PATH: a
//! missing one fails the test with the way to install it (these tests never skip
//! silently), and `promtool check metrics` run on an exposition.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A Prometheus tool (`promtool`, `prometheus`) from PATH; panics naming the package
/// when it is missing.
pub fn tool(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    match found {
        Some(p) => p,
        None => panic!(
            "{name} not found in PATH{}: install Debian's prometheus package \
             (apt-get install prometheus; scripts/test.sh does it)",
            if std::env::var("CI").as_deref() == Ok("true") {
                " under CI=true"
            } else {
                ""
            }
        ),
    }
}

/// Runs `promtool check metrics` on an exposition; its complaints on failure.
pub fn check_metrics(text: &str) -> Result<(), String> {
    let mut child = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    child
        .stdin
        .take()
        .expect("stdin piped")
        .write_all(text.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
