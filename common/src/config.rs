//! Command-line helpers shared by both binaries: value parsers for durations and
//! byte sizes, the log format flag, the pair of PEM files a TLS identity is given
//! as, tracing set-up, the shutdown signal and the exit code for a bad
//! configuration.

use std::time::Duration;

/// Exit status for a configuration error (`EX_USAGE` of sysexits.h).
pub const EXIT_USAGE: i32 = 64;

/// Most aggregator replicas an agent's `--aggregator` list names (the agent's flag and
/// `meshcat inject --aggregator` both take it).
pub const MAX_AGGREGATORS: usize = 16;

/// A PEM certificate chain and its private key, given together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

impl TlsFiles {
    /// The pair, when both are given (a half pair is refused before).
    pub fn pair(
        cert: Option<std::path::PathBuf>,
        key: Option<std::path::PathBuf>,
    ) -> Option<TlsFiles> {
        cert.zip(key).map(|(cert, key)| TlsFiles { cert, key })
    }
}

/// Checks a `host:port` address by [`crate::validate::host_port`]; answers it without
/// surrounding spaces.
pub fn parse_host_port(s: &str) -> Result<String, String> {
    let s = s.trim();
    crate::validate::host_port(s)?;
    Ok(s.to_owned())
}

/// Checks a comma-separated list of 1 to [`MAX_AGGREGATORS`] `host:port` addresses
/// ([`parse_host_port`]); answers it with spaces removed.
pub fn parse_aggregators(s: &str) -> Result<String, String> {
    let list = s
        .split(',')
        .map(parse_host_port)
        .collect::<Result<Vec<_>, _>>()?;
    if list.len() > MAX_AGGREGATORS {
        return Err(format!("at most {MAX_AGGREGATORS} aggregator addresses"));
    }
    Ok(list.join(","))
}

/// A duration as a flag's default is written: in the largest of days, hours, minutes,
/// seconds and milliseconds that it is a whole number of (`7d`, `30s`, `50ms`), so a
/// component's constant gives its flag's default text ([`parse_duration`] reads it
/// back).
pub fn duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms > 0 && ms % size == 0 {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// A size as a flag's default is written: in MiB or KiB when a whole number of them
/// (`4MiB`, `256KiB`), else in bytes ([`parse_bytes`] reads it back).
pub fn size_text(bytes: u64) -> String {
    match bytes {
        b if b > 0 && b % (1 << 20) == 0 => format!("{}MiB", b >> 20),
        b if b > 0 && b % (1 << 10) == 0 => format!("{}KiB", b >> 10),
        b => b.to_string(),
    }
}

/// Parses a duration written like `500ms`, `5s` or `2m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration like 500ms, 5s or 2m ({e})"))?;
    Ok(d)
}

/// Parses a non-zero duration.
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("{s:?} must be longer than zero"));
    }
    Ok(d)
}

/// Parses a byte size written like `1048576`, `512KiB`, `1MiB`, `4MB` or `1GiB`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 1MiB, 512KiB or 1048576"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" | "k" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "{s:?} has an unknown unit {other:?}; use B, KiB, MiB or GiB"
            ));
        }
    };
    let v = n
        .checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))?;
    if v == 0 {
        return Err(format!("{s:?} must be larger than zero"));
    }
    Ok(v)
}

/// Parses a ratio between 0 and 1 inclusive.
pub fn parse_ratio(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number between 0 and 1"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("{s:?} is not between 0 and 1"));
    }
    Ok(v)
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global tracing subscriber. The level comes from `RUST_LOG`
/// (default `info`).
pub fn init_tracing(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second initialisation (tests that start several servers) is harmless.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Installs the SIGTERM and SIGINT handlers now and returns a future that resolves
/// when either arrives. Installing before the future is first polled matters: a
/// signal sent as soon as a server logs its address must already be caught. Must be
/// called inside a tokio runtime.
pub fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received, shutting down."),
            _ = int.recv() => tracing::info!("SIGINT received, shutting down."),
        }
    })
}

/// Reads a token file: one token, surrounding whitespace trimmed, never empty.
pub fn read_token_file(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read token file {}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("token file {} is empty", path.display()));
    }
    Ok(token.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_as_text_read_back() {
        for (d, text) in [
            (Duration::from_secs(7 * 86_400), "7d"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(120), "2m"),
            (Duration::from_millis(50), "50ms"),
            (Duration::ZERO, "0ms"),
        ] {
            assert_eq!(duration_text(d), text);
            assert_eq!(parse_duration(text), Ok(d), "{text}");
        }
        for (b, text) in [(4 << 20, "4MiB"), (256 << 10, "256KiB"), (1000, "1000")] {
            assert_eq!(size_text(b), text);
            assert_eq!(parse_bytes(text), Ok(b), "{text}");
        }
    }

    #[test]
    fn addresses_and_lists_of_them() {
        for ok in ["127.0.0.1:9901", "envoy.local:9901", "[::1]:9901", " a:1 "] {
            assert_eq!(parse_host_port(ok).as_deref(), Ok(ok.trim()), "{ok}");
        }
        for bad in [
            "::1:9901",
            "127.0.0.1",
            ":9901",
            "h:70000",
            "h:0",
            "a b:1",
            "-a:1",
        ] {
            assert!(parse_host_port(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_aggregators("a:1, 127.0.0.1:2,[::1]:3").unwrap(),
            "a:1,127.0.0.1:2,[::1]:3"
        );
        for bad in ["", "a:1,", "a:1,b", "a b:1"] {
            assert!(parse_aggregators(bad).is_err(), "{bad}");
        }
        let many = vec!["h:1"; MAX_AGGREGATORS + 1].join(",");
        assert!(parse_aggregators(&many).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("five").is_err());
        assert!(parse_positive_duration("0s").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_bytes("512KiB").unwrap(), 512 << 10);
        assert_eq!(parse_bytes("1000").unwrap(), 1000);
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("1XB").is_err());
        assert!(parse_bytes("MiB").is_err());
    }

    #[test]
    fn ratios() {
        assert_eq!(parse_ratio("0.05").unwrap(), 0.05);
        assert!(parse_ratio("1.5").is_err());
        assert!(parse_ratio("x").is_err());
    }
}
