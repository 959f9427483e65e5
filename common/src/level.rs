//! Sidecar log levels. The APIs (the agent's `/logging` and the aggregator's logging
//! routes) accept the seed's four names; Envoy names `warn` `warning` and refuses
//! `warn`, so every conversion between the two lives here.

/// The seed's four levels, the only ones the APIs accept.
pub const SEED_LEVELS: [&str; 4] = ["error", "warn", "info", "debug"];

/// Envoy's name for one of the seed's levels (`error`, `warn`, `info`, `debug`);
/// `None` for anything else, Envoy's own `warning` included.
pub fn envoy_name(seed: &str) -> Option<&'static str> {
    match seed {
        "error" => Some("error"),
        "warn" => Some("warning"),
        "info" => Some("info"),
        "debug" => Some("debug"),
        _ => None,
    }
}

/// The seed's name for an Envoy level: `warning` reads `warn`, others unchanged.
pub fn seed_name(envoy: &str) -> &str {
    if envoy == "warning" { "warn" } else { envoy }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions() {
        assert_eq!(envoy_name("warn"), Some("warning"));
        for l in SEED_LEVELS {
            assert_eq!(envoy_name(l).map(seed_name), Some(l));
        }
        assert_eq!(envoy_name("debug"), Some("debug"));
        for bad in ["warning", "trace", "WARN", ""] {
            assert_eq!(envoy_name(bad), None, "{bad}");
        }
        assert_eq!(seed_name("warning"), "warn");
        assert_eq!(seed_name("critical"), "critical");
    }
}
