//! Limits as they travel in requests, and the numeric envelope they must fit in.
//!
//! A [`LimitSpec`] is the JSON form of one limit. [`LimitSpec::validate`] turns it into a
//! [`ValidLimit`], which holds the [`shared_store::Limit`] every store runs, and refuses
//! anything outside the **numeric envelope** with a [`SpecError`] naming the field.
//!
//! # Why an envelope
//!
//! `shared-store` computes in `u64`/`u128` nanoseconds; the counter service's Redis store
//! runs Lua 5.1, whose only number is an IEEE double, exact for integers below 2^53 only.
//! The Redis script gives exactly the answers of [`shared_store::Limit::decide`] because
//! every integer it handles stays below 2^53, which these rules guarantee:
//!
//! * durations are whole milliseconds (`per_ms`, `window_ms`, `max_wait_ms`), at most
//!   [`MAX_PERIOD_MS`] (31 days); Redis `TIME` has microsecond resolution, so every time
//!   the script sees is a whole number of microseconds (about 2^51 for today's date);
//! * buckets keep their state relative to their last update, in units of
//!   `1000 × gcd / amount` ns (the rate reduced by `gcd(amount, per_us)`), so the state
//!   is at most `burst × per_us / gcd` ≤ [`MAX_SCALED_CAPACITY`] (2^51), and a bucket
//!   refills from empty within [`MAX_PERIOD_MS`];
//! * a sliding window's weighted count is at most `3 × limit × window_us` <
//!   2^53, hence `limit × window_us` ≤ [`MAX_SCALED_CAPACITY`];
//! * amounts and capacities are at most [`MAX_AMOUNT`] (2^40), so that
//!   `1000 × amount` and `1000 × remainder` products stay exact;
//! * a sliding log holds at most [`shared_store::MAX_LOG_ENTRIES`] requests.
//!
//! A charge (`POST /v1/charge`) may leave a counter up to its capacity below empty,
//! which at most doubles each of these quantities: still below 2^53.
//!
//! Every store enforces the same envelope, and the filter validates its global policies
//! with the same function, so a limit means the same thing everywhere, and a policy the
//! service would refuse is refused when the filter is configured, not at the first
//! request.

use std::fmt;

use serde::{Deserialize, Serialize};
use shared_store::{Algorithm, Limit, MAX_LOG_ENTRIES, Nanos, Rate};

use crate::ErrorCode;

/// Longest period, window or shaping wait: 31 days, in milliseconds.
pub const MAX_PERIOD_MS: u64 = 31 * 24 * 3600 * 1000;
/// Largest `amount`, `burst`, `limit` or `max_queue` (and largest charge cost): 2^40.
pub const MAX_AMOUNT: u64 = 1 << 40;
/// Largest bucket capacity in the script's scaled units, and largest
/// `limit × window_us` of a sliding window: 2^51.
pub const MAX_SCALED_CAPACITY: u128 = 1 << 51;

/// One limit, as a request carries it. The `algorithm` field selects the variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(tag = "algorithm", rename_all = "snake_case", deny_unknown_fields)]
pub enum LimitSpec {
    /// Token bucket (GCRA): refills `amount` every `per_ms`, holds at most `burst`.
    TokenBucket {
        /// Tokens added per period.
        amount: u64,
        /// The period, in milliseconds.
        per_ms: u64,
        /// Capacity: the largest cost an idle client may spend at once.
        burst: u64,
    },
    /// Leaky bucket as a shaper: admitted requests get a delay so they leave at the rate.
    LeakyBucket {
        /// Units drained per period.
        amount: u64,
        /// The period, in milliseconds.
        per_ms: u64,
        /// Most units waiting at once.
        max_queue: u64,
        /// Longest delay handed out, in milliseconds.
        max_wait_ms: u64,
    },
    /// At most `limit` per clock-aligned window.
    FixedWindow {
        /// Units per window.
        limit: u64,
        /// Window length, in milliseconds.
        window_ms: u64,
    },
    /// Sliding window counter (previous window weighted by its overlap).
    SlidingWindow {
        /// Units per trailing window.
        limit: u64,
        /// Window length, in milliseconds.
        window_ms: u64,
    },
    /// Sliding window log: exact count over the trailing window.
    SlidingLog {
        /// Units per trailing window (at most 256).
        limit: u64,
        /// Window length, in milliseconds.
        window_ms: u64,
    },
}

/// Why a limit was refused. `field` is the JSON path of the offending number, relative
/// to the request (`limit.burst`); a caller with another layout prefixes its own path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpecError {
    /// A number that makes the limit meaningless (zero window, zero capacity).
    Invalid {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A limit the Redis script could not compute exactly.
    OutsideEnvelope {
        /// The offending field.
        field: &'static str,
        /// Which bound it exceeds.
        reason: String,
    },
}

impl SpecError {
    /// The offending field.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Invalid { field, .. } | Self::OutsideEnvelope { field, .. } => field,
        }
    }

    /// The API error code this refusal is answered with: `invalid_limit` or
    /// `outside_envelope`.
    pub const fn code(&self) -> ErrorCode {
        match self {
            Self::Invalid { .. } => ErrorCode::InvalidLimit,
            Self::OutsideEnvelope { .. } => ErrorCode::OutsideEnvelope,
        }
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Invalid { field, reason } => write!(f, "{field}: {reason}"),
            Self::OutsideEnvelope { field, reason } => {
                write!(f, "{field}: {reason} (numeric envelope: see the counter service's README)")
            }
        }
    }
}

impl std::error::Error for SpecError {}

/// A limit inside the envelope: what every store runs, and the numbers it came from.
///
/// Only [`LimitSpec::validate`] makes one, so holding a `ValidLimit` means every check
/// of the envelope passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ValidLimit {
    spec: LimitSpec,
    limit: Limit,
    reduced_rate: Option<(u64, u64)>,
}

impl ValidLimit {
    /// The limit as requested.
    pub const fn spec(&self) -> LimitSpec {
        self.spec
    }

    /// What the memory store, the filter and the reference run.
    pub const fn limit(&self) -> Limit {
        self.limit
    }

    /// The most one request may cost: burst, window limit or queue depth.
    pub const fn capacity(&self) -> u64 {
        self.limit.capacity()
    }

    /// For buckets, the rate in lowest terms over microseconds:
    /// `(amount / g, per_ms × 1000 / g)` with `g = gcd(amount, per_ms × 1000)`, the units
    /// in which the envelope bounds a bucket (capacity × the second ≤ 2^51). `None` for
    /// windows and logs.
    pub const fn reduced_rate(&self) -> Option<(u64, u64)> {
        self.reduced_rate
    }

    /// Whether leases (and charges) make sense for this limit: a leaky bucket answers
    /// with delays, not a count, so it can neither be leased nor charged.
    pub const fn leasable(&self) -> bool {
        self.spec.kind().leasable()
    }
}

const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

fn invalid(field: &'static str, reason: impl Into<String>) -> SpecError {
    SpecError::Invalid { field, reason: reason.into() }
}

fn outside(field: &'static str, reason: impl Into<String>) -> SpecError {
    SpecError::OutsideEnvelope { field, reason: reason.into() }
}

fn positive(field: &'static str, value: u64) -> Result<u64, SpecError> {
    if value == 0 { Err(invalid(field, "must be at least 1")) } else { Ok(value) }
}

fn at_most(field: &'static str, value: u64, max: u64, what: &str) -> Result<u64, SpecError> {
    if value > max { Err(outside(field, format!("{value} is above the largest {what}, {max}"))) } else { Ok(value) }
}

fn duration_ms(field: &'static str, value: u64) -> Result<u64, SpecError> {
    at_most(field, positive(field, value)?, MAX_PERIOD_MS, "duration in milliseconds (31 days)")
}

/// Checks a bucket against the envelope; returns its rate reduced over microseconds,
/// `(amount / g, per_us / g)`.
fn bucket_rate(amount: u64, per_ms: u64, capacity: u64, capacity_field: &'static str) -> Result<(u64, u64), SpecError> {
    // per_ms ≤ MAX_PERIOD_MS, so the product cannot overflow.
    let per_us = per_ms.saturating_mul(1000);
    let g = gcd(amount, per_us).max(1);
    let (a, p) = (amount / g, per_us / g);
    let scaled = u128::from(capacity) * u128::from(p);
    if scaled > MAX_SCALED_CAPACITY {
        return Err(outside(
            capacity_field,
            format!(
                "{capacity_field} × per_ms × 1000 / gcd(amount, per_ms × 1000) = {scaled} is above 2^51; \
                 use a smaller {capacity_field} or a rate with fewer distinct units"
            ),
        ));
    }
    // Time to refill from empty, in ms, must stay within the period bound.
    let refill_ms = (u128::from(capacity) * u128::from(per_ms)).div_ceil(u128::from(amount));
    if refill_ms > u128::from(MAX_PERIOD_MS) {
        return Err(outside(
            capacity_field,
            format!(
                "refilling {capacity} units at {amount} per {per_ms} ms takes {refill_ms} ms, \
                 above the longest period of 31 days ({MAX_PERIOD_MS} ms)"
            ),
        ));
    }
    Ok((a, p))
}

fn window_numbers(limit: u64, window_ms: u64) -> Result<(u64, u64), SpecError> {
    let limit = at_most("limit.limit", positive("limit.limit", limit)?, MAX_AMOUNT, "limit")?;
    let window_ms = match window_ms {
        0 => return Err(invalid("limit.window_ms", "a window must be at least 1 ms long")),
        w => at_most("limit.window_ms", w, MAX_PERIOD_MS, "window in milliseconds (31 days)")?,
    };
    Ok((limit, window_ms))
}

impl LimitSpec {
    /// Whether this limit never lets more through than `other`: the same algorithm, and
    /// no number that admits more (a burst, a queue, a wait or a window's count no larger,
    /// a rate no faster). What an operator's clamp must be to the policy it lowers.
    pub fn admits_at_most(&self, other: &Self) -> bool {
        // a/p ≤ b/q, exactly, for positive periods.
        let slower = |a: u64, p: u64, b: u64, q: u64| u128::from(a) * u128::from(q) <= u128::from(b) * u128::from(p);
        match (*self, *other) {
            (
                Self::TokenBucket { amount, per_ms, burst },
                Self::TokenBucket { amount: their_amount, per_ms: their_per_ms, burst: their_burst },
            ) => burst <= their_burst && slower(amount, per_ms, their_amount, their_per_ms),
            (
                Self::LeakyBucket { amount, per_ms, max_queue, max_wait_ms },
                Self::LeakyBucket { amount: a, per_ms: p, max_queue: q, max_wait_ms: w },
            ) => max_queue <= q && max_wait_ms <= w && slower(amount, per_ms, a, p),
            (Self::FixedWindow { limit, window_ms }, Self::FixedWindow { limit: l, window_ms: w })
            | (Self::SlidingWindow { limit, window_ms }, Self::SlidingWindow { limit: l, window_ms: w })
            | (Self::SlidingLog { limit, window_ms }, Self::SlidingLog { limit: l, window_ms: w }) => {
                limit <= l && slower(limit, window_ms, l, w)
            }
            _ => false,
        }
    }
}

impl LimitSpec {
    /// Validates the limit: every number in range, every product inside the envelope.
    ///
    /// # Errors
    /// [`SpecError::Invalid`] for zero durations or capacities, [`SpecError::OutsideEnvelope`]
    /// for numbers the Redis script could not compute exactly; both name the field
    /// (`limit.burst`, `limit.window_ms`, …) and say which bound was crossed.
    pub fn validate(&self) -> Result<ValidLimit, SpecError> {
        let spec = *self;
        let (limit, reduced_rate) = match spec {
            Self::TokenBucket { amount, per_ms, burst } => {
                let amount = at_most("limit.amount", positive("limit.amount", amount)?, MAX_AMOUNT, "amount")?;
                let per_ms = duration_ms("limit.per_ms", per_ms)?;
                let burst = at_most("limit.burst", positive("limit.burst", burst)?, MAX_AMOUNT, "burst")?;
                let reduced = bucket_rate(amount, per_ms, burst, "limit.burst")?;
                let rate = Rate::new(amount, Nanos::from_millis(per_ms))
                    .ok_or_else(|| invalid("limit.amount", "must be at least 1"))?;
                let limit = Limit::token_bucket(rate, burst).map_err(|e| invalid("limit.burst", e.to_string()))?;
                (limit, Some(reduced))
            }
            Self::LeakyBucket { amount, per_ms, max_queue, max_wait_ms } => {
                let amount = at_most("limit.amount", positive("limit.amount", amount)?, MAX_AMOUNT, "amount")?;
                let per_ms = duration_ms("limit.per_ms", per_ms)?;
                let max_queue =
                    at_most("limit.max_queue", positive("limit.max_queue", max_queue)?, MAX_AMOUNT, "max_queue")?;
                let max_wait_ms = at_most("limit.max_wait_ms", max_wait_ms, MAX_PERIOD_MS, "wait (31 days)")?;
                let reduced = bucket_rate(amount, per_ms, max_queue, "limit.max_queue")?;
                let rate = Rate::new(amount, Nanos::from_millis(per_ms))
                    .ok_or_else(|| invalid("limit.amount", "must be at least 1"))?;
                let limit = Limit::leaky_bucket(rate, max_queue, Nanos::from_millis(max_wait_ms))
                    .map_err(|e| invalid("limit.max_queue", e.to_string()))?;
                (limit, Some(reduced))
            }
            Self::FixedWindow { limit, window_ms } => {
                let (l, w) = window_numbers(limit, window_ms)?;
                let limit =
                    Limit::fixed_window(l, Nanos::from_millis(w)).map_err(|e| invalid("limit.limit", e.to_string()))?;
                (limit, None)
            }
            Self::SlidingWindow { limit, window_ms } => {
                let (l, w) = window_numbers(limit, window_ms)?;
                let scaled = u128::from(l) * u128::from(w) * 1000;
                if scaled > MAX_SCALED_CAPACITY {
                    return Err(outside(
                        "limit.limit",
                        format!("limit × window_ms × 1000 = {scaled} is above 2^51 for a sliding window"),
                    ));
                }
                let limit = Limit::sliding_window(l, Nanos::from_millis(w))
                    .map_err(|e| invalid("limit.limit", e.to_string()))?;
                (limit, None)
            }
            Self::SlidingLog { limit, window_ms } => {
                let (l, w) = window_numbers(limit, window_ms)?;
                if l > MAX_LOG_ENTRIES {
                    return Err(outside(
                        "limit.limit",
                        format!("{l} is above {MAX_LOG_ENTRIES}, the most requests a sliding log remembers"),
                    ));
                }
                let limit =
                    Limit::sliding_log(l, Nanos::from_millis(w)).map_err(|e| invalid("limit.limit", e.to_string()))?;
                (limit, None)
            }
        };
        Ok(ValidLimit { spec, limit, reduced_rate })
    }

    /// The algorithm, from the one list ([`Algorithm`]).
    pub const fn kind(&self) -> Algorithm {
        match self {
            Self::TokenBucket { .. } => Algorithm::TokenBucket,
            Self::LeakyBucket { .. } => Algorithm::LeakyBucket,
            Self::FixedWindow { .. } => Algorithm::FixedWindow,
            Self::SlidingWindow { .. } => Algorithm::SlidingWindow,
            Self::SlidingLog { .. } => Algorithm::SlidingLog,
        }
    }

    /// The names of the algorithms that `can`, in the list's order, for messages
    /// (`token_bucket, fixed_window or sliding_window`).
    pub fn names_of(can: impl Fn(Algorithm) -> bool) -> String {
        let names: Vec<&str> = Algorithm::ALL.into_iter().filter(|a| can(*a)).map(Algorithm::name).collect();
        match names.split_last() {
            Some((last, [])) => (*last).to_owned(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }

    /// The algorithm's name in JSON (`token_bucket`, `fixed_window`, …).
    pub const fn algorithm(&self) -> &'static str {
        self.kind().name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limit of `algorithm` as a request carries it, `None` for one the counter service
    /// does not decide: the exhaustive match is where a new algorithm must be given its
    /// wire form.
    fn spec_of(algorithm: Algorithm) -> Option<LimitSpec> {
        Some(match algorithm {
            Algorithm::TokenBucket => LimitSpec::TokenBucket { amount: 2, per_ms: 1000, burst: 2 },
            Algorithm::LeakyBucket => {
                LimitSpec::LeakyBucket { amount: 2, per_ms: 1000, max_queue: 2, max_wait_ms: 1000 }
            }
            Algorithm::FixedWindow => LimitSpec::FixedWindow { limit: 2, window_ms: 1000 },
            Algorithm::SlidingWindow => LimitSpec::SlidingWindow { limit: 2, window_ms: 1000 },
            Algorithm::SlidingLog => LimitSpec::SlidingLog { limit: 2, window_ms: 1000 },
            Algorithm::Concurrency => return None,
        })
    }

    #[test]
    fn every_algorithm_the_service_decides_travels_as_a_limit_with_its_name_and_runs_as_shared_store_builds_it() {
        for algorithm in Algorithm::ALL {
            let spec = spec_of(algorithm);
            assert_eq!(spec.is_some(), algorithm.global(), "{algorithm}");
            let Some(spec) = spec else { continue };
            let json = serde_json::to_value(spec).unwrap();
            assert_eq!(json["algorithm"], algorithm.name());
            assert_eq!(spec.kind(), algorithm);
            assert_eq!(spec.validate().unwrap().limit(), algorithm.example(), "{algorithm}");
        }
    }

    #[test]
    fn messages_list_the_algorithms_that_can_from_the_one_list() {
        assert_eq!(LimitSpec::names_of(Algorithm::creditable), "token_bucket, fixed_window or sliding_window");
        assert_eq!(LimitSpec::names_of(|a| a == Algorithm::SlidingLog), "sliding_log");
    }

    #[test]
    fn a_valid_token_bucket_runs_the_same_limit_as_shared_store_builds() {
        let valid = LimitSpec::TokenBucket { amount: 10, per_ms: 1000, burst: 20 }.validate().unwrap();

        let expected = Limit::token_bucket(Rate::new(10, Nanos::from_secs(1)).unwrap(), 20).unwrap();
        assert_eq!(valid.limit(), expected);
        assert_eq!(valid.capacity(), 20);
    }

    #[test]
    fn a_bucket_rate_is_reduced_by_its_gcd_over_microseconds() {
        let valid = LimitSpec::TokenBucket { amount: 1000, per_ms: 60_000, burst: 50 }.validate().unwrap();

        assert_eq!(valid.reduced_rate(), Some((1, 60_000)));
    }

    #[test]
    fn a_clamp_admits_at_most_its_policy_only_when_no_number_lets_more_through() {
        let policy = LimitSpec::TokenBucket { amount: 100, per_ms: 1000, burst: 50 };
        let bucket = |amount, per_ms, burst| LimitSpec::TokenBucket { amount, per_ms, burst };
        let window = LimitSpec::FixedWindow { limit: 100, window_ms: 60_000 };

        assert!(bucket(10, 1000, 5).admits_at_most(&policy));
        assert!(bucket(6, 60, 50).admits_at_most(&policy), "100/s exactly is no faster");
        assert!(policy.admits_at_most(&policy));
        assert!(!bucket(7, 60, 50).admits_at_most(&policy), "a faster rate");
        assert!(!bucket(10, 1000, 51).admits_at_most(&policy), "a larger burst");
        assert!(!LimitSpec::FixedWindow { limit: 1, window_ms: 1000 }.admits_at_most(&policy), "another algorithm");
        assert!(LimitSpec::FixedWindow { limit: 50, window_ms: 60_000 }.admits_at_most(&window));
        assert!(!LimitSpec::FixedWindow { limit: 50, window_ms: 1000 }.admits_at_most(&window), "50/s beats 100/min");
    }

    #[test]
    fn a_window_has_no_reduced_rate() {
        let valid = LimitSpec::FixedWindow { limit: 5, window_ms: 1000 }.validate().unwrap();

        assert_eq!(valid.reduced_rate(), None);
    }

    #[test]
    fn a_zero_window_is_invalid_and_names_the_field() {
        let err = LimitSpec::FixedWindow { limit: 10, window_ms: 0 }.validate().unwrap_err();

        assert!(matches!(err, SpecError::Invalid { field: "limit.window_ms", .. }), "{err}");
        assert_eq!(err.to_string(), "limit.window_ms: a window must be at least 1 ms long");
        assert_eq!(err.code(), ErrorCode::InvalidLimit);
    }

    #[test]
    fn a_zero_rate_is_invalid_and_names_the_amount() {
        let err = LimitSpec::TokenBucket { amount: 0, per_ms: 1000, burst: 5 }.validate().unwrap_err();

        assert_eq!(err.to_string(), "limit.amount: must be at least 1");
    }

    #[test]
    fn a_bucket_that_takes_longer_than_31_days_to_refill_is_outside_the_envelope() {
        let err = LimitSpec::TokenBucket { amount: 1, per_ms: 86_400_000, burst: 40 }.validate().unwrap_err();

        assert!(matches!(err, SpecError::OutsideEnvelope { field: "limit.burst", .. }), "{err}");
        assert_eq!(err.code(), ErrorCode::OutsideEnvelope);
        assert_eq!(
            err.to_string(),
            "limit.burst: refilling 40 units at 1 per 86400000 ms takes 3456000000 ms, above the longest \
             period of 31 days (2678400000 ms) (numeric envelope: see the counter service's README)"
        );
    }

    #[test]
    fn a_large_sliding_window_is_outside_the_envelope() {
        let err = LimitSpec::SlidingWindow { limit: 100_000, window_ms: 86_400_000 }.validate().unwrap_err();

        assert!(err.to_string().contains("2^51"), "{err}");
        assert_eq!(err.field(), "limit.limit");
    }

    #[test]
    fn a_sliding_log_longer_than_256_is_outside_the_envelope() {
        let err = LimitSpec::SlidingLog { limit: 257, window_ms: 1000 }.validate().unwrap_err();

        assert_eq!(
            err.to_string(),
            "limit.limit: 257 is above 256, the most requests a sliding log remembers \
             (numeric envelope: see the counter service's README)"
        );
    }

    #[test]
    fn an_amount_above_2_to_the_40_names_the_bound() {
        let err = LimitSpec::FixedWindow { limit: MAX_AMOUNT + 1, window_ms: 1000 }.validate().unwrap_err();

        assert_eq!(
            err.to_string(),
            "limit.limit: 1099511627777 is above the largest limit, 1099511627776 \
             (numeric envelope: see the counter service's README)"
        );
    }

    #[test]
    fn a_leaky_bucket_is_neither_leasable_nor_chargeable() {
        let shaper = LimitSpec::LeakyBucket { amount: 1, per_ms: 100, max_queue: 3, max_wait_ms: 250 };

        assert!(!shaper.validate().unwrap().leasable());
        assert!(LimitSpec::SlidingLog { limit: 3, window_ms: 10 }.validate().unwrap().leasable());
    }

    #[test]
    fn a_limit_round_trips_through_json_with_its_algorithm_tag() {
        let spec = LimitSpec::LeakyBucket { amount: 1, per_ms: 100, max_queue: 3, max_wait_ms: 250 };

        let json = serde_json::to_string(&spec).unwrap();

        assert_eq!(json, r#"{"algorithm":"leaky_bucket","amount":1,"per_ms":100,"max_queue":3,"max_wait_ms":250}"#);
        assert_eq!(serde_json::from_str::<LimitSpec>(&json).unwrap(), spec);
        assert_eq!(spec.algorithm(), "leaky_bucket");
    }

    #[test]
    fn an_unknown_field_in_a_limit_is_refused() {
        let err =
            serde_json::from_str::<LimitSpec>(r#"{"algorithm":"fixed_window","limit":1,"window_ms":1,"burst":2}"#)
                .unwrap_err();

        assert!(err.to_string().contains("unknown field `burst`"), "{err}");
    }
}
