//! `show drops|flows [N] [since SEQ] [json]`: the last records of one of
//! vnetd's rings (its drops, its flow log's records), or those numbered SEQ
//! on (what `vnetctl monitor` polls for). One query, two words.

/// Records listed when no number is given.
pub const DEFAULT_LAST: u32 = 20;
/// The most records one reply lists (and vnetd keeps of each).
pub const MAX_LAST: u32 = 4096;

/// What `show drops` or `show flows` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecentQuery {
    /// The newest `last` records (of those numbered `since` on, if given).
    pub last: u32,
    /// Only records numbered this or later: a monitor's poll (for drops it
    /// also tells vnetd someone watches: the kernel path then sends events).
    pub since: Option<u64>,
    pub json: bool,
}

impl Default for RecentQuery {
    fn default() -> Self {
        RecentQuery { last: DEFAULT_LAST, since: None, json: false }
    }
}

impl RecentQuery {
    /// The control line asking this of `word`'s ring (`drops`, `flows`).
    pub fn line(&self, word: &str) -> String {
        let mut s = format!("show {word} {}", self.last);
        if let Some(since) = self.since {
            s.push_str(&format!(" since {since}"));
        }
        if self.json {
            s.push_str(" json");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ast::{Class, Command};

    fn one(line: &str) -> Command {
        let mut v = crate::parse(line).expect("parses");
        assert_eq!(v.len(), 1);
        v.remove(0).item
    }

    /// `show drops` and `show flows`: each parses its count, cursor and
    /// json, writes back the same line, refuses what is out of range, and
    /// is a query.
    #[test]
    fn show_drops_and_flows_parse_their_count_cursor_and_json_and_write_back_the_same() {
        let words = [("drops", Command::Drops as fn(RecentQuery) -> Command), ("flows", Command::Flows)];
        for (word, command) in words {
            assert_eq!(one(&format!("show {word}")), command(RecentQuery::default()));
            let q = RecentQuery { last: 5, since: Some(1 << 40), json: true };
            assert_eq!(one(&format!("show {word} 5 since 1099511627776 json")), command(q));
            assert_eq!(one(&q.line(word)), command(q));
            assert_eq!(
                one(&format!("show {word} json")),
                command(RecentQuery { json: true, ..RecentQuery::default() })
            );
            for bad in ["0", "4097", "since x", "3 extra"] {
                let bad = format!("show {word} {bad}");
                assert!(crate::parse(&bad).is_err(), "{bad}");
            }
            assert!(!command(q).is_change());
            assert_eq!(one(&format!("show {word}")).class(), Class::Query);
        }
    }
}
