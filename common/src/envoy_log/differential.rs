//! The times read from a sidecar's log lines against a reference: RFC 3339 as the
//! `time` crate reads it, on generated times and lines (docs/reliability.md,
//! "Parsers").

use proptest::prelude::*;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{envoy_time_ms, line_time_ms, rfc3339_ms, rfc3339_text, strip_cri_prefix};
use crate::differential::config;

/// The reference: `time`'s RFC 3339, in ms since the epoch (the fraction beyond
/// them dropped, toward the past).
fn reference(s: &str) -> Option<i64> {
    let t = OffsetDateTime::parse(s, &Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos().div_euclid(1_000_000)).ok()
}

fn days_in(y: u32, m: u32) -> u32 {
    match m {
        2 if y % 4 == 0 && (y % 100 != 0 || y % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// RFC 3339 times of years 0 to 9999, with or without a fraction of 1 to 12
/// digits, in UTC (`Z` or `z`) or at an offset, the separator `T` or `t`.
fn rfc3339() -> impl Strategy<Value = String> {
    (0u32..=9999, 1u32..=12)
        .prop_flat_map(|(y, m)| (Just(y), Just(m), 1..=days_in(y, m)))
        .prop_flat_map(|(y, m, d)| {
            (
                Just((y, m, d)),
                (0u32..24, 0u32..60, 0u32..60),
                proptest::option::of("[0-9]{1,12}"),
                prop_oneof![
                    Just("Z".to_owned()),
                    Just("z".to_owned()),
                    (any::<bool>(), 0u32..24, 0u32..60).prop_map(|(neg, h, m)| {
                        format!("{}{h:02}:{m:02}", if neg { '-' } else { '+' })
                    }),
                ],
                prop_oneof![Just('T'), Just('t')],
            )
        })
        .prop_map(|((y, m, d), (h, mi, s), frac, zone, sep)| {
            let frac = frac.map(|f| format!(".{f}")).unwrap_or_default();
            format!("{y:04}-{m:02}-{d:02}{sep}{h:02}:{mi:02}:{s:02}{frac}{zone}")
        })
}

/// Text near an RFC 3339 time: a valid one changed at one place.
fn near_rfc3339() -> impl Strategy<Value = String> {
    (
        rfc3339(),
        any::<usize>(),
        proptest::sample::select(
            &[
                "",
                "0",
                "9",
                "99",
                ":",
                "-",
                "+",
                "T",
                " ",
                ".",
                "Z",
                "60",
                "00",
                "a",
                "é",
                "999999999999999999999",
            ][..],
        ),
        0u8..3,
    )
        .prop_map(|(t, at, put, how)| {
            let mut chars: Vec<char> = t.chars().collect();
            let at = at % (chars.len() + 1);
            match how {
                0 => chars.truncate(at),
                1 if at < chars.len() => {
                    chars.remove(at);
                }
                _ => {}
            }
            let mut s: String = chars.into_iter().collect();
            if how == 2 {
                let at = s.char_indices().map(|(i, _)| i).nth(at).unwrap_or(s.len());
                s.insert_str(at, put);
            }
            s
        })
}

proptest! {
    #![proptest_config(config(2_048))]

    #[test]
    fn valid_times_read_as_the_reference_reads_them(t in rfc3339()) {
        prop_assert_eq!(rfc3339_ms(&t), reference(&t), "{}", t);
    }

    /// Times changed at one place: the reference's time, or none for both. A leap
    /// second (`:60`) the reference takes only at the end of a UTC day; here it is
    /// the next minute's first second wherever it is.
    #[test]
    fn changed_times_read_as_the_reference_reads_them(t in near_rfc3339()) {
        let got = rfc3339_ms(&t);
        if t.len() > 19 && t.get(17..19) == Some("60") {
            return Ok(());
        }
        prop_assert_eq!(got, reference(&t), "{:?}", t);
    }

    /// Any text: never a panic.
    #[test]
    fn any_text_never_panics(t in ".{0,40}") {
        let _ = rfc3339_ms(&t);
        let _ = envoy_time_ms(&t);
        let _ = line_time_ms(&t);
        let _ = strip_cri_prefix(&t);
    }

    /// Envoy's own stamp (`[YYYY-MM-DD HH:MM:SS.mmm]`, read as UTC), an access line's
    /// start time and a container runtime's prefix: each line tells the time it was
    /// written with.
    #[test]
    fn a_line_tells_its_time(
        t in rfc3339(),
        rest in "[ -~]{0,40}",
        stream in prop_oneof![Just("stdout"), Just("stderr")],
        tag in prop_oneof![Just("F"), Just("P")],
    ) {
        let ms = reference(&t).unwrap();
        // In UTC, to the millisecond, as Envoy writes it.
        let utc = rfc3339_text(ms);
        if ms >= 0 && utc.len() == 24 {
            let own = format!("[{} {}][12][info][main] {rest}", &utc[..10], &utc[11..23]);
            prop_assert_eq!(envoy_time_ms(&own), Some(ms), "{}", own);
            prop_assert_eq!(line_time_ms(&own), Some(ms));
            let access = format!("[{utc}] \"GET /{rest} HTTP/1.1\" 200");
            prop_assert_eq!(line_time_ms(&access), Some(ms), "{}", access);
        }
        let line = format!("{t} {stream} {tag} {rest}");
        prop_assert_eq!(strip_cri_prefix(&line), (Some(ms), rest.as_str()));
        prop_assert_eq!(line_time_ms(&line), Some(ms));
    }
}
