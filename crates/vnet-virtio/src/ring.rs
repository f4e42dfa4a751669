//! A split virtqueue read and written in place: the descriptor table, the
//! available ring and the used ring each looked up in guest memory once,
//! when a batch opens them ([`Rings::open`]), then read and written by
//! offset. `virtio-queue`'s `Queue` looks each of them up again on every
//! access (the avail index, each ring entry, each descriptor, each used
//! entry and index): at 64-byte frames those lookups and the general
//! copies behind them were the largest share of vnetd's time (docs/PROFILE.md).
//!
//! The `Queue` stays the owner of the ring's state between batches (the
//! vhost-user protocol reads and sets it: `GET_VRING_BASE`, notification
//! flags), so a batch starts from its `next_avail`/`next_used` and writes
//! them back in [`Rings::close`]. What `Queue` cannot be told, how many
//! used entries were added since the guest was last considered for a
//! signal, the caller keeps (`last` in [`Rings::needs_signal`]).
//!
//! Nothing the guest writes is trusted, as in `virtio-queue`: the areas
//! must lie in guest memory and be aligned as the spec requires (else the
//! ring is not opened), an available index more than a ring ahead is
//! refused, a chain ends at an index out of the table, after as many
//! descriptors as the table has, at a second level of indirection, or
//! where its bytes would pass 4 GiB; every read and write is bounds
//! checked by `vm-memory`'s volatile slices.

use crate::log::{DirtyLog, Memory};
use std::sync::atomic::{fence, Ordering};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::bitmap::RefSlice;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, VolatileMemory};

/// A slice of guest memory whose writes are logged while QEMU asks.
pub(crate) type Slice<'m> = vm_memory::VolatileSlice<'m, RefSlice<'m, DirtyLog>>;

/// Bytes of a descriptor.
const DESC: usize = 16;
/// The flags and index before either ring's entries.
const HEADER: usize = 4;
/// Bytes of a used-ring entry (id, len).
const USED_ELEM: usize = 8;

/// Why a queue's rings were not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingError {
    /// Not set up, or switched off, by the front end.
    NotReady,
    /// An area is not all guest memory (in one region), or not aligned.
    BadArea,
}

/// A queue's three areas for one batch, and where the device is in them.
pub struct Rings<'m> {
    mem: &'m Memory,
    desc: Slice<'m>,
    avail: Slice<'m>,
    used: Slice<'m>,
    size: u16,
    event_idx: bool,
    next_avail: u16,
    next_used: u16,
    /// The guest's available index as last read.
    avail_idx: u16,
    /// Used entries written but not yet published.
    unpublished: bool,
}

impl<'m> Rings<'m> {
    /// The rings of `q` in `mem`, at the queue's position.
    pub fn open(q: &Queue, mem: &'m Memory) -> Result<Rings<'m>, RingError> {
        let size = q.size();
        if !q.ready() || size == 0 || !size.is_power_of_two() {
            return Err(RingError::NotReady);
        }
        let n = usize::from(size);
        let area = |addr: u64, len: usize, align: u64| {
            if addr % align != 0 {
                return Err(RingError::BadArea);
            }
            mem.get_slice(GuestAddress(addr), len).map_err(|_| RingError::BadArea)
        };
        Ok(Rings {
            mem,
            desc: area(q.desc_table(), DESC * n, 16)?,
            avail: area(q.avail_ring(), HEADER + 2 * n + 2, 2)?,
            used: area(q.used_ring(), HEADER + USED_ELEM * n + 2, 4)?,
            size,
            event_idx: q.event_idx_enabled(),
            next_avail: q.next_avail(),
            next_used: q.next_used(),
            avail_idx: q.next_avail(),
            unpublished: false,
        })
    }

    /// Chains the guest has made available and the device not taken,
    /// reading its index again. `None` for an index more than a ring
    /// ahead (a broken or hostile guest: nothing is taken).
    pub fn available(&mut self) -> Option<u16> {
        let idx = u16::from_le(self.avail.load::<u16>(2, Ordering::Acquire).ok()?);
        let ahead = idx.wrapping_sub(self.next_avail);
        if ahead > self.size {
            return None;
        }
        self.avail_idx = idx;
        Some(ahead)
    }

    /// The head of the next available chain, taking it; `None` when the
    /// guest has made none available (or its index is broken).
    pub fn pop(&mut self) -> Option<u16> {
        if self.avail_idx == self.next_avail && self.available()? == 0 {
            return None;
        }
        let slot = usize::from(self.next_avail % self.size);
        let head = u16::from_le(self.avail.load::<u16>(HEADER + 2 * slot, Ordering::Relaxed).ok()?);
        self.next_avail = self.next_avail.wrapping_add(1);
        Some(head)
    }

    /// Gives back the chains taken last (`n` of them), untouched: the
    /// next [`Rings::pop`]s take them again.
    pub fn unpop(&mut self, n: u16) {
        self.next_avail = self.next_avail.wrapping_sub(n);
    }

    /// The descriptors of the chain at `head`.
    pub fn chain(&self, head: u16) -> Chain<'m> {
        Chain {
            mem: self.mem,
            table: self.desc,
            len: self.size,
            next: head,
            ttl: self.size,
            indirect: false,
            bytes: 0,
            table_refused: false,
        }
    }

    /// Marks chain `head` used with `len` bytes written into it; published
    /// with the next [`Rings::publish`]. False (nothing written) for a head
    /// that is not a descriptor of the table.
    pub fn used(&mut self, head: u16, len: u32) -> bool {
        if head >= self.size {
            return false;
        }
        let at = HEADER + USED_ELEM * usize::from(self.next_used % self.size);
        let elem = u64::from(head) | u64::from(len) << 32;
        let Ok(slot) = self.used.get_ref::<u64>(at) else { return false };
        slot.store(elem.to_le());
        self.next_used = self.next_used.wrapping_add(1);
        self.unpublished = true;
        true
    }

    /// Makes the used entries written so far visible to the guest: one
    /// store of the used index, after them.
    pub fn publish(&mut self) {
        if std::mem::take(&mut self.unpublished) {
            let _ = self.used.store(self.next_used.to_le(), 2, Ordering::Release);
        }
    }

    /// Whether the guest wants a signal for the used entries added since
    /// `last` (the used index when it was last asked, which this updates):
    /// with `EVENT_IDX`, whether its used event index was passed (as
    /// Linux's `vring_need_event`); without, unless it set
    /// `VRING_AVAIL_F_NO_INTERRUPT`. Call after [`Rings::publish`].
    pub fn needs_signal(&self, last: &mut u16) -> bool {
        let (new, old) = (self.next_used, std::mem::replace(last, self.next_used));
        // The used index is written before the guest's wish is read.
        fence(Ordering::SeqCst);
        if self.event_idx {
            let at = HEADER + 2 * usize::from(self.size);
            let Ok(event) = self.avail.load::<u16>(at, Ordering::Relaxed).map(u16::from_le) else {
                return true;
            };
            return new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old);
        }
        let flags = self.avail.load::<u16>(0, Ordering::Relaxed).map(u16::from_le).unwrap_or(0);
        flags & NO_INTERRUPT == 0
    }

    /// Publishes what is left and hands the position back to `q`.
    pub fn close(mut self, q: &mut Queue) {
        self.publish();
        q.set_next_avail(self.next_avail);
        q.set_next_used(self.next_used);
    }

    /// The used index as written so far.
    pub fn next_used(&self) -> u16 {
        self.next_used
    }

    /// The guest memory the rings are in.
    pub fn memory(&self) -> &'m Memory {
        self.mem
    }
}

/// `VRING_AVAIL_F_NO_INTERRUPT`.
const NO_INTERRUPT: u16 = 1;
/// `VRING_DESC_F_NEXT` and `VRING_DESC_F_INDIRECT`.
const F_NEXT: u16 = 1;
const F_INDIRECT: u16 = 4;

/// The descriptors of one chain, in order, following an indirect table
/// where the chain points to one.
pub struct Chain<'m> {
    mem: &'m Memory,
    table: Slice<'m>,
    len: u16,
    next: u16,
    /// Descriptors the chain may still have: a loop ends.
    ttl: u16,
    indirect: bool,
    bytes: u32,
    table_refused: bool,
}

impl Chain<'_> {
    fn end(&mut self) -> Option<Descriptor> {
        self.ttl = 0;
        None
    }

    /// Whether the chain ended at an indirect table that is not all in
    /// one region of guest memory (which `virtio-queue` would read as far
    /// as guest memory goes, descriptor by descriptor).
    pub fn table_refused(&self) -> bool {
        self.table_refused
    }
}

impl Iterator for Chain<'_> {
    type Item = Descriptor;

    fn next(&mut self) -> Option<Descriptor> {
        if self.ttl == 0 || self.next >= self.len {
            return None;
        }
        let Ok(d) = self.table.get_ref::<Descriptor>(DESC * usize::from(self.next)).map(|r| r.load()) else {
            return self.end();
        };
        if d.flags() & F_INDIRECT != 0 {
            // One level only, a whole number of descriptors, in one region.
            let n = d.len() as usize / DESC;
            if self.indirect || d.len() as usize % DESC != 0 || n == 0 || n > usize::from(u16::MAX) {
                return self.end();
            }
            let Ok(table) = self.mem.get_slice(d.addr(), d.len() as usize) else {
                self.table_refused = true;
                return self.end();
            };
            (self.table, self.len, self.next, self.ttl, self.indirect) = (table, n as u16, 0, n as u16, true);
            return self.next();
        }
        let Some(bytes) = self.bytes.checked_add(d.len()) else { return self.end() };
        self.bytes = bytes;
        if d.flags() & F_NEXT != 0 {
            self.next = d.next();
            self.ttl -= 1;
        } else {
            self.ttl = 0;
        }
        Some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{Guest, AVAIL, BUFFERS, USED};

    #[test]
    fn an_available_index_more_than_a_ring_ahead_takes_nothing() {
        let mut g = Guest::new(16, false);
        g.post(&[(BUFFERS, 100)], false);
        // The guest claims 17 chains in a ring of 16.
        g.write(AVAIL + 2, &17u16.to_le_bytes());
        assert_eq!(g.rings(|r| (r.available(), r.pop())), Some((None, None)));
        assert_eq!(g.queue.next_avail(), 0);
        g.write(AVAIL + 2, &16u16.to_le_bytes());
        assert_eq!(g.rings(|r| (r.available(), r.pop())), Some((Some(16), Some(0))));
        assert_eq!(g.queue.next_avail(), 1);
    }

    #[test]
    fn used_entries_are_published_by_one_index_store_and_the_position_goes_back_to_the_queue() {
        let mut g = Guest::new(8, false);
        for k in 0..3 {
            g.post(&[(BUFFERS + 0x100 * k, 100)], false);
        }
        g.rings(|r| {
            for k in 0..3 {
                let head = r.pop().unwrap();
                assert!(r.used(head, 10 + k));
            }
            assert!(!r.used(8, 0), "a head out of the table");
            assert_eq!(u16::from_le_bytes([g_used(r, 2), g_used(r, 3)]), 0, "nothing published yet");
            r.publish();
        })
        .unwrap();
        assert_eq!((g.used_idx(), g.used(0), g.used(2)), (3, (0, 10), (2, 12)));
        assert_eq!((g.queue.next_avail(), g.queue.next_used()), (3, 3));
        // virtio-queue takes over where the batch left off.
        g.post(&[(BUFFERS, 100)], false);
        let mem = g.mem.clone();
        assert_eq!(g.queue.pop_descriptor_chain(&mem).map(|c| c.head_index()), Some(3));
    }

    /// A byte of the used ring, read through the rings' memory.
    fn g_used(r: &Rings<'_>, at: u64) -> u8 {
        r.memory().read_obj::<u8>(GuestAddress(USED + at)).unwrap()
    }

    #[test]
    fn a_signal_is_wanted_once_the_used_event_index_is_passed_or_unless_interrupts_are_off() {
        let mut g = Guest::new(8, true);
        for k in 0..4 {
            g.post(&[(BUFFERS + 0x100 * k, 100)], true);
        }
        // The guest wants a signal when entry 2 (the third) is used.
        g.write(AVAIL + 4 + 2 * 8, &2u16.to_le_bytes());
        let wanted: Vec<bool> = g
            .rings(|r| {
                let mut last = 0;
                (0..4)
                    .map(|_| {
                        let head = r.pop().unwrap();
                        r.used(head, 1);
                        r.publish();
                        r.needs_signal(&mut last)
                    })
                    .collect()
            })
            .unwrap();
        assert_eq!(wanted, [false, false, true, false]);
        // Without EVENT_IDX: always, unless the guest set NO_INTERRUPT.
        let mut g = Guest::new(8, false);
        assert_eq!(g.rings(|r| r.needs_signal(&mut 0)), Some(true));
        g.write(AVAIL, &1u16.to_le_bytes());
        assert_eq!(g.rings(|r| r.needs_signal(&mut 0)), Some(false));
    }

    #[test]
    fn rings_outside_guest_memory_or_not_ready_are_not_opened() {
        // (A misaligned address the queue itself refuses to take.)
        let mut g = Guest::new(8, false);
        assert!(Rings::open(&g.queue, &g.mem).is_ok());
        g.queue.set_used_ring_address(Some(crate::fake::MEM as u32 - 8), Some(0));
        assert_eq!(Rings::open(&g.queue, &g.mem).err(), Some(RingError::BadArea));
        g.queue.set_used_ring_address(Some(USED as u32), Some(0));
        g.queue.set_desc_table_address(Some(crate::fake::MEM as u32 - 16), Some(0));
        assert_eq!(Rings::open(&g.queue, &g.mem).err(), Some(RingError::BadArea));
        g.queue.set_desc_table_address(Some(0), Some(0));
        g.queue.set_ready(false);
        assert_eq!(Rings::open(&g.queue, &g.mem).err(), Some(RingError::NotReady));
    }
}
