//! `show flows [N] [since SEQ] [json]`: the last flow records vnetd's flow
//! log wrote (`vnetd --flow-log`), or those numbered SEQ on (what `vnetctl
//! monitor flows` polls for).

pub use crate::recent::{DEFAULT_LAST, MAX_LAST};

/// What `show flows` asks for ([`crate::recent`]).
pub type FlowsQuery = crate::recent::RecentQuery;

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
        assert_eq!(one(&q.line("flows")), Command::Flows(q));
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
