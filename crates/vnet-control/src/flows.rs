//! `show flows [N] [since SEQ] [json]`: the last flow records vnetd's flow
//! log wrote (`vnetd --flow-log`), or those numbered SEQ on (what `vnetctl
//! monitor flows` polls for).

use std::fmt;

/// Records listed when no number is given.
pub const DEFAULT_LAST: u32 = 20;
/// The most records one reply lists (and vnetd keeps).
pub const MAX_LAST: u32 = 4096;

/// What `show flows` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowsQuery {
    /// The newest `last` records (of those numbered `since` on, if given).
    pub last: u32,
    pub since: Option<u64>,
    pub json: bool,
}

impl Default for FlowsQuery {
    fn default() -> Self {
        FlowsQuery { last: DEFAULT_LAST, since: None, json: false }
    }
}

impl fmt::Display for FlowsQuery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "show flows {}", self.last)?;
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
    fn show_flows_parses_its_count_cursor_and_json_and_writes_back_the_same() {
        assert_eq!(one("show flows"), Command::Flows(FlowsQuery::default()));
        let q = FlowsQuery { last: 5, since: Some(1 << 40), json: true };
        assert_eq!(one("show flows 5 since 1099511627776 json"), Command::Flows(q));
        assert_eq!(one(&q.to_string()), Command::Flows(q));
        assert_eq!(
            one("show flows json"),
            Command::Flows(FlowsQuery { json: true, ..FlowsQuery::default() })
        );
        assert!(crate::parse("show flows 0").is_err());
        assert!(crate::parse("show flows 4097").is_err());
        assert!(crate::parse("show flows since x").is_err());
        assert_eq!(one("show flows").class(), crate::ast::Class::Query);
    }
}
