//! At the edge (issue 50): what a host answers for its VMs instead of
//! flooding the overlay. ARP requests and neighbour solicitations are
//! answered by the asker's own host for the addresses of its `neigh`
//! lines, on either data path (the kernel path's program answers them in
//! place).

use super::harness::*;

/// The lines of `pcap` (tcpdump -e: the source MAC after the time stamp)
/// of frames from `mac` that contain `what`.
fn captured_from(pcap: &std::path::Path, mac: &str, what: &str) -> Vec<String> {
    let out = std::process::Command::new("tcpdump")
        .args(["-n", "-e", "-r", pcap.to_str().unwrap()])
        .output()
        .unwrap();
    let mac = mac.to_lowercase();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(what) && l.split_whitespace().nth(1) == Some(mac.as_str()))
        .map(str::to_string)
        .collect()
}

/// ARP requests from `mac` in `pcap`.
fn arp_requests_from(pcap: &std::path::Path, mac: &str) -> Vec<String> {
    captured_from(pcap, mac, "Request")
}

/// Neighbour solicitations from `mac` in `pcap`.
fn solicitations_from(pcap: &std::path::Path, mac: &str) -> Vec<String> {
    captured_from(pcap, mac, "neighbor solicitation")
}

/// The ARP requests host `h` answered: by the engine (`neigh_answered`)
/// and, on the kernel path, in place by the eBPF program
/// (`kernel_neigh_answered`), which must then have answered them all: the
/// engine sees none of a kernel-path interface's ARP requests it answers.
fn answered(lab: &Lab, h: usize) -> u64 {
    let g = json(lab, h, "stats")["global"].clone();
    let (user, kernel) =
        (g["neigh_answered"].as_u64().unwrap(), g["kernel_neigh_answered"].as_u64().unwrap_or(0));
    if lab.spec.datapath.as_deref() == Some("kernel") {
        assert_eq!(user, 0, "the kernel path's interfaces' ARP was answered in place: {g}");
    } else {
        assert_eq!(kernel, 0, "{g}");
    }
    user + kernel
}

mod both {
    use super::*;

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_vms_arp_for_a_neigh_address_is_answered_by_its_own_host_and_never_reaches_the_owner() {
        let mut lab = lab(Spec::default());
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        lab.apply(0, &format!("neigh {} {}\n", b.ip, b.mac)).unwrap();
        for vm in [&a, &b] {
            lab.ns_exec(&vm.ns, &["ip", "neigh", "flush", "all"]).unwrap();
        }
        // B's side sees every ARP request that crosses the overlay.
        let pcap = lab.dir.join("arp.pcap");
        capture(&mut lab, &b.ns, &b.dev, "arp", &pcap);
        assert_ping(&lab, &a, b.ip, 56);
        std::thread::sleep(std::time::Duration::from_secs(1));
        let neigh = lab.ns_exec(&a.ns, &["ip", "neigh", "show", &b.ip.to_string()]).unwrap();
        assert!(String::from_utf8_lossy(&neigh.stdout).contains(&b.mac), "A resolved B: {neigh:?}");
        let g = json(&lab, 0, "stats")["global"].clone();
        assert!(answered(&lab, 0) >= 1, "host 0 answered: {g}");
        assert_eq!(g["neigh_flooded"], 0, "{g}");
        let crossed = arp_requests_from(&pcap, &a.mac);
        assert!(crossed.is_empty(), "A's ARP requests reached B: {crossed:?}");

        // Without the line, A's next question crosses the overlay (the
        // capture sees what it should).
        lab.apply(0, &format!("delete neigh {}\n", b.ip)).unwrap();
        lab.ns_exec(&a.ns, &["ip", "neigh", "flush", "all"]).unwrap();
        let pcap = lab.dir.join("arp2.pcap");
        capture(&mut lab, &b.ns, &b.dev, "arp", &pcap);
        assert_ping(&lab, &a, b.ip, 56);
        std::thread::sleep(std::time::Duration::from_secs(1));
        assert!(!arp_requests_from(&pcap, &a.mac).is_empty(), "A's ARP request did not reach B");
        let g = json(&lab, 0, "stats")["global"].clone();
        assert!(g["neigh_flooded"].as_u64().unwrap() >= 1, "{g}");
    }

    /// IPv6: a VM's neighbour solicitation for a `neigh` address is
    /// answered by its own host (on the kernel path by the eBPF program,
    /// in place), and never reaches the owner.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_vms_neighbour_solicitation_for_a_neigh_address_is_answered_by_its_own_host() {
        let mut lab = lab(Spec::default());
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        let v6 = |vm: &Vm| format!("fd00:51::{}", vm.ip.octets()[2] + 1);
        for vm in [&a, &b] {
            // The lab's VMs have IPv6 off: on for these two.
            for k in ["all", vm.dev.as_str()] {
                let key = format!("net.ipv6.conf.{k}.disable_ipv6=0");
                lab.ns_exec(&vm.ns, &["sysctl", "-q", "-w", &key]).unwrap();
            }
            let addr = format!("{}/64", v6(vm));
            lab.ns_exec(&vm.ns, &["ip", "-6", "addr", "add", &addr, "dev", &vm.dev, "nodad"]).unwrap();
        }
        // The lab's routes carry broadcast, not IPv6 multicast: B's
        // solicited-node group is routed to B here, so that without a
        // `neigh` line A's solicitation does reach B (the positive control)
        // and "none reached B" below is a check that could fail.
        let o = v6(&b).parse::<std::net::Ipv6Addr>().unwrap().octets();
        let group = format!("33:33:ff:{:02x}:{:02x}:{:02x}", o[13], o[14], o[15]);
        lab.apply(0, &format!("route any {group} -> link h1\n")).unwrap();
        lab.apply(1, &format!("route any {group} -> interface vm0\n")).unwrap();
        // B's way back: a static entry (B's own solicitation for A would
        // go nowhere).
        let (a6, b_dev) = (v6(&a), b.dev.clone());
        let back = ["ip", "-6", "neigh", "replace", &a6, "lladdr", &a.mac, "dev", &b_dev, "nud", "permanent"];
        lab.ns_exec(&b.ns, &back).unwrap();
        let open = lab.dir.join("nd-open.pcap");
        capture(&mut lab, &b.ns, &b.dev, "icmp6", &open);
        let ping6 = |lab: &Lab| {
            let out = lab.ns_output(&a.ns, &["ping", "-6", "-n", "-c", "2", "-W", "2", &v6(&b)]).unwrap();
            let said = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(said.contains("2 received"), "ping6 a -> b: {said}");
        };
        ping6(&lab);
        wait_until(5.0, "without a neigh line, A's solicitation reaches B", || {
            !solicitations_from(&open, &a.mac).is_empty()
        });
        // Now answered at the edge: A forgets B and asks again.
        lab.apply(0, &format!("neigh {} {}\n", v6(&b), b.mac)).unwrap();
        lab.ns_exec(&a.ns, &["ip", "-6", "neigh", "flush", "all"]).unwrap();
        let pcap = lab.dir.join("nd.pcap");
        capture(&mut lab, &b.ns, &b.dev, "icmp6", &pcap);
        let before = answered(&lab, 0);
        ping6(&lab);
        std::thread::sleep(std::time::Duration::from_secs(1));
        let neigh = lab.ns_exec(&a.ns, &["ip", "-6", "neigh", "show", &v6(&b)]).unwrap();
        assert!(String::from_utf8_lossy(&neigh.stdout).contains(&b.mac), "A resolved B: {neigh:?}");
        let after = answered(&lab, 0);
        println!("edge: host 0 answered {} solicitation(s)", after - before);
        assert!(after > before, "host 0 answered A's solicitation");
        let crossed = solicitations_from(&pcap, &a.mac);
        assert!(crossed.is_empty(), "A's solicitations reached B: {crossed:?}");
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn the_answer_follows_the_owner_when_it_moves_to_another_host() {
        // The answer names the MAC, which a VM keeps wherever it runs: a
        // move changes where frames to the MAC go, not what ARP says.
        let mut lab = lab(Spec { hosts: 3, veth_hosts: vec![0, 1, 2], ..Spec::default() });
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        lab.apply(0, &format!("neigh {} {}\n", b.ip, b.mac)).unwrap();
        assert_ping(&lab, &a, b.ip, 56);
        let v = lab.relocate(1, 0, 2).unwrap();
        let b = lab.vm(2, v).clone();
        lab.ns_exec(&a.ns, &["ip", "neigh", "flush", "all"]).unwrap();
        let before = answered(&lab, 0);
        let pcap = lab.dir.join("arp-moved.pcap");
        capture(&mut lab, &b.ns, &b.dev, "arp", &pcap);
        assert_ping(&lab, &a, b.ip, 56);
        std::thread::sleep(std::time::Duration::from_secs(1));
        assert!(answered(&lab, 0) > before, "host 0 answered after the move");
        let crossed = arp_requests_from(&pcap, &a.mac);
        assert!(crossed.is_empty(), "A's ARP requests reached B on host 2: {crossed:?}");
    }

    /// Cluster mode: a host names its VM's address (`neigh`, as vnet-cni
    /// does for a pod's) and its claim carries it: every host answers for
    /// it; withdrawn, no host does.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn every_host_answers_for_the_addresses_a_claim_names_in_cluster_mode() {
        let mut lab = lab(cluster_spec(3, 1, vec![]));
        wait_converged(&lab, 3, 2);
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        lab.apply(1, &format!("neigh {} {}\n", b.ip, b.mac)).unwrap();
        let held = |lab: &Lab, h: usize| lab.cluster_status(h).unwrap()["neighbors"].as_u64().unwrap();
        let took =
            wait_until(10.0, "hosts 0 and 2 hold B's address", || held(&lab, 0) == 1 && held(&lab, 2) == 1);
        eprintln!("edge: B's address reached the other hosts {took:?} after its neigh line");
        // Every other host answers its own VM: A's on host 0 and C's on
        // host 2, and neither VM's request reaches B.
        let c = lab.vm(2, 0).clone();
        let pcap = lab.dir.join("arp-cluster.pcap");
        capture(&mut lab, &b.ns, &b.dev, "arp", &pcap);
        for (h, vm) in [(0, &a), (2, &c)] {
            lab.ns_exec(&vm.ns, &["ip", "neigh", "flush", "all"]).unwrap();
            let before = answered(&lab, h);
            assert_ping(&lab, vm, b.ip, 56);
            wait_until(5.0, &format!("host {h} answered its VM's ARP request"), || {
                answered(&lab, h) > before
            });
        }
        // The capture's positive control and its readiness (not a 1 s
        // sleep): each VM's request for an address no host answers for,
        // sent after the pings, is flooded to B and captured; tcpdump
        // writes in order, so a request for B's address would be there too.
        let nobody = "10.88.9.99";
        for vm in [&a, &c] {
            let _ = lab.ns_exec(&vm.ns, &["ping", "-n", "-q", "-c", "1", "-W", "1", nobody]);
        }
        let asked = |vm: &Vm, ip: &str| -> Vec<String> {
            let who = format!("who-has {ip} ");
            arp_requests_from(&pcap, &vm.mac).into_iter().filter(|l| l.contains(&who)).collect()
        };
        wait_until(5.0, "B's capture has A's and C's requests for an address nobody answers", || {
            [&a, &c].iter().all(|vm| !asked(vm, nobody).is_empty())
        });
        for vm in [&a, &c] {
            let crossed = asked(vm, &b.ip.to_string());
            assert!(crossed.is_empty(), "{}'s ARP requests for B reached B: {crossed:?}", vm.ip);
        }
        // Withdrawn on host 1: no host answers for it any more.
        lab.apply(1, &format!("delete neigh {}\n", b.ip)).unwrap();
        wait_until(10.0, "hosts 0 and 2 dropped B's address", || held(&lab, 0) == 0 && held(&lab, 2) == 0);
    }

    /// Cluster mode: an address has one owner. Host 2 declaring a `neigh`
    /// line for host 1's VM's address (answering it with its own VM's MAC)
    /// is refused, naming the owner; the same line for an address no one
    /// claims is taken (the positive control); every host's edge keeps
    /// answering with the owner's MAC. (Two claims naming one address, a
    /// conflict no host answers for, are vnet-cluster's unit test
    /// `an_address_two_claims_name_is_a_conflict_no_host_answers_for`.)
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_neigh_line_for_another_hosts_vms_address_is_refused_and_the_edge_answers_the_owner() {
        let lab = lab(cluster_spec(3, 1, vec![]));
        wait_converged(&lab, 3, 2);
        let (a, b, c) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone(), lab.vm(2, 0).clone());
        lab.apply(1, &format!("neigh {} {}\n", b.ip, b.mac)).unwrap();
        let held = |lab: &Lab, h: usize| lab.cluster_status(h).unwrap()["neighbors"].as_u64().unwrap();
        wait_until(10.0, "hosts 0 and 2 hold B's address", || held(&lab, 0) == 1 && held(&lab, 2) == 1);
        let e = lab.apply(2, &format!("neigh {} {}\n", b.ip, c.mac)).unwrap_err().to_string();
        assert!(e.contains(&b.mac.to_lowercase()) && e.contains("another host"), "{e}");
        // The positive control: C's own address is C's host's to declare.
        lab.apply(2, &format!("neigh {} {}\n", c.ip, c.mac)).unwrap();
        wait_until(10.0, "host 0 holds both addresses", || held(&lab, 0) == 2);
        for h in 0..3 {
            let s = lab.cluster_status(h).unwrap();
            assert_eq!(s["address_conflicts"].as_array().map(Vec::len), Some(0), "host {h}: {s}");
        }
        // A on host 0 and C on host 2 resolve B's address to B's MAC.
        for vm in [&a, &c] {
            lab.ns_exec(&vm.ns, &["ip", "neigh", "flush", "all"]).unwrap();
            assert_ping(&lab, vm, b.ip, 56);
            let n = lab.ns_exec(&vm.ns, &["ip", "neigh", "show", &b.ip.to_string()]).unwrap();
            let n = String::from_utf8_lossy(&n.stdout).to_lowercase();
            assert!(n.contains(&b.mac.to_lowercase()), "{} resolved {} as: {n}", vm.ip, b.ip);
        }
    }

    /// A `neigh` line made before the owner's claim arrived (host 2's
    /// config, read at its start, before its first listing) answering host
    /// 1's VM's address with another MAC is withdrawn when the claim
    /// arrives: counted (`neighbors_withdrawn`), logged, gone from `show
    /// config`, and host 2's edge answers its VM with the owner's MAC. The
    /// positive control: the same kind of line for an address no claim
    /// names stays.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_neigh_line_read_before_the_owners_claim_arrived_is_withdrawn_when_it_arrives() {
        let mut lab = lab(cluster_spec(3, 1, vec![]));
        wait_converged(&lab, 3, 2);
        let (b, c) = (lab.vm(1, 0).clone(), lab.vm(2, 0).clone());
        lab.apply(1, &format!("neigh {} {}\n", b.ip, b.mac)).unwrap();
        let held = |lab: &Lab, h: usize| lab.cluster_status(h).unwrap()["neighbors"].as_u64().unwrap();
        wait_until(10.0, "hosts 0 and 2 hold B's address", || held(&lab, 0) == 1 && held(&lab, 2) == 1);
        let (wrong, unclaimed) = ("52:54:00:99:99:99", "10.0.250.250");
        lab.stop_vnetd(2).unwrap();
        let conf = std::fs::read_to_string(&lab.hosts[2].config).unwrap();
        let lines = format!("neigh {} {wrong}\nneigh {unclaimed} {wrong}\n", b.ip);
        std::fs::write(&lab.hosts[2].config, format!("{conf}{lines}")).unwrap();
        lab.start_vnetd(2).unwrap();
        let withdrawn =
            |lab: &Lab| lab.cluster_status(2).unwrap()["counters"]["neighbors_withdrawn"].as_u64();
        let took =
            wait_until(10.0, "host 2 withdraws its line for B's address", || withdrawn(&lab) == Some(1));
        eprintln!("edge: host 2's line for B's address withdrawn {took:?} after its vnetd answered");
        let config = lab.control(2, "show config").unwrap().body;
        assert!(!config.contains(&format!("neigh {} ", b.ip)), "{config}");
        assert!(
            config.contains(&format!("neigh {unclaimed} {wrong}")),
            "the unclaimed address's line stays: {config}"
        );
        assert!(lab.log(2).contains("withdrawn"), "{}", lab.log(2));
        wait_converged(&lab, 3, 2);
        lab.ns_exec(&c.ns, &["ip", "neigh", "flush", "all"]).unwrap();
        assert_ping(&lab, &c, b.ip, 56);
        let n = lab.ns_exec(&c.ns, &["ip", "neigh", "show", &b.ip.to_string()]).unwrap();
        let n = String::from_utf8_lossy(&n.stdout).to_lowercase();
        assert!(n.contains(&b.mac.to_lowercase()), "{} resolved {} as: {n}", c.ip, b.ip);
        assert_eq!(withdrawn(&lab), Some(1));
    }
}
