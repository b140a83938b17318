//! Limits as they travel in requests, their validation, and the numeric envelope.
//!
//! A [`LimitSpec`] is the JSON form of one limit. [`Policy::new`] validates it into a
//! [`shared_store::Limit`] (what the memory store runs) plus the integers the Redis
//! script runs on, and rejects anything outside the **numeric envelope**.
//!
//! # Why an envelope
//!
//! `shared-store` computes in `u64`/`u128` nanoseconds; Redis runs Lua 5.1, whose only
//! number is an IEEE double, exact for integers below 2^53 only. The Redis script gives
//! exactly the answers of [`shared_store::Limit::decide`] because every integer it
//! handles stays below 2^53, which these rules guarantee:
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
//! The memory store enforces the same envelope, so a request means the same thing on
//! every store.

use serde::Deserialize;
use shared_store::{Limit, MAX_LOG_ENTRIES, Nanos, Rate};

/// Longest period, window or shaping wait: 31 days, in milliseconds.
pub const MAX_PERIOD_MS: u64 = 31 * 24 * 3600 * 1000;
/// Largest `amount`, `burst`, `limit` or `max_queue`: 2^40.
pub const MAX_AMOUNT: u64 = 1 << 40;
/// Largest bucket capacity in the script's scaled units, and largest
/// `limit × window_us` of a sliding window: 2^51.
pub const MAX_SCALED_CAPACITY: u128 = 1 << 51;

/// One limit, as a request carries it. The `algorithm` field selects the variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
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

/// Why a limit was refused. `field` is the JSON path of the offending number.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// A number that makes the limit meaningless (zero window, zero capacity).
    #[error("{field}: {reason}")]
    Invalid {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A limit the Redis script could not compute exactly.
    #[error("{field}: {reason} (numeric envelope: see the counter service's README)")]
    OutsideEnvelope {
        /// The offending field.
        field: &'static str,
        /// Which bound it exceeds.
        reason: String,
    },
}

/// Which algorithm the Redis script runs, with its integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScriptParams {
    /// Algorithm code: `tb`, `lb`, `fw`, `sw` or `sl`.
    pub code: &'static str,
    /// Up to four parameters (see `decide.lua`).
    pub args: [u64; 4],
}

/// A validated limit: what each store runs, and the signature that names its counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// As requested.
    pub spec: LimitSpec,
    /// What the memory store (and the reference) runs.
    pub limit: Limit,
    /// What the Redis script runs.
    pub script: ScriptParams,
    /// Identifies the algorithm and its numbers inside a storage key.
    pub signature: String,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
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

fn nanos_ms(ms: u64) -> Nanos {
    Nanos::from_millis(ms)
}

/// A reduced rate and capacity for the script's GCRA: `(amount / g, per_us / g)`.
fn bucket_params(amount: u64, per_ms: u64, capacity: u64, capacity_field: &'static str) -> Result<[u64; 2], SpecError> {
    let per_us = per_ms * 1000;
    let g = gcd(amount, per_us);
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
    Ok([a, p])
}

impl Policy {
    /// Validates `spec`: every number in range, every product inside the envelope.
    ///
    /// # Errors
    /// [`SpecError::Invalid`] for zero durations or capacities, [`SpecError::OutsideEnvelope`]
    /// for numbers the Redis script could not compute exactly; both name the field.
    pub fn new(spec: LimitSpec) -> Result<Self, SpecError> {
        let (limit, script, signature) = match spec {
            LimitSpec::TokenBucket { amount, per_ms, burst } => {
                let amount = at_most("limit.amount", positive("limit.amount", amount)?, MAX_AMOUNT, "amount")?;
                let per_ms = duration_ms("limit.per_ms", per_ms)?;
                let burst = at_most("limit.burst", positive("limit.burst", burst)?, MAX_AMOUNT, "burst")?;
                let [a, p] = bucket_params(amount, per_ms, burst, "limit.burst")?;
                let rate =
                    Rate::new(amount, nanos_ms(per_ms)).ok_or_else(|| invalid("limit.amount", "must be at least 1"))?;
                let limit = Limit::token_bucket(rate, burst).map_err(|e| invalid("limit.burst", e.to_string()))?;
                (limit, ScriptParams { code: "tb", args: [a, p, burst, 0] }, format!("tb.{amount}.{per_ms}.{burst}"))
            }
            LimitSpec::LeakyBucket { amount, per_ms, max_queue, max_wait_ms } => {
                let amount = at_most("limit.amount", positive("limit.amount", amount)?, MAX_AMOUNT, "amount")?;
                let per_ms = duration_ms("limit.per_ms", per_ms)?;
                let max_queue =
                    at_most("limit.max_queue", positive("limit.max_queue", max_queue)?, MAX_AMOUNT, "max_queue")?;
                let max_wait_ms = at_most("limit.max_wait_ms", max_wait_ms, MAX_PERIOD_MS, "wait (31 days)")?;
                let [a, p] = bucket_params(amount, per_ms, max_queue, "limit.max_queue")?;
                let rate =
                    Rate::new(amount, nanos_ms(per_ms)).ok_or_else(|| invalid("limit.amount", "must be at least 1"))?;
                let limit = Limit::leaky_bucket(rate, max_queue, nanos_ms(max_wait_ms))
                    .map_err(|e| invalid("limit.max_queue", e.to_string()))?;
                (
                    limit,
                    ScriptParams { code: "lb", args: [a, p, max_queue, max_wait_ms * 1000] },
                    format!("lb.{amount}.{per_ms}.{max_queue}.{max_wait_ms}"),
                )
            }
            LimitSpec::FixedWindow { limit, window_ms } => {
                let (l, w) = window_numbers(limit, window_ms)?;
                let limit = Limit::fixed_window(l, nanos_ms(w)).map_err(|e| invalid("limit.limit", e.to_string()))?;
                (limit, ScriptParams { code: "fw", args: [l, w, 0, 0] }, format!("fw.{l}.{w}"))
            }
            LimitSpec::SlidingWindow { limit, window_ms } => {
                let (l, w) = window_numbers(limit, window_ms)?;
                let scaled = u128::from(l) * u128::from(w) * 1000;
                if scaled > MAX_SCALED_CAPACITY {
                    return Err(outside(
                        "limit.limit",
                        format!("limit × window_ms × 1000 = {scaled} is above 2^51 for a sliding window"),
                    ));
                }
                let limit = Limit::sliding_window(l, nanos_ms(w)).map_err(|e| invalid("limit.limit", e.to_string()))?;
                (limit, ScriptParams { code: "sw", args: [l, w, 0, 0] }, format!("sw.{l}.{w}"))
            }
            LimitSpec::SlidingLog { limit, window_ms } => {
                let (l, w) = window_numbers(limit, window_ms)?;
                if l > MAX_LOG_ENTRIES {
                    return Err(outside(
                        "limit.limit",
                        format!("{l} is above {MAX_LOG_ENTRIES}, the most requests a sliding log remembers"),
                    ));
                }
                let limit = Limit::sliding_log(l, nanos_ms(w)).map_err(|e| invalid("limit.limit", e.to_string()))?;
                (limit, ScriptParams { code: "sl", args: [l, w, 0, 0] }, format!("sl.{l}.{w}"))
            }
        };
        Ok(Self { spec, limit, script, signature })
    }

    /// The most one request may cost: burst, window limit or queue depth.
    pub fn capacity(&self) -> u64 {
        self.limit.capacity()
    }

    /// Whether leases make sense for this limit (shaping delays cannot be leased).
    pub fn leasable(&self) -> bool {
        !matches!(self.spec, LimitSpec::LeakyBucket { .. })
    }
}

fn window_numbers(limit: u64, window_ms: u64) -> Result<(u64, u64), SpecError> {
    let limit = at_most("limit.limit", positive("limit.limit", limit)?, MAX_AMOUNT, "limit")?;
    let window_ms = match window_ms {
        0 => return Err(invalid("limit.window_ms", "a window must be at least 1 ms long")),
        w => at_most("limit.window_ms", w, MAX_PERIOD_MS, "window in milliseconds (31 days)")?,
    };
    Ok((limit, window_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_bucket_rate_is_reduced_by_its_gcd() {
        let policy = Policy::new(LimitSpec::TokenBucket { amount: 1000, per_ms: 60_000, burst: 50 }).unwrap();

        assert_eq!(policy.script.args, [1, 60_000, 50, 0]);
    }

    #[test]
    fn a_zero_window_is_invalid_and_names_the_field() {
        let err = Policy::new(LimitSpec::FixedWindow { limit: 10, window_ms: 0 }).unwrap_err();

        assert!(matches!(err, SpecError::Invalid { field: "limit.window_ms", .. }), "{err}");
    }

    #[test]
    fn a_bucket_that_takes_longer_than_31_days_to_refill_is_outside_the_envelope() {
        let err = Policy::new(LimitSpec::TokenBucket { amount: 1, per_ms: 86_400_000, burst: 40 }).unwrap_err();

        assert!(matches!(err, SpecError::OutsideEnvelope { field: "limit.burst", .. }), "{err}");
    }

    #[test]
    fn a_large_sliding_window_is_outside_the_envelope() {
        let err = Policy::new(LimitSpec::SlidingWindow { limit: 100_000, window_ms: 86_400_000 }).unwrap_err();

        assert!(err.to_string().contains("2^51"), "{err}");
    }
}
