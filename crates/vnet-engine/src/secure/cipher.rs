//! What a secured link's datagrams get ([`Mode`]) and which AEAD seals
//! them ([`Aead`]), and how the two ends agree on it ([`CipherPolicy`]).

use aws_lc_rs::aead;
use vnet_control::Cipher;

/// An initiation's cipher byte: the AEAD (low bits), that the initiator
/// negotiates (so the byte is in the prologue, and the response says what
/// the responder prefers), whether the initiator prefers AES-256-GCM, and
/// whether its link names the cipher (so it refuses any other).
pub(super) const NEGOTIATES: u8 = 0x10;
pub(super) const PREFERS_AES: u8 = 0x20;
pub(super) const PINNED: u8 = 0x40;
pub(super) const AEAD_BITS: u8 = 0x0f;

/// What a link's datagrams get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A tag over the clear datagram.
    Auth,
    /// Sealed: encrypted and tagged.
    Encrypt,
}

impl Mode {
    pub(super) fn byte(self) -> u8 {
        match self {
            Mode::Auth => 1,
            Mode::Encrypt => 2,
        }
    }
}

/// A session's AEAD: its id is byte 3 of every secured datagram, and it
/// names the Noise protocol (`Noise_IK_25519_<cipher>_BLAKE2s`) whose
/// handshake made the session, so the transcript binds it.
///
/// Both come from `aws-lc-rs` (AWS-LC's assembly, constant-time where it
/// accelerates; rustls's default provider). Its AES-256-GCM has AVX-512
/// VAES/VPCLMULQDQ code: on this project's bench machine it seals 1420-byte
/// datagrams 1.3x and 8948-byte ones 1.5x as fast as `ring`'s AVX2 code
/// (`docs/SECURITY.md`, "Ciphers"). `ring` keeps the handshake's MACs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aead {
    ChaCha20Poly1305,
    Aes256Gcm,
}

impl Aead {
    pub(super) fn id(self) -> u8 {
        match self {
            Aead::ChaCha20Poly1305 => 0,
            Aead::Aes256Gcm => 1,
        }
    }

    pub(super) fn from_id(b: u8) -> Option<Aead> {
        match b {
            0 => Some(Aead::ChaCha20Poly1305),
            1 => Some(Aead::Aes256Gcm),
            _ => None,
        }
    }

    pub(super) fn noise(self) -> &'static str {
        match self {
            Aead::ChaCha20Poly1305 => "Noise_IK_25519_ChaChaPoly_BLAKE2s",
            Aead::Aes256Gcm => "Noise_IK_25519_AESGCM_BLAKE2s",
        }
    }

    pub(super) fn algorithm(self) -> &'static aead::Algorithm {
        match self {
            Aead::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
            Aead::Aes256Gcm => &aead::AES_256_GCM,
        }
    }

    /// The `cipher` word that names it.
    pub fn word(self) -> &'static str {
        match self {
            Aead::ChaCha20Poly1305 => Cipher::ChaCha20Poly1305.word(),
            Aead::Aes256Gcm => Cipher::Aes256Gcm.word(),
        }
    }
}

/// Whether this CPU runs AES-256-GCM in hardware (AES rounds and carry-less
/// multiplication): then it is several times cheaper per byte than
/// ChaCha20-Poly1305 (`docs/SECURITY.md`, "Ciphers"); without them, AES in
/// software is slower, and not constant-time in every library.
pub fn cpu_has_fast_aes() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes") && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes") && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// What a link accepts and offers: its `cipher` option and this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CipherPolicy {
    pub cipher: Cipher,
    /// This host prefers AES-256-GCM (its CPU does it fast).
    pub fast_aes: bool,
}

impl CipherPolicy {
    /// The policy of a link with option `cipher` on this CPU.
    pub fn local(cipher: Cipher) -> Self {
        CipherPolicy { cipher, fast_aes: cpu_has_fast_aes() }
    }

    /// Whether a session may use `a`.
    pub(super) fn allows(self, a: Aead) -> bool {
        match self.cipher {
            Cipher::Auto => true,
            Cipher::Aes256Gcm => a == Aead::Aes256Gcm,
            Cipher::ChaCha20Poly1305 => a == Aead::ChaCha20Poly1305,
        }
    }

    /// Whether this end says it prefers AES-256-GCM.
    pub(super) fn prefers_aes(self) -> bool {
        match self.cipher {
            Cipher::Auto => self.fast_aes,
            Cipher::Aes256Gcm => true,
            Cipher::ChaCha20Poly1305 => false,
        }
    }

    /// The AEAD to use with a peer that prefers AES or not (`None`: not
    /// known yet, taken as yes): a named cipher, else AES-256-GCM when both
    /// ends prefer it.
    pub(super) fn choose(self, peer_aes: Option<bool>) -> Aead {
        match self.cipher {
            Cipher::Aes256Gcm => Aead::Aes256Gcm,
            Cipher::ChaCha20Poly1305 => Aead::ChaCha20Poly1305,
            Cipher::Auto if self.fast_aes && peer_aes != Some(false) => Aead::Aes256Gcm,
            Cipher::Auto => Aead::ChaCha20Poly1305,
        }
    }

    /// The cipher byte of an initiation offering `a`.
    pub(super) fn offer(self, a: Aead) -> u8 {
        let pinned = if self.cipher == Cipher::Auto { 0 } else { PINNED };
        a.id() | NEGOTIATES | pinned | if self.prefers_aes() { PREFERS_AES } else { 0 }
    }
}

#[cfg(test)]
mod tests {
    /// What std detects of this CPU: both instructions, or no fast AES.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn fast_aes_is_aes_rounds_and_carry_less_multiplication_both() {
        let both =
            std::arch::is_x86_feature_detected!("aes") && std::arch::is_x86_feature_detected!("pclmulqdq");
        assert_eq!(super::cpu_has_fast_aes(), both);
    }
}
