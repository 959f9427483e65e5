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

/// The rule that decides a cluster's status, with the figures it decided on: the
/// rules are written here once, and both the status ([`Verdict::status`]) and the
/// sentence the history shows (its `Display`) are read from the verdict.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// down: no instance reported within the TTL with a reachable sidecar.
    NoLiveInstance,
    /// warning: fewer live instances than minInstances.
    BelowMinInstances { live: u64, min: u64 },
    /// warning: more live instances than a non-zero maxInstances.
    AboveMaxInstances { live: u64, max: u64 },
    /// stable: within the bounds, and too few requests in the window for a ratio.
    FewRequests { live: u64, requests: u64 },
    /// warning: the window's error ratio is above the threshold.
    ErrorRatioAbove {
        errors: u64,
        requests: u64,
        warning: f64,
    },
    /// stable: within the bounds, the error ratio at most the threshold.
    Within {
        live: u64,
        errors: u64,
        requests: u64,
        warning: f64,
    },
}

/// Applies the rules, in order, with the given error ratio threshold.
pub fn judge(i: Inputs, error_ratio_warning: f64) -> Verdict {
    if i.live == 0 {
        return Verdict::NoLiveInstance;
    }
    if i.live < i.min_instances {
        return Verdict::BelowMinInstances {
            live: i.live,
            min: i.min_instances,
        };
    }
    if i.max_instances > 0 && i.live > i.max_instances {
        return Verdict::AboveMaxInstances {
            live: i.live,
            max: i.max_instances,
        };
    }
    if i.window_requests < MIN_WINDOW_REQUESTS {
        return Verdict::FewRequests {
            live: i.live,
            requests: i.window_requests,
        };
    }
    let (errors, requests) = (i.window_errors, i.window_requests);
    if errors as f64 / requests as f64 > error_ratio_warning {
        Verdict::ErrorRatioAbove {
            errors,
            requests,
            warning: error_ratio_warning,
        }
    } else {
        Verdict::Within {
            live: i.live,
            errors,
            requests,
            warning: error_ratio_warning,
        }
    }
}

impl Verdict {
    /// The status this verdict gives.
    pub fn status(self) -> Status {
        match self {
            Verdict::NoLiveInstance => Status::Down,
            Verdict::BelowMinInstances { .. }
            | Verdict::AboveMaxInstances { .. }
            | Verdict::ErrorRatioAbove { .. } => Status::Warning,
            Verdict::FewRequests { .. } | Verdict::Within { .. } => Status::Stable,
        }
    }
}

/// Why the rules give the status they give, as a sentence a person reads in the
/// history: the rule that decided and its figures ("1 live instance, below
/// minInstances 2").
impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Verdict::NoLiveInstance => write!(
                f,
                "{}: no instance reported within the TTL with a reachable sidecar",
                instances(0)
            ),
            Verdict::BelowMinInstances { live, min } => {
                write!(f, "{}, below minInstances {min}", instances(live))
            }
            Verdict::AboveMaxInstances { live, max } => {
                write!(f, "{}, above maxInstances {max}", instances(live))
            }
            Verdict::FewRequests { live, requests } => write!(
                f,
                "{}, within its bounds; {requests} requests in the last window, fewer than the {MIN_WINDOW_REQUESTS} an error ratio needs",
                instances(live)
            ),
            Verdict::ErrorRatioAbove {
                errors,
                requests,
                warning,
            } => write!(f, "{}, above {warning}", ratio(errors, requests)),
            Verdict::Within {
                live,
                errors,
                requests,
                warning,
            } => write!(
                f,
                "{}, within its bounds; {}, at most {warning}",
                instances(live),
                ratio(errors, requests)
            ),
        }
    }
}

/// The window's error ratio in words, with its figures.
fn ratio(errors: u64, requests: u64) -> String {
    format!(
        "error ratio {:.3} ({errors} of {requests} requests answered 5xx in the last window)",
        errors as f64 / requests as f64
    )
}

/// The status the rules give, with the given error ratio threshold.
pub fn evaluate(i: Inputs, error_ratio_warning: f64) -> Status {
    judge(i, error_ratio_warning).status()
}

/// The sentence of the rule that decides (see [`Verdict`]'s `Display`).
pub fn explain(i: Inputs, error_ratio_warning: f64) -> String {
    judge(i, error_ratio_warning).to_string()
}

fn instances(n: u64) -> String {
    if n == 1 {
        "1 live instance".to_owned()
    } else {
        format!("{n} live instances")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(live: u64, min: u64, max: u64, req: u64, err: u64) -> Inputs {
        Inputs {
            live,
            min_instances: min,
            max_instances: max,
            window_requests: req,
            window_errors: err,
        }
    }

    fn with(live: u64, min: u64, max: u64, req: u64, err: u64) -> Status {
        evaluate(inputs(live, min, max, req, err), 0.05)
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
        let why = |live, min, max, req, err| explain(inputs(live, min, max, req, err), 0.05);
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
