//! A cluster-mode lab's etcd: Debian's `etcd-server`, run in the switch
//! namespace on [`ETCD_IP`] with its data in the lab's directory, killed
//! (by pid) with the lab. Stopping and starting it again keeps its data, as
//! an etcd that was down for a while would.

use super::*;

impl Lab {
    /// Starts the lab's etcd (again) and waits until it serves clients.
    pub fn start_etcd(&mut self) -> Result<()> {
        if self.etcd.is_some() {
            return Ok(());
        }
        let sw =
            self.switch.clone().ok_or_else(|| Error::Other("a cluster lab has a switch namespace".into()))?;
        let etcd = which("etcd").ok_or_else(|| {
            Error::Other("`etcd` not found: install Debian's etcd-server (scripts/test.sh does)".into())
        })?;
        self.ns_exec(&sw, &["ip", "addr", "replace", &format!("{ETCD_IP}/24"), "dev", "br0"])?;
        let log_path = self.dir.join("etcd.log");
        let start = std::fs::metadata(&log_path).map_or(0, |m| m.len()) as usize;
        let client = format!("http://{ETCD_IP}:{ETCD_PORT}");
        // The peer port is on the switch namespace's own loopback.
        let peer = "http://127.0.0.1:2380";
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &sw])
            .arg(etcd)
            .args(["--name", "lab", "--data-dir"])
            .arg(self.dir.join("etcd"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer])
            .args(["--initial-cluster", &format!("lab={peer}")]);
        self.etcd = Some(process::spawn_logged(cmd, &log_path, "etcd")?);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            if text.get(start..).is_some_and(|t| t.contains("ready to serve client requests")) {
                return Ok(());
            }
            if let Some(Ok(Some(st))) = self.etcd.as_mut().map(Child::try_wait) {
                self.etcd = None;
                return Err(Error::Other(format!("etcd exited ({st}): {}", text.get(start..).unwrap_or(""))));
            }
            if Instant::now() > deadline {
                return Err(Error::Other(format!(
                    "etcd did not come up: {}",
                    text.get(start..).unwrap_or("")
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the lab's etcd (SIGTERM, then SIGKILL); its data stays.
    pub fn stop_etcd(&mut self) {
        if let Some(c) = self.etcd.take() {
            stop_child(c);
        }
    }

    /// Writes `key` = `value` into the lab's etcd as any client could
    /// (`etcdctl put`, Debian's etcd-client), or deletes it (`value` None).
    pub fn etcd_put(&self, key: &str, value: Option<&str>) -> Result<()> {
        let sw =
            self.switch.clone().ok_or_else(|| Error::Other("a cluster lab has a switch namespace".into()))?;
        let ep = format!("--endpoints=http://{ETCD_IP}:{ETCD_PORT}");
        let mut args = vec!["etcdctl", &ep];
        match value {
            Some(v) => args.extend(["put", "--", key, v]),
            None => args.extend(["del", "--", key]),
        }
        let out = self.ns_output(&sw, &args)?;
        if !out.status.success() {
            return Err(Error::Other(format!("etcdctl: {}", String::from_utf8_lossy(&out.stderr))));
        }
        Ok(())
    }

    /// Host `h`'s `show cluster json`, the `cluster` object.
    pub fn cluster_status(&self, h: usize) -> Result<serde_json::Value> {
        let r = self.control(h, "show cluster json")?;
        let v: serde_json::Value = serde_json::from_str(&r.body)
            .map_err(|e| Error::Other(format!("host {h}: show cluster json: {e}: {}", r.body)))?;
        Ok(v["cluster"].clone())
    }
}

/// The path of `prog` on `PATH`.
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
