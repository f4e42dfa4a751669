//! Where the hook says what it did ([`Log`]): the system log, a file, or
//! nowhere. Writing is best effort: a log that cannot be written is not a
//! reason to refuse a domain its network, so it is ignored.

use crate::config::Log;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Error,
}

/// Writes `text` as one line where `to` says.
pub fn write(to: &Log, level: Level, text: &str) {
    // One line, whatever a domain's name or a vnetd's answer held.
    let line = text.replace(['\n', '\r'], " ");
    let pid = std::process::id();
    match to {
        Log::Nowhere => {}
        Log::Syslog => {
            // RFC 3164 without a timestamp (the reader adds its own):
            // facility daemon (3), severity info (6) or err (3).
            let pri = 3 * 8 + if level == Level::Info { 6 } else { 3 };
            let msg = format!("<{pri}>vnet-libvirt-hook[{pid}]: {line}");
            if let Ok(s) = std::os::unix::net::UnixDatagram::unbound() {
                let _ = s.send_to(msg.as_bytes(), "/dev/log");
            }
        }
        Log::File(path) => {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
            let word = if level == Level::Error { "error: " } else { "" };
            let msg = format!("{} vnet-libvirt-hook[{pid}]: {word}{line}\n", vnet_client::utc::millis(now));
            // One write of the whole line to a file opened for appending:
            // two hooks at once (libvirt runs one per domain) do not
            // interleave their lines.
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
                let _ = f.write_all(msg.as_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_gets_one_stamped_line_per_call() {
        let p = std::env::temp_dir().join(format!("vnet-hook-log-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        write(&Log::File(p.clone()), Level::Info, "web migrate begin: incoming");
        write(&Log::File(p.clone()), Level::Error, "web prepare begin: two\nlines");
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].ends_with("]: web migrate begin: incoming"), "{text}");
        assert!(lines[1].ends_with("]: error: web prepare begin: two lines"), "{text}");
        assert!(lines[0].starts_with("20") && lines[0].contains('T'), "stamped: {text}");
        let _ = std::fs::remove_file(&p);
        // Nowhere and a syslog with no /dev/log write nothing and do not fail.
        write(&Log::Nowhere, Level::Info, "x");
    }
}
