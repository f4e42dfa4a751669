//! A secured cluster without hand-written files (issue 45): three commands
//! make a network, two bring in a host.
//!
//! ```text
//! admin# vnetctl network init /root/vnet-lab network lab etcd 10.0.0.1   # keys, CA, etcd's certificate and config
//! admin# etcd --config-file /root/vnet-lab/etcd.yml &                   # the store (or a unit)
//! admin# vnetctl network setup /root/vnet-lab                           # etcd's users and roles; prints the join token
//! host#  vnetctl join TOKEN host h1        # the host's key, made here; waits for approval, then starts vnetd@lab
//! admin# vnetctl network approve /root/vnet-lab h1                       # signs h1's certificate, makes its etcd user
//! ```
//!
//! Why a join flow with an approval (kubeadm's `join` and ZeroTier's
//! authorize step) rather than a bundle the admin makes and copies: the
//! host's private key is made on the host and never leaves it; nothing is
//! copied but one line of text; and the admin decides, seeing the host's
//! key fingerprint, which hosts come in.
//!
//! How it holds together, in etcd (TLS, password authentication):
//!
//! - `root` (password in `DIR/root.pw`) runs `setup` and `approve`;
//! - the join user (its password in the token) may only **write** under
//!   `/vnet-join/NET/`: a token holder files a request (its public key,
//!   claim key, address and the password it chose for itself) but reads
//!   nobody's;
//! - `approve` signs the host's certificate with the network key, makes
//!   the etcd user `vnet-NET-HOST` with the password the host chose (so no
//!   secret travels back), grants it the network's role (readwrite
//!   `/vnet/NET/`) and the read of its own certificate at
//!   `/vnet-certs/NET/HOST`, and deletes the request;
//! - `join` polls by logging in as that user: once it can, it reads its
//!   certificate, checks it against the network key and its own key,
//!   writes `/etc/vnet/NET.conf` (a `cluster` line with every setting and
//!   the `key`) and the files it names, and starts `vnetd@NET`.
//!
//! What a token holder can do: file requests (the admin sees each one's key
//! fingerprint, which `join` prints on the host, before approving), and
//! overwrite a pending request of the same host name (the fingerprints
//! then differ). It cannot read the network's records or join by itself.

use base64::Engine;
use etcd_client::{Certificate, Client, ConnectOptions, Permission, TlsOptions};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;
use vnet_cluster::trust::{CertBody, NetworkKey, NetworkPublic};

/// What the admin's directory says of the network (`DIR/network.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Network {
    network: String,
    /// etcd's client URL (`https://IP:2379`).
    etcd: String,
}

/// What a join token carries.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Token {
    network: String,
    etcd: String,
    /// The CA of etcd's certificate (PEM).
    ca: String,
    /// The network's public key.
    net_pub: String,
    user: String,
    password: String,
}

/// A host's request to join (`/vnet-join/NET/HOST`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Request {
    public_key: String,
    claim_key: String,
    addr: IpAddr,
    /// The etcd password the host chose for itself.
    password: String,
}

const TOKEN_PREFIX: &str = "vnet1.";
/// etcd's client port.
const ETCD_PORT: u16 = 2379;
/// How long certificates made by `approve` run.
const CERT_DAYS: u64 = 365;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())
}

fn write(path: &Path, text: &str, mode: u32) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(text.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))?;
    // The mode of a file that was there already, too.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// `words` as `key value` pairs, each key one of `keys`.
fn pairs<'a>(words: &[&'a str], keys: &[&str]) -> Result<Vec<(&'a str, &'a str)>, String> {
    words
        .chunks(2)
        .map(|p| match p {
            [k, v] if keys.contains(k) => Ok((*k, *v)),
            [k, _] => Err(format!("expected {}, found `{k}`", keys.join(", "))),
            [k] => Err(format!("`{k}` needs a value")),
            _ => unreachable!("chunks of two"),
        })
        .collect()
}

fn tls(ca_pem: &str) -> TlsOptions {
    TlsOptions::new().ca_certificate(Certificate::from_pem(ca_pem.as_bytes()))
}

async fn connect(url: &str, ca_pem: &str, user: Option<(&str, &str)>) -> Result<Client, etcd_client::Error> {
    let mut o = ConnectOptions::new()
        .with_tls(tls(ca_pem))
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5));
    if let Some((u, p)) = user {
        o = o.with_user(u, p);
    }
    Client::connect([url], Some(o)).await
}

fn role(network: &str) -> String {
    format!("vnet-{network}")
}

fn host_user(network: &str, host: &str) -> String {
    format!("vnet-{network}-{host}")
}

fn join_user(network: &str) -> String {
    format!("vnet-{network}-join")
}

/// SHA-256 of a public key's bytes, 16 hex digits: what `join` prints on
/// the host and `approve` on the admin's, to compare.
fn fingerprint(key: &str) -> String {
    vnet_cluster::trust::cert_id(key)[..16].to_string()
}

/// `network init DIR network NAME etcd IP[:PORT]`.
pub fn init(dir: &str, words: &[&str]) -> Result<String, String> {
    let (mut network, mut etcd) = (None, None);
    for (k, v) in pairs(words, &["network", "etcd"])? {
        match k {
            "network" => network = Some(v.to_string()),
            _ => etcd = Some(v.to_string()),
        }
    }
    let network = network.ok_or("`network NAME`: the network's name")?;
    if !vnet_cluster::layout::valid_name(&network) {
        return Err(format!("network `{network}`: 1 to 63 of A-Za-z0-9._-"));
    }
    let etcd = etcd.ok_or("`etcd IP[:PORT]`: the address etcd serves hosts on")?;
    let addr: SocketAddr = etcd
        .parse()
        .or_else(|_| etcd.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, ETCD_PORT)))
        .map_err(|_| format!("etcd `{etcd}`: expected an IP address, with a port or not"))?;
    let dir = Path::new(dir);
    if dir.exists() && std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?.next().is_some()
    {
        return Err(format!(
            "{}: not empty (a network is made once; `setup` and `approve` use it)",
            dir.display()
        ));
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let f = |n: &str| dir.join(n);
    // The network key: it signs every host's certificate.
    let nk = NetworkKey::generate().map_err(|e| e.to_string())?;
    write(&f("net.key"), &format!("{}\n", nk.secret()), 0o600)?;
    write(&f("net.pub"), &format!("{}\n", nk.public()), 0o644)?;
    // etcd's CA and server certificate (for the address hosts dial).
    let e = |e: rcgen::Error| format!("certificate: {e}");
    let ca_key = rcgen::KeyPair::generate().map_err(e)?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(e)?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name.push(rcgen::DnType::CommonName, format!("vnet {network} etcd CA"));
    ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
    let ca_pem = ca.self_signed(&ca_key).map_err(e)?.pem();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().map_err(e)?;
    let mut p = rcgen::CertificateParams::new(vec![addr.ip().to_string(), "localhost".into()]).map_err(e)?;
    p.distinguished_name.push(rcgen::DnType::CommonName, format!("vnet {network} etcd"));
    p.extended_key_usages =
        vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth, rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let server = p.signed_by(&key, &issuer).map_err(e)?;
    write(&f("ca.pem"), &ca_pem, 0o644)?;
    write(&f("ca.key"), &issuer.key().serialize_pem(), 0o600)?;
    write(&f("etcd.pem"), &server.pem(), 0o644)?;
    write(&f("etcd.key"), &key.serialize_pem(), 0o600)?;
    let root_pw = vnet_client::keys::genkey().map_err(|e| e.to_string())?;
    write(&f("root.pw"), &format!("{root_pw}\n"), 0o600)?;
    let url = format!("https://{addr}");
    let peer = "http://127.0.0.1:2380";
    let d = dir.display();
    let yml = format!(
        "# etcd for vnet network {network}: `etcd --config-file {d}/etcd.yml`\n\
         name: vnet-{network}\n\
         data-dir: {d}/etcd-data\n\
         listen-client-urls: {url}\n\
         advertise-client-urls: {url}\n\
         listen-peer-urls: {peer}\n\
         initial-advertise-peer-urls: {peer}\n\
         initial-cluster: vnet-{network}={peer}\n\
         client-transport-security:\n  cert-file: {d}/etcd.pem\n  key-file: {d}/etcd.key\n"
    );
    write(&f("etcd.yml"), &yml, 0o600)?;
    let n = Network { network: network.clone(), etcd: url };
    write(&f("network.json"), &serde_json::to_string_pretty(&n).map_err(|e| e.to_string())?, 0o600)?;
    Ok(format!(
        "network {network} made in {d} (network key, etcd's CA and certificate for {addr})\n\
         next: etcd --config-file {d}/etcd.yml, then: vnetctl network setup {d}"
    ))
}

fn load(dir: &Path) -> Result<(Network, String, String), String> {
    let n: Network = serde_json::from_str(&read(&dir.join("network.json"))?)
        .map_err(|e| format!("{}: {e}", dir.join("network.json").display()))?;
    let ca = read(&dir.join("ca.pem"))?;
    let root_pw = vnet_client::keys::read_secret(&dir.join("root.pw"), "the root password", 4096)
        .map_err(|e| e.to_string())?;
    Ok((n, ca, root_pw.trim().to_string()))
}

/// `network setup DIR`: etcd's root, the network's role and the join user,
/// authentication on; prints the join token. Run again, it prints the
/// token again.
pub fn setup(dir: &str) -> Result<String, String> {
    let dir = Path::new(dir);
    let (n, ca, root_pw) = load(dir)?;
    let join_pw_file = dir.join("join.pw");
    let rt = runtime()?;
    rt.block_on(async {
        // Waits for etcd (just started, say) for up to 30 s.
        let mut last = String::new();
        for _ in 0..60 {
            match connect(&n.etcd, &ca, None).await {
                Ok(mut c) => match c.status().await {
                    Ok(_) => {
                        last.clear();
                        break;
                    }
                    Err(e) => last = e.to_string(),
                },
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if !last.is_empty() {
            return Err(format!("etcd at {}: {last}", n.etcd));
        }
        if join_pw_file.exists() {
            return Ok(());
        }
        let e = |what: &'static str| move |e: etcd_client::Error| format!("etcd: {what}: {e}");
        let mut c = connect(&n.etcd, &ca, None).await.map_err(e("connect"))?;
        c.user_add("root", root_pw.as_str(), None).await.map_err(e("user add root"))?;
        c.role_add("root").await.ok();
        c.user_grant_role("root", "root").await.map_err(e("grant root"))?;
        let net_role = role(&n.network);
        c.role_add(net_role.as_str()).await.map_err(e("role add"))?;
        let prefix = format!("/vnet/{}/", n.network);
        c.role_grant_permission(net_role.as_str(), Permission::read_write(prefix).with_prefix())
            .await
            .map_err(e("grant the network's prefix"))?;
        let join = join_user(&n.network);
        let join_role = join.clone();
        c.role_add(join_role.as_str()).await.map_err(e("role add join"))?;
        let requests = format!("/vnet-join/{}/", n.network);
        c.role_grant_permission(join_role.as_str(), Permission::write(requests).with_prefix())
            .await
            .map_err(e("grant the join requests"))?;
        let join_pw = vnet_client::keys::genkey().map_err(|e| e.to_string())?;
        c.user_add(join.as_str(), join_pw.as_str(), None).await.map_err(e("user add join"))?;
        c.user_grant_role(join.as_str(), join_role.as_str()).await.map_err(e("grant join"))?;
        c.auth_enable().await.map_err(e("auth enable"))?;
        write(&join_pw_file, &format!("{join_pw}\n"), 0o600)
    })?;
    let t = Token {
        network: n.network.clone(),
        etcd: n.etcd.clone(),
        ca,
        net_pub: read(&dir.join("net.pub"))?.trim().to_string(),
        user: join_user(&n.network),
        password: vnet_client::keys::read_secret(&join_pw_file, "the join password", 4096)
            .map_err(|e| e.to_string())?
            .trim()
            .to_string(),
    };
    let token = format!("{TOKEN_PREFIX}{}", b64().encode(serde_json::to_vec(&t).map_err(|e| e.to_string())?));
    Ok(token)
}

/// The address this host reaches `url`'s host from (a UDP socket's
/// source, no datagram sent).
fn own_address(url: &str) -> Result<IpAddr, String> {
    let hostport = url.strip_prefix("https://").unwrap_or(url);
    let target: SocketAddr = hostport.parse().map_err(|_| format!("etcd `{url}`: not ADDRESS:PORT"))?;
    let bind: SocketAddr =
        if target.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().map_err(|_| "bind")?;
    let s = std::net::UdpSocket::bind(bind).map_err(|e| e.to_string())?;
    s.connect(target).map_err(|e| format!("no route to etcd at {target}: {e}"))?;
    Ok(s.local_addr().map_err(|e| e.to_string())?.ip())
}

/// `join TOKEN host NAME [dir DIR] [wait SECS]`.
pub fn join(token: &str, words: &[&str]) -> Result<String, String> {
    let (mut host, mut dir, mut wait) = (None, "/etc/vnet".to_string(), 600u64);
    for (k, v) in pairs(words, &["host", "dir", "wait"])? {
        match k {
            "host" => host = Some(v.to_string()),
            "dir" => dir = v.to_string(),
            _ => wait = v.parse().map_err(|_| format!("wait: expected seconds, found `{v}`"))?,
        }
    }
    let host = host.ok_or("`host NAME`: this host's name in the network")?;
    if !vnet_cluster::layout::valid_name(&host) {
        return Err(format!("host `{host}`: 1 to 63 of A-Za-z0-9._-"));
    }
    let raw =
        token.strip_prefix(TOKEN_PREFIX).ok_or("not a join token (`vnetctl network setup` prints one)")?;
    let t: Token = serde_json::from_slice(&b64().decode(raw.trim()).map_err(|_| "the token is not base64")?)
        .map_err(|e| format!("the token: {e}"))?;
    let net_pub =
        NetworkPublic::from_base64(&t.net_pub).map_err(|e| format!("the token's network key: {e}"))?;
    let dir = PathBuf::from(dir);
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let f = |ext: &str| dir.join(format!("{}{ext}", t.network));
    // The host key: made here, kept here.
    let private = kept_or_new(&f(".key"), "the host key", 1024, |p, k| {
        vnet_client::keys::write_secret(p, k).map_err(|e| e.to_string())
    })?;
    let public_key = vnet_client::keys::pubkey(&private).map_err(|e| e.to_string())?;
    let claim_key = vnet_client::keys::claim_pubkey(&private).map_err(|e| e.to_string())?;
    let addr = own_address(&t.etcd)?;
    let password =
        kept_or_new(&f(".etcd-pw"), "the etcd password", 4096, |p, k| write(p, &format!("{k}\n"), 0o600))?
            .trim()
            .to_string();
    let req = Request { public_key: public_key.clone(), claim_key, addr, password: password.clone() };
    let user = host_user(&t.network, &host);
    eprintln!(
        "vnetctl join: host {host} at {addr}, key {public_key} (fingerprint {}); waiting for approval: \
         on the admin host, vnetctl network approve DIR {host}",
        fingerprint(&public_key)
    );
    let rt = runtime()?;
    let cert = rt.block_on(async {
        let at = t.etcd.as_str();
        let e = |what: &'static str| move |e: etcd_client::Error| format!("etcd at {at}: {what}: {e}");
        let mut c =
            connect(&t.etcd, &t.ca, Some((&t.user, &t.password))).await.map_err(e("the join user"))?;
        let key = format!("/vnet-join/{}/{host}", t.network);
        c.put(key, serde_json::to_vec(&req).map_err(|e| e.to_string())?, None)
            .await
            .map_err(e("file the request"))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(wait);
        loop {
            if let Ok(mut c) = connect(&t.etcd, &t.ca, Some((&user, &password))).await {
                let key = format!("/vnet-certs/{}/{host}", t.network);
                if let Ok(r) = c.get(key, None).await {
                    if let Some(kv) = r.kvs().first() {
                        return Ok(String::from_utf8_lossy(kv.value()).into_owned());
                    }
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "not approved within {wait} s: vnetctl network approve DIR {host} on the admin host"
                ));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })?;
    let c = net_pub.verify(&cert).map_err(|e| format!("the certificate etcd gave: {e}"))?;
    if c.host != host || c.network != t.network || c.public_key.to_string() != public_key {
        return Err("the certificate etcd gave is not this host's (another name, network or key)".into());
    }
    let conf_file = install(&t, &dir, &host, addr, &cert)?;
    let unit = format!("vnetd@{}", t.network);
    let started = std::process::Command::new("systemctl").args(["enable", "--now", &unit]).status();
    let how = match started {
        Ok(s) if s.success() => format!("{unit} started"),
        Ok(s) => return Err(format!("systemctl enable --now {unit}: {s}")),
        Err(_) => format!("no systemctl here: start it with vnetd --config {}", conf_file.display()),
    };
    Ok(format!("host {host} joined network {}: {} written; {how}", t.network, conf_file.display()))
}

/// The secret in `file` (`what` it is, at most `max` bytes), or a new
/// random one, written there by `save`.
fn kept_or_new(
    file: &Path,
    what: &str,
    max: u64,
    save: impl FnOnce(&Path, &str) -> Result<(), String>,
) -> Result<String, String> {
    if file.exists() {
        return vnet_client::keys::read_secret(file, what, max).map_err(|e| e.to_string());
    }
    let k = vnet_client::keys::genkey().map_err(|e| e.to_string())?;
    save(file, &k)?;
    Ok(k)
}

/// Writes the host's certificate, the network's public key, etcd's CA and
/// `NET.conf` (its `listen` line and a `cluster` line naming them all,
/// with the host key) into `dir`; returns the config's path.
fn install(t: &Token, dir: &Path, host: &str, addr: IpAddr, cert: &str) -> Result<PathBuf, String> {
    let f = |ext: &str| dir.join(format!("{}{ext}", t.network));
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

/// `network approve DIR HOST [key FINGERPRINT]`.
pub fn approve(dir: &str, host: &str, words: &[&str]) -> Result<String, String> {
    let dir = Path::new(dir);
    let (n, ca, root_pw) = load(dir)?;
    let pinned = pairs(words, &["key"])?.first().map(|(_, v)| v.to_string());
    let nk_text = vnet_client::keys::read_secret(&dir.join("net.key"), "the network key", 1024)
        .map_err(|e| e.to_string())?;
    let nk =
        NetworkKey::from_base64(&nk_text).map_err(|e| format!("{}: {e}", dir.join("net.key").display()))?;
    if !vnet_cluster::layout::valid_name(host) {
        return Err(format!("host `{host}`: 1 to 63 of A-Za-z0-9._-"));
    }
    let rt = runtime()?;
    rt.block_on(async {
        let at = n.etcd.as_str();
        let e = |what: &'static str| move |e: etcd_client::Error| format!("etcd at {at}: {what}: {e}");
        let mut c = connect(&n.etcd, &ca, Some(("root", &root_pw))).await.map_err(e("root"))?;
        let key = format!("/vnet-join/{}/{host}", n.network);
        let r = c.get(key.as_str(), None).await.map_err(e("read the request"))?;
        let Some(kv) = r.kvs().first() else {
            return Err(format!("no request from host {host} (vnetctl join TOKEN host {host} on it)"));
        };
        let req: Request = serde_json::from_slice(kv.value()).map_err(|e| format!("{key}: {e}"))?;
        let print = fingerprint(&req.public_key);
        if let Some(p) = pinned.as_deref().filter(|p| **p != print) {
            return Err(format!("host {host}'s request has key fingerprint {print}, not {p}: not approved"));
        }
        let not_after = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| e.to_string())?
            .as_secs()
            + CERT_DAYS * 86_400;
        let prefix = match req.addr {
            IpAddr::V4(a) => format!("{a}/32"),
            IpAddr::V6(a) => format!("{a}/128"),
        };
        let body = CertBody {
            network: n.network.clone(),
            host: host.to_string(),
            public_key: req.public_key.clone(),
            claim_key: req.claim_key.clone(),
            addrs: vec![prefix],
            groups: Vec::new(),
            not_after: Some(not_after),
        };
        let cert = nk.sign(&body).map_err(|e| format!("host {host}'s request: {e}"))?;
        let user = host_user(&n.network, host);
        if c.user_add(user.as_str(), req.password.as_str(), None).await.is_err() {
            c.user_change_password(user.as_str(), req.password.as_str())
                .await
                .map_err(e("set the host's password"))?;
        }
        c.user_grant_role(user.as_str(), role(&n.network)).await.map_err(e("grant the network's role"))?;
        let own = user.clone();
        c.role_add(own.as_str()).await.ok();
        let cert_key = format!("/vnet-certs/{}/{host}", n.network);
        c.role_grant_permission(own.as_str(), Permission::read(cert_key.as_str()))
            .await
            .map_err(e("grant its certificate"))?;
        c.user_grant_role(user.as_str(), own.as_str()).await.map_err(e("grant its own role"))?;
        c.put(cert_key.as_str(), cert, None).await.map_err(e("write the certificate"))?;
        c.delete(key.as_str(), None).await.map_err(e("delete the request"))?;
        Ok(format!(
            "approved host {host} at {} (key fingerprint {print}); its certificate runs {CERT_DAYS} days",
            req.addr
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_pair_up_and_strangers_are_named() {
        assert_eq!(pairs(&["network", "lab", "etcd", "10.0.0.1"], &["network", "etcd"]).unwrap().len(), 2);
        assert!(pairs(&["netwrk", "lab"], &["network"]).unwrap_err().contains("`netwrk`"));
        assert!(pairs(&["network"], &["network"]).unwrap_err().contains("needs a value"));
    }

    #[test]
    fn init_makes_the_files_with_their_modes_and_refuses_a_used_directory() {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("vnetctl-init-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let ds = d.display().to_string();
        let said = init(&ds, &["network", "lab", "etcd", "10.9.0.1"]).unwrap();
        assert!(said.contains("etcd --config-file"), "{said}");
        let mode = |n: &str| std::fs::metadata(d.join(n)).unwrap().permissions().mode() & 0o777;
        for (n, m) in [
            ("net.key", 0o600),
            ("ca.key", 0o600),
            ("etcd.key", 0o600),
            ("root.pw", 0o600),
            ("net.pub", 0o644),
        ] {
            assert_eq!(mode(n), m, "{n}");
        }
        let yml = std::fs::read_to_string(d.join("etcd.yml")).unwrap();
        assert!(yml.contains("listen-client-urls: https://10.9.0.1:2379"), "{yml}");
        assert!(init(&ds, &["network", "lab", "etcd", "10.9.0.1"]).unwrap_err().contains("not empty"));
        assert!(join("nonsense", &["host", "h1"]).unwrap_err().contains("not a join token"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
