//! JSON rendering of read answers from pre-serialized records: each registered
//! cluster keeps its record's JSON, and a view is that object with `authorized`,
//! `instances`, `status` and `controlPlane` appended. Lists and the summary are then mostly memory
//! copies, byte for byte what serde would write for a `ClusterView`.

use std::io::Write;

use bytes::Bytes;
use meshcat_common::identity::ClusterIdentity;
use meshcat_common::model::{ClusterRecord, ClusterView, Instance, InstanceSource};

use super::declared::control_plane;
use super::identity::{IdentityAt, cluster_identity, instance_identity};
use super::{Entry, LiveInstance};

/// One instance a view lists: its name, start time, source, and the reported
/// instance (none for a control server's endpoint).
type Listed<'a> = (&'a str, i64, InstanceSource, Option<&'a LiveInstance>);

/// The live instances a view lists, by name: the reported ones, or, when no agent
/// reports any, the control server's live endpoints (contract section 17).
fn instances(e: &Entry) -> Vec<Listed<'_>> {
    if e.reported > 0 || e.declared.is_none() {
        return e
            .instances
            .iter()
            .filter(|(_, i)| i.is_live())
            .map(|(name, i)| {
                (
                    name.as_str(),
                    i.start_time_ms,
                    InstanceSource::Agent,
                    Some(i),
                )
            })
            .collect();
    }
    e.declared.as_ref().map_or_else(Vec::new, |d| {
        d.instances()
            .into_iter()
            .map(|(address, first_seen)| (address, first_seen, InstanceSource::ControlServer, None))
            .collect()
    })
}

/// Serializes a record once, when it is stored.
pub fn record_json(r: &ClusterRecord) -> Bytes {
    Bytes::from(serde_json::to_vec(r).expect("records serialise"))
}

/// Appends the view of a registered entry: its record's fields, then `authorized`,
/// `instances` (live ones, by name, each with its identity; none when not
/// authorized), `status`, `controlPlane` and `identity` (null when not authorized),
/// identity states as they are `at`.
pub fn write_view(
    out: &mut Vec<u8>,
    record_json: &[u8],
    e: &Entry,
    authorized: bool,
    at: &IdentityAt,
) {
    // The record is a JSON object: reopen it by dropping its closing brace.
    let body = record_json.strip_suffix(b"}").unwrap_or(record_json);
    out.extend_from_slice(body);
    out.extend_from_slice(if authorized {
        b",\"authorized\":true,\"instances\":["
    } else {
        b",\"authorized\":false,\"instances\":["
    });
    if authorized {
        for (n, (name, start, source, live)) in instances(e).into_iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"name\":");
            serde_json::to_writer(&mut *out, name).expect("strings serialise");
            out.extend_from_slice(b",\"startTime\":");
            number(out, start);
            out.extend_from_slice(b",\"source\":\"");
            out.extend_from_slice(source.as_str().as_bytes());
            out.extend_from_slice(b"\",\"identity\":");
            match live {
                Some(i) => {
                    serde_json::to_writer(&mut *out, &instance_identity(i, &at.rules, at.now_ms))
                        .expect("identities serialise");
                }
                None => out.extend_from_slice(b"null"),
            }
            out.push(b'}');
        }
    }
    out.extend_from_slice(b"],\"status\":\"");
    out.extend_from_slice(e.status.as_str().as_bytes());
    let cp = control_plane(e);
    out.extend_from_slice(if cp.declared {
        b"\",\"controlPlane\":{\"declared\":true,\"endpoints\":"
    } else {
        b"\",\"controlPlane\":{\"declared\":false,\"endpoints\":"
    });
    number(out, cp.endpoints);
    out.extend_from_slice(b",\"healthyEndpoints\":");
    number(out, cp.healthy_endpoints);
    out.extend_from_slice(b"},\"identity\":");
    if authorized {
        write_cluster_identity(out, &cluster_identity(e, &at.rules, at.now_ms));
    } else {
        out.extend_from_slice(b"null");
    }
    out.push(b'}');
}

/// Appends a cluster's identity as serde writes a [`ClusterIdentity`], written out
/// like the rest of the view: serde's map machinery cost a read of a cluster more
/// than the rest of its live fields.
fn write_cluster_identity(out: &mut Vec<u8>, id: &ClusterIdentity) {
    out.extend_from_slice(b"{\"spiffeIds\":[");
    for (n, spiffe_id) in id.spiffe_ids.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, spiffe_id).expect("strings serialise");
    }
    out.extend_from_slice(b"],\"state\":\"");
    out.extend_from_slice(id.state.as_str().as_bytes());
    out.extend_from_slice(b"\",\"expiresAtMs\":");
    match id.expires_at_ms {
        Some(ms) => number(out, ms),
        None => out.extend_from_slice(b"null"),
    }
    out.push(b'}');
}

/// Appends a number as serde writes it (this runs for every view of every read,
/// where `write!` and its formatting machinery cost more than the rest of the view).
fn number(out: &mut Vec<u8>, n: impl serde::Serialize) {
    serde_json::to_writer(out, &n).expect("numbers serialise");
}

/// The typed view of an entry under `record` (for `GET /services`, whose unregistered
/// entries have no stored JSON, and for the tests' serde oracle).
pub fn view(record: &ClusterRecord, e: &Entry, authorized: bool, at: &IdentityAt) -> ClusterView {
    let instances = if authorized {
        instances(e)
            .into_iter()
            .map(|(name, start_time, source, live)| Instance {
                name: name.to_owned(),
                start_time,
                source,
                identity: live.map(|i| {
                    serde_json::from_value(
                        serde_json::to_value(instance_identity(i, &at.rules, at.now_ms))
                            .expect("identities serialise"),
                    )
                    .expect("an identity reads back")
                }),
            })
            .collect()
    } else {
        Vec::new()
    };
    ClusterView {
        record: record.clone(),
        authorized,
        instances,
        status: e.status,
        control_plane: control_plane(e),
        identity: authorized.then(|| cluster_identity(e, &at.rules, at.now_ms)),
    }
}

/// Joins rendered items into a JSON array.
pub fn array<'a>(items: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    out.push(b'[');
    for (n, item) in items.into_iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item);
    }
    out.push(b']');
    out
}

/// Compresses a body for clients that accept gzip; the fastest level, since large
/// answers are compressed once per change and sent many times.
pub fn gzip(body: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 8),
        flate2::Compression::fast(),
    );
    enc.write_all(body).expect("writing to memory cannot fail");
    enc.finish().expect("writing to memory cannot fail")
}
