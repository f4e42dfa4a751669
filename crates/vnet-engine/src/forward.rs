//! Routing and delivery of one frame, per worker.
//!
//! A frame comes with its offload header (`virtio_net_hdr`: a partial
//! checksum, or a TCP super-frame of up to 64 KB). Ports that take offloads
//! get it as it is, from the untouched buffer; then the plain ones (a `raw`
//! or VXLAN link, an interface with `offload off`) get it finished once in
//! software: checksum completed, or the super-frame cut into segments.
//! Nothing here allocates or locks: the cache, decision list, scratch and
//! segment buffer belong to the worker and are sized at start.

use crate::drops::{Denial, DropRecord, DropRing, Head};
use crate::global::Global;
use crate::plane::{Iface, Plane};
use crate::port::{Payload, Scratch};
use crate::BUF;
use crate::GSO_MAX_SEGS;
use std::io::IoSlice;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use vnet_core::policy::Why;
use vnet_core::table::Decision;
use vnet_core::{Counters, DropReason, Port as PortId, RouteCache};
use vnet_wire::offload::{complete_checksum, segment_headers, Segmented};
use vnet_wire::virtio::{self, VirtioNetHdr};
use vnet_wire::{EthernetFrame, MacAddr};

/// Route cache entries per worker.
pub const CACHE_SLOTS: usize = 4096;
/// Ports with an end-of-burst hook one batch tracks (more are ended at once).
const TOUCHED: usize = 16;

/// A frame finished for plain destinations.
#[derive(Clone, Copy)]
enum Finished {
    /// Not offloaded, or its checksum completed in place.
    Whole,
    /// Cut into segments: their headers in `Forwarder::seg_heads`, each
    /// `hdr_len` bytes, the payloads the frame's from `hdr_len` on, `mss`
    /// bytes each.
    Segments { hdr_len: usize, mss: usize },
    /// Could not be finished: plain destinations drop it.
    Failed,
}

/// Per-worker forwarding state.
pub struct Forwarder {
    global: Arc<Global>,
    cache: RouteCache,
    decisions: Vec<Decision>,
    scratch: Scratch,
    /// The headers of the software segments of one GSO frame.
    seg_heads: Vec<u8>,
    cache_reported: (u64, u64),
    /// Interfaces given frames in this batch that want its end.
    touched: Vec<Arc<Iface>>,
    /// This worker's last drops.
    drops: Arc<DropRing>,
}

impl Forwarder {
    /// Forwards a whole frame that came without an offload header from a
    /// sender that may have left checksum and segmentation to the devices: a
    /// peer's kernel path (it marks its `vnet` datagrams `WHOLE`) hands frames
    /// over as the VM's stack made them, and a Linux VTEP over a veth may leave
    /// the inner checksum partial. The header the frame needs is inferred
    /// (`offload::infer`, with `mss` 0 for "never a super-frame"), so
    /// offload-capable destinations take it as is and the rest get it finished
    /// in software. `raw` datagrams come from Palacios hosts, which send
    /// finished frames, and are not inspected.
    pub fn forward_inferred(&mut self, plane: &Plane, port: PortId, mss: u16, frame: &mut [u8]) {
        let vh = vnet_wire::offload::infer(frame, mss).unwrap_or(VirtioNetHdr::NONE);
        self.forward(plane, port, vh, frame);
    }

    pub fn new(global: Arc<Global>) -> Self {
        Forwarder {
            drops: global.drops.ring(),
            global,
            cache: RouteCache::new(CACHE_SLOTS),
            decisions: Vec::with_capacity(64),
            scratch: Scratch::default(),
            // A 64 KB frame split at a small MSS repeats its headers often.
            seg_heads: vec![0u8; 4 * BUF],
            cache_reported: (0, 0),
            touched: Vec::with_capacity(TOUCHED),
        }
    }

    pub fn global(&self) -> &Arc<Global> {
        &self.global
    }

    /// A frame dropped for `reason`: counted by reason and recorded in this
    /// worker's ring with its first bytes (a few dozen stores; no parsing).
    #[inline]
    pub fn dropped(&self, reason: DropReason, ingress: Option<PortId>, frame: &[u8], denial: Option<Denial>) {
        self.global.drops.count(reason);
        let time_ns = self.global.drops.clock();
        self.drops.write(&DropRecord { seq: 0, time_ns, reason, ingress, denial, head: Head::of(frame) });
    }

    /// Routes one frame that arrived on `ingress` and delivers it. `vh` is
    /// its offload header (`NONE` for a plain frame).
    pub fn forward(&mut self, plane: &Plane, ingress: PortId, vh: VirtioNetHdr, frame: &mut [u8]) {
        let Ok((src, dst)) = EthernetFrame::new_checked(&*frame).map(|e| (e.src(), e.dst())) else {
            self.global.malformed.fetch_add(1, Relaxed);
            self.dropped(DropReason::Malformed, Some(ingress), frame, None);
            return;
        };
        if let Err(reason) = admissible(&self.global, plane, ingress, &vh, (src, dst), frame) {
            self.dropped(reason, Some(ingress), frame, None);
            return;
        }
        // The policy before anything answers or sends (an ARP answered at
        // the edge is an ARP the rules allowed).
        if !plane.policy.is_empty() {
            let v = plane.policy.decide(plane.network_of(ingress), frame);
            if !v.allow {
                self.global.policy_denied.fetch_add(1, Relaxed);
                let denial = denial(v.why, plane.policy.generation);
                self.dropped(DropReason::PolicyDenied, Some(ingress), frame, denial);
                return;
            }
        }
        if dst.is_group() && self.answer_at_edge(plane, ingress, frame) {
            return;
        }
        let g = &self.global;
        self.cache.lookup(&plane.table, ingress, src, dst, &mut self.decisions);
        if self.decisions.is_empty() {
            g.no_route.fetch_add(1, Relaxed);
            self.dropped(DropReason::NoRoute, Some(ingress), frame, None);
            return;
        }
        g.matrix.count(src, dst, frame.len());
        let len = frame.len();
        let mut finished = None;
        // Offload-capable destinations first, from the untouched frame; then
        // the plain ones, from a frame finished once.
        for plain_pass in [false, true] {
            for i in 0..self.decisions.len() {
                let (to, ri) = self.decisions[i];
                let Some((port, tx, iface)) = destination(plane, to) else { continue };
                let offloads = port.takes_offloads();
                if offloads == plain_pass {
                    continue;
                }
                let ok = if offloads {
                    let h = vh.emit();
                    let parts = [IoSlice::new(&h), IoSlice::new(frame)];
                    port.send(&mut self.scratch, Payload::Frame { parts: &parts, hdr: true })
                } else {
                    let f = *finished.get_or_insert_with(|| self.finish(&vh, frame));
                    match f {
                        Finished::Whole => {
                            let parts = [IoSlice::new(frame)];
                            port.send(&mut self.scratch, Payload::Frame { parts: &parts, hdr: false })
                        }
                        Finished::Segments { hdr_len, mss } => {
                            // Segment i's headers are at i * hdr_len of `seg_heads`.
                            let (heads, payload) = (&self.seg_heads[..], &frame[hdr_len..]);
                            let segs = Segmented { heads, hdr_len, payload, mss };
                            port.send(&mut self.scratch, Payload::Segments(segs))
                        }
                        Finished::Failed => false,
                    }
                };
                sent(&mut self.touched, plane, (tx, iface, ri), ok, len);
                if !ok {
                    let reason = match f_failed(finished) {
                        true => DropReason::OffloadFailed,
                        false => unsent(plane, to, len),
                    };
                    self.dropped(reason, Some(ingress), frame, None);
                }
            }
        }
    }

    /// A VM's ARP request or neighbour solicitation for an address of the
    /// `neigh` table of its network: answered in place and sent back to it
    /// (true); nothing leaves the host. One the table cannot answer is
    /// counted as flooded and routed as any broadcast (false).
    fn answer_at_edge(&mut self, plane: &Plane, ingress: PortId, frame: &mut [u8]) -> bool {
        let g = &self.global;
        let owner = match edge_answer(plane, ingress, frame) {
            Edge::Nothing => return false,
            Edge::Flooded(_) => {
                g.neigh_flooded.fetch_add(1, Relaxed);
                return false;
            }
            Edge::Answer(_, owner) => owner,
        };
        let PortId::Interface(id) = ingress else { return false };
        let Some(iface) = plane.ifaces.get(&id) else { return false };
        if !vnet_wire::neigh::answer(frame, owner) {
            return false;
        }
        g.neigh_answered.fetch_add(1, Relaxed);
        let ok = if iface.port.takes_offloads() {
            let h = VirtioNetHdr::NONE.emit();
            let parts = [IoSlice::new(&h), IoSlice::new(frame)];
            iface.port.send(&mut self.scratch, Payload::Frame { parts: &parts, hdr: true })
        } else {
            iface.port.send(&mut self.scratch, Payload::Frame { parts: &[IoSlice::new(frame)], hdr: false })
        };
        count(&iface.tx, ok, frame.len());
        if ok {
            touch(&mut self.touched, iface);
        }
        true
    }

    /// Makes `frame` plain for destinations without offloads.
    fn finish(&mut self, vh: &VirtioNetHdr, frame: &mut [u8]) -> Finished {
        let g = &self.global;
        if !vh.needs_finishing() {
            return Finished::Whole;
        }
        let (result, counter) = if vh.is_gso() {
            let cut = segment_headers(frame, vh, &mut self.seg_heads);
            (cut.map(|s| Finished::Segments { hdr_len: s.hdr_len, mss: s.mss }), &g.sw_segmented)
        } else {
            (complete_checksum(frame, vh).map(|()| Finished::Whole), &g.sw_checksummed)
        };
        match result {
            Ok(done) => {
                counter.fetch_add(1, Relaxed);
                done
            }
            Err(_) => {
                g.offload_errors.fetch_add(1, Relaxed);
                Finished::Failed
            }
        }
    }

    /// Delivers a frame given as pieces (`[virtio_net_hdr] frame`, `total`
    /// bytes) if every destination is an interface that takes offload
    /// headers; otherwise delivers nothing and returns false (the caller
    /// then makes the frame contiguous and calls [`Forwarder::forward`]).
    pub fn forward_parts(
        &mut self,
        plane: &Plane,
        ingress: PortId,
        parts: &[IoSlice<'_>],
        total: usize,
    ) -> bool {
        let Some(first) = parts.first() else { return false };
        let (Some(vh), Some(eth)) = (VirtioNetHdr::parse(first), first.get(virtio::LEN..)) else {
            return false;
        };
        let Ok(eth) = EthernetFrame::new_checked(eth) else { return false };
        // Anything to drop is left to `forward`, which counts it.
        let len = total - virtio::LEN;
        // (A VM's broadcasts go there too: its limit is counted once, there.)
        let from_vm = !ingress.is_link();
        // A governed network's frames meet its policy in `forward`.
        if vh.validate(len).is_err()
            || !plane.policy.is_empty() && plane.policy.governs(plane.network_of(ingress))
            || from_vm && (eth.dst().is_group() || !source_allowed(plane, ingress, eth.src()))
            || !guard_allowed(plane, ingress, &first[virtio::LEN..])
        {
            return false;
        }
        self.cache.lookup(&plane.table, ingress, eth.src(), eth.dst(), &mut self.decisions);
        // A port that takes no offloads takes a finished frame as well,
        // without the header. A VM's frame may go to a link too (a
        // vhost-user guest's, from its buffers: sent to the wire from guest
        // memory, VNET/P+); a link's frame goes on to interfaces only here.
        let finished = !vh.needs_finishing();
        let capable = |&(p, _): &Decision| {
            (from_vm || !p.is_link())
                && destination(plane, p).is_some_and(|(port, ..)| finished || port.takes_offloads())
        };
        let mut plain = [IoSlice::new(&[]); GSO_MAX_SEGS + 2];
        if self.decisions.is_empty() || !self.decisions.iter().all(capable) || parts.len() > plain.len() {
            return false;
        }
        plain[..parts.len()].copy_from_slice(parts);
        plain[0] = IoSlice::new(&first[virtio::LEN..]);
        self.global.matrix.count(eth.src(), eth.dst(), len);
        for &(to, ri) in &self.decisions {
            let Some((port, tx, iface)) = destination(plane, to) else { continue };
            let payload = if port.takes_offloads() {
                Payload::Frame { parts, hdr: true }
            } else {
                Payload::Frame { parts: &plain[..parts.len()], hdr: false }
            };
            let ok = port.send(&mut self.scratch, payload);
            sent(&mut self.touched, plane, (tx, iface, ri), ok, len);
            if !ok {
                self.dropped(unsent(plane, to, len), Some(ingress), &first[virtio::LEN..], None);
            }
        }
        true
    }

    /// The end of a batch: ends the bursts of the ports that want it, and
    /// publishes this worker's cache counts into the global totals.
    pub fn report(&mut self) {
        for i in self.touched.drain(..) {
            i.port.end_burst();
        }
        let s = self.cache.stats();
        let g = &self.global;
        g.route_cache_hits.fetch_add(s.hits - self.cache_reported.0, Relaxed);
        g.route_cache_misses.fetch_add(s.misses - self.cache_reported.1, Relaxed);
        self.cache_reported = (s.hits, s.misses);
    }
}

/// Whether a frame may be routed at all: its offload header is one every
/// port accepts, its source passes [`source_check`], and a VM's broadcast
/// is within its interface's limit. Counts what it refuses, and says why.
#[inline]
fn admissible(
    g: &Global,
    plane: &Plane,
    ingress: PortId,
    vh: &VirtioNetHdr,
    (src, dst): (MacAddr, MacAddr),
    frame: &[u8],
) -> Result<(), DropReason> {
    if vh.validate(frame.len()).is_err() {
        g.bad_offload_hdr.fetch_add(1, Relaxed);
        return Err(DropReason::BadOffloadHeader);
    }
    let PortId::Interface(id) = ingress else { return Ok(()) };
    let iface = plane.ifaces.get(&id);
    // A standby interface's VM has arrived when it sends from its MAC.
    if let Some(i) = iface {
        i.note_arrival(src, plane.wake.as_ref());
    }
    if let Err(reason) = source_check(plane, ingress, src, frame) {
        let counter = match reason {
            DropReason::SpoofedSourceMac => &g.spoofed_source_mac,
            _ => &g.spoofed_source_ip,
        };
        counter.fetch_add(1, Relaxed);
        return Err(reason);
    }
    // A VM's broadcasts keep within its interface's limit (counted there).
    match !dst.is_group() || iface.is_none_or(|i| i.admit_group()) {
        true => Ok(()),
        false => Err(DropReason::BroadcastLimited),
    }
}

/// The source checks of a frame from `ingress` with source MAC `src`:
/// port security (an interface locked to a MAC takes frames from that MAC
/// only), then the IP source guard (a guarded interface's VM sends from
/// addresses it owns). A frame from a link meets neither. Nothing is
/// counted or changed: the data path ([`admissible`]) and `vnetctl trace`
/// ([`crate::trace`]) both ask this.
#[inline]
pub fn source_check(plane: &Plane, ingress: PortId, src: MacAddr, frame: &[u8]) -> Result<(), DropReason> {
    let PortId::Interface(id) = ingress else { return Ok(()) };
    if plane.ifaces.get(&id).is_some_and(|i| !i.may_send_from(src)) {
        return Err(DropReason::SpoofedSourceMac);
    }
    if !plane.source_ip_allowed(id, frame) {
        return Err(DropReason::SpoofedSourceIp);
    }
    Ok(())
}

/// What the edge makes of a frame from `ingress` ([`edge_answer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    /// Not a VM's ARP request or neighbour solicitation.
    Nothing,
    /// A question for this address the `neigh` table cannot answer: the
    /// frame goes on as any broadcast.
    Flooded(std::net::IpAddr),
    /// Answered in place with this MAC: nothing leaves the host.
    Answer(std::net::IpAddr, MacAddr),
}

/// The edge's answer to a VM's ARP request or neighbour solicitation, from
/// the `neigh` table of its interface's network (the owner asking for its
/// own address, a check of its own, is left to the network). Changes
/// nothing: the data path and `vnetctl trace` both ask it.
pub fn edge_answer(plane: &Plane, ingress: PortId, frame: &[u8]) -> Edge {
    let PortId::Interface(id) = ingress else { return Edge::Nothing };
    let Some(q) = vnet_wire::neigh::question(frame) else { return Edge::Nothing };
    let Some(iface) = plane.ifaces.get(&id) else { return Edge::Nothing };
    let ip = match q {
        vnet_wire::neigh::Question::Arp(a) => std::net::IpAddr::V4(a),
        vnet_wire::neigh::Question::Nd(a) => std::net::IpAddr::V6(a),
    };
    let asker = EthernetFrame::new_checked(frame).map(|e| e.src()).ok();
    match plane.neighbors.get(&(iface.network, ip)).filter(|&&m| Some(m) != asker) {
        Some(&owner) => Edge::Answer(ip, owner),
        None => Edge::Flooded(ip),
    }
}

/// What denied a frame, as a drop record keeps it.
fn denial(why: Why, generation: u64) -> Option<Denial> {
    match why {
        Why::Rule(i) => Some(Denial::Rule { index: i as u32, generation: generation as u32 }),
        Why::Default => Some(Denial::Default),
        Why::Unclassifiable => Some(Denial::Unclassifiable),
        Why::OrphanFragment => Some(Denial::OrphanFragment),
        Why::Isolated(d) => Some(Denial::NetworkPolicy {
            policy: d.policy as u32,
            egress: d.direction == vnet_core::policy::isolation::Direction::Egress,
        }),
        Why::NoPolicy | Why::Established | Why::Reply | Why::Related | Why::Fragment => None,
    }
}

/// Whether the frame could not be finished for plain destinations.
fn f_failed(finished: Option<Finished>) -> bool {
    matches!(finished, Some(Finished::Failed))
}

/// Why destination `to` did not take a frame of `len` bytes: too big for
/// a link that cannot fragment it, else the port refused it.
#[cold]
fn unsent(plane: &Plane, to: PortId, len: usize) -> DropReason {
    match to {
        PortId::Link(id) if plane.links.get(&id).is_some_and(|l| too_big(l, len)) => DropReason::MtuExceeded,
        _ => DropReason::TxFailed,
    }
}

/// Whether a frame of `len` bytes is too big for link `l`: larger than its
/// largest whole frame, on a kind that cannot fragment (all but `vnet`).
pub fn too_big(l: &crate::Link, len: usize) -> bool {
    l.facts().inbound != crate::codec::Inbound::Vnet && len > l.max_whole_frame()
}

/// Port security: a frame from an interface carries the source MAC the
/// interface is locked to, if it is. (And a standby interface's VM has
/// arrived when it sends from its MAC.)
#[inline]
fn source_allowed(plane: &Plane, ingress: PortId, src: MacAddr) -> bool {
    match ingress {
        PortId::Interface(id) => plane.ifaces.get(&id).is_none_or(|i| {
            i.note_arrival(src, plane.wake.as_ref());
            i.may_send_from(src)
        }),
        PortId::Link(_) => true,
    }
}

/// The IP source guard for a frame that may be given on without a copy
/// (`forward_parts`): false when it comes from a guarded interface and
/// the first part does not show a source it owns (`forward` then counts
/// it, or reads it whole).
#[inline]
fn guard_allowed(plane: &Plane, ingress: PortId, frame: &[u8]) -> bool {
    match ingress {
        PortId::Interface(id) => plane.source_ip_allowed(id, frame),
        PortId::Link(_) => true,
    }
}

/// Remembers that `ifc` got a frame in this batch, if its port wants the
/// batch's end; with more such ports than tracked, ends this one's burst now.
/// Where a decision sends: the port, its transmit counters, and the
/// interface (for its end of burst) when it is one.
fn destination(plane: &Plane, to: PortId) -> Option<(&dyn crate::Port, &Counters, Option<&Arc<Iface>>)> {
    match to {
        PortId::Interface(id) => {
            plane.ifaces.get(&id).map(|i| (&*i.port as &dyn crate::Port, &i.tx, Some(i)))
        }
        PortId::Link(id) => plane.links.get(&id).map(|l| (&**l as &dyn crate::Port, &l.tx, None)),
    }
}

/// Counts a frame of `len` bytes given to a destination (`ok`: taken) on
/// its port and its route, and notes an interface that wants its burst ended.
fn sent(
    touched: &mut Vec<Arc<Iface>>,
    plane: &Plane,
    (tx, iface, ri): (&Counters, Option<&Arc<Iface>>, u32),
    ok: bool,
    len: usize,
) {
    count(tx, ok, len);
    if let (true, Some(ifc)) = (ok, iface) {
        touch(touched, ifc);
    }
    if let Some(r) = plane.table.route(ri) {
        count(&r.counters, ok, len);
    }
}

fn touch(touched: &mut Vec<Arc<Iface>>, ifc: &Arc<Iface>) {
    if !ifc.port.batches() || touched.iter().any(|t| Arc::ptr_eq(t, ifc)) {
        return;
    }
    if touched.len() < TOUCHED {
        touched.push(ifc.clone());
    } else {
        ifc.port.end_burst();
    }
}

/// Counts a frame as delivered or dropped.
#[inline]
pub fn count(c: &Counters, ok: bool, len: usize) {
    if ok {
        c.add(len);
    } else {
        c.drop_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::Port;
    use std::sync::atomic::AtomicUsize;

    /// A port that may batch, and counts the bursts it was told ended.
    struct Bursts {
        batches: bool,
        ended: AtomicUsize,
    }

    impl Port for Bursts {
        fn takes_offloads(&self) -> bool {
            false
        }
        fn send(&self, _: &mut Scratch, _: Payload<'_>) -> bool {
            true
        }
        fn batches(&self) -> bool {
            self.batches
        }
        fn end_burst(&self) {
            self.ended.fetch_add(1, Relaxed);
        }
    }

    #[test]
    fn a_batching_port_is_kept_once_for_the_batchs_end_and_past_the_list_ends_its_burst_at_once() {
        let port = |batches| {
            let p = Arc::new(Bursts { batches, ended: AtomicUsize::new(0) });
            (Arc::new(Iface::new(1, "i", None, p.clone())), p)
        };
        let mut touched = Vec::new();
        let (plain, plain_port) = port(false);
        touch(&mut touched, &plain);
        assert!(touched.is_empty(), "a port that does not batch is not kept");
        let ports: Vec<_> = (0..=TOUCHED).map(|_| port(true)).collect();
        for (ifc, _) in &ports {
            touch(&mut touched, ifc);
            touch(&mut touched, ifc);
        }
        assert_eq!(touched.len(), TOUCHED, "each once, up to the list's size");
        assert!(ports[..TOUCHED]
            .iter()
            .all(|(i, p)| p.ended.load(Relaxed) == 0 && touched.iter().any(|t| Arc::ptr_eq(t, i))));
        assert_eq!(
            ports[TOUCHED].1.ended.load(Relaxed),
            2,
            "past the list: its burst ends at once, each time"
        );
        assert_eq!(plain_port.ended.load(Relaxed), 0);
    }
}
