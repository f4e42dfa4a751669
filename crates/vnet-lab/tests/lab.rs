//! Namespace integration tests: real vnetds, TAPs and UDP in a lab.
//!
//! They need root (network namespaces, TAP devices), so they are `#[ignore]`d
//! and the project's test command runs them with `--ignored`. Each builds
//! its own lab with per-run names; the lab's `Drop` removes it even when an
//! assertion fails.

use std::net::Ipv4Addr;
use std::time::Duration;
use vnet_lab::{Format, Lab, Links, Spec, Vm};

fn lab(spec: Spec) -> Lab {
    assert!(vnet_lab::available(), "the lab needs root, /dev/net/tun and `ip netns`");
    // Ctrl-C (or SIGTERM from a CI timeout) removes every lab of this run.
    vnet_lab::install_signal_cleanup();
    let lab = Lab::up(spec).unwrap_or_else(|e| panic!("lab: {e}"));
    // Each lab says the path its interfaces are on, and fails when one is
    // not on the pass's (VNET_LAB_DATAPATH, or the path the test names).
    println!("{}", lab.check_datapaths().unwrap_or_else(|e| panic!("{e}")));
    lab
}

/// A spec's `datapath` for a test about the user path (its TAPs, workers,
/// merging, secured links): on it whatever the pass.
fn user() -> Option<String> {
    Some("user".into())
}

/// Pings until one reply (ARP, a restarting daemon), then asserts `n` of `n`.
fn assert_ping(lab: &Lab, from: &Vm, to: Ipv4Addr, size: u32) {
    let mut warm = false;
    for _ in 0..10 {
        if lab.ping(from, to, 1, size).unwrap().received == 1 {
            warm = true;
            break;
        }
    }
    assert!(warm, "no reply from {to} to {} (size {size})\nlogs:\n{}\n{}", from.ip, lab.log(0), lab.log(1));
    let r = lab.ping(from, to, 5, size).unwrap();
    assert_eq!(r.received, 5, "{} -> {to}: {r:?}", from.ip);
}

/// The `Cpus_allowed_list` of each thread of process `pid` whose name
/// starts with `prefix`.
fn thread_cpus(pid: u32, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let t = t.unwrap().path();
        if !std::fs::read_to_string(t.join("comm")).unwrap_or_default().starts_with(prefix) {
            continue;
        }
        let status = std::fs::read_to_string(t.join("status")).unwrap_or_default();
        let line = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")).unwrap_or_default();
        out.push(line.split_whitespace().nth(1).unwrap_or("").to_string());
    }
    out
}

/// Deletes host `h`'s interface `name` with the routes to it, in one transaction.
fn delete_interface(lab: &Lab, h: usize, name: &str) {
    let to = format!("interface {name}");
    let routes = json(lab, h, "routes");
    let mut t: String = routes["routes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["to"] == to.as_str())
        .map(|r| format!("delete route {}\n", r["id"]))
        .collect();
    t.push_str(&format!("delete interface {name}\n"));
    lab.apply(h, &t).unwrap();
}

/// A TCP stream from `from` to `to` for `secs` s carried data end to end:
/// iperf3 ran its course without an error and its receiver counted more
/// than a megabyte (at most what was sent: the sender's count also holds
/// what was still in flight when the test ended). No rate: rates are the
/// bench's (a test running beside this one can halve them). Returns the
/// bytes received.
fn assert_stream(lab: &mut Lab, from: &Vm, to: &Vm, secs: u32) -> u64 {
    let (_, text) = lab.iperf3(from, to, secs, &[]).unwrap();
    assert_carried(&text, &format!("{} -> {}", from.ip, to.ip))
}

/// iperf3's JSON output `text` says its TCP stream carried more than a
/// megabyte (see [`assert_stream`]).
fn assert_carried(text: &str, what: &str) -> u64 {
    let (sent, received) = vnet_lab::iperf3_bytes(text);
    assert!(received >= 1 << 20 && received <= sent, "{what}: {sent} B sent, {received} B received");
    received
}

fn assert_no_ping(lab: &Lab, from: &Vm, to: Ipv4Addr) {
    let r = lab.ping(from, to, 3, 56).unwrap();
    // Three sent: a ping that never ran (or never parsed) is no proof of a cut.
    assert_eq!((r.sent, r.received), (3, 0), "{} -> {to} should be cut: {r:?}", from.ip);
}

/// The names of process `pid`'s threads that start with `prefix`.
fn thread_names(pid: u32, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let comm = std::fs::read_to_string(t.unwrap().path().join("comm")).unwrap_or_default();
        if comm.starts_with(prefix) {
            out.push(comm.trim_end().to_string());
        }
    }
    out
}

fn json(lab: &Lab, h: usize, what: &str) -> serde_json::Value {
    let r = lab.control(h, &format!("show {what} json")).unwrap();
    assert_eq!(r.result, Ok(()));
    serde_json::from_str(&r.body).unwrap()
}

fn two_hosts_ping_both_ways(format: Format) {
    let lab = lab(Spec { format, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    assert_ping(&lab, &b, a.ip, 56);
    // The control socket is for root only (made under umask 077: 0700, as
    // sockets are created 0777 less the umask).
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&lab.hosts[0].control).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "{mode:o}");
    // ARP resolved across the overlay: A knows B's MAC.
    let neigh = lab.ns_exec(&a.ns, &["ip", "neigh", "show", &b.ip.to_string()]).unwrap();
    assert!(String::from_utf8_lossy(&neigh.stdout).contains(&b.mac), "{neigh:?}");
    // Frames crossed the link in both directions, and the route cache served
    // them (the workers' cache, or on the kernel path its map).
    let s = json(&lab, 0, "stats");
    assert!(s["links"][0]["tx_packets"].as_u64().unwrap() >= 6);
    assert!(s["links"][0]["rx_packets"].as_u64().unwrap() >= 6);
    let g = &s["global"];
    let served = g["route_cache_hits"].as_u64().unwrap() + g["kernel_encap"].as_u64().unwrap_or(0);
    assert!(served > 0, "{g}");
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn raw_format_ping_both_ways() {
    two_hosts_ping_both_ways(Format::Raw);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn vnet_format_ping_both_ways() {
    two_hosts_ping_both_ways(Format::Vnet);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn broadcast_reaches_every_vm_of_three_hosts() {
    let lab = lab(Spec { hosts: 3, vms_per_host: 2, ..Spec::default() });
    let a = lab.vm(0, 0).clone();
    let out = lab
        // No count: `-c` would stop at the first reply to the last request.
        .ns_output(&a.ns, &["ping", "-n", "-b", "-w", "2", "-i", "0.3", "10.88.255.255"])
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // Every other VM answered each of the 3 broadcasts exactly once: a
    // loop (a broadcast delivered twice) shows as a second reply from
    // one address to one sequence number.
    let mut replies: std::collections::BTreeMap<(String, u32), u32> = Default::default();
    for l in text.lines() {
        let ip = l.split("from ").nth(1).and_then(|r| r.split(':').next());
        let seq = l.split("icmp_seq=").nth(1).and_then(|r| r.split_whitespace().next()?.parse().ok());
        if let (Some(ip), Some(seq)) = (ip, seq) {
            *replies.entry((ip.to_string(), seq)).or_default() += 1;
        }
    }
    for (h, v) in [(0, 1), (1, 0), (1, 1), (2, 0), (2, 1)] {
        let ip = lab.vm(h, v).ip.to_string();
        for seq in 1..=3 {
            assert_eq!(
                replies.get(&(ip.clone(), seq)),
                Some(&1),
                "replies from {ip} to broadcast {seq}:\n{text}"
            );
        }
    }
    let others = replies.iter().filter(|((ip, seq), _)| *ip != a.ip.to_string() && *seq <= 3);
    assert_eq!(others.count(), 15, "{text}");
    assert!(replies.values().all(|&n| n == 1), "a broadcast was delivered twice:\n{text}");
    for h in 1..3 {
        let links = json(&lab, h, "links");
        for l in links["links"].as_array().unwrap() {
            // Split horizon: a host never sends a broadcast it got from a link onwards.
            assert!(l["tx_packets"].as_u64().unwrap() < 50, "host {h}: {l}");
        }
    }
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn iperf3_tcp_transfer_completes() {
    let mut lab = lab(Spec::default());
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    assert_stream(&mut lab, &a, &b, 3);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn ping_60k_with_64k_virtual_mtu_over_1500_underlay() {
    let lab = lab(Spec { vm_mtu: 65_000, underlay_mtu: 1500, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 60_000);
    // The frames really were fragmented and reassembled by vnet, not by IP.
    let s = json(&lab, 1, "stats");
    assert!(s["global"]["reasm_completed"].as_u64().unwrap() >= 5, "{s}");
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn runtime_route_changes_with_vnetctl() {
    let lab = lab(Spec::default());
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    // Route 1 on host 0 sends B's MAC to host 1 (see vnet_lab::config_for).
    let routes = json(&lab, 0, "routes");
    assert_eq!(routes["routes"][1]["dst"], b.mac.as_str());
    let out = lab.vnetctl(0, &["delete", "route", "1"]).unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_no_ping(&lab, &a, b.ip);
    let out = lab.vnetctl(0, &["route", "any", &b.mac, "->", "link", "h1"]).unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_ping(&lab, &a, b.ip, 56);
    let listed = lab.vnetctl(0, &["--json", "show", "routes"]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let id =
        v["routes"].as_array().unwrap().iter().find(|r| r["dst"] == b.mac.as_str()).unwrap()["id"].clone();
    assert_eq!(id, 4, "new routes get new ids");
    let out = lab.vnetctl(0, &["delete", "route", "4"]).unwrap();
    assert!(out.status.success());
    assert_no_ping(&lab, &a, b.ip);
}

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
fn palacios_configured_host_reaches_superset_host() {
    let lab = lab(Spec { format: Format::Raw, palacios_hosts: vec![0], ..Spec::default() });
    let cfg = std::fs::read_to_string(&lab.hosts[0].config).unwrap();
    assert!(
        cfg.contains("\nadd 10.77.0.2 9000 udp\n") && !cfg.contains("\nroute ") && !cfg.contains("\nlink "),
        "{cfg}"
    );
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    assert_ping(&lab, &b, a.ip, 1400);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn datagrams_from_unknown_sources_are_dropped_and_counted() {
    let lab = lab(Spec { hosts: 3, ..Spec::default() });
    // Host 2 is not a link of host 0 once host 0 forgets it.
    let s = json(&lab, 0, "links");
    assert_eq!(s["links"].as_array().unwrap().len(), 2);
    // Routes 2 and 3 of host 0 lead to host 2 (see vnet_lab::config_for).
    let f = lab.dir.join("forget.conf");
    std::fs::write(&f, "[routes]\ndel 2\ndel 3\ndelete link h2\n").unwrap();
    let out = lab.vnetctl(0, &["apply", f.to_str().unwrap()]).unwrap();
    assert!(out.status.success(), "{out:?}\n{}", std::fs::read_to_string(&lab.hosts[0].config).unwrap());
    let c = lab.vm(2, 0).clone();
    let unknown = || json(&lab, 0, "stats")["global"]["unknown_source"].as_u64().unwrap();
    let before = unknown();
    let r = lab.ping(&c, lab.vm(0, 0).ip, 3, 56).unwrap();
    assert_eq!((r.sent, r.received), (3, 0), "host 0 must not answer a host it forgot: {r:?}");
    assert!(unknown() > before, "host 0 dropped host 2's datagrams without counting them");
    // Host 1, which still knows host 2, carries its VM's traffic.
    assert_ping(&lab, &c, lab.vm(1, 0).ip, 56);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn container_on_veth_netdev_talks_to_vm_on_tap() {
    let mut lab = lab(Spec { veth_hosts: vec![1], ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_eq!(b.host_dev.as_deref(), Some("c0"));
    assert_ping(&lab, &a, b.ip, 56);
    assert_ping(&lab, &b, a.ip, 1400);
    assert_stream(&mut lab, &b, &a, 2);
    let s = json(&lab, 1, "interfaces");
    let i = &s["interfaces"][0];
    assert_eq!(i["kind"], "netdev");
    // The container's frames (64 KB TCP ones among them) came off the
    // packet socket's receive ring (on the kernel path: those left to vnetd,
    // off the hand-off TAP), none truncated.
    assert_netdev_reads(i, true);
    let st = json(&lab, 1, "stats")["interfaces"][0].clone();
    assert!(st["rx_packets"].as_u64().unwrap() > 100, "{st}");
    assert_eq!(st["rx_drops"], 0, "{st}");
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn kernel_vxlan_baseline_lab_works() {
    let lab = lab(Spec { overlay: vnet_lab::Overlay::Vxlan, vm_mtu: 1450, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 1400);
    // No vnetd runs in a VXLAN lab.
    assert!(lab.control(0, "show links").is_err());
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn every_baseline_carries_four_vms_per_host() {
    // The bench's many-flows case: VM k on host 0 reaches VM k on host 1
    // (and the others) on each no-overlay and VXLAN baseline.
    for overlay in [vnet_lab::Overlay::Routed, vnet_lab::Overlay::Bridged, vnet_lab::Overlay::Vxlan] {
        let lab = lab(Spec { overlay, vms_per_host: 4, datapath: user(), vm_mtu: 1400, ..Spec::default() });
        for v in 0..4 {
            let (a, b) = (lab.vm(0, v).clone(), lab.vm(1, (v + 1) % 4).clone());
            assert_ping(&lab, &a, b.ip, 1000);
        }
    }
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn bridged_baseline_lab_puts_the_vms_on_the_underlays_segment() {
    let lab =
        lab(Spec { overlay: vnet_lab::Overlay::Bridged, datapath: user(), vm_mtu: 1500, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 1472);
    // One L2 segment, nothing routed: VM A knows VM B's own MAC, the hosts
    // do not forward IP, and no vnetd runs.
    let neigh = lab.ns_exec(&a.ns, &["ip", "neigh", "show", &b.ip.to_string()]).unwrap();
    assert!(String::from_utf8_lossy(&neigh.stdout).contains(&b.mac), "{neigh:?}");
    for h in &lab.hosts {
        let f = lab.ns_exec(&h.ns, &["sysctl", "-n", "net.ipv4.ip_forward"]).unwrap();
        assert_eq!(String::from_utf8_lossy(&f.stdout).trim(), "0");
    }
    assert!(lab.control(0, "show links").is_err());
    // The hosts keep their underlay addresses (on the bridge).
    let h1 = lab.hosts[1].underlay_ip.to_string();
    assert!(lab.ns_exec(&lab.hosts[0].ns, &["ping", "-c", "1", "-W", "2", &h1]).unwrap().status.success());
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn adaptive_dispatch_polls_under_load_and_sleeps_when_idle() {
    // The user path's dispatch: VMs on TAPs vnetd holds, whatever the pass.
    let mut lab =
        lab(Spec { dispatch: Some("adaptive".into()), datapath: user(), vm_mtu: 1500, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    let iface = |lab: &Lab| json(lab, 0, "interfaces")["interfaces"][0].clone();
    assert_eq!(iface(&lab)["dispatch"], "notify", "idle at start");
    // Under an iperf3 load the sending interface switches to polling.
    lab.spawn(&b.ns, &["iperf3", "-s", "-1", "-B", &b.ip.to_string()]).unwrap();
    lab.wait_listening(&b.ns, 5201).unwrap();
    // Small UDP datagrams: a frame rate far past the 10000/s threshold
    // whatever the machine's speed (64 KB TCP frames sit near it).
    lab.spawn(&a.ns, &["iperf3", "-c", &b.ip.to_string(), "-t", "3", "-u", "-b", "200M", "-l", "200"])
        .unwrap();
    let mut polled = false;
    for _ in 0..25 {
        std::thread::sleep(Duration::from_millis(100));
        if iface(&lab)["dispatch"] == "poll" {
            polled = true;
            break;
        }
    }
    assert!(polled, "never switched to poll under load: {}", iface(&lab));
    // Idle again: back to notify, with both switches counted.
    std::thread::sleep(Duration::from_secs(4));
    let i = iface(&lab);
    assert_eq!(i["dispatch"], "notify", "{i}");
    assert!(i["mode_switches"].as_u64().unwrap() >= 2, "{i}");
    let text = lab.vnetctl(0, &["show", "interfaces"]).unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("mode_switches"));
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn adaptive_dispatch_polls_through_a_ping_pong_but_not_between_sparse_pings() {
    // Adaptive dispatch polls through a fast exchange and sleeps between
    // sparse frames: polling catches requests 150 us apart (ping sends them
    // in bursts, so the rate rule may poll too; the window's own arithmetic
    // is the dispatch module's unit tests); a ping every 20 ms is never
    // caught by polling (and hardly looked for).
    let lab =
        lab(Spec { dispatch: Some("adaptive".into()), datapath: user(), vm_mtu: 1500, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    let polls = |lab: &Lab| {
        let i = json(lab, 0, "interfaces")["interfaces"][0].clone();
        let n = |k: &str| i[k].as_u64().unwrap();
        (n("polls"), n("wakeups"), n("rx_packets"), n("contended"), n("polled_frames"))
    };
    let to = b.ip.to_string();
    let ping = |args: &[&str]| {
        let mut argv = vec!["ping", "-n", "-q", "-W", "1"];
        argv.extend_from_slice(args);
        argv.push(&to);
        let o = lab.ns_exec(&a.ns, &argv).unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    };
    let (p0, _, f0, _, k0) = polls(&lab);
    ping(&["-i", "0.02", "-c", "50"]);
    let (p1, w1, f1, c1, k1) = polls(&lab);
    assert!(f1 - f0 >= 50, "{} frames", f1 - f0);
    assert_eq!(k1 - k0, 0, "polling caught frames 20 ms apart ({} looks)", p1 - p0);
    assert!(p1 - p0 < 50, "polled between pings 20 ms apart: {} looks", p1 - p0);
    ping(&["-i", "0.00015", "-c", "3000"]);
    let (p2, w2, f2, c2, k2) = polls(&lab);
    let (frames, wakeups, contended, caught) = (f2 - f1, w2 - w1, c2 - c1, k2 - k1);
    eprintln!(
        "sparse: {} looks; 150 us apart: {frames} frames, {caught} caught by polling, {wakeups} wake-ups, {} \
         looks, {contended} contended",
        p1 - p0,
        p2 - p1
    );
    assert!(frames >= 3000, "{frames} frames");
    assert!(p2 - p1 >= 300, "requests 150 us apart polled only {} times", p2 - p1);
    // Polling caught requests, each one a wake-up saved. How many depends
    // on what else wants the CPU (polling stands back then): 2-527 wake-ups
    // in 3000 seen alone, 2031 in CI beside other tests, so the share is
    // reported, not asserted.
    assert!(caught > 0, "polling caught none of {frames} requests 150 us apart");
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn workers_run_on_the_cpu_given_and_links_receive_in_batches() {
    let allowed: Vec<usize> = vnetd::sys::allowed_cpus().unwrap();
    let cpu = *allowed.last().unwrap();
    let mut lab = lab(Spec {
        datapath: user(),
        vm_mtu: 1500,
        vnetd_args: vec!["--worker-cpus".into(), cpu.to_string()],
        ..Spec::default()
    });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    for h in 0..2 {
        let cpus = thread_cpus(lab.vnetd_pid(h).unwrap(), "vnet-w");
        assert!(!cpus.is_empty(), "host {h}: no worker thread");
        assert!(cpus.iter().all(|c| *c == cpu.to_string()), "host {h}: workers on {cpus:?}, not {cpu}");
    }
    // A small-datagram flood: host B's link socket has many waiting at a
    // time and takes them with few `recvmmsg` calls.
    lab.spawn(&b.ns, &["iperf3", "-s", "-1", "-B", &b.ip.to_string()]).unwrap();
    lab.wait_listening(&b.ns, 5201).unwrap();
    lab.ns_exec(&a.ns, &["iperf3", "-c", &b.ip.to_string(), "-t", "2", "-u", "-b", "200M", "-l", "200"])
        .unwrap();
    let g = json(&lab, 1, "stats")["global"].clone();
    let (calls, msgs) = (g["link_recv_calls"].as_u64().unwrap(), g["link_recv_messages"].as_u64().unwrap());
    assert!(calls > 0 && msgs > 2 * calls, "messages per recvmmsg: {msgs} / {calls}");
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn many_streams_are_read_by_every_socket_of_the_link_group_and_every_tap_queue() {
    let mut lab = lab(Spec {
        datapath: user(),
        vm_mtu: 65000,
        tap_queues: 2,
        vnetd_args: vec!["--link-readers".into(), "2".into()],
        ..Spec::default()
    });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    for h in 0..2 {
        let mut names = thread_names(lab.vnetd_pid(h).unwrap(), "vnet-w");
        names.sort();
        assert_eq!(names, ["vnet-w0", "vnet-w1"], "host {h}: a worker per queue and socket");
    }
    // 32 TCP streams: the sender's pool of 16 ports gives each flow one
    // (by the flow's hash: about 14 ports used), and the receiver's kernel
    // spreads the ports over the group (all on one socket of two: ~2^-13).
    lab.spawn(&b.ns, &["iperf3", "-s", "-1", "-B", &b.ip.to_string()]).unwrap();
    lab.wait_listening(&b.ns, 5201).unwrap();
    let out =
        lab.ns_output(&a.ns, &["iperf3", "-c", &b.ip.to_string(), "-t", "2", "-P", "32", "--json"]).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Carried, at any rate (a rate is the bench's: a test beside this one
    // can halve it).
    let (_, received) = vnet_lab::iperf3_bytes(&String::from_utf8_lossy(&out.stdout));
    assert!(received >= 1 << 20, "the 32 streams carried {received} bytes");
    let g = json(&lab, 1, "stats")["global"].clone();
    let read: Vec<u64> =
        g["link_reader_messages"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(read.len(), 2, "{g}");
    assert!(read.iter().all(|&n| n > 100), "32 streams, one socket read them all: {read:?}");
    // The frames of one flow stay on one socket, so a frame of two GRO
    // batches goes on whole, seldom reassembled.
    let (pairs, reasm) = (g["rx_whole_pairs"].as_u64().unwrap(), g["reasm_completed"].as_u64().unwrap());
    assert!(pairs > reasm, "{pairs} frames whole from two batches, {reasm} reassembled");
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
    assert!(pairs > 1000 && pairs > 2 * reasm, "{pairs} frames whole from two batches, {reasm} reassembled");
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn sixty_second_transfer_without_drops() {
    let mut lab = lab(Spec::default());
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    // The kernel's own drop counters, where vnet's frames could be lost
    // without vnetd knowing: UDP receive errors in the hosts, and drops
    // on the VMs' NICs and the underlay.
    let kernel_drops = |lab: &Lab| -> Vec<(String, u64)> {
        let mut v = Vec::new();
        for h in 0..2 {
            let ns = lab.hosts[h].ns.clone();
            let snmp = String::from_utf8_lossy(&lab.ns_exec(&ns, &["cat", "/proc/net/snmp"]).unwrap().stdout)
                .to_string();
            let udp: Vec<&str> = snmp.lines().filter(|l| l.starts_with("Udp:")).collect();
            if let [names, values] = udp[..] {
                for (n, x) in names.split_whitespace().zip(values.split_whitespace()).skip(1) {
                    if ["InErrors", "RcvbufErrors", "SndbufErrors"].contains(&n) {
                        let x = x.parse().unwrap_or_else(|e| panic!("host {h} Udp {n} = {x:?}: {e}"));
                        v.push((format!("host {h} Udp {n}"), x));
                    }
                }
            }
            for (ns, dev) in [
                (ns.clone(), lab.hosts[h].underlay_dev.clone()),
                (lab.vm(h, 0).ns.clone(), lab.vm(h, 0).dev.clone()),
            ] {
                let out = lab.ns_exec(&ns, &["ip", "-j", "-s", "link", "show", "dev", &dev]).unwrap();
                let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                for dir in ["rx", "tx"] {
                    let n = j[0]["stats64"][dir]["dropped"].as_u64().unwrap();
                    v.push((format!("{ns} {dev} {dir}_dropped"), n));
                }
            }
        }
        v
    };
    let before = kernel_drops(&lab);
    // Per host: three UDP counters, two per device (underlay, VM).
    assert_eq!(before.len(), 14, "counters not found: {before:?}");
    assert_stream(&mut lab, &a, &b, 60);
    let after = kernel_drops(&lab);
    assert_eq!(before, after, "the kernel dropped frames during the transfer");
    for h in 0..2 {
        let s = json(&lab, h, "stats");
        for i in s["interfaces"].as_array().unwrap() {
            assert_eq!(i["tx_drops"], 0, "host {h}: {i}");
            assert_eq!(i["rx_drops"], 0, "host {h}: {i}");
        }
        for l in s["links"].as_array().unwrap() {
            assert_eq!(l["tx_drops"], 0, "host {h}: {l}");
            assert_eq!(l["rx_drops"], 0, "host {h}: {l}");
        }
        for k in [
            "malformed",
            "offload_errors",
            "reasm_timed_out",
            "reasm_evicted",
            "reasm_rejected",
            "unknown_source",
        ] {
            assert_eq!(s["global"][k], 0, "host {h}: {k} in {}", s["global"]);
        }
        // The kernel path's error counter: 0 on the kernel pass, absent on
        // the user path's.
        let kernel = lab.spec.datapath.as_deref() == Some("kernel");
        let want = if kernel { serde_json::json!(0) } else { serde_json::Value::Null };
        assert_eq!(s["global"]["kernel_errors"], want, "host {h}: {}", s["global"]);
    }
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn kernel_path_carries_unicast_and_follows_route_changes() {
    let mut lab = lab(Spec { datapath: Some("kernel".into()), vm_mtu: 1438, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    assert_ping(&lab, &b, a.ip, 1400);
    let moved = assert_stream(&mut lab, &a, &b, 2) as f64;
    for h in 0..2 {
        let s = json(&lab, h, "stats");
        let g = &s["global"];
        assert_eq!(g["kernel_path"], "loaded", "host {h}: {g}");
        assert_eq!(s["interfaces"][0]["datapath"], "kernel");
        assert_eq!(g["kernel_errors"], 0, "host {h}: {g}");
        // Unicast went through the kernel both ways: encapsulated here,
        // decapsulated at the peer, and merged into the link's counters.
        assert!(g["kernel_encap"].as_u64().unwrap() >= 10, "host {h}: {g}");
        assert!(g["kernel_decap"].as_u64().unwrap() >= 10, "host {h}: {g}");
        assert!(s["links"][0]["kernel_tx_packets"].as_u64().unwrap() >= 10);
        assert!(s["links"][0]["tx_packets"].as_u64() >= s["links"][0]["kernel_tx_packets"].as_u64());
    }
    // No packet socket taps VM A's device (a tap runs before TC ingress and
    // would see every frame the kernel moves): the frames the program
    // leaves to vnetd (ARP here) came by its hand-off TAP.
    let (ns, dev) = (lab.hosts[0].ns.clone(), a.host_dev.clone().unwrap());
    let read =
        |args: &[&str]| String::from_utf8_lossy(&lab.ns_output(&ns, args).unwrap().stdout).into_owned();
    let index = read(&["cat", &format!("/sys/class/net/{dev}/ifindex")]).trim().to_string();
    let packet = read(&["cat", "/proc/net/packet"]);
    let taps: Vec<&str> = packet
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(3) != Some(&"0000") && f.get(4) == Some(&index.as_str())
        })
        .collect();
    assert!(taps.is_empty(), "packet sockets tap {dev} (index {index}): {taps:?}\n{packet}");
    let ifaces = json(&lab, 0, "interfaces");
    assert_netdev_reads(&ifaces["interfaces"][0], true);
    let handoff = ifaces["interfaces"][0]["handoff"].as_str().unwrap_or_default().to_string();
    // Its own IPv6 stays quiet: no link-local address is made for it.
    let link = read(&["ip", "-d", "link", "show", &handoff]);
    assert!(link.contains("addrgenmode none"), "{handoff} makes IPv6 addresses: {link}");
    // The same counters for scrapers (`show metrics`, `vnetd --metrics`).
    let m = lab.control(0, "show metrics").unwrap().body;
    let encap = m.lines().find_map(|l| l.strip_prefix("vnet_kernel_encap ")).unwrap_or("0");
    assert!(encap.parse::<u64>().unwrap() >= 10, "{m}");
    assert!(m.contains("vnet_link_tx_packets{link=\"h1\"} "), "{m}");
    // Nearly every byte of the transfer took the kernel path, not the user path.
    let g = json(&lab, 0, "stats")["global"].clone();
    let kernel_bytes = g["kernel_encap_bytes"].as_u64().unwrap() as f64;
    assert!(kernel_bytes > 0.8 * moved, "kernel moved {kernel_bytes} B of about {moved}: {g}");
    // And the receiving host decapsulated it in the kernel too (tunnel-GSO
    // super-frames included).
    let g1 = json(&lab, 1, "stats")["global"].clone();
    let decap_bytes = g1["kernel_decap_bytes"].as_u64().unwrap() as f64;
    assert!(decap_bytes > 0.8 * moved, "host 1 decapsulated {decap_bytes} B of about {moved}: {g1}");
    // Route changes reach the kernel's maps at once.
    let v = json(&lab, 0, "routes");
    let id =
        v["routes"].as_array().unwrap().iter().find(|r| r["dst"] == b.mac.as_str()).unwrap()["id"].clone();
    assert!(lab.vnetctl(0, &["delete", "route", &id.to_string()]).unwrap().status.success());
    assert_no_ping(&lab, &a, b.ip);
    let add = ["route", "any", b.mac.as_str(), "->", "link", "h1"];
    assert!(lab.vnetctl(0, &add).unwrap().status.success());
    // At once: the first pings after the change, no warm-up retries.
    let r = lab.ping(&a, b.ip, 3, 56).unwrap();
    assert_eq!((r.sent, r.received), (3, 3), "the restored route did not carry the first pings: {r:?}");
    // Deleting the interface detaches its program (frames from VM A reach
    // no one); declaring it again re-attaches it.
    delete_interface(&lab, 0, "vm0");
    assert_eq!(json(&lab, 0, "interfaces")["interfaces"].as_array().unwrap().len(), 0);
    let seen = || json(&lab, 0, "stats")["global"]["kernel_vm_frames"].as_u64().unwrap();
    let before = seen();
    assert_no_ping(&lab, &a, b.ip);
    assert_eq!(seen(), before, "the program still sees VM A's frames after its interface was deleted");
    let back = format!(
        "interface vm0 netdev {} mac {} datapath kernel\nroute any {} -> interface vm0\n\
         route any ff:ff:ff:ff:ff:ff -> interface vm0\n",
        a.host_dev.as_deref().unwrap(),
        a.mac,
        a.mac
    );
    lab.apply(0, &back).unwrap();
    assert_ping(&lab, &a, b.ip, 56);
    assert_eq!(json(&lab, 0, "interfaces")["interfaces"][0]["datapath"], "kernel");
    // Stopping vnetd removes its programs: were they left attached (with
    // their maps), host 0 would still forward in the kernel and A reach B.
    lab.stop_vnetd(0).unwrap();
    assert_no_ping(&lab, &a, b.ip);
    lab.start_vnetd(0).unwrap();
    assert_ping(&lab, &a, b.ip, 56);
}

/// `--kernel-routes N` sizes the kernel path's route tables, and `show
/// stats` reports the size beside the entries used (issue 30).
#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn the_kernel_route_tables_take_their_size_from_the_flag_and_report_it() {
    // The kernel path's own test: on it whatever the pass (kernel_only in
    // scripts/test.sh). A kernel path that does not load fails it.
    let lab = lab(Spec {
        datapath: Some("kernel".into()),
        vm_mtu: 1438,
        vnetd_args: vec!["--kernel-routes".into(), "2048".into()],
        ..Spec::default()
    });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    let g = json(&lab, 0, "stats")["global"].clone();
    assert_eq!(g["kernel_path"], "loaded", "the veths asked for the kernel path: {g}");
    assert_eq!(g["kernel_route_capacity"], 2048, "{g}");
    assert!(g["kernel_route_entries"].as_u64().unwrap() > 0, "{g}");
}

/// Issue 30: a network of 100000 MACs behind 1000 links (VXLAN links to
/// host 1, one per VNI, as a cluster's view of 1000 hosts) is all in the
/// kernel's maps, and a MAC move reaches them in under a millisecond.
#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_network_of_100000_macs_over_1000_links_is_all_in_the_kernel_and_a_move_reaches_it_in_under_a_millisecond(
) {
    let lab = lab(Spec { datapath: Some("kernel".into()), vm_mtu: 1438, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    let peer = lab.hosts[1].underlay_ip;
    let big = |i: u32| format!("52:54:01:{:02x}:{:02x}:{:02x}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    let mut change = String::new();
    for vni in 1..=1000 {
        change.push_str(&format!("link big{vni} vxlan {peer} vni {vni}\n"));
    }
    for i in 0..100_000 {
        change.push_str(&format!("route any {} -> link big{}\n", big(i), i % 1000 + 1));
    }
    let t0 = std::time::Instant::now();
    lab.apply(0, &change).unwrap();
    let loaded = t0.elapsed();
    let g = json(&lab, 0, "global")["global"].clone();
    if g["kernel_path"] != "loaded" {
        panic!("the kernel path must load here: {g}");
    }
    assert_eq!(g["kernel_route_overflow"], 0, "{g}");
    assert!(g["kernel_dest_entries"].as_u64().unwrap() >= 100_000, "{g}");
    let full_sync_us = g["kernel_last_sync_us"].as_f64().unwrap();
    let routes = json(&lab, 0, "routes");
    let by_dst: std::collections::HashMap<&str, (u64, &str)> = routes["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["dst"].as_str().unwrap(), (r["id"].as_u64().unwrap(), r["to"].as_str().unwrap())))
        .collect();
    let id_of = |mac: &str| {
        let (id, to) = by_dst.get(mac).unwrap_or_else(|| panic!("no route to {mac}"));
        (*id, to.to_string())
    };
    // 100 moves, each its own transaction: the kernel's share and the
    // whole transaction as vnetd measured them, and the round trip of a
    // client (`vnetctl apply`, a process each).
    let (mut kernel_us, mut txn_us, mut client_ms) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..100u32 {
        let mac = big(i * 997);
        let (id, _) = id_of(&mac);
        let text = format!("delete route {id}\nroute any {mac} -> link big{}\n", (i * 997 + 500) % 1000 + 1);
        let t0 = std::time::Instant::now();
        lab.apply(0, &text).unwrap();
        client_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        let g = json(&lab, 0, "global")["global"].clone();
        assert_eq!(g["kernel_last_sync_incremental"], true, "a move writes only its entry: {g}");
        assert_eq!(g["last_transaction_routes_only"], true, "a move patches the route table: {g}");
        kernel_us.push(g["kernel_last_sync_us"].as_f64().unwrap());
        txn_us.push(g["last_transaction_us"].as_f64().unwrap());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (k, t, c) = (median(&mut kernel_us), median(&mut txn_us), median(&mut client_ms));
    let rss = std::fs::read_to_string(format!("/proc/{}/status", lab.vnetd_pid(0).unwrap())).unwrap();
    let rss = rss.lines().find(|l| l.starts_with("VmRSS")).unwrap_or("VmRSS: ?").to_string();
    eprintln!(
        "100000 MACs over 1000 links: loaded in {loaded:?} (kernel maps {full_sync_us:.0} us); a move: kernel \
         maps median {k:.0} us (max {:.0}), whole transaction median {t:.0} us (max {:.0}), vnetctl apply \
         median {c:.1} ms; vnetd {rss}",
        kernel_us.last().unwrap(),
        txn_us.last().unwrap()
    );
    // The figure is a release build's (docs/CLUSTER.md); a debug build is
    // slower, but a move must still cost a small part of writing it all.
    assert!(k < 1000.0 && k < full_sync_us / 20.0, "a move took {k} us to reach the kernel's maps");
    // The writes are the kernel's decisions: B's MAC sent where nothing
    // answers (VNI 1 at host 1) and the kernel stops carrying A's pings;
    // back, it carries them again.
    let (id, to) = id_of(&b.mac);
    lab.apply(0, &format!("delete route {id}\nroute any {} -> link big1\n", b.mac)).unwrap();
    assert_no_ping(&lab, &a, b.ip);
    let routes = json(&lab, 0, "routes");
    let id = routes["routes"].as_array().unwrap().iter().find(|r| r["dst"] == b.mac.as_str()).unwrap()["id"]
        .clone();
    lab.apply(0, &format!("delete route {id}\nroute any {} -> {to}\n", b.mac)).unwrap();
    let encap = || json(&lab, 0, "global")["global"]["kernel_encap"].as_u64().unwrap();
    let before = encap();
    assert_ping(&lab, &a, b.ip, 56);
    assert!(encap() >= before + 5, "the kernel path no longer carries A -> B");
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_change_the_kernel_maps_refuse_fails_whole_and_changes_nothing() {
    let lab = lab(Spec { datapath: Some("kernel".into()), vm_mtu: 1438, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    let links_before = json(&lab, 0, "links")["links"].as_array().unwrap().len();
    let routes_before = json(&lab, 0, "routes");
    let id = routes_before["routes"].as_array().unwrap().iter().find(|r| r["dst"] == b.mac.as_str()).unwrap()
        ["id"]
        .clone();
    // The kernel's link map holds 1024 entries: 1100 VXLAN links (one per
    // VNI, to host 1) overflow it. With them, a route deletion that must not
    // happen on either path.
    let peer = lab.hosts[1].underlay_ip;
    let mut change = format!(
        "delete route {id}
"
    );
    for vni in 1..=1100 {
        change.push_str(&format!(
            "link big{vni} vxlan {peer} vni {vni}
"
        ));
    }
    let err = lab.apply(0, &change).expect_err("the kernel's maps cannot hold 1100 more links");
    assert!(err.to_string().contains("the kernel path's maps"), "{err}");
    assert_eq!(json(&lab, 0, "links")["links"].as_array().unwrap().len(), links_before);
    assert_eq!(json(&lab, 0, "routes"), routes_before);
    // The route is still there in the kernel too: A reaches B through it.
    let encap = || json(&lab, 0, "stats")["global"]["kernel_encap"].as_u64().unwrap();
    let before = encap();
    assert_ping(&lab, &a, b.ip, 56);
    assert!(encap() >= before + 5, "the kernel path no longer carries A -> B");
    // A change that fits still goes through.
    lab.apply(
        0,
        &format!(
            "link small vxlan {peer} vni 7
"
        ),
    )
    .unwrap();
    assert_eq!(json(&lab, 0, "links")["links"].as_array().unwrap().len(), links_before + 1);
    assert_ping(&lab, &a, b.ip, 56);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn two_networks_on_one_host_with_the_same_macs_never_see_each_others_frames_on_either_path() {
    // Finding 4b of the security review: one route table per host, and
    // interfaces carried no network, so network 7's frames reached network
    // 8's VMs. Four VMs on one host: vm0 and vm1 in network 7, vm2 and vm3
    // in network 8 with vm0's and vm1's MACs.
    let mut lab = lab(Spec { hosts: 2, vms_per_host: 4, ..Spec::default() });
    let vms: Vec<Vm> = (0..4).map(|v| lab.vm(0, v).clone()).collect();
    for (v, from) in [(2, 0), (3, 1)] {
        let out = lab
            .ns_exec(&vms[v].ns, &["ip", "link", "set", "dev", &vms[v].dev, "address", &vms[from].mac])
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    // The config again, each interface in its network, each MAC routed in both.
    let shown = lab.control(0, "show config").unwrap().body;
    let mut conf = String::new();
    for line in shown.lines().filter(|l| !l.starts_with("route ")) {
        let iface = (0..4).find(|v| line.starts_with(&format!("interface vm{v} ")));
        match iface {
            Some(v) => {
                let line = line.replace(&vms[v].mac, &vms[v % 2].mac);
                conf += &format!("{line} network {}\n", if v < 2 { 7 } else { 8 });
            }
            None => conf += &format!("{line}\n"),
        }
    }
    for v in 0..4 {
        conf += &format!("route any {} -> interface vm{v}\n", vms[v % 2].mac);
        conf += &format!("route any ff:ff:ff:ff:ff:ff -> interface vm{v}\n");
    }
    // vnetd started on it (declaring a TAP anew in a running vnetd can
    // find the device still held by the old interface: EBUSY).
    lab.stop_vnetd(0).unwrap();
    std::fs::write(&lab.hosts[0].config, &conf).unwrap();
    lab.start_vnetd(0).unwrap();
    let delivered = |lab: &Lab, v: usize| {
        json(lab, 0, "interfaces")["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == format!("vm{v}"))
            .map_or(0, |i| i["tx_packets"].as_u64().unwrap_or(0))
    };
    // Within a network, VMs talk; vm3 (vm1's MAC, network 8) gets none of
    // the frames for vm1, nor vm2 those for vm0.
    let (before2, before3) = (delivered(&lab, 2), delivered(&lab, 3));
    assert_ping(&lab, &vms[0], vms[1].ip, 56);
    assert_ping(&lab, &vms[1], vms[0].ip, 56);
    assert_eq!(
        (delivered(&lab, 2), delivered(&lab, 3)),
        (before2, before3),
        "network 8 saw network 7's frames"
    );
    let (before0, before1) = (delivered(&lab, 0), delivered(&lab, 1));
    assert_ping(&lab, &vms[2], vms[3].ip, 56);
    assert_eq!(
        (delivered(&lab, 0), delivered(&lab, 1)),
        (before0, before1),
        "network 7 saw network 8's frames"
    );
    // Across networks nothing answers: not even ARP crosses.
    assert_no_ping(&lab, &vms[0], vms[3].ip);
    assert_no_ping(&lab, &vms[3], vms[1].ip);
    // Issue 44, finding 6: a network-7 or -8 MAC's announcement goes on no
    // link of network 0 (before, on every link).
    let r = lab.control(0, &format!("announce {}", vms[0].mac)).unwrap();
    assert_eq!(r.body.trim(), format!("announced {} to 0 of 0 links", vms[0].mac));
    if std::env::var("VNET_LAB_DATAPATH").as_deref() == Ok("kernel") {
        let g = json(&lab, 0, "stats")["global"].clone();
        assert_eq!(g["kernel_path"], "loaded", "{g}");
        // A netdev declared anew on the same device (a reload) keeps its
        // traffic: the old interface's release used to take the program
        // and hand-off the new one had taken over.
        let conf = conf.replace(" network 7\n", " broadcast-limit 999 network 7\n");
        std::fs::write(&lab.hosts[0].config, &conf).unwrap();
        let r = lab.control(0, "reload").unwrap();
        assert_eq!(r.result, Ok(()), "{}", r.body);
        assert_ping(&lab, &vms[0], vms[1].ip, 56);
        assert_ping(&lab, &vms[1], vms[0].ip, 56);
    }
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_vm_sending_from_another_mac_is_dropped_and_counted() {
    let lab = lab(Spec::default());
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    let spoofed = || json(&lab, 0, "stats")["global"]["spoofed_source_mac"].as_u64().unwrap();
    assert_eq!(spoofed(), 0);
    // VM A takes another MAC: port security (its interface has `mac`) drops
    // what it sends, on the kernel path too (those frames fall to the user path).
    let set = |m: &str| {
        let out = lab.ns_exec(&a.ns, &["ip", "link", "set", "dev", &a.dev, "address", m]).unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    set("52:54:00:66:66:66");
    assert_no_ping(&lab, &a, b.ip);
    assert!(spoofed() >= 3, "{}", json(&lab, 0, "stats")["global"]);
    set(&a.mac);
    assert_ping(&lab, &a, b.ip, 56);
}

/// Sends (argv[1] = send) VLAN-tagged frames (VLAN 77, an IPv4/UDP packet
/// inside) from device argv[2] to MAC argv[3], or prints (argv[1] =
/// catch) every frame device argv[2] receives for argv[3] seconds that
/// carries the marker, with the VLAN tag it arrived with (inline, or as
/// the kernel's auxiliary data).
const VLAN: &str = r#"
import socket, struct, sys, time
mode, dev = sys.argv[1], sys.argv[2]
if mode == 'send':
    dst = bytes.fromhex(sys.argv[3].replace(':', '')); src = bytes.fromhex(sys.argv[4].replace(':', ''))
    payload = b'vlan-marker-77'
    udp = struct.pack('!HHHH', 5555, 7777, 8 + len(payload), 0) + payload
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, socket.inet_aton('192.168.77.1'), socket.inet_aton('192.168.77.2'))
    f = dst + src + struct.pack('!HH', 0x8100, 77) + b'\x08\x00' + ip + udp
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW); s.bind((dev, 0))
    for _ in range(5):
        s.send(f); time.sleep(0.1)
else:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)); s.bind((dev, 0))
    s.setsockopt(263, 8, 1)  # SOL_PACKET, PACKET_AUXDATA
    s.settimeout(0.2); end = time.time() + float(sys.argv[3])
    while time.time() < end:
        try:
            d, anc, _, _ = s.recvmsg(4096, 64)
        except socket.timeout:
            continue
        if b'vlan-marker-77' not in d:
            continue
        tag = 'none'
        if d[12:14] == b'\x81\x00':
            tag = str(struct.unpack('!H', d[14:16])[0] & 0xfff)
        for lvl, typ, data in anc:
            if lvl == 263 and typ == 8 and len(data) >= 20:
                status, tci = struct.unpack('I', data[:4])[0], struct.unpack('H', data[16:18])[0]
                if status & 0x10:
                    tag = str(tci & 0xfff)
        print('tag=' + tag, flush=True)
"#;

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn vlan_tagged_frames_keep_their_tag_on_either_path() {
    // VMs on TAPs (the tag is in the frame read), and on veths (netdevs:
    // the kernel hands the tag over as metadata) read through the receive
    // ring and frame by frame (as where the kernel refuses a ring). On the
    // kernel pass every VM is on a veth.
    vlan_tags_kept(Spec::default(), None);
    let veths = Spec { veth_hosts: vec![0, 1], ..Spec::default() };
    vlan_tags_kept(veths.clone(), Some(true));
    vlan_tags_kept(Spec { vnetd_args: vec!["--no-rx-ring".into()], ..veths }, Some(false));
}

/// That netdev interface `i` (`show interfaces`) reads its VM's frames
/// through the packet socket's receive ring, or not, as `ring` says; on the
/// kernel path, from its hand-off TAP (the packet socket only sends).
fn assert_netdev_reads(i: &serde_json::Value, ring: bool) {
    if i["datapath"] == "kernel" {
        assert_eq!(i["rx_ring"], false, "{i}");
        assert!(i["handoff"].as_str().is_some_and(|t| t.starts_with("vnh")), "{i}");
    } else {
        assert_eq!(i["rx_ring"], ring, "{i}");
        assert_eq!(i["handoff"], serde_json::Value::Null, "{i}");
    }
}

/// Tagged frames from host 0's VM arrive at host 1's with their tag; the
/// sending VM's interface reads through a ring, or not, as `ring` says.
fn vlan_tags_kept(spec: Spec, ring: Option<bool>) {
    // This kernel has no 802.1Q devices (CONFIG_VLAN_8021Q is off), so the
    // VM sends tagged frames from a packet socket.
    let mut lab = lab(spec);
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    if let Some(ring) = ring {
        assert_netdev_reads(&json(&lab, 0, "interfaces")["interfaces"][0], ring);
    }
    assert_ping(&lab, &a, b.ip, 56);
    let (script, out) = (lab.dir.join("vlan.py"), lab.dir.join("vlan.txt"));
    std::fs::write(&script, VLAN).unwrap();
    let catch = format!("python3 {} catch {} 4 > {}", script.display(), b.dev, out.display());
    lab.spawn(&b.ns, &["sh", "-c", &catch]).unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let sent =
        lab.ns_exec(&a.ns, &["python3", script.to_str().unwrap(), "send", &a.dev, &b.mac, &a.mac]).unwrap();
    assert!(sent.status.success(), "{sent:?}");
    std::thread::sleep(Duration::from_secs(4));
    let got = std::fs::read_to_string(&out).unwrap_or_default();
    let tags: Vec<&str> = got.lines().collect();
    assert!(tags.len() >= 4, "tagged frames lost: {got:?}");
    assert!(tags.iter().all(|t| *t == "tag=77"), "the tag was lost or changed (ring {ring:?}): {got:?}");
}

/// Sends again (from the namespace it runs in, raw IP) the UDP datagrams of
/// a capture: `replay` as they were, `tamper` with one payload byte changed.
/// The UDP checksum is cleared in both (the capture holds it as the sender
/// left it for the device to finish, which the stack would refuse).
const REPLAY: &str = r#"
import socket, struct, sys
mode, pcap, dst = sys.argv[1], sys.argv[2], sys.argv[3]
# argv[4], if given: the source address the datagrams claim instead.
src = socket.inet_aton(sys.argv[4]) if len(sys.argv) > 4 else None
data = open(pcap, 'rb').read()
off, n = 24, 0
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
while off + 16 <= len(data):
    incl = struct.unpack('<I', data[off + 8:off + 12])[0]
    ip = bytearray(data[off + 30:off + 16 + incl])
    off += 16 + incl
    if len(ip) < 64 or ip[9] != 17:
        continue
    ip[26:28] = b'\0\0'
    if src:
        ip[12:16] = src
    if mode == 'tamper':
        ip[60] ^= 1
    s.sendto(bytes(ip), (dst, 0))
    n += 1
    if mode == 'loop':
        # Again and again for four seconds, every 5 ms.
        import time
        end = time.time() + 4
        while time.time() < end:
            time.sleep(0.005)
            try:
                s.sendto(bytes(ip), (dst, 0))
                n += 1
            except OSError:
                pass
        break
print(n)
"#;

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_handshake_initiation_replayed_while_a_host_restarts_cuts_nothing() {
    // Review finding 5: a responder sent on a session nobody confirmed and
    // forgot the last timestamp on restart, so an initiation captured
    // earlier and replayed as vnetd came back cut the link until the next
    // rekey (two minutes).
    let mut lab = lab(Spec { links: Links::Encrypt, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    let h = |i: usize| (lab.hosts[i].ns.clone(), lab.hosts[i].underlay_dev.clone(), lab.hosts[i].underlay_ip);
    let ((ns0, _, ip0), (ns1, dev1, ip1)) = (h(0), h(1));
    // Host 1 captures host 0's initiations (payload bytes: version 2, type 1)
    // while host 0 restarts and so initiates.
    let pcap = lab.dir.join("inits.pcap");
    let pcap_s = pcap.to_str().unwrap().to_string();
    let filter = format!("udp and src host {ip0} and udp[8:2] = 0x0201");
    lab.spawn(&ns1, &["timeout", "5", "tcpdump", "-i", &dev1, "-U", "-s", "0", "-w", &pcap_s, &filter])
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    lab.stop_vnetd(0).unwrap();
    lab.start_vnetd(0).unwrap();
    assert_ping(&lab, &a, b.ip, 56);
    std::thread::sleep(Duration::from_secs(4));
    let wire = std::fs::read(&pcap).unwrap();
    assert!(wire.len() > 24 + 16 + 176, "no initiation captured: {} bytes", wire.len());
    // Host 1 restarts while the captured initiation is replayed at it from
    // host 0's address, from before it listens until after its own
    // handshake: the first one reaches it before any handshake of its own.
    lab.stop_vnetd(1).unwrap();
    let replay = lab.dir.join("replay.py");
    std::fs::write(&replay, REPLAY).unwrap();
    lab.spawn(&ns0, &["python3", replay.to_str().unwrap(), "loop", &pcap_s, &ip1.to_string()]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    lab.start_vnetd(1).unwrap();
    let back = wait_until(10.0, "traffic back after the restart", || {
        lab.ping(&a, b.ip, 1, 56).is_ok_and(|r| r.received == 1)
    });
    // After the replays stop, still up both ways; every replay refused.
    std::thread::sleep(Duration::from_secs(4));
    assert_ping(&lab, &a, b.ip, 56);
    assert_ping(&lab, &b, a.ip, 56);
    let l = link_json(&lab, 1);
    assert!(l["replays"].as_u64().unwrap() >= 1, "the replays never arrived: {l}");
    assert_eq!(l["established"], true, "{l}");
    eprintln!("traffic back {back:?} after the restart; host 1's link: {l}");
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn encrypted_links_hide_payloads_and_refuse_replays_forgeries_and_strangers() {
    let mut lab = lab(Spec { links: Links::Encrypt, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    assert_ping(&lab, &b, a.ip, 1400);
    let link = |lab: &Lab| link_json(lab, 0);
    let delivered = |lab: &Lab| json(lab, 0, "interfaces")["interfaces"][0]["tx_packets"].as_u64().unwrap();
    let l = link(&lab);
    assert_eq!(l["security"], "encrypt", "{l}");
    assert_eq!(l["established"], true, "{l}");
    // With the kernel path loaded (the kernel pass), the link is visibly the
    // user path's: it is never sent unprotected from the kernel.
    if l.get("datapath").is_some() {
        assert_eq!(l["datapath"], "user", "{l}");
        assert!(l["datapath_reason"].as_str().unwrap().contains("security"), "{l}");
    }
    let h = |i: usize| (lab.hosts[i].ns.clone(), lab.hosts[i].underlay_dev.clone(), lab.hosts[i].underlay_ip);
    let ((ns0, dev0, ip0), (ns1, _, ip1)) = (h(0), h(1));
    // A capture on host 0's underlay while B pings A with a known payload.
    let filter = format!("udp and dst port 9000 and src host {ip1}");
    let (wire, pcap) = secret_pings_captured(&mut lab, (&ns0, &dev0, &filter), &b, a.ip);
    let pcap_s = pcap.to_str().unwrap().to_string();
    assert!(wire.len() > 24 + 5 * 400, "the capture holds {} bytes", wire.len());
    assert!(!wire.windows(12).any(|w| w == b"vnetsecret!!"), "the inner payload is visible on the underlay");
    // Replayed, then tampered datagrams from the peer's own address: none
    // reaches VM A; each is counted.
    let replay = lab.dir.join("replay.py");
    std::fs::write(&replay, REPLAY).unwrap();
    let before = (delivered(&lab), link(&lab));
    for mode in ["replay", "tamper"] {
        let out = lab
            .ns_exec(&ns1, &["python3", replay.to_str().unwrap(), mode, &pcap_s, &ip0.to_string()])
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let n: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!(n >= 5, "{mode}: {n} datagrams sent");
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = (delivered(&lab), link(&lab));
    assert_eq!(after.0, before.0, "a replayed or tampered datagram reached the VM");
    let grew = |k: &str| after.1[k].as_u64().unwrap() - before.1[k].as_u64().unwrap();
    assert!(grew("replays") >= 5, "{}", after.1);
    assert!(grew("auth_failures") >= 5, "{}", after.1);
    // A plain `vnet` datagram from the peer's address, another port: nothing.
    let (forge, caught) = (lab.dir.join("forge.py"), lab.dir.join("caught.txt"));
    std::fs::write(&forge, FORGE).unwrap();
    let catch = lab.dir.join("catch.py");
    std::fs::write(&catch, CATCH).unwrap();
    lab.spawn(&a.ns, &["python3", catch.to_str().unwrap(), "3", caught.to_str().unwrap()]).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let args = [
        forge.to_str().unwrap(),
        &ip1.to_string(),
        &ip0.to_string(),
        &ip0.to_string(),
        &a.mac,
        &b.mac,
        &a.ip.to_string(),
        &b.ip.to_string(),
    ];
    let mut cmd = vec!["python3"];
    cmd.extend_from_slice(&args);
    assert!(lab.ns_exec(&ns1, &cmd).unwrap().status.success());
    std::thread::sleep(Duration::from_secs(3));
    let got = std::fs::read_to_string(&caught).unwrap_or_default();
    assert!(!got.contains("mark-"), "an unauthenticated datagram was delivered: {got:?}");
    assert!(link(&lab)["unauthenticated"].as_u64().unwrap() >= 3, "{}", link(&lab));
    // Host 1 now expects another key from host 0: no new session, nothing
    // delivered, the handshakes refused and counted.
    let stranger = vnetd::keys::pubkey(&vnetd::keys::genkey().unwrap()).unwrap();
    let line = format!(
        "link h0 udp {ip0}:9000 peer-key {stranger} security encrypt\nroute any {} -> link h0\n",
        a.mac
    );
    replace_link(&lab, 1, "h0", &line);
    assert_no_ping(&lab, &b, a.ip);
    let l1 = json(&lab, 1, "links")["links"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "h0")
        .unwrap()
        .clone();
    assert_eq!(l1["established"], false, "{l1}");
    assert!(l1["bad_handshakes"].as_u64().unwrap() + link(&lab)["bad_handshakes"].as_u64().unwrap() >= 1);
}

/// Five pings of 400 bytes with the payload "vnetsecret!!" from `vm` to
/// `to`, captured (`tcpdump -w`) in namespace `ns` on `dev` with `filter`:
/// the capture's bytes and file.
fn secret_pings_captured(
    lab: &mut Lab,
    (ns, dev, filter): (&str, &str, &str),
    vm: &Vm,
    to: Ipv4Addr,
) -> (Vec<u8>, std::path::PathBuf) {
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let pcap = lab.dir.join(format!("secret{n}.pcap"));
    let pcap_s = pcap.to_str().unwrap().to_string();
    lab.spawn(ns, &["timeout", "4", "tcpdump", "-i", dev, "-U", "-s", "0", "-w", &pcap_s, filter]).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let pattern = "766e65747365637265742121"; // "vnetsecret!!"
    let out = lab
        .ns_exec(&vm.ns, &["ping", "-c", "5", "-i", "0.2", "-s", "400", "-p", pattern, &to.to_string()])
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    std::thread::sleep(Duration::from_secs(3));
    (std::fs::read(&pcap).unwrap(), pcap)
}

/// Floods vnetd's port for argv[4] seconds at argv[5] datagrams a second
/// (about what one core of this machine's Python sends) with, in turn: junk from spoofed
/// sources, junk "data" from the peer's address, and handshake initiations
/// from the peer's address whose first MAC is right (the responder's public
/// key, argv[3], is public) and whose Noise message is garbage, from another
/// port and (one in ten) from the peer's own port, 9000.
/// On host `h`, deletes link `name` and the routes to it, and applies
/// `lines` (a new definition of it, say) in the same transaction.
fn replace_link(lab: &Lab, h: usize, name: &str, lines: &str) {
    let routes = json(lab, h, "routes");
    let mut change = String::new();
    let to = format!("link {name}");
    for r in routes["routes"].as_array().unwrap().iter().filter(|r| r["to"] == to.as_str()) {
        change.push_str(&format!("delete route {}\n", r["id"]));
    }
    change.push_str(&format!("delete link {name}\n{lines}"));
    lab.apply(h, &change).unwrap();
}

const FLOOD: &str = r#"
import socket, struct, sys, time, os, hmac, hashlib, base64
dst, peer, pub, secs, rate = sys.argv[1], sys.argv[2], base64.b64decode(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
mac = hashlib.sha256(b'vnet mac1 v2' + pub).digest()
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
def pkt(src, payload, sport=None):
    udp = struct.pack('!HHHH', sport or 40000 + len(payload), 9000, 8 + len(payload), 0) + payload
    return struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, socket.inet_aton(src), socket.inet_aton(dst)) + udp
start = time.time()
end, n = start + secs, 0
while time.time() < end:
    time.sleep(max(0.0, start + n / rate - time.time()))
    for _ in range(100):
        r = os.urandom(120)
        k = n % 3
        if k == 0:
            p = pkt('10.77.%d.%d' % (50 + r[0] % 200, 1 + r[1] % 250), r)
        elif k == 1:
            p = pkt(peer, bytes([2, 4, 2, 0]) + r[:60])
        else:
            body = bytes([2, 1, 2, 0]) + r[:108]
            p = pkt(peer, body + hmac.new(mac, body, hashlib.sha256).digest() + bytes(32), 9000 if n % 10 == 2 else None)
        try:
            s.sendto(p, (dst, 0))
        except OSError:
            pass
        n += 1
print(n)
"#;

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_flood_of_junk_and_handshakes_costs_bounded_memory_and_traffic_keeps_flowing() {
    let mut lab = lab(Spec { links: Links::Encrypt, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    let pid = lab.vnetd_pid(0).unwrap();
    let before = rss_kb(pid);
    let flood = lab.dir.join("flood.py");
    std::fs::write(&flood, FLOOD).unwrap();
    let (ns1, ip0, ip1) = (lab.hosts[1].ns.clone(), lab.hosts[0].underlay_ip, lab.hosts[1].underlay_ip);
    let k0 = lab.hosts[0].key.as_ref().unwrap().1.to_string();
    let (f, d, p, k) = (flood.to_str().unwrap().to_string(), ip0.to_string(), ip1.to_string(), k0.clone());
    lab.spawn(&ns1, &["python3", &f, &d, &p, &k, "20", "30000"]).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let r = lab.ping(&b, a.ip, 50, 56).unwrap();
    let during = rss_kb(pid);
    // The real peer still gets a session under the flood: host 1 forgets
    // its link and makes it anew, so it must handshake with host 0, whose
    // budget the flood keeps spent: it gets a cookie, retries with it, and
    // the VMs talk again (WireGuard's cookie, not luck).
    let line =
        format!("link h0 udp {ip0}:9000 peer-key {k0} security encrypt\nroute any {} -> link h0\n", a.mac);
    replace_link(&lab, 1, "h0", &line);
    let r2 = lab.ping(&b, a.ip, 20, 56).unwrap();
    let l1 = link_json(&lab, 1);
    eprintln!(
        "flood: the re-made link: ping {}/20, cookies received {}",
        r2.received, l1["cookies_received"]
    );
    assert!(r2.received >= 10, "no new session under the flood: {r2:?} {l1} {}", link_json(&lab, 0));
    assert!(l1["cookies_received"].as_u64().unwrap() >= 1, "{l1}");
    std::thread::sleep(Duration::from_secs(2));
    let l = link_json(&lab, 0);
    let g = json(&lab, 0, "stats")["global"].clone();
    eprintln!(
        "flood: ping {}/50, vnetd RSS {before} kB -> {during} kB; refused: unknown_source {}, \
         auth_failures {}, bad_handshakes {}, rate_limited {}, cookies_sent {}, handshakes_answered {}",
        r.received,
        g["unknown_source"],
        l["auth_failures"],
        l["bad_handshakes"],
        l["rate_limited"],
        l["cookies_sent"],
        l["handshakes_answered"]
    );
    assert!(r.received >= 48, "ping loss over 5 % under the flood: {r:?}");
    assert!(during < before + 16 * 1024, "vnetd grew from {before} kB to {during} kB");
    assert!(l["auth_failures"].as_u64().unwrap() > 1000, "{l}");
    // Valid-looking initiations: a cookie each, a Diffie-Hellman only for
    // the 20 a second of the budget.
    assert!(l["cookies_sent"].as_u64().unwrap() > 1000, "{l}");
    assert!(l["bad_handshakes"].as_u64().unwrap() <= 20 * 25, "{l}");
    assert!(l["handshakes_answered"].as_u64().unwrap() <= 20 * 25, "{l}");
    // And the link still works afterwards.
    assert_ping(&lab, &a, b.ip, 56);
}

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
    std::thread::sleep(Duration::from_secs(3));
    let p = vnet_lab::PingResult::parse(&std::fs::read_to_string(&out).unwrap_or_default());
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

/// Sends `vnet` datagrams built by hand (raw IP) from host 1 to host 0, each
/// carrying one whole frame from VM B to VM A with a UDP payload naming
/// the case: `good`, `wrongdst` (to another address of host 0), `shortlen`
/// (a UDP length 10 bytes short of the datagram).
const FORGE: &str = r#"
import socket, struct, sys
src, dst, other, amac, bmac, aip, bip = sys.argv[1:8]
def csum(b):
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b)); s = (s >> 16) + (s & 0xffff); s += s >> 16
    return (~s) & 0xffff
def inner(tag):
    data = tag.encode()
    udp = struct.pack('!HHHH', 5555, 7777, 8 + len(data), 0) + data
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, socket.inet_aton(bip), socket.inet_aton(aip))
    ip = ip[:10] + struct.pack('!H', csum(ip)) + ip[12:]
    return bytes.fromhex(amac.replace(':', '')) + bytes.fromhex(bmac.replace(':', '')) + b'\x08\x00' + ip + udp
def send(to, tag, delta=0, flags=4, network=0):
    payload = struct.pack('!BBHIIII', 1, flags, 20, network, 0, 0, 0) + inner('mark-' + tag)
    udp = struct.pack('!HHHH', 40000, 9000, 8 + len(payload) + delta, 0) + payload
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0, socket.inet_aton(src), socket.inet_aton(to))
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    s.sendto(ip + udp, (to, 0))
for _ in range(3):
    send(dst, 'good'); send(other, 'wrongdst'); send(dst, 'shortlen', -10)
    send(dst, 'wrongnet', network=7); send(dst, 'authflag', flags=4 | 1)
"#;

/// Sends, from argv[1] to argv[2]:9000, `vnet` datagrams whose inner
/// IPv4 length lies (0, 0xffff, 100 too long), one batch of four through
/// UDP segmentation (a GSO packet on the veth) whose first inner length is
/// 0, and three honest ones (`good`).
const INNER_LIE: &str = r#"
import socket, struct, sys
src, dst, amac, bmac, aip, bip = sys.argv[1:7]
def csum(b):
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b)); s = (s >> 16) + (s & 0xffff); s += s >> 16
    return (~s) & 0xffff
def frame(tag, lie=None):
    data = ('mark-' + tag).ljust(32).encode()
    udp = struct.pack('!HHHH', 5555, 7777, 8 + len(data), 0) + data
    tot = 20 + len(udp) if lie is None else lie
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, tot, 1, 0, 64, 17, 0, socket.inet_aton(bip), socket.inet_aton(aip))
    ip = ip[:10] + struct.pack('!H', csum(ip)) + ip[12:]
    return bytes.fromhex(amac.replace(':', '')) + bytes.fromhex(bmac.replace(':', '')) + b'\x08\x00' + ip + udp
def vnet(f):
    return struct.pack('!BBHIIII', 1, 4, 20, 0, 0, 0, 0) + f
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((src, 0))
for tag, lie in [('innerzero', 0), ('innerffff', 0xffff), ('innerlong', 200)]:
    s.sendto(vnet(frame(tag, lie)), (dst, 9000))
segs = [vnet(frame('gsozero', 0))] + [vnet(frame('gsorest')) for _ in range(3)]
g = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); g.bind((src, 0))
g.setsockopt(socket.SOL_UDP, 103, len(segs[0]))  # UDP_SEGMENT
g.sendto(b''.join(segs), (dst, 9000))
for _ in range(3):
    s.sendto(vnet(frame('good')), (dst, 9000))
"#;

/// Prints every UDP payload that reaches port 7777 for argv[1] seconds into argv[2].
const CATCH: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', 7777)); s.settimeout(0.2)
out = open(sys.argv[2], 'w'); end = time.time() + float(sys.argv[1])
while time.time() < end:
    try:
        d, _ = s.recvfrom(2000); out.write(d.decode(errors='replace') + '\n'); out.flush()
    except socket.timeout:
        pass
"#;

/// Runs [`CATCH`] in `vm` while `python3 script ARGS` (the script's text)
/// runs in namespace `from`, and returns every payload that reached the
/// VM's UDP port 7777 within 3 s.
fn forge_and_catch(lab: &mut Lab, vm: &Vm, from: &str, script: &str, args: &[&str]) -> String {
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (forge, catch, caught) = (
        lab.dir.join(format!("forge{n}.py")),
        lab.dir.join(format!("catch{n}.py")),
        lab.dir.join(format!("caught{n}.txt")),
    );
    std::fs::write(&forge, script).unwrap();
    std::fs::write(&catch, CATCH).unwrap();
    lab.spawn(&vm.ns, &["python3", catch.to_str().unwrap(), "3", caught.to_str().unwrap()]).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let mut cmd = vec!["python3", forge.to_str().unwrap()];
    cmd.extend_from_slice(args);
    let sent = lab.ns_exec(from, &cmd).unwrap();
    assert!(sent.status.success(), "{sent:?}");
    std::thread::sleep(Duration::from_secs(3));
    std::fs::read_to_string(&caught).unwrap_or_default()
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn datagrams_whose_outer_headers_lie_deliver_nothing_on_either_path() {
    let mut lab = lab(Spec { format: Format::Vnet, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    let h = |i: usize| (lab.hosts[i].ns.clone(), lab.hosts[i].underlay_dev.clone(), lab.hosts[i].underlay_ip);
    let ((ns0, dev0, ip0), (ns1, dev1, ip1)) = (h(0), h(1));
    // A second address of host 0 that vnetd does not listen on.
    let other = "10.77.0.99";
    let out = lab.ns_exec(&ns0, &["ip", "addr", "add", &format!("{other}/32"), "dev", &dev0]).unwrap();
    assert!(out.status.success(), "{out:?}");
    lab.ns_exec(&ns1, &["ip", "route", "add", other, "dev", &dev1]).unwrap();
    let (forge, catch, caught) =
        (lab.dir.join("forge.py"), lab.dir.join("catch.py"), lab.dir.join("caught.txt"));
    std::fs::write(&forge, FORGE).unwrap();
    std::fs::write(&catch, CATCH).unwrap();
    lab.spawn(&a.ns, &["python3", catch.to_str().unwrap(), "4", caught.to_str().unwrap()]).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let g0 = json(&lab, 0, "stats")["global"].clone();
    let (src, dst) = (ip1.to_string(), ip0.to_string());
    let args =
        [forge.to_str().unwrap(), &src, &dst, other, &a.mac, &b.mac, &a.ip.to_string(), &b.ip.to_string()];
    let mut cmd = vec!["python3"];
    cmd.extend_from_slice(&args);
    let sent = lab.ns_exec(&ns1, &cmd).unwrap();
    assert!(sent.status.success(), "{sent:?}");
    std::thread::sleep(Duration::from_secs(4));
    let got = std::fs::read_to_string(&caught).unwrap_or_default();
    assert!(got.contains("mark-good"), "the well-formed datagrams did not arrive: {got:?}\n{}", lab.log(0));
    assert!(
        !got.contains("mark-wrongdst"),
        "a datagram to an address vnetd does not listen on was delivered"
    );
    assert!(!got.contains("mark-shortlen"), "a datagram with a lying UDP length was delivered whole");
    // Another network's datagrams and the reserved AUTH flag (no tag
    // follows: a v1 reader must not take it for a plain frame) are
    // refused and counted, on both paths (the kernel's passes them up).
    assert!(!got.contains("mark-wrongnet"), "a datagram of another network was delivered");
    assert!(!got.contains("mark-authflag"), "a datagram flagged AUTH was delivered");
    let g = json(&lab, 0, "stats")["global"].clone();
    let moved = |k: &str| g[k].as_u64().unwrap_or(0) - g0[k].as_u64().unwrap_or(0);
    assert_eq!((moved("wrong_network"), moved("unsupported_flags")), (3, 3), "{g}");
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_unicast_spoofed_to_one_host_for_another_hosts_vm_is_not_forwarded_on_either_path() {
    // Finding 4 of the security review: a unicast frame for C's VM, sent in
    // a datagram to B from the address of B's peer A (a raw, VXLAN or
    // unsecured link: anyone who can spoof A), was forwarded by B onto its
    // link to C (sealed as B's own when that link is encrypted). Split
    // horizon: a frame from a link goes to local interfaces only.
    let mut lab = lab(Spec { hosts: 3, format: Format::Vnet, ..Spec::default() });
    let (a, c) = (lab.vm(0, 0).clone(), lab.vm(2, 0).clone());
    assert_ping(&lab, &a, c.ip, 56);
    let ip = |i: usize| lab.hosts[i].underlay_ip.to_string();
    let (ip0, ip1, ip2) = (ip(0), ip(1), ip(2));
    let ns0 = lab.hosts[0].ns.clone();
    // Frames for C's VM (its MAC and address) in `vnet` datagrams from A's
    // underlay address, sent to `to`; C's VM prints what reaches it.
    let (cip, aip) = (c.ip.to_string(), a.ip.to_string());
    let send_and_catch = |lab: &mut Lab, to: &str| {
        forge_and_catch(lab, &c, &ns0, FORGE, &[&ip0, to, to, &c.mac, &a.mac, &cip, &aip])
    };
    let before = json(&lab, 1, "links")["links"].to_string();
    let via_b = send_and_catch(&mut lab, &ip1);
    assert!(
        !via_b.contains("mark-"),
        "host B forwarded a unicast from its link to A onto its link to C: {via_b:?}\nB's links before {before}\nafter {}",
        json(&lab, 1, "links")["links"]
    );
    // The same datagrams sent to C itself are delivered: the catch works.
    let direct = send_and_catch(&mut lab, &ip2);
    assert!(direct.contains("mark-good"), "the datagrams sent to C directly did not arrive: {direct:?}");
    assert_ping(&lab, &a, c.ip, 56);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_datagram_with_a_peers_address_on_another_device_is_left_to_rp_filter_on_either_path() {
    // Finding 7 of the security review: the kernel path's `vnet_from_wire`
    // runs at TC ingress, before reverse-path filtering and netfilter, and
    // took a datagram from a peer's address on any device it is attached
    // to. Host B here has a second link whose route leaves by another
    // device (`sp0`, to a namespace S), so the program runs there too, and
    // strict rp_filter: a datagram with A's source address arriving from S
    // must not reach B's VM (the stack drops it: A is reached by `u1`).
    let mut lab = lab(Spec { format: Format::Vnet, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    let (ns0, ns1) = (lab.hosts[0].ns.clone(), lab.hosts[1].ns.clone());
    let (ip0, ip1) = (lab.hosts[0].underlay_ip.to_string(), lab.hosts[1].underlay_ip.to_string());
    let s = format!("{}-spoof", lab.prefix);
    let s = lab.add_ns(s).unwrap();
    vnet_lab::run(&[
        "ip", "link", "add", "sp0", "netns", &ns1, "type", "veth", "peer", "name", "sp1", "netns", &s,
    ])
    .unwrap();
    for (ns, dev, addr) in [(&ns1, "sp0", "10.99.0.1/24"), (&s, "sp1", "10.99.0.2/24")] {
        lab.ns_exec(ns, &["ip", "addr", "add", addr, "dev", dev]).unwrap();
        lab.ns_exec(ns, &["ip", "link", "set", dev, "up"]).unwrap();
    }
    lab.ns_exec(&s, &["ip", "route", "add", &ip1, "dev", "sp1"]).unwrap();
    for k in ["all", "default", "sp0"] {
        lab.ns_exec(&ns1, &["sysctl", "-q", "-w", &format!("net.ipv4.conf.{k}.rp_filter=1")]).unwrap();
    }
    // B's second link, by sp0: on the kernel path its device gets the program.
    lab.apply(1, "link d udp 10.99.0.2:9000 format vnet\n").unwrap();
    let d = &json(&lab, 1, "links")["links"][1];
    if std::env::var("VNET_LAB_DATAPATH").as_deref() == Ok("kernel") {
        assert_eq!(
            d["datapath"], "kernel",
            "the second link must be the kernel's, for its device to get the program: {d}"
        );
    }
    // Frames for B's VM in `vnet` datagrams from A's address to B's, sent
    // from namespace `from`; B's VM prints what reaches it.
    let (bip, aip) = (b.ip.to_string(), a.ip.to_string());
    let send_and_catch = |lab: &mut Lab, from: &str| {
        forge_and_catch(lab, &b, from, FORGE, &[&ip0, &ip1, &ip1, &b.mac, &a.mac, &bip, &aip])
    };
    let spoofed = send_and_catch(&mut lab, &s);
    assert!(
        !spoofed.contains("mark-"),
        "a datagram with A's address from another device reached B's VM: {spoofed:?}"
    );
    let real = send_and_catch(&mut lab, &ns0);
    assert!(real.contains("mark-good"), "the same datagrams from A itself did not arrive: {real:?}");
    assert_ping(&lab, &a, b.ip, 56);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn datagrams_whose_inner_length_lies_are_left_to_the_user_path() {
    // Finding 7: the kernel path skipped the inner length check on GSO (or
    // GRO-merged) packets and took an inner length of 0 or 0xffff. Now
    // such a packet, and any datagram whose inner IP length is not its
    // frame's, is the user path's: the kernel decapsulates only honest ones.
    let mut lab = lab(Spec { format: Format::Vnet, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    let (ns0, ip0, ip1) =
        (lab.hosts[0].ns.clone(), lab.hosts[0].underlay_ip.to_string(), lab.hosts[1].underlay_ip.to_string());
    // The user path's share of what came in on the link (the link's
    // receive counters hold both paths'; `kernel_rx_packets` the kernel's).
    let user_rx = |lab: &Lab| {
        let l = link_json(lab, 1);
        l["rx_packets"].as_u64().unwrap() - l["kernel_rx_packets"].as_u64().unwrap_or(0)
    };
    let (before, kernel_before) = (user_rx(&lab), link_json(&lab, 1)["kernel_rx_packets"].as_u64());
    let (bip, aip) = (b.ip.to_string(), a.ip.to_string());
    let got = forge_and_catch(&mut lab, &b, &ns0, INNER_LIE, &[&ip0, &ip1, &b.mac, &a.mac, &bip, &aip]);
    assert_eq!(got.matches("mark-good").count(), 3, "the honest datagrams: {got:?}");
    for tag in ["innerzero", "innerffff", "innerlong", "gsozero"] {
        assert!(
            !got.contains(&format!("mark-{tag}")),
            "a datagram whose inner length lies was delivered: {got:?}"
        );
    }
    // The four lying ones (three datagrams and the GSO batch's first, or
    // the whole batch when it arrived as one GSO packet) went to the user
    // path; on the kernel pass the kernel took honest ones only.
    let (user, kernel) = (user_rx(&lab) - before, link_json(&lab, 1)["kernel_rx_packets"].as_u64());
    eprintln!("inner length lies: user path took {user} datagrams, the kernel {kernel:?} (before {kernel_before:?})");
    assert!(user >= 4, "the user path took {user} of the link's datagrams: a lying one was the kernel's");
    assert_ping(&lab, &a, b.ip, 56);
}

/// The first line of a guest's console with `prefix`, from it on, waited for
/// up to `secs` seconds.
fn console_line(vm: &Vm, prefix: &str, secs: u64) -> String {
    let console = vm.console.as_deref().expect("a QEMU guest");
    vnet_lab::console_line(console, prefix, Duration::from_secs(secs)).unwrap_or_else(|e| panic!("{e}"))
}

/// A QEMU guest (TCG) on host A, on a TAP QEMU holds or on a vhost-user
/// socket vnetd serves; a namespace VM on host B. Both with MTU `mtu` over
/// a 1500-byte underlay: vnet splits the large frames. Ping small and
/// `big`, then 8 MB over TCP to the guest, checked by md5 on the guest's
/// console.
fn qemu_guest_talks_to_namespace_vm(mtu: u32, big: u32, vhost: bool, queues: u32) {
    // With several queue pairs, place them: pair p on the p-th CPU given.
    let cpus: Vec<String> = vnetd::sys::allowed_cpus()
        .unwrap()
        .iter()
        .rev()
        .take(queues as usize)
        .map(|c| c.to_string())
        .collect();
    let place = vhost && queues > 1;
    let vnetd_args = if place { vec!["--worker-cpus".into(), cpus.join(",")] } else { Vec::new() };
    let lab = lab(Spec {
        qemu_hosts: vec![0],
        qemu_vhost: vhost,
        qemu_queues: queues,
        vm_mtu: mtu,
        vnetd_args,
        ..Spec::default()
    });
    let (guest, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &b, guest.ip, 56);
    assert_ping(&lab, &b, guest.ip, big);
    let data = lab.dir.join("payload");
    let bytes: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&data, &bytes).unwrap();
    let sum = lab.ns_output(&b.ns, &["md5sum", data.to_str().unwrap()]).unwrap();
    let want = String::from_utf8_lossy(&sum.stdout).split_whitespace().next().unwrap_or("").to_string();
    let script = format!("busybox nc {} 5001 < {}", guest.ip, data.display());
    let out = lab.ns_output(&b.ns, &["timeout", "120", "sh", "-c", &script]).unwrap();
    assert!(out.status.success(), "{out:?}");
    let line = console_line(&guest, "VNET-MD5 ", 60);
    assert_eq!(line, format!("VNET-MD5 {want} {}", 8u32 << 20), "guest console: {line}");
    // Frames larger than the underlay crossed as vnet fragments.
    let g = json(&lab, 1, "stats")["global"].clone();
    assert!(g["reasm_completed"].as_u64().unwrap() > 0, "{g}");
    if vhost {
        let i = json(&lab, 0, "interfaces")["interfaces"][0].clone();
        assert_eq!(
            (i["kind"].as_str(), i["queues"].as_u64()),
            (Some("vhost-user"), Some(queues.into())),
            "{i}"
        );
        if queues > 1 {
            assert_ne!(i["vhost_features"].as_u64().unwrap() & 1 << 22, 0, "the guest took multiqueue: {i}");
        }
        // Per-pair counters: one entry per pair, adding up to the frames.
        let sum = |k: &str| -> (usize, u64) {
            let a = i[k].as_array().unwrap();
            (a.len(), a.iter().filter_map(|n| n.as_u64()).sum())
        };
        let ((rxn, rx), (txn, tx)) = (sum("pair_rx_frames"), sum("pair_tx_frames"));
        assert_eq!((rxn, txn), (queues as usize, queues as usize), "{i}");
        assert_eq!(rx, i["tx_packets"].as_u64().unwrap(), "frames placed in the RX rings: {i}");
        assert!(tx >= i["rx_packets"].as_u64().unwrap(), "chains taken from the TX rings: {i}");
        if place {
            // Each pair thread placed itself at its first event (the
            // adaptive tick reaches every pair, busy or not).
            let mut on = thread_cpus(lab.vnetd_pid(0).unwrap(), "vring_worker");
            on.sort();
            let mut want: Vec<String> = (0..queues as usize).map(|p| cpus[p % cpus.len()].clone()).collect();
            want.sort();
            assert_eq!(on, want, "vhost pair threads' CPUs");
        }
        assert_eq!(i["offload"], true, "the guest took the RX offloads: {i}");
        assert!(i["tx_bytes"].as_u64().unwrap() > 8 << 20 && i["rx_packets"].as_u64().unwrap() > 10, "{i}");
        assert_eq!(i["bad_chains"], 0, "{i}");
        // The guest's larger frames (the echo replies) went to the link
        // from its TX buffers (cut-through), not through a frame buffer.
        assert!(i["cut_through"].as_u64().unwrap() > 0, "{i}");
    }
}

#[test]
#[ignore = "needs root, network namespaces and qemu-system-x86: run with --ignored"]
fn qemu_guest_on_tap_mtu_9000_talks_to_namespace_vm() {
    qemu_guest_talks_to_namespace_vm(9000, 8000, false, 1);
}

#[test]
#[ignore = "needs root, network namespaces and qemu-system-x86: run with --ignored"]
fn qemu_guest_on_tap_mtu_64000_talks_to_namespace_vm() {
    qemu_guest_talks_to_namespace_vm(64_000, 60_000, false, 1);
}

#[test]
#[ignore = "needs root, network namespaces and qemu-system-x86: run with --ignored"]
fn qemu_guest_on_vhost_user_mtu_9000_with_two_queue_pairs_talks_to_namespace_vm() {
    qemu_guest_talks_to_namespace_vm(9000, 8000, true, 2);
}

#[test]
#[ignore = "needs root, network namespaces and qemu-system-x86: run with --ignored"]
fn qemu_guest_on_vhost_user_mtu_64000_talks_to_namespace_vm() {
    qemu_guest_talks_to_namespace_vm(64_000, 60_000, true, 1);
}

/// The paper's dispatch modes on a vhost-user guest's rings: the guest
/// answers a flood ping from a namespace VM (about 10000 frames/s under
/// TCG). `notify` takes a kick per burst and never switches; `poll` keeps
/// kicks suppressed while it polls (far fewer kicks for the same frames);
/// `adaptive` switches to polling under the flood and back when it ends.
/// Optimistic interrupts: the guest is signalled for the first frame of a
/// burst and at its end, and EVENT_IDX suppresses the rest.
#[test]
#[ignore = "needs root, network namespaces and qemu-system-x86: run with --ignored"]
fn vhost_user_dispatch_modes_show_in_the_ring_counters() {
    let mut kicks = Vec::new();
    for mode in ["notify", "poll", "adaptive"] {
        let lab = lab(Spec {
            qemu_hosts: vec![0],
            qemu_vhost: true,
            dispatch: Some(mode.into()),
            ..Spec::default()
        });
        let (guest, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &b, guest.ip, 56);
        let ip = guest.ip.to_string();
        let out =
            lab.ns_output(&b.ns, &["ping", "-q", "-f", "-l", "64", "-c", "20000", "-s", "16", &ip]).unwrap();
        assert!(out.status.success(), "{out:?}");
        let i = json(&lab, 0, "interfaces")["interfaces"][0].clone();
        let n = |k: &str| i[k].as_u64().unwrap();
        assert!(n("rx_packets") >= 20_000 && n("tx_packets") >= 20_000, "{mode}: {i}");
        assert!(n("early_signals") > 0 && n("signals_suppressed") > 0, "{mode}: {i}");
        match mode {
            "notify" => assert_eq!((n("mode_switches"), i["dispatch"].as_str()), (0, Some("notify")), "{i}"),
            "poll" => assert_eq!((n("mode_switches"), i["dispatch"].as_str()), (0, Some("poll")), "{i}"),
            _ => {
                assert!(n("mode_switches") >= 1, "adaptive did not switch under the flood: {i}");
                std::thread::sleep(Duration::from_millis(500));
                let i = json(&lab, 0, "interfaces")["interfaces"][0].clone();
                assert_eq!(i["dispatch"], "notify", "adaptive did not go back when idle: {i}");
                assert!(i["mode_switches"].as_u64().unwrap() >= 2, "{i}");
            }
        }
        eprintln!("{mode}: {} kicks for {} frames from the guest", n("kicks"), n("rx_packets"));
        kicks.push(n("kicks"));
    }
    assert!(kicks[1] * 3 < kicks[0], "polling did not suppress kicks: notify {} poll {}", kicks[0], kicks[1]);
}

/// Two QEMU guests, each on a vhost-user socket its host's vnetd serves (or
/// on a TAP QEMU holds): ARP and ping both ways, 64 MB guest to guest over
/// TCP (busybox nc) with matching md5s, the interface counters; then QEMU
/// on host B is killed and started again on the same socket (or TAP):
/// vnetd serves the new guest and traffic resumes.
fn two_guests_talk_and_survive_a_qemu_restart(vhost: bool) {
    let (ip0, ip1) = (vnet_lab::vm_ip(0, 0), vnet_lab::vm_ip(1, 0));
    let mut lab = lab(Spec {
        qemu_hosts: vec![0, 1],
        qemu_vhost: vhost,
        guest_args: vec![
            (0, format!("vnet_peer={ip1} vnet_ping=1")),
            (1, format!("vnet_peer={ip0} vnet_ping=1 vnet_send_mb=64")),
        ],
        ..Spec::default()
    });
    let (g0, g1) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_eq!(console_line(&g0, "VNET-PING ", 120), format!("VNET-PING {ip1} 5"));
    assert_eq!(console_line(&g1, "VNET-PING ", 120), format!("VNET-PING {ip0} 5"));
    let sent = console_line(&g1, "VNET-TX-MD5 ", 180);
    let got = console_line(&g0, "VNET-MD5 ", 300);
    assert_eq!(got["VNET-MD5 ".len()..], sent["VNET-TX-MD5 ".len()..], "sent {sent}, received {got}");
    assert!(got.ends_with(&format!(" {}", 64u32 << 20)), "{got}");
    for h in 0..2 {
        let i = json(&lab, h, "interfaces")["interfaces"][0].clone();
        assert!(i["rx_bytes"].as_u64().unwrap() > 0 && i["tx_bytes"].as_u64().unwrap() > 0, "{i}");
        if vhost {
            assert_eq!(
                (i["kind"].as_str(), i["vhost_connected"].as_u64()),
                (Some("vhost-user"), Some(1)),
                "{i}"
            );
            for k in ["kicks", "signals", "early_signals"] {
                assert!(i[k].as_u64().unwrap() > 0, "{k}: {i}");
            }
            assert_eq!(i["bad_chains"], 0, "{i}");
        }
    }
    lab.restart_guest(1, &format!("vnet_peer={ip0} vnet_ping=1")).unwrap();
    assert_eq!(console_line(&g1, "VNET-PING ", 120), format!("VNET-PING {ip0} 5"));
    if vhost {
        let i = json(&lab, 1, "interfaces")["interfaces"][0].clone();
        assert_eq!(
            (i["vhost_connected"].as_u64(), i["vhost_connections"].as_u64()),
            (Some(1), Some(2)),
            "{i}"
        );
    }
}

#[test]
#[ignore = "needs root, network namespaces and qemu-system-x86: run with --ignored"]
fn qemu_guests_on_vhost_user_talk_and_survive_a_qemu_restart() {
    two_guests_talk_and_survive_a_qemu_restart(true);
}

#[test]
#[ignore = "needs root, network namespaces and qemu-system-x86: run with --ignored"]
fn qemu_guests_on_tap_talk_and_survive_a_qemu_restart() {
    two_guests_talk_and_survive_a_qemu_restart(false);
}

/// The paper's location independence: VM B moves from host 1 to host 2
/// while VM A on host 0 pings it every 20 ms and streams TCP to it. A few
/// pings may be lost; the TCP connection must not break.
/// Moves VM 0 of host 1 to host 2 (`Lab::relocate`) under traffic (see
/// [`under_traffic`]); `after` runs right after the move, with the VM's
/// new index. Returns the ping output, the bytes the stream delivered and
/// the new index.
fn relocate_under_traffic(
    lab: &mut Lab,
    every_ms: u32,
    count: u32,
    after: impl FnOnce(&Lab, usize),
) -> (String, u64, usize) {
    let mac = lab.vm(1, 0).mac.clone();
    let mut v = 0;
    let (ping, got) = under_traffic(lab, every_ms, count, |lab| {
        v = lab.relocate(1, 0, 2).unwrap();
        assert_eq!(lab.vm(2, v).mac, mac);
        after(lab, v);
    });
    (ping, got, v)
}

/// Runs `during` 2 s into traffic from VM 0 of host 0 to VM 0 of host 1:
/// a ping every `every_ms` (`count` pings) and a TCP stream (iperf3, 6 s at
/// 200 Mbit/s). Returns the ping output and the bytes the stream delivered,
/// asserting that it survived.
fn under_traffic(lab: &mut Lab, every_ms: u32, count: u32, during: impl FnOnce(&mut Lab)) -> (String, u64) {
    under_traffic_for(lab, every_ms, count, 6, during)
}

/// [`under_traffic`] with a stream of `secs` seconds.
fn under_traffic_for(
    lab: &mut Lab,
    every_ms: u32,
    count: u32,
    secs: u32,
    during: impl FnOnce(&mut Lab),
) -> (String, u64) {
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(lab, &a, b.ip, 56);
    lab.spawn(&b.ns, &["iperf3", "-s", "-1", "-B", &b.ip.to_string()]).unwrap();
    lab.wait_listening(&b.ns, 5201).unwrap();
    let (ns, ip) = (a.ns.as_str(), b.ip.to_string());
    let (every, count) = (format!("{}", every_ms as f64 / 1000.0), count.to_string());
    let ping = in_background(ns, &["ping", "-n", "-i", &every, "-c", &count, "-W", "1", &ip]);
    let tcp = in_background(ns, &["iperf3", "-c", &ip, "-t", &secs.to_string(), "-b", "200M", "-J"]);
    std::thread::sleep(Duration::from_millis(2000));
    during(lab);
    let ping = ping.join().unwrap();
    let tcp = tcp.join().unwrap();
    let j: serde_json::Value = serde_json::from_slice(&tcp.stdout).unwrap_or_default();
    assert!(
        tcp.status.success() && j.get("error").is_none(),
        "the TCP stream broke: {}",
        String::from_utf8_lossy(&tcp.stdout)
    );
    let got = j["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
    let intervals: Vec<f64> = j["intervals"]
        .as_array()
        .map(|a| a.iter().filter_map(|i| i["sum"]["bits_per_second"].as_f64()).map(|b| b / 1e6).collect())
        .unwrap_or_default();
    eprintln!("the TCP stream received {got} bytes; Mbit/s each second {intervals:.0?}");
    assert!(got > 1_000_000, "the stream delivered {got} bytes");
    (String::from_utf8_lossy(&ping.stdout).to_string(), got)
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
    assert!(gap * 10 < 2000, "traffic resumed {} ms after the kill", gap * 10);
    // The restarted vnetd adopted the VM's persistent TAP (or its veth) as
    // it was: same device, same index, the VM's address still on it.
    let a = lab.vm(0, 0).clone();
    let addr = lab.ns_exec(&a.ns, &["ip", "-o", "addr", "show", "dev", &a.dev]).unwrap();
    let addr = String::from_utf8_lossy(&addr.stdout).to_string();
    assert!(addr.contains(&format!("{}/", a.ip)), "the VM's address is gone: {addr}");
    assert_eq!(json(&lab, 0, "interfaces")["interfaces"][0]["device"], "present");
}

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
    let readers = json(&lab, 0, "stats")["global"]["link_reader_messages"].as_array().map_or(0, |a| a.len());
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
    // After the last one: nothing of the hand-overs is left pinned.
    let left = std::fs::read_dir(lab.dir.join("bpf/h0/v1")).map_or(0, |d| d.count());
    assert_eq!(left, 0, "pins left after the last take-over");
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
}

/// What a run of hand-overs under traffic measured.
struct HandOvers {
    lost: u32,
    empty: usize,
    intervals: Vec<f64>,
    /// Control requests (one every 2 ms, each on a new connection) that
    /// failed over the hand-overs, with the first error.
    refused: (usize, Option<String>),
}

/// VM A (host 0) pings VM B (host 1) every 10 ms and sends it an iperf3
/// stream at 200 Mbit/s while host 0's vnetd hands over `n` times, 400 ms
/// apart (`before(lab, k)` runs before the k-th: an upgrade changes the
/// binary). Asserts the stream survived; reports and returns the loss.
fn hand_overs_under_traffic(lab: &mut Lab, n: usize, mut before: impl FnMut(&mut Lab, usize)) -> HandOvers {
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(lab, &a, b.ip, 56);
    assert_ping(lab, &b, a.ip, 56);
    lab.spawn(&b.ns, &["iperf3", "-s", "-1", "-B", &b.ip.to_string()]).unwrap();
    lab.wait_listening(&b.ns, 5201).unwrap();
    let secs = (n as u64 * 500 + 4000) / 1000;
    let pings = secs as u32 * 100;
    let ip = b.ip.to_string();
    let ping = in_background(&a.ns, &["ping", "-n", "-i", "0.01", "-c", &pings.to_string(), "-W", "1", &ip]);
    let tcp = in_background(
        &a.ns,
        &["iperf3", "-c", &ip, "-t", &secs.to_string(), "-i", "0.1", "-b", "200M", "-J"],
    );
    std::thread::sleep(Duration::from_secs(2));
    // A client asking host 0's control endpoint all along: the listener is
    // handed over, so a request made while no vnetd runs waits and is
    // answered by the next one (it found no socket, or a refusal, before).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ep, stop2) = (lab.hosts[0].endpoint(), stop.clone());
    let asker = std::thread::spawn(move || {
        let (mut asked, mut refused, mut first) = (0usize, 0usize, None);
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            let r = vnetd::client::Client::connect(&ep).and_then(|mut c| c.request("show stats"));
            asked += 1;
            if let Err(e) = r {
                refused += 1;
                first.get_or_insert(e.to_string());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        (asked, refused, first)
    });
    let mut gaps = Vec::new();
    for k in 0..n {
        before(lab, k);
        gaps.push(lab.hand_over_vnetd(0).unwrap_or_else(|e| panic!("hand-over: {e}")).as_millis());
        std::thread::sleep(Duration::from_millis(400));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (asked, refused, first) = asker.join().unwrap();
    eprintln!("control: {refused} of {asked} requests failed across the hand-overs (first: {first:?})");
    let out = String::from_utf8_lossy(&ping.join().unwrap().stdout).to_string();
    let tcp = tcp.join().unwrap();
    let j: serde_json::Value = serde_json::from_slice(&tcp.stdout).unwrap_or_default();
    assert!(
        tcp.status.success() && j.get("error").is_none(),
        "the stream broke: {}",
        String::from_utf8_lossy(&tcp.stdout)
    );
    let intervals: Vec<f64> = j["intervals"]
        .as_array()
        .map(|a| a.iter().filter_map(|i| i["sum"]["bytes"].as_f64()).collect())
        .unwrap_or_default();
    let empty = intervals.iter().filter(|b| **b == 0.0).count();
    let r = vnet_lab::PingResult::parse(&out);
    assert_eq!(r.sent, pings, "ping output not understood:\n{out}");
    let (lost, gap) = (r.sent - r.received, longest_gap(&out, r.sent));
    let kernel = lab.spec.datapath.as_deref() == Some("kernel");
    eprintln!(
        "hand-over x{n} ({} path): no vnetd answered for {gaps:?} ms; {lost} of {pings} pings lost (10 ms apart), \
         longest gap {gap}; {empty} of {} stream intervals (100 ms) empty",
        if kernel { "kernel" } else { "user" },
        intervals.len()
    );
    let log = lab.log(0);
    let said = ["hand-over", "took over", "anew"];
    for l in log.lines().filter(|l| said.iter().any(|w| l.contains(w))) {
        eprintln!("  h0: {l}");
    }
    let seqs = ping_seqs(&out);
    let missing: Vec<u32> = (1..=pings).filter(|s| seqs.binary_search(s).is_err()).collect();
    eprintln!("  pings lost: {missing:?}; stream bytes per 100 ms: {intervals:?}");
    assert!(intervals.len() as u64 >= secs * 10 - 5, "iperf3 said {} intervals", intervals.len());
    HandOvers { lost, empty, intervals, refused: (refused, first) }
}

/// Issue 30: an upgrade from the previous release's package to this one's
/// under a 10 ms ping and a TCP stream: host 0 runs the old package's
/// vnetd, hands over to the new package's (what the new package's
/// `postinst` asks of the unit), then the new one hands over to itself
/// (the next upgrade). Both packages are built by
/// `scripts/upgrade-test.sh`, which runs this with their paths in
/// `VNET_UPGRADE_FROM` and `VNET_UPGRADE_TO`.
#[test]
#[ignore = "needs root, namespaces and two packages: run by scripts/upgrade-test.sh"]
fn an_upgrade_from_the_previous_package_to_this_one_under_a_10ms_ping_and_a_tcp_stream() {
    let deb = |var: &str| {
        std::env::var(var)
            .unwrap_or_else(|_| panic!("{var}: the package's path (scripts/upgrade-test.sh sets it)"))
    };
    let (from, to) = (deb("VNET_UPGRADE_FROM"), deb("VNET_UPGRADE_TO"));
    /// The unpacked packages, removed however the test ends.
    struct Unpacked(std::path::PathBuf);
    impl Drop for Unpacked {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir = Unpacked(std::env::temp_dir().join(format!("vnet-upgrade-{}", std::process::id())));
    let unpack = |deb: &str, sub: &str| {
        let d = dir.0.join(sub);
        std::fs::create_dir_all(&d).unwrap();
        let ok = std::process::Command::new("dpkg-deb").args(["-x", deb]).arg(&d).status().unwrap().success();
        assert!(ok, "dpkg-deb -x {deb}");
        d.join("usr/sbin/vnetd")
    };
    let (old, new) = (unpack(&from, "old"), unpack(&to, "new"));
    let mut lab = lab(Spec { vnetd: Some(old), ..Spec::default() });
    let m = hand_overs_under_traffic(&mut lab, 2, |lab, k| {
        if k == 0 {
            lab.spec.vnetd = Some(new.clone());
        }
    });
    let log = lab.log(0);
    let kernel = lab.spec.datapath.as_deref() == Some("kernel");
    eprintln!("upgrade {from} -> {to}, then a hand-over: {} pings lost, {} empty intervals", m.lost, m.empty);
    if kernel {
        assert!(log.contains("took over the previous vnetd's program"), "no take-over:\n{log}");
        assert_eq!(m.lost, 0, "pings lost across the upgrade on the kernel path");
        assert_eq!(m.empty, 0, "the stream stalled 100 ms or more: {:?}", m.intervals);
    } else {
        // A vnetd older than the user path's hand-over gives no sockets:
        // that first step is a restart's gap, under 50 ms; the next one
        // hands them over.
        assert!(log.contains("hand-over: took"), "the second hand-over gave nothing:\n{log}");
        assert!(m.lost < 10, "{} pings (10 ms apart) lost over the upgrade and a hand-over", m.lost);
    }
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn relocating_a_vm_loses_a_handful_of_pings_and_no_connection() {
    relocation(Spec { hosts: 3, veth_hosts: vec![0, 1, 2], ..Spec::default() });
}

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

/// VM 0 of host 1 moves to host 2 under a 20 ms ping from host 0's VM and a
/// stream: a handful of pings lost, host 0 routes it to host 2, host 2
/// announced it.
fn relocation(spec: Spec) {
    let mut lab = lab(spec);
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    let (ping, _, _) = relocate_under_traffic(&mut lab, 20, 250, |_, _| {});
    let r = vnet_lab::PingResult::parse(&ping);
    let lost = r.sent - r.received;
    eprintln!("relocation: {lost} of {} pings lost (20 ms apart)", r.sent);
    assert_eq!(r.sent, 250, "ping output not understood:\n{ping}");
    // Measured: 2 lost (40 ms) on either path, IPv4 or IPv6. At most 5
    // (100 ms): the move's own gap twice over and one more; the old bound
    // (10, 200 ms) let a move that waited for an ARP retry pass.
    assert!(lost <= 5, "{lost} pings lost: {r:?}");
    // B now lives on host 2, and host 0 routes it there.
    let moved = lab.vm(2, 1).clone();
    assert_eq!(moved.mac, b.mac);
    assert_ping(&lab, &a, moved.ip, 56);
    let v = json(&lab, 0, "routes");
    let to =
        v["routes"].as_array().unwrap().iter().find(|r| r["dst"] == b.mac.as_str()).unwrap()["to"].clone();
    assert_eq!(to, "link h2");
    // The new host announced the MAC over both its links.
    let r = lab.control(2, &format!("announce {}", b.mac)).unwrap();
    assert_eq!(r.body.trim(), format!("announced {} to 2 of 2 links", b.mac));
}

/// The VM MTU that fits both a `vnet` link on the kernel path (62 bytes of
/// encapsulation) and a VXLAN link (50) over a 1500-byte underlay.
const MIXED_VM_MTU: u32 = 1500 - vnet_wire::vnet::IPV4_ENCAP_OVERHEAD as u32;

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn vnetd_and_a_linux_kernel_vtep_talk_both_ways() {
    // Host 0 runs vnetd with a `vxlan` link; host 1 is a Linux bridge with a
    // kernel vxlan device (VNI 42, port 4789, nolearning, static FDB).
    vtep_talks_both_ways(false);
}

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
    assert!(l["rx_packets"].as_u64().unwrap() > 1_000 && l["tx_packets"].as_u64().unwrap() > 1_000, "{l}");
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
    assert!(l["rx_packets"].as_u64().unwrap() > 1000, "{l}");
    assert_kernel_carried(&lab, 1);
}

/// The VM MTU that fits a `vnet` link (82 bytes of encapsulation) and a
/// VXLAN link (70) over a 1500-byte IPv6 underlay on the kernel path.
const V6_VM_MTU: u32 = 1500 - vnet_wire::vnet::IPV6_ENCAP_OVERHEAD as u32;

/// Host `h`'s underlay has no IPv4 address and its IPv6 one, and every
/// link's remote is an IPv6 address.
fn assert_ipv6_only(lab: &Lab, h: usize) {
    let host = &lab.hosts[h];
    let show =
        |args: &[&str]| String::from_utf8_lossy(&lab.ns_output(&host.ns, args).unwrap().stdout).to_string();
    let v4 = show(&["ip", "-4", "-o", "addr", "show", "dev", &host.underlay_dev]);
    assert!(v4.trim().is_empty(), "host {h}'s underlay has IPv4: {v4}");
    let v6 = show(&["ip", "-6", "-o", "addr", "show", "dev", &host.underlay_dev]);
    assert!(v6.contains(&host.underlay_ip.to_string()), "host {h}'s underlay: {v6}");
    for l in json(lab, h, "links")["links"].as_array().unwrap() {
        assert!(l["remote"].as_str().is_some_and(|r| r.starts_with('[')), "host {h}: {l}");
    }
}

/// Issue 31, roaming: mid-stream, host 1's underlay address is replaced
/// (a laptop changing networks); host 0's secured link follows it after
/// the first authenticated datagram from the new address, with no config
/// change, and traffic resumes within 2 s. Datagrams replayed or forged
/// from a third address, naming the live session, never move the link:
/// they are counted in `roams_refused`.
#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_secured_link_follows_its_peer_to_a_new_address_and_never_on_a_forgery() {
    let (mut lab, a, b) = roaming_lab();
    let (ns0, dev0) = (lab.hosts[0].ns.clone(), lab.hosts[0].underlay_dev.clone());
    let ns1 = lab.hosts[1].ns.clone();
    let (old, new, third) = ("10.77.0.2", "10.77.0.12", "10.77.0.99");
    const PINGS: u32 = 600;
    let (out, _) = under_traffic_for(&mut lab, 10, PINGS, 6, |lab| readdress(lab, 1, old, new));
    let (_, gap) = ping_gap("roaming", &out, PINGS);
    assert!(gap <= 200, "traffic stopped for {} ms after the move", gap * 10);
    let l = link_json(&lab, 0);
    assert_eq!(l["endpoint"], format!("{new}:9000"), "{l}");
    assert_eq!(l["remote"], format!("{old}:9000"), "the configured remote stays as written: {l}");
    assert!(l["roams"].as_u64().unwrap() >= 1, "{l}");
    assert!(lab.log(0).contains("the peer moved"), "host 0's log does not say the link moved");
    assert_ping(&lab, &a, b.ip, 1400);
    // A capture of host 1's datagrams from its new address, replayed and
    // tampered with from a third address: the link stays where it is.
    let pcap = lab.dir.join("roam.pcap");
    let pcap_s = pcap.to_str().unwrap().to_string();
    let filter = format!("udp and dst port 9000 and src host {new}");
    lab.spawn(&ns0, &["timeout", "3", "tcpdump", "-i", &dev0, "-U", "-s", "0", "-w", &pcap_s, &filter])
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    lab.ping(&b, a.ip, 5, 200).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let replay = lab.dir.join("replay.py");
    std::fs::write(&replay, REPLAY).unwrap();
    let before = link_json(&lab, 0);
    let refused = |lab: &Lab| json(lab, 0, "stats")["global"]["roams_refused"].as_u64().unwrap();
    let refused0 = refused(&lab);
    let mut sent = 0;
    for mode in ["replay", "tamper"] {
        let args = ["python3", replay.to_str().unwrap(), mode, &pcap_s, "10.77.0.1", third];
        let out = lab.ns_exec(&ns1, &args).unwrap();
        assert!(out.status.success(), "{out:?}");
        sent += String::from_utf8_lossy(&out.stdout).trim().parse::<u64>().unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = link_json(&lab, 0);
    assert!(sent >= 10, "{sent} datagrams sent");
    assert_eq!(after["endpoint"], format!("{new}:9000"), "a forgery moved the link: {after}");
    assert_eq!(after["roams"], before["roams"], "{after}");
    assert!(refused(&lab) - refused0 >= sent, "{} refused of {sent}", refused(&lab) - refused0);
    assert_ping(&lab, &a, b.ip, 56);
}

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

/// Two hosts with a secured link, host 1 (the one that moves) listening on
/// every address, and their VMs A and B, which ping.
fn roaming_lab() -> (Lab, Vm, Vm) {
    let lab = lab(Spec { links: Links::Encrypt, listen_any: vec![1], ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    (lab, a, b)
}

/// Host `h`'s underlay address `from` becomes `to` (a /24 each).
fn readdress(lab: &Lab, h: usize, from: &str, to: &str) {
    let (ns, dev) = (&lab.hosts[h].ns, &lab.hosts[h].underlay_dev);
    let (o, n) = (format!("{from}/24"), format!("{to}/24"));
    for c in [["ip", "addr", "del", &o, "dev", dev], ["ip", "addr", "add", &n, "dev", dev]] {
        assert!(lab.ns_exec(ns, &c).unwrap().status.success(), "{c:?}");
    }
}

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
    assert!(header.contains("security") && header.contains("cipher") && header.contains("path"), "{text}");
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

/// `count` pings of 56 bytes from `vm` to `ip`, 10 ms apart.
fn fast_ping(lab: &Lab, vm: &Vm, ip: Ipv4Addr, count: u32) -> vnet_lab::PingResult {
    let c = count.to_string();
    let out = lab
        .ns_output(&vm.ns, &["ping", "-n", "-q", "-c", &c, "-i", "0.01", "-W", "1", &ip.to_string()])
        .unwrap();
    vnet_lab::PingResult::parse(&String::from_utf8_lossy(&out.stdout))
}

/// What `tcpdump -l -n ARGS` prints in namespace `ns` within `secs`
/// seconds, while `during` runs (a second after the capture starts).
fn tcpdump_during(ns: &str, args: &[&str], secs: u32, during: impl FnOnce()) -> String {
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", ns, "timeout", &secs.to_string(), "tcpdump", "-l", "-n"]).args(args);
    let cap = std::thread::spawn(move || String::from_utf8_lossy(&cmd.output().unwrap().stdout).to_string());
    std::thread::sleep(Duration::from_millis(1000));
    during();
    cap.join().unwrap()
}

/// Host `h`'s link `name`, as `show links json` gives it.
fn link_named(lab: &Lab, h: usize, name: &str) -> serde_json::Value {
    json(lab, h, "links")["links"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == name)
        .cloned()
        .unwrap_or_default()
}

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
        link_named(&lab, 0, "h1")["established"] == true && link_named(&lab, 1, "h0")["established"] == true
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
    let seen = |h: usize, l: &str| link_named(&lab, h, l)["seen_as"].as_str().unwrap_or_default().to_string();
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
    let wire = tcpdump_during(&inet, &["-i", "br0", "udp"], 4, || p = Some(fast_ping(&lab, &a, b.ip, 100)));
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
        link_named(&lab, 1, "h3")["established"] == true && link_named(&lab, 3, "h1")["established"] == true
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

/// Issue 31: the VXLAN-over-IPv6 wire format interoperates with a Linux
/// VTEP (host 1: a bridge and a kernel vxlan device with `local` an IPv6
/// address), both ways, on either path.
#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn vnetd_and_a_linux_kernel_vtep_talk_both_ways_over_ipv6() {
    vtep_talks_both_ways(true);
}

/// On the kernel pass, host `h`'s eBPF programs encapsulated and
/// decapsulated the bulk of the traffic (VXLAN included), not the user
/// path; on the user pass, they carried nothing.
fn assert_kernel_carried(lab: &Lab, h: usize) {
    let g = json(lab, h, "stats")["global"].clone();
    let (encap, decap) = (g["kernel_encap"].as_u64().unwrap_or(0), g["kernel_decap"].as_u64().unwrap_or(0));
    if lab.spec.datapath.as_deref() == Some("kernel") {
        assert!(encap > 1000 && decap > 1000, "the kernel path carried {encap} out, {decap} in: {g}");
    } else {
        assert_eq!((encap, decap), (0, 0), "the kernel path carried frames on the user pass: {g}");
    }
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

fn link_json(lab: &Lab, h: usize) -> serde_json::Value {
    json(lab, h, "links")["links"][0].clone()
}

/// Two hosts on `links` (TCP or TLS): pings both ways and a 3 s TCP stream.
fn stream_lab(links: Links) -> (Lab, Vm, Vm) {
    let mut lab = lab(Spec { links, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    assert_ping(&lab, &b, a.ip, 1400);
    assert_stream(&mut lab, &a, &b, 3);
    (lab, a, b)
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
    assert_eq!(l["rx_packets"].as_u64().unwrap(), rx_before, "frames from the stranger were delivered: {l}");
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

/// The control endpoint (`tls:`, `--control-tls`): its files renewed with a
/// new CA and reloaded (SIGHUP) are what the next client's handshake sees:
/// a client of the new CA gets in, one of the old CA no longer does.
#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_tls_control_endpoints_renewed_certificate_is_served_after_a_reload() {
    let mut lab = lab(Spec::default());
    let (ns, ip) = (lab.hosts[0].ns.clone(), lab.hosts[0].underlay_ip);
    let dir = lab.dir.join("ctl");
    std::fs::create_dir_all(&dir).unwrap();
    let (old_ca, new_ca) =
        (vnet_lab::pki::Ca::new("old CA").unwrap(), vnet_lab::pki::Ca::new("new CA").unwrap());
    let server = old_ca.host(&dir, "server", ip).unwrap();
    let old_client = old_ca.host(&dir, "old-client", ip).unwrap();
    let conf = dir.join("v.conf");
    std::fs::write(&conf, format!("listen udp {ip}:9111\n")).unwrap();
    let files = |f: &vnet_lab::pki::HostFiles| -> [String; 3] {
        [f.cert.display().to_string(), f.key.display().to_string(), f.ca.display().to_string()]
    };
    let [cert, key, ca] = files(&server);
    let endpoint = format!("tls:{ip}:7443");
    let vnetd = vnet_lab::bin("vnetd").unwrap();
    let pid = lab
        .spawn(
            &ns,
            &[
                vnetd.to_str().unwrap(),
                "--config",
                conf.to_str().unwrap(),
                "--control",
                &endpoint,
                "--control-tls",
                &cert,
                &key,
                &ca,
                "--state-dir",
                dir.to_str().unwrap(),
            ],
        )
        .unwrap();
    lab.wait_listening(&ns, 7443).unwrap();
    let ask = |client: &vnet_lab::pki::HostFiles| {
        let vnetctl = vnet_lab::bin("vnetctl").unwrap();
        let [cert, key, ca] = files(client);
        lab.ns_output(
            &ns,
            &[vnetctl.to_str().unwrap(), "--control", &endpoint, "--tls", &cert, &key, &ca, "show", "config"],
        )
        .unwrap()
    };
    assert!(ask(&old_client).status.success(), "the first client: {:?}", ask(&old_client));
    // Renewed: the server's files now hold the new CA's certificate and CA.
    new_ca.host(&dir, "server", ip).unwrap();
    let new_client = new_ca.host(&dir, "new-client", ip).unwrap();
    lab.ns_exec(&ns, &["kill", "-HUP", &pid.to_string()]).unwrap();
    let t0 = std::time::Instant::now();
    while !ask(&new_client).status.success() {
        assert!(t0.elapsed() < Duration::from_secs(5), "the renewed endpoint refuses the new CA's client");
        std::thread::sleep(Duration::from_millis(100));
    }
    let old = ask(&old_client);
    assert!(!old.status.success(), "the old CA's client still got in: {old:?}");
}

/// The traffic matrix (issue 30): three hosts, three iperf3 flows of known
/// size between their VMs (one after the other); on each sender's host,
/// `show matrix` has the flow's pair with its bytes within 1 % of what
/// iperf3 sent (the frames' headers on top: a little more, never less),
/// the largest flow is the top pair, and the metrics carry it. Both data
/// paths (test.sh runs it on each).
#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn the_traffic_matrix_has_each_flows_pair_within_1_percent_of_what_iperf3_sent() {
    // TAPs vnetd serves (the user path), or with VNET_LAB_DATAPATH=kernel veths on the kernel path.
    let mut lab = lab(Spec { hosts: 3, ..Spec::default() });
    for (f, t) in [(0, 1), (1, 2), (2, 0)] {
        let (a, b) = (lab.vm(f, 0).clone(), lab.vm(t, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
    }
    let plan = [(0, 1, "300M"), (1, 2, "150M"), (2, 0, "60M")];
    let flows = lab.matrix_flows(&plan, 3).unwrap();
    let ms = lab.matrices().unwrap();
    for (f, (from, to, rate)) in flows.iter().zip(plan) {
        let got = vnet_lab::matrix::pair_bytes(&ms[from], &f.from.mac, &f.to.mac);
        let ratio = got as f64 / f.sent.max(1) as f64;
        eprintln!("matrix: h{from} -> h{to} at {rate}: iperf3 sent {} bytes, host {from} counted {got} ({ratio:.4})", f.sent);
        assert!(f.sent > 1_000_000, "the flow moved {} bytes", f.sent);
        // Measured 1.002 on both paths: the frames' headers (66 bytes) on
        // GSO frames of up to 64 KiB, and the warm-up pings. 1.01 leaves
        // 4x that; a flow counted twice, or its ACKs counted in its pair,
        // is far out of it (the ACKs are another pair, B -> A).
        assert!(
            (0.999..1.01).contains(&ratio),
            "h{from} -> h{to}: {got} bytes counted for {} sent\n{}",
            f.sent,
            ms[from]
        );
        // The receiving host counted it too (it forwarded those frames).
        let there = vnet_lab::matrix::pair_bytes(&ms[to], &f.from.mac, &f.to.mac) as f64 / f.sent as f64;
        assert!((0.999..1.01).contains(&there), "h{to} counted {there:.4} of the flow");
    }
    if lab.spec.datapath.as_deref() == Some("kernel") {
        // The programs, not the user path, carried (and counted) the flows.
        let g = json(&lab, 0, "stats")["global"].clone();
        assert!(g["kernel_encap_bytes"].as_u64().unwrap_or(0) > flows[0].sent, "{g}");
    }
    let top = &ms[0]["pairs"][0];
    assert_eq!(
        (top["src"].as_str(), top["dst"].as_str()),
        (Some(flows[0].from.mac.as_str()), Some(flows[0].to.mac.as_str())),
        "{}",
        ms[0]
    );
    assert_eq!(top["src_interface"], "vm0", "{top}");
    let text = lab.control(0, "show matrix").unwrap().body;
    eprintln!("{text}");
    assert!(text.contains(&format!("{} (vm0)", flows[0].from.mac)), "{text}");
    let metrics = lab.control(0, "show metrics").unwrap().body;
    let series = format!("vnet_matrix_bytes{{src=\"{}\",dst=\"{}\"}}", flows[0].from.mac, flows[0].to.mac);
    assert!(metrics.contains(&series), "no {series} in the metrics");
    assert!(metrics.lines().filter(|l| l.starts_with("vnet_matrix_bytes{")).count() <= 10);
}

/// Opens argv[3] connections to argv[1]:argv[2] and holds them for argv[4]
/// seconds; every other one sends a lone TLS record byte (a handshake that
/// never goes on). Writes how many connected to argv[5]: a socket whose
/// handshake completed (no pending error, a peer name), and for the even
/// ones whose byte was taken.
const SLOW_CONNECTIONS: &str = r#"
import resource, socket, sys, time
host, port, n, hold, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
resource.setrlimit(resource.RLIMIT_NOFILE, (n + 100, n + 100))
socks = []
for i in range(n):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex((host, port))
    socks.append(s)
time.sleep(1)
ok = 0
for i, s in enumerate(socks):
    try:
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
            continue
        s.getpeername()
        if i % 2 == 0 and s.send(b'\x16') != 1:
            continue
        ok += 1
    except OSError:
        pass
open(out, 'w').write(str(ok))
time.sleep(hold)
"#;

/// `Threads` and `VmRSS` (KiB) of process `pid`.
fn threads_and_rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    (field("Threads:"), field("VmRSS:"))
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn ten_thousand_slow_connections_from_the_peers_address_leave_vnetd_bounded_and_the_link_up() {
    // Review finding 8: a thread and a buffer per connection before any
    // authentication, no deadline on the TLS handshake, and the newest
    // connection from the peer's address displacing the real one.
    let (mut lab, a, b) = stream_lab(Links::Tls);
    let pid = lab.vnetd_pid(0).unwrap();
    let before = threads_and_rss(pid);
    let remote = link_json(&lab, 1)["remote"].as_str().unwrap().to_string();
    let (ip, port) = remote.rsplit_once(':').unwrap();
    let (script, count) = (lab.dir.join("slow.py"), lab.dir.join("slow.count"));
    std::fs::write(&script, SLOW_CONNECTIONS).unwrap();
    let ns1 = lab.hosts[1].ns.clone();
    let args = [script.to_str().unwrap(), ip, port, "10000", "10", count.to_str().unwrap()];
    lab.spawn(&ns1, &[&["python3"][..], &args[..]].concat()).unwrap();
    // While the connections are held (and for longer than the handshake
    // deadline), vnetd stays bounded and the real link carries traffic.
    let mut worst = before;
    for _ in 0..10 {
        std::thread::sleep(Duration::from_secs(1));
        let now = threads_and_rss(pid);
        worst = (worst.0.max(now.0), worst.1.max(now.1));
        assert_ping_quick(&lab, &a, b.ip);
    }
    let connected: u64 = std::fs::read_to_string(&count).unwrap_or_default().trim().parse().unwrap_or(0);
    assert!(connected >= 5000, "only {connected} connections made");
    assert!(worst.0 <= before.0 + 2, "threads went from {} to {}", before.0, worst.0);
    assert!(worst.1 <= before.1 + 30 * 1024, "RSS went from {} to {} KiB", before.1, worst.1);
    let l = link_json(&lab, 0);
    assert_eq!((l["state"].as_str(), l["inbound"].as_bool()), (Some("up"), Some(true)), "{l}");
    assert!(l["refused"].as_u64().unwrap() > 0, "{l}");
    assert_ping(&lab, &a, b.ip, 56);
    assert_ping(&lab, &b, a.ip, 56);
    eprintln!(
        "{connected} slow connections: threads {} -> {}, RSS {} -> {} KiB",
        before.0, worst.0, before.1, worst.1
    );
}

/// One ping that must be answered within a second.
fn assert_ping_quick(lab: &Lab, from: &Vm, to: Ipv4Addr) {
    let r = lab.ping(from, to, 1, 56).unwrap();
    assert_eq!(r.received, 1, "{} -> {to} lost a ping: {r:?}", from.ip);
}

/// Sends `mb` MiB of pseudo-random bytes over TCP from `from` to `to` (port
/// 7001) with Python on both ends; returns the two md5 sums.
fn tcp_md5(lab: &Lab, from: &Vm, to: &Vm, mb: u32) -> (String, String) {
    tcp_md5_ns(lab, &from.ns, &to.ns, &to.ip.to_string(), mb)
}

/// [`tcp_md5`] between namespaces `from` and `to` (which has `to_ip`).
fn tcp_md5_ns(lab: &Lab, from: &str, to: &str, to_ip: &str, mb: u32) -> (String, String) {
    let server = format!(
        "import socket,hashlib\n\
         s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('{}', 7001)); s.listen(1); s.settimeout(30); c,_=s.accept(); c.settimeout(30); h=hashlib.md5()\n\
         while True:\n    b=c.recv(1<<16)\n    if not b: break\n    h.update(b)\n\
         print(h.hexdigest())",
        to_ip
    );
    let client = format!(
        "import socket,hashlib,random,time\n\
         r=random.Random(7); h=hashlib.md5(); c=socket.socket()\n\
         for i in range(50):\n    try:\n        c.connect(('{}', 7001)); break\n    except OSError:\n        time.sleep(0.1); c=socket.socket()\n\
         for i in range({}):\n    b=r.randbytes(1<<20); h.update(b); c.sendall(b)\n\
         c.close(); print(h.hexdigest())",
        to_ip,
        mb
    );
    let ns = to.to_string();
    let srv = std::thread::spawn(move || {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, "python3", "-c", &server])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    });
    std::thread::sleep(Duration::from_millis(300));
    let out = lab.ns_output(from, &["python3", "-c", &client]).unwrap();
    let sent = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (sent, srv.join().unwrap())
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

// ---- Cluster mode: a real etcd (Debian's etcd-server) in the lab ----

/// Waits up to `secs` for `ok`; returns how long it took, or panics with `what`.
fn wait_until(secs: f64, what: &str, mut ok: impl FnMut() -> bool) -> Duration {
    let t0 = std::time::Instant::now();
    while !ok() {
        assert!(t0.elapsed().as_secs_f64() < secs, "not within {secs} s: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
    t0.elapsed()
}

/// The names of host `h`'s links.
fn link_names(lab: &Lab, h: usize) -> Vec<String> {
    let v = json(lab, h, "links");
    v["links"].as_array().unwrap().iter().filter_map(|l| l["name"].as_str().map(str::to_string)).collect()
}

/// Where host `h` routes `mac` (`link NAME` or `interface NAME`), if anywhere.
fn route_to(lab: &Lab, h: usize, mac: &str) -> Option<String> {
    let v = json(lab, h, "routes");
    v["routes"].as_array()?.iter().find(|r| r["dst"] == mac)?["to"].as_str().map(str::to_string)
}

/// Pings every (from, to) pair at once, 3 each; returns the pairs that
/// did not get 3 of 3.
fn ping_pairs(pairs: &[(Vm, Ipv4Addr)]) -> Vec<String> {
    let runs: Vec<_> = pairs
        .iter()
        .map(|(from, to)| {
            let child = std::process::Command::new("ip")
                .args(["netns", "exec", &from.ns, "ping", "-n", "-q", "-c", "3", "-i", "0.2", "-W", "2"])
                .arg(to.to_string())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            (from.ip, *to, child)
        })
        .collect();
    let mut bad = Vec::new();
    for (from, to, child) in runs {
        let out = child.wait_with_output().unwrap();
        let r = vnet_lab::PingResult::parse(&String::from_utf8_lossy(&out.stdout));
        if r.received != 3 || r.sent != 3 {
            bad.push(format!("{from} -> {to}: {r:?}"));
        }
    }
    bad
}

/// Waits until hosts 0..n each see n live hosts, route `routes` MACs to
/// links and have the store up; returns how long that took.
fn wait_converged(lab: &Lab, n: usize, routes: u64) -> Duration {
    wait_until(10.0, &format!("{n} hosts see each other"), || {
        (0..n).all(|h| {
            let c = lab.cluster_status(h).unwrap();
            c["hosts"].as_array().map_or(0, Vec::len) == n && c["routes"] == routes && c["store"] == "up"
        })
    })
}

fn cluster_spec(hosts: usize, vms: usize, late: Vec<usize>) -> Spec {
    Spec {
        hosts,
        vms_per_host: vms,
        veth_hosts: (0..hosts).collect(),
        cluster: Some(vnet_lab::Cluster { ttl_s: 5, late, open: false, in_config: false }),
        ..Spec::default()
    }
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_signed_record_colliding_with_a_static_link_is_quarantined_and_a_new_host_still_links() {
    // Issue 44, finding 2: host 1's (signed) record at an address a static
    // link of host 0 reaches made host 0's whole view fail, retried forever,
    // and nothing else converged there.
    let mut lab = lab(cluster_spec(3, 0, vec![2]));
    wait_converged(&lab, 2, 0);
    lab.stop_vnetd(0).unwrap();
    let ip1 = lab.hosts[1].underlay_ip;
    let conf = std::fs::read_to_string(&lab.hosts[0].config).unwrap();
    std::fs::write(&lab.hosts[0].config, format!("{conf}link st udp {ip1}:9000\n")).unwrap();
    lab.start_vnetd(0).unwrap();
    wait_until(10.0, "host 0 quarantines host 1's record", || {
        lab.cluster_status(0).unwrap()["quarantined"].as_array().is_some_and(|q| {
            q.iter().any(|e| e["key"] == "host h1" && e["why"].as_str().unwrap_or("").contains("link `st`"))
        })
    });
    let link = |lab: &Lab, name: &str| {
        json(lab, 0, "links")["links"].as_array().unwrap().iter().find(|l| l["name"] == name).cloned()
    };
    assert_eq!(
        link(&lab, "st").unwrap()["remote"],
        format!("{ip1}:9000"),
        "the static link stays as declared"
    );
    assert!(link(&lab, "h1").is_none());
    // A new host: linked at once, the refused record notwithstanding.
    lab.start_vnetd(2).unwrap();
    // Measured: 88 ms; 1 s is the issue's bound.
    let took = wait_until(1.0, "host 0 links the new host 2", || link(&lab, "h2").is_some());
    eprintln!("a new host linked {took:?} after its vnetd answered, beside a quarantined record");
    let c = lab.cluster_status(0).unwrap();
    assert_eq!(c["counters"]["transaction_errors"], 0, "{c}");
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn cluster_of_five_hosts_from_etcd_alone_a_sixth_joins_and_a_killed_host_leaves_within_its_ttl() {
    let mut lab = lab(cluster_spec(6, 2, vec![5]));
    for h in 0..6 {
        let conf = std::fs::read_to_string(&lab.hosts[h].config).unwrap();
        assert!(
            !conf.lines().any(|l| l.starts_with("link") || l.starts_with("route")),
            "host {h}'s config has peer or route lines:\n{conf}"
        );
    }
    // Five hosts, two VMs each: every host links to the four others and routes their eight MACs.
    let took = wait_converged(&lab, 5, 8);
    eprintln!("cluster: 5 hosts converged {took:?} after the last vnetd answered");
    let vms: Vec<Vm> = (0..5).flat_map(|h| lab.hosts[h].vms.clone()).collect();
    let pairs: Vec<(Vm, Ipv4Addr)> =
        vms.iter().flat_map(|a| vms.iter().filter(|b| b.ip != a.ip).map(|b| (a.clone(), b.ip))).collect();
    assert_eq!(pairs.len(), 90);
    let bad = ping_pairs(&pairs);
    assert!(bad.is_empty(), "pairs that did not ping 3/3:\n{}", bad.join("\n"));
    let status = json(&lab, 0, "cluster");
    assert!(status["cluster"]["revision"].as_u64().unwrap() > 0, "{status}");
    let text = lab.control(0, "show cluster").unwrap().body;
    assert!(text.contains("store up") && text.contains("hosts 5: h0 h1 h2 h3 h4"), "{text}");
    let metrics = lab.control(0, "show metrics").unwrap().body;
    assert!(metrics.contains("vnet_cluster_store_up 1\n") && metrics.contains("vnet_cluster_hosts 5\n"));
    // The secured cluster: every link encrypted and established, etcd
    // reached over TLS, and a host's etcd user confined to its network.
    for h in 0..5 {
        for l in json(&lab, h, "links")["links"].as_array().unwrap() {
            assert!(l["security"] == "encrypt" && l["established"] == true, "host {h}: {l}");
        }
    }
    assert!(text.contains("https://"), "{text}");
    let pw = std::fs::read_to_string(lab.dir.join("h0.etcd-pw")).unwrap();
    let as_h0 = |args: &[&str]| {
        let mut all = vec![format!("--user=vnet-h0:{}", pw.trim())];
        all.extend(args.iter().map(|a| a.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        lab.etcdctl(&all)
    };
    let own = as_h0(&["get", "--prefix", "--keys-only", &format!("/vnet/{}/hosts/", lab.prefix)]).unwrap();
    assert!(own.contains("/hosts/h4"), "{own}");
    let e = as_h0(&["put", "/vnet/another-network/hosts/x", "{}"]).unwrap_err().to_string();
    assert!(e.contains("permission denied"), "{e}");

    // A sixth host joins; nobody else is told anything.
    let t0 = std::time::Instant::now();
    lab.start_vnetd(5).unwrap();
    wait_until(10.0, "the five see the sixth", || {
        (0..5).all(|h| link_names(&lab, h).contains(&"h5".to_string()))
    });
    eprintln!("cluster: a sixth host is linked from all five {:?} after its vnetd started", t0.elapsed());
    let (new, old) = (lab.vm(5, 1).clone(), lab.vm(0, 0).clone());
    // Its links are secured: until a link's handshake is done, frames on
    // it are dropped (counted as no_session), so the pings wait for the
    // sessions, and for the routes to its VM, not only for the links.
    wait_until(10.0, "the sixth's links established and its VM routed", || {
        let established = |h: usize, peer: Option<&str>| {
            json(&lab, h, "links")["links"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|l| peer.is_none_or(|p| l["name"] == p))
                .all(|l| l["established"] == true)
        };
        (0..5).all(|h| established(h, Some("h5")) && route_to(&lab, h, &new.mac).is_some())
            && established(5, None)
    });
    eprintln!("cluster: the sixth host's sessions established {:?} after its vnetd started", t0.elapsed());
    let bad = ping_pairs(&[(new.clone(), old.ip), (old.clone(), new.ip), (lab.vm(3, 1).clone(), new.ip)]);
    assert!(bad.is_empty(), "{}", bad.join("\n"));

    // kill -9: the host's lease runs out and every other host drops it.
    let gone_mac = lab.vm(2, 0).mac.clone();
    lab.kill_vnetd(2).unwrap();
    let took = wait_until(5.0 + 3.0, "the killed host leaves the others' links", || {
        [0, 1, 3, 4, 5].iter().all(|&h| !link_names(&lab, h).contains(&"h2".to_string()))
    });
    eprintln!("cluster: a host killed with kill -9 left every other host's links after {took:?} (TTL 5 s)");
    assert!(took <= Duration::from_secs(5), "{took:?} for a 5 s TTL");
    for h in [0, 1, 3, 4, 5] {
        assert_eq!(route_to(&lab, h, &gone_mac), None, "host {h} still routes the dead host's VM");
        assert!(lab.vnetd_alive(h));
    }
    let bad = ping_pairs(&[(old.clone(), new.ip), (lab.vm(4, 0).clone(), lab.vm(1, 1).ip)]);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn cluster_records_a_stranger_writes_to_etcd_change_nothing_but_a_counter() {
    // Findings 1 and 3 of the security review: a host record whose key
    // carries control lines, and records that once stopped every host
    // converging (a duplicate address, an unusable address, a key that is
    // not base64), each put into the real etcd as any client could.
    // An open cluster (no network key): records are taken on their
    // fields alone, so every check but the signature's is on trial.
    let mut spec = cluster_spec(2, 1, vec![]);
    spec.cluster.as_mut().unwrap().open = true;
    let lab = lab(spec);
    wait_converged(&lab, 2, 1);
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    let hosts = format!("/vnet/{}/hosts", lab.prefix);
    let h1 = lab.cluster_status(0).unwrap();
    let key = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    let injected = format!(
        r#"{{"addr":"10.77.0.66:9000","public_key":"{key}\nlink spy udp 10.77.0.66:9000\nroute any any -> link spy\ninterface pbinj tap pbinj0"}}"#
    );
    lab.etcd_put(&format!("{hosts}/x"), Some(&injected)).unwrap();
    lab.etcd_put(&format!("{hosts}/dup"), Some(r#"{"addr":"10.77.0.2:9000"}"#)).unwrap();
    lab.etcd_put(&format!("{hosts}/zero"), Some(r#"{"addr":"0.0.0.0:0"}"#)).unwrap();
    lab.etcd_put(&format!("{hosts}/junk"), Some(r#"{"addr":"10.77.0.67:9000","public_key":"not base64"}"#))
        .unwrap();
    // A good host joins after them: it still applies.
    lab.etcd_put(&format!("{hosts}/late"), Some(r#"{"addr":"10.77.0.68:9000"}"#)).unwrap();
    wait_until(5.0, "both hosts quarantine the four and link the late one", || {
        (0..2).all(|h| {
            let c = lab.cluster_status(h).unwrap();
            c["quarantined"].as_array().map_or(0, Vec::len) == 4
                && link_names(&lab, h).contains(&"late".into())
        })
    });
    for h in 0..2 {
        let c = lab.cluster_status(h).unwrap();
        assert_eq!(c["counters"]["transaction_errors"], h1["counters"]["transaction_errors"], "{c}");
        let links = link_names(&lab, h);
        assert!(
            !links.iter().any(|l| l == "spy" || l == "x" || l == "dup" || l == "zero" || l == "junk"),
            "{links:?}"
        );
        let ifaces = json(&lab, h, "interfaces").to_string();
        assert!(!ifaces.contains("pbinj"), "host {h} declared the injected interface: {ifaces}");
        let why = c["quarantined"].to_string();
        assert!(
            why.contains("not a key") && why.contains("already host") && why.contains("not a unicast"),
            "{why}"
        );
        let m = lab.control(h, "show metrics").unwrap().body;
        assert!(m.contains("vnet_cluster_quarantined_records 4\n"), "{m}");
    }
    let out = lab.ns_output(&lab.hosts[0].ns, &["ip", "link", "show", "pbinj0"]).unwrap();
    assert!(!out.status.success(), "a TAP was made from a record");
    assert_ping(&lab, &a, b.ip, 56);
    // Deleted, they leave quarantine; the late host's link goes with its record.
    for k in ["x", "dup", "zero", "junk", "late"] {
        lab.etcd_put(&format!("{hosts}/{k}"), None).unwrap();
    }
    wait_until(5.0, "quarantine empties", || {
        (0..2).all(|h| {
            lab.cluster_status(h).unwrap()["quarantined"].as_array().is_some_and(Vec::is_empty)
                && !link_names(&lab, h).contains(&"late".into())
        })
    });
    assert_ping(&lab, &b, a.ip, 56);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_forged_claim_or_host_record_without_the_network_keys_signature_redirects_nothing() {
    // Finding 2 of the security review: one `put` of a MAC record naming
    // another host made the real owner withdraw its VM's route (pings 2/2
    // to 0/3); rewriting a host record re-pointed every link to it. In a
    // signed network (the lab's default cluster) both are ignored, even
    // written by etcd's root.
    let lab = lab(cluster_spec(3, 1, vec![]));
    wait_converged(&lab, 3, 2);
    let (a, b, c) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone(), lab.vm(2, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    let (macs, hosts) = (format!("/vnet/{}/macs", lab.prefix), format!("/vnet/{}/hosts", lab.prefix));
    let before: Vec<_> =
        (0..3).map(|h| lab.cluster_status(h).unwrap()["counters"]["bad_records"].clone()).collect();
    // B's MAC claimed for host 0, unsigned, then with host 2's real claim
    // signature lifted from C's record (it covers another MAC).
    let c_claim = lab.etcdctl(&["get", "--print-value-only", &format!("{macs}/{}", c.mac)]).unwrap();
    let mut lifted: serde_json::Value = serde_json::from_str(c_claim.trim()).unwrap();
    // A pings B every 10 ms while the forgeries land: none may cost a ping.
    const PINGS: u32 = 300;
    let ping = in_background(
        &a.ns,
        &["ping", "-n", "-i", "0.01", "-c", &PINGS.to_string(), "-W", "1", &b.ip.to_string()],
    );
    std::thread::sleep(Duration::from_millis(300));
    lab.etcd_put(&format!("{macs}/{}", b.mac), Some(r#"{"host":"h0","iface":"vm0"}"#)).unwrap();
    lifted["at_ms"] = serde_json::json!(lifted["at_ms"].as_u64().unwrap() + 60_000);
    lab.etcd_put(&format!("{macs}/{}", b.mac), Some(&lifted.to_string())).unwrap();
    // B's host record re-pointed to an address of the attacker's, with
    // the attacker's key and no certificate; then with h0's certificate.
    let attacker = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    let h0_cert = std::fs::read_to_string(lab.dir.join("h0.cert")).unwrap();
    lab.etcd_put(
        &format!("{hosts}/h1"),
        Some(&format!(r#"{{"addr":"10.77.0.66:9000","public_key":"{attacker}"}}"#)),
    )
    .unwrap();
    lab.etcd_put(
        &format!("{hosts}/h1"),
        Some(&format!(
            r#"{{"addr":"10.77.0.66:9000","public_key":"{attacker}","cert":"{}"}}"#,
            h0_cert.trim()
        )),
    )
    .unwrap();
    wait_until(5.0, "every host counts the four forgeries", || {
        (0..3).all(|h| {
            let n = lab.cluster_status(h).unwrap()["counters"]["bad_records"].as_u64().unwrap();
            n >= before[h].as_u64().unwrap() + 4
        })
    });
    // Host 1 put its record back; nobody's link to it moved; B's MAC is
    // still routed to host 1 and the VMs still talk.
    wait_until(5.0, "host 1 restores its record", || {
        lab.cluster_status(1).unwrap()["counters"]["records_restored"].as_u64().unwrap() >= 1
    });
    for h in [0, 2] {
        assert_eq!(route_to(&lab, h, &b.mac).as_deref(), Some("link h1"), "host {h}");
        let links = json(&lab, h, "links").to_string();
        assert!(!links.contains("10.77.0.66") && !links.contains(attacker), "host {h}: {links}");
    }
    let local = json(&lab, 1, "routes").to_string();
    assert!(local.contains(&b.mac), "host 1 withdrew its own VM's route: {local}");
    let out = String::from_utf8_lossy(&ping.join().unwrap().stdout).to_string();
    let r = vnet_lab::PingResult::parse(&out);
    assert_eq!((r.sent, r.received), (PINGS, PINGS), "pings while the forgeries landed:\n{out}");
    assert_ping(&lab, &a, b.ip, 56);
    assert_ping(&lab, &c, b.ip, 56);
    // Host 1 put its claim back over the forged ones; deleted, it comes
    // back at once too, and the others route B's VM to host 1 again.
    let claim =
        |lab: &Lab| lab.etcdctl(&["get", "--print-value-only", &format!("{macs}/{}", b.mac)]).unwrap();
    wait_until(5.0, "host 1's own claim is back in the store", || claim(&lab).contains(r#""host":"h1""#));
    lab.etcd_put(&format!("{macs}/{}", b.mac), None).unwrap();
    let took = wait_until(5.0, "the deleted claim is put back and routed", || {
        claim(&lab).contains(r#""host":"h1""#)
            && [0, 2].iter().all(|&h| route_to(&lab, h, &b.mac).as_deref() == Some("link h1"))
    });
    eprintln!("cluster: a claim deleted by another writer was back and routed everywhere after {took:?}");
    assert_ping(&lab, &a, b.ip, 56);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_mac_defined_again_on_another_host_moves_nothing_in_another_network_and_is_a_conflict_in_the_same() {
    // Issue 44, finding 5: a claim carried no network and the newest won.
    // A second interface with VM A's MAC, on host 1, in network 8 took A's
    // traffic away from host 0 (whose cluster links carry network 0); in
    // network 0 it did the same, taken as a migration never undone.
    let lab = lab(cluster_spec(3, 1, vec![]));
    wait_converged(&lab, 3, 2);
    let (a, c) = (lab.vm(0, 0).clone(), lab.vm(2, 0).clone());
    assert_ping(&lab, &c, a.ip, 56);
    let routed_to_h0 = |lab: &Lab| {
        route_to(lab, 1, &a.mac).as_deref() == Some("link h0")
            && route_to(lab, 2, &a.mac).as_deref() == Some("link h0")
            && route_to(lab, 0, &a.mac).is_some_and(|t| t.starts_with("interface "))
    };
    let ok = |r: vnet_lab::Reply| r.result.unwrap_or_else(|e| panic!("{e}"));
    // A TAP interface on host 1 with A's MAC, in `network`: a typed request.
    let declare = |name: &str, network: u32| {
        use vnet_control::request::{Dev, DevName, Interface, Name, Request};
        let mut i =
            Interface::new(Name::new(name).unwrap(), Dev::Tap(DevName::new(&format!("{name}t")).unwrap()));
        i.mac = Some(a.mac.parse().unwrap());
        i.network = network;
        Request::declare(i).unwrap()
    };
    ok(lab.send(1, &declare("dup8", 8)).unwrap());
    // What a claim takes to travel (the claim is put within 20 ms, each
    // watch has it within milliseconds): 500 ms is ten times that.
    std::thread::sleep(Duration::from_millis(500));
    assert!(routed_to_h0(&lab), "a network-8 interface moved network 0's VM");
    assert_ping(&lab, &c, a.ip, 56);
    // The same network: a conflict, shown on host 1, and nothing moves.
    ok(lab.send(1, &declare("dup0", 0)).unwrap());
    let took = wait_until(2.0, "host 1 shows the conflict", || {
        lab.cluster_status(1).unwrap()["conflicts"].as_array().is_some_and(|cs| {
            cs.iter().any(|x| x["mac"] == a.mac.as_str() && x["holder"] == "h0" && x["interface"] == "dup0")
        })
    });
    eprintln!("conflict shown on the claiming host {took:?} after its interface was declared");
    let text = lab.control(1, "show cluster").unwrap().body;
    assert!(
        text.contains(&format!("conflict {}: held by h0, claimed by h1 (interface dup0 here", a.mac)),
        "{text}"
    );
    let m = lab.control(1, "show metrics").unwrap().body;
    assert!(
        m.contains("vnet_cluster_mac_conflicts 1\n") && m.contains("vnet_cluster_mac_conflicts_total 1\n"),
        "{m}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(routed_to_h0(&lab), "a second claim in the same network moved the VM");
    assert!(route_to(&lab, 1, &a.mac).as_deref() != Some("interface dup0"));
    assert_ping(&lab, &c, a.ip, 56);
    // `activate` on host 1 says it is a migration: then, and only then, it moves.
    ok(lab.control(1, "activate dup0").unwrap());
    wait_until(2.0, "every host routes the MAC to host 1", || {
        route_to(&lab, 2, &a.mac).as_deref() == Some("link h1")
            && route_to(&lab, 0, &a.mac).as_deref() == Some("link h1")
    });
    wait_until(2.0, "the conflict is settled", || {
        lab.cluster_status(1).unwrap()["conflicts"].as_array().is_some_and(Vec::is_empty)
    });
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn each_wrong_etcd_credential_keeps_vnetd_from_ready_and_says_what_to_fix() {
    // Issue 45: a wrong password, CA, client certificate or permission
    // left vnetd logging `vnetd ready` and retrying forever, with raw gRPC
    // text in its log.
    let mut lab = lab(cluster_spec(2, 0, vec![1]));
    wait_until(10.0, "host 0 is up", || lab.cluster_status(0).unwrap()["store"] == "up");
    let d = lab.dir.clone();
    let f = |n: &str| d.join(n).display().to_string();
    std::fs::write(d.join("wrong.etcd-pw"), "not the password\n").unwrap();
    std::fs::set_permissions(d.join("wrong.etcd-pw"), std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .unwrap();
    // Another CA, and a client certificate it signed (etcd does not know it).
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl").args(args).output().unwrap();
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=other CA",
        "-keyout",
        &f("other-ca.key"),
        "-out",
        &f("other-ca.pem"),
    ]);
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-subj",
        "/CN=vnet-h1",
        "-keyout",
        &f("other.key"),
        "-out",
        &f("other.csr"),
    ]);
    std::fs::write(d.join("client.ext"), "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        &f("other.csr"),
        "-CA",
        &f("other-ca.pem"),
        "-CAkey",
        &f("other-ca.key"),
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        &f("client.ext"),
        "-out",
        &f("other.pem"),
    ]);
    std::fs::set_permissions(d.join("other.key"), std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .unwrap();
    // A user etcd knows, with no role.
    let pw = vnetd::keys::genkey().unwrap();
    vnetd::keys::write_secret(&d.join("nobody.etcd-pw"), &pw).unwrap();
    lab.etcdctl(&["user", "add", "vnet-nobody", &format!("--new-user-password={pw}")]).unwrap();
    type Overrides = Vec<(&'static str, Option<String>)>;
    let cases: Vec<(&str, Overrides, &str)> = vec![
        ("password", vec![("etcd-password-file", Some(f("wrong.etcd-pw")))], "password"),
        ("CA", vec![("etcd-ca", Some(f("other-ca.pem")))], "etcd-ca"),
        (
            "client certificate",
            vec![("etcd-cert", Some(f("other.pem"))), ("etcd-key", Some(f("other.key")))],
            "client certificate",
        ),
        (
            "permission",
            vec![
                ("etcd-user", Some("vnet-nobody".into())),
                ("etcd-password-file", Some(f("nobody.etcd-pw"))),
            ],
            "grant",
        ),
        (
            "client certificate, none given",
            vec![("etcd-cert", None), ("etcd-key", None)],
            "requires a client certificate",
        ),
    ];
    for (what, overrides, says) in cases {
        lab.cluster_overrides = overrides.into_iter().map(|(k, v)| (1, k, v)).collect();
        let from = lab.log(1).len();
        lab.start_vnetd(1).unwrap();
        let t0 = std::time::Instant::now();
        while lab.cluster_status(1).unwrap()["store"] != "failed" {
            let c = lab.cluster_status(1).unwrap();
            assert!(t0.elapsed() < Duration::from_secs(10), "a wrong {what}: the store is not `failed`: {c}");
            std::thread::sleep(Duration::from_millis(20));
        }
        let took = t0.elapsed();
        let c = lab.cluster_status(1).unwrap();
        let e = c["last_error"].as_str().unwrap_or_default().to_string();
        eprintln!("wrong etcd {what}: failed after {took:?}: {e}");
        assert!(e.contains(says), "a wrong {what}: {e}");
        assert!(!e.contains("status:") && !e.contains("tonic"), "raw gRPC text: {e}");
        // Past the wait for an outage to count as one (3 s).
        std::thread::sleep(Duration::from_millis(3500));
        let log = lab.log(1)[from..].to_string();
        assert!(!log.contains("vnetd ready"), "a wrong {what}: vnetd said it was ready:\n{log}");
        assert!(log.contains(&e), "a wrong {what}: the log does not say it:\n{log}");
        lab.stop_vnetd(1).unwrap();
    }
    // Right, it is ready and up.
    lab.cluster_overrides.clear();
    lab.start_vnetd(1).unwrap();
    wait_until(10.0, "host 1 is up", || lab.cluster_status(1).unwrap()["store"] == "up");
    wait_until(2.0, "host 1 says it is ready", || lab.log(1).contains("vnetd ready"));
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_revoked_host_is_cut_by_every_host_within_a_second_and_stays_out() {
    // Issue 44, finding 9: nothing could withdraw a host's certificate
    // before it expired. `vnetctl revoke` signs a revocation with the
    // network key; written to the store, every host drops the host.
    let mut lab = lab(cluster_spec(3, 1, vec![]));
    wait_converged(&lab, 3, 2);
    let (a, c) = (lab.vm(0, 0).clone(), lab.vm(2, 0).clone());
    assert_ping(&lab, &a, c.ip, 56);
    let net_key = lab.dir.join("net.key").display().to_string();
    let out = lab.vnetctl(0, &["revoke", &net_key, "network", &lab.prefix, "host", "h2"]).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).unwrap();
    let (key, value) = printed.trim().split_once(' ').unwrap();
    assert_eq!(key, format!("/vnet/{}/revoked/hosts/h2", lab.prefix));
    lab.etcd_put(key, Some(value)).unwrap();
    let took = wait_until(1.0, "hosts 0 and 1 drop host 2", || {
        [0, 1].iter().all(|&h| !link_names(&lab, h).contains(&"h2".to_string()))
    });
    eprintln!("revocation: host 2 cut by every host {took:?} after the put");
    assert_eq!(route_to(&lab, 0, &c.mac), None, "host 2's VM is routed nowhere");
    let q = lab.cluster_status(0).unwrap();
    assert!(q["quarantined"].to_string().contains("revoked"), "{q}");
    assert_eq!(q["revoked"]["hosts"], 1, "{q}");
    // Host 2 restarts and puts its record again; deleting the revocation
    // (which takes no network key) brings nothing back either.
    lab.stop_vnetd(2).unwrap();
    lab.start_vnetd(2).unwrap();
    lab.etcd_put(key, None).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    for h in [0, 1] {
        assert!(!link_names(&lab, h).contains(&"h2".to_string()), "host {h} linked the revoked host again");
    }
    assert_eq!(lab.ping(&a, c.ip, 2, 56).unwrap().received, 0, "the revoked host's VM answered");
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_cluster_line_in_the_config_runs_cluster_mode_and_is_fixed_while_vnetd_runs() {
    let mut spec = cluster_spec(2, 1, vec![]);
    spec.cluster.as_mut().unwrap().in_config = true;
    let lab = lab(spec);
    let conf = std::fs::read_to_string(&lab.hosts[0].config).unwrap();
    assert!(conf.contains("cluster etcd:https://") && conf.contains(" etcd-password-file /"), "{conf}");
    // Issue 45: the host key is in the line too; vnetd has no --key.
    assert!(conf.contains(" key /"), "{conf}");
    let cmdline = std::fs::read_to_string(format!("/proc/{}/cmdline", lab.vnetd_pid(0).unwrap())).unwrap();
    assert!(!cmdline.contains("--key"), "{cmdline:?}");
    wait_converged(&lab, 2, 1);
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    let text = lab.control(0, "show cluster").unwrap().body;
    assert!(text.contains("store up") && text.contains("https://"), "{text}");
    // `show config` (what `save` writes) keeps the line; a change to it
    // while vnetd runs is refused, and changes nothing.
    let shown = lab.control(0, "show config").unwrap().body;
    let line =
        shown.lines().find(|l| l.starts_with("cluster ")).expect("a cluster line in show config").to_string();
    let e = lab.apply(0, &line.replace(" ttl 5", " ttl 9")).unwrap_err().to_string();
    assert!(e.contains("cluster settings are taken at start"), "{e}");
    lab.apply(0, &format!("{line}\n")).unwrap();
    assert_ping(&lab, &a, b.ip, 56);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_host_whose_certificate_expires_is_dropped_by_every_other_until_renewed() {
    let mut lab = lab(cluster_spec(3, 1, vec![2]));
    wait_converged(&lab, 2, 1);
    let (a, c) = (lab.vm(0, 0).clone(), lab.vm(2, 0).clone());
    // Host 2's certificate, signed anew to expire 8 s from now.
    let vnetctl = vnet_lab::bin("vnetctl").unwrap();
    let key = std::fs::read(lab.dir.join("h2.key")).unwrap();
    let pubkey = |args: &[&str]| {
        let mut p = std::process::Command::new(&vnetctl)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(p.stdin.as_mut().unwrap(), &key).unwrap();
        let out = p.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let (public, claim) = (pubkey(&["pubkey"]), pubkey(&["pubkey", "claim"]));
    let (net_key, cert_file, network) =
        (lab.dir.join("net.key"), lab.dir.join("h2.cert"), lab.prefix.clone());
    let addr = format!("{}/32", lab.hosts[2].underlay_ip);
    let sign = |until: &[&str]| {
        let mut args = vec!["sign", net_key.to_str().unwrap(), "network", &network, "host", "h2"];
        args.extend(["public-key", &public, "claim-key", &claim, "addr", &addr]);
        args.extend(until);
        let out = std::process::Command::new(&vnetctl).args(&args).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        std::fs::write(&cert_file, out.stdout).unwrap();
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    sign(&["not-after", &(now + 8).to_string()]);
    lab.start_vnetd(2).unwrap();
    wait_converged(&lab, 3, 2);
    assert_ping(&lab, &a, c.ip, 56);
    let took = wait_until(12.0, "hosts 0 and 1 drop host 2 once its certificate expired", || {
        (0..2).all(|h| !link_names(&lab, h).contains(&"h2".to_string()))
    });
    let late =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() - (now + 8);
    eprintln!("cluster: an expired host was dropped {late} s after its certificate's not_after ({took:?} of waiting)");
    assert!(late <= 2, "dropped {late} s after expiry");
    for h in 0..2 {
        let q = lab.cluster_status(h).unwrap()["quarantined"].to_string();
        assert!(q.contains("/hosts/h2") && q.contains("expired"), "host {h}: {q}");
        assert_eq!(route_to(&lab, h, &c.mac), None, "host {h} still routes the expired host's VM");
    }
    assert_no_ping(&lab, &a, c.ip);
    // Renewed (and vnetd restarted on it): back.
    sign(&["days", "1"]);
    lab.stop_vnetd(2).unwrap();
    lab.start_vnetd(2).unwrap();
    wait_converged(&lab, 3, 2);
    assert_ping(&lab, &a, c.ip, 56);
    // Its days left are shown, and it counts as expiring within 30 days.
    let certs = lab.cluster_status(0).unwrap()["certificates"].clone();
    assert!(certs.as_array().unwrap().iter().any(|c| c["host"] == "h2" && c["days_left"] == 0), "{certs}");
    let text = lab.control(0, "show cluster").unwrap().body;
    let line = text.lines().find(|l| l.starts_with("certificates, days left: ")).unwrap_or_default();
    assert!(line.contains("h2 0"), "{text}");
    // The lab's own certificates run a day too: all three expire within 30 days.
    let metrics = lab.control(0, "show metrics").unwrap().body;
    assert!(metrics.contains("vnet_cluster_certificates_expiring_30d 3\n"), "{metrics}");
    // Without `days` or `not-after`, a certificate runs for a year.
    sign(&[]);
    let cert = std::fs::read_to_string(&cert_file).unwrap();
    let net_pub = std::fs::read_to_string(lab.dir.join("net.pub")).unwrap();
    let c =
        vnet_cluster::trust::NetworkPublic::from_base64(net_pub.trim()).unwrap().verify(cert.trim()).unwrap();
    assert_eq!(c.not_after.map(|t| (t - now) / 86_400), Some(365));
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn an_unprivileged_client_changes_nothing_on_the_unix_socket_or_loopback_tcp() {
    // Finding 6: as user nobody, a loopback `tcp:` client added a link and
    // had vnetd make a TAP. Now the unix socket is 0600 and checks the
    // peer's credentials, and `tcp:` wants a token only root can read.
    let lab = lab(Spec::default());
    let ns = lab.hosts[0].ns.clone();
    let vnetctl = vnet_lab::bin("vnetctl").unwrap();
    let vnetctl = vnetctl.to_str().unwrap();
    let as_nobody = |args: &[&str]| {
        let mut all = vec!["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", vnetctl];
        all.extend_from_slice(args);
        lab.ns_output(&ns, &all).unwrap()
    };
    let sock = format!("unix:{}", lab.hosts[0].control.display());
    let mode = std::fs::metadata(&lab.hosts[0].control).unwrap().permissions();
    let mode = std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777;
    assert_eq!(mode & 0o077, 0, "made its owner's alone (umask 077), not chmod'ed later: {mode:o}");
    let out = as_nobody(&["--control", &sock, "link", "evil", "udp", "10.77.0.99:9000"]);
    assert!(!out.status.success(), "{out:?}");
    // Even with the socket opened to all, SO_PEERCRED refuses nobody.
    std::fs::set_permissions(&lab.hosts[0].control, std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .unwrap();
    let out = as_nobody(&["--control", &sock, "link", "evil", "udp", "10.77.0.99:9000"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("permission denied: uid 65534"), "{out:?}");
    assert!(!link_names(&lab, 0).contains(&"evil".to_string()));
    // A second vnetd on loopback tcp: with a token; nobody cannot read the token.
    let dir = lab.dir.join("tcpctl");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let token = dir.join("token");
    let mut vnetd = std::process::Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(vnet_lab::bin("vnetd").unwrap())
        .args(["--control", "tcp:127.0.0.1:7931", "--control-token"])
        .arg(&token)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ask = |who_root: bool, token_arg: bool, line: &[&str]| {
        let mut args: Vec<String> = vec!["--control".into(), "tcp:127.0.0.1:7931".into()];
        if token_arg {
            args.extend(["--token".into(), token.display().to_string()]);
        }
        args.extend(line.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        if who_root {
            let mut all = vec![vnetctl];
            all.extend_from_slice(&args);
            lab.ns_output(&ns, &all).unwrap()
        } else {
            as_nobody(&args)
        }
    };
    wait_until(5.0, "the tcp: vnetd answers its token", || {
        ask(true, true, &["show", "links"]).status.success()
    });
    for (root, with_token) in [(false, true), (false, false), (true, false)] {
        let out = ask(root, with_token, &["link", "evil", "udp", "10.77.0.99:9000"]);
        assert!(!out.status.success(), "root {root} token {with_token}: {out:?}");
    }
    let links = String::from_utf8_lossy(&ask(true, true, &["show", "links"]).stdout).into_owned();
    assert!(!links.contains("evil"), "{links}");
    let _ = vnetd.kill();
    let _ = vnetd.wait();
}

/// The longest run of lost replies in `ping -i` output (by icmp_seq), in pings.
/// Runs `args` in namespace `ns` on a thread of its own; join it for the
/// output (a ping or an iperf3 client under whatever the test does meanwhile).
fn in_background(ns: &str, args: &[&str]) -> std::thread::JoinHandle<std::process::Output> {
    let mut all: Vec<String> = vec!["netns".into(), "exec".into(), ns.into()];
    all.extend(args.iter().map(|a| a.to_string()));
    std::thread::spawn(move || std::process::Command::new("ip").args(&all).output().unwrap())
}

/// A process's resident set, in kB (0 if it is gone).
fn rss_kb(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let l = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap_or_default().to_string();
    l.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// The sequence numbers ping got a reply for, sorted, once each.
fn ping_seqs(ping_out: &str) -> Vec<u32> {
    let mut seqs: Vec<u32> = ping_out
        .lines()
        .filter_map(|l| l.split("icmp_seq=").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect();
    seqs.sort_unstable();
    seqs.dedup();
    seqs
}

/// A 10 ms ping's output (`pings` sent) under some event `what`: its
/// result and longest gap in pings, said on stderr.
fn ping_gap(what: &str, out: &str, pings: u32) -> (vnet_lab::PingResult, u32) {
    let r = vnet_lab::PingResult::parse(out);
    assert_eq!(r.sent, pings, "ping output not understood:\n{out}");
    let gap = longest_gap(out, r.sent);
    eprintln!(
        "{what}: {} of {} pings lost (10 ms apart), longest gap {gap} (~{} ms)",
        r.sent - r.received,
        r.sent,
        gap * 10
    );
    (r, gap)
}

fn longest_gap(ping_out: &str, sent: u32) -> u32 {
    let seqs = ping_seqs(ping_out);
    let mut last = 0;
    let mut gap = 0;
    for s in seqs.iter().copied().chain([sent + 1]) {
        gap = gap.max(s.saturating_sub(last + 1));
        last = s;
    }
    gap
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn cluster_relocation_under_a_10ms_ping_and_a_tcp_stream_loses_under_100ms() {
    let mut lab = lab(cluster_spec(3, 1, vec![]));
    wait_converged(&lab, 3, 2);
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    const PINGS: u32 = 500;
    let (out, _, v) = relocate_under_traffic(&mut lab, 10, PINGS, |lab, _| {
        let seen = wait_until(5.0, "host 0 routes the VM to its new host", || {
            route_to(lab, 0, &b.mac).as_deref() == Some("link h2")
        });
        eprintln!("cluster relocation: host 0 rerouted {seen:?} after `vnetctl move` returned");
    });
    let moved = lab.vm(2, v).clone();
    let (r, _) = ping_gap("cluster relocation", &out, PINGS);
    // Measured: 3 lost (30 ms) on the user path. At most 6, as for the
    // IPv6 cluster: twice the claim's trip through etcd's watch.
    assert!(r.sent - r.received <= 6, "{} pings lost (10 ms apart): {r:?}", r.sent - r.received);
    // The old host gave the MAC up, the new one announced it.
    assert_eq!(route_to(&lab, 1, &b.mac).as_deref(), Some("link h2"));
    assert_eq!(lab.cluster_status(2).unwrap()["counters"]["announces"], 1);
    assert_ping(&lab, &a, moved.ip, 56);
}

/// Issue 45: a moved VM stays moved across a restart of either host, and
/// of a third. Before, neither host's config changed: in static mode a
/// third host restarted routed the VM to its old host again (and the old
/// host, its veth gone, could not start); in cluster mode the old host
/// restarted declared the interface again and took the MAC back.
fn a_moved_vm_stays_moved_across_restarts(cluster: bool) {
    let spec = if cluster {
        cluster_spec(3, 1, vec![])
    } else {
        Spec { hosts: 3, vms_per_host: 1, veth_hosts: vec![0, 1, 2], ..Spec::default() }
    };
    let mut lab = lab(spec);
    if cluster {
        wait_converged(&lab, 3, 2);
    }
    let (a, c) = (lab.vm(0, 0).clone(), lab.vm(2, 0).clone());
    assert_ping(&lab, &c, a.ip, 56);
    let v = lab.relocate(0, 0, 1).unwrap();
    let moved = lab.vm(1, v).clone();
    assert_ping(&lab, &c, moved.ip, 56);
    for h in [0, 1, 2] {
        lab.stop_vnetd(h).unwrap();
        lab.start_vnetd(h).unwrap();
        let took = wait_until(5.0, &format!("after host {h}'s restart, the VM is reached on host 1"), || {
            let to = |k| route_to(&lab, k, &moved.mac);
            to(0).as_deref() == Some("link h1")
                && to(2).as_deref() == Some("link h1")
                && to(1).is_some_and(|t| t.starts_with("interface "))
        });
        eprintln!(
            "moved VM, {} mode: routed to its new host {took:?} after host {h} restarted",
            if cluster { "cluster" } else { "static" }
        );
        assert_ping(&lab, &c, moved.ip, 56);
        if cluster {
            let s = lab.cluster_status(1).unwrap();
            assert!(s["conflicts"].as_array().is_some_and(Vec::is_empty), "{s}");
        }
    }
    if cluster {
        // The leases of the stopped vnetds have run out by now: what holds
        // is what the hosts claimed after their restarts.
        std::thread::sleep(Duration::from_secs(6));
        assert_eq!(route_to(&lab, 0, &moved.mac).as_deref(), Some("link h1"));
        assert_eq!(route_to(&lab, 2, &moved.mac).as_deref(), Some("link h1"));
        assert_ping(&lab, &c, moved.ip, 56);
    }
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_moved_vm_stays_moved_across_a_restart_of_either_host_static_mode() {
    a_moved_vm_stays_moved_across_restarts(false);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_moved_vm_stays_moved_across_a_restart_of_either_host_cluster_mode() {
    a_moved_vm_stays_moved_across_restarts(true);
}

/// Issue 45: cluster mode across NATs. Hosts 0 (a port-forwarding NAT),
/// 1 and 3 (symmetric NATs) and host 2 (public, `vnetd --relay`) form a
/// cluster from etcd alone with `--cluster-link-options "nat relay auto"`:
/// no per-peer line. A host behind a NAT advertises the address its peers
/// see it at (its certificate names it), links punch through where a NAT
/// lets them and go through host 2 where none does; `conntrack -F` on two
/// NATs at once costs under 2 s.
#[test]
#[ignore = "needs root, network namespaces and etcd: run with --ignored"]
fn a_cluster_across_nats_links_every_host_with_no_per_peer_configuration() {
    let spec = Spec {
        hosts: 4,
        nat: true,
        cluster: Some(vnet_lab::Cluster { ttl_s: 5, late: vec![], open: false, in_config: false }),
        ..Spec::default()
    };
    let lab = lab(spec);
    let vms: Vec<Vm> = (0..4).map(|h| lab.vm(h, 0).clone()).collect();
    let took = wait_until(20.0, "every host sees the four and routes the other three VMs", || {
        (0..4).all(|h| {
            let c = lab.cluster_status(h).unwrap();
            c["hosts"].as_array().map_or(0, Vec::len) == 4 && c["routes"] == 3
        })
    });
    eprintln!("NAT cluster: converged {took:?} after the hosts started");
    let pairs: Vec<(Vm, Ipv4Addr)> = (0..4)
        .flat_map(|a| (0..4).filter(move |&b| b != a).map(move |b| (a, b)))
        .map(|(a, b)| (vms[a].clone(), vms[b].ip))
        .collect();
    let took = wait_until(30.0, "every VM pings every other", || ping_pairs(&pairs).is_empty());
    eprintln!("NAT cluster: every pair of VMs pings {took:?} later");
    // Host 0's record says where its peers see it: its NAT's address.
    // (Peers reflect it with their keepalives: within seconds.)
    let rec = |lab: &Lab| {
        lab.etcdctl(&["get", "--print-value-only", &format!("/vnet/{}/hosts/h0", lab.prefix)]).unwrap()
    };
    let took = wait_until(20.0, "host 0's record says its NAT's address", || {
        rec(&lab).contains("\"addr\":\"203.0.113.1:9000\"")
    });
    eprintln!("NAT cluster: host 0 advertised its NAT's address {took:?} later");
    // Hosts 1 and 3 are behind symmetric NATs: their records keep their own
    // addresses (what a peer sees changes with each destination).
    let rec1 =
        lab.etcdctl(&["get", "--print-value-only", &format!("/vnet/{}/hosts/h1", lab.prefix)]).unwrap();
    assert!(rec1.contains("\"addr\":\"10.77.1.1:9000\""), "{rec1}");
    // The links remade to host 0's advertised address: every pair talks
    // again, hosts 1 and 3 (two symmetric NATs) through host 2.
    let t0 = std::time::Instant::now();
    loop {
        let bad = ping_pairs(&pairs);
        if bad.is_empty() {
            break;
        }
        if t0.elapsed() > Duration::from_secs(30) {
            let paths: Vec<String> = (0..4)
                .flat_map(|h| {
                    json(&lab, h, "links")["links"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(move |l| {
                            format!(
                                "h{h}->{}: {} {} remote {} established {} relayed_tx {}",
                                l["name"],
                                l["path"],
                                l["endpoint"],
                                l["remote"],
                                l["established"],
                                l["relayed_tx"]
                            )
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
            panic!(
                "pairs that do not ping 30 s after the records changed: {bad:?}\n{}\nh2's log:\n{}",
                paths.join("\n"),
                lab.log(2)
            );
        }
    }
    eprintln!("NAT cluster: every pair pings again {:?} later", t0.elapsed());
    wait_until(20.0, "hosts 1 and 3 go through the relay", || {
        link_named(&lab, 1, "h3")["path"] == "relayed" && link_named(&lab, 3, "h1")["path"] == "relayed"
    });
    let paths: Vec<String> = (0..4)
        .flat_map(|h| {
            json(&lab, h, "links")["links"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |l| format!("h{h}->{}: {} {}", l["name"], l["path"], l["endpoint"]))
                .collect::<Vec<_>>()
        })
        .collect();
    eprintln!("NAT cluster: paths:\n  {}", paths.join("\n  "));
    assert_eq!(link_named(&lab, 1, "h3")["path"], "relayed", "two symmetric NATs: {paths:?}");
    assert_ne!(
        link_named(&lab, 0, "h1")["path"],
        "relayed",
        "a port-forwarding NAT and a symmetric one punch: {paths:?}"
    );
    for h in 0..4 {
        for l in json(&lab, h, "links")["links"].as_array().unwrap() {
            assert!(l["security"] == "encrypt" && l["established"] == true, "host {h}: {l}");
        }
    }
    // Both NATs forget every mapping at once, under a 10 ms ping from
    // host 0's VM to host 1's.
    let (r0, r1) = (format!("{}-r0", lab.prefix), format!("{}-r1", lab.prefix));
    let (out, _) = {
        let (a, b) = (vms[0].clone(), vms[1].clone());
        let ip = b.ip.to_string();
        let ping = in_background(&a.ns, &["ping", "-n", "-i", "0.01", "-c", "600", "-W", "1", &ip]);
        std::thread::sleep(Duration::from_secs(2));
        for r in [&r0, &r1] {
            let o = lab.ns_output(r, &["conntrack", "-F"]).unwrap();
            assert!(o.status.success(), "conntrack -F: {o:?}");
        }
        (String::from_utf8_lossy(&ping.join().unwrap().stdout).to_string(), ())
    };
    let (r, gap) = ping_gap("NAT cluster: conntrack flushed on both NATs", &out, 600);
    eprintln!("NAT cluster: after the flush: {r:?}, longest gap {} ms", gap * 10);
    assert!(gap <= 200, "traffic stopped for {} ms after both NATs were flushed", gap * 10);
}

/// Issue 31: a cluster whose etcd and hosts are on an IPv6-only underlay:
/// the hosts' records carry IPv6 addresses, they converge, their VMs talk,
/// and a relocation under a 10 ms ping loses under 100 ms, on either path.
#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_cluster_on_an_ipv6_only_underlay_converges_and_relocates_a_vm_under_100ms() {
    let mut lab = lab(Spec { ipv6_underlay: true, vm_mtu: V6_VM_MTU, ..cluster_spec(3, 1, vec![]) });
    assert!(lab.etcd_url().starts_with("https://[fd00:77::fa]:"), "{}", lab.etcd_url());
    wait_converged(&lab, 3, 2);
    let records = lab.etcdctl(&["get", "--prefix", "/vnet/"]).unwrap();
    assert!(records.contains("[fd00:77::2]:9000"), "host 1's record has no IPv6 address:\n{records}");
    for h in 0..3 {
        assert_ipv6_only(&lab, h);
    }
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    assert_ping(&lab, &a, b.ip, V6_VM_MTU - 28);
    const PINGS: u32 = 300;
    let (out, _, v) = relocate_under_traffic(&mut lab, 10, PINGS, |lab, _| {
        wait_until(5.0, "host 0 routes the VM to its new host", || {
            route_to(lab, 0, &b.mac).as_deref() == Some("link h2")
        });
    });
    let (r, _) = ping_gap("IPv6 cluster relocation", &out, PINGS);
    // Measured: 4 lost (40 ms: the new host's claim reaching the others
    // through etcd's watch). At most 6: half as much again; the old bound
    // (under 10) let a relocation that waited for one more round pass.
    assert!(r.sent - r.received <= 6, "{} pings lost (10 ms apart): {r:?}", r.sent - r.received);
    assert_ping(&lab, &a, lab.vm(2, v).ip, 56);
}

/// What a migration's test sends: a Python TCP sender at a fixed rate
/// (`RATE` bytes a second) from a file, printing the bytes sent and the
/// longest a send blocked (ms).
const PACED_SENDER: &str = r#"
import socket, sys, time
ip, path, rate = sys.argv[1], sys.argv[2], float(sys.argv[3])
data = open(path, 'rb').read()
s = socket.create_connection((ip, 5001), timeout=60)
t0, sent, stall = time.time(), 0, 0.0
for i in range(0, len(data), 65536):
    b = time.time()
    s.sendall(data[i:i + 65536])
    stall = max(stall, time.time() - b)
    sent += len(data[i:i + 65536])
    ahead = sent / rate - (time.time() - t0)
    if ahead > 0:
        time.sleep(ahead)
s.close()
print(sent, round(stall * 1000))
"#;

/// Live migration (issue 29): host 1's QEMU guest (TCG, on a TAP) moves to
/// host 2 while a namespace VM on host 0 pings it every 20 ms and streams
/// 8 MB to it over TCP at 1 MB/s. The destination attached the TAP
/// `standby`; the guest's first frame there activates it; cluster mode
/// then reroutes every host from etcd, static mode through a `vnetctl move
/// ... wait` started with the migration. The stream must survive (md5 on
/// the guest's console, now the destination's) and the pings lost stay
/// under QEMU's own downtime plus 100 ms.
fn live_migration_under_ping_and_stream(cluster: bool) {
    let mut spec = if cluster {
        cluster_spec(3, 1, vec![])
    } else {
        Spec { hosts: 3, veth_hosts: vec![0, 1, 2], ..Spec::default() }
    };
    spec.qemu_hosts = vec![1];
    let mut lab = lab(spec);
    if cluster {
        wait_converged(&lab, 3, 2);
    }
    let (a, g) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, g.ip, 56);
    const MB: usize = 8;
    let data = lab.dir.join("payload");
    let bytes: Vec<u8> =
        (0..(MB << 20) as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&data, &bytes).unwrap();
    let sum = lab.ns_output(&a.ns, &["md5sum", data.to_str().unwrap()]).unwrap();
    let want = String::from_utf8_lossy(&sum.stdout).split_whitespace().next().unwrap_or("").to_string();
    const PINGS: u32 = 500;
    let ip = g.ip.to_string();
    let ping = in_background(&a.ns, &["ping", "-n", "-i", "0.02", "-c", &PINGS.to_string(), "-W", "1", &ip]);
    let rate = (1u32 << 20).to_string();
    let sender = in_background(&a.ns, &["python3", "-c", PACED_SENDER, &ip, data.to_str().unwrap(), &rate]);
    std::thread::sleep(Duration::from_secs(3));
    let m = lab.migrate_guest(1, 2).unwrap_or_else(|e| panic!("migration: {e}"));
    let moved = lab.vm(2, lab.hosts_vms(2) - 1).clone();
    let mode = if cluster { "cluster" } else { "static" };
    let paused_ms = m.paused_us.map(|us| us.div_ceil(1000)).unwrap_or(m.downtime_ms);
    eprintln!(
        "live migration ({mode}): the guest paused {paused_ms} ms (STOP to RESUME; QEMU's downtime {} ms), total {} ms ({})",
        m.downtime_ms, m.total_ms, m.query
    );
    if let Some(said) = &m.mover {
        eprintln!("the mover said:\n{said}");
    }
    // Host 0 routes the guest to its new host, which runs it active.
    wait_until(5.0, "host 0 routes the guest to host 2", || {
        route_to(&lab, 0, &g.mac).as_deref() == Some("link h2")
    });
    let i = json(&lab, 2, "interfaces")["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "vmig")
        .cloned()
        .unwrap();
    assert_eq!(i["state"], "active", "{i}");
    // Active, it is on the pass's path like any netdev (the kernel path's
    // on the kernel pass).
    if let Some(want) = lab.spec.datapath_of("netdev") {
        assert_eq!(i["datapath"], want, "{i}");
    }
    println!("{}", lab.check_datapaths().unwrap());
    assert!(
        json(&lab, 1, "interfaces")["interfaces"].as_array().unwrap().is_empty(),
        "the source kept an interface"
    );
    let sender = sender.join().unwrap();
    let said = String::from_utf8_lossy(&sender.stdout).to_string();
    assert!(
        sender.status.success(),
        "the TCP stream broke: {said} {}",
        String::from_utf8_lossy(&sender.stderr)
    );
    let line = console_line(&moved, "VNET-MD5 ", 60);
    assert_eq!(line, format!("VNET-MD5 {want} {}", MB << 20), "the destination guest's console: {line}");
    let out = ping.join().unwrap();
    let out = String::from_utf8_lossy(&out.stdout).to_string();
    let r = vnet_lab::PingResult::parse(&out);
    assert_eq!(r.sent, PINGS, "ping output not understood:\n{out}");
    let (lost, gap) = (r.sent - r.received, longest_gap(&out, r.sent));
    eprintln!(
        "live migration ({mode}): {lost} of {PINGS} pings lost (20 ms apart, ~{} ms), longest gap {gap}; \
         the stream (sent bytes, longest blocked send in ms): {}",
        lost * 20,
        said.trim()
    );
    assert!(
        u64::from(lost) * 20 < paused_ms + 100,
        "{lost} pings lost ({} ms) against the guest's pause of {paused_ms} ms + 100",
        lost * 20
    );
    if cluster {
        // Its own VM's MAC, and the guest's once it arrived.
        assert_eq!(lab.cluster_status(2).unwrap()["counters"]["macs_claimed"], 2);
    }
    assert_ping(&lab, &a, moved.ip, 56);
}

#[test]
#[ignore = "needs root, network namespaces and qemu-system-x86: run with --ignored"]
fn qemu_live_migration_in_cluster_mode_keeps_the_stream_and_loses_pings_only_for_the_downtime() {
    live_migration_under_ping_and_stream(true);
}

#[test]
#[ignore = "needs root, network namespaces and qemu-system-x86: run with --ignored"]
fn qemu_live_migration_in_static_mode_keeps_the_stream_and_loses_pings_only_for_the_downtime() {
    live_migration_under_ping_and_stream(false);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn cluster_survives_etcd_stopped_for_thirty_seconds_and_converges_on_its_return() {
    let mut lab = lab(cluster_spec(3, 1, vec![]));
    wait_converged(&lab, 3, 2);
    let (a, b, c) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone(), lab.vm(2, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    assert_ping(&lab, &a, c.ip, 56);
    // 20 ms pings for the whole outage and a while after.
    const PINGS: u32 = 2000;
    let (count, bip) = (PINGS.to_string(), b.ip.to_string());
    let ping = in_background(&a.ns, &["ping", "-n", "-q", "-i", "0.02", "-c", &count, "-W", "1", &bip]);
    std::thread::sleep(Duration::from_secs(2));
    lab.stop_etcd();
    wait_until(10.0, "every host says the store is down", || {
        (0..3).all(|h| lab.cluster_status(h).unwrap()["store"] == "down")
    });
    // Meanwhile: host 2's VM goes, host 1 gets a new one.
    delete_interface(&lab, 2, "vm0");
    let v = lab.add_vm(1).unwrap();
    let fresh = lab.vm(1, v).clone();
    let took = wait_until(1.0, "a new VM is routed locally while the store is away", || {
        route_to(&lab, 1, &fresh.mac).is_some_and(|t| t.starts_with("interface "))
    });
    eprintln!("cluster: with etcd away, a new VM was routed locally {took:?} after it was declared");
    std::thread::sleep(Duration::from_secs(28));
    let text = lab.control(0, "show cluster").unwrap().body;
    assert!(text.contains("store down"), "{text}");
    assert_eq!(route_to(&lab, 0, &c.mac).as_deref(), Some("link h2"), "the last state is kept");
    let m = lab.control(0, "show metrics").unwrap().body;
    assert!(m.contains("vnet_cluster_store_up 0\n"), "{m}");
    lab.start_etcd().unwrap();
    let took = wait_until(15.0, "the change made meanwhile converges", || {
        route_to(&lab, 0, &fresh.mac).as_deref() == Some("link h1") && route_to(&lab, 0, &c.mac).is_none()
    });
    eprintln!("cluster: etcd back; the change made while it was away converged on host 0 after {took:?}");
    let ping = ping.join().unwrap();
    let r = vnet_lab::PingResult::parse(&String::from_utf8_lossy(&ping.stdout));
    eprintln!("cluster: {} of {} pings lost across a 30 s etcd outage", r.sent - r.received, r.sent);
    assert_eq!(r.sent, PINGS);
    assert_eq!(r.received, r.sent, "pings lost across the outage: {r:?}");
    for h in 0..3 {
        assert!(lab.vnetd_alive(h), "vnetd {h} exited");
        assert_eq!(lab.cluster_status(h).unwrap()["store"], "up");
    }
    assert_ping(&lab, &a, fresh.ip, 56);
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

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn the_packaged_units_exec_start_runs_a_vnetd_that_passes_traffic() {
    // The command line of packaging/vnetd@.service, with the instance's
    // paths pointed into the lab, starts host 0's vnetd.
    let unit =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/vnetd@.service"))
            .unwrap();
    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("an ExecStart line");
    let mut lab = lab(Spec::default());
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    lab.stop_vnetd(0).unwrap();
    assert_no_ping(&lab, &a, b.ip);
    let (conf, sock) =
        (lab.hosts[0].config.display().to_string(), lab.hosts[0].control.display().to_string());
    let vnetd = vnet_lab::bin("vnetd").unwrap().display().to_string();
    let line = exec
        .replace("/etc/vnet/%i.conf", &conf)
        .replace("/run/vnet/%i.sock", &sock)
        .replace("/var/lib/vnet/%i", &lab.dir.join("unit-state").display().to_string())
        .replace("/usr/sbin/vnetd", &vnetd);
    assert!(!line.contains('%') && line.starts_with(&vnetd), "unit ExecStart not understood: {exec}");
    let args: Vec<&str> = line.split_whitespace().collect();
    let ns = lab.hosts[0].ns.clone();
    lab.spawn(&ns, &args).unwrap();
    wait_until(10.0, "the unit's vnetd answers on its control socket", || {
        lab.control(0, "show links").is_ok()
    });
    assert_ping(&lab, &a, b.ip, 56);
    assert_ping(&lab, &b, a.ip, 56);
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
    assert!(r.received >= 640 * 2 / 5, "{r:?}");
    assert!(gap <= 50, "a gap of {gap} pings (100 ms each) for a 1.5 s outage");
    assert!(tcp.status.success() && j.get("error").is_none(), "the TCP stream broke: {}", j);
    assert!(tail.len() >= 69, "iperf3 did not run its course: {tail:.0?}");
    assert!(tail.iter().rev().take(3).all(|&m| m > 10.0), "the stream did not recover: {tail:.0?}");
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

/// CPU seconds (user + system) a process has used so far.
fn cpu_s(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
    let rest = s.rsplit(')').next().unwrap_or_default();
    let f: Vec<f64> = rest.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    f.get(10).zip(f.get(11)).map_or(0.0, |(u, s)| (u + s) / 100.0)
}

const STORM: &str = r#"
import socket, sys, time
dev, src, secs = sys.argv[1], bytes.fromhex(sys.argv[2].replace(':', '')), float(sys.argv[3])
rate = float(sys.argv[4]) if len(sys.argv) > 4 else 0
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((dev, 0))
f = b'\xff' * 6 + src + b'\x88\xb5' + bytes(46)
start = time.time()
end, n = start + secs, 0
while time.time() < end:
    if rate:
        time.sleep(max(0.0, start + n / rate - time.time()))
    for _ in range(1 if rate else 1000):
        try:
            s.send(f)
            n += 1
        except OSError:
            pass
print(n)
"#;

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_vms_broadcast_storm_is_cut_to_its_limit_and_the_other_vms_keep_talking() {
    let lab = lab(Spec { vms_per_host: 2, ..Spec::default() });
    let (storm, other, far) = (lab.vm(0, 0).clone(), lab.vm(0, 1).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &other, far.ip, 56);
    let (p0, p1) = (lab.vnetd_pid(0).unwrap(), lab.vnetd_pid(1).unwrap());
    let (rss0, cpu0, cpu1) = (rss_kb(p0), cpu_s(p0), cpu_s(p1));
    let rx1 = link_json(&lab, 1)["rx_packets"].as_u64().unwrap();
    let script = lab.dir.join("storm.py");
    std::fs::write(&script, STORM).unwrap();
    const SECS: u64 = 8;
    let path = script.to_str().unwrap();
    let storm_run = in_background(&storm.ns, &["python3", path, &storm.dev, &storm.mac, &SECS.to_string()]);
    std::thread::sleep(Duration::from_millis(500));
    let r = lab.ping(&other, far.ip, 35, 56).unwrap();
    let sent: u64 = String::from_utf8_lossy(&storm_run.join().unwrap().stdout).trim().parse().unwrap_or(0);
    let (cpu0, cpu1) = (cpu_s(p0) - cpu0, cpu_s(p1) - cpu1);
    let rss = rss_kb(p0);
    let carried = link_json(&lab, 1)["rx_packets"].as_u64().unwrap() - rx1;
    let i = json(&lab, 0, "interfaces")["interfaces"][0].clone();
    let limited = i["broadcast_limited"].as_u64().unwrap();
    eprintln!(
        "storm: the VM sent {sent} broadcasts in {SECS} s; its vnetd dropped {limited} over the limit, host 1 \
         received {carried} frames; vnetd CPU {:.0} % (host 0) and {:.0} % (host 1) of a core; RSS {rss0} -> \
         {rss} kB; the other VM's ping {}/{}",
        cpu0 * 100.0 / SECS as f64,
        cpu1 * 100.0 / SECS as f64,
        r.received,
        r.sent
    );
    assert_eq!(i["name"], "vm0", "{i}");
    assert!(sent > 20_000, "the storm sent {sent} frames only");
    // What crossed is the limit's worth (1000 a second, the ping's 200
    // frames on top); the rest was dropped and counted at the source.
    assert!(carried <= 1000 * (SECS + 1) + 400, "host 1 received {carried} frames");
    assert!(limited >= sent / 2, "dropped {limited} of {sent}");
    assert!(r.received >= r.sent * 95 / 100, "the other VM's ping: {r:?}");
    assert!(cpu1 < 0.25 * SECS as f64, "host 1's vnetd used {cpu1:.1} CPU s in {SECS} s");
    assert!(rss < rss0 + 8 * 1024, "vnetd grew from {rss0} kB to {rss} kB");
}

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

/// The soak (`scripts/soak.sh MINUTES`; CI runs its 2-minute form): three
/// hosts under mixed traffic (a ping every 100 ms, a TCP stream, a UDP
/// stream, broadcasts) while a route is added or deleted every 100 ms, a
/// host's underlay goes down for a second every 10 s and the ping's target
/// VM moves to another host every 10 s. It checks: no panic and every
/// vnetd alive; the TCP and UDP streams survive; every ping sent, and each
/// one lost sent within [`SOAK_RECOVERY_S`] of a move or an outage; no frame
/// malformed, failing its offload, crossing networks or from a spoofed
/// MAC (`no_route` and `unknown_source` are what moves cost: reported);
/// vnetd's RSS does not grow (slope after the first third, and a bound).
/// `VNET_SOAK_SECS` (default 120) sets the length.
#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn soak_mixed_traffic_under_route_churn_link_flaps_and_relocations() {
    let secs: u64 = std::env::var("VNET_SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(120);
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
    let udp = in_background(&a.ns, &["iperf3", "-c", &bip, "-p", "5202", "-u", "-t", &t, "-b", "20M", "-J"]);
    let bcast = in_background(&c.ns, &["python3", script.to_str().unwrap(), &c.dev, &c.mac, &t, "50"]);
    let pids: Vec<u32> = (0..3).map(|h| lab.vnetd_pid(h).unwrap()).collect();
    let t0 = std::time::Instant::now();
    let (mut samples, mut churn, mut moves, mut flaps) = (Vec::new(), 0u64, 0u64, 0u64);
    let start = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let (mut where_b, mut v) = (1usize, 0usize);
    // When each move and outage began and ended (seconds since the epoch).
    let mut events: Vec<(f64, f64)> = Vec::new();
    let epoch = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
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

/// How long after a move or an underlay outage ends the soak still excuses
/// a lost ping. Seen: the last loss of an outage or a move is mostly
/// before its end (the path is back at once); once in a CI run (2026-11-25,
/// with a build beside it) pings went on being lost 0.9 s after an outage:
/// the kernel resolves the peer's address again when the underlay comes
/// back, and an ARP request lost as the link comes up is sent again only
/// after `retrans_time_ms` (1 s). One retransmission is excused, no more.
const SOAK_RECOVERY_S: f64 = 1.2;

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_thousand_control_connections_and_clients_killed_mid_transaction_change_nothing_and_cost_bounded_memory()
{
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;
    let lab = lab(Spec::default());
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 56);
    let pid = lab.vnetd_pid(0).unwrap();
    let (rss0, routes0) = (rss_kb(pid), json(&lab, 0, "routes")["routes"].as_array().unwrap().len());
    // 1000 connections held open: 64 are served, the rest told so and closed.
    let sock = lab.hosts[0].control.clone();
    let mut held: Vec<UnixStream> = (0..1000).filter_map(|_| UnixStream::connect(&sock).ok()).collect();
    std::thread::sleep(Duration::from_millis(500));
    let refused = held
        .iter_mut()
        .filter(|c| {
            let _ = c.set_read_timeout(Some(Duration::from_millis(20)));
            let mut line = String::new();
            BufReader::new(&**c).read_line(&mut line).is_ok() && line.contains("too many control connections")
        })
        .count();
    let rss = rss_kb(pid);
    let r = lab.ping(&a, b.ip, 10, 56).unwrap();
    eprintln!(
        "1000 control connections: {} opened, {refused} refused; vnetd RSS {rss0} -> {rss} kB; ping {}/10",
        held.len(),
        r.received
    );
    assert_eq!(held.len(), 1000);
    assert!(refused >= 1000 - 64, "{refused} refused");
    assert_eq!(r.received, 10, "{r:?}");
    assert!(rss < rss0 + 16 * 1024, "vnetd grew from {rss0} kB to {rss} kB");
    drop(held);
    // Served again at once when they are gone.
    let t0 = std::time::Instant::now();
    wait_until(2.0, "the control socket serves again", || lab.control(0, "show links").is_ok());
    eprintln!("served again {:?} after the 1000 closed", t0.elapsed());
    // Clients that die inside a transaction (once its lines are answered,
    // before `commit`; and right after sending `commit` without reading its
    // answer): the first kind leave nothing, the second all of theirs, and
    // the transaction slots come back.
    for (n, kill_after_commit) in (0..20).map(|n| (n, n % 2 == 1)) {
        let mut c = UnixStream::connect(&sock).unwrap();
        let mut lines = String::from("begin\n");
        for k in 0..3 {
            lines.push_str(&format!("route any 52:54:00:dd:{n:02x}:{k:02x} -> link h1\n"));
        }
        c.write_all(lines.as_bytes()).unwrap();
        let mut r = BufReader::new(c.try_clone().unwrap());
        for _ in 0..4 {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            assert_eq!(line, "end ok\n", "client {n}");
        }
        if kill_after_commit {
            c.write_all(b"commit\n").unwrap();
        }
        drop((r, c));
    }
    std::thread::sleep(Duration::from_millis(300));
    let routes = json(&lab, 0, "routes")["routes"].as_array().unwrap().clone();
    // Client n's routes are 52:54:00:dd:n:k: count what stayed per client.
    let mut stayed = std::collections::BTreeMap::<u8, usize>::new();
    for d in routes.iter().filter_map(|r| r["dst"].as_str()).filter(|d| d.starts_with("52:54:00:dd")) {
        *stayed.entry(u8::from_str_radix(&d[12..14], 16).unwrap()).or_default() += 1;
    }
    let ours: usize = stayed.values().sum();
    eprintln!("20 clients killed inside a transaction: {ours} of their 60 routes stayed (each commit all or nothing)");
    let committed: std::collections::BTreeMap<u8, usize> =
        (0..20).filter(|n| n % 2 == 1).map(|n| (n, 3)).collect();
    assert_eq!(stayed, committed, "routes that stayed, per client (the odd ones committed)");
    assert_eq!(routes.len(), routes0 + ours);
    // Every slot came back: as many transactions as the limit open again.
    lab.apply(0, "route any 52:54:00:dd:ff:01 -> link h1\n").unwrap();
    assert_ping(&lab, &a, b.ip, 56);
}

const FRAGMENTS: &str = r#"
import socket, struct, sys, time, os
dst, peer, network, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
end, n = time.time() + secs, 0
while time.time() < end:
    for _ in range(100):
        fid = struct.unpack('!I', os.urandom(4))[0]
        v = struct.pack('!BBHIIII', 1, 0, 20, network, fid, 3000, 0) + bytes(1400)
        udp = struct.pack('!HHHH', 9000, 9000, 8 + len(v), 0) + v
        ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                         socket.inet_aton(peer), socket.inet_aton(dst))
        try:
            s.sendto(ip + udp, (dst, 0))
            n += 1
        except OSError:
            pass
print(n)
"#;

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_flood_of_fragments_that_never_complete_costs_bounded_memory_and_whole_frames_keep_flowing() {
    let mut lab = lab(Spec::default());
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &b, a.ip, 1472);
    let pid = lab.vnetd_pid(0).unwrap();
    let (rss0, cpu0) = (rss_kb(pid), cpu_s(pid));
    let script = lab.dir.join("fragments.py");
    std::fs::write(&script, FRAGMENTS).unwrap();
    let network = link_json(&lab, 0)["network"].to_string();
    let (ip0, ip1) = (lab.hosts[0].underlay_ip.to_string(), lab.hosts[1].underlay_ip.to_string());
    let ns1 = lab.hosts[1].ns.clone();
    lab.spawn(&ns1, &["python3", script.to_str().unwrap(), &ip0, &ip1, &network, "12"]).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    // Whole frames (no reassembly) and frames of two fragments (1472-byte
    // pings over a 1500-byte underlay), from the flooded peer's address.
    let small = lab.ping(&b, a.ip, 20, 56).unwrap();
    let large = lab.ping(&b, a.ip, 20, 1472).unwrap();
    let rss = rss_kb(pid);
    // The pings took ~8 s of the flood's 12.
    let cpu = cpu_s(pid) - cpu0;
    let g = json(&lab, 0, "stats")["global"].clone();
    eprintln!(
        "fragment flood: vnetd RSS {rss0} -> {rss} kB, {cpu:.1} CPU s; fragments {}, completed {}, evicted {}, \
         timed out {}, rejected {}; ping 56 B {}/20, 1472 B (two fragments) {}/20",
        g["reasm_fragments"],
        g["reasm_completed"],
        g["reasm_evicted"],
        g["reasm_timed_out"],
        g["reasm_rejected"],
        small.received,
        large.received
    );
    assert!(g["reasm_evicted"].as_u64().unwrap() + g["reasm_timed_out"].as_u64().unwrap() > 10_000, "{g}");
    // When the flood stops, the partial frames it left time out (1 s) with
    // nothing more arriving: the slots come back and are counted.
    let timed_out = |lab: &Lab| json(lab, 0, "stats")["global"]["reasm_timed_out"].as_u64().unwrap();
    let t0 = timed_out(&lab);
    wait_until(15.0, "the flood's last partial frames time out", || timed_out(&lab) > t0);
    eprintln!("fragment flood: {} partial frames timed out after it stopped", timed_out(&lab) - t0);
    assert!(rss < rss0 + 16 * 1024, "vnetd grew from {rss0} kB to {rss} kB");
    assert!(cpu < 9.0, "vnetd used {cpu:.1} CPU s: more than a core");
    assert_eq!(small.received, 20, "{small:?}");
    // Reassembly keeps going between the flood's frames: a real frame's
    // two fragments arrive back to back.
    assert!(large.received >= 10, "{large:?}");
}

/// Host `h`'s interface `name` as `show interfaces json` has it.
fn iface_json(lab: &Lab, h: usize, name: &str) -> serde_json::Value {
    let all = json(lab, h, "interfaces")["interfaces"].as_array().cloned().unwrap_or_default();
    all.into_iter().find(|i| i["name"] == name).unwrap_or_default()
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
        "ip", "link", "add", &hd, "netns", &host_ns, "type", "veth", "peer", "name", &b.dev, "netns", &b.ns,
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

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn the_vhost_user_backend_carries_frames_between_front_ends_without_a_guest() {
    let lab = lab(Spec { vms_per_host: 0, ..Spec::default() });
    let rates = vnet_lab::vhost_load::measure(&lab, &[64, 1500, 60_000], 1.0, None).unwrap();
    for r in &rates {
        eprintln!(
            "vhost-user g0 -> g1, {} B frames: {:.0} frames/s taken, {:.0} placed ({:.0} ns a frame, {:.2} Gbit/s)",
            r.len,
            r.sent_per_s,
            r.received_per_s,
            r.ns_per_frame(),
            r.gbps
        );
        // Carried (a rate is the bench's: see the TAPs' below).
        assert!(r.received_per_s > 100.0, "{r:?}");
        assert!(r.received_per_s <= r.sent_per_s * 1.01 + 300.0, "more placed than sent: {r:?}");
    }
    let g1 = json(&lab, 0, "interfaces")["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "g1")
        .cloned()
        .unwrap();
    assert_eq!(g1["bad_chains"], 0);
    // Small frames after a burst's first were held and placed together at
    // its end, and every frame counted as sent to g1 is in its ring (a frame
    // is held only while the guest has a buffer posted for it).
    assert!(g1["held_frames"].as_u64().unwrap() > 1000, "{g1}");
    let placed: u64 = g1["pair_rx_frames"].as_array().unwrap().iter().filter_map(|n| n.as_u64()).sum();
    assert_eq!(placed, g1["tx_packets"].as_u64().unwrap(), "{g1}");
    // Frames larger than the headers routing reads went from g0's TX
    // buffers to g1's RX buffers directly (cut-through), none unreadable.
    let ifaces = json(&lab, 0, "interfaces");
    let g0 = ifaces["interfaces"].as_array().unwrap().iter().find(|i| i["name"] == "g0").unwrap();
    assert_eq!(g0["bad_chains"], 0, "{g0}");
    assert!(g0["cut_through"].as_u64().unwrap() >= 1000, "{g0}");
    // The same load through two TAPs (the user path's other way in).
    let taps = vnet_lab::vhost_load::measure_tap(&lab, &[64, 1500, 60_000], 1.0, None).unwrap();
    for (t, v) in taps.iter().zip(&rates) {
        eprintln!(
            "TAP t0 -> t1, {} B frames: {:.0} frames/s placed ({:.0} ns a frame, {:.2} Gbit/s); vhost-user / TAP: {:.2}x",
            t.len,
            t.received_per_s,
            t.ns_per_frame(),
            t.gbps,
            v.received_per_s / t.received_per_s.max(1.0)
        );
        // Carried: a hundred frames in the second at least (measured alone:
        // 12000 frames/s of 60000 bytes; with a release build and another
        // lab beside it, 643). The rates themselves are the bench's.
        assert!(t.received_per_s > 100.0, "{t:?}");
    }
}

/// The package scripts/package.sh built last (scripts/test.sh builds it
/// before the lab tests).
fn package_deb() -> std::path::PathBuf {
    let debs = vnet_lab::bench::repo_dir().join("target/debian");
    std::fs::read_dir(&debs)
        .unwrap_or_else(|e| panic!("{}: {e}: run scripts/package.sh first", debs.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vnet_") && n.ends_with(".deb"))
        })
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| panic!("no vnet_*.deb in {}: run scripts/package.sh first", debs.display()))
}

/// Removes the package on every exit path, when this test installed it.
struct Installed(bool);

impl Drop for Installed {
    fn drop(&mut self) {
        if self.0 {
            let _ = std::process::Command::new("dpkg").args(["--purge", "vnet"]).output();
        }
    }
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn the_installed_package_runs_the_demo_under_exactly_the_units_capabilities() {
    // The package scripts/package.sh built, installed as a user would.
    let deb = package_deb();
    let was = std::process::Command::new("dpkg-query").args(["-W", "-f=${Status}", "vnet"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&was.stdout).contains("ok installed"),
        "a vnet package is installed on this machine already: this test installs and removes its own"
    );
    let _installed = Installed(true);
    let out = std::process::Command::new("dpkg").arg("-i").arg(&deb).output().unwrap();
    assert!(out.status.success(), "dpkg -i {}: {}", deb.display(), String::from_utf8_lossy(&out.stderr));
    // The unit's capability bounding set, from the installed unit.
    let unit = std::fs::read_to_string("/lib/systemd/system/vnetd@.service").unwrap();
    let caps: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit names its capabilities")
        .split_whitespace()
        .map(String::from)
        .collect();
    assert!(caps.len() >= 3 && caps.iter().all(|c| c.starts_with("CAP_")), "{caps:?}");
    // The demo's two-host check, on each path, with the installed binaries
    // (once, on the user pass: it runs both itself).
    for datapath in [user(), Some("kernel".to_string())] {
        let mut spec = Spec {
            vnetd: Some("/usr/sbin/vnetd".into()),
            vnetd_caps: Some(caps.clone()),
            datapath: datapath.clone(),
            ..Spec::default()
        };
        if datapath.as_deref() == Some("kernel") {
            spec.vm_mtu = spec.underlay_mtu - vnet_wire::vnet::IPV4_ENCAP_OVERHEAD as u32;
        }
        let mut lab = lab(spec);
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        // It runs with those capabilities and no others.
        let pid = lab.vnetd_pid(0).unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let bnd = status.lines().find_map(|l| l.strip_prefix("CapBnd:")).unwrap().trim().to_string();
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
        assert_eq!(exe, std::path::Path::new("/usr/sbin/vnetd"));
        // Exactly the unit's set, less what this machine's own bounding set
        // lacks (a container's may lack CAP_SYS_RESOURCE: the unit then
        // cannot have it either).
        let mine = std::fs::read_to_string("/proc/self/status").unwrap();
        let mine = mine.lines().find_map(|l| l.strip_prefix("CapBnd:")).unwrap().trim().to_string();
        let (have, machine) = (cap_names(&bnd), cap_names(&mine));
        let want: Vec<String> =
            caps.iter().map(|c| c.to_lowercase()).filter(|c| machine.contains(c)).collect();
        assert_eq!(have, want.into_iter().collect(), "vnetd's bounding set {bnd}");
        assert_ping(&lab, &a, b.ip, 56);
        assert_ping(&lab, &b, a.ip, 1400);
        assert_stream(&mut lab, &a, &b, 2);
        assert_kernel_carried(&lab, 0);
        // The installed vnetctl reads the installed vnetd's counters.
        let ctl = format!("unix:{}", lab.hosts[0].control.display());
        let out = std::process::Command::new("/usr/bin/vnetctl")
            .args(["--control", &ctl, "show", "stats", "json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(s["links"][0]["tx_packets"].as_u64().unwrap() > 0, "{s}");
        let log = lab.log(0);
        assert!(!log.contains("Operation not permitted") && !log.contains("EPERM"), "{log}");
    }
}

// ---- systemd as PID 1: the package, its unit and the file descriptor store ----

/// The package with its version lowered to `0.0.1~prev`: an older package
/// of the same files, so that installing this one after it is an upgrade
/// (its postinst runs with the old version; what changes between
/// revisions' binaries is `scripts/upgrade-test.sh`'s).
fn previous_deb(deb: &std::path::Path, dir: &std::path::Path) -> std::path::PathBuf {
    let tree = dir.join("prev-deb");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(args[0]).args(&args[1..]).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    run(&["dpkg-deb", "-R", deb.to_str().unwrap(), tree.to_str().unwrap()]);
    let control = tree.join("DEBIAN/control");
    let text = std::fs::read_to_string(&control).unwrap();
    let text: String = text
        .lines()
        .map(|l| if l.starts_with("Version:") { "Version: 0.0.1~prev".to_string() } else { l.to_string() })
        .map(|l| l + "\n")
        .collect();
    std::fs::write(&control, text).unwrap();
    let out = dir.join("vnet_0.0.1~prev_amd64.deb");
    run(&["dpkg-deb", "--root-owner-group", "-b", tree.to_str().unwrap(), out.to_str().unwrap()]);
    out
}

/// `during` run in the machine under [`under_traffic_for`]'s traffic from
/// VM 0 of host 0 to VM 0 of host 1 (a ping every 10 ms, 700 of them, and
/// an 8 s TCP stream that must survive); returns how many pings were lost.
fn lost_during(lab: &mut Lab, m: &vnet_lab::Machine, what: &str, during: &str) -> u32 {
    const PINGS: u32 = 700;
    let mut took = Duration::ZERO;
    let (out, got) = under_traffic_for(lab, 10, PINGS, 8, |_| {
        let t0 = std::time::Instant::now();
        m.sh(during).unwrap_or_else(|e| panic!("{what}: {e}\n{}", journal(m)));
        took = t0.elapsed();
    });
    let r = vnet_lab::PingResult::parse(&out);
    assert_eq!(r.sent, PINGS, "ping output not understood:\n{out}");
    let lost = r.sent - r.received;
    let (_, gap) = ping_gap(what, &out, PINGS);
    eprintln!(
        "systemd: {what} took {took:?}: {lost} of {PINGS} pings lost (10 ms apart), longest gap {gap}; the stream carried {got} bytes"
    );
    lost
}

/// vnetd@lan's journal in the machine.
fn journal(m: &vnet_lab::Machine) -> String {
    m.sh("journalctl -u vnetd@lan --no-pager -o short-monotonic | tail -40").unwrap_or_default()
}

/// `vnetctl show WHAT json` in the machine.
fn machine_json(m: &vnet_lab::Machine, what: &str) -> serde_json::Value {
    let out = m.sh(&format!("vnetctl --control unix:/run/vnet/lan.sock show {what} json")).unwrap();
    serde_json::from_str(&out).unwrap()
}

/// Issue 46: a real systemd. Host 0 is a Debian machine booted with
/// systemd as its PID 1 (systemd-nspawn) in the host's namespace; the
/// package goes in with apt, and vnetd runs as `vnetd@lan` carrying host
/// 0's VM to host 1's. An edited config is applied by `systemctl reload`;
/// `systemctl restart` and a package upgrade hand over through systemd's
/// own file descriptor store under a TCP stream that must survive: no ping
/// lost at 10 ms on the kernel path, at most 2 on the user path;
/// `systemctl stop` leaves no TAP, program or pin.
#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn systemd_runs_the_package_reloads_restarts_and_upgrades_it_without_a_cut_and_stops_clean() {
    let deb = package_deb();
    let mut lab = lab(Spec { veth_hosts: vec![0, 1], ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    let kernel = lab.spec.datapath.as_deref() == Some("kernel");
    let want = lab.spec.datapath_of("netdev").unwrap_or("user");
    // Host 0's vnetd is systemd's: the lab's stops, its config goes to the
    // machine as /etc/vnet/lan.conf.
    lab.stop_vnetd(0).unwrap();
    let prev = previous_deb(&deb, &lab.dir);
    let m = vnet_lab::Machine::boot(&mut lab, 0).unwrap_or_else(|e| panic!("the machine: {e}"));
    assert_eq!(m.sh("cat /proc/1/comm").unwrap().trim(), "systemd");
    m.copy_in(&prev, "/root/vnet_0.0.1~prev_amd64.deb").unwrap();
    m.copy_in(&deb, "/root/vnet_new.deb").unwrap();
    m.sh("apt-get install -y -q /root/vnet_0.0.1~prev_amd64.deb >/dev/null").unwrap();
    m.copy_in(&lab.hosts[0].config, "/etc/vnet/lan.conf").unwrap();
    m.sh("systemctl enable --now vnetd@lan").unwrap_or_else(|e| panic!("{e}\n{}", journal(&m)));
    assert_eq!(m.sh("systemctl is-active vnetd@lan").unwrap().trim(), "active");
    assert_ping(&lab, &a, b.ip, 56);
    let i = machine_json(&m, "interfaces");
    for i in i["interfaces"].as_array().unwrap() {
        assert_eq!(i["datapath"], want, "{i}");
    }
    println!("datapaths (systemd's vnetd@lan): vm0 netdev {want}");
    // An edited config, applied by `systemctl reload` (SIGHUP).
    m.sh("echo 'route any 52:54:00:99:99:99 -> link h1' >> /etc/vnet/lan.conf && systemctl reload vnetd@lan")
        .unwrap();
    wait_until(5.0, "the reloaded route", || {
        machine_json(&m, "routes").to_string().contains("52:54:00:99:99:99")
    });
    let pid = |m: &vnet_lab::Machine| {
        m.sh("systemctl show -p MainPID --value vnetd@lan").unwrap().trim().to_string()
    };
    let before = pid(&m);
    let bound = if kernel { 0 } else { 2 };
    // `systemctl restart`: a hand-over through the store.
    let lost = lost_during(&mut lab, &m, "systemctl restart vnetd@lan", "systemctl restart vnetd@lan");
    let log = journal(&m);
    assert_ne!(pid(&m), before, "no new vnetd");
    assert!(lost <= bound, "{lost} pings lost across `systemctl restart`\n{log}");
    if !kernel {
        assert!(log.contains("hand-over: took"), "the restarted vnetd took nothing from the store:\n{log}");
    }
    assert!(machine_json(&m, "routes").to_string().contains("52:54:00:99:99:99"));
    // A package upgrade: the postinst hands each running vnetd over.
    let before = pid(&m);
    let lost = lost_during(&mut lab, &m, "apt-get install (upgrade)", "apt-get install -y -q /root/vnet_new.deb >/dev/null; while [ \"$(systemctl show -p MainPID --value vnetd@lan)\" = 0 ] || ! systemctl is-active -q vnetd@lan; do sleep 0.05; done");
    let log = journal(&m);
    assert_ne!(pid(&m), before, "the upgrade started no new vnetd:\n{log}");
    assert!(lost <= bound, "{lost} pings lost across the upgrade\n{log}");
    assert_ping(&lab, &a, b.ip, 56);
    // `systemctl stop`: nothing of vnetd left in host 0.
    m.sh("systemctl stop vnetd@lan").unwrap();
    assert_no_ping(&lab, &a, b.ip);
    let links = lab.ns_exec(&lab.hosts[0].ns, &["ip", "-br", "link"]).unwrap();
    let links = String::from_utf8_lossy(&links.stdout).to_string();
    assert!(!links.contains("vnh"), "a hand-off TAP left:\n{links}");
    let pins = m.sh("find /sys/fs/bpf -mindepth 1 -not -type d | wc -l").unwrap();
    assert_eq!(pins.trim(), "0", "pins left: {}", m.sh("find /sys/fs/bpf").unwrap());
    let tc = lab.ns_exec(&lab.hosts[0].ns, &["tc", "filter", "show", "dev", "c0", "ingress"]).unwrap();
    assert!(tc.stdout.is_empty(), "{}", String::from_utf8_lossy(&tc.stdout));
    let score = m.sh("systemd-analyze security vnetd@lan --no-pager | tail -1").unwrap_or_default();
    eprintln!("systemd-analyze security vnetd@lan: {}", score.trim());
}

/// The capability names (`cap_net_admin`, ...) of a hex mask from
/// /proc/PID/status, as `capsh --decode` names them.
fn cap_names(mask: &str) -> std::collections::BTreeSet<String> {
    let out = std::process::Command::new("capsh").arg(format!("--decode={mask}")).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let list = text.trim().split_once('=').map_or("", |(_, l)| l).to_string();
    list.split(',').filter(|c| !c.is_empty()).map(String::from).collect()
}

// ---- The CNI plugin, driven as a runtime drives it ----

/// A host-local IPAM section: `subnet`, addresses `first`..=`last` of it,
/// its files under the lab's directory (`dir`), no gateway route.
fn host_local(lab: &Lab, dir: &str, subnet: &str, first: &str, last: &str) -> serde_json::Value {
    serde_json::json!({
        "type": "host-local",
        "dataDir": lab.dir.join(dir).display().to_string(),
        "ranges": [[{ "subnet": subnet, "rangeStart": first, "rangeEnd": last }]],
    })
}

/// What an attachment leaves on host `h` of `lab`: vnetd's interfaces,
/// links named `vc*` in the host's namespace, records, host-local's
/// allocations under `ipam_dir`.
fn cni_leftovers(lab: &Lab, h: usize, ipam_dir: &str) -> Vec<String> {
    let mut left = Vec::new();
    let ifaces = json(lab, h, "interfaces");
    for i in ifaces["interfaces"].as_array().unwrap() {
        left.push(format!("vnetd interface {}", i["name"]));
    }
    let links = lab.ns_output(&lab.hosts[h].ns, &["ip", "-o", "link", "show"]).unwrap();
    for l in String::from_utf8_lossy(&links.stdout).lines() {
        if let Some(name) = l.split(": ").nth(1).filter(|n| n.starts_with("vc")) {
            left.push(format!("link {name}"));
        }
    }
    let walk = |d: std::path::PathBuf, what: &str, left: &mut Vec<String>| {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                let n = f.file_name().to_string_lossy().to_string();
                // host-local's own bookkeeping is not an allocation.
                if n != "lock" && !n.starts_with("last_reserved_ip") {
                    left.push(format!("{what} {}", f.path().display()));
                }
            }
        }
    };
    walk(lab.dir.join(format!("cni-h{h}")), "record", &mut left);
    walk(lab.dir.join(ipam_dir), "allocation", &mut left);
    left
}

/// The first address (without its prefix) and the MAC of an ADD result.
fn cni_address(r: &vnet_lab::CniRun) -> (String, String) {
    let addr = r.out["ips"][0]["address"].as_str().unwrap_or_else(|| panic!("no address: {}", r.out));
    let mac = r.out["interfaces"][0]["mac"].as_str().unwrap();
    (addr.split('/').next().unwrap().to_string(), mac.to_string())
}

/// A config with `prevResult`, as a runtime sends it for CHECK and DEL.
fn with_prev(conf: &serde_json::Value, prev: &serde_json::Value) -> Vec<u8> {
    let mut c = conf.clone();
    c["prevResult"] = prev.clone();
    c.to_string().into_bytes()
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn cni_containers_on_two_cluster_hosts_ping_move_64_mb_and_leave_nothing_behind() {
    let mut lab = lab(cluster_spec(2, 0, vec![]));
    wait_converged(&lab, 2, 0);
    let datapath = lab.spec.datapath.clone().unwrap_or_else(|| "user".into());
    let mut made = Vec::new();
    for h in 0..2 {
        let ns = lab.add_ns(format!("{}-c{h}", lab.prefix)).unwrap();
        // One subnet for both hosts: vnetd's `vnet` IPAM keeps it unique in etcd.
        let conf = lab.cni_conf(h, "1.1.0", serde_json::json!({ "type": "vnet", "subnet": "10.88.0.0/24" }));
        let id = format!("c{h}{}", std::process::id());
        let r =
            lab.cni(h, "ADD", &id, Some(&format!("/run/netns/{ns}")), conf.to_string().as_bytes()).unwrap();
        assert!(r.ok, "ADD on h{h}: {}\n{}", r.out, r.stderr);
        assert_eq!(r.out["cniVersion"], "1.1.0");
        assert_eq!(r.out["interfaces"][0]["name"], "eth0");
        assert_eq!(r.out["interfaces"][0]["mtu"], lab.spec.vm_mtu);
        assert_eq!(r.out["interfaces"][0]["sandbox"], format!("/run/netns/{ns}").as_str());
        let (ip, mac) = cni_address(&r);
        // Cluster mode publishes the container's MAC.
        let key = format!("/vnet/{}/macs/{mac}", lab.prefix);
        let took = wait_until(5.0, &format!("{key} in etcd"), || {
            lab.etcdctl(&["get", "--print-value-only", &key]).unwrap().contains(&format!("\"h{h}\""))
        });
        eprintln!("cni: h{h}'s container MAC in etcd {took:?} after ADD returned");
        let ifaces = json(&lab, h, "interfaces");
        let i = &ifaces["interfaces"][0];
        assert_eq!(
            (i["mac"].as_str(), i["datapath"].as_str()),
            (Some(mac.as_str()), Some(datapath.as_str())),
            "{i}"
        );
        made.push((ns, id, ip, mac, conf, r.out));
    }
    // Each host routes the other's container to its link.
    for h in 0..2 {
        let other = &made[1 - h].3;
        wait_until(5.0, &format!("h{h} routes {other}"), || {
            route_to(&lab, h, other).is_some_and(|t| t.starts_with("link"))
        });
    }
    let (c0, c1) = (&made[0], &made[1]);
    let warm = (0..10).any(|_| {
        let out = lab.ns_output(&c0.0, &["ping", "-c", "1", "-W", "1", &c1.2]).unwrap();
        out.status.success()
    });
    assert!(warm, "no reply from {} to {}\n{}\n{}", c1.2, c0.2, lab.log(0), lab.log(1));
    let out = lab.ns_output(&c0.0, &["ping", "-n", "-q", "-c", "5", "-i", "0.2", &c1.2]).unwrap();
    let p = vnet_lab::PingResult::parse(&String::from_utf8_lossy(&out.stdout));
    assert_eq!((p.sent, p.received), (5, 5), "{p:?}");
    let (sent, got) = tcp_md5_ns(&lab, &c0.0, &c1.0, &c1.2, 64);
    assert!(sent.len() == 32 && sent == got, "64 MB by TCP: sent md5 {sent}, received {got}");
    // CHECK holds, then fails once the declaration (h0) or the veth (h1)
    // is removed behind the plugin's back.
    for (h, c) in made.iter().enumerate() {
        let r =
            lab.cni(h, "CHECK", &c.1, Some(&format!("/run/netns/{}", c.0)), &with_prev(&c.4, &c.5)).unwrap();
        assert!(r.ok, "CHECK on h{h}: {}", r.out);
    }
    let name = json(&lab, 0, "interfaces")["interfaces"][0]["name"].as_str().unwrap().to_string();
    assert_eq!(lab.control(0, &format!("detach {name}")).unwrap().result, Ok(()));
    let r =
        lab.cni(0, "CHECK", &c0.1, Some(&format!("/run/netns/{}", c0.0)), &with_prev(&c0.4, &c0.5)).unwrap();
    assert_eq!(r.code(), 100, "CHECK after a detach: {}", r.out);
    let veth = json(&lab, 1, "interfaces")["interfaces"][0]["dev"].as_str().unwrap().to_string();
    lab.ns_exec(&lab.hosts[1].ns, &["ip", "link", "del", &veth]).unwrap();
    let r =
        lab.cni(1, "CHECK", &c1.1, Some(&format!("/run/netns/{}", c1.0)), &with_prev(&c1.4, &c1.5)).unwrap();
    assert_eq!(r.code(), 100, "CHECK after the veth went: {}", r.out);
    // DEL, twice each: no error, nothing left, the MACs gone from etcd.
    for (h, c) in made.iter().enumerate() {
        for round in 0..2 {
            let r = lab
                .cni(h, "DEL", &c.1, Some(&format!("/run/netns/{}", c.0)), &with_prev(&c.4, &c.5))
                .unwrap();
            assert!(r.ok && r.out.is_null(), "DEL {round} on h{h}: {}", r.out);
        }
        assert_eq!(cni_leftovers(&lab, h, "none"), Vec::<String>::new());
        let key = format!("/vnet/{}/macs/{}", lab.prefix, c.3);
        wait_until(5.0, &format!("{key} gone from etcd"), || {
            lab.etcdctl(&["get", "--print-value-only", &key]).unwrap().trim().is_empty()
        });
    }
    assert_eq!(ipam_keys(&lab), Vec::<String>::new(), "addresses left in etcd");
}

/// A vnetd restart (issue 29's gap, issue 30's restarts): the interfaces
/// `attach` made (here by CNI `ADD`s on two cluster hosts) come back from
/// the state directory, the containers ping again and `CHECK` holds; a
/// container deleted while vnetd was down (its `DEL` found no vnetd) is
/// dropped at the start, with a log line, not a failed start.
#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn cni_attachments_come_back_after_a_vnetd_restart_and_a_gone_containers_are_dropped() {
    let mut lab = lab(cluster_spec(2, 0, vec![]));
    wait_converged(&lab, 2, 0);
    let mut made = Vec::new();
    for (h, c) in [(0, "a"), (1, "b"), (0, "gone")] {
        let ns = lab.add_ns(format!("{}-{c}", lab.prefix)).unwrap();
        let conf = lab.cni_conf(h, "1.1.0", serde_json::json!({ "type": "vnet", "subnet": "10.88.0.0/24" }));
        let id = format!("{c}{}", std::process::id());
        let r =
            lab.cni(h, "ADD", &id, Some(&format!("/run/netns/{ns}")), conf.to_string().as_bytes()).unwrap();
        assert!(r.ok, "ADD {c} on h{h}: {}\n{}", r.out, r.stderr);
        let (ip, _) = cni_address(&r);
        made.push((ns, id, ip, conf, r.out));
    }
    let ping = |lab: &Lab, from: &str, to: &str| {
        (0..20).any(|_| lab.ns_output(from, &["ping", "-c", "1", "-W", "1", to]).unwrap().status.success())
    };
    assert!(ping(&lab, &made[1].0, &made[0].2), "b -> a before the restart");
    lab.stop_vnetd(0).unwrap();
    // Container `gone` goes while vnetd is down: its DEL finds no vnetd.
    let g = &made[2];
    let r = lab.cni(0, "DEL", &g.1, Some(&format!("/run/netns/{}", g.0)), &with_prev(&g.3, &g.4)).unwrap();
    assert!(r.ok, "DEL without vnetd: {}", r.out);
    lab.start_vnetd(0).unwrap();
    let names: Vec<String> = json(&lab, 0, "interfaces")["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["mac"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        names,
        vec![made[0].4["interfaces"][0]["mac"].as_str().unwrap().to_string()],
        "host 0's interfaces"
    );
    assert!(lab.log(0).contains("dropped"), "no word of the gone container:\n{}", lab.log(0));
    assert!(ping(&lab, &made[1].0, &made[0].2), "b -> a after the restart\n{}", lab.log(0));
    let a = &made[0];
    let r = lab.cni(0, "CHECK", &a.1, Some(&format!("/run/netns/{}", a.0)), &with_prev(&a.3, &a.4)).unwrap();
    assert!(r.ok, "CHECK after the restart: {}", r.out);
    // And a DEL after the restart removes it for good (no third start brings it back).
    let r = lab.cni(0, "DEL", &a.1, Some(&format!("/run/netns/{}", a.0)), &with_prev(&a.3, &a.4)).unwrap();
    assert!(r.ok, "{}", r.out);
    lab.stop_vnetd(0).unwrap();
    lab.start_vnetd(0).unwrap();
    assert!(json(&lab, 0, "interfaces")["interfaces"].as_array().unwrap().is_empty());
}

/// The address allocations in the lab's etcd.
fn ipam_keys(lab: &Lab) -> Vec<String> {
    let out =
        lab.etcdctl(&["get", "--prefix", "--keys-only", &format!("/vnet/{}/ipam/", lab.prefix)]).unwrap();
    out.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect()
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn cni_a_hundred_parallel_adds_on_two_hosts_share_a_subnet_without_a_duplicate_or_a_leak() {
    let mut lab = lab(cluster_spec(2, 0, vec![]));
    wait_converged(&lab, 2, 0);
    // Two containers per host at a time in a /29 (six addresses): four
    // ADDs at once race for them.
    let ns: Vec<String> = (0..4).map(|i| lab.add_ns(format!("{}-c{i}", lab.prefix)).unwrap()).collect();
    let ipam = serde_json::json!({ "type": "vnet", "subnet": "10.90.0.0/29" });
    let confs: Vec<String> = (0..2).map(|h| lab.cni_conf(h, "1.1.0", ipam.clone()).to_string()).collect();
    let mut adds = 0;
    for round in 0..25 {
        let results: Vec<(usize, String, vnet_lab::CniRun)> = std::thread::scope(|sc| {
            let runs: Vec<_> = (0..4)
                .map(|i| {
                    let (lab, ns, conf) = (&lab, &ns[i], &confs[i % 2]);
                    sc.spawn(move || {
                        let id = format!("r{round}c{i}");
                        let r =
                            lab.cni(i % 2, "ADD", &id, Some(&format!("/run/netns/{ns}")), conf.as_bytes());
                        (i, id, r.unwrap())
                    })
                })
                .collect();
            runs.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let mut seen = std::collections::HashMap::new();
        for (i, _, r) in &results {
            assert!(
                r.ok,
                "round {round}, container {i}: {}
{}",
                r.out, r.stderr
            );
            let (ip, _) = cni_address(r);
            if let Some(j) = seen.insert(ip.clone(), *i) {
                panic!("round {round}: containers {j} and {i} both got {ip}");
            }
            adds += 1;
        }
        assert_eq!(ipam_keys(&lab).len(), 4, "round {round}: one allocation per container");
        for (i, id, _) in &results {
            for _ in 0..2 {
                let r = lab.cni(
                    i % 2,
                    "DEL",
                    id,
                    Some(&format!("/run/netns/{}", ns[*i])),
                    confs[i % 2].as_bytes(),
                );
                assert!(r.as_ref().is_ok_and(|r| r.ok), "round {round}: DEL {id}: {r:?}");
            }
        }
    }
    assert_eq!(adds, 100);
    assert_eq!(ipam_keys(&lab), Vec::<String>::new(), "addresses leaked");
    for h in 0..2 {
        assert_eq!(cni_leftovers(&lab, h, "none"), Vec::<String>::new());
    }
    // Six addresses: six containers (one ADD each, in one namespace:
    // different interface names would do as well) and the seventh is
    // refused with code 101, leaving nothing of itself.
    let held: Vec<String> = (0..6).map(|i| format!("full{i}")).collect();
    let extra: Vec<String> = (0..3).map(|i| lab.add_ns(format!("{}-f{i}", lab.prefix)).unwrap()).collect();
    let spaces: Vec<&String> = ns.iter().chain(extra.iter()).collect();
    for (i, id) in held.iter().enumerate() {
        let r = lab
            .cni(i % 2, "ADD", id, Some(&format!("/run/netns/{}", spaces[i])), confs[i % 2].as_bytes())
            .unwrap();
        assert!(r.ok, "{id}: {}", r.out);
    }
    let r =
        lab.cni(0, "ADD", "late", Some(&format!("/run/netns/{}", spaces[6])), confs[0].as_bytes()).unwrap();
    assert_eq!(r.code(), 101, "the seventh in a /29: {}", r.out);
    eprintln!("cni: {}", r.out);
    assert_eq!(ipam_keys(&lab).len(), 6);
    for (i, id) in held.iter().enumerate() {
        let r = lab
            .cni(i % 2, "DEL", id, Some(&format!("/run/netns/{}", spaces[i])), confs[i % 2].as_bytes())
            .unwrap();
        assert!(r.ok, "{id}: {}", r.out);
    }
    assert_eq!(ipam_keys(&lab), Vec::<String>::new());
    for h in 0..2 {
        assert_eq!(cni_leftovers(&lab, h, "none"), Vec::<String>::new());
    }
}

/// A lab for the plugin's error cases (host 0 is used; a lone host has no underlay).
fn cni_lab() -> Lab {
    lab(Spec { hosts: 2, vms_per_host: 0, ..Spec::default() })
}

/// Runs ADD with `stdin` (or a valid config when `None`) and `netns` for
/// the container: its error code, and that it left nothing behind.
fn cni_add_fails(lab: &Lab, stdin: Option<&[u8]>, netns: Option<&str>) -> u64 {
    let conf = lab.cni_conf(0, "1.1.0", host_local(lab, "ipam", "10.89.0.0/24", "10.89.0.10", "10.89.0.10"));
    let body = conf.to_string();
    let r = lab.cni(0, "ADD", "bad1", netns, stdin.unwrap_or(body.as_bytes())).unwrap();
    assert!(!r.ok, "ADD succeeded: {}", r.out);
    let msg = r.out["msg"].as_str().unwrap_or("");
    assert!(
        !msg.is_empty() && r.out["cniVersion"].is_string(),
        "error JSON without msg or cniVersion: {}",
        r.out
    );
    eprintln!("cni: {}", r.out);
    assert_eq!(cni_leftovers(lab, 0, "ipam"), Vec::<String>::new());
    r.code()
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn cni_malformed_config_json_is_error_6_and_leaves_nothing() {
    let mut lab = cni_lab();
    let ns = lab.add_ns(format!("{}-c", lab.prefix)).unwrap();
    assert_eq!(
        cni_add_fails(&lab, Some(b"{\"cniVersion\": \"1.1.0\", "), Some(&format!("/run/netns/{ns}"))),
        6
    );
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn cni_unknown_version_is_error_1_and_leaves_nothing() {
    let mut lab = cni_lab();
    let ns = lab.add_ns(format!("{}-c", lab.prefix)).unwrap();
    let mut conf = lab.cni_conf(0, "1.1.0", serde_json::Value::Null);
    conf["cniVersion"] = "7.0.0".into();
    assert_eq!(cni_add_fails(&lab, Some(conf.to_string().as_bytes()), Some(&format!("/run/netns/{ns}"))), 1);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn cni_missing_netns_is_error_3_and_leaves_nothing() {
    let lab = cni_lab();
    assert_eq!(cni_add_fails(&lab, None, Some(&format!("/run/netns/{}-nothere", lab.prefix))), 3);
}

/// What vnetd holds on host `h` (its running configuration: links, routes,
/// interfaces): to show a refused request changed none of it.
fn holdings(lab: &Lab, h: usize) -> String {
    let r = lab.control(h, "show config").unwrap();
    assert_eq!(r.result, Ok(()));
    r.body
}

/// A control line hidden in a value of the network configuration.
const INJECTED: &str = "\nlink evil udp 192.0.2.9:9000\nroute any ff:ff:ff:ff:ff:ff -> link evil";

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn cni_config_values_holding_control_lines_are_error_7_and_change_nothing() {
    let mut lab = cni_lab();
    let ns = lab.add_ns(format!("{}-c", lab.prefix)).unwrap();
    let before = holdings(&lab, 0);
    let vhost = format!("{}{INJECTED}", lab.dir.join("vhost").display());
    let cases = [
        ("vhostUserDir", serde_json::Value::String(vhost.clone())),
        ("vhostUserDir", serde_json::Value::String(format!("{} # network 7", lab.dir.display()))),
        ("ipam", serde_json::json!({ "type": "vnet", "subnet": format!("10.89.0.0/24{INJECTED}") })),
        ("ipam", serde_json::json!({ "type": "vnet", "subnet": "10.89.0.0/24 range 10.89.0.1 10.89.0.1" })),
    ];
    for (key, value) in cases {
        let mut conf = lab.cni_conf(0, "1.1.0", serde_json::Value::Null);
        conf[key] = value;
        let code = cni_add_fails(&lab, Some(conf.to_string().as_bytes()), Some(&format!("/run/netns/{ns}")));
        assert_eq!(code, 7, "{key}: an invalid network config");
        assert_eq!(holdings(&lab, 0), before, "{key}: vnetd's links, routes or interfaces changed");
    }
}

/// A seqpacket socket at `path` served by uid 65534 (nobody) in a child
/// process, as a local user who got there first would: bound in a
/// directory of its own beside the lab's (removed again), then moved to
/// `path`. The child is the lab's, stopped with it.
fn serve_as_nobody(lab: &mut Lab, path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let own = std::env::temp_dir().join(format!("{}-nobody", lab.prefix));
    std::fs::create_dir_all(&own).unwrap();
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o777)).unwrap();
    let bound = own.join("s");
    let script = format!(
        "import socket, time\ns = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\ns.bind({:?})\ns.listen(4)\n\
         while True:\n    c, _ = s.accept()\n    c.send(b'x')\n    time.sleep(30)\n",
        bound.display().to_string()
    );
    let ns = lab.hosts[0].ns.clone();
    lab.spawn(
        &ns,
        &["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", &script],
    )
    .unwrap();
    wait_until(5.0, "nobody's socket", || bound.exists());
    std::fs::rename(&bound, path).unwrap();
    std::fs::remove_dir_all(&own).unwrap();
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn a_state_dir_or_ca_others_may_write_and_a_hand_over_served_by_another_user_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    // Issue 44, finding 10: vnetd read these without asking who may change them.
    let mut lab = cni_lab();
    let state = lab.dir.join("state-h0");
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    lab.stop_vnetd(0).unwrap();
    std::fs::create_dir_all(&state).unwrap();
    mode(&state, 0o777);
    let e = lab.start_vnetd(0).unwrap_err().to_string();
    assert!(e.contains("--state-dir") && e.contains("chmod go-w"), "{e}");
    // A hand-over socket in it served by another user: nothing is taken, and vnetd says why.
    let sock = state.join("handover");
    mode(&state, 0o700);
    serve_as_nobody(&mut lab, &sock);
    lab.start_vnetd(0).unwrap();
    let log = std::fs::read_to_string(&lab.hosts[0].log).unwrap_or_default();
    assert!(log.contains("served by uid 65534"), "{log}");
    // A CA others may write: a `tls` line naming it is refused, and says how to fix it.
    let ca = lab.dir.join("ca.pem");
    std::fs::write(&ca, "not even a certificate").unwrap();
    mode(&ca, 0o666);
    let line = format!("tls cert {0} key {0} ca {1}", lab.dir.join("none.pem").display(), ca.display());
    let r = lab.control(0, &line).unwrap();
    assert!(r.result.is_err(), "{r:?}");
    let log = std::fs::read_to_string(&lab.hosts[0].log).unwrap_or_default();
    assert!(
        log.contains("lets others change the CA") || r.result.as_ref().unwrap_err().0.contains("chmod go-w"),
        "{log}"
    );
}

/// Runs the libvirt hook (the package's binary) as libvirtd would, with
/// `--config conf`: its exit status and stderr.
fn hook(conf: &std::path::Path, domain: &str, op: &str, xml: &str) -> (bool, String) {
    let mut c = std::process::Command::new(vnet_lab::bin("vnet-libvirt-hook").unwrap())
        .arg("--config")
        .arg(conf)
        .args([domain, op, "begin", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut c.stdin.take().unwrap(), xml.as_bytes()).unwrap();
    let out = c.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn libvirt_hook_takes_endpoint_and_network_from_the_host_and_refuses_what_a_domain_xml_asks_beyond() {
    let lab = cni_lab();
    let conf = lab.dir.join("libvirt-hook.conf");
    let ctl = lab.hosts[0].control.display().to_string();
    std::fs::write(&conf, format!("control unix:{ctl}\nnetwork 3\ndomain web network 7\n")).unwrap();
    let sock = lab.dir.join("web.sock").display().to_string();
    let xml = |attach: &str, path: &str| {
        format!(
            "<domain type='qemu'><name>web</name><metadata><vnet:attach xmlns:vnet='urn:vnet:libvirt:1' {attach}/></metadata>\
             <devices><interface type='vhostuser'><mac address='52:54:00:44:00:01'/>\
             <source type='unix' path='{path}' mode='client'/><model type='virtio'/></interface></devices></domain>"
        )
    };
    let before = holdings(&lab, 0);
    for (why, x, says) in [
        (
            "a newline in <source path>",
            xml("", &format!("{sock}&#10;link evil udp 192.0.2.9:9000")),
            "<source path>",
        ),
        ("a space in <source path>", xml("", &format!("{sock} network 9")), "<source path>"),
        ("another network", xml("network='8'", &sock), "asks for network 8"),
        ("another vnetd", xml("control='unix:/run/vnet/other.sock'", &sock), "asks for vnetd"),
    ] {
        let (ok, err) = hook(&conf, "web", "prepare", &x);
        assert!(!ok && err.contains(says), "{why}: the hook did not refuse: {err}");
        assert!(
            !err.contains('\n') || err.trim_end().lines().count() == 1,
            "{why}: one line of refusal: {err}"
        );
        assert_eq!(holdings(&lab, 0), before, "{why}: vnetd changed");
    }
    // The same domain as the host allows it: attached, in the host's network for it.
    let (ok, err) = hook(&conf, "web", "prepare", &xml("network='7'", &sock));
    assert!(ok, "{err}");
    let now = holdings(&lab, 0);
    let decl = now.lines().find(|l| l.starts_with("interface lv-web-0 vhost-user ")).unwrap_or_default();
    assert!(decl.contains(&sock) && decl.contains(" network 7"), "{now}");
    let (ok, err) = hook(&conf, "web", "release", &xml("", &sock));
    assert!(ok, "{err}");
    assert_eq!(holdings(&lab, 0), before, "release left something");
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn cni_vnetd_not_running_is_error_11_and_leaves_nothing_and_status_says_50() {
    let mut lab = cni_lab();
    let ns = lab.add_ns(format!("{}-c", lab.prefix)).unwrap();
    let conf = lab.cni_conf(0, "1.1.0", serde_json::Value::Null).to_string();
    let r = lab.cni(0, "STATUS", "", None, conf.as_bytes()).unwrap();
    assert!(r.ok, "STATUS with vnetd up: {}", r.out);
    lab.stop_vnetd(0).unwrap();
    let r = lab.cni(0, "STATUS", "", None, conf.as_bytes()).unwrap();
    assert_eq!(r.code(), 50, "STATUS with vnetd down: {}", r.out);
    // Leftovers are counted with vnetd back (an empty one: it has no config lines for containers).
    let r = lab.cni(0, "ADD", "bad1", Some(&format!("/run/netns/{ns}")), conf.as_bytes()).unwrap();
    assert_eq!(r.code(), 11, "{}", r.out);
    lab.start_vnetd(0).unwrap();
    assert_eq!(cni_leftovers(&lab, 0, "ipam"), Vec::<String>::new());
    // DEL with vnetd gone is no error either.
    lab.stop_vnetd(0).unwrap();
    let r = lab.cni(0, "DEL", "bad1", Some(&format!("/run/netns/{ns}")), conf.as_bytes()).unwrap();
    assert!(r.ok, "DEL with vnetd down: {}", r.out);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn cni_an_exhausted_subnet_is_an_error_and_leaves_nothing_of_the_failed_add() {
    let mut lab = cni_lab();
    let (a, b) = (
        lab.add_ns(format!("{}-ca", lab.prefix)).unwrap(),
        lab.add_ns(format!("{}-cb", lab.prefix)).unwrap(),
    );
    // The range holds one address: the first container takes it
    // (host-local 1.1 speaks CNI up to 1.0.0).
    let conf = lab.cni_conf(0, "1.0.0", host_local(&lab, "ipam", "10.89.0.0/24", "10.89.0.10", "10.89.0.10"));
    let conf = conf.to_string();
    let r = lab.cni(0, "ADD", "ok1", Some(&format!("/run/netns/{a}")), conf.as_bytes()).unwrap();
    assert!(r.ok, "{}", r.out);
    let before = cni_leftovers(&lab, 0, "ipam");
    let r = lab.cni(0, "ADD", "bad1", Some(&format!("/run/netns/{b}")), conf.as_bytes()).unwrap();
    assert!(!r.ok && r.out["msg"].as_str().unwrap().contains("no IP addresses available"), "{}", r.out);
    eprintln!("cni: {}", r.out);
    assert_eq!(cni_leftovers(&lab, 0, "ipam"), before, "the failed ADD left something");
    let r = lab.cni(0, "DEL", "ok1", Some(&format!("/run/netns/{a}")), conf.as_bytes()).unwrap();
    assert!(r.ok, "{}", r.out);
    assert_eq!(cni_leftovers(&lab, 0, "ipam"), Vec::<String>::new());
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn cni_a_vhost_user_attachment_returns_its_socket_path_and_del_removes_it() {
    let lab = cni_lab();
    let dir = lab.dir.join("vhost");
    std::fs::create_dir_all(&dir).unwrap();
    let mut conf = lab.cni_conf(0, "1.1.0", serde_json::Value::Null);
    conf["vhostUserDir"] = dir.display().to_string().into();
    conf["datapath"] = "user".into();
    let conf = conf.to_string();
    let r = lab.cni(0, "ADD", "vm1", Some("/proc/self/ns/net"), conf.as_bytes()).unwrap();
    assert!(r.ok, "{}\n{}", r.out, r.stderr);
    let sock =
        r.out["interfaces"][0]["socketPath"].as_str().unwrap_or_else(|| panic!("no socketPath: {}", r.out));
    assert!(sock.starts_with(&dir.display().to_string()), "{sock}");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(sock).unwrap().file_type().is_socket(), "{sock} is no socket");
    let mac = r.out["interfaces"][0]["mac"].as_str().unwrap();
    let i = json(&lab, 0, "interfaces")["interfaces"][0].clone();
    assert_eq!((i["kind"].as_str(), i["mac"].as_str()), (Some("vhost-user"), Some(mac)), "{i}");
    for _ in 0..2 {
        let r = lab.cni(0, "DEL", "vm1", Some("/proc/self/ns/net"), conf.as_bytes()).unwrap();
        assert!(r.ok, "{}", r.out);
    }
    assert!(std::fs::metadata(sock).is_err(), "{sock} is still there");
    assert_eq!(cni_leftovers(&lab, 0, "none"), Vec::<String>::new());
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn podman_containers_on_two_cluster_hosts_on_a_vnet_cni_network_ping_move_64_mb_and_rm_leaves_nothing() {
    let lab = lab(cluster_spec(2, 0, vec![]));
    wait_converged(&lab, 2, 0);
    let net = format!("net{}", lab.prefix);
    let podmen: Vec<vnet_lab::Podman> = (0..2)
        .map(|h| {
            let mut plugin =
                lab.cni_conf(h, "1.0.0", serde_json::json!({ "type": "vnet", "subnet": "10.92.0.0/24" }));
            plugin.as_object_mut().unwrap().remove("cniVersion");
            plugin.as_object_mut().unwrap().remove("name");
            let conflist = serde_json::json!({ "cniVersion": "1.0.0", "name": net, "plugins": [plugin] });
            vnet_lab::Podman::new(&lab, h, &conflist).unwrap()
        })
        .collect();
    let mut c = Vec::new();
    for (h, p) in podmen.iter().enumerate() {
        let name = format!("c{h}");
        p.ok(&["run", "-d", "--name", &name, "--network", &net, "localhost/vnetbox", "/bin/sleep", "600"])
            .unwrap_or_else(|e| panic!("{e}\n{}", lab.log(h)));
        let f = format!("{{{{.NetworkSettings.SandboxKey}}}} {{{{(index .NetworkSettings.Networks \"{net}\").IPAddress}}}} {{{{(index .NetworkSettings.Networks \"{net}\").MacAddress}}}}");
        let out = p.ok(&["inspect", "--format", &f, &name]).unwrap();
        let v: Vec<String> = out.split_whitespace().map(str::to_string).collect();
        assert_eq!(v.len(), 3, "inspect: {out}");
        let ns = v[0].trim_start_matches("/run/netns/").to_string();
        eprintln!("podman: h{h}'s {name} is {} ({}) in {}", v[1], v[2], ns);
        c.push((name, ns, v[1].clone(), v[2].clone()));
    }
    assert_ne!(c[0].2, c[1].2, "one address for two containers");
    // The containers' interfaces are on the lab's data path.
    let datapath = lab.spec.datapath.clone().unwrap_or_else(|| "user".into());
    for h in 0..2 {
        let i = json(&lab, h, "interfaces")["interfaces"][0].clone();
        assert_eq!(
            (i["mac"].as_str(), i["datapath"].as_str()),
            (Some(c[h].3.as_str()), Some(datapath.as_str())),
            "{i}"
        );
        wait_until(5.0, "the other host's container routed", || {
            route_to(&lab, h, &c[1 - h].3).is_some_and(|t| t.starts_with("link"))
        });
    }
    // The containers ping each other (busybox's ping, inside them).
    for (a, b) in [(0, 1), (1, 0)] {
        let warm =
            (0..10).any(|_| podmen[a].ok(&["exec", &c[a].0, "ping", "-c", "1", "-W", "1", &c[b].2]).is_ok());
        assert!(warm, "{} got no reply from {}", c[a].0, c[b].2);
        let out = podmen[a].ok(&["exec", &c[a].0, "ping", "-c", "5", "-i", "0.2", &c[b].2]).unwrap();
        assert!(out.contains("5 packets transmitted, 5 packets received"), "{out}");
    }
    // 64 MB by TCP between their namespaces (python3 of the host's, in the
    // containers' namespaces: the image has no python).
    let (sent, got) = tcp_md5_ns(&lab, &c[0].1, &c[1].1, &c[1].2, 64);
    assert!(sent.len() == 32 && sent == got, "64 MB by TCP: sent md5 {sent}, received {got}");
    // podman rm: nothing left on either host or in etcd.
    for (h, p) in podmen.iter().enumerate() {
        p.ok(&["rm", "--force", "--time", "0", &c[h].0]).unwrap();
        assert_eq!(cni_leftovers(&lab, h, "none"), Vec::<String>::new());
        let key = format!("/vnet/{}/macs/{}", lab.prefix, c[h].3);
        wait_until(5.0, &format!("{key} gone from etcd"), || {
            lab.etcdctl(&["get", "--print-value-only", &key]).unwrap().trim().is_empty()
        });
        assert!(!std::path::Path::new(&format!("/run/netns/{}", c[h].1)).exists(), "{} is left", c[h].1);
    }
    assert_eq!(ipam_keys(&lab), Vec::<String>::new(), "addresses left in etcd");
}

/// A libvirt domain (TCG) on a TAP libvirt makes, with vnet's metadata:
/// joined by the hook, no vnetd line written for it.
fn libvirt_domain(lab: &Lab, name: &str, mac: &str, ip: &str, console: &std::path::Path) -> String {
    let (kernel, initrd) = vnet_lab::guest_files().unwrap();
    format!(
        "<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <metadata>
    <vnet:attach xmlns:vnet='urn:vnet:libvirt:1'/>
  </metadata>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{kernel}</kernel>
    <initrd>{initrd}</initrd>
    <cmdline>console=ttyS0 quiet panic=-1 vnet_ip={ip}/24 vnet_mtu={mtu}</cmdline>
  </os>
  <on_reboot>destroy</on_reboot>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <interface type='ethernet'>
      <mac address='{mac}'/>
      <target dev='vt-guest0' managed='yes'/>
      <model type='virtio'/>
      <mtu size='{mtu}'/>
    </interface>
    <serial type='file'><source path='{console}'/><target port='0'/></serial>
    <memballoon model='none'/>
  </devices>
</domain>",
        mtu = lab.spec.vm_mtu,
        console = console.display(),
    )
}

/// A vhost-user domain as `docs/INTEGRATION.md` prints it: shared memory
/// (memfd), the `vhostuser` interface vnetd serves, and, for QEMU 7.2 under
/// TCG, the device's MSI-X vectors off (`qemu:override`, libvirt 8.2+):
/// without it QEMU crashed on the guest's first interrupt (3 of 3).
fn libvirt_vhost_domain(
    lab: &Lab,
    name: &str,
    mac: &str,
    ip: &str,
    sock: &std::path::Path,
    console: &std::path::Path,
) -> String {
    let (kernel, initrd) = vnet_lab::guest_files().unwrap();
    format!(
        "<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{name}</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <metadata>
    <vnet:attach xmlns:vnet='urn:vnet:libvirt:1'/>
  </metadata>
  <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{kernel}</kernel>
    <initrd>{initrd}</initrd>
    <cmdline>console=ttyS0 quiet panic=-1 vnet_ip={ip}/16 vnet_mtu={mtu}</cmdline>
  </os>
  <on_reboot>destroy</on_reboot>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <interface type='vhostuser'>
      <mac address='{mac}'/>
      <source type='unix' path='{sock}' mode='client'/>
      <model type='virtio'/>
      <alias name='ua-vnet0'/>
    </interface>
    <serial type='file'><source path='{console}'/><target port='0'/></serial>
    <memballoon model='none'/>
  </devices>
  <qemu:override>
    <qemu:device alias='ua-vnet0'>
      <qemu:frontend>
        <qemu:property name='vectors' type='unsigned' value='0'/>
      </qemu:frontend>
    </qemu:device>
  </qemu:override>
</domain>",
        mtu = lab.spec.vm_mtu,
        sock = sock.display(),
        console = console.display(),
    )
}

#[test]
#[ignore = "needs root, network namespaces, libvirtd and qemu-system-x86: run with --ignored"]
fn libvirt_a_vhost_user_domain_as_the_docs_print_it_boots_pings_and_leaves_quietly() {
    // Issue 45: a vhost-user guest started by libvirt crashed QEMU 7.2
    // under TCG (3 of 3) unless the domain set `vectors=0`, which the docs
    // did not say; and every `virsh destroy` logged a hook error at
    // `release` ("no <target dev>").
    // scripts/test.sh prepares libvirtd: its absence is a failure, not a pass.
    if let Some(why) = vnet_lab::Libvirt::unavailable() {
        panic!("libvirtd cannot run the lab's guests here: {why}");
    }
    let lab = lab(cluster_spec(2, 1, vec![]));
    wait_converged(&lab, 2, 1);
    let a = lab.vm(0, 0).clone();
    let mut lv = vnet_lab::Libvirt::start(&lab, 1).unwrap();
    let (dom, mac, ip) = (format!("{}-vu", lab.prefix), "52:54:00:93:00:fb", "10.88.9.250");
    let console = lab.dir.join("libvirt-vhost-console.log");
    let sock = lab.dir.join("vu-guest.sock");
    lv.define(&dom, &libvirt_vhost_domain(&lab, &dom, mac, ip, &sock, &console)).unwrap();
    lv.start_domain(&dom).unwrap_or_else(|e| panic!("{e}\n{}", lv.log()));
    let i = json(&lab, 1, "interfaces")["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["mac"] == mac)
        .cloned();
    assert_eq!(i.as_ref().map(|i| i["kind"].clone()), Some("vhost-user".into()), "{i:?}");
    wait_until(180.0, "the guest's console says it is ready", || {
        std::fs::read_to_string(&console).unwrap_or_default().contains("VNET-GUEST-READY")
    });
    let warm =
        (0..30).any(|_| lab.ns_output(&a.ns, &["ping", "-c", "1", "-W", "1", ip]).unwrap().status.success());
    assert!(warm, "VM A got no reply from the vhost-user guest\n{}", lv.log());
    lv.virsh(&["destroy", &dom]).unwrap();
    wait_until(5.0, "the guest's interface gone from host 1", || {
        !json(&lab, 1, "interfaces")["interfaces"].as_array().unwrap().iter().any(|i| i["mac"] == mac)
    });
    let log = lv.log();
    assert!(
        !log.contains("no <target dev>") && !log.contains("vnet-libvirt-hook:"),
        "the hook said something at destroy:\n{log}"
    );
}

#[test]
#[ignore = "needs root, network namespaces, libvirtd and qemu-system-x86: run with --ignored"]
fn libvirt_a_domain_joins_the_overlay_on_start_leaves_on_destroy_and_starts_again() {
    // scripts/test.sh prepares libvirtd: its absence is a failure, not a pass.
    if let Some(why) = vnet_lab::Libvirt::unavailable() {
        panic!("libvirtd cannot run the lab's guests here: {why}");
    }
    let mut lab = lab(cluster_spec(2, 0, vec![]));
    wait_converged(&lab, 2, 0);
    // A container on host 0, through the CNI plugin.
    let ns = lab.add_ns(format!("{}-c0", lab.prefix)).unwrap();
    let ipam = serde_json::json!({
        "type": "vnet", "subnet": "10.93.0.0/24", "rangeStart": "10.93.0.10", "rangeEnd": "10.93.0.100"
    });
    let conf = lab.cni_conf(0, "1.1.0", ipam);
    let r = lab.cni(0, "ADD", "c0", Some(&format!("/run/netns/{ns}")), conf.to_string().as_bytes()).unwrap();
    assert!(r.ok, "{}", r.out);
    // A libvirt domain on host 1.
    let mut lv = vnet_lab::Libvirt::start(&lab, 1).unwrap();
    let (dom, mac, ip) = (format!("{}-vm", lab.prefix), "52:54:00:93:00:fa", "10.93.0.250");
    let console = lab.dir.join("libvirt-console.log");
    lv.define(&dom, &libvirt_domain(&lab, &dom, mac, ip, &console)).unwrap();
    let name = format!("lv-{dom}-0");
    for round in 0..2 {
        let _ = std::fs::remove_file(&console);
        lv.start_domain(&dom).unwrap_or_else(|e| panic!("round {round}: {e}\n{}", lv.log()));
        let i = json(&lab, 1, "interfaces")["interfaces"][0].clone();
        assert_eq!(
            (i["name"].as_str(), i["mac"].as_str()),
            (Some(name.as_str()), Some(mac)),
            "round {round}: {i}"
        );
        wait_until(120.0, "the guest's console says it is ready", || {
            std::fs::read_to_string(&console).unwrap_or_default().contains("VNET-GUEST-READY")
        });
        wait_until(5.0, "host 0 routes the guest's MAC to host 1", || {
            route_to(&lab, 0, mac).is_some_and(|t| t.starts_with("link"))
        });
        let warm = (0..30)
            .any(|_| lab.ns_output(&ns, &["ping", "-c", "1", "-W", "1", ip]).unwrap().status.success());
        assert!(warm, "round {round}: the container got no reply from the guest\n{}", lv.log());
        let out = lab.ns_output(&ns, &["ping", "-n", "-q", "-c", "3", "-i", "0.2", ip]).unwrap();
        let p = vnet_lab::PingResult::parse(&String::from_utf8_lossy(&out.stdout));
        assert_eq!((p.sent, p.received), (3, 3), "round {round}: {p:?}");
        // virsh destroy: the port goes (the hook's `stopped`/`release`), and with it the MAC's claim.
        lv.virsh(&["destroy", &dom]).unwrap();
        wait_until(5.0, "the guest's interface gone from host 1", || {
            json(&lab, 1, "interfaces")["interfaces"].as_array().unwrap().is_empty()
        });
        let key = format!("/vnet/{}/macs/{mac}", lab.prefix);
        wait_until(5.0, &format!("{key} gone from etcd"), || {
            lab.etcdctl(&["get", "--print-value-only", &key]).unwrap().trim().is_empty()
        });
    }
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn cni_gc_removes_exactly_the_attachments_not_listed_as_valid() {
    let mut lab = lab(cluster_spec(2, 0, vec![]));
    wait_converged(&lab, 2, 0);
    let conf = lab.cni_conf(0, "1.1.0", serde_json::json!({ "type": "vnet", "subnet": "10.94.0.0/24" }));
    let mut made = Vec::new();
    for i in 0..3 {
        let ns = lab.add_ns(format!("{}-g{i}", lab.prefix)).unwrap();
        let id = format!("gc{i}");
        let r =
            lab.cni(0, "ADD", &id, Some(&format!("/run/netns/{ns}")), conf.to_string().as_bytes()).unwrap();
        assert!(r.ok, "{}", r.out);
        made.push((id, cni_address(&r).1));
    }
    assert_eq!(ipam_keys(&lab).len(), 3);
    // The runtime says only gc1 is valid: gc0 and gc2 go, gc1 stays whole.
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = serde_json::json!([{ "containerID": "gc1", "ifname": "eth0" }]);
    let r = lab.cni(0, "GC", "", None, gc.to_string().as_bytes()).unwrap();
    assert!(r.ok, "GC: {}", r.out);
    let ifaces = json(&lab, 0, "interfaces");
    let macs: Vec<&str> =
        ifaces["interfaces"].as_array().unwrap().iter().filter_map(|i| i["mac"].as_str()).collect();
    assert_eq!(macs, vec![made[1].1.as_str()], "what vnetd has after GC");
    assert_eq!(ipam_keys(&lab).len(), 1, "one address left");
    assert_eq!(cni_leftovers(&lab, 0, "none").len(), 3, "gc1's interface, veth and record");
    // GC with nothing valid removes the rest; a GC of 1.0.0 is refused.
    gc["cni.dev/valid-attachments"] = serde_json::json!([]);
    assert!(lab.cni(0, "GC", "", None, gc.to_string().as_bytes()).unwrap().ok);
    assert_eq!(cni_leftovers(&lab, 0, "none"), Vec::<String>::new());
    assert_eq!(ipam_keys(&lab), Vec::<String>::new());
    gc["cniVersion"] = "1.0.0".into();
    assert_eq!(lab.cni(0, "GC", "", None, gc.to_string().as_bytes()).unwrap().code(), 1);
}

#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn secured_links_agree_on_a_cipher_and_a_named_one_the_peer_refuses_gets_no_session() {
    let lab = lab(Spec { links: Links::Encrypt, ..Spec::default() });
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    assert_ping(&lab, &a, b.ip, 1400);
    // `auto` on both ends: AES-256-GCM where the CPU has AES and CLMUL.
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    let flags = cpu.lines().find(|l| l.starts_with("flags")).unwrap_or_default().to_string();
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    let best = if has("aes") && has("pclmulqdq") { "aes-256-gcm" } else { "chacha20-poly1305" };
    for h in 0..2 {
        let l = link_json(&lab, h);
        assert_eq!((l["cipher"].as_str(), l["cipher_option"].as_str()), (Some(best), Some("auto")), "{l}");
    }
    // Host h's link to its peer with `cipher c`, and the route to the peer's VM.
    let link_line = |h: usize, c: &str| {
        let p = 1 - h;
        let key = lab.hosts[p].key.as_ref().unwrap().1;
        let vm = lab.vm(p, 0);
        format!(
            "link h{p} udp {}:9000 peer-key {key} security encrypt cipher {c}\nroute any {} -> link h{p}\n",
            lab.hosts[p].underlay_ip, vm.mac
        )
    };
    // Host 1 names ChaCha20-Poly1305: host 0 (auto) agrees to it.
    replace_link(&lab, 1, "h0", &link_line(1, "chacha20-poly1305"));
    wait_until(10.0, "a ChaCha20-Poly1305 session", || {
        lab.ping(&b, a.ip, 1, 56).is_ok_and(|r| r.received == 1)
            && (0..2).all(|h| link_json(&lab, h)["cipher"] == "chacha20-poly1305")
    });
    assert_ping(&lab, &a, b.ip, 1400);
    // Host 0 names AES-256-GCM: two named ciphers that differ make no
    // session, and neither end falls back to the other's.
    replace_link(&lab, 0, "h1", &link_line(0, "aes-256-gcm"));
    assert_no_ping(&lab, &a, b.ip);
    std::thread::sleep(Duration::from_secs(2));
    let (l0, l1) = (link_json(&lab, 0), link_json(&lab, 1));
    assert_eq!((l0["established"].as_bool(), l0["cipher"].as_str()), (Some(false), Some("")), "{l0}");
    let refused = l0["cipher_refused"].as_u64().unwrap() + l1["cipher_refused"].as_u64().unwrap();
    assert!(refused >= 2, "host 0: {l0}\nhost 1: {l1}");
    assert_eq!(l0["bad_handshakes"].as_u64().unwrap() + l1["bad_handshakes"].as_u64().unwrap(), 0);
    eprintln!("refused: {refused}; host 0: {l0}");
}

/// Issue 32: a `raw` or VXLAN link carries one frame per datagram; the
/// receiving vnetd merges a GRO batch's consecutive TCP segments into TCP
/// GSO frames for the VM's TAP (`vnet_wire::gro`) instead of writing each.
#[test]
#[ignore = "needs root and network namespaces: run with --ignored"]
fn raw_and_vxlan_links_hand_the_vm_tcp_segments_merged_into_gso_frames() {
    // The user path's merging: on it whatever the pass (user_only).
    for (links, format) in [(Links::Udp, Format::Raw), (Links::Vxlan, Format::Vnet)] {
        let mut lab = lab(Spec { links, format, vm_mtu: MIXED_VM_MTU, datapath: user(), ..Spec::default() });
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, MIXED_VM_MTU - 28);
        let bytes = assert_stream(&mut lab, &a, &b, 2);
        assert_stream(&mut lab, &b, &a, 1);
        let l = link_json(&lab, 1);
        assert_ne!(l["datapath"], "kernel", "{l}");
        let g = &json(&lab, 1, "stats")["global"];
        let (frames, segs) = (g["rx_gro_frames"].as_u64().unwrap(), g["rx_gro_segments"].as_u64().unwrap());
        // Most of the stream's bytes came as merged frames of several segments.
        let mss = u64::from(MIXED_VM_MTU - 40);
        assert!(frames > 0 && segs >= 4 * frames, "{links:?}: {frames} frames of {segs} segments: {g}");
        assert!(segs * mss > bytes / 2, "{links:?}: {segs} segments merged of {bytes} bytes: {g}");
        eprintln!("{links:?}: {bytes} bytes, {frames} GSO frames of {segs} segments");
    }
}

// ---- docs/QUICKSTART.md, run as it is written ----

/// The `sh` blocks of `docs/QUICKSTART.md`, by the word after `on=`, in order.
fn quickstart_blocks() -> Vec<(String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/QUICKSTART.md");
    let text = std::fs::read_to_string(path).unwrap();
    type Block = (String, String);
    let (mut out, mut cur): (Vec<Block>, Option<Block>) = (Vec::new(), None);
    for line in text.lines() {
        match cur.as_mut() {
            Some(_) if line.trim_start().starts_with("```") => out.extend(cur.take()),
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {
                if let Some(on) = line.strip_prefix("```sh on=") {
                    cur = Some((on.trim().to_string(), String::new()));
                }
            }
        }
    }
    out
}

/// A machine of the quickstart: a lab namespace with a mount namespace of
/// its own, whose /etc/vnet, /var/lib/vnet, /run/vnet (and the admin's
/// /root) are empty tmpfs, held by a sleeping process; each block runs in
/// it with `nsenter`.
struct Machine {
    pid: u32,
}

/// Kills what the quickstart started in the lab's namespaces (etcd, the
/// vnetds its `systemctl` started: ours, by the namespaces they are in),
/// and removes the mount points it made; on every exit, before the lab
/// deletes the namespaces.
struct QuickstartGuard {
    namespaces: Vec<String>,
    made: Vec<std::path::PathBuf>,
}

impl Drop for QuickstartGuard {
    fn drop(&mut self) {
        for sig in ["-TERM", "-KILL"] {
            for ns in &self.namespaces {
                let out = std::process::Command::new("ip").args(["netns", "pids", ns]).output();
                let pids = out.map(|o| String::from_utf8_lossy(&o.stdout).to_string()).unwrap_or_default();
                for pid in pids.split_whitespace() {
                    let _ = std::process::Command::new("kill").args([sig, pid]).status();
                }
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        for d in self.made.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
        let _ = std::fs::remove_dir_all(lab_bin_dir().0);
    }
}

fn quickstart_machine(lab: &mut Lab, ns: &str, admin: bool) -> Machine {
    let root = if admin { " && mount -t tmpfs -o mode=0700 vnet /root" } else { "" };
    let script = format!(
        "mount -t tmpfs -o mode=0750 vnet /etc/vnet && mount -t tmpfs -o mode=0700 vnet /var/lib/vnet \
         && mount -t tmpfs -o mode=0755 vnet /run/vnet{root} && touch /run/vnet/.ready && exec sleep 3600"
    );
    let pid =
        lab.spawn(ns, &["unshare", "--mount", "--propagation", "private", "sh", "-c", &script]).unwrap();
    let m = Machine { pid };
    wait_until(5.0, "the machine's mount namespace is up", || {
        quickstart_run(&m, &[], "test -e /run/vnet/.ready").status.success()
    });
    m
}

/// Runs `script` (bash, -euo pipefail) on machine `m` with `vars` set.
fn quickstart_run(m: &Machine, vars: &[(&str, String)], script: &str) -> std::process::Output {
    let bin = lab_bin_dir();
    let path = format!("{}:{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", bin.0, bin.1);
    let mut c = std::process::Command::new("nsenter");
    c.args(["--target", &m.pid.to_string(), "--mount", "--net", "--", "env", &format!("PATH={path}")]);
    for (k, v) in vars {
        c.arg(format!("{k}={v}"));
    }
    c.args(["bash", "-euo", "pipefail", "-c", script]).stdin(std::process::Stdio::null());
    c.output().unwrap()
}

/// (the lab's `systemctl` shim's directory, vnetd's and vnetctl's).
fn lab_bin_dir() -> (String, String) {
    let shim = std::env::temp_dir().join(format!("vnet-quickstart-bin-{}", std::process::id()));
    let vnetd = vnet_lab::bin("vnetd").unwrap();
    (shim.display().to_string(), vnetd.parent().unwrap().display().to_string())
}

/// A `systemctl` that does what systemd does with the package's unit for
/// `enable --now vnetd@NAME`: its StateDirectory, then its ExecStart (read
/// from packaging/vnetd@.service, the binary the build's), in the
/// background; it returns once the control socket answers (the unit is
/// Type=notify). No systemd runs in the lab (PID 1 is not systemd here).
fn write_systemctl_shim() -> std::path::PathBuf {
    let unit =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/vnetd@.service"))
            .unwrap();
    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).unwrap().to_string();
    let vnetd = vnet_lab::bin("vnetd").unwrap();
    let exec = exec.replace("/usr/sbin/vnetd", &vnetd.display().to_string());
    let dir = std::path::PathBuf::from(lab_bin_dir().0);
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        r#"#!/bin/bash
# The quickstart lab's systemctl: `enable --now vnetd@NAME` as systemd runs packaging/vnetd@.service.
set -eu
[ "$1 $2" = "enable --now" ] || {{ echo "lab systemctl: only enable --now UNIT" >&2; exit 1; }}
name=${{3#vnetd@}}
mkdir -p -m 0700 /var/lib/vnet/$name
cmd='{exec}'
cmd=${{cmd//%i/$name}}
setsid $cmd > /run/vnet/$name.log 2>&1 < /dev/null &
for i in $(seq 150); do
    vnetctl --control unix:/run/vnet/$name.sock show links > /dev/null 2>&1 && exit 0
    sleep 0.1
done
echo "vnetd@$name did not come up:" >&2; cat /run/vnet/$name.log >&2; exit 1
"#
    );
    let path = dir.join("systemctl");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    dir
}

#[test]
#[ignore = "needs root, network namespaces and etcd: run with --ignored"]
fn quickstart_commands_run_verbatim_and_the_vms_ping() {
    // Issue 45: docs/QUICKSTART.md's blocks, verbatim: an admin machine
    // (lab host 0, 10.77.0.1) makes the network in three commands; hosts
    // 1-3 join in two each (join, approve); their VMs ping; then host 4.
    let mut lab = lab(Spec {
        hosts: 5,
        vms_per_host: 1,
        veth_hosts: (0..5).collect(),
        no_vnetd: true,
        ..Spec::default()
    });
    assert_eq!(lab.hosts[0].underlay_ip.to_string(), "10.77.0.1", "the page's admin address");
    let blocks = quickstart_blocks();
    let block = |on: &str| -> Vec<String> {
        blocks.iter().filter(|(o, _)| o == on).map(|(_, b)| b.clone()).collect()
    };
    let (network, host, approve, vm) = (block("admin"), block("host"), block("approve"), block("vm"));
    assert_eq!((network.len(), host.len(), approve.len(), vm.len()), (1, 1, 1, 1), "{blocks:?}");
    let count =
        |b: &str| b.lines().filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')).count();
    let (per_network, per_host) = (count(&network[0]), count(&host[0]) + count(&approve[0]));
    eprintln!("quickstart: {per_network} commands for the network, {per_host} per host, 0 files by hand");
    assert!(per_network <= 3 && per_host <= 2, "{per_network} per network, {per_host} per host");
    let mut guard =
        QuickstartGuard { namespaces: lab.hosts.iter().map(|h| h.ns.clone()).collect(), made: Vec::new() };
    for d in ["/etc/vnet", "/var/lib/vnet", "/run/vnet"] {
        let p = std::path::PathBuf::from(d);
        if !p.exists() {
            std::fs::create_dir_all(&p).unwrap();
            guard.made.push(p);
        }
    }
    write_systemctl_shim();
    let nss: Vec<String> = lab.hosts.iter().map(|h| h.ns.clone()).collect();
    let machines: Vec<Machine> =
        nss.iter().enumerate().map(|(h, ns)| quickstart_machine(&mut lab, ns, h == 0)).collect();
    let ok = |what: &str, o: std::process::Output| -> String {
        assert!(
            o.status.success(),
            "{what}: {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let said = ok("the network's block", quickstart_run(&machines[0], &[], &network[0]));
    let token = said.lines().rev().find(|l| l.starts_with("vnet1.")).expect("a join token").to_string();
    let join_host = |h: usize| {
        let vars = vec![("TOKEN", token.clone()), ("HOST", format!("h{h}"))];
        let t0 = std::time::Instant::now();
        let m = Machine { pid: machines[h].pid };
        let script = host[0].clone();
        let joining = std::thread::spawn(move || quickstart_run(&m, &vars, &script));
        // The admin approves once the request is there (join files it first).
        let approve_vars = vec![("HOST", format!("h{h}"))];
        let mut tries = 0;
        loop {
            let o = quickstart_run(&machines[0], &approve_vars, &approve[0]);
            if o.status.success() {
                break;
            }
            tries += 1;
            assert!(tries < 50, "approve h{h}: {}", String::from_utf8_lossy(&o.stderr));
            std::thread::sleep(Duration::from_millis(100));
        }
        ok(&format!("join h{h}"), joining.join().unwrap());
        let vm = lab.vm(h, 0).clone();
        let vars = vec![("VMDEV", vm.host_dev.clone().unwrap()), ("VMMAC", vm.mac.clone())];
        ok(&format!("attach h{h}'s VM"), quickstart_run(&machines[h], &vars, &block("vm")[0]));
        eprintln!("quickstart: host h{h} joined and its VM attached in {:?}", t0.elapsed());
    };
    for h in 1..=3 {
        join_host(h);
    }
    let vms: Vec<Vm> = (1..=4).map(|h| lab.vm(h, 0).clone()).collect();
    let check = block("check")[0].clone();
    let status = ok("show cluster", quickstart_run(&machines[1], &[], &check));
    assert!(status.contains("store up") && status.contains("hosts 3: h1 h2 h3"), "{status}");
    wait_until(5.0, "h1's VM pings h2's and h3's", || {
        ping_pairs(&[(vms[0].clone(), vms[1].ip), (vms[0].clone(), vms[2].ip)]).is_empty()
    });
    // The fourth host: the same two commands; nothing changes on the others.
    join_host(4);
    wait_until(5.0, "h4's VM pings h1's, h2's and h3's", || {
        ping_pairs(&[(vms[3].clone(), vms[0].ip), (vms[3].clone(), vms[1].ip), (vms[3].clone(), vms[2].ip)])
            .is_empty()
    });
    let links = ok(
        "show links",
        quickstart_run(&machines[4], &[], "vnetctl --control unix:/run/vnet/lab.sock --json show links"),
    );
    let v: serde_json::Value = serde_json::from_str(&links).unwrap();
    let all = v["links"].as_array().unwrap();
    assert_eq!(all.len(), 3, "{links}");
    assert!(all.iter().all(|l| l["security"] == "encrypt" && l["established"] == true), "{links}");
    drop(guard);
}
