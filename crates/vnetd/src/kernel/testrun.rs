//! The programs' own tests: each decision `vnet_from_vm` and
//! `vnet_from_wire` make, run by the kernel on a crafted packet with
//! `BPF_PROG_TEST_RUN` (`sys::bpf::test_run`), with the maps filled by
//! vnetd's own writers (`KernelPath`'s, the flow mirror the engine
//! writes). Each checks the verdict, the packet as it left the program
//! and the counters. A redirect's target is not observable in a test run
//! (only its verdict, TC_ACT_REDIRECT): the bytes and counters tell the
//! decisions apart. Root only: `#[ignore]`, run by scripts/test.sh's
//! "eBPF programs" step:
//!
//! ```text
//! cargo test -p vnetd --lib -- --ignored --test-threads=1 kernel::attach::testrun::
//! ```
//!
//! The packets enter through the loopback device (ifindex 1), the one
//! device every network namespace has: it is the guests' port and the
//! link's underlay device here.

use super::super::decisions::{Decisions, Guard};
use super::super::flows::KernelFlows;
use super::super::maps::{addr16, ACT_IFACE_PEER, ACT_LINK, FMT_VNET, FMT_VXLAN, GUARD_ON, PORT_LINK};
use super::{map, write_diff, KernelPath};
use crate::sys::bpf::{
    test_run, Cfg, DestKey, GovVal, GuardKey, LinkVal, PeerVal, PortVal, RouteVal, SkbCtx,
};
use aya::maps::{Array, MapData};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsFd as _;
use vnet_core::policy::{FlowKey, FlowMirror as _};
use vnet_wire::vnet::{Flags, VnetRepr};
use vnet_wire::MacAddr;

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
const TC_ACT_REDIRECT: u32 = 7;

/// The guests' port (the loopback device's ifindex) and the network.
const PORT: u32 = 1;
const NET: u32 = 7;
/// Another local interface (a veth's ifindex: never looked up).
const OTHER: u32 = 50;
/// The link's id, and vnetd's UDP port.
const LINK: u32 = 3;
const UDP_PORT: u16 = 7000;

const A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a]; // the guest on PORT
const B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b]; // the guest on OTHER
const C: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0c]; // a guest behind the link
const D: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0d]; // a guest behind the VXLAN link
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const HERE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
/// The VXLAN link's id, peer (a VTEP), port and VNI.
const VX_LINK: u32 = 4;
const PEER2: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 3);
const VXLAN_PORT: u16 = 4789;
const VNI: u32 = 77;

/// The link to PEER: `vnet` over IPv4, MTU 1500, out of the loopback device.
fn link() -> LinkVal {
    LinkVal {
        remote_ip: addr16(PEER.into()),
        local_ip: addr16(HERE.into()),
        nexthop: addr16(PEER.into()),
        remote_port: UDP_PORT.to_be(),
        format: FMT_VNET,
        v6: 0,
        network: NET,
        ifindex: 1,
        mtu: 1500,
    }
}

/// The VXLAN link to PEER2 (VNI 77), id VX_LINK.
fn vxlan_link() -> LinkVal {
    LinkVal {
        remote_ip: addr16(PEER2.into()),
        nexthop: addr16(PEER2.into()),
        remote_port: VXLAN_PORT.to_be(),
        format: FMT_VXLAN,
        network: VNI,
        ..link()
    }
}

/// The decisions vnetd compiles for the lab: A on PORT (locked to A, in
/// network `port_net`), B on OTHER, C behind link LINK, D behind the
/// VXLAN link.
fn routes(k: &KernelPath, port_net: u32) -> Decisions {
    let slot = |p: u32| k.slots[&p];
    let iface = |target: u32| RouteVal {
        action: ACT_IFACE_PEER,
        target,
        in_slot: 0,
        out_slot: slot(target),
        link: LinkVal::default(),
    };
    let to = |id: u32, link: LinkVal| RouteVal {
        action: ACT_LINK,
        target: id,
        in_slot: 0,
        out_slot: slot(PORT_LINK | id),
        link,
    };
    let port = |p: u32, net: u32, lock: Option<[u8; 6]>| PortVal {
        slot: slot(p),
        net,
        lock: lock.unwrap_or_default(),
        locked: lock.is_some().into(),
        guarded: 0,
    };
    let mut d = Decisions::default();
    d.ports.insert(PORT, port(PORT, port_net, Some(A)));
    d.ports.insert(OTHER, port(OTHER, NET, Some(B)));
    d.ports.insert(PORT_LINK | LINK, port(PORT_LINK | LINK, NET, None));
    d.ports.insert(PORT_LINK | VX_LINK, port(PORT_LINK | VX_LINK, NET, None));
    let dest = |dst: [u8; 6]| DestKey { net: NET, dst, pad: 0 };
    d.dests.insert(dest(A), iface(PORT));
    d.dests.insert(dest(B), iface(OTHER));
    d.dests.insert(dest(C), to(LINK, link()));
    d.dests.insert(dest(D), to(VX_LINK, vxlan_link()));
    d
}

/// The programs loaded, their maps as vnetd writes them for [`routes`];
/// `neigh` answers for IP_B and fd00::2 (B's); vnetd listens on UDP_PORT
/// and VXLAN_PORT.
fn lab() -> KernelPath {
    let mut k = KernelPath::load(None, 1024).expect("loading the programs (as root)");
    let served: BTreeSet<u32> = [PORT, OTHER, PORT_LINK | LINK, PORT_LINK | VX_LINK].into();
    k.give_slots(&served).expect("slots");
    k.write_all(routes(&k, NET)).expect("routes");
    let peers = [
        PeerVal { id: LINK, slot: k.slots[&(PORT_LINK | LINK)], link: link() },
        PeerVal { id: VX_LINK, slot: k.slots[&(PORT_LINK | VX_LINK)], link: vxlan_link() },
    ];
    k.write_peers(&peers).expect("peers");
    let neigh: vnet_engine::plane::Neighbors = std::sync::Arc::new(
        [((NET, IpAddr::V4(IP_B)), MacAddr(B)), ((NET, IpAddr::V6(v6(2))), MacAddr(B))].into_iter().collect(),
    );
    k.write_neighbors(&neigh).expect("neigh");
    k.write_cfg((HERE, UDP_PORT).into(), Some((HERE, VXLAN_PORT).into())).expect("config");
    k
}

fn v6(last: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last.into())
}

impl KernelPath {
    /// Program `name` run once on `packet` entering with `ctx`.
    fn run(&self, name: &str, packet: &[u8], ctx: SkbCtx) -> crate::sys::bpf::TestRun {
        let p = self.ebpf.program(name).expect("the program");
        let fd = p.fd().expect("a loaded program");
        test_run(fd.as_fd(), packet, ctx).expect("BPF_PROG_TEST_RUN")
    }
    /// A frame from the guests' port.
    fn run_vm(&self, frame: &[u8]) -> crate::sys::bpf::TestRun {
        self.run("vnet_from_vm", frame, SkbCtx { ifindex: PORT, ..SkbCtx::default() })
    }
    /// A datagram entering on the link's underlay device.
    fn run_wire(&self, packet: &[u8]) -> crate::sys::bpf::TestRun {
        self.run("vnet_from_wire", packet, SkbCtx { ifindex: 1, ingress_ifindex: 1, ..SkbCtx::default() })
    }
    /// The programs' counter `name` (kernel::STAT_NAMES).
    fn stat(&self, name: &str) -> u64 {
        self.stats().into_iter().find(|(n, _)| *n == name).map(|(_, v)| v).expect("a counter of STAT_NAMES")
    }
    /// The policy: `net` governed at generation `gen` (slot 1), the
    /// config's `policy` on (as `flows::Governed::write` writes them).
    fn govern(&mut self, net: u32, gen: u32) {
        let mut held = BTreeMap::new();
        write_diff(&mut self.ebpf, "governed", &mut held, [(net, GovVal { gen, slot: 1 })].into())
            .expect("governed");
        let mut cfg: Array<&mut MapData, Cfg> = map(&mut self.ebpf, "config").expect("config");
        let c = Cfg { policy: 1, ..self.cfg };
        cfg.set(0, c, 0).expect("config");
    }
}

/// An IPv4 UDP frame `dst` <- `src` of `len` bytes in all (at least 42).
fn udp4(dst: [u8; 6], src: [u8; 6], sip: Ipv4Addr, dip: Ipv4Addr, ports: (u16, u16), len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip_len = u16::try_from(len - 14).expect("a frame under 64 KB");
    f[14] = 0x45;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&sip.octets());
    f[30..34].copy_from_slice(&dip.octets());
    f[34..36].copy_from_slice(&ports.0.to_be_bytes());
    f[36..38].copy_from_slice(&ports.1.to_be_bytes());
    f[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
    f
}

/// A frame A -> `dst` from IP_A to IP_B, UDP 1000 -> 2000, 100 bytes.
fn frame(dst: [u8; 6]) -> Vec<u8> {
    udp4(dst, A, IP_A, IP_B, (1000, 2000), 100)
}

/// `frame` as PEER sends it to vnetd's port over the link: outer
/// Ethernet, IPv4, UDP and the `vnet` header (written by vnet-wire's
/// VnetRepr) for network `net`.
fn datagram(frame: &[u8], net: u32) -> Vec<u8> {
    let mut hdr = [0u8; 20];
    let repr = VnetRepr {
        flags: Flags(Flags::WHOLE),
        network: net,
        frame_id: 0,
        frame_len: u32::try_from(frame.len()).expect("small"),
        offset: 0,
    };
    repr.emit(&mut hdr).expect("a vnet header");
    udp_around(PEER, UDP_PORT, &hdr, frame)
}

/// `frame` as the VTEP PEER2 sends it for VNI `vni`.
fn vxlan_datagram(frame: &[u8], vni: u32) -> Vec<u8> {
    let v = vni.to_be_bytes();
    udp_around(PEER2, VXLAN_PORT, &[0x08, 0, 0, 0, v[1], v[2], v[3], 0], frame)
}

/// A datagram from `from` to HERE:`port` carrying `hdr` and `frame`.
fn udp_around(from: Ipv4Addr, port: u16, hdr: &[u8], frame: &[u8]) -> Vec<u8> {
    let mut d = udp4([0x02, 0, 0, 0, 0, 0x01], [0x02, 0, 0, 0, 0, 0x02], from, HERE, (40000, port), 42);
    d.extend_from_slice(hdr);
    d.extend_from_slice(frame);
    let ip_len = u16::try_from(d.len() - 14).expect("small");
    d[16..18].copy_from_slice(&ip_len.to_be_bytes());
    d[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
    d
}

#[test]
#[ignore = "root: loads the eBPF programs"]
fn encapsulates_a_frame_routed_to_a_link() {
    let k = lab();
    let f = frame(C);
    let r = k.run_vm(&f);
    assert_eq!(r.retval, TC_ACT_REDIRECT, "out to the underlay (bpf_redirect_neigh)");
    let out = &r.data;
    assert_eq!(out.len(), f.len() + 14 + 20 + 8 + 20, "outer Ethernet, IPv4, UDP and vnet headers added");
    assert_eq!(out[12..14], [0x08, 0x00], "outer EtherType IPv4");
    let ip = &out[14..34];
    assert_eq!((ip[0], ip[9]), (0x45, 17), "IPv4, UDP");
    assert_eq!(ip[12..16], HERE.octets(), "from the link's local address");
    assert_eq!(ip[16..20], PEER.octets(), "to the peer");
    assert_eq!(u16::from_be_bytes([ip[2], ip[3]]) as usize, out.len() - 14, "the outer IP length");
    assert_eq!(u16::from_be_bytes([out[36], out[37]]), UDP_PORT, "to the peer's port");
    let p = vnet_wire::vnet::VnetPacket::new_checked(&out[42..]).expect("a vnet datagram");
    let v = VnetRepr::parse(&p);
    assert_eq!(v.network, NET);
    assert!(v.flags.0 & Flags::WHOLE != 0, "one whole frame");
    assert_eq!(out[62..], f[..], "the frame itself, unchanged, after the headers");
    assert_eq!((k.stat("kernel_encap"), k.stat("kernel_to_user")), (1, 0));
    assert_eq!(k.iface_counters(PORT).rx_packets, 1);
    assert_eq!(k.link_counters(LINK).tx_packets, 1);
}

#[test]
#[ignore = "root: loads the eBPF programs"]
fn decapsulates_a_datagram_from_a_link_to_its_interface() {
    let k = lab();
    let inner = udp4(A, C, IP_B, IP_A, (2000, 1000), 100);
    let r = k.run_wire(&datagram(&inner, NET));
    assert_eq!(r.retval, TC_ACT_REDIRECT, "into the interface (bpf_redirect_peer)");
    assert_eq!(r.data, inner, "the inner frame alone");
    assert_eq!((k.stat("kernel_decap"), k.stat("kernel_to_user")), (1, 0));
    assert_eq!(k.link_counters(LINK).rx_packets, 1);
    assert_eq!(k.iface_counters(PORT).tx_packets, 1);
}

/// The same both ways over a VXLAN link: the VXLAN header (flag I, the
/// VNI) and UDP to the VTEP's port from RFC 7348's source port range.
#[test]
#[ignore = "root: loads the eBPF programs"]
fn encapsulates_and_decapsulates_over_a_vxlan_link() {
    let k = lab();
    let f = frame(D);
    let r = k.run_vm(&f);
    assert_eq!(r.retval, TC_ACT_REDIRECT);
    let out = &r.data;
    assert_eq!(out.len(), f.len() + 14 + 20 + 8 + 8, "outer Ethernet, IPv4, UDP and VXLAN headers added");
    assert_eq!(out[30..34], PEER2.octets(), "to the VTEP");
    assert!(u16::from_be_bytes([out[34], out[35]]) >= 49152, "a source port of RFC 7348's range");
    assert_eq!(u16::from_be_bytes([out[36], out[37]]), VXLAN_PORT);
    assert_eq!(out[42..50], [0x08, 0, 0, 0, 0, 0, VNI as u8, 0], "flag I and the VNI");
    assert_eq!(out[50..], f[..]);
    let inner = udp4(A, D, IP_B, IP_A, (2000, 1000), 100);
    let r = k.run_wire(&vxlan_datagram(&inner, VNI));
    assert_eq!((r.retval, &r.data), (TC_ACT_REDIRECT, &inner), "decapsulated into A's interface");
    // Another VNI is no link's: the user path's.
    assert_eq!(k.run_wire(&vxlan_datagram(&inner, VNI + 1)).retval, TC_ACT_OK);
    assert_eq!((k.stat("kernel_encap"), k.stat("kernel_decap"), k.stat("kernel_to_user")), (1, 1, 1));
    assert_eq!(k.link_counters(VX_LINK).rx_packets, 1);
}

#[test]
#[ignore = "root: loads the eBPF programs"]
fn redirects_a_frame_from_interface_to_interface() {
    let k = lab();
    let f = frame(B);
    let r = k.run_vm(&f);
    assert_eq!(r.retval, TC_ACT_REDIRECT);
    assert_eq!(r.data, f, "unchanged");
    assert_eq!((k.stat("kernel_local"), k.stat("kernel_encap"), k.stat("kernel_to_user")), (1, 0, 0));
    assert_eq!(k.iface_counters(OTHER).tx_packets, 1);
}

/// A's ARP request for IP_B: answered in place, as vnet-wire answers it.
#[test]
#[ignore = "root: loads the eBPF programs"]
fn answers_arp_in_place() {
    let k = lab();
    let mut q = vec![0u8; 42];
    q[0..6].copy_from_slice(&[0xff; 6]);
    q[6..12].copy_from_slice(&A);
    q[12..14].copy_from_slice(&[0x08, 0x06]);
    q[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    q[22..28].copy_from_slice(&A);
    q[28..32].copy_from_slice(&IP_A.octets());
    q[38..42].copy_from_slice(&IP_B.octets());
    let r = k.run_vm(&q);
    assert_eq!(r.retval, TC_ACT_REDIRECT, "back out of the port it came in by");
    let mut want = q.clone();
    assert!(vnet_wire::neigh::answer(&mut want, MacAddr(B)));
    assert_eq!(r.data, want, "the owner's reply, as the user path answers");
    assert_eq!(r.data[22..28], B, "B's MAC has IP_B");
    assert_eq!(k.stat("kernel_neigh_answered"), 1);
    // A request for an address `neigh` does not hold is vnetd's.
    q[41] = 99;
    assert_eq!(k.run_vm(&q).retval, TC_ACT_OK);
    assert_eq!((k.stat("kernel_neigh_answered"), k.stat("kernel_to_user")), (1, 1));
}

/// A's neighbour solicitation for fd00::2: answered in place, as
/// vnet-wire answers it (checksum included).
#[test]
#[ignore = "root: loads the eBPF programs"]
fn answers_a_neighbour_solicitation_in_place() {
    let k = lab();
    let mut q = vec![0u8; vnet_wire::neigh::ND_FRAME];
    q[0..6].copy_from_slice(&[0x33, 0x33, 0xff, 0, 0, 2]);
    q[6..12].copy_from_slice(&A);
    q[12..14].copy_from_slice(&[0x86, 0xdd]);
    q[14] = 0x60;
    q[18..20].copy_from_slice(&32u16.to_be_bytes());
    q[20] = 58;
    q[21] = 255;
    q[22..38].copy_from_slice(&v6(1).octets());
    let group = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 2);
    q[38..54].copy_from_slice(&group.octets());
    q[54] = 135;
    q[62..78].copy_from_slice(&v6(2).octets());
    q[78..80].copy_from_slice(&[1, 1]);
    q[80..86].copy_from_slice(&A);
    let r = k.run_vm(&q);
    assert_eq!(r.retval, TC_ACT_REDIRECT, "back out of the port it came in by");
    let mut want = q.clone();
    assert!(vnet_wire::neigh::answer(&mut want, MacAddr(B)));
    assert_eq!(r.data, want, "the owner's advertisement, as the user path answers");
    assert_eq!((r.data[54], r.data[80..86].to_vec()), (136, B.to_vec()));
    assert_eq!(k.stat("kernel_neigh_answered"), 1);
}

/// The flow A -> B, UDP 1000 -> 2000, as the engine allows it.
fn allowed(gen: u64) -> FlowKey {
    FlowKey {
        generation: gen,
        network: NET,
        src_mac: MacAddr(A),
        dst_mac: MacAddr(B),
        src: IP_A.into(),
        dst: IP_B.into(),
        proto: 17,
        sport: 1000,
        dport: 2000,
        id: 0,
        fragment: false,
    }
}

/// In a governed network, a flow the engine allowed (written by its
/// mirror, `KernelFlows`) is forwarded here, its reply too.
#[test]
#[ignore = "root: loads the eBPF programs"]
fn passes_a_known_flow_of_a_governed_network() {
    let mut k = lab();
    k.govern(NET, 5);
    let flows = KernelFlows::open(&k.ebpf).expect("flows");
    assert!(flows.offer(&allowed(5)));
    let f = frame(B);
    let r = k.run_vm(&f);
    assert_eq!(r.retval, TC_ACT_REDIRECT);
    assert_eq!(r.data, f);
    assert_eq!(
        (k.stat("kernel_policy_flows"), k.stat("kernel_local"), k.stat("kernel_policy_to_user")),
        (1, 1, 0)
    );
    // The flow log's counts: the frame, whole, once (the CPU's cache entry
    // and the map's together); a second frame adds to them.
    let counted = |flows: &KernelFlows| {
        let s = flows.scan(16);
        assert_eq!(s.len(), 1, "{s:?}");
        (s[0].packets[0] + s[0].packets[1], s[0].bytes[0] + s[0].bytes[1])
    };
    assert_eq!(counted(&flows), (1, f.len() as u64));
    k.run_vm(&f);
    assert_eq!(counted(&flows), (2, 2 * f.len() as u64));
    // A re-offer of a flow the programs carry keeps its counts.
    assert!(flows.offer(&allowed(5)));
    assert_eq!(counted(&flows), (2, 2 * f.len() as u64));
}

/// In a governed network, a frame of no flow the engine allowed (another
/// port, or the same flow under an older policy) goes to the engine.
#[test]
#[ignore = "root: loads the eBPF programs"]
fn sends_a_new_flow_to_the_engine() {
    let mut k = lab();
    k.govern(NET, 5);
    let flows = KernelFlows::open(&k.ebpf).expect("flows");
    flows.offer(&allowed(4));
    flows.offer(&FlowKey { dport: 2001, ..allowed(5) });
    let f = frame(B);
    let r = k.run_vm(&f);
    assert_eq!(r.retval, TC_ACT_OK, "up to vnetd (no hand-off TAP here)");
    assert_eq!(r.data, f);
    assert_eq!(
        (k.stat("kernel_policy_to_user"), k.stat("kernel_to_user"), k.stat("kernel_local")),
        (1, 1, 0)
    );
    // The positive control: the flow allowed, the same frame passes.
    flows.offer(&allowed(5));
    assert_eq!(k.run_vm(&f).retval, TC_ACT_REDIRECT);
    assert_eq!(k.stat("kernel_policy_flows"), 1);
}

/// A frame whose encapsulation exceeds the link's MTU is vnetd's (which
/// fragments `vnet` frames): 1452 bytes + 48 fit 1500, 1453 do not.
#[test]
#[ignore = "root: loads the eBPF programs"]
fn leaves_a_frame_too_big_for_the_link_to_vnetd() {
    let k = lab();
    let big = udp4(C, A, IP_A, IP_B, (1000, 2000), 1453);
    let r = k.run_vm(&big);
    assert_eq!(r.retval, TC_ACT_OK);
    assert_eq!(r.data, big, "unchanged");
    assert_eq!((k.stat("kernel_encap"), k.stat("kernel_to_user")), (0, 1));
    let fits = udp4(C, A, IP_A, IP_B, (1000, 2000), 1452);
    let r = k.run_vm(&fits);
    assert_eq!((r.retval, r.data.len()), (TC_ACT_REDIRECT, 1452 + 62));
    assert_eq!(k.stat("kernel_encap"), 1);
}

/// A datagram from the link whose `vnet` header names another network
/// than the link's is vnetd's (which drops and counts it).
#[test]
#[ignore = "root: loads the eBPF programs"]
fn leaves_a_datagram_of_a_wrong_network_to_vnetd() {
    let k = lab();
    let inner = udp4(A, C, IP_B, IP_A, (2000, 1000), 100);
    let wrong = datagram(&inner, NET + 1);
    let r = k.run_wire(&wrong);
    assert_eq!(r.retval, TC_ACT_OK, "up the stack to vnetd's socket");
    assert_eq!(r.data, wrong, "not decapsulated");
    assert_eq!((k.stat("kernel_decap"), k.stat("kernel_to_user")), (0, 1));
    assert_eq!(k.run_wire(&datagram(&inner, NET)).retval, TC_ACT_REDIRECT, "the link's own network");
}

/// A frame from a port of another network than its destination's finds
/// no entry: vnetd's (which floods it in the port's own network only).
#[test]
#[ignore = "root: loads the eBPF programs"]
fn leaves_a_frame_for_another_networks_mac_to_vnetd() {
    let mut k = lab();
    let f = frame(B);
    assert_eq!(k.run_vm(&f).retval, TC_ACT_REDIRECT, "PORT in B's network");
    let moved = routes(&k, NET + 1);
    k.write_all(moved).expect("routes");
    let r = k.run_vm(&f);
    assert_eq!((r.retval, &r.data), (TC_ACT_OK, &f), "PORT in another network");
    assert_eq!((k.stat("kernel_local"), k.stat("kernel_to_user")), (1, 1));
}

/// Port security: PORT is locked to A; a frame from another MAC is not
/// forwarded (vnetd's, which drops it), A's own is.
#[test]
#[ignore = "root: loads the eBPF programs"]
fn does_not_forward_a_spoofed_source_mac() {
    let k = lab();
    let mut f = frame(B);
    f[6..12].copy_from_slice(&C);
    let r = k.run_vm(&f);
    assert_eq!(r.retval, TC_ACT_OK);
    assert_eq!((k.stat("kernel_local"), k.stat("kernel_to_user")), (0, 1));
    assert_eq!(k.run_vm(&frame(B)).retval, TC_ACT_REDIRECT, "A's own frame");
    assert_eq!(k.stat("kernel_local"), 1);
}

/// The IP source guard: PORT owns IP_A alone; a frame from another
/// address is dropped and counted. The positive control: the same frame
/// from the port unguarded is forwarded.
#[test]
#[ignore = "root: loads the eBPF programs"]
fn drops_a_spoofed_source_ip_from_a_guarded_port() {
    let mut k = lab();
    let spoofed = udp4(B, A, Ipv4Addr::new(10, 0, 0, 99), IP_B, (1000, 2000), 100);
    assert_eq!(k.run_vm(&spoofed).retval, TC_ACT_REDIRECT, "unguarded: forwarded");
    let key = GuardKey { port: PORT, addr: addr16(IP_A.into()) };
    k.finish_guard(Guard { flags: [(PORT, GUARD_ON)].into(), entries: [(key, 1)].into() }).expect("guard");
    assert_eq!(k.run_vm(&spoofed).retval, TC_ACT_SHOT);
    assert_eq!(k.stat("kernel_spoofed_source_ip"), 1);
    let own = frame(B);
    assert_eq!(k.run_vm(&own).retval, TC_ACT_REDIRECT, "its own address");
    assert_eq!((k.stat("kernel_spoofed_source_ip"), k.stat("kernel_local")), (1, 2));
}

/// An ICMPv6 neighbour or router discovery message of `kind` from A's
/// `src` to B's MAC, naming `target` (with A's link-layer address).
fn nd6(kind: u8, src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let mut f = [B.as_slice(), &A, &[0x86, 0xdd, 0x60, 0, 0, 0, 0, 32, 58, 255]].concat();
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0xb).octets());
    f.extend_from_slice(&[kind, 0, 0, 0, 0x20, 0, 0, 0]);
    f.extend_from_slice(&target.octets());
    f.extend_from_slice(&[2, 1]);
    f.extend_from_slice(&A);
    f
}

/// Neighbour discovery from a guarded port names only its own addresses
/// (PORT owns fd00::1 and its link-local): a neighbour advertisement for
/// B's fd00::2 (which would take B's traffic, or B's address in its
/// duplicate address detection), a solicitation from :: for it (probing
/// for B's address), a router advertisement and a redirect are dropped
/// and counted. The positive controls: the same advertisement from the
/// port unguarded, and the guarded port's advertisement and probe for its
/// own address, are forwarded.
#[test]
#[ignore = "root: loads the eBPF programs"]
fn drops_neighbour_discovery_naming_another_address_from_a_guarded_port() {
    let mut k = lab();
    let ll = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0xa);
    let foreign = nd6(136, ll, v6(2));
    assert_eq!(k.run_vm(&foreign).retval, TC_ACT_REDIRECT, "unguarded: forwarded");
    let owned = [IpAddr::V4(IP_A), IpAddr::V6(v6(1)), IpAddr::V6(ll)];
    let entries = owned.iter().map(|a| (GuardKey { port: PORT, addr: addr16(*a) }, 1)).collect();
    k.finish_guard(Guard { flags: [(PORT, GUARD_ON)].into(), entries }).expect("guard");
    let dropped = [
        ("NA for B's address", foreign),
        ("NA for B's, from A's global address", nd6(136, v6(1), v6(2))),
        ("NA for A's, from another's source", nd6(136, v6(3), v6(1))),
        ("DAD probe for B's address", nd6(135, Ipv6Addr::UNSPECIFIED, v6(2))),
        ("RA", nd6(134, ll, Ipv6Addr::UNSPECIFIED)),
        ("redirect", nd6(137, ll, v6(2))),
    ];
    for (n, (what, f)) in dropped.iter().enumerate() {
        assert_eq!(k.run_vm(f).retval, TC_ACT_SHOT, "{what}");
        assert_eq!(k.stat("kernel_spoofed_source_ip"), n as u64 + 1, "{what} counted");
    }
    // Hidden behind a destination options header (hop limit 255): dropped.
    let mut hidden = nd6(136, ll, v6(2));
    hidden[20] = 60;
    hidden.splice(54..54, [58, 0, 1, 4, 0, 0, 0, 0]);
    assert_eq!(k.run_vm(&hidden).retval, TC_ACT_SHOT, "behind an extension header");
    let passed = [
        ("NA for its own address", nd6(136, ll, v6(1))),
        ("NA for its link-local", nd6(136, v6(1), ll)),
        ("DAD probe for its own address", nd6(135, Ipv6Addr::UNSPECIFIED, v6(1))),
        ("a router solicitation", nd6(133, ll, Ipv6Addr::UNSPECIFIED)),
    ];
    for (what, f) in &passed {
        assert_eq!(k.run_vm(f).retval, TC_ACT_REDIRECT, "{what}");
    }
    assert_eq!(k.stat("kernel_spoofed_source_ip"), dropped.len() as u64 + 1);
}

/// An ARP probe (sender 0.0.0.0) from a guarded port passes for an
/// address the port owns (its own duplicate address detection), not for
/// another VM's.
#[test]
#[ignore = "root: loads the eBPF programs"]
fn passes_an_arp_probe_only_for_the_guarded_ports_own_address() {
    let mut k = lab();
    let probe = |target: Ipv4Addr| {
        let mut f =
            [[0xff; 6].as_slice(), &A, &[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1], &A, &[0; 4], &[0; 6]].concat();
        f.extend_from_slice(&target.octets());
        f
    };
    let key = GuardKey { port: PORT, addr: addr16(IP_A.into()) };
    k.finish_guard(Guard { flags: [(PORT, GUARD_ON)].into(), entries: [(key, 1)].into() }).expect("guard");
    assert_eq!(k.run_vm(&probe(IP_B)).retval, TC_ACT_SHOT, "a probe for B's address");
    assert_eq!(k.stat("kernel_spoofed_source_ip"), 1);
    assert_ne!(k.run_vm(&probe(IP_A)).retval, TC_ACT_SHOT, "a probe for its own");
    assert_eq!(k.stat("kernel_spoofed_source_ip"), 1);
}

/// The guard's DHCP exemption (from 0.0.0.0, UDP 68 to 67) holds only for
/// a broadcast (to 255.255.255.255 at the broadcast MAC): the same packet
/// to B's MAC or address, which would reach B past the guard, is dropped
/// and counted. The positive control: the broadcast passes.
#[test]
#[ignore = "root: loads the eBPF programs"]
fn passes_dhcp_from_no_address_only_as_a_broadcast() {
    let mut k = lab();
    let key = GuardKey { port: PORT, addr: addr16(IP_A.into()) };
    k.finish_guard(Guard { flags: [(PORT, GUARD_ON)].into(), entries: [(key, 1)].into() }).expect("guard");
    let all = Ipv4Addr::BROADCAST;
    let dhcp = |mac: [u8; 6], dst: Ipv4Addr| udp4(mac, A, Ipv4Addr::UNSPECIFIED, dst, (68, 67), 100);
    let dropped = [
        ("to B's MAC and address", dhcp(B, IP_B)),
        ("to B's MAC, the broadcast address", dhcp(B, all)),
        ("to the broadcast MAC, B's address", dhcp([0xff; 6], IP_B)),
    ];
    for (n, (what, f)) in dropped.iter().enumerate() {
        assert_eq!(k.run_vm(f).retval, TC_ACT_SHOT, "{what}");
        assert_eq!(k.stat("kernel_spoofed_source_ip"), n as u64 + 1, "{what} counted");
    }
    assert_ne!(k.run_vm(&dhcp([0xff; 6], all)).retval, TC_ACT_SHOT, "the broadcast");
    assert_eq!(k.stat("kernel_spoofed_source_ip"), dropped.len() as u64);
}

/// A dropped frame is told to a monitor: with nobody watching, no event
/// is made (only the counter moves); watched, the drop arrives through
/// `drop_events` with its reason, ingress and the frame's first bytes; a
/// flood is cut to the rate limit, the rest counted.
#[test]
#[ignore = "root: loads the eBPF programs"]
fn a_dropped_frame_is_an_event_with_its_reason_only_while_watched_and_a_flood_is_limited() {
    let mut k = lab();
    let key = GuardKey { port: PORT, addr: addr16(IP_A.into()) };
    k.finish_guard(Guard { flags: [(PORT, GUARD_ON)].into(), entries: [(key, 1)].into() }).expect("guard");
    let spoofed = udp4(B, A, Ipv4Addr::new(10, 0, 0, 99), IP_B, (1000, 2000), 100);
    let drops = k.drops();
    let mut got = Vec::new();
    assert_eq!(k.run_vm(&spoofed).retval, TC_ACT_SHOT);
    assert_eq!(drops.drain(100, &mut got), 0);
    assert!(got.is_empty(), "unwatched: no event");
    assert_eq!((k.stat("kernel_spoofed_source_ip"), k.stat("kernel_drop_events")), (1, 0));

    drops.watch(true).expect("watch");
    assert_eq!(k.run_vm(&spoofed).retval, TC_ACT_SHOT);
    drops.drain(100, &mut got);
    assert_eq!(got.len(), 1, "watched: one event");
    let d = got[0];
    assert_eq!((d.reason, d.ifindex, d.head.len), (vnet_core::DropReason::SpoofedSourceIp, PORT, 100));
    let s = d.head.summary();
    assert_eq!((s.src.map(|m| m.0), s.src_ip), (Some(A), Some(Ipv4Addr::new(10, 0, 0, 99).into())));
    assert_eq!(s.ports, Some((1000, 2000)));

    // A flood: the burst goes out, the rest is counted as limited.
    let n = 1000;
    for _ in 0..n {
        k.run_vm(&spoofed);
    }
    got.clear();
    drops.drain(10_000, &mut got);
    let (sent, limited) = (k.stat("kernel_drop_events"), k.stat("kernel_drop_events_limited"));
    assert_eq!(sent, 1 + got.len() as u64);
    assert_eq!(sent + limited, n + 1, "each drop sent or counted");
    assert!(limited > 0 && got.len() < n as usize / 2, "{} sent of {n}: not limited", got.len());
    assert_eq!(k.stat("kernel_drop_events_lost"), 0);

    // Unwatched again: nothing more is reserved.
    drops.watch(false).expect("unwatch");
    k.run_vm(&spoofed);
    assert_eq!((k.stat("kernel_drop_events"), k.stat("kernel_drop_events_limited")), (sent, limited));
}
