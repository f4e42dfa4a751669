//! Every command vnetctl takes, with its usage: one table that `vnetctl
//! --help`, `man vnetctl` (its sections, by heading) and each command's
//! own help (`vnetctl help join`, `vnetctl join --help`, `vnetctl attach
//! -h`) are all made from, so none lists a command another lacks. Help
//! needs no vnetd and writes nothing.
//!
//! The control verbs are those of `vnet_control` (the test below checks
//! each has an entry); their full grammar is vnet.conf(5) and
//! docs/control.md.

/// One command: the words that name it (each word may be `a|b`
/// alternatives), its usage lines (after `vnetctl `), and what it does.
pub struct Entry {
    pub words: &'static [&'static str],
    pub usage: &'static str,
    pub about: &'static str,
}

/// A heading and its commands.
pub struct Group {
    pub heading: &'static str,
    /// What the group's commands need (printed with each command's help).
    pub needs: &'static str,
    pub entries: &'static [Entry],
}

const fn e(words: &'static [&'static str], usage: &'static str, about: &'static str) -> Entry {
    Entry { words, usage, about }
}

const DAEMON: &str =
    "Talks to this host's vnetd: the one running here (vnetd@NAME, its socket /run/vnet/NAME.sock), \
     -n NAME when several run, or --control ENDPOINT.";
const NO_DAEMON: &str = "Needs no vnetd.";

/// Every command, by heading.
pub const GROUPS: &[Group] = &[
    Group {
        heading: "Control commands (to this host's vnetd)",
        needs: DAEMON,
        entries: &[
            e(
                &["show"],
                "show routes|links|interfaces|stats|global|config|metrics|cluster|matrix|policy [json]",
                "What vnetd has (--json or `json`: as JSON; `global`: the daemon-wide counters alone).",
            ),
            e(
                &["show", "drops"],
                "show drops [N]",
                "The last N drops (20 unless told), each with its reason, and the drops by reason.",
            ),
            e(
                &["show", "flows"],
                "show flows [N]",
                "The flow log's last N records (20 unless told; vnetd --flow-log).",
            ),
            e(
                &["monitor"],
                "monitor [drops|flows|all] [reason R] [interface NAME] [link NAME] [mac MAC] [ip IP] [port P] [path user|kernel] [verdict allow|deny] [rule NAME] [count N]",
                "Drops, or the flow log's records (vnetd --flow-log), as they happen, one a line (--json: JSON \
                 lines), on both data paths; Ctrl-C ends.",
            ),
            e(
                &["trace"],
                "trace from VM|MAC|IP [mac MAC] [ip IP] to IP [mac MAC] [icmp|tcp|udp [port P]] [size BYTES] [--network N] [far ENDPOINT] | trace hex HEX [in VM|MAC] [--network N] [far ENDPOINT]",
                "Every decision a frame from a VM (its interface's name, MAC or address; `mac`: a source MAC other than its own) to an address would meet, \
                 in order, sent nowhere: source checks, policy (the rule), neighbour answer, route and priority, link \
                 (kind, security, data path and why), encapsulation and MTU, the verdict; then the far host's part \
                 (cluster mode: computed from the store's view; else `far ENDPOINT` asks that host's vnetd). A \
                 failing step names its drop reason (as `monitor drops`) and the rule, route, link or interface. \
                 --json: as JSON. `--network N`: the network the addresses are in, or a frame from another host \
                 says. `hex HEX`: the frame's bytes (Ethernet header first), coming in by VM `in` (else its source \
                 MAC's); a bad digit or a header cut short is refused at its column. To an IPv6 address the \
                 neighbour step is the solicitation (answered here or flooded).",
            ),
            e(
                &["attach"],
                "attach NAME tap|netdev|vhost-user DEV [mac MAC] [network ID] [group G]... [addresses IP[,IP...]] [standby] [interface options]",
                "Attaches a VM's or container's NIC: an interface made to hold, idempotent (nothing changes if it \
                 runs as declared), with, for a `mac`, its route and the broadcast route; in cluster mode the host \
                 claims the MAC and every host routes it. Options as `interface`.",
            ),
            e(&["detach"], "detach NAME", "The interface and every route to or from it go (none there: no error)."),
            e(
                &["activate"],
                "activate NAME",
                "A standby interface becomes active: routed, claimed, announced (a migration's switch-over).",
            ),
            e(
                &["interface"],
                "interface NAME tap|netdev DEV [mac MAC] [mtu N] [netns NS] [mode notify|poll|adaptive] [queues N] [offload on|off] [datapath user|kernel|auto] [broadcast-limit N] [network ID] [group G]... [addresses IP[,IP...]] [standby]\n\
                 interface NAME vhost-user SOCKET [mac MAC] [mode M] [queues N] [offload on|off] [datapath user|auto] [broadcast-limit N] [network ID] [group G]... [addresses IP[,IP...]] [standby]",
                "Declares an interface (a control line of vnet.conf(5), applied at once).",
            ),
            e(
                &["link"],
                "link NAME udp IP[:PORT] [format raw|vnet] [network ID] [mtu N] [peer-key KEY] [security none|auth|encrypt] [cipher auto|aes-256-gcm|chacha20-poly1305] [nat] [relay KEY]\n\
                 link NAME vxlan IP[:PORT] vni N [mtu N]\n\
                 link NAME tcp IP[:PORT] [tls] [mtu N]\n\
                 link NAME direct DEV [mtu N]",
                "Declares a link to a peer host.",
            ),
            e(
                &["route"],
                "route SRC DST to link NAME|IP | interface NAME|MAC [from any | link NAME|IP | interface NAME|MAC]",
                "Adds a route (`to` stands for `->`; SRC and DST: a MAC or `any`).",
            ),
            e(&["neigh"], "neigh IP MAC [network ID]", "ARP and ND for IP answered at the edge (user path)."),
            e(&["policy"], "policy default allow|deny [network ID]", "A network's policy and its default (docs/POLICY.md)."),
            e(
                &["rule"],
                "rule NAME allow|deny [network ID] [priority N] [from SEL] [to SEL] [ether ipv4|ipv6|arp|0xTYPE] [proto tcp|udp|icmp|icmpv6|N] [port P[-Q]]",
                "A policy rule; SEL: any | mac MAC | group NAME | net PREFIX.",
            ),
            e(&["group"], "group NAME MAC", "MAC is in group NAME (the rules' `group` selectors)."),
            e(
                &["delete|del"],
                "delete route ID | link NAME|IP|IDX | interface NAME | neigh IP [network ID]\n\
                 delete policy [network ID] | rule NAME | group NAME MAC",
                "Removes what the words name.",
            ),
            e(
                &["listen"],
                "listen udp ADDR:PORT [mode M] | listen vxlan ADDR:PORT | listen tcp ADDR:PORT",
                "Where links are received.",
            ),
            e(&["tls"], "tls cert FILE key FILE ca FILE", "This host's certificate chain, key and the peers' CA (PEM)."),
            e(
                &["cluster"],
                "cluster etcd:URL[,URL...] network NAME [host NAME] [advertise ADDR:PORT] [ttl SECS] [etcd-ca FILE] [etcd-user NAME etcd-password-file FILE] [network-key FILE] [host-cert FILE] [link WORDS...]",
                "Cluster mode's settings (docs/CLUSTER.md): taken at start; a running vnetd refuses a change.",
            ),
            e(&["announce"], "announce MAC", "A broadcast RARP from MAC over every link of its network."),
            e(&["save"], "save", "Writes the running configuration over vnetd's --config file, atomically."),
            e(&["reload"], "reload", "Applies the --config file's difference as one transaction (as SIGHUP)."),
            e(&["begin"], "begin", "Starts a transaction (control endpoint only; `apply` does one for a file)."),
            e(&["commit"], "commit", "Applies the transaction's lines, all or none."),
            e(&["abort"], "abort", "Drops the transaction's lines."),
            e(
                &["ipam"],
                "ipam add SUBNET OWNER [range FIRST LAST] | ipam del OWNER",
                "Cluster mode: an address unique across the hosts (the CNI plugin's).",
            ),
            e(&["pod-labels"], "pod-labels NAMESPACE/NAME", "Kubernetes: the pod's labels, as JSON."),
            e(&["add"], "add ...", "A Palacios VNET/P line, accepted verbatim (docs/control.md)."),
            e(&["apply"], "apply FILE", "A file of control lines, applied as one transaction (all or nothing)."),
            e(
                &["move"],
                "move MAC to ENDPOINT [via IP] [hosts ENDPOINT,...] [wait SECS] interface NAME KIND DEV [options]",
                "Relocates a VM: the new host attaches it, every host reroutes its MAC, the old host drops its \
                 interface, the new host announces the MAC (each endpoint named: unix:PATH, tcp: or tls:).",
            ),
        ],
    },
    Group {
        heading: "Keys and certificates (no vnetd needed)",
        needs: NO_DAEMON,
        entries: &[
            e(&["genkey"], "genkey [FILE]", "A host's private key (FILE made 0600); prints its public key."),
            e(&["pubkey"], "pubkey [claim] < KEYFILE", "The public key (or the claim key) of a private key."),
            e(&["netkey"], "netkey FILE", "A network key (0600, made unless FILE exists); prints its public key."),
            e(
                &["sign"],
                "sign NETKEY network N host H public-key K claim-key C addr PREFIX[,...] [groups G[,...]] [days D | not-after SECS]",
                "A host certificate (a year unless told; G: the only groups its host may put VMs in, none if not given).",
            ),
            e(
                &["revoke"],
                "revoke NETKEY network N host H [cert ID]",
                "A revocation of the host (or of one certificate), as KEY VALUE for `etcdctl put`.",
            ),
            e(
                &["policy"],
                "policy NETKEY network N FILE [serial S]",
                "FILE's policy, rule and group lines signed for the network, as KEY VALUE for `etcdctl put` \
                 (serial: the time unless told; hosts take only higher ones).",
            ),
        ],
    },
    Group {
        heading: "A secured cluster (no vnetd needed)",
        needs: NO_DAEMON,
        entries: &[
            e(
                &["network", "init"],
                "network init DIR network NAME etcd IP",
                "The network key, etcd's CA, certificate and config in DIR; etcd's root made and \
                 authentication on before etcd first serves. Then: etcd --config-file DIR/etcd.yml \
                 (docs/QUICKSTART.md: the whole way).",
            ),
            e(
                &["network", "token"],
                "network token DIR HOST [ttl D] [file F]",
                "A join token for HOST alone: used once, expires (1h unless told); printed, or written to F (0600).",
            ),
            e(
                &["join"],
                "join --token-file FILE|- [dir DIR] [wait SECS]",
                "On a host: its key (made here), a signed request, its fingerprint printed; once approved, \
                 its config and vnetd@NAME started (never a token in argv). Without systemd it says the \
                 command that starts vnetd, and exits 0.",
            ),
            e(
                &["network", "approve"],
                "network approve DIR HOST [key FINGERPRINT] [--yes] [replace]",
                "Verifies HOST's request and shows it; signs with the fingerprint pinned or confirmed; \
                 `replace` revokes the certificate of a host of that name.",
            ),
            e(
                &["network", "revoke"],
                "network revoke DIR HOST",
                "Revokes HOST: a signed revocation, its etcd user, records and leases deleted.",
            ),
            e(
                &["network", "setup"],
                "network setup DIR",
                "For a network an older init made: etcd's root and authentication on.",
            ),
            e(
                &["network", "upgrade"],
                "network upgrade DIR",
                "For hosts an older approve made: each host's etcd role exactly its own.",
            ),
        ],
    },
    Group {
        heading: "Kubernetes (in a pod, as its service account)",
        needs: NO_DAEMON,
        entries: &[e(
            &["kube", "daemonset"],
            "kube daemonset NAMESPACE/NAME",
            "present, deleting or absent (vnet's DaemonSet's preStop hook).",
        )],
    },
    Group {
        heading: "Help",
        needs: NO_DAEMON,
        entries: &[e(
            &["help"],
            "help [COMMAND...] | COMMAND... --help",
            "A command's usage (`vnetctl help network approve`, `vnetctl attach --help`).",
        )],
    },
];

/// Exit statuses, for `--help` and the man page.
const EXIT: &str = "Exit status:
  0
      Done (`join`: the host joined; where systemd does not run, it prints the command that starts vnetd).
  1
      vnetd refused the line or the file (the error names the position).
  2
      A command vnetctl runs itself failed (keys, network, join), or its words are wrong.
  3
      No vnetd reached: none runs here, several run (-n NAME picks), or the endpoint does not answer.";

/// What `vnetctl --help` shows after its options (and the man page as
/// sections, one per heading).
pub fn after_help() -> String {
    let mut s = String::new();
    for g in GROUPS {
        s.push_str(g.heading);
        s.push_str(":\n");
        for en in g.entries {
            for u in en.usage.lines() {
                s.push_str(&format!("  {}\n", u.trim()));
            }
            s.push_str(&format!("      {}\n", en.about));
        }
    }
    s.push_str(EXIT);
    s
}

fn word_matches(pattern: &str, word: &str) -> bool {
    pattern.split('|').any(|p| p == word)
}

/// Whether `words` ask for help: `help ...`, or `-h`/`--help` among them.
pub fn asked(words: &[&str]) -> bool {
    words.first() == Some(&"help") || words.iter().any(|w| matches!(*w, "-h" | "--help"))
}

/// The help of the command `words` name (`help` and `-h`/`--help` taken
/// out): the entries whose words all match its first words, the longest
/// such; or, if none, those whose first words are all of `words` (`network
/// --help`: every `network` command). `None`: no command of that name.
pub fn of(words: &[&str]) -> Option<String> {
    let words: Vec<&str> = words.iter().copied().filter(|w| !matches!(*w, "-h" | "--help")).collect();
    let words = match words.as_slice() {
        ["help", rest @ ..] => rest.to_vec(),
        w => w.to_vec(),
    };
    if words.is_empty() {
        return None;
    }
    let all = || GROUPS.iter().flat_map(|g| g.entries.iter().map(move |en| (g, en)));
    let full = |en: &Entry| {
        en.words.len() <= words.len() && en.words.iter().zip(&words).all(|(p, w)| word_matches(p, w))
    };
    let best = all().filter(|(_, en)| full(en)).map(|(_, en)| en.words.len()).max();
    let chosen: Vec<(&Group, &Entry)> = match best {
        Some(n) => all().filter(|(_, en)| full(en) && en.words.len() == n).collect(),
        None => all()
            .filter(|(_, en)| {
                en.words.len() > words.len() && words.iter().zip(en.words).all(|(w, p)| word_matches(p, w))
            })
            .collect(),
    };
    if chosen.is_empty() {
        return None;
    }
    let mut s = String::new();
    for (g, en) in chosen {
        for (i, u) in en.usage.lines().enumerate() {
            let lead = if i == 0 { "usage: " } else { "       " };
            s.push_str(&format!("{lead}vnetctl {}\n", u.trim()));
        }
        s.push_str(&format!("\n{}\n{}\n\n", en.about, g.needs));
    }
    s.push_str("Every command: vnetctl --help; the control lines: vnet.conf(5).\n");
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command word of the control language has an entry (read off
    /// the parser's own list of what it expects first).
    #[test]
    fn every_control_verb_has_its_help() {
        let e = vnet_control::parse("nonsense").unwrap_err().to_string();
        let list = e.split_once('(').and_then(|(_, r)| r.split_once(')')).map(|(l, _)| l).unwrap_or_default();
        let verbs: Vec<&str> = list.split('`').skip(1).step_by(2).collect();
        assert!(verbs.len() >= 20 && verbs.contains(&"attach") && verbs.contains(&"detach"), "{e}");
        let text = after_help();
        for v in verbs {
            let h = of(&[v, "--help"]).unwrap_or_else(|| panic!("no help for `{v}`"));
            assert!(h.contains(&format!("usage: vnetctl {v}")), "{v}: {h}");
            assert!(text.contains(&format!("\n  {v}")), "--help does not list {v}");
        }
    }

    #[test]
    fn a_command_gets_its_own_usage_and_the_longest_match_wins() {
        let h = of(&["network", "approve", "/root/x", "h1", "--help"]).unwrap();
        assert!(h.starts_with("usage: vnetctl network approve DIR HOST"), "{h}");
        assert!(!h.contains("network token"), "{h}");
        let h = of(&["help", "join"]).unwrap();
        assert!(h.starts_with("usage: vnetctl join --token-file") && h.contains(NO_DAEMON), "{h}");
        let h = of(&["network", "-h"]).unwrap();
        for sub in ["init", "token", "approve", "revoke", "setup", "upgrade"] {
            assert!(h.contains(&format!("usage: vnetctl network {sub}")), "{sub}: {h}");
        }
        // `policy` is both a control line and a key command: both shown.
        let h = of(&["policy", "--help"]).unwrap();
        assert!(h.contains("policy default allow|deny") && h.contains("policy NETKEY"), "{h}");
        assert!(of(&["attach", "-h"]).unwrap().contains(DAEMON));
        assert!(of(&["del", "--help"]).unwrap().contains("usage: vnetctl delete route"));
        assert_eq!(of(&["frobnicate", "--help"]), None);
        assert_eq!(of(&["help"]), None);
        assert!(asked(&["help"]) && asked(&["join", "-h"]) && !asked(&["show", "links"]));
    }
}
