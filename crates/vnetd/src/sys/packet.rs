//! Packet sockets on existing netdevs (a container's veth, a TAP that QEMU
//! holds): opened promiscuous and bound to one device, read into a
//! memory-mapped receive ring (`RxRing`, `TPACKET_V2`) or one frame at a
//! time with its VLAN tag from the auxiliary data (`recv_packet`).

use super::netdev::ifindex;
use super::sockopt::setsockopt_raw;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Opens a raw packet socket bound to the existing netdev `name` (the host
/// end of a container's veth, or a TAP that QEMU holds): non-blocking,
/// promiscuous, not seeing its own transmissions. Reads return whole frames;
/// writes send a frame out of the device (towards the VM).
pub fn open_packet(name: &str) -> io::Result<File> {
    let ifindex = ifindex(name)?;
    let sock = packet_socket()?;
    packet_bind(&sock, ifindex, libc::ETH_P_ALL as u16)?;
    setsockopt_raw(&sock, libc::SOL_PACKET, 23 /* PACKET_IGNORE_OUTGOING */, &(1 as libc::c_int))?;
    // A VLAN tag the kernel took out of a frame comes with it as metadata
    // (read by `recv_packet`; the receive ring has it in its frame header).
    setsockopt_raw(&sock, libc::SOL_PACKET, PACKET_AUXDATA, &(1 as libc::c_int))?;
    let mreq = libc::packet_mreq {
        mr_ifindex: ifindex as i32,
        mr_type: 1 as libc::c_ushort, // PACKET_MR_PROMISC
        mr_alen: 0,
        mr_address: [0; 8],
    };
    setsockopt_raw(&sock, libc::SOL_PACKET, 1 /* PACKET_ADD_MEMBERSHIP */, &mreq)?;
    Ok(File::from(sock))
}

/// A raw packet socket, non-blocking, of protocol 0: it receives nothing
/// until bound to a device and a protocol.
fn packet_socket() -> io::Result<OwnedFd> {
    // SAFETY: `socket` takes no pointers; the result is checked below.
    let fd = unsafe {
        libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0)
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by `socket`, is valid and owned by no one else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(sock)
}

/// Binds packet socket `sock` to device `ifindex` for `protocol` (an
/// EtherType; `ETH_P_ALL`: every frame; 0 keeps the socket's protocol,
/// which for one from [`packet_socket`] is none: it only sends).
fn packet_bind(sock: &impl AsRawFd, ifindex: u32, protocol: u16) -> io::Result<()> {
    // SAFETY: `sockaddr_ll` is a plain C struct; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = protocol.to_be();
    sll.sll_ifindex = ifindex as i32;
    // SAFETY:
    // - `sock` is an open packet socket for the whole call.
    // - `sll` is a live `sockaddr_ll` and its size is passed with it.
    let rc = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Opens a packet socket that sends to device `name` and receives nothing:
/// created and bound with protocol 0, the kernel registers no tap for it.
pub fn open_packet_tx(name: &str) -> io::Result<File> {
    let ifindex = ifindex(name)?;
    let sock = packet_socket()?;
    packet_bind(&sock, ifindex, 0)?;
    Ok(File::from(sock))
}

/// Makes a packet socket read and write a 10-byte `virtio_net_hdr` before
/// every frame, so GSO and partial-checksum frames pass whole.
pub fn packet_enable_vnet_hdr(sock: &File) -> io::Result<()> {
    setsockopt_raw(sock, libc::SOL_PACKET, 15 /* PACKET_VNET_HDR */, &(1 as libc::c_int))
}

/// `struct tpacket2_hdr` (linux/if_packet.h): the head of each ring frame.
#[repr(C)]
#[allow(dead_code)] // the kernel's layout; only some fields are read
struct Tpacket2Hdr {
    tp_status: u32,
    tp_len: u32,
    tp_snaplen: u32,
    tp_mac: u16,
    tp_net: u16,
    tp_sec: u32,
    tp_nsec: u32,
    tp_vlan_tci: u16,
    tp_vlan_tpid: u16,
    tp_padding: [u8; 4],
}

/// `struct tpacket_req` (linux/if_packet.h).
#[repr(C)]
#[allow(dead_code)] // read by the kernel
struct TpacketReq {
    tp_block_size: libc::c_uint,
    tp_block_nr: libc::c_uint,
    tp_frame_size: libc::c_uint,
    tp_frame_nr: libc::c_uint,
}

const PACKET_RX_RING: libc::c_int = 5;
const PACKET_VERSION: libc::c_int = 10;
const TPACKET_V2: libc::c_int = 1;
const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_USER: u32 = 1;
/// The frame's VLAN tag is in `tp_vlan_tci` (the kernel took it out).
const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
/// `sockaddr_ll`, which the kernel writes after the (aligned) header.
const SOCKADDR_LL_LEN: usize = 20;
/// A ring block: the kernel allocates each as 2^n pages, so a power of two
/// wastes nothing.
const RING_BLOCK: usize = 256 << 10;
/// Frames per block, and one frame's slot: its header, the address, a
/// `virtio_net_hdr` and a largest GSO frame (64 KB) fit in a third of a
/// block (rounded down to the 16-byte `TPACKET_ALIGNMENT`).
const RING_PER_BLOCK: usize = 3;
const RING_FRAME: usize = RING_BLOCK / RING_PER_BLOCK / 16 * 16;

/// A `TPACKET_V2` receive ring on a packet socket: the kernel copies each
/// frame the device receives into the next free slot of a memory area it
/// shares with vnetd, and vnetd takes frames from there without a system
/// call per frame (`read` costs one each). Frames keep their
/// `virtio_net_hdr` in front when the socket has `PACKET_VNET_HDR`.
///
/// One reader at a time (the worker serving the interface's queue takes
/// the ring's lock for a batch); a slot goes back to the kernel when the
/// [`RingFrame`] that lent it is dropped.
pub struct RxRing {
    base: *mut u8,
    len: usize,
    frames: usize,
    next: usize,
    vnet_hdr: usize,
}

// SAFETY: the mapping is owned by the ring and unmapped only on drop; a
// frame's bytes are handed out only while the kernel has marked it the
// user's, through `&mut self` (one reader); the status word is accessed
// atomically. Moving the ring to another thread changes none of that.
unsafe impl Send for RxRing {}

impl std::fmt::Debug for RxRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxRing").field("frames", &self.frames).finish()
    }
}

/// One frame lent by an [`RxRing`]: `data` is `[virtio_net_hdr] frame`, as
/// a `read` would have returned it; `truncated` says the slot was too
/// small for the whole frame.
pub struct RingFrame<'a> {
    status: &'a std::sync::atomic::AtomicU32,
    pub data: &'a mut [u8],
    pub truncated: bool,
}

impl Drop for RingFrame<'_> {
    fn drop(&mut self) {
        self.status.store(TP_STATUS_KERNEL, std::sync::atomic::Ordering::Release);
    }
}

impl RxRing {
    /// Sets up a ring of `blocks` blocks (3 frames of up to 64 KB each,
    /// 256 KB) on packet socket `sock`, which must have no ring yet
    /// (`vnet_hdr` as set on the socket), and maps it.
    pub fn new(sock: &File, blocks: usize, vnet_hdr: bool) -> io::Result<RxRing> {
        let blocks = blocks.max(1);
        let frames = blocks * RING_PER_BLOCK;
        setsockopt_raw(sock, libc::SOL_PACKET, PACKET_VERSION, &TPACKET_V2)?;
        let req = TpacketReq {
            tp_block_size: RING_BLOCK as libc::c_uint,
            tp_block_nr: blocks as libc::c_uint,
            tp_frame_size: RING_FRAME as libc::c_uint,
            tp_frame_nr: frames as libc::c_uint,
        };
        setsockopt_raw(sock, libc::SOL_PACKET, PACKET_RX_RING, &req)?;
        Self::adopt(sock, blocks, vnet_hdr, 0)
    }

    /// The ring made on `sock` with `blocks` blocks (by [`RxRing::new`], or
    /// by a previous vnetd and handed over with the socket), mapped and
    /// read from frame `next` (where that vnetd stopped).
    pub fn adopt(sock: &File, blocks: usize, vnet_hdr: bool, next: usize) -> io::Result<RxRing> {
        let frames = blocks.max(1) * RING_PER_BLOCK;
        if next >= frames {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a ring position past its end"));
        }
        let len = RING_BLOCK * blocks.max(1);
        // SAFETY: a new shared mapping of the socket's existing ring (the
        // kernel refuses a length other than the ring's); no existing memory
        // is touched; the result is checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                sock.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let vnet_hdr = if vnet_hdr { 10 } else { 0 };
        Ok(RxRing { base: base.cast(), len, frames, next, vnet_hdr })
    }

    /// The frame read next (what a hand-over passes on).
    pub fn position(&self) -> usize {
        self.next
    }

    /// The next frame the kernel has filled, if any.
    pub fn take_frame(&mut self) -> Option<RingFrame<'_>> {
        let slot = self.next / RING_PER_BLOCK * RING_BLOCK + self.next % RING_PER_BLOCK * RING_FRAME;
        // SAFETY: `slot` is the start of one of `frames` slots inside the
        // mapping, 16-byte aligned, so aligned for the header; the status word
        // is the header's first field and is shared with the kernel, so it
        // is only accessed atomically.
        let (hdr, status) = unsafe {
            let hdr = self.base.add(slot) as *const Tpacket2Hdr;
            (hdr, std::sync::atomic::AtomicU32::from_ptr(hdr as *mut u32))
        };
        if status.load(std::sync::atomic::Ordering::Acquire) & TP_STATUS_USER == 0 {
            return None;
        }
        // SAFETY: the kernel set TP_STATUS_USER (read with Acquire above):
        // it wrote the header and the frame and leaves the slot alone until
        // we hand it back. Read the header's plain fields.
        let (mac, snaplen, len, tci, tpid) = unsafe {
            (
                std::ptr::addr_of!((*hdr).tp_mac).read() as usize,
                std::ptr::addr_of!((*hdr).tp_snaplen).read() as usize,
                std::ptr::addr_of!((*hdr).tp_len).read() as usize,
                std::ptr::addr_of!((*hdr).tp_vlan_tci).read(),
                std::ptr::addr_of!((*hdr).tp_vlan_tpid).read(),
            )
        };
        self.next = (self.next + 1) % self.frames;
        let start = mac.saturating_sub(self.vnet_hdr).max(std::mem::size_of::<Tpacket2Hdr>());
        let end = (mac + snaplen).min(RING_FRAME);
        let start = start.min(end);
        // A VLAN tag the kernel took out of the frame goes back in (the
        // VM sent it; a TAP's frames keep theirs): the offload header and
        // the two MAC addresses move 4 bytes into the slack before them.
        let vlan = status.load(std::sync::atomic::Ordering::Relaxed) & TP_STATUS_VLAN_VALID != 0;
        let room = std::mem::size_of::<Tpacket2Hdr>().next_multiple_of(16) + SOCKADDR_LL_LEN + 4;
        let tagged = vlan && start >= room && end - start >= self.vnet_hdr + 12;
        let start = if tagged { start - 4 } else { start };
        // SAFETY: `slot + start .. slot + end` lies inside this slot (both
        // clamped to RING_FRAME), which the kernel has lent us (above); the
        // returned borrow of `self` keeps `take_frame` from lending it twice, and
        // `RingFrame`'s drop hands it back.
        let data = unsafe { std::slice::from_raw_parts_mut(self.base.add(slot + start), end - start) };
        if tagged {
            insert_vlan_tag(data, self.vnet_hdr, if tpid == 0 { 0x8100 } else { tpid }, tci);
        }
        Some(RingFrame { status, data, truncated: snaplen < len || mac < self.vnet_hdr })
    }
}

const PACKET_AUXDATA: libc::c_int = 8;

/// `struct tpacket_auxdata` (linux/if_packet.h): a packet socket's control
/// message with each frame.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct TpacketAuxdata {
    tp_status: u32,
    tp_len: u32,
    tp_snaplen: u32,
    tp_mac: u16,
    tp_net: u16,
    tp_vlan_tci: u16,
    tp_vlan_tpid: u16,
}

/// Reads one frame from packet socket `f` into `buf[4..]` (the 4 bytes in
/// front are room for a tag) and, when the kernel had taken the frame's
/// VLAN tag out as metadata, puts it back (see [`insert_vlan_tag`];
/// `vnet_hdr` bytes of offload header come first). Returns the range of
/// `buf` the frame (with its header) is in.
pub fn recv_packet(f: &File, buf: &mut [u8], vnet_hdr: usize) -> io::Result<std::ops::Range<usize>> {
    if buf.len() < 4 + vnet_hdr + 14 {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let mut iov = libc::iovec { iov_base: buf[4..].as_mut_ptr().cast(), iov_len: buf.len() - 4 };
    // Room for one control message holding a `TpacketAuxdata`, aligned.
    let mut control = [0u64; 8];
    // SAFETY: `msghdr` is a plain C struct; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY:
    // - `f` is an open packet socket for the whole call.
    // - `msg` points at one iovec over `buf[4..]` (live, writable, its length
    //   given) and at `control` (live, writable, its length given); both
    //   outlive the call.
    let n = unsafe { libc::recvmsg(f.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let len = n as usize;
    let mut aux = None;
    // SAFETY: `msg` was filled by `recvmsg` above; CMSG_FIRSTHDR/NXTHDR only
    // walk inside `msg_control[..msg_controllen]`, which the kernel wrote.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !c.is_null() {
        // SAFETY: `c` is a control message header inside `control` (above).
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_PACKET && h.cmsg_type == PACKET_AUXDATA {
            // SAFETY: CMSG_LEN only computes a length (no memory is read).
            let need = unsafe { libc::CMSG_LEN(std::mem::size_of::<TpacketAuxdata>() as u32) } as usize;
            if h.cmsg_len as usize >= need {
                // SAFETY: the message's data holds a whole `tpacket_auxdata`
                // (its length was checked just above), inside `control`; it
                // may be unaligned, so it is read with `read_unaligned`.
                aux = Some(unsafe { libc::CMSG_DATA(c).cast::<TpacketAuxdata>().read_unaligned() });
            }
        }
        // SAFETY: as for CMSG_FIRSTHDR.
        c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
    }
    match aux {
        // (recvmsg filled at most `buf[4..]`: the frame and its tag fit.)
        Some(a) if a.tp_status & TP_STATUS_VLAN_VALID != 0 && len >= vnet_hdr + 12 => {
            let tpid = if a.tp_vlan_tpid == 0 { 0x8100 } else { a.tp_vlan_tpid };
            insert_vlan_tag(&mut buf[..4 + len], vnet_hdr, tpid, a.tp_vlan_tci);
            Ok(0..4 + len)
        }
        _ => Ok(4..4 + len),
    }
}

/// Puts a VLAN tag back into a frame laid out as 4 free bytes, then
/// `[virtio_net_hdr (vnet_hdr bytes)] dst src rest`: header and addresses
/// move to the front, the tag goes after them, and a partial checksum's
/// offsets (counted from the frame's start) move with the bytes after it.
pub fn insert_vlan_tag(data: &mut [u8], vnet_hdr: usize, tpid: u16, tci: u16) {
    data.copy_within(4..4 + vnet_hdr + 12, 0);
    let at = vnet_hdr + 12;
    data[at..at + 2].copy_from_slice(&tpid.to_be_bytes());
    data[at + 2..at + 4].copy_from_slice(&tci.to_be_bytes());
    if vnet_hdr >= 10 && data[0] & 1 != 0 {
        // NEEDS_CSUM: csum_start (and hdr_len) are past the tag now.
        for f in [2usize, 6] {
            let v = u16::from_le_bytes([data[f], data[f + 1]]);
            if v != 0 {
                data[f..f + 2].copy_from_slice(&v.saturating_add(4).to_le_bytes());
            }
        }
    }
}

impl Drop for RxRing {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly the mapping made in `new`, and no
        // `RingFrame` can outlive the ring (it borrows it).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::insert_vlan_tag;

    #[test]
    fn a_vlan_tag_goes_back_between_the_addresses_and_the_type() {
        // 4 free bytes, a virtio_net_hdr (NEEDS_CSUM, hdr_len 54, csum_start 34), dst, src, type.
        let mut d = vec![0xee; 4];
        d.extend_from_slice(&[1, 0, 54, 0, 0, 0, 34, 0, 16, 0]);
        d.extend_from_slice(&[0xaa; 6]);
        d.extend_from_slice(&[0xbb; 6]);
        d.extend_from_slice(&[0x08, 0x00, 0x45]);
        insert_vlan_tag(&mut d, 10, 0x8100, 77);
        assert_eq!(&d[..10], &[1, 0, 58, 0, 0, 0, 38, 0, 16, 0]);
        assert_eq!(&d[10..22], &[0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xbb, 0xbb, 0xbb, 0xbb, 0xbb, 0xbb]);
        assert_eq!(&d[22..], &[0x81, 0x00, 0, 77, 0x08, 0x00, 0x45]);
        // Without an offload header.
        let mut p = vec![0; 4];
        p.extend_from_slice(&[1; 12]);
        p.extend_from_slice(&[0x86, 0xdd]);
        insert_vlan_tag(&mut p, 0, 0x8100, 5);
        assert_eq!(&p[12..], &[0x81, 0x00, 0, 5, 0x86, 0xdd]);
    }
}
