//! ARP and neighbour discovery answered at the edge (`neigh` lines), in the
//! simulator: a VM's question for a known address is answered by its own
//! host and no datagram leaves it; what the table cannot answer is flooded
//! as before and counted.

use std::net::Ipv6Addr;
use std::sync::atomic::Ordering::Relaxed;
use vnet_engine::sim::Net;

const M0: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
const M1: [u8; 6] = [0x52, 0x54, 0, 0, 0, 2];
const M5: [u8; 6] = [0x52, 0x54, 0, 0, 0, 5];

fn hex(m: [u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// An ARP request from `from` (`sender` IP) for `target`, broadcast.
fn arp(from: [u8; 6], sender: [u8; 4], target: [u8; 4]) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&from);
    f.extend_from_slice(&[8, 6, 0, 1, 8, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&from);
    f.extend_from_slice(&sender);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target);
    f.resize(60, 0);
    f
}

/// A neighbour solicitation from `from` (`src`) for `target`, to its
/// solicited-node group, with the source link-layer address option.
fn solicitation(from: [u8; 6], src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let t = target.octets();
    let mut group = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 0];
    group[13..].copy_from_slice(&t[13..]);
    let mut f = vec![0x33, 0x33, 0xff, t[13], t[14], t[15]];
    f.extend_from_slice(&from);
    f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0, 0, 32, 58, 255]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&group);
    f.extend_from_slice(&[135, 0, 0, 0, 0, 0, 0, 0]);
    f.extend_from_slice(&t);
    f.extend_from_slice(&[1, 1]);
    f.extend_from_slice(&from);
    f
}

/// Hosts 0 and 1, a VM each (`vm`, network 0) joined by a `vnet` link
/// with broadcast routes both ways; host 0 has a VM `other` in network 5
/// too, and answers for VM 1's addresses.
fn pair() -> Net {
    let mut net = Net::new(7);
    for (me, peer) in [(0usize, 1usize), (1, 0)] {
        let (mine, theirs) = if me == 0 { (M0, M1) } else { (M1, M0) };
        let mut cfg = format!(
            "interface vm tap t mac {}\nlink p udp 10.9.0.{} format vnet mtu 1500\n\
             route any {} -> link p\nroute any {} -> interface vm\n\
             route any ff:ff:ff:ff:ff:ff -> link p from interface vm\n\
             route any ff:ff:ff:ff:ff:ff -> interface vm from link p\n\
             route any 33:33:ff:00:00:02 -> link p from interface vm\n",
            hex(mine),
            peer + 1,
            hex(theirs),
            hex(mine),
        );
        if me == 0 {
            cfg.push_str(&format!(
                "interface other tap t5 mac {} network 5\nneigh 10.0.0.2 {m1}\nneigh fd00::2 {m1}\n",
                hex(M5),
                m1 = hex(M1)
            ));
        }
        net.add_host(&format!("10.9.0.{}", me + 1), &cfg).unwrap();
    }
    net
}

#[test]
fn a_known_address_is_answered_by_the_askers_host_and_nothing_leaves_it() {
    let mut net = pair();
    net.start_capture();
    net.send(0, "vm", &arp(M0, [10, 0, 0, 1], [10, 0, 0, 2]));
    let (src, dst): (Ipv6Addr, Ipv6Addr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
    net.send(0, "vm", &solicitation(M0, src, dst));
    net.run(1000);
    assert!(net.captured().is_empty(), "a datagram left host 0");
    assert!(net.take(1, "vm").is_empty(), "VM 1 saw a question its host need not hear");
    let got = net.take(0, "vm");
    assert_eq!(got.len(), 2, "{got:?}");
    let reply = &got[0].frame;
    assert_eq!((&reply[0..6], &reply[6..12]), (&M0[..], &M1[..]), "from the owner to the asker");
    assert_eq!(&reply[20..22], &[0, 2], "an ARP reply");
    assert_eq!((&reply[22..28], &reply[28..32]), (&M1[..], &[10, 0, 0, 2][..]));
    let na = &got[1].frame;
    assert_eq!((na[54], &na[78..86]), (136, &[2, 1, 0x52, 0x54, 0, 0, 0, 2][..]), "an advertisement");
    let g = &net.hosts[0].global;
    assert_eq!((g.neigh_answered.load(Relaxed), g.neigh_flooded.load(Relaxed)), (2, 0));
}

#[test]
fn what_the_table_cannot_answer_is_flooded_and_counted() {
    let mut net = pair();
    net.start_capture();
    // An address no `neigh` names.
    net.send(0, "vm", &arp(M0, [10, 0, 0, 1], [10, 0, 0, 3]));
    net.run(1000);
    assert_eq!(net.captured().len(), 1, "the question crossed the link");
    assert_eq!(net.take(1, "vm").len(), 1, "VM 1 heard it");
    // A VM of another network asks for a network-0 address: not answered.
    net.send(0, "other", &arp(M5, [10, 0, 0, 5], [10, 0, 0, 2]));
    // Announcements are never answered nor counted: a probe (sent while
    // VM 0 owns no address: once it does, the IP source guard takes only
    // its probes for its own) and, below, a gratuitous ARP.
    net.send(0, "vm", &arp(M0, [0, 0, 0, 0], [10, 0, 0, 2]));
    net.run(1000);
    // The owner asking for its own address (a conflict check from
    // another of its addresses): left to the network. (Its lines make
    // both its own: from any other, the IP source guard drops it.)
    net.apply(0, "neigh 10.0.0.1 52:54:00:00:00:01\nneigh 10.0.0.7 52:54:00:00:00:01\n").unwrap();
    net.send(0, "vm", &arp(M0, [10, 0, 0, 7], [10, 0, 0, 1]));
    net.send(0, "vm", &arp(M0, [10, 0, 0, 1], [10, 0, 0, 1]));
    net.run(1000);
    assert!(net.take(0, "vm").is_empty() && net.take(0, "other").is_empty(), "nothing was answered");
    let g = &net.hosts[0].global;
    assert_eq!((g.neigh_answered.load(Relaxed), g.neigh_flooded.load(Relaxed)), (0, 3));
    assert_eq!(g.spoofed_source_ip.load(Relaxed), 0);
    assert_eq!(net.take(1, "vm").len(), 3, "the owner's check and both announcements went on");
}

#[test]
fn the_answer_follows_the_table() {
    let mut net = pair();
    // The address moved to another MAC: the next answer says so.
    net.apply(0, "neigh 10.0.0.2 52:54:00:00:00:09\n").unwrap();
    net.send(0, "vm", &arp(M0, [10, 0, 0, 1], [10, 0, 0, 2]));
    net.run(1000);
    let got = net.take(0, "vm");
    assert_eq!(&got[0].frame[22..28], &[0x52, 0x54, 0, 0, 0, 9]);
    // Withdrawn: flooded again.
    net.apply(0, "delete neigh 10.0.0.2\n").unwrap();
    net.send(0, "vm", &arp(M0, [10, 0, 0, 1], [10, 0, 0, 2]));
    net.run(1000);
    assert!(net.take(0, "vm").is_empty());
    assert_eq!(net.take(1, "vm").len(), 1);
}

/// Issue 50's scale figure, in the simulator: one host of a 1000-host
/// network of 100 VMs each (its 999 links and broadcast routes, its 100
/// VMs; by symmetry every host sends what it sends), each VM resolving 10
/// new addresses of other hosts' VMs a minute (ARP entries Linux forgot:
/// `gc_stale_time` 60 s). Broadcast datagrams the host sends in that
/// minute without `neigh` lines and with the network's 100000 addresses
/// (what cluster mode's claims give every host). Printed with
/// `cargo test -p vnet-engine --test neigh -- --nocapture a_thousand`.
#[test]
fn a_thousand_hosts_of_a_hundred_vms_send_no_broadcast_for_arp_with_the_networks_addresses() {
    const HOSTS: u32 = 1000;
    const VMS: u32 = 100;
    const PER_VM_PER_MINUTE: u32 = 10;
    let vm_mac = |h: u32, v: u32| [0x52, 0x54, (h >> 8) as u8, h as u8, 0, v as u8];
    let vm_ip = |h: u32, v: u32| [10, (h >> 8) as u8, h as u8, v as u8 + 1];
    let mut base = String::new();
    for v in 0..VMS {
        base += &format!("interface vm{v} tap t{v} mac {}\n", hex(vm_mac(0, v)));
    }
    for h in 1..HOSTS {
        base += &format!("link l{h} udp 10.200.{}.{} format vnet\n", h >> 8, h & 0xff);
        base += &format!("route any ff:ff:ff:ff:ff:ff -> link l{h}\n");
    }
    let mut neigh = String::new();
    for h in 0..HOSTS {
        for v in 0..VMS {
            let ip = vm_ip(h, v);
            neigh += &format!("neigh {}.{}.{}.{} {}\n", ip[0], ip[1], ip[2], ip[3], hex(vm_mac(h, v)));
        }
    }
    let mut sent = Vec::new();
    for with in [false, true] {
        let mut net = Net::new(1);
        let cfg = if with { format!("{base}{neigh}") } else { base.clone() };
        net.add_host("10.200.0.0", &cfg).unwrap();
        // The wire takes nothing: each send is counted, none is queued
        // (a million datagrams need not be held to be counted).
        net.set_faults(vnet_engine::sim::Faults { refuse: true, ..Default::default() });
        let mut k = 0u32;
        for v in 0..VMS {
            for _ in 0..PER_VM_PER_MINUTE {
                k += 1;
                let (h, w) = (1 + k * 7919 % (HOSTS - 1), k * 31 % VMS);
                net.send(0, &format!("vm{v}"), &arp(vm_mac(0, v), vm_ip(0, v), vm_ip(h, w)));
            }
        }
        let links = net.hosts[0].plane.links.values();
        let datagrams: u64 = links.map(|l| l.tx.packets.load(Relaxed) + l.tx.drops.load(Relaxed)).sum();
        let g = &net.hosts[0].global;
        let (answered, flooded) = (g.neigh_answered.load(Relaxed), g.neigh_flooded.load(Relaxed));
        eprintln!(
            "{HOSTS} hosts x {VMS} VMs, {PER_VM_PER_MINUTE} ARP resolutions a VM a minute, neigh {}: \
             {datagrams} broadcast datagrams a host a minute ({answered} answered at the edge, {flooded} flooded)",
            if with { "on (100000 addresses)" } else { "off" }
        );
        sent.push(datagrams);
    }
    let questions = u64::from(VMS * PER_VM_PER_MINUTE);
    assert_eq!(sent[0], questions * u64::from(HOSTS - 1), "without: each question to every other host");
    assert_eq!(sent[1], 0, "with: none leaves the host");
    assert!(sent[0] >= 100 * sent[1].max(1));
}
