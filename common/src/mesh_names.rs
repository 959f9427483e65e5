//! How a control server's cluster names map to catalog clusters (contract section
//! 17): the mesh-specific forms read for the service they stand for. A name that is
//! none of these is its own service name.
//!
//! - Istio: `outbound|<port>|<subset>|<host>` and `inbound|<port>|<subset>|<host>`:
//!   the service host, then its first DNS label (`reviews.default.svc.cluster.local`
//!   is `reviews`).
//! - Consul: `<service>.<namespace>.<partition>.<datacenter>.internal.<trust domain>.consul`
//!   (and the shorter forms of older releases, every one ending in `.consul`): the
//!   first label.
//! - Any other name: itself (go-control-plane based servers, Envoy Gateway and most
//!   others name clusters after their service).

/// The service a control-plane cluster name stands for: a catalog cluster name
/// candidate, borrowed from `raw`.
pub fn service_of(raw: &str) -> &str {
    if let Some(host) = istio_host(raw) {
        return first_label(host);
    }
    if raw.ends_with(".consul") {
        return first_label(raw);
    }
    raw
}

/// The host of an Istio cluster name, when `raw` is one.
fn istio_host(raw: &str) -> Option<&str> {
    let mut parts = raw.splitn(4, '|');
    let direction = parts.next()?;
    if direction != "outbound" && direction != "inbound" {
        return None;
    }
    let port = parts.next()?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let _subset = parts.next()?;
    let host = parts.next()?;
    (!host.is_empty()).then_some(host)
}

fn first_label(host: &str) -> &str {
    host.split('.')
        .next()
        .filter(|l| !l.is_empty())
        .unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::service_of;

    #[test]
    fn istio_names_map_to_their_service_host() {
        assert_eq!(
            service_of("outbound|9080||reviews.default.svc.cluster.local"),
            "reviews"
        );
        assert_eq!(
            service_of("outbound|9080|v2|reviews.default.svc.cluster.local"),
            "reviews"
        );
        assert_eq!(service_of("inbound|9080||"), "inbound|9080||");
        assert_eq!(service_of("outbound|x|y|z"), "outbound|x|y|z");
        assert_eq!(service_of("outbound|80||ratings"), "ratings");
    }

    #[test]
    fn consul_names_map_to_their_first_label() {
        assert_eq!(
            service_of("backend.default.default.dc1.internal.5a6a5c2b-1d4f.consul"),
            "backend"
        );
        assert_eq!(service_of("db.default.dc1.internal.abc.consul"), "db");
    }

    #[test]
    fn other_names_are_their_own_service() {
        assert_eq!(service_of("payments"), "payments");
        assert_eq!(service_of("a.b.example"), "a.b.example");
    }
}
