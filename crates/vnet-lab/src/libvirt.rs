//! A libvirtd (Debian's 9.0) of the lab's own, in a lab host's network
//! namespace, with vnet's qemu hook installed, for the libvirt tests.
//!
//! libvirtd runs privileged (QEMU under it creates TAPs) with its control
//! sockets in the lab's directory, entered into the host's namespace with
//! `nsenter --net` (so the TAPs it makes are the lab host's, and it keeps
//! the real `/sys` with the cgroup hierarchy QEMU is put in). Its hook
//! directory is libvirt's fixed `/etc/libvirt/hooks/qemu.d/`: the hook is
//! linked there as `vnet-lab-PREFIX` for the lab's life. The machine
//! needs `scripts/test.sh`'s preparation: the packages, a `libvirt-qemu`
//! user (libvirtd will not start without it) and a `qemu.conf` with
//! `stdio_handler = "file"` (no virtlogd) and QEMU as root (the lab's
//! sockets and files are root's); [`Libvirt::unavailable`] says what is
//! missing.

use super::*;

pub struct Libvirt {
    dir: PathBuf,
    child: Option<Child>,
    hook: PathBuf,
    domains: Vec<String>,
}

const QEMU_CONF: &str = "/etc/libvirt/qemu.conf";

impl Libvirt {
    /// Why libvirtd cannot run the lab's guests here, if it cannot.
    pub fn unavailable() -> Option<String> {
        for b in ["/usr/sbin/libvirtd", "/usr/bin/virsh", "/usr/bin/nsenter", "/usr/bin/qemu-system-x86_64"] {
            if !Path::new(b).exists() {
                return Some(format!("{b} is missing (scripts/test.sh installs it)"));
            }
        }
        let conf = std::fs::read_to_string(QEMU_CONF).unwrap_or_default();
        let has = |k: &str, v: &str| {
            conf.lines().any(|l| {
                l.split_once('=').is_some_and(|(a, b)| a.trim() == k && b.trim() == format!("\"{v}\""))
            })
        };
        if !(has("user", "root") && has("group", "root") && has("stdio_handler", "file")) {
            return Some(format!(
                "{QEMU_CONF} does not set user and group \"root\" and stdio_handler \"file\" (scripts/test.sh writes it where there is none)"
            ));
        }
        None
    }

    /// Starts libvirtd in host `h`'s namespace with the hook `vnet-libvirt-hook`.
    pub fn start(lab: &Lab, h: usize) -> Result<Libvirt> {
        if let Some(why) = Libvirt::unavailable() {
            return Err(Error::Other(why));
        }
        let dir = lab.dir.join(format!("libvirt-h{h}"));
        std::fs::create_dir_all(dir.join("sock")).map_err(io("making libvirtd's directory"))?;
        let conf = format!(
            "unix_sock_dir = \"{0}/sock\"\nauth_unix_rw = \"none\"\nlog_outputs = \"3:file:{0}/libvirtd.log\"\n",
            dir.display()
        );
        std::fs::write(dir.join("libvirtd.conf"), conf).map_err(io("writing libvirtd.conf"))?;
        let hooks = Path::new("/etc/libvirt/hooks/qemu.d");
        std::fs::create_dir_all(hooks).map_err(io("making libvirt's hook directory"))?;
        let hook = hooks.join(format!("vnet-lab-{}", lab.prefix));
        let _ = std::fs::remove_file(&hook);
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
        let mut me = Libvirt { dir, child: None, hook, domains: Vec::new() };
        let log = std::fs::File::create(me.dir.join("libvirtd.out")).map_err(io("libvirtd's output"))?;
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", lab.hosts[h].ns))
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
        if let Ok(p) = std::fs::read_to_string(format!("/run/libvirt/qemu/{name}.pid")) {
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
        let _ = std::fs::remove_file(&self.hook);
    }
}
