//! The host's hook configuration (`/etc/vnet/libvirt-hook.conf`): which
//! vnetd the hook attaches domains to, and in which vnet network.
//!
//! A domain's XML is written by whoever defines the domain; the host's
//! tenants are the host administrator's to choose. So the vnetd (its
//! control endpoint) and the network come from this file, never from the
//! XML: a domain opts in with `<vnet:attach>`, and an XML that asks for
//! another endpoint or network than this file gives it is refused
//! (`docs/SECURITY.md`, "libvirt").
//!
//! ```text
//! # /etc/vnet/libvirt-hook.conf
//! control unix:/run/vnet/lan.sock   # the vnetd (default: unix:/run/vnetd.sock)
//! datapath kernel                   # for TAP interfaces (default: auto)
//! network 0                         # for every domain not named below
//! domain web1 network 7             # domain `web1` joins network 7
//! log /var/log/vnet/libvirt-hook.log # what each call did (default: syslog)
//! incoming /run/vnet/libvirt-incoming # marks of incoming domains (the default)
//! ```
//!
//! The hook says what it did at each step (`migrate`, `prepare`,
//! `started`, `release`, ...) of a domain of vnet's: one line per request
//! it sent and its outcome, to the system log (`/dev/log`, where journald
//! or a syslog daemon reads; ident `vnet-libvirt-hook`), to a file
//! (`log PATH`, appended, each line stamped with UTC time), or nowhere
//! (`log none`).
//!
//! A missing file is the defaults. Every error names the file, the line,
//! the column and what was expected.

use std::collections::BTreeMap;
use vnet_client::Endpoint;
use vnet_control::Datapath;

/// Where the hook reads its configuration unless `--config FILE` is given.
pub const DEFAULT_PATH: &str = "/etc/vnet/libvirt-hook.conf";

/// Where incoming domains are marked (one empty file per domain name)
/// unless `incoming DIR` says otherwise.
pub const INCOMING_DIR: &str = "/run/vnet/libvirt-incoming";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub control: Endpoint,
    /// The control endpoint as written (what an XML's `control` is
    /// compared with).
    pub control_text: String,
    pub datapath: Datapath,
    /// The network of domains not in `domains`.
    pub network: u32,
    /// Domains by name, and their networks.
    pub domains: BTreeMap<String, u32>,
    /// Where the hook says what it did.
    pub log: Log,
    /// Where incoming domains are marked.
    pub incoming: std::path::PathBuf,
}

/// Where the hook says what it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Log {
    /// The system log (`/dev/log`), the default.
    Syslog,
    /// Appended to this file.
    File(std::path::PathBuf),
    /// Nowhere.
    Nowhere,
}

impl Default for Config {
    fn default() -> Config {
        let control_text = vnet_client::DEFAULT_ENDPOINT.to_string();
        Config {
            control: control_text.parse().unwrap_or(Endpoint::Unix("/run/vnetd.sock".into())),
            control_text,
            datapath: Datapath::Auto,
            network: 0,
            domains: BTreeMap::new(),
            log: Log::Syslog,
            incoming: INCOMING_DIR.into(),
        }
    }
}

/// A configuration error, positioned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: expected {expected}, found {found}")]
pub struct Error {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub expected: String,
    pub found: String,
}

impl Config {
    /// The network `domain` joins.
    pub fn network_of(&self, domain: &str) -> u32 {
        self.domains.get(domain).copied().unwrap_or(self.network)
    }

    /// Reads `path`; the defaults where it does not exist.
    pub fn load(path: &std::path::Path) -> Result<Config, Error> {
        match std::fs::read(path) {
            Ok(b) => Config::parse(&path.display().to_string(), &b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
            Err(e) => Err(Error {
                file: path.display().to_string(),
                line: 0,
                column: 0,
                expected: "a readable file".into(),
                found: e.to_string(),
            }),
        }
    }

    /// Parses the text of `file`.
    pub fn parse(file: &str, bytes: &[u8]) -> Result<Config, Error> {
        let mut c = Config::default();
        let text = std::str::from_utf8(bytes).map_err(|e| {
            let line = bytes[..e.valid_up_to()].iter().filter(|b| **b == b'\n').count() + 1;
            Error {
                file: file.into(),
                line,
                column: 1,
                expected: "UTF-8 text".into(),
                found: "other bytes".into(),
            }
        })?;
        for (i, line) in text.lines().enumerate() {
            let err = |column: usize, expected: &str, found: &str| Error {
                file: file.into(),
                line: i + 1,
                column,
                expected: expected.into(),
                found: found.escape_debug().to_string(),
            };
            let toks = vnet_control::lex::words(line, i as u32 + 1)
                .map_err(|e| err(e.pos.column as usize, &e.expected, &e.found))?;
            let word = |k: usize| toks.get(k).map(|t| (t.text, t.pos.column as usize));
            let eol = line.chars().count() + 1;
            let arg = |k: usize, expected: &str| word(k).ok_or_else(|| err(eol, expected, "end of line"));
            let Some((key, _)) = word(0) else { continue };
            let used = match key {
                "control" => {
                    let (v, col) = arg(1, "an endpoint (unix:PATH or tcp:ADDR:PORT)")?;
                    c.control = v.parse().map_err(|e: vnet_client::endpoint::EndpointError| {
                        err(col, "an endpoint", &e.to_string())
                    })?;
                    c.control_text = v.to_string();
                    2
                }
                "datapath" => {
                    let (v, col) = arg(1, "`user`, `kernel` or `auto`")?;
                    c.datapath = [Datapath::User, Datapath::Kernel, Datapath::Auto]
                        .into_iter()
                        .find(|d| d.word() == v)
                        .ok_or_else(|| err(col, "`user`, `kernel` or `auto`", v))?;
                    2
                }
                "network" => {
                    let (v, col) = arg(1, "a network number")?;
                    c.network = v.parse().map_err(|_| err(col, "a network number", v))?;
                    2
                }
                "domain" => {
                    let (name, _) = arg(1, "a domain name")?;
                    match arg(2, "`network`")? {
                        ("network", _) => {}
                        (w, col) => return Err(err(col, "`network`", w)),
                    }
                    let (v, col) = arg(3, "a network number")?;
                    let n = v.parse().map_err(|_| err(col, "a network number", v))?;
                    c.domains.insert(name.to_string(), n);
                    4
                }
                "log" => {
                    const WHERE: &str = "`syslog`, `none` or an absolute path";
                    let (v, col) = arg(1, WHERE)?;
                    c.log = match v {
                        "syslog" => Log::Syslog,
                        "none" => Log::Nowhere,
                        p if p.starts_with('/') => Log::File(p.into()),
                        _ => return Err(err(col, WHERE, v)),
                    };
                    2
                }
                "incoming" => {
                    let (v, col) = arg(1, "an absolute path")?;
                    if !v.starts_with('/') {
                        return Err(err(col, "an absolute path", v));
                    }
                    c.incoming = v.into();
                    2
                }
                other => {
                    return Err(err(
                        1,
                        "`control`, `datapath`, `network`, `domain`, `log` or `incoming`",
                        other,
                    ));
                }
            };
            if let Some((w, col)) = word(used) {
                return Err(err(col, "end of line", w));
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_gives_the_endpoint_the_data_path_and_each_domains_network() {
        let c = Config::parse(
            "h.conf",
            b"# the host's\ncontrol unix:/run/vnet/lan.sock\ndatapath kernel\nnetwork 3\ndomain web1 network 7 # web\n",
        )
        .unwrap();
        assert_eq!(c.control_text, "unix:/run/vnet/lan.sock");
        assert_eq!(c.datapath, Datapath::Kernel);
        assert_eq!((c.network_of("web1"), c.network_of("db")), (7, 3));
        assert_eq!(c.log, Log::Syslog);
        let l = |t: &str| Config::parse("h", t.as_bytes()).map(|c| c.log);
        assert_eq!(l("log /var/log/h.log"), Ok(Log::File("/var/log/h.log".into())));
        assert_eq!(l("log none"), Ok(Log::Nowhere));
        assert_eq!(Config::parse("h", b"incoming /x/in").unwrap().incoming, std::path::Path::new("/x/in"));
        assert!(Config::parse("h", b"incoming x").is_err());
        assert!(l("log relative.log").unwrap_err().to_string().starts_with("h:1:5: expected `syslog`"));
        assert_eq!(Config::parse("h", b"").unwrap(), Config::default());
    }

    #[test]
    fn errors_name_the_file_line_and_column() {
        for (text, at) in [
            ("network x", "h:1:9"),
            ("\ndomain a net 7", "h:2:10"),
            ("control unix:/a b", "h:1:17"),
            ("color red", "h:1:1"),
            ("datapath", "h:1:9"),
            ("network 1\r2", "h:1:10"),
        ] {
            let e = Config::parse("h", text.as_bytes()).unwrap_err().to_string();
            assert!(e.starts_with(at), "{text:?}: {e}");
        }
        assert!(Config::load(std::path::Path::new("/nonexistent/vnet-hook.conf")).is_ok());
    }
}
