//! A libvirtd (Debian's 9.0) of the lab's own, in a lab host's network
//! namespace, with vnet's qemu hook installed, for the libvirt tests; two
//! of them, on two hosts, migrate a domain between them as operators do
//! (`virsh migrate --live` over TLS).
//!
//! libvirtd runs privileged (QEMU under it creates TAPs) with its control
//! sockets in the lab's directory, entered into the host's namespace with
//! `nsenter --net` (so the TAPs it makes are the lab host's, and it keeps
//! the real `/sys` with the cgroup hierarchy QEMU is put in), in a mount
//! namespace of its own where `/etc/libvirt`, `/run/libvirt`,
//! `/var/lib/libvirt` and `/var/log/libvirt` are directories of the
//! lab's: its `qemu.conf` (QEMU as root, for the lab's sockets and files
//! are root's; its output to files, no virtlogd; incoming migrations on
//! the host's underlay address), its hook directory (`hooks/qemu.d/`,
//! where libvirt looks, with the hook under test and no other: not the
//! installed package's), its domains and state. And in a UTS namespace
//! of its own with the lab host's name, and a host UUID of its own
//! (`host_uuid`): libvirt refuses a migration to "the same host", which
//! two libvirtds on one machine would otherwise be. Nothing of this
//! machine's libvirt configuration is read or written. The machine needs
//! the packages and a `libvirt-qemu` user (libvirtd will not start
//! without it), which `scripts/test.sh` installs; [`Libvirt::unavailable`]
//! says what is missing.
//!
//! Started with a [`LibvirtPki`], libvirtd also listens for TLS on the
//! host's underlay address (`libvirtd --listen`, `listen_tls`), with a
//! server certificate of the lab's CA for that address, and admits only
//! clients with a certificate of that CA whose name is on its
//! `tls_allowed_dn_list`: libvirt's x509 authentication, as its TLS page
//! documents it. `virsh` is that client, with the `pkipath` of the
//! migrating operator's credentials.

use crate::pki::Ca;
use crate::{bin, io, registry, stop_child, Error, Lab, Result, GUEST_MEM};
use std::net::IpAddr;
use std::path::Path;
use std::path::PathBuf;
use std::process::Child;
use std::process::Command;
use std::process::Stdio;
use std::time::Duration;
use std::time::Instant;

pub struct Libvirt {
    dir: PathBuf,
    /// The lab host's namespace and underlay address.
    ns: String,
    ip: IpAddr,
    child: Option<Child>,
    domains: Vec<String>,
}

/// The certificate name `virsh migrate` presents, and the only one the
/// lab's libvirtds admit over TLS.
const CLIENT_CN: &str = "vnet-lab-migrator";

/// The lab's libvirt CA and the migrating client's credentials: a
/// directory for libvirt's `pkipath` (`cacert.pem`, `clientcert.pem`,
/// `clientkey.pem`).
pub struct LibvirtPki {
    ca: Ca,
    pub dir: PathBuf,
}

impl LibvirtPki {
    pub fn new(lab: &Lab) -> Result<LibvirtPki> {
        let dir = lab.dir.join("libvirt-pki");
        std::fs::create_dir_all(&dir).map_err(io("making the libvirt PKI directory"))?;
        let ca = Ca::new("vnet-lab libvirt CA")?;
        let f = ca.host(&dir, CLIENT_CN, IpAddr::from([127, 0, 0, 1]))?;
        for (from, to) in [(&f.cert, "clientcert.pem"), (&f.key, "clientkey.pem"), (&f.ca, "cacert.pem")] {
            std::fs::rename(from, dir.join(to)).map_err(io("placing the client's credentials"))?;
        }
        Ok(LibvirtPki { ca, dir })
    }
}

/// The lab's `qemu.conf` for a host with underlay address `ip`.
fn qemu_conf(ip: IpAddr) -> String {
    format!(
        "# vnet-lab: QEMU as root (the lab's sockets and files are root's), its\n\
         # output to files (no virtlogd); incoming migrations on the underlay.\n\
         user = \"root\"\ngroup = \"root\"\nstdio_handler = \"file\"\n\
         migration_address = \"{ip}\"\nmigration_host = \"{ip}\"\n"
    )
}

/// The emulator the lab's `virsh migrate` domains name (`<emulator>`):
/// QEMU with [`GUEST_MEM`] where libvirt says 512 MiB. libvirt rounds a
/// domain's memory up to whole MiB (`<memory unit='KiB'>524280` starts
/// QEMU with `-m 512` and a `pc.ram` backend of 536870912 bytes), a
/// length QEMU 7.2's TCG migration bug meets (see [`GUEST_MEM`]); this
/// changes those two arguments, says so on QEMU's log (libvirt's
/// `qemu/NAME.log`) and runs Debian's QEMU. Lab-only: under KVM, or a
/// QEMU of 9.0 or later, a domain names `/usr/bin/qemu-system-x86_64`.
const EMULATOR: &str = r#"#!/bin/bash
set -e
args=() prev=
for a in "$@"; do
    b=$a
    if [ "$prev" = -m ] && { [ "$a" = 512 ] || [ "$a" = size=524288k ]; }; then
        b=size=@KIB@k
        echo "vnet-lab emulator: -m $a -> -m $b (QEMU 7.2's TCG migration bug)" >&2
    fi
    case $a in *'"id":"pc.ram"'*'"size":536870912'*|*'"size":536870912'*'"id":"pc.ram"'*)
        b=${a/'"size":536870912'/'"size":@BYTES@'}
        echo "vnet-lab emulator: pc.ram 536870912 -> @BYTES@ bytes" >&2 ;;
    esac
    args+=("$b") prev=$a
done
exec /usr/bin/qemu-system-x86_64 "${args[@]}"
"#;

/// Writes [`EMULATOR`] into the lab's directory; its path, for a domain's
/// `<emulator>` (the same on both hosts, as a migrated domain needs).
pub fn lab_emulator(lab: &Lab) -> Result<PathBuf> {
    let kib: u64 = GUEST_MEM
        .strip_suffix('K')
        .and_then(|k| k.parse().ok())
        .ok_or_else(|| Error::Other(format!("GUEST_MEM {GUEST_MEM:?} is not a number of KiB")))?;
    let path = lab.dir.join("qemu-lab-emulator");
    let text = EMULATOR.replace("@KIB@", &kib.to_string()).replace("@BYTES@", &(kib * 1024).to_string());
    std::fs::write(&path, text).map_err(io("writing the lab's emulator"))?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(io("writing the lab's emulator"))?;
    Ok(path)
}

/// Run by `sh -c` in libvirtd's new mount and UTS namespaces with the
/// lab's directory for it, the host's name and libvirtd's command line:
/// names the host, binds the lab's directories over libvirt's and runs
/// libvirtd.
const PRIVATE: &str = "set -e; d=$1; hostname \"$2\"; shift 2; \
                       for p in etc:/etc/libvirt run:/run/libvirt lib:/var/lib/libvirt log:/var/log/libvirt; do \
                       mkdir -p \"$d/${p%%:*}\" \"${p#*:}\"; mount --bind \"$d/${p%%:*}\" \"${p#*:}\"; done; \
                       exec \"$@\"";

/// A host UUID of its own for each libvirtd (not all digits the same).
fn host_uuid(h: usize) -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let n = u64::from(t.subsec_nanos()) ^ (u64::from(std::process::id()) << 32);
    format!("{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}", n as u32, h + 1, h & 0xfff, (n >> 40) & 0xfff, n >> 16)
}

impl Libvirt {
    /// Why libvirtd cannot run the lab's guests here, if it cannot.
    pub fn unavailable() -> Option<String> {
        for b in [
            "/usr/sbin/libvirtd",
            "/usr/bin/virsh",
            "/usr/bin/nsenter",
            "/usr/bin/unshare",
            "/usr/bin/stdbuf",
            "/usr/bin/qemu-system-x86_64",
        ] {
            if !Path::new(b).exists() {
                return Some(format!("{b} is missing (scripts/test.sh installs it)"));
            }
        }
        None
    }

    /// Starts libvirtd in host `h`'s namespace with the hook `vnet-libvirt-hook`.
    pub fn start(lab: &Lab, h: usize) -> Result<Libvirt> {
        Libvirt::start_with(lab, h, None)
    }

    /// Starts libvirtd in host `h`'s namespace, listening for TLS on the
    /// host's underlay address with a certificate of `pki`'s CA.
    pub fn start_listening(lab: &Lab, h: usize, pki: &LibvirtPki) -> Result<Libvirt> {
        Libvirt::start_with(lab, h, Some(pki))
    }

    fn start_with(lab: &Lab, h: usize, pki: Option<&LibvirtPki>) -> Result<Libvirt> {
        if let Some(why) = Libvirt::unavailable() {
            return Err(Error::Other(why));
        }
        let host = &lab.hosts[h];
        let dir = lab.dir.join(format!("libvirt-h{h}"));
        for d in ["sock", "etc/hooks/qemu.d", "run", "lib", "log", "pki"] {
            std::fs::create_dir_all(dir.join(d)).map_err(io("making libvirtd's directories"))?;
        }
        std::fs::write(dir.join("etc/qemu.conf"), qemu_conf(host.underlay_ip))
            .map_err(io("writing qemu.conf"))?;
        let mut conf = format!(
            "unix_sock_dir = \"{0}/sock\"\nauth_unix_rw = \"none\"\nlog_outputs = \"3:file:{0}/libvirtd.log\"\n\
             host_uuid = \"{1}\"\n",
            dir.display(),
            host_uuid(h)
        );
        if let Some(pki) = pki {
            let s = pki.ca.host(&dir.join("pki"), "server", host.underlay_ip)?;
            conf += &format!(
                "listen_tls = 1\nlisten_tcp = 0\nlisten_addr = \"{}\"\nauth_tls = \"none\"\n\
                 key_file = \"{}\"\ncert_file = \"{}\"\nca_file = \"{}\"\ntls_allowed_dn_list = [\"CN={CLIENT_CN}\"]\n",
                host.underlay_ip,
                s.key.display(),
                s.cert.display(),
                s.ca.display()
            );
        }
        std::fs::write(dir.join("libvirtd.conf"), conf).map_err(io("writing libvirtd.conf"))?;
        Libvirt::install_hook(lab, h, &dir)?;
        let mut me =
            Libvirt { dir, ns: host.ns.clone(), ip: host.underlay_ip, child: None, domains: Vec::new() };
        let log = std::fs::File::create(me.dir.join("libvirtd.out")).map_err(io("libvirtd's output"))?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", me.ns))
            .args(["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", PRIVATE, "sh"])
            .arg(&me.dir)
            .arg(format!("{}-h{h}", lab.prefix))
            .args(["libvirtd", "-f"])
            .arg(me.dir.join("libvirtd.conf"))
            .arg("-p")
            .arg(me.dir.join("libvirtd.pid"));
        if pki.is_some() {
            cmd.arg("--listen");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(io("libvirtd's output"))?)
            .stderr(log)
            .spawn()
            .map_err(io("starting libvirtd"))?;
        registry().1.push(child.id());
        me.child = Some(child);
        let t0 = Instant::now();
        while me.virsh(&["list", "--all"]).is_err() {
            if t0.elapsed() > Duration::from_secs(20) {
                return Err(Error::Other(format!("libvirtd did not answer within 20 s: {}", me.log())));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(me)
    }

    /// The hook under test in `dir`'s hook directory, with host `h`'s
    /// configuration: this host's vnetd and the lab's data path (a
    /// domain's XML chooses neither), its log and its incoming marks in
    /// `dir`.
    fn install_hook(lab: &Lab, h: usize, dir: &Path) -> Result<()> {
        let hook = dir.join("etc/hooks/qemu.d/vnet");
        let hook_conf = dir.join("libvirt-hook.conf");
        let dp = lab.spec.datapath.clone().unwrap_or_else(|| "user".into());
        let text = format!(
            "control unix:{}\ndatapath {dp}\nlog {}\nincoming {}\n",
            lab.hosts[h].control.display(),
            dir.join("hook.log").display(),
            dir.join("incoming").display()
        );
        std::fs::write(&hook_conf, text).map_err(io("writing the hook's configuration"))?;
        let script = format!(
            "#!/bin/sh\nexec {} --config {} \"$@\"\n",
            bin("vnet-libvirt-hook")?.display(),
            hook_conf.display()
        );
        std::fs::write(&hook, script).map_err(io("installing the hook"))?;
        std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(io("installing the hook"))
    }

    /// libvirtd's log (errors and warnings).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("libvirtd.log")).unwrap_or_default()
    }

    /// QEMU's log of domain `name` (libvirt's `qemu/NAME.log`: the command
    /// line libvirt started it with, then QEMU's own output).
    pub fn qemu_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("log/qemu/{name}.log"))).unwrap_or_default()
    }

    /// What the hook said it did, a line per step and request.
    pub fn hook_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("hook.log")).unwrap_or_default()
    }

    /// This libvirtd's local URI (its socket in the lab's directory).
    fn local(&self) -> String {
        format!("qemu:///system?socket={}/sock/libvirt-sock", self.dir.display())
    }

    /// This libvirtd's URI for another host: TLS to its underlay address,
    /// with the client credentials in `pki`.
    pub fn remote(&self, pki: &LibvirtPki) -> String {
        let host = match self.ip {
            IpAddr::V4(a) => a.to_string(),
            IpAddr::V6(a) => format!("[{a}]"),
        };
        format!("qemu+tls://{host}/system?pkipath={}", pki.dir.display())
    }

    /// Runs `virsh ARGS` against this libvirtd; its stdout, or an error
    /// with its stderr.
    pub fn virsh(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("virsh")
            .arg("-c")
            .arg(self.local())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(io("running virsh"))?;
        if !out.status.success() {
            return Err(Error::Other(format!(
                "virsh {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `virsh define` of `xml` (its domain is destroyed and undefined on drop).
    pub fn define(&mut self, name: &str, xml: &str) -> Result<()> {
        let f = self.dir.join(format!("{name}.xml"));
        std::fs::write(&f, xml).map_err(io("writing the domain XML"))?;
        self.virsh(&["define", &f.display().to_string()])?;
        self.domains.push(name.to_string());
        Ok(())
    }

    /// `virsh start NAME`; QEMU's pid goes into the lab's registry (killed
    /// on a signal, should libvirtd not be there to stop it).
    pub fn start_domain(&self, name: &str) -> Result<()> {
        self.virsh(&["start", name])?;
        self.register_qemu(name);
        Ok(())
    }

    fn register_qemu(&self, name: &str) {
        if let Ok(p) = std::fs::read_to_string(self.dir.join(format!("run/qemu/{name}.pid"))) {
            if let Ok(pid) = p.trim().parse() {
                registry().1.push(pid);
            }
        }
    }

    /// `virsh migrate --live NAME URI --xml FILE` as an operator on this
    /// host runs it (in its namespace, where `to`'s underlay address is
    /// reached): the domain moves to `to`, described there by `xml` (the
    /// same domain with that host's paths). It is `to`'s to destroy on
    /// drop from then on. virsh's output, or an error with it.
    pub fn migrate_live(&self, name: &str, to: &mut Libvirt, pki: &LibvirtPki, xml: &str) -> Result<String> {
        let f = to.dir.join(format!("{name}-incoming.xml"));
        std::fs::write(&f, xml).map_err(io("writing the destination's domain XML"))?;
        to.domains.push(name.to_string());
        let out = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.ns))
            .args(["virsh", "-c", &self.local(), "migrate", "--live", name, &to.remote(pki), "--xml"])
            .arg(&f)
            .stdin(Stdio::null())
            .output()
            .map_err(io("running virsh migrate"))?;
        to.register_qemu(name);
        let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return Err(Error::Other(format!(
                "virsh migrate: {said}\nsource libvirtd: {}\ndestination libvirtd: {}",
                self.log(),
                to.log()
            )));
        }
        Ok(said)
    }

    /// `virsh event --all --loop --timestamp` against this libvirtd until
    /// [`Events::stop`]: the domains' lifecycle events (QEMU's, as libvirt
    /// relays them), each stamped by virsh.
    pub fn events(&self) -> Result<Events> {
        let path = self.dir.join("events.log");
        let out = std::fs::File::create(&path).map_err(io("virsh event's output"))?;
        // Line-buffered: every event is in the file when it is read.
        let child = Command::new("stdbuf")
            .args(["-oL", "virsh", "-c", &self.local(), "event", "--all", "--loop", "--timestamp"])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(Stdio::null())
            .spawn()
            .map_err(io("running virsh event"))?;
        registry().1.push(child.id());
        Ok(Events { child: Some(child), path })
    }
}

/// A running `virsh event` ([`Libvirt::events`]); stopped on drop.
pub struct Events {
    child: Option<Child>,
    path: PathBuf,
}

impl Events {
    /// Stops it; what it printed.
    pub fn stop(mut self) -> String {
        if let Some(c) = self.child.take() {
            stop_child(c);
        }
        std::fs::read_to_string(&self.path).unwrap_or_default()
    }

    /// When (ms into virsh's UTC day) `domain` had the lifecycle event
    /// `what` (e.g. `Suspended Migrated`), from virsh's lines
    /// (`YYYY-MM-DD HH:MM:SS.mmm+0000: event 'lifecycle' for domain 'D': WHAT`).
    pub fn at(text: &str, domain: &str, what: &str) -> Option<u64> {
        let tail = format!(": event 'lifecycle' for domain '{domain}': {what}");
        let line = text.lines().find(|l| l.ends_with(&tail))?;
        let time = line.split_whitespace().nth(1)?.split('+').next()?;
        let mut parts = time.split([':', '.']).map(|p| p.parse::<u64>().ok());
        let (h, m, s, ms) = (parts.next()??, parts.next()??, parts.next()??, parts.next()??);
        Some(((h * 60 + m) * 60 + s) * 1000 + ms)
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        if let Some(c) = self.child.take() {
            stop_child(c);
        }
    }
}

impl Drop for Libvirt {
    fn drop(&mut self) {
        for d in &self.domains {
            let _ = self.virsh(&["destroy", d]);
            let _ = self.virsh(&["undefine", d]);
        }
        if let Some(c) = self.child.take() {
            stop_child(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virsh_event_lines_give_their_time() {
        let text = "2026-11-28 10:20:30.123+0000: event 'lifecycle' for domain 'g': Started Migrated\n\
                    2026-11-28 10:20:31.045+0000: event 'lifecycle' for domain 'g': Suspended Migrated\n";
        assert_eq!(Events::at(text, "g", "Suspended Migrated"), Some(((10 * 60 + 20) * 60 + 31) * 1000 + 45));
        assert_eq!(Events::at(text, "g", "Resumed Migrated"), None);
        assert_eq!(Events::at(text, "h", "Started Migrated"), None);
    }

    #[test]
    fn host_uuids_differ_by_host_and_are_uuids() {
        let (a, b) = (host_uuid(1), host_uuid(2));
        assert_ne!(a, b);
        assert_eq!(a.len(), 36, "{a}");
        assert_eq!(a.matches('-').count(), 4, "{a}");
    }
}
