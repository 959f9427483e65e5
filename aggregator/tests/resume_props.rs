//! Property tests of what a client sends to resume or block: the `since` query
//! value and the `Last-Event-ID` header of `GET /events`, and the `wait` of a
//! blocking query. Whatever the input, parsing never panics, answers a value that
//! follows the documented rule, and allocates within a bound: an event id or a wait
//! allocates nothing at all, a whole `GET /events` query at most a small multiple of
//! its length. The process runs under a capped allocator: during each parse the cap
//! is set just above the bound, so an allocation beyond it aborts the test.
//!
//! One `#[test]` only, so no other test thread allocates while a cap is set.

use std::alloc::System;
use std::time::Duration;

use cap::Cap;
use meshcat_aggregator::api::blocking::{MAX_WAIT, parse_wait};
use meshcat_aggregator::api::events::{parse_event_id, parse_request};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[global_allocator]
static ALLOC: Cap<System> = Cap::new(System, usize::MAX);

/// Runs `f` with at most `bytes` more allocated than before it.
fn capped<T>(bytes: usize, f: impl FnOnce() -> T) -> T {
    ALLOC
        .set_limit(ALLOC.allocated() + bytes)
        .expect("the limit is above what is allocated");
    let out = f();
    ALLOC.set_limit(usize::MAX).expect("lifting the limit");
    out
}

/// What an event id must be: ASCII digits only, a value that fits a u64.
fn expected_id(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Event ids, near misses and noise.
fn id_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string().into_bytes()),
        "[0-9]{0,40}".prop_map(String::into_bytes),
        "[ \t]{0,3}[+-]?[0-9]{1,25}[ \t]{0,3}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..64),
    ]
}

/// Queries of `GET /events`: well-formed ones, repeated or encoded parameters, noise.
fn events_query() -> impl Strategy<Value = String> {
    let pair = prop_oneof![
        "[0-9]{0,24}".prop_map(|v| format!("since={v}")),
        "[a-z0-9._-]{0,12}".prop_map(|v| format!("zoneName={v}")),
        "[a-z0-9._-]{0,12}".prop_map(|v| format!("clusterName={v}")),
        "[%+0-9A-Fa-z=]{0,16}".prop_map(|v| format!("since={v}")),
        "\\PC{0,24}",
    ];
    proptest::collection::vec(pair, 0..8).prop_map(|p| p.join("&"))
}

fn wait_text() -> impl Strategy<Value = String> {
    prop_oneof![
        (any::<u64>(), prop_oneof!["", "ms", "s", "m", "h"]).prop_map(|(n, u)| format!("{n}{u}")),
        "[0-9]{0,30}(ms|s|m|h|d|)".prop_map(|s| s),
        "\\PC{0,32}",
    ]
}

#[test]
fn resume_and_wait_parsing_is_total_bounded_and_follows_the_rule() {
    let mut runner = TestRunner::new(Config {
        cases: 2000,
        ..Config::default()
    });

    // An event id: no allocation, the documented value.
    runner
        .run(&id_bytes(), |v| {
            let got = capped(0, || parse_event_id(&v));
            prop_assert_eq!(got, expected_id(&v));
            Ok(())
        })
        .unwrap();

    // A whole request: the query's `since` wins; the header, trimmed of blanks,
    // counts only when the query has none, and a malformed header is ignored.
    runner
        .run(
            &(events_query(), proptest::option::of(id_bytes())),
            |(query, header)| {
                let bound = 16 * 1024 + 16 * query.len();
                let got = capped(bound, || parse_request(Some(&query), header.as_deref()));
                if let Ok((_, since)) = got {
                    let from_query = form_urlencoded::parse(query.as_bytes())
                        .find(|(k, _)| k == "since")
                        .map(|(_, v)| expected_id(v.as_bytes()));
                    match from_query {
                        // Accepted: the query's value, which parsed.
                        Some(v) => {
                            prop_assert!(v.is_some());
                            prop_assert_eq!(since, v);
                        }
                        None => prop_assert_eq!(
                            since,
                            header.as_deref().and_then(|h| expected_id(h.trim_ascii()))
                        ),
                    }
                }
                Ok(())
            },
        )
        .unwrap();

    // A wait: no allocation, never past the longest wait, the documented value.
    runner
        .run(&wait_text(), |v| {
            let got = capped(0, || parse_wait(&v));
            if let Some(d) = got {
                prop_assert!(d <= MAX_WAIT);
            }
            let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
            let (n, unit) = v.split_at(split);
            let expected = n
                .parse::<u64>()
                .ok()
                .filter(|_| n.len() <= 12)
                .and_then(|n| match unit {
                    "ms" => Some(Duration::from_millis(n)),
                    "" | "s" => Some(Duration::from_secs(n)),
                    "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
                    "h" => Some(Duration::from_secs(n.checked_mul(3600)?)),
                    _ => None,
                })
                .map(|d| d.min(MAX_WAIT));
            prop_assert_eq!(got, expected);
            Ok(())
        })
        .unwrap();
}
