//! Driving the `vnet-cni` plugin as a container runtime does (`cnitool`'s
//! way: the `CNI_*` variables and the configuration on stdin), inside a
//! lab host's namespace, where the host's vnetd runs.

use super::*;

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
