//! vnet's own etcd in the Kubernetes lab, made as an admin makes one
//! (`vnetctl network init` and the etcd it configures), and the admin's
//! commands on it ([`super::join`] brings the nodes in).

use crate::{io, Error, Lab, Result};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// An etcd user and its password.
pub type Login = (String, String);

/// vnet's etcd and the admin's directory (`network init`'s).
#[derive(Debug, Clone)]
pub struct Store {
    /// The admin's DIR: `network.json`, `ca.pem`, `root.pw`, `net.key`.
    pub dir: PathBuf,
    /// etcd's client URL (`https://NODE0:2379`).
    pub url: String,
    /// The network (the lab's prefix: `/vnet/PREFIX/` as before).
    pub network: String,
    /// Node 0's network namespace, where the admin's commands run.
    ns: String,
}

impl Store {
    /// `vnetctl network init DIR` in node 0's namespace, then its etcd
    /// (`etcd --config-file DIR/etcd.yml`, its output in `log`), waited
    /// for; the etcd's process is the caller's to stop.
    pub(super) fn start(lab: &Lab, dir: PathBuf, log: &Path) -> Result<(Store, Child)> {
        let ns = lab.hosts[0].ns.clone();
        let ip: IpAddr = lab.hosts[0].underlay_ip;
        let store = Store {
            url: format!("https://{}", std::net::SocketAddr::new(ip, 2379)),
            dir,
            network: lab.prefix.clone(),
            ns,
        };
        let dir = store.dir.display().to_string();
        store.vnetctl(&["network", "init", &dir, "network", &store.network, "etcd", &ip.to_string()])?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &store.ns, "etcd", "--config-file"]).arg(store.dir.join("etcd.yml"));
        let mut etcd = crate::process::spawn_logged(cmd, log, "vnet's etcd")?;
        let t0 = Instant::now();
        let root = store.root()?;
        while !store.etcdctl(Some(&root), &["get", "/x"])?.status.success() {
            if t0.elapsed() > Duration::from_secs(30) || !matches!(etcd.try_wait(), Ok(None)) {
                crate::stop_child(etcd);
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let last: Vec<&str> = text.lines().rev().take(10).collect();
                return Err(Error::Other(format!("vnet's etcd not serving within 30 s: {last:?}")));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok((store, etcd))
    }

    /// `vnetctl ARGS` as the admin (node 0's namespace); fails unless it exits 0.
    pub fn vnetctl(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(crate::bin("vnetctl")?)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(io("running vnetctl"))?;
        if !out.status.success() {
            return Err(Error::Command {
                cmd: format!("vnetctl {}", args.join(" ")),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }

    /// etcd's `root` and its password (`DIR/root.pw`).
    pub fn root(&self) -> Result<Login> {
        let pw = std::fs::read_to_string(self.dir.join("root.pw")).map_err(io("reading root.pw"))?;
        Ok(("root".into(), pw.trim().to_string()))
    }

    /// `etcdctl ARGS` against vnet's etcd as `login` (none: anonymous),
    /// whatever its status (a refusal is data).
    pub fn etcdctl(&self, login: Option<&Login>, args: &[&str]) -> Result<Output> {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, "etcdctl", "--endpoints", &self.url])
            .arg(format!("--cacert={}", self.dir.join("ca.pem").display()))
            .env("ETCDCTL_API", "3");
        if let Some((u, p)) = login {
            c.arg(format!("--user={u}:{p}"));
        }
        c.args(args).stdin(Stdio::null()).output().map_err(io("running etcdctl"))
    }

    /// `etcdctl ARGS` as root; fails unless it exits 0.
    pub fn etcdctl_root(&self, args: &[&str]) -> Result<String> {
        let out = self.etcdctl(Some(&self.root()?), args)?;
        if !out.status.success() {
            return Err(Error::Other(format!(
                "etcdctl {} (vnet's etcd, as root): {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
