//! Parser of Envoy's default access log format, robust to the other lines of a
//! sidecar's log (Envoy's own log, multi-line header dumps at debug level).
//!
//! The default format is
//! `[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%"
//! %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION%
//! %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%"
//! "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"`.

use std::collections::BTreeSet;

/// Longest line the parser looks at; longer ones are not access lines of interest.
pub const MAX_LINE: usize = 16 * 1024;

/// One request as the default access log format records it. `-` fields are `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLogEntry {
    /// `%START_TIME%` as written (RFC 3339 with milliseconds).
    pub start_time: String,
    pub method: Option<String>,
    /// The original path, query included.
    pub path: Option<String>,
    pub protocol: Option<String>,
    /// 0 when no response was sent (downstream went away).
    pub response_code: u16,
    /// Envoy writes a comma-separated set in its own order (`URX,UF`); order is
    /// meaningless, so it is kept as a set.
    pub response_flags: BTreeSet<String>,
    pub bytes_received: Option<u64>,
    pub bytes_sent: Option<u64>,
    pub duration_ms: Option<u64>,
    /// Time the upstream took to answer, absent when no upstream answered.
    pub upstream_service_time_ms: Option<u64>,
    pub forwarded_for: Option<String>,
    pub user_agent: Option<String>,
    /// Correlates the edge's line with the service sidecar's lines of one request.
    pub request_id: Option<String>,
    pub authority: Option<String>,
    /// `-` when the request never reached an upstream host: the tell of a discovery
    /// problem.
    pub upstream_host: Option<String>,
}

impl AccessLogEntry {
    /// Whether the set of response flags holds `flag`.
    pub fn has_flag(&self, flag: &str) -> bool {
        self.response_flags.contains(flag)
    }

    /// The path without its query string.
    pub fn path_only(&self) -> Option<&str> {
        self.path
            .as_deref()
            .map(|p| p.split('?').next().unwrap_or(p))
    }

    /// Whether this request's path is `wanted` or below it; the query is ignored.
    pub fn matches_path(&self, wanted: &str) -> bool {
        let wanted = wanted.split('?').next().unwrap_or(wanted);
        match self.path_only() {
            Some(p) => {
                p == wanted
                    || (p.starts_with(wanted) && wanted.ends_with('/'))
                    || p.strip_prefix(wanted)
                        .is_some_and(|rest| rest.starts_with('/'))
            }
            None => false,
        }
    }

    /// Flags as Envoy writes them (`-` when none), in sorted order.
    pub fn flags_text(&self) -> String {
        if self.response_flags.is_empty() {
            "-".to_owned()
        } else {
            self.response_flags
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(",")
        }
    }
}

fn dash(s: &str) -> Option<String> {
    (s != "-" && !s.is_empty()).then(|| s.to_owned())
}

fn dash_num(s: &str) -> Option<u64> {
    s.parse().ok()
}

/// Parses one log line; `None` for anything that is not a default-format access line.
/// A prefix before the opening bracket (a container runtime's timestamp) is tolerated.
pub fn parse_line(line: &str) -> Option<AccessLogEntry> {
    if line.len() > MAX_LINE {
        return None;
    }
    let line = line.trim_end();
    let start = line.find("[")?;
    let rest = &line[start + 1..];
    let close = rest.find(']')?;
    let start_time = &rest[..close];
    // Envoy's own lines read `[2026-01-01 00:00:00.000][tid][level]`: a space, no `T`.
    if !start_time.contains('T') || start_time.contains(' ') {
        return None;
    }
    let rest = rest[close + 1..].strip_prefix(" \"")?;
    let end_req = rest.find('"')?;
    let mut request = rest[..end_req].splitn(3, ' ');
    let method = dash(request.next()?);
    let path = request.next().and_then(dash);
    let protocol = request.next().and_then(dash);
    let rest = rest[end_req + 1..].trim_start();

    let mut fields = rest.splitn(7, ' ');
    let response_code: u16 = fields.next()?.parse().ok()?;
    let flags = fields.next()?;
    let response_flags = if flags == "-" {
        BTreeSet::new()
    } else {
        flags.split(',').map(str::to_owned).collect()
    };
    let bytes_received = dash_num(fields.next()?);
    let bytes_sent = dash_num(fields.next()?);
    let duration_ms = dash_num(fields.next()?);
    let upstream_service_time_ms = dash_num(fields.next()?);
    let quoted = fields.next()?.trim();
    let inner = quoted.strip_prefix('"')?.strip_suffix('"')?;
    let parts: Vec<&str> = inner.split("\" \"").collect();
    // A user agent may itself hold `" "`; the fields after it are fixed, so read those
    // from the end and give the user agent whatever is left in the middle.
    if parts.len() < 5 {
        return None;
    }
    let n = parts.len();
    Some(AccessLogEntry {
        start_time: start_time.to_owned(),
        method,
        path,
        protocol,
        response_code,
        response_flags,
        bytes_received,
        bytes_sent,
        duration_ms,
        upstream_service_time_ms,
        forwarded_for: dash(parts[0]),
        user_agent: dash(&parts[1..n - 3].join("\" \"")),
        request_id: dash(parts[n - 3]),
        authority: dash(parts[n - 2]),
        upstream_host: dash(parts[n - 1]),
    })
}

/// Parses every access line of a log, with the raw line beside each entry.
pub fn parse_lines<'a, I>(lines: I) -> Vec<(AccessLogEntry, &'a str)>
where
    I: IntoIterator<Item = &'a str>,
{
    lines
        .into_iter()
        .filter_map(|l| parse_line(l).map(|e| (e, l)))
        .collect()
}

/// Whether an upstream host is the loopback: the service sidecar's local cluster.
pub fn is_loopback_host(host: &str) -> bool {
    let h = host.rsplit_once(':').map_or(host, |(h, _)| h);
    let h = h.trim_start_matches('[').trim_end_matches(']');
    h.starts_with("127.") || h == "::1" || h == "localhost"
}

#[cfg(test)]
mod differential;

#[cfg(test)]
mod tests {
    use super::*;

    // Lines as Envoy 1.40 wrote them in the captured scenarios.
    const EDGE_URX_UF: &str = r#"[2026-11-21T23:58:24.935Z] "GET /catalog/items HTTP/1.1" 503 URX,UF 0 121 41 - "-" "Python-urllib/3.11" "2bc35450-9995-475d-9b19-dd77935e90c9" "127.0.0.1:41135" "127.0.0.1:33041""#;
    const EDGE_UH: &str = r#"[2026-11-21T23:58:15.589Z] "GET /catalog/items HTTP/1.1" 503 UH 0 19 0 - "-" "Python-urllib/3.11" "d61fbc4b-00a0-44d1-a453-d4e7ffd801f1" "127.0.0.1:45231" "-""#;
    const OK: &str = r#"[2026-11-21T23:58:13.784Z] "GET /catalog/items?x=1 HTTP/1.1" 200 - 0 14 16 14 "10.0.0.1" "Python-urllib/3.11" "143db34d" "127.0.0.1:35059" "127.0.0.1:49057""#;
    const ENVOY_LINE: &str = "[2026-11-21 23:58:20.695][12732][warning][config] [source/extensions/config_subscription/grpc/grpc_subscription_impl.cc:152] gRPC config: initial fetch timed out";

    #[test]
    fn parses_flags_as_a_set() {
        let e = parse_line(EDGE_URX_UF).unwrap();
        assert_eq!(e.response_code, 503);
        assert!(e.has_flag("UF") && e.has_flag("URX"));
        let seed = parse_line(&EDGE_URX_UF.replace("URX,UF", "UF,URX")).unwrap();
        assert_eq!(seed.response_flags, e.response_flags);
        assert_eq!(e.upstream_host.as_deref(), Some("127.0.0.1:33041"));
        assert_eq!(
            e.request_id.as_deref(),
            Some("2bc35450-9995-475d-9b19-dd77935e90c9")
        );
        assert_eq!(e.bytes_sent, Some(121));
        assert_eq!(e.duration_ms, Some(41));
        assert_eq!(e.upstream_service_time_ms, None);
        assert_eq!(e.flags_text(), "UF,URX");
    }

    #[test]
    fn parses_dash_host_and_no_flags() {
        let e = parse_line(EDGE_UH).unwrap();
        assert!(e.has_flag("UH"));
        assert_eq!(e.upstream_host, None);
        let ok = parse_line(OK).unwrap();
        assert!(ok.response_flags.is_empty());
        assert_eq!(ok.forwarded_for.as_deref(), Some("10.0.0.1"));
        assert_eq!(ok.path_only(), Some("/catalog/items"));
        assert!(ok.matches_path("/catalog/items"));
        assert!(ok.matches_path("/catalog/"));
        assert!(ok.matches_path("/catalog"));
        assert!(!ok.matches_path("/cat"));
        assert!(!ok.matches_path("/inventory"));
    }

    #[test]
    fn ignores_other_lines_and_tolerates_prefixes() {
        assert_eq!(parse_line(ENVOY_LINE), None);
        assert_eq!(parse_line("':status', '200'"), None);
        assert_eq!(parse_line(""), None);
        assert_eq!(parse_line("[2026-11-21T23:58:13.784Z] \"GET"), None);
        let prefixed = format!("2026-11-21T23:58:15.600000000Z {EDGE_UH}");
        assert!(parse_line(&prefixed).is_some());
        let ua = EDGE_UH.replace("Python-urllib/3.11", "odd\" \"agent");
        let e = parse_line(&ua).unwrap();
        assert_eq!(e.user_agent.as_deref(), Some("odd\" \"agent"));
        assert_eq!(e.upstream_host, None);
        assert_eq!(parse_line(&"x".repeat(MAX_LINE + 1)), None);
    }

    #[test]
    fn recognises_loopback_hosts() {
        assert!(is_loopback_host("127.0.0.1:8080"));
        assert!(is_loopback_host("[::1]:8080"));
        assert!(!is_loopback_host("10.1.2.3:8080"));
    }
}
