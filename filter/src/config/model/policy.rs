//! What one validated policy is: its limit, cost and key, its failure rule, and the
//! bounds its numbers were validated against.

use super::global::Global;
use super::request::{Cost, KeyPart, Matcher, MissingKey};
use shared_store::Limit;
use std::num::NonZeroU32;

pub use super::bounds::{DEFAULT_FAILURE_STATUS, DEFAULT_SLOTS, MAX_CONFIGURED_AMOUNT, MAX_SLOTS, MAX_WAIT};

/// One validated policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Unique name (safe for metric names and header strings).
    pub name: String,
    /// Key parts, combined.
    pub key: Vec<KeyPart>,
    /// Which requests it applies to.
    pub matcher: Matcher,
    /// The algorithm and its numbers.
    pub limit: Limit,
    /// Cost per request.
    pub cost: Cost,
    /// What its numbers count, when not requests (the `RateLimit-Policy` quota unit).
    pub unit: Option<String>,
    /// What a missing key part does.
    pub on_missing_key: MissingKey,
    /// Count, never reject.
    pub shadow: bool,
    /// Bucket generation.
    pub version: u64,
    /// Slot-table size.
    pub slots: NonZeroU32,
    /// What happens when no decision can be made.
    pub on_failure: FailureOutcome,
    /// Global policies: how the policy consults the counter service. `None`: local.
    pub global: Option<Global>,
    /// Global policies: the local cap that decides first while the service cannot.
    pub emergency: Option<Limit>,
}

impl Policy {
    /// Whether the policy's budget is kept by the counter service.
    pub const fn is_global(&self) -> bool {
        self.global.is_some()
    }
}

/// What happens when no decision can be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureOutcome {
    /// Forward the request.
    Allow,
    /// Answer with this status.
    Deny(u16),
}
