//! What the kinds with a kernel device (`tap`, `netdev`) share: opening in
//! the interface's namespace, offloads the kernel refused, a frame written
//! to the device.

use std::fs::File;
use vnet_control::InterfaceDef;

/// Runs `f` in the interface's namespace, if it names one.
pub(super) fn in_ns<T: Send>(
    def: &InterfaceDef,
    f: impl FnOnce() -> std::io::Result<T> + Send,
) -> std::io::Result<T> {
    match &def.netns {
        Some(ns) => crate::sys::in_netns(&crate::sys::netns_path(ns), f),
        None => f(),
    }
}

/// Counts and logs an interface where the kernel refused offloads.
pub(super) fn offloads_refused(def: &InterfaceDef, g: &vnet_engine::Global) {
    g.offload_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::warn!(interface = %def.name, "the kernel refused offloads: frames are finished in software");
}

/// Gives the VM one frame with one `writev` on `file`; the first write the
/// kernel refuses is logged (`logged`), every one is a counted drop.
pub(super) fn write_frame(
    file: &File,
    payload: vnet_engine::Payload<'_>,
    logged: &std::sync::atomic::AtomicBool,
) -> bool {
    use std::io::Write;
    payload.each_frame(|parts, hdr| {
        let want: usize = parts.iter().map(|p| p.len()).sum();
        match (&*file).write_vectored(parts) {
            Ok(n) if n == want => true,
            r => {
                if !logged.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    let head: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).take(24).collect();
                    tracing::warn!(
                        "the device refused a {want}-byte frame (offload header: {hdr}, first bytes {head:02x?}): \
                         {r:?} (logged once)"
                    );
                }
                false
            }
        }
    })
}
