//! Driving the `vnet-cni` plugin as a container runtime does (`cnitool`'s
//! way: the `CNI_*` variables and the configuration on stdin), inside a
//! lab host's namespace, where the host's vnetd runs.

use crate::{bin, io, run, Error, Lab, Result};
use std::path::PathBuf;
use std::process::Command;
use std::process::Output;
use std::process::Stdio;

/// One plugin run: whether it exited 0, and what it printed (the result
/// or the error JSON; `Null` when it printed nothing).
#[derive(Debug, Clone)]
pub struct CniRun {
    pub ok: bool,
    pub out: serde_json::Value,
    pub stderr: String,
}

impl CniRun {
    /// The error JSON's code (0 when it succeeded).
    pub fn code(&self) -> u64 {
        if self.ok {
            0
        } else {
            self.out.get("code").and_then(serde_json::Value::as_u64).unwrap_or(u64::MAX)
        }
    }
}

/// The reference plugins (`host-local`, ...) of Debian's
/// `containernetworking-plugins`, and the workspace's binaries.
pub fn cni_path() -> Result<String> {
    let ours = bin("vnet-cni")?;
    let dir = ours.parent().map(|p| p.display().to_string()).unwrap_or_default();
    Ok(format!("{dir}:/usr/lib/cni"))
}

impl Lab {
    /// A network configuration for host `h`: `vnet-cni` on the host's
    /// control socket, records under the lab's directory, the lab's VM MTU
    /// and data path, and `ipam` as given (`Null`: none).
    pub fn cni_conf(&self, h: usize, version: &str, ipam: serde_json::Value) -> serde_json::Value {
        let mut c = serde_json::json!({
            "cniVersion": version,
            "name": self.prefix,
            "type": "vnet-cni",
            "control": format!("unix:{}", self.hosts[h].control.display()),
            "stateDir": self.dir.join(format!("cni-h{h}")).display().to_string(),
            "mtu": self.spec.vm_mtu,
            "datapath": self.spec.datapath.clone().unwrap_or_else(|| "user".into()),
        });
        if !ipam.is_null() {
            c["ipam"] = ipam;
        }
        c
    }

    /// Runs `vnet-cni` with `command` in host `h`'s namespace for the
    /// container `id` whose namespace is `netns` (a path; `None`: unset),
    /// interface `eth0`, with `stdin` as its configuration.
    pub fn cni(
        &self,
        h: usize,
        command: &str,
        id: &str,
        netns: Option<&str>,
        stdin: &[u8],
    ) -> Result<CniRun> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.hosts[h].ns])
            .arg(bin("vnet-cni")?)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", id)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", cni_path()?)
            .env_remove("CNI_NETNS")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(n) = netns {
            cmd.env("CNI_NETNS", n);
        }
        let mut child = cmd.spawn().map_err(io("running vnet-cni"))?;
        if let Some(mut i) = child.stdin.take() {
            std::io::Write::write_all(&mut i, stdin).map_err(io("writing vnet-cni's stdin"))?;
        }
        let out = child.wait_with_output().map_err(io("waiting for vnet-cni"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let json = if text.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&text)
                .map_err(|e| Error::Other(format!("vnet-cni {command} printed no JSON ({e}): {text}")))?
        };
        Ok(CniRun {
            ok: out.status.success(),
            out: json,
            stderr: String::from_utf8_lossy(&out.stderr).into(),
        })
    }
}

/// A podman (Debian's 4.3) of its own for one lab host: storage, runtime
/// state and network configs under the lab's directory, run in the host's
/// network namespace with `nsenter` (not `ip netns exec`, which mounts a
/// sysfs without the cgroup hierarchy runc needs), the `cni` network
/// backend with the workspace's `vnet-cni`, `runc` (Debian's `crun` 1.8
/// refuses this machine's hybrid cgroup layout), and an image made here
/// from busybox (no registry is reachable).
pub struct Podman {
    ns: String,
    dir: PathBuf,
}

impl Podman {
    /// Sets podman up for host `h` with network config `conflist` (its
    /// `name` is the network's) and imports the image `localhost/vnetbox`.
    pub fn new(lab: &Lab, h: usize, conflist: &serde_json::Value) -> Result<Podman> {
        let dir = lab.dir.join(format!("podman-h{h}"));
        let net = dir.join("net");
        std::fs::create_dir_all(&net).map_err(io("making podman's directory"))?;
        let name = conflist["name"].as_str().unwrap_or("vnet");
        std::fs::write(net.join(format!("{name}.conflist")), conflist.to_string())
            .map_err(io("writing the conflist"))?;
        let plugins = bin("vnet-cni")?.parent().map(|p| p.display().to_string()).unwrap_or_default();
        let conf = format!(
            "[network]\nnetwork_backend = \"cni\"\ncni_plugin_dirs = [\"{plugins}\", \"/usr/lib/cni\"]\n\
             network_config_dir = \"{}\"\n[engine]\nevents_logger = \"file\"\ncgroup_manager = \"cgroupfs\"\n\
             runtime = \"runc\"\n[containers]\ndefault_ulimits = [\"nofile=1024:1024\", \"nproc=1024:1024\"]\n",
            net.display()
        );
        std::fs::write(dir.join("containers.conf"), conf).map_err(io("writing containers.conf"))?;
        let rootfs = dir.join("rootfs");
        std::fs::create_dir_all(rootfs.join("bin")).map_err(io("making the image's root"))?;
        std::fs::create_dir_all(rootfs.join("tmp")).map_err(io("making the image's root"))?;
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).map_err(io("copying busybox"))?;
        for c in ["sh", "sleep", "ping", "ip", "cat"] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(c))
                .map_err(io("linking busybox"))?;
        }
        let tar = dir.join("rootfs.tar");
        run(&["tar", "-C", &rootfs.display().to_string(), "-cf", &tar.display().to_string(), "."])?;
        let p = Podman { ns: lab.hosts[h].ns.clone(), dir };
        p.ok(&["import", &tar.display().to_string(), "localhost/vnetbox"])?;
        Ok(p)
    }

    /// Runs `podman ARGS` and returns its output whatever its status.
    pub fn output(&self, args: &[&str]) -> Result<Output> {
        Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.ns))
            .arg("podman")
            .arg("--root")
            .arg(self.dir.join("root"))
            .arg("--runroot")
            .arg(self.dir.join("run"))
            .args(["--storage-driver", "vfs"])
            .args(args)
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .stdin(Stdio::null())
            .output()
            .map_err(io("running podman"))
    }

    /// Runs `podman ARGS`; its stdout, or an error with its stderr.
    pub fn ok(&self, args: &[&str]) -> Result<String> {
        let out = self.output(args)?;
        if !out.status.success() {
            return Err(Error::Other(format!(
                "podman {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

impl Drop for Podman {
    /// Removes every container it ran (and so their CNI attachments).
    fn drop(&mut self) {
        let _ = self.output(&["rm", "--all", "--force", "--time", "0"]);
    }
}
