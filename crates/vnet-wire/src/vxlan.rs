//! VXLAN (RFC 7348): an 8-byte header in front of an Ethernet frame inside a
//! UDP datagram, as the Linux kernel, Open vSwitch and switches speak it.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |R|R|R|R|I|R|R|R|            reserved (24 bits, zero)           |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                VNI (24 bits)                  |  reserved (0) |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                 inner Ethernet frame ...                      |
//! ```
//!
//! Linux (`drivers/net/vxlan/vxlan_core.c`) drops a datagram whose flags
//! byte is not exactly `0x08` (I) or whose reserved bits are not zero,
//! unless the device was made for an extension (GBP sets 0x80 and needs
//! `gbp` on the receiver). So this view accepts exactly that and nothing
//! else, and [`VxlanRepr::emit`] writes exactly that. There is no
//! fragmentation: a frame is one datagram (VTEPs must not fragment).

use crate::{Error, Result};

mod field {
    use core::ops::Range;
    pub const FLAGS: usize = 0;
    pub const RESERVED1: Range<usize> = 1..4;
    pub const VNI: Range<usize> = 4..7;
    pub const RESERVED2: usize = 7;
}

/// Length of the header.
pub const HEADER_LEN: usize = 8;
/// The flags byte: only I (the VNI is valid).
pub const FLAG_I: u8 = 0x08;
/// IANA's port for VXLAN.
pub const IANA_PORT: u16 = 4789;
/// The port a Linux vxlan device made without `dstport` uses (flannel's).
pub const LINUX_PORT: u16 = 8472;
/// The largest VNI (24 bits).
pub const MAX_VNI: u32 = (1 << 24) - 1;
/// What a frame gains over IPv4: outer IPv4 (20) + UDP (8) + this header +
/// the inner Ethernet header (14) = 50, the figure every VXLAN guide quotes
/// (the VM MTU must be the underlay MTU less this).
pub const IPV4_OVERHEAD: usize = 20 + 8 + HEADER_LEN + 14;
/// The same over IPv6: 70.
pub const IPV6_OVERHEAD: usize = 40 + 8 + HEADER_LEN + 14;

/// A view of a VXLAN datagram (the UDP payload).
#[derive(Debug, Clone, Copy)]
pub struct VxlanPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> VxlanPacket<T> {
    /// Checks the length and that flags and reserved fields are exactly what
    /// RFC 7348 (and Linux) allow. After this no accessor panics.
    pub fn new_checked(buf: T) -> Result<Self> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated { need: HEADER_LEN, have: b.len() });
        }
        if b[field::FLAGS] != FLAG_I {
            return Err(Error::Malformed("vxlan flags"));
        }
        if b[field::RESERVED1] != [0, 0, 0] || b[field::RESERVED2] != 0 {
            return Err(Error::Malformed("vxlan reserved"));
        }
        Ok(VxlanPacket { buf })
    }

    pub fn vni(&self) -> u32 {
        let s = &self.buf.as_ref()[field::VNI];
        u32::from_be_bytes([0, s[0], s[1], s[2]])
    }

    /// The inner Ethernet frame.
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[HEADER_LEN..]
    }
}

/// The parsed header: all it carries is the VNI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VxlanRepr {
    pub vni: u32,
}

impl VxlanRepr {
    pub fn parse<T: AsRef<[u8]>>(p: &VxlanPacket<T>) -> VxlanRepr {
        VxlanRepr { vni: p.vni() }
    }

    /// The header as bytes. A VNI above 24 bits is cut to its low 24 (the
    /// control language refuses such a VNI before it gets here).
    pub fn header(&self) -> [u8; HEADER_LEN] {
        let v = (self.vni & MAX_VNI).to_be_bytes();
        [FLAG_I, 0, 0, 0, v[1], v[2], v[3], 0]
    }

    /// Writes the header into `out[..HEADER_LEN]`; `None` if `out` is shorter.
    pub fn emit(&self, out: &mut [u8]) -> Option<()> {
        out.get_mut(..HEADER_LEN)?.copy_from_slice(&self.header());
        Some(())
    }
}

/// The outer UDP source port for an inner flow hash: RFC 7348 asks for a
/// hash of the inner headers in the dynamic range, so ECMP and RSS spread
/// flows while one flow keeps one path. `range` is inclusive; a range with
/// `lo > hi` is taken as the single port `lo`.
pub fn source_port(flow_hash: u64, range: (u16, u16)) -> u16 {
    let (lo, hi) = range;
    if hi <= lo {
        return lo;
    }
    let span = u64::from(hi - lo) + 1;
    // Fold the high bits in: FxHash's low bits alone are weak.
    let h = flow_hash ^ (flow_hash >> 32) ^ (flow_hash >> 17);
    lo + (h % span) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures every VXLAN guide quotes (50 and 70) and the VNI's 24 bits.
    #[test]
    fn the_formats_sizes() {
        assert_eq!((IPV4_OVERHEAD, IPV6_OVERHEAD, MAX_VNI), (50, 70, 0xff_ffff));
    }

    /// Test vector V1 of docs/wire.md: VNI 42 in front of a 14-byte frame.
    const VECTOR: [u8; 22] = [
        0x08, 0x00, 0x00, 0x00, // flags I, reserved
        0x00, 0x00, 0x2a, 0x00, // VNI 42, reserved
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // inner dst
        0x52, 0x54, 0x00, 0x00, 0x00, 0x01, // inner src
        0x08, 0x06, // ARP
    ];

    #[test]
    fn vector_parses_and_emits() {
        let p = VxlanPacket::new_checked(&VECTOR[..]).unwrap();
        assert_eq!(p.vni(), 42);
        assert_eq!(p.payload().len(), 14);
        let mut h = [0u8; HEADER_LEN];
        VxlanRepr { vni: 42 }.emit(&mut h).unwrap();
        assert_eq!(h, VECTOR[..8]);
        assert_eq!(VxlanRepr { vni: MAX_VNI }.header(), [0x08, 0, 0, 0, 0xff, 0xff, 0xff, 0]);
    }

    #[test]
    fn what_linux_drops_is_refused() {
        for (i, v) in [(0, 0x0c), (0, 0x88), (0, 0x00), (1, 1), (3, 0x80), (7, 1)] {
            let mut b = VECTOR;
            b[i] = v;
            assert!(VxlanPacket::new_checked(&b[..]).is_err(), "byte {i} = {v:#x} accepted");
        }
        assert!(matches!(VxlanPacket::new_checked(&VECTOR[..7]), Err(Error::Truncated { need: 8, have: 7 })));
        // An empty inner frame is the caller's to judge (Ethernet's check).
        assert!(VxlanPacket::new_checked(&VECTOR[..8]).is_ok());
    }

    #[test]
    fn source_ports_stay_in_range_and_spread() {
        let mut seen = std::collections::BTreeSet::new();
        for h in 0..10_000u64 {
            let p = source_port(h.wrapping_mul(0x9e37_79b9_7f4a_7c15), (49152, 65535));
            assert!((49152..=65535).contains(&p));
            seen.insert(p);
        }
        assert!(seen.len() > 5000, "{} ports", seen.len());
        assert_eq!(source_port(7, (4789, 4789)), 4789);
        // The fold is the one documented: h ^ h >> 32 ^ h >> 17, modulo the
        // span, whose both ends are reachable.
        assert_eq!(source_port(0x1234_5678_9abc_def0, (49152, 65535)), 50646);
        assert_eq!((source_port(0, (10, 11)), source_port(1, (10, 11))), (10, 11));
        assert_eq!(source_port(7, (5000, 4000)), 5000);
    }
}
