//! The grammar of `trace` lines; what they ask is [`crate::trace`]'s.

use crate::ast::Command;
use crate::cursor::Parser;
use crate::lex::found;
use crate::trace::{Source, TraceQuery, L4, MAX_SIZE, MIN_SIZE};
use crate::{Error, Result};
use std::net::IpAddr;
use vnet_wire::MacAddr;

impl Parser<'_, '_> {
    /// `from SRC [ip IP] to IP [mac MAC] [icmp|tcp|udp [port P]] [size N]
    /// [network N] [json]` after `trace`.
    pub(crate) fn trace(&mut self) -> Result<Command> {
        self.keyword(&["from"], "`from`")?;
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
