//! What one agent credential (a certificate or a token) may hold at once: its
//! connections, its report streams in flight, its instances, and how fast it may
//! create instances. Past a bound the new connection, stream or instance is refused
//! with a reason; what the credential already holds keeps working. However many
//! agents share a credential, together they cannot fill the aggregator's global
//! instance table or connection slots.

use std::time::{Duration, Instant};

use dashmap::DashMap;

use super::connection::Credential;

/// Default most connections of one credential (`--max-connections-per-credential`).
pub const DEFAULT_MAX_CREDENTIAL_CONNECTIONS: usize = 64;
/// Default most report streams of one credential in flight at once
/// (`--max-streams-per-credential`): eight per connection of a full credential
/// would be 512.
pub const DEFAULT_MAX_CREDENTIAL_STREAMS: usize = 256;
/// Default most instances one credential creates per minute, sustained
/// (`--max-new-instances-per-minute`); a credential may create up to its instance
/// bound at once (an agent fleet reconnecting after a restart), then at this rate.
pub const DEFAULT_MAX_NEW_INSTANCES_PER_MINUTE: usize = 2_000;

/// The bounds of one credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CredentialLimits {
    pub instances: usize,
    pub connections: usize,
    pub streams: usize,
    pub new_per_minute: usize,
}

/// What one credential holds now.
#[derive(Debug)]
struct Held {
    instances: usize,
    connections: usize,
    streams: usize,
    /// Instances it may still create now (a token bucket of `instances` tokens
    /// refilled at `new_per_minute`), as of `refilled`.
    tokens: f64,
    refilled: Instant,
}

/// Why a credential's new instances were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortfall {
    /// It holds its bound of instances (`too_many_credential_instances`).
    Instances,
    /// It created its share of instances this minute (`instance_rate`).
    Rate,
}

impl Shortfall {
    pub fn reason(self) -> &'static str {
        match self {
            Shortfall::Instances => "too_many_credential_instances",
            Shortfall::Rate => "instance_rate",
        }
    }
}

/// Every credential's holdings.
#[derive(Debug)]
pub struct Budgets {
    limits: CredentialLimits,
    held: DashMap<Credential, Held>,
}

impl Budgets {
    pub fn new(limits: CredentialLimits) -> Self {
        Budgets {
            limits,
            held: DashMap::new(),
        }
    }

    pub fn limits(&self) -> CredentialLimits {
        self.limits
    }

    fn held(&self, c: Credential) -> dashmap::mapref::one::RefMut<'_, Credential, Held> {
        self.held.entry(c).or_insert_with(|| Held {
            instances: 0,
            connections: 0,
            streams: 0,
            tokens: self.limits.instances as f64,
            refilled: Instant::now(),
        })
    }

    /// Drops the entry of a credential that holds nothing and has its whole bucket.
    fn tidy(&self, c: &Credential) {
        let full = self.limits.instances as f64;
        self.held.remove_if(c, |_, h| {
            h.instances == 0 && h.connections == 0 && h.streams == 0 && h.tokens >= full
        });
    }

    /// Counts a new connection of `c`; `false` (and nothing counted) past the bound.
    /// A connection that replaces one of the same agent is always taken: the old
    /// one is closed at once and gives its slot back when its task ends.
    pub fn connect(&self, c: Credential, replacing: bool) -> bool {
        let mut h = self.held(c);
        if h.connections >= self.limits.connections && !replacing {
            drop(h);
            self.tidy(&c);
            return false;
        }
        h.connections += 1;
        true
    }

    pub fn disconnect(&self, c: Credential) {
        if let Some(mut h) = self.held.get_mut(&c) {
            h.connections = h.connections.saturating_sub(1);
        }
        self.tidy(&c);
    }

    /// Counts a report stream of `c` in flight; `false` past the bound.
    pub fn open_stream(&self, c: Credential) -> bool {
        let mut h = self.held(c);
        if h.streams >= self.limits.streams {
            return false;
        }
        h.streams += 1;
        true
    }

    pub fn close_stream(&self, c: Credential) {
        if let Some(mut h) = self.held.get_mut(&c) {
            h.streams = h.streams.saturating_sub(1);
        }
        self.tidy(&c);
    }

    /// Takes up to `wanted` new instances for `c`: answers how many it may create,
    /// and why not all when fewer.
    pub fn create(&self, c: Credential, wanted: usize, now: Instant) -> (usize, Option<Shortfall>) {
        if wanted == 0 {
            return (0, None);
        }
        let mut h = self.held(c);
        let capacity = self.limits.instances as f64;
        let elapsed = now.saturating_duration_since(h.refilled);
        h.tokens = (h.tokens
            + elapsed.as_secs_f64() * self.limits.new_per_minute as f64
                / Duration::from_secs(60).as_secs_f64())
        .min(capacity);
        h.refilled = now;
        let room = self.limits.instances.saturating_sub(h.instances);
        let tokens = h.tokens.floor() as usize;
        let granted = wanted.min(room).min(tokens);
        h.instances += granted;
        h.tokens -= granted as f64;
        let short = (granted < wanted).then_some(if room < wanted && room <= tokens {
            Shortfall::Instances
        } else {
            Shortfall::Rate
        });
        (granted, short)
    }

    /// Gives back `n` instances of `c` (expired, refused, or their connection
    /// ended).
    pub fn release(&self, c: Credential, n: usize) {
        if n == 0 {
            return;
        }
        if let Some(mut h) = self.held.get_mut(&c) {
            h.instances = h.instances.saturating_sub(n);
        }
        self.tidy(&c);
    }

    /// Instances `c` holds now.
    #[cfg(test)]
    pub fn instances(&self, c: &Credential) -> usize {
        self.held.get(c).map_or(0, |h| h.instances)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budgets() -> Budgets {
        Budgets::new(CredentialLimits {
            instances: 100,
            connections: 2,
            streams: 3,
            new_per_minute: 60,
        })
    }

    #[test]
    fn instances_are_created_up_to_the_bound_at_once_then_at_the_rate() {
        let b = budgets();
        let c = [1; 32];
        let t0 = Instant::now();
        assert_eq!(b.create(c, 80, t0), (80, None));
        assert_eq!(b.create(c, 30, t0), (20, Some(Shortfall::Instances)));
        // Ten expire: the bound has room, the bucket is empty.
        b.release(c, 10);
        assert_eq!(b.create(c, 5, t0), (0, Some(Shortfall::Rate)));
        // One a second.
        assert_eq!(
            b.create(c, 5, t0 + Duration::from_secs(3)),
            (3, Some(Shortfall::Rate))
        );
        assert_eq!(b.instances(&c), 93);
        // Another credential is not touched.
        assert_eq!(b.create([2; 32], 100, t0), (100, None));
    }

    #[test]
    fn connections_and_streams_are_bounded_and_given_back() {
        let b = budgets();
        let c = [1; 32];
        assert!(b.connect(c, false));
        assert!(b.connect(c, false));
        assert!(!b.connect(c, false));
        assert!(
            b.connect(c, true),
            "a reconnect replaces its old connection"
        );
        b.disconnect(c);
        b.disconnect(c);
        assert!(b.connect(c, false));
        assert!((0..3).all(|_| b.open_stream(c)));
        assert!(!b.open_stream(c));
        b.close_stream(c);
        assert!(b.open_stream(c));
        for _ in 0..3 {
            b.close_stream(c);
        }
        for _ in 0..2 {
            b.disconnect(c);
        }
        assert!(
            b.held.is_empty(),
            "a credential that holds nothing is forgotten"
        );
    }
}
