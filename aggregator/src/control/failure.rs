//! Why a zone's stream failed, in words and as a state: a refused or timed-out
//! connection (`unreachable`), a certificate problem found anywhere in the error's
//! source chain (`tls-error`), a response over the message bound (`rejected`), or
//! the gRPC status and message.

use std::error::Error as StdError;
use std::io;

use super::ControlState;

/// A failed connection or stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// `Unreachable`, `TlsError` or `Rejected`.
    pub state: ControlState,
    pub error: String,
}

impl Failure {
    pub fn unreachable(error: impl Into<String>) -> Failure {
        Failure {
            state: ControlState::Unreachable,
            error: error.into(),
        }
    }

    pub fn tls(error: impl Into<String>) -> Failure {
        Failure {
            state: ControlState::TlsError,
            error: error.into(),
        }
    }

    /// A failure to connect (TCP, TLS, HTTP/2), from the error and its sources.
    pub fn of_error(error: &(dyn StdError + 'static)) -> Failure {
        let mut chain: Vec<&(dyn StdError + 'static)> = Vec::new();
        let mut next = Some(error);
        while let Some(e) = next {
            chain.push(e);
            // io::Error's source() skips the error it wraps: look at it too.
            if let Some(inner) = e.downcast_ref::<io::Error>().and_then(|io| io.get_ref()) {
                chain.push(inner);
            }
            next = e.source();
        }
        for e in &chain {
            if let Some(tls) = e.downcast_ref::<rustls::Error>() {
                return Failure::tls(tls.to_string());
            }
        }
        for e in &chain {
            let text = e.to_string();
            // tonic's own TLS errors (their type is private): handshake timeout, no
            // HTTP/2 by ALPN, unreadable certificate or key.
            if text.contains("TLS") || text.contains("HTTP/2 was not negotiated") {
                return Failure::tls(text.trim_end_matches('.').to_owned());
            }
        }
        for e in &chain {
            if let Some(io) = e.downcast_ref::<io::Error>() {
                if let Some(words) = io_words(io.kind()) {
                    return Failure::unreachable(words);
                }
            }
        }
        for e in &chain {
            if let Some(status) = e.downcast_ref::<tonic::Status>() {
                return Failure::unreachable(status_words(status));
            }
        }
        let deepest = chain.last().map_or_else(String::new, |e| e.to_string());
        Failure::unreachable(if deepest.is_empty() {
            error.to_string()
        } else {
            deepest
        })
    }

    /// A failed stream, from its gRPC status.
    pub fn of_status(status: &tonic::Status) -> Failure {
        if status.code() == tonic::Code::OutOfRange && status.message().contains("too large") {
            return Failure {
                state: ControlState::Rejected,
                error: format!(
                    "a response over --max-control-message: {}",
                    status.message()
                ),
            };
        }
        if let Some(source) = status.source() {
            let failure = Failure::of_error(source);
            if failure.state == ControlState::TlsError || io_like(&failure.error) {
                return failure;
            }
        }
        Failure::unreachable(status_words(status))
    }
}

/// The words for an I/O error kind that says why a connection failed.
fn io_words(kind: io::ErrorKind) -> Option<&'static str> {
    Some(match kind {
        io::ErrorKind::ConnectionRefused => "connection refused",
        io::ErrorKind::TimedOut => "timed out",
        io::ErrorKind::ConnectionReset => "connection reset",
        io::ErrorKind::ConnectionAborted => "connection aborted",
        io::ErrorKind::BrokenPipe => "connection closed (broken pipe)",
        io::ErrorKind::UnexpectedEof => "connection closed",
        io::ErrorKind::HostUnreachable => "host unreachable",
        io::ErrorKind::NetworkUnreachable => "network unreachable",
        io::ErrorKind::AddrNotAvailable => "address not available",
        _ => return None,
    })
}

/// Whether `words` came from [`io_words`].
fn io_like(words: &str) -> bool {
    use io::ErrorKind::*;
    [
        ConnectionRefused,
        TimedOut,
        ConnectionReset,
        ConnectionAborted,
        BrokenPipe,
        UnexpectedEof,
        HostUnreachable,
        NetworkUnreachable,
        AddrNotAvailable,
    ]
    .into_iter()
    .any(|k| io_words(k) == Some(words))
}

/// `gRPC status <code>: <message>`.
pub fn status_words(status: &tonic::Status) -> String {
    if status.message().is_empty() {
        format!("gRPC status {:?}", status.code())
    } else {
        format!("gRPC status {:?}: {}", status.code(), status.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_chain_names_the_problem() {
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "nope");
        assert_eq!(
            Failure::of_error(&refused),
            Failure::unreachable("connection refused")
        );
        let cert = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let wrapped = io::Error::new(io::ErrorKind::InvalidData, cert);
        let failure = Failure::of_error(&wrapped);
        assert_eq!(failure.state, ControlState::TlsError);
        assert!(failure.error.contains("UnknownIssuer"), "{}", failure.error);
        let status = tonic::Status::unimplemented("unknown service");
        assert_eq!(
            Failure::of_status(&status).error,
            "gRPC status Unimplemented: unknown service"
        );
        let big = tonic::Status::out_of_range(
            "Error, decoded message length too large: found 9 bytes, the limit is: 4 bytes",
        );
        assert_eq!(Failure::of_status(&big).state, ControlState::Rejected);
    }
}
