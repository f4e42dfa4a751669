//! A vhost-user front end that needs no guest: it shares a memory file with
//! vnetd, lays out a virtio-net device's two rings in it, and drives them
//! as a guest driver would, at full rate. One front end sends (fills the TX
//! ring with frames as fast as vnetd takes them), another receives (keeps
//! the RX ring full of buffers and counts what vnetd puts in them), so
//! vnetd's vhost-user backend is measured at packet rates without QEMU (and
//! without KVM, which this machine cannot run).
//!
//! The rings are the split virtqueue of virtio 1.x, written with
//! `vm-memory`'s atomic loads and stores (the guest side of what
//! `virtio-queue` reads in vnetd). Interrupts are switched off
//! (`VRING_AVAIL_F_NO_INTERRUPT`): both sides poll, as a guest's PMD would.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, VolatileSlice};
use vmm_sys_util::eventfd::EventFd;

/// Ring size (descriptors per queue).
pub const QUEUE: u16 = 256;
/// The guest header with `VERSION_1`: `virtio_net_hdr` and `num_buffers`.
const HDR: usize = 12;
/// One buffer: the header and the largest frame.
const SLOT: u64 = 65_536 + 1024;
/// Where each queue's rings live (queue 0 receives, queue 1 sends).
const fn ring_base(q: u64) -> u64 {
    q * 0x4000
}
/// Where the buffers start.
const BUFFERS: u64 = 0x10_000;
/// The memory shared with vnetd.
const MEM: u64 = BUFFERS + SLOT * QUEUE as u64;

const VIRTIO_F_VERSION_1: u64 = 1 << 32;
const VIRTIO_NET_F_MRG_RXBUF: u64 = 1 << 15;
const NO_INTERRUPT: u16 = 1;
const NO_NOTIFY: u16 = 1;
const WRITE: u16 = 2;

/// A connected front end with its memory and one of its two queues driven.
pub struct Front {
    _frontend: Frontend,
    mem: GuestMemoryMmap,
    _file: File,
    kick: [EventFd; 2],
    _call: [EventFd; 2],
    /// Per queue: the next avail index, and the used index last seen.
    avail: [u16; 2],
    used: [u16; 2],
}

/// An error's text after what was being done.
fn err<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> crate::Error + '_ {
    move |e| format!("{what}: {e}").into()
}

/// Queue `q`'s rings (descriptor table, avail and used ring), looked up
/// once, as a guest driver holds them: the load generator should cost the
/// machine no more than a good driver does.
fn rings(mem: &GuestMemoryMmap, q: usize) -> crate::Result<VolatileSlice<'_>> {
    mem.get_slice(GuestAddress(ring_base(q as u64)), RINGS).map_err(err("the rings"))
}

/// Where the avail and used rings are in a queue's rings.
const AVAIL: usize = 0x1000;
const USED: usize = 0x2000;
/// The bytes of a queue's rings.
const RINGS: usize = 0x3000;

/// Names each front end's memory file apart (several per process).
static FILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Front {
    /// Connects to vnetd's socket `sock`, shares `MEM` bytes of a file in
    /// `dir` (tmpfs) with it and sets up both queues.
    pub fn connect(sock: &Path, dir: &Path) -> crate::Result<Front> {
        let n = FILES.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("vhost-load-{}-{n}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(err("memory file"))?;
        let _ = std::fs::remove_file(&path);
        file.set_len(MEM).map_err(err("memory file"))?;
        let fo = FileOffset::new(file.try_clone().map_err(err("memory file"))?, 0);
        let mem = GuestMemoryMmap::from_ranges_with_files([(GuestAddress(0), MEM as usize, Some(fo))])
            .map_err(err("mapping the memory"))?;
        let host = mem.get_host_address(GuestAddress(0)).map_err(err("memory"))? as u64;
        let f = Frontend::connect(sock, 2).map_err(err("connecting"))?;
        f.set_owner().map_err(err("set_owner"))?;
        let offered = f.get_features().map_err(err("get_features"))?;
        let proto = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        let want = VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MRG_RXBUF | proto;
        if offered & want != want {
            return Err(format!("vnetd offers features {offered:#x}, not {want:#x}").into());
        }
        f.set_features(want).map_err(err("set_features"))?;
        let mut f = f;
        let pf = f.get_protocol_features().map_err(err("get_protocol_features"))?;
        f.set_protocol_features(pf & VhostUserProtocolFeatures::MQ).map_err(err("set_protocol_features"))?;
        let region = VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: MEM,
            userspace_addr: host,
            mmap_offset: 0,
            mmap_handle: file.as_raw_fd(),
        };
        f.set_mem_table(&[region]).map_err(err("set_mem_table"))?;
        let ev = || EventFd::new(0).map_err(err("eventfd"));
        let (kick, call) = ([ev()?, ev()?], [ev()?, ev()?]);
        for q in 0..2u64 {
            let b = ring_base(q);
            // The driver's rings: no interrupts wanted.
            mem.write_obj(NO_INTERRUPT.to_le(), GuestAddress(b + AVAIL as u64)).map_err(err("ring"))?;
            let cfg = VringConfigData {
                queue_max_size: QUEUE,
                queue_size: QUEUE,
                flags: 0,
                desc_table_addr: host + b,
                used_ring_addr: host + b + USED as u64,
                avail_ring_addr: host + b + AVAIL as u64,
                log_addr: None,
            };
            let i = q as usize;
            f.set_vring_num(i, QUEUE).map_err(err("set_vring_num"))?;
            f.set_vring_addr(i, &cfg).map_err(err("set_vring_addr"))?;
            f.set_vring_base(i, 0).map_err(err("set_vring_base"))?;
            f.set_vring_call(i, &call[i]).map_err(err("set_vring_call"))?;
            f.set_vring_kick(i, &kick[i]).map_err(err("set_vring_kick"))?;
            f.set_vring_enable(i, true).map_err(err("set_vring_enable"))?;
        }
        Ok(Front { _frontend: f, mem, _file: file, kick, _call: call, avail: [0; 2], used: [0; 2] })
    }

    fn desc(&self, q: u64, i: u16, addr: u64, len: u32, flags: u16) {
        let at = GuestAddress(ring_base(q) + 16 * u64::from(i));
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        let _ = self.mem.write_slice(&raw, at);
    }

    /// Makes descriptor `head` of queue `q` available (not yet published).
    fn offer(&mut self, rings: &VolatileSlice<'_>, q: usize, head: u16) {
        let slot = usize::from(self.avail[q] % QUEUE);
        let _ = rings.store(head.to_le(), AVAIL + 4 + 2 * slot, Ordering::Relaxed);
        self.avail[q] = self.avail[q].wrapping_add(1);
    }

    /// Publishes the avail index of queue `q`, kicking vnetd if it asks for kicks.
    fn publish(&self, rings: &VolatileSlice<'_>, q: usize) {
        let _ = rings.store(self.avail[q].to_le(), AVAIL + 2, Ordering::Release);
        let flags: u16 = rings.load(USED, Ordering::Acquire).unwrap_or(0);
        if u16::from_le(flags) & NO_NOTIFY == 0 {
            let _ = self.kick[q].write(1);
        }
    }

    fn used_idx(rings: &VolatileSlice<'_>) -> u16 {
        u16::from_le(rings.load(USED + 2, Ordering::Acquire).unwrap_or(0))
    }

    /// Sends frames of `len` bytes (destination `dst`, source `src`) for
    /// `secs`: returns the frames vnetd took from the TX ring.
    pub fn send(&mut self, len: usize, dst: [u8; 6], src: [u8; 6], secs: f64) -> u64 {
        let mut frame = vec![0u8; HDR + len];
        frame[HDR..HDR + 6].copy_from_slice(&dst);
        frame[HDR + 6..HDR + 12].copy_from_slice(&src);
        frame[HDR + 12..HDR + 14].copy_from_slice(&[0x88, 0xb5]);
        for i in 0..QUEUE {
            let addr = BUFFERS + SLOT * u64::from(i);
            let _ = self.mem.write_slice(&frame, GuestAddress(addr));
            self.desc(1, i, addr, frame.len() as u32, 0);
        }
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let mut sent = 0u64;
        let mem = self.mem.clone();
        let Ok(rings) = rings(&mem, 1) else { return 0 };
        while Instant::now() < end {
            let used = Self::used_idx(&rings);
            sent += u64::from(used.wrapping_sub(self.used[1]));
            self.used[1] = used;
            let in_flight = self.avail[1].wrapping_sub(used);
            let free = QUEUE - in_flight;
            if free == 0 {
                // Two cores for the sender, vnetd and the receiver: give
                // them the CPU while the ring is full.
                std::thread::yield_now();
                continue;
            }
            for _ in 0..free {
                let head = self.avail[1] % QUEUE;
                self.offer(&rings, 1, head);
            }
            self.publish(&rings, 1);
        }
        sent
    }

    /// Keeps the RX ring full for `secs`: returns the frames and bytes
    /// vnetd placed (a frame over several buffers counts once per buffer).
    pub fn receive(&mut self, secs: f64) -> (u64, u64) {
        let mem = self.mem.clone();
        let Ok(rings) = rings(&mem, 0) else { return (0, 0) };
        for i in 0..QUEUE {
            let addr = BUFFERS + SLOT * u64::from(i);
            self.desc(0, i, addr, SLOT as u32, WRITE);
            self.offer(&rings, 0, i);
        }
        self.publish(&rings, 0);
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let (mut frames, mut bytes) = (0u64, 0u64);
        while Instant::now() < end {
            let used = Self::used_idx(&rings);
            if used == self.used[0] {
                std::thread::yield_now();
                continue;
            }
            while self.used[0] != used {
                let at = USED + 4 + 8 * usize::from(self.used[0] % QUEUE);
                let id: u32 = rings.load(at, Ordering::Relaxed).unwrap_or(0);
                let len: u32 = rings.load(at + 4, Ordering::Relaxed).unwrap_or(0);
                frames += 1;
                bytes += u64::from(u32::from_le(len)).saturating_sub(HDR as u64);
                self.offer(&rings, 0, (u32::from_le(id) % u32::from(QUEUE)) as u16);
                self.used[0] = self.used[0].wrapping_add(1);
            }
            self.publish(&rings, 0);
        }
        (frames, bytes)
    }
}

/// One measurement: frames of `len` bytes from one front end to another
/// through vnetd's vhost-user backend.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    pub len: usize,
    /// Frames vnetd took from the sender's TX ring, and placed in the
    /// receiver's RX ring, a second.
    pub sent_per_s: f64,
    pub received_per_s: f64,
    /// Received payload, Gbit/s.
    pub gbps: f64,
}

impl Rate {
    /// The rates of `sent` frames taken and `frames` (`bytes`) placed in `secs`.
    fn of(len: usize, sent: u64, frames: u64, bytes: u64, secs: f64) -> Rate {
        Rate {
            len,
            sent_per_s: sent as f64 / secs,
            received_per_s: frames as f64 / secs,
            gbps: bytes as f64 * 8.0 / secs / 1e9,
        }
    }

    /// Nanoseconds of the whole path per frame received.
    pub fn ns_per_frame(&self) -> f64 {
        if self.received_per_s > 0.0 {
            1e9 / self.received_per_s
        } else {
            f64::INFINITY
        }
    }
}

/// Puts the calling thread on `cpu`, if one is given.
fn place(cpu: Option<usize>) -> crate::Result<()> {
    match cpu {
        Some(c) => vnetd::sys::pin_current_thread(c)
            .map_err(|e| format!("placing a front end on CPU {c}: {e}").into()),
        None => Ok(()),
    }
}

/// Two vhost-user interfaces on host 0 of a lab, `g0` routed to `g1`; a
/// front end sends frames of each length in `lens` on `g0` for `secs`
/// while another receives on `g1`; both on CPU `cpu` if one is given.
pub fn measure(lab: &crate::Lab, lens: &[usize], secs: f64, cpu: Option<usize>) -> crate::Result<Vec<Rate>> {
    let (s0, s1) = (lab.dir.join("g0.sock"), lab.dir.join("g1.sock"));
    let (m0, m1) = ([0x52, 0x54, 0, 0x77, 0, 1], [0x52, 0x54, 0, 0x77, 0, 2]);
    let mac = |m: [u8; 6]| m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
    let cfg = format!(
        "interface g0 vhost-user {} mac {}\ninterface g1 vhost-user {} mac {}\nroute any {} -> interface g1\n",
        s0.display(),
        mac(m0),
        s1.display(),
        mac(m1),
        mac(m1)
    );
    lab.apply(0, &cfg)?;
    let dir = Path::new("/dev/shm");
    let mut out = Vec::new();
    for &len in lens {
        let mut rx = Front::connect(&s1, dir)?;
        let mut tx = Front::connect(&s0, dir)?;
        let receiver = std::thread::spawn(move || place(cpu).map(|_| rx.receive(secs + 0.5)));
        std::thread::sleep(Duration::from_millis(200));
        let sender = std::thread::spawn(move || place(cpu).map(|_| (tx.send(len, m1, m0, secs), tx)));
        let (sent, tx) = sender.join().map_err(|_| "the sender panicked".to_string())??;
        let (frames, bytes) = receiver.join().map_err(|_| "the receiver panicked".to_string())??;
        out.push(Rate::of(len, sent, frames, bytes, secs));
        if let Some(c) = ring_counters(lab) {
            eprintln!("{len} B: {c}");
        }
        drop(tx);
        // vnetd serves the next front end on the same socket.
        std::thread::sleep(Duration::from_millis(300));
    }
    Ok(out)
}

/// The sending interface's dispatch counters and the receiving one's
/// drops so far, as a line (what tells a run that polled from one that
/// slept on kicks).
fn ring_counters(lab: &crate::Lab) -> Option<String> {
    let out = lab.vnetctl(0, &["--json", "show", "interfaces"]).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let of = |name: &str| v["interfaces"].as_array()?.iter().find(|i| i["name"] == name).cloned();
    let (g0, g1) = (of("g0")?, of("g1")?);
    Some(format!(
        "g0 dispatch {} mode_switches {} kicks {} wakeups {} polled_frames {}; g1 rx_no_buffers {} signals {}",
        g0["dispatch"], g0["mode_switches"], g0["kicks"], g0["wakeups"], g0["polled_frames"], g1["rx_no_buffers"], g1["signals"]
    ))
}

/// The same load through two TAPs on vnetd's user path: a packet socket on
/// the kernel side of TAP `vtl0` sends (vnetd reads the frames from the
/// TAP's file descriptor), one on `vtl1` counts what vnetd wrote there;
/// both on CPU `cpu` if one is given.
pub fn measure_tap(
    lab: &crate::Lab,
    lens: &[usize],
    secs: f64,
    cpu: Option<usize>,
) -> crate::Result<Vec<Rate>> {
    use std::io::{Read, Write};
    let (m0, m1) = ([0x52, 0x54, 0, 0x77, 1, 1], [0x52, 0x54, 0, 0x77, 1, 2]);
    let mac = |m: [u8; 6]| m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
    let cfg = format!(
        "interface t0 tap vtl0 mac {} mtu 65000 offload off\ninterface t1 tap vtl1 mac {} mtu 65000 offload off\n\
         route any {} -> interface t1\n",
        mac(m0),
        mac(m1),
        mac(m1)
    );
    lab.apply(0, &cfg)?;
    let ns = vnetd::sys::netns_path(&lab.hosts[0].ns);
    let open = |dev: &'static str| {
        vnetd::sys::in_netns(&ns, move || vnetd::sys::open_packet(dev)).map_err(|e| format!("{dev}: {e}"))
    };
    let mut out = Vec::new();
    for &len in lens {
        let (mut tx, mut rx) = (open("vtl0")?, open("vtl1")?);
        let receiver = std::thread::spawn(move || {
            place(cpu)?;
            let mut buf = vec![0u8; 70_000];
            let end = Instant::now() + Duration::from_secs_f64(secs + 0.5);
            let (mut frames, mut bytes) = (0u64, 0u64);
            while Instant::now() < end {
                match rx.read(&mut buf) {
                    Ok(n) => {
                        frames += 1;
                        bytes += n as u64;
                    }
                    Err(_) => std::thread::yield_now(),
                }
            }
            Ok::<_, crate::Error>((frames, bytes))
        });
        std::thread::sleep(Duration::from_millis(200));
        let sender = std::thread::spawn(move || {
            place(cpu)?;
            let mut frame = vec![0u8; len.max(60)];
            frame[..6].copy_from_slice(&m1);
            frame[6..12].copy_from_slice(&m0);
            frame[12..14].copy_from_slice(&[0x88, 0xb5]);
            let end = Instant::now() + Duration::from_secs_f64(secs);
            let mut sent = 0u64;
            while Instant::now() < end {
                // A packet socket sends a frame whole or not at all.
                match tx.write(&frame) {
                    Ok(n) if n == frame.len() => sent += 1,
                    _ => std::thread::yield_now(),
                }
            }
            Ok::<_, crate::Error>(sent)
        });
        let sent = sender.join().map_err(|_| "the sender panicked".to_string())??;
        let (frames, bytes) = receiver.join().map_err(|_| "the receiver panicked".to_string())??;
        out.push(Rate::of(len, sent, frames, bytes, secs));
    }
    Ok(out)
}
