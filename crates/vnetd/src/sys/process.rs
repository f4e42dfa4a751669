//! The process and its threads: CPU affinity (`sched_setaffinity`,
//! `sched_getaffinity`), the file mode creation mask, the effective user.

use std::io;

/// Restricts the calling thread to CPU `cpu` (`sched_setaffinity`).
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("cpu {cpu} is out of range")));
    }
    // SAFETY: `cpu_set_t` is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` < CPU_SETSIZE (checked above), so CPU_SET stays inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a live, initialised
    // `cpu_set_t` and its true size is passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPUs this process may run on (`sched_getaffinity`).
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: `cpu_set_t` is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; the kernel writes at most the
    // size passed into `set`, which is live and writable.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: every index passed to CPU_ISSET is below CPU_SETSIZE.
    Ok((0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

pub use vnet_client::sys::euid;

/// Sets the process's file mode creation mask (returns the old one): vnetd
/// sets 0o077 at start, so every socket and file it makes (control socket,
/// vhost-user sockets, saved configs, keys) is its owner's alone from the
/// moment it exists.
pub fn set_umask(mask: u32) -> u32 {
    // SAFETY: `umask` takes a plain integer, touches no memory of ours and
    // cannot fail; it changes only the process's creation mask.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

/// This process's effective user id.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid takes nothing, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}
