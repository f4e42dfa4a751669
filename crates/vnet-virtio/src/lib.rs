//! The guest-facing half of a vhost-user interface: reading a frame out of
//! a TX descriptor chain and writing one into RX buffers, and the split
//! ring itself as the data path reads and writes it ([`ring`]). These
//! loops are ours (the ring's state between batches is `virtio-queue`'s
//! `Queue`, the memory accesses `vm-memory`'s checked ones) because they
//! are the data path: what a guest may write into its descriptor table
//! reaches them first, and at small frames the ring protocol is most of
//! the cost. They take a bare [`Queue`] and guest memory, so the tests and
//! the `vhost` fuzz target drive them with a fake guest whose descriptor
//! table, rings and buffers are arbitrary bytes (and the fuzz target checks
//! [`ring`] against `virtio-queue` on them).
//!
//! Nothing here trusts the guest: a chain that points outside its memory,
//! mixes directions, or is longer than the buffer is refused as a whole
//! (the caller counts it), and a frame for the guest that does not fit the
//! buffers it posted is not placed and leaves the ring as it was.

pub mod log;
pub mod ring;

pub use log::{DirtyLog, Memory};
pub use ring::{Chain, RingError, Rings};
use std::io::IoSlice;
pub use virtio_queue::desc::split::Descriptor;
pub use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, VolatileMemory};
use vnet_wire::virtio;

/// Most RX buffers one frame may spread over (64 KB in 4 KB pages and more).
pub const MAX_RX_BUFFERS: usize = 64;
/// The guest's header with `VERSION_1` or mergeable buffers: the legacy
/// 10 bytes and `num_buffers`.
pub const HDR_MRG: usize = virtio::LEN + 2;

/// Copies the bytes of a TX chain (the guest's header and frame) into
/// `buf`. `None` when the chain is not one the guest may send: a buffer
/// the device would write, memory outside the guest's, or more bytes than
/// `buf` holds. A buffer within one memory region (every buffer, in
/// practice) is found with one region lookup and copied at once; one that
/// spans regions goes through `vm-memory`'s general path.
pub fn gather<M: GuestMemoryBackend + ?Sized>(
    mem: &M,
    chain: impl Iterator<Item = Descriptor>,
    buf: &mut [u8],
) -> Option<usize> {
    let mut len = 0usize;
    for d in chain {
        let end = len.checked_add(d.len() as usize)?;
        if d.is_write_only() || end > buf.len() {
            return None;
        }
        read_into(mem, d.addr(), &mut buf[len..end])?;
        len = end;
    }
    Some(len)
}

/// Copies guest memory at `addr` into `dst`: a range within one memory
/// region (every buffer, in practice) with one region lookup and one copy,
/// one that spans regions through `vm-memory`'s general path. `None` when
/// the range is not all the guest's.
pub fn read_into<M: GuestMemoryBackend + ?Sized>(mem: &M, addr: GuestAddress, dst: &mut [u8]) -> Option<()> {
    match mem.get_slice(addr, dst.len()) {
        Ok(s) => {
            s.copy_to(dst);
            Some(())
        }
        Err(_) => mem.read_slice(dst, addr).ok(),
    }
}

/// Most guest ranges a TX chain is cut through from ([`split`]).
pub const MAX_TX_RANGES: usize = 32;

/// A TX chain as [`split`] read it: `len` bytes in all, the first `copied`
/// in the caller's buffer, the rest in `ranges` guest ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub len: usize,
    pub copied: usize,
    pub ranges: usize,
}

/// Reads a TX chain for cut-through: its first `head` bytes (the guest's
/// header and the frame's headers, which routing reads) copied into
/// `buf`, the rest left where it is and given as guest ranges in `ranges`,
/// so that it is copied once, by whoever takes the frame (VNET/P+'s
/// cut-through: no bounce buffer). `None` for a chain the guest may not
/// send (as [`gather`]); the ranges are not checked against guest memory
/// here, but by whoever maps them. (When the rest has more pieces than
/// `ranges` holds, the pieces so far are copied after the head and ranges
/// start again: the copied bytes always come first.)
pub fn split<M: GuestMemoryBackend + ?Sized>(
    mem: &M,
    chain: impl Iterator<Item = Descriptor>,
    buf: &mut [u8],
    head: usize,
    ranges: &mut [(GuestAddress, usize); MAX_TX_RANGES],
) -> Option<Split> {
    let (mut len, mut copied, mut n) = (0usize, 0usize, 0usize);
    let copy = |buf: &mut [u8], at: usize, addr: GuestAddress, k: usize| -> Option<()> {
        read_into(mem, addr, buf.get_mut(at..at.checked_add(k)?)?)
    };
    for d in chain {
        let dlen = d.len() as usize;
        len = len.checked_add(dlen)?;
        if d.is_write_only() || len > buf.len() {
            return None;
        }
        // The part of this buffer that is still head: copied.
        let k = head.saturating_sub(copied).min(dlen);
        if k > 0 {
            copy(buf, copied, d.addr(), k)?;
            copied += k;
        }
        let (addr, left) = (d.addr().checked_add(k as u64)?, dlen - k);
        if left == 0 {
            continue;
        }
        if n < MAX_TX_RANGES {
            ranges[n] = (addr, left);
            n += 1;
            continue;
        }
        // Too many pieces: the whole rest into `buf` after all.
        for &(a, l) in ranges[..n].iter() {
            copy(buf, copied, a, l)?;
            copied += l;
        }
        n = 0;
        copy(buf, copied, addr, left)?;
        copied += left;
    }
    Some(Split { len, copied, ranges: n })
}

/// A frame written into the guest's RX ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// RX buffers (chains) it took: `num_buffers`.
    pub buffers: usize,
    /// Used-ring entries the ring refused (a guest that broke its own ring
    /// under us); the frame was written all the same.
    pub bad_used: usize,
}

/// Writes one frame into RX buffers the guest posted in `r`: `parts`
/// concatenated are the 10-byte `virtio_net_hdr` and the frame; `hdr_len`
/// is the header the guest reads (10, or [`HDR_MRG`] with `num_buffers`),
/// `mrg` whether the frame may spread over several chains. `None` when
/// the buffers posted are too few, too small, or not the guest's to give
/// (read-only, outside its memory): nothing is marked used and the ring's
/// position is as before, so the guest loses that frame only. A frame
/// placed is published (the used index stored) before this returns.
pub fn scatter(r: &mut Rings<'_>, parts: &[IoSlice<'_>], hdr_len: usize, mrg: bool) -> Option<Placed> {
    let mem = r.memory();
    let mut src = Stream::new(parts, hdr_len);
    let mut used = [(0u16, 0u32); MAX_RX_BUFFERS];
    let mut n = 0;
    // The first buffer (where `num_buffers` goes), looked up once.
    let mut first: Option<(GuestAddress, Option<ring::Slice<'_>>)> = None;
    let mut failed = false;
    while !src.done() {
        let head = if n < MAX_RX_BUFFERS && (n == 0 || mrg) { r.pop() } else { None };
        let Some(head) = head else {
            failed = true;
            break;
        };
        let mut written = 0u32;
        for d in r.chain(head) {
            if src.done() {
                break;
            }
            if !d.is_write_only() || (first.is_none() && (d.len() as usize) < hdr_len) {
                failed = true;
                break;
            }
            let slice = mem.get_slice(d.addr(), d.len() as usize).ok();
            first.get_or_insert((d.addr(), slice));
            match src.write_to(mem, d.addr(), d.len() as usize, slice) {
                Some(w) => written = written.saturating_add(w as u32),
                None => {
                    failed = true;
                    break;
                }
            }
        }
        used[n] = (head, written);
        n += 1;
        if failed {
            break;
        }
    }
    if failed {
        r.unpop(n as u16);
        return None;
    }
    if hdr_len == HDR_MRG {
        let count = (n as u16).to_le();
        match first {
            Some((_, Some(s))) => {
                let _ = s.get_ref::<u16>(virtio::LEN).map(|v| v.store(count));
            }
            Some((a, None)) => {
                if let Some(a) = a.checked_add(virtio::LEN as u64) {
                    let _ = mem.write_obj(count, a);
                }
            }
            None => {}
        }
    }
    let bad_used = used[..n].iter().filter(|&&(head, len)| !r.used(head, len)).count();
    r.publish();
    Some(Placed { buffers: n, bad_used })
}

/// The bytes of one frame for the guest: the header (`hdr_len` bytes: the
/// 10 given and, for 12, `num_buffers` patched later) and the rest, taken
/// from `parts` in order.
struct Stream<'a> {
    parts: &'a [IoSlice<'a>],
    /// Part and offset of the next byte.
    part: usize,
    off: usize,
    /// Padding bytes still to emit after the 10-byte header.
    pad: usize,
    /// Header bytes of `parts` still to come before the padding.
    hdr_left: usize,
}

impl<'a> Stream<'a> {
    fn new(parts: &'a [IoSlice<'a>], hdr_len: usize) -> Self {
        let pad = hdr_len.saturating_sub(virtio::LEN);
        let mut s = Stream { parts, part: 0, off: 0, pad, hdr_left: virtio::LEN };
        s.skip_empty();
        s
    }

    fn skip_empty(&mut self) {
        while self.part < self.parts.len() && self.off >= self.parts[self.part].len() {
            self.part += 1;
            self.off = 0;
        }
    }

    fn done(&self) -> bool {
        self.pad == 0 && self.part >= self.parts.len()
    }

    /// Writes up to `room` bytes at `addr`; returns how many, or None when
    /// guest memory refused the write. A buffer within one memory region
    /// comes looked up (`slice`, all of it) and is written piece by piece;
    /// one that spans regions goes through `vm-memory`'s general path,
    /// piece by piece.
    fn write_to<M: GuestMemoryBackend + ?Sized>(
        &mut self,
        mem: &M,
        addr: GuestAddress,
        room: usize,
        slice: Option<ring::Slice<'_>>,
    ) -> Option<usize> {
        if let Some(buf) = slice {
            return self.fill(room, |w, b| {
                buf.subslice(w, b.len()).ok()?.copy_from(b);
                Some(())
            });
        }
        self.fill(room, |w, b| mem.write_slice(b, addr.checked_add(w as u64)?).ok())
    }

    /// Emits up to `room` bytes, each piece through `put(offset, bytes)`.
    fn fill(&mut self, room: usize, mut put: impl FnMut(usize, &[u8]) -> Option<()>) -> Option<usize> {
        let mut w = 0;
        while w < room && !self.done() {
            if self.hdr_left == 0 && self.pad > 0 {
                let k = self.pad.min(room - w).min(2);
                put(w, &[0u8; 2][..k])?;
                self.pad -= k;
                w += k;
                continue;
            }
            if self.part >= self.parts.len() {
                // Fewer than 10 header bytes were given: the padding follows.
                self.hdr_left = 0;
                continue;
            }
            let p = &self.parts[self.part][self.off..];
            let mut k = p.len().min(room - w);
            if self.hdr_left > 0 {
                k = k.min(self.hdr_left);
                self.hdr_left -= k;
            }
            put(w, &p[..k])?;
            self.off += k;
            w += k;
            self.skip_empty();
        }
        Some(w)
    }
}

/// A fake guest for tests and the fuzz target: one region of memory
/// holding a split virtqueue (descriptor table, available and used rings)
/// and the buffers, laid out as a driver would, and the device's
/// [`Queue`] over it.
pub mod fake {
    use crate::Memory;
    use virtio_queue::{Queue, QueueT};
    use vm_memory::{Bytes, GuestAddress};

    /// Guest memory size.
    pub const MEM: usize = 0x1_0000;
    /// Where the descriptor table, the rings and the buffers start.
    pub const DESC: u64 = 0;
    pub const AVAIL: u64 = 0x1000;
    pub const USED: u64 = 0x2000;
    pub const BUFFERS: u64 = 0x3000;
    /// Largest queue the layout holds (256 descriptors fill 4 KB).
    pub const MAX_SIZE: u16 = 256;
    /// Descriptor flags.
    pub const NEXT: u16 = 1;
    pub const WRITE: u16 = 2;
    pub const INDIRECT: u16 = 4;

    /// A descriptor as the guest writes it, in a queue's table or an
    /// indirect one.
    pub fn raw_desc(addr: u64, len: u32, flags: u16, next: u16) -> [u8; 16] {
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        raw[14..].copy_from_slice(&next.to_le_bytes());
        raw
    }

    /// A guest and the device's view of one of its queues.
    pub struct Guest {
        pub mem: Memory,
        pub queue: Queue,
        /// Descriptors and chains the driver has posted.
        next_desc: u16,
        posted: u16,
    }

    impl Guest {
        /// An empty queue of `size` (rounded down to a power of two, 1 to
        /// [`MAX_SIZE`]), with `EVENT_IDX` or not.
        pub fn new(size: u16, event_idx: bool) -> Guest {
            let size = 1u16 << (15 - size.clamp(1, MAX_SIZE).leading_zeros() as u16);
            // An anonymous mapping of 64 KB cannot fail but on a machine out
            // of memory; the tests and the fuzzer have nothing else to do then.
            let mem = Memory::from_ranges(&[(GuestAddress(0), MEM)]).expect("64 KB of guest memory");
            let mut queue = Queue::new(MAX_SIZE).expect("a queue of the layout's size");
            queue.set_size(size);
            queue.set_desc_table_address(Some(DESC as u32), Some(0));
            queue.set_avail_ring_address(Some(AVAIL as u32), Some(0));
            queue.set_used_ring_address(Some(USED as u32), Some(0));
            queue.set_event_idx(event_idx);
            queue.set_ready(true);
            Guest { mem, queue, next_desc: 0, posted: 0 }
        }

        /// A guest whose memory is `image` (the rest zero), its queue's size
        /// and `EVENT_IDX` from `size` and `event_idx`: whatever a guest
        /// could have written.
        pub fn from_image(size: u16, event_idx: bool, image: &[u8]) -> Guest {
            let g = Guest::new(size, event_idx);
            let _ = g.mem.write_slice(&image[..image.len().min(MEM)], GuestAddress(0));
            g
        }

        /// Writes descriptor `i` of the queue's table.
        pub fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
            self.write(DESC + 16 * u64::from(i), &raw_desc(addr, len, flags, next));
        }

        /// Writes `data` at `addr` (what does not fit is left out).
        pub fn write(&self, addr: u64, data: &[u8]) {
            let _ = self.mem.write_slice(data, GuestAddress(addr));
        }

        /// Posts a chain of buffers `(addr, len)`, written by the device
        /// (`write`) or read by it, and makes it available.
        pub fn post(&mut self, bufs: &[(u64, u32)], write: bool) -> u16 {
            let head = self.next_desc;
            for (k, &(addr, len)) in bufs.iter().enumerate() {
                let i = self.next_desc;
                let more = k + 1 < bufs.len();
                let flags = if write { WRITE } else { 0 } | if more { NEXT } else { 0 };
                self.desc(i, addr, len, flags, i.wrapping_add(1) % self.queue.size());
                self.next_desc = i.wrapping_add(1) % self.queue.size();
            }
            self.make_available(head);
            head
        }

        /// Puts `head` in the available ring and publishes it.
        pub fn make_available(&mut self, head: u16) {
            let slot = self.posted % self.queue.size();
            let _ = self.mem.write_obj(head.to_le(), GuestAddress(AVAIL + 4 + 2 * u64::from(slot)));
            self.posted = self.posted.wrapping_add(1);
            let _ = self.mem.write_obj(self.posted.to_le(), GuestAddress(AVAIL + 2));
        }

        /// The used ring's index and entry `i` (head, length).
        pub fn used_idx(&self) -> u16 {
            self.mem.read_obj::<u16>(GuestAddress(USED + 2)).map(u16::from_le).unwrap_or(0)
        }

        pub fn used(&self, i: u16) -> (u32, u32) {
            let at = USED + 4 + 8 * u64::from(i % self.queue.size());
            let id = self.mem.read_obj::<u32>(GuestAddress(at)).unwrap_or(0);
            let len = self.mem.read_obj::<u32>(GuestAddress(at + 4)).unwrap_or(0);
            (u32::from_le(id), u32::from_le(len))
        }

        /// Runs `f` on the queue's rings opened at its position (as the
        /// device does for one batch), and writes the position back.
        /// `None` when they do not open.
        pub fn rings<T>(&mut self, f: impl FnOnce(&mut super::Rings<'_>) -> T) -> Option<T> {
            let mut r = super::Rings::open(&self.queue, &self.mem).ok()?;
            let t = f(&mut r);
            r.close(&mut self.queue);
            Some(t)
        }

        /// `len` bytes of guest memory at `addr`.
        pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
            let mut v = vec![0u8; len];
            let _ = self.mem.read_slice(&mut v, GuestAddress(addr));
            v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::*;
    use super::*;

    fn mem() -> crate::Memory {
        crate::Memory::from_ranges(&[(GuestAddress(0), 1 << 16)]).unwrap()
    }

    #[test]
    fn stream_pads_the_header_and_spans_buffers() {
        let m = mem();
        let hdr = [1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10];
        let body: Vec<u8> = (0..100u8).collect();
        // Header and the first bytes of the frame in one part, as a GRO batch has it.
        let mut p0 = hdr.to_vec();
        p0.extend_from_slice(&body[..30]);
        let parts = [IoSlice::new(&p0), IoSlice::new(&[]), IoSlice::new(&body[30..])];
        let mut s = Stream::new(&parts, HDR_MRG);
        // Buffers of 7, 20 and 200 bytes.
        assert_eq!(s.write_to(&m, GuestAddress(0x1000), 7, None), Some(7));
        assert_eq!(
            s.write_to(&m, GuestAddress(0x2000), 20, m.get_slice(GuestAddress(0x2000), 20).ok()),
            Some(20)
        );
        assert_eq!(s.write_to(&m, GuestAddress(0x3000), 200, None), Some(112 - 27));
        assert!(s.done());
        let mut out = [0u8; 112];
        m.read_slice(&mut out[..7], GuestAddress(0x1000)).unwrap();
        m.read_slice(&mut out[7..27], GuestAddress(0x2000)).unwrap();
        m.read_slice(&mut out[27..], GuestAddress(0x3000)).unwrap();
        assert_eq!(&out[..10], &hdr);
        assert_eq!(&out[10..12], &[0, 0]);
        assert_eq!(&out[12..], &body[..]);
    }

    #[test]
    fn stream_refuses_memory_the_guest_does_not_have() {
        let m = mem();
        let d = [0u8; 64];
        let parts = [IoSlice::new(&d)];
        let mut s = Stream::new(&parts, virtio::LEN);
        assert_eq!(s.write_to(&m, GuestAddress((1 << 16) - 8), 64, None), None);
        let mut s = Stream::new(&parts, virtio::LEN);
        assert_eq!(s.write_to(&m, GuestAddress(u64::MAX - 4), 64, None), None);
    }

    fn frame(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    /// The next TX chain, gathered.
    fn pop(g: &mut Guest) -> Option<usize> {
        let mut buf = [0u8; 4096];
        g.rings(|r| r.pop().and_then(|head| gather(r.memory(), r.chain(head), &mut buf))).flatten()
    }

    /// The next chain, split.
    fn pop_split(
        g: &mut Guest,
        buf: &mut [u8],
        head_len: usize,
        ranges: &mut [(GuestAddress, usize); MAX_TX_RANGES],
    ) -> Option<Split> {
        g.rings(|r| r.pop().and_then(|head| split(r.memory(), r.chain(head), buf, head_len, ranges)))
            .flatten()
    }

    fn place(g: &mut Guest, parts: &[IoSlice<'_>], hdr_len: usize, mrg: bool) -> Option<Placed> {
        g.rings(|r| scatter(r, parts, hdr_len, mrg)).flatten()
    }

    #[test]
    fn a_tx_chain_is_gathered_in_order_and_a_bad_one_refused_whole() {
        let mut g = Guest::new(16, false);
        let _ = g.mem.write_slice(&frame(300), GuestAddress(BUFFERS));
        g.post(&[(BUFFERS, 100), (BUFFERS + 100, 200)], false);
        let mut buf = [0u8; 4096];
        let got = g.rings(|r| {
            let head = r.pop().unwrap();
            gather(r.memory(), r.chain(head), &mut buf)
        });
        assert_eq!(got, Some(Some(300)));
        assert_eq!(&buf[..300], &frame(300)[..]);
        // A buffer the device would write, memory the guest does not have,
        // more than the frame buffer holds: each refuses its chain.
        g.post(&[(BUFFERS, 10), (BUFFERS + 10, 10)], true);
        g.post(&[(MEM as u64 - 8, 16)], false);
        g.post(&[(BUFFERS, 4000), (BUFFERS, 200)], false);
        g.post(&[(u64::MAX - 4, 16)], false);
        for _ in 0..4 {
            assert_eq!(pop(&mut g), None);
        }
        assert_eq!(g.rings(|r| r.pop()), Some(None));
    }

    #[test]
    fn a_split_chain_copies_the_head_and_leaves_the_rest_in_order() {
        let mut g = Guest::new(64, false);
        let f = frame(3000);
        let _ = g.mem.write_slice(&f, GuestAddress(BUFFERS));
        let mut ranges = [(GuestAddress(0), 0); MAX_TX_RANGES];
        let mut buf = [0u8; 4096];
        // The head ends inside the second buffer.
        g.post(&[(BUFFERS, 100), (BUFFERS + 100, 900), (BUFFERS + 1000, 2000)], false);
        let sp = pop_split(&mut g, &mut buf, 140, &mut ranges).unwrap();
        assert_eq!(sp, Split { len: 3000, copied: 140, ranges: 2 });
        assert_eq!(&buf[..140], &f[..140]);
        assert_eq!(ranges[..2], [(GuestAddress(BUFFERS + 140), 860), (GuestAddress(BUFFERS + 1000), 2000)]);
        // More pieces than ranges: the copied bytes still come first, in order.
        let pieces: Vec<(u64, u32)> = (0..40).map(|i| (BUFFERS + 50 * i, 50)).collect();
        g.post(&pieces, false);
        let sp = pop_split(&mut g, &mut buf, 60, &mut ranges).unwrap();
        assert_eq!(sp.len, 2000);
        let mut whole = buf[..sp.copied].to_vec();
        for &(a, l) in &ranges[..sp.ranges] {
            whole.extend_from_slice(&g.read(a.0, l));
        }
        assert_eq!(whole, &f[..2000]);
        // A chain the guest may not send is refused, as by gather.
        g.post(&[(BUFFERS, 10), (BUFFERS + 10, 10)], true);
        assert_eq!(pop_split(&mut g, &mut buf, 60, &mut ranges), None);
    }

    #[test]
    fn an_indirect_chain_is_gathered_and_a_loop_ends() {
        let mut g = Guest::new(8, false);
        // An indirect table of two descriptors at BUFFERS + 0x1000.
        let table = BUFFERS + 0x1000;
        g.write(table, &raw_desc(BUFFERS, 60, NEXT, 1));
        g.write(table + 16, &raw_desc(BUFFERS + 60, 40, 0, 0));
        g.desc(0, table, 32, INDIRECT, 0);
        g.make_available(0);
        assert_eq!(pop(&mut g), Some(100));
        // A chain whose last descriptor points back at its first.
        g.desc(1, BUFFERS, 10, NEXT, 2);
        g.desc(2, BUFFERS, 10, NEXT, 1);
        g.make_available(1);
        assert!(pop(&mut g).unwrap_or(0) <= 80, "a loop is cut at the queue size");
    }

    #[test]
    fn a_frame_spreads_over_mergeable_buffers_and_says_how_many() {
        let mut g = Guest::new(16, true);
        for k in 0..4 {
            g.post(&[(BUFFERS + 0x1000 * k, 1500)], true);
        }
        let f = frame(3000);
        let hdr = [7u8; virtio::LEN];
        let parts = [IoSlice::new(&hdr), IoSlice::new(&f[..1000]), IoSlice::new(&f[1000..])];
        let placed = place(&mut g, &parts, HDR_MRG, true).unwrap();
        assert_eq!(placed, Placed { buffers: 3, bad_used: 0 });
        assert_eq!(g.used_idx(), 3);
        assert_eq!(g.used(0), (0, 1500));
        assert_eq!(g.used(2), (2, 12));
        let first = g.read(BUFFERS, 1500);
        assert_eq!(&first[..10], &hdr);
        assert_eq!(u16::from_le_bytes([first[10], first[11]]), 3, "num_buffers");
        assert_eq!(&first[12..], &f[..1488]);
        assert_eq!(g.read(BUFFERS + 0x1000, 1500), f[1488..2988].to_vec());
        assert_eq!(g.read(BUFFERS + 0x2000, 12), f[2988..].to_vec());
    }

    #[test]
    fn a_frame_that_does_not_fit_leaves_the_ring_as_it_was() {
        let f = frame(3000);
        let hdr = [0u8; virtio::LEN];
        let parts = [IoSlice::new(&hdr), IoSlice::new(&f)];
        // Too few buffers; without mergeable buffers, a chain too short; a
        // buffer the device may not write; a first buffer shorter than the
        // header; a buffer outside guest memory.
        type Case<'a> = (&'a [(u64, u32, bool)], bool);
        let cases: [Case; 5] = [
            (&[(BUFFERS, 1500, true)], true),
            (&[(BUFFERS, 1500, true), (BUFFERS + 0x1000, 1500, true)], false),
            (&[(BUFFERS, 1500, true), (BUFFERS + 0x1000, 1500, false), (BUFFERS + 0x2000, 1500, true)], true),
            (&[(BUFFERS, 8, true), (BUFFERS + 0x1000, 4000, true)], true),
            (&[(BUFFERS, 1500, true), (MEM as u64 - 100, 1500, true), (BUFFERS + 0x2000, 1500, true)], true),
        ];
        for (bufs, mrg) in cases {
            let mut g = Guest::new(16, false);
            for &(a, l, w) in bufs {
                g.post(&[(a, l)], w);
            }
            assert_eq!(place(&mut g, &parts, HDR_MRG, mrg), None, "{bufs:?}");
            assert_eq!(g.queue.next_avail(), 0, "{bufs:?}");
            assert_eq!(g.used_idx(), 0, "{bufs:?}");
        }
    }

    #[test]
    fn a_header_given_short_is_padded_not_overrun() {
        let mut g = Guest::new(4, false);
        g.post(&[(BUFFERS, 64)], true);
        let parts = [IoSlice::new(&[1u8; 4])];
        assert_eq!(place(&mut g, &parts, HDR_MRG, false), Some(Placed { buffers: 1, bad_used: 0 }));
        assert_eq!(g.used(0), (0, 6));
    }
}
