//! Building a lab: namespaces, the underlay, VMs, kernel VTEPs, a LAN.

use crate::{
    config_for, io, pki, public_ip, registry, routed_gateway, run, underlay_cidr, underlay_ip, vm_ip, vm_mac,
    Cluster, Error, Host, Lab, Links, Overlay, Result, Vm, LAN_IP, LAN_MAC, VNI,
};
use std::net::Ipv4Addr;

/// Switched underlays of more hosts than this get permanent neighbour
/// entries ([`Lab::pin_underlay_neighbors`]).
const PINNED_ABOVE: usize = 16;

impl Lab {
    /// Makes a namespace that goes with the lab (removed on every exit path).
    pub fn add_ns(&mut self, name: String) -> Result<String> {
        run(&["ip", "netns", "add", &name])?;
        registry().0.push(name.clone());
        self.namespaces.push(name.clone());
        self.ns_exec(&name, &["ip", "link", "set", "lo", "up"])?;
        // Every namespace alike: the same congestion control, whatever the machine's default.
        if let Some(cc) = &self.spec.congestion_control {
            self.ns_exec(&name, &["sysctl", "-q", "-w", &format!("net.ipv4.tcp_congestion_control={cc}")])?;
        }
        Ok(name)
    }

    pub(crate) fn build(&mut self) -> Result<()> {
        let mut hosts = self.new_hosts()?;
        self.underlay(&hosts)?;
        for (h, host) in hosts.iter().enumerate() {
            if self.spec.kernel_vtep(h) {
                self.vxlan_host(h, host, &hosts)?;
            }
        }
        if self.spec.overlay == Overlay::Tinc {
            self.tinc_keys(&hosts)?;
            for (h, host) in hosts.iter().enumerate() {
                self.tinc_host(h, host, &hosts)?;
            }
        }
        for (h, host) in hosts.iter_mut().enumerate() {
            for v in 0..self.spec.vms_per_host {
                let vm = if v == 0 && self.spec.qemu_hosts.contains(&h) {
                    self.qemu_vm(h, host)?
                } else {
                    self.namespace_vm(h, v, host)?
                };
                host.vms.push(vm);
            }
        }
        self.forwarding(&hosts)?;
        let s = self.spec.clone();
        let p = self.prefix.clone();
        if let Some(lh) = s.lan_host.filter(|&h| h < hosts.len()) {
            self.lan = Some(self.lan_segment(&hosts[lh])?);
        }
        if s.links == Links::Tls {
            let ca = pki::Ca::new(&format!("{p} CA"))?;
            for (h, host) in hosts.iter().enumerate() {
                ca.host(&self.dir, &format!("h{h}"), host.underlay_ip)?;
            }
        }
        let secured_cluster = s.cluster.as_ref().is_some_and(Cluster::secured);
        if matches!(s.links, Links::Auth | Links::Encrypt) || secured_cluster {
            for (h, host) in hosts.iter_mut().enumerate() {
                host.key = Some(write_key(&self.dir.join(format!("h{h}.key")))?);
            }
        }
        if secured_cluster {
            self.cluster_secrets(&hosts)?;
        }
        for h in (0..hosts.len()).filter(|&h| s.runs_vnetd(h)) {
            let text = config_for(&s, &hosts, h)?;
            std::fs::write(&hosts[h].config, text).map_err(io("writing a config"))?;
        }
        self.hosts = hosts;
        Ok(())
    }

    /// The hosts' namespaces and names (nothing in them yet).
    fn new_hosts(&mut self) -> Result<Vec<Host>> {
        let s = self.spec.clone();
        let p = self.prefix.clone();
        let mut hosts = Vec::new();
        for h in 0..s.hosts {
            let ns = self.add_ns(format!("{p}-h{h}"))?;
            hosts.push(Host {
                ns,
                underlay_dev: format!("u{h}"),
                underlay_ip: match (s.site_mtu, s.nat) {
                    (_, true) if h == 2 => public_ip(2),
                    (Some(_), _) | (_, true) => Ipv4Addr::new(10, 77, h as u8, 1).into(),
                    _ => underlay_ip(h, s.ipv6_underlay),
                },
                config: self.dir.join(format!("h{h}.conf")),
                control: self.dir.join(format!("h{h}.sock")),
                log: self.dir.join(format!("h{h}.log")),
                vms: Vec::new(),
                key: None,
                vnetd: None,
            });
        }
        Ok(hosts)
    }

    /// The underlay: a veth pair for two hosts, else a bridge in a switch
    /// namespace; the hosts' addresses (on a bridge when bridged) and shaping.
    /// A big switched IPv4 underlay (more than [`PINNED_ABOVE`] hosts):
    /// each host's and the switch's neighbours (every other host, the
    /// switch's addresses: etcd's) as permanent entries. The kernel's ARP
    /// table is one for all namespaces (`gc_thresh3`: 1024 entries here,
    /// the root namespace's setting, not the lab's to change), and a mesh
    /// of 100 hosts resolves about 10000 addresses: past 1024, resolutions
    /// fail ("neighbor table overflow", sends ENOBUFS). Permanent entries
    /// are not counted against it.
    pub(crate) fn pin_underlay_neighbors(&self) -> Result<()> {
        let Some(sw) = self.switch.clone() else { return Ok(()) };
        if self.hosts.len() <= PINNED_ABOVE
            || self.spec.ipv6_underlay
            || self.spec.nat
            || self.spec.site_mtu.is_some()
        {
            return Ok(());
        }
        let mac = |ns: &str, dev: &str| -> Result<String> {
            let out = self.ns_exec(ns, &["cat", &format!("/sys/class/net/{dev}/address")])?;
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        };
        let mut peers: Vec<(String, String)> = Vec::new();
        for h in &self.hosts {
            peers.push((h.underlay_ip.to_string(), mac(&h.ns, &h.underlay_dev)?));
        }
        let sw_mac = mac(&sw, "br0")?;
        let out = self.ns_exec(&sw, &["ip", "-4", "-o", "addr", "show", "dev", "br0"])?;
        let sw_ips: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| Some(l.split_whitespace().nth(3)?.split('/').next()?.to_string()))
            .collect();
        let batch = |ns: &str, dev: &str, entries: &[(String, String)]| -> Result<()> {
            let text: String = entries
                .iter()
                .map(|(ip, mac)| format!("neigh replace {ip} lladdr {mac} dev {dev} nud permanent\n"))
                .collect();
            let file = self.dir.join(format!("neigh-{ns}.batch"));
            std::fs::write(&file, text).map_err(io("writing a neighbour batch"))?;
            let f = file.to_string_lossy().to_string();
            self.ns_exec(ns, &["ip", "-batch", &f]).map(drop)
        };
        for h in &self.hosts {
            let mut entries: Vec<(String, String)> =
                peers.iter().filter(|(ip, _)| *ip != h.underlay_ip.to_string()).cloned().collect();
            entries.extend(sw_ips.iter().map(|ip| (ip.clone(), sw_mac.clone())));
            batch(&h.ns, &h.underlay_dev, &entries)?;
        }
        batch(&sw, "br0", &peers)
    }

    fn underlay(&mut self, hosts: &[Host]) -> Result<()> {
        let s = self.spec.clone();
        let p = self.prefix.clone();
        if let Some(mtu) = s.site_mtu {
            return self.sites(hosts, mtu);
        }
        if s.nat {
            return self.nat_sites(hosts);
        }
        if s.hosts == 2 && s.cluster.is_none() {
            veth_pair("u0", &hosts[0].ns, "u1", &hosts[1].ns)?;
        } else if s.hosts > 2 || s.cluster.is_some() {
            let sw = self.add_ns(format!("{p}-sw"))?;
            self.switch = Some(sw.clone());
            self.ns_exec(&sw, &["ip", "link", "add", "br0", "type", "bridge"])?;
            self.ns_exec(&sw, &["ip", "link", "set", "br0", "mtu", &s.underlay_mtu.to_string(), "up"])?;
            for (h, host) in hosts.iter().enumerate() {
                let port = format!("s{h}");
                veth_pair(&host.underlay_dev, &host.ns, &port, &sw)?;
                self.ns_exec(
                    &sw,
                    &["ip", "link", "set", &port, "mtu", &s.underlay_mtu.to_string(), "master", "br0", "up"],
                )?;
            }
        }
        for host in hosts {
            if s.hosts > 1 {
                let dev = host.underlay_dev.as_str();
                let mtu = s.underlay_mtu.to_string();
                self.ns_exec(&host.ns, &["ip", "link", "set", dev, "mtu", &mtu, "up"])?;
                // Bridged: the underlay device is a port of the host's
                // bridge, which holds the host's address.
                let addr_dev = if s.overlay == Overlay::Bridged {
                    self.ns_exec(&host.ns, &["ip", "link", "add", "br0", "type", "bridge"])?;
                    self.ns_exec(&host.ns, &["ip", "link", "set", "br0", "mtu", &mtu, "up"])?;
                    self.ns_exec(&host.ns, &["ip", "link", "set", dev, "master", "br0"])?;
                    "br0"
                } else {
                    dev
                };
                let cidr = underlay_cidr(host.underlay_ip);
                let mut add = vec!["ip", "addr", "add", "dev", addr_dev];
                add.extend(cidr.iter().map(String::as_str));
                self.ns_exec(&host.ns, &add)?;
                if let Some(rate) = &s.shape {
                    self.ns_exec(
                        &host.ns,
                        &[
                            "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "4mb",
                            "latency", "20ms",
                        ],
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Two sites joined by routers over a link of MTU `mtu` ([`Spec::site_mtu`]).
    fn sites(&mut self, hosts: &[Host], mtu: u32) -> Result<()> {
        let p = self.prefix.clone();
        if hosts.len() != 2 {
            return Err(Error::Other("a two-site lab has two hosts".into()));
        }
        let under = self.spec.underlay_mtu.to_string();
        let routers = [self.add_ns(format!("{p}-r0"))?, self.add_ns(format!("{p}-r1"))?];
        veth_pair("x0", &routers[0], "x1", &routers[1])?;
        for (h, (host, r)) in hosts.iter().zip(&routers).enumerate() {
            veth_pair(&host.underlay_dev, &host.ns, "lan", r)?;
            let (ip, gw) = (host.underlay_ip.to_string(), format!("10.77.{h}.254"));
            let x = format!("x{h}");
            let cmds: [&[&str]; 11] = [
                &["ip", "link", "set", &host.underlay_dev, "mtu", &under, "up"],
                &["ip", "addr", "add", &format!("{ip}/24"), "dev", &host.underlay_dev],
                &["ip", "route", "add", "default", "via", &gw],
                &["ip", "link", "set", "lan", "mtu", &under, "up"],
                &["ip", "addr", "add", &format!("{gw}/24"), "dev", "lan"],
                &["ip", "link", "set", &x, "mtu", &mtu.to_string(), "up"],
                &["ip", "addr", "add", &format!("10.77.254.{}/30", h + 1), "dev", &x],
                &[
                    "ip",
                    "route",
                    "add",
                    &format!("10.77.{}.0/24", 1 - h),
                    "via",
                    &format!("10.77.254.{}", 2 - h),
                ],
                &["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"],
                &["iptables", "-A", "OUTPUT", "-p", "icmp", "-j", "DROP"],
                &["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"],
            ];
            for (i, c) in cmds.iter().enumerate() {
                // The first three are the host's, the rest its router's.
                self.ns_exec(if i < 3 { &host.ns } else { r }, c)?;
            }
        }
        Ok(())
    }

    /// Hosts 0 and 1 behind NATs, host 2 public ([`Spec::nat`]).
    fn nat_sites(&mut self, hosts: &[Host]) -> Result<()> {
        let p = self.prefix.clone();
        if !(3..=4).contains(&hosts.len()) {
            return Err(Error::Other("a NAT lab has three or four hosts".into()));
        }
        let inet = self.add_ns(format!("{p}-inet"))?;
        self.switch = Some(inet.clone());
        self.ns_exec(&inet, &["ip", "link", "add", "br0", "type", "bridge"])?;
        self.ns_exec(&inet, &["ip", "link", "set", "br0", "up"])?;
        // Host 2 on the internet segment.
        veth_pair(&hosts[2].underlay_dev, &hosts[2].ns, "p2", &inet)?;
        self.ns_exec(&inet, &["ip", "link", "set", "p2", "master", "br0", "up"])?;
        let dev2 = hosts[2].underlay_dev.as_str();
        self.ns_exec(&hosts[2].ns, &["ip", "link", "set", dev2, "up"])?;
        self.ns_exec(&hosts[2].ns, &["ip", "addr", "add", &format!("{}/24", public_ip(2)), "dev", dev2])?;
        for (h, host) in hosts.iter().enumerate().filter(|&(h, _)| h != 2) {
            let r = self.add_ns(format!("{p}-r{h}"))?;
            let port = format!("p{h}");
            veth_pair("out", &r, &port, &inet)?;
            self.ns_exec(&inet, &["ip", "link", "set", &port, "master", "br0", "up"])?;
            veth_pair(&host.underlay_dev, &host.ns, "lan", &r)?;
            let (ip, gw, public) = (host.underlay_ip.to_string(), format!("10.77.{h}.254"), public_ip(h));
            for c in [
                vec!["ip", "link", "set", &host.underlay_dev, "up"],
                vec!["ip", "addr", "add", &format!("{ip}/24"), "dev", &host.underlay_dev],
                vec!["ip", "route", "add", "default", "via", &gw],
            ] {
                self.ns_exec(&host.ns, &c)?;
            }
            let masq: Vec<&str> = if h == 0 {
                vec!["iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "out", "-j", "MASQUERADE"]
            } else {
                vec![
                    "iptables",
                    "-t",
                    "nat",
                    "-A",
                    "POSTROUTING",
                    "-o",
                    "out",
                    "-j",
                    "MASQUERADE",
                    "--random-fully",
                ]
            };
            let (public_cidr, gw_cidr) = (format!("{public}/24"), format!("{gw}/24"));
            let forward = format!("{ip}:9000");
            let mut cmds = vec![
                vec!["ip", "link", "set", "lan", "up"],
                vec!["ip", "addr", "add", &gw_cidr, "dev", "lan"],
                vec!["ip", "link", "set", "out", "up"],
                vec!["ip", "addr", "add", &public_cidr, "dev", "out"],
                vec!["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"],
                vec!["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"],
                masq,
            ];
            if h == 0 {
                // The cone-like NAT: vnetd's port forwarded to it.
                cmds.push(vec![
                    "iptables",
                    "-t",
                    "nat",
                    "-A",
                    "PREROUTING",
                    "-i",
                    "out",
                    "-p",
                    "udp",
                    "--dport",
                    "9000",
                    "-j",
                    "DNAT",
                    "--to-destination",
                    &forward,
                ]);
            }
            for c in cmds {
                self.ns_exec(&r, &c)?;
            }
        }
        Ok(())
    }

    /// VM `v` of host `h` in a namespace of its own, on a TAP or a veth
    /// (the host end in `host`'s namespace), with its address.
    fn namespace_vm(&mut self, h: usize, v: usize, host: &Host) -> Result<Vm> {
        let s = self.spec.clone();
        let p = self.prefix.clone();
        let ns = self.add_ns(format!("{p}-h{h}v{v}"))?;
        let veth = s.veth_hosts.contains(&h)
            || s.kernel_vtep(h)
            || matches!(s.overlay, Overlay::Routed | Overlay::Bridged | Overlay::Tinc | Overlay::WireGuard)
            || (s.overlay == Overlay::Vnet && s.datapath.as_deref() == Some("kernel"));
        let dev = if veth { "eth0" } else { "vt0" };
        let vm = Vm {
            ns: ns.clone(),
            dev: dev.into(),
            host_dev: veth.then(|| format!("c{v}")),
            mac: vm_mac(h, v),
            ip: vm_ip(h, v),
            console: None,
            vhost: None,
        };
        for sysctl in [
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
            "net.ipv4.icmp_echo_ignore_broadcasts=0",
        ] {
            self.ns_exec(&ns, &["sysctl", "-q", "-w", sysctl])?;
        }
        let mtu = s.vm_mtu.to_string();
        if let Some(hd) = &vm.host_dev {
            self.add_veth(&host.ns, hd, &ns, dev)?;
            if s.kernel_vtep(h) || matches!(s.overlay, Overlay::Bridged | Overlay::Tinc) {
                self.ns_exec(&host.ns, &["ip", "link", "set", hd, "master", "br0"])?;
            }
        } else {
            let mq: &[&str] = if s.tap_queues > 1 { &["multi_queue"] } else { &[] };
            self.ns_exec(&ns, &[&["ip", "tuntap", "add", "dev", dev, "mode", "tap"], mq].concat())?;
        }
        self.ns_exec(&ns, &["ip", "link", "set", dev, "address", &vm.mac, "mtu", &mtu, "up"])?;
        if matches!(s.overlay, Overlay::Routed | Overlay::WireGuard) {
            // Each host routes its VMs' /24: the gateway address is
            // on the one VM-facing veth, or with more VMs on a
            // bridge of their veths.
            let gw = routed_gateway(h);
            let hd = vm.host_dev.as_deref().unwrap_or("c0");
            let gw_net = format!("{gw}/24");
            if s.vms_per_host == 1 {
                self.ns_exec(&host.ns, &["ip", "addr", "add", &gw_net, "dev", hd])?;
            } else {
                if v == 0 {
                    self.ns_exec(&host.ns, &["ip", "link", "add", "brv", "type", "bridge"])?;
                    self.ns_exec(&host.ns, &["ip", "link", "set", "brv", "mtu", &mtu, "up"])?;
                    self.ns_exec(&host.ns, &["ip", "addr", "add", &gw_net, "dev", "brv"])?;
                }
                self.ns_exec(&host.ns, &["ip", "link", "set", hd, "master", "brv"])?;
            }
            self.ns_exec(&ns, &["ip", "addr", "add", &format!("{}/24", vm.ip), "dev", dev])?;
            self.ns_exec(&ns, &["ip", "route", "add", "default", "via", &gw.to_string()])?;
        } else {
            self.ns_exec(&ns, &["ip", "addr", "add", &format!("{}/16", vm.ip), "dev", dev])?;
        }
        Ok(vm)
    }

    /// Forwarding that is not vnet's: kernel VTEPs' static FDB entries, and
    /// the routed baseline's routes between the hosts.
    fn forwarding(&mut self, hosts: &[Host]) -> Result<()> {
        let s = self.spec.clone();
        // Static forwarding on kernel VTEPs: every VM MAC to its host, no learning.
        for (h, host) in hosts.iter().enumerate() {
            if s.kernel_vtep(h) {
                for (k, other) in hosts.iter().enumerate() {
                    if k == h {
                        continue;
                    }
                    let dst = other.underlay_ip.to_string();
                    for vm in &other.vms {
                        let a = ["bridge", "fdb", "add", &vm.mac, "dev", "vxlan0", "dst", &dst, "static"];
                        self.ns_exec(&host.ns, &a)?;
                    }
                }
            }
        }
        if s.overlay == Overlay::WireGuard {
            self.wireguard_keys(hosts)?;
            for (h, host) in hosts.iter().enumerate() {
                self.ns_exec(&host.ns, &["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])?;
                self.wireguard_host(h, host, hosts)?;
            }
        }
        if s.overlay == Overlay::Routed {
            // Each host forwards between its VMs' /24 and the underlay.
            for (h, host) in hosts.iter().enumerate() {
                self.ns_exec(&host.ns, &["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])?;
                for (k, other) in hosts.iter().enumerate() {
                    if k != h {
                        let net = format!("10.88.{k}.0/24");
                        self.ns_exec(
                            &host.ns,
                            &["ip", "route", "add", &net, "via", &other.underlay_ip.to_string()],
                        )?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A "physical LAN" for `host`: a bridge in a switch namespace, a port
    /// to the host (`dl0` there), and a plain machine (`eth0`) on it.
    pub(crate) fn lan_segment(&mut self, host: &Host) -> Result<Vm> {
        let p = self.prefix.clone();
        let sw = self.add_ns(format!("{p}-lan"))?;
        let m = self.add_ns(format!("{p}-m"))?;
        let mtu = self.spec.vm_mtu.to_string();
        self.ns_exec(&sw, &["ip", "link", "add", "lanbr", "type", "bridge"])?;
        self.ns_exec(&sw, &["ip", "link", "set", "lanbr", "mtu", &mtu, "up"])?;
        for (port, peer_ns, peer_dev) in [("lp0", &host.ns, "dl0"), ("lp1", &m, "eth0")] {
            veth_pair(port, &sw, peer_dev, peer_ns)?;
            self.ns_exec(&sw, &["ip", "link", "set", port, "mtu", &mtu, "master", "lanbr", "up"])?;
            self.ns_exec(peer_ns, &["ip", "link", "set", peer_dev, "mtu", &mtu, "up"])?;
        }
        self.ns_exec(&m, &["ip", "link", "set", "eth0", "address", LAN_MAC])?;
        self.ns_exec(&m, &["ip", "addr", "add", &format!("{LAN_IP}/16"), "dev", "eth0"])?;
        self.ns_exec(&m, &["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"])?;
        Ok(Vm {
            ns: m,
            dev: "eth0".into(),
            host_dev: None,
            mac: LAN_MAC.into(),
            ip: LAN_IP,
            console: None,
            vhost: None,
        })
    }

    /// A container's NIC: a veth pair with `host_dev` in `host_ns` (for
    /// vnetd, brought up at the VM MTU) and `dev` in `vm_ns`.
    pub(crate) fn add_veth(&self, host_ns: &str, host_dev: &str, vm_ns: &str, dev: &str) -> Result<()> {
        veth_pair(host_dev, host_ns, dev, vm_ns)?;
        let mtu = self.spec.vm_mtu.to_string();
        self.ns_exec(host_ns, &["ip", "link", "set", host_dev, "mtu", &mtu, "up"])?;
        Ok(())
    }

    /// Host `h`'s kernel VXLAN: a bridge, a vxlan device (VNI 42, port 4789,
    /// no learning) and flooding entries for every other host.
    pub(crate) fn vxlan_host(&self, h: usize, host: &Host, hosts: &[Host]) -> Result<()> {
        let ns = host.ns.as_str();
        let mtu = self.spec.vm_mtu.to_string();
        self.ns_exec(ns, &["ip", "link", "add", "br0", "type", "bridge"])?;
        let (local, vni) = (host.underlay_ip.to_string(), VNI.to_string());
        let mut add = vec!["ip", "link", "add", "vxlan0", "type", "vxlan", "id", &vni, "local", &local];
        add.extend(["dstport", "4789", "nolearning", "dev", &host.underlay_dev]);
        if self.spec.ipv6_underlay {
            // vnet's kernel path sends VXLAN over IPv6 with a zero UDP
            // checksum (RFC 6935/6936), which Linux takes with this.
            add.push("udp6zerocsumrx");
        }
        self.ns_exec(ns, &add)?;

        self.ns_exec(ns, &["ip", "link", "set", "vxlan0", "mtu", &mtu, "master", "br0", "up"])?;
        self.ns_exec(ns, &["ip", "link", "set", "br0", "mtu", &mtu, "up"])?;
        for (k, other) in hosts.iter().enumerate() {
            if k != h {
                let dst = other.underlay_ip.to_string();
                self.ns_exec(
                    ns,
                    &["bridge", "fdb", "append", "00:00:00:00:00:00", "dev", "vxlan0", "dst", &dst],
                )?;
            }
        }
        Ok(())
    }
}

/// A veth pair: `a` in namespace `a_ns`, its peer `b` in `b_ns`.
fn veth_pair(a: &str, a_ns: &str, b: &str, b_ns: &str) -> Result<()> {
    run(&["ip", "link", "add", a, "netns", a_ns, "type", "veth", "peer", "name", b, "netns", b_ns])?;
    Ok(())
}

/// A new private key at `path` (mode 0600), and its public key.
fn write_key(path: &std::path::Path) -> Result<(std::path::PathBuf, vnet_control::PeerKey)> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let private = vnetd::keys::genkey().map_err(|e| Error::Other(e.to_string()))?;
    let public = vnetd::keys::pubkey(&private).map_err(|e| Error::Other(e.to_string()))?;
    let public =
        vnet_control::PeerKey::from_base64(&public).ok_or_else(|| Error::Other("a public key".into()))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io("writing a key"))?;
    writeln!(f, "{private}").map_err(io("writing a key"))?;
    Ok((path.to_path_buf(), public))
}
