//! What a limit answers: [`Decision`] and its [`Verdict`].

use crate::time::Nanos;

/// Whether a request may proceed, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Admitted now.
    Allowed,
    /// Admitted, to be forwarded after this delay (shaping). Never zero: a zero delay is
    /// [`Verdict::Allowed`].
    Delayed(Nanos),
    /// Not admitted. A caller that retries after exactly `retry_after` is admitted (if
    /// nothing else spends in between); one nanosecond earlier it is not.
    Rejected {
        /// The exact wait until this cost would be admitted.
        retry_after: Nanos,
    },
    /// Not admitted, and never will be: the cost exceeds what the limit can ever hold
    /// (its burst, window limit or queue). Nothing was spent.
    Exceeds,
}

/// One limit's answer to one request, with the evidence a caller needs for response
/// headers: `limit`, `remaining` and `reset_after` map onto `RateLimit-Policy`/`RateLimit`
/// and the legacy `X-RateLimit-*` fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Admitted or not, and when.
    pub verdict: Verdict,
    /// The capacity: burst of a bucket, requests per window, or queue depth for shaping.
    pub limit: u64,
    /// What is left after this decision, in cost units (rounded down).
    pub remaining: u64,
    /// Time until the limit is back to its full capacity, if nothing else is spent.
    pub reset_after: Nanos,
}

impl Decision {
    /// Whether the request may proceed (now or after a shaping delay).
    pub const fn is_admitted(&self) -> bool {
        matches!(self.verdict, Verdict::Allowed | Verdict::Delayed(_))
    }

    /// The shaping delay: zero unless the verdict is [`Verdict::Delayed`].
    pub const fn delay(&self) -> Nanos {
        match self.verdict {
            Verdict::Delayed(delay) => delay,
            _ => Nanos::ZERO,
        }
    }

    /// The wait before a retry can succeed: `None` when admitted or when it never can.
    pub const fn retry_after(&self) -> Option<Nanos> {
        match self.verdict {
            Verdict::Rejected { retry_after } => Some(retry_after),
            _ => None,
        }
    }

    /// The answer of this limit and `other` decided together, all or nothing (a policy
    /// and an operator's clamp on it): admitted only if both admit; a rejection waits for
    /// the later of the two (never, if either can never admit: [`Verdict::Exceeds`]); a
    /// shaping delay is the longer one; `limit` and `remaining` are the lower, `reset_after`
    /// the later.
    #[must_use]
    pub fn and(self, other: Self) -> Self {
        let verdict = match (self.verdict, other.verdict) {
            (Verdict::Exceeds, _) | (_, Verdict::Exceeds) => Verdict::Exceeds,
            (Verdict::Rejected { retry_after: a }, Verdict::Rejected { retry_after: b }) => {
                Verdict::Rejected { retry_after: a.max(b) }
            }
            (rejected @ Verdict::Rejected { .. }, _) | (_, rejected @ Verdict::Rejected { .. }) => rejected,
            (Verdict::Delayed(a), Verdict::Delayed(b)) => Verdict::Delayed(a.max(b)),
            (delayed @ Verdict::Delayed(_), Verdict::Allowed) | (Verdict::Allowed, delayed @ Verdict::Delayed(_)) => {
                delayed
            }
            (Verdict::Allowed, Verdict::Allowed) => Verdict::Allowed,
        };
        Self {
            verdict,
            limit: self.limit.min(other.limit),
            remaining: self.remaining.min(other.remaining),
            reset_after: self.reset_after.max(other.reset_after),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(verdict: Verdict, limit: u64, remaining: u64, reset_ms: u64) -> Decision {
        Decision { verdict, limit, remaining, reset_after: Nanos::from_millis(reset_ms) }
    }

    #[test]
    fn two_limits_decided_together_admit_only_if_both_do_and_wait_for_the_later() {
        let allowed = decision(Verdict::Allowed, 10, 7, 300);
        let rejected = |ms| decision(Verdict::Rejected { retry_after: Nanos::from_millis(ms) }, 2, 0, 900);

        assert_eq!(allowed.and(allowed), allowed);
        assert_eq!(
            allowed.and(rejected(50)),
            decision(Verdict::Rejected { retry_after: Nanos::from_millis(50) }, 2, 0, 900)
        );
        assert_eq!(rejected(50).and(rejected(80)).retry_after(), Some(Nanos::from_millis(80)));
        assert_eq!(rejected(50).and(decision(Verdict::Exceeds, 1, 0, 0)).verdict, Verdict::Exceeds);
        let delayed = decision(Verdict::Delayed(Nanos::from_millis(20)), 4, 1, 100);
        assert_eq!(delayed.and(allowed), decision(Verdict::Delayed(Nanos::from_millis(20)), 4, 1, 300));
    }
}
