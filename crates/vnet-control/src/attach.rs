//! `attach` and `detach`: interfaces that come and go with the VMs and
//! containers that own them.
//!
//! A CNI plugin or a libvirt hook runs once per event and may run again
//! for the same event (a retried `ADD`, a `DEL` after a failed `ADD`, a
//! `DEL` repeated by the runtime), so what it asks of vnetd must be
//! idempotent and must not leave half a change behind. Both commands are
//! turned here, against the running state, into the ordinary commands of
//! one transaction:
//!
//! - `attach NAME KIND DEV [options]` (the words of an `interface` line):
//!   nothing if `NAME` runs as declared (but its routes are made if
//!   missing); else the old `NAME` goes with the routes that use it, and
//!   the new one comes with `route any MAC -> interface NAME` and the
//!   broadcast route (when it has a `mac`), which is how an interface is
//!   reached in a static config and what cluster mode derives for a
//!   local interface anyway (it keeps, never doubles, these routes).
//! - `detach NAME`: every route to or from `NAME`, then `NAME`; nothing
//!   (and no error) if there is no `NAME`.
//! - `attach ... standby` (a live migration's destination, before the VM
//!   runs there): the interface without its routes; `standby` is a state,
//!   not part of what is declared, so attaching again with or without it
//!   keeps a running interface as it is (an active one stays active).
//! - `activate NAME`: a standby `NAME` becomes active: every `route any
//!   MAC` that sends its MAC elsewhere (to the host the VM left) goes, and
//!   its own two routes come; nothing if it is active already. vnetd runs
//!   this itself when the VM's first frame arrives.

use crate::ast::{Command, From, IfaceRef, Ref, Target};
use crate::state::{InterfaceDef, State};
use crate::{Located, Pos};
use vnet_model::{MacSpec, Port, SourceFilter};
use vnet_wire::MacAddr;

/// The commands that make the interface `decl` (a [`Command::Interface`])
/// hold in `state`, with its routes; empty when nothing is to change.
pub fn attach(state: &State, pos: Pos, decl: &Command) -> Vec<Located<Command>> {
    let Command::Interface { name, mac, standby, .. } = decl else {
        return Vec::new();
    };
    let mut t = Vec::new();
    let kept = match state.iface_by_name(name) {
        Some(old) if declares(old, decl) => Some(old.id),
        Some(old) => {
            t.extend(detach_def(state, pos, old));
            None
        }
        None => None,
    };
    if kept.is_none() {
        t.push(Located { pos, item: decl.clone() });
    }
    // A standby interface (new, or kept while still standby) waits for
    // its VM without routes.
    let waiting = match kept {
        Some(id) => state.interfaces.get(&id).is_some_and(|i| i.standby),
        None => *standby,
    };
    if let (Some(mac), false) = (mac, waiting) {
        t.extend(own_routes(state, pos, name, kept, *mac));
    }
    t
}

/// The commands that make the standby interface `name` active, with its
/// routes replacing those that sent its MAC elsewhere; empty when it is
/// active already. An error names what is missing.
pub fn activate(state: &State, pos: Pos, name: &str) -> Result<Vec<Located<Command>>, crate::Error> {
    let Some(i) = state.iface_by_name(name) else {
        return Err(crate::Error::new(pos, "the name of an interface", format!("`{name}`")));
    };
    if !i.standby {
        return Ok(Vec::new());
    }
    let mut t = vec![Located { pos, item: Command::Activate(name.to_string()) }];
    if let Some(mac) = i.mac {
        let port = Port::Interface(i.id);
        t.extend(
            state
                .routes
                .values()
                .filter(|r| r.src == MacSpec::Any && r.dst == MacSpec::Addr(mac) && r.to != port)
                .map(|r| Located { pos, item: Command::DeleteRoute(Ref { pos, by: r.id }) }),
        );
        t.extend(own_routes(state, pos, name, Some(i.id), mac));
    }
    Ok(t)
}

/// `route any MAC -> interface NAME` and the broadcast route, each unless
/// interface `kept` (already running) has it.
fn own_routes(state: &State, pos: Pos, name: &str, kept: Option<u32>, mac: MacAddr) -> Vec<Located<Command>> {
    let mut t = Vec::new();
    for dst in [mac, MacAddr::BROADCAST] {
        let routed = kept.is_some_and(|id| {
            state.routes.values().any(|r| {
                r.to == Port::Interface(id)
                    && r.src == MacSpec::Any
                    && r.dst == MacSpec::Addr(dst)
                    && r.from == SourceFilter::Any
            })
        });
        if !routed {
            let to = Target::Interface(Ref { pos, by: IfaceRef::Name(name.to_string()) });
            let item = Command::Route { src: MacSpec::Any, dst: MacSpec::Addr(dst), to, from: From::Any };
            t.push(Located { pos, item });
        }
    }
    t
}

/// The commands that remove interface `name` and every route that uses
/// it; empty when there is no such interface.
pub fn detach(state: &State, pos: Pos, name: &str) -> Vec<Located<Command>> {
    state.iface_by_name(name).map(|i| detach_def(state, pos, i)).unwrap_or_default()
}

fn detach_def(state: &State, pos: Pos, i: &InterfaceDef) -> Vec<Located<Command>> {
    let port = Port::Interface(i.id);
    let mut t: Vec<_> = state
        .routes
        .values()
        .filter(|r| r.to == port || r.from == SourceFilter::Port(port))
        .map(|r| Located { pos, item: Command::DeleteRoute(Ref { pos, by: r.id }) })
        .collect();
    t.push(Located { pos, item: Command::DeleteInterface(Ref { pos, by: i.name.clone() }) });
    t
}

/// True if `old` runs as `decl` declares it (standby or not: a state).
fn declares(old: &InterfaceDef, decl: &Command) -> bool {
    InterfaceDef::declared(old.id, decl).is_some_and(|d| InterfaceDef { standby: old.standby, ..d } == *old)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_line;
    use crate::Section;

    fn state(text: &str) -> State {
        let mut s = State::default();
        for c in crate::parse(text).unwrap() {
            s.apply(&c).unwrap();
        }
        s
    }

    fn cmd(line: &str) -> Command {
        parse_line(line, 1, &mut Section::None).unwrap().unwrap().item
    }

    /// Applies `attach`/`detach` as the control endpoint does: expanded,
    /// then applied as one transaction.
    fn run(s: &mut State, line: &str) -> usize {
        let t = match cmd(line) {
            Command::Attach(d) => attach(s, Pos::default(), &d),
            Command::Detach(n) => detach(s, Pos::default(), &n),
            Command::Activate(n) => activate(s, Pos::default(), &n).unwrap(),
            other => panic!("not attach/detach: {other:?}"),
        };
        let mut next = s.clone();
        for c in &t {
            next.apply(c).unwrap();
        }
        *s = next;
        t.len()
    }

    #[test]
    fn attach_declares_and_routes_once_and_detach_removes_everything_once() {
        let mut s = state("link b udp 10.0.0.2:9000\nroute any any -> link b\n");
        let line = "attach c1 netdev vc1 mac 52:54:00:00:00:07 datapath kernel";
        assert_eq!(run(&mut s, line), 3, "the interface and its two routes");
        let i = s.iface_by_name("c1").unwrap().id;
        let to_it = |s: &State| s.routes.values().filter(|r| r.to == Port::Interface(i)).count();
        assert_eq!(to_it(&s), 2);
        assert_eq!(run(&mut s, line), 0, "a second attach as declared changes nothing");
        // A route using it from elsewhere goes with it on detach.
        s.apply(&crate::parse("route any any -> link b from interface c1").unwrap()[0]).unwrap();
        assert_eq!(run(&mut s, "detach c1"), 4);
        assert!(s.iface_by_name("c1").is_none());
        assert_eq!(s.routes.len(), 1, "only the operator's own route is left");
        assert_eq!(run(&mut s, "detach c1"), 0, "a second detach is no error and no change");
    }

    #[test]
    fn attach_of_a_different_declaration_replaces_the_interface() {
        let mut s = State::default();
        run(&mut s, "attach c1 netdev vc1 mac 52:54:00:00:00:07");
        let old = s.iface_by_name("c1").unwrap().id;
        // Delete routes 2, the interface, declare it, 2 routes.
        assert_eq!(run(&mut s, "attach c1 netdev vc2 mac 52:54:00:00:00:08"), 6);
        let new = s.iface_by_name("c1").unwrap();
        assert_ne!(new.id, old);
        assert_eq!(new.dev, "vc2");
        assert_eq!(s.routes.len(), 2);
        assert!(s.routes.values().all(|r| r.to == Port::Interface(new.id)));
    }

    #[test]
    fn attach_puts_back_a_missing_route_and_without_a_mac_routes_nothing() {
        let mut s = State::default();
        run(&mut s, "attach c1 netdev vc1 mac 52:54:00:00:00:07");
        let bcast = s.routes.values().find(|r| r.dst == MacSpec::Addr(MacAddr::BROADCAST)).unwrap().id;
        s.apply(&crate::parse(&format!("delete route {bcast}")).unwrap()[0]).unwrap();
        assert_eq!(run(&mut s, "attach c1 netdev vc1 mac 52:54:00:00:00:07"), 1);
        let c1 = Port::Interface(s.iface_by_name("c1").unwrap().id);
        let dsts = |s: &State| {
            let mut d: Vec<MacSpec> = s.routes.values().filter(|r| r.to == c1).map(|r| r.dst).collect();
            d.sort_by_key(|d| d.to_string());
            d
        };
        // The one put back is the broadcast route, not the MAC's again.
        let mac = MacSpec::Addr("52:54:00:00:00:07".parse().unwrap());
        assert_eq!(dsts(&s), [mac, MacSpec::Addr(MacAddr::BROADCAST)]);
        assert_eq!(run(&mut s, "attach c2 netdev vc2"), 1, "only the interface");
    }

    #[test]
    fn ipam_lines_parse_and_bad_subnets_and_owners_say_where() {
        use crate::IpamOp;
        let add = cmd("ipam add 10.88.0.0/24 net/c1/eth0 range 10.88.0.10 10.88.0.20");
        let range = Some(("10.88.0.10".parse().unwrap(), "10.88.0.20".parse().unwrap()));
        assert_eq!(
            add,
            Command::Ipam(IpamOp::Add { subnet: "10.88.0.0/24".into(), owner: "net/c1/eth0".into(), range })
        );
        assert_eq!(cmd("ipam del net/c1/eth0"), Command::Ipam(IpamOp::Del { owner: "net/c1/eth0".into() }));
        let e = crate::parse("ipam add 10.88.0.0 x").unwrap_err().to_string();
        assert!(e.contains("1:10") && e.contains("a subnet"), "{e}");
        let e = crate::parse("ipam del a;b").unwrap_err().to_string();
        assert!(e.contains("an owner"), "{e}");
    }

    #[test]
    fn a_standby_interface_waits_unrouted_and_activate_moves_its_mac_to_it_once() {
        let m = "52:54:00:00:00:07";
        let mut s =
            state(&format!("link a udp 10.0.0.1:9000\nroute any {m} -> link a\nroute any any -> link a\n"));
        assert_eq!(run(&mut s, &format!("attach g netdev q0 mac {m} standby")), 1, "no routes while standby");
        let g = s.iface_by_name("g").unwrap().clone();
        assert!(g.standby);
        let to = |s: &State, port: Port| s.routes.values().filter(|r| r.to == port).count();
        assert_eq!(to(&s, Port::Interface(g.id)), 0);
        // The hook runs again, with or without `standby`: nothing changes.
        assert_eq!(run(&mut s, &format!("attach g netdev q0 mac {m} standby")), 0);
        assert_eq!(run(&mut s, &format!("attach g netdev q0 mac {m}")), 0, "still waiting for its VM");
        // The VM arrives: the route to the old host goes, its own two come.
        assert_eq!(run(&mut s, "activate g"), 4);
        assert!(!s.iface_by_name("g").unwrap().standby);
        assert_eq!(to(&s, Port::Interface(g.id)), 2);
        let link = Port::Link(s.link_by_name("a").unwrap().id);
        assert_eq!(to(&s, link), 1, "only the operator's default route is left on the link");
        assert!(s.routes.values().any(|r| r.to == link && r.dst == MacSpec::Any), "the default route stays");
        assert_eq!(run(&mut s, "activate g"), 0, "active already");
        assert_eq!(
            run(&mut s, &format!("attach g netdev q0 mac {m} standby")),
            0,
            "an active one stays active"
        );
        assert!(!s.iface_by_name("g").unwrap().standby);
        assert!(activate(&s, Pos::default(), "nope")
            .unwrap_err()
            .to_string()
            .contains("the name of an interface"));
        // A saved config keeps a waiting interface waiting.
        s.apply(&crate::parse("interface h netdev q1 mac 52:54:00:00:00:08 standby").unwrap()[0]).unwrap();
        assert!(
            s.to_config().contains("mac 52:54:00:00:00:08 mode adaptive queues 1 standby"),
            "{}",
            s.to_config()
        );
        assert!(crate::parse("interface h netdev q1 standby")
            .unwrap_err()
            .to_string()
            .contains("`mac` with `standby`"));
    }

    #[test]
    fn attach_and_detach_are_not_config_lines() {
        let mut s = State::default();
        let e = s.apply(&crate::parse("detach c1").unwrap()[0]).unwrap_err();
        assert!(e.to_string().contains("a control command"), "{e}");
        assert!(crate::parse("attach c1 bridge x").unwrap_err().to_string().contains("interface kind"));
    }
}
