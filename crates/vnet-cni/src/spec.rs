//! The CNI contract: the network configuration and the commands, as the
//! specification (1.1.0, with 1.0.0 and 0.4.0 accepted) gives them; the
//! versions, the result and the error JSON are [`crate::result`]'s (and
//! named here too). No I/O here.

pub use crate::result::{
    version, Code, Error, Interface, IpConfig, Outcome, Result, RouteConfig, CURRENT, SUPPORTED,
};
use serde::Deserialize;
use serde_json::{json, Value};

/// The commands of `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Command {
    pub fn name(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }

    pub fn parse(s: &str) -> Result<Command> {
        Ok(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "VERSION" => Command::Version,
            _ => {
                return Err(Error::new(
                    Code::InvalidEnvironment,
                    format!("CNI_COMMAND is `{s}`: expected ADD, DEL, CHECK, STATUS, GC or VERSION"),
                ))
            }
        })
    }
}

/// The plugin's part of a network configuration; the rest (the IPAM
/// section, `prevResult`, `runtimeConfig`) is kept as JSON.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// vnetd's control endpoint (`unix:PATH` or `tcp:ADDR:PORT`).
    #[serde(default = "default_control")]
    pub control: String,
    /// The container interface's MTU (the veth pair's); the kernel's
    /// default when absent.
    #[serde(default)]
    pub mtu: Option<u32>,
    /// `kernel` (default), `user` or `auto`: vnetd's data path for the
    /// host end.
    #[serde(default = "default_datapath")]
    pub datapath: String,
    /// The vnet network (tenant) id of the interface.
    #[serde(default)]
    pub network: u32,
    /// The policy groups every interface of this network is in
    /// (`attach ... group G`; `docs/POLICY.md`).
    #[serde(default)]
    pub groups: Vec<String>,
    /// Kubernetes label keys whose values on the pod are further groups of
    /// its interface (`app` with `app: web`: group `web`), looked up at
    /// `ADD` through vnetd (`crate::labels`).
    #[serde(default)]
    pub group_labels: Vec<String>,
    /// Whose groups the labels name (`crate::labels`): the pod's
    /// namespace's (`namespace.value`, the default) or the cluster's (the
    /// value alone).
    #[serde(default)]
    pub group_scope: GroupScope,
    /// Serve a vhost-user socket in this directory instead of making a
    /// veth pair; the result's interface carries its `socketPath`.
    #[serde(default)]
    pub vhost_user_dir: Option<String>,
    /// The node is its pods' gateway (`crate::gateway`): an address of
    /// the node's own on the pod network, the pods' default route through
    /// it, and Service traffic the node translates (kube-proxy) answered
    /// through it. Needs the `vnet` IPAM.
    #[serde(default)]
    pub is_default_gateway: bool,
    /// The node masquerades its pods' traffic to anything outside the
    /// `vnet` IPAM's subnet (flannel's `--ip-masq`). Needs
    /// `isDefaultGateway`.
    #[serde(default)]
    pub ip_masq: bool,
    /// Where attachments are recorded (for `DEL`, `CHECK` and `GC`).
    #[serde(default = "default_state_dir")]
    pub state_dir: String,
    #[serde(default)]
    pub ipam: Option<Value>,
    #[serde(default)]
    pub prev_result: Option<Value>,
}

/// `groupScope`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupScope {
    #[default]
    Namespace,
    Cluster,
}

fn default_control() -> String {
    "unix:/run/vnetd.sock".into()
}
fn default_datapath() -> String {
    "kernel".into()
}
fn default_state_dir() -> String {
    "/var/lib/vnet/cni".into()
}

/// The configuration's version and the configuration, checked: decodable
/// JSON (code 6), a version this plugin speaks (1), the fields it needs
/// (7), a name it can use as a directory (7).
pub fn parse_conf(stdin: &[u8]) -> Result<(NetConf, Value)> {
    let raw: Value = serde_json::from_slice(stdin)
        .map_err(|e| Error::with(Code::Decode, "the network configuration is not JSON", e))?;
    let v = raw.get("cniVersion").and_then(Value::as_str).unwrap_or("");
    if !SUPPORTED.contains(&v) {
        return Err(Error::with(
            Code::IncompatibleVersion,
            format!("cniVersion `{v}` is not one this plugin speaks"),
            format!("supported: {}", SUPPORTED.join(", ")),
        ));
    }
    let conf: NetConf = serde_json::from_value(raw.clone())
        .map_err(|e| Error::with(Code::InvalidConfig, "the network configuration is not as expected", e))?;
    if conf.name.is_empty()
        || conf.name.len() > 128
        || !conf.name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        || conf.name.starts_with('.')
    {
        return Err(Error::new(
            Code::InvalidConfig,
            format!("network name `{}`: expected 1-128 of A-Za-z0-9_-. not starting with `.`", conf.name),
        ));
    }
    if conf.kind.is_empty() {
        return Err(Error::new(Code::InvalidConfig, "`type` is empty: expected the plugin's name"));
    }
    datapath(&conf.datapath)?;
    if let Some(g) = conf.groups.iter().find(|g| vnet_control::request::Name::new(g).is_err()) {
        return Err(Error::new(
            Code::InvalidConfig,
            format!("group `{}`: expected a name of letters, digits, `_`, `-` or `.`", g.escape_debug()),
        ));
    }
    if let Some(k) = conf.group_labels.iter().find(|k| !crate::labels::is_label_key(k)) {
        return Err(Error::new(
            Code::InvalidConfig,
            format!("groupLabels `{}`: expected a Kubernetes label key ([PREFIX/]NAME)", k.escape_debug()),
        ));
    }
    if conf.group_labels.len() > crate::labels::MAX_KEYS {
        return Err(Error::new(
            Code::InvalidConfig,
            format!(
                "groupLabels: {} keys, expected at most {}",
                conf.group_labels.len(),
                crate::labels::MAX_KEYS
            ),
        ));
    }
    if let Some(m) = conf.mtu {
        if !(68..=65535).contains(&m) {
            return Err(Error::new(Code::InvalidConfig, format!("mtu {m}: expected 68 to 65535")));
        }
    }
    if let Some(dir) = &conf.vhost_user_dir {
        // The longest socket name an attachment has (`vc` and 10 hex digits).
        vnet_client::request::SocketPath::in_dir(dir, "vc0123456789.sock")
            .map_err(|e| Error::with(Code::InvalidConfig, "vhostUserDir", e))?;
    }
    if let Err(e) = conf.control.parse::<vnet_client::Endpoint>() {
        return Err(Error::with(
            Code::InvalidConfig,
            format!("control `{}`", conf.control.escape_debug()),
            e,
        ));
    }
    if let Some(ipam) = &conf.ipam {
        crate::ipam::check(ipam)?;
    }
    gateway_needs(&conf)?;
    Ok((conf, raw))
}

/// `isDefaultGateway` needs the `vnet` IPAM (the node's address is one of
/// its pool) and veths (a vhost-user VM has no node in between);
/// `ipMasq` needs `isDefaultGateway` (without it nothing reaches the node).
fn gateway_needs(conf: &NetConf) -> Result<()> {
    if conf.ip_masq && !conf.is_default_gateway {
        return Err(Error::new(Code::InvalidConfig, "ipMasq needs isDefaultGateway"));
    }
    if !conf.is_default_gateway {
        return Ok(());
    }
    let vnet_ipam =
        conf.ipam.as_ref().is_some_and(|i| crate::ipam::kind(i).is_ok_and(|k| k == crate::ipam::VNET));
    if !vnet_ipam {
        return Err(Error::new(Code::InvalidConfig, "isDefaultGateway needs the `vnet` IPAM"));
    }
    if conf.vhost_user_dir.is_some() {
        return Err(Error::new(Code::InvalidConfig, "isDefaultGateway is for veths, not vhostUserDir"));
    }
    Ok(())
}

/// The data path a checked configuration names.
pub fn datapath(word: &str) -> Result<vnet_control::Datapath> {
    use vnet_control::Datapath;
    [Datapath::User, Datapath::Kernel, Datapath::Auto].into_iter().find(|d| d.word() == word).ok_or_else(
        || {
            Error::new(
                Code::InvalidConfig,
                format!("datapath `{}`: expected `kernel`, `user` or `auto`", word.escape_debug()),
            )
        },
    )
}

/// `VERSION`'s answer.
pub fn version_info(asked: &str) -> Value {
    let v = if SUPPORTED.contains(&asked) { asked } else { CURRENT };
    json!({ "cniVersion": v, "supportedVersions": SUPPORTED })
}

/// Whether `cmd` exists in `version` (CHECK from 0.4.0, STATUS and GC
/// from 1.1.0).
pub fn command_in(cmd: Command, v: &str) -> Result<()> {
    let have = version(v).unwrap_or((0, 0, 0));
    let need = match cmd {
        Command::Check => (0, 4, 0),
        Command::Status | Command::Gc => (1, 1, 0),
        _ => return Ok(()),
    };
    if have < need {
        return Err(Error::new(
            Code::IncompatibleVersion,
            format!(
                "{} needs cniVersion {}.{}.{} or later, the configuration has {v}",
                cmd.name(),
                need.0,
                need.1,
                need.2
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_configurations_get_the_specs_codes() {
        assert_eq!(parse_conf(b"{not json").unwrap_err().code, 6);
        let v = br#"{"cniVersion":"9.9.9","name":"n","type":"vnet-cni"}"#;
        assert_eq!(parse_conf(v).unwrap_err().code, 1);
        let no_name = br#"{"cniVersion":"1.0.0","type":"vnet-cni"}"#;
        assert_eq!(parse_conf(no_name).unwrap_err().code, 7);
        let slash = br#"{"cniVersion":"1.0.0","name":"../x","type":"vnet-cni"}"#;
        assert_eq!(parse_conf(slash).unwrap_err().code, 7);
        let dp = br#"{"cniVersion":"1.0.0","name":"n","type":"vnet-cni","datapath":"fast"}"#;
        assert_eq!(parse_conf(dp).unwrap_err().code, 7);
        // Values that would become words or lines of a control request.
        for bad in [
            r#""vhostUserDir":"/run/v\nlink evil udp 10.0.0.9:9000""#,
            r#""vhostUserDir":"/run/v mac 02:00:00:00:00:09""#,
            r#""vhostUserDir":"/run/v#""#,
            r#""vhostUserDir":"run/v""#,
            r#""ipam":{"type":"vnet","subnet":"10.9.0.0/24\nlink evil udp 10.0.0.9:9000"}"#,
            r#""ipam":{"type":"vnet","subnet":"10.9.0.0/24 range 10.9.0.1 10.9.0.1"}"#,
            r#""ipam":{"type":"vnet"}"#,
            r#""ipam":{"type":"../x"}"#,
            r#""control":"unix:""#,
        ] {
            let c = format!(r#"{{"cniVersion":"1.1.0","name":"n","type":"vnet-cni",{bad}}}"#);
            let e = parse_conf(c.as_bytes()).unwrap_err();
            assert_eq!(e.code, 7, "{bad}: {e}");
            assert!(!e.to_json(CURRENT).to_string().contains("\nlink"), "refused, and quoted escaped");
        }
        let ok = br#"{"cniVersion":"1.1.0","name":"n","type":"vnet-cni","ipam":{"type":"host-local"}}"#;
        let (c, _) = parse_conf(ok).unwrap();
        assert_eq!(
            (c.datapath.as_str(), c.network, c.control.as_str()),
            ("kernel", 0, "unix:/run/vnetd.sock")
        );
    }

    #[test]
    fn the_gateway_needs_the_vnet_ipam_and_masquerade_needs_the_gateway() {
        let conf = |extra: &str| {
            format!(r#"{{"cniVersion":"1.1.0","name":"n","type":"vnet-cni"{extra}}}"#).into_bytes()
        };
        let vnet = r#","ipam":{"type":"vnet","subnet":"10.244.0.0/16"}"#;
        let (c, _) = parse_conf(&conf(&format!(r#","isDefaultGateway":true,"ipMasq":true{vnet}"#))).unwrap();
        assert!(c.is_default_gateway && c.ip_masq);
        let (c, _) = parse_conf(&conf(vnet)).unwrap();
        assert!(!c.is_default_gateway && !c.ip_masq, "off unless asked");
        for bad in [
            format!(r#","ipMasq":true{vnet}"#),
            r#","isDefaultGateway":true"#.to_string(),
            r#","isDefaultGateway":true,"ipam":{"type":"host-local"}"#.to_string(),
            format!(r#","isDefaultGateway":true,"vhostUserDir":"/run/v"{vnet}"#),
        ] {
            assert_eq!(parse_conf(&conf(&bad)).unwrap_err().code, 7, "{bad}");
        }
    }

    #[test]
    fn results_take_each_versions_form() {
        let r = Outcome {
            interfaces: vec![Interface {
                name: "eth0".into(),
                mac: "52:54:00:00:00:01".into(),
                mtu: Some(1400),
                sandbox: Some("/run/netns/x".into()),
                socket_path: None,
            }],
            ips: vec![IpConfig { address: "10.9.0.2/24".into(), gateway: None, interface: Some(0) }],
            routes: vec![],
            dns: None,
        };
        let old = r.to_json("0.4.0");
        assert_eq!(old["ips"][0]["version"], "4");
        assert!(old["interfaces"][0].get("mtu").is_none());
        let new = r.to_json("1.1.0");
        assert!(new["ips"][0].get("version").is_none());
        assert_eq!(new["interfaces"][0]["mtu"], 1400);
        assert_eq!(new["cniVersion"], "1.1.0");
        // What an IPAM plugin of 0.4.0 returns reads back.
        assert_eq!(Outcome::from_json(&old).unwrap().ips, r.ips);
    }

    #[test]
    fn commands_exist_from_their_versions() {
        assert_eq!(command_in(Command::Status, "1.0.0").unwrap_err().code, 1);
        assert!(command_in(Command::Status, "1.1.0").is_ok());
        assert_eq!(command_in(Command::Check, "0.3.1").unwrap_err().code, 1);
        assert!(command_in(Command::Add, "0.3.0").is_ok());
        assert!(Command::parse("ADDD").is_err());
        assert_eq!(version_info("0.4.0")["cniVersion"], "0.4.0");
    }
}
