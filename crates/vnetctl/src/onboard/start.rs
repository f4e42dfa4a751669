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
    match std::process::Command::new(systemctl).args(["enable", "--now", &unit]).status() {
        Ok(s) if s.success() => Ok(format!("{joined}; {unit} started")),
        Ok(s) if systemd => Err(format!(
            "{joined}, but `systemctl enable --now {unit}` failed ({s}): see `systemctl status {unit}` and \
             `journalctl -u {unit}`; the host is in, start {unit} once that is fixed"
        )),
        Ok(_) | Err(_) => Ok(by_hand),
    }
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
        for systemctl in ["/nonexistent/systemctl", "false"] {
            let said = start_with(systemctl, false, "lab", "h1", conf).unwrap();
            assert!(said.starts_with("host h1 joined network lab: /etc/vnet/lab.conf written"), "{said}");
            assert!(said.contains("systemd does not run here") && said.contains(&cmd), "{said}");
        }
        let said = start_with("false", true, "lab", "h1", conf).unwrap_err();
        assert!(
            said.starts_with("host h1 joined network lab") && said.contains("systemctl status vnetd@lab"),
            "{said}"
        );
        // The control: a systemctl that works starts the unit.
        assert!(start_with("true", true, "lab", "h1", conf).unwrap().ends_with("vnetd@lab started"));
    }
}
