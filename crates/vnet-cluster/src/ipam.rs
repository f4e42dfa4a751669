//! Addresses that hold across hosts: one key per allocated address, under
//! the allocating host's own prefix (only it writes there: its etcd role,
//! [`crate::layout::host_grants`]) and its lease, so that a dead host's
//! addresses go with its lease; the daemon puts its own back under a new
//! lease when it comes back. Two hosts that pick one address at once both
//! write it, each under its own key; each then lists the pool, and the one
//! whose key was created later (etcd's `create_revision`; the host name
//! breaks a tie) gives its up and picks again ([`winner`]), so an address
//! has one holder. This module is the layout and the choice of an address;
//! the daemon does the etcd requests.
//!
//! ```text
//! /vnet/<network>/ipam/<host>/<subnet>/<address>   {"host":"h1","owner":"podnet/3f2a.../eth0"}
//! ```
//!
//! (`<subnet>` is `10.88.0.0_24`: the key has no further `/` there.)
//! Owners are checked where the `ipam` line is parsed
//! ([`vnet_control::IpamOp`]).

use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The part of a network's prefix that holds allocations, every host's.
pub fn prefix(network: &str) -> String {
    format!("/vnet/{network}/ipam/")
}

/// The prefix of host `host`'s allocations (only it writes there).
pub use crate::layout::ipam_prefix as host_prefix;

/// The name of `pool` in its allocations' keys (`10.88.0.0_24`).
pub fn pool_name(pool: &Pool) -> String {
    format!("{}_{}", pool.subnet, pool.len)
}

/// The key of host `host`'s allocation of `addr` in `pool`.
pub fn key(network: &str, host: &str, pool: &Pool, addr: IpAddr) -> String {
    format!("{}{}/{addr}", host_prefix(network, host), pool_name(pool))
}

/// An allocation's key under `network`'s [`prefix`]: its host, pool name
/// and address; `None` for a key of another form.
pub fn parse_key<'a>(network: &str, key: &'a str) -> Option<(&'a str, &'a str, IpAddr)> {
    let rest = key.strip_prefix(&prefix(network))?;
    let (host, rest) = rest.split_once('/')?;
    let (pool, addr) = rest.split_once('/')?;
    let ok = crate::layout::valid_name(host) && !pool.is_empty();
    Some((host, pool, addr.parse().ok()?)).filter(|_| ok)
}

/// Of several hosts' keys for one address, each with its etcd
/// `create_revision`, the one that holds it: the first created, the host
/// name breaking a tie. Every host computes the same.
pub fn winner<'a>(claims: impl IntoIterator<Item = (&'a str, i64)>) -> Option<&'a str> {
    claims.into_iter().min_by(|a, b| (a.1, a.0).cmp(&(b.1, b.0))).map(|(h, _)| h)
}

/// An allocation's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub host: String,
    /// Who holds it: the CNI network, container ID and interface.
    pub owner: String,
}

impl Allocation {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads a value; `None` for one that is not an allocation.
    pub fn from_json(b: &[u8]) -> Option<Allocation> {
        serde_json::from_slice(b).ok()
    }
}

/// A subnet and the addresses of it to hand out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    /// The subnet's first address (host bits zero).
    pub subnet: IpAddr,
    pub len: u8,
    pub first: IpAddr,
    pub last: IpAddr,
}

fn bits(a: IpAddr) -> (u128, u32) {
    match a {
        IpAddr::V4(a) => (u32::from(a) as u128, 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    }
}

fn addr(v: u128, width: u32) -> IpAddr {
    if width == 32 {
        IpAddr::V4(Ipv4Addr::from(v as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(v))
    }
}

/// Why a pool was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("subnet `{0}`: expected ADDR/LEN, e.g. 10.88.0.0/24")]
    Subnet(String),
    #[error("subnet `{subnet}`: a prefix of {min} to {max} bits")]
    Prefix { subnet: String, min: u32, max: u32 },
    #[error("range: expected two addresses of {0}, the first not after the last")]
    Range(String),
}

impl Pool {
    /// `subnet` (`ADDR/LEN`) with `range` (first, last) inside it, or the
    /// whole subnet less its network address and, for IPv4 shorter than
    /// /31, its broadcast address.
    pub fn new(subnet: &str, range: Option<(IpAddr, IpAddr)>) -> Result<Pool, PoolError> {
        let bad = || PoolError::Subnet(subnet.to_string());
        let (a, l) = subnet.split_once('/').ok_or_else(bad)?;
        let a: IpAddr = a.parse().map_err(|_| bad())?;
        let len: u8 = l.parse().map_err(|_| bad())?;
        let (v, width) = bits(a);
        if u32::from(len) > width || u32::from(len) < width.saturating_sub(24) {
            let (subnet, min, max) = (subnet.to_string(), width.saturating_sub(24), width);
            return Err(PoolError::Prefix { subnet, min, max });
        }
        let host_bits = width - u32::from(len);
        let mask = if host_bits == 128 { u128::MAX } else { (1u128 << host_bits) - 1 };
        let net = v & !mask;
        let top = net | mask;
        let (lo, hi) = if width == 32 && host_bits >= 2 { (net + 1, top - 1) } else { (net, top) };
        let (first, last) = match range {
            Some((f, l)) => {
                let (f, fw) = bits(f);
                let (l, lw) = bits(l);
                if fw != width || lw != width || f < lo || l > hi || f > l {
                    return Err(PoolError::Range(subnet.to_string()));
                }
                (f, l)
            }
            None => (lo, hi),
        };
        Ok(Pool { subnet: addr(net, width), len, first: addr(first, width), last: addr(last, width) })
    }

    /// Addresses in the pool.
    pub fn size(&self) -> u128 {
        bits(self.last).0 - bits(self.first).0 + 1
    }

    /// Whether `a` is one of the pool's addresses.
    pub fn contains(&self, a: IpAddr) -> bool {
        let (v, w) = bits(a);
        w == bits(self.first).1 && v >= bits(self.first).0 && v <= bits(self.last).0
    }

    /// Up to `n` free addresses (not in `taken`), starting at a place that
    /// `owner` picks, so that hosts allocating at once mostly try different
    /// addresses; wraps around the pool.
    pub fn candidates(&self, owner: &str, taken: &HashSet<IpAddr>, n: usize) -> Vec<IpAddr> {
        let (first, width) = bits(self.first);
        let size = self.size();
        // FNV-1a: a spread, not a secret.
        let h =
            owner.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3));
        let start = u128::from(h) % size;
        let mut out = Vec::new();
        let mut i = 0u128;
        while i < size && out.len() < n {
            let a = addr(first + (start + i) % size, width);
            if !taken.contains(&a) {
                out.push(a);
            }
            // At most taken.len() steps find a taken address: the loop
            // ends within taken.len() + n steps, whatever the pool's size.
            i += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_pool_is_its_subnet_less_network_and_broadcast_or_its_range() {
        let p = Pool::new("10.88.0.7/24", None).unwrap();
        assert_eq!(
            (p.subnet, p.first, p.last, p.size()),
            (ip("10.88.0.0"), ip("10.88.0.1"), ip("10.88.0.254"), 254)
        );
        let r = Pool::new("10.88.0.0/24", Some((ip("10.88.0.10"), ip("10.88.0.12")))).unwrap();
        assert_eq!(r.size(), 3);
        assert!(r.contains(ip("10.88.0.11")) && !r.contains(ip("10.88.0.13")));
        assert!(Pool::new("10.88.0.0/24", Some((ip("10.88.1.1"), ip("10.88.1.2")))).is_err());
        assert!(Pool::new("10.88.0.0/24", Some((ip("10.88.0.9"), ip("10.88.0.2")))).is_err());
        assert!(Pool::new("10.88.0.0", None).is_err());
        assert!(Pool::new("10.0.0.0/4", None).is_err(), "too many addresses to list");
        let v6 = Pool::new("fd00::/120", None).unwrap();
        assert_eq!(v6.size(), 256);
        assert_eq!(pool_name(&p), "10.88.0.0_24");
    }

    #[test]
    fn candidates_are_free_distinct_and_run_out_when_the_pool_does() {
        let p = Pool::new("10.88.0.0/29", None).unwrap(); // .1 to .6
        let mut taken = HashSet::new();
        for i in 0..6 {
            let c = p.candidates(&format!("owner{i}"), &taken, 1);
            assert_eq!(c.len(), 1, "{i}");
            assert!(p.contains(c[0]) && taken.insert(c[0]));
        }
        assert!(p.candidates("late", &taken, 3).is_empty(), "exhausted");
        let fresh = p.candidates("x", &HashSet::new(), 10);
        assert_eq!(fresh.len(), 6);
        assert_eq!(fresh.iter().collect::<HashSet<_>>().len(), 6);
    }

    /// An owner's first candidate is the FNV-1a hash of its name modulo
    /// the pool's size, from the first address (FNV-1a("a") is
    /// 0xaf63dc4c8601ec8c: 72 modulo 254), and the next ones follow and
    /// wrap; each address's key names the pool.
    #[test]
    fn an_owner_starts_where_its_hash_says_and_keys_name_the_pool() {
        let p = Pool::new("10.88.0.0/24", None).unwrap();
        let c = p.candidates("a", &HashSet::new(), 2);
        assert_eq!(c, [ip("10.88.0.73"), ip("10.88.0.74")]);
        let taken: HashSet<IpAddr> = [ip("10.88.0.73")].into();
        assert_eq!(p.candidates("a", &taken, 1), [ip("10.88.0.74")]);
        let tail = Pool::new("10.88.0.0/24", Some((ip("10.88.0.70"), ip("10.88.0.74")))).unwrap();
        // The hash modulo 5 is 1: .71 to .74, then .70.
        let all = [ip("10.88.0.71"), ip("10.88.0.72"), ip("10.88.0.73"), ip("10.88.0.74"), ip("10.88.0.70")];
        assert_eq!(tail.candidates("a", &HashSet::new(), 5), all);
        let k = key("n", "h1", &p, ip("10.88.0.73"));
        assert_eq!(k, "/vnet/n/ipam/h1/10.88.0.0_24/10.88.0.73");
        assert_eq!(parse_key("n", &k), Some(("h1", "10.88.0.0_24", ip("10.88.0.73"))));
        for bad in [
            "/vnet/n/ipam/10.88.0.0_24/10.88.0.73",
            "/vnet/n/ipam/a b/p/10.0.0.1",
            "/vnet/m/ipam/h1/p/10.0.0.1",
        ] {
            assert_eq!(parse_key("n", bad), None, "{bad}");
        }
    }

    /// Two hosts' keys for one address: the first created holds it, the
    /// name breaks a tie, whatever order they are listed in.
    #[test]
    fn of_two_keys_for_one_address_the_first_created_holds_it() {
        assert_eq!(winner([("h2", 7), ("h1", 9)]), Some("h2"));
        assert_eq!(winner([("h1", 9), ("h2", 7)]), Some("h2"));
        assert_eq!(winner([("h2", 7), ("h1", 7)]), Some("h1"));
        assert_eq!(winner([]), None);
    }

    #[test]
    fn values_are_checked() {
        let a = Allocation { host: "h1".into(), owner: "n/c/eth0".into() };
        assert_eq!(Allocation::from_json(&a.to_json()), Some(a));
        assert_eq!(Allocation::from_json(b"junk"), None);
    }
}
