//! Server-Sent Events, as `GET /events` writes them: bytes in, whole events out. No
//! I/O, so chunk boundaries anywhere (inside a line, inside a UTF-8 character) are
//! tested without a server.

/// Longest line kept while waiting for its end: a cluster record is a few KiB, a
/// bulk change sends one event per record.
pub const MAX_LINE: usize = 16 << 20;

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// `id:`, when the event has one.
    pub id: Option<String>,
    /// `event:` (`message` when absent, as the standard says).
    pub event: String,
    /// The `data:` lines joined with newlines.
    pub data: String,
}

/// Why the stream cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SseError {
    #[error("an event stream line is longer than {} MiB", MAX_LINE >> 20)]
    LineTooLong,
}

/// Reads events from chunks of a stream.
#[derive(Debug, Default)]
pub struct Parser {
    /// Bytes after the last complete line.
    pending: Vec<u8>,
    id: Option<String>,
    event: Option<String>,
    data: Option<String>,
}

impl Parser {
    /// Takes the next chunk; answers the events it completes.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Event>, SseError> {
        self.pending.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(n) = self.pending[start..].iter().position(|b| *b == b'\n') {
            let end = start + n;
            let mut line = &self.pending[start..end];
            if let Some(l) = line.strip_suffix(b"\r") {
                line = l;
            }
            let line = String::from_utf8_lossy(line).into_owned();
            if let Some(e) = self.line(&line) {
                out.push(e);
            }
            start = end + 1;
        }
        self.pending.drain(..start);
        if self.pending.len() > MAX_LINE {
            return Err(SseError::LineTooLong);
        }
        Ok(out)
    }

    fn line(&mut self, line: &str) -> Option<Event> {
        if line.is_empty() {
            let data = self.data.take()?;
            return Some(Event {
                id: self.id.take(),
                event: self.event.take().unwrap_or_else(|| "message".into()),
                data,
            });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.event = Some(value.to_owned()),
            "id" => self.id = Some(value.to_owned()),
            "data" => match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_across_any_chunking() {
        let stream = ": hello\n\nid: 7\nevent: cluster\ndata: {\"clusterName\":\"caf\u{e9}\"}\n\nid: 8\r\nevent: reset\r\ndata: {}\r\n\r\n: keep-alive\n\nevent: multi\ndata: a\ndata: b\n\n";
        let want = vec![
            Event {
                id: Some("7".into()),
                event: "cluster".into(),
                data: "{\"clusterName\":\"caf\u{e9}\"}".into(),
            },
            Event {
                id: Some("8".into()),
                event: "reset".into(),
                data: "{}".into(),
            },
            Event {
                id: None,
                event: "multi".into(),
                data: "a\nb".into(),
            },
        ];
        let bytes = stream.as_bytes();
        for size in 1..=bytes.len() {
            let mut p = Parser::default();
            let mut got = Vec::new();
            for chunk in bytes.chunks(size) {
                got.extend(p.push(chunk).unwrap());
            }
            assert_eq!(got, want, "chunks of {size}");
        }
    }

    #[test]
    fn a_line_without_end_is_bounded() {
        let mut p = Parser::default();
        let chunk = vec![b'x'; 1 << 20];
        let mut result = Ok(Vec::new());
        for _ in 0..=(MAX_LINE >> 20) {
            result = p.push(&chunk);
        }
        assert_eq!(result, Err(SseError::LineTooLong));
    }
}
