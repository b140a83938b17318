//! One matching policy of a request, resolved: where the caller's budget is and what the
//! request costs under it. What the stages of the request path pass each other.

use shared_store::{MAX_INLINE_LIMITS, Placement};
use smallvec::SmallVec;

/// Policies of one request, inline up to the common case.
pub(crate) type Few<T> = SmallVec<[T; MAX_INLINE_LIMITS]>;

/// What a local policy's request never has (checked, leased and shadow policies, and
/// what they spent): a `Vec`, which costs such a request three words and no allocation,
/// where an inline array of [`Few`] would be copied with the request from every stage to
/// the next (a `memory.copy` of its whole size each time, most of a local request's work
/// when these were inline).
pub(crate) type Rare<T> = Vec<T>;

/// One matching policy, resolved.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// The policy's index.
    pub(crate) policy: usize,
    /// What the request costs under it.
    pub(crate) cost: u64,
    /// Where its budget is.
    pub(crate) at: Place,
}

/// Where one caller's budget is under a resolved policy: the request-time side of the
/// policy's [`Home`](super::compiled::Home) (where the policy's budgets live), down to
/// the [`Placement`] of the caller's key in shared data. The engine's one `Place`.
#[derive(Debug, Clone)]
pub(crate) enum Place {
    /// In this proxy's shared data.
    Local(Placement),
    /// At the counter service under `key`; `cap` is the caller's emergency bucket.
    Global {
        /// The caller's global fingerprint, the same on every proxy.
        key: u128,
        /// The emergency cap's bucket, when the policy has one.
        cap: Option<Placement>,
        /// Lease mode: the caller's lease record.
        lease: Option<Placement>,
    },
}
