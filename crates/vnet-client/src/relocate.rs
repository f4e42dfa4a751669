//! Moving a VM's interface from one host to another (`vnetctl move`), the
//! paper's location independence, driven over the control endpoints of
//! every host of the overlay:
//!
//! 1. the new host declares the interface (same MAC) and routes the MAC and
//!    broadcast to it, in one transaction;
//! 2. every other host, in one transaction each, drops its routes for the
//!    MAC and routes it over its link to the new host; the old host (the
//!    one with an interface of that MAC) also deletes that interface and
//!    its routes;
//! 3. the new host announces the MAC (a broadcast RARP over every link), so
//!    learning switches and caches on the way re-learn at once.
//!
//! Each host changes atomically; between hosts, frames for the VM may for
//! a moment go to the old host, which is why the new host goes first. Each
//! host changed then saves its running configuration to its config file
//! (`save`), so that a restart of any of them keeps the VM where it moved
//! (it declared the interface again on the old host, and routed the MAC
//! as before, on the others).
//!
//! A live migration (`docs/INTEGRATION.md`) declares the interface on the
//! new host beforehand, `standby`: its vnetd makes it active, routed and
//! announced, when the VM's first frame arrives there. `wait SECONDS` makes
//! the move wait for that (polling the new host) before step 2, and step 1
//! then only completes what the activation did: an interface the new host
//! already has (same name and MAC) is kept, never declared twice.
//!
//! In cluster mode (the new host runs `vnetd --cluster`) the move is one
//! step: the new host declares the interface `standby` and activates it
//! (a migration's switch-over, as the VM's own first frame would), its
//! vnetd claims the MAC in the store at the epoch above the held one and
//! announces it, and every host reroutes from its watch. A plain
//! declaration would not do: a claim of a MAC another host holds is a
//! conflict unless it is a migration's.
//! The hosts listed are only visited to delete the old interface, once
//! they route the MAC to a link (they have seen the claim).
//!
//! Every change is a typed request (`vnet_control::request`): the names an
//! other host reports (its interface, its link to the new host) are
//! checked as names before they are sent back to anyone, and the
//! declaration typed after `interface` is parsed and typed like any value.

use crate::client::{Client, Refused};
use crate::endpoint::Endpoint;
use serde_json::Value;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use vnet_control::request::{Interface, Name, Request, To};
use vnet_control::ShowWhat;
use vnet_wire::MacAddr;

/// Why a move stopped, and on which host: each host changed before it
/// keeps its change (the report of the hosts done is lost with the error,
/// which names the one that failed).
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    #[error("the interface declaration: {0}")]
    Syntax(#[from] vnet_control::Error),
    #[error("an interface declaration: NAME KIND DEV [options]")]
    NoDeclaration,
    #[error("the interface declaration: {0}")]
    Declaration(#[from] vnet_control::request::Invalid),
    #[error("cannot reach vnetd at {ep}: {source}")]
    Unreachable { ep: Endpoint, source: std::io::Error },
    #[error("{ep}: {source}")]
    Io { ep: Endpoint, source: std::io::Error },
    /// A request the host answered with an error (its words).
    #[error("{ep}: `{request}`: {reply}")]
    Refused { ep: Endpoint, request: Box<Request>, reply: Refused },
    #[error("{ep}: the transaction was refused ({reply}):\n{requests}")]
    Transaction { ep: Endpoint, reply: Refused, requests: String },
    #[error("{ep}: show {word}: {source}")]
    BadShow { ep: Endpoint, word: &'static str, source: serde_json::Error },
    /// A name the host reported that is no name: never sent on.
    #[error("{ep}: its {what}: {source}")]
    Reported { ep: Endpoint, what: &'static str, source: vnet_control::request::Invalid },
    #[error("{ep}: no link to the new host ({ip})")]
    NoLink { ep: Endpoint, ip: IpAddr },
    #[error("{ep}: no `listen udp ADDR` in its config")]
    NoListen { ep: Endpoint },
    #[error("{ep}: it listens on {addr}: name its underlay address with `via IP`")]
    Unspecified { ep: Endpoint, addr: SocketAddr },
    #[error("{ep}: interface {name} went away while waiting for its VM")]
    Gone { ep: Endpoint, name: String },
    #[error("{ep}: interface {name} still waits for its VM after {wait:?}")]
    NotArrived { ep: Endpoint, name: String, wait: std::time::Duration },
    #[error(
        "{ep}: still routes {mac} to its interface {old} after {after:?}: the new host's claim did not reach it \
         (see `show cluster` on both: a conflict, another cluster network or vnet network, or the store unreachable)"
    )]
    ClaimNotSeen { ep: Endpoint, mac: String, old: String, after: std::time::Duration },
}

/// What to move where.
#[derive(Debug, Clone)]
pub struct Move {
    pub mac: MacAddr,
    /// The new host's control endpoint.
    pub to: Endpoint,
    /// The interface declaration on the new host, as after `interface`:
    /// `NAME KIND DEV [options]` (`mac` is added when missing).
    pub decl: String,
    /// Every other host of the overlay (the old one among them).
    pub hosts: Vec<Endpoint>,
    /// The new host's underlay address, as its peers' links name it; by
    /// default its `listen` address.
    pub to_ip: Option<IpAddr>,
    /// How long to wait for the new host's (standby) interface to become
    /// active before the others are changed; `None`: no waiting.
    pub wait: Option<std::time::Duration>,
}

/// How often the new host is asked whether the VM arrived.
const ARRIVAL_POLL: std::time::Duration = std::time::Duration::from_millis(2);

/// The declaration `decl` (`NAME KIND DEV [options]`), typed, with `mac`
/// when it names none.
fn declaration(decl: &str, mac: vnet_wire::MacAddr) -> Result<Interface, MoveError> {
    let line = format!("interface {}", decl.trim());
    let parsed = vnet_control::parse_line(&line, 1, &mut vnet_control::Section::None)?
        .ok_or(MoveError::NoDeclaration)?;
    let mut i = Interface::from_command(&parsed.item)?;
    i.mac.get_or_insert(mac);
    Ok(i)
}

/// A name another host reported, checked before it is sent anywhere.
fn reported(ep: &Endpoint, what: &'static str, name: &str) -> Result<Name, MoveError> {
    Name::new(name).map_err(|source| MoveError::Reported { ep: ep.clone(), what, source })
}

/// Carries out `m`; returns what was done, one line per host.
pub fn relocate(m: &Move) -> Result<String, MoveError> {
    let mac = m.mac.to_string();
    let decl = declaration(&m.decl, m.mac)?;
    let name = decl.name.as_str().to_string();
    let mut to = connect(&m.to)?;
    let have = iface_named(&mut to, &m.to, &name)?.filter(|i| i["mac"] == mac.as_str());
    if let (Some(wait), Some(_)) = (m.wait, &have) {
        wait_active(&mut to, &m.to, &name, wait)?;
    }
    if in_cluster(&mut to) {
        return relocate_in_cluster(m, &mut to, decl, have.is_some());
    }
    let to_ip = match m.to_ip {
        Some(ip) => ip,
        None => listen_ip(&mut to, &m.to)?,
    };
    let mut report = String::new();

    let own = format!("interface {name}");
    let now = routes(&mut to, &m.to)?;
    let routed = |dst: &str| {
        have.is_some() && now.iter().any(|r| r["dst"] == dst && r["src"] == "any" && r["to"] == own.as_str())
    };
    let mut t =
        delete_routes(&now, |r| r["dst"] == mac.as_str() && (have.is_none() || r["to"] != own.as_str()));
    let iface = decl.name.clone();
    if have.is_none() {
        t.push(Request::declare(decl)?);
    }
    for dst in [m.mac, vnet_wire::MacAddr::BROADCAST] {
        if !routed(&dst.to_string()) {
            t.push(Request::RouteMac { dst, to: To::Interface(iface.clone()) });
        }
    }
    if !t.is_empty() {
        apply(&mut to, &m.to, &t)?;
    }
    let how = if have.is_some() { "kept" } else { "attached" };
    let saved = persist(&mut to, &m.to)?;
    let _ = writeln!(report, "{}: interface {name} {how}, {mac} routed to it; {saved}", m.to);

    for ep in m.hosts.iter().filter(|e| **e != m.to) {
        let mut c = connect(ep)?;
        let old = iface_with_mac(&mut c, ep, &mac)?;
        let link = show(&mut c, ep, ShowWhat::Links)?
            .iter()
            .find(|l| {
                l["remote"].as_str().and_then(|r| r.parse::<SocketAddr>().ok()).map(|a| a.ip()) == Some(to_ip)
            })
            .and_then(|l| l["name"].as_str().map(str::to_string))
            .ok_or_else(|| MoveError::NoLink { ep: ep.clone(), ip: to_ip })?;
        let link = reported(ep, "link to the new host", &link)?;
        let old_to = old.as_ref().map(|o| format!("interface {o}"));
        let mut t = delete_routes(&routes(&mut c, ep)?, |r| {
            r["dst"] == mac.as_str() || old_to.as_deref().is_some_and(|o| r["to"] == o)
        });
        if let Some(o) = &old {
            t.push(Request::DeleteInterface(reported(ep, "interface with the MAC", o)?));
        }
        t.push(Request::RouteMac { dst: m.mac, to: To::Link(link.clone()) });
        apply(&mut c, ep, &t)?;
        let saved = persist(&mut c, ep)?;
        match &old {
            Some(o) => {
                let _ =
                    writeln!(report, "{ep}: interface {o} deleted, {mac} routed over link {link}; {saved}");
            }
            None => {
                let _ = writeln!(report, "{ep}: {mac} routed over link {link}; {saved}");
            }
        }
    }

    let r = ask(&mut to, &m.to, Request::Announce(m.mac))?;
    let _ = write!(report, "{}: {}", m.to, r.body);
    Ok(report)
}

/// Whether the host runs in cluster mode.
fn in_cluster(c: &mut Client) -> bool {
    let Ok(r) = c.send(&Request::Show { what: ShowWhat::Cluster, json: true }) else { return false };
    r.result.is_ok() && serde_json::from_str::<Value>(&r.body).is_ok_and(|v| !v["cluster"].is_null())
}

/// How long the old host may take to see the new host's claim.
const CLAIM_SEEN: std::time::Duration = std::time::Duration::from_secs(5);

fn relocate_in_cluster(
    m: &Move,
    to: &mut Client,
    mut decl: Interface,
    have: bool,
) -> Result<String, MoveError> {
    let mac = m.mac.to_string();
    let name = decl.name.clone();
    let mut report = String::new();
    if !have {
        decl.standby = true;
        let d = Request::declare(decl)?;
        apply(to, &m.to, &[d])?;
    }
    ask(to, &m.to, Request::Activate(name.clone()))?;
    let saved = persist(to, &m.to)?;
    let _ = writeln!(
        report,
        "{}: interface {name} attached and active; its vnetd claims {mac} in the store (a migration); {saved}",
        m.to
    );
    for ep in m.hosts.iter().filter(|e| **e != m.to) {
        let mut c = connect(ep)?;
        let Some(old) = iface_with_mac(&mut c, ep, &mac)? else { continue };
        let deadline = std::time::Instant::now() + CLAIM_SEEN;
        loop {
            let seen = routes(&mut c, ep)?.iter().any(|r| {
                r["dst"] == mac.as_str() && r["to"].as_str().is_some_and(|t| t.starts_with("link "))
            });
            if seen {
                break;
            }
            if std::time::Instant::now() > deadline {
                return Err(MoveError::ClaimNotSeen { ep: ep.clone(), mac, old, after: CLAIM_SEEN });
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        apply(&mut c, ep, &[Request::DeleteInterface(reported(ep, "interface with the MAC", &old)?)])?;
        let saved = persist(&mut c, ep)?;
        let _ = writeln!(report, "{ep}: saw the claim; interface {old} deleted; {saved}");
    }
    Ok(report)
}

/// Saves the host's running configuration to its config file, so that the
/// move outlives a restart of the host (it would declare the interface, or
/// route the MAC, as before the move). A host started without a config
/// file has nothing to save to: said, not an error.
fn persist(c: &mut Client, ep: &Endpoint) -> Result<&'static str, MoveError> {
    let r = send(c, ep, &Request::Save)?;
    match r.result {
        Ok(()) => Ok("saved to its configuration file"),
        Err(e) if e.0.contains("without --config") => Ok("not saved: it runs without a configuration file"),
        Err(reply) => Err(refused(ep, Request::Save, reply)),
    }
}

fn connect(ep: &Endpoint) -> Result<Client, MoveError> {
    Client::connect(ep).map_err(|source| MoveError::Unreachable { ep: ep.clone(), source })
}

/// One request to the host at `ep`; its reply, whatever it says.
fn send(c: &mut Client, ep: &Endpoint, r: &Request) -> Result<crate::client::Reply, MoveError> {
    c.send(r).map_err(|source| MoveError::Io { ep: ep.clone(), source })
}

fn refused(ep: &Endpoint, request: Request, reply: Refused) -> MoveError {
    MoveError::Refused { ep: ep.clone(), request: Box::new(request), reply }
}

/// One request to the host at `ep` that must be accepted: its reply, or
/// the refusal with the request it refused.
fn ask(c: &mut Client, ep: &Endpoint, r: Request) -> Result<crate::client::Reply, MoveError> {
    let reply = send(c, ep, &r)?;
    match reply.result {
        Ok(()) => Ok(reply),
        Err(e) => Err(refused(ep, r, e)),
    }
}

fn show(c: &mut Client, ep: &Endpoint, what: ShowWhat) -> Result<Vec<Value>, MoveError> {
    let word = vnet_control::request::show_word(what);
    let r = ask(c, ep, Request::Show { what, json: true })?;
    let v: Value = serde_json::from_str(&r.body).map_err(|source| MoveError::BadShow {
        ep: ep.clone(),
        word,
        source,
    })?;
    Ok(v[word].as_array().cloned().unwrap_or_default())
}

/// The host's interface `name` (its `show interfaces` row), if it has one.
fn iface_named(c: &mut Client, ep: &Endpoint, name: &str) -> Result<Option<Value>, MoveError> {
    Ok(show(c, ep, ShowWhat::Interfaces)?.into_iter().find(|i| i["name"] == name))
}

/// Waits until the host's interface `name` is active (its VM arrived).
fn wait_active(
    c: &mut Client,
    ep: &Endpoint,
    name: &str,
    wait: std::time::Duration,
) -> Result<(), MoveError> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let state = iface_named(c, ep, name)?.map(|i| i["state"].as_str().unwrap_or("active").to_string());
        match state.as_deref() {
            Some("active") => return Ok(()),
            None => return Err(MoveError::Gone { ep: ep.clone(), name: name.into() }),
            Some(_) if std::time::Instant::now() > deadline => {
                return Err(MoveError::NotArrived { ep: ep.clone(), name: name.into(), wait })
            }
            Some(_) => std::thread::sleep(ARRIVAL_POLL),
        }
    }
}

/// The name of the host's interface with MAC `mac`, if it has one.
fn iface_with_mac(c: &mut Client, ep: &Endpoint, mac: &str) -> Result<Option<String>, MoveError> {
    Ok(show(c, ep, ShowWhat::Interfaces)?
        .iter()
        .find(|i| i["mac"] == mac)
        .and_then(|i| i["name"].as_str().map(str::to_string)))
}

fn routes(c: &mut Client, ep: &Endpoint) -> Result<Vec<Value>, MoveError> {
    show(c, ep, ShowWhat::Routes)
}

/// `delete route N` requests for the routes `pick` chooses.
fn delete_routes(routes: &[Value], pick: impl Fn(&Value) -> bool) -> Vec<Request> {
    routes
        .iter()
        .filter(|r| pick(r))
        .filter_map(|r| r["id"].as_u64().and_then(|id| u32::try_from(id).ok()))
        .map(Request::DeleteRoute)
        .collect()
}

fn apply(c: &mut Client, ep: &Endpoint, t: &[Request]) -> Result<(), MoveError> {
    let requests = || t.iter().map(|r| format!("{r}\n")).collect::<String>();
    match c.transact(t) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(reply)) => Err(MoveError::Transaction { ep: ep.clone(), reply, requests: requests() }),
        Err(source) => Err(MoveError::Io { ep: ep.clone(), source }),
    }
}

/// The address in the host's `listen` line.
fn listen_ip(c: &mut Client, ep: &Endpoint) -> Result<IpAddr, MoveError> {
    let r = send(c, ep, &Request::Show { what: ShowWhat::Config, json: false })?;
    let addr = r
        .body
        .lines()
        .find_map(|l| l.strip_prefix("listen udp "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .ok_or_else(|| MoveError::NoListen { ep: ep.clone() })?;
    if addr.ip().is_unspecified() {
        return Err(MoveError::Unspecified { ep: ep.clone(), addr });
    }
    Ok(addr.ip())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn deletes_only_the_chosen_routes() {
        let rs = vec![
            json!({"id": 1, "dst": "52:54:00:00:00:01", "to": "link a"}),
            json!({"id": 4, "dst": "ff:ff:ff:ff:ff:ff", "to": "interface vm0"}),
            json!({"id": 7, "dst": "52:54:00:00:00:02", "to": "link a"}),
        ];
        let t = delete_routes(&rs, |r| r["dst"] == "52:54:00:00:00:01" || r["to"] == "interface vm0");
        assert_eq!(t, vec![Request::DeleteRoute(1), Request::DeleteRoute(4)]);
    }

    #[test]
    fn a_declaration_is_typed_and_names_another_host_reports_are_checked() {
        let mac: vnet_wire::MacAddr = "52:54:00:00:00:07".parse().unwrap();
        let i = declaration("vm1 netdev vt1 datapath user", mac).unwrap();
        assert_eq!(
            Request::Declare(i).line(),
            "interface vm1 netdev vt1 mac 52:54:00:00:00:07 datapath user"
        );
        assert!(declaration("vm1 netdev vt1 # mac 02:00:00:00:00:01", mac).is_ok(), "a comment is no option");
        assert!(declaration("vm1 bridge x", mac).unwrap_err().to_string().contains("interface kind"));
        let ep: Endpoint = "unix:/x".parse().unwrap();
        assert!(reported(&ep, "link", "h1\nlink evil udp 192.0.2.9:9000").is_err());
        assert!(reported(&ep, "link", "h1").is_ok());
    }
}
