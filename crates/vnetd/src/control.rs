//! The control endpoint: a line protocol over a Unix socket (mode 0600, the
//! default) or TCP (loopback unless an address is given).
//!
//! The client sends one command per line. Every line gets a reply: zero or
//! more body lines, then exactly one closing line, `end ok` or
//! `end error <LINE>:<COLUMN>: expected ..., found ...`. That makes the
//! protocol easy to script and to fuzz (after WireGuard's `get=1`/`errno=0`).
//!
//! `begin` opens a transaction: the lines after it are numbered from 1 (so a
//! client that sends a file gets errors in that file's line numbers), each
//! is parsed and answered `end ok` (queued) or with its error, and `commit`
//! applies them all at once or, if any line failed to parse or the whole
//! fails to apply, none. `abort` drops the transaction.
//!
//! Everything a client can make the daemon hold is bounded: line length,
//! lines per transaction, transactions open at once, concurrent connections,
//! and time: a connection idle for [`Limits::idle`] is closed, and a reply
//! the client does not read within [`WRITE_TIMEOUT`] closes it too, so idle
//! clients cannot lock others out for longer than the idle timeout.
//!
//! Before a `tcp:` or `tls:` client has proved itself (its `auth TOKEN`
//! line, its TLS handshake with a certificate of the CA) it holds no
//! connection slot: it waits in a small pool of its own ([`PENDING_MAX`]
//! places, each for at most [`AUTH_DEADLINE`]), and a new connection that
//! finds the pool full takes the place of the oldest one waiting. So any
//! number of idle or half-open connections cannot keep an administrator
//! out: theirs is always the newest, and on loopback its proof takes
//! microseconds.
//!
//! The endpoint is root's power over the host: a Unix socket of mode 0600,
//! created only where nothing (or a stale socket) is, TCP on loopback, or
//! TLS 1.3 where the client must present a certificate of the endpoint's CA
//! (`tls:ADDR:PORT` with `vnetd --control-tls`). A plain TCP endpoint on
//! any other address refuses to start: the line protocol has no
//! authentication of its own.

use crate::daemon::Daemon;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vnet_control::{parse_line, Class, Command, Located, Reply, Section};

mod serve;
pub use serve::{check_tcp_endpoint, serve, serve_conn, Listener};

/// What a client that did not authenticate is told before the close.
const AUTH_REQUIRED: &str = "authentication required: the first line is `auth TOKEN`";

/// What a client over [`MAX_CONNECTIONS`] is told before the close.
const TOO_MANY: &str = "too many control connections";

/// Longest line accepted, in bytes.
pub const MAX_LINE: usize = 64 * 1024;
/// Most lines one transaction may hold.
pub const MAX_TXN_LINES: usize = 200_000;
/// Most control connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Most transactions open at once over all connections (each holds a copy
/// of the declared state until it commits or aborts).
pub const MAX_OPEN_TXNS: usize = 8;
/// A connection that sends nothing for this long is closed (by default).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// A reply not taken by the client within this long closes the connection.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections of a `tcp:` or `tls:` endpoint waiting to authenticate at
/// once; a new one takes the oldest one's place.
pub const PENDING_MAX: usize = 32;
/// Time a connection has to authenticate (its `auth` line, or its TLS
/// handshake).
pub const AUTH_DEADLINE: Duration = Duration::from_secs(3);

/// What one endpoint's connections share: the idle timeout and the count
/// of open transactions.
#[derive(Debug, Clone)]
pub struct Limits {
    pub idle: Duration,
    open_txns: Arc<AtomicUsize>,
    /// Who may use the endpoint.
    pub access: Arc<Access>,
    /// Cluster mode: where `ipam` requests go (the cluster session).
    pub ipam: Option<crate::ipam::Sender>,
}

/// Who may use a control endpoint (`docs/SECURITY.md`, "Control"): whoever
/// does has root's power over the host's network, so every endpoint checks.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// `unix:`: besides root and vnetd's own user, a client whose primary
    /// group is this one (`SO_PEERCRED`).
    pub group: Option<u32>,
    /// `tcp:`: the secret a client's first line presents (`auth TOKEN`); a
    /// `tcp:` endpoint is never served without one.
    pub token: Option<Arc<str>>,
    /// `tls:`: a DNS name the client's certificate must hold (besides
    /// chaining to the CA), so a peer host's link certificate is no admin's.
    pub client_name: Option<String>,
}

pub use vnet_client::endpoint::{load_token_file, TokenError, TOKEN_HEX};

/// The token of a `tcp:` endpoint from `path`, made there (mode 0600, 32
/// random bytes in hex) when the file does not exist; a file others may
/// read, or that is not a token, is refused.
pub fn load_token(path: &std::path::Path) -> Result<Arc<str>, TokenError> {
    if !path.exists() {
        use ring::rand::SecureRandom;
        let mut raw = [0u8; TOKEN_HEX / 2];
        ring::rand::SystemRandom::new()
            .fill(&mut raw)
            .map_err(|_| TokenError::NoRandomness { path: path.display().to_string() })?;
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        crate::keys::write_secret(path, &hex)?;
    }
    load_token_file(path).map(Into::into)
}

impl Limits {
    pub fn new(idle: Duration) -> Self {
        Limits { idle, open_txns: Arc::default(), access: Arc::default(), ipam: None }
    }

    /// These limits, with `ipam` requests sent to the cluster session.
    pub fn with_ipam(mut self, tx: crate::ipam::Sender) -> Self {
        self.ipam = Some(tx);
        self
    }

    /// These limits, with `access`.
    pub fn with_access(mut self, access: Access) -> Self {
        self.access = Arc::new(access);
        self
    }

    /// A slot for one more open transaction, if there is one.
    fn txn_slot(&self) -> Option<TxnSlot> {
        if self.open_txns.fetch_add(1, Relaxed) >= MAX_OPEN_TXNS {
            self.open_txns.fetch_sub(1, Relaxed);
            return None;
        }
        Some(TxnSlot(self.open_txns.clone()))
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::new(IDLE_TIMEOUT)
    }
}

/// An open transaction's place in [`MAX_OPEN_TXNS`], given back on drop
/// (commit, abort, or the connection closing).
#[derive(Debug)]
struct TxnSlot(Arc<AtomicUsize>);

impl Drop for TxnSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

pub use vnet_client::endpoint::{Endpoint, DEFAULT_ENDPOINT};

/// One connection's protocol state.
struct Session {
    section: Section,
    txn: Option<Txn>,
    limits: Limits,
}

impl Session {
    fn new(limits: Limits) -> Self {
        Session { section: Section::None, txn: None, limits }
    }
}

struct Txn {
    /// Lines received, saturating (past [`MAX_TXN_LINES`] nothing more is
    /// kept, and `commit` fails).
    lines: u32,
    _slot: TxnSlot,
    /// The state as the queued commands leave it, to check each line as it
    /// arrives; `commit` checks the whole again against the live state.
    preview: vnet_control::State,
    cmds: Vec<Located<Command>>,
    first_error: Option<vnet_control::Error>,
}

/// A line as the session parses it: its command, if any, or its error.
type Parsed = vnet_control::Result<Option<Located<Command>>>;

impl Session {
    /// Parses `line` once, with the session's section and, in a
    /// transaction, the transaction's next line number. A line past a
    /// transaction's [`MAX_TXN_LINES`] does not move the section (it is
    /// refused, only `commit` and `abort` still read).
    fn parse(&mut self, line: &str) -> Parsed {
        let Some(t) = &self.txn else { return parse_line(line, 1, &mut self.section) };
        let line_no = t.lines.saturating_add(1);
        if line_no as usize > MAX_TXN_LINES {
            let mut unmoved = self.section;
            return parse_line(line, line_no, &mut unmoved);
        }
        parse_line(line, line_no, &mut self.section)
    }
}

/// Answers one line, parsed once ([`Session::parse`]): a command that
/// waits ([`Class::Waiting`]: `ipam`, `pod-labels`) away from the
/// daemon's lock, on etcd or the Kubernetes API; any other under it
/// ([`handle_line`]).
async fn answer(daemon: &Mutex<Daemon>, s: &mut Session, line: &str) -> Reply {
    match s.parse(line) {
        Ok(Some(c)) if c.item.class() == Class::Waiting => match c.item {
            Command::Ipam(op) => ipam(s.limits.ipam.as_ref(), op).await,
            Command::PodLabels(pod) => crate::kube::pod_labels(&pod).await,
            _ => handle_line(daemon, s, line, Ok(Some(c))),
        },
        parsed => handle_line(daemon, s, line, parsed),
    }
}

/// Answers one line inside transaction `t` (`parsed`: the line as
/// [`Session::parse`] made it): the reply, and whether the transaction
/// ends with it (`commit`, `abort`).
fn txn_line(daemon: &Mutex<Daemon>, t: &mut Txn, line: &str, parsed: Parsed) -> (Reply, bool) {
    t.lines = t.lines.saturating_add(1);
    if t.lines as usize > MAX_TXN_LINES {
        // Only `commit` and `abort` still mean something: the rest is
        // refused, and so will the commit be.
        let end = line.trim();
        if end == "commit" || end == "abort" {
            return match end {
                "commit" => (
                    Reply::error(format!("transaction longer than {MAX_TXN_LINES} lines: nothing applied")),
                    true,
                ),
                _ => (Reply::ok(), true),
            };
        }
        return (Reply::error(format!("transaction longer than {MAX_TXN_LINES} lines")), false);
    }
    let ends = matches!(&parsed, Ok(Some(c)) if matches!(c.item, Command::Commit | Command::Abort));
    let reply = match parsed {
        Ok(None) => Reply::ok(),
        Ok(Some(c)) => match c.item {
            Command::Commit => {
                let (cmds, first_error) = (std::mem::take(&mut t.cmds), t.first_error.take());
                if let Some(e) = first_error {
                    return (Reply::error(&e), ends);
                }
                match lock(daemon).apply(&cmds) {
                    Ok(()) => Reply::ok(),
                    Err(e) => Reply::error(&e),
                }
            }
            Command::Abort => Reply::ok(),
            ref item if item.class() == Class::Change => {
                if t.first_error.is_none() {
                    if let Err(e) = t.preview.apply(&c) {
                        t.first_error = Some(e.clone());
                        return (Reply::error(&e), ends);
                    }
                }
                t.cmds.push(c);
                Reply::ok()
            }
            _ => {
                let e = vnet_control::Error::new(
                    c.pos,
                    "a declaration, `commit` or `abort` inside a transaction",
                    "a query",
                );
                t.first_error.get_or_insert(e.clone());
                Reply::error(&e)
            }
        },
        Err(e) => {
            t.first_error.get_or_insert(e.clone());
            Reply::error(&e)
        }
    };
    (reply, ends)
}

/// Answers one line that does not wait (`parsed`: the line as
/// [`Session::parse`] made it).
fn handle_line(daemon: &Mutex<Daemon>, s: &mut Session, line: &str, parsed: Parsed) -> Reply {
    if let Some(t) = s.txn.as_mut() {
        let (reply, ends) = txn_line(daemon, t, line, parsed);
        if ends {
            s.txn = None;
        }
        return reply;
    }
    match parsed {
        Ok(None) => Reply::ok(),
        Ok(Some(c)) => match c.item {
            Command::Begin => match s.limits.txn_slot() {
                Some(slot) => {
                    s.txn = Some(Txn {
                        lines: 0,
                        _slot: slot,
                        preview: lock(daemon).state().clone(),
                        cmds: Vec::new(),
                        first_error: None,
                    });
                    Reply::ok()
                }
                None => Reply::error(format!(
                    "{MAX_OPEN_TXNS} transactions are open already: try again when one ends"
                )),
            },
            Command::Commit | Command::Abort => Reply::error("no transaction is open"),
            Command::Show { what, json } => Reply::data(lock(daemon).show(what, json)),
            Command::Drops(q) => Reply::data(lock(daemon).show_drops(q)),
            Command::Trace(q) => match lock(daemon).trace(&q) {
                Ok(body) => Reply::data(body),
                Err(e) => Reply::error(&e),
            },
            Command::TraceHex(q) => match lock(daemon).trace_hex(&q) {
                Ok(body) => Reply::data(body),
                Err(e) => Reply::error(&e),
            },
            Command::Flows(q) => Reply::data(lock(daemon).show_flows(q)),
            Command::Announce(mac) => Reply::data(lock(daemon).announce(mac)),
            Command::Save => match lock(daemon).save() {
                Ok(body) => Reply::data(body),
                Err(e) => Reply::error(&e),
            },
            Command::Reload => match lock(daemon).reload() {
                Ok(body) => Reply::data(body),
                Err(e) => Reply::error(&e),
            },
            Command::Attach(_) | Command::Detach(_) | Command::Activate(_) => attach_line(daemon, &c),
            _ => {
                let mut d = lock(daemon);
                match d.apply(std::slice::from_ref(&c)) {
                    Ok(()) => {
                        // An attached interface's addresses are kept with it.
                        if matches!(c.item, Command::Neigh(_) | Command::DeleteNeigh(_)) {
                            if let Some(e) = d.save_attached() {
                                tracing::warn!("--state-dir {e}");
                            }
                        }
                        Reply::ok()
                    }
                    Err(e) => Reply::error(&e),
                }
            }
        },
        Err(e) => Reply::error(&e),
    }
}

/// How long an `ipam` request may wait for etcd.
const IPAM_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends `op` to the cluster session and waits for its answer.
async fn ipam(to: Option<&crate::ipam::Sender>, op: vnet_control::IpamOp) -> Reply {
    let Some(to) = to else {
        return Reply::error("ipam needs cluster mode (in static mode, use host-local)");
    };
    let (reply, answer) = tokio::sync::oneshot::channel();
    if to.try_send(crate::ipam::Request { op: op.into(), reply }).is_err() {
        return Reply::error("ipam: too many requests waiting; try again");
    }
    match tokio::time::timeout(IPAM_TIMEOUT, answer).await {
        Ok(Ok(Ok(reply))) => Reply::data(reply.body()),
        Ok(Ok(Err(e))) => Reply::error(format!("ipam: {e}")),
        Ok(Err(_)) => Reply::error("ipam: the cluster session dropped the request"),
        Err(_) => Reply::error(format!("ipam: etcd did not answer within {IPAM_TIMEOUT:?}")),
    }
}

/// `attach`, `detach` and `activate`.
fn attach_line(daemon: &Mutex<Daemon>, c: &Located<Command>) -> Reply {
    match &c.item {
        Command::Attach(decl) => {
            let name = match &**decl {
                Command::Interface { name, .. } => name.as_str(),
                _ => "",
            };
            attach(daemon, (name, true), |st| vnet_control::attach::attach(st, c.pos, decl))
        }
        Command::Detach(name) => {
            attach(daemon, (name, false), |st| vnet_control::attach::detach(st, c.pos, name))
        }
        Command::Activate(name) => match lock(daemon).activate(name, c.pos) {
            Ok(body) => Reply::data(body),
            Err(e) => Reply::error(&e),
        },
        _ => Reply::error("not an attach, detach or activate line"),
    }
}

/// `attach` and `detach`: the commands `expand` makes of them against the
/// running state, applied as one transaction under one lock (so no other
/// client's change comes between the look and the change). `name` is the
/// interface and whether it is there afterwards, which the daemon keeps
/// for its next start ([`Daemon::note_attached`]).
fn attach(
    daemon: &Mutex<Daemon>,
    (name, present): (&str, bool),
    expand: impl FnOnce(&vnet_control::State) -> Vec<vnet_control::Located<Command>>,
) -> Reply {
    let mut d = lock(daemon);
    let cmds = expand(d.state());
    if !cmds.is_empty() {
        if let Err(e) = d.apply(&cmds) {
            return Reply::error(&e);
        }
    }
    if let Some(e) = d.note_attached(name, present) {
        tracing::warn!("--state-dir {e}");
    }
    Reply::ok()
}

/// Locks the daemon, recovering from a poisoned lock (a panicked holder
/// cannot have left the state half-applied: apply swaps state at its end).
fn lock(d: &Mutex<Daemon>) -> std::sync::MutexGuard<'_, Daemon> {
    d.lock().unwrap_or_else(|p| p.into_inner())
}

/// A metrics address that is not one (the text found).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected PORT or ADDR:PORT, found `{0}`")]
pub struct NotAnAddress(pub String);

/// The metrics address: `PORT` (on 127.0.0.1) or `ADDR:PORT`.
pub fn metrics_addr(s: &str) -> Result<SocketAddr, NotAnAddress> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse().map_err(|_| NotAnAddress(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A line's reply as its body and closing line.
    fn handled(d: &Mutex<Daemon>, s: &mut Session, line: &str) -> (String, String) {
        let parsed = s.parse(line);
        let r = handle_line(d, s, line, parsed);
        (r.body.clone(), r.end_line())
    }

    fn session() -> Session {
        Session::new(Limits::default())
    }

    #[test]
    fn metrics_are_in_the_prometheus_format() {
        let d = Mutex::new(Daemon::default());
        let mut s = session();
        for l in ["listen udp 127.0.0.1:0", "link b udp 127.0.0.2", "route any any -> link b"] {
            assert_eq!(handled(&d, &mut s, l).1, "end ok", "{l}");
        }
        let text = lock(&d).metrics();
        assert!(
            text.contains("# TYPE vnet_link_tx_packets untyped\nvnet_link_tx_packets{link=\"b\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("vnet_route_packets{route=\"0\"} 0\n"), "{text}");
        assert!(text.contains("vnet_no_route 0\n"), "{text}");
        // The global counters, named where they are defined (the engine's
        // `Global` and `DispatchStats`), as scripts and docs know them.
        let (g, _) = handled(&d, &mut s, "show stats json");
        let g: serde_json::Value = serde_json::from_str(&g).unwrap();
        let keys: Vec<&str> = g["global"].as_object().unwrap().keys().map(|k| k.as_str()).collect();
        for k in [
            "no_route",
            "unknown_source",
            "malformed",
            "wrong_network",
            "unsupported_flags",
            "reasm_fragments",
            "reasm_completed",
            "reasm_timed_out",
            "reasm_evicted",
            "reasm_rejected",
            "route_cache_hits",
            "route_cache_misses",
            "route_table_generation",
            "rx_whole_batches",
            "rx_whole_pairs",
            "rx_gro_frames",
            "rx_gro_segments",
            "link_recv_calls",
            "link_recv_messages",
            "sw_segmented",
            "sw_checksummed",
            "offload_errors",
            "bad_offload_hdr",
            "spoofed_source_mac",
            "spoofed_source_ip",
            "offload_refused",
            "gso_fallbacks",
            "link_mode",
            "link_dispatch",
            "link_mode_switches",
            "link_wakeups",
            "link_polls",
            "link_contended",
            "link_polled_frames",
        ] {
            assert!(keys.contains(&k), "{k} not in {keys:?}");
        }
        assert_eq!(g["global"]["link_dispatch"], "notify");
        assert!(text.contains("vnet_route_cache_hits 0\n") && text.contains("vnet_link_polls 0\n"), "{text}");
        assert!(text.contains("vnet_spoofed_source_ip 0\n"), "the IP source guard's drops: {text}");
        assert!(text.lines().all(|l| l.starts_with('#') || l.split(' ').count() == 2), "{text}");
    }

    #[test]
    fn link_and_route_rows_are_their_views_field_for_field() {
        // `show links json`, the text table and the metrics are one view
        // (daemon/views.rs): its fields, named once, are these.
        let d = Mutex::new(Daemon::default());
        let mut s = session();
        for l in ["listen udp 127.0.0.1:0", "link b udp 127.0.0.2", "route any any -> link b"] {
            assert_eq!(handled(&d, &mut s, l).1, "end ok", "{l}");
        }
        let (j, _) = handled(&d, &mut s, "show stats json");
        let j: serde_json::Value = serde_json::from_str(&j).unwrap();
        let keys =
            |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>().join(" ");
        assert_eq!(
            keys(&j["links"][0]),
            "downs format id keepalives_received keepalives_sent kind last_rx_ms max_frame mtu name network \
             remote rx_bytes rx_drops rx_packets state too_big tx_bytes tx_drops tx_packets up"
        );
        assert_eq!(keys(&j["routes"][0]), "bytes drops dst from id packets src to");
        assert_eq!(
            (&j["links"][0]["remote"], &j["routes"][0]["to"]),
            (&"127.0.0.2:9000".into(), &"link b".into())
        );
        let metrics = lock(&d).metrics();
        for f in ["downs", "keepalives_sent", "max_frame", "mtu", "network", "rx_drops", "too_big", "up"] {
            assert!(metrics.contains(&format!("vnet_link_{f}{{link=\"b\"}} ")), "{f}: {metrics}");
        }
        let (text, _) = handled(&d, &mut s, "show links");
        assert!(
            text.starts_with("id  name  kind  state  remote") && text.contains("0   b     udp   quiet"),
            "{text}"
        );
    }

    #[test]
    fn tcp_control_only_on_loopback_and_metrics_on_loopback_by_default() {
        assert!(check_tcp_endpoint("127.0.0.1:7000".parse().unwrap()).is_ok());
        assert!(check_tcp_endpoint("[::1]:7000".parse().unwrap()).is_ok());
        let e = check_tcp_endpoint("0.0.0.0:7000".parse().unwrap()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(check_tcp_endpoint("10.1.2.3:7000".parse().unwrap()).is_err());
        assert_eq!(metrics_addr("9108"), Ok("127.0.0.1:9108".parse().unwrap()));
        assert_eq!(metrics_addr("10.0.0.1:9108"), Ok("10.0.0.1:9108".parse().unwrap()));
        assert!(metrics_addr("nine").is_err());
    }

    /// A line is parsed once, as its session stands ([`answer`]): a
    /// waiting command (`ipam`) inside a transaction is answered at once,
    /// away from the daemon, and is no line of the transaction (the next
    /// line is its line 1). The positive control: an `ipam` line that does
    /// not parse is the transaction's line, its error and its first.
    #[test]
    fn a_waiting_command_in_a_transaction_is_answered_at_once_and_is_no_line_of_it() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let d = Mutex::new(Daemon::default());
        let mut s = session();
        let mut say = |line: &str| rt.block_on(answer(&d, &mut s, line)).end_line();
        assert_eq!(say("begin"), "end ok");
        let e = say("ipam add 10.88.0.0/24 net/c/eth0");
        assert!(e.contains("ipam needs cluster mode"), "{e}");
        let e = say("ipam add nope net/c/eth0");
        assert!(e.starts_with("end error 1:10: expected a subnet"), "{e}");
        assert!(say("bogus").starts_with("end error 2:1"));
        let e = say("commit");
        assert!(e.starts_with("end error 1:10"), "{e}");
    }

    #[test]
    fn open_transactions_are_bounded_and_their_line_count_saturates() {
        let d = Mutex::new(Daemon::default());
        let limits = Limits::default();
        let mut open: Vec<Session> = (0..MAX_OPEN_TXNS).map(|_| Session::new(limits.clone())).collect();
        for s in open.iter_mut() {
            assert_eq!(handled(&d, s, "begin").1, "end ok");
        }
        let mut late = Session::new(limits.clone());
        assert!(handled(&d, &mut late, "begin").1.contains("transactions are open already"));
        // One ends (abort; a closed connection drops its session the same way): a slot frees.
        assert_eq!(handled(&d, &mut open[0], "abort").1, "end ok");
        drop(open.pop());
        assert_eq!(handled(&d, &mut late, "begin").1, "end ok");
        // A transaction at its line limit refuses more and fails its commit;
        // the counter saturates instead of wrapping back to small numbers.
        let t = late.txn.as_mut().unwrap();
        t.lines = u32::MAX - 1;
        for _ in 0..3 {
            assert!(handled(&d, &mut late, "route any any -> link b").1.contains("longer than"));
        }
        assert_eq!(late.txn.as_ref().unwrap().lines, u32::MAX);
        let e = handled(&d, &mut late, "commit").1;
        assert!(e.contains("nothing applied"), "{e}");
        assert!(late.txn.is_none());
        assert!(lock(&d).state().routes.is_empty());
    }

    #[test]
    fn an_announcement_goes_only_on_the_links_of_its_macs_network() {
        let d = Mutex::new(Daemon::default());
        let mut s = session();
        for l in [
            "listen udp 127.0.0.1:0",
            "link a udp 127.0.0.2:9000 format vnet network 7",
            "link b udp 127.0.0.3:9000 format vnet network 8",
            "link c udp 127.0.0.4:9000 format vnet",
        ] {
            assert_eq!(handled(&d, &mut s, l).1, "end ok", "{l}");
        }
        // A MAC no local interface has is network 0's: link c alone.
        let (body, end) = handled(&d, &mut s, "announce 52:54:00:00:00:09");
        assert_eq!((body.trim(), end.as_str()), ("announced 52:54:00:00:00:09 to 1 of 1 links", "end ok"));
        assert_eq!(lock(&d).announce_link_names("52:54:00:00:00:09".parse().unwrap()), vec!["c"]);
    }

    #[test]
    fn an_administrator_gets_in_at_once_while_a_thousand_unauthenticated_connections_sit() {
        // Issue 44, finding 7: before, each of these held one of the 64
        // slots for 30 s, and the administrator got a broken pipe.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let ep = Endpoint::Tcp(addr);
        let token: Arc<str> = "0123456789abcdef".repeat(4).into();
        let access = Access { token: Some(token.clone()), ..Access::default() };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let daemon = Arc::new(Mutex::new(Daemon::default()));
        rt.block_on(async {
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let limits = Limits::new(IDLE_TIMEOUT).with_access(access);
            let server = tokio::spawn(async move {
                serve(&ep, daemon, limits, None, async {
                    let _ = stop_rx.await;
                })
                .await
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            // 1000 connections that never authenticate, some with half a line.
            let mut idle = Vec::new();
            for i in 0..1000 {
                let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
                if i % 2 == 0 {
                    c.write_all(b"auth 0123").await.unwrap();
                }
                idle.push(c);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let t0 = std::time::Instant::now();
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(format!("auth {token}\nshow routes\n").as_bytes()).await.unwrap();
            let mut r = Vec::new();
            let mut buf = [0u8; 256];
            let both = |r: &[u8]| String::from_utf8_lossy(r).matches("end ok\n").count() == 2;
            while !both(&r) && t0.elapsed() < Duration::from_secs(5) {
                match tokio::time::timeout(Duration::from_secs(1), c.read(&mut buf)).await {
                    Ok(Ok(n)) if n > 0 => r.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
            let took = t0.elapsed();
            assert!(both(&r), "{:?}", String::from_utf8_lossy(&r));
            assert!(took < Duration::from_secs(1), "answered after {took:?}");
            // The oldest waiting ones were dropped to make room; a wrong
            // token is told so and closed.
            let mut first = String::new();
            let _ = tokio::time::timeout(Duration::from_secs(1), idle[0].read_to_string(&mut first)).await;
            let mut w = tokio::net::TcpStream::connect(addr).await.unwrap();
            w.write_all(b"auth nope\n").await.unwrap();
            let mut r = String::new();
            let _ = tokio::time::timeout(Duration::from_secs(2), w.read_to_string(&mut r)).await;
            assert!(r.contains("authentication required"), "{r:?}");
            let _ = stop_tx.send(());
            server.await.unwrap().unwrap();
        });
    }

    #[test]
    fn idle_connections_are_closed_so_new_clients_get_in() {
        // MAX_CONNECTIONS + 36 idle clients on a real socket with a short
        // idle timeout: a new client is served within about that timeout.
        let dir = std::env::temp_dir().join(format!("vnetd-ctl-idle-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.sock");
        let ep = Endpoint::Unix(path.clone());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let daemon = Arc::new(Mutex::new(Daemon::default()));
        let idle = Duration::from_millis(700);
        rt.block_on(async {
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let server = tokio::spawn(async move {
                serve(&ep, daemon, Limits::new(idle), None, async {
                    let _ = stop_rx.await;
                })
                .await
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut idle_clients = Vec::new();
            for _ in 0..MAX_CONNECTIONS + 36 {
                idle_clients.push(tokio::net::UnixStream::connect(&path).await.unwrap());
            }
            let t0 = std::time::Instant::now();
            let answered = loop {
                let mut c = tokio::net::UnixStream::connect(&path).await.unwrap();
                c.write_all(b"show routes\n").await.unwrap();
                let mut r = String::new();
                let _ = tokio::time::timeout(Duration::from_secs(3), c.read_to_string(&mut r)).await;
                if r.contains("end ok") {
                    break t0.elapsed();
                }
                assert!(t0.elapsed() < Duration::from_secs(10), "locked out: {r:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            assert!(answered < idle * 4, "served after {answered:?}");
            // The idle ones were told why they were closed.
            let mut r = String::new();
            let _ = idle_clients[0].read_to_string(&mut r).await;
            assert!(r.contains("idle"), "{r:?}");
            let _ = stop_tx.send(());
            server.await.unwrap().unwrap();
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn config_cannot_take_over_files_sockets_or_the_loopback_device() {
        let dir = std::env::temp_dir().join(format!("vnetd-ctl-paths-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let d = Mutex::new(Daemon::default());
        let mut s = session();
        // Loopback, any port: no privileges, nothing on the host's addresses.
        assert_eq!(handled(&d, &mut s, "listen udp 127.0.0.1:0").1, "end ok");
        // A regular file named as a vhost-user socket: refused, untouched.
        let file = dir.join("precious");
        std::fs::write(&file, b"data").unwrap();
        let e = handled(&d, &mut s, &format!("interface x vhost-user {}", file.display())).1;
        assert!(e.starts_with("end error 1:") && e.contains("a regular file"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"data");
        // A socket someone serves (here: as vnetd's control endpoint would).
        let sock = dir.join("control.sock");
        let _live = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let e = handled(&d, &mut s, &format!("interface x vhost-user {}", sock.display())).1;
        assert!(e.contains("in use"), "{e}");
        assert!(std::os::unix::net::UnixStream::connect(&sock).is_ok(), "the listener lost its socket");
        // The loopback device as a VM's netdev.
        let e = handled(&d, &mut s, "interface y netdev lo").1;
        assert!(e.contains("the loopback device"), "{e}");
        assert!(lock(&d).state().interfaces.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A CA (its PEM and issuer) for the TLS tests.
    fn make_ca(name: &str) -> (String, rcgen::Issuer<'static, rcgen::KeyPair>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
        let pem = p.self_signed(&key).unwrap().pem();
        (pem, rcgen::Issuer::new(p, key))
    }

    /// Writes a certificate for 127.0.0.1 signed by `issuer`, its key, and
    /// `trust` as the CA file; returns the files.
    fn identity(
        dir: &std::path::Path,
        name: &str,
        issuer: &rcgen::Issuer<'static, rcgen::KeyPair>,
        trust: &str,
    ) -> vnet_control::TlsFiles {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), format!("{name}.vnet")]).unwrap();
        p.extended_key_usages =
            vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth, rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = p.signed_by(&key, issuer).unwrap();
        let f = |ext: &str| dir.join(format!("{name}{ext}")).display().to_string();
        let files = vnet_control::TlsFiles { cert: f(".pem"), key: f(".key"), ca: f("-ca.pem") };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        crate::keys::write_secret(std::path::Path::new(&files.key), &key.serialize_pem()).unwrap();
        std::fs::write(&files.ca, trust).unwrap();
        files
    }

    #[test]
    fn a_tls_endpoint_serves_only_clients_with_a_certificate_of_its_ca() {
        use std::io::{Read, Write};
        let dir = std::env::temp_dir().join(format!("vnetd-ctl-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (ca_pem, ca) = make_ca("control CA");
        let (_, other) = make_ca("stranger CA");
        let server = crate::link::tcp::Tls::load(&identity(&dir, "server", &ca, &ca_pem)).unwrap();
        let good = crate::link::tcp::Tls::load(&identity(&dir, "good", &ca, &ca_pem)).unwrap();
        // Trusts the server, but its own certificate is another CA's.
        let stranger = crate::link::tcp::Tls::load(&identity(&dir, "stranger", &other, &ca_pem)).unwrap();
        // Of the CA, but not the administrator's name (a peer host's link certificate).
        let peer = crate::link::tcp::Tls::load(&identity(&dir, "peer", &ca, &ca_pem)).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let ask = move |cfg: Option<Arc<rustls::ClientConfig>>| -> String {
            let mut tcp = std::net::TcpStream::connect(addr).unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut out = Vec::new();
            match cfg {
                Some(cfg) => {
                    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
                    let conn = rustls::ClientConnection::new(cfg, name).unwrap();
                    let mut s = rustls::StreamOwned::new(conn, tcp);
                    if s.write_all(b"show routes\n").is_ok() {
                        let mut buf = [0u8; 4096];
                        while let Ok(n @ 1..) = s.read(&mut buf) {
                            out.extend_from_slice(&buf[..n]);
                            if out.ends_with(b"end ok\n") {
                                break;
                            }
                        }
                    }
                }
                None => {
                    let _ = tcp.write_all(b"show routes\n");
                    let _ = tcp.read_to_end(&mut out);
                }
            }
            String::from_utf8_lossy(&out).into_owned()
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let daemon = Arc::new(Mutex::new(Daemon::default()));
            let cfg = Some(Arc::new(server));
            let server = tokio::spawn(async move {
                let ep = Endpoint::Tls(addr);
                let access = Access { client_name: Some("good.vnet".into()), ..Access::default() };
                serve(&ep, daemon, Limits::default().with_access(access), cfg, async {
                    let _ = stop_rx.await;
                })
                .await
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            let (g, s, p) = (good.client_config(), stranger.client_config(), peer.client_config());
            let (good, strange, plain, peer) =
                tokio::task::spawn_blocking(move || (ask(Some(g)), ask(Some(s)), ask(None), ask(Some(p))))
                    .await
                    .unwrap();
            assert!(good.ends_with("end ok\n"), "{good:?}");
            assert!(peer.starts_with("end error the client certificate is not `good.vnet`'s"), "{peer:?}");
            assert!(!strange.contains("end"), "a client of another CA got: {strange:?}");
            assert!(!plain.contains("end"), "a client without TLS got: {plain:?}");
            let _ = stop_tx.send(());
            server.await.unwrap().unwrap();
        });
        // Without its certificates, a tls: endpoint does not start.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let e = rt
            .block_on(serve(
                &Endpoint::Tls(addr),
                Arc::new(Mutex::new(Daemon::default())),
                Limits::default(),
                None,
                async {},
            ))
            .unwrap_err()
            .to_string();
        assert!(e.to_string().contains("--control-tls"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_tcp_endpoint_serves_only_clients_with_its_token() {
        let dir = std::env::temp_dir().join(format!("vnetd-ctl-token-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        let token = load_token(&file).unwrap();
        assert_eq!(load_token(&file).unwrap(), token, "made once, then read");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let l = std::net::TcpListener::bind(addr).unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let ask = move |lines: &'static [&str], token: Option<String>| {
            let mut out = Vec::new();
            for _ in 0..50 {
                if let Ok(mut tcp) = std::net::TcpStream::connect(addr) {
                    use std::io::{Read, Write};
                    if let Some(t) = &token {
                        let _ = tcp.write_all(format!("auth {t}\n").as_bytes());
                    }
                    for l in lines {
                        let _ = tcp.write_all(format!("{l}\n").as_bytes());
                    }
                    let _ = tcp.shutdown(std::net::Shutdown::Write);
                    let _ = tcp.read_to_end(&mut out);
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            String::from_utf8_lossy(&out).into_owned()
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let daemon = Arc::new(Mutex::new(Daemon::default()));
        // Without a token, a tcp: endpoint does not start.
        let e = rt.block_on(serve(&Endpoint::Tcp(addr), daemon.clone(), Limits::default(), None, async {}));
        assert!(e.unwrap_err().to_string().contains("--control-token"));
        rt.block_on(async {
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let access = Access { token: Some(token.clone()), ..Access::default() };
            let d = daemon.clone();
            let server = tokio::spawn(async move {
                serve(&Endpoint::Tcp(addr), d, Limits::default().with_access(access), None, async {
                    let _ = stop_rx.await;
                })
                .await
            });
            let t = token.to_string();
            let (none, wrong, good) = tokio::task::spawn_blocking(move || {
                (
                    ask(&["link x udp 10.9.9.9"], None),
                    ask(&["link x udp 10.9.9.9"], Some("0".repeat(TOKEN_HEX))),
                    ask(&["show links"], Some(t)),
                )
            })
            .await
            .unwrap();
            assert!(
                none.starts_with("end error authentication required") && !none.contains("end ok"),
                "{none:?}"
            );
            assert!(wrong.starts_with("end error authentication required"), "{wrong:?}");
            assert!(good.starts_with("end ok\n") && good.ends_with("end ok\n"), "{good:?}");
            assert!(lock(&daemon).state().links.is_empty(), "nothing changed without the token");
            let _ = stop_tx.send(());
            server.await.unwrap().unwrap();
        });
        // A token file others may read is refused.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(load_token(&file).unwrap_err().to_string().contains("chmod 600"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unix_clients_are_root_vnetds_user_or_the_control_group() {
        let a = Access { group: Some(4242), ..Access::default() };
        assert!(a.allows(0, 0) && a.allows(crate::sys::euid(), 9) && a.allows(1000, 4242));
        assert!(!a.allows(65534, 65534) || crate::sys::euid() == 65534);
        assert!(!Access::default().allows(65534, 4242) || crate::sys::euid() == 65534);
    }

    #[test]
    fn endpoints() {
        assert_eq!("unix:/run/x.sock".parse(), Ok(Endpoint::Unix("/run/x.sock".into())));
        assert_eq!("tcp:7000".parse(), Ok(Endpoint::Tcp("127.0.0.1:7000".parse().unwrap())));
        assert_eq!("tcp:[::1]:7000".parse(), Ok(Endpoint::Tcp("[::1]:7000".parse().unwrap())));
        assert!("udp:1".parse::<Endpoint>().is_err());
        assert!("unix:".parse::<Endpoint>().is_err());
    }

    #[test]
    fn transaction_is_all_or_nothing() {
        let d = Mutex::new(Daemon::default());
        let mut s = session();
        // Use a loopback listen address with port 0 so no privileges are needed.
        for l in ["begin", "listen udp 127.0.0.1:0", "link b udp 127.0.0.2", "route any any -> link b"] {
            assert_eq!(handled(&d, &mut s, l).1, "end ok", "{l}");
        }
        assert_eq!(handled(&d, &mut s, "commit").1, "end ok");
        assert_eq!(lock(&d).state().routes.len(), 1);

        for l in ["begin", "route any ff:ff:ff:ff:ff:ff -> link b"] {
            assert_eq!(handled(&d, &mut s, l).1, "end ok");
        }
        let e = handled(&d, &mut s, "route any any -> link nowhere").1;
        assert_eq!(e, "end error 2:23: expected a declared link (name, remote IP or index), found `nowhere`, which is not one");
        let e = handled(&d, &mut s, "commit").1;
        assert!(e.starts_with("end error 2:23:"), "{e}");
        assert_eq!(lock(&d).state().routes.len(), 1, "nothing applied");

        assert_eq!(handled(&d, &mut s, "bogus").1.split(':').next(), Some("end error 1"));
        let (body, end) = handled(&d, &mut s, "show routes");
        assert_eq!(end, "end ok");
        assert!(body.contains("link b"), "{body}");
        let (body, _) = handled(&d, &mut s, "show stats json");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(v["global"]["no_route"].is_u64());
    }

    proptest::proptest! {
        /// Whatever a client sends, the session answers with one closing line
        /// and the daemon stays usable.
        #[test]
        fn any_line_gets_one_closing_reply(lines in proptest::collection::vec(
            proptest::prop_oneof![
                "\\PC{0,60}",
                proptest::strategy::Strategy::prop_map(proptest::sample::select(vec![
                    "begin", "commit", "abort", "[routes]", "[links]", "del 0", "show stats",
                    "listen udp 127.0.0.1:0", "link b udp 127.0.0.2", "route any any -> link b",
                    "delete link b", "delete route 0", "add 127.0.0.3 9000 udp",
                ]), String::from),
            ],
            0..40,
        )) {
            let d = Mutex::new(Daemon::default());
            let mut s = session();
            for l in &lines {
                let (body, end) = handled(&d, &mut s, l);
                proptest::prop_assert!(end == "end ok" || end.starts_with("end error "), "{l:?} -> {end}");
                proptest::prop_assert!(!body.lines().any(|b| b.starts_with("end ")));
            }
            let (_, end) = handled(&d, &mut session(), "show routes json");
            proptest::prop_assert_eq!(end, "end ok");
        }
    }
}
