//! The Prometheus tools from Debian's `prometheus` package, found on PATH (a
//! missing one fails the test with the way to install it: these tests never skip
//! silently): `promtool check metrics` run on an exposition, and a real Prometheus
//! server scraping test targets every second, with rule files when asked.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::ports::free_port;
use crate::wait_for;

/// How long [`Prometheus::series`] waits for a query to return series.
const DEADLINE: Duration = Duration::from_secs(30);

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

/// A Prometheus server process, killed on drop.
#[derive(Debug)]
pub struct Prometheus {
    child: Child,
    pub url: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus on a free 127.0.0.1 port scraping `targets` (job, address)
    /// every second.
    pub fn start(targets: &[(&str, String)]) -> Prometheus {
        // Prometheus cannot report a port it chose itself: take a free one from the
        // system, let it go, and hand it over.
        Self::launch(free_port().unwrap(), targets, &[])
    }

    /// As [`Prometheus::start`] on a port chosen beforehand, for a server whose URL
    /// must be known before the aggregator that it scrapes starts.
    pub fn start_on(port: u16, targets: &[(&str, String)]) -> Prometheus {
        Self::launch(port, targets, &[])
    }

    /// As [`Prometheus::start`], evaluating the rules of `rule_files` every second.
    pub fn with_rules(targets: &[(&str, String)], rule_files: &[&Path]) -> Prometheus {
        Self::launch(free_port().unwrap(), targets, rule_files)
    }

    fn launch(port: u16, targets: &[(&str, String)], rule_files: &[&Path]) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let mut config =
            String::from("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n");
        if !rule_files.is_empty() {
            config.push_str("rule_files:\n");
            for f in rule_files {
                config.push_str(&format!("  - '{}'\n", f.display()));
            }
        }
        config.push_str("scrape_configs:\n");
        for (job, addr) in targets {
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: ['{addr}']\n"
            ));
        }
        let config_file = dir.path().join("prometheus.yml");
        std::fs::write(&config_file, config).unwrap();
        let log = dir.path().join("prometheus.log");
        let child = Command::new(tool("prometheus"))
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("prometheus starts");
        Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
            _dir: dir,
        }
    }

    /// The result vector of an instant query.
    pub async fn query(&self, q: &str) -> Option<Vec<Value>> {
        let r = reqwest::Client::new()
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", q)])
            .send()
            .await
            .ok()?;
        let body: Value = r.json().await.ok()?;
        (body["status"] == "success").then_some(())?;
        body["data"]["result"].as_array().cloned()
    }

    /// Waits until `q` returns at least one series, and returns them.
    pub async fn series(&self, q: &str) -> Vec<Value> {
        let found = wait_for(q, DEADLINE, || async {
            self.query(q).await.filter(|r| !r.is_empty())
        })
        .await;
        match found {
            Ok(v) => v,
            Err(e) => panic!(
                "{e}\nprometheus log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            ),
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
