//! Measurements inside the lab: ping, iperf3, processes in namespaces.

use crate::{io, registry, Error, Lab, Result, Vm};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::process::Stdio;
use std::time::Duration;
use std::time::Instant;

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

    /// Starts a long-running process in `ns` with its output appended to
    /// `log`; it is killed when the lab goes.
    pub fn spawn_logged(&mut self, ns: &str, args: &[&str], log: &Path) -> Result<u32> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).args(args);
        let child = crate::process::spawn_logged(cmd, log, args.first().copied().unwrap_or("a process"))?;
        let id = child.id();
        self.children.push(child);
        Ok(id)
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

/// The bytes iperf3's TCP test sent and the bytes its receiver counted, from
/// its JSON output (`-J`); 0 where a figure is missing.
pub fn iperf3_bytes(text: &str) -> (u64, u64) {
    let v: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
    let n = |k: &str| v["end"][k]["bytes"].as_u64().unwrap_or(0);
    (n("sum_sent"), n("sum_received"))
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

    /// When each lost ping was sent (seconds since the epoch), from the
    /// output of `ping -D -i INTERVAL`: a ping that got no reply is placed
    /// `INTERVAL` per sequence number after the last answered one before it
    /// (or before the first answered one after it).
    pub fn lost_at(text: &str, interval: f64) -> Vec<f64> {
        let answered: Vec<(u32, f64)> = text
            .lines()
            .filter_map(|l| {
                let ts = l.strip_prefix('[')?.split(']').next()?.parse::<f64>().ok()?;
                let seq = l.split("icmp_seq=").nth(1)?.split(' ').next()?.parse::<u32>().ok()?;
                Some((seq, ts))
            })
            .collect();
        let sent = PingResult::parse(text).sent;
        let mut lost = Vec::new();
        for seq in 1..=sent {
            if answered.iter().any(|a| a.0 == seq) {
                continue;
            }
            let before = answered.iter().filter(|a| a.0 < seq).max_by_key(|a| a.0);
            let after = answered.iter().filter(|a| a.0 > seq).min_by_key(|a| a.0);
            let at = match (before, after) {
                (Some(b), _) => b.1 + f64::from(seq - b.0) * interval,
                (None, Some(a)) => a.1 - f64::from(a.0 - seq) * interval,
                (None, None) => f64::NAN,
            };
            lost.push(at);
        }
        lost
    }
}

#[cfg(test)]
mod tests {
    use super::PingResult;

    #[test]
    fn lost_pings_are_placed_between_their_answered_neighbours() {
        let text = "PING 10.0.0.2 (10.0.0.2) 56(84) bytes of data.
[100.000000] 64 bytes from 10.0.0.2: icmp_seq=1 ttl=64 time=0.1 ms
[100.300000] 64 bytes from 10.0.0.2: icmp_seq=4 ttl=64 time=0.1 ms

--- 10.0.0.2 ping statistics ---
5 packets transmitted, 2 received, 60% packet loss, time 400ms
";
        let lost = PingResult::lost_at(text, 0.1);
        assert_eq!(lost.len(), 3);
        assert!(
            (lost[0] - 100.1).abs() < 1e-6
                && (lost[1] - 100.2).abs() < 1e-6
                && (lost[2] - 100.4).abs() < 1e-6
        );
        assert!(PingResult::lost_at("garbage", 0.1).is_empty());
    }
}
