//! `neigh IP MAC [network N]`: an address the host answers address
//! resolution for at the edge (ARP for IPv4, neighbour discovery for IPv6),
//! instead of flooding the question to every host of the network. The
//! answer says what the owner would: `IP is at MAC`. `delete neigh IP
//! [network N]` withdraws it.
//!
//! [`Neighbors`] is the declared table, by network and address: one MAC
//! each (a new line for the same address replaces the MAC, as an ARP cache
//! would take a newer answer).

use crate::{Error, Pos, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use vnet_wire::MacAddr;

/// A `neigh` line's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neigh {
    pub ip: IpAddr,
    pub mac: MacAddr,
    /// The network (tenant) whose VMs are answered (0 unless given).
    pub network: u32,
}

impl Neigh {
    /// The line that declares it.
    pub fn to_line(&self) -> String {
        let mut s = format!("neigh {} {}", self.ip, self.mac);
        if self.network != 0 {
            let _ = write!(s, " network {}", self.network);
        }
        s
    }
}

/// An address that can be answered for: not multicast, broadcast or unspecified.
pub fn check_ip(pos: Pos, ip: IpAddr) -> Result<IpAddr> {
    let bad = match ip {
        IpAddr::V4(a) => a.is_unspecified() || a.is_multicast() || a.is_broadcast(),
        IpAddr::V6(a) => a.is_unspecified() || a.is_multicast(),
    };
    if bad {
        return Err(Error::new(pos, "a unicast IP address", format!("`{ip}`")));
    }
    Ok(ip)
}

/// A MAC that can be an answer: not a group address.
pub fn check_mac(pos: Pos, mac: MacAddr) -> Result<MacAddr> {
    if mac.is_group() {
        return Err(Error::new(pos, "a unicast MAC", format!("`{mac}`")));
    }
    Ok(mac)
}

/// Neighbours by (network, address).
pub type Table = BTreeMap<(u32, IpAddr), MacAddr>;

/// The declared neighbours, by (network, address).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Neighbors(pub Table);

impl Neighbors {
    /// `neigh`: declares (or redeclares) one. A multicast, broadcast or
    /// unspecified address, or a group MAC, is never an answer.
    pub fn add(&mut self, pos: Pos, n: &Neigh) -> Result<()> {
        check_ip(pos, n.ip)?;
        check_mac(pos, n.mac)?;
        self.0.insert((n.network, n.ip), n.mac);
        Ok(())
    }

    /// `delete neigh IP [network N]`.
    pub fn remove(&mut self, pos: Pos, ip: IpAddr, network: u32) -> Result<()> {
        match self.0.remove(&(network, ip)) {
            Some(_) => Ok(()),
            None => Err(Error::new(pos, "a declared neighbour", format!("`{ip}` in network {network}"))),
        }
    }

    /// The declarations, as lines.
    pub fn lines(&self) -> impl Iterator<Item = String> + '_ {
        self.0.iter().map(|(&(network, ip), &mac)| Neigh { ip, mac, network }.to_line())
    }

    /// The lines that turn `self` into `to`: deletions of what `to` lacks,
    /// then what `to` has otherwise or new.
    pub fn diff(&self, to: &Neighbors) -> String {
        let mut t = String::new();
        for &(network, ip) in self.0.keys().filter(|k| !to.0.contains_key(k)) {
            let _ = write!(t, "delete neigh {ip}");
            if network != 0 {
                let _ = write!(t, " network {network}");
            }
            t.push('\n');
        }
        for (&(network, ip), &mac) in &to.0 {
            if self.0.get(&(network, ip)) != Some(&mac) {
                let _ = writeln!(t, "{}", Neigh { ip, mac, network }.to_line());
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use crate::{Command, State};

    fn state(text: &str) -> crate::Result<State> {
        State::default().apply_all(&crate::parse(text)?)
    }

    #[test]
    fn neighbours_are_declared_replaced_deleted_and_written_back() {
        let s = state(
            "neigh 10.0.0.2 52:54:00:00:00:02\nneigh fd00::2 52:54:00:00:00:02 network 7\n\
             neigh 10.0.0.3 52:54:00:00:00:03\nneigh 10.0.0.3 52:54:00:00:00:04\n",
        )
        .unwrap();
        assert_eq!(s.neighbors.0.len(), 3);
        let conf = s.to_config();
        for line in [
            "neigh 10.0.0.2 52:54:00:00:00:02\n",
            "neigh 10.0.0.3 52:54:00:00:00:04\n",
            "neigh fd00::2 52:54:00:00:00:02 network 7\n",
        ] {
            assert!(conf.contains(line), "{conf}");
        }
        assert_eq!(state(&conf).unwrap(), s, "the written configuration reads back the same");
        let s2 = s.apply_all(&crate::parse("delete neigh fd00::2 network 7\n").unwrap()).unwrap();
        assert_eq!(s2.neighbors.0.len(), 2);
        // The diff turns one into the other.
        let d = s.diff(&s2, &|_| false);
        assert_eq!(d, "delete neigh fd00::2 network 7\n");
        assert_eq!(s.apply_all(&crate::parse(&d).unwrap()).unwrap(), s2);
        let back = s2.diff(&s, &|_| false);
        assert_eq!(s2.apply_all(&crate::parse(&back).unwrap()).unwrap(), s);
    }

    #[test]
    fn what_is_never_an_answer_is_refused_with_its_place() {
        for (text, col, expected) in [
            ("neigh 10.0.0.255 ff:ff:ff:ff:ff:ff", 18, "a unicast MAC"),
            ("neigh 224.0.0.1 52:54:00:00:00:02", 7, "a unicast IP address"),
            ("neigh ff02::1 52:54:00:00:00:02", 7, "a unicast IP address"),
            ("neigh 0.0.0.0 52:54:00:00:00:02", 7, "a unicast IP address"),
            ("delete neigh 10.0.0.9", 14, "a declared neighbour"),
        ] {
            let e = state(text).unwrap_err();
            assert!(e.expected.contains(expected) && e.pos.column == col, "{text}: {e}");
        }
        for (text, want) in [
            ("neigh 10.0.0.2", "a MAC address"),
            ("neigh 52:54:00:00:00:02 10.0.0.2", "an IP address"),
            ("neigh 10.0.0.2 52:54:00:00:00:02 network", "a network id"),
            ("neigh 10.0.0.2 52:54:00:00:00:02 vlan 3", "`network`"),
        ] {
            let e = crate::parse(text).unwrap_err();
            assert!(e.expected.contains(want), "{text}: {e}");
        }
        assert!(matches!(
            crate::parse("neigh 10.0.0.2 52:54:00:00:00:02").unwrap()[0].item,
            Command::Neigh(_)
        ));
        assert!(crate::parse("neigh 10.0.0.2 52:54:00:00:00:02").unwrap()[0].item.is_change());
    }
}
