//! What a replica drops of its peers' summaries, beside the store that takes them (contract section 13): the traffic a
//! peer's agents saw (`GET /peer/traffic`) and the instances a peer publishes in
//! etcd are checked like agent reports (names, counts, lengths). A part that fails is
//! dropped alone and the rest applies; each dropped part is counted in
//! `meshcat_peer_parts_dropped_total{summary,reason}`, and the WARN lines about
//! them are held to [`BURST`] every [`PERIOD`] (the next line let through says how
//! many were held back): a peer that keeps sending the same bad part every pull
//! cannot fill the log.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus::{IntCounterVec, Opts, Registry};
use tracing::warn;

/// WARN lines let through per period.
pub const BURST: u32 = 10;
/// The period.
pub const PERIOD: Duration = Duration::from_secs(10);
/// Characters of a dropped name shown in the log.
const SHOWN: usize = 64;
/// Every (summary, reason) a part can be dropped for: their series start at 0.
const REASONS: [(&str, &str); 10] = [
    ("traffic", "invalid_name"),
    ("traffic", "invalid_item"),
    ("traffic", "too_many_upstream_clusters"),
    ("traffic", "too_many_upstream_hosts"),
    ("traffic", "too_many_clusters"),
    ("traffic", "duplicate"),
    ("instance", "invalid_name"),
    ("instance", "invalid_owner"),
    ("instance", "invalid_identity"),
    ("sync", "invalid_item"),
];

/// One dropped part of a peer's summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// Why, as the metric's `reason` label says it: `invalid_name` (a zone, cluster
    /// or instance name that a report could not carry; the cluster or instance is
    /// dropped), `invalid_item` (an upstream, listener or local cluster name empty or
    /// over-long; that item is dropped), `too_many_upstream_clusters`,
    /// `too_many_upstream_hosts` (a cluster over the per-instance bounds; it is
    /// dropped), `too_many_clusters` (past the number of instances a replica can
    /// hold; the rest is dropped), `duplicate` (a cluster listed twice; the second
    /// is dropped), `invalid_owner` (an instance publication's owner),
    /// `invalid_identity` (an instance publication's certificates over their bounds).
    pub reason: &'static str,
    /// What was dropped, for the log (names through [`shown`]).
    pub what: String,
}

impl Dropped {
    pub fn new(reason: &'static str, what: String) -> Dropped {
        Dropped { reason, what }
    }
}

/// `s` for a log line: quoted and escaped, cut after [`SHOWN`] characters.
pub fn shown(s: &str) -> String {
    match s.char_indices().nth(SHOWN) {
        Some((at, _)) => format!("{:?}...", &s[..at]),
        None => format!("{s:?}"),
    }
}

#[derive(Debug)]
struct LogLimit {
    started: Instant,
    let_through: u32,
    held_back: u64,
}

/// Counts and logs the parts of peers' summaries that are dropped. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PeerSummaryChecks {
    dropped: IntCounterVec,
    log: Arc<Mutex<LogLimit>>,
}

impl PeerSummaryChecks {
    pub fn register(registry: &Registry) -> prometheus::Result<PeerSummaryChecks> {
        let dropped = IntCounterVec::new(
            Opts::new(
                "meshcat_peer_parts_dropped_total",
                "Parts of peer replicas' summaries dropped by summary (traffic, instance, sync) and reason; the rest of each summary applies.",
            ),
            &["summary", "reason"],
        )?;
        registry.register(Box::new(dropped.clone()))?;
        // Shown from the start, so that a rate or an increase sees the first drop.
        for (summary, reason) in REASONS {
            dropped.with_label_values(&[summary, reason]);
        }
        Ok(PeerSummaryChecks {
            dropped,
            log: Arc::new(Mutex::new(LogLimit {
                started: Instant::now(),
                let_through: 0,
                held_back: 0,
            })),
        })
    }

    /// Counts each of `parts`, dropped from `peer`'s `summary` (`traffic` or
    /// `instance`), and logs them in one WARN line unless this period's burst is spent.
    pub fn dropped(&self, summary: &'static str, peer: &str, parts: &[Dropped]) {
        let Some(first) = parts.first() else {
            return;
        };
        for d in parts {
            self.dropped.with_label_values(&[summary, d.reason]).inc();
        }
        if let Some(suppressed) = self.let_through(Instant::now()) {
            warn!(
                peer = %shown(peer),
                summary,
                dropped = parts.len(),
                reason = first.reason,
                first = %first.what,
                suppressed,
                "Parts of a peer replica's summary were dropped; the rest applies."
            );
        }
    }

    /// The number of lines held back since the last one let through, or `None` when
    /// this period's burst is spent (then this one is held back too).
    fn let_through(&self, now: Instant) -> Option<u64> {
        let mut st = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        if now.saturating_duration_since(st.started) >= PERIOD {
            st.started = now;
            st.let_through = 0;
        }
        if st.let_through >= BURST {
            st.held_back += 1;
            return None;
        }
        st.let_through += 1;
        Some(std::mem::take(&mut st.held_back))
    }

    /// Parts counted so far for (`summary`, `reason`).
    pub fn count(&self, summary: &str, reason: &str) -> u64 {
        self.dropped.with_label_values(&[summary, reason]).get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_is_counted_and_the_log_is_held_to_a_burst() {
        let checks = PeerSummaryChecks::register(&Registry::new()).unwrap();
        let part = || Dropped::new("invalid_name", shown("x\u{1b}[2J"));
        checks.dropped("traffic", "r1", &[part(), part()]);
        assert_eq!(checks.count("traffic", "invalid_name"), 2);
        assert_eq!(checks.count("instance", "invalid_name"), 0);
        let t0 = Instant::now();
        let passed: Vec<Option<u64>> = (0..BURST + 3).map(|_| checks.let_through(t0)).collect();
        // One line went already: BURST - 1 more, then three held back.
        assert!(passed[..BURST as usize - 1].iter().all(Option::is_some));
        assert!(passed[BURST as usize - 1..].iter().all(Option::is_none));
        assert_eq!(checks.let_through(t0 + PERIOD), Some(4));
        assert_eq!(shown("a\nb"), r#""a\nb""#);
        assert!(shown(&"n".repeat(300)).len() < 80);
    }
}
