//! Measurements inside the lab: ping, iperf3, processes in namespaces.

use super::*;

impl Lab {
    /// Pings from `vm` to `ip`; returns the replies received.
    pub fn ping(&self, vm: &Vm, ip: Ipv4Addr, count: u32, size: u32) -> Result<PingResult> {
        let out = self.ns_output(
            &vm.ns,
            &[
                "ping",
                "-n",
                "-q",
                "-c",
                &count.to_string(),
                "-i",
                "0.2",
                "-W",
                "2",
                "-s",
                &size.to_string(),
                &ip.to_string(),
            ],
        )?;
        Ok(PingResult::parse(&String::from_utf8_lossy(&out.stdout)))
    }

    /// Starts a long-running process in `ns`; it is killed when the lab goes.
    pub fn spawn(&mut self, ns: &str, args: &[&str]) -> Result<u32> {
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io(format!("starting {}", args.join(" "))))?;
        let id = child.id();
        registry().1.push(id);
        self.children.push(child);
        Ok(id)
    }

    /// Runs iperf3 from `from` to `to` (a server is started in `to`'s
    /// namespace); returns the receiver's throughput in Gbit/s.
    pub fn iperf3(&mut self, from: &Vm, to: &Vm, seconds: u32, extra: &[&str]) -> Result<(f64, String)> {
        let to_ns = to.ns.clone();
        self.spawn(&to_ns, &["iperf3", "-s", "-1", "-B", &to.ip.to_string()])?;
        let ip = to.ip.to_string();
        let secs = seconds.to_string();
        let mut args = vec!["iperf3", "-c", &ip, "-t", &secs, "-J"];
        args.extend_from_slice(extra);
        self.wait_listening(&to_ns, 5201)?;
        let out = self.ns_output(&from.ns, &args)?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::Other(format!("iperf3 output: {e}: {text}")))?;
        let bps = v["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .or_else(|| v["end"]["sum"]["bits_per_second"].as_f64())
            .unwrap_or(0.0);
        if !out.status.success() || bps <= 0.0 || v.get("error").is_some() {
            return Err(Error::Other(format!("iperf3 moved nothing: {text}")));
        }
        Ok((bps / 1e9, text))
    }

    /// Waits (up to 5 s) until something listens on TCP `port` in `ns`.
    pub fn wait_listening(&self, ns: &str, port: u16) -> Result<()> {
        let want = format!(":{port} ");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let out = self.ns_output(ns, &["ss", "-Hltn"])?;
            if String::from_utf8_lossy(&out.stdout).contains(&want) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(Error::Other(format!("nothing listens on port {port} in {ns}")))
    }
}

/// What ping reported.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PingResult {
    pub sent: u32,
    pub received: u32,
    pub avg_ms: f64,
}

impl PingResult {
    /// Parses iputils ping's summary.
    pub fn parse(text: &str) -> PingResult {
        let mut r = PingResult::default();
        for line in text.lines() {
            if line.contains("packets transmitted") {
                let nums: Vec<u32> =
                    line.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
                if nums.len() >= 2 {
                    r.sent = nums[0];
                    r.received = nums[1];
                }
            }
            if let Some(rest) = line.split(" = ").nth(1) {
                if line.starts_with("rtt") {
                    r.avg_ms = rest.split('/').nth(1).and_then(|x| x.parse().ok()).unwrap_or(0.0);
                }
            }
        }
        r
    }
}
