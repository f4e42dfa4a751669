//! The grammar of `policy`, `rule` and `group` lines; the model they make
//! is [`crate::policy`]'s.

use crate::cursor::Parser;
use crate::lex::found;
use crate::policy::{check_prefix, RuleDef, Sel, Verb, DEFAULT_PRIORITY};
use crate::{Error, Result};
use std::collections::BTreeSet;
use std::net::IpAddr;

impl Parser<'_, '_> {
    pub(crate) fn verb(&mut self) -> Result<Verb> {
        Ok(if self.keyword(&["allow", "deny"], "`allow` or `deny`")? == "allow" {
            Verb::Allow
        } else {
            Verb::Deny
        })
    }

    /// `[network N]` at the end of a line.
    pub(crate) fn trailing_network(&mut self) -> Result<u32> {
        if self.peek().is_none() {
            return Ok(0);
        }
        self.keyword(&["network"], "`network` or the end of the line")?;
        self.number("a network id", 0..=u32::MAX)
    }

    fn selector(&mut self) -> Result<Sel> {
        match self.keyword(&["any", "mac", "group", "net"], "`any`, `mac`, `group` or `net`")? {
            "any" => Ok(Sel::Any),
            "mac" => Ok(Sel::Mac(self.mac("a MAC address")?)),
            "group" => Ok(Sel::Group(self.name("a group name")?)),
            _ => {
                let expected = "a prefix like 10.1.0.0/16 or fd00::/64";
                let pos = self.pos();
                let t = self.next(expected)?;
                let (ip, len) = t
                    .text
                    .split_once('/')
                    .and_then(|(a, l)| Some((a.parse::<IpAddr>().ok()?, l.parse::<u8>().ok()?)))
                    .ok_or_else(|| Error::new(pos, expected, found(Some(&t))))?;
                check_prefix(pos, ip, len)?;
                Ok(Sel::Net(ip, len))
            }
        }
    }

    fn ether(&mut self) -> Result<u16> {
        let expected = "`ipv4`, `ipv6`, `arp` or an EtherType like 0x88b5";
        let pos = self.pos();
        let t = self.next(expected)?;
        let n = match t.text {
            "ipv4" => Some(0x0800),
            "ipv6" => Some(0x86dd),
            "arp" => Some(0x0806),
            s => s.strip_prefix("0x").and_then(|h| u16::from_str_radix(h, 16).ok()).filter(|&e| e >= 0x0600),
        };
        n.ok_or_else(|| Error::new(pos, expected, found(Some(&t))))
    }

    fn proto(&mut self) -> Result<u8> {
        let expected = "`tcp`, `udp`, `icmp`, `icmpv6` or a protocol number (0-255)";
        let pos = self.pos();
        let t = self.next(expected)?;
        let n = match t.text {
            "tcp" => Some(6),
            "udp" => Some(17),
            "icmp" => Some(1),
            "icmpv6" => Some(58),
            s => s.parse::<u8>().ok(),
        };
        n.ok_or_else(|| Error::new(pos, expected, found(Some(&t))))
    }

    fn ports(&mut self) -> Result<(u16, u16)> {
        let expected = "a port or a range like 8000-8080";
        let pos = self.pos();
        let t = self.next(expected)?;
        let one = |s: &str| s.parse::<u16>().ok();
        let r = match t.text.split_once('-') {
            Some((a, b)) => one(a).zip(one(b)),
            None => one(t.text).map(|p| (p, p)),
        };
        r.ok_or_else(|| Error::new(pos, expected, found(Some(&t))))
    }

    /// A `policy`, `rule` or `group` line after its keyword `kw`.
    pub(crate) fn policy_line(&mut self, kw: &str) -> Result<crate::Command> {
        match kw {
            "policy" => {
                self.keyword(&["default"], "`default`")?;
                let verb = self.verb()?;
                Ok(crate::Command::Policy { network: self.trailing_network()?, verb })
            }
            "rule" => Ok(crate::Command::Rule(Box::new(self.rule()?))),
            _ => {
                let name = self.name("a group name")?;
                Ok(crate::Command::Group { name, mac: self.mac("a MAC address")? })
            }
        }
    }

    /// A `rule` line after its keyword.
    pub(crate) fn rule(&mut self) -> Result<RuleDef> {
        let pos = self.pos();
        let name = self.name("a rule name")?;
        let verb = self.verb()?;
        let mut r = RuleDef {
            name,
            verb,
            network: 0,
            priority: DEFAULT_PRIORITY,
            from: Sel::Any,
            to: Sel::Any,
            ether: None,
            proto: None,
            ports: None,
        };
        let words = ["network", "priority", "from", "to", "ether", "proto", "port"];
        let mut seen = BTreeSet::new();
        let mut port_at = pos;
        while self.peek().is_some() {
            let at = self.pos();
            let w = self.keyword(
                &words,
                "`network`, `priority`, `from`, `to`, `ether`, `proto`, `port` or the end of the line",
            )?;
            if !seen.insert(w) {
                return Err(Error::new(at, "each of a rule's words once", format!("a second `{w}`")));
            }
            match w {
                "network" => r.network = self.number("a network id", 0..=u32::MAX)?,
                "priority" => r.priority = self.number("a priority (0-65535)", 0..=65535)?,
                "from" => r.from = self.selector()?,
                "to" => r.to = self.selector()?,
                "ether" => r.ether = Some(self.ether()?),
                "proto" => r.proto = Some(self.proto()?),
                _ => {
                    port_at = at;
                    r.ports = Some(self.ports()?);
                }
            }
        }
        r.check(port_at)?;
        Ok(r)
    }
}
