//! Dirty-page logging, for a guest that live-migrates while vnetd writes
//! its memory.
//!
//! During a migration QEMU copies the guest's memory to the destination
//! while the guest runs, and copies again each page written since. It
//! knows what the guest's CPUs write, not what a vhost-user back end
//! writes (received frames into RX buffers, used-ring entries and indexes):
//! the back end marks those pages in a bitmap QEMU shares with it
//! (`VHOST_USER_SET_LOG_BASE`: one bit per 4 KiB guest page, by guest
//! physical address), from the moment QEMU acknowledges `VHOST_F_LOG_ALL`
//! until it clears it. A page written and not marked reaches the
//! destination as it was before the write: a frame the guest was told it
//! received is not there, or a used index goes back.
//!
//! [`DirtyLog`] is the bitmap of one region of guest memory
//! ([`Memory`]): every write through `vm-memory` (`write_slice`,
//! `copy_from`, `store`, a `VolatileRef`'s `store`) marks the pages it
//! touched. While no log is set it costs one relaxed load a write. The
//! shared bitmap itself, its mapping and the page arithmetic are
//! `vhost-user-backend`'s ([`AtomicBitmapMmap`]); its own replaceable
//! bitmap takes a lock and clones an `Arc` on every slice of guest memory,
//! which the data path takes several times a frame, so this one lends its
//! slices by reference (`vm-memory`'s `RefSlice`) and looks at the lock
//! only while logging.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use vhost_user_backend::bitmap::{AtomicBitmapMmap, BitmapReplace};
use vm_memory::bitmap::{Bitmap, RefSlice, WithBitmapSlice};
use vm_memory::mmap::NewBitmap;

/// Guest memory as vnetd maps it: each region with its [`DirtyLog`].
pub type Memory = vm_memory::GuestMemoryMmap<DirtyLog>;

/// The dirty-page log of one region of guest memory (clones share it).
#[derive(Clone, Default)]
pub struct DirtyLog(Arc<Inner>);

#[derive(Default)]
struct Inner {
    /// Whether writes are marked: a log is set and logging not stopped.
    on: AtomicBool,
    log: RwLock<Option<AtomicBitmapMmap>>,
    /// Writes marked since the region was mapped.
    marked: AtomicU64,
}

impl fmt::Debug for DirtyLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirtyLog").field("on", &self.logging()).field("marked", &self.marked()).finish()
    }
}

impl DirtyLog {
    /// Whether writes to the region are being marked.
    pub fn logging(&self) -> bool {
        self.0.on.load(Ordering::Acquire)
    }

    /// Writes marked in the log so far.
    pub fn marked(&self) -> u64 {
        self.0.marked.load(Ordering::Relaxed)
    }

    /// Stops marking and lets the log go (QEMU cleared `VHOST_F_LOG_ALL`:
    /// the migration ended, or failed and the guest runs on here).
    pub fn stop(&self) {
        self.0.on.store(false, Ordering::Release);
        *self.0.log.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// The log of each region of `mem`.
pub fn logs(mem: &Memory) -> impl Iterator<Item = &DirtyLog> {
    use vm_memory::GuestMemoryBackend;
    // The mapping's own bitmap (the region trait's `bitmap` is a slice of it).
    mem.iter().map(|r| vm_memory::MmapRegion::bitmap(r))
}

/// Stops logging in every region of `mem`.
pub fn stop_logging(mem: &Memory) {
    logs(mem).for_each(DirtyLog::stop);
}

/// Writes marked in every region of `mem`.
pub fn marked(mem: &Memory) -> u64 {
    logs(mem).map(DirtyLog::marked).sum()
}

impl<'a> WithBitmapSlice<'a> for DirtyLog {
    type S = RefSlice<'a, DirtyLog>;
}

impl Bitmap for DirtyLog {
    fn mark_dirty(&self, offset: usize, len: usize) {
        if !self.0.on.load(Ordering::Acquire) {
            return;
        }
        if let Some(log) = &*self.0.log.read().unwrap_or_else(|e| e.into_inner()) {
            log.mark_dirty(offset, len);
            self.0.marked.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn dirty_at(&self, offset: usize) -> bool {
        self.0.log.read().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(|l| l.dirty_at(offset))
    }

    fn slice_at(&self, offset: usize) -> RefSlice<'_, DirtyLog> {
        RefSlice::new(self, offset)
    }
}

impl NewBitmap for DirtyLog {
    fn with_len(_len: usize) -> Self {
        DirtyLog::default()
    }
}

/// `VHOST_USER_SET_LOG_BASE`: the handler maps QEMU's log and gives each
/// region its part; writes are marked from here on.
impl BitmapReplace for DirtyLog {
    type InnerBitmap = AtomicBitmapMmap;

    fn replace(&self, log: AtomicBitmapMmap) {
        *self.0.log.write().unwrap_or_else(|e| e.into_inner()) = Some(log);
        self.0.on.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{Guest, BUFFERS, USED};
    use std::io::IoSlice;
    use std::os::fd::AsFd;
    use vhost_user_backend::bitmap::{MemRegionBitmap, MmapLogReg};
    use vm_memory::GuestMemoryBackend;

    /// A log for the fake guest's memory, as QEMU shares one: a file
    /// mapped, one bit a 4 KiB page.
    fn log_on(g: &Guest) -> std::fs::File {
        let path = std::env::temp_dir().join(format!(
            "vnet-virtio-log-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        file.set_len(4096).unwrap();
        let reg = Arc::new(MmapLogReg::from_file(file.as_fd(), 0, 4096).unwrap());
        for r in g.mem.iter() {
            vm_memory::MmapRegion::bitmap(r).replace(AtomicBitmapMmap::new(r, reg.clone()).unwrap());
        }
        file
    }

    fn pages(file: &std::fs::File) -> Vec<u64> {
        use std::os::unix::fs::FileExt;
        let mut bits = [0u8; 8];
        file.read_exact_at(&mut bits, 0).unwrap();
        (0..64).filter(|p| bits[p / 8] & 1 << (p % 8) != 0).map(|p| p as u64).collect()
    }

    /// A frame placed in an RX buffer marks the buffer's page and the used
    /// ring's (entry and index), and nothing else; once stopped, nothing.
    #[test]
    fn a_frame_placed_while_logging_marks_its_buffers_and_the_used_ring_pages() {
        let mut g = Guest::new(16, false);
        // A buffer across a page boundary: both pages.
        let at = BUFFERS + 0x1000 - 100;
        g.post(&[(at, 2000)], true);
        let log = log_on(&g);
        let frame = [0x5au8; 600];
        let placed = g.rings(|r| {
            crate::scatter(r, &[IoSlice::new(&[0u8; 10]), IoSlice::new(&frame)], crate::HDR_MRG, true)
        });
        assert!(placed.flatten().is_some());
        let want = [at / 4096, at / 4096 + 1, USED / 4096];
        let mut want: Vec<u64> = want.to_vec();
        want.sort();
        want.dedup();
        assert_eq!(pages(&log), want);
        assert!(marked(&g.mem) >= 3, "{}", marked(&g.mem));
        // Stopped (VHOST_F_LOG_ALL cleared): a write marks nothing more.
        stop_logging(&g.mem);
        let before = marked(&g.mem);
        g.post(&[(BUFFERS + 0x3000, 2000)], true);
        let placed = g.rings(|r| {
            crate::scatter(r, &[IoSlice::new(&[0u8; 10]), IoSlice::new(&frame)], crate::HDR_MRG, true)
        });
        assert!(placed.flatten().is_some());
        assert_eq!((pages(&log), marked(&g.mem)), (want, before));
        assert!(!logs(&g.mem).any(DirtyLog::logging));
    }
}
