//! `vnetctl`: talk to a running vnetd.
//!
//! ```text
//! vnetctl show routes            # any control line, as words
//! vnetctl --json show stats
//! vnetctl route any 52:54:00:00:00:02 to link hostb   # `to` = `->`
//! vnetctl apply changes.conf     # a file, applied atomically
//! vnetctl genkey > host.key      # a private key (chmod 600), for vnetd --key
//! vnetctl pubkey < host.key      # its public key, for the peers' `peer-key`
//! # relocate a VM: the new host attaches it, every host reroutes its MAC,
//! # the old host drops its interface, the new host announces the MAC
//! vnetctl move 52:54:00:00:00:02 to unix:/run/c.sock hosts unix:/run/a.sock,unix:/run/b.sock \
//!     interface vm2 netdev c2
//! ```

use clap::Parser;
use std::process::ExitCode;
use vnetd::client::Client;
use vnetd::control::{Endpoint, DEFAULT_ENDPOINT};

#[derive(Parser)]
#[command(version, about = "Control a running vnetd", trailing_var_arg = true)]
struct Args {
    /// Control endpoint: unix:PATH or tcp:ADDR:PORT.
    #[arg(long, default_value = DEFAULT_ENDPOINT, env = "VNETCTL_CONTROL")]
    control: Endpoint,
    /// For a `tls:ADDR:PORT` endpoint: the certificate, key and CA to
    /// present and check with (PEM files).
    #[arg(long, value_delimiter = ',', num_args = 3, value_names = ["CERT", "KEY", "CA"], env = "VNETCTL_TLS")]
    tls: Vec<String>,
    /// Ask `show` for JSON.
    #[arg(long)]
    json: bool,
    /// A control line as words (`show routes`, `route ...`, `delete route 3`),
    /// or `apply FILE` to apply a file as one transaction.
    #[arg(required = true, allow_hyphen_values = true)]
    words: Vec<String>,
}

fn main() -> ExitCode {
    if let Some(code) = vnetd::docs::generate_if_asked(<Args as clap::CommandFactory>::command) {
        return code;
    }
    let args = Args::parse();
    if let [cert, key, ca] = args.tls.as_slice() {
        let files = vnet_control::TlsFiles { cert: cert.clone(), key: key.clone(), ca: ca.clone() };
        if let Err(e) = vnetd::client::set_tls(&files) {
            eprintln!("vnetctl: --tls: {e}");
            return ExitCode::from(2);
        }
    }
    // Keys are made here, without a vnetd: `vnetctl genkey > host.key`,
    // `vnetctl pubkey < host.key`.
    match args.words.first().map(String::as_str) {
        Some("genkey") => return key_out(vnetd::keys::genkey()),
        Some("pubkey") => {
            let mut private = String::new();
            if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut private) {
                eprintln!("vnetctl: pubkey: reading stdin: {e}");
                return ExitCode::from(2);
            }
            return key_out(vnetd::keys::pubkey(&private));
        }
        _ => {}
    }
    if args.words.first().is_some_and(|w| w == "move") {
        return match parse_move(&args.words[1..]).and_then(|m| vnetd::relocate::relocate(&m)) {
            Ok(report) => {
                print!("{report}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("vnetctl: move: {e}");
                ExitCode::from(1)
            }
        };
    }
    let mut c = match Client::connect(&args.control) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vnetctl: cannot reach vnetd at {}: {e}", args.control);
            return ExitCode::from(3);
        }
    };
    if args.words.len() == 2 && args.words[0] == "apply" {
        let path = &args.words[1];
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("vnetctl: {path}: {e}");
                return ExitCode::from(2);
            }
        };
        return match c.apply(&text) {
            Ok(Ok(())) => ExitCode::SUCCESS,
            Ok(Err(e)) => {
                eprintln!("vnetctl: {path}:{e}");
                ExitCode::from(1)
            }
            Err(e) => {
                eprintln!("vnetctl: {e}");
                ExitCode::from(3)
            }
        };
    }
    let mut line = args.words.join(" ");
    if args.json && args.words.first().is_some_and(|w| w == "show") {
        line.push_str(" json");
    }
    match c.request(&line) {
        Ok(r) => {
            print!("{}", r.body);
            match r.result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("vnetctl: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Err(e) => {
            eprintln!("vnetctl: {e}");
            ExitCode::from(3)
        }
    }
}

fn key_out(k: Result<String, String>) -> ExitCode {
    match k {
        Ok(k) => {
            println!("{k}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vnetctl: {e}");
            ExitCode::from(2)
        }
    }
}

/// `MAC to ENDPOINT [via IP] [hosts ENDPOINT,...] interface NAME KIND DEV [options]`.
fn parse_move(w: &[String]) -> Result<vnetd::relocate::Move, String> {
    const USAGE: &str =
        "usage: vnetctl move MAC to ENDPOINT [via IP] [hosts ENDPOINT,...] interface NAME KIND DEV [options]";
    let mac = w.first().and_then(|m| m.parse().ok()).ok_or(format!("expected a MAC first; {USAGE}"))?;
    let (mut to, mut via, mut hosts, mut decl) = (None, None, Vec::new(), None);
    let mut i = 1;
    while i < w.len() {
        let val = w.get(i + 1).ok_or(format!("`{}` needs a value; {USAGE}", w[i]))?;
        match w[i].as_str() {
            "to" => to = Some(val.parse::<Endpoint>().map_err(|e| format!("to: {e}"))?),
            "via" => via = Some(val.parse().map_err(|e| format!("via: {e}"))?),
            "hosts" => {
                for h in val.split(',').filter(|h| !h.is_empty()) {
                    hosts.push(h.parse::<Endpoint>().map_err(|e| format!("hosts: {e}"))?);
                }
            }
            "interface" => {
                decl = Some(w[i + 1..].join(" "));
                break;
            }
            other => return Err(format!("unexpected `{other}`; {USAGE}")),
        }
        i += 2;
    }
    Ok(vnetd::relocate::Move {
        mac,
        to: to.ok_or(format!("expected `to ENDPOINT`; {USAGE}"))?,
        decl: decl.ok_or(format!("expected `interface NAME KIND DEV`; {USAGE}"))?,
        hosts,
        to_ip: via,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn move_words() {
        let m = parse_move(&words(
            "52:54:00:00:00:02 to unix:/c.sock via 10.0.0.3 hosts unix:/a.sock,tcp:9001 interface vm2 netdev c2 mode poll",
        ))
        .unwrap();
        assert_eq!(m.to, "unix:/c.sock".parse().unwrap());
        assert_eq!(m.hosts.len(), 2);
        assert_eq!(m.decl, "vm2 netdev c2 mode poll");
        assert_eq!(m.to_ip, Some("10.0.0.3".parse().unwrap()));
        for bad in [
            "",
            "xx to unix:/c interface a tap b",
            "52:54:00:00:00:02 interface a tap b",
            "52:54:00:00:00:02 to",
            "52:54:00:00:00:02 to unix:/c bogus 1",
        ] {
            assert!(parse_move(&words(bad)).is_err(), "{bad}");
        }
    }
}
