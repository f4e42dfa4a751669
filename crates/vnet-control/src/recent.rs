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
