//! The admin's commands on etcd, as root: `network token`, `network
//! approve`, `network revoke`.

use super::reach;
use super::request::Request;
use super::token::{self, Record, Token};
use super::{cert_key, check_host, host_user, load, network_key, request_key, runtime, unix_now};
use etcd_client::{Client, DeleteOptions, LeaseTimeToLiveOptions, Permission};
use std::path::Path;
use vnet_cluster::layout::legacy_host_user;
use vnet_cluster::trust::{cert_id, CertBody, NetworkKey, Revocation};

/// How long certificates made by `approve` run.
const CERT_DAYS: u64 = 365;

type EtcdResult<T> = Result<T, String>;

fn etcd_err(what: &str) -> impl FnOnce(etcd_client::Error) -> String + '_ {
    move |e| format!("etcd: {what}: {e}")
}

/// The admin's session: the network, etcd as root, the network key.
struct Admin {
    network: String,
    etcd: String,
    ca: String,
    dir: std::path::PathBuf,
    c: Client,
}

async fn admin(dir: &Path) -> EtcdResult<Admin> {
    let (n, ca, root_pw) = load(dir)?;
    let tls = super::admin_tls(&n, &ca)?;
    // Waits for etcd (just started, say) a few seconds; a refused login
    // is an answer at once.
    let c = reach::retry(&n.etcd, reach::WAIT, || {
        super::connect_tls(&n.etcd, tls.clone(), Some(("root", &root_pw)))
    })
    .await
    .map_err(|e| match reach::unreachable(&e) {
        true => reach::down(&n.etcd, &e, reach::Start::Admin(dir)),
        false => format!("etcd at {} as root: {e}", n.etcd),
    })?;
    Ok(Admin { network: n.network, etcd: n.etcd, ca, dir: dir.to_path_buf(), c })
}

/// Whether an etcd error says the user or role is not there.
fn not_found(e: &etcd_client::Error) -> bool {
    e.to_string().contains("not found")
}

impl Admin {
    async fn get(&mut self, key: &str) -> EtcdResult<Option<Vec<u8>>> {
        let r = self.c.get(key, None).await.map_err(etcd_err(key))?;
        Ok(r.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// Deletes an etcd user and the role of the same name (there or not).
    async fn drop_user(&mut self, name: &str) -> EtcdResult<()> {
        if let Err(e) = self.c.user_delete(name).await {
            if !not_found(&e) {
                return Err(format!("etcd: delete user {name}: {e}"));
            }
        }
        if let Err(e) = self.c.role_delete(name).await {
            if !not_found(&e) {
                return Err(format!("etcd: delete role {name}: {e}"));
            }
        }
        Ok(())
    }

    /// Whether the user and role `name` of before (`legacy_host_user`,
    /// `token::legacy_token_user`: names two networks could share) is this
    /// network's: its role grants `key` (the host's certificate, or its
    /// request), which no other network's is granted.
    async fn legacy_is_ours(&mut self, name: &str, key: &str) -> bool {
        let Ok(r) = self.c.role_get(name).await else { return false };
        r.permissions().iter().any(|p| p.key() == key.as_bytes())
    }

    /// Host `host`'s token gone: its user and role (and a token user of
    /// before, if this network's), its record, its request.
    async fn drop_token(&mut self, host: &str) -> EtcdResult<()> {
        self.drop_user(&token::token_user(&self.network, host)).await?;
        let legacy = token::legacy_token_user(&self.network, host);
        if self.legacy_is_ours(&legacy, &request_key(&self.network, host)).await {
            self.drop_user(&legacy).await?;
        }
        let rec = token::record_key(&self.network, host);
        self.c.delete(rec.as_str(), None).await.map_err(etcd_err(&rec))?;
        let req = request_key(&self.network, host);
        self.c.delete(req.as_str(), None).await.map_err(etcd_err(&req))?;
        Ok(())
    }

    /// Every expired token of the network dropped (but `keep`'s).
    async fn sweep(&mut self, now: u64, keep: &str) -> EtcdResult<()> {
        let prefix = token::record_key(&self.network, "");
        let r = self
            .c
            .get(prefix.as_str(), Some(etcd_client::GetOptions::new().with_prefix()))
            .await
            .map_err(etcd_err(&prefix))?;
        let mut expired = Vec::new();
        for kv in r.kvs() {
            let host = String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
            let rec: Option<Record> = serde_json::from_slice(kv.value()).ok();
            if host != keep && rec.is_none_or(|r| r.expires < now) {
                expired.push(host);
            }
        }
        for h in expired {
            self.drop_token(&h).await?;
        }
        // The join user of before tokens were per host (`network setup`
        // made it; its password, in every token it printed, never
        // expired; it could write every request): gone.
        self.drop_user(&format!("vnet-{}-join", self.network)).await?;
        let _ = std::fs::remove_file(self.dir.join("join.pw"));
        Ok(())
    }

    /// Host `host` gone from the store: its user and role, the keys it
    /// may write (`host_grants`), the leases those are under, its
    /// certificate. Returns (leases revoked, keys deleted).
    async fn remove_host(&mut self, host: &str) -> EtcdResult<(usize, i64)> {
        self.drop_user(&host_user(&self.network, host)).await?;
        let legacy = legacy_host_user(&self.network, host);
        if self.legacy_is_ours(&legacy, &cert_key(&self.network, host)).await {
            self.drop_user(&legacy).await?;
        }
        let writes: Vec<_> =
            vnet_cluster::layout::host_grants(&self.network, host).into_iter().filter(|g| g.write).collect();
        let owned = |k: &[u8]| {
            writes
                .iter()
                .any(|g| if g.prefix { k.starts_with(g.key.as_bytes()) } else { k == g.key.as_bytes() })
        };
        let leases = self.c.leases().await.map_err(etcd_err("list leases"))?;
        let mut revoked = 0;
        for l in leases.leases() {
            let opts = LeaseTimeToLiveOptions::new().with_keys();
            let Ok(ttl) = self.c.lease_time_to_live(l.id(), Some(opts)).await else { continue };
            if ttl.keys().iter().any(|k| owned(k)) && self.c.lease_revoke(l.id()).await.is_ok() {
                revoked += 1;
            }
        }
        let mut deleted = 0;
        for g in &writes {
            let opts = g.prefix.then(|| DeleteOptions::new().with_prefix());
            deleted += self.c.delete(g.key.as_str(), opts).await.map_err(etcd_err(&g.key))?.deleted();
        }
        let cert = cert_key(&self.network, host);
        self.c.delete(cert.as_str(), None).await.map_err(etcd_err(&cert))?;
        Ok((revoked, deleted))
    }
}

/// `network token DIR HOST [ttl D] [file F]`: a new token for host HOST
/// (its last one, if any, no longer works), printed or written to F (made
/// 0600, never over a file).
pub fn make_token(dir: &str, host: &str, words: &[&str]) -> Result<String, String> {
    check_host(host)?;
    let (mut ttl, mut file) = (token::DEFAULT_TTL, None);
    for (k, v) in super::pairs(words, &["ttl", "--ttl", "file"])? {
        match k {
            "file" => file = Some(v.to_string()),
            _ => ttl = token::parse_ttl(v).map_err(|e| e.to_string())?,
        }
    }
    let dir = Path::new(dir);
    let net_pub = super::read(&dir.join("net.pub"))?.trim().to_string();
    let now = unix_now()?;
    let (t, is_host) = runtime()?.block_on(async {
        let mut a = admin(dir).await?;
        a.sweep(now, "").await?;
        a.drop_token(host).await?;
        let user = token::token_user(&a.network, host);
        a.c.role_add(user.as_str()).await.map_err(etcd_err("role add"))?;
        // One key, write only: the request of this host, nothing else.
        a.c.role_grant_permission(user.as_str(), Permission::write(request_key(&a.network, host)))
            .await
            .map_err(etcd_err("grant the request's key"))?;
        let password = vnet_client::keys::genkey().map_err(|e| e.to_string())?;
        a.c.user_add(user.as_str(), password.as_str(), None).await.map_err(etcd_err("user add"))?;
        a.c.user_grant_role(user.as_str(), user.as_str()).await.map_err(etcd_err("grant"))?;
        let expires = now + ttl.as_secs();
        let id = token::new_id().map_err(|e| e.to_string())?;
        let rec = Record { user: user.clone(), expires, id: id.clone() };
        let rec = serde_json::to_vec(&rec).map_err(|e| e.to_string())?;
        a.c.put(token::record_key(&a.network, host), rec, None).await.map_err(etcd_err("token record"))?;
        let is_host = a.get(&cert_key(&a.network, host)).await?.is_some();
        let t = Token {
            network: a.network.clone(),
            etcd: a.etcd.clone(),
            ca: a.ca.clone(),
            net_pub,
            host: host.to_string(),
            user,
            password,
            expires,
            id,
        };
        Ok::<_, String>((t, is_host))
    })?;
    let note = if is_host {
        format!(" ({host} is a host already: its approve needs `replace`)")
    } else {
        String::new()
    };
    match file {
        None => Ok(t.encode()),
        Some(f) => {
            vnet_client::keys::write_secret(Path::new(&f), &t.encode()).map_err(|e| e.to_string())?;
            Ok(format!(
                "a token for host {host}, for {} s, once, written to {f}{note}\n\
                 on {host}: vnetctl join --token-file {f}",
                ttl.as_secs()
            ))
        }
    }
}

/// What `approve` was told besides the host.
#[derive(Debug)]
struct Told {
    pin: Option<String>,
    yes: bool,
    replace: bool,
}

fn told(words: &[&str]) -> Result<Told, String> {
    let mut t = Told { pin: None, yes: false, replace: false };
    let mut w = words.iter();
    while let Some(word) = w.next() {
        match *word {
            "key" => t.pin = Some(w.next().ok_or("`key` needs the fingerprint `join` printed")?.to_string()),
            "--yes" | "yes" => t.yes = true,
            "replace" => t.replace = true,
            other => return Err(format!("expected key FINGERPRINT, --yes or replace, found `{other}`")),
        }
    }
    Ok(t)
}

/// Shows the request and has it confirmed: the pin matched, `--yes`, or
/// `y` typed at a terminal.
fn confirmed(req: &Request, t: &Told) -> Result<(), String> {
    let fp = req.fingerprint();
    eprintln!(
        "host {} asks to join network {}: address {}, key fingerprint {fp}\n  public key {}, claim key {}",
        req.host, req.network, req.addr, req.public_key, req.claim_key
    );
    if let Some(pin) = &t.pin {
        if *pin != fp {
            return Err(format!(
                "host {}'s request is signed by the key of fingerprint {fp}, not the pinned {pin}: refused \
                 (the request was replaced by another key's, or the pin is not the one `join` printed)",
                req.host
            ));
        }
        return Ok(());
    }
    if t.yes {
        return Ok(());
    }
    use std::io::IsTerminal;
    if !std::io::stdin().is_terminal() {
        return Err(format!(
            "not approved: compare fingerprint {fp} with the one `join` printed on {}, then give `key FINGERPRINT` \
             (or --yes)",
            req.host
        ));
    }
    eprint!("approve host {} with key fingerprint {fp}? [y/N] ", req.host);
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer).map_err(|e| e.to_string())?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err("not approved".into())
    }
}

/// `network approve DIR HOST [key FP] [--yes] [replace]`.
pub fn approve(dir: &str, host: &str, words: &[&str]) -> Result<String, String> {
    check_host(host)?;
    let t = told(words)?;
    let dir = Path::new(dir);
    let nk = network_key(dir)?;
    let now = unix_now()?;
    runtime()?.block_on(async {
        let mut a = admin(dir).await?;
        let req = checked_request(&mut a, host, now).await?;
        a.sweep(now, host).await?;
        confirmed(&req, &t)?;
        let replaced = take_name(&mut a, &nk, host, t.replace).await?;
        let cert = certificate(&nk, &a.network, &req, now)?;
        admit(&mut a, &req, &cert).await?;
        a.drop_token(host).await?;
        Ok(format!(
            "approved host {host} at {} (key fingerprint {}); its certificate runs {CERT_DAYS} days{replaced}",
            req.addr,
            req.fingerprint()
        ))
    })
}

/// The host's token (there and not expired: an expired one is dropped)
/// and its request, verified.
async fn checked_request(a: &mut Admin, host: &str, now: u64) -> EtcdResult<Request> {
    let d = a.dir.display().to_string();
    let rec = a.get(&token::record_key(&a.network, host)).await?;
    let Some(rec) = rec.and_then(|r| serde_json::from_slice::<Record>(&r).ok()) else {
        return Err(format!(
            "no token for host {host} is outstanding (never made, or used, or expired): \
             vnetctl network token {d} {host}"
        ));
    };
    if rec.expires < now {
        a.drop_token(host).await?;
        return Err(format!(
            "host {host}'s token expired {} s ago: its request is refused, and the token's etcd user deleted; \
             a new one: vnetctl network token {d} {host}",
            now - rec.expires
        ));
    }
    let Some(json) = a.get(&request_key(&a.network, host)).await? else {
        return Err(format!("no request from host {host} yet (vnetctl join --token-file FILE on it)"));
    };
    Request::verified(&json, &a.network, host, &rec.id)
        .map_err(|e| format!("host {host}'s request is refused: {e}"))
}

/// Makes `host` free for a new key: refused if it is a host, unless
/// `replace`, which revokes its certificate (the revocation every member
/// honours) and removes it from the store. Says what it did.
async fn take_name(a: &mut Admin, nk: &NetworkKey, host: &str, replace: bool) -> EtcdResult<String> {
    let revoked = vnet_cluster::layout::revoked_host_key(&a.network, host);
    if a.get(&revoked).await?.is_some() {
        return Err(format!(
            "host {host} was revoked (`{revoked}`): its name is not given again while that stands \
             (`etcdctl del {revoked}` as root to reuse it)"
        ));
    }
    let old = a.get(&cert_key(&a.network, host)).await?;
    let Some(old) = old else { return Ok(String::new()) };
    let id = cert_id(&String::from_utf8_lossy(&old));
    if !replace {
        return Err(format!(
            "host {host} is already a host of network {} (certificate {id}): approving would hand its name, \
             certificate and store user to this key. Say `replace` to revoke that certificate and replace it",
            a.network
        ));
    }
    let r = Revocation {
        network: a.network.clone(),
        host: host.to_string(),
        cert: Some(id.clone()),
        at: unix_now()?,
    };
    let v = nk.revoke(&r).map_err(|e| e.to_string())?;
    a.c.put(r.key(), v, None).await.map_err(etcd_err("put the revocation"))?;
    a.remove_host(host).await?;
    Ok(format!("; it replaces the old {host}, whose certificate {id} is revoked"))
}

fn certificate(nk: &NetworkKey, network: &str, req: &Request, now: u64) -> Result<String, String> {
    let prefix = match req.addr {
        std::net::IpAddr::V4(a) => format!("{a}/32"),
        std::net::IpAddr::V6(a) => format!("{a}/128"),
    };
    let body = CertBody {
        network: network.to_string(),
        host: req.host.clone(),
        public_key: req.public_key.clone(),
        claim_key: req.claim_key.clone(),
        addrs: vec![prefix],
        groups: Vec::new(),
        not_after: Some(now + CERT_DAYS * 86_400),
    };
    nk.sign(&body).map_err(|e| format!("host {}'s request: {e}", req.host))
}

/// The host's etcd user (the password it chose) and its role, exactly
/// `host_grants` and the read of its certificate; then the certificate.
async fn admit(a: &mut Admin, req: &Request, cert: &str) -> EtcdResult<()> {
    let user = host_user(&a.network, &req.host);
    // A user of a half-done approve, or made before host_grants: anew.
    a.drop_user(&user).await?;
    a.c.user_add(user.as_str(), req.password.as_str(), None).await.map_err(etcd_err("user add"))?;
    host_role(a, &req.host, &user).await?;
    let ck = cert_key(&a.network, &req.host);
    a.c.put(ck.as_str(), cert, None).await.map_err(etcd_err("write the certificate"))?;
    Ok(())
}

/// Host `host`'s role made anew (its user's, `user`, of the same name):
/// exactly `host_grants` and the read of its certificate; granted to its user.
async fn host_role(a: &mut Admin, host: &str, user: &str) -> EtcdResult<()> {
    if let Err(e) = a.c.role_delete(user).await {
        if !not_found(&e) {
            return Err(format!("etcd: delete role {user}: {e}"));
        }
    }
    a.c.role_add(user).await.map_err(etcd_err("role add"))?;
    for g in vnet_cluster::layout::host_grants(&a.network, host) {
        let p =
            if g.write { Permission::read_write(g.key.as_str()) } else { Permission::read(g.key.as_str()) };
        let p = if g.prefix { p.with_prefix() } else { p };
        a.c.role_grant_permission(user, p).await.map_err(etcd_err(&g.key))?;
    }
    let ck = cert_key(&a.network, host);
    a.c.role_grant_permission(user, Permission::read(ck.as_str()))
        .await
        .map_err(etcd_err("grant its certificate"))?;
    a.c.user_grant_role(user, user).await.map_err(etcd_err("grant its role"))?;
    Ok(())
}

/// `network upgrade DIR`: a network whose hosts an older `approve` made
/// (each with the network-wide role `vnet-NET`, read and write on the
/// whole prefix) moves to roles of exactly `host_grants`: every host with
/// a certificate gets its role anew, `vnet-NET` is deleted (and the old
/// join user). Run it once every host runs a vnetd that writes only its
/// own keys (`docs/CLUSTER.md`).
pub fn upgrade(dir: &str) -> Result<String, String> {
    let dir = Path::new(dir);
    let now = unix_now()?;
    runtime()?.block_on(async {
        let mut a = admin(dir).await?;
        let prefix = cert_key(&a.network, "");
        let opts = etcd_client::GetOptions::new().with_prefix().with_keys_only();
        let r = a.c.get(prefix.as_str(), Some(opts)).await.map_err(etcd_err(&prefix))?;
        let hosts: Vec<String> = r
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned())
            .filter(|h| check_host(h).is_ok())
            .collect();
        let net_role = format!("vnet-{}", a.network);
        for h in &hosts {
            let user = host_user(&a.network, h);
            if a.c.user_get(user.as_str()).await.is_ok() {
                host_role(&mut a, h, &user).await?;
            }
            // A host approved before keeps its user of then, if it is this network's.
            let legacy = legacy_host_user(&a.network, h);
            if a.c.user_get(legacy.as_str()).await.is_ok()
                && a.legacy_is_ours(&legacy, &cert_key(&a.network, h)).await
            {
                host_role(&mut a, h, &legacy).await?;
            }
        }
        if let Err(e) = a.c.role_delete(net_role.as_str()).await {
            if !not_found(&e) {
                return Err(format!("etcd: delete role {net_role}: {e}"));
            }
        }
        a.sweep(now, "").await?;
        Ok(format!(
            "{} hosts ({}): each one's role is now exactly its own (host_grants); the network-wide role \
             {net_role} and the join user of before are deleted",
            hosts.len(),
            hosts.join(" ")
        ))
    })
}

/// `network revoke DIR HOST`: the revocation (signed by the network key),
/// the host's etcd user and role deleted, its records and leases gone.
pub fn revoke(dir: &str, host: &str) -> Result<String, String> {
    check_host(host)?;
    let dir = Path::new(dir);
    let nk = network_key(dir)?;
    runtime()?.block_on(async {
        let mut a = admin(dir).await?;
        let r =
            Revocation { network: a.network.clone(), host: host.to_string(), cert: None, at: unix_now()? };
        let v = nk.revoke(&r).map_err(|e| e.to_string())?;
        a.c.put(r.key(), v, None).await.map_err(etcd_err("put the revocation"))?;
        let (leases, keys) = a.remove_host(host).await?;
        a.drop_token(host).await?;
        Ok(format!(
            "host {host} revoked ({}): its etcd user {} and role deleted, {leases} leases revoked, \
             {keys} keys deleted",
            r.key(),
            host_user(&a.network, host)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::super::request::Asked;
    use super::*;

    #[test]
    fn approve_words() {
        let t = told(&["key", "ab", "--yes", "replace"]).unwrap();
        assert_eq!((t.pin.as_deref(), t.yes, t.replace), (Some("ab"), true, true));
        assert!(told(&["key"]).is_err());
        assert!(told(&["force"]).unwrap_err().contains("`force`"));
    }

    /// Without a pin or `--yes`, and no terminal to ask at, nothing is
    /// approved; a pin of another key is refused and says so.
    #[test]
    fn an_unpinned_unconfirmed_request_is_not_approved() {
        let k = vnet_client::keys::genkey().unwrap();
        let addr = "10.0.0.2".parse().unwrap();
        let asked = Asked { network: "lab", host: "h1", token: "t", addr, password: "pw" };
        let req = Request::sign(&k, asked).unwrap();
        let none = Told { pin: None, yes: false, replace: false };
        if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            assert!(confirmed(&req, &none).unwrap_err().contains("not approved"));
        }
        let other = Told { pin: Some("0".repeat(32)), ..none };
        assert!(confirmed(&req, &other).unwrap_err().contains("not the pinned"));
        let pinned = Told { pin: Some(req.fingerprint()), yes: false, replace: false };
        assert!(confirmed(&req, &pinned).is_ok());
        assert!(confirmed(&req, &Told { pin: None, yes: true, replace: false }).is_ok());
    }
}
