//! `vnet-lab`: build a vnet lab in network namespaces and show it working.

use clap::{Parser, Subcommand, ValueEnum};
use std::process::ExitCode;
use vnet_lab::{install_signal_cleanup, Format, Lab, Links, Overlay, Spec};

#[derive(Parser)]
#[command(version, about = "vnet lab: hosts and VMs in network namespaces")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum Fmt {
    Raw,
    Vnet,
}

/// `vnet-lab bench`'s options.
#[derive(clap::Args)]
struct BenchArgs {
    /// One condition (MTU 1500, unshaped), one repeat, short runs.
    #[arg(long)]
    quick: bool,
    #[arg(long)]
    repeats: Option<usize>,
    /// Seconds per iperf3/sockperf run.
    #[arg(long)]
    seconds: Option<u32>,
    /// Output directory (default results/<timestamp>).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Only these cases: native, routed, bridged, vxlan, tinc, wireguard-go,
    /// vnet-user-WIRE (WIRE: raw, vnet, vnet6, vxlan, tcp, tls, vnet-auth,
    /// vnet-encrypt, vnet-aesgcm, vnet-chacha), vnet-userpoll-vnet,
    /// vnet-userpoll-raw, vnet-kernel-vnet, vnet-kernel-vnet6,
    /// vnet-kernel-vxlan, vnet-kernel-vnet-encrypt.
    #[arg(long, value_delimiter = ',')]
    cases: Vec<String>,
    /// Only these conditions: an underlay MTU, optionally shaped, e.g.
    /// `1500,9000` or `1500/10gbit` (default: 1500 and 9000, each
    /// unshaped and shaped to 10 Gbit/s).
    #[arg(long, value_delimiter = ',')]
    conditions: Vec<String>,
    /// The compiled bench/mpi_pingpong.c.
    #[arg(long)]
    mpi: std::path::PathBuf,
    /// After the run, check it against this earlier results.json (as
    /// `compare` does; exits non-zero on a regression).
    #[arg(long)]
    check: Option<std::path::PathBuf>,
    /// Only these measurements: tcp1 (with CPU per GB), tcp4, udp,
    /// ping, rr (sockperf), mpi, many (4 VMs per host, 8 streams; default:
    /// all).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// One more argument for every vnetd of the run, e.g.
    /// `--vnetd-arg=--link-readers=1` (an A/B of a setting in one build).
    #[arg(long, allow_hyphen_values = true)]
    vnetd_arg: Vec<String>,
}

/// `vnet-lab k8s ...`.
#[derive(Subcommand)]
enum K8sCmd {
    /// The Kubernetes lab (scripts/k8s-build.sh's programs): a control
    /// plane and three nodes, vnet applied from packaging/kubernetes/vnet.yaml,
    /// CoreDNS; prints the kubectl command and keeps the cluster until
    /// Ctrl-C or SIGTERM, which remove everything.
    Up {
        /// The pods' data path: kernel (the manifest's) or user.
        #[arg(long)]
        datapath: Option<String>,
        /// Also build and import the images Kubernetes' e2e suite runs
        /// (scripts/k8s-e2e.sh).
        #[arg(long)]
        e2e_images: bool,
        /// Once the cluster is up, write `KUBECONFIG=`, `NETNS=` (where the
        /// API server is reached), `PREFIX=` and `KUBECTL=` lines here.
        #[arg(long)]
        ready_file: Option<std::path::PathBuf>,
    },
    /// Builds vnet's image (`localhost/vnet:TAG`, the manifest's) as an OCI
    /// archive `ctr images import` and `skopeo copy oci-archive:` take,
    /// from the vnetd, vnetctl and vnet-cni beside this program
    /// (`scripts/k8s-image.sh` runs it from the release build).
    Image {
        /// The image's tag.
        #[arg(long, default_value = "0.1.0")]
        tag: String,
        /// The static `portmap` plugin (`scripts/k8s-build.sh --portmap`).
        #[arg(long)]
        portmap: std::path::PathBuf,
        /// Where to write the archive.
        #[arg(long)]
        out: std::path::PathBuf,
        /// Leave the programs' debugging information out.
        #[arg(long)]
        strip: bool,
    },
}

#[derive(Subcommand)]
enum Cmd {
    /// Kubernetes on the lab.
    #[command(subcommand)]
    K8s(K8sCmd),
    /// A secured cluster of real vnetds on one etcd (the last host joins
    /// late) and what it costs: cold start, a join, a move, memory and CPU
    /// at rest, etcd's keys and writes, ARP flooded with and without the
    /// VMs' addresses in their claims (docs/CLUSTER.md).
    Scale {
        #[arg(long, default_value_t = 100)]
        hosts: usize,
        #[arg(long, default_value_t = 2)]
        vms: usize,
        /// Seconds at rest over which CPU and etcd's writes are counted.
        #[arg(long, default_value_t = 30)]
        rest: u64,
        /// An open cluster (etcd over http, no keys, unsigned records):
        /// plain links, which the kernel path carries, so a move's figure
        /// is the time to every host's kernel maps.
        #[arg(long)]
        plain_links: bool,
    },
    /// Three hosts, known iperf3 flows between their VMs, each host's
    /// `show matrix`, and the network's traffic matrix as an SVG heat map.
    Matrix {
        /// Where `matrix.svg` and `matrix.json` go.
        #[arg(long, default_value = "docs/benchmarks")]
        out: std::path::PathBuf,
        /// The VMs' data path: user or kernel.
        #[arg(long, default_value = "user")]
        datapath: String,
        /// Each flow's length.
        #[arg(long, default_value_t = 3)]
        seconds: u32,
    },
    /// Two hosts, one VM each: ARP, ping and iperf3 from VM A to VM B over
    /// vnet, then tear down.
    Demo {
        #[arg(long, value_enum, default_value = "vnet")]
        format: Fmt,
        /// iperf3 duration.
        #[arg(long, default_value_t = 5)]
        seconds: u32,
        /// vnetd data path for the VMs' interfaces: user (VMs on TAPs that
        /// vnetd serves) or kernel (VMs as containers on veths, unicast moved
        /// by the eBPF fast path).
        #[arg(long, default_value = "user")]
        datapath: String,
    },
    /// Measure native, kernel VXLAN and vnet in one run; write JSON, a
    /// Markdown table of ratios to native, and plots.
    Bench(BenchArgs),
    /// Check a rerun against a first run: which medians and ratios of NEW
    /// lie within OLD's cells' own spread, and per vnet case the typical
    /// change of its headline ratios to native; exits non-zero when a case
    /// got more than 5 % worse.
    Compare { old: std::path::PathBuf, new: std::path::PathBuf },
    /// Drive vnetd's vhost-user backend with two front ends of our own (no
    /// guest, no KVM) and the same load through two TAPs: frames/s and ns
    /// per frame at 64 B, 1500 B and 60000 B.
    VhostLoad {
        /// Seconds per measurement.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Place the threads as a guest on vCPUs of its own would have
        /// them: both front ends on the first allowed CPU, vnetd's
        /// vhost-user and TAP workers on the last (`--worker-cpus`).
        /// Unplaced (the default), the three busy threads share every CPU.
        #[arg(long)]
        placed: bool,
    },
    /// Build a lab and keep it until Ctrl-C, printing how to reach it.
    Up {
        #[arg(long, default_value_t = 2)]
        hosts: usize,
        #[arg(long, default_value_t = 1)]
        vms: usize,
        #[arg(long, value_enum, default_value = "vnet")]
        format: Fmt,
        /// vnetd dispatch mode: notify, poll or adaptive.
        #[arg(long)]
        mode: Option<String>,
        /// VM MTU.
        #[arg(long, default_value_t = 1500)]
        vm_mtu: u32,
        /// Underlay MTU (the hosts' links to each other).
        #[arg(long, default_value_t = 1500)]
        underlay_mtu: u32,
        /// vnetd data path for every interface: user, kernel or auto (VMs
        /// become containers on veths).
        #[arg(long)]
        datapath: Option<String>,
        /// Hosts whose first VM is a QEMU guest (TCG), e.g. `0,1`.
        #[arg(long, value_delimiter = ',')]
        qemu: Vec<usize>,
        /// QEMU guests on vhost-user sockets vnetd serves (else on TAPs).
        #[arg(long)]
        vhost_user: bool,
        /// More kernel command line for a host's guest, `H:ARGS` (e.g.
        /// `1:vnet_peer=10.88.0.1 vnet_send_mb=64`; see lab/build-guest.sh).
        #[arg(long)]
        guest_args: Vec<String>,
        /// What joins the VMs: vnet, or a baseline to compare with.
        #[arg(long, value_enum, default_value = "vnet")]
        overlay: Overlay,
        /// The links between vnetds: udp (in `--format`), vxlan, tcp or tls.
        #[arg(long, value_enum, default_value = "udp")]
        links: Links,
        /// Secured links' cipher: auto, aes-256-gcm or chacha20-poly1305.
        #[arg(long, default_value = "auto", value_parser = |s: &str| vnet_control::Cipher::from_word(s).ok_or("auto, aes-256-gcm or chacha20-poly1305"))]
        cipher: vnet_control::Cipher,
        /// Hosts that are Linux kernel VTEPs (a bridge and a vxlan device,
        /// no vnetd), e.g. `1`; vnetds reach them over VXLAN.
        #[arg(long, value_delimiter = ',')]
        vteps: Vec<usize>,
        /// A host whose physical LAN (a bridge with a plain machine on it,
        /// 10.88.250.1) joins the overlay through a `direct` link.
        #[arg(long)]
        lan_host: Option<usize>,
        /// Cluster mode: a real etcd in the lab, every vnetd started with
        /// `--cluster`, configs with interfaces only (no link or route lines).
        #[arg(long)]
        cluster: bool,
        /// With --cluster: an open cluster (etcd over plain http without
        /// users, unsigned records, links unsecured) instead of the secured
        /// one (etcd over TLS with client certificates and users, a
        /// network key signing every host, links encrypted).
        #[arg(long, requires = "cluster")]
        open_cluster: bool,
        /// Cluster mode: each vnetd's lease, in seconds.
        #[arg(long, default_value_t = 10)]
        cluster_ttl: u64,
        /// Queues of each VM's TAP (`IFF_MULTI_QUEUE`; a worker per queue).
        #[arg(long, default_value_t = 1)]
        queues: u32,
        /// One more argument for every vnetd, e.g. `--vnetd-arg=--link-readers=1`.
        #[arg(long, allow_hyphen_values = true)]
        vnetd_arg: Vec<String>,
    },
}

fn fmt(f: Fmt) -> Format {
    match f {
        Fmt::Raw => Format::Raw,
        Fmt::Vnet => Format::Vnet,
    }
}

fn main() -> ExitCode {
    install_signal_cleanup();
    vnet_lab::quiet_lifetimes();
    let r = match Args::parse().cmd {
        Cmd::Demo { format, seconds, datapath } => demo(fmt(format), seconds, &datapath),
        Cmd::Matrix { out, datapath, seconds } => matrix(&out, &datapath, seconds),
        Cmd::Scale { hosts, vms, rest, plain_links } => {
            let t0 = std::time::Instant::now();
            let o = vnet_lab::scale::Opts { hosts, vms, rest_s: rest, plain_links };
            vnet_lab::scale::run(&o).map(|lines| {
                for l in lines {
                    println!("{l}");
                }
                println!("vnet-lab scale: {:.0} s", t0.elapsed().as_secs_f64());
            })
        }
        Cmd::Up {
            hosts,
            vms,
            format,
            mode,
            vm_mtu,
            underlay_mtu,
            datapath,
            qemu,
            vhost_user,
            guest_args,
            overlay,
            links,
            cipher,
            vteps,
            lan_host,
            cluster,
            cluster_ttl,
            open_cluster,
            queues,
            vnetd_arg,
        } => {
            let guest_args = guest_args
                .iter()
                .filter_map(|a| a.split_once(':'))
                .filter_map(|(h, a)| Some((h.parse().ok()?, a.to_string())))
                .collect();
            let spec = Spec {
                hosts,
                vms_per_host: vms,
                format: fmt(format),
                dispatch: mode,
                vm_mtu,
                underlay_mtu,
                qemu_hosts: qemu,
                qemu_vhost: vhost_user,
                guest_args,
                overlay,
                links,
                cipher,
                vteps,
                lan_host,
                cluster: cluster.then(|| vnet_lab::Cluster {
                    ttl_s: cluster_ttl,
                    late: vec![],
                    open: open_cluster,
                    // As a newcomer would run it: a `cluster` line in each config.
                    in_config: true,
                    members: 1,
                }),
                tap_queues: queues,
                vnetd_args: vnetd_arg,
                ..Spec::default()
            };
            up(spec, datapath)
        }
        Cmd::Bench(args) => {
            let check = args.check.clone();
            bench(args).and_then(|dir| match check {
                Some(old) => compare(&old, &dir.join("results.json"), Some(&dir.join("compare.md"))),
                None => Ok(()),
            })
        }
        Cmd::Compare { old, new } => compare(&old, &new, None),
        Cmd::VhostLoad { seconds, placed } => vhost_load(seconds, placed),
        Cmd::K8s(K8sCmd::Up { datapath, e2e_images, ready_file }) => {
            k8s_up(&vnet_lab::k8s::up::UpOpts { datapath, e2e_images }, ready_file.as_deref())
        }
        Cmd::K8s(K8sCmd::Image { tag, portmap, out, strip }) => k8s_image(&tag, &portmap, &out, strip),
    };
    // A Ctrl-C's cleanup is under way (the lab failed under it): it exits.
    while vnet_lab::interrupted() {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vnet-lab: {e}");
            ExitCode::FAILURE
        }
    }
}

fn show(title: &str, text: &str) {
    println!("\n== {title}");
    print!("{}", text);
    if !text.ends_with('\n') {
        println!();
    }
}

/// The flows `vnet-lab matrix` runs: (from host, to host, rate).
const MATRIX_FLOWS: [(usize, usize, &str); 4] =
    [(0, 1, "400M"), (1, 2, "200M"), (2, 0, "100M"), (0, 2, "50M")];

fn matrix(out: &std::path::Path, datapath: &str, seconds: u32) -> vnet_lab::Result<()> {
    let mut spec = Spec { hosts: 3, datapath: None, ..Spec::default() };
    if datapath != "user" {
        spec.datapath = Some(datapath.to_string());
        spec.veth_hosts = vec![0, 1, 2];
        spec.vm_mtu = spec.underlay_mtu - vnet_wire::vnet::IPV4_ENCAP_OVERHEAD as u32;
    }
    let mut lab = Lab::up(spec)?;
    let flows = lab.matrix_flows(&MATRIX_FLOWS, seconds)?;
    let matrices = lab.matrices()?;
    let names = lab.vm_names();
    let net = vnet_lab::matrix::network_matrix(&matrices);
    for (f, (from, to, rate)) in flows.iter().zip(MATRIX_FLOWS) {
        let got = vnet_lab::matrix::pair_bytes(&matrices[from], &f.from.mac, &f.to.mac);
        println!(
            "h{from}v0 -> h{to}v0 at {rate}: iperf3 sent {} bytes, host {from}'s matrix {} bytes ({:.3})",
            f.sent,
            got,
            got as f64 / f.sent.max(1) as f64
        );
    }
    show("vnetctl show matrix (host 0)", &lab.control(0, "show matrix")?.body);
    let title = format!("vnet traffic matrix: 3 hosts, {datapath} path, {seconds} s iperf3 flows");
    std::fs::create_dir_all(out).map_err(|e| vnet_lab::Error::Other(format!("{}: {e}", out.display())))?;
    let write = |name: &str, text: String| {
        let p = out.join(name);
        std::fs::write(&p, text).map_err(|e| vnet_lab::Error::Other(format!("{}: {e}", p.display())))?;
        println!("wrote {}", p.display());
        Ok::<(), vnet_lab::Error>(())
    };
    write("matrix.svg", vnet_lab::matrix::svg(&net, &names, &title))?;
    let flows_json: Vec<serde_json::Value> = flows
        .iter()
        .map(|f| serde_json::json!({ "from": f.from.mac, "to": f.to.mac, "iperf3_sent": f.sent }))
        .collect();
    let doc = serde_json::json!({ "datapath": datapath, "seconds": seconds, "flows": flows_json, "names": names, "hosts": matrices });
    write("matrix.json", serde_json::to_string_pretty(&doc).unwrap_or_default())?;
    Ok(())
}

fn demo(format: Format, seconds: u32, datapath: &str) -> vnet_lab::Result<()> {
    let mut spec = Spec { format, datapath: None, ..Spec::default() };
    if datapath != "user" {
        // The kernel path does not fragment: VM frames must fit the underlay.
        spec.datapath = Some(datapath.to_string());
        spec.vm_mtu = spec.underlay_mtu - vnet_wire::vnet::IPV4_ENCAP_OVERHEAD as u32;
    }
    let mut lab = Lab::up(spec)?;
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    println!(
        "lab {}: host A ({}) runs VM A {} ({}); host B ({}) runs VM B {} ({}); link format {:?}; {datapath} data path",
        lab.prefix, lab.hosts[0].underlay_ip, a.ip, a.mac, lab.hosts[1].underlay_ip, b.ip, b.mac, format
    );
    show("host A config", &std::fs::read_to_string(&lab.hosts[0].config).unwrap_or_default());
    let out = lab.ns_output(&a.ns, &["ping", "-n", "-c", "3", "-i", "0.2", &b.ip.to_string()])?;
    let arp = lab.ns_output(&a.ns, &["ip", "neigh", "show", "dev", "vt0"])?;
    show("ARP: VM A's neighbour table after resolving VM B", &String::from_utf8_lossy(&arp.stdout));
    show("ping VM A -> VM B", &String::from_utf8_lossy(&out.stdout));
    let big =
        lab.ns_output(&a.ns, &["ping", "-n", "-c", "2", "-i", "0.2", "-s", "1400", &b.ip.to_string()])?;
    show("ping 1400 bytes", &String::from_utf8_lossy(&big.stdout));
    let (gbps, _) = lab.iperf3(&a, &b, seconds, &[])?;
    show(&format!("iperf3 TCP VM A -> VM B, {seconds} s"), &format!("{gbps:.2} Gbit/s received by VM B\n"));
    let stats = lab.control(0, "show stats")?;
    show("vnetctl show stats (host A)", &stats.body);
    let ping = vnet_lab::PingResult::parse(&String::from_utf8_lossy(&out.stdout));
    drop(lab);
    println!("\nlab removed: namespaces, TAPs and vnetd processes are gone");
    if ping.received == 0 || gbps <= 0.0 {
        return Err(vnet_lab::Error::Other("the demo did not reach VM B".into()));
    }
    Ok(())
}

fn up(mut spec: Spec, datapath: Option<String>) -> vnet_lab::Result<()> {
    let hosts = spec.hosts;
    if datapath.is_some() {
        spec.datapath = datapath;
    }
    let lab = Lab::up(spec)?;
    for (h, host) in lab.hosts.iter().enumerate() {
        println!(
            "host {h}: ns {} underlay {} control unix:{}",
            host.ns,
            host.underlay_ip,
            host.control.display()
        );
        for vm in &host.vms {
            match &vm.console {
                Some(c) => println!("  vm: QEMU guest ip {} mac {} console {}", vm.ip, vm.mac, c.display()),
                None => println!("  vm: ns {} ip {} mac {}", vm.ns, vm.ip, vm.mac),
            }
        }
    }
    if let Some(m) = &lab.lan {
        println!("LAN machine: ns {} ip {} mac {}", m.ns, m.ip, m.mac);
    }
    if lab.spec.cluster.is_some() {
        println!(
            "etcd: {} in ns {}-sw ({}), network {}; see: vnetctl --control unix:{} show cluster",
            lab.etcd_url(),
            lab.prefix,
            if lab.spec.cluster.as_ref().is_some_and(|c| c.secured()) {
                "TLS, client certificates and users; its root's certificate root.pem in the lab's directory"
            } else {
                "open"
            },
            lab.prefix,
            lab.hosts[0].control.display()
        );
    }
    println!(
        "try: ip netns exec {} ping {}",
        lab.hosts[0].vms.first().map_or("", |v| v.ns.as_str()),
        vnet_lab::vm_ip(hosts.saturating_sub(1), 0)
    );
    println!("Ctrl-C removes the lab.");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

fn k8s_up(opts: &vnet_lab::k8s::up::UpOpts, ready_file: Option<&std::path::Path>) -> vnet_lab::Result<()> {
    use vnet_lab::k8s::up;
    let t0 = std::time::Instant::now();
    let lab = up::up(opts)?;
    let kubectl = up::kubectl_line(&lab);
    println!("vnet-lab k8s: up in {:.0} s: nodes {}", t0.elapsed().as_secs_f64(), {
        let names: Vec<&str> = lab.kube.nodes.iter().map(|n| n.name.as_str()).collect();
        names.join(", ")
    });
    for i in &lab.images {
        println!("  image {i}");
    }
    println!("try: {kubectl} get pods -A -o wide");
    if let Some(f) = ready_file {
        let text = format!(
            "KUBECONFIG={}\nNETNS={}\nPREFIX={}\nKUBECTL={}\n",
            lab.kube.dir.join("admin.conf").display(),
            lab.lab.switch_ns().unwrap_or(""),
            lab.lab.prefix,
            up::kubectl_path(&lab).display()
        );
        std::fs::write(f, text).map_err(|e| vnet_lab::Error::Other(format!("{}: {e}", f.display())))?;
    }
    println!("Ctrl-C (or SIGTERM) removes the cluster and the lab.");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

fn bench(args: BenchArgs) -> vnet_lab::Result<std::path::PathBuf> {
    let BenchArgs { quick, repeats, seconds, out, cases, conditions, mpi, only, vnetd_arg, .. } = args;
    use vnet_lab::bench::{self, Case, Condition};
    if let Some(m) = only.iter().find(|m| !bench::MEASUREMENTS.contains(&m.as_str())) {
        return Err(vnet_lab::Error::Other(format!(
            "unknown measurement `{m}`: expected one of {}",
            bench::MEASUREMENTS.join(", ")
        )));
    }
    let repo = bench::repo_dir();
    let all = Case::known();
    let cases: Vec<Case> = if cases.is_empty() {
        Case::all()
    } else {
        let mut v = Vec::new();
        for c in &cases {
            match all.iter().find(|k| k.name() == *c) {
                Some(k) => v.push(*k),
                None => return Err(vnet_lab::Error::Other(format!("unknown case `{c}`"))),
            }
        }
        if !v.contains(&Case::Native) {
            v.insert(0, Case::Native); // every figure is a ratio to native
        }
        v
    };
    let conditions = if !conditions.is_empty() {
        let mut v = Vec::new();
        for c in &conditions {
            let (mtu, shaped) = match c.split_once('/') {
                Some((m, s)) => (m, Some(s.to_string())),
                None => (c.as_str(), None),
            };
            let mtu = mtu.parse().ok().filter(|m| (576..=65535).contains(m)).ok_or_else(|| {
                vnet_lab::Error::Other(format!(
                    "condition `{c}`: expected MTU[/RATE], e.g. 1500 or 9000/10gbit"
                ))
            })?;
            v.push(Condition { mtu, shaped });
        }
        v
    } else if quick {
        vec![Condition { mtu: 1500, shaped: None }]
    } else {
        let mut c = Vec::new();
        for mtu in [1500, 9000] {
            for shaped in [None, Some("10gbit".to_string())] {
                c.push(Condition { mtu, shaped });
            }
        }
        c
    };
    let stamp = std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y%m%dT%H%M%SZ")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| "run".into());
    let opts = bench::Opts {
        cases,
        conditions,
        repeats: repeats.unwrap_or(if quick { 1 } else { 3 }),
        seconds: seconds.unwrap_or(if quick { 2 } else { 5 }),
        pings: 100,
        mpi_max: if quick { 1 << 20 } else { 4 << 20 },
        mpi_scale: if quick { 0.1 } else { 0.5 },
        mpi_bin: mpi,
        rsh_agent: repo.join("bench").join("rsh-netns"),
        out: out.unwrap_or_else(|| repo.join("results").join(stamp)),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        only,
        vnetd_args: vnetd_arg,
    };
    let dir = bench::run(&opts)?;
    let plot = std::process::Command::new("/usr/bin/python3")
        .arg(repo.join("bench").join("plot.py"))
        .arg(dir.join("results.json"))
        .arg(&dir)
        .status();
    if !matches!(plot, Ok(s) if s.success()) {
        eprintln!("vnet-lab: plotting failed (is python3-matplotlib installed?)");
    }
    println!("{}", std::fs::read_to_string(dir.join("results.md")).unwrap_or_default());
    println!("results in {}", dir.display());
    Ok(dir)
}

fn read_json(path: &std::path::Path) -> vnet_lab::Result<serde_json::Value> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| vnet_lab::Error::Other(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| vnet_lab::Error::Other(format!("{}:{}:{}: {e}", path.display(), e.line(), e.column())))
}

/// `vnet-lab vhost-load`: one lab, both measurements, one table.
fn vhost_load(secs: f64, placed: bool) -> vnet_lab::Result<()> {
    let e = vnet_lab::Error::Other;
    let cpus = vnetd::sys::allowed_cpus().map_err(|x| e(format!("allowed CPUs: {x}")))?;
    let (front, worker) = match (placed, cpus.first(), cpus.last()) {
        (true, Some(&f), Some(&w)) if f != w => (Some(f), Some(w)),
        (true, ..) => return Err(e("--placed needs two CPUs".into())),
        _ => (None, None),
    };
    let vnetd_args = worker.map(|w| vec!["--worker-cpus".to_string(), w.to_string()]).unwrap_or_default();
    let lab = Lab::up(Spec { vms_per_host: 0, vnetd_args, ..Spec::default() })?;
    let lens = [64, 1500, 60_000];
    if let (Some(f), Some(w)) = (front, worker) {
        println!("placed: front ends on CPU {f}, vnetd's workers on CPU {w}\n");
    }
    let vhost = vnet_lab::vhost_load::measure(&lab, &lens, secs, front)?;
    let tap = vnet_lab::vhost_load::measure_tap(&lab, &lens, secs, front)?;
    println!("| frame | vhost-user frames/s | ns a frame | Gbit/s | TAP frames/s | ns a frame | Gbit/s | vhost-user / TAP |");
    println!("|---|---|---|---|---|---|---|---|");
    for (v, t) in vhost.iter().zip(&tap) {
        println!(
            "| {} B | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.2} | {:.2}x |",
            v.len,
            v.received_per_s,
            v.ns_per_frame(),
            v.gbps,
            t.received_per_s,
            t.ns_per_frame(),
            t.gbps,
            v.received_per_s / t.received_per_s.max(1.0)
        );
    }
    Ok(())
}

/// Prints the check of `new` against `old` (and writes it to `save`).
fn compare(
    old: &std::path::Path,
    new: &std::path::Path,
    save: Option<&std::path::Path>,
) -> vnet_lab::Result<()> {
    let c = vnet_lab::noise::compare(&read_json(old)?, &read_json(new)?);
    let text = format!("## {} against {}\n\n{}", new.display(), old.display(), c.text);
    println!("{text}");
    if let Some(path) = save {
        std::fs::write(path, &text)
            .map_err(|e| vnet_lab::Error::Other(format!("{}: {e}", path.display())))?;
    }
    let bad: Vec<String> =
        c.regressed().iter().map(|v| format!("{} ({:+.1} %)", v.case, v.change_pct)).collect();
    if !bad.is_empty() {
        return Err(vnet_lab::Error::Other(format!(
            "regression: {} (a typical headline ratio to native more than {} % worse than in {})",
            bad.join(", "),
            vnet_lab::noise::REGRESSION_PCT,
            old.display()
        )));
    }
    Ok(())
}

/// `vnet-lab k8s image`: the archive, its size printed.
fn k8s_image(
    tag: &str,
    portmap: &std::path::Path,
    out: &std::path::Path,
    strip: bool,
) -> vnet_lab::Result<()> {
    let work = tempfile_dir(out)?;
    let r = vnet_lab::k8s::image::vnet_image(tag, &vnet_lab::bin, portmap, strip, &work, out);
    let _ = std::fs::remove_dir_all(&work);
    let tar = r?;
    let size = std::fs::metadata(&tar).map(|m| m.len()).unwrap_or(0);
    println!("{}: localhost/vnet:{tag}, {:.1} MB", tar.display(), size as f64 / 1e6);
    Ok(())
}

/// A fresh working directory beside `out` (removed by the caller).
fn tempfile_dir(out: &std::path::Path) -> vnet_lab::Result<std::path::PathBuf> {
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let dir = parent.join(format!(".vnet-image-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| vnet_lab::Error::Other(format!("{}: {e}", dir.display())))?;
    Ok(dir)
}
