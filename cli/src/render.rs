//! What every command's output shares: aligned tables cut to the terminal's width,
//! the colours of statuses and verdicts (written always; [`anstream`] strips them off
//! a terminal and under `NO_COLOR`), times and ages, and the JSON and YAML printers.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anstyle::{AnsiColor, Style};
use serde_json::Value;

use crate::args::Format;
use crate::client::CliError;

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

/// `text` in `style`.
pub fn paint(style: Style, text: &str) -> String {
    if style == PLAIN {
        text.to_owned()
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
    pub fn render(&self, width: Option<usize>) -> String {
        let n = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
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
        let header: Vec<Cell> = self.header.iter().map(|h| Cell::styled(*h, BOLD)).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
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
            let mut s = serde_json::to_string_pretty(value).map_err(|e| CliError::Body {
                what: "output".into(),
                reason: e.to_string(),
            })?;
            s.push('\n');
            Ok(s)
        }
        Format::Yaml => yaml(value),
    }
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
