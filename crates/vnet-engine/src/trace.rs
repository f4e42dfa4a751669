//! `vnetctl trace`: a frame's way through this host's forwarding, as a dry
//! run. Nothing is sent, counted or remembered.
//!
//! Each step asks the function the data path asks, in the order
//! [`Forwarder::forward`](crate::Forwarder::forward) meets them: the source
//! checks ([`forward::source_check`]), the policy ([`PolicySet::explain`],
//! the judgement `decide` makes, without its counters and flows), the
//! neighbour answer at the edge ([`forward::edge_answer`]), the route
//! ([`RouteTable::lookup`], and the priority it ranked by), then each
//! destination: an interface, or a link with its kind, security, liveness
//! and the size it carries ([`forward::too_big`]). A frame arriving from a
//! link first meets the check the way in makes (its network id,
//! `rx::vnet`). A failing step's verdict is the [`DropReason`] the data
//! path would record, by the name `monitor drops` prints, so the two agree;
//! the one failure that is no drop here is a link whose peer is down (the
//! frame is sent, and lost on the way).
//!
//! [`PolicySet::explain`]: vnet_core::policy::PolicySet::explain
//! [`RouteTable::lookup`]: vnet_core::RouteTable::lookup

use crate::forward::{self, Edge};
use crate::link::Liveness;
use crate::plane::Plane;
use serde::Serialize;
use std::net::IpAddr;
use vnet_core::policy::{Action, Why};
use vnet_core::{DropReason, Port as PortId};
use vnet_wire::{EthernetFrame, MacAddr};

/// What a step looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Where the frame comes in (an interface; a link and its network id).
    Arrival,
    /// Port security and the IP source guard.
    Source,
    /// Which data path handles the frame, and why (vnetd's: the engine
    /// does not know the kernel path).
    Datapath,
    /// The network's policy.
    Policy,
    /// The ARP request (IPv4) or neighbour solicitation (IPv6) before the
    /// frame: answered at the edge or flooded.
    Neighbour,
    /// The route that decided, and its priority.
    Route,
    /// The link the frame leaves by: kind, security, its peer's liveness.
    Link,
    /// Encapsulation and size: does the frame fit the link.
    Mtu,
    /// Delivered to a local interface (the port).
    Deliver,
}

impl Stage {
    pub fn word(self) -> &'static str {
        match self {
            Stage::Arrival => "arrival",
            Stage::Source => "source",
            Stage::Datapath => "datapath",
            Stage::Policy => "policy",
            Stage::Neighbour => "neighbour",
            Stage::Route => "route",
            Stage::Link => "link",
            Stage::Mtu => "mtu",
            Stage::Deliver => "deliver",
        }
    }
}

/// What a step decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// The data path drops the frame here, for this reason.
    Drop(DropReason),
    /// Sent, but the link's peer is down: lost on the way.
    LinkDown,
}

impl Verdict {
    /// `pass`, a drop reason's name, or `link_down`.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Drop(r) => r.name(),
            Verdict::LinkDown => "link_down",
        }
    }

    pub fn passes(self) -> bool {
        self == Verdict::Pass
    }
}

impl Serialize for Verdict {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.word())
    }
}

/// One decision the frame meets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    pub stage: Stage,
    pub verdict: Verdict,
    /// What decided: an interface's, a link's or a rule's name, a route.
    pub object: String,
    /// The decision in words.
    pub detail: String,
}

impl Step {
    fn new(stage: Stage, verdict: Verdict, object: impl Into<String>, detail: impl Into<String>) -> Step {
        Step { stage, verdict, object: object.into(), detail: detail.into() }
    }
}

/// What the dry run found: the steps in order, and the ports the frame
/// leaves by (none when a step dropped it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Trace {
    pub steps: Vec<Step>,
    #[serde(skip)]
    pub exits: Vec<PortId>,
}

impl Trace {
    /// The first step that does not pass, if any.
    pub fn failure(&self) -> Option<&Step> {
        self.steps.iter().find(|s| !s.verdict.passes())
    }

    fn push(&mut self, s: Step) -> bool {
        let ok = s.verdict.passes();
        self.steps.push(s);
        ok
    }
}

/// The frame to trace and where it comes in.
#[derive(Debug, Clone, Copy)]
pub struct Probe<'a> {
    pub ingress: PortId,
    /// The frame (Ethernet header first, no offload header).
    pub frame: &'a [u8],
    /// The ARP request or neighbour solicitation the sender would send
    /// first (for the neighbour step: [`arp_request`],
    /// [`vnet_wire::neigh::solicitation`]).
    pub question: Option<&'a [u8]>,
    /// For a frame from a link: the network id its datagram says (the
    /// sending host's link's), checked as the way in checks it.
    pub said_network: Option<u32>,
    /// The engine's clock now (the links' liveness).
    pub now_ns: u64,
}

/// Runs `p` through `plane`'s decisions, changing nothing.
pub fn trace(plane: &Plane, p: Probe<'_>) -> Trace {
    let mut t = Trace::default();
    let Ok((src, dst)) = EthernetFrame::new_checked(p.frame).map(|e| (e.src(), e.dst())) else {
        t.push(Step::new(Stage::Arrival, Verdict::Drop(DropReason::Malformed), "", "not an Ethernet frame"));
        return t;
    };
    if !t.push(arrival(plane, &p)) || !t.push(source(plane, p.ingress, src, p.frame)) {
        return t;
    }
    if !t.push(policy_step(plane, p.ingress, p.frame)) {
        return t;
    }
    if let Some(q) = p.question {
        // The question meets the source checks and the policy before the
        // edge answers it, as `forward` takes it (a policy that allows
        // the frame but not ARP or ICMPv6 stops the flow here).
        let asked = match vnet_wire::neigh::question(q) {
            Some(vnet_wire::neigh::Question::Nd(_)) => "the neighbour solicitation",
            _ => "the ARP request",
        };
        for mut step in [source(plane, p.ingress, src, q), policy_step(plane, p.ingress, q)] {
            if !step.verdict.passes() {
                step.detail = format!("{asked} before it: {}", step.detail);
                t.push(step);
                return t;
            }
        }
        t.push(neighbour(plane, p.ingress, q));
    }
    let mut decisions = Vec::new();
    plane.table.lookup(p.ingress, src, dst, &mut decisions);
    if decisions.is_empty() {
        let detail = format!("no route to {dst} from {}", port_name(plane, p.ingress));
        t.push(Step::new(Stage::Route, Verdict::Drop(DropReason::NoRoute), dst.to_string(), detail));
        return t;
    }
    for &(to, ri) in &decisions {
        t.push(route(plane, (to, ri), (src, dst)));
        let ok = match to {
            PortId::Interface(_) => t.push(deliver(plane, to)),
            PortId::Link(id) => link_steps(plane, id, p, &mut t),
        };
        if ok {
            t.exits.push(to);
        }
    }
    t
}

/// A port's name, as `show` prints it.
pub fn port_name(plane: &Plane, p: PortId) -> String {
    match p {
        PortId::Interface(id) => plane.ifaces.get(&id).map_or_else(|| p.to_string(), |i| i.name.clone()),
        PortId::Link(id) => plane.links.get(&id).map_or_else(|| p.to_string(), |l| l.def.name.clone()),
    }
}

/// Where the frame comes in; from a link, the way in's network id check.
fn arrival(plane: &Plane, p: &Probe<'_>) -> Step {
    let name = port_name(plane, p.ingress);
    let net = plane.network_of(p.ingress);
    let PortId::Link(id) = p.ingress else {
        return Step::new(Stage::Arrival, Verdict::Pass, name, format!("from interface in network {net}"));
    };
    let Some(l) = plane.links.get(&id) else {
        return Step::new(Stage::Arrival, Verdict::Drop(DropReason::UnknownSource), name, "no such link");
    };
    let (encap, _) = l.def.transport.encapsulation();
    match p.said_network {
        Some(said) if encap == "vnet" && said != l.def.network() => Step::new(
            Stage::Arrival,
            Verdict::Drop(DropReason::WrongNetwork),
            name,
            format!("the datagram says network {said}; this link is network {}", l.def.network()),
        ),
        _ => Step::new(Stage::Arrival, Verdict::Pass, name, format!("from link ({encap}), network {net}")),
    }
}

/// Port security and the IP source guard ([`forward::source_check`]).
fn source(plane: &Plane, ingress: PortId, src: MacAddr, frame: &[u8]) -> Step {
    let name = port_name(plane, ingress);
    let PortId::Interface(id) = ingress else {
        return Step::new(Stage::Source, Verdict::Pass, name, "from a link: no source checks");
    };
    let lock = plane.ifaces.get(&id).and_then(|i| i.source_lock);
    let guard = plane.guards.get(&id).map(|o| o.addrs().to_vec());
    let lock_words = match lock {
        Some(m) => format!("port security: locked to {m}"),
        None => "port security: not locked".into(),
    };
    let guard_words = match &guard {
        Some(a) => format!("IP source guard: owns {}", join(a)),
        None => "IP source guard: unguarded".into(),
    };
    match forward::source_check(plane, ingress, src, frame) {
        Ok(()) => Step::new(Stage::Source, Verdict::Pass, name, format!("{lock_words}; {guard_words}")),
        Err(r @ DropReason::SpoofedSourceMac) => Step::new(
            Stage::Source,
            Verdict::Drop(r),
            name,
            format!("source MAC {src} is not the interface's ({lock_words})"),
        ),
        Err(r) => Step::new(
            Stage::Source,
            Verdict::Drop(r),
            name,
            format!("the source address is not one the interface owns ({guard_words})"),
        ),
    }
}

fn join(a: &[IpAddr]) -> String {
    a.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")
}

/// The network's policy ([`vnet_core::policy::PolicySet::explain`]) for a
/// frame that comes in by `ingress` (a far host's part, in cluster mode,
/// asks it too).
pub fn policy_step(plane: &Plane, ingress: PortId, frame: &[u8]) -> Step {
    let net = plane.network_of(ingress);
    let set = &plane.policy;
    let Some(np) = set.nets.get(&net) else {
        return Step::new(Stage::Policy, Verdict::Pass, "", format!("network {net} has no policy"));
    };
    let v = set.explain(net, frame);
    let verdict = if v.allow { Verdict::Pass } else { Verdict::Drop(DropReason::PolicyDenied) };
    let act = |a: Action| if a == Action::Allow { "allows" } else { "denies" };
    let (object, detail) = match v.why {
        Why::Rule(i) => {
            let r = np.rules.get(i);
            let name = r.map_or_else(|| format!("#{i}"), |r| r.name.to_string());
            let does = r.map_or("decides", |r| act(r.action));
            (name.clone(), format!("rule {name} {does} it (the first that matches)"))
        }
        Why::Default => ("default".into(), format!("no rule matches: the default {} it", act(np.default))),
        Why::Established => ("flow".into(), "a flow the policy allowed carries it (established)".into()),
        Why::Reply => ("flow".into(), "the reply of a flow the policy allowed".into()),
        Why::Related => ("flow".into(), "an ICMP error about a flow the policy allowed".into()),
        Why::Fragment => ("flow".into(), "a later fragment of an allowed packet".into()),
        Why::Unclassifiable => ("unclassifiable".into(), "the rules cannot read it".into()),
        Why::OrphanFragment => ("orphan_fragment".into(), "a later fragment of no allowed first".into()),
        Why::NoPolicy => (String::new(), format!("network {net} has no policy")),
        Why::Isolated(d) => {
            let iso = np.isolation.as_ref();
            let name = iso.and_then(|i| i.policies.get(d.policy)).map(|p| p.name.clone());
            let name = format!("networkpolicy {}", name.unwrap_or_else(|| format!("#{}", d.policy)));
            (name, format!("the rules allow it; a NetworkPolicy's isolation ({:?}) denies it", d.direction))
        }
    };
    Step::new(Stage::Policy, verdict, object, detail)
}

/// The ARP request or neighbour solicitation before the frame
/// ([`forward::edge_answer`]).
fn neighbour(plane: &Plane, ingress: PortId, question: &[u8]) -> Step {
    match forward::edge_answer(plane, ingress, question) {
        Edge::Answer(ip, mac) => Step::new(
            Stage::Neighbour,
            Verdict::Pass,
            ip.to_string(),
            format!("answered here: {ip} is at {mac}"),
        ),
        Edge::Flooded(ip) => Step::new(
            Stage::Neighbour,
            Verdict::Pass,
            ip.to_string(),
            format!("{ip} is in no neigh line of this network: the request is flooded (broadcast routes)"),
        ),
        Edge::Nothing => {
            Step::new(Stage::Neighbour, Verdict::Pass, "", "not asked at the edge (from a link)")
        }
    }
}

/// The route that chose `to`, with the priority the lookup ranked it by.
fn route(plane: &Plane, (to, ri): (PortId, u32), (src, dst): (MacAddr, MacAddr)) -> Step {
    let Some(r) = plane.table.route(ri) else {
        return Step::new(Stage::Route, Verdict::Pass, "", format!("to {}", port_name(plane, to)));
    };
    let kind = if to.is_link() { "link" } else { "interface" };
    let line = format!("route {} {} -> {kind} {}", r.src, r.dst, port_name(plane, to));
    let prio = plane.table.priority_of(ri, src, dst).unwrap_or(0);
    Step::new(Stage::Route, Verdict::Pass, line, format!("route {} matches with priority {prio}", r.id))
}

/// A local interface the frame is delivered to.
fn deliver(plane: &Plane, to: PortId) -> Step {
    let name = port_name(plane, to);
    Step::new(Stage::Deliver, Verdict::Pass, name, "delivered to the interface's VM")
}

/// The link steps: kind, security, liveness; then the size.
fn link_steps(plane: &Plane, id: u32, p: Probe<'_>, t: &mut Trace) -> bool {
    let Some(l) = plane.links.get(&id) else {
        let s = Step::new(Stage::Link, Verdict::Drop(DropReason::TxFailed), format!("link#{id}"), "gone");
        return t.push(s);
    };
    let name = l.def.name.clone();
    let (encap, number) = l.def.transport.encapsulation();
    let security = match l.def.transport {
        vnet_control::Transport::Udp { security, .. } => security.word(),
        vnet_control::Transport::Tcp { tls: true, .. } => "tls",
        _ => "none",
    };
    let live = l.liveness(p.now_ns);
    let heard = match l.alive.age_ns(p.now_ns) {
        Some(a) => format!("heard {} ms ago", a / 1_000_000),
        None => "never heard".into(),
    };
    let verdict = if live == Liveness::Down { Verdict::LinkDown } else { Verdict::Pass };
    let detail = format!(
        "{} to {}, {encap} {number}, security {security}, peer {} ({heard})",
        l.def.transport.word(),
        l.def.transport.peer(),
        live.word()
    );
    if !t.push(Step::new(Stage::Link, verdict, name.clone(), detail)) {
        return false;
    }
    let len = p.frame.len();
    let most = l.max_whole_frame();
    if forward::too_big(l, len) {
        let detail = format!(
            "a {len}-byte frame; the link carries whole frames of at most {most} bytes (underlay MTU {}, \
             {} bytes of {encap} header) and cannot fragment",
            l.mtu(),
            l.facts().overhead
        );
        return t.push(Step::new(Stage::Mtu, Verdict::Drop(DropReason::MtuExceeded), name, detail));
    }
    let detail = match len > most {
        true => format!(
            "a {len}-byte frame in {encap} datagrams of at most {} bytes (fragmented)",
            l.max_datagram()
        ),
        false => format!("a {len}-byte frame fits whole (at most {most} bytes; underlay MTU {})", l.mtu()),
    };
    t.push(Step::new(Stage::Mtu, Verdict::Pass, name, detail))
}

/// What the frame carries above IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Icmp,
    Tcp(u16),
    Udp(u16),
}

/// The frame a user describes: from `src` to `dst` (MACs, then addresses
/// of one family), carrying `proto`, `len` bytes long in all (at least
/// what its headers need, at most [`crate::MAX_FRAME`]). `None` for
/// addresses of two families.
pub fn probe_frame(
    macs: (MacAddr, MacAddr),
    ips: (IpAddr, IpAddr),
    proto: Proto,
    len: usize,
) -> Option<Vec<u8>> {
    let (l4, number): (Vec<u8>, u8) = match proto {
        Proto::Tcp(port) => {
            let mut t = vec![0u8; 20];
            t[..2].copy_from_slice(&40000u16.to_be_bytes());
            t[2..4].copy_from_slice(&port.to_be_bytes());
            t[12] = 5 << 4;
            t[13] = 0x02; // SYN: a flow's first packet.
            (t, vnet_wire::ip::PROTO_TCP)
        }
        Proto::Udp(port) => {
            ([40000u16.to_be_bytes(), port.to_be_bytes(), [0, 8], [0, 0]].concat(), vnet_wire::ip::PROTO_UDP)
        }
        Proto::Icmp => {
            let ty = if ips.1.is_ipv4() { 8 } else { 128 };
            (vec![ty, 0, 0, 0, 0x12, 0x34, 0, 1], if ips.1.is_ipv4() { 1 } else { 58 })
        }
    };
    let mut f = [macs.1 .0, macs.0 .0].concat();
    match ips {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&[0x08, 0x00]);
            let total = len.saturating_sub(14).max(20 + l4.len()).min(usize::from(u16::MAX));
            let mut h = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, number, 0, 0];
            h[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
            f.extend_from_slice(&h);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            f.extend_from_slice(&[0x86, 0xdd]);
            let payload = len.saturating_sub(14 + 40).max(l4.len()).min(usize::from(u16::MAX));
            f.extend_from_slice(&[0x60, 0, 0, 0]);
            f.extend_from_slice(&(payload as u16).to_be_bytes());
            f.extend_from_slice(&[number, 64]);
            f.extend_from_slice(&s.octets());
            f.extend_from_slice(&d.octets());
        }
        _ => return None,
    }
    f.extend_from_slice(&l4);
    let want = len.max(f.len()).min(crate::MAX_FRAME);
    f.resize(want, 0);
    Some(f)
}

/// The broadcast ARP request `src` (at `sip`) sends for `tip`.
pub fn arp_request(src: MacAddr, sip: std::net::Ipv4Addr, tip: std::net::Ipv4Addr) -> Vec<u8> {
    let mut f = [MacAddr::BROADCAST.0, src.0].concat();
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4, 0, 1]);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&sip.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&tip.octets());
    f.resize(60, 0);
    f
}
