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
//! lines per transaction, and concurrent connections.

use crate::daemon::Daemon;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use vnet_control::{parse_line, Command, Located, Section};

/// Longest line accepted, in bytes.
pub const MAX_LINE: usize = 64 * 1024;
/// Most lines one transaction may hold.
pub const MAX_TXN_LINES: usize = 200_000;
/// Most control connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// Where the control endpoint listens (or a client connects).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl std::str::FromStr for Endpoint {
    type Err = String;

    /// `unix:PATH`, `tcp:ADDR:PORT`, or `tcp:PORT` (on 127.0.0.1).
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("expected a path after `unix:`".into());
            }
            return Ok(Endpoint::Unix(p.into()));
        }
        if let Some(a) = s.strip_prefix("tcp:") {
            if let Ok(port) = a.parse::<u16>() {
                return Ok(Endpoint::Tcp(SocketAddr::from(([127, 0, 0, 1], port))));
            }
            return a
                .parse()
                .map(Endpoint::Tcp)
                .map_err(|_| format!("expected tcp:ADDR:PORT or tcp:PORT, found `{s}`"));
        }
        Err(format!("expected unix:PATH or tcp:ADDR:PORT, found `{s}`"))
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// The default control endpoint.
pub const DEFAULT_ENDPOINT: &str = "unix:/run/vnetd.sock";

/// One connection's protocol state.
struct Session {
    section: Section,
    txn: Option<Txn>,
}

struct Txn {
    lines: u32,
    /// The state as the queued commands leave it, to check each line as it
    /// arrives; `commit` checks the whole again against the live state.
    preview: vnet_control::State,
    cmds: Vec<Located<Command>>,
    first_error: Option<vnet_control::Error>,
}

/// Answers one line. Returns the reply body and the closing line.
fn handle_line(daemon: &Mutex<Daemon>, s: &mut Session, line: &str) -> (String, String) {
    let ok = || "end ok".to_string();
    let err = |e: &dyn std::fmt::Display| format!("end error {e}");
    if let Some(t) = s.txn.as_mut() {
        t.lines += 1;
        if t.lines as usize > MAX_TXN_LINES {
            return (String::new(), format!("end error transaction longer than {MAX_TXN_LINES} lines"));
        }
        let parsed = parse_line(line, t.lines, &mut s.section);
        return match parsed {
            Ok(None) => (String::new(), ok()),
            Ok(Some(c)) => match c.item {
                Command::Commit => {
                    let (cmds, first_error) = (std::mem::take(&mut t.cmds), t.first_error.take());
                    s.txn = None;
                    if let Some(e) = first_error {
                        return (String::new(), err(&e));
                    }
                    match lock(daemon).apply(&cmds) {
                        Ok(()) => (String::new(), ok()),
                        Err(e) => (String::new(), err(&e)),
                    }
                }
                Command::Abort => {
                    s.txn = None;
                    (String::new(), ok())
                }
                ref item if item.is_change() => {
                    if t.first_error.is_none() {
                        if let Err(e) = t.preview.apply(&c) {
                            t.first_error = Some(e.clone());
                            return (String::new(), err(&e));
                        }
                    }
                    t.cmds.push(c);
                    (String::new(), ok())
                }
                _ => {
                    let e = vnet_control::Error::new(
                        c.pos,
                        "a declaration, `commit` or `abort` inside a transaction",
                        "a query",
                    );
                    t.first_error.get_or_insert(e.clone());
                    (String::new(), err(&e))
                }
            },
            Err(e) => {
                t.first_error.get_or_insert(e.clone());
                (String::new(), err(&e))
            }
        };
    }
    match parse_line(line, 1, &mut s.section) {
        Ok(None) => (String::new(), ok()),
        Ok(Some(c)) => match c.item {
            Command::Begin => {
                s.txn = Some(Txn {
                    lines: 0,
                    preview: lock(daemon).state().clone(),
                    cmds: Vec::new(),
                    first_error: None,
                });
                (String::new(), ok())
            }
            Command::Commit | Command::Abort => (String::new(), "end error no transaction is open".into()),
            Command::Show { what, json } => (lock(daemon).show(what, json), ok()),
            Command::Announce(mac) => (lock(daemon).announce(mac), ok()),
            _ => match lock(daemon).apply(std::slice::from_ref(&c)) {
                Ok(()) => (String::new(), ok()),
                Err(e) => (String::new(), err(&e)),
            },
        },
        Err(e) => (String::new(), err(&e)),
    }
}

/// Locks the daemon, recovering from a poisoned lock (a panicked holder
/// cannot have left the state half-applied: apply swaps state at its end).
fn lock(d: &Mutex<Daemon>) -> std::sync::MutexGuard<'_, Daemon> {
    d.lock().unwrap_or_else(|p| p.into_inner())
}

/// Serves one connection until it closes.
pub async fn serve_conn<S: AsyncRead + AsyncWrite + Unpin>(daemon: Arc<Mutex<Daemon>>, stream: S) {
    let (r, mut w) = tokio::io::split(stream);
    let mut r = BufReader::new(r);
    let mut s = Session { section: Section::None, txn: None };
    let mut buf = Vec::with_capacity(256);
    loop {
        buf.clear();
        let n = match (&mut r).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut buf).await {
            Ok(n) => n,
            Err(_) => return,
        };
        if n == 0 {
            return;
        }
        if buf.last() != Some(&b'\n') && buf.len() > MAX_LINE {
            let _ = w.write_all(format!("end error line longer than {MAX_LINE} bytes\n").as_bytes()).await;
            return;
        }
        let reply = match std::str::from_utf8(&buf) {
            Ok(line) => {
                let line = line.trim_end_matches(['\n', '\r']);
                let (body, end) = handle_line(&daemon, &mut s, line);
                let mut out = body;
                if !out.is_empty() && !out.ends_with('\n') {
                    out.push('\n');
                }
                out.push_str(&end);
                out.push('\n');
                out
            }
            Err(_) => "end error expected UTF-8 text\n".to_string(),
        };
        if w.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Accepts connections on `ep` until `shutdown` completes.
pub async fn serve(
    ep: &Endpoint,
    daemon: Arc<Mutex<Daemon>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    match ep {
        Endpoint::Unix(path) => {
            if path.exists() && std::os::unix::net::UnixStream::connect(path).is_err() {
                let _ = std::fs::remove_file(path); // stale socket of a dead vnetd
            }
            let l = tokio::net::UnixListener::bind(path)?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            loop {
                tokio::select! {
                    _ = &mut shutdown => break,
                    a = l.accept() => if let Ok((c, _)) = a { spawn_conn(&slots, &daemon, c) },
                }
            }
            let _ = std::fs::remove_file(path);
        }
        Endpoint::Tcp(addr) => {
            if !addr.ip().is_loopback() {
                tracing::warn!(
                    "control port on non-loopback address {addr}: anyone who reaches it controls vnetd"
                );
            }
            let l = tokio::net::TcpListener::bind(addr).await?;
            loop {
                tokio::select! {
                    _ = &mut shutdown => break,
                    a = l.accept() => if let Ok((c, _)) = a { spawn_conn(&slots, &daemon, c) },
                }
            }
        }
    }
    Ok(())
}

fn spawn_conn<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    slots: &Arc<tokio::sync::Semaphore>,
    daemon: &Arc<Mutex<Daemon>>,
    c: S,
) {
    match slots.clone().try_acquire_owned() {
        Ok(permit) => {
            let d = daemon.clone();
            tokio::spawn(async move {
                serve_conn(d, c).await;
                drop(permit);
            });
        }
        Err(_) => {
            tokio::spawn(async move {
                let mut c = c;
                let _ = c.write_all(b"end error too many control connections\n").await;
            });
        }
    }
}

/// Most bytes of an HTTP request the metrics endpoint reads.
const MAX_HTTP_REQUEST: usize = 8 * 1024;

/// Serves `GET /metrics` (the Prometheus text format of
/// [`Daemon::metrics`]) on `addr`, for scrapers: HTTP/1.0, one response per
/// connection, the request cut at 8 KB and 2 s, at most
/// [`MAX_CONNECTIONS`] at once. Runs until the task is dropped.
pub async fn serve_metrics(addr: SocketAddr, daemon: Arc<Mutex<Daemon>>) -> std::io::Result<()> {
    let l = tokio::net::TcpListener::bind(addr).await?;
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((mut c, _)) = l.accept().await else { continue };
        let Ok(permit) = slots.clone().try_acquire_owned() else { continue };
        let daemon = daemon.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut req = Vec::with_capacity(512);
            let mut buf = [0u8; 1024];
            let read = async {
                while req.len() < MAX_HTTP_REQUEST && !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
            };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), read).await;
            let (status, body) = if req.starts_with(b"GET /metrics ") || req.starts_with(b"GET / ") {
                let d = daemon.lock().unwrap_or_else(|p| p.into_inner());
                ("200 OK", d.metrics())
            } else {
                ("404 Not Found", "only GET /metrics is served here\n".to_string())
            };
            let head = format!(
                "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = c.write_all(head.as_bytes()).await;
            let _ = c.write_all(body.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> Session {
        Session { section: Section::None, txn: None }
    }

    #[test]
    fn metrics_are_served_over_http_in_the_prometheus_format() {
        let d = Mutex::new(Daemon::new());
        let mut s = session();
        for l in ["listen udp 127.0.0.1:0", "link b udp 127.0.0.2", "route any any -> link b"] {
            assert_eq!(handle_line(&d, &mut s, l).1, "end ok", "{l}");
        }
        let text = lock(&d).metrics();
        assert!(
            text.contains("# TYPE vnet_link_tx_packets untyped\nvnet_link_tx_packets{link=\"b\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("vnet_route_packets{route=\"0\"} 0\n"), "{text}");
        assert!(text.contains("vnet_no_route 0\n"), "{text}");
        assert!(text.lines().all(|l| l.starts_with('#') || l.split(' ').count() == 2), "{text}");
        // The HTTP endpoint answers GET /metrics and nothing else.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let daemon = Arc::new(Mutex::new(std::mem::take(&mut *lock(&d))));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let get = move |path: &str| {
            use std::io::{Read, Write};
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            write!(c, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
            let mut r = String::new();
            c.read_to_string(&mut r).unwrap();
            r
        };
        rt.block_on(async {
            let server = tokio::spawn(serve_metrics(addr, daemon));
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let (ok, missing) =
                tokio::task::spawn_blocking(move || (get("/metrics"), get("/other"))).await.unwrap();
            assert!(
                ok.starts_with("HTTP/1.0 200 OK\r\n") && ok.contains("vnet_link_rx_packets{link=\"b\"} 0"),
                "{ok}"
            );
            assert!(missing.starts_with("HTTP/1.0 404"), "{missing}");
            server.abort();
        });
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
        let d = Mutex::new(Daemon::new());
        let mut s = session();
        // Use a loopback listen address with port 0 so no privileges are needed.
        for l in ["begin", "listen udp 127.0.0.1:0", "link b udp 127.0.0.2", "route any any -> link b"] {
            assert_eq!(handle_line(&d, &mut s, l).1, "end ok", "{l}");
        }
        assert_eq!(handle_line(&d, &mut s, "commit").1, "end ok");
        assert_eq!(lock(&d).state().routes.len(), 1);

        for l in ["begin", "route any ff:ff:ff:ff:ff:ff -> link b"] {
            assert_eq!(handle_line(&d, &mut s, l).1, "end ok");
        }
        let e = handle_line(&d, &mut s, "route any any -> link nowhere").1;
        assert_eq!(e, "end error 2:23: expected a declared link (name, remote IP or index), found `nowhere`, which is not one");
        let e = handle_line(&d, &mut s, "commit").1;
        assert!(e.starts_with("end error 2:23:"), "{e}");
        assert_eq!(lock(&d).state().routes.len(), 1, "nothing applied");

        assert_eq!(handle_line(&d, &mut s, "bogus").1.split(':').next(), Some("end error 1"));
        let (body, end) = handle_line(&d, &mut s, "show routes");
        assert_eq!(end, "end ok");
        assert!(body.contains("link b"), "{body}");
        let (body, _) = handle_line(&d, &mut s, "show stats json");
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
            let d = Mutex::new(Daemon::new());
            let mut s = session();
            for l in &lines {
                let (body, end) = handle_line(&d, &mut s, l);
                proptest::prop_assert!(end == "end ok" || end.starts_with("end error "), "{l:?} -> {end}");
                proptest::prop_assert!(!body.lines().any(|b| b.starts_with("end ")));
            }
            let (_, end) = handle_line(&d, &mut session(), "show routes json");
            proptest::prop_assert_eq!(end, "end ok");
        }
    }
}
