//! Where in a transaction's commands an error points: what every
//! resource's acquire phase names in the errors it returns.

use vnet_control::{Command, Located, Pos};

/// A transaction's commands, for the positions of its errors.
pub(super) struct Positions<'a>(pub(super) &'a [Located<Command>]);

impl Positions<'_> {
    /// Where interface `name` was declared.
    pub(super) fn decl(&self, name: &str) -> Pos {
        self.0
            .iter()
            .find(|c| matches!(&c.item, Command::Interface { name: n, .. } if n == name))
            .map_or(Default::default(), |c| c.pos)
    }

    /// The last command `pick` chooses.
    pub(super) fn last(&self, pick: fn(&Command) -> bool) -> Pos {
        self.0.iter().rev().find(|c| pick(&c.item)).map_or(Default::default(), |c| c.pos)
    }
}
