//! JSON rendering of read answers from pre-serialized records: each registered
//! cluster keeps its record's JSON, and a view is that object with `authorized`,
//! `instances` and `status` appended. Lists and the summary are then mostly memory
//! copies, byte for byte what serde would write for a `ClusterView`.

use std::io::Write;

use bytes::Bytes;
use meshcat_common::model::{ClusterRecord, ClusterView, Instance};

use super::Entry;

/// Serializes a record once, when it is stored.
pub fn record_json(r: &ClusterRecord) -> Bytes {
    Bytes::from(serde_json::to_vec(r).expect("records serialise"))
}

/// Appends the view of a registered entry: its record's fields, then `authorized`,
/// `instances` (live ones, by name; none when not authorized) and `status`.
pub fn write_view(out: &mut Vec<u8>, record_json: &[u8], e: &Entry, authorized: bool) {
    // The record is a JSON object: reopen it by dropping its closing brace.
    let body = record_json.strip_suffix(b"}").unwrap_or(record_json);
    out.extend_from_slice(body);
    out.extend_from_slice(if authorized {
        b",\"authorized\":true,\"instances\":["
    } else {
        b",\"authorized\":false,\"instances\":["
    });
    if authorized {
        let mut first = true;
        for (name, i) in e.instances.iter().filter(|(_, i)| i.is_live()) {
            if !first {
                out.push(b',');
            }
            first = false;
            out.extend_from_slice(b"{\"name\":");
            serde_json::to_writer(&mut *out, name).expect("strings serialise");
            let _ = write!(out, ",\"startTime\":{}}}", i.start_time_ms);
        }
    }
    out.extend_from_slice(b"],\"status\":\"");
    out.extend_from_slice(e.status.as_str().as_bytes());
    out.extend_from_slice(b"\"}");
}

/// The typed view of an entry under `record` (for `GET /services`, whose unregistered
/// entries have no stored JSON, and for the tests' serde oracle).
pub fn view(record: &ClusterRecord, e: &Entry, authorized: bool) -> ClusterView {
    let instances = if authorized {
        e.instances
            .iter()
            .filter(|(_, i)| i.is_live())
            .map(|(name, i)| Instance {
                name: name.clone(),
                start_time: i.start_time_ms,
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
