//! MAC addresses.

use core::fmt;
use core::str::FromStr;

/// A 48-bit IEEE 802 MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// Reads an address from the first six bytes of `b`; `None` if shorter.
    pub fn from_bytes(b: &[u8]) -> Option<MacAddr> {
        let a: [u8; 6] = b.get(..6)?.try_into().ok()?;
        Some(MacAddr(a))
    }

    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// Group (multicast or broadcast) addresses have the I/G bit set.
    pub fn is_group(&self) -> bool {
        self.0[0] & 1 == 1
    }

    /// A unicast address that is locally administered, as vnet makes up.
    pub fn is_local_unicast(&self) -> bool {
        self.0[0] & 0b11 == 0b10
    }

    pub fn octets(&self) -> [u8; 6] {
        self.0
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", a[0], a[1], a[2], a[3], a[4], a[5])
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why a string is not a MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("expected a MAC address like 52:54:00:12:34:56")]
pub struct ParseMacError;

impl FromStr for MacAddr {
    type Err = ParseMacError;

    /// Accepts six hex octets of one or two digits separated by `:` or `-`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let sep = if s.contains('-') { '-' } else { ':' };
        let mut out = [0u8; 6];
        let mut n = 0;
        for part in s.split(sep) {
            if n == 6 || part.is_empty() || part.len() > 2 || !part.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(ParseMacError);
            }
            out[n] = u8::from_str_radix(part, 16).map_err(|_| ParseMacError)?;
            n += 1;
        }
        if n != 6 {
            return Err(ParseMacError);
        }
        Ok(MacAddr(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print() {
        let m: MacAddr = "52:54:0:a:BC:ff".parse().unwrap();
        assert_eq!(m.0, [0x52, 0x54, 0, 0x0a, 0xbc, 0xff]);
        assert_eq!(m.to_string(), "52:54:00:0a:bc:ff");
        assert_eq!("52-54-00-0a-bc-ff".parse::<MacAddr>(), Ok(m));
    }

    #[test]
    fn rejects() {
        for s in [
            "",
            "52:54:00:0a:bc",
            "52:54:00:0a:bc:ff:00",
            "52:54:00:0a:bc:fff",
            "52:54:00:0a:bc:",
            "g2:54:00:0a:bc:ff",
            "52:54:00-0a:bc:ff",
            "+2:54:00:0a:bc:ff",
        ] {
            assert!(s.parse::<MacAddr>().is_err(), "{s}");
        }
    }

    #[test]
    fn from_bytes_octets_and_debug() {
        assert_eq!(MacAddr::from_bytes(&[1, 2, 3, 4, 5]), None);
        let m = MacAddr::from_bytes(&[1, 2, 3, 4, 5, 6, 7]).unwrap();
        assert_eq!(m.octets(), [1, 2, 3, 4, 5, 6]);
        assert_eq!(format!("{m:?}"), "01:02:03:04:05:06");
        // A part of three digits, alone: refused (not only with another fault).
        assert!("52:54:00:0a:bc:0ff".parse::<MacAddr>().is_err());
    }

    #[test]
    fn classes() {
        assert!(MacAddr::BROADCAST.is_broadcast() && !MacAddr([0x01, 0, 0x5e, 0, 0, 1]).is_broadcast());
        assert!(!MacAddr([0x03, 0, 0, 0, 0, 1]).is_local_unicast(), "a local group address");
        assert!(!MacAddr([0x00, 0x1b, 0x21, 0, 0, 1]).is_local_unicast(), "a global address");
        assert!(MacAddr::BROADCAST.is_group());
        assert!(MacAddr([0x01, 0, 0x5e, 0, 0, 1]).is_group());
        assert!(!MacAddr([0x52, 0, 0, 0, 0, 1]).is_group());
        assert!(MacAddr([0x52, 0, 0, 0, 0, 1]).is_local_unicast());
    }
}
