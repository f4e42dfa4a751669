//! `vnetctl join --token-file FILE|- [host NAME] [dir DIR] [wait SECS]`: on
//! a host, its key (made here), a signed request, then `vnetd@NET` once
//! approved.

use super::request::{Asked, Request};
use super::token::{looks_like_token, Token, MAX_TOKEN_LEN};
use super::{connect, host_user, pairs, request_key, write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;
use vnet_cluster::trust::NetworkPublic;

const USAGE: &str = "usage: join --token-file FILE|- [host NAME] [dir DIR] [wait SECS]";

/// The token: from a file (a secret file: its owner's alone) or from
/// standard input (`-`); never from the command line.
fn read_token(words: &[&str]) -> Result<(Token, Vec<String>), String> {
    let rest: Vec<String> = match words {
        ["--token-file" | "token-file", _, rest @ ..] => rest.iter().map(|w| w.to_string()).collect(),
        [w, ..] if looks_like_token(w) => {
            return Err("a token on the command line is shown to every user of this host (`ps`): \
                 put it in a file only you may read and give `--token-file FILE`, or pipe it \
                 in with `--token-file -`"
                .into())
        }
        _ => return Err(USAGE.into()),
    };
    let text = match words[1] {
        "-" => {
            let mut t = String::new();
            std::io::Read::read_to_string(&mut std::io::Read::take(std::io::stdin(), MAX_TOKEN_LEN), &mut t)
                .map_err(|e| format!("reading the token from standard input: {e}"))?;
            t
        }
        f => vnet_client::keys::read_secret(Path::new(f), "the join token", MAX_TOKEN_LEN)
            .map_err(|e| e.to_string())?,
    };
    let t = Token::decode(&text).map_err(|e| e.to_string())?;
    Ok((t, rest))
}

/// The files of `network` in `dir` that say this host is in it, or began
/// joining it.
fn member_files(dir: &Path, network: &str) -> Vec<PathBuf> {
    [".conf", ".key", ".etcd-pw", ".cert"]
        .iter()
        .map(|ext| dir.join(format!("{network}{ext}")))
        .filter(|p| p.exists())
        .collect()
}

/// `join --token-file FILE|- [host NAME] [dir DIR] [wait SECS]`.
pub fn join(words: &[&str]) -> Result<String, String> {
    let (t, rest) = read_token(words)?;
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    let (mut dir, mut wait) = ("/etc/vnet".to_string(), 600u64);
    for (k, v) in pairs(&rest, &["host", "dir", "wait"])? {
        match k {
            "host" if v != t.host => {
                return Err(format!("the token is for host {}, not {v}: a token names its one host", t.host))
            }
            "host" => {}
            "dir" => dir = v.to_string(),
            _ => wait = v.parse().map_err(|_| format!("wait: expected seconds, found `{v}`"))?,
        }
    }
    t.check_time(super::unix_now()?).map_err(|e| e.to_string())?;
    let dir = PathBuf::from(dir);
    // Before any secret of this host is read or made: a token for a
    // network this host is in (or began joining) could send its secrets
    // to the token's etcd, whoever runs it.
    let there = member_files(&dir, &t.network);
    if let Some(f) = there.first() {
        return Err(format!(
            "{} exists: this host is in network {} (or began joining it); a token is not used where \
             the network's secrets are. To join anew, remove {}/{}.* first",
            f.display(),
            t.network,
            dir.display(),
            t.network
        ));
    }
    let net_pub =
        NetworkPublic::from_base64(&t.net_pub).map_err(|e| format!("the token's network key: {e}"))?;
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let f = |ext: &str| dir.join(format!("{}{ext}", t.network));
    let made = [f(".key"), f(".etcd-pw")];
    let joined = filed_and_approved(&t, &dir, wait, &net_pub);
    if joined.is_err() {
        // Not in: nothing of this attempt stays (join again with a token).
        for p in made {
            let _ = std::fs::remove_file(p);
        }
    }
    let (addr, cert) = joined?;
    let conf_file = install(&t, &dir, addr, &cert)?;
    super::start::start(&t.network, &t.host, &conf_file)
}

/// Makes the host's key and password, files the signed request (its
/// fingerprint printed first), and waits for the certificate.
fn filed_and_approved(
    t: &Token,
    dir: &Path,
    wait: u64,
    net_pub: &NetworkPublic,
) -> Result<(IpAddr, String), String> {
    let f = |ext: &str| dir.join(format!("{}{ext}", t.network));
    let private = vnet_client::keys::genkey().map_err(|e| e.to_string())?;
    vnet_client::keys::write_secret(&f(".key"), &private).map_err(|e| e.to_string())?;
    let password = vnet_client::keys::genkey().map_err(|e| e.to_string())?;
    vnet_client::keys::write_secret(&f(".etcd-pw"), &password).map_err(|e| e.to_string())?;
    let addr = super::own_address(&t.etcd)?;
    let host = t.host.as_str();
    let asked = Asked { network: &t.network, host, token: &t.id, addr, password: &password };
    let req = Request::sign(&private, asked).map_err(|e| e.to_string())?;
    let fp = req.fingerprint();
    eprintln!(
        "vnetctl join: host {host} at {addr}, key fingerprint {fp}\n\
         vnetctl join: on the admin host, after comparing it: vnetctl network approve DIR {host} key {fp}"
    );
    let user = host_user(&t.network, host);
    let cert = super::runtime()?.block_on(async {
        let at = t.etcd.as_str();
        let e = |what: &'static str| move |e: etcd_client::Error| format!("etcd at {at}: {what}: {e}");
        let login = || connect(&t.etcd, &t.ca, Some((&t.user, &t.password)));
        let mut c = super::reach::retry(at, super::reach::WAIT, login).await.map_err(|e| match super::reach::unreachable(&e) {
            true => super::reach::down(at, &e, super::reach::Start::Host),
            false => format!(
                "etcd at {at} refused the token's user ({e}): the token was used or has expired; \
                 ask the admin for a new one (vnetctl network token DIR {host})"
            ),
        })?;
        c.put(request_key(&t.network, host), req.to_json(), None).await.map_err(e("file the request"))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(wait);
        loop {
            if let Ok(mut c) = connect(&t.etcd, &t.ca, Some((&user, &password))).await {
                if let Ok(r) = c.get(super::cert_key(&t.network, host), None).await {
                    if let Some(kv) = r.kvs().first() {
                        return Ok(String::from_utf8_lossy(kv.value()).into_owned());
                    }
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "not approved within {wait} s: vnetctl network approve DIR {host} key {fp} on the admin host"
                ));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })?;
    let c = net_pub.verify(&cert).map_err(|e| format!("the certificate etcd gave: {e}"))?;
    if c.host != host || c.network != t.network || c.public_key.to_string() != req.public_key {
        return Err("the certificate etcd gave is not this host's (another name, network or key)".into());
    }
    Ok((addr, cert))
}

/// Writes the host's certificate, the network's public key, etcd's CA and
/// `NET.conf` (its `listen` line and a `cluster` line naming them all,
/// with the host key) into `dir`; returns the config's path.
fn install(t: &Token, dir: &Path, addr: IpAddr, cert: &str) -> Result<PathBuf, String> {
    let f = |ext: &str| dir.join(format!("{}{ext}", t.network));
    let host = t.host.as_str();
    let user = host_user(&t.network, host);
    write(&f(".cert"), &format!("{cert}\n"), 0o644)?;
    write(&f(".pub"), &format!("{}\n", t.net_pub), 0o644)?;
    write(&f("-etcd-ca.pem"), &t.ca, 0o644)?;
    let p = |ext: &str| f(ext).display().to_string();
    let conf = format!(
        "# Made by `vnetctl join` for host {host} of network {network}.\n\
         listen udp {listen}\n\
         cluster etcd:{etcd} network {network} host {host} etcd-ca {ca} etcd-user {user} \
         etcd-password-file {pw} network-key {pubf} host-cert {cert} key {key}\n",
        listen = SocketAddr::new(addr, 9000),
        network = t.network,
        etcd = t.etcd,
        ca = p("-etcd-ca.pem"),
        pw = p(".etcd-pw"),
        pubf = p(".pub"),
        cert = p(".cert"),
        key = p(".key"),
    );
    let conf_file = f(".conf");
    write(&conf_file, &conf, 0o640)?;
    Ok(conf_file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_in_argv_is_refused_with_the_way_to_give_it() {
        for argv in [["vnet2.eyJhIjoxfQ", "host"], ["vnet1.eyJhIjoxfQ", "host"]] {
            assert!(join(&argv).unwrap_err().contains("--token-file"), "{argv:?}");
        }
        assert!(join(&["host", "h1"]).unwrap_err().starts_with("usage"));
    }

    /// A token for a network whose files are here is refused before any
    /// secret is read or made (the positive control: an empty directory
    /// goes on, to the next check).
    #[test]
    fn a_token_for_a_network_this_host_is_in_is_refused_first() {
        let d = std::env::temp_dir().join(format!("vnetctl-join-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let t = Token {
            network: "lab".into(),
            etcd: "https://127.0.0.1:1".into(),
            ca: String::new(),
            net_pub: "not a key".into(),
            host: "h1".into(),
            user: "u".into(),
            password: "p".into(),
            expires: u64::MAX,
            id: "t".into(),
        };
        let file = d.join("token");
        vnet_client::keys::write_secret(&file, &t.encode()).unwrap();
        let words = ["--token-file", file.to_str().unwrap(), "dir", d.to_str().unwrap()];
        // Control: no network files, so it goes on (to the token's bad key).
        assert!(join(&words).unwrap_err().contains("network key"));
        vnet_client::keys::write_secret(&d.join("lab.etcd-pw"), "secret").unwrap();
        let said = join(&words).unwrap_err();
        assert!(said.contains("lab.etcd-pw exists") && said.contains("is in network lab"), "{said}");
        // An expired token is refused before anything, too.
        let old = Token { expires: 1, ..t };
        let file2 = d.join("token2");
        vnet_client::keys::write_secret(&file2, &old.encode()).unwrap();
        let said = join(&["--token-file", file2.to_str().unwrap()]).unwrap_err();
        assert!(said.contains("expired"), "{said}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
