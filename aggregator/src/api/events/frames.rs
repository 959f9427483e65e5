//! What one event stream writes: the filter of its events, the chunks it joins
//! within its buffer, and the replay of a resume.

use std::sync::Arc;

use bytes::Bytes;

use crate::changes::{Change, Event};

/// What a stream shows: all events, or those of one zone and/or one cluster.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub(super) zone: Option<String>,
    pub(super) cluster: Option<String>,
}

impl Filter {
    pub(super) fn admits(&self, e: &crate::changes::Event) -> bool {
        if e.kind == crate::changes::RESET {
            return true;
        }
        if e.kind == "summary" {
            return self.zone.is_none() && self.cluster.is_none();
        }
        if self.zone.as_ref().is_some_and(|z| *z != e.zone) {
            return false;
        }
        match &self.cluster {
            None => true,
            Some(c) => e.cluster.as_ref() == Some(c),
        }
    }
}

/// The frame of `e` a caller sees: the read-token one or the anonymous one; none
/// of a private event for a caller without the read token.
pub(super) fn frame_of(e: &Event, authorized: bool) -> Option<&Bytes> {
    match (&e.frame_unauthorized, authorized) {
        (_, false) if e.private => None,
        (Some(f), false) => Some(f),
        _ => Some(&e.frame),
    }
}

/// What a stream writes next: nothing, one shared frame (no copy, the common case),
/// or several frames joined, never more than the stream's buffer.
#[derive(Debug, Default)]
pub(super) enum Chunk {
    #[default]
    Empty,
    One(Bytes),
    Many(Vec<u8>),
}

impl Chunk {
    pub(super) fn len(&self) -> usize {
        match self {
            Chunk::Empty => 0,
            Chunk::One(b) => b.len(),
            Chunk::Many(m) => m.len(),
        }
    }

    /// Adds `frame`; a joined chunk grows by doubling, but never past `limit` (or
    /// what it holds, if more) in capacity.
    pub(super) fn push(&mut self, frame: &Bytes, limit: usize) {
        *self = match std::mem::take(self) {
            Chunk::Empty => Chunk::One(frame.clone()),
            Chunk::One(first) => {
                let mut many = Vec::with_capacity(first.len() + frame.len());
                many.extend_from_slice(&first);
                many.extend_from_slice(frame);
                Chunk::Many(many)
            }
            Chunk::Many(mut many) => {
                let need = many.len() + frame.len();
                if need > many.capacity() {
                    let grown = (many.capacity() * 2).min(limit).max(need);
                    many.reserve_exact(grown - many.len());
                }
                many.extend_from_slice(frame);
                Chunk::Many(many)
            }
        }
    }

    /// Appends what one change shows a stream (its admitted events' frames) from
    /// its event `from` on, while the chunk stays within `limit` bytes: answers the
    /// first event left out, if any. A frame is always taken into an empty chunk
    /// (alone it is shared, not copied), so every call makes progress.
    pub(super) fn append(
        &mut self,
        change: &Change,
        from: usize,
        filter: &Filter,
        authorized: bool,
        limit: usize,
    ) -> Option<usize> {
        for (i, e) in change.events.iter().enumerate().skip(from) {
            if !filter.admits(e) {
                continue;
            }
            let Some(frame) = frame_of(e, authorized) else {
                continue;
            };
            if !self.is_empty() && self.len() + frame.len() > limit {
                return Some(i);
            }
            self.push(frame, limit);
        }
        None
    }

    pub(super) fn is_empty(&self) -> bool {
        matches!(self, Chunk::Empty)
    }

    pub(super) fn into_bytes(self) -> Option<Bytes> {
        match self {
            Chunk::Empty => None,
            Chunk::One(b) => Some(b),
            Chunk::Many(m) => Some(Bytes::from(m)),
        }
    }
}

/// A replay larger than the stream's buffer: the stream sends `reset` instead.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct TooLarge;

/// The replay of `changes` for one stream: the frames it admits, joined (`None`
/// when there are none), or [`TooLarge`] when they come to more than `limit` bytes.
/// The size is summed first, stopping at the first frame past the limit, so nothing
/// is copied for a replay that does not fit and a replay that fits is copied once.
pub(super) fn replay(
    changes: &[Arc<Change>],
    filter: &Filter,
    authorized: bool,
    limit: usize,
) -> Result<Option<Bytes>, TooLarge> {
    let frames = || {
        changes
            .iter()
            .flat_map(|c| c.events.iter())
            .filter(|e| filter.admits(e))
            .filter_map(|e| frame_of(e, authorized))
    };
    let (mut count, mut len) = (0usize, 0usize);
    for f in frames() {
        count += 1;
        len += f.len();
        if len > limit {
            return Err(TooLarge);
        }
    }
    Ok(match count {
        0 => None,
        // One frame: shared, not copied.
        1 => frames().next().cloned(),
        _ => {
            let mut out = Vec::with_capacity(len);
            for f in frames() {
                out.extend_from_slice(f);
            }
            Some(Bytes::from(out))
        }
    })
}
