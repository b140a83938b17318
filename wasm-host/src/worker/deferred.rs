//! Callouts whose answers the driver decides after dispatch ([`crate::Answer::deferred`]).
//!
//! A driver that steps several hosts in parallel cannot let a shared upstream decide
//! each call the moment it is dispatched: which host dispatched first would depend on
//! the threads. It takes each worker's deferred calls after a step instead, decides them
//! in an order of its own, and answers each; an answer is due its delay after the
//! dispatch, as a scripted answer is, so the guest sees the same timing as long as the
//! driver answers before that moment.

use std::time::Duration;

use super::Worker;
use crate::callout::{Answer, CalloutRequest, Plan};
use crate::state::Delivery;

/// A callout waiting for the driver's answer.
#[derive(Clone, Debug)]
pub struct DeferredCallout {
    /// The call's token (the guest's handle), to answer it with.
    pub token: u32,
    /// When it was dispatched (monotonic ns, the host clock's).
    pub dispatched_at: u64,
    /// What was sent.
    pub request: CalloutRequest,
}

impl Worker {
    /// The deferred callouts dispatched since the last call, in dispatch order. Each is
    /// handed out once; it stays in flight until [`Worker::answer_deferred`] or the
    /// guest's timeout ends it.
    pub fn take_deferred(&mut self) -> Vec<DeferredCallout> {
        let mut taken: Vec<DeferredCallout> = self
            .store
            .data_mut()
            .vm
            .callouts
            .iter_mut()
            .filter_map(|(token, callout)| match &mut callout.delivery {
                Delivery::Deferred { dispatched, request } => {
                    request.take().map(|request| DeferredCallout { token: *token, dispatched_at: *dispatched, request })
                }
                _ => None,
            })
            .collect();
        taken.sort_by_key(|call| (call.dispatched_at, call.token));
        taken
    }

    /// Answers deferred callout `token`: the answer is due its delay after the dispatch,
    /// or at the clock's current time if that has passed (a driver that answers late
    /// delays it; the result is then `true`). A call that has already ended (its
    /// timeout, a reload that dropped it) ignores the answer, as a late answer on the
    /// wire is ignored.
    pub fn answer_deferred(&mut self, token: u32, answer: Answer) -> bool {
        let now = self.clock_monotonic();
        let Some(callout) = self.store.data_mut().vm.callouts.get_mut(&token) else { return false };
        let Delivery::Deferred { dispatched, request: None } = callout.delivery else { return false };
        let (delay, plan) = answer.plan();
        let due = dispatched.saturating_add(nanos(delay));
        // An answer that never arrives (a silent upstream) cannot be late.
        let late = due < now && !matches!(plan, Plan::Stalls { head: false } | Plan::Deferred);
        let at = due.max(now);
        callout.delivery = match plan {
            Plan::Ends(ending) => Delivery::Scheduled { at, ending },
            Plan::Stalls { head } => Delivery::Stalled { head_at: head.then_some(at) },
            // Deferred again: the driver answers it later still.
            Plan::Deferred => Delivery::Deferred { dispatched, request: None },
        };
        late
    }
}

fn nanos(delay: Duration) -> u64 {
    u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX)
}
