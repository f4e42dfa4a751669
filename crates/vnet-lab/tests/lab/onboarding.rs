//! Onboarding as an attacker would try it (issue 66): the generated etcd,
//! join tokens, replaced join requests, names taken over, revocation.
//! An admin machine (lab host 0, `vnetctl network init` and its etcd) and
//! a host (lab host 1) running `vnetctl join`; `etcdctl` plays the token
//! holder and the host's store user.

use super::harness::*;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// The admin's network, its etcd running, and the host's namespace
/// (also `cluster::both`'s two joined hosts).
pub(super) struct Onboard {
    _lab: Lab,
    pub(super) admin: String,
    pub(super) host: String,
    /// The lab's files (shared by both namespaces: only the network is theirs).
    pub(super) tmp: PathBuf,
    /// The admin's DIR.
    dir: String,
    url: String,
    root_pw: String,
}

pub(super) fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

impl Onboard {
    /// `network init`, then etcd started on the config it wrote: what
    /// `etcd` serves from its first start, before any other vnetctl command.
    pub(super) fn up() -> Onboard {
        let lab = lab(Spec {
            hosts: 2,
            vms_per_host: 0,
            veth_hosts: vec![0, 1],
            no_vnetd: true,
            ..Spec::default()
        });
        let tmp = std::env::temp_dir().join(format!("vnet-onboard-{}", lab.prefix));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(tmp.join("bin")).unwrap();
        // join's `systemctl enable --now vnetd@lab`: nothing to start here.
        let shim = tmp.join("bin/systemctl");
        std::fs::write(&shim, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let (admin, host) = (lab.hosts[0].ns.clone(), lab.hosts[1].ns.clone());
        let ip = lab.hosts[0].underlay_ip;
        let dir = tmp.join("net").display().to_string();
        let mut o = Onboard {
            _lab: lab,
            admin,
            host,
            tmp,
            dir,
            url: format!("https://{ip}:2379"),
            root_pw: String::new(),
        };
        let init = o.vnetctl(
            &o.admin.clone(),
            &["network", "init", &o.dir.clone(), "network", "lab", "etcd", &ip.to_string()],
        );
        assert!(init.status.success(), "init: {}", text(&init));
        o.root_pw = std::fs::read_to_string(format!("{}/root.pw", o.dir)).unwrap().trim().to_string();
        let (ns, yml, log) = (o.admin.clone(), format!("{}/etcd.yml", o.dir), o.tmp.join("etcd.log"));
        o._lab.spawn_logged(&ns, &["etcd", "--config-file", &yml], &log).unwrap();
        // Up once it answers at all (a refusal is an answer): etcd's first
        // start, before any other command.
        wait_until(20.0, "the generated etcd answers", || {
            let a = o.etcdctl(None, &["get", "/x"], None);
            a.status.success() || text(&a).contains("etcdserver:")
        });
        o
    }

    pub(super) fn root(&self) -> (String, String) {
        ("root".into(), self.root_pw.clone())
    }

    fn vnetctl(&self, ns: &str, args: &[&str]) -> Output {
        self.vnetctl_cmd(ns, args).stdin(Stdio::null()).output().unwrap()
    }

    fn vnetctl_cmd(&self, ns: &str, args: &[&str]) -> Command {
        let path =
            format!("{}:{}", self.tmp.join("bin").display(), std::env::var("PATH").unwrap_or_default());
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, "env", &format!("PATH={path}")])
            .arg(vnet_lab::bin("vnetctl").unwrap())
            .args(args);
        c
    }

    /// etcdctl in the admin's namespace, as `user` (none: anonymous), the
    /// value from `stdin` if given.
    pub(super) fn etcdctl(
        &self,
        user: Option<&(String, String)>,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Output {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.admin, "etcdctl", "--endpoints", &self.url])
            .arg(format!("--cacert={}/ca.pem", self.dir))
            .env("ETCDCTL_API", "3");
        if let Some((u, p)) = user {
            // In etcdctl's environment, not on its command line.
            c.env("ETCDCTL_USER", format!("{u}:{p}"));
        }
        c.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(b) = stdin {
            std::io::Write::write_all(&mut input, b).unwrap();
        }
        drop(input);
        child.wait_with_output().unwrap()
    }

    fn get(&self, key: &str) -> String {
        let o = self.etcdctl(Some(&self.root()), &["get", key, "--print-value-only"], None);
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// `network token DIR HOST ...` into a file; the token's etcd user.
    pub(super) fn token(&self, host: &str, extra: &[&str]) -> (PathBuf, (String, String)) {
        let file =
            self.tmp.join(format!("{host}-{}.token", std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos()));
        let mut args = vec!["network", "token", &self.dir, host, "file", file.to_str().unwrap()];
        args.extend_from_slice(extra);
        let o = self.vnetctl(&self.admin, &args);
        assert!(o.status.success(), "token {host}: {}", text(&o));
        let t = std::fs::read_to_string(&file).unwrap();
        let py = "import sys,json,base64; t=sys.argv[1].strip()[6:]; t+='='*(-len(t)%4); \
                  j=json.loads(base64.urlsafe_b64decode(t)); print(j['user']); print(j['password'])";
        let o = Command::new("python3").args(["-c", py, &t]).output().unwrap();
        let s = String::from_utf8_lossy(&o.stdout).to_string();
        let mut l = s.lines();
        (file, (l.next().unwrap().to_string(), l.next().unwrap().to_string()))
    }

    /// `vnetctl join` on the host, in the background: (its fingerprint, as
    /// it printed it before waiting, and the process).
    fn join(
        &self,
        token: &std::path::Path,
        dir: &str,
        wait: &str,
    ) -> (String, std::thread::JoinHandle<Output>) {
        self.join_in(&self.host, token, dir, wait)
    }

    /// [`Onboard::join`] on the machine of namespace `ns` (the admin's
    /// machine may be a host too).
    pub(super) fn join_in(
        &self,
        ns: &str,
        token: &std::path::Path,
        dir: &str,
        wait: &str,
    ) -> (String, std::thread::JoinHandle<Output>) {
        let d = self.tmp.join(dir).display().to_string();
        let c =
            self.vnetctl_cmd(ns, &["join", "--token-file", token.to_str().unwrap(), "dir", &d, "wait", wait]);
        spawn_join(c)
    }

    /// The etcd login a host that joined into `dir` has: the `etcd-user`
    /// of the `cluster` line `join` wrote and the password file it names
    /// (what its vnetd logs in with).
    pub(super) fn joined_login(&self, dir: &str) -> (String, String) {
        let d = self.tmp.join(dir);
        let conf = std::fs::read_to_string(d.join("lab.conf")).unwrap();
        let user = conf.split_whitespace().skip_while(|w| *w != "etcd-user").nth(1).unwrap();
        let pw = std::fs::read_to_string(d.join("lab.etcd-pw")).unwrap();
        (user.to_string(), pw.trim().to_string())
    }

    pub(super) fn approve(&self, host: &str, extra: &[&str]) -> Output {
        let mut args = vec!["network", "approve", &self.dir, host];
        args.extend_from_slice(extra);
        self.vnetctl(&self.admin, &args)
    }

    /// `network approve DIR HOST` at a terminal (`script`'s), answering
    /// `answer` to its question.
    fn approve_at_terminal(&self, host: &str, answer: &str) -> Output {
        let vnetctl = vnet_lab::bin("vnetctl").unwrap();
        let cmd = format!("{} network approve {} {host}", vnetctl.display(), self.dir);
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.admin, "script", "-qec", &cmd, "/dev/null"]);
        let mut child =
            c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        std::io::Write::write_all(&mut input, answer.as_bytes()).unwrap();
        let o = child.wait_with_output();
        drop(input);
        o.unwrap()
    }

    /// Waits for host `host`'s request to be in etcd; returns it.
    pub(super) fn request(&self, host: &str) -> String {
        let key = format!("/vnet-join/lab/{host}");
        wait_until(10.0, "the join request is filed", || !self.get(&key).is_empty());
        self.get(&key)
    }
}

impl Drop for Onboard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

/// Asserts `o` failed and said `want`.
fn refused(o: &Output, want: &str, what: &str) {
    let t = text(o);
    assert!(!o.status.success() && t.contains(want), "{what}: expected a refusal saying `{want}`, got: {t}");
    eprintln!("onboarding: {what}: refused: {}", t.lines().last().unwrap_or(""));
}

pub(super) fn succeeded(o: &Output, what: &str) -> String {
    let t = text(o);
    assert!(o.status.success(), "{what}: {t}");
    t
}

/// On the user pass (no data path is involved).
mod user {
    use super::*;

    #[test]
    #[ignore = "needs root, network namespaces and etcd: run with --ignored"]
    fn a_replaced_join_request_an_old_token_and_the_join_users_writes_are_refused() {
        let o = Onboard::up();
        let root = o.root();
        // The generated etcd, from its first start: no anonymous client.
        refused(
            &o.etcdctl(None, &["get", "/vnet-join/lab/h1"], None),
            "user name is empty",
            "an anonymous get",
        );
        refused(
            &o.etcdctl(None, &["put", "/vnet/lab/policy", "x"], None),
            "user name is empty",
            "an anonymous put",
        );
        succeeded(&o.etcdctl(Some(&root), &["get", "/vnet-join/lab/h1"], None), "root's get (control)");

        // The join user an older `network setup` made (write on every
        // request, a password that never expired) is gone with the first
        // token.
        let old = ("vnet-lab-join".to_string(), "old-join-pw".to_string());
        for args in [
            vec!["user", "add", "vnet-lab-join:old-join-pw"],
            vec!["role", "add", "vnet-lab-join"],
            vec!["role", "grant-permission", "vnet-lab-join", "--prefix=true", "write", "/vnet-join/lab/"],
            vec!["user", "grant-role", "vnet-lab-join", "vnet-lab-join"],
        ] {
            succeeded(&o.etcdctl(Some(&root), &args, None), "the old join user");
        }
        succeeded(
            &o.etcdctl(Some(&old), &["put", "/vnet-join/lab/h9", "x"], None),
            "the old join user (control)",
        );

        // h1 joins; the token holder replaces its request while it waits.
        let (t1, t1_user) = o.token("h1", &[]);
        refused(
            &o.etcdctl(Some(&old), &["put", "/vnet-join/lab/h9", "x"], None),
            "authentication failed",
            "the old join user",
        );
        let (fp, joining) = o.join(&t1, "h1", "60");
        let original = o.request("h1");
        // 1. Another key (a second `join` with the stolen token).
        let (fp_attacker, attacker) = o.join(&t1, "attacker", "1");
        assert_ne!(fp_attacker, fp);
        wait_until(10.0, "the attacker's request replaces h1's", || o.get("/vnet-join/lab/h1") != original);
        let theirs = o.get("/vnet-join/lab/h1");
        assert!(!attacker.join().unwrap().status.success());
        refused(&o.approve("h1", &["key", &fp]), "not the pinned", "another key's request, pinned");
        // Unpinned and unconfirmed (no terminal): not approved either.
        refused(&o.approve("h1", &[]), "not approved", "an unpinned request without --yes");
        let put_as_token = |v: &str| {
            succeeded(
                &o.etcdctl(Some(&t1_user), &["put", "/vnet-join/lab/h1"], Some(v.as_bytes())),
                "the token's put",
            )
        };
        // 2. h1's keys and signature, another address and password.
        let mut v: serde_json::Value = serde_json::from_str(&original).unwrap();
        v["addr"] = "10.77.0.66".into();
        v["password"] = "the attacker's".into();
        put_as_token(&v.to_string());
        refused(&o.approve("h1", &["key", &fp]), "signature does not verify", "another address and password");
        // 3. h1's public key with the attacker's claim key and signature.
        let a: serde_json::Value = serde_json::from_str(&theirs).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&original).unwrap();
        v["claim_key"] = a["claim_key"].clone();
        v["sig"] = a["sig"].clone();
        put_as_token(&v.to_string());
        refused(
            &o.approve("h1", &["key", &fp]),
            "signature does not verify",
            "h1's key, the attacker's claim key",
        );
        // The control: h1's own request, pinned, is approved and h1 joins.
        put_as_token(&original);
        succeeded(&o.approve("h1", &["key", &fp]), "h1's own request, pinned");
        let said = succeeded(&joining.join().unwrap(), "h1's join");
        assert!(said.contains("host h1 joined network lab"), "{said}");
        // 4. h1's own request, whole (its key, its signature), filed again
        // under a later token for h1: it names the token it was made under.
        let cert = o.get("/vnet-certs/lab/h1");
        let (_, later_user) = o.token("h1", &[]);
        succeeded(
            &o.etcdctl(Some(&later_user), &["put", "/vnet-join/lab/h1"], Some(original.as_bytes())),
            "the later token's put",
        );
        refused(
            &o.approve("h1", &["key", &fp, "replace"]),
            "earlier request filed again under a new token",
            "h1's earlier request under a later token",
        );
        assert_eq!(o.get("/vnet-certs/lab/h1"), cert, "h1 keeps its certificate");

        // A used token: its etcd user is gone; join says so.
        let again = o.vnetctl(
            &o.host,
            &["join", "--token-file", t1.to_str().unwrap(), "dir", o.tmp.join("again").to_str().unwrap()],
        );
        refused(&again, "the token was used or has expired", "a used token");
        refused(
            &o.etcdctl(Some(&t1_user), &["put", "/vnet-join/lab/h1", "x"], None),
            "authentication failed",
            "the used token's user",
        );

        // An expired token: join refuses it; its user filing a request by
        // hand is refused at approve, which deletes that user.
        let (t2, t2_user) = o.token("h2", &["ttl", "1s"]);
        wait_until(5.0, "the token expires", || {
            let j = o.vnetctl(
                &o.host,
                &[
                    "join",
                    "--token-file",
                    t2.to_str().unwrap(),
                    "dir",
                    o.tmp.join("h2x").to_str().unwrap(),
                    "wait",
                    "0",
                ],
            );
            text(&j).contains("the token expired")
        });
        succeeded(
            &o.etcdctl(Some(&t2_user), &["put", "/vnet-join/lab/h2", "{}"], None),
            "the expired token's put",
        );
        refused(&o.approve("h2", &["--yes"]), "token expired", "an expired token's request");
        refused(
            &o.etcdctl(Some(&t2_user), &["put", "/vnet-join/lab/h2", "x"], None),
            "authentication failed",
            "the expired token's user",
        );
        // The control: a new token for h2 works.
        let (t2b, _) = o.token("h2", &[]);
        let (_, joining) = o.join(&t2b, "h2", "60");
        o.request("h2");
        // Unpinned, at a terminal: shown, and approved only on `y`.
        let no = o.approve_at_terminal("h2", "n\n");
        refused(&no, "not approved", "h2 unpinned, `n` at the prompt");
        assert!(text(&no).contains("asks to join network lab: address"), "{}", text(&no));
        succeeded(&o.approve_at_terminal("h2", "y\n"), "h2 unpinned, `y` at the prompt");
        succeeded(&joining.join().unwrap(), "h2's join");

        // What a token's user may do: write its own request, nothing else.
        let (t3, t3_user) = o.token("h3", &[]);
        // A token from standard input (`--token-file -`): read, and the
        // request filed (no approval within 0 s).
        let d = o.tmp.join("h3").display().to_string();
        let mut c = o.vnetctl_cmd(&o.host, &["join", "--token-file", "-", "dir", &d, "wait", "0"]);
        let mut child =
            c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let token_text = std::fs::read(&t3).unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), &token_text).unwrap();
        let piped = child.wait_with_output().unwrap();
        assert!(
            text(&piped).contains("key fingerprint") && text(&piped).contains("not approved within 0 s"),
            "{}",
            text(&piped)
        );
        let (_, t4_user) = o.token("h4", &[]);
        succeeded(&o.etcdctl(Some(&t4_user), &["put", "/vnet-join/lab/h4", "{}"], None), "h4's token files");
        succeeded(
            &o.etcdctl(Some(&t3_user), &["put", "/vnet-join/lab/h3", "{}"], None),
            "h3's own key (control)",
        );
        let big = vec![b'x'; 1_500_000];
        refused(
            &o.etcdctl(Some(&t3_user), &["put", "/vnet-join/lab/h3"], Some(&big)),
            "request is too large",
            "a 1.5 MB value",
        );
        refused(
            &o.etcdctl(Some(&root), &["put", "/vnet-join/lab/h3"], Some(&big)),
            "request is too large",
            "root's 1.5 MB value",
        );
        succeeded(
            &o.etcdctl(Some(&root), &["put", "/x"], Some(&vec![b'x'; 1_048_576 + 4096])),
            "a policy's 1 MiB (control)",
        );
        for (args, what) in [
            (vec!["del", "/vnet-join/lab/h4"], "a delete of h4's request"),
            (vec!["get", "/vnet-join/lab/h4"], "a read of h4's request"),
            (vec!["put", "/vnet-join/lab/h4", "x"], "a put of h4's request"),
            (vec!["del", "/vnet-join/lab/", "--prefix"], "a delete of every request"),
            (vec!["put", "/vnet/lab/policy", "x"], "a put of the policy"),
            (vec!["get", "/vnet-join/lab/h3"], "a read of its own request"),
        ] {
            refused(
                &o.etcdctl(Some(&t3_user), &args, None),
                "permission denied",
                &format!("h3's token: {what}"),
            );
        }
        assert_eq!(o.get("/vnet-join/lab/h4"), "{}", "h4's request is still there");
        succeeded(&o.etcdctl(Some(&root), &["del", "/vnet-join/lab/h4"], None), "root's delete (control)");
    }

    #[test]
    #[ignore = "needs root, network namespaces and etcd: run with --ignored"]
    fn approving_a_hosts_name_needs_replace_and_network_revoke_takes_its_store_user() {
        let o = Onboard::up();
        let root = o.root();
        // A host an older approve made: the network-wide role (readwrite
        // /vnet/lab/) and its own (the read of its certificate).
        let h7 = ("vnet-lab-h7".to_string(), "h7-pw".to_string());
        for args in [
            vec!["role", "add", "vnet-lab"],
            vec!["role", "grant-permission", "vnet-lab", "--prefix=true", "readwrite", "/vnet/lab/"],
            vec!["role", "add", "vnet-lab-h7"],
            vec!["role", "grant-permission", "vnet-lab-h7", "read", "/vnet-certs/lab/h7"],
            vec!["user", "add", "vnet-lab-h7:h7-pw"],
            vec!["user", "grant-role", "vnet-lab-h7", "vnet-lab"],
            vec!["user", "grant-role", "vnet-lab-h7", "vnet-lab-h7"],
            vec!["put", "/vnet-certs/lab/h7", "old"],
        ] {
            succeeded(&o.etcdctl(Some(&root), &args, None), "the old host");
        }
        succeeded(
            &o.etcdctl(Some(&h7), &["put", "/vnet/lab/policy", "x"], None),
            "the old host's put of the policy (control)",
        );
        let said = succeeded(&o.vnetctl(&o.admin, &["network", "upgrade", &o.dir]), "network upgrade");
        eprintln!("onboarding: {}", said.trim());
        refused(
            &o.etcdctl(Some(&h7), &["put", "/vnet/lab/policy", "x"], None),
            "permission denied",
            "the upgraded host's put of the policy",
        );
        succeeded(
            &o.etcdctl(Some(&h7), &["put", "/vnet/lab/hosts/h7", "{}"], None),
            "the upgraded host's record",
        );
        succeeded(
            &o.etcdctl(Some(&h7), &["get", "/vnet-certs/lab/h7"], None),
            "the upgraded host's certificate",
        );
        refused(
            &o.etcdctl(Some(&root), &["role", "get", "vnet-lab"], None),
            "role name not found",
            "the network-wide role",
        );
        succeeded(&o.etcdctl(Some(&root), &["del", "/vnet/lab/policy"], None), "root's delete");
        let (t1, _) = o.token("h1", &[]);
        let (fp, joining) = o.join(&t1, "h1", "60");
        o.request("h1");
        succeeded(&o.approve("h1", &["key", &fp]), "h1");
        succeeded(&joining.join().unwrap(), "h1's join");
        let pw =
            |d: &str| std::fs::read_to_string(o.tmp.join(d).join("lab.etcd-pw")).unwrap().trim().to_string();
        let h1 = (vnet_cluster::layout::host_user("lab", "h1"), pw("h1"));
        // h1's store user: its own record and lease, nobody else's keys.
        let lease = succeeded(&o.etcdctl(Some(&h1), &["lease", "grant", "600"], None), "h1's lease");
        let lease = lease.split_whitespace().nth(1).unwrap().to_string();
        succeeded(
            &o.etcdctl(Some(&h1), &["put", "--lease", &lease, "/vnet/lab/hosts/h1", "{}"], None),
            "h1's record",
        );
        succeeded(&o.etcdctl(Some(&h1), &["get", "/vnet/lab/", "--prefix"], None), "h1 reads the network");
        for (args, what) in [
            (vec!["put", "/vnet/lab/policy", "x"], "the policy"),
            (vec!["put", "/vnet/lab/hosts/h2", "{}"], "another host's record"),
            (vec!["put", "/vnet/lab/revoked/hosts/h2", "x"], "a revocation"),
        ] {
            refused(&o.etcdctl(Some(&h1), &args, None), "permission denied", &format!("h1 writes {what}"));
        }

        // A newcomer asks for the name h1: refused unless `replace`.
        let old_cert = o.get("/vnet-certs/lab/h1");
        let (t1b, _) = o.token("h1", &[]);
        let (fp2, joining) = o.join(&t1b, "h1b", "60");
        o.request("h1");
        refused(&o.approve("h1", &["key", &fp2]), "is already a host", "a second h1");
        assert_eq!(o.get("/vnet-certs/lab/h1"), old_cert, "h1 keeps its certificate");
        succeeded(&o.etcdctl(Some(&h1), &["get", "/vnet-certs/lab/h1"], None), "the old h1 keeps its store");
        let said = succeeded(&o.approve("h1", &["key", &fp2, "replace"]), "the second h1, replace");
        assert!(said.contains("is revoked"), "{said}");
        succeeded(&joining.join().unwrap(), "the second h1's join");
        let revoked =
            o.etcdctl(Some(&o.root()), &["get", "/vnet/lab/revoked/certs/", "--prefix", "--keys-only"], None);
        assert!(text(&revoked).contains("/vnet/lab/revoked/certs/"), "{}", text(&revoked));
        refused(
            &o.etcdctl(Some(&h1), &["get", "/vnet-certs/lab/h1"], None),
            "authentication failed",
            "the old h1's user",
        );
        let lease_gone = o.etcdctl(Some(&o.root()), &["lease", "timetolive", &lease], None);
        assert!(text(&lease_gone).contains("already expired"), "the old h1's lease: {}", text(&lease_gone));

        // network revoke: the new h1's user, records and leases go.
        let h1b = (vnet_cluster::layout::host_user("lab", "h1"), pw("h1b"));
        let lease = succeeded(&o.etcdctl(Some(&h1b), &["lease", "grant", "600"], None), "h1's lease");
        let lease = lease.split_whitespace().nth(1).unwrap().to_string();
        succeeded(
            &o.etcdctl(Some(&h1b), &["put", "--lease", &lease, "/vnet/lab/hosts/h1", "{}"], None),
            "h1's record",
        );
        succeeded(&o.etcdctl(Some(&h1b), &["get", "/vnet-certs/lab/h1"], None), "h1's get (control)");
        let said = succeeded(&o.vnetctl(&o.admin, &["network", "revoke", &o.dir, "h1"]), "network revoke h1");
        eprintln!("onboarding: {}", said.trim());
        refused(
            &o.etcdctl(Some(&h1b), &["get", "/vnet-certs/lab/h1"], None),
            "authentication failed",
            "the revoked h1's get",
        );
        assert_eq!(o.get("/vnet/lab/hosts/h1"), "", "h1's record");
        let lease_gone = o.etcdctl(Some(&o.root()), &["lease", "timetolive", &lease], None);
        assert!(text(&lease_gone).contains("already expired"), "h1's lease: {}", text(&lease_gone));
        assert!(!o.get("/vnet/lab/revoked/hosts/h1").is_empty(), "the revocation");
        // And a revoked name is not given again.
        let (t1c, _) = o.token("h1", &[]);
        let (fp3, joining) = o.join(&t1c, "h1c", "2");
        o.request("h1");
        refused(&o.approve("h1", &["key", &fp3, "replace"]), "was revoked", "the revoked name");
        assert!(!joining.join().unwrap().status.success());

        // The users of before were `vnet-NET-HOST`: network lab's host x-h9
        // and network lab-x's host h9 (one etcd, two networks) shared one.
        // Revoking lab's x-h9 leaves lab-x's h9 its user; revoking lab's h7
        // (approved before, upgraded) takes h7's.
        let other = ("vnet-lab-x-h9".to_string(), "h9-pw".to_string());
        for args in [
            vec!["role", "add", "vnet-lab-x-h9"],
            vec!["role", "grant-permission", "vnet-lab-x-h9", "read", "/vnet-certs/lab-x/h9"],
            vec!["user", "add", "vnet-lab-x-h9:h9-pw"],
            vec!["user", "grant-role", "vnet-lab-x-h9", "vnet-lab-x-h9"],
        ] {
            succeeded(&o.etcdctl(Some(&root), &args, None), "network lab-x's host h9");
        }
        succeeded(&o.vnetctl(&o.admin, &["network", "revoke", &o.dir, "x-h9"]), "network revoke x-h9");
        succeeded(
            &o.etcdctl(Some(&other), &["get", "/vnet-certs/lab-x/h9"], None),
            "network lab-x's h9, after lab's x-h9 was revoked",
        );
        succeeded(&o.etcdctl(Some(&h7), &["get", "/vnet-certs/lab/h7"], None), "h7's get (control)");
        succeeded(&o.vnetctl(&o.admin, &["network", "revoke", &o.dir, "h7"]), "network revoke h7");
        refused(
            &o.etcdctl(Some(&h7), &["get", "/vnet-certs/lab/h7"], None),
            "authentication failed",
            "the revoked h7's user of before",
        );
    }
}
