//! Why a frame was dropped: one list for both data paths.
//!
//! Every place the user path (vnet-engine) or the kernel path (vnetd's eBPF
//! program, through its `S_*` counters) drops a frame names one
//! [`DropReason`]. Its [`name`](DropReason::name) is stable snake_case: what
//! `vnetctl show drops` and `monitor drops` print, the `reason` label of
//! `vnet_drops_total` in `show metrics`, and the key scripts match on. A
//! name, once published, is never changed or reused; a new reason is a new
//! variant at the end (its number is its place, which ring records carry).

/// Why a frame was dropped. `#[repr(u8)]`: a ring record keeps the number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DropReason {
    /// No route matched the frame (its destination MAC is unknown here).
    NoRoute,
    /// A network's policy denied it (the rule, or the default, named).
    PolicyDenied,
    /// From an interface locked to a MAC (port security), another source MAC.
    SpoofedSourceMac,
    /// From a guarded interface, an IP (or ARP/ND) source it does not own.
    SpoofedSourceIp,
    /// A `vnet` datagram carrying another network id than its link's.
    WrongNetwork,
    /// Too short or malformed to route (a frame, a datagram, a header).
    Malformed,
    /// Larger than a link that cannot fragment carries (VXLAN).
    MtuExceeded,
    /// A datagram from an address (or VNI) that is no configured link.
    UnknownSource,
    /// A `vnet` datagram with a flag this vnetd does not handle.
    UnsupportedFlags,
    /// An offload header no port would accept.
    BadOffloadHeader,
    /// An offloaded frame whose checksum or segments could not be made.
    OffloadFailed,
    /// A VM's broadcasts past its interface's `broadcast-limit`.
    BroadcastLimited,
    /// The destination port did not take it (a full queue, a device error).
    TxFailed,
    /// The kernel program's helper failed (encapsulation, decapsulation,
    /// an ARP answer): the frame was dropped in the kernel.
    KernelError,
    /// A secured link's datagram that did not authenticate (forged,
    /// corrupted, replayed, or of a session that is gone).
    AuthFailed,
    /// A relayed datagram this host would not take or pass on (not
    /// relaying, an unknown destination, not from the relay named).
    RelayRefused,
}

impl DropReason {
    /// Every reason, in number order.
    pub const ALL: [DropReason; 16] = [
        DropReason::NoRoute,
        DropReason::PolicyDenied,
        DropReason::SpoofedSourceMac,
        DropReason::SpoofedSourceIp,
        DropReason::WrongNetwork,
        DropReason::Malformed,
        DropReason::MtuExceeded,
        DropReason::UnknownSource,
        DropReason::UnsupportedFlags,
        DropReason::BadOffloadHeader,
        DropReason::OffloadFailed,
        DropReason::BroadcastLimited,
        DropReason::TxFailed,
        DropReason::KernelError,
        DropReason::AuthFailed,
        DropReason::RelayRefused,
    ];
    /// How many reasons there are (a counter array's length).
    pub const COUNT: usize = Self::ALL.len();

    /// The stable name.
    pub const fn name(self) -> &'static str {
        match self {
            DropReason::NoRoute => "no_route",
            DropReason::PolicyDenied => "policy_denied",
            DropReason::SpoofedSourceMac => "spoofed_source_mac",
            DropReason::SpoofedSourceIp => "spoofed_source_ip",
            DropReason::WrongNetwork => "wrong_network",
            DropReason::Malformed => "malformed",
            DropReason::MtuExceeded => "mtu_exceeded",
            DropReason::UnknownSource => "unknown_source",
            DropReason::UnsupportedFlags => "unsupported_flags",
            DropReason::BadOffloadHeader => "bad_offload_header",
            DropReason::OffloadFailed => "offload_failed",
            DropReason::BroadcastLimited => "broadcast_limited",
            DropReason::TxFailed => "tx_failed",
            DropReason::KernelError => "kernel_error",
            DropReason::AuthFailed => "auth_failed",
            DropReason::RelayRefused => "relay_refused",
        }
    }

    /// The reason of number `n` (a ring record's), if there is one.
    pub fn from_u8(n: u8) -> Option<DropReason> {
        Self::ALL.get(n as usize).copied()
    }

    /// The reason of a stable name.
    pub fn from_name(s: &str) -> Option<DropReason> {
        Self::ALL.into_iter().find(|r| r.name() == s)
    }
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

// Each reason is at its number in ALL (so `from_u8` is the inverse of `as u8`).
const _: () = {
    let mut i = 0;
    while i < DropReason::COUNT {
        assert!(DropReason::ALL[i] as usize == i, "DropReason::ALL: a reason is not at its number");
        i += 1;
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_one_snake_case_name_that_round_trips() {
        let mut seen = std::collections::HashSet::new();
        for r in DropReason::ALL {
            let n = r.name();
            assert!(seen.insert(n), "{n} twice");
            assert!(
                !n.is_empty()
                    && n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                    && !n.starts_with('_'),
                "{n} is not snake_case"
            );
            assert_eq!(DropReason::from_name(n), Some(r));
            assert_eq!(DropReason::from_u8(r as u8), Some(r));
        }
        assert_eq!(DropReason::from_u8(DropReason::COUNT as u8), None);
        assert_eq!(DropReason::from_name("nope"), None);
    }

    #[test]
    fn published_names_keep_their_numbers() {
        // Ring records and scripts carry these: a change here is a break.
        let fixed = [(0, "no_route"), (1, "policy_denied"), (2, "spoofed_source_mac"), (4, "wrong_network")];
        for (n, name) in fixed {
            assert_eq!(DropReason::from_u8(n).map(DropReason::name), Some(name));
        }
    }
}
