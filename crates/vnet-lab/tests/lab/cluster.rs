//! Cluster mode on etcd: hosts joining and leaving, signed records, revocation, expiry, credentials, relocation, NATs, IPv6, etcd's outages.

use super::harness::*;

/// On both passes (every vnetd interface on the user path, then on the kernel path), two tests at a time.
mod both {
    use super::*;

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_signed_record_colliding_with_a_static_link_is_quarantined_and_a_new_host_still_links() {
        // Issue 44, finding 2: host 1's (signed) record at an address a static
        // link of host 0 reaches made host 0's whole view fail, retried forever,
        // and nothing else converged there.
        let mut lab = lab(cluster_spec(3, 0, vec![2]));
        wait_converged(&lab, 2, 0);
        lab.stop_vnetd(0).unwrap();
        let ip1 = lab.hosts[1].underlay_ip;
        let conf = std::fs::read_to_string(&lab.hosts[0].config).unwrap();
        std::fs::write(&lab.hosts[0].config, format!("{conf}link st udp {ip1}:9000\n")).unwrap();
        lab.start_vnetd(0).unwrap();
        wait_until(10.0, "host 0 quarantines host 1's record", || {
            lab.cluster_status(0).unwrap()["quarantined"].as_array().is_some_and(|q| {
                q.iter()
                    .any(|e| e["key"] == "host h1" && e["why"].as_str().unwrap_or("").contains("link `st`"))
            })
        });
        let link = |lab: &Lab, name: &str| {
            json(lab, 0, "links")["links"].as_array().unwrap().iter().find(|l| l["name"] == name).cloned()
        };
        assert_eq!(
            link(&lab, "st").unwrap()["remote"],
            format!("{ip1}:9000"),
            "the static link stays as declared"
        );
        assert!(link(&lab, "h1").is_none());
        // A new host: linked at once, the refused record notwithstanding.
        lab.start_vnetd(2).unwrap();
        // Measured: 88 ms; 1 s is the issue's bound.
        let took = wait_until(1.0, "host 0 links the new host 2", || link(&lab, "h2").is_some());
        eprintln!("a new host linked {took:?} after its vnetd answered, beside a quarantined record");
        let c = lab.cluster_status(0).unwrap();
        assert_eq!(c["counters"]["transaction_errors"], 0, "{c}");
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_moved_vm_stays_moved_across_a_restart_of_either_host_cluster_mode() {
        a_moved_vm_stays_moved_across_restarts(true);
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn cluster_survives_etcd_stopped_for_thirty_seconds_and_converges_on_its_return() {
        let mut lab = lab(cluster_spec(3, 1, vec![]));
        wait_converged(&lab, 3, 2);
        let (a, b, c) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone(), lab.vm(2, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        assert_ping(&lab, &a, c.ip, 56);
        // 20 ms pings for the whole outage and a while after.
        const PINGS: u32 = 2000;
        let (count, bip) = (PINGS.to_string(), b.ip.to_string());
        let ping = in_background(&a.ns, &["ping", "-n", "-q", "-i", "0.02", "-c", &count, "-W", "1", &bip]);
        std::thread::sleep(Duration::from_secs(2));
        lab.stop_etcd();
        wait_until(10.0, "every host says the store is down", || {
            (0..3).all(|h| lab.cluster_status(h).unwrap()["store"] == "down")
        });
        // Meanwhile: host 2's VM goes, host 1 gets a new one.
        delete_interface(&lab, 2, "vm0");
        let v = lab.add_vm(1).unwrap();
        let fresh = lab.vm(1, v).clone();
        let took = wait_until(1.0, "a new VM is routed locally while the store is away", || {
            route_to(&lab, 1, &fresh.mac).is_some_and(|t| t.starts_with("interface "))
        });
        eprintln!("cluster: with etcd away, a new VM was routed locally {took:?} after it was declared");
        std::thread::sleep(Duration::from_secs(28));
        let text = lab.control(0, "show cluster").unwrap().body;
        assert!(text.contains("store down"), "{text}");
        assert_eq!(route_to(&lab, 0, &c.mac).as_deref(), Some("link h2"), "the last state is kept");
        let m = lab.control(0, "show metrics").unwrap().body;
        assert!(m.contains("vnet_cluster_store_up 0\n"), "{m}");
        lab.start_etcd().unwrap();
        let took = wait_until(15.0, "the change made meanwhile converges", || {
            route_to(&lab, 0, &fresh.mac).as_deref() == Some("link h1") && route_to(&lab, 0, &c.mac).is_none()
        });
        eprintln!("cluster: etcd back; the change made while it was away converged on host 0 after {took:?}");
        let ping = ping.join().unwrap();
        let r = vnet_lab::PingResult::parse(&String::from_utf8_lossy(&ping.stdout));
        eprintln!("cluster: {} of {} pings lost across a 30 s etcd outage", r.sent - r.received, r.sent);
        assert_eq!(r.sent, PINGS);
        assert_eq!(r.received, r.sent, "pings lost across the outage: {r:?}");
        for h in 0..3 {
            assert!(lab.vnetd_alive(h), "vnetd {h} exited");
            assert_eq!(lab.cluster_status(h).unwrap()["store"], "up");
        }
        assert_ping(&lab, &a, fresh.ip, 56);
    }

    /// Issue 66, acceptance 3: `vnetctl network revoke DIR h2` (the
    /// admin's command, on the lab's etcd; h2's etcd user made as `network
    /// approve` makes it) takes host 2 out: every other host drops it
    /// within a second and routes its VM nowhere, and its store session is
    /// refused. Restarting it changes nothing, nor does restarting a live
    /// host (host 0: it lists the network anew). The positive control: host
    /// 0, not revoked, restarted, is linked and routed again by host 1.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_host_taken_out_by_network_revoke_stays_out_when_it_and_a_live_host_restart() {
        let mut lab = lab(cluster_spec(3, 1, vec![2]));
        let user = lab.admit_as_approve_does(2).unwrap();
        lab.start_vnetd(2).unwrap();
        wait_converged(&lab, 3, 2);
        let (a, b, c) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone(), lab.vm(2, 0).clone());
        assert_ping(&lab, &a, c.ip, 56);
        let p = format!("/vnet/{}", lab.prefix);
        let as_h2 = |lab: &Lab| {
            let o = lab.etcdctl_as(2, &["get", &format!("{p}/hosts/h2")]).unwrap();
            (
                o.status.success(),
                format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
            )
        };
        assert!(as_h2(&lab).0, "h2's own user reads its record (control): {}", as_h2(&lab).1);
        let admin = lab.admin_dir().unwrap();
        let vnetctl = vnet_lab::bin("vnetctl").unwrap();
        let args = [vnetctl.to_str().unwrap(), "network", "revoke", admin.to_str().unwrap(), "h2"];
        let t0 = std::time::Instant::now();
        let out = lab.ns_output(lab.switch_ns().unwrap(), &args).unwrap();
        let said =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && said.contains(&user), "network revoke h2: {said}");
        eprintln!("network revoke: {} ({:?})", said.trim(), t0.elapsed());
        let cut = |lab: &Lab, h: usize| {
            !link_names(lab, h).contains(&"h2".into()) && route_to(lab, h, &c.mac).is_none()
        };
        let took = wait_until(1.0, "hosts 0 and 1 drop host 2 and its VM", || cut(&lab, 0) && cut(&lab, 1));
        eprintln!("network revoke: host 2 cut by every host {took:?} after the command returned");
        let (ok, said) = as_h2(&lab);
        assert!(!ok && said.contains("authentication failed"), "h2's user after the revoke: {said}");
        let took = wait_until(15.0, "host 2's store session is refused", || {
            lab.cluster_status(2).unwrap()["store"] != "up"
        });
        eprintln!("network revoke: host 2's store session ended {took:?} later");
        let gone = lab.etcdctl(&["get", "--prefix", "--keys-only", &format!("{p}/")]).unwrap();
        let (record, claims) = (format!("{p}/hosts/h2"), format!("{p}/claims/h2/"));
        assert!(!gone.contains(&record) && !gone.contains(&claims), "h2's keys: {gone}");

        // Host 2 restarts: refused by etcd (its user is gone), it writes nothing.
        lab.stop_vnetd(2).unwrap();
        lab.start_vnetd(2).unwrap();
        wait_until(10.0, "the restarted host 2 is refused by etcd", || {
            let s = lab.cluster_status(2).unwrap();
            s["store"] == "failed" && s["last_error"].as_str().unwrap_or_default().contains(&user)
        });
        eprintln!(
            "network revoke: the restarted host 2 says: {}",
            lab.cluster_status(2).unwrap()["last_error"]
        );
        // A live host restarts (it lists the network anew), then the control.
        lab.stop_vnetd(0).unwrap();
        lab.start_vnetd(0).unwrap();
        wait_until(10.0, "host 0, restarted, and host 1 link and route each other again", || {
            link_names(&lab, 0).contains(&"h1".into())
                && link_names(&lab, 1).contains(&"h0".into())
                && route_to(&lab, 0, &b.mac).is_some()
                && route_to(&lab, 1, &a.mac).is_some()
        });
        for h in [0, 1] {
            assert!(cut(&lab, h), "host {h} links or routes the revoked host 2 after the restarts");
            let s = lab.cluster_status(h).unwrap();
            assert!(!s["hosts"].to_string().contains("\"h2\""), "host {h}: {s}");
        }
        let gone = lab.etcdctl(&["get", "--prefix", "--keys-only", &format!("{p}/")]).unwrap();
        let (record, claims) = (format!("{p}/hosts/h2"), format!("{p}/claims/h2/"));
        assert!(!gone.contains(&record) && !gone.contains(&claims), "h2's keys: {gone}");
        assert_ping(&lab, &a, b.ip, 56);
        assert_no_ping(&lab, &a, c.ip);
    }

    #[test]
    #[ignore = "needs root, network namespaces and etcd: run with --ignored"]
    fn two_hosts_joined_by_token_have_their_own_etcd_users_and_neither_writes_the_others_keys() {
        // Issue 67, acceptance 4, the store's part (the Kubernetes lab's
        // `k8s::by_hand::each_node_joins_with_its_own_etcd_user_...` does
        // it for nodes): hosts 0 and 1 join as docs/QUICKSTART.md says (a
        // token each, `vnetctl join`, the admin's `approve` of the printed
        // fingerprint; the admin's machine is host 0), nothing granted by
        // hand. Each then holds the login its vnetd would use.
        use crate::onboarding::{succeeded, text, Onboard};
        let o = Onboard::up();
        let mut logins = Vec::new();
        for (host, ns) in [("h0", o.admin.clone()), ("h1", o.host.clone())] {
            let (token, _) = o.token(host, &[]);
            let (fp, joining) = o.join_in(&ns, &token, host, "60");
            o.request(host);
            succeeded(&o.approve(host, &["key", &fp]), &format!("approve {host}"));
            succeeded(&joining.join().unwrap(), &format!("{host}'s join"));
            logins.push(o.joined_login(host));
        }
        assert_eq!(logins[0].0, "vnet/lab/h0");
        assert_eq!(logins[1].0, "vnet/lab/h1");
        assert_ne!(logins[0].0, logins[1].0, "each host its own etcd user");
        let put = |login: &(String, String), key: &str| {
            let out = o.etcdctl(Some(login), &["put", key, "probe"], None);
            (out.status.success(), text(&out))
        };
        for (me, other) in [(0, 1), (1, 0)] {
            // Positive control: a host's login writes its own key.
            let (ok, said) = put(&logins[me], &format!("/vnet/lab/ipam/h{me}/probe"));
            assert!(ok, "h{me} writes its own key: {said}");
            for key in [
                format!("/vnet/lab/ipam/h{other}/probe"),
                format!("/vnet/lab/hosts/h{other}"),
                format!("/vnet/lab/claims/h{other}/52:54:00:00:00:01"),
            ] {
                let (ok, said) = put(&logins[me], &key);
                assert!(!ok && said.contains("permission denied"), "h{me} put {key}: {said}");
                eprintln!("cluster: {}, put {key}: {}", logins[me].0, said.lines().last().unwrap_or(""));
            }
        }
        // Positive control: etcd's root writes either host's key.
        let (ok, said) = put(&o.root(), "/vnet/lab/ipam/h1/probe");
        assert!(ok, "root writes h1's key: {said}");
    }
}

/// On both passes, one test at a time (each says why).
mod both_alone {
    use super::*;

    // Alone: a bound a neighbour could break (a killed host gone from every
    // link within its 5 s TTL: 3.25-3.95 s measured three tests at a time).
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn cluster_of_five_hosts_from_etcd_alone_a_sixth_joins_and_a_killed_host_leaves_within_its_ttl() {
        let mut lab = lab(cluster_spec(6, 2, vec![5]));
        for h in 0..6 {
            let conf = std::fs::read_to_string(&lab.hosts[h].config).unwrap();
            assert!(
                !conf.lines().any(|l| l.starts_with("link") || l.starts_with("route")),
                "host {h}'s config has peer or route lines:\n{conf}"
            );
        }
        // Five hosts, two VMs each: every host links to the four others and routes their eight MACs.
        let took = wait_converged(&lab, 5, 8);
        eprintln!("cluster: 5 hosts converged {took:?} after the last vnetd answered");
        let vms: Vec<Vm> = (0..5).flat_map(|h| lab.hosts[h].vms.clone()).collect();
        let pairs: Vec<(Vm, Ipv4Addr)> =
            vms.iter().flat_map(|a| vms.iter().filter(|b| b.ip != a.ip).map(|b| (a.clone(), b.ip))).collect();
        assert_eq!(pairs.len(), 90);
        // Converged is linked and routed; a secured link carries frames
        // once its handshake is done (before, dropped as no_session: a
        // first ping lost, seen once): waited for.
        let took = wait_until(10.0, "every link of the five hosts established", || {
            (0..5).all(|h| {
                json(&lab, h, "links")["links"].as_array().unwrap().iter().all(|l| l["established"] == true)
            })
        });
        eprintln!("cluster: every link established {took:?} after convergence");
        let bad = ping_pairs(&pairs);
        assert!(bad.is_empty(), "pairs that did not ping 3/3:\n{}", bad.join("\n"));
        let status = json(&lab, 0, "cluster");
        assert!(status["cluster"]["revision"].as_u64().unwrap() > 0, "{status}");
        let text = lab.control(0, "show cluster").unwrap().body;
        assert!(text.contains("store up") && text.contains("hosts 5: h0 h1 h2 h3 h4"), "{text}");
        let metrics = lab.control(0, "show metrics").unwrap().body;
        assert!(metrics.contains("vnet_cluster_store_up 1\n") && metrics.contains("vnet_cluster_hosts 5\n"));
        // The secured cluster: every link encrypted and established, etcd
        // reached over TLS, and a host's etcd user confined to its network.
        for h in 0..5 {
            for l in json(&lab, h, "links")["links"].as_array().unwrap() {
                assert!(l["security"] == "encrypt" && l["established"] == true, "host {h}: {l}");
            }
        }
        assert!(text.contains("https://"), "{text}");
        let own =
            lab.etcdctl_as(0, &["get", "--prefix", "--keys-only", &format!("/vnet/{}/hosts/", lab.prefix)]);
        let own = own.unwrap();
        let text = String::from_utf8_lossy(&own.stdout);
        assert!(own.status.success() && text.contains("/hosts/h4"), "{own:?}");
        let e = lab.etcdctl_as(0, &["put", "/vnet/another-network/hosts/x", "{}"]).unwrap();
        let said = String::from_utf8_lossy(&e.stderr);
        assert!(!e.status.success() && said.contains("permission denied"), "{e:?}");

        // A sixth host joins; nobody else is told anything.
        let t0 = std::time::Instant::now();
        lab.start_vnetd(5).unwrap();
        wait_until(10.0, "the five see the sixth", || {
            (0..5).all(|h| link_names(&lab, h).contains(&"h5".to_string()))
        });
        eprintln!("cluster: a sixth host is linked from all five {:?} after its vnetd started", t0.elapsed());
        let (new, old) = (lab.vm(5, 1).clone(), lab.vm(0, 0).clone());
        // Its links are secured: until a link's handshake is done, frames on
        // it are dropped (counted as no_session), so the pings wait for the
        // sessions, and for the routes to its VM, not only for the links.
        wait_until(10.0, "the sixth's links established and its VM routed", || {
            let established = |h: usize, peer: Option<&str>| {
                json(&lab, h, "links")["links"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|l| peer.is_none_or(|p| l["name"] == p))
                    .all(|l| l["established"] == true)
            };
            (0..5).all(|h| established(h, Some("h5")) && route_to(&lab, h, &new.mac).is_some())
                && established(5, None)
        });
        eprintln!(
            "cluster: the sixth host's sessions established {:?} after its vnetd started",
            t0.elapsed()
        );
        let bad = ping_pairs(&[(new.clone(), old.ip), (old.clone(), new.ip), (lab.vm(3, 1).clone(), new.ip)]);
        assert!(bad.is_empty(), "{}", bad.join("\n"));

        // kill -9: the host's lease runs out and every other host drops it.
        let gone_mac = lab.vm(2, 0).mac.clone();
        lab.kill_vnetd(2).unwrap();
        let took = wait_until(5.0 + 3.0, "the killed host leaves the others' links", || {
            [0, 1, 3, 4, 5].iter().all(|&h| !link_names(&lab, h).contains(&"h2".to_string()))
        });
        eprintln!(
            "cluster: a host killed with kill -9 left every other host's links after {took:?} (TTL 5 s)"
        );
        assert!(took <= Duration::from_secs(5), "{took:?} for a 5 s TTL");
        for h in [0, 1, 3, 4, 5] {
            assert_eq!(route_to(&lab, h, &gone_mac), None, "host {h} still routes the dead host's VM");
            assert!(lab.vnetd_alive(h));
        }
        let bad = ping_pairs(&[(old.clone(), new.ip), (lab.vm(4, 0).clone(), lab.vm(1, 1).ip)]);
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    // Alone: a bound a neighbour could break (lost 10 ms pings, adaptive polling, a timed map update).
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn cluster_relocation_under_a_10ms_ping_and_a_tcp_stream_loses_under_100ms() {
        let mut lab = lab(cluster_spec(3, 1, vec![]));
        wait_converged(&lab, 3, 2);
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        const PINGS: u32 = 500;
        let (out, _, v) = relocate_under_traffic(&mut lab, 10, PINGS, |lab, _| {
            let seen = wait_until(5.0, "host 0 routes the VM to its new host", || {
                route_to(lab, 0, &b.mac).as_deref() == Some("link h2")
            });
            eprintln!("cluster relocation: host 0 rerouted {seen:?} after `vnetctl move` returned");
        });
        let moved = lab.vm(2, v).clone();
        let (r, _) = ping_gap("cluster relocation", &out, PINGS);
        // Measured: 3 lost (30 ms) on the user path. At most 6, as for the
        // IPv6 cluster: twice the claim's trip through etcd's watch.
        assert!(r.sent - r.received <= 6, "{} pings lost (10 ms apart): {r:?}", r.sent - r.received);
        // The old host gave the MAC up, the new one announced it.
        assert_eq!(route_to(&lab, 1, &b.mac).as_deref(), Some("link h2"));
        assert_eq!(lab.cluster_status(2).unwrap()["counters"]["announces"], 1);
        assert_ping(&lab, &a, moved.ip, 56);
    }

    // Alone: a bound a neighbour could break (lost 10 ms pings, adaptive polling, a timed map update).
    /// Issue 31: a cluster whose etcd and hosts are on an IPv6-only underlay:
    /// the hosts' records carry IPv6 addresses, they converge, their VMs talk,
    /// and a relocation under a 10 ms ping loses under 100 ms, on either path.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_cluster_on_an_ipv6_only_underlay_converges_and_relocates_a_vm_under_100ms() {
        let mut lab = lab(Spec { ipv6_underlay: true, vm_mtu: V6_VM_MTU, ..cluster_spec(3, 1, vec![]) });
        assert!(lab.etcd_url().starts_with("https://[fd00:77::fa]:"), "{}", lab.etcd_url());
        wait_converged(&lab, 3, 2);
        let records = lab.etcdctl(&["get", "--prefix", "/vnet/"]).unwrap();
        assert!(records.contains("[fd00:77::2]:9000"), "host 1's record has no IPv6 address:\n{records}");
        for h in 0..3 {
            assert_ipv6_only(&lab, h);
        }
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        assert_ping(&lab, &a, b.ip, V6_VM_MTU - 28);
        const PINGS: u32 = 300;
        let (out, _, v) = relocate_under_traffic(&mut lab, 10, PINGS, |lab, _| {
            wait_until(5.0, "host 0 routes the VM to its new host", || {
                route_to(lab, 0, &b.mac).as_deref() == Some("link h2")
            });
        });
        let (r, _) = ping_gap("IPv6 cluster relocation", &out, PINGS);
        // Measured: 4 lost (40 ms: the new host's claim reaching the others
        // through etcd's watch). At most 6: half as much again; the old bound
        // (under 10) let a relocation that waited for one more round pass.
        assert!(r.sent - r.received <= 6, "{} pings lost (10 ms apart): {r:?}", r.sent - r.received);
        assert_ping(&lab, &a, lab.vm(2, v).ip, 56);
    }
}

/// On the user pass only: their traffic never takes the kernel path (secured, TCP and TLS links), they are about the user path itself, or they test no data path.
mod user {
    use super::*;

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn cluster_records_a_stranger_writes_to_etcd_change_nothing_but_a_counter() {
        // Findings 1 and 3 of the security review: a host record whose key
        // carries control lines, and records that once stopped every host
        // converging (a duplicate address, an unusable address, a key that is
        // not base64), each put into the real etcd as any client could.
        // An open cluster (no network key): records are taken on their
        // fields alone, so every check but the signature's is on trial.
        let mut spec = cluster_spec(2, 1, vec![]);
        spec.cluster.as_mut().unwrap().open = true;
        let lab = lab(spec);
        wait_converged(&lab, 2, 1);
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        let hosts = format!("/vnet/{}/hosts", lab.prefix);
        let h1 = lab.cluster_status(0).unwrap();
        let key = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        let injected = format!(
            r#"{{"addr":"10.77.0.66:9000","public_key":"{key}\nlink spy udp 10.77.0.66:9000\nroute any any -> link spy\ninterface pbinj tap pbinj0"}}"#
        );
        lab.etcd_put(&format!("{hosts}/x"), Some(&injected)).unwrap();
        lab.etcd_put(&format!("{hosts}/dup"), Some(r#"{"addr":"10.77.0.2:9000"}"#)).unwrap();
        lab.etcd_put(&format!("{hosts}/zero"), Some(r#"{"addr":"0.0.0.0:0"}"#)).unwrap();
        lab.etcd_put(
            &format!("{hosts}/junk"),
            Some(r#"{"addr":"10.77.0.67:9000","public_key":"not base64"}"#),
        )
        .unwrap();
        // A good host joins after them: it still applies.
        lab.etcd_put(&format!("{hosts}/late"), Some(r#"{"addr":"10.77.0.68:9000"}"#)).unwrap();
        wait_until(5.0, "both hosts quarantine the four and link the late one", || {
            (0..2).all(|h| {
                let c = lab.cluster_status(h).unwrap();
                c["quarantined"].as_array().map_or(0, Vec::len) == 4
                    && link_names(&lab, h).contains(&"late".into())
            })
        });
        for h in 0..2 {
            let c = lab.cluster_status(h).unwrap();
            assert_eq!(c["counters"]["transaction_errors"], h1["counters"]["transaction_errors"], "{c}");
            let links = link_names(&lab, h);
            assert!(
                !links.iter().any(|l| l == "spy" || l == "x" || l == "dup" || l == "zero" || l == "junk"),
                "{links:?}"
            );
            let ifaces = json(&lab, h, "interfaces").to_string();
            assert!(!ifaces.contains("pbinj"), "host {h} declared the injected interface: {ifaces}");
            let why = c["quarantined"].to_string();
            assert!(
                why.contains("not a key") && why.contains("already host") && why.contains("not a unicast"),
                "{why}"
            );
            let m = lab.control(h, "show metrics").unwrap().body;
            assert!(m.contains("vnet_cluster_quarantined_records 4\n"), "{m}");
        }
        let out = lab.ns_output(&lab.hosts[0].ns, &["ip", "link", "show", "pbinj0"]).unwrap();
        assert!(!out.status.success(), "a TAP was made from a record");
        assert_ping(&lab, &a, b.ip, 56);
        // Deleted, they leave quarantine; the late host's link goes with its record.
        for k in ["x", "dup", "zero", "junk", "late"] {
            lab.etcd_put(&format!("{hosts}/{k}"), None).unwrap();
        }
        wait_until(5.0, "quarantine empties", || {
            (0..2).all(|h| {
                lab.cluster_status(h).unwrap()["quarantined"].as_array().is_some_and(Vec::is_empty)
                    && !link_names(&lab, h).contains(&"late".into())
            })
        });
        assert_ping(&lab, &b, a.ip, 56);
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_forged_claim_or_host_record_without_the_network_keys_signature_redirects_nothing() {
        // Finding 2 of the security review: one `put` of a MAC record naming
        // another host made the real owner withdraw its VM's route (pings 2/2
        // to 0/3); rewriting a host record re-pointed every link to it. In a
        // signed network (the lab's default cluster) both are ignored, even
        // written by etcd's root.
        let lab = lab(cluster_spec(3, 1, vec![]));
        wait_converged(&lab, 3, 2);
        let (a, b, c) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone(), lab.vm(2, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        let (claims, hosts) = (format!("/vnet/{}/claims", lab.prefix), format!("/vnet/{}/hosts", lab.prefix));
        let before: Vec<_> =
            (0..3).map(|h| lab.cluster_status(h).unwrap()["counters"]["bad_records"].clone()).collect();
        // B's MAC claimed for host 0, unsigned, then for host 2 with its real
        // claim signature lifted from C's record (it covers another MAC),
        // each under the named host's key (etcd's root writes anywhere).
        let c_claim = lab.etcdctl(&["get", "--print-value-only", &format!("{claims}/h2/{}", c.mac)]).unwrap();
        let mut lifted: serde_json::Value = serde_json::from_str(c_claim.trim()).unwrap();
        // A pings B every 10 ms while the forgeries land: none may cost a ping.
        const PINGS: u32 = 300;
        let ping = in_background(
            &a.ns,
            &["ping", "-n", "-i", "0.01", "-c", &PINGS.to_string(), "-W", "1", &b.ip.to_string()],
        );
        std::thread::sleep(Duration::from_millis(300));
        lab.etcd_put(&format!("{claims}/h0/{}", b.mac), Some(r#"{"host":"h0","iface":"vm0"}"#)).unwrap();
        lifted["at_ms"] = serde_json::json!(lifted["at_ms"].as_u64().unwrap() + 60_000);
        lab.etcd_put(&format!("{claims}/h2/{}", b.mac), Some(&lifted.to_string())).unwrap();
        // B's host record re-pointed to an address of the attacker's, with
        // the attacker's key and no certificate; then with h0's certificate.
        let attacker = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        let h0_cert = std::fs::read_to_string(lab.dir.join("h0.cert")).unwrap();
        lab.etcd_put(
            &format!("{hosts}/h1"),
            Some(&format!(r#"{{"addr":"10.77.0.66:9000","public_key":"{attacker}"}}"#)),
        )
        .unwrap();
        lab.etcd_put(
            &format!("{hosts}/h1"),
            Some(&format!(
                r#"{{"addr":"10.77.0.66:9000","public_key":"{attacker}","cert":"{}"}}"#,
                h0_cert.trim()
            )),
        )
        .unwrap();
        wait_until(5.0, "every host counts the four forgeries", || {
            (0..3).all(|h| {
                let n = lab.cluster_status(h).unwrap()["counters"]["bad_records"].as_u64().unwrap();
                n >= before[h].as_u64().unwrap() + 4
            })
        });
        // Host 1 put its record back; nobody's link to it moved; B's MAC is
        // still routed to host 1 and the VMs still talk.
        wait_until(5.0, "host 1 restores its record", || {
            lab.cluster_status(1).unwrap()["counters"]["records_restored"].as_u64().unwrap() >= 1
        });
        for h in [0, 2] {
            assert_eq!(route_to(&lab, h, &b.mac).as_deref(), Some("link h1"), "host {h}");
            let links = json(&lab, h, "links").to_string();
            assert!(!links.contains("10.77.0.66") && !links.contains(attacker), "host {h}: {links}");
        }
        let local = json(&lab, 1, "routes").to_string();
        assert!(local.contains(&b.mac), "host 1 withdrew its own VM's route: {local}");
        let out = String::from_utf8_lossy(&ping.join().unwrap().stdout).to_string();
        let r = vnet_lab::PingResult::parse(&out);
        assert_eq!((r.sent, r.received), (PINGS, PINGS), "pings while the forgeries landed:\n{out}");
        assert_ping(&lab, &a, b.ip, 56);
        assert_ping(&lab, &c, b.ip, 56);
        // Host 1's own claim stayed (the forgeries are under other keys);
        // deleted, it comes back at once, and the others route B's VM to
        // host 1 again.
        let claim = |lab: &Lab| {
            lab.etcdctl(&["get", "--print-value-only", &format!("{claims}/h1/{}", b.mac)]).unwrap()
        };
        wait_until(5.0, "host 1's own claim is in the store", || claim(&lab).contains(r#""host":"h1""#));
        lab.etcd_put(&format!("{claims}/h1/{}", b.mac), None).unwrap();
        let took = wait_until(5.0, "the deleted claim is put back and routed", || {
            claim(&lab).contains(r#""host":"h1""#)
                && [0, 2].iter().all(|&h| route_to(&lab, h, &b.mac).as_deref() == Some("link h1"))
        });
        eprintln!("cluster: a claim deleted by another writer was back and routed everywhere after {took:?}");
        assert_ping(&lab, &a, b.ip, 56);
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_mac_defined_again_on_another_host_moves_nothing_in_another_network_and_is_a_conflict_in_the_same() {
        // Issue 44, finding 5: a claim carried no network and the newest won.
        // A second interface with VM A's MAC, on host 1, in network 8 took A's
        // traffic away from host 0 (whose cluster links carry network 0); in
        // network 0 it did the same, taken as a migration never undone.
        let lab = lab(cluster_spec(3, 1, vec![]));
        wait_converged(&lab, 3, 2);
        let (a, c) = (lab.vm(0, 0).clone(), lab.vm(2, 0).clone());
        assert_ping(&lab, &c, a.ip, 56);
        let routed_to_h0 = |lab: &Lab| {
            route_to(lab, 1, &a.mac).as_deref() == Some("link h0")
                && route_to(lab, 2, &a.mac).as_deref() == Some("link h0")
                && route_to(lab, 0, &a.mac).is_some_and(|t| t.starts_with("interface "))
        };
        let ok = |r: vnet_lab::Reply| r.result.unwrap_or_else(|e| panic!("{e}"));
        // A TAP interface on host 1 with A's MAC, in `network`: a typed request.
        let declare = |name: &str, network: u32| {
            use vnet_control::request::{Dev, DevName, Interface, Name, Request};
            let mut i = Interface::new(
                Name::new(name).unwrap(),
                Dev::Tap(DevName::new(&format!("{name}t")).unwrap()),
            );
            i.mac = Some(a.mac.parse().unwrap());
            i.network = network;
            Request::declare(i).unwrap()
        };
        ok(lab.send(1, &declare("dup8", 8)).unwrap());
        // Readiness, not a sleep: a network-0 interface declared after it on
        // host 1, with a MAC after A's (host 1 claims in MAC order, each
        // claim a revision of its own), routed to host 1 by hosts 0 and 2.
        // They apply the store in revision order: had host 1 claimed A's MAC
        // for the network-8 interface, they would have taken that first.
        let marker = "fe:54:00:88:88:88";
        {
            use vnet_control::request::{Dev, DevName, Interface, Name, Request};
            let mut i =
                Interface::new(Name::new("mark0").unwrap(), Dev::Tap(DevName::new("mark0t").unwrap()));
            i.mac = Some(marker.parse().unwrap());
            ok(lab.send(1, &Request::declare(i).unwrap()).unwrap());
        }
        let took = wait_until(5.0, "hosts 0 and 2 route the later claim to host 1", || {
            [0, 2].iter().all(|&h| route_to(&lab, h, marker).as_deref() == Some("link h1"))
        });
        eprintln!("a claim declared after the network-8 interface reached hosts 0 and 2 in {took:?}");
        assert!(routed_to_h0(&lab), "a network-8 interface moved network 0's VM");
        assert_ping(&lab, &c, a.ip, 56);
        // The same network: a conflict, shown on host 1, and nothing moves.
        ok(lab.send(1, &declare("dup0", 0)).unwrap());
        let took = wait_until(2.0, "host 1 shows the conflict", || {
            lab.cluster_status(1).unwrap()["conflicts"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|x| x["mac"] == a.mac.as_str() && x["holder"] == "h0" && x["interface"] == "dup0")
            })
        });
        eprintln!("conflict shown on the claiming host {took:?} after its interface was declared");
        let text = lab.control(1, "show cluster").unwrap().body;
        assert!(
            text.contains(&format!("conflict {}: held by h0, claimed by h1 (interface dup0 here", a.mac)),
            "{text}"
        );
        let m = lab.control(1, "show metrics").unwrap().body;
        assert!(
            m.contains("vnet_cluster_mac_conflicts 1\n")
                && m.contains("vnet_cluster_mac_conflicts_total 1\n"),
            "{m}"
        );
        std::thread::sleep(Duration::from_millis(500));
        assert!(routed_to_h0(&lab), "a second claim in the same network moved the VM");
        assert!(route_to(&lab, 1, &a.mac).as_deref() != Some("interface dup0"));
        assert_ping(&lab, &c, a.ip, 56);
        // `activate` on host 1 says it is a migration: then, and only then, it moves.
        ok(lab.control(1, "activate dup0").unwrap());
        wait_until(2.0, "every host routes the MAC to host 1", || {
            route_to(&lab, 2, &a.mac).as_deref() == Some("link h1")
                && route_to(&lab, 0, &a.mac).as_deref() == Some("link h1")
        });
        wait_until(2.0, "the conflict is settled", || {
            lab.cluster_status(1).unwrap()["conflicts"].as_array().is_some_and(Vec::is_empty)
        });
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn each_wrong_etcd_credential_keeps_vnetd_from_ready_and_says_what_to_fix() {
        // Issue 45: a wrong password, CA, client certificate or permission
        // left vnetd logging `vnetd ready` and retrying forever, with raw gRPC
        // text in its log.
        let mut lab = lab(cluster_spec(2, 0, vec![1]));
        wait_until(10.0, "host 0 is up", || lab.cluster_status(0).unwrap()["store"] == "up");
        let d = lab.dir.clone();
        let f = |n: &str| d.join(n).display().to_string();
        std::fs::write(d.join("wrong.etcd-pw"), "not the password\n").unwrap();
        std::fs::set_permissions(
            d.join("wrong.etcd-pw"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        // Another CA, and a client certificate it signed (etcd does not know it).
        let openssl = |args: &[&str]| {
            let out = std::process::Command::new("openssl").args(args).output().unwrap();
            assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=other CA",
            "-keyout",
            &f("other-ca.key"),
            "-out",
            &f("other-ca.pem"),
        ]);
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            "/CN=vnet-h1",
            "-keyout",
            &f("other.key"),
            "-out",
            &f("other.csr"),
        ]);
        std::fs::write(d.join("client.ext"), "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
            .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            &f("other.csr"),
            "-CA",
            &f("other-ca.pem"),
            "-CAkey",
            &f("other-ca.key"),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            &f("client.ext"),
            "-out",
            &f("other.pem"),
        ]);
        std::fs::set_permissions(d.join("other.key"), std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        // A user etcd knows, with no role.
        let pw = vnetd::keys::genkey().unwrap();
        vnetd::keys::write_secret(&d.join("nobody.etcd-pw"), &pw).unwrap();
        lab.etcd_user_add("vnet-nobody", &pw).unwrap();
        type Overrides = Vec<(&'static str, Option<String>)>;
        let cases: Vec<(&str, Overrides, &str)> = vec![
            ("password", vec![("etcd-password-file", Some(f("wrong.etcd-pw")))], "password"),
            ("CA", vec![("etcd-ca", Some(f("other-ca.pem")))], "etcd-ca"),
            (
                "client certificate",
                vec![("etcd-cert", Some(f("other.pem"))), ("etcd-key", Some(f("other.key")))],
                "client certificate",
            ),
            (
                "permission",
                vec![
                    ("etcd-user", Some("vnet-nobody".into())),
                    ("etcd-password-file", Some(f("nobody.etcd-pw"))),
                ],
                "grant",
            ),
            (
                "client certificate, none given",
                vec![("etcd-cert", None), ("etcd-key", None)],
                "requires a client certificate",
            ),
        ];
        for (what, overrides, says) in cases {
            lab.cluster_overrides = overrides.into_iter().map(|(k, v)| (1, k, v)).collect();
            let from = lab.log(1).len();
            lab.start_vnetd(1).unwrap();
            let t0 = std::time::Instant::now();
            while lab.cluster_status(1).unwrap()["store"] != "failed" {
                let c = lab.cluster_status(1).unwrap();
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "a wrong {what}: the store is not `failed`: {c}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            let took = t0.elapsed();
            let c = lab.cluster_status(1).unwrap();
            let e = c["last_error"].as_str().unwrap_or_default().to_string();
            eprintln!("wrong etcd {what}: failed after {took:?}: {e}");
            assert!(e.contains(says), "a wrong {what}: {e}");
            assert!(!e.contains("status:") && !e.contains("tonic"), "raw gRPC text: {e}");
            // Past the wait for an outage to count as one (3 s).
            std::thread::sleep(Duration::from_millis(3500));
            let log = lab.log(1)[from..].to_string();
            assert!(!log.contains("vnetd ready"), "a wrong {what}: vnetd said it was ready:\n{log}");
            assert!(log.contains(&e), "a wrong {what}: the log does not say it:\n{log}");
            lab.stop_vnetd(1).unwrap();
        }
        // Right, it is ready and up.
        lab.cluster_overrides.clear();
        lab.start_vnetd(1).unwrap();
        wait_until(10.0, "host 1 is up", || lab.cluster_status(1).unwrap()["store"] == "up");
        wait_until(2.0, "host 1 says it is ready", || lab.log(1).contains("vnetd ready"));
    }

    /// A host's own keys cannot take the network's listing down: host 0
    /// writes four values of 1.2 MB under its own claims (as its etcd
    /// user may), more than the 4 MiB one answer of etcd-client may be;
    /// host 1, restarted, lists the network in pages (a page too large
    /// asked again smaller) and converges, and its VM pings host 0's.
    /// (Unpaged, the listing failed for every host that started or
    /// reconnected, and with it every address allocation.)
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_hosts_large_values_under_its_own_keys_do_not_stop_another_host_listing_the_network() {
        let mut lab = lab(cluster_spec(2, 1, vec![]));
        wait_converged(&lab, 2, 1);
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        let f = |n: &str| lab.dir.join(n).display().to_string();
        for i in 0..4 {
            let key = format!("/vnet/{}/claims/h0/junk{i}", lab.prefix);
            // The login from the password's file into etcdctl's
            // environment, not its command line.
            let script = format!(
                "head -c 1200000 /dev/zero | tr '\\0' x | ETCDCTL_USER=\"vnet-h0:$(cat {})\" etcdctl \
                 --endpoints={} --cacert={} --cert={} --key={} put {key} >/dev/null",
                f("h0.etcd-pw"),
                lab.etcd_url(),
                f("etcd-ca.pem"),
                f("etcd-h0.pem"),
                f("etcd-h0.key"),
            );
            let out = lab.ns_output(lab.switch_ns().unwrap(), &["sh", "-c", &script]).unwrap();
            assert!(out.status.success(), "h0's put {i}: {}", String::from_utf8_lossy(&out.stderr));
        }
        lab.stop_vnetd(1).unwrap();
        lab.start_vnetd(1).unwrap();
        let took = wait_converged(&lab, 2, 1);
        eprintln!("cluster: host 1 listed 4.8 MB of host 0's values and converged {took:?} after its start");
        let s = lab.cluster_status(1).unwrap();
        assert_eq!(s["store"], "up", "{s}");
        assert_ping(&lab, &b, a.ip, 56);
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_hosts_credentials_write_only_its_own_keys_and_a_rolled_back_store_rolls_back_no_host() {
        // Issue 66, findings 2 and 3: every host's etcd user could write and
        // delete every key of the network, and a host forgot the newest
        // policy and the revocations at a relist or a restart. Each host's
        // role is now `host_grants` (the lab makes it, as `approve` does).
        let mut lab = lab(cluster_spec(3, 1, vec![]));
        wait_converged(&lab, 3, 2);
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        let p = format!("/vnet/{}", lab.prefix);
        let as_h0 = |args: &[&str]| {
            let out = lab.etcdctl_as(0, args).unwrap();
            let said =
                format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            (out.status.success(), said)
        };
        // Positive control: h0's credentials read the network and write its own range.
        let (ok, said) = as_h0(&["put", &format!("{p}/ipam/h0/probe"), "x"]);
        assert!(ok, "h0 may write its own keys: {said}");
        assert!(as_h0(&["del", &format!("{p}/ipam/h0/probe")]).0);
        assert!(as_h0(&["get", "--prefix", "--keys-only", &format!("{p}/")])
            .1
            .contains(&format!("{p}/hosts/h1")));
        // Host 1's lease (hex, as `show cluster json` gives it).
        let lease = lab.cluster_status(1).unwrap()["lease"].as_str().unwrap().to_string();
        let refused: Vec<Vec<String>> = vec![
            vec!["put".into(), format!("{p}/hosts/h1"), "{}".into()],
            vec!["del".into(), format!("{p}/hosts/h1")],
            vec!["put".into(), format!("{p}/claims/h1/{}", b.mac), "{}".into()],
            vec!["del".into(), format!("{p}/claims/h1/{}", b.mac)],
            vec!["put".into(), format!("{p}/policy"), "x".into()],
            vec!["del".into(), format!("{p}/policy")],
            vec!["put".into(), format!("{p}/revoked/hosts/h0"), "x".into()],
            vec!["del".into(), "--prefix".into(), format!("{p}/revoked/")],
            vec!["lease".into(), "revoke".into(), lease],
        ];
        for args in &refused {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (ok, said) = as_h0(&args);
            assert!(!ok && said.contains("permission denied"), "h0: etcdctl {args:?}: {said}");
        }
        assert!(lab.cluster_status(1).unwrap()["store"] == "up" && lab.route_to(0, &b.mac).is_some());
        // The admin's policy (serial 10: only A pings B) and a revocation of h2.
        let net_key = lab.dir.join("net.key").display().to_string();
        let signed = |file: &str, text: &str, serial: u64| {
            let path = lab.dir.join(file);
            std::fs::write(&path, text).unwrap();
            signed_policy(&lab, &net_key, &path, serial).1
        };
        let strict = format!(
            "policy default deny\nrule arp allow ether arp\nrule a-pings-b allow from mac {} to mac {} proto icmp\n",
            a.mac, b.mac
        );
        let newest = signed("newest.conf", &strict, 10);
        let older = signed("older.conf", "policy default allow\n", 9);
        lab.etcd_put(&format!("{p}/policy"), Some(&newest)).unwrap();
        let out = lab.vnetctl(0, &["revoke", &net_key, "network", &lab.prefix, "host", "h2"]).unwrap();
        let printed = String::from_utf8(out.stdout).unwrap();
        let (rkey, rvalue) = printed.trim().split_once(' ').unwrap();
        lab.etcd_put(rkey, Some(rvalue)).unwrap();
        let serial_on = |lab: &Lab, h: usize| json(lab, h, "policy")["signed_serial"].as_u64();
        wait_until(3.0, "hosts 0 and 1 enforce serial 10 and dropped h2", || {
            [0, 1]
                .iter()
                .all(|&h| serial_on(&lab, h) == Some(10) && !link_names(&lab, h).contains(&"h2".into()))
        });
        assert_no_ping(&lab, &b, a.ip);
        // The rollback, with the admin's own credentials: the older policy
        // put, the revocation deleted; then every host restarts.
        lab.etcd_put(&format!("{p}/policy"), Some(&older)).unwrap();
        lab.etcd_put(rkey, None).unwrap();
        for h in 0..3 {
            lab.stop_vnetd(h).unwrap();
        }
        for h in 0..3 {
            lab.start_vnetd(h).unwrap();
        }
        wait_until(10.0, "hosts 0 and 1 are back, linked to each other", || {
            link_names(&lab, 0).contains(&"h1".into()) && link_names(&lab, 1).contains(&"h0".into())
        });
        std::thread::sleep(Duration::from_millis(1500));
        for h in [0, 1] {
            assert_eq!(serial_on(&lab, h), Some(10), "host {h} took the older policy after a restart");
            assert!(!link_names(&lab, h).contains(&"h2".into()), "host {h} linked the revoked host again");
            let c = lab.cluster_status(h).unwrap();
            assert!(c["counters"]["stale_policies"].as_u64().unwrap() >= 1, "host {h}: {c}");
        }
        assert_ping(&lab, &a, b.ip, 56);
        assert_no_ping(&lab, &b, a.ip);
        // Positive control: host 1 restarted without what it kept takes the
        // rollback (serial 9, h2 linked again); with its file back, not.
        let kept = lab.dir.join("state-h1").join(format!("cluster-{}.json", lab.prefix));
        let aside = lab.dir.join("kept-h1.json");
        lab.stop_vnetd(1).unwrap();
        std::fs::rename(&kept, &aside).unwrap();
        lab.start_vnetd(1).unwrap();
        wait_until(10.0, "host 1, having kept nothing, takes serial 9 and links h2", || {
            serial_on(&lab, 1) == Some(9) && link_names(&lab, 1).contains(&"h2".into())
        });
        lab.stop_vnetd(1).unwrap();
        std::fs::rename(&aside, &kept).unwrap();
        lab.start_vnetd(1).unwrap();
        wait_until(10.0, "host 1 with its kept state: serial 10, h2 out", || {
            serial_on(&lab, 1) == Some(10)
                && link_names(&lab, 1).contains(&"h0".into())
                && !link_names(&lab, 1).contains(&"h2".into())
        });
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_revoked_host_is_cut_by_every_host_within_a_second_and_stays_out() {
        // Issue 44, finding 9: nothing could withdraw a host's certificate
        // before it expired. `vnetctl revoke` signs a revocation with the
        // network key; written to the store, every host drops the host.
        let mut lab = lab(cluster_spec(3, 1, vec![]));
        wait_converged(&lab, 3, 2);
        let (a, c) = (lab.vm(0, 0).clone(), lab.vm(2, 0).clone());
        assert_ping(&lab, &a, c.ip, 56);
        let net_key = lab.dir.join("net.key").display().to_string();
        let out = lab.vnetctl(0, &["revoke", &net_key, "network", &lab.prefix, "host", "h2"]).unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let printed = String::from_utf8(out.stdout).unwrap();
        let (key, value) = printed.trim().split_once(' ').unwrap();
        assert_eq!(key, format!("/vnet/{}/revoked/hosts/h2", lab.prefix));
        lab.etcd_put(key, Some(value)).unwrap();
        let took = wait_until(1.0, "hosts 0 and 1 drop host 2", || {
            [0, 1].iter().all(|&h| !link_names(&lab, h).contains(&"h2".to_string()))
        });
        eprintln!("revocation: host 2 cut by every host {took:?} after the put");
        assert_eq!(route_to(&lab, 0, &c.mac), None, "host 2's VM is routed nowhere");
        let q = lab.cluster_status(0).unwrap();
        assert!(q["quarantined"].to_string().contains("revoked"), "{q}");
        assert_eq!(q["revoked"]["hosts"], 1, "{q}");
        // Host 2 restarts and puts its record again; deleting the revocation
        // (which takes no network key) brings nothing back either.
        lab.stop_vnetd(2).unwrap();
        lab.start_vnetd(2).unwrap();
        let record = format!("/vnet/{}/hosts/h2", lab.prefix);
        wait_until(10.0, "host 2 put its record again", || {
            !lab.etcdctl(&["get", "--print-value-only", &record]).unwrap().trim().is_empty()
        });
        lab.etcd_put(key, None).unwrap();
        // Hosts 0 and 1 have applied host 2's new record and the deletion
        // (before, a 1.5 s sleep), so the checks below see what they did
        // with them.
        let took = wait_applied(&lab, &[0, 1], "host 2's record and the revocation's deletion", 5.0);
        eprintln!("revocation: hosts 0 and 1 applied host 2's new record and the deletion {took:?} after it");
        for h in [0, 1] {
            assert!(
                !link_names(&lab, h).contains(&"h2".to_string()),
                "host {h} linked the revoked host again"
            );
        }
        // The pings were sent (a ping that never ran passes "none answered").
        let p = lab.ping(&a, c.ip, 2, 56).unwrap();
        assert_eq!(p.sent, 2, "the ping to the revoked host's VM did not run: {p:?}");
        assert_eq!(p.received, 0, "the revoked host's VM answered: {p:?}");
    }

    /// Issue 66: what `network revoke` cannot end. etcd checks a watch's
    /// rights only when the watch is made (`v3rpc/watch.go`:
    /// `isWatchPermitted` on a create request), deleting a user (the auth
    /// store's `UserDelete`: its tokens invalidated, the auth revision
    /// moved on) touches no open stream, and etcd has no call that ends
    /// another client's stream. So a revoked host that holds a watch open
    /// (an `etcdctl watch` as its user, made before the revoke) goes on
    /// receiving the network's keys (what every host reads) until its
    /// connection ends, while all it asks anew (a get, a new watch) is
    /// refused. The test holds docs/SECURITY.md to that: if etcd comes to
    /// cancel such watches, it fails, and the sentence is to change.
    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_revoked_hosts_open_watch_goes_on_while_all_it_asks_anew_is_refused() {
        let mut lab = lab(cluster_spec(3, 0, vec![2]));
        let user = lab.admit_as_approve_does(2).unwrap();
        wait_converged(&lab, 2, 0);
        let p = format!("/vnet/{}", lab.prefix);
        let f = |n: &str| lab.dir.join(n).display().to_string();
        let mut login = vnet_lab::etcdctl_login(&user, &lab.dir.join("h2.etcd-pw"));
        login.extend([
            format!("--endpoints={}", lab.etcd_url()),
            format!("--cacert={}", f("etcd-ca.pem")),
            format!("--cert={}", f("etcd-h2.pem")),
            format!("--key={}", f("etcd-h2.key")),
        ]);
        let watch_log = lab.dir.join("h2-watch.log");
        let prefix = format!("{p}/");
        let mut args: Vec<&str> = login.iter().map(String::as_str).collect();
        args.extend(["watch", "--prefix", &prefix]);
        let sw = lab.switch_ns().unwrap().to_string();
        lab.spawn_logged(&sw, &args, &watch_log).unwrap();
        let as_h2 = |args: &[&str]| lab.etcdctl_as(2, args).unwrap();
        let seen = |v: &str| std::fs::read_to_string(&watch_log).unwrap_or_default().contains(v);
        let probe = format!("{p}/watch-probe");
        wait_until(10.0, "h2's watch receives a put (its control)", || {
            lab.etcd_put(&probe, Some("before-revoke")).unwrap();
            seen("before-revoke")
        });
        let admin = lab.admin_dir().unwrap();
        let vnetctl = vnet_lab::bin("vnetctl").unwrap();
        let out = lab
            .ns_output(&sw, &[vnetctl.to_str().unwrap(), "network", "revoke", admin.to_str().unwrap(), "h2"])
            .unwrap();
        assert!(out.status.success(), "network revoke h2: {out:?}");
        // All it asks anew is refused.
        let get = as_h2(&["get", &probe]);
        let said = String::from_utf8_lossy(&get.stderr).to_string();
        assert!(!get.status.success() && said.contains("authentication failed"), "h2's get: {said}");
        let again = as_h2(&["watch", "--prefix", &prefix]);
        let said = String::from_utf8_lossy(&again.stderr).to_string();
        assert!(!again.status.success() && said.contains("authentication failed"), "h2's new watch: {said}");
        // Its open watch goes on (the limit docs/SECURITY.md states).
        lab.etcd_put(&probe, Some("after-revoke")).unwrap();
        let took =
            wait_until(5.0, "h2's open watch, made before the revoke, receives a put after it", || {
                seen("after-revoke")
            });
        eprintln!(
            "revoke: the revoked host's open watch still received a put {took:?} after it (etcd's limit)"
        );
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_cluster_line_in_the_config_runs_cluster_mode_and_is_fixed_while_vnetd_runs() {
        let mut spec = cluster_spec(2, 1, vec![]);
        spec.cluster.as_mut().unwrap().in_config = true;
        let lab = lab(spec);
        let conf = std::fs::read_to_string(&lab.hosts[0].config).unwrap();
        assert!(conf.contains("cluster etcd:https://") && conf.contains(" etcd-password-file /"), "{conf}");
        // Issue 45: the host key is in the line too; vnetd has no --key.
        assert!(conf.contains(" key /"), "{conf}");
        let cmdline =
            std::fs::read_to_string(format!("/proc/{}/cmdline", lab.vnetd_pid(0).unwrap())).unwrap();
        assert!(!cmdline.contains("--key"), "{cmdline:?}");
        wait_converged(&lab, 2, 1);
        let (a, b) = (lab.vm(0, 0).clone(), lab.vm(1, 0).clone());
        assert_ping(&lab, &a, b.ip, 56);
        let text = lab.control(0, "show cluster").unwrap().body;
        assert!(text.contains("store up") && text.contains("https://"), "{text}");
        // `show config` (what `save` writes) keeps the line; a change to it
        // while vnetd runs is refused, and changes nothing.
        let shown = lab.control(0, "show config").unwrap().body;
        let line = shown
            .lines()
            .find(|l| l.starts_with("cluster "))
            .expect("a cluster line in show config")
            .to_string();
        let e = lab.apply(0, &line.replace(" ttl 5", " ttl 9")).unwrap_err().to_string();
        assert!(e.contains("cluster settings are taken at start"), "{e}");
        lab.apply(0, &format!("{line}\n")).unwrap();
        assert_ping(&lab, &a, b.ip, 56);
    }

    #[test]
    #[ignore = "needs root and network namespaces: run with --ignored"]
    fn a_host_whose_certificate_expires_is_dropped_by_every_other_until_renewed() {
        let mut lab = lab(cluster_spec(3, 1, vec![2]));
        wait_converged(&lab, 2, 1);
        let (a, c) = (lab.vm(0, 0).clone(), lab.vm(2, 0).clone());
        // Host 2's certificate, signed anew to expire 8 s from now.
        let vnetctl = vnet_lab::bin("vnetctl").unwrap();
        let key = std::fs::read(lab.dir.join("h2.key")).unwrap();
        let pubkey = |args: &[&str]| {
            let mut p = std::process::Command::new(&vnetctl)
                .args(args)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            std::io::Write::write_all(p.stdin.as_mut().unwrap(), &key).unwrap();
            let out = p.wait_with_output().unwrap();
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        let (public, claim) = (pubkey(&["pubkey"]), pubkey(&["pubkey", "claim"]));
        let (net_key, cert_file, network) =
            (lab.dir.join("net.key"), lab.dir.join("h2.cert"), lab.prefix.clone());
        let addr = format!("{}/32", lab.hosts[2].underlay_ip);
        let sign = |until: &[&str]| {
            let mut args = vec!["sign", net_key.to_str().unwrap(), "network", &network, "host", "h2"];
            args.extend(["public-key", &public, "claim-key", &claim, "addr", &addr]);
            args.extend(until);
            let out = std::process::Command::new(&vnetctl).args(&args).output().unwrap();
            assert!(out.status.success(), "{out:?}");
            std::fs::write(&cert_file, out.stdout).unwrap();
        };
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        sign(&["not-after", &(now + 8).to_string()]);
        lab.start_vnetd(2).unwrap();
        wait_converged(&lab, 3, 2);
        assert_ping(&lab, &a, c.ip, 56);
        let took = wait_until(12.0, "hosts 0 and 1 drop host 2 once its certificate expired", || {
            (0..2).all(|h| !link_names(&lab, h).contains(&"h2".to_string()))
        });
        let late =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() - (now + 8);
        eprintln!("cluster: an expired host was dropped {late} s after its certificate's not_after ({took:?} of waiting)");
        assert!(late <= 2, "dropped {late} s after expiry");
        for h in 0..2 {
            let q = lab.cluster_status(h).unwrap()["quarantined"].to_string();
            assert!(q.contains("/hosts/h2") && q.contains("expired"), "host {h}: {q}");
            assert_eq!(route_to(&lab, h, &c.mac), None, "host {h} still routes the expired host's VM");
        }
        assert_no_ping(&lab, &a, c.ip);
        // Renewed (and vnetd restarted on it): back.
        sign(&["days", "1"]);
        lab.stop_vnetd(2).unwrap();
        lab.start_vnetd(2).unwrap();
        wait_converged(&lab, 3, 2);
        assert_ping(&lab, &a, c.ip, 56);
        // Its days left are shown, and it counts as expiring within 30 days.
        let certs = lab.cluster_status(0).unwrap()["certificates"].clone();
        assert!(
            certs.as_array().unwrap().iter().any(|c| c["host"] == "h2" && c["days_left"] == 0),
            "{certs}"
        );
        let text = lab.control(0, "show cluster").unwrap().body;
        let line = text.lines().find(|l| l.starts_with("certificates, days left: ")).unwrap_or_default();
        assert!(line.contains("h2 0"), "{text}");
        // The lab's own certificates run a day too: all three expire within 30 days.
        let metrics = lab.control(0, "show metrics").unwrap().body;
        assert!(metrics.contains("vnet_cluster_certificates_expiring_30d 3\n"), "{metrics}");
        // Without `days` or `not-after`, a certificate runs for a year.
        sign(&[]);
        let cert = std::fs::read_to_string(&cert_file).unwrap();
        let net_pub = std::fs::read_to_string(lab.dir.join("net.pub")).unwrap();
        let c = vnet_cluster::trust::NetworkPublic::from_base64(net_pub.trim())
            .unwrap()
            .verify(cert.trim())
            .unwrap();
        assert_eq!(c.not_after.map(|t| (t - now) / 86_400), Some(365));
    }

    /// Issue 45: cluster mode across NATs. Hosts 0 (a port-forwarding NAT),
    /// 1 and 3 (symmetric NATs) and host 2 (public, `vnetd --relay`) form a
    /// cluster from etcd alone with `--cluster-link-options "nat relay auto"`:
    /// no per-peer line. A host behind a NAT advertises the address its peers
    /// see it at (its certificate names it), links punch through where a NAT
    /// lets them and go through host 2 where none does; `conntrack -F` on two
    /// NATs at once costs under 2 s.
    #[test]
    #[ignore = "needs root, network namespaces and etcd: run with --ignored"]
    fn a_cluster_across_nats_links_every_host_with_no_per_peer_configuration() {
        let spec = Spec {
            hosts: 4,
            nat: true,
            cluster: Some(vnet_lab::Cluster {
                ttl_s: 5,
                late: vec![],
                open: false,
                in_config: false,
                members: 1,
            }),
            ..Spec::default()
        };
        let lab = lab(spec);
        let vms: Vec<Vm> = (0..4).map(|h| lab.vm(h, 0).clone()).collect();
        let took = wait_until(20.0, "every host sees the four and routes the other three VMs", || {
            (0..4).all(|h| {
                let c = lab.cluster_status(h).unwrap();
                c["hosts"].as_array().map_or(0, Vec::len) == 4 && c["routes"] == 3
            })
        });
        eprintln!("NAT cluster: converged {took:?} after the hosts started");
        let pairs: Vec<(Vm, Ipv4Addr)> = (0..4)
            .flat_map(|a| (0..4).filter(move |&b| b != a).map(move |b| (a, b)))
            .map(|(a, b)| (vms[a].clone(), vms[b].ip))
            .collect();
        let took = wait_until(30.0, "every VM pings every other", || ping_pairs(&pairs).is_empty());
        eprintln!("NAT cluster: every pair of VMs pings {took:?} later");
        // Host 0's record says where its peers see it: its NAT's address.
        // (Peers reflect it with their keepalives: within seconds.)
        let rec = |lab: &Lab| {
            lab.etcdctl(&["get", "--print-value-only", &format!("/vnet/{}/hosts/h0", lab.prefix)]).unwrap()
        };
        let took = wait_until(20.0, "host 0's record says its NAT's address", || {
            rec(&lab).contains("\"addr\":\"203.0.113.1:9000\"")
        });
        eprintln!("NAT cluster: host 0 advertised its NAT's address {took:?} later");
        // Hosts 1 and 3 are behind symmetric NATs: their records keep their own
        // addresses (what a peer sees changes with each destination).
        let rec1 =
            lab.etcdctl(&["get", "--print-value-only", &format!("/vnet/{}/hosts/h1", lab.prefix)]).unwrap();
        assert!(rec1.contains("\"addr\":\"10.77.1.1:9000\""), "{rec1}");
        // The links remade to host 0's advertised address: every pair talks
        // again, hosts 1 and 3 (two symmetric NATs) through host 2.
        let t0 = std::time::Instant::now();
        loop {
            let bad = ping_pairs(&pairs);
            if bad.is_empty() {
                break;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                let paths: Vec<String> = (0..4)
                    .flat_map(|h| {
                        json(&lab, h, "links")["links"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(move |l| {
                                format!(
                                    "h{h}->{}: {} {} remote {} established {} relayed_tx {}",
                                    l["name"],
                                    l["path"],
                                    l["endpoint"],
                                    l["remote"],
                                    l["established"],
                                    l["relayed_tx"]
                                )
                            })
                            .collect::<Vec<_>>()
                    })
                    .collect();
                panic!(
                    "pairs that do not ping 30 s after the records changed: {bad:?}\n{}\nh2's log:\n{}",
                    paths.join("\n"),
                    lab.log(2)
                );
            }
        }
        eprintln!("NAT cluster: every pair pings again {:?} later", t0.elapsed());
        wait_until(20.0, "hosts 1 and 3 go through the relay", || {
            link_named(&lab, 1, "h3")["path"] == "relayed" && link_named(&lab, 3, "h1")["path"] == "relayed"
        });
        let paths: Vec<String> = (0..4)
            .flat_map(|h| {
                json(&lab, h, "links")["links"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(move |l| format!("h{h}->{}: {} {}", l["name"], l["path"], l["endpoint"]))
                    .collect::<Vec<_>>()
            })
            .collect();
        eprintln!("NAT cluster: paths:\n  {}", paths.join("\n  "));
        assert_eq!(link_named(&lab, 1, "h3")["path"], "relayed", "two symmetric NATs: {paths:?}");
        assert_ne!(
            link_named(&lab, 0, "h1")["path"],
            "relayed",
            "a port-forwarding NAT and a symmetric one punch: {paths:?}"
        );
        for h in 0..4 {
            for l in json(&lab, h, "links")["links"].as_array().unwrap() {
                assert!(l["security"] == "encrypt" && l["established"] == true, "host {h}: {l}");
            }
        }
        // Both NATs forget every mapping at once, under a 10 ms ping from
        // host 0's VM to host 1's. Host 1's symmetric NAT then sends its
        // datagrams from a new random port (`--random-fully`; the same one
        // again is a chance of 1 in 28000), which host 0's link must follow:
        // a gap alone is what a flush that changed nothing also passes.
        let before = link_named(&lab, 0, "h1")["endpoint"].clone();
        let (r0, r1) = (format!("{}-r0", lab.prefix), format!("{}-r1", lab.prefix));
        let (out, _) = {
            let (a, b) = (vms[0].clone(), vms[1].clone());
            let ip = b.ip.to_string();
            let ping = in_background(&a.ns, &["ping", "-n", "-i", "0.01", "-c", "600", "-W", "1", &ip]);
            std::thread::sleep(Duration::from_secs(2));
            for r in [&r0, &r1] {
                let o = lab.ns_output(r, &["conntrack", "-F"]).unwrap();
                assert!(o.status.success(), "conntrack -F: {o:?}");
            }
            (String::from_utf8_lossy(&ping.join().unwrap().stdout).to_string(), ())
        };
        let (r, gap) = ping_gap("NAT cluster: conntrack flushed on both NATs", &out, 600);
        eprintln!("NAT cluster: after the flush: {r:?}, longest gap {} ms", gap * 10);
        assert!(gap <= 200, "traffic stopped for {} ms after both NATs were flushed", gap * 10);
        let after = link_named(&lab, 0, "h1");
        eprintln!("NAT cluster: host 0 sent to host 1 at {before}, now at {}", after["endpoint"]);
        assert_ne!(after["endpoint"], before, "host 0's link did not follow host 1's new port: {after}");
        assert_ne!(after["path"], "relayed", "{after}");
    }
}
