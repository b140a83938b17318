//! What a request carries from one stage to the next: what it has been granted so far,
//! what is left to decide, and, while it waits, exactly what it waits for. Each state
//! holds only what the stages after it read.

use crate::engine::cause::Note;
use crate::engine::decision::{Decided, HeldSlots, Owed, Tally};
use crate::engine::resolved::{Few, Rare, Resolved};
use crate::host::Wait;
use shared_store::{Decision, Nanos, Placement, Reservation};
use sluice_protocol::AppliedOverride;

/// What a request has spent and been told so far: committed when it is admitted, given
/// back when a later stage rejects it.
#[derive(Debug)]
pub(crate) struct Granted {
    /// The policies it counts under.
    pub(crate) tally: Tally,
    /// The local (and emergency-cap) spend, committed or refunded together.
    pub(crate) reservation: Reservation,
    /// The local policies' decisions (the first one counts what could not be refunded).
    pub(crate) local: Few<(usize, Decision)>,
    /// The counter service's decisions for the check-mode policies.
    pub(crate) checked: Rare<(usize, Decision)>,
    /// When shaping lets it go, if a policy delays it.
    pub(crate) due: Option<Nanos>,
    /// Estimates spent under policies whose cost the response reports.
    pub(crate) owed: Vec<Owed>,
    /// Lease spends made, to give back if the request is rejected after all.
    pub(crate) spent: Rare<LeaseSpend>,
    /// What the counter service spent for the check-mode policies, to credit back if
    /// the request is rejected after all (a `Vec`: empty, it costs a local request three
    /// words, where an inline array would be copied between every stage).
    pub(crate) checked_spent: Vec<CheckSpent>,
    /// Set when a fallback decided part of the request: what the fallback header says.
    pub(crate) fallback: Option<Note>,
    /// The operators' overrides the service decided its check policies under (policy,
    /// override), for the override header (a `Vec`, as `checked_spent`).
    pub(crate) overrides: Vec<(usize, AppliedOverride)>,
    /// Shadow policies, decided when it is admitted.
    pub(crate) shadows: Rare<Resolved>,
    /// Concurrency slots taken: held while the request is in flight, given back if it
    /// is rejected after all.
    pub(crate) slots: HeldSlots,
}

impl Granted {
    /// Adds a later stage's shaping delay: the request goes when every policy lets it.
    pub(crate) fn delay_until(&mut self, due: Option<Nanos>) {
        self.due = match (self.due, due) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

/// What a check spent at the service for one policy.
#[derive(Debug, Clone)]
pub(crate) struct CheckSpent {
    pub(crate) policy: usize,
    /// The caller's global fingerprint.
    pub(crate) key: u128,
    /// The hash tag its counter lives under.
    pub(crate) tag: String,
    pub(crate) cost: u64,
    /// When the service spent it, on its own clock.
    pub(crate) at_ns: u64,
}

/// A request whose global policies are left, once its local ones admitted it.
#[derive(Debug)]
pub(crate) struct Global {
    pub(crate) granted: Granted,
    /// Check-mode policies, decided together by one callout.
    pub(crate) checked: Rare<Resolved>,
    /// Lease-mode policies, spent after the check.
    pub(crate) leased: Rare<Resolved>,
    /// The check's hash tag (the partition), also the tag of refills and charges.
    pub(crate) tag: String,
}

/// A request whose lease policies are left to spend.
#[derive(Debug)]
pub(crate) struct ToLease {
    pub(crate) granted: Granted,
    pub(crate) leased: Rare<Resolved>,
    pub(crate) tag: String,
    /// Lease policies their leases could not serve (with why), to be decided by a check
    /// at the service once none of the request's lease policies waits.
    pub(crate) to_check: Rare<(Resolved, crate::host::Reason)>,
}

/// Where a request goes after a stage: moved from every stage to the next, so as small
/// as a local request's state. A wait and the lease stage's state, which only requests
/// with global policies reach, are boxed (a wait once, handed to [`Begun`] as it is).
/// `Admit` is not: it is every admitted request's path, and boxing it would allocate on
/// each; its [`Granted`] is kept small instead (what a local request never has is
/// [`Rare`]).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Next {
    /// Decided: carry it out.
    Decided(Decided),
    /// Held until an answer or a refill.
    Wait(Box<Pending>),
    /// To the lease stage.
    Lease(Box<ToLease>),
    /// To admission: everything is decided and admitted it.
    Admit(Granted),
}

/// What the engine leaves the glue with: a decision to carry out, or a wait to hold
/// (and, if it cannot be held, to decide at once).
#[derive(Debug)]
#[must_use = "a decision must be carried out and a wait held, or the stream stays paused"]
pub enum Begun {
    /// Decided now.
    Decided(Decided),
    /// Waiting (boxed: it carries the whole request's state, and only requests with
    /// global policies wait).
    Waiting(Box<Pending>),
}

/// A waiting request: what it waits for, and everything needed to go on. A check wait
/// is the larger (it carries its check policies too); it is boxed as a whole.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Pending {
    /// The answer to its check callout (or its deadline).
    Check(CheckWait),
    /// A refill of one of its leases (retried on the tick and when a refill's answer
    /// reaches its worker, until its deadline).
    Lease(LeaseWait),
}

/// A request waiting for the answer to its check.
#[derive(Debug)]
pub struct CheckWait {
    /// The call that carries its check, or that it waits to be sent.
    pub(crate) call: CheckCall,
    /// When the filter stops waiting, on the limiter's clock: set when it first asks,
    /// never moved by waiting to be sent.
    pub(crate) deadline: Nanos,
    /// When the check was sent, or queued (a success from before the circuit opened
    /// does not close it).
    pub(crate) sent_at: Nanos,
    /// When the request first asked (its wait for the service is measured from here).
    pub(crate) since: Nanos,
    /// Whether the check is the probe of a half-open circuit.
    pub(crate) probe: bool,
    /// What the check decides, and what comes after it.
    pub(crate) global: Global,
}

/// The call that carries a waiting request's check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CheckCall {
    /// Not sent yet: it goes with the next batch (`check_group`).
    Queued,
    /// Sent alone, `POST /v1/check`, callout `token`.
    Alone(u32),
    /// Sent with others, `POST /v1/checks`, callout `token`: its answer is the
    /// `index`-th of `size`.
    Batch { token: u32, index: usize, size: usize },
}

impl CheckCall {
    /// The callout token, once sent.
    pub(crate) const fn token(self) -> Option<u32> {
        match self {
            Self::Queued => None,
            Self::Alone(token) | Self::Batch { token, .. } => Some(token),
        }
    }
}

/// A request waiting for a lease refill.
#[derive(Debug)]
pub struct LeaseWait {
    /// Its id as a waiter (a grant it elected is held for it).
    pub(crate) waiter: u64,
    /// When it began waiting.
    pub(crate) since: Nanos,
    /// When it stops waiting and takes the failure rule.
    pub(crate) deadline: Nanos,
    /// The lease policies not spent yet, and what it was granted before.
    pub(crate) rest: ToLease,
}

impl Pending {
    /// Whether it waits for a lease refill (retried with `Engine::retry`) rather than
    /// for its check's answer.
    pub fn waits_for_lease(&self) -> bool {
        matches!(self, Self::Lease(_))
    }

    /// Its id as a lease waiter (0 while it waits for its check).
    pub fn waiter(&self) -> u64 {
        match self {
            Self::Check(_) => 0,
            Self::Lease(wait) => wait.waiter,
        }
    }

    /// The callout token of its check (`None` while it waits for a refill, or for its
    /// check to be sent).
    pub fn token(&self) -> Option<u32> {
        match self {
            Self::Check(wait) => wait.call.token(),
            Self::Lease(_) => None,
        }
    }

    /// Whether it waits for its check to be sent with the next batch.
    pub fn waits_to_be_sent(&self) -> bool {
        matches!(self, Self::Check(CheckWait { call: CheckCall::Queued, .. }))
    }

    /// What it waits for, and since when, on the limiter's clock.
    pub fn waited(&self) -> (Wait, Nanos) {
        match self {
            Self::Check(wait) => (Wait::Service, wait.since),
            Self::Lease(wait) => (Wait::Refill, wait.since),
        }
    }

    /// When it stops waiting, on the limiter's clock.
    pub fn deadline(&self) -> Nanos {
        match self {
            Self::Check(wait) => wait.deadline,
            Self::Lease(wait) => wait.deadline,
        }
    }
}

/// A lease spend a request made: `cost` from `slot`, for `policy`, from a grant that
/// expires at `until` (given back, it never outlives that grant).
#[derive(Debug, Clone)]
pub(crate) struct LeaseSpend {
    pub(crate) policy: usize,
    pub(crate) slot: Placement,
    pub(crate) cost: u64,
    pub(crate) until: Nanos,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request's state is moved by value from every stage to the next (a
    /// `memory.copy` of its whole size each time, which wasm's fuel and V8 both pay by the
    /// byte): what a local request never has stays out of line ([`Rare`], boxed waits).
    /// Native sizes, with room for a compiler's layout to move; 3 056 bytes for `Next`
    /// when these were inline (docs/benchmarks.md, "Where the instructions went").
    #[test]
    fn the_state_moved_between_stages_stays_small() {
        let sizes = [
            ("Next", std::mem::size_of::<Next>()),
            ("Granted", std::mem::size_of::<Granted>()),
            ("Resolution", std::mem::size_of::<super::super::resolve::Resolution>()),
        ];
        eprintln!("{sizes:?}");
        for (name, size) in sizes {
            assert!(size <= 720, "{name} is {size} bytes: what a local request carries has grown ({sizes:?})");
        }
    }
}
