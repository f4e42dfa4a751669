//! `vnetctl trace` (issue 70, acceptance 1): a working pair traced across
//! two hosts (every step on both, and the data path each takes), and six
//! failures made on purpose, each named by its failing step, the rule or
//! object and the reason `monitor drops` uses, on the host where it
//! happens: no route, a policy's deny, port security, a link whose peer is
//! down, a wrong network, and a frame too big for a VXLAN link (the kernel
//! path leaves it to the user path, which drops it). Each failure has its
//! control: the same trace before the breakage passes. Nothing is sent.

use super::harness::*;
use serde_json::Value;

/// `vnetctl --json trace WORDS... far HOST1` on host 0: this host's part
/// (`here`) and host 1's (`far`).
fn trace(lab: &Lab, words: &str) -> Value {
    let far = format!("unix:{}", lab.hosts[1].control.display());
    let mut args: Vec<&str> = vec!["--json", "trace"];
    args.extend(words.split_whitespace());
    args.extend(["far", &far]);
    let out = lab.vnetctl(0, &args).unwrap();
    assert!(out.status.success(), "trace {words}: {out:?}");
    serde_json::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap()
}

/// `vnetctl --json trace WORDS...` on host 0 alone: its part.
fn here(lab: &Lab, words: &str) -> Value {
    let mut args: Vec<&str> = vec!["--json", "trace"];
    args.extend(words.split_whitespace());
    let out = lab.vnetctl(0, &args).unwrap();
    assert!(out.status.success(), "trace {words}: {out:?}");
    serde_json::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap()
}

/// The text a person reads, printed for the test's output.
fn show(lab: &Lab, words: &str) -> String {
    let far = format!("unix:{}", lab.hosts[1].control.display());
    let mut args: Vec<&str> = vec!["trace"];
    args.extend(words.split_whitespace());
    args.extend(["far", &far]);
    let out = lab.vnetctl(0, &args).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    println!("trace: vnetctl trace {words}\n{text}");
    text
}

/// A part's stages in order.
fn stages(part: &Value) -> Vec<String> {
    part["steps"].as_array().unwrap().iter().map(|s| s["stage"].as_str().unwrap().to_string()).collect()
}

/// A part's verdict: (result, reason, stage, object).
fn verdict(part: &Value) -> (String, String, String, String) {
    let v = &part["verdict"];
    let f = |k: &str| v[k].as_str().unwrap_or("").to_string();
    (f("result"), f("reason"), f("stage"), f("object"))
}

/// The detail of a part's first step of `stage`.
fn detail(part: &Value, stage: &str) -> String {
    let steps = part["steps"].as_array().unwrap();
    let s = steps.iter().find(|s| s["stage"] == stage).unwrap_or_else(|| panic!("no {stage} step: {part}"));
    s["detail"].as_str().unwrap().to_string()
}

/// Both parts pass.
fn assert_passes(t: &Value, what: &str) {
    assert_eq!(verdict(&t["here"]).0, "pass", "{what}: host 0: {t:#}");
    assert_eq!(verdict(&t["far"]).0, "pass", "{what}: host 1: {t:#}");
}

/// The words of a UDP trace from host 0's VM (`extra` after its name) to
/// host 1's, by its MAC.
fn words(a: &Vm, b: &Vm, extra: &str) -> String {
    format!("from vm0 {extra} ip {} to {} mac {} udp port 7777", a.ip, b.ip, b.mac)
}

/// A UDP frame from VM `a` to VM `b`, port `port`, 60 bytes, as hex.
fn udp_hex(a: &Vm, b: &Vm, port: u16) -> String {
    let mac = |m: &str| m.split(':').map(|x| u8::from_str_radix(x, 16).unwrap()).collect::<Vec<u8>>();
    let mut f = [mac(&b.mac), mac(&a.mac), vec![0x08, 0x00]].concat();
    f.extend_from_slice(&[0x45, 0, 0, 28, 0, 1, 0x40, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&a.ip.octets());
    f.extend_from_slice(&b.ip.octets());
    f.extend_from_slice(&[0x9c, 0x40]);
    f.extend_from_slice(&port.to_be_bytes());
    f.extend_from_slice(&[0, 8, 0, 0]);
    f.resize(60, 0);
    f.iter().map(|x| format!("{x:02x}")).collect()
}

/// Host `h`'s config line for link `name`.
fn link_line(lab: &Lab, h: usize, name: &str) -> String {
    let r = lab.control(h, "show config").unwrap();
    let prefix = format!("link {name} ");
    r.body.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{}", r.body)).to_string()
}

/// A `udp` link's line with its network id `n`.
fn in_network(line: &str, n: u32) -> String {
    let mut w: Vec<String> = line.split_whitespace().map(String::from).collect();
    match w.iter().position(|x| x == "network") {
        Some(i) if i + 1 < w.len() => w[i + 1] = n.to_string(),
        _ => w.extend(["network".to_string(), n.to_string()]),
    }
    w.join(" ")
}

mod both {
    use super::*;

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_working_pair_is_traced_on_both_hosts_with_the_data_path_each_takes() {
        let lab = lab(Spec::default());
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        // B's address answered at the edge on host 0.
        lab.apply(0, &format!("neigh {} {}\n", b.ip, b.mac)).unwrap();
        let kernel = lab.spec.datapath.as_deref() == Some("kernel");
        let w = format!("from vm0 ip {} to {} tcp port 5201", a.ip, b.ip);
        show(&lab, &w);
        let t = trace(&lab, &w);
        assert_passes(&t, "the working pair");
        let here = ["arrival", "source", "policy", "neighbour", "route", "link", "datapath", "mtu"];
        assert_eq!(stages(&t["here"]), here, "{t:#}");
        assert_eq!(
            stages(&t["far"]),
            ["arrival", "source", "policy", "route", "deliver", "datapath"],
            "{t:#}"
        );
        assert!(detail(&t["here"], "source").contains(&format!("locked to {}", a.mac)), "{t:#}");
        assert!(detail(&t["here"], "neighbour").contains(&format!("{} is at {}", b.ip, b.mac)), "{t:#}");
        assert!(detail(&t["here"], "link").contains("peer up"), "{t:#}");
        let path = if kernel { "kernel path" } else { "user path" };
        for part in ["here", "far"] {
            let d = detail(&t[part], "datapath");
            assert!(d.starts_with(path), "{part}: {d}");
            println!("trace: {part}: {d}");
        }
        assert_eq!(t["here"]["exits"], serde_json::json!(["h1"]));
        assert_eq!(t["far"]["exits"], serde_json::json!(["vm0"]));

        // The same pair, the frame given as bytes (`trace hex`), on both
        // hosts: no neighbour step (the bytes are the frame itself).
        let hex = udp_hex(&a, &b, 7777);
        show(&lab, &format!("hex {hex}"));
        let t = trace(&lab, &format!("hex {hex}"));
        assert_passes(&t, "the working pair, as bytes");
        let here = ["arrival", "source", "policy", "route", "link", "datapath", "mtu"];
        assert_eq!(stages(&t["here"]), here, "{t:#}");
        assert_eq!(t["here"]["frame"]["proto"], "udp port 7777", "{t:#}");
        assert_eq!(t["far"]["exits"], serde_json::json!(["vm0"]));
        // Cut short (18 bytes: 4 of the IPv4 header): refused at its column.
        let cut = &hex[..36];
        let out = lab.vnetctl(0, &["trace", "hex", cut]).unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        println!("trace: vnetctl trace hex {cut}: {err}");
        let want = "1:39: expected an IPv4 header (20 bytes) at byte 14, found 4 bytes from byte 14";
        assert!(!out.status.success() && err.contains(want), "{err}");
        assert_ping(&lab, &a, b.ip, 56);
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn each_failure_made_on_purpose_is_named_with_its_rule_or_object_on_its_host() {
        let lab = lab(Spec::default());
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        let ok = words(&a, &b, "");
        let named = |t: &Value, part: &str, want: (&str, &str, &str, &str)| {
            let got = verdict(&t[part]);
            assert_eq!(
                (got.0.as_str(), got.1.as_str(), got.2.as_str(), got.3.as_str()),
                want,
                "{part}: {t:#}"
            );
        };

        // No route: host 0's route to B's MAC deleted. The control: before.
        assert_passes(&trace(&lab, &ok), "before the route is deleted");
        let routes = json(&lab, 0, "routes");
        let id = routes["routes"].as_array().unwrap().iter().find(|r| r["dst"] == b.mac.as_str()).unwrap()
            ["id"]
            .clone();
        lab.apply(0, &format!("delete route {id}\n")).unwrap();
        show(&lab, &ok);
        named(&trace(&lab, &ok), "here", ("drop", "no_route", "route", b.mac.as_str()));
        lab.apply(0, &format!("route any {} -> link h1\n", b.mac)).unwrap();
        assert_passes(&trace(&lab, &ok), "the route back");

        // A policy's deny, named by its rule; the control: another port.
        lab.apply(0, "policy default allow\nrule deny-7777 deny proto udp port 7777\n").unwrap();
        show(&lab, &ok);
        named(&trace(&lab, &ok), "here", ("drop", "policy_denied", "policy", "deny-7777"));
        assert_passes(&trace(&lab, &ok.replace("port 7777", "port 7778")), "another port");
        lab.apply(0, "delete rule deny-7777\ndelete policy\n").unwrap();

        // Port security: the same frame from another source MAC.
        let spoofed = words(&a, &b, "mac 02:00:00:00:99:99");
        show(&lab, &spoofed);
        named(&trace(&lab, &spoofed), "here", ("drop", "spoofed_source_mac", "source", "vm0"));
        assert_passes(&trace(&lab, &ok), "from its own MAC");

        // A wrong network: host 1's link to host 0 says network 42; host 0's
        // datagrams say 0. Named on host 1, where they would be dropped.
        let h0 = link_line(&lab, 1, "h0");
        replace_link(&lab, 1, "h0", &format!("{}\nroute any {} -> link h0\n", in_network(&h0, 42), a.mac));
        show(&lab, &ok);
        let t = trace(&lab, &ok);
        assert_eq!(verdict(&t["here"]).0, "pass", "host 0 sends it: {t:#}");
        named(&t, "far", ("drop", "wrong_network", "arrival", "h0"));

        // A link whose peer is down: host 1's link to host 0 gone, so host 0
        // hears nothing from host 1 (not even keepalives); within 3.5 s its
        // link h1 is down. Then host 1's link back as it was (the control).
        replace_link(&lab, 1, "h0", "");
        wait_until(10.0, "host 0's link h1 down", || verdict(&here(&lab, &ok)).1 == "link_down");
        show(&lab, &ok);
        named(&trace(&lab, &ok), "here", ("lost", "link_down", "link", "h1"));
        let back = format!("{h0}\nroute any ff:ff:ff:ff:ff:ff -> link h0\nroute any {} -> link h0\n", a.mac);
        lab.apply(1, &back).unwrap();
        wait_until(10.0, "host 0's link h1 up again", || verdict(&here(&lab, &ok)).0 == "pass");
        assert_passes(&trace(&lab, &ok), "the link back");
        assert_ping(&lab, &a, b.ip, 56);
    }

    /// A VM whose MTU is larger than its host's VXLAN link carries: a
    /// 1514-byte frame is named `mtu_exceeded` at the link (on the kernel
    /// pass, the program leaves it to the user path, which drops it); a
    /// frame that fits passes (the control), on the kernel pass by the
    /// kernel path.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_frame_too_big_for_a_vxlan_link_is_named_at_its_mtu() {
        let lab = lab(Spec { links: Links::Vxlan, vm_mtu: 1500, ..Spec::default() });
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        let kernel = lab.spec.datapath.as_deref() == Some("kernel");
        let w = words(&a, &b, "");
        let fits = format!("{w} size 1464");
        show(&lab, &fits);
        let t = trace(&lab, &fits);
        assert_passes(&t, "a frame that fits");
        let d = detail(&t["here"], "datapath");
        assert!(d.starts_with(if kernel { "kernel path" } else { "user path" }), "{d}");
        let big = format!("{w} size 1514");
        show(&lab, &big);
        let t = trace(&lab, &big);
        let v = verdict(&t["here"]);
        assert_eq!(
            (v.0.as_str(), v.1.as_str(), v.2.as_str(), v.3.as_str()),
            ("drop", "mtu_exceeded", "mtu", "h1")
        );
        assert!(detail(&t["here"], "mtu").contains("at most 1464 bytes"), "{t:#}");
        let d = detail(&t["here"], "datapath");
        if kernel {
            assert!(d.contains("leaves frames over 1464 bytes to vnetd"), "{d}");
        }
        assert!(t["far"].is_null(), "nothing reaches host 1: {t:#}");
    }

    /// Cluster mode: the far host's part is computed from the store's view
    /// this host holds (the claim, the network's signed policy), and says
    /// so; a signed policy's deny is named by its rule on the sending host.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn in_cluster_mode_the_far_hosts_part_is_computed_from_the_stores_view() {
        let lab = lab(cluster_spec(2, 1, vec![]));
        wait_converged(&lab, 2, 1);
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        let w = format!("from vm0 ip {} to {} mac {} icmp", a.ip, b.ip, b.mac);
        let mut args = vec!["trace"];
        args.extend(w.split_whitespace());
        println!("trace: {}", String::from_utf8_lossy(&lab.vnetctl(0, &args).unwrap().stdout));
        let t = here(&lab, &w);
        assert_eq!(verdict(&t).0, "pass", "{t:#}");
        let link = t["exits"][0].as_str().unwrap().to_string();
        let far = &t["far"];
        assert_eq!(far["computed_from"], "the store's view", "{t:#}");
        assert_eq!((far["host"].as_str(), far["link"].as_str()), (Some(link.as_str()), Some(link.as_str())));
        assert_eq!(stages(far), ["arrival", "policy", "deliver"], "{t:#}");
        assert!(far["steps"].as_array().unwrap().iter().all(|s| s["verdict"] == "pass"), "{t:#}");
        assert!(detail(far, "deliver").contains(&b.mac), "{t:#}");
        // The network's signed policy denies pings: named by its rule.
        let rules = lab.dir.join("trace-rules.conf");
        std::fs::write(&rules, "policy default allow\nrule no-ping deny proto icmp\n").unwrap();
        let (k, v) = signed_policy(&lab, &lab.dir.join("net.key").display().to_string(), &rules, 10);
        lab.etcd_put(&k, Some(&v)).unwrap();
        wait_until(3.0, "host 0 enforces the signed policy", || verdict(&here(&lab, &w)).0 == "drop");
        let v = verdict(&here(&lab, &w));
        assert_eq!((v.1.as_str(), v.2.as_str(), v.3.as_str()), ("policy_denied", "policy", "no-ping"));
        assert_eq!(verdict(&here(&lab, &w.replace("icmp", "udp port 53"))).0, "pass", "the control: UDP");
        assert_no_ping(&lab, &a, b.ip);
    }
}
