//! What a domain's XML says vnet should attach: the `<vnet:attach>`
//! element in its `<metadata>` (the vnetd to talk to, the data path, the
//! network), and its `vhostuser` and `ethernet` (TAP) interfaces with
//! their MACs. A domain without that element is not vnet's.

/// The namespace of vnet's element in a domain's `<metadata>`.
pub const NS: &str = "urn:vnet:libvirt:1";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// vnetd serves the socket; QEMU connects to it (`mode='client'`).
    VhostUser(String),
    /// A TAP QEMU holds (libvirt made it, named by `<target dev>`).
    Tap(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    /// The interface's name in vnetd.
    pub name: String,
    pub kind: Kind,
    pub mac: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub control: String,
    pub datapath: String,
    pub network: u32,
    pub ifaces: Vec<Iface>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("the domain XML does not parse: {0}")]
    Xml(String),
    #[error("interface {index} ({kind}): {what}")]
    Interface { index: usize, kind: String, what: String },
    #[error("<vnet:attach>: {0}")]
    Attach(String),
}

/// A vnetd interface name made of the domain's name and the interface's
/// index: 1-63 of `A-Za-z0-9._-` (others become `_`).
fn iface_name(domain: &str, index: usize) -> String {
    let clean: String = domain
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
        .collect();
    let suffix = format!("-{index}");
    let keep = 63 - 3 - suffix.len();
    format!("lv-{}{suffix}", &clean[..clean.len().min(keep)])
}

fn valid_mac(m: &str) -> bool {
    m.len() == 17
        && m.split(':').count() == 6
        && m.split(':').all(|b| b.len() == 2 && u8::from_str_radix(b, 16).is_ok())
}

/// Reads `xml` (a domain's, as libvirt gives its hooks); `None` when it
/// has no `<vnet:attach>`.
pub fn plan(xml: &str) -> Result<Option<Plan>, Error> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| Error::Xml(e.to_string()))?;
    let root = doc.root_element();
    let name = root.children().find(|n| n.has_tag_name("name")).and_then(|n| n.text()).unwrap_or("").trim();
    let Some(attach) = root
        .children()
        .filter(|n| n.has_tag_name("metadata"))
        .flat_map(|m| m.children())
        .find(|n| n.has_tag_name((NS, "attach")))
    else {
        return Ok(None);
    };
    if name.is_empty() {
        return Err(Error::Xml("the domain has no <name>".into()));
    }
    let control = attach.attribute("control").unwrap_or("unix:/run/vnetd.sock").to_string();
    let datapath = attach.attribute("datapath").unwrap_or("auto").to_string();
    if !matches!(datapath.as_str(), "user" | "kernel" | "auto") {
        return Err(Error::Attach(format!("datapath `{datapath}`: expected user, kernel or auto")));
    }
    let network = match attach.attribute("network") {
        Some(n) => n.parse().map_err(|_| Error::Attach(format!("network `{n}`: expected a number")))?,
        None => 0,
    };
    let mut ifaces = Vec::new();
    let devices = root.children().filter(|n| n.has_tag_name("devices")).flat_map(|d| d.children());
    for (index, i) in devices.filter(|n| n.has_tag_name("interface")).enumerate() {
        let kind_attr = i.attribute("type").unwrap_or("");
        let bad =
            |what: &str| Error::Interface { index, kind: kind_attr.to_string(), what: what.to_string() };
        let child = |tag: &str| i.children().find(|n| n.has_tag_name(tag));
        let kind = match kind_attr {
            "vhostuser" => {
                let src = child("source").ok_or_else(|| bad("no <source>"))?;
                if src.attribute("mode") != Some("client") {
                    return Err(bad("<source mode> must be `client`: vnetd serves the socket"));
                }
                let path = src.attribute("path").ok_or_else(|| bad("no <source path>"))?;
                Kind::VhostUser(path.to_string())
            }
            "ethernet" => {
                let dev = child("target").and_then(|t| t.attribute("dev")).ok_or_else(|| {
                    bad("no <target dev>: name the TAP (not vnet*, which libvirt takes for its own)")
                })?;
                if dev.starts_with("vnet") {
                    return Err(bad(
                        "<target dev> begins with `vnet`: libvirt renames such TAPs; pick another name",
                    ));
                }
                Kind::Tap(dev.to_string())
            }
            _ => continue,
        };
        let mac = child("mac").and_then(|m| m.attribute("address")).ok_or_else(|| bad("no <mac address>"))?;
        if !valid_mac(mac) {
            return Err(bad(&format!("<mac address='{mac}'> is not a MAC")));
        }
        ifaces.push(Iface { name: iface_name(name, index), kind, mac: mac.to_ascii_lowercase() });
    }
    Ok(Some(Plan { control, datapath, network, ifaces }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOMAIN: &str = r#"<domain type='qemu'>
  <name>web 1</name>
  <metadata>
    <vnet:attach xmlns:vnet="urn:vnet:libvirt:1" control="unix:/run/vnet/lan.sock" datapath="kernel" network="3"/>
  </metadata>
  <devices>
    <interface type='vhostuser'>
      <mac address='52:54:00:AA:00:01'/>
      <source type='unix' path='/run/vnet/vhost/web1.sock' mode='client'/>
      <model type='virtio'/>
    </interface>
    <interface type='network'><mac address='52:54:00:aa:00:02'/><source network='default'/></interface>
    <interface type='ethernet'>
      <mac address='52:54:00:aa:00:03'/>
      <target dev='vt-web1' managed='yes'/>
    </interface>
  </devices>
</domain>"#;

    #[test]
    fn a_domain_with_vnet_metadata_gives_its_vhost_user_and_tap_interfaces() {
        let p = plan(DOMAIN).unwrap().unwrap();
        assert_eq!(
            (p.control.as_str(), p.datapath.as_str(), p.network),
            ("unix:/run/vnet/lan.sock", "kernel", 3)
        );
        assert_eq!(
            p.ifaces,
            vec![
                Iface {
                    name: "lv-web_1-0".into(),
                    kind: Kind::VhostUser("/run/vnet/vhost/web1.sock".into()),
                    mac: "52:54:00:aa:00:01".into()
                },
                Iface {
                    name: "lv-web_1-2".into(),
                    kind: Kind::Tap("vt-web1".into()),
                    mac: "52:54:00:aa:00:03".into()
                },
            ]
        );
    }

    #[test]
    fn a_domain_without_it_is_not_ours_and_bad_ones_say_why() {
        let theirs = DOMAIN.replace("urn:vnet:libvirt:1", "urn:other");
        assert_eq!(plan(&theirs).unwrap(), None);
        assert!(matches!(plan("<domain>"), Err(Error::Xml(_))));
        let server = DOMAIN.replace("mode='client'", "mode='server'");
        assert!(plan(&server).unwrap_err().to_string().contains("interface 0 (vhostuser)"));
        let vnet_tap = DOMAIN.replace("vt-web1", "vnet7");
        assert!(plan(&vnet_tap).unwrap_err().to_string().contains("libvirt renames"));
        let bad_mac = DOMAIN.replace("52:54:00:aa:00:03", "52:54:00:aa:00");
        assert!(plan(&bad_mac).unwrap_err().to_string().contains("is not a MAC"));
        let dp = DOMAIN.replace("datapath=\"kernel\"", "datapath=\"fast\"");
        assert!(matches!(plan(&dp), Err(Error::Attach(_))));
        let long = DOMAIN.replace("web 1", &"x".repeat(200));
        assert!(plan(&long).unwrap().unwrap().ifaces.iter().all(|i| i.name.len() <= 63));
    }
}
