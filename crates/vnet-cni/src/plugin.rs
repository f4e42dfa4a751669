//! The commands: what `ADD`, `DEL`, `CHECK`, `STATUS`, `GC` and
//! `VERSION` do, given the environment and the configuration.

use crate::record::{self, Record};
use crate::spec::{self, Code, Command, Error, Interface, NetConf, Outcome, Result};
use crate::veth::names;
use crate::vnetd::{request, vnetd};
use crate::{gateway, ipam, labels, veth};
use serde_json::Value;
use std::fs::File;
use vnet_client::request::{self, Dev, DevName, Invalid, Name, Request, SocketPath};
use vnet_control::{Datapath, ShowWhat};

/// The `CNI_*` variables.
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub container_id: Option<String>,
    pub netns: Option<String>,
    pub ifname: Option<String>,
    pub path: String,
    /// `CNI_ARGS`: `KEY=VALUE;...` (Kubernetes runtimes name the pod there).
    pub args: Option<String>,
}

impl Env {
    pub fn from_process() -> Env {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Env {
            container_id: var("CNI_CONTAINERID"),
            netns: var("CNI_NETNS"),
            ifname: var("CNI_IFNAME"),
            path: var("CNI_PATH").unwrap_or_default(),
            args: var("CNI_ARGS"),
        }
    }

    /// `CNI_CONTAINERID`: alphanumerics, `_`, `.`, `-` (the spec's rule).
    fn container_id(&self) -> Result<&str> {
        let id = self.container_id.as_deref().ok_or_else(|| missing("CNI_CONTAINERID"))?;
        if !id.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) || id.len() > 256 {
            return Err(Error::new(
                Code::InvalidEnvironment,
                format!("CNI_CONTAINERID `{id}`: expected letters, digits, `_`, `.` or `-`"),
            ));
        }
        Ok(id)
    }

    /// `CNI_IFNAME`: 1-15 printable ASCII characters, not `.` or `..`, no
    /// `/`, `:` or `#` (it is part of the IPAM owner vnetd is told).
    fn ifname(&self) -> Result<&str> {
        let n = self.ifname.as_deref().ok_or_else(|| missing("CNI_IFNAME"))?;
        if n.len() > 15
            || n == "."
            || n == ".."
            || !n.bytes().all(|b| b.is_ascii_graphic() && !b"/:#".contains(&b))
        {
            return Err(Error::new(
                Code::InvalidEnvironment,
                format!(
                    "CNI_IFNAME `{}`: expected 1-15 printable ASCII characters, no `/`, `:` or `#`",
                    n.escape_debug()
                ),
            ));
        }
        Ok(n)
    }

    fn netns(&self) -> Result<&str> {
        self.netns.as_deref().ok_or_else(|| missing("CNI_NETNS"))
    }
}

fn missing(var: &str) -> Error {
    Error::new(Code::InvalidEnvironment, format!("{var} is not set"))
}

/// A locally administered unicast MAC for a vhost-user attachment (the
/// guest is given it; there is no veth to take one from).
fn vhost_mac(name: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
    let b = d.as_ref();
    format!("02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3], b[4])
}

/// A value of an attachment that a request cannot carry: the network
/// configuration's fault (its checks come first, so this is a record
/// someone edited).
fn invalid(e: Invalid) -> Error {
    Error::with(Code::InvalidConfig, "the attachment", e)
}

/// Runs `cmd`; the JSON to print, if any.
pub fn run(cmd: Command, env: &Env, stdin: &[u8]) -> Result<Option<Value>> {
    if cmd == Command::Version {
        let asked: Value = serde_json::from_slice(stdin).unwrap_or(Value::Null);
        let v = asked.get("cniVersion").and_then(Value::as_str).unwrap_or(spec::CURRENT);
        return Ok(Some(spec::version_info(v)));
    }
    let (conf, raw) = spec::parse_conf(stdin)?;
    spec::command_in(cmd, &conf.cni_version)?;
    match cmd {
        Command::Add => add(env, &conf, stdin).map(|o| Some(o.to_json(&conf.cni_version))),
        Command::Del => del(env, &conf, stdin).map(|()| None),
        Command::Check => check(env, &conf, stdin).map(|()| None),
        Command::Status => status(&conf).map(|()| None),
        Command::Gc => gc(env, &conf, &raw, stdin).map(|()| None),
        Command::Version => Ok(None),
    }
}

fn add(env: &Env, conf: &NetConf, stdin: &[u8]) -> Result<Outcome> {
    let (id, ifname, netns) = (env.container_id()?, env.ifname()?, env.netns()?);
    let ns = File::open(netns).map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::NotFound { Code::UnknownContainer } else { Code::Io };
        Error::with(code, format!("network namespace {netns}"), e)
    })?;
    let ipam_kind = conf.ipam.as_ref().map(ipam::kind).transpose()?;
    let mut c = vnetd(conf)?;
    // The pod's groups from its labels, before anything is made.
    let labelled = if conf.group_labels.is_empty() {
        Vec::new()
    } else {
        let pod = labels::pod_of(env.args.as_deref())?;
        let scope = (conf.group_scope == spec::GroupScope::Namespace).then(|| pod.parts().0.to_string());
        let answer = request(&mut c, &Request::PodLabels(pod))?;
        labels::groups(&answer, &conf.group_labels, scope.as_deref())?
    };
    // A second ADD for the same attachment starts from nothing.
    if let Some(old) = record::load(&conf.state_dir, &conf.name, id, ifname)? {
        undo(conf, env, &old, stdin)?;
    }
    let (name, tmp) = names(&conf.name, id, ifname);
    let mut rec = planned(conf, id, ifname, netns);
    record::store(&conf.state_dir, &conf.name, &rec)?;
    let made = (|| {
        let mac = match &rec.socket {
            Some(_) => vhost_mac(&name),
            None => veth::make(&name, &tmp, &ns, ifname, conf.mtu)?,
        };
        rec.mac = mac.clone();
        record::store(&conf.state_dir, &conf.name, &rec)?;
        let mut out = match (&ipam_kind, &conf.ipam) {
            (Some(k), Some(section)) if k == ipam::VNET => {
                ipam::vnet_add(&mut c, section, ipam::owner(&conf.name, id, ifname)?)?
            }
            (Some(k), _) => ipam::run(k, "ADD", &env.path, stdin, &[])?.unwrap_or_default(),
            _ => Outcome::default(),
        };
        if let (true, Some(section)) = (conf.is_default_gateway, &conf.ipam) {
            via_node(&mut out, gateway::ensure(conf, &mut c, section)?);
        }
        if rec.socket.is_none() && !addresses(&out).iter().any(std::net::IpAddr::is_ipv6) {
            // No IPv6 address: no IPv6 at all (its link-local address is
            // in no NetworkPolicy entry).
            veth::no_ipv6(&ns, ifname)?;
        }
        if rec.socket.is_none() && !out.ips.is_empty() {
            veth::configure(&ns, ifname, &out.ips, &out.routes)?;
        }
        request(&mut c, &attach_request(conf, &rec, &labelled)?)?;
        // (Recorded first: a failed ADD's undo withdraws what was declared.)
        rec.result = Some(out.clone());
        // Its addresses, which vnetd answers ARP and neighbour
        // solicitations for at the edge (and, in cluster mode, every host).
        for ip in addresses(&out) {
            let neigh = Request::neigh(ip, rec.mac.parse().map_err(|_| invalid_mac(&rec.mac))?, conf.network);
            request(&mut c, &neigh.map_err(invalid)?)?;
        }
        let sandbox = rec.socket.is_none().then(|| netns.to_string());
        let iface =
            Interface { name: ifname.into(), mac, mtu: conf.mtu, sandbox, socket_path: rec.socket.clone() };
        with_interface(&mut out, iface);
        rec.result = Some(out.clone());
        record::store(&conf.state_dir, &conf.name, &rec)?;
        Ok(out)
    })();
    match made {
        Ok(out) => Ok(out),
        Err(e) => {
            // Nothing of a failed ADD is left behind; the first error is
            // the one reported.
            let _ = undo(conf, env, &rec, stdin);
            Err(e)
        }
    }
}

/// The result's one interface, the container's, and every address tied to
/// it: what a chained plugin reads to find the container's addresses (the
/// reference `portmap` takes an address whose interface is `CNI_IFNAME`
/// with a `sandbox`, or names none).
fn with_interface(out: &mut Outcome, iface: Interface) {
    out.interfaces = vec![iface];
    for ip in &mut out.ips {
        ip.interface = Some(0);
    }
}

/// The pod's gateway and default route: its node's address `gw`.
fn via_node(out: &mut Outcome, gw: std::net::IpAddr) {
    for ip in &mut out.ips {
        let same = ip.address.split('/').next().and_then(|a| a.parse::<std::net::IpAddr>().ok());
        if same.is_some_and(|a| a.is_ipv4() == gw.is_ipv4()) {
            ip.gateway = Some(gw.to_string());
        }
    }
    let dst = if gw.is_ipv4() { "0.0.0.0/0" } else { "::/0" };
    out.routes.retain(|r| r.dst != dst);
    out.routes.push(spec::RouteConfig { dst: dst.into(), gw: Some(gw.to_string()) });
}

/// After a `DEL` or `GC`: the node's gateway goes with the last attachment.
fn release_gateway(conf: &NetConf) -> Result<()> {
    match (conf.is_default_gateway, &conf.ipam) {
        (true, Some(section)) => gateway::release(conf, vnetd(conf).ok().as_mut(), section),
        _ => Ok(()),
    }
}

/// The record of what `ADD` makes for `id`/`ifname` before anything is
/// made (and what `DEL` removes when no record was written).
fn planned(conf: &NetConf, id: &str, ifname: &str, netns: &str) -> Record {
    let (name, _) = names(&conf.name, id, ifname);
    Record {
        container_id: id.into(),
        ifname: ifname.into(),
        netns: netns.into(),
        socket: conf.vhost_user_dir.as_ref().map(|d| socket_path(d, &name)),
        name,
        mac: String::new(),
        result: None,
    }
}

/// Where attachment `name`'s vhost-user socket is, in `dir`.
fn socket_path(dir: &str, name: &str) -> String {
    format!("{}/{name}.sock", dir.trim_end_matches('/'))
}

/// The addresses of a result's `ips` (CIDR notation; others skipped).
fn addresses(out: &Outcome) -> Vec<std::net::IpAddr> {
    out.ips.iter().filter_map(|i| i.address.split('/').next()?.parse().ok()).collect()
}

fn invalid_mac(mac: &str) -> Error {
    Error::new(Code::InvalidConfig, format!("MAC `{}`", mac.escape_debug()))
}

/// The `attach` request for an attachment, of typed values.
fn attach_request(conf: &NetConf, r: &Record, labelled: &[Name]) -> Result<Request> {
    let name = Name::new(&r.name).map_err(invalid)?;
    let (dev, datapath) = match &r.socket {
        Some(s) => (Dev::VhostUser(SocketPath::new(s).map_err(invalid)?), Datapath::Auto),
        None => (Dev::Netdev(DevName::new(&r.name).map_err(invalid)?), spec::datapath(&conf.datapath)?),
    };
    let mut i = request::Interface::new(name, dev);
    i.mac = Some(r.mac.parse().map_err(|_| invalid_mac(&r.mac))?);
    i.datapath = datapath;
    i.network = conf.network;
    i.groups =
        conf.groups.iter().map(|g| Name::new(g)).collect::<std::result::Result<_, _>>().map_err(invalid)?;
    for g in labelled {
        if !i.groups.contains(g) {
            i.groups.push(g.clone());
        }
    }
    Request::attach(i).map_err(invalid)
}

/// Removes what `r` records: the declaration (if vnetd answers), the veth,
/// the addresses (the IPAM plugin's `DEL`), the record. Each step is
/// tried; the first error is returned.
fn undo(conf: &NetConf, env: &Env, r: &Record, stdin: &[u8]) -> Result<()> {
    ours(conf, r)?;
    let mut first = None;
    let builtin = conf.ipam.as_ref().is_some_and(|i| ipam::kind(i).is_ok_and(|k| k == ipam::VNET));
    // vnetd not answering is no error: what it held goes with it (a
    // restarted vnetd has no `attach`ed interfaces; an address stays until
    // the host's lease ends).
    if let Ok(mut c) = vnetd(conf) {
        // Its addresses are no longer answered for (one never declared, as
        // after a failed ADD, is no error): only those vnetd answers with
        // the attachment's MAC while no other interface holds that MAC,
        // since a record's `result` and `mac` are a file's word, and
        // another pod's `neigh` lines are what keep its source guard on.
        let config = request(&mut c, &Request::Show { what: ShowWhat::Config, json: false });
        let theirs = config.map(|t| answered_by(&t, &r.name, &r.mac, conf.network)).unwrap_or_default();
        for ip in r.result.iter().flat_map(addresses).filter(|ip| theirs.contains(ip)) {
            let _ = request(&mut c, &Request::DeleteNeigh { ip, network: conf.network });
        }
        let detach = Name::new(&r.name).map(Request::Detach).map_err(invalid);
        if let Err(e) = detach.and_then(|d| request(&mut c, &d)) {
            first.get_or_insert(e);
        }
        if builtin {
            let owner = ipam::owner(&conf.name, &r.container_id, &r.ifname);
            if let Err(e) = owner.and_then(|o| ipam::vnet_del(&mut c, o)) {
                first.get_or_insert(e);
            }
        }
    }
    if r.socket.is_none() {
        if let Err(e) = veth::delete(&r.name) {
            first.get_or_insert(e);
        }
    }
    if let Some(ipam) = conf.ipam.as_ref().filter(|_| !builtin) {
        let del = ipam::kind(ipam).and_then(|k| {
            // The IPAM plugin's DEL is the attachment's: GC removes
            // attachments other than the environment's.
            let vars = [("CNI_CONTAINERID", r.container_id.as_str()), ("CNI_IFNAME", r.ifname.as_str())];
            ipam::run(&k, "DEL", &env.path, stdin, &vars)
        });
        if let Err(e) = del {
            first.get_or_insert(e);
        }
    }
    if let Err(e) = record::remove(&conf.state_dir, &conf.name, &r.container_id, &r.ifname) {
        first.get_or_insert(e);
    }
    first.map_or(Ok(()), Err)
}

/// Whether `r` names what this plugin makes for its container and
/// interface (the device and vhost-user socket [`planned`] derives): a
/// record is a file in `stateDir`, and whoever can write there must not
/// make `DEL` or `GC` detach or delete a device it did not make (`eth0`,
/// another network's interface). A record that does not is refused whole,
/// nothing removed.
fn ours(conf: &NetConf, r: &Record) -> Result<()> {
    let want = planned(conf, &r.container_id, &r.ifname, &r.netns);
    if r.name == want.name && (r.socket.is_none() || r.socket == want.socket) {
        return Ok(());
    }
    Err(Error::new(
        Code::InvalidConfig,
        format!(
            "the record of container {:?} interface {:?} names device {:?} (socket {:?}), not {:?}, \
             which this plugin makes for it: nothing removed",
            r.container_id, r.ifname, r.name, r.socket, want.name
        ),
    ))
}

/// The addresses of `network` that vnetd's configuration `config` (`show
/// config`) answers with `mac`, the MAC of attachment `name`: none when
/// another interface than `name` holds that MAC (a live pod's), when `mac`
/// is no MAC, or when the text does not parse. (The attachment's own
/// interface may be gone already: moved, or detached by an earlier `DEL`.)
fn answered_by(config: &str, name: &str, mac: &str, network: u32) -> Vec<std::net::IpAddr> {
    let Ok(mac) = mac.parse::<vnet_wire::MacAddr>() else { return Vec::new() };
    let Ok(state) =
        vnet_control::parse(config).and_then(|cmds| vnet_control::State::default().apply_all(&cmds))
    else {
        return Vec::new();
    };
    if state.interfaces.values().any(|i| i.mac == Some(mac) && i.name != name) {
        return Vec::new();
    }
    state
        .neighbors
        .0
        .iter()
        .filter(|((n, _), m)| *n == network && **m == mac)
        .map(|((_, ip), _)| *ip)
        .collect()
}

/// `DEL`: idempotent; a missing netns, interface, record or vnetd is not
/// an error. Without a record (ADD never ran, or ran elsewhere) the names
/// are derived again, so a half-made attachment still goes.
fn del(env: &Env, conf: &NetConf, stdin: &[u8]) -> Result<()> {
    let (id, ifname) = (env.container_id()?, env.ifname()?);
    let r = match record::load(&conf.state_dir, &conf.name, id, ifname)? {
        // A record filed under this attachment but naming another is no
        // record of it.
        Some(r) if r.container_id == id && r.ifname == ifname => r,
        _ => planned(conf, id, ifname, env.netns.as_deref().unwrap_or_default()),
    };
    undo(conf, env, &r, stdin)?;
    release_gateway(conf)
}

/// `CHECK`: the record, the veth's host end, vnetd's declaration with the
/// container's MAC, the container's interface with that MAC and the
/// addresses of `prevResult`, and the IPAM plugin's own `CHECK`.
fn check(env: &Env, conf: &NetConf, stdin: &[u8]) -> Result<()> {
    let (id, ifname, netns) = (env.container_id()?, env.ifname()?, env.netns()?);
    let not = |what: String| Error::new(Code::NotAsMade, what);
    let r = record::load(&conf.state_dir, &conf.name, id, ifname)?
        .ok_or_else(|| not(format!("no attachment {id}/{ifname} was made on network {}", conf.name)))?;
    let prev = match &conf.prev_result {
        Some(p) => Outcome::from_json(p)?,
        None => return Err(Error::new(Code::InvalidConfig, "CHECK needs prevResult")),
    };
    let mut c = vnetd(conf)?;
    let body = request(&mut c, &Request::Show { what: ShowWhat::Interfaces, json: true })?;
    let v: Value =
        serde_json::from_str(&body).map_err(|e| Error::with(Code::Decode, "vnetd's interfaces", e))?;
    let declared = v["interfaces"].as_array().and_then(|a| a.iter().find(|i| i["name"] == r.name.as_str()));
    match declared {
        None => return Err(not(format!("vnetd has no interface {}", r.name))),
        Some(i) if i["mac"] != r.mac.as_str() => {
            return Err(not(format!("vnetd's {} has MAC {}, not {}", r.name, i["mac"], r.mac)))
        }
        Some(_) => {}
    }
    if r.socket.is_none() {
        if !veth::exists(&r.name)? {
            return Err(not(format!("the veth {} is gone", r.name)));
        }
        // Made by an older plugin, its host end may still answer ARP for
        // the node (`arp_ignore` 0): kept off the node's stack again (as
        // vnetd does for each it attaches).
        veth::quiet(&r.name)?;
        let ns = File::open(netns)
            .map_err(|e| Error::with(Code::UnknownContainer, format!("network namespace {netns}"), e))?;
        let (mac, addrs) = veth::inspect(&ns, ifname)?
            .ok_or_else(|| not(format!("the container has no interface {ifname}")))?;
        if mac != r.mac {
            return Err(not(format!("{ifname} has MAC {mac}, not {}", r.mac)));
        }
        for ip in &prev.ips {
            if !addrs.contains(&ip.address) {
                return Err(not(format!("{ifname} lacks {}", ip.address)));
            }
        }
        // And IPv6 off again in a pod given no IPv6 address (one made by an
        // older plugin kept it on).
        if !addresses(&prev).iter().any(std::net::IpAddr::is_ipv6) {
            veth::no_ipv6(&ns, ifname)?;
        }
    }
    if let Some(ipam) = &conf.ipam {
        let k = ipam::kind(ipam)?;
        if k != ipam::VNET {
            ipam::run(&k, "CHECK", &env.path, stdin, &[])?;
        }
    }
    Ok(())
}

/// `STATUS`: ready when vnetd answers.
fn status(conf: &NetConf) -> Result<()> {
    let mut c = vnetd(conf).map_err(|e| Error { code: Code::NotAvailable as u32, ..e })?;
    request(&mut c, &Request::Show { what: ShowWhat::Stats, json: false })
        .map(drop)
        .map_err(|e| Error { code: Code::NotAvailable as u32, ..e })
}

/// `GC`: every recorded attachment of the network that is not in
/// `cni.dev/valid-attachments` is removed as `DEL` would.
fn gc(env: &Env, conf: &NetConf, raw: &Value, stdin: &[u8]) -> Result<()> {
    let valid: Vec<(String, String)> = raw
        .get("cni.dev/valid-attachments")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|x| {
                    let s = |k: &str| x.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                    (s("containerID"), s("ifname"))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut first = None;
    for r in record::all(&conf.state_dir, &conf.name) {
        if !valid.iter().any(|(i, n)| *i == r.container_id && *n == r.ifname) {
            if let Err(e) = undo(conf, env, &r, stdin) {
                first.get_or_insert(e);
            }
        }
    }
    if let Err(e) = release_gateway(conf) {
        first.get_or_insert(e);
    }
    first.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The result a chained `portmap` (hostPort) reads: it DNATs to an
    /// address of `ips` whose `interface` names an interface called
    /// `CNI_IFNAME` with a `sandbox` (plugins/meta/portmap's parseConfig),
    /// in the form of the conflist's version.
    #[test]
    fn the_result_gives_a_chained_portmap_the_containers_address() {
        let mut out = Outcome::from_json(&serde_json::json!({
            "ips": [{"address": "10.244.0.7/16", "gateway": "10.244.0.1"}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.0.1"}],
        }))
        .unwrap();
        let iface = Interface {
            name: "eth0".into(),
            mac: "02:00:00:00:00:07".into(),
            mtu: Some(1450),
            sandbox: Some("/var/run/netns/cni-1".into()),
            socket_path: None,
        };
        with_interface(&mut out, iface);
        for version in ["1.1.0", "1.0.0", "0.4.0"] {
            let v = out.to_json(version);
            let ip = &v["ips"][0];
            let i = ip["interface"].as_u64().expect("the address names its interface") as usize;
            let intf = &v["interfaces"][i];
            assert_eq!(
                (intf["name"].as_str(), intf["sandbox"].as_str()),
                (Some("eth0"), Some("/var/run/netns/cni-1"))
            );
            assert_eq!(ip["address"], "10.244.0.7/16", "{version}: {v}");
        }
    }

    #[test]
    fn names_fit_a_device_and_differ_per_attachment() {
        let (a, p) = names("net", "abc", "eth0");
        assert!(a.len() <= 15 && a.starts_with("vc") && p.starts_with("vp"));
        assert_ne!(names("net", "abc", "eth1").0, a);
        assert_ne!(names("net2", "abc", "eth0").0, a);
        assert_eq!(names("net", "abc", "eth0").0, a);
    }

    #[test]
    fn the_networks_groups_go_with_each_attachment_as_typed_words() {
        let conf = br#"{"cniVersion":"1.0.0","name":"n","type":"vnet-cni","groups":["web","tier-1"]}"#;
        let (conf, _) = spec::parse_conf(conf).unwrap();
        let r = Record { name: "vc0123456789".into(), mac: "52:54:00:00:00:07".into(), ..Record::default() };
        let line = attach_request(&conf, &r, &[]).unwrap().line();
        assert!(line.ends_with("group web group tier-1"), "{line}");
        let bad =
            br#"{"cniVersion":"1.0.0","name":"n","type":"vnet-cni","groups":["web\nlink x udp 1.2.3.4:9"]}"#;
        let e = spec::parse_conf(bad).unwrap_err();
        assert_eq!(e.code, 7, "{e}");
        assert!(!e.to_string().contains('\n'), "quoted escaped: {e}");
    }

    #[test]
    fn a_record_naming_a_device_the_plugin_did_not_make_removes_nothing() {
        let conf = br#"{"cniVersion":"1.0.0","name":"n","type":"vnet-cni"}"#;
        let (conf, _) = spec::parse_conf(conf).unwrap();
        let made = planned(&conf, "abc", "eth0", "/run/netns/x");
        assert!(ours(&conf, &made).is_ok(), "the plugin's own record");
        for forged in [
            Record { name: "eth0".into(), ..made.clone() },
            Record { name: names("other", "abc", "eth0").0, ..made.clone() },
            Record { socket: Some("/etc/passwd".into()), ..made.clone() },
        ] {
            let e = ours(&conf, &forged).unwrap_err();
            assert!(e.msg.contains("nothing removed"), "{e}");
            // undo refuses it before any step (no vnetd, veth or file is touched).
            let e = undo(&conf, &Env::default(), &forged, b"").unwrap_err();
            assert!(e.msg.contains("nothing removed"), "{e}");
        }
    }

    /// `DEL` withdraws only the addresses vnetd answers with the
    /// attachment's own interface's MAC: a forged record whose `result`
    /// names another pod's address does not take that pod's `neigh` line
    /// (and with it its source guard) away.
    #[test]
    fn del_withdraws_only_the_addresses_answered_with_its_interfaces_mac() {
        let config = "interface vc01 netdev vc01 mac 02:00:00:00:00:01\n\
                      interface vc02 netdev vc02 mac 02:00:00:00:00:02\n\
                      neigh 10.88.0.1 02:00:00:00:00:01\n\
                      neigh 10.88.0.2 02:00:00:00:00:02\n\
                      neigh 10.88.0.3 02:00:00:00:00:01 network 7\n";
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let (m1, m2) = ("02:00:00:00:00:01", "02:00:00:00:00:02");
        assert_eq!(answered_by(config, "vc01", m1, 0), vec![ip("10.88.0.1")]);
        assert_eq!(answered_by(config, "vc01", m1, 7), vec![ip("10.88.0.3")]);
        assert_eq!(answered_by(config, "vc02", m2, 0), vec![ip("10.88.0.2")]);
        // A forged record naming vc02's MAC (and its address) under another
        // attachment's name: vc02 holds that MAC, so nothing.
        assert!(answered_by(config, "vc09", m2, 0).is_empty());
        // The attachment's interface gone (moved, or detached already): its
        // MAC's lines are its own to withdraw.
        let moved = "neigh 10.88.0.1 02:00:00:00:00:01\n";
        assert_eq!(answered_by(moved, "vc01", m1, 0), vec![ip("10.88.0.1")]);
        assert!(answered_by(config, "vc01", "not a mac", 0).is_empty());
        assert!(
            answered_by("nonsense here\n", "vc01", m1, 0).is_empty(),
            "text that does not parse: nothing"
        );
    }

    #[test]
    fn the_environment_is_checked_as_the_spec_says() {
        let e = Env { ifname: Some("a/b".into()), ..Env::default() };
        assert_eq!(e.ifname().unwrap_err().code, 4);
        let e = Env { container_id: Some("x y".into()), ..Env::default() };
        assert_eq!(e.container_id().unwrap_err().code, 4);
        assert_eq!(Env::default().netns().unwrap_err().code, 4);
        let e = Env { ifname: Some("eth0".into()), ..Env::default() };
        assert_eq!(e.ifname().unwrap(), "eth0");
    }

    #[test]
    fn vnetd_not_running_is_try_again_later_for_add_and_not_available_for_status() {
        let dir = std::env::temp_dir().join(format!("vnet-cni-test-{}", std::process::id()));
        let conf = format!(
            r#"{{"cniVersion":"1.1.0","name":"n","type":"vnet-cni","control":"unix:{}/none.sock","stateDir":"{}"}}"#,
            dir.display(),
            dir.display()
        );
        let e = run(Command::Status, &Env::default(), conf.as_bytes()).unwrap_err();
        assert_eq!(e.code, 50);
        let env = Env {
            container_id: Some("c1".into()),
            ifname: Some("eth0".into()),
            netns: Some("/proc/self/ns/net".into()),
            ..Env::default()
        };
        let e = run(Command::Add, &env, conf.as_bytes()).unwrap_err();
        assert_eq!(e.code, 11, "{e}");
        // DEL with vnetd gone, no record, no veth: no error.
        run(Command::Del, &env, conf.as_bytes()).unwrap();
        assert!(!dir.join("n").exists() || record::all(dir.to_str().unwrap(), "n").is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
