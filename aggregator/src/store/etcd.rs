//! Registrations in etcd (`--store etcd://...`), shared by every replica. A write is
//! one etcd transaction guarded on the key's revision (create-if-absent, replace- or
//! delete-if-present, cluster writes also on their zone existing), so two replicas
//! racing on one name get one success and one 409. Memory is changed only by
//! [`sync`], which lists the prefix and then follows its watch: every replica applies
//! the same changes in etcd's order, and a write answers once its own replica has
//! applied it (read-your-writes). Keys: `<prefix>/zones/<zone>` and
//! `<prefix>/clusters/<zone>/<cluster>`, values the records' JSON. The same watch
//! carries the other replicas' instance publications (`<prefix>/instances/`, see
//! [`membership`]), their API addresses (`<prefix>/replicas/`) and the forwarding
//! secret (`<prefix>/secret`). [`EtcdTlsFiles`] names the TLS files to etcd.

pub mod membership;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use etcd_client::{
    AlarmAction, AlarmType, Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions,
    EventType, GetOptions, Identity, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use meshcat_common::config::TlsFiles;
use meshcat_common::model::{ClusterRecord, ZoneRecord};
use tokio::sync::watch;
use tracing::{error, info, warn};

use super::registrations::Outcome;
use super::{Committed, Instances, Loaded, PersistError, Refusal, Registrations, Store, Write};
use crate::history::LeftReason;
use crate::redb_file::Unwritable;
use crate::store::peers::PeerSummaryChecks;

/// Longest wait for etcd to commit a write. etcd without quorum holds a request
/// until its own timeout (7 s in 3.4); answering 503 sooner keeps the API's answer
/// within the 10 s the contract allows.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(4);
/// Longest wait for a committed write to come back through this replica's watch.
/// Past it the write is still acknowledged: it is committed, memory follows later.
const APPLY_WAIT: Duration = Duration::from_secs(2);
/// Pause between attempts to list or watch while etcd cannot answer.
const RETRY: Duration = Duration::from_millis(300);
/// Connection establishment deadline for one member.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// etcd's answer to a write once its space quota (`--quota-backend-bytes`) is spent:
/// its `NOSPACE` alarm is raised, and every write is refused until an operator frees
/// space (compaction, defragmentation) and disarms the alarm.
const NO_SPACE: &str = "etcdserver: mvcc: database space exceeded";
/// How often a replica whose writes met [`NO_SPACE`] asks etcd whether the alarm is
/// still raised.
const SPACE_RETRY: Duration = Duration::from_secs(1);

/// TLS to etcd: the members' CA and this replica's client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTlsFiles {
    /// `--etcd-ca-file`.
    pub ca: Option<PathBuf>,
    /// `--etcd-cert` and `--etcd-key`.
    pub identity: Option<TlsFiles>,
}

/// TLS material for the connection to etcd.
#[derive(Debug, Clone, Default)]
pub struct EtcdTls {
    pub ca_pem: Option<Vec<u8>>,
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// The etcd side of a store.
pub struct EtcdRegistrations {
    client: Client,
    /// Key prefix without a trailing `/`.
    prefix: String,
    /// Highest etcd revision applied to memory.
    applied: watch::Sender<i64>,
    /// Set once the first full listing is in memory.
    loaded: AtomicBool,
    /// This replica's identity in instance publications.
    owner: String,
    /// Every replica's API address by identity, from `<prefix>/replicas/`.
    peers: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// The secret that authenticates requests forwarded between replicas, from
    /// `<prefix>/secret` (created by the first replica).
    secret: std::sync::OnceLock<crate::peer_signature::Signer>,
    /// Whether writes are taken: `false` from a write etcd refused for its space
    /// quota until a write succeeds or the `NOSPACE` alarm is gone.
    writable: AtomicBool,
}

impl std::fmt::Debug for EtcdRegistrations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdRegistrations")
            .field("prefix", &self.prefix)
            .field("applied", &*self.applied.borrow())
            .field("loaded", &self.loaded)
            .finish()
    }
}

/// A failure of etcd as a store: unreachable, no quorum, or an answer we cannot read.
fn unavailable(e: impl std::fmt::Display) -> PersistError {
    PersistError::Unavailable(format!("The registrations store did not answer: {e}."))
}

impl EtcdRegistrations {
    /// A client for `endpoints` (`host:port`). Connections are made lazily, so this
    /// succeeds while etcd is down.
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
        tls: Option<EtcdTls>,
    ) -> Result<EtcdRegistrations, etcd_client::Error> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let urls: Vec<String> = endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect();
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_keep_alive_while_idle(true);
        if let Some(t) = tls {
            let mut o = TlsOptions::new();
            if let Some(ca) = t.ca_pem {
                o = o.ca_certificate(Certificate::from_pem(ca));
            }
            if let Some((cert, key)) = t.identity {
                o = o.identity(Identity::from_pem(cert, key));
            }
            options = options.with_tls(o);
        }
        let client = Client::connect(urls, Some(options)).await?;
        Ok(EtcdRegistrations {
            client,
            prefix: prefix.to_owned(),
            applied: watch::channel(0).0,
            loaded: AtomicBool::new(false),
            owner: membership::replica_id(),
            peers: Default::default(),
            secret: std::sync::OnceLock::new(),
            writable: AtomicBool::new(true),
        })
    }

    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Whether writes are taken (etcd's space quota was not found spent since the
    /// last write that succeeded).
    pub fn writable(&self) -> bool {
        self.writable.load(Ordering::Acquire)
    }

    /// What a failed write answers: etcd's space quota spent is the storage full
    /// (507, `meshcat_store_writable` 0); anything else leaves the outcome unknown.
    fn failed_write(&self, err: etcd_client::Error) -> PersistError {
        if let etcd_client::Error::GRpcStatus(status) = &err
            && status.message().contains(NO_SPACE)
        {
            if self.writable.swap(false, Ordering::AcqRel) {
                error!(
                    error = status.message(),
                    "etcd refuses writes: its space quota is spent (NOSPACE alarm). Registrations answer 507 until space is freed and the alarm disarmed; reads go on."
                );
            }
            return PersistError::Unwritable(Unwritable::Full(status.message().to_owned()));
        }
        unavailable(err)
    }

    /// Notes that etcd took a write (or no longer raises `NOSPACE`).
    fn took_writes(&self) {
        if !self.writable.swap(true, Ordering::AcqRel) {
            info!("etcd takes writes again.");
        }
    }

    /// While writes are refused for etcd's space quota, asks etcd every
    /// [`SPACE_RETRY`] whether its `NOSPACE` alarm is still raised, so that
    /// `meshcat_store_writable` comes back without waiting for a write.
    async fn watch_space(&self, mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(SPACE_RETRY) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            if self.writable() {
                continue;
            }
            let mut client = self.client.clone();
            let alarms = tokio::time::timeout(
                WRITE_TIMEOUT,
                client.alarm(AlarmAction::Get, AlarmType::None, None),
            )
            .await;
            if let Ok(Ok(r)) = alarms
                && !r.alarms().iter().any(|a| a.alarm() == AlarmType::Nospace)
            {
                self.took_writes();
            }
        }
    }

    /// The etcd client, for the other keys replicas share.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// This replica's identity in instance publications.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The API address of replica `owner`, as it advertised it.
    /// The other replicas' identities, sorted.
    pub fn peer_ids(&self) -> Vec<String> {
        let peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let mut ids: Vec<String> = peers
            .keys()
            .filter(|id| **id != self.owner)
            .cloned()
            .collect();
        ids.sort();
        ids
    }

    pub fn peer(&self, owner: &str) -> Option<String> {
        self.peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(owner)
            .cloned()
    }

    /// Signs and verifies requests between replicas with their shared secret, once
    /// it was read from etcd.
    pub fn signer(&self) -> Option<&crate::peer_signature::Signer> {
        self.secret.get()
    }

    /// Records a replica's advertised address. Only `host:port` is taken: whoever
    /// could write another value into etcd must not aim this replica's requests at a
    /// URL of their choosing.
    fn peer_event(&self, id: &str, value: Option<&[u8]>) {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let addr = value.map(|v| {
            std::str::from_utf8(v)
                .ok()
                .filter(|a| meshcat_common::validate::check_server_address(a).is_ok())
        });
        match addr {
            Some(Some(addr)) => {
                peers.insert(id.to_owned(), addr.to_owned());
            }
            Some(None) => {
                warn!(replica = %id, "A replica's advertised address is not host:port; it is ignored.");
                peers.remove(id);
            }
            None => {
                peers.remove(id);
            }
        }
    }

    /// Reads the shared secret, creating it when this is the first replica.
    async fn ensure_secret(&self) -> Result<(), etcd_client::Error> {
        if self.secret.get().is_some() {
            return Ok(());
        }
        let key = format!("{}/secret", self.prefix);
        let fresh: [u8; 32] = rand::random();
        let fresh: String = fresh.iter().map(|b| format!("{b:02x}")).collect();
        let mut kv = self.client.kv_client();
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), fresh.clone(), None)])
            .or_else([TxnOp::get(key, None)]);
        let resp = tokio::time::timeout(WRITE_TIMEOUT, kv.txn(txn))
            .await
            .map_err(|_| etcd_client::Error::WatchError("secret timed out".into()))??;
        let secret = if resp.succeeded() {
            fresh
        } else {
            resp.op_responses()
                .iter()
                .find_map(|r| match r {
                    TxnOpResponse::Get(g) => g.kvs().first().and_then(|kv| kv.value_str().ok()),
                    _ => None,
                })
                .map(str::to_owned)
                .ok_or_else(|| etcd_client::Error::WatchError("secret unreadable".into()))?
        };
        let _ = self
            .secret
            .set(crate::peer_signature::Signer::new(secret.as_bytes()));
        Ok(())
    }

    fn zone_key(&self, zone: &str) -> String {
        format!("{}/zones/{zone}", self.prefix)
    }

    fn cluster_key(&self, zone: &str, cluster: &str) -> String {
        format!("{}/clusters/{zone}/{cluster}", self.prefix)
    }

    /// Waits until this replica's follower has applied revision `rev`. Past
    /// [`APPLY_WAIT`] the write is still acknowledged: it is committed, memory follows.
    async fn wait_applied(&self, rev: i64) {
        let mut rx = self.applied.subscribe();
        if tokio::time::timeout(APPLY_WAIT, rx.wait_for(|r| *r >= rev))
            .await
            .is_err()
        {
            warn!(
                revision = rev,
                "A committed registration is not applied here yet; answering anyway."
            );
        }
    }

    /// Checks and commits a batch in one etcd transaction: each write adds its
    /// conditions (compares) and operations; when a condition fails, the else branch
    /// reads every key involved so the first refused write can be named.
    async fn commit_batch(&self, batch: Vec<Write>) -> Result<Outcome, PersistError> {
        let mut compares = Vec::new();
        let mut ops = Vec::new();
        let mut reads: Vec<String> = Vec::new();
        // Which op's answer carries each deleted record: (write index, op index).
        let mut deleted_at: Vec<(usize, usize)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, w) in batch.iter().enumerate() {
            let key = match w {
                Write::CreateZone(z) | Write::ReplaceZone(z) => self.zone_key(&z.zone_name),
                Write::DeleteZone(z) => self.zone_key(z),
                Write::CreateCluster(c) | Write::ReplaceCluster(c) => {
                    self.cluster_key(&c.zone_name, &c.cluster_name)
                }
                Write::DeleteCluster { zone, cluster } => self.cluster_key(zone, cluster),
            };
            // etcd refuses a transaction writing one key twice: the second write of a
            // key in a batch is refused as the redb backend would refuse it.
            if !seen.insert(key.clone()) {
                let error = match w {
                    Write::CreateZone(z) => Refusal::zone_exists(&z.zone_name),
                    Write::CreateCluster(c) => {
                        Refusal::cluster_exists(&c.zone_name, &c.cluster_name)
                    }
                    _ => {
                        return Err(PersistError::Unavailable(
                            "A batch may write each record once.".into(),
                        ));
                    }
                };
                return Ok(Outcome::Refused { index: i, error });
            }
            reads.push(key.clone());
            match w {
                Write::CreateZone(z) => {
                    compares.push(Compare::create_revision(key.clone(), CompareOp::Equal, 0));
                    ops.push(TxnOp::put(key, to_json(z), None));
                }
                Write::ReplaceZone(z) => {
                    compares.push(Compare::version(key.clone(), CompareOp::Greater, 0));
                    ops.push(TxnOp::put(key, to_json(z), None));
                }
                Write::DeleteZone(z) => {
                    compares.push(Compare::version(key.clone(), CompareOp::Greater, 0));
                    deleted_at.push((i, ops.len()));
                    ops.push(TxnOp::get(key.clone(), None));
                    ops.push(TxnOp::delete(key, None));
                    ops.push(TxnOp::delete(
                        format!("{}/clusters/{z}/", self.prefix),
                        Some(DeleteOptions::new().with_prefix()),
                    ));
                }
                Write::CreateCluster(c) | Write::ReplaceCluster(c) => {
                    let zk = self.zone_key(&c.zone_name);
                    compares.push(Compare::version(zk.clone(), CompareOp::Greater, 0));
                    reads.push(zk);
                    compares.push(if matches!(w, Write::CreateCluster(_)) {
                        Compare::create_revision(key.clone(), CompareOp::Equal, 0)
                    } else {
                        Compare::version(key.clone(), CompareOp::Greater, 0)
                    });
                    ops.push(TxnOp::put(key, to_json(c), None));
                }
                Write::DeleteCluster { .. } => {
                    compares.push(Compare::version(key.clone(), CompareOp::Greater, 0));
                    deleted_at.push((i, ops.len()));
                    ops.push(TxnOp::get(key.clone(), None));
                    ops.push(TxnOp::delete(key, None));
                }
            }
        }
        reads.sort();
        reads.dedup();
        let else_ops: Vec<TxnOp> = reads.iter().map(|k| TxnOp::get(k.clone(), None)).collect();
        let txn = Txn::new().when(compares).and_then(ops).or_else(else_ops);
        let mut kv = self.client.kv_client();
        let resp = tokio::time::timeout(WRITE_TIMEOUT, kv.txn(txn))
            .await
            .map_err(|_| unavailable("timed out"))?
            .map_err(|e| self.failed_write(e))?;
        self.took_writes();
        let answers = resp.op_responses();
        if !resp.succeeded() {
            let exists: std::collections::HashSet<&str> = answers
                .iter()
                .filter_map(|r| match r {
                    TxnOpResponse::Get(g) => g.kvs().first().and_then(|kv| kv.key_str().ok()),
                    _ => None,
                })
                .collect();
            return refusal(&batch, |k| exists.contains(k), self);
        }
        let rev = resp.header().map_or(0, |h| h.revision());
        self.wait_applied(rev).await;
        let mut changes = Vec::with_capacity(batch.len());
        for (i, w) in batch.into_iter().enumerate() {
            let deleted = || {
                deleted_at
                    .iter()
                    .find(|(wi, _)| *wi == i)
                    .and_then(|(_, oi)| match answers.get(*oi) {
                        Some(TxnOpResponse::Get(g)) => {
                            g.kvs().first().map(|kv| kv.value().to_vec())
                        }
                        _ => None,
                    })
                    .ok_or_else(|| unavailable("a deleted record could not be read back"))
            };
            changes.push(match w {
                Write::CreateZone(z) | Write::ReplaceZone(z) => Committed::PutZone(z),
                Write::CreateCluster(c) | Write::ReplaceCluster(c) => Committed::PutCluster(c),
                Write::DeleteZone(_) => Committed::DeleteZone(from_json(&deleted()?)?),
                Write::DeleteCluster { .. } => Committed::DeleteCluster(from_json(&deleted()?)?),
            });
        }
        Ok(Outcome::Committed { seq: 0, changes })
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("records serialise")
}

fn from_json<T: serde::de::DeserializeOwned>(v: &[u8]) -> Result<T, PersistError> {
    serde_json::from_slice(v).map_err(|error| PersistError::Decode {
        key: String::from_utf8_lossy(v).chars().take(80).collect(),
        error,
    })
}

/// The first write of `batch` whose condition fails given which keys exist.
fn refusal(
    batch: &[Write],
    exists: impl Fn(&str) -> bool,
    e: &EtcdRegistrations,
) -> Result<Outcome, PersistError> {
    for (index, w) in batch.iter().enumerate() {
        let error = match w {
            Write::CreateZone(z) if exists(&e.zone_key(&z.zone_name)) => {
                Refusal::zone_exists(&z.zone_name)
            }
            Write::ReplaceZone(z) if !exists(&e.zone_key(&z.zone_name)) => {
                Refusal::no_zone(&z.zone_name)
            }
            Write::DeleteZone(z) if !exists(&e.zone_key(z)) => Refusal::no_zone(z),
            Write::CreateCluster(c) | Write::ReplaceCluster(c)
                if !exists(&e.zone_key(&c.zone_name)) =>
            {
                Refusal::cluster_needs_zone(&c.zone_name)
            }
            Write::CreateCluster(c) if exists(&e.cluster_key(&c.zone_name, &c.cluster_name)) => {
                Refusal::cluster_exists(&c.zone_name, &c.cluster_name)
            }
            Write::ReplaceCluster(c) if !exists(&e.cluster_key(&c.zone_name, &c.cluster_name)) => {
                Refusal::no_cluster(&c.zone_name, &c.cluster_name)
            }
            Write::DeleteCluster { zone, cluster } if !exists(&e.cluster_key(zone, cluster)) => {
                Refusal::no_cluster(zone, cluster)
            }
            _ => continue,
        };
        return Ok(Outcome::Refused { index, error });
    }
    // Every condition held when the keys were read back: another replica's write
    // changed them in between. The outcome is clear (nothing written) but the caller
    // should retry.
    Err(PersistError::Unavailable(
        "A concurrent registration changed the same records; nothing was written, retry.".into(),
    ))
}

/// The etcd registrations as the store's backend.
#[derive(Debug)]
pub struct EtcdBackend(pub Arc<EtcdRegistrations>);

impl Registrations for EtcdBackend {
    /// Nothing at start: [`sync`] loads the catalog once etcd answers, so a replica
    /// started while etcd is down still starts (and is not ready).
    fn load(&self) -> Result<Loaded, PersistError> {
        Ok(Loaded::default())
    }

    /// Runs on the blocking pool (the API runs registrations there), so it may
    /// block on the runtime.
    fn commit(&self, batch: Vec<Write>) -> Result<Outcome, PersistError> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| unavailable("no async runtime to reach etcd from"))?;
        handle.block_on(self.0.commit_batch(batch))
    }

    fn followed(&self) -> bool {
        true
    }

    fn writable(&self) -> bool {
        self.0.writable()
    }
}

/// A record deleted by name only: showing a deletion needs only the names.
fn zone_named(zone: &str) -> ZoneRecord {
    ZoneRecord::new(zone, "")
}

/// Decodes a key under the prefix (`rest` is the part after `<prefix>/`) into the
/// change it makes; `None` for keys that are not registrations or values that do
/// not decode.
fn decode(rest: &str, value: Option<&[u8]>) -> Option<Committed> {
    if let Some(zone) = rest.strip_prefix("zones/") {
        return match value {
            None => Some(Committed::DeleteZone(zone_named(zone))),
            Some(v) => match serde_json::from_slice(v) {
                Ok(z) => Some(Committed::PutZone(z)),
                Err(e) => {
                    warn!(key = rest, error = %e, "Stored zone cannot be decoded, skipped.");
                    None
                }
            },
        };
    }
    let (zone, cluster) = rest.strip_prefix("clusters/")?.split_once('/')?;
    match value {
        None => Some(Committed::DeleteCluster(ClusterRecord::new(
            zone, cluster, cluster,
        ))),
        Some(v) => match serde_json::from_slice(v) {
            Ok(c) => Some(Committed::PutCluster(c)),
            Err(e) => {
                warn!(key = rest, error = %e, "Stored cluster cannot be decoded, skipped.");
                None
            }
        },
    }
}

/// The changes that make memory hold exactly `zones` and `clusters` (a full
/// listing): deletions of what the listing lacks, then every record.
fn snapshot_changes(
    store: &Store,
    zones: Vec<ZoneRecord>,
    clusters: Vec<ClusterRecord>,
) -> Vec<Committed> {
    let keep_zones: std::collections::HashSet<&str> =
        zones.iter().map(|z| z.zone_name.as_str()).collect();
    let keep_clusters: std::collections::HashSet<(&str, &str)> = clusters
        .iter()
        .map(|c| (c.zone_name.as_str(), c.cluster_name.as_str()))
        .collect();
    let mut changes = Vec::new();
    for z in store.memory.zones.iter() {
        if !keep_zones.contains(z.key().as_str()) {
            changes.push(Committed::DeleteZone(zone_named(z.key())));
            continue;
        }
        for c in &z.clusters {
            if !keep_clusters.contains(&(z.key().as_str(), c.as_str())) {
                changes.push(Committed::DeleteCluster(ClusterRecord::new(z.key(), c, c)));
            }
        }
    }
    changes.extend(zones.into_iter().map(Committed::PutZone));
    changes.extend(clusters.into_iter().map(Committed::PutCluster));
    changes
}

/// Shows or drops another replica's instance publication (`path` is
/// `<zone>/<cluster>/<instance>`); this replica's own (those of `owner`) are already
/// in memory. A publication is checked like an instance of an agent's report
/// ([`membership::check`]): one that fails is dropped, counted and logged in `checks`.
fn instance_event(
    instances: &Instances,
    owner: &str,
    checks: &PeerSummaryChecks,
    path: &str,
    value: Option<&[u8]>,
) {
    let mut parts = path.splitn(3, '/');
    let (Some(zone), Some(cluster), Some(instance)) = (parts.next(), parts.next(), parts.next())
    else {
        return;
    };
    match value {
        // A withdrawal without its marked publication before it: the lease ended.
        None => instances.drop_remote(zone, cluster, instance, LeftReason::Expired),
        Some(v) => match serde_json::from_slice::<membership::Published>(v) {
            Ok(p) if p.owner == owner => {}
            Ok(p) => {
                if let Err(d) = membership::check(zone, cluster, instance, &p) {
                    checks.dropped("instance", &p.owner, &[d]);
                    return;
                }
                match p.left {
                    Some(reason) => instances.drop_remote(zone, cluster, instance, reason),
                    None => instances.put_remote(p.remote(zone, cluster, instance)),
                }
            }
            Err(err) => warn!(key = path, error = %err, "Instance publication cannot be decoded."),
        },
    }
}

/// Lists the registrations and the other replicas' instances and applies them as
/// the whole truth; returns the revision of the listing.
async fn relist(
    store: &Store,
    instances: &Instances,
    e: &EtcdRegistrations,
    checks: &PeerSummaryChecks,
) -> Result<i64, etcd_client::Error> {
    let mut kv = e.client.kv_client();
    let root = format!("{}/", e.prefix);
    let mut zones = Vec::new();
    let mut clusters = Vec::new();
    let mut revision = 0;
    let mut published: Vec<(String, Option<Vec<u8>>)> = Vec::new();
    for sub in ["zones/", "clusters/", "instances/", "replicas/"] {
        let get = kv.get(
            format!("{root}{sub}"),
            Some(match revision {
                0 => GetOptions::new().with_prefix(),
                // Both halves from one revision: a consistent snapshot.
                r => GetOptions::new().with_prefix().with_revision(r),
            }),
        );
        let resp = tokio::time::timeout(WRITE_TIMEOUT, get)
            .await
            .map_err(|_| etcd_client::Error::WatchError("listing timed out".into()))??;
        if revision == 0 {
            revision = resp.header().map_or(0, |h| h.revision());
        }
        for kv in resp.kvs() {
            let Ok(key) = kv.key_str() else { continue };
            if let Some(id) = key[root.len()..].strip_prefix("replicas/") {
                e.peer_event(id, Some(kv.value()));
                continue;
            }
            if let Some(path) = key[root.len()..].strip_prefix("instances/") {
                published.push((path.to_owned(), Some(kv.value().to_vec())));
                continue;
            }
            match decode(&key[root.len()..], Some(kv.value())) {
                Some(Committed::PutZone(z)) => zones.push(z),
                Some(Committed::PutCluster(c)) => clusters.push(c),
                _ => {}
            }
        }
    }
    e.ensure_secret().await?;
    let (nz, nc) = (zones.len(), clusters.len());
    let changes = snapshot_changes(store, zones, clusters);
    store.apply_changes(&changes);
    // Other replicas' instances: the listing is the truth, drop what it lacks.
    let listed: std::collections::HashSet<&str> =
        published.iter().map(|(p, _)| p.as_str()).collect();
    for k in instances.remote_instances() {
        let path = format!("{}/{}/{}", k.zone, k.cluster, k.instance);
        if !listed.contains(path.as_str()) {
            instances.drop_remote(&k.zone, &k.cluster, &k.instance, LeftReason::Expired);
        }
    }
    for (path, value) in &published {
        instance_event(instances, &e.owner, checks, path, value.as_deref());
    }
    info!(
        zones = nz,
        clusters = nc,
        revision,
        "Registrations loaded from etcd."
    );
    Ok(revision)
}

/// Follows the watch from `from` (inclusive) until it fails, is compacted past, or
/// `stop` fires; returns whether to stop.
async fn follow(
    store: &Store,
    instances: &Instances,
    e: &EtcdRegistrations,
    checks: &PeerSummaryChecks,
    from: i64,
    stop: &mut watch::Receiver<bool>,
) -> Result<bool, String> {
    let root = format!("{}/", e.prefix);
    let mut wc = e.client.watch_client();
    let mut stream = tokio::select! {
        s = wc.watch(root.clone(), Some(WatchOptions::new().with_prefix().with_start_revision(from).with_progress_notify())) => s.map_err(|e| e.to_string())?,
        _ = stop.wait_for(|s| *s) => return Ok(true),
    };
    loop {
        let msg = tokio::select! {
            m = stream.message() => m,
            _ = stop.wait_for(|s| *s) => return Ok(true),
        };
        let resp = match msg {
            Ok(Some(r)) => r,
            Ok(None) => return Err("the watch ended".into()),
            Err(err) => return Err(err.to_string()),
        };
        if resp.compact_revision() > 0 {
            return Err(format!(
                "the watch was compacted at revision {}",
                resp.compact_revision()
            ));
        }
        if resp.canceled() {
            return Err(format!("the watch was cancelled: {}", resp.cancel_reason()));
        }
        let mut last = 0;
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            last = last.max(kv.mod_revision());
            let Ok(key) = kv.key_str() else { continue };
            let value = match ev.event_type() {
                EventType::Put => Some(kv.value()),
                EventType::Delete => None,
            };
            let rest = &key[root.len()..];
            if let Some(id) = rest.strip_prefix("replicas/") {
                e.peer_event(id, value);
            } else if let Some(path) = rest.strip_prefix("instances/") {
                instance_event(instances, &e.owner, checks, path, value);
            } else if let Some(change) = decode(rest, value) {
                store.apply_changes(&[change]);
            }
        }
        // The creation answer's header names the current revision, but the events
        // from the start revision up to it come after: it must not count as applied.
        if resp.created() && resp.events().is_empty() {
            continue;
        }
        // Events count up to the newest applied; an empty answer is a progress
        // notification, sent once every event up to its header's revision was.
        let rev = if resp.events().is_empty() {
            resp.header().map_or(0, |h| h.revision())
        } else {
            last
        };
        e.applied.send_if_modified(|r| {
            let newer = rev > *r;
            if newer {
                *r = rev;
            }
            newer
        });
    }
}

/// Keeps memory equal to etcd: lists, then follows the watch; on any failure
/// (member lost, compaction, cancellation) lists again and resumes from the new
/// listing's revision, so no change is missed. Runs until `stop`. What peers publish
/// of their instances is checked, and what fails counted in `checks`.
pub async fn sync(
    store: Arc<Store>,
    instances: Arc<Instances>,
    checks: PeerSummaryChecks,
    mut stop: watch::Receiver<bool>,
) {
    let Some(e) = store.etcd() else { return };
    let space = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            if let Some(e) = store.etcd() {
                e.watch_space(stop).await;
            }
        })
    };
    let _space = AbortOnDrop(space);
    loop {
        let listed = tokio::select! {
            r = relist(&store, &instances, e, &checks) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        let revision = match listed {
            Ok(r) => r,
            Err(err) => {
                warn!(error = %err, "etcd cannot list the registrations; retrying.");
                tokio::select! {
                    _ = tokio::time::sleep(RETRY) => continue,
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        };
        e.applied.send_if_modified(|r| {
            let newer = revision > *r;
            if newer {
                *r = revision;
            }
            newer
        });
        e.loaded.store(true, Ordering::Release);
        match follow(&store, &instances, e, &checks, revision + 1, &mut stop).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(err) => warn!(error = %err, "etcd watch lost; listing again."),
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Rules;

    /// Peers' publications, decoded as the watch hands them over: one a report could
    /// carry shows; one whose names no report could carry, or whose owner is no
    /// replica id, is dropped and counted, and the others still apply.
    #[test]
    fn peer_publications_are_checked_like_reports() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, instances) = Store::open(dir.path(), Rules::defaults()).unwrap();
        let checks = PeerSummaryChecks::register(&prometheus::Registry::new()).unwrap();
        let published = |owner: &str| {
            serde_json::to_vec(&serde_json::json!({
                "owner": owner,
                "startTimeMs": 1,
                "reachable": true,
                "windowRequests": 0,
                "windowErrors": 0,
            }))
            .unwrap()
        };
        let peer = published("0123456789abcdef");
        let long = format!("z/orders/{}", "i".repeat(300));
        for (path, value) in [
            ("z/orders/orders-1", &peer),
            ("z/orders/orders\u{1b}[2J", &peer),
            ("z/or ders/orders-2", &peer),
            (long.as_str(), &peer),
            ("z/orders/orders-3", &published("peer\nforged")),
            ("z/orders/orders-4", &peer),
        ] {
            instance_event(&instances, "me", &checks, path, Some(value));
        }
        let mut shown: Vec<String> = instances
            .remote_instances()
            .into_iter()
            .map(|k| format!("{}/{}/{}", k.zone, k.cluster, k.instance))
            .collect();
        shown.sort();
        assert_eq!(shown, ["z/orders/orders-1", "z/orders/orders-4"]);
        assert_eq!(checks.count("instance", "invalid_name"), 3);
        assert_eq!(checks.count("instance", "invalid_owner"), 1);
    }
}
