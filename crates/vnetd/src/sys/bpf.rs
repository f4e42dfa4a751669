//! Twins of the C structs the eBPF fast path keeps in its maps
//! (`bpf/vnet.h`): same fields, same order, no padding, checked against the
//! compiled object by the build (build.rs); whether a path is on a bpffs,
//! where they can be pinned; and `BPF_PROG_TEST_RUN` ([`test_run`]), with
//! which the programs' tests run them on crafted packets.

/// `struct route_key`: ingress port (ifindex, or `PORT_LINK | link id`),
/// destination and source MAC.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RouteKey {
    pub port: u32,
    pub dst: [u8; 6],
    pub src: [u8; 6],
}

/// `struct route_val`: the decision, the counter slots of the ingress
/// port and the target, and for `ACT_LINK` the link itself.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RouteVal {
    pub action: u32,
    pub target: u32,
    pub in_slot: u32,
    pub out_slot: u32,
    pub link: LinkVal,
}

/// `struct dest_key`: a destination entry's network and MAC.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DestKey {
    pub net: u32,
    pub dst: [u8; 6],
    pub pad: u16,
}

/// `struct port_val`: an ingress port's counter slot, network, the
/// source MAC it is locked to (`locked` 1) if any, and its IP source guard
/// (`guarded`: 0, `GUARD_ON` or `GUARD_USER`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortVal {
    pub slot: u32,
    pub net: u32,
    pub lock: [u8; 6],
    pub locked: u8,
    pub guarded: u8,
}

/// `struct guard_key`: an address (IPv4 mapped) a guarded interface owns.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct GuardKey {
    pub port: u32,
    pub addr: [u8; 16],
}

/// `struct neigh_key`: an IPv4 address in a vnet network (`neigh`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct NeighKey {
    pub net: u32,
    pub ip: [u8; 4],
}

/// `struct neigh6_key`: an IPv6 address in a vnet network (`neigh`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Neigh6Key {
    pub net: u32,
    pub ip: [u8; 16],
}

/// `struct neigh_val`: the MAC ARP requests for it are answered with.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NeighVal {
    pub mac: [u8; 6],
    pub pad: u16,
}

/// `struct peer_val`: a peer's link id, counter slot and link.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerVal {
    pub id: u32,
    pub slot: u32,
    pub link: LinkVal,
}

/// `struct link_val`: underlay addresses as 16 bytes (IPv6, or IPv4
/// mapped, `::ffff:a.b.c.d`), the port in network byte order.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkVal {
    pub remote_ip: [u8; 16],
    pub local_ip: [u8; 16],
    /// The next hop towards `remote_ip` on `ifindex`: the route's
    /// gateway, or `remote_ip` itself when it is on-link.
    pub nexthop: [u8; 16],
    pub remote_port: u16,
    pub format: u8,
    /// 1: the underlay is IPv6.
    pub v6: u8,
    pub network: u32,
    pub ifindex: u32,
    pub mtu: u32,
}

/// `struct addr_key`: a peer's underlay address, as in [`LinkVal`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct AddrKey {
    pub a: [u8; 16],
}

/// `struct cfg`; ports in network byte order (`vxlan_port` 0: none).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cfg {
    pub active: u32,
    pub port: u16,
    pub vxlan_port: u16,
    pub policy: u32,
}

/// `struct vxlan_key`: a VXLAN peer's address (as in [`AddrKey`]) and VNI.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct VxlanKey {
    pub addr: [u8; 16],
    pub vni: u32,
}

/// `struct port_stats`: one port's frames and bytes moved by the kernel.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortStats {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
}

/// `struct pair_key`: a (source, destination) MAC pair of the matrix.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PairKey {
    pub src: [u8; 6],
    pub dst: [u8; 6],
}

/// `struct pair_val`: a pair's frames and bytes on one CPU.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PairVal {
    pub frames: u64,
    pub bytes: u64,
}

/// `struct gov_val`: a governed network's policy generation (low 32 bits)
/// and its counter slot.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GovVal {
    pub gen: u32,
    pub slot: u32,
}

/// `struct gov_stats`: frames forwarded by known flows, one slot, one CPU.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GovStats {
    pub packets: u64,
    pub bytes: u64,
}

/// `struct flow_key`: a flow the engine allowed, as the programs find it
/// (addresses 16 bytes, IPv4 mapped; the frame's MACs; ports in network
/// order).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KernelFlowKey {
    pub net: u32,
    pub gen: u32,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub pad: [u8; 7],
}

/// `struct flow_val`: when the flow was last seen (CLOCK_MONOTONIC ns),
/// and its frames and bytes each way (0: from the key's `src` end).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowVal {
    pub last: u64,
    pub packets: [u64; 2],
    pub bytes: [u64; 2],
}

/// `struct flow_cached`: a CPU's recent flow, and what that CPU forwarded
/// of it not yet added to its `flow_val`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowCached {
    pub k: KernelFlowKey,
    pub at: u64,
    pub packets: [u64; 2],
    pub bytes: [u64; 2],
}

/// `struct clock_val`: the programs' clock for idle checks. The timer's
/// 16 bytes are the kernel's (a lookup returns them zeroed).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClockVal {
    pub timer: [u64; 2],
    pub now: u64,
    pub ticking: u32,
    pub pad: u32,
}

/// `struct drop_event`: a frame the programs dropped, for a monitor
/// (`kernel::drops` reads it from the ring buffer's bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropEvent {
    pub time_ns: u64,
    pub stat: u32,
    pub ifindex: u32,
    pub len: u32,
    pub caplen: u32,
    pub head: [u8; 96],
}

// SAFETY: each type is `repr(C)`, made only of integers and byte arrays,
// laid out without padding (sizes checked below), so
// every byte pattern is a valid value and none is uninitialised: what
// `aya::Pod` requires to copy them to and from the kernel's maps.
unsafe impl aya::Pod for RouteKey {}
// SAFETY: as above.
unsafe impl aya::Pod for RouteVal {}
// SAFETY: as above.
unsafe impl aya::Pod for LinkVal {}
// SAFETY: as above.
unsafe impl aya::Pod for PeerVal {}
// SAFETY: as above.
unsafe impl aya::Pod for Cfg {}
// SAFETY: as above (four u64, 32 bytes).
unsafe impl aya::Pod for PortStats {}
// SAFETY: as above (16 bytes and a u32: 20 bytes).
unsafe impl aya::Pod for VxlanKey {}
// SAFETY: as above (16 bytes).
unsafe impl aya::Pod for AddrKey {}
// SAFETY: as above (twelve bytes).
unsafe impl aya::Pod for PairKey {}
// SAFETY: as above (two u64, 16 bytes).
unsafe impl aya::Pod for PairVal {}
// SAFETY: as above (u32, six bytes, u16: 12 bytes).
unsafe impl aya::Pod for DestKey {}
// SAFETY: as above (two u32, eight bytes: 16 bytes).
unsafe impl aya::Pod for PortVal {}
// SAFETY: as above (u32, four bytes: 8 bytes).
unsafe impl aya::Pod for NeighKey {}
// SAFETY: as above (u32, 16 bytes: 20 bytes).
unsafe impl aya::Pod for GuardKey {}
// SAFETY: as above (six bytes, u16: 8 bytes).
unsafe impl aya::Pod for NeighVal {}
// SAFETY: as above (u32, 16 bytes: 20 bytes).
unsafe impl aya::Pod for Neigh6Key {}
// SAFETY: as above (two u32: 8 bytes).
unsafe impl aya::Pod for GovVal {}
// SAFETY: as above (two u64: 16 bytes).
unsafe impl aya::Pod for GovStats {}
// SAFETY: as above (two u32, 44 bytes, two u16, eight bytes: 64 bytes, no padding).
unsafe impl aya::Pod for KernelFlowKey {}
// SAFETY: as above (five u64: 40 bytes).
unsafe impl aya::Pod for FlowVal {}
// SAFETY: as above (a 64-byte flow key and five u64: 104 bytes).
unsafe impl aya::Pod for FlowCached {}
// SAFETY: as above (three u64, two u32: 32 bytes).
unsafe impl aya::Pod for ClockVal {}

// Each struct's size and every field's offset and size, as the compiled
// object's BTF gives the C struct (`bpf/vnet.h`): checked at compile time.
include!(concat!(env!("OUT_DIR"), "/bpf_layouts.rs"));

/// Whether `path` is on a bpffs (`statfs`'s type `BPF_FS_MAGIC`), where
/// BPF objects can be pinned.
pub fn is_bpffs(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: `statfs` is plain data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid `statfs` to fill.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    r == 0 && st.f_type as u64 == 0xcafe_4a11
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of the programs'
/// `bpf_ktime_get_ns` (a flow's `last`).
pub fn monotonic_ns() -> u64 {
    // SAFETY: `timespec` is plain data; all-zero is a valid value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is a valid `timespec` to fill; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// `struct __sk_buff` as `BPF_PROG_TEST_RUN` takes it for a TC program
/// (192 bytes): the fields a test may set, every other one zero (the
/// kernel refuses a context with others set). `ifindex` picks the device
/// the packet seems to enter (0 or 1: the loopback device).
#[derive(Debug, Clone, Copy, Default)]
pub struct SkbCtx {
    pub ingress_ifindex: u32,
    pub ifindex: u32,
    pub gso_size: u32,
}

/// What a test run of a program returned: its verdict (`TC_ACT_*`) and
/// the packet as it left the program.
#[derive(Debug, Clone)]
pub struct TestRun {
    pub retval: u32,
    pub data: Vec<u8>,
}

/// `union bpf_attr`'s `test` member (BPF_PROG_TEST_RUN), 80 bytes.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    pad: u32,
}
const _: () = assert!(std::mem::size_of::<TestRunAttr>() == 80);

/// Runs the loaded program `prog` once on `packet` (`BPF_PROG_TEST_RUN`,
/// the kernel's own test harness: nothing is sent, a redirect is only the
/// verdict), as if it entered with the context `ctx`. Root (CAP_BPF and
/// CAP_NET_ADMIN) only; used by the programs' tests.
pub fn test_run(prog: std::os::fd::BorrowedFd<'_>, packet: &[u8], ctx: SkbCtx) -> std::io::Result<TestRun> {
    use std::os::fd::AsRawFd as _;
    // `struct __sk_buff`: ingress_ifindex at 36, ifindex at 40, gso_size
    // at 176 (linux/bpf.h).
    let mut skb = [0u32; 48];
    skb[9] = ctx.ingress_ifindex;
    skb[10] = ctx.ifindex;
    skb[44] = ctx.gso_size;
    let mut out = vec![0u8; packet.len() + 256];
    let len = |n: usize| u32::try_from(n).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput));
    let mut attr = TestRunAttr {
        prog_fd: u32::try_from(prog.as_raw_fd())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?,
        data_size_in: len(packet.len())?,
        data_size_out: len(out.len())?,
        data_in: packet.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat: 1,
        ctx_size_in: len(std::mem::size_of_val(&skb))?,
        ctx_in: skb.as_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: `attr` is a valid `bpf_attr.test` of the size passed; its
    // pointers name `packet` and `skb` (read, of the sizes given) and
    // `out` (written, at most `data_size_out` bytes), all alive until the
    // call returns; the kernel keeps none of them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            10, /* BPF_PROG_TEST_RUN */
            &mut attr as *mut TestRunAttr,
            std::mem::size_of::<TestRunAttr>(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    out.truncate(attr.data_size_out as usize);
    Ok(TestRun { retval: attr.retval, data: out })
}
