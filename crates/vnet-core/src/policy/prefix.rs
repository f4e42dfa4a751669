//! Address prefixes, as the rules and the NetworkPolicies' `ipBlock`s
//! name them (a file of its own so that both use it without importing
//! each other).

use std::net::IpAddr;

/// Whether `ip` is in `net/len`.
pub fn in_prefix(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len.min(32))) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len.min(128))) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}
