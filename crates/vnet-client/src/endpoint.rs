//! Where a vnetd control endpoint listens and how a client proves itself
//! to a `tcp:` one (its token file).

use std::net::SocketAddr;
use std::path::PathBuf;

/// Hex digits in a control token (32 random bytes).
pub const TOKEN_HEX: usize = 64;

/// Where the control endpoint listens (or a client connects).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    /// Plain TCP: loopback only.
    Tcp(SocketAddr),
    /// TLS 1.3 with client certificates (`vnetd --control-tls`): any address.
    Tls(SocketAddr),
}

/// An endpoint that is not one: what was expected, and the text found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("expected tls:ADDR:PORT, found `{0}`")]
    Tls(String),
    #[error("expected a path after `unix:`")]
    NoPath,
    #[error("expected tcp:ADDR:PORT or tcp:PORT, found `{0}`")]
    Tcp(String),
    #[error("expected unix:PATH, tcp:ADDR:PORT or tls:ADDR:PORT, found `{0}`")]
    Unknown(String),
}

impl std::str::FromStr for Endpoint {
    type Err = EndpointError;

    /// `unix:PATH`, `tcp:ADDR:PORT`, `tcp:PORT` (on 127.0.0.1), or
    /// `tls:ADDR:PORT`.
    fn from_str(s: &str) -> Result<Self, EndpointError> {
        if let Some(a) = s.strip_prefix("tls:") {
            return a.parse().map(Endpoint::Tls).map_err(|_| EndpointError::Tls(s.into()));
        }
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(EndpointError::NoPath);
            }
            return Ok(Endpoint::Unix(p.into()));
        }
        if let Some(a) = s.strip_prefix("tcp:") {
            if let Ok(port) = a.parse::<u16>() {
                return Ok(Endpoint::Tcp(SocketAddr::from(([127, 0, 0, 1], port))));
            }
            return a.parse().map(Endpoint::Tcp).map_err(|_| EndpointError::Tcp(s.into()));
        }
        Err(EndpointError::Unknown(s.into()))
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "tcp:{a}"),
            Endpoint::Tls(a) => write!(f, "tls:{a}"),
        }
    }
}

/// The default control endpoint.
pub const DEFAULT_ENDPOINT: &str = "unix:/run/vnetd.sock";

/// A token file refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(transparent)]
    File(#[from] crate::keys::FileError),
    #[error("{path}:1:1: expected a token of {TOKEN_HEX} hex digits")]
    NotAToken { path: String },
    /// No random bytes to make a new token with.
    #[error("{path}: no randomness")]
    NoRandomness { path: String },
}

/// Reads an existing token file, refusing one others may read.
pub fn load_token_file(path: &std::path::Path) -> Result<String, TokenError> {
    let text = crate::keys::read_secret(path, "the token", 1024)?;
    let t = text.trim();
    if t.len() != TOKEN_HEX || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(TokenError::NotAToken { path: path.display().to_string() });
    }
    Ok(t.to_string())
}
