//! What an instance's sidecar holds of its upstream clusters: per cluster its name,
//! the digest and size of its host set, and the keys of its first hosts' addresses
//! for the graph. A delta report changes it in place of a whole one (docs/wire.md,
//! "Deltas").
//!
//! Kept small, since a sidecar of a mesh without configuration scoping holds every
//! cluster of the mesh (20,000 and more) and most of them never carry traffic: a
//! cluster's name is shared by every instance that has it ([`Names`]), and host keys
//! are kept only for the clusters whose upstreams carry traffic (the agent sends a
//! cluster's addresses again when its upstream starts carrying traffic), all in one
//! slice. About 40 bytes per idle cluster (docs/benchmarks.md).

use std::collections::HashSet;
use std::sync::{Arc, LazyLock};

use dashmap::DashSet;
use meshcat_common::wire::{Delta, ReportedCluster};

use super::traffic::address_key;

/// Longest cluster name kept (longer ones are refused with their report's instance).
pub const MAX_NAME: usize = 512;
/// Most host keys kept per cluster: the graph matches at most as many hosts of an
/// upstream against listener addresses.
pub const MAX_KEPT_HOSTS: usize = 64;

/// One upstream cluster of a sidecar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldCluster {
    pub name: Arc<str>,
    pub hosts_digest: u64,
    pub host_count: u32,
    pub healthy_count: u32,
    pub added_via_api: bool,
    /// Where this cluster's keys start in [`ClusterSet::keys`], and how many.
    start: u32,
    kept: u16,
}

/// An instance's upstream clusters, sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterSet {
    clusters: Box<[HeldCluster]>,
    keys: Box<[u64]>,
    /// The clusters' `host_count`s summed, for the per-instance bound on hosts.
    hosts: u64,
}

impl ClusterSet {
    /// The set a whole report describes, with host keys for the clusters `used`
    /// says carry traffic. Entries past the first of a name are ignored; the caller
    /// has checked names and counts.
    pub fn full(reported: &[ReportedCluster], used: impl Fn(&str) -> bool) -> ClusterSet {
        let mut sorted: Vec<&ReportedCluster> = reported.iter().collect();
        sorted.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        sorted.dedup_by(|a, b| a.name == b.name);
        let mut b = Builder::with_capacity(sorted.len());
        for c in sorted {
            b.push_reported(c, used(&c.name));
        }
        b.finish()
    }

    /// This set changed by a delta: `changed` replaces or adds clusters, the
    /// delta's `removed_clusters` go. A cluster sent without its addresses keeps
    /// the keys it had when its digest is the same; one sent with them has keys
    /// when `used` says it carries traffic or it had keys before.
    pub fn apply(
        &self,
        changed: &[ReportedCluster],
        delta: &Delta,
        used: impl Fn(&str) -> bool,
    ) -> ClusterSet {
        if changed.is_empty() && delta.removed_clusters.is_empty() {
            return self.clone();
        }
        let removed: HashSet<&str> = delta.removed_clusters.iter().map(String::as_str).collect();
        let mut incoming: Vec<&ReportedCluster> = changed.iter().collect();
        incoming.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        incoming.dedup_by(|a, b| a.name == b.name);
        let mut b = Builder::with_capacity(self.clusters.len() + incoming.len());
        let mut new = incoming.into_iter().peekable();
        for old in self.clusters.iter() {
            while let Some(c) = new.next_if(|c| *c.name < *old.name) {
                b.push_reported(c, used(&c.name));
            }
            if let Some(c) = new.next_if(|c| *c.name == *old.name) {
                if !c.has_addresses() && c.hosts_digest == old.hosts_digest {
                    b.push_held(old, self.keys_of(old), c);
                } else {
                    b.push_reported(c, used(&c.name) || old.kept > 0);
                }
            } else if !removed.contains(&*old.name) {
                b.keep(old, self.keys_of(old));
            }
        }
        for c in new {
            b.push_reported(c, used(&c.name));
        }
        b.finish()
    }

    pub fn len(&self) -> usize {
        self.clusters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
    }

    /// The hosts of every cluster (their `host_count`s summed).
    pub fn hosts(&self) -> u64 {
        self.hosts
    }

    pub fn iter(&self) -> impl Iterator<Item = &HeldCluster> {
        self.clusters.iter()
    }

    /// The cluster of this name.
    pub fn get(&self, name: &str) -> Option<&HeldCluster> {
        self.clusters
            .binary_search_by(|c| (*c.name).cmp(name))
            .ok()
            .map(|i| &self.clusters[i])
    }

    /// The address keys kept of the hosts of cluster `name` (none for an unknown
    /// one).
    pub fn hosts_of(&self, name: &str) -> &[u64] {
        self.get(name).map(|c| self.keys_of(c)).unwrap_or_default()
    }

    fn keys_of(&self, c: &HeldCluster) -> &[u64] {
        let start = c.start as usize;
        &self.keys[start..start + usize::from(c.kept)]
    }

    /// Bytes held by this set beyond the names shared with other sets.
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.clusters) + std::mem::size_of_val(&*self.keys)
    }
}

impl From<&HeldCluster> for ReportedCluster {
    fn from(c: &HeldCluster) -> Self {
        ReportedCluster {
            name: c.name.to_string(),
            added_via_api: c.added_via_api,
            hosts_digest: c.hosts_digest,
            host_count: c.host_count,
            healthy_count: c.healthy_count,
            hosts: Vec::new(),
        }
    }
}

struct Builder {
    clusters: Vec<HeldCluster>,
    keys: Vec<u64>,
    hosts: u64,
}

impl Builder {
    fn with_capacity(n: usize) -> Self {
        Builder {
            clusters: Vec::with_capacity(n),
            keys: Vec::new(),
            hosts: 0,
        }
    }

    fn push_reported(&mut self, c: &ReportedCluster, with_keys: bool) {
        let start = self.keys.len();
        if with_keys {
            self.keys.extend(
                c.hosts
                    .iter()
                    .filter(|a| a.len() <= MAX_NAME)
                    .take(MAX_KEPT_HOSTS)
                    .map(|a| address_key(a)),
            );
        }
        self.push(c, start);
    }

    fn push_held(&mut self, old: &HeldCluster, keys: &[u64], now: &ReportedCluster) {
        let start = self.keys.len();
        self.keys.extend_from_slice(keys);
        let mut c = self.entry(now, start);
        c.name = old.name.clone();
        self.hosts += u64::from(c.host_count);
        self.clusters.push(c);
    }

    fn keep(&mut self, old: &HeldCluster, keys: &[u64]) {
        let start = self.keys.len();
        self.keys.extend_from_slice(keys);
        self.hosts += u64::from(old.host_count);
        self.clusters.push(HeldCluster {
            start: u32::try_from(start).unwrap_or(u32::MAX),
            ..old.clone()
        });
    }

    fn push(&mut self, c: &ReportedCluster, start: usize) {
        let mut entry = self.entry(c, start);
        entry.name = NAMES.intern(&c.name);
        self.hosts += u64::from(entry.host_count);
        self.clusters.push(entry);
    }

    fn entry(&self, c: &ReportedCluster, start: usize) -> HeldCluster {
        HeldCluster {
            name: Arc::from(""),
            hosts_digest: c.hosts_digest,
            host_count: c.host_count,
            healthy_count: c.healthy_count,
            added_via_api: c.added_via_api,
            start: u32::try_from(start).unwrap_or(u32::MAX),
            kept: u16::try_from(self.keys.len() - start).unwrap_or(u16::MAX),
        }
    }

    fn finish(self) -> ClusterSet {
        ClusterSet {
            clusters: self.clusters.into_boxed_slice(),
            keys: self.keys.into_boxed_slice(),
            hosts: self.hosts,
        }
    }
}

/// Upstream cluster names, each held once however many sidecars have it.
pub static NAMES: LazyLock<Names> = LazyLock::new(Names::default);

#[derive(Debug, Default)]
pub struct Names(DashSet<Arc<str>>);

impl Names {
    /// The shared copy of `name`.
    pub fn intern(&self, name: &str) -> Arc<str> {
        if let Some(n) = self.0.get(name) {
            return n.key().clone();
        }
        let n: Arc<str> = Arc::from(name);
        // A name added between the lookup and here by another report wins.
        if !self.0.insert(n.clone()) {
            if let Some(other) = self.0.get(name) {
                return other.key().clone();
            }
        }
        n
    }

    /// Forgets the names no set holds any more; run from the expiry sweep.
    pub fn sweep(&self) {
        self.0.retain(|n| Arc::strong_count(n) > 1);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshcat_common::wire::hosts_digest;

    fn cluster(name: &str, hosts: &[&str]) -> ReportedCluster {
        ReportedCluster {
            name: name.into(),
            added_via_api: true,
            hosts_digest: hosts_digest(hosts.iter().copied()),
            host_count: hosts.len() as u32,
            healthy_count: hosts.len() as u32,
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
        }
    }

    #[test]
    fn a_delta_changes_adds_and_removes_and_keeps_the_rest() {
        let base = ClusterSet::full(
            &[
                cluster("b", &["10.0.0.2:80"]),
                cluster("a", &["10.0.0.1:80", "10.0.0.9:80"]),
                cluster("c", &["10.0.0.3:80"]),
            ],
            |_| true,
        );
        assert_eq!(base.len(), 3);
        assert_eq!(
            base.hosts_of("a"),
            [address_key("10.0.0.1:80"), address_key("10.0.0.9:80")]
        );
        let changed = [cluster("b", &["10.0.0.4:80"]), cluster("d", &[])];
        let next = base.apply(
            &changed,
            &Delta {
                base: 1,
                removed_clusters: vec!["c".into()],
                ..Delta::default()
            },
            |_| false,
        );
        let names: Vec<&str> = next.iter().map(|c| &*c.name).collect();
        assert_eq!(names, ["a", "b", "d"]);
        assert_eq!((base.hosts(), next.hosts()), (4, 3));
        assert_eq!(next.hosts_of("b"), [address_key("10.0.0.4:80")]);
        assert_eq!(next.hosts_of("a"), base.hosts_of("a"));
        assert_eq!(next.get("a"), base.get("a"));
        assert!(next.get("c").is_none());
        // A steady delta is the same set.
        assert_eq!(base.apply(&[], &Delta::default(), |_| true), base);
    }

    #[test]
    fn a_cluster_sent_without_addresses_keeps_its_keys_while_its_digest_holds() {
        let base = ClusterSet::full(&[cluster("a", &["10.0.0.1:80"])], |_| true);
        let mut bare = cluster("a", &["10.0.0.1:80"]);
        bare.hosts.clear();
        bare.healthy_count = 0;
        let next = base.apply(std::slice::from_ref(&bare), &Delta::default(), |_| false);
        assert_eq!(next.hosts_of("a"), [address_key("10.0.0.1:80")]);
        assert_eq!(next.get("a").unwrap().healthy_count, 0);
        bare.hosts_digest ^= 1;
        let moved = base.apply(&[bare], &Delta::default(), |_| true);
        assert!(moved.hosts_of("a").is_empty());
    }

    #[test]
    fn idle_clusters_keep_no_host_keys_until_their_upstream_carries_traffic() {
        let idle = ClusterSet::full(&[cluster("a", &["10.0.0.1:80", "10.0.0.2:80"])], |_| false);
        assert!(idle.hosts_of("a").is_empty());
        assert_eq!(idle.get("a").unwrap().host_count, 2);
        assert_eq!(idle.heap_bytes(), std::mem::size_of::<HeldCluster>());
        // The agent sends the cluster again, with its addresses, when its upstream
        // starts carrying traffic.
        let used = idle.apply(
            &[cluster("a", &["10.0.0.1:80", "10.0.0.2:80"])],
            &Delta::default(),
            |n| n == "a",
        );
        assert_eq!(used.hosts_of("a").len(), 2);
    }

    #[test]
    fn names_are_shared_between_sets_and_swept_when_unheld() {
        let one = ClusterSet::full(&[cluster("shared-name-for-the-test", &[])], |_| true);
        let two = ClusterSet::full(&[cluster("shared-name-for-the-test", &[])], |_| true);
        assert!(Arc::ptr_eq(
            &one.get("shared-name-for-the-test").unwrap().name,
            &two.get("shared-name-for-the-test").unwrap().name
        ));
        drop((one, two));
        NAMES.sweep();
        assert!(NAMES.0.get("shared-name-for-the-test").is_none());
    }
}
