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

fn instances(n: u64) -> String {
    if n == 1 {
        "1 live instance".to_owned()
    } else {
        format!("{n} live instances")
    }
}

/// Why the rules give the status they give, as a sentence a person reads in the
/// history: the rule that decided and its figures ("1 live instance, below
/// minInstances 2").
pub fn explain(i: Inputs, error_ratio_warning: f64) -> String {
    let live = instances(i.live);
    if i.live == 0 {
        return format!("{live}: no instance reported within the TTL with a reachable sidecar");
    }
    if i.live < i.min_instances {
        return format!("{live}, below minInstances {}", i.min_instances);
    }
    if i.max_instances > 0 && i.live > i.max_instances {
        return format!("{live}, above maxInstances {}", i.max_instances);
    }
    let ratio = |i: Inputs| i.window_errors as f64 / i.window_requests as f64;
    if i.window_requests < MIN_WINDOW_REQUESTS {
        return format!(
            "{live}, within its bounds; {} requests in the last window, fewer than the {MIN_WINDOW_REQUESTS} an error ratio needs",
            i.window_requests
        );
    }
    let (errors, requests, r) = (i.window_errors, i.window_requests, ratio(i));
    if r > error_ratio_warning {
        format!(
            "error ratio {r:.3} ({errors} of {requests} requests answered 5xx in the last window), above {error_ratio_warning}"
        )
    } else {
        format!(
            "{live}, within its bounds; error ratio {r:.3} ({errors} of {requests} requests answered 5xx in the last window), at most {error_ratio_warning}"
        )
    }
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
    fn the_reason_names_the_rule_and_its_figures() {
        let why = |live, min, max, req, err| {
            explain(
                Inputs {
                    live,
                    min_instances: min,
                    max_instances: max,
                    window_requests: req,
                    window_errors: err,
                },
                0.05,
            )
        };
        assert_eq!(why(1, 2, 0, 0, 0), "1 live instance, below minInstances 2");
        assert_eq!(why(3, 1, 2, 0, 0), "3 live instances, above maxInstances 2");
        assert!(why(0, 2, 0, 0, 0).starts_with("0 live instances: "));
        let erroring = why(2, 1, 0, 100, 12);
        assert!(
            erroring.starts_with("error ratio 0.120 (12 of 100 requests")
                && erroring.ends_with("above 0.05"),
            "{erroring}"
        );
        assert!(why(2, 1, 0, 100, 1).contains("at most 0.05"));
        assert!(why(2, 1, 0, 5, 5).contains("fewer than the 20"));
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
