//! A libvirtd (Debian's 9.0) of the lab's own, in a lab host's network
//! namespace, with vnet's qemu hook installed, for the libvirt tests.
//!
//! libvirtd runs privileged (QEMU under it creates TAPs) with its control
//! sockets in the lab's directory, entered into the host's namespace with
//! `nsenter --net` (so the TAPs it makes are the lab host's, and it keeps
//! the real `/sys` with the cgroup hierarchy QEMU is put in), in a mount
//! namespace of its own where `/etc/libvirt`, `/run/libvirt` and
//! `/var/lib/libvirt` are directories of the lab's: its `qemu.conf` (QEMU
//! as root, for the lab's sockets and files are root's; its output to
//! files, no virtlogd), its hook directory (`hooks/qemu.d/`, where libvirt
//! looks, with the hook under test and no other: not the installed
//! package's), its domains and state. Nothing of this machine's libvirt
//! configuration is read or written. The machine needs the packages and a
//! `libvirt-qemu` user (libvirtd will not start without it), which
//! `scripts/test.sh` installs; [`Libvirt::unavailable`] says what is
//! missing.

use super::*;

pub struct Libvirt {
    dir: PathBuf,
    child: Option<Child>,
    domains: Vec<String>,
}

/// The lab's `qemu.conf`.
const QEMU_CONF: &str = "# vnet-lab: QEMU as root (the lab's sockets and files are root's), its\n\
                         # output to files (no virtlogd).\n\
                         user = \"root\"\ngroup = \"root\"\nstdio_handler = \"file\"\n";

/// Run by `sh -c` in libvirtd's new mount namespace with the lab's
/// directory for it and libvirtd's command line: binds the lab's
/// directories over libvirt's and runs libvirtd.
const PRIVATE: &str = "set -e; d=$1; shift; \
                       for p in etc:/etc/libvirt run:/run/libvirt lib:/var/lib/libvirt; do \
                       mkdir -p \"${p#*:}\"; mount --bind \"$d/${p%%:*}\" \"${p#*:}\"; done; exec \"$@\"";

impl Libvirt {
    /// Why libvirtd cannot run the lab's guests here, if it cannot.
    pub fn unavailable() -> Option<String> {
        for b in [
            "/usr/sbin/libvirtd",
            "/usr/bin/virsh",
            "/usr/bin/nsenter",
            "/usr/bin/unshare",
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
        if let Some(why) = Libvirt::unavailable() {
            return Err(Error::Other(why));
        }
        let dir = lab.dir.join(format!("libvirt-h{h}"));
        for d in ["sock", "etc/hooks/qemu.d", "run", "lib"] {
            std::fs::create_dir_all(dir.join(d)).map_err(io("making libvirtd's directories"))?;
        }
        std::fs::write(dir.join("etc/qemu.conf"), QEMU_CONF).map_err(io("writing qemu.conf"))?;
        let conf = format!(
            "unix_sock_dir = \"{0}/sock\"\nauth_unix_rw = \"none\"\nlog_outputs = \"3:file:{0}/libvirtd.log\"\n",
            dir.display()
        );
        std::fs::write(dir.join("libvirtd.conf"), conf).map_err(io("writing libvirtd.conf"))?;
        let hook = dir.join("etc/hooks/qemu.d/vnet");
        // The host's hook configuration: this host's vnetd and the lab's data path
        // (a domain's XML chooses neither).
        let hook_conf = dir.join("libvirt-hook.conf");
        let dp = lab.spec.datapath.clone().unwrap_or_else(|| "user".into());
        let text = format!("control unix:{}\ndatapath {dp}\n", lab.hosts[h].control.display());
        std::fs::write(&hook_conf, text).map_err(io("writing the hook's configuration"))?;
        let script = format!(
            "#!/bin/sh\nexec {} --config {} \"$@\"\n",
            bin("vnet-libvirt-hook")?.display(),
            hook_conf.display()
        );
        std::fs::write(&hook, script).map_err(io("installing the hook"))?;
        std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(io("installing the hook"))?;
        let mut me = Libvirt { dir, child: None, domains: Vec::new() };
        let log = std::fs::File::create(me.dir.join("libvirtd.out")).map_err(io("libvirtd's output"))?;
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", lab.hosts[h].ns))
            .args(["unshare", "--mount", "--propagation", "private", "sh", "-c", PRIVATE, "sh"])
            .arg(&me.dir)
            .args(["libvirtd", "-f"])
            .arg(me.dir.join("libvirtd.conf"))
            .arg("-p")
            .arg(me.dir.join("libvirtd.pid"))
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

    /// libvirtd's log (errors and warnings).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("libvirtd.log")).unwrap_or_default()
    }

    /// Runs `virsh ARGS` against this libvirtd; its stdout, or an error
    /// with its stderr.
    pub fn virsh(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("virsh")
            .arg("-c")
            .arg(format!("qemu:///system?socket={}/sock/libvirt-sock", self.dir.display()))
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
        if let Ok(p) = std::fs::read_to_string(self.dir.join(format!("run/qemu/{name}.pid"))) {
            if let Ok(pid) = p.trim().parse() {
                registry().1.push(pid);
            }
        }
        Ok(())
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
