//! The redb backend of registrations: zones and clusters in one database file under
//! `--data-dir`. Every batch commits with immediate durability before its writers are
//! answered, so a `kill -9` after a 2xx loses nothing. On a full disk the file refuses
//! writes, reopens itself and heals once space returns ([`RedbFile`]).

use std::path::Path;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex, mpsc};

use meshcat_common::model::{ClusterRecord, ZoneRecord};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::redb_file::{RETRY, RedbFile, Refused, Unwritable};

use super::registrations::{Committed, Done, Loaded, Outcome, Refusal, Registrations, Write};

/// Zones by zoneName; values are the JSON of the record.
const ZONES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("zones");
/// Clusters by `zoneName/clusterName` (`/` cannot occur in a name); values are JSON.
const CLUSTERS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("clusters");

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "catalog.redb";

/// A failure of the embedded store.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("cannot create data directory {path}: {error}")]
    Dir { path: String, error: std::io::Error },
    #[error("storage error: {0}")]
    Db(#[from] redb::Error),
    #[error("storage error: {0}")]
    Group(String),
    #[error("stored record {key:?} cannot be decoded: {error}")]
    Decode {
        key: String,
        error: serde_json::Error,
    },
    /// A shared store (etcd) did not answer in time: the write's outcome is unknown.
    #[error("{0}")]
    Unavailable(String),
    /// The store takes no writes (its storage is full, or failed a write) until it
    /// heals; nothing of the batch was written.
    #[error("the registrations cannot be stored: {0}")]
    Unwritable(Unwritable),
}

impl PersistError {
    /// The committer is gone (the store is closing): the batch was not committed.
    pub fn committer_stopped() -> Self {
        PersistError::Group("the committer has stopped".into())
    }
}

impl From<Refused<PersistError>> for PersistError {
    fn from(r: Refused<PersistError>) -> Self {
        match r {
            Refused::Unwritable(u) => PersistError::Unwritable(u),
            Refused::Failed(e) => e,
        }
    }
}

crate::redb_errors::from_redb_errors!(PersistError);

/// The redb backend of [`Registrations`]: one database file. Writers hand their
/// batches to one committer thread, which commits every batch waiting at that moment
/// in one durable transaction (group commit: one fsync for many writers) and answers
/// each writer only after that commit.
#[derive(Debug)]
pub struct RedbRegistrations {
    file: Arc<RedbFile>,
    /// Feeds the committer; the thread ends when this is dropped.
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    /// Joined on drop, so the database is closed when this is gone (a reopening in
    /// the same process must not find it still open).
    committer: Option<std::thread::JoinHandle<()>>,
}

impl Drop for RedbRegistrations {
    fn drop(&mut self) {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = self.committer.take() {
            let _ = t.join();
        }
    }
}

/// One writer's batch and where its outcome goes.
type Job = (Vec<Write>, Done);

/// Most batches committed in one transaction.
const MAX_GROUP: usize = 4096;

fn cluster_key(zone: &str, cluster: &str) -> String {
    format!("{zone}/{cluster}")
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, v: &[u8]) -> Result<T, PersistError> {
    serde_json::from_slice(v).map_err(|error| PersistError::Decode {
        key: key.to_owned(),
        error,
    })
}

impl RedbRegistrations {
    /// Opens (or creates) the database in `dir` and starts its committer.
    pub fn open(dir: &Path) -> Result<RedbRegistrations, PersistError> {
        std::fs::create_dir_all(dir).map_err(|error| PersistError::Dir {
            path: dir.display().to_string(),
            error,
        })?;
        let file = RedbFile::open(dir.join(DB_FILE), None)?;
        // Tables exist from the first start on, so reads never meet a missing table.
        file.write(|db| -> Result<(), PersistError> {
            let tx = db.begin_write()?;
            tx.open_table(ZONES)?;
            tx.open_table(CLUSTERS)?;
            tx.commit()?;
            Ok(())
        })?;
        let file = Arc::new(file);
        let (queue, jobs) = mpsc::channel::<Job>();
        let shared = file.clone();
        let committer = std::thread::Builder::new()
            .name("meshcat-commit".into())
            .spawn(move || commit_loop(&shared, &jobs))
            .map_err(|error| PersistError::Dir {
                path: dir.display().to_string(),
                error,
            })?;
        Ok(RedbRegistrations {
            file,
            queue: Mutex::new(Some(queue)),
            committer: Some(committer),
        })
    }
}

/// Takes every waiting batch, commits them together, answers each writer. While
/// the file refuses writes, it is also healed every [`RETRY`] with nothing to write.
fn commit_loop(file: &RedbFile, jobs: &mpsc::Receiver<Job>) {
    let mut commits = 0u64;
    loop {
        let first = if file.writable() {
            match jobs.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        } else {
            match jobs.recv_timeout(RETRY) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout) => {
                    let _ = file.heal();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        };
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        match file.write(|db| commit_group(db, &group)) {
            Ok(results) => {
                for ((_, reply), result) in group.into_iter().zip(results) {
                    let outcome = match result {
                        Ok(changes) => {
                            commits += 1;
                            Outcome::Committed {
                                seq: commits,
                                changes,
                            }
                        }
                        Err((index, error)) => Outcome::Refused { index, error },
                    };
                    reply(Ok(outcome));
                }
            }
            Err(Refused::Unwritable(cause)) => {
                for (_, reply) in group {
                    reply(Err(PersistError::Unwritable(cause.clone())));
                }
            }
            Err(Refused::Failed(e)) => {
                let why = e.to_string();
                for (_, reply) in group {
                    reply(Err(PersistError::Group(why.clone())));
                }
            }
        }
    }
}

type BatchResult = Result<Vec<Committed>, (usize, Refusal)>;

/// One transaction over the group: each batch checked against the state its
/// predecessors left, applied or refused whole.
fn commit_group(db: &Database, group: &[Job]) -> Result<Vec<BatchResult>, PersistError> {
    let tx = db.begin_write()?;
    let mut results = Vec::with_capacity(group.len());
    {
        let mut zones = tx.open_table(ZONES)?;
        let mut clusters = tx.open_table(CLUSTERS)?;
        for (batch, _) in group {
            results.push(apply_batch(&mut zones, &mut clusters, batch)?);
        }
    }
    if results.iter().any(Result::is_ok) {
        tx.commit()?;
    } else {
        tx.abort()?;
    }
    Ok(results)
}

/// Checks and applies one batch inside an open transaction. Returns the changes, or
/// the refused write; on a refusal nothing of the batch has been written.
fn apply_batch(
    zones: &mut redb::Table<'_, &str, &[u8]>,
    clusters: &mut redb::Table<'_, &str, &[u8]>,
    batch: &[Write],
) -> Result<Result<Vec<Committed>, (usize, Refusal)>, PersistError> {
    // Check every write first, against the stored state plus the batch's own earlier
    // writes, so a refusal leaves the transaction untouched.
    let mut made_zones: Vec<&str> = Vec::new();
    let mut made_clusters: Vec<(&str, &str)> = Vec::new();
    for (index, w) in batch.iter().enumerate() {
        let refusal = match w {
            Write::CreateZone(z) => (zones.get(z.zone_name.as_str())?.is_some()
                || made_zones.contains(&z.zone_name.as_str()))
            .then(|| Refusal::zone_exists(&z.zone_name)),
            Write::ReplaceZone(z) => (zones.get(z.zone_name.as_str())?.is_none()
                && !made_zones.contains(&z.zone_name.as_str()))
            .then(|| Refusal::no_zone(&z.zone_name)),
            Write::DeleteZone(name) => zones
                .get(name.as_str())?
                .is_none()
                .then(|| Refusal::no_zone(name)),
            Write::CreateCluster(c) | Write::ReplaceCluster(c) => {
                let (zone, cluster) = (c.zone_name.as_str(), c.cluster_name.as_str());
                let zone_ok = zones.get(zone)?.is_some() || made_zones.contains(&zone);
                let exists = clusters.get(cluster_key(zone, cluster).as_str())?.is_some()
                    || made_clusters.contains(&(zone, cluster));
                if !zone_ok {
                    Some(Refusal::cluster_needs_zone(zone))
                } else if matches!(w, Write::CreateCluster(_)) && exists {
                    Some(Refusal::cluster_exists(zone, cluster))
                } else if matches!(w, Write::ReplaceCluster(_)) && !exists {
                    Some(Refusal::no_cluster(zone, cluster))
                } else {
                    None
                }
            }
            Write::DeleteCluster { zone, cluster } => clusters
                .get(cluster_key(zone, cluster).as_str())?
                .is_none()
                .then(|| Refusal::no_cluster(zone, cluster)),
        };
        if let Some(r) = refusal {
            return Ok(Err((index, r)));
        }
        match w {
            Write::CreateZone(z) => made_zones.push(&z.zone_name),
            Write::CreateCluster(c) => made_clusters.push((&c.zone_name, &c.cluster_name)),
            _ => {}
        }
    }
    let mut changes = Vec::with_capacity(batch.len());
    for w in batch {
        match w {
            Write::CreateZone(z) | Write::ReplaceZone(z) => {
                let v = serde_json::to_vec(z).expect("records serialise");
                zones.insert(z.zone_name.as_str(), v.as_slice())?;
                changes.push(Committed::PutZone(z.clone()));
            }
            Write::DeleteZone(name) => {
                let old = zones.remove(name.as_str())?;
                let Some(old) = old else { continue };
                let z: ZoneRecord = decode(name, old.value())?;
                drop(old);
                let prefix = format!("{name}/");
                // `0` sorts right after `/`, closing the zone's key range.
                let end = format!("{name}0");
                clusters.retain_in(prefix.as_str()..end.as_str(), |_, _| false)?;
                changes.push(Committed::DeleteZone(z));
            }
            Write::CreateCluster(c) | Write::ReplaceCluster(c) => {
                let v = serde_json::to_vec(c).expect("records serialise");
                let k = cluster_key(&c.zone_name, &c.cluster_name);
                clusters.insert(k.as_str(), v.as_slice())?;
                changes.push(Committed::PutCluster(c.clone()));
            }
            Write::DeleteCluster { zone, cluster } => {
                let k = cluster_key(zone, cluster);
                let old = clusters.remove(k.as_str())?;
                let Some(old) = old else { continue };
                let c: ClusterRecord = decode(&k, old.value())?;
                drop(old);
                changes.push(Committed::DeleteCluster(c));
            }
        }
    }
    Ok(Ok(changes))
}

/// Every stored registration.
fn load_from(db: &Database) -> Result<Loaded, PersistError> {
    let tx = db.begin_read().map_err(redb::Error::from)?;
    let mut out = Loaded::default();
    for row in tx.open_table(ZONES)?.iter()? {
        let (k, v) = row?;
        out.zones.push(decode(k.value(), v.value())?);
    }
    for row in tx.open_table(CLUSTERS)?.iter()? {
        let (k, v) = row?;
        out.clusters.push(decode(k.value(), v.value())?);
    }
    Ok(out)
}

impl Registrations for RedbRegistrations {
    fn load(&self) -> Result<Loaded, PersistError> {
        self.file.read(load_from).unwrap_or_else(|| {
            Err(PersistError::Unwritable(Unwritable::Failed(
                "the database is closed".into(),
            )))
        })
    }

    fn writable(&self) -> bool {
        self.file.writable()
    }

    fn commit(&self, batch: Vec<Write>) -> Result<Outcome, PersistError> {
        let (reply, outcome) = mpsc::sync_channel(1);
        let done: Done = Box::new(move |r| {
            let _ = reply.send(r);
        });
        self.submit(batch, done)
            .map_err(|_| PersistError::committer_stopped())?;
        outcome
            .recv()
            .map_err(|_| PersistError::committer_stopped())?
    }

    /// Always takes the batch: with the committer gone, `done` hears so at once
    /// (a blocking retry could only fail the same way).
    fn submit(&self, batch: Vec<Write>, done: Done) -> Result<(), (Vec<Write>, Done)> {
        let unsent = match &*self.queue.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(queue) => queue.send((batch, done)).err().map(|e| e.0.1),
            None => Some(done),
        };
        if let Some(done) = unsent {
            done(Err(PersistError::committer_stopped()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(name: &str) -> ZoneRecord {
        ZoneRecord {
            zone_name: name.into(),
            request_cluster: String::new(),
            server_address: "cp:50000".into(),
            use_tls: false,
            ca_path: String::new(),
            cert_path: String::new(),
            key_path: String::new(),
        }
    }

    fn committed(o: Outcome) -> (u64, Vec<Committed>) {
        match o {
            Outcome::Committed { seq, changes } => (seq, changes),
            Outcome::Refused { index, error } => panic!("refused #{index}: {error:?}"),
        }
    }

    #[test]
    fn writes_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        {
            let p = RedbRegistrations::open(dir.path()).unwrap();
            let (seq, _) = committed(
                p.commit(vec![
                    Write::CreateZone(zone("z1")),
                    Write::CreateZone(zone("z10")),
                    Write::CreateCluster(ClusterRecord::new("z1", "a", "A")),
                    Write::CreateCluster(ClusterRecord::new("z1", "b", "B")),
                    Write::CreateCluster(ClusterRecord::new("z10", "a", "A")),
                ])
                .unwrap(),
            );
            assert_eq!(seq, 1);
            let (seq, changes) = committed(
                p.commit(vec![Write::DeleteCluster {
                    zone: "z1".into(),
                    cluster: "b".into(),
                }])
                .unwrap(),
            );
            assert_eq!(seq, 2);
            assert_eq!(
                changes,
                vec![Committed::DeleteCluster(ClusterRecord::new("z1", "b", "B"))]
            );
        }
        let p = RedbRegistrations::open(dir.path()).unwrap();
        let l = p.load().unwrap();
        assert_eq!(l.zones.len(), 2);
        assert_eq!(l.clusters.len(), 2);
        committed(p.commit(vec![Write::DeleteZone("z1".into())]).unwrap());
        let l = p.load().unwrap();
        assert_eq!(l.zones, vec![zone("z10")]);
        assert_eq!(l.clusters, vec![ClusterRecord::new("z10", "a", "A")]);
    }

    #[test]
    fn a_refused_batch_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = RedbRegistrations::open(dir.path()).unwrap();
        committed(p.commit(vec![Write::CreateZone(zone("z"))]).unwrap());
        let o = p
            .commit(vec![
                Write::CreateCluster(ClusterRecord::new("z", "a", "A")),
                Write::CreateCluster(ClusterRecord::new("z", "b", "B")),
                Write::CreateCluster(ClusterRecord::new("z", "a", "A2")),
            ])
            .unwrap();
        assert!(matches!(
            o,
            Outcome::Refused {
                index: 2,
                error: Refusal::Conflict(_)
            }
        ));
        let o = p
            .commit(vec![Write::ReplaceCluster(ClusterRecord::new(
                "y", "a", "A",
            ))])
            .unwrap();
        assert!(matches!(
            o,
            Outcome::Refused {
                index: 0,
                error: Refusal::NoZone(_)
            }
        ));
        assert!(p.load().unwrap().clusters.is_empty());
        let (seq, _) = committed(
            p.commit(vec![Write::CreateCluster(ClusterRecord::new(
                "z", "a", "A",
            ))])
            .unwrap(),
        );
        assert_eq!(seq, 2, "refused batches take no commit number");
    }

    #[test]
    fn a_replaced_zone_keeps_its_clusters_and_a_missing_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = RedbRegistrations::open(dir.path()).unwrap();
        committed(
            p.commit(vec![
                Write::CreateZone(zone("z")),
                Write::CreateCluster(ClusterRecord::new("z", "a", "A")),
            ])
            .unwrap(),
        );
        let moved = ZoneRecord {
            server_address: "cp:60000".into(),
            ..zone("z")
        };
        let (_, changes) = committed(p.commit(vec![Write::ReplaceZone(moved.clone())]).unwrap());
        assert_eq!(changes, vec![Committed::PutZone(moved.clone())]);
        let o = p.commit(vec![Write::ReplaceZone(zone("y"))]).unwrap();
        assert!(matches!(
            o,
            Outcome::Refused {
                index: 0,
                error: Refusal::NotFound(_)
            }
        ));
        // A zone created earlier in the same batch may be replaced by it.
        committed(
            p.commit(vec![
                Write::CreateZone(zone("y")),
                Write::ReplaceZone(ZoneRecord {
                    request_cluster: "edge".into(),
                    ..zone("y")
                }),
            ])
            .unwrap(),
        );
        drop(p);
        let l = RedbRegistrations::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(l.zones[1], moved);
        assert_eq!(l.zones[0].request_cluster, "edge");
        assert_eq!(l.clusters, vec![ClusterRecord::new("z", "a", "A")]);
    }

    #[test]
    fn concurrent_writers_are_committed_and_numbered_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let p = Arc::new(RedbRegistrations::open(dir.path()).unwrap());
        committed(p.commit(vec![Write::CreateZone(zone("z"))]).unwrap());
        let threads: Vec<_> = (0..64)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    (0..20)
                        .map(|n| {
                            let c = ClusterRecord::new("z", &format!("c{t}-{n}"), "C");
                            committed(p.commit(vec![Write::CreateCluster(c)]).unwrap()).0
                        })
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        let mut seqs: Vec<u64> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (2..=1281).collect::<Vec<u64>>());
        drop(p);
        let p = RedbRegistrations::open(dir.path()).unwrap();
        assert_eq!(p.load().unwrap().clusters.len(), 1280);
    }
}
