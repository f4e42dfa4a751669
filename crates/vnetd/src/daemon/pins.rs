//! The kernel path's hand-over, as the daemon sees it: pinning its links
//! for the next vnetd (SIGUSR2), and taking a predecessor's over, at once
//! in static mode or, in cluster mode, once the store's view is applied.

use super::Daemon;
use crate::kernel;

impl Daemon {
    /// Cluster mode: a predecessor's pinned programs keep forwarding with
    /// its maps until [`Daemon::release_pins`] (once the store's view is
    /// listed and applied), not only until this vnetd's first sync: its
    /// links and routes to the other hosts come from the store, after the
    /// start.
    pub fn hold_pins(&mut self) {
        self.kernel.hold_pins = true;
        if let Some(k) = self.kernel.path.as_mut() {
            k.hold_adoption = true;
        }
    }

    /// Ends [`Daemon::hold_pins`]: the held links take this vnetd's
    /// programs and the rest of the predecessor's pins are removed.
    /// Returns what to log, once.
    pub fn release_pins(&mut self) -> Option<String> {
        if !std::mem::take(&mut self.kernel.hold_pins) {
            return None;
        }
        let Some(k) = self.kernel.path.as_mut() else {
            return self.drop_unadopted_pins();
        };
        if let Err(e) = k.release_adoption() {
            tracing::warn!("hand-over: the previous vnetd's links could not all be taken over: {e}");
        }
        self.drop_unadopted_pins()
    }

    /// Whether a predecessor's pins wait for [`Daemon::release_pins`].
    pub fn pins_held(&self) -> bool {
        self.kernel.hold_pins
    }

    /// After the start (config and attachments applied): the predecessor's
    /// pinned links nothing took over are removed, so its program leaves
    /// the devices this vnetd does not serve. Returns what to log.
    pub fn drop_unadopted_pins(&self) -> Option<String> {
        let dir = self.kernel.bpf_dir.as_ref()?;
        let adopted = self.kernel.path.as_ref().map_or(0, |k| k.adopted);
        let left = kernel::pins::Pins::new(dir).clear();
        (adopted + left > 0).then(|| {
            format!("hand-over: took over {adopted} of the previous vnetd's kernel-path links, removed {left} no longer served")
        })
    }

    /// A stop (SIGTERM, not a hand-over): whatever a predecessor pinned
    /// and this vnetd has not taken over (pins still held in cluster mode
    /// if the store's view never came) is removed with the rest, so
    /// nothing of vnet's keeps forwarding. Returns what to log.
    pub fn remove_pins(&mut self) -> Option<String> {
        self.kernel.hold_pins = false;
        let dir = self.kernel.bpf_dir.as_ref()?;
        let n = kernel::pins::Pins::new(dir).clear();
        (n > 0).then(|| format!("stop: removed {n} pinned kernel-path links a previous vnetd left"))
    }

    /// The hand-over (SIGUSR2): pins the kernel path's links so that it
    /// keeps forwarding after this process exits, until the next vnetd
    /// takes them over. Returns how many were pinned.
    pub fn hand_over(&mut self) -> Result<usize, kernel::KernelError> {
        match self.kernel.path.as_mut() {
            Some(k) => k.pin_all(),
            None => Ok(0),
        }
    }
}
