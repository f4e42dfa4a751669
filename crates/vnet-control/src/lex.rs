//! Splitting control text into positioned words.
//!
//! A word is a run of characters other than white space; `#` starts a
//! comment that runs to the end of the line. A control character (U+0000
//! to U+001F but tab, and U+007F) is refused wherever it stands, comment
//! included: no value can carry a line break, a carriage return or an
//! escape sequence into a command, a log line or a terminal
//! (`docs/SECURITY.md`, "Typed requests").

use crate::{Error, Pos};

/// A word of control text and where it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token<'a> {
    pub text: &'a str,
    pub pos: Pos,
}

/// Whether `c` may stand in control text: not a control character
/// other than tab.
pub fn allowed(c: char) -> bool {
    c == '\t' || !(c < ' ' || c == '\u{7f}')
}

/// The words of one line, without its comment (`#` to end of line).
/// Columns count characters, from 1. A control character anywhere in the
/// line is an error at its column.
pub fn words(line: &str, line_no: u32) -> Result<Vec<Token<'_>>, Error> {
    if let Some((i, c)) = line.chars().enumerate().find(|(_, c)| !allowed(*c)) {
        let pos = Pos { line: line_no, column: i as u32 + 1 };
        return Err(Error::new(pos, "text without control characters", format!("`{}`", c.escape_debug())));
    }
    let line = match line.find('#') {
        Some(i) => &line[..i],
        None => line,
    };
    let mut out = Vec::new();
    let mut start: Option<(usize, u32)> = None;
    let mut col = 0u32;
    for (i, c) in line.char_indices() {
        col += 1;
        if c.is_whitespace() {
            if let Some((s, sc)) = start.take() {
                out.push(Token { text: &line[s..i], pos: Pos { line: line_no, column: sc } });
            }
        } else if start.is_none() {
            start = Some((i, col));
        }
    }
    if let Some((s, sc)) = start {
        out.push(Token { text: &line[s..], pos: Pos { line: line_no, column: sc } });
    }
    Ok(out)
}

/// Describes a found word for an error message.
pub fn found(t: Option<&Token<'_>>) -> String {
    match t {
        Some(t) => format!("`{}`", t.text.escape_debug()),
        None => "end of line".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_and_comments() {
        let w = words("  add any\tff:ff:ff:ff:ff:ff # note", 3).unwrap();
        let got: Vec<_> = w.iter().map(|t| (t.text, t.pos.column)).collect();
        assert_eq!(got, vec![("add", 3), ("any", 7), ("ff:ff:ff:ff:ff:ff", 11)]);
        assert!(w.iter().all(|t| t.pos.line == 3));
        assert!(words("# only a comment", 1).unwrap().is_empty());
        assert_eq!(words("é x", 1).unwrap()[1].pos.column, 3);
    }

    #[test]
    fn control_characters_are_refused_where_they_stand_comments_included() {
        for (line, col) in [
            ("detach a\rlink x", 9),
            ("é\u{1b}[2J", 2),
            ("show links # \u{0}", 14),
            ("x\u{7f}", 2),
            ("a\nb", 2),
        ] {
            let e = words(line, 4).unwrap_err();
            assert_eq!((e.pos.line, e.pos.column), (4, col), "{line:?}: {e}");
            assert!(e.to_string().contains("without control characters"), "{e}");
        }
        assert_eq!(words("a\tb", 1).unwrap().len(), 2, "tab separates words");
    }
}
