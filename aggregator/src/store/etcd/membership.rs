//! Instance membership in etcd: each replica publishes the instances its agents
//! report under `<prefix>/instances/<zone>/<cluster>/<instance>` on a lease of
//! `--instance-ttl`, so every replica shows every instance. A publication carries
//! the owner, start time and the status inputs, and is written only when one of
//! them changes meaningfully (new instance, reachability, start time, or the
//! instance's error ratio crossing the warning threshold): steady agents cause no
//! etcd writes beyond the lease keep-alive. When a replica dies its lease expires
//! and its publications go with it, unless its agents' new replica already
//! published them again.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, SystemTime};

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use crate::history::LeftReason;
use crate::store::peers::{Dropped, shown};
use meshcat_common::identity::IdentityReport;

use crate::store::{Member, Membership, RemoteInstance, Rules};
use meshcat_common::validate::{is_valid_instance, is_valid_name};

/// A publication, as stored in etcd.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Published {
    pub owner: String,
    pub start_time_ms: i64,
    pub reachable: bool,
    pub window_requests: u64,
    pub window_errors: u64,
    /// The drift hash, so every replica groups every instance by configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config_hashes: BTreeMap<String, String>,
    /// Set on the last publication of an instance that left, just before it is
    /// withdrawn: peers record why (a withdrawal alone says nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left: Option<LeftReason>,
    /// The instance's certificates (without its SAN expectations, which stay with
    /// the replica whose agent reports them), so every replica answers the same
    /// identity inventory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<IdentityReport>,
}

impl Published {
    /// Whether `self` differs from `before` in what a peer's status could show.
    fn differs(&self, before: &Published, warning: f64) -> bool {
        let erroring = |p: &Published| {
            p.window_requests > 0 && p.window_errors as f64 / p.window_requests as f64 > warning
        };
        self.owner != before.owner
            || self.start_time_ms != before.start_time_ms
            || self.reachable != before.reachable
            || self.config_hash != before.config_hash
            || self.identity != before.identity
            || erroring(self) != erroring(before)
    }

    pub fn remote(self, zone: &str, cluster: &str, instance: &str) -> RemoteInstance {
        RemoteInstance {
            owner: self.owner,
            zone: zone.to_owned(),
            cluster: cluster.to_owned(),
            instance: instance.to_owned(),
            start_time_ms: self.start_time_ms,
            reachable: self.reachable,
            window_requests: self.window_requests,
            window_errors: self.window_errors,
            config_hash: self.config_hash,
            config_hashes: self.config_hashes,
            identity: self.identity,
        }
    }
}

/// Checks a peer's publication of `zone/cluster/instance` as the ingest checks an
/// instance of a report: the zone and cluster names, the instance name, and its
/// owner, a replica id, held to the rules of a name.
pub fn check(zone: &str, cluster: &str, instance: &str, p: &Published) -> Result<(), Dropped> {
    if !is_valid_name(zone) || !is_valid_name(cluster) || !is_valid_instance(instance) {
        return Err(Dropped::new(
            "invalid_name",
            format!(
                "instance {}/{}/{}",
                shown(zone),
                shown(cluster),
                shown(instance)
            ),
        ));
    }
    if p.identity
        .as_ref()
        .is_some_and(|i| i.over_bound(0).is_some() || !i.expectations.is_empty())
    {
        return Err(Dropped::new(
            "invalid_identity",
            format!("identity of instance {zone}/{cluster}/{instance}"),
        ));
    }
    if !is_valid_name(&p.owner) {
        return Err(Dropped::new(
            "invalid_owner",
            format!(
                "owner {} of instance {zone}/{cluster}/{instance}",
                shown(&p.owner)
            ),
        ));
    }
    Ok(())
}

/// A random identity for this replica's run.
pub fn replica_id() -> String {
    let seed = (
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
        std::process::id(),
    );
    format!("{:016x}", RandomState::new().hash_one(seed))
}

enum Publish {
    Put(String, Published),
    Delete(String, LeftReason),
}

/// The [`Membership`] the live instances call on every report: it only queues; the
/// publisher task decides what reaches etcd.
#[derive(Debug)]
pub struct EtcdMembership {
    owner: String,
    prefix: String,
    tx: mpsc::UnboundedSender<Publish>,
}

impl std::fmt::Debug for Publish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Publish::Put(k, _) => write!(f, "Put({k})"),
            Publish::Delete(k, why) => write!(f, "Delete({k}, {why:?})"),
        }
    }
}

impl EtcdMembership {
    fn key(&self, zone: &str, cluster: &str, instance: &str) -> String {
        format!("{}/instances/{zone}/{cluster}/{instance}", self.prefix)
    }
}

impl Membership for EtcdMembership {
    fn publish(&self, m: Member<'_>) {
        let _ = self.tx.send(Publish::Put(
            self.key(m.zone, m.cluster, m.instance),
            Published {
                owner: self.owner.clone(),
                start_time_ms: m.start_time_ms,
                reachable: m.reachable,
                window_requests: m.window_requests,
                window_errors: m.window_errors,
                config_hash: m.config_hash.map(str::to_owned),
                config_hashes: m.config_hashes.clone(),
                left: None,
                identity: m.identity.map(|h| h.published()),
            },
        ));
    }

    fn withdraw(&self, zone: &str, cluster: &str, instance: &str, reason: LeftReason) {
        let _ = self
            .tx
            .send(Publish::Delete(self.key(zone, cluster, instance), reason));
    }
}

/// The publisher: owns the lease and the last publication of every owned instance.
pub struct Publisher {
    client: Client,
    prefix: String,
    owner: String,
    /// This replica's API address as peers reach it.
    advertise: String,
    ttl: Duration,
    warning: f64,
    rx: mpsc::UnboundedReceiver<Publish>,
    /// What etcd holds for each owned instance (as far as this replica knows).
    published: HashMap<String, Published>,
    /// Publications etcd has not confirmed yet (etcd was away): retried.
    dirty: bool,
    lease: Option<i64>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("owned", &self.published.len())
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// A membership for the live instances and the publisher task that serves it.
pub fn membership(
    client: Client,
    prefix: &str,
    owner: &str,
    advertise: &str,
    rules: Rules,
) -> (EtcdMembership, Publisher) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        EtcdMembership {
            owner: owner.to_owned(),
            prefix: prefix.to_owned(),
            tx,
        },
        Publisher {
            client,
            prefix: prefix.to_owned(),
            owner: owner.to_owned(),
            advertise: advertise.to_owned(),
            ttl: rules.instance_ttl,
            warning: rules.error_ratio_warning,
            rx,
            published: HashMap::new(),
            dirty: false,
            lease: None,
        },
    )
}

/// Most puts in one etcd transaction: etcd's default `--max-txn-ops` is 128.
const MAX_TXN_PUTS: usize = 128;
/// Most queued publications taken in one run.
const MAX_BATCH: usize = 4096;
/// Deadline of one etcd call of the publisher.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

impl Publisher {
    /// The lease, granted when missing (etcd's lease TTL is whole seconds).
    async fn lease(&mut self) -> Result<i64, String> {
        if let Some(l) = self.lease {
            return Ok(l);
        }
        let ttl = self.ttl.as_secs().max(2) as i64;
        let grant = self.client.lease_grant(ttl, None);
        let resp = tokio::time::timeout(CALL_TIMEOUT, grant)
            .await
            .map_err(|_| "lease grant timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        self.lease = Some(resp.id());
        // A new lease: everything owned must be written again under it, and this
        // replica's address, so peers can forward to it.
        self.dirty = true;
        let put = self.client.put(
            format!("{}/replicas/{}", self.prefix, self.owner),
            self.advertise.clone(),
            Some(PutOptions::new().with_lease(resp.id())),
        );
        tokio::time::timeout(CALL_TIMEOUT, put)
            .await
            .map_err(|_| "replica registration timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        Ok(resp.id())
    }

    /// Deletes a publication only while it is still ours (on our lease): an agent
    /// that moved on is published by its new replica, which must not be undone.
    /// The last publication, marked with why the instance left, goes first, on the
    /// same condition: peers learn the reason from it, and a peer that sees only
    /// the deletion (its watch was lost meanwhile) takes it as expired.
    async fn delete(&mut self, key: &str, last: Option<Published>) -> Result<(), String> {
        let Some(lease) = self.lease else {
            return Ok(());
        };
        let ours = || [Compare::lease(key, CompareOp::Equal, lease)];
        if let Some(last) = last {
            let value = serde_json::to_vec(&last).expect("publications serialise");
            let mark = Txn::new().when(ours()).and_then([TxnOp::put(
                key,
                value,
                Some(PutOptions::new().with_lease(lease)),
            )]);
            tokio::time::timeout(CALL_TIMEOUT, self.client.txn(mark))
                .await
                .map_err(|_| "withdrawal timed out".to_owned())?
                .map_err(|e| e.to_string())?;
        }
        let txn = Txn::new().when(ours()).and_then([TxnOp::delete(key, None)]);
        let call = self.client.txn(txn);
        tokio::time::timeout(CALL_TIMEOUT, call)
            .await
            .map_err(|_| "withdrawal timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Applies a run of queued publications: the changed ones are written together
    /// in one transaction (a burst of new agents costs a few etcd writes, not one
    /// per instance); withdrawals one by one, each conditional on our lease.
    async fn handle(&mut self, batch: Vec<Publish>) {
        let mut puts: Vec<(String, Published)> = Vec::new();
        for msg in batch {
            match msg {
                Publish::Put(key, p) => {
                    let changed = self
                        .published
                        .get(&key)
                        .is_none_or(|before| p.differs(before, self.warning));
                    if changed {
                        self.published.insert(key.clone(), p.clone());
                        puts.retain(|(k, _)| *k != key);
                        puts.push((key, p));
                    }
                }
                Publish::Delete(key, reason) => {
                    puts.retain(|(k, _)| *k != key);
                    let last = self.published.remove(&key).map(|p| Published {
                        reachable: false,
                        left: Some(reason),
                        ..p
                    });
                    if let Err(e) = self.delete(&key, last).await {
                        debug!(error = %e, "Instance withdrawal failed; the lease ends it.");
                    }
                }
            }
        }
        if !puts.is_empty()
            && let Err(e) = self.put_all(&puts).await
        {
            debug!(error = %e, "Instance publications postponed.");
            self.dirty = true;
        }
    }

    /// Writes publications under the lease, [`MAX_TXN_PUTS`] per transaction.
    async fn put_all(&mut self, puts: &[(String, Published)]) -> Result<(), String> {
        let lease = self.lease().await?;
        for chunk in puts.chunks(MAX_TXN_PUTS) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|(k, p)| {
                    let value = serde_json::to_vec(p).expect("publications serialise");
                    TxnOp::put(k.as_str(), value, Some(PutOptions::new().with_lease(lease)))
                })
                .collect();
            let txn = self.client.txn(Txn::new().and_then(ops));
            tokio::time::timeout(CALL_TIMEOUT, txn)
                .await
                .map_err(|_| "publication timed out".to_owned())?
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Keeps the lease alive (every second, or a third of a shorter TTL), writes what is
    /// dirty, and revokes the lease on `stop` so peers drop this replica's instances at
    /// once. Frequent keep-alives make a dead replica's lease end close to a full TTL
    /// after its death, not two thirds of it: its agents have that long to move to
    /// another replica before their instances would disappear from the peers. A
    /// keep-alive is not a write to etcd's key space and costs one small request.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let every = (self.ttl / 3).clamp(Duration::from_millis(300), Duration::from_secs(1));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // `changed` rather than `wait_for`: no borrow of the flag lives across the
        // handlers' awaits.
        while !*stop.borrow() {
            tokio::select! {
                msg = self.rx.recv() => match msg {
                    Some(m) => {
                        // Take what queued meanwhile too: one transaction for a burst.
                        let mut batch = vec![m];
                        while batch.len() < MAX_BATCH
                            && let Ok(m) = self.rx.try_recv()
                        {
                            batch.push(m);
                        }
                        self.handle(batch).await;
                    }
                    None => return,
                },
                _ = tick.tick() => self.refresh().await,
                r = stop.changed() => if r.is_err() { break },
            }
        }
        if let Some(lease) = self.lease {
            let revoke = self.client.lease_revoke(lease);
            let _ = tokio::time::timeout(CALL_TIMEOUT, revoke).await;
        }
    }

    async fn refresh(&mut self) {
        if let Some(lease) = self.lease {
            let alive = async {
                let (mut keeper, mut stream) = self
                    .client
                    .lease_keep_alive(lease)
                    .await
                    .map_err(|e| e.to_string())?;
                keeper.keep_alive().await.map_err(|e| e.to_string())?;
                let resp = stream
                    .message()
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("no keep-alive answer")?;
                Ok::<i64, String>(resp.ttl())
            };
            match tokio::time::timeout(CALL_TIMEOUT, alive).await {
                Ok(Ok(ttl)) if ttl > 0 => {}
                Ok(Ok(_)) => {
                    // Expired while etcd was away: a new lease, everything again.
                    warn!("Instance lease expired; publishing under a new one.");
                    self.lease = None;
                    self.dirty = true;
                }
                Ok(Err(e)) => debug!(error = %e, "Lease keep-alive failed."),
                Err(_) => debug!("Lease keep-alive timed out."),
            }
        }
        if self.dirty {
            self.dirty = false;
            let all: Vec<(String, Published)> = self
                .published
                .iter()
                .map(|(k, p)| (k.clone(), p.clone()))
                .collect();
            if let Err(e) = self.put_all(&all).await {
                debug!(error = %e, "Instance publications postponed.");
                self.dirty = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(owner: &str, reachable: bool, req: u64, err: u64) -> Published {
        Published {
            owner: owner.into(),
            start_time_ms: 1,
            reachable,
            window_requests: req,
            window_errors: err,
            config_hash: None,
            config_hashes: BTreeMap::new(),
            left: None,
            identity: None,
        }
    }

    #[test]
    fn steady_reports_are_not_written_again() {
        let warning = 0.05;
        let base = p("a", true, 100, 1);
        // New counts on the same side of the threshold: nothing to publish.
        assert!(!p("a", true, 250, 3).differs(&base, warning));
        assert!(!p("a", true, 0, 0).differs(&base, warning));
        // What a peer's status could show does change.
        assert!(p("a", true, 100, 10).differs(&base, warning));
        assert!(p("a", false, 100, 1).differs(&base, warning));
        assert!(p("b", true, 100, 1).differs(&base, warning));
        let mut restarted = base.clone();
        restarted.start_time_ms = 2;
        assert!(restarted.differs(&base, warning));
        let mut reconfigured = base.clone();
        reconfigured.config_hash = Some("0123456789abcdef".into());
        assert!(reconfigured.differs(&base, warning));
    }

    #[test]
    fn publications_of_older_replicas_still_read() {
        let old = br#"{"owner":"a","startTimeMs":1,"reachable":true,"windowRequests":0,"windowErrors":0}"#;
        let p: Published = serde_json::from_slice(old).unwrap();
        assert_eq!((p.config_hash, p.left), (None, None));
        let mut marked = base_marked();
        marked.left = Some(LeftReason::Disconnected);
        let text = serde_json::to_string(&marked).unwrap();
        assert!(text.contains(r#""left":"disconnected""#), "{text}");
    }

    fn base_marked() -> Published {
        p("a", false, 0, 0)
    }

    /// A report's hashes reach the other replicas only in the agent's form: the
    /// store publishes what it sanitised, not what the agent sent.
    #[test]
    fn publications_carry_only_well_formed_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, instances) = crate::store::Store::open(dir.path(), Rules::defaults()).unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        instances
            .set_membership(std::sync::Arc::new(EtcdMembership {
                owner: "me".into(),
                prefix: "/meshcat".into(),
                tx,
            }))
            .unwrap();
        let report = |hash: String| {
            let mut r =
                meshcat_common::wire::InstanceReport::unread("z".into(), "a".into(), "i".into());
            r.reachable = true;
            r.start_time_ms = 1;
            r.config_hash = Some(hash);
            r.config_hashes = [
                ("routes", "0a"),
                ("x-injected", "00"),
                ("clusters", "zz"),
                ("listeners", &"1".repeat(65)),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
            r
        };
        let published = |rx: &mut mpsc::UnboundedReceiver<Publish>| match rx.try_recv() {
            Ok(Publish::Put(_, p)) => p,
            other => panic!("a publication, not {other:?}"),
        };
        instances.apply_report(
            "agent",
            report("0123456789abcdef".into()),
            std::time::Instant::now(),
        );
        let p = published(&mut rx);
        assert_eq!(p.config_hash.as_deref(), Some("0123456789abcdef"));
        assert_eq!(
            p.config_hashes,
            BTreeMap::from([("routes".to_owned(), "0a".to_owned())])
        );
        instances.apply_report("agent", report("g".repeat(16)), std::time::Instant::now());
        let p = published(&mut rx);
        assert_eq!(p.config_hash, None);
        assert!(p.config_hashes.is_empty());
    }

    #[test]
    fn replica_ids_differ() {
        assert_ne!(replica_id(), replica_id());
        assert_eq!(replica_id().len(), 16);
    }
}
