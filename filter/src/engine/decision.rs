//! What the engine answers for a request, and what the glue reports back once it has
//! carried the answer out: the outcome, the policies it counts under, its disposition.

use super::resolved::Few;
use crate::host::{Counter, Metrics};
use shared_store::{Nanos, Placement, Slot};
use smallvec::SmallVec;

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Forward it; add these headers to its response.
    Continue {
        /// Response headers (rate-limit headers on allowed responses, the fallback header).
        headers: Vec<(String, String)>,
        /// Concurrency slots it holds until its stream ends.
        slots: HeldSlots,
    },
    /// Answer it locally.
    Reject(LocalResponse),
    /// Forward it at `due` (shaping), then add `headers` to its response.
    Delay {
        /// How long to hold it, from the decision.
        delay: Nanos,
        /// When it is due, on the limiter's clock.
        due: Nanos,
        /// Response headers.
        headers: Vec<(String, String)>,
        /// Concurrency slots it holds until its stream ends (while it waits, too).
        slots: HeldSlots,
    },
}

/// A local reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    /// HTTP status.
    pub status: u16,
    /// Headers.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: String,
}

/// The policies a request counts under, to record once its fate is carried out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally(pub(crate) Few<usize>);

impl Tally {
    /// The policies' indices.
    pub fn policies(&self) -> &[usize] {
        &self.0
    }

    /// Counts the request's fate once carried out: `offered` and its disposition move
    /// together, so `offered = allowed + rejected + queued` holds at every moment.
    pub(crate) fn record(&self, disposition: Disposition, metrics: &mut impl Metrics) {
        let counter = match disposition {
            Disposition::Allowed => Counter::Allowed,
            Disposition::Rejected => Counter::Rejected,
            Disposition::Queued => Counter::Queued,
        };
        for &policy in &self.0 {
            metrics.add(policy, Counter::Offered, 1);
            metrics.add(policy, counter, 1);
        }
    }

    /// Counts a paused request released to the upstream.
    pub(crate) fn release(&self, metrics: &mut impl Metrics) {
        for &policy in &self.0 {
            metrics.add(policy, Counter::Queued, -1);
            metrics.add(policy, Counter::Allowed, 1);
        }
    }

    /// Counts a request whose stream ended while it was held: `abandoned`, beside the
    /// disposition it was counted under.
    pub(crate) fn abandon(&self, metrics: &mut impl Metrics) {
        for &policy in &self.0 {
            metrics.add(policy, Counter::Abandoned, 1);
        }
    }
}

/// What happened to a request, as carried out by the glue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Forwarded upstream.
    Allowed,
    /// Answered with a rejection (or reset).
    Rejected,
    /// Held by shaping.
    Queued,
}

/// A decision and the policies it counts under. It must be carried out (and recorded):
/// dropping one would leave its stream paused and its counts unrecorded.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a decision must be carried out, or its stream stays paused"]
pub struct Decided {
    /// What to do.
    pub outcome: Outcome,
    /// What to record once done.
    pub tally: Tally,
    /// Spends on an estimate, to settle to the cost the response reports (empty unless
    /// the request is forwarded under a policy whose cost the response reports).
    pub owed: Vec<Owed>,
}

impl Decided {
    /// A decision that leaves nothing to settle after the response.
    pub(crate) const fn new(outcome: Outcome, tally: Tally) -> Self {
        Self { outcome, tally, owed: Vec::new() }
    }
}

/// The concurrency slots a request holds: none for nearly every request, so kept thin (a
/// decision moves between every stage and is returned as an error by several). A request
/// forwarded, now or when due, holds them until its stream ends, and gives them back at
/// once if it is not forwarded after all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldSlots(Option<Box<SmallVec<[HeldSlot; 1]>>>);

impl HeldSlots {
    /// These slots.
    pub(crate) fn new(slots: Vec<HeldSlot>) -> Self {
        Self((!slots.is_empty()).then(|| Box::new(SmallVec::from_vec(slots))))
    }

    /// Whether there are none.
    pub const fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The slots, one by one.
    pub(crate) fn into_vec(self) -> Vec<HeldSlot> {
        self.0.map_or_else(Vec::new, |slots| slots.into_vec())
    }
}

/// A concurrency slot a request holds: the policy it counts under, and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldSlot {
    /// The policy's index.
    pub(crate) policy: usize,
    /// The slot in shared data.
    pub(crate) slot: Slot,
}

/// An estimate spent at admission under a policy whose cost the response reports: what
/// settling it to the actual cost needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owed {
    /// The policy's index.
    pub(crate) policy: usize,
    /// Where the estimate was spent.
    pub(crate) from: SpentFrom,
    /// What was spent.
    pub(crate) estimate: u64,
    /// When, on the limiter's clock.
    pub(crate) spent_at: Nanos,
}

impl Owed {
    /// The policy's index.
    pub const fn policy(&self) -> usize {
        self.policy
    }
}

/// How a lease-mode policy's estimate was paid for, and so where what the response
/// leaves of it goes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeasePaid {
    /// By the lease's tokens, of a grant that expires at `until`: what is left goes back
    /// to a live pool no longer-lived than that grant (after it, those tokens expired).
    Tokens { until: Nanos },
    /// The failure rule admitted it, and the record owes this many units of it as debt
    /// (the rest was forgiven). What is left lowers the debt and never becomes tokens:
    /// the service granted none of them.
    Owed(u64),
}

/// Where an estimate was spent, and so where it is settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SpentFrom {
    /// A local policy's bucket in this proxy's shared data.
    Local(Placement),
    /// A global policy's emergency cap, which admitted the request while the counter
    /// service could not decide: settled like a local bucket, under the cap's numbers.
    /// A check-mode policy's `cost.*` counters count it; a lease-mode policy's count its
    /// settlement on the lease record instead, which it owes too.
    Cap(Placement),
    /// A lease-mode policy's lease record (`slot`), for the caller whose global counter
    /// is `key` under the check tag `tag`: what the lease cannot cover is owed there and
    /// charged to the service.
    Lease {
        /// The lease record.
        slot: Placement,
        /// The caller's global fingerprint.
        key: u128,
        /// The hash tag (partition) its counter lives under.
        tag: String,
        /// How the estimate was paid for.
        paid: LeasePaid,
    },
    /// A check-mode policy's counter at the service, for the caller whose global counter
    /// is `key` under the check tag `tag`: settled by the service (a charge of the excess
    /// or a credit of what was unused), sent by the worker's root context.
    Check {
        /// The caller's global fingerprint.
        key: u128,
        /// The hash tag (partition) its counter lives under.
        tag: String,
        /// When the service spent the estimate, on its own clock (the check's `at_ns`):
        /// a window is credited only if this falls in it.
        at_ns: u64,
    },
}
