//! A session: the keys a handshake split into, the AEAD that seals and
//! opens a data datagram with them, and the replay window of what it
//! opened.

use super::{
    preamble, Aead, Mode, Timers, DATA_HEADER, OVERHEAD, REJECT_AFTER_MESSAGES, TAG, T_DATA, WINDOW, WORDS,
};
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// The replay window: the highest counter seen and a ring of bitmaps.
#[derive(Debug)]
pub(super) struct Replay {
    any: bool,
    top: u64,
    bits: [u64; WORDS],
}

impl Replay {
    pub(super) fn new() -> Self {
        Replay { any: false, top: 0, bits: [0; WORDS] }
    }

    /// Accepts counter `n` once; false for a repeat or one too old.
    pub(super) fn accept(&mut self, n: u64) -> bool {
        if n >= REJECT_AFTER_MESSAGES || (self.any && n < self.top && self.top - n > WINDOW) {
            return false;
        }
        let block = n >> 6;
        if !self.any {
            self.any = true;
            self.top = n;
        } else if n > self.top {
            let top_block = self.top >> 6;
            let clear = (block - top_block).min(WORDS as u64);
            for i in 1..=clear {
                self.bits[((top_block + i) % WORDS as u64) as usize] = 0;
            }
            self.top = n;
        }
        let w = &mut self.bits[(block % WORDS as u64) as usize];
        let bit = 1u64 << (n & 63);
        if *w & bit != 0 {
            return false;
        }
        *w |= bit;
        true
    }
}

/// One set of session keys.
pub struct Session {
    /// Our index: the peer puts it in the datagrams it sends us.
    pub(super) local: u32,
    /// The peer's index: we put it in ours.
    pub(super) remote: u32,
    pub(super) send: LessSafeKey,
    pub(super) recv: LessSafeKey,
    pub(super) sent: AtomicU64,
    pub(super) replay: Mutex<Replay>,
    pub(super) born_ns: u64,
    pub(super) initiator: bool,
    pub(super) aead: Aead,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("local", &self.local).field("remote", &self.remote).finish()
    }
}

pub(super) fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

pub(super) fn aead_key(a: Aead, k: &[u8; 32]) -> Option<LessSafeKey> {
    UnboundKey::new(a.algorithm(), k).ok().map(LessSafeKey::new)
}

impl Session {
    pub(super) fn new(
        local: u32,
        remote: u32,
        (send, recv): (&[u8; 32], &[u8; 32]),
        aead: Aead,
        now_ns: u64,
        initiator: bool,
    ) -> Option<Self> {
        Some(Session {
            local,
            remote,
            send: aead_key(aead, send)?,
            recv: aead_key(aead, recv)?,
            sent: AtomicU64::new(0),
            replay: Mutex::new(Replay::new()),
            born_ns: now_ns,
            initiator,
            aead,
        })
    }

    /// A session with the given keys and indices, as an initiator
    /// (benchmarks and known-answer tests: sessions come from handshakes).
    pub fn with_keys(aead: Aead, local: u32, remote: u32, send: &[u8; 32], recv: &[u8; 32]) -> Option<Self> {
        Session::new(local, remote, (send, recv), aead, 0, true)
    }

    /// The AEAD the session seals with.
    pub fn aead(&self) -> Aead {
        self.aead
    }

    /// Seals the datagram of `len` bytes at `buf[DATA_HEADER..]` in place,
    /// writing the header before it and the tag after it. Returns the
    /// secured datagram's length, or `None` when the session is used up or
    /// `buf` too short.
    pub fn seal(&self, mode: Mode, buf: &mut [u8], len: usize) -> Option<usize> {
        let total = DATA_HEADER + len + TAG;
        if buf.len() < total {
            return None;
        }
        let ctr = self.sent.fetch_add(1, Relaxed);
        if ctr >= REJECT_AFTER_MESSAGES {
            return None;
        }
        buf[..4].copy_from_slice(&preamble(T_DATA, mode, self.aead.id()));
        buf[4..8].copy_from_slice(&self.remote.to_le_bytes());
        buf[8..16].copy_from_slice(&ctr.to_le_bytes());
        let tag = match mode {
            Mode::Encrypt => {
                let (hdr, rest) = buf.split_at_mut(DATA_HEADER);
                self.send
                    .seal_in_place_separate_tag(nonce(ctr), Aad::from(&hdr[..]), &mut rest[..len])
                    .ok()?
            }
            Mode::Auth => {
                let aad = &buf[..DATA_HEADER + len];
                self.send.seal_in_place_separate_tag(nonce(ctr), Aad::from(aad), &mut []).ok()?
            }
        };
        buf[DATA_HEADER + len..total].copy_from_slice(tag.as_ref());
        Some(total)
    }

    /// Verifies (and for `encrypt` decrypts) a data datagram in place.
    /// Returns the counter when it verified. The replay window is the
    /// link's ([`SecureLink::open`]), not checked here.
    pub fn open(&self, mode: Mode, data: &mut [u8]) -> Option<u64> {
        let len = data.len().checked_sub(OVERHEAD)?;
        let ctr = u64::from_le_bytes(data[8..16].try_into().ok()?);
        match mode {
            Mode::Encrypt => {
                let (hdr, rest) = data.split_at_mut(DATA_HEADER);
                self.recv.open_in_place(nonce(ctr), Aad::from(&hdr[..]), rest).ok()?;
            }
            Mode::Auth => {
                let mut tag = [0u8; TAG];
                tag.copy_from_slice(&data[DATA_HEADER + len..]);
                let aad = &data[..DATA_HEADER + len];
                self.recv.open_in_place(nonce(ctr), Aad::from(aad), &mut tag).ok()?;
            }
        }
        Some(ctr)
    }

    pub(super) fn expired(&self, now_ns: u64, t: &Timers) -> bool {
        now_ns.saturating_sub(self.born_ns) >= t.reject_after_ns
    }
}
