//! The lease record (the lease-mode stage that spends it is `request/lease.rs`): a proxy's share
//! of a global budget, kept in shared data and spent by every worker with compare-and-swap,
//! like a local bucket.
//!
//! One record per caller key and proxy (in a slot table, like local buckets):
//!
//! * two **pools** of tokens, each spendable until its own expiry (the filter's monotonic
//!   clock, anchored at the moment the refill was sent, so never later than the service
//!   said). The pool that expires first is spent first. A grant never extends the life
//!   of tokens already held: it becomes the second pool; if both pools are still live,
//!   the older two are merged under the *earlier* expiry (stricter, never looser);
//! * a **hold**: the tokens of a grant that a waiting request elected and asked for, kept
//!   for that request alone (`held_for`), so that a grant a waiter paid a round trip for
//!   is not spent by requests that arrived meanwhile;
//! * `refill_until`: a refill is in flight, elected through this record; past this
//!   deadline the election is void, so a worker that died or whose callout never returns
//!   cannot block refills for longer than one callout's deadline;
//! * `empty_until`: the service granted nothing (the global budget is spent); until then
//!   requests the live tokens cannot cover are rejected with the time left, except one
//!   per lease duration since the last election (`asked_at`), which asks again (a probe:
//!   an operator's override may have changed the answer since);
//! * `demand`: the units the key asked for on this proxy over the last lease life
//!   (`demand.rs`): a key that asked for fewer than the lease's `cold_below` (four by
//!   default; a key seen for the first time included) is cold and checked per request,
//!   and a refill asks for what the key is expected to spend;
//! * `failed_at`: the last refill that failed: requests waiting for it apply the failure
//!   rule at once;
//! * `debt`: units admitted under the failure rule while the service could not decide,
//!   to be charged to the global budget once it answers again (bounded by `max_debt`),
//!   with `owed_at` (debt older than [`DEBT_LIFE`] no longer holds the slot) and the
//!   charge in flight (`charging` units under `charge_id` until `charge_until`), so one
//!   debt is never charged twice: a charge that timed out is sent again with the same id,
//!   which the service recognises.
//!
//! Every change is one CAS write of the whole record, retried a bounded number of times.
//! A record another key holds (the slot is taken by a lease that still carries something)
//! is not shared: the request takes its policy's failure rule (`lease_slot_taken`), never
//! someone else's tokens. A slot changes hands only when its record is idle; stale debt
//! is forgiven then, and counted.

//!
//! `record.rs` is the record and its encoding; `leases.rs` every change made to it.

mod demand;
mod leases;
mod record;

#[cfg(test)]
use leases::Settled;
pub(crate) use leases::{Charge, Leases, Rules, Spend, Updated};
pub(crate) use record::{DEBT_LIFE, Record};
#[cfg(test)]
pub(crate) use record::{MAX_ATTEMPTS, Pool};
use shared_store::Nanos;

/// A lease record as tests and the fleet simulation see it (decoded from shared data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseView {
    /// Whose it is (the slot owner tag).
    pub owner: u64,
    /// Tokens any request may spend, and when each pool expires.
    pub pools: [(u64, Nanos); 2],
    /// Tokens held for one waiting request, and when they expire.
    pub held: (u64, Nanos),
    /// Units owed to the global budget.
    pub debt: u64,
    /// When debt was last added.
    pub owed_at: Nanos,
    /// Of the debt, the units a charge in flight carries.
    pub charging: u64,
    /// Until when the budget is known to be empty.
    pub empty_until: Nanos,
    /// Until when a refill election holds.
    pub refill_until: Nanos,
}

/// Decodes a lease record's bytes (`None` when they are not one).
pub fn inspect_lease_record(bytes: &[u8]) -> Option<LeaseView> {
    let r = Record::decode(bytes)?;
    Some(LeaseView {
        owner: r.owner,
        pools: [(r.first.tokens, r.first.expires_at), (r.second.tokens, r.second.expires_at)],
        held: (r.held.tokens, r.held.expires_at),
        debt: r.debt,
        owed_at: r.owed_at,
        charging: r.charging,
        empty_until: r.empty_until,
        refill_until: r.refill_until,
    })
}

#[cfg(test)]
mod tests;
