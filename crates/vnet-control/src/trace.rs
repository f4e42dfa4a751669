//! `trace from SRC [mac MAC] [ip IP] to IP [mac MAC] [icmp|tcp|udp [port P]] [size N]
//! [network N] [json]`: the way a frame would take through the vnetd asked
//! (`vnetctl trace`), every decision it would meet, with nothing sent.
//!
//! SRC is an interface's name, a MAC or an IP address: a local VM's, or,
//! on the far host, a VM's on another host (the frame then arrives by the
//! link the routes send that MAC to, its datagram saying network N). `ip`
//! and the second `mac` give the source's address and the destination's
//! MAC where no interface's `addresses` or `neigh` line names them; the
//! first `mac`, a source MAC other than the interface's (a spoofed one).

use std::fmt;
use std::net::IpAddr;
use vnet_wire::MacAddr;

/// Where the frame comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An interface, by name (its VM's MAC).
    Interface(String),
    Mac(MacAddr),
    Ip(IpAddr),
}

/// What the frame carries above IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum L4 {
    /// An echo request (what `ping` sends).
    #[default]
    Icmp,
    Tcp(u16),
    Udp(u16),
}

/// The most bytes a traced frame may have (the largest frame vnetd takes).
pub const MAX_SIZE: u32 = 65_535;
/// The fewest (an Ethernet frame's minimum, without its FCS).
pub const MIN_SIZE: u32 = 60;

/// What `trace` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceQuery {
    pub from: Source,
    /// The frame's source MAC when it is not the source's own: a VM that
    /// sends from another MAC than its interface's (port security).
    pub from_mac: Option<MacAddr>,
    /// The source's address, when nothing here names it.
    pub from_ip: Option<IpAddr>,
    pub to: IpAddr,
    /// The destination's MAC, when nothing here names it.
    pub to_mac: Option<MacAddr>,
    pub l4: L4,
    /// The frame's length in bytes, Ethernet header included (the least
    /// its headers take, and at least [`MIN_SIZE`], unless given).
    pub size: Option<u32>,
    /// The network: where addresses are looked up, and for a frame from
    /// another host, the network id its datagram says.
    pub network: Option<u32>,
    pub json: bool,
}

impl fmt::Display for TraceQuery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.from {
            Source::Interface(n) => write!(f, "trace from {n}")?,
            Source::Mac(m) => write!(f, "trace from {m}")?,
            Source::Ip(a) => write!(f, "trace from {a}")?,
        }
        if let Some(m) = self.from_mac {
            write!(f, " mac {m}")?;
        }
        if let Some(a) = self.from_ip {
            write!(f, " ip {a}")?;
        }
        write!(f, " to {}", self.to)?;
        if let Some(m) = self.to_mac {
            write!(f, " mac {m}")?;
        }
        match self.l4 {
            L4::Icmp => f.write_str(" icmp")?,
            L4::Tcp(p) => write!(f, " tcp port {p}")?,
            L4::Udp(p) => write!(f, " udp port {p}")?,
        }
        if let Some(s) = self.size {
            write!(f, " size {s}")?;
        }
        if let Some(n) = self.network {
            write!(f, " network {n}")?;
        }
        if self.json {
            f.write_str(" json")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ast::Command;

    fn one(line: &str) -> Command {
        let mut v = crate::parse(line).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert_eq!(v.len(), 1);
        v.remove(0).item
    }

    #[test]
    fn trace_parses_its_ends_protocol_size_and_network_and_writes_back_the_same() {
        let q = TraceQuery {
            from: Source::Interface("vm0".into()),
            from_mac: None,
            from_ip: None,
            to: "10.88.1.1".parse().unwrap(),
            to_mac: None,
            l4: L4::Icmp,
            size: None,
            network: None,
            json: false,
        };
        assert_eq!(one("trace from vm0 to 10.88.1.1"), Command::Trace(Box::new(q.clone())));
        let full = TraceQuery {
            from: Source::Mac("52:54:00:00:00:01".parse().unwrap()),
            from_mac: Some("02:00:00:00:99:99".parse().unwrap()),
            from_ip: Some("10.88.0.1".parse().unwrap()),
            to_mac: Some("52:54:00:00:00:02".parse().unwrap()),
            l4: L4::Udp(53),
            size: Some(1500),
            network: Some(7),
            json: true,
            ..q.clone()
        };
        let line = "trace from 52:54:00:00:00:01 mac 02:00:00:00:99:99 ip 10.88.0.1 to 10.88.1.1 mac 52:54:00:00:00:02 udp port 53 \
                    size 1500 network 7 json";
        assert_eq!(one(line), Command::Trace(Box::new(full.clone())));
        assert_eq!(full.to_string(), line.split_whitespace().collect::<Vec<_>>().join(" "));
        assert_eq!(one(&full.to_string()), Command::Trace(Box::new(full)));
        let v6 = one("trace from fd00::1 to fd00::2 tcp --network 3 --json");
        let Command::Trace(t) = v6 else { panic!() };
        assert_eq!((t.l4, t.network, t.json), (L4::Tcp(0), Some(3), true));
        assert_eq!(t.from, Source::Ip("fd00::1".parse().unwrap()));
        for bad in [
            "trace",
            "trace from vm0",
            "trace from vm0 to vm1",
            "trace from vm0 to 10.0.0.1 sctp",
            "trace from vm0 to 10.0.0.1 icmp port 3",
            "trace from vm0 to 10.0.0.1 udp port 70000",
            "trace from vm0 to 10.0.0.1 size 59",
            "trace from vm0 to 10.0.0.1 size 65536",
            "trace from vm0 to 10.0.0.1 extra",
            "trace from vm0 to 10.0.0.1 mac ff:ff:ff:ff:ff:ff",
            "trace from 10.0.0.1 to fd00::2",
        ] {
            assert!(crate::parse(bad).is_err(), "{bad}");
        }
        assert!(!one("trace from vm0 to 10.88.1.1").is_change());
    }
}
