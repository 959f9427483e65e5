//! The access line reader against the format itself: entries generated field by
//! field, written as Envoy's default format writes them (behind a container
//! runtime's prefix or not), must read back as the same entry; anything else reads
//! as no entry or some entry, never a panic (docs/reliability.md, "Parsers").

use meshcat_common::differential::config;
use proptest::prelude::*;

use super::{AccessLogEntry, MAX_LINE, parse_line};

/// A quoted field other than the user agent: no quote in it, `-` for none.
fn field() -> impl Strategy<Value = Option<String>> {
    proptest::option::of("[!#-~]{1,24}".prop_filter("not the dash", |s| s != "-"))
}

fn number() -> impl Strategy<Value = Option<u64>> {
    proptest::option::of(any::<u64>())
}

fn entry() -> impl Strategy<Value = AccessLogEntry> {
    let flags = proptest::collection::btree_set(
        proptest::sample::select(
            &[
                "UF", "URX", "UH", "NR", "NC", "UAEX", "UT", "UC", "DC", "RL",
            ][..],
        )
        .prop_map(str::to_owned),
        0..4,
    );
    (
        (
            (0i64..4_102_444_800_000).prop_map(meshcat_common::envoy_log::rfc3339_text),
            proptest::option::of("[A-Z]{3,7}"),
            proptest::option::of("/[!#-~]{0,40}".prop_filter("not the dash", |s| s != "-")),
            proptest::option::of(
                prop_oneof![Just("HTTP/1.1"), Just("HTTP/2"), Just("HTTP/3")]
                    .prop_map(str::to_owned),
            ),
            0u16..1000,
            flags,
        ),
        (number(), number(), number(), number()),
        (
            field(),
            // A user agent may hold anything printable, quotes and `" "` included.
            proptest::option::of(
                "[ -~]{1,30}".prop_filter("not the dash, no end blank", |s| {
                    s != "-" && !s.ends_with(' ') && !s.starts_with(' ')
                }),
            ),
            field(),
            field(),
            field(),
        ),
    )
        .prop_map(
            |(
                (start_time, method, path, protocol, response_code, response_flags),
                (br, bs, d, ust),
                (ff, ua, id, auth, host),
            )| {
                AccessLogEntry {
                    start_time,
                    method,
                    path,
                    protocol,
                    response_code,
                    response_flags,
                    bytes_received: br,
                    bytes_sent: bs,
                    duration_ms: d,
                    upstream_service_time_ms: ust,
                    forwarded_for: ff,
                    user_agent: ua,
                    request_id: id,
                    authority: auth,
                    upstream_host: host,
                }
            },
        )
}

/// `e` as Envoy's default access log format writes it.
fn write(e: &AccessLogEntry) -> String {
    let d = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".into());
    let n = |v: Option<u64>| v.map_or_else(|| "-".into(), |v| v.to_string());
    let flags = if e.response_flags.is_empty() {
        "-".to_owned()
    } else {
        e.response_flags
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join(",")
    };
    format!(
        "[{}] \"{} {} {}\" {} {flags} {} {} {} {} \"{}\" \"{}\" \"{}\" \"{}\" \"{}\"",
        e.start_time,
        d(&e.method),
        d(&e.path),
        d(&e.protocol),
        e.response_code,
        n(e.bytes_received),
        n(e.bytes_sent),
        n(e.duration_ms),
        n(e.upstream_service_time_ms),
        d(&e.forwarded_for),
        d(&e.user_agent),
        d(&e.request_id),
        d(&e.authority),
        d(&e.upstream_host),
    )
}

proptest! {
    #![proptest_config(config(2_048))]

    /// Written as Envoy writes it, read back whole, with or without a container
    /// runtime's prefix, the flags in any order.
    #[test]
    fn lines_read_back_as_written(e in entry(), prefix in any::<bool>(), reversed in any::<bool>()) {
        let mut line = write(&e);
        if reversed && e.response_flags.len() > 1 {
            let fwd = e.response_flags.iter().cloned().collect::<Vec<_>>().join(",");
            let back = e.response_flags.iter().rev().cloned().collect::<Vec<_>>().join(",");
            line = line.replacen(&format!(" {fwd} "), &format!(" {back} "), 1);
        }
        if prefix {
            line = format!("2026-11-21T23:58:15.600000000Z stdout F {line}");
        }
        let got = parse_line(&line);
        prop_assert_eq!(got.as_ref(), Some(&e), "{}", line);
    }

    /// Any line, and any line cut short: never a panic.
    #[test]
    fn any_line_never_panics(e in entry(), cut in any::<usize>(), junk in ".{0,80}") {
        let line = write(&e);
        let at = (0..=line.len()).filter(|i| line.is_char_boundary(*i)).nth(cut % (line.len() + 1)).unwrap_or(0);
        let _ = parse_line(&line[..at]);
        let _ = parse_line(&junk);
        let _ = parse_line(&format!("[{junk}"));
    }
}

/// Envoy's own lines, and lines past the bound, are no entry.
#[test]
fn other_lines_are_no_entry() {
    assert_eq!(
        parse_line("[2026-11-21 23:58:20.695][12732][info][main] [main.cc:1] starting"),
        None
    );
    let long = format!(
        "[2026-11-21T23:58:15.589Z] \"GET /{} HTTP/1.1\" 200 - 0 0 0 - \"-\" \"-\" \"-\" \"-\" \"-\"",
        "a".repeat(MAX_LINE)
    );
    assert_eq!(parse_line(&long), None);
}
