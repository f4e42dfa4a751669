//! The CNI contract's words every other module speaks: the versions, the
//! error JSON and its codes, and the result JSON (addresses, routes,
//! interfaces), as the specification (1.1.0, with 1.0.0 and 0.4.0
//! accepted) gives them. No I/O here; the network configuration and the
//! commands are [`crate::spec`]'s.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::net::IpAddr;

/// The versions this plugin accepts, oldest first; the last is its own.
pub const SUPPORTED: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
pub const CURRENT: &str = "1.1.0";

/// The error codes of the specification ("Error" section); 100 and up
/// are this plugin's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    IncompatibleVersion = 1,
    UnknownContainer = 3,
    InvalidEnvironment = 4,
    Io = 5,
    Decode = 6,
    InvalidConfig = 7,
    TryAgainLater = 11,
    /// `STATUS`: the plugin is not available (vnetd is not answering).
    NotAvailable = 50,
    /// `CHECK`: the attachment is not as `ADD` made it.
    NotAsMade = 100,
    /// No address is left in the IPAM pool.
    Exhausted = 101,
    /// vnetd refused a change.
    Refused = 102,
    /// A pod label the network takes groups from (`groupLabels`) has a
    /// value that is not a group name.
    LabelNotGroup = 103,
}

/// An error as the specification's error JSON carries it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}{}", if details.is_empty() { String::new() } else { format!(": {details}") })]
pub struct Error {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl Error {
    pub fn new(code: Code, msg: impl Into<String>) -> Error {
        Error { code: code as u32, msg: msg.into(), details: String::new() }
    }

    pub fn with(code: Code, msg: impl Into<String>, details: impl std::fmt::Display) -> Error {
        Error { code: code as u32, msg: msg.into(), details: details.to_string() }
    }

    /// The error JSON, in `version` (the configuration's, or this plugin's
    /// when the configuration could not be read).
    pub fn to_json(&self, version: &str) -> Value {
        let mut v = json!({ "cniVersion": version, "code": self.code, "msg": self.msg });
        if !self.details.is_empty() {
            v["details"] = Value::String(self.details.clone());
        }
        v
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// A version as three numbers, for comparisons.
pub fn version(v: &str) -> Option<(u32, u32, u32)> {
    let mut it = v.split('.').map(|p| p.parse::<u32>().ok());
    let (a, b, c) = (it.next()??, it.next()??, it.next().unwrap_or(Some(0))?);
    it.next().is_none().then_some((a, b, c))
}

/// An address of a result (`ips`), in any version's form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// CIDR notation: address and prefix length.
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<u32>,
}

impl IpConfig {
    /// The address and prefix length.
    pub fn cidr(&self) -> Result<(IpAddr, u8)> {
        let bad =
            || Error::new(Code::Decode, format!("IPAM address `{}`: expected ADDR/PREFIX", self.address));
        let (a, p) = self.address.split_once('/').ok_or_else(bad)?;
        let a: IpAddr = a.parse().map_err(|_| bad())?;
        let p: u8 = p.parse().map_err(|_| bad())?;
        if p > if a.is_ipv4() { 32 } else { 128 } {
            return Err(bad());
        }
        Ok((a, p))
    }
}

/// A route of a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteConfig {
    pub dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
}

/// An interface of a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    pub name: String,
    #[serde(default)]
    pub mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_path: Option<String>,
}

/// A result, version-independent; [`Outcome::to_json`] writes it in a
/// version's form.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Value>,
}

impl Outcome {
    /// Reads a result (an IPAM plugin's, or a `prevResult`) of any
    /// supported version: 0.x's `ips[].version` is ignored.
    pub fn from_json(v: &Value) -> Result<Outcome> {
        serde_json::from_value(v.clone())
            .map_err(|e| Error::with(Code::Decode, "a result is not as expected", e))
    }

    /// The result JSON in `version`: 0.x adds `ips[].version`; before
    /// 1.1.0 an interface has no `mtu` or `socketPath`.
    pub fn to_json(&self, version: &str) -> Value {
        let v = self::version(version).unwrap_or((1, 1, 0));
        let mut out = Map::new();
        out.insert("cniVersion".into(), Value::String(version.to_string()));
        let ifaces: Vec<Value> = self
            .interfaces
            .iter()
            .map(|i| {
                let mut i = i.clone();
                if v < (1, 1, 0) {
                    i.mtu = None;
                    i.socket_path = None;
                }
                serde_json::to_value(i).unwrap_or(Value::Null)
            })
            .collect();
        out.insert("interfaces".into(), Value::Array(ifaces));
        let ips: Vec<Value> = self
            .ips
            .iter()
            .map(|ip| {
                let mut j = serde_json::to_value(ip).unwrap_or(Value::Null);
                if v < (1, 0, 0) {
                    let four = ip.cidr().map(|(a, _)| a.is_ipv4()).unwrap_or(true);
                    j["version"] = Value::String(if four { "4" } else { "6" }.into());
                }
                j
            })
            .collect();
        out.insert("ips".into(), Value::Array(ips));
        if !self.routes.is_empty() {
            out.insert("routes".into(), serde_json::to_value(&self.routes).unwrap_or(Value::Null));
        }
        if let Some(dns) = &self.dns {
            out.insert("dns".into(), dns.clone());
        }
        Value::Object(out)
    }
}
