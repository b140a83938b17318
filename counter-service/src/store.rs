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
use sluice_protocol::ErrorCode;

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
    /// Units of debt a carry-over to other numbers could not keep ([`Limit::carry`]), summed
    /// over the counters decided: forgiven, and counted.
    pub carry_forgiven: u64,
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
    /// Units of debt a carry-over to other numbers could not keep ([`Limit::carry`]), summed
    /// over the counters decided: forgiven, and counted.
    pub carry_forgiven: u64,
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
    /// Units of debt a carry-over to other numbers could not keep ([`Limit::carry`]).
    pub carry_forgiven: u64,
}

/// The outcome of a credit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreditOutcome {
    /// The units given back: as many as the counter could take back (fewer than asked
    /// when a bucket refilled meanwhile or a count is lower; none when there was nothing
    /// to give them back to: a full bucket, a window the spend no longer counts in, a
    /// count at zero, a key absent or expired); under a clamp, what both counters took
    /// back; for a duplicate, what the first credit with this id gave back.
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
    /// Units of debt a carry-over to other numbers could not keep ([`Limit::carry`]).
    pub carry_forgiven: u64,
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
    pub const fn code(&self) -> ErrorCode {
        match self {
            Self::Full { .. } | Self::ChargeIdsFull { .. } => ErrorCode::StoreFull,
            Self::Timeout { .. } | Self::Unreachable { .. } | Self::Server(_) | Self::Protocol(_) => {
                ErrorCode::StoreUnavailable
            }
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
        Limit::TokenBucket { .. }
        | Limit::LeakyBucket { .. }
        | Limit::SlidingLog { .. }
        | Limit::Concurrency { .. } => Ok(ttl_ms),
    }
}

/// [`lease_life`] of a lease granted from several counters (an entry and its clamp): the
/// shortest; `Err` with the longest wait when any counter's window is closing.
///
/// # Errors
/// As [`lease_life`].
pub fn lease_life_of<'a>(limits: impl IntoIterator<Item = &'a Limit>, at: Nanos, ttl_ms: u64) -> Result<u64, Nanos> {
    let mut life = Ok(ttl_ms);
    for limit in limits {
        life = match (life, lease_life(limit, at, ttl_ms)) {
            (Err(a), Err(b)) => Err(a.max(b)),
            (Err(wait), Ok(_)) | (Ok(_), Err(wait)) => Err(wait),
            (Ok(a), Ok(b)) => Ok(a.min(b)),
        };
    }
    life
}

impl LeaseOutcome {
    /// The outcome of `plan` decided at `at`, with the lease's life ([`lease_life_of`] its
    /// counters; 0 when a window was closing and nothing was granted).
    pub fn new(plan: &LeasePlan, leased: (u64, Nanos, u64), at: Nanos, decision: Decision) -> Self {
        let (granted, refill_after, carry_forgiven) = leased;
        let expires_in_ms = lease_life_of(plan.counters().map(|e| &e.limit.limit), at, plan.ttl_ms).unwrap_or(0);
        Self { granted, expires_in_ms, at, decision, refill_after, carry_forgiven }
    }
}

/// What [`decide_lease`] found.
#[derive(Debug)]
pub(crate) struct Leased {
    /// Tokens granted (0 or at least `min_tokens`).
    pub granted: u64,
    /// [`LeaseOutcome::refill_after`].
    pub refill_after: Nanos,
    /// After spending `granted`, or the rejection of `min_tokens`: every counter's
    /// decisions together ([`Decision::and`]).
    pub decision: Decision,
    /// Per counter, the state to write: `Some` only when something was granted.
    pub next: Vec<Option<shared_store::State>>,
}

/// Decides a lease from one or more counters (an entry, and an operator's clamp on it),
/// each at its own time, with the pure algorithm: grant the smaller of `tokens` and what every counter has
/// left, when that is at least `min_tokens`; otherwise grant nothing and answer the
/// rejection of `min_tokens` units, whose `retry_after` is the exact wait until that many
/// are left (on every counter: the longest wait). When a window is `closing` (less than
/// a millisecond left, see [`lease_life`]), grant nothing and answer the rejection with
/// the wait until it ends. A grant that leaves fewer than `min_tokens` also answers when
/// that many are back: the longest `retry_after` of deciding `min_tokens` on the states
/// the grant leaves.
pub(crate) fn decide_lease(
    counters: &[(&Limit, Option<&shared_store::State>, Nanos)],
    (tokens, min_tokens): (u64, u64),
    closing: Option<Nanos>,
) -> Leased {
    let together = |decisions: &mut dyn Iterator<Item = Decision>| decisions.reduce(Decision::and);
    let none = || counters.iter().map(|_| None).collect();
    let nothing = |decision| Leased { granted: 0, refill_after: Nanos::ZERO, decision, next: none() };
    let Some(query) = together(&mut counters.iter().map(|(limit, state, at)| limit.decide(*state, *at, 0).0)) else {
        return nothing(Decision {
            verdict: shared_store::Verdict::Exceeds,
            limit: 0,
            remaining: 0,
            reset_after: Nanos::ZERO,
        });
    };
    if let Some(retry_after) = closing {
        return nothing(Decision { verdict: shared_store::Verdict::Rejected { retry_after }, ..query });
    }
    let left = tokens.min(query.remaining);
    let granted = if left >= min_tokens { left } else { 0 };
    let asked = granted.max(min_tokens).max(1);
    let decided: Vec<(Decision, Option<shared_store::State>)> =
        counters.iter().map(|(limit, state, at)| limit.decide(*state, *at, asked)).collect();
    let decision = together(&mut decided.iter().map(|(d, _)| *d)).unwrap_or(query);
    // Spending what the query reported left always admits, and asking for more than is
    // left always rejects; the check keeps that an invariant rather than an assumption.
    if granted == 0 || !decided.iter().all(|(d, next)| d.is_admitted() && next.is_some()) {
        return nothing(decision);
    }
    let refill_after = counters
        .iter()
        .zip(&decided)
        .filter(|(_, (d, _))| d.remaining < min_tokens)
        .filter_map(|((limit, _, at), (_, next))| limit.decide(next.as_ref(), *at, min_tokens).0.retry_after())
        .max()
        .unwrap_or(Nanos::ZERO);
    Leased { granted, refill_after, decision, next: decided.into_iter().map(|(_, next)| next).collect() }
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
