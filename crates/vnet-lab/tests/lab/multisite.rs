//! Hosts on different sites: NATs and relays, roaming peers, path MTU, IPv6 and dual-stack underlays, flapping underlays.

use super::harness::*;

/// Junk from strangers, `rate` a second for `secs` seconds, to `dst` port
/// 9000: initiations with a first MAC of random bytes (3 in 4) and data
/// messages of no session, each from a random address of 10.77.50-249.x.
const STRANGERS: &str = r#"
import socket, struct, sys, time, os
dst, secs, rate = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
start = time.time()
n = 0
while time.time() < start + secs:
    time.sleep(max(0.0, start + n / rate - time.time()))
    r = os.urandom(176)
    payload = bytes([2, 1, 2, 0]) + r[:172] if n % 4 else bytes([2, 4, 2, 0]) + r[:60]
    udp = struct.pack('!HHHH', 40000 + n % 1000, 9000, 8 + len(payload), 0) + payload
    src = '10.77.%d.%d' % (50 + r[0] % 200, 1 + r[1] % 250)
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, socket.inet_aton(src), socket.inet_aton(dst))
    try:
        s.sendto(ip + udp, (dst, 0))
    except OSError:
        pass
    n += 1
print(n)
"#;

/// Host 1 stops, takes underlay address `to` (from `from`) and starts
/// again; returns how long until VM B pings VM A again.
fn restart_at(lab: &mut Lab, from: &str, to: &str) -> Duration {
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    lab.stop_vnetd(1).unwrap();
    readdress(lab, 1, from, to);
    let t0 = std::time::Instant::now();
    lab.start_vnetd(1).unwrap();
    let deadline = t0 + Duration::from_secs(30);
    while lab.ping(&b, a.ip, 1, 56).unwrap().received == 0 {
        assert!(std::time::Instant::now() < deadline, "host 1 at {to}: no ping through in 30 s");
    }
    t0.elapsed()
}

/// `count` pings of 56 bytes from `vm` to `ip`, 10 ms apart.
fn fast_ping(lab: &Lab, vm: &Vm, ip: Ipv4Addr, count: u32) -> vnet_lab::PingResult {
    let c = count.to_string();
    let out = lab
        .ns_output(&vm.ns, &["ping", "-n", "-q", "-c", &c, "-i", "0.01", "-W", "1", &ip.to_string()])
        .unwrap();
    vnet_lab::PingResult::parse(&String::from_utf8_lossy(&out.stdout))
}

/// On both passes (every vnetd interface on the user path, then on the kernel path), two tests at a time.
mod both {
    use super::*;

    /// Issue 31, path MTU: two sites whose segments are 1500 bytes, joined by
    /// routers over a 1280-byte link that send no ICMP. Each host's link (`mtu
    /// 1500` as configured) finds 1280 by probing; VMs on MTU 1500 exchange
    /// 8000-byte pings and full-size TCP both ways, on either path (the kernel
    /// path leaves what does not fit to the user path, which fragments).
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_1280_byte_link_between_sites_is_found_by_probes_and_carries_full_size_tcp_and_8000_byte_pings() {
        let mut lab = lab(Spec { site_mtu: Some(1280), vm_mtu: 1500, ..Spec::default() });
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        let found = wait_until(10.0, "both links find the path MTU", || {
            (0..2).all(|h| link_json(&lab, h)["pmtu_search"] == "done")
        });
        for h in 0..2 {
            let l = link_json(&lab, h);
            assert_eq!((l["mtu"].as_u64(), l["pmtu"].as_u64()), (Some(1500), Some(1280)), "host {h}: {l}");
            eprintln!(
                "path MTU: host {h} found {} in {found:?} ({} probes, {} answered)",
                l["pmtu"], l["pmtu_probes"], l["pmtu_probes_acked"]
            );
        }
        // 1300 bytes: a frame the kernel path would take at the configured
        // 1500 but must not at 1280 (it goes to the user path, fragmented).
        for (from, to) in [(&a, &b), (&b, &a)] {
            for size in [56, 1300, 1472, 8000] {
                assert_ping(&lab, from, to.ip, size);
            }
        }
        for (from, to) in [(&a, &b), (&b, &a)] {
            let bytes = assert_stream(&mut lab, from, to, 2);
            eprintln!("path MTU: {} -> {}: {:.2} Gbit/s", from.ip, to.ip, bytes as f64 * 8.0 / 2e9);
        }
        // The routers did have datagrams too big for the 1280-byte link (the
        // probes past it): the ICMP they would have answered was dropped.
        let mut icmp = 0;
        for r in ["r0", "r1"] {
            let ns = format!("{}-{r}", lab.prefix);
            let out = lab.ns_output(&ns, &["iptables", "-L", "OUTPUT", "-v", "-x", "-n"]).unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            icmp += text
                .lines()
                .find(|l| l.contains("DROP"))
                .and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0);
        }
        eprintln!("path MTU: the routers' ICMP dropped: {icmp}");
        assert!(icmp > 0, "no datagram was too big for the routers: nothing was probed past 1280");
        for h in 0..2 {
            let g = json(&lab, h, "stats")["global"].clone();
            assert_eq!(g["malformed"], 0, "host {h}: {g}");
        }
    }

    /// Issue 31: an IPv6-only underlay (no IPv4 address on the hosts' underlay)
    /// carries ARP, pings of every size and a TCP stream VM to VM, on either
    /// path (the kernel pass: encapsulated and decapsulated by the eBPF
    /// programs over IPv6, the next hop found by neighbour discovery).
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn an_ipv6_only_underlay_carries_arp_pings_and_a_stream_on_either_path() {
        let mut lab = lab(Spec { ipv6_underlay: true, vm_mtu: V6_VM_MTU, ..Spec::default() });
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        for h in 0..2 {
            assert_ipv6_only(&lab, h);
        }
        assert_ping(&lab, &a, b.ip, 56);
        assert_ping(&lab, &b, a.ip, 56);
        assert_ping(&lab, &a, b.ip, V6_VM_MTU - 28);
        assert_ping(&lab, &b, a.ip, 8000);
        let moved = assert_stream(&mut lab, &a, &b, 2) as f64;
        assert_stream(&mut lab, &b, &a, 1);
        for h in 0..2 {
            let g = json(&lab, h, "stats")["global"].clone();
            assert_eq!((g["malformed"].as_u64(), g["unknown_source"].as_u64()), (Some(0), Some(0)), "{g}");
            if lab.spec.datapath.as_deref() == Some("kernel") {
                assert_eq!(g["kernel_errors"], 0, "host {h}: {g}");
                let l = &json(&lab, h, "links")["links"][0];
                assert_eq!(l["datapath"], "kernel", "host {h}'s link: {l}");
            }
        }
        assert_kernel_carried(&lab, 0);
        if lab.spec.datapath.as_deref() == Some("kernel") {
            let g = json(&lab, 0, "stats")["global"].clone();
            let bytes = g["kernel_encap_bytes"].as_u64().unwrap() as f64;
            assert!(bytes > 0.8 * moved, "the kernel moved {bytes} B of about {moved}: {g}");
        }
        // On the wire: IPv6 between the hosts' addresses, nothing else.
        let ns = lab.hosts[0].ns.clone();
        let wire = tcpdump_during(&ns, &["-c", "4", "-i", "u0", "udp"], 4, || {
            lab.ping(&a, b.ip, 3, 56).unwrap();
        });
        assert!(wire.contains("fd00:77::1.") && wire.contains("fd00:77::2.9000"), "{wire}");
    }

    /// Issue 31: one host with IPv4 and IPv6 links at once, on one dual-stack
    /// socket (`listen udp [::]:9000`): host 0 reaches host 1 over IPv4 and
    /// host 2 over IPv6 (both underlays on one segment), on either path.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn one_host_with_an_ipv4_link_and_an_ipv6_link_on_one_dual_stack_socket() {
        let mut lab = lab(Spec { hosts: 3, listen_any: vec![0, 2], vm_mtu: V6_VM_MTU, ..Spec::default() });
        for h in 0..3 {
            let (ns, dev) = (lab.hosts[h].ns.clone(), lab.hosts[h].underlay_dev.clone());
            let addr = format!("fd00:77::{}/64", h + 1);
            assert!(lab
                .ns_exec(&ns, &["ip", "-6", "addr", "add", &addr, "dev", &dev, "nodad"])
                .unwrap()
                .status
                .success());
        }
        let vms: Vec<Vm> = (0..3).map(|h| lab.vm(h, 0).clone()).collect();
        for (h, peer, at) in [(0, 2, "fd00:77::3"), (2, 0, "fd00:77::1")] {
            let line = format!(
                "link h{peer} udp [{at}]:9000 format vnet\nroute any {} -> link h{peer}\n\
             route any ff:ff:ff:ff:ff:ff -> link h{peer}\n",
                vms[peer].mac
            );
            replace_link(&lab, h, &format!("h{peer}"), &line);
        }
        for (a, b) in [(0, 1), (0, 2), (1, 0), (2, 0)] {
            assert_ping(&lab, &vms[a], vms[b].ip, 56);
            assert_ping(&lab, &vms[a], vms[b].ip, V6_VM_MTU - 28);
        }
        assert_stream(&mut lab, &vms[0], &vms[2], 2);
        assert_stream(&mut lab, &vms[0], &vms[1], 2);
        assert_eq!(link_named(&lab, 0, "h1")["remote"], "10.77.0.2:9000");
        assert_eq!(link_named(&lab, 0, "h2")["remote"], "[fd00:77::3]:9000");
        for name in ["h1", "h2"] {
            let l = link_named(&lab, 0, name);
            assert!(l["rx_packets"].as_u64().unwrap() > 100, "{l}");
            if lab.spec.datapath.as_deref() == Some("kernel") {
                assert_eq!(l["datapath"], "kernel", "{l}");
            }
        }
        let g = json(&lab, 0, "stats")["global"].clone();
        assert_eq!((g["malformed"].as_u64(), g["unknown_source"].as_u64()), (Some(0), Some(0)), "{g}");
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn idle_links_stay_up_on_keepalives_an_underlay_flapping_twenty_times_a_minute_loses_only_its_outages() {
        let mut lab = lab(Spec::default());
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        // No traffic: the links hear each other's keepalives.
        std::thread::sleep(Duration::from_millis(2500));
        for h in 0..2 {
            let l = link_json(&lab, h);
            assert_eq!(l["state"], "up", "{l}");
            assert!(l["keepalives_received"].as_u64().unwrap() >= 1, "{l}");
            assert!((0..=1500).contains(&l["last_rx_ms"].as_i64().unwrap()), "{l}");
        }
        let metrics = lab.vnetctl(0, &["show", "metrics"]).unwrap();
        let metrics = String::from_utf8_lossy(&metrics.stdout).to_string();
        assert!(metrics.contains("vnet_link_up{link=\"h1\"} 1"), "{metrics}");
        // Flapping: host 1's underlay down 1.5 s, up 1.5 s, 20 times, under
        // a ping every 100 ms and a TCP stream.
        lab.spawn(&b.ns, &["iperf3", "-s", "-1", "-B", &b.ip.to_string()]).unwrap();
        lab.wait_listening(&b.ns, 5201).unwrap();
        let (ns1, dev1) = (lab.hosts[1].ns.clone(), lab.hosts[1].underlay_dev.clone());
        let set = |state: &str| {
            lab.ns_exec(&ns1, &["ip", "link", "set", &dev1, state]).unwrap();
        };
        let rss_before = rss_kb(lab.vnetd_pid(0).unwrap());
        let (ns, ip) = (a.ns.as_str(), b.ip.to_string());
        let ping = in_background(ns, &["ping", "-n", "-i", "0.1", "-c", "640", "-W", "1", &ip]);
        // The stream goes on 8 s past the flapping: TCP's retransmission timer
        // has doubled through each outage, so its first retransmission after
        // the last one may come seconds later (a CI run under load saw the
        // last 4 s of a stream ending 3 s after it at zero).
        let tcp = in_background(ns, &["iperf3", "-c", &ip, "-t", "70", "-b", "50M", "-J"]);
        std::thread::sleep(Duration::from_secs(1));
        for _ in 0..20 {
            set("down");
            std::thread::sleep(Duration::from_millis(1500));
            set("up");
            std::thread::sleep(Duration::from_millis(1500));
        }
        let ping = String::from_utf8_lossy(&ping.join().unwrap().stdout).to_string();
        let tcp = tcp.join().unwrap();
        let r = vnet_lab::PingResult::parse(&ping);
        let gap = longest_gap(&ping, r.sent);
        let j: serde_json::Value = serde_json::from_slice(&tcp.stdout).unwrap_or_default();
        let tail: Vec<f64> = j["intervals"]
            .as_array()
            .map(|a| a.iter().filter_map(|i| i["sum"]["bits_per_second"].as_f64()).map(|b| b / 1e6).collect())
            .unwrap_or_default();
        let rss_after = rss_kb(lab.vnetd_pid(0).unwrap());
        eprintln!(
            "flapping x20: ping {}/{} received, longest gap {gap} pings; TCP Mbit/s per second {tail:.0?}; \
         vnetd RSS {rss_before} -> {rss_after} kB",
            r.received, r.sent
        );
        assert_eq!(r.sent, 640, "ping output not understood:\n{ping}");
        // Half the minute is outage: a ping is lost in it and shortly after,
        // not beyond. "Shortly" is the kernel's: when the underlay comes back in
        // the middle of the neighbour's unicast probes (a second apart), the
        // next probe or a new ARP cycle takes up to ~3 s more (our reading of
        // a 3.4 s gap CI saw once under load, on the user path; a kernel-path
        // run under load showed the like: not traced to the packet).
        // Received: about twice the loss the test command measured (three
        // tests at a time, 2026-12-07: 600, 606, 609, 579 and 604 of 640,
        // the worst 61 lost; the bound was 256, two fifths). The gap stays
        // wide (5-8 measured) for the ~3 s kernel ARP cycle above.
        assert!(r.received >= 640 - 2 * 61, "{r:?}");
        assert!(gap <= 50, "a gap of {gap} pings (100 ms each) for a 1.5 s outage");
        assert!(tcp.status.success() && j.get("error").is_none(), "the TCP stream broke: {}", j);
        assert!(tail.len() >= 69, "iperf3 did not run its course: {tail:.0?}");
        // Recovered: the stream moves in its last second, and the 8 s past
        // the flapping carry at least half its 50 Mbit/s on average. Not
        // "every one of the last seconds": TCP may lose some of the burst in
        // which iperf3 catches up and wait out one more timeout (a CI run
        // under load: [.., 0, 0, 1032, 50, 6, 0, 144, 49], a second at 0
        // five seconds after the last outage).
        let after: Vec<f64> = tail.iter().skip(62).copied().collect();
        let mean = after.iter().sum::<f64>() / after.len().max(1) as f64;
        assert!(
            tail.last().is_some_and(|&m| m > 10.0) && mean >= 25.0,
            "the stream did not recover: {tail:.0?} ({mean:.0} Mbit/s past the flapping)"
        );
        assert!(rss_after < rss_before + 8 * 1024, "vnetd grew from {rss_before} kB to {rss_after} kB");
        // A longer outage: both ends say the peer is down within 3.5 s (and
        // log it once), and up again within a keepalive of its return, alone.
        let downs = link_json(&lab, 0)["downs"].as_u64().unwrap();
        eprintln!("flapping x20: the link went down {downs} times (a 1.5 s outage is under the 3.5 s that make it down)");
        set("down");
        let down = wait_until(4.5, "host 0 sees its peer down", || link_json(&lab, 0)["state"] == "down");
        assert!(down >= Duration::from_secs(2), "down after {down:?}: the last keepalive is at most 1 s old");
        set("up");
        let up = wait_until(2.0, "host 0 sees its peer up", || link_json(&lab, 0)["state"] == "up");
        assert_ping(&lab, &a, b.ip, 56);
        let l = link_json(&lab, 0);
        assert_eq!(l["downs"], downs + 1, "{l}");
        let log = lab.log(0);
        assert_eq!(log.matches("peer down").count() as u64, downs + 1, "{log}");
        assert!(log.contains("peer up"), "{log}");
        assert!(!log.contains("panicked"), "{log}");
        eprintln!("an outage: host 0 said down after {down:?}, up {up:?} after the underlay came back");
    }
}

/// On both passes, one test at a time (each says why).
mod both_alone {
    use super::*;

    // Alone: a bound a neighbour could break (lost 10 ms pings, adaptive polling, a timed map update).
    /// Issue 31: the relocation test on an IPv6-only underlay, on either path.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn relocating_a_vm_over_an_ipv6_only_underlay_loses_a_handful_of_pings_and_no_connection() {
        relocation(Spec {
            hosts: 3,
            veth_hosts: vec![0, 1, 2],
            ipv6_underlay: true,
            vm_mtu: V6_VM_MTU,
            ..Spec::default()
        });
    }
}

/// On the user pass only: their traffic never takes the kernel path (secured, TCP and TLS links), they are about the user path itself, or they test no data path.
mod user {
    use super::*;

    /// Issue 31, NAT traversal: host 0 behind a cone-like NAT, hosts 1 and 3
    /// each behind a symmetric one (a new random port per destination), host 2
    /// public and a relay; every link secured and `nat`. Hosts 0 and 1 reach
    /// each other directly: host 1's initiation reaches host 0 through its
    /// NAT's forward, host 0's link follows it to the symmetric NAT's random
    /// port, and the datagrams between them go between the two NATs'
    /// addresses, not through host 2. Flushing the symmetric NAT's conntrack
    /// mid-transfer (its next datagrams leave from a new random port) costs
    /// under 3 s. Hosts 1 and 3 cannot reach each other directly (each NAT
    /// drops what the other sends to a port it never learns): their link goes
    /// through host 2, which sees only ciphertext.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn hosts_behind_nats_talk_directly_or_through_a_relay_that_sees_only_ciphertext() {
        let mut lab = lab(Spec { hosts: 4, nat: true, links: Links::Encrypt, ..Spec::default() });
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        let waited = wait_until(15.0, "hosts 0 and 1 have a session", || {
            link_named(&lab, 0, "h1")["established"] == true
                && link_named(&lab, 1, "h0")["established"] == true
        });
        eprintln!("NAT: hosts 0 and 1 have a session after {waited:?}");
        assert_ping(&lab, &a, b.ip, 56);
        assert_ping(&lab, &b, a.ip, 1400);
        let l = link_named(&lab, 0, "h1");
        let endpoint = l["endpoint"].as_str().unwrap_or_default().to_string();
        assert!(endpoint.starts_with("203.0.113.2:"), "host 0 sends to {endpoint}: {l}");
        assert_eq!(l["path"], "punched", "{l}");
        assert_eq!(link_named(&lab, 0, "h2")["path"], "direct");
        eprintln!("NAT: host 0 reaches host 1 at {endpoint} (its NAT's random port)");
        // Each learns its public endpoint from a peer that sees it (host 2,
        // public, reflects): host 0 its cone NAT's port 9000, host 1 a random
        // port of its symmetric NAT (another than the one host 0 sees).
        let seen =
            |h: usize, l: &str| link_named(&lab, h, l)["seen_as"].as_str().unwrap_or_default().to_string();
        wait_until(12.0, "hosts 0 and 1 learn their public endpoints", || {
            !seen(0, "h2").is_empty() && !seen(1, "h2").is_empty()
        });
        assert_eq!(seen(0, "h2"), "203.0.113.1:9000");
        assert!(seen(1, "h2").starts_with("203.0.113.2:"), "{}", seen(1, "h2"));
        eprintln!("NAT: host 2 sees host 0 as {} and host 1 as {}", seen(0, "h2"), seen(1, "h2"));
        // Direct: host 2's links carry the keepalives only while 100 pings go.
        let r_rx = |lab: &Lab| {
            json(lab, 2, "links")["links"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l["rx_packets"].as_u64().unwrap_or(0))
                .sum::<u64>()
        };
        // A capture on the internet segment meanwhile: the pings' datagrams go
        // between the two NATs' addresses, none to or from host 2 but its
        // links' keepalives.
        let inet = format!("{}-inet", lab.prefix);
        let before = r_rx(&lab);
        let mut p = None;
        let wire =
            tcpdump_during(&inet, &["-i", "br0", "udp"], 4, || p = Some(fast_ping(&lab, &a, b.ip, 100)));
        let p = p.unwrap();
        assert_eq!(p.received, 100, "{p:?}");
        let relayed = r_rx(&lab) - before;
        assert!(relayed < 30, "host 2 received {relayed} datagrams during 100 pings between hosts 0 and 1");
        let between = |x: &str, y: &str| wire.lines().filter(|l| l.contains(x) && l.contains(y)).count();
        let (direct, via_2) = (between("203.0.113.1.", "203.0.113.2."), between("203.0.113.10.", " "));
        eprintln!(
            "NAT: the internet segment saw {direct} datagrams between the two NATs, {via_2} to or from host 2"
        );
        assert!(direct >= 200, "{direct} datagrams between the NATs for 100 pings both ways:\n{wire}");
        // Through host 2 they would be 400 (each ping and reply in and out).
        assert!(via_2 < 100, "{via_2} datagrams to or from host 2 during the pings:\n{wire}");
        eprintln!("NAT: punched path: ping {p:?}");
        let bytes = assert_stream(&mut lab, &a, &b, 2);
        eprintln!("NAT: punched path: TCP {:.2} Gbit/s", bytes as f64 * 8.0 / 2e9);
        // For comparison, host 0 to the public host 2: a direct path (host 0's
        // link sends to the configured address).
        let e = lab.vm(2, 0).clone();
        assert_eq!(link_named(&lab, 0, "h2")["path"], "direct");
        let p = fast_ping(&lab, &a, e.ip, 100);
        assert_eq!(p.received, 100, "{p:?}");
        let bytes = assert_stream(&mut lab, &a, &e, 2);
        eprintln!("NAT: direct path: ping {p:?}; TCP {:.2} Gbit/s", bytes as f64 * 8.0 / 2e9);
        // The symmetric NAT forgets every mapping mid-transfer: host 1's next
        // datagrams leave from a new random port (`--random-fully`; the same
        // one again is a chance of 1 in 28000), which host 0's link follows.
        let before = link_named(&lab, 0, "h1")["endpoint"].clone();
        let r1 = format!("{}-r1", lab.prefix);
        let (out, _) = under_traffic_for(&mut lab, 10, 400, 4, |lab| {
            let o = lab.ns_output(&r1, &["conntrack", "-F"]).unwrap();
            assert!(o.status.success(), "conntrack -F: {o:?}");
        });
        let (_, gap) = ping_gap("NAT: conntrack flushed on the symmetric NAT", &out, 400);
        assert!(gap <= 300, "traffic stopped for {} ms after the flush", gap * 10);
        let after = link_named(&lab, 0, "h1");
        eprintln!("NAT: host 0 sent to {before}, now to {}", after["endpoint"]);
        assert_ne!(after["endpoint"], before, "host 0's link did not follow host 1's new port: {after}");
        assert_eq!(after["path"], "punched", "{after}");
        // Two symmetric NATs: through the relay.
        let (c, d) = (lab.vm(1, 0).clone(), lab.vm(3, 0).clone());
        wait_until(15.0, "hosts 1 and 3 have a session through the relay", || {
            link_named(&lab, 1, "h3")["established"] == true
                && link_named(&lab, 3, "h1")["established"] == true
        });
        for h in [1, 3] {
            let l = link_named(&lab, h, if h == 1 { "h3" } else { "h1" });
            assert_eq!(l["path"], "relayed", "host {h}: {l}");
        }
        for size in [56, 1400, 8000] {
            assert_ping(&lab, &c, d.ip, size);
            assert_ping(&lab, &d, c.ip, size);
        }
        // The relay's wire: the payload pattern of a ping never in the clear.
        let (ns2, dev2) = (lab.hosts[2].ns.clone(), lab.hosts[2].underlay_dev.clone());
        let relayed0 = json(&lab, 2, "stats")["global"]["relayed"].as_u64().unwrap();
        let (wire, _) = secret_pings_captured(&mut lab, (&ns2, &dev2, "udp"), &c, d.ip);
        assert!(wire.len() > 24 + 10 * 400, "the relay's capture holds {} bytes", wire.len());
        assert!(!wire.windows(12).any(|w| w == b"vnetsecret!!"), "the relay sees the payload");
        let relayed = json(&lab, 2, "stats")["global"]["relayed"].as_u64().unwrap() - relayed0;
        assert!(relayed >= 10, "the relay passed on {relayed} datagrams for 5 pings");
        let p = fast_ping(&lab, &c, d.ip, 100);
        assert_eq!(p.received, 100, "{p:?}");
        eprintln!("NAT: relayed path: ping {p:?}");
        let bytes = assert_stream(&mut lab, &c, &d, 2);
        eprintln!("NAT: relayed path: TCP {:.2} Gbit/s", bytes as f64 * 8.0 / 2e9);
    }
}

/// On the user pass only, one test at a time (each says why).
mod user_alone {
    use super::*;

    // Alone: it compares a handshake's time under a flood of 2000 junk
    // datagrams a second with its time without (a CI run three tests at a
    // time, beside builds, saw 1.1 s against 52 ms: the flood's own Python
    // and vnetd shared two loaded cores).
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_restarted_peer_at_a_new_address_links_as_fast_under_2000_junk_datagrams_a_second() {
        // Issue 44, finding 1: junk initiations from strangers spent the budget
        // of initiations from unknown addresses before their first MAC was
        // checked, so a peer that came back from a new address (a static
        // config: its initiation is the only news of it) could not handshake.
        // At the issue's 200 a second the budget (50 a second) is spent for
        // part of each second only, and the peer's retries got through within
        // the second; at 2000 a second, with the budget spent before the first
        // MAC (the old order), it took 16.4 s against 1.08 s without the flood.
        let (mut lab, _, _) = roaming_lab();
        let quiet = restart_at(&mut lab, "10.77.0.2", "10.77.0.12");
        let script = lab.dir.join("strangers.py");
        std::fs::write(&script, STRANGERS).unwrap();
        let ns1 = lab.hosts[1].ns.clone();
        let ip0 = lab.hosts[0].underlay_ip.to_string();
        lab.spawn(&ns1, &["python3", script.to_str().unwrap(), &ip0, "60", "2000"]).unwrap();
        std::thread::sleep(Duration::from_secs(2));
        let g = |lab: &Lab| json(lab, 0, "stats")["global"].clone();
        let before = g(&lab);
        let flooded = restart_at(&mut lab, "10.77.0.12", "10.77.0.13");
        let after = g(&lab);
        let l = link_json(&lab, 0);
        let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or(0);
        eprintln!(
            "restart at a new address: {quiet:?} quiet, {flooded:?} under 2000 junk datagrams a second; \
         meanwhile stranger initiations with a bad MAC {}, limited {}",
            n(&after, "stranger_initiations_bad_mac") - n(&before, "stranger_initiations_bad_mac"),
            n(&after, "stranger_initiations_limited") - n(&before, "stranger_initiations_limited"),
        );
        assert_eq!(l["endpoint"], "10.77.0.13:9000", "{l}");
        assert!(
            n(&after, "stranger_initiations_bad_mac") > n(&before, "stranger_initiations_bad_mac"),
            "{after}"
        );
        // Issue 45: `show links` as text says the security, cipher and path too.
        let text = lab.control(0, "show links").unwrap().body;
        let header = text.lines().next().unwrap_or_default().to_string();
        assert!(
            header.contains("security") && header.contains("cipher") && header.contains("path"),
            "{text}"
        );
        let row = text.lines().find(|r| r.contains(" h1 ")).unwrap_or_default();
        let cipher = l["cipher"].as_str().unwrap().to_string();
        assert!(
            row.contains("encrypt") && row.contains(&cipher) && row.contains(l["path"].as_str().unwrap()),
            "{text}"
        );
        // As fast as without the flood, give or take the noise of a restart.
        assert!(
            flooded <= quiet * 2 + Duration::from_millis(500),
            "{flooded:?} under the flood against {quiet:?} without"
        );
    }
}
