//! Pods as Kubernetes expects them (issue 67): the node is its pods'
//! gateway (vnet-cni's `isDefaultGateway` and `ipMasq`;
//! `docs/INTEGRATION.md`, "Pods as Kubernetes expects them"), here with
//! vnet-cni run by hand on two cluster hosts, a Service translated as
//! kube-proxy translates one (a DNAT rule on the client's node).

use super::harness::*;

/// Runs `python3 -c script` in namespace `ns`: its exit status and stdout.
fn py(lab: &Lab, ns: &str, script: &str) -> (bool, String) {
    let out = lab.ns_output(ns, &["python3", "-c", script]).unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// One TCP connection to `ip:port` within `secs`: what the server said.
fn fetch(lab: &Lab, ns: &str, ip: &str, port: u16, secs: f64) -> (bool, String) {
    let script = format!(
        "import socket,sys\n\
         c=socket.create_connection(('{ip}',{port}),timeout={secs})\n\
         c.settimeout({secs}); print(c.recv(100).decode().strip())"
    );
    py(lab, ns, &script)
}

/// The `iptables-save` lines of host `h` that name the lab's network.
fn rules_of(lab: &Lab, h: usize) -> Vec<String> {
    let out = lab.ns_output(&lab.hosts[h].ns, &["iptables-save"]).unwrap();
    let tag = format!("vnet {}:", lab.prefix);
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains(&tag)).map(str::to_string).collect()
}

/// Host `h`'s rules with their counters, its routes and forwarding.
fn diagnose(lab: &Lab, h: usize) -> String {
    let ns = &lab.hosts[h].ns;
    let mut s = String::new();
    for args in [
        &["iptables-save", "-c"][..],
        &["ip", "route"][..],
        &["ip", "addr"][..],
        &["ip", "neigh"][..],
        &["ip", "-s", "link"][..],
        &["sysctl", "net.ipv4.ip_forward"][..],
    ] {
        let out = lab.ns_output(ns, args).unwrap();
        s += &format!(
            "{args:?}:\n{}{}\n",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let pod = format!("{}-p{h}", lab.prefix);
    for args in [&["ip", "-s", "link"][..], &["ip", "neigh"][..], &["ip", "route"][..]] {
        let out = lab.ns_output(&pod, args).unwrap();
        s += &format!("pod {args:?}:\n{}\n", String::from_utf8_lossy(&out.stdout));
    }
    s
}

fn ping(lab: &Lab, ns: &str, ip: &str) -> bool {
    lab.ns_output(ns, &["ping", "-c", "1", "-W", "1", ip]).unwrap().status.success()
}

mod both {
    use super::*;

    /// Two cluster hosts, a pod on each (vnet-cni `ADD` with
    /// `isDefaultGateway` and `ipMasq`): each host reaches both pods (the
    /// kubelet's probes), a pod reaches the lab's etcd, outside the overlay,
    /// through its node, and a Service translated on the client's node
    /// (DNAT to the other host's pod, as kube-proxy's rule does) answers;
    /// without the node's masquerade of translated connections the
    /// backend's reply goes straight to the client over the LAN and the
    /// connection fails (the control). The last `DEL` removes the node's
    /// gateway, its rules and its address.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn cni_pods_reach_their_node_the_outside_and_a_service_through_their_node() {
        let mut lab = lab(cluster_spec(2, 0, vec![]));
        wait_converged(&lab, 2, 0);
        let mut pods = Vec::new();
        for h in 0..2 {
            let ns = lab.add_ns(format!("{}-p{h}", lab.prefix)).unwrap();
            let mut conf =
                lab.cni_conf(h, "1.1.0", serde_json::json!({ "type": "vnet", "subnet": "10.88.0.0/24" }));
            conf["isDefaultGateway"] = true.into();
            conf["ipMasq"] = true.into();
            let id = format!("p{h}{}", std::process::id());
            let netns = format!("/run/netns/{ns}");
            let r = lab.cni(h, "ADD", &id, Some(&netns), conf.to_string().as_bytes()).unwrap();
            assert!(r.ok, "ADD on h{h}: {}\n{}", r.out, r.stderr);
            let ip = r.out["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
            let gw = r.out["ips"][0]["gateway"].as_str().unwrap_or_else(|| panic!("{}", r.out)).to_string();
            assert_eq!(r.out["routes"][0], serde_json::json!({ "dst": "0.0.0.0/0", "gw": gw }));
            let routes = lab.ns_output(&ns, &["ip", "route", "show", "default"]).unwrap();
            let routes = String::from_utf8_lossy(&routes.stdout).to_string();
            assert!(routes.contains(&format!("default via {gw} dev eth0")), "{routes}");
            assert_eq!(rules_of(&lab, h).len(), 4, "{:?}", rules_of(&lab, h));
            pods.push((ns, id, ip, gw, conf));
        }
        assert_ne!(pods[0].3, pods[1].3, "each node its own address");
        // The node's end has the pods' MTU (a larger frame from the node
        // would be dropped by the veth into vnetd).
        for h in 0..2 {
            let links = lab.ns_output(&lab.hosts[h].ns, &["ip", "-o", "link", "show"]).unwrap();
            let links = String::from_utf8_lossy(&links.stdout).to_string();
            let vg = links.lines().find(|l| l.contains(": vg")).unwrap_or_else(|| panic!("h{h}: {links}"));
            assert!(vg.contains(&format!(" mtu {} ", lab.spec.vm_mtu)), "h{h}: {vg}");
        }
        // Each node reaches both pods; each pod both nodes.
        for h in 0..2 {
            for p in &pods {
                let host = lab.hosts[h].ns.clone();
                wait_until_or(
                    10.0,
                    &format!("h{h} reaches {}", p.2),
                    || ping(&lab, &host, &p.2),
                    || diagnose(&lab, h),
                );
                wait_until(10.0, &format!("{} reaches {}", p.0, pods[h].3), || ping(&lab, &p.0, &pods[h].3));
            }
        }
        // The outside: the lab's etcd, whose namespace has no route to the pods.
        let outside = lab.etcd_ip().to_string();
        for p in &pods {
            let h = pods.iter().position(|q| q.0 == p.0).unwrap_or(0);
            wait_until_or(
                10.0,
                &format!("{} reaches {outside}", p.0),
                || ping(&lab, &p.0, &outside),
                || diagnose(&lab, h),
            );
        }
        // A Service: 10.96.0.10:80 on h0, translated to the pod on h1.
        let server = format!(
            "import socket\n\
             s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
             s.bind(('{}', 8080)); s.listen(8); s.settimeout(60)\n\
             while True:\n    c,a=s.accept(); c.sendall(('backend ' + a[0] + '\\n').encode()); c.close()",
            pods[1].2
        );
        let mut srv = std::process::Command::new("ip")
            .args(["netns", "exec", &pods[1].0, "python3", "-c", &server])
            .spawn()
            .unwrap();
        let dnat = format!("{}:8080", pods[1].2);
        let h0 = lab.hosts[0].ns.clone();
        let rule =
            ["-d", "10.96.0.10/32", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", &dnat];
        let mut add = vec!["iptables", "-t", "nat", "-A", "PREROUTING"];
        add.extend(rule);
        lab.ns_exec(&h0, &add).unwrap();
        let mut said = String::new();
        wait_until(10.0, "the Service answers", || {
            let (ok, out) = fetch(&lab, &pods[0].0, "10.96.0.10", 80, 1.0);
            said = out;
            ok
        });
        // The backend saw the client's node, not the client.
        assert_eq!(said, format!("backend {}", pods[0].3));
        // The control: without the node's masquerade (and without it to the
        // outside) neither answers.
        let tagged: Vec<String> = rules_of(&lab, 0)
            .into_iter()
            .filter(|l| l.starts_with("-A POSTROUTING"))
            .map(|l| l.replacen("-A ", "", 1))
            .collect();
        assert_eq!(tagged.len(), 2, "{tagged:?}");
        for t in &tagged {
            let words = shell_words(t);
            let mut del = vec!["iptables", "-t", "nat", "-D"];
            del.extend(words.iter().map(String::as_str));
            lab.ns_exec(&h0, &del).unwrap();
        }
        let (ok, out) = fetch(&lab, &pods[0].0, "10.96.0.10", 80, 2.0);
        assert!(!ok, "the Service answered without the masquerade: {out}");
        assert!(!ping(&lab, &pods[0].0, &outside), "the outside answered without the masquerade");
        let _ = srv.kill();
        let _ = srv.wait();
        // DEL: the node's gateway goes with its last pod.
        for (h, p) in pods.iter().enumerate() {
            let r = lab.cni(h, "DEL", &p.1, Some(&format!("/run/netns/{}", p.0)), p.4.to_string().as_bytes());
            assert!(r.as_ref().unwrap().ok, "DEL on h{h}: {:?}", r.map(|r| r.out));
            let links = lab.ns_output(&lab.hosts[h].ns, &["ip", "-o", "link", "show"]).unwrap();
            let links = String::from_utf8_lossy(&links.stdout).to_string();
            assert!(!links.contains(": vg") && !links.contains(": vc"), "h{h}: {links}");
            assert_eq!(rules_of(&lab, h), Vec::<String>::new());
            assert_eq!(json(&lab, h, "interfaces")["interfaces"], serde_json::json!([]));
        }
        let keys = lab.etcdctl(&["get", "--prefix", "--keys-only", &format!("/vnet/{}/ipam/", lab.prefix)]);
        assert_eq!(keys.unwrap().trim(), "", "addresses left in etcd");
    }

    /// A node's gateway taken with no `DEL` (a reboot takes its veth pair;
    /// the Kubernetes lab's reboot found it): the next pod's `ADD` makes a
    /// new gateway, with a new MAC and so a new IPAM owner, and gives the
    /// old one's address back first (vnet-cni records the gateway's MAC).
    /// Without that, the old allocation stayed while vnetd ran: two
    /// gateway addresses held for one node. The control: the first
    /// gateway's allocation is seen before its pair goes.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_gateway_taken_without_a_del_gives_its_address_back_to_the_next_one() {
        let mut lab = lab(cluster_spec(2, 0, vec![]));
        wait_converged(&lab, 2, 0);
        // The `node-gateway-MAC/gw` owners that hold an address, from etcd.
        let gateways = |lab: &Lab| -> Vec<String> {
            let out = lab.etcdctl(&["get", "--prefix", &format!("/vnet/{}/ipam/", lab.prefix)]).unwrap();
            out.lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter_map(|v| v["owner"].as_str().map(str::to_string))
                .filter(|o| o.contains("/node-gateway-"))
                .collect()
        };
        let add = |lab: &mut Lab, n: usize| {
            let ns = lab.add_ns(format!("{}-g{n}", lab.prefix)).unwrap();
            let mut conf =
                lab.cni_conf(0, "1.1.0", serde_json::json!({ "type": "vnet", "subnet": "10.88.0.0/24" }));
            conf["isDefaultGateway"] = true.into();
            let id = format!("g{n}{}", std::process::id());
            let r = lab.cni(0, "ADD", &id, Some(&format!("/run/netns/{ns}")), conf.to_string().as_bytes());
            let r = r.unwrap();
            assert!(r.ok, "ADD {n}: {}\n{}", r.out, r.stderr);
            (ns, r.out["ips"][0]["gateway"].as_str().unwrap().to_string())
        };
        let (_, gw1) = add(&mut lab, 1);
        let first = gateways(&lab);
        assert_eq!(first.len(), 1, "the first gateway's allocation: {first:?}");
        // The pair goes as a reboot takes it: no DEL, vnetd still running.
        let links = lab.ns_link_names(&lab.hosts[0].ns).unwrap();
        let vg = links
            .iter()
            .find(|n| n.starts_with("vg"))
            .unwrap_or_else(|| panic!("no gateway pair: {links:?}"))
            .clone();
        lab.ns_exec(&lab.hosts[0].ns.clone(), &["ip", "link", "del", &vg]).unwrap();
        let (ns2, gw2) = add(&mut lab, 2);
        let now = gateways(&lab);
        assert_eq!(now.len(), 1, "gateway allocations after the second ADD (was {first:?}): {now:?}");
        assert_ne!(now, first, "a new pair, a new owner");
        eprintln!("gateway {gw1} ({}) taken without a DEL; the next is {gw2} ({})", first[0], now[0]);
        wait_until(10.0, "the second pod reaches its new gateway", || ping(&lab, &ns2, &gw2));
    }

    /// The review's IPv6 link-local hole (a pod's `fe80::` address is in
    /// no NetworkPolicy entry) closed the first way, and its low finding:
    /// vnet-cni `ADD` of a pod given no IPv6 address turns IPv6 off in it
    /// (`all`, `default`, `eth0`): another pod with IPv6 on does not reach
    /// it on its link-local address (the EUI-64 of its MAC); the control,
    /// IPv6 turned on again in it, is reached. The veth's host end is kept
    /// off the node's stack (`arp_ignore` 8, IPv6 off); set back as an
    /// older vnet-cni left it, it stays so until vnetd attaches it again
    /// (a restart, as an upgrade), which keeps it off again.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_pod_without_an_ipv6_address_has_no_ipv6_and_vnetd_keeps_its_veth_off_the_node() {
        let mut lab = lab(cluster_spec(2, 0, vec![]));
        wait_converged(&lab, 2, 0);
        let mut pods = Vec::new();
        for h in 0..2 {
            let ns = lab.add_ns(format!("{}-p{h}", lab.prefix)).unwrap();
            let conf =
                lab.cni_conf(h, "1.1.0", serde_json::json!({ "type": "vnet", "subnet": "10.88.0.0/24" }));
            let id = format!("p{h}{}", std::process::id());
            let r = lab.cni(h, "ADD", &id, Some(&format!("/run/netns/{ns}")), conf.to_string().as_bytes());
            let r = r.unwrap();
            assert!(r.ok, "ADD on h{h}: {}\n{}", r.out, r.stderr);
            let mac: vnet_wire::MacAddr = r.out["interfaces"][0]["mac"].as_str().unwrap().parse().unwrap();
            let ip = r.out["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
            pods.push((ns, vnet_wire::guard::link_local(mac).to_string(), ip, mac.to_string()));
        }
        for (ns, ..) in &pods {
            for conf in ["all", "default", "eth0"] {
                assert_eq!(
                    sysctl(&lab, ns, &format!("net/ipv6/conf/{conf}/disable_ipv6")),
                    "1",
                    "{ns} {conf}"
                );
            }
            let a = lab.ns_output(ns, &["ip", "-6", "addr", "show", "dev", "eth0"]).unwrap();
            assert!(a.stdout.is_empty(), "{ns}: {}", String::from_utf8_lossy(&a.stdout));
        }
        // The control: IPv4 between the pods, once host 1 has pod 0's record
        // (one ping lost to the record's way through etcd failed the CI's
        // user pass, three tests at a time).
        wait_until(10.0, "control: IPv4 between the pods", || ping(&lab, &pods[1].0, &pods[0].2));
        // The attacker (pod 1) with IPv6 on. vnet routes no IPv6 multicast
        // (a neighbour solicitation for an address of no `neigh` line goes
        // nowhere): it sends to pod 0's MAC (learnt by ARP) straight, and
        // pod 0 learns its MAC as from the unicast solicitation a raw
        // socket (CAP_NET_RAW, a pod's by default) sends.
        let neigh = |lab: &Lab, ns: &str, ip: &str, mac: &str| {
            let args = ["ip", "-6", "neigh", "replace", ip, "lladdr", mac, "dev", "eth0", "nud", "permanent"];
            lab.ns_exec(ns, &args).unwrap();
        };
        lab.ns_exec(&pods[1].0, &["sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=0"]).unwrap();
        neigh(&lab, &pods[1].0, &pods[0].1, &pods[0].3);
        assert!(!ping6(&lab, &pods[1].0, &pods[0].1, 3.0), "pod 0 answered on its link-local address");
        lab.ns_exec(&pods[0].0, &["sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=0"]).unwrap();
        neigh(&lab, &pods[0].0, &pods[1].1, &pods[1].3);
        if !ping6(&lab, &pods[1].0, &pods[0].1, 10.0) {
            let mut d = String::new();
            for (ns, ..) in &pods {
                for args in [
                    &["ip", "-6", "addr"][..],
                    &["ip", "-6", "neigh"][..],
                    &["ip", "-6", "route"][..],
                    &["ip", "-s", "link"][..],
                ] {
                    let out = lab.ns_output(ns, args).unwrap();
                    let text = String::from_utf8_lossy(&out.stdout).to_string();
                    let text: Vec<&str> =
                        text.lines().filter(|l| !l.contains("sysctl") || l.contains("ipv6.conf")).collect();
                    d += &format!("{ns} {args:?}:\n{}\n", text.join("\n"));
                }
            }
            panic!(
                "control: with IPv6 on, pod 0 is reached ({}):\n{d}\n{}\n{}",
                pods[0].1,
                lab.control(0, "show stats").map(|r| r.body).unwrap_or_default(),
                lab.log(0)
            );
        }
        // The low finding: pod 0's veth host end, on host 0.
        let links = lab.ns_link_names(&lab.hosts[0].ns).unwrap();
        let end = links
            .iter()
            .find(|n| n.starts_with("vc"))
            .unwrap_or_else(|| panic!("no veth end on host 0: {links:?}"))
            .clone();
        let host = lab.hosts[0].ns.clone();
        let off = |lab: &Lab| {
            (
                sysctl(lab, &host, &format!("net/ipv4/conf/{end}/arp_ignore")),
                sysctl(lab, &host, &format!("net/ipv6/conf/{end}/disable_ipv6")),
            )
        };
        assert_eq!(off(&lab), ("8".to_string(), "1".to_string()), "as vnet-cni made it");
        lab.ns_exec(&host, &["sysctl", "-qw", &format!("net.ipv4.conf.{end}.arp_ignore=0")]).unwrap();
        lab.ns_exec(&host, &["sysctl", "-qw", &format!("net.ipv6.conf.{end}.disable_ipv6=0")]).unwrap();
        assert_eq!(off(&lab), ("0".to_string(), "0".to_string()), "control: as an older vnet-cni left it");
        lab.stop_vnetd(0).unwrap();
        lab.start_vnetd(0).unwrap();
        wait_until(10.0, "vnetd attached the pod's end again", || {
            json(&lab, 0, "interfaces")["interfaces"].as_array().is_some_and(|a| !a.is_empty())
        });
        assert_eq!(
            off(&lab),
            ("8".to_string(), "1".to_string()),
            "kept off by vnetd's attach\n{}",
            lab.log(0)
        );
        wait_until(20.0, "pod 0 reached over IPv4 again", || ping(&lab, &pods[1].0, &pods[0].2));
    }
}

/// The value of sysctl `key` (`/proc/sys/` path words) in namespace `ns`.
fn sysctl(lab: &Lab, ns: &str, key: &str) -> String {
    let out = lab.ns_output(ns, &["cat", &format!("/proc/sys/{key}")]).unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Whether namespace `ns` has an answer to one ping of IPv6 address `ll`
/// on its `eth0` within `secs` (an address just turned on is tentative
/// for a second: duplicate address detection).
fn ping6(lab: &Lab, ns: &str, ll: &str, secs: f64) -> bool {
    let t0 = std::time::Instant::now();
    loop {
        let to = format!("{ll}%eth0");
        if lab.ns_output(ns, &["ping", "-6", "-c", "1", "-W", "1", &to]).unwrap().status.success() {
            return true;
        }
        if t0.elapsed().as_secs_f64() > secs {
            return false;
        }
    }
}

/// `iptables-save`'s words of a rule (its comments are quoted).
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for ch in line.chars() {
        match ch {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
}
