//! Where a link's datagrams leave this host: the device and gateway of
//! the route to its remote (this namespace's `/proc/net/route`), and the
//! source address the kernel would pick.

use std::net::{IpAddr, Ipv4Addr, UdpSocket};

/// The source address the kernel would pick towards `ip`.
pub(crate) fn local_ip_towards(ip: Ipv4Addr) -> std::io::Result<Ipv4Addr> {
    let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    s.connect((ip, 9))?;
    match s.local_addr()?.ip() {
        IpAddr::V4(a) => Ok(a),
        IpAddr::V6(_) => Err(std::io::Error::other("an IPv6 source")),
    }
}

/// Where the route to an address leaves: its device, and its gateway
/// (`None`: the address is on the device's link).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    pub dev: String,
    pub gateway: Option<Ipv4Addr>,
}

/// The longest-prefix IPv4 route to `ip` (this namespace's
/// `/proc/net/route`).
pub fn route_to(ip: Ipv4Addr) -> Option<Hop> {
    Underlay::read().hop(ip)
}

/// This namespace's IPv4 routes, read once (`/proc/net/route`), and the
/// answers found with them: what a sync over 1000 links asks 1000 times,
/// asked once each.
#[derive(Debug, Default)]
pub struct Underlay {
    table: String,
    ifindex: std::collections::HashMap<String, u32>,
    sources: std::collections::HashMap<Ipv4Addr, Ipv4Addr>,
}

impl Underlay {
    pub fn read() -> Self {
        Underlay {
            table: std::fs::read_to_string("/proc/net/route").unwrap_or_default(),
            ..Default::default()
        }
    }

    /// The longest-prefix route to `ip`.
    pub fn hop(&self, ip: Ipv4Addr) -> Option<Hop> {
        best_route(&self.table, ip)
    }

    /// The source address the kernel picks towards `ip`.
    pub(crate) fn source_towards(&mut self, ip: Ipv4Addr) -> std::io::Result<Ipv4Addr> {
        if let Some(&a) = self.sources.get(&ip) {
            return Ok(a);
        }
        let a = local_ip_towards(ip)?;
        self.sources.insert(ip, a);
        Ok(a)
    }

    /// Device `dev`'s index, asked once per device.
    pub(crate) fn ifindex(&mut self, dev: &str) -> std::io::Result<u32> {
        if let Some(&i) = self.ifindex.get(dev) {
            return Ok(i);
        }
        let i = crate::sys::ifindex(dev)?;
        self.ifindex.insert(dev.to_string(), i);
        Ok(i)
    }
}

fn best_route(table: &str, ip: Ipv4Addr) -> Option<Hop> {
    let addr = u32::from_ne_bytes(ip.octets());
    let mut best: Option<(u32, Hop)> = None;
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(dev), Some(dst), Some(gw), Some(mask)) = (f.first(), f.get(1), f.get(2), f.get(7)) else {
            continue;
        };
        let word = |s: &str| u32::from_str_radix(s, 16);
        let (Ok(dst), Ok(gw), Ok(mask)) = (word(dst), word(gw), word(mask)) else { continue };
        // The file holds the kernel's in-memory (network order) words.
        if addr & mask == dst && best.as_ref().is_none_or(|(m, _)| mask.count_ones() > m.count_ones()) {
            let gateway = (gw != 0).then(|| Ipv4Addr::from(gw.to_ne_bytes()));
            best = Some((mask, Hop { dev: dev.to_string(), gateway }));
        }
    }
    best.map(|(_, h)| h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_route_wins() {
        let t = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                 eth9\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                 u0\t00004D0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        let hop = |dev: &str, gateway| Some(Hop { dev: dev.into(), gateway });
        assert_eq!(best_route(t, Ipv4Addr::new(10, 77, 0, 2)), hop("u0", None));
        assert_eq!(
            best_route(t, Ipv4Addr::new(8, 8, 8, 8)),
            hop("eth9", Some(Ipv4Addr::new(192, 168, 1, 1)))
        );
        assert_eq!(best_route("garbage\nx y z\n", Ipv4Addr::LOCALHOST), None);
    }
}
