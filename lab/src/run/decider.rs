//! The counter service's side of the fleet: the calls the proxies made, decided in one
//! order whatever the threads.

use crate::service::Service;
use wasm_host::{Answer, Clock as _, DeferredCallout, VirtualClock};

/// A call to the service: when it was made (ns from the start), by which proxy and
/// worker.
pub(super) struct Call {
    pub(super) at: u64,
    pub(super) proxy: usize,
    pub(super) worker: usize,
    pub(super) call: DeferredCallout,
}

/// An answer for a proxy: its worker, the call's token and time, the answer.
pub(super) type Reply = (usize, u32, u64, Answer);

/// The service and the calls it has not decided yet.
pub(super) struct Decider {
    pub(super) service: Service,
    /// The service's clock (the proxies have one each).
    clock: VirtualClock,
    /// The clock's monotonic time at the run's start.
    start: u64,
    waiting: Vec<Call>,
    /// Every call made before this time (ns from the start) has been decided.
    decided: u64,
    /// Calls that came after a later one was decided: always 0, as the way the proxies
    /// run side by side promises (counted so that tests hold it to that).
    pub(super) late_calls: u64,
}

impl Decider {
    pub(super) fn new(service: Service, clock: VirtualClock) -> Self {
        let start = clock.monotonic_nanos();
        Self { service, clock, start, waiting: Vec::new(), decided: 0, late_calls: 0 }
    }

    /// Moves the service's clock to `t` (ns from the start; never backwards).
    pub(super) fn advance_to(&self, t: u64) {
        self.clock.advance_to_monotonic(self.start + t);
    }

    /// Adds calls to decide.
    pub(super) fn add(&mut self, calls: impl IntoIterator<Item = Call>) {
        let decided = self.decided;
        let late = &mut self.late_calls;
        self.waiting.extend(calls.into_iter().inspect(|call| *late += u64::from(call.at < decided)));
    }

    /// Whether a call made before `t` (ns from the start) waits to be decided.
    pub(super) fn has_calls_before(&self, t: u64) -> bool {
        self.waiting.iter().any(|c| c.at < t)
    }

    /// Decides every call made before `before` (ns from the start), in the order (time,
    /// proxy, worker, call), each on the service's clock at its time: the replies, per
    /// proxy. The caller promises that no proxy will make a call before `before` any
    /// more.
    pub(super) fn decide(&mut self, before: u64, proxies: usize) -> Vec<Vec<Reply>> {
        let mut replies: Vec<Vec<Reply>> = (0..proxies).map(|_| Vec::new()).collect();
        self.decided = self.decided.max(before);
        if !self.has_calls_before(before) {
            return replies;
        }
        self.waiting.sort_by_key(|c| (c.at, c.proxy, c.worker, c.call.dispatched_at, c.call.token));
        let later = self.waiting.partition_point(|c| c.at < before);
        let rest = self.waiting.split_off(later);
        for Call { at, proxy, worker, call } in std::mem::replace(&mut self.waiting, rest) {
            self.advance_to(at);
            let answer = self.service.answer(proxy, &call.request);
            if let Some(replies) = replies.get_mut(proxy) {
                replies.push((worker, call.token, at, answer));
            }
        }
        replies
    }
}
