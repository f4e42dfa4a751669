//! Flow logs (issue 70, acceptance 3): with `--flow-log -`, a TCP transfer
//! of 10 MiB between VMs on two hosts is one record on the sending host,
//! its bytes each way within 1 % of what the VM's NIC sent and received
//! (whole Ethernet frames, as the log counts them), on each pass (on the
//! kernel pass the eBPF programs count it, joined with the engine's first
//! packet); a flow a rule denies is one record naming that rule, streamed
//! live by `vnetctl monitor flows` and listed by `show flows`.

use super::harness::*;

/// The flow records host `h`'s vnetd wrote (on standard output: its log).
fn records(lab: &Lab, h: usize) -> Vec<serde_json::Value> {
    let log = lab.log(h);
    log.lines().filter(|l| l.starts_with("{\"start\"")).filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// A counter of `vm`'s NIC (`tx_bytes`, `rx_bytes`, ...).
fn nic(lab: &Lab, vm: &Vm, what: &str) -> u64 {
    let path = format!("/sys/class/net/{}/statistics/{what}", vm.dev);
    let out = lab.ns_output(&vm.ns, &["cat", &path]).unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn within(got: u64, want: u64, pct: f64) -> bool {
    (got as f64 - want as f64).abs() <= want as f64 * pct / 100.0
}

mod both {
    use super::*;

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_tcp_transfer_is_one_flow_record_with_its_bytes_and_a_denied_flow_names_its_rule() {
        let args = ["--flow-log", "-", "--flow-log-idle", "3"];
        let lab = lab(Spec { vnetd_args: args.map(String::from).to_vec(), ..Spec::default() });
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        let rules = format!(
            "policy default deny\nrule arp allow ether arp\n\
             rule bulk allow from net {}/32 to net {}/32 proto tcp port 7001\n\
             rule no-telnet deny priority 10 proto tcp port 23\n",
            a.ip, b.ip
        );
        for h in 0..2 {
            lab.apply(h, &rules).unwrap();
        }
        // A monitor of denied flows, from now on.
        let monitor = std::process::Command::new(vnet_lab::bin("vnetctl").unwrap())
            .arg("--control")
            .arg(format!("unix:{}", lab.hosts[0].control.display()))
            .args(["--json", "monitor", "flows", "verdict", "deny", "count", "1"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A veth VM's host end (the kernel pass's) would send the VM its
        // own IPv6 router solicitations and MLD reports, no flow's frames:
        // off, so the NIC's counters count the flow's frames alone.
        if let Some(hd) = &a.host_dev {
            let key = format!("net.ipv6.conf.{hd}.disable_ipv6=1");
            lab.ns_exec(&lab.hosts[0].ns, &["sysctl", "-q", "-w", &key]).unwrap();
        }
        let (tx0, rx0) = (nic(&lab, &a, "tx_bytes"), nic(&lab, &a, "rx_bytes"));
        let (sent, got) = tcp_md5_ns(&lab, &a.ns, &b.ns, &b.ip.to_string(), 10);
        assert!(!sent.is_empty() && sent == got, "the transfer went through: {sent} / {got}");
        let (tx, rx) = (nic(&lab, &a, "tx_bytes") - tx0, nic(&lab, &a, "rx_bytes") - rx0);
        println!("flowlog: VM a's NIC sent {tx} bytes and received {rx} during the transfer");
        // A flow the rules deny: a connection to port 23 (its SYN and retries).
        let telnet = format!(
            "import socket\ns=socket.socket(); s.settimeout(2)\ntry:\n    s.connect(('{}', 23))\nexcept OSError:\n    pass",
            b.ip
        );
        lab.ns_output(&a.ns, &["python3", "-c", &telnet]).unwrap();
        let (a4, b4) = (a.ip.to_string(), b.ip.to_string());
        let is_bulk = |r: &serde_json::Value| r["src"] == a4 && r["dst"] == b4 && r["dport"] == 7001;
        let is_telnet = |r: &serde_json::Value| r["src"] == a4 && r["dport"] == 23;
        wait_until_or(
            30.0,
            "host 0 logs the transfer and the denied flow",
            || {
                let r = records(&lab, 0);
                r.iter().any(|r| is_bulk(r) && r["bytes"].as_u64() > Some(10 << 20))
                    && r.iter().any(is_telnet)
            },
            || lab.log(0),
        );
        let all = records(&lab, 0);
        let bulk = all.iter().filter(|r| is_bulk(r)).max_by_key(|r| r["bytes"].as_u64()).unwrap();
        let same: Vec<_> = all.iter().filter(|r| is_bulk(r) && r["sport"] == bulk["sport"]).collect();
        println!("flowlog: host 0's record of the transfer: {bulk}");
        assert_eq!(same.len(), 1, "one record for the transfer's 5-tuple: {same:?}");
        let (bytes, back) = (bulk["bytes"].as_u64().unwrap(), bulk["bytes_back"].as_u64().unwrap());
        let err = |got: u64, want: u64| (got as f64 - want as f64) / want as f64 * 100.0;
        println!(
            "flowlog: bytes {bytes} vs {tx} sent ({:+.3} %), back {back} vs {rx} ({:+.3} %)",
            err(bytes, tx),
            err(back, rx)
        );
        assert!(bytes >= 10 << 20, "at least the payload");
        assert!(within(bytes, tx, 1.0), "bytes {bytes} within 1 % of the {tx} the VM sent");
        assert!(within(back, rx, 1.0), "bytes back {back} within 1 % of the {rx} the VM received: {all:?}");
        assert_eq!((bulk["verdict"].as_str(), bulk["rule"].as_str()), (Some("allow"), Some("bulk")));
        let want_path = if lab.spec.datapath.as_deref() == Some("kernel") { "kernel" } else { "user" };
        assert_eq!(bulk["path"], want_path, "counted by the pass's data path");
        let denied: Vec<_> = all.iter().filter(|r| is_telnet(r)).collect();
        println!("flowlog: the denied flow: {denied:?}");
        assert_eq!(denied.len(), 1, "the SYN and its retries: one denied flow");
        assert_eq!(
            (denied[0]["verdict"].as_str(), denied[0]["rule"].as_str()),
            (Some("deny"), Some("no-telnet"))
        );
        assert!(denied[0]["packets"].as_u64() >= Some(1) && denied[0]["packets_back"] == 0);
        // The monitor printed the denied flow (and ended: `count 1`), as the log has it.
        let mut monitor = monitor;
        wait_until(10.0, "monitor flows shows the denied flow", || monitor.try_wait().unwrap().is_some());
        let out = monitor.wait_with_output().unwrap();
        let streamed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        println!("flowlog: monitor flows printed {streamed}");
        assert_eq!((streamed["rule"].as_str(), streamed["dport"].as_u64()), (Some("no-telnet"), Some(23)));
        let shown = json(&lab, 0, "flows");
        assert!(
            shown["flows"].as_array().unwrap().iter().any(|r| is_bulk(r) && r["sport"] == bulk["sport"]),
            "{shown}"
        );
        // The receiving host logs it too (both ways pass its policy).
        wait_until(15.0, "host 1 logs the transfer", || {
            records(&lab, 1).iter().any(|r| is_bulk(r) && r["bytes"].as_u64() >= Some(10 << 20))
        });
        let stats = json(&lab, 0, "stats");
        let g = &stats["global"];
        println!(
            "flowlog: host 0's counters: records {} dropped {} overflow {}",
            g["flow_log_records"], g["flow_log_dropped"], g["flow_log_overflow"]
        );
        assert_eq!((g["flow_log_dropped"].as_u64(), g["flow_log_overflow"].as_u64()), (Some(0), Some(0)));
    }
}
