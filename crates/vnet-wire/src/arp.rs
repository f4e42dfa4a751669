//! ARP and RARP over Ethernet for IPv4 (RFC 826, RFC 903): what the data
//! path reads of an ARP frame, and the RARP announcement a relocated VM's
//! new host broadcasts (as QEMU does after a migration) so that learning
//! switches and caches on the way re-learn where the MAC lives.

use crate::ethernet::{EtherType, HEADER_LEN as ETH_LEN};
use crate::{Error, MacAddr, Result};

mod field {
    use core::ops::Range;
    pub const HTYPE: Range<usize> = 0..2;
    pub const PTYPE: Range<usize> = 2..4;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: Range<usize> = 6..8;
    pub const SHA: Range<usize> = 8..14;
    pub const SPA: Range<usize> = 14..18;
    pub const THA: Range<usize> = 18..24;
    pub const TPA: Range<usize> = 24..28;
}

/// Length of an Ethernet/IPv4 ARP body.
pub const LEN: usize = 28;
/// The EtherType of RARP.
pub const ETHERTYPE_RARP: u16 = 0x8035;
/// The smallest Ethernet frame (without FCS): announcements are padded to it.
pub const MIN_FRAME: usize = 60;

/// ARP operations; others are data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Request,
    Reply,
    ReverseRequest,
    ReverseReply,
    Unknown(u16),
}

impl From<u16> for Operation {
    fn from(v: u16) -> Self {
        match v {
            1 => Operation::Request,
            2 => Operation::Reply,
            3 => Operation::ReverseRequest,
            4 => Operation::ReverseReply,
            x => Operation::Unknown(x),
        }
    }
}

impl From<Operation> for u16 {
    fn from(o: Operation) -> u16 {
        match o {
            Operation::Request => 1,
            Operation::Reply => 2,
            Operation::ReverseRequest => 3,
            Operation::ReverseReply => 4,
            Operation::Unknown(x) => x,
        }
    }
}

/// A view of an ARP body (the Ethernet payload).
#[derive(Debug, Clone, Copy)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    /// Checks that this is Ethernet/IPv4 ARP (hardware type 1, protocol
    /// 0x0800, lengths 6 and 4) and that it is long enough.
    pub fn new_checked(buf: T) -> Result<Self> {
        let b = buf.as_ref();
        if b.len() < LEN {
            return Err(Error::Truncated { need: LEN, have: b.len() });
        }
        if b[field::HTYPE] != [0, 1]
            || b[field::PTYPE] != [8, 0]
            || b[field::HLEN] != 6
            || b[field::PLEN] != 4
        {
            return Err(Error::Malformed("arp types"));
        }
        Ok(ArpPacket { buf })
    }

    fn mac(&self, r: core::ops::Range<usize>) -> MacAddr {
        let mut m = [0u8; 6];
        m.copy_from_slice(&self.buf.as_ref()[r]);
        MacAddr(m)
    }
    fn ip(&self, r: core::ops::Range<usize>) -> [u8; 4] {
        let mut a = [0u8; 4];
        a.copy_from_slice(&self.buf.as_ref()[r]);
        a
    }
    pub fn operation(&self) -> Operation {
        let s = &self.buf.as_ref()[field::OPER];
        Operation::from(u16::from_be_bytes([s[0], s[1]]))
    }
    pub fn sender_mac(&self) -> MacAddr {
        self.mac(field::SHA)
    }
    pub fn sender_ip(&self) -> [u8; 4] {
        self.ip(field::SPA)
    }
    pub fn target_mac(&self) -> MacAddr {
        self.mac(field::THA)
    }
    pub fn target_ip(&self) -> [u8; 4] {
        self.ip(field::TPA)
    }
}

/// The parsed ARP body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRepr {
    pub operation: Operation,
    pub sender_mac: MacAddr,
    pub sender_ip: [u8; 4],
    pub target_mac: MacAddr,
    pub target_ip: [u8; 4],
}

impl ArpRepr {
    pub fn parse<T: AsRef<[u8]>>(p: &ArpPacket<T>) -> ArpRepr {
        ArpRepr {
            operation: p.operation(),
            sender_mac: p.sender_mac(),
            sender_ip: p.sender_ip(),
            target_mac: p.target_mac(),
            target_ip: p.target_ip(),
        }
    }

    /// Writes the body into `out[..LEN]`; `None` if `out` is shorter.
    pub fn emit(&self, out: &mut [u8]) -> Option<()> {
        let b = out.get_mut(..LEN)?;
        b[field::HTYPE].copy_from_slice(&[0, 1]);
        b[field::PTYPE].copy_from_slice(&[8, 0]);
        b[field::HLEN] = 6;
        b[field::PLEN] = 4;
        b[field::OPER].copy_from_slice(&u16::from(self.operation).to_be_bytes());
        b[field::SHA].copy_from_slice(&self.sender_mac.0);
        b[field::SPA].copy_from_slice(&self.sender_ip);
        b[field::THA].copy_from_slice(&self.target_mac.0);
        b[field::TPA].copy_from_slice(&self.target_ip);
        Some(())
    }
}

/// The broadcast RARP "request reverse" from `mac` that announces where the
/// MAC lives (QEMU's announcement after a migration): a minimum-size frame.
pub fn rarp_announcement(mac: MacAddr) -> [u8; MIN_FRAME] {
    let mut f = [0u8; MIN_FRAME];
    f[..6].copy_from_slice(&MacAddr::BROADCAST.0);
    f[6..12].copy_from_slice(&mac.0);
    f[12..14].copy_from_slice(&ETHERTYPE_RARP.to_be_bytes());
    let body = ArpRepr {
        operation: Operation::ReverseRequest,
        sender_mac: mac,
        sender_ip: [0; 4],
        target_mac: mac,
        target_ip: [0; 4],
    };
    // The buffer is 60 bytes and the body ends at 42: emit cannot fail.
    let _ = body.emit(&mut f[ETH_LEN..]);
    f
}

/// Whether `ethertype` is ARP or RARP (both carry an [`ArpPacket`]).
pub fn is_arp(ethertype: EtherType) -> bool {
    matches!(ethertype, EtherType::Arp | EtherType::Unknown(ETHERTYPE_RARP))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EthernetFrame;

    #[test]
    fn announcement_is_what_qemu_sends() {
        let mac = MacAddr([0x52, 0x54, 0, 0, 0, 7]);
        let f = rarp_announcement(mac);
        let eth = EthernetFrame::new_checked(&f[..]).unwrap();
        assert!(eth.dst().is_group());
        assert_eq!(eth.src(), mac);
        assert!(is_arp(eth.ethertype()));
        let a = ArpRepr::parse(&ArpPacket::new_checked(eth.payload()).unwrap());
        assert_eq!(a.operation, Operation::ReverseRequest);
        assert_eq!((a.sender_mac, a.target_mac), (mac, mac));
        // The bytes, as the former hand-built frame had them.
        assert_eq!(&f[14..22], &[0, 1, 8, 0, 6, 4, 0, 3]);
        assert!(f[42..].iter().all(|&b| b == 0));
    }

    #[test]
    fn other_arp_kinds_are_refused() {
        let mut body = [0u8; LEN];
        ArpRepr {
            operation: Operation::Request,
            sender_mac: MacAddr([2; 6]),
            sender_ip: [10, 0, 0, 1],
            target_mac: MacAddr([0; 6]),
            target_ip: [10, 0, 0, 2],
        }
        .emit(&mut body)
        .unwrap();
        let p = ArpPacket::new_checked(&body[..]).unwrap();
        assert_eq!((p.operation(), p.target_ip()), (Operation::Request, [10, 0, 0, 2]));
        let mut b = body;
        b[4] = 8;
        assert!(ArpPacket::new_checked(&b[..]).is_err());
        assert!(ArpPacket::new_checked(&body[..27]).is_err());
        assert_eq!(Operation::from(9), Operation::Unknown(9));
        // Each of the four type fields alone refuses it.
        for (i, v) in [(0, 1), (3, 6), (5, 4), (2, 9)] {
            let mut b = body;
            b[i] ^= v;
            assert!(ArpPacket::new_checked(&b[..]).is_err(), "byte {i}");
        }
        assert_eq!(p.sender_ip(), [10, 0, 0, 1]);
        // ARP and RARP only.
        assert!(is_arp(EtherType::Arp) && is_arp(EtherType::Unknown(ETHERTYPE_RARP)));
        assert!(!is_arp(EtherType::Ipv4) && !is_arp(EtherType::Unknown(0x88b5)));
    }
}
