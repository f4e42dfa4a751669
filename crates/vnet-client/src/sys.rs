//! The crate's only `unsafe`: the libc calls it needs.

#![allow(unsafe_code)]

/// The process's effective user id.
pub fn euid() -> u32 {
    // SAFETY: `geteuid` takes no arguments, touches no memory of ours and
    // cannot fail.
    unsafe { libc::geteuid() }
}
