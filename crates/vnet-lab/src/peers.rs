//! What users would run instead of vnet's secured links, as lab overlays
//! for the bench: tinc 1.0 in switch mode (an L2 VPN, its default crypto:
//! Blowfish-CBC and HMAC-SHA1 over RSA-authenticated meta connections)
//! and wireguard-go (WireGuard in user space, an L3 VPN: each host routes
//! the other hosts' VM subnets into it). Both from Debian's packages
//! (`tinc`, `wireguard-go`, `wireguard-tools`), started by the lab (their
//! pids are the lab's, killed on every exit path), each host's files in
//! the lab's directory.

use crate::{io, Error, Host, Lab, Overlay, Result};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::process::Stdio;
use std::time::Duration;

/// tinc's and WireGuard's port on every host.
const TINC_PORT: u16 = 655;
const WG_PORT: u16 = 51820;

impl Lab {
    /// Host `h`'s tincd: a `tinc0` TAP in switch mode in bridge `br0` (its
    /// VMs' veths are there too), a meta connection to every other host.
    /// Every host's key must exist first ([`Lab::tinc_keys`]).
    pub(crate) fn tinc_host(&mut self, h: usize, host: &Host, hosts: &[Host]) -> Result<()> {
        let ns = host.ns.clone();
        let dir = self.dir.join(format!("tinc-h{h}"));
        let mtu = self.spec.vm_mtu.to_string();
        self.ns_exec(&ns, &["ip", "link", "add", "br0", "type", "bridge"])?;
        self.ns_exec(&ns, &["ip", "link", "set", "br0", "mtu", &mtu, "up"])?;
        let mut conf = format!(
            "Name = h{h}\nMode = switch\nDeviceType = tap\nInterface = tinc0\nAddressFamily = ipv4\n\
             BindToAddress = {} {TINC_PORT}\n",
            host.underlay_ip
        );
        for k in (0..hosts.len()).filter(|&k| k != h) {
            conf.push_str(&format!("ConnectTo = h{k}\n"));
            let theirs = self.dir.join(format!("tinc-h{k}/hosts/h{k}"));
            std::fs::copy(&theirs, dir.join(format!("hosts/h{k}")))
                .map_err(io("copying a tinc host file"))?;
        }
        std::fs::write(dir.join("tinc.conf"), conf).map_err(io("writing tinc.conf"))?;
        let up = dir.join("tinc-up");
        let script = format!("#!/bin/sh\nip link set \"$INTERFACE\" mtu {mtu} master br0 up\n");
        std::fs::write(&up, script).map_err(io("writing tinc-up"))?;
        std::fs::set_permissions(&up, std::fs::Permissions::from_mode(0o755)).map_err(io("tinc-up"))?;
        let d = dir.to_string_lossy().to_string();
        let (pid, log) = (format!("--pidfile={d}/pid"), format!("--logfile={d}/log"));
        self.spawn(&ns, &["tincd", "-c", &d, "-D", &pid, &log])?;
        // Up once the TAP is in the bridge (tinc-up ran).
        for _ in 0..100 {
            let o = self.ns_output(&ns, &["ip", "-o", "link", "show", "tinc0"])?;
            if String::from_utf8_lossy(&o.stdout).contains("master br0") {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(Error::Other(format!("tincd of host {h} made no tinc0 in br0 (log: {d}/log)")))
    }

    /// Every host's tinc key pair (`tincd -K`) and host file (its address
    /// and public key), before any tincd starts.
    pub(crate) fn tinc_keys(&self, hosts: &[Host]) -> Result<()> {
        for (h, host) in hosts.iter().enumerate() {
            let dir = self.dir.join(format!("tinc-h{h}"));
            std::fs::create_dir_all(dir.join("hosts")).map_err(io("making a tinc directory"))?;
            let name = dir.join(format!("hosts/h{h}"));
            std::fs::write(&name, format!("Address = {}\nPort = {TINC_PORT}\n", host.underlay_ip))
                .map_err(io("writing a tinc host file"))?;
            std::fs::write(dir.join("tinc.conf"), format!("Name = h{h}\n"))
                .map_err(io("writing tinc.conf"))?;
            let d = dir.to_string_lossy().to_string();
            // Not a terminal: tincd writes its keys where the config says, asking nothing.
            let o = Command::new("tincd")
                .args(["-c", &d, "-K", "2048"])
                .stdin(Stdio::null())
                .output()
                .map_err(io("running tincd -K (apt install tinc)"))?;
            let host_file = std::fs::read_to_string(&name).unwrap_or_default();
            if !o.status.success() || !host_file.contains("BEGIN RSA PUBLIC KEY") {
                return Err(Error::Other(format!("tincd -K: {}", String::from_utf8_lossy(&o.stderr))));
            }
        }
        Ok(())
    }

    /// Host `h`'s wireguard-go device (named per run: its control socket
    /// is under /var/run/wireguard, shared by every namespace), a peer per
    /// other host with that host's VM /24 as its allowed IPs, and routes
    /// to those /24s through it.
    pub(crate) fn wireguard_host(&mut self, h: usize, host: &Host, hosts: &[Host]) -> Result<()> {
        let ns = host.ns.clone();
        let dev = wg_dev(&self.prefix, h);
        let dir = self.dir.clone();
        let key = |k: usize| dir.join(format!("wg-h{k}.key"));
        let public = |k: usize| -> Result<String> {
            let private = std::fs::read_to_string(key(k)).map_err(io("reading a WireGuard key"))?;
            vnetd::keys::pubkey(private.trim()).map_err(|e| Error::Other(e.to_string()))
        };
        self.spawn(
            &ns,
            &["env", "WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD=1", "wireguard-go", "-f", &dev],
        )?;
        let sock = format!("/var/run/wireguard/{dev}.sock");
        for _ in 0..100 {
            if Path::new(&sock).exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let k = key(h).to_string_lossy().to_string();
        let port = WG_PORT.to_string();
        self.ns_exec(&ns, &["wg", "set", &dev, "private-key", &k, "listen-port", &port])?;
        for (o, other) in hosts.iter().enumerate().filter(|&(o, _)| o != h) {
            let (p, end, net) =
                (public(o)?, format!("{}:{WG_PORT}", other.underlay_ip), format!("10.88.{o}.0/24"));
            self.ns_exec(&ns, &["wg", "set", &dev, "peer", &p, "endpoint", &end, "allowed-ips", &net])?;
        }
        let mtu = self.spec.vm_mtu.to_string();
        self.ns_exec(&ns, &["ip", "link", "set", &dev, "mtu", &mtu, "up"])?;
        for o in (0..hosts.len()).filter(|&o| o != h) {
            self.ns_exec(&ns, &["ip", "route", "add", &format!("10.88.{o}.0/24"), "dev", &dev])?;
        }
        Ok(())
    }

    /// Removes the control sockets wireguard-go leaves when it is killed.
    pub(crate) fn forget_wireguard(&self) {
        if self.spec.overlay == Overlay::WireGuard {
            for h in 0..self.spec.hosts {
                let _ = std::fs::remove_file(format!("/var/run/wireguard/{}.sock", wg_dev(&self.prefix, h)));
            }
        }
    }

    /// Every host's WireGuard private key (X25519 in base64, as vnet's).
    pub(crate) fn wireguard_keys(&self, hosts: &[Host]) -> Result<()> {
        for h in 0..hosts.len() {
            let private = vnetd::keys::genkey().map_err(|e| Error::Other(e.to_string()))?;
            let path = self.dir.join(format!("wg-h{h}.key"));
            std::fs::write(&path, format!("{private}\n")).map_err(io("writing a WireGuard key"))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(io("a WireGuard key"))?;
        }
        Ok(())
    }
}

/// Host `h`'s WireGuard device: unique to the run (at most 15 bytes).
fn wg_dev(prefix: &str, h: usize) -> String {
    let tail = format!("w{h}");
    let keep = prefix.len().min(15 - tail.len());
    format!("{}{tail}", &prefix[prefix.len() - keep..])
}
