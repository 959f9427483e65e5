//! Server-Sent Events, as `GET /events` writes them and the HTML standard reads
//! them: bytes in, whole events out. No I/O, so chunk boundaries anywhere (inside a
//! line, inside a UTF-8 character, between a CR and its LF) are tested without a
//! server; `sse/differential.rs` holds it to the standard.

/// Largest event: the bytes of its `data:` lines. A cluster record is a few KiB and
/// a bulk change sends one event per record, so an event past this is a broken or
/// hostile server: `meshcat watch` stops there (exit status 2) rather than hold it.
pub const MAX_EVENT: usize = 1 << 20;

/// Longest line kept while waiting for its end: a `data:` line with a whole event.
pub const MAX_LINE: usize = MAX_EVENT + 64;

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The stream's last event id when the event was dispatched (the standard's
    /// `lastEventId`: the last `id:` seen, kept across events), `None` while empty.
    pub id: Option<String>,
    /// `event:` (`message` when absent or empty, as the standard says).
    pub event: String,
    /// The `data:` lines joined with newlines.
    pub data: String,
}

/// Why the stream cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SseError {
    #[error(
        "a line of the event stream is longer than {} MiB, the bound of one event",
        MAX_EVENT >> 20
    )]
    LineTooLong,
    #[error(
        "an event of the stream is larger than {} MiB, the bound of one event",
        MAX_EVENT >> 20
    )]
    EventTooLarge,
}

/// Reads events from chunks of a stream as the HTML standard's event stream
/// interpretation says (lines ended by CR, LF or CRLF; a leading byte order mark
/// ignored), holding at most [`MAX_LINE`] bytes of an unfinished line and
/// [`MAX_EVENT`] bytes of an unfinished event.
#[derive(Debug, Default)]
pub struct Parser {
    /// Bytes after the last complete line.
    pending: Vec<u8>,
    /// The last line ended with CR: a LF right after it ends nothing more.
    after_cr: bool,
    /// The first line was read: a byte order mark can only lead it.
    past_first_line: bool,
    /// The last event id buffer ("" when none), kept across events.
    last_id: String,
    /// The event type buffer.
    event: String,
    /// The data buffer, `None` while empty.
    data: Option<String>,
}

impl Parser {
    /// Takes the next chunk; answers the events it completes, or the bound it
    /// breaks (checked before the bytes are kept, whatever the chunk's size).
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Event>, SseError> {
        let mut out = Vec::new();
        let mut rest = chunk;
        if self.after_cr && rest.first() == Some(&b'\n') {
            rest = &rest[1..];
        }
        self.after_cr = false;
        while let Some(n) = rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
            if self.pending.len() + n > MAX_LINE {
                return Err(SseError::LineTooLong);
            }
            self.pending.extend_from_slice(&rest[..n]);
            let cr = rest[n] == b'\r';
            rest = &rest[n + 1..];
            if cr {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            let mut line = &self.pending[..];
            if !self.past_first_line {
                self.past_first_line = true;
                line = line.strip_prefix("\u{feff}".as_bytes()).unwrap_or(line);
            }
            let line = String::from_utf8_lossy(line).into_owned();
            self.pending.clear();
            if let Some(e) = self.line(&line)? {
                out.push(e);
            }
        }
        if self.pending.len() + rest.len() > MAX_LINE {
            return Err(SseError::LineTooLong);
        }
        self.pending.extend_from_slice(rest);
        Ok(out)
    }

    fn line(&mut self, line: &str) -> Result<Option<Event>, SseError> {
        if line.is_empty() {
            let event = std::mem::take(&mut self.event);
            let Some(data) = self.data.take() else {
                return Ok(None);
            };
            return Ok(Some(Event {
                id: (!self.last_id.is_empty()).then(|| self.last_id.clone()),
                event: if event.is_empty() {
                    "message".into()
                } else {
                    event
                },
                data,
            }));
        }
        if line.starts_with(':') {
            return Ok(None);
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => value.clone_into(&mut self.event),
            "id" if !value.contains('\0') => value.clone_into(&mut self.last_id),
            "data" => match &mut self.data {
                Some(d) if d.len() + 1 + value.len() > MAX_EVENT => {
                    return Err(SseError::EventTooLarge);
                }
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None if value.len() > MAX_EVENT => return Err(SseError::EventTooLarge),
                None => self.data = Some(value.to_owned()),
            },
            _ => {}
        }
        Ok(None)
    }
}

#[cfg(test)]
mod differential;

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
                // The standard's last event id: kept from the event before.
                id: Some("8".into()),
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

    /// Where the differential tests found the reader reading otherwise than the
    /// standard: lines ended by a lone CR (here split from its LF by a chunk's end),
    /// a leading byte order mark, an empty event name, an event name with no data
    /// left for the next event, an id kept across events, and an id holding NUL.
    #[test]
    fn reads_what_the_standard_reads() {
        let read = |chunks: &[&[u8]]| {
            let mut p = Parser::default();
            let mut out = Vec::new();
            for c in chunks {
                out.extend(p.push(c).unwrap());
            }
            out
        };
        let ev = |id: Option<&str>, event: &str, data: &str| Event {
            id: id.map(str::to_owned),
            event: event.into(),
            data: data.into(),
        };
        assert_eq!(
            read(&[b"data: a\r\r", b"\ndata: b\r", b"\n\r\n"]),
            [ev(None, "message", "a"), ev(None, "message", "b")]
        );
        assert_eq!(
            read(&["\u{feff}data: x\n\n".as_bytes()]),
            [ev(None, "message", "x")]
        );
        assert_eq!(
            read(&[b"event:\ndata: x\n\nevent: gone\n\ndata: y\n\n"]),
            [ev(None, "message", "x"), ev(None, "message", "y")]
        );
        assert_eq!(
            read(&[b"id: 4\ndata: x\n\ndata: y\n\nid: a\0b\ndata: z\n\nid\ndata: w\n\n"]),
            [
                ev(Some("4"), "message", "x"),
                ev(Some("4"), "message", "y"),
                ev(Some("4"), "message", "z"),
                ev(None, "message", "w"),
            ]
        );
    }

    #[test]
    fn a_line_without_end_is_bounded() {
        let mut p = Parser::default();
        let chunk = vec![b'x'; 64 << 10];
        let mut pushed = 0;
        let err = loop {
            match p.push(&chunk) {
                Ok(events) => assert!(events.is_empty()),
                Err(e) => break e,
            }
            pushed += chunk.len();
            assert!(pushed <= MAX_LINE, "a line of {pushed} bytes was kept");
        };
        assert_eq!(err, SseError::LineTooLong);
        assert!(p.pending.len() <= MAX_LINE, "{}", p.pending.len());
        // One chunk larger than the bound is refused before it is kept.
        let mut p = Parser::default();
        assert_eq!(
            p.push(&vec![b'x'; 2 * MAX_LINE]),
            Err(SseError::LineTooLong)
        );
        assert!(p.pending.is_empty());
    }

    #[test]
    fn an_event_of_many_lines_is_bounded() {
        let line = format!("data: {}\n", "x".repeat(999));
        let mut p = Parser::default();
        let mut kept = 0;
        let err = loop {
            match p.push(line.as_bytes()) {
                Ok(events) => assert!(events.is_empty()),
                Err(e) => break e,
            }
            kept += 1000;
            assert!(kept <= MAX_EVENT + 1000, "{kept} bytes of data kept");
        };
        assert_eq!(err, SseError::EventTooLarge);
        assert!(p.data.as_ref().is_some_and(|d| d.len() <= MAX_EVENT));
        // Up to the bound an event is whole.
        let mut p = Parser::default();
        let data = "y".repeat(MAX_EVENT);
        let events = p
            .push(format!("event: big\ndata: {data}\n\n").as_bytes())
            .unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].data.len(), MAX_EVENT);
        assert_eq!(
            p.push(format!("data: {data}\ndata: y\n").as_bytes()),
            Err(SseError::EventTooLarge)
        );
    }
}
