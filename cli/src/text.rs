//! The one rule for text from outside on a terminal: every control character and
//! bidirectional control written as its visible escape. Below both the renderers and
//! the client's error messages, which say text a server sent.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` is written escaped by [`clean`]: a control character (C0, DEL, C1)
/// or a bidirectional control, which reorders what follows it on the line.
pub(crate) fn escaped(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Writes `c` as the visible escape that stands for it: `\n`, `\t`, `\r`, or
/// `\u{1b}` (the code point in hexadecimal, as Rust writes it).
pub(crate) fn push_escape(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        '\r' => out.push_str("\\r"),
        c => {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
    }
}

/// Text from outside (the catalog, an agent, the API, a server's message) made safe
/// for one line of a terminal: every control character (C0 with newline and tab,
/// DEL, C1, ESC among them) and every bidirectional control written as its visible
/// escape (`\u{1b}`, `\n`), everything else as it is. What every text renderer puts
/// in a table cell or a line goes through here.
pub fn clean(text: &str) -> Cow<'_, str> {
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if escaped(c) {
            push_escape(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}
