//! The store's key layout (`docs/CLUSTER.md`): one prefix per network;
//! everything a host writes lies in key ranges only it is granted
//! ([`host_grants`]: its record, its claims, its addresses), so that its
//! etcd role can hold it to them; the network's policy and revocations are
//! written by the admin only.
//!
//! ```text
//! /vnet/<network>/hosts/<host>          {"addr":"10.0.0.2:9000","kinds":["udp"],"public_key":"...","cert":"..."}
//! /vnet/<network>/claims/<host>/<mac>   {"host":"<host>","iface":"vm0","at_ms":1764000000000,"network":7,"epoch":2,"addrs":["10.244.0.5"],"sig":"..."}
//! /vnet/<network>/ipam/<host>/<subnet>/<address>   (crate::ipam)
//! /vnet/<network>/revoked/hosts/<host>  BASE64(revocation).BASE64(signature)
//! /vnet/<network>/revoked/certs/<id>    BASE64(revocation).BASE64(signature)
//! /vnet/<network>/policy                BASE64(policy).BASE64(signature)
//! ```
//!
//! Several hosts may claim one MAC, each under its own key: every member
//! resolves them with one rule ([`crate::member`]: the higher epoch wins,
//! at one epoch the holder stays and the other claim is a conflict, taken
//! if the holder's goes). A migration's destination writes its own claim
//! at the higher epoch; the source deletes its own.
//!
//! Values are JSON, read into these plain records and then checked field by
//! field ([`crate::member`]): a value that does not parse or check is
//! quarantined and counted, never trusted and never a panic. `cert` and
//! `sig` are the network key's and the claimant's signatures
//! ([`crate::trust`]), required where the network has a key.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use vnet_wire::MacAddr;

/// The prefix every key of `network` starts with.
pub fn prefix(network: &str) -> String {
    format!("/vnet/{network}/")
}

/// The key of host `host` in `network`.
pub fn host_key(network: &str, host: &str) -> String {
    format!("/vnet/{network}/hosts/{host}")
}

/// The prefix of host `host`'s claims in `network` (only it writes there).
pub fn claims_prefix(network: &str, host: &str) -> String {
    format!("/vnet/{network}/claims/{host}/")
}

/// The prefix of host `host`'s address allocations in `network` (only it
/// writes there; `crate::ipam` has the keys under it).
pub fn ipam_prefix(network: &str, host: &str) -> String {
    format!("/vnet/{network}/ipam/{host}/")
}

/// The key of host `host`'s claim of VM MAC `mac` in `network`.
pub fn claim_key(network: &str, host: &str, mac: MacAddr) -> String {
    format!("/vnet/{network}/claims/{host}/{mac}")
}

/// The key of a revocation of every certificate of `host`.
pub fn revoked_host_key(network: &str, host: &str) -> String {
    format!("/vnet/{network}/revoked/hosts/{host}")
}

/// The key of a revocation of the certificate whose id is `id`
/// ([`crate::trust::cert_id`]).
pub fn revoked_cert_key(network: &str, id: &str) -> String {
    format!("/vnet/{network}/revoked/certs/{id}")
}

/// The key of the network's signed policy ([`crate::trust::PolicyBody`]).
pub fn policy_key(network: &str) -> String {
    format!("/vnet/{network}/policy")
}

/// One key range a host's etcd role is granted ([`host_grants`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub key: String,
    /// The range is every key starting with `key` (else `key` alone).
    pub prefix: bool,
    /// Read and write (else read only).
    pub write: bool,
}

/// What host `host` of `network` may read and write in the store: the
/// one source of its etcd role (`vnetctl network approve` grants exactly
/// these), so the layout and the rights cannot drift apart. A host reads
/// the whole network and writes only the keys it owns.
pub fn host_grants(network: &str, host: &str) -> Vec<Grant> {
    vec![
        Grant { key: prefix(network), prefix: true, write: false },
        Grant { key: host_key(network, host), prefix: false, write: true },
        Grant { key: claims_prefix(network, host), prefix: true, write: true },
        Grant { key: ipam_prefix(network, host), prefix: true, write: true },
    ]
}

/// The etcd user of host `host` of `network` (`vnetctl network approve`
/// makes it, and a role of the same name holding [`host_grants`]):
/// `vnet/NETWORK/HOST`. No network or host name holds a `/`
/// ([`valid_name`]), so no two (network, host) pairs share a user,
/// whatever networks share one etcd ([`legacy_host_user`] did).
pub fn host_user(network: &str, host: &str) -> String {
    format!("vnet/{network}/{host}")
}

/// The etcd user `vnetctl network approve` made before [`host_user`]:
/// `vnet-NETWORK-HOST`, which two networks sharing an etcd could share
/// (network `a-b` host `c`, network `a` host `b-c`). A host approved
/// before keeps it until approved again; `vnetctl` removes or regrants it
/// only where its role shows it is this host's (it grants the read of the
/// host's certificate).
pub fn legacy_host_user(network: &str, host: &str) -> String {
    format!("vnet-{network}-{host}")
}

/// Whether `grants` let their holder write `key` (`write`) or read it.
pub fn granted(grants: &[Grant], key: &str, write: bool) -> bool {
    grants
        .iter()
        .any(|g| (g.write || !write) && if g.prefix { key.starts_with(&g.key) } else { key == g.key })
}

/// Whether `name` may name a network or a host (vnet-keys' rule).
pub use vnet_keys::valid_name;

/// What a key under a network's prefix names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key<'a> {
    Host(&'a str),
    /// Host `host`'s claim of `mac`.
    Claim {
        host: &'a str,
        mac: MacAddr,
    },
    /// A revocation of every certificate of a host.
    RevokedHost(&'a str),
    /// A revocation of one certificate, by its id.
    RevokedCert(&'a str),
    /// The network's signed policy.
    Policy,
}

/// Parses `key`, which starts with `prefix` (else `None`, as for any key
/// this version does not know).
pub fn parse_key<'a>(prefix: &str, key: &'a str) -> Option<Key<'a>> {
    let rest = key.strip_prefix(prefix)?;
    if rest == "policy" {
        return Some(Key::Policy);
    }
    if let Some(h) = rest.strip_prefix("hosts/") {
        return valid_name(h).then_some(Key::Host(h));
    }
    if let Some(r) = rest.strip_prefix("revoked/") {
        if let Some(h) = r.strip_prefix("hosts/") {
            return valid_name(h).then_some(Key::RevokedHost(h));
        }
        let id = r.strip_prefix("certs/")?;
        return valid_cert_id(id).then_some(Key::RevokedCert(id));
    }
    let (host, mac) = rest.strip_prefix("claims/")?.split_once('/')?;
    let mac = mac.parse().ok()?;
    valid_name(host).then_some(Key::Claim { host, mac })
}

/// A host's record: where its links are received, what they may be, its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRecord {
    /// The underlay address and UDP port its `vnet` links are received on.
    pub addr: SocketAddr,
    /// Link kinds it accepts, in its order of preference (`udp` when empty).
    #[serde(default)]
    pub kinds: Vec<String>,
    /// Its static public key (base64), when its links are secured.
    #[serde(default)]
    pub public_key: Option<String>,
    /// Its certificate, signed by the network key ([`crate::trust`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    /// It relays between its secured peers (`vnetd --relay`): links with
    /// `relay auto` between hosts behind NATs go through it while they
    /// cannot reach each other directly.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub relay: bool,
    /// Its node gateway on the pods' network (vnet-cni's
    /// `isDefaultGateway`): the one address whose traffic to a Service's
    /// backends every host trusts as translated (`--kube-network-policy`,
    /// where the IPAM confirms it), and a MAC that, while its host holds
    /// it, no other host's claim takes. Signed by
    /// the host's claim key in a signed network ([`crate::trust`]). A
    /// record without it (a host of an older version) has no gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Gateway>,
}

/// A host's node gateway, as its record names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gateway {
    /// Its address, held in the IPAM by the host under the owner
    /// `CNI-NETWORK/node-gateway-MAC/gw`.
    pub addr: std::net::IpAddr,
    /// The MAC of its interface on the network (`vcHEX`).
    #[serde(with = "mac_text")]
    pub mac: MacAddr,
    /// The host's claim key's signature ([`crate::trust::ClaimKey::sign_gateway`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sig: Option<String>,
}

/// A MAC as JSON text (`52:54:00:12:34:56`).
mod mac_text {
    use vnet_wire::MacAddr;

    pub fn serialize<S: serde::Serializer>(m: &MacAddr, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(m)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<MacAddr, D::Error> {
        let t = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
        t.parse().map_err(|_| serde::de::Error::custom("expected a MAC (52:54:00:12:34:56)"))
    }
}

/// Who has a VM MAC: a host's claim.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MacRecord {
    pub host: String,
    #[serde(default)]
    pub iface: String,
    /// When the host claimed it (ms since the Unix epoch): in a signed
    /// network, a claim older than the one held is a replay.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub at_ms: u64,
    /// The vnet network (tenant number) of the claiming interface: a host
    /// takes only claims of the network its cluster links carry.
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub network: u32,
    /// The MAC's migration count: a claim by another host than the holder
    /// is taken only with a higher epoch (a migration: the destination's
    /// standby interface activated by its VM, or a `move`), never for
    /// being newer. Two hosts claiming at one epoch are a conflict.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u64,
    /// The VM's addresses (the claimant's `neigh` lines for this MAC):
    /// every host answers ARP and neighbour solicitations for them at the
    /// edge. At most [`MAX_ADDRS`], each unicast.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addrs: Vec<std::net::IpAddr>,
    /// The policy groups the claimant's interface puts the VM in (`attach
    /// ... group G`, a pod's labels through vnet-cni): every host's policy
    /// counts the MAC in them while the claim holds. At most
    /// [`MAX_GROUPS`], each a name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// The claimant's signature ([`crate::trust::ClaimKey::sign`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sig: Option<String>,
}

/// The most addresses a claim names.
pub const MAX_ADDRS: usize = 16;
/// The most groups a claim names (as an interface may have).
pub const MAX_GROUPS: usize = 16;

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_zero32(v: &u32) -> bool {
    *v == 0
}

/// Whether `addr` can be a peer's underlay address: a unicast address
/// (not unspecified, multicast or the IPv4 broadcast) and a port.
pub fn usable(addr: std::net::SocketAddr) -> bool {
    let ip = addr.ip();
    let broadcast = matches!(ip, std::net::IpAddr::V4(v4) if v4.is_broadcast());
    addr.port() != 0 && !ip.is_unspecified() && !ip.is_multicast() && !broadcast
}

impl HostRecord {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

impl MacRecord {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Records the unit tests of this crate share.
/// Whether `id` can be a certificate's id (32 lowercase hex digits).
pub fn valid_cert_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// A plain host record at 10.0.0.I:9000.
    pub fn host(i: u8) -> Vec<u8> {
        let addr = format!("10.0.0.{i}:9000").parse().unwrap();
        HostRecord { addr, kinds: vec![], public_key: None, cert: None, relay: false, gateway: None }
            .to_json()
    }

    /// The key of the claim `value` (a claim's JSON) of `mac`: under the
    /// claim's host's prefix.
    pub fn key_of(mac: MacAddr, value: &[u8]) -> String {
        let host = serde_json::from_slice::<MacRecord>(value).map_or_else(|_| "x".to_string(), |r| r.host);
        let host = if valid_name(&host) { host } else { "x".to_string() };
        claim_key("n", &host, mac)
    }

    /// Claims put and deleted by MAC, under their claimant's key, as the
    /// tests of one key per MAC did.
    pub trait Claims {
        fn put_claim(&mut self, mac: MacAddr, value: Vec<u8>, lease: Option<u64>) -> Option<u64>;
        /// Deletes every host's claim of `mac`.
        fn delete_claims(&mut self, mac: MacAddr) -> Option<u64>;
    }

    impl Claims for crate::store::MemStore {
        fn put_claim(&mut self, mac: MacAddr, value: Vec<u8>, lease: Option<u64>) -> Option<u64> {
            self.put(&key_of(mac, &value), value, lease)
        }

        fn delete_claims(&mut self, mac: MacAddr) -> Option<u64> {
            let (kvs, _) = self.range("/vnet/n/claims/");
            let suffix = format!("/{mac}");
            let mut rev = None;
            for (k, _) in kvs.iter().filter(|(k, _)| k.ends_with(&suffix)) {
                rev = self.delete_if(k, None).or(rev);
            }
            rev
        }
    }

    /// An unsigned claim of a MAC for host `h`'s `vm0`.
    pub fn vm(h: &str) -> Vec<u8> {
        moved(h, 0)
    }

    /// An unsigned claim of a MAC for host `h`'s `vm0` at `epoch` (a
    /// migration's claim has the epoch above the one held).
    pub fn moved(h: &str, epoch: u64) -> Vec<u8> {
        MacRecord { host: h.into(), iface: "vm0".into(), epoch, ..Default::default() }.to_json()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claim's zero fields are left out of its JSON: what hosts of
    /// before the field wrote, and read, stays the same bytes.
    #[test]
    fn a_claims_zero_fields_are_not_written() {
        let r = MacRecord { host: "h1".into(), iface: "vm0".into(), ..Default::default() };
        assert_eq!(String::from_utf8(r.to_json()).unwrap(), r#"{"host":"h1","iface":"vm0"}"#);
        let r = MacRecord { at_ms: 5, network: 7, epoch: 2, ..r };
        assert_eq!(
            String::from_utf8(r.to_json()).unwrap(),
            r#"{"host":"h1","iface":"vm0","at_ms":5,"network":7,"epoch":2}"#
        );
    }

    #[test]
    fn keys_round_trip_and_strangers_are_ignored() {
        let p = prefix("lab");
        let mac: MacAddr = "52:54:00:00:00:01".parse().unwrap();
        assert_eq!(parse_key(&p, &host_key("lab", "h1")), Some(Key::Host("h1")));
        assert_eq!(parse_key(&p, &claim_key("lab", "h1", mac)), Some(Key::Claim { host: "h1", mac }));
        assert_eq!(parse_key(&p, &revoked_host_key("lab", "h1")), Some(Key::RevokedHost("h1")));
        let id = "0123456789abcdef0123456789abcdef";
        assert_eq!(parse_key(&p, &revoked_cert_key("lab", id)), Some(Key::RevokedCert(id)));
        assert_eq!(parse_key(&p, &policy_key("lab")), Some(Key::Policy));
        assert_eq!(parse_key(&p, "/vnet/lab/policy/x"), None);
        for k in [
            "/vnet/lab/hosts/",
            "/vnet/lab/hosts/a/b",
            "/vnet/lab/macs/52:54:00:00:00:01",
            "/vnet/lab/claims/h1/zz",
            "/vnet/lab/claims/a/b/52:54:00:00:00:01",
            "/vnet/lab/claims/52:54:00:00:00:01",
            "/vnet/other/hosts/h1",
            "/x",
            "/vnet/lab/revoked/certs/xyz",
            "/vnet/lab/revoked/hosts/a/b",
            "/vnet/lab/revoked/other",
        ] {
            assert_eq!(parse_key(&p, k), None, "{k}");
        }
        assert!(!valid_name(&"x".repeat(64)));
    }

    /// A host's grants: read the network, write its record, its claims
    /// and its addresses; nothing of another host's, nor the policy.
    #[test]
    fn a_host_is_granted_its_own_keys_only() {
        let g = |key: &str, prefix, write| Grant { key: key.into(), prefix, write };
        assert_eq!(
            host_grants("lab", "h1"),
            [
                g("/vnet/lab/", true, false),
                g("/vnet/lab/hosts/h1", false, true),
                g("/vnet/lab/claims/h1/", true, true),
                g("/vnet/lab/ipam/h1/", true, true),
            ]
        );
        let mine = host_grants("lab", "h1");
        let mac: MacAddr = "52:54:00:00:00:01".parse().unwrap();
        assert!(granted(&mine, &claim_key("lab", "h1", mac), true));
        assert!(granted(&mine, &claim_key("lab", "h2", mac), false));
        for other in [
            claim_key("lab", "h2", mac),
            host_key("lab", "h10"),
            policy_key("lab"),
            revoked_host_key("lab", "h1"),
        ] {
            assert!(!granted(&mine, &other, true), "{other}");
        }
        assert!(!granted(&mine, "/vnet/lab2/hosts/h1", false));
    }

    /// Two networks sharing one etcd: network `a-b`'s host `c` and network
    /// `a`'s host `b-c` have users (and roles) of their own; the names of
    /// before were one.
    #[test]
    fn host_users_of_networks_sharing_an_etcd_never_collide() {
        assert_ne!(host_user("a-b", "c"), host_user("a", "b-c"));
        assert_eq!(
            (host_user("a-b", "c").as_str(), host_user("a", "b-c").as_str()),
            ("vnet/a-b/c", "vnet/a/b-c")
        );
        assert_eq!(legacy_host_user("a-b", "c"), legacy_host_user("a", "b-c"), "the collision of before");
        // Every split of one name is another pair: a `/` is in no name.
        for (n, h) in [("a.b", "c"), ("a", "b.c"), ("a_b", "c"), ("a", "b_c")] {
            assert!(valid_name(n) && valid_name(h) && !valid_name(&format!("{n}/{h}")));
        }
        assert_ne!(host_user("a.b", "c"), host_user("a", "b.c"));
    }

    #[test]
    fn records_parse_or_fail_cleanly() {
        let r: HostRecord = serde_json::from_slice(br#"{"addr":"10.0.0.2:9000"}"#).unwrap();
        assert!(r.kinds.is_empty() && r.public_key.is_none() && r.cert.is_none());
        assert!(usable(r.addr));
        for bad in ["0.0.0.0:9000", "10.0.0.2:0", "224.0.0.1:9000", "255.255.255.255:9000", "[::]:9000"] {
            assert!(!usable(bad.parse().unwrap()), "{bad}");
        }
        assert!(serde_json::from_slice::<HostRecord>(b"{\"addr\":1}").is_err());
        assert!(serde_json::from_slice::<MacRecord>(b"\xff").is_err());
    }
}
