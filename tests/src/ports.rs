//! Ports for processes that cannot report a port they chose themselves (etcd
//! members name each other's peer ports before any of them starts; Prometheus and
//! the replicas are told their ports up front).
//!
//! A port merely found free with a bind to port 0 comes from the kernel's ephemeral
//! range, the range every outgoing connection of the machine takes its source port
//! from: between the check and the process's own bind, an etcd member dialing a peer
//! or a test's HTTP client may take it, and the process then fails with "address
//! already in use". So ports are handed out from outside that range, where only an
//! explicit bind can take them, each one at most once per test process (a counter
//! from a per-process starting point), and each checked free for both TCP and UDP.

use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::sync::Mutex;

use anyhow::bail;

/// The lowest port handed out (clear of well-known and registered low services).
const FLOOR: u16 = 10_000;
/// Below this many ports outside the ephemeral range, fall back to port 0.
const MIN_SPAN: u32 = 1_000;

/// The next candidate, and the range it walks: `None` until first use.
static NEXT: Mutex<Option<Walk>> = Mutex::new(None);

struct Walk {
    lo: u16,
    hi: u16,
    next: u16,
    /// Candidates left before every port of the range has been tried once.
    left: u32,
}

/// The kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`).
fn ephemeral_range() -> Option<(u16, u16)> {
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = s.split_whitespace().map(|p| p.parse::<u16>().ok());
    Some((it.next()??, it.next()??))
}

/// The larger span of ports outside the ephemeral range, when it is wide enough.
fn outside_range() -> Option<(u16, u16)> {
    let (lo, hi) = ephemeral_range()?;
    let below = (FLOOR, lo.saturating_sub(1));
    let above = (hi.saturating_add(1), u16::MAX);
    let span = |(a, b): (u16, u16)| if b >= a { u32::from(b - a) + 1 } else { 0 };
    let best = if span(below) >= span(above) {
        below
    } else {
        above
    };
    (span(best) >= MIN_SPAN).then_some(best)
}

/// A per-process starting offset, so two test processes rarely walk the same ports.
fn start_offset(span: u32) -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (std::process::id().wrapping_mul(2_654_435_761) ^ nanos) % span
}

fn free_now(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
        && UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// A port on 127.0.0.1 that is free for TCP and UDP now, outside the ephemeral
/// range, and not handed out before by this process.
pub fn free_port() -> anyhow::Result<u16> {
    let mut guard = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        let Some((lo, hi)) = outside_range() else {
            // No room outside the ephemeral range: the kernel's choice is all there is.
            return Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
                .local_addr()?
                .port());
        };
        let span = u32::from(hi - lo) + 1;
        let next = lo + u16::try_from(start_offset(span)).unwrap_or(0);
        *guard = Some(Walk {
            lo,
            hi,
            next,
            left: span,
        });
    }
    let walk = guard.as_mut().expect("set above");
    while walk.left > 0 {
        let port = walk.next;
        walk.next = if port >= walk.hi { walk.lo } else { port + 1 };
        walk.left -= 1;
        if free_now(port) {
            return Ok(port);
        }
    }
    bail!(
        "every port in {}..={} outside the ephemeral range has been handed out",
        walk.lo,
        walk.hi
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_outside_the_ephemeral_range_and_never_repeat() {
        let (lo, hi) = ephemeral_range().expect("Linux has an ephemeral range");
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let p = free_port().unwrap();
            if outside_range().is_some() {
                assert!(!(lo..=hi).contains(&p), "{p} is in {lo}..={hi}");
            }
            assert!(seen.insert(p), "{p} handed out twice");
            // Free for both protocols when handed out.
            drop(TcpListener::bind((Ipv4Addr::LOCALHOST, p)).unwrap());
            drop(UdpSocket::bind((Ipv4Addr::LOCALHOST, p)).unwrap());
        }
    }
}
