//! One history entry: its kind (contract section 15), its typed detail, and its
//! compact stored form. The detail is rendered to JSON by the writer, off the paths
//! that record it: a status change carries its inputs, and the sentence that says why
//! is written only there.

use meshcat_common::model::Status;
use serde::{Serialize, Serializer};

use crate::status::Inputs;

/// What happened. The numbers are the stored form: never reuse one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Kind {
    ClusterRegistered = 1,
    ClusterUpdated = 2,
    ClusterDeleted = 3,
    ZoneRegistered = 4,
    ZoneDeleted = 5,
    InstanceJoined = 6,
    InstanceLeft = 7,
    InstanceRestarted = 8,
    StatusChanged = 9,
    ConfigChanged = 10,
    DriftStarted = 11,
    DriftEnded = 12,
    LogLevelChanged = 13,
    DebugWindow = 14,
    Diagnosed = 15,
    /// meshcat's addition to the contract's kinds: a zone's record was replaced by a
    /// different one (`PUT /zones/{zoneName}`).
    ZoneUpdated = 16,
    /// meshcat's addition: the changes of one instance within a minute past what it
    /// may record one by one, summed (see [`super::limit`]).
    InstanceFlapping = 17,
    /// A sidecar's sync with its zone's control server changed state (contract
    /// section 17).
    SyncChanged = 18,
    /// A zone's control server connection changed state.
    ControlChanged = 19,
    /// An instance's certificate was replaced by one with another serial (contract
    /// section 19).
    CertificateRotated = 20,
    /// An instance's identity state changed.
    CertificateState = 21,
    /// A graph edge's caller requires SANs its target's instances do not present.
    TlsMismatch = 22,
    /// An edge that was a mismatch matches again.
    TlsMatch = 23,
}

impl Kind {
    pub const ALL: [Kind; 23] = [
        Kind::ClusterRegistered,
        Kind::ClusterUpdated,
        Kind::ClusterDeleted,
        Kind::ZoneRegistered,
        Kind::ZoneUpdated,
        Kind::ZoneDeleted,
        Kind::InstanceJoined,
        Kind::InstanceLeft,
        Kind::InstanceRestarted,
        Kind::InstanceFlapping,
        Kind::StatusChanged,
        Kind::ConfigChanged,
        Kind::DriftStarted,
        Kind::DriftEnded,
        Kind::LogLevelChanged,
        Kind::DebugWindow,
        Kind::Diagnosed,
        Kind::SyncChanged,
        Kind::ControlChanged,
        Kind::CertificateRotated,
        Kind::CertificateState,
        Kind::TlsMismatch,
        Kind::TlsMatch,
    ];

    /// The name the API uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::ClusterRegistered => "cluster-registered",
            Kind::ClusterUpdated => "cluster-updated",
            Kind::ClusterDeleted => "cluster-deleted",
            Kind::ZoneRegistered => "zone-registered",
            Kind::ZoneUpdated => "zone-updated",
            Kind::ZoneDeleted => "zone-deleted",
            Kind::InstanceJoined => "instance-joined",
            Kind::InstanceLeft => "instance-left",
            Kind::InstanceRestarted => "instance-restarted",
            Kind::InstanceFlapping => "instance-flapping",
            Kind::StatusChanged => "status-changed",
            Kind::ConfigChanged => "config-changed",
            Kind::DriftStarted => "drift-started",
            Kind::DriftEnded => "drift-ended",
            Kind::LogLevelChanged => "log-level-changed",
            Kind::DebugWindow => "debug-window",
            Kind::Diagnosed => "diagnosed",
            Kind::SyncChanged => "sync-changed",
            Kind::ControlChanged => "control-changed",
            Kind::CertificateRotated => "certificate-rotated",
            Kind::CertificateState => "certificate-state",
            Kind::TlsMismatch => "tls-mismatch",
            Kind::TlsMatch => "tls-match",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(c: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.code() == c)
    }
}

/// Why an instance left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeftReason {
    /// Not reported within the TTL.
    Expired,
    /// Its agent said goodbye or its connection closed.
    Disconnected,
    /// Its agent reports that the sidecar does not answer.
    Unreachable,
}

/// Who changed a sidecar's log level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChangedBy {
    /// A logging route of the API.
    Api,
    /// A timed debug window (the API's, or a diagnosis's `debugSeconds`).
    DebugWindow,
}

/// Most instance names one drift group lists; `instanceCount` tells the rest.
pub const MAX_GROUP_NAMES: usize = 32;
/// Most drift groups one entry lists.
pub const MAX_GROUPS: usize = 16;

/// One configuration of a drift entry's cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupDetail {
    /// Null for instances whose agent sent no hash.
    pub config_hash: Option<String>,
    /// At most [`MAX_GROUP_NAMES`], sorted.
    pub instances: Vec<String>,
    pub instance_count: usize,
}

/// The rule that set a status, written as a sentence when the entry is stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatusReason {
    pub inputs: Inputs,
    pub error_ratio_warning: f64,
}

impl Serialize for StatusReason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::status::explain(
            self.inputs,
            self.error_ratio_warning,
        ))
    }
}

/// What an entry says beyond its kind and place, by kind.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged, rename_all_fields = "camelCase")]
pub enum Detail {
    /// `cluster-updated`, `zone-updated`: the record's fields that changed, by their
    /// API names.
    Changed { changed: Vec<String> },
    /// `instance-joined`.
    Joined { start_time: i64 },
    /// `instance-left`.
    Left { reason: LeftReason },
    /// `instance-restarted`.
    Restarted {
        start_time: i64,
        previous_start_time: i64,
    },
    /// `status-changed`.
    Status {
        from: Status,
        to: Status,
        reason: StatusReason,
    },
    /// `config-changed`: the hashes and the resource kinds whose hashes differ.
    Config {
        from: String,
        to: String,
        resources: Vec<String>,
    },
    /// `drift-started`, `drift-ended`: the groups after the change.
    Drift { groups: Vec<GroupDetail> },
    /// `log-level-changed` (levels by the seed's names).
    LogLevel {
        from: String,
        to: String,
        by: ChangedBy,
    },
    /// `debug-window`.
    DebugWindow { seconds: u32 },
    /// `instance-flapping`: from when (the start of the minute it sums), and how
    /// many changes of each kind that minute were not recorded one by one.
    Flapping {
        since_ms: i64,
        flips: std::collections::BTreeMap<&'static str, u32>,
    },
    /// `diagnosed`: the conclusion without the owner's text, and the root cause by
    /// its cluster, step and finding.
    Diagnosed {
        symptom: Option<&'static str>,
        conclusion: String,
        root_cause: Option<serde_json::Value>,
    },
    /// `sync-changed`: the states, and the new state's detail in words.
    Sync {
        from: &'static str,
        to: &'static str,
        detail: String,
    },
    /// `control-changed`: the states, and the last failure in words ("" when none).
    Control {
        from: &'static str,
        to: &'static str,
        error: String,
    },
    /// `certificate-rotated`: the new serial and expiry, the old ones, and the SDS
    /// secret when it came in one.
    Rotated {
        serial: String,
        previous_serial: String,
        expires_at_ms: i64,
        previous_expires_at_ms: i64,
        secret: Option<String>,
    },
    /// `certificate-state`: the instance's identity states, and its identity
    /// certificate now.
    CertificateState {
        from: &'static str,
        to: &'static str,
        serial: Option<String>,
        expires_at_ms: Option<i64>,
    },
    /// `tls-mismatch`, `tls-match`: the edge's target, what the caller requires and
    /// what the target's instances present.
    Tls {
        target: String,
        expected_sans: Vec<String>,
        presented_sans: Vec<String>,
    },
    /// Kinds without detail (registrations, deletions): `{}`.
    Nothing {},
}

/// Longest string an entry's detail holds, in bytes: a longer one (a conclusion, a
/// finding, a configuration hash an agent sent) is cut at a character boundary and
/// ends with `…`, so no entry's detail grows with what a sidecar or a caller says.
pub const MAX_DETAIL_STRING: usize = 512;
/// Most bytes of instance names one drift entry lists over all its groups (each
/// group's `instanceCount` still counts them all): with the hashes, a drift entry
/// stays under 6 KiB however long the names.
pub const MAX_DRIFT_NAME_BYTES: usize = 4096;

/// Cuts `s` to [`MAX_DETAIL_STRING`] bytes.
fn cap(s: &mut String) {
    if s.len() <= MAX_DETAIL_STRING {
        return;
    }
    let mut end = MAX_DETAIL_STRING - '…'.len_utf8();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push('…');
}

/// Cuts every string within `v` (its keys are the aggregator's own field names).
fn cap_value(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) => cap(s),
        serde_json::Value::Array(a) => a.iter_mut().for_each(cap_value),
        serde_json::Value::Object(o) => o.values_mut().for_each(cap_value),
        _ => {}
    }
}

impl Detail {
    /// Cuts every string of the detail to [`MAX_DETAIL_STRING`] bytes.
    pub fn cap(&mut self) {
        match self {
            Detail::Changed { changed } => changed.iter_mut().for_each(cap),
            Detail::Config {
                from,
                to,
                resources,
            } => {
                cap(from);
                cap(to);
                resources.iter_mut().for_each(cap);
            }
            Detail::Drift { groups } => {
                let mut budget = MAX_DRIFT_NAME_BYTES;
                for g in groups {
                    if let Some(h) = &mut g.config_hash {
                        cap(h);
                    }
                    g.instances.iter_mut().for_each(cap);
                    // Each name costs its quotes and comma in the JSON too.
                    let keep = g
                        .instances
                        .iter()
                        .take_while(|n| {
                            let fits = n.len() + 3 <= budget;
                            if fits {
                                budget -= n.len() + 3;
                            }
                            fits
                        })
                        .count();
                    g.instances.truncate(keep);
                }
            }
            Detail::LogLevel { from, to, .. } => {
                cap(from);
                cap(to);
            }
            Detail::Sync { detail, .. } => cap(detail),
            Detail::Rotated {
                serial,
                previous_serial,
                secret,
                ..
            } => {
                cap(serial);
                cap(previous_serial);
                if let Some(s) = secret {
                    cap(s);
                }
            }
            Detail::CertificateState { serial, .. } => {
                if let Some(s) = serial {
                    cap(s);
                }
            }
            Detail::Tls {
                target,
                expected_sans,
                presented_sans,
            } => {
                cap(target);
                expected_sans.iter_mut().for_each(cap);
                presented_sans.iter_mut().for_each(cap);
            }
            Detail::Control { error, .. } => cap(error),
            Detail::Diagnosed {
                conclusion,
                root_cause,
                ..
            } => {
                cap(conclusion);
                if let Some(v) = root_cause {
                    cap_value(v);
                }
            }
            Detail::Joined { .. }
            | Detail::Left { .. }
            | Detail::Restarted { .. }
            | Detail::Status { .. }
            | Detail::DebugWindow { .. }
            | Detail::Flapping { .. }
            | Detail::Nothing {} => {}
        }
    }
}

/// An entry as recorded, before the writer numbers and stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// When it happened, ms since the epoch.
    pub at_ms: i64,
    pub kind: Kind,
    pub zone: String,
    /// Empty for zone entries.
    pub cluster: String,
    /// Empty unless the entry is about one instance.
    pub instance: String,
    pub detail: Detail,
}

/// Milliseconds since the epoch now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Pending {
    /// An entry of now about (zone, cluster[, instance]).
    pub fn new(kind: Kind, zone: &str, cluster: &str, instance: &str, detail: Detail) -> Pending {
        Pending {
            at_ms: now_ms(),
            kind,
            zone: zone.to_owned(),
            cluster: cluster.to_owned(),
            instance: instance.to_owned(),
            detail,
        }
    }
}

/// A stored entry, borrowed from its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored<'a> {
    pub at_ms: i64,
    pub kind: Kind,
    pub zone: &'a str,
    pub cluster: &'a str,
    pub instance: &'a str,
    /// The detail's JSON.
    pub detail: &'a [u8],
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn take_varint(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(v);
        }
    }
    None
}

fn take_str<'a>(b: &mut &'a [u8]) -> Option<&'a str> {
    let len = usize::try_from(take_varint(b)?).ok()?;
    if len > b.len() {
        return None;
    }
    let (s, rest) = b.split_at(len);
    *b = rest;
    std::str::from_utf8(s).ok()
}

impl Stored<'_> {
    /// The stored form: the time and the names' lengths as varints, the kind's
    /// byte, the names, then the detail's JSON to the end. About 40 bytes of
    /// names and header, where the entry as JSON with its field names takes 110.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_varint(out, self.at_ms.max(0) as u64);
        out.push(self.kind.code());
        for s in [self.zone, self.cluster, self.instance] {
            put_varint(out, s.len() as u64);
            out.extend_from_slice(s.as_bytes());
        }
        out.extend_from_slice(self.detail);
    }

    /// Reads the stored form; `None` when it is not one.
    pub fn decode(mut b: &[u8]) -> Option<Stored<'_>> {
        let at_ms = i64::try_from(take_varint(&mut b)?).ok()?;
        let (&kind, rest) = b.split_first()?;
        b = rest;
        let kind = Kind::from_code(kind)?;
        let zone = take_str(&mut b)?;
        let cluster = take_str(&mut b)?;
        let instance = take_str(&mut b)?;
        Some(Stored {
            at_ms,
            kind,
            zone,
            cluster,
            instance,
            detail: b,
        })
    }

    /// The entry as the API shows it.
    pub fn to_entry(&self, id: u64) -> meshcat_common::model::HistoryEntry {
        meshcat_common::model::HistoryEntry {
            id,
            at_ms: self.at_ms,
            kind: self.kind.as_str().to_owned(),
            zone_name: self.zone.to_owned(),
            cluster_name: self.cluster.to_owned(),
            instance: self.instance.to_owned(),
            detail: serde_json::from_slice(self.detail)
                .unwrap_or_else(|_| serde_json::Value::Object(Default::default())),
        }
    }
}

/// The key of a name (a zone's, a cluster's, an instance's) in the posting lists:
/// FNV-1a, 32 bits. Stable across builds (it is stored); two names that collide
/// only cost a filtered read.
pub fn cluster_key(name: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_by_name_and_code() {
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.as_str()), Some(k));
            assert_eq!(Kind::from_code(k.code()), Some(k));
        }
        assert_eq!(Kind::parse("cluster"), None);
        assert_eq!(Kind::from_code(0), None);
    }

    #[test]
    fn the_stored_form_round_trips() {
        let s = Stored {
            at_ms: 1_712_345_678_901,
            kind: Kind::InstanceJoined,
            zone: "zone-a",
            cluster: "orders",
            instance: "orders-7f9c",
            detail: br#"{"startTime":1712345678000}"#,
        };
        let mut out = Vec::new();
        s.encode(&mut out);
        assert_eq!(Stored::decode(&out), Some(s));
        // 6 bytes of time, the kind, three lengths, the names and the detail.
        assert_eq!(out.len(), 6 + 1 + 3 + 6 + 6 + 11 + s.detail.len());
        assert_eq!(Stored::decode(&out[..5]), None);
        assert_eq!(Stored::decode(&[]), None);
    }

    #[test]
    fn details_render_as_the_contract_names_them() {
        let j = |d: &Detail| serde_json::to_value(d).unwrap();
        assert_eq!(
            j(&Detail::Restarted {
                start_time: 2,
                previous_start_time: 1
            }),
            serde_json::json!({"startTime": 2, "previousStartTime": 1})
        );
        assert_eq!(
            j(&Detail::Left {
                reason: LeftReason::Unreachable
            }),
            serde_json::json!({"reason": "unreachable"})
        );
        assert_eq!(
            j(&Detail::LogLevel {
                from: "info".into(),
                to: "debug".into(),
                by: ChangedBy::DebugWindow
            }),
            serde_json::json!({"from": "info", "to": "debug", "by": "debug-window"})
        );
        assert_eq!(j(&Detail::Nothing {}), serde_json::json!({}));
        let status = j(&Detail::Status {
            from: Status::Stable,
            to: Status::Warning,
            reason: StatusReason {
                inputs: Inputs {
                    live: 1,
                    min_instances: 2,
                    ..Inputs::default()
                },
                error_ratio_warning: 0.05,
            },
        });
        assert_eq!(status["from"], "stable");
        assert_eq!(status["to"], "warning");
        assert_eq!(status["reason"], "1 live instance, below minInstances 2");
    }

    /// Every string of a detail is cut to the cap, at a character boundary, and
    /// short ones are left as they are.
    #[test]
    fn detail_strings_are_capped() {
        let long = "é".repeat(MAX_DETAIL_STRING);
        let mut d = Detail::Diagnosed {
            symptom: None,
            conclusion: long.clone(),
            root_cause: Some(serde_json::json!({"finding": long, "step": "routes"})),
        };
        d.cap();
        let Detail::Diagnosed {
            conclusion,
            root_cause: Some(rc),
            ..
        } = &d
        else {
            unreachable!()
        };
        assert!(conclusion.len() <= MAX_DETAIL_STRING && conclusion.len() > 500);
        assert!(conclusion.ends_with('…'));
        assert!(rc["finding"].as_str().unwrap().len() <= MAX_DETAIL_STRING);
        assert_eq!(rc["step"], "routes");
        let mut c = Detail::Config {
            from: "a".repeat(4096),
            to: "b".into(),
            resources: vec!["routes".into()],
        };
        c.cap();
        let j = serde_json::to_value(&c).unwrap();
        assert_eq!(j["from"].as_str().unwrap().len(), MAX_DETAIL_STRING);
        assert_eq!(j["to"], "b");
        // A drift entry of 16 groups of 32 names at their longest lists 4 KiB of
        // names, and still counts them all.
        let group = |g: usize| GroupDetail {
            config_hash: Some(format!("{g:064x}")),
            instances: (0..MAX_GROUP_NAMES)
                .map(|i| format!("{g:02}{i:02}{}", "p".repeat(249)))
                .collect(),
            instance_count: 40,
        };
        let mut d = Detail::Drift {
            groups: (0..MAX_GROUPS).map(group).collect(),
        };
        d.cap();
        let json = serde_json::to_vec(&d).unwrap();
        assert!(json.len() < 6 << 10, "{} bytes", json.len());
        let Detail::Drift { groups } = &d else {
            unreachable!()
        };
        assert_eq!(groups[0].instances.len(), 16);
        assert!(groups.iter().all(|g| g.instance_count == 40));
    }

    #[test]
    fn cluster_keys_are_stable() {
        // Stored on disk: a change would orphan every index entry.
        assert_eq!(cluster_key(""), 0x811c_9dc5);
        assert_eq!(cluster_key("a"), 0xe40c_292c);
        assert_ne!(cluster_key("orders"), cluster_key("payments"));
    }
}
