//! What the catalog keeps of each live instance's workload identity (contract
//! section 19) and what it answers of it: the certificates and SAN expectations an
//! agent reported ([`HeldIdentity`], shared between the instances of one cluster
//! where they agree), each instance's and cluster's identity as the records show it
//! ([`instance_identity`], [`cluster_identity`]), the rows of `GET /certificates`
//! ([`Identities::certificates`]), and the clock that moves the catalog when a
//! certificate's state changes with time alone ([`Identities::tick`]).
//!
//! A state depends on the time: a record rendered now says what holds now, and the
//! clock makes the catalog index move (with a `certificate-state` history entry)
//! when any live instance's identity state changes, so that cached answers, blocking
//! queries and live updates follow.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use meshcat_common::identity::{
    CertRole, CertSource, CertState, CertTimes, CertificateRow, ClusterIdentity, IdentityReport,
    IdentityRules, Matchers, San, SanKind, SanMatcher, SdsSecret, TlsIdentity,
};
use serde::Serialize;

use super::publish::Touch;
use super::{Entry, LiveInstance, Memory, shared};
use crate::history::{Detail, Kind, Pending};

/// Milliseconds since the epoch now.
pub fn now_ms() -> i64 {
    crate::history::entry::now_ms()
}

/// The rules and the time identity states are read at for one rendering.
#[derive(Debug, Clone, Copy)]
pub struct IdentityAt {
    pub rules: IdentityRules,
    pub now_ms: i64,
}

impl IdentityAt {
    /// `rules` now.
    pub fn now(rules: IdentityRules) -> Self {
        IdentityAt {
            rules,
            now_ms: now_ms(),
        }
    }
}

/// One certificate of an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldCert {
    pub serial: Box<str>,
    pub role: CertRole,
    /// Shared with the instance's other certificates and the cluster's other
    /// instances that present the same SANs.
    pub sans: Arc<[San]>,
    pub valid_from_ms: i64,
    pub expires_at_ms: i64,
    pub secret: Option<Arc<SdsSecret>>,
}

impl HeldCert {
    fn times(&self) -> CertTimes {
        CertTimes {
            valid_from_ms: self.valid_from_ms,
            expires_at_ms: self.expires_at_ms,
            sds: self.secret.is_some(),
        }
    }

    pub fn source(&self) -> CertSource {
        if self.secret.is_some() {
            CertSource::Sds
        } else {
            CertSource::File
        }
    }

    pub fn state(&self, rules: &IdentityRules, now_ms: i64) -> CertState {
        rules.state(self.times(), now_ms)
    }

    /// What a rotation pairs: the secret, or for a file the SANs.
    fn slot(&self) -> (Option<&str>, &[San]) {
        (self.secret.as_ref().map(|s| s.name.as_str()), &self.sans)
    }
}

/// The matchers one upstream cluster requires, compiled once.
#[derive(Debug)]
pub struct MatcherSet {
    pub matchers: Box<[SanMatcher]>,
    compiled: Matchers,
}

impl MatcherSet {
    fn new(matchers: Vec<SanMatcher>) -> Self {
        let compiled = Matchers::new(&matchers);
        MatcherSet {
            matchers: matchers.into(),
            compiled,
        }
    }

    /// Whether these matchers accept a certificate with `sans`.
    pub fn accept(&self, sans: &[San]) -> bool {
        self.compiled.accept(sans)
    }
}

/// An instance's SAN expectations by upstream cluster, sorted by name.
#[derive(Debug)]
pub struct Expectations {
    by_cluster: Box<[(Box<str>, Arc<MatcherSet>)]>,
}

impl Expectations {
    /// The matchers of upstream cluster `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<MatcherSet>> {
        self.by_cluster
            .binary_search_by(|(n, _)| (**n).cmp(name))
            .ok()
            .map(|i| &self.by_cluster[i].1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<MatcherSet>)> {
        self.by_cluster.iter().map(|(n, m)| (&**n, m))
    }

    fn same_as(&self, report: &[meshcat_common::identity::SanExpectation]) -> bool {
        self.by_cluster.len() == report.len()
            && self
                .by_cluster
                .iter()
                .zip(report)
                .all(|((n, m), e)| **n == *e.cluster && *m.matchers == *e.matchers)
    }
}

/// An instance's identity as its agent last reported it.
#[derive(Debug)]
pub struct HeldIdentity {
    pub certificates: Box<[HeldCert]>,
    pub expectations: Option<Arc<Expectations>>,
    /// Why the certificates are not listed, when they were refused.
    pub refused: Option<Box<str>>,
    /// The SANs of its chain certificates together: what it presents to callers.
    pub presented: Arc<[San]>,
    /// The agent's digest of what it reported.
    pub digest: u64,
}

impl HeldIdentity {
    /// What to keep of `report`, sharing SAN lists and expectations with `others`
    /// (the cluster's other instances) where they are equal: the instances of one
    /// cluster mostly present the same identity and expect the same of their
    /// upstreams.
    pub fn hold<'a>(
        report: IdentityReport,
        others: impl Iterator<Item = &'a HeldIdentity> + Clone,
    ) -> HeldIdentity {
        let share_sans = |sans: Vec<San>| -> Arc<[San]> {
            others
                .clone()
                .flat_map(|h| h.certificates.iter().map(|c| &c.sans))
                .find(|s| ***s == *sans)
                .cloned()
                .unwrap_or_else(|| sans.into())
        };
        let certificates: Box<[HeldCert]> = report
            .certificates
            .into_iter()
            .map(|c| HeldCert {
                serial: c.serial.into(),
                role: c.role,
                sans: share_sans(c.sans),
                valid_from_ms: c.valid_from_ms,
                expires_at_ms: c.expires_at_ms,
                secret: c.secret.map(Arc::new),
            })
            .collect();
        let mut presented: Vec<San> = certificates
            .iter()
            .filter(|c| c.role == CertRole::Chain)
            .flat_map(|c| c.sans.iter().cloned())
            .collect();
        presented.sort();
        presented.dedup();
        let presented = others
            .clone()
            .map(|h| &h.presented)
            .find(|p| ***p == *presented)
            .cloned()
            .unwrap_or_else(|| presented.into());
        let expectations = (!report.expectations.is_empty()).then(|| {
            others
                .clone()
                .filter_map(|h| h.expectations.as_ref())
                .find(|e| e.same_as(&report.expectations))
                .cloned()
                .unwrap_or_else(|| {
                    Arc::new(Expectations {
                        by_cluster: report
                            .expectations
                            .into_iter()
                            .map(|e| (e.cluster.into(), Arc::new(MatcherSet::new(e.matchers))))
                            .collect(),
                    })
                })
        });
        HeldIdentity {
            certificates,
            expectations,
            refused: report.refused.map(Into::into),
            presented,
            digest: report.digest,
        }
    }

    /// What a replica publishes of it for its peers: the certificates, not the
    /// expectations.
    pub fn published(&self) -> IdentityReport {
        IdentityReport::new(
            self.certificates
                .iter()
                .map(|c| meshcat_common::identity::ReportedCertificate {
                    serial: c.serial.to_string(),
                    role: c.role,
                    sans: c.sans.to_vec(),
                    valid_from_ms: c.valid_from_ms,
                    expires_at_ms: c.expires_at_ms,
                    secret: c.secret.as_deref().cloned(),
                })
                .collect(),
            Vec::new(),
            self.refused.as_deref().map(str::to_owned),
        )
    }

    /// The certificate its identity is: its soonest-expiring chain certificate (of
    /// two alike, the one in the worse state).
    pub fn identity_cert(&self, rules: &IdentityRules, now_ms: i64) -> Option<&HeldCert> {
        self.certificates
            .iter()
            .filter(|c| c.role == CertRole::Chain)
            .min_by_key(|c| {
                (
                    c.expires_at_ms,
                    Reverse(c.state(rules, now_ms).severity()),
                    &c.serial,
                )
            })
    }

    /// The first time after `now_ms` at which a certificate's state changes.
    fn next_change(&self, rules: &IdentityRules, now_ms: i64) -> Option<i64> {
        self.certificates
            .iter()
            .filter_map(|c| rules.next_change(c.times(), now_ms))
            .min()
    }
}

/// An instance's identity state now: its identity certificate's, `none` without one.
pub fn state_of(i: &LiveInstance, rules: &IdentityRules, now_ms: i64) -> CertState {
    i.identity
        .as_deref()
        .and_then(|h| h.identity_cert(rules, now_ms))
        .map_or(CertState::None, |c| c.state(rules, now_ms))
}

/// The identity of an instance as the records show it, borrowed: the JSON of
/// [`meshcat_common::identity::InstanceIdentity`], field for field.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceIdentityRef<'a> {
    state: CertState,
    sans: SanValues<'a>,
    expires_at_ms: Option<i64>,
    valid_from_ms: Option<i64>,
    source: Option<CertSource>,
    secret: Option<&'a str>,
    serial: Option<&'a str>,
    reason: Option<&'a str>,
}

/// SANs shown as their values.
#[derive(Debug)]
struct SanValues<'a>(&'a [San]);

impl Serialize for SanValues<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|san| san.value.as_str()))
    }
}

impl InstanceIdentityRef<'_> {
    /// The same, owned.
    pub fn owned(&self) -> meshcat_common::identity::InstanceIdentity {
        meshcat_common::identity::InstanceIdentity {
            state: self.state,
            sans: self.sans.0.iter().map(|s| s.value.clone()).collect(),
            expires_at_ms: self.expires_at_ms,
            valid_from_ms: self.valid_from_ms,
            source: self.source,
            secret: self.secret.map(str::to_owned),
            serial: self.serial.map(str::to_owned),
            reason: self.reason.map(str::to_owned),
        }
    }
}

/// The identity of instance `i` at `now_ms`.
pub fn instance_identity<'a>(
    i: &'a LiveInstance,
    rules: &IdentityRules,
    now_ms: i64,
) -> InstanceIdentityRef<'a> {
    let held = i.identity.as_deref();
    let reason = held.and_then(|h| h.refused.as_deref());
    match held.and_then(|h| h.identity_cert(rules, now_ms)) {
        Some(c) => InstanceIdentityRef {
            state: c.state(rules, now_ms),
            sans: SanValues(&c.sans),
            expires_at_ms: Some(c.expires_at_ms),
            valid_from_ms: Some(c.valid_from_ms),
            source: Some(c.source()),
            secret: c.secret.as_ref().map(|s| s.name.as_str()),
            serial: Some(&c.serial),
            reason,
        },
        None => InstanceIdentityRef {
            state: CertState::None,
            sans: SanValues(&[]),
            expires_at_ms: None,
            valid_from_ms: None,
            source: None,
            secret: None,
            serial: None,
            reason,
        },
    }
}

/// Most SPIFFE IDs a cluster's identity lists.
pub const MAX_SPIFFE_IDS: usize = 32;

/// A cluster's identity at `now_ms`, over its live reported instances.
pub fn cluster_identity(e: &Entry, rules: &IdentityRules, now_ms: i64) -> ClusterIdentity {
    let mut spiffe_ids = BTreeSet::new();
    for i in e.instances.values().filter(|i| i.is_live()) {
        let Some(h) = i.identity.as_deref() else {
            continue;
        };
        for san in h.presented.iter().filter(|s| s.kind == SanKind::Uri) {
            if spiffe_ids.len() < MAX_SPIFFE_IDS {
                spiffe_ids.insert(san.value.as_str());
            }
        }
    }
    ClusterIdentity {
        spiffe_ids: spiffe_ids.into_iter().map(str::to_owned).collect(),
        state: worst_state(e, rules, now_ms),
        expires_at_ms: soonest_expiry(e, rules, now_ms),
    }
}

/// The soonest expiry of the identity certificates of `e`'s live instances.
pub fn soonest_expiry(e: &Entry, rules: &IdentityRules, now_ms: i64) -> Option<i64> {
    e.instances
        .values()
        .filter(|i| i.is_live())
        .filter_map(|i| i.identity.as_deref()?.identity_cert(rules, now_ms))
        .map(|c| c.expires_at_ms)
        .min()
}

/// The worst identity state of `e`'s live instances (`none` without any).
pub fn worst_state(e: &Entry, rules: &IdentityRules, now_ms: i64) -> CertState {
    e.instances
        .values()
        .filter(|i| i.is_live())
        .map(|i| state_of(i, rules, now_ms))
        .max_by_key(|s| s.severity())
        .unwrap_or(CertState::None)
}

/// What the graph needs of a cluster's identity: the SANs each live instance
/// presents and the expectations its live instances hold, each distinct set once.
#[derive(Debug, Default)]
pub struct ClusterTls {
    pub presented: Vec<Arc<[San]>>,
    pub expectations: Vec<Arc<Expectations>>,
    /// Live instances with no certificate known (they present nothing).
    pub without: usize,
}

impl ClusterTls {
    /// Of `e`'s live instances; `None` when none holds any identity.
    pub fn of(e: &Entry) -> Option<Arc<ClusterTls>> {
        let mut tls = ClusterTls::default();
        let mut any = false;
        for i in e.instances.values().filter(|i| i.is_live()) {
            let Some(h) = i.identity.as_deref() else {
                tls.without += 1;
                continue;
            };
            any = true;
            if h.presented.is_empty() {
                tls.without += 1;
            } else if !tls.presented.iter().any(|p| Arc::ptr_eq(p, &h.presented)) {
                tls.presented.push(h.presented.clone());
            }
            if let Some(x) = &h.expectations
                && !tls.expectations.iter().any(|e| Arc::ptr_eq(e, x))
            {
                tls.expectations.push(x.clone());
            }
        }
        any.then(|| Arc::new(tls))
    }

    /// The distinct matcher sets the cluster's instances require of upstream `name`.
    pub fn expected_of(&self, name: &str) -> Vec<&Arc<MatcherSet>> {
        let mut out: Vec<&Arc<MatcherSet>> = Vec::new();
        for e in &self.expectations {
            if let Some(m) = e.get(name)
                && !out.iter().any(|o| Arc::ptr_eq(o, m))
            {
                out.push(m);
            }
        }
        out
    }
}

/// Most SANs a `tlsIdentity` lists on each side.
pub const MAX_SHOWN_SANS: usize = 32;

/// Whether what `caller` requires of an upstream (its distinct matcher sets) is
/// met by every live instance of `target`; `None` when there is nothing to compare
/// (the caller checks no SAN, or the target presents no certificate at all).
pub fn compare(expected: &[&Arc<MatcherSet>], target: &ClusterTls) -> Option<TlsIdentity> {
    if expected.is_empty() || target.presented.is_empty() {
        return None;
    }
    let matches = target.without == 0
        && expected
            .iter()
            .all(|m| target.presented.iter().all(|sans| m.accept(sans)));
    let mut expected_sans: Vec<String> = expected
        .iter()
        .flat_map(|m| m.matchers.iter().map(SanMatcher::display))
        .collect();
    expected_sans.sort();
    expected_sans.dedup();
    expected_sans.truncate(MAX_SHOWN_SANS);
    let mut presented_sans: Vec<String> = target
        .presented
        .iter()
        .flat_map(|p| p.iter().map(|s| s.value.clone()))
        .collect();
    presented_sans.sort();
    presented_sans.dedup();
    presented_sans.truncate(MAX_SHOWN_SANS);
    Some(TlsIdentity {
        expected_sans,
        presented_sans,
        matches,
    })
}

/// What `GET /certificates` asks for.
#[derive(Debug, Clone, Default)]
pub struct CertificateQuery {
    pub zone: Option<String>,
    pub cluster: Option<String>,
    /// Any of these states (none: any state).
    pub states: Vec<CertState>,
    /// Expiring before now plus this (expired ones included).
    pub expiring_within: Option<Duration>,
}

/// The clock of identity states: per (zone, cluster), the next time a live
/// instance's certificate state changes, soonest first. An entry may be in it more
/// than once; a visit finds what changed and schedules the entry again.
#[derive(Debug, Default)]
pub struct IdentityClock {
    due: Mutex<BinaryHeap<Reverse<(i64, String, String)>>>,
}

impl IdentityClock {
    pub(super) fn schedule(&self, at_ms: i64, zone: &str, cluster: &str) {
        self.due
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Reverse((at_ms, zone.to_owned(), cluster.to_owned())));
    }

    /// The entries due at `now_ms`, once each.
    fn take_due(&self, now_ms: i64) -> Vec<(String, String)> {
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::new();
        while due.peek().is_some_and(|Reverse((at, _, _))| *at <= now_ms) {
            let Reverse((_, zone, cluster)) = due.pop().expect("peeked");
            out.push((zone, cluster));
        }
        drop(due);
        out.sort();
        out.dedup();
        out
    }
}

/// Notes in the history what an instance's new identity changes: each certificate
/// rotated (a secret, or for a file the same SANs, now with another serial), and its
/// identity state. `before` is the instance as it was (its identity and state), when
/// it was live. Returns the state now.
pub(super) fn note_identity(
    memory: &Memory,
    key: (&str, &str, &str),
    before: Option<(Option<&HeldIdentity>, CertState)>,
    after: Option<&HeldIdentity>,
    now: std::time::Instant,
) -> CertState {
    let rules = memory.rules.identity;
    let at = now_ms();
    let cert = after.and_then(|h| h.identity_cert(&rules, at));
    let state = cert.map_or(CertState::None, |c| c.state(&rules, at));
    let Some(history) = memory.history.get() else {
        return state;
    };
    let (zone, cluster, instance) = key;
    let entry = |kind, detail| {
        history.record_instance(Pending::new(kind, zone, cluster, instance, detail), now);
    };
    if let (Some((Some(old), _)), Some(new)) = (before, after)
        && !std::ptr::eq(old, new)
    {
        for c in new
            .certificates
            .iter()
            .filter(|c| c.role == CertRole::Chain)
        {
            let still = old.certificates.iter().any(|o| o.serial == c.serial);
            let replaced = old.certificates.iter().find(|o| {
                o.role == CertRole::Chain && o.slot() == c.slot() && o.serial != c.serial
            });
            if let Some(o) = replaced.filter(|_| !still) {
                entry(
                    Kind::CertificateRotated,
                    Detail::Rotated {
                        serial: c.serial.to_string(),
                        previous_serial: o.serial.to_string(),
                        expires_at_ms: c.expires_at_ms,
                        previous_expires_at_ms: o.expires_at_ms,
                        secret: c.secret.as_ref().map(|s| s.name.clone()),
                    },
                );
            }
        }
    }
    // News: a state that moved, or a new instance whose certificate needs someone;
    // not an instance's first certificates read in good order.
    let news = match before {
        None => state.needs_action(),
        Some((held, was)) => state != was && !(held.is_none() && state == CertState::Ok),
    };
    if news {
        let was = before.map_or(CertState::None, |(_, s)| s);
        entry(
            Kind::CertificateState,
            Detail::CertificateState {
                from: was.as_str(),
                to: state.as_str(),
                serial: cert.map(|c| c.serial.to_string()),
                expires_at_ms: cert.map(|c| c.expires_at_ms),
            },
        );
    }
    state
}

/// What a certificate listing may skip in an entry: every certificate its instances
/// hold (live or not) is `ok` before `ok_until_ms`, and none expires before
/// `first_expiry_ms`. [`schedule`] makes it exact, and runs after every change of an
/// instance's certificates; an instance that leaves can only leave it too low, which
/// skips less, never too much.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CertBounds {
    pub ok_until_ms: i64,
    pub first_expiry_ms: i64,
}

impl CertBounds {
    /// No certificate.
    pub const NONE: CertBounds = CertBounds {
        ok_until_ms: i64::MAX,
        first_expiry_ms: i64::MAX,
    };

    fn of<'a>(instances: impl Iterator<Item = &'a LiveInstance>, rules: &IdentityRules) -> Self {
        instances
            .filter_map(|i| i.identity.as_deref())
            .flat_map(|h| h.certificates.iter())
            .fold(CertBounds::NONE, |b, c| CertBounds {
                ok_until_ms: b.ok_until_ms.min(rules.ok_until(c.times())),
                first_expiry_ms: b.first_expiry_ms.min(c.expires_at_ms),
            })
    }

    /// Whether no certificate here can be a row of a listing at `now_ms` that wants
    /// `ok` ones or not, and those expiring before `before` (when given).
    fn excludes(&self, now_ms: i64, wants_ok: bool, before: Option<i64>) -> bool {
        (!wants_ok && now_ms < self.ok_until_ms)
            || before.is_some_and(|b| self.first_expiry_ms >= b)
    }
}

/// Schedules `e`'s next identity state change on the clock, and keeps its
/// [`CertBounds`].
pub(super) fn schedule(memory: &Memory, zone: &str, cluster: &str, e: &mut Entry) {
    let rules = memory.rules.identity;
    e.certs = CertBounds::of(e.instances.values(), &rules);
    let now = now_ms();
    let next = e
        .instances
        .values()
        .filter(|i| i.is_live())
        .filter_map(|i| i.identity.as_deref()?.next_change(&rules, now))
        .min();
    if let Some(at) = next {
        memory.identity_clock.schedule(at, zone, cluster);
    }
}

/// The catalog's identity inventory: a view over the live instances.
#[derive(Debug)]
pub struct Identities<'a> {
    pub(super) memory: &'a Memory,
}

/// One certificate's row before it is owned, for sorting.
struct Row<'a> {
    zone: &'a str,
    cluster: &'a str,
    instance: &'a str,
    owner: &'a str,
    cert: &'a HeldCert,
    state: CertState,
}

impl Identities<'_> {
    /// The rules states are read with.
    pub fn rules(&self) -> IdentityRules {
        self.memory.rules.identity
    }

    /// `GET /certificates`: one row per (live instance, certificate) that `q` asks
    /// for, sorted by expiry (then zone, cluster, instance, role, serial).
    pub fn certificates(&self, q: &CertificateQuery) -> Vec<CertificateRow> {
        self.certificates_at(q, now_ms())
    }

    /// [`Identities::certificates`] with the states read at `now`. A cluster whose
    /// [`CertBounds`] say it holds no row the query wants is passed without reading
    /// its instances: the listing of certificates that need action reads only the
    /// clusters that have one.
    pub(crate) fn certificates_at(&self, q: &CertificateQuery, now: i64) -> Vec<CertificateRow> {
        let rules = self.memory.rules.identity;
        let before = q
            .expiring_within
            .map(|d| now.saturating_add(d.as_millis().min(i64::MAX as u128) as i64));
        let wants_ok = q.states.is_empty() || q.states.contains(&CertState::Ok);
        let mut out = Vec::new();
        let mut visit = |cluster: &str, zone: &str, e: &Entry| {
            if q.zone.as_deref().is_some_and(|z| z != zone)
                || e.certs.excludes(now, wants_ok, before)
            {
                return;
            }
            let owner = e.record.as_ref().map_or("", |r| r.owner.as_str());
            let mut rows: Vec<Row<'_>> = Vec::new();
            for (name, i) in e.instances.iter().filter(|(_, i)| i.is_live()) {
                let Some(h) = i.identity.as_deref() else {
                    continue;
                };
                for c in h.certificates.iter() {
                    if before.is_some_and(|b| c.expires_at_ms >= b) {
                        continue;
                    }
                    let state = c.state(&rules, now);
                    if !q.states.is_empty() && !q.states.contains(&state) {
                        continue;
                    }
                    rows.push(Row {
                        zone,
                        cluster,
                        instance: name,
                        owner,
                        cert: c,
                        state,
                    });
                }
            }
            out.extend(rows.into_iter().map(|r| CertificateRow {
                zone_name: r.zone.to_owned(),
                cluster_name: r.cluster.to_owned(),
                instance: r.instance.to_owned(),
                owner: r.owner.to_owned(),
                role: r.cert.role,
                serial: r.cert.serial.to_string(),
                sans: r.cert.sans.iter().map(|s| s.value.clone()).collect(),
                valid_from_ms: r.cert.valid_from_ms,
                expires_at_ms: r.cert.expires_at_ms,
                source: r.cert.source(),
                secret: r.cert.secret.as_ref().map(|s| s.name.clone()),
                state: r.state,
            }));
        };
        match q.cluster.as_deref() {
            Some(c) => {
                if let Some(by_zone) = self.memory.clusters.get(c) {
                    for (zone, e) in by_zone.iter() {
                        visit(c, zone, e);
                    }
                }
            }
            None => {
                for by_zone in self.memory.clusters.iter() {
                    for (zone, e) in by_zone.iter() {
                        visit(by_zone.key(), zone, e);
                    }
                }
            }
        }
        out.sort_by(|a, b| {
            (
                a.expires_at_ms,
                &a.zone_name,
                &a.cluster_name,
                &a.instance,
                a.role,
                &a.serial,
            )
                .cmp(&(
                    b.expires_at_ms,
                    &b.zone_name,
                    &b.cluster_name,
                    &b.instance,
                    b.role,
                    &b.serial,
                ))
        });
        out
    }

    /// The live instances of (zone, cluster) with their identity now, by name, at
    /// most `max`.
    pub fn instances_of(
        &self,
        zone: &str,
        cluster: &str,
        max: usize,
    ) -> Vec<(String, meshcat_common::identity::InstanceIdentity)> {
        let rules = self.memory.rules.identity;
        let now = now_ms();
        let Some(by_zone) = self.memory.clusters.get(cluster) else {
            return Vec::new();
        };
        let Some(e) = by_zone.get(zone) else {
            return Vec::new();
        };
        e.instances
            .iter()
            .filter(|(_, i)| i.is_live())
            .take(max)
            .map(|(name, i)| (name.clone(), instance_identity(i, &rules, now).owned()))
            .collect()
    }

    /// Certificates of live instances by state now, every state listed.
    pub fn counts(&self) -> [(CertState, u64); 5] {
        let rules = self.memory.rules.identity;
        let now = now_ms();
        let mut counts = CertState::ALL.map(|s| (s, 0u64));
        for by_zone in self.memory.clusters.iter() {
            for (_, e) in by_zone.iter() {
                for i in e.instances.values().filter(|i| i.is_live()) {
                    let Some(h) = i.identity.as_deref() else {
                        continue;
                    };
                    for c in h.certificates.iter() {
                        let s = c.state(&rules, now);
                        if let Some(slot) = counts.iter_mut().find(|(k, _)| *k == s) {
                            slot.1 += 1;
                        }
                    }
                }
            }
        }
        counts
    }

    /// Looks at the clusters whose identity state may have changed with time by
    /// `now_ms`: notes each live instance whose state changed, moves the catalog
    /// index for the registered ones, and schedules each again.
    pub fn tick(&self, now: std::time::Instant) {
        let due = self.memory.identity_clock.take_due(now_ms());
        if due.is_empty() {
            return;
        }
        let rules = self.memory.rules.identity;
        let _st = shared(&self.memory.state);
        let mut touched = Vec::new();
        for (zone, cluster) in due {
            let Some(mut by_zone) = self.memory.clusters.get_mut(&cluster) else {
                continue;
            };
            let Some(e) = by_zone.get_mut(&zone) else {
                continue;
            };
            let at = now_ms();
            let mut moved = false;
            for (name, i) in e.instances.iter_mut().filter(|(_, i)| i.is_live()) {
                let state = state_of(i, &rules, at);
                if state == i.identity_state {
                    continue;
                }
                moved = true;
                if let Some(history) = self.memory.history.get() {
                    let c = i
                        .identity
                        .as_deref()
                        .and_then(|h| h.identity_cert(&rules, at));
                    history.record_instance(
                        Pending::new(
                            Kind::CertificateState,
                            &zone,
                            &cluster,
                            name,
                            Detail::CertificateState {
                                from: i.identity_state.as_str(),
                                to: state.as_str(),
                                serial: c.map(|c| c.serial.to_string()),
                                expires_at_ms: c.map(|c| c.expires_at_ms),
                            },
                        ),
                        now,
                    );
                }
                i.identity_state = state;
            }
            schedule(self.memory, &zone, &cluster, e);
            if moved && e.record.is_some() {
                touched.push(Touch::Cluster(zone, cluster));
            }
        }
        if !touched.is_empty() {
            self.memory.publish(&touched);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshcat_common::identity::{InstanceIdentity, ReportedCertificate, SanExpectation};

    const DAY: i64 = 86_400_000;

    fn cert(serial: &str, expires: i64, sans: &[&str]) -> ReportedCertificate {
        ReportedCertificate {
            serial: serial.into(),
            role: CertRole::Chain,
            sans: sans.iter().map(|s| San::new(SanKind::Uri, *s)).collect(),
            valid_from_ms: expires - 30 * DAY,
            expires_at_ms: expires,
            secret: None,
        }
    }

    #[test]
    fn instances_of_one_cluster_share_what_they_agree_on() {
        let expectations = vec![SanExpectation {
            cluster: "payments".into(),
            matchers: vec![SanMatcher::exact(SanKind::Uri, "spiffe://shop/sa/payments")],
        }];
        let a = HeldIdentity::hold(
            IdentityReport::new(
                vec![cert("01", 10 * DAY, &["spiffe://shop/sa/orders"])],
                expectations.clone(),
                None,
            ),
            std::iter::empty(),
        );
        let b = HeldIdentity::hold(
            IdentityReport::new(
                vec![cert("02", 11 * DAY, &["spiffe://shop/sa/orders"])],
                expectations,
                None,
            ),
            std::iter::once(&a),
        );
        assert!(Arc::ptr_eq(
            &a.certificates[0].sans,
            &b.certificates[0].sans
        ));
        assert!(Arc::ptr_eq(&a.presented, &b.presented));
        assert!(Arc::ptr_eq(
            a.expectations.as_ref().unwrap(),
            b.expectations.as_ref().unwrap()
        ));
        let m = b.expectations.as_ref().unwrap().get("payments").unwrap();
        assert!(m.accept(&[San::new(SanKind::Uri, "spiffe://shop/sa/payments")]));
        assert!(b.expectations.as_ref().unwrap().get("orders").is_none());
    }

    #[test]
    fn the_identity_is_the_soonest_expiring_chain_certificate_and_renders_as_serde_would() {
        let rules = IdentityRules::default();
        let mut ca = cert("ca", DAY, &[]);
        ca.role = CertRole::Ca;
        let mut sds = cert("0b", 5 * DAY, &["spiffe://shop/sa/orders"]);
        sds.secret = Some(SdsSecret {
            name: "default".into(),
            version: "7".into(),
            last_updated_ms: 1,
        });
        let h = HeldIdentity::hold(
            IdentityReport::new(
                vec![ca, cert("0a", 40 * DAY, &["spiffe://shop/sa/orders"]), sds],
                Vec::new(),
                None,
            ),
            std::iter::empty(),
        );
        let c = h.identity_cert(&rules, 0).unwrap();
        assert_eq!(
            &*c.serial, "0b",
            "the CA is no identity; the soonest chain is"
        );
        let json = serde_json::to_string(&InstanceIdentityRef {
            state: c.state(&rules, 0),
            sans: SanValues(&c.sans),
            expires_at_ms: Some(c.expires_at_ms),
            valid_from_ms: Some(c.valid_from_ms),
            source: Some(c.source()),
            secret: Some("default"),
            serial: Some(&c.serial),
            reason: None,
        })
        .unwrap();
        // 25 of its 30 days gone and not replaced: past 80 %, overdue.
        let oracle = serde_json::to_string(&InstanceIdentity {
            state: CertState::RotationOverdue,
            sans: vec!["spiffe://shop/sa/orders".into()],
            expires_at_ms: Some(5 * DAY),
            valid_from_ms: Some(5 * DAY - 30 * DAY),
            source: Some(CertSource::Sds),
            secret: Some("default".into()),
            serial: Some("0b".into()),
            reason: None,
        })
        .unwrap();
        assert_eq!(json, oracle);
    }

    #[test]
    fn a_target_matches_when_every_live_instance_presents_an_accepted_san() {
        let accept_payments = Arc::new(MatcherSet::new(vec![SanMatcher::exact(
            SanKind::Uri,
            "spiffe://shop/sa/payments",
        )]));
        let right: Arc<[San]> = vec![San::new(SanKind::Uri, "spiffe://shop/sa/payments")].into();
        let wrong: Arc<[San]> = vec![San::new(SanKind::Uri, "spiffe://shop/sa/WRONG")].into();
        let target = |presented: Vec<Arc<[San]>>, without| ClusterTls {
            presented,
            expectations: Vec::new(),
            without,
        };
        let m = compare(&[&accept_payments], &target(vec![right.clone()], 0)).unwrap();
        assert!(m.matches);
        assert_eq!(m.expected_sans, ["spiffe://shop/sa/payments"]);
        let mixed = compare(&[&accept_payments], &target(vec![right.clone(), wrong], 0)).unwrap();
        assert!(
            !mixed.matches,
            "one instance presents what the caller refuses"
        );
        assert_eq!(
            mixed.presented_sans,
            ["spiffe://shop/sa/WRONG", "spiffe://shop/sa/payments"]
        );
        assert!(
            !compare(&[&accept_payments], &target(vec![right], 1))
                .unwrap()
                .matches,
            "an instance without a certificate fails the handshake"
        );
        assert!(compare(&[], &target(Vec::new(), 0)).is_none());
    }
}
