//! A real browser for the dashboard tests: Debian's Chromium driven by Playwright
//! from PyPI, both installed by `scripts/test.sh` (Playwright into `.venv`, never
//! with `playwright install`: the browser is the system's). [`BrowserTools`] finds
//! them; [`BrowserScript`] runs a script of `tests/browser/` as a child process that
//! talks back on its stdout and reads answers on its stdin.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The Python with Playwright and the Chromium binary it drives.
#[derive(Debug, Clone)]
pub struct BrowserTools {
    pub python: PathBuf,
    pub chromium: PathBuf,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

impl BrowserTools {
    /// Finds `.venv/bin/python` with Playwright importable and Chromium
    /// (`MESHCAT_CHROMIUM`, else `chromium` on the PATH, else /usr/bin/chromium).
    pub async fn find() -> anyhow::Result<Self> {
        let python = root().join(".venv/bin/python");
        let ok = Command::new(&python)
            .args(["-c", "import playwright.sync_api"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .is_ok_and(|s| s.success());
        if !ok {
            bail!(
                "Playwright not found in {}: run scripts/test.sh (it installs it)",
                python.display()
            );
        }
        let chromium = match std::env::var_os("MESHCAT_CHROMIUM").filter(|v| !v.is_empty()) {
            Some(p) => PathBuf::from(p),
            None => std::env::var_os("PATH")
                .into_iter()
                .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .map(|d| d.join("chromium"))
                .find(|p| p.is_file())
                .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium")),
        };
        if !chromium.is_file() {
            bail!(
                "Chromium not found at {}: install Debian's chromium (scripts/test.sh does) or set MESHCAT_CHROMIUM",
                chromium.display()
            );
        }
        Ok(Self { python, chromium })
    }

    /// Starts `tests/browser/<script>` with `args`.
    pub fn run(&self, script: &str, args: &[String]) -> anyhow::Result<BrowserScript> {
        let path = root().join("tests/browser").join(script);
        let mut child = Command::new(&self.python)
            .arg(&path)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", path.display()))?;
        let stdin = child.stdin.take().context("script stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("script stdout")?).lines();
        Ok(BrowserScript {
            child,
            stdin,
            stdout,
        })
    }
}

/// Where the dashboard tests keep their screenshots: `target/e2e-dashboard`.
pub fn output_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
        .join("e2e-dashboard")
}

/// A running browser script.
#[derive(Debug)]
pub struct BrowserScript {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl BrowserScript {
    /// The next line the script prints, or `None` once it has closed its output.
    pub async fn next_line(&mut self, deadline: Duration) -> anyhow::Result<Option<String>> {
        tokio::time::timeout(deadline, self.stdout.next_line())
            .await
            .context("the browser script said nothing in time")?
            .map_err(Into::into)
    }

    /// Sends one line to the script.
    pub async fn answer(&mut self, line: &str) -> anyhow::Result<()> {
        self.stdin.write_all(format!("{line}\n").as_bytes()).await?;
        self.stdin.flush().await?;
        Ok(())
    }

    /// Waits for the script to end; fails unless it exits 0.
    pub async fn finish(mut self, deadline: Duration) -> anyhow::Result<()> {
        let status = match tokio::time::timeout(deadline, self.child.wait()).await {
            Ok(s) => s?,
            Err(_) => {
                let _ = self.child.kill().await;
                bail!("the browser script did not finish within {deadline:?}");
            }
        };
        if !status.success() {
            bail!("the browser script failed ({status}); its reasons are above");
        }
        Ok(())
    }
}
