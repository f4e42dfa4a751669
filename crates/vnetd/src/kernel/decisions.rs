//! Decision compilation: the published route table, evaluated by the
//! same [`vnet_core::RouteTable::lookup`] the workers use, turned into the
//! kernel map's entries (port, destination, source) -> one destination.

#[cfg(test)]
use super::maps::MAX_ROUTES;
use super::maps::{ACT_IFACE_PEER, ACT_IFACE_XMIT, ACT_LINK, PORT_LINK};
use super::KernelIface;
use crate::sys::bpf::{LinkVal, RouteKey, RouteVal};
use std::collections::{BTreeMap, BTreeSet};
use vnet_core::{MacSpec, Port};
use vnet_engine::Plane;
use vnet_wire::MacAddr;

/// The decisions the kernel can carry out: for each port it serves and each
/// pair of distinct known unicast MACs, the one destination the route table
/// gives, when that is a kernel interface (or, from an interface, a link the
/// kernel can send on). Returns them (at most `capacity`, the map's size)
/// and how many did not fit the map.
///
/// The map is keyed by (port, destination, source), so a network of many
/// MACs (a cluster of 100000 VMs) has far more decisions than the map's
/// [`MAX_ROUTES`]: those stay with the user path, counted. The work is
/// bounded too: from a link only destinations that a route sends to a
/// kernel interface are tried, and once the map is full the rest is not
/// computed (the count is then an upper bound), so a transaction over
/// 100000 MACs costs milliseconds here, not the square of them.
pub fn decisions(
    plane: &Plane,
    ifaces: &BTreeMap<u32, KernelIface>,
    kernel_links: &BTreeMap<u32, LinkVal>,
    slots: &BTreeMap<u32, u32>,
    capacity: usize,
) -> (BTreeMap<RouteKey, RouteVal>, usize) {
    let slot = |p: u32| slots.get(&p).copied().unwrap_or(0);
    let mut macs: BTreeSet<MacAddr> = BTreeSet::new();
    for r in plane.table.routes() {
        for spec in [r.src, r.dst] {
            if let Some(m) = spec.addr() {
                if !m.is_group() {
                    macs.insert(m);
                }
            }
        }
    }
    for p in plane.ifaces.values() {
        if let Some(m) = p.mac {
            macs.insert(m);
        }
    }
    let mut ports: Vec<(Port, u32)> =
        ifaces.iter().map(|(id, k)| (Port::Interface(*id), k.ifindex)).collect();
    ports.extend(kernel_links.keys().map(|id| (Port::Link(*id), PORT_LINK | id)));
    // Destinations a link's frames can have in the kernel: those routed to
    // a kernel interface (all of them if such a route matches any MAC).
    let mut to_kernel: BTreeSet<MacAddr> = BTreeSet::new();
    let mut to_kernel_any = false;
    for r in plane.table.routes() {
        if let Port::Interface(i) = r.to {
            if ifaces.contains_key(&i) {
                match r.dst {
                    MacSpec::Addr(m) => {
                        to_kernel.insert(m);
                    }
                    MacSpec::None => {}
                    MacSpec::Any | MacSpec::Not(_) => to_kernel_any = true,
                }
            }
        }
    }
    let link_dsts: Vec<MacAddr> = if to_kernel_any {
        macs.iter().copied().collect()
    } else {
        to_kernel.intersection(&macs).copied().collect()
    };
    let all_dsts: Vec<MacAddr> = macs.iter().copied().collect();
    let candidates: usize = ports
        .iter()
        .map(|(p, _)| macs.len() * if p.is_link() { link_dsts.len() } else { all_dsts.len() })
        .sum();
    let mut visited = 0;
    let mut out = BTreeMap::new();
    let mut overflow = 0;
    let mut found = Vec::new();
    for &(port, key_port) in &ports {
        let dsts = if port.is_link() { &link_dsts } else { &all_dsts };
        for &s in &macs {
            if out.len() >= capacity {
                // Full: what is left is the user path's.
                return (out, overflow + candidates.saturating_sub(visited));
            }
            visited += dsts.len();
            // Port security: from an interface locked to a MAC, frames with
            // another source are the user path's (which drops and counts
            // them); so is everything from a standby interface (the user
            // path sees its VM arrive).
            if let Port::Interface(i) = port {
                let user = |f: &std::sync::Arc<vnet_engine::plane::Iface>| {
                    !f.may_send_from(s) || f.standby() != vnet_engine::plane::ACTIVE
                };
                if plane.ifaces.get(&i).is_some_and(user) {
                    continue;
                }
            }
            for &d in dsts {
                if s == d {
                    continue;
                }
                plane.table.lookup(port, s, d, &mut found);
                let [(to, _)] = found[..] else { continue };
                let val = match to {
                    Port::Interface(i) => match ifaces.get(&i) {
                        Some(k) => RouteVal {
                            action: if k.peer { ACT_IFACE_PEER } else { ACT_IFACE_XMIT },
                            target: k.ifindex,
                            in_slot: slot(key_port),
                            out_slot: slot(k.ifindex),
                            link: LinkVal::default(),
                        },
                        None => continue,
                    },
                    Port::Link(l) if !port.is_link() => match kernel_links.get(&l) {
                        Some(v) => RouteVal {
                            action: ACT_LINK,
                            target: l,
                            in_slot: slot(key_port),
                            out_slot: slot(PORT_LINK | l),
                            link: *v,
                        },
                        None => continue,
                    },
                    Port::Link(_) => continue,
                };
                if out.len() >= capacity {
                    overflow += 1;
                    continue;
                }
                out.insert(RouteKey { port: key_port, dst: d.0, src: s.0 }, val);
            }
        }
    }
    (out, overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::net::{Ipv4Addr, SocketAddr};
    use std::sync::Arc;
    use vnet_control::{LinkFormat, Security, Transport};
    use vnet_core::{Route, RouteTable, SourceFilter};
    use vnet_engine::port::Nowhere;
    use vnet_engine::{Iface, Link};

    fn mac(n: u8) -> MacAddr {
        MacAddr([0x52, 0x54, 0, 0, 0, n])
    }

    /// A `vnet` link `h<id>` to `remote`, sending nowhere.
    fn vnet_link(id: u32, remote: SocketAddr) -> Arc<Link> {
        let transport =
            Transport::Udp { remote, format: LinkFormat::Vnet, network: 0, security: Security::None };
        let def = vnet_control::LinkDef { id, name: format!("h{id}"), transport, mtu: 1500 };
        Arc::new(Link::new(def, Arc::new(Nowhere)))
    }

    fn iface(id: u32, m: MacAddr) -> Arc<Iface> {
        Arc::new(Iface::new(id, format!("vm{id}"), Some(m), Arc::new(Nowhere)))
    }

    #[test]
    fn decisions_are_the_route_tables_single_destination_answers() {
        let (a, b, c) = (mac(1), mac(2), mac(3));
        let any = SourceFilter::Any;
        let routes = vec![
            Route::new(0, MacSpec::Any, MacSpec::Addr(MacAddr::BROADCAST), Port::Link(0), any),
            Route::new(1, MacSpec::Any, MacSpec::Addr(b), Port::Link(0), any),
            Route::new(2, MacSpec::Any, MacSpec::Addr(a), Port::Interface(0), any),
            Route::new(3, MacSpec::Any, MacSpec::Addr(c), Port::Interface(1), any),
        ];
        let plane = Plane::new(
            RouteTable::new(1, routes),
            vec![iface(0, a), iface(1, c)],
            vec![vnet_link(0, "10.77.0.2:9000".parse().unwrap())],
        );
        let kif = |ifindex, peer| KernelIface { dev: String::new(), ifindex, peer, handoff: 0 };
        let ifaces: BTreeMap<u32, KernelIface> = [(0, kif(10, true)), (1, kif(11, false))].into();
        let link = LinkVal { remote_ip: 0x0200_4d0a, mtu: 1500, ..LinkVal::default() };
        let links: BTreeMap<u32, LinkVal> = [(0, link)].into();
        // Counter slots: interface A's veth 1, C's TAP 2, the link 3.
        let slots: BTreeMap<u32, u32> = [(10, 1), (11, 2), (PORT_LINK, 3)].into();
        let (d, overflow) = decisions(&plane, &ifaces, &links, &slots, MAX_ROUTES);
        assert_eq!(overflow, 0);
        let get = |port, dst: MacAddr, src: MacAddr| {
            d.get(&RouteKey { port, dst: dst.0, src: src.0 })
                .map(|v| (v.action, v.target, v.in_slot, v.out_slot))
        };
        // A -> B leaves by the link (which the decision carries); A -> C
        // goes out of C's TAP; from the link, B -> A goes into A's veth
        // peer. Each names the counter slots of both ports.
        assert_eq!(get(10, b, a), Some((ACT_LINK, 0, 1, 3)));
        assert_eq!(d[&RouteKey { port: 10, dst: b.0, src: a.0 }].link, link);
        assert_eq!(get(10, c, a), Some((ACT_IFACE_XMIT, 11, 1, 2)));
        assert_eq!(get(PORT_LINK, a, b), Some((ACT_IFACE_PEER, 10, 3, 1)));
        // No reflection (link -> same link, interface -> itself), no group
        // destinations: those stay with the user path.
        assert_eq!(get(PORT_LINK, b, a), None);
        assert_eq!(get(10, a, c), None);
        assert!(d.keys().all(|k| k.dst[0] & 1 == 0));
        // Port security: with interface 0 locked to A, its frames from
        // another source (B to C) are the user path's, which drops them.
        assert_eq!(get(10, c, b), Some((ACT_IFACE_XMIT, 11, 1, 2)));
        let locked = Arc::new(Iface::new(0, "vm0", Some(a), Arc::new(Nowhere)).locked_to(Some(a)));
        let plane = Plane::new(
            RouteTable::new(2, plane.table.routes().to_vec()),
            vec![locked, iface(1, c)],
            plane.links.values().cloned().collect(),
        );
        let (d, _) = decisions(&plane, &ifaces, &links, &slots, MAX_ROUTES);
        assert_eq!(d.get(&RouteKey { port: 10, dst: c.0, src: b.0 }), None);
        assert_eq!(
            d.get(&RouteKey { port: 10, dst: c.0, src: a.0 }).map(|v| (v.action, v.target)),
            Some((ACT_IFACE_XMIT, 11))
        );
        // A route change is a different answer.
        let none = decisions(&Plane::default(), &ifaces, &links, &slots, MAX_ROUTES).0;
        assert!(none.is_empty());
    }

    #[test]
    fn a_network_of_100000_macs_fills_the_map_counts_the_rest_and_costs_milliseconds() {
        // Two kernel interfaces here, 100000 MACs behind 1000 links (a
        // cluster's view): far more decisions than the map holds.
        let any = SourceFilter::Any;
        let big = |i: u32| MacAddr([0x52, 0x54, 1, (i >> 16) as u8, (i >> 8) as u8, i as u8]);
        let (a, c) = (mac(1), mac(3));
        let mut routes = vec![
            Route::new(0, MacSpec::Any, MacSpec::Addr(a), Port::Interface(0), any),
            Route::new(1, MacSpec::Any, MacSpec::Addr(c), Port::Interface(1), any),
        ];
        let links = (0..1000u32)
            .map(|l| {
                vnet_link(l, SocketAddr::new(Ipv4Addr::new(10, 1, (l >> 8) as u8, l as u8).into(), 9000))
            })
            .collect();
        for i in 0..100_000u32 {
            routes.push(Route::new(i + 2, MacSpec::Any, MacSpec::Addr(big(i)), Port::Link(i % 1000), any));
        }
        let plane = Plane::new(RouteTable::new(1, routes), vec![iface(0, a), iface(1, c)], links);
        let kif = |ifindex| KernelIface { dev: String::new(), ifindex, peer: true, handoff: 0 };
        let ifaces: BTreeMap<u32, KernelIface> = [(0, kif(10)), (1, kif(11))].into();
        let t0 = std::time::Instant::now();
        let links = (0..1000).map(|l| (l, LinkVal::default())).collect();
        let (d, overflow) = decisions(&plane, &ifaces, &links, &BTreeMap::new(), MAX_ROUTES);
        let took = t0.elapsed();
        assert_eq!(d.len(), MAX_ROUTES);
        assert!(overflow > 100_000, "{overflow}");
        // Debug builds are ~20x slower than release; either way not the square of 100000.
        assert!(took < std::time::Duration::from_secs(5), "{took:?}");
        // A link's frames are decided only for the kernel interfaces' MACs.
        assert!(d.keys().filter(|k| k.port & PORT_LINK != 0).all(|k| k.dst == a.0 || k.dst == c.0));
    }
}
