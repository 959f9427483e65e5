//! Registrations in etcd (`--store etcd://...`), shared by every replica. A write is
//! one etcd transaction guarded on the key's revision (create-if-absent, replace- or
//! delete-if-present, cluster writes also on their zone existing), so two replicas
//! racing on one name get one success and one 409. Memory is changed only by
//! [`sync`], which lists the prefix and then follows its watch: every replica applies
//! the same changes in etcd's order, and a write answers once its own replica has
//! applied it (read-your-writes). Keys: `<prefix>/zones/<zone>` and
//! `<prefix>/clusters/<zone>/<cluster>`, values the records' JSON.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions,
    Identity, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use meshcat_common::model::{ClusterRecord, ZoneRecord};
use tokio::sync::watch;
use tracing::{info, warn};

use super::{Store, StoreError};

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
fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("The registrations store did not answer: {e}."))
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
        })
    }

    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// The etcd client, for the other keys replicas share.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn zone_key(&self, zone: &str) -> String {
        format!("{}/zones/{zone}", self.prefix)
    }

    fn cluster_key(&self, zone: &str, cluster: &str) -> String {
        format!("{}/clusters/{zone}/{cluster}", self.prefix)
    }

    /// Runs `txn` and waits until this replica applied it. Called on the blocking
    /// pool (the API runs registrations there), so it may block on the runtime.
    fn commit(&self, txn: Txn) -> Result<etcd_client::TxnResponse, StoreError> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| unavailable("no async runtime to reach etcd from"))?;
        handle.block_on(async {
            let mut kv = self.client.kv_client();
            let resp = tokio::time::timeout(WRITE_TIMEOUT, kv.txn(txn))
                .await
                .map_err(|_| unavailable("timed out"))?
                .map_err(unavailable)?;
            if resp.succeeded() {
                let rev = resp.header().map_or(0, |h| h.revision());
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
            Ok(resp)
        })
    }

    pub(super) fn create_zone(&self, z: ZoneRecord) -> Result<ZoneRecord, StoreError> {
        let key = self.zone_key(&z.zone_name);
        let value = serde_json::to_vec(&z).expect("records serialise");
        let resp = self.commit(
            Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key, value, None)]),
        )?;
        if !resp.succeeded() {
            return Err(StoreError::Conflict(format!(
                "Zone {} already exists.",
                z.zone_name
            )));
        }
        Ok(z)
    }

    pub(super) fn delete_zone(&self, name: &str) -> Result<ZoneRecord, StoreError> {
        let key = self.zone_key(name);
        let clusters = format!("{}/clusters/{name}/", self.prefix);
        let resp = self.commit(
            Txn::new()
                .when([Compare::version(key.clone(), CompareOp::Greater, 0)])
                .and_then([
                    TxnOp::get(key.clone(), None),
                    TxnOp::delete(key, None),
                    TxnOp::delete(clusters, Some(DeleteOptions::new().with_prefix())),
                ]),
        )?;
        if !resp.succeeded() {
            return Err(StoreError::NotFound(format!("Zone {name} does not exist.")));
        }
        first_record(&resp)
    }

    /// Creates (`create`) or replaces a cluster registration.
    pub(super) fn put_cluster(
        &self,
        c: ClusterRecord,
        create: bool,
    ) -> Result<ClusterRecord, StoreError> {
        let zone_key = self.zone_key(&c.zone_name);
        let key = self.cluster_key(&c.zone_name, &c.cluster_name);
        let value = serde_json::to_vec(&c).expect("records serialise");
        let exists = if create {
            Compare::create_revision(key.clone(), CompareOp::Equal, 0)
        } else {
            Compare::version(key.clone(), CompareOp::Greater, 0)
        };
        let resp = self.commit(
            Txn::new()
                .when([
                    Compare::version(zone_key.clone(), CompareOp::Greater, 0),
                    exists,
                ])
                .and_then([TxnOp::put(key, value, None)])
                .or_else([TxnOp::get(zone_key, None)]),
        )?;
        if resp.succeeded() {
            return Ok(c);
        }
        let zone_exists = resp.op_responses().iter().any(|r| match r {
            TxnOpResponse::Get(g) => !g.kvs().is_empty(),
            _ => false,
        });
        Err(if !zone_exists {
            StoreError::Invalid(format!("Zone {} does not exist.", c.zone_name))
        } else if create {
            StoreError::Conflict(format!(
                "Cluster {} already exists in zone {}.",
                c.cluster_name, c.zone_name
            ))
        } else {
            StoreError::NotFound(format!(
                "Cluster {} does not exist in zone {}.",
                c.cluster_name, c.zone_name
            ))
        })
    }

    pub(super) fn delete_cluster(
        &self,
        zone: &str,
        cluster: &str,
    ) -> Result<ClusterRecord, StoreError> {
        let key = self.cluster_key(zone, cluster);
        let resp = self.commit(
            Txn::new()
                .when([Compare::version(key.clone(), CompareOp::Greater, 0)])
                .and_then([TxnOp::get(key.clone(), None), TxnOp::delete(key, None)]),
        )?;
        if !resp.succeeded() {
            return Err(StoreError::NotFound(format!(
                "Cluster {cluster} does not exist in zone {zone}."
            )));
        }
        first_record(&resp)
    }
}

/// The record read by the first operation of a successful transaction.
fn first_record<T: serde::de::DeserializeOwned>(
    resp: &etcd_client::TxnResponse,
) -> Result<T, StoreError> {
    resp.op_responses()
        .iter()
        .find_map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        })
        .and_then(|v| serde_json::from_slice(&v).ok())
        .ok_or_else(|| unavailable("the deleted record could not be read back"))
}

/// One change of the registrations, decoded from a key and value.
enum Change {
    PutZone(Box<ZoneRecord>),
    DeleteZone(String),
    PutCluster(Box<ClusterRecord>),
    DeleteCluster(String, String),
}

/// Decodes a key under the prefix (`rest` is the part after `<prefix>/`); `None`
/// for keys that are not registrations or values that do not decode.
fn decode(rest: &str, value: Option<&[u8]>) -> Option<Change> {
    if let Some(zone) = rest.strip_prefix("zones/") {
        return match value {
            None => Some(Change::DeleteZone(zone.to_owned())),
            Some(v) => match serde_json::from_slice(v) {
                Ok(z) => Some(Change::PutZone(z)),
                Err(e) => {
                    warn!(key = rest, error = %e, "Stored zone cannot be decoded, skipped.");
                    None
                }
            },
        };
    }
    let (zone, cluster) = rest.strip_prefix("clusters/")?.split_once('/')?;
    match value {
        None => Some(Change::DeleteCluster(zone.to_owned(), cluster.to_owned())),
        Some(v) => match serde_json::from_slice(v) {
            Ok(c) => Some(Change::PutCluster(c)),
            Err(e) => {
                warn!(key = rest, error = %e, "Stored cluster cannot be decoded, skipped.");
                None
            }
        },
    }
}

fn apply(store: &Store, change: Change) {
    match change {
        Change::PutZone(z) => store.apply_put_zone(*z),
        Change::DeleteZone(z) => store.apply_delete_zone(&z),
        Change::PutCluster(c) => store.apply_put_cluster(*c),
        Change::DeleteCluster(z, c) => store.apply_delete_cluster(&z, &c),
    }
}

/// Lists the registrations and applies them as the whole truth; returns the
/// revision of the listing.
async fn relist(store: &Store, e: &EtcdRegistrations) -> Result<i64, etcd_client::Error> {
    let mut kv = e.client.kv_client();
    let root = format!("{}/", e.prefix);
    let mut zones = Vec::new();
    let mut clusters = Vec::new();
    let mut revision = 0;
    for sub in ["zones/", "clusters/"] {
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
            match decode(&key[root.len()..], Some(kv.value())) {
                Some(Change::PutZone(z)) => zones.push(*z),
                Some(Change::PutCluster(c)) => clusters.push(*c),
                _ => {}
            }
        }
    }
    let (nz, nc) = (zones.len(), clusters.len());
    store.apply_snapshot(zones, clusters);
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
    e: &EtcdRegistrations,
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
            if let Some(change) = decode(&key[root.len()..], value) {
                apply(store, change);
            }
        }
        let rev = resp.header().map_or(last, |h| h.revision()).max(last);
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
/// listing's revision, so no change is missed. Runs until `stop`.
pub async fn sync(store: Arc<Store>, mut stop: watch::Receiver<bool>) {
    let Some(e) = store.etcd() else { return };
    loop {
        let listed = tokio::select! {
            r = relist(&store, e) => r,
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
        match follow(&store, e, revision + 1, &mut stop).await {
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
