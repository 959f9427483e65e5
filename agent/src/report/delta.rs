//! Reports by what changed. The first report of an instance on a connection holds
//! its whole state; each later one holds only what changed since the report the
//! aggregator last acknowledged for it (docs/wire.md, "Deltas"): clusters whose
//! host set or health moved, upstreams whose figures moved, the listeners and the
//! identity (certificates and SAN expectations) when they moved, and the names of
//! what went. A steady sidecar with 20,000 upstream clusters thus costs a few hundred
//! bytes a report instead of megabytes.
//!
//! The aggregator refuses a delta whose base it does not hold (`stale_base`: it
//! restarted, or another replica took the connection); the agent then sends that
//! instance whole. A new connection starts from nothing, so a reconnect resends
//! every instance whole.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use meshcat_common::wire::{
    Delta, InstanceReport, ListenerRoutes, RefusedInstance, ReportedCluster, UpstreamTraffic,
};

type Key = (String, String, String);

fn key_of(r: &InstanceReport) -> Key {
    (
        r.zone_name.clone(),
        r.cluster_name.clone(),
        r.instance.clone(),
    )
}

/// What the aggregator holds of one instance, as of an acknowledged report.
#[derive(Debug, Clone, Default)]
pub struct Acked {
    seq: u64,
    /// Per cluster: digest, host count, healthy count, added by the API.
    clusters: HashMap<String, (u64, u32, u32, bool)>,
    upstreams: HashMap<String, UpstreamTraffic>,
    listeners: u64,
    /// The digest of the identity it holds, if any.
    identity: Option<u64>,
}

impl Acked {
    fn of(r: &InstanceReport, listeners: u64) -> Self {
        Acked {
            seq: r.seq,
            clusters: r
                .clusters
                .iter()
                .map(|c| {
                    (
                        c.name.clone(),
                        (
                            c.hosts_digest,
                            c.host_count,
                            c.healthy_count,
                            c.added_via_api,
                        ),
                    )
                })
                .collect(),
            upstreams: r
                .upstreams
                .iter()
                .map(|u| (u.name.clone(), u.clone()))
                .collect(),
            listeners,
            identity: r.identity.as_ref().map(|i| i.digest),
        }
    }
}

/// One instance ready to send: its wire form, and what the aggregator will hold
/// once it acknowledges it.
#[derive(Debug)]
pub struct Prepared {
    pub report: InstanceReport,
    pub pending: Pending,
}

/// What the aggregator will hold of an instance once it acknowledges its report.
#[derive(Debug)]
pub struct Pending {
    key: Key,
    after: Acked,
}

/// The acknowledged state of every instance on one connection.
#[derive(Debug, Default)]
pub struct Deltas {
    acked: HashMap<Key, Acked>,
    next_seq: u64,
    /// The refusals already logged on this connection, by instance and reason.
    refusals: HashSet<(Key, String)>,
}

fn listeners_hash(listeners: &[ListenerRoutes]) -> u64 {
    let mut h = DefaultHasher::new();
    for l in listeners {
        l.address.hash(&mut h);
        l.clusters.hash(&mut h);
    }
    h.finish()
}

impl Deltas {
    /// The wire form of each snapshot: whole when the aggregator holds nothing of
    /// it on this connection, otherwise what changed since what it holds.
    pub fn prepare(&mut self, snapshot: Vec<InstanceReport>) -> Vec<Prepared> {
        snapshot
            .into_iter()
            .map(|mut r| {
                self.next_seq += 1;
                r.seq = self.next_seq;
                r.delta = None;
                let listeners = listeners_hash(&r.listeners);
                let after = Acked::of(&r, listeners);
                let key = key_of(&r);
                if let Some(base) = self.acked.get(&key) {
                    thin(&mut r, base, listeners);
                }
                Prepared {
                    report: r,
                    pending: Pending { key, after },
                }
            })
            .collect()
    }

    /// Takes the aggregator's answer to a report of `sent`: every instance it did
    /// not refuse is now the base of the next delta; a refused one is sent whole
    /// next time.
    pub fn acknowledged(&mut self, sent: Vec<Pending>, refused: &[RefusedInstance]) {
        let refused: HashSet<(&str, &str, &str)> = refused
            .iter()
            .map(|r| {
                (
                    r.zone_name.as_str(),
                    r.cluster_name.as_str(),
                    r.instance.as_str(),
                )
            })
            .collect();
        for p in sent {
            let k = p.key;
            if refused.contains(&(k.0.as_str(), k.1.as_str(), k.2.as_str())) {
                self.acked.remove(&k);
            } else {
                self.acked.insert(k, p.after);
            }
        }
    }

    /// Whether this refusal is the first of its instance and reason on this
    /// connection (the ones before were logged).
    pub fn first_refusal(&mut self, r: &RefusedInstance) -> bool {
        // Bounded as the instances are: one entry per instance and reason.
        self.refusals.insert((
            (
                r.zone_name.clone(),
                r.cluster_name.clone(),
                r.instance.clone(),
            ),
            r.reason.clone(),
        ))
    }

    /// Forgets one instance's acknowledged state: it is sent whole next time.
    pub fn forget(&mut self, p: &Pending) {
        self.acked.remove(&p.key);
    }

    /// Forgets the instances no longer in the snapshot (their target went).
    pub fn retain_current(&mut self, current: &[InstanceReport]) {
        let keep: HashSet<Key> = current.iter().map(key_of).collect();
        self.acked.retain(|k, _| keep.contains(k));
        self.refusals.retain(|(k, _)| keep.contains(k));
    }
}

/// Cuts the whole report `r` down to what changed against `base`.
fn thin(r: &mut InstanceReport, base: &Acked, listeners: u64) {
    let mut delta = Delta {
        base: base.seq,
        ..Delta::default()
    };
    let present: HashSet<&str> = r.clusters.iter().map(|c| c.name.as_str()).collect();
    delta.removed_clusters = base
        .clusters
        .keys()
        .filter(|n| !present.contains(n.as_str()))
        .cloned()
        .collect();
    delta.removed_clusters.sort();
    let listed: HashSet<&str> = r.upstreams.iter().map(|u| u.name.as_str()).collect();
    delta.removed_upstreams = base
        .upstreams
        .keys()
        .filter(|n| !listed.contains(n.as_str()))
        .cloned()
        .collect();
    delta.removed_upstreams.sort();
    // An upstream that starts carrying traffic has its cluster sent with the hosts'
    // addresses, which the graph matches against listeners.
    let newly_used: HashSet<String> = r
        .upstreams
        .iter()
        .filter(|u| !base.upstreams.contains_key(&u.name))
        .map(|u| u.name.clone())
        .collect();
    r.upstreams
        .retain(|u| base.upstreams.get(&u.name) != Some(u));
    r.clusters.retain(|c: &ReportedCluster| {
        newly_used.contains(&c.name)
            || base.clusters.get(&c.name)
                != Some(&(
                    c.hosts_digest,
                    c.host_count,
                    c.healthy_count,
                    c.added_via_api,
                ))
    });
    if listeners == base.listeners {
        r.listeners = Vec::new();
        delta.listeners_unchanged = true;
    }
    // The identity goes only when it moved: certificates cost nothing steady.
    if r.identity.as_ref().map(|i| i.digest) == base.identity {
        r.identity = None;
    }
    r.delta = Some(delta);
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshcat_common::wire::hosts_digest;

    fn cluster(name: &str, hosts: &[&str]) -> ReportedCluster {
        ReportedCluster {
            name: name.into(),
            added_via_api: false,
            hosts_digest: hosts_digest(hosts.iter().copied()),
            host_count: hosts.len() as u32,
            healthy_count: hosts.len() as u32,
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
        }
    }

    fn snapshot(clusters: Vec<ReportedCluster>, upstreams: Vec<UpstreamTraffic>) -> InstanceReport {
        InstanceReport {
            clusters,
            upstreams,
            listeners: vec![ListenerRoutes {
                address: "10.0.0.1:8080".into(),
                clusters: vec!["a".into()],
            }],
            ..InstanceReport::unread("z".into(), "svc".into(), "svc-1".into())
        }
    }

    fn traffic(name: &str, requests: u64) -> UpstreamTraffic {
        UpstreamTraffic {
            name: name.into(),
            requests_total: requests,
            errors_total: 0,
            connect_fail_total: 0,
            p50_ms: None,
            p99_ms: None,
            tls: false,
        }
    }

    #[test]
    fn whole_first_then_only_what_changed_then_whole_after_a_refusal() {
        let many: Vec<ReportedCluster> = (0..1000)
            .map(|i| cluster(&format!("c{i}"), &["10.1.0.1:80"]))
            .collect();
        let mut d = Deltas::default();
        let first = d.prepare(vec![snapshot(many.clone(), vec![traffic("c1", 5)])]);
        assert!(first[0].report.delta.is_none());
        assert_eq!(first[0].report.clusters.len(), 1000);
        d.acknowledged(first.into_iter().map(|p| p.pending).collect(), &[]);

        // Steady: nothing but the figures of the instance itself.
        let steady = d.prepare(vec![snapshot(many.clone(), vec![traffic("c1", 5)])]);
        let r = &steady[0].report;
        let delta = r.delta.as_ref().expect("a delta");
        assert_eq!(delta.base, 1);
        assert!(r.clusters.is_empty() && r.upstreams.is_empty() && r.listeners.is_empty());
        assert!(delta.listeners_unchanged);
        let bytes = meshcat_common::wire::encoded_len(r);
        assert!(bytes < 1024, "a steady delta is small: {bytes} bytes");
        d.acknowledged(steady.into_iter().map(|p| p.pending).collect(), &[]);

        // One cluster's hosts move, one goes, one upstream carries more, one starts.
        let mut moved = many.clone();
        moved[7] = cluster("c7", &["10.1.0.2:80"]);
        moved.remove(9);
        let next = d.prepare(vec![snapshot(
            moved,
            vec![traffic("c1", 9), traffic("c2", 1)],
        )]);
        let r = &next[0].report;
        let delta = r.delta.as_ref().unwrap();
        assert_eq!(delta.base, 2);
        let names: Vec<&str> = r.clusters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["c2", "c7"],
            "the moved cluster, and the newly used one"
        );
        assert_eq!(delta.removed_clusters, ["c9"]);
        assert_eq!(r.upstreams.len(), 2);
        // Refused (the aggregator lost the base): whole again.
        let refused = [RefusedInstance {
            zone_name: "z".into(),
            cluster_name: "svc".into(),
            instance: "svc-1".into(),
            reason: meshcat_common::wire::STALE_BASE.into(),
        }];
        d.acknowledged(next.into_iter().map(|p| p.pending).collect(), &refused);
        // Logged once per instance and reason on the connection.
        assert!(d.first_refusal(&refused[0]));
        assert!(!d.first_refusal(&refused[0]));
        let again = d.prepare(vec![snapshot(many, vec![])]);
        assert!(again[0].report.delta.is_none());
        assert_eq!(again[0].report.clusters.len(), 1000);
    }
}
