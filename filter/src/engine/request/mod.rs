//! The request path, as a pipeline of stages, one file each, in the order a request
//! meets them:
//!
//! 1. [`resolve`]: which policies match, where each caller's budget is, what it costs;
//! 2. [`local`]: the local policies, decided together in one atomic step (a reservation
//!    when a later stage may still reject);
//! 3. [`check`]: the check-mode policies, decided by the counter service in one callout
//!    while the request waits ([`Pending::Check`]);
//! 4. [`lease`]: the lease-mode policies, spent from this proxy's leases, waiting for a
//!    refill when one is empty ([`Pending::Lease`]);
//! 5. [`fallback`]: the failure rule, for each global policy that could not be decided,
//!    applied from the check and lease stages;
//! 6. [`admit`]: commit, shadows, headers, shaping; or reject, giving back what was spent;
//! 7. [`settle`]: after the response, an estimate settled to the cost the response
//!    reports.
//!
//! Each stage takes its own state ([`state`]) and says where the request goes next
//! ([`state::Next`]); the functions here chain them, so a request spends all or nothing
//! across its policies, and every path ends in a decision or a wait.

mod admit;
mod check;
mod fallback;
mod lease;
mod local;
pub(crate) mod resolve;
pub(crate) mod settle;
mod state;

use super::decision::{Decided, Disposition, Outcome, Tally};
use super::setup::Setup;
use crate::host::{CalloutAnswer, Callouts, Metrics, PluginCounter, RequestFacts};
use resolve::{Refusal, Secrets};
use shared_store::{Clock, Limiter, Store};
use state::Next;
pub use state::{Begun, CheckWait, LeaseWait, Pending};

/// Decides a request's local policies and, when it has global ones, goes on to the
/// check and lease stages.
pub(crate) fn begin<S: Store, C: Clock>(
    setup: &Setup,
    request: &impl RequestFacts,
    limiter: &Limiter<S, C>,
    callouts: &mut impl Callouts,
    room_to_pause: bool,
    metrics: &mut impl Metrics,
) -> Begun {
    let secrets = Secrets { local: &setup.secret, global: setup.service.as_ref().map(|s| &s.secret) };
    let mut resolution = resolve::resolve(&setup.policies, request, &secrets, metrics);
    let tally = Tally(std::mem::take(&mut resolution.offered));
    if let Some(refusal) = resolution.refused {
        let status = match refusal {
            Refusal::MissingKey => setup.response.status,
            Refusal::Failure(status) => status,
        };
        return Begun::Decided(Decided::new(reject_outright(setup, status), tally));
    }
    let next = match local::decide(setup, resolution, tally, limiter, metrics) {
        Err(decided) => Next::Decided(decided),
        Ok(admitted) if admitted.checked.is_empty() && admitted.leased.is_empty() => Next::Admit(admitted.granted),
        Ok(admitted) => check::enter(setup, admitted, request, callouts, limiter, metrics),
    };
    run(setup, next, limiter, callouts, room_to_pause, metrics)
}

/// Goes on with a request waiting for its check, with the service's answer (or its
/// absence: `TimedOut`). A request waiting for a refill has no check to answer: it is
/// retried instead. `callouts` sends the check of lease policies their leases could
/// not serve.
pub(crate) fn complete<S: Store, C: Clock>(
    setup: &Setup,
    pending: Pending,
    answer: &CalloutAnswer,
    limiter: &Limiter<S, C>,
    callouts: &mut dyn Callouts,
    room_to_pause: bool,
    metrics: &mut impl Metrics,
) -> Begun {
    let next = match pending {
        Pending::Check(wait) => check::answered(setup, wait, answer, limiter, metrics),
        Pending::Lease(wait) => lease::retry(setup, wait, limiter, Some(&mut *callouts), metrics),
    };
    run(setup, next, limiter, callouts, room_to_pause, metrics)
}

/// Sends the checks of requests that waited to be sent (`Pending::waits_to_be_sent`),
/// together in one call; what each does next, by the id it was given with (anything
/// else given goes on waiting as it was).
pub(crate) fn send_checks<S: Store, C: Clock>(
    setup: &Setup,
    pending: Vec<(u32, Pending)>,
    limiter: &Limiter<S, C>,
    callouts: &mut dyn Callouts,
    room_to_pause: bool,
    metrics: &mut impl Metrics,
) -> Vec<(u32, Begun)> {
    let (ids, waits, mut begun) = checks_of(pending);
    let sent = check::send_waiting(setup, waits, &mut *callouts, limiter, metrics);
    begun.extend(
        ids.into_iter().zip(sent).map(|(id, next)| (id, run(setup, next, limiter, callouts, room_to_pause, metrics))),
    );
    begun
}

/// Decides the requests that waited for one batch's answer, reading it once; what each
/// does next, by the id it was given with (anything else given goes on waiting as it
/// was).
pub(crate) fn complete_batch<S: Store, C: Clock>(
    setup: &Setup,
    pending: Vec<(u32, Pending)>,
    answer: &CalloutAnswer,
    limiter: &Limiter<S, C>,
    callouts: &mut dyn Callouts,
    room_to_pause: bool,
    metrics: &mut impl Metrics,
) -> Vec<(u32, Begun)> {
    let (ids, waits, mut begun) = checks_of(pending);
    let answered = check::batch_answered(setup, waits, answer, limiter, metrics);
    begun.extend(
        ids.into_iter()
            .zip(answered)
            .map(|(id, next)| (id, run(setup, next, limiter, callouts, room_to_pause, metrics))),
    );
    begun
}

/// The check waits among `pending` with their ids, and the rest, still waiting.
fn checks_of(pending: Vec<(u32, Pending)>) -> (Vec<u32>, Vec<CheckWait>, Vec<(u32, Begun)>) {
    let mut ids = Vec::with_capacity(pending.len());
    let mut waits = Vec::with_capacity(pending.len());
    let mut others = Vec::new();
    for (id, p) in pending {
        match p {
            Pending::Check(wait) => {
                ids.push(id);
                waits.push(wait);
            }
            lease @ Pending::Lease(_) => others.push((id, Begun::Waiting(Box::new(lease)))),
        }
    }
    (ids, waits, others)
}

/// Tries a request waiting for a refill again; one waiting for its check's answer goes
/// on waiting.
pub(crate) fn retry<S: Store, C: Clock>(
    setup: &Setup,
    pending: Pending,
    limiter: &Limiter<S, C>,
    callouts: &mut dyn Callouts,
    room_to_pause: bool,
    metrics: &mut impl Metrics,
) -> Begun {
    match pending {
        Pending::Lease(wait) => {
            let next = lease::retry(setup, wait, limiter, Some(&mut *callouts), metrics);
            run(setup, next, limiter, callouts, room_to_pause, metrics)
        }
        check @ Pending::Check(_) => Begun::Waiting(Box::new(check)),
    }
}

/// Decides a waiting request that cannot be held at once: a refill wait takes the
/// failure rule (`lease_queue_full`), a check wait is timed out (and a refill wait it
/// then needs takes the failure rule too). Always a decision.
pub(crate) fn decide_now<S: Store, C: Clock>(
    setup: &Setup,
    pending: Pending,
    limiter: &Limiter<S, C>,
    room_to_pause: bool,
    metrics: &mut impl Metrics,
) -> Decided {
    let mut next = Next::Wait(Box::new(pending));
    loop {
        next = match next {
            Next::Decided(decided) => return decided,
            Next::Wait(pending) => match *pending {
                Pending::Lease(wait) => lease::overflow(setup, wait, limiter, metrics),
                Pending::Check(wait) => check::answered(setup, wait, &CalloutAnswer::TimedOut, limiter, metrics),
            },
            // No check can be held either: what the leases cannot serve takes the
            // failure rule.
            Next::Lease(to_lease) => lease::spend(setup, *to_lease, limiter, None, metrics),
            Next::Admit(granted) => return admit::conclude(setup, granted, limiter, room_to_pause, metrics),
        };
    }
}

/// Forgets a waiting request whose stream ended: it was never forwarded, so everything
/// it spent is given back as a rejection gives it back (its lease spends, its local
/// reservation and concurrency slots, and what an admitting check spent, credited back
/// at the service); it is counted as rejected and abandoned; and if its check was the
/// probe of a half-open circuit, the next request probes instead. A check still in
/// flight keeps whatever the service spends for it: its answer, which says so, is lost
/// with the stream (stricter, never looser).
pub(crate) fn forget<S: Store, C: Clock>(
    setup: &Setup,
    pending: Pending,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) {
    metrics.add_plugin(PluginCounter::Waiting, -1);
    if let Pending::Check(wait) = &pending {
        check::leave(setup, wait);
        // The host cancels an ended stream's callout: a probe's answer will not come.
        if wait.probe
            && let Some(service) = &setup.service
        {
            service.breaker.release_probe(limiter.store(), limiter.clock().now());
        }
    }
    let granted = match pending {
        Pending::Check(wait) => wait.global.granted,
        Pending::Lease(wait) => wait.rest.granted,
    };
    let tally = admit::unspend(setup, granted, limiter, metrics).tally;
    tally.record(Disposition::Rejected, metrics);
    tally.abandon(metrics);
}

/// The most requests a worker should hold waiting for this request's refills
/// (unbounded for a check wait: the check queue has no bound of its own).
pub(crate) fn max_waiting(setup: &Setup, pending: &Pending) -> usize {
    match pending {
        Pending::Lease(wait) => lease::max_waiting(setup, wait),
        Pending::Check(_) => usize::MAX,
    }
}

/// Runs the stages after the one that produced `next`, until a decision or a wait.
fn run<S: Store, C: Clock>(
    setup: &Setup,
    next: Next,
    limiter: &Limiter<S, C>,
    callouts: &mut dyn Callouts,
    room_to_pause: bool,
    metrics: &mut impl Metrics,
) -> Begun {
    let mut next = next;
    loop {
        next = match next {
            Next::Decided(decided) => return Begun::Decided(decided),
            Next::Wait(pending) => return Begun::Waiting(pending),
            Next::Lease(to_lease) => lease::spend(setup, *to_lease, limiter, Some(&mut *callouts), metrics),
            Next::Admit(granted) => {
                return Begun::Decided(admit::conclude(setup, granted, limiter, room_to_pause, metrics));
            }
        };
    }
}

/// A rejection before any bucket was consulted (a missing key, a failed read).
fn reject_outright(setup: &Setup, status: u16) -> Outcome {
    Outcome::Reject(admit::rejection(setup, None, status, None))
}
