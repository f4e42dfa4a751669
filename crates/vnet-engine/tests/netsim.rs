//! Many vnet hosts in memory (`vnet_engine::sim`): routing, split horizon,
//! fan-out, every UDP link format side by side, fragmentation under loss,
//! reordering and duplication, offloads across formats, relocation. No
//! root, no kernel, milliseconds.

use std::collections::BTreeMap;
use vnet_engine::sim::{Delivered, Faults, Net};
use vnet_wire::virtio::{VirtioNetHdr, F_NEEDS_CSUM, GSO_TCPV4};
use vnet_wire::vnet::{Flags, VnetRepr};

const HOSTS: usize = 8;

fn mac(i: usize) -> String {
    format!("52:54:00:00:00:{:02x}", i + 1)
}

fn ip(i: usize) -> String {
    format!("10.0.0.{}", i + 1)
}

/// The link kind between hosts `i` and `j` (the same from both ends): a mix
/// of `vnet`, `raw`, VXLAN and TCP so every kind meets every other on a host.
fn kind(i: usize, j: usize) -> &'static str {
    match (i + j) % 4 {
        0 => "udp {ip} format vnet",
        1 => "udp {ip} format raw",
        2 => "vxlan {ip} vni 42",
        _ => "tcp {ip}:9000",
    }
}

/// Host `i`'s config: VM `vm` with MAC `mac(i)`, a link to every other host
/// (`macs` says where each other MAC lives), broadcast to every link and
/// the VM, each known MAC to its host's link.
fn config(i: usize, n: usize, mtu: u32, place: &BTreeMap<usize, usize>) -> String {
    let mut c = format!("interface vm tap t{i} mac {}\n", mac(i));
    for j in (0..n).filter(|&j| j != i) {
        c += &format!("link h{j} {} mtu {mtu}\n", kind(i, j).replace("{ip}", &ip(j)));
    }
    c += "route any ff:ff:ff:ff:ff:ff -> interface vm\n";
    for j in (0..n).filter(|&j| j != i) {
        c += &format!("route any ff:ff:ff:ff:ff:ff -> link h{j}\n");
    }
    for (&vm, &host) in place {
        if host == i {
            c += &format!("route any {} -> interface vm\n", mac(vm));
        } else {
            c += &format!("route any {} -> link h{host}\n", mac(vm));
        }
    }
    c
}

fn mesh(n: usize, mtu: u32) -> Net {
    let mut net = Net::new(0x5eed);
    let place: BTreeMap<usize, usize> = (0..n).map(|i| (i, i)).collect();
    for i in 0..n {
        net.add_host(&ip(i), &config(i, n, mtu, &place)).unwrap();
    }
    net
}

fn mac_bytes(i: usize) -> [u8; 6] {
    [0x52, 0x54, 0, 0, 0, i as u8 + 1]
}

/// An Ethernet frame from VM `src` to `dst` (None: broadcast) with `len`
/// payload bytes that say who sent it and `tag`.
fn frame(src: usize, dst: Option<usize>, tag: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; 14 + len];
    f[..6].copy_from_slice(&dst.map_or([0xff; 6], mac_bytes));
    f[6..12].copy_from_slice(&mac_bytes(src));
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes()); // local experimental
    f[14..18].copy_from_slice(&tag.to_be_bytes());
    for (k, b) in f[18..].iter_mut().enumerate() {
        *b = (k as u32).wrapping_mul(31).wrapping_add(tag) as u8;
    }
    f
}

fn frames(d: &[Delivered]) -> Vec<&[u8]> {
    d.iter().map(|d| d.frame.as_slice()).collect()
}

#[test]
fn eight_hosts_of_mixed_formats_each_broadcast_reaches_every_other_vm_exactly_once() {
    let mut net = mesh(HOSTS, 1500);
    for i in 0..HOSTS {
        let f = frame(i, None, i as u32, 46);
        net.send(i, "vm", &f);
        net.run(100_000);
        for j in 0..HOSTS {
            let got = net.take(j, "vm");
            if j == i {
                assert!(got.is_empty(), "host {i}'s broadcast came back to it");
            } else {
                assert_eq!(frames(&got), vec![f.as_slice()], "host {j} got host {i}'s broadcast");
            }
        }
    }
    // Split horizon: no host sent anything on that it got from a link.
    for h in &net.hosts {
        let sent: u64 = h.plane.links.values().map(|l| l.tx.snapshot().packets).sum();
        assert_eq!(sent, (HOSTS - 1) as u64, "host {} sent {sent} frames on links", h.ip);
    }
}

#[test]
fn eight_hosts_unicast_between_every_pair_reaches_only_its_destination() {
    let mut net = mesh(HOSTS, 1500);
    for i in 0..HOSTS {
        for j in (0..HOSTS).filter(|&j| j != i) {
            let f = frame(i, Some(j), (i * 100 + j) as u32, 1000);
            net.send(i, "vm", &f);
            net.run(100_000);
            for k in 0..HOSTS {
                let got = net.take(k, "vm");
                let want: Vec<&[u8]> = if k == j { vec![f.as_slice()] } else { vec![] };
                assert_eq!(frames(&got), want, "{i} -> {j}, at {k} ({})", kind(i, j));
            }
        }
    }
    for h in &net.hosts {
        let g = &h.global;
        let sum = |f: &std::sync::atomic::AtomicU64| f.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!((sum(&g.malformed), sum(&g.unknown_source), sum(&g.no_route)), (0, 0, 0));
    }
}

#[test]
fn two_networks_with_the_same_macs_on_two_hosts_never_see_each_others_frames() {
    // Hosts A and B; on each, VM `a` in network 7 and VM `b` in network 8,
    // the two VMs of a host with the same MAC. Network 7 crosses on link
    // `l7` (vnet, network 7); network 8 has no link between the hosts.
    let (m1, m2) = ("52:54:00:00:00:01", "52:54:00:00:00:02");
    let host = |me: &str, peer: &str| {
        format!(
            "interface a tap ta mac {me} network 7\n\
             interface b tap tb mac {me} network 8\n\
             interface c tap tc mac 52:54:00:00:00:0c network 8\n\
             link l7 udp {peer} format vnet network 7\n\
             route any {me} -> interface a\n\
             route any {me} -> interface b\n\
             route any 52:54:00:00:00:0c -> interface c\n\
             route any ff:ff:ff:ff:ff:ff -> interface a\n\
             route any ff:ff:ff:ff:ff:ff -> interface b\n\
             route any ff:ff:ff:ff:ff:ff -> interface c\n\
             route any ff:ff:ff:ff:ff:ff -> link l7\n"
        )
    };
    let mut net = Net::new(7);
    net.add_host("10.0.0.1", &(host(m1, "10.0.0.2") + &format!("route any {m2} -> link l7\n"))).unwrap();
    net.add_host("10.0.0.2", &(host(m2, "10.0.0.1") + &format!("route any {m1} -> link l7\n"))).unwrap();
    let to = |m: &str| -> [u8; 6] {
        let mac: vnet_wire::MacAddr = m.parse().unwrap();
        mac.0
    };
    let frame = |dst: [u8; 6], src: [u8; 6], tag: u8| {
        let mut f = vec![0u8; 64];
        f[..6].copy_from_slice(&dst);
        f[6..12].copy_from_slice(&src);
        f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
        f[14] = tag;
        f
    };
    let all = |net: &Net| -> Vec<(usize, &'static str, usize)> {
        let mut v = Vec::new();
        for h in 0..2 {
            for vm in ["a", "b", "c"] {
                let n = net.take(h, vm).len();
                if n > 0 {
                    v.push((h, vm, n));
                }
            }
        }
        v
    };
    // Unicast in network 7 crosses to B's `a` only, never B's `b` (same MAC).
    net.send(0, "a", &frame(to(m2), to(m1), 1));
    net.run(100_000);
    assert_eq!(all(&net), vec![(1, "a", 1)]);
    // Network 8's `c` sends to A's MAC: only A's `b` (network 8) gets it.
    net.send(0, "c", &frame(to(m1), to("52:54:00:00:00:0c"), 2));
    net.run(100_000);
    assert_eq!(all(&net), vec![(0, "b", 1)]);
    // A broadcast in network 8 stays on host A's network 8; one in network 7
    // reaches B's `a` and nothing of network 8.
    net.send(0, "b", &frame([0xff; 6], to(m1), 3));
    net.run(100_000);
    assert_eq!(all(&net), vec![(0, "c", 1)]);
    net.send(0, "a", &frame([0xff; 6], to(m1), 4));
    net.run(100_000);
    assert_eq!(all(&net), vec![(1, "a", 1)]);
    // A route that would cross networks is refused.
    let e = net.apply(0, "route any 52:54:00:00:00:09 -> interface b from link l7\n").unwrap_err();
    assert!(e.0.contains("frames never cross networks"), "{e:?}");
}

/// Two hosts, one VM each, joined by a `vnet` link over a 1500-byte underlay.
fn vnet_pair(seed: u64) -> Net {
    let mut net = Net::new(seed);
    add_pair(&mut net, |_| String::new());
    net
}

/// Hosts 0 and 1 with a VM each and a `vnet` link `p` between them, host
/// `h`'s link with the options `opts(h)`.
fn add_pair(net: &mut Net, opts: impl Fn(usize) -> String) {
    for (me, peer) in [(0, 1), (1, 0)] {
        let cfg = format!(
            "interface vm tap t mac {}\nlink p udp {} format vnet mtu 1500 {}\n\
             route any {} -> link p\nroute any {} -> interface vm\n",
            mac(me),
            ip(peer),
            opts(me),
            mac(peer),
            mac(me)
        );
        net.add_host(&ip(me), &cfg).unwrap();
    }
}

#[test]
fn large_frames_cross_vnet_links_reordered_and_duplicated_exactly_once() {
    // VMs with a 9000-byte MTU over a 1500-byte underlay: each frame is 7
    // `vnet` datagrams; the wire reorders (up to 2 ms jitter) and duplicates.
    let mut net = vnet_pair(7);
    net.set_faults(Faults { loss: 0.0, duplicate: 0.02, jitter_ns: 2_000_000, ..Faults::default() });
    let sent: Vec<Vec<u8>> = (0..300).map(|t| frame(0, Some(1), t, 9000)).collect();
    // Paced as a sender at about 700 Mbit/s: ~20 frames in flight, within
    // the receiver's 64 reassembly slots.
    for f in &sent {
        net.send(0, "vm", f);
        net.advance(100_000);
    }
    net.run(1_000_000);
    let got = net.take(1, "vm");
    let mut seen: Vec<&[u8]> = frames(&got);
    seen.sort();
    let mut want: Vec<&[u8]> = sent.iter().map(|f| f.as_slice()).collect();
    want.sort();
    assert_eq!(seen.len(), want.len(), "{} frames delivered of {}", seen.len(), want.len());
    assert_eq!(seen, want);
    assert!(net.wire.lock().unwrap().duplicated > 0, "the wire duplicated nothing");
    assert_eq!(load(&net.hosts[1].global.reasm_completed), 300, "each frame reassembled once");
}

#[test]
fn frames_never_completed_are_evicted_past_the_pools_slots_and_counted_once() {
    let mut net = vnet_pair(2);
    // 100 first fragments of 3000-byte frames, the rest never comes (a
    // plain link: anyone at the peer's address can send them).
    for id in 0..100u32 {
        let r = VnetRepr { flags: Flags(0), network: 0, frame_id: id, frame_len: 3000, offset: 0 };
        let mut d = vec![0u8; vnet_wire::vnet::HEADER_LEN + 1400];
        r.emit(&mut d).unwrap();
        net.inject(&ip(0), &ip(1), d);
        net.run(10);
    }
    assert_eq!(net.reassembling(1), 32, "the slots one link may hold");
    assert_eq!(load(&net.hosts[1].global.reasm_evicted), 68, "its oldest made room");
    // A fragment of frame 99 that says another length: refused, counted
    // once, and the frame given up (31 left to time out).
    let r = VnetRepr { flags: Flags(0), network: 0, frame_id: 99, frame_len: 4000, offset: 1400 };
    let mut d = vec![0u8; vnet_wire::vnet::HEADER_LEN + 1400];
    r.emit(&mut d).unwrap();
    net.inject(&ip(0), &ip(1), d);
    net.run(10);
    assert_eq!(load(&net.hosts[1].global.reasm_rejected), 1);
    // Timed out, and reported once however often the counts are reported.
    net.advance(10_000_000_000);
    net.advance(1_000_000);
    let g = &net.hosts[1].global;
    let counts = [&g.reasm_evicted, &g.reasm_timed_out, &g.reasm_completed, &g.reasm_rejected].map(load);
    assert_eq!(counts, [68, 31, 0, 1]);
}

#[test]
fn fragments_lost_on_the_wire_lose_their_frame_never_corrupt_one() {
    let mut net = vnet_pair(11);
    net.set_faults(Faults { loss: 0.03, duplicate: 0.0, jitter_ns: 500_000, ..Faults::default() });
    let sent: Vec<Vec<u8>> = (0..400).map(|t| frame(0, Some(1), t, 9000)).collect();
    for f in &sent {
        net.send(0, "vm", f);
        net.advance(100_000);
    }
    net.run(1_000_000);
    let got = net.take(1, "vm");
    // Every delivered frame is one that was sent, once; about (0.97^7) of them arrive.
    let mut tags = std::collections::BTreeSet::new();
    for d in &got {
        let tag = u32::from_be_bytes(d.frame[14..18].try_into().unwrap()) as usize;
        assert_eq!(d.frame, sent[tag], "frame {tag} corrupted");
        assert!(tags.insert(tag), "frame {tag} delivered twice");
    }
    let expected = 400.0 * 0.97f64.powi(7);
    assert!(
        (got.len() as f64 - expected).abs() < 60.0,
        "{} delivered, about {expected:.0} expected",
        got.len()
    );
    // The incomplete ones are evicted (the pool's 64 slots fill with them)
    // or time out, and are counted either way; nothing is held after.
    let held = net.reassembling(1);
    assert!((1..=64).contains(&held), "{held} incomplete frames held");
    net.advance(10_000_000_000);
    assert_eq!(net.reassembling(1), 0);
    let g = &net.hosts[1].global;
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed) as usize;
    let (timed_out, evicted) = (load(&g.reasm_timed_out), load(&g.reasm_evicted));
    assert!(timed_out > 0, "nothing timed out");
    assert_eq!(timed_out + evicted + got.len(), 400, "a lost frame was not accounted for");
}

#[test]
fn vxlan_drops_and_counts_frames_the_underlay_cannot_carry_whole() {
    let mut net = mesh(3, 1500); // the VXLAN pair is found below
    let (a, b) = (0..3)
        .flat_map(|i| (0..3).map(move |j| (i, j)))
        .find(|&(i, j)| i != j && kind(i, j).starts_with("vxlan"))
        .unwrap();
    let link = net.hosts[a].link(&format!("h{b}")).unwrap().clone();
    assert_eq!(link.max_whole_frame(), 1500 - 20 - 8 - 8);
    // A 1464-byte frame fits; one more byte does not.
    let fits = frame(a, Some(b), 1, 1464 - 14);
    let big = frame(a, Some(b), 2, 1464 - 14 + 1);
    let log = Log::default();
    tracing::subscriber::with_default(log.subscriber(), || {
        net.send(a, "vm", &fits);
        for _ in 0..3 {
            net.send(a, "vm", &big);
        }
    });
    net.run(1000);
    assert_eq!(frames(&net.take(b, "vm")), vec![fits.as_slice()]);
    assert_eq!(link.too_big.load(std::sync::atomic::Ordering::Relaxed), 3);
    assert_eq!(link.tx.snapshot().drops, 3);
    // Said once, the first time (with what to do about it), counted each time.
    let said = log.text();
    assert_eq!(said.matches("does not fit this VXLAN link").count(), 1, "{said}");
    assert!(said.contains("give the VM an MTU of at most 1450"), "{said}");
}

/// What the engine logs, kept for a test to read.
#[derive(Clone, Default)]
struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Log {
    fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        let log = self.clone();
        tracing_subscriber::fmt().with_ansi(false).with_writer(move || log.clone()).finish()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Log {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A TCP/IPv4 super-frame of `payload` bytes with a partial checksum and a
/// GSO header, as a VM's stack hands one to a TAP with offloads.
fn tcp_super_frame(src: usize, dst: usize, payload: usize, mss: u16) -> (VirtioNetHdr, Vec<u8>) {
    let mut f = vec![0u8; 14 + 20 + 20 + payload];
    f[..6].copy_from_slice(&mac_bytes(dst));
    f[6..12].copy_from_slice(&mac_bytes(src));
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((40 + payload) as u16).to_be_bytes());
    f[22] = 64;
    f[23] = 6;
    f[26..30].copy_from_slice(&[10, 88, 0, 1]);
    f[30..34].copy_from_slice(&[10, 88, 0, 2]);
    f[34..36].copy_from_slice(&40000u16.to_be_bytes());
    f[36..38].copy_from_slice(&5201u16.to_be_bytes());
    f[46] = 5 << 4;
    f[47] = 0x18;
    for (k, b) in f[54..].iter_mut().enumerate() {
        *b = (k * 7) as u8;
    }
    // IPv4 header checksum, and the TCP checksum seeded with the pseudo-header.
    let sum = |b: &[u8], mut s: u32| {
        for c in b.chunks(2) {
            s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    };
    let ipc = !sum(&f[14..34], 0);
    f[24..26].copy_from_slice(&ipc.to_be_bytes());
    let seed = sum(&f[26..34], 6 + (20 + payload) as u32);
    f[50..52].copy_from_slice(&seed.to_be_bytes());
    let vh = VirtioNetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_TCPV4,
        hdr_len: 54,
        gso_size: mss,
        csum_start: 34,
        csum_offset: 16,
    };
    (vh, f)
}

#[test]
fn an_offloaded_super_frame_crosses_vnet_and_tcp_whole_and_raw_and_vxlan_as_segments() {
    let mut net = mesh(5, 1500);
    // From host 0: to every other host, each over its kind of link; a
    // typical super-frame, and the largest one cut small (123 segments:
    // full GSO batches of 64, each with an encapsulation header on VXLAN).
    for (len, mss) in [(20_000, 1400), (65_535 - 40, 536)] {
        for j in 1..5 {
            let (vh, f) = tcp_super_frame(0, j, len, mss);
            let rx = |net: &Net| net.hosts[j].link("h0").unwrap().rx.snapshot().bytes;
            let rx_before = rx(&net);
            net.send_with(0, "vm", vh, &f);
            net.run(100_000);
            let got = net.take(j, "vm");
            let k = kind(0, j);
            if k.contains("vnet") || k.starts_with("tcp") {
                let counted = rx(&net) - rx_before;
                assert_eq!(counted, f.len() as u64, "{k}: the link counts the frame, not its offload header");
                assert_eq!(got.len(), 1, "{k}: one frame");
                assert_eq!(got[0].vh, Some(vh), "{k}: the offload header crosses");
                assert_eq!(got[0].frame, f);
            } else {
                assert_eq!(got.len(), len.div_ceil(usize::from(mss)), "{k}: segments of {len}");
                let payload: Vec<u8> = got.iter().flat_map(|d| d.frame[54..].iter().copied()).collect();
                assert_eq!(payload, f[54..], "{k}: the segments carry the stream");
                let plain = |d: &Delivered| d.vh.is_none_or(|h| h == VirtioNetHdr::NONE);
                assert!(got.iter().all(|d| d.frame.len() <= usize::from(mss) + 54 && plain(d)));
            }
        }
    }
}

/// Host 0: VM `a` (takes offloads), VM `b` (`offload off`), a `vnet` link
/// to host 1 with VM `c`; broadcasts go to `b`.
fn parts_net() -> Net {
    let (a, b, c) = (mac(0), mac(1), mac(2));
    let mut net = Net::new(7);
    let h0 = format!(
        "interface a tap ta mac {a}\ninterface b tap tb mac {b} offload off\n\
         link h1 udp 10.0.0.2 format vnet\nroute any {a} -> interface a\n\
         route any {b} -> interface b\nroute any {c} -> link h1\n\
         route any ff:ff:ff:ff:ff:ff -> interface b\n"
    );
    net.add_host("10.0.0.1", &h0).unwrap();
    let h1 = format!(
        "interface c tap tc mac {c}\nlink h0 udp 10.0.0.1 format vnet\nroute any {c} -> interface c\n"
    );
    net.add_host("10.0.0.2", &h1).unwrap();
    net
}

#[test]
fn a_guests_frame_in_pieces_goes_out_as_it_lies_only_where_every_destination_takes_it() {
    let mut net = parts_net();
    // A super-frame from a to c (over the link, which takes offloads), in
    // three pieces: header and Ethernet head, then the rest in two.
    let (vh, f) = tcp_super_frame(0, 2, 3000, 1400);
    let head = [&vh.emit()[..], &f[..100]].concat();
    assert!(net.send_parts(0, "a", &[&head, &f[100..2000], &f[2000..]]));
    net.run(1000);
    let got = net.take(1, "c");
    assert_eq!(got.len(), 1, "one frame, whole");
    assert_eq!((got[0].vh, &got[0].frame), (Some(vh), &f));
    let counted: u64 = net.hosts[0].global.matrix.pairs().iter().map(|p| p.bytes).sum();
    assert_eq!(counted, f.len() as u64, "the traffic matrix counts the frame, not its header");
    // A finished frame (no header to act on) to b, which takes no offloads:
    // it goes as it lies, without the header.
    let (_, plain) = tcp_super_frame(0, 1, 1000, 1400);
    let none = [&VirtioNetHdr::NONE.emit()[..], &plain[..60]].concat();
    assert!(net.send_parts(0, "a", &[&none, &plain[60..]]));
    let got = net.take(0, "b");
    assert_eq!((got.len(), got[0].vh.is_none_or(|h| h == VirtioNetHdr::NONE)), (1, true));
    assert_eq!(got[0].frame, plain);
    // Left to `forward` (false, nothing delivered): a super-frame to b (it
    // must be finished first), a broadcast (its limit is counted there), a
    // frame from a MAC that is not a's, an offload header the frame
    // contradicts, an unknown destination, more pieces than a GSO batch.
    let (vh_b, to_b) = tcp_super_frame(0, 1, 3000, 1400);
    let mut bcast = plain.clone();
    bcast[..6].fill(0xff);
    let mut spoofed = f.clone();
    spoofed[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
    let mut unknown = f.clone();
    unknown[..6].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
    let lying = VirtioNetHdr { hdr_len: u16::MAX, ..vh };
    let refused: [(&str, VirtioNetHdr, &[u8]); 5] = [
        ("a super-frame to a port without offloads", vh_b, &to_b),
        ("a broadcast", VirtioNetHdr::NONE, &bcast),
        ("another source MAC", vh, &spoofed),
        ("a header the frame contradicts", lying, &f),
        ("no route", vh, &unknown),
    ];
    for (what, h, frame) in refused {
        let head = [&h.emit()[..], frame].concat();
        assert!(!net.send_parts(0, "a", &[&head]), "{what}: left to forward");
    }
    // Pieces: a batch's worth (GSO_MAX_SEGS + 2) goes out, one more does not.
    let most = vnet_engine::GSO_MAX_SEGS + 2;
    let cut = |n: usize| -> Vec<&[u8]> {
        let step = (f.len() - 100).div_ceil(n - 1);
        std::iter::once(&head[..]).chain(f[100..].chunks(step)).collect()
    };
    assert_eq!(cut(most).len(), most);
    assert!(!net.send_parts(0, "a", &cut(most + 1)), "more pieces than a batch: left to forward");
    net.run(1000);
    assert!(net.take(0, "b").is_empty() && net.take(1, "c").is_empty() && net.take(0, "a").is_empty());
    assert!(net.send_parts(0, "a", &cut(most)));
    net.run(1000);
    assert_eq!(net.take(1, "c").iter().map(|d| &d.frame).collect::<Vec<_>>(), [&f]);
}

#[test]
fn the_route_caches_hits_and_misses_reach_the_hosts_totals_once_each() {
    use std::sync::atomic::Ordering::Relaxed;
    let mut net = mesh(2, 1500);
    for k in 1..=3u64 {
        net.send(0, "vm", &frame(0, Some(1), k as u32, 100));
        let g = &net.hosts[0].global;
        let counts = (g.route_cache_misses.load(Relaxed), g.route_cache_hits.load(Relaxed));
        assert_eq!(counts, (1, k - 1), "after frame {k}: one miss, then hits");
    }
}

#[test]
fn a_frame_to_an_offloading_and_a_plain_port_reaches_the_first_untouched_and_the_second_finished() {
    // VM x sends to a MAC routed to both a (takes offloads) and b (not).
    let (x, m) = (mac(0), mac(5));
    let mut net = Net::new(9);
    let cfg = format!(
        "interface x tap tx mac {x}\ninterface a tap ta mac {}\ninterface b tap tb mac {} offload off\n\
         route any {m} -> interface a\nroute any {m} -> interface b\n",
        mac(1),
        mac(2)
    );
    net.add_host("10.0.0.1", &cfg).unwrap();
    let (vh, f) = tcp_super_frame(0, 5, 1000, 1400);
    let vh = VirtioNetHdr { gso_type: 0, gso_size: 0, ..vh }; // one segment, checksum left to do
    net.send_with(0, "x", vh, &f);
    let a = net.take(0, "a");
    assert_eq!((a.len(), a[0].vh, &a[0].frame), (1, Some(vh), &f), "a: as the VM left it");
    let b = net.take(0, "b");
    assert_eq!(b.len(), 1);
    assert_ne!(b[0].frame[50..52], f[50..52], "b: the checksum is done");
    assert_eq!((&b[0].frame[..50], &b[0].frame[52..]), (&f[..50], &f[52..]), "b: nothing else changed");
}

#[test]
fn a_vm_relocated_to_another_host_is_reached_there_from_every_host() {
    let mut net = mesh(HOSTS, 1500);
    let (vm, from, to) = (3usize, 3usize, 6usize);
    // Warm every host's route cache towards the VM.
    for i in (0..HOSTS).filter(|&i| i != from) {
        net.send(i, "vm", &frame(i, Some(vm), 1, 64));
    }
    net.run(100_000);
    assert_eq!(net.take(from, "vm").len(), HOSTS - 1);
    // The move: the new host attaches it, every other host reroutes, the
    // old host's route now points at the new host. One transaction each.
    let m = mac(vm);
    net.apply(to, &format!("interface moved tap tm mac {m}\nroute any {m} -> interface moved\n")).unwrap();
    for i in (0..HOSTS).filter(|&i| i != to) {
        let old = net.hosts[i].state.routes.values().find(|r| r.dst.to_string() == m).map(|r| r.id).unwrap();
        net.apply(i, &format!("delete route {old}\nroute any {m} -> link h{to}\n")).unwrap();
    }
    for i in (0..HOSTS).filter(|&i| i != to) {
        let f = frame(i, Some(vm), 2, 64);
        net.send(i, "vm", &f);
        net.run(100_000);
        assert_eq!(frames(&net.take(to, "moved")), vec![f.as_slice()], "from {i}");
    }
    assert!(net.take(from, "vm").is_empty(), "the old host still got frames for the moved VM");
}

#[test]
fn a_vm_sending_from_another_mac_or_with_a_bad_offload_header_is_dropped_and_counted() {
    use std::sync::atomic::Ordering::Relaxed;
    let mut net = vnet_pair(11);
    // VM 0 sends as VM 5: its interface is locked to its `mac`.
    net.send(0, "vm", &frame(5, Some(1), 1, 64));
    // Offload headers no device would take: GSO without a segment size, a
    // checksum field past the frame's end, an unknown GSO type.
    let (vh, sf) = tcp_super_frame(0, 1, 4000, 1448);
    let bad = [
        VirtioNetHdr { gso_size: 0, ..vh },
        VirtioNetHdr { csum_start: sf.len() as u16 - 4, ..vh },
        VirtioNetHdr { gso_type: 9, ..vh },
    ];
    for b in bad {
        net.send_with(0, "vm", b, &sf);
    }
    net.run(10_000);
    assert!(net.take(1, "vm").is_empty(), "a refused frame was delivered");
    let g = net.hosts[0].global.clone();
    assert_eq!(g.spoofed_source_mac.load(Relaxed), 1);
    assert_eq!(g.bad_offload_hdr.load(Relaxed), 3);
    // The same frames, honest, go through.
    net.send(0, "vm", &frame(0, Some(1), 2, 64));
    net.send_with(0, "vm", vh, &sf);
    net.run(10_000);
    // (The super-frame arrives whole or as segments, as VM 1's port takes it.)
    assert!(net.take(1, "vm").len() >= 2);
    assert_eq!((g.spoofed_source_mac.load(Relaxed), g.bad_offload_hdr.load(Relaxed)), (1, 3));
}

#[test]
fn datagrams_from_a_host_without_a_link_are_dropped_and_counted() {
    let mut net = mesh(2, 1500);
    // A ninth host knows host 0; host 0 does not know it.
    net.add_host(
        "10.0.0.99",
        &format!(
            "interface vm tap t mac {}\nlink h0 udp {} format vnet\nroute any any -> link h0\n",
            mac(98),
            ip(0)
        ),
    )
    .unwrap();
    let f = frame(98, Some(0), 5, 64);
    net.send(2, "vm", &f);
    net.run(1000);
    assert!(net.take(0, "vm").is_empty());
    assert_eq!(net.hosts[0].global.unknown_source.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn a_lan_on_a_direct_link_is_one_broadcast_domain_with_every_vm() {
    // Host 0 also has the physical LAN on a `direct` link, with machine M on it.
    let lan_mac = "52:54:00:00:00:f0";
    let lan_bytes = [0x52, 0x54, 0, 0, 0, 0xf0];
    let mut net = Net::new(3);
    let place: BTreeMap<usize, usize> = (0..HOSTS).map(|i| (i, i)).collect();
    for i in 0..HOSTS {
        let mut c = config(i, HOSTS, 1500, &place);
        if i == 0 {
            c += &format!("link lan direct eth1\nroute any ff:ff:ff:ff:ff:ff -> link lan\nroute any {lan_mac} -> link lan\n");
        } else {
            c += &format!("route any {lan_mac} -> link h0\n");
        }
        net.add_host(&ip(i), &c).unwrap();
    }
    // A broadcast from a VM behind host 5 reaches M once, and every other VM once.
    let b = frame(5, None, 55, 46);
    net.send(5, "vm", &b);
    net.run(100_000);
    assert_eq!(frames(&net.take_lan(0, "lan")), vec![b.as_slice()]);
    for j in (0..HOSTS).filter(|&j| j != 5) {
        assert_eq!(net.take(j, "vm").len(), 1, "host {j}");
    }
    // M's broadcast reaches every VM once and does not come back to the LAN.
    let mut mb = frame(0, None, 77, 46);
    mb[6..12].copy_from_slice(&lan_bytes);
    net.lan_send(0, "lan", &mb);
    net.run(100_000);
    for j in 0..HOSTS {
        assert_eq!(frames(&net.take(j, "vm")), vec![mb.as_slice()], "host {j}");
    }
    assert!(net.take_lan(0, "lan").is_empty(), "a LAN broadcast was reflected onto the LAN");
    // Unicast both ways across the mesh.
    let mut to_vm = frame(0, Some(3), 1, 500);
    to_vm[6..12].copy_from_slice(&lan_bytes);
    net.lan_send(0, "lan", &to_vm);
    net.run(100_000);
    assert_eq!(frames(&net.take(3, "vm")), vec![to_vm.as_slice()]);
    let mut to_m = frame(3, None, 2, 500);
    to_m[..6].copy_from_slice(&lan_bytes);
    net.send(3, "vm", &to_m);
    net.run(100_000);
    assert_eq!(frames(&net.take_lan(0, "lan")), vec![to_m.as_slice()]);
    // The mesh still keeps split horizon: no host sent a frame it got from a link to another host.
    for (i, h) in net.hosts.iter().enumerate().skip(1) {
        let mesh_tx: u64 = h.plane.links.values().map(|l| l.tx.snapshot().packets).sum();
        let own = if i == 3 {
            1
        } else if i == 5 {
            7
        } else {
            0
        };
        assert_eq!(mesh_tx, own, "host {i} forwarded between links");
    }
}

const SEC: u64 = 1_000_000_000;

/// Two hosts joined by a `vnet` link secured with `mode` (`auth` or
/// `encrypt`), rekeying every `rekey_s` seconds; host 1 names `key_of`'s
/// key as its peer's (host 0's, unless a test lies). The first handshake
/// is done when this returns.
fn secure_pair(mode: &str, rekey_s: u64, key_of: usize) -> Net {
    let mut net = Net::new(21);
    net.timers = vnet_engine::secure::Timers::with_rekey(rekey_s * SEC);
    add_pair(&mut net, |me| {
        let key = Net::public_key(&ip(if me == 0 { 1 } else { key_of }));
        format!("peer-key {key} security {mode}")
    });
    net.advance(1_000_000);
    net.run(100);
    net
}

fn sec(net: &Net, h: usize) -> &vnet_engine::secure::SecureStats {
    &net.hosts[h].link("p").unwrap().secure.as_ref().unwrap().stats
}

fn load(a: &std::sync::atomic::AtomicU64) -> u64 {
    a.load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn secured_links_deliver_only_what_the_peer_sealed() {
    let plain = vnet_pair(1);
    assert_eq!(plain.hosts[0].link("p").unwrap().max_whole_frame(), 1500 - 28 - 20, "plain");
    for mode in ["auth", "encrypt"] {
        let mut net = secure_pair(mode, 120, 0);
        // What a datagram holds of a frame: less the secured header and tag.
        assert_eq!(net.hosts[0].link("p").unwrap().max_whole_frame(), 1500 - 28 - 20 - 32, "{mode}");
        net.start_capture();
        // 3000 bytes over a 1500-byte underlay: two secured fragments.
        let f = frame(0, Some(1), 7, 3000);
        net.send(0, "vm", &f);
        net.run(1000);
        assert_eq!(frames(&net.take(1, "vm")), vec![f.as_slice()], "{mode}");
        let wire = net.captured();
        assert_eq!(wire.len(), 3, "{mode}");
        let visible = wire.iter().any(|d| d.windows(32).any(|w| w == &f[100..132]));
        assert_eq!(visible, mode == "auth", "{mode}: is the payload on the wire?");
        // Every datagram again: replays.
        for d in &wire {
            net.inject(&ip(0), &ip(1), d.clone());
        }
        net.run(1000);
        assert!(net.take(1, "vm").is_empty(), "{mode}: a replay was delivered");
        assert_eq!(load(&sec(&net, 1).replays), 3, "{mode}");
        // Every datagram with one byte changed: forgeries.
        for d in &wire {
            let mut t = d.clone();
            let i = t.len() / 2;
            t[i] ^= 1;
            net.inject(&ip(0), &ip(1), t);
        }
        net.run(1000);
        assert!(net.take(1, "vm").is_empty(), "{mode}: a tampered datagram was delivered");
        assert_eq!(load(&sec(&net, 1).auth_failures), 3, "{mode}");
        assert_eq!(load(&net.hosts[1].global.roams_refused), 0, "{mode}: from the peer's own address");
        // A plain `vnet` datagram from the peer's address (a spoofer's).
        let small = frame(0, Some(1), 8, 100);
        let mut out = vec![0u8; 200];
        let base = VnetRepr { flags: Flags(0), network: 0, frame_id: 1, frame_len: 0, offset: 0 };
        let s = vnet_wire::frag::split(base, &small, 1472, &mut out).unwrap();
        net.inject(&ip(0), &ip(1), out[..s.total].to_vec());
        net.run(1000);
        assert!(net.take(1, "vm").is_empty(), "{mode}: an unauthenticated datagram was delivered");
        assert_eq!(load(&sec(&net, 1).unauthenticated), 1, "{mode}");
        // The peer itself still gets through.
        net.send(0, "vm", &f);
        net.run(1000);
        assert_eq!(net.take(1, "vm").len(), 1, "{mode}");
    }
}

/// Issue 31, roaming (WireGuard's rule): a secured link follows its peer to
/// a new address after a datagram from there authenticates, never after one
/// that does not (tampered, or replayed) from a third address; those are
/// counted in `roams_refused`.
#[test]
fn a_secured_link_follows_an_authenticated_datagram_to_a_new_address_and_nothing_else() {
    for mode in ["auth", "encrypt"] {
        let mut net = secure_pair(mode, 120, 0);
        // Host 0's datagram, lost on the wire but captured: fresh to host 1.
        net.start_capture();
        net.set_faults(Faults { loss: 1.0, ..Faults::default() });
        let f = frame(0, Some(1), 7, 200);
        net.send(0, "vm", &f);
        net.run(100);
        net.set_faults(Faults::default());
        let wire = net.captured();
        assert_eq!(wire.len(), 1, "{mode}");
        let endpoint = |net: &Net| net.hosts[1].link("p").unwrap().endpoint().map(|e| e.to_string());
        let refused = |net: &Net| load(&net.hosts[1].global.roams_refused);
        let home = Some(format!("{}:9000", ip(0)));
        // Tampered, from a third address: nothing delivered, the link stays.
        let mut t = wire[0].clone();
        let i = t.len() / 2;
        t[i] ^= 1;
        net.inject("10.0.0.77", &ip(1), t);
        net.run(100);
        assert!(net.take(1, "vm").is_empty(), "{mode}");
        assert_eq!((endpoint(&net), refused(&net)), (home.clone(), 1), "{mode}");
        // The peer's own datagram from a new address: delivered, followed.
        net.inject("10.0.0.66", &ip(1), wire[0].clone());
        net.run(100);
        assert_eq!(frames(&net.take(1, "vm")), vec![f.as_slice()], "{mode}");
        assert_eq!(endpoint(&net), Some("10.0.0.66:9000".to_string()), "{mode}");
        assert_eq!(load(&net.hosts[1].link("p").unwrap().roams), 1, "{mode}");
        assert_eq!(load(&net.hosts[1].global.roams), 1, "{mode}");
        // Replayed from a third address: refused, the link stays.
        net.inject("10.0.0.77", &ip(1), wire[0].clone());
        net.run(100);
        assert!(net.take(1, "vm").is_empty(), "{mode}");
        assert_eq!(endpoint(&net), Some("10.0.0.66:9000".to_string()), "{mode}");
        assert_eq!((refused(&net), load(&sec(&net, 1).replays)), (2, 1), "{mode}");
        // Host 1 now sends to the new address: nothing reaches host 0 ...
        net.send(1, "vm", &frame(1, Some(0), 8, 200));
        net.run(100);
        assert!(net.take(0, "vm").is_empty(), "{mode}: host 1 still sends to the old address");
        // ... until host 0 is heard from its own address again: back home.
        net.send(0, "vm", &frame(0, Some(1), 9, 200));
        net.run(100);
        assert_eq!(net.take(1, "vm").len(), 1, "{mode}");
        assert_eq!(endpoint(&net), home, "{mode}");
        assert!(net.hosts[1].link("p").unwrap().roamed.load().is_none(), "{mode}");
        net.send(1, "vm", &frame(1, Some(0), 10, 200));
        net.run(100);
        assert_eq!(net.take(0, "vm").len(), 1, "{mode}");
    }
}

/// Three seconds on a dead wire: the rekey's initiations, captured.
fn rekey_initiations(net: &mut Net) -> Vec<Vec<u8>> {
    net.start_capture();
    net.set_faults(Faults { loss: 1.0, ..Faults::default() });
    idle(net, 3_000);
    net.set_faults(Faults::default());
    let inits: Vec<Vec<u8>> =
        net.captured().into_iter().filter(|d| vnet_engine::secure::is_initiation(d)).collect();
    assert!(!inits.is_empty(), "no initiation in three seconds");
    inits
}

/// Issue 31, roaming on a handshake: a peer's initiation from an address
/// no link is configured with (a peer behind NAT, or one whose session ran
/// out while it moved) is read to find its link, answered there, and the
/// link follows it; the same initiation replayed from a third address is
/// refused (its timestamp is not new) and moves nothing.
#[test]
fn an_initiation_from_a_new_address_is_answered_there_and_the_link_follows_it() {
    let mut net = secure_pair("encrypt", 2, 0);
    let inits = rekey_initiations(&mut net);
    for d in &inits {
        net.inject("10.0.0.66", &ip(1), d.clone());
    }
    net.run(100);
    let g = &net.hosts[1].global;
    // Read to find the link once at least (later ones from the same address
    // find it as the address it roamed to).
    assert!((1..=inits.len() as u64).contains(&load(&g.stranger_initiations)));
    let l = net.hosts[1].link("p").unwrap();
    assert_eq!(l.endpoint().map(|e| e.to_string()).as_deref(), Some("10.0.0.66:9000"));
    assert_eq!(load(&l.roams), 1);
    // Replayed from elsewhere: refused, the link stays.
    let replays = load(&sec(&net, 1).replays);
    for d in &inits {
        net.inject("10.0.0.77", &ip(1), d.clone());
    }
    net.run(100);
    let l = net.hosts[1].link("p").unwrap();
    assert_eq!(l.endpoint().map(|e| e.to_string()).as_deref(), Some("10.0.0.66:9000"));
    assert_eq!(load(&l.roams), 1);
    assert!(load(&sec(&net, 1).replays) > replays);
    // An initiation from a stranger's key, from anywhere: no link, nothing.
    let before = load(&net.hosts[1].global.unknown_source);
    let mut junk = inits[0].clone();
    junk[40] ^= 1;
    net.inject("10.0.0.88", &ip(1), junk);
    net.run(100);
    assert_eq!(load(&net.hosts[1].global.unknown_source), before + 1);
}

/// Issue 31, path MTU: a path that carries 1280-byte packets (a router
/// that drops larger ones and sends no ICMP) between two hosts whose links
/// say `mtu 1500`: each link's probes find 1280 (to within a step), frames
/// of every size cross, plain and secured; a path that carries 1500 again
/// is found by the raise timer's search.
#[test]
fn probes_find_a_1280_byte_path_under_a_1500_byte_link_and_frames_of_every_size_cross() {
    use vnet_engine::pmtu::{Phase, STEP};
    for mode in ["", "auth", "encrypt"] {
        let mut net = if mode.is_empty() { vnet_pair(41) } else { secure_pair(mode, 120, 0) };
        net.set_faults(Faults { max_datagram: 1280 - 28, ..Faults::default() });
        idle(&mut net, 5_000);
        for h in 0..2 {
            let l = net.hosts[h].link("p").unwrap();
            let p = l.pmtu.as_ref().unwrap();
            assert_eq!(p.phase(), Phase::Done, "{mode}: host {h}");
            assert!(l.mtu() <= 1280 && 1280 - l.mtu() <= STEP, "{mode}: host {h}: {}", l.mtu());
        }
        for (i, size) in [60usize, 1400, 1500, 3000, 9000, 60_000].into_iter().enumerate() {
            let f = frame(0, Some(1), i as u32, size);
            net.send(0, "vm", &f);
            net.run(10_000);
            assert_eq!(frames(&net.take(1, "vm")), vec![f.as_slice()], "{mode}: a {size}-byte frame");
        }
        let lost_before = net.wire.lock().unwrap().lost;
        net.send(1, "vm", &frame(1, Some(0), 99, 8000));
        net.run(10_000);
        assert_eq!(net.take(0, "vm").len(), 1, "{mode}");
        assert_eq!(net.wire.lock().unwrap().lost, lost_before, "{mode}: a datagram was too big for the path");
        // The path widens: the next raise finds it.
        net.set_faults(Faults::default());
        for _ in 0..(vnet_engine::pmtu::RAISE_NS / SEC + 40) {
            net.advance(SEC);
        }
        assert_eq!(net.hosts[0].link("p").unwrap().mtu(), 1500, "{mode}");
    }
}

#[test]
fn a_peer_with_another_key_gets_no_session_and_delivers_nothing() {
    // Host 1 expects host 5's key from host 0's address.
    let mut net = secure_pair("encrypt", 120, 5);
    idle(&mut net, 3_000);
    // Without a session a link sends no keepalive (its handshakes are what
    // the peer hears): nothing was sealed without one.
    assert_eq!([load(&sec(&net, 0).no_session), load(&sec(&net, 1).no_session)], [0, 0]);
    net.send(0, "vm", &frame(0, Some(1), 1, 64));
    net.send(1, "vm", &frame(1, Some(0), 2, 64));
    net.run(1000);
    assert!(net.take(1, "vm").is_empty() && net.take(0, "vm").is_empty());
    assert!(load(&sec(&net, 0).bad_handshakes) + load(&sec(&net, 1).bad_handshakes) >= 1);
    assert!(load(&sec(&net, 0).no_session) >= 1);
    assert_eq!(load(&sec(&net, 0).sessions) + load(&sec(&net, 1).sessions), 0);
}

#[test]
fn rekeying_under_steady_traffic_loses_nothing() {
    let mut net = secure_pair("encrypt", 2, 0);
    let (mut sent, mut got) = (0, 0);
    // 20 s of a frame each way every 10 ms, with a rekey every 2 s.
    for i in 0..2000u32 {
        net.send(0, "vm", &frame(0, Some(1), i, 200));
        net.send(1, "vm", &frame(1, Some(0), i, 200));
        sent += 2;
        net.advance(10_000_000);
        got += net.take(1, "vm").len() + net.take(0, "vm").len();
    }
    assert_eq!(got, sent, "frames lost across rekeys");
    let sessions = load(&sec(&net, 0).sessions) + load(&sec(&net, 1).sessions);
    assert!(sessions >= 10, "{sessions} sessions in 20 s");
    assert_eq!(load(&sec(&net, 0).auth_failures) + load(&sec(&net, 1).auth_failures), 0);
    assert_eq!(load(&sec(&net, 0).no_session) + load(&sec(&net, 1).no_session), 0);
}

/// Moves the clock `secs` seconds forward in the daemon's 100 ms ticks.
fn idle(net: &mut Net, ms: u64) {
    for _ in 0..ms / 100 {
        net.advance(100_000_000);
    }
}

fn liveness(net: &Net, h: usize) -> vnet_engine::link::Liveness {
    net.hosts[h].link("p").unwrap().liveness(net.now_ns())
}

#[test]
fn idle_vnet_links_keep_alive_go_down_when_the_wire_does_and_come_back_alone() {
    use vnet_engine::link::Liveness::{Down, Up};
    for opts in ["", "secured"] {
        let mut net = if opts.is_empty() { vnet_pair(31) } else { secure_pair("encrypt", 120, 0) };
        let what = if opts.is_empty() { "plain" } else { "secured" };
        // No traffic at all: each side hears the other's keepalives, and
        // only those (no other empty datagram).
        idle(&mut net, 5_000);
        for h in 0..2 {
            assert_eq!(liveness(&net, h), Up, "{what}: host {h}");
            let a = &net.hosts[h].link("p").unwrap().alive;
            assert!(load(&a.keepalives_sent) >= 3 && load(&a.keepalives_received) >= 3, "{what}: {a:?}");
            assert!(a.age_ns(net.now_ns()).unwrap() <= 1_100_000_000, "{what}: {a:?}");
        }
        // Received: the keepalives sent, and on a secured link the one its
        // handshake's initiator answers the response with.
        let count = |h: usize, f: fn(&vnet_engine::link::Alive) -> &std::sync::atomic::AtomicU64| {
            load(f(&net.hosts[h].link("p").unwrap().alive))
        };
        let sent = count(0, |a| &a.keepalives_sent) + count(1, |a| &a.keepalives_sent);
        let received = count(0, |a| &a.keepalives_received) + count(1, |a| &a.keepalives_received);
        assert_eq!(received, sent + u64::from(what == "secured"), "{what}");
        // A one-way stream: the sender sends no keepalives (its frames
        // are what the peer hears), the receiver keeps sending them.
        let before = load(&net.hosts[0].link("p").unwrap().alive.keepalives_sent);
        for t in 0..40 {
            net.send(0, "vm", &frame(0, Some(1), t, 200));
            idle(&mut net, 100);
        }
        assert_eq!(load(&net.hosts[0].link("p").unwrap().alive.keepalives_sent), before, "{what}");
        assert_eq!((liveness(&net, 0), liveness(&net, 1)), (Up, Up), "{what}");
        // The wire goes dark: both sides are down within 3.5 s and say so
        // once; it comes back: up again within a keepalive, by itself.
        net.set_faults(Faults { loss: 1.0, ..Faults::default() });
        idle(&mut net, 3_000);
        assert_eq!((liveness(&net, 0), liveness(&net, 1)), (Up, Up), "{what}: down too early");
        idle(&mut net, 700);
        assert_eq!((liveness(&net, 0), liveness(&net, 1)), (Down, Down), "{what}");
        idle(&mut net, 3_000);
        net.set_faults(Faults::default());
        idle(&mut net, 1_200);
        for h in 0..2 {
            assert_eq!(liveness(&net, h), Up, "{what}: host {h} after the wire came back");
            assert_eq!(load(&net.hosts[h].link("p").unwrap().alive.downs), 1, "{what}");
        }
        net.send(0, "vm", &frame(0, Some(1), 99, 200));
        net.run(100);
        assert_eq!(net.take(1, "vm").len(), 41, "{what}: frames after the outage");
        // The sending stops: a keepalive each second again, counted from
        // the first tick that saw nothing new sent (the 100 ms tick after
        // the last frame): at 1.1, 2.1, 3.1 and 4.1 s of these 5.
        let before = load(&net.hosts[0].link("p").unwrap().alive.keepalives_sent);
        idle(&mut net, 5_000);
        let after = load(&net.hosts[0].link("p").unwrap().alive.keepalives_sent);
        assert_eq!(after - before, 4, "{what}");
    }
}

#[test]
fn links_to_peers_without_keepalives_are_quiet_not_down_and_send_none() {
    use vnet_engine::link::Liveness::{Quiet, Up};
    let mut net = Net::new(5);
    add_pair(&mut net, |_| String::new());
    let cfg = "link r udp 10.0.0.9 format raw\nlink x vxlan 10.0.0.8 vni 7\n";
    net.apply(0, cfg).unwrap();
    net.start_capture();
    idle(&mut net, 5_000);
    for name in ["r", "x"] {
        let l = net.hosts[0].link(name).unwrap();
        assert_eq!(l.liveness(net.now_ns()), Quiet, "{name}");
        assert_eq!(load(&l.alive.keepalives_sent), 0, "{name}");
    }
    // What the wire carried is the vnet link's keepalives (empty
    // datagrams) and path MTU probes, none to the raw or VXLAN peers.
    let probe = |d: &[u8]| d.len() >= 20 && d[0] == 1 && vnet_wire::vnet::Flags(d[1]).is_probe();
    let wire = net.captured();
    assert!(
        wire.iter().all(|d| d.is_empty() || probe(d)),
        "{:?}",
        wire.iter().map(|d| d.len()).collect::<Vec<_>>()
    );
    // A raw peer heard from is up.
    net.inject("10.0.0.9:9000", &ip(0), frame(9, Some(0), 1, 100));
    net.run(10);
    assert_eq!(net.hosts[0].link("r").unwrap().liveness(net.now_ns()), Up);
}

#[test]
fn a_vms_broadcast_storm_is_cut_to_its_interfaces_limit_and_counted() {
    for (limit, per_tick) in [("", 100), (" broadcast-limit 50", 5), (" broadcast-limit 0", 1000)] {
        let mut net = Net::new(3);
        for (me, peer) in [(0, 1), (1, 0)] {
            let cfg = format!(
                "interface vm tap t mac {}{limit}\ninterface vm2 tap t2 mac {}\nlink p udp {} format vnet\n\
                 route any ff:ff:ff:ff:ff:ff -> link p\nroute any ff:ff:ff:ff:ff:ff -> interface vm\n",
                mac(me),
                mac(me + 4),
                ip(peer)
            );
            net.add_host(&ip(me), &cfg).unwrap();
        }
        // 1000 broadcasts in one tick, then 1000 in the next.
        for round in 0..2u32 {
            for t in 0..1000 {
                net.send(0, "vm", &frame(0, None, round * 1000 + t, 100));
            }
            net.run(1_000_000);
            assert_eq!(net.take(1, "vm").len(), per_tick, "{limit:?}: round {round}");
            net.advance(100_000_000);
        }
        let i = net.hosts[0].plane.ifaces.values().find(|i| i.name == "vm").unwrap();
        assert_eq!(load(&i.broadcast_limited), 2 * (1000 - per_tick as u64), "{limit:?}");
        // Another VM on the same host is not held back by the storm; nor
        // are unicast frames of the storming one.
        net.send(0, "vm2", &frame(4, None, 7, 100));
        net.run(100);
        assert_eq!(net.take(1, "vm").len(), 1, "{limit:?}");
    }
}

/// Host `h`'s frames delivered from GRO batches without reassembly, those
/// of them that came as two batches, and frames reassembled.
fn whole_counts(net: &Net, h: usize) -> [u64; 3] {
    let g = &net.hosts[h].global;
    [load(&g.rx_whole_batches), load(&g.rx_whole_pairs), load(&g.reasm_completed)]
}

#[test]
fn with_gro_a_frame_of_one_or_two_gso_sends_goes_to_the_vm_without_reassembly() {
    for secured in [false, true] {
        let mut net = if secured { secure_pair("encrypt", 120, 0) } else { vnet_pair(5) };
        net.set_faults(Faults { gro: true, ..Faults::default() });
        // 20000 bytes are one GSO send of 1500-byte-underlay datagrams;
        // 64000 bytes are 45 datagrams (46 secured), more than one send takes.
        for (payload, two) in [(20_000, 0), (64_000, 1)] {
            let before = whole_counts(&net, 1);
            let rx = |net: &Net| net.hosts[1].link("p").unwrap().rx.snapshot().bytes;
            let rx_before = rx(&net);
            let (vh, f) = tcp_super_frame(0, 1, payload, 1400);
            net.send_with(0, "vm", vh, &f);
            net.run(1000);
            assert_eq!(
                rx(&net) - rx_before,
                f.len() as u64,
                "the link counts the frame, not its offload header"
            );
            let got = net.take(1, "vm");
            assert_eq!(got.len(), 1, "secured {secured}, {payload} bytes");
            assert_eq!((got[0].vh, &got[0].frame), (Some(vh), &f), "secured {secured}, {payload} bytes");
            let after = whole_counts(&net, 1);
            let moved: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
            assert_eq!(
                moved,
                [1, two, 0],
                "secured {secured}, {payload} bytes: whole, of two batches, reassembled"
            );
        }
    }
}

#[test]
fn with_gro_reordered_batches_deliver_every_frame_once_and_intact() {
    for secured in [false, true] {
        let mut net = if secured { secure_pair("encrypt", 120, 0) } else { vnet_pair(9) };
        // (A GRO batch duplicated on the wire is a frame delivered twice, as
        // a duplicated datagram of a one-datagram frame always was.)
        net.set_faults(Faults { jitter_ns: 300_000, gro: true, ..Faults::default() });
        let sent: Vec<(VirtioNetHdr, Vec<u8>)> =
            (0..120).map(|t| tcp_super_frame(0, 1, 60_000 + t * 37, 1400)).collect();
        for (vh, f) in &sent {
            net.send_with(0, "vm", *vh, f);
            net.advance(100_000);
        }
        net.run(1_000_000);
        let mut got: Vec<Vec<u8>> = net.take(1, "vm").into_iter().map(|d| d.frame).collect();
        got.sort();
        let mut want: Vec<Vec<u8>> = sent.into_iter().map(|(_, f)| f).collect();
        want.sort();
        assert_eq!(got.len(), want.len(), "secured {secured}");
        assert!(got == want, "secured {secured}: a frame was changed");
        let [whole, pairs, reasm] = whole_counts(&net, 1);
        assert!(pairs > 0 && reasm > 0, "secured {secured}: both ways taken: {whole} {pairs} {reasm}");
    }
}

/// Issue 44, finding 1: junk shaped like initiations from strangers is
/// dropped on its first MAC, before the budget of initiations read from
/// unknown addresses, so a flood of it (200, over the 50 a second) leaves
/// that budget to the real peer, whose initiation from a new address still
/// moves its link.
#[test]
fn a_flood_of_junk_initiations_does_not_spend_the_budget_a_roaming_peer_needs() {
    let mut net = secure_pair("encrypt", 2, 0);
    let inits = rekey_initiations(&mut net);
    for i in 0..200u32 {
        let mut junk = inits[0].clone();
        junk[40] ^= 1 + (i % 255) as u8;
        net.inject(&format!("10.0.1.{}", 1 + i % 250), &ip(1), junk);
    }
    for d in &inits {
        net.inject("10.0.0.66", &ip(1), d.clone());
    }
    net.run(1000);
    let g = &net.hosts[1].global;
    assert_eq!(load(&g.stranger_initiations_limited), 0, "the junk spent the budget");
    assert_eq!(load(&g.stranger_initiations_bad_mac), 200);
    let l = net.hosts[1].link("p").unwrap();
    assert_eq!(l.endpoint().map(|e| e.to_string()).as_deref(), Some("10.0.0.66:9000"));
}

#[test]
fn an_initiation_answered_only_with_a_cookie_does_not_move_the_link() {
    let mut net = secure_pair("encrypt", 2, 0);
    let all = rekey_initiations(&mut net);
    let to_1 = |d: &Vec<u8>| net.hosts[1].link("p").unwrap().secure.as_ref().unwrap().initiation_to_us(d);
    let inits: Vec<Vec<u8>> = all.into_iter().filter(to_1).collect();
    assert!(inits.len() >= 2, "{} initiations of host 0", inits.len());
    // Host 1 under load: its handshake budget spent by initiations from
    // the peer's own address (replays, each still costing a token).
    for _ in 0..40 {
        net.inject(&ip(0), &ip(1), inits[0].clone());
    }
    net.run(1000);
    let cookies = load(&sec(&net, 1).cookies_sent);
    // A genuine initiation, new, from elsewhere: without the cookie's MAC
    // it gets a cookie, not a session, and proves nothing of where the
    // peer is.
    net.inject("10.0.0.66", &ip(1), inits[inits.len() - 1].clone());
    net.run(1000);
    assert!(load(&sec(&net, 1).cookies_sent) > cookies, "answered with a cookie");
    let l = net.hosts[1].link("p").unwrap();
    assert_eq!(l.endpoint().map(|e| e.ip().to_string()), Some(ip(0)), "the link stayed");
}

/// Hosts 0 and 1 (a VM each) whose secured link `p` names host 2 as its
/// relay, and host 2 the relay (`--relay`): every link secured, the
/// direct path between 0 and 1 cut from the start.
fn relayed_trio() -> Net {
    let mut net = Net::new(77);
    let key = |h: usize| Net::public_key(&ip(h));
    for (me, peer) in [(0, 1), (1, 0)] {
        let cfg = format!(
            "interface vm tap t mac {}\n\
             link r udp {} format vnet mtu 1500 peer-key {} security encrypt\n\
             link p udp {} format vnet mtu 1500 peer-key {} security encrypt relay {}\n\
             route any {} -> link p\nroute any {} -> interface vm\n",
            mac(me),
            ip(2),
            key(2),
            ip(peer),
            key(peer),
            key(2),
            mac(peer),
            mac(me)
        );
        net.add_host(&ip(me), &cfg).unwrap();
    }
    let relay = format!(
        "link a udp {} format vnet mtu 1500 peer-key {} security encrypt\n\
         link b udp {} format vnet mtu 1500 peer-key {} security encrypt\n",
        ip(0),
        key(0),
        ip(1),
        key(1)
    );
    net.add_host(&ip(2), &relay).unwrap();
    net.hosts[2].global.relay.store(true, std::sync::atomic::Ordering::Relaxed);
    net.cut(&ip(0), &ip(1), true);
    net
}

fn relay_counts(net: &Net) -> [u64; 4] {
    let p = |h: usize| net.hosts[h].link("p").unwrap().clone();
    [
        load(&p(0).relayed_tx),
        load(&p(1).relayed_rx),
        load(&net.hosts[2].global.relayed),
        load(&net.hosts[2].global.relay_refused),
    ]
}

#[test]
fn a_link_whose_peer_is_not_heard_directly_goes_through_its_relay_and_back_direct_when_it_is() {
    let mut net = relayed_trio();
    // Nothing direct for 3.5 s: each end relays (its handshake went both
    // ways, the relayed one answered), and frames of every size cross,
    // the largest fragmented to what fits inside the relay's datagrams.
    idle(&mut net, 4_000);
    for h in 0..2 {
        let p = net.hosts[h].link("p").unwrap();
        assert!(p.relaying.load(std::sync::atomic::Ordering::Relaxed), "host {h} does not relay");
        assert!(p.secure.as_ref().unwrap().established(), "host {h}: no session through the relay");
        assert_eq!(p.relay_link().map(|r| r.def.name.clone()).as_deref(), Some("r"), "host {h}");
        let own = 1500 - 28;
        assert_eq!(
            p.max_datagram(),
            own - vnet_engine::relay::OVERHEAD,
            "host {h}: what fits inside the relay's"
        );
        assert_eq!(net.hosts[h].link("r").unwrap().max_datagram(), own, "host {h}: the relay link's own");
    }
    // While relaying, each end tries the direct path once a second (a
    // sealed empty datagram, lost to the cut); nothing else goes direct.
    let cut_lost = |net: &Net| net.wire.lock().unwrap().cut_lost;
    let before = cut_lost(&net);
    idle(&mut net, 3_000);
    assert_eq!(cut_lost(&net) - before, 6, "direct tries in 3 s from 2 ends");
    // Heard directly a moment ago: direct until exactly the dead time.
    let p = net.hosts[0].link("p").unwrap().clone();
    let (t, relaying) = (net.now_ns(), || p.relaying.load(std::sync::atomic::Ordering::Relaxed));
    p.heard_direct.store(t + 1, std::sync::atomic::Ordering::Relaxed);
    p.tick(t + vnet_engine::link::DEAD_NS - 1);
    assert!(!relaying(), "heard directly within the dead time");
    p.tick(t + vnet_engine::link::DEAD_NS);
    assert!(relaying(), "not heard directly for the dead time");
    let before = relay_counts(&net);
    let sent: Vec<Vec<u8>> =
        [60, 1400, 1500, 4000].iter().enumerate().map(|(t, &n)| frame(0, Some(1), t as u32, n)).collect();
    for f in &sent {
        net.send(0, "vm", f);
    }
    net.run(1000);
    let got = net.take(1, "vm");
    assert_eq!(frames(&got), sent.iter().map(|f| f.as_slice()).collect::<Vec<_>>(), "through the relay");
    let after = relay_counts(&net);
    let moved: Vec<u64> = (0..4).map(|i| after[i] - before[i]).collect();
    // A datagram through the relay carries 1472 - 84 - 32 - 20 = 1336
    // bytes of frame: the frames of 74, 1414, 1514 and 4014 bytes are 1, 2,
    // 2 and 4 datagrams (9), in one send each (4), each relayed once.
    assert_eq!(moved, [4, 9, 9, 0], "sends through, datagrams received through, relayed, refused");
    // A send the socket refuses is not counted as sent through.
    net.set_faults(Faults { refuse: true, ..Faults::default() });
    net.send(0, "vm", &sent[0]);
    net.set_faults(Faults::default());
    assert_eq!(relay_counts(&net), after, "a refused send");
    // The direct path opens: within a keepalive both ends hear each
    // other directly and stop relaying; frames go direct.
    net.cut(&ip(0), &ip(1), false);
    idle(&mut net, 1_200);
    for h in 0..2 {
        let p = net.hosts[h].link("p").unwrap();
        assert!(!p.relaying.load(std::sync::atomic::Ordering::Relaxed), "host {h} still relays");
        assert_eq!(p.max_datagram(), 1500 - 28, "host {h}: direct again");
    }
    let before = relay_counts(&net);
    net.send(0, "vm", &sent[3]);
    net.run(1000);
    assert_eq!(frames(&net.take(1, "vm")), vec![sent[3].as_slice()], "directly");
    assert_eq!(relay_counts(&net), before, "nothing went through the relay");
}

#[test]
fn a_relay_passes_on_only_for_its_own_peers_and_only_when_it_relays() {
    let mut net = relayed_trio();
    net.hosts[2].global.relay.store(false, std::sync::atomic::Ordering::Relaxed);
    idle(&mut net, 4_000);
    // Not a relay (no `--relay`): what is sent through it is refused.
    let refused = relay_counts(&net)[3];
    assert!(refused > 0, "the handshakes through a host that is no relay were refused");
    for h in 0..2 {
        let p = net.hosts[h].link("p").unwrap();
        assert!(!p.secure.as_ref().unwrap().established(), "host {h} has a session no path carried");
    }
    net.send(0, "vm", &frame(0, Some(1), 1, 100));
    net.run(1000);
    assert!(net.take(1, "vm").is_empty());
    assert_eq!(relay_counts(&net)[2], 0, "relayed by a host that is no relay");
}

/// The `ENDPOINT` datagrams (where the sender sees its peer) among `wire`,
/// of an `auth` link (whose `vnet` header is readable: after the secured
/// header of version 2, type 4 (data), 16 bytes, the header's version,
/// then its flags; docs/wire.md).
fn endpoint_datagrams(wire: &[Vec<u8>]) -> usize {
    let data = |d: &&Vec<u8>| d.len() > 32 && d[0] == 2 && d[1] == 4 && d[16] == vnet_wire::vnet::VERSION;
    wire.iter().filter(data).filter(|d| d[17] & Flags::ENDPOINT != 0).count()
}

#[test]
fn a_nat_link_tells_its_peer_where_it_sees_it_every_ten_seconds_and_another_never() {
    for nat in [true, false] {
        let mut net = Net::new(3);
        add_pair(&mut net, |me| {
            let key = Net::public_key(&ip(1 - me));
            format!("peer-key {key} security auth{}", if nat { " nat" } else { "" })
        });
        net.start_capture();
        // From the first tick at 10 s after the session, then each 10 s:
        // at 10 and 20 s of these 25, from each end.
        idle(&mut net, 25_000);
        let told = endpoint_datagrams(&net.captured());
        assert_eq!(told, if nat { 4 } else { 0 }, "nat {nat}");
        for h in 0..2 {
            let seen = net.hosts[h].link("p").unwrap().seen_as.load().as_deref().map(|a| a.ip().to_string());
            assert_eq!(seen, nat.then(|| ip(h)), "nat {nat}: where host {h}'s peer sees it");
        }
    }
}

#[test]
fn a_gro_batch_of_one_flows_segments_on_a_raw_or_vxlan_link_reaches_the_vm_as_one_super_frame() {
    for kind in ["udp {ip} format raw", "vxlan {ip} vni 42"] {
        // 14100 bytes in segments of 1410 (ten frames of 1464 bytes, as
        // large as VXLAN carries at MTU 1500: 1464 + 8 = 1472); 6400 in
        // 64 of 100, as many as one send and one GSO frame take. To a VM
        // that takes offloads (one frame), and to one that does not (each
        // segment alone).
        for ((payload, mss, segs), offloads) in
            [(14_100, 1410, 10), (6400, 100, 64)].into_iter().flat_map(|c| [(c, true), (c, false)])
        {
            let mut net = Net::new(8);
            for (me, peer) in [(0, 1), (1, 0)] {
                let cfg = format!(
                    "interface vm tap t mac {}{}\nlink p {} mtu 1500\n\
                     route any {} -> link p\nroute any {} -> interface vm\n",
                    mac(me),
                    if offloads { "" } else { " offload off" },
                    kind.replace("{ip}", &ip(peer)),
                    mac(peer),
                    mac(me)
                );
                net.add_host(&ip(me), &cfg).unwrap();
            }
            net.set_faults(Faults { gro: true, ..Faults::default() });
            let (vh, f) = tcp_super_frame(0, 1, payload, mss);
            net.send_with(0, "vm", vh, &f);
            net.run(1000);
            let got = net.take(1, "vm");
            let g = &net.hosts[1].global;
            let gro = [load(&g.rx_gro_frames), load(&g.rx_gro_segments)];
            let what = format!("{kind}, {segs} segments, offloads {offloads}");
            let link = net.hosts[1].link("p").unwrap();
            // Every datagram of the batch taken once: no empty one past its end.
            assert_eq!((load(&link.alive.keepalives_received), load(&g.malformed)), (0, 0), "{what}");
            let rx = link.rx.snapshot();
            if !offloads {
                assert_eq!((got.len(), gro, rx.packets), (segs, [0, 0], segs as u64), "{what}");
                let payload: Vec<u8> = got.iter().flat_map(|d| d.frame[54..].iter().copied()).collect();
                assert_eq!(payload, f[54..], "{what}: the segments carry the stream");
                continue;
            }
            assert_eq!((got.len(), gro), (1, [1, segs as u64]), "{what}: {got:?}");
            assert_eq!(got[0].vh.map(|v| (v.gso_type, v.gso_size)), Some((GSO_TCPV4, mss)), "{what}");
            assert_eq!(&got[0].frame[54..], &f[54..], "{what}: the payload, whole and in order");
            assert_eq!((rx.packets, rx.bytes), (1, f.len() as u64), "{what}: one frame received");
        }
    }
}

#[test]
fn an_endpoint_said_on_a_plain_link_is_not_taken() {
    let mut net = vnet_pair(4);
    let r = VnetRepr { flags: Flags(Flags::ENDPOINT), network: 0, frame_id: 0, frame_len: 0, offset: 0 };
    let mut d = vec![0u8; vnet_wire::vnet::HEADER_LEN + 18];
    r.emit(&mut d).unwrap();
    d[vnet_wire::vnet::HEADER_LEN + 10..vnet_wire::vnet::HEADER_LEN + 16]
        .copy_from_slice(&[0xff, 0xff, 6, 6, 6, 6]);
    net.inject(&ip(0), &ip(1), d);
    net.run(10);
    assert!(net.hosts[1].link("p").unwrap().seen_as.load().is_none(), "anyone could have said it");
}

#[test]
fn a_whole_frame_without_an_offload_header_gets_one_inferred_at_the_links_segment_size() {
    let mut net = vnet_pair(6);
    // A 3000-byte TCP frame sent whole without its header (as the kernel
    // path sends what GRO merged), and the same with its header.
    let (vh, f) = tcp_super_frame(0, 1, 3000, 1400);
    let whole = |with_vh: bool| {
        let flags = Flags::WHOLE | if with_vh { Flags::VNET_HDR } else { 0 };
        let mut payload = if with_vh { vh.emit().to_vec() } else { Vec::new() };
        payload.extend_from_slice(&f);
        let r = VnetRepr { flags: Flags(flags), network: 0, frame_id: 0, frame_len: 0, offset: 0 };
        let mut d = vec![0u8; vnet_wire::vnet::HEADER_LEN];
        r.emit(&mut d).unwrap();
        d.extend_from_slice(&payload);
        d
    };
    net.inject(&ip(0), &ip(1), whole(false));
    net.run(10);
    let got = net.take(1, "vm");
    let mss = (1500 - vnet_wire::vnet::IPV4_ENCAP_OVERHEAD - 40) as u16;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].vh.map(|v| (v.gso_type, v.gso_size)), Some((GSO_TCPV4, mss)), "inferred");
    net.inject(&ip(0), &ip(1), whole(true));
    net.run(10);
    let got = net.take(1, "vm");
    assert_eq!((got.len(), got[0].vh), (1, Some(vh)), "as sent");
    // Not flagged whole (one datagram that is all of its frame): as it is.
    let r = VnetRepr { flags: Flags(0), network: 0, frame_id: 1, frame_len: f.len() as u32, offset: 0 };
    let mut plain = vec![0u8; vnet_wire::vnet::HEADER_LEN];
    r.emit(&mut plain).unwrap();
    plain.extend_from_slice(&f);
    net.inject(&ip(0), &ip(1), plain);
    net.run(10);
    let got = net.take(1, "vm");
    assert_eq!(got.len(), 1);
    assert!(got[0].vh.is_none_or(|h| h == VirtioNetHdr::NONE), "nothing inferred: {:?}", got[0].vh);
}

/// A UDP frame from VM `src` to `dst` (None: broadcast) from address
/// `from` (IPv4 or IPv6), ports `ports`.
fn ip_frame(src: usize, dst: Option<usize>, from: std::net::IpAddr, ports: [u16; 2]) -> Vec<u8> {
    let mut f = [dst.map_or([0xff; 6], mac_bytes), mac_bytes(src)].concat();
    let udp =
        [ports[0].to_be_bytes(), ports[1].to_be_bytes(), [0, 16], [0, 0], [0x47; 2], [0x47; 2]].concat();
    match from {
        std::net::IpAddr::V4(a) => {
            f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 36, 0, 0, 0, 0, 64, 17, 0, 0]);
            f.extend_from_slice(&a.octets());
            // To all (the broadcast MAC): to 255.255.255.255.
            f.extend_from_slice(&if dst.is_none() { [255; 4] } else { [10, 0, 0, 200] });
        }
        std::net::IpAddr::V6(a) => {
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0, 0, 16, 17, 64]);
            f.extend_from_slice(&a.octets());
            f.extend_from_slice(&"fd00::200".parse::<std::net::Ipv6Addr>().unwrap().octets());
        }
    }
    f.extend_from_slice(&udp);
    f.resize(f.len().max(60), 0);
    f
}

#[test]
fn a_vm_sending_from_an_address_its_interface_does_not_own_is_dropped_and_counted() {
    use std::sync::atomic::Ordering::Relaxed;
    let (a, b, c) = (mac(0), mac(1), mac(2));
    let mut net = Net::new(13);
    // a owns 10.0.0.1 (`addresses`), c owns 10.0.0.3 (a `neigh` line for
    // its MAC), b owns nothing: unguarded.
    let cfg = format!(
        "interface a tap ta mac {a} addresses 10.0.0.1,fd00::1\ninterface b tap tb mac {b}\n\
         interface c tap tc mac {c}\nneigh 10.0.0.3 {c}\n\
         route any {a} -> interface a\nroute any {b} -> interface b\nroute any {c} -> interface c\n\
         route any ff:ff:ff:ff:ff:ff -> interface b\n"
    );
    net.add_host("10.0.0.1", &cfg).unwrap();
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    let ll = |i: usize| std::net::IpAddr::V6(vnet_wire::guard::link_local(vnet_wire::MacAddr(mac_bytes(i))));
    let g = net.hosts[0].global.clone();
    let spoofed = || g.spoofed_source_ip.load(Relaxed);
    // (from VM, to VM, source address, ports, delivered)
    let cases = [
        (0, Some(1), ip("10.0.0.1"), [5000, 7777], true),
        (0, Some(1), ip("fd00::1"), [5000, 7777], true),
        (0, Some(1), ll(0), [5000, 7777], true),
        (0, Some(1), ip("10.0.0.3"), [5000, 7777], false),
        (0, Some(1), ip("fd00::3"), [5000, 7777], false),
        (0, Some(1), ll(2), [5000, 7777], false),
        (0, Some(1), ip("0.0.0.0"), [5000, 7777], false),
        (0, None, ip("0.0.0.0"), [68, 67], true),
        // DHCP's exemption is for the broadcast: from 0.0.0.0 to b alone, dropped.
        (0, Some(1), ip("0.0.0.0"), [68, 67], false),
        (2, Some(1), ip("10.0.0.3"), [5000, 7777], true),
        (2, Some(1), ip("10.0.0.1"), [5000, 7777], false),
        // The positive control: the same spoof from b, which owns nothing.
        (1, Some(0), ip("10.0.0.3"), [5000, 7777], true),
    ];
    let vm = ["a", "b", "c"];
    let mut dropped = 0;
    for (k, (from, to, src, ports, delivered)) in cases.into_iter().enumerate() {
        let f = ip_frame(from, to, src, ports);
        net.send(0, vm[from], &f);
        net.run(1000);
        let got = net.take(0, vm[to.unwrap_or(1)]);
        assert_eq!(frames(&got) == vec![f.as_slice()], delivered, "case {k}: {} from {src}", vm[from]);
        dropped += u64::from(!delivered);
        assert_eq!(spoofed(), dropped, "case {k}: counted");
    }
    // Pieces left to `forward` when they show no owned source.
    let vh = vnet_wire::virtio::VirtioNetHdr::NONE.emit();
    let spoof = ip_frame(0, Some(1), ip("10.0.0.3"), [5000, 7777]);
    assert!(!net.send_parts(0, "a", &[&[&vh[..], &spoof].concat()]), "a spoof is left to forward");
    let own = ip_frame(0, Some(1), ip("10.0.0.1"), [5000, 7777]);
    assert!(net.send_parts(0, "a", &[&[&vh[..], &own].concat()]), "its own address goes as it lies");
    assert_eq!(g.spoofed_source_mac.load(Relaxed), 0);
    // The `neigh` line withdrawn, c owns nothing: unguarded again.
    net.apply(0, "delete neigh 10.0.0.3\n").unwrap();
    let f = ip_frame(2, Some(1), ip("10.0.0.1"), [5000, 7777]);
    net.send(0, "c", &f);
    net.run(1000);
    assert_eq!(frames(&net.take(0, "b")).len(), 2, "the frame in pieces, then c's");
}
