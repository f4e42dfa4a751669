//! docs/QUICKSTART.md, run as it is written (issues 45, 68): every host of
//! the page a Debian machine booted with systemd as its PID 1
//! ([`vnet_lab::Machine`], the systemd test's), the package installed in
//! it as the page says, each `sh` block run verbatim in the machine its
//! `on=` word names, vnetd started by `vnetctl join` as the package's unit
//! (`vnetd@lab`: `Type=notify`, its sandbox and capability set); each
//! `text` block compared with what it shows (the `lab.conf` that `join`
//! writes, with the file). A fence or an `on=` word the test does not know
//! fails it.

use super::harness::*;
use std::process::Command;
use std::process::Output;
use std::process::Stdio;
use vnet_lab::Machine;

const PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/QUICKSTART.md");

/// The `on=` words run on the admin machine (lab host 0, 10.77.0.1).
const ON_ADMIN: [&str; 4] = ["admin", "token", "approve", "revoke"];
/// The `on=` words run on the host being brought in (lab hosts 1-4).
const ON_HOST: [&str; 3] = ["host", "vm", "check"];

/// A fenced block of the page: `sh on=WORD` (run) or `text` (compared).
struct Block {
    on: Option<String>,
    body: String,
    line: usize,
}

/// The page's fenced blocks, in order (`vnet_lab::docs::fences`, which the
/// Kubernetes walkthrough's test reads too). Panics on a fence the test
/// does not know (any other than `` ```sh on=WORD `` and `` ```text ``) and
/// on an `on=` word it has no machine for.
fn page_blocks(text: &str) -> Vec<Block> {
    let known = |w: &str| ON_ADMIN.contains(&w) || ON_HOST.contains(&w);
    let block = |f: vnet_lab::docs::Fence| {
        let on = match f.info.as_str() {
            "text" => None,
            info => match info.strip_prefix("sh on=") {
                Some(w) if known(w) => Some(w.to_string()),
                Some(w) => panic!(
                    "docs/QUICKSTART.md:{}: `on={w}`: the quickstart test has no machine for it \
                     (admin: {ON_ADMIN:?}, host: {ON_HOST:?})",
                    f.line
                ),
                None => panic!(
                    "docs/QUICKSTART.md:{}: fence ```{info}: the quickstart test neither runs nor compares \
                     it (it knows ```sh on=WORD, run, and ```text, compared)",
                    f.line
                ),
            },
        };
        Block { on, body: f.body, line: f.line }
    };
    vnet_lab::docs::fences(text).into_iter().map(block).collect()
}

/// The command that runs `script` (bash, -euo pipefail) in machine `m`,
/// as root at a login's PATH, with `vars` set.
fn sh_cmd(m: &Machine, vars: &[(&str, String)], script: &str) -> Command {
    let mut c = Command::new("nsenter");
    c.args(["--target", &m.leader.to_string(), "--all", "--", "env", "-i", "HOME=/root", "LANG=C.UTF-8"])
        .arg("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    for (k, v) in vars {
        c.arg(format!("{k}={v}"));
    }
    c.args(["bash", "-euo", "pipefail", "-c", script]).stdin(Stdio::null());
    c
}

fn sh(m: &Machine, vars: &[(&str, String)], script: &str) -> Output {
    sh_cmd(m, vars, script).output().unwrap()
}

/// vnetd@lab's journal in machine `m` (what systemd and vnetd said).
fn journal(m: &Machine) -> String {
    let o = sh(m, &[], "journalctl -u vnetd@lab --no-pager -o short-monotonic | tail -40");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The stdout of `o`; panics when it failed, with its output and the
/// journal of `m`'s vnetd@lab.
fn ok(m: &Machine, what: &str, o: Output) -> String {
    assert!(
        o.status.success(),
        "{what}: {}\n{}\nvnetd@lab's journal:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        journal(m)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Debian's etcd-server package (the page: `apt install etcd-server`),
/// downloaded once into target/systemd/debs: the machines have no network.
fn etcd_server_deb() -> std::path::PathBuf {
    let dir = vnet_lab::bench::repo_dir().join("target/systemd/debs");
    std::fs::create_dir_all(&dir).unwrap();
    let find = || {
        std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("etcd-server_")))
    };
    if let Some(p) = find() {
        return p;
    }
    let o =
        Command::new("apt-get").args(["download", "-q", "etcd-server"]).current_dir(&dir).output().unwrap();
    assert!(o.status.success(), "apt-get download etcd-server: {}", String::from_utf8_lossy(&o.stderr));
    find().expect("apt-get download etcd-server left no etcd-server_*.deb")
}

/// Boots the five machines at once (the admin, then h1-h4) and installs
/// in each what the page says: the package by `dpkg -i`, on the admin
/// Debian's etcd-server too, its own etcd disabled.
fn boot_and_install(lab: &mut Lab) -> Vec<Machine> {
    let page = std::fs::read_to_string(PAGE).unwrap();
    let (vnet, etcd) = ("dpkg -i vnet_*.deb", "apt install\netcd-server");
    for said in [vnet, etcd, "systemctl disable --now etcd"] {
        assert!(page.contains(said), "the page no longer says `{said}`: the test installs as it did");
    }
    let (deb, etcd) = (package_deb(), etcd_server_deb());
    let t0 = std::time::Instant::now();
    let mut ms: Vec<Machine> =
        (0..5).map(|h| Machine::start(lab, h).unwrap_or_else(|e| panic!("machine h{h}: {e}"))).collect();
    for (h, m) in ms.iter_mut().enumerate() {
        m.wait_running(lab, h).unwrap_or_else(|e| panic!("machine h{h}: {e}"));
    }
    let booted = t0.elapsed();
    let name = deb.file_name().unwrap().to_str().unwrap().to_string();
    let mut runs = Vec::new();
    for (h, m) in ms.iter().enumerate() {
        m.copy_in(&deb, &format!("/root/{name}")).unwrap();
        let mut script = "cd /root && dpkg -i vnet_*.deb >/dev/null".to_string();
        if h == 0 {
            let e = etcd.file_name().unwrap().to_str().unwrap();
            m.copy_in(&etcd, &format!("/root/{e}")).unwrap();
            // No network in the machine: apt installs the downloaded file.
            script += &format!(
                " && apt-get install -y -q ./{e} >/dev/null && systemctl disable -q --now etcd \
                 && ! systemctl is-active -q etcd"
            );
        }
        runs.push(sh_cmd(m, &[], &script).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap());
    }
    for (h, c) in runs.into_iter().enumerate() {
        ok(&ms[h], &format!("installing on h{h}"), c.wait_with_output().unwrap());
    }
    eprintln!(
        "quickstart: 5 machines booted in {booted:?}, the packages installed {:?} later",
        t0.elapsed() - booted
    );
    ms
}

/// Compares the page's `text` block `b` with what it shows: the line
/// `join` printed on h1 (`joined`, its stderr), h1's `/etc/vnet/lab.conf`,
/// the command `join` prints without systemd (the installed unit's
/// ExecStart), the `etcdctl` line (the admin's etcd and CA).
fn compare_text(b: &Block, ms: &[Machine], joined: &str, fingerprint: &str) {
    let body = b.body.trim();
    let at = format!("docs/QUICKSTART.md:{}", b.line);
    if let Some(rest) = body.strip_prefix("vnetctl join: host h1 at 10.77.0.2, key fingerprint ") {
        let line = body.replace(rest, fingerprint);
        assert!(joined.lines().any(|l| l.trim() == line), "{at}: join printed no `{line}`:\n{joined}");
    } else if body.lines().any(|l| l.starts_with("listen ")) {
        let file = ok(&ms[1], "h1's lab.conf", sh(&ms[1], &[], "cat /etc/vnet/lab.conf"));
        assert_eq!(body, file.trim(), "{at}: the page's lab.conf is not h1's /etc/vnet/lab.conf");
    } else if let Some(rest) = body.strip_prefix("mkdir -p -m 0700 /run/vnet /var/lib/vnet/lab && ") {
        let unit = ok(&ms[1], "the unit", sh(&ms[1], &[], "cat /lib/systemd/system/vnetd@.service"));
        let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).unwrap();
        let exec = exec.replace("%i", "lab").replace("/usr/sbin/vnetd", "vnetd");
        assert_eq!(rest, exec, "{at}: not the installed unit's ExecStart");
    } else if body.starts_with("etcdctl ") {
        let w: Vec<&str> = body.split_whitespace().collect();
        let arg = |k: &str| w.iter().position(|x| *x == k).and_then(|i| w.get(i + 1)).copied().unwrap();
        let yml = ok(&ms[0], "etcd.yml", sh(&ms[0], &[], "cat /root/vnet-lab/etcd.yml"));
        let url = arg("--endpoints");
        assert!(yml.lines().any(|l| l.contains("advertise-client-urls") && l.contains(url)), "{at}: {yml}");
        ok(&ms[0], &format!("{at}: the CA"), sh(&ms[0], &[], &format!("test -s {}", arg("--cacert"))));
        assert_eq!(arg("--user"), "root", "{at}");
    } else {
        panic!("{at}: a text block the quickstart test does not compare:\n{body}");
    }
}

/// On the user pass only, one test at a time.
mod user_alone {
    use super::*;

    // Alone: five machines with systemd, the package (built meanwhile in
    // the background), and time bounds (h3's record seen, the VMs linked,
    // the revoked h3 dropped) at about twice what was measured.
    #[test]
    #[ignore = "needs root, network namespaces, systemd-nspawn and etcd: run with --ignored"]
    fn quickstart_runs_verbatim_on_machines_with_systemd_and_the_package_and_the_vms_ping() {
        let t_all = std::time::Instant::now();
        let blocks = page_blocks(&std::fs::read_to_string(PAGE).unwrap());
        let block = |on: &str| -> String {
            let b: Vec<&Block> = blocks.iter().filter(|b| b.on.as_deref() == Some(on)).collect();
            assert_eq!(b.len(), 1, "docs/QUICKSTART.md: {} blocks `on={on}`, the test runs one", b.len());
            b[0].body.clone()
        };
        let count =
            |b: &str| b.lines().filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')).count();
        let (per_network, per_host) = (
            count(&block("admin")),
            count(&block("token")) + count(&block("host")) + count(&block("approve")),
        );
        eprintln!("quickstart: {per_network} commands for the network, {per_host} per host, 0 files by hand");
        assert!(per_network <= 2 && per_host <= 3, "{per_network} per network, {per_host} per host");
        // No secret on a command line: no block names a password or a token.
        for b in &blocks {
            assert!(!b.body.contains("root.pw") || b.on.is_none(), "{}", b.body);
            assert!(!b.body.contains("vnet2.") && !b.body.contains("--password"), "{}", b.body);
        }
        let mut lab = lab(Spec {
            hosts: 5,
            vms_per_host: 1,
            veth_hosts: (0..5).collect(),
            no_vnetd: true,
            ..Spec::default()
        });
        assert_eq!(lab.hosts[0].underlay_ip.to_string(), "10.77.0.1", "the page's admin address");
        let ms = boot_and_install(&mut lab);
        let admin = &ms[0];
        ok(admin, "the network's block", sh(admin, &[], &block("admin")));
        let mut joined = vec![(String::new(), String::new()); 5];
        let mut join_host = |h: usize| {
            let t0 = std::time::Instant::now();
            let name = vec![("HOST", format!("h{h}"))];
            ok(admin, "the token's block", sh(admin, &name, &block("token")));
            // The token file, copied to the host (as scp would: mode 0600).
            let token = format!("/root/h{h}.token");
            ms[h].copy_in(&admin.root.join(format!("root/vnet-lab/h{h}.token")), &token).unwrap();
            let vars = vec![("TOKEN_FILE", token), ("HOST", format!("h{h}"))];
            let (fingerprint, joining) = spawn_join(sh_cmd(&ms[h], &vars, &block("host")));
            // The admin approves, pinning the fingerprint the host printed,
            // once the request is there (join prints it first, then files it).
            let approve_vars = vec![("HOST", format!("h{h}")), ("FINGERPRINT", fingerprint.clone())];
            let mut tries = 0;
            while !sh(admin, &approve_vars, &block("approve")).status.success() {
                tries += 1;
                if tries >= 50 {
                    ok(admin, &format!("approve h{h}"), sh(admin, &approve_vars, &block("approve")));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let o = joining.join().unwrap();
            let said = String::from_utf8_lossy(&o.stderr).into_owned();
            ok(&ms[h], &format!("join h{h}"), o);
            // systemd's vnetd@lab, ready by its own word (Type=notify).
            let unit = "systemctl show -p Type,ActiveState,SubState,NRestarts vnetd@lab";
            let state = ok(&ms[h], "vnetd@lab", sh(&ms[h], &[], unit));
            for want in ["Type=notify", "ActiveState=active", "SubState=running", "NRestarts=0"] {
                assert!(
                    state.lines().any(|l| l == want),
                    "h{h}'s vnetd@lab: {want}?\n{state}\n{}",
                    journal(&ms[h])
                );
            }
            joined[h] = (said, fingerprint);
            let vm = lab.vm(h, 0).clone();
            let vars = vec![("VMDEV", vm.host_dev.clone().unwrap()), ("VMMAC", vm.mac.clone())];
            ok(&ms[h], &format!("attach h{h}'s VM"), sh(&ms[h], &vars, &block("vm")));
            eprintln!("quickstart: host h{h} joined and its VM attached in {:?}", t0.elapsed());
        };
        for h in 1..=3 {
            join_host(h);
        }
        let vms: Vec<Vm> = (1..=4).map(|h| lab.vm(h, 0).clone()).collect();
        let check = block("check");
        let show = |h: usize| ok(&ms[h], "show cluster", sh(&ms[h], &[], &check));
        // `vnetctl join` returns once its vnetd is ready: the others see its
        // record as soon as it is put. Bound 100 ms (was 5 s): measured 6-27 ms
        // (sixteen runs, 2026-12-07), mostly the look itself (`vnetctl show cluster`
        // in the machine, through nsenter), which a loaded machine slows.
        let seen = wait_until_or(
            0.1,
            "h1 sees h3's record (store up, hosts 3: h1 h2 h3)",
            || {
                let s = show(1);
                s.contains("store up") && s.contains("hosts 3: h1 h2 h3")
            },
            || show(1),
        );
        eprintln!("quickstart: h1 saw h3's record {seen:?} after h3 joined");
        // The page: every other host links to it, encrypted, within a second.
        // Bound 1 s (was 5 s): the first ping run must pass (a failed one
        // takes 2 s more, -W 2). Measured 410-502 ms (eight runs, 2026-12-07),
        // over a ping run's own 400 ms (3 pings 200 ms apart); 1.02 and 1.05 s
        // at load 13, their first run passing.
        let pinged = wait_until(1.0, "h1's VM pings h2's and h3's", || {
            ping_pairs(&[(vms[0].clone(), vms[1].ip), (vms[0].clone(), vms[2].ip)]).is_empty()
        });
        eprintln!("quickstart: h1's VM pinged h2's and h3's {pinged:?} after h3's record was seen");
        // The fourth host: the same commands; nothing changes on the others.
        join_host(4);
        let pinged = wait_until(1.0, "h4's VM pings h1's, h2's and h3's", || {
            ping_pairs(&[
                (vms[3].clone(), vms[0].ip),
                (vms[3].clone(), vms[1].ip),
                (vms[3].clone(), vms[2].ip),
            ])
            .is_empty()
        });
        eprintln!("quickstart: h4's VM pinged h1's, h2's and h3's {pinged:?} after h4 joined");
        let links = ok(&ms[4], "show links", sh(&ms[4], &[], "vnetctl --json show links"));
        let v: serde_json::Value = serde_json::from_str(&links).unwrap();
        let all = v["links"].as_array().unwrap();
        assert_eq!(all.len(), 3, "{links}");
        assert!(all.iter().all(|l| l["security"] == "encrypt" && l["established"] == true), "{links}");
        let i = ok(&ms[4], "show interfaces", sh(&ms[4], &[], "vnetctl --json show interfaces"));
        eprintln!("quickstart: h4's VM interface under systemd: {i}");
        // Every text block of the page, compared with what it shows.
        let texts: Vec<&Block> = blocks.iter().filter(|b| b.on.is_none()).collect();
        for b in &texts {
            compare_text(b, &ms, &joined[1].0, &joined[1].1);
        }
        eprintln!("quickstart: {} text blocks compared", texts.len());
        revoke_h3(&ms, &vms, &block("revoke"), &check);
        // The machines shut down at once (each waits for its units to stop).
        std::thread::scope(|s| {
            for m in ms {
                s.spawn(move || drop(m));
            }
        });
        eprintln!("quickstart: the whole test took {:?}", t_all.elapsed());
    }
}

/// Taking a host out, as the page says (issue 66): every other host drops
/// h3, h3's VM is routed by none of them, and h3's own store session is
/// refused (its etcd user and lease are gone); h3 says why (issue 70).
fn revoke_h3(ms: &[Machine], vms: &[Vm], revoke: &str, check: &str) {
    let show = |h: usize| ok(&ms[h], "show cluster", sh(&ms[h], &[], check));
    assert!(ping_pairs(&[(vms[0].clone(), vms[2].ip)]).is_empty(), "h1's VM pings h3's before");
    let hosts_line =
        |h: usize| show(h).lines().find(|l| l.starts_with("hosts ")).unwrap_or_default().to_string();
    let t0 = std::time::Instant::now();
    ok(&ms[0], "network revoke h3", sh(&ms[0], &[], revoke));
    let said = t0.elapsed();
    let took = wait_until(5.0, "h1, h2 and h4 drop h3", || {
        [1, 2, 4].iter().all(|&h| !hosts_line(h).split_whitespace().any(|w| w == "h3"))
    });
    eprintln!("quickstart: network revoke returned in {said:?}; every other host dropped h3 {took:?} after it returned");
    // Bound 250 ms (was 2 s): measured 17-106 ms (fourteen runs, 2026-12-07;
    // 83 and 106 ms at load 13-14): each look is three `vnetctl show
    // cluster` in the machines (nsenter), 20 ms apart.
    assert!(
        took < Duration::from_millis(250),
        "the other hosts dropped h3 {took:?} after the revoke returned"
    );
    for h in [1, 2, 4] {
        let routes = ok(&ms[h], "show routes", sh(&ms[h], &[], "vnetctl --json show routes")).to_lowercase();
        assert!(!routes.contains(&vms[2].mac.to_lowercase()), "h{h} routes h3's VM: {routes}");
    }
    assert!(!ping_pairs(&[(vms[0].clone(), vms[2].ip)]).is_empty(), "h1's VM pings the revoked h3's");
    let refused = wait_until(15.0, "h3's store session is refused", || !show(3).contains("store up"));
    let told = wait_until(5.0, "h3 says it was revoked", || {
        show(3).contains("this host was revoked by the network's admin")
    });
    eprintln!(
        "quickstart: h3's store session refused {refused:?} after, and h3 said why {told:?} after that"
    );
    let log = journal(&ms[3]);
    assert!(log.contains("this host was revoked by the network's admin"), "{log}");
}
