//! Group commit of checks, per worker: the check calls a worker has out, and how many
//! requests wait to be sent. While the worker has `max_in_flight` check calls out, a
//! request that needs a check does not send its own: it waits, and the checks that
//! waited leave together, in one `POST /v1/checks`, as soon as a call comes back (or the
//! tick sees room), or at once when they fill a call (`max_per_call`). A lone request
//! never waits: with fewer calls out, it goes at once.
//!
//! # What it costs a request, at most
//!
//! A request waits to be sent for at most the round trip of a call already out (that
//! call's answer, or its deadline, makes room; a full batch does not wait for room, so
//! the queue never holds more than one call's worth), plus one turn of the worker's
//! event loop (the answer wakes the root context, which sends). Its deadline is set when it
//! first asks and never moves, so the wait is inside the deadline it always had: a
//! request whose deadline passes before it is sent takes its failure rule, counted as
//! `checks_unsent`.
//!
//! # One health record per call
//!
//! The circuit breaker hears of each call once: its answer, its failure, or its first
//! member to reach its deadline. A batch whose transport fails counts as one failure,
//! not one per request; a check the service answered with an error for that check
//! alone says nothing about the service's health.

use std::collections::HashMap;

/// The check calls one worker has out, and the requests waiting to be sent.
#[derive(Debug)]
pub(crate) struct CheckGroup {
    /// Most check calls out at once before checks wait to go together (0: every check
    /// goes out at once, alone).
    max_in_flight: usize,
    /// Most checks in one call.
    max_per_call: usize,
    /// Calls out, by callout token.
    calls: HashMap<u32, Call>,
    /// Requests waiting to be sent.
    queued: usize,
}

/// One call out.
#[derive(Debug, Clone, Copy)]
struct Call {
    /// Its requests still waiting for its answer.
    waiting: usize,
    /// Whether the circuit breaker has heard of it.
    recorded: bool,
}

impl CheckGroup {
    /// A group that holds checks back once `max_in_flight` calls are out (0: never),
    /// sending at most `max_per_call` in one.
    pub(crate) fn new(max_in_flight: usize, max_per_call: usize) -> Self {
        Self { max_in_flight, max_per_call: max_per_call.max(1), calls: HashMap::new(), queued: 0 }
    }

    /// Whether checks ever wait to go together (a bound on calls in flight is set).
    pub(crate) const fn batches(&self) -> bool {
        self.max_in_flight > 0
    }

    /// Whether a request that needs a check now waits to be sent with others.
    pub(crate) fn must_wait(&self) -> bool {
        self.max_in_flight > 0 && self.calls.len() >= self.max_in_flight
    }

    /// How many waiting checks may be sent now, in one call: a full batch at once,
    /// whatever is out; fewer once a call may go (0: none waits, or no room).
    pub(crate) fn next_batch(&self) -> usize {
        if self.queued >= self.max_per_call {
            return self.max_per_call;
        }
        if self.queued == 0 || self.must_wait() {
            return 0;
        }
        self.queued
    }

    /// A request began waiting to be sent.
    pub(crate) fn enqueue(&mut self) {
        self.queued = self.queued.saturating_add(1);
    }

    /// A request stopped waiting to be sent (sent, timed out, or its stream ended).
    pub(crate) fn dequeue(&mut self) {
        self.queued = self.queued.saturating_sub(1);
    }

    /// Calls out.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.calls.len()
    }

    /// A call went out (callout `token`) for `members` requests.
    pub(crate) fn sent(&mut self, token: u32, members: usize) {
        self.calls.insert(token, Call { waiting: members, recorded: false });
    }

    /// A request stopped waiting for call `token` (answered, timed out, or its stream
    /// ended); the call is no longer counted once none of its requests waits for it.
    pub(crate) fn left(&mut self, token: u32) {
        if let Some(call) = self.calls.get_mut(&token) {
            call.waiting = call.waiting.saturating_sub(1);
            if call.waiting == 0 {
                self.calls.remove(&token);
            }
        }
    }

    /// Whether call `token`'s outcome is news to the circuit breaker: true once per call
    /// (and for a call this group does not know, which no other record can repeat).
    pub(crate) fn first_record(&mut self, token: u32) -> bool {
        match self.calls.get_mut(&token) {
            Some(call) => !std::mem::replace(&mut call.recorded, true),
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_wait_only_while_the_worker_has_its_most_calls_out() {
        let mut group = CheckGroup::new(2, 64);
        assert!(!group.must_wait());
        group.sent(1, 1);
        assert!(!group.must_wait());
        group.sent(2, 1);
        assert!(group.must_wait());

        group.left(1);

        assert!(!group.must_wait());
    }

    #[test]
    fn unbatched_checks_never_wait() {
        let mut group = CheckGroup::new(0, 64);
        for token in 0..100 {
            group.sent(token, 1);
        }

        assert!(!group.must_wait());
    }

    #[test]
    fn a_batch_that_is_not_full_waits_for_a_call_to_come_back() {
        let mut group = CheckGroup::new(1, 3);
        group.sent(7, 1);
        group.enqueue();
        group.enqueue();
        assert_eq!(group.next_batch(), 0, "the one call allowed is out");

        group.left(7);

        assert_eq!(group.next_batch(), 2);
    }

    #[test]
    fn a_full_batch_leaves_at_once_whatever_is_out() {
        let mut group = CheckGroup::new(1, 3);
        group.sent(7, 1);
        for _ in 0..5 {
            group.enqueue();
        }

        assert_eq!(group.next_batch(), 3);
        for _ in 0..3 {
            group.dequeue();
        }
        assert_eq!(group.next_batch(), 0, "two wait for room");
    }

    #[test]
    fn a_batch_is_counted_out_until_its_last_request_stops_waiting() {
        let mut group = CheckGroup::new(1, 64);
        group.sent(9, 3);
        group.left(9);
        group.left(9);
        assert_eq!(group.in_flight(), 1);

        group.left(9);

        assert_eq!(group.in_flight(), 0);
    }

    #[test]
    fn the_breaker_hears_of_each_call_once() {
        let mut group = CheckGroup::new(1, 64);
        group.sent(4, 3);

        assert!(group.first_record(4));
        assert!(!group.first_record(4));
        assert!(!group.first_record(4));
    }
}
