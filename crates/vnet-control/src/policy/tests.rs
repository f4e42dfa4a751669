use super::*;
use crate::{Command, State};

fn state(text: &str) -> crate::Result<State> {
    State::default().apply_all(&crate::parse(text)?)
}

const RULES: &str = "policy default deny network 7\n\
    group web 52:54:00:00:00:02\ngroup web 52:54:00:00:00:03\ngroup db 52:54:00:00:00:04\n\
    rule web-db allow network 7 priority 10 from group web to group db proto tcp port 5432\n\
    rule arp allow network 7 ether arp\n\
    rule mgmt allow network 7 from net 10.9.0.0/16 to mac 52:54:00:00:00:04 proto udp port 8000-8080\n\
    rule v6 deny network 7 priority 5 to net fd00::/64 ether ipv6 proto icmpv6\n\
    rule odd allow network 7 ether 0x88b5 proto 47\n";

#[test]
fn rules_groups_and_defaults_are_declared_written_back_and_diffed() {
    let s = state(RULES).unwrap();
    let p = &s.policies;
    assert_eq!(p.defaults[&7], Verb::Deny);
    assert_eq!(p.groups["web"].len(), 2);
    let order: Vec<&str> = p.ordered(7).iter().map(|r| r.name.as_str()).collect();
    assert_eq!(order, ["v6", "web-db", "arp", "mgmt", "odd"], "priority, then name");
    let r = &p.rules["web-db"];
    assert_eq!((r.proto, r.ports, &r.from), (Some(6), Some((5432, 5432)), &Sel::Group("web".into())));
    assert_eq!(p.rules["mgmt"].ports, Some((8000, 8080)));
    assert_eq!(p.networks().into_iter().collect::<Vec<_>>(), [7]);
    let conf = s.to_config();
    for line in [
        "policy default deny network 7\n",
        "group web 52:54:00:00:00:02\n",
        "rule web-db allow network 7 priority 10 from group web to group db proto tcp port 5432\n",
        "rule v6 deny network 7 priority 5 to net fd00::/64 ether ipv6 proto icmpv6\n",
        "rule odd allow network 7 ether 0x88b5 proto 47\n",
    ] {
        assert!(conf.contains(line), "{line} in {conf}");
    }
    assert_eq!(state(&conf).unwrap(), s, "the written configuration reads back the same");
    let s2 = s
        .apply_all(
            &crate::parse(
                "delete rule arp\ndelete group web 52:54:00:00:00:03\ndelete policy network 7\n\
                 rule arp deny network 7 ether arp\npolicy default allow\n",
            )
            .unwrap(),
        )
        .unwrap();
    assert_eq!(s2.policies.rules["arp"].verb, Verb::Deny);
    assert_eq!(s2.policies.defaults.get(&0), Some(&Verb::Allow));
    let d = s.diff(&s2, &|_| false);
    assert_eq!(s.apply_all(&crate::parse(&d).unwrap()).unwrap(), s2, "{d}");
    let back = s2.diff(&s, &|_| false);
    assert_eq!(s2.apply_all(&crate::parse(&back).unwrap()).unwrap(), s, "{back}");
    // The last member of a group gone, the group goes.
    let s3 = s.apply_all(&crate::parse("delete group db 52:54:00:00:00:04").unwrap()).unwrap();
    assert!(!s3.policies.groups.contains_key("db"));
}

#[test]
fn what_a_policy_cannot_hold_is_refused_with_its_place() {
    for (text, col, want) in [
        ("rule r allow port 22", 14, "`proto tcp` or `proto udp` before `port`"),
        ("rule r allow proto icmp port 22", 25, "`proto tcp` or `proto udp`"),
        ("rule r allow proto tcp port 30-20", 24, "a port range low to high"),
        ("rule r allow from net 10.1.0.1/16", 23, "a prefix with no bits past its length"),
        ("rule r allow to net fd00::1/64", 21, "a prefix with no bits past its length"),
        ("rule r allow from net 10.0.0.0/33", 23, "a prefix with no bits"),
        ("rule r allow from host 10.0.0.1", 19, "`any`, `mac`, `group` or `net`"),
        ("rule r permit", 8, "`allow` or `deny`"),
        ("rule r allow proto tcp proto udp", 24, "each of a rule's words once"),
        ("rule r allow ether 0x05dc", 20, "an EtherType"),
        ("rule r allow proto 256", 20, "a protocol number"),
        ("rule r allow proto tcp port 70000", 29, "a port or a range"),
        ("rule any allow", 6, "a rule name"),
        ("policy default allow network x", 30, "a network id"),
        ("policy allow", 8, "`default`"),
        ("group web 10.0.0.1", 11, "a MAC address"),
        ("delete rule nosuch", 13, "a declared rule"),
        ("delete group web 52:54:00:00:00:02", 14, "a member of the group"),
        ("delete policy network 3", 8, "a network with a `policy` line"),
    ] {
        let e = state(text).unwrap_err();
        assert!(e.expected.contains(want) && e.pos.column == col, "{text}: {e} (column {})", e.pos.column);
    }
    assert!(crate::parse("rule r allow").unwrap()[0].item.is_change());
    assert!(matches!(crate::parse("group g 52:54:00:00:00:02").unwrap()[0].item, Command::Group { .. }));
}

#[test]
fn a_network_holds_at_most_its_rules_and_the_rules_at_most_their_groups() {
    let mut p = Policies::default();
    let pos = Pos::default();
    let rule = |name: String, network: u32, from: Sel| RuleDef {
        name,
        verb: Verb::Allow,
        network,
        priority: DEFAULT_PRIORITY,
        from,
        to: Sel::Any,
        ether: None,
        proto: None,
        ports: None,
    };
    for i in 0..MAX_GROUPS {
        p.add_rule(pos, &rule(format!("g{i}"), 1, Sel::Group(format!("group{i}")))).unwrap();
    }
    let e = p.add_rule(pos, &rule("one-more".into(), 1, Sel::Group("another".into()))).unwrap_err();
    assert!(e.expected.contains("at most 64 groups"), "{e}");
    p.add_rule(pos, &rule("known".into(), 1, Sel::Group("group3".into()))).unwrap();
    for i in 0..MAX_RULES {
        p.add_rule(pos, &rule(format!("r{i}"), 2, Sel::Any)).unwrap();
    }
    let e = p.add_rule(pos, &rule("r-more".into(), 2, Sel::Any)).unwrap_err();
    assert!(e.expected.contains("at most 4096 rules"), "{e}");
    p.add_rule(pos, &rule("r7".into(), 2, Sel::Mac(MacAddr([2, 0, 0, 0, 0, 1])))).unwrap();
    p.add_rule(pos, &rule("r-other".into(), 3, Sel::Any)).unwrap();
}
