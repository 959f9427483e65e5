//! The per-instance bounds (contract section 10; `--max-upstream-clusters`,
//! `--max-upstream-hosts`): how large one instance may be. One rule, checked twice:
//! by the ingest on what one message carries ([`InstanceSize::sent`], before anything
//! is applied), and by the live instances on what the catalog would keep for the
//! instance once the message is applied (a delta adds to what is kept, so a bound
//! checked on messages alone would let deltas walk around it). An instance past a
//! bound is refused alone, with the bound's reason.
//!
//! A bounded set is a variant of [`Bounded`] (its reason code, its name in the
//! refusal's sentence and its limit) and a field of [`InstanceSize`], counted in
//! [`InstanceSize::sent`]. A set sent whole in every report is kept as sent; a set
//! that deltas change is counted after the merge where the instance is kept
//! (`store::instances`).

use meshcat_common::wire::InstanceReport;

/// A set of an instance that is bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bounded {
    /// The upstream clusters the sidecar knows.
    Clusters,
    /// The upstreams that carried traffic.
    Upstreams,
    /// The listeners.
    Listeners,
    /// The hosts of the upstream clusters (their `host_count`), plus the cluster
    /// names the listeners' routes give.
    Hosts,
}

impl Bounded {
    /// Every bounded set, in the order they are checked.
    pub const ALL: [Bounded; 4] = [
        Bounded::Clusters,
        Bounded::Upstreams,
        Bounded::Listeners,
        Bounded::Hosts,
    ];

    /// The refusal's reason code (docs/wire.md). Upstreams and listeners are held to
    /// the upstream clusters' bound, and refused with its reason.
    pub fn reason(self) -> &'static str {
        match self {
            Bounded::Clusters | Bounded::Upstreams | Bounded::Listeners => {
                "too_many_upstream_clusters"
            }
            Bounded::Hosts => "too_many_upstream_hosts",
        }
    }

    /// The set's name in a refusal's sentence.
    fn noun(self) -> &'static str {
        match self {
            Bounded::Clusters => "upstream clusters",
            Bounded::Upstreams => "upstreams with traffic",
            Bounded::Listeners => "listeners",
            Bounded::Hosts => "upstream hosts",
        }
    }
}

/// How many of each bounded set an instance has: in one message, or as kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InstanceSize {
    pub clusters: u32,
    pub upstreams: u32,
    pub listeners: u32,
    /// The upstream clusters' hosts.
    pub cluster_hosts: u32,
    /// The cluster names the listeners' routes give (counted as hosts).
    pub routes: u32,
}

/// `n` as a count, saturating: a count past `u32::MAX` is over every bound anyway.
fn count(n: impl TryInto<u32>) -> u32 {
    n.try_into().unwrap_or(u32::MAX)
}

impl InstanceSize {
    /// What `r` carries of each set (of a delta, only what it sends). A cluster sent
    /// with more addresses than its `host_count` counts its addresses.
    pub fn sent(r: &InstanceReport) -> InstanceSize {
        let cluster_hosts: u64 = r
            .clusters
            .iter()
            .map(|c| u64::from(c.host_count).max(c.hosts.len() as u64))
            .sum();
        let routes: usize = r.listeners.iter().map(|l| l.clusters.len()).sum();
        InstanceSize {
            clusters: count(r.clusters.len()),
            upstreams: count(r.upstreams.len()),
            listeners: count(r.listeners.len()),
            cluster_hosts: count(cluster_hosts),
            routes: count(routes),
        }
    }

    /// How many of `set` this size holds.
    pub fn of(&self, set: Bounded) -> u64 {
        match set {
            Bounded::Clusters => self.clusters.into(),
            Bounded::Upstreams => self.upstreams.into(),
            Bounded::Listeners => self.listeners.into(),
            Bounded::Hosts => u64::from(self.cluster_hosts) + u64::from(self.routes),
        }
    }
}

/// The per-instance bounds: `--max-upstream-clusters` for the upstream clusters, the
/// upstreams with traffic and the listeners; `--max-upstream-hosts` for the hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceBounds {
    pub max_upstream_clusters: u64,
    pub max_upstream_hosts: u64,
}

impl Default for InstanceBounds {
    fn default() -> Self {
        InstanceBounds {
            max_upstream_clusters: super::DEFAULT_MAX_UPSTREAM_CLUSTERS as u64,
            max_upstream_hosts: super::DEFAULT_MAX_UPSTREAM_HOSTS as u64,
        }
    }
}

impl InstanceBounds {
    /// The limit of `set`.
    pub fn limit(&self, set: Bounded) -> u64 {
        match set {
            Bounded::Clusters | Bounded::Upstreams | Bounded::Listeners => {
                self.max_upstream_clusters
            }
            Bounded::Hosts => self.max_upstream_hosts,
        }
    }

    /// The first bound `size` passes, if any.
    pub fn check(&self, size: &InstanceSize) -> Result<(), OverBound> {
        for set in Bounded::ALL {
            let (count, limit) = (size.of(set), self.limit(set));
            if count > limit {
                return Err(OverBound { set, count, limit });
            }
        }
        Ok(())
    }
}

/// A bound an instance passes: the set, its count and its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBound {
    pub set: Bounded,
    pub count: u64,
    pub limit: u64,
}

impl OverBound {
    /// The refusal's reason code.
    pub fn reason(&self) -> &'static str {
        self.set.reason()
    }
}

impl std::fmt::Display for OverBound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}, over the limit of {}",
            self.count,
            self.set.noun(),
            self.limit
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshcat_common::wire::{ListenerRoutes, ReportedCluster, UpstreamTraffic};

    fn report() -> InstanceReport {
        InstanceReport::unread("z".into(), "c".into(), "i".into())
    }

    #[test]
    fn every_set_is_held_to_its_limit_and_named_in_the_refusal() {
        let bounds = InstanceBounds {
            max_upstream_clusters: 2,
            max_upstream_hosts: 3,
        };
        let at = InstanceSize {
            clusters: 2,
            upstreams: 2,
            listeners: 2,
            cluster_hosts: 2,
            routes: 1,
        };
        assert_eq!(bounds.check(&at), Ok(()));
        for (set, size) in [
            (Bounded::Clusters, InstanceSize { clusters: 3, ..at }),
            (Bounded::Upstreams, InstanceSize { upstreams: 3, ..at }),
            (Bounded::Listeners, InstanceSize { listeners: 3, ..at }),
            (Bounded::Hosts, InstanceSize { routes: 2, ..at }),
        ] {
            let over = bounds.check(&size).unwrap_err();
            assert_eq!(over.set, set);
            assert_eq!(over.reason(), set.reason());
            assert_eq!(over.count, over.limit + 1);
        }
        let over = bounds
            .check(&InstanceSize { listeners: 7, ..at })
            .unwrap_err();
        assert_eq!(over.to_string(), "7 listeners, over the limit of 2");
    }

    #[test]
    fn a_message_counts_what_it_carries() {
        let mut r = report();
        let mut bare = ReportedCluster::healthy("b", Vec::new());
        bare.host_count = 5;
        r.clusters = vec![
            ReportedCluster::healthy("a", vec!["10.0.0.1:80".into()]),
            bare,
        ];
        r.upstreams = vec![UpstreamTraffic {
            name: "a".into(),
            requests_total: 1,
            errors_total: 0,
            connect_fail_total: 0,
            p50_ms: None,
            p99_ms: None,
            tls: false,
        }];
        r.listeners = vec![ListenerRoutes {
            address: "10.0.0.9:80".into(),
            clusters: vec!["a".into(), "b".into()],
        }];
        let s = InstanceSize::sent(&r);
        assert_eq!(
            s,
            InstanceSize {
                clusters: 2,
                upstreams: 1,
                listeners: 1,
                cluster_hosts: 6,
                routes: 2,
            }
        );
        assert_eq!(s.of(Bounded::Hosts), 8);
    }
}
