//! Link kinds: Palacios' raw format, VXLAN with kernel VTEPs, TCP and TLS streams, a LAN through a `direct` link, GRO merging on one-frame-per-datagram links, a secured link rekeying under a stream.

use super::harness::*;

/// The VM MTU that fits both a `vnet` link on the kernel path (62 bytes of
/// encapsulation) and a VXLAN link (50) over a 1500-byte underlay.
const MIXED_VM_MTU: u32 = 1500 - vnet_wire::vnet::IPV4_ENCAP_OVERHEAD as u32;

/// Host 0's vnetd (a `vxlan` link) and host 1, a Linux kernel VTEP, over an
/// IPv4 or (`v6`) IPv6 underlay: pings and streams both ways. On the wire,
/// what vnetd sends is what a Linux VTEP sends: port 4789, a source port in
/// 49152-65535, VNI 42, a zero UDP checksum over IPv4.
fn vtep_talks_both_ways(v6: bool) {
    let mtu = if v6 { V6_VM_MTU } else { MIXED_VM_MTU };
    let mut lab = lab(Spec { vteps: vec![1], vm_mtu: mtu, ipv6_underlay: v6, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    assert_ping(&lab, &b, a.ip, 56);
    let (ns, me) = (lab.hosts[0].ns.clone(), lab.hosts[0].underlay_ip.to_string());
    let filter = format!("udp and dst port 4789 and src host {me}");
    let wire = tcpdump_during(&ns, &["-vv", "-c", "3", "-i", "u0", &filter], 5, || {
        lab.ping(&a, b.ip, 3, 56).unwrap();
    });
    let from = format!("{me}.");
    let sports: Vec<u32> =
        wire.lines().filter_map(|l| l.split(from.as_str()).nth(1)?.split(' ').next()?.parse().ok()).collect();
    assert!(
        !sports.is_empty() && sports.iter().all(|p| (49152..=65535).contains(p)),
        "source ports {sports:?}:\n{wire}"
    );
    assert!(wire.contains("VXLAN") && wire.contains("vni 42"), "{wire}");
    assert!(v6 || wire.contains("no cksum"), "{wire}");
    // Full-size frames both ways: they fit the VXLAN link unfragmented.
    assert_ping(&lab, &a, b.ip, mtu - 28);
    assert_ping(&lab, &b, a.ip, mtu - 28);
    for (from, to) in [(&a, &b), (&b, &a)] {
        assert_stream(&mut lab, from, to, 3);
    }
    let l = &json(&lab, 0, "links")["links"][0];
    assert_eq!((l["kind"].as_str(), l["network"].as_u64()), (Some("vxlan"), Some(42)), "{l}");
    assert_eq!(l["remote"], std::net::SocketAddr::new(lab.hosts[1].underlay_ip, 4789).to_string(), "{l}");
    // Bytes, not datagrams: a batch UDP GRO merged counts once.
    assert!(
        l["rx_bytes"].as_u64().unwrap() > 1_000_000 && l["tx_bytes"].as_u64().unwrap() > 1_000_000,
        "{l}"
    );
    assert_eq!(l["too_big"], 0, "{l}");
    assert_kernel_carried(&lab, 0);
    let g = json(&lab, 0, "stats")["global"].clone();
    assert_eq!((g["malformed"].as_u64(), g["unknown_source"].as_u64()), (Some(0), Some(0)), "{g}");
}

/// Pings the broadcast address from `from` (`count` requests) and returns
/// the replies per responder and sequence number, failing on a `DUP!`.
fn broadcast_replies(lab: &Lab, from: &Vm, count: u32) -> std::collections::BTreeMap<(String, u32), u32> {
    let c = count.to_string();
    let out = lab
        .ns_output(&from.ns, &["ping", "-n", "-b", "-c", &c, "-i", "0.3", "-W", "1", "10.88.255.255"])
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(!text.contains("DUP!"), "a broadcast from {} arrived twice somewhere:\n{text}", from.ip);
    let mut seen = std::collections::BTreeMap::new();
    for l in text.lines().filter(|l| l.contains("bytes from")) {
        let ip = l.split("from ").nth(1).and_then(|r| r.split(':').next()).unwrap_or("").to_string();
        let seq = l.split("icmp_seq=").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok());
        *seen.entry((ip, seq.unwrap_or(0))).or_insert(0) += 1;
    }
    seen
}

/// Pings every 100 ms until a reply; returns how long that took.
fn time_to_first_reply(lab: &Lab, from: &Vm, to: Ipv4Addr, limit: Duration) -> Option<Duration> {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < limit {
        let out = lab.ns_output(&from.ns, &["ping", "-n", "-c", "1", "-W", "0.1", &to.to_string()]).unwrap();
        if out.status.success() {
            return Some(t0.elapsed());
        }
    }
    None
}

/// Sends `mb` MiB of pseudo-random bytes over TCP from `from` to `to` (port
/// 7001) with Python on both ends; returns the two md5 sums.
fn tcp_md5(lab: &Lab, from: &Vm, to: &Vm, mb: u32) -> (String, String) {
    tcp_md5_ns(lab, &from.ns, &to.ns, &to.ip.to_string(), mb)
}

/// On both passes (every vnetd interface on the user path, then on the kernel path), two tests at a time.
mod both {
    use super::*;

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn palacios_configured_host_reaches_superset_host() {
        let lab = lab(Spec { format: Format::Raw, palacios_hosts: vec![0], ..Spec::default() });
        let cfg = std::fs::read_to_string(&lab.hosts[0].config).unwrap();
        assert!(
            cfg.contains("\nadd 10.77.0.2 9000 udp\n")
                && !cfg.contains("\nroute ")
                && !cfg.contains("\nlink "),
            "{cfg}"
        );
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        assert_ping(&lab, &b, a.ip, 1400);
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn vnetd_and_a_linux_kernel_vtep_talk_both_ways() {
        // Host 0 runs vnetd with a `vxlan` link; host 1 is a Linux bridge with a
        // kernel vxlan device (VNI 42, port 4789, nolearning, static FDB).
        vtep_talks_both_ways(false);
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn broadcasts_among_two_vnetds_and_a_kernel_vtep_reach_each_other_host_exactly_once() {
        // Hosts 0 and 1 run vnetd (a `vnet` link between them, `vxlan` links to
        // host 2); host 2 is a Linux kernel VTEP with head-end replication.
        let lab = lab(Spec { hosts: 3, vteps: vec![2], vm_mtu: MIXED_VM_MTU, ..Spec::default() });
        let vms: Vec<Vm> = (0..3).map(|h| lab.vm(h, 0).clone()).collect();
        // ARP first (unicast ping), so every broadcast below is answered.
        for (i, a) in vms.iter().enumerate() {
            for b in vms.iter().skip(i + 1) {
                assert_ping(&lab, a, b.ip, 56);
            }
        }
        for from in &vms {
            // ping may exit before the last request's replies are all in: five
            // requests, the first four checked.
            let seen = broadcast_replies(&lab, from, 5);
            for to in vms.iter().filter(|v| v.ip != from.ip) {
                for seq in 1..=4 {
                    let n = seen.get(&(to.ip.to_string(), seq)).copied().unwrap_or(0);
                    assert_eq!(
                        n, 1,
                        "broadcast {seq} from {} answered {n} times by {}: {seen:?}",
                        from.ip, to.ip
                    );
                }
            }
        }
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn two_vnetds_over_a_vxlan_link_carry_tcp() {
        let mut lab = lab(Spec { links: Links::Vxlan, vm_mtu: MIXED_VM_MTU, ..Spec::default() });
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, MIXED_VM_MTU - 28);
        assert_stream(&mut lab, &a, &b, 3);
        let l = &json(&lab, 1, "links")["links"][0];
        assert_eq!(l["kind"], "vxlan", "{l}");
        // Bytes, not datagrams: the receive side counts each batch UDP GRO
        // merged as one (795 for 45 MB in a loaded CI run).
        assert!(l["rx_bytes"].as_u64().unwrap() > 1_000_000, "{l}");
        assert_kernel_carried(&lab, 1);
    }

    /// Issue 31: the VXLAN-over-IPv6 wire format interoperates with a Linux
    /// VTEP (host 1: a bridge and a kernel vxlan device with `local` an IPv6
    /// address), both ways, on either path.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn vnetd_and_a_linux_kernel_vtep_talk_both_ways_over_ipv6() {
        vtep_talks_both_ways(true);
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn an_overlay_vm_reaches_a_plain_lan_machine_through_a_direct_link() {
        // Host 0's "physical LAN" is a bridge with a plain machine on it (no
        // vnetd); host 0 reaches it with `link lan direct dl0`. The VM behind
        // host 1 talks to it across the overlay.
        let lab = lab(Spec { lan_host: Some(0), ..Spec::default() });
        let m = lab.lan.clone().unwrap();
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &b, m.ip, 56);
        assert_ping(&lab, &m, b.ip, 56);
        assert_ping(&lab, &a, m.ip, 1400);
        for (from, to) in [(&b, &m), (&m, &b)] {
            let (sent, got) = tcp_md5(&lab, from, to, 8);
            assert!(!sent.is_empty() && sent == got, "{} -> {}: md5 {sent:?} vs {got:?}", from.ip, to.ip);
        }
        let links = json(&lab, 0, "links");
        let lan = links["links"].as_array().unwrap().iter().find(|l| l["kind"] == "direct").unwrap().clone();
        // Both transfers crossed the direct link (as TCP super-frames: offloads pass).
        let mib = 8 << 20;
        assert!(lan["rx_bytes"].as_u64().unwrap() > mib && lan["tx_bytes"].as_u64().unwrap() > mib, "{lan}");
        assert_eq!(lan["remote"], "dl0", "{lan}");
    }
}

/// On the user pass only: their traffic never takes the kernel path (secured, TCP and TLS links), they are about the user path itself, or they test no data path.
mod user {
    use super::*;

    /// A secured link rekeying every 10 s under a minute of iperf3 (a
    /// test of secured links, as security.rs's are: here so that the user
    /// pass, whose tests libtest runs in name order, starts this
    /// minute-long one early; from `security::`, it ran its last 30 s
    /// alone at the end of the pass).
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn rekeying_every_ten_seconds_under_a_minute_of_iperf3_stalls_nothing() {
        let spec = Spec {
            links: Links::Encrypt,
            vnetd_args: vec!["--rekey-after".into(), "10".into()],
            ..Spec::default()
        };
        let mut lab = lab(spec);
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        let sessions = |lab: &Lab, h: usize| json(lab, h, "links")["links"][0]["sessions"].as_u64().unwrap();
        let before = sessions(&lab, 0) + sessions(&lab, 1);
        let counts = |lab: &Lab| -> Vec<u64> {
            (0..2)
                .flat_map(|h| {
                    let l = json(lab, h, "links")["links"][0].clone();
                    [l["auth_failures"].as_u64().unwrap(), l["no_session"].as_u64().unwrap()]
                })
                .collect()
        };
        let lost_before = counts(&lab);
        // Pings every 50 ms beside the transfer: a stall shows as a lost or late reply.
        let out = lab.dir.join("ping.txt");
        let cmd = format!("ping -n -q -i 0.05 -w 58 {} > {}", b.ip, out.display());
        lab.spawn(&a.ns, &["sh", "-c", &cmd]).unwrap();
        let (gbps, text) = lab.iperf3(&a, &b, 60, &["-i", "1"]).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let rates: Vec<f64> = v["intervals"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["sum"]["bits_per_second"].as_f64().unwrap_or(0.0))
            .collect();
        let mut sorted = rates.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        // The ping (58 s) ends before the transfer (60 s): its summary.
        let summary = || std::fs::read_to_string(&out).unwrap_or_default();
        wait_until(10.0, "the ping's summary", || summary().contains("packets transmitted"));
        let p = vnet_lab::PingResult::parse(&summary());
        let new_sessions = sessions(&lab, 0) + sessions(&lab, 1) - before;
        eprintln!(
            "rekey: {gbps:.2} Gbit/s over 60 s, slowest second {:.2} Gbit/s (median {:.2}), {new_sessions} new \
         sessions, ping {}/{} replies, avg {:.2} ms",
            sorted[0] / 1e9,
            median / 1e9,
            p.received,
            p.sent,
            p.avg_ms
        );
        assert!(rates.len() >= 59, "{} intervals", rates.len());
        // Every second carried data (how much depends on what else runs: the
        // figures are reported, the rate is the bench's).
        assert!(sorted[0] > 0.0, "a second of the transfer carried nothing: {rates:?}");
        assert!(new_sessions >= 5, "{new_sessions} rekeys in 60 s");
        assert!(p.sent >= 800 && p.received * 100 >= p.sent * 99, "{p:?}");
        // Nothing refused or dropped for want of a session across the rekeys
        // (auth_failures and no_session of both hosts).
        assert_eq!(counts(&lab), lost_before);
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn an_encrypted_links_65000_byte_frames_reach_the_vm_from_the_receive_buffers_not_reassembled() {
        let mut lab = lab(Spec { datapath: user(), vm_mtu: 65000, links: Links::Encrypt, ..Spec::default() });
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        lab.spawn(&b.ns, &["iperf3", "-s", "-1", "-B", &b.ip.to_string()]).unwrap();
        lab.wait_listening(&b.ns, 5201).unwrap();
        // 128 MiB, not 2 s: a count of frames that a neighbour slowing the
        // transfer cannot shrink (about 2060 frames of 65000 bytes).
        let out = lab.ns_output(&a.ns, &["iperf3", "-c", &b.ip.to_string(), "-n", "128M"]).unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        // Each 65014-byte frame is 46 sealed datagrams, two GSO sends and two
        // GRO batches: taken together from one `recvmmsg` (or one more read
        // after it), opened in place and written to the VM from both; at least
        // half of them so.
        let g = json(&lab, 1, "stats")["global"].clone();
        let (pairs, reasm) = (g["rx_whole_pairs"].as_u64().unwrap(), g["reasm_completed"].as_u64().unwrap());
        assert!(
            pairs > 1000 && pairs > 2 * reasm,
            "{pairs} frames whole from two batches, {reasm} reassembled"
        );
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn tcp_link_carries_iperf3_and_resumes_after_a_peer_is_killed() {
        let (mut lab, a, b) = stream_lab(Links::Tcp);
        let l = link_json(&lab, 0);
        assert_eq!(
            (l["kind"].as_str(), l["state"].as_str(), l["inbound"].as_bool()),
            (Some("tcp"), Some("up"), Some(true)),
            "{l}"
        );
        // kill -9 and a restart: no operator action, traffic within 3 s.
        lab.kill_vnetd(1).unwrap();
        lab.start_vnetd(1).unwrap();
        let took = time_to_first_reply(&lab, &a, b.ip, Duration::from_secs(10));
        assert!(
            took.is_some_and(|t| t < Duration::from_secs(3)),
            "traffic resumed after {took:?}\n{}",
            lab.log(0)
        );
        assert_ping(&lab, &b, a.ip, 56);
        let l = link_json(&lab, 0);
        assert!(l["reconnects"].as_u64().unwrap() >= 1, "{l}");
        assert_eq!(l["state"], "up", "{l}");
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn tls_link_carries_traffic_and_refuses_a_certificate_of_another_ca() {
        let (mut lab, a, b) = stream_lab(Links::Tls);
        let l = link_json(&lab, 0);
        assert_eq!(
            (l["format"].as_str(), l["state"].as_str(), l["refused"].as_u64()),
            (Some("tls"), Some("up"), Some(0)),
            "{l}"
        );
        // Host 1 comes back with a certificate (and CA) from another CA.
        lab.stop_vnetd(1).unwrap();
        let stranger = vnet_lab::pki::Ca::new("stranger CA").unwrap();
        stranger.host(&lab.dir, "h1", lab.hosts[1].underlay_ip).unwrap();
        lab.start_vnetd(1).unwrap();
        let rx_before = link_json(&lab, 0)["rx_packets"].as_u64().unwrap();
        assert!(
            time_to_first_reply(&lab, &b, a.ip, Duration::from_secs(4)).is_none(),
            "a stranger's frames got through"
        );
        let l = link_json(&lab, 0);
        assert!(l["refused"].as_u64().unwrap() > 0, "host 0 refused nothing: {l}");
        assert_eq!(
            l["rx_packets"].as_u64().unwrap(),
            rx_before,
            "frames from the stranger were delivered: {l}"
        );
        assert_ne!(l["state"], "up", "host 0's link to the stranger is up: {l}");
    }

    /// Renewal (issue 30): both hosts' certificate files are replaced by ones
    /// of a new CA and `reload`ed: the established link stays (no reconnect,
    /// traffic flows); host 1 restarted with the new files is accepted by host
    /// 0 and accepts it (so host 0 serves and trusts the renewed files). An
    /// expired certificate is then refused by `reload`, with the date, and the
    /// link keeps its certificate.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn tls_certificates_renewed_on_reload_keep_the_link_and_an_expired_one_is_refused() {
        let (mut lab, a, b) = stream_lab(Links::Tls);
        let before = link_json(&lab, 0);
        let renewed = vnet_lab::pki::Ca::new("renewed CA").unwrap();
        for h in 0..2 {
            renewed.host(&lab.dir, &format!("h{h}"), lab.hosts[h].underlay_ip).unwrap();
            let out = lab.vnetctl(h, &["reload"]).unwrap();
            let said = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(out.status.success(), "host {h}: {said} {}", String::from_utf8_lossy(&out.stderr));
            assert!(said.contains("the links' TLS certificate renewed"), "host {h}: {said}");
        }
        assert_ping(&lab, &a, b.ip, 56);
        let after = link_json(&lab, 0);
        assert_eq!(after["reconnects"], before["reconnects"], "the link was dropped: {before} -> {after}");
        assert_eq!(after["state"], "up", "{after}");
        // A new handshake: host 1 starts again from the renewed files.
        lab.stop_vnetd(1).unwrap();
        lab.start_vnetd(1).unwrap();
        assert!(
            time_to_first_reply(&lab, &b, a.ip, Duration::from_secs(10)).is_some(),
            "host 0 did not take host 1's renewed certificate (or serve its own)\n{}",
            lab.log(0)
        );
        // An expired certificate is refused; the running one stays.
        let cert = lab.dir.join("h0.pem");
        let expired = renewed.expired_host_pem(lab.hosts[0].underlay_ip, &lab.dir.join("h0.key")).unwrap();
        std::fs::write(&cert, expired).unwrap();
        let out = lab.vnetctl(0, &["reload"]).unwrap();
        let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "an expired certificate was taken: {said}");
        assert!(said.contains("the certificate expired at 2020-01-02T00:00:00Z"), "{said}");
        assert_ping(&lab, &a, b.ip, 56);
        assert_eq!(link_json(&lab, 0)["state"], "up");
    }

    /// Issue 32: a `raw` or VXLAN link carries one frame per datagram; the
    /// receiving vnetd merges a GRO batch's consecutive TCP segments into TCP
    /// GSO frames for the VM's TAP (`vnet_wire::gro`) instead of writing each.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn raw_and_vxlan_links_hand_the_vm_tcp_segments_merged_into_gso_frames() {
        // The user path's merging: on it whatever the pass (user_only).
        for (links, format) in [(Links::Udp, Format::Raw), (Links::Vxlan, Format::Vnet)] {
            let mut lab =
                lab(Spec { links, format, vm_mtu: MIXED_VM_MTU, datapath: user(), ..Spec::default() });
            let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
            assert_ping(&lab, &a, b.ip, MIXED_VM_MTU - 28);
            let bytes = assert_stream(&mut lab, &a, &b, 2);
            assert_stream(&mut lab, &b, &a, 1);
            let l = link_json(&lab, 1);
            assert_ne!(l["datapath"], "kernel", "{l}");
            let g = &json(&lab, 1, "stats")["global"];
            let (frames, segs) =
                (g["rx_gro_frames"].as_u64().unwrap(), g["rx_gro_segments"].as_u64().unwrap());
            // Most of the stream's bytes came as merged frames of several segments.
            let mss = u64::from(MIXED_VM_MTU - 40);
            assert!(frames > 0 && segs >= 4 * frames, "{links:?}: {frames} frames of {segs} segments: {g}");
            assert!(segs * mss > bytes / 2, "{links:?}: {segs} segments merged of {bytes} bytes: {g}");
            eprintln!("{links:?}: {bytes} bytes, {frames} GSO frames of {segs} segments");
        }
    }
}
