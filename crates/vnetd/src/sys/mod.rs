//! The one place vnetd talks to the kernel through raw system calls, a
//! module per concern:
//!
//! - [`netdev`]: interface ioctls (driver, MAC, MTU, flags, index) and
//!   entering a network namespace;
//! - [`tap`]: TAP devices and their offloads;
//! - [`netlink`]: the rtnetlink requests ioctls cannot make;
//! - [`packet`]: packet sockets on existing netdevs and their receive ring;
//! - [`udp`]: batched UDP (GSO sends, `recvmmsg` with GRO);
//! - [`sockopt`]: socket options;
//! - [`bpf`]: the eBPF fast path's map structs (twins of the C ones) and
//!   `BPF_PROG_TEST_RUN` (the programs' tests);
//! - [`fds`]: file descriptors passed between processes (a hand-over);
//! - [`memory`]: guest memory lent as bytes;
//! - [`process`]: CPU affinity, umask, the effective user.
//!
//! Everything else uses safe wrappers (`std::fs::File` for TAP reads and
//! writes, `std::net` and `mio` for sockets). Each `unsafe` block states
//! the invariants it relies on. The functions of every module but `bpf`
//! and `fds` are re-exported here (`sys::set_mtu`), as they were when this
//! was one file.
#![allow(unsafe_code)]

pub mod bpf;
pub mod fds;
pub mod memory;
pub mod netdev;
pub mod netlink;
pub mod packet;
pub mod process;
pub mod sockopt;
pub mod tap;
pub mod udp;

pub use bpf::is_bpffs;
pub use memory::*;
pub use netdev::*;
pub use netlink::*;
pub use packet::*;
pub use process::*;
pub use sockopt::*;
pub use tap::*;
pub use udp::*;
