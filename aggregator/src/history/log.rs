//! The durable log: `<data-dir>/history.redb`, apart from the catalog's database so
//! that its appends and evictions never share a transaction (or an fsync) with a
//! registration. Five tables:
//!
//! - `entries`: id -> the entry's stored form ([`Stored`]). Ids are consecutive:
//!   retention removes a prefix and appends add at the end, so the ids held are
//!   exactly `first..next`.
//! - `runs`: the ids where the recorded time went back by more than [`RAISE`] from
//!   the entry before (the clock stepped back, or a previous run of the process had
//!   a clock ahead). Within a run times never go down along ids (the appender raises
//!   an entry's time to the one before it when the two are less than [`RAISE`]
//!   apart), so a time bound is found by bisecting the ids of each run. Clock steps
//!   are rare: a log holds few runs, usually one.
//! - `postings`: the indexes, a posting list of ids for each zone, cluster,
//!   instance and kind, and each zone and cluster by kind ([`super::index`]), so
//!   that every filter and combination of them reads the entries it answers and
//!   few others.
//! - `meta`: the next id, so ids keep growing across restarts even when retention
//!   emptied the log, the bytes the entries held take ([`entry_bytes`]), for
//!   `--history-max-bytes`, and how far the entries are in the posting lists (a
//!   log written with the earlier indexes, one table by cluster and one by kind,
//!   has its lists built when it is opened).
//!
//! One [`Appender`] writes (the history's writer thread); any number of readers
//! query at once, each in its own read transaction, at most [`QUERIES_AT_ONCE`] on
//! the blocking pool, each examining at most [`MAX_EXAMINED`] entries.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use tokio::sync::Semaphore;

use super::entry::{Kind, Pending, Stored};
use super::index::{self, POSTINGS, Term};
use crate::redb_file::{RedbFile, Refused, Unwritable};

const ENTRIES: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("entries");
const RUNS: TableDefinition<'_, u64, ()> = TableDefinition::new("runs");
/// The indexes of a log written before the posting lists: dropped once the lists
/// are built.
const OLD_BY_CLUSTER: TableDefinition<'_, (u32, u64), ()> = TableDefinition::new("by_cluster");
const OLD_BY_KIND: TableDefinition<'_, (u8, u64), ()> = TableDefinition::new("by_kind");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
const NEXT_ID: &str = "next_id";
const BYTES: &str = "bytes";
/// The first id not yet in the posting lists; [`INDEXED_ALL`] once every entry is.
const INDEXED: &str = "indexed";
const INDEXED_ALL: u64 = u64::MAX;
/// Entries indexed in one commit when the posting lists are built for an older log
/// (fewer in unit tests, so that a small log takes several).
const INDEX_CHUNK: u64 = if cfg!(test) { 300 } else { 100_000 };

/// What one entry costs besides its stored form, as the byte bound counts it: its
/// key in the entries table, its ids in the posting lists, and redb's per-entry
/// bookkeeping and page slack, as measured on a full log (`docs/benchmarks.md`,
/// history).
pub const ENTRY_OVERHEAD: u64 = 64;

/// The bytes one entry takes as `--history-max-bytes` counts them: its stored form
/// and [`ENTRY_OVERHEAD`].
pub fn entry_bytes(stored: &[u8]) -> u64 {
    stored.len() as u64 + ENTRY_OVERHEAD
}

/// File name of the history inside the data directory, with the redb store.
pub const DB_FILE: &str = "history.redb";

/// File name of the history of a replica on an etcd store: replicas on one machine
/// may share a data directory (the development certificates), each keeps its own
/// history, named by the port of its advertised address, which a restart keeps.
pub fn replica_file(advertised_port: u16) -> String {
    format!("history-{advertised_port}.redb")
}

/// Pages of the history kept in memory: the newest entries and the indexes' upper
/// levels, which every query reads. The rest is read from the file when asked.
const CACHE_BYTES: usize = 64 << 20;

/// Most entries one commit evicts: a long downtime or a lowered retention is caught
/// up over several short commits, one after the other while nothing is recorded
/// (see [`Appender::behind`]), so that an entry recorded meanwhile waits for one
/// of them at most. Above [`super::writer::MAX_BATCH`], so that eviction keeps up
/// with a log at its limit.
pub const MAX_EVICT: u64 = 10_000;
const _: () = assert!(MAX_EVICT >= super::writer::MAX_BATCH as u64);

/// How far an entry's time is raised to the time of the entry stored before it, at
/// most, in ms: entries recorded by threads racing by a few milliseconds keep times
/// that never go down along ids. An entry more than this before the one before it
/// (the clock stepped back) keeps its own time and starts a new run.
pub const RAISE: i64 = 1000;

/// Most entries one query examines (reads and decodes): the indexes give a query
/// the entries its filters name, and those of names that share their key
/// ([`super::index`]); a query that meets that many stops there, and says where
/// ([`Found`]).
pub const MAX_EXAMINED: usize = 100_000;

/// Queries running at once on the blocking pool; more wait for a place.
pub const QUERIES_AT_ONCE: usize = 4;

/// A failure of the history's database.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("cannot create data directory {path}: {error}")]
    Dir { path: String, error: std::io::Error },
    #[error("history storage error: {0}")]
    Db(#[from] redb::Error),
    #[error("cannot start the history writer: {0}")]
    Writer(std::io::Error),
    #[error("the history query did not run")]
    Query,
    /// Its storage takes no writes until it heals (full, or failed a write).
    #[error("the history cannot be stored: {0}")]
    Unwritable(Unwritable),
    /// The database is being reopened after a storage failure.
    #[error("the history's database is closed; it is reopened shortly")]
    Closed,
}

impl From<Refused<HistoryError>> for HistoryError {
    fn from(r: Refused<HistoryError>) -> Self {
        match r {
            Refused::Unwritable(u) => HistoryError::Unwritable(u),
            Refused::Failed(e) => e,
        }
    }
}

crate::redb_errors::from_redb_errors!(HistoryError);

/// How long and how much the log keeps (`--history-retention`,
/// `--history-max-entries`, `--history-max-bytes`); the oldest entries go first
/// when any bound is passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub max_age: Duration,
    pub max_entries: u64,
    /// The most bytes the entries held take ([`entry_bytes`]).
    pub max_bytes: u64,
}

/// What a query asks: every filter given must hold; `kinds` matches any of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    pub zone: Option<String>,
    pub cluster: Option<String>,
    pub instance: Option<String>,
    pub kinds: Vec<Kind>,
    /// Inclusive, ms since the epoch.
    pub since: Option<i64>,
    /// Exclusive, ms since the epoch.
    pub until: Option<i64>,
    /// Most entries answered, the newest.
    pub limit: usize,
}

impl Query {
    fn admits(&self, s: &Stored<'_>) -> bool {
        self.zone.as_deref().is_none_or(|z| z == s.zone)
            && self.cluster.as_deref().is_none_or(|c| c == s.cluster)
            && self.instance.as_deref().is_none_or(|i| i == s.instance)
            && (self.kinds.is_empty() || self.kinds.contains(&s.kind))
    }
}

/// One stored entry as a query found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub id: u64,
    pub bytes: Vec<u8>,
}

impl Row {
    pub fn stored(&self) -> Stored<'_> {
        Stored::decode(&self.bytes).expect("rows hold entries that decoded")
    }
}

/// What a query found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    /// The entries, newest first.
    pub rows: Vec<Row>,
    /// Set when the query examined [`MAX_EXAMINED`] entries before it had `limit`
    /// of them: the time of the last entry examined. Every entry the query admits
    /// at or after this time (and before `until`) is in `rows` (the examination
    /// went on through the entries of that millisecond); older ones were not looked
    /// at. `None` when nothing was left out.
    pub incomplete: Option<i64>,
}

/// The history's database, shared by the writer and the readers.
#[derive(Debug, Clone)]
pub struct HistoryDb {
    file: Arc<RedbFile>,
    /// Places for queries on the blocking pool.
    queries: Arc<Semaphore>,
}

impl HistoryDb {
    /// Opens (or creates) the history `file` in `dir`.
    pub fn open(dir: &Path, file: &str) -> Result<HistoryDb, HistoryError> {
        std::fs::create_dir_all(dir).map_err(|error| HistoryError::Dir {
            path: dir.display().to_string(),
            error,
        })?;
        let file = RedbFile::open(dir.join(file), Some(CACHE_BYTES))?;
        // Tables exist from the first start on, so reads never meet a missing table.
        file.write(|db| -> Result<(), HistoryError> {
            let tx = db.begin_write()?;
            tx.open_table(ENTRIES)?;
            tx.open_table(RUNS)?;
            tx.open_table(POSTINGS)?;
            let fresh = tx.open_table(ENTRIES)?.is_empty()?;
            {
                let mut meta = tx.open_table(META)?;
                if fresh && meta.get(INDEXED)?.is_none() {
                    meta.insert(INDEXED, INDEXED_ALL)?;
                }
            }
            if fresh {
                // An earlier version's emptied indexes, if any.
                tx.delete_table(OLD_BY_CLUSTER)?;
                tx.delete_table(OLD_BY_KIND)?;
            }
            tx.commit()?;
            build_postings(db)?;
            Ok(())
        })?;
        Ok(HistoryDb {
            file: Arc::new(file),
            queries: Arc::new(Semaphore::new(QUERIES_AT_ONCE)),
        })
    }

    /// Runs `read` on the database ([`HistoryError::Closed`] while it is being
    /// reopened).
    fn read_db<T>(
        &self,
        read: impl FnOnce(&Database) -> Result<T, HistoryError>,
    ) -> Result<T, HistoryError> {
        self.file.read(read).unwrap_or(Err(HistoryError::Closed))
    }

    /// The one writer of this database.
    pub fn appender(&self, retention: Retention) -> Result<Appender, HistoryError> {
        self.read_db(|db| self.appender_in(db, retention))
    }

    fn appender_in(&self, db: &Database, retention: Retention) -> Result<Appender, HistoryError> {
        let tx = db.begin_read()?;
        let entries = tx.open_table(ENTRIES)?;
        let meta = tx.open_table(META)?;
        let (first, next) = bounds(&entries, &meta)?;
        let last_at = match entries.last()? {
            Some((_, v)) => Stored::decode(v.value()).map(|s| s.at_ms),
            None => None,
        };
        // A log written before the byte bound has no count yet: counted once here,
        // kept from the next commit on.
        let bytes = match meta.get(BYTES)? {
            Some(v) => v.value(),
            None => {
                let mut total = 0;
                for row in entries.iter()? {
                    total += entry_bytes(row?.1.value());
                }
                total
            }
        };
        Ok(Appender {
            file: self.file.clone(),
            first,
            next,
            last_at,
            bytes,
            retention,
            behind: true,
            buf: Vec::with_capacity(256),
        })
    }

    /// Entries held.
    pub fn len(&self) -> Result<u64, HistoryError> {
        self.read_db(|db| {
            let tx = db.begin_read()?;
            Ok(tx.open_table(ENTRIES)?.len()?)
        })
    }

    pub fn is_empty(&self) -> Result<bool, HistoryError> {
        Ok(self.len()? == 0)
    }

    /// Runs `read` on the blocking pool once one of the [`QUERIES_AT_ONCE`] places
    /// is free. The place is held until `read` returns, even when the caller gave
    /// up waiting for it: abandoned queries still count.
    pub async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&HistoryDb) -> Result<T, HistoryError> + Send + 'static,
    ) -> Result<T, HistoryError> {
        let place = self
            .queries
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| HistoryError::Query)?;
        let db = self.clone();
        tokio::task::spawn_blocking(move || {
            let _place = place;
            read(&db)
        })
        .await
        .map_err(|_| HistoryError::Query)?
    }

    /// The newest entries that `q` admits, newest first, at most `q.limit`,
    /// examining at most [`MAX_EXAMINED`] entries. The posting lists of its filters
    /// are walked together ([`index::sources`], [`index::Intersect`]), and only the
    /// entries in all of them read; without a filter, the entries from the newest
    /// back. Time bounds narrow every source first.
    pub fn query(&self, q: &Query) -> Result<Found, HistoryError> {
        self.query_within(q, MAX_EXAMINED)
    }

    /// [`HistoryDb::query`], examining at most `budget` entries.
    pub fn query_within(&self, q: &Query, budget: usize) -> Result<Found, HistoryError> {
        self.read_db(|db| Self::query_in(db, q, budget))
    }

    fn query_in(db: &Database, q: &Query, budget: usize) -> Result<Found, HistoryError> {
        let mut found = Found {
            rows: Vec::with_capacity(q.limit.min(1024)),
            incomplete: None,
        };
        if q.limit == 0 {
            return Ok(found);
        }
        let tx = db.begin_read()?;
        let entries = tx.open_table(ENTRIES)?;
        let meta = tx.open_table(META)?;
        let runs = tx.open_table(RUNS)?;
        let (first, next) = bounds(&entries, &meta)?;
        // The id ranges whose entries are within the time bounds, one per run.
        let mut ranges = Vec::new();
        for (start, end) in runs_of(&runs, first, next)? {
            let lo = match q.since {
                Some(t) => first_at_or_after(&entries, start, end, t)?,
                None => start,
            };
            let hi = match q.until {
                Some(t) => first_at_or_after(&entries, lo, end, t)?,
                None => end,
            };
            if lo < hi {
                ranges.push((lo, hi));
            }
        }
        let mut scan = Scan {
            q,
            out: &mut found,
            budget,
            examined: 0,
            last_at: None,
        };
        let postings = tx.open_table(POSTINGS)?;
        let sources = index::sources(q);
        // Newest first: the last run's range first, each from its end.
        'ranges: for (lo, hi) in ranges.into_iter().rev() {
            match &sources {
                Some(terms) => {
                    let mut ids = index::Intersect::new(&postings, terms, lo, hi);
                    while let Some(id) = ids.next()? {
                        if let Some(v) = entries.get(id)?
                            && scan.take(id, v.value())
                        {
                            break 'ranges;
                        }
                    }
                }
                None => {
                    for row in entries.range(lo..hi)?.rev() {
                        let (k, v) = row?;
                        if scan.take(k.value(), v.value()) {
                            break 'ranges;
                        }
                    }
                }
            }
        }
        Ok(found)
    }
}

/// One query's walk over its sources: takes what the query admits, counts what it
/// examined, and says when to stop.
struct Scan<'q, 'f> {
    q: &'q Query,
    out: &'f mut Found,
    budget: usize,
    examined: usize,
    /// Once the budget is spent: the time of the last entry examined, whose
    /// millisecond is finished before the walk stops.
    last_at: Option<i64>,
}

impl Scan<'_, '_> {
    /// Examines entry `id`; answers whether the walk is over (the answer is full,
    /// or the budget is spent).
    fn take(&mut self, id: u64, bytes: &[u8]) -> bool {
        let Some(s) = Stored::decode(bytes) else {
            return false;
        };
        if let Some(at) = self.last_at
            && s.at_ms != at
        {
            self.out.incomplete = Some(at);
            return true;
        }
        self.examined += 1;
        if self.q.admits(&s) {
            self.out.rows.push(Row {
                id,
                bytes: bytes.to_vec(),
            });
            if self.out.rows.len() >= self.q.limit {
                return true;
            }
        }
        if self.examined >= self.budget && self.last_at.is_none() {
            self.last_at = Some(s.at_ms);
        }
        false
    }
}

/// Builds the posting lists of a log written before them, from the entries, in
/// commits of [`INDEX_CHUNK`] entries (a restart goes on from the last), then drops
/// the earlier indexes.
fn build_postings(db: &Database) -> Result<(), HistoryError> {
    loop {
        let tx = db.begin_write()?;
        let from = tx.open_table(META)?.get(INDEXED)?.map_or(0, |v| v.value());
        if from == INDEXED_ALL {
            return Ok(());
        }
        let (first, next) = bounds(&tx.open_table(ENTRIES)?, &tx.open_table(META)?)?;
        let from = from.max(first);
        let to = next.min(from.saturating_add(INDEX_CHUNK));
        if from == first {
            tracing::info!(
                entries = next - first,
                "Building the history's indexes (once, for a history written by an earlier version)."
            );
        }
        let mut postings = Vec::new();
        for row in tx.open_table(ENTRIES)?.range(from..to)? {
            let (k, v) = row?;
            if let Some(s) = Stored::decode(v.value()) {
                postings.extend(index::terms_of(&s).into_iter().map(|t| (t, k.value())));
            }
        }
        index::add(&mut tx.open_table(POSTINGS)?, postings)?;
        let done = to >= next;
        tx.open_table(META)?
            .insert(INDEXED, if done { INDEXED_ALL } else { to })?;
        if done {
            tx.delete_table(OLD_BY_CLUSTER)?;
            tx.delete_table(OLD_BY_KIND)?;
        }
        tx.commit()?;
    }
}

/// The ids held: `first..next`.
fn bounds(
    entries: &impl ReadableTable<u64, &'static [u8]>,
    meta: &impl ReadableTable<&'static str, u64>,
) -> Result<(u64, u64), HistoryError> {
    let stored_next = meta.get(NEXT_ID)?.map_or(1, |v| v.value());
    let next = match entries.last()? {
        Some((k, _)) => stored_next.max(k.value() + 1),
        None => stored_next,
    };
    let first = entries.first()?.map_or(next, |(k, _)| k.value());
    Ok((first, next))
}

/// The runs of `first..next` as id ranges, oldest first: within each, times never
/// go down along ids.
fn runs_of(
    runs: &impl ReadableTable<u64, ()>,
    first: u64,
    next: u64,
) -> Result<Vec<(u64, u64)>, HistoryError> {
    let mut out = Vec::new();
    let mut start = first;
    if first < next {
        for key in runs.range(first + 1..next)? {
            let at = key?.0.value();
            out.push((start, at));
            start = at;
        }
    }
    out.push((start, next));
    Ok(out)
}

/// The time of entry `id`, or of the first one after it (ids are consecutive, so
/// that is the same entry; a gap would only move the bound forward).
fn at_of(
    entries: &impl ReadableTable<u64, &'static [u8]>,
    id: u64,
    next: u64,
) -> Result<i64, HistoryError> {
    if let Some(v) = entries.get(id)? {
        return Ok(Stored::decode(v.value()).map_or(i64::MAX, |s| s.at_ms));
    }
    Ok(match entries.range(id..next)?.next() {
        Some(row) => Stored::decode(row?.1.value()).map_or(i64::MAX, |s| s.at_ms),
        None => i64::MAX,
    })
}

/// The first id in `lo..hi` whose entry is at `at` or later (`hi` when none); the
/// range lies within one run. One read answers when the first entry is already that
/// late, as it is for retention on almost every commit (nothing due yet).
fn first_at_or_after(
    entries: &impl ReadableTable<u64, &'static [u8]>,
    mut lo: u64,
    mut hi: u64,
    at: i64,
) -> Result<u64, HistoryError> {
    let next = hi;
    if lo < hi && at_of(entries, lo, next)? >= at {
        return Ok(lo);
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if at_of(entries, mid, next)? < at {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// The single writer: numbers entries, stores them with their index keys, and
/// applies retention, all in one durable transaction per batch.
#[derive(Debug)]
pub struct Appender {
    file: Arc<RedbFile>,
    /// The oldest id held.
    first: u64,
    /// The id the next entry takes.
    next: u64,
    /// The time of the newest entry stored (by this process or before it), if any.
    last_at: Option<i64>,
    /// What the entries held take ([`entry_bytes`]).
    bytes: u64,
    retention: Retention,
    /// Whether the last eviction stopped at [`MAX_EVICT`] with more to drop (or
    /// none ran yet).
    behind: bool,
    /// Scratch for one entry's stored form and its detail's JSON.
    buf: Vec<u8>,
}

impl Appender {
    /// Entries held.
    pub fn len(&self) -> u64 {
        self.next - self.first
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the entries held take, as the byte bound counts it.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the database takes writes (no storage failure known).
    pub fn writable(&self) -> bool {
        self.file.writable()
    }

    /// While the database refuses writes, tries to heal it (at most every
    /// [`crate::redb_file::RETRY`]); answers why it still refuses them.
    pub fn heal(&self) -> Result<(), Unwritable> {
        self.file.heal()
    }

    /// Whether retention may have more to drop than the last commit dropped: the
    /// writer then runs [`Appender::expire`] again as soon as nothing is queued.
    pub fn behind(&self) -> bool {
        self.behind
    }

    /// Stores `batch` in order with consecutive ids, evicts what retention drops
    /// (at `now_ms`, at most [`MAX_EVICT`]), and commits durably before returning.
    /// `stored` sees each entry as stored, with its id, once the commit succeeded.
    /// An entry whose time is before the newest stored one by at most [`RAISE`]
    /// takes that one's time; one further back keeps its own and starts a run.
    pub fn append(
        &mut self,
        batch: &[Pending],
        now_ms: i64,
        stored: impl FnMut(u64, Stored<'_>),
    ) -> Result<(), HistoryError> {
        let file = self.file.clone();
        Ok(file.write(|db| self.append_in(db, batch, now_ms, stored))?)
    }

    fn append_in(
        &mut self,
        db: &Database,
        batch: &[Pending],
        now_ms: i64,
        mut stored: impl FnMut(u64, Stored<'_>),
    ) -> Result<(), HistoryError> {
        let tx = db.begin_write()?;
        let mut encoded: Vec<(u64, usize, usize)> = Vec::with_capacity(batch.len());
        let mut arena: Vec<u8> = Vec::with_capacity(batch.len() * 96);
        let (mut next, mut last_at, mut bytes) = (self.next, self.last_at, self.bytes);
        {
            let mut entries = tx.open_table(ENTRIES)?;
            let mut runs = tx.open_table(RUNS)?;
            let mut postings: Vec<(Term, u64)> = Vec::with_capacity(batch.len() * 6);
            for p in batch {
                let id = next;
                next += 1;
                let at_ms = match last_at {
                    Some(last) if p.at_ms < last.saturating_sub(RAISE) => {
                        if id > self.first {
                            runs.insert(id, ())?;
                        }
                        p.at_ms
                    }
                    Some(last) => p.at_ms.max(last),
                    None => p.at_ms,
                };
                last_at = Some(at_ms);
                self.buf.clear();
                serde_json::to_writer(&mut self.buf, &p.detail).expect("details serialise");
                let start = arena.len();
                Stored {
                    at_ms,
                    kind: p.kind,
                    zone: &p.zone,
                    cluster: &p.cluster,
                    instance: &p.instance,
                    detail: &self.buf,
                }
                .encode(&mut arena);
                bytes += entry_bytes(&arena[start..]);
                entries.insert(id, &arena[start..])?;
                postings.extend(
                    index::terms(p.kind, &p.zone, &p.cluster, &p.instance)
                        .into_iter()
                        .map(|t| (t, id)),
                );
                encoded.push((id, start, arena.len()));
            }
            index::add(&mut tx.open_table(POSTINGS)?, postings)?;
            tx.open_table(META)?.insert(NEXT_ID, next)?;
        }
        let (first, behind, gone) = self.evict_in(&tx, self.first, next, bytes, now_ms)?;
        let bytes = bytes - gone;
        tx.open_table(META)?.insert(BYTES, bytes)?;
        tx.commit()?;
        (self.first, self.next, self.last_at, self.behind, self.bytes) =
            (first, next, last_at, behind, bytes);
        for (id, start, end) in encoded {
            stored(
                id,
                Stored::decode(&arena[start..end]).expect("encoded just now"),
            );
        }
        Ok(())
    }

    /// Applies retention alone (no entry to add): age moves on while nothing
    /// happens. Drops at most [`MAX_EVICT`]; returns how many entries went.
    pub fn expire(&mut self, now_ms: i64) -> Result<u64, HistoryError> {
        // A failure is tried again at the next round, not at once.
        self.behind = false;
        let file = self.file.clone();
        Ok(file.write(|db| self.expire_in(db, now_ms))?)
    }

    fn expire_in(&mut self, db: &Database, now_ms: i64) -> Result<u64, HistoryError> {
        let tx = db.begin_write()?;
        let (first, behind, gone_bytes) =
            self.evict_in(&tx, self.first, self.next, self.bytes, now_ms)?;
        if first == self.first {
            tx.abort()?;
            return Ok(0);
        }
        let bytes = self.bytes - gone_bytes;
        tx.open_table(META)?.insert(BYTES, bytes)?;
        tx.commit()?;
        let gone = first - self.first;
        (self.first, self.behind, self.bytes) = (first, behind, bytes);
        Ok(gone)
    }

    /// Removes the oldest entries past any bound, at most [`MAX_EVICT`], with their
    /// index keys; `bytes` is what the entries `first..next` take. Returns the new
    /// first id, whether more are due, and the bytes that went. By age, the entries
    /// go from the oldest id on while their time is before the cutoff: an entry
    /// stamped later than the cutoff (a run whose clock was ahead) keeps the ones
    /// after it until it is due itself, or the count or byte bound takes them.
    fn evict_in(
        &self,
        tx: &redb::WriteTransaction,
        first: u64,
        next: u64,
        bytes: u64,
        now_ms: i64,
    ) -> Result<(u64, bool, u64), HistoryError> {
        let mut entries = tx.open_table(ENTRIES)?;
        let mut runs = tx.open_table(RUNS)?;
        let held = next - first;
        let mut to = first;
        if held > self.retention.max_entries {
            to = next - self.retention.max_entries;
        }
        let max_age = i64::try_from(self.retention.max_age.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms.saturating_sub(max_age);
        for (start, end) in runs_of(&runs, first, next)? {
            if end <= to {
                continue;
            }
            to = first_at_or_after(&entries, start.max(to), end, cutoff)?;
            if to < end {
                break;
            }
        }
        if to <= first && bytes <= self.retention.max_bytes {
            return Ok((first, false, 0));
        }
        // Count and age drop `..to`; the byte bound goes on from there while the
        // rest takes more than it allows.
        let limit = first + MAX_EVICT;
        let (mut end, mut left, mut behind) = (first, bytes, false);
        for row in entries.range(first..next)? {
            let (k, v) = row?;
            let id = k.value();
            if id >= to && left <= self.retention.max_bytes {
                break;
            }
            if id >= limit {
                behind = true;
                break;
            }
            left = left.saturating_sub(entry_bytes(v.value()));
            end = id + 1;
        }
        if end <= first {
            return Ok((first, false, 0));
        }
        index::remove_below(&mut tx.open_table(POSTINGS)?, end)?;
        entries.retain_in(first..end, |_, _| false)?;
        // The run that holds `end` is the first now: its start is implied.
        runs.retain_in(..=end, |_, _| false)?;
        Ok((end, behind, bytes - left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::entry::{Detail, LeftReason};

    fn entry(at_ms: i64, kind: Kind, cluster: &str, instance: &str) -> Pending {
        Pending {
            at_ms,
            kind,
            zone: "z".into(),
            cluster: cluster.into(),
            instance: instance.into(),
            detail: Detail::Left {
                reason: LeftReason::Expired,
            },
        }
    }

    const KEEP_ALL: Retention = Retention {
        max_age: Duration::from_secs(3600),
        max_entries: 1_000_000,
        max_bytes: u64::MAX,
    };

    fn ids(rows: &[Row]) -> Vec<u64> {
        rows.iter().map(|r| r.id).collect()
    }

    fn all(limit: usize) -> Query {
        Query {
            limit,
            ..Query::default()
        }
    }

    #[test]
    fn ids_grow_across_reopening_and_newest_come_first() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = HistoryDb::open(dir.path(), DB_FILE).unwrap();
            let mut a = db.appender(KEEP_ALL).unwrap();
            let batch: Vec<Pending> = (0..5)
                .map(|i| entry(1000 + i, Kind::InstanceLeft, "c", "i"))
                .collect();
            let mut seen = Vec::new();
            a.append(&batch, 2000, |id, s| seen.push((id, s.at_ms)))
                .unwrap();
            assert_eq!(
                seen,
                vec![(1, 1000), (2, 1001), (3, 1002), (4, 1003), (5, 1004)]
            );
        }
        let db = HistoryDb::open(dir.path(), DB_FILE).unwrap();
        let mut a = db.appender(KEEP_ALL).unwrap();
        // An entry less than a second before the newest takes the newest's time.
        let mut seen = Vec::new();
        a.append(&[entry(10, Kind::InstanceLeft, "c", "i")], 2000, |id, s| {
            seen.push((id, s.at_ms));
        })
        .unwrap();
        assert_eq!(seen, vec![(6, 1004)]);
        assert_eq!(ids(&db.query(&all(3)).unwrap().rows), vec![6, 5, 4]);
    }

    #[test]
    fn filters_use_the_indexes_and_time_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let db = HistoryDb::open(dir.path(), DB_FILE).unwrap();
        let mut a = db.appender(KEEP_ALL).unwrap();
        let mut batch = Vec::new();
        for i in 0..300 {
            let (kind, cluster) = match i % 3 {
                0 => (Kind::InstanceJoined, "orders"),
                1 => (Kind::StatusChanged, "payments"),
                _ => (Kind::ZoneRegistered, ""),
            };
            batch.push(entry(10_000 + i, kind, cluster, &format!("i{}", i % 2)));
        }
        a.append(&batch, 20_000, |_, _| {}).unwrap();
        // By cluster: ids 1, 4, 7, ... are orders.
        let q = Query {
            cluster: Some("orders".into()),
            limit: 3,
            ..Query::default()
        };
        assert_eq!(ids(&db.query(&q).unwrap().rows), vec![298, 295, 292]);
        // With an instance filter on top (i0: even offsets).
        let q = Query {
            instance: Some("i0".into()),
            ..q
        };
        assert_eq!(ids(&db.query(&q).unwrap().rows), vec![295, 289, 283]);
        // Two kinds merged newest first.
        let q = Query {
            kinds: vec![Kind::ZoneRegistered, Kind::StatusChanged],
            limit: 4,
            ..Query::default()
        };
        assert_eq!(ids(&db.query(&q).unwrap().rows), vec![300, 299, 297, 296]);
        // since inclusive, until exclusive.
        let q = Query {
            since: Some(10_010),
            until: Some(10_013),
            limit: 100,
            ..Query::default()
        };
        assert_eq!(ids(&db.query(&q).unwrap().rows), vec![13, 12, 11]);
        let q = Query {
            cluster: Some("payments".into()),
            since: Some(10_010),
            until: Some(10_020),
            limit: 100,
            ..Query::default()
        };
        assert_eq!(ids(&db.query(&q).unwrap().rows), vec![20, 17, 14, 11]);
        // Nothing in an empty range or for an unknown cluster.
        let q = Query {
            since: Some(10_013),
            until: Some(10_013),
            limit: 100,
            ..Query::default()
        };
        assert!(db.query(&q).unwrap().rows.is_empty());
        let q = Query {
            cluster: Some("nobody".into()),
            limit: 100,
            ..Query::default()
        };
        assert!(db.query(&q).unwrap().rows.is_empty());
        assert_eq!(
            db.query(&all(1)).unwrap().rows[0].stored().kind,
            Kind::ZoneRegistered
        );
    }

    #[test]
    fn retention_drops_the_oldest_first_by_count_and_by_age() {
        let dir = tempfile::tempdir().unwrap();
        let db = HistoryDb::open(dir.path(), DB_FILE).unwrap();
        let mut a = db
            .appender(Retention {
                max_age: Duration::from_secs(60),
                max_entries: 10,
                max_bytes: u64::MAX,
            })
            .unwrap();
        let batch: Vec<Pending> = (0..25)
            .map(|i| entry(1_000_000 + i, Kind::InstanceJoined, "c", "i"))
            .collect();
        a.append(&batch, 1_000_100, |_, _| {}).unwrap();
        assert_eq!(a.len(), 10);
        assert_eq!(db.len().unwrap(), 10);
        let rows = db.query(&all(100)).unwrap().rows;
        assert_eq!(ids(&rows), (16..=25).rev().collect::<Vec<_>>());
        // The index lost the evicted ids too.
        let by_cluster = Query {
            cluster: Some("c".into()),
            limit: 100,
            ..Query::default()
        };
        assert_eq!(db.query(&by_cluster).unwrap().rows, rows);
        // 60 s after the entry at 1_000_020 (id 21), everything before it is too old.
        assert_eq!(a.expire(1_060_020).unwrap(), 5);
        assert_eq!(ids(&db.query(&all(100)).unwrap().rows).last(), Some(&21));
        assert_eq!(a.expire(2_000_000).unwrap(), 5);
        assert!(db.is_empty().unwrap());
        // Ids keep growing when retention emptied the log, after a reopening too.
        drop(a);
        let mut a = db.appender(KEEP_ALL).unwrap();
        let mut seen = Vec::new();
        a.append(
            &[entry(3_000_000, Kind::InstanceJoined, "c", "i")],
            3_000_000,
            |id, _| seen.push(id),
        )
        .unwrap();
        assert_eq!(seen, vec![26]);
    }

    /// A clock stepped back by more than [`RAISE`] (within a run of the process or
    /// across a restart) gives the entry its own time, not the newest one's: later
    /// entries are not pinned to the old time, and time bounds find them.
    #[test]
    fn a_clock_that_steps_back_starts_a_run_and_time_bounds_still_hold() {
        let dir = tempfile::tempdir().unwrap();
        let mut seen = Vec::new();
        {
            let db = HistoryDb::open(dir.path(), DB_FILE).unwrap();
            let mut a = db.appender(KEEP_ALL).unwrap();
            let batch = [
                entry(10_000, Kind::InstanceJoined, "c", "i"),
                entry(10_001, Kind::InstanceJoined, "c", "i"),
                entry(10_002, Kind::StatusChanged, "c", "i"),
                // Five seconds back: its own time.
                entry(5_000, Kind::InstanceJoined, "c", "i"),
                entry(5_001, Kind::InstanceJoined, "d", "i"),
                // Within a second of the one before: raised to it.
                entry(4_500, Kind::StatusChanged, "c", "i"),
            ];
            a.append(&batch, 20_000, |id, s| seen.push((id, s.at_ms)))
                .unwrap();
        }
        let db = HistoryDb::open(dir.path(), DB_FILE).unwrap();
        let mut a = db.appender(KEEP_ALL).unwrap();
        // The previous run's clock was ahead: the first entry after the restart
        // keeps its time too.
        a.append(
            &[entry(100, Kind::InstanceLeft, "c", "i")],
            20_000,
            |id, s| {
                seen.push((id, s.at_ms));
            },
        )
        .unwrap();
        assert_eq!(
            seen,
            [
                (1, 10_000),
                (2, 10_001),
                (3, 10_002),
                (4, 5_000),
                (5, 5_001),
                (6, 5_001),
                (7, 100)
            ]
        );
        let q = |since: Option<i64>, until: Option<i64>| Query {
            since,
            until,
            limit: 100,
            ..Query::default()
        };
        let found = |q: Query| ids(&db.query(&q).unwrap().rows);
        // Newest first is by id, the order they were recorded in.
        assert_eq!(found(q(Some(5_000), None)), [6, 5, 4, 3, 2, 1]);
        assert_eq!(found(q(None, Some(5_001))), [7, 4]);
        assert_eq!(found(q(Some(5_001), Some(10_001))), [6, 5, 1]);
        assert_eq!(found(q(Some(0), Some(1_000))), [7]);
        // The same through the indexes.
        let by_cluster = Query {
            cluster: Some("c".into()),
            ..q(Some(5_000), Some(10_001))
        };
        assert_eq!(found(by_cluster), [6, 4, 1]);
        let by_kind = Query {
            kinds: vec![Kind::StatusChanged, Kind::InstanceLeft],
            ..q(Some(101), None)
        };
        assert_eq!(found(by_kind), [6, 3]);
    }

    /// Age retention goes from the oldest id while entries are older than the
    /// cutoff; a run stamped later than the ones after it holds them until it is
    /// due itself.
    #[test]
    fn age_retention_goes_through_runs_in_id_order() {
        let dir = tempfile::tempdir().unwrap();
        let db = HistoryDb::open(dir.path(), DB_FILE).unwrap();
        let mut a = db
            .appender(Retention {
                max_age: Duration::from_secs(60),
                max_entries: 1_000_000,
                max_bytes: u64::MAX,
            })
            .unwrap();
        let batch: Vec<Pending> = [100_000, 100_001, 100_002, 50_000, 50_001, 50_002]
            .into_iter()
            .map(|at| entry(at, Kind::InstanceJoined, "c", "i"))
            .collect();
        a.append(&batch, 100_002, |_, _| {}).unwrap();
        assert_eq!(a.expire(155_000).unwrap(), 0);
        // The cutoff 100_002 passes the first two.
        assert_eq!(a.expire(160_002).unwrap(), 2);
        assert_eq!(ids(&db.query(&all(100)).unwrap().rows), [6, 5, 4, 3]);
        assert_eq!(
            ids(&db
                .query(&Query {
                    until: Some(60_000),
                    limit: 100,
                    ..Query::default()
                })
                .unwrap()
                .rows),
            [6, 5, 4]
        );
        // Past the first run, the second goes as far as it is old.
        assert_eq!(a.expire(110_001).unwrap(), 0);
        assert_eq!(a.expire(200_000).unwrap(), 4);
        assert!(db.is_empty().unwrap());
        a.append(
            &[entry(300_000, Kind::InstanceJoined, "c", "i")],
            300_000,
            |_, _| {},
        )
        .unwrap();
        assert_eq!(ids(&db.query(&all(100)).unwrap().rows), [7]);
    }

    /// A query stops after its budget of examined entries, at the end of a
    /// millisecond, and says where: asking again with `until` there goes on without
    /// missing or repeating an entry. Through the indexes a query examines the
    /// entries of its names' keys: here two zone names that share one.
    #[test]
    fn a_query_examines_at_most_its_budget_and_says_where_it_stopped() {
        let (common, rare) = ("zone-579599", "zone-762382");
        assert_eq!(
            crate::history::entry::cluster_key(common),
            crate::history::entry::cluster_key(rare)
        );
        let dir = tempfile::tempdir().unwrap();
        let db = HistoryDb::open(dir.path(), DB_FILE).unwrap();
        let mut a = db.appender(KEEP_ALL).unwrap();
        // Two entries a millisecond; the zone `rare` has the first three only.
        let batch: Vec<Pending> = (0..1000)
            .map(|i| {
                let mut p = entry(10_000 + i / 2, Kind::InstanceJoined, "c", "i");
                p.zone = if i < 3 { rare } else { common }.into();
                p
            })
            .collect();
        a.append(&batch, 20_000, |_, _| {}).unwrap();
        let rare = Query {
            zone: Some(rare.into()),
            limit: 10,
            ..Query::default()
        };
        // Within the default budget: all of them.
        let whole = db.query(&rare).unwrap();
        assert_eq!((ids(&whole.rows), whole.incomplete), (vec![3, 2, 1], None));
        // 101 examined end at id 900 (10_449), whose millisecond holds id 899 too.
        let first = db.query_within(&rare, 101).unwrap();
        assert_eq!((first.rows.len(), first.incomplete), (0, Some(10_449)));
        // Page by page with `until`: every entry once.
        let (mut got, mut pages, mut until) = (Vec::new(), 0, None);
        loop {
            let page = db
                .query_within(
                    &Query {
                        until,
                        ..rare.clone()
                    },
                    101,
                )
                .unwrap();
            pages += 1;
            got.extend(ids(&page.rows));
            match page.incomplete {
                Some(at) => until = Some(at),
                None => break,
            }
        }
        assert_eq!((got, pages), (vec![3, 2, 1], 10));
        // A full answer within the budget is complete.
        let newest = db.query_within(&all(5), 5).unwrap();
        assert_eq!((newest.rows.len(), newest.incomplete), (5, None));
        // An instance no entry names examines nothing, whatever the kind's count.
        let by_kind = Query {
            kinds: vec![Kind::InstanceJoined],
            instance: Some("nobody".into()),
            limit: 10,
            ..Query::default()
        };
        let found = db.query_within(&by_kind, 10).unwrap();
        assert_eq!((found.rows.len(), found.incomplete), (0, None));
        // A zone of a key of its own: its entries alone, within a budget of three.
        let mut a = a;
        let batch: Vec<Pending> = (0..3)
            .map(|i| {
                let mut p = entry(20_000 + i, Kind::InstanceLeft, "c", "i");
                p.zone = "alone".into();
                p
            })
            .collect();
        a.append(&batch, 30_000, |_, _| {}).unwrap();
        let alone = Query {
            zone: Some("alone".into()),
            limit: 10,
            ..Query::default()
        };
        let found = db.query_within(&alone, 3).unwrap();
        assert_eq!(
            (ids(&found.rows), found.incomplete),
            (vec![1003, 1002, 1001], None)
        );
    }

    /// Past `max_bytes` the oldest entries go until the rest fits, whatever the
    /// count bound allows; the count survives a reopening, and the file stops
    /// growing once the bound is reached.
    #[test]
    fn the_byte_bound_drops_the_oldest_first_and_bounds_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let db = HistoryDb::open(dir.path(), DB_FILE).unwrap();
        let big = |i: i64| Pending {
            detail: Detail::Config {
                from: "f".repeat(400),
                to: format!("{i:0400}"),
                resources: vec!["routes".into()],
            },
            ..entry(1_000 + i, Kind::ConfigChanged, "c", "i")
        };
        let mut sizes = Vec::new();
        let mut a = db
            .appender(Retention {
                max_bytes: 1 << 20,
                ..KEEP_ALL
            })
            .unwrap();
        let file = || std::fs::metadata(dir.path().join(DB_FILE)).unwrap().len();
        let mut last = 0;
        for round in 0..40 {
            let batch: Vec<Pending> = (0..250).map(|i| big(round * 250 + i)).collect();
            a.append(&batch, 100_000, |id, _| last = id).unwrap();
            assert!(a.bytes() <= 1 << 20, "{} bytes held", a.bytes());
            sizes.push(file());
        }
        // About 900 bytes an entry: some 1,150 fit in 1 MiB, the newest.
        let held = a.len();
        assert!((1_000..1_300).contains(&held), "{held} held");
        assert_eq!(db.len().unwrap(), held);
        let rows = db.query(&all(5000)).unwrap().rows;
        assert_eq!(rows.len() as u64, held);
        assert_eq!(rows[0].id, last);
        assert_eq!(rows.last().unwrap().id, last - held + 1, "the oldest went");
        let counted: u64 = rows.iter().map(|r| entry_bytes(&r.bytes)).sum();
        assert_eq!(counted, a.bytes());
        // The index lost them too.
        let by_kind = Query {
            kinds: vec![Kind::ConfigChanged],
            limit: 5000,
            ..Query::default()
        };
        assert_eq!(db.query(&by_kind).unwrap().rows.len() as u64, held);
        // Once full, the file takes no more room (freed pages are reused).
        assert_eq!(sizes[39], sizes[20], "{sizes:?}");
        assert!(sizes[39] < 16 << 20, "{sizes:?}");
        let bytes = a.bytes();
        drop(a);
        let a = db.appender(KEEP_ALL).unwrap();
        assert_eq!(a.bytes(), bytes, "kept in the log");
    }

    /// A backlog (a lowered limit, a long downtime) goes in commits of at most
    /// [`MAX_EVICT`], and the appender says while more is due.
    #[test]
    fn a_backlog_is_evicted_in_short_commits() {
        let dir = tempfile::tempdir().unwrap();
        let db = HistoryDb::open(dir.path(), DB_FILE).unwrap();
        {
            let mut a = db.appender(KEEP_ALL).unwrap();
            let batch: Vec<Pending> = (0..25_000)
                .map(|i| entry(1_000 + i, Kind::InstanceJoined, "c", "i"))
                .collect();
            for chunk in batch.chunks(8192) {
                a.append(chunk, 30_000, |_, _| {}).unwrap();
            }
            assert!(!a.behind());
        }
        let mut a = db
            .appender(Retention {
                max_age: Duration::from_secs(3600),
                max_entries: 100,
                max_bytes: u64::MAX,
            })
            .unwrap();
        assert!(a.behind(), "retention runs once at start");
        let mut gone = Vec::new();
        while a.behind() {
            gone.push(a.expire(30_000).unwrap());
        }
        assert_eq!(gone, [MAX_EVICT, MAX_EVICT, 4_900]);
        assert_eq!((a.len(), db.len().unwrap()), (100, 100));
        // The index lost them too.
        let by_cluster = Query {
            cluster: Some("c".into()),
            limit: 1000,
            ..Query::default()
        };
        assert_eq!(db.query(&by_cluster).unwrap().rows.len(), 100);
    }

    /// The posting lists' segments whose entries all went are removed with them.
    #[test]
    fn retention_removes_the_segments_of_the_entries_it_drops() {
        let dir = tempfile::tempdir().unwrap();
        let db = HistoryDb::open(dir.path(), DB_FILE).unwrap();
        let mut a = db
            .appender(Retention {
                max_entries: 100,
                ..KEEP_ALL
            })
            .unwrap();
        for round in 0..10 {
            let batch: Vec<Pending> = (0..1000)
                .map(|i| entry(1_000 + round * 1000 + i, Kind::InstanceJoined, "c", "i"))
                .collect();
            a.append(&batch, 30_000, |_, _| {}).unwrap();
        }
        assert_eq!(a.len(), 100);
        let oldest = index::segment_of(10_001 - 100);
        let tx = db.file.read(Database::begin_read).unwrap().unwrap();
        let postings = tx.open_table(POSTINGS).unwrap();
        let segments: Vec<u32> = postings
            .iter()
            .unwrap()
            .map(|r| r.unwrap().0.value().0)
            .collect();
        assert!(segments.iter().all(|s| *s >= oldest), "{segments:?}");
        // Six lists (the kind, the zone and the cluster alone and by kind, the
        // instance) over at most two segments, in a few blocks each.
        assert!(segments.len() <= 24, "{segments:?}");
        drop((postings, tx));
        let q = Query {
            instance: Some("i".into()),
            limit: 1000,
            ..Query::default()
        };
        assert_eq!(db.query(&q).unwrap().rows.len(), 100);
    }

    /// Every filter and combination answers what a walk over every entry with the
    /// query's own check answers, across many blocks, several runs of the clock
    /// and retention.
    #[test]
    fn every_filter_answers_what_a_walk_over_every_entry_answers() {
        let dir = tempfile::tempdir().unwrap();
        let db = HistoryDb::open(dir.path(), DB_FILE).unwrap();
        let mut a = db
            .appender(Retention {
                max_entries: 9_000,
                ..KEEP_ALL
            })
            .unwrap();
        let mut rng = crate::TestRng(0x2545_f491_4f6c_dd1d);
        let zones = ["z0", "z1", "z2", "rare-zone", ""];
        let clusters = ["c0", "c1", "c2", "c3", "c4", "rare-cluster", ""];
        let kinds = [
            Kind::InstanceJoined,
            Kind::InstanceLeft,
            Kind::StatusChanged,
            Kind::ConfigChanged,
            Kind::ZoneRegistered,
        ];
        let instances: Vec<String> = (0..60).map(|i| format!("pod-{i}")).collect();
        let pick = |rng: &mut crate::TestRng, n: usize| rng.below(n as u64) as usize;
        let mut at = 1_000_000i64;
        for _ in 0..80 {
            let size = 1 + rng.below(400) as usize;
            let batch: Vec<Pending> = (0..size)
                .map(|_| {
                    // Now and then the clock steps back by more than RAISE.
                    at += if rng.below(500) == 0 {
                        -5_000
                    } else {
                        rng.below(3) as i64
                    };
                    let rare = rng.below(2_000) == 0;
                    Pending {
                        at_ms: at,
                        kind: kinds[pick(&mut rng, kinds.len())],
                        zone: (if rare {
                            "rare-zone"
                        } else {
                            zones[pick(&mut rng, 3)]
                        })
                        .into(),
                        cluster: clusters[pick(&mut rng, clusters.len())].into(),
                        instance: if rng.below(4) == 0 {
                            String::new()
                        } else {
                            instances[pick(&mut rng, instances.len())].clone()
                        },
                        detail: Detail::Nothing {},
                    }
                })
                .collect();
            a.append(&batch, at, |_, _| {}).unwrap();
        }
        let every = db.query(&all(usize::MAX)).unwrap().rows;
        assert_eq!(every.len(), 9_000);
        let (oldest, newest) = (
            every.last().unwrap().stored().at_ms,
            every[0].stored().at_ms,
        );
        for _ in 0..2_000 {
            let name = |rng: &mut crate::TestRng, names: &[&str]| {
                (rng.below(2) == 0).then(|| names[pick(rng, names.len())].to_owned())
            };
            let mut q = Query {
                zone: name(&mut rng, &zones),
                cluster: name(&mut rng, &clusters),
                instance: (rng.below(3) == 0)
                    .then(|| instances[pick(&mut rng, instances.len())].clone()),
                kinds: (0..rng.below(3))
                    .map(|_| kinds[pick(&mut rng, kinds.len())])
                    .collect(),
                since: None,
                until: None,
                limit: 1 + pick(&mut rng, 60),
            };
            let span = (newest - oldest + 1) as u64;
            if rng.below(3) == 0 {
                q.since = Some(oldest + rng.below(span) as i64);
            }
            if rng.below(3) == 0 {
                q.until = Some(oldest + rng.below(span) as i64);
            }
            let expected: Vec<u64> = every
                .iter()
                .filter(|r| {
                    let s = r.stored();
                    q.admits(&s)
                        && q.since.is_none_or(|t| s.at_ms >= t)
                        && q.until.is_none_or(|t| s.at_ms < t)
                })
                .take(q.limit)
                .map(|r| r.id)
                .collect();
            let found = db.query(&q).unwrap();
            assert_eq!(ids(&found.rows), expected, "{q:?}");
            assert_eq!(found.incomplete, None);
        }
    }

    /// A log written with the earlier indexes (one table by cluster, one by kind)
    /// has its posting lists built when it is opened, and the earlier tables go.
    #[test]
    fn a_log_from_before_the_posting_lists_is_indexed_when_opened() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = Database::create(dir.path().join(DB_FILE)).unwrap();
            let tx = db.begin_write().unwrap();
            {
                let mut entries = tx.open_table(ENTRIES).unwrap();
                let mut by_cluster = tx.open_table(OLD_BY_CLUSTER).unwrap();
                let mut by_kind = tx.open_table(OLD_BY_KIND).unwrap();
                for id in 1..=1000u64 {
                    let zone = format!("z{}", id % 4);
                    let cluster = format!("c{}", id % 10);
                    let mut bytes = Vec::new();
                    Stored {
                        at_ms: 5_000 + id as i64,
                        kind: Kind::InstanceJoined,
                        zone: &zone,
                        cluster: &cluster,
                        instance: "i",
                        detail: b"{}",
                    }
                    .encode(&mut bytes);
                    entries.insert(id, bytes.as_slice()).unwrap();
                    by_cluster
                        .insert((crate::history::entry::cluster_key(&cluster), id), ())
                        .unwrap();
                    by_kind
                        .insert((Kind::InstanceJoined.code(), id), ())
                        .unwrap();
                }
                let mut meta = tx.open_table(META).unwrap();
                meta.insert(NEXT_ID, 1001).unwrap();
            }
            tx.commit().unwrap();
        }
        let db = HistoryDb::open(dir.path(), DB_FILE).unwrap();
        let q = Query {
            zone: Some("z1".into()),
            cluster: Some("c5".into()),
            limit: 3,
            ..Query::default()
        };
        assert_eq!(ids(&db.query(&q).unwrap().rows), vec![985, 965, 945]);
        let tx = db.file.read(Database::begin_read).unwrap().unwrap();
        let tables: Vec<String> = tx
            .list_tables()
            .unwrap()
            .map(|t| redb::TableHandle::name(&t).to_owned())
            .collect();
        assert!(!tables.iter().any(|t| t.starts_with("by_")), "{tables:?}");
        assert_eq!(
            tx.open_table(META)
                .unwrap()
                .get(INDEXED)
                .unwrap()
                .unwrap()
                .value(),
            INDEXED_ALL
        );
        drop(tx);
        // Appended later, indexed as they come.
        let mut a = db.appender(KEEP_ALL).unwrap();
        a.append(
            &[entry(9_000, Kind::InstanceLeft, "c5", "i")],
            9_000,
            |_, _| {},
        )
        .unwrap();
        let q = Query {
            cluster: Some("c5".into()),
            limit: 2,
            ..Query::default()
        };
        assert_eq!(ids(&db.query(&q).unwrap().rows), vec![1001, 995]);
    }
}
