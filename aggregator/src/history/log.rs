//! The durable log: `<data-dir>/history.redb`, apart from the catalog's database so
//! that its appends and evictions never share a transaction (or an fsync) with a
//! registration. Four tables:
//!
//! - `entries`: id -> the entry's stored form ([`Stored`]). Ids are consecutive:
//!   retention removes a prefix and appends add at the end, so the ids held are
//!   exactly `first..next`, and times never go down along them (the appender
//!   clamps), so a time bound is found by bisecting ids.
//! - `by_cluster`: (key of the cluster name, id), for a cluster's entries without a
//!   scan; `by_kind`: (kind, id), the same for kinds. Both are fixed-width keys with
//!   no value: 12 and 9 bytes an entry.
//! - `meta`: the next id, so ids keep growing across restarts even when retention
//!   emptied the log.
//!
//! One [`Appender`] writes (the history's writer thread); any number of readers
//! query at once, each in its own read transaction.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use super::entry::{Kind, Pending, Stored, cluster_key};

const ENTRIES: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("entries");
const BY_CLUSTER: TableDefinition<'_, (u32, u64), ()> = TableDefinition::new("by_cluster");
const BY_KIND: TableDefinition<'_, (u8, u64), ()> = TableDefinition::new("by_kind");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
const NEXT_ID: &str = "next_id";

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
/// up over several commits, each short.
pub const MAX_EVICT: u64 = 100_000;

/// A failure of the history's database.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("cannot create data directory {path}: {error}")]
    Dir { path: String, error: std::io::Error },
    #[error("history storage error: {0}")]
    Db(#[from] redb::Error),
    #[error("cannot start the history writer: {0}")]
    Writer(std::io::Error),
}

crate::from_redb_errors!(HistoryError);

/// How long and how much the log keeps (`--history-retention`,
/// `--history-max-entries`); the oldest entries go first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub max_age: Duration,
    pub max_entries: u64,
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

/// The history's database, shared by the writer and the readers.
#[derive(Debug, Clone)]
pub struct HistoryDb {
    db: Arc<Database>,
}

impl HistoryDb {
    /// Opens (or creates) the history `file` in `dir`.
    pub fn open(dir: &Path, file: &str) -> Result<HistoryDb, HistoryError> {
        std::fs::create_dir_all(dir).map_err(|error| HistoryError::Dir {
            path: dir.display().to_string(),
            error,
        })?;
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(dir.join(file))?;
        // Tables exist from the first start on, so reads never meet a missing table.
        let tx = db.begin_write()?;
        tx.open_table(ENTRIES)?;
        tx.open_table(BY_CLUSTER)?;
        tx.open_table(BY_KIND)?;
        tx.open_table(META)?;
        tx.commit()?;
        Ok(HistoryDb { db: Arc::new(db) })
    }

    /// The one writer of this database.
    pub fn appender(&self, retention: Retention) -> Result<Appender, HistoryError> {
        let tx = self.db.begin_read()?;
        let entries = tx.open_table(ENTRIES)?;
        let meta = tx.open_table(META)?;
        let (first, next) = bounds(&entries, &meta)?;
        let last_at = match entries.last()? {
            Some((_, v)) => Stored::decode(v.value()).map_or(0, |s| s.at_ms),
            None => 0,
        };
        Ok(Appender {
            db: self.db.clone(),
            first,
            next,
            last_at,
            retention,
            buf: Vec::with_capacity(256),
        })
    }

    /// Entries held.
    pub fn len(&self) -> Result<u64, HistoryError> {
        let tx = self.db.begin_read()?;
        Ok(tx.open_table(ENTRIES)?.len()?)
    }

    pub fn is_empty(&self) -> Result<bool, HistoryError> {
        Ok(self.len()? == 0)
    }

    /// The newest entries that `q` admits, newest first, at most `q.limit`. A
    /// cluster is read through its index, kinds through theirs (merged), anything
    /// else from the newest entry back; time bounds narrow every source first.
    pub fn query(&self, q: &Query) -> Result<Vec<Row>, HistoryError> {
        let mut out = Vec::with_capacity(q.limit.min(1024));
        if q.limit == 0 {
            return Ok(out);
        }
        let tx = self.db.begin_read()?;
        let entries = tx.open_table(ENTRIES)?;
        let meta = tx.open_table(META)?;
        let (first, next) = bounds(&entries, &meta)?;
        let lo = match q.since {
            Some(t) => first_at_or_after(&entries, first, next, t)?,
            None => first,
        };
        let hi = match q.until {
            Some(t) => first_at_or_after(&entries, lo, next, t)?,
            None => next,
        };
        if lo >= hi {
            return Ok(out);
        }
        // Takes the entry `id` when `q` admits it; says whether the answer is full.
        let mut take = |id: u64, bytes: &[u8]| {
            if Stored::decode(bytes).is_some_and(|s| q.admits(&s)) {
                out.push(Row {
                    id,
                    bytes: bytes.to_vec(),
                });
            }
            out.len() >= q.limit
        };
        if let Some(cluster) = &q.cluster {
            let index = tx.open_table(BY_CLUSTER)?;
            let k = cluster_key(cluster);
            for key in index.range((k, lo)..(k, hi))?.rev() {
                let id = key?.0.value().1;
                if let Some(v) = entries.get(id)?
                    && take(id, v.value())
                {
                    break;
                }
            }
        } else if !q.kinds.is_empty() {
            let index = tx.open_table(BY_KIND)?;
            let mut kinds = q.kinds.clone();
            kinds.sort();
            kinds.dedup();
            let mut sources = kinds
                .iter()
                .map(|k| {
                    Ok(index
                        .range((k.code(), lo)..(k.code(), hi))?
                        .rev()
                        .map(|r| r.map(|(k, _)| k.value().1))
                        .peekable())
                })
                .collect::<Result<Vec<_>, HistoryError>>()?;
            // Newest first across the kinds: the largest id at the head of any.
            loop {
                let mut best: Option<(usize, u64)> = None;
                for (n, s) in sources.iter_mut().enumerate() {
                    let head = match s.peek() {
                        Some(Ok(id)) => *id,
                        Some(Err(_)) => return Err(s.next().expect("peeked").unwrap_err().into()),
                        None => continue,
                    };
                    if best.is_none_or(|(_, id)| head > id) {
                        best = Some((n, head));
                    }
                }
                let Some((n, id)) = best else { break };
                sources[n].next();
                if let Some(v) = entries.get(id)?
                    && take(id, v.value())
                {
                    break;
                }
            }
        } else {
            for row in entries.range(lo..hi)?.rev() {
                let (k, v) = row?;
                if take(k.value(), v.value()) {
                    break;
                }
            }
        }
        Ok(out)
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

/// The first id in `lo..hi` whose entry is at `at` or later (`hi` when none).
fn first_at_or_after(
    entries: &impl ReadableTable<u64, &'static [u8]>,
    mut lo: u64,
    mut hi: u64,
    at: i64,
) -> Result<u64, HistoryError> {
    let next = hi;
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
    db: Arc<Database>,
    /// The oldest id held.
    first: u64,
    /// The id the next entry takes.
    next: u64,
    /// The time of the newest entry: a later entry never goes before it.
    last_at: i64,
    retention: Retention,
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

    /// Stores `batch` in order with consecutive ids, evicts what retention drops
    /// (at `now_ms`), and commits durably before returning. `stored` sees each entry
    /// as stored, with its id, once the commit succeeded. Entries whose time is
    /// before the newest stored one take its time: ids and times go up together.
    pub fn append(
        &mut self,
        batch: &[Pending],
        now_ms: i64,
        mut stored: impl FnMut(u64, Stored<'_>),
    ) -> Result<(), HistoryError> {
        let tx = self.db.begin_write()?;
        let mut encoded: Vec<(u64, usize, usize)> = Vec::with_capacity(batch.len());
        let mut arena: Vec<u8> = Vec::with_capacity(batch.len() * 96);
        let (mut next, mut last_at) = (self.next, self.last_at);
        {
            let mut entries = tx.open_table(ENTRIES)?;
            let mut by_cluster = tx.open_table(BY_CLUSTER)?;
            let mut by_kind = tx.open_table(BY_KIND)?;
            for p in batch {
                let at_ms = p.at_ms.max(last_at);
                last_at = at_ms;
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
                let id = next;
                next += 1;
                entries.insert(id, &arena[start..])?;
                by_kind.insert((p.kind.code(), id), ())?;
                if !p.cluster.is_empty() {
                    by_cluster.insert((cluster_key(&p.cluster), id), ())?;
                }
                encoded.push((id, start, arena.len()));
            }
            tx.open_table(META)?.insert(NEXT_ID, next)?;
        }
        let first = self.evict_in(&tx, self.first, next, now_ms)?;
        tx.commit()?;
        (self.first, self.next, self.last_at) = (first, next, last_at);
        for (id, start, end) in encoded {
            stored(
                id,
                Stored::decode(&arena[start..end]).expect("encoded just now"),
            );
        }
        Ok(())
    }

    /// Applies retention alone (no entry to add): age moves on while nothing
    /// happens. Returns how many entries went.
    pub fn expire(&mut self, now_ms: i64) -> Result<u64, HistoryError> {
        let tx = self.db.begin_write()?;
        let first = self.evict_in(&tx, self.first, self.next, now_ms)?;
        if first == self.first {
            tx.abort()?;
            return Ok(0);
        }
        tx.commit()?;
        let gone = first - self.first;
        self.first = first;
        Ok(gone)
    }

    /// Removes the oldest entries past either bound, at most [`MAX_EVICT`], with
    /// their index keys; returns the new first id.
    fn evict_in(
        &self,
        tx: &redb::WriteTransaction,
        first: u64,
        next: u64,
        now_ms: i64,
    ) -> Result<u64, HistoryError> {
        let mut entries = tx.open_table(ENTRIES)?;
        let held = next - first;
        let mut to = first;
        if held > self.retention.max_entries {
            to = next - self.retention.max_entries;
        }
        let max_age = i64::try_from(self.retention.max_age.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms.saturating_sub(max_age);
        if at_of(&entries, to, next)? < cutoff {
            to = first_at_or_after(&entries, to, next, cutoff)?;
        }
        let to = to.min(first + MAX_EVICT);
        if to <= first {
            return Ok(first);
        }
        let mut by_cluster = tx.open_table(BY_CLUSTER)?;
        let mut by_kind = tx.open_table(BY_KIND)?;
        let mut doomed: Vec<(u64, Option<u32>, u8)> = Vec::with_capacity((to - first) as usize);
        for row in entries.range(first..to)? {
            let (k, v) = row?;
            if let Some(s) = Stored::decode(v.value()) {
                let cluster = (!s.cluster.is_empty()).then(|| cluster_key(s.cluster));
                doomed.push((k.value(), cluster, s.kind.code()));
            }
        }
        for (id, cluster, kind) in doomed {
            by_kind.remove((kind, id))?;
            if let Some(c) = cluster {
                by_cluster.remove((c, id))?;
            }
        }
        entries.retain_in(first..to, |_, _| false)?;
        Ok(to)
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
        // An entry from before the newest takes the newest's time.
        a.append(&[entry(10, Kind::InstanceLeft, "c", "i")], 2000, |id, s| {
            assert_eq!((id, s.at_ms), (6, 1004));
        })
        .unwrap();
        assert_eq!(ids(&db.query(&all(3)).unwrap()), vec![6, 5, 4]);
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
        assert_eq!(ids(&db.query(&q).unwrap()), vec![298, 295, 292]);
        // With an instance filter on top (i0: even offsets).
        let q = Query {
            instance: Some("i0".into()),
            ..q
        };
        assert_eq!(ids(&db.query(&q).unwrap()), vec![295, 289, 283]);
        // Two kinds merged newest first.
        let q = Query {
            kinds: vec![Kind::ZoneRegistered, Kind::StatusChanged],
            limit: 4,
            ..Query::default()
        };
        assert_eq!(ids(&db.query(&q).unwrap()), vec![300, 299, 297, 296]);
        // since inclusive, until exclusive.
        let q = Query {
            since: Some(10_010),
            until: Some(10_013),
            limit: 100,
            ..Query::default()
        };
        assert_eq!(ids(&db.query(&q).unwrap()), vec![13, 12, 11]);
        let q = Query {
            cluster: Some("payments".into()),
            since: Some(10_010),
            until: Some(10_020),
            limit: 100,
            ..Query::default()
        };
        assert_eq!(ids(&db.query(&q).unwrap()), vec![20, 17, 14, 11]);
        // Nothing in an empty range or for an unknown cluster.
        let q = Query {
            since: Some(10_013),
            until: Some(10_013),
            limit: 100,
            ..Query::default()
        };
        assert!(db.query(&q).unwrap().is_empty());
        let q = Query {
            cluster: Some("nobody".into()),
            limit: 100,
            ..Query::default()
        };
        assert!(db.query(&q).unwrap().is_empty());
        assert_eq!(
            db.query(&all(1)).unwrap()[0].stored().kind,
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
            })
            .unwrap();
        let batch: Vec<Pending> = (0..25)
            .map(|i| entry(1_000_000 + i, Kind::InstanceJoined, "c", "i"))
            .collect();
        a.append(&batch, 1_000_100, |_, _| {}).unwrap();
        assert_eq!(a.len(), 10);
        assert_eq!(db.len().unwrap(), 10);
        let rows = db.query(&all(100)).unwrap();
        assert_eq!(ids(&rows), (16..=25).rev().collect::<Vec<_>>());
        // The index lost the evicted ids too.
        let by_cluster = Query {
            cluster: Some("c".into()),
            limit: 100,
            ..Query::default()
        };
        assert_eq!(db.query(&by_cluster).unwrap(), rows);
        // 60 s after the entry at 1_000_020 (id 21), everything before it is too old.
        assert_eq!(a.expire(1_060_020).unwrap(), 5);
        assert_eq!(ids(&db.query(&all(100)).unwrap()).last(), Some(&21));
        assert_eq!(a.expire(2_000_000).unwrap(), 5);
        assert!(db.is_empty().unwrap());
        // Ids keep growing when retention emptied the log, after a reopening too.
        drop(a);
        let mut a = db.appender(KEEP_ALL).unwrap();
        a.append(
            &[entry(3_000_000, Kind::InstanceJoined, "c", "i")],
            3_000_000,
            |id, _| {
                assert_eq!(id, 26);
            },
        )
        .unwrap();
    }
}
