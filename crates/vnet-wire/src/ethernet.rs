//! Ethernet II frames: the unit vnet routes.

use crate::{Error, MacAddr, Result};

pub(crate) mod field {
    use core::ops::Range;
    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
    pub const PAYLOAD: usize = 14;
}

/// Length of the Ethernet II header.
pub const HEADER_LEN: usize = field::PAYLOAD;

/// EtherType values vnet cares about; everything else is `Unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtherType {
    Ipv4,
    Arp,
    Vlan,
    Ipv6,
    Unknown(u16),
}

impl From<u16> for EtherType {
    fn from(v: u16) -> Self {
        match v {
            0x0800 => EtherType::Ipv4,
            0x0806 => EtherType::Arp,
            0x8100 => EtherType::Vlan,
            0x86dd => EtherType::Ipv6,
            x => EtherType::Unknown(x),
        }
    }
}

impl From<EtherType> for u16 {
    fn from(v: EtherType) -> u16 {
        match v {
            EtherType::Ipv4 => 0x0800,
            EtherType::Arp => 0x0806,
            EtherType::Vlan => 0x8100,
            EtherType::Ipv6 => 0x86dd,
            EtherType::Unknown(x) => x,
        }
    }
}

/// A read (or write) view of an Ethernet II frame.
#[derive(Debug, Clone, Copy)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps `buf` after checking it holds at least a header.
    pub fn new_checked(buf: T) -> Result<Self> {
        let have = buf.as_ref().len();
        if have < HEADER_LEN {
            return Err(Error::Truncated { need: HEADER_LEN, have });
        }
        Ok(EthernetFrame { buf })
    }

    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }

    pub fn dst(&self) -> MacAddr {
        let mut a = [0u8; 6];
        a.copy_from_slice(&self.b()[field::DST]);
        MacAddr(a)
    }

    pub fn src(&self) -> MacAddr {
        let mut a = [0u8; 6];
        a.copy_from_slice(&self.b()[field::SRC]);
        MacAddr(a)
    }

    pub fn ethertype(&self) -> EtherType {
        let b = &self.b()[field::ETHERTYPE];
        EtherType::from(u16::from_be_bytes([b[0], b[1]]))
    }

    pub fn payload(&self) -> &[u8] {
        &self.b()[field::PAYLOAD..]
    }

    pub fn into_inner(self) -> T {
        self.buf
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    pub fn set_dst(&mut self, m: MacAddr) {
        self.buf.as_mut()[field::DST].copy_from_slice(&m.0);
    }
    pub fn set_src(&mut self, m: MacAddr) {
        self.buf.as_mut()[field::SRC].copy_from_slice(&m.0);
    }
    pub fn set_ethertype(&mut self, t: EtherType) {
        self.buf.as_mut()[field::ETHERTYPE].copy_from_slice(&u16::from(t).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARP_REQ: [u8; 42] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, //
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0x52, 0x54, 0x00, 0x00, 0x00, 0x01, 10, 1, 0, 1, 0,
        0, 0, 0, 0, 0, 10, 1, 0, 2,
    ];

    #[test]
    fn view_arp_request() {
        let f = EthernetFrame::new_checked(&ARP_REQ[..]).unwrap();
        assert!(f.dst().is_broadcast());
        assert_eq!(f.src(), "52:54:00:00:00:01".parse().unwrap());
        assert_eq!(f.ethertype(), EtherType::Arp);
        assert_eq!(f.payload().len(), 28);
    }

    #[test]
    fn write_roundtrip() {
        let mut b = [0u8; 14];
        let mut f = EthernetFrame::new_checked(&mut b[..]).unwrap();
        f.set_dst(MacAddr::BROADCAST);
        f.set_src(MacAddr([2, 0, 0, 0, 0, 9]));
        f.set_ethertype(EtherType::Unknown(0x88b5));
        assert_eq!(f.ethertype(), EtherType::Unknown(0x88b5));
        assert_eq!(
            &b[..],
            &ARP_REQ[..6].iter().chain(&[2, 0, 0, 0, 0, 9, 0x88, 0xb5]).copied().collect::<Vec<_>>()[..]
        );
    }

    #[test]
    fn short_is_error() {
        assert_eq!(
            EthernetFrame::new_checked(&ARP_REQ[..13]).unwrap_err(),
            Error::Truncated { need: 14, have: 13 }
        );
    }
}
