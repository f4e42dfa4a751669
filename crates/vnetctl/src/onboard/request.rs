//! A host's signed join request and its fingerprint.
//!
//! The request names everything the host asks for: the network and its
//! own name, the id of the token it was made under, its X25519 public key (its links' key), its claim key (the
//! Ed25519 key derived from the same private key,
//! `vnet_cluster::trust::ClaimKey`), the
//! address it asked from and the etcd password it chose. It is signed by
//! that claim key over all of it (the password as its SHA-256), so a token
//! holder who overwrites the request while `join` waits can change none
//! of it without the host's private key: changed content no longer
//! verifies, and a request signed by another key has another
//! [`fingerprint`]. The fingerprint is over both public keys, so neither
//! can be swapped alone: the public key of the victim with the claim key
//! (and so the signature) of the attacker is another fingerprint. The
//! token's id binds a request to its token: an earlier request of the same
//! host (same key), filed again under a later token by whoever holds that
//! token, names the earlier token and is refused ([`RequestError::OtherToken`]).
//!
//! The claim key is derived as `vnet_cluster::trust::ClaimKey::derive`
//! derives it (SHA-256 of a tag and the private key, as an Ed25519 seed);
//! [`Request::sign`] checks its public half against `ClaimKey`'s, so the two cannot
//! drift apart unnoticed. Ed25519 and SHA-256 are `ring`'s.

use base64::Engine;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// What a join request's signature starts with: no claim, certificate,
/// revocation or policy signature can pass for one (their tags differ).
const REQUEST_TAG: &[u8] = b"vnet join request v1\0";
const FINGERPRINT_TAG: &[u8] = b"vnet join fingerprint v1\0";
/// `vnet_cluster::trust`'s derivation of the claim key.
const CLAIM_KEY_TAG: &[u8] = b"vnet claim key v1\0";
/// A request's longest JSON (what `approve` reads at most).
pub const MAX_REQUEST_LEN: usize = 4096;

/// Why a request is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("not a join request of this version of vnetctl: {0}")]
    Parse(String),
    #[error("longer than {MAX_REQUEST_LEN} bytes")]
    TooLong,
    #[error("the request names host {host} of network {network}, not the name it was filed under")]
    Elsewhere { network: String, host: String },
    #[error("its public key or claim key is not a key (32 bytes of base64)")]
    NotAKey,
    #[error(
        "it was made under another token (id {made_for}), not the host's outstanding one (id {outstanding}): \
         an earlier request filed again under a new token. On the host, run `vnetctl join` with the new token"
    )]
    OtherToken { made_for: String, outstanding: String },
    #[error("its address {0} is not a unicast address")]
    Address(IpAddr),
    #[error(
        "its signature does not verify under its own claim key: the request's content (key, claim key, \
         address or password) differs from what the host signed, so it was replaced or altered after signing"
    )]
    Signature,
    #[error("the private key: {0}")]
    Key(String),
}

/// What a host asks for, under which token: what [`Request::sign`] signs
/// beside the keys.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    pub network: &'a str,
    pub host: &'a str,
    /// The id of the token the request is filed under.
    pub token: &'a str,
    pub addr: IpAddr,
    pub password: &'a str,
}

/// A host's request to join (`/vnet-join/NET/HOST`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub network: String,
    pub host: String,
    /// The id of the token it was filed under (`token::Token::id`).
    pub token: String,
    pub public_key: String,
    pub claim_key: String,
    pub addr: IpAddr,
    /// The etcd password the host chose (readable by root only: the join
    /// user may write its request, not read it).
    pub password: String,
    /// The claim key's signature of [`Request::signed_bytes`] (base64).
    pub sig: String,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// Each field with its length before it: no two requests sign the same bytes.
fn field(b: &mut Vec<u8>, f: &[u8]) {
    b.extend_from_slice(&(f.len() as u32).to_be_bytes());
    b.extend_from_slice(f);
}

fn sha256(b: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, b).as_ref().to_vec()
}

/// What the admin compares and pins: SHA-256 over the public key and the
/// claim key, its first 16 bytes in hex.
pub fn fingerprint(public_key: &str, claim_key: &str) -> String {
    let mut b = FINGERPRINT_TAG.to_vec();
    field(&mut b, public_key.as_bytes());
    field(&mut b, claim_key.as_bytes());
    sha256(&b)[..16].iter().map(|x| format!("{x:02x}")).collect()
}

fn key32(s: &str) -> Option<[u8; 32]> {
    vnet_control::PeerKey::from_base64(s).map(|k| k.0)
}

impl Request {
    fn signed_bytes(&self) -> Vec<u8> {
        let mut b = REQUEST_TAG.to_vec();
        let addr = self.addr.to_string();
        for f in [&self.network, &self.host, &self.token, &self.public_key, &self.claim_key, &addr] {
            field(&mut b, f.as_bytes());
        }
        field(&mut b, &sha256(self.password.as_bytes()));
        b
    }

    pub fn fingerprint(&self) -> String {
        fingerprint(&self.public_key, &self.claim_key)
    }

    /// The request of the host whose private key (base64) is `private`,
    /// under the token whose id is `token`.
    pub fn sign(private: &str, to: Asked<'_>) -> Result<Request, RequestError> {
        let key = |e: &dyn std::fmt::Display| RequestError::Key(e.to_string());
        let secret = key32(private.trim()).ok_or(RequestError::NotAKey)?;
        let public_key = vnet_client::keys::pubkey(private).map_err(|e| key(&e))?;
        let claim_key = vnet_client::keys::claim_pubkey(private).map_err(|e| key(&e))?;
        let seed = sha256(&[CLAIM_KEY_TAG, &secret].concat());
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed).map_err(|e| key(&e))?;
        if b64().encode(pair.public_key().as_ref()) != claim_key {
            return Err(RequestError::Key("the claim key's derivation changed (vnet_cluster::trust)".into()));
        }
        let mut r = Request {
            network: to.network.to_string(),
            host: to.host.to_string(),
            token: to.token.to_string(),
            public_key,
            claim_key,
            addr: to.addr,
            password: to.password.to_string(),
            sig: String::new(),
        };
        r.sig = b64().encode(pair.sign(&r.signed_bytes()).as_ref());
        Ok(r)
    }

    /// Reads a request found at `/vnet-join/NETWORK/HOST` and checks it:
    /// filed under its own names, its keys keys, its address unicast, its
    /// signature its claim key's over all of it, made for the token of id
    /// `token` (the host's outstanding one).
    pub fn verified(json: &[u8], network: &str, host: &str, token: &str) -> Result<Request, RequestError> {
        if json.len() > MAX_REQUEST_LEN {
            return Err(RequestError::TooLong);
        }
        let r: Request = serde_json::from_slice(json).map_err(|e| RequestError::Parse(e.to_string()))?;
        if r.network != network || r.host != host {
            return Err(RequestError::Elsewhere { network: r.network, host: r.host });
        }
        key32(&r.public_key).ok_or(RequestError::NotAKey)?;
        let claim = key32(&r.claim_key).ok_or(RequestError::NotAKey)?;
        if r.addr.is_unspecified() || r.addr.is_multicast() {
            return Err(RequestError::Address(r.addr));
        }
        let sig = b64().decode(&r.sig).map_err(|_| RequestError::Signature)?;
        UnparsedPublicKey::new(&ED25519, claim)
            .verify(&r.signed_bytes(), &sig)
            .map_err(|_| RequestError::Signature)?;
        if token.is_empty() || r.token != token {
            return Err(RequestError::OtherToken { made_for: r.token, outstanding: token.to_string() });
        }
        Ok(r)
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "00112233445566778899aabbccddeeff";

    fn signed_under(private: &str, token: &str) -> Request {
        let addr = "10.0.0.2".parse().unwrap();
        Request::sign(private, Asked { network: "lab", host: "h1", token, addr, password: "pw-of-h1" })
            .unwrap()
    }

    fn signed(private: &str) -> Request {
        signed_under(private, TOKEN)
    }

    #[test]
    fn a_signed_request_verifies_and_its_fingerprint_covers_both_keys() {
        let k = vnet_client::keys::genkey().unwrap();
        let r = signed(&k);
        assert_eq!(r.claim_key, vnet_client::keys::claim_pubkey(&k).unwrap());
        assert_eq!(Request::verified(&r.to_json(), "lab", "h1", TOKEN).unwrap(), r);
        assert_eq!(r.fingerprint().len(), 32);
        // Another claim key beside the same public key: another fingerprint.
        let other = signed(&vnet_client::keys::genkey().unwrap());
        assert_ne!(fingerprint(&r.public_key, &other.claim_key), r.fingerprint());
        assert_ne!(fingerprint(&other.public_key, &r.claim_key), r.fingerprint());
    }

    /// Each way of replacing a request while `join` waits, as the token
    /// holder would: every field changed alone fails the signature, and a
    /// request signed by the attacker's own key has the attacker's
    /// fingerprint (which the pin refuses).
    #[test]
    fn every_replaced_field_is_refused() {
        let k = vnet_client::keys::genkey().unwrap();
        let r = signed(&k);
        let attacker = signed(&vnet_client::keys::genkey().unwrap());
        type Change = fn(&mut Request, &Request);
        let changed: [(&str, Change); 6] = [
            ("token", |r, _| r.token = "ffeeddccbbaa99887766554433221100".into()),
            ("password", |r, _| r.password = "attacker's".into()),
            ("address", |r, _| r.addr = "10.0.0.66".parse().unwrap()),
            ("claim key", |r, a| r.claim_key = a.claim_key.clone()),
            ("public key", |r, a| r.public_key = a.public_key.clone()),
            ("claim key and its signature", |r, a| {
                r.claim_key = a.claim_key.clone();
                r.sig = a.sig.clone();
            }),
        ];
        for (what, change) in changed {
            let mut bad = r.clone();
            change(&mut bad, &attacker);
            assert_eq!(
                Request::verified(&bad.to_json(), "lab", "h1", TOKEN),
                Err(RequestError::Signature),
                "{what} replaced"
            );
        }
        // The attacker's own, whole: it verifies, under another fingerprint.
        let theirs = Request::verified(&attacker.to_json(), "lab", "h1", TOKEN).unwrap();
        assert_ne!(theirs.fingerprint(), r.fingerprint());
        // A request filed under another name, or not a request at all.
        assert!(matches!(
            Request::verified(&r.to_json(), "lab", "h2", TOKEN),
            Err(RequestError::Elsewhere { .. })
        ));
        assert!(matches!(Request::verified(b"{}", "lab", "h1", TOKEN), Err(RequestError::Parse(_))));
        let mut extra: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
        extra["groups"] = "db".into();
        assert!(matches!(
            Request::verified(extra.to_string().as_bytes(), "lab", "h1", TOKEN),
            Err(RequestError::Parse(_))
        ));
        assert_eq!(Request::verified(&vec![b' '; 5000], "lab", "h1", TOKEN), Err(RequestError::TooLong));
        // The control: the same request, untouched, passes.
        assert!(Request::verified(&r.to_json(), "lab", "h1", TOKEN).is_ok());
    }

    /// An earlier request of the host (its own key, its own signature),
    /// filed again under a later token by whoever holds that token: it
    /// names the earlier token, and is refused with a message that says
    /// so. The control: the host's request made under the later token
    /// passes. (A request naming the later token but signed for the
    /// earlier one fails the signature: `every_replaced_field_is_refused`.)
    #[test]
    fn an_earlier_request_filed_again_under_a_new_token_is_refused() {
        let k = vnet_client::keys::genkey().unwrap();
        let (earlier, later) = (TOKEN, "ffeeddccbbaa99887766554433221100");
        let old = signed_under(&k, earlier);
        let e = Request::verified(&old.to_json(), "lab", "h1", later).unwrap_err();
        assert_eq!(e, RequestError::OtherToken { made_for: earlier.into(), outstanding: later.into() });
        assert!(e.to_string().contains("earlier request filed again under a new token"), "{e}");
        // A record of an older vnetctl names no token: nothing is taken under it.
        assert!(matches!(
            Request::verified(&old.to_json(), "lab", "h1", ""),
            Err(RequestError::OtherToken { .. })
        ));
        let new = signed_under(&k, later);
        assert_eq!(Request::verified(&new.to_json(), "lab", "h1", later).unwrap(), new);
        assert_eq!(new.fingerprint(), old.fingerprint(), "the same host, the same key");
    }
}
