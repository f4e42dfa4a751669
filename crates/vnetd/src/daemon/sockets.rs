//! The link sockets this host listens on (`listen`, `listen vxlan`,
//! `listen tcp`) and its links' TLS identity, as a resource of the daemon:
//! acquired when the new state's addresses differ from the bound ones,
//! released (replaced) once the new plane is published.

use super::positions::Positions;
use crate::link::{self, Sockets};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use vnet_control::{Command, Error, State, Transport};

/// The bound link sockets, how the worker that reads them waits, and how
/// many sockets each listening group gets (`vnetd --link-readers`).
pub(super) struct LinkSockets {
    pub(super) bound: Sockets,
    pub(super) mode: vnet_control::Mode,
    pub(super) readers: usize,
}

impl Default for LinkSockets {
    fn default() -> Self {
        LinkSockets { bound: Sockets::default(), mode: vnet_control::Mode::default(), readers: 1 }
    }
}

/// The link sockets and TLS identity the new state needs, and what changed.
pub(super) struct NewSockets {
    pub(super) sockets: Sockets,
    /// A UDP or VXLAN socket is new: every link is opened again on it.
    pub(super) new_socket: bool,
    /// The TLS identity changed: TCP links are opened again.
    pub(super) tls_changed: bool,
}

/// Where VXLAN datagrams are received: `listen vxlan`, or, when a VXLAN link
/// exists without one, IANA's port on the `listen` address.
fn vxlan_addr(s: &State) -> Option<SocketAddr> {
    let wanted = s.links.values().any(|l| matches!(l.transport, Transport::Vxlan { .. }));
    s.listen_vxlan.or_else(|| wanted.then(|| SocketAddr::new(s.listen.ip(), vnet_wire::vxlan::IANA_PORT)))
}

/// Where TCP links are accepted: `listen tcp`, or, when a TCP link exists
/// without one, the `listen` address (TCP beside UDP, port 9000 by default).
fn tcp_addr(s: &State) -> Option<SocketAddr> {
    let wanted = s.links.values().any(|l| matches!(l.transport, Transport::Tcp { .. }));
    s.listen_tcp.or_else(|| wanted.then_some(s.listen))
}

impl LinkSockets {
    /// Acquire: the link sockets whose address changed (or that are new),
    /// and the TLS identity if the `tls` line changed.
    pub(super) fn acquire(
        &self,
        old: &State,
        next: &State,
        global: &Arc<vnet_engine::Global>,
        at: &Positions,
    ) -> Result<NewSockets, Error> {
        let mut sockets = self.bound.clone();
        let mut new_socket = false;
        let bind_error = |pick: fn(&Command) -> bool, what: String, e: std::io::Error| {
            Error::new(at.last(pick), what, format!("error: {e}"))
        };
        if sockets.udp.as_ref().map(|b| b.addr) != Some(next.listen) {
            let b = link::udp::bind_udp(next.listen, self.readers).map_err(|e| {
                bind_error(
                    |c| matches!(c, Command::Listen { .. }),
                    format!("an address vnetd can bind ({})", next.listen),
                    e,
                )
            })?;
            sockets.udp = Some(b);
            new_socket = true;
        }
        let want_vxlan = vxlan_addr(next);
        if sockets.vxlan.as_ref().map(|b| b.addr) != want_vxlan {
            sockets.vxlan = match want_vxlan {
                Some(a) => Some(link::udp::bind_vxlan(a, self.readers).map_err(|e| {
                    bind_error(
                        |c| matches!(c, Command::ListenVxlan(_) | Command::Link { .. }),
                        format!("an address vnetd can bind for VXLAN ({a})"),
                        e,
                    )
                })?),
                None => None,
            };
            new_socket = true;
        }
        let want_tcp = tcp_addr(next);
        if sockets.tcp.as_ref().map(|a| a.addr) != want_tcp {
            sockets.tcp = match want_tcp {
                Some(a) => Some(Arc::new(link::tcp::Acceptor::bind(a, global.clone()).map_err(|e| {
                    bind_error(
                        |c| matches!(c, Command::ListenTcp(_) | Command::Link { .. }),
                        format!("an address vnetd can listen on for TCP links ({a})"),
                        e,
                    )
                })?)),
                None => None,
            };
        }
        let mut tls_changed = false;
        if next.tls != old.tls || (sockets.tls.is_none() && next.tls.is_some()) {
            sockets.tls = match &next.tls {
                // Why a file did not load goes to vnetd's log only: a
                // control client is not told whether a path it may not read
                // exists (the issue-27 review's `tls cert` oracle).
                Some(files) => Some(Arc::new(link::tcp::Tls::load(files).map_err(|e| {
                    tracing::warn!("tls: {e}");
                    Error::new(
                        at.last(|c| matches!(c, Command::Tls(_))),
                        "a readable certificate chain, private key (owner only) and CA (PEM)",
                        "error: the files did not load as such; vnetd's log says why",
                    )
                })?)),
                None => None,
            };
            tls_changed = true;
        }
        Ok(NewSockets { sockets, new_socket, tls_changed })
    }

    /// Release: the new sockets replace the old ones (closed as the last
    /// link and worker lets them go), and the workers wait as `mode` says.
    pub(super) fn release(&mut self, sockets: Sockets, mode: vnet_control::Mode) {
        self.bound = sockets;
        self.mode = mode;
    }

    /// The VXLAN socket's address, if one is bound.
    pub(super) fn vxlan(&self) -> Option<SocketAddr> {
        self.bound.vxlan.as_ref().map(|b| b.addr)
    }

    /// Copies of the link sockets for a hand-over, named for the next
    /// vnetd ([`crate::handover`]).
    pub(super) fn hand_over_fds(&self, out: &mut Vec<(String, OwnedFd)>) {
        for (kind, b) in [("udp", &self.bound.udp), ("vxlan", &self.bound.vxlan)] {
            let Some(b) = b else { continue };
            for (k, r) in b.readers.iter().enumerate() {
                let name = link::udp::reader_name(kind, b.addr, k);
                out.extend(name.zip(r.sock.try_clone().ok().map(Into::into)));
            }
        }
        if let Some(a) = &self.bound.tcp {
            let name = crate::handover::name(&["tcp", &a.addr.to_string()]);
            out.extend(name.zip(a.listener().ok()));
        }
    }
}
