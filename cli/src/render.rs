//! What every command's output shares: aligned tables cut to the terminal's width,
//! the colours of statuses and verdicts (written always; [`anstream`] strips them off
//! a terminal and under `NO_COLOR`), times and ages, the JSON and YAML printers, and
//! the one rule for text from outside on a terminal ([`clean`], [`terminal`]): no
//! control character that the catalog, an agent or the API sent is ever written raw.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anstyle::{AnsiColor, Style};
use serde_json::Value;

use crate::args::Format;
use crate::client::CliError;
pub use crate::text::clean;
use crate::text::push_escape;

/// Columns are this many spaces apart, as kubectl's.
const GAP: usize = 3;
/// A column is never cut below this many characters.
const MIN_COLUMN: usize = 6;

pub const GREEN: Style = AnsiColor::Green.on_default();
pub const YELLOW: Style = AnsiColor::Yellow.on_default();
pub const RED: Style = AnsiColor::Red.on_default();
pub const BOLD: Style = Style::new().bold();
pub const DIM: Style = Style::new().dimmed();
pub const PLAIN: Style = Style::new();

/// The escape sequences of the styles above, the only ones [`terminal`] lets
/// through: each style's start and the reset that ends it.
const OUR_ESCAPES: [&str; 6] = [
    "\u{1b}[31m",
    "\u{1b}[32m",
    "\u{1b}[33m",
    "\u{1b}[1m",
    "\u{1b}[2m",
    "\u{1b}[0m",
];

/// `text` in `style` (its control characters escaped, as [`clean`] does).
pub fn paint(style: Style, text: &str) -> String {
    let text = clean(text);
    if style == PLAIN {
        text.into_owned()
    } else {
        format!("{style}{text}{style:#}")
    }
}

/// The colour of a cluster status.
pub fn status_style(status: &str) -> Style {
    match status {
        "stable" => GREEN,
        "warning" => YELLOW,
        "down" => RED,
        _ => PLAIN,
    }
}

/// The colour of a sidecar's sync state: red for the states that fail `sync` and
/// `check`, yellow for a sidecar cut off from its control plane.
pub fn sync_style(state: &str) -> Style {
    match state {
        "synced" => GREEN,
        "disconnected" => YELLOW,
        "stale" | "rejected" => RED,
        _ => PLAIN,
    }
}

/// The colour of a zone's control state.
pub fn control_style(state: &str) -> Style {
    match state {
        "connected" => GREEN,
        "connecting" => YELLOW,
        "unreachable" | "tls-error" | "rejected" => RED,
        _ => PLAIN,
    }
}

/// One cell: its text and its style.
#[derive(Debug, Clone)]
pub struct Cell {
    pub text: String,
    pub style: Style,
}

impl From<String> for Cell {
    fn from(text: String) -> Self {
        Cell { text, style: PLAIN }
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Self {
        Cell::from(text.to_owned())
    }
}

impl Cell {
    pub fn styled(text: impl Into<String>, style: Style) -> Self {
        Cell {
            text: text.into(),
            style,
        }
    }
}

/// A table with a header line.
#[derive(Debug, Clone)]
pub struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<Cell>>,
}

impl Table {
    pub fn new(header: &[&'static str]) -> Self {
        Table {
            header: header.to_vec(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<Cell>) {
        debug_assert_eq!(cells.len(), self.header.len());
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text, cut to `width` characters per line when given (a
    /// terminal's width): the widest columns give way first, and a cut value ends
    /// with `…`. Without a width (a pipe, a file) nothing is cut.
    ///
    /// Every cell is [`clean`]ed first: a newline, a tab or an escape sequence in a
    /// value is written visibly and cannot break the table or reach the terminal.
    pub fn render(&self, width: Option<usize>) -> String {
        let n = self.header.len();
        let header: Vec<Cell> = self.header.iter().map(|h| Cell::styled(*h, BOLD)).collect();
        let rows: Vec<Vec<Cell>> = std::iter::once(header)
            .chain(self.rows.iter().map(|row| {
                row.iter()
                    .map(|c| Cell::styled(clean(&c.text), c.style))
                    .collect()
            }))
            .collect();
        let mut widths = vec![0; n];
        for row in &rows {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.text.chars().count());
            }
        }
        if let Some(limit) = width {
            let total = |w: &[usize]| w.iter().sum::<usize>() + GAP * n.saturating_sub(1);
            while total(&widths) > limit {
                let Some((i, _)) = widths
                    .iter()
                    .enumerate()
                    .filter(|(_, w)| **w > MIN_COLUMN)
                    .max_by_key(|(i, w)| (**w, std::cmp::Reverse(*i)))
                else {
                    break;
                };
                widths[i] -= 1;
            }
        }
        let mut out = String::new();
        for row in &rows {
            let mut line = String::new();
            for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
                let text = cut(&cell.text, *w);
                let pad = w - text.chars().count();
                line.push_str(&paint(cell.style, &text));
                if i + 1 < n {
                    line.extend(std::iter::repeat_n(' ', pad + GAP));
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }
}

/// `text` in at most `width` characters, ending with `…` when cut.
fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut s: String = text.chars().take(width.saturating_sub(1)).collect();
    s.push('…');
    s
}

/// The width of the terminal standard output is, when it is one and says its width
/// (a pseudo-terminal nobody sized says 0).
pub fn terminal_width() -> Option<usize> {
    terminal_size::terminal_size_of(std::io::stdout())
        .map(|(w, _)| usize::from(w.0))
        .filter(|w| *w >= 20)
}

/// Milliseconds since the epoch as UTC RFC 3339, to the second; past the year 9999
/// (which RFC 3339 cannot write) the number as it came.
pub fn time(ms: i64) -> String {
    match u64::try_from(ms) {
        Ok(ms) if ms > 0 => {
            use std::fmt::Write as _;
            let mut text = String::new();
            let at = humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms));
            if write!(text, "{at}").is_ok() {
                text
            } else {
                ms.to_string()
            }
        }
        _ => "-".to_owned(),
    }
}

/// Now, in milliseconds since the epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// How long ago `ms` was, in kubectl's short form: `42s`, `5m`, `3h`, `2d`.
pub fn age(ms: i64, now: i64) -> String {
    if ms <= 0 {
        return "-".to_owned();
    }
    let s = (now - ms).max(0) / 1000;
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// The API's answer in `format` (JSON as is, or YAML), for `-o json|yaml`.
pub fn data(value: &Value, format: Format) -> Result<String, CliError> {
    match format {
        Format::Json | Format::Table => {
            let mut s = json_text(value, true);
            s.push('\n');
            Ok(s)
        }
        Format::Yaml => yaml(value),
    }
}

/// `value` as JSON text (indented when `pretty`) in which no control character is
/// raw: serde_json escapes those below U+0020, and DEL and the C1 controls
/// (U+007F to U+009F), which JSON may carry raw but a terminal may obey, are written
/// `\u007f` to `\u009f` too. The same JSON value, byte for byte another text.
pub fn json_text(value: &Value, pretty: bool) -> String {
    let text = if pretty {
        serde_json::to_string_pretty(value)
    } else {
        serde_json::to_string(value)
    }
    // A `Value` always serializes (its map keys are strings).
    .unwrap_or_default();
    if !text.chars().any(char::is_control) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        // Outside strings JSON text has only ASCII and newlines (pretty): a control
        // character here is inside a string, where `\uXXXX` is the same character.
        if c.is_control() && c != '\n' {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// A JSON value as YAML.
pub fn yaml(value: &Value) -> Result<String, CliError> {
    serde_saphyr::to_string(value).map_err(|e| CliError::Body {
        what: "output".into(),
        reason: format!("cannot write YAML: {e}"),
    })
}

/// A string field of a JSON object ("" when absent).
pub fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// The strings of a JSON array (none when it is not one; other items left out).
pub fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// `text` safe to print on a terminal: control characters and other characters that
/// print nothing (bidirectional overrides, zero-width marks) written as Rust escapes
/// (`\u{1b}`), everything else as it is. For text read from a file or an answer and
/// said in a message, where a raw escape sequence could rewrite the operator's screen.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' | '\'' | '\\' => out.push(c),
            c => out.extend(c.escape_debug()),
        }
    }
    out
}

/// As [`clean`] for a field that may hold several lines (a description): its lines
/// are kept (`\r\n` ends one too) and a tab becomes four spaces; every other control
/// character is escaped.
pub fn clean_lines(text: &str) -> String {
    text.split('\n')
        .map(|line| {
            let line = line.strip_suffix('\r').unwrap_or(line);
            clean(&line.replace('\t', "    ")).into_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A copy of a JSON value from outside with every string and key [`clean`]ed (with
/// [`clean_lines`] when `lines`), for the renderers that write its text into lines
/// of their own. `-o json|yaml` never go through here.
pub fn cleaned(value: &Value, lines: bool) -> Value {
    let text = |s: &str| {
        if lines {
            clean_lines(s)
        } else {
            clean(s).into_owned()
        }
    };
    match value {
        Value::String(s) => Value::String(text(s)),
        Value::Array(a) => a.iter().map(|v| cleaned(v, lines)).collect(),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| (text(k), cleaned(v, lines)))
            .collect(),
        other => other.clone(),
    }
}

/// What [`crate::cmd::emit`] writes to standard output: `text` with every control
/// character escaped as [`clean`] does, except newlines and tabs (the layout of
/// tables, YAML and completion scripts) and the escape sequences of this module's
/// own styles. The last guard: renderers [`clean`] what they are given, and a value
/// that one missed still cannot move the cursor, clear the screen, set a title or
/// write the clipboard. JSON from [`json_text`] and YAML from [`yaml`] hold no raw
/// control character, so they pass unchanged.
pub fn terminal(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if c == '\u{1b}' {
            if let Some(ours) = OUR_ESCAPES.iter().find(|e| rest.starts_with(**e)) {
                out.push_str(ours);
                rest = &rest[ours.len()..];
                continue;
            }
        }
        if unsafe_char(c) {
            push_escape(&mut out, c);
        } else {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    Cow::Owned(out)
}

/// `"text"`, quoted, with [`printable`]'s escapes and `"` and `\` escaped too.
pub fn quoted(text: &str) -> String {
    format!("{text:?}")
}

/// `text`, or `-` when empty.
pub fn or_dash(text: &str) -> String {
    if text.is_empty() {
        "-".to_owned()
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(text: &str) -> String {
        anstream::adapter::strip_str(text).to_string()
    }

    #[test]
    fn tables_align_and_fit_the_width() {
        let mut t = Table::new(&["ZONE", "CLUSTER", "OWNER"]);
        t.row(vec!["z1".into(), "catalog".into(), "team-catalog".into()]);
        t.row(vec![
            "z1".into(),
            "a-very-long-cluster-name-indeed".into(),
            "-".into(),
        ]);
        let text = plain(&t.render(None));
        assert_eq!(
            text,
            "ZONE   CLUSTER                           OWNER\n\
             z1     catalog                           team-catalog\n\
             z1     a-very-long-cluster-name-indeed   -\n"
        );
        let narrow = plain(&t.render(Some(40)));
        for line in narrow.lines() {
            assert!(line.chars().count() <= 40, "{line:?}");
        }
        assert!(narrow.contains("a-very-long-clust…   -"), "{narrow}");
        assert!(
            narrow.contains("team-catalog"),
            "the short column is whole: {narrow}"
        );
    }

    #[test]
    fn styles_do_not_count_in_widths() {
        let mut t = Table::new(&["STATUS", "X"]);
        t.row(vec![Cell::styled("down", RED), "1".into()]);
        let text = t.render(None);
        assert!(text.contains("\u{1b}["), "styled: {text:?}");
        assert_eq!(plain(&text), "STATUS   X\ndown     1\n");
    }

    #[test]
    fn ages_and_times() {
        let now = 1_700_000_000_000;
        assert_eq!(age(now - 5_000, now), "5s");
        assert_eq!(age(now - 300_000, now), "5m");
        assert_eq!(age(now - 3 * 3_600_000, now), "3h");
        assert_eq!(age(now - 3 * 86_400_000, now), "3d");
        assert_eq!(age(0, now), "-");
        assert_eq!(time(1_700_000_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(time(0), "-");
        // An agent's clock far in the future: said as it came, not a panic.
        assert_eq!(time(300_000_000_000_000), "300000000000000");
        assert_eq!(time(i64::MAX), i64::MAX.to_string());
    }

    #[test]
    fn text_from_outside_prints_no_control_characters() {
        assert_eq!(printable("Deployment"), "Deployment");
        assert_eq!(printable("café \"x\" 'y' \\"), "café \"x\" 'y' \\");
        assert_eq!(
            printable("a\u{1b}[31mb\nc\u{9b}"),
            "a\\u{1b}[31mb\\nc\\u{9b}"
        );
        assert_eq!(printable("x\u{202e}y"), "x\\u{202e}y");
        assert_eq!(quoted("we\u{7}b"), "\"we\\u{7}b\"");
        for s in [printable("\u{1b}\u{7}\r\t\u{85}"), quoted("\u{1b}\u{85}")] {
            assert!(!s.chars().any(char::is_control), "{s:?}");
        }
    }

    /// What a hostile registration may hold: a clipboard write (OSC 52), a screen
    /// clear, BEL, CSI as one C1 character, DEL, a carriage return, a bidi override.
    const HOSTILE: &str = "a\u{1b}]52;c;aGk=\u{7}b\u{1b}[2Jc\u{9b}31md\u{7f}e\rf\u{202e}g";

    #[test]
    fn text_from_outside_is_written_escaped() {
        assert!(matches!(clean("team-catalog é"), Cow::Borrowed(_)));
        assert_eq!(
            clean(HOSTILE),
            "a\\u{1b}]52;c;aGk=\\u{7}b\\u{1b}[2Jc\\u{9b}31md\\u{7f}e\\rf\\u{202e}g"
        );
        assert_eq!(clean("a\nb\tc"), "a\\nb\\tc");
        assert_eq!(clean_lines("one\r\ntwo\tx\u{1b}"), "one\ntwo    x\\u{1b}");
        let v = cleaned(
            &serde_json::json!({"o\u{7}": [HOSTILE, 1, {"d": "x\ny"}]}),
            false,
        );
        assert_eq!(
            v,
            serde_json::json!({"o\\u{7}": [clean(HOSTILE), 1, {"d": "x\\ny"}]})
        );
    }

    #[test]
    fn the_last_guard_lets_only_our_own_colours_through() {
        for style in [GREEN, YELLOW, RED, BOLD, DIM] {
            for e in [format!("{style}"), format!("{style:#}")] {
                assert!(OUR_ESCAPES.contains(&e.as_str()), "{e:?}");
            }
        }
        let text = format!("{}\n{HOSTILE}\t\n", paint(RED, "down"));
        let safe = terminal(&text);
        assert!(safe.starts_with("\u{1b}[31mdown\u{1b}[0m\n"), "{safe:?}");
        assert!(safe.ends_with("g\t\n"), "{safe:?}");
        let raw: Vec<char> = safe
            .replace("\u{1b}[31m", "")
            .replace("\u{1b}[0m", "")
            .chars()
            .filter(|c| c.is_control() && !matches!(c, '\n' | '\t'))
            .collect();
        assert!(raw.is_empty(), "{raw:?} in {safe:?}");
        // A hostile copy of a colour inside a painted value is escaped with it.
        assert!(!paint(GREEN, "\u{1b}[31m").contains("\u{1b}[31m"));
        assert!(matches!(terminal("plain\n\ttext"), Cow::Borrowed(_)));
    }

    #[test]
    fn json_is_exact_and_has_no_raw_control_character() {
        let v = serde_json::json!({"owner": HOSTILE, "n": [1, "\u{85}"]});
        for pretty in [true, false] {
            let text = json_text(&v, pretty);
            assert!(
                !text.chars().any(|c| c.is_control() && c != '\n'),
                "{text:?}"
            );
            assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), v);
            assert_eq!(terminal(&text), text);
        }
        let y = yaml(&v).unwrap();
        assert_eq!(terminal(&y), y, "YAML passes the last guard unchanged");
        assert_eq!(serde_saphyr::from_str::<Value>(&y).unwrap(), v);
    }

    #[test]
    fn a_newline_in_a_cell_does_not_break_the_table() {
        let mut t = Table::new(&["OWNER", "X"]);
        t.row(vec!["two\nlines\u{1b}[2J".into(), "1".into()]);
        let text = plain(&t.render(None));
        assert_eq!(text, "OWNER                 X\ntwo\\nlines\\u{1b}[2J   1\n");
    }

    #[test]
    fn yaml_keeps_strings_that_look_like_other_types() {
        let v = serde_json::json!({"version": "1.0", "b": "true", "n": "123", "x": "null",
            "t": "~", "y": "yes", "colon": "a: b", "multi": "a\nb", "e": ""});
        let back: Value = serde_saphyr::from_str(&yaml(&v).unwrap()).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn yaml_of_an_answer() {
        let v = serde_json::json!([{"zoneName": "z", "useTls": false, "n": 1}]);
        let y = yaml(&v).unwrap();
        let back: Value = serde_saphyr::from_str(&y).unwrap();
        assert_eq!(back, v, "{y}");
    }
}
