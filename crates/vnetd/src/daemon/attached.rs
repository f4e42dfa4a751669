//! Interfaces made by `attach` outlive a vnetd restart.
//!
//! A CNI plugin or libvirt's hook attaches an interface once, when its
//! container or VM starts; neither runs again when vnetd restarts (a
//! package upgrade, a crash), and the interface is not in the config file.
//! So the daemon keeps the names `attach` made (and `detach` did not take
//! away) in the state directory, file `attached`, as the interface lines
//! they run with (`standby` included while waiting), rewritten atomically
//! after each change; at the start, after the config file, each line is
//! attached again, as its plugin would. A line whose device is gone (its
//! container was deleted while vnetd was down: a `DEL` with no vnetd is no
//! error) is dropped and logged, never a failed start. The `neigh` lines of
//! the attached interfaces' MACs (a CNI plugin's addresses, answered at the
//! edge) follow them in the file and are applied after them, those of an
//! interface not attached again dropped.

use super::file::write_atomically;
use super::Daemon;
use std::collections::BTreeSet;
use vnet_control::{Command, Located};

/// The file's name in the state directory.
pub const FILE: &str = "attached";

impl Daemon {
    /// Keeps attachments in `dir` and attaches those it holds again;
    /// returns what to log (one line per attachment dropped).
    pub fn restore_attached(&mut self, dir: &std::path::Path) -> Vec<String> {
        let path = dir.join(FILE);
        self.ifaces.attachments.path = Some(path.clone());
        use std::os::unix::fs::DirBuilderExt as _;
        if let Err(e) = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
            return vec![format!("{}: {e}; attachments are not kept", dir.display())];
        }
        let mut said = Vec::new();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return said,
            Err(e) => return vec![format!("{}: {e}; no attachment restored", path.display())],
        };
        let mut neighbors = Vec::new();
        for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let at = format!("{}:{}", path.display(), n + 1);
            let cmd = match vnet_control::parse_line(line, n as u32 + 1, &mut Default::default()) {
                Ok(Some(Located { item: decl @ Command::Interface { .. }, pos })) => (decl, pos),
                Ok(Some(neigh @ Located { item: Command::Neigh(_), .. })) => {
                    neighbors.push((at, neigh));
                    continue;
                }
                Ok(_) => {
                    said.push(format!("{at}: not an interface line; dropped"));
                    continue;
                }
                Err(e) => {
                    said.push(format!("{at}: {e}; dropped"));
                    continue;
                }
            };
            let (decl, pos) = cmd;
            let Command::Interface { name, .. } = &decl else { continue };
            let name = name.clone();
            let cmds = vnet_control::attach::attach(&self.state, pos, &decl);
            match self.apply(&cmds) {
                Ok(()) => {
                    self.ifaces.attachments.names.insert(name);
                }
                Err(e) => said.push(format!("{at}: attaching {name} again failed ({e}); dropped")),
            }
        }
        for (at, neigh) in neighbors {
            let Command::Neigh(n) = &neigh.item else { continue };
            if !self.attached_macs().contains(&(n.network, n.mac)) {
                said.push(format!("{at}: {} is no attached interface's; dropped", n.mac));
            } else if let Err(e) = self.apply(std::slice::from_ref(&neigh)) {
                said.push(format!("{at}: {e}; dropped"));
            }
        }
        if let Some(e) = self.save_attached() {
            said.push(e);
        }
        said
    }

    /// Notes that `attach` made `name` (`true`) or `detach` took it away,
    /// and writes the file; an error, for the log.
    pub fn note_attached(&mut self, name: &str, present: bool) -> Option<String> {
        if present {
            self.ifaces.attachments.names.insert(name.to_string());
        } else {
            self.ifaces.attachments.names.remove(name);
        }
        self.save_attached()
    }

    /// The attached interfaces' (network, MAC)s.
    fn attached_macs(&self) -> BTreeSet<(u32, vnet_wire::MacAddr)> {
        let ifaces = self.ifaces.attachments.names.iter().filter_map(|n| self.state.iface_by_name(n));
        ifaces.filter_map(|i| Some((i.network, i.mac?))).collect()
    }

    /// Writes the file: the attached interfaces as they run now (one a
    /// `delete interface` took away is forgotten).
    pub fn save_attached(&mut self) -> Option<String> {
        let path = self.ifaces.attachments.path.clone()?;
        let state = &self.state;
        self.ifaces.attachments.names.retain(|n| state.iface_by_name(n).is_some());
        let mut text: String = self
            .ifaces
            .attachments
            .names
            .iter()
            .filter_map(|n| state.iface_by_name(n))
            .map(|i| i.to_line() + "\n")
            .collect();
        let macs = self.attached_macs();
        for (&(network, ip), &mac) in &state.neighbors.0 {
            if macs.contains(&(network, mac)) {
                text += &(vnet_control::neigh::Neigh { ip, mac, network }.to_line() + "\n");
            }
        }
        write_atomically(&path, text.as_bytes()).err().map(|e| format!("{}: {e}", path.display()))
    }
}
