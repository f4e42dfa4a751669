//! Who an address belongs to: the addresses the claims name, each
//! answered for at every host's edge only while exactly one VM claims it.
//! Two claims of one address are a conflict that no host answers for (its
//! requests are flooded, as to an address no one names), so a host cannot
//! take another host's VM's address by naming it in its own claim.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use vnet_wire::MacAddr;

/// The claimed addresses by (vnet network, address): the MAC of the first
/// claim seen, and the addresses several MACs claim, with them all.
pub type Claimed = (BTreeMap<(u32, IpAddr), MacAddr>, BTreeMap<(u32, IpAddr), BTreeSet<MacAddr>>);

/// What `claims` (each MAC with its claim's addresses) make of network
/// `tenant`'s addresses.
pub fn claimed<'a>(claims: impl Iterator<Item = (&'a MacAddr, &'a Box<[IpAddr]>)>, tenant: u32) -> Claimed {
    let mut table = BTreeMap::new();
    let mut conflicts: BTreeMap<_, BTreeSet<MacAddr>> = BTreeMap::new();
    for (m, addrs) in claims {
        for ip in addrs.iter() {
            let k = (tenant, *ip);
            match table.get(&k) {
                Some(held) if held != m => {
                    conflicts.entry(k).or_default().extend([*held, *m]);
                }
                Some(_) => {}
                None => {
                    table.insert(k, *m);
                }
            }
        }
    }
    (table, conflicts)
}
