//! The parser's cursor: a line's tokens and the primitives every rule of
//! the grammar reads them with (a word, a keyword of a list, a number in
//! a range, a name, a MAC, an endpoint), each failing with the position
//! and what was expected.

use crate::lex::{found, Token};
use crate::{Error, Pos, Result};
use std::net::{IpAddr, SocketAddr};
use vnet_model::MacSpec;
use vnet_wire::MacAddr;

/// A cursor over one line's tokens: what every part of the grammar reads
/// with (the commands' in `parse`, the link kinds' in `transport`).
pub(crate) struct Parser<'t, 'a> {
    pub(crate) toks: &'t [Token<'a>],
    pub(crate) at: usize,
    eol: Pos,
}

impl<'t, 'a> Parser<'t, 'a> {
    /// A cursor at the first of `toks`; `eol` is where the line ends.
    pub(crate) fn new(toks: &'t [Token<'a>], eol: Pos) -> Self {
        Parser { toks, at: 0, eol }
    }

    pub(crate) fn peek(&self) -> Option<&Token<'a>> {
        self.toks.get(self.at)
    }

    pub(crate) fn pos(&self) -> Pos {
        self.peek().map_or(self.eol, |t| t.pos)
    }

    pub(crate) fn err<T>(&self, expected: &str) -> Result<T> {
        Err(Error::new(self.pos(), expected, found(self.peek())))
    }

    pub(crate) fn next(&mut self, expected: &str) -> Result<Token<'a>> {
        match self.peek() {
            Some(t) => {
                let t = *t;
                self.at += 1;
                Ok(t)
            }
            None => self.err(expected),
        }
    }

    /// Takes the next word if it is one of `kws`.
    pub(crate) fn keyword(&mut self, kws: &[&'static str], expected: &str) -> Result<&'static str> {
        match self.peek().and_then(|t| kws.iter().find(|k| **k == t.text)) {
            Some(k) => {
                self.at += 1;
                Ok(k)
            }
            None => self.err(expected),
        }
    }

    pub(crate) fn eat(&mut self, kw: &str) -> bool {
        if self.peek().is_some_and(|t| t.text == kw) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    pub(crate) fn end(&self) -> Result<()> {
        match self.peek() {
            None => Ok(()),
            Some(_) => self.err("end of line"),
        }
    }

    pub(crate) fn parsed<T: std::str::FromStr>(&mut self, expected: &str) -> Result<T> {
        let pos = self.pos();
        let t = self.next(expected)?;
        t.text.parse().map_err(|_| Error::new(pos, expected, found(Some(&t))))
    }

    pub(crate) fn number(&mut self, expected: &str, range: std::ops::RangeInclusive<u32>) -> Result<u32> {
        let pos = self.pos();
        let t = self.next(expected)?;
        match t.text.parse::<u32>() {
            Ok(n) if range.contains(&n) => Ok(n),
            _ => Err(Error::new(pos, expected, found(Some(&t)))),
        }
    }

    pub(crate) fn name(&mut self, what: &str) -> Result<String> {
        let expected = format!("{what} (a letter, then letters, digits, `_`, `-` or `.`)");
        let pos = self.pos();
        let t = self.next(&expected)?;
        let ok = t.text.len() <= 64
            && t.text.starts_with(|c: char| c.is_ascii_alphabetic())
            && t.text.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
            && !matches!(t.text, "any" | "none" | "from" | "link" | "interface");
        if ok {
            Ok(t.text.to_string())
        } else {
            Err(Error::new(pos, expected, found(Some(&t))))
        }
    }

    /// An etcd user name: names (letters, digits, `_`, `-`, `.`) joined by
    /// `/`, a letter first, as `vnetctl network approve` makes them
    /// (`vnet/NETWORK/HOST`).
    pub(crate) fn etcd_user(&mut self) -> Result<String> {
        let expected =
            "an etcd user name (parts of letters, digits, `_`, `-` or `.` joined by `/`, a letter first)";
        let pos = self.pos();
        let t = self.next(expected)?;
        let part =
            |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        let ok = t.text.len() <= 200
            && t.text.starts_with(|c: char| c.is_ascii_alphabetic())
            && t.text.split('/').all(part);
        if ok {
            Ok(t.text.to_string())
        } else {
            Err(Error::new(pos, expected, found(Some(&t))))
        }
    }

    pub(crate) fn mac(&mut self, expected: &str) -> Result<MacAddr> {
        self.parsed(expected)
    }

    pub(crate) fn mac_spec(&mut self, which: &str) -> Result<MacSpec> {
        let expected = format!("{which} MAC: an address, `any`, `none` or `not-ADDRESS`");
        let pos = self.pos();
        let t = self.next(&expected)?;
        let spec = match t.text {
            "any" => Some(MacSpec::Any),
            "none" => Some(MacSpec::None),
            s => match s.strip_prefix("not-") {
                Some(a) => a.parse().ok().map(MacSpec::Not),
                None => s.parse().ok().map(MacSpec::Addr),
            },
        };
        spec.ok_or_else(|| Error::new(pos, expected, found(Some(&t))))
    }

    /// `IP[:PORT]` or `[IPv6]:PORT`, port defaulting to 9000.
    /// `IP` or `IP:PORT` (`[IPv6]:PORT`); `IP` alone takes `default_port`.
    pub(crate) fn endpoint(&mut self, default_port: u16) -> Result<SocketAddr> {
        let expected = "an address like 10.0.0.2 or 10.0.0.2:9000";
        let pos = self.pos();
        let t = self.next(expected)?;
        if let Ok(sa) = t.text.parse::<SocketAddr>() {
            return Ok(sa);
        }
        match t.text.parse::<IpAddr>() {
            Ok(ip) => Ok(SocketAddr::new(ip, default_port)),
            Err(_) => Err(Error::new(pos, expected, found(Some(&t)))),
        }
    }
}
