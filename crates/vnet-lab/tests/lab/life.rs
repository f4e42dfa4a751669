//! Cluster mode through its life: a vnetd handed over again and again, and
//! upgraded from the previous release's package, under traffic; and its
//! store failing: etcd stopped during a move, a CNI ADD and a live
//! migration, and a three-member etcd losing its leader under a stream of
//! moves (issue 68).

use super::harness::*;
use std::path::{Path, PathBuf};

/// How long the fault tests stop etcd: longer than every timer in play, so
/// that each operation meets its own failure path while the store is away
/// (the lab's lease, 5 s; `vnetctl move`'s wait for the old host to see the
/// claim, 5 s; an `ipam` request's wait for etcd, 10 s; the session's
/// longest backoff, 2 s). The 30 s adds nothing beyond that but
/// wall-clock time on each pass.
const STORE_DOWN: Duration = Duration::from_secs(12);

/// `dpkg-deb -f DEB Version`.
fn deb_version(deb: &Path) -> String {
    let out = std::process::Command::new("dpkg-deb").arg("-f").arg(deb).arg("Version").output().unwrap();
    assert!(out.status.success(), "dpkg-deb -f {}: {}", deb.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `deb` unpacked (`dpkg-deb -x`) into `dir`: its vnetd.
fn unpacked_vnetd(deb: &Path, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let ok = std::process::Command::new("dpkg-deb").arg("-x").arg(deb).arg(dir).status().unwrap().success();
    assert!(ok, "dpkg-deb -x {}", deb.display());
    dir.join("usr/sbin/vnetd")
}

/// The previous release's package: `target/upgrade/vnet-REV.deb`, REV the
/// revision `scripts/previous-revision` pins, built there by
/// `scripts/previous-package.sh` (which `scripts/test.sh` runs after this
/// tree's package; `VNET_UPGRADE_FROM` names another).
fn previous_package() -> PathBuf {
    if let Ok(p) = std::env::var("VNET_UPGRADE_FROM") {
        return PathBuf::from(p);
    }
    let repo = vnet_lab::bench::repo_dir();
    let rev = std::fs::read_to_string(repo.join("scripts/previous-revision")).unwrap();
    let deb = repo.join(format!("target/upgrade/vnet-{}.deb", rev.trim()));
    assert!(deb.is_file(), "{}: run scripts/previous-package.sh first", deb.display());
    deb
}

/// After hand-overs of host 0's vnetd: once the leases of the vnetds
/// before the last are gone from etcd (each took a lease of its own;
/// theirs run out 5 s after they stopped), every host still sees all `n`,
/// routes every other host's VM to its link, and counts no conflict and no
/// refused transaction.
fn assert_cluster_kept_host_0(lab: &Lab, n: usize) {
    let leases = || {
        let out = lab.etcdctl(&["lease", "list"]).unwrap();
        out.lines()
            .next()
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
            .unwrap_or(usize::MAX)
    };
    let took = wait_until(10.0, "one lease a host left in etcd", || leases() == n);
    eprintln!("the hand-overs' earlier leases gone {took:?} after the last hand-over");
    wait_converged(lab, n, n as u64 - 1);
    for h in 0..n {
        let c = lab.cluster_status(h).unwrap();
        assert_eq!(c["counters"]["transaction_errors"], 0, "host {h}: {c}");
        assert!(c["conflicts"].as_array().is_some_and(Vec::is_empty), "host {h}: {c}");
        for k in (0..n).filter(|&k| k != h) {
            let want = format!("link h{k}");
            assert_eq!(route_to(lab, h, &lab.vm(k, 0).mac), Some(want), "host {h} routes host {k}'s VM");
        }
    }
}

/// A cluster of `hosts` hosts (a VM each) as the Kubernetes manifest
/// runs one (`packaging/kubernetes/vnet.yaml`): etcd over TLS with a user
/// per host, no network key (records unsigned), plain cluster links
/// (`--cluster-link-options "security none"`), which the kernel path
/// carries, and `spec_vnetd` (the vnetd to run; `None`: this tree's). A
/// signed network's links are always encrypted (vnetd makes them so), and
/// an encrypted link is the user path's on either pass.
fn plain_cluster(hosts: usize, vnetd: Option<PathBuf>) -> Lab {
    let mut spec = cluster_spec(hosts, 1, (0..hosts).collect());
    spec.vnetd_args = vec!["--cluster-link-options=security none".into()];
    spec.vnetd = vnetd;
    let mut lab = lab(spec);
    for h in 0..hosts {
        lab.cluster_overrides.push((h, "network-key", None));
        lab.cluster_overrides.push((h, "host-cert", None));
    }
    for h in 0..hosts {
        lab.start_vnetd(h).unwrap();
    }
    println!("{}", lab.check_datapaths().unwrap_or_else(|e| panic!("{e}")));
    wait_converged(&lab, hosts, hosts as u64 - 1);
    for l in json(&lab, 0, "links")["links"].as_array().unwrap() {
        assert!(l["security"].is_null(), "a secured link: {l}");
    }
    lab
}

/// `vnet-cni COMMAND` run as [`Lab::cni`] runs it, on a thread: its exit
/// status and output (JSON on stdout).
fn cni_in_background(
    lab: &Lab,
    h: usize,
    command: &str,
    id: &str,
    netns: &str,
    conf: &serde_json::Value,
) -> std::thread::JoinHandle<std::process::Output> {
    use std::process::Stdio;
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", &lab.hosts[h].ns])
        .arg(vnet_lab::bin("vnet-cni").unwrap())
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", id)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", vnet_lab::cni_path().unwrap())
        .env("CNI_NETNS", netns)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let conf = conf.to_string();
    std::thread::spawn(move || {
        let mut child = cmd.spawn().unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), conf.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    })
}

/// The address allocations in the lab's etcd (keys).
fn ipam_keys(lab: &Lab) -> Vec<String> {
    let out =
        lab.etcdctl(&["get", "--prefix", "--keys-only", &format!("/vnet/{}/ipam/", lab.prefix)]).unwrap();
    out.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect()
}

/// The names of host `h`'s interfaces.
fn iface_names(lab: &Lab, h: usize) -> Vec<String> {
    json(lab, h, "interfaces")["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["name"].as_str().map(str::to_string))
        .collect()
}

/// On both passes, three tests at a time.
mod both {
    use super::*;

    /// Issue 68, the store failing: etcd stops while a VM moves (`vnetctl
    /// move`) and a container is added (CNI ADD, its address from vnetd's
    /// `vnet` IPAM, which etcd keeps unique), and comes back
    /// [`STORE_DOWN`] later. What docs/RELIABILITY.md says happens: the move
    /// fails after 5 s, saying the old host never saw the claim and naming
    /// the store; the new host runs the VM meanwhile, and the claim it
    /// acknowledged reaches every host once etcd is back, without the move
    /// being run again (which then completes). The ADD fails with the
    /// `ipam` request's error once etcd has not answered for 10 s, and
    /// leaves nothing, in vnetd or in etcd (its undo's release is served
    /// when etcd is back); run again, it succeeds. A container added before
    /// the outage keeps its address; a ping runs on throughout and is
    /// answered again once the claim is in.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn etcd_stopped_during_a_move_and_a_cni_add_loses_nothing_acknowledged_and_each_ends_clearly() {
        let mut lab = lab(cluster_spec(3, 1, vec![]));
        wait_converged(&lab, 3, 2);
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        // Acknowledged before the outage: a container on host 2 and its address.
        let conf = |lab: &Lab, h| {
            lab.cni_conf(h, "1.1.0", serde_json::json!({ "type": "vnet", "subnet": "10.89.0.0/24" }))
        };
        let before = lab.add_ns(format!("{}-cb", lab.prefix)).unwrap();
        let r = lab.cni(
            2,
            "ADD",
            "before",
            Some(&format!("/run/netns/{before}")),
            conf(&lab, 2).to_string().as_bytes(),
        );
        let r = r.unwrap();
        assert!(r.ok, "ADD before the outage: {}\n{}", r.out, r.stderr);
        let held = ipam_keys(&lab);
        assert_eq!(held.len(), 1, "{held:?}");
        // 20 s of pings 20 ms apart: they must outlast the outage (STORE_DOWN) and
        // the operations after it, for the tail check (the last second's
        // pings, the store back) to fall after the outage.
        const PINGS: u32 = 1000;
        let ping = in_background(
            &a.ns,
            &["ping", "-n", "-i", "0.02", "-c", &PINGS.to_string(), "-W", "1", &b.ip.to_string()],
        );
        std::thread::sleep(Duration::from_secs(1));

        lab.stop_etcd();
        let down = std::time::Instant::now();
        wait_until(10.0, "every host says the store is down", || {
            (0..3).all(|h| lab.cluster_status(h).unwrap()["store"] == "down")
        });
        let ns = lab.add_ns(format!("{}-cd", lab.prefix)).unwrap();
        let add = cni_in_background(&lab, 0, "ADD", "during", &format!("/run/netns/{ns}"), &conf(&lab, 0));
        let t0 = std::time::Instant::now();
        let (v, out) = lab.relocate_whatever_move_says(1, 0, 2).unwrap();
        let said = String::from_utf8_lossy(&out.stderr).to_string();
        eprintln!("store down: vnetctl move ended after {:?}: {}", t0.elapsed(), said.trim());
        assert!(!out.status.success(), "the move succeeded with the store away:\n{said}");
        assert!(
            said.contains("claim did not reach it") && said.contains("the store unreachable"),
            "the move's error does not say why: {said}"
        );
        // Meanwhile the others keep their last state; the new host has the
        // interface active, its claim not yet in the store.
        let moved = lab.vm(2, v).clone();
        eprintln!("store down: host 2 routes the moved VM's MAC to {:?}", route_to(&lab, 2, &b.mac));
        assert_eq!(route_to(&lab, 0, &b.mac).as_deref(), Some("link h1"), "the last state is kept");
        std::thread::sleep(STORE_DOWN.saturating_sub(down.elapsed()));
        assert!((0..3).all(|h| lab.cluster_status(h).unwrap()["store"] == "down"));
        lab.start_etcd().unwrap();
        let up = std::time::Instant::now();

        // The claim host 2 acknowledged lands, with no move run again.
        let took = wait_until(15.0, "every host routes the moved VM to host 2", || {
            [0, 1].iter().all(|&h| route_to(&lab, h, &b.mac).as_deref() == Some("link h2"))
        });
        eprintln!(
            "store back: the claim made while it was away reached hosts 0 and 1 {took:?} after it returned"
        );
        let add = add.join().unwrap();
        let j: serde_json::Value = serde_json::from_slice(&add.stdout).unwrap_or_default();
        eprintln!("store down: CNI ADD ended {:?} after the store came back: {j}", up.elapsed());
        assert!(!add.status.success(), "the ADD succeeded with the store away: {j}");
        assert!(j["details"].as_str().is_some_and(|m| m.contains("etcd did not answer within 10s")), "{j}");
        let took = wait_until(15.0, "the failed ADD's address released", || ipam_keys(&lab) == held);
        eprintln!("store back: nothing of the failed ADD in etcd {took:?} after it returned");
        assert_eq!(iface_names(&lab, 0), ["vm0"], "the failed ADD left an interface on host 0");
        // Each run again: the move completes (host 1's interface goes), the ADD succeeds.
        let hd = moved.host_dev.clone().unwrap();
        let name = format!("mv{}", &hd[1..]);
        let ep = |h: usize| format!("unix:{}", lab.hosts[h].control.display());
        let hosts = (0..3).map(ep).collect::<Vec<_>>().join(",");
        let dp = lab.spec.datapath.clone().unwrap_or_else(|| "user".into());
        let out = lab
            .vnetctl(
                2,
                &[
                    "move",
                    &b.mac,
                    "to",
                    &ep(2),
                    "hosts",
                    &hosts,
                    "interface",
                    &name,
                    "netdev",
                    &hd,
                    "datapath",
                    &dp,
                ],
            )
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "the move run again: {said}");
        assert!(iface_names(&lab, 1).is_empty(), "host 1 kept the moved VM's interface: {said}");
        let r = lab.cni(
            0,
            "ADD",
            "during",
            Some(&format!("/run/netns/{ns}")),
            conf(&lab, 0).to_string().as_bytes(),
        );
        let r = r.unwrap();
        assert!(r.ok, "the ADD run again: {}\n{}", r.out, r.stderr);
        let now = ipam_keys(&lab);
        assert!(
            now.len() == 2 && held.iter().all(|k| now.contains(k)),
            "the address acknowledged before: {now:?}"
        );

        let out = String::from_utf8_lossy(&ping.join().unwrap().stdout).to_string();
        let r = vnet_lab::PingResult::parse(&out);
        assert_eq!(r.sent, PINGS, "ping output not understood:\n{out}");
        let gap = longest_gap(&out, r.sent);
        eprintln!(
            "etcd stopped during a move: {} of {PINGS} pings lost (20 ms apart), longest gap {gap} (~{} ms)",
            r.sent - r.received,
            gap * 20
        );
        // The tail's positive control: the moved VM was cut from host 0
        // while its claim waited for the store.
        assert!(r.received < r.sent, "no ping lost while the claim waited: {r:?}");
        let got = ping_seqs(&out);
        let tail: Vec<u32> = (PINGS - 50..=PINGS).filter(|s| got.binary_search(s).is_err()).collect();
        assert!(
            tail.is_empty(),
            "pings lost in the last second, the store back: {tail:?} ({r:?}, gap {gap})"
        );
        for h in 0..3 {
            assert!(lab.vnetd_alive(h), "vnetd {h} exited");
            assert_eq!(lab.cluster_status(h).unwrap()["store"], "up");
        }
        assert_ping(&lab, &a, moved.ip, 56);
    }
}

/// On both passes, one test at a time (each says why).
mod both_alone {
    use super::*;

    // Alone: the move right after the leader's kill takes 4.6-4.7 s of
    // `vnetctl move`'s 5 s (a put etcd dropped waits out vnetd's request
    // timeout): a loaded machine could push it over.
    /// Issue 68: a three-member etcd (each member in the lab's switch
    /// namespace, on its own ports) whose leader is killed (SIGKILL) in
    /// the middle of twenty moves of a VM between hosts 1 and 2: every
    /// move lands (`vnetctl move` succeeds, which waits for the old host to
    /// see the claim, and host 0 routes the VM to its new host); each
    /// move's time is reported, the one after the kill above all.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_three_member_etcd_whose_leader_is_killed_under_a_stream_of_moves_lands_every_move() {
        let spec = cluster_spec(3, 1, vec![]);
        let cluster = vnet_lab::Cluster { members: 3, ..spec.cluster.clone().unwrap() };
        let mut lab = lab(Spec { cluster: Some(cluster), ..spec });
        assert_eq!(lab.etcd_url().split(',').count(), 3, "{}", lab.etcd_url());
        wait_converged(&lab, 3, 2);
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        // 10 s of pings 20 ms apart: the twenty moves take about 7 s (their
        // loss is reported, not asserted; the moves' own checks are).
        const PINGS: u32 = 500;
        let ping = in_background(
            &a.ns,
            &["ping", "-n", "-i", "0.02", "-c", &PINGS.to_string(), "-W", "1", &b.ip.to_string()],
        );
        const MOVES: usize = 20;
        const KILL_AT: usize = 6;
        let (mut at, mut v, mut times, mut killed) = (1, 0, Vec::new(), None);
        for k in 0..MOVES {
            if k == KILL_AT {
                let leader = lab.etcd_leader().unwrap();
                lab.kill_etcd_member(leader);
                eprintln!("etcd: member {leader}, the leader, killed (SIGKILL) before move {k}");
                killed = Some(leader);
            }
            let to = 3 - at;
            let t0 = std::time::Instant::now();
            let (nv, out) = lab.relocate_whatever_move_says(at, v, to).unwrap();
            if !out.status.success() {
                let said: Vec<String> = (0..3)
                    .map(|h| {
                        let log = lab.log(h);
                        let tail: Vec<&str> = log.lines().rev().take(8).collect();
                        format!("host {h}: {}\n{}", lab.cluster_status(h).unwrap(), tail.join("\n"))
                    })
                    .collect();
                panic!(
                    "move {k} (host {at} to {to}): {}\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    said.join("\n")
                );
            }
            v = nv;
            let link = format!("link h{to}");
            wait_until(10.0, &format!("move {k}: host 0 routes the VM to host {to}"), || {
                route_to(&lab, 0, &b.mac).as_deref() == Some(link.as_str())
            });
            times.push(t0.elapsed().as_millis());
            if k == KILL_AT {
                // What the new host's session said while the members elected a leader.
                for l in lab.log(to).lines().filter(|l| l.contains("vnetd::cluster")).rev().take(6) {
                    eprintln!("  h{to}: {l}");
                }
            }
            at = to;
        }
        let leader = lab.etcd_leader().unwrap();
        let killed = killed.unwrap();
        assert_ne!(leader, killed, "the killed member still leads");
        let after = times[KILL_AT];
        let most = times.iter().max().copied().unwrap_or(0);
        eprintln!(
            "etcd: {MOVES} moves landed, each (`vnetctl move` to host 0 rerouting) in ms {times:?}; the first after \
             the leader's kill {after} ms; member {leader} leads now"
        );
        let out = String::from_utf8_lossy(&ping.join().unwrap().stdout).to_string();
        let r = vnet_lab::PingResult::parse(&out);
        eprintln!(
            "{MOVES} moves, etcd's leader killed (longest move {most} ms): {} of {} pings lost (20 ms apart), \
             longest gap {}",
            r.sent - r.received,
            r.sent,
            longest_gap(&out, r.sent)
        );
        for h in 0..3 {
            let c = lab.cluster_status(h).unwrap();
            assert_eq!(c["store"], "up", "host {h}: {c}");
            assert_eq!(c["counters"]["transaction_errors"], 0, "host {h}: {c}");
            assert!(c["conflicts"].as_array().is_some_and(Vec::is_empty), "host {h}: {c}");
        }
        assert_ping(&lab, &a, lab.vm(at, v).ip, 56);
        // The check's positive control: with a second member killed (no
        // quorum left) a move does not land, and `vnetctl move` says so.
        let second = (0..3).find(|&i| i != killed && i != leader).unwrap();
        lab.kill_etcd_member(leader);
        let (v, out) = lab.relocate_whatever_move_says(at, v, 3 - at).unwrap();
        let said = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success() && said.contains("claim did not reach it"), "without a quorum: {said}");
        eprintln!("etcd without a quorum (member {second} alone): the move failed: {}", said.trim());
        // Two members back: the claim made meanwhile lands.
        lab.start_etcd_member(leader).unwrap();
        let link = format!("link h{}", 3 - at);
        let took = wait_until(15.0, "the quorum back: host 0 routes the VM to its new host", || {
            route_to(&lab, 0, &b.mac).as_deref() == Some(link.as_str())
        });
        eprintln!("etcd's quorum back: the claim made without it reached host 0 {took:?} later");
        assert_ping(&lab, &a, lab.vm(3 - at, v).ip, 56);
    }

    // Alone: no ping lost at 10 ms on the kernel path (a neighbour's load
    // could delay a hand-over past it).
    /// Issue 68: ten hand-overs of a cluster-mode vnetd (host 0 of three)
    /// under a 10 ms ping and a 200 Mbit/s TCP stream: on the kernel path
    /// no ping lost and no empty 100 ms interval of the stream (the pinned
    /// programs forward while the store's view is listed again; they are
    /// taken over once it is applied); on the user path what the store's
    /// view takes to come back (below). The cluster is the Kubernetes
    /// manifest's ([`plain_cluster`]). Each vnetd takes a lease of its own:
    /// host 0 stays in every view after its predecessors' leases are gone.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn ten_hand_overs_of_a_cluster_mode_vnetd_under_a_10ms_ping_and_a_tcp_stream() {
        let mut lab = plain_cluster(3, None);
        let m = hand_overs_under_traffic(&mut lab, 10, |_, _| {});
        assert_eq!(m.refused.0, 0, "control requests failed during hand-overs: {:?}", m.refused.1);
        let log = lab.log(0);
        if lab.spec.datapath.as_deref() == Some("kernel") {
            assert!(log.contains("took over the previous vnetd's program"), "no take-over:\n{log}");
            assert_eq!(m.lost, 0, "pings lost across cluster-mode hand-overs on the kernel path");
            assert_eq!(m.empty, 0, "the stream stalled 100 ms or more: {:?}", m.intervals);
        } else {
            // Not none, as in static mode: the sockets and rings are handed
            // over, but the links to the other hosts and the routes to their
            // VMs come from the store, after the start, and there is no
            // predecessor's program to forward meanwhile. Measured: 95 of
            // 900 (9-10 a hand-over, longest gap 14), 2 of 90 intervals
            // empty. At most twice that.
            assert!(log.contains("hand-over: took"), "the next vnetd took nothing:\n{log}");
            assert!(m.lost <= 190, "{} pings (10 ms apart) lost over 10 hand-overs", m.lost);
        }
        assert_cluster_kept_host_0(&lab, 3);
        assert!(!lab.dir.join("bpf/h0").exists(), "pins left after the last take-over");
    }

    // Alone: it needs the packages (built in the background meanwhile),
    // and no ping lost at 10 ms on the kernel path.
    /// Issue 68: an upgrade in cluster mode from the previous release's
    /// package (built from the revision `scripts/previous-revision` pins;
    /// its version and its vnetd differ from this tree's) to this tree's
    /// package, under a 10 ms ping and a TCP stream: the three hosts run
    /// the previous vnetd; host 0's hands over to this package's (what the
    /// package's `postinst` asks of the unit), which hands over once more
    /// (the next upgrade), hosts 1 and 2 staying on the previous release (a
    /// cluster mid-upgrade). No ping lost on the kernel path, on the user
    /// path what each cluster-mode hand-over loses there; the mixed cluster
    /// converged, host 0 running the new vnetd.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn an_upgrade_from_the_previous_releases_package_in_cluster_mode_under_a_10ms_ping_and_a_tcp_stream() {
        let (from, to) = (previous_package(), package_deb());
        let (vf, vt) = (deb_version(&from), deb_version(&to));
        assert_ne!(vf, vt, "the previous package's version is this one's");
        // The unpacked packages, removed however the test ends.
        let dir = Scratch::new("vnet-cluster-upgrade");
        let (old, new) = (unpacked_vnetd(&from, &dir.0.join("old")), unpacked_vnetd(&to, &dir.0.join("new")));
        assert_ne!(
            std::fs::read(&old).unwrap(),
            std::fs::read(&new).unwrap(),
            "the two packages' vnetd are the same"
        );
        eprintln!("upgrade: {} ({vf}) -> {} ({vt})", from.display(), to.display());
        let mut lab = plain_cluster(3, Some(old.clone()));
        let m = hand_overs_under_traffic(&mut lab, 2, |lab, k| {
            if k == 0 {
                lab.spec.vnetd = Some(new.clone());
            }
        });
        let log = lab.log(0);
        eprintln!(
            "upgrade in cluster mode, then a hand-over: {} pings lost, {} empty intervals",
            m.lost, m.empty
        );
        if lab.spec.datapath.as_deref() == Some("kernel") {
            assert!(log.contains("took over the previous vnetd's program"), "no take-over:\n{log}");
            assert_eq!(m.lost, 0, "pings lost across the upgrade on the kernel path");
            assert_eq!(m.empty, 0, "the stream stalled 100 ms or more: {:?}", m.intervals);
        } else {
            // As each cluster-mode hand-over on the user path (the
            // hand-over test's 9-10 lost), at most twice that for the two.
            assert!(log.contains("hand-over: took"), "the new vnetd took nothing:\n{log}");
            assert!(m.lost <= 40, "{} pings (10 ms apart) lost over the upgrade and a hand-over", m.lost);
        }
        let exe = |h: usize| std::fs::read_link(format!("/proc/{}/exe", lab.vnetd_pid(h).unwrap())).unwrap();
        assert_eq!(exe(0), new, "host 0 runs this package's vnetd");
        assert_eq!(exe(1), old, "host 1 runs the previous package's vnetd");
        assert_cluster_kept_host_0(&lab, 3);
    }

    // Alone: QEMU guests (TCG), as the other live migrations.
    /// Issue 68: etcd stops, then a QEMU guest on host 1 migrates live to
    /// host 2 (cluster mode, a TAP standby there) under a 20 ms ping and a
    /// paced TCP stream to it from host 0's VM; etcd is back
    /// [`STORE_DOWN`] after it stopped. The migration completes (QEMU's
    /// alone); the destination runs the guest's interface active, its claim
    /// waiting for the store (it routes the MAC nowhere meanwhile: a
    /// migration's claim is the store's to grant), the other hosts keep
    /// their last state (host 1) until the store is back, when the
    /// destination's claim reaches them. Nothing
    /// the guest acknowledged is lost: the stream arrives whole (its md5 on
    /// the destination guest's console); the guest answers again.
    #[test]
    #[ignore = "needs root, network namespaces and qemu-system-x86: run with --ignored"]
    fn etcd_stopped_during_a_live_migration_in_cluster_mode_loses_no_byte_the_guest_acknowledged() {
        let mut spec = cluster_spec(3, 1, vec![]);
        spec.qemu_hosts = vec![1];
        let mut lab = lab(spec);
        wait_converged(&lab, 3, 2);
        let (a, g) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, g.ip, 56);
        let load = MigrationLoad::start(&lab, &a, g.ip);
        lab.stop_etcd();
        let down = std::time::Instant::now();
        wait_until(10.0, "every host says the store is down", || {
            (0..3).all(|h| lab.cluster_status(h).unwrap()["store"] == "down")
        });
        let m = lab.migrate_guest(1, 2).unwrap_or_else(|e| panic!("migration with the store away: {e}"));
        let paused_ms = m.paused_us.map(|us| us.div_ceil(1000)).unwrap_or(m.downtime_ms);
        eprintln!(
            "live migration, store down: the guest paused {paused_ms} ms, total {} ms, {:?} after etcd stopped",
            m.total_ms,
            down.elapsed()
        );
        let moved = lab.vm(2, lab.hosts_vms(2) - 1).clone();
        let i = json(&lab, 2, "interfaces")["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == "vmig")
            .cloned()
            .unwrap();
        assert_eq!(i["state"], "active", "{i}");
        eprintln!("store down: host 2 routes the migrated guest's MAC to {:?}", route_to(&lab, 2, &g.mac));
        assert_eq!(route_to(&lab, 0, &g.mac).as_deref(), Some("link h1"), "the last state is kept");
        std::thread::sleep(STORE_DOWN.saturating_sub(down.elapsed()));
        assert!((0..3).all(|h| lab.cluster_status(h).unwrap()["store"] == "down"));
        lab.start_etcd().unwrap();
        let took = wait_until(15.0, "hosts 0 and 1 route the guest to host 2", || {
            [0, 1].iter().all(|&h| route_to(&lab, h, &g.mac).as_deref() == Some("link h2"))
        });
        eprintln!("store back: the migrated guest's claim reached hosts 0 and 1 {took:?} after it returned");
        let (out, said) = load.check_stream(moved.console.as_deref().unwrap(), || {
            format!("host 2's interfaces: {}", json(&lab, 2, "interfaces"))
        });
        let r = vnet_lab::PingResult::parse(&out);
        eprintln!(
            "live migration, store down: the stream whole (sent bytes, longest blocked send in ms: {}); {} of {} \
             pings lost (20 ms apart), longest gap {}",
            said.trim(),
            r.sent - r.received,
            r.sent,
            longest_gap(&out, r.sent)
        );
        assert_eq!(lab.cluster_status(2).unwrap()["counters"]["macs_claimed"], 2);
        assert!(
            json(&lab, 1, "interfaces")["interfaces"].as_array().unwrap().is_empty(),
            "the source kept it"
        );
        assert_ping(&lab, &a, moved.ip, 56);
    }
}
