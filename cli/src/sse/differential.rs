//! The event-stream reader against the HTML standard's interpretation of an event
//! stream, written here plainly over the whole stream at once, on generated streams
//! cut into chunks anywhere (docs/reliability.md, "Parsers").

use meshcat_common::differential::{check_stream, config, cuts};
use proptest::prelude::*;

use super::{Event, Parser};

/// The standard's reading (html.spec.whatwg.org, "Interpreting an event stream"):
/// decoded as UTF-8 with replacement and one leading BOM dropped, cut into lines at
/// CRLF, LF or CR (an unended last line is dropped), each line a comment, a field and
/// a value, or the blank line that dispatches.
fn reference(bytes: &[u8]) -> Vec<Event> {
    let text = String::from_utf8_lossy(bytes);
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let mut lines = Vec::new();
    let mut line = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' => {
                if chars.peek() == Some(&'\n') {
                    chars.next();
                }
                lines.push(std::mem::take(&mut line));
            }
            '\n' => lines.push(std::mem::take(&mut line)),
            c => line.push(c),
        }
    }
    let (mut data, mut event, mut last_id) = (String::new(), String::new(), String::new());
    let mut out = Vec::new();
    for line in lines {
        if line.is_empty() {
            if data.is_empty() {
                event.clear();
                continue;
            }
            data.pop();
            out.push(Event {
                id: (!last_id.is_empty()).then(|| last_id.clone()),
                event: if event.is_empty() {
                    "message".into()
                } else {
                    event.clone()
                },
                data: std::mem::take(&mut data),
            });
            event.clear();
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = match line.find(':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (line.as_str(), ""),
        };
        match field {
            "event" => event = value.to_owned(),
            "data" => {
                data.push_str(value);
                data.push('\n');
            }
            "id" if !value.contains('\0') => last_id = value.to_owned(),
            _ => {}
        }
    }
    out
}

fn stream() -> impl Strategy<Value = Vec<u8>> {
    let line = prop_oneof![
        4 => ("[ -~é😀]{0,12}").prop_map(|v| format!("data: {v}")),
        1 => "[ -~]{0,8}".prop_map(|v| format!("data:{v}")),
        1 => Just("data".to_owned()),
        1 => Just("data:".to_owned()),
        2 => "[a-z]{0,8}".prop_map(|v| format!("event: {v}")),
        1 => Just("event:".to_owned()),
        2 => "[0-9]{1,4}".prop_map(|v| format!("id: {v}")),
        1 => Just("id".to_owned()),
        1 => Just("id: a\0b".to_owned()),
        1 => "[0-9a-z]{0,4}".prop_map(|v| format!("retry: {v}")),
        1 => "[ -~]{0,10}".prop_map(|v| format!(":{v}")),
        1 => "[a-z]{1,6}: [ -~]{0,6}".prop_map(|v| v),
        4 => Just(String::new()),
        1 => "[ -~\u{fffd}]{0,10}",
    ];
    let end = prop_oneof![4 => Just("\n"), 1 => Just("\r\n"), 1 => Just("\r")];
    (
        any::<bool>(),
        proptest::collection::vec((line, end), 0..24),
        proptest::option::of("[ -~]{0,6}"),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 1..4)),
    )
        .prop_map(|(bom, lines, tail, junk)| {
            let mut out = Vec::new();
            if bom {
                out.extend_from_slice("\u{feff}".as_bytes());
            }
            for (l, e) in lines {
                out.extend_from_slice(l.as_bytes());
                out.extend_from_slice(e.as_bytes());
            }
            if let Some(j) = junk {
                out.extend(j);
                out.push(b'\n');
            }
            out.extend(tail.unwrap_or_default().into_bytes());
            out
        })
}

/// The parser fed `chunks`: the events it completed.
fn read(chunks: &[&[u8]]) -> Result<Vec<Event>, super::SseError> {
    let mut p = Parser::default();
    let mut out = Vec::new();
    for c in chunks {
        out.extend(p.push(c)?);
        assert!(p.pending.len() <= super::MAX_LINE);
    }
    Ok(out)
}

proptest! {
    #![proptest_config(config(1_024))]

    #[test]
    fn streams_read_as_the_standard_reads_them(bytes in stream(), c in cuts(1_024)) {
        let want: Result<Vec<Event>, String> = Ok(reference(&bytes));
        check_stream(&bytes, &c, 256, read, &want)?;
    }

    /// Any bytes: never a panic.
    #[test]
    fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256), c in cuts(256)) {
        let _ = read(&meshcat_common::differential::chunks(&bytes, &c));
    }
}
