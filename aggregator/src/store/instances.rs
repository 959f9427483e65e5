//! The live instances ([`Instances`]): the snapshots agents report and the instances
//! other replicas publish, which agent reports each instance (the one owner of that
//! fact: the ingest routes commands by asking here), the instance budget, expiry past
//! the TTL, the history entries instances make (joined, left, restarted, another
//! configuration, drift), the lookups of their reports, metrics and owners, the edge
//! clusters reported per zone, and the [`Membership`] seam where a replica publishes
//! the instances it owns.

use std::cell::RefCell;
use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use meshcat_common::model::InstanceMetrics;
use meshcat_common::validate::is_valid_name;
use meshcat_common::wire::{InstanceReport, STALE_BASE, XdsState};
use tracing::{debug, warn};

use super::clusterset::ClusterSet;
use super::identity::{HeldIdentity, Identities};
use super::publish::Touch;
use super::traffic::Traffic;
use super::{Entry, MAX_EDGE_CLUSTERS, Memory, shared};
use crate::history::{Detail, Kind, LeftReason, Pending};
use crate::ingest::{InstanceBounds, InstanceSize};
pub use crate::ingest::{InstanceKey, InstanceRefusal};
use meshcat_common::identity::{CertState, IdentityReport};

/// What a metrics lookup found.
#[derive(Debug)]
pub enum MetricsLookup {
    NoCluster,
    NoInstance,
    Found(Box<InstanceMetrics>),
}

/// Most reported instances kept at once: reports for further new instances are
/// dropped (and logged) until others expire, so no set of agents can exhaust memory.
pub const MAX_INSTANCES: u64 = 200_000;

/// One instance as its agent last reported it. The fields read on every
/// report are kept apart, the graph's fields (upstream traffic, listeners, local
/// cluster) in [`super::traffic`]; the rest of the report (metrics, upstream
/// clusters, admin address) is kept packed, as MessagePack, and unpacked only when read: decoded, a
/// report's strings and vectors cost several times its encoded size, and a fleet's
/// instances are read far less often than they are reported.
#[derive(Debug, Clone)]
pub struct LiveInstance {
    /// Who reports it: an agent of this replica (`agent_gone` drops only that
    /// agent's instances), or another replica that owns it.
    pub reporter: Reporter,
    /// When the last report arrived, for the TTL.
    pub last_seen: Instant,
    /// Requests in the window between the last two reports.
    pub window_requests: u64,
    /// 5xx answers in the same window.
    pub window_errors: u64,
    /// Whether the agent reached the sidecar's admin interface.
    pub reachable: bool,
    /// When the sidecar started (ms since the epoch).
    pub start_time_ms: i64,
    /// The hash of the sidecar's effective configuration (drift), when its agent
    /// sends one.
    pub config_hash: Option<Arc<str>>,
    /// The sidecar's request and 5xx counters, for the next report's window.
    requests_total: u64,
    errors_5xx_total: u64,
    /// The number of the last report applied, the base of the agent's next delta.
    seq: u64,
    /// The sidecar's upstream clusters and their host sets.
    clusters: Arc<ClusterSet>,
    /// How many of each bounded set the catalog keeps of it: the next delta's
    /// result is checked against the bounds from these.
    held: InstanceSize,
    /// The sidecar's xDS state, read on every report by the sync without unpacking.
    xds: Option<XdsState>,
    /// Its certificates and SAN expectations (contract section 19), kept apart from
    /// the packed report: read by every record rendered, shared with the cluster's
    /// other instances where equal.
    pub identity: Option<Arc<HeldIdentity>>,
    /// Its identity state when last looked at, for the history's
    /// `certificate-state` (the state shown is read at the time of reading).
    pub identity_state: CertState,
    /// The last report without its upstream clusters and graph fields, packed.
    packed: Box<[u8]>,
}

impl LiveInstance {
    /// The report is encoded into this thread's scratch buffer and copied out in one
    /// allocation of its exact size, where growing a fresh vector would reallocate it
    /// several times per instance.
    fn new(
        reporter: Reporter,
        now: Instant,
        window: (u64, u64),
        report: &InstanceReport,
        clusters: Arc<ClusterSet>,
        held: InstanceSize,
    ) -> Self {
        thread_local! {
            static SCRATCH: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(PACK_SCRATCH));
        }
        let packed = SCRATCH.with_borrow_mut(|scratch| {
            scratch.clear();
            // Positional MessagePack, as on the wire: a decoded report always encodes.
            rmp_serde::encode::write(scratch, report).expect("an instance report encodes");
            let packed = Box::from(scratch.as_slice());
            // An outsized report does not keep its buffer.
            if scratch.capacity() > 4 * PACK_SCRATCH {
                *scratch = Vec::with_capacity(PACK_SCRATCH);
            }
            packed
        });
        LiveInstance {
            reporter,
            last_seen: now,
            window_requests: window.0,
            window_errors: window.1,
            reachable: report.reachable,
            start_time_ms: report.start_time_ms,
            // Sanitised where the report came in (`sanitise_hashes`).
            config_hash: report.config_hash.as_deref().map(Arc::from),
            requests_total: report.requests_total,
            errors_5xx_total: report.errors_5xx_total,
            seq: report.seq,
            clusters,
            held,
            xds: report.xds.clone(),
            identity: None,
            identity_state: CertState::None,
            packed,
        }
    }

    /// The sidecar's xDS state as last reported.
    pub fn xds(&self) -> Option<&XdsState> {
        self.xds.as_ref()
    }

    /// The sidecar's upstream clusters as last reported.
    pub fn clusters(&self) -> &Arc<ClusterSet> {
        &self.clusters
    }

    /// How many of each bounded set the catalog keeps of it.
    pub fn held(&self) -> InstanceSize {
        self.held
    }

    /// The last report, unpacked (its upstream clusters in [`Self::clusters`], its
    /// graph fields in [`super::traffic`]).
    pub fn report(&self) -> InstanceReport {
        rmp_serde::from_slice(&self.packed).expect("the store packed this report itself")
    }

    /// Live: reported within the TTL (expiry removes the others) and reachable.
    pub fn is_live(&self) -> bool {
        self.reachable
    }

    /// Owned by another replica (shown from what it published): its metrics and
    /// sidecar are with that replica.
    pub fn is_remote(&self) -> bool {
        matches!(self.reporter, Reporter::Replica(_))
    }

    /// The replica that owns it, when another replica does.
    pub fn owner(&self) -> Option<&str> {
        match &self.reporter {
            Reporter::Replica(r) => Some(r),
            Reporter::Agent(_) => None,
        }
    }

    /// Whether agent `id` of this replica reports it.
    fn reported_by(&self, id: &str) -> bool {
        matches!(&self.reporter, Reporter::Agent(a) if &**a == id)
    }
}

/// Who reports an instance. Agent ids and replica ids are separate name spaces: an
/// agent may carry any valid name, a replica's included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reporter {
    /// An agent connected to this replica, by its id; shared by the instances of
    /// one report.
    Agent(Arc<str>),
    /// Another replica, by its id, that owns the instance and published it.
    Replica(Arc<str>),
}

/// Who reports one zone's instances, as this replica sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ZoneReporters {
    pub zone_name: String,
    /// Whether the zone is registered (agents may report into a zone nobody
    /// registered).
    pub registered: bool,
    /// Agents connected to this replica that report at least one instance of the zone.
    pub agents: u64,
    /// Instances of the zone those agents report (live or not, within the TTL).
    pub instances: u64,
    /// Instances of the zone that agents of other replicas report, from what those
    /// replicas publish in etcd; always 0 with one aggregator.
    pub peer_instances: u64,
}

/// An instance another replica owns, as it published it.
#[derive(Debug, Clone)]
pub struct RemoteInstance {
    pub owner: String,
    pub zone: String,
    pub cluster: String,
    pub instance: String,
    pub start_time_ms: i64,
    pub reachable: bool,
    pub window_requests: u64,
    pub window_errors: u64,
    /// The drift hash and its per-kind hashes, when the owner's agent sends them.
    pub config_hash: Option<String>,
    pub config_hashes: std::collections::BTreeMap<String, String>,
    /// Its certificates, when its agent read them (no SAN expectations).
    pub identity: Option<IdentityReport>,
}

/// An instance this replica owns, as published to its peers.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    pub zone: &'a str,
    pub cluster: &'a str,
    pub instance: &'a str,
    pub start_time_ms: i64,
    pub reachable: bool,
    pub window_requests: u64,
    pub window_errors: u64,
    pub config_hash: Option<&'a str>,
    pub config_hashes: &'a std::collections::BTreeMap<String, String>,
    /// Its certificates, when its agent read them.
    pub identity: Option<&'a HeldIdentity>,
}

/// Where a replica publishes instance membership so that replicas sharing a backend
/// show the same instances. A single aggregator has none.
pub trait Membership: Send + Sync + fmt::Debug {
    /// An owned instance was reported (new, or with new status inputs).
    fn publish(&self, member: Member<'_>);
    /// An owned instance is gone (expired, or its agent left), for `reason`.
    fn withdraw(&self, zone: &str, cluster: &str, instance: &str, reason: LeftReason);
}

/// A live instance of a cluster and where it is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveOwner {
    pub instance: String,
    /// The replica that owns it; `None` when an agent of this replica reports it.
    pub owner: Option<String>,
}

/// The live instances: what agents and peers report, beside the catalog. Each
/// instance is kept in its (zone, cluster) entry of the shared index, with that
/// cluster's registration and status; here is who reports which instance, the
/// instance budget, the expiry wheel, where owned instances are published, and the
/// traffic their reports carry.
#[derive(Debug)]
pub struct Instances {
    /// The index shared with the catalog.
    pub(super) memory: Arc<Memory>,
    /// The instances each agent reports, so `agent_gone` visits only those.
    agents: DashMap<String, HashSet<InstanceKey>>,
    /// Reported instances kept (live or not), bounded by [`MAX_INSTANCES`].
    total: AtomicU64,
    /// Where owned instances are published, when replicas share them.
    membership: OnceLock<Arc<dyn Membership>>,
    /// The agents that reported, in buckets by time: expiry looks at an agent's
    /// instances only once a bucket it is in is older than the TTL. An agent is in one
    /// bucket per report it sent within the TTL, so the work follows the report rate.
    wheel: Mutex<VecDeque<Bucket>>,
    /// What each instance's sidecar saw of its upstreams, for the graph: the part of
    /// each report that is not kept with the instance.
    traffic: Arc<Traffic>,
}

/// Agents that reported between `first` and `last`.
#[derive(Debug)]
struct Bucket {
    first: Instant,
    last: Instant,
    agents: Vec<Arc<str>>,
}

/// How much time one bucket of the wheel spans: expiry is that much late at most.
const BUCKET_SPAN: Duration = Duration::from_millis(250);

/// What became of one snapshot.
enum Put {
    /// Not applied, with the reason: held by another reporter that may not be
    /// displaced (`instance_in_use`), a delta whose base is not the held report
    /// ([`STALE_BASE`]), what would be kept of it past a per-instance bound, or no
    /// room for another instance (`catalog_full`).
    Refused(InstanceRefusal),
    /// Stored, under `key` (made of the report's own names, which the entry keeps
    /// no copy of); `shown` when a reader sees the change; `drift` when the
    /// cluster's drift may have moved (a configuration or a live instance with one
    /// changed).
    Done {
        key: InstanceKey,
        shown: bool,
        joined: Option<Joined>,
        drift: bool,
    },
}

impl Put {
    fn refused(
        report: &InstanceReport,
        reason: &'static str,
        kept: bool,
        over: Option<crate::ingest::OverBound>,
    ) -> Put {
        Put::Refused(InstanceRefusal {
            key: InstanceKey::of(report),
            reason,
            kept,
            over,
        })
    }
}

/// An instance the reporting agent did not report before: its name, and the agent
/// that reported it until now, if any.
struct Joined {
    instance: String,
    previous: Option<Arc<str>>,
}

/// An instance as a report (or a peer's publication) shows it now, for the history.
struct Seen<'a> {
    zone: &'a str,
    cluster: &'a str,
    instance: &'a str,
    reachable: bool,
    start_time_ms: i64,
    config_hash: Option<&'a str>,
    config_hashes: &'a std::collections::BTreeMap<String, String>,
}

/// Room for one packed instance report (about 500 bytes for a real-shaped one) in
/// each thread's scratch buffer.
const PACK_SCRATCH: usize = 2048;

impl Instances {
    /// The live instances kept in `memory`, with no instance yet.
    pub(super) fn new(memory: Arc<Memory>) -> Instances {
        let traffic =
            Arc::new(Traffic::new(memory.rules.graph_window).remapping(memory.remaps.clone()));
        Instances {
            memory,
            agents: DashMap::new(),
            total: AtomicU64::new(0),
            membership: OnceLock::new(),
            wheel: Mutex::new(VecDeque::new()),
            traffic,
        }
    }

    /// The traffic the instances' reports carried, which the graph is drawn from.
    pub fn traffic(&self) -> &Arc<Traffic> {
        &self.traffic
    }

    /// Takes one more instance into the budget, or says it is full.
    fn admit(&self) -> bool {
        if self.total.fetch_add(1, Ordering::AcqRel) >= MAX_INSTANCES {
            self.total.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Notes that `agent` reported at `now`.
    fn due(&self, agent: &Arc<str>, now: Instant) {
        let mut wheel = self.wheel.lock().unwrap_or_else(|p| p.into_inner());
        match wheel.back_mut() {
            Some(b) if now.saturating_duration_since(b.first) < BUCKET_SPAN => {
                b.last = b.last.max(now);
                b.agents.push(agent.clone());
            }
            _ => wheel.push_back(Bucket {
                first: now,
                last: now,
                agents: vec![agent.clone()],
            }),
        }
    }

    /// The agents of every bucket whose last report is older than `ttl`, once each.
    fn take_due(&self, now: Instant, ttl: Duration) -> Vec<Arc<str>> {
        let mut out = Vec::new();
        let mut wheel = self.wheel.lock().unwrap_or_else(|p| p.into_inner());
        while wheel
            .front()
            .is_some_and(|b| now.saturating_duration_since(b.last) > ttl)
        {
            out.extend(wheel.pop_front().expect("checked").agents);
        }
        drop(wheel);
        out.sort_unstable();
        out.dedup();
        out
    }
}

impl Instances {
    /// Publishes owned instances through `m` from now on (set once).
    pub fn set_membership(&self, m: Arc<dyn Membership>) -> Result<(), Arc<dyn Membership>> {
        self.membership.set(m)
    }

    /// Records one instance snapshot from an agent.
    pub fn apply_report(&self, agent_id: &str, report: InstanceReport, now: Instant) {
        self.apply_reports(agent_id, vec![report], now);
    }

    /// Records the instance snapshots of one report from an agent, taking over every
    /// instance another reporter had, within the default bounds.
    pub fn apply_reports(&self, agent_id: &str, reports: Vec<InstanceReport>, now: Instant) {
        self.apply_reports_guarded(
            agent_id,
            reports,
            now,
            &|_| true,
            &InstanceBounds::default(),
        );
    }

    /// Records the instance snapshots of one report from an agent; their names were
    /// validated by the ingest. Reports for clusters nobody registered are kept too:
    /// they show in `GET /services`. Each (zone, cluster) entry is locked once for the
    /// run of snapshots that name it, and its status is recomputed from running sums.
    ///
    /// An instance that another agent reports is taken over only when
    /// `may_take(that agent)` allows it, decided under the entry's lock; the
    /// instances refused are answered with their reason, and the rest of the report
    /// applies. Another replica's instance is always taken over (its
    /// agent moved here). An instance whose kept state would pass one of the `bounds`
    /// once its snapshot (a delta adds to what is kept) is applied is refused too,
    /// and keeps what it had.
    pub fn apply_reports_guarded(
        &self,
        agent_id: &str,
        reports: Vec<InstanceReport>,
        now: Instant,
        may_take: &dyn Fn(&str) -> bool,
        bounds: &InstanceBounds,
    ) -> Vec<InstanceRefusal> {
        self.apply_reports_noting(agent_id, reports, now, may_take, bounds, &mut |_| {})
    }

    /// [`Instances::apply_reports_guarded`], handing `applied` the key of every
    /// instance stored once the report is applied and published. The keys are made
    /// of the report's own names (moved, not copied), so a caller that needs them
    /// owned does not build them again.
    pub fn apply_reports_noting(
        &self,
        agent_id: &str,
        reports: Vec<InstanceReport>,
        now: Instant,
        may_take: &dyn Fn(&str) -> bool,
        bounds: &InstanceBounds,
        applied: &mut dyn FnMut(InstanceKey),
    ) -> Vec<InstanceRefusal> {
        let _st = shared(&self.memory.state);
        let mut refused = Vec::new();
        let agent: Arc<str> = Arc::from(agent_id);
        let mut visible = false;
        let mut stored = false;
        let mut touched: Vec<Touch> = Vec::new();
        // Only instances new to this agent go into its set: the set already holds
        // every instance whose stored agent is this one, so a steady report
        // allocates no keys.
        let mut joined: Vec<InstanceKey> = Vec::new();
        let mut moved: Vec<(Arc<str>, InstanceKey)> = Vec::new();
        let mut done: Vec<InstanceKey> = Vec::with_capacity(reports.len());
        let mut reports = reports.into_iter().peekable();
        while let Some(first) = reports.next() {
            let zone = first.zone_name.clone();
            let cluster = first.cluster_name.clone();
            let mut by_zone = self
                .memory
                .clusters
                .entry(cluster.clone())
                .or_insert_with(super::new_by_zone);
            let e = by_zone.entry(zone.clone()).or_insert_with(Entry::new);
            let before = (e.status, e.live());
            let mut shown_here = false;
            let mut drift_here = false;
            let mut report = Some(first);
            while let Some(r) = report.take() {
                match self.put_instance(e, &agent, r, now, may_take, bounds) {
                    Put::Refused(r) => refused.push(r),
                    Put::Done {
                        key,
                        shown,
                        joined: j,
                        drift,
                    } => {
                        done.push(key);
                        stored = true;
                        shown_here |= shown;
                        drift_here |= drift;
                        if let Some(j) = j {
                            let key = InstanceKey {
                                zone: zone.clone(),
                                cluster: cluster.clone(),
                                instance: j.instance,
                            };
                            if let Some(p) = j.previous {
                                moved.push((p, key.clone()));
                            }
                            joined.push(key);
                        }
                    }
                }
                report = reports.next_if(|n| n.zone_name == zone && n.cluster_name == cluster);
            }
            self.memory.refresh(e, before);
            if drift_here {
                self.note_drift(&zone, &cluster, e);
            }
            shown_here |= before.0 != e.status;
            visible |= shown_here;
            if e.record.is_some() {
                self.memory
                    .count_change(&zone, before, (e.status, e.live()));
                if shown_here {
                    touched.push(Touch::Cluster(zone, cluster));
                }
            }
        }
        for (other, key) in moved {
            if let Some(mut keys) = self.agents.get_mut(&*other) {
                keys.remove(&key);
            }
        }
        if !joined.is_empty() {
            self.agents
                .entry(agent_id.to_owned())
                .or_default()
                .extend(joined);
        }
        if stored {
            self.due(&agent, now);
        }
        // Reports for clusters nobody registered move only `GET /services`: the
        // index, no event.
        if visible {
            self.memory.publish(&touched);
        }
        done.into_iter().for_each(applied);
        refused
    }

    /// Puts one snapshot into its entry, keeping the entry's live sums; the caller
    /// recomputes the status once for the run.
    fn put_instance(
        &self,
        e: &mut Entry,
        agent: &Arc<str>,
        mut report: InstanceReport,
        now: Instant,
        may_take: &dyn Fn(&str) -> bool,
        bounds: &InstanceBounds,
    ) -> Put {
        super::drift::sanitise_hashes(&mut report.config_hash, &mut report.config_hashes);
        let prev = e.instances.get(&report.instance);
        if let Some(Reporter::Agent(other)) = prev.map(|p| &p.reporter)
            && other != agent
            && !may_take(other)
        {
            return Put::refused(&report, "instance_in_use", false, None);
        }
        // Host keys are kept for the clusters whose upstreams carry traffic: the
        // graph matches only those against listener addresses.
        let used: HashSet<&str> = report.upstreams.iter().map(|u| u.name.as_str()).collect();
        // A delta applies only on top of the report it was made against, from the
        // same agent: anything else (a report lost, another replica, a restart of
        // the aggregator) is refused so that the agent sends the whole state. A
        // steady one keeps the set as it is, shared.
        let clusters = match &report.delta {
            None => Arc::new(ClusterSet::full(&report.clusters, |n| used.contains(n))),
            Some(d) => match prev {
                Some(p) if p.reported_by(agent) && p.seq == d.base => {
                    if report.clusters.is_empty() && d.removed_clusters.is_empty() {
                        p.clusters.clone()
                    } else {
                        Arc::new(p.clusters.apply(&report.clusters, d, |n| used.contains(n)))
                    }
                }
                _ => return Put::refused(&report, STALE_BASE, true, None),
            },
        };
        let mut held = self.held_after(prev, &report, &clusters, bounds);
        if let Err(over) = bounds.check(&held) {
            let kept = prev.is_some_and(|p| p.reported_by(agent));
            return Put::refused(&report, over.reason(), kept, Some(over));
        }
        report.clusters = Vec::new();
        // A delta without an identity keeps the one held; a whole report without one
        // has none read yet.
        let identity: Option<Arc<HeldIdentity>> = match report.identity.take() {
            Some(r) => Some(Arc::new(HeldIdentity::hold(
                r,
                e.instances.values().filter_map(|i| i.identity.as_deref()),
            ))),
            None if report.delta.is_some() => prev.and_then(|p| p.identity.clone()),
            None => None,
        };
        if prev.is_none() && !self.admit() {
            warn!(agent_id = %agent, zone = %report.zone_name, cluster = %report.cluster_name, instance = %report.instance, limit = MAX_INSTANCES, "Instance report dropped: too many instances.");
            return Put::refused(&report, "catalog_full", false, None);
        }
        let (window_requests, window_errors) = match prev {
            Some(p) if report.requests_total >= p.requests_total => (
                report.requests_total - p.requests_total,
                report.errors_5xx_total.saturating_sub(p.errors_5xx_total),
            ),
            // A restarted sidecar counts from zero again: all it counted is new.
            Some(_) => (report.requests_total, report.errors_5xx_total),
            None => (0, 0),
        };
        let identity_state = self.note_identity_of(prev, &report, identity.as_deref(), now);
        let identity_moved = match (prev.and_then(|p| p.identity.as_ref()), &identity) {
            (Some(a), Some(b)) => !Arc::ptr_eq(a, b),
            (a, b) => a.is_some() != b.is_some(),
        };
        let shown = match prev {
            None => report.reachable,
            Some(p) => {
                p.reachable != report.reachable
                    || p.start_time_ms != report.start_time_ms
                    || (report.reachable && (identity_moved || p.identity_state != identity_state))
            }
        };
        let drift = self.note_instance(
            prev,
            now,
            &Seen {
                zone: &report.zone_name,
                cluster: &report.cluster_name,
                instance: &report.instance,
                reachable: report.reachable,
                start_time_ms: report.start_time_ms,
                config_hash: report.config_hash.as_deref(),
                config_hashes: &report.config_hashes,
            },
        );
        let joined = match prev.map(|p| &p.reporter) {
            Some(Reporter::Agent(same)) if same == agent => None,
            previous => Some(Joined {
                instance: report.instance.clone(),
                previous: match previous {
                    Some(Reporter::Agent(other)) => Some(other.clone()),
                    _ => None,
                },
            }),
        };
        if let Some(m) = self.membership.get() {
            m.publish(Member {
                zone: &report.zone_name,
                cluster: &report.cluster_name,
                instance: &report.instance,
                start_time_ms: report.start_time_ms,
                reachable: report.reachable,
                window_requests,
                window_errors,
                config_hash: report.config_hash.as_deref(),
                config_hashes: &report.config_hashes,
                identity: identity.as_deref(),
            });
        }
        // The graph's fields move to the traffic: the packed report goes without them.
        held.upstreams = self.traffic.record_with(&mut report, &clusters, now);
        report.delta = None;
        let mut fresh = LiveInstance::new(
            Reporter::Agent(agent.clone()),
            now,
            (window_requests, window_errors),
            &report,
            clusters,
            held,
        );
        fresh.identity = identity;
        fresh.identity_state = identity_state;
        e.count(&fresh, true);
        // A held instance keeps its name in the map; the report's goes to the key.
        let old = match e.instances.get_mut(&report.instance) {
            Some(held) => Some(std::mem::replace(held, fresh)),
            None => {
                e.instances.insert(report.instance.clone(), fresh);
                None
            }
        };
        if let Some(old) = old {
            e.count(&old, false);
        }
        if identity_moved {
            super::identity::schedule(&self.memory, &report.zone_name, &report.cluster_name, e);
            self.traffic.reshaped();
        }
        Put::Done {
            key: InstanceKey {
                zone: report.zone_name,
                cluster: report.cluster_name,
                instance: report.instance,
            },
            shown,
            joined,
            drift,
        }
    }

    /// Notes in the history what an instance's identity changes (rotations, its state)
    /// when its sidecar answers; answers the state to keep with it.
    fn note_identity_of(
        &self,
        prev: Option<&LiveInstance>,
        report: &InstanceReport,
        identity: Option<&HeldIdentity>,
        now: Instant,
    ) -> CertState {
        if !report.reachable {
            return prev.map_or(CertState::None, |p| p.identity_state);
        }
        super::identity::note_identity(
            &self.memory,
            (&report.zone_name, &report.cluster_name, &report.instance),
            prev.filter(|p| p.is_live())
                .map(|p| (p.identity.as_deref(), p.identity_state)),
            identity,
            now,
        )
    }

    /// The identity inventory of the live instances (`GET /certificates`, its
    /// metrics and the clock of certificate states).
    pub fn identities(&self) -> Identities<'_> {
        Identities {
            memory: &self.memory,
        }
    }

    /// How many of each bounded set the catalog would keep of the instance once
    /// `report` is applied on top of `prev` (its upstream clusters `clusters`, merged
    /// already). A whole report keeps what it carries; a delta keeps what it sends
    /// and what it leaves of the held state. The upstreams with traffic are counted
    /// from the held ones and the delta's at most, and exactly (a walk of the held
    /// names) only when that is over the bound.
    fn held_after(
        &self,
        prev: Option<&LiveInstance>,
        report: &InstanceReport,
        clusters: &ClusterSet,
        bounds: &InstanceBounds,
    ) -> InstanceSize {
        let sent = InstanceSize::sent(report);
        let mut held = InstanceSize {
            clusters: u32::try_from(clusters.len()).unwrap_or(u32::MAX),
            cluster_hosts: u32::try_from(clusters.hosts()).unwrap_or(u32::MAX),
            ..sent
        };
        let (Some(d), Some(p)) = (&report.delta, prev) else {
            return held;
        };
        if d.listeners_unchanged {
            (held.listeners, held.routes) = (p.held.listeners, p.held.routes);
        }
        let most = u64::from(p.held.upstreams) + u64::from(sent.upstreams);
        held.upstreams = if most > bounds.limit(crate::ingest::Bounded::Upstreams) {
            let key = InstanceKey::of(report);
            let n = self
                .traffic
                .upstreams_after(&key, &report.upstreams, &d.removed_upstreams);
            u32::try_from(n).unwrap_or(u32::MAX)
        } else {
            u32::try_from(most).unwrap_or(u32::MAX)
        };
        held
    }

    /// Notes in the history what `next` changes of an instance last seen as `prev`
    /// at `now`: it joined (new and live, or live again), left (its sidecar stopped
    /// answering), restarted (its start time moved), or runs another configuration;
    /// within the instance's allowance a minute, past which its changes are summed
    /// into one `instance-flapping` entry a minute (see `crate::history::limit`).
    /// Returns whether the cluster's drift may have moved.
    fn note_instance(&self, prev: Option<&LiveInstance>, now: Instant, next: &Seen<'_>) -> bool {
        let Some(history) = self.memory.history.get() else {
            return false;
        };
        let entry = |kind, detail| {
            history.record_instance(
                Pending::new(kind, next.zone, next.cluster, next.instance, detail),
                now,
            );
        };
        let joined = Detail::Joined {
            start_time: next.start_time_ms,
        };
        let Some(p) = prev else {
            if next.reachable {
                entry(Kind::InstanceJoined, joined);
            }
            return next.reachable && next.config_hash.is_some();
        };
        match (p.reachable, next.reachable) {
            (true, false) => entry(
                Kind::InstanceLeft,
                Detail::Left {
                    reason: LeftReason::Unreachable,
                },
            ),
            (false, true) => entry(Kind::InstanceJoined, joined),
            _ => {}
        }
        if next.reachable
            && p.start_time_ms != next.start_time_ms
            && p.start_time_ms != 0
            && next.start_time_ms != 0
        {
            entry(
                Kind::InstanceRestarted,
                Detail::Restarted {
                    start_time: next.start_time_ms,
                    previous_start_time: p.start_time_ms,
                },
            );
        }
        let hash_moved = p.config_hash.as_deref() != next.config_hash;
        if let (Some(from), Some(to)) = (&p.config_hash, next.config_hash)
            && **from != *to
        {
            let before = p.report().config_hashes;
            let mut resources: Vec<String> = before
                .keys()
                .chain(next.config_hashes.keys())
                .filter(|k| before.get(*k) != next.config_hashes.get(*k))
                .cloned()
                .collect();
            resources.sort();
            resources.dedup();
            entry(
                Kind::ConfigChanged,
                Detail::Config {
                    from: from.to_string(),
                    to: to.to_owned(),
                    resources,
                },
            );
        }
        hash_moved || (p.reachable != next.reachable && next.config_hash.is_some())
    }

    /// Notes `drift-started` or `drift-ended` when the live instances of `e` went
    /// from one configuration to several or back; the caller holds `e`'s guard.
    fn note_drift(&self, zone: &str, cluster: &str, e: &mut Entry) {
        let drifted = super::drift::drifted(e.instances.values());
        if drifted == e.drifted {
            return;
        }
        e.drifted = drifted;
        let kind = if drifted {
            Kind::DriftStarted
        } else {
            Kind::DriftEnded
        };
        let groups = super::drift::group_details(e);
        self.memory
            .note(|| Pending::new(kind, zone, cluster, "", Detail::Drift { groups }));
    }

    /// Shows (or updates) an instance another replica owns. The shared store is the
    /// truth: its latest publication replaces whatever this replica had.
    pub fn put_remote(&self, mut r: RemoteInstance) {
        super::drift::sanitise_hashes(&mut r.config_hash, &mut r.config_hashes);
        let _st = shared(&self.memory.state);
        let touched = {
            let mut by_zone = self
                .memory
                .clusters
                .entry(r.cluster.clone())
                .or_insert_with(super::new_by_zone);
            let e = by_zone.entry(r.zone.clone()).or_insert_with(Entry::new);
            if !e.instances.contains_key(&r.instance) && !self.admit() {
                warn!(zone = %r.zone, cluster = %r.cluster, instance = %r.instance, limit = MAX_INSTANCES, "Published instance dropped: too many instances.");
                return;
            }
            let before = (e.status, e.live());
            // The first listing of a replica is a load: nothing in it is news.
            let note = self.memory.is_loaded();
            let prev = e.instances.get(&r.instance);
            let identity: Option<Arc<HeldIdentity>> = match r.identity.take() {
                // The same certificates as before: kept as they are.
                Some(rep) => match prev.and_then(|p| p.identity.clone()) {
                    Some(held) if held.digest == rep.digest && held.published() == rep => {
                        Some(held)
                    }
                    _ => Some(Arc::new(HeldIdentity::hold(
                        rep,
                        e.instances.values().filter_map(|i| i.identity.as_deref()),
                    ))),
                },
                None => None,
            };
            let identity_moved = match (prev.and_then(|p| p.identity.as_ref()), &identity) {
                (Some(a), Some(b)) => !Arc::ptr_eq(a, b),
                (a, b) => a.is_some() != b.is_some(),
            };
            let identity_state = if r.reachable && note {
                super::identity::note_identity(
                    &self.memory,
                    (&r.zone, &r.cluster, &r.instance),
                    prev.filter(|p| p.is_live())
                        .map(|p| (p.identity.as_deref(), p.identity_state)),
                    identity.as_deref(),
                    Instant::now(),
                )
            } else {
                let rules = self.memory.rules.identity;
                let now_ms = super::identity::now_ms();
                identity
                    .as_deref()
                    .and_then(|h| h.identity_cert(&rules, now_ms))
                    .map_or(CertState::None, |c| c.state(&rules, now_ms))
            };
            let drift = if note {
                self.note_instance(
                    e.instances.get(&r.instance),
                    Instant::now(),
                    &Seen {
                        zone: &r.zone,
                        cluster: &r.cluster,
                        instance: &r.instance,
                        reachable: r.reachable,
                        start_time_ms: r.start_time_ms,
                        config_hash: r.config_hash.as_deref(),
                        config_hashes: &r.config_hashes,
                    },
                )
            } else {
                false
            };
            let fresh = LiveInstance::new(
                Reporter::Replica(Arc::from(r.owner.as_str())),
                Instant::now(),
                (r.window_requests, r.window_errors),
                &InstanceReport {
                    reachable: r.reachable,
                    start_time_ms: r.start_time_ms,
                    config_hash: r.config_hash.clone(),
                    config_hashes: r.config_hashes.clone(),
                    ..InstanceReport::unread(r.zone.clone(), r.cluster.clone(), r.instance.clone())
                },
                Arc::default(),
                InstanceSize::default(),
            );
            let mut fresh = fresh;
            fresh.identity = identity;
            fresh.identity_state = identity_state;
            e.count(&fresh, true);
            // What a reader sees of an instance: that it is live, its start time and
            // its identity; its window counts show only through the status.
            let shown = match e.instances.insert(r.instance.clone(), fresh) {
                Some(old) => {
                    e.count(&old, false);
                    old.reachable != r.reachable
                        || old.start_time_ms != r.start_time_ms
                        || (r.reachable && (identity_moved || old.identity_state != identity_state))
                }
                None => r.reachable,
            };
            if identity_moved {
                super::identity::schedule(&self.memory, &r.zone, &r.cluster, e);
                self.traffic.reshaped();
            }
            self.memory.refresh_noting(e, before, note);
            if drift {
                self.note_drift(&r.zone, &r.cluster, e);
            } else if !note {
                e.drifted = super::drift::drifted(e.instances.values());
            }
            let shown = shown || before.0 != e.status;
            if e.record.is_some() {
                self.memory
                    .count_change(&r.zone, before, (e.status, e.live()));
            }
            shown.then(|| {
                e.record
                    .is_some()
                    .then(|| Touch::Cluster(r.zone.clone(), r.cluster.clone()))
            })
        };
        // Metrics alone move nothing a reader sees: no index, no event.
        if let Some(touched) = touched {
            self.memory.publish(touched.as_slice());
        }
    }

    /// Drops an instance another replica owned (its publication is gone, or its
    /// owner marked it as left for `reason`).
    pub fn drop_remote(&self, zone: &str, cluster: &str, instance: &str, reason: LeftReason) {
        let _st = shared(&self.memory.state);
        let key = InstanceKey::new(zone, cluster, instance);
        let reason = self.memory.is_loaded().then_some(reason);
        if self.drop_instance(&key, LiveInstance::is_remote, reason, Instant::now()) {
            self.memory
                .publish(self.touch_if_registered(&key).as_slice());
        }
    }

    /// Every instance shown from another replica's publication: (zone, cluster,
    /// instance).
    pub fn remote_instances(&self) -> Vec<InstanceKey> {
        let mut out = Vec::new();
        for by_zone in self.memory.clusters.iter() {
            for (zone, e) in by_zone.iter() {
                for (name, i) in &e.instances {
                    if i.is_remote() {
                        out.push(InstanceKey::new(zone, by_zone.key(), name));
                    }
                }
            }
        }
        out
    }

    /// Who reports each zone's instances: every registered zone, and (with
    /// `unregistered`) every zone an agent reports into without a registration,
    /// sorted by name. Walks every instance once: it answers `GET /status`, an
    /// operator's occasional read, not a dashboard's poll, on the blocking pool.
    pub fn reporters_by_zone(&self, unregistered: bool) -> Vec<ZoneReporters> {
        let mut by_zone: std::collections::BTreeMap<String, (ZoneReporters, HashSet<Arc<str>>)> =
            self.memory
                .zones
                .iter()
                .map(|z| {
                    let zone = ZoneReporters {
                        zone_name: z.key().clone(),
                        registered: true,
                        ..ZoneReporters::default()
                    };
                    (z.key().clone(), (zone, HashSet::new()))
                })
                .collect();
        for by_zone_entry in self.memory.clusters.iter() {
            for (zone, e) in by_zone_entry.iter() {
                if e.instances.is_empty() || (!unregistered && !by_zone.contains_key(zone)) {
                    continue;
                }
                let (z, agents) = by_zone.entry(zone.clone()).or_insert_with(|| {
                    let z = ZoneReporters {
                        zone_name: zone.clone(),
                        ..ZoneReporters::default()
                    };
                    (z, HashSet::new())
                });
                for i in e.instances.values() {
                    match &i.reporter {
                        Reporter::Agent(a) => {
                            agents.insert(a.clone());
                            z.instances += 1;
                        }
                        Reporter::Replica(_) => z.peer_instances += 1,
                    }
                }
            }
        }
        by_zone
            .into_values()
            .map(|(mut z, agents)| {
                z.agents = agents.len() as u64;
                z
            })
            .collect()
    }

    /// Drops an agent's instances at once (it said goodbye or its connection closed).
    pub fn agent_gone(&self, agent_id: &str) {
        let _st = shared(&self.memory.state);
        let Some((_, keys)) = self.agents.remove(agent_id) else {
            return;
        };
        let mut changed = false;
        let mut touched = Vec::new();
        for key in keys {
            if self.drop_instance(
                &key,
                |i| i.reported_by(agent_id),
                Some(LeftReason::Disconnected),
                Instant::now(),
            ) {
                changed = true;
                touched.extend(self.touch_if_registered(&key));
            }
        }
        if changed {
            self.memory.publish(&touched);
        }
    }

    /// Drops instances not reported within the TTL. Visits only the instances of the
    /// agents whose reports fell due, never the whole catalog, and copies the keys
    /// of the stale ones only.
    pub fn expire(&self, now: Instant) {
        let ttl = self.memory.rules.instance_ttl;
        let due = self.take_due(now, ttl);
        if due.is_empty() {
            return;
        }
        let _st = shared(&self.memory.state);
        // Another replica's instances leave when its publication does.
        let stale =
            |i: &LiveInstance| !i.is_remote() && now.saturating_duration_since(i.last_seen) > ttl;
        let mut changed = false;
        let mut touched = Vec::new();
        for agent in due {
            // Lock order: an agent's set, then the clusters map. No path holds a
            // cluster entry while it waits for an agent's set.
            let keys: Vec<InstanceKey> = match self.agents.get(&*agent) {
                Some(keys) => keys
                    .iter()
                    .filter(|k| self.instance_is(k, stale))
                    .cloned()
                    .collect(),
                None => continue,
            };
            for key in keys {
                if self.drop_instance(&key, stale, Some(LeftReason::Expired), now) {
                    debug!(%agent, zone = %key.zone, cluster = %key.cluster, instance = %key.instance, "Instance expired.");
                    changed = true;
                    touched.extend(self.touch_if_registered(&key));
                    if let Some(mut keys) = self.agents.get_mut(&*agent) {
                        keys.remove(&key);
                    }
                }
            }
            self.agents.remove_if(&*agent, |_, keys| keys.is_empty());
        }
        if changed {
            self.memory.publish(&touched);
        }
    }

    /// The cluster event an instance's departure makes, when its cluster is
    /// registered (an unregistered one shows only in `GET /services`).
    fn touch_if_registered(&self, key: &InstanceKey) -> Option<Touch> {
        self.memory
            .record(&key.zone, &key.cluster)
            .is_some()
            .then(|| Touch::cluster(&key.zone, &key.cluster))
    }

    /// Whether the instance is stored and `cond` holds for it (read only).
    fn instance_is(&self, key: &InstanceKey, cond: impl Fn(&LiveInstance) -> bool) -> bool {
        self.memory
            .clusters
            .get(&key.cluster)
            .is_some_and(|by_zone| {
                by_zone
                    .get(&key.zone)
                    .and_then(|e| e.instances.get(&key.instance))
                    .is_some_and(cond)
            })
    }

    /// Removes one instance when `cond` holds; refreshes status and counters; notes
    /// in the history that a live instance left for `reason` (none: quietly) at
    /// `now`. Returns whether it was removed.
    fn drop_instance(
        &self,
        key: &InstanceKey,
        cond: impl Fn(&LiveInstance) -> bool,
        reason: Option<LeftReason>,
        now: Instant,
    ) -> bool {
        let mut owned = false;
        {
            let Some(mut by_zone) = self.memory.clusters.get_mut(&key.cluster) else {
                return false;
            };
            let Some(e) = by_zone.get_mut(&key.zone) else {
                return false;
            };
            if !e.instances.get(&key.instance).is_some_and(&cond) {
                return false;
            }
            let before = (e.status, e.live());
            if let Some(old) = e.instances.remove(&key.instance) {
                e.count(&old, false);
                owned = !old.is_remote();
                if let Some(reason) = reason.filter(|_| old.is_live())
                    && let Some(history) = self.memory.history.get()
                {
                    history.record_instance(
                        Pending::new(
                            Kind::InstanceLeft,
                            &key.zone,
                            &key.cluster,
                            &key.instance,
                            Detail::Left { reason },
                        ),
                        now,
                    );
                }
                if old.is_live() && old.config_hash.is_some() {
                    if reason.is_some() {
                        self.note_drift(&key.zone, &key.cluster, e);
                    } else {
                        e.drifted = super::drift::drifted(e.instances.values());
                    }
                }
            }
            self.total.fetch_sub(1, Ordering::AcqRel);
            self.memory.refresh_noting(e, before, reason.is_some());
            if e.record.is_some() {
                self.memory
                    .count_change(&key.zone, before, (e.status, e.live()));
            }
            let forget = e.record.is_none() && e.instances.is_empty() && e.declared.is_none();
            if forget {
                by_zone.remove(&key.zone);
            }
            let empty = by_zone.is_empty();
            drop(by_zone);
            if empty {
                self.memory
                    .clusters
                    .remove_if(&key.cluster, |_, m| m.is_empty());
            }
        }
        self.traffic.forget(key);
        // Only this replica's own publications are its to withdraw.
        if owned && let Some(m) = self.membership.get() {
            m.withdraw(
                &key.zone,
                &key.cluster,
                &key.instance,
                reason.unwrap_or(LeftReason::Expired),
            );
        }
        true
    }

    /// The replica that owns this instance, when another one does (`zone` `None`:
    /// the first zone by name that has the instance).
    pub fn remote_owner(
        &self,
        zone: Option<&str>,
        cluster: &str,
        instance: &str,
    ) -> Option<String> {
        let by_zone = self.memory.clusters.get(cluster)?;
        by_zone
            .iter()
            .filter(|(z, _)| zone.is_none_or(|want| want == z.as_str()))
            .find_map(|(_, e)| e.instances.get(instance))
            .and_then(|i| i.owner())
            .map(str::to_owned)
    }

    /// The replica that owns the instance `GET /metrics/{name}/{version}/{instance}`
    /// names, when another one does. An instance of this replica in any cluster
    /// with that name and version is served here, as
    /// [`Self::instance_metrics_by_version`] prefers it; otherwise the first remote
    /// one in (zone, cluster) order.
    pub fn remote_owner_by_version(
        &self,
        name: &str,
        version: &str,
        instance: &str,
    ) -> Option<String> {
        let mut owner: Option<(String, String, String)> = None;
        for by_zone in self.memory.clusters.iter() {
            for (z, e) in by_zone.iter() {
                let named = e
                    .record
                    .as_ref()
                    .is_some_and(|r| r.name == name && r.version == version);
                let Some(i) = e.instances.get(instance).filter(|_| named) else {
                    continue;
                };
                // An instance of this replica is served here.
                let o = i.owner()?;
                let key = (z.clone(), by_zone.key().clone());
                if owner
                    .as_ref()
                    .is_none_or(|(oz, oc, _)| key < (oz.clone(), oc.clone()))
                {
                    owner = Some((key.0, key.1, o.to_owned()));
                }
            }
        }
        owner.map(|(_, _, o)| o)
    }

    /// The live instances of (zone, cluster) by name, each with the replica that owns
    /// it. Nothing is unpacked.
    pub fn live_owners(&self, zone: &str, cluster: &str) -> Vec<LiveOwner> {
        self.live_of(zone, cluster, |name, i| {
            Some(LiveOwner {
                instance: name.to_owned(),
                owner: i.owner().map(str::to_owned),
            })
        })
    }

    /// What `pick` makes of each live instance of (zone, cluster), in name order (the
    /// instances map is ordered); `None` leaves an instance out.
    fn live_of<T>(
        &self,
        zone: &str,
        cluster: &str,
        mut pick: impl FnMut(&str, &LiveInstance) -> Option<T>,
    ) -> Vec<T> {
        let Some(by_zone) = self.memory.clusters.get(cluster) else {
            return Vec::new();
        };
        let Some(e) = by_zone.get(zone) else {
            return Vec::new();
        };
        e.instances
            .iter()
            .filter(|(_, i)| i.is_live())
            .filter_map(|(n, i)| pick(n, i))
            .collect()
    }

    /// Where an instance of (zone, cluster) is served: `Some(None)` when it is live
    /// and an agent of this replica reports it, `Some(Some(replica))` when another
    /// replica owns it, `None` otherwise.
    pub fn live_owner(&self, zone: &str, cluster: &str, instance: &str) -> Option<Option<String>> {
        let by_zone = self.memory.clusters.get(cluster)?;
        let i = by_zone.get(zone)?;
        let i = i.instances.get(instance)?;
        match i.owner() {
            None => i.is_live().then_some(None),
            Some(remote) => Some(Some(remote.to_owned())),
        }
    }

    /// The agent of this replica that reports this instance now, for routing
    /// commands to it (`None` also when another replica owns it).
    pub fn reporter(&self, zone: &str, cluster: &str, instance: &str) -> Option<String> {
        self.memory.clusters.get(cluster).and_then(|m| {
            m.get(zone)
                .and_then(|e| e.instances.get(instance))
                .and_then(|i| match &i.reporter {
                    Reporter::Agent(a) => Some(a.to_string()),
                    Reporter::Replica(_) => None,
                })
        })
    }

    /// Sets the clusters a zone's edge sidecar has in its configuration.
    pub fn set_edge_clusters(&self, zone: &str, mut clusters: Vec<String>) {
        clusters.retain(|c| is_valid_name(c));
        clusters.sort();
        clusters.dedup();
        clusters.truncate(MAX_EDGE_CLUSTERS);
        let _st = super::exclusive(&self.memory.state);
        let same = self.memory.edge.get(zone).is_some_and(|c| *c == clusters);
        if !same {
            if clusters.is_empty() {
                self.memory.edge.remove(zone);
            } else {
                self.memory.edge.insert(zone.to_owned(), clusters);
            }
            // Only `GET /services` shows it: the index moves, no event.
            self.memory.publish(&[]);
        }
    }

    /// The latest metrics of a live instance of cluster `name` (in `zone`, or the
    /// first zone by name that has it).
    pub fn instance_metrics(
        &self,
        name: &str,
        zone: Option<&str>,
        instance: &str,
    ) -> MetricsLookup {
        let Some(by_zone) = self.memory.clusters.get(name) else {
            return MetricsLookup::NoCluster;
        };
        let mut any = false;
        for (z, e) in by_zone.iter() {
            if zone.is_some_and(|want| want != z) {
                continue;
            }
            any = true;
            // Another replica's instance: its metrics stay with that replica.
            if let Some(i) = e
                .instances
                .get(instance)
                .filter(|i| i.is_live() && !i.is_remote())
            {
                return MetricsLookup::Found(Box::new(metrics_of(i)));
            }
        }
        if any {
            MetricsLookup::NoInstance
        } else {
            MetricsLookup::NoCluster
        }
    }

    /// Like [`Self::instance_metrics`], finding registered clusters by their `name`
    /// and `version` fields.
    pub fn instance_metrics_by_version(
        &self,
        name: &str,
        version: &str,
        instance: &str,
    ) -> MetricsLookup {
        let mut candidates: Vec<(String, String)> = Vec::new();
        for by_zone in self.memory.clusters.iter() {
            for (z, e) in by_zone.iter() {
                if e.record
                    .as_ref()
                    .is_some_and(|r| r.name == name && r.version == version)
                {
                    candidates.push((z.clone(), by_zone.key().clone()));
                }
            }
        }
        if candidates.is_empty() {
            return MetricsLookup::NoCluster;
        }
        candidates.sort();
        for (z, c) in candidates {
            if let MetricsLookup::Found(m) = self.instance_metrics(&c, Some(&z), instance) {
                return MetricsLookup::Found(m);
            }
        }
        MetricsLookup::NoInstance
    }

    /// The last reports of a cluster's live instances of this replica, sorted by
    /// instance name.
    pub fn live_instances(&self, zone: &str, cluster: &str) -> Vec<Arc<InstanceReport>> {
        self.live_of(zone, cluster, |_, i| {
            (!i.is_remote()).then(|| Arc::new(i.report()))
        })
    }

    /// How many of each bounded set the catalog keeps of an instance, when it holds
    /// it: what the per-instance bounds are checked against.
    pub fn held_size(&self, zone: &str, cluster: &str, instance: &str) -> Option<InstanceSize> {
        let by_zone = self.memory.clusters.get(cluster)?;
        let held = by_zone.get(zone)?.instances.get(instance)?.held();
        Some(held)
    }

    /// The drift of (zone, cluster); `None` when the cluster is neither registered
    /// nor reported there.
    pub fn drift(&self, zone: &str, cluster: &str) -> Option<super::drift::DriftView> {
        let by_zone = self.memory.clusters.get(cluster)?;
        Some(super::drift::view(by_zone.get(zone)?))
    }

    /// The last report of a live instance, for commands and diagnosis.
    pub fn live_instance(
        &self,
        zone: &str,
        cluster: &str,
        instance: &str,
    ) -> Option<Arc<InstanceReport>> {
        self.memory.clusters.get(cluster).and_then(|m| {
            m.get(zone)
                .and_then(|e| e.instances.get(instance))
                .filter(|i| i.is_live() && !i.is_remote())
                .map(|i| Arc::new(i.report()))
        })
    }
}

fn metrics_of(i: &LiveInstance) -> InstanceMetrics {
    i.report().metrics
}
