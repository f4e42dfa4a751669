//! A host's static key pair ([`Identity`], from vnet-keys, re-exported
//! here) and when its sessions are renewed and given up ([`Timers`]).

pub use vnet_keys::{Identity, KeyError};

/// When sessions are renewed and given up.
#[derive(Debug, Clone, Copy)]
pub struct Timers {
    /// The initiator starts a new handshake after this long...
    pub rekey_after_ns: u64,
    /// ...or this many datagrams.
    pub rekey_after_messages: u64,
    /// A session is dropped after this long.
    pub reject_after_ns: u64,
    /// An unanswered initiation is sent again after this long.
    pub retry_ns: u64,
    /// Initiations answered per second per link (and the burst).
    pub handshakes_per_sec: u32,
    /// The clock an initiation is dated by, and a peer's date checked
    /// against: the wall clock (nanoseconds since the Unix epoch) as the
    /// caller reads it, so that dates grow across restarts, as WireGuard's
    /// TAI64N does (vnetd gives `SystemTime`). `None`: the engine clock
    /// plus one (the simulator's, whose hosts share one clock).
    pub wall_clock: Option<fn() -> u64>,
}

impl Default for Timers {
    fn default() -> Self {
        Timers::with_rekey(120_000_000_000)
    }
}

impl Timers {
    /// WireGuard's proportions around a rekey interval.
    pub fn with_rekey(rekey_after_ns: u64) -> Self {
        Timers {
            rekey_after_ns,
            rekey_after_messages: 1 << 60,
            reject_after_ns: rekey_after_ns + rekey_after_ns / 2,
            retry_ns: 1_000_000_000,
            handshakes_per_sec: 20,
            wall_clock: None,
        }
    }

    /// These timers, with initiations dated by `wall_clock`.
    pub fn dated_by(self, wall_clock: fn() -> u64) -> Self {
        Timers { wall_clock: Some(wall_clock), ..self }
    }

    /// The date of an initiation sent, or checked, at engine time `now_ns`.
    pub(super) fn date(&self, now_ns: u64) -> u64 {
        self.wall_clock.map_or(now_ns.saturating_add(1), |f| f())
    }
}
