//! What a domain's XML says vnet should attach: the `<vnet:attach>`
//! element in its `<metadata>` (that the domain is vnet's, and what it
//! asks for: a data path, and the endpoint and network it may only repeat
//! from the host's hook configuration), and its `vhostuser` and `ethernet`
//! (TAP) interfaces with their MACs. A domain without that element is not
//! vnet's. Every value taken from the XML is typed here, so a socket path
//! with a newline, a space or a `#` in it is refused, not sent.

use vnet_client::request::{DevName, Name, SocketPath};
use vnet_control::Datapath;
use vnet_wire::MacAddr;

/// The namespace of vnet's element in a domain's `<metadata>`.
pub const NS: &str = "urn:vnet:libvirt:1";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// vnetd serves the socket; QEMU connects to it (`mode='client'`).
    VhostUser(SocketPath),
    /// A TAP QEMU holds (libvirt made it, named by `<target dev>`).
    Tap(DevName),
    /// Read for a detach only ([`names`]): what the device was does not
    /// matter then, and libvirt's XML at `release` may no longer say it.
    Detached,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    /// The interface's name in vnetd.
    pub name: Name,
    pub kind: Kind,
    pub mac: MacAddr,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The endpoint the XML names (`control`), if it names one: the host's
    /// configuration decides, this must only agree with it.
    pub control: Option<String>,
    /// The data path the XML asks for, if any.
    pub datapath: Option<Datapath>,
    /// The network the XML names, if it names one (must agree, as `control`).
    pub network: Option<u32>,
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
fn iface_name(domain: &str, index: usize) -> Result<Name, vnet_client::request::Invalid> {
    let clean: String = domain
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
        .collect();
    let suffix = format!("-{index}");
    let keep = 63 - 3 - suffix.len();
    Name::new(&format!("lv-{}{suffix}", &clean[..clean.len().min(keep)]))
}

fn valid_mac(m: &str) -> Option<MacAddr> {
    let ok = m.len() == 17
        && m.split(':').count() == 6
        && m.split(':').all(|b| b.len() == 2 && u8::from_str_radix(b, 16).is_ok());
    ok.then(|| m.parse().ok()).flatten().filter(|m: &MacAddr| !m.is_group())
}

/// Reads `xml` (a domain's, as libvirt gives its hooks); `None` when it
/// has no `<vnet:attach>`.
pub fn plan(xml: &str) -> Result<Option<Plan>, Error> {
    read(xml, false)
}

/// The interfaces' names only, for a detach (`stopped`, `release`): a
/// device the XML no longer names (`<target dev>` is gone from the XML
/// libvirt gives at `release` after `virsh destroy`), a socket path or a
/// MAC is not read, so there is nothing to refuse; the names are the
/// domain's name and each interface's place, as at the attach.
pub fn names(xml: &str) -> Result<Option<Plan>, Error> {
    read(xml, true)
}

fn read(xml: &str, detach: bool) -> Result<Option<Plan>, Error> {
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
    let control = attach.attribute("control").map(str::to_string);
    let datapath = match attach.attribute("datapath") {
        Some(d) => Some(
            [Datapath::User, Datapath::Kernel, Datapath::Auto]
                .into_iter()
                .find(|w| w.word() == d)
                .ok_or_else(|| {
                    Error::Attach(format!("datapath `{}`: expected user, kernel or auto", d.escape_debug()))
                })?,
        ),
        None => None,
    };
    let network = match attach.attribute("network") {
        Some(n) => Some(
            n.parse()
                .map_err(|_| Error::Attach(format!("network `{}`: expected a number", n.escape_debug())))?,
        ),
        None => None,
    };
    let mut ifaces = Vec::new();
    let devices = root.children().filter(|n| n.has_tag_name("devices")).flat_map(|d| d.children());
    for (index, i) in devices.filter(|n| n.has_tag_name("interface")).enumerate() {
        let kind_attr = i.attribute("type").unwrap_or("");
        let bad =
            |what: &str| Error::Interface { index, kind: kind_attr.to_string(), what: what.to_string() };
        let child = |tag: &str| i.children().find(|n| n.has_tag_name(tag));
        if detach && matches!(kind_attr, "vhostuser" | "ethernet") {
            let name = iface_name(name, index).map_err(|e| bad(&e.to_string()))?;
            ifaces.push(Iface { name, kind: Kind::Detached, mac: MacAddr([0; 6]) });
            continue;
        }
        let kind = match kind_attr {
            "vhostuser" => {
                let src = child("source").ok_or_else(|| bad("no <source>"))?;
                if src.attribute("mode") != Some("client") {
                    return Err(bad("<source mode> must be `client`: vnetd serves the socket"));
                }
                let path = src.attribute("path").ok_or_else(|| bad("no <source path>"))?;
                Kind::VhostUser(SocketPath::new(path).map_err(|e| bad(&format!("<source path>: {e}")))?)
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
                Kind::Tap(DevName::new(dev).map_err(|e| bad(&format!("<target dev>: {e}")))?)
            }
            _ => continue,
        };
        let mac = child("mac").and_then(|m| m.attribute("address")).ok_or_else(|| bad("no <mac address>"))?;
        let mac = valid_mac(mac)
            .ok_or_else(|| bad(&format!("<mac address='{}'> is not a unicast MAC", mac.escape_debug())))?;
        let name = iface_name(name, index).map_err(|e| bad(&e.to_string()))?;
        ifaces.push(Iface { name, kind, mac });
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
            (p.control.as_deref(), p.datapath, p.network),
            (Some("unix:/run/vnet/lan.sock"), Some(Datapath::Kernel), Some(3))
        );
        assert_eq!(
            p.ifaces,
            vec![
                Iface {
                    name: Name::new("lv-web_1-0").unwrap(),
                    kind: Kind::VhostUser(SocketPath::new("/run/vnet/vhost/web1.sock").unwrap()),
                    mac: "52:54:00:aa:00:01".parse().unwrap()
                },
                Iface {
                    name: Name::new("lv-web_1-2").unwrap(),
                    kind: Kind::Tap(DevName::new("vt-web1").unwrap()),
                    mac: "52:54:00:aa:00:03".parse().unwrap()
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
        assert!(plan(&bad_mac).unwrap_err().to_string().contains("is not a unicast MAC"));
        // A newline (`&#10;` in XML), a space or a `#` in a value is refused, never sent.
        for path in
            ["/run/vnet/x&#10;link evil udp 10.0.0.9:9000", "/run/vnet/x mac 02:00:00:00:00:01", "/run/v#"]
        {
            let xml = DOMAIN.replace("/run/vnet/vhost/web1.sock", path);
            let e = plan(&xml).unwrap_err().to_string();
            assert!(e.contains("<source path>") && !e.contains('\n'), "{e}");
        }
        let dev = DOMAIN.replace("vt-web1", "vt&#10;x");
        assert!(plan(&dev).unwrap_err().to_string().contains("<target dev>"));
        let dp = DOMAIN.replace("datapath=\"kernel\"", "datapath=\"fast\"");
        assert!(matches!(plan(&dp), Err(Error::Attach(_))));
        let long = DOMAIN.replace("web 1", &"x".repeat(200));
        assert!(plan(&long).unwrap().unwrap().ifaces.iter().all(|i| i.name.as_str().len() <= 63));
    }

    #[test]
    fn a_detach_reads_the_names_even_when_libvirt_no_longer_says_the_device() {
        // Issue 45: at `release` after `virsh destroy`, libvirt's XML has no
        // <target dev>, and every destroy logged a hook error.
        let gone = DOMAIN.replace("<target dev='vt-web1' managed='yes'/>", "");
        assert!(plan(&gone).is_err(), "an attach still needs the device");
        let names: Vec<String> =
            names(&gone).unwrap().unwrap().ifaces.iter().map(|i| i.name.to_string()).collect();
        let attached: Vec<String> =
            plan(DOMAIN).unwrap().unwrap().ifaces.iter().map(|i| i.name.to_string()).collect();
        assert_eq!(names, attached, "the names a detach sends are the attach's");
    }
}
