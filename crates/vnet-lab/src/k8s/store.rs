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
    /// whatever its status (a refusal is data). The password is never on
    /// a command line (`/proc/PID/cmdline` is every user's to read): the
    /// user alone is (`--user NAME`), and etcdctl, which then asks for
    /// the password, reads it from standard input (docs/QUICKSTART.md
    /// does the same at a terminal).
    pub fn etcdctl(&self, login: Option<&Login>, args: &[&str]) -> Result<Output> {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, "etcdctl", "--endpoints", &self.url])
            .arg(format!("--cacert={}", self.dir.join("ca.pem").display()))
            .env("ETCDCTL_API", "3");
        if let Some((u, _)) = login {
            c.arg(format!("--user={u}"));
        }
        c.args(args);
        let secret = login.map(|(_, p)| p.as_str()).filter(|p| !p.is_empty());
        if let Some(p) = secret {
            if argv_holds(&c, p) {
                return Err(Error::Other("etcdctl: a password on its command line".into()));
            }
        }
        c.stdin(if secret.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().map_err(io("running etcdctl"))?;
        if let (Some(p), Some(mut stdin)) = (secret, child.stdin.take()) {
            use std::io::Write;
            // etcdctl asks once; a refused write is its early exit, seen below.
            let _ = writeln!(stdin, "{p}");
        }
        let mut out = child.wait_with_output().map_err(io("running etcdctl"))?;
        // Its prompt is on standard output, before the answer.
        if secret.is_some() && out.stdout.starts_with(b"Password: ") {
            let rest = &out.stdout[b"Password: ".len()..];
            out.stdout = rest.strip_prefix(b"\n").unwrap_or(rest).to_vec();
        }
        Ok(out)
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

/// Whether `secret` is in `cmd`'s program or arguments.
fn argv_holds(cmd: &Command, secret: &str) -> bool {
    std::iter::once(cmd.get_program()).chain(cmd.get_args()).any(|a| a.to_string_lossy().contains(secret))
}

/// The processes of this machine (every namespace's: `/proc` is the
/// host's) whose command line holds one of `secrets`, as `PID: ARGV`:
/// what any user of a node sees with `ps`.
pub fn secrets_in_argv(secrets: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else { continue };
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else { continue };
        let argv = String::from_utf8_lossy(&raw).replace('\0', " ");
        if secrets.iter().any(|s| !s.is_empty() && argv.contains(s)) {
            found.push(format!("{pid}: {}", argv.trim_end()));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan finds a process with a secret in its argv (the positive
    /// control: `sh -c 'sleep 30; true' probe-SECRET`), and the guard refuses
    /// a command line that holds a password.
    #[test]
    fn a_secret_on_a_command_line_is_found_and_refused() {
        let secret = format!("s3cret-{}", std::process::id());
        assert!(secrets_in_argv(&[&secret]).is_empty());
        let mut child = Command::new("sh")
            .args(["-c", "sleep 30; true", &format!("probe-{secret}")])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        // Until the child has exec'd sh (before, its command line is still
        // the test's, without the probe), at most 5 s.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut found = secrets_in_argv(&[&secret]);
        while found.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
            found = secrets_in_argv(&[&secret]);
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.iter().any(|f| f.starts_with(&format!("{}: ", child.id()))), "{found:?}");
        let mut c = Command::new("etcdctl");
        c.arg(format!("--user=root:{secret}"));
        assert!(argv_holds(&c, &secret));
        let mut c = Command::new("etcdctl");
        c.arg("--user=root");
        assert!(!argv_holds(&c, &secret), "the user alone");
    }
}
