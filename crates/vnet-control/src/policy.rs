//! Who may talk to whom inside a network (`docs/POLICY.md`):
//!
//! ```text
//! policy default allow|deny [network N]
//! rule NAME allow|deny [network N] [priority P] [from SEL] [to SEL]
//!      [ether ipv4|ipv6|arp|NUMBER] [proto tcp|udp|icmp|icmpv6|NUMBER] [port P[-Q]]
//! group NAME MAC
//! delete policy [network N] | delete rule NAME | delete group NAME MAC
//! ```
//!
//! SEL is `any`, `mac MAC`, `group NAME` or `net PREFIX`. A network with a
//! `policy` line or a rule is governed: its rules are tried by priority
//! (lower first, 100 unless given), then name, and the first that matches
//! decides; none matching leaves the default (`allow` unless a `policy`
//! line says `deny`). `port` needs `proto tcp` or `proto udp`.

use crate::{Error, Pos, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;
use vnet_wire::MacAddr;

/// Most rules in a network, and distinct groups the rules name in all.
pub const MAX_RULES: usize = 4096;
pub const MAX_GROUPS: usize = 64;
pub const DEFAULT_PRIORITY: u32 = 100;

/// Allow or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    Allow,
    Deny,
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if *self == Verb::Allow { "allow" } else { "deny" })
    }
}

/// One end of a frame, as a rule names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Sel {
    Any,
    Mac(MacAddr),
    Group(String),
    /// A prefix with no bits set past its length.
    Net(IpAddr, u8),
}

impl std::fmt::Display for Sel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sel::Any => f.write_str("any"),
            Sel::Mac(m) => write!(f, "mac {m}"),
            Sel::Group(g) => write!(f, "group {g}"),
            Sel::Net(ip, len) => write!(f, "net {ip}/{len}"),
        }
    }
}

/// A `rule` line's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleDef {
    pub name: String,
    pub verb: Verb,
    pub network: u32,
    pub priority: u32,
    pub from: Sel,
    pub to: Sel,
    pub ether: Option<u16>,
    pub proto: Option<u8>,
    pub ports: Option<(u16, u16)>,
}

fn ether_word(e: u16) -> String {
    match e {
        0x0800 => "ipv4".into(),
        0x86dd => "ipv6".into(),
        0x0806 => "arp".into(),
        e => format!("0x{e:04x}"),
    }
}

fn proto_word(p: u8) -> String {
    match p {
        6 => "tcp".into(),
        17 => "udp".into(),
        1 => "icmp".into(),
        58 => "icmpv6".into(),
        p => p.to_string(),
    }
}

impl RuleDef {
    /// The line that declares it.
    pub fn to_line(&self) -> String {
        let mut s = format!("rule {} {}", self.name, self.verb);
        if self.network != 0 {
            let _ = write!(s, " network {}", self.network);
        }
        if self.priority != DEFAULT_PRIORITY {
            let _ = write!(s, " priority {}", self.priority);
        }
        if self.from != Sel::Any {
            let _ = write!(s, " from {}", self.from);
        }
        if self.to != Sel::Any {
            let _ = write!(s, " to {}", self.to);
        }
        if let Some(e) = self.ether {
            let _ = write!(s, " ether {}", ether_word(e));
        }
        if let Some(p) = self.proto {
            let _ = write!(s, " proto {}", proto_word(p));
        }
        match self.ports {
            Some((a, b)) if a == b => {
                let _ = write!(s, " port {a}");
            }
            Some((a, b)) => {
                let _ = write!(s, " port {a}-{b}");
            }
            None => {}
        }
        s
    }

    /// What makes a rule one a policy can hold: a priority up to 65535, an
    /// EtherType (not a length), ports only for TCP and UDP, a range in
    /// order, a prefix without host bits.
    pub fn check(&self, pos: Pos) -> Result<()> {
        if self.priority > 65535 {
            return Err(Error::new(pos, "a priority (0-65535)", format!("`{}`", self.priority)));
        }
        if self.ether.is_some_and(|e| e < 0x0600) {
            return Err(Error::new(pos, "an EtherType (0x0600 or more)", "a length"));
        }
        if let Some((a, b)) = self.ports {
            if !matches!(self.proto, Some(6 | 17)) {
                return Err(Error::new(pos, "`proto tcp` or `proto udp` before `port`", "`port`"));
            }
            if a > b {
                return Err(Error::new(pos, "a port range low to high", format!("`{a}-{b}`")));
            }
        }
        for s in [&self.from, &self.to] {
            if let Sel::Net(ip, len) = *s {
                check_prefix(pos, ip, len)?;
            }
        }
        Ok(())
    }
}

/// A prefix whose address has no bits past its length.
pub fn check_prefix(pos: Pos, ip: IpAddr, len: u8) -> Result<()> {
    let ok = match ip {
        IpAddr::V4(a) => len <= 32 && u64::from(u32::from(a)) << len & 0xffff_ffff == 0,
        IpAddr::V6(a) => len <= 128 && (len == 128 || u128::from(a) << len == 0),
    };
    if !ok {
        return Err(Error::new(pos, "a prefix with no bits past its length", format!("`{ip}/{len}`")));
    }
    Ok(())
}

/// The declared policies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policies {
    /// Networks with a `policy` line, and its default.
    pub defaults: BTreeMap<u32, Verb>,
    pub rules: BTreeMap<String, RuleDef>,
    /// Group name -> its MACs.
    pub groups: BTreeMap<String, BTreeSet<MacAddr>>,
}

impl Policies {
    pub fn set_default(&mut self, network: u32, verb: Verb) {
        self.defaults.insert(network, verb);
    }

    pub fn remove_default(&mut self, pos: Pos, network: u32) -> Result<()> {
        match self.defaults.remove(&network) {
            Some(_) => Ok(()),
            None => Err(Error::new(pos, "a network with a `policy` line", format!("network {network}"))),
        }
    }

    /// `rule`: declares (or replaces) one, within the bounds.
    pub fn add_rule(&mut self, pos: Pos, r: &RuleDef) -> Result<()> {
        r.check(pos)?;
        let replacing = self.rules.get(&r.name).is_some_and(|o| o.network == r.network);
        if !replacing && self.rules.values().filter(|o| o.network == r.network).count() >= MAX_RULES {
            return Err(Error::new(pos, format!("at most {MAX_RULES} rules in a network"), "one more"));
        }
        let mut named: BTreeSet<&str> = self.rules.values().flat_map(RuleDef::groups).collect();
        named.extend(r.groups());
        if named.len() > MAX_GROUPS {
            return Err(Error::new(pos, format!("at most {MAX_GROUPS} groups named by rules"), "one more"));
        }
        self.rules.insert(r.name.clone(), r.clone());
        Ok(())
    }

    pub fn remove_rule(&mut self, pos: Pos, name: &str) -> Result<()> {
        match self.rules.remove(name) {
            Some(_) => Ok(()),
            None => Err(Error::new(pos, "a declared rule", format!("`{name}`"))),
        }
    }

    pub fn add_member(&mut self, group: &str, mac: MacAddr) {
        self.groups.entry(group.to_string()).or_default().insert(mac);
    }

    pub fn remove_member(&mut self, pos: Pos, group: &str, mac: MacAddr) -> Result<()> {
        let Some(g) = self.groups.get_mut(group).filter(|g| g.contains(&mac)) else {
            return Err(Error::new(pos, "a member of the group", format!("`{mac}` in `{group}`")));
        };
        g.remove(&mac);
        if g.is_empty() {
            self.groups.remove(group);
        }
        Ok(())
    }

    /// The networks that are governed: a `policy` line or a rule.
    pub fn networks(&self) -> BTreeSet<u32> {
        self.defaults.keys().copied().chain(self.rules.values().map(|r| r.network)).collect()
    }

    /// A network's rules in the order they are tried.
    pub fn ordered(&self, network: u32) -> Vec<&RuleDef> {
        let mut v: Vec<&RuleDef> = self.rules.values().filter(|r| r.network == network).collect();
        v.sort_by(|a, b| (a.priority, &a.name).cmp(&(b.priority, &b.name)));
        v
    }

    /// The declarations, as lines.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self.defaults.iter().map(|(&n, &v)| default_line(n, v)).collect();
        for (g, macs) in &self.groups {
            out.extend(macs.iter().map(|m| format!("group {g} {m}")));
        }
        out.extend(self.rules.values().map(RuleDef::to_line));
        out
    }

    /// The lines that turn `self` into `to`.
    pub fn diff(&self, to: &Policies) -> String {
        let mut t = String::new();
        for r in self.rules.keys().filter(|k| !to.rules.contains_key(*k)) {
            let _ = writeln!(t, "delete rule {r}");
        }
        for (g, macs) in &self.groups {
            for m in macs.iter().filter(|m| !to.groups.get(g).is_some_and(|t| t.contains(m))) {
                let _ = writeln!(t, "delete group {g} {m}");
            }
        }
        for &n in self.defaults.keys().filter(|n| !to.defaults.contains_key(n)) {
            let _ = writeln!(t, "delete policy{}", network_suffix(n));
        }
        for (&n, &v) in to.defaults.iter().filter(|(n, v)| self.defaults.get(n) != Some(v)) {
            let _ = writeln!(t, "{}", default_line(n, v));
        }
        for (g, macs) in &to.groups {
            for m in macs.iter().filter(|m| !self.groups.get(g).is_some_and(|s| s.contains(m))) {
                let _ = writeln!(t, "group {g} {m}");
            }
        }
        for r in to.rules.values().filter(|r| self.rules.get(&r.name) != Some(r)) {
            let _ = writeln!(t, "{}", r.to_line());
        }
        t
    }
}

impl RuleDef {
    /// The groups it names.
    pub fn groups(&self) -> impl Iterator<Item = &str> {
        [&self.from, &self.to].into_iter().filter_map(|s| match s {
            Sel::Group(g) => Some(g.as_str()),
            _ => None,
        })
    }
}

fn network_suffix(n: u32) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" network {n}")
    }
}

/// A `policy` line.
pub fn default_line(network: u32, verb: Verb) -> String {
    format!("policy default {verb}{}", network_suffix(network))
}

#[cfg(test)]
mod tests;
