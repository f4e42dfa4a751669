//! The inner flow hash: one flow keeps one outer source port (ECMP and RSS
//! spread flows, never reorder one) and one vhost-user queue pair.

use rustc_hash::FxHasher;
use std::hash::{Hash, Hasher};
use vnet_wire::ip::FlowKey;

/// A hash of the frame's flow key (MACs, EtherType, IP addresses, protocol,
/// ports): never a field that changes per packet.
pub fn flow_hash(frame: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    FlowKey::of(frame).hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_hash_ignores_per_packet_fields() {
        let mut a = vec![0u8; 60];
        a[12] = 0x08;
        a[14] = 0x45;
        a[23] = 6;
        a[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        a[34..38].copy_from_slice(&[0x9c, 0x40, 0x14, 0x51]);
        let mut b = a.clone();
        b[18] = 0x77; // IP id
        b[38] = 0x55; // TCP seq
        assert_eq!(flow_hash(&a), flow_hash(&b));
        b[35] = 0x41; // another source port
        assert_ne!(flow_hash(&a), flow_hash(&b));
        let _ = flow_hash(&a[..5]);
    }
}
