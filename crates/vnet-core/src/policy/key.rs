//! What identifies a flow ([`FlowKey`]): the flow table's key, and an
//! account's.

use std::net::IpAddr;
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
