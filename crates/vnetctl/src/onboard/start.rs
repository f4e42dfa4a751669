//! `join`'s last step: `vnetd@NET` started, or, where systemd does not
//! run, the host joined all the same and the exact command that starts
//! vnetd as the unit would (so `vnetctl` finds it at the unit's socket).

use std::path::Path;

/// What the package's unit runs for `vnetd@NET` (packaging/vnetd@.service's
/// ExecStart, with the config file `join` wrote); the test below holds the
/// two together.
pub fn vnetd_command(network: &str, conf: &Path) -> String {
    format!(
        "mkdir -p -m 0700 /run/vnet /var/lib/vnet/{network} && vnetd --config {} --control unix:/run/vnet/{network}.sock \
         --state-dir /var/lib/vnet/{network}",
        conf.display()
    )
}

/// Whether systemd runs this machine (sd_booted(3): its runtime directory).
fn systemd_runs() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// Starts `vnetd@NET` with `systemctl enable --now`. `Ok`: what was done,
/// or, without systemd, the command to run (the host is in either way).
/// `Err`: systemd runs and could not start it.
pub fn start(network: &str, host: &str, conf: &Path) -> Result<String, String> {
    start_with("systemctl", systemd_runs(), network, host, conf)
}

fn start_with(
    systemctl: &str,
    systemd: bool,
    network: &str,
    host: &str,
    conf: &Path,
) -> Result<String, String> {
    let unit = format!("vnetd@{network}");
    let joined = format!("host {host} joined network {network}: {} written", conf.display());
    let by_hand = format!(
        "{joined}; systemd does not run here, so vnetd is not started: start it with\n  {}\n\
         (as the unit would: vnetctl finds it at unix:/run/vnet/{network}.sock)",
        vnetd_command(network, conf)
    );
    let ran = std::process::Command::new(systemctl)
        .args(["enable", "--now", &unit])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output();
    match ran {
        Ok(o) if o.status.success() => Ok(format!("{joined}; {unit} started")),
        // No systemd to talk to: systemctl says so (it is not PID 1, or
        // its bus is not there).
        Ok(o) if !systemd && no_systemd(&String::from_utf8_lossy(&o.stderr)) => Ok(by_hand),
        Ok(o) => Err(format!(
            "{joined}, but `systemctl enable --now {unit}` failed ({}): {}see `systemctl status {unit}` and \
             `journalctl -u {unit}`; the host is in, start {unit} once that is fixed",
            o.status,
            match String::from_utf8_lossy(&o.stderr).trim() {
                "" => String::new(),
                e => format!("{e}\n"),
            }
        )),
        // No systemctl at all.
        Err(_) => Ok(by_hand),
    }
}

/// Whether systemctl's error says there is no systemd to talk to (a
/// container, a chroot, a machine booted without it), rather than that
/// the unit failed.
fn no_systemd(stderr: &str) -> bool {
    ["not been booted with systemd", "Failed to connect to bus", "System has not been booted"]
        .iter()
        .any(|s| stderr.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command printed without systemd is the unit's ExecStart, its
    /// `%i` the network, with the directories systemd would make.
    #[test]
    fn the_command_without_systemd_is_the_units() {
        let unit =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/vnetd@.service"))
                .unwrap();
        let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).unwrap();
        let want = exec.replace("%i", "lab").replace("/usr/sbin/vnetd", "vnetd");
        let cmd = vnetd_command("lab", Path::new("/etc/vnet/lab.conf"));
        assert!(cmd.ends_with(&want), "{cmd}\n{want}");
        assert!(cmd.starts_with("mkdir -p -m 0700 /run/vnet /var/lib/vnet/lab && "), "{cmd}");
        let found = vnet_client::find::unit_socket(Path::new(vnet_client::find::UNIT_SOCKET_DIR), "lab");
        assert!(cmd.contains(&format!("unix:{}", found.display())), "{cmd}");
    }

    /// Without systemd (no systemctl, or one that cannot reach systemd):
    /// the host joined, exit 0, and the exact command. With systemd and a
    /// unit that fails: an error that still says the host joined.
    #[test]
    fn join_without_systemd_says_the_host_joined_and_the_command() {
        let conf = Path::new("/etc/vnet/lab.conf");
        let cmd = vnetd_command("lab", conf);
        // A systemctl that cannot reach systemd says so, as Debian's does
        // in a container.
        let dir = std::env::temp_dir().join(format!("vnetctl-start-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, format!("#!/bin/sh\necho '{text}' >&2\nexit 1\n")).unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
            p.display().to_string()
        };
        let unbooted = fake(
            "unbooted",
            "System has not been booted with systemd as init system (PID 1). Cannot operate.",
        );
        let failing = fake("failing", "vnetd@lab did not come up: no such file");
        for systemctl in ["/nonexistent/systemctl", unbooted.as_str()] {
            let said = start_with(systemctl, false, "lab", "h1", conf).unwrap();
            assert!(said.starts_with("host h1 joined network lab: /etc/vnet/lab.conf written"), "{said}");
            assert!(said.contains("systemd does not run here") && said.contains(&cmd), "{said}");
        }
        // A unit that fails is an error, with or without systemd detected,
        // and its systemctl's words are in it.
        for systemd in [true, false] {
            let said = start_with(&failing, systemd, "lab", "h1", conf).unwrap_err();
            assert!(
                said.starts_with("host h1 joined network lab")
                    && said.contains("systemctl status vnetd@lab")
                    && said.contains("did not come up"),
                "{said}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
        // The control: a systemctl that works starts the unit.
        assert!(start_with("true", true, "lab", "h1", conf).unwrap().ends_with("vnetd@lab started"));
    }
}
