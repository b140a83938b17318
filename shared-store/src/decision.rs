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
}
