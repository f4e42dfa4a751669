//! `struct virtio_net_hdr`: the offload metadata a TAP (`IFF_VNET_HDR`) or a
//! packet socket (`PACKET_VNET_HDR`) puts in front of every frame, and the
//! `vnet` format carries when its `VNET_HDR` flag is set.
//!
//! ```text
//!  0        1          2-3        4-5        6-7          8-9
//! +-------+----------+----------+----------+------------+-------------+
//! | flags | gso_type | hdr_len  | gso_size | csum_start | csum_offset |
//! +-------+----------+----------+----------+------------+-------------+
//! ```
//!
//! Ten bytes, little-endian (the virtio 1.0 layout, and what Linux uses on
//! little-endian hosts). vnet always uses the 10-byte form.

/// Size of the header.
pub const LEN: usize = 10;

/// The frame's checksum is partial: complete it from `csum_start`.
pub const F_NEEDS_CSUM: u8 = 1;
/// The frame's checksum was already verified.
pub const F_DATA_VALID: u8 = 2;

pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_UDP: u8 = 3;
pub const GSO_TCPV6: u8 = 4;
pub const GSO_UDP_L4: u8 = 5;
pub const GSO_ECN: u8 = 0x80;

/// The parsed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VirtioNetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VirtioNetHdr {
    /// No offload: a complete frame with a valid checksum.
    pub const NONE: VirtioNetHdr =
        VirtioNetHdr { flags: 0, gso_type: 0, hdr_len: 0, gso_size: 0, csum_start: 0, csum_offset: 0 };

    /// Reads the first [`LEN`] bytes of `b`; `None` if shorter.
    pub fn parse(b: &[u8]) -> Option<VirtioNetHdr> {
        let b = b.get(..LEN)?;
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Some(VirtioNetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        })
    }

    pub fn emit(&self) -> [u8; LEN] {
        let mut o = [0u8; LEN];
        o[0] = self.flags;
        o[1] = self.gso_type;
        o[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        o[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        o[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        o[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        o
    }

    /// The frame is a GSO super-frame that must be segmented somewhere.
    pub fn is_gso(&self) -> bool {
        self.gso_type & !GSO_ECN != GSO_NONE
    }

    /// The frame needs work (checksum or segmentation) before it is a plain
    /// Ethernet frame.
    pub fn needs_finishing(&self) -> bool {
        self.is_gso() || self.flags & F_NEEDS_CSUM != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_fixed_bytes() {
        let b = [0x01, 0x01, 0x42, 0x00, 0xa8, 0x05, 0x22, 0x00, 0x10, 0x00];
        let h = VirtioNetHdr::parse(&b).unwrap();
        assert_eq!(
            h,
            VirtioNetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: GSO_TCPV4,
                hdr_len: 66,
                gso_size: 1448,
                csum_start: 34,
                csum_offset: 16
            }
        );
        assert_eq!(h.emit(), b);
        assert!(h.is_gso() && h.needs_finishing());
        assert!(!VirtioNetHdr::NONE.needs_finishing());
        assert!(VirtioNetHdr::parse(&b[..9]).is_none());
    }
}
