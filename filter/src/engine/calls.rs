//! The calls a worker's root context sends for the request path (lease refills, charges
//! of debt, settlements of check-mode estimates), as the request path hands them over
//! and as they wait for their answers. Sending them and applying the answers is
//! `outgoing.rs` (and `settlement.rs` for settlements).

use super::lease_record::{Charge, DEBT_LIFE};
use super::namespace;
use crate::due::DueQueue;
use shared_store::{Nanos, Placement};
use std::collections::BTreeMap;

/// A call the root context is to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outgoing {
    /// Ask for more tokens.
    Refill(Target, Asker),
    /// Report admissions made without the service (the units and id are claimed in the
    /// lease record when it is sent).
    Charge(Target),
    /// Settle a check-mode estimate at the service.
    Settle(Settlement),
}

/// A check-mode policy's estimate to settle at the service once the response reported
/// the actual cost: the excess charged, or the unused part credited. Its id makes a
/// settlement sent again (after a timeout) apply once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    pub(crate) policy: usize,
    /// The caller's global fingerprint.
    pub(crate) key: u128,
    /// The hash tag its counter lives under.
    pub(crate) tag: String,
    pub(crate) change: Change,
    pub(crate) id: u64,
    /// When it was first queued: one not applied within `DEBT_LIFE` is forgiven.
    pub(crate) since: Nanos,
    /// Why it moves the counter: what it counts once applied, or when it cannot be.
    pub(crate) purpose: Purpose,
    /// A credit's window (its `spent_at_ns` ÷ the limit's period): credits are summed
    /// only within one. 0 for a charge.
    pub(crate) window: u64,
}

/// Why a settlement moves the counter, which decides what it counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Purpose {
    /// A response cost more or less than its estimate: counted as `cost.charged` or
    /// `cost.credited` once applied, `cost.forgiven` when it cannot be.
    Cost,
    /// The whole spend of a check whose request a later stage rejected: nothing counted
    /// once applied, one `unrefunded` spend when it cannot be.
    Refund,
    /// Leased tokens this proxy will not spend, given back to the service
    /// (`lease_record::review`): counted as `lease.returned` once credited,
    /// `lease.expired` when they cannot be.
    Return,
}

/// Which way a settlement moves the counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Spend `units` more (`POST /v1/charge`): the response cost more than its estimate.
    Charge(u64),
    /// Give `units` back (`POST /v1/credit`), spent at `spent_at_ns` on the service's
    /// clock: the response cost less.
    Credit { units: u64, spent_at_ns: u64 },
}

impl Change {
    /// The units it moves.
    pub(crate) const fn units(self) -> u64 {
        match self {
            Self::Charge(units) | Self::Credit { units, .. } => units,
        }
    }

    /// The same change, moving `more` units more.
    pub(crate) const fn plus(self, more: u64) -> Self {
        match self {
            Self::Charge(units) => Self::Charge(units.saturating_add(more)),
            Self::Credit { units, spent_at_ns } => Self::Credit { units: units.saturating_add(more), spent_at_ns },
        }
    }
}

/// Who asked for a refill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// A request that spent and left the lease below its low-water mark.
    LowWater,
    /// A waiting request that needs `cost` tokens: they are held for it.
    Waiter {
        /// The waiting request's id.
        waiter: u64,
        /// What it costs.
        cost: u64,
    },
}

/// Whose lease a call is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub(crate) policy: usize,
    pub(crate) slot: Placement,
    pub(crate) key: u128,
    pub(crate) tag: String,
}

/// A call the root context sent, waiting for its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentOutgoing {
    /// The host's token.
    pub token: u32,
    /// After this, the answer will not come (the election has expired too).
    pub deadline: Nanos,
    pub(crate) sent_at: Nanos,
    pub(crate) call: Sent,
}

/// What was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Sent {
    Refill(Target, Asker),
    Charge(Target, Charge),
    Settle(Settlement),
}

impl SentOutgoing {
    /// Whether it was a refill (whose answer waiting requests may be waiting for).
    pub fn is_refill(&self) -> bool {
        matches!(self.call, Sent::Refill(..))
    }
}

/// A lease grant to review for tokens its proxy will not spend (`lease_return.rs`):
/// whose, when it expires, and when the service decided it (its clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Review {
    pub(crate) target: Target,
    pub(crate) expires_at: Nanos,
    pub(crate) at_ns: u64,
}

/// The grants a worker applied and has yet to review, by when each is due (a
/// [`DueQueue`] keyed by a serial number).
#[derive(Debug, Default)]
pub(crate) struct Reviews {
    due: DueQueue<Review>,
    next: u32,
}

impl Reviews {
    /// Holds `review` until `due`, unless `max` are held already; whether it is held.
    pub(crate) fn add(&mut self, due: Nanos, review: Review, max: usize) -> bool {
        if self.due.len() >= max {
            return false;
        }
        self.next = self.next.wrapping_add(1);
        self.due.insert(self.next, due, review);
        true
    }

    /// Takes the earliest review due at or before `now`.
    pub(crate) fn pop_due(&mut self, now: Nanos) -> Option<Review> {
        self.due.pop_due(now).map(|(_, review)| review)
    }
}

/// Keys this worker owes charges for, by slot key.
pub(crate) type PendingCharges = BTreeMap<String, Target>;

/// A check tag as the lease record keeps it: `Some` of the 128-bit hash, or `Some(None)`
/// for `"none"` (no partition); `None` when the tag names no counter: the request's
/// partition could not be read (its tag is empty), so nothing can be owed under it.
pub(crate) fn tag_bits(tag: &str) -> Option<Option<u128>> {
    if tag == "none" {
        return Some(None);
    }
    u128::from_str_radix(tag, 16).ok().map(Some)
}

/// The tag of a request whose partition could not be read: it names no counter, so
/// what the failure rule admits under it is owed nowhere (forgiven, and counted).
pub(crate) const UNREAD_TAG: &str = "";

/// How long the service is asked to remember the id of a charge or a settlement, in
/// milliseconds: neither is sent again later than `DEBT_LIFE` after it was first claimed
/// or queued (before its first send), and this leaves half as long again for a copy
/// still on its way. Far below the service's default (10 minutes), so that a caller
/// settled often does not fill the service's memory of ids.
pub(crate) const ID_TTL_MS: u64 = DEBT_LIFE.as_u64() / 1_000_000 + 30_000;
const _: () = assert!(ID_TTL_MS >= sluice_protocol::MIN_ID_TTL_MS && ID_TTL_MS <= sluice_protocol::CHARGE_ID_TTL_MS);

/// A charge id as the service receives it: the worker's instance and a sequence number.
pub(crate) fn charge_id(id: u64) -> String {
    namespace::hex128(u128::from(id))
}

/// Units as a metric delta.
pub(crate) fn units(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
