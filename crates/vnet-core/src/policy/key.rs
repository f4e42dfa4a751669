//! What identifies a flow ([`FlowKey`]): the flow table's key, and an
//! account's.

use std::net::IpAddr;
use vnet_wire::classify::{Icmp, Ip};
use vnet_wire::MacAddr;

/// What identifies a flow, or a fragmented packet's later fragments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// The policy's generation: a change of the rules starts every flow
    /// afresh (the old keys are never found again, and age out).
    pub generation: u64,
    pub network: u32,
    /// The frame's source and destination MACs: a flow is between two
    /// ports' VMs (port security ties a source MAC to its interface), so
    /// a flow allowed to one VM admits nothing sent to another with the
    /// same addresses and ports, and no other VM's frame is in it.
    pub src_mac: MacAddr,
    pub dst_mac: MacAddr,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    /// A fragmented packet's identification (with `fragment`), else 0.
    pub id: u32,
    pub fragment: bool,
}

impl FlowKey {
    /// The other direction's key.
    pub fn reversed(self) -> FlowKey {
        FlowKey {
            src_mac: self.dst_mac,
            dst_mac: self.src_mac,
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
            ..self
        }
    }
}

/// The flow key of an IP packet sent from MAC `src_mac` to `dst_mac` (the
/// frame's): ICMP echo keys on its identifier, the request's as its source
/// port and the reply's as its destination port, so a reply's key is its
/// request's reversed.
pub fn flow_key(generation: u64, network: u32, (src_mac, dst_mac): (MacAddr, MacAddr), ip: &Ip) -> FlowKey {
    let (sport, dport) = match ip.icmp {
        Icmp::Echo { request: true, id } => (id, 0),
        Icmp::Echo { request: false, id } => (0, id),
        _ => (ip.sport, ip.dport),
    };
    FlowKey {
        generation,
        network,
        src_mac,
        dst_mac,
        src: ip.src,
        dst: ip.dst,
        proto: ip.proto,
        sport,
        dport,
        id: 0,
        fragment: false,
    }
}

/// The key of a fragmented packet's later fragments (`id`: its
/// identification).
pub(super) fn fragment_key(
    generation: u64,
    network: u32,
    macs: (MacAddr, MacAddr),
    ip: &Ip,
    id: u32,
) -> FlowKey {
    FlowKey { sport: 0, dport: 0, id, fragment: true, ..flow_key(generation, network, macs, ip) }
}
