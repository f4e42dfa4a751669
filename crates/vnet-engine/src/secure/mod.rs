//! Authenticated and encrypted `vnet` links (`security auth|encrypt`).
//!
//! The construction is WireGuard's, from vetted parts, nothing invented:
//!
//! - Each host has a static X25519 key pair ([`Identity`]); a link names its
//!   peer's public key. Sessions come from a Noise IK handshake
//!   (`Noise_IK_25519_ChaChaPoly_BLAKE2s`, through the `snow` crate), whose
//!   prologue binds the link's mode, so an `auth` end and an `encrypt` end
//!   never agree on a session.
//! - Data datagrams carry a receiver index and a 64-bit counter, the AEAD
//!   nonce (AES-256-GCM or ChaCha20-Poly1305 from `aws-lc-rs`, keyed by the
//!   handshake's split; [`Aead`] says why that library).
//!   `encrypt` seals the `vnet` datagram with the header as associated data;
//!   `auth` sends it in the clear and seals nothing but a tag over header and
//!   payload (integrity at the price of one Poly1305 pass).
//! - A counter is accepted once, within a 1984-message window (after the
//!   tag verified, so forgeries cannot move the window).
//! - The initiator rekeys after [`Timers::rekey_after_ns`] or
//!   [`Timers::rekey_after_messages`]; the old session keeps receiving until
//!   it expires, and a responder sends on a new session only once data
//!   arrived on it (the initiator's keepalive), so a rekey stalls nothing
//!   and a replayed initiation makes a session nobody confirms. Sessions older than
//!   [`Timers::reject_after_ns`] are gone.
//! - An initiation carries a MAC (HMAC-SHA256 keyed by the responder's
//!   public key) checked before any Diffie-Hellman, so junk costs one HMAC;
//!   initiations answered per second are limited per link; an initiation
//!   whose timestamp is not newer than the last one accepted is a replay
//!   (the last one is kept across restarts: [`SecureLink::last_init`] and
//!   [`SecureLink::set_last_init`], which vnetd stores in its state
//!   directory). Crossed initiations are settled only after the peer's
//!   initiation was authenticated and found new.
//! - Under load (half the link's handshake budget spent, or spent within
//!   the last second: the budget refills between flood packets, and a
//!   peer's initiation must not slip through on such a token), an
//!   initiation is answered only when its second MAC is keyed by a cookie: a keyed hash
//!   of the sender's address and port under a secret that changes every
//!   two minutes. Without one, it gets a cookie reply (sealed under a key
//!   of the responder's public key, bound to the initiation's first MAC)
//!   and no Diffie-Hellman. Replies go to the link's remote address, the
//!   peer's vnetd, whatever the source: a spoofer never sees a cookie, the
//!   peer drops the ones it did not ask for (an index compare), and a reply
//!   is smaller than what caused it. The real peer retries with its cookie
//!   and spends a budget of its own that spoofers cannot reach: WireGuard's
//!   defence, so a flood of initiations with a right first MAC never
//!   starves the peer's handshakes.
//!
//! Nothing here allocates for a datagram: a failed datagram costs one AEAD
//! check (or one HMAC) and a counter. Handshake state is one pending
//! initiation and three sessions per link, whatever arrives.
//!
//! Wire layouts are in `docs/wire.md` ("Secured links"); the threat model
//! in `docs/SECURITY.md`.

use arc_swap::ArcSwapOption;
use aws_lc_rs::aead::{self, LessSafeKey, UnboundKey};
use ring::hmac;
use ring::rand::SecureRandom;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use vnet_control::Cipher;

mod cipher;
mod handshake;
mod identity;
mod session;

pub use cipher::{cpu_has_fast_aes, Aead, CipherPolicy, Mode};
use cipher::{AEAD_BITS, NEGOTIATES, PINNED, PREFERS_AES};
pub use identity::{Identity, KeyError, Timers};
pub use session::Session;

/// The first byte of every secured datagram (a `vnet` v1 reader drops it).
pub const VERSION: u8 = 2;
const T_INIT: u8 = 1;
const T_RESP: u8 = 2;
const T_COOKIE: u8 = 3;
const T_DATA: u8 = 4;
/// version, type, mode, reserved, receiver index (LE), counter (LE).
pub const DATA_HEADER: usize = 16;
/// The AEAD tag.
pub const TAG: usize = 16;
/// Bytes a secured data datagram adds to the `vnet` datagram it carries.
pub const OVERHEAD: usize = DATA_HEADER + TAG;
const MAC: usize = 32;
/// Noise message 1 of IK with an 8-byte payload: e, s (sealed), payload (sealed).
const INIT_NOISE: usize = 32 + 48 + 8 + 16;
/// version, type, mode, reserved, sender index, Noise message, MAC, cookie MAC.
pub const INIT_LEN: usize = 8 + INIT_NOISE + 2 * MAC;
/// Where an initiation's first MAC starts (it covers what is before it).
const INIT_MAC1: usize = 8 + INIT_NOISE;
/// How long a link stays under load after its handshake budget was last
/// found half spent (WireGuard holds it for a second too).
const LOAD_HOLD_NS: u64 = 1_000_000_000;
/// A cookie (the key of an initiation's second MAC).
const COOKIE: usize = 16;
/// The random nonce of a cookie reply.
const COOKIE_NONCE: usize = 12;
/// version, type, mode, reserved, receiver index, nonce, sealed cookie.
pub const COOKIE_LEN: usize = 8 + COOKIE_NONCE + COOKIE + TAG;
/// How long a cookie secret (and a cookie) lives.
const COOKIE_LIFE_NS: u64 = 120_000_000_000;
/// Noise message 2 of IK with the responder's one-byte preference: e, payload, tag.
const RESP_NOISE: usize = 32 + 1 + 16;
/// version, type, mode, cipher, sender index, receiver index, Noise message, MAC.
pub const RESP_LEN: usize = 12 + RESP_NOISE + MAC;
/// The response to an initiation that does not negotiate (an earlier
/// vnetd's: ChaCha20-Poly1305): no payload.
const PLAIN_RESP_LEN: usize = RESP_LEN - 1;
/// Messages a session may seal or open at most (then it is dead).
const REJECT_AFTER_MESSAGES: u64 = u64::MAX - (1 << 13);
const WORDS: usize = 32;
/// Counters this far below the highest seen are refused as too old.
const WINDOW: u64 = ((WORDS - 1) * 64) as u64;

/// What a link's security did. Every datagram that does not end in a frame
/// (or a handshake) is in one of these. Serialized as named here (`show
/// links` of a secured link, `vnet_link_<name>`).
#[derive(Debug, Default, serde::Serialize)]
pub struct SecureStats {
    pub handshakes_sent: AtomicU64,
    pub handshakes_answered: AtomicU64,
    pub sessions: AtomicU64,
    /// Data datagrams whose tag did not verify, or for no session of ours.
    pub auth_failures: AtomicU64,
    /// Data datagrams (or initiations) seen before.
    pub replays: AtomicU64,
    /// Handshake messages that failed (MAC, Noise, wrong peer key, length).
    pub bad_handshakes: AtomicU64,
    /// Initiations not answered: with a valid cookie, but over the rate of those.
    pub rate_limited: AtomicU64,
    /// Initiations answered with a cookie (under load) instead of a session.
    pub cookies_sent: AtomicU64,
    /// Cookies the peer sent us, and our initiations that carried one.
    pub cookies_received: AtomicU64,
    /// Datagrams without protection on a secured link.
    pub unauthenticated: AtomicU64,
    /// Frames not sent: no session yet.
    pub no_session: AtomicU64,
    /// Initiations offering a cipher this link does not accept (its
    /// `cipher` names another): no session, and no answer.
    pub cipher_refused: AtomicU64,
    /// Initiations whose timestamp is more than [`MAX_CLOCK_AHEAD_NS`]
    /// ahead of this host's clock: refused, not adopted (adopted, it would
    /// refuse the peer's every later initiation, even across restarts).
    pub future_timestamps: AtomicU64,
}

/// How far ahead of this host's clock a peer's initiation timestamp may be
/// (clocks differ; NTP keeps them within far less).
pub const MAX_CLOCK_AHEAD_NS: u64 = 10 * 60 * 1_000_000_000;

/// A secured link on a host without a key pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this vnetd has no key pair: start it with `--key FILE` (see `vnetctl genkey`)")]
pub struct NoKeyPair;

/// The security link `def` asks for, with `identity` as this host's key
/// pair: `None` for an unsecured link, an error when a secured link needs
/// a key this host does not have.
pub fn for_link(
    def: &vnet_control::LinkDef,
    identity: Option<&Arc<Identity>>,
    timers: Timers,
) -> Result<Option<SecureLink>, NoKeyPair> {
    use vnet_control::{Security, Transport};
    let Transport::Udp { security, .. } = def.transport else { return Ok(None) };
    let (mode, peer) = match security {
        Security::None => return Ok(None),
        Security::Auth(k) => (Mode::Auth, k),
        Security::Encrypt(k) => (Mode::Encrypt, k),
    };
    let Transport::Udp { cipher, .. } = def.transport else { return Ok(None) };
    let id = identity.ok_or(NoKeyPair)?;
    Ok(Some(SecureLink::new(mode, id.clone(), peer.0, timers).with_policy(CipherPolicy::local(cipher))))
}

/// What [`SecureLink::open`] made of a datagram.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// A verified `vnet` datagram at this range of the buffer (empty: a keepalive).
    Data(core::ops::Range<usize>),
    /// A handshake message to send back to the peer: `reply[..n]`.
    Reply(usize),
    /// Nothing to deliver or send (counted in the stats).
    Nothing,
}

struct Pending {
    hs: snow::HandshakeState,
    local: u32,
    sent_ns: u64,
    /// The initiation's first MAC: a cookie reply is bound to it.
    mac1: [u8; MAC],
    aead: Aead,
}

/// A token bucket: tokens (x 1e9), refilled at a rate a second.
#[derive(Default)]
struct Bucket {
    tokens: u64,
}

impl Bucket {
    const ONE: u64 = 1_000_000_000;

    fn full(per_sec: u64) -> Self {
        Bucket { tokens: per_sec * Self::ONE }
    }

    fn refill(&mut self, elapsed_ns: u64, per_sec: u64) {
        self.tokens = self.tokens.saturating_add(elapsed_ns.saturating_mul(per_sec)).min(per_sec * Self::ONE);
    }

    fn take(&mut self) -> bool {
        let ok = self.tokens >= Self::ONE;
        if ok {
            self.tokens -= Self::ONE;
        }
        ok
    }
}

#[derive(Default)]
struct State {
    current: Option<Arc<Session>>,
    previous: Option<Arc<Session>>,
    /// A responder's session until data arrives on it.
    next: Option<Arc<Session>>,
    pending: Option<Pending>,
    /// The newest initiation timestamp accepted from the peer.
    last_init: u64,
    /// Answered initiations: any, and those with a valid cookie MAC; and
    /// when both were filled.
    budget: Bucket,
    cookied: Bucket,
    filled_ns: u64,
    /// Until when the link counts as under load (a second after the budget
    /// was last found half spent).
    loaded_until_ns: u64,
    /// The key of our cookies (from a random secret), and when it was made.
    secret: Option<(hmac::Key, u64)>,
    /// The cookie the peer gave us, and when.
    cookie: Option<([u8; COOKIE], u64)>,
    /// Whether the peer prefers AES-256-GCM, as its last authenticated
    /// handshake message said (`None`: not heard yet).
    peer_aes: Option<bool>,
    /// The session indices this link listed last, oldest first.
    listed: [Option<u32>; Sessions::PER_LINK],
    /// The current session's AEAD is not the one both ends prefer (learnt
    /// from the response that made it): handshake again at once.
    renegotiate: bool,
}

/// The security of one link.
pub struct SecureLink {
    mode: Mode,
    policy: CipherPolicy,
    identity: Arc<Identity>,
    peer: [u8; 32],
    /// Cookie replies: sealed to us (ours) and from the peer (theirs).
    cookie_ours: LessSafeKey,
    cookie_theirs: LessSafeKey,
    /// MAC keys of initiations and responses to the peer, and to us.
    mac_to_peer: hmac::Key,
    mac_to_us: hmac::Key,
    timers: Timers,
    /// The session frames are sealed with.
    tx: ArcSwapOption<Session>,
    state: Mutex<State>,
    pub stats: SecureStats,
    /// Where this link's session indices are listed for the host (its
    /// link id among them), if anywhere ([`Sessions`]).
    listed: Option<(Arc<Sessions>, u32)>,
}

/// The host's session indices and the links they belong to, so that a
/// secured datagram from an address no link is configured with finds its
/// candidate link with one hash lookup, not a look into every link under
/// its lock. Bounded: a link lists its last [`Sessions::PER_LINK`]
/// indices (it holds at most three sessions and one handshake), and takes
/// them out when it goes. A stale entry is harmless: the caller
/// authenticates the datagram before anything moves.
#[derive(Debug, Default)]
pub struct Sessions {
    by_index: Mutex<rustc_hash::FxHashMap<u32, u32>>,
}

impl Sessions {
    /// Indices a link keeps listed.
    pub const PER_LINK: usize = 4;

    fn lock(&self) -> std::sync::MutexGuard<'_, rustc_hash::FxHashMap<u32, u32>> {
        self.by_index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The link whose session has receiver index `index`, if one listed it.
    pub fn link_of(&self, index: u32) -> Option<u32> {
        self.lock().get(&index).copied()
    }

    /// Indices listed (for tests and bounds).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for SecureLink {
    fn drop(&mut self) {
        if let Some((list, id)) = &self.listed {
            let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
            let mut m = list.lock();
            for i in st.listed.iter().flatten() {
                if m.get(i) == Some(id) {
                    m.remove(i);
                }
            }
        }
    }
}

impl std::fmt::Debug for SecureLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecureLink").field("mode", &self.mode).finish_non_exhaustive()
    }
}

/// SHA-256 of a label and a public key: the key of the MACs to its owner
/// ("vnet mac1 v2") and of the cookie replies from it ("vnet cookie v2").
fn labelled(label: &[u8], public: &[u8; 32]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(label);
    ctx.update(public);
    let mut k = [0u8; 32];
    k.copy_from_slice(ctx.finish().as_ref());
    k
}

fn mac_key(public: &[u8; 32]) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, &labelled(b"vnet mac1 v2", public))
}

fn cookie_key(public: &[u8; 32]) -> LessSafeKey {
    // CHACHA20_POLY1305 takes any 32-byte key.
    LessSafeKey::new(UnboundKey::new(&aead::CHACHA20_POLY1305, &labelled(b"vnet cookie v2", public)).unwrap())
}

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    // A failing random source leaves zeros: indexes still work (they only
    // pick among a link's few sessions); a cookie secret of zeros still
    // binds cookies to addresses, only a guessable one.
    let _ = ring::rand::SystemRandom::new().fill(&mut b);
    b
}

fn random_u32() -> u32 {
    u32::from_le_bytes(random())
}

/// An address as the cookie hashes it: the IPv6 (or IPv4-mapped) address and the port.
fn addr_bytes(a: SocketAddr) -> [u8; 18] {
    let ip = match a.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    let mut b = [0u8; 18];
    b[..16].copy_from_slice(&ip.octets());
    b[16..].copy_from_slice(&a.port().to_be_bytes());
    b
}

/// The first four bytes of every secured datagram: version, type, mode,
/// and the cipher byte (an AEAD's id; an initiation's says more).
fn preamble(kind: u8, mode: Mode, cipher: u8) -> [u8; 4] {
    [VERSION, kind, mode.byte(), cipher]
}

/// The AEAD an initiation's cipher byte offers: a negotiating one, or 0
/// (an earlier vnetd's, which offers ChaCha20-Poly1305 and nothing else).
fn offered(b: u8) -> Option<Aead> {
    if b & !(AEAD_BITS | NEGOTIATES | PREFERS_AES | PINNED) != 0 || (b & NEGOTIATES == 0 && b != 0) {
        return None;
    }
    Aead::from_id(b & AEAD_BITS)
}

/// The little-endian index at `data[at..at + 4]` (the caller checked the length).
fn index_at(data: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
}

/// Whether `reply` is a handshake response (by its type alone).
pub fn is_response(reply: &[u8]) -> bool {
    reply.len() > 1 && reply[1] == T_RESP
}

/// Whether `data` is a handshake initiation (by its length and type alone).
pub fn is_initiation(data: &[u8]) -> bool {
    data.len() == INIT_LEN && data[0] == VERSION && data[1] == T_INIT
}

/// The receiver index a secured data datagram names (`None`: it is not one).
pub fn data_index(data: &[u8]) -> Option<u32> {
    (data.len() >= OVERHEAD && data[0] == VERSION && data[1] == T_DATA).then(|| index_at(data, 4))
}

/// The Noise prologue: the link's mode and, for a negotiating initiation,
/// its cipher byte (so changing the offer or the preference in flight
/// breaks the handshake). An earlier vnetd's initiation has only the mode.
fn prologue(mode: Mode, cipher: u8) -> ([u8; 9], usize) {
    let p = [b'v', b'n', b'e', b't', b' ', b'v', b'2', mode.byte(), cipher];
    (p, if cipher == 0 { 8 } else { 9 })
}

impl SecureLink {
    /// The security of a link to the peer with public key `peer`.
    pub fn new(mode: Mode, identity: Arc<Identity>, peer: [u8; 32], timers: Timers) -> Self {
        let per_sec = u64::from(timers.handshakes_per_sec.max(1));
        SecureLink {
            mode,
            policy: CipherPolicy::local(Cipher::Auto),
            mac_to_peer: mac_key(&peer),
            mac_to_us: mac_key(&identity.public()),
            cookie_ours: cookie_key(&identity.public()),
            cookie_theirs: cookie_key(&peer),
            identity,
            peer,
            timers,
            tx: ArcSwapOption::empty(),
            // The buckets start full.
            state: Mutex::new(State {
                budget: Bucket::full(per_sec),
                cookied: Bucket::full(per_sec),
                ..State::default()
            }),
            stats: SecureStats::default(),
            listed: None,
        }
    }

    /// The link, listing its session indices in `sessions` as link `id`'s.
    pub fn listed_in(mut self, sessions: Arc<Sessions>, id: u32) -> Self {
        self.listed = Some((sessions, id));
        self
    }

    /// A new local session index, listed (the oldest this link listed goes).
    fn new_index(&self, st: &mut State) -> u32 {
        let local = random_u32();
        if let Some((list, id)) = &self.listed {
            let mut m = list.lock();
            if let Some(old) = st.listed[0] {
                if m.get(&old) == Some(id) {
                    m.remove(&old);
                }
            }
            st.listed.rotate_left(1);
            st.listed[Sessions::PER_LINK - 1] = Some(local);
            m.insert(local, *id);
        }
        local
    }

    /// The link with cipher policy `p` (else `auto` on this CPU).
    pub fn with_policy(mut self, p: CipherPolicy) -> Self {
        self.policy = p;
        self
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// What the link accepts and offers.
    pub fn policy(&self) -> CipherPolicy {
        self.policy
    }

    /// The AEAD the session frames are sealed with uses (`None`: no session).
    pub fn aead(&self) -> Option<Aead> {
        self.tx.load().as_ref().map(|s| s.aead)
    }

    /// The peer's static public key.
    pub fn peer(&self) -> [u8; 32] {
        self.peer
    }

    /// The newest initiation timestamp accepted from the peer (0: none).
    pub fn last_init(&self) -> u64 {
        self.lock().last_init
    }

    /// Refuses initiations from the peer not newer than `ts`: the last one
    /// accepted before a restart, so that none captured before it is
    /// accepted after.
    pub fn set_last_init(&self, ts: u64) {
        let mut st = self.lock();
        st.last_init = st.last_init.max(ts);
    }

    /// The session to seal with, if there is one (else the caller drops
    /// the frame, counted, while the handshake that [`SecureLink::tick`]
    /// starts whenever there is no session runs).
    pub fn sealer(&self) -> Option<Arc<Session>> {
        let s = self.tx.load_full();
        if s.is_none() {
            self.stats.no_session.fetch_add(1, Relaxed);
        }
        s
    }

    /// Whether `data` is a handshake initiation to this host with a good
    /// first MAC (keyed by this host's public key, the same for every link):
    /// one HMAC, what a stranger's datagram costs before anything is spent
    /// on it (the stranger budget, the Diffie-Hellman of [`Self::initiator_of`]).
    pub fn initiation_to_us(&self, data: &[u8]) -> bool {
        data.len() == INIT_LEN && data[0] == VERSION && data[1] == T_INIT && self.mac_ok(data, INIT_MAC1)
    }

    /// Whose initiation `data` is, when it is a handshake initiation to this
    /// host: the initiator's static public key. One Noise read (two
    /// Diffie-Hellman operations) after the first MAC: for an initiation
    /// from an address no link is configured with (a peer that moved, or
    /// one behind NAT), to find its link; the caller limits how often. The
    /// read succeeding means the initiation was made with that key's
    /// private half (IK's `ss`); it is then answered by the link as any
    /// other (timestamp, rate limit, cookies).
    pub fn initiator_of(&self, data: &[u8]) -> Option<[u8; 32]> {
        if !self.initiation_to_us(data) {
            return None;
        }
        let mode = match data[2] {
            1 => Mode::Auth,
            2 => Mode::Encrypt,
            _ => return None,
        };
        let mut hs = self.handshake(mode, false, data[3])?;
        let mut payload = [0u8; 32];
        hs.read_message(&data[8..INIT_MAC1], &mut payload).ok()?;
        hs.get_remote_static().and_then(|k| k.try_into().ok())
    }

    /// Whether a session is established.
    pub fn established(&self) -> bool {
        self.tx.load().is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Timers: drops expired sessions and, when a handshake is due (no
    /// session, rekey time or volume) and none is in flight,
    /// writes an initiation into `out` and returns its length.
    pub fn tick(&self, now_ns: u64, out: &mut [u8]) -> Option<usize> {
        let t = self.timers;
        let mut guard = self.lock();
        let st = &mut *guard;
        for s in [&mut st.current, &mut st.previous, &mut st.next] {
            if s.as_ref().is_some_and(|s| s.expired(now_ns, &t)) {
                *s = None;
            }
        }
        if st.current.is_none() && self.tx.load().is_some() {
            self.tx.store(None);
        }
        let due = match &st.current {
            None => true,
            Some(s) => {
                let age = now_ns.saturating_sub(s.born_ns);
                // The responder rekeys too, later, should the initiator not.
                let after = if s.initiator { t.rekey_after_ns } else { t.rekey_after_ns + 5 * t.retry_ns };
                age >= after || s.sent.load(Relaxed) >= t.rekey_after_messages || st.renegotiate
            }
        };
        // Ours, or the peer's answered and waiting for its first datagram.
        let in_flight = st.pending.as_ref().is_some_and(|p| now_ns.saturating_sub(p.sent_ns) < t.retry_ns)
            || st.next.as_ref().is_some_and(|n| now_ns.saturating_sub(n.born_ns) < t.retry_ns);
        if !due || in_flight {
            return None;
        }
        self.initiate(st, now_ns, out)
    }

    /// Takes a datagram from `from` (an address of the peer's IP): a data
    /// datagram is verified in place, a handshake message answered into
    /// `reply` (to go to the link's remote address).
    pub fn open(&self, now_ns: u64, from: SocketAddr, data: &mut [u8], reply: &mut [u8]) -> Opened {
        self.open_at(now_ns, from, true, data, reply)
    }

    /// [`SecureLink::open`], saying whether `from` is where the link sends
    /// (`at_endpoint`). An initiation from elsewhere (the peer moved, or is
    /// behind NAT) never lost a crossing to our own: ours went where the
    /// peer no longer is, so once the peer's is authenticated and new, it is
    /// answered and ours abandoned.
    pub fn open_at(
        &self,
        now_ns: u64,
        from: SocketAddr,
        at_endpoint: bool,
        data: &mut [u8],
        reply: &mut [u8],
    ) -> Opened {
        let s = &self.stats;
        if data.len() < 8 || data[0] != VERSION {
            s.unauthenticated.fetch_add(1, Relaxed);
            return Opened::Nothing;
        }
        if data[2] != self.mode.byte() {
            s.bad_handshakes.fetch_add(1, Relaxed);
            return Opened::Nothing;
        }
        match data[1] {
            T_DATA => self.data(data),
            T_INIT => self.answer(now_ns, from, at_endpoint, data, reply),
            T_RESP => self.complete(now_ns, data, reply),
            T_COOKIE => self.take_cookie(now_ns, data),
            _ => {
                s.unauthenticated.fetch_add(1, Relaxed);
                Opened::Nothing
            }
        }
    }

    /// A data datagram: opened as a run of one ([`SecureLink::open_run`]).
    /// [`SecureLink::open_at`] checked its version, type and mode, so a run
    /// that takes nothing means it is too short or no session has its index.
    fn data(&self, data: &mut [u8]) -> Opened {
        let mut out = [None];
        if self.open_run(data, data.len(), &mut out) == 0 {
            self.stats.auth_failures.fetch_add(1, Relaxed);
            return Opened::Nothing;
        }
        out[0].take().map_or(Opened::Nothing, Opened::Data)
    }

    /// The session whose index is `index`, and whether it is the next one
    /// (a responder's, not used yet).
    fn session_at(&self, index: u32) -> Option<(Arc<Session>, bool)> {
        let st = self.lock();
        let find = |o: &Option<Arc<Session>>| o.as_ref().filter(|x| x.local == index).cloned();
        find(&st.current)
            .map(|x| (x, false))
            .or_else(|| find(&st.previous).map(|x| (x, false)))
            .or_else(|| find(&st.next).map(|x| (x, true)))
    }

    /// The next session verified a datagram: the initiator uses it, so may we.
    fn promote(&self, session: Arc<Session>) {
        let mut st = self.lock();
        if st.next.as_ref().is_some_and(|n| Arc::ptr_eq(n, &session)) {
            st.next = None;
            st.previous = st.current.replace(session.clone());
            self.tx.store(Some(session));
        }
    }

    /// Opens in place the data datagrams at the start of a GRO batch
    /// (`seg`-byte datagrams one after another in `data`, the last maybe
    /// shorter) that carry the first one's receiver index, at most
    /// `out.len()` (and [`crate::GSO_MAX_SEGS`]) of them: with the session
    /// looked up and the replay window locked once for them all instead of
    /// once a datagram. A lone data datagram is a run of one
    /// ([`SecureLink::open`]). `out[i]`: datagram `i`'s verified `vnet`
    /// datagram as a range of that datagram (empty: a keepalive), or `None`
    /// (dropped and counted: a tag that does not verify, a replay). Returns
    /// how many datagrams it took from the first; the caller opens the rest
    /// one by one (a handshake message, another session's datagrams).
    pub fn open_run(
        &self,
        data: &mut [u8],
        seg: usize,
        out: &mut [Option<core::ops::Range<usize>>],
    ) -> usize {
        let s = &self.stats;
        let mode = self.mode.byte();
        let is_data = |d: &[u8]| d.len() >= OVERHEAD && d[0] == VERSION && d[1] == T_DATA && d[2] == mode;
        // (With `seg` 0 the first is empty, and no data datagram.)
        let first = &data[..seg.min(data.len())];
        if !is_data(first) {
            return 0;
        }
        let index = index_at(first, 4);
        let Some((session, is_next)) = self.session_at(index) else { return 0 };
        let mut counters = [None; crate::GSO_MAX_SEGS];
        let mut n = 0;
        for (i, d) in data.chunks_mut(seg).enumerate().take(out.len().min(crate::GSO_MAX_SEGS)) {
            if !is_data(d) || index_at(d, 4) != index {
                break;
            }
            out[i] = None;
            counters[i] = session.open(self.mode, d).map(|c| (c, d.len()));
            if counters[i].is_none() {
                s.auth_failures.fetch_add(1, Relaxed);
            }
            n = i + 1;
        }
        let mut any = false;
        {
            let mut window = session.replay.lock().unwrap_or_else(|p| p.into_inner());
            for (o, c) in out.iter_mut().zip(counters).take(n) {
                let Some((ctr, len)) = c else { continue };
                if window.accept(ctr) {
                    *o = Some(DATA_HEADER..len - TAG);
                    any = true;
                } else {
                    s.replays.fetch_add(1, Relaxed);
                }
            }
        }
        if any && is_next {
            self.promote(session);
        }
        n
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::session::Replay;
    use super::*;

    const SEC: u64 = 1_000_000_000;

    pub(crate) fn pair(mode: Mode) -> (SecureLink, SecureLink) {
        pair_timed(mode, Timers::with_rekey(10 * SEC))
    }

    fn pair_timed(mode: Mode, t: Timers) -> (SecureLink, SecureLink) {
        let (a, b) = (Arc::new(Identity::generate().unwrap()), Arc::new(Identity::generate().unwrap()));
        let la = SecureLink::new(mode, a.clone(), b.public(), t);
        let lb = SecureLink::new(mode, b, a.public(), t);
        (la, lb)
    }

    const A: &str = "10.0.0.1:9000";
    const B: &str = "10.0.0.2:9000";

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    impl SecureLink {
        /// Where a link's datagrams come from in these tests (the
        /// address matters to cookies only).
        fn peer_addr(&self) -> SocketAddr {
            addr("10.0.0.9:9000")
        }
    }

    /// Runs a handshake from `a` to `b` at `now`.
    pub(crate) fn handshake(a: &SecureLink, b: &SecureLink, now: u64) {
        let mut init = [0u8; 256];
        let n = a.tick(now, &mut init).expect("an initiation is due");
        let mut resp = [0u8; 256];
        let Opened::Reply(m) = b.open(now, b.peer_addr(), &mut init[..n], &mut resp) else {
            panic!("not answered")
        };
        let mut ka = [0u8; 256];
        let Opened::Reply(k) = a.open(now, a.peer_addr(), &mut resp[..m], &mut ka) else {
            panic!("not completed")
        };
        let mut scratch = [0u8; 64];
        assert_eq!(
            b.open(now, b.peer_addr(), &mut ka[..k], &mut scratch),
            Opened::Data(DATA_HEADER..DATA_HEADER)
        );
    }

    fn sealed(from: &SecureLink, msg: &[u8]) -> Vec<u8> {
        let s = from.sealer().expect("a session");
        let mut buf = vec![0u8; msg.len() + OVERHEAD];
        buf[DATA_HEADER..DATA_HEADER + msg.len()].copy_from_slice(msg);
        let n = s.seal(from.mode(), &mut buf, msg.len()).unwrap();
        assert_eq!(n, buf.len());
        buf
    }

    pub(crate) fn opened(to: &SecureLink, mut d: Vec<u8>) -> Option<Vec<u8>> {
        let mut r = [0u8; 256];
        match to.open(0, to.peer_addr(), &mut d, &mut r) {
            Opened::Data(range) => Some(d[range].to_vec()),
            _ => None,
        }
    }

    /// `docs/wire.md`, vector SEC1: test vector 1 (a whole 14-byte frame)
    /// sealed with session key 32 x 0x01, receiver index 0x11223344, counter 0.
    const SEC1: &str = "0204020044332211000000000000000000274dc5ee5216c505f96a89aea45b5ce98b6f0f22fb9233c579e9539e36f0259ccbc9b5e983c61d8a0a8235f729b7d6fd00";

    /// SEC1's datagram sealed with AES-256-GCM instead (cipher byte 1), as
    /// Python's `cryptography` (OpenSSL) computes it.
    const SEC2: &str = "02040201443322110000000000000000be3598c8753b03b8927b91417124c14fb5c69fb07a60cb0533db5c810ed66e1ad60dd9237f9cc8ec7c24aace444fa275f2ab";

    #[test]
    fn vector_sec1_and_sec2() {
        let plain = [
            1u8, 0, 0, 0x14, 0, 0, 0, 7, 1, 2, 3, 4, 0, 0, 0, 0x0e, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff,
            0xff, 0x52, 0x54, 0, 0, 0, 1, 0x88, 0xb5,
        ];
        for (aead, want) in [(Aead::ChaCha20Poly1305, SEC1), (Aead::Aes256Gcm, SEC2)] {
            let s = Session::new(7, 0x1122_3344, (&[1; 32], &[2; 32]), aead, 0, true).unwrap();
            let mut buf = vec![0u8; plain.len() + OVERHEAD];
            buf[DATA_HEADER..DATA_HEADER + plain.len()].copy_from_slice(&plain);
            let n = s.seal(Mode::Encrypt, &mut buf, plain.len()).unwrap();
            let hex: String = buf[..n].iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(hex, want, "{aead:?}");
            // The receiving end (keys the other way round) opens it.
            let r = Session::new(0x1122_3344, 7, (&[2; 32], &[1; 32]), aead, 0, false).unwrap();
            assert_eq!(r.open(Mode::Encrypt, &mut buf[..n]), Some(0));
            assert_eq!(&buf[DATA_HEADER..DATA_HEADER + plain.len()], &plain[..]);
        }
    }

    /// A pair of links with these cipher options and CPUs.
    fn pair_with(a: (Cipher, bool), b: (Cipher, bool)) -> (SecureLink, SecureLink) {
        let (la, lb) = pair(Mode::Encrypt);
        let p = |(cipher, fast_aes)| CipherPolicy { cipher, fast_aes };
        (la.with_policy(p(a)), lb.with_policy(p(b)))
    }

    /// Initiations and answers between `a` and `b` until both have a
    /// session (or 10 rounds): the AEAD both seal with.
    fn settle(a: &SecureLink, b: &SecureLink) -> Option<Aead> {
        for round in 0..10u64 {
            let now = round * 2 * SEC;
            for (x, y) in [(a, b), (b, a)] {
                let mut init = [0u8; 256];
                let Some(n) = x.tick(now, &mut init) else { continue };
                let mut resp = [0u8; 256];
                let Opened::Reply(m) = y.open(now, y.peer_addr(), &mut init[..n], &mut resp) else {
                    continue;
                };
                let mut ka = [0u8; 256];
                if let Opened::Reply(k) = x.open(now, x.peer_addr(), &mut resp[..m], &mut ka) {
                    y.open(now, y.peer_addr(), &mut ka[..k], &mut [0u8; 64]);
                }
            }
            let both = a.aead().zip(b.aead()).filter(|(x, y)| x == y);
            let settled = a.lock().renegotiate || b.lock().renegotiate;
            if let (Some((x, _)), false) = (both, settled) {
                assert_eq!(opened(b, sealed(a, b"across")), Some(b"across".to_vec()));
                return Some(x);
            }
        }
        None
    }

    #[test]
    fn initiations_are_dated_by_the_wall_clock_given_else_by_the_engine_clock() {
        fn wall() -> u64 {
            1_700_000_000_000_000_000
        }
        assert_eq!(Timers::default().date(5), 6);
        assert_eq!(Timers::default().dated_by(wall).date(5), wall());
        let t = Timers::with_rekey(10 * SEC).dated_by(wall);
        assert_eq!((t.rekey_after_ns, t.reject_after_ns), (10 * SEC, 15 * SEC), "the rest kept");
    }

    #[test]
    fn the_cipher_is_aes_only_where_both_ends_want_it_and_a_named_one_is_kept() {
        use Aead::{Aes256Gcm as Aes, ChaCha20Poly1305 as ChaCha};
        use Cipher::{Aes256Gcm, Auto, ChaCha20Poly1305};
        for (a, b, want) in [
            ((Auto, true), (Auto, true), Some(Aes)),
            // The first guess (AES) is renegotiated once the response says.
            ((Auto, true), (Auto, false), Some(ChaCha)),
            ((Auto, false), (Auto, true), Some(ChaCha)),
            ((Auto, true), (ChaCha20Poly1305, true), Some(ChaCha)),
            ((Auto, false), (Aes256Gcm, false), Some(Aes)),
            ((Aes256Gcm, false), (Aes256Gcm, false), Some(Aes)),
            ((ChaCha20Poly1305, true), (ChaCha20Poly1305, true), Some(ChaCha)),
            // Two named ciphers that differ: no session, never a fallback.
            ((Aes256Gcm, true), (ChaCha20Poly1305, true), None),
        ] {
            // Fresh keys each time: either end may win a crossing.
            for _ in 0..4 {
                let (la, lb) = pair_with(a, b);
                assert_eq!(settle(&la, &lb), want, "{a:?} {b:?}");
                let refused = la.stats.cipher_refused.load(Relaxed) + lb.stats.cipher_refused.load(Relaxed);
                // (An `auto` end's first offer to a named other cipher is
                // refused too; the named end's own initiation then succeeds.)
                assert!(want.is_some() || refused > 0, "{a:?} {b:?}: {refused} refused");
                assert_eq!(la.stats.bad_handshakes.load(Relaxed) + lb.stats.bad_handshakes.load(Relaxed), 0);
            }
        }
    }

    #[test]
    fn an_offer_the_responder_refuses_gets_no_session_and_no_answer() {
        let (a, b) = pair_with((Cipher::Aes256Gcm, true), (Cipher::ChaCha20Poly1305, true));
        let mut init = initiation(&a, 0);
        let mut resp = [0u8; 256];
        assert_eq!(b.open(0, b.peer_addr(), &mut init, &mut resp), Opened::Nothing);
        assert_eq!(b.stats.cipher_refused.load(Relaxed), 1);
        assert_eq!(b.stats.handshakes_answered.load(Relaxed), 0);
        assert!(!b.established() && b.lock().next.is_none());
    }

    #[test]
    fn a_changed_offer_or_preference_breaks_the_handshake_instead_of_downgrading_it() {
        // `a` offers AES-256-GCM and says it prefers it; `b` takes either.
        let (a, b) = pair_with((Cipher::Auto, true), (Cipher::Auto, true));
        let offer = initiation(&a, 0);
        assert_eq!(offer[3], Aead::Aes256Gcm.id() | NEGOTIATES | PREFERS_AES);
        // An attacker rewrites the cipher byte (and the first MAC, whose key
        // is public): ChaCha20-Poly1305 offered, the preference dropped,
        // or an earlier vnetd's initiation.
        let forged =
            [Aead::ChaCha20Poly1305.id() | NEGOTIATES | PREFERS_AES, Aead::Aes256Gcm.id() | NEGOTIATES, 0];
        for (i, byte) in forged.into_iter().enumerate() {
            let mut m = offer.clone();
            m[3] = byte;
            let mac = hmac::sign(&mac_key(&b.identity.public()), &m[..INIT_MAC1]);
            m[INIT_MAC1..INIT_MAC1 + MAC].copy_from_slice(mac.as_ref());
            assert_eq!(b.open(0, b.peer_addr(), &mut m, &mut [0u8; 256]), Opened::Nothing, "{byte:#x}");
            assert_eq!(b.stats.bad_handshakes.load(Relaxed), i as u64 + 1);
        }
        assert_eq!(b.stats.sessions.load(Relaxed), 0);
        // The response: its cipher byte or its sealed preference changed.
        let mut resp = [0u8; 256];
        let Opened::Reply(m) = b.open(0, b.peer_addr(), &mut offer.clone(), &mut resp) else { panic!() };
        assert_eq!(m, RESP_LEN);
        for (at, flip) in [(3, 1u8), (12 + 32, PREFERS_AES)] {
            let mut r = resp;
            r[at] ^= flip;
            let mac = hmac::sign(&mac_key(&a.identity.public()), &r[..RESP_LEN - MAC]);
            r[RESP_LEN - MAC..RESP_LEN].copy_from_slice(mac.as_ref());
            assert_eq!(a.open(0, a.peer_addr(), &mut r[..m], &mut [0u8; 256]), Opened::Nothing);
            // The initiation is spent either way: send a new one.
            let mut again = initiation(&a, 2 * SEC * (at as u64));
            assert!(matches!(b.open(0, b.peer_addr(), &mut again, &mut resp), Opened::Reply(_)));
        }
        assert_eq!(a.stats.bad_handshakes.load(Relaxed), 2);
        assert!(!a.established());
    }

    #[test]
    fn an_earlier_vnetds_initiation_is_answered_with_chacha_and_no_preference() {
        let (a, b) = pair_with((Cipher::Auto, true), (Cipher::Auto, true));
        // What vnetd wrote before ciphers were negotiated: cipher byte 0,
        // the 8-byte prologue, ChaCha20-Poly1305's protocol name, no payload in the answer.
        let mut hs = a.handshake(Mode::Encrypt, true, 0).unwrap();
        let mut init = [0u8; INIT_LEN];
        init[..4].copy_from_slice(&preamble(T_INIT, Mode::Encrypt, 0));
        init[4..8].copy_from_slice(&7u32.to_le_bytes());
        hs.write_message(&1u64.to_be_bytes(), &mut init[8..INIT_MAC1]).unwrap();
        let mac = hmac::sign(&mac_key(&b.identity.public()), &init[..INIT_MAC1]);
        init[INIT_MAC1..INIT_MAC1 + MAC].copy_from_slice(mac.as_ref());
        let mut resp = [0u8; 256];
        assert_eq!(b.open(0, b.peer_addr(), &mut init, &mut resp), Opened::Reply(PLAIN_RESP_LEN));
        assert_eq!(resp[3], Aead::ChaCha20Poly1305.id());
        let mut payload = [0u8; 8];
        assert_eq!(hs.read_message(&resp[12..PLAIN_RESP_LEN - MAC], &mut payload).ok(), Some(0));
        assert_eq!(b.lock().next.as_ref().map(|s| s.aead), Some(Aead::ChaCha20Poly1305));
        // A link that names AES-256-GCM refuses it.
        let (_, c) = pair_with((Cipher::Auto, true), (Cipher::Aes256Gcm, true));
        let mut init2 = init;
        let mac = hmac::sign(&mac_key(&c.identity.public()), &init2[..INIT_MAC1]);
        init2[INIT_MAC1..INIT_MAC1 + MAC].copy_from_slice(mac.as_ref());
        assert_eq!(c.open(0, c.peer_addr(), &mut init2, &mut resp), Opened::Nothing);
        assert_eq!(c.stats.cipher_refused.load(Relaxed), 1);
    }

    #[test]
    fn an_initiation_dated_far_ahead_is_refused_and_not_adopted() {
        let (a, b) = pair_with((Cipher::Auto, true), (Cipher::Auto, true));
        let init_at = |ts: u64| {
            let mut hs = a.handshake(Mode::Encrypt, true, 0).unwrap();
            let mut init = [0u8; INIT_LEN];
            init[..4].copy_from_slice(&preamble(T_INIT, Mode::Encrypt, 0));
            init[4..8].copy_from_slice(&7u32.to_le_bytes());
            hs.write_message(&ts.to_be_bytes(), &mut init[8..INIT_MAC1]).unwrap();
            let mac = hmac::sign(&mac_key(&b.identity.public()), &init[..INIT_MAC1]);
            init[INIT_MAC1..INIT_MAC1 + MAC].copy_from_slice(mac.as_ref());
            init
        };
        let mut resp = [0u8; 256];
        let mut ahead = init_at(1 + MAX_CLOCK_AHEAD_NS + 60 * SEC);
        assert_eq!(b.open(0, b.peer_addr(), &mut ahead, &mut resp), Opened::Nothing);
        assert_eq!((b.stats.future_timestamps.load(Relaxed), b.last_init()), (1, 0), "refused, not adopted");
        // The peer's next initiation, dated now, is answered.
        let mut now = init_at(1);
        assert!(matches!(b.open(0, b.peer_addr(), &mut now, &mut resp), Opened::Reply(_)));
    }

    #[test]
    fn session_indices_are_listed_per_link_bounded_and_gone_with_the_link() {
        // Issue 44, finding 1: a stranger's data datagram was matched by
        // looking into every secured link under its lock.
        let list = Arc::new(Sessions::default());
        let (a, b) = pair(Mode::Encrypt);
        let b = b.listed_in(list.clone(), 7);
        let mut resp = [0u8; 256];
        for round in 0..10u64 {
            let mut init = initiation(&a, round * 200 * SEC);
            let Opened::Reply(_) = b.open(round * 200 * SEC, b.peer_addr(), &mut init, &mut resp) else {
                panic!("round {round}")
            };
            let ours = index_at(&resp, 4);
            assert_eq!(list.link_of(ours), Some(7), "round {round}: the answer's index is listed");
        }
        assert_eq!(list.len(), Sessions::PER_LINK, "a link lists its last few indices only");
        assert!(!list.is_empty());
        drop(b);
        assert!(list.is_empty(), "a link's indices go with it");
    }

    #[test]
    fn replay_window() {
        let mut r = Replay::new();
        assert!(r.accept(5));
        assert!(!r.accept(5));
        assert!(r.accept(3));
        assert!(r.accept(5000));
        assert!(!r.accept(5000 - WINDOW - 1), "too old");
        assert!(r.accept(5000 - WINDOW + 1));
        assert!(!r.accept(5000 - WINDOW + 1));
        assert!(r.accept(4999));
        assert!(!r.accept(REJECT_AFTER_MESSAGES));
        // In numbers: WireGuard's window (2048 bits, less the word being
        // filled) and limit (2^64 - 2^13 messages).
        let mut r = Replay::new();
        assert!(r.accept(10_000));
        assert!(!r.accept(10_000 - 1985) && r.accept(10_000 - 1984));
        assert!(r.accept(u64::MAX - 8193) && !r.accept(u64::MAX - 8192));
    }

    #[test]
    fn an_initiation_is_to_the_host_whose_public_key_made_its_mac_only() {
        let (a, b) = pair(Mode::Encrypt);
        let (c, _) = pair(Mode::Encrypt);
        let mut init = [0u8; 256];
        let n = a.tick(1, &mut init).expect("an initiation is due");
        assert!(b.initiation_to_us(&init[..n]), "to b");
        assert!(!c.initiation_to_us(&init[..n]), "not to c");
        assert_eq!(format!("{a:?}"), "SecureLink { mode: Encrypt, .. }");
    }

    #[test]
    fn handshake_messages_and_data_are_told_apart_by_length_version_and_type() {
        let mut init = [0u8; INIT_LEN];
        init[..2].copy_from_slice(&[VERSION, T_INIT]);
        assert!(is_initiation(&init));
        assert!(!is_initiation(&init[..INIT_LEN - 1]), "a byte short");
        let other = |i: usize, v: u8| {
            let mut d = init;
            d[i] = v;
            d
        };
        assert!(!is_initiation(&other(0, 1)) && !is_initiation(&other(1, T_RESP)));
        assert!(is_response(&[VERSION, T_RESP]) && !is_response(&[VERSION, T_INIT]));
        assert!(!is_response(&[VERSION]) && !is_response(&[]));
        let mut data = [0u8; OVERHEAD];
        data[..8].copy_from_slice(&[VERSION, T_DATA, 2, 0, 7, 1, 0, 0]);
        assert_eq!(data_index(&data), Some(0x107));
        assert_eq!(data_index(&data[..OVERHEAD - 1]), None, "a byte short");
        data[0] = 1;
        assert_eq!(data_index(&data), None, "another version");
        data[..2].copy_from_slice(&[VERSION, T_INIT]);
        assert_eq!(data_index(&data), None, "another type");
    }

    #[test]
    fn a_datagram_too_short_for_a_header_is_unauthenticated_and_one_just_long_enough_is_read() {
        let (a, _) = pair(Mode::Encrypt);
        let mut r = [0u8; 256];
        assert_eq!(a.open(0, a.peer_addr(), &mut [VERSION, T_DATA], &mut r), Opened::Nothing);
        let mut eight = [VERSION, T_INIT, Mode::Encrypt.byte(), 0, 0, 0, 0, 0];
        assert_eq!(a.open(0, a.peer_addr(), &mut eight, &mut r), Opened::Nothing);
        let st = &a.stats;
        assert_eq!((st.unauthenticated.load(Relaxed), st.bad_handshakes.load(Relaxed)), (1, 1));
    }

    #[test]
    fn an_auth_mode_initiation_from_anywhere_names_its_initiator() {
        for mode in [Mode::Auth, Mode::Encrypt] {
            let (a, b) = pair(mode);
            let mut init = [0u8; 256];
            let n = a.tick(1, &mut init).expect("an initiation is due");
            assert_eq!(b.initiator_of(&init[..n]), Some(a.identity.public()), "{mode:?}");
        }
    }

    #[test]
    fn a_session_is_renewed_after_its_messages_or_by_the_responder_a_few_retries_after_the_initiator() {
        let t = Timers { rekey_after_messages: 3, ..Timers::with_rekey(100 * SEC) };
        let (a, b) = pair_timed(Mode::Encrypt, t);
        handshake(&a, &b, 0);
        let mut out = [0u8; 256];
        // Sent: the keepalive that completed the handshake, and one.
        sealed(&a, b"x");
        assert_eq!(a.tick(SEC, &mut out), None, "two sent");
        sealed(&a, b"x");
        assert!(a.tick(SEC, &mut out).is_some(), "three sent: renewed");
        // The responder renews 5 retries after the initiator would.
        assert_eq!(b.tick(105 * SEC - 1, &mut out), None);
        assert!(b.tick(105 * SEC, &mut out).is_some());
    }

    #[test]
    fn an_answered_initiation_waits_a_retry_for_its_first_datagram_before_its_responder_initiates() {
        let (a, b) = pair(Mode::Encrypt);
        let mut init = [0u8; 256];
        let n = a.tick(0, &mut init).expect("an initiation is due");
        let mut resp = [0u8; 256];
        assert!(matches!(b.open(0, b.peer_addr(), &mut init[..n], &mut resp), Opened::Reply(_)));
        let mut out = [0u8; 256];
        let retry = b.timers.retry_ns;
        assert_eq!(b.tick(retry - 1, &mut out), None, "the initiator's first datagram may come");
        assert!(b.tick(retry, &mut out).is_some(), "it did not: b initiates");
        // And an unanswered initiation is sent again a retry after it was.
        let (c, _) = pair(Mode::Encrypt);
        assert!(c.tick(0, &mut out).is_some());
        assert_eq!(c.tick(retry - 1, &mut out), None, "its answer may come");
        assert!(c.tick(retry, &mut out).is_some(), "again");
    }

    #[test]
    fn a_replayed_counter_is_refused_after_a_newer_one_of_its_block() {
        let mut r = Replay::new();
        let n = 20 * 64 + 1;
        assert!(r.accept(n) && r.accept(n + 1));
        assert!(!r.accept(n), "seen in the same block");
        assert!(r.accept(40 * 64) && !r.accept(n + 1), "and after a later block");
    }

    #[test]
    fn a_session_expires_at_exactly_the_reject_time_and_keys_make_one_that_opens_its_peers() {
        let t = Timers::with_rekey(10 * SEC);
        let tx = Session::with_keys(Aead::Aes256Gcm, 1, 2, &[7; 32], &[9; 32]).unwrap();
        let rx = Session::with_keys(Aead::Aes256Gcm, 2, 1, &[9; 32], &[7; 32]).unwrap();
        assert!(!tx.expired(t.reject_after_ns - 1, &t) && tx.expired(t.reject_after_ns, &t));
        assert_eq!(format!("{tx:?}"), "Session { local: 1, remote: 2 }");
        let mut d = vec![0u8; OVERHEAD + 5];
        d[DATA_HEADER..DATA_HEADER + 5].copy_from_slice(b"hello");
        let n = tx.seal(Mode::Encrypt, &mut d, 5).unwrap();
        assert!(rx.open(Mode::Encrypt, &mut d[..n]).is_some());
        assert_eq!(&d[DATA_HEADER..DATA_HEADER + 5], b"hello");
        assert_eq!(Aead::Aes256Gcm.word(), Cipher::Aes256Gcm.word());
        assert_eq!(Aead::ChaCha20Poly1305.word(), Cipher::ChaCha20Poly1305.word());
    }

    #[test]
    fn a_cookie_keys_initiations_until_a_retry_before_it_expires() {
        let (a, _) = pair(Mode::Encrypt);
        let t0 = 5 * SEC;
        a.lock().cookie = Some(([3; COOKIE], t0));
        let mac2 = |now: u64| {
            a.lock().pending = None;
            let mut out = [0u8; 256];
            let n = a.tick(now, &mut out).expect("an initiation is due");
            out[INIT_MAC1 + MAC..n].iter().any(|&b| b != 0)
        };
        let fresh = COOKIE_LIFE_NS - a.timers.retry_ns;
        assert!(mac2(t0 + fresh - 1), "keyed");
        assert!(!mac2(t0 + fresh), "stale: zeros");
    }

    #[test]
    fn a_cookie_reply_is_written_only_where_it_fits() {
        let (a, b) = pair(Mode::Encrypt);
        let mut init = [0u8; 256];
        let n = a.tick(0, &mut init).expect("an initiation is due");
        let cookie = [4u8; COOKIE];
        assert_eq!(b.cookie_reply(&cookie, &init[..n], &mut [0; COOKIE_LEN]), Opened::Reply(COOKIE_LEN));
        assert_eq!(b.cookie_reply(&cookie, &init[..n], &mut [0; COOKIE_LEN - 1]), Opened::Nothing);
    }

    #[test]
    fn a_cookie_reply_too_short_for_our_pending_initiation_is_a_bad_handshake() {
        let (a, _) = pair(Mode::Encrypt);
        let mut init = [0u8; 256];
        a.tick(0, &mut init).expect("an initiation is due");
        let mut short = [VERSION, T_COOKIE, Mode::Encrypt.byte(), 0, init[4], init[5], init[6], init[7]];
        let mut r = [0u8; 256];
        assert_eq!(a.open(1, a.peer_addr(), &mut short, &mut r), Opened::Nothing);
        assert_eq!(a.stats.bad_handshakes.load(Relaxed), 1);
    }

    #[test]
    fn an_initiation_dated_the_most_ahead_of_our_clock_allowed_is_answered() {
        fn theirs() -> u64 {
            1_000 * SEC + MAX_CLOCK_AHEAD_NS
        }
        fn ours() -> u64 {
            1_000 * SEC
        }
        let (a, b) = pair(Mode::Encrypt);
        let a = SecureLink::new(Mode::Encrypt, a.identity.clone(), a.peer, a.timers.dated_by(theirs));
        let b = SecureLink::new(Mode::Encrypt, b.identity.clone(), b.peer, b.timers.dated_by(ours));
        let mut init = [0u8; 256];
        let n = a.tick(0, &mut init).expect("an initiation is due");
        let mut resp = [0u8; 256];
        assert!(matches!(b.open(0, b.peer_addr(), &mut init[..n], &mut resp), Opened::Reply(_)));
        assert_eq!(b.stats.future_timestamps.load(Relaxed), 0);
    }

    #[test]
    fn a_response_whose_noise_does_not_read_makes_no_session_even_with_a_good_mac() {
        let (a, b) = pair(Mode::Encrypt);
        let mut resp = response(&a, &b);
        let m = resp.len();
        // A byte of its Noise message changed, and the MAC made again (the
        // MAC's key is public: anyone who knows `a`'s key can).
        let mac = hmac::sign(&b.mac_to_peer, &resp[..m - MAC]);
        assert_eq!(resp[m - MAC..m], *mac.as_ref(), "the MAC made as b makes it");
        // First, the genuine response with a wrong MAC: refused before its
        // Noise is read (the MAC is what spares that work).
        let mut bad_mac = resp.clone();
        bad_mac[m - 1] ^= 1;
        let mut r = [0u8; 256];
        assert_eq!(a.open(0, a.peer_addr(), &mut bad_mac[..m], &mut r), Opened::Nothing);
        assert!(!a.established() && a.stats.bad_handshakes.load(Relaxed) == 1, "a wrong MAC");
        resp[20] ^= 1;
        let mac = hmac::sign(&b.mac_to_peer, &resp[..m - MAC]);
        resp[m - MAC..m].copy_from_slice(mac.as_ref());
        assert_eq!(a.open(0, a.peer_addr(), &mut resp[..m], &mut r), Opened::Nothing);
        assert!(
            !a.established() && a.stats.bad_handshakes.load(Relaxed) == 2,
            "a Noise message that does not read"
        );
    }

    #[test]
    fn a_responder_initiates_later_with_the_cipher_its_initiator_preferred() {
        // `a` would rather not use AES; `b` would.
        let (a, b) = pair_with((Cipher::Auto, false), (Cipher::Auto, true));
        handshake(&a, &b, 0);
        let mut out = [0u8; 256];
        let n = b.initiate(&mut b.lock(), SEC, &mut out).unwrap();
        assert_eq!(out[3] & AEAD_BITS, Aead::ChaCha20Poly1305.id(), "{:x}", out[3]);
        assert!(n > 0 && out[3] & PREFERS_AES != 0, "b still says what it prefers");
    }

    /// A pair whose first link has the larger public key.
    fn ordered(a: (Cipher, bool), b: (Cipher, bool)) -> (SecureLink, SecureLink) {
        loop {
            let (x, y) = pair_with(a, b);
            if x.identity.public() > y.identity.public() {
                return (x, y);
            }
        }
    }

    #[test]
    fn crossed_initiations_keep_the_larger_keys_own_only_within_a_retry_and_if_the_peer_can_take_it() {
        let auto = (Cipher::Auto, true);
        let mut out = [0u8; 256];
        let mut r = [0u8; 256];
        // Within a retry of its own: the larger key keeps its own.
        let (hi, lo) = ordered(auto, auto);
        hi.tick(0, &mut out).unwrap();
        let n = lo.tick(0, &mut out).unwrap();
        let retry = hi.timers.retry_ns;
        assert_eq!(hi.open(retry - 1, hi.peer_addr(), &mut out[..n], &mut r), Opened::Nothing);
        // A retry after its own, it was lost: the peer's is answered.
        let (hi, lo) = ordered(auto, auto);
        hi.tick(0, &mut out).unwrap();
        let n = lo.tick(0, &mut out).unwrap();
        assert!(matches!(hi.open(retry, hi.peer_addr(), &mut out[..n], &mut r), Opened::Reply(_)));
        // Another cipher, not pinned: the peer takes ours, ours is kept.
        let (hi, lo) = ordered(auto, (Cipher::Auto, false));
        hi.tick(0, &mut out).unwrap();
        let n = lo.tick(0, &mut out).unwrap();
        assert_ne!(out[3] & AEAD_BITS, Aead::Aes256Gcm.id(), "lo offers ChaCha20-Poly1305");
        assert_eq!(hi.open(1, hi.peer_addr(), &mut out[..n], &mut r), Opened::Nothing);
        // A peer whose link names another cipher than ours offers could not
        // take ours: its initiation is answered.
        let (hi, lo) = ordered(auto, (Cipher::ChaCha20Poly1305, true));
        hi.tick(0, &mut out).unwrap();
        let n = lo.tick(0, &mut out).unwrap();
        assert!(matches!(hi.open(1, hi.peer_addr(), &mut out[..n], &mut r), Opened::Reply(_)));
    }

    #[test]
    fn a_cipher_byte_with_a_bit_unknown_offers_nothing() {
        let aes = Aead::Aes256Gcm.id();
        assert_eq!(offered(0), Some(Aead::ChaCha20Poly1305), "an earlier vnetd's");
        assert_eq!(offered(NEGOTIATES | PINNED | aes), Some(Aead::Aes256Gcm));
        assert_eq!(offered(NEGOTIATES | 0x80 | aes), None, "an unknown bit");
        assert_eq!(offered(aes), None, "a cipher named without negotiating");
    }

    #[test]
    fn key_errors_say_what_failed_and_an_identity_shows_only_its_public_half() {
        assert_eq!(KeyError::Random.to_string(), "the system's random source failed");
        assert_eq!(KeyError::Noise("bad".into()).to_string(), "Noise: bad");
        let id = Identity::from_private([9; 32]).unwrap();
        let shown = format!("{id:?}");
        assert!(shown.starts_with("Identity { public: [") && shown.ends_with(", .. }"), "{shown}");
        assert!(!shown.contains(&format!("{:?}", [9u8; 32])), "the private half is not shown");
        assert_eq!(id.private(), [9; 32], "but kept, for the key file");
    }

    #[test]
    fn encrypted_datagrams_hide_the_payload_and_refuse_tampering_replay_and_strangers() {
        let (a, b) = pair(Mode::Encrypt);
        assert!(a.sealer().is_none());
        handshake(&a, &b, 0);
        let msg = b"the inner frame: secret bytes".to_vec();
        let d = sealed(&a, &msg);
        assert!(!d.windows(6).any(|w| w == b"secret"), "payload visible on the wire");
        assert_eq!(opened(&b, d.clone()), Some(msg.clone()));
        // The same datagram again: a replay.
        assert_eq!(opened(&b, d.clone()), None);
        assert_eq!(b.stats.replays.load(Relaxed), 1);
        // One bit changed anywhere: refused.
        for i in [4usize, 5, 9, 20, d.len() - 1] {
            let mut t = sealed(&a, &msg);
            t[i] ^= 0x20;
            assert_eq!(opened(&b, t), None, "tampered byte {i}");
        }
        // From a stranger with its own keys (and session) to b: nothing.
        let (x, y) = pair(Mode::Encrypt);
        handshake(&x, &y, 0);
        assert_eq!(opened(&b, sealed(&x, &msg)), None);
        assert!(b.stats.auth_failures.load(Relaxed) >= 5);
        // Plain `vnet` datagrams on a secured link.
        assert_eq!(opened(&b, vec![1, 0, 0, 20, 0, 0, 0, 0]), None);
        assert_eq!(b.stats.unauthenticated.load(Relaxed), 1);
        // And the other way.
        assert_eq!(opened(&a, sealed(&b, &msg)), Some(msg));
    }

    #[test]
    fn a_batch_opens_as_its_datagrams_would_one_by_one_and_stops_at_another_sessions() {
        let (a, b) = pair(Mode::Encrypt);
        handshake(&a, &b, 0);
        let msg = |i: u8| vec![i; 40];
        let (g0, g1, g2, g3) =
            (sealed(&a, &msg(0)), sealed(&a, &msg(1)), sealed(&a, &msg(2)), sealed(&a, &msg(3)));
        let mut forged = g2;
        forged[30] ^= 1;
        let keepalive = sealed(&a, &[]);
        // A GRO batch: equal datagrams, the last one shorter.
        let parts = [&g0, &g1, &g0, &forged, &g3, &keepalive];
        let mut batch: Vec<u8> = parts.iter().flat_map(|d| d.iter().copied()).collect();
        let seg = g0.len();
        let mut out = [const { None }; crate::GSO_MAX_SEGS];
        assert_eq!(b.open_run(&mut batch, seg, &mut out), 6);
        let body = DATA_HEADER..DATA_HEADER + 40;
        let want =
            [Some(body.clone()), Some(body.clone()), None, None, Some(body), Some(DATA_HEADER..DATA_HEADER)];
        assert_eq!(out[..6], want);
        for (i, m) in [(0, 0u8), (1, 1), (4, 3)] {
            assert_eq!(batch[i * seg + DATA_HEADER..i * seg + DATA_HEADER + 40], msg(m)[..], "datagram {i}");
        }
        assert_eq!((b.stats.replays.load(Relaxed), b.stats.auth_failures.load(Relaxed)), (1, 1));
        // Another session's datagram ends the run: the caller opens it and what follows.
        let (x, y) = pair(Mode::Encrypt);
        handshake(&x, &y, 0);
        let (g4, g5, stranger, g6) =
            (sealed(&a, &msg(4)), sealed(&a, &msg(5)), sealed(&x, &msg(9)), sealed(&a, &msg(6)));
        let mut batch: Vec<u8> = [&g4, &g5, &stranger, &g6].iter().flat_map(|d| d.iter().copied()).collect();
        assert_eq!(b.open_run(&mut batch, seg, &mut out), 2);
        assert!(out[..2].iter().all(Option::is_some));
        assert_eq!(opened(&b, batch[3 * seg..].to_vec()), Some(msg(6)));
        // A handshake message first: nothing taken.
        let (p, _) = pair(Mode::Encrypt);
        assert_eq!(b.open_run(&mut initiation(&p, 0), seg, &mut out), 0);
        assert_eq!(b.open_run(&mut batch, 0, &mut out), 0, "no size: nothing");
        assert_eq!(b.open_run(&mut [VERSION, T_DATA, 2, 0], 4, &mut out), 0, "too short to be data");
        // A datagram of the session but not data ends the run: another
        // version, type or mode, or too short for a data datagram.
        for (at, v) in [(0, 1), (1, T_INIT), (2, Mode::Auth.byte())] {
            let mut odd = sealed(&a, &msg(8));
            odd[at] = v;
            let mut batch: Vec<u8> =
                [&sealed(&a, &msg(7)), &odd].iter().flat_map(|d| d.iter().copied()).collect();
            assert_eq!(b.open_run(&mut batch, seg, &mut out), 1, "byte {at} as {v}");
        }
        let short = sealed(&a, &msg(7))[..OVERHEAD - 1].to_vec();
        let mut batch: Vec<u8> =
            [&sealed(&a, &msg(7)), &short].iter().flat_map(|d| d.iter().copied()).collect();
        assert_eq!(b.open_run(&mut batch, seg, &mut out), 1, "a short one");
    }

    #[test]
    fn a_new_session_becomes_current_on_its_first_datagram_that_opens_never_on_a_forged_one() {
        let (a, b) = pair(Mode::Encrypt);
        let mut resp = response(&a, &b);
        let mut ka = [0u8; 256];
        let Opened::Reply(k) = a.open(0, a.peer_addr(), &mut resp, &mut ka) else { panic!("not completed") };
        let mut forged = sealed(&a, b"x");
        forged[20] ^= 1;
        let mut out = [const { None }; 4];
        let seg = forged.len();
        assert_eq!(b.open_run(&mut forged, seg, &mut out), 1);
        assert!(out[0].is_none() && !b.established(), "a forgery promotes nothing");
        let mut real = ka[..k].to_vec();
        assert_eq!(b.open_run(&mut real, k, &mut out), 1);
        assert!(out[0].is_some() && b.established(), "the initiator's first datagram does");
    }

    #[test]
    fn auth_mode_sends_in_the_clear_but_refuses_any_change() {
        let (a, b) = pair(Mode::Auth);
        handshake(&a, &b, 0);
        let msg = b"visible but signed".to_vec();
        let d = sealed(&a, &msg);
        assert!(d.windows(7).any(|w| w == b"visible"));
        assert_eq!(opened(&b, d.clone()), Some(msg.clone()));
        let mut t = sealed(&a, &msg);
        t[DATA_HEADER + 2] ^= 1;
        assert_eq!(opened(&b, t), None);
    }

    #[test]
    fn a_peer_with_another_key_or_mode_gets_no_session() {
        let (a, _) = pair(Mode::Encrypt);
        let (_, b) = pair(Mode::Encrypt);
        let mut init = [0u8; 256];
        let n = a.tick(0, &mut init).unwrap();
        let mut resp = [0u8; 256];
        // b does not know a's key (and a's MAC names another responder).
        assert_eq!(b.open(0, b.peer_addr(), &mut init[..n], &mut resp), Opened::Nothing);
        assert_eq!(b.stats.bad_handshakes.load(Relaxed), 1);
        // Mode mismatch: an `auth` end never answers an `encrypt` one.
        let id = Arc::new(Identity::generate().unwrap());
        let peer = Arc::new(Identity::generate().unwrap());
        let e = SecureLink::new(Mode::Encrypt, id.clone(), peer.public(), Timers::default());
        let au = SecureLink::new(Mode::Auth, peer, id.public(), Timers::default());
        let n = e.tick(0, &mut init).unwrap();
        assert_eq!(au.open(0, au.peer_addr(), &mut init[..n], &mut resp), Opened::Nothing);
        assert!(!au.established());
    }

    #[test]
    fn replayed_initiations_and_floods_are_cheap_and_bounded() {
        let (a, b) = pair(Mode::Encrypt);
        let mut init = [0u8; 256];
        let n = a.tick(0, &mut init).unwrap();
        let first = init;
        let mut resp = [0u8; 256];
        assert!(matches!(b.open(0, b.peer_addr(), &mut init[..n], &mut resp), Opened::Reply(_)));
        // The same initiation later: a replay, not a new session.
        let mut again = first;
        assert_eq!(b.open(SEC, b.peer_addr(), &mut again[..n], &mut resp), Opened::Nothing);
        assert_eq!(b.stats.replays.load(Relaxed), 1);
        // Junk initiations: refused by their MAC before any Diffie-Hellman.
        for i in 0..1000u32 {
            let mut junk = [0u8; INIT_LEN];
            junk[..4].copy_from_slice(&preamble(T_INIT, Mode::Encrypt, 0));
            junk[10..14].copy_from_slice(&i.to_le_bytes());
            assert_eq!(b.open(2 * SEC, b.peer_addr(), &mut junk, &mut resp), Opened::Nothing);
        }
        assert_eq!(b.stats.bad_handshakes.load(Relaxed), 1000);
        // Valid initiations beyond the rate: not answered.
        let mut answered = 0;
        for _ in 0..100 {
            let n = a.tick(100 * SEC, &mut init).or_else(|| {
                a.lock().pending = None;
                a.tick(100 * SEC, &mut init)
            });
            if let Some(n) = n {
                // (Beyond half the budget: cookie replies, no session.)
                if b.open(100 * SEC, b.peer_addr(), &mut init[..n], &mut resp) == Opened::Reply(RESP_LEN) {
                    answered += 1;
                }
            }
        }
        assert!(answered <= 11, "{answered} answered in one instant");
        assert!(b.stats.cookies_sent.load(Relaxed) >= 89);
    }

    #[test]
    fn rekeying_keeps_every_datagram_flowing() {
        let (a, b) = pair(Mode::Encrypt);
        handshake(&a, &b, 0);
        let msg = b"x".to_vec();
        let mut now = 0;
        let mut sessions = 1;
        // 60 "seconds" of traffic both ways, a datagram every 100 ms; a
        // rekey every 10 s; every datagram arrives.
        while now < 60 * SEC {
            now += SEC / 10;
            let mut out = [0u8; 256];
            if let Some(n) = a.tick(now, &mut out) {
                let mut resp = [0u8; 256];
                // Datagrams sealed before the response still open after it.
                let in_flight = sealed(&b, &msg);
                let Opened::Reply(m) = b.open(now, b.peer_addr(), &mut out[..n], &mut resp) else { panic!() };
                let mut ka = [0u8; 256];
                let Opened::Reply(k) = a.open(now, a.peer_addr(), &mut resp[..m], &mut ka) else { panic!() };
                assert_eq!(opened(&a, in_flight), Some(msg.clone()));
                assert_eq!(
                    b.open(now, b.peer_addr(), &mut ka[..k], &mut [0u8; 64]),
                    Opened::Data(DATA_HEADER..DATA_HEADER)
                );
                sessions += 1;
            }
            let _ = b.tick(now, &mut [0u8; 256]);
            assert_eq!(opened(&b, sealed(&a, &msg)), Some(msg.clone()), "a -> b at {now}");
            assert_eq!(opened(&a, sealed(&b, &msg)), Some(msg.clone()), "b -> a at {now}");
        }
        assert!(sessions >= 6, "{sessions} sessions in 60 s");
        assert_eq!(a.stats.auth_failures.load(Relaxed) + b.stats.auth_failures.load(Relaxed), 0);
    }

    /// An initiation a flooder can make: the first MAC is right (the
    /// responder's public key is public), the Noise message is junk, the
    /// second MAC is zeros.
    fn flood_init(to: &SecureLink, i: u32) -> [u8; INIT_LEN] {
        let mut m = [0u8; INIT_LEN];
        m[..4].copy_from_slice(&preamble(T_INIT, to.mode(), 0));
        m[4..8].copy_from_slice(&i.to_le_bytes());
        m[8..INIT_MAC1].fill(i as u8);
        let mac = hmac::sign(&mac_key(&to.identity.public()), &m[..INIT_MAC1]);
        m[INIT_MAC1..INIT_MAC1 + MAC].copy_from_slice(mac.as_ref());
        m
    }

    #[test]
    fn a_link_stays_under_load_for_a_second_after_its_budget_was_half_spent() {
        let (a, b) = pair(Mode::Encrypt);
        let mut resp = [0u8; 256];
        let from = SocketAddr::new(addr(A).ip(), 40000);
        for i in 0..100u32 {
            let _ = b.open(SEC, from, &mut flood_init(&b, i), &mut resp);
        }
        // Half a second later the budget has refilled above half, but a
        // token that came back between two flood packets is no way in
        // without a cookie.
        let mut init = [0u8; 256];
        let n = a.tick(SEC + SEC / 2, &mut init).unwrap();
        assert_eq!(b.open(SEC + SEC / 2, addr(A), &mut init[..n], &mut resp), Opened::Reply(COOKIE_LEN));
        // A quiet second after the flood, initiations are answered again.
        a.lock().pending = None;
        let t = 3 * SEC;
        let n = a.tick(t, &mut init).unwrap();
        assert_eq!(b.open(t, addr(A), &mut init[..n], &mut resp), Opened::Reply(RESP_LEN));
    }

    #[test]
    fn under_load_only_a_peer_that_receives_its_cookie_gets_a_session() {
        let (a, b) = pair(Mode::Encrypt);
        let mut resp = [0u8; 256];
        // A flood from the peer's IP: the first 11 spend half the budget
        // (and fail their Diffie-Hellman), the rest get cookie replies (sent
        // to the peer, which did not ask for them and drops them), no
        // Diffie-Hellman.
        let mut stray = 0;
        for i in 0..1000u32 {
            let spoofed = SocketAddr::new(addr(A).ip(), 40000 + (i % 1000) as u16);
            if let Opened::Reply(n) = b.open(SEC, spoofed, &mut flood_init(&b, i), &mut resp) {
                assert_eq!(n, COOKIE_LEN);
                assert_eq!(a.open(SEC, addr(B), &mut resp[..n], &mut [0u8; 256]), Opened::Nothing);
                stray += 1;
            }
        }
        assert_eq!(b.stats.bad_handshakes.load(Relaxed), 11, "{:?}", b.stats);
        assert_eq!(stray, 989);
        assert_eq!(b.stats.cookies_sent.load(Relaxed), 989);
        assert_eq!(a.stats.cookies_received.load(Relaxed), 0);
        // The real peer: its initiation gets a cookie, which it takes and
        // retries with at the next tick, and gets a session.
        let mut init = [0u8; 256];
        let n = a.tick(SEC, &mut init).unwrap();
        let Opened::Reply(m) = b.open(SEC, addr(A), &mut init[..n], &mut resp) else { panic!("no cookie") };
        assert_eq!(m, COOKIE_LEN);
        // A cookie reply with a byte changed is refused.
        let mut bad = resp;
        bad[25] ^= 1;
        assert_eq!(a.open(SEC, addr(B), &mut bad[..m], &mut [0u8; 256]), Opened::Nothing);
        assert_eq!(a.stats.cookies_received.load(Relaxed), 0);
        assert_eq!(a.open(SEC, addr(B), &mut resp[..m], &mut [0u8; 256]), Opened::Nothing);
        assert_eq!(a.stats.cookies_received.load(Relaxed), 1);
        let now = SEC + SEC / 10;
        let n = a.tick(now, &mut init).expect("retried at once with the cookie");
        // The flood goes on; the same cookie from another address is no
        // cookie (a cookie reply, for that address).
        let other = SocketAddr::new(addr(A).ip(), 40001);
        for i in 0..100u32 {
            let _ = b.open(now, other, &mut flood_init(&b, i), &mut resp);
        }
        let mut copy = init;
        assert_eq!(b.open(now, other, &mut copy[..n], &mut resp), Opened::Reply(COOKIE_LEN));
        let Opened::Reply(m) = b.open(now, addr(A), &mut init[..n], &mut resp) else {
            panic!("not answered")
        };
        assert_eq!(m, RESP_LEN);
        let mut ka = [0u8; 256];
        let Opened::Reply(k) = a.open(now, addr(B), &mut resp[..m], &mut ka) else { panic!("not completed") };
        assert!(matches!(b.open(now, addr(A), &mut ka[..k], &mut [0u8; 64]), Opened::Data(_)));
        assert!(a.established() && b.established());
        // The flood goes on: cookied initiations have a budget of their own.
        let mut later = 0;
        for t in 2..12u64 {
            for i in 0..100u32 {
                let _ = b.open(t * SEC, addr(A), &mut flood_init(&b, i), &mut resp);
            }
            a.lock().pending = None;
            a.lock().current = None; // a rekey is due
            let n = a.tick(t * SEC, &mut init).unwrap();
            if let Opened::Reply(m) = b.open(t * SEC, addr(A), &mut init[..n], &mut resp) {
                later += usize::from(m == RESP_LEN);
            }
        }
        assert_eq!(later, 10, "every rekey under the flood answered");
    }

    /// An initiation from `a` to `b` at `now`, as the wire carried it.
    fn initiation(a: &SecureLink, now: u64) -> Vec<u8> {
        let mut init = [0u8; 256];
        let n = a.tick(now, &mut init).expect("an initiation is due");
        init[..n].to_vec()
    }

    /// `b`'s response to `a`'s initiation at 0.
    fn response(a: &SecureLink, b: &SecureLink) -> Vec<u8> {
        let mut resp = [0u8; 256];
        let Opened::Reply(m) = b.open(0, b.peer_addr(), &mut initiation(a, 0), &mut resp) else {
            panic!("not answered")
        };
        resp[..m].to_vec()
    }

    #[test]
    fn a_responder_sends_on_a_session_only_once_the_initiator_used_it() {
        let (a, b) = pair(Mode::Encrypt);
        let mut init = initiation(&a, 0);
        let mut resp = [0u8; 256];
        let Opened::Reply(m) = b.open(0, b.peer_addr(), &mut init, &mut resp) else { panic!() };
        assert!(b.sealer().is_none(), "the responder must wait for the initiator's first datagram");
        // Nor does it start a handshake of its own meanwhile.
        assert_eq!(b.tick(SEC / 10, &mut [0u8; 256]), None);
        let mut ka = [0u8; 256];
        let Opened::Reply(k) = a.open(0, a.peer_addr(), &mut resp[..m], &mut ka) else { panic!() };
        assert!(matches!(b.open(0, b.peer_addr(), &mut ka[..k], &mut [0u8; 64]), Opened::Data(_)));
        assert_eq!(opened(&a, sealed(&b, b"now")), Some(b"now".to_vec()));
    }

    #[test]
    fn an_initiation_replayed_after_the_responder_restarted_cuts_nothing() {
        let (a, b) = pair(Mode::Encrypt);
        let captured = initiation(&a, 0);
        a.lock().pending = None;
        handshake(&a, &b, 0);
        let seen = b.last_init();
        assert!(seen > 0);
        // b restarts (a new SecureLink, the same keys) with its last
        // timestamp restored from its state directory: the replay is one.
        let restarted = || SecureLink::new(Mode::Encrypt, b.identity.clone(), b.peer, b.timers);
        let b2 = restarted();
        b2.set_last_init(seen);
        let mut resp = [0u8; 256];
        assert_eq!(b2.open(SEC, b2.peer_addr(), &mut captured.clone(), &mut resp), Opened::Nothing);
        assert_eq!(b2.stats.replays.load(Relaxed), 1);
        // Without it (state lost), the replay is answered but its session
        // is never used: b3's own handshake with a brings traffic back.
        let b3 = restarted();
        assert!(matches!(b3.open(SEC, b3.peer_addr(), &mut captured.clone(), &mut resp), Opened::Reply(_)));
        assert!(b3.sealer().is_none());
        handshake(&b3, &a, 2 * SEC);
        assert_eq!(opened(&a, sealed(&b3, b"back")), Some(b"back".to_vec()));
        assert_eq!(opened(&b3, sealed(&a, b"both")), Some(b"both".to_vec()));
    }

    #[test]
    fn crossed_initiations_are_settled_only_on_an_authentic_new_one() {
        // `lo` has the smaller key: on a crossing it gives its own up.
        let (x, y) = pair(Mode::Encrypt);
        let (hi, lo) = if x.identity.public() > y.identity.public() { (x, y) } else { (y, x) };
        let captured = initiation(&hi, 0);
        hi.lock().pending = None;
        handshake(&hi, &lo, 0);
        // lo rekeys (its own initiation in flight) when the captured,
        // old initiation of hi is replayed: lo keeps its handshake.
        lo.lock().current = None;
        let mut mine = initiation(&lo, 10 * SEC);
        let mut resp = [0u8; 256];
        assert_eq!(lo.open(10 * SEC, lo.peer_addr(), &mut captured.clone(), &mut resp), Opened::Nothing);
        assert!(lo.lock().pending.is_some(), "a replay made lo drop its own handshake");
        // A forged one (junk Noise, right first MAC): the same.
        assert_eq!(lo.open(10 * SEC, lo.peer_addr(), &mut flood_init(&lo, 7), &mut resp), Opened::Nothing);
        assert!(lo.lock().pending.is_some());
        // A real crossing: hi keeps its own and ignores lo's; lo answers
        // hi's and drops its own. One session.
        let mut theirs = initiation(&hi, 10 * SEC);
        assert_eq!(hi.open(10 * SEC, hi.peer_addr(), &mut mine, &mut resp), Opened::Nothing);
        let Opened::Reply(m) = lo.open(10 * SEC, lo.peer_addr(), &mut theirs, &mut resp) else { panic!() };
        assert!(lo.lock().pending.is_none());
        let mut ka = [0u8; 256];
        let Opened::Reply(k) = hi.open(10 * SEC, hi.peer_addr(), &mut resp[..m], &mut ka) else { panic!() };
        assert!(matches!(lo.open(10 * SEC, lo.peer_addr(), &mut ka[..k], &mut [0u8; 64]), Opened::Data(_)));
        assert_eq!(opened(&hi, sealed(&lo, b"one")), Some(b"one".to_vec()));
    }
}
