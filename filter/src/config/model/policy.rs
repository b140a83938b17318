//! What one validated policy is: its limit, cost and key, its failure rule, and the
//! bounds its numbers were validated against.

use super::global::Global;
use super::request::{Cost, KeyPart, Matcher, MissingKey};
use shared_store::Limit;
use std::num::NonZeroU32;

/// Default number of slots per policy: about 0.75 MiB of shared data per policy (a slot
/// is a ~90-byte key plus value), enough to track eight thousand concurrently active
/// callers exactly; callers beyond that share the policy's overflow bucket.
pub const DEFAULT_SLOTS: u32 = 8192;
/// Most slots a policy may have (about 90 MiB of shared data).
pub const MAX_SLOTS: u32 = 1 << 20;
/// Largest rate amount, burst, window limit, queue depth or cost a configuration may
/// give. Far above any real limit; it keeps every header value and every product in the
/// arithmetic small, and it is below the largest amount the counter service takes
/// ([`sluice_protocol::MAX_AMOUNT`], 2^40), so every number a global policy is
/// configured with is one the service accepts.
pub const MAX_CONFIGURED_AMOUNT: u64 = 1_000_000_000_000;
const _: () = assert!(MAX_CONFIGURED_AMOUNT <= sluice_protocol::MAX_AMOUNT);
/// Longest shaping delay: a paused request holds a connection and memory in the proxy.
pub const MAX_WAIT_MS: u128 = 5 * 60 * 1000;
/// Default status when a policy cannot decide and its failure outcome is `deny`.
pub const DEFAULT_FAILURE_STATUS: u16 = 503;

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
