//! The links as a resource of the daemon: each link the engine forwards
//! on, its I/O (its kind's own handles: a stream, a LAN reader), and what
//! secured links need (this host's key pair, the rekey timers, the peers'
//! last handshake timestamps).

use super::positions::Positions;
use super::sockets::NewSockets;
use crate::link::{self, Sockets};
use crate::shared::{wall_ns, Shared};
use std::collections::BTreeMap;
use std::sync::Arc;
use vnet_control::{Command, Error, State, Transport};
use vnet_engine::secure::{Identity, Timers};
use vnet_engine::Link;

/// The running links and what makes them.
#[derive(Default)]
pub(super) struct LinkSet {
    pub(super) running: BTreeMap<u32, Arc<Link>>,
    /// Each link's I/O (its kind's own handles: a stream, a LAN reader).
    pub(super) io: BTreeMap<u32, Arc<dyn link::LinkIo>>,
    /// This host's key pair (`--key`), for links with `security`.
    pub(super) identity: Option<Arc<Identity>>,
    /// When secured links rekey.
    pub(super) timers: Timers,
    /// Each peer's last handshake timestamp, kept across restarts.
    pub(super) stamps: crate::handshakes::Stamps,
}

/// Links whose I/O a transaction not yet committed started: stopped if it
/// fails.
struct Started(Vec<Arc<dyn link::LinkIo>>);

impl Started {
    fn keep(&mut self) {
        self.0.clear();
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        for t in &self.0 {
            t.stop();
        }
    }
}

/// The new state's links, kept or opened, and their I/O.
pub(super) struct NewLinks {
    pub(super) links: BTreeMap<u32, Arc<Link>>,
    io: BTreeMap<u32, Arc<dyn link::LinkIo>>,
    /// The I/O this transaction started (stopped if it fails).
    started: Started,
    /// A new link has a reader of its own (the workers take it up).
    new_reader: bool,
}

impl LinkSet {
    /// Acquire: the links' I/O (new links, and every link if its socket
    /// changed; TCP links when the TLS identity did). TCP links started
    /// here stop again if the transaction fails. First the running links'
    /// newest handshake timestamps are kept ([`LinkSet::save_handshakes`]):
    /// a link made anew starts from them, so the last initiation before
    /// the change cannot be replayed after it.
    pub(super) fn acquire(
        &mut self,
        next: &State,
        sock: &NewSockets,
        shared: &Arc<Shared>,
        at: &Positions,
    ) -> Result<NewLinks, Error> {
        if let Some(e) = self.save_handshakes() {
            tracing::warn!("--state-dir {e}");
        }
        let mut out = NewLinks {
            links: BTreeMap::new(),
            io: BTreeMap::new(),
            started: Started(Vec::new()),
            new_reader: false,
        };
        let link_pos = at.last(|c| matches!(c, Command::Link { .. }));
        for d in next.links.values() {
            let is_tcp = matches!(d.transport, Transport::Tcp { .. });
            let keep = self
                .running
                .get(&d.id)
                .filter(|l| l.def == *d && !sock.new_socket && !(is_tcp && sock.tls_changed));
            let l = match keep {
                Some(l) => {
                    if let Some(io) = self.io.get(&d.id) {
                        out.io.insert(d.id, io.clone());
                    }
                    l.clone()
                }
                None => {
                    let sec = vnet_engine::secure::for_link(
                        d,
                        self.identity.as_ref(),
                        self.timers.dated_by(wall_ns),
                    )
                    .map_err(|e| {
                        Error::new(link_pos, format!("a link vnetd can secure ({})", d.name), e.to_string())
                    })?
                    .map(|s| s.listed_in(shared.global.sessions.clone(), d.id));
                    let o = link::open(d, &sock.sockets, shared).map_err(|e| {
                        Error::new(link_pos, format!("a link vnetd can send on ({})", d.name), e.to_string())
                    })?;
                    out.started.0.push(o.clone());
                    out.new_reader |= o.reader().is_some();
                    out.io.insert(d.id, o.clone());
                    if let Some(sec) = &sec {
                        self.stamps.restore(sec);
                    }
                    Arc::new(Link::new(d.clone(), o.tx()).secured(sec))
                }
            };
            out.links.insert(d.id, l);
        }
        Ok(out)
    }

    /// Release: the new links replace the running ones; the acceptor of
    /// `sockets` hands peers' connections to the new streams; what was
    /// replaced or removed stops. Whether the links the workers read
    /// themselves (`direct`) changed.
    pub(super) fn release(&mut self, new: NewLinks, sockets: &Sockets, next: &State) -> bool {
        let NewLinks { links, io, mut started, new_reader } = new;
        started.keep();
        if let Some(acc) = &sockets.tcp {
            acc.set_links(io.iter().filter_map(|(id, l)| Some((next.links.get(id)?.rx_key(), l.stream()?))));
        }
        for (id, old) in &self.io {
            if !io.get(id).is_some_and(|n| Arc::ptr_eq(n, old)) {
                old.stop();
            }
        }
        let readers =
            |m: &BTreeMap<u32, Arc<dyn link::LinkIo>>| m.values().filter(|l| l.reader().is_some()).count();
        let lans_changed = new_reader || readers(&io) != readers(&self.io);
        self.io = io;
        self.running = links;
        lans_changed
    }

    /// Stops every link's I/O and forgets the links (a shutdown).
    pub(super) fn stop_all(&mut self) {
        self.running.clear();
        for l in std::mem::take(&mut self.io).into_values() {
            l.stop();
        }
    }

    /// Notes the secured links' handshake timestamps and writes them when
    /// one moved; an error, once.
    pub(super) fn save_handshakes(&mut self) -> Option<String> {
        self.stamps.note(self.running.values().filter_map(|l| l.secure.as_ref()));
        self.stamps.flush()
    }
}
