//! One redb database file of the aggregator (the registrations' `catalog.redb`, the
//! history's `history.redb`) that heals after a full disk.
//!
//! redb refuses every read and write of a database after one I/O error ("Previous
//! I/O error occurred. Please close and re-open the database"), however the disk
//! fares afterwards. Here the file's one writer, on such an error, closes and reopens
//! the database at once: the last commit is intact, and a reopening needs no space,
//! so readers go on. The file then takes no write until the filesystem takes a probe
//! of [`PROBE_BYTES`] again, tried at most every [`RETRY`] (by the next write, or by
//! [`RedbFile::heal`] from an idle writer); a write refused meanwhile is answered at
//! once with the cause. Nothing is written to the database while it fails, so a full
//! disk costs no repair per refused write.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use redb::Database;
use tracing::{error, info, warn};

/// How often a failing file tries again (reopens, probes the filesystem): writes
/// succeed again within this of space returning.
pub const RETRY: Duration = Duration::from_secs(1);
/// What the probe writes (and removes) beside the database: space returned means at
/// least this much free.
pub const PROBE_BYTES: usize = 1 << 20;

/// Why a file takes no writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unwritable {
    /// Its filesystem is full, or the quota spent (`ENOSPC`, `EDQUOT`): the I/O error.
    Full(String),
    /// Another I/O error.
    Failed(String),
}

impl Unwritable {
    fn of(e: &std::io::Error) -> Unwritable {
        use std::io::ErrorKind;
        match e.kind() {
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded => Unwritable::Full(e.to_string()),
            _ => Unwritable::Failed(e.to_string()),
        }
    }
}

impl std::fmt::Display for Unwritable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unwritable::Full(e) => write!(f, "the storage is full ({e})"),
            Unwritable::Failed(e) => write!(f, "the storage failed a write ({e})"),
        }
    }
}

/// An error of the aggregator's own that may carry one of redb's.
pub trait DbError {
    fn redb(&self) -> Option<&redb::Error>;
}

/// Why a write did not happen.
#[derive(Debug)]
pub enum Refused<E> {
    /// The file takes no writes (it failed one, and has not healed yet).
    Unwritable(Unwritable),
    /// The write's own error (not the storage's).
    Failed(E),
}

/// A database file, reopened after an I/O error.
#[derive(Debug)]
pub struct RedbFile {
    path: PathBuf,
    /// redb's page cache, when not its default.
    cache_bytes: Option<usize>,
    /// The open database; `None` only while a reopening failed (tried again every
    /// [`RETRY`]). Readers hold the read guard for their read; a reopening takes the
    /// write guard.
    db: RwLock<Option<Database>>,
    /// Why writes fail, and when they were last tried, while they fail.
    failing: Mutex<Option<Failing>>,
    /// Whether writes are taken, for metrics (no failure is known).
    writable: AtomicBool,
}

#[derive(Debug)]
struct Failing {
    /// What refused writes answer until the file heals.
    cause: Unwritable,
    /// When writes began to fail, for the log line that says they heal.
    since: Instant,
    /// When the file was last written or healed: the next try is due [`RETRY`] later.
    tried: Instant,
}

fn open_db(path: &Path, cache_bytes: Option<usize>) -> Result<Database, redb::DatabaseError> {
    let mut b = Database::builder();
    if let Some(bytes) = cache_bytes {
        b.set_cache_size(bytes);
    }
    b.create(path)
}

impl RedbFile {
    /// Opens (or creates) the database at `path`.
    pub fn open(
        path: PathBuf,
        cache_bytes: Option<usize>,
    ) -> Result<RedbFile, redb::DatabaseError> {
        let db = open_db(&path, cache_bytes)?;
        Ok(RedbFile {
            path,
            cache_bytes,
            db: RwLock::new(Some(db)),
            failing: Mutex::new(None),
            writable: AtomicBool::new(true),
        })
    }

    /// Runs `read` on the database; `None` while it could not be reopened.
    pub fn read<T>(&self, read: impl FnOnce(&Database) -> T) -> Option<T> {
        let db = self.db.read().unwrap_or_else(|p| p.into_inner());
        db.as_ref().map(read)
    }

    /// Whether writes are taken (no failure known since the last one healed).
    pub fn writable(&self) -> bool {
        self.writable.load(Ordering::Acquire)
    }

    /// Runs the writer's `write` on the database, unless the file fails and has not
    /// healed ([`Self::heal`]): then the cause answers at once. An I/O error of
    /// `write` makes the file fail: the database is reopened at once, so that reads
    /// go on, and the error answers as the cause.
    pub fn write<T, E: DbError>(
        &self,
        write: impl FnOnce(&Database) -> Result<T, E>,
    ) -> Result<T, Refused<E>> {
        self.heal().map_err(Refused::Unwritable)?;
        let outcome = {
            let db = self.db.read().unwrap_or_else(|p| p.into_inner());
            let Some(db) = db.as_ref() else {
                // Healing reopens first: a closed database is not healed.
                return Err(Refused::Unwritable(Unwritable::Failed(
                    "the database is closed".into(),
                )));
            };
            write(db)
        };
        match outcome {
            Ok(v) => Ok(v),
            Err(e) => match e.redb().and_then(cause_of) {
                Some(cause) => {
                    self.fail(cause.clone());
                    self.reopen();
                    Err(Refused::Unwritable(cause))
                }
                None => Err(Refused::Failed(e)),
            },
        }
    }

    /// While the file fails, at most every [`RETRY`]: reopens the database if it is
    /// closed, then probes the filesystem; when both succeed, writes are taken
    /// again. Answers the cause while the file still fails.
    pub fn heal(&self) -> Result<(), Unwritable> {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        let Some(f) = failing.as_mut() else {
            return Ok(());
        };
        let now = Instant::now();
        if now.saturating_duration_since(f.tried) < RETRY {
            return Err(f.cause.clone());
        }
        f.tried = now;
        let open = self.db.read().unwrap_or_else(|p| p.into_inner()).is_some();
        if !open && !self.reopen() {
            return Err(f.cause.clone());
        }
        if let Err(e) = self.probe() {
            f.cause = Unwritable::of(&e);
            return Err(f.cause.clone());
        }
        info!(
            file = %self.path.display(),
            failed_for_ms = now.saturating_duration_since(f.since).as_millis() as u64,
            "Storage takes writes again."
        );
        *failing = None;
        self.writable.store(true, Ordering::Release);
        Ok(())
    }

    /// Notes that writes fail for `cause`.
    fn fail(&self, cause: Unwritable) {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if failing.is_none() {
            error!(
                file = %self.path.display(),
                cause = %cause,
                retry_ms = RETRY.as_millis() as u64,
                "Storage refuses writes; reads go on. Writes are tried again once the filesystem takes them."
            );
        }
        let since = failing.as_ref().map_or(now, |f| f.since);
        *failing = Some(Failing {
            cause,
            since,
            tried: now,
        });
        self.writable.store(false, Ordering::Release);
    }

    /// Closes the database and opens it again (redb takes no read or write after an
    /// I/O error until then). Answers whether it is open.
    fn reopen(&self) -> bool {
        let mut db = self.db.write().unwrap_or_else(|p| p.into_inner());
        // Closed first: the file is locked while open.
        drop(db.take());
        match open_db(&self.path, self.cache_bytes) {
            Ok(opened) => {
                *db = Some(opened);
                true
            }
            Err(e) => {
                warn!(file = %self.path.display(), error = %e, "Storage cannot be reopened yet; tried again shortly.");
                false
            }
        }
    }

    /// Writes [`PROBE_BYTES`] beside the database, durably, and removes them.
    fn probe(&self) -> std::io::Result<()> {
        use std::io::Write;
        let mut name = self.path.as_os_str().to_owned();
        name.push(".probe");
        let path = PathBuf::from(name);
        let written = (|| {
            let mut f = std::fs::File::create(&path)?;
            f.write_all(&vec![0u8; PROBE_BYTES])?;
            f.sync_all()
        })();
        let _ = std::fs::remove_file(&path);
        written
    }
}

/// Whether one of redb's errors is the storage's (the database must be reopened),
/// and why.
fn cause_of(e: &redb::Error) -> Option<Unwritable> {
    match e {
        redb::Error::Io(io) => Some(Unwritable::of(io)),
        redb::Error::PreviousIo | redb::Error::DatabaseClosed => {
            Some(Unwritable::Failed(e.to_string()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::ReadableDatabase;

    #[derive(Debug)]
    struct Plain(redb::Error);

    impl DbError for Plain {
        fn redb(&self) -> Option<&redb::Error> {
            Some(&self.0)
        }
    }

    const T: redb::TableDefinition<'_, u64, u64> = redb::TableDefinition::new("t");

    fn put(file: &RedbFile, k: u64) -> Result<(), Refused<Plain>> {
        file.write(|db| {
            let tx = db.begin_write().map_err(|e| Plain(e.into()))?;
            tx.open_table(T)
                .map_err(|e| Plain(e.into()))?
                .insert(k, k)
                .map_err(|e| Plain(e.into()))?;
            tx.commit().map_err(|e| Plain(e.into()))
        })
    }

    /// A write's I/O error makes the file fail and reopens it; it takes writes again
    /// once healed, and what was committed stays.
    #[test]
    fn a_failed_write_reopens_the_file_and_healing_takes_writes_again() {
        let dir = tempfile::tempdir().unwrap();
        let file = RedbFile::open(dir.path().join("t.redb"), None).unwrap();
        put(&file, 1).unwrap();
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let refused = file.write(|_| Err::<(), _>(Plain(redb::Error::Io(full))));
        let Err(Refused::Unwritable(Unwritable::Full(cause))) = refused else {
            panic!("{refused:?}");
        };
        assert!(!file.writable());
        // Refused at once, with the cause, until healed.
        match put(&file, 2) {
            Err(Refused::Unwritable(Unwritable::Full(c))) => assert_eq!(c, cause),
            other => panic!("{other:?}"),
        }
        let read = |k| {
            file.read(|db| {
                let tx = db.begin_read().unwrap();
                tx.open_table(T).unwrap().get(k).unwrap().map(|v| v.value())
            })
            .unwrap()
        };
        assert_eq!(read(1), Some(1), "reads go on");
        // Healing waits for its retry time.
        file.failing.lock().unwrap().as_mut().unwrap().tried -= RETRY;
        file.heal().unwrap();
        assert!(file.writable());
        put(&file, 2).unwrap();
        assert_eq!((read(1), read(2)), (Some(1), Some(2)));
        // A write's own error leaves the file writable.
        let own = file.write(|_| Err::<(), _>(Plain(redb::Error::TableDoesNotExist("x".into()))));
        assert!(matches!(own, Err(Refused::Failed(_))));
        assert!(file.writable());
    }
}
