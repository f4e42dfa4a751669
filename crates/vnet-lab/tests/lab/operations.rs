//! Running vnetd: restarts, hand-overs, saved and reloaded configuration, transactions, route churn, interfaces deleted under it, relocation, the soak.

use super::harness::*;

/// Least-squares slope of `ys` over `xs`.
fn slope(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let sxy: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

/// How long after a move or an underlay outage ends the soak still excuses
/// a lost ping. Seen: the last loss of an outage or a move is mostly
/// before its end (the path is back at once); once in a CI run (2026-11-25,
/// with a build beside it) pings went on being lost 0.9 s after an outage:
/// the kernel resolves the peer's address again when the underlay comes
/// back, and an ARP request lost as the link comes up is sent again only
/// after `retrans_time_ms` (1 s). One retransmission is excused, no more.
const SOAK_RECOVERY_S: f64 = 1.2;

/// Host `h`'s interface `name` as `show interfaces json` has it.
fn iface_json(lab: &Lab, h: usize, name: &str) -> serde_json::Value {
    let all = json(lab, h, "interfaces")["interfaces"].as_array().cloned().unwrap_or_default();
    all.into_iter().find(|i| i["name"] == name).unwrap_or_default()
}

/// On both passes (every vnetd interface on the user path, then on the kernel path), two tests at a time.
mod both {
    use super::*;

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn restarting_one_vnetd_restores_traffic() {
        let mut lab = lab(Spec::default());
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        lab.stop_vnetd(1).unwrap();
        assert_no_ping(&lab, &a, b.ip);
        lab.start_vnetd(1).unwrap();
        assert_ping(&lab, &a, b.ip, 56);
        assert_ping(&lab, &b, a.ip, 56);
        assert!(lab.vnetd_alive(0), "host 0's vnetd was not touched");
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn bad_config_is_rejected_with_position_and_traffic_keeps_flowing() {
        let mut lab = lab(Spec::default());
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        // A transaction whose third line is bad changes nothing.
        let file = lab.dir.join("change.conf");
        std::fs::write(&file, "[routes]\ndel 1\nroute any any -> link nowhere\n").unwrap();
        let out = lab.vnetctl(0, &["apply", file.to_str().unwrap()]).unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1));
        assert!(err.contains("change.conf:3:23: expected a declared link"), "{err}");
        assert_ping(&lab, &a, b.ip, 56);
        // A bad command line too.
        let out = lab.vnetctl(0, &["route", "any", "52:54:00:zz:00:01", "->", "link", "h1"]).unwrap();
        assert!(String::from_utf8_lossy(&out.stderr).contains("1:11: expected a destination MAC"));
        // A config that fails to load at start names file, line and column, and vnetd exits 2.
        let bad = lab.dir.join("bad.conf");
        std::fs::write(&bad, "# comment\nlink x udp 10.77.0.2 format gre\n").unwrap();
        let st = std::process::Command::new(vnet_lab::bin("vnetd").unwrap())
            .args(["--config", bad.to_str().unwrap(), "--control", "unix:/nonexistent/x.sock"])
            .output()
            .unwrap();
        assert_eq!(st.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&st.stderr).contains("bad.conf:2:29: expected a format"), "{st:?}");
        // A plain TCP control endpoint off loopback, or a TLS one without its
        // certificates, does not start (exit 2 before anything is bound).
        for ep in ["tcp:0.0.0.0:7999", "tls:127.0.0.1:7999"] {
            let st = std::process::Command::new(vnet_lab::bin("vnetd").unwrap())
                .args(["--control", ep])
                .output()
                .unwrap();
            assert_eq!(st.status.code(), Some(2), "{ep}: {st:?}");
            let e = String::from_utf8_lossy(&st.stderr);
            assert!(e.contains("refusing a control endpoint") || e.contains("--control-tls"), "{ep}: {e}");
        }
        // A valid change still works afterwards, and the daemon never died.
        std::fs::write(&file, "route any 52:54:00:99:99:99 -> link h1\n").unwrap();
        assert!(lab.vnetctl(0, &["apply", file.to_str().unwrap()]).unwrap().status.success());
        assert!(lab.vnetd_alive(0));
        assert_ping(&lab, &a, b.ip, 56);
        std::thread::sleep(Duration::from_millis(10));
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_vnetd_killed_and_restarted_under_traffic_resumes_within_two_seconds_and_the_stream_survives() {
        let mut lab = lab(Spec::default());
        let mut down = Duration::ZERO;
        let (out, _) = under_traffic(&mut lab, 10, 600, |lab| {
            let t0 = std::time::Instant::now();
            lab.kill_vnetd(0).unwrap();
            // Nothing of the dead process forwards: its TC programs went with
            // its bpf links (TCX, owned by its file descriptors).
            std::thread::sleep(Duration::from_millis(300));
            lab.start_vnetd(0).unwrap();
            down = t0.elapsed();
        });
        let r = vnet_lab::PingResult::parse(&out);
        assert_eq!(r.sent, 600, "ping output not understood:\n{out}");
        let gap = longest_gap(&out, r.sent);
        eprintln!(
            "kill -9: vnetd down {down:?} (300 ms dead, then its start); {} of 600 pings lost, longest gap {gap} (~{} ms)",
            r.sent - r.received,
            gap * 10
        );
        // A TAP with no reader holds the VM's frames in its queue (they go out,
        // late, after the restart); a veth's frames with no program on it are
        // lost, so on the kernel path a stale program shows as no gap.
        if lab.spec.datapath.as_deref() == Some("kernel") {
            assert!(
                gap >= 20,
                "pings went on while vnetd was dead ({gap} lost in a row): something stale forwarded"
            );
        }
        // About twice what the test command measured (three tests at a
        // time, 2026-12-07: 120-130 ms on the user path, whose TAP queues
        // the VM's frames meanwhile; 310-320 ms on the kernel path, 420 on a
        // busier machine); the bound was 2000 ms. A restart 1 s slower
        // (the dead time 1300 ms) fails it on the kernel path (990 ms).
        assert!(gap * 10 < 700, "traffic resumed {} ms after the kill", gap * 10);
        // The restarted vnetd adopted the VM's persistent TAP (or its veth) as
        // it was: same device, same index, the VM's address still on it.
        let a = lab.vm(0, 0).clone();
        let addr = lab.ns_exec(&a.ns, &["ip", "-o", "addr", "show", "dev", &a.dev]).unwrap();
        let addr = String::from_utf8_lossy(&addr.stdout).to_string();
        assert!(addr.contains(&format!("{}/", a.ip)), "the VM's address is gone: {addr}");
        assert_eq!(json(&lab, 0, "interfaces")["interfaces"][0]["device"], "present");
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_moved_vm_stays_moved_across_a_restart_of_either_host_static_mode() {
        a_moved_vm_stays_moved_across_restarts(false);
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_tap_or_netdev_deleted_under_vnetd_is_reattached_when_it_is_back() {
        // Host 0's VM on a TAP vnetd made, host 1's on a veth (a netdev).
        let lab = lab(Spec { veth_hosts: vec![1], ..Spec::default() });
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        let vm_side = |vm: &vnet_lab::Vm| {
            let cidr = format!("{}/16", vm.ip);
            lab.ns_exec(&vm.ns, &["ip", "link", "set", &vm.dev, "address", &vm.mac, "up"]).unwrap();
            lab.ns_exec(&vm.ns, &["ip", "addr", "replace", &cidr, "dev", &vm.dev]).unwrap();
        };
        // The TAP deleted (from the VM's side): vnetd makes it again within a
        // second or two; the VM configures its address again and talks.
        // (On the kernel-path lab a VM's TAP is a netdev, which vnetd does not
        // make: that part is the veth's below.)
        let t0 = std::time::Instant::now();
        let tap = iface_json(&lab, 0, "vm0")["kind"] == "tap";
        if tap {
            lab.ns_exec(&a.ns, &["ip", "link", "del", &a.dev]).unwrap();
            wait_until(3.0, "the TAP made again", || iface_json(&lab, 0, "vm0")["reattached"] == 1);
            vm_side(&a);
            assert_ping(&lab, &a, b.ip, 56);
        }
        let tap_back = t0.elapsed();
        // The veth deleted: gone, and stays so (vnetd does not spin on it)
        // until a device of that name is back; then reattached.
        let pid1 = lab.vnetd_pid(1).unwrap();
        lab.ns_exec(&b.ns, &["ip", "link", "del", &b.dev]).unwrap();
        wait_until(3.0, "the netdev gone", || iface_json(&lab, 1, "vm0")["device"] == "gone");
        let cpu = cpu_s(pid1);
        std::thread::sleep(Duration::from_secs(3));
        let spent = cpu_s(pid1) - cpu;
        assert_eq!(iface_json(&lab, 1, "vm0")["device"], "gone");
        let hd = b.host_dev.clone().unwrap();
        let host_ns = lab.hosts[1].ns.clone();
        vnet_lab::run(&[
            "ip", "link", "add", &hd, "netns", &host_ns, "type", "veth", "peer", "name", &b.dev, "netns",
            &b.ns,
        ])
        .unwrap();
        lab.ns_exec(&host_ns, &["ip", "link", "set", &hd, "up"]).unwrap();
        vm_side(&b);
        let t1 = std::time::Instant::now();
        wait_until(3.0, "the netdev reattached", || iface_json(&lab, 1, "vm0")["reattached"] == 1);
        let veth_back = t1.elapsed();
        assert_ping(&lab, &a, b.ip, 56);
        assert_ping(&lab, &b, a.ip, 1400);
        let (l0, l1) = (lab.log(0), lab.log(1));
        eprintln!(
            "TAP deleted: made again after {tap_back:?}; veth deleted: vnetd used {spent:.2} CPU s in 3 s while it was \
         gone, reattached {veth_back:?} after it was back"
        );
        assert!(spent < 0.3, "vnetd spun on a gone device: {spent} CPU s in 3 s");
        for log in if tap { vec![&l0, &l1] } else { vec![&l1] } {
            assert_eq!(log.matches("device gone").count(), 1, "{log}");
            assert_eq!(log.matches("device back").count(), 1, "{log}");
        }
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_transaction_that_fails_at_commit_or_is_aborted_changes_nothing_and_traffic_keeps_flowing() {
        use std::io::{BufRead, BufReader, Write};
        let lab = lab(Spec::default());
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        // The routes as declared (their counters move with the pings).
        let routes = |lab: &Lab| -> Vec<String> {
            let v = json(lab, 0, "routes");
            let rs = v["routes"].as_array().cloned().unwrap_or_default();
            rs.iter()
                .map(|r| format!("{} {} {} {} {}", r["id"], r["src"], r["dst"], r["to"], r["from"]))
                .collect()
        };
        let before = (routes(&lab), json(&lab, 0, "interfaces")["interfaces"].as_array().unwrap().len());
        // One connection, the protocol by hand: each line answered, `commit`
        // answered with the whole transaction's outcome.
        let sock = lab.hosts[0].control.clone();
        let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        let mut r = BufReader::new(c.try_clone().unwrap());
        let mut say = |line: &str| -> String {
            writeln!(c, "{line}").unwrap();
            let mut out = String::new();
            loop {
                let mut l = String::new();
                if r.read_line(&mut l).unwrap() == 0 {
                    break;
                }
                let end = l.starts_with("end ");
                out.push_str(&l);
                if end {
                    break;
                }
            }
            out
        };
        // Accepted line by line, refused at commit: a device that will not
        // open (a netdev that does not exist), a TAP asked onto the kernel path.
        for bad in ["interface x netdev nosuchdev0", "interface y tap vtx0 datapath kernel"] {
            assert!(say("begin").contains("end ok"));
            assert!(say("route any 52:54:00:bb:00:01 -> link h1").contains("end ok"));
            assert!(say(bad).contains("end ok"), "{bad} refused before commit");
            let out = say("commit");
            eprintln!("commit with `{bad}`: {}", out.trim());
            // The position is the transaction's line 2 (the lines after `begin`).
            assert!(out.starts_with("end error 2:1: "), "{bad}: {out}");
            assert_eq!(routes(&lab), before.0, "{bad}: a route stayed");
            assert_eq!(json(&lab, 0, "interfaces")["interfaces"].as_array().unwrap().len(), before.1);
            // Nor a device: the TAP opened for the refused interface went with it.
            let links = lab.ns_exec(&lab.hosts[0].ns, &["ip", "-o", "link"]).unwrap();
            assert!(!String::from_utf8_lossy(&links.stdout).contains("vtx0"), "{bad}: its TAP was left");
            assert_ping(&lab, &a, b.ip, 56);
        }
        // Aborted: nothing, and the connection goes on.
        assert!(say("begin").contains("end ok"));
        assert!(say("route any 52:54:00:bb:00:02 -> link h1").contains("end ok"));
        assert!(say("abort").contains("end ok"));
        assert_eq!(routes(&lab), before.0);
        assert!(say("show links").contains("end ok"));
    }
}

/// On both passes, one test at a time (each says why).
mod both_alone {
    use super::*;

    // Alone: no ping lost and at most 20 TCP retransmits beside 200 route
    // replacements (three tests at a time, beside the flapping test's
    // stream, the kernel pass saw 48 retransmits and no ping lost).
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn routes_replaced_two_hundred_times_under_a_tcp_stream_and_a_10ms_ping_lose_nothing() {
        let mut lab = lab(Spec::default());
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        lab.spawn(&b.ns, &["iperf3", "-s", "-1", "-B", &b.ip.to_string()]).unwrap();
        lab.wait_listening(&b.ns, 5201).unwrap();
        let (ns, ip) = (a.ns.as_str(), b.ip.to_string());
        let ping = in_background(ns, &["ping", "-n", "-i", "0.01", "-c", "700", "-W", "1", &ip]);
        let tcp = in_background(ns, &["iperf3", "-c", &ip, "-t", "9", "-b", "300M", "-J"]);
        std::thread::sleep(Duration::from_millis(500));
        // Each transaction replaces the route that carries the stream (delete
        // and add again, as one change) and adds or deletes another.
        let t0 = std::time::Instant::now();
        for n in 0..200 {
            let routes = json(&lab, 0, "routes");
            let rs = routes["routes"].as_array().unwrap();
            let id = rs.iter().find(|r| r["dst"] == b.mac.as_str()).unwrap()["id"].clone();
            let mut change = format!("delete route {id}\nroute any {} -> link h1\n", b.mac);
            match rs.iter().find(|r| r["dst"].as_str().is_some_and(|d| d.starts_with("52:54:00:cc"))) {
                Some(r) => change.push_str(&format!("delete route {}\n", r["id"])),
                None => change.push_str(&format!("route any 52:54:00:cc:00:{:02x} -> link h1\n", n % 256)),
            }
            lab.apply(0, &change).unwrap();
        }
        let took = t0.elapsed();
        let out = String::from_utf8_lossy(&ping.join().unwrap().stdout).to_string();
        let tcp = tcp.join().unwrap();
        let r = vnet_lab::PingResult::parse(&out);
        let j: serde_json::Value = serde_json::from_slice(&tcp.stdout).unwrap_or_default();
        let retransmits = j["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(u64::MAX);
        let gbps = j["end"]["sum_received"]["bits_per_second"].as_f64().unwrap_or(0.0) / 1e9;
        eprintln!(
            "200 route replacements in {took:?} under traffic: ping {}/{} (10 ms apart), TCP {gbps:.2} Gbit/s with \
         {retransmits} retransmits",
            r.received, r.sent
        );
        assert_eq!(r.sent, 700, "ping output not understood:\n{out}");
        assert_eq!(r.received, r.sent, "pings lost while routes were replaced:\n{out}");
        assert!(tcp.status.success() && j.get("error").is_none(), "the TCP stream broke: {j}");
        assert_carried(&String::from_utf8_lossy(&tcp.stdout), "the TCP stream under route changes");
        assert!(retransmits <= 20, "{retransmits} retransmits");
    }

    // Alone: every lost ping must fall within a second of a move or an
    // outage (two clean-clone runs three tests at a time, beside the
    // package's release build, lost one at 3.0 s and six at 42 s, away
    // from any event).
    /// The soak (`scripts/soak.sh MINUTES`; CI runs its 1-minute form): three
    /// hosts under mixed traffic (a ping every 100 ms, a TCP stream, a UDP
    /// stream, broadcasts) while a route is added or deleted every 100 ms, a
    /// host's underlay goes down for a second every 10 s and the ping's target
    /// VM moves to another host every 10 s. It checks: no panic and every
    /// vnetd alive; the TCP and UDP streams survive; every ping sent, and each
    /// one lost sent within [`SOAK_RECOVERY_S`] of a move or an outage; no frame
    /// malformed, failing its offload, crossing networks or from a spoofed
    /// MAC (`no_route` and `unknown_source` are what moves cost: reported);
    /// vnetd's RSS does not grow (slope after the first third, and a bound).
    /// `VNET_SOAK_SECS` (default 60) sets the length.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn soak_mixed_traffic_under_route_churn_link_flaps_and_relocations() {
        let secs: u64 = std::env::var("VNET_SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
        let mut lab = lab(Spec { hosts: 3, veth_hosts: vec![0, 1, 2], ..Spec::default() });
        let (a, b, c) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone(), lab.vm(2, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        assert_ping(&lab, &c, b.ip, 56);
        lab.spawn(&b.ns, &["iperf3", "-s", "-B", &b.ip.to_string()]).unwrap();
        lab.spawn(&b.ns, &["iperf3", "-s", "-p", "5202", "-B", &b.ip.to_string()]).unwrap();
        lab.wait_listening(&b.ns, 5201).unwrap();
        lab.wait_listening(&b.ns, 5202).unwrap();
        let script = lab.dir.join("broadcast.py");
        std::fs::write(&script, STORM).unwrap();
        let (t, bip, count) = ((secs + 2).to_string(), b.ip.to_string(), (secs * 10).to_string());
        let ping = in_background(&a.ns, &["ping", "-n", "-D", "-i", "0.1", "-c", &count, "-W", "1", &bip]);
        let tcp = in_background(&c.ns, &["iperf3", "-c", &bip, "-t", &t, "-b", "100M", "-J"]);
        let udp =
            in_background(&a.ns, &["iperf3", "-c", &bip, "-p", "5202", "-u", "-t", &t, "-b", "20M", "-J"]);
        let bcast = in_background(&c.ns, &["python3", script.to_str().unwrap(), &c.dev, &c.mac, &t, "50"]);
        let pids: Vec<u32> = (0..3).map(|h| lab.vnetd_pid(h).unwrap()).collect();
        let t0 = std::time::Instant::now();
        let (mut samples, mut churn, mut moves, mut flaps) = (Vec::new(), 0u64, 0u64, 0u64);
        let start = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        let (mut where_b, mut v) = (1usize, 0usize);
        // When each move and outage began and ended (seconds since the epoch).
        let mut events: Vec<(f64, f64)> = Vec::new();
        let epoch =
            || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        let (mut next_sample, mut next_move, mut next_flap) =
            (Duration::ZERO, Duration::from_secs(5), Duration::from_secs(10));
        while t0.elapsed() < Duration::from_secs(secs) {
            let now = t0.elapsed();
            if now >= next_sample {
                let rss: Vec<u64> = pids.iter().map(|&p| rss_kb(p)).collect();
                samples.push((now.as_secs_f64(), rss));
                next_sample += Duration::from_secs(5);
            }
            // A route for a MAC nobody has, added and deleted in turn.
            let mac = format!("52:54:00:ee:00:{:02x}", churn % 200);
            let line = if churn % 2 == 0 {
                format!("route any {mac} -> link h1\n")
            } else {
                let id = json(&lab, 0, "routes")["routes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|r| r["dst"].as_str().is_some_and(|d| d.starts_with("52:54:00:ee")))
                    .map(|r| r["id"].clone());
                id.map_or(String::new(), |id| format!("delete route {id}\n"))
            };
            if !line.is_empty() {
                lab.apply(0, &line).unwrap();
            }
            churn += 1;
            // Every 10 s: the ping's target moves; 5 s later host 0's underlay
            // goes down for a second.
            if now >= next_move {
                let to = if where_b == 1 { 2 } else { 1 };
                let began = epoch();
                v = lab.relocate(where_b, v, to).unwrap();
                events.push((began, epoch()));
                where_b = to;
                moves += 1;
                next_move += Duration::from_secs(10);
            }
            if now >= next_flap {
                let (ns, dev) = (lab.hosts[0].ns.clone(), lab.hosts[0].underlay_dev.clone());
                let began = epoch();
                lab.ns_exec(&ns, &["ip", "link", "set", &dev, "down"]).unwrap();
                std::thread::sleep(Duration::from_secs(1));
                lab.ns_exec(&ns, &["ip", "link", "set", &dev, "up"]).unwrap();
                events.push((began, epoch()));
                flaps += 1;
                next_flap += Duration::from_secs(10);
            }
            // The next route change 100 ms after this one.
            std::thread::sleep(Duration::from_millis(100).saturating_sub(t0.elapsed() - now));
        }
        let ping = String::from_utf8_lossy(&ping.join().unwrap().stdout).to_string();
        let tcp = tcp.join().unwrap();
        let udp = udp.join().unwrap();
        let sent_b: u64 = String::from_utf8_lossy(&bcast.join().unwrap().stdout).trim().parse().unwrap_or(0);
        let r = vnet_lab::PingResult::parse(&ping);
        let j: serde_json::Value = serde_json::from_slice(&tcp.stdout).unwrap_or_default();
        let ju: serde_json::Value = serde_json::from_slice(&udp.stdout).unwrap_or_default();
        let tcp_bytes = j["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
        let udp_lost = ju["end"]["sum"]["lost_percent"].as_f64().unwrap_or(100.0);
        // RSS: the slope after the first third, per host, in kB a minute.
        let from = samples.len() / 3;
        let xs: Vec<f64> = samples[from..].iter().map(|s| s.0).collect();
        // A lost ping is explained by a move or an outage when it was sent from
        // just before it began to SOAK_RECOVERY_S after it ended.
        let lost = vnet_lab::PingResult::lost_at(&ping, 0.1);
        let explained = |t: f64| events.iter().any(|&(b, e)| t >= b - 0.2 && t <= e + SOAK_RECOVERY_S);
        let unexplained: Vec<String> =
            lost.iter().filter(|&&t| !explained(t)).map(|t| format!("{:.1} s", t - start)).collect();
        let late: Vec<String> = events
            .iter()
            .map(|&(b, e)| {
                let last = lost
                    .iter()
                    .filter(|&&t| t >= b - 0.2 && t <= e + SOAK_RECOVERY_S)
                    .fold(f64::NAN, |m, &t| t.max(m));
                let n = lost.iter().filter(|&&t| t >= b - 0.2 && t <= e + SOAK_RECOVERY_S).count();
                format!("{:.1}+{:.1}: {n} lost, last {:+.2} s after", b - start, e - b, last - e)
            })
            .collect();
        let mut report = format!(
            "soak {secs} s: {churn} route changes, {moves} relocations, {flaps} underlay outages of 1 s, {sent_b} \
         broadcasts; ping {}/{}; TCP {} MB; UDP lost {udp_lost:.2} %\nlosses by event: {}\nlost outside \
         moves and outages: {unexplained:?}\n",
            r.received,
            r.sent,
            tcp_bytes / 1_000_000,
            late.join("; ")
        );
        for h in 0..3 {
            let ys: Vec<f64> = samples[from..].iter().map(|s| s.1[h] as f64).collect();
            let per_min = slope(&xs, &ys) * 60.0;
            let (first, last) = (samples[0].1[h], samples.last().unwrap().1[h]);
            let g = json(&lab, h, "stats")["global"].clone();
            report.push_str(&format!(
                "host {h}: RSS {first} -> {last} kB (slope {per_min:+.0} kB/min after {:.0} s); drops: no_route {}, \
             unknown_source {}, malformed {}, wrong_network {}, spoofed_source_mac {}, reasm_timed_out {}, \
             offload_errors {}\n",
                xs.first().copied().unwrap_or(0.0),
                g["no_route"],
                g["unknown_source"],
                g["malformed"],
                g["wrong_network"],
                g["spoofed_source_mac"],
                g["reasm_timed_out"],
                g["offload_errors"]
            ));
            assert_eq!(g["malformed"], 0, "host {h}: {g}");
            assert_eq!(g["offload_errors"], 0, "host {h}: {g}");
            assert_eq!(g["wrong_network"], 0, "host {h}: {g}");
            assert_eq!(g["spoofed_source_mac"], 0, "host {h}: {g}");
            assert!(lab.vnetd_alive(h), "host {h}'s vnetd died");
            assert!(!lab.log(h).contains("panicked"), "host {h}: {}", lab.log(h));
        }
        // A VM's interface moves its memory from host to host: the sum over
        // the hosts is what must not grow.
        let sum: Vec<f64> = samples[from..].iter().map(|s| s.1.iter().sum::<u64>() as f64).collect();
        let (first, last) = (samples[0].1.iter().sum::<u64>(), samples.last().unwrap().1.iter().sum::<u64>());
        let per_min = slope(&xs, &sum) * 60.0;
        report.push_str(&format!("all hosts: RSS {first} -> {last} kB (slope {per_min:+.0} kB/min)\n"));
        let rss_ok = last < first + 16 * 1024 && (secs < 600 || per_min < 64.0);
        eprint!("{report}");
        if let Ok(path) = std::env::var("VNET_SOAK_REPORT") {
            std::fs::write(path, &report).unwrap();
        }
        assert!(rss_ok, "vnetd grew:\n{report}");
        assert!(tcp.status.success() && j.get("error").is_none(), "the TCP stream broke: {j}");
        assert!(udp.status.success(), "the UDP stream broke: {ju}");
        assert!(moves >= secs / 10 - 1 && flaps >= secs / 10 - 1, "{report}");
        // Every ping was sent, and the only ones lost were around a move or an
        // outage.
        assert_eq!(r.sent as u64, secs * 10, "ping did not run its course: {ping}");
        assert!(unexplained.is_empty(), "pings lost away from any move or outage:\n{report}");
    }

    // Alone: a bound a neighbour could break (lost 10 ms pings, adaptive polling, a timed map update).
    /// Hitless restart (issue 30): host 0's vnetd hands over (SIGUSR2, as an
    /// upgrade does) ten times while VM A on host 0 pings VM B on host 1 every
    /// 10 ms and streams TCP to it (iperf3, 100 ms intervals). On the kernel
    /// path (VNET_LAB_DATAPATH=kernel) no ping may be lost and no interval of
    /// the stream may be empty: the pinned programs forward while no vnetd
    /// runs, and the next one replaces them in place. On the user path the
    /// loss each hand-over costs is reported (the sockets and TAPs are not
    /// handed over yet).
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn ten_hand_overs_under_a_10ms_ping_and_a_tcp_stream() {
        // Containers on veths: on the user path each is read from a receive
        // ring, which is handed over with its position (a TAP's queue is
        // handed over in the upgrade test, `scripts/upgrade-test.sh`).
        // Two link sockets a port: the group is handed over socket by socket.
        let d = Spec::default();
        let mut lab = lab(Spec {
            datapath: Some(d.datapath.clone().unwrap_or_else(|| "user".into())),
            veth_hosts: vec![0, 1],
            vnetd_args: vec!["--link-readers".into(), "2".into()],
            ..d
        });
        let m = hand_overs_under_traffic(&mut lab, 10, |_, _| {});
        // Issue 44, finding 7: the control listener goes with the other sockets.
        assert_eq!(m.refused.0, 0, "control requests failed during hand-overs: {:?}", m.refused.1);
        let readers =
            json(&lab, 0, "stats")["global"]["link_reader_messages"].as_array().map_or(0, |a| a.len());
        assert_eq!(readers, 2, "host 0's listening group after 10 hand-overs");
        let kernel = lab.spec.datapath.as_deref() == Some("kernel");
        let log = lab.log(0);
        if kernel {
            assert!(
                log.contains("took over the previous vnetd's program"),
                "no take-over in host 0's log:\n{log}"
            );
            assert_eq!(m.lost, 0, "pings lost across hand-overs on the kernel path");
            assert_eq!(m.empty, 0, "the stream stalled 100 ms or more: {:?}", m.intervals);
        } else {
            // The user path's sockets and TAP queues were handed over: what
            // arrived meanwhile waited in them. Measured: 0 lost in every run;
            // without the sockets' hand-over (a vnetd that opens its own), 4.
            // At most 2: a reply on the wire while a ring changes hands, twice.
            assert!(log.contains("sockets and devices handed to the next vnetd"), "no fd hand-over:\n{log}");
            assert!(log.contains("hand-over: took"), "the next vnetd took nothing:\n{log}");
            assert!(m.lost <= 2, "{} pings (10 ms apart) lost over 10 hand-overs", m.lost);
        }
        // After the last one: nothing of the hand-overs is left in the
        // bpffs, not a pin, not the directories the pins were made in.
        let left = std::fs::read_dir(lab.dir.join("bpf/h0/v1")).map_or(0, |d| d.count());
        assert_eq!(left, 0, "pins left after the last take-over");
        assert!(!lab.dir.join("bpf/h0").exists(), "the pins' directory left after the last take-over");
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
    }

    // Alone: a bound a neighbour could break (lost 10 ms pings, adaptive polling, a timed map update).
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn relocating_a_vm_loses_a_handful_of_pings_and_no_connection() {
        relocation(Spec { hosts: 3, veth_hosts: vec![0, 1, 2], ..Spec::default() });
    }
}

/// On the user pass only: their traffic never takes the kernel path (secured, TCP and TLS links), they are about the user path itself, or they test no data path.
mod user {
    use super::*;

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_tap_is_known_for_one_in_a_namespace_entered_without_its_sysfs() {
        // Issue 45: under `nsenter --net` (no sysfs of the namespace mounted),
        // vnetd read /sys/class/net/DEV/tun_flags of the first namespace, took
        // a TAP for a veth, and the kernel path dropped every frame to its VM.
        // The kernel's own answer (SIOCETHTOOL's driver) is the namespace's.
        let lab = lab(Spec { vms_per_host: 0, ..Spec::default() });
        let ns = lab.hosts[0].ns.clone();
        let (tap, veth) = (
            format!("{}t", lab.prefix.chars().take(8).collect::<String>()),
            format!("{}v", lab.prefix.chars().take(8).collect::<String>()),
        );
        for c in [
            vec!["ip", "tuntap", "add", "dev", tap.as_str(), "mode", "tap"],
            vec!["ip", "link", "add", veth.as_str(), "type", "veth", "peer", "name", "vpeer0"],
        ] {
            assert!(lab.ns_exec(&ns, &c).unwrap().status.success(), "{c:?}");
        }
        let path = std::path::PathBuf::from(format!("/run/netns/{ns}"));
        let (t, v, sysfs) = vnetd::sys::in_netns(&path, || {
            let sysfs = std::path::Path::new(&format!("/sys/class/net/{tap}/tun_flags")).exists();
            Ok((vnetd::sys::driver(&tap)?, vnetd::sys::driver(&veth)?, sysfs))
        })
        .unwrap();
        assert!(!sysfs, "this thread sees the namespace's sysfs: the case is not reproduced");
        assert_eq!((t.as_str(), v.as_str()), ("tun", "veth"));
        let (tap_peer, veth_peer) =
            vnetd::sys::in_netns(&path, || Ok((vnetd::kernel::is_veth(&tap), vnetd::kernel::is_veth(&veth))))
                .unwrap();
        assert_eq!((tap_peer, veth_peer), (false, true), "only a veth's frames go into its peer");
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn saved_runtime_changes_survive_a_restart_and_sighup_applies_only_the_files_difference() {
        let mut lab = lab(Spec::default());
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        let conf = lab.hosts[0].config.clone();
        let route_to_b = |lab: &Lab| {
            json(lab, 0, "routes")["routes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["dst"] == b.mac.as_str())
                .cloned()
        };
        // A runtime change, saved: the file no longer routes B, and after a restart neither does vnetd.
        let id = route_to_b(&lab).unwrap()["id"].clone();
        lab.apply(0, &format!("delete route {id}\n")).unwrap();
        let out = lab.vnetctl(0, &["save"]).unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let saved = std::fs::read_to_string(&conf).unwrap();
        assert!(!saved.lines().any(|l| l.starts_with("route") && l.contains(&b.mac)), "{saved}");
        assert!(saved.contains("interface vm0"), "{saved}");
        lab.stop_vnetd(0).unwrap();
        lab.start_vnetd(0).unwrap();
        assert!(route_to_b(&lab).is_none(), "the deleted route came back after a restart");
        assert_no_ping(&lab, &a, b.ip);
        // SIGHUP after an edit: the one line that differs is applied, the
        // interface keeps running (same id, its counters not reset).
        let before = json(&lab, 0, "interfaces")["interfaces"][0].clone();
        std::fs::write(&conf, format!("{saved}route any {} -> link h1\n", b.mac)).unwrap();
        let pid = lab.vnetd_pid(0).unwrap();
        vnet_lab::run(&["kill", "-HUP", &pid.to_string()]).unwrap();
        let took = wait_until(3.0, "SIGHUP routes B again", || route_to_b(&lab).is_some());
        eprintln!("sighup: applied {took:?} after the signal");
        assert_ping(&lab, &a, b.ip, 56);
        let after = json(&lab, 0, "interfaces")["interfaces"][0].clone();
        assert_eq!(after["id"], before["id"]);
        assert!(after["rx_packets"].as_u64() >= before["rx_packets"].as_u64(), "{before} -> {after}");
        assert!(lab.log(0).contains("lines applied as one transaction"), "{}", lab.log(0));
        // A broken file changes nothing, names its line, and vnetd lives on.
        std::fs::write(&conf, "interface vm0 tap\n").unwrap();
        let r = lab.control(0, "reload").unwrap();
        let e = r.result.expect_err("a broken file is refused");
        assert!(e.0.contains(&format!("{}:1:", conf.display())), "{e}");
        vnet_lab::run(&["kill", "-HUP", &pid.to_string()]).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert!(lab.vnetd_alive(0));
        assert!(lab.log(0).contains("SIGHUP: nothing changed"), "{}", lab.log(0));
        assert_ping(&lab, &a, b.ip, 56);
    }

    /// Issue 68: `vnet-lab bench` interrupted (SIGINT to it alone, as a
    /// CI timeout's signal comes, not to its children) while an iperf3
    /// client of its first case runs: vnet-lab exits 130, and neither that
    /// client (which spun at 100 % of a core, reparented to init, once its
    /// namespaces were gone) nor any namespace of the run is left. A few
    /// seconds of one case (native, TCP, one stream), no benchmark.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_bench_interrupted_during_its_first_case_leaves_no_process_and_no_namespace() {
        let tag = format!("bi{}", std::process::id());
        let out = std::env::temp_dir().join(format!("vnet-bench-{tag}"));
        use std::os::unix::process::CommandExt;
        let mut bench = std::process::Command::new(vnet_lab::bin("vnet-lab").unwrap())
            .args(["bench", "--cases", "native", "--conditions", "1500", "--repeats", "1", "--seconds", "60"])
            .args(["--only", "tcp1", "--mpi", "/nonexistent"])
            .arg("--out")
            .arg(&out)
            .env("VNET_LAB_TAG", &tag)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = bench.id();
        // Its iperf3 client: a child of vnet-lab (`ip netns exec` execs it).
        let clients = || {
            let mut found = Vec::new();
            for e in std::fs::read_dir("/proc").unwrap().flatten() {
                let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
                let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                let ppid =
                    stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(1)?.parse::<u32>().ok());
                let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                if ppid == Some(pid) && cmd.starts_with(b"iperf3\0-c\0") {
                    found.push(p);
                }
            }
            found
        };
        let mut client = Vec::new();
        wait_until(90.0, "the bench's first iperf3 client runs", || {
            client = clients();
            !client.is_empty()
        });
        assert!(matches!(bench.try_wait(), Ok(None)), "the bench ended before it was interrupted");
        // Ctrl-C: SIGINT to the foreground process group, iperf3 among it.
        std::process::Command::new("kill").args(["-INT", "--", &format!("-{pid}")]).status().unwrap();
        let status = bench.wait().unwrap();
        let _ = std::fs::remove_dir_all(&out);
        assert_eq!(status.code(), Some(130), "vnet-lab bench on SIGINT: {status}");
        let alive =
            |p: u32| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.starts_with(b"iperf3"));
        let took = wait_until(5.0, "the interrupted bench's iperf3 client gone", || {
            !client.iter().any(|&p| alive(p))
        });
        eprintln!("bench interrupted: its iperf3 client {client:?} gone {took:?} after vnet-lab exited");
        let left = std::process::Command::new("ip").args(["netns", "list"]).output().unwrap();
        let prefix = format!("vl{tag}-");
        let left: Vec<String> = String::from_utf8_lossy(&left.stdout)
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .map(str::to_string)
            .collect();
        assert!(left.is_empty(), "namespaces the interrupted bench left: {left:?}");
    }
}
