//! `show drops [N] [since SEQ] [json]`: the last drops vnetd recorded,
//! with their reasons (`vnetctl show drops`), or those numbered SEQ on
//! (what `vnetctl monitor drops` polls for).

use std::fmt;

/// Drops listed when no number is given.
pub const DEFAULT_LAST: u32 = 20;
/// The most drops one reply lists.
pub const MAX_LAST: u32 = 4096;

/// What `show drops` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropsQuery {
    /// The newest `last` drops (of those numbered `since` on, if given).
    pub last: u32,
    /// Only drops numbered this or later: a monitor's poll, which also
    /// tells vnetd someone watches (the kernel path then sends events).
    pub since: Option<u64>,
    pub json: bool,
}

impl Default for DropsQuery {
    fn default() -> Self {
        DropsQuery { last: DEFAULT_LAST, since: None, json: false }
    }
}

impl fmt::Display for DropsQuery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "show drops {}", self.last)?;
        if let Some(s) = self.since {
            write!(f, " since {s}")?;
        }
        if self.json {
            f.write_str(" json")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ast::Command;

    fn one(line: &str) -> Command {
        let mut v = crate::parse(line).expect("parses");
        assert_eq!(v.len(), 1);
        v.remove(0).item
    }

    #[test]
    fn show_drops_parses_its_count_cursor_and_json_and_writes_back_the_same() {
        assert_eq!(one("show drops"), Command::Drops(DropsQuery::default()));
        let q = DropsQuery { last: 5, since: Some(1 << 40), json: true };
        assert_eq!(one("show drops 5 since 1099511627776 json"), Command::Drops(q));
        assert_eq!(one(&q.to_string()), Command::Drops(q));
        assert_eq!(
            one("show drops json"),
            Command::Drops(DropsQuery { json: true, ..DropsQuery::default() })
        );
        for bad in ["show drops 0", "show drops 4097", "show drops since x", "show drops 3 extra"] {
            assert!(crate::parse(bad).is_err(), "{bad}");
        }
        assert!(!Command::Drops(q).is_change());
    }
}
