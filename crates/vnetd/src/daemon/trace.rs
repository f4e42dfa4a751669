//! `trace from SRC to IP ...`: the frame a user describes, resolved to
//! MACs, addresses and the port it comes in by, run through the engine's
//! dry run ([`vnet_engine::trace`]: the data path's own decisions, nothing
//! sent) on the running plane; then what the daemon alone knows (which
//! data path each port is on, and why), and the far host's part: computed
//! from the store's view in cluster mode, else the line to ask it.

use super::Daemon;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::net::IpAddr;
use vnet_control::trace::{Source, TraceHex, TraceQuery, L4, MIN_SIZE};
use vnet_core::{MacSpec, Port};
use vnet_engine::trace::{self, Probe, Proto, Stage, Step, Trace, Verdict};
use vnet_engine::Plane;
use vnet_wire::classify::L3;
use vnet_wire::{EthernetFrame, MacAddr};

/// Why a trace could not be made (the frame is not described well enough).
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("no interface `{0}` here")]
    NoInterface(String),
    #[error("interface {0} has no `mac`: trace from its VM's MAC instead")]
    NoMac(String),
    #[error(
        "{0}: no interface's `addresses`, `neigh` line or claim here names it: say which MAC it is \
         (`trace from MAC ...`)"
    )]
    UnknownSource(IpAddr),
    #[error(
        "{0} is neither a local VM's nor routed to a link here: trace from a local VM, or on the host \
         whose link it comes by"
    )]
    Nowhere(MacAddr),
    #[error("the source's address is unknown here: give it (`trace from ... ip ADDRESS`)")]
    NoSourceIp,
    #[error(
        "{0}: no `neigh` line, claim or local interface here names its MAC, so the VM's ARP request \
         would be flooded: give the MAC (`to {0} mac MAC`)"
    )]
    UnknownDestination(IpAddr),
    #[error("the source's and the destination's addresses are of two families")]
    Families,
    #[error("not an Ethernet frame from an interface or a MAC")]
    NotAFrame,
}

/// The far host's part of a trace.
#[derive(Debug, serde::Serialize)]
struct Far {
    /// The peer's address, or in cluster mode its host name.
    host: String,
    link: String,
    /// The network id this host's datagrams on the link say.
    network: u32,
    /// The line that asks the far host's vnetd for its part.
    ask: String,
    /// Cluster mode: what the steps were computed from.
    #[serde(skip_serializing_if = "Option::is_none")]
    computed_from: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    steps: Option<Vec<Step>>,
}

/// The frame resolved: where it comes in, its ends.
struct Resolved {
    ingress: Port,
    macs: (MacAddr, MacAddr),
    /// The addresses (none for a `trace hex` frame that is not IP).
    ips: Option<(IpAddr, IpAddr)>,
    network: u32,
}

/// What a trace runs besides the plane: the frame, the question before it,
/// the network id a datagram says, the frame in words, the far host's line.
struct Run<'a> {
    frame: &'a [u8],
    question: Option<&'a [u8]>,
    said: Option<u32>,
    /// What the frame carries, in words (`udp port 53`).
    what: String,
    /// The line that asks the far host, given the link's network id.
    ask: &'a dyn Fn(u32) -> String,
    json: bool,
}

impl Daemon {
    /// `trace ...`: the reply's body, text or JSON.
    pub fn trace(&self, q: &TraceQuery) -> Result<String, TraceError> {
        let plane = self.shared.plane.load();
        let r = self.resolve(&plane, q)?;
        let proto = match q.l4 {
            L4::Icmp => Proto::Icmp,
            L4::Tcp(p) => Proto::Tcp(p),
            L4::Udp(p) => Proto::Udp(p),
        };
        let size = q.size.unwrap_or(MIN_SIZE) as usize;
        let ips = r.ips.ok_or(TraceError::Families)?;
        let frame = trace::probe_frame(r.macs, ips, proto, size).ok_or(TraceError::Families)?;
        // The question the VM asks first: an ARP request, a neighbour solicitation.
        let question = match ips {
            _ if r.ingress.is_link() => None,
            (IpAddr::V4(s), IpAddr::V4(d)) => Some(trace::arp_request(r.macs.0, s, d)),
            (IpAddr::V6(s), IpAddr::V6(d)) => Some(vnet_wire::neigh::solicitation(r.macs.0, s, d).to_vec()),
            _ => None,
        };
        let ask = |network: u32| {
            let far = TraceQuery {
                from: Source::Mac(r.macs.0),
                from_mac: None,
                from_ip: Some(ips.0),
                to: ips.1,
                to_mac: Some(r.macs.1),
                l4: q.l4,
                size: Some(frame.len().max(MIN_SIZE as usize) as u32),
                network: Some(network),
                json: false,
            };
            far.to_string()
        };
        let run = Run {
            frame: &frame,
            question: question.as_deref(),
            said: q.network.filter(|_| r.ingress.is_link()),
            what: proto_words(q.l4),
            ask: &ask,
            json: q.json,
        };
        Ok(self.run(&plane, &r, run))
    }

    /// `trace hex ...`: the frame as given, from where it comes in (the
    /// interface named, else its source MAC's interface or link).
    pub fn trace_hex(&self, q: &TraceHex) -> Result<String, TraceError> {
        let plane = self.shared.plane.load();
        let eth = EthernetFrame::new_checked(&q.frame[..]).map_err(|_| TraceError::NotAFrame)?;
        let (src, dst) = (eth.src(), eth.dst());
        let local = match &q.via {
            Some(Source::Interface(n)) => {
                Some(self.state.iface_by_name(n).ok_or_else(|| TraceError::NoInterface(n.clone()))?)
            }
            Some(Source::Mac(m)) => self.state.interfaces.values().find(|i| i.mac == Some(*m)),
            Some(Source::Ip(_)) => return Err(TraceError::NotAFrame),
            None => self.state.interfaces.values().find(|i| i.mac == Some(src)),
        };
        let by = match &q.via {
            Some(Source::Mac(m)) => *m,
            _ => src,
        };
        let (ingress, network) = self.ingress(&plane, by, local)?;
        let facts = vnet_wire::classify::classify(&q.frame);
        let (ips, what) = match facts.map(|f| (f.ether, f.l3)) {
            Ok((_, L3::Ip(ip))) => (Some((ip.src, ip.dst)), ip_words(&ip)),
            Ok((_, L3::Arp { target, .. })) => (None, format!("arp for {target}")),
            Ok((ether, L3::Other)) => (None, format!("ethertype 0x{ether:04x}")),
            Err(e) => (None, format!("unclassifiable ({})", e.0)),
        };
        let r = Resolved { ingress, macs: (src, dst), ips, network };
        let ask = |network: u32| {
            TraceHex { frame: q.frame.clone(), via: None, network: Some(network), json: false }.to_string()
        };
        let run = Run {
            frame: &q.frame,
            question: None,
            said: q.network.filter(|_| ingress.is_link()),
            what,
            ask: &ask,
            json: q.json,
        };
        Ok(self.run(&plane, &r, run))
    }

    /// The dry run of a resolved frame, then the data paths and the far
    /// host's part: the reply's body.
    fn run(&self, plane: &Plane, r: &Resolved, run: Run<'_>) -> String {
        let probe = Probe {
            ingress: r.ingress,
            frame: run.frame,
            question: run.question,
            said_network: run.said,
            now_ns: self.shared.now_ns(),
        };
        let mut t = trace::trace(plane, probe);
        self.datapaths(plane, r, run.frame.len(), &mut t);
        let far = self.far(plane, r, run.ask, run.frame, &t);
        let (src, dst) =
            r.ips.map_or((String::new(), String::new()), |(s, d)| (s.to_string(), d.to_string()));
        let head = json!({
            "src_mac": r.macs.0.to_string(), "dst_mac": r.macs.1.to_string(),
            "src": src, "dst": dst,
            "proto": run.what, "bytes": run.frame.len(), "network": r.network,
        });
        let exits: Vec<String> = t.exits.iter().map(|p| trace::port_name(plane, *p)).collect();
        let verdict = verdict_of(&t);
        if run.json {
            let v =
                json!({ "frame": head, "steps": t.steps, "verdict": verdict, "exits": exits, "far": far });
            return v.to_string();
        }
        text(&head, &t, &verdict, &far)
    }

    /// The port the frame comes in by, its MACs, addresses and network.
    fn resolve(&self, plane: &Plane, q: &TraceQuery) -> Result<Resolved, TraceError> {
        let st = &self.state;
        let by_mac = |m: MacAddr| st.interfaces.values().find(|i| i.mac == Some(m));
        let (src_mac, local) = match &q.from {
            Source::Interface(n) => {
                let i = st.iface_by_name(n).ok_or_else(|| TraceError::NoInterface(n.clone()))?;
                (i.mac.ok_or_else(|| TraceError::NoMac(n.clone()))?, Some(i))
            }
            Source::Mac(m) => (*m, by_mac(*m)),
            Source::Ip(a) => {
                let m = self.mac_of(plane, q.network, *a).ok_or(TraceError::UnknownSource(*a))?;
                (m, by_mac(m))
            }
        };
        let (ingress, network) = self.ingress(plane, src_mac, local)?;
        let network = q.network.filter(|_| local.is_some()).unwrap_or(network);
        // A spoofed source: the interface's frame, from another MAC.
        let src_mac = q.from_mac.filter(|_| local.is_some()).unwrap_or(src_mac);
        let src_ip = match (&q.from, q.from_ip.as_ref()) {
            (_, Some(a)) | (Source::Ip(a), None) => *a,
            _ => {
                let own =
                    local.iter().flat_map(|i| i.addresses.iter()).find(|a| a.is_ipv4() == q.to.is_ipv4());
                let named = || {
                    let n = plane.neighbors.iter();
                    n.filter(|((net, a), m)| {
                        **m == src_mac && *net == network && a.is_ipv4() == q.to.is_ipv4()
                    })
                    .map(|((_, a), _)| *a)
                    .next()
                };
                own.copied().or_else(named).ok_or(TraceError::NoSourceIp)?
            }
        };
        let dst_mac = match q.to_mac {
            Some(m) => m,
            None => self.mac_of(plane, Some(network), q.to).ok_or(TraceError::UnknownDestination(q.to))?,
        };
        Ok(Resolved { ingress, macs: (src_mac, dst_mac), ips: Some((src_ip, q.to)), network })
    }

    /// Where a frame from `mac` comes in: the local interface `local`, or
    /// from another host, by the link this host's routes send `mac` to.
    fn ingress(
        &self,
        plane: &Plane,
        mac: MacAddr,
        local: Option<&vnet_control::InterfaceDef>,
    ) -> Result<(Port, u32), TraceError> {
        if let Some(i) = local {
            return Ok((Port::Interface(i.id), i.network));
        }
        let to = self.state.routes.values().find(|r| r.dst == MacSpec::Addr(mac) && r.to.is_link());
        let to = to.map(|r| r.to).ok_or(TraceError::Nowhere(mac))?;
        Ok((to, plane.network_of(to)))
    }

    /// The MAC of address `a`: a local interface's `addresses`, or the
    /// `neigh` table (the state's lines and, in cluster mode, the claims).
    fn mac_of(&self, plane: &Plane, network: Option<u32>, a: IpAddr) -> Option<MacAddr> {
        let st = &self.state;
        let own = st
            .interfaces
            .values()
            .find(|i| i.addresses.contains(&a) && network.is_none_or(|n| n == i.network));
        if let Some(m) = own.and_then(|i| i.mac) {
            return Some(m);
        }
        let mut named =
            plane.neighbors.iter().filter(|((n, x), _)| *x == a && network.is_none_or(|w| w == *n));
        named.next().map(|(_, m)| *m)
    }

    /// Which data path each port of the frame is on, and why: a step after
    /// the arrival, and one after each link's.
    fn datapaths(&self, plane: &Plane, r: &Resolved, len: usize, t: &mut Trace) {
        let kernel_in = match r.ingress {
            Port::Interface(id) => match self.kernel.ifaces.contains_key(&id) {
                true => Ok(()),
                false => Err(self.kernel.user_reasons.get(&id).cloned().unwrap_or_else(|| {
                    self.kernel.off.clone().unwrap_or_else(|| "its `datapath` is `user`".into())
                })),
            },
            Port::Link(_) => Ok(()),
        };
        let governed = plane.policy.governs(r.network);
        let mut steps = Vec::with_capacity(t.steps.len() + 2);
        for s in t.steps.drain(..) {
            let after = s.stage == Stage::Link || (s.stage == Stage::Deliver && r.ingress.is_link());
            let object = s.object.clone();
            steps.push(s);
            if !after {
                continue;
            }
            let link = plane.links.values().find(|l| l.def.name == object);
            let detail = match (&kernel_in, link) {
                (Err(why), _) => format!("user path: the interface's frames are vnetd's ({why})"),
                (Ok(()), Some(l)) => match self.kernel.link_reasons.get(&l.def.name) {
                    Some(why) => format!("user path: {why}"),
                    None if self.kernel.path.is_none() => "user path: the kernel path is not loaded".into(),
                    None if len > l.max_whole_frame() => format!(
                        "user path: the eBPF program leaves frames over {} bytes to vnetd",
                        l.max_whole_frame()
                    ),
                    None if governed => "kernel path once the policy allowed the flow: its first packet is \
                                         judged by vnetd (user path)"
                        .into(),
                    None => "kernel path: the eBPF program encapsulates and sends it".into(),
                },
                (Ok(()), None) => self.delivery_path(&object),
            };
            steps.push(Step { stage: Stage::Datapath, verdict: Verdict::Pass, object, detail });
        }
        t.steps = steps;
    }

    /// The data path a frame from a link takes to interface `name`.
    fn delivery_path(&self, name: &str) -> String {
        let served = self.state.iface_by_name(name).is_some_and(|i| self.kernel.ifaces.contains_key(&i.id));
        match served {
            true => "kernel path: the eBPF program decapsulates it into the interface".into(),
            false => "user path: vnetd writes it to the interface".into(),
        }
    }

    /// The far host's part, when the frame leaves by a link: in cluster
    /// mode computed from the store's view (the claim, the network's
    /// policy and groups this host holds); else the line to ask it with.
    fn far(
        &self,
        plane: &Plane,
        r: &Resolved,
        ask: &dyn Fn(u32) -> String,
        frame: &[u8],
        t: &Trace,
    ) -> Option<Far> {
        let link = t.exits.iter().copied().find(Port::is_link)?;
        let Port::Link(id) = link else { return None };
        let l = plane.links.get(&id)?;
        let network = l.def.network();
        let mut far = Far {
            host: l.def.transport.peer(),
            link: l.def.name.clone(),
            network,
            ask: ask(network),
            computed_from: None,
            steps: None,
        };
        let clustered = self
            .cluster
            .status
            .as_ref()
            .is_some_and(|c| c.lock().unwrap_or_else(|p| p.into_inner()).links.contains(&l.def.name));
        if !clustered {
            return Some(far);
        }
        // Cluster mode: the far host is the one the link is named after; it
        // takes the datagram in the cluster's network, judges it by the
        // network's policy (the signed record and groups held here), and
        // delivers it to the VM whose MAC it claims.
        let arrival = Step {
            stage: Stage::Arrival,
            verdict: Verdict::Pass,
            object: l.def.name.clone(),
            detail: format!("from this host's link, network {network} (the cluster's, on both ends)"),
        };
        let mut steps = vec![arrival, trace::policy_step(plane, link, frame)];
        if steps[1].verdict.passes() {
            steps.push(Step {
                stage: Stage::Deliver,
                verdict: Verdict::Pass,
                object: r.macs.1.to_string(),
                detail: format!("to the port of the VM {} whose MAC host {} claims", r.macs.1, l.def.name),
            });
        }
        far.host = l.def.name.clone();
        far.computed_from = Some("the store's view");
        far.steps = Some(steps);
        Some(far)
    }
}

/// A `trace hex` frame's IP part in words.
fn ip_words(ip: &vnet_wire::classify::Ip) -> String {
    match ip.proto {
        6 => format!("tcp port {}", ip.dport),
        17 => format!("udp port {}", ip.dport),
        1 | 58 => "icmp".into(),
        p => format!("ip proto {p}"),
    }
}

fn proto_words(l4: L4) -> String {
    match l4 {
        L4::Icmp => "icmp echo".into(),
        L4::Tcp(p) => format!("tcp port {p}"),
        L4::Udp(p) => format!("udp port {p}"),
    }
}

/// `{"result": "pass"|"drop"|"lost", "reason", "stage", "object"}`.
fn verdict_of(t: &Trace) -> Value {
    match t.failure() {
        None => json!({ "result": "pass" }),
        Some(s) => json!({
            "result": if s.verdict == Verdict::LinkDown { "lost" } else { "drop" },
            "reason": s.verdict.word(), "stage": s.stage.word(), "object": s.object,
        }),
    }
}

fn text(head: &Value, t: &Trace, verdict: &Value, far: &Option<Far>) -> String {
    let s = |v: &Value, k: &str| v[k].as_str().unwrap_or("").to_string();
    let mut out = format!(
        "trace: {} {} > {} {} {}, {} bytes, network {}\non this host:\n",
        s(head, "src_mac"),
        s(head, "src"),
        s(head, "dst_mac"),
        s(head, "dst"),
        s(head, "proto"),
        head["bytes"],
        head["network"]
    );
    steps_text(&mut out, &t.steps);
    match verdict["result"].as_str() {
        Some("pass") => {
            let _ = writeln!(out, "verdict: pass");
        }
        _ => {
            let _ = writeln!(
                out,
                "verdict: {} at {} ({})",
                s(verdict, "reason"),
                s(verdict, "stage"),
                s(verdict, "object")
            );
        }
    }
    let Some(far) = far else { return out };
    match &far.steps {
        Some(steps) => {
            let _ = writeln!(out, "on host {} (computed from the store's view):", far.host);
            steps_text(&mut out, steps);
        }
        None => {
            let _ = writeln!(
                out,
                "on the far host ({}, by link {}): ask its vnetd: vnetctl {}",
                far.host, far.link, far.ask
            );
        }
    }
    out
}

fn steps_text(out: &mut String, steps: &[Step]) {
    for (i, st) in steps.iter().enumerate() {
        let object = if st.object.is_empty() { String::new() } else { format!("{}: ", st.object) };
        let _ = writeln!(
            out,
            "  {:>2} {:<9} {:<18} {object}{}",
            i + 1,
            st.stage.word(),
            st.verdict.word(),
            st.detail
        );
    }
}
