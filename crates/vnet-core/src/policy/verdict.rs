//! What a policy decides ([`Verdict`], [`Why`]), and the second table of
//! flows a data path may keep beside the engine's ([`FlowMirror`]).

use super::isolation;
use super::key::FlowKey;
use std::sync::Arc;

/// Why a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The network has no policy.
    NoPolicy,
    /// The rule at this index.
    Rule(usize),
    Default,
    /// A further packet of an allowed flow.
    Established,
    /// A reply of an allowed flow.
    Reply,
    /// An ICMP error about an allowed flow.
    Related,
    /// A later fragment of an allowed packet.
    Fragment,
    /// Unreadable ([`vnet_wire::classify::Unclassifiable`]).
    Unclassifiable,
    /// A later fragment whose first was not allowed.
    OrphanFragment,
    /// Allowed by the rules (or the default), denied by a NetworkPolicy's
    /// isolation of one end ([`isolation`]).
    Isolated(isolation::Denied),
}

/// A decision: allowed or not, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub allow: bool,
    pub why: Why,
}

/// What a [`Judge`] decided of a packet no flow carries: the verdict, and
/// the name of the rule that gave it, for a flow log's account (the
/// default's name for the default; `None`: no rule's, a NetworkPolicy's
/// isolation denied it).
#[derive(Debug, Clone, Copy)]
pub struct Judged<'a> {
    pub verdict: Verdict,
    pub rule: Option<&'a Arc<str>>,
}

/// What judges a packet that neither the engine's flows nor a mirror's
/// know: a network's rules ([`super::rules::Rules`]).
pub trait Judge<'a> {
    fn judge(&mut self) -> Judged<'a>;
}

/// A mirror's answer to [`FlowMirror::known_or`].
#[derive(Debug, Clone, Copy)]
pub enum Known<'a> {
    /// The mirror saw the flow (or its reply) within its idle time; `kept`:
    /// whether it keeps it on (offered again, when asked to).
    Fresh { kept: bool },
    /// It did not: the judge's judgement, and whether the mirror keeps
    /// the flow (offered, when asked to and allowed).
    Judged { judged: Judged<'a>, kept: bool },
}

/// A second table of allowed flows kept beside [`super::Flows`] by a data path
/// that forwards a flow's further packets and replies itself, without
/// the engine (vnetd's kernel path: its eBPF `flows` map). The engine
/// judges every new flow and offers the mirror each flow it allows
/// (again every [`super::flows::OFFER_S`] seconds while the engine still sees
/// it); the mirror passes nothing it was not offered. The engine asks the
/// mirror before it judges a packet it knows no flow for: a flow the
/// mirror carried alone for longer than the engine's idle time is still
/// the flow it was. So a flow is known while either table saw it within
/// its idle time, whichever path its packets took.
///
/// The engine's table asks the mirror in one call around the judgement
/// ([`FlowMirror::known_or`]): the mirror is asked before the rules and
/// told after them, and neither table is entered twice for one packet
/// (docs/ARCHITECTURE.md, "A policy decision").
pub trait FlowMirror: Send + Sync + std::fmt::Debug {
    /// Whether `k` or its reply (`k` reversed) is a flow the mirror saw
    /// within its idle time.
    fn fresh(&self, k: &FlowKey) -> bool;
    /// Flow `k` was allowed (or seen) now: the mirror may pass its further
    /// packets and its replies. It may not keep it (full, or failing):
    /// whether it did.
    fn offer(&self, k: &FlowKey) -> bool;
    /// Flow `k` as the mirror knows it: fresh (as [`FlowMirror::fresh`]
    /// says), or else judged by `judge`. With `keep`, a flow fresh or
    /// allowed is offered (as [`FlowMirror::offer`]) before the answer.
    fn known_or<'a>(&self, k: &FlowKey, keep: bool, judge: &mut dyn Judge<'a>) -> Known<'a>;
}
