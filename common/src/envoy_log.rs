//! Facts about the sidecar's own log that the agent (which tails it and runs the debug
//! windows) and the diagnosis (which reads what the agent collected) must agree on:
//! the TLS markers, the longest debug window, and when a line was written, read from
//! the line itself (Envoy's own time stamp, an access line's start time, or the
//! container runtime's prefix).

/// What marks a TLS failure in Envoy's log. The lines appear at debug level only;
/// Envoy 1.40 writes `TLS_error:|...OPENSSL_internal:...` (underscore) for handshake
/// failures and `TLS error: Secret is not supplied by SDS` for missing secrets; the
/// seed's wording is `TLS error`.
pub const TLS_MARKERS: [&str; 3] = ["TLS_error", "TLS error", "OPENSSL"];

/// Longest debug window one request may ask for, in seconds: how long a sidecar may be
/// kept at debug level on one request.
pub const MAX_DEBUG_WINDOW_SECONDS: u32 = 300;

/// `line` without the prefix a container runtime writes in a pod's log file
/// (`<RFC 3339 time> stdout|stderr F|P `), with that time; `line` as is otherwise.
pub fn strip_cri_prefix(line: &str) -> (Option<i64>, &str) {
    let mut parts = line.splitn(4, ' ');
    if let (Some(time), Some(stream), Some(tag), Some(rest)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
        && matches!(stream, "stdout" | "stderr")
        && matches!(tag, "F" | "P")
        && let Some(ms) = rfc3339_ms(time)
    {
        return (Some(ms), rest);
    }
    (None, line)
}

/// `[YYYY-MM-DD HH:MM:SS.mmm]` at the start of an entry of Envoy's own log, read as
/// UTC (Envoy writes its local time, UTC in containers unless `TZ` says otherwise).
pub fn envoy_time_ms(line: &str) -> Option<i64> {
    let stamp = line.get(1..24)?;
    if !line.starts_with('[') || line.as_bytes().get(24) != Some(&b']') {
        return None;
    }
    let (date, time) = stamp.split_at(10);
    civil_ms(date, time.strip_prefix(' ')?, 0)
}

/// When a line of a sidecar's log was written, as the line says: the container
/// runtime's time in front of it, else Envoy's own time stamp, else the start time
/// of an access line (`[2026-11-21T23:58:24.935Z] "GET ...`, UTC). `None` for a line
/// that carries no time (a continuation of a multi-line entry).
pub fn line_time_ms(line: &str) -> Option<i64> {
    let (runtime, text) = strip_cri_prefix(line);
    if runtime.is_some() {
        return runtime;
    }
    envoy_time_ms(text).or_else(|| {
        let stamp = text.strip_prefix('[')?.split_once(']')?.0;
        rfc3339_ms(stamp)
    })
}

/// An RFC 3339 time (`2026-11-27T17:37:02.269123456Z`, or with `+hh:mm`), in ms
/// since the epoch; the fraction beyond milliseconds is dropped.
pub fn rfc3339_ms(s: &str) -> Option<i64> {
    let (date, rest) = s.split_once(['T', 't'])?;
    let (time, offset_s) = if let Some(t) = rest.strip_suffix(['Z', 'z']) {
        (t, 0)
    } else {
        let at = rest.rfind(['+', '-'])?;
        let (t, off) = rest.split_at(at);
        let sign = if off.starts_with('-') { -1 } else { 1 };
        let (h, m) = off[1..].split_once(':')?;
        let (h, m) = (two_digits(h)?, two_digits(m)?);
        if h > 23 || m > 59 {
            return None;
        }
        (t, sign * (h * 3600 + m * 60))
    };
    civil_ms(date, time, offset_s)
}

/// `ms` since the epoch as RFC 3339 in UTC with milliseconds
/// (`2026-11-27T17:37:02.269Z`), as the diagnosis quotes the times it compares.
pub fn rfc3339_text(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH
        .checked_add(std::time::Duration::from_millis(ms.max(0).unsigned_abs()))
        .unwrap_or(std::time::UNIX_EPOCH);
    humantime::format_rfc3339_millis(t).to_string()
}

/// Exactly two ASCII digits.
fn two_digits(s: &str) -> Option<i64> {
    match s.as_bytes() {
        [a @ b'0'..=b'9', b @ b'0'..=b'9'] => Some(i64::from(a - b'0') * 10 + i64::from(b - b'0')),
        _ => None,
    }
}

/// `YYYY-MM-DD` and `HH:MM:SS[.fraction]` at `offset_s` east of UTC, in ms since the
/// epoch. Each field has exactly its number of digits (so no field can overflow the
/// arithmetic below); the fraction has one digit at least.
fn civil_ms(date: &str, time: &str, offset_s: i64) -> Option<i64> {
    let d = date.as_bytes();
    if d.len() != 10 || d[4] != b'-' || d[7] != b'-' {
        return None;
    }
    let y = two_digits(&date[0..2])? * 100 + two_digits(&date[2..4])?;
    let (m, day) = (two_digits(&date[5..7])?, two_digits(&date[8..10])?);
    let (hms, fraction) = match time.split_once('.') {
        Some((hms, f)) if !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()) => (hms, f),
        Some(_) => return None,
        None => (time, ""),
    };
    let t = hms.as_bytes();
    if t.len() != 8 || t[2] != b':' || t[5] != b':' {
        return None;
    }
    let (h, min, sec) = (
        two_digits(&hms[0..2])?,
        two_digits(&hms[3..5])?,
        two_digits(&hms[6..8])?,
    );
    if !(1..=12).contains(&m)
        || !(1..=days_in_month(y, m)).contains(&day)
        || h > 23
        || min > 59
        || sec > 60
    {
        return None;
    }
    let ms = fraction
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0, |n, b| n * 10 + i64::from(b - b'0'));
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + h * 3600 + min * 60 + sec - offset_s) * 1000) + ms)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if y % 4 == 0 && (y % 100 != 0 || y % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

#[cfg(test)]
mod differential;

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

    fn ms(stamp: &str) -> i64 {
        envoy_time_ms(&format!("[{stamp}]")).unwrap()
    }

    #[test]
    fn times_are_read_as_utc() {
        assert_eq!(ms("1970-01-01 00:00:00.000"), 0);
        assert_eq!(ms("2000-03-01 00:00:01.500"), 951_868_801_500);
        assert_eq!(
            envoy_time_ms("[2026-11-27 17:37:02.269][16510][warning]"),
            Some(1_795_801_022_269)
        );
        assert_eq!(envoy_time_ms("[info] x"), None);
        assert_eq!(
            rfc3339_ms("2026-11-27T17:37:02.269123456Z"),
            Some(1_795_801_022_269)
        );
        assert_eq!(rfc3339_text(1_795_801_022_269), "2026-11-27T17:37:02.269Z");
    }

    #[test]
    fn container_runtime_prefixes_are_read_through() {
        assert_eq!(
            strip_cri_prefix("2026-11-27T17:37:20.5+01:00 stdout P x y"),
            (Some(1_795_801_040_500 - 3_600_000), "x y")
        );
        assert_eq!(strip_cri_prefix("[2026] x y z"), (None, "[2026] x y z"));
    }

    /// Lines as Envoy 1.40 and a container runtime write them.
    #[test]
    fn a_line_tells_when_it_was_written() {
        let access = r#"[2026-11-21T23:58:24.935Z] "GET /catalog/items HTTP/1.1" 503 URX,UF 0 121 41 - "-" "ua" "id" "a" "b""#;
        let own = "[2026-11-21 23:58:20.695][12732][warning][config] [x.cc:152] gRPC config: initial fetch timed out";
        assert_eq!(line_time_ms(access), rfc3339_ms("2026-11-21T23:58:24.935Z"));
        assert_eq!(line_time_ms(own), rfc3339_ms("2026-11-21T23:58:20.695Z"));
        assert_eq!(
            line_time_ms(&format!("2026-11-21T23:58:30.000000001Z stdout F {own}")),
            rfc3339_ms("2026-11-21T23:58:30Z")
        );
        assert_eq!(line_time_ms("  cluster_name: \"x\""), None);
        assert_eq!(line_time_ms("[2026] x"), None);
    }

    /// Fields with too many digits, out of range or missing are refused, never read
    /// into a time they overflow.
    #[test]
    fn malformed_times_are_refused() {
        for bad in [
            "99999999999999999-01-01T00:00:00Z",
            "2026-1-01T00:00:00Z",
            "2026-02-30T00:00:00Z",
            "2026-01-01T24:00:00Z",
            "2026-01-01T00:00:00.Z",
            "2026-01-01T00:00:00+99:00",
            "2026-01-01T00:00:00+1:00",
            "2026-01-01",
            "+2026-01-01T00:00:00Z",
        ] {
            assert_eq!(rfc3339_ms(bad), None, "{bad}");
        }
        assert_eq!(rfc3339_ms("2024-02-29T00:00:00Z"), Some(1_709_164_800_000));
    }
}
