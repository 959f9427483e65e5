//! The graph window as a ring of buckets, and the keys addresses are compared by.
//!
//! The window (`--graph-window`) is kept as [`WINDOW_BUCKETS`] buckets of a twelfth
//! of it each, numbered from the traffic's epoch, so the figures over the window are
//! exact to one bucket (5 s of the default 60 s) and a ring is of a fixed size
//! whatever the report interval.

use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

/// Buckets of the graph window.
pub const WINDOW_BUCKETS: usize = 12;

/// Where in the windows' buckets an instant falls: buckets are numbered from an
/// epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    pub bucket: u64,
    /// Nanoseconds since the epoch (saturating after 584 years).
    pub nanos: u64,
}

impl Clock {
    pub fn at(epoch: Instant, now: Instant, window: Duration) -> Self {
        let width = (window.as_millis() / WINDOW_BUCKETS as u128).max(1);
        let since = now.saturating_duration_since(epoch);
        Clock {
            bucket: (since.as_millis() / width) as u64,
            nanos: u64::try_from(since.as_nanos()).unwrap_or(u64::MAX),
        }
    }
}

/// Figures over the window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Window {
    pub requests: u64,
    pub errors: u64,
    /// When the last report that added requests or errors arrived.
    pub last_seen: Option<Instant>,
}

/// Requests and errors per bucket over the window: 112 bytes, one per edge.
#[derive(Debug, Default, Clone)]
pub struct Ring {
    /// Requests and errors added in each bucket, bucket `n` at `n % WINDOW_BUCKETS`.
    buckets: [(u32, u32); WINDOW_BUCKETS],
    /// The newest bucket written; older ones within the ring are its predecessors.
    head: u64,
    /// When the last report that added requests or errors arrived: its clock's
    /// nanoseconds since the epoch, plus one (0: never).
    last_seen: u64,
}

impl Ring {
    /// Adds requests and errors in the bucket of `clock` (the time of the report,
    /// `_reported`, as numbered from the epoch).
    pub fn add(&mut self, clock: Clock, _reported: Instant, requests: u64, errors: u64) {
        let n = WINDOW_BUCKETS as u64;
        if clock.bucket > self.head {
            // The buckets between the newest written and this one saw no report.
            for b in (self.head + 1).max(clock.bucket.saturating_sub(n - 1))..=clock.bucket {
                self.buckets[(b % n) as usize] = (0, 0);
            }
            self.head = clock.bucket;
        } else if self.head - clock.bucket >= n {
            // Older than the whole window (a report applied late).
            return;
        }
        let slot = &mut self.buckets[(clock.bucket % n) as usize];
        let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        slot.0 = slot.0.saturating_add(clamp(requests));
        slot.1 = slot.1.saturating_add(clamp(errors));
        // Agent-supplied figures: a sum could overflow.
        if requests > 0 || errors > 0 {
            self.last_seen = self.last_seen.max(clock.nanos.saturating_add(1));
        }
    }

    /// Requests and errors within `window` before `now` (to one bucket), from the
    /// buckets numbered from `epoch`.
    pub fn window(&self, epoch: Instant, now: Instant, window: Duration) -> Window {
        let n = WINDOW_BUCKETS as u64;
        let now_bucket = Clock::at(epoch, now, window).bucket;
        let mut w = Window::default();
        let oldest = now_bucket.saturating_sub(n - 1);
        for b in oldest.max(self.head.saturating_sub(n - 1))..=self.head.min(now_bucket) {
            let (r, e) = self.buckets[(b % n) as usize];
            w.requests = w.requests.saturating_add(u64::from(r));
            w.errors = w.errors.saturating_add(u64::from(e));
        }
        w.last_seen = self
            .last_seen
            .checked_sub(1)
            .map(|nanos| epoch + Duration::from_nanos(nanos))
            .filter(|at| Clock::at(epoch, *at, window).bucket >= oldest);
        w
    }
}

/// The key a host or listener address is compared by.
pub fn address_key(address: &str) -> u64 {
    // Fixed keys: the same address hashes alike in every call of the process.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    address.hash(&mut h);
    h.finish()
}

/// Hashes an [`address_key`] as itself: the key already is a hash.
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

/// A map keyed by [`address_key`]s.
pub type AddressMap<V> =
    std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<KeyHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_counts_until_its_bucket_leaves_the_window() {
        let epoch = Instant::now();
        let at = |s: u64| epoch + Duration::from_secs(s);
        let win = Duration::from_secs(60);
        let mut r = Ring::default();
        r.add(Clock::at(epoch, at(2), win), at(2), 30, 3);
        r.add(Clock::at(epoch, at(12), win), at(12), 7, 0);
        let w = r.window(epoch, at(12), win);
        assert_eq!((w.requests, w.errors, w.last_seen), (37, 3, Some(at(12))));
        // Twelve buckets of 5 s: the first leaves the window at 60 s.
        assert_eq!(r.window(epoch, at(59), win).requests, 37);
        assert_eq!(r.window(epoch, at(60), win).requests, 7);
        let w = r.window(epoch, at(70), win);
        assert_eq!((w.requests, w.last_seen), (0, None));
        // A late report older than the window adds nothing.
        r.add(Clock::at(epoch, at(80), win), at(80), 1, 0);
        r.add(Clock::at(epoch, at(5), win), at(5), 100, 0);
        assert_eq!(r.window(epoch, at(80), win).requests, 1);
    }

    #[test]
    fn the_largest_figures_saturate() {
        let epoch = Instant::now();
        let win = Duration::from_secs(60);
        let mut r = Ring::default();
        for s in 0..WINDOW_BUCKETS as u64 {
            let at = epoch + Duration::from_secs(5 * s);
            r.add(Clock::at(epoch, at, win), at, u64::MAX, u64::MAX);
            r.add(Clock::at(epoch, at, win), at, u64::MAX, 1);
        }
        let now = epoch + Duration::from_secs(55);
        let w = r.window(epoch, now, win);
        let most = u64::from(u32::MAX) * WINDOW_BUCKETS as u64;
        assert_eq!((w.requests, w.errors, w.last_seen), (most, most, Some(now)));
    }
}
