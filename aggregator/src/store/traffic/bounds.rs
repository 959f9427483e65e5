//! The bounds on what one report may add to the graph (contract section 10): which
//! names its upstream, listener and route lists may carry, which listener addresses
//! an instance may claim as its own, how many callees a cluster keeps
//! (`--max-edges-per-node`), and the counters of what was refused or summed into
//! [`OTHER`].

use std::net::IpAddr;

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

use super::MAX_NAME;

/// Default of `--max-edges-per-node`: most upstream clusters a cluster's calls keep.
pub const DEFAULT_MAX_EDGES_PER_NODE: usize = 1024;

/// The upstream that a cluster's calls past `--max-edges-per-node` are summed under;
/// its edge goes to the external node `<zone>/external:other`.
pub const OTHER: &str = "other";

/// A list of a report that names things.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    /// An upstream cluster with traffic.
    Upstream,
    /// A listener's address.
    Listener,
    /// A cluster a listener's routes name.
    Route,
    /// The target's local cluster.
    LocalCluster,
}

impl Item {
    fn label(self) -> &'static str {
        match self {
            Item::Upstream => "upstream",
            Item::Listener => "listener",
            Item::Route => "route",
            Item::LocalCluster => "local_cluster",
        }
    }
}

/// Why an item was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Empty,
    TooLong,
    /// A listener address that is not the instance's own.
    NotOwnAddress,
}

impl Refusal {
    fn label(self) -> &'static str {
        match self {
            Refusal::Empty => "empty",
            Refusal::TooLong => "too_long",
            Refusal::NotOwnAddress => "not_own_address",
        }
    }
}

/// The graph's bounds counters, registered into the aggregator's registry
/// ([`GraphMetrics::register`]).
#[derive(Debug, Clone)]
pub struct GraphMetrics {
    refused: IntCounterVec,
    rolled_up: IntCounter,
}

impl Default for GraphMetrics {
    fn default() -> Self {
        let refused = IntCounterVec::new(
            Opts::new(
                "meshcat_graph_items_refused_total",
                "Items of the instances' upstream, listener, route and local cluster lists dropped from the graph, by list and reason (empty, too_long, not_own_address).",
            ),
            &["item", "reason"],
        )
        .expect("valid metric options");
        let rolled_up = IntCounter::new(
            "meshcat_graph_upstreams_rolled_up_total",
            "Upstream clusters of instances summed into their cluster's external:other edge, the cluster already calling --max-edges-per-node others.",
        )
        .expect("valid metric options");
        // Every pair from the start, at 0.
        for item in [
            Item::Upstream,
            Item::Listener,
            Item::Route,
            Item::LocalCluster,
        ] {
            for why in [Refusal::Empty, Refusal::TooLong] {
                refused.with_label_values(&[item.label(), why.label()]);
            }
        }
        refused.with_label_values(&[Item::Listener.label(), Refusal::NotOwnAddress.label()]);
        GraphMetrics { refused, rolled_up }
    }
}

impl GraphMetrics {
    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.refused.clone()))?;
        registry.register(Box::new(self.rolled_up.clone()))
    }

    pub fn refuse(&self, item: Item, why: Refusal) {
        self.refused
            .with_label_values(&[item.label(), why.label()])
            .inc();
    }

    /// How many items of `item` were refused for `why`.
    pub fn refused(&self, item: Item, why: Refusal) -> u64 {
        self.refused
            .with_label_values(&[item.label(), why.label()])
            .get()
    }

    pub fn roll_up(&self) {
        self.rolled_up.inc();
    }

    /// How many upstreams of instances were summed into `other`.
    pub fn rolled_up(&self) -> u64 {
        self.rolled_up.get()
    }

    /// Whether `name` may stand in a list of `item`: not empty, at most
    /// [`MAX_NAME`] bytes. A refusal is counted.
    pub fn name_ok(&self, item: Item, name: &str) -> bool {
        let why = if name.is_empty() {
            Refusal::Empty
        } else if name.len() > MAX_NAME {
            Refusal::TooLong
        } else {
            return true;
        };
        self.refuse(item, why);
        false
    }
}

/// The host of `host:port` or `[host]:port`.
pub fn host_of(address: &str) -> Option<&str> {
    let (host, port) = address.rsplit_once(':')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.strip_suffix(']')?,
        None if host.contains(':') => return None,
        None => host,
    };
    (!host.is_empty()).then_some(host)
}

/// Whether a sidecar reached at `admin` (`host:port`, the report's admin address)
/// may claim a listener at `address`: its host is the host the agent reaches the
/// sidecar at (which is where the agent reports wildcard listeners, `0.0.0.0` and
/// `::`). A loopback address is the sidecar's own only when the agent reaches it on
/// loopback too (beside it, or inside its pod's network namespace): reached at its
/// pod IP, a sidecar's loopback is not where any other sidecar can call it, and
/// claiming one would draw to it the edges of every caller whose upstream has a
/// host on its own loopback. A wildcard still in the address is no address.
pub fn own_address(admin: &str, address: &str) -> bool {
    let (Some(admin), Some(host)) = (host_of(admin), host_of(address)) else {
        return false;
    };
    match (admin.parse::<IpAddr>(), host.parse::<IpAddr>()) {
        (_, Ok(ip)) if ip.is_unspecified() => false,
        (Ok(a), Ok(h)) => a == h || (a.is_loopback() && h.is_loopback()),
        (Err(_), Err(_)) => admin.eq_ignore_ascii_case(host),
        // A name against an address (or the reverse): `localhost` is loopback.
        (Ok(a), Err(_)) => a.is_loopback() && host.eq_ignore_ascii_case("localhost"),
        (Err(_), Ok(h)) => h.is_loopback() && admin.eq_ignore_ascii_case("localhost"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_is_the_sidecars_own_only_at_the_host_it_is_reached_at() {
        for (admin, address, own) in [
            ("10.0.0.2:15000", "10.0.0.2:80", true),
            ("10.0.0.2:15000", "10.0.0.3:80", false),
            ("10.0.0.2:15000", "127.0.0.1:80", false),
            ("10.0.0.2:15000", "0.0.0.0:80", false),
            ("127.0.0.1:9901", "127.0.0.1:10001", true),
            ("127.0.0.1:9901", "127.0.0.2:10001", true),
            ("127.0.0.1:9901", "[::1]:10001", true),
            ("127.0.0.1:9901", "10.0.0.2:80", false),
            ("localhost:9901", "127.0.0.1:80", true),
            ("[fd00::2]:15000", "[fd00::2]:80", true),
            ("[fd00::2]:15000", "[fd00::3]:80", false),
            ("[fd00::2]:15000", "[::]:80", false),
            ("envoy-a:9901", "ENVOY-A:80", true),
            ("envoy-a:9901", "envoy-b:80", false),
            ("", "10.0.0.2:80", false),
            ("10.0.0.2:15000", "10.0.0.2", false),
            ("10.0.0.2:15000", "fd00::2:80", false),
        ] {
            assert_eq!(own_address(admin, address), own, "{admin} {address}");
        }
    }

    #[test]
    fn empty_and_over_long_names_are_refused_and_counted() {
        let m = GraphMetrics::default();
        assert!(m.name_ok(Item::Upstream, "b"));
        assert!(m.name_ok(Item::Upstream, &"u".repeat(MAX_NAME)));
        assert!(!m.name_ok(Item::Upstream, ""));
        assert!(!m.name_ok(Item::Route, &"r".repeat(MAX_NAME + 1)));
        assert_eq!(m.refused(Item::Upstream, Refusal::Empty), 1);
        assert_eq!(m.refused(Item::Route, Refusal::TooLong), 1);
        assert_eq!(m.refused(Item::Upstream, Refusal::TooLong), 0);
    }
}
