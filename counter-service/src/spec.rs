//! What a validated limit is to the stores: [`StoreLimit`], with what the Redis script
//! runs.
//!
//! The limits themselves ([`LimitSpec`]), their validation and the numeric envelope are
//! defined once, in `sluice-protocol`, for the service and the filter alike. A
//! [`StoreLimit`] adds what only this service needs: the integers the Redis script runs on
//! and the signature that names the limit a Redis state was decided under.

use shared_store::Limit;
use sluice_protocol::{Algorithm, LimitSpec, SpecError, ValidLimit};

/// Which algorithm the Redis script runs, with its integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScriptParams {
    /// Algorithm code: `tb`, `lb`, `fw`, `sw` or `sl`.
    pub code: &'static str,
    /// Up to four parameters (see `decide.lua`).
    pub args: [u64; 4],
}

/// The code `decide.lua` dispatches on for `algorithm` (it refuses any other): the one
/// place an algorithm is given its script code. A concurrency limit is never decided by
/// the service.
pub const fn script_code(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::TokenBucket => "tb",
        Algorithm::LeakyBucket => "lb",
        Algorithm::FixedWindow => "fw",
        Algorithm::SlidingWindow => "sw",
        Algorithm::SlidingLog => "sl",
        Algorithm::Concurrency => "cc",
    }
}

/// A validated limit: what each store runs, and the signature that names it in Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreLimit {
    /// As requested.
    pub spec: LimitSpec,
    /// What the memory store (and the reference) runs.
    pub limit: Limit,
    /// What the Redis script runs.
    pub script: ScriptParams,
    /// The algorithm and its script parameters, `code.p1.p2.p3.p4` (`tb.1.500000.4.0`):
    /// the prefix of every state the Redis script writes, which it compares with the
    /// request's own to tell that a counter was decided under other numbers and must be
    /// carried over first. Two limits have the same signature exactly when they are the
    /// same [`Limit`] (rates are in lowest terms on both sides).
    pub signature: String,
}

impl StoreLimit {
    /// Validates `spec` ([`LimitSpec::validate`]: every number in range, every product
    /// inside the envelope) and derives the Redis script's parameters from it.
    ///
    /// # Errors
    /// The [`SpecError`] of [`LimitSpec::validate`], naming the field.
    pub fn new(spec: LimitSpec) -> Result<Self, SpecError> {
        Ok(Self::from_valid(spec.validate()?))
    }

    /// The store limit of a limit already validated.
    pub fn from_valid(valid: ValidLimit) -> Self {
        let spec = valid.spec();
        // Buckets always have a reduced rate; the fallback is never taken.
        let (a, p) = valid.reduced_rate().unwrap_or((0, 0));
        let args = match spec {
            LimitSpec::TokenBucket { burst, .. } => [a, p, burst, 0],
            LimitSpec::LeakyBucket { max_queue, max_wait_ms, .. } => [a, p, max_queue, max_wait_ms * 1000],
            LimitSpec::FixedWindow { limit, window_ms }
            | LimitSpec::SlidingWindow { limit, window_ms }
            | LimitSpec::SlidingLog { limit, window_ms } => [limit, window_ms, 0, 0],
        };
        let script = ScriptParams { code: script_code(spec.kind()), args };
        let [p1, p2, p3, p4] = script.args;
        let signature = format!("{}.{p1}.{p2}.{p3}.{p4}", script.code);
        Self { spec, limit: valid.limit(), script, signature }
    }

    /// The most one request may cost: burst, window limit or queue depth.
    pub fn capacity(&self) -> u64 {
        self.limit.capacity()
    }

    /// Whether leases make sense for this limit ([`sluice_protocol::Algorithm::leasable`]).
    pub const fn leasable(&self) -> bool {
        self.spec.kind().leasable()
    }

    /// Whether it can be charged ([`sluice_protocol::Algorithm::chargeable`]).
    pub const fn chargeable(&self) -> bool {
        self.spec.kind().chargeable()
    }

    /// Whether a credit can give units back to this limit
    /// ([`sluice_protocol::Algorithm::creditable`]).
    pub const fn creditable(&self) -> bool {
        self.spec.kind().creditable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_bucket_rate_is_reduced_by_its_gcd() {
        let limit = StoreLimit::new(LimitSpec::TokenBucket { amount: 1000, per_ms: 60_000, burst: 50 }).unwrap();

        assert_eq!(limit.script.args, [1, 60_000, 50, 0]);
    }

    #[test]
    fn a_leaky_bucket_passes_its_wait_in_microseconds() {
        let limit = StoreLimit::new(LimitSpec::LeakyBucket { amount: 3, per_ms: 1000, max_queue: 4, max_wait_ms: 250 })
            .unwrap();

        assert_eq!(limit.script.args, [3, 1_000_000, 4, 250_000]);
        assert_eq!(limit.signature, "lb.3.1000000.4.250000");
    }

    #[test]
    fn two_limits_share_a_signature_exactly_when_they_are_the_same_limit() {
        let per_second = StoreLimit::new(LimitSpec::TokenBucket { amount: 2, per_ms: 1000, burst: 4 }).unwrap();
        let same_rate = StoreLimit::new(LimitSpec::TokenBucket { amount: 4, per_ms: 2000, burst: 4 }).unwrap();
        let other_burst = StoreLimit::new(LimitSpec::TokenBucket { amount: 2, per_ms: 1000, burst: 5 }).unwrap();

        assert_eq!(per_second.signature, same_rate.signature);
        assert_eq!(per_second.limit, same_rate.limit);
        assert_ne!(per_second.signature, other_burst.signature);
    }

    #[test]
    fn an_invalid_limit_makes_no_store_limit_and_names_the_field() {
        let err = StoreLimit::new(LimitSpec::FixedWindow { limit: 10, window_ms: 0 }).unwrap_err();

        assert!(matches!(err, SpecError::Invalid { field: "limit.window_ms", .. }), "{err}");
    }
}
