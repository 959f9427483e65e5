//! Moving [`crate::wire`] frames over quinn streams: the length prefix is read and
//! checked against the limit before a single byte of the body is read, the body's
//! buffer grows only as its bytes arrive, and a stream
//! or connection that ends cleanly between frames is not an error.

use quinn::{ConnectionError, ReadError, ReadExactError, RecvStream, SendStream, WriteError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::wire::{self, WireError};

/// Application error codes on the QUIC link (stream resets and connection closes).
pub mod code {
    /// Orderly close (goodbye, shutdown).
    pub const OK: u32 = 0;
    /// The peer broke the protocol (bad frame, unexpected message).
    pub const PROTOCOL: u32 = 1;
    /// A message was over the size limit; the stream is stopped, not read.
    pub const TOO_LARGE: u32 = 2;
    /// Authentication failed or a permission was missing.
    pub const REFUSED: u32 = 3;
    /// A newer connection of the same agent replaced this one.
    pub const REPLACED: u32 = 4;
    /// The aggregator is shutting down.
    pub const SHUTDOWN: u32 = 5;
}

/// Why a frame could not be moved.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("stream ended inside a frame")]
    Truncated,
    #[error("read failed: {0}")]
    Read(#[from] ReadError),
    #[error("write failed: {0}")]
    Write(#[from] WriteError),
}

impl TransportError {
    /// Low-cardinality label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            TransportError::Wire(e) => e.reason(),
            TransportError::Truncated => "truncated",
            TransportError::Read(_) => "read",
            TransportError::Write(_) => "write",
        }
    }
}

fn is_clean_close(e: &ReadError) -> bool {
    matches!(
        e,
        ReadError::ConnectionLost(
            ConnectionError::ApplicationClosed(_) | ConnectionError::LocallyClosed
        )
    )
}

/// Reads one frame. `Ok(None)` means the peer finished the stream (or closed the
/// connection) cleanly at a frame boundary.
pub async fn read_frame<M: DeserializeOwned>(
    recv: &mut RecvStream,
    limit: usize,
) -> Result<Option<M>, TransportError> {
    let mut prefix = [0u8; 4];
    match recv.read_exact(&mut prefix).await {
        Ok(()) => {}
        Err(ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(ReadExactError::FinishedEarly(_)) => return Err(TransportError::Truncated),
        Err(ReadExactError::ReadError(e)) if is_clean_close(&e) => return Ok(None),
        Err(ReadExactError::ReadError(e)) => return Err(e.into()),
    }
    let len = wire::frame_len(prefix, limit)?;
    // The body grows as its bytes arrive, never ahead of them: a peer that announces a
    // large frame and stalls holds no more memory than it sent (at most twice that).
    let mut body: Vec<u8> = Vec::new();
    while body.len() < len {
        let chunk = match recv.read_chunk(len - body.len(), true).await {
            Ok(Some(chunk)) => chunk.bytes,
            Ok(None) => return Err(TransportError::Truncated),
            Err(e) => return Err(e.into()),
        };
        if body.capacity() - body.len() < chunk.len() {
            let want = (body.capacity() * 2).max(body.len() + chunk.len()).min(len);
            body.reserve_exact(want - body.len());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(wire::decode(&body)?))
}

/// Writes one frame; refuses (without writing) a message over the limit.
pub async fn write_frame<M: Serialize>(
    send: &mut SendStream,
    message: &M,
    limit: usize,
) -> Result<(), TransportError> {
    let frame = wire::encode(message, limit)?;
    send.write_all(&frame).await?;
    Ok(())
}
