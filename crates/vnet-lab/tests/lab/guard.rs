//! The IP source guard (issue 66, `docs/control.md`): a VM sending from
//! an address its interface does not own (another VM's) is dropped and
//! counted, on the user path and in the eBPF program, while its own
//! addresses, the link-local of its MAC, DHCP's client broadcast and ARP probes for
//! its own address pass; neighbour discovery naming another VM's address
//! (an advertisement for it, a probe for it) and router advertisements
//! are dropped too; an interface that owns no address is unguarded (the
//! positive control: the same spoof from it arrives).

use super::harness::*;

/// `catch DEV SECS OUT`: writes `ready`, then each `GRD-` marker of a
/// frame DEV receives. `send DEV SRCMAC DSTMAC DSTIP KIND,MARK[,SRC]...`:
/// sends each frame: `ip4` (UDP from SRC to DSTIP), `ip6` (UDP from SRC to
/// fd00::2), `dhcp` (a DHCP client's broadcast from 0.0.0.0), `dhcpu` (the
/// same, from 0.0.0.0 68 to 67, to DSTMAC and DSTIP alone), `arp` (a
/// request from sender SRC for TARGET, or DSTIP), `na` (a neighbour
/// advertisement from SRC for TARGET, with the sender's MAC and the
/// Override flag), `ns` (a solicitation from SRC for TARGET), `ra` (a
/// router advertisement from SRC), the marker in its payload (after the
/// ICMPv6 message). A spec is `KIND,MARK[,SRC[,TARGET]]`.
const GUARD: &str = r#"
import socket, struct, sys, time
def csum(b):
    if len(b) % 2:
        b += b'\0'
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    s = (s & 0xffff) + (s >> 16); s = (s & 0xffff) + (s >> 16)
    return (~s) & 0xffff
def mac(m):
    return bytes(int(x, 16) for x in m.split(':'))
def udp4(src, dst, sport, dport, data):
    u = struct.pack('!HHHH', sport, dport, 8 + len(data), 0) + data
    h = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(u), 1, 0, 64, 17, 0, src, dst)
    return h[:10] + struct.pack('!H', csum(h)) + h[12:] + u
if sys.argv[1] == 'catch':
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)); s.bind((sys.argv[2], 0))
    s.settimeout(0.2); end = time.time() + float(sys.argv[3]); out = open(sys.argv[4], 'w')
    out.write('ready\n'); out.flush()
    while time.time() < end:
        try:
            f = s.recv(70000)
        except socket.timeout:
            continue
        i = f.find(b'GRD-')
        if i >= 0:
            out.write(f[i:i + 24].split(b'.')[0].decode(errors='replace') + '\n'); out.flush()
else:
    dev, src_mac, dst_mac, dst_ip = sys.argv[2], mac(sys.argv[3]), mac(sys.argv[4]), sys.argv[5]
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW); s.bind((dev, 0))
    for spec in sys.argv[6:]:
        kind, mark, src, target = (spec.split(',') + ['', ''])[:4]
        data = ('GRD-%s.' % mark).encode()
        if kind == 'ip4':
            f = dst_mac + src_mac + b'\x08\x00' + udp4(socket.inet_aton(src), socket.inet_aton(dst_ip), 5000, 7777, data)
        elif kind == 'dhcp':
            f = b'\xff' * 6 + src_mac + b'\x08\x00' + udp4(b'\0' * 4, b'\xff' * 4, 68, 67, data)
        elif kind == 'dhcpu':
            f = dst_mac + src_mac + b'\x08\x00' + udp4(b'\0' * 4, socket.inet_aton(dst_ip), 68, 67, data)
        elif kind == 'ip6':
            u = struct.pack('!HHHH', 5000, 7777, 8 + len(data), 0) + data
            h = struct.pack('!IHBB', 0x60000000, len(u), 17, 64)
            h += socket.inet_pton(socket.AF_INET6, src) + socket.inet_pton(socket.AF_INET6, 'fd00::2')
            f = dst_mac + src_mac + b'\x86\xdd' + h + u
        elif kind in ('na', 'ns', 'ra'):
            t = {'na': 136, 'ns': 135, 'ra': 134}[kind]
            six = lambda a: socket.inet_pton(socket.AF_INET6, a)
            m = struct.pack('!BBHI', t, 0, 0, 0x20000000 if t == 136 else 0) + six(target or '::') + b'\x02\x02' + src_mac
            ph = six(src) + six('ff02::1') + struct.pack('!IxxxB', len(m), 58)
            m = m[:2] + struct.pack('!H', csum(ph + m)) + m[4:]
            h = struct.pack('!IHBB', 0x60000000, len(m), 58, 255) + six(src) + six('ff02::1')
            f = dst_mac + src_mac + b'\x86\xdd' + h + m + data
        else:
            a = struct.pack('!HHBBH', 1, 0x0800, 6, 4, 1) + src_mac + socket.inet_aton(src) + b'\0' * 6
            f = b'\xff' * 6 + src_mac + b'\x08\x06' + a + socket.inet_aton(target or dst_ip) + data
        s.send(f.ljust(60, b'\0')); time.sleep(0.02)
"#;

/// The IPv6 link-local address of `mac` (EUI-64).
fn link_local(mac: &str) -> String {
    let m: Vec<u8> = mac.split(':').map(|b| u8::from_str_radix(b, 16).unwrap()).collect();
    let w = |a: u8, b: u8| u16::from_be_bytes([a, b]);
    format!("fe80::{:x}:{:x}:{:x}:{:x}", w(m[0] ^ 2, m[1]), w(m[2], 0xff), w(0xfe, m[3]), w(m[4], m[5]))
}

/// Frames dropped by the guard on host `h`: the user path's and the
/// kernel path's counters (0 where a build has none).
fn spoofed(lab: &Lab, h: usize) -> (u64, u64) {
    let g = json(lab, h, "stats")["global"].clone();
    let n = |k: &str| g[k].as_u64().unwrap_or(0);
    (n("spoofed_source_ip"), n("kernel_spoofed_source_ip"))
}

/// Sends `frames` from `from` to `to` and returns the markers `to` caught
/// once every one of `expect` arrived (at most 15 s).
fn exchange(
    lab: &mut Lab,
    script: &str,
    (from, to): (&Vm, &Vm),
    frames: &[String],
    expect: &[&str],
) -> Vec<String> {
    let caught = lab.dir.join(format!("caught-{}.txt", expect[0]));
    let _ = std::fs::remove_file(&caught);
    let out = caught.to_str().unwrap().to_string();
    lab.spawn(&to.ns, &["python3", script, "catch", &to.dev, "30", &out]).unwrap();
    let read = || std::fs::read_to_string(&caught).unwrap_or_default();
    wait_until(10.0, "the catcher listens", || read().starts_with("ready"));
    let mut args = vec!["python3", script, "send", &from.dev, &from.mac, &to.mac];
    let dst = to.ip.to_string();
    args.push(&dst);
    args.extend(frames.iter().map(String::as_str));
    let sent = lab.ns_exec(&from.ns, &args).unwrap();
    assert!(sent.status.success(), "{sent:?}");
    let got = || read().lines().skip(1).map(|l| l.trim_start_matches("GRD-").to_string()).collect::<Vec<_>>();
    wait_until_or(
        15.0,
        "the frames that should arrive",
        || expect.iter().all(|e| got().iter().any(|g| g == e)),
        || format!("caught {:?}", got()),
    );
    got()
}

mod both {
    use super::*;

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_vm_sending_from_another_vms_address_is_dropped_and_counted_where_its_interface_owns_addresses() {
        let mut lab = lab(Spec { vms_per_host: 2, ..Spec::default() });
        let (a, v, b) = (lab.vm(0, 0).clone(), lab.vm(0, 1).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        let script = lab.dir.join("guard.py");
        std::fs::write(&script, GUARD).unwrap();
        let script = script.to_str().unwrap().to_string();
        let kernel = lab.spec.datapath.as_deref() == Some("kernel");
        let (ai, vi) = (a.ip.to_string(), v.ip.to_string());
        let f = |kind: &str, mark: &str, src: &str| format!("{kind},{mark},{src}");

        // Unguarded (a's interface owns no address yet): a's frame from
        // v's address arrives. The positive control of the guard.
        let sources = json(&lab, 0, "interfaces");
        println!("guard: before, vm0 source_guard {}", sources["interfaces"][0]["source_guard"]);
        let got = exchange(
            &mut lab,
            &script,
            (&a, &b),
            &[f("ip4", "spoof0", &vi), f("dhcpu", "dhcpu0", ""), f("ip4", "own0", &ai)],
            &["own0"],
        );
        println!("guard: unguarded, b caught {got:?}, spoofed {:?}", spoofed(&lab, 0));
        assert!(got.iter().any(|g| g == "spoof0"), "unguarded, the spoof arrives: {got:?}");
        assert!(
            got.iter().any(|g| g == "dhcpu0"),
            "unguarded, DHCP from 0.0.0.0 to b alone arrives: {got:?}"
        );
        assert_eq!(spoofed(&lab, 0), (0, 0));

        // a's interface owns its address (a `neigh` line for its MAC, as
        // vnet-cni writes for the addresses it gives).
        lab.apply(0, &format!("neigh {ai} {}\n", a.mac)).unwrap();
        let (ll, vll) = (link_local(&a.mac), link_local(&v.mac));
        let nd = |kind: &str, mark: &str, src: &str, target: &str| format!("{kind},{mark},{src},{target}");
        let frames = [
            f("ip4", "spoof1", &vi),
            f("ip6", "spoof6", &vll),
            f("ip4", "zero", "0.0.0.0"),
            // DHCP's client exemption is for its broadcast: from 0.0.0.0
            // to b alone (its MAC and address) is dropped.
            f("dhcpu", "dhcpuni", ""),
            f("arp", "arpspoof", &vi),
            // Neighbour discovery from a's own link-local naming v's
            // address: the advertisement that takes v's traffic (or v's
            // address, answering its duplicate address detection), the
            // probes for v's address, a router advertisement.
            nd("na", "navictim", &ll, &vll),
            nd("ns", "dadvictim", "::", &vll),
            nd("arp", "probevictim", "0.0.0.0", &vi),
            f("ra", "ra", &ll),
            f("ip4", "own1", &ai),
            f("ip6", "ll1", &ll),
            f("dhcp", "dhcp1", ""),
            f("arp", "arpown", &ai),
            // The positive controls: the same for a's own address.
            nd("arp", "probe", "0.0.0.0", &ai),
            nd("na", "naown", &ll, &ll),
            nd("ns", "dadown", "::", &ll),
        ];
        let want = ["own1", "ll1", "dhcp1", "arpown", "probe", "naown", "dadown"];
        let got = exchange(&mut lab, &script, (&a, &b), &frames, &want);
        let counts = spoofed(&lab, 0);
        println!("guard: guarded, b caught {got:?}, spoofed (user, kernel) {counts:?}");
        let bad =
            ["spoof1", "spoof6", "zero", "dhcpuni", "arpspoof", "navictim", "dadvictim", "probevictim", "ra"];
        for bad in bad {
            assert!(!got.iter().any(|g| g == bad), "{bad} from a guarded interface arrived: {got:?}");
        }
        if kernel {
            // Each spoof dropped by the program itself.
            assert!(counts.1 >= 9, "the kernel path dropped and counted them: {counts:?}");
        } else {
            assert!(counts.0 >= 9, "the user path dropped and counted them: {counts:?}");
        }

        // `show interfaces` says which interface is guarded, by what.
        let ifaces = json(&lab, 0, "interfaces");
        let guard_of = |n: &str| {
            let i = ifaces["interfaces"].as_array().unwrap().iter().find(|i| i["name"] == n).unwrap();
            (i["source_guard"].clone(), i["addresses"].clone())
        };
        println!("guard: vm0 {:?}, vm1 {:?}", guard_of("vm0"), guard_of("vm1"));
        assert_eq!(guard_of("vm0").0, "on");
        assert_eq!(guard_of("vm1").0, "off (no addresses)");
        let all = &json(&lab, 0, "interfaces");
        assert!(all.to_string().contains(&ll), "the link-local of a's MAC is a's: {ll} in {all}");
        // v's interface owns nothing: the same spoof (of a's address, from
        // v) arrives: the guard is what stops it.
        let before = spoofed(&lab, 0);
        let got = exchange(
            &mut lab,
            &script,
            (&v, &b),
            &[f("ip4", "fromv", &ai), f("ip4", "end2", &vi)],
            &["end2"],
        );
        println!("guard: from unguarded v, b caught {got:?}");
        assert!(got.iter().any(|g| g == "fromv"), "{got:?}");
        assert_eq!(spoofed(&lab, 0), before);
        // a's own traffic is untouched.
        assert_ping(&lab, &a, b.ip, 56);
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn an_interface_declared_with_addresses_passes_only_its_own_and_its_vms_traffic_flows() {
        // Every VM's interface says `addresses IP` (its own) from the start.
        let mut lab = lab(Spec { vms_per_host: 2, addresses: true, ..Spec::default() });
        let (a, v, b) = (lab.vm(0, 0).clone(), lab.vm(0, 1).clone(), lab.vm(1, 0).clone());
        // Guarded on both ends, ARP and ping work as before.
        assert_ping(&lab, &a, b.ip, 56);
        assert_ping(&lab, &b, v.ip, 56);
        let config = lab.control(0, "show config").unwrap().body;
        assert!(config.contains(&format!(" addresses {}", a.ip)), "{config}");
        let script = lab.dir.join("guard.py");
        std::fs::write(&script, GUARD).unwrap();
        let script = script.to_str().unwrap().to_string();
        let frames = [format!("ip4,spoof,{}", v.ip), format!("ip4,own,{}", a.ip)];
        let got = exchange(&mut lab, &script, (&a, &b), &frames, &["own"]);
        let counts = spoofed(&lab, 0);
        println!("guard: declared addresses, b caught {got:?}, spoofed (user, kernel) {counts:?}");
        assert!(!got.iter().any(|g| g == "spoof"), "{got:?}");
        assert!(counts.0 + counts.1 >= 1, "{counts:?}");
        if lab.spec.datapath.as_deref() == Some("kernel") {
            assert!(counts.1 >= 1, "dropped by the eBPF program: {counts:?}");
        }
    }
}
