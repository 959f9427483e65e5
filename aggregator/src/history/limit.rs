//! How fast the history may grow from one source, so that no instance and no
//! caller can flood it:
//!
//! - An instance records at most [`INSTANCE_ENTRIES`] entries one by one
//!   (`instance-joined`, `instance-left`, `instance-restarted`, `config-changed`) in
//!   a minute from its first one. Past that, that minute's changes are counted by
//!   kind, and once the minute is over they are recorded as one `instance-flapping`
//!   entry with the counts: a sidecar flipping on every report costs at most
//!   [`INSTANCE_ENTRIES`] + 1 entries a minute, whatever it sends.
//! - Diagnoses (any caller holding the read token may run one) record at most
//!   `--history-max-diagnoses` entries a minute; the rest still run and answer, they
//!   are only not recorded (counted in `meshcat_history_unrecorded_total`).
//!
//! Time is the caller's `now` (an [`Instant`]): the store passes the time of the
//! report it applies.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::entry::{Detail, Kind, Pending, now_ms};

/// The span of every rate here.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Entries one instance records one by one in a [`WINDOW`]: enough for its first
/// join and two restarts seen whole (left, joined, restarted, another
/// configuration), a rollout and its rollback within the minute.
pub const INSTANCE_ENTRIES: u32 = 10;
/// Default `--history-max-diagnoses`: `diagnosed` entries recorded a minute.
pub const DEFAULT_MAX_DIAGNOSES: u32 = 60;
/// How often windows that ended are looked for, to record their summaries and
/// forget them: an instance that stopped changing has its summary recorded at most
/// this long after its minute.
const SWEEP_EVERY: Duration = Duration::from_secs(15);

/// (zone, cluster, instance).
type Key = (String, String, String);

/// One instance's minute.
#[derive(Debug)]
struct Window {
    start: Instant,
    /// The same moment, ms since the epoch, for the summary.
    since_ms: i64,
    /// Entries recorded one by one in it.
    recorded: u32,
    /// Changes past [`INSTANCE_ENTRIES`], by kind.
    held: BTreeMap<Kind, u32>,
}

impl Window {
    fn new(now: Instant) -> Window {
        Window {
            start: now,
            since_ms: now_ms(),
            recorded: 0,
            held: BTreeMap::new(),
        }
    }

    fn over(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.start) >= WINDOW
    }

    /// The `instance-flapping` entry of a window in which changes were held.
    fn summary(&self, (zone, cluster, instance): &Key) -> Option<Pending> {
        if self.held.is_empty() {
            return None;
        }
        Some(Pending::new(
            Kind::InstanceFlapping,
            zone,
            cluster,
            instance,
            Detail::Flapping {
                since_ms: self.since_ms,
                flips: self.held.iter().map(|(k, n)| (k.as_str(), *n)).collect(),
            },
        ))
    }
}

#[derive(Debug, Default)]
struct Windows {
    /// Instances with an entry within the last [`WINDOW`] (or a summary due): at
    /// most the instances that changed in a minute and a half.
    open: HashMap<Key, Window>,
    swept: Option<Instant>,
}

impl Windows {
    /// Ends the windows that are over, `due` taking their summaries; at most once
    /// every [`SWEEP_EVERY`].
    fn sweep(&mut self, now: Instant, due: &mut Vec<Pending>) {
        if self
            .swept
            .is_some_and(|at| now.saturating_duration_since(at) < SWEEP_EVERY)
        {
            return;
        }
        self.swept = Some(now);
        self.open.retain(|key, w| {
            if !w.over(now) {
                return true;
            }
            due.extend(w.summary(key));
            false
        });
    }
}

/// The rates of one history.
#[derive(Debug)]
pub struct Rates {
    instances: Mutex<Windows>,
    /// The diagnoses' minute: its start and the entries recorded in it.
    diagnoses: Mutex<Option<(Instant, u32)>>,
    max_diagnoses: u32,
}

/// What becomes of one instance entry.
#[derive(Debug, Default, PartialEq)]
pub struct Admitted {
    /// Whether the entry is recorded.
    pub record: bool,
    /// Summaries of minutes that ended, to record before it.
    pub due: Vec<Pending>,
}

impl Rates {
    pub fn new(max_diagnoses: u32) -> Rates {
        Rates {
            instances: Mutex::new(Windows::default()),
            diagnoses: Mutex::new(None),
            max_diagnoses,
        }
    }

    /// Whether `entry`, about one instance, at `now`, is recorded one by one, and
    /// the summaries now due (this instance's previous minute, others' that ended).
    pub fn instance(&self, entry: &Pending, now: Instant) -> Admitted {
        let mut out = Admitted::default();
        let mut w = self.instances.lock().unwrap_or_else(|p| p.into_inner());
        w.sweep(now, &mut out.due);
        let key = (
            entry.zone.clone(),
            entry.cluster.clone(),
            entry.instance.clone(),
        );
        let window = w.open.entry(key).or_insert_with(|| Window::new(now));
        if window.over(now) {
            let ended = std::mem::replace(window, Window::new(now));
            let key = (
                entry.zone.clone(),
                entry.cluster.clone(),
                entry.instance.clone(),
            );
            out.due.extend(ended.summary(&key));
        }
        if window.recorded < INSTANCE_ENTRIES {
            window.recorded += 1;
            out.record = true;
        } else {
            *window.held.entry(entry.kind).or_default() += 1;
        }
        out
    }

    /// The summaries of the minutes over at `now` (at most every few seconds).
    pub fn sweep(&self, now: Instant) -> Vec<Pending> {
        let mut due = Vec::new();
        self.instances
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sweep(now, &mut due);
        due
    }

    /// Whether a diagnosis at `now` is recorded: at most `--history-max-diagnoses`
    /// a minute.
    pub fn diagnosis(&self, now: Instant) -> bool {
        let mut d = self.diagnoses.lock().unwrap_or_else(|p| p.into_inner());
        let (start, count) = d.get_or_insert((now, 0));
        if now.saturating_duration_since(*start) >= WINDOW {
            (*start, *count) = (now, 0);
        }
        if *count < self.max_diagnoses {
            *count += 1;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flip(instance: &str, kind: Kind) -> Pending {
        Pending::new(kind, "z", "c", instance, Detail::Nothing {})
    }

    /// Past its allowance an instance's changes are summed, and the sum comes once
    /// its minute is over, once; another instance keeps its own allowance.
    #[test]
    fn an_instance_past_its_allowance_is_summed_once_a_minute() {
        let r = Rates::new(DEFAULT_MAX_DIAGNOSES);
        let t0 = Instant::now();
        let mut recorded = 0;
        for s in 0..60 {
            let kind = if s % 2 == 0 {
                Kind::InstanceLeft
            } else {
                Kind::InstanceJoined
            };
            let a = r.instance(&flip("i", kind), t0 + Duration::from_secs(s));
            assert!(a.due.is_empty(), "nothing due within the minute");
            recorded += u32::from(a.record);
        }
        assert_eq!(recorded, INSTANCE_ENTRIES);
        assert!(r.instance(&flip("j", Kind::InstanceJoined), t0).record);
        let next = r.instance(&flip("i", Kind::InstanceLeft), t0 + WINDOW);
        assert!(next.record, "a new minute, a new allowance");
        let [summary] = next.due.as_slice() else {
            panic!("one summary: {:?}", next.due)
        };
        assert_eq!(summary.kind, Kind::InstanceFlapping);
        assert_eq!(summary.instance, "i");
        let j = serde_json::to_value(&summary.detail).unwrap();
        assert_eq!(j["flips"]["instance-left"], 25);
        assert_eq!(j["flips"]["instance-joined"], 25);
        // An instance that went quiet has its summary swept after its minute.
        for _ in 0..15 {
            r.instance(&flip("k", Kind::ConfigChanged), t0);
        }
        assert!(r.sweep(t0 + Duration::from_secs(30)).is_empty());
        let swept = r.sweep(t0 + Duration::from_secs(90));
        assert_eq!(swept.len(), 1, "{swept:?}");
        assert_eq!(swept[0].instance, "k");
        assert!(r.sweep(t0 + Duration::from_secs(200)).is_empty());
    }

    #[test]
    fn diagnoses_are_recorded_up_to_the_limit_a_minute() {
        let r = Rates::new(3);
        let t0 = Instant::now();
        let got: Vec<bool> = (0..5).map(|_| r.diagnosis(t0)).collect();
        assert_eq!(got, [true, true, true, false, false]);
        assert!(r.diagnosis(t0 + WINDOW));
        assert!(!Rates::new(0).diagnosis(t0));
    }
}
