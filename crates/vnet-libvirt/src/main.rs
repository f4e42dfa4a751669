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
//! - `migrate` (the destination of a live migration, before `prepare`):
//!   the domain is marked incoming (a file in [`INCOMING_DIR`]), so that
//!   its `prepare` and `started` attach its interfaces `standby`: vnetd
//!   routes and claims them only when the VM's first frame arrives there
//!   (QEMU's announcement after the switch-over), not while the VM still
//!   runs on the source. The mark goes at `stopped`/`release`.
//!
//! Every other operation and every other domain is left alone (exit 0,
//! nothing printed: libvirt then keeps the XML as it is). `attach` and
//! `detach` are idempotent, so a repeated event changes nothing. A failure
//! exits 1 with the reason on stderr, which libvirt reports (and for
//! `prepare`, the domain does not start).

mod domain;

use domain::{Kind, Plan};
use std::io::Read;
use std::path::Path;
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
    /// A live migration's destination: mark the domain incoming.
    Incoming,
    Nothing,
}

/// Where incoming domains are marked (one empty file per domain name).
pub const INCOMING_DIR: &str = "/run/vnet/libvirt-incoming";

fn action(op: &str) -> Action {
    match op {
        "prepare" => Action::AttachVhost,
        "started" => Action::AttachTaps,
        "reconnect" => Action::AttachAll,
        "stopped" | "release" => Action::Detach,
        "migrate" => Action::Incoming,
        _ => Action::Nothing,
    }
}

/// The control lines `action` sends for `plan` (attaching `standby` for an
/// incoming domain).
fn lines(plan: &Plan, action: Action, incoming: bool) -> Vec<String> {
    plan.ifaces
        .iter()
        .filter_map(|i| {
            let mut net =
                if plan.network != 0 { format!(" network {}", plan.network) } else { String::new() };
            if incoming {
                net.push_str(" standby");
            }
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

/// The file that marks `domain` incoming, if its name can name a file.
fn mark(dir: &Path, domain: &str) -> Result<std::path::PathBuf, String> {
    if domain.is_empty() || domain.contains('/') || domain.starts_with('.') {
        return Err(format!("`{domain}`: a domain name this hook can mark (no `/`, not starting with `.`)"));
    }
    Ok(dir.join(domain))
}

fn run(args: &[String], xml: &str, dir: &Path) -> Result<(), String> {
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
    let marked = mark(dir, domain)?;
    match act {
        Action::Incoming => {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            return std::fs::write(&marked, b"").map_err(|e| format!("{}: {e}", marked.display()));
        }
        Action::Detach => {
            let _ = std::fs::remove_file(&marked);
        }
        _ => {}
    }
    let lines = lines(&plan, act, marked.exists());
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
    match run(&args, &xml, Path::new(INCOMING_DIR)) {
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
            lines(&plan(), action("prepare"), false),
            vec!["attach lv-a-0 vhost-user /s mac 52:54:00:00:00:01 datapath auto"]
        );
        assert_eq!(
            lines(&plan(), action("started"), false),
            vec!["attach lv-a-1 netdev vt-a mac 52:54:00:00:00:02 datapath kernel"]
        );
        assert_eq!(lines(&plan(), action("reconnect"), false).len(), 2);
        assert_eq!(lines(&plan(), action("release"), false), vec!["detach lv-a-0", "detach lv-a-1"]);
        assert_eq!(action("migrate"), Action::Incoming);
        assert_eq!(
            lines(&plan(), action("started"), true),
            vec!["attach lv-a-1 netdev vt-a mac 52:54:00:00:00:02 datapath kernel standby"]
        );
    }

    #[test]
    fn an_incoming_domain_is_marked_until_it_stops_and_other_domains_never() {
        let dir = std::env::temp_dir().join(format!("vnet-hook-test-{}", std::process::id()));
        let xml = r#"<domain><name>m</name><metadata><vnet:attach xmlns:vnet="urn:vnet:libvirt:1" control="unix:/nonexistent/v.sock"/></metadata></domain>"#;
        let args = |op: &str| -> Vec<String> {
            ["hook", "m", op, "begin", "-"].iter().map(|s| s.to_string()).collect()
        };
        assert_eq!(run(&args("migrate"), xml, &dir), Ok(()));
        assert!(dir.join("m").exists());
        // A stopped domain's interfaces go with a stopped vnetd: no error, and the mark goes.
        assert_eq!(run(&args("release"), xml, &dir), Ok(()));
        assert!(!dir.join("m").exists());
        assert_eq!(run(&args("migrate"), "<domain><name>m</name></domain>", &dir), Ok(()));
        assert!(!dir.join("m").exists(), "not vnet's domain: not marked");
        assert!(mark(&dir, "../x").is_err() && mark(&dir, "").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn other_domains_and_operations_need_no_vnetd() {
        let args: Vec<String> =
            ["hook", "d", "prepare", "begin", "-"].iter().map(|s| s.to_string()).collect();
        let dir = Path::new("/nonexistent-vnet-hook-dir");
        assert_eq!(run(&args, "<domain><name>d</name></domain>", dir), Ok(()));
        let other: Vec<String> =
            ["hook", "d", "restore", "begin", "-"].iter().map(|s| s.to_string()).collect();
        assert_eq!(run(&other, "not even xml", dir), Ok(()));
        assert!(run(&args[..1], "", dir).is_err());
    }
}
