//! The bodies of vnet's fuzz targets, one function per decoder or parser
//! an attacker (a guest, a peer, a stranger on the underlay, a control
//! client, a config file) can feed. `fuzz/` (cargo-fuzz, `scripts/fuzz.sh
//! MINUTES`) runs each under libFuzzer; `tests/replay.rs` runs every input
//! of the committed corpus (`fuzz/corpus/TARGET/`) and every past crash
//! (`fuzz/regressions/TARGET/`) through the same function as an ordinary
//! test, so CI checks them without a fuzzer. Each body must not panic,
//! whatever the bytes; the checks inside are the properties that must hold.

use vnet_engine::sim::Net;
use vnet_virtio::fake::Guest;
use vnet_virtio::{QueueT, HDR_MRG, MAX_RX_BUFFERS};
use vnet_wire::offload;
use vnet_wire::reasm::{self, Reassembler};
use vnet_wire::virtio::VirtioNetHdr;
use vnet_wire::vnet::{VnetPacket, VnetRepr};

/// A target's body.
pub type Body = fn(&[u8]);

/// Every target: its name (the corpus directory) and its body.
pub const TARGETS: &[(&str, Body)] = &[
    ("wire", wire),
    ("control", control),
    ("offload", offload_input),
    ("stream", stream),
    ("reasm", reassembly),
    ("vhost", vhost),
];

/// The host under test in [`wire`]: one link of every kind the underlay
/// can reach it by, a VM, routes both ways.
pub fn wire_config() -> String {
    format!(
        "listen udp 10.0.0.1:9000\n\
         listen vxlan 10.0.0.1:4789\n\
         interface vm0 tap t0 mac 52:54:00:00:00:01\n\
         link raw udp 10.0.0.2 format raw\n\
         link vn udp 10.0.0.3 format vnet\n\
         link sec udp 10.0.0.4 peer-key {}\n\
         link vx vxlan 10.0.0.5 vni 42\n\
         route any ff:ff:ff:ff:ff:ff -> interface vm0\n\
         route any ff:ff:ff:ff:ff:ff -> link vn\n\
         route any 52:54:00:00:00:01 -> interface vm0\n\
         route any 52:54:00:00:00:02 -> link raw\n\
         route any 52:54:00:00:00:03 -> link vn\n\
         route any 52:54:00:00:00:04 -> link sec\n\
         route any 52:54:00:00:00:05 -> link vx\n",
        Net::public_key("10.0.0.4")
    )
}

/// The records of an input: `[tag][len lo][len hi][len bytes]...`, the
/// last one cut short if the input ends.
fn records(data: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    let mut rest = data;
    std::iter::from_fn(move || {
        let [tag, lo, hi, more @ ..] = rest else { return None };
        let len = (u16::from_le_bytes([*lo, *hi]) as usize).min(more.len());
        let (record, tail) = more.split_at(len);
        rest = tail;
        Some((*tag, record))
    })
}

/// Where a datagram of [`wire`] comes from: the selector byte's low 3 bits.
const SOURCES: [(&str, bool); 6] = [
    ("10.0.0.2:9000", false),
    ("10.0.0.3:9000", false),
    ("10.0.0.4:9000", false),
    ("10.0.0.5:50000", true),
    ("10.0.0.9:9000", false),
    ("10.0.0.3:41000", true),
];

/// The underlay: datagrams from the host's peers (a raw, a `vnet`, a
/// secured and a VXLAN link) and from a stranger, through the whole receive
/// path of a host in the simulator (attribution, decapsulation, the secured
/// handshake and records, reassembly, offload checks, routing to the VM).
/// Input: records of `[source | 0x80 = a second passes first][len lo][len hi][bytes]`.
pub fn wire(data: &[u8]) {
    let mut net = Net::new(1);
    let Ok(h) = net.add_host("10.0.0.1", &wire_config()) else {
        panic!("the wire target's config is refused")
    };
    for (n, (sel, dgram)) in records(data).enumerate() {
        if n >= 64 {
            break;
        }
        if sel & 0x80 != 0 {
            net.advance(1_000_000_000);
        }
        let (from, vxlan) = SOURCES[(sel & 7) as usize % SOURCES.len()];
        if vxlan {
            net.inject_vxlan(from, "10.0.0.1:4789", dgram.to_vec());
        } else {
            net.inject(from, "10.0.0.1:9000", dgram.to_vec());
        }
        net.run(64);
    }
    // Whatever arrived, what reached the VM is whole Ethernet frames.
    for d in net.take(h, "vm0") {
        assert!(d.frame.len() >= 14, "a frame of {} bytes reached the VM", d.frame.len());
    }
}

/// The control language: a config file through the parser and the state
/// (every declaration checked, the whole applied atomically), and the same
/// text as control lines one by one (sections, transactions' lines). An
/// error must name a line of the input.
pub fn control(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let lines = text.lines().count().max(1) as u32;
    match vnet_control::parse(text) {
        Ok(cmds) => {
            if let Err(e) = vnet_control::State::default().apply_all(&cmds) {
                assert!(e.pos.line >= 1 && e.pos.line <= lines, "error at line {} of {lines}", e.pos.line);
            }
        }
        Err(e) => assert!(e.pos.line >= 1 && e.pos.line <= lines, "error at line {} of {lines}", e.pos.line),
    }
    let mut section = vnet_control::Section::default();
    for (i, line) in text.lines().enumerate() {
        let _ = vnet_control::parse_line(line, i as u32 + 1, &mut section);
    }
}

/// A guest's offload header and frame: checksum completion, TCP
/// segmentation (every segment within the MSS and the output buffer),
/// and the inference of an offload header from a plain frame.
/// Input: 10 bytes of header fields, then the frame.
pub fn offload_input(data: &[u8]) {
    let Some((h, frame)) = data.split_first_chunk::<10>() else { return };
    let hdr = VirtioNetHdr {
        flags: h[0],
        gso_type: h[1],
        hdr_len: u16::from_le_bytes([h[2], h[3]]),
        gso_size: u16::from_le_bytes([h[4], h[5]]),
        csum_start: u16::from_le_bytes([h[6], h[7]]),
        csum_offset: u16::from_le_bytes([h[8], h[9]]),
    };
    let mut f = frame.to_vec();
    let _ = offload::complete_checksum(&mut f, &hdr);
    let mut out = vec![0u8; 70_000];
    let mut ranges = Vec::new();
    if offload::segment_tcp(frame, &hdr, &mut out, &mut ranges).is_ok() {
        for r in &ranges {
            assert!(r.start <= r.end && r.end <= out.len());
        }
    }
    let _ = offload::infer(frame, hdr.gso_size);
}

/// A TCP link's byte stream, cut anywhere: records come out whole or the
/// stream ends with an error; the deframer never holds more than its buffer.
/// Input: the stream; its first byte sets the read size.
pub fn stream(data: &[u8]) {
    let Some((&cut, bytes)) = data.split_first() else { return };
    let chunk = usize::from(cut).max(1) * 7;
    let mut d = vnet_engine::codec::stream::Deframer::default();
    for piece in bytes.chunks(chunk) {
        let mut rest = piece;
        while !rest.is_empty() {
            let took = d.push(rest);
            rest = &rest[took..];
            loop {
                match d.next_record() {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) => return,
                }
            }
            if took == 0 {
                return;
            }
        }
    }
}

/// `vnet` datagrams through the header parser and a small reassembler:
/// a fragment that passes the checks lies inside its frame, a completed
/// frame is exactly the frame length its header announced,
/// and the reassembler never holds more frames than its slots.
/// Input: records of `[source][len lo][len hi][datagram]`.
pub fn reassembly(data: &[u8]) {
    let cfg = reasm::Config { slots: 4, max_frame: 65_535, timeout_ns: 1_000_000, per_source: 2 };
    let mut r = Reassembler::new(cfg);
    let mut now = 0;
    for (src, dgram) in records(data) {
        now += 100_000;
        let Ok(p) = VnetPacket::new_checked(dgram) else { continue };
        let repr = VnetRepr::parse(&p);
        // As the receive path does: a datagram that carries no frame (a
        // probe, a relayed datagram), or a whole frame, never goes to
        // reassembly (their length and offset fields mean nothing).
        if repr.flags.is_control() || repr.is_whole(p.payload().len()) {
            continue;
        }
        assert!(repr.offset as usize + p.payload().len() <= repr.frame_len as usize);
        if let reasm::Outcome::Complete(f) = r.push(now, u64::from(src & 3), &repr, p.payload()) {
            assert_eq!(f.len(), repr.frame_len as usize);
        }
        assert!(r.in_progress() <= 4);
    }
}

/// A guest's virtqueue as vhost-user hands it to vnetd: descriptor table,
/// available ring and buffers are whatever the guest wrote. Its TX chains
/// are taken through vnetd's own ring code ([`vnet_virtio::Rings`]) and, on
/// a copy of the same memory, through `virtio-queue`'s: the same heads in
/// the same order, each chain's descriptors the same (or, where ours
/// refuses an indirect table that is not all guest memory, a prefix of
/// theirs), the same used ring after, and with `EVENT_IDX` the same answer
/// to whether the guest wants a signal. Each chain goes through
/// [`vnet_virtio::gather`] and the guest header parser. Then, over the same
/// ring, frames for the guest of 60, 1514 and 64000 bytes go through
/// [`vnet_virtio::scatter`], with and without mergeable buffers. A gathered
/// chain fits the buffer; a frame placed takes 1 to 64 chains (one without
/// mergeable buffers); a frame refused leaves the ring where it was.
/// Input: `[queue size - 1][flags: 1 = EVENT_IDX][guest memory]`.
pub fn vhost(data: &[u8]) {
    use vnet_virtio::fake::{MAX_SIZE, USED};
    let [size, flags, image @ ..] = data else { return };
    let (size, event_idx) = (u16::from(*size) + 1, flags & 1 != 0);
    let mut g = Guest::from_image(size, event_idx, image);
    let mut theirs = Guest::from_image(size, event_idx, image);
    let raw = |d: &vnet_virtio::Descriptor| (d.addr().0, d.len(), d.flags(), d.next());
    let mut buf = vec![0u8; 65_550];
    let opened = g.rings(|r| {
        let mut last = r.next_used();
        for _ in 0..2 * MAX_SIZE {
            let want = theirs
                .queue
                .pop_descriptor_chain(&theirs.mem)
                .map(|c| (c.head_index(), c.map(|d| raw(&d)).collect::<Vec<_>>()));
            let got = r.pop().map(|h| {
                let mut c = r.chain(h);
                (h, c.by_ref().map(|d| raw(&d)).collect::<Vec<_>>(), c.table_refused())
            });
            let (Some((head, want)), Some((h, got, refused))) = (want, got) else {
                assert!(
                    r.pop().is_none() && theirs.queue.pop_descriptor_chain(&theirs.mem).is_none(),
                    "one ring had a chain the other did not"
                );
                break;
            };
            assert_eq!(head, h, "chain heads");
            assert!(want.starts_with(&got), "chain at {head}: ours {got:?}, virtio-queue's {want:?}");
            assert!(
                got.len() == want.len() || refused,
                "ours ended the chain at {head} early: {got:?} / {want:?}"
            );
            if let Some(n) = vnet_virtio::gather(r.memory(), r.chain(head), &mut buf) {
                assert!(n <= buf.len());
                if n >= HDR_MRG {
                    let _ = VirtioNetHdr::parse(&buf[..n]);
                }
            }
            assert_eq!(theirs.queue.add_used(&theirs.mem, head, 7).is_ok(), r.used(head, 7), "used {head}");
        }
        r.publish();
        if event_idx {
            let want = theirs.queue.needs_notification(&theirs.mem).unwrap_or(true);
            assert_eq!(r.needs_signal(&mut last), want, "whether the guest wants a signal");
        }
    });
    if opened.is_some() {
        let area = 4 + 8 * usize::from(g.queue.size());
        assert_eq!(g.read(USED, area), theirs.read(USED, area), "the used rings");
        assert_eq!(g.queue.next_avail(), theirs.queue.next_avail());
    }
    let frame = vec![0x5au8; 64_000];
    for (i, (len, mrg)) in [(60, true), (1514, false), (64_000, true), (1514, true)].into_iter().enumerate() {
        g.queue.set_next_avail(0);
        let hdr = [i as u8; 10];
        let parts = [std::io::IoSlice::new(&hdr), std::io::IoSlice::new(&frame[..len])];
        let hdr_len = if mrg { HDR_MRG } else { 10 };
        match g.rings(|r| vnet_virtio::scatter(r, &parts, hdr_len, mrg)).flatten() {
            Some(p) => {
                assert!(p.buffers >= 1 && p.buffers <= MAX_RX_BUFFERS && (mrg || p.buffers == 1), "{p:?}")
            }
            None => assert_eq!(g.queue.next_avail(), 0, "a refused frame moved the ring"),
        }
    }
}
