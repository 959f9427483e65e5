//! Serde models of what Envoy 1.40's admin API really returns, and the parsers that
//! turn them into the agent's own shapes. Captured real outputs under
//! `agent/tests/fixtures/` keep these honest.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::EnvoyError;

/// `GET /server_info`.
#[derive(Debug, Clone, Deserialize)]
pub struct ServerInfo {
    /// Build string, `<sha>/<version>/<status>/<type>/<ssl>`.
    pub version: String,
    /// LIVE, DRAINING, PRE_INITIALIZING or INITIALIZING.
    pub state: String,
    /// Protobuf duration text such as `32s` or `1.500s`: uptime of this process.
    pub uptime_current_epoch: String,
    /// Command-line options; only the worker count is used.
    #[serde(default)]
    pub command_line_options: CommandLineOptions,
}

/// The part of `/server_info` `command_line_options` the agent reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommandLineOptions {
    /// Worker threads (`--concurrency`).
    #[serde(default)]
    pub concurrency: u32,
}

impl ServerInfo {
    /// Uptime of the running Envoy process.
    pub fn uptime(&self) -> Result<Duration, EnvoyError> {
        parse_proto_duration(&self.uptime_current_epoch)
    }

    /// The release number inside the build string (`1.40.0`), or the whole string.
    pub fn release(&self) -> &str {
        self.version.split('/').nth(1).unwrap_or(&self.version)
    }
}

/// Parses a protobuf JSON duration (`32s`, `0.250s`). One past what a `Duration`
/// holds is an error, not a panic: the text comes from the sidecar.
pub fn parse_proto_duration(s: &str) -> Result<Duration, EnvoyError> {
    s.strip_suffix('s')
        .and_then(|n| n.parse::<f64>().ok())
        .and_then(|n| Duration::try_from_secs_f64(n).ok())
        .ok_or_else(|| EnvoyError::Parse(format!("{s:?} is not a protobuf duration")))
}

/// A listener's address: a socket address or a pipe.
#[derive(Debug, Clone, Deserialize)]
pub struct Address {
    pub socket_address: Option<SocketAddress>,
    pub pipe: Option<Pipe>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SocketAddress {
    pub address: String,
    #[serde(default)]
    pub port_value: u32,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Pipe {
    pub path: String,
}

/// `GET /stats?format=json&histogram_buckets=detailed`: a list whose entries are
/// either one scalar (`{"name","value"}`) or the block of all histograms.
#[derive(Debug, Clone, Deserialize)]
pub struct StatsResponse {
    #[serde(default)]
    pub stats: Vec<StatEntry>,
}

/// One entry of `/stats`: a scalar (`name` and `value`) or the histogram block. A
/// struct of optional fields rather than an untagged enum, which would copy every
/// entry into serde's buffer before choosing: on a sidecar with a thousand upstream
/// clusters that buffer cost several times the answer.
#[derive(Debug, Clone, Deserialize)]
pub struct StatEntry {
    #[serde(default)]
    pub name: Option<String>,
    /// A counter or gauge (an integer); text readouts and other values read as none.
    #[serde(default)]
    pub value: Option<StatValue>,
    #[serde(default)]
    pub histograms: Option<HistogramBlock>,
}

/// A scalar's value: an integer, or none for anything else (a text readout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatValue(pub Option<u64>);

impl<'de> Deserialize<'de> for StatValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = StatValue;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a stat value")
            }
            fn visit_u64<E>(self, v: u64) -> Result<StatValue, E> {
                Ok(StatValue(Some(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<StatValue, E> {
                Ok(StatValue(u64::try_from(v).ok()))
            }
            fn visit_f64<E>(self, _: f64) -> Result<StatValue, E> {
                Ok(StatValue(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<StatValue, E> {
                Ok(StatValue(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<StatValue, E> {
                Ok(StatValue(None))
            }
            fn visit_unit<E>(self) -> Result<StatValue, E> {
                Ok(StatValue(None))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<StatValue, A::Error> {
                while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(StatValue(None))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<StatValue, A::Error> {
                while a
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(StatValue(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// The histogram block in `detailed` form.
#[derive(Debug, Clone, Deserialize)]
pub struct HistogramBlock {
    /// Present with `histogram_buckets=detailed`; the summary form has
    /// `computed_quantiles` instead, which the agent does not use.
    #[serde(default)]
    pub details: Vec<HistogramDetail>,
    /// The percentiles (0 to 100) of each detail's `percentiles`, in order.
    #[serde(default)]
    pub supported_percentiles: Vec<f64>,
}

/// One histogram with its cumulative buckets since Envoy started.
#[derive(Debug, Clone, Deserialize)]
pub struct HistogramDetail {
    pub name: String,
    #[serde(default)]
    pub totals: Vec<Bucket>,
    /// Per supported percentile, the value over all time and over the last interval.
    #[serde(default)]
    pub percentiles: Vec<PercentileValues>,
}

/// One percentile of a histogram; `interval` is `null` when nothing was recorded in
/// the last interval.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct PercentileValues {
    #[serde(default)]
    pub interval: Option<f64>,
}

/// A fine-grained (log-linear) bucket of Envoy's histogram: `count` samples in
/// `[lower_bound, lower_bound + width)`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct Bucket {
    pub lower_bound: f64,
    pub width: f64,
    pub count: u64,
}

/// Stats by name: counters and gauges as integers, histograms as buckets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatsSnapshot {
    pub values: BTreeMap<String, u64>,
    pub histograms: BTreeMap<String, Vec<Bucket>>,
    /// p50 and p99 of each histogram over Envoy's last stats interval.
    pub interval_p50_p99: BTreeMap<String, (Option<f64>, Option<f64>)>,
}

impl StatsSnapshot {
    /// A counter or gauge; `usedonly` omits never-used stats, which read as 0.
    pub fn get(&self, name: &str) -> u64 {
        self.values.get(name).copied().unwrap_or(0)
    }
}

impl From<StatsResponse> for StatsSnapshot {
    fn from(r: StatsResponse) -> Self {
        let mut snap = StatsSnapshot::default();
        for entry in r.stats {
            if let (Some(name), Some(StatValue(Some(v)))) = (entry.name, entry.value) {
                snap.values.insert(name, v);
            }
            let Some(histograms) = entry.histograms else {
                continue;
            };
            let at = |p: f64| {
                histograms
                    .supported_percentiles
                    .iter()
                    .position(|&s| s == p)
            };
            let (p50, p99) = (at(50.0), at(99.0));
            for h in histograms.details {
                let interval = |i: Option<usize>| i.and_then(|i| h.percentiles.get(i)?.interval);
                let pair = (interval(p50), interval(p99));
                if pair != (None, None) {
                    snap.interval_p50_p99.insert(h.name.clone(), pair);
                }
                // Of an upstream cluster only the interval percentiles are read (the
                // graph's latency); the buckets are the connection managers'.
                if !h.name.starts_with("cluster.") {
                    snap.histograms.insert(h.name, h.totals);
                }
            }
        }
        snap
    }
}

/// Parses the text of `POST /logging`: `active loggers:` then `  name: level` lines.
pub fn parse_loggers(text: &str) -> Result<BTreeMap<String, String>, EnvoyError> {
    let mut lines = text.lines();
    if !lines.any(|l| l.trim() == "active loggers:") {
        return Err(EnvoyError::Parse(
            "the logging answer has no `active loggers:` section".into(),
        ));
    }
    let loggers: BTreeMap<String, String> = lines
        .filter_map(|l| l.trim().split_once(": "))
        .map(|(n, lvl)| (n.trim().to_owned(), lvl.trim().to_owned()))
        .collect();
    if loggers.is_empty() {
        return Err(EnvoyError::Parse(
            "the logging answer lists no logger".into(),
        ));
    }
    Ok(loggers)
}

/// The sidecar's level: the one most of its loggers have (all of them after a
/// `POST /logging?level=`), ties broken by the more verbose level.
pub fn dominant_level(loggers: &BTreeMap<String, String>) -> Option<String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for level in loggers.values() {
        *counts.entry(level.as_str()).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|(level, n)| (*n, std::cmp::Reverse(verbosity_rank(level))))
        .map(|(level, _)| level.to_owned())
}

fn verbosity_rank(level: &str) -> u8 {
    match level {
        "trace" => 0,
        "debug" => 1,
        "info" => 2,
        "warning" => 3,
        "error" => 4,
        "critical" => 5,
        _ => 6,
    }
}

/// `GET /listeners?format=json`.
#[derive(Debug, Clone, Deserialize)]
pub struct ListenersResponse {
    #[serde(default)]
    pub listener_statuses: Vec<ListenerStatus>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ListenerStatus {
    pub name: String,
    pub local_address: Address,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn server_info_of_a_live_envoy() {
        let info: ServerInfo = serde_json::from_str(&fixture("server_info_live.json")).unwrap();
        assert_eq!(info.state, "LIVE");
        assert_eq!(info.release(), "1.40.0");
        assert_eq!(info.uptime().unwrap(), Duration::from_secs(32));
        assert_eq!(info.command_line_options.concurrency, 2);
    }

    #[test]
    fn proto_durations() {
        assert_eq!(
            parse_proto_duration("1.500s").unwrap(),
            Duration::from_millis(1500)
        );
        assert!(parse_proto_duration("3m").is_err());
        assert!(parse_proto_duration("-1s").is_err());
    }

    #[test]
    fn stats_with_detailed_histograms() {
        let r: StatsResponse =
            serde_json::from_str(&fixture("stats_ingress_21_requests_detailed.json")).unwrap();
        let snap = StatsSnapshot::from(r);
        assert_eq!(snap.get("http.ingress_http.downstream_rq_total"), 21);
        assert_eq!(snap.get("http.ingress_http.downstream_rq_5xx"), 0);
        assert_eq!(snap.get("server.concurrency"), 2);
        let h = &snap.histograms["http.ingress_http.downstream_rq_time"];
        assert_eq!(h.iter().map(|b| b.count).sum::<u64>(), 21);
    }

    #[test]
    fn loggers_and_their_dominant_level() {
        let loggers = parse_loggers(&fixture("logging_active_loggers.txt")).unwrap();
        assert_eq!(loggers["admin"], "info");
        assert_eq!(dominant_level(&loggers).as_deref(), Some("info"));
        assert!(parse_loggers("Method GET not allowed, POST required.").is_err());
    }
}
