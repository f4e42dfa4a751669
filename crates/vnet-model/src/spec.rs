//! MAC specs and the Palacios priority table.

use core::fmt;
use vnet_wire::MacAddr;

/// One side of a route: which MAC addresses it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MacSpec {
    /// Exactly this address (class DIRECT).
    Addr(MacAddr),
    /// Any address (class ANY).
    Any,
    /// Any address but this one (class NOT).
    Not(MacAddr),
    /// No address: the route never matches.
    None,
}

/// How a spec matched an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Not = 0,
    Any = 1,
    Direct = 2,
}

impl MacSpec {
    /// The class of `mac` under this spec, or `None` when it does not match.
    #[inline]
    pub fn class(&self, mac: MacAddr) -> Option<Class> {
        match *self {
            MacSpec::Addr(a) if a == mac => Some(Class::Direct),
            MacSpec::Any => Some(Class::Any),
            MacSpec::Not(a) if a != mac => Some(Class::Not),
            _ => None,
        }
    }

    /// The address a spec names, when it names one exactly.
    pub fn addr(&self) -> Option<MacAddr> {
        match *self {
            MacSpec::Addr(a) => Some(a),
            _ => None,
        }
    }
}

impl fmt::Display for MacSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MacSpec::Addr(a) => write!(f, "{a}"),
            MacSpec::Any => f.write_str("any"),
            MacSpec::Not(a) => write!(f, "not-{a}"),
            MacSpec::None => f.write_str("none"),
        }
    }
}

/// `PRIORITY[src][dst]`, indexed by [`Class`] (NOT, ANY, DIRECT), as in
/// Palacios `vnet_core.c`.
const PRIORITY: [[u8; 3]; 3] = [
    // dst:  NOT ANY DIRECT
    [3, 5, 7], // src NOT
    [5, 6, 6], // src ANY
    [7, 8, 8], // src DIRECT
];

/// The priority of a route whose specs matched with these classes.
#[inline]
pub fn priority(src: Class, dst: Class) -> u8 {
    PRIORITY[src as usize][dst as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_names_its_address_and_prints_as_the_config_writes_it() {
        let a = MacAddr([2, 0, 0, 0, 0, 1]);
        assert_eq!(MacSpec::Addr(a).addr(), Some(a));
        for s in [MacSpec::Any, MacSpec::Not(a), MacSpec::None] {
            assert_eq!(s.addr(), None, "{s}");
        }
        let shown: Vec<String> = [MacSpec::Addr(a), MacSpec::Any, MacSpec::Not(a), MacSpec::None]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(shown, ["02:00:00:00:00:01", "any", "not-02:00:00:00:00:01", "none"]);
    }

    #[test]
    fn every_cell_of_the_table() {
        use Class::*;
        let cells = [
            (Not, Not, 3),
            (Not, Any, 5),
            (Not, Direct, 7),
            (Any, Not, 5),
            (Any, Any, 6),
            (Any, Direct, 6),
            (Direct, Not, 7),
            (Direct, Any, 8),
            (Direct, Direct, 8),
        ];
        for (s, d, p) in cells {
            assert_eq!(priority(s, d), p, "{s:?} {d:?}");
        }
    }

    #[test]
    fn classes() {
        let a = MacAddr([2, 0, 0, 0, 0, 1]);
        let b = MacAddr([2, 0, 0, 0, 0, 2]);
        assert_eq!(MacSpec::Addr(a).class(a), Some(Class::Direct));
        assert_eq!(MacSpec::Addr(a).class(b), None);
        assert_eq!(MacSpec::Any.class(a), Some(Class::Any));
        assert_eq!(MacSpec::Not(a).class(b), Some(Class::Not));
        assert_eq!(MacSpec::Not(a).class(a), None);
        assert_eq!(MacSpec::None.class(a), None);
        assert_eq!(MacSpec::None.class(MacAddr::BROADCAST), None);
    }
}
