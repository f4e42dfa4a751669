//! `show drops [N] [since SEQ] [json]`: the last drops vnetd recorded,
//! with their reasons (`vnetctl show drops`), or those numbered SEQ on
//! (what `vnetctl monitor drops` polls for).

pub use crate::recent::{DEFAULT_LAST, MAX_LAST};

/// What `show drops` asks for ([`crate::recent`]).
pub type DropsQuery = crate::recent::RecentQuery;

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
        assert_eq!(one(&q.line("drops")), Command::Drops(q));
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
