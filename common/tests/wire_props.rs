//! Property tests of the wire decoder: random bytes and mutated frames (bit flips,
//! truncations, forged length prefixes, forged array and string lengths) never make it
//! panic, and decoding never holds more memory than a small multiple of the body it
//! reads. The process runs under a capped allocator: during each decode the cap is set
//! just above the bound, so an allocation beyond it aborts the test.
//!
//! One `#[test]` only, so no other test thread allocates while a cap is set.

use std::alloc::System;

use cap::Cap;
use meshcat_common::wire::{
    self, AgentMessage, DEFAULT_MAX_MESSAGE, Delta, Hello, InstanceReport, Report, ReportedCluster,
    ServerMessage,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

#[global_allocator]
static ALLOC: Cap<System> = Cap::new(System, usize::MAX);

/// Most memory a decode may hold beyond what was allocated before it: serde
/// preallocates at most 1 MiB for a sequence whatever length it claims, and a valid
/// element takes at least one byte of the body for at most a few hundred in memory.
fn bound(body: &[u8]) -> usize {
    (2 << 20) + body.len() * 256
}

/// Decodes `body` as both message kinds under the cap; answers whether each decoded.
fn decode_capped(body: &[u8]) -> (bool, bool) {
    let limit = ALLOC.allocated() + bound(body);
    ALLOC
        .set_limit(limit)
        .expect("the limit is above what is allocated");
    let agent = wire::decode::<AgentMessage>(body).is_ok();
    let server = wire::decode::<ServerMessage>(body).is_ok();
    ALLOC.set_limit(usize::MAX).expect("lifting the limit");
    (agent, server)
}

fn report(instances: usize, clusters: usize, hosts: usize) -> AgentMessage {
    let cluster =
        ReportedCluster::healthy("up", (0..hosts).map(|h| format!("10.0.0.{h}:80")).collect());
    let inst = InstanceReport {
        admin_address: "127.0.0.1:9901".into(),
        reachable: true,
        error: Some("e".into()),
        start_time_ms: 1,
        server_state: "LIVE".into(),
        envoy_version: "1.40.0".into(),
        log_level: Some("info".into()),
        requests_total: 10,
        errors_5xx_total: 1,
        clusters: vec![cluster; clusters],
        delta: (instances % 2 == 1).then(|| Delta {
            base: 1,
            removed_clusters: vec!["gone".into()],
            removed_upstreams: Vec::new(),
            listeners_unchanged: true,
        }),
        ..InstanceReport::unread("z".into(), "c".into(), "i".into())
    };
    AgentMessage::Report(Report {
        sent_at_ms: 7,
        instances: vec![inst; instances],
    })
}

fn valid_frame() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        (0usize..4, 0usize..4, 0usize..4).prop_map(|(i, c, h)| report(i, c, h)),
        ("[a-z]{0,12}", proptest::option::of("[a-z]{0,12}")).prop_map(|(id, token)| {
            AgentMessage::Hello(Hello {
                agent_id: id,
                agent_version: "0.1.0".into(),
                token,
            })
        }),
        Just(AgentMessage::Goodbye),
    ]
    .prop_map(|m| wire::encode(&m, DEFAULT_MAX_MESSAGE).expect("small messages encode"))
}

/// A way to damage a frame.
#[derive(Debug, Clone)]
enum Mutation {
    /// Flip one bit.
    Flip(usize, u8),
    /// Cut the frame short.
    Truncate(usize),
    /// Overwrite 5 bytes with a MessagePack array32/str32/bin32 header claiming a
    /// huge length.
    ForgeLength(usize, u8, u32),
    /// Overwrite one byte.
    Set(usize, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (
            any::<usize>(),
            prop::sample::select(vec![0xdd_u8, 0xdb, 0xc6, 0xdf]),
            any::<u32>()
        )
            .prop_map(|(i, h, n)| Mutation::ForgeLength(i, h, n)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
    ]
}

fn mutate(frame: &mut Vec<u8>, m: &Mutation) {
    if frame.is_empty() {
        return;
    }
    match *m {
        Mutation::Flip(i, bit) => {
            let i = i % frame.len();
            frame[i] ^= 1 << bit;
        }
        Mutation::Truncate(n) => frame.truncate(n % frame.len()),
        Mutation::ForgeLength(i, header, n) => {
            let i = i % frame.len();
            let mut bytes = vec![header];
            bytes.extend_from_slice(&n.to_be_bytes());
            for (k, b) in bytes.into_iter().enumerate() {
                if let Some(slot) = frame.get_mut(i + k) {
                    *slot = b;
                }
            }
        }
        Mutation::Set(i, b) => {
            let i = i % frame.len();
            frame[i] = b;
        }
    }
}

/// The frame reader's side: the prefix is checked before any body is allocated.
fn check_prefix(frame: &[u8], limit: usize) -> Result<(), TestCaseError> {
    if let Some(prefix) = frame.get(..4) {
        let prefix: [u8; 4] = prefix.try_into().expect("four bytes");
        if let Ok(len) = wire::frame_len(prefix, limit) {
            prop_assert!(len <= limit);
        }
    }
    Ok(())
}

#[test]
fn random_and_mutated_frames_never_panic_nor_allocate_past_the_bound() {
    let mut runner = TestRunner::new(Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    });
    // Random bytes.
    runner
        .run(&proptest::collection::vec(any::<u8>(), 0..4096), |bytes| {
            check_prefix(&bytes, DEFAULT_MAX_MESSAGE)?;
            decode_capped(&bytes);
            if bytes.len() > 4 {
                decode_capped(&bytes[4..]);
            }
            Ok(())
        })
        .unwrap();
    // Valid frames, damaged a few times each.
    runner
        .run(
            &(valid_frame(), proptest::collection::vec(mutation(), 1..4)),
            |(frame, mutations)| {
                let (agent, _) = decode_capped(&frame[4..]);
                prop_assert!(agent, "an undamaged frame decodes");
                let mut frame = frame;
                for m in &mutations {
                    mutate(&mut frame, m);
                }
                check_prefix(&frame, 1024)?;
                if frame.len() > 4 {
                    decode_capped(&frame[4..]);
                }
                Ok(())
            },
        )
        .unwrap();
}
