//! The instance metrics object (seed 2.6, contract section 3) computed from one
//! scrape of a sidecar plus the host's figures. `docs/metrics-object.md` maps every
//! key to its source.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use meshcat_common::model::InstanceMetrics;

use crate::envoy::model::{Bucket, StatsSnapshot};

/// Version of the metrics object's layout, in `mesh-metrics-version`.
pub const METRICS_VERSION: &str = "1";

/// The admin API's own HTTP connection manager, excluded from every figure.
const ADMIN_PREFIX: &str = "admin";

/// Figures of one inbound HTTP connection manager (`http.<prefix>.*`).
#[derive(Debug, Clone, Default, PartialEq)]
struct ConnManager {
    requests: u64,
    errors_5xx: u64,
    rx_bytes: u64,
    tx_bytes: u64,
    /// Downstream connections that were TLS; any makes the manager a TLS one.
    ssl_connections: u64,
}

/// Request totals derived from a scrape, for the wire report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestTotals {
    pub requests: u64,
    pub errors_5xx: u64,
}

/// Figures of the host the agent runs on (shared by the sidecars beside it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostFacts {
    pub cpu_pct: f64,
    pub cpu_cores: i64,
    pub memory_available: i64,
    pub memory_used: i64,
    pub memory_used_percent: f64,
}

/// Samples the host with sysinfo. CPU usage needs two samples apart in time, so
/// the sampler keeps its `System` and refreshes it at most once a second.
#[derive(Debug)]
pub struct HostSampler {
    /// The sysinfo state and when it was last refreshed.
    inner: Mutex<(sysinfo::System, Option<Instant>, HostFacts)>,
}

impl Default for HostSampler {
    fn default() -> Self {
        Self::new()
    }
}

impl HostSampler {
    pub fn new() -> Self {
        let mut sys = sysinfo::System::new();
        sys.refresh_cpu_usage();
        sys.refresh_memory();
        Self {
            inner: Mutex::new((sys, None, HostFacts::default())),
        }
    }

    /// The host's current figures.
    pub fn sample(&self) -> HostFacts {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (sys, last, facts) = &mut *guard;
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return facts.clone();
        }
        sys.refresh_cpu_usage();
        sys.refresh_memory();
        let total = sys.total_memory();
        let available = sys.available_memory();
        let used = total.saturating_sub(available);
        *facts = HostFacts {
            cpu_pct: f64::from(sys.global_cpu_usage()),
            cpu_cores: sys.cpus().len() as i64,
            memory_available: available as i64,
            memory_used: used as i64,
            memory_used_percent: if total == 0 {
                0.0
            } else {
                used as f64 * 100.0 / total as f64
            },
        };
        *last = Some(Instant::now());
        facts.clone()
    }
}

/// Splits `http.<prefix>.<suffix>` into (prefix, suffix) for the stats we read.
fn conn_managers(stats: &StatsSnapshot) -> BTreeMap<String, ConnManager> {
    const SUFFIXES: [&str; 5] = [
        ".downstream_rq_total",
        ".downstream_rq_5xx",
        ".downstream_cx_rx_bytes_total",
        ".downstream_cx_tx_bytes_total",
        ".downstream_cx_ssl_total",
    ];
    let mut out: BTreeMap<String, ConnManager> = BTreeMap::new();
    for (name, value) in &stats.values {
        let Some(rest) = name.strip_prefix("http.") else {
            continue;
        };
        for (i, suffix) in SUFFIXES.iter().enumerate() {
            if let Some(prefix) = rest.strip_suffix(suffix) {
                if prefix == ADMIN_PREFIX {
                    break;
                }
                let cm = out.entry(prefix.to_owned()).or_default();
                match i {
                    0 => cm.requests = *value,
                    1 => cm.errors_5xx = *value,
                    2 => cm.rx_bytes = *value,
                    3 => cm.tx_bytes = *value,
                    _ => cm.ssl_connections = *value,
                }
                break;
            }
        }
    }
    out
}

/// gRPC requests counted by Envoy's gRPC statistics (`cluster.<c>.grpc.*total`).
fn grpc_requests(stats: &StatsSnapshot) -> u64 {
    stats
        .values
        .iter()
        .filter(|(n, _)| n.starts_with("cluster.") && n.contains(".grpc.") && n.ends_with("total"))
        .map(|(_, v)| *v)
        .sum()
}

/// Latency figures from merged cumulative histogram buckets, in ms.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Latency {
    count: i64,
    sum: i64,
    min: i64,
    max: i64,
    quantiles: [i64; 6],
}

/// The quantiles reported, in the order of [`Latency::quantiles`].
const QUANTILES: [f64; 6] = [0.50, 0.90, 0.95, 0.99, 0.999, 0.9999];

/// Computes the latency figures from Envoy's fine-grained buckets: each bucket
/// holds `count` samples spread over `[lower_bound, lower_bound + width)`; sums use
/// bucket midpoints (as Envoy's own `_sum` does) and quantiles interpolate inside
/// the bucket. Every value is rounded the same (monotone) way, so the order
/// min <= p50 <= ... <= p9999 <= max holds.
fn latency(buckets: &[Bucket]) -> Latency {
    let mut sorted: Vec<Bucket> = buckets.iter().filter(|b| b.count > 0).copied().collect();
    sorted.sort_by(|a, b| a.lower_bound.total_cmp(&b.lower_bound));
    let count: u64 = sorted.iter().map(|b| b.count).sum();
    if count == 0 {
        return Latency::default();
    }
    let sum: f64 = sorted
        .iter()
        .map(|b| b.count as f64 * (b.lower_bound + b.width / 2.0))
        .sum();
    let min = sorted[0].lower_bound;
    let max = sorted.last().map_or(min, |b| b.lower_bound + b.width);
    let mut quantiles = [0i64; 6];
    for (slot, q) in quantiles.iter_mut().zip(QUANTILES) {
        let rank = q * count as f64;
        let mut before = 0.0;
        let mut value = max;
        for b in &sorted {
            let n = b.count as f64;
            if before + n >= rank {
                value = b.lower_bound + b.width * ((rank - before) / n).clamp(0.0, 1.0);
                break;
            }
            before += n;
        }
        *slot = round_ms(value.clamp(min, max));
    }
    Latency {
        count: count as i64,
        sum: round_ms(sum),
        min: round_ms(min),
        max: round_ms(max),
        quantiles,
    }
}

fn round_ms(v: f64) -> i64 {
    v.round() as i64
}

/// Merges the request-time histograms of every inbound connection manager.
fn merged_request_times(
    stats: &StatsSnapshot,
    managers: &BTreeMap<String, ConnManager>,
) -> Vec<Bucket> {
    let mut merged: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for prefix in managers.keys() {
        if let Some(buckets) = stats
            .histograms
            .get(&format!("http.{prefix}.downstream_rq_time"))
        {
            for b in buckets {
                *merged
                    .entry((b.lower_bound.to_bits(), b.width.to_bits()))
                    .or_default() += b.count;
            }
        }
    }
    // Histograms exist for managers that have no request counter yet (never used).
    merged
        .into_iter()
        .map(|((lb, w), count)| Bucket {
            lower_bound: f64::from_bits(lb),
            width: f64::from_bits(w),
            count,
        })
        .collect()
}

/// Builds the metrics object from one scrape.
pub fn compute(
    stats: &StatsSnapshot,
    start_time_ms: i64,
    host: &HostFacts,
) -> (InstanceMetrics, RequestTotals) {
    let managers = conn_managers(stats);
    let total: u64 = managers.values().map(|m| m.requests).sum();
    let errors: u64 = managers.values().map(|m| m.errors_5xx).sum();
    let tls: u64 = managers
        .values()
        .filter(|m| m.ssl_connections > 0)
        .map(|m| m.requests)
        .sum();
    let plain = total - tls;
    // gRPC requests are counted per upstream cluster, not per connection manager;
    // they are split between plain and TLS in the proportion of all requests.
    let grpc = grpc_requests(stats).min(total);
    let rpc_tls = if total == 0 {
        0
    } else {
        ((u128::from(grpc) * u128::from(tls)) / u128::from(total)) as u64
    };
    let rpc = (grpc - rpc_tls).min(plain);
    let rpc_tls = grpc - rpc;
    let lat = latency(&merged_request_times(stats, &managers));
    let metrics = InstanceMetrics {
        mesh_metrics_version: METRICS_VERSION.to_owned(),
        total_requests: total as i64,
        http_requests: (plain - rpc) as i64,
        https_requests: (tls - rpc_tls) as i64,
        rpc_requests: rpc as i64,
        rpc_tls_requests: rpc_tls as i64,
        all_requests: total as i64,
        all_routes: managers.keys().cloned().collect::<Vec<_>>().join(","),
        latency_avg: if lat.count == 0 {
            0.0
        } else {
            lat.sum as f64 / lat.count as f64
        },
        latency_count: lat.count,
        latency_max: lat.max,
        latency_min: lat.min,
        latency_sum: lat.sum,
        latency_p50: lat.quantiles[0],
        latency_p90: lat.quantiles[1],
        latency_p95: lat.quantiles[2],
        latency_p99: lat.quantiles[3],
        latency_p9990: lat.quantiles[4],
        latency_p9999: lat.quantiles[5],
        errors_count: errors as i64,
        in_throughput: managers.values().map(|m| m.rx_bytes).sum::<u64>() as i64,
        out_throughput: managers.values().map(|m| m.tx_bytes).sum::<u64>() as i64,
        num_goroutines: stats.get("server.concurrency") as i64,
        start_time: start_time_ms,
        cpu_pct: host.cpu_pct,
        cpu_cores: host.cpu_cores,
        os: std::env::consts::OS.to_owned(),
        os_arch: std::env::consts::ARCH.to_owned(),
        memory_available: host.memory_available,
        memory_used: host.memory_used,
        process_memory_used: stats.get("server.memory_allocated") as i64,
        memory_used_percent: host.memory_used_percent,
    };
    (
        metrics,
        RequestTotals {
            requests: total,
            errors_5xx: errors,
        },
    )
}

/// Checks the invariants of contract section 3; the error names the first broken one.
pub fn check_invariants(m: &InstanceMetrics) -> Result<(), String> {
    let parts = m.http_requests + m.https_requests + m.rpc_requests + m.rpc_tls_requests;
    if m.all_requests != m.total_requests || m.total_requests != parts {
        return Err(format!(
            "all/requests {} and Total/requests {} must equal HTTP+HTTPS+RPC+RPC_TLS {parts}",
            m.all_requests, m.total_requests
        ));
    }
    let order = [
        m.latency_min,
        m.latency_p50,
        m.latency_p90,
        m.latency_p95,
        m.latency_p99,
        m.latency_p9990,
        m.latency_p9999,
        m.latency_max,
    ];
    if order.windows(2).any(|w| w[0] > w[1]) {
        return Err(format!("latency figures out of order: {order:?}"));
    }
    let avg = if m.latency_count == 0 {
        0.0
    } else {
        m.latency_sum as f64 / m.latency_count as f64
    };
    if (m.latency_avg - avg).abs() > 1e-9 {
        return Err(format!("avg {} is not sum/count {avg}", m.latency_avg));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::model::StatsResponse;

    fn fixture_stats() -> StatsSnapshot {
        let path = format!(
            "{}/tests/fixtures/stats_ingress_21_requests_detailed.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let r: StatsResponse =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        r.into()
    }

    #[test]
    fn metrics_from_a_real_scrape() {
        let stats = fixture_stats();
        let (m, totals) = compute(&stats, 1_700_000_000_000, &HostFacts::default());
        assert_eq!(
            totals,
            RequestTotals {
                requests: 21,
                errors_5xx: 0
            }
        );
        assert_eq!(m.total_requests, 21);
        assert_eq!(m.http_requests, 21);
        assert_eq!(m.all_routes, "ingress_http");
        assert_eq!(m.latency_count, 21);
        assert_eq!(m.in_throughput, 1666);
        assert_eq!(m.out_throughput, 11787);
        assert_eq!(m.num_goroutines, 2);
        assert!(m.process_memory_used > 0);
        assert_eq!(m.latency_min, 0);
        assert_eq!(m.latency_max, 5);
        assert_eq!(m.latency_p50, 1);
        check_invariants(&m).unwrap();
    }

    #[test]
    fn empty_stats_give_zeroes_that_hold_the_invariants() {
        let (m, _) = compute(&StatsSnapshot::default(), 0, &HostFacts::default());
        assert_eq!(m.latency_avg, 0.0);
        check_invariants(&m).unwrap();
    }

    #[test]
    fn tls_and_grpc_split_keeps_the_total() {
        let mut s = StatsSnapshot::default();
        for (k, v) in [
            ("http.in_tls.downstream_rq_total", 30),
            ("http.in_tls.downstream_cx_ssl_total", 3),
            ("http.in_plain.downstream_rq_total", 10),
            ("http.in_plain.downstream_rq_5xx", 4),
            ("http.admin.downstream_rq_total", 99),
            ("cluster.svc.grpc.pkg.Svc.Method.total", 8),
        ] {
            s.values.insert(k.into(), v);
        }
        let (m, t) = compute(&s, 0, &HostFacts::default());
        assert_eq!(
            t,
            RequestTotals {
                requests: 40,
                errors_5xx: 4
            }
        );
        assert_eq!(m.rpc_tls_requests, 6);
        assert_eq!(m.rpc_requests, 2);
        assert_eq!(m.https_requests, 24);
        assert_eq!(m.http_requests, 8);
        check_invariants(&m).unwrap();
    }

    #[test]
    fn quantiles_beyond_p99_come_from_the_buckets() {
        let mut buckets: Vec<Bucket> = (0..1000)
            .map(|i| Bucket {
                lower_bound: f64::from(i),
                width: 1.0,
                count: 10,
            })
            .collect();
        buckets.push(Bucket {
            lower_bound: 5000.0,
            width: 100.0,
            count: 1,
        });
        let l = latency(&buckets);
        assert_eq!(l.count, 10_001);
        assert_eq!(l.min, 0);
        assert_eq!(l.max, 5100);
        assert_eq!(l.quantiles[0], 500);
        assert_eq!(l.quantiles[4], 999);
        assert!(l.quantiles[5] >= l.quantiles[4]);
        assert!(l.quantiles.windows(2).all(|w| w[0] <= w[1]));
    }
}
