//! The delegated IPAM plugin: found in `CNI_PATH`, run with the same
//! environment (but its own `CNI_COMMAND`) and the same configuration on
//! stdin, as the specification's "Delegated plugins" section says.

use crate::result::{Code, Error, Outcome, Result};
use serde_json::Value;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use vnet_client::request::{Owner, Request, Subnet};

/// The IPAM plugin's `type`, checked to be a file name.
pub fn kind(ipam: &Value) -> Result<String> {
    let t = ipam.get("type").and_then(Value::as_str).unwrap_or("");
    if t.is_empty() || t.contains('/') || t.starts_with('.') {
        return Err(Error::new(Code::InvalidConfig, format!("ipam.type `{t}`: expected a plugin name")));
    }
    Ok(t.to_string())
}

fn find(kind: &str, cni_path: &str) -> Result<PathBuf> {
    cni_path
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join(kind))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::new(
                Code::InvalidConfig,
                format!("IPAM plugin `{kind}` is in no directory of CNI_PATH `{cni_path}`"),
            )
        })
}

/// Runs the IPAM plugin `kind` with `command` over `conf`, with `vars`
/// over this process's environment; its result for `ADD`, nothing for
/// the others. Its error JSON is passed on (code and message).
pub fn run(
    kind: &str,
    command: &str,
    cni_path: &str,
    conf: &[u8],
    vars: &[(&str, &str)],
) -> Result<Option<Outcome>> {
    let exe = find(kind, cni_path)?;
    let mut child = Command::new(&exe)
        .env("CNI_COMMAND", command)
        .envs(vars.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| Error::with(Code::Io, format!("running IPAM plugin {}", exe.display()), e))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A plugin that exits without reading its stdin is not our error.
        let _ = stdin.write_all(conf);
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::with(Code::Io, format!("waiting for IPAM plugin {}", exe.display()), e))?;
    if !out.status.success() {
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let code = v.get("code").and_then(Value::as_u64).unwrap_or(999) as u32;
        let msg = v.get("msg").and_then(Value::as_str).unwrap_or("failed without error JSON");
        let details = v.get("details").and_then(Value::as_str).unwrap_or("");
        return Err(Error {
            code,
            msg: format!("IPAM plugin {kind} ({command}): {msg}"),
            details: details.to_string(),
        });
    }
    if command != "ADD" {
        return Ok(None);
    }
    let v: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| Error::with(Code::Decode, format!("IPAM plugin {kind}'s result is not JSON"), e))?;
    Outcome::from_json(&v).map(Some)
}

/// The IPAM type served by vnetd itself (cluster mode: addresses held in
/// etcd, unique across hosts; `docs/INTEGRATION.md`).
pub const VNET: &str = "vnet";

/// The `vnet` IPAM section.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct VnetIpam {
    #[serde(deserialize_with = "subnet")]
    subnet: Subnet,
    #[serde(default)]
    range_start: Option<std::net::IpAddr>,
    #[serde(default)]
    range_end: Option<std::net::IpAddr>,
    /// None by default: the network is one LAN.
    #[serde(default)]
    gateway: Option<std::net::IpAddr>,
    #[serde(default)]
    routes: Vec<crate::result::RouteConfig>,
    #[serde(default)]
    dns: Option<Value>,
}

fn subnet<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Subnet, D::Error> {
    let s = <String as serde::Deserialize>::deserialize(d)?;
    s.parse().map_err(serde::de::Error::custom)
}

/// The `vnet` IPAM section, checked: a subnet, and a range whose ends go
/// together.
fn section(ipam: &Value) -> Result<VnetIpam> {
    let cfg: VnetIpam = serde_json::from_value(ipam.clone())
        .map_err(|e| Error::with(Code::InvalidConfig, "the `vnet` IPAM section", e))?;
    if cfg.range_start.is_some() != cfg.range_end.is_some() {
        return Err(Error::new(Code::InvalidConfig, "`rangeStart` and `rangeEnd` go together"));
    }
    Ok(cfg)
}

/// The subnet of a `vnet` IPAM section.
pub fn subnet_of(ipam: &Value) -> Result<Subnet> {
    section(ipam).map(|s| s.subnet)
}

/// Checks an IPAM section: its `type`, and all of a `vnet` section.
pub fn check(ipam: &Value) -> Result<()> {
    if kind(ipam)? == VNET {
        section(ipam)?;
    }
    Ok(())
}

/// Who holds an address: the CNI network, the container, the interface
/// (each checked by then, so a refusal is the environment's).
pub fn owner(network: &str, id: &str, ifname: &str) -> Result<Owner> {
    Owner::new(&format!("{network}/{id}/{ifname}"))
        .map_err(|e| Error::with(Code::InvalidEnvironment, "the IPAM owner", e))
}

/// `ADD` of the `vnet` IPAM: an address from vnetd (`ipam add`).
pub fn vnet_add(c: &mut vnet_client::client::Client, ipam: &Value, owner: Owner) -> Result<Outcome> {
    let cfg = section(ipam)?;
    let range = cfg.range_start.zip(cfg.range_end);
    let req = Request::IpamAdd { subnet: cfg.subnet, owner, range };
    let r = c.send(&req).map_err(|e| Error::with(Code::Io, "talking to vnetd", e))?;
    r.result.map_err(|e| {
        let code = if e.0.contains("no address left") {
            Code::Exhausted
        } else if e.0.contains("needs cluster mode") || e.0.contains("expected") {
            Code::InvalidConfig
        } else {
            Code::TryAgainLater
        };
        Error::with(code, "the `vnet` IPAM", e)
    })?;
    let address = r.body.trim().to_string();
    Ok(Outcome {
        interfaces: Vec::new(),
        ips: vec![crate::result::IpConfig {
            address,
            gateway: cfg.gateway.map(|g| g.to_string()),
            interface: None,
        }],
        routes: cfg.routes,
        dns: cfg.dns,
    })
}

/// `DEL` of the `vnet` IPAM: what `owner` holds on this host goes.
pub fn vnet_del(c: &mut vnet_client::client::Client, owner: Owner) -> Result<()> {
    let r = c.send(&Request::IpamDel(owner)).map_err(|e| Error::with(Code::Io, "talking to vnetd", e))?;
    r.result.map_err(|e| Error::with(Code::TryAgainLater, "the `vnet` IPAM", e))
}
