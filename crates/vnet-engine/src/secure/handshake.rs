//! The handshake of a secured link: the initiation it sends, and the
//! answers to the peer's messages (a response, a cookie reply under load)
//! and what they make (a session). The Noise IK state machine is `snow`'s;
//! the MACs, cookies, timestamps and budgets around it are WireGuard's.

use super::cipher::{NEGOTIATES, PINNED, PREFERS_AES};
use super::{
    addr_bytes, index_at, offered, preamble, prologue, random, Aead, Bucket, Mode, Opened, Pending,
    SecureLink, Session, State, COOKIE, COOKIE_LEN, COOKIE_LIFE_NS, COOKIE_NONCE, INIT_LEN, INIT_MAC1,
    INIT_NOISE, LOAD_HOLD_NS, MAC, MAX_CLOCK_AHEAD_NS, PLAIN_RESP_LEN, RESP_LEN, RESP_NOISE, TAG, T_COOKIE,
    T_INIT, T_RESP,
};
use aws_lc_rs::aead::{Aad, Nonce};
use ring::hmac;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

impl SecureLink {
    pub(super) fn initiate(&self, st: &mut State, now_ns: u64, out: &mut [u8]) -> Option<usize> {
        if out.len() < INIT_LEN {
            return None;
        }
        let aead = self.policy.choose(st.peer_aes);
        let offer = self.policy.offer(aead);
        let mut hs = self.handshake(self.mode, true, offer)?;
        let local = self.new_index(st);
        out[..4].copy_from_slice(&preamble(T_INIT, self.mode, offer));
        out[4..8].copy_from_slice(&local.to_le_bytes());
        let n = hs.write_message(&self.timers.date(now_ns).to_be_bytes(), &mut out[8..INIT_MAC1]).ok()?;
        if n != INIT_NOISE {
            return None;
        }
        let mac1 = hmac::sign(&self.mac_to_peer, &out[..INIT_MAC1]);
        out[INIT_MAC1..INIT_MAC1 + MAC].copy_from_slice(mac1.as_ref());
        // The second MAC: keyed by the peer's cookie while it is fresh, else zeros.
        let cookie = st.cookie.filter(|c| now_ns.saturating_sub(c.1) < COOKIE_LIFE_NS - self.timers.retry_ns);
        match cookie {
            Some((c, _)) => {
                let mac2 = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &c), &out[..INIT_MAC1 + MAC]);
                out[INIT_MAC1 + MAC..INIT_LEN].copy_from_slice(mac2.as_ref());
            }
            None => out[INIT_MAC1 + MAC..INIT_LEN].fill(0),
        }
        let mut m = [0u8; MAC];
        m.copy_from_slice(mac1.as_ref());
        st.pending = Some(Pending { hs, local, sent_ns: now_ns, mac1: m, aead });
        st.renegotiate = false;
        self.stats.handshakes_sent.fetch_add(1, Relaxed);
        Some(INIT_LEN)
    }

    /// Verifies a handshake message's MAC (the [`MAC`] bytes at `at`, over what is before).
    pub(super) fn mac_ok(&self, msg: &[u8], at: usize) -> bool {
        hmac::verify(&self.mac_to_us, &msg[..at], &msg[at..at + MAC]).is_ok()
    }

    /// The cookie of address `from`: the first bytes of an HMAC under a
    /// secret renewed every [`COOKIE_LIFE_NS`].
    pub(super) fn cookie_of(&self, st: &mut State, now_ns: u64, from: SocketAddr) -> [u8; COOKIE] {
        if st.secret.as_ref().is_some_and(|(_, born)| now_ns.saturating_sub(*born) >= COOKIE_LIFE_NS) {
            st.secret = None;
        }
        let (key, _) =
            st.secret.get_or_insert_with(|| (hmac::Key::new(hmac::HMAC_SHA256, &random::<32>()), now_ns));
        let tag = hmac::sign(key, &addr_bytes(from));
        let mut c = [0u8; COOKIE];
        c.copy_from_slice(&tag.as_ref()[..COOKIE]);
        c
    }

    /// A reply giving `cookie` to the sender of initiation `init`, into `reply`.
    pub(super) fn cookie_reply(&self, cookie: &[u8; COOKIE], init: &[u8], reply: &mut [u8]) -> Opened {
        if reply.len() < COOKIE_LEN {
            return Opened::Nothing;
        }
        let nonce: [u8; COOKIE_NONCE] = random();
        reply[..4].copy_from_slice(&preamble(T_COOKIE, self.mode, 0));
        reply[4..8].copy_from_slice(&init[4..8]);
        reply[8..20].copy_from_slice(&nonce);
        let (sealed, tag) = reply[20..COOKIE_LEN].split_at_mut(COOKIE);
        sealed.copy_from_slice(cookie);
        let aad = Aad::from(&init[INIT_MAC1..INIT_MAC1 + MAC]);
        let Ok(t) =
            self.cookie_ours.seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), aad, sealed)
        else {
            return Opened::Nothing;
        };
        tag.copy_from_slice(t.as_ref());
        self.stats.cookies_sent.fetch_add(1, Relaxed);
        Opened::Reply(COOKIE_LEN)
    }

    /// The initiator: a cookie reply to our pending initiation. Kept, and
    /// the initiation is sent again at the next tick, with the cookie.
    pub(super) fn take_cookie(&self, now_ns: u64, data: &[u8]) -> Opened {
        let s = &self.stats;
        let mut st = self.lock();
        let Some(p) =
            st.pending.as_mut().filter(|p| data.len() == COOKIE_LEN && index_at(data, 4) == p.local)
        else {
            s.bad_handshakes.fetch_add(1, Relaxed);
            return Opened::Nothing;
        };
        let mut sealed = [0u8; COOKIE + TAG];
        sealed.copy_from_slice(&data[20..COOKIE_LEN]);
        let mut nonce = [0u8; COOKIE_NONCE];
        nonce.copy_from_slice(&data[8..20]);
        let aad = Aad::from(&p.mac1[..]);
        let Ok(plain) =
            self.cookie_theirs.open_in_place(Nonce::assume_unique_for_key(nonce), aad, &mut sealed)
        else {
            s.bad_handshakes.fetch_add(1, Relaxed);
            return Opened::Nothing;
        };
        let mut c = [0u8; COOKIE];
        c.copy_from_slice(plain);
        // Retry at once with it.
        p.sent_ns = now_ns.saturating_sub(self.timers.retry_ns);
        st.cookie = Some((c, now_ns));
        s.cookies_received.fetch_add(1, Relaxed);
        Opened::Nothing
    }

    /// The responder: an initiation from the peer's IP at `from` (as the
    /// receive path gives it: canonical, so a cookie names one address).
    pub(super) fn answer(
        &self,
        now_ns: u64,
        from: SocketAddr,
        at_endpoint: bool,
        data: &[u8],
        reply: &mut [u8],
    ) -> Opened {
        let s = &self.stats;
        if data.len() != INIT_LEN || !self.mac_ok(data, INIT_MAC1) || reply.len() < RESP_LEN {
            s.bad_handshakes.fetch_add(1, Relaxed);
            return Opened::Nothing;
        }
        let Some(aead) = offered(data[3]) else {
            s.bad_handshakes.fetch_add(1, Relaxed);
            return Opened::Nothing;
        };
        // Another cipher than the link's is refused, never answered with
        // ours: the initiator's offer is what its transcript binds.
        if !self.policy.allows(aead) {
            s.cipher_refused.fetch_add(1, Relaxed);
            return Opened::Nothing;
        }
        let mut st = self.lock();
        if let Err(refused) = self.admit(&mut st, now_ns, from, data, reply) {
            return refused;
        }
        let Some(mut hs) = self.handshake(self.mode, false, data[3]) else {
            s.bad_handshakes.fetch_add(1, Relaxed);
            return Opened::Nothing;
        };
        let mut payload = [0u8; 32];
        let ok = hs.read_message(&data[8..INIT_MAC1], &mut payload).ok() == Some(8)
            && hs.get_remote_static() == Some(&self.peer[..]);
        if !ok {
            s.bad_handshakes.fetch_add(1, Relaxed);
            return Opened::Nothing;
        }
        let ts = u64::from_be_bytes(payload[..8].try_into().unwrap_or_default());
        if ts > self.timers.date(now_ns).saturating_add(MAX_CLOCK_AHEAD_NS) {
            s.future_timestamps.fetch_add(1, Relaxed);
            return Opened::Nothing;
        }
        if ts <= st.last_init {
            s.replays.fetch_add(1, Relaxed);
            return Opened::Nothing;
        }
        st.last_init = ts;
        let negotiates = data[3] & NEGOTIATES != 0;
        st.peer_aes = Some(negotiates && data[3] & PREFERS_AES != 0);
        // Both ends initiated at once (both started, or both rekey): the
        // one with the larger public key keeps its own handshake and lets
        // this one go; the other answers and abandons its own. One session.
        // Decided only now, on an initiation that is the peer's and new:
        // a replayed or forged one never makes us drop our own.
        let crossed =
            st.pending.as_ref().is_some_and(|p| now_ns.saturating_sub(p.sent_ns) < self.timers.retry_ns);
        // Ours is kept only if the peer can take it: a peer whose link
        // names another cipher than ours offers would refuse it.
        if crossed {
            let refused = data[3] & PINNED != 0 && st.pending.as_ref().is_some_and(|p| p.aead != aead);
            if at_endpoint && self.identity.public() > self.peer && !refused {
                return Opened::Nothing;
            }
            st.pending = None;
        }
        self.respond(&mut st, now_ns, (hs, aead, negotiates), data, reply)
    }

    /// The rate limit of answered initiations: a token each, from the
    /// budget of initiations with a valid cookie MAC if this one (from
    /// `from`) has it; under load, none without one: a cookie reply
    /// instead. `Err`: what to answer instead of a response.
    fn admit(
        &self,
        st: &mut State,
        now_ns: u64,
        from: SocketAddr,
        data: &[u8],
        reply: &mut [u8],
    ) -> Result<(), Opened> {
        let per_sec = u64::from(self.timers.handshakes_per_sec.max(1));
        let elapsed = now_ns.saturating_sub(st.filled_ns);
        st.budget.refill(elapsed, per_sec);
        st.cookied.refill(elapsed, per_sec);
        st.filled_ns = now_ns;
        let cookie = self.cookie_of(st, now_ns, from);
        let key = hmac::Key::new(hmac::HMAC_SHA256, &cookie);
        let cookied = hmac::verify(&key, &data[..INIT_MAC1 + MAC], &data[INIT_MAC1 + MAC..]).is_ok();
        if st.budget.tokens < per_sec * Bucket::ONE / 2 {
            st.loaded_until_ns = now_ns.saturating_add(LOAD_HOLD_NS);
        }
        let under_load = now_ns < st.loaded_until_ns;
        let admitted = if cookied {
            st.cookied.take()
        } else if under_load {
            return Err(self.cookie_reply(&cookie, data, reply));
        } else {
            st.budget.take()
        };
        if !admitted {
            self.stats.rate_limited.fetch_add(1, Relaxed);
            return Err(Opened::Nothing);
        }
        Ok(())
    }

    /// The response to the peer's initiation `data`, read into `hs` (its
    /// AEAD `aead`; `negotiates`: it said so), into `reply`; the session it
    /// makes waits for the initiator's first datagram.
    fn respond(
        &self,
        st: &mut State,
        now_ns: u64,
        (mut hs, aead, negotiates): (snow::HandshakeState, Aead, bool),
        data: &[u8],
        reply: &mut [u8],
    ) -> Opened {
        let s = &self.stats;
        let theirs = index_at(data, 4);
        let local = self.new_index(st);
        reply[..4].copy_from_slice(&preamble(T_RESP, self.mode, aead.id()));
        reply[4..8].copy_from_slice(&local.to_le_bytes());
        reply[8..12].copy_from_slice(&theirs.to_le_bytes());
        // Our preference, sealed in the response: to a negotiating initiator.
        let ours = [if self.policy.prefers_aes() { PREFERS_AES } else { 0 }];
        let (payload, len) = if negotiates { (&ours[..], RESP_LEN) } else { (&[][..], PLAIN_RESP_LEN) };
        let noise = len - 12 - MAC;
        if hs.write_message(payload, &mut reply[12..12 + noise]).ok() != Some(noise) {
            s.bad_handshakes.fetch_add(1, Relaxed);
            return Opened::Nothing;
        }
        let mac = hmac::sign(&self.mac_to_peer, &reply[..12 + noise]);
        reply[12 + noise..len].copy_from_slice(mac.as_ref());
        // Initiator to responder first.
        let (i2r, r2i) = hs.dangerously_get_raw_split();
        let Some(session) = Session::new(local, theirs, (&r2i, &i2r), aead, now_ns, false) else {
            s.bad_handshakes.fetch_add(1, Relaxed);
            return Opened::Nothing;
        };
        // Not sent on until the initiator's first datagram arrives on it
        // (WireGuard's rule): whoever replays an initiation gets a
        // session nobody confirms, which changes nothing.
        st.next = Some(Arc::new(session));
        s.handshakes_answered.fetch_add(1, Relaxed);
        s.sessions.fetch_add(1, Relaxed);
        Opened::Reply(len)
    }

    /// A Noise IK handshake with this host's key, for an initiation of
    /// `mode` with cipher byte `cipher` (the protocol name is its AEAD's;
    /// the prologue has the mode and the byte): as initiator (to the
    /// peer's key), or as responder.
    pub(super) fn handshake(&self, mode: Mode, initiator: bool, cipher: u8) -> Option<snow::HandshakeState> {
        let (p, n) = prologue(mode, cipher);
        let private = self.identity.private();
        let b = snow::Builder::new(offered(cipher)?.noise().parse().ok()?)
            .local_private_key(&private)
            .ok()?
            .prologue(&p[..n])
            .ok()?;
        if initiator {
            b.remote_public_key(&self.peer).ok()?.build_initiator().ok()
        } else {
            b.build_responder().ok()
        }
    }

    /// The initiator: the response to our initiation. Answers with a
    /// keepalive on the new session, so the responder may use it too.
    pub(super) fn complete(&self, now_ns: u64, data: &[u8], reply: &mut [u8]) -> Opened {
        let s = &self.stats;
        if data.len() != RESP_LEN || !self.mac_ok(data, RESP_LEN - MAC) {
            s.bad_handshakes.fetch_add(1, Relaxed);
            return Opened::Nothing;
        }
        let mut st = self.lock();
        let ours = index_at(data, 8);
        if st.pending.as_ref().is_none_or(|p| p.local != ours) {
            s.bad_handshakes.fetch_add(1, Relaxed);
            return Opened::Nothing;
        }
        let Some(mut p) = st.pending.take() else { return Opened::Nothing };
        let mut payload = [0u8; 16];
        if data[3] != p.aead.id()
            || p.hs.read_message(&data[12..12 + RESP_NOISE], &mut payload).ok() != Some(1)
        {
            s.bad_handshakes.fetch_add(1, Relaxed);
            return Opened::Nothing;
        }
        // What the responder prefers, authenticated: if both ends would
        // rather use the other AEAD (an `auto` link's first guess), a new
        // handshake at the next tick makes the session they prefer.
        let peer_aes = payload[0] & PREFERS_AES != 0;
        st.peer_aes = Some(peer_aes);
        st.renegotiate = self.policy.choose(Some(peer_aes)) != p.aead;
        let theirs = index_at(data, 4);
        let (i2r, r2i) = p.hs.dangerously_get_raw_split();
        let Some(session) = Session::new(p.local, theirs, (&i2r, &r2i), p.aead, now_ns, true) else {
            return Opened::Nothing;
        };
        let session = Arc::new(session);
        st.previous = st.current.replace(session.clone());
        self.tx.store(Some(session.clone()));
        s.sessions.fetch_add(1, Relaxed);
        drop(st);
        match session.seal(self.mode, reply, 0) {
            Some(n) => Opened::Reply(n),
            None => Opened::Nothing,
        }
    }
}
