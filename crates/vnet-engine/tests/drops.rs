//! Every drop of the user path has its reason, its ingress port and, for a
//! policy's, the rule: two simulated hosts make the drops an operator asks
//! about (no route, port security, a policy's deny, a wrong network), and
//! each host's workers' rings hold them (`vnetctl show drops` reads these).

use vnet_core::{DropReason, Port};
use vnet_engine::drops::{Denial, DropRecord};
use vnet_engine::sim::Net;

const M1: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
const M2: [u8; 6] = [0x52, 0x54, 0, 0, 0, 2];

/// A UDP/IPv4 frame from `src` to `dst`, to port `dport`.
fn udp(dst: [u8; 6], src: [u8; 6], dport: u16) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend(dst);
    f.extend(src);
    f.extend([8, 0]);
    f.extend([0x45, 0, 0, 36, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    f.extend(4000u16.to_be_bytes());
    f.extend(dport.to_be_bytes());
    f.extend([0, 16, 0, 0]);
    f.extend([0xab; 8]);
    f
}

/// Every drop recorded on host `h` so far.
fn drops(net: &Net, h: usize) -> Vec<DropRecord> {
    let mut out = Vec::new();
    for ring in net.hosts[h].global.drops.rings() {
        ring.read_from(0, &mut out);
    }
    out
}

fn reasons(net: &Net, h: usize) -> Vec<DropReason> {
    drops(net, h).iter().map(|r| r.reason).collect()
}

#[test]
fn each_drop_an_operator_asks_about_is_recorded_with_its_reason_port_and_rule() {
    // A's VM is locked to M1 and its network 7 denies UDP to port 53; B's
    // link says network 8, so what crosses from A arrives in a wrong network.
    let a = "interface vm tap t0 mac 52:54:00:00:00:01 network 7\n\
             link l udp 10.0.0.2 format vnet network 7\n\
             route any 52:54:00:00:00:01 -> interface vm\n\
             route any 52:54:00:00:00:02 -> link l\n\
             policy default allow network 7\n\
             rule no-dns deny network 7 proto udp port 53\n";
    let b = "interface vm tap t0 mac 52:54:00:00:00:02 network 8\n\
             link l udp 10.0.0.1 format vnet network 8\n\
             route any 52:54:00:00:00:02 -> interface vm\n";
    let mut net = Net::new(70);
    net.add_host("10.0.0.1", a).unwrap();
    net.add_host("10.0.0.2", b).unwrap();
    let vm = net.hosts[0].state.interfaces.values().find(|i| i.name == "vm").map(|i| i.id).unwrap();

    net.send(0, "vm", &udp([2, 0, 0, 0, 0, 9], M1, 80));
    net.run(1000);
    assert_eq!(reasons(&net, 0), [DropReason::NoRoute]);
    net.send(0, "vm", &udp(M2, [2, 0, 0, 0, 0, 7], 80));
    net.run(1000);
    assert_eq!(reasons(&net, 0), [DropReason::NoRoute, DropReason::SpoofedSourceMac]);
    net.send(0, "vm", &udp(M2, M1, 53));
    net.run(1000);
    let all = drops(&net, 0);
    let denied = all.last().unwrap();
    assert_eq!(denied.reason, DropReason::PolicyDenied);
    assert!(matches!(denied.denial, Some(Denial::Rule { index: 0, .. })), "{:?}", denied.denial);
    assert_eq!(denied.ingress, Some(Port::Interface(vm)));
    let s = denied.head.summary();
    assert_eq!((s.src.map(|m| m.0), s.dst.map(|m| m.0), s.ports), (Some(M1), Some(M2), Some((4000, 53))));
    assert_eq!(s.dst_ip, Some([10, 0, 0, 2].into()));
    assert!(reasons(&net, 1).is_empty(), "nothing reached B yet");

    // Allowed at A, it crosses; B's link is of another network.
    net.send(0, "vm", &udp(M2, M1, 80));
    net.run(1000);
    let at_b = drops(&net, 1);
    assert_eq!(at_b.iter().map(|r| r.reason).collect::<Vec<_>>(), [DropReason::WrongNetwork]);
    assert!(matches!(at_b[0].ingress, Some(Port::Link(_))));
    assert_eq!(at_b[0].head.summary().ports, Some((4000, 80)), "the inner frame's summary");

    // The counts by reason agree with the records.
    let counts = net.hosts[0].global.drops.counts();
    for r in [DropReason::NoRoute, DropReason::SpoofedSourceMac, DropReason::PolicyDenied] {
        assert_eq!(counts[r as usize].1, 1, "{r}");
    }
    assert_eq!(counts.iter().map(|c| c.1).sum::<u64>(), 3);
    // Each drop counter of `show stats` agrees with its reason's count.
    for h in 0..2 {
        let g = serde_json::to_value(&*net.hosts[h].global).unwrap();
        let counts = net.hosts[h].global.drops.counts();
        for (name, reason) in vnet_engine::drops::GLOBAL_COUNTERS {
            let Some(r) = reason else { continue };
            if name == "roams_refused" {
                continue; // only the refused datagrams from another address
            }
            assert_eq!(g[name].as_u64(), Some(counts[r as usize].1), "host {h}: {name} and {r}");
        }
    }
}
