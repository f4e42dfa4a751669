//! Relaying: a secured link whose peer is not heard from directly (both
//! behind NATs that map every destination to a new port, say) sends
//! through a relay, a vnetd both ends have secured links with and that
//! runs with `--relay`.
//!
//! What the relay sees is sealed twice: each datagram of the link (its
//! handshakes, data, keepalives), sealed end to end with the link's own
//! session, travels inside a `vnet` datagram flagged `RELAY_TO` with the
//! destination's public key, sealed with the sender's session with the
//! relay. The relay opens that outer layer only (it authenticates the
//! sender, so no stranger uses it), finds its link whose peer has the
//! destination key, and sends the inner datagram on inside a `RELAY_FROM`
//! datagram naming the origin's key, sealed with its session with the
//! destination. The destination opens the outer layer, accepts it only
//! from the relay its link to the origin names, and opens the inner
//! datagram with the end-to-end session as if it had come directly: the
//! relay can neither read nor forge what the two ends exchange, only drop
//! it. A relayed datagram never moves a link (roaming) and is never
//! relayed again.
//!
//! The link keeps trying the direct path: it sends its handshakes and a
//! keepalive a second directly too, and the moment an authenticated
//! datagram arrives directly from the peer it sends directly again.
//!
//! The wrapping is written into a buffer per thread (allocated once, as
//! large as the largest datagram seen), not allocated per datagram.
//!
//! This is the sending half (the wrapping); a relayed datagram's arrival is
//! `crate::rx::relay`.

use crate::codec::Tx;
use crate::secure;
use std::cell::RefCell;
use std::io::IoSlice;
use vnet_wire::vnet::{Flags, VnetRepr, HEADER_LEN};

/// The key that names a link's peer in a relayed datagram.
pub const KEY: usize = 32;
/// What relaying adds to a datagram: the outer secured header and tag, the
/// `vnet` header and the key.
pub const OVERHEAD: usize = secure::OVERHEAD + HEADER_LEN + KEY;

thread_local! {
    static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Sends the datagrams in `iov` (`seg` bytes each, the last may be
/// shorter; one if `seg` covers them all) to `key`'s host through `via`,
/// the link to the relay (or, from the relay, to the destination; its
/// network `network`), each in a `vnet` datagram flagged `flag` naming
/// `key`, sealed with `via`'s session.
pub fn send_through(
    via: &Tx<'_>,
    network: u32,
    flag: u8,
    key: &[u8; KEY],
    iov: &[IoSlice<'_>],
    seg: usize,
) -> bool {
    let Some(sec) = via.secure else { return false };
    let Some(session) = sec.sealer() else { return false };
    let total: usize = iov.iter().map(|s| s.len()).sum();
    let seg = seg.max(1).min(total.max(1));
    BUF.with(|b| {
        let mut b = b.borrow_mut();
        // The datagrams, then room for one wrapped datagram.
        let need = total + OVERHEAD + seg;
        if b.len() < need {
            b.resize(need, 0);
        }
        let (flat, out) = b.split_at_mut(total);
        let mut at = 0;
        for s in iov {
            flat[at..at + s.len()].copy_from_slice(s);
            at += s.len();
        }
        let repr = VnetRepr { flags: Flags(flag), network, frame_id: 0, frame_len: 0, offset: 0 };
        let mut ok = true;
        for d in flat.chunks(seg) {
            let plain = HEADER_LEN + KEY + d.len();
            let p = secure::DATA_HEADER;
            if repr.emit(&mut out[p..]).is_none() {
                return false;
            }
            out[p + HEADER_LEN..p + HEADER_LEN + KEY].copy_from_slice(key);
            out[p + HEADER_LEN + KEY..p + plain].copy_from_slice(d);
            match session.seal(sec.mode(), out, plain) {
                Some(n) => ok &= via.direct.send(&[IoSlice::new(&out[..n])], n, 0),
                None => return false,
            }
        }
        ok
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::tests::Kept;
    use crate::secure::tests::{handshake, opened, pair};
    use vnet_wire::frag::FrameIds;

    #[test]
    fn datagrams_in_pieces_are_each_wrapped_whole_naming_the_key_and_a_refused_send_is_said() {
        let (a, b) = pair(secure::Mode::Encrypt);
        handshake(&a, &b, 1);
        let ids = FrameIds::new(1);
        let kept = Kept::default();
        let tx = Tx {
            out: &kept,
            direct: &kept,
            max_datagram: 1472,
            outer_len: 28,
            frame_ids: &ids,
            secure: Some(&a),
        };
        let key = [7u8; KEY];
        let data: Vec<u8> = (0..100).collect();
        // Two datagrams of 50 bytes, laid out in pieces that cut across them.
        let iov = [IoSlice::new(&data[..30]), IoSlice::new(&data[30..80]), IoSlice::new(&data[80..])];
        assert!(send_through(&tx, 5, Flags::RELAY_TO, &key, &iov, 50));
        let sent = std::mem::take(&mut *kept.sent.lock().unwrap());
        assert_eq!(sent.len(), 2);
        for (i, d) in sent.into_iter().enumerate() {
            let plain = opened(&b, d).expect("sealed with the session");
            let p = vnet_wire::vnet::VnetPacket::new_checked(&plain[..]).unwrap();
            assert_eq!((p.flags().0, p.network(), p.header_len()), (Flags::RELAY_TO, 5, HEADER_LEN));
            assert_eq!(plain[HEADER_LEN..HEADER_LEN + KEY], key);
            assert_eq!(plain[HEADER_LEN + KEY..], data[i * 50..(i + 1) * 50], "datagram {i}");
        }
        let refusing = Kept { refuse: true, ..Kept::default() };
        let tx = Tx { out: &refusing, direct: &refusing, ..tx };
        assert!(!send_through(&tx, 5, Flags::RELAY_TO, &key, &iov, 50));
    }
}
