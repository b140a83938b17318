//! Where counters live: [`MemoryCounters`] (one process) or [`RedisCounters`] (shared by
//! many service instances). Both run the same algorithms and give the same answers; the
//! shared behavioural suite in `tests/` holds them to it. Each serves the decision routes
//! alike: [`CounterStore::check`] (`/v1/check`), [`CounterStore::lease`] (`/v1/lease`),
//! [`CounterStore::charge`] (`/v1/charge`) and [`CounterStore::credit`] (`/v1/credit`).
//! Each also keeps the operators' overrides ([`overrides`]).

pub mod memory;
pub mod overrides;
pub mod redis;

use shared_store::{Decision, Limit, Nanos};

use crate::api::{ChargePlan, CheckPlan, CreditPlan, LeasePlan};
pub use memory::{MemoryConfig, MemoryCounters};
pub use overrides::{Expired, MemoryOverrides, Stored};
pub use redis::{RedisConfig, RedisCounters, RedisUrl, Topology};

/// The outcome of a check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckOutcome {
    /// Whether every entry admitted. When false, nothing was spent.
    pub admitted: bool,
    /// The time the decision was made at (Unix ns).
    pub at: Nanos,
    /// One decision per entry, in order.
    pub decisions: Vec<Decision>,
}

/// The outcome of a lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseOutcome {
    /// Tokens granted and deducted.
    pub granted: u64,
    /// How long the grant may be spent, in milliseconds: [`lease_life`] at `at`.
    pub expires_in_ms: u64,
    /// The time the decision was made at (Unix ns).
    pub at: Nanos,
    /// The limit's decision: after spending `granted`, or the rejection of `min_tokens`
    /// when fewer were left.
    pub decision: Decision,
    /// When something was granted and fewer than `min_tokens` are left after it: the
    /// exact wait until `min_tokens` could be granted again (the `retry_after` of
    /// deciding `min_tokens` on the state the grant left; [`Nanos::MAX`] for never).
    /// Zero otherwise, and when nothing was granted (`decision` carries the wait then).
    pub refill_after: Nanos,
}

/// The outcome of a charge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChargeOutcome {
    /// Units spent (the rest of the cost was forgiven); for a duplicate, the units the
    /// first charge with this id spent.
    pub charged: u64,
    /// Units dropped because they did not fit within `max_debt`; for a duplicate, what
    /// the first charge with this id forgave.
    pub forgiven: u64,
    /// The charge's id was applied before (within `CHARGE_ID_TTL_MS`): nothing was spent
    /// now, and `charged` and `forgiven` repeat the first answer.
    pub duplicate: bool,
    /// The time the charge was made at (Unix ns).
    pub at: Nanos,
    /// The limit after the charge: [`shared_store::Limit::status`].
    pub decision: Decision,
}

/// The outcome of a credit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreditOutcome {
    /// The units given back: all of them when the credit changed the counter, none when
    /// there was nothing to give them back to (a full bucket, a window the spend no
    /// longer counts in, a count already at zero, a key absent or expired); for a
    /// duplicate, what the first credit with this id gave back.
    pub credited: u64,
    /// `units - credited`; for a duplicate, what the first credit with this id forgave.
    pub forgiven: u64,
    /// The credit's id was applied before (within `CHARGE_ID_TTL_MS`): nothing was given
    /// back now, and `credited` and `forgiven` repeat the first answer.
    pub duplicate: bool,
    /// The time the credit was made at (Unix ns).
    pub at: Nanos,
    /// The limit after the credit: [`shared_store::Limit::status`].
    pub decision: Decision,
}

/// Why a store could not decide. Every variant maps to a 503 the filter treats as
/// "counter service unavailable" and answers with its configured fallback.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CounterStoreError {
    /// No answer within the deadline. The write may or may not have happened; it is
    /// never replayed.
    #[error("the {store} store did not answer within {after_ms} ms")]
    Timeout {
        /// Store name.
        store: &'static str,
        /// The deadline.
        after_ms: u64,
    },
    /// The store cannot be reached (connection refused, dropped, not yet connected).
    #[error("the {store} store is unreachable: {reason}")]
    Unreachable {
        /// Store name.
        store: &'static str,
        /// What failed.
        reason: String,
    },
    /// The memory store holds its maximum number of keys, all active; new keys are
    /// refused rather than resetting someone's counter.
    #[error("the memory store holds its maximum of {max_keys} active keys; new keys are refused until some go idle")]
    Full {
        /// The configured bound.
        max_keys: usize,
    },
    /// The memory store remembers its maximum number of charge and credit ids, none
    /// expired yet; charges and credits with a new id are refused rather than forget an
    /// id (which could apply a charge or a credit twice).
    #[error(
        "the memory store remembers its maximum of {max_ids} charge and credit ids, none expired yet; \
         charges and credits with a new id are refused until some expire"
    )]
    ChargeIdsFull {
        /// The bound.
        max_ids: usize,
    },
    /// Redis answered with an error (out of memory, script error, cluster redirect).
    #[error("redis answered with an error: {0}")]
    Server(String),
    /// Redis answered something the service does not understand.
    #[error("redis answered unexpectedly: {0}")]
    Protocol(String),
}

impl CounterStoreError {
    /// The metric label for this error.
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Timeout { .. } => "timeout",
            Self::Unreachable { .. } => "connection",
            Self::Full { .. } | Self::ChargeIdsFull { .. } => "full",
            Self::Server(_) => "server",
            Self::Protocol(_) => "protocol",
        }
    }

    /// The API error code.
    pub const fn code(&self) -> &'static str {
        match self {
            Self::Full { .. } | Self::ChargeIdsFull { .. } => "store_full",
            _ => "store_unavailable",
        }
    }
}

/// A store: memory or Redis.
#[derive(Debug)]
pub enum CounterStore {
    /// In-process counters.
    Memory(MemoryCounters),
    /// Counters in Redis (standalone or cluster).
    Redis(Box<RedisCounters>),
}

impl CounterStore {
    /// The store's name in logs, metrics and error messages.
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Memory(_) => "memory",
            Self::Redis(_) => "redis",
        }
    }

    /// Decides a check at the store's time (`at` overrides it: tests only).
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn check(&self, plan: &CheckPlan, at: Option<Nanos>) -> Result<CheckOutcome, CounterStoreError> {
        match self {
            Self::Memory(m) => m.check(plan, at),
            Self::Redis(r) => r.check(plan, at).await,
        }
    }

    /// Grants a lease at the store's time (`at` overrides it: tests only).
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn lease(&self, plan: &LeasePlan, at: Option<Nanos>) -> Result<LeaseOutcome, CounterStoreError> {
        match self {
            Self::Memory(m) => m.lease(plan, at),
            Self::Redis(r) => r.lease(plan, at).await,
        }
    }

    /// Charges a key at the store's time (`at` overrides it: tests only).
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn charge(&self, plan: &ChargePlan, at: Option<Nanos>) -> Result<ChargeOutcome, CounterStoreError> {
        match self {
            Self::Memory(m) => m.charge(plan, at),
            Self::Redis(r) => r.charge(plan, at).await,
        }
    }

    /// Gives back unused units at the store's time (`at` overrides it: tests only).
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn credit(&self, plan: &CreditPlan, at: Option<Nanos>) -> Result<CreditOutcome, CounterStoreError> {
        match self {
            Self::Memory(m) => m.credit(plan, at),
            Self::Redis(r) => r.credit(plan, at).await,
        }
    }

    /// Whether the store answers.
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn ping(&self) -> Result<(), CounterStoreError> {
        match self {
            Self::Memory(_) => Ok(()),
            Self::Redis(r) => r.ping().await,
        }
    }
}

/// How long a lease decided at `at` may be spent, in whole milliseconds: `ttl_ms`, and for
/// a fixed or sliding window at most what is left of the aligned window `at` falls in, so
/// that leased tokens are spent in the window that counted them. `Err` with the time
/// until that window ends when less than a millisecond is left: such a lease is granted
/// nothing (both stores check it when they decide, at the same `at` they answer with).
///
/// # Errors
/// The wait until the window ends, when it ends within a millisecond.
pub fn lease_life(limit: &Limit, at: Nanos, ttl_ms: u64) -> Result<u64, Nanos> {
    match *limit {
        Limit::FixedWindow { window, .. } | Limit::SlidingWindow { window, .. } => {
            let w = u128::from(window.as_u64().max(1));
            let end = (u128::from(at.as_u64()) / w + 1) * w;
            let left = Nanos(u64::try_from(end - u128::from(at.as_u64())).unwrap_or(u64::MAX));
            match left.as_u64() / 1_000_000 {
                0 => Err(left),
                whole_ms => Ok(ttl_ms.min(whole_ms)),
            }
        }
        _ => Ok(ttl_ms),
    }
}

impl LeaseOutcome {
    /// The outcome of `plan` decided at `at`, with the lease's life ([`lease_life`]; 0
    /// when the window was closing and nothing was granted).
    pub fn new(plan: &LeasePlan, (granted, refill_after): (u64, Nanos), at: Nanos, decision: Decision) -> Self {
        let expires_in_ms = lease_life(&plan.entry.limit.limit, at, plan.ttl_ms).unwrap_or(0);
        Self { granted, expires_in_ms, at, decision, refill_after }
    }
}

/// What [`decide_lease`] found.
#[derive(Debug)]
pub(crate) struct Leased {
    /// Tokens granted (0 or at least `min_tokens`).
    pub granted: u64,
    /// [`LeaseOutcome::refill_after`].
    pub refill_after: Nanos,
    /// After spending `granted`, or the rejection of `min_tokens`.
    pub decision: Decision,
    /// The state to write: `Some` only when something was granted.
    pub next: Option<shared_store::State>,
}

/// Decides a lease with the pure algorithm: grant the smaller of `tokens` and what is
/// left when that is at least `min_tokens`; otherwise grant nothing and answer the
/// rejection of `min_tokens` units, whose `retry_after` is the exact wait until that many
/// are left. When the window is `closing` (less than a millisecond left, see
/// [`lease_life`]), grant nothing and answer the rejection with the wait until it ends.
/// A grant that leaves fewer than `min_tokens` also answers when that many are back: the
/// `retry_after` of deciding `min_tokens` on the state the grant leaves.
pub(crate) fn decide_lease(
    limit: &shared_store::Limit,
    state: Option<&shared_store::State>,
    now: Nanos,
    (tokens, min_tokens): (u64, u64),
    closing: Option<Nanos>,
) -> Leased {
    let (query, _) = limit.decide(state, now, 0);
    let nothing = |decision| Leased { granted: 0, refill_after: Nanos::ZERO, decision, next: None };
    if let Some(retry_after) = closing {
        return nothing(Decision { verdict: shared_store::Verdict::Rejected { retry_after }, ..query });
    }
    let left = tokens.min(query.remaining);
    let granted = if left >= min_tokens { left } else { 0 };
    let (decision, next) = limit.decide(state, now, granted.max(min_tokens).max(1));
    // Spending what the query reported left always admits, and asking for more than is
    // left always rejects; the check keeps that an invariant rather than an assumption.
    match next {
        Some(next) if granted > 0 && decision.is_admitted() => {
            let refill_after = if decision.remaining < min_tokens {
                limit.decide(Some(&next), now, min_tokens).0.retry_after().unwrap_or(Nanos::ZERO)
            } else {
                Nanos::ZERO
            };
            Leased { granted, refill_after, decision, next: Some(next) }
        }
        _ => nothing(decision),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn window() -> Limit {
        Limit::fixed_window(5, Nanos(1000 * MS)).unwrap()
    }

    #[test]
    fn a_window_lease_lives_the_whole_milliseconds_left_in_its_window_at_most() {
        let start = Nanos(1_750_000_000_000 * MS);

        assert_eq!(lease_life(&window(), start, 2000), Ok(1000));
        assert_eq!(lease_life(&window(), Nanos(start.0 + 700 * MS + 1), 2000), Ok(299));
        assert_eq!(lease_life(&window(), Nanos(start.0 + 700 * MS), 200), Ok(200), "the ttl when shorter");
        assert_eq!(lease_life(&window(), Nanos(start.0 + 999 * MS + 1), 2000), Err(Nanos(MS - 1)));
    }

    #[test]
    fn a_bucket_or_log_lease_lives_its_ttl() {
        let log = Limit::sliding_log(5, Nanos(1000 * MS)).unwrap();

        assert_eq!(lease_life(&log, Nanos(999 * MS + 1), 2000), Ok(2000));
    }
}
