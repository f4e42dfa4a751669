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

/// Why a header cannot be handed to a device: what a TAP, a packet socket
/// or a guest's driver would refuse, or misread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HdrError {
    #[error("unknown flags {0:#x}")]
    Flags(u8),
    #[error("GSO type {0} is not one vnet offers (TCPv4, TCPv6, UDP L4)")]
    GsoType(u8),
    #[error("GSO without a segment size")]
    NoSegmentSize,
    #[error("ECN bit without GSO")]
    EcnWithoutGso,
    #[error("checksum at {start}+{offset} lies outside the {len}-byte frame")]
    ChecksumOutside { start: u16, offset: u16, len: usize },
    #[error("header length {hdr_len} is more than the {len}-byte frame")]
    HeaderLength { hdr_len: u16, len: usize },
}

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

    /// Whether the header describes a `len`-byte Ethernet frame in a way
    /// every port accepts: known flags, a GSO type vnet offers with a
    /// segment size, a partial checksum whose field lies inside the frame
    /// (after the Ethernet header). Headers come from guests and peers;
    /// whatever fails here is dropped and counted, never given to a device.
    pub fn validate(&self, len: usize) -> Result<(), HdrError> {
        if self.flags & !(F_NEEDS_CSUM | F_DATA_VALID) != 0 {
            return Err(HdrError::Flags(self.flags));
        }
        match self.gso_type & !GSO_ECN {
            GSO_NONE if self.gso_type & GSO_ECN != 0 => return Err(HdrError::EcnWithoutGso),
            GSO_NONE => {}
            GSO_TCPV4 | GSO_TCPV6 | GSO_UDP_L4 if self.gso_size == 0 => return Err(HdrError::NoSegmentSize),
            GSO_TCPV4 | GSO_TCPV6 | GSO_UDP_L4 => {}
            t => return Err(HdrError::GsoType(t)),
        }
        if self.flags & F_NEEDS_CSUM != 0 {
            let (start, offset) = (self.csum_start, self.csum_offset);
            if (start as usize) < 14 || start as usize + offset as usize + 2 > len {
                return Err(HdrError::ChecksumOutside { start, offset, len });
            }
        }
        if self.hdr_len as usize > len {
            return Err(HdrError::HeaderLength { hdr_len: self.hdr_len, len });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `validate` at its edges (mutation testing): both known flags, a
    /// checksum field that ends exactly at the frame's end, starting right
    /// after the Ethernet header, a header as long as the frame; and what
    /// needs finishing.
    #[test]
    fn validate_and_needs_finishing_at_their_edges() {
        let csum = |start, offset| VirtioNetHdr {
            flags: F_NEEDS_CSUM,
            csum_start: start,
            csum_offset: offset,
            ..VirtioNetHdr::NONE
        };
        let both = VirtioNetHdr {
            flags: F_NEEDS_CSUM | F_DATA_VALID,
            csum_start: 34,
            csum_offset: 16,
            ..VirtioNetHdr::NONE
        };
        assert_eq!(both.validate(100), Ok(()));
        assert_eq!(csum(34, 16).validate(52), Ok(()), "the field's last byte is the frame's");
        assert!(csum(34, 16).validate(51).is_err());
        assert_eq!(csum(14, 16).validate(100), Ok(()));
        assert!(csum(13, 16).validate(100).is_err());
        let hdr = |hdr_len| VirtioNetHdr { hdr_len, ..VirtioNetHdr::NONE };
        assert_eq!(hdr(100).validate(100), Ok(()));
        assert!(hdr(101).validate(100).is_err());
        assert!(csum(34, 16).needs_finishing() && !VirtioNetHdr::NONE.needs_finishing());
        let gso = VirtioNetHdr { gso_type: GSO_TCPV4, gso_size: 1448, ..VirtioNetHdr::NONE };
        assert!(gso.needs_finishing());
    }

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

    #[test]
    fn validate_refuses_what_a_device_would_misread() {
        let tso = VirtioNetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 66,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
        };
        assert_eq!(tso.validate(3000), Ok(()));
        assert_eq!(VirtioNetHdr::NONE.validate(60), Ok(()));
        assert_eq!(VirtioNetHdr { gso_type: GSO_TCPV6 | GSO_ECN, ..tso }.validate(3000), Ok(()));
        let bad = [
            (VirtioNetHdr { gso_size: 0, ..tso }, HdrError::NoSegmentSize),
            (VirtioNetHdr { gso_type: 7, ..tso }, HdrError::GsoType(7)),
            (VirtioNetHdr { gso_type: GSO_UDP, ..tso }, HdrError::GsoType(GSO_UDP)),
            (VirtioNetHdr { flags: 0x41, ..tso }, HdrError::Flags(0x41)),
            (VirtioNetHdr { gso_type: GSO_ECN, ..VirtioNetHdr::NONE }, HdrError::EcnWithoutGso),
            (
                VirtioNetHdr { csum_start: 2990, ..tso },
                HdrError::ChecksumOutside { start: 2990, offset: 16, len: 3000 },
            ),
            (
                VirtioNetHdr { csum_start: 4, ..tso },
                HdrError::ChecksumOutside { start: 4, offset: 16, len: 3000 },
            ),
            (VirtioNetHdr { hdr_len: 4000, ..tso }, HdrError::HeaderLength { hdr_len: 4000, len: 3000 }),
        ];
        for (h, e) in bad {
            assert_eq!(h.validate(3000), Err(e), "{h:?}");
        }
    }
}
