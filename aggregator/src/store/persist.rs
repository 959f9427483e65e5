//! Durable registrations: zones and clusters in a redb database under `--data-dir`.
//! Every write commits with immediate durability before the API answers, so a
//! `kill -9` after a 2xx loses nothing.

use std::path::Path;

use meshcat_common::model::{ClusterRecord, ZoneRecord};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

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
    #[error("stored record {key:?} cannot be decoded: {error}")]
    Decode {
        key: String,
        error: serde_json::Error,
    },
}

macro_rules! db_err {
    ($($t:ty),*) => {$(
        impl From<$t> for PersistError {
            fn from(e: $t) -> Self {
                PersistError::Db(e.into())
            }
        }
    )*};
}
db_err!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// One change to the registrations, applied atomically with the others of its batch.
#[derive(Debug)]
pub enum Op<'a> {
    PutZone(&'a ZoneRecord),
    DeleteZone(&'a str),
    PutCluster(&'a ClusterRecord),
    DeleteCluster { zone: &'a str, cluster: &'a str },
}

/// Everything stored, as read at start.
#[derive(Debug, Default)]
pub struct Loaded {
    pub zones: Vec<ZoneRecord>,
    pub clusters: Vec<ClusterRecord>,
}

/// The open database.
#[derive(Debug)]
pub struct Persist {
    /// The redb database; it serialises write transactions itself.
    db: Database,
}

fn cluster_key(zone: &str, cluster: &str) -> String {
    format!("{zone}/{cluster}")
}

impl Persist {
    /// Opens (or creates) the database in `dir`.
    pub fn open(dir: &Path) -> Result<Persist, PersistError> {
        std::fs::create_dir_all(dir).map_err(|error| PersistError::Dir {
            path: dir.display().to_string(),
            error,
        })?;
        let db = Database::create(dir.join(DB_FILE))?;
        // Tables exist from the first start on, so reads never meet a missing table.
        let tx = db.begin_write()?;
        tx.open_table(ZONES)?;
        tx.open_table(CLUSTERS)?;
        tx.commit()?;
        Ok(Persist { db })
    }

    /// Reads every stored registration.
    pub fn load(&self) -> Result<Loaded, PersistError> {
        let tx = self.db.begin_read().map_err(redb::Error::from)?;
        let mut out = Loaded::default();
        for row in tx.open_table(ZONES)?.iter()? {
            let (k, v) = row?;
            let z = serde_json::from_slice(v.value()).map_err(|error| PersistError::Decode {
                key: k.value().to_owned(),
                error,
            })?;
            out.zones.push(z);
        }
        for row in tx.open_table(CLUSTERS)?.iter()? {
            let (k, v) = row?;
            let c = serde_json::from_slice(v.value()).map_err(|error| PersistError::Decode {
                key: k.value().to_owned(),
                error,
            })?;
            out.clusters.push(c);
        }
        Ok(out)
    }

    /// Applies the operations in one durable transaction: all or nothing.
    pub fn apply(&self, ops: &[Op<'_>]) -> Result<(), PersistError> {
        let tx = self.db.begin_write()?;
        {
            let mut zones = tx.open_table(ZONES)?;
            let mut clusters = tx.open_table(CLUSTERS)?;
            for op in ops {
                match op {
                    Op::PutZone(z) => {
                        let v = serde_json::to_vec(z).expect("records serialise");
                        zones.insert(z.zone_name.as_str(), v.as_slice())?;
                    }
                    Op::DeleteZone(name) => {
                        zones.remove(*name)?;
                        let prefix = format!("{name}/");
                        // `0` sorts right after `/`, closing the zone's key range.
                        let end = format!("{name}0");
                        clusters.retain_in(prefix.as_str()..end.as_str(), |_, _| false)?;
                    }
                    Op::PutCluster(c) => {
                        let v = serde_json::to_vec(c).expect("records serialise");
                        let k = cluster_key(&c.zone_name, &c.cluster_name);
                        clusters.insert(k.as_str(), v.as_slice())?;
                    }
                    Op::DeleteCluster { zone, cluster } => {
                        clusters.remove(cluster_key(zone, cluster).as_str())?;
                    }
                }
            }
        }
        tx.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let zone = ZoneRecord {
            zone_name: "z1".into(),
            request_cluster: String::new(),
            server_address: "cp:50000".into(),
            use_tls: false,
            ca_path: String::new(),
            cert_path: String::new(),
            key_path: String::new(),
        };
        let mut other = zone.clone();
        other.zone_name = "z10".into();
        {
            let p = Persist::open(dir.path()).unwrap();
            p.apply(&[
                Op::PutZone(&zone),
                Op::PutZone(&other),
                Op::PutCluster(&ClusterRecord::new("z1", "a", "A")),
                Op::PutCluster(&ClusterRecord::new("z1", "b", "B")),
                Op::PutCluster(&ClusterRecord::new("z10", "a", "A")),
            ])
            .unwrap();
            p.apply(&[Op::DeleteCluster {
                zone: "z1",
                cluster: "b",
            }])
            .unwrap();
        }
        let p = Persist::open(dir.path()).unwrap();
        let l = p.load().unwrap();
        assert_eq!(l.zones.len(), 2);
        assert_eq!(l.clusters.len(), 2);
        p.apply(&[Op::DeleteZone("z1")]).unwrap();
        let l = p.load().unwrap();
        assert_eq!(l.zones, vec![other]);
        assert_eq!(l.clusters, vec![ClusterRecord::new("z10", "a", "A")]);
    }
}
