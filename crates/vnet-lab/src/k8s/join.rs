//! Each node its own identity in vnet's store (issue 67), exactly as
//! `docs/QUICKSTART.md` brings a host in and nothing granted by hand:
//!
//! - **The store** ([`super::store`]): `vnetctl network init` on node
//!   0's machine (the admin's, as kubeadm's etcd is the control-plane
//!   node's) and the etcd it configures, run there on node 0's address:
//!   vnet's own etcd, not the lab's (which kube-apiserver uses, with
//!   client certificates).
//! - **A token per node**: `vnetctl network token DIR NODE file ...`,
//!   written where the manifest's `join` init container reads it, the
//!   node's `/var/lib/vnet/join.token` (the admin's `scp`).
//! - **Approval**: the `join` init container runs `vnetctl join`, which
//!   makes the node's key and etcd password on the node and prints the
//!   request's fingerprint (its log); the admin reads it with `kubectl
//!   logs POD -c join` and runs `vnetctl network approve DIR NODE key FP`.
//!   The node's vnetd then logs in as `vnet/NET/NODE`, whose role writes
//!   only that node's keys (`vnet_cluster::layout::host_grants`).

use super::store::Login;
use super::Kube;
use crate::{io, Error, Result};
use std::time::{Duration, Instant};

/// The login node `n` joined with: the `etcd-user` of the `cluster`
/// line `vnetctl join` wrote on the node, and the password file it
/// names (what the node's vnetd logs in with).
pub fn node_login(kube: &Kube, n: usize) -> Result<Login> {
    let store = kube.store()?;
    let dir = kube.nodes[n].dir.join("lib-vnet/join");
    let conf = std::fs::read_to_string(dir.join(format!("{}.conf", store.network)))
        .map_err(io("reading the node's joined configuration"))?;
    let user = conf
        .split_whitespace()
        .skip_while(|w| *w != "etcd-user")
        .nth(1)
        .ok_or_else(|| Error::Other(format!("no etcd-user in the node's configuration: {conf}")))?;
    let pw = std::fs::read_to_string(dir.join(format!("{}.etcd-pw", store.network)))
        .map_err(io("reading the node's etcd password"))?;
    Ok((user.to_string(), pw.trim().to_string()))
}

/// What the admin does before `kubectl apply` (docs/INTEGRATION.md, "Each
/// node its own identity"): the ConfigMap `vnet-network` (the network's
/// name and etcd's address: nothing secret) and a join token on each node
/// at `/var/lib/vnet/join.token`.
pub fn prepare_nodes(kube: &Kube) -> Result<()> {
    let store = kube.store()?;
    kube.kubectl(&[
        "-n",
        "kube-system",
        "create",
        "configmap",
        "vnet-network",
        &format!("--from-literal=network={}", store.network),
        &format!("--from-literal=etcd={}", store.url),
    ])?;
    let dir = store.dir.display().to_string();
    for node in &kube.nodes {
        let lib = node.dir.join("lib-vnet");
        std::fs::create_dir_all(&lib).map_err(io("making the node's /var/lib/vnet"))?;
        let file = lib.join("join.token").display().to_string();
        store.vnetctl(&["network", "token", &dir, &node.name, "file", &file])?;
    }
    Ok(())
}

/// After `kubectl apply`: for each node, the fingerprint its `join` init
/// container printed (`kubectl logs`), and `vnetctl network approve DIR
/// NODE key FP`, as the admin does once the node's screen showed it.
pub fn approve_nodes(kube: &Kube, within: Duration) -> Result<()> {
    let store = kube.store()?;
    let dir = store.dir.display().to_string();
    let mut left: Vec<&str> = kube.nodes.iter().map(|n| n.name.as_str()).collect();
    let (t0, mut last) = (Instant::now(), None);
    while !left.is_empty() {
        let pods = kube.get_json(&["-n", "kube-system", "get", "pods", "-l", "app=vnet"])?;
        for p in pods["items"].as_array().into_iter().flatten() {
            let (Some(pod), Some(node)) = (p["metadata"]["name"].as_str(), p["spec"]["nodeName"].as_str())
            else {
                continue;
            };
            if !left.contains(&node) {
                continue;
            }
            let log = kube.kubectl_output(&["-n", "kube-system", "logs", pod, "-c", "join"])?;
            let log = String::from_utf8_lossy(&log.stdout);
            // (join prints it just before it files the request: until
            // then, approve finds none and is asked again.)
            let Some(fp) = fingerprint(&log) else { continue };
            match store.vnetctl(&["network", "approve", &dir, node, "key", fp]) {
                Ok(_) => left.retain(|n| *n != node),
                Err(e) => last = Some(e),
            }
        }
        if t0.elapsed() > within {
            return Err(Error::Other(format!(
                "{left:?} not approved within {within:?} (last refusal: {last:?})"
            )));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    Ok(())
}

/// The fingerprint in `vnetctl join`'s line `... key fingerprint FP`.
fn fingerprint(log: &str) -> Option<&str> {
    log.lines().find_map(|l| l.split("key fingerprint ").nth(1)).map(str::trim).filter(|f| !f.is_empty())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fingerprint_is_read_from_joins_line() {
        let log = "vnetctl join: host n1 at 10.77.0.2, key fingerprint 6f5d1cb8\n\
                   vnetctl join: on the admin host, after comparing it: vnetctl network approve DIR n1 key 6f5d1cb8\n";
        assert_eq!(super::fingerprint(log), Some("6f5d1cb8"));
        assert_eq!(super::fingerprint("vnet join: n1 is in network x\n"), None);
    }

    use std::io::BufRead;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};

    /// The manifest's `join` init container's script (its folded `args`).
    fn join_script() -> String {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/kubernetes/vnet.yaml"),
        )
        .unwrap();
        let at = text.find("- name: join").unwrap();
        let lines: Vec<&str> = text[at..].lines().skip_while(|l| l.trim() != "- >-").skip(1).collect();
        let body: Vec<&str> =
            lines.iter().take_while(|l| !l.trim_start().starts_with("env:")).map(|l| l.trim()).collect();
        body.join(" ")
    }

    /// A node's /var/lib/vnet in a directory of its own, the script with
    /// its paths there, and a `vnetctl` that does what `join` does to the
    /// files (refuses a directory with the network's files in it, as the
    /// real one does; makes them all when `FAKE_JOIN=ok`, nothing and
    /// fails when `fail`), noting what it was given.
    struct Node {
        dir: PathBuf,
    }

    impl Node {
        fn new(name: &str) -> Node {
            let dir = std::env::temp_dir().join(format!("vnet-join-script-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("lib/join")).unwrap();
            std::fs::create_dir_all(dir.join("bin")).unwrap();
            let fake = r#"#!/bin/sh
echo "$@" > "$NODE/args"
if test -e "$NODE/lib/join.token"; then echo yes > "$NODE/token-at-join"; fi
cat > "$NODE/stdin"
for f in conf key etcd-pw cert; do
  if test -e "$NODE/lib/join/lab.$f"; then echo "lab.$f exists" >&2; exit 1; fi
done
test "$FAKE_JOIN" = ok || exit 1
for f in .key .etcd-pw .cert .pub -etcd-ca.pem .conf; do echo x > "$NODE/lib/join/lab$f"; done
"#;
            let bin = dir.join("bin/vnetctl");
            std::fs::write(&bin, fake).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
            Node { dir }
        }

        fn put(&self, rel: &str) {
            std::fs::write(self.dir.join(rel), "x\n").unwrap();
        }

        fn has(&self, rel: &str) -> bool {
            self.dir.join(rel).exists()
        }

        fn command(&self, fake: &str) -> Command {
            let script = join_script().replace("/var/lib/vnet", &self.dir.join("lib").display().to_string());
            // The image's shell (Debian's static busybox), where it is here.
            let mut c = match Path::new("/bin/busybox").is_file() {
                true => {
                    let mut c = Command::new("/bin/busybox");
                    c.arg("sh");
                    c
                }
                false => Command::new("/bin/sh"),
            };
            c.args(["-c", &script])
                .env("PATH", format!("{}:/usr/bin:/bin", self.dir.join("bin").display()))
                .env("NODE", &self.dir)
                .env("NODE_NAME", "n1")
                .env("VNET_NETWORK", "lab")
                .env("FAKE_JOIN", fake)
                .stdin(Stdio::null());
            c
        }

        fn run(&self, fake: &str) -> (bool, String) {
            let o = self.command(fake).output().unwrap();
            (
                o.status.success(),
                format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
            )
        }
    }

    impl Drop for Node {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Issue 67's review: the token stayed on the node when the join
    /// failed, and a join cut short after approval (a certificate, no
    /// `.conf`) made the container fail for ever. The token is now read
    /// once and removed before `vnetctl join` runs: a failed join leaves
    /// none, and `join` had it on standard input. Positive control: a
    /// join that succeeds gets the same token and makes every file.
    #[test]
    fn the_join_script_removes_the_token_whatever_the_join_does() {
        let n = Node::new("fail");
        std::fs::write(n.dir.join("lib/join.token"), "TOKEN-1\n").unwrap();
        let (ok, said) = n.run("fail");
        assert!(!ok, "a failed join fails the container: {said}");
        assert!(!n.has("lib/join.token"), "the token stayed after a failed join: {said}");
        assert!(!n.has("token-at-join"), "the token was still a file while join ran");
        assert_eq!(std::fs::read_to_string(n.dir.join("stdin")).unwrap(), "TOKEN-1\n");
        assert!(std::fs::read_to_string(n.dir.join("args"))
            .unwrap()
            .starts_with("join --token-file - host n1 dir "));
        // The control: the same, joined.
        let n = Node::new("ok");
        std::fs::write(n.dir.join("lib/join.token"), "TOKEN-2\n").unwrap();
        let (ok, said) = n.run("ok");
        assert!(ok, "{said}");
        assert!(!n.has("lib/join.token") && n.has("lib/join/lab.cert") && n.has("lib/join/lab.conf"));
        assert_eq!(std::fs::read_to_string(n.dir.join("stdin")).unwrap(), "TOKEN-2\n");
    }

    /// A join cut short: a certificate and a key but no network key and
    /// no `.conf` (the real `join` refuses a directory with them). They
    /// are removed and the node joins anew (the control: without the
    /// script's cleaning, the fake join refuses, as the real one does).
    /// A node with every file vnetd uses (the `.conf` is join's own and
    /// unused here) is in: no join, and a token left for it is removed.
    #[test]
    fn a_join_cut_short_is_made_anew_and_a_joined_node_goes_on() {
        let n = Node::new("half");
        n.put("lib/join/lab.cert");
        n.put("lib/join/lab.key");
        std::fs::write(n.dir.join("lib/join.token"), "TOKEN-3\n").unwrap();
        let refused = Command::new(n.dir.join("bin/vnetctl"))
            .env("NODE", &n.dir)
            .env("FAKE_JOIN", "ok")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!refused.status.success(), "the control: join refuses the leftovers");
        let (ok, said) = n.run("ok");
        assert!(ok, "{said}");
        assert!(n.has("lib/join/lab.conf") && !n.has("lib/join.token"), "{said}");
        let n = Node::new("in");
        for f in ["lab.key", "lab.etcd-pw", "lab.cert", "lab.pub", "lab-etcd-ca.pem"] {
            n.put(&format!("lib/join/{f}"));
        }
        n.put("lib/join.token");
        let (ok, said) = n.run("fail");
        assert!(ok && said.contains("n1 is in network lab"), "{said}");
        assert!(!n.has("args"), "join ran for a node that is in");
        assert!(!n.has("lib/join.token"), "a token left for a joined node stays");
    }

    /// A node without a token (its first join failed, or the admin has
    /// not made one yet) waits for one, saying so, rather than failing
    /// in a loop; the token's arrival lets it join.
    #[test]
    fn a_node_without_a_token_waits_for_one() {
        let n = Node::new("wait");
        n.put("lib/join/lab.key");
        let mut child = n.command("ok").stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(line.contains("waits for its join token"), "{line}");
        assert!(!n.has("lib/join/lab.key"), "the leftover key stays");
        std::fs::write(n.dir.join("lib/join.token"), "TOKEN-4\n").unwrap();
        let t0 = std::time::Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(t0.elapsed() < std::time::Duration::from_secs(20), "no join 20 s after the token came");
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        assert!(status.success() && n.has("lib/join/lab.conf") && !n.has("lib/join.token"));
    }
}
