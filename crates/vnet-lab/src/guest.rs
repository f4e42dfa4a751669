//! QEMU guests (TCG) of the lab: booting, waiting, restarting.

use crate::{registry, run, vm_ip, vm_mac, Error, Guest, Host, Lab, Result, Vm};
use std::path::Path;
use std::time::Duration;
use std::time::Instant;

/// The lab guests' memory, 512 MiB less 8 KiB. QEMU 7.2 (Debian 12's) under
/// TCG can lose a guest's stores across a live migration: syncing the dirty
/// bits of a RAM block a multiple of 64 pages long takes a fast path that
/// clears them without making TCG's TLB catch the next store to the page
/// (fixed in QEMU 9.0 by 03bfc2188f, "physmem: Fix migration dirty bitmap
/// coherency with TCG memory access"; a guest whose kernel timers lived on
/// such a page crashed after migrating, in a CI run). A block of another
/// length takes the page-by-page path, which resets the TLB. KVM, which
/// tracks dirty pages itself, is not affected.
pub const GUEST_MEM: &str = "524280K";

/// The lab guest's kernel and initramfs (`lab/build-guest.sh`, built
/// once into `target/guest`): the guest brings its NIC up with the
/// address of `vnet_ip=ADDR/LEN` and the MTU of `vnet_mtu=N` from the
/// kernel command line, and says `VNET-GUEST-READY MAC` on its console.
pub fn guest_files() -> Result<(String, String)> {
    let repo = crate::bench::repo_dir();
    let out = run(&[
        repo.join("lab/build-guest.sh").to_str().unwrap_or("lab/build-guest.sh"),
        repo.join("target/guest").to_str().unwrap_or("target/guest"),
    ])?;
    let paths = String::from_utf8_lossy(&out.stdout).to_string();
    let mut it = paths.split_whitespace();
    let (Some(kernel), Some(initrd)) = (it.next(), it.next()) else {
        return Err(Error::Other(format!("lab/build-guest.sh printed `{paths}`, not two paths")));
    };
    Ok((kernel.to_string(), initrd.to_string()))
}

impl Lab {
    /// VM 0 of host `h` as a QEMU guest (TCG): on a TAP `q0` in the host
    /// namespace, started and waited for (its console says
    /// `VNET-GUEST-READY`) now; or on a vhost-user socket, started once
    /// vnetd serves it (`Lab::up`).
    pub(crate) fn qemu_vm(&mut self, h: usize, host: &Host) -> Result<Vm> {
        let (kernel, initrd) = guest_files()?;
        let (kernel, initrd) = (kernel.as_str(), initrd.as_str());
        let (mac, ip) = (vm_mac(h, 0), vm_ip(h, 0));
        let mtu = self.spec.vm_mtu.to_string();
        let console = self.dir.join(format!("guest-h{h}.log"));
        let mut append = format!("console=ttyS0 quiet panic=-1 vnet_ip={ip}/16 vnet_mtu={mtu}");
        for (_, a) in self.spec.guest_args.iter().filter(|(g, _)| *g == h) {
            append.push(' ');
            append.push_str(a);
        }
        let mut args: Vec<String> = [
            "qemu-system-x86_64",
            "-accel",
            "tcg",
            "-m",
            GUEST_MEM,
            "-nographic",
            "-no-reboot",
            "-display",
            "none",
            "-monitor",
            "none",
            "-kernel",
            kernel,
            "-initrd",
            initrd,
            "-append",
            &append,
            "-serial",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.push(format!("file:{}", console.display()));
        // QMP, for a live migration (`Lab::migrate_guest`).
        args.push("-qmp".into());
        args.push(format!("unix:{},server=on,wait=off", self.dir.join(format!("qmp-h{h}.sock")).display()));
        let vhost = self.spec.qemu_vhost.then(|| self.dir.join(format!("vhost-h{h}.sock")));
        let q = self.spec.qemu_queues.max(1);
        match &vhost {
            Some(sock) => {
                // Guest memory vnetd can map; MSI-X off (QEMU 7.2 under TCG
                // crashes starting vhost-user with it).
                args.extend(
                    [
                        "-object",
                        &format!("memory-backend-memfd,id=mem0,size={GUEST_MEM},share=on"),
                        "-numa",
                        "node,memdev=mem0",
                        "-chardev",
                        &format!("socket,id=chr0,path={},reconnect=1", sock.display()),
                        "-smp",
                        &q.to_string(),
                        "-netdev",
                        &format!("vhost-user,id=n0,chardev=chr0,queues={q}"),
                        "-device",
                        &format!(
                            "virtio-net-pci,netdev=n0,mac={mac},vectors=0,mrg_rxbuf=on,mq={}",
                            if q > 1 { "on" } else { "off" }
                        ),
                    ]
                    .iter()
                    .map(|a| a.to_string()),
                );
            }
            None => {
                self.guest_tap(&host.ns)?;
                args.extend(
                    ["-netdev", "tap,id=n0,ifname=q0,script=no,downscript=no", "-device"]
                        .iter()
                        .map(|a| a.to_string()),
                );
                args.push(format!("virtio-net-pci,netdev=n0,mac={mac}"));
            }
        }
        let ns = host.ns.clone();
        self.guests.push(Guest { host: h, ns: ns.clone(), args, console: console.clone(), pid: None });
        if vhost.is_none() {
            let i = self.guests.len() - 1;
            self.boot_guest(i)?;
            self.wait_guest(i)?;
        }
        let host_dev = vhost.is_none().then(|| "q0".to_string());
        Ok(Vm { ns, dev: "q0".into(), host_dev, mac, ip, console: Some(console), vhost })
    }

    /// The TAP `q0` a guest's QEMU opens in host namespace `ns`, with the
    /// VMs' MTU, up.
    pub(crate) fn guest_tap(&self, ns: &str) -> Result<()> {
        let mtu = self.spec.vm_mtu.to_string();
        self.ns_exec(ns, &["ip", "tuntap", "add", "dev", "q0", "mode", "tap"])?;
        self.ns_exec(ns, &["ip", "link", "set", "q0", "mtu", &mtu, "up"])?;
        Ok(())
    }

    /// Starts QEMU for guest `i` (a fresh console log).
    pub(crate) fn boot_guest(&mut self, i: usize) -> Result<()> {
        let g = self.guests[i].clone();
        let _ = std::fs::remove_file(&g.console);
        let args: Vec<&str> = g.args.iter().map(String::as_str).collect();
        // QEMU's own complaints (a vhost-user back end it gave up on, a
        // migration it refused) beside the console.
        let pid = self.spawn_logged(&g.ns, &args, &g.console.with_extension("qemu"))?;
        self.guests[i].pid = Some(pid);
        Ok(())
    }

    /// Waits (up to 120 s of TCG boot) for guest `i` to say it is ready.
    pub(crate) fn wait_guest(&self, i: usize) -> Result<()> {
        console_line(&self.guests[i].console, "VNET-GUEST-READY", Duration::from_secs(120)).map(drop)
    }

    /// Stops host `h`'s QEMU (the guest is gone; vnetd keeps serving its
    /// socket) and starts it again, on the same socket or TAP, with `args`
    /// as its extra kernel command line; waits until it is ready.
    pub fn restart_guest(&mut self, h: usize, args: &str) -> Result<()> {
        let i = self
            .guests
            .iter()
            .position(|g| g.host == h)
            .ok_or_else(|| Error::Other(format!("host {h} has no QEMU guest")))?;
        if let Some(pid) = self.guests[i].pid.take() {
            self.kill_child(pid);
        }
        if let Some(a) = self.guests[i].args.iter_mut().find(|a| a.starts_with("console=ttyS0")) {
            let base: Vec<&str> = a
                .split_whitespace()
                .filter(|w| {
                    !w.starts_with("vnet_peer") && !w.starts_with("vnet_ping") && !w.starts_with("vnet_send")
                })
                .collect();
            *a = format!("{} {args}", base.join(" ")).trim().to_string();
        }
        self.boot_guest(i)?;
        self.wait_guest(i)
    }

    /// Kills and reaps one process the lab started.
    pub(crate) fn kill_child(&mut self, pid: u32) {
        if let Some(k) = self.children.iter().position(|c| c.id() == pid) {
            let mut c = self.children.remove(k);
            let _ = c.kill();
            let _ = c.wait();
            registry().1.retain(|p| *p != pid);
        }
    }
}

/// Waits up to `timeout` for a QEMU guest's console (`console`) to print
/// `marker`; returns that line from the marker on (a console line may begin
/// with terminal escapes). The error holds what the console said.
pub fn console_line(console: &Path, marker: &str, timeout: Duration) -> Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let text = std::fs::read_to_string(console).unwrap_or_default();
        // Only whole lines: a TCG guest writes its console a few bytes at a
        // time, and a line read before its newline is a line cut short.
        let whole = text.rfind('\n').map_or("", |end| &text[..end]);
        if let Some(l) = whole.lines().find_map(|l| l.find(marker).map(|i| &l[i..])) {
            return Ok(l.trim().to_string());
        }
        if Instant::now() > deadline {
            return Err(Error::Other(format!(
                "no `{marker}` from the guest in {} s ({}):\n{text}",
                timeout.as_secs(),
                console.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line the guest is still writing is not returned cut short: the
    /// migration test once read "VNET-MD5 6d8" of a whole md5.
    #[test]
    fn console_line_waits_for_the_newline() {
        let path = std::env::temp_dir().join(format!("vnet-console-{}", std::process::id()));
        std::fs::write(&path, "boot\r\n\x1b[0mVNET-MD5 6d8").unwrap();
        let half = console_line(&path, "VNET-MD5 ", Duration::from_millis(300));
        std::fs::write(&path, "boot\r\n\x1b[0mVNET-MD5 6d8f00\r\n").unwrap();
        let whole = console_line(&path, "VNET-MD5 ", Duration::from_millis(300));
        std::fs::remove_file(&path).unwrap();
        assert!(half.is_err(), "{half:?}");
        assert_eq!(whole.unwrap(), "VNET-MD5 6d8f00");
    }
}
