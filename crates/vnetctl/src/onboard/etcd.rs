//! The network's etcd, as `network init` makes it: its CA and
//! certificate, its configuration, and its first start with
//! authentication on.
//!
//! The configuration ([`config`]) bounds what any writer can make it
//! hold: a 2 GiB backend quota (past it etcd raises its NOSPACE alarm and
//! refuses writes, instead of filling the disk), compaction of history
//! older than an hour, and a request limit of 1.25 MiB, above the largest
//! value vnet writes (a signed policy, at most 1 MiB:
//! `vnet_cluster::trust::MAX_POLICY_LEN`) and below etcd's default of
//! 1.5 MiB, so a 1.5 MB value is refused. Its peer port is on loopback
//! and takes only a certificate of the network's CA.
//!
//! Authentication from the first start ([`bootstrap`]): `init` runs etcd
//! itself on a free loopback port whose clients must show a certificate
//! of the network's CA (one made in memory for `init` alone), adds `root`
//! with the password in `root.pw`, turns authentication on, and stops it;
//! only then is `etcd.yml` written. The data directory etcd starts from
//! has authentication on before any client but `init` could ever reach it.

use super::{pairs, write, Network, ETCD_PORT};
use etcd_client::{Certificate, Identity, TlsOptions};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;
use vnet_cluster::trust::NetworkKey;

/// The backend's size limit.
pub const QUOTA_BACKEND_BYTES: u64 = 2 << 30;
/// The largest request etcd takes (a signed policy's 1 MiB fits).
pub const MAX_REQUEST_BYTES: u64 = 1280 * 1024;
/// The peer URL (loopback: one member).
const PEER: &str = "https://127.0.0.1:2380";

/// What `init` made, for the bootstrap.
pub struct Made {
    pub network: String,
    pub dir: PathBuf,
    /// etcd's client URL for the hosts.
    pub url: String,
    ca_pem: String,
    /// A client certificate and key of the CA, in memory only: the
    /// bootstrap's one client.
    client: (String, String),
    root_pw: String,
}

/// etcd's configuration: for the hosts at `url`, or, with `bootstrap`'s
/// loopback URL, for `init`'s first start (clients need a certificate).
pub fn config(network: &str, dir: &Path, url: &str, bootstrap: Option<&str>) -> String {
    let d = dir.display();
    let listen = bootstrap.unwrap_or(url);
    let client_auth = if bootstrap.is_some() {
        format!("  client-cert-auth: true\n  trusted-ca-file: {d}/ca.pem\n")
    } else {
        String::new()
    };
    format!(
        "# etcd for vnet network {network}: `etcd --config-file {d}/etcd.yml`\n\
         name: vnet-{network}\n\
         data-dir: {d}/etcd-data\n\
         listen-client-urls: {listen}\n\
         advertise-client-urls: {listen}\n\
         listen-peer-urls: {PEER}\n\
         initial-advertise-peer-urls: {PEER}\n\
         initial-cluster: vnet-{network}={PEER}\n\
         client-transport-security:\n  cert-file: {d}/etcd.pem\n  key-file: {d}/etcd.key\n{client_auth}\
         peer-transport-security:\n  cert-file: {d}/etcd.pem\n  key-file: {d}/etcd.key\n  \
         client-cert-auth: true\n  trusted-ca-file: {d}/ca.pem\n\
         # Bounds (vnetctl's onboard/etcd.rs says why these).\n\
         quota-backend-bytes: {QUOTA_BACKEND_BYTES}\n\
         auto-compaction-mode: periodic\n\
         auto-compaction-retention: \"1h\"\n\
         max-request-bytes: {MAX_REQUEST_BYTES}\n"
    )
}

/// `network init`'s files: the network key, etcd's CA and certificate, the
/// root password, `network.json` (not yet `etcd.yml`).
pub fn make(dir: &str, words: &[&str]) -> Result<Made, String> {
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
            "{}: not empty (a network is made once; `token`, `approve` and `revoke` use it)",
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
    let (ca_pem, client) = certificates(dir, &network, addr)?;
    let root_pw = vnet_client::keys::genkey().map_err(|e| e.to_string())?;
    write(&f("root.pw"), &format!("{root_pw}\n"), 0o600)?;
    let url = format!("https://{addr}");
    let n = Network { network: network.clone(), etcd: url.clone(), client_cert: None, client_key: None };
    write(&f("network.json"), &serde_json::to_string_pretty(&n).map_err(|e| e.to_string())?, 0o600)?;
    Ok(Made { network, dir: dir.to_path_buf(), url, ca_pem, client, root_pw })
}

/// etcd's CA and server certificate (for the address hosts dial, and
/// loopback: the bootstrap's and the peer port's), written to `dir`; and
/// a client certificate of the CA, returned only.
fn certificates(dir: &Path, network: &str, addr: SocketAddr) -> Result<(String, (String, String)), String> {
    let f = |n: &str| dir.join(n);
    let e = |e: rcgen::Error| format!("certificate: {e}");
    let ca_key = rcgen::KeyPair::generate().map_err(e)?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(e)?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name.push(rcgen::DnType::CommonName, format!("vnet {network} etcd CA"));
    ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
    let ca_pem = ca.self_signed(&ca_key).map_err(e)?.pem();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().map_err(e)?;
    let mut names = vec![addr.ip().to_string(), "127.0.0.1".to_string(), "localhost".into()];
    names.dedup();
    let mut p = rcgen::CertificateParams::new(names).map_err(e)?;
    p.distinguished_name.push(rcgen::DnType::CommonName, format!("vnet {network} etcd"));
    p.extended_key_usages =
        vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth, rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let server = p.signed_by(&key, &issuer).map_err(e)?;
    let client_key = rcgen::KeyPair::generate().map_err(e)?;
    let mut c = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(e)?;
    c.distinguished_name.push(rcgen::DnType::CommonName, "root");
    c.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let client = c.signed_by(&client_key, &issuer).map_err(e)?;
    write(&f("ca.pem"), &ca_pem, 0o644)?;
    write(&f("ca.key"), &issuer.key().serialize_pem(), 0o600)?;
    write(&f("etcd.pem"), &server.pem(), 0o644)?;
    write(&f("etcd.key"), &key.serialize_pem(), 0o600)?;
    Ok((ca_pem, (client.pem(), client_key.serialize_pem())))
}

/// Kills etcd when dropped (the bootstrap's, whatever happens).
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// etcd's first start (`etcd` from `PATH`), on loopback, clients by
/// certificate only: `root` made, authentication on; then stopped.
pub fn bootstrap(m: &Made) -> Result<(), String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("a loopback port for etcd's first start: {e}"))?
        .port();
    let url = format!("https://127.0.0.1:{port}");
    let yml = m.dir.join("etcd-bootstrap.yml");
    let log = m.dir.join("etcd-bootstrap.log");
    write(&yml, &config(&m.network, &m.dir, &m.url, Some(&url)), 0o600)?;
    let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let child = std::process::Command::new("etcd")
        .arg("--config-file")
        .arg(&yml)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| {
            format!("etcd: {e}: `network init` runs etcd once to turn its authentication on (apt install etcd-server)")
        })?;
    let mut etcd = Running(child);
    let done = super::runtime()?.block_on(enable_auth(&url, m, &mut etcd));
    drop(etcd);
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&yml);
    let _ = std::fs::remove_file(&log);
    done.map_err(|e| {
        let tail: Vec<&str> = said.lines().rev().take(5).collect();
        format!("etcd's first start: {e}; its last lines: {}", tail.join(" | "))
    })
}

async fn enable_auth(url: &str, m: &Made, etcd: &mut Running) -> Result<(), String> {
    let tls = || {
        TlsOptions::new()
            .ca_certificate(Certificate::from_pem(m.ca_pem.as_bytes()))
            .identity(Identity::from_pem(m.client.0.as_bytes(), m.client.1.as_bytes()))
    };
    let mut last = String::new();
    let mut client = None;
    for _ in 0..100 {
        if let Ok(Some(s)) = etcd.0.try_wait() {
            return Err(format!("etcd exited ({s})"));
        }
        match super::connect_tls(url, tls(), None).await {
            Ok(mut c) => match c.status().await {
                Ok(_) => {
                    client = Some(c);
                    break;
                }
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut c = client.ok_or(format!("not up within 30 s: {last}"))?;
    let e = |what: &'static str| move |e: etcd_client::Error| format!("{what}: {e}");
    c.user_add("root", m.root_pw.as_str(), None).await.map_err(e("user add root"))?;
    c.role_add("root").await.map_err(e("role add root"))?;
    c.user_grant_role("root", "root").await.map_err(e("grant root"))?;
    c.auth_enable().await.map_err(e("auth enable"))?;
    Ok(())
}

/// `network init DIR network NAME etcd IP[:PORT]`: the files, then etcd
/// bootstrapped with authentication on, then `etcd.yml`.
pub fn init(dir: &str, words: &[&str]) -> Result<String, String> {
    let made = make(dir, words)?;
    let d = Path::new(dir);
    if let Err(e) = bootstrap(&made) {
        // Nothing half made is left behind: init again, once etcd runs.
        let _ = std::fs::remove_dir_all(d);
        return Err(e);
    }
    let yml = config(&made.network, d, &made.url, None);
    write(&d.join("etcd.yml"), &yml, 0o600)?;
    Ok(format!(
        "network {} made in {} (network key, etcd's CA and certificate for {}; etcd's root made and \
         authentication on)\nnext: etcd --config-file {}/etcd.yml, then for each host: \
         vnetctl network token {} HOST file HOST.token",
        made.network,
        d.display(),
        made.url,
        d.display(),
        d.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_makes_the_files_with_their_modes_and_refuses_a_used_directory() {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("vnetctl-init-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let ds = d.display().to_string();
        let m = make(&ds, &["network", "lab", "etcd", "10.9.0.1"]).unwrap();
        assert_eq!(m.url, "https://10.9.0.1:2379");
        let mode = |n: &str| std::fs::metadata(d.join(n)).unwrap().permissions().mode() & 0o777;
        for (n, want) in [
            ("net.key", 0o600),
            ("ca.key", 0o600),
            ("etcd.key", 0o600),
            ("root.pw", 0o600),
            ("net.pub", 0o644),
        ] {
            assert_eq!(mode(n), want, "{n}");
        }
        // The client certificate of the bootstrap is nowhere on disk.
        let files: Vec<String> =
            std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        assert!(files.iter().all(|f| !f.contains("client")), "{files:?}");
        assert!(make(&ds, &["network", "lab", "etcd", "10.9.0.1"]).err().unwrap().contains("not empty"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_config_bounds_the_store_and_only_the_bootstrap_takes_certificates() {
        let d = Path::new("/root/vnet-lab");
        let yml = config("lab", d, "https://10.9.0.1:2379", None);
        for want in [
            "listen-client-urls: https://10.9.0.1:2379",
            "quota-backend-bytes: 2147483648",
            "auto-compaction-mode: periodic",
            "auto-compaction-retention: \"1h\"",
            "max-request-bytes: 1310720",
            "listen-peer-urls: https://127.0.0.1:2380",
        ] {
            assert!(yml.contains(want), "{want}\n{yml}");
        }
        // 1.5 MB is refused, a signed policy of the longest fits.
        const { assert!(MAX_REQUEST_BYTES < 1_500_000) };
        const { assert!(MAX_REQUEST_BYTES > vnet_cluster::trust::MAX_POLICY_LEN as u64 + 4096) };
        assert_eq!(yml.matches("client-cert-auth: true").count(), 1, "the peer port's only");
        let boot = config("lab", d, "https://10.9.0.1:2379", Some("https://127.0.0.1:4000"));
        assert!(boot.contains("listen-client-urls: https://127.0.0.1:4000"), "{boot}");
        assert!(!boot.contains("10.9.0.1"), "{boot}");
        assert_eq!(boot.matches("client-cert-auth: true").count(), 2);
    }
}
