//! `vnet-libvirt-hook`: libvirt's qemu hook (installed as
//! `/etc/libvirt/hooks/qemu.d/vnet`) that attaches a domain's interfaces to
//! vnet when it starts and detaches them when it stops, with the MACs of
//! its XML, so no vnetd line is written by hand for a VM.
//!
//! libvirt runs it as `HOOK DOMAIN OPERATION SUB-OPERATION EXTRA` with the
//! domain's XML on stdin (libvirt's "Hooks for specific system management"
//! page). A domain is vnet's when its `<metadata>` holds a
//! `<vnet:attach xmlns:vnet="urn:vnet:libvirt:1" control="unix:..."/>`
//! element; then:
//!
//! - `prepare` (before QEMU starts): `attach` each `vhostuser` interface
//!   (`mode='client'`: vnetd serves the socket QEMU connects to);
//! - `started` (QEMU runs, its TAPs exist): `attach` each `ethernet`
//!   interface (a TAP named by `<target dev>`, as a `netdev`);
//! - `reconnect` (libvirtd restarted with the domain running): both;
//! - `stopped` and `release`: `detach` them all.
//!
//! Every other operation and every other domain is left alone (exit 0,
//! nothing printed: libvirt then keeps the XML as it is). `attach` and
//! `detach` are idempotent, so a repeated event changes nothing. A failure
//! exits 1 with the reason on stderr, which libvirt reports (and for
//! `prepare`, the domain does not start).

mod domain;

use domain::{Kind, Plan};
use std::io::Read;
use std::process::ExitCode;
use vnet_client::client::Client;
use vnet_client::endpoint::Endpoint;

/// What an operation does to the domain's interfaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    AttachVhost,
    AttachTaps,
    AttachAll,
    Detach,
    Nothing,
}

fn action(op: &str) -> Action {
    match op {
        "prepare" => Action::AttachVhost,
        "started" => Action::AttachTaps,
        "reconnect" => Action::AttachAll,
        "stopped" | "release" => Action::Detach,
        _ => Action::Nothing,
    }
}

/// The control lines `action` sends for `plan`.
fn lines(plan: &Plan, action: Action) -> Vec<String> {
    plan.ifaces
        .iter()
        .filter_map(|i| {
            let net = if plan.network != 0 { format!(" network {}", plan.network) } else { String::new() };
            match (&i.kind, action) {
                (_, Action::Detach) => Some(format!("detach {}", i.name)),
                (Kind::VhostUser(p), Action::AttachVhost | Action::AttachAll) => {
                    // vhost-user is served by vnetd's user path (`auto` may
                    // still hand frames to the kernel path's TAPs).
                    let dp = if plan.datapath == "kernel" { "auto" } else { plan.datapath.as_str() };
                    Some(format!("attach {} vhost-user {p} mac {} datapath {dp}{net}", i.name, i.mac))
                }
                (Kind::Tap(dev), Action::AttachTaps | Action::AttachAll) => Some(format!(
                    "attach {} netdev {dev} mac {} datapath {}{net}",
                    i.name, i.mac, plan.datapath
                )),
                _ => None,
            }
        })
        .collect()
}

fn run(args: &[String], xml: &str) -> Result<(), String> {
    let (Some(domain), Some(op)) = (args.get(1), args.get(2)) else {
        return Err(
            "usage: vnet-libvirt-hook DOMAIN OPERATION SUB-OPERATION EXTRA (domain XML on stdin)".into()
        );
    };
    let act = action(op);
    if act == Action::Nothing {
        return Ok(());
    }
    let Some(plan) = domain::plan(xml).map_err(|e| format!("{domain}: {e}"))? else { return Ok(()) };
    let lines = lines(&plan, act);
    if lines.is_empty() {
        return Ok(());
    }
    let ep: Endpoint =
        plan.control.parse().map_err(|e| format!("{domain}: control `{}`: {e}", plan.control))?;
    let mut c = match Client::connect(&ep) {
        Ok(c) => c,
        // A stopped domain's interfaces go with a stopped vnetd anyway.
        Err(_) if act == Action::Detach => return Ok(()),
        Err(e) => return Err(format!("{domain}: vnetd at {ep}: {e}")),
    };
    for l in lines {
        let r = c.request(&l).map_err(|e| format!("{domain}: vnetd at {ep}: {e}"))?;
        r.result.map_err(|e| format!("{domain}: `{l}`: {e}"))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let mut xml = String::new();
    // Bounded: a domain's XML is small.
    if let Err(e) = std::io::stdin().take(16 << 20).read_to_string(&mut xml) {
        eprintln!("vnet-libvirt-hook: reading the domain XML: {e}");
        return ExitCode::FAILURE;
    }
    match run(&args, &xml) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vnet-libvirt-hook: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::Iface;

    fn plan() -> Plan {
        Plan {
            control: "unix:/x".into(),
            datapath: "kernel".into(),
            network: 0,
            ifaces: vec![
                Iface {
                    name: "lv-a-0".into(),
                    kind: Kind::VhostUser("/s".into()),
                    mac: "52:54:00:00:00:01".into(),
                },
                Iface {
                    name: "lv-a-1".into(),
                    kind: Kind::Tap("vt-a".into()),
                    mac: "52:54:00:00:00:02".into(),
                },
            ],
        }
    }

    #[test]
    fn each_operation_sends_its_lines() {
        assert_eq!(
            lines(&plan(), action("prepare")),
            vec!["attach lv-a-0 vhost-user /s mac 52:54:00:00:00:01 datapath auto"]
        );
        assert_eq!(
            lines(&plan(), action("started")),
            vec!["attach lv-a-1 netdev vt-a mac 52:54:00:00:00:02 datapath kernel"]
        );
        assert_eq!(lines(&plan(), action("reconnect")).len(), 2);
        assert_eq!(lines(&plan(), action("release")), vec!["detach lv-a-0", "detach lv-a-1"]);
        assert_eq!(action("migrate"), Action::Nothing);
    }

    #[test]
    fn other_domains_and_operations_need_no_vnetd() {
        let args: Vec<String> =
            ["hook", "d", "prepare", "begin", "-"].iter().map(|s| s.to_string()).collect();
        assert_eq!(run(&args, "<domain><name>d</name></domain>"), Ok(()));
        let mig: Vec<String> = ["hook", "d", "migrate", "begin", "-"].iter().map(|s| s.to_string()).collect();
        assert_eq!(run(&mig, "not even xml"), Ok(()));
        assert!(run(&args[..1], "").is_err());
    }
}
