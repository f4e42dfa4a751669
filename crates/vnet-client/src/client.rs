//! A blocking client of vnetd's control protocol (`docs/control.md`), used
//! by `vnetctl` and the lab.

use crate::endpoint::Endpoint;
use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

trait Stream: io::Read + io::Write {}
impl<T: io::Read + io::Write> Stream for T {}

/// The client's TLS identity for `tls:` endpoints (set once, by
/// [`set_tls`]).
static TLS: std::sync::OnceLock<std::sync::Arc<rustls::ClientConfig>> = std::sync::OnceLock::new();

/// Loads the certificate, key and CA this process presents to and checks
/// `tls:` control endpoints with.
pub fn set_tls(files: &vnet_control::TlsFiles) -> Result<(), crate::tls::TlsError> {
    let t = crate::tls::Tls::load(files)?;
    let _ = TLS.set(t.client_config());
    Ok(())
}

/// The token this process presents to `tcp:` endpoints (set once, by [`set_token`]).
static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Reads the token this process presents to `tcp:` control endpoints.
pub fn set_token(path: &std::path::Path) -> Result<(), crate::endpoint::TokenError> {
    let t = crate::endpoint::load_token_file(path)?;
    let _ = TOKEN.set(t);
    Ok(())
}

/// A connection to a vnetd control endpoint.
pub struct Client {
    r: BufReader<Box<dyn Stream>>,
}

/// The answer to one line, and what vnetd said when it refused one: the
/// control protocol's own types, encoded and decoded in one place
/// (`vnet_control::reply`).
pub use vnet_control::reply::{Refused, Reply};

impl Client {
    pub fn connect(ep: &Endpoint) -> io::Result<Client> {
        let timeout = Some(Duration::from_secs(30));
        let s: Box<dyn Stream> = match ep {
            Endpoint::Unix(p) => {
                let s = UnixStream::connect(p)?;
                s.set_read_timeout(timeout)?;
                Box::new(s)
            }
            Endpoint::Tcp(a) => {
                // The token is root's power over vnetd: never sent off this
                // host, where anyone on the path could read it.
                if !a.ip().is_loopback() {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!("refusing to send the control token to {a}, which is not loopback: use a tls: endpoint"),
                    ));
                }
                let s = TcpStream::connect(a)?;
                s.set_read_timeout(timeout)?;
                let mut c = Client { r: BufReader::new(Box::new(s)) };
                let token = TOKEN.get().ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "a tcp: endpoint needs its token (--token FILE)",
                    )
                })?;
                if let Err(e) = c.request(&format!("auth {token}"))?.result {
                    return Err(io::Error::new(io::ErrorKind::PermissionDenied, e));
                }
                return Ok(c);
            }
            Endpoint::Tls(a) => {
                let cfg = TLS.get().cloned().ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "a tls: endpoint needs --tls CERT,KEY,CA")
                })?;
                let name = rustls::pki_types::ServerName::IpAddress(a.ip().into());
                let conn = rustls::ClientConnection::new(cfg, name).map_err(io::Error::other)?;
                let s = TcpStream::connect(a)?;
                s.set_read_timeout(timeout)?;
                Box::new(rustls::StreamOwned::new(conn, s))
            }
        };
        Ok(Client { r: BufReader::new(s) })
    }

    /// Sends a typed request and reads its reply: what every program that
    /// acts on values it did not choose uses (`vnet_control::request`).
    pub fn send(&mut self, r: &vnet_control::request::Request) -> io::Result<Reply> {
        self.request(&r.line())
    }

    /// [`Client::send`], its reply's body read to at most `max` bytes: for
    /// a reply from a host this one does not run (a trace's far host). A
    /// longer reply is an error, and the connection is of no further use.
    pub fn send_bounded(&mut self, r: &vnet_control::request::Request, max: usize) -> io::Result<Reply> {
        self.exchange(&r.line(), max)
    }

    /// Sends one raw line, as a person typed it, and reads its reply. A
    /// line with a control character (a newline among them) is refused
    /// here, before anything is sent: it could hold a second command.
    pub fn request(&mut self, line: &str) -> io::Result<Reply> {
        self.exchange(line, usize::MAX)
    }

    /// Writes `line` (refused if it holds a control character) and its
    /// newline, and reads the reply, its body at most `max` bytes.
    fn exchange(&mut self, line: &str, max: usize) -> io::Result<Reply> {
        if let Some(c) = line.chars().find(|c| !vnet_control::lex::allowed(*c)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a control line holds `{}`: one line, without control characters, is one request",
                    c.escape_debug()
                ),
            ));
        }
        let w = self.r.get_mut();
        let sent = w.write_all(line.as_bytes()).and_then(|()| w.write_all(b"\n")).and_then(|()| w.flush());
        match sent {
            // vnetd refused the connection and closed it: its reason is still to be read.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => self.read_reply(max).map_err(|_| e),
            Err(e) => Err(e),
            Ok(()) => self.read_reply(max),
        }
    }

    /// Reads a reply, its body (and each line) at most `max` bytes.
    fn read_reply(&mut self, max: usize) -> io::Result<Reply> {
        use std::io::Read as _;
        let mut body = String::new();
        loop {
            let mut l = String::new();
            // The closing line too: room for `err` and a message.
            let room = max.saturating_sub(body.len()).saturating_add(1024);
            let n = (&mut self.r).take(room as u64).read_line(&mut l)?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "vnetd closed the connection"));
            }
            if let Some(result) = Reply::closing(l.trim_end()) {
                return Ok(Reply { body, result });
            }
            if body.len() + l.len() > max || (n == room && !l.ends_with('\n')) {
                let e = format!("the reply is longer than {max} bytes: not read further");
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
            body.push_str(&l);
        }
    }

    /// Sends `reqs` as one transaction (`begin`, each, `commit`): all of
    /// them apply or none. On error returns the first error message.
    pub fn transact(&mut self, reqs: &[vnet_control::request::Request]) -> io::Result<Result<(), Refused>> {
        use vnet_control::request::Request;
        // A transaction takes declarations only (`Command::class`): anything
        // else is refused here, before `begin`.
        if let Some(r) = reqs.iter().find(|r| r.command().class() != vnet_control::Class::Change) {
            return Ok(Err(Refused(format!("`{r}`: not a declaration, and a transaction takes only those"))));
        }
        self.send(&Request::Begin)?.result.map_err(io::Error::other)?;
        let mut first = None;
        for r in reqs {
            let a = self.send(r)?;
            if let (Err(e), None) = (a.result, &first) {
                first = Some(Refused(format!("`{r}`: {e}")));
            }
        }
        let c = self.send(&Request::Commit)?;
        Ok(match first {
            Some(e) => Err(e),
            None => c.result,
        })
    }

    /// Applies `text` (a config file's content) as one transaction. On error
    /// returns the first error message (positions are `text`'s lines).
    pub fn apply(&mut self, text: &str) -> io::Result<Result<(), Refused>> {
        self.request("begin")?.result.map_err(io::Error::other)?;
        let mut first = None;
        for line in text.lines() {
            let r = self.request(line)?;
            if let (Err(e), None) = (r.result, &first) {
                first = Some(e);
            }
        }
        let c = self.request("commit")?;
        Ok(match first {
            Some(e) => Err(e),
            None => c.result,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_goes_to_loopback_only_and_a_line_with_a_control_character_nowhere() {
        let far = Endpoint::Tcp("192.0.2.1:9".parse().unwrap());
        let e = Client::connect(&far).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("not loopback"), "{e}");
        let (a, _b) = UnixStream::pair().unwrap();
        let mut c = Client { r: BufReader::new(Box::new(a)) };
        let e = c.request("show links\nlink evil udp 192.0.2.9:9000").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }

    /// A reply from a host this one does not run is read to a cap: past it
    /// (an endless line, or too many), an error, not memory; the control:
    /// a reply within it is read whole.
    #[test]
    fn a_bounded_reply_past_its_cap_is_refused_and_one_within_it_read() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut c = Client { r: BufReader::new(Box::new(a)) };
        let req = vnet_control::request::Request::Save;
        b.write_all(b"line one\nline two\nend ok\n").unwrap();
        let r = c.send_bounded(&req, 100).unwrap();
        assert_eq!((r.body.as_str(), r.result.is_ok()), ("line one\nline two\n", true));
        let w = std::thread::spawn(move || {
            let chunk = [b'x'; 4096];
            for _ in 0..256 {
                if b.write_all(&chunk).is_err() {
                    break;
                }
            }
        });
        let e = c.send_bounded(&req, 1000).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(e.to_string().contains("longer than 1000 bytes"), "{e}");
        drop(c);
        w.join().unwrap();
        // Many short lines past the cap: refused too.
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut c = Client { r: BufReader::new(Box::new(a)) };
        b.write_all(&b"step\n".repeat(300)).unwrap();
        assert!(c.send_bounded(&req, 1000).is_err());
    }
}
