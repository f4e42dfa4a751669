//! The parts of IPv4, IPv6, TCP and UDP the data path reads: addresses,
//! protocol and ports, for the flow hash that keeps one inner flow on one
//! outer source port (and one vhost-user queue pair).
//!
//! Views in the crate's pattern: `new_checked` validates once, accessors
//! never panic afterwards. Only what vnet reads is here; options and
//! extension headers are skipped (IPv4 by its IHL; IPv6 extension headers
//! end the flow key at the addresses).

use crate::ethernet::{EtherType, HEADER_LEN as ETH_LEN};
use crate::{Error, EthernetFrame, Result};

/// IP protocol numbers vnet looks at.
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

mod v4 {
    use core::ops::Range;
    pub const VER_IHL: usize = 0;
    pub const PROTOCOL: usize = 9;
    pub const SRC: Range<usize> = 12..16;
    pub const DST: Range<usize> = 16..20;
    pub const MIN_LEN: usize = 20;
}

mod v6 {
    use core::ops::Range;
    pub const NEXT_HEADER: usize = 6;
    pub const SRC: Range<usize> = 8..24;
    pub const DST: Range<usize> = 24..40;
    pub const LEN: usize = 40;
}

/// A view of an IPv4 header (and what follows it).
#[derive(Debug, Clone, Copy)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Checks version 4, an IHL of at least 5 words, and that the header fits.
    pub fn new_checked(buf: T) -> Result<Self> {
        let b = buf.as_ref();
        if b.len() < v4::MIN_LEN {
            return Err(Error::Truncated { need: v4::MIN_LEN, have: b.len() });
        }
        if b[v4::VER_IHL] >> 4 != 4 {
            return Err(Error::Version(b[v4::VER_IHL] >> 4));
        }
        let hl = usize::from(b[v4::VER_IHL] & 0x0f) * 4;
        if hl < v4::MIN_LEN {
            return Err(Error::Malformed("ipv4 header length"));
        }
        if b.len() < hl {
            return Err(Error::Truncated { need: hl, have: b.len() });
        }
        Ok(Ipv4Packet { buf })
    }

    pub fn header_len(&self) -> usize {
        usize::from(self.buf.as_ref()[v4::VER_IHL] & 0x0f) * 4
    }
    pub fn protocol(&self) -> u8 {
        self.buf.as_ref()[v4::PROTOCOL]
    }
    /// Source and destination, as their 8 bytes.
    pub fn addresses(&self) -> &[u8] {
        &self.buf.as_ref()[v4::SRC.start..v4::DST.end]
    }
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[self.header_len()..]
    }
}

/// A view of an IPv6 fixed header (and what follows it).
#[derive(Debug, Clone, Copy)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    pub fn new_checked(buf: T) -> Result<Self> {
        let b = buf.as_ref();
        if b.len() < v6::LEN {
            return Err(Error::Truncated { need: v6::LEN, have: b.len() });
        }
        if b[0] >> 4 != 6 {
            return Err(Error::Version(b[0] >> 4));
        }
        Ok(Ipv6Packet { buf })
    }

    pub fn next_header(&self) -> u8 {
        self.buf.as_ref()[v6::NEXT_HEADER]
    }
    /// Source and destination, as their 32 bytes.
    pub fn addresses(&self) -> &[u8] {
        &self.buf.as_ref()[v6::SRC.start..v6::DST.end]
    }
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[v6::LEN..]
    }
}

/// What identifies an inner flow: never a field that changes per packet
/// (IP id, TTL, sequence numbers), so a flow keeps its path and its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FlowKey<'a> {
    /// Destination and source MAC and the EtherType (the first 14 bytes).
    pub ethernet: &'a [u8],
    pub protocol: u8,
    /// Source and destination address bytes (8 for IPv4, 32 for IPv6).
    pub addresses: &'a [u8],
    /// TCP or UDP source and destination port (4 bytes) when present.
    pub ports: &'a [u8],
}

impl<'a> FlowKey<'a> {
    /// The key of a frame. A frame too short or of another kind keys on what
    /// it has (at least its Ethernet header, if it has one).
    pub fn of(frame: &'a [u8]) -> FlowKey<'a> {
        let Ok(eth) = EthernetFrame::new_checked(frame) else { return FlowKey::default() };
        let mut key = FlowKey { ethernet: &frame[..ETH_LEN], ..FlowKey::default() };
        let l3 = &frame[ETH_LEN..];
        let (protocol, addresses, l4) = match eth.ethertype() {
            EtherType::Ipv4 => match Ipv4Packet::new_checked(l3) {
                Ok(p) => (p.protocol(), &l3[v4::SRC.start..v4::DST.end], &l3[p.header_len()..]),
                Err(_) => return key,
            },
            EtherType::Ipv6 => match Ipv6Packet::new_checked(l3) {
                Ok(p) => (p.next_header(), &l3[v6::SRC.start..v6::DST.end], &l3[v6::LEN..]),
                Err(_) => return key,
            },
            _ => return key,
        };
        key.protocol = protocol;
        key.addresses = addresses;
        if matches!(protocol, PROTO_TCP | PROTO_UDP) {
            key.ports = l4.get(..4).unwrap_or(&[]);
        }
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp4() -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[12] = 0x08;
        f[14] = 0x45;
        f[23] = PROTO_TCP;
        f[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        f[34..38].copy_from_slice(&[0x9c, 0x40, 0x14, 0x51]);
        f
    }

    #[test]
    fn key_reads_addresses_protocol_ports() {
        let f = tcp4();
        let k = FlowKey::of(&f);
        assert_eq!(k.protocol, PROTO_TCP);
        assert_eq!(k.addresses, &[10, 0, 0, 1, 10, 0, 0, 2]);
        assert_eq!(k.ports, &[0x9c, 0x40, 0x14, 0x51]);
        // IP options move the ports.
        let mut o = f.clone();
        o[14] = 0x46;
        o.insert(34, 0);
        o.insert(34, 0);
        o.insert(34, 0);
        o.insert(34, 0);
        assert_eq!(FlowKey::of(&o).ports, &[0x9c, 0x40, 0x14, 0x51]);
    }

    /// The headers' views at their edges (mutation testing).
    #[test]
    fn ip_views_check_their_bounds_and_read_their_fields() {
        let f = tcp4();
        let l3 = &f[14..];
        assert!(Ipv4Packet::new_checked(&l3[..20]).is_ok());
        assert!(Ipv4Packet::new_checked(&l3[..19]).is_err());
        let p = Ipv4Packet::new_checked(l3).unwrap();
        assert_eq!((p.addresses(), p.payload()), (&[10, 0, 0, 1, 10, 0, 0, 2][..], &l3[20..]));
        let mut o = l3.to_vec();
        o[0] = 0x46; // 24 bytes of header
        assert!(Ipv4Packet::new_checked(&o[..23]).is_err() && Ipv4Packet::new_checked(&o[..24]).is_ok());
        o[0] = 0x65;
        assert_eq!(Ipv4Packet::new_checked(&o[..]).unwrap_err(), Error::Version(6));
        let mut v6 = [0u8; 44];
        v6[0] = 0x60;
        v6[8..40].copy_from_slice(&[7; 32]);
        v6[40..44].copy_from_slice(&[1, 2, 3, 4]);
        assert!(Ipv6Packet::new_checked(&v6[..40]).is_ok() && Ipv6Packet::new_checked(&v6[..39]).is_err());
        let p = Ipv6Packet::new_checked(&v6[..]).unwrap();
        assert_eq!((p.addresses(), p.payload()), (&[7; 32][..], &[1, 2, 3, 4][..]));
        v6[0] = 0x40;
        assert_eq!(Ipv6Packet::new_checked(&v6[..]).unwrap_err(), Error::Version(4));
        assert_eq!(FlowKey::of(&f).ethernet, &f[..14]);
    }

    #[test]
    fn odd_frames_key_on_what_they_have() {
        let f = tcp4();
        assert_eq!(FlowKey::of(&f[..5]), FlowKey::default());
        assert_eq!(FlowKey::of(&f[..20]).addresses, &[] as &[u8]);
        let mut bad = f.clone();
        bad[14] = 0x42; // IHL 2
        assert_eq!(FlowKey::of(&bad).protocol, 0);
        let mut v6 = vec![0u8; 14 + 44];
        v6[12..14].copy_from_slice(&[0x86, 0xdd]);
        v6[14] = 0x60;
        v6[20] = PROTO_UDP;
        v6[54..58].copy_from_slice(&[1, 2, 3, 4]);
        let k = FlowKey::of(&v6);
        assert_eq!((k.protocol, k.addresses.len(), k.ports), (PROTO_UDP, 32, &[1u8, 2, 3, 4][..]));
    }
}
