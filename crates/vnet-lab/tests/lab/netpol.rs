//! NetworkPolicy (issue 67) on the lab's Kubernetes, as a user applies
//! them: vnet from its manifest (vnetd `--kube-network-policy`), pods in
//! two namespaces on three nodes, NetworkPolicies applied and deleted
//! with kubectl, on the kernel path (the manifest as it ships) and on the
//! user path (pods on the user path, links encrypted). Run by
//! `scripts/k8s-test.sh network_policy` (it builds Kubernetes first).

use super::harness::*;
use super::k8s::apply_yaml;
use std::time::Instant;
use vnet_lab::k8s::{Kube, BUSYBOX_IMAGE};

/// A cluster lab of three hosts with no vnetd of the lab's (the
/// DaemonSet runs them), Kubernetes on it, and vnet applied from the
/// manifest; on the user path, pods are attached on it and links are
/// encrypted; `lines` are added to the ConfigMap's `vnet.conf`. Returns
/// once every node is `Ready`.
fn vnet_on_kubernetes(user_path: bool, lines: &[&str]) -> (Lab, Kube) {
    let (lab, kube) = super::k8s::kube_lab();
    // Each node joins with its own token, key and etcd user.
    super::k8s::apply_vnet_on(&kube, user_path, lines);
    (lab, kube)
}

/// A pod `ns/name` labelled `app: APP` (and `vnet.dev/group: APP`, the
/// label the manifest's vnet-cni makes the pod's group of its
/// namespace) on node `node`, serving its name over HTTP on 8080 (its
/// container port named `http`).
fn pod(kube: &Kube, ns: &str, name: &str, app: &str, node: usize) -> String {
    let serve = format!("mkdir -p /www && echo {name} > /www/index.html && httpd -f -p 8080 -h /www");
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {{app: {app}, vnet.dev/group: {app}}}}}\n\
         spec:\n  nodeName: {}\n  terminationGracePeriodSeconds: 1\n  containers:\n  \
         - {{name: c, image: \"{BUSYBOX_IMAGE}\", imagePullPolicy: IfNotPresent, command: [sh, -c, \"{serve}\"],\n     \
         ports: [{{name: http, containerPort: 8080}}]}}\n",
        kube.nodes[node].name
    )
}

/// The address of running pod `ns/name`.
fn running(kube: &Kube, ns: &str, name: &str) -> Option<String> {
    let p = kube.get_json(&["-n", ns, "get", "pod", name]).ok()?;
    (p["status"]["phase"] == "Running").then(|| p["status"]["podIP"].as_str().map(str::to_string)).flatten()
}

/// vnetd's `show policy` on node `n`, as JSON.
fn policy(kube: &Kube, n: usize) -> serde_json::Value {
    let out = kube.nodes[n]
        .command(vnet_lab::bin("vnetctl").unwrap())
        .args(["--control", "unix:/run/vnet/vnet.sock", "--json", "show", "policy"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The NetworkPolicies node `n` enforces, by name.
fn enforced(kube: &Kube, n: usize) -> Vec<String> {
    let v = policy(kube, n);
    let nets = v["policy"].as_array().cloned().unwrap_or_default();
    let mut names: Vec<String> = nets
        .iter()
        .flat_map(|net| net["networkpolicies"]["policies"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names
}

/// Waits until every node enforces exactly the NetworkPolicies `names`.
fn wait_enforced(kube: &Kube, names: &[&str]) -> Duration {
    let t0 = Instant::now();
    loop {
        let all: Vec<Vec<String>> = (0..kube.nodes.len()).map(|n| enforced(kube, n)).collect();
        if all.iter().all(|e| e == names) {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "not every node enforces {names:?} in 30 s: {all:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Namespaces `prod` (labelled `team: shop`) and `other`, and the pods:
/// prod's web on node 0, db on node 1, cache on node 2; other's db on
/// node 0, web on node 2. Returns each pod's address by `NS/NAME` once
/// all run (120 s at most).
fn start_pods(kube: &Kube) -> impl Fn(&str) -> String {
    let namespaces = "apiVersion: v1\nkind: Namespace\nmetadata: {name: prod, labels: {team: shop}}\n---\n\
                      apiVersion: v1\nkind: Namespace\nmetadata: {name: other}\n";
    apply_yaml(kube, "namespaces.yaml", namespaces);
    let pods = [
        ("prod", "web", "web", 0),
        ("prod", "db", "db", 1),
        ("prod", "cache", "cache", 2),
        ("other", "db", "db", 0),
        ("other", "web", "web", 2),
    ];
    let yaml: Vec<String> =
        pods.iter().map(|&(ns, name, app, node)| pod(kube, ns, name, app, node)).collect();
    apply_yaml(kube, "pods.yaml", &yaml.join("---\n"));
    let t0 = Instant::now();
    let mut ips = std::collections::BTreeMap::new();
    for (ns, name, ..) in pods {
        let ip = loop {
            if let Some(ip) = running(kube, ns, name) {
                break ip;
            }
            if t0.elapsed() > Duration::from_secs(120) {
                let wide = kube.kubectl(&["get", "pods", "-A", "-o", "wide"]).unwrap_or_default();
                let events = kube.kubectl(&["get", "events", "-n", ns]).unwrap_or_default();
                let logs = kube.kubectl(&["-n", "kube-system", "logs", "-l", "app=vnet", "--tail", "40"]);
                panic!("{ns}/{name} not running in 120 s:\n{wide}\n{events}\n{}", logs.unwrap_or_default());
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        ips.insert(format!("{ns}/{name}"), ip);
    }
    move |pod: &str| ips[pod].clone()
}

/// Whether pod `ns/from` fetches the page of the pod at `to` on 8080
/// (busybox's nc; one try: every node enforces what was applied before
/// this is asked).
fn reach(kube: &Kube, ns: &str, from: &str, to: &str) -> bool {
    reach_port(kube, ns, from, to, 8080)
}

/// [`reach`] on `port` (a Service's).
fn reach_port(kube: &Kube, ns: &str, from: &str, to: &str, port: u16) -> bool {
    let script = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {to} {port}");
    let out = kube.kubectl_output(&["-n", ns, "exec", from, "--", "sh", "-c", &script]).unwrap();
    String::from_utf8_lossy(&out.stdout).lines().last().is_some_and(|l| !l.is_empty())
}

/// ClusterIP Services `db` and `cache` in prod (port 80 to the pods' port
/// `http`), each reached from prod/web once kube-proxy and every node's
/// vnetd have it (30 s at most); returns each one's address by name.
fn services(kube: &Kube) -> impl Fn(&str) -> String {
    let yaml: Vec<String> = ["db", "cache"]
        .iter()
        .map(|app| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: {app}, namespace: prod}}\n\
                 spec: {{selector: {{app: {app}}}, ports: [{{name: web, port: 80, targetPort: http}}]}}\n"
            )
        })
        .collect();
    apply_yaml(kube, "services.yaml", &yaml.join("---\n"));
    let mut ips = std::collections::BTreeMap::new();
    for app in ["db", "cache"] {
        let s = kube.get_json(&["-n", "prod", "get", "service", app]).unwrap();
        let ip = s["spec"]["clusterIP"].as_str().unwrap().to_string();
        let t0 = Instant::now();
        while !reach_port(kube, "prod", "web", &ip, 80) {
            assert!(t0.elapsed() < Duration::from_secs(30), "prod/{app}'s Service {ip} not reached in 30 s");
            std::thread::sleep(Duration::from_millis(500));
        }
        ips.insert(app.to_string(), ip);
    }
    // Every node's vnetd watches every Service and trusts the two other
    // nodes' gateways as translators.
    let all = kube.get_json(&["get", "services", "-A"]).unwrap()["items"].as_array().map_or(0, Vec::len);
    let t0 = Instant::now();
    loop {
        let seen: Vec<(u64, u64)> = (0..kube.nodes.len())
            .map(|n| {
                let k = &policy(kube, n)["kubernetes"];
                let objects = k["watches"]["services"]["objects"].as_u64().unwrap_or(0);
                (objects, k["translators"]["addresses"].as_u64().unwrap_or(0))
            })
            .collect();
        let others = kube.nodes.len() as u64 - 1;
        if seen.iter().all(|&(o, t)| o == all as u64 && t == others) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "vnetd's Services and translators: {seen:?}, {all} Services"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    move |app: &str| ips[app].clone()
}

/// What each node's vnetd holds of the cluster, and node 0's trace of a
/// TCP packet from prod/web (at `web`) to `to`:`port` through its
/// gateway (the MAC its neighbour table has last), for a failure's log.
fn explain(kube: &Kube, web: &str, to: &str, port: u16) {
    for n in 0..kube.nodes.len() {
        eprintln!("k8s: node {n}: {}", policy(kube, n)["kubernetes"]);
    }
    let neigh = kube.kubectl_output(&["-n", "prod", "exec", "web", "--", "ip", "neigh"]).unwrap();
    let neigh = String::from_utf8_lossy(&neigh.stdout).to_string();
    eprintln!("k8s: prod/web's neighbours: {neigh}");
    let mac = neigh.split_whitespace().skip_while(|w| *w != "lladdr").nth(1).unwrap_or("00:00:00:00:00:00");
    let t = kube.nodes[0]
        .command(vnet_lab::bin("vnetctl").unwrap())
        .args(["--control", "unix:/run/vnet/vnet.sock", "trace", "from", web, "to", to, "mac", mac])
        .args(["tcp", "port", &port.to_string()])
        .output()
        .unwrap();
    eprintln!(
        "k8s: node 0 trace:\n{}{}",
        String::from_utf8_lossy(&t.stdout),
        String::from_utf8_lossy(&t.stderr)
    );
}

/// The network namespace of running pod `ns/name` on node `node` (its
/// sandbox's, as containerd made it), for `nsenter --net`.
fn netns_of(kube: &Kube, node: usize, ns: &str, name: &str) -> String {
    let n = &kube.nodes[node];
    let id = kube.crictl(n, &["pods", "--name", name, "--namespace", ns, "--state", "ready", "-q"]).unwrap();
    let id = String::from_utf8_lossy(&id.stdout).lines().next().unwrap_or_default().trim().to_string();
    let out = kube.crictl(n, &["inspectp", &id]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.split('"')
        .find(|w| w.starts_with("/var/run/netns/") || w.starts_with("/run/netns/"))
        .unwrap_or_else(|| panic!("no network namespace for {ns}/{name} ({id}): {text}"))
        .to_string()
}

/// Runs `args` on node `node` inside network namespace `netns` (the
/// node's own `ip` and `sysctl`: busybox's `ip` adds no neighbour).
fn in_pod(kube: &Kube, node: usize, netns: &str, args: &[&str]) -> String {
    let out = kube.nodes[node].command("nsenter").arg(format!("--net={netns}")).args(args).output().unwrap();
    assert!(out.status.success(), "{args:?} in {netns}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Pod `ns/name`'s MAC (its `eth0`'s).
fn mac_of(kube: &Kube, ns: &str, name: &str) -> vnet_wire::MacAddr {
    let out =
        kube.kubectl_output(&["-n", ns, "exec", name, "--", "cat", "/sys/class/net/eth0/address"]).unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

mod by_hand {
    use super::*;

    /// The review's IPv6 link-local hole, on one data path: isolation is
    /// keyed by `status.podIPs`, which never hold a pod's `fe80::`
    /// address. vnet-cni turned IPv6 off in every pod (none has an IPv6
    /// address); prod/db (node 1) turned it on again, as a pod that keeps
    /// IPv6 has it, and so did the attacker prod/web (node 0). vnet routes
    /// no IPv6 multicast, so each is told the other's MAC (learnt by ARP;
    /// a raw socket, CAP_NET_RAW, does as much). Without a policy web
    /// reaches db's HTTP on db's link-local address (the control); under
    /// a default deny for db's ingress it does not, on it nor on db's
    /// address; the policy deleted, it does again.
    fn link_local(user_path: bool) {
        let (_lab, kube) = vnet_on_kubernetes(user_path, &[]);
        let ip = start_pods(&kube);
        let (web_ns, db_ns) = (netns_of(&kube, 0, "prod", "web"), netns_of(&kube, 1, "prod", "db"));
        for (node, netns) in [(0, &web_ns), (1, &db_ns)] {
            for conf in ["all", "default", "eth0"] {
                let key = format!("net.ipv6.conf.{conf}.disable_ipv6");
                assert_eq!(in_pod(&kube, node, netns, &["sysctl", "-n", &key]), "1", "vnet-cni's {key}");
            }
        }
        let (web_mac, db_mac) = (mac_of(&kube, "prod", "web"), mac_of(&kube, "prod", "db"));
        let ll = |m| vnet_wire::guard::link_local(m).to_string();
        let (web_ll, db_ll) = (ll(web_mac), ll(db_mac));
        for (node, netns, peer_ll, peer_mac) in [(0, &web_ns, &db_ll, db_mac), (1, &db_ns, &web_ll, web_mac)]
        {
            in_pod(&kube, node, netns, &["sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=0"]);
            let mac = peer_mac.to_string();
            let args =
                ["ip", "-6", "neigh", "replace", peer_ll, "lladdr", &mac, "dev", "eth0", "nud", "permanent"];
            in_pod(&kube, node, netns, &args);
        }
        let to_db = format!("{db_ll}%eth0");
        let t0 = Instant::now();
        while !reach(&kube, "prod", "web", &to_db) {
            assert!(t0.elapsed() < Duration::from_secs(20), "control: web does not reach db's {to_db}");
            std::thread::sleep(Duration::from_millis(500));
        }
        eprintln!("k8s: prod/web reaches prod/db at {to_db} without a policy");
        let deny = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
                    metadata: {name: deny-db, namespace: prod}\n\
                    spec: {podSelector: {matchLabels: {app: db}}, policyTypes: [Ingress]}\n";
        apply_yaml(&kube, "deny.yaml", deny);
        wait_enforced(&kube, &["prod/deny-db"]);
        assert!(!reach(&kube, "prod", "web", &ip("prod/db")), "the policy holds on db's address");
        assert!(!reach(&kube, "prod", "web", &to_db), "prod/web reaches the isolated prod/db at {to_db}");
        for n in 0..kube.nodes.len() {
            let v = policy(&kube, n);
            let lls = v["policy"][0]["networkpolicies"]["link_locals"].as_u64().unwrap_or(0);
            assert!(lls >= 5, "node {n} judges {lls} pods' link-local addresses: {v}");
        }
        kube.kubectl(&["-n", "prod", "delete", "networkpolicy", "deny-db"]).unwrap();
        wait_enforced(&kube, &[]);
        assert!(reach(&kube, "prod", "web", &to_db), "control: the policy deleted, reached again");
    }

    #[test]
    #[ignore = "needs root, namespaces, etcd and scripts/k8s-build.sh's programs: scripts/k8s-test.sh runs it"]
    fn link_local_under_network_policy_on_the_kernel_path() {
        link_local(false);
    }

    #[test]
    #[ignore = "needs root, namespaces, etcd and scripts/k8s-build.sh's programs: scripts/k8s-test.sh runs it"]
    fn link_local_under_network_policy_on_the_user_path() {
        link_local(true);
    }

    /// The scenario, on one data path. prod (labelled team: shop): web on
    /// node 0, db on node 1, cache on node 2; other: db on node 0, web on
    /// node 2. Each pod serves HTTP on 8080 (`http`).
    fn network_policy(user_path: bool) {
        let (_lab, kube) = vnet_on_kubernetes(user_path, &[]);
        let t0 = Instant::now();
        let ip = start_pods(&kube);
        let (db, cache, other_db) = (ip("prod/db"), ip("prod/cache"), ip("other/db"));
        eprintln!("k8s: 5 pods in prod and other running in {:.1?}", t0.elapsed());
        // The pass's data path: the pods' interfaces on it (the node's
        // gateway is on the user path on both).
        let want = if user_path { "user" } else { "kernel" };
        for n in 0..kube.nodes.len() {
            let out = kube.nodes[n]
                .command(vnet_lab::bin("vnetctl").unwrap())
                .args(["--control", "unix:/run/vnet/vnet.sock", "--json", "show", "interfaces"])
                .output()
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let paths: Vec<&str> = v["interfaces"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| i["datapath"].as_str())
                .collect();
            let on = paths.iter().filter(|p| **p == want).count();
            // At least one pod's, and on the user pass the gateway's too.
            let least = if user_path { 2 } else { 1 };
            assert!(on >= least, "node {n}: {want}: {paths:?}");
            assert!(user_path || paths.iter().filter(|p| **p == "user").count() == 1, "node {n}: {paths:?}");
        }
        let reach = |ns: &str, from: &str, to: &str| reach(&kube, ns, from, to);
        // Before any policy: everyone reaches everyone.
        assert!(reach("prod", "web", &db) && reach("other", "db", &db) && reach("prod", "web", &cache));
        assert!(reach("prod", "web", &other_db), "on one node too");
        // prod's db and cache behind ClusterIP Services (port 80 to the
        // named port `http`): reached through them once kube-proxy and
        // every vnetd have them.
        let svc = services(&kube);
        let (db_svc, cache_svc) = (svc("db"), svc("cache"));
        let via = |ns: &str, from: &str, to: &str| reach_port(&kube, ns, from, to, 80);

        // 1. Default deny ingress for prod's db: only it is isolated.
        let deny = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
                    metadata: {name: deny-db, namespace: prod}\n\
                    spec: {podSelector: {matchLabels: {app: db}}, policyTypes: [Ingress]}\n";
        apply_yaml(&kube, "deny.yaml", deny);
        let took = wait_enforced(&kube, &["prod/deny-db"]);
        eprintln!("k8s: deny-db enforced on every node {took:.1?} after kubectl apply");
        assert!(!reach("prod", "web", &db), "prod/web reaches the isolated prod/db");
        assert!(reach("prod", "web", &cache), "positive control: prod/cache, not selected, is reached");
        assert!(reach("prod", "db", &cache), "and prod/db's egress is not isolated");
        if via("prod", "web", &db_svc) {
            explain(&kube, &ip("prod/web"), &db_svc, 80);
            panic!("prod/web reaches the isolated prod/db through its Service");
        }
        assert!(via("prod", "web", &cache_svc), "positive control: prod/cache through its Service");

        // 2. An allow rule by pod label and namespace label, to the named
        // port: prod's web pods (namespace team: shop) reach db, other's
        // web pods (their namespace not labelled) and other's db do not.
        let allow = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
                     metadata: {name: allow-web, namespace: prod}\n\
                     spec:\n  podSelector: {matchLabels: {app: db}}\n  ingress:\n  \
                     - from: [{namespaceSelector: {matchLabels: {team: shop}}, podSelector: {matchLabels: {app: web}}}]\n    \
                     ports: [{port: http}]\n";
        apply_yaml(&kube, "allow.yaml", allow);
        wait_enforced(&kube, &["prod/allow-web", "prod/deny-db"]);
        assert!(reach("prod", "web", &db), "prod/web reaches prod/db by allow-web");
        assert!(!reach("other", "web", &db), "other/web: a web pod of a namespace not labelled team: shop");
        assert!(!reach("other", "db", &db), "other/db: no rule");
        // Through db's Service: judged as if sent to db at its target port
        // (prod/web on node 0, db on node 1: node 0 translates, and its
        // second leg passes on node 1); other/web (node 2) still denied.
        assert!(via("prod", "web", &db_svc), "prod/web reaches prod/db through its Service by allow-web");
        assert!(!via("other", "web", &db_svc), "other/web does not through the Service either");
        assert!(!via("other", "db", &db_svc), "nor other/db (node 0, as prod/web's translator)");

        // 3. Issue 66: a rule for prod's `db` pods is not met by a pod
        // labelled db in another namespace.
        let from_db = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
                       metadata: {name: cache-from-db, namespace: prod}\n\
                       spec:\n  podSelector: {matchLabels: {app: cache}}\n  ingress:\n  \
                       - from: [{podSelector: {matchLabels: {app: db}}}]\n";
        apply_yaml(&kube, "from-db.yaml", from_db);
        wait_enforced(&kube, &["prod/allow-web", "prod/cache-from-db", "prod/deny-db"]);
        assert!(reach("prod", "db", &cache), "prod/db reaches prod/cache");
        assert!(
            !reach("other", "db", &cache),
            "other/db, labelled db in another namespace, is not prod's db"
        );

        // 4. Egress deny: prod's web sends nothing; withdrawn, it sends again.
        let no_out = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
                      metadata: {name: web-no-egress, namespace: prod}\n\
                      spec: {podSelector: {matchLabels: {app: web}}, policyTypes: [Egress]}\n";
        apply_yaml(&kube, "no-out.yaml", no_out);
        wait_enforced(&kube, &["prod/allow-web", "prod/cache-from-db", "prod/deny-db", "prod/web-no-egress"]);
        assert!(!reach("prod", "web", &db), "prod/web's egress is denied, whatever db's ingress allows");
        assert!(!reach("prod", "web", &other_db), "and to other/db on its own node");
        assert!(reach("prod", "db", &cache), "control: prod/db still reaches cache");
        // `show policy` names each rule's NetworkPolicy, with what it did
        // (a packet is denied on the first node that judges it: the
        // sender's), summed over the nodes.
        let mut allowed_web = 0;
        let mut denied_db = 0;
        for n in 0..kube.nodes.len() {
            let v = policy(&kube, n);
            eprintln!("k8s: node {n} show policy: {}", v["policy"][0]["networkpolicies"]);
            let nps = v["policy"][0]["networkpolicies"]["policies"].as_array().cloned().unwrap_or_default();
            let of = |name: &str| nps.iter().find(|p| p["name"] == name).cloned().unwrap_or_default();
            allowed_web += of("prod/allow-web")["ingress"][0]["packets"].as_u64().unwrap_or(0);
            denied_db += of("prod/deny-db")["denied"].as_u64().unwrap_or(0);
        }
        assert!(
            allowed_web >= 1 && denied_db >= 1,
            "allow-web allowed {allowed_web}, deny-db denied {denied_db}"
        );
        let text = kube.nodes[0]
            .command(vnet_lab::bin("vnetctl").unwrap())
            .args(["--control", "unix:/run/vnet/vnet.sock", "show", "policy"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        eprintln!("k8s: node 0 show policy:\n{text}");
        assert!(text.contains("prod/allow-web") && text.contains("ingress 0"), "{text}");
        kube.kubectl(&["-n", "prod", "delete", "networkpolicy", "web-no-egress"]).unwrap();
        wait_enforced(&kube, &["prod/allow-web", "prod/cache-from-db", "prod/deny-db"]);
        assert!(reach("prod", "web", &db), "egress withdrawn: prod/web reaches db again");

        // Every policy deleted: the network is no longer governed by them.
        kube.kubectl(&["-n", "prod", "delete", "networkpolicy", "--all"]).unwrap();
        wait_enforced(&kube, &[]);
        assert!(reach("other", "db", &db) && reach("other", "db", &cache));
    }

    /// The review's hole: a pod reaching an isolated backend through a
    /// NodePort at another node's address. prod/web (node 0) to prod/db
    /// (node 1) through NodePort 30081 at node 2's address: node 2
    /// translates, and its second leg comes to node 1 from a translator.
    /// Reached before any policy (the control), denied by a default deny
    /// of db's ingress (judged on its first leg at node 0 against db, as
    /// through the cluster address), reached again once it is deleted.
    #[test]
    #[ignore = "needs root, namespaces, etcd and scripts/k8s-build.sh's programs: scripts/k8s-test.sh runs it"]
    fn a_nodeport_at_another_nodes_address_is_judged_against_its_backend() {
        let (_lab, kube) = vnet_on_kubernetes(false, &[]);
        let ip = start_pods(&kube);
        let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: db-np, namespace: prod}\n\
                   spec: {type: NodePort, selector: {app: db}, ports: [{name: web, port: 80, targetPort: http, nodePort: 30081}]}\n";
        apply_yaml(&kube, "db-np.yaml", svc);
        let node2 = kube.nodes[2].ip.to_string();
        let via = || reach_port(&kube, "prod", "web", &node2, 30081);
        let t0 = Instant::now();
        while !via() {
            assert!(t0.elapsed() < Duration::from_secs(30), "control: {node2}:30081 not reached in 30 s");
            std::thread::sleep(Duration::from_millis(500));
        }
        eprintln!("k8s: control: prod/web reached prod/db at {node2}:30081 in {:.1?}", t0.elapsed());
        // Every vnetd has the three nodes' addresses.
        let t0 = Instant::now();
        loop {
            let nodes: Vec<u64> = (0..kube.nodes.len())
                .map(|n| policy(&kube, n)["kubernetes"]["services"]["nodes"].as_u64().unwrap_or(0))
                .collect();
            if nodes.iter().all(|&a| a >= 3) {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "vnetd's node addresses: {nodes:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
        let deny = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
                    metadata: {name: deny-db, namespace: prod}\n\
                    spec: {podSelector: {matchLabels: {app: db}}, policyTypes: [Ingress]}\n";
        apply_yaml(&kube, "deny.yaml", deny);
        wait_enforced(&kube, &["prod/deny-db"]);
        assert!(!reach(&kube, "prod", "web", &ip("prod/db")), "directly: denied");
        if via() {
            explain(&kube, &ip("prod/web"), &node2, 30081);
            panic!("prod/web reaches the isolated prod/db through NodePort 30081 at node 2's address");
        }
        let denied: u64 = (0..kube.nodes.len())
            .map(|n| {
                let nps = policy(&kube, n)["policy"][0]["networkpolicies"]["policies"].clone();
                let nps = nps.as_array().cloned().unwrap_or_default();
                nps.iter()
                    .find(|p| p["name"] == "prod/deny-db")
                    .map_or(0, |p| p["denied"].as_u64().unwrap_or(0))
            })
            .sum();
        assert!(denied >= 2, "deny-db counted {denied}");
        eprintln!("k8s: deny-db: prod/web denied at {node2}:30081 (deny-db counted {denied})");
        kube.kubectl(&["-n", "prod", "delete", "networkpolicy", "deny-db"]).unwrap();
        wait_enforced(&kube, &[]);
        assert!(via(), "control: the policy deleted, reached again");
    }

    /// Issue 66, as vnet's own rules name pods' groups (vnet-cni's
    /// `groupLabels`, `groupScope: namespace`): a rule for `prod`'s `db`
    /// (`prod.db`) is not met by a pod labelled `db` in namespace `other`
    /// (`other.db`), and is by prod's.
    #[test]
    #[ignore = "needs root, namespaces, etcd and scripts/k8s-build.sh's programs: scripts/k8s-test.sh runs it"]
    fn a_db_label_in_another_namespace_meets_no_rule_for_prods_db() {
        let rules = [
            "policy default deny",
            "rule arp allow ether arp",
            "rule db-cache allow from group prod.db to group prod.cache proto tcp port 8080",
        ];
        let (_lab, kube) = vnet_on_kubernetes(false, &rules);
        let ip = start_pods(&kube);
        let cache = ip("prod/cache");
        assert!(reach(&kube, "prod", "db", &cache), "prod/db (group prod.db) reaches prod/cache");
        assert!(!reach(&kube, "other", "db", &cache), "other/db (group other.db) does not");
        assert!(!reach(&kube, "prod", "web", &cache), "nor prod/web (group prod.web)");
    }

    /// Each node's translators as its vnetd last read them, and how many
    /// readings it made.
    fn translators(kube: &Kube) -> Vec<(Vec<String>, u64)> {
        (0..kube.nodes.len())
            .map(|n| {
                let t = policy(kube, n)["kubernetes"]["translators"].clone();
                let list = t["gateways"].as_array().into_iter().flatten();
                (
                    list.filter_map(|a| a.as_str().map(str::to_string)).collect(),
                    t["readings"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    }

    /// Node 2's credential (a thief's: its etcd user) writes, under its
    /// own IPAM prefix, a node gateway value for an address it controls
    /// (its pod prod/cache's): no node takes it for a translator (only a
    /// host's gateway its record names, signed, is one), and prod/cache
    /// still does not reach the isolated prod/db's target port. The
    /// positive control: the nodes' real gateways are translators (two on
    /// each node, read from their records), and prod/web reaches db
    /// through its Service, node 0 translating, as allow-web allows.
    /// Before the fix, every node read the forged value as a gateway
    /// and the second leg from cache to db:8080 passed.
    #[test]
    #[ignore = "needs root, namespaces, etcd and scripts/k8s-build.sh's programs: scripts/k8s-test.sh runs it"]
    fn a_gateway_value_a_stolen_node_credential_writes_in_the_ipam_makes_no_translator() {
        let (_lab, kube) = vnet_on_kubernetes(false, &[]);
        let ip = start_pods(&kube);
        let (db, cache) = (ip("prod/db"), ip("prod/cache"));
        let db_svc = services(&kube)("db");
        let allow = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
                     metadata: {name: allow-web, namespace: prod}\n\
                     spec:\n  podSelector: {matchLabels: {app: db}}\n  ingress:\n  \
                     - from: [{podSelector: {matchLabels: {app: web}}}]\n    ports: [{port: http}]\n";
        apply_yaml(&kube, "allow.yaml", allow);
        wait_enforced(&kube, &["prod/allow-web"]);
        assert!(reach_port(&kube, "prod", "web", &db_svc, 80), "control: prod/web through db's Service");
        assert!(!reach(&kube, "prod", "cache", &db), "before: prod/cache reaches the isolated prod/db");
        let real = translators(&kube);
        eprintln!("k8s: the nodes' gateways, from their records: {real:?}");
        assert!(real.iter().all(|(g, _)| g.len() == 3 && !g.contains(&cache)), "{real:?}");
        // The forgery, with node 2's etcd login, on cache's own key.
        let store = kube.store().unwrap();
        let n2 = kube.nodes[2].name.clone();
        let mine = format!("/vnet/{}/ipam/{n2}/", store.network);
        let keys = store.etcdctl_root(&["get", "--prefix", "--keys-only", &mine]).unwrap();
        let key =
            keys.lines().find(|k| k.ends_with(&format!("/{cache}"))).unwrap_or_else(|| panic!("{keys}"));
        let value = serde_json::json!({"host": n2, "owner": "vnet/node-gateway-02deadbeef02/gw"}).to_string();
        let login = vnet_lab::k8s::join::node_login(&kube, 2).unwrap();
        let o = store.etcdctl(Some(&login), &["put", key, &value]).unwrap();
        assert!(o.status.success(), "etcd refused node 2's own key (the control): {o:?}");
        // Two readings after the put on every node: one began after it.
        let t0 = Instant::now();
        let after = loop {
            let now = translators(&kube);
            if now.iter().zip(&real).all(|(n, r)| n.1 >= r.1 + 2) {
                break now;
            }
            assert!(t0.elapsed() < Duration::from_secs(45), "no two readings in 45 s: {now:?}");
            std::thread::sleep(Duration::from_millis(500));
        };
        eprintln!("k8s: translators {:.1?} after the forged value: {after:?}", t0.elapsed());
        assert!(after.iter().zip(&real).all(|(a, r)| a.0 == r.0), "{after:?} against {real:?}");
        assert!(!reach(&kube, "prod", "cache", &db), "prod/cache, its address a forged gateway, reaches db");
        assert!(
            reach_port(&kube, "prod", "web", &db_svc, 80),
            "control: prod/web through db's Service still"
        );
    }

    #[test]
    #[ignore = "needs root, namespaces, etcd and scripts/k8s-build.sh's programs: scripts/k8s-test.sh runs it"]
    fn network_policy_on_the_kernel_path() {
        network_policy(false);
    }

    #[test]
    #[ignore = "needs root, namespaces, etcd and scripts/k8s-build.sh's programs: scripts/k8s-test.sh runs it"]
    fn network_policy_on_the_user_path() {
        network_policy(true);
    }
}
