//! Splitting control text into positioned words.

use crate::Pos;

/// A word of control text and where it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token<'a> {
    pub text: &'a str,
    pub pos: Pos,
}

/// The words of one line, without its comment (`#` to end of line).
/// Columns count characters, from 1.
pub fn words(line: &str, line_no: u32) -> Vec<Token<'_>> {
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
    out
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
        let w = words("  add any\tff:ff:ff:ff:ff:ff # note", 3);
        let got: Vec<_> = w.iter().map(|t| (t.text, t.pos.column)).collect();
        assert_eq!(got, vec![("add", 3), ("any", 7), ("ff:ff:ff:ff:ff:ff", 11)]);
        assert!(w.iter().all(|t| t.pos.line == 3));
        assert!(words("# only a comment", 1).is_empty());
        assert_eq!(words("é x", 1)[1].pos.column, 3);
    }
}
