//! A host's keys, below the engine and the cluster: its static key pair
//! ([`Identity`], the Noise handshake's), the claim key derived from it
//! (cluster mode signs its MAC claims with it), and the names a network
//! or host may have. vnet-client (vnetctl, vnet-cni, the libvirt hook)
//! links this, not the engine's or the cluster's crate; vnet-engine
//! re-exports [`Identity`] and [`KeyError`] from `secure`, vnet-cluster
//! derives its `trust::ClaimKey` through [`claim_key`] and re-exports
//! [`valid_name`] from `layout`.

use ring::rand::SecureRandom;
use ring::signature::{Ed25519KeyPair, KeyPair};

/// Why keys could not be made or read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    Random,
    Noise(String),
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyError::Random => f.write_str("the system's random source failed"),
            KeyError::Noise(e) => write!(f, "Noise: {e}"),
        }
    }
}

impl std::error::Error for KeyError {}

/// A host's static key pair.
pub struct Identity {
    private: [u8; 32],
    public: [u8; 32],
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("public", &self.public).finish_non_exhaustive()
    }
}

impl Identity {
    /// The pair whose private half is `private` (the public half is derived).
    pub fn from_private(private: [u8; 32]) -> Result<Identity, KeyError> {
        use snow::resolvers::{CryptoResolver, DefaultResolver};
        #[allow(unused_imports)]
        use snow::types::Dh;
        let mut dh = DefaultResolver
            .resolve_dh(&snow::params::DHChoice::Curve25519)
            .ok_or_else(|| KeyError::Noise("no X25519".into()))?;
        dh.set(&private);
        let mut public = [0u8; 32];
        public.copy_from_slice(dh.pubkey());
        Ok(Identity { private, public })
    }

    /// A new random pair.
    pub fn generate() -> Result<Identity, KeyError> {
        let mut private = [0u8; 32];
        ring::rand::SystemRandom::new().fill(&mut private).map_err(|_| KeyError::Random)?;
        Identity::from_private(private)
    }

    pub fn public(&self) -> [u8; 32] {
        self.public
    }

    pub fn private(&self) -> [u8; 32] {
        self.private
    }
}

const CLAIM_KEY_TAG: &[u8] = b"vnet claim key v1\0";

/// The claim key (Ed25519) of the host whose static private key is
/// `private`: derived from it, so a host keeps one secret.
pub fn claim_key(private: &[u8; 32]) -> Option<Ed25519KeyPair> {
    let d = ring::digest::digest(&ring::digest::SHA256, &[CLAIM_KEY_TAG, private].concat());
    let mut seed = [0u8; 32];
    seed.copy_from_slice(d.as_ref());
    Ed25519KeyPair::from_seed_unchecked(&seed).ok()
}

/// The public half of [`claim_key`], in base64 (as cluster mode's
/// records and `vnetctl pubkey claim` show it).
pub fn claim_public_base64(private: &[u8; 32]) -> Option<String> {
    use base64::Engine;
    claim_key(private).map(|k| base64::engine::general_purpose::STANDARD.encode(k.public_key().as_ref()))
}

/// Whether `name` may name a network or a host: 1 to 63 of `A-Za-z0-9._-`.
pub fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}
