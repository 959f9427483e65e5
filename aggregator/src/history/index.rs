//! The history's indexes: one table of posting lists (`postings`). For every name
//! and kind an entry carries, a *term*, the ids of the entries that carry it. An
//! entry adds its id to six terms at most: its kind, its zone, its cluster, its
//! instance, and its zone and its cluster with its kind.
//!
//! The lists are cut by *segment*, the ids sharing their upper bits
//! ([`SEGMENT_BITS`]), and the segment leads the key: (segment, term, offset of
//! the block's first id in the segment). Every append writes into the newest
//! segment, at the end of the table, so that a commit rewrites a few pages there
//! however many terms its entries name, and retention drops whole segments, at the
//! front. A term's ids within a segment are kept one of two ways:
//!
//! - most terms in blocks: the value holds the ids after the block's first as
//!   varint differences, at most [`BLOCK_BYTES`] of them: about a byte an entry for
//!   a dense list;
//! - instances, which have an entry or two in a segment each, in one value per
//!   segment for each of [`INSTANCE_BUCKETS`] buckets of their keys: (key, offset)
//!   pairs sorted by key, six bytes an entry, where a block of its own would cost
//!   an instance a key and its bookkeeping, three times as much.
//!
//! A query ([`sources`]) takes one list (or the union of a few, one per kind asked
//! for) per filter given: the instance's; the cluster's, by kind when kinds are
//! asked for; the zone's likewise; the kinds' when neither a cluster nor a zone
//! carries them. [`Intersect`] walks them newest first together, each seek a
//! bisection within a block or one lookup of an earlier block, so that a filter
//! that matches few entries reads few blocks however many entries its lists hold
//! apart: a list absent from a segment costs one lookup there. Names are kept by a
//! 32-bit key ([`cluster_key`]): two names that share one only cost entries read
//! and refused by the query's own check.

use redb::{ReadableTable, TableDefinition};

use super::entry::{Kind, Stored, cluster_key};
use super::log::{HistoryError, Query};

/// (segment, term, offset of the block's first id in the segment) -> the block.
pub(super) const POSTINGS: TableDefinition<'_, (u32, u64, u16), &[u8]> =
    TableDefinition::new("postings");

/// A segment holds the ids that share all but their lowest this many bits (fewer
/// in unit tests, so that small logs span many segments).
pub(super) const SEGMENT_BITS: u32 = if cfg!(test) { 9 } else { 16 };
const SEGMENT_IDS: u64 = 1 << SEGMENT_BITS;

/// A block takes ids while its differences take less than this: an append rewrites
/// one such block per term.
const BLOCK_BYTES: usize = 256;

/// The buckets instances are kept in per segment, by the top bits of their key.
pub(super) const INSTANCE_BUCKETS: u32 = 256;
/// Bytes of one (key, offset) pair of an instance bucket.
const PAIR: usize = 6;

pub(super) fn segment_of(id: u64) -> u32 {
    u32::try_from(id >> SEGMENT_BITS).unwrap_or(u32::MAX)
}

fn offset_of(id: u64) -> u16 {
    (id & (SEGMENT_IDS - 1)) as u16
}

fn id_at(segment: u32, offset: u16) -> u64 {
    u64::from(segment) << SEGMENT_BITS | u64::from(offset)
}

/// What a term indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Dim {
    Kind = 1,
    Zone = 2,
    Cluster = 3,
    Instance = 4,
    ZoneKind = 5,
    ClusterKind = 6,
}

/// A name or kind, or a name with a kind, as the index keys it: the dimension in
/// the top byte, the kind's code in bits 32 to 39, the name's key in the low 32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Term(u64);

impl Term {
    fn new(dim: Dim, kind: Option<Kind>, name: &str) -> Term {
        let kind = u64::from(kind.map_or(0, Kind::code));
        Term((dim as u64) << 56 | kind << 32 | u64::from(cluster_key(name)))
    }

    fn kind(k: Kind) -> Term {
        Term::new(Dim::Kind, Some(k), "")
    }

    fn is_instance(self) -> bool {
        self.0 >> 56 == Dim::Instance as u64
    }

    /// The name's key.
    fn key(self) -> u32 {
        self.0 as u32
    }

    /// The term the table keeps it under: an instance's bucket, else itself.
    fn stored(self) -> u64 {
        if self.is_instance() {
            (Dim::Instance as u64) << 56 | u64::from(self.key() >> (32 - INSTANCE_BUCKETS.ilog2()))
        } else {
            self.0
        }
    }
}

/// The terms of an entry: its kind, and each of its names that is not empty alone
/// and (zone, cluster) with its kind.
pub(super) fn terms(kind: Kind, zone: &str, cluster: &str, instance: &str) -> Vec<Term> {
    let mut out = Vec::with_capacity(6);
    out.push(Term::kind(kind));
    if !zone.is_empty() {
        out.push(Term::new(Dim::Zone, None, zone));
        out.push(Term::new(Dim::ZoneKind, Some(kind), zone));
    }
    if !cluster.is_empty() {
        out.push(Term::new(Dim::Cluster, None, cluster));
        out.push(Term::new(Dim::ClusterKind, Some(kind), cluster));
    }
    if !instance.is_empty() {
        out.push(Term::new(Dim::Instance, None, instance));
    }
    out
}

/// The terms of a stored entry.
pub(super) fn terms_of(s: &Stored<'_>) -> Vec<Term> {
    terms(s.kind, s.zone, s.cluster, s.instance)
}

/// The lists a query walks: each inner list a union (any of its terms), all of
/// them intersected. `None` when no filter is indexed: the query reads the entries
/// from the newest back. Entries are in no list of an empty name, so an empty
/// name (which the API refuses) is checked on the entries alone.
pub(super) fn sources(q: &Query) -> Option<Vec<Vec<Term>>> {
    let mut kinds = q.kinds.clone();
    kinds.sort_unstable();
    kinds.dedup();
    // A name's own list, or its lists by the kinds asked for.
    let by_kind = |alone: Dim, with_kind: Dim, name: &str| -> Vec<Term> {
        if kinds.is_empty() {
            vec![Term::new(alone, None, name)]
        } else {
            kinds
                .iter()
                .map(|k| Term::new(with_kind, Some(*k), name))
                .collect()
        }
    };
    let mut out = Vec::new();
    if let Some(i) = q.instance.as_deref().filter(|i| !i.is_empty()) {
        out.push(vec![Term::new(Dim::Instance, None, i)]);
    }
    let cluster = q.cluster.as_deref().filter(|c| !c.is_empty());
    if let Some(c) = cluster {
        out.push(by_kind(Dim::Cluster, Dim::ClusterKind, c));
    }
    let zone = q.zone.as_deref().filter(|z| !z.is_empty());
    if let Some(z) = zone {
        out.push(by_kind(Dim::Zone, Dim::ZoneKind, z));
    }
    if cluster.is_none() && zone.is_none() && !kinds.is_empty() {
        out.push(kinds.iter().map(|k| Term::kind(*k)).collect());
    }
    (!out.is_empty()).then_some(out)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The ids after the first of a block, in order; stops at a malformed difference.
fn ids_after(first: u64, mut b: &[u8]) -> impl Iterator<Item = u64> + '_ {
    let mut id = first;
    std::iter::from_fn(move || {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first()?;
            b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                id = id.checked_add(v)?;
                return Some(id);
            }
        }
        None
    })
}

/// The pairs of an instance bucket: (key, offset), sorted.
fn pairs(b: &[u8]) -> impl Iterator<Item = (u32, u16)> + '_ {
    b.chunks_exact(PAIR).map(|p| {
        (
            u32::from_le_bytes([p[0], p[1], p[2], p[3]]),
            u16::from_le_bytes([p[4], p[5]]),
        )
    })
}

type WriteTable<'t> = redb::Table<'t, (u32, u64, u16), &'static [u8]>;

/// Adds `postings` (term, id) to their lists; every id is above each of its
/// lists' ids.
pub(super) fn add(
    table: &mut WriteTable<'_>,
    mut postings: Vec<(Term, u64)>,
) -> Result<(), HistoryError> {
    // Instances by their bucket, the others by term; in key order.
    postings.sort_unstable_by_key(|&(t, id)| (segment_of(id), t.stored(), t.0, id));
    let mut buf: Vec<u8> = Vec::with_capacity(BLOCK_BYTES + 10);
    for list in
        postings.chunk_by(|a, b| (segment_of(a.1), a.0.stored()) == (segment_of(b.1), b.0.stored()))
    {
        let (term, id) = list[0];
        let segment = segment_of(id);
        if term.is_instance() {
            add_pairs(table, segment, term.stored(), list)?;
            continue;
        }
        let term = term.0;
        // The list's last block in the segment, when it has room.
        let tail = table
            .range((segment, term, 0)..=(segment, term, u16::MAX))?
            .next_back()
            .transpose()?
            .map(|(k, v)| (k.value().2, v.value().to_vec()));
        let mut block: Option<(u16, u64)> = None;
        buf.clear();
        if let Some((first, diffs)) = tail
            && diffs.len() < BLOCK_BYTES
        {
            let first_id = id_at(segment, first);
            block = Some((
                first,
                ids_after(first_id, &diffs).last().unwrap_or(first_id),
            ));
            buf = diffs;
        }
        for &(_, id) in list {
            match &mut block {
                Some((_, last)) if buf.len() < BLOCK_BYTES => {
                    put_varint(&mut buf, id - *last);
                    *last = id;
                }
                _ => {
                    if let Some((first, _)) = block {
                        table.insert((segment, term, first), buf.as_slice())?;
                    }
                    block = Some((offset_of(id), id));
                    buf.clear();
                }
            }
        }
        if let Some((first, _)) = block {
            table.insert((segment, term, first), buf.as_slice())?;
        }
    }
    Ok(())
}

/// Adds the postings `list` of instances to their bucket `stored` in `segment`.
fn add_pairs(
    table: &mut WriteTable<'_>,
    segment: u32,
    stored: u64,
    list: &[(Term, u64)],
) -> Result<(), HistoryError> {
    let key = (segment, stored, 0);
    let mut all: Vec<(u32, u16)> = match table.get(key)? {
        Some(v) => pairs(v.value()).collect(),
        None => Vec::new(),
    };
    all.extend(list.iter().map(|(t, id)| (t.key(), offset_of(*id))));
    all.sort_unstable();
    let mut value = Vec::with_capacity(all.len() * PAIR);
    for (k, off) in all {
        value.extend_from_slice(&k.to_le_bytes());
        value.extend_from_slice(&off.to_le_bytes());
    }
    table.insert(key, value.as_slice())?;
    Ok(())
}

/// Removes the segments whose ids are all below `end` (retention removed every
/// entry before it).
pub(super) fn remove_below(table: &mut WriteTable<'_>, end: u64) -> Result<(), HistoryError> {
    let segment = segment_of(end);
    if segment > 0 {
        table.retain_in((0, 0, 0)..(segment, 0, 0), |_, _| false)?;
    }
    Ok(())
}

type Table = redb::ReadOnlyTable<(u32, u64, u16), &'static [u8]>;

/// One posting list within `lo..=hi`, read newest first by seeks to lower and
/// lower ids.
struct List<'t> {
    table: &'t Table,
    term: Term,
    lo: u64,
    /// The ids of the current block (of an instance: its ids in a segment), in
    /// order; those from `pos` on are above every id sought so far.
    ids: Vec<u64>,
    pos: usize,
    done: bool,
}

impl<'t> List<'t> {
    fn new(table: &'t Table, term: Term, lo: u64) -> List<'t> {
        List {
            table,
            term,
            lo,
            ids: Vec::new(),
            pos: 0,
            done: false,
        }
    }

    /// The largest id of the list at most `x` and at least `lo`. `x` never grows
    /// from one call to the next.
    fn seek(&mut self, mut x: u64) -> Result<Option<u64>, HistoryError> {
        loop {
            if self.done || x < self.lo {
                self.done = true;
                return Ok(None);
            }
            if self.ids.first().is_some_and(|&first| first <= x) {
                self.pos = self.ids[..self.pos].partition_point(|&id| id <= x);
                let id = self.ids[self.pos - 1];
                if id < self.lo {
                    self.done = true;
                    return Ok(None);
                }
                return Ok(Some(id));
            }
            // The block holding the largest id at most `x`, in `x`'s segment; else
            // the segment before.
            let segment = segment_of(x);
            if self.load(segment, offset_of(x))? && self.ids[0] <= x {
                continue;
            }
            match id_at(segment, 0).checked_sub(1) {
                Some(before) => x = before,
                None => self.done = true,
            }
        }
    }

    /// Reads the block of the list in `segment` that starts at or before `offset`
    /// into `ids`; false when there is none.
    fn load(&mut self, segment: u32, offset: u16) -> Result<bool, HistoryError> {
        self.ids.clear();
        if self.term.is_instance() {
            if let Some(v) = self.table.get((segment, self.term.stored(), 0))? {
                let key = self.term.key();
                self.ids.extend(
                    pairs(v.value())
                        .skip_while(|p| p.0 < key)
                        .take_while(|p| p.0 == key)
                        .map(|p| id_at(segment, p.1)),
                );
            }
        } else {
            let term = self.term.0;
            let block = self
                .table
                .range((segment, term, 0)..=(segment, term, offset))?
                .next_back()
                .transpose()?;
            if let Some((k, v)) = block {
                let first = id_at(segment, k.value().2);
                self.ids.push(first);
                self.ids.extend(ids_after(first, v.value()));
            }
        }
        self.pos = self.ids.len();
        Ok(!self.ids.is_empty())
    }
}

/// The union of some lists.
struct Union<'t> {
    lists: Vec<List<'t>>,
}

impl Union<'_> {
    fn seek(&mut self, x: u64) -> Result<Option<u64>, HistoryError> {
        let mut best = None;
        for l in &mut self.lists {
            if let Some(id) = l.seek(x)? {
                best = best.max(Some(id));
            }
        }
        Ok(best)
    }
}

/// The ids in `lo..hi` that every source holds, newest first.
pub(super) struct Intersect<'t> {
    sources: Vec<Union<'t>>,
    lo: u64,
    /// The largest id still to be looked at.
    next: Option<u64>,
}

impl<'t> Intersect<'t> {
    pub(super) fn new(table: &'t Table, sources: &[Vec<Term>], lo: u64, hi: u64) -> Intersect<'t> {
        Intersect {
            sources: sources
                .iter()
                .map(|terms| Union {
                    lists: terms.iter().map(|t| List::new(table, *t, lo)).collect(),
                })
                .collect(),
            lo,
            next: hi.checked_sub(1).filter(|x| *x >= lo),
        }
    }

    /// The next id every source holds: each source in turn is sought to the
    /// candidate, and a source below it lowers the candidate, until all agree.
    pub(super) fn next(&mut self) -> Result<Option<u64>, HistoryError> {
        let Some(mut x) = self.next else {
            return Ok(None);
        };
        let k = self.sources.len();
        let (mut agreed, mut i) = (0, 0);
        loop {
            match self.sources[i].seek(x)? {
                None => {
                    self.next = None;
                    return Ok(None);
                }
                Some(y) if y == x => agreed += 1,
                Some(y) => (x, agreed) = (y, 1),
            }
            if agreed == k {
                self.next = x.checked_sub(1).filter(|n| *n >= self.lo);
                return Ok(Some(x));
            }
            i = (i + 1) % k;
        }
    }
}
