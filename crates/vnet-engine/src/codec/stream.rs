//! `tcp` (and TLS) links: frames on a byte stream. Each frame is one record:
//! a `vnet` header (`docs/wire.md`) with frame id and offset 0, the frame
//! length, and flag `VNET_HDR` when the payload begins with the frame's
//! `virtio_net_hdr`; then the payload. A stream never fragments, so a record
//! carries up to a whole 64 KB frame, offloads included. A record whose
//! frame length is 0 carries nothing: the heartbeat an idle connection
//! sends so that its peer knows it is alive.
//!
//! The [`Deframer`] is the receiving half, sans-IO: bytes in (from a
//! socket, a TLS session, or the simulator), whole records out, in a buffer
//! allocated once. A record that breaks the format ends the stream: there
//! is no way to find the next record boundary after it.

use super::{Facts, Inbound, Keepalive, Tx};
use crate::port::Payload;
use vnet_wire::vnet::{self, Flags, VnetRepr, HEADER_LEN};

/// Bytes the format adds to a frame on the stream.
pub const OVERHEAD: usize = HEADER_LEN;
/// The largest record payload: a largest frame and its offload header.
pub const MAX_PAYLOAD: usize = vnet::MAX_CARRIED_LEN as usize;

/// A record carries the offload header and any frame whole; an idle
/// stream sends heartbeats.
pub const FACTS: Facts = Facts {
    overhead: OVERHEAD,
    offloads: true,
    any_size: true,
    probes: false,
    keepalive: Keepalive::Stream,
    inbound: Inbound::Stream,
};

/// The record header of a payload of `len` bytes.
pub fn header(len: usize, with_vh: bool) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    let repr = VnetRepr {
        flags: Flags(if with_vh { Flags::VNET_HDR } else { 0 }),
        network: 0,
        frame_id: 0,
        frame_len: len as u32,
        offset: 0,
    };
    // The buffer is HEADER_LEN bytes: emit cannot fail.
    let _ = repr.emit(&mut h);
    h
}

/// The heartbeat record.
pub fn heartbeat() -> [u8; HEADER_LEN] {
    header(0, false)
}

/// Sends each frame as one record (one `send` of the header and the
/// frame's slices).
pub fn send(tx: &Tx<'_>, payload: Payload<'_>, flow: u64) -> bool {
    payload.each_frame(|parts, hdr| {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > MAX_PAYLOAD {
            return false;
        }
        super::with_head(&header(len, hdr), parts, |iov| tx.direct.send(iov, usize::MAX, flow))
    })
}

/// Why a stream cannot go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamError {
    /// A header that is not a `vnet` record header.
    Header(vnet_wire::Error),
    /// A record that claims a fragment of a frame, or more than a frame.
    Record { offset: u32, len: u32 },
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamError::Header(e) => write!(f, "bad record header: {e}"),
            StreamError::Record { offset, len } => {
                write!(f, "bad record: offset {offset}, length {len} (at most {MAX_PAYLOAD}, offset 0)")
            }
        }
    }
}

/// One record taken off the stream.
#[derive(Debug)]
pub enum Record<'a> {
    /// A frame's payload; it begins with a `virtio_net_hdr` when `with_vh`.
    Frame { with_vh: bool, payload: &'a mut [u8] },
    /// A heartbeat.
    Heartbeat,
}

/// Cuts a byte stream into records.
pub struct Deframer {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Default for Deframer {
    fn default() -> Self {
        Deframer { buf: vec![0u8; 2 * (MAX_PAYLOAD + 64)], start: 0, end: 0 }
    }
}

impl Deframer {
    /// Space to read the next bytes into: never empty while the caller takes
    /// every complete record before reading more (the buffer holds two
    /// largest records).
    pub fn spare(&mut self) -> &mut [u8] {
        if self.start > 0 && self.buf.len() - self.end < MAX_PAYLOAD + 64 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.buf[self.end..]
    }

    /// Says that `n` bytes were read into [`Deframer::spare`].
    pub fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }

    /// Copies `bytes` in (for callers that get bytes rather than read them);
    /// returns how many fitted.
    pub fn push(&mut self, bytes: &[u8]) -> usize {
        let spare = self.spare();
        let n = bytes.len().min(spare.len());
        spare[..n].copy_from_slice(&bytes[..n]);
        self.filled(n);
        n
    }

    /// The next whole record, `None` until one is complete, or the error
    /// that ends the stream.
    pub fn next_record(&mut self) -> Result<Option<Record<'_>>, StreamError> {
        let have = &self.buf[self.start..self.end];
        if have.len() < HEADER_LEN {
            return Ok(None);
        }
        let (repr, hl) = vnet::parse_header(have).map_err(StreamError::Header)?;
        let len = repr.frame_len as usize;
        if repr.offset != 0 || len > MAX_PAYLOAD || hl > 64 {
            return Err(StreamError::Record { offset: repr.offset, len: repr.frame_len });
        }
        if have.len() < hl + len {
            return Ok(None);
        }
        let at = self.start + hl;
        self.start = at + len;
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
        if len == 0 {
            return Ok(Some(Record::Heartbeat));
        }
        let with_vh = repr.flags.0 & Flags::VNET_HDR != 0;
        Ok(Some(Record::Frame { with_vh, payload: &mut self.buf[at..at + len] }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Test vector S1 of docs/wire.md: a 14-byte frame as a stream record.
    const S1: [u8; 34] = [
        0x01, 0x00, 0x00, 0x14, // version 1, no flags, header length 20
        0x00, 0x00, 0x00, 0x00, // network 0
        0x00, 0x00, 0x00, 0x00, // frame id 0
        0x00, 0x00, 0x00, 0x0e, // payload length 14
        0x00, 0x00, 0x00, 0x00, // offset 0
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06,
    ];

    #[test]
    fn a_stream_longer_than_the_buffer_flows_through_it() {
        // Five records of 60000 bytes (more than twice the buffer) pushed
        // in pieces, each record taken as it completes.
        let mut d = Deframer::default();
        let mut stream = Vec::new();
        for r in 0..5u8 {
            stream.extend_from_slice(&header(60_000, false));
            stream.extend(std::iter::repeat_n(r, 60_000));
        }
        let mut got = Vec::new();
        for piece in stream.chunks(7000) {
            let mut rest = piece;
            while !rest.is_empty() {
                let n = d.push(rest);
                assert!(n > 0, "no room after {} records", got.len());
                rest = &rest[n..];
                while let Some(Record::Frame { payload, .. }) = d.next_record().unwrap() {
                    got.push((payload.len(), payload[0]));
                }
            }
        }
        assert_eq!(got, (0..5u8).map(|r| (60_000, r)).collect::<Vec<_>>());
    }

    #[test]
    fn a_record_header_may_carry_options_up_to_64_bytes() {
        let record = |hl: u8| {
            let mut r = S1[..20].to_vec();
            r[3] = hl;
            r.resize(usize::from(hl), 0);
            r.extend_from_slice(&S1[20..]);
            r
        };
        let mut d = Deframer::default();
        d.push(&record(64));
        assert!(matches!(d.next_record(), Ok(Some(Record::Frame { payload, .. })) if *payload == S1[20..]));
        let mut d = Deframer::default();
        d.push(&record(68));
        assert_eq!(d.next_record().err(), Some(StreamError::Record { offset: 0, len: 14 }));
    }

    #[test]
    fn a_broken_stream_says_why() {
        let e = StreamError::Record { offset: 3, len: 9 };
        assert_eq!(
            e.to_string(),
            format!("bad record: offset 3, length 9 (at most {MAX_PAYLOAD}, offset 0)")
        );
        let e = StreamError::Header(vnet_wire::Error::Version(7));
        assert_eq!(e.to_string(), format!("bad record header: {}", vnet_wire::Error::Version(7)));
    }

    #[test]
    fn vector_and_byte_by_byte_delivery() {
        assert_eq!(header(14, false), S1[..20]);
        let mut d = Deframer::default();
        // Fed one byte at a time, the record appears exactly when complete.
        let mut stream = Vec::new();
        stream.extend_from_slice(&heartbeat());
        stream.extend_from_slice(&S1);
        stream.extend_from_slice(&S1);
        let mut got = Vec::new();
        for b in &stream {
            assert_eq!(d.push(&[*b]), 1);
            while let Some(r) = d.next_record().unwrap() {
                got.push(match r {
                    Record::Heartbeat => None,
                    Record::Frame { with_vh, payload } => Some((with_vh, payload.to_vec())),
                });
            }
        }
        assert_eq!(got, vec![None, Some((false, S1[20..].to_vec())), Some((false, S1[20..].to_vec()))]);
    }

    #[test]
    fn a_broken_record_ends_the_stream() {
        let mut d = Deframer::default();
        let mut bad = S1;
        bad[0] = 2;
        d.push(&bad);
        assert!(matches!(d.next_record(), Err(StreamError::Header(vnet_wire::Error::Version(2)))));
        let mut d = Deframer::default();
        let mut frag = S1;
        frag[19] = 4; // offset 4: a fragment, which a stream never carries
        d.push(&frag);
        assert!(matches!(d.next_record(), Err(StreamError::Record { offset: 4, .. })));
        let mut d = Deframer::default();
        let big = header(MAX_PAYLOAD + 1, false);
        d.push(&big);
        assert!(d.next_record().is_err());
    }

    #[test]
    fn largest_records_fit_whatever_the_alignment() {
        let mut d = Deframer::default();
        let payload = vec![7u8; MAX_PAYLOAD];
        for round in 0..5 {
            let mut rec = header(MAX_PAYLOAD, true).to_vec();
            rec.extend_from_slice(&payload);
            let mut rest = &rec[..];
            // Small records first shift the alignment each round.
            for _ in 0..round {
                d.push(&S1);
            }
            while !rest.is_empty() {
                let n = d.push(rest);
                rest = &rest[n..];
                while let Some(r) = d.next_record().unwrap() {
                    if let Record::Frame { payload: p, .. } = r {
                        assert!(p.len() == MAX_PAYLOAD || p.len() == 14, "{}", p.len());
                    }
                }
            }
        }
    }
}
