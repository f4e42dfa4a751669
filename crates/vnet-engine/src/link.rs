//! A link as the engine sees it: its definition, counters, and the I/O that
//! carries its datagrams ([`DatagramTx`], implemented by the daemon's link
//! modules and by the simulator's wire). How a frame becomes datagrams is
//! the kind's codec ([`crate::codec`]), which sends through the context
//! the link builds ([`codec::Tx`]); [`Link::send`] picks it with an
//! exhaustive `match` on the transport, and what the link asks of its kind
//! (overhead, offloads, keepalives) is one lookup ([`Link::facts`]).

use crate::codec::{self, Facts, Keepalive, Tx};
use crate::global::Global;
use crate::port::{DatagramTx, Payload, Port, Scratch};
use crate::secure::{self, SecureLink};
use std::io::IoSlice;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use vnet_control::{LinkDef, Transport};
use vnet_core::Counters;
use vnet_wire::frag::FrameIds;

/// A link.
pub struct Link {
    pub def: LinkDef,
    /// Frames received from the peer.
    pub rx: Counters,
    /// Frames sent to the peer.
    pub tx: Counters,
    pub io: Arc<dyn DatagramTx>,
    /// Ids of the frames this link fragments (unpredictable, see [`FrameIds`]).
    pub(crate) frame_ids: FrameIds,
    /// Frames dropped because the kind cannot fragment them (VXLAN).
    pub too_big: AtomicU64,
    /// Whether "frame too big" was logged for this link (once is enough).
    pub(crate) too_big_logged: AtomicBool,
    /// Sessions and keys, for a link with `security auth|encrypt`.
    pub secure: Option<SecureLink>,
    /// Whether the peer is heard from.
    pub alive: Alive,
    /// Where the peer was last authenticated from, when that is not the
    /// configured remote (a secured link roams: WireGuard's rule).
    pub roamed: arc_swap::ArcSwapOption<std::net::SocketAddr>,
    /// Times the link followed its peer to a new address.
    pub roams: AtomicU64,
    /// A `vnet` link's path MTU search ([`crate::pmtu`]); other kinds use
    /// their configured `mtu` (their peers cannot answer probes).
    pub pmtu: Option<crate::pmtu::Pmtu>,
    /// A `relay KEY` link's relay: the link to the host with that key
    /// ([`crate::relay`]; set when the plane is built).
    pub relay_via: arc_swap::ArcSwapOption<std::sync::Weak<Link>>,
    /// Whether the link sends through its relay now (its peer not heard
    /// from directly lately), as the timer last decided.
    pub relaying: AtomicBool,
    /// The engine clock, plus one, when a datagram of the peer last
    /// authenticated having come directly (0: never).
    pub heard_direct: AtomicU64,
    /// Datagrams sent and received through the relay.
    pub relayed_tx: AtomicU64,
    pub relayed_rx: AtomicU64,
    /// When the last direct keepalive went while relaying.
    direct_tried_ns: AtomicU64,
    /// Where the peer sees this host (a `nat` link's peer says so every
    /// [`REFLECT_NS`]): behind NAT, this host's public mapping.
    pub seen_as: arc_swap::ArcSwapOption<std::net::SocketAddr>,
    /// When this link last told its peer where it sees it.
    reflected_ns: AtomicU64,
}

/// How often a `nat` link tells its peer where it sees it.
pub const REFLECT_NS: u64 = 10_000_000_000;

/// An idle link's keepalive period: a `vnet` link that sent nothing for
/// this long sends an empty datagram (sealed, on a secured link), so its
/// peer hears from it at least this often.
pub const KEEPALIVE_NS: u64 = 1_000_000_000;
/// A link that keeps alive and heard nothing for this long is down: three
/// keepalives lost, and half a period of slack for the timers.
pub const DEAD_NS: u64 = 3 * KEEPALIVE_NS + KEEPALIVE_NS / 2;

/// Whether a link's peer is alive, as far as the link can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Heard from within [`DEAD_NS`].
    Up,
    /// A link that keeps alive (`vnet` over UDP, TCP) and heard nothing
    /// within [`DEAD_NS`], or never.
    Down,
    /// A link whose peer sends no keepalives (`raw` to a Palacios host,
    /// VXLAN to a kernel VTEP, a LAN) and was not heard from lately: its
    /// peer may be alive and idle.
    Quiet,
}

impl Liveness {
    pub fn word(self) -> &'static str {
        match self {
            Liveness::Up => "up",
            Liveness::Down => "down",
            Liveness::Quiet => "quiet",
        }
    }
}

/// What a link knows of its peer: when it was last heard from, the
/// keepalives, and the times it went down.
#[derive(Debug, Default)]
pub struct Alive {
    /// The engine clock when a datagram or record from the peer was last
    /// accepted, plus one (0: never).
    last_rx: AtomicU64,
    /// Datagrams sent when the link's timer last looked, and since when
    /// that count has not moved.
    tx_seen: AtomicU64,
    tx_still_since: AtomicU64,
    pub keepalives_sent: AtomicU64,
    pub keepalives_received: AtomicU64,
    /// The liveness the timer last saw was `Up`; times it went from up to down.
    up: AtomicBool,
    pub downs: AtomicU64,
}

impl Alive {
    /// Something from the peer was accepted at `now_ns`. (One store in a
    /// millisecond at most: the receive path calls this per datagram.)
    pub fn heard(&self, now_ns: u64) {
        let t = now_ns.saturating_add(1);
        if t.saturating_sub(self.last_rx.load(Relaxed)) >= 1_000_000 {
            self.last_rx.store(t, Relaxed);
        }
    }

    /// How long ago the peer was last heard from (`None`: never).
    pub fn age_ns(&self, now_ns: u64) -> Option<u64> {
        match self.last_rx.load(Relaxed) {
            0 => None,
            t => Some(now_ns.saturating_sub(t - 1)),
        }
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("def", &self.def).finish()
    }
}

impl Link {
    pub fn new(def: LinkDef, io: Arc<dyn DatagramTx>) -> Self {
        Link {
            rx: Counters::default(),
            tx: Counters::default(),
            io,
            frame_ids: FrameIds::new(random_seed()),
            too_big: AtomicU64::new(0),
            too_big_logged: AtomicBool::new(false),
            secure: None,
            alive: Alive::default(),
            roamed: arc_swap::ArcSwapOption::empty(),
            roams: AtomicU64::new(0),
            pmtu: codec::facts(&def.transport)
                .probes
                .then(|| crate::pmtu::Pmtu::new(def.mtu, random_seed() as u32)),
            def,
            relay_via: arc_swap::ArcSwapOption::empty(),
            relaying: AtomicBool::new(false),
            heard_direct: AtomicU64::new(0),
            relayed_tx: AtomicU64::new(0),
            relayed_rx: AtomicU64::new(0),
            direct_tried_ns: AtomicU64::new(0),
            seen_as: arc_swap::ArcSwapOption::empty(),
            reflected_ns: AtomicU64::new(0),
        }
    }

    /// What the link's kind is: its overhead, offloads, keepalives.
    pub fn facts(&self) -> Facts {
        codec::facts(&self.def.transport)
    }

    /// A `vnet` (or `raw`) link's network id; `None` for other kinds.
    fn network(&self) -> Option<u32> {
        match self.def.transport {
            Transport::Udp { network, .. } => Some(network),
            _ => None,
        }
    }

    /// Calls `f` with what the link's codec sends through.
    fn with_tx<R>(&self, f: impl FnOnce(&Tx<'_>) -> R) -> R {
        f(&Tx {
            out: &Outbound(self),
            direct: &*self.io,
            max_datagram: self.max_datagram(),
            outer_len: self.outer_len(),
            frame_ids: &self.frame_ids,
            secure: self.secure.as_ref(),
        })
    }

    /// The link to this link's relay, if it names one that exists.
    pub fn relay_link(&self) -> Option<Arc<Link>> {
        self.relay_via.load().as_ref().and_then(|w| w.upgrade())
    }

    /// Sends datagrams to the peer: directly, or through the relay while the
    /// link relays ([`Link::relaying`]).
    pub fn out(&self, iov: &[IoSlice<'_>], seg: usize, flow: u64) -> bool {
        if self.relaying.load(Relaxed) {
            if let Some(r) = self.relay_link() {
                return self.through(&r, iov, seg);
            }
        }
        self.io.send(iov, seg, flow)
    }

    /// Sends datagrams to the peer through relay link `r`.
    pub fn through(&self, r: &Link, iov: &[IoSlice<'_>], seg: usize) -> bool {
        let Some(key) = self.secure.as_ref().map(|s| s.peer()) else { return false };
        let ok = r.wrapped(vnet_wire::vnet::Flags::RELAY_TO, &key, iov, seg);
        if ok {
            self.relayed_tx.fetch_add(1, Relaxed);
        }
        ok
    }

    /// Sends datagrams `iov` (`seg` bytes each) through this link, to or
    /// from a relay: each wrapped in a `vnet` datagram flagged `flag`
    /// naming `key` ([`crate::relay::send_through`]).
    pub fn wrapped(&self, flag: u8, key: &[u8; crate::relay::KEY], iov: &[IoSlice<'_>], seg: usize) -> bool {
        let Some(network) = self.network() else { return false };
        self.with_tx(|t| crate::relay::send_through(t, network, flag, key, iov, seg))
    }

    /// Sends a path MTU probe of IP size `size` (`ack`: the answer to the
    /// peer's probe `id`) ([`codec::vnet::send_probe`]).
    pub fn send_probe(&self, id: u32, size: u32, ack: bool) -> bool {
        let Some(network) = self.network() else { return false };
        self.with_tx(|t| codec::vnet::send_probe(t, network, id, size, ack))
    }

    /// Decides whether the link relays: it has a relay, and its peer was
    /// not heard from directly within [`DEAD_NS`].
    fn decide_relaying(&self, now_ns: u64) -> Option<Arc<Link>> {
        let r = self.relay_link()?;
        let h = self.heard_direct.load(Relaxed);
        let direct = h != 0 && now_ns.saturating_sub(h - 1) < DEAD_NS;
        self.relaying.store(!direct, Relaxed);
        (!direct).then_some(r)
    }

    /// The underlay MTU in use: the path MTU found for a `vnet` link (as
    /// far as probes confirmed it), else the configured `mtu`.
    pub fn mtu(&self) -> u32 {
        self.pmtu.as_ref().map_or(self.def.mtu, crate::pmtu::Pmtu::current)
    }

    /// Where the link sends now: the address its peer was last
    /// authenticated from, else the configured remote.
    pub fn endpoint(&self) -> Option<std::net::SocketAddr> {
        self.roamed.load().as_deref().copied().or_else(|| self.def.remote())
    }

    /// Whether the link's path may cross NAT (`link ... nat`).
    pub fn nat(&self) -> bool {
        matches!(self.def.transport, Transport::Udp { nat: true, .. })
    }

    /// Whether the link sends where `from` is: the same address (and port,
    /// for a `nat` link, whose peer sends from its listening socket).
    pub fn sends_to(&self, from: std::net::SocketAddr) -> bool {
        self.endpoint().is_some_and(|e| if self.nat() { e == from } else { e.ip() == from.ip() })
    }

    /// Seals the `plain` bytes of `vnet` datagram laid out after the secured
    /// header in `buf` (at 0 on a plain link) with the link's session, and
    /// returns the datagram's length: `plain` on a plain link, `None` on a
    /// secured link without a session.
    pub(crate) fn seal(&self, buf: &mut [u8], plain: usize) -> Option<usize> {
        codec::seal(self.secure.as_ref(), buf, plain)
    }

    /// A datagram from `from` authenticated as the peer's: when `from`'s
    /// address is not where the link sends, the link follows it there (the
    /// configured port kept: the peer's vnetd receives on its `listen`
    /// port, whatever port it sent from). Only a secured link roams, and
    /// only after its peer's datagram opened (never on an unauthenticated
    /// one: the caller's rule).
    pub fn authenticated_from(&self, from: std::net::SocketAddr, g: &Global) {
        let Some(now) = self.endpoint() else { return };
        // Through NAT the port is the mapping's: followed too.
        let to = if self.nat() { from } else { std::net::SocketAddr::new(from.ip(), now.port()) };
        if now == to || self.secure.is_none() {
            return;
        }
        if !self.io.retarget(to) {
            return;
        }
        let configured = self.def.remote() == Some(to);
        self.roamed.store(if configured { None } else { Some(Arc::new(to)) });
        self.roams.fetch_add(1, Relaxed);
        g.roams.fetch_add(1, Relaxed);
        // Tell the peer where it is seen now, at the next tick.
        self.reflected_ns.store(0, Relaxed);
        g.remember_roam(to.ip(), self.def.id);
        tracing::info!(link = %self.def.name, from = %now, to = %to, "the peer moved: following it (an authenticated datagram from its new address)");
    }

    /// The link with its security (for a link whose definition asks for it).
    pub fn secured(mut self, sec: Option<SecureLink>) -> Self {
        self.secure = sec;
        self
    }

    /// The link's timers: sends a handshake initiation when its security
    /// needs one, and a keepalive when a `vnet` link sent nothing for
    /// [`KEEPALIVE_NS`]. Called every 100 ms, and by the simulator. Returns
    /// the link's liveness when it changed between up and not up since the
    /// last call (for the daemon's log).
    pub fn tick(&self, now_ns: u64) -> Option<Liveness> {
        let mut out = [0u8; secure::INIT_LEN];
        let relay = self.decide_relaying(now_ns);
        if let Some(sec) = &self.secure {
            if let Some(n) = sec.tick(now_ns, &mut out) {
                // Directly always (the direct path may work), and through
                // the relay while relaying.
                self.io.send(&[IoSlice::new(&out[..n])], n, 0);
                if let Some(r) = &relay {
                    self.through(r, &[IoSlice::new(&out[..n])], n);
                }
            }
        }
        // While relaying, a sealed empty datagram a second directly: the
        // peer hears it if the direct path works, and answers directly.
        if relay.is_some() && now_ns.saturating_sub(self.direct_tried_ns.load(Relaxed)) >= KEEPALIVE_NS {
            self.direct_tried_ns.store(now_ns, Relaxed);
            if self.secure.as_ref().is_some_and(|s| s.established()) {
                if let Some(n) = self.seal(&mut out, 0) {
                    self.io.send(&[IoSlice::new(&out[..n])], n, 0);
                }
            }
        }
        // A `nat` link tells its peer where it sees it (a reflector, as
        // STUN is): directly, once established.
        let due = now_ns.saturating_sub(self.reflected_ns.load(Relaxed)) >= REFLECT_NS;
        if self.nat() && due && relay.is_none() && self.secure.as_ref().is_some_and(|s| s.established()) {
            self.reflected_ns.store(now_ns, Relaxed);
            if let (Some(e), Some(network)) = (self.endpoint(), self.network()) {
                self.with_tx(|t| codec::vnet::send_endpoint(t, network, e));
            }
        }
        // Path MTU probes, once a secured link can seal them (not through a relay).
        let probing = relay.is_none() && self.secure.as_ref().is_none_or(|s| s.established());
        if let Some(p) = self.pmtu.as_ref().filter(|_| probing) {
            let heard = self.alive.age_ns(now_ns).is_some_and(|a| a < DEAD_NS);
            p.tick(now_ns, heard, |id, size| {
                self.send_probe(id, size, false);
            });
        }
        if self.sends_keepalives() {
            let a = &self.alive;
            let sent = self.tx.packets.load(Relaxed) + a.keepalives_sent.load(Relaxed);
            if a.tx_seen.swap(sent, Relaxed) != sent {
                a.tx_still_since.store(now_ns, Relaxed);
            } else if now_ns.saturating_sub(a.tx_still_since.load(Relaxed)) >= KEEPALIVE_NS {
                a.tx_still_since.store(now_ns, Relaxed);
                if self.send_keepalive(&mut out) {
                    a.keepalives_sent.fetch_add(1, Relaxed);
                }
            }
        }
        let l = self.liveness(now_ns);
        let up = l == Liveness::Up;
        (self.alive.up.swap(up, Relaxed) != up).then(|| {
            if !up {
                self.alive.downs.fetch_add(1, Relaxed);
            }
            l
        })
    }

    /// Whether this link sends keepalives (its kind's [`Keepalive`]: a
    /// `vnet` link over UDP, whose peer is a vnetd).
    pub fn sends_keepalives(&self) -> bool {
        self.facts().keepalive == Keepalive::Datagrams
    }

    /// An empty datagram, sealed on a secured link (once it has a session:
    /// until then its handshakes are what the peer hears).
    fn send_keepalive(&self, buf: &mut [u8]) -> bool {
        match &self.secure {
            None => self.io.send(&[IoSlice::new(&[])], 0, 0),
            Some(sec) if sec.established() => match self.seal(buf, 0) {
                Some(n) => self.out(&[IoSlice::new(&buf[..n])], n, 0),
                None => false,
            },
            Some(_) => false,
        }
    }

    /// Whether the peer is alive, as far as this link can tell at `now_ns`.
    pub fn liveness(&self, now_ns: u64) -> Liveness {
        let keeps = self.facts().keepalive != Keepalive::None;
        match self.alive.age_ns(now_ns) {
            Some(age) if age < DEAD_NS => Liveness::Up,
            _ if keeps => Liveness::Down,
            _ => Liveness::Quiet,
        }
    }

    /// The outer IP and UDP headers' length (0: a LAN has none).
    pub fn outer_len(&self) -> usize {
        match self.def.remote() {
            Some(r) if r.is_ipv6() => 40 + 8,
            Some(_) => 20 + 8,
            None => 0,
        }
    }

    /// The largest UDP payload that crosses the underlay unfragmented (at
    /// the path MTU in use, [`Link::mtu`]).
    pub fn max_datagram(&self) -> usize {
        let own = match self.outer_len() {
            // A LAN frame has no outer headers: the frame is what goes out.
            0 => return self.def.mtu as usize + 14,
            o => (self.mtu() as usize).saturating_sub(o),
        };
        // Through a relay, what fits inside the relay link's datagrams.
        match self.relaying.load(Relaxed).then(|| self.relay_link()).flatten() {
            Some(r) => own.min(r.max_datagram().saturating_sub(crate::relay::OVERHEAD)),
            None => own,
        }
    }

    /// The largest frame (Ethernet header included) the link carries
    /// without fragmenting it, given its kind's encapsulation.
    pub fn max_whole_frame(&self) -> usize {
        let f = self.facts();
        if f.any_size {
            return crate::MAX_FRAME;
        }
        self.max_datagram().saturating_sub(f.overhead)
    }

    /// A frame of `len` bytes did not fit a link whose kind cannot
    /// fragment (VXLAN): counted, and logged once.
    fn too_big(&self, len: usize) -> bool {
        self.too_big.fetch_add(1, Relaxed);
        if !self.too_big_logged.swap(true, Relaxed) {
            tracing::warn!(
                link = %self.def.name,
                frame = len,
                largest = self.max_whole_frame(),
                "a {len}-byte frame does not fit this VXLAN link (underlay MTU {}): VTEPs do not fragment, \
                 so such frames are dropped; give the VM an MTU of at most {} (logged once)",
                self.def.mtu,
                self.max_whole_frame().saturating_sub(14),
            );
        }
        false
    }
}

/// The link's way out for its codec: directly, or through its relay while
/// it relays ([`Link::out`]).
struct Outbound<'a>(&'a Link);

impl DatagramTx for Outbound<'_> {
    fn send(&self, iov: &[IoSlice<'_>], seg: usize, flow: u64) -> bool {
        self.0.out(iov, seg, flow)
    }
}

/// A seed from the system's random source, by way of the standard
/// library's hasher keys (read from the OS once per thread, never reused).
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(0u8)
}

impl Port for Link {
    fn takes_offloads(&self) -> bool {
        self.facts().offloads
    }

    fn send(&self, scratch: &mut Scratch, payload: Payload<'_>) -> bool {
        // The inner flow's hash picks the outer source port; only the kinds
        // that send from a pool of ports need it (a `raw` link sends from
        // the listening socket, a stream and a LAN have no such port).
        let flow = || crate::flow::flow_hash(payload.frame_start());
        self.with_tx(|tx| codec::send(&self.def.transport, tx, scratch, payload, flow))
            .unwrap_or_else(|e| self.too_big(e.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link defined by `text` (one `link` line) whose I/O goes nowhere.
    fn link(text: &str) -> Link {
        use crate::port::Nowhere;
        let cmds = vnet_control::parse(text).unwrap();
        let state = vnet_control::State::default().apply_all(&cmds).unwrap();
        let def = state.links.values().next().unwrap().clone();
        Link::new(def, Arc::new(Nowhere))
    }

    #[test]
    fn a_peer_heard_at_a_time_is_that_old_to_the_nanosecond() {
        let a = Alive::default();
        assert_eq!(a.age_ns(5), None, "never heard");
        a.heard(5_000_000);
        assert_eq!(a.age_ns(5_000_000), Some(0));
        assert_eq!(a.age_ns(7_000_001), Some(2_000_001));
        assert_eq!(a.age_ns(4_000_000), Some(0), "a clock before it: no age, never a wrap");
    }

    #[test]
    fn a_link_knows_its_network_its_nat_and_where_it_sends() {
        let plain = link("link p udp 10.0.0.2 format vnet network 7");
        let nat = link("link n udp 10.0.0.2:4000 format vnet network 9 peer-key AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI= nat");
        let vx = link("link v vxlan 10.0.0.2 vni 5");
        let tcp = link("link t tcp 10.0.0.2:9000");
        assert_eq!(
            [plain.network(), nat.network(), vx.network(), tcp.network()],
            [Some(7), Some(9), None, None]
        );
        assert_eq!([plain.nat(), nat.nat(), vx.nat()], [false, true, false]);
        let at = |a: &str| a.parse::<std::net::SocketAddr>().unwrap();
        // Without NAT the peer sends from any port of its address; through
        // NAT, from the one mapping the link sends to.
        assert!(plain.sends_to(at("10.0.0.2:1")) && plain.sends_to(at("10.0.0.2:4789")));
        assert!(!plain.sends_to(at("10.0.0.3:4789")));
        assert!(nat.sends_to(at("10.0.0.2:4000")));
        assert!(!nat.sends_to(at("10.0.0.2:4001")) && !nat.sends_to(at("10.0.0.3:4000")));
        assert!(format!("{plain:?}").contains("name: \"p\""), "{plain:?}");
    }

    #[test]
    fn what_a_datagram_may_hold_is_the_mtu_less_the_outer_headers_of_its_family() {
        let v4 = link("link a udp 10.0.0.2 format vnet mtu 1500");
        let v6 = link("link b udp fd00::2 format vnet mtu 1500");
        let lan = link("link c direct eth9 mtu 1500");
        assert_eq!([v4.outer_len(), v6.outer_len(), lan.outer_len()], [28, 48, 0]);
        // A LAN carries the frame itself: the MTU and its Ethernet header.
        assert_eq!([v4.max_datagram(), v6.max_datagram(), lan.max_datagram()], [1472, 1452, 1514]);
    }

    #[test]
    fn each_link_numbers_its_fragmented_frames_from_its_own_random_start() {
        let (a, b) = (link("link a udp 10.0.0.2 format vnet"), link("link a udp 10.0.0.2 format vnet"));
        assert_ne!(a.frame_ids.next(), b.frame_ids.next());
    }

    #[test]
    fn a_peer_is_up_until_exactly_the_dead_time_after_it_was_last_heard() {
        let l = link("link p udp 10.0.0.2 format vnet");
        let t = 7_000_000_000;
        l.alive.heard(t);
        assert_eq!(l.liveness(t + DEAD_NS - 1), Liveness::Up);
        assert_eq!(l.liveness(t + DEAD_NS), Liveness::Down);
    }

    #[test]
    fn unanswered_probes_blame_the_peer_only_when_it_was_heard_within_the_dead_time() {
        use crate::pmtu::Phase;
        // Ticks every 100 ms from 10 s: probes at 10.0, 10.3 and 10.6 s,
        // none answered; the third miss is decided at 10.9 s. A peer heard
        // then does not answer probes (the link's MTU is kept); one not
        // heard may be gone (the base is tried again later).
        let decided = 10_900_000_000;
        for (heard, want) in [(decided - DEAD_NS + 1, Phase::Unanswered), (decided - DEAD_NS, Phase::Base)] {
            let l = link("link p udp 10.0.0.2 format vnet mtu 1500");
            l.alive.heard(heard);
            for k in 100..=109 {
                l.tick(k * 100_000_000);
            }
            let p = l.pmtu.as_ref().unwrap();
            assert_eq!(p.phase(), want, "heard {} ns before", decided - heard);
            assert_eq!(p.probes_sent.load(Relaxed), 6, "the base and the MTU in use, three times");
        }
    }

    #[test]
    fn liveness_is_said_as_its_word() {
        let words = [Liveness::Up, Liveness::Down, Liveness::Quiet].map(Liveness::word);
        assert_eq!(words, ["up", "down", "quiet"]);
    }
}
