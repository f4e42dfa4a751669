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
//!
//! `trace hex HEX [in NAME|MAC] [network N] [json]`: the frame itself, as
//! hex digits (Ethernet header first), coming in by interface NAME or the
//! one whose VM has MAC (else the frame's source MAC's: a local VM's, or
//! the link the routes send it to). Refused when it is not hex, or cut
//! short: a header the frame announces (Ethernet, IPv4 or IPv6 and the
//! length it says, ARP, TCP, UDP, ICMP) that does not fit, found with the
//! data path's parsers ([`truncation`]), the error at that header's column.

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

/// The most bytes a `trace hex` frame may have: its hex fits a control
/// line (64 KiB) twice over.
pub const MAX_HEX_FRAME: usize = 16 * 1024;

/// What `trace hex` asks for: the frame as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceHex {
    /// The frame, Ethernet header first, at least its headers whole.
    pub frame: Vec<u8>,
    /// Where it comes in: an interface by name, or the one (or the link)
    /// of a MAC; the frame's source MAC's unless given.
    pub via: Option<Source>,
    /// For a frame from another host, the network id its datagram says.
    pub network: Option<u32>,
    pub json: bool,
}

impl fmt::Display for TraceHex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("trace hex ")?;
        for b in &self.frame {
            write!(f, "{b:02x}")?;
        }
        match &self.via {
            Some(Source::Interface(n)) => write!(f, " in {n}")?,
            Some(Source::Mac(m)) => write!(f, " in {m}")?,
            Some(Source::Ip(a)) => write!(f, " in {a}")?,
            None => {}
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

/// Where `frame` is cut short, read with the data path's parsers
/// (`vnet_wire`'s views): the byte the header that does not fit starts
/// at, what it needs, and how many bytes are there from it. `None` for a
/// frame whose headers are whole (or which nothing here reads further:
/// another EtherType, a later fragment, an IPv6 extension header; the
/// trace says what the data path makes of those).
pub fn truncation(f: &[u8]) -> Option<(usize, String, usize)> {
    use vnet_wire::ip::{Ipv4Packet, Ipv6Packet};
    use vnet_wire::{Error as Wire, EthernetFrame};
    let short = |at: usize, what: &str, need: usize| {
        Some((at, format!("{what} ({need} bytes)"), f.len().saturating_sub(at)))
    };
    if let Err(Wire::Truncated { need, .. }) = EthernetFrame::new_checked(f) {
        return short(0, "an Ethernet header", need);
    }
    let at = vnet_wire::ethernet::HEADER_LEN;
    let be16 = |i: usize| f.get(i..i + 2).map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
    let (proto, l4, end) = match be16(12) {
        0x0800 => match Ipv4Packet::new_checked(&f[at..]) {
            Err(Wire::Truncated { need, .. }) => return short(at, "an IPv4 header", need),
            Err(_) => return None,
            Ok(p) => {
                let total = be16(at + 2);
                if at + total > f.len() {
                    return short(at, "the IPv4 packet its total length says", total);
                }
                if be16(at + 6) & 0x1fff != 0 {
                    return None; // a later fragment: no transport header
                }
                (p.protocol(), at + p.header_len(), at + total)
            }
        },
        0x86dd => match Ipv6Packet::new_checked(&f[at..]) {
            Err(Wire::Truncated { need, .. }) => return short(at, "an IPv6 header", need),
            Err(_) => return None,
            Ok(p) => {
                let total = 40 + be16(at + 4);
                if at + total > f.len() {
                    return short(at, "the IPv6 packet its payload length says", total);
                }
                (p.next_header(), at + 40, at + total)
            }
        },
        0x0806 if f.len() < at + vnet_wire::arp::LEN => {
            return short(at, "an ARP packet", vnet_wire::arp::LEN)
        }
        _ => return None,
    };
    let (what, need) = match proto {
        vnet_wire::ip::PROTO_TCP => ("a TCP header", 20),
        vnet_wire::ip::PROTO_UDP => ("a UDP header", 8),
        1 | 58 => ("an ICMP header", 8),
        _ => return None,
    };
    let have = end.saturating_sub(l4);
    (have < need).then(|| (l4, format!("{what} ({need} bytes)"), have))
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

    /// A UDP frame 52:54:00:00:00:01 10.0.0.1 > 52:54:00:00:00:02 10.0.0.2 port 53, 60 bytes.
    fn udp_hex() -> String {
        let mut f = vec![0x52, 0x54, 0, 0, 0, 2, 0x52, 0x54, 0, 0, 0, 1, 0x08, 0x00];
        f.extend_from_slice(&[0x45, 0, 0, 28, 0, 1, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend_from_slice(&[0x9c, 0x40, 0, 53, 0, 8, 0, 0]);
        f.resize(60, 0);
        f.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn refused(line: &str) -> crate::Error {
        crate::parse(line).err().unwrap_or_else(|| panic!("{line}: accepted"))
    }

    #[test]
    fn trace_hex_takes_a_whole_frame_and_writes_back_the_same() {
        let hex = udp_hex();
        let Command::Trace(_) = one("trace from vm0 to 10.0.0.2") else { panic!() };
        let Command::TraceHex(t) = one(&format!("trace hex {hex}")) else { panic!() };
        assert_eq!(
            (t.frame.len(), t.frame[23], t.via.clone(), t.network, t.json),
            (60, 17, None, None, false)
        );
        let line = format!("trace hex {hex} in vm0 network 7 json");
        let Command::TraceHex(t) = one(&line) else { panic!() };
        assert_eq!(
            (t.via.clone(), t.network, t.json),
            (Some(Source::Interface("vm0".into())), Some(7), true)
        );
        assert_eq!(t.to_string(), line, "written back the same");
        let upper = format!("trace hex {} in 52:54:00:00:00:01", hex.to_uppercase());
        let Command::TraceHex(u) = one(&upper) else { panic!() };
        assert_eq!(u.frame, t.frame);
        assert_eq!(u.via, Some(Source::Mac("52:54:00:00:00:01".parse().unwrap())));
        assert!(!one(&line).is_change());
        // Another EtherType: only its Ethernet header is read.
        assert!(crate::parse("trace hex 02000000000202000000000188b5").is_ok());
        let req = crate::request::Request::trace_hex(*t.clone()).unwrap();
        assert_eq!(req.line(), line);
    }

    #[test]
    fn a_bad_hex_or_a_frame_cut_short_is_refused_at_its_column() {
        let hex = udp_hex();
        // `trace hex ` is 10 characters: the frame's first digit is column 11.
        let e = refused(&format!("trace hex {}zz{}", &hex[..6], &hex[8..]));
        assert_eq!((e.pos.column, e.found.as_str()), (17, "`z`"), "{e}");
        assert!(e.to_string().contains("expected a hex digit"), "{e}");
        let e = refused(&format!("trace hex {}", &hex[..hex.len() - 1]));
        assert!(e.expected.contains("two hex digits a byte"), "{e}");
        // Cut in the Ethernet header, in the IPv4 header, in the UDP header.
        let e = refused("trace hex 525400000002525400");
        assert_eq!(e.pos.column, 11, "{e}");
        assert!(e.expected.contains("an Ethernet header (14 bytes)") && e.found.contains("9 bytes"), "{e}");
        let e = refused(&format!("trace hex {}", &hex[..2 * 30]));
        assert_eq!(e.pos.column, 11 + 2 * 14, "{e}");
        assert!(
            e.expected.contains("IPv4 header (20 bytes) at byte 14") && e.found.contains("cut short"),
            "{e}"
        );
        let e = refused(&format!("trace hex {}", &hex[..2 * 40]));
        assert_eq!(e.pos.column, 11 + 2 * 14, "the packet its total length says: {e}");
        assert!(e.expected.contains("total length says (28 bytes)"), "{e}");
        // An IPv4 header saying 24 bytes in all: the UDP header (8) does not fit.
        let mut short = hex.clone();
        short.replace_range(32..36, "0018");
        let e = refused(&format!("trace hex {short}"));
        assert_eq!(e.pos.column, 11 + 2 * 34, "{e}");
        assert!(
            e.expected.contains("a UDP header (8 bytes) at byte 34") && e.found.contains("4 bytes"),
            "{e}"
        );
        // The control: the whole frame, and a later fragment (no UDP header to read).
        assert!(crate::parse(&format!("trace hex {hex}")).is_ok());
        let mut frag = short.clone();
        frag.replace_range(40..44, "0001");
        assert!(crate::parse(&format!("trace hex {frag}")).is_ok(), "a later fragment");
        // IPv6: a header cut short.
        let v6 = "33330000000152540000000186dd6000000000083a40fd00";
        let e = refused(&format!("trace hex {v6}"));
        assert!(e.expected.contains("an IPv6 header (40 bytes) at byte 14"), "{e}");
        // `in` names an interface or a MAC; too big a frame.
        assert!(refused(&format!("trace hex {hex} in 10.0.0.1"))
            .expected
            .contains("an interface's name or a MAC"));
        let big = "00".repeat(MAX_HEX_FRAME + 1);
        assert!(refused(&format!("trace hex {big}")).expected.contains("at most 16384 bytes"));
        let e = refused("trace hex");
        assert!(e.expected.contains("hex digits"), "{e}");
        let t = TraceHex { frame: vec![0; 10], via: None, network: None, json: false };
        assert!(crate::request::Request::trace_hex(t).is_err(), "a typed request is checked as a line is");
    }
}
