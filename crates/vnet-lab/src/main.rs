//! `vnet-lab`: build a vnet lab in network namespaces and show it working.

use clap::{Parser, Subcommand, ValueEnum};
use std::process::ExitCode;
use vnet_lab::{install_signal_cleanup, Format, Lab, Spec};

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

#[derive(Subcommand)]
enum Cmd {
    /// Two hosts, one VM each: ARP, ping and iperf3 from VM A to VM B over
    /// vnet, then tear down.
    Demo {
        #[arg(long, value_enum, default_value = "vnet")]
        format: Fmt,
        /// iperf3 duration.
        #[arg(long, default_value_t = 5)]
        seconds: u32,
    },
    /// Build a lab and keep it until Ctrl-C, printing how to reach it.
    Up {
        #[arg(long, default_value_t = 2)]
        hosts: usize,
        #[arg(long, default_value_t = 1)]
        vms: usize,
        #[arg(long, value_enum, default_value = "vnet")]
        format: Fmt,
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
    let r = match Args::parse().cmd {
        Cmd::Demo { format, seconds } => demo(fmt(format), seconds),
        Cmd::Up { hosts, vms, format } => up(hosts, vms, fmt(format)),
    };
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

fn demo(format: Format, seconds: u32) -> vnet_lab::Result<()> {
    let mut lab = Lab::up(Spec { format, ..Spec::default() })?;
    let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
    println!(
        "lab {}: host A ({}) runs VM A {} ({}); host B ({}) runs VM B {} ({}); link format {:?}",
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

fn up(hosts: usize, vms: usize, format: Format) -> vnet_lab::Result<()> {
    let lab = Lab::up(Spec { hosts, vms_per_host: vms, format, ..Spec::default() })?;
    for (h, host) in lab.hosts.iter().enumerate() {
        println!(
            "host {h}: ns {} underlay {} control unix:{}",
            host.ns,
            host.underlay_ip,
            host.control.display()
        );
        for vm in &host.vms {
            println!("  vm: ns {} ip {} mac {}", vm.ns, vm.ip, vm.mac);
        }
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
