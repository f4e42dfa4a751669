//! The node as its pods' gateway (`isDefaultGateway`, `ipMasq`;
//! `docs/INTEGRATION.md`, "Pods as Kubernetes expects them").
//!
//! Pods of every node share one LAN, the `vnet` IPAM's subnet, and reach
//! each other on it directly. What is not on that LAN goes through the
//! pod's own node: the node has an address of the subnet on a veth pair of
//! its own (`vgHEX` the node's end, `vcHEX` attached to vnetd as a pod's
//! end is), the pods' default route goes to it, and
//! - connections the node translated (kube-proxy's DNAT of a Service) and
//!   sends into the overlay leave with the node's address as their source,
//!   so the backend's reply comes back to the node whose conntrack undoes
//!   the translation, not straight to the client over the LAN;
//! - with `ipMasq`, the pods' traffic to anything outside the subnet
//!   leaves with the node's own address (flannel's `--ip-masq`);
//! - the node reaches every pod (the kubelet's probes) on the LAN.
//!
//! The first `ADD` of a node makes it, the `DEL` (or `GC`) that leaves no
//! attachment removes it (both under a lock in the state directory); the
//! node's address is held in the `vnet` IPAM by an owner naming the node's
//! MAC. That MAC is also written in the state directory (on disk): a
//! reboot takes the pair with no `DEL`, and the next gateway (a new pair,
//! a new MAC) first gives back the address the one before held, which
//! nothing else names (the Kubernetes lab's node reboot left one an
//! address otherwise).

use crate::record;
use crate::spec::{Code, Error, NetConf, Result};
use crate::veth::names;
use crate::vnetd::request;
use crate::{ipam, veth};
use serde_json::Value;
use std::net::IpAddr;
use std::process::Command;
use vnet_client::client::Client;
use vnet_client::request::{self as req, DevName, Name, Request};

/// The pair's names: vnetd's end (and interface), and the node's end.
pub fn devices(network: &str) -> (String, String) {
    let (attached, _) = names(network, "node-gateway", "gw");
    let node = format!("vg{}", &attached[2..]);
    (attached, node)
}

fn invalid(e: req::Invalid) -> Error {
    Error::with(Code::InvalidConfig, "the node's gateway", e)
}

/// The lock every change of the node's gateway holds (released on drop).
fn lock(conf: &NetConf) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let dir = std::path::Path::new(&conf.state_dir);
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::with(Code::Io, format!("making {}", dir.display()), e))?;
    // Beside the network's records, not among them (never removed: a lock
    // file unlinked while another waits on it locks nothing).
    let p = dir.join(format!(".{}.gateway.lock", conf.name));
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&p)
        .map_err(|e| Error::with(Code::Io, format!("opening {}", p.display()), e))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| Error::with(Code::Io, format!("locking {}", p.display()), e))
}

/// Where the MAC of the gateway made last is kept (beside the lock).
fn mac_file(conf: &NetConf) -> std::path::PathBuf {
    std::path::Path::new(&conf.state_dir).join(format!(".{}.gateway.mac", conf.name))
}

/// The MAC of the gateway made last, if one is recorded: a regular file
/// (a link is not followed) whose first 64 bytes are a MAC's text;
/// anything else is no record.
fn recorded_mac(conf: &NetConf) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(mac_file(conf))
        .ok()?;
    let mut text = String::new();
    f.take(64).read_to_string(&mut text).ok()?;
    let mac = text.trim();
    mac.parse::<vnet_wire::MacAddr>().ok().map(|_| mac.to_string())
}

/// Records `mac` as the gateway's: written whole to a new file (no link
/// followed, none left from before), then renamed over the record.
fn record_mac(conf: &NetConf, mac: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let p = mac_file(conf);
    let tmp = p.with_extension("mac.tmp");
    let _ = std::fs::remove_file(&tmp);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&tmp)
        .and_then(|mut f| f.write_all(format!("{mac}\n").as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, &p))
        .map_err(|e| Error::with(Code::Io, format!("writing {}", p.display()), e))
}

/// Gives back the address of a gateway that went with no `DEL` (its pair
/// gone: a reboot), by the MAC recorded when it was made; then forgets it.
fn release_recorded(conf: &NetConf, c: &mut Client) -> Result<()> {
    if let Some(mac) = recorded_mac(conf) {
        ipam::vnet_del(c, owner(&conf.name, &mac)?)?;
    }
    forget_mac(conf)
}

fn forget_mac(conf: &NetConf) -> Result<()> {
    let p = mac_file(conf);
    // The name is the plugin's own: whatever else sits there goes too.
    if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
        return std::fs::remove_dir_all(&p)
            .map_err(|e| Error::with(Code::Io, format!("removing {}", p.display()), e));
    }
    match std::fs::remove_file(&p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::with(Code::Io, format!("removing {}", p.display()), e))
        }
        _ => Ok(()),
    }
}

/// The IPAM owner of the node's address: the node's end's MAC names the
/// node (a node's name is not the plugin's to know).
fn owner(network: &str, mac: &str) -> Result<req::Owner> {
    ipam::owner(network, &format!("node-gateway-{}", mac.replace(':', "")), "gw")
}

/// The node's address on the pod network, made first if it is not there.
pub fn ensure(conf: &NetConf, c: &mut Client, section: &Value) -> Result<IpAddr> {
    let _held = lock(conf)?;
    let (attached, node) = devices(&conf.name);
    if let Some((mac, addrs)) = veth::inspect_here(&node)? {
        if let Some(ip) = addrs.iter().find_map(|a| a.split('/').next()?.parse().ok()) {
            // A gateway made before its MAC was recorded (an upgrade), or
            // a record naming another (an older version's pair gone since):
            // the other's address given back, this one's recorded, so a
            // reboot gives it back too. Best effort: the gateway works.
            if recorded_mac(conf).as_deref() != Some(mac.as_str()) {
                if let Err(e) = release_recorded(conf, c).and_then(|()| record_mac(conf, &mac)) {
                    eprintln!("vnet-cni: the node gateway's MAC not recorded: {e}");
                }
            }
            return Ok(ip);
        }
        // Half made (a failed first ADD): made again.
        veth::delete(&node)?;
    }
    release_recorded(conf, c)?;
    let mac = veth::make_here(&attached, &node, conf.mtu)?;
    let made = (|| {
        record_mac(conf, &mac)?;
        let out = ipam::vnet_add(c, section, owner(&conf.name, &mac)?)?;
        let cidr = out.ips.first().map(|i| i.address.clone()).unwrap_or_default();
        let (ip, len) = cidr
            .split_once('/')
            .and_then(|(a, l)| Some((a.parse::<IpAddr>().ok()?, l.parse::<u8>().ok()?)))
            .ok_or_else(|| Error::new(Code::Decode, format!("vnetd's address `{cidr}`")))?;
        veth::add_address_here(&node, ip, len)?;
        forwarding(ip, &node)?;
        let mut i = req::Interface::new(
            Name::new(&attached).map_err(invalid)?,
            req::Dev::Netdev(DevName::new(&attached).map_err(invalid)?),
        );
        i.mac = Some(mac.parse().map_err(|_| Error::new(Code::Io, format!("MAC `{mac}`")))?);
        // The user path whatever the pods' path: the kernel path sends a
        // veth's frames into its peer (`bpf_redirect_peer`), which the
        // kernel drops when the peer is in the same namespace, as the
        // node's end is. Pod to pod stays on the pods' path.
        i.datapath = vnet_control::Datapath::User;
        i.network = conf.network;
        request(c, &Request::attach(i).map_err(invalid)?)?;
        // No `neigh` line: an interface that owns an address passes only
        // frames from it (the IP source guard), and the node's end is a
        // router, whose frames carry the outside's and the Services'
        // addresses. The node answers ARP for its address itself.
        rules(conf, section, &node, ip, Op::Add)?;
        Ok(ip)
    })();
    if made.is_err() {
        let _ = remove(conf, c, section, &attached, &node);
    }
    made
}

/// Removes the node's gateway when no attachment of the network is left.
pub fn release(conf: &NetConf, c: Option<&mut Client>, section: &Value) -> Result<()> {
    let _held = lock(conf)?;
    if !record::all(&conf.state_dir, &conf.name).is_empty() {
        return Ok(());
    }
    let (attached, node) = devices(&conf.name);
    match c {
        Some(c) if !veth::exists(&node)? => release_recorded(conf, c),
        Some(c) => remove(conf, c, section, &attached, &node),
        // vnetd down: what it held goes with it; the address stays until
        // the host's lease ends.
        None => {
            let ip = address(&node)?;
            veth::delete(&node)?;
            ip.map_or(Ok(()), |ip| rules(conf, section, &node, ip, Op::Del))
        }
    }
}

fn address(node: &str) -> Result<Option<IpAddr>> {
    Ok(veth::inspect_here(node)?.and_then(|(_, a)| a.iter().find_map(|a| a.split('/').next()?.parse().ok())))
}

/// Undoes [`ensure`], each step tried; the first error is returned.
fn remove(conf: &NetConf, c: &mut Client, section: &Value, attached: &str, node: &str) -> Result<()> {
    let Some((mac, _)) = veth::inspect_here(node)? else { return Ok(()) };
    let ip = address(node)?;
    let mut first = None;
    if let Some(ip) = ip {
        if let Err(e) = rules(conf, section, node, ip, Op::Del) {
            first.get_or_insert(e);
        }
    }
    if let Ok(n) = Name::new(attached) {
        // Never attached (a failed first ADD) is no error.
        let _ = request(c, &Request::Detach(n));
    }
    match owner(&conf.name, &mac).and_then(|o| ipam::vnet_del(c, o)) {
        Err(e) => {
            first.get_or_insert(e);
        }
        Ok(()) => {
            if let Err(e) = forget_mac(conf) {
                first.get_or_insert(e);
            }
        }
    }
    if let Err(e) = veth::delete(node) {
        first.get_or_insert(e);
    }
    first.map_or(Ok(()), Err)
}

/// Forwarding on (as the reference `bridge` plugin's `isGateway` turns
/// it on), and no ICMP redirects from the node's end: a Service's packet
/// leaves by the interface it came in by, and the pod is not to be told
/// to go around the node.
fn forwarding(ip: IpAddr, node: &str) -> Result<()> {
    let files = match ip {
        IpAddr::V4(_) => {
            vec![
                "/proc/sys/net/ipv4/ip_forward".to_string(),
                format!("/proc/sys/net/ipv4/conf/{node}/send_redirects"),
            ]
        }
        IpAddr::V6(_) => vec!["/proc/sys/net/ipv6/conf/all/forwarding".to_string()],
    };
    for (f, v) in files.iter().zip(["1", "0"]) {
        std::fs::write(f, v).map_err(|e| Error::with(Code::Io, format!("writing {v} to {f}"), e))?;
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Add,
    Del,
}

/// The node's rules for the network: each an `iptables` (or `ip6tables`)
/// rule spec, every word a checked value (the subnet, a device name of
/// ours, the network's name).
pub fn rule_specs(conf: &NetConf, subnet: &str, node: &str) -> Vec<Vec<String>> {
    let words = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
    let tag = |what: &str| {
        vec!["-m".into(), "comment".into(), "--comment".into(), format!("vnet {}: {what}", conf.name)]
    };
    let mut specs = Vec::new();
    let mut services = words(&format!("nat POSTROUTING -o {node} -m conntrack --ctstate DNAT"));
    services.extend(tag("Service replies through the node"));
    services.extend(words("-j MASQUERADE"));
    specs.push(services);
    for dir in ["-s", "-d"] {
        let mut fwd = words(&format!("filter FORWARD {dir} {subnet}"));
        fwd.extend(tag("pods through the node"));
        fwd.extend(words("-j ACCEPT"));
        specs.push(fwd);
    }
    if conf.ip_masq {
        let mut out = words(&format!("nat POSTROUTING -s {subnet} ! -d {subnet}"));
        out.extend(tag("pods to the outside"));
        out.extend(words("-j MASQUERADE"));
        specs.push(out);
    }
    specs
}

fn rules(conf: &NetConf, section: &Value, node: &str, ip: IpAddr, op: Op) -> Result<()> {
    let subnet = ipam::subnet_of(section)?.to_string();
    let tool = if ip.is_ipv4() { "iptables" } else { "ip6tables" };
    for spec in rule_specs(conf, &subnet, node) {
        let (table, rest) = spec.split_first().ok_or_else(|| Error::new(Code::Io, "an empty rule"))?;
        let (chain, rest) = rest.split_first().ok_or_else(|| Error::new(Code::Io, "an empty rule"))?;
        let run = |flag: &str| {
            Command::new(tool)
                .args(["-w", "-t", table, flag, chain])
                .args(rest)
                .output()
                .map_err(|e| Error::with(Code::Io, format!("running {tool}"), e))
        };
        let present = run("-C")?.status.success();
        let flag = match (op, present) {
            (Op::Add, false) => "-A",
            (Op::Del, true) => "-D",
            _ => continue,
        };
        let out = run(flag)?;
        if !out.status.success() {
            return Err(Error::with(
                Code::Io,
                format!("{tool} -t {table} {flag} {chain} {}", rest.join(" ")),
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateways_mac_is_recorded_read_back_and_forgotten_and_nothing_else_is_a_record() {
        let dir = std::env::temp_dir().join(format!("vnet-cni-gwmac-{}", std::process::id()));
        let raw = br#"{"cniVersion":"1.1.0","name":"vnet","type":"vnet-cni","isDefaultGateway":true,
            "ipam":{"type":"vnet","subnet":"10.244.0.0/16"}}"#;
        let (mut conf, _) = crate::spec::parse_conf(raw).unwrap();
        conf.state_dir = dir.display().to_string();
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(recorded_mac(&conf), None, "no gateway made yet");
        record_mac(&conf, "02:aa:bb:cc:dd:ee").unwrap();
        assert_eq!(recorded_mac(&conf).as_deref(), Some("02:aa:bb:cc:dd:ee"));
        assert_eq!(
            owner(&conf.name, "02:aa:bb:cc:dd:ee").unwrap().to_string(),
            "vnet/node-gateway-02aabbccddee/gw"
        );
        forget_mac(&conf).unwrap();
        assert_eq!(recorded_mac(&conf), None);
        forget_mac(&conf).unwrap();
        // A file someone else wrote there names no owner.
        std::fs::write(mac_file(&conf), "vnet/other-pod/eth0\n").unwrap();
        assert_eq!(recorded_mac(&conf), None);
        // A link there is not followed, read or written through.
        let target = dir.join("elsewhere");
        std::fs::write(&target, "02:11:22:33:44:55\n").unwrap();
        std::fs::remove_file(mac_file(&conf)).unwrap();
        std::os::unix::fs::symlink(&target, mac_file(&conf)).unwrap();
        assert_eq!(recorded_mac(&conf), None, "read through a link");
        std::os::unix::fs::symlink(&target, mac_file(&conf).with_extension("mac.tmp")).unwrap();
        record_mac(&conf, "02:aa:bb:cc:dd:ee").unwrap();
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            "02:11:22:33:44:55\n",
            "written through a link"
        );
        assert_eq!(recorded_mac(&conf).as_deref(), Some("02:aa:bb:cc:dd:ee"));
        // A directory in its place goes, rather than stopping every gateway.
        forget_mac(&conf).unwrap();
        std::fs::create_dir(mac_file(&conf)).unwrap();
        forget_mac(&conf).unwrap();
        assert!(!mac_file(&conf).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_node_gets_a_pair_of_its_own_and_rules_of_checked_words() {
        let (a, n) = devices("vnet");
        assert!(a.starts_with("vc") && n.starts_with("vg") && a[2..] == n[2..] && n.len() <= 15);
        assert_ne!(devices("other").0, a, "one gateway per network");
        let raw = br#"{"cniVersion":"1.1.0","name":"vnet","type":"vnet-cni","isDefaultGateway":true,
            "ipam":{"type":"vnet","subnet":"10.244.0.0/16"}}"#;
        let (mut conf, _) = crate::spec::parse_conf(raw).unwrap();
        let specs = rule_specs(&conf, "10.244.0.0/16", &n);
        assert_eq!(specs.len(), 3, "no masquerade to the outside unless asked");
        assert_eq!(
            specs[0].join(" "),
            format!(
                "nat POSTROUTING -o {n} -m conntrack --ctstate DNAT -m comment --comment \
                 vnet vnet: Service replies through the node -j MASQUERADE"
            )
        );
        conf.ip_masq = true;
        let specs = rule_specs(&conf, "10.244.0.0/16", &n);
        assert_eq!(specs[3][..7].join(" "), "nat POSTROUTING -s 10.244.0.0/16 ! -d 10.244.0.0/16");
        // The comment is one word of argv, whatever it holds.
        assert!(specs.iter().all(|s| s.iter().filter(|w| w.starts_with("vnet vnet: ")).count() == 1));
    }
}
