//! Who may be a host of a network, and who may claim a MAC: the network
//! key, host certificates and signed MAC claims (`docs/SECURITY.md`).
//!
//! Without this, anyone who can write to etcd decides where every host's
//! frames go: a host record names an address and a key, a MAC record names
//! a host, and both are taken as written. The model is Nebula's certificate
//! authority: an offline **network key** (Ed25519) signs, for each host, a
//! **certificate** binding the network's name, the host's name, its static
//! X25519 public key (the one its secured links are authenticated with),
//! its **claim key** and the underlay addresses it may advertise. A host
//! record carries its certificate; every host checks it against the
//! network's public key before making a link, so a writer to etcd without
//! the network key can neither introduce a host nor re-point one to
//! another address or key.
//!
//! A MAC record is signed by the claiming host's claim key (an Ed25519 key
//! derived from its X25519 private key, so a host has one secret, not two)
//! over the network, the MAC, the host, the interface, the claim's time,
//! the interface's vnet network and the MAC's epoch; a host takes a claim
//! only if the claimant's certificate names that claim key, and only if it
//! is no older than the claim it holds for that MAC (a replayed old claim
//! cannot pull a VM back); which claim moves a MAC is the epoch's rule
//! ([`crate::member`]). A [`Revocation`], signed by the network key,
//! withdraws a host's certificates. What a writer to etcd can still do is
//! deny service: delete records, or let leases lapse.
//!
//! Encodings: keys and signatures in standard base64; a certificate is
//! `BASE64(body JSON) "." BASE64(signature)`, the signature over a domain
//! tag and the body's exact bytes, so nothing is re-serialized to verify.
//! Ed25519 and SHA-256 are `ring`'s.

use base64::Engine;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use vnet_control::PeerKey;
use vnet_wire::MacAddr;

pub use crate::layout::valid_cert_id;
use crate::layout::MacRecord;

const CERT_TAG: &[u8] = b"vnet host certificate v1\0";
const CLAIM_TAG: &[u8] = b"vnet mac claim v1\0";
const CLAIM_TAG_V2: &[u8] = b"vnet mac claim v2\0";
const GATEWAY_TAG: &[u8] = b"vnet node gateway v1\0";
const REVOKE_TAG: &[u8] = b"vnet revocation v1\0";
const POLICY_TAG: &[u8] = b"vnet policy v1\0";
/// A certificate's longest text, and the most addresses it may name.
pub const MAX_CERT_LEN: usize = 4096;
pub const MAX_CERT_ADDRS: usize = 16;
/// The most groups a certificate may name.
pub const MAX_CERT_GROUPS: usize = 16;
/// A signed policy's longest text (4096 rules of a network fit).
pub const MAX_POLICY_LEN: usize = 1 << 20;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// Why a certificate or claim is not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustError {
    #[error("expected a certificate: BASE64(body).BASE64(signature), at most {MAX_CERT_LEN} bytes")]
    CertForm,
    #[error("the certificate's signature is not the network key's")]
    CertSignature,
    #[error("the certificate's body is not valid: {0}")]
    CertBody(String),
    #[error("expected a key: 44 characters of base64 (32 bytes)")]
    Key,
    #[error("expected an address prefix ADDR[/LEN], found `{0}`")]
    Prefix(String),
    /// A signed policy that does not open, or whose lines do not check.
    #[error("the policy: {0}")]
    Policy(String),
}

/// An address prefix a certificate allows (`10.0.0.0/24`, `fd00::1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

impl std::str::FromStr for Prefix {
    type Err = TrustError;
    fn from_str(s: &str) -> Result<Self, TrustError> {
        let bad = || TrustError::Prefix(s.chars().take(64).collect());
        let (a, l) = s.split_once('/').map_or((s, None), |(a, l)| (a, Some(l)));
        let addr: IpAddr = a.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match l {
            None => max,
            Some(l) => l.parse::<u8>().ok().filter(|&l| l <= max).ok_or_else(bad)?,
        };
        Ok(Prefix { addr, len })
    }
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl Prefix {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        vnet_core::policy::in_prefix(ip, self.addr, self.len)
    }
}

/// What a certificate says (its JSON body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertBody {
    pub network: String,
    pub host: String,
    /// The host's static X25519 public key (its secured links' identity).
    pub public_key: String,
    /// The host's Ed25519 claim key (its MAC records' signer).
    pub claim_key: String,
    /// The underlay addresses its record may advertise.
    pub addrs: Vec<String>,
    /// When the certificate stops being valid (seconds since the Unix
    /// epoch); none: it does not expire. Absent from the JSON when none, so
    /// certificates made before expiry existed verify as they did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<u64>,
    /// The policy groups (`rule ... from group G`) the host may put its
    /// VMs in: its MAC claims may name these and no other (a claim naming
    /// another is quarantined by every host). Absent when none: then its
    /// claims may name no group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

/// A certificate, checked: the body's fields decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCert {
    pub network: String,
    pub host: String,
    pub public_key: PeerKey,
    pub claim_key: [u8; 32],
    pub addrs: Vec<Prefix>,
    /// Seconds since the Unix epoch after which it is refused.
    pub not_after: Option<u64>,
    pub groups: Vec<String>,
}

impl HostCert {
    /// Whether the certificate has expired at `now_s` (seconds since the
    /// Unix epoch).
    pub fn expired(&self, now_s: u64) -> bool {
        self.not_after.is_some_and(|t| now_s > t)
    }

    /// Whether the certificate lets its host advertise `ip`.
    pub fn allows(&self, ip: IpAddr) -> bool {
        self.addrs.iter().any(|p| p.contains(ip))
    }

    /// Whether the certificate lets its host put a VM in policy group
    /// `group` (its `groups` name it; none: no group).
    pub fn allows_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    fn from_body(b: CertBody) -> Result<HostCert, TrustError> {
        let body = |m: &str| TrustError::CertBody(m.to_string());
        if !crate::layout::valid_name(&b.network) || !crate::layout::valid_name(&b.host) {
            return Err(body("network and host must be names of 1 to 63 of A-Za-z0-9._-"));
        }
        let public_key =
            PeerKey::from_base64(&b.public_key).ok_or_else(|| body("public_key is not a key"))?;
        let claim_key = PeerKey::from_base64(&b.claim_key).ok_or_else(|| body("claim_key is not a key"))?.0;
        if b.addrs.is_empty() || b.addrs.len() > MAX_CERT_ADDRS {
            return Err(body("addrs must name 1 to 16 prefixes"));
        }
        let addrs = b.addrs.iter().map(|a| a.parse()).collect::<Result<Vec<Prefix>, _>>()?;
        if b.groups.len() > MAX_CERT_GROUPS || !b.groups.iter().all(|g| crate::layout::valid_name(g)) {
            return Err(body("groups must be at most 16 names of 1 to 63 of A-Za-z0-9._-"));
        }
        Ok(HostCert {
            network: b.network,
            host: b.host,
            public_key,
            claim_key,
            addrs,
            not_after: b.not_after,
            groups: b.groups,
        })
    }
}

/// The network's public key: what every host checks certificates against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkPublic(pub [u8; 32]);

impl NetworkPublic {
    pub fn from_base64(s: &str) -> Result<Self, TrustError> {
        PeerKey::from_base64(s.trim()).map(|k| NetworkPublic(k.0)).ok_or(TrustError::Key)
    }

    /// Checks `cert` (a record's `cert` field) and decodes it.
    pub fn verify(&self, cert: &str) -> Result<HostCert, TrustError> {
        let body = open(&self.0, CERT_TAG, cert)?;
        let body: CertBody =
            serde_json::from_slice(&body).map_err(|e| TrustError::CertBody(e.to_string()))?;
        HostCert::from_body(body)
    }

    /// Checks a signed policy (the policy key's value) and decodes it,
    /// with the policies its lines declare.
    pub fn verify_policy(
        &self,
        text: &str,
    ) -> Result<(PolicyBody, vnet_control::policy::Policies), TrustError> {
        if text.len() > MAX_POLICY_LEN {
            return Err(TrustError::Policy(format!("longer than {MAX_POLICY_LEN} bytes")));
        }
        let body = open_sized(&self.0, POLICY_TAG, text, MAX_POLICY_LEN).map_err(|e| match e {
            TrustError::CertSignature => TrustError::Policy("its signature is not the network key's".into()),
            _ => TrustError::Policy("expected BASE64(body).BASE64(signature)".into()),
        })?;
        let b: PolicyBody = serde_json::from_slice(&body).map_err(|e| TrustError::Policy(e.to_string()))?;
        let p = b.policies()?;
        Ok((b, p))
    }

    /// Checks a revocation (a revoked key's value) and decodes it.
    pub fn verify_revocation(&self, text: &str) -> Result<Revocation, TrustError> {
        let body = open(&self.0, REVOKE_TAG, text)?;
        let r: Revocation = serde_json::from_slice(&body).map_err(|e| TrustError::CertBody(e.to_string()))?;
        r.check()?;
        Ok(r)
    }
}

impl std::fmt::Display for NetworkPublic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&b64().encode(self.0))
    }
}

/// An Ed25519 key from a 32-byte seed.
fn ed25519(seed: &[u8; 32]) -> Option<Ed25519KeyPair> {
    Ed25519KeyPair::from_seed_unchecked(seed).ok()
}

fn public_of(k: &Ed25519KeyPair) -> [u8; 32] {
    let mut p = [0u8; 32];
    p.copy_from_slice(k.public_key().as_ref());
    p
}

/// The network key: kept offline, it signs host certificates.
pub struct NetworkKey {
    seed: [u8; 32],
    pair: Ed25519KeyPair,
}

impl NetworkKey {
    /// A new random key.
    pub fn generate() -> Result<NetworkKey, TrustError> {
        use ring::rand::SecureRandom;
        let mut seed = [0u8; 32];
        ring::rand::SystemRandom::new().fill(&mut seed).map_err(|_| TrustError::Key)?;
        NetworkKey::from_seed(seed)
    }

    fn from_seed(seed: [u8; 32]) -> Result<NetworkKey, TrustError> {
        Ok(NetworkKey { pair: ed25519(&seed).ok_or(TrustError::Key)?, seed })
    }

    /// A key written by [`NetworkKey::secret`].
    pub fn from_base64(s: &str) -> Result<NetworkKey, TrustError> {
        NetworkKey::from_seed(PeerKey::from_base64(s.trim()).ok_or(TrustError::Key)?.0)
    }

    /// The secret, in base64 (for the key file).
    pub fn secret(&self) -> String {
        b64().encode(self.seed)
    }

    pub fn public(&self) -> NetworkPublic {
        NetworkPublic(public_of(&self.pair))
    }

    /// Signs `body` (checked first: what is signed is what hosts accept).
    pub fn sign(&self, body: &CertBody) -> Result<String, TrustError> {
        HostCert::from_body(body.clone())?;
        let json = serde_json::to_vec(body).map_err(|e| TrustError::CertBody(e.to_string()))?;
        Ok(seal(&self.pair, CERT_TAG, &json))
    }

    /// Signs a policy (its lines checked first: what is signed is what
    /// hosts accept).
    pub fn sign_policy(&self, body: &PolicyBody) -> Result<String, TrustError> {
        body.policies()?;
        let json = serde_json::to_vec(body).map_err(|e| TrustError::Policy(e.to_string()))?;
        let text = seal(&self.pair, POLICY_TAG, &json);
        if text.len() > MAX_POLICY_LEN {
            return Err(TrustError::Policy(format!("longer than {MAX_POLICY_LEN} bytes signed")));
        }
        Ok(text)
    }

    /// Signs a revocation (checked first), for its key ([`Revocation::key`]).
    pub fn revoke(&self, r: &Revocation) -> Result<String, TrustError> {
        r.check()?;
        let json = serde_json::to_vec(r).map_err(|e| TrustError::CertBody(e.to_string()))?;
        Ok(seal(&self.pair, REVOKE_TAG, &json))
    }
}

/// What a MAC claim's signature covers: every field of the record but
/// the signature, the cluster network's name and the MAC. A claim of
/// network 0 at epoch 0 is signed as version 1 signed it (hosts of that
/// version verify it); the addresses, when it names any, follow the rest.
fn claim_bytes(network: &str, mac: MacAddr, r: &MacRecord) -> Vec<u8> {
    let MacRecord { host, iface, at_ms, network: net, epoch, addrs, groups, sig: _ } = r;
    let mut b = if (*net, *epoch) == (0, 0) {
        CLAIM_TAG.to_vec()
    } else {
        let mut b = CLAIM_TAG_V2.to_vec();
        b.extend_from_slice(format!("{net}\0{epoch}\0").as_bytes());
        b
    };
    b.extend_from_slice(format!("{network}\0{mac}\0{host}\0{iface}\0{at_ms}").as_bytes());
    for a in addrs {
        b.extend_from_slice(format!("\0{a}").as_bytes());
    }
    // (A word no address is, so the groups cannot pass for addresses; none:
    // the bytes claims signed before groups were.)
    if !groups.is_empty() {
        b.extend_from_slice(b"\0groups");
        for g in groups {
            b.extend_from_slice(format!("\0{g}").as_bytes());
        }
    }
    b
}

/// A host's claim key, derived from its X25519 private key.
pub struct ClaimKey(Ed25519KeyPair);

impl std::fmt::Debug for ClaimKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClaimKey({})", self.public_base64())
    }
}

impl ClaimKey {
    /// The claim key of the host whose static private key is `private`.
    pub fn derive(private: &[u8; 32]) -> Option<ClaimKey> {
        vnet_keys::claim_key(private).map(ClaimKey)
    }

    pub fn public(&self) -> [u8; 32] {
        public_of(&self.0)
    }

    pub fn public_base64(&self) -> String {
        b64().encode(self.public())
    }

    /// The signature (base64) of claim `r` of `mac` in the cluster
    /// network `network` (`r.sig` is not read).
    pub fn sign(&self, network: &str, mac: MacAddr, r: &MacRecord) -> String {
        b64().encode(self.0.sign(&claim_bytes(network, mac, r)).as_ref())
    }

    /// The signature (base64) of host `host`'s node gateway (`mac`,
    /// `addr`) in the cluster network `network` (its record's `gateway`).
    pub fn sign_gateway(&self, network: &str, host: &str, mac: MacAddr, addr: IpAddr) -> String {
        b64().encode(self.0.sign(&gateway_bytes(network, host, mac, addr)).as_ref())
    }
}

/// The bytes a node gateway's signature covers: the tag, then
/// `network\0host\0mac\0address`.
fn gateway_bytes(network: &str, host: &str, mac: MacAddr, addr: IpAddr) -> Vec<u8> {
    let mut b = GATEWAY_TAG.to_vec();
    b.extend_from_slice(format!("{network}\0{host}\0{mac}\0{addr}").as_bytes());
    b
}

/// Whether `sig` is `claim_key`'s signature of host `host`'s node gateway
/// (`mac`, `addr`) in the cluster network `network`.
pub fn verify_gateway(
    claim_key: &[u8; 32],
    (network, host): (&str, &str),
    mac: MacAddr,
    addr: IpAddr,
    sig: Option<&str>,
) -> bool {
    let Some(Ok(sig)) = sig.map(|s| b64().decode(s)) else { return false };
    UnparsedPublicKey::new(&ED25519, claim_key).verify(&gateway_bytes(network, host, mac, addr), &sig).is_ok()
}

/// Whether `r.sig` is `claim_key`'s signature of claim `r`.
pub fn verify_claim(claim_key: &[u8; 32], network: &str, mac: MacAddr, r: &MacRecord) -> bool {
    let Some(Ok(sig)) = r.sig.as_deref().map(|s| b64().decode(s)) else { return false };
    UnparsedPublicKey::new(&ED25519, claim_key).verify(&claim_bytes(network, mac, r), &sig).is_ok()
}

/// A certificate's id: the first 16 bytes of the SHA-256 of its text, in
/// hex (what `vnetctl revoke ... cert ID` names and `show cluster` shows).
pub fn cert_id(cert: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, cert.as_bytes());
    d.as_ref()[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// What a revocation says (its JSON body): every certificate of `host`,
/// or only the one whose id is `cert`, is withdrawn from `network`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Revocation {
    pub network: String,
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    /// When it was signed (seconds since the Unix epoch), for people.
    pub at: u64,
}

impl Revocation {
    fn check(&self) -> Result<(), TrustError> {
        let body = |m: &str| TrustError::CertBody(m.to_string());
        if !crate::layout::valid_name(&self.network) || !crate::layout::valid_name(&self.host) {
            return Err(body("network and host must be names of 1 to 63 of A-Za-z0-9._-"));
        }
        if self.cert.as_deref().is_some_and(|c| !valid_cert_id(c)) {
            return Err(body("cert must be a certificate id: 32 hex digits"));
        }
        Ok(())
    }

    /// Its key in the store.
    pub fn key(&self) -> String {
        match &self.cert {
            Some(id) => crate::layout::revoked_cert_key(&self.network, id),
            None => crate::layout::revoked_host_key(&self.network, &self.host),
        }
    }
}

/// What a signed policy says (its JSON body): the whole policy of cluster
/// network `network`, as lines of vnetd's language (`policy`, `rule` and
/// `group` lines, nothing else), and its serial. A host takes a policy
/// whose serial is higher than the one it holds, and only such: an older
/// policy replayed is refused. Withdrawn by a policy with no lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyBody {
    pub network: String,
    pub serial: u64,
    pub lines: String,
}

impl PolicyBody {
    /// The policies its lines declare; or the first line that is not a
    /// `policy`, `rule` or `group` line, or does not parse or check (its
    /// line and column, what was expected).
    pub fn policies(&self) -> Result<vnet_control::policy::Policies, TrustError> {
        use vnet_control::Command;
        if !crate::layout::valid_name(&self.network) {
            return Err(TrustError::Policy("network must be a name of 1 to 63 of A-Za-z0-9._-".into()));
        }
        let cmds = vnet_control::parse(&self.lines).map_err(|e| TrustError::Policy(e.to_string()))?;
        if let Some(c) = cmds
            .iter()
            .find(|c| !matches!(c.item, Command::Policy { .. } | Command::Rule(_) | Command::Group { .. }))
        {
            return Err(TrustError::Policy(format!(
                "line {}, column {}: expected a `policy`, `rule` or `group` line (a signed policy declares \
                 nothing else)",
                c.pos.line, c.pos.column
            )));
        }
        let state =
            vnet_control::State::default().apply_all(&cmds).map_err(|e| TrustError::Policy(e.to_string()))?;
        Ok(state.policies)
    }
}

/// `BASE64(body) "." BASE64(signature of tag + body)`, at most
/// [`MAX_CERT_LEN`] bytes, opened: the body, once the signature checks.
fn open(public: &[u8; 32], tag: &[u8], text: &str) -> Result<Vec<u8>, TrustError> {
    open_sized(public, tag, text, MAX_CERT_LEN)
}

/// [`open`] for a text of at most `max` bytes.
fn open_sized(public: &[u8; 32], tag: &[u8], text: &str, max: usize) -> Result<Vec<u8>, TrustError> {
    if text.len() > max {
        return Err(TrustError::CertForm);
    }
    let (body, sig) = text.split_once('.').ok_or(TrustError::CertForm)?;
    let body = b64().decode(body).map_err(|_| TrustError::CertForm)?;
    let sig = b64().decode(sig).map_err(|_| TrustError::CertForm)?;
    UnparsedPublicKey::new(&ED25519, public)
        .verify(&[tag, &body].concat(), &sig)
        .map_err(|_| TrustError::CertSignature)?;
    Ok(body)
}

/// The sealed form [`open`] reads.
fn seal(pair: &Ed25519KeyPair, tag: &[u8], body: &[u8]) -> String {
    let sig = pair.sign(&[tag, body].concat());
    format!("{}.{}", b64().encode(body), b64().encode(sig.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `vnetctl pubkey claim` (vnet-client, through vnet-keys) prints the
    /// key this host signs its claims with; another host's private key, another key.
    #[test]
    fn the_claim_key_vnet_keys_shows_is_the_one_that_signs() {
        let k = ClaimKey::derive(&[7; 32]).unwrap();
        assert_eq!(vnet_keys::claim_public_base64(&[7; 32]).as_deref(), Some(k.public_base64().as_str()));
        assert_ne!(vnet_keys::claim_public_base64(&[8; 32]).as_deref(), Some(k.public_base64().as_str()));
    }

    fn body(host: &str, claim: &ClaimKey) -> CertBody {
        CertBody {
            network: "lab".into(),
            host: host.into(),
            public_key: PeerKey([7; 32]).to_string(),
            claim_key: claim.public_base64(),
            addrs: vec!["10.0.0.0/24".into(), "fd00::2".into()],
            groups: Vec::new(),
            not_after: None,
        }
    }

    /// Edges mutation testing found unchecked: the expiry instant, the
    /// certificate's names and its count of prefixes, the longest text
    /// opened, and how keys and prefixes print.
    #[test]
    fn certificates_at_their_edges_and_keys_as_they_print() {
        let nk = NetworkKey::generate().unwrap();
        let claim = ClaimKey::derive(&[1; 32]).unwrap();
        let expiring = CertBody { not_after: Some(100), ..body("h1", &claim) };
        let c = nk.public().verify(&nk.sign(&expiring).unwrap()).unwrap();
        assert!(!c.expired(100) && c.expired(101), "valid through its last second");
        // Refused when signed, or when checked (both check the body).
        let refused = |b: CertBody| nk.sign(&b).map_or(true, |c| nk.public().verify(&c).is_err());
        assert!(
            refused(CertBody { host: "bad host".into(), ..body("h1", &claim) }),
            "a host that is no name"
        );
        assert!(refused(CertBody { network: "bad net".into(), ..body("h1", &claim) }));
        let addrs = |n: usize| CertBody { addrs: vec!["10.0.0.1".into(); n], ..body("h1", &claim) };
        assert!(!refused(addrs(MAX_CERT_ADDRS)) && refused(addrs(MAX_CERT_ADDRS + 1)) && refused(addrs(0)));
        // One byte past the longest: refused for its length (not its signature).
        let long = format!("{}.{}", "A".repeat(2048), "A".repeat(MAX_CERT_LEN - 2048));
        assert_eq!(long.len(), MAX_CERT_LEN + 1);
        assert!(matches!(open(&nk.public().0, CERT_TAG, &long), Err(TrustError::CertForm)));
        // How they print.
        assert_eq!(NetworkPublic::from_base64(&nk.public().to_string()).unwrap(), nk.public());
        assert_eq!(format!("{claim:?}"), format!("ClaimKey({})", claim.public_base64()));
        assert_eq!("10.0.0.0/24".parse::<Prefix>().unwrap().to_string(), "10.0.0.0/24");
    }

    #[test]
    fn a_signed_certificate_verifies_and_any_change_breaks_it() {
        let nk = NetworkKey::generate().unwrap();
        let again = NetworkKey::from_base64(&nk.secret()).unwrap();
        assert_eq!(again.public(), nk.public());
        let claim = ClaimKey::derive(&[1; 32]).unwrap();
        let cert = nk.sign(&body("h1", &claim)).unwrap();
        let c = nk.public().verify(&cert).unwrap();
        assert_eq!((c.host.as_str(), c.claim_key), ("h1", claim.public()));
        assert!(c.allows("10.0.0.9".parse().unwrap()) && c.allows("fd00::2".parse().unwrap()));
        assert!(!c.allows("10.0.1.1".parse().unwrap()) && !c.allows("fd00::3".parse().unwrap()));
        // Another network key, a flipped byte, junk: refused.
        let other = NetworkKey::generate().unwrap();
        assert_eq!(other.public().verify(&cert), Err(TrustError::CertSignature));
        let (b, s) = cert.split_once('.').unwrap();
        let mut raw = b64().decode(b).unwrap();
        raw[12] ^= 1;
        let forged = format!("{}.{s}", b64().encode(raw));
        assert_eq!(nk.public().verify(&forged), Err(TrustError::CertSignature));
        for junk in ["", ".", "x.y", &"a".repeat(5000)] {
            assert!(nk.public().verify(junk).is_err(), "{junk}");
        }
        // A body that is not valid is never signed.
        let mut bad = body("h1", &claim);
        bad.addrs = vec!["10.0.0.0/33".into()];
        assert!(nk.sign(&bad).is_err());
    }

    #[test]
    fn claims_verify_only_with_their_key_and_their_exact_words() {
        let k = ClaimKey::derive(&[2; 32]).unwrap();
        assert_eq!(k.public(), ClaimKey::derive(&[2; 32]).unwrap().public(), "derived, not random");
        let mac: MacAddr = "52:54:00:00:00:01".parse().unwrap();
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        for (network, epoch, addrs) in
            [(0, 0, vec![]), (7, 0, vec![]), (0, 3, vec![]), (0, 0, vec![ip("10.0.0.5")])]
        {
            let mut r = MacRecord {
                host: "h1".into(),
                iface: "vm0".into(),
                at_ms: 5,
                network,
                epoch,
                addrs: addrs.clone(),
                groups: if epoch == 3 { vec!["web".into()] } else { vec![] },
                sig: None,
            };
            r.sig = Some(k.sign("lab", mac, &r));
            assert!(verify_claim(&k.public(), "lab", mac, &r));
            assert!(!verify_claim(&k.public(), "lab2", mac, &r));
            let changed = [
                MacRecord { host: "h2".into(), ..r.clone() },
                MacRecord { at_ms: 6, ..r.clone() },
                MacRecord { network: network + 1, ..r.clone() },
                MacRecord { epoch: epoch + 1, ..r.clone() },
                MacRecord { addrs: vec![ip("10.0.0.6")], ..r.clone() },
                MacRecord { addrs: [addrs.clone(), vec![ip("fd00::5")]].concat(), ..r.clone() },
                MacRecord { groups: vec!["db".into()], ..r.clone() },
                MacRecord { groups: [r.groups.clone(), vec!["db".into()]].concat(), ..r.clone() },
                MacRecord { sig: Some("!!".into()), ..r.clone() },
                MacRecord { sig: None, ..r.clone() },
            ];
            for c in &changed {
                assert!(!verify_claim(&k.public(), "lab", mac, c), "{c:?}");
            }
            let other = ClaimKey::derive(&[3; 32]).unwrap();
            assert!(!verify_claim(&other.public(), "lab", mac, &r));
        }
    }

    #[test]
    fn a_revocation_verifies_only_under_the_network_key_and_names_its_key() {
        let nk = NetworkKey::generate().unwrap();
        let r = Revocation { network: "lab".into(), host: "h3".into(), cert: None, at: 9 };
        let text = nk.revoke(&r).unwrap();
        assert_eq!(nk.public().verify_revocation(&text).unwrap(), r);
        assert_eq!(r.key(), "/vnet/lab/revoked/hosts/h3");
        let other = NetworkKey::generate().unwrap();
        assert_eq!(other.public().verify_revocation(&text), Err(TrustError::CertSignature));
        // A certificate is no revocation, nor a revocation a certificate.
        let claim = ClaimKey::derive(&[1; 32]).unwrap();
        let cert = nk.sign(&body("h3", &claim)).unwrap();
        assert!(nk.public().verify_revocation(&cert).is_err());
        assert!(nk.public().verify(&text).is_err());
        let id = cert_id(&cert);
        assert!(valid_cert_id(&id) && !valid_cert_id("xyz") && !valid_cert_id(&id.to_uppercase()));
        let one = Revocation { cert: Some(id.clone()), ..r.clone() };
        assert_eq!(one.key(), format!("/vnet/lab/revoked/certs/{id}"));
        assert!(nk.revoke(&Revocation { cert: Some("nothex".into()), ..r.clone() }).is_err());
        assert!(nk.revoke(&Revocation { host: "a/b".into(), ..r }).is_err());
    }

    #[test]
    fn prefixes_parse_and_contain() {
        let p: Prefix = "10.1.0.0/16".parse().unwrap();
        assert!(p.contains("10.1.200.3".parse().unwrap()));
        assert!(p.contains("::ffff:10.1.0.1".parse().unwrap()));
        assert!(!p.contains("10.2.0.1".parse().unwrap()));
        assert!("0.0.0.0/0".parse::<Prefix>().unwrap().contains("1.2.3.4".parse().unwrap()));
        for bad in ["10.0.0.0/33", "x", "10.0.0.0/", "::/129"] {
            assert!(bad.parse::<Prefix>().is_err(), "{bad}");
        }
    }

    /// A policy is signed only if its lines are policy, rule and group
    /// lines that check; a host reads back exactly what was signed.
    #[test]
    fn a_policy_is_signed_only_with_lines_that_declare_a_policy() {
        let nk = NetworkKey::generate().unwrap();
        let body = |lines: &str| PolicyBody { network: "lab".into(), serial: 1, lines: lines.into() };
        let ok = body("policy default deny\ngroup db 52:54:00:00:00:04\nrule db allow to group db proto tcp port 5432\n");
        let (b, p) = nk.public().verify_policy(&nk.sign_policy(&ok).unwrap()).unwrap();
        assert_eq!((b, p.rules.len(), p.groups.len()), (ok, 1, 1));
        let err = |lines: &str| nk.sign_policy(&body(lines)).unwrap_err().to_string();
        assert!(
            err("rule a allow\nlink x udp 10.0.0.1:9000\n").contains("line 2, column 1"),
            "{}",
            err("link x udp 10.0.0.1:9000")
        );
        assert!(err("rule a allow port 80\n").contains("the policy"), "a port without tcp or udp");
        let bad_net = PolicyBody { network: "no net".into(), ..body("") };
        assert!(nk.sign_policy(&bad_net).is_err());
        assert!(nk.public().verify_policy(&"A".repeat(MAX_POLICY_LEN + 1)).is_err());
    }
}
