//! A small real filesystem for the full-disk tests: a tmpfs mounted on a fresh
//! directory (which needs root: the tests run as root, and fail without it, never
//! skip), filled to its last byte, and grown while an aggregator writes to it.
//! Unmounted on drop, also when the test fails.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// A mounted tmpfs.
#[derive(Debug)]
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `mib` MiB on a fresh directory.
    pub fn mount(mib: u64) -> anyhow::Result<Tmpfs> {
        let dir = tempfile::Builder::new()
            .prefix("meshcat-tmpfs-")
            .tempdir()?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .output()
            .context("running mount")?;
        if !out.status.success() {
            bail!(
                "cannot mount a tmpfs on {} (the full-disk tests need root{}): {}",
                dir.path().display(),
                if std::env::var("CI").as_deref() == Ok("true") {
                    ", also under CI=true"
                } else {
                    ""
                },
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(Tmpfs { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills the filesystem to its last byte with one file; answers its path.
    pub fn fill(&self) -> anyhow::Result<PathBuf> {
        let path = self.path().join("filler");
        let mut f = std::fs::File::create(&path)?;
        let chunk = vec![0x5au8; 1 << 20];
        for size in [1 << 20, 64 << 10, 4 << 10, 512, 1] {
            loop {
                match f.write(&chunk[..size]) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                    Err(e) => return Err(e).context("filling the tmpfs"),
                }
            }
        }
        f.sync_all()?;
        Ok(path)
    }

    /// Grows (or shrinks) the mounted filesystem to `mib` MiB.
    pub fn resize(&self, mib: u64) -> anyhow::Result<()> {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={mib}m")])
            .arg(self.path())
            .output()
            .context("running mount")?;
        if !out.status.success() {
            bail!(
                "cannot resize the tmpfs: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily, should a process still hold a file there: it goes once released.
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}
