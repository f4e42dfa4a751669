//! A host's vnetd config, written from the control crate's types: the lab
//! builds `Command`s, applies them to a `State` (so a config the lab writes
//! is checked as vnetd will check it) and writes `State::to_config()`.
//! Palacios hosts keep their link and route lines as Palacios text: that
//! they parse verbatim is what those hosts test.

use crate::{Error, Host, Links, Result, Spec, LAN_MAC};
use std::fmt::Write as _;
use std::net::Ipv6Addr;
use std::net::SocketAddr;
use std::path::Path;
use vnet_control::ast::{From, IfaceKind, LinkRef, Ref, Target};
use vnet_control::Transport;
use vnet_control::{Command, Datapath, Located, Mode, State, TlsFiles};
use vnet_core::MacSpec;
use vnet_wire::MacAddr;

/// The vnetd config of host `h`: interfaces in the superset (always), links
/// and routes in the superset or, for Palacios hosts, as Palacios lines.
pub fn config_for(s: &Spec, hosts: &[Host], h: usize) -> Result<String> {
    let palacios = s.palacios_hosts.contains(&h);
    let host = &hosts[h];
    let (mode, datapath) = modes(s)?;
    let mac = |m: &str| m.parse::<MacAddr>().map_err(|_| Error::Other(format!("a lab MAC `{m}`")));
    let bcast = MacSpec::Addr(MacAddr::BROADCAST);
    let to_link = |name: String| Target::Link(Ref { pos: Default::default(), by: LinkRef::Name(name) });
    let route = |dst: MacSpec, to: Target| Command::Route { src: MacSpec::Any, dst, to, from: From::Any };

    // Every address, IPv4 and IPv6, on one dual-stack socket.
    let listen_ip = if s.listen_any.contains(&h) { Ipv6Addr::UNSPECIFIED.into() } else { host.underlay_ip };
    let mut cmds = vec![Command::Listen { addr: SocketAddr::new(listen_ip, 9000), mode }];
    let vxlan_to = |k: usize| s.links == Links::Vxlan || s.vteps.contains(&k);
    if s.links == Links::Tls {
        let d = host.config.parent().unwrap_or(Path::new("/"));
        let f = |ext: &str| d.join(format!("h{h}{ext}")).display().to_string();
        cmds.push(Command::Tls(TlsFiles { cert: f(".pem"), key: f(".key"), ca: f("-ca.pem") }));
    }
    if (0..hosts.len()).any(|k| k != h && vxlan_to(k)) {
        cmds.push(Command::ListenVxlan(SocketAddr::new(host.underlay_ip, vnet_wire::vxlan::IANA_PORT)));
    }
    cmds.extend(interfaces(s, host, mode, datapath)?);
    let mut palacios_text = String::new();
    // Cluster mode: the interfaces are all; etcd brings links and routes.
    let others = if s.cluster.is_some() { &[][..] } else { hosts };
    for (k, other) in others.iter().enumerate().filter(|&(k, _)| k != h) {
        let ip = other.underlay_ip;
        if palacios {
            let b = "ff:ff:ff:ff:ff:ff";
            let _ = writeln!(palacios_text, "add {ip} 9000 udp");
            let _ = writeln!(palacios_text, "add any {b} edge {ip} any");
            for vm in &other.vms {
                let _ = writeln!(palacios_text, "add any {} edge {ip} any", vm.mac);
            }
            continue;
        }
        let mut transport =
            s.links.transport(s, other.underlay_ip, other.key.as_ref().map(|(_, k)| *k), k, vxlan_to(k));
        // Between two hosts behind NATs: through host 2 while no direct path works.
        if let Transport::Udp { relay, nat: true, .. } = &mut transport {
            if h != 2 && k != 2 {
                *relay = hosts.get(2).and_then(|r| r.key.as_ref()).map(|(_, key)| *key);
            }
        }
        cmds.push(Command::Link { name: Some(format!("h{k}")), transport, mtu: s.underlay_mtu });
        cmds.push(route(bcast, to_link(format!("h{k}"))));
        for vm in &other.vms {
            cmds.push(route(MacSpec::Addr(mac(&vm.mac)?), to_link(format!("h{k}"))));
        }
    }
    for (v, vm) in host.vms.iter().enumerate().filter(|_| s.cluster.is_none()) {
        if palacios {
            let _ = writeln!(palacios_text, "add any ff:ff:ff:ff:ff:ff interface {} any", vm.mac);
            let _ = writeln!(palacios_text, "add any {} interface {} any", vm.mac, vm.mac);
            continue;
        }
        let me = || {
            Target::Interface(Ref {
                pos: Default::default(),
                by: vnet_control::ast::IfaceRef::Name(format!("vm{v}")),
            })
        };
        cmds.push(route(bcast, me()));
        cmds.push(route(MacSpec::Addr(mac(&vm.mac)?), me()));
    }
    let lan = MacSpec::Addr(mac(LAN_MAC)?);
    match s.lan_host {
        Some(lh) if lh == h => {
            let dev = vnet_control::IfName::new("dl0").ok_or_else(|| Error::Other("dl0".into()))?;
            cmds.push(Command::Link {
                name: Some("lan".into()),
                transport: Transport::Direct { dev },
                mtu: s.vm_mtu,
            });
            cmds.push(route(bcast, to_link("lan".into())));
            cmds.push(route(lan, to_link("lan".into())));
        }
        Some(lh) if lh < hosts.len() => cmds.push(route(lan, to_link(format!("h{lh}")))),
        _ => {}
    }
    let located: Vec<Located<Command>> =
        cmds.into_iter().map(|item| Located { pos: Default::default(), item }).collect();
    let state = State::default()
        .apply_all(&located)
        .map_err(|e| Error::Other(format!("the lab's config for host {h} is not valid: {e}")))?;
    Ok(format!("# vnet-lab host {h}\n{}{palacios_text}", state.to_config()))
}

/// The interfaces of `host`'s VMs: a vhost-user socket, a netdev or a TAP.
fn interfaces(s: &Spec, host: &Host, mode: Option<Mode>, datapath: Datapath) -> Result<Vec<Command>> {
    let mac = |m: &str| m.parse::<MacAddr>().map_err(|_| Error::Other(format!("a lab MAC `{m}`")));
    let mut cmds = Vec::new();
    for (v, vm) in host.vms.iter().enumerate() {
        let (kind, dev, netns, queues, dp) = match (&vm.host_dev, &vm.vhost) {
            (_, Some(sock)) => {
                // Always the user path's; said so when the spec names a path.
                let dp = if datapath == Datapath::Auto { Datapath::Auto } else { Datapath::User };
                (IfaceKind::VhostUser, sock.display().to_string(), None, s.qemu_queues.max(1), dp)
            }
            (Some(hd), None) => (IfaceKind::Netdev, hd.clone(), None, 1, datapath),
            (None, None) => {
                (IfaceKind::Tap, vm.dev.clone(), Some(vm.ns.clone()), s.tap_queues.max(1), datapath)
            }
        };
        cmds.push(Command::Interface {
            name: format!("vm{v}"),
            kind,
            dev,
            mac: Some(mac(&vm.mac)?),
            mtu: None,
            netns,
            mode: mode.unwrap_or_default(),
            queues,
            offload: true,
            datapath: dp,
            broadcast_limit: vnet_control::DEFAULT_BROADCAST_LIMIT,
            network: 0,
            standby: false,
            groups: Vec::new(),
            addresses: if s.addresses { vec![std::net::IpAddr::V4(vm.ip)] } else { Vec::new() },
        });
    }
    Ok(cmds)
}

/// The lab's dispatch mode (none: vnetd's default) and interfaces' datapath.
pub(crate) fn modes(s: &Spec) -> Result<(Option<Mode>, Datapath)> {
    let mode = match s.dispatch.as_deref() {
        None => None,
        Some("notify") => Some(Mode::Notify),
        Some("poll") => Some(Mode::Poll),
        Some("adaptive") => Some(Mode::Adaptive),
        Some(m) => {
            return Err(Error::Other(format!("dispatch mode `{m}`: expected notify, poll or adaptive")))
        }
    };
    let datapath = match s.datapath.as_deref() {
        None | Some("auto") => Datapath::Auto,
        Some("user") => Datapath::User,
        Some("kernel") => Datapath::Kernel,
        Some(d) => return Err(Error::Other(format!("datapath `{d}`: expected user, kernel or auto"))),
    };
    Ok((mode, datapath))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{underlay_ip, vm_ip, vm_mac, Cluster, Vm};
    use std::path::PathBuf;

    fn hosts(n: usize) -> Vec<Host> {
        (0..n)
            .map(|h| Host {
                ns: format!("t-h{h}"),
                underlay_dev: format!("u{h}"),
                underlay_ip: underlay_ip(h, false),
                config: PathBuf::from(format!("/tmp/t/h{h}.conf")),
                control: PathBuf::from(format!("/tmp/t/h{h}.sock")),
                log: PathBuf::from(format!("/tmp/t/h{h}.log")),
                vms: vec![Vm {
                    ns: format!("t-h{h}v0"),
                    dev: "vt0".into(),
                    host_dev: None,
                    mac: vm_mac(h, 0),
                    ip: vm_ip(h, 0),
                    console: None,
                    vhost: None,
                }],
                key: None,
                vnetd: None,
            })
            .collect()
    }

    fn parse(text: &str) -> State {
        State::default().apply_all(&vnet_control::parse(text).unwrap()).unwrap()
    }

    #[test]
    fn configs_written_from_types_parse_back_to_what_was_meant() {
        let s = Spec { hosts: 3, vteps: vec![2], lan_host: Some(0), links: Links::Tls, ..Spec::default() };
        let hs = hosts(3);
        let text = config_for(&s, &hs, 0).unwrap();
        let st = parse(&text);
        let kinds: Vec<&str> = st.links.values().map(|l| l.transport.word()).collect();
        assert_eq!(kinds, ["tcp", "vxlan", "direct"], "{text}");
        assert!(st.tls.is_some() && st.listen_vxlan.is_some(), "{text}");
        // Route 1 sends host 1's VM to link h1, as the lab tests expect.
        assert_eq!(st.routes[&1].to, vnet_core::Port::Link(0), "{text}");
        // Host 1 routes the LAN machine to host 0.
        let t1 = config_for(&s, &hs, 1).unwrap();
        assert!(t1.contains(&format!("route any {LAN_MAC} -> link h0")), "{t1}");
        // Palacios hosts keep Palacios lines.
        let p = Spec { palacios_hosts: vec![1], ..Spec::default() };
        let t = config_for(&p, &hosts(2), 1).unwrap();
        assert!(t.contains("add 10.77.0.1 9000 udp") && t.contains("interface vm0 tap vt0"), "{t}");
        parse(&t);
        // Cluster mode: interfaces only.
        let c = Spec { hosts: 3, cluster: Some(Cluster::default()), ..Spec::default() };
        let st = parse(&config_for(&c, &hs, 0).unwrap());
        assert!(st.links.is_empty() && st.routes.is_empty() && st.interfaces.len() == 1);
        let bad = Spec { dispatch: Some("fast".into()), ..Spec::default() };
        assert!(config_for(&bad, &hosts(2), 0).is_err());
    }
}
