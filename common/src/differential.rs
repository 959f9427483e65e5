//! Differential testing of the readers of untrusted input that meshcat writes by hand
//! (contract section 10, round 4): what the tests of each reader share. A reader is
//! run on generated input beside a reference (serde, or the format's own library, or
//! a plain reading of its specification written in the test) and must give the same
//! answer on valid input, an error and never a panic on invalid input, the same
//! answer however a stream is cut into chunks, and stay within its memory bound.
//!
//! Built only with the `differential` feature, which the crates owning such readers
//! enable for their tests alone: no program carries it. How to add a reader, the
//! seeded run and the long run: docs/reliability.md, "Parsers".

use std::fmt::Debug;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, RngSeed};

/// The seed of every run unless `PROPTEST_RNG_SEED` gives another: a failure seen once
/// is seen again by the same command.
pub const SEED: u64 = 0x006d_6573_6863_6174;

/// The configuration of a differential test: `cases` cases (`PROPTEST_CASES` when set:
/// the long run), the seed [`SEED`] (`PROPTEST_RNG_SEED` when set), failures kept
/// under the crate's `proptest-regressions/` and replayed first.
pub fn config(cases: u32) -> Config {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    Config {
        cases: env("PROPTEST_CASES").map_or(cases, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        rng_seed: RngSeed::Fixed(env("PROPTEST_RNG_SEED").unwrap_or(SEED)),
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        // A failing case of a reader is small once shrunk; a long shrink only delays
        // the report.
        max_shrink_iters: 4_096,
        ..Config::default()
    }
}

/// Where a stream of `len` bytes is cut into chunks: sorted positions, each in
/// `1..len`; none cuts nothing.
pub fn cuts(len: usize) -> impl Strategy<Value = Vec<usize>> {
    let most = len.saturating_sub(1).min(32);
    proptest::collection::vec(1..len.max(2), 0..=most).prop_map(|mut c| {
        c.sort_unstable();
        c.dedup();
        c
    })
}

/// `bytes` cut at `cuts` (positions past its end are ignored).
pub fn chunks<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut at = 0;
    for &c in cuts.iter().filter(|&&c| c > 0 && c < bytes.len()) {
        if c > at {
            out.push(&bytes[at..c]);
            at = c;
        }
    }
    out.push(&bytes[at..]);
    out
}

/// Runs a streaming reader on `input` fed whole, cut at `cuts`, in two pieces at
/// every position (for an input of at most `every_cut_up_to` bytes) and in one-byte
/// pieces (up to four times that), and checks each answer against `reference`: the same value, or an error
/// for both. `read` feeds the chunks it is given to a fresh reader and answers what
/// it read; a reader's error is any `Err`.
pub fn check_stream<T, E1, E2>(
    input: &[u8],
    cuts: &[usize],
    every_cut_up_to: usize,
    read: impl Fn(&[&[u8]]) -> Result<T, E1>,
    reference: &Result<T, E2>,
) -> Result<(), TestCaseError>
where
    T: PartialEq + Debug,
    E1: Debug,
    E2: Debug,
{
    let mut ways: Vec<Vec<&[u8]>> = vec![vec![input], chunks(input, cuts)];
    if input.len() <= every_cut_up_to {
        ways.extend((1..input.len()).map(|c| vec![&input[..c], &input[c..]]));
    }
    if input.len() <= 4 * every_cut_up_to {
        ways.push(input.chunks(1).collect());
    }
    for way in ways {
        let got = read(&way);
        same(&got, reference).map_err(|e| {
            let sizes: Vec<usize> = way.iter().map(|c| c.len()).collect();
            TestCaseError::fail(format!("fed in chunks of {sizes:?}: {e}"))
        })?;
    }
    Ok(())
}

/// Checks a reader's answer against the reference's: equal values, or an error for
/// both.
pub fn same<T, E1, E2>(got: &Result<T, E1>, reference: &Result<T, E2>) -> Result<(), TestCaseError>
where
    T: PartialEq + Debug,
    E1: Debug,
    E2: Debug,
{
    match (got, reference) {
        (Ok(a), Ok(b)) if a == b => Ok(()),
        (Err(_), Err(_)) => Ok(()),
        (a, b) => Err(TestCaseError::fail(format!(
            "the reader answered {a:?}, the reference {b:?}"
        ))),
    }
}

/// JSON built as a tree that keeps what a document's text decides and a parsed value
/// forgets: the order of an object's fields, the spelling of a number, and (through
/// [`Style`]) white space and escapes.
pub mod json {
    use super::*;

    /// A JSON value as it is written.
    #[derive(Debug, Clone, PartialEq)]
    pub enum Json {
        Null,
        Bool(bool),
        /// The number's text, valid JSON.
        Number(String),
        String(String),
        Array(Vec<Json>),
        /// Fields in the order they are written.
        Object(Vec<(String, Json)>),
        /// Text written as it is, valid JSON or not: how a test puts a fault at a
        /// place it chose.
        Raw(String),
    }

    impl Json {
        /// A string value.
        pub fn str(s: impl Into<String>) -> Json {
            Json::String(s.into())
        }

        /// A whole number.
        pub fn int(n: impl std::fmt::Display) -> Json {
            Json::Number(n.to_string())
        }

        /// An object of `fields` in that order.
        pub fn object<K: Into<String>>(fields: impl IntoIterator<Item = (K, Json)>) -> Json {
            Json::Object(fields.into_iter().map(|(k, v)| (k.into(), v)).collect())
        }
    }

    /// Numbers in every form JSON has: zero and minus zero, whole numbers small and
    /// past 64 bits, negative, with a fraction, with an exponent of either case and
    /// sign, and values at the edges of a 64-bit float.
    pub fn number() -> impl Strategy<Value = String> {
        let digits = "[1-9][0-9]{0,24}";
        prop_oneof![
            Just("0".to_owned()),
            Just("-0".to_owned()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            digits.prop_map(|d| d),
            (any::<bool>(), "(0|[1-9][0-9]{0,8})", "[0-9]{1,12}")
                .prop_map(|(neg, i, f)| { format!("{}{i}.{f}", if neg { "-" } else { "" }) }),
            (
                any::<bool>(),
                "(0|[1-9][0-9]{0,5})",
                proptest::option::of("[0-9]{1,6}"),
                prop_oneof![Just("e"), Just("E")],
                prop_oneof![Just(""), Just("+"), Just("-")],
                0u32..300,
            )
                .prop_map(|(neg, i, f, e, sign, exp)| {
                    let frac = f.map(|f| format!(".{f}")).unwrap_or_default();
                    format!("{}{i}{frac}{e}{sign}{exp}", if neg { "-" } else { "" })
                }),
            prop_oneof![
                Just("1.7976931348623157e308".to_owned()),
                Just("-1.7976931348623157e308".to_owned()),
                Just("5e-324".to_owned()),
                Just("18446744073709551615".to_owned()),
                Just("18446744073709551616".to_owned()),
                Just("-9223372036854775808".to_owned()),
                Just("-9223372036854775809".to_owned()),
            ],
        ]
    }

    /// Text that tests escapes and encodings: quotes, backslashes, slashes, control
    /// characters, DEL, characters of two, three and four bytes (the last written as
    /// a surrogate pair when escaped), and the line separators JavaScript does not
    /// take raw.
    pub fn text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            4 => "[a-zA-Z0-9_.:/-]{1,8}",
            1 => Just("\"".to_owned()),
            1 => Just("\\".to_owned()),
            1 => Just("/".to_owned()),
            1 => (0u32..0x20).prop_map(|c| char::from_u32(c).unwrap().to_string()),
            1 => Just("\u{7f}".to_owned()),
            1 => Just("é".to_owned()),
            1 => Just("\u{2028}\u{2029}".to_owned()),
            1 => Just("€".to_owned()),
            1 => Just("𝄞😀".to_owned()),
            1 => any::<char>().prop_map(|c| c.to_string()),
        ];
        proptest::collection::vec(piece, 0..6).prop_map(|p| p.concat())
    }

    /// Any value, nested at most `depth` deep, at most `width` wide.
    pub fn any_value(depth: u32, width: usize) -> impl Strategy<Value = Json> {
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::Bool),
            number().prop_map(Json::Number),
            text().prop_map(Json::String),
        ];
        leaf.prop_recursive(depth, (width * 4) as u32, width as u32, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..width).prop_map(Json::Array),
                proptest::collection::vec((text(), inner), 0..width)
                    .prop_map(|fields| { Json::Object(unique_keys(fields)) }),
            ]
        })
    }

    /// A value nested `depth` deep in arrays and objects in turn: what a reader
    /// passes over must not cost it its stack.
    pub fn deep(depth: usize) -> Json {
        let mut v = Json::Null;
        for i in 0..depth {
            v = if i % 2 == 0 {
                Json::Array(vec![v])
            } else {
                Json::object([("d", v)])
            };
        }
        v
    }

    /// Fields whose keys repeat keep their first occurrence: a repeated key is a
    /// document whose meaning the readers need not agree on.
    fn unique_keys(fields: Vec<(String, Json)>) -> Vec<(String, Json)> {
        let mut seen = std::collections::HashSet::new();
        fields
            .into_iter()
            .filter(|(k, _)| seen.insert(k.clone()))
            .collect()
    }

    /// An object of the `known` fields (`None` leaves a field out) with unknown
    /// fields (any value, some nested deep) among them, the order shuffled.
    pub fn object_with(known: Vec<(&'static str, Option<Json>)>) -> impl Strategy<Value = Json> {
        let known: Vec<(String, Json)> = known
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v)))
            .collect();
        let taken: Vec<String> = known.iter().map(|(k, _)| k.clone()).collect();
        proptest::collection::vec(
            (
                "[a-z_]{1,12}",
                prop_oneof![12 => any_value(2, 3), 1 => (20usize..100).prop_map(deep)],
            ),
            0..2,
        )
        .prop_map(move |unknown| {
            let mut fields = known.clone();
            fields.extend(unknown.into_iter().filter(|(k, _)| !taken.contains(k)));
            unique_keys(fields)
        })
        .prop_shuffle()
        .prop_map(Json::Object)
    }

    /// How a document is written.
    #[derive(Debug, Clone, Copy)]
    pub struct Style {
        /// Seeds the choice at each place where JSON allows a choice.
        pub seed: u64,
        /// Per 256, how often white space goes between tokens.
        pub space: u8,
        /// Per 256, how often a character that may be written raw is escaped.
        pub escape: u8,
    }

    /// Styles from compact to loose, from raw text to every character escaped.
    pub fn style() -> impl Strategy<Value = Style> {
        (
            any::<u64>(),
            prop_oneof![Just(0u8), Just(64), Just(255), any::<u8>()],
            prop_oneof![Just(0u8), Just(255), any::<u8>()],
        )
            .prop_map(|(seed, space, escape)| Style {
                seed,
                space,
                escape,
            })
    }

    /// A small deterministic generator (splitmix64) for the choices of a style.
    struct Choices(u64);

    impl Choices {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn per256(&mut self, p: u8) -> bool {
            (self.next() & 0xff) < u64::from(p)
        }
    }

    /// `v` written in `style`.
    pub fn render(v: &Json, style: &Style) -> String {
        let mut out = String::new();
        let mut c = Choices(style.seed);
        space(&mut out, &mut c, style);
        write(v, &mut out, &mut c, style);
        space(&mut out, &mut c, style);
        out
    }

    fn space(out: &mut String, c: &mut Choices, style: &Style) {
        while c.per256(style.space) {
            out.push(match c.next() % 5 {
                0 | 1 => ' ',
                2 => '\n',
                3 => '\t',
                _ => '\r',
            });
            if c.next() % 2 == 0 {
                break;
            }
        }
    }

    fn write(v: &Json, out: &mut String, c: &mut Choices, style: &Style) {
        match v {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) | Json::Raw(n) => out.push_str(n),
            Json::String(s) => string(s, out, c, style),
            Json::Array(items) => {
                out.push('[');
                space(out, c, style);
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                        space(out, c, style);
                    }
                    write(item, out, c, style);
                    space(out, c, style);
                }
                out.push(']');
            }
            Json::Object(fields) => {
                out.push('{');
                space(out, c, style);
                for (i, (k, item)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                        space(out, c, style);
                    }
                    string(k, out, c, style);
                    space(out, c, style);
                    out.push(':');
                    space(out, c, style);
                    write(item, out, c, style);
                    space(out, c, style);
                }
                out.push('}');
            }
        }
    }

    /// A JSON string: what must be escaped is, the rest is escaped as the style
    /// says, in any of the forms JSON allows (`\n` or `\u000a`, upper or lower hex,
    /// a surrogate pair beyond the basic plane).
    fn string(s: &str, out: &mut String, c: &mut Choices, style: &Style) {
        out.push('"');
        for ch in s.chars() {
            let must = ch == '"' || ch == '\\' || (ch as u32) < 0x20;
            if !must && !c.per256(style.escape) {
                out.push(ch);
                continue;
            }
            let short = match ch {
                '"' => Some("\\\""),
                '\\' => Some("\\\\"),
                '/' => Some("\\/"),
                '\u{8}' => Some("\\b"),
                '\u{c}' => Some("\\f"),
                '\n' => Some("\\n"),
                '\r' => Some("\\r"),
                '\t' => Some("\\t"),
                _ => None,
            };
            match short {
                Some(e) if c.next() % 2 == 0 => out.push_str(e),
                _ => {
                    let upper = c.next() % 2 == 0;
                    let mut units = [0u16; 2];
                    for u in ch.encode_utf16(&mut units) {
                        if upper {
                            out.push_str(&format!("\\u{:04X}", u));
                        } else {
                            out.push_str(&format!("\\u{:04x}", u));
                        }
                    }
                }
            }
        }
        out.push('"');
    }
}

/// Invalid input made from valid input.
pub mod corrupt {
    use super::*;

    /// Texts no JSON parser may take where a value or a string's content goes:
    /// invalid escapes (unknown, short, a lone surrogate half), raw control
    /// characters, invalid UTF-8, numbers JSON does not have, misspelt literals,
    /// stray punctuation.
    pub const BAD_TOKENS: &[&[u8]] = &[
        b"\\x",
        b"\\u12",
        b"\\uZZZZ",
        b"\"\\ud800\"",
        b"\"\\udc00\\ud800\"",
        b"\"\x01\"",
        b"\"\xff\"",
        b"\"\xc0\xaf\"",
        b"\"\xed\xa0\x80\"",
        b"01",
        b"-",
        b"1.",
        b".5",
        b"1e",
        b"+1",
        b"0x10",
        b"NaN",
        b"Infinity",
        b"tru",
        b"nul",
        b"True",
        b",",
        b":",
        b"}",
        b"]",
        b"{",
        b"[",
        b"\"",
        b"'a'",
        b"/* c */",
    ];

    /// Tokens that are not JSON where a value goes, yet keep a document's brackets
    /// and quotes balanced: a fault a reader that passes over a value by counting
    /// its brackets and quotes does not see, and one that reads the value must.
    pub fn bad_value() -> impl Strategy<Value = String> {
        proptest::sample::select(
            &[
                "01",
                "-",
                "1.",
                ".5",
                "1e",
                "+1",
                "0x10",
                "NaN",
                "Infinity",
                "tru",
                "nul",
                "True",
                "'a'",
                "\"\\x\"",
                "\"\\u12\"",
                "\"\\ud800\"",
                "\"\\udc00\"",
                "\"a\u{1}b\"",
                "\"tab\there\"",
                "1 2",
                "\"a\" \"b\"",
            ][..],
        )
        .prop_map(str::to_owned)
    }

    /// One change that most often breaks `valid`: cut short, a byte replaced, a byte
    /// taken out, or a bad token put in, at any place.
    pub fn mutate(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
        let len = valid.len();
        let at = 0..=len;
        (
            0u8..4,
            at,
            any::<u8>(),
            proptest::sample::select(BAD_TOKENS),
        )
            .prop_map(move |(how, at, byte, token)| {
                let mut v = valid.clone();
                match how {
                    0 => v.truncate(at),
                    1 if at < len => v[at] = byte,
                    2 if at < len => {
                        v.remove(at);
                    }
                    _ => {
                        v.splice(at..at, token.iter().copied());
                    }
                }
                v
            })
    }

    /// Whether serde_json refuses `bytes` as JSON. Read into a value, which decodes
    /// every string: passed over (`IgnoredAny`), a lone surrogate half goes unseen.
    pub fn is_invalid_json(bytes: &[u8]) -> bool {
        serde_json::from_slice::<serde_json::Value>(bytes).is_err()
    }
}

#[cfg(test)]
mod tests {
    use super::json::*;
    use super::*;

    proptest! {
        #![proptest_config(config(512))]

        /// The generator writes valid JSON in every style, which parses to the same
        /// value as its compact, unescaped form: the references read what the
        /// generator meant.
        #[test]
        fn every_style_writes_the_same_valid_json(v in any_value(4, 5), style in style()) {
            let text = render(&v, &style);
            let plain = render(&v, &Style { seed: 0, space: 0, escape: 0 });
            let a: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
            let b: serde_json::Value = serde_json::from_str(&plain).unwrap();
            prop_assert_eq!(a, b);
        }

        #[test]
        fn chunks_put_back_together_are_the_input(
            input in proptest::collection::vec(any::<u8>(), 0..64),
            c in cuts(64),
        ) {
            prop_assert_eq!(chunks(&input, &c).concat(), input);
        }
    }

    #[test]
    fn deep_values_are_valid() {
        let text = render(
            &deep(100),
            &Style {
                seed: 1,
                space: 64,
                escape: 0,
            },
        );
        assert!(serde_json::from_str::<serde_json::Value>(&text).is_ok());
    }
}
