//! Facts about the sidecar's own log that the agent (which tails it and runs the debug
//! windows) and the diagnosis (which reads what the agent collected) must agree on.

/// What marks a TLS failure in Envoy's log. The lines appear at debug level only;
/// Envoy 1.40 writes `TLS_error:|...OPENSSL_internal:...` (underscore) for handshake
/// failures and `TLS error: Secret is not supplied by SDS` for missing secrets; the
/// seed's wording is `TLS error`.
pub const TLS_MARKERS: [&str; 3] = ["TLS_error", "TLS error", "OPENSSL"];

/// Longest debug window one request may ask for, in seconds: how long a sidecar may be
/// kept at debug level on one request.
pub const MAX_DEBUG_WINDOW_SECONDS: u32 = 300;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_markers_match_envoy_1_40_lines() {
        assert_eq!(TLS_MARKERS, ["TLS_error", "TLS error", "OPENSSL"]);
        let marked = |l: &str| TLS_MARKERS.iter().any(|m| l.contains(m));
        // Lines as Envoy 1.40 writes them at debug level.
        assert!(marked(
            "[debug][connection] remote address:127.0.0.1:4,TLS_error:|268435581:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED:TLS_error_end"
        ));
        assert!(marked(
            "[debug][config] TLS error: Secret is not supplied by SDS"
        ));
        assert!(!marked("[info][main] starting main dispatch loop"));
    }

    #[test]
    fn debug_window_maximum() {
        assert_eq!(MAX_DEBUG_WINDOW_SECONDS, 300);
    }
}
