//! Where a link's datagrams leave this host: the device and gateway of
//! the route to its remote (this namespace's `/proc/net/route` or
//! `/proc/net/ipv6_route`), and the source address the kernel would pick.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};

/// The source address the kernel would pick towards `ip`.
pub(crate) fn local_ip_towards(ip: IpAddr) -> std::io::Result<IpAddr> {
    let any: IpAddr = if ip.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
    let s = UdpSocket::bind((any, 0))?;
    s.connect((ip, 9))?;
    Ok(s.local_addr()?.ip())
}

/// Where the route to an address leaves: its device, and its gateway
/// (`None`: the address is on the device's link).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    pub dev: String,
    pub gateway: Option<IpAddr>,
}

/// The longest-prefix route to `ip` (this namespace's `/proc/net/route`
/// or `/proc/net/ipv6_route`).
pub fn route_to(ip: IpAddr) -> Option<Hop> {
    Underlay::read().hop(ip)
}

/// This namespace's routes, read once (`/proc/net/route` and
/// `/proc/net/ipv6_route`), and the answers found with them: what a sync
/// over 1000 links asks 1000 times, asked once each.
#[derive(Debug, Default)]
pub struct Underlay {
    table: String,
    table6: String,
    ifindex: std::collections::HashMap<String, u32>,
    sources: std::collections::HashMap<IpAddr, IpAddr>,
}

impl Underlay {
    pub fn read() -> Self {
        Underlay {
            table: std::fs::read_to_string("/proc/net/route").unwrap_or_default(),
            table6: std::fs::read_to_string("/proc/net/ipv6_route").unwrap_or_default(),
            ..Default::default()
        }
    }

    /// The longest-prefix route to `ip`.
    pub fn hop(&self, ip: IpAddr) -> Option<Hop> {
        match vnet_control::canonical(ip) {
            IpAddr::V4(a) => best_route(&self.table, a),
            IpAddr::V6(a) => best_route6(&self.table6, a),
        }
    }

    /// The source address the kernel picks towards `ip`.
    pub(crate) fn source_towards(&mut self, ip: IpAddr) -> std::io::Result<IpAddr> {
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
            let gateway = (gw != 0).then(|| IpAddr::V4(Ipv4Addr::from(gw.to_ne_bytes())));
            best = Some((mask, Hop { dev: dev.to_string(), gateway }));
        }
    }
    best.map(|(_, h)| h)
}

/// `RTF_REJECT`: an unreachable route (the kernel's catch-all on `lo`).
const RTF_REJECT: u32 = 0x0200;

/// The longest-prefix route to `ip` in `/proc/net/ipv6_route`'s text:
/// destination, prefix length, source, source length, next hop, metric,
/// references, use, flags, device; addresses as 32 hex digits.
fn best_route6(table: &str, ip: Ipv6Addr) -> Option<Hop> {
    let addr = u128::from(ip);
    let mut best: Option<(u32, u32, Hop)> = None;
    for line in table.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [dst, len, _, _, hop, metric, _, _, flags, dev] = f[..] else { continue };
        let (Ok(dst), Ok(len), Ok(hop), Ok(metric), Ok(flags)) = (
            u128::from_str_radix(dst, 16),
            u32::from_str_radix(len, 16),
            u128::from_str_radix(hop, 16),
            u32::from_str_radix(metric, 16),
            u32::from_str_radix(flags, 16),
        ) else {
            continue;
        };
        if len > 128 || flags & RTF_REJECT != 0 || dev == "lo" {
            continue;
        }
        let mask = if len == 0 { 0 } else { u128::MAX << (128 - len) };
        let better = best.as_ref().is_none_or(|(l, m, _)| len > *l || (len == *l && metric < *m));
        if addr & mask == dst & mask && better {
            let gateway = (hop != 0).then(|| IpAddr::V6(Ipv6Addr::from(hop)));
            best = Some((len, metric, Hop { dev: dev.to_string(), gateway }));
        }
    }
    best.map(|(_, _, h)| h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_route_wins() {
        let t = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                 eth9\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                 u0\t00004D0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        let hop = |dev: &str, gateway: Option<Ipv4Addr>| {
            Some(Hop { dev: dev.into(), gateway: gateway.map(Into::into) })
        };
        assert_eq!(best_route(t, Ipv4Addr::new(10, 77, 0, 2)), hop("u0", None));
        assert_eq!(
            best_route(t, Ipv4Addr::new(8, 8, 8, 8)),
            hop("eth9", Some(Ipv4Addr::new(192, 168, 1, 1)))
        );
        assert_eq!(best_route("garbage\nx y z\n", Ipv4Addr::LOCALHOST), None);
    }

    #[test]
    fn longest_prefix_ipv6_route_wins_and_reject_routes_are_no_route() {
        // What `ip -6 route` makes of an underlay /64 on u0, a default via
        // a router on eth9, the host's own address (on lo) and the
        // kernel's unreachable catch-all.
        let t = "fd000077000000000000000000000000 40 00000000000000000000000000000000 00 \
                 00000000000000000000000000000000 00000100 00000001 00000000 00000001       u0\n\
                 00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
                 fe800000000000000000000000000001 00000400 00000001 00000000 00000003     eth9\n\
                 fd000077000000000000000000000001 80 00000000000000000000000000000000 00 \
                 00000000000000000000000000000000 00000000 00000002 00000000 80200001       lo\n\
                 00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
                 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n";
        let a = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        assert_eq!(best_route6(t, a("fd00:77::2")), Some(Hop { dev: "u0".into(), gateway: None }));
        assert_eq!(
            best_route6(t, a("2001:db8::1")),
            Some(Hop { dev: "eth9".into(), gateway: Some(a("fe80::1").into()) })
        );
        assert_eq!(best_route6("", a("fd00:77::2")), None);
        assert_eq!(best_route6("garbage\n1 2 3\n", a("::1")), None);
    }
}
