//! A bound on warnings about refused peers: anyone on the network can make the
//! ingest refuse connections as fast as it can send packets, and one WARN line per
//! refusal would let them fill the log. The refusals are all counted in
//! `meshcat_reports_rejected_total`; the log gets at most a burst of lines per period,
//! and the next line let through says how many were held back.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Warnings let through per period.
pub const BURST: u32 = 10;
/// The period.
pub const PERIOD: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct State {
    started: Instant,
    let_through: u32,
    held_back: u64,
}

/// Lets through at most [`BURST`] warnings per [`PERIOD`].
#[derive(Debug)]
pub(crate) struct WarnLimit {
    state: Mutex<State>,
}

impl Default for WarnLimit {
    fn default() -> Self {
        WarnLimit {
            state: Mutex::new(State {
                started: Instant::now(),
                let_through: 0,
                held_back: 0,
            }),
        }
    }
}

impl WarnLimit {
    /// Calls `log` with the number of warnings held back since the last one let
    /// through, unless this period's burst is spent (then counts this one).
    pub(crate) fn warn(&self, log: impl FnOnce(u64)) {
        self.warn_at(Instant::now(), log);
    }

    fn warn_at(&self, now: Instant, log: impl FnOnce(u64)) {
        let held_back = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if now.saturating_duration_since(st.started) >= PERIOD {
                st.started = now;
                st.let_through = 0;
            }
            if st.let_through >= BURST {
                st.held_back += 1;
                return;
            }
            st.let_through += 1;
            std::mem::take(&mut st.held_back)
        };
        log(held_back);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_held_to_a_burst_per_period_and_the_next_line_counts_the_rest() {
        let limit = WarnLimit::default();
        let t0 = Instant::now();
        let mut lines = Vec::new();
        for _ in 0..1000 {
            limit.warn_at(t0, |held| lines.push(held));
        }
        assert_eq!(lines, vec![0; BURST as usize]);
        lines.clear();
        limit.warn_at(t0 + PERIOD, |held| lines.push(held));
        assert_eq!(lines, vec![1000 - u64::from(BURST)]);
    }
}
