//! The tail's line reader against a reference: the bytes read whole and split at
//! each newline by the standard library, on generated logs cut into chunks anywhere
//! (docs/reliability.md, "Parsers").

use meshcat_common::differential::{chunks, config, cuts};
use proptest::prelude::*;

use super::{Follower, TailConfig};

/// The reference: every line ended by `\n`, without a `\r` before it, decoded with
/// invalid UTF-8 replaced, cut to at most `max` bytes at a character boundary (and
/// then marked), blank ones left out; an unended last line is not a line yet.
fn reference(bytes: &[u8], max: usize) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    lines.pop();
    for line in lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let mut text = String::from_utf8_lossy(line).into_owned();
        let cut = text.len() > max;
        if cut {
            let mut end = max;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        if !text.trim().is_empty() {
            out.push((text, cut));
        }
    }
    out
}

/// Log text: Envoy's lines and access lines, blank lines, `\r\n` ends, characters
/// of every width, invalid UTF-8, and lines longer than the bound.
fn log() -> impl Strategy<Value = Vec<u8>> {
    let line = prop_oneof![
        4 => "[ -~]{0,60}".prop_map(String::into_bytes),
        1 => Just(Vec::new()),
        1 => Just(b"   \t".to_vec()),
        1 => "[a-zé€😀]{0,30}".prop_map(String::into_bytes),
        1 => proptest::collection::vec(any::<u8>(), 0..40),
        1 => (50usize..200).prop_map(|n| "é".repeat(n).into_bytes()),
    ];
    let end = prop_oneof![4 => Just(&b"\n"[..]), 1 => Just(&b"\r\n"[..])];
    (
        proptest::collection::vec((line, end), 0..20),
        proptest::option::of("[ -~]{0,10}"),
    )
        .prop_map(|(lines, tail)| {
            let mut out = Vec::new();
            for (l, e) in lines {
                out.extend(l.iter().filter(|&&b| b != b'\n'));
                out.extend_from_slice(e);
            }
            out.extend(tail.unwrap_or_default().into_bytes());
            out
        })
}

proptest! {
    #![proptest_config(config(1_024))]

    #[test]
    fn lines_read_as_the_reference_splits_them(
        bytes in log(),
        c in cuts(2_048),
        max in prop_oneof![Just(16usize), Just(64), Just(16 << 10), 1usize..300],
    ) {
        let config = TailConfig {
            max_line_len: max,
            ..TailConfig::new("/nonexistent")
        };
        let want = reference(&bytes, max);
        let mut ways = vec![chunks(&bytes, &c), bytes.chunks(1).collect()];
        ways.push(vec![&bytes[..]]);
        for way in ways {
            let mut f = Follower::default();
            let mut got = Vec::new();
            for chunk in &way {
                f.consume(chunk, &config, &mut got);
                // The unended line is held within its bound.
                prop_assert!(f.partial.len() <= max + 3, "held {} bytes", f.partial.len());
            }
            prop_assert_eq!(&got, &want);
        }
    }
}
