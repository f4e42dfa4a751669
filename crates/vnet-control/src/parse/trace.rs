//! The grammar of `trace` lines; what they ask is [`crate::trace`]'s.

use crate::ast::Command;
use crate::cursor::Parser;
use crate::lex::{found, Token};
use crate::trace::{Source, TraceHex, TraceQuery, L4, MAX_HEX_FRAME, MAX_SIZE, MIN_SIZE};
use crate::{Error, Pos, Result};
use std::net::IpAddr;
use vnet_wire::MacAddr;

impl Parser<'_, '_> {
    /// `from SRC [ip IP] to IP [mac MAC] [icmp|tcp|udp [port P]] [size N]
    /// [network N] [json]` after `trace`, or `hex HEX [in NAME|MAC]
    /// [network N] [json]`.
    pub(crate) fn trace(&mut self) -> Result<Command> {
        if self.eat("hex") {
            return self.trace_hex();
        }
        self.keyword(&["from"], "`from` (a frame described) or `hex` (a frame's bytes)")?;
        let from = self.trace_source()?;
        let from_mac = match self.eat("mac") {
            true => Some(self.unicast_mac("the frame's source MAC")?),
            false => None,
        };
        let from_ip = match self.eat("ip") {
            true => Some(self.parsed::<IpAddr>("the source's IP address")?),
            false => None,
        };
        self.keyword(&["to"], "`to` and the destination's IP address")?;
        let pos = self.pos();
        let to: IpAddr = self.parsed("the destination's IP address")?;
        let family = match &from {
            Source::Ip(a) => Some(*a),
            _ => from_ip,
        };
        if family.is_some_and(|a| a.is_ipv4() != to.is_ipv4()) {
            return Err(Error::new(pos, "an address of the source's family", to.to_string()));
        }
        let to_mac = match self.eat("mac") {
            true => Some(self.unicast_mac("the destination's MAC")?),
            false => None,
        };
        let l4 = self.trace_l4()?;
        let size = match self.eat("size") {
            true => Some(self.number("a frame size in bytes (60-65535)", MIN_SIZE..=MAX_SIZE)?),
            false => None,
        };
        let network = match self.eat("network") || self.eat("--network") {
            true => Some(self.number("a network id", 0..=u32::MAX)?),
            false => None,
        };
        let json = self.eat("json") || self.eat("--json");
        Ok(Command::Trace(Box::new(TraceQuery {
            from,
            from_mac,
            from_ip,
            to,
            to_mac,
            l4,
            size,
            network,
            json,
        })))
    }

    /// `HEX [in NAME|MAC] [network N] [json]` after `trace hex`.
    fn trace_hex(&mut self) -> Result<Command> {
        let expected = "the frame's bytes as hex digits, Ethernet header first";
        let t = self.next(expected)?;
        let frame = hex_frame(t)?;
        let via = match self.eat("in") {
            true => match self.trace_source()? {
                Source::Ip(_) => {
                    self.at -= 1;
                    return self.err("an interface's name or a MAC");
                }
                s => Some(s),
            },
            false => None,
        };
        let network = match self.eat("network") || self.eat("--network") {
            true => Some(self.number("a network id", 0..=u32::MAX)?),
            false => None,
        };
        let json = self.eat("json") || self.eat("--json");
        Ok(Command::TraceHex(Box::new(TraceHex { frame, via, network, json })))
    }

    fn unicast_mac(&mut self, what: &str) -> Result<MacAddr> {
        let pos = self.pos();
        let m: MacAddr = self.mac(what)?;
        if m.is_group() {
            return Err(Error::new(pos, "a unicast MAC", m.to_string()));
        }
        Ok(m)
    }

    /// An interface's name, a MAC or an IP address.
    fn trace_source(&mut self) -> Result<Source> {
        let expected = "an interface's name, a MAC or an IP address";
        let Some(t) = self.peek().copied() else { return self.err(expected) };
        if let Ok(a) = t.text.parse::<IpAddr>() {
            self.at += 1;
            return Ok(Source::Ip(a));
        }
        if t.text.contains(':') {
            let pos = self.pos();
            return match t.text.parse::<MacAddr>() {
                Ok(m) if !m.is_group() => {
                    self.at += 1;
                    Ok(Source::Mac(m))
                }
                _ => Err(Error::new(pos, expected, found(Some(&t)))),
            };
        }
        Ok(Source::Interface(self.name(expected)?))
    }

    /// `[icmp|tcp|udp [port P]]`.
    fn trace_l4(&mut self) -> Result<L4> {
        let proto = match self.peek().map(|t| t.text) {
            Some("icmp") | Some("tcp") | Some("udp") => self.keyword(&["icmp", "tcp", "udp"], "")?,
            _ => return Ok(L4::Icmp),
        };
        if proto == "icmp" {
            return Ok(L4::Icmp);
        }
        let port = match self.eat("port") {
            true => self.number("a port (0-65535)", 0..=65535)? as u16,
            false => 0,
        };
        Ok(if proto == "tcp" { L4::Tcp(port) } else { L4::Udp(port) })
    }
}

/// A `trace hex` word's bytes: hex digits, two a byte, a whole frame (see
/// [`crate::trace::truncation`]); an error at the column of the first
/// digit that is not one, or of the header cut short.
fn hex_frame(t: Token<'_>) -> Result<Vec<u8>> {
    let at = |i: usize| Pos { line: t.pos.line, column: t.pos.column + i as u32 };
    let mut digits = Vec::with_capacity(t.text.len());
    for (i, c) in t.text.chars().enumerate() {
        match c.to_digit(16) {
            Some(d) => digits.push(d as u8),
            None => {
                return Err(Error::new(at(i), "a hex digit (0-9, a-f)", format!("`{}`", c.escape_debug())))
            }
        }
    }
    if digits.len() % 2 == 1 {
        let found = format!("{} digits (the last byte has one)", digits.len());
        return Err(Error::new(at(digits.len() - 1), "two hex digits a byte", found));
    }
    if digits.len() / 2 > MAX_HEX_FRAME {
        let found = format!("{} bytes", digits.len() / 2);
        return Err(Error::new(t.pos, format!("a frame of at most {MAX_HEX_FRAME} bytes"), found));
    }
    let frame: Vec<u8> = digits.chunks(2).map(|p| p[0] << 4 | p[1]).collect();
    if let Some((byte, what, have)) = crate::trace::truncation(&frame) {
        let found = format!("{have} bytes from byte {byte}: the frame is cut short");
        return Err(Error::new(at(2 * byte), format!("{what} at byte {byte}"), found));
    }
    Ok(frame)
}
