//! Address resolution answered at the edge: an ARP request (RFC 826) or an
//! IPv6 neighbour solicitation (RFC 4861) for an address the host knows is
//! turned, in place, into the answer its owner would send, and goes back to
//! the asker; nothing crosses the overlay (EVPN's ARP suppression, OVN's
//! ARP responder, flannel's static neighbours).
//!
//! [`question`] reads what a frame asks, if it is a question this module
//! answers; the caller looks the address up; [`answer`] rewrites the frame
//! into the answer from the owner's MAC. The answer is the question's
//! length, so it is made in the frame's own buffer (no allocation, and the
//! eBPF program does the same in place). What is not answered here is
//! forwarded as before, so the owner answers it:
//!
//! - ARP: only requests (opcode 1) from a sender with an address: a probe
//!   (sender 0.0.0.0, RFC 5227) and a gratuitous request (sender = target)
//!   are announcements and address checks, the owner's business.
//! - ND: only solicitations in a packet of exactly IPv6 + NS + the
//!   source link-layer address option (what every stack sends to the
//!   solicited-node group), hop limit 255 (RFC 4861 7.1.1), no extension
//!   headers; never a duplicate address detection (source `::`).
//!
//! The answers: ARP opcode 2 from the owner to the asker; a neighbour
//! advertisement from the target address to the asker, Solicited and
//! Override set, Router clear, with the target link-layer address option.

use crate::ethernet::{field as eth, HEADER_LEN as ETH_LEN};
use crate::offload::{fold, sum16};
use crate::MacAddr;
use std::net::{Ipv4Addr, Ipv6Addr};

/// What a frame asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Question {
    /// An ARP request for this address.
    Arp(Ipv4Addr),
    /// A neighbour solicitation for this target.
    Nd(Ipv6Addr),
}

/// ARP body offsets from the start of the frame.
const ARP: usize = ETH_LEN;
/// An ARP frame's length without padding.
const ARP_END: usize = ARP + crate::arp::LEN;
/// IPv6 header and ICMPv6 offsets from the start of the frame.
const IP6: usize = ETH_LEN;
const ICMP6: usize = IP6 + 40;
/// NS/NA: type, code, checksum, flags (4), target (16), then the option.
const ND_TARGET: usize = ICMP6 + 8;
const ND_OPTION: usize = ND_TARGET + 16;
/// The length of an NS or NA with one link-layer address option.
pub const ND_FRAME: usize = ND_OPTION + 8;
const ND_PAYLOAD: u16 = (ND_FRAME - ICMP6) as u16;

fn ethertype(f: &[u8]) -> u16 {
    u16::from_be_bytes([f[eth::ETHERTYPE.start], f[eth::ETHERTYPE.start + 1]])
}

fn v4(b: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(b[0], b[1], b[2], b[3])
}

fn v6(b: &[u8]) -> Ipv6Addr {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[..16]);
    Ipv6Addr::from(a)
}

/// What `frame` asks, if it is an ARP request or a neighbour solicitation
/// this module answers (see the module's rules).
pub fn question(frame: &[u8]) -> Option<Question> {
    if frame.len() < ETH_LEN {
        return None;
    }
    match ethertype(frame) {
        0x0806 if frame.len() >= ARP_END => {
            let a = &frame[ARP..ARP_END];
            let (sender, target) = (v4(&a[14..18]), v4(&a[24..28]));
            let ok = a[0..8] == [0, 1, 8, 0, 6, 4, 0, 1] && !sender.is_unspecified() && sender != target;
            ok.then_some(Question::Arp(target))
        }
        0x86dd if frame.len() == ND_FRAME => {
            let ip = &frame[IP6..ICMP6];
            let src = v6(&ip[8..24]);
            let target = v6(&frame[ND_TARGET..ND_OPTION]);
            let ok = ip[0] >> 4 == 6
                && u16::from_be_bytes([ip[4], ip[5]]) == ND_PAYLOAD
                && ip[6] == 58
                && ip[7] == 255
                && frame[ICMP6..ICMP6 + 2] == [135, 0]
                && frame[ND_OPTION..ND_OPTION + 2] == [1, 1]
                && !src.is_unspecified()
                && !target.is_multicast();
            ok.then_some(Question::Nd(target))
        }
        _ => None,
    }
}

/// Rewrites `frame`, a question [`question`] accepted, into the answer
/// from `owner` (the MAC of the asked address's owner). Returns false, the
/// frame untouched, if it is not such a question.
pub fn answer(frame: &mut [u8], owner: MacAddr) -> bool {
    let Some(q) = question(frame) else { return false };
    let mut asker = [0u8; 6];
    asker.copy_from_slice(&frame[eth::SRC]);
    frame[eth::DST].copy_from_slice(&asker);
    frame[eth::SRC].copy_from_slice(&owner.0);
    match q {
        Question::Arp(target) => {
            let a = &mut frame[ARP..ARP_END];
            let mut sender_ip = [0u8; 4];
            sender_ip.copy_from_slice(&a[14..18]);
            a[6..8].copy_from_slice(&2u16.to_be_bytes());
            a[18..24].copy_from_slice(&asker); // THA: the asker
            a[24..28].copy_from_slice(&sender_ip); // TPA: its address
            a[8..14].copy_from_slice(&owner.0); // SHA: the owner
            a[14..18].copy_from_slice(&target.octets()); // SPA: the address asked
        }
        Question::Nd(target) => {
            let mut src = [0u8; 16];
            src.copy_from_slice(&frame[IP6 + 8..IP6 + 24]);
            frame[IP6 + 24..IP6 + 40].copy_from_slice(&src); // to the asker
            frame[IP6 + 8..IP6 + 24].copy_from_slice(&target.octets()); // from the target
            let icmp = &mut frame[ICMP6..ND_FRAME];
            icmp[0] = 136;
            icmp[2..4].copy_from_slice(&[0, 0]);
            icmp[4..8].copy_from_slice(&[0x60, 0, 0, 0]); // Solicited, Override
            icmp[24..26].copy_from_slice(&[2, 1]); // target link-layer address
            icmp[26..32].copy_from_slice(&owner.0);
            // The checksum over the pseudo-header (RFC 8200 8.1) and the message.
            let mut pseudo = sum16(&frame[IP6 + 8..IP6 + 40], 0);
            pseudo += u64::from(ND_PAYLOAD) + 58;
            let c = !fold(sum16(&frame[ICMP6..ND_FRAME], pseudo));
            frame[ICMP6 + 2..ICMP6 + 4].copy_from_slice(&c.to_be_bytes());
        }
    }
    true
}

/// The neighbour solicitation `mac` (at `src`) sends for `target`, as
/// Linux sends it: to the target's solicited-node group, hop limit 255,
/// with the source link-layer address option and its checksum; the
/// question [`question`] reads (`vnetctl trace` asks the edge with it).
pub fn solicitation(mac: MacAddr, src: Ipv6Addr, target: Ipv6Addr) -> [u8; ND_FRAME] {
    let t = target.octets();
    let mut group = [0u8; 16];
    group[..2].copy_from_slice(&[0xff, 0x02]);
    group[11..13].copy_from_slice(&[0x01, 0xff]);
    group[13..].copy_from_slice(&t[13..]);
    let mut f = [0u8; ND_FRAME];
    f[eth::DST].copy_from_slice(&[0x33, 0x33, 0xff, t[13], t[14], t[15]]);
    f[eth::SRC].copy_from_slice(&mac.0);
    f[eth::ETHERTYPE].copy_from_slice(&[0x86, 0xdd]);
    f[IP6] = 0x60;
    f[IP6 + 4..IP6 + 6].copy_from_slice(&ND_PAYLOAD.to_be_bytes());
    f[IP6 + 6] = 58;
    f[IP6 + 7] = 255;
    f[IP6 + 8..IP6 + 24].copy_from_slice(&src.octets());
    f[IP6 + 24..IP6 + 40].copy_from_slice(&group);
    f[ICMP6] = 135;
    f[ND_TARGET..ND_OPTION].copy_from_slice(&t);
    f[ND_OPTION..ND_OPTION + 2].copy_from_slice(&[1, 1]);
    f[ND_OPTION + 2..ND_FRAME].copy_from_slice(&mac.0);
    let mut pseudo = sum16(&f[IP6 + 8..IP6 + 40], 0);
    pseudo += u64::from(ND_PAYLOAD) + 58;
    let c = !fold(sum16(&f[ICMP6..ND_FRAME], pseudo));
    f[ICMP6 + 2..ICMP6 + 4].copy_from_slice(&c.to_be_bytes());
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    const ASKER: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
    const OWNER: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 2]);

    fn arp_request(sender: [u8; 4], target: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[0..6].copy_from_slice(&MacAddr::BROADCAST.0);
        f[6..12].copy_from_slice(&ASKER.0);
        f[12..14].copy_from_slice(&[8, 6]);
        f[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        f[22..28].copy_from_slice(&ASKER.0);
        f[28..32].copy_from_slice(&sender);
        f[38..42].copy_from_slice(&target);
        f
    }

    fn solicitation(src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
        super::solicitation(ASKER, src, target).to_vec()
    }

    /// The ICMPv6 checksum of an ND frame verifies (sums to 0xffff).
    fn checksum_ok(f: &[u8]) -> bool {
        let mut pseudo = sum16(&f[22..54], 0);
        pseudo += u64::from(ND_PAYLOAD) + 58;
        fold(sum16(&f[54..], pseudo)) == 0xffff
    }

    #[test]
    fn an_arp_request_becomes_the_owners_reply() {
        let mut f = arp_request([10, 0, 0, 1], [10, 0, 0, 2]);
        assert_eq!(question(&f), Some(Question::Arp(Ipv4Addr::new(10, 0, 0, 2))));
        assert!(answer(&mut f, OWNER));
        assert_eq!(&f[0..6], &ASKER.0);
        assert_eq!(&f[6..12], &OWNER.0);
        let a = crate::arp::ArpRepr::parse(&crate::arp::ArpPacket::new_checked(&f[14..]).unwrap());
        assert_eq!(a.operation, crate::arp::Operation::Reply);
        assert_eq!((a.sender_mac, a.sender_ip), (OWNER, [10, 0, 0, 2]));
        assert_eq!((a.target_mac, a.target_ip), (ASKER, [10, 0, 0, 1]));
        assert_eq!(question(&f), None, "a reply is not a question");
    }

    #[test]
    fn probes_announcements_and_replies_are_left_to_the_owner() {
        for f in [
            arp_request([0, 0, 0, 0], [10, 0, 0, 2]),  // RFC 5227 probe
            arp_request([10, 0, 0, 2], [10, 0, 0, 2]), // gratuitous
        ] {
            let mut g = f.clone();
            assert_eq!(question(&f), None);
            assert!(!answer(&mut g, OWNER));
            assert_eq!(f, g, "untouched");
        }
        let mut reply = arp_request([10, 0, 0, 1], [10, 0, 0, 2]);
        reply[21] = 2;
        assert_eq!(question(&reply), None);
        let mut rarp = arp_request([10, 0, 0, 1], [10, 0, 0, 2]);
        rarp[12..14].copy_from_slice(&[0x80, 0x35]);
        assert_eq!(question(&rarp), None);
    }

    #[test]
    fn a_solicitation_becomes_the_owners_advertisement() {
        let (src, target): (Ipv6Addr, Ipv6Addr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let mut f = solicitation(src, target);
        assert!(checksum_ok(&f));
        assert_eq!(question(&f), Some(Question::Nd(target)));
        assert!(answer(&mut f, OWNER));
        assert_eq!((&f[0..6], &f[6..12]), (&ASKER.0[..], &OWNER.0[..]));
        assert_eq!((v6(&f[22..38]), v6(&f[38..54])), (target, src));
        assert_eq!((f[21], f[54], f[55]), (255, 136, 0));
        assert_eq!(&f[58..62], &[0x60, 0, 0, 0], "Solicited and Override");
        assert_eq!(v6(&f[62..78]), target);
        assert_eq!(&f[78..86], &[2, 1, 0x52, 0x54, 0, 0, 0, 2]);
        assert!(checksum_ok(&f), "the advertisement's checksum");
        assert_eq!(question(&f), None, "an advertisement is not a question");
    }

    #[test]
    fn solicitations_outside_the_rules_are_left_to_the_owner() {
        let (src, target): (Ipv6Addr, Ipv6Addr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let base = solicitation(src, target);
        let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
        let mut f = solicitation(Ipv6Addr::UNSPECIFIED, target);
        cases.push(("duplicate address detection", f.clone()));
        f = base.clone();
        f[21] = 64;
        cases.push(("hop limit not 255", f.clone()));
        f = base.clone();
        f[20] = 0;
        cases.push(("an extension header", f.clone()));
        f = base.clone();
        f[78] = 14;
        cases.push(("another option", f.clone()));
        f = base.clone();
        f.push(0);
        cases.push(("longer", f.clone()));
        cases.push(("shorter", base[..ND_FRAME - 8].to_vec()));
        f = solicitation(src, "ff02::1".parse().unwrap());
        cases.push(("a multicast target", f.clone()));
        for (what, f) in cases {
            let mut g = f.clone();
            assert_eq!(question(&f), None, "{what}");
            assert!(!answer(&mut g, OWNER), "{what}");
            assert_eq!(f, g, "{what}: untouched");
        }
    }

    #[test]
    fn no_input_panics() {
        // Every length and a few byte patterns, around both kinds.
        let seeds = [
            arp_request([10, 0, 0, 1], [10, 0, 0, 2]),
            solicitation("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap()),
        ];
        for s in &seeds {
            for len in 0..=s.len() + 2 {
                let mut f = s.clone();
                f.resize(len, 0xff);
                let _ = question(&f);
                let _ = answer(&mut f, OWNER);
            }
        }
    }
}
