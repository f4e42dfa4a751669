//! A cluster-mode lab's etcd: Debian's `etcd-server`, run in the switch
//! namespace on [`ETCD_IP`] (or its IPv6 twin, [`etcd_ip`]) with its data in the lab's directory, killed
//! (by pid) with the lab. Stopping and starting it again keeps its data, as
//! an etcd that was down for a while would. With [`Cluster::members`] it is
//! a cluster of that many members, on ports 2379, 2389, ... of the same
//! address (their peers on the switch namespace's loopback), each of which
//! can be killed and started again alone.
//!
//! A secured cluster (the default, [`Cluster::open`] false) is run as
//! `docs/CLUSTER.md` says: etcd serves TLS only and wants a client
//! certificate of the lab's etcd CA; authentication is on, with a `root`
//! user (the lab's own `etcdctl`, by its certificate's name) and one user
//! per host holding the role `vnet-NETWORK` (read and write under
//! `/vnet/NETWORK/` only, nothing else); each host's vnetd has its user's
//! password file, its key, and a certificate of the network key. The files
//! are in the lab's directory: `etcd*.pem|key` (etcd's), `root.pem|key`,
//! `etcd-hN.pem|key` and `hN.etcd-pw` (host N's), `net.key` and `net.pub`
//! (the network key, kept for tests that sign anew), `hN.cert`.

use crate::{
    etcd_ip, io, pki, process, stop_child, underlay_cidr, vm_ip, vm_mac, Cluster, Error, Host, Lab, Result,
    Vm, COUNTER, ETCD_PORT,
};
use std::net::IpAddr;
use std::net::SocketAddr;
use std::path::Path;
use std::path::PathBuf;
use std::process::Child;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

impl Lab {
    /// How many members the lab's etcd has ([`Cluster::members`], at least one).
    pub fn etcd_members(&self) -> usize {
        self.spec.cluster.as_ref().map_or(1, |c| c.members.max(1))
    }

    /// Starts the lab's etcd (again: each member not running) and waits
    /// until every member serves clients (a member of several is ready
    /// once they have a leader, so all are started before any is waited for).
    pub fn start_etcd(&mut self) -> Result<()> {
        let members = self.etcd_members();
        self.etcd.resize_with(members, || None);
        let mut started = Vec::new();
        for i in 0..members {
            if self.etcd[i].is_none() {
                started.push((i, self.spawn_etcd(i)?));
            }
        }
        if started.is_empty() {
            return Ok(());
        }
        for (i, from) in started {
            self.wait_etcd(i, from)?;
        }
        if self.spec.cluster.as_ref().is_some_and(Cluster::secured) {
            self.etcd_auth()?;
        }
        Ok(())
    }

    /// Starts member `i` of the lab's etcd again (its data kept) and waits
    /// until it serves clients.
    pub fn start_etcd_member(&mut self, i: usize) -> Result<()> {
        if self.etcd.get(i).is_none_or(Option::is_some) {
            return Ok(());
        }
        let from = self.spawn_etcd(i)?;
        self.wait_etcd(i, from)
    }

    /// Member `i`'s log and data directory: the first member's are
    /// `etcd.log` and `etcd`, the others' `etcdI.log` and `etcdI`.
    fn etcd_member_files(&self, i: usize) -> (PathBuf, PathBuf) {
        let n = if i == 0 { String::new() } else { i.to_string() };
        (self.dir.join(format!("etcd{n}.log")), self.dir.join(format!("etcd{n}")))
    }

    /// Member `i`'s peer URL, on the switch namespace's own loopback:
    /// ports 2380, 2390, 2400 (the namespace is the lab's: no other run's
    /// etcd is there).
    fn etcd_peer_url(i: usize) -> String {
        format!("http://127.0.0.1:{}", ETCD_PORT + 1 + 10 * i as u16)
    }

    /// Starts member `i` of the lab's etcd; the length of its log before
    /// (where [`Lab::wait_etcd`] reads from).
    fn spawn_etcd(&mut self, i: usize) -> Result<usize> {
        let sw =
            self.switch.clone().ok_or_else(|| Error::Other("a cluster lab has a switch namespace".into()))?;
        let etcd = which("etcd").ok_or_else(|| {
            Error::Other("`etcd` not found: install Debian's etcd-server (scripts/test.sh does)".into())
        })?;
        let cidr = underlay_cidr(self.etcd_ip());
        let mut add = vec!["ip", "addr", "replace", "dev", "br0"];
        add.extend(cidr.iter().map(String::as_str));
        self.ns_exec(&sw, &add)?;
        let (log_path, data) = self.etcd_member_files(i);
        let start = std::fs::metadata(&log_path).map_or(0, |m| m.len()) as usize;
        let secured = self.spec.cluster.as_ref().is_some_and(Cluster::secured);
        let client = self.etcd_member_url(i);
        let peer = Self::etcd_peer_url(i);
        let initial: Vec<String> =
            (0..self.etcd_members()).map(|m| format!("m{m}={}", Self::etcd_peer_url(m))).collect();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &sw])
            .arg(etcd)
            .args(["--name", &format!("m{i}"), "--data-dir"])
            .arg(data)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial.join(","), "--initial-cluster-token", &self.prefix]);
        if secured {
            let f = |n: &str| self.dir.join(n);
            cmd.arg("--cert-file").arg(f("etcd.pem")).arg("--key-file").arg(f("etcd.key"));
            cmd.arg("--trusted-ca-file").arg(f("etcd-ca.pem")).arg("--client-cert-auth");
        }
        self.etcd[i] = Some(process::spawn_logged(cmd, &log_path, "etcd")?);
        Ok(start)
    }

    /// Waits until member `i` says it serves clients (its log after `start`).
    fn wait_etcd(&mut self, i: usize, start: usize) -> Result<()> {
        let (log_path, _) = self.etcd_member_files(i);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            if text.get(start..).is_some_and(|t| t.contains("ready to serve client requests")) {
                return Ok(());
            }
            if let Some(Ok(Some(st))) = self.etcd[i].as_mut().map(Child::try_wait) {
                self.etcd[i] = None;
                return Err(Error::Other(format!("etcd exited ({st}): {}", text.get(start..).unwrap_or(""))));
            }
            if Instant::now() > deadline {
                return Err(Error::Other(format!(
                    "etcd member {i} did not come up: {}",
                    text.get(start..).unwrap_or("")
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the lab's etcd, every member (SIGTERM, then SIGKILL); its data stays.
    pub fn stop_etcd(&mut self) {
        for c in self.etcd.iter_mut().filter_map(Option::take) {
            stop_child(c);
        }
    }

    /// Kills member `i` of the lab's etcd with SIGKILL (no goodbye to its
    /// peers) and waits for it to be gone; its data stays.
    pub fn kill_etcd_member(&mut self, i: usize) {
        if let Some(mut c) = self.etcd.get_mut(i).and_then(Option::take) {
            let pid = c.id();
            let _ = c.kill();
            let _ = c.wait();
            process::registry().1.retain(|p| *p != pid);
        }
    }

    /// Which member of the lab's etcd leads now: of the running members'
    /// `etcdctl endpoint status`, the one whose id is the leader's.
    pub fn etcd_leader(&self) -> Result<usize> {
        let running: Vec<usize> = (0..self.etcd.len()).filter(|&i| self.etcd[i].is_some()).collect();
        let urls: Vec<String> = running.iter().map(|&i| self.etcd_member_url(i)).collect();
        let out = self.etcdctl_at(&urls.join(","), &["endpoint", "status", "-w", "json"], None)?;
        let v: serde_json::Value = serde_json::from_str(&out)
            .map_err(|e| Error::Other(format!("etcdctl endpoint status: {e}: {out}")))?;
        let rows = v.as_array().cloned().unwrap_or_default();
        let leader = rows.iter().find(|r| {
            let s = &r["Status"];
            s["leader"].as_u64().is_some_and(|l| Some(l) == s["header"]["member_id"].as_u64())
        });
        let url = leader.and_then(|r| r["Endpoint"].as_str()).unwrap_or_default();
        running
            .iter()
            .copied()
            .find(|&i| self.etcd_member_url(i) == url)
            .ok_or_else(|| Error::Other(format!("no member leads: {out}")))
    }

    /// The URL of member `i` of the lab's etcd (ports 2379, 2389, 2399).
    pub fn etcd_member_url(&self, i: usize) -> String {
        let secured = self.spec.cluster.as_ref().is_some_and(Cluster::secured);
        let at = SocketAddr::new(self.etcd_ip(), ETCD_PORT + 10 * i as u16);
        format!("{}://{at}", if secured { "https" } else { "http" })
    }

    /// The URLs of the lab's etcd, every member's (comma-separated, as
    /// vnetd's `--cluster etcd:` and etcdctl's `--endpoints` take them).
    pub fn etcd_url(&self) -> String {
        let urls: Vec<String> = (0..self.etcd_members()).map(|i| self.etcd_member_url(i)).collect();
        urls.join(",")
    }

    /// Where the lab's etcd listens.
    pub fn etcd_ip(&self) -> IpAddr {
        // A NAT lab's etcd is on the internet segment, which every NAT reaches.
        if self.spec.nat {
            return std::net::Ipv4Addr::new(203, 0, 113, 250).into();
        }
        etcd_ip(self.spec.ipv6_underlay)
    }

    /// Runs `etcdctl ARGS` against the lab's etcd as its root user (by
    /// certificate, when secured).
    pub fn etcdctl(&self, args: &[&str]) -> Result<String> {
        self.etcdctl_at(&self.etcd_url(), args, None)
    }

    /// `etcdctl user add USER` with its password on etcdctl's standard
    /// input (`--interactive=false`), never on its command line
    /// (`/proc/PID/cmdline` is every user's to read), as the Kubernetes
    /// lab's store does.
    pub fn etcd_user_add(&self, user: &str, password: &str) -> Result<String> {
        self.etcdctl_at(&self.etcd_url(), &["user", "add", user, "--interactive=false"], Some(password))
    }

    /// [`Lab::etcdctl`] against `endpoints` (some members' URLs), with
    /// `stdin` (a line) on its standard input.
    fn etcdctl_at(&self, endpoints: &str, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let sw =
            self.switch.clone().ok_or_else(|| Error::Other("a cluster lab has a switch namespace".into()))?;
        let mut all: Vec<String> = vec!["etcdctl".into(), format!("--endpoints={endpoints}")];
        if self.spec.cluster.as_ref().is_some_and(Cluster::secured) {
            let f = |n: &str| self.dir.join(n).display().to_string();
            all.push(format!("--cacert={}", f("etcd-ca.pem")));
            all.push(format!("--cert={}", f("root.pem")));
            all.push(format!("--key={}", f("root.key")));
        }
        all.extend(args.iter().map(|a| a.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let out = match stdin {
            None => self.ns_output(&sw, &all)?,
            Some(line) => ns_output_with_stdin(&sw, &all, line)?,
        };
        if !out.status.success() {
            return Err(Error::Other(format!(
                "etcdctl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A secured cluster's users and roles (once: etcd keeps them): a
    /// role per host granting exactly `host_grants` (read the network,
    /// write the host's own keys), so every cluster test also checks that
    /// a host writes nothing else (etcd would refuse it).
    fn etcd_auth(&self) -> Result<()> {
        let done = self.dir.join("etcd-auth.done");
        if done.exists() {
            return Ok(());
        }
        let root_pw = vnetd::keys::genkey().map_err(|e| Error::Other(e.to_string()))?;
        // Kept (0600) for `vnetctl network` commands run on the lab's etcd ([`Lab::admin_dir`]).
        vnetd::keys::write_secret(&self.dir.join("root.pw"), &root_pw)
            .map_err(|e| Error::Other(e.to_string()))?;
        self.etcd_user_add("root", &root_pw)?;
        for h in 0..self.hosts.len() {
            let (user, role) = (format!("vnet-h{h}"), format!("vnet-{}-h{h}", self.prefix));
            self.etcdctl(&["role", "add", &role])?;
            for g in vnet_cluster::layout::host_grants(&self.prefix, &format!("h{h}")) {
                let perm = if g.write { "readwrite" } else { "read" };
                let mut args = vec!["role", "grant-permission", role.as_str()];
                if g.prefix {
                    args.push("--prefix=true");
                }
                args.extend([perm, g.key.as_str()]);
                self.etcdctl(&args)?;
            }
            let pw = std::fs::read_to_string(self.dir.join(format!("h{h}.etcd-pw")))
                .map_err(io("reading a password"))?;
            self.etcd_user_add(&user, pw.trim())?;
            self.etcdctl(&["user", "grant-role", &user, &role])?;
        }
        self.etcdctl(&["auth", "enable"])?;
        std::fs::write(&done, "").map_err(io("writing etcd-auth.done"))
    }

    /// An admin's directory for the lab's (secured) etcd, as `vnetctl
    /// network init` makes one (`network.json`, `ca.pem`, `root.pw`,
    /// `net.key`), naming root's client certificate (the lab's etcd wants
    /// one): `vnetctl network revoke DIR HOST` runs on it.
    pub fn admin_dir(&self) -> Result<PathBuf> {
        let d = self.dir.join("admin");
        std::fs::create_dir_all(&d).map_err(io("making the admin's directory"))?;
        let f = |n: &str| self.dir.join(n);
        let network = serde_json::json!({
            "network": self.prefix,
            "etcd": self.etcd_url(),
            "client_cert": f("root.pem"),
            "client_key": f("root.key"),
        });
        std::fs::write(d.join("network.json"), network.to_string()).map_err(io("writing network.json"))?;
        std::fs::copy(f("etcd-ca.pem"), d.join("ca.pem")).map_err(io("copying etcd's CA"))?;
        for secret in ["root.pw", "net.key"] {
            let text = std::fs::read_to_string(f(secret)).map_err(io("reading a secret"))?;
            vnetd::keys::write_secret(&d.join(secret), text.trim())
                .map_err(|e| Error::Other(e.to_string()))?;
        }
        Ok(d)
    }

    /// Host `h`'s etcd user made as `vnetctl network approve` makes it
    /// (named `vnet_cluster::layout::host_user`, its role of the same name
    /// exactly `host_grants`, the password in `hN.etcd-pw`), the lab's own
    /// (`vnet-hN`) deleted, and vnetd told the new name (from its next
    /// start): what `vnetctl network revoke` then takes away.
    pub fn admit_as_approve_does(&mut self, h: usize) -> Result<String> {
        let host = format!("h{h}");
        let user = vnet_cluster::layout::host_user(&self.prefix, &host);
        self.etcdctl(&["user", "delete", &format!("vnet-h{h}")])?;
        self.etcdctl(&["role", "delete", &format!("vnet-{}-h{h}", self.prefix)])?;
        self.etcdctl(&["role", "add", &user])?;
        for g in vnet_cluster::layout::host_grants(&self.prefix, &host) {
            let perm = if g.write { "readwrite" } else { "read" };
            let mut args = vec!["role", "grant-permission", user.as_str()];
            if g.prefix {
                args.push("--prefix=true");
            }
            args.extend([perm, g.key.as_str()]);
            self.etcdctl(&args)?;
        }
        let pw = std::fs::read_to_string(self.dir.join(format!("h{h}.etcd-pw")))
            .map_err(io("reading a password"))?;
        self.etcd_user_add(&user, pw.trim())?;
        self.etcdctl(&["user", "grant-role", &user, &user])?;
        self.cluster_overrides.retain(|(k, name, _)| !(*k == h && *name == "etcd-user"));
        self.cluster_overrides.push((h, "etcd-user", Some(user.clone())));
        Ok(user)
    }

    /// A secured cluster's files: etcd's CA and certificates, a password
    /// per host, the network key's public half and each host's
    /// certificate (the hosts' keys are made already).
    pub(crate) fn cluster_secrets(&self, hosts: &[Host]) -> Result<()> {
        use vnet_cluster::trust::{CertBody, NetworkKey};
        let ca = pki::Ca::new(&format!("{} etcd CA", self.prefix))?;
        ca.host(&self.dir, "etcd", self.etcd_ip())?;
        ca.host(&self.dir, "root", self.etcd_ip())?;
        let nk = NetworkKey::generate().map_err(|e| Error::Other(e.to_string()))?;
        std::fs::write(self.dir.join("net.pub"), nk.public().to_string()).map_err(io("writing net.pub"))?;
        vnetd::keys::write_secret(&self.dir.join("net.key"), &nk.secret())
            .map_err(|e| Error::Other(e.to_string()))?;
        for (h, host) in hosts.iter().enumerate() {
            ca.host(&self.dir, &format!("etcd-h{h}"), host.underlay_ip)?;
            let pw = vnetd::keys::genkey().map_err(|e| Error::Other(e.to_string()))?;
            vnetd::keys::write_secret(&self.dir.join(format!("h{h}.etcd-pw")), &pw)
                .map_err(|e| Error::Other(e.to_string()))?;
            let (file, public) = host.key.as_ref().ok_or_else(|| Error::Other("a host key".into()))?;
            let private = std::fs::read_to_string(file).map_err(io("reading a host key"))?;
            let body = CertBody {
                network: self.prefix.clone(),
                host: format!("h{h}"),
                public_key: public.to_string(),
                claim_key: vnetd::keys::claim_pubkey(&private).map_err(|e| Error::Other(e.to_string()))?,
                addrs: {
                    let bits = if host.underlay_ip.is_ipv4() { 32 } else { 128 };
                    let mut a = vec![format!("{}/{bits}", host.underlay_ip)];
                    // Behind a NAT: the address its peers see it at too.
                    if self.spec.nat && h != 2 {
                        a.push(format!("{}/32", crate::spec::public_ip(h)));
                    }
                    a
                },
                // A day: every cluster test runs with an expiring certificate.
                groups: Vec::new(),
                not_after: Some(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs())
                        + 86400,
                ),
            };
            let cert = nk.sign(&body).map_err(|e| Error::Other(e.to_string()))?;
            std::fs::write(self.dir.join(format!("h{h}.cert")), cert).map_err(io("writing a certificate"))?;
        }
        Ok(())
    }

    /// Host `h`'s cluster-mode settings: (vnetd flag without `--`, value).
    fn cluster_settings(&self, h: usize) -> Vec<(&'static str, String)> {
        let Some(c) = &self.spec.cluster else { return Vec::new() };
        let mut s = vec![
            ("cluster", format!("etcd:{}", self.etcd_url())),
            ("network", self.prefix.clone()),
            ("host", format!("h{h}")),
            ("cluster-ttl", c.ttl_s.max(3).to_string()),
        ];
        if self.spec.nat {
            // Links across NATs, relayed by host 2 where no direct path opens:
            // no per-peer line (issue 45).
            s.push(("cluster-link-options", "nat relay auto".to_string()));
        }
        if c.secured() {
            let f = |n: String| self.dir.join(n).display().to_string();
            s.extend([
                ("etcd-ca", f("etcd-ca.pem".into())),
                ("etcd-cert", f(format!("etcd-h{h}.pem"))),
                ("etcd-key", f(format!("etcd-h{h}.key"))),
                ("etcd-user", format!("vnet-h{h}")),
                ("etcd-password-file", f(format!("h{h}.etcd-pw"))),
                ("network-key", f("net.pub".into())),
                ("host-cert", f(format!("h{h}.cert"))),
            ]);
        }
        for (k, name, value) in self.cluster_overrides.iter().filter(|(k, ..)| *k == h) {
            let _ = k;
            s.retain(|(n, _)| n != name);
            if let Some(v) = value {
                s.push((name, v.clone()));
            }
        }
        s
    }

    /// Host `h`'s cluster-mode arguments to vnetd (none when the settings
    /// are a `cluster` line in its config).
    pub(crate) fn cluster_args(&self, h: usize) -> Vec<String> {
        if self.spec.cluster.as_ref().is_some_and(|c| c.in_config) {
            return Vec::new();
        }
        self.cluster_settings(h).into_iter().map(|(k, v)| format!("--{k}={v}")).collect()
    }

    /// Host `h`'s `cluster` line (`docs/CLUSTER.md`), when the lab puts the
    /// settings in the config file.
    pub(crate) fn cluster_line(&self, h: usize) -> Option<String> {
        if !self.spec.cluster.as_ref().is_some_and(|c| c.in_config) {
            return None;
        }
        let (mut words, mut link) = (Vec::new(), None);
        for (k, v) in self.cluster_settings(h) {
            match k {
                "cluster" => words.push(v),
                "cluster-ttl" => words.extend(["ttl".to_string(), v]),
                "cluster-link-options" => link = Some(v),
                _ => words.extend([k.to_string(), v]),
            }
        }
        // The host key too: a secured cluster with nothing on vnetd's command line.
        if let Some((file, _)) = &self.hosts[h].key {
            words.extend(["key".to_string(), file.display().to_string()]);
        }
        // `link` takes the rest of the line: last.
        if let Some(l) = link {
            words.extend(["link".to_string(), l]);
        }
        Some(format!("cluster {}\n", words.join(" ")))
    }

    /// Runs `etcdctl ARGS` as host `h`'s etcd user (its client certificate
    /// and password): what that host's credentials, in anyone's hands,
    /// may do. The output, whatever the exit status (a refusal is data).
    pub fn etcdctl_as(&self, h: usize, args: &[&str]) -> Result<std::process::Output> {
        let sw =
            self.switch.clone().ok_or_else(|| Error::Other("a cluster lab has a switch namespace".into()))?;
        let f = |n: String| self.dir.join(n).display().to_string();
        let pw = std::fs::read_to_string(self.dir.join(format!("h{h}.etcd-pw")))
            .map_err(io("reading a password"))?;
        let mut all: Vec<String> = vec![
            "etcdctl".into(),
            format!("--endpoints={}", self.etcd_url()),
            format!("--cacert={}", f("etcd-ca.pem".into())),
            format!("--cert={}", f(format!("etcd-h{h}.pem"))),
            format!("--key={}", f(format!("etcd-h{h}.key"))),
            // The user alone: etcdctl asks for the password and reads it
            // from standard input (never on a command line).
            format!("--user={}", self.etcd_user(h)),
        ];
        all.extend(args.iter().map(|a| a.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let mut out = ns_output_with_stdin(&sw, &all, pw.trim())?;
        // Its prompt is on standard output, before the answer.
        if let Some(rest) = out.stdout.strip_prefix(b"Password: ") {
            out.stdout = rest.strip_prefix(b"\n").unwrap_or(rest).to_vec();
        }
        Ok(out)
    }

    /// Host `h`'s etcd user: the lab's `vnet-hN`, or the one vnetd was told
    /// ([`Lab::admit_as_approve_does`]).
    pub fn etcd_user(&self, h: usize) -> String {
        self.cluster_overrides
            .iter()
            .find_map(|(k, name, v)| (*k == h && *name == "etcd-user").then(|| v.clone()).flatten())
            .unwrap_or_else(|| format!("vnet-h{h}"))
    }

    /// Writes `key` = `value` into the lab's etcd as any client with write
    /// access could (`etcdctl put`, Debian's etcd-client; as root in a
    /// secured cluster), or deletes it (`value` None).
    pub fn etcd_put(&self, key: &str, value: Option<&str>) -> Result<()> {
        match value {
            Some(v) => self.etcdctl(&["put", "--", key, v]),
            None => self.etcdctl(&["del", "--", key]),
        }
        .map(drop)
    }

    /// Host `h`'s `show cluster json`, the `cluster` object.
    pub fn cluster_status(&self, h: usize) -> Result<serde_json::Value> {
        let r = self.control(h, "show cluster json")?;
        let v: serde_json::Value = serde_json::from_str(&r.body)
            .map_err(|e| Error::Other(format!("host {h}: show cluster json: {e}: {}", r.body)))?;
        Ok(v["cluster"].clone())
    }

    /// Where host `h` routes `mac` (`link NAME`, `interface NAME`), if it does.
    pub fn route_to(&self, h: usize, mac: &str) -> Option<String> {
        let v: serde_json::Value =
            serde_json::from_str(&self.control(h, "show routes json").ok()?.body).ok()?;
        v["routes"].as_array()?.iter().find(|r| r["dst"] == mac)?["to"].as_str().map(str::to_string)
    }
}

/// The path of `prog` on `PATH`.
/// `ip netns exec NS ARGS` with `line` on its standard input.
fn ns_output_with_stdin(ns: &str, args: &[&str], line: &str) -> Result<std::process::Output> {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io(format!("running {}", args.join(" "))))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A refused write is the program's early exit, seen in its status.
        let _ = writeln!(stdin, "{line}");
    }
    child.wait_with_output().map_err(io(format!("running {}", args.join(" "))))
}

/// The start of a command (`sh -ec SCRIPT sh USER FILE`, then
/// etcdctl's own arguments) that runs etcdctl logged in as `user` with
/// the password read from `password_file` into its environment
/// (`ETCDCTL_USER`, which `/proc/PID/environ` shows its own user only):
/// for an etcdctl whose standard input is not free for the password
/// ([`Lab::etcdctl_as`] gives it there), a watch kept running.
pub fn etcdctl_login(user: &str, password_file: &Path) -> Vec<String> {
    let script = r#"u=$1; f=$2; shift 2; ETCDCTL_USER="$u:$(cat "$f")" exec etcdctl "$@""#;
    let mut all: Vec<String> = ["sh", "-ec", script, "sh", user].iter().map(|s| s.to_string()).collect();
    all.push(password_file.display().to_string());
    all
}

fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(prog)).find(|p| p.is_file())
}

impl Lab {
    /// Adds a VM (a container on a veth) to host `h` and declares its
    /// interface (with its MAC) on the host's vnetd, nothing else: in a
    /// cluster the vnetd routes and publishes it. Returns its index.
    pub fn add_vm(&mut self, h: usize) -> Result<usize> {
        let v = self.hosts[h].vms.len();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let ns = self.add_ns(format!("{}-h{h}v{v}a{n}", self.prefix))?;
        let (hd, dev) = (format!("a{n}"), "eth0");
        let host_ns = self.hosts[h].ns.clone();
        self.add_veth(&host_ns, &hd, &ns, dev)?;
        let (mac, ip) = (vm_mac(h, v), vm_ip(h, v));
        self.ns_exec(&ns, &["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"])?;
        let mtu = self.spec.vm_mtu.to_string();
        self.ns_exec(&ns, &["ip", "link", "set", dev, "address", &mac, "mtu", &mtu, "up"])?;
        self.ns_exec(&ns, &["ip", "addr", "add", &format!("{ip}/16"), "dev", dev])?;
        let dp = self.spec.datapath.as_ref().map_or(String::new(), |d| format!(" datapath {d}"));
        self.apply(h, &format!("interface vm{v}a{n} netdev {hd} mac {mac}{dp}\n"))?;
        let vm = Vm { ns, dev: dev.into(), host_dev: Some(hd), mac, ip, console: None, vhost: None };
        self.hosts[h].vms.push(vm);
        Ok(v)
    }
}
