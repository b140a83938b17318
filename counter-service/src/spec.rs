//! Validated limits as the stores run them: [`Policy`].
//!
//! The limits themselves ([`LimitSpec`]), their validation and the numeric envelope are
//! defined once, in `sluice-protocol`, for the service and the filter alike. A
//! [`Policy`] adds what only this service needs: the integers the Redis script runs on
//! and the signature that names a counter in its storage key.

use shared_store::Limit;
use sluice_protocol::{LimitSpec, SpecError, ValidLimit};

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

impl Policy {
    /// Validates `spec` ([`LimitSpec::validate`]: every number in range, every product
    /// inside the envelope) and derives the Redis script's parameters from it.
    ///
    /// # Errors
    /// The [`SpecError`] of [`LimitSpec::validate`], naming the field.
    pub fn new(spec: LimitSpec) -> Result<Self, SpecError> {
        Ok(Self::from_valid(spec.validate()?))
    }

    /// The policy of a limit already validated.
    pub fn from_valid(valid: ValidLimit) -> Self {
        let spec = valid.spec();
        // Buckets always have a reduced rate; the fallback is never taken.
        let (a, p) = valid.reduced_rate().unwrap_or((0, 0));
        let (script, signature) = match spec {
            LimitSpec::TokenBucket { amount, per_ms, burst } => {
                (ScriptParams { code: "tb", args: [a, p, burst, 0] }, format!("tb.{amount}.{per_ms}.{burst}"))
            }
            LimitSpec::LeakyBucket { amount, per_ms, max_queue, max_wait_ms } => (
                ScriptParams { code: "lb", args: [a, p, max_queue, max_wait_ms * 1000] },
                format!("lb.{amount}.{per_ms}.{max_queue}.{max_wait_ms}"),
            ),
            LimitSpec::FixedWindow { limit, window_ms } => {
                (ScriptParams { code: "fw", args: [limit, window_ms, 0, 0] }, format!("fw.{limit}.{window_ms}"))
            }
            LimitSpec::SlidingWindow { limit, window_ms } => {
                (ScriptParams { code: "sw", args: [limit, window_ms, 0, 0] }, format!("sw.{limit}.{window_ms}"))
            }
            LimitSpec::SlidingLog { limit, window_ms } => {
                (ScriptParams { code: "sl", args: [limit, window_ms, 0, 0] }, format!("sl.{limit}.{window_ms}"))
            }
        };
        Self { spec, limit: valid.limit(), script, signature }
    }

    /// The most one request may cost: burst, window limit or queue depth.
    pub fn capacity(&self) -> u64 {
        self.limit.capacity()
    }

    /// Whether leases and charges make sense for this limit (shaping delays cannot be
    /// leased or charged).
    pub fn leasable(&self) -> bool {
        !matches!(self.spec, LimitSpec::LeakyBucket { .. })
    }
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
    fn a_leaky_bucket_passes_its_wait_in_microseconds() {
        let policy =
            Policy::new(LimitSpec::LeakyBucket { amount: 3, per_ms: 1000, max_queue: 4, max_wait_ms: 250 }).unwrap();

        assert_eq!(policy.script.args, [3, 1_000_000, 4, 250_000]);
        assert_eq!(policy.signature, "lb.3.1000.4.250");
    }

    #[test]
    fn an_invalid_limit_makes_no_policy_and_names_the_field() {
        let err = Policy::new(LimitSpec::FixedWindow { limit: 10, window_ms: 0 }).unwrap_err();

        assert!(matches!(err, SpecError::Invalid { field: "limit.window_ms", .. }), "{err}");
    }
}
