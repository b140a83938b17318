//! The calls a worker's root context sends for the request path (lease refills and
//! charges of debt), as the request path hands them over and as they wait for their
//! answers. Sending them and applying the answers is `outgoing.rs`.

use super::lease_record::Charge;
use super::namespace;
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
}

impl SentOutgoing {
    /// Whether it was a refill (whose answer waiting requests may be waiting for).
    pub fn is_refill(&self) -> bool {
        matches!(self.call, Sent::Refill(..))
    }
}

/// Keys this worker owes charges for, by slot key.
pub(crate) type PendingCharges = BTreeMap<String, Target>;

/// A check tag as the lease record keeps it: the 128-bit hash, or `None` for `"none"`
/// (no partition).
pub(crate) fn tag_bits(tag: &str) -> Option<u128> {
    (tag != "none").then(|| u128::from_str_radix(tag, 16).unwrap_or(0))
}

/// A charge id as the service receives it: the worker's instance and a sequence number.
pub(crate) fn charge_id(id: u64) -> String {
    namespace::hex128(u128::from(id))
}

/// Units as a metric delta.
pub(crate) fn units(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
