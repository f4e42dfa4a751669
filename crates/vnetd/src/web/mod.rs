//! The metrics listener (`vnetd --metrics [ADDR:]PORT`): Prometheus text
//! for scrapers and a read-only dashboard for people.
//!
//! | request                  | answer                                              |
//! |--------------------------|-----------------------------------------------------|
//! | `GET /metrics`           | [`Daemon::metrics`], the Prometheus text format     |
//! | `GET /`, `GET /dashboard`| the dashboard: one HTML page, its CSS and script inline |
//! | `GET /api/state.json`    | [`Daemon::dashboard_state`], the document it draws  |
//! | another path             | 404                                                 |
//! | another method           | 405 (`Allow: GET`): nothing here changes anything   |
//!
//! The page, its style and its script are in the binary (`include_str!`):
//! nothing is fetched from anywhere but this listener, and its
//! Content-Security-Policy allows only that script and that style (by
//! their SHA-256) and requests to this origin. A browser on the same
//! machine can be made to ask this listener by any web page it visits,
//! under a name that resolves to 127.0.0.1 (DNS rebinding): the page and
//! its document are served only to requests whose `Host` is an IP address
//! or `localhost` (or that have none), so such a page's requests, which
//! carry its own name, are refused (403). `/metrics` answers any `Host`,
//! as it always did: scrapers name their targets as they like.
//!
//! HTTP/1.0, one response per connection, the request cut at 8 KB and 2 s,
//! at most [`MAX_CONNECTIONS`] at once (`docs/SECURITY.md`, "The metrics
//! listener and the dashboard").

use crate::control::{MAX_CONNECTIONS, WRITE_TIMEOUT};
use crate::daemon::Daemon;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[cfg(test)]
mod tests;

/// Most bytes of an HTTP request the listener reads.
const MAX_HTTP_REQUEST: usize = 8 * 1024;

/// The page's parts, in the binary.
const PAGE_HTML: &str = include_str!("dashboard.html");
const PAGE_CSS: &str = include_str!("dashboard.css");
const PAGE_JS: &str = include_str!("dashboard.js");

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    Metrics,
    Page,
    State,
    /// `GET` of a path not served.
    NotFound,
    /// A method other than `GET`.
    NotAllowed,
    /// The page or its document under a `Host` that is not an address
    /// (DNS rebinding).
    ForeignHost,
    /// Not an HTTP request line.
    Bad,
}

/// What `req` (the request's bytes, up to the blank line) asks for.
pub fn asked(req: &[u8]) -> Asked {
    // A head cut short (by the size or time limit) is refused: what was
    // cut might be its `Host`, and a rebinding page can size a request so
    // that the cut falls just before it.
    let Some(end) = req.windows(4).position(|w| w == b"\r\n\r\n") else { return Asked::Bad };
    let text = String::from_utf8_lossy(&req[..end]);
    let mut lines = text.split("\r\n");
    let mut parts = lines.next().unwrap_or("").split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next()) else {
        return Asked::Bad;
    };
    if !version.starts_with("HTTP/") || parts.next().is_some() {
        return Asked::Bad;
    }
    if method != "GET" {
        return Asked::NotAllowed;
    }
    let path = target.split('?').next().unwrap_or("");
    let asked = match path {
        "/metrics" => return Asked::Metrics,
        "/" | "/dashboard" => Asked::Page,
        "/api/state.json" => Asked::State,
        _ => return Asked::NotFound,
    };
    let host = lines.find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim().eq_ignore_ascii_case("host").then_some(value.trim())
    });
    match host {
        Some(h) if !host_is_an_address(h) => Asked::ForeignHost,
        // HTTP/1.1 requires a Host (browsers always send one): one
        // without it is not served the page or the document.
        None if version != "HTTP/1.0" => Asked::ForeignHost,
        _ => asked,
    }
}

/// Whether a `Host` header names this listener by address (an IPv4 or a
/// bracketed IPv6 address, or `localhost`, with or without a port).
fn host_is_an_address(host: &str) -> bool {
    if let Some(rest) = host.strip_prefix('[') {
        let Some((ip, port)) = rest.split_once(']') else { return false };
        return ip.parse::<std::net::Ipv6Addr>().is_ok()
            && (port.is_empty() || port.strip_prefix(':').is_some_and(|p| p.parse::<u16>().is_ok()));
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.parse::<u16>().is_ok() => name,
        Some(_) => return false,
        None => host,
    };
    name.parse::<std::net::Ipv4Addr>().is_ok() || name.eq_ignore_ascii_case("localhost")
}

/// The page as served: the HTML with its style and script inline.
fn page() -> &'static str {
    static PAGE: OnceLock<String> = OnceLock::new();
    PAGE.get_or_init(|| {
        PAGE_HTML.replacen("<style></style>", &format!("<style>{PAGE_CSS}</style>"), 1).replacen(
            "<script></script>",
            &format!("<script>{PAGE_JS}</script>"),
            1,
        )
    })
}

/// The page's Content-Security-Policy: its one script and one style by
/// hash, requests to this origin only, nothing else.
fn page_policy() -> &'static str {
    static CSP: OnceLock<String> = OnceLock::new();
    CSP.get_or_init(|| {
        use base64::Engine as _;
        let hash = |s: &str| {
            let d = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
            format!("'sha256-{}'", base64::engine::general_purpose::STANDARD.encode(d.as_ref()))
        };
        format!(
            "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src 'none'; \
             base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            hash(PAGE_JS),
            hash(PAGE_CSS)
        )
    })
}

/// The response to `asked`: status, extra headers, content type, body.
fn respond(asked: Asked, daemon: &Mutex<Daemon>) -> (&'static str, String, &'static str, String) {
    let lock = || daemon.lock().unwrap_or_else(|p| p.into_inner());
    let plain = "text/plain; charset=utf-8";
    let private = "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n".to_string();
    match asked {
        Asked::Metrics => ("200 OK", String::new(), "text/plain; version=0.0.4", lock().metrics()),
        Asked::Page => {
            let headers = format!(
                "{private}Content-Security-Policy: {}\r\nX-Frame-Options: DENY\r\nReferrer-Policy: no-referrer\r\n",
                page_policy()
            );
            ("200 OK", headers, "text/html; charset=utf-8", page().to_string())
        }
        Asked::State => ("200 OK", private, "application/json", lock().dashboard_state().to_string()),
        Asked::NotFound => {
            ("404 Not Found", String::new(), plain, "served here: GET /metrics, /, /api/state.json\n".into())
        }
        Asked::NotAllowed => {
            ("405 Method Not Allowed", "Allow: GET\r\n".into(), plain, "read-only: GET only\n".into())
        }
        Asked::ForeignHost => (
            "403 Forbidden",
            String::new(),
            plain,
            "the dashboard answers only a Host that is an IP address or localhost\n".into(),
        ),
        Asked::Bad => (
            "400 Bad Request",
            String::new(),
            plain,
            "not an HTTP request, or its head did not end within 8 KB and 2 s\n".into(),
        ),
    }
}

/// Serves the listener on `addr` (the table above). Runs until the task
/// is dropped.
pub async fn serve(addr: SocketAddr, daemon: Arc<Mutex<Daemon>>) -> std::io::Result<()> {
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
            let (status, headers, kind, body) = respond(asked(&req), &daemon);
            let head = format!(
                "HTTP/1.0 {status}\r\nContent-Type: {kind}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let reply = async {
                c.write_all(head.as_bytes()).await?;
                c.write_all(body.as_bytes()).await
            };
            let _ = tokio::time::timeout(WRITE_TIMEOUT, reply).await;
        });
    }
}
