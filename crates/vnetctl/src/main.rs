//! `vnetctl`: talk to a running vnetd.
//!
//! ```text
//! vnetctl show routes            # any control line, as words
//! vnetctl --json show stats
//! vnetctl route any 52:54:00:00:00:02 to link hostb   # `to` = `->`
//! vnetctl apply changes.conf     # a file, applied atomically
//! vnetctl genkey host.key        # a private key (made mode 0600), for vnetd --key
//! vnetctl pubkey < host.key      # its public key, for the peers' `peer-key`
//! vnetctl pubkey claim < host.key  # its claim key (cluster mode's MAC claims)
//! vnetctl netkey net.key         # a network key (mode 0600); prints its public key
//! vnetctl sign net.key network lab host h1 public-key KEY claim-key KEY addr 10.0.0.0/24
//!                                # a host certificate, for vnetd --host-cert
//! etcdctl put $(vnetctl revoke net.key network lab host h3)
//!                                # every certificate of h3 withdrawn (`cert ID`: one)
//! etcdctl put $(vnetctl policy net.key network lab rules.conf)
//!                                # the network's policy, signed (every host enforces it)
//! # relocate a VM: the new host attaches it, every host reroutes its MAC,
//! # the old host drops its interface, the new host announces the MAC
//! vnetctl move 52:54:00:00:00:02 to unix:/run/c.sock hosts unix:/run/a.sock,unix:/run/b.sock \
//!     interface vm2 netdev c2
//! # a live migration, static mode: the new host's interface was attached
//! # `standby`; wait until the VM arrives there, then reroute the others
//! vnetctl move 52:54:00:00:00:02 to unix:/run/c.sock hosts unix:/run/a.sock,unix:/run/b.sock \
//!     wait 600 interface vm2 netdev c2
//! ```

mod help;
mod kube;
mod monitor;
mod onboard;
mod trace;

use clap::Parser;
use std::process::ExitCode;
use vnet_client::client::Client;
use vnet_client::endpoint::Endpoint;

#[derive(Parser)]
#[command(
    version,
    about = "Control a running vnetd",
    long_about = "Control a running vnetd, and make a secured network's keys, certificates and hosts.\n\n\
                  Without --control, vnetctl talks to the vnetd running on this host: the packaged \
                  vnetd@NAME's socket /run/vnet/NAME.sock, or /run/vnetd.sock (a vnetd started without \
                  --control). When several run, -n NAME picks one (the error lists them).",
    trailing_var_arg = true,
    after_help = help::after_help()
)]
struct Args {
    /// Control endpoint: unix:PATH, tcp:ADDR:PORT or tls:ADDR:PORT (unless
    /// given: the one vnetd running here, or -n NAME's).
    #[arg(long, env = "VNETCTL_CONTROL")]
    control: Option<Endpoint>,
    /// The vnetd@NAME to talk to (its socket /run/vnet/NAME.sock), when
    /// several run here.
    #[arg(short = 'n', long = "name", value_name = "NAME", conflicts_with = "control")]
    name: Option<String>,
    /// For a `tls:ADDR:PORT` endpoint: the certificate, key and CA to
    /// present and check with (PEM files).
    #[arg(long, value_delimiter = ',', num_args = 3, value_names = ["CERT", "KEY", "CA"], env = "VNETCTL_TLS")]
    tls: Vec<String>,
    /// For a `tcp:` endpoint: the file of its token (vnetd --control-token).
    #[arg(long, value_name = "FILE", env = "VNETCTL_TOKEN")]
    token: Option<std::path::PathBuf>,
    /// Ask `show` for JSON.
    #[arg(long)]
    json: bool,
    /// A command (below), or a control line as words (`show routes`,
    /// `route ...`, `delete route 3`), or `apply FILE` to apply a file as
    /// one transaction. `vnetctl help COMMAND`: its usage.
    #[arg(required = true, allow_hyphen_values = true)]
    words: Vec<String>,
}

/// Prints the help `words` ask for (`help CMD`, `CMD --help`): the
/// command's own usage, or, for `help` alone, vnetctl's.
fn print_help(words: &[&str]) -> ExitCode {
    if let Some(h) = help::of(words) {
        out(&h);
        return ExitCode::SUCCESS;
    }
    if words.iter().all(|w| matches!(*w, "help" | "-h" | "--help")) {
        let _ = <Args as clap::CommandFactory>::command().print_long_help();
        return ExitCode::SUCCESS;
    }
    let named: Vec<&str> =
        words.iter().copied().filter(|w| !matches!(*w, "help" | "-h" | "--help")).collect();
    eprintln!("vnetctl: no command `{}`: every command is in `vnetctl --help`", named.join(" "));
    ExitCode::from(2)
}

/// The endpoint to talk to: `--control`'s, or the vnetd found here
/// (`-n NAME`'s, or the one running).
fn endpoint(
    args: &Args,
) -> Result<(Endpoint, Option<vnet_client::find::Found>), vnet_client::find::FindError> {
    use vnet_client::find;
    if let Some(ep) = &args.control {
        return Ok((ep.clone(), None));
    }
    let f = find::find(
        std::path::Path::new(find::UNIT_SOCKET_DIR),
        std::path::Path::new(find::DEFAULT_SOCKET),
        args.name.as_deref(),
    )?;
    Ok((f.endpoint(), Some(f)))
}

/// What to say when the endpoint does not answer: where it was looked
/// for, and what to check.
fn unreached(ep: &Endpoint, found: Option<&vnet_client::find::Found>, e: &std::io::Error) -> String {
    match found.and_then(|f| f.name.as_deref()) {
        Some(n) => format!(
            "cannot reach vnetd@{n} at {ep}: {e}: is it running? (`systemctl status vnetd@{n}`; \
             `systemctl enable --now vnetd@{n}` starts it)"
        ),
        None if e.kind() == std::io::ErrorKind::NotFound => format!(
            "cannot reach vnetd at {ep}: {e}: no vnetd listens there (without --control, vnetctl \
             finds the vnetd running here)"
        ),
        None => format!("cannot reach vnetd at {ep}: {e}"),
    }
}

fn main() -> ExitCode {
    if let Some(code) = vnet_client::docs::generate_if_asked(<Args as clap::CommandFactory>::command) {
        return code;
    }
    let args = Args::parse();
    let words: Vec<&str> = args.words.iter().map(String::as_str).collect();
    if help::asked(&words) {
        return print_help(&words);
    }
    if let [cert, key, ca] = args.tls.as_slice() {
        let files = vnet_control::TlsFiles { cert: cert.clone(), key: key.clone(), ca: ca.clone() };
        if let Err(e) = vnet_client::client::set_tls(&files) {
            eprintln!("vnetctl: --tls: {e}");
            return ExitCode::from(2);
        }
    }
    if let Some(path) = &args.token {
        if let Err(e) = vnet_client::client::set_token(path) {
            eprintln!("vnetctl: --token {e}");
            return ExitCode::from(2);
        }
    }
    // Keys are made here, without a vnetd.
    if let Some(done) = keys(&args.words) {
        return done;
    }
    if args.words.first().is_some_and(|w| w == "kube") {
        return kube::run(&words[1..]);
    }
    if args.words.first().is_some_and(|w| w == "move") {
        return run_move(&args.words[1..]);
    }
    let (ep, found) = match endpoint(&args) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("vnetctl: {e}");
            return ExitCode::from(3);
        }
    };
    let mut c = match Client::connect(&ep) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vnetctl: {}", unreached(&ep, found.as_ref(), &e));
            return ExitCode::from(3);
        }
    };
    if args.words.first().is_some_and(|w| w == "monitor") {
        return monitor::run(&mut c, &args.words[1..], args.json);
    }
    if args.words.first().is_some_and(|w| w == "trace") {
        return trace::run(&mut c, &args.words[1..], args.json);
    }
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
            out(&r.body);
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

/// `vnetctl move ...`: a VM relocated between the endpoints named.
fn run_move(words: &[String]) -> ExitCode {
    match parse_move(words).and_then(|m| vnet_client::relocate::relocate(&m).map_err(|e| e.to_string())) {
        Ok(report) => {
            out(&report);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vnetctl: move: {e}");
            ExitCode::from(1)
        }
    }
}

/// Writes `text` to stdout; a reader that went away (`vnetctl show routes |
/// head`) ends the output quietly instead of a panic.
fn out(text: &str) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(text.as_bytes()).and_then(|()| o.flush());
}

fn key_out(k: Result<String, String>) -> ExitCode {
    match k {
        Ok(k) => {
            out(&format!("{k}\n"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vnetctl: {e}");
            ExitCode::from(2)
        }
    }
}

/// `MAC to ENDPOINT [via IP] [hosts ENDPOINT,...] [wait SECONDS] interface NAME KIND DEV [options]`.
fn parse_move(w: &[String]) -> Result<vnet_client::relocate::Move, String> {
    const USAGE: &str =
        "usage: vnetctl move MAC to ENDPOINT [via IP] [hosts ENDPOINT,...] [wait SECONDS] interface NAME KIND DEV [options]";
    let mac = w.first().and_then(|m| m.parse().ok()).ok_or(format!("expected a MAC first; {USAGE}"))?;
    let (mut to, mut via, mut hosts, mut decl, mut wait) = (None, None, Vec::new(), None, None);
    let mut i = 1;
    while i < w.len() {
        let val = w.get(i + 1).ok_or(format!("`{}` needs a value; {USAGE}", w[i]))?;
        match w[i].as_str() {
            "to" => to = Some(val.parse::<Endpoint>().map_err(|e| format!("to: {e}"))?),
            "via" => via = Some(val.parse().map_err(|e| format!("via: {e}"))?),
            "wait" => {
                let secs: f64 = val.parse().map_err(|e| format!("wait: {e}"))?;
                let d = std::time::Duration::try_from_secs_f64(secs)
                    .ok()
                    .filter(|d| *d <= std::time::Duration::from_secs(86_400))
                    .ok_or(format!("wait: seconds from 0 to 86400, not `{val}`"))?;
                wait = Some(d);
            }
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
    Ok(vnet_client::relocate::Move {
        mac,
        to: to.ok_or(format!("expected `to ENDPOINT`; {USAGE}"))?,
        decl: decl.ok_or(format!("expected `interface NAME KIND DEV`; {USAGE}"))?,
        hosts,
        to_ip: via,
        wait,
    })
}

/// `genkey`, `pubkey`, `netkey` and `sign`: keys and certificates, made
/// without a vnetd. `None` for any other command.
fn keys(words: &[String]) -> Option<ExitCode> {
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    let stdin = || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map(|_| text)
            .map_err(|e| format!("reading stdin: {e}"))
    };
    const KEY_COMMANDS: [&str; 8] =
        ["genkey", "pubkey", "netkey", "sign", "revoke", "policy", "network", "join"];
    if w.first().is_some_and(|c| KEY_COMMANDS.contains(c)) && w.iter().skip(1).any(|x| *x == "help") {
        // `vnetctl genkey help`: help, not a key in a file named `help`.
        return Some(print_help(&w));
    }
    let out = match w.as_slice() {
        ["genkey"] => vnet_client::keys::genkey().map_err(|e| e.to_string()),
        ["genkey", file] => vnet_client::keys::genkey().map_err(|e| e.to_string()).and_then(|k| {
            vnet_client::keys::write_secret(std::path::Path::new(file), &k).map_err(|e| e.to_string())?;
            vnet_client::keys::pubkey(&k).map_err(|e| e.to_string())
        }),
        ["pubkey"] => stdin().and_then(|k| vnet_client::keys::pubkey(&k).map_err(|e| e.to_string())),
        ["pubkey", "claim"] => stdin().and_then(|k| vnet_client::keys::claim_pubkey(&k).map_err(|e| e.to_string())),
        ["netkey", file] => netkey(file),
        ["sign", file, rest @ ..] => sign(file, rest),
        ["revoke", file, rest @ ..] => revoke(file, rest),
        ["policy", file, rest @ ..] => policy(file, rest),
        ["network", "init", dir, rest @ ..] => onboard::init(dir, rest),
        ["network", "setup", dir] => onboard::setup(dir),
        ["network", "token", dir, host, rest @ ..] => onboard::make_token(dir, host, rest),
        ["network", "approve", dir, host, rest @ ..] => onboard::approve(dir, host, rest),
        ["network", "revoke", dir, host] => onboard::revoke(dir, host),
        ["network", "upgrade", dir] => onboard::upgrade(dir),
        ["join", rest @ ..] => onboard::join(rest),
        [first, ..] if KEY_COMMANDS.contains(first) => Err("usage: genkey [FILE] | pubkey [claim] < KEYFILE | netkey FILE | sign NETKEYFILE network NAME host NAME \
             public-key KEY claim-key KEY addr PREFIX[,PREFIX...] [days N | not-after SECONDS] | \
             revoke NETKEYFILE network NAME host NAME [cert ID] | policy NETKEYFILE network NAME FILE [serial N] | \
             network init DIR network NAME etcd IP | \
             network token DIR HOST [ttl D] [file F] | network approve DIR HOST [key FINGERPRINT] [--yes] [replace] | \
             network revoke DIR HOST | network setup DIR | network upgrade DIR | join --token-file FILE|- [host NAME] [dir DIR] [wait SECS]"
            .to_string()),
        _ => return None,
    };
    Some(key_out(out.map_err(|e| format!("{}: {e}", w[0]))))
}

/// `netkey FILE`: makes the network key in FILE (0600) unless it exists;
/// prints its public key either way.
fn netkey(file: &str) -> Result<String, String> {
    use vnet_cluster::trust::NetworkKey;
    let path = std::path::Path::new(file);
    let key = if path.exists() {
        let text =
            vnet_client::keys::read_secret(path, "the network key", 1024).map_err(|e| e.to_string())?;
        NetworkKey::from_base64(&text).map_err(|e| format!("{file}:1:1: {e}"))?
    } else {
        let k = NetworkKey::generate().map_err(|e| e.to_string())?;
        vnet_client::keys::write_secret(path, &k.secret()).map_err(|e| e.to_string())?;
        k
    };
    Ok(key.public().to_string())
}

/// `sign NETKEYFILE network N host H public-key K claim-key C addr P[,P]`.
fn sign(file: &str, words: &[&str]) -> Result<String, String> {
    use vnet_cluster::trust::{CertBody, NetworkKey};
    let text = vnet_client::keys::read_secret(std::path::Path::new(file), "the network key", 1024)
        .map_err(|e| e.to_string())?;
    let key = NetworkKey::from_base64(&text).map_err(|e| format!("{file}:1:1: {e}"))?;
    let mut body = CertBody {
        network: String::new(),
        host: String::new(),
        public_key: String::new(),
        claim_key: String::new(),
        addrs: Vec::new(),
        groups: Vec::new(),
        not_after: None,
    };
    for pair in words.chunks(2) {
        let [k, v] = pair else { return Err(format!("`{}` needs a value", pair[0])) };
        match *k {
            "network" => body.network = v.to_string(),
            "host" => body.host = v.to_string(),
            "public-key" => body.public_key = v.to_string(),
            "claim-key" => body.claim_key = v.to_string(),
            "addr" => body.addrs.extend(v.split(',').map(str::to_string)),
            "groups" => body.groups.extend(v.split(',').map(str::to_string)),
            "days" => {
                let days: u64 =
                    v.parse().map_err(|_| format!("days: expected a number of days, found `{v}`"))?;
                body.not_after = Some(unix_now()?.saturating_add(days.saturating_mul(86400)));
            }
            "not-after" => {
                let t: u64 = v
                    .parse()
                    .map_err(|_| format!("not-after: expected seconds since the epoch, found `{v}`"))?;
                body.not_after = Some(t);
            }
            other => {
                return Err(format!(
                    "expected network, host, public-key, claim-key, addr, groups, days or not-after, found `{other}`"
                ))
            }
        }
    }
    if body.not_after.is_none() {
        body.not_after = Some(unix_now()?.saturating_add(DEFAULT_CERT_DAYS * 86_400));
    }
    if body.not_after == Some(0) {
        // `not-after 0`: asked for in so many words, a certificate without end.
        body.not_after = None;
    }
    key.sign(&body).map_err(|e| e.to_string())
}

/// `revoke NETKEYFILE network N host H [cert ID]`: a revocation signed by
/// the network key, printed as the store's key and value (`etcdctl put
/// $(vnetctl revoke ...)` writes it; every host drops the host as the
/// watch brings it). Without `cert`, every certificate of the host.
fn revoke(file: &str, words: &[&str]) -> Result<String, String> {
    use vnet_cluster::trust::{NetworkKey, Revocation};
    let text = vnet_client::keys::read_secret(std::path::Path::new(file), "the network key", 1024)
        .map_err(|e| e.to_string())?;
    let key = NetworkKey::from_base64(&text).map_err(|e| format!("{file}:1:1: {e}"))?;
    let mut r = Revocation { network: String::new(), host: String::new(), cert: None, at: unix_now()? };
    for pair in words.chunks(2) {
        let [k, v] = pair else { return Err(format!("`{}` needs a value", pair[0])) };
        match *k {
            "network" => r.network = v.to_string(),
            "host" => r.host = v.to_string(),
            "cert" => r.cert = Some(v.to_string()),
            other => return Err(format!("expected network, host or cert, found `{other}`")),
        }
    }
    let value = key.revoke(&r).map_err(|e| e.to_string())?;
    Ok(format!("{} {value}", r.key()))
}

/// `policy NETKEYFILE network N FILE [serial S]`: FILE's `policy`, `rule`
/// and `group` lines signed by the network key, printed as the store's key
/// and value (`etcdctl put $(vnetctl policy ...)`; every host of the
/// network enforces it as the watch brings it). The serial is the time
/// (seconds since the epoch) unless told: a host takes only a policy whose
/// serial is higher than the one it holds.
fn policy(file: &str, words: &[&str]) -> Result<String, String> {
    use vnet_cluster::trust::{NetworkKey, PolicyBody};
    let text = vnet_client::keys::read_secret(std::path::Path::new(file), "the network key", 1024)
        .map_err(|e| e.to_string())?;
    let key = NetworkKey::from_base64(&text).map_err(|e| format!("{file}:1:1: {e}"))?;
    let (mut network, mut serial, mut lines) = (None, None, None);
    let mut rest = words;
    while let [k, more @ ..] = rest {
        match (*k, more) {
            ("network", [v, tail @ ..]) => (network, rest) = (Some(v.to_string()), tail),
            ("serial", [v, tail @ ..]) => {
                let n: u64 = v.parse().map_err(|_| format!("serial: expected a number, found `{v}`"))?;
                (serial, rest) = (Some(n), tail);
            }
            ("network" | "serial", []) => return Err(format!("`{k}` needs a value")),
            (path, tail) if lines.is_none() => {
                let t = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
                (lines, rest) = (Some((path.to_string(), t)), tail);
            }
            (other, _) => return Err(format!("expected network, serial or one FILE, found `{other}`")),
        }
    }
    let network = network.ok_or("expected `network NAME`")?;
    let (path, lines) = lines.ok_or("expected the FILE of policy, rule and group lines")?;
    let body = PolicyBody {
        network,
        serial: match serial {
            Some(s) => s,
            None => unix_now()?,
        },
        lines,
    };
    let value = key.sign_policy(&body).map_err(|e| format!("{path}: {e}"))?;
    Ok(format!("{} {value}", vnet_cluster::layout::policy_key(&body.network)))
}

/// A host certificate's lifetime unless `days` or `not-after` says
/// otherwise: a year. A certificate that never expires outlives the host
/// and any key that leaked from it; a year keeps renewal a yearly chore
/// (`show cluster` shows the days left, and a metric counts those under 30).
const DEFAULT_CERT_DAYS: u64 = 365;

fn unix_now() -> Result<u64, String> {
    Ok(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs())
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
            "52:54:00:00:00:02 to unix:/c.sock via 10.0.0.3 hosts unix:/a.sock,tcp:9001 wait 30 interface vm2 netdev c2 mode poll",
        ))
        .unwrap();
        assert_eq!(m.wait, Some(std::time::Duration::from_secs(30)));
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
            "52:54:00:00:00:02 to unix:/c wait -1 interface a tap b",
        ] {
            assert!(parse_move(&words(bad)).is_err(), "{bad}");
        }
    }
}
