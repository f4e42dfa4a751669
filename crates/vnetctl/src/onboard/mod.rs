//! A secured cluster without hand-written files (issues 45 and 66): two
//! commands make a network, three bring in a host.
//!
//! ```text
//! admin# vnetctl network init /root/vnet-lab network lab etcd 10.0.0.1   # keys, CA, etcd (authentication on)
//! admin# etcd --config-file /root/vnet-lab/etcd.yml &                   # the store (or a unit)
//! admin# vnetctl network token /root/vnet-lab h1 file h1.token           # a token for h1 alone, an hour
//! host#  vnetctl join --token-file h1.token   # its key, made here; prints its fingerprint, waits
//! admin# vnetctl network approve /root/vnet-lab h1 key FINGERPRINT       # verifies, signs, makes its etcd user
//! admin# vnetctl network revoke /root/vnet-lab h1                        # takes it out again
//! ```
//!
//! Why a join flow with an approval (kubeadm's `join` and ZeroTier's
//! authorize step) rather than a bundle the admin makes and copies: the
//! host's private key is made on the host and never leaves it; nothing is
//! copied but the token; and the admin decides, seeing the host's key
//! fingerprint, which hosts come in.
//!
//! How it holds together, in etcd (TLS, password authentication):
//!
//! - `root` (password in `DIR/root.pw`) runs `token`, `approve` and
//!   `revoke`. **Authentication is on from etcd's first start**: `init`
//!   runs etcd once itself ([`etcd::bootstrap`]), on a loopback port that
//!   takes only a client certificate of the network's CA (made for this in
//!   memory and never written), adds `root` and turns authentication on,
//!   stops it, and only then writes `etcd.yml`. So there is no moment
//!   when the store answers a stranger, and nothing is left for a later
//!   `setup` to close. (Client certificates for every host would do as
//!   well, but vnetd's etcd login is a user and a password.)
//! - a token ([`token`]) is an etcd user of its own that may write one key,
//!   `/vnet-join/NET/HOST`, and nothing else; it expires (an hour unless
//!   told), is used once, and is read by `join` from a file or standard
//!   input, never its command line.
//! - `join` makes the host's key and its etcd password, and files a
//!   request ([`request`]) **signed by the host's claim key over
//!   everything it asks for**: its name, the id of the token it files it
//!   under, both public keys, its address and its password. It prints the request's fingerprint before it sends
//!   anything, for the admin to pin.
//! - `approve` verifies the signature, shows the host, its address and
//!   fingerprint, and signs only with the fingerprint pinned (`key FP`) or
//!   confirmed (`--yes`, or `y` at its prompt). A request replaced while
//!   `join` waits is refused: under another key its fingerprint is not the
//!   pinned one; with any field changed its signature no longer verifies;
//!   an earlier request of the host filed again under a later token names
//!   the earlier token's id, not the outstanding one's.
//!   It makes the etcd user `vnet/NET/HOST` with the password the host
//!   chose, whose role is exactly `vnet_cluster::layout::host_grants` and
//!   the read of the host's certificate at `/vnet-certs/NET/HOST`; the
//!   network's policy and revocations only root writes. A name that is
//!   already a host is refused unless the admin says `replace`.
//! - `join` polls by logging in as that user: once it can, it reads its
//!   certificate, checks it against the network key and its own key,
//!   writes `/etc/vnet/NET.conf` and the files it names, and starts
//!   `vnetd@NET`.
//!
//! Why the request carries the password and not a hash of it: etcd's API
//! takes a bcrypt hash (`hashedPassword`, etcd 3.5), but the etcd client
//! vnetctl uses cannot send one, and etcd 3.4 (Debian's) has none. Having
//! `approve` make the password and send it back encrypted to the host's
//! key would need an encryption scheme put together here (X25519, a KDF, an
//! AEAD): the kind of home-made cryptography we avoid. So the host sends
//! its password, which the signature binds to its key (a token holder
//! cannot substitute theirs), over TLS, to a key only root reads (the join
//! user may write it, not read it), and `approve` deletes the request.
//!
//! What a token holder can do: file and overwrite that one host's request
//! (refused at `approve` unless signed by the pinned key), write values up
//! to etcd's request limit to that one key (`max-request-bytes`, with a
//! backend quota and hourly compaction: see [`etcd`]). It cannot read
//! anything, touch another request, or join by itself.

mod admin;
mod etcd;
mod join;
mod reach;
mod request;
mod start;
mod token;

pub use admin::{approve, make_token, revoke, upgrade};
pub use etcd::init;
pub use join::join;

use etcd_client::{Certificate, Client, ConnectOptions, TlsOptions};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;
use vnet_cluster::layout::host_user;
use vnet_cluster::trust::NetworkKey;

/// What the admin's directory says of the network (`DIR/network.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Network {
    network: String,
    /// etcd's client URL (`https://IP:2379`).
    etcd: String,
    /// The admin's client certificate and its key (PEM files), for an
    /// etcd that requires one (`--client-cert-auth`, as the hand-made
    /// etcd of `docs/CLUSTER.md` does); the etcd `init` makes does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_cert: Option<std::path::PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_key: Option<std::path::PathBuf>,
}

/// etcd's client port.
const ETCD_PORT: u16 = 2379;

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
            _ => Err("no words".to_string()),
        })
        .collect()
}

async fn connect_tls(
    url: &str,
    tls: TlsOptions,
    user: Option<(&str, &str)>,
) -> Result<Client, etcd_client::Error> {
    let mut o = ConnectOptions::new()
        .with_tls(tls)
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5));
    if let Some((u, p)) = user {
        o = o.with_user(u, p);
    }
    Client::connect([url], Some(o)).await
}

async fn connect(url: &str, ca_pem: &str, user: Option<(&str, &str)>) -> Result<Client, etcd_client::Error> {
    connect_tls(url, TlsOptions::new().ca_certificate(Certificate::from_pem(ca_pem.as_bytes())), user).await
}

/// How the admin reaches the network's etcd: its CA, and its client
/// certificate if `network.json` names one.
fn admin_tls(n: &Network, ca_pem: &str) -> Result<TlsOptions, String> {
    let tls = TlsOptions::new().ca_certificate(Certificate::from_pem(ca_pem.as_bytes()));
    let (Some(cert), Some(key)) = (&n.client_cert, &n.client_key) else { return Ok(tls) };
    let key_pem = vnet_client::keys::read_secret(key, "the admin's etcd client key", 64 * 1024)
        .map_err(|e| e.to_string())?;
    Ok(tls.identity(etcd_client::Identity::from_pem(read(cert)?, key_pem)))
}

/// Where `approve` hands a host its certificate (its user reads it).
fn cert_key(network: &str, host: &str) -> String {
    format!("/vnet-certs/{network}/{host}")
}

/// Where a host files its request (its token's user writes it).
fn request_key(network: &str, host: &str) -> String {
    format!("/vnet-join/{network}/{host}")
}

fn unix_now() -> Result<u64, String> {
    Ok(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs())
}

/// A host name `token`, `approve` and `revoke` take: a name, and not one
/// vnet's own etcd users would collide with.
fn check_host(host: &str) -> Result<(), String> {
    if !vnet_cluster::layout::valid_name(host) {
        return Err(format!("host `{host}`: 1 to 63 of A-Za-z0-9._-"));
    }
    if token::reserved(host) {
        return Err(format!(
            "host `{host}`: reserved (`root`, `join` and `join-*` would collide with the etcd users vnet makes)"
        ));
    }
    Ok(())
}

fn load(dir: &Path) -> Result<(Network, String, String), String> {
    let n: Network = serde_json::from_str(&read(&dir.join("network.json"))?)
        .map_err(|e| format!("{}: {e}", dir.join("network.json").display()))?;
    if n.client_cert.is_some() != n.client_key.is_some() {
        return Err(format!(
            "{}: client_cert and client_key go together",
            dir.join("network.json").display()
        ));
    }
    let ca = read(&dir.join("ca.pem"))?;
    let root_pw = vnet_client::keys::read_secret(&dir.join("root.pw"), "the root password", 4096)
        .map_err(|e| e.to_string())?;
    Ok((n, ca, root_pw.trim().to_string()))
}

fn network_key(dir: &Path) -> Result<NetworkKey, String> {
    let text = vnet_client::keys::read_secret(&dir.join("net.key"), "the network key", 1024)
        .map_err(|e| e.to_string())?;
    NetworkKey::from_base64(&text).map_err(|e| format!("{}: {e}", dir.join("net.key").display()))
}

/// `network setup DIR`: for a directory an older `init` made (its etcd
/// without authentication until now): etcd's root and authentication on.
/// A network `init` made has both from etcd's first start: nothing to do.
pub fn setup(dir: &str) -> Result<String, String> {
    let dir = Path::new(dir);
    let (n, ca, root_pw) = load(dir)?;
    let tls = admin_tls(&n, &ca)?;
    runtime()?.block_on(async {
        // Waits for etcd (just started, say) a few seconds, not more.
        match reach::retry(&n.etcd, reach::WAIT, || {
            connect_tls(&n.etcd, tls.clone(), Some(("root", &root_pw)))
        })
        .await
        {
            Ok(_) => {
                return Ok(format!(
                    "etcd at {}: root logs in, authentication is on; nothing to do \
                     (a host's token: vnetctl network token {} HOST)",
                    n.etcd,
                    dir.display()
                ))
            }
            Err(e) if e.to_string().contains("authentication is not enabled") => {}
            Err(e) if reach::unreachable(&e) => {
                return Err(reach::down(&n.etcd, &e, reach::Start::Admin(dir)))
            }
            Err(e) => return Err(format!("etcd at {} as root: {e}", n.etcd)),
        }
        let e = |what: &'static str| move |e: etcd_client::Error| format!("etcd: {what}: {e}");
        let mut c = connect_tls(&n.etcd, tls, None).await.map_err(|e| format!("etcd at {}: {e}", n.etcd))?;
        c.user_add("root", root_pw.as_str(), None).await.map_err(e("user add root"))?;
        c.role_add("root").await.ok();
        c.user_grant_role("root", "root").await.map_err(e("grant root"))?;
        c.auth_enable().await.map_err(e("auth enable"))?;
        Ok(format!("etcd at {}: root made, authentication on", n.etcd))
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_pair_up_and_strangers_are_named() {
        assert_eq!(pairs(&["network", "lab", "etcd", "10.0.0.1"], &["network", "etcd"]).unwrap().len(), 2);
        assert!(pairs(&["netwrk", "lab"], &["network"]).unwrap_err().contains("`netwrk`"));
        assert!(pairs(&["network"], &["network"]).unwrap_err().contains("needs a value"));
    }

    /// `network setup` with etcd not running: an answer within the wait
    /// (not 30 s), naming the address and the command that starts etcd.
    #[test]
    fn setup_without_etcd_says_which_address_and_how_to_start_it() {
        let d = std::env::temp_dir().join(format!("vnetctl-setup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let ds = d.display().to_string();
        let at = format!("127.0.0.1:{port}");
        etcd::make(&ds, &["network", "lab", "etcd", at.as_str()]).unwrap();
        let t0 = std::time::Instant::now();
        let said = setup(&ds).unwrap_err();
        let took = t0.elapsed();
        assert!(took < reach::WAIT + Duration::from_secs(5), "{took:?}");
        for want in [
            format!("https://127.0.0.1:{port}"),
            "is it running?".into(),
            format!("etcd --config-file {ds}/etcd.yml"),
        ] {
            assert!(said.contains(&want), "{want}: {said}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn reserved_and_bad_host_names_are_refused() {
        assert!(check_host("h1").is_ok());
        for h in ["join", "root", "join-h1"] {
            assert!(check_host(h).unwrap_err().contains("reserved"), "{h}");
        }
        assert!(check_host("a/b").is_err());
    }
}
