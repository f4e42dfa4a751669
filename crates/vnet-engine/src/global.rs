//! The daemon-wide counters: what no single port or link accounts for
//! (unknown sources, malformed datagrams, relaying, roaming, reassembly),
//! and the little state behind them (the stranger initiations' budget, the
//! roamed peers' addresses, the secured sessions' index). Every layer of
//! the engine counts here, so it sits below all of them.

use crate::DispatchStats;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Daemon-wide counters. Serialized as they are named here (`show stats`'
/// `global`, and `vnet_<name>` in Prometheus text): the doc comment of
/// each field is its documentation. The link worker's dispatch is added
/// with a `link_` prefix by whoever reports it.
#[derive(Debug, Default, serde::Serialize)]
pub struct Global {
    /// Who talks to whom on the user path (`show matrix`).
    #[serde(skip)]
    pub matrix: crate::matrix::Matrix,
    /// Frames no route matched.
    pub no_route: AtomicU64,
    /// Frames a network's policy denied (per rule: `show policy`).
    pub policy_denied: AtomicU64,
    /// Datagrams from an address (or VNI) that is not a configured link.
    pub unknown_source: AtomicU64,
    /// Whether this vnetd relays between its secured peers (`--relay`),
    /// the datagrams it passed on, and the relayed datagrams it refused
    /// (not relaying, an unknown destination, not from the relay named).
    pub relay: std::sync::atomic::AtomicBool,
    pub relayed: AtomicU64,
    pub relay_refused: AtomicU64,
    /// Times a secured link followed its peer to a new address (an
    /// authenticated datagram from there).
    pub roams: AtomicU64,
    /// Datagrams from an address that is not their link's that did not
    /// authenticate (forged, replayed, stale): the link stayed where it was.
    pub roams_refused: AtomicU64,
    /// Handshake initiations from addresses no link is configured with,
    /// read to find their link ([`crate::Plane::roaming_link`]), and those left
    /// unread because more than [`STRANGER_INITS_PER_SEC`] came in a second.
    pub stranger_initiations: AtomicU64,
    pub stranger_initiations_limited: AtomicU64,
    /// Initiations from unknown addresses whose first MAC was not made for
    /// this host's key: dropped after one HMAC, before the budget above.
    pub stranger_initiations_bad_mac: AtomicU64,
    /// The second (engine clock) and count of the stranger initiations read.
    #[serde(skip)]
    stranger_window: AtomicU64,
    /// The secured links' session indices (a stranger's data datagram
    /// finds its candidate link here).
    #[serde(skip)]
    pub sessions: Arc<crate::secure::Sessions>,
    /// Where roamed links' peers are now: address -> link id (checked
    /// against the link's endpoint when used, so a stale entry is harmless).
    #[serde(skip)]
    pub roamed: arc_swap::ArcSwap<std::collections::HashMap<std::net::IpAddr, u32>>,
    /// Frames or datagrams too short or malformed to route.
    pub malformed: AtomicU64,
    /// `vnet` datagrams carrying another network id than the link's.
    pub wrong_network: AtomicU64,
    /// `vnet` datagrams with a flag this vnetd does not handle (AUTH).
    pub unsupported_flags: AtomicU64,
    /// Reassembly, as last reported by the link worker.
    pub reasm_fragments: AtomicU64,
    pub reasm_completed: AtomicU64,
    pub reasm_timed_out: AtomicU64,
    pub reasm_evicted: AtomicU64,
    pub reasm_rejected: AtomicU64,
    /// Route cache totals over all workers.
    pub route_cache_hits: AtomicU64,
    pub route_cache_misses: AtomicU64,
    /// Frames delivered from a GRO batch without reassembly.
    pub rx_whole_batches: AtomicU64,
    /// Of those, frames that came as two GRO batches (more datagrams than
    /// one GSO send takes) and went on from both.
    pub rx_whole_pairs: AtomicU64,
    /// TCP GSO frames made of segments that arrived on `raw` or VXLAN
    /// links (`vnet_wire::gro`), and the segments in them.
    pub rx_gro_frames: AtomicU64,
    pub rx_gro_segments: AtomicU64,
    /// `recvmmsg` calls on the link sockets that returned messages, and the
    /// messages they returned (their ratio is the receive batching).
    pub link_recv_calls: AtomicU64,
    pub link_recv_messages: AtomicU64,
    /// Offloaded frames finished in software for a plain destination.
    pub sw_segmented: AtomicU64,
    pub sw_checksummed: AtomicU64,
    /// Offloaded frames whose headers could not be finished (dropped).
    pub offload_errors: AtomicU64,
    /// Frames whose `virtio_net_hdr` no port would accept (unknown GSO type
    /// or flags, no segment size, a checksum outside the frame): dropped.
    pub bad_offload_hdr: AtomicU64,
    /// Frames from a VM with another source MAC than its interface's `mac`.
    pub spoofed_source_mac: AtomicU64,
    /// Frames from a VM whose IPv4 or IPv6 source address (or ARP sender
    /// address) is not one its interface owns (the IP source guard, on an
    /// interface that owns at least one), or cannot be read.
    pub spoofed_source_ip: AtomicU64,
    /// ARP requests and neighbour solicitations from VMs answered by this
    /// host (`neigh`): none of them left it.
    pub neigh_answered: AtomicU64,
    /// Those it could not answer (no `neigh` for the address in the VM's
    /// network), sent on as broadcasts.
    pub neigh_flooded: AtomicU64,
    /// Interfaces or links where the kernel refused an offload.
    pub offload_refused: AtomicU64,
    pub gso_fallbacks: AtomicU64,
    /// The link worker's dispatch.
    #[serde(skip)]
    pub link_dispatch: Arc<DispatchStats>,
    /// Drops by reason and the workers' last drops (`show drops`).
    #[serde(skip)]
    pub drops: crate::drops::DropBook,
}

/// Initiations from unknown addresses read in a second at most (each costs
/// two Diffie-Hellman operations).
pub const STRANGER_INITS_PER_SEC: u64 = 50;

impl Global {
    /// Whether one more initiation from an unknown address may be read now.
    pub(crate) fn stranger_initiation(&self, now_ns: u64) -> bool {
        let sec = now_ns / 1_000_000_000;
        let w = self.stranger_window.load(Relaxed);
        let (wsec, n) = (w >> 20, w & 0xf_ffff);
        let next = if wsec == sec { n + 1 } else { 1 };
        if wsec == sec && n >= STRANGER_INITS_PER_SEC {
            self.stranger_initiations_limited.fetch_add(1, Relaxed);
            return false;
        }
        self.stranger_window.store(sec << 20 | next, Relaxed);
        self.stranger_initiations.fetch_add(1, Relaxed);
        true
    }

    /// Datagrams from `ip` belong to link `id` (it roamed there). Entries
    /// are bounded by the links: one per link, the newest.
    pub fn remember_roam(&self, ip: std::net::IpAddr, id: u32) {
        self.roamed.rcu(|m| {
            let mut m: std::collections::HashMap<_, _> = (**m).clone();
            m.retain(|_, l| *l != id);
            m.insert(ip, id);
            m
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strangers_initiations_are_read_fifty_a_second_counted_by_the_second_they_arrive_in() {
        let g = Global::default();
        let (s5, s6) = (5_500_000_000, 6_000_000_000);
        assert!((0..STRANGER_INITS_PER_SEC).all(|_| g.stranger_initiation(s5)));
        assert!(!g.stranger_initiation(s5 + 400_000_000), "the 51st within second 5");
        assert!(g.stranger_initiation(s6), "second 6: a new count");
        assert_eq!(g.stranger_initiations.load(Relaxed), STRANGER_INITS_PER_SEC + 1);
        assert_eq!(g.stranger_initiations_limited.load(Relaxed), 1);
        // A second far on (its number wider than 20 bits) keeps its own count.
        let late = 3_000_000 * 1_000_000_000;
        assert!((0..STRANGER_INITS_PER_SEC).all(|_| g.stranger_initiation(late)));
        assert!(!g.stranger_initiation(late));
    }

    #[test]
    fn a_roamed_link_is_remembered_at_its_newest_address_only_and_others_stay() {
        let g = Global::default();
        let ip = |d: u8| std::net::IpAddr::from([10, 0, 0, d]);
        g.remember_roam(ip(1), 1);
        g.remember_roam(ip(2), 2);
        g.remember_roam(ip(3), 1);
        let m = g.roamed.load();
        let mut have: Vec<_> = m.iter().map(|(a, l)| (*a, *l)).collect();
        have.sort();
        assert_eq!(have, [(ip(2), 2), (ip(3), 1)]);
    }
}
