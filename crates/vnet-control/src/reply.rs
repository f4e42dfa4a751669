//! The reply to one control line (`docs/control.md`), as vnetd sends it
//! and its clients read it: body lines (the data: a table, JSON, what was
//! done), then exactly one closing line, `end ok` or `end error MESSAGE`
//! (a position `LINE:COLUMN: ` first when the error points into the text).
//! Encoded ([`Reply::encode`]) and decoded ([`Reply::closing`]) here only.

use crate::Pos;
use core::fmt;

/// What vnetd said when it refused a line or a transaction: the text of
/// its `end error` line (a position and what was expected, `docs/control.md`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

impl Refused {
    /// The position the message starts with (`LINE:COLUMN: `), if any.
    pub fn pos(&self) -> Option<Pos> {
        let (line, rest) = self.0.split_once(':')?;
        let (column, _) = rest.split_once(": ")?;
        Some(Pos { line: line.parse().ok()?, column: column.parse().ok()? })
    }
}

/// The answer to one line: its body, and how it closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub body: String,
    /// `Err` for `end error MESSAGE`.
    pub result: Result<(), Refused>,
}

impl Reply {
    /// `end ok` with no body.
    pub fn ok() -> Reply {
        Reply::data(String::new())
    }

    /// `body`, then `end ok`.
    pub fn data(body: impl Into<String>) -> Reply {
        Reply { body: body.into(), result: Ok(()) }
    }

    /// `end error` with `e`'s text (a positioned [`crate::Error`] says its
    /// position first), no body.
    pub fn error(e: impl fmt::Display) -> Reply {
        Reply { body: String::new(), result: Err(Refused(e.to_string())) }
    }

    /// The closing line, without its newline.
    pub fn end_line(&self) -> String {
        match &self.result {
            Ok(()) => "end ok".to_string(),
            Err(e) => format!("end error {e}"),
        }
    }

    /// The reply as sent: the body (each line ended), then the closing line.
    pub fn encode(&self) -> String {
        let mut out = self.body.clone();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&self.end_line());
        out.push('\n');
        out
    }

    /// How a reply closed, if `line` (its newline trimmed or not) is a
    /// closing line; a closing line this version does not know is an error.
    pub fn closing(line: &str) -> Option<Result<(), Refused>> {
        let rest = line.strip_prefix("end ")?.trim_end_matches(['\n', '\r']);
        Some(match rest.strip_prefix("error ") {
            Some(m) => Err(Refused(m.to_string())),
            None if rest == "ok" => Ok(()),
            None => Err(Refused(format!("unexpected reply `{rest}`"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_decodes_as_it_was_encoded() {
        let e = crate::parse("listen udp nowhere").unwrap_err();
        for r in [Reply::ok(), Reply::data("a\nb"), Reply::data("a\n"), Reply::error(&e), Reply::error("no")]
        {
            let text = r.encode();
            let (body, end) = text.trim_end_matches('\n').rsplit_once('\n').unwrap_or(("", text.trim_end()));
            assert_eq!(Reply::closing(end), Some(r.result.clone()), "{text:?}");
            assert_eq!(body.trim_end(), r.body.trim_end(), "{text:?}");
        }
        assert_eq!(Reply::error(&e).result.unwrap_err().pos(), Some(e.pos));
        assert_eq!(Reply::error("no").result.unwrap_err().pos(), None);
        assert_eq!(Reply::closing("end maybe"), Some(Err(Refused("unexpected reply `maybe`".into()))));
        assert_eq!(Reply::closing("ended"), None);
    }
}
