//! An in-memory network of vnet hosts on the engine: what needs no kernel
//! (routing, split horizon, fan-out, link formats, fragmentation and
//! reassembly under loss and reordering, relocation) runs here, under plain
//! `cargo test`, in milliseconds (after vpncloud's `src/tests/common.rs`
//! and smoltcp's `tests/netsim.rs`).
//!
//! Each host is configured in the control language, as a vnetd is: its
//! interfaces become [`Recorder`] ports that keep what they are given, its
//! links send their datagrams onto a shared [`Wire`] that delivers them, in
//! time order on a virtual clock, to the host that owns the destination
//! address, with loss, delay jitter (reordering) and duplication as the test
//! sets them. A host's datagrams reach the engine's [`Receiver`] exactly as
//! a socket's would; a `tcp` link's bytes are a reliable, ordered stream
//! (no faults apply) cut into records by the engine's own deframer. Nothing
//! here is on the daemon's data path; it allocates freely.

use crate::codec::stream::{Deframer, Record};
use crate::link::Link;
use crate::plane::{route_table, Iface, Plane};
use crate::port::DatagramTx;
use crate::port::{Payload, Port, Scratch};
use crate::rx::{self, Receiver, Via};
use crate::secure::{self, Identity, Timers};
use crate::{Forwarder, Global};
use std::collections::{BTreeMap, BinaryHeap};
use std::io::IoSlice;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use vnet_control::{Located, RxKey, State, DEFAULT_PORT};
use vnet_core::Port as PortId;
use vnet_wire::virtio::VirtioNetHdr;

/// How bytes reach a simulated host: which of its sockets they arrive on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arrival {
    Datagram(Via),
    Stream,
}

/// A frame a [`Recorder`] was given: its offload header (`None` for a plain
/// frame) and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    pub vh: Option<VirtioNetHdr>,
    pub frame: Vec<u8>,
}

/// A VM's NIC in the simulation: keeps every frame it is given.
pub struct Recorder {
    offloads: bool,
    frames: Mutex<Vec<Delivered>>,
}

impl Recorder {
    pub fn new(offloads: bool) -> Self {
        Recorder { offloads, frames: Mutex::new(Vec::new()) }
    }

    /// Takes what arrived since the last call.
    pub fn take(&self) -> Vec<Delivered> {
        std::mem::take(&mut *self.frames.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Port for Recorder {
    fn takes_offloads(&self) -> bool {
        self.offloads
    }

    fn send(&self, _: &mut Scratch, payload: Payload<'_>) -> bool {
        let mut got = self.frames.lock().unwrap_or_else(|e| e.into_inner());
        payload.each_frame(|parts, hdr| {
            let bytes: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
            let d = if hdr {
                match VirtioNetHdr::parse(&bytes) {
                    Some(vh) => Delivered { vh: Some(vh), frame: bytes[vnet_wire::virtio::LEN..].to_vec() },
                    None => return false,
                }
            } else {
                Delivered { vh: None, frame: bytes }
            };
            got.push(d);
            true
        })
    }
}

/// Faults the wire applies to every datagram.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Probability that a datagram is lost.
    pub loss: f64,
    /// Probability that a datagram is delivered twice.
    pub duplicate: f64,
    /// Extra delay, uniform in 0..=jitter_ns (reorders datagrams).
    pub jitter_ns: u64,
    /// The largest datagram (UDP payload) the path carries, as a router
    /// with a smaller MTU that drops what does not fit and sends no ICMP
    /// (0: any).
    pub max_datagram: usize,
    /// UDP GRO at the receiver, at its best: the datagrams of one GSO send
    /// arrive as one receive buffer (a GRO batch; faults apply to the
    /// batch), and a host is handed the next buffer from the same sender
    /// with it, as from one `recvmmsg`.
    pub gro: bool,
    /// Every send is refused (as a socket that returns ENOBUFS): nothing
    /// goes on the wire and the sender is told so.
    pub refuse: bool,
}

/// A datagram in flight.
#[derive(Debug, PartialEq, Eq)]
struct InFlight {
    at: u64,
    seq: u64,
    from: SocketAddr,
    to: IpAddr,
    arrival: Arrival,
    bytes: Vec<u8>,
    /// The size of each datagram of a GRO batch (0: one datagram).
    gso: usize,
}

impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Earliest first out of the max-heap.
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

/// The shared underlay: datagrams in flight, the clock, the faults.
pub struct Wire {
    now_ns: u64,
    seq: u64,
    rng: u64,
    /// One-way delay of every datagram.
    pub delay_ns: u64,
    pub faults: Faults,
    queue: BinaryHeap<InFlight>,
    /// Datagrams sent, lost and duplicated so far.
    pub sent: u64,
    pub lost: u64,
    pub duplicated: u64,
    /// When set, every datagram put on the wire is also kept here (a capture).
    pub capture: Option<Vec<Vec<u8>>>,
    /// Pairs of hosts whose datagrams to each other are all lost (NATs
    /// that let neither through), whatever else the wire carries.
    cut: Vec<(IpAddr, IpAddr)>,
    /// Datagrams lost to a cut.
    pub cut_lost: u64,
}

impl Wire {
    fn random(&mut self) -> u64 {
        // xorshift64*: deterministic per seed.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.random() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn put(&mut self, from: SocketAddr, to: IpAddr, arrival: Arrival, bytes: Vec<u8>) {
        self.put_batch(from, to, arrival, bytes, 0);
    }

    /// Puts `bytes` on the wire as datagrams of `gso` bytes coalesced (0:
    /// one datagram).
    fn put_batch(&mut self, from: SocketAddr, to: IpAddr, arrival: Arrival, bytes: Vec<u8>, gso: usize) {
        self.sent += 1;
        if let Some(c) = self.capture.as_mut() {
            c.push(bytes.clone());
        }
        if arrival == Arrival::Stream {
            // TCP: reliable and ordered.
            self.seq += 1;
            let f =
                InFlight { at: self.now_ns + self.delay_ns, seq: self.seq, from, to, arrival, bytes, gso };
            self.queue.push(f);
            return;
        }
        let too_big = self.faults.max_datagram > 0 && bytes.len() > self.faults.max_datagram;
        let cut = self.cut.iter().any(|&(a, b)| (a, b) == (from.ip(), to) || (b, a) == (from.ip(), to));
        self.cut_lost += u64::from(cut);
        if too_big || cut || self.chance(self.faults.loss) {
            self.lost += 1;
            return;
        }
        let copies = if self.chance(self.faults.duplicate) { 2 } else { 1 };
        self.duplicated += copies - 1;
        for _ in 0..copies {
            let jitter =
                if self.faults.jitter_ns > 0 { self.random() % (self.faults.jitter_ns + 1) } else { 0 };
            self.seq += 1;
            let f = InFlight {
                at: self.now_ns + self.delay_ns + jitter,
                seq: self.seq,
                from,
                to,
                arrival,
                bytes: bytes.clone(),
                gso,
            };
            self.queue.push(f);
        }
    }
}

/// A link's I/O in the simulation: datagrams onto the wire.
struct WireTx {
    /// The sending host's address and port (every host listens on the default port).
    from: SocketAddr,
    /// The peer's address (a secured link's roams: [`DatagramTx::retarget`]).
    to: Mutex<IpAddr>,
    arrival: Arrival,
    wire: Arc<Mutex<Wire>>,
}

impl DatagramTx for WireTx {
    fn send(&self, iov: &[IoSlice<'_>], seg: usize, _flow: u64) -> bool {
        let bytes: Vec<u8> = iov.iter().flat_map(|p| p.iter().copied()).collect();
        let to = *self.to.lock().unwrap_or_else(|e| e.into_inner());
        let mut w = self.wire.lock().unwrap_or_else(|e| e.into_inner());
        if w.faults.refuse {
            return false;
        }
        if bytes.is_empty() {
            w.put(self.from, to, self.arrival, Vec::new()); // a keepalive
        }
        if w.faults.gro && bytes.len() > seg && seg > 0 && self.arrival != Arrival::Stream {
            w.put_batch(self.from, to, self.arrival, bytes, seg);
            return true;
        }
        for d in bytes.chunks(seg.max(1)) {
            w.put(self.from, to, self.arrival, d.to_vec());
        }
        true
    }

    fn retarget(&self, to: SocketAddr) -> bool {
        *self.to.lock().unwrap_or_else(|e| e.into_inner()) = to.ip();
        true
    }
}

/// A `direct` link's I/O in the simulation: the LAN, a recorder of frames
/// (each given as `[virtio_net_hdr] frame`, as to a packet socket).
struct LanTx(Arc<Recorder>);

impl DatagramTx for LanTx {
    fn send(&self, iov: &[IoSlice<'_>], _: usize, _: u64) -> bool {
        Port::send(&*self.0, &mut Scratch::default(), Payload::Frame { parts: iov, hdr: true })
    }
}

/// One simulated vnetd.
pub struct Host {
    pub ip: IpAddr,
    pub state: State,
    pub plane: Arc<Plane>,
    pub global: Arc<Global>,
    /// The VMs' NICs, by interface name.
    pub vms: BTreeMap<String, Arc<Recorder>>,
    fw: Forwarder,
    rx_udp: Receiver,
    rx_vxlan: Receiver,
    /// The byte streams of `tcp` links, by peer.
    streams: BTreeMap<IpAddr, Deframer>,
    /// The LANs of `direct` links, by link name: what vnetd put on them.
    pub lans: BTreeMap<String, Arc<Recorder>>,
    generation: u64,
    /// The host's key pair, derived from its address ([`Net::public_key`]).
    identity: Arc<Identity>,
}

/// A network of simulated hosts.
pub struct Net {
    pub wire: Arc<Mutex<Wire>>,
    pub hosts: Vec<Host>,
    /// The timers of secured links created from now on.
    pub timers: Timers,
}

/// The key pair of the simulated host at `ip`: derived from the address,
/// so that tests can name peers' keys before the hosts exist.
fn sim_identity(ip: IpAddr) -> Arc<Identity> {
    let d = ring::digest::digest(&ring::digest::SHA256, format!("vnet sim key {ip}").as_bytes());
    let mut private = [0u8; 32];
    private.copy_from_slice(d.as_ref());
    // X25519 takes any 32 bytes (they are clamped).
    Arc::new(Identity::from_private(private).expect("the simulator needs X25519"))
}

/// What went wrong configuring a simulated host.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl Net {
    /// A network with a 50 us one-way delay and no faults; `seed` fixes
    /// every random choice.
    pub fn new(seed: u64) -> Self {
        let wire = Wire {
            now_ns: 0,
            seq: 0,
            rng: seed | 1,
            delay_ns: 50_000,
            faults: Faults::default(),
            queue: BinaryHeap::new(),
            sent: 0,
            lost: 0,
            duplicated: 0,
            capture: None,
            cut: Vec::new(),
            cut_lost: 0,
        };
        Net { wire: Arc::new(Mutex::new(wire)), hosts: Vec::new(), timers: Timers::default() }
    }

    /// The public key of the host at `ip` (existing or not), for `peer-key`.
    pub fn public_key(ip: &str) -> vnet_control::PeerKey {
        let ip: IpAddr = ip.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]));
        vnet_control::PeerKey(sim_identity(ip).public())
    }

    fn wire(&self) -> std::sync::MutexGuard<'_, Wire> {
        self.wire.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn now_ns(&self) -> u64 {
        self.wire().now_ns
    }

    pub fn set_faults(&self, f: Faults) {
        self.wire().faults = f;
    }

    /// Cuts the path between hosts `a` and `b` (both ways; `false`: mends it).
    pub fn cut(&self, a: &str, b: &str, cut: bool) {
        let (Ok(a), Ok(b)) = (a.parse(), b.parse()) else { return };
        let mut w = self.wire();
        w.cut.retain(|&p| p != (a, b) && p != (b, a));
        if cut {
            w.cut.push((a, b));
        }
    }

    /// Starts keeping a copy of every datagram put on the wire.
    pub fn start_capture(&self) {
        self.wire().capture = Some(Vec::new());
    }

    /// The datagrams captured since [`Net::start_capture`] (or the last call).
    pub fn captured(&self) -> Vec<Vec<u8>> {
        self.wire().capture.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Puts a datagram of anyone's making on the wire: from `from` (any
    /// `IP` or `IP:PORT`: a spoofer's choice; the port defaults to the one
    /// hosts send from) to host address `to`'s `listen udp` socket.
    pub fn inject(&self, from: &str, to: &str, bytes: Vec<u8>) {
        self.inject_via(Via::Udp, from, to, bytes);
    }

    /// [`Net::inject`] to host `to`'s `listen vxlan` socket.
    pub fn inject_vxlan(&self, from: &str, to: &str, bytes: Vec<u8>) {
        self.inject_via(Via::Vxlan, from, to, bytes);
    }

    fn inject_via(&self, via: Via, from: &str, to: &str, bytes: Vec<u8>) {
        let from =
            from.parse().ok().or_else(|| from.parse().ok().map(|ip| SocketAddr::new(ip, DEFAULT_PORT)));
        let (Some(from), Ok(to)) = (from, to.parse()) else { return };
        self.wire().put(from, to, Arrival::Datagram(via), bytes);
    }

    /// Adds a host with underlay address `ip`, configured by `config` (the
    /// control language; interfaces of any kind become recorders that take
    /// offloads unless `offload off`). Returns its index.
    pub fn add_host(&mut self, ip: &str, config: &str) -> Result<usize, ConfigError> {
        let ip: IpAddr = ip.parse().map_err(|e| ConfigError(format!("{ip}: {e}")))?;
        let global = Arc::<Global>::default();
        let mut h = Host {
            ip,
            state: State::default(),
            plane: Arc::default(),
            global: global.clone(),
            vms: BTreeMap::new(),
            fw: Forwarder::new(global),
            rx_udp: Receiver::new(Via::Udp, Default::default()),
            rx_vxlan: Receiver::new(Via::Vxlan, Default::default()),
            streams: BTreeMap::new(),
            lans: BTreeMap::new(),
            generation: 0,
            identity: sim_identity(ip),
        };
        h.apply(&self.wire, config, self.timers)?;
        self.hosts.push(h);
        Ok(self.hosts.len() - 1)
    }

    /// Applies control text to host `h` as one transaction.
    pub fn apply(&mut self, h: usize, text: &str) -> Result<(), ConfigError> {
        let wire = self.wire.clone();
        let timers = self.timers;
        self.hosts[h].apply(&wire, text, timers)
    }

    /// VM `vm` of host `h` sends `frame` (with offload header `vh`).
    pub fn send_with(&mut self, h: usize, vm: &str, vh: VirtioNetHdr, frame: &[u8]) {
        let host = &mut self.hosts[h];
        let Some(def) = host.state.iface_by_name(vm) else { return };
        let id = def.id;
        if let Some(i) = host.plane.ifaces.get(&id) {
            i.rx.add(frame.len());
        }
        let mut buf = frame.to_vec();
        let plane = host.plane.clone();
        host.fw.forward(&plane, PortId::Interface(id), vh, &mut buf);
        host.fw.report();
    }

    /// VM `vm` of host `h` hands `[virtio_net_hdr] frame` in pieces, as a
    /// vhost-user guest's buffers lie ([`Forwarder::forward_parts`]): true
    /// when it went out as it lies, false when it was left to `forward`
    /// (which the daemon then calls; this does not).
    pub fn send_parts(&mut self, h: usize, vm: &str, parts: &[&[u8]]) -> bool {
        let host = &mut self.hosts[h];
        let Some(id) = host.state.iface_by_name(vm).map(|d| d.id) else { return false };
        let iov: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
        let total = parts.iter().map(|p| p.len()).sum();
        let plane = host.plane.clone();
        let done = host.fw.forward_parts(&plane, PortId::Interface(id), &iov, total);
        host.fw.report();
        done
    }

    /// VM `vm` of host `h` sends a plain frame.
    pub fn send(&mut self, h: usize, vm: &str, frame: &[u8]) {
        self.send_with(h, vm, VirtioNetHdr::NONE, frame)
    }

    /// Delivers datagrams in time order until none is in flight (or
    /// `max_steps` were delivered). Returns how many were delivered.
    pub fn run(&mut self, max_steps: usize) -> usize {
        let mut n = 0;
        while n < max_steps {
            let next = {
                let mut w = self.wire();
                let Some(d) = w.queue.pop() else { break };
                w.now_ns = w.now_ns.max(d.at);
                d
            };
            n += 1;
            let now = next.at;
            let Some(host) = self.hosts.iter_mut().find(|h| h.ip == next.to) else { continue };
            let mut bytes = next.bytes;
            let plane = host.plane.clone();
            match next.arrival {
                Arrival::Datagram(via) => {
                    // With GRO, the next buffer from the same sender to the
                    // same socket, as one `recvmmsg` would return it.
                    let mut after = {
                        let mut w = self.wire.lock().unwrap_or_else(|e| e.into_inner());
                        let same = |f: &InFlight| {
                            f.to == next.to && f.from == next.from && f.arrival == next.arrival
                        };
                        match w.queue.peek() {
                            Some(f) if w.faults.gro && next.gso > 0 && same(f) => w.queue.pop(),
                            _ => None,
                        }
                    };
                    let rx = if via == Via::Udp { &mut host.rx_udp } else { &mut host.rx_vxlan };
                    let mut second = after.as_mut().map(|f| (&mut f.bytes[..], f.gso));
                    let cx = &mut rx::Cx { fw: &mut host.fw, plane: &plane, now_ns: now };
                    let took = rx.receive(cx, next.from, &mut bytes, next.gso, &mut second);
                    rx.report(&host.global);
                    if let Some(f) = after.filter(|_| took < 2) {
                        self.wire.lock().unwrap_or_else(|e| e.into_inner()).queue.push(f);
                        // not taken: on its own next
                    }
                }
                Arrival::Stream => host.stream(&plane, next.from.ip(), &bytes),
            }
            host.fw.report();
        }
        n
    }

    /// Moves the clock forward by `ns` (timeouts), delivering what falls due.
    pub fn advance(&mut self, ns: u64) {
        let until = self.now_ns() + ns;
        loop {
            let due = self.wire().queue.peek().is_some_and(|d| d.at <= until);
            if !due {
                break;
            }
            self.run(1);
        }
        self.wire().now_ns = until;
        for h in &mut self.hosts {
            h.rx_udp.expire(until);
            h.rx_udp.report(&h.global);
            h.plane.tick(until, |_, _| {});
        }
    }

    /// A machine on the LAN of host `h`'s `direct` link `link` sends `frame`.
    pub fn lan_send(&mut self, h: usize, link: &str, frame: &[u8]) {
        let host = &mut self.hosts[h];
        let plane = host.plane.clone();
        let Some(l) = host.link(link).cloned() else { return };
        let mut buf = frame.to_vec();
        rx::deliver::frame(
            &mut rx::Cx { fw: &mut host.fw, plane: &plane, now_ns: 0 },
            &l,
            VirtioNetHdr::NONE,
            &mut buf,
        );
        host.fw.report();
    }

    /// What host `h` put on the LAN of its `direct` link `link` since the last call.
    pub fn take_lan(&self, h: usize, link: &str) -> Vec<Delivered> {
        self.hosts[h].lans.get(link).map(|r| r.take()).unwrap_or_default()
    }

    /// Frames host `h` is reassembling now (of `vnet` links' fragments).
    pub fn reassembling(&self, h: usize) -> usize {
        self.hosts[h].rx_udp.in_progress()
    }

    /// What VM `vm` of host `h` received since the last call.
    pub fn take(&self, h: usize, vm: &str) -> Vec<Delivered> {
        self.hosts[h].vms.get(vm).map(|r| r.take()).unwrap_or_default()
    }
}

impl Host {
    fn apply(&mut self, wire: &Arc<Mutex<Wire>>, text: &str, timers: Timers) -> Result<(), ConfigError> {
        let cmds: Vec<Located<vnet_control::Command>> =
            vnet_control::parse(text).map_err(|e| ConfigError(e.to_string()))?;
        let next = self.state.apply_all(&cmds).map_err(|e| ConfigError(e.to_string()))?;
        let mut ifaces = Vec::new();
        for d in next.interfaces.values() {
            let rec =
                self.vms.entry(d.name.clone()).or_insert_with(|| Arc::new(Recorder::new(d.offload))).clone();
            // Keep the interface (and its counters) when it stays.
            let keep = self.plane.ifaces.get(&d.id).filter(|i| i.name == d.name).cloned();
            ifaces.push(keep.unwrap_or_else(|| {
                Arc::new(
                    Iface::new(d.id, d.name.clone(), d.mac, rec)
                        .locked_to(d.mac)
                        .in_network(d.network)
                        .broadcast_limit(d.broadcast_limit),
                )
            }));
        }
        self.vms.retain(|n, _| next.iface_by_name(n).is_some());
        // A link that stays keeps its sessions; a new one gets its security
        // here (where a missing key is the transaction's error).
        let kept = |d: &vnet_control::LinkDef| self.plane.links.get(&d.id).filter(|l| l.def == *d).cloned();
        let mut secured = BTreeMap::new();
        for d in next.links.values().filter(|d| kept(d).is_none()) {
            let sec =
                secure::for_link(d, Some(&self.identity), timers).map_err(|e| ConfigError(e.to_string()))?;
            secured.insert(d.id, sec.map(|s| s.listed_in(self.global.sessions.clone(), d.id)));
        }
        let links = next
            .links
            .values()
            .map(|d| match kept(d) {
                Some(l) => l,
                None => {
                    // Where the peer hears the link: a socket, a stream, or the LAN.
                    let arrival = match d.rx_key() {
                        RxKey::Addr(Via::Tcp, ..) => Arrival::Stream,
                        RxKey::Addr(via, ..) => Arrival::Datagram(via),
                        RxKey::Device(_) => {
                            // The LAN: a recorder of what vnetd puts on it.
                            let lan = self
                                .lans
                                .entry(d.name.clone())
                                .or_insert_with(|| Arc::new(Recorder::new(true)));
                            return Arc::new(Link::new(d.clone(), Arc::new(LanTx(lan.clone()))));
                        }
                    };
                    let to = d.remote().map_or(self.ip, |r| r.ip());
                    let from = SocketAddr::new(self.ip, DEFAULT_PORT);
                    let io = WireTx { from, to: Mutex::new(to), arrival, wire: wire.clone() };
                    let sec = secured.remove(&d.id).flatten();
                    Arc::new(Link::new(d.clone(), Arc::new(io)).secured(sec))
                }
            })
            .collect();
        self.lans.retain(|n, _| next.link_by_name(n).is_some());
        self.generation += 1;
        let table = route_table(&next, self.generation, &self.plane.table);
        let plane = Plane::new(table, ifaces, links).answering(crate::plane::neighbors(&next));
        let policy =
            crate::policy::build(&next.policies, &Default::default(), self.generation, &self.plane.policy);
        self.plane = Arc::new(plane.guarding(crate::plane::guards(&next)).governed(Arc::new(policy)));
        self.state = next;
        Ok(())
    }

    /// Bytes of a `tcp` link's stream from `from`: records out, frames forwarded.
    fn stream(&mut self, plane: &Plane, from: IpAddr, bytes: &[u8]) {
        let Some(link) = plane.link_for(RxKey::Addr(Via::Tcp, from, 0)) else {
            self.global.unknown_source.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return;
        };
        let d = self.streams.entry(from).or_default();
        let mut rest = bytes;
        while !rest.is_empty() {
            let n = d.push(rest);
            rest = &rest[n..];
            loop {
                match d.next_record() {
                    Ok(Some(Record::Frame { with_vh, payload })) => rx::stream_record(
                        &mut rx::Cx { fw: &mut self.fw, plane, now_ns: 0 },
                        link,
                        with_vh,
                        payload,
                    ),
                    Ok(Some(Record::Heartbeat)) => {}
                    Ok(None) => break,
                    Err(_) => {
                        // The stream is broken: a real link closes the connection.
                        self.streams.remove(&from);
                        return;
                    }
                }
            }
        }
    }

    /// A link by name.
    pub fn link(&self, name: &str) -> Option<&Arc<Link>> {
        let id = self.state.link_by_name(name)?.id;
        self.plane.links.get(&id)
    }
}
