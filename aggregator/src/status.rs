//! The status rules (contract section 2, `docs/status.md`): how a cluster's live
//! instances and their last report window make it stable, warning or down.

use meshcat_common::model::Status;

/// Fewest requests in a report window before the error ratio counts: below that, a
/// single failed request would flip a quiet cluster into warning.
pub const MIN_WINDOW_REQUESTS: u64 = 20;

/// What the rules look at for one cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Inputs {
    /// Live instances: reported within the TTL and reachable at their last scrape.
    pub live: u64,
    /// The registration's minInstances (0 when unregistered).
    pub min_instances: u64,
    /// The registration's maxInstances; 0 means no upper bound.
    pub max_instances: u64,
    /// Requests in the last report window, summed over live instances.
    pub window_requests: u64,
    /// 5xx answers in the last report window, summed over live instances.
    pub window_errors: u64,
}

/// Applies the rules with the given error ratio threshold.
pub fn evaluate(i: Inputs, error_ratio_warning: f64) -> Status {
    if i.live == 0 {
        return Status::Down;
    }
    if i.live < i.min_instances || (i.max_instances > 0 && i.live > i.max_instances) {
        return Status::Warning;
    }
    if i.window_requests >= MIN_WINDOW_REQUESTS {
        let ratio = i.window_errors as f64 / i.window_requests as f64;
        if ratio > error_ratio_warning {
            return Status::Warning;
        }
    }
    Status::Stable
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(live: u64, min: u64, max: u64, req: u64, err: u64) -> Status {
        evaluate(
            Inputs {
                live,
                min_instances: min,
                max_instances: max,
                window_requests: req,
                window_errors: err,
            },
            0.05,
        )
    }

    #[test]
    fn no_live_instance_is_down() {
        assert_eq!(with(0, 0, 0, 0, 0), Status::Down);
        assert_eq!(with(0, 2, 0, 100, 0), Status::Down);
    }

    #[test]
    fn instance_bounds_give_warning() {
        assert_eq!(with(1, 2, 0, 0, 0), Status::Warning);
        assert_eq!(with(3, 1, 2, 0, 0), Status::Warning);
        assert_eq!(with(3, 1, 0, 0, 0), Status::Stable);
        assert_eq!(with(2, 2, 2, 0, 0), Status::Stable);
    }

    #[test]
    fn error_ratio_needs_enough_requests() {
        assert_eq!(with(1, 0, 0, 19, 19), Status::Stable);
        assert_eq!(with(1, 0, 0, 20, 1), Status::Stable);
        assert_eq!(with(1, 0, 0, 20, 2), Status::Warning);
        assert_eq!(with(1, 0, 0, 100, 5), Status::Stable);
        assert_eq!(with(1, 0, 0, 100, 6), Status::Warning);
    }
}
