//! `vnet-libvirt-hook`: libvirt's qemu hook (installed as
//! `/etc/libvirt/hooks/qemu.d/vnet`) that attaches a domain's interfaces to
//! vnet when it starts and detaches them when it stops, with the MACs of
//! its XML, so no vnetd line is written by hand for a VM.
//!
//! libvirt runs it as `HOOK DOMAIN OPERATION SUB-OPERATION EXTRA` with the
//! domain's XML on stdin (libvirt's "Hooks for specific system management"
//! page). A domain is vnet's when its `<metadata>` holds a
//! `<vnet:attach xmlns:vnet="urn:vnet:libvirt:1"/>` element. Which vnetd
//! and which network it joins come from the host's hook configuration
//! ([`config`], `/etc/vnet/libvirt-hook.conf`, or `--config FILE` before
//! libvirt's arguments), never from the XML: an XML whose `control` or
//! `network` differs from what the host gives the domain is refused,
//! and nothing is attached. Then:
//!
//! - `prepare` (before QEMU starts): `attach` each `vhostuser` interface
//!   (`mode='client'`: vnetd serves the socket QEMU connects to);
//! - `started` (QEMU runs, its TAPs exist): `attach` each `ethernet`
//!   interface (a TAP named by `<target dev>`, as a `netdev`);
//! - `reconnect` (libvirtd restarted with the domain running): both;
//! - `stopped` and `release`: `detach` them all.
//! - `migrate` (the destination of a live migration, before `prepare`):
//!   the domain is marked incoming (a file in `config::INCOMING_DIR`, or
//!   the configuration's `incoming` directory), so that
//!   its `prepare` and `started` attach its interfaces `standby`: vnetd
//!   routes and claims them only when the VM's first frame arrives there
//!   (QEMU's announcement after the switch-over), not while the VM still
//!   runs on the source. The mark goes at `stopped`/`release`.
//!
//! Each step of a domain of vnet's is logged (`config::Log`: the system
//! log by default): the step, and each request sent with its outcome, or
//! that the step had nothing to do; so a live migration shows `migrate`,
//! `prepare` and `started` on the destination and `stopped` and `release`
//! on the source.
//!
//! Every other operation and every other domain is left alone (exit 0,
//! nothing printed: libvirt then keeps the XML as it is). `attach` and
//! `detach` are idempotent, so a repeated event changes nothing. A failure
//! exits 1 with the reason on stderr, which libvirt reports (and for
//! `prepare`, the domain does not start).

mod config;
mod domain;
mod log;

use config::Config;
use domain::{Kind, Plan};
use std::io::Read;
use std::path::Path;
use std::process::ExitCode;
use vnet_client::client::Client;
use vnet_client::request::{Dev, Interface, Request};
use vnet_control::Datapath;

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

/// The requests `action` sends for `plan` in `network` (attaching
/// `standby` for an incoming domain).
fn requests(plan: &Plan, datapath: Datapath, network: u32, action: Action, incoming: bool) -> Vec<Request> {
    plan.ifaces
        .iter()
        .filter_map(|i| {
            let (dev, datapath) = match (&i.kind, action) {
                (_, Action::Detach) => return Some(Request::Detach(i.name.clone())),
                // vhost-user is served by vnetd's user path (`auto` may
                // still hand frames to the kernel path's TAPs).
                (Kind::VhostUser(p), Action::AttachVhost | Action::AttachAll) => {
                    let dp = if datapath == Datapath::Kernel { Datapath::Auto } else { datapath };
                    (Dev::VhostUser(p.clone()), dp)
                }
                (Kind::Tap(dev), Action::AttachTaps | Action::AttachAll) => {
                    (Dev::Netdev(dev.clone()), datapath)
                }
                _ => return None,
            };
            let mut a = Interface::new(i.name.clone(), dev);
            a.mac = Some(i.mac);
            a.datapath = datapath;
            a.network = network;
            a.standby = incoming;
            Some(Request::Attach(a))
        })
        .collect()
}

/// What the host gives `domain`, checked against what its XML asks: the
/// data path (the XML's, else the host's) and the network. An XML naming
/// another endpoint or network than the host's is refused.
fn granted(conf: &Config, plan: &Plan, domain: &str) -> Result<(Datapath, u32), String> {
    let network = conf.network_of(domain);
    if let Some(asked) = plan.control.as_deref().filter(|c| *c != conf.control_text) {
        return Err(format!(
            "{domain}: the domain asks for vnetd `{}`, but this host's hook configuration attaches its domains to `{}`: \
             the endpoint is the host's to choose (drop `control` from <vnet:attach>)",
            asked.escape_debug(),
            conf.control_text
        ));
    }
    if let Some(asked) = plan.network.filter(|n| *n != network) {
        return Err(format!(
            "{domain}: the domain asks for network {asked}, but this host's hook configuration puts it in network \
             {network}: the network is the host's to choose (drop `network` from <vnet:attach>)"
        ));
    }
    Ok((plan.datapath.unwrap_or(conf.datapath), network))
}

/// The file that marks `domain` incoming, if its name can name a file.
fn mark(dir: &Path, domain: &str) -> Result<std::path::PathBuf, String> {
    if domain.is_empty() || domain.contains('/') || domain.starts_with('.') {
        return Err(format!("`{domain}`: a domain name this hook can mark (no `/`, not starting with `.`)"));
    }
    Ok(dir.join(domain))
}

/// Does what `args` (libvirt's) ask for the domain `xml` describes; what
/// it did, a line per request (none for a domain not vnet's or an
/// operation vnet has no part in).
fn run(args: &[String], xml: &str, conf: &Config) -> Result<Vec<String>, String> {
    let dir = conf.incoming.as_path();
    let (Some(domain), Some(op)) = (args.get(1), args.get(2)) else {
        return Err(
            "usage: vnet-libvirt-hook DOMAIN OPERATION SUB-OPERATION EXTRA (domain XML on stdin)".into()
        );
    };
    let act = action(op);
    if act == Action::Nothing {
        return Ok(Vec::new());
    }
    let read = if act == Action::Detach { domain::names } else { domain::plan };
    let Some(plan) = read(xml).map_err(|e| format!("{domain}: {e}"))? else { return Ok(Vec::new()) };
    let marked = mark(dir, domain)?;
    match act {
        Action::Incoming => {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            std::fs::write(&marked, b"").map_err(|e| format!("{}: {e}", marked.display()))?;
            return Ok(vec![
                "incoming (a live migration's destination): its interfaces attach standby, active at the guest's first frame"
                    .into(),
            ]);
        }
        Action::Detach => {
            let _ = std::fs::remove_file(&marked);
        }
        _ => {}
    }
    let (datapath, network) = granted(conf, &plan, domain)?;
    let reqs = requests(&plan, datapath, network, act, marked.exists());
    if reqs.is_empty() {
        let what = if act == Action::Detach { "detach" } else { "attach at this step" };
        return Ok(vec![format!("no interface of its to {what}")]);
    }
    let ep = &conf.control;
    let mut c = match Client::connect(ep) {
        Ok(c) => c,
        // A stopped domain's interfaces go with a stopped vnetd anyway.
        Err(e) if act == Action::Detach => {
            return Ok(vec![format!("vnetd at {ep} not reachable ({e}): nothing to detach")])
        }
        Err(e) => return Err(format!("{domain}: vnetd at {ep}: {e}")),
    };
    let mut did = Vec::with_capacity(reqs.len());
    for r in reqs {
        let a = c.send(&r).map_err(|e| format!("{domain}: vnetd at {ep}: {e}"))?;
        a.result.map_err(|e| format!("{domain}: `{r}`: {e}"))?;
        did.push(format!("`{r}`: ok"));
    }
    Ok(did)
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().collect();
    // `--config FILE` before libvirt's own arguments (a wrapper script's).
    let conf_path = match args.get(1).map(String::as_str) {
        Some("--config") if args.len() > 2 => {
            let p = args.remove(2);
            args.remove(1);
            p
        }
        _ => config::DEFAULT_PATH.to_string(),
    };
    let mut xml = String::new();
    // Bounded: a domain's XML is small.
    if let Err(e) = std::io::stdin().take(16 << 20).read_to_string(&mut xml) {
        eprintln!("vnet-libvirt-hook: reading the domain XML: {e}");
        return ExitCode::FAILURE;
    }
    let conf = match Config::load(Path::new(&conf_path)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vnet-libvirt-hook: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The step, as libvirt named it, for the log.
    let step: Vec<&str> = args.iter().skip(1).take(4).map(String::as_str).collect();
    let step = step.join(" ").escape_debug().to_string();
    match run(&args, &xml, &conf) {
        Ok(did) => {
            for d in did {
                log::write(&conf.log, log::Level::Info, &format!("{step}: {d}"));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            log::write(&conf.log, log::Level::Error, &format!("{step}: {e}"));
            eprintln!("vnet-libvirt-hook: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::Iface;
    use vnet_client::request::{DevName, Name, SocketPath};

    fn plan() -> Plan {
        Plan {
            control: None,
            datapath: None,
            network: None,
            ifaces: vec![
                Iface {
                    name: Name::new("lv-a-0").unwrap(),
                    kind: Kind::VhostUser(SocketPath::new("/s").unwrap()),
                    mac: "52:54:00:00:00:01".parse().unwrap(),
                },
                Iface {
                    name: Name::new("lv-a-1").unwrap(),
                    kind: Kind::Tap(DevName::new("vt-a").unwrap()),
                    mac: "52:54:00:00:00:02".parse().unwrap(),
                },
            ],
        }
    }

    fn lines(p: &Plan, op: &str, incoming: bool) -> Vec<String> {
        requests(p, Datapath::Kernel, 0, action(op), incoming).iter().map(Request::line).collect()
    }

    #[test]
    fn each_operation_sends_its_requests() {
        assert_eq!(
            lines(&plan(), "prepare", false),
            vec!["attach lv-a-0 vhost-user /s mac 52:54:00:00:00:01 datapath auto"]
        );
        assert_eq!(
            lines(&plan(), "started", false),
            vec!["attach lv-a-1 netdev vt-a mac 52:54:00:00:00:02 datapath kernel"]
        );
        assert_eq!(lines(&plan(), "reconnect", false).len(), 2);
        assert_eq!(lines(&plan(), "release", false), vec!["detach lv-a-0", "detach lv-a-1"]);
        assert_eq!(action("migrate"), Action::Incoming);
        assert_eq!(
            lines(&plan(), "started", true),
            vec!["attach lv-a-1 netdev vt-a mac 52:54:00:00:00:02 datapath kernel standby"]
        );
        let seven = requests(&plan(), Datapath::User, 7, Action::AttachTaps, false);
        assert_eq!(
            seven[0].line(),
            "attach lv-a-1 netdev vt-a mac 52:54:00:00:00:02 datapath user network 7"
        );
    }

    #[test]
    fn the_host_chooses_the_endpoint_and_the_network_and_the_xml_may_only_agree() {
        let conf = Config::parse("h", b"control unix:/run/vnet/lan.sock\nnetwork 3\ndomain web network 7\n")
            .unwrap();
        let mut p = plan();
        assert_eq!(granted(&conf, &p, "web"), Ok((Datapath::Auto, 7)));
        assert_eq!(granted(&conf, &p, "db"), Ok((Datapath::Auto, 3)));
        p.network = Some(7);
        p.control = Some("unix:/run/vnet/lan.sock".into());
        p.datapath = Some(Datapath::User);
        assert_eq!(granted(&conf, &p, "web"), Ok((Datapath::User, 7)), "agreeing is fine");
        let e = granted(&conf, &p, "db").unwrap_err();
        assert!(e.contains("asks for network 7") && e.contains("network 3"), "{e}");
        p.network = None;
        p.control = Some("unix:/run/vnet/other.sock".into());
        assert!(granted(&conf, &p, "web").unwrap_err().contains("asks for vnetd"));
    }

    #[test]
    fn an_incoming_domain_is_marked_until_it_stops_and_other_domains_never() {
        let dir = std::env::temp_dir().join(format!("vnet-hook-test-{}", std::process::id()));
        let mut conf = Config::parse("h", b"control unix:/nonexistent/v.sock\n").unwrap();
        conf.incoming = dir.clone();
        let xml = r#"<domain><name>m</name><metadata><vnet:attach xmlns:vnet="urn:vnet:libvirt:1"/></metadata></domain>"#;
        let args = |op: &str| -> Vec<String> {
            ["hook", "m", op, "begin", "-"].iter().map(|s| s.to_string()).collect()
        };
        let did = run(&args("migrate"), xml, &conf).unwrap();
        assert!(did.len() == 1 && did[0].starts_with("incoming"), "{did:?}");
        assert!(dir.join("m").exists());
        // A domain without interfaces has nothing to detach, and its mark goes.
        let did = run(&args("release"), xml, &conf).unwrap();
        assert_eq!(did, vec!["no interface of its to detach".to_string()]);
        // One with an interface, and vnetd stopped: its interfaces went with it; no error.
        let with = xml.replace(
            "</metadata>",
            "</metadata><devices><interface type='ethernet'><mac address='52:54:00:00:00:01'/>\
             <target dev='vt-m'/></interface></devices>",
        );
        let did = run(&args("release"), &with, &conf).unwrap();
        assert!(did.len() == 1 && did[0].contains("nothing to detach"), "{did:?}");
        assert!(!dir.join("m").exists());
        assert_eq!(run(&args("migrate"), "<domain><name>m</name></domain>", &conf), Ok(vec![]));
        assert!(!dir.join("m").exists(), "not vnet's domain: not marked");
        assert!(mark(&dir, "../x").is_err() && mark(&dir, "").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn other_domains_and_operations_need_no_vnetd() {
        let args: Vec<String> =
            ["hook", "d", "prepare", "begin", "-"].iter().map(|s| s.to_string()).collect();
        let conf = Config { incoming: "/nonexistent-vnet-hook-dir".into(), ..Config::default() };
        assert_eq!(run(&args, "<domain><name>d</name></domain>", &conf), Ok(vec![]));
        let other: Vec<String> =
            ["hook", "d", "restore", "begin", "-"].iter().map(|s| s.to_string()).collect();
        assert_eq!(run(&other, "not even xml", &conf), Ok(vec![]));
        assert!(run(&args[..1], "", &conf).is_err());
    }
}
