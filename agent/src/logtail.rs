//! Follows one sidecar log file (`--sidecar-log-file`, or `logFile` of a target) and
//! keeps its most recent lines in a bounded ring, each stamped with the time the agent
//! read it and a sequence number. The diagnosis reads the edge log rules and the debug
//! window's lines from here.
//!
//! The file is polled (a `stat` per tick when idle), so it works on any file system
//! and needs no inotify. It survives the file not existing yet, appends, truncation in
//! place (copytruncate) and rotation by rename (a new inode at the path), and waits for
//! the newline of a partly written last line.
//!
//! The file is opened without following a symbolic link at its path and without
//! blocking (`O_NOFOLLOW | O_NONBLOCK`), and read only when the opened handle is a
//! regular file: whoever writes the sidecar's log folder (a compromised sidecar
//! container sharing it) cannot make the agent read its own key or token through a
//! link, nor hang it on a FIFO. This holds at the first open and at every reopen after
//! a rotation.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use meshcat_common::envoy_log::line_time_ms;
use meshcat_common::wire::WindowStart;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Most lines kept by default.
pub const DEFAULT_MAX_LINES: usize = 20_000;
/// Most bytes of line text kept by default (8 MiB).
pub const DEFAULT_MAX_BYTES: usize = 8 << 20;
/// Longest line kept by default (16 KiB); the rest of a longer line is dropped.
pub const DEFAULT_MAX_LINE_LEN: usize = 16 << 10;
/// How often the file is looked at by default.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(200);
/// How much of a file that already exists when the agent starts is read (1 MiB), so
/// failures of the last minutes are visible right after an agent (re)start.
pub const DEFAULT_INITIAL_BACKLOG: u64 = 1 << 20;
/// Most bytes read in one poll: a burst larger than this is read over several ticks
/// instead of stalling the reader.
const MAX_READ_PER_POLL: usize = 4 << 20;
/// Size of one read from the file.
const READ_CHUNK: usize = 64 << 10;

/// Most bytes of log text `--log-max-bytes` may ask to hold per sidecar (256 MiB).
pub const MAX_HELD_BYTES: usize = 256 << 20;

/// How much of each sidecar's log is held (`--log-max-lines`, `--log-max-bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailBounds {
    pub max_lines: usize,
    pub max_bytes: usize,
}

impl Default for TailBounds {
    fn default() -> Self {
        TailBounds {
            max_lines: DEFAULT_MAX_LINES,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// Where and how much to tail.
#[derive(Debug, Clone)]
pub struct TailConfig {
    /// The sidecar's log file.
    pub path: PathBuf,
    /// Most lines kept; the oldest go first.
    pub max_lines: usize,
    /// Most bytes of line text kept; the oldest lines go first.
    pub max_bytes: usize,
    /// Longest line kept, in bytes; a longer line is cut and marked `truncated`.
    pub max_line_len: usize,
    /// How often the file is looked at.
    pub poll_interval: Duration,
    /// How many trailing bytes of a file found at start are read; later files (created
    /// after start, or after a rotation) are read from their beginning.
    pub initial_backlog: u64,
}

impl TailConfig {
    /// `path` held within `bounds`, the other settings their defaults.
    pub fn bounded(path: impl Into<PathBuf>, bounds: TailBounds) -> Self {
        TailConfig {
            max_lines: bounds.max_lines,
            max_bytes: bounds.max_bytes,
            ..TailConfig::new(path)
        }
    }

    /// The default bounds for `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        TailConfig {
            path: path.into(),
            max_lines: DEFAULT_MAX_LINES,
            max_bytes: DEFAULT_MAX_BYTES,
            max_line_len: DEFAULT_MAX_LINE_LEN,
            poll_interval: DEFAULT_POLL_INTERVAL,
            initial_backlog: DEFAULT_INITIAL_BACKLOG,
        }
    }
}

/// One line of the sidecar's log as the agent read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TailedLine {
    /// Position in the agent's reading order: strictly increasing by one per line, so a
    /// reader can ask for what came after the last line it saw.
    pub seq: u64,
    /// When the agent read the line, ms since the epoch (Envoy's own timestamps vary
    /// with the log format and the container runtime's prefix).
    pub read_at_ms: i64,
    /// The line without its end of line; invalid UTF-8 is replaced.
    pub text: String,
    /// Whether the line was longer than the limit and was cut.
    pub truncated: bool,
}

/// Which lines [`LogTail::recent`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineFilter {
    /// Only lines containing this text (for example the request path).
    pub contains: Option<String>,
    /// Only lines read at or after this time, ms since the epoch.
    pub since_ms: Option<i64>,
}

impl LineFilter {
    /// Whether `line` passes the filter.
    pub fn matches(&self, line: &TailedLine) -> bool {
        self.since_ms.is_none_or(|s| line.read_at_ms >= s)
            && self
                .contains
                .as_deref()
                .is_none_or(|c| line.text.contains(c))
    }
}

/// From when a tail holds every line it read, and why not before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coverage {
    /// Ms since the epoch.
    pub from_ms: i64,
    pub start: WindowStart,
}

/// A handle on one followed log file; clones share the same ring.
#[derive(Debug, Clone)]
pub struct LogTail {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: TailConfig,
    /// The kept lines; locked only briefly, never across I/O.
    ring: Mutex<Ring>,
    /// Reading state; locked for one poll, on a blocking thread.
    follower: Mutex<Follower>,
}

impl LogTail {
    /// A tail that reads nothing until [`LogTail::run`] or [`LogTail::refresh`].
    pub fn new(config: TailConfig) -> Self {
        let ring = Ring::new(config.max_lines, config.max_bytes, now_ms());
        LogTail {
            inner: Arc::new(Inner {
                config,
                ring: Mutex::new(ring),
                follower: Mutex::new(Follower::default()),
            }),
        }
    }

    /// Starts following the file on a task of its own until `cancel`.
    pub fn spawn(
        config: TailConfig,
        cancel: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let tail = LogTail::new(config);
        let task = tokio::spawn(tail.clone().run(cancel));
        (tail, task)
    }

    /// Polls the file every `poll_interval` until `cancel`.
    pub async fn run(self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.inner.config.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        info!(path = %self.inner.config.path.display(), "Following the sidecar log.");
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tick.tick() => self.refresh().await,
            }
        }
        debug!(path = %self.inner.config.path.display(), "Stopped following the sidecar log.");
    }

    /// Reads whatever the file holds now that was not read yet. Concurrent calls
    /// take turns.
    pub async fn refresh(&self) {
        let inner = self.inner.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || inner.poll()).await {
            warn!(error = %e, "Log tail poll task failed.");
        }
    }

    /// Reads the file until the tail holds every byte the file holds now, or
    /// `within` has passed. Answers whether it caught up. Each read makes progress
    /// (a read stops only at the file's end or after 4 MiB), so this waits on a
    /// condition, never on a timer; a read that makes no progress ends the wait.
    pub async fn catch_up(&self, within: Duration) -> bool {
        let target = match std::fs::symlink_metadata(self.path()) {
            Ok(m) if m.is_file() => (m.dev(), m.ino(), m.len()),
            // Nothing to read: the file is not there (yet), or is not a regular file
            // (which the tail refuses to read).
            _ => return true,
        };
        let end = tokio::time::Instant::now() + within;
        let mut last = None;
        loop {
            self.refresh().await;
            let now = self.inner.position();
            match now {
                Some((dev, ino, offset))
                    if (dev, ino) == (target.0, target.1) && offset >= target.2 =>
                {
                    return true;
                }
                Some((dev, ino, _)) if (dev, ino) == (target.0, target.1) => {}
                // Rotated since: the old file was finished before the new was opened.
                Some(_) => return true,
                None => {}
            }
            if last == now || tokio::time::Instant::now() >= end {
                return false;
            }
            last = now;
        }
    }

    /// The followed file.
    pub fn path(&self) -> &Path {
        &self.inner.config.path
    }

    /// The most lines the tail holds.
    pub fn max_lines(&self) -> usize {
        self.inner.config.max_lines
    }

    /// The lines read after line `seq`, oldest first (all kept lines for 0). Lines
    /// already dropped from the ring are missing: compare the first `seq` with yours.
    pub fn lines_since(&self, seq: u64) -> Vec<TailedLine> {
        let ring = self.ring();
        let Some(first) = ring.lines.front().map(|l| l.seq) else {
            return Vec::new();
        };
        let skip = usize::try_from((seq + 1).saturating_sub(first)).unwrap_or(usize::MAX);
        ring.lines.iter().skip(skip).cloned().collect()
    }

    /// Hands each line read after line `seq` to `f`, oldest first, without copying
    /// them. The ring stays locked meanwhile: `f` must be quick.
    pub fn scan_since(&self, seq: u64, mut f: impl FnMut(&TailedLine)) {
        let ring = self.ring();
        let Some(first) = ring.lines.front().map(|l| l.seq) else {
            return;
        };
        let skip = usize::try_from((seq + 1).saturating_sub(first)).unwrap_or(usize::MAX);
        ring.lines.iter().skip(skip).for_each(&mut f);
    }

    /// The newest `max` lines passing `filter`, oldest first.
    pub fn recent(&self, filter: &LineFilter, max: usize) -> Vec<TailedLine> {
        let ring = self.ring();
        let mut out: Vec<TailedLine> = ring
            .lines
            .iter()
            .rev()
            .filter(|l| filter.matches(l))
            .take(max)
            .cloned()
            .collect();
        out.reverse();
        out
    }

    /// The newest lines that `wanted` selects, oldest first: at most `max` lines and
    /// `max_bytes` bytes of text (each line counted as `line_len` at most), with what
    /// they cover: from when every selected line the tail read is among them.
    pub fn newest(
        &self,
        mut wanted: impl FnMut(&str) -> bool,
        max: usize,
        max_bytes: usize,
        line_len: usize,
    ) -> (Vec<TailedLine>, Coverage) {
        let ring = self.ring();
        let mut out = Vec::new();
        let mut bytes = 0;
        let mut left_out = None;
        for l in ring.lines.iter().rev().filter(|l| wanted(&l.text)) {
            let len = l.text.len().min(line_len);
            if out.len() == max || bytes + len > max_bytes {
                left_out = Some(l.read_at_ms);
                break;
            }
            bytes += len;
            out.push(l.clone());
        }
        out.reverse();
        let coverage = match left_out {
            // A line read in the same millisecond as the one left out may be left
            // out too: the window starts just after.
            Some(at) => Coverage {
                from_ms: at + 1,
                start: WindowStart::Answer,
            },
            None => ring.coverage(),
        };
        (out, coverage)
    }

    /// The sequence number of the newest line read, 0 before the first.
    pub fn last_seq(&self) -> u64 {
        self.ring().next_seq - 1
    }

    /// How many lines and bytes of text the ring holds now.
    pub fn held(&self) -> (usize, usize) {
        let ring = self.ring();
        (ring.lines.len(), ring.bytes)
    }

    fn ring(&self) -> MutexGuard<'_, Ring> {
        self.inner.ring()
    }
}

impl Inner {
    fn ring(&self) -> MutexGuard<'_, Ring> {
        // A panic while holding the lock cannot leave the ring inconsistent in a way
        // that matters more than losing the tail, so a poisoned lock is used as is.
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open file's device, inode and bytes consumed.
    fn position(&self) -> Option<(u64, u64, u64)> {
        let f = self.follower.lock().unwrap_or_else(|p| p.into_inner());
        f.file.as_ref().map(|o| (o.dev, o.ino, o.offset))
    }

    /// One poll: follows the path to its current file and reads what is new.
    fn poll(&self) {
        let mut f = self.follower.lock().unwrap_or_else(|p| p.into_inner());
        let mut lines = Vec::new();
        let result = f.poll(&self.config, &mut lines);
        if !lines.is_empty() {
            let now = now_ms();
            let mut ring = self.ring();
            for (text, truncated) in lines {
                ring.push(text, truncated, now);
            }
        }
        let path = self.config.path.display();
        match result {
            Ok(()) => f.last_error = None,
            Err(e) => {
                let msg = e.to_string();
                // Said once per distinct failure, not at every tick.
                if f.last_error.as_deref() != Some(msg.as_str()) {
                    warn!(path = %path, error = %msg, "Cannot read the sidecar log.");
                    f.last_error = Some(msg);
                }
            }
        }
    }
}

/// The kept lines and their bounds.
#[derive(Debug)]
struct Ring {
    lines: VecDeque<TailedLine>,
    /// Bytes of text held, checked against `max_bytes`.
    bytes: usize,
    next_seq: u64,
    max_lines: usize,
    max_bytes: usize,
    /// When the tail began looking at its path: a file that appears later is read
    /// from its start, so nothing written after this is missed.
    began_ms: i64,
    /// When the newest line the bounds dropped was read (`None` while none was): the
    /// ring holds every line read after it.
    dropped_read_at: Option<i64>,
}

/// How many of the oldest held lines are looked at for the time the first one was
/// written (a multi-line entry's continuation lines carry none).
const FIRST_STAMP_LOOKAHEAD: usize = 16;

impl Ring {
    fn new(max_lines: usize, max_bytes: usize, began_ms: i64) -> Self {
        Ring {
            lines: VecDeque::new(),
            bytes: 0,
            next_seq: 1,
            max_lines: max_lines.max(1),
            max_bytes: max_bytes.max(1),
            began_ms,
            dropped_read_at: None,
        }
    }

    fn push(&mut self, text: String, truncated: bool, read_at_ms: i64) {
        self.bytes += text.len();
        self.lines.push_back(TailedLine {
            seq: self.next_seq,
            read_at_ms,
            text,
            truncated,
        });
        self.next_seq += 1;
        while self.lines.len() > self.max_lines || self.bytes > self.max_bytes {
            match self.lines.pop_front() {
                Some(old) => {
                    self.bytes -= old.text.len();
                    self.dropped_read_at = Some(old.read_at_ms);
                }
                None => break,
            }
        }
    }

    /// From when the ring holds every line read. Once the bounds dropped a line:
    /// just after that line was read. Before: since the tail began looking at its
    /// path, or since the first line it read was written when that is earlier (a
    /// file found at start is read from its start, or from its last MiB).
    fn coverage(&self) -> Coverage {
        if let Some(at) = self.dropped_read_at {
            return Coverage {
                from_ms: at + 1,
                start: WindowStart::Held,
            };
        }
        let first_written = self
            .lines
            .iter()
            .take(FIRST_STAMP_LOOKAHEAD)
            .find_map(|l| line_time_ms(&l.text).map(|t| t.min(l.read_at_ms)))
            .or_else(|| self.lines.front().map(|l| l.read_at_ms));
        Coverage {
            from_ms: first_written.map_or(self.began_ms, |t| t.min(self.began_ms)),
            start: WindowStart::Began,
        }
    }
}

/// The reading side: which file is open, where, and the unfinished last line.
#[derive(Debug, Default)]
struct Follower {
    file: Option<OpenFile>,
    /// Whether the path was looked at once: only a file present at the first look is
    /// read from its backlog; any later file is new and read whole.
    looked: bool,
    /// Bytes of the line being written (no newline yet), at most `max_line_len` + 3.
    partial: Vec<u8>,
    /// Whether the line being written went over the limit.
    partial_truncated: bool,
    /// After starting inside the backlog: drop bytes up to the first newline, which
    /// ends a line whose start was not read.
    skip_to_newline: bool,
    /// Whether the path was missing at the last look, to say it once.
    missing: bool,
    /// The kinds of refusal already logged since the last regular file was opened,
    /// to say each once rather than at every tick.
    refused: Vec<Refusal>,
    /// The last read error, to log each distinct failure once.
    last_error: Option<String>,
}

#[derive(Debug)]
struct OpenFile {
    file: File,
    dev: u64,
    ino: u64,
    /// Bytes consumed from the start of the file.
    offset: u64,
}

impl Follower {
    fn poll(&mut self, config: &TailConfig, out: &mut Vec<(String, bool)>) -> io::Result<()> {
        let first_look = !self.looked;
        self.looked = true;
        if let Some(open) = self.file.as_mut() {
            // The path itself, not what a link there points to: a link put in place of
            // the file is a rotation, and its reopen is refused below.
            match std::fs::symlink_metadata(&config.path) {
                Ok(m) if m.dev() == open.dev && m.ino() == open.ino => {
                    if m.len() < open.offset {
                        open.file.seek(SeekFrom::Start(0))?;
                        open.offset = 0;
                        info!(path = %config.path.display(), "Sidecar log truncated; reading it from its start.");
                        self.flush_partial(config, out);
                    }
                    return self.read_available(config, out);
                }
                Ok(_) => {
                    // Rotated: finish what the writer put in the old file before it
                    // switched, then move to the new file.
                    self.read_available(config, out)?;
                    self.flush_partial(config, out);
                    self.file = None;
                    info!(path = %config.path.display(), "Sidecar log rotated; following the new file.");
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // Renamed away and not recreated yet: the writer may still append
                    // to the old file until it reopens.
                    return self.read_available(config, out);
                }
                Err(e) => return Err(e),
            }
        }
        let (file, meta) = match open_regular(&config.path) {
            Ok(opened) => opened,
            Err(Opened::Io(e)) if e.kind() == io::ErrorKind::NotFound => {
                if !self.missing {
                    info!(path = %config.path.display(), "Sidecar log does not exist yet; waiting for it.");
                    self.missing = true;
                }
                return Ok(());
            }
            Err(Opened::Io(e)) => return Err(e),
            Err(Opened::Refused(kind)) => {
                self.missing = false;
                if !self.refused.contains(&kind) {
                    warn!(path = %config.path.display(), refused = kind.describe(), "Sidecar log refused: only a regular file is read, never through a symbolic link.");
                    self.refused.push(kind);
                }
                return Ok(());
            }
        };
        self.missing = false;
        self.refused.clear();
        let mut open = OpenFile {
            file,
            dev: meta.dev(),
            ino: meta.ino(),
            offset: 0,
        };
        if first_look && meta.len() > config.initial_backlog {
            // Start one byte early: if that byte is a newline, the first whole line of
            // the backlog is kept rather than skipped.
            let start = meta.len() - config.initial_backlog - 1;
            open.file.seek(SeekFrom::Start(start))?;
            open.offset = start;
            self.skip_to_newline = true;
        }
        self.partial.clear();
        self.partial_truncated = false;
        self.file = Some(open);
        self.read_available(config, out)
    }

    /// Reads from the open file up to its end (or the per-poll limit).
    fn read_available(
        &mut self,
        config: &TailConfig,
        out: &mut Vec<(String, bool)>,
    ) -> io::Result<()> {
        let mut buf = vec![0u8; READ_CHUNK];
        let mut total = 0;
        while total < MAX_READ_PER_POLL {
            let Some(open) = self.file.as_mut() else {
                return Ok(());
            };
            let n = open.file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            open.offset += n as u64;
            total += n;
            self.consume(&buf[..n], config, out);
        }
        Ok(())
    }

    /// Splits bytes into lines, keeping the unfinished last one.
    fn consume(&mut self, mut bytes: &[u8], config: &TailConfig, out: &mut Vec<(String, bool)>) {
        while !bytes.is_empty() {
            let newline = bytes.iter().position(|&b| b == b'\n');
            let (piece, rest) = match newline {
                Some(i) => (&bytes[..i], &bytes[i + 1..]),
                None => (bytes, &[][..]),
            };
            if self.skip_to_newline {
                if newline.is_some() {
                    self.skip_to_newline = false;
                }
            } else {
                // Keep a few bytes over the limit so the cut can fall on a character
                // boundary of the decoded text.
                let room = (config.max_line_len + 3).saturating_sub(self.partial.len());
                if piece.len() > room {
                    self.partial_truncated = true;
                }
                self.partial
                    .extend_from_slice(&piece[..piece.len().min(room)]);
                if newline.is_some() {
                    self.flush_partial(config, out);
                }
            }
            bytes = rest;
        }
    }

    /// Emits the line being collected (blank lines carry nothing and are dropped).
    fn flush_partial(&mut self, config: &TailConfig, out: &mut Vec<(String, bool)>) {
        let raw = std::mem::take(&mut self.partial);
        let mut truncated = std::mem::take(&mut self.partial_truncated);
        let mut text = String::from_utf8_lossy(&raw).into_owned();
        if text.ends_with('\r') {
            text.pop();
        }
        if text.len() > config.max_line_len {
            let mut end = config.max_line_len;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            truncated = true;
        }
        if !text.trim().is_empty() {
            out.push((text, truncated));
        }
    }
}

/// Why a path was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// The path is a symbolic link.
    Symlink,
    /// The path is a FIFO.
    Fifo,
    /// The path is a directory, socket, device or anything else not a regular file.
    NotRegular,
}

impl Refusal {
    fn describe(self) -> &'static str {
        match self {
            Refusal::Symlink => "a symbolic link",
            Refusal::Fifo => "a FIFO",
            Refusal::NotRegular => "not a regular file",
        }
    }
}

/// Why [`open_regular`] gave no file.
#[derive(Debug)]
enum Opened {
    Io(io::Error),
    Refused(Refusal),
}

/// Opens `path` for reading without following a symbolic link there
/// (`O_NOFOLLOW`) and without waiting for a writer (`O_NONBLOCK`: opening a FIFO
/// would otherwise block), then checks the opened handle, not the path (which could
/// change between a check and the open), is a regular file. Answers the file with
/// its metadata.
fn open_regular(path: &Path) -> Result<(File, std::fs::Metadata), Opened> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            // What O_NOFOLLOW answers for a link at the path.
            Some(libc::ELOOP) => Opened::Refused(Refusal::Symlink),
            _ => Opened::Io(e),
        })?;
    let meta = file.metadata().map_err(Opened::Io)?;
    let kind = meta.file_type();
    if kind.is_file() {
        Ok((file, meta))
    } else if kind.is_fifo() {
        Err(Opened::Refused(Refusal::Fifo))
    } else {
        Err(Opened::Refused(Refusal::NotRegular))
    }
}

/// Now, ms since the epoch.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod differential;

#[cfg(test)]
mod tests {
    use super::*;

    fn line(seq: u64, at: i64, text: &str) -> TailedLine {
        TailedLine {
            seq,
            read_at_ms: at,
            text: text.into(),
            truncated: false,
        }
    }

    #[test]
    fn filter_on_text_and_time() {
        let l = line(1, 1_000, "[2026] \"GET /catalog/x HTTP/1.1\" 503 UH");
        assert!(LineFilter::default().matches(&l));
        let path = LineFilter {
            contains: Some("/catalog/x".into()),
            since_ms: None,
        };
        assert!(path.matches(&l));
        let other = LineFilter {
            contains: Some("/other".into()),
            since_ms: None,
        };
        assert!(!other.matches(&l));
        let later = LineFilter {
            contains: None,
            since_ms: Some(1_001),
        };
        assert!(!later.matches(&l));
    }

    #[test]
    fn ring_keeps_bounds_and_sequence() {
        let mut ring = Ring::new(3, 10, 0);
        for t in ["aa", "bb", "cc", "dd"] {
            ring.push(t.into(), false, 0);
        }
        let seqs: Vec<u64> = ring.lines.iter().map(|l| l.seq).collect();
        assert_eq!(seqs, [2, 3, 4]);
        ring.push("0123456789".into(), false, 0);
        assert_eq!(ring.lines.len(), 1);
        assert_eq!(ring.bytes, 10);
    }

    /// What the newest lines cover: since the tail began (or since its first line
    /// was written, when earlier), once lines were dropped since just after the
    /// last dropped one was read, and when the answer's bound left selected lines out,
    /// since just after the newest of those was read.
    #[test]
    fn the_newest_lines_say_what_they_cover() {
        let tail = LogTail::new(TailConfig {
            max_lines: 3,
            ..TailConfig::new("/nonexistent")
        });
        tail.ring().began_ms = 1_000;
        let all = |t: &LogTail| t.newest(|_| true, 10, 1 << 20, 1 << 10);
        assert_eq!(
            all(&tail).1,
            Coverage {
                from_ms: 1_000,
                start: WindowStart::Began
            }
        );
        tail.ring().push("not stamped".into(), false, 5_000);
        assert_eq!(all(&tail).1.from_ms, 1_000);
        // A file found at start: its first line was written before the tail began.
        let found = LogTail::new(TailConfig::new("/nonexistent"));
        found.ring().began_ms = 1_000;
        found.ring().push(
            "[1970-01-01 00:00:00.500][1][info][main] [main.cc:1] starting".into(),
            false,
            1_000,
        );
        assert_eq!(all(&found).1.from_ms, 500);

        for (text, at) in [("b", 6_000), ("c", 7_000), ("d", 8_000)] {
            tail.ring().push(text.into(), false, at);
        }
        let (lines, coverage) = all(&tail);
        assert_eq!(lines.len(), 3);
        assert_eq!(
            coverage,
            Coverage {
                from_ms: 5_001,
                start: WindowStart::Held
            }
        );
        // The newest line only: the one before it was read at 7,000.
        let (lines, coverage) = tail.newest(|_| true, 1, 1 << 20, 1 << 10);
        assert_eq!(
            lines.iter().map(|l| l.text.as_str()).collect::<Vec<_>>(),
            ["d"]
        );
        assert_eq!(
            coverage,
            Coverage {
                from_ms: 7_001,
                start: WindowStart::Answer
            }
        );
        // A selection that holds every selected line covers what the ring does.
        let (lines, coverage) = tail.newest(|t| t == "c", 1, 1 << 20, 1 << 10);
        assert_eq!(lines.len(), 1);
        assert_eq!(coverage.start, WindowStart::Held);
        // The bytes bound leaves lines out too.
        let (lines, coverage) = tail.newest(|_| true, 10, 1, 1 << 10);
        assert_eq!(lines.len(), 1);
        assert_eq!(coverage.from_ms, 7_001);
    }

    #[test]
    fn long_line_cut_at_char_boundary() {
        let config = TailConfig {
            max_line_len: 5,
            ..TailConfig::new("/nonexistent")
        };
        let mut f = Follower::default();
        let mut out = Vec::new();
        f.consume("abcdé\nxyz\r\n".as_bytes(), &config, &mut out);
        assert_eq!(out, [("abcd".to_owned(), true), ("xyz".to_owned(), false)]);
    }

    #[test]
    fn each_kind_of_refusal_is_remembered_once_until_a_regular_file_opens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sidecar.log");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "secret\n").unwrap();
        std::os::unix::fs::symlink(&secret, &path).unwrap();
        let config = TailConfig::new(&path);
        let mut f = Follower::default();
        let mut out = Vec::new();
        for _ in 0..3 {
            f.poll(&config, &mut out).unwrap();
        }
        assert_eq!(f.refused, [Refusal::Symlink]);
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        for _ in 0..3 {
            f.poll(&config, &mut out).unwrap();
        }
        assert_eq!(f.refused, [Refusal::Symlink, Refusal::NotRegular]);
        assert!(out.is_empty());
        std::fs::remove_dir(&path).unwrap();
        std::fs::write(&path, "mine\n").unwrap();
        f.poll(&config, &mut out).unwrap();
        assert!(f.refused.is_empty());
        assert_eq!(out, [("mine".to_owned(), false)]);
    }

    #[tokio::test]
    async fn catch_up_reads_what_the_file_holds_now() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sidecar.log");
        std::fs::write(&path, "old\n").unwrap();
        // A tail that is never polled on a timer: only catch_up reads.
        let tail = LogTail::new(TailConfig::new(&path));
        assert!(tail.catch_up(Duration::from_secs(2)).await);
        assert_eq!(tail.last_seq(), 1);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        let burst: String = (0..100_000).map(|i| format!("line {i}\n")).collect();
        std::io::Write::write_all(&mut f, burst.as_bytes()).unwrap();
        // More than one read's worth (4 MiB per read) is followed to the end.
        std::io::Write::write_all(&mut f, "x".repeat(5 << 20).as_bytes()).unwrap();
        std::io::Write::write_all(&mut f, b"\nnewest\n").unwrap();
        assert!(tail.catch_up(Duration::from_secs(10)).await);
        let last = tail.recent(&LineFilter::default(), 1);
        assert_eq!(last[0].text, "newest");
        // A missing file has nothing to catch up with.
        let gone = LogTail::new(TailConfig::new(dir.path().join("none.log")));
        assert!(gone.catch_up(Duration::from_secs(1)).await);
    }
}
