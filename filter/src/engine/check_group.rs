//! Group commit of checks, per worker: the check calls a worker has out, and how many
//! requests wait to be sent. While the worker has `max_in_flight` check calls out that
//! are not late, a request that needs a check does not send its own: it waits, and the
//! checks that waited leave together, in one `POST /v1/checks`, as soon as a call comes
//! back (or the tick sees room), or at once when they fill a call (`max_per_call`). A
//! lone request never waits: with fewer calls out and no check waiting, it goes at once.
//! A request that finds checks waiting joins them, even when a call may go: the answer
//! that made room has woken the root, which sends them all together. Otherwise each
//! newcomer could take the room before the root ran, and the checks that waited would
//! wait again, behind it (with one call in flight, the lab measured waits of up to the
//! timeout that way).
//!
//! # A late call holds nothing back
//!
//! A call out for longer than `late_after` (a quarter of the callout timeout) is late: it
//! no longer counts against `max_in_flight`, so the checks that wait behind it go out on
//! a call of their own at the next tick (the tick runs at least every quarter of the
//! timeout while checks may wait). One slow answer therefore costs the requests behind it
//! at most half their timeout of waiting, never their deadline. With a healthy service
//! one call in flight carries every batch (the fewest callouts), and a slow one does not
//! stall the worker: a late call lives at most the timeout, and a new call is sent past
//! it only once every call out is late, so a worker has at most `max_in_flight` calls
//! that are not late and about four generations of late ones out at once.
//!
//! A call that probes an open circuit holds no check back either: while it is out, a
//! request goes to the breaker, which decides it by its failure rule at once, as it did
//! before the circuit opened.
//!
//! # What it costs a request, at most
//!
//! A request waits to be sent for at most the round trip of a call already out (that
//! call's answer makes room), or, when that call is late, until the tick after it became
//! late (at most half the timeout after it was sent); plus one turn of the worker's event
//! loop (the answer wakes the root context, which sends). A full batch does not wait for
//! room, so the queue never holds more than one call's worth. Its deadline is set when it
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

use shared_store::Nanos;
use std::collections::HashMap;

/// The check calls one worker has out, and the requests waiting to be sent.
#[derive(Debug)]
pub(crate) struct CheckGroup {
    /// Most check calls out at once, not counting late ones, before checks wait to go
    /// together (0: every check goes out at once, alone).
    max_in_flight: usize,
    /// How long a call is out before it is late and holds no check back.
    late_after: Nanos,
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
    /// When it was sent.
    sent_at: Nanos,
    /// Whether it probes an open circuit (it holds no check back: while it is out, the
    /// breaker decides the others at once).
    probe: bool,
}

impl CheckGroup {
    /// A group that holds checks back once `max_in_flight` calls are out that were sent
    /// less than `late_after` ago (0: never), sending at most `max_per_call` in one.
    pub(crate) fn new(max_in_flight: usize, max_per_call: usize, late_after: Nanos) -> Self {
        Self { max_in_flight, late_after, max_per_call: max_per_call.max(1), calls: HashMap::new(), queued: 0 }
    }

    /// Whether checks ever wait to go together (a bound on calls in flight is set).
    pub(crate) const fn batches(&self) -> bool {
        self.max_in_flight > 0
    }

    /// Whether a request that needs a check at `now` waits to be sent with others: the
    /// worker has its most calls out that are not late, or checks already wait (they go
    /// first, and it goes with them: a newcomer never takes the room a call's answer
    /// made before the root has sent the checks that waited for it).
    pub(crate) fn must_wait(&self, now: Nanos) -> bool {
        self.max_in_flight > 0 && (self.queued > 0 || self.no_room(now))
    }

    /// Whether the worker has its most calls out that are not late.
    fn no_room(&self, now: Nanos) -> bool {
        self.max_in_flight > 0
            && self.calls.len() >= self.max_in_flight
            && self
                .calls
                .values()
                .filter(|call| !call.probe && now < call.sent_at.saturating_add(self.late_after))
                .count()
                >= self.max_in_flight
    }

    /// Whether a call sent at `now` goes past late calls: the worker has its most calls
    /// out (probes aside), and has room only because some of them are late.
    pub(crate) fn past_late(&self, now: Nanos) -> bool {
        self.max_in_flight > 0
            && self.calls.values().filter(|call| !call.probe).count() >= self.max_in_flight
            && !self.no_room(now)
    }

    /// How many waiting checks may be sent at `now`, in one call: a full batch at once,
    /// whatever is out; fewer once a call may go (0: none waits, or no room).
    pub(crate) fn next_batch(&self, now: Nanos) -> usize {
        if self.queued >= self.max_per_call {
            return self.max_per_call;
        }
        if self.queued == 0 || self.no_room(now) {
            return 0;
        }
        self.queued
    }

    /// Requests waiting to be sent.
    pub(crate) const fn waiting(&self) -> usize {
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

    /// A call went out (callout `token`) for `members` requests at `now`; `probe`: it
    /// probes an open circuit.
    pub(crate) fn sent(&mut self, token: u32, members: usize, now: Nanos, probe: bool) {
        self.calls.insert(token, Call { waiting: members, recorded: false, sent_at: now, probe });
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

    /// When the calls of these tests go out, and how long until one is late.
    const T0: Nanos = Nanos(1_000_000_000);
    const LATE: Nanos = Nanos(12_500_000);

    #[test]
    fn checks_wait_only_while_the_worker_has_its_most_calls_out() {
        let mut group = CheckGroup::new(2, 64, LATE);
        assert!(!group.must_wait(T0));
        group.sent(1, 1, T0, false);
        assert!(!group.must_wait(T0));
        group.sent(2, 1, T0, false);
        assert!(group.must_wait(T0));

        group.left(1);

        assert!(!group.must_wait(T0));
    }

    #[test]
    fn unbatched_checks_never_wait() {
        let mut group = CheckGroup::new(0, 64, LATE);
        for token in 0..100 {
            group.sent(token, 1, T0, false);
        }

        assert!(!group.must_wait(T0));
    }

    #[test]
    fn a_batch_that_is_not_full_waits_for_a_call_to_come_back() {
        let mut group = CheckGroup::new(1, 3, LATE);
        group.sent(7, 1, T0, false);
        group.enqueue();
        group.enqueue();
        assert_eq!(group.next_batch(T0), 0, "the one call allowed is out");

        group.left(7);

        assert_eq!(group.next_batch(T0), 2);
    }

    #[test]
    fn a_full_batch_leaves_at_once_whatever_is_out() {
        let mut group = CheckGroup::new(1, 3, LATE);
        group.sent(7, 1, T0, false);
        for _ in 0..5 {
            group.enqueue();
        }

        assert_eq!(group.next_batch(T0), 3);
        for _ in 0..3 {
            group.dequeue();
        }
        assert_eq!(group.next_batch(T0), 0, "two wait for room");
    }

    #[test]
    fn a_batch_is_counted_out_until_its_last_request_stops_waiting() {
        let mut group = CheckGroup::new(1, 64, LATE);
        group.sent(9, 3, T0, false);
        group.left(9);
        group.left(9);
        assert_eq!(group.in_flight(), 1);

        group.left(9);

        assert_eq!(group.in_flight(), 0);
    }

    #[test]
    fn the_breaker_hears_of_each_call_once() {
        let mut group = CheckGroup::new(1, 64, LATE);
        group.sent(4, 3, T0, false);

        assert!(group.first_record(4));
        assert!(!group.first_record(4));
        assert!(!group.first_record(4));
    }

    #[test]
    fn a_late_call_holds_no_check_back_and_a_call_that_is_not_late_does() {
        let mut group = CheckGroup::new(1, 64, LATE);
        group.sent(1, 1, T0, false);
        group.enqueue();
        let just_before = T0.saturating_add(Nanos(LATE.0 - 1));
        assert_eq!(group.next_batch(just_before), 0, "the one call out is not late yet");

        assert!(!group.past_late(just_before));
        let late = T0.saturating_add(LATE);
        assert!(group.past_late(late), "a call sent now goes past the late one");
        assert_eq!(group.next_batch(late), 1);
        group.dequeue();
        assert!(!group.must_wait(late), "nor does it hold a newcomer back");

        group.sent(2, 1, late, false);
        assert!(group.must_wait(late), "the new call is not late: it holds the next checks back");
        assert!(!group.past_late(late), "no room: nothing goes past");
        assert_eq!(group.in_flight(), 2, "the late call is still out, and still counted until it ends");
    }

    #[test]
    fn a_request_that_finds_checks_waiting_joins_them_even_when_a_call_may_go() {
        let mut group = CheckGroup::new(1, 64, LATE);
        group.sent(1, 1, T0, false);
        group.enqueue();
        group.left(1);
        assert_eq!(group.next_batch(T0), 1, "the answer made room: the root sends the one that waited");

        assert!(group.must_wait(T0), "a newcomer waits with it rather than take the room alone");
        group.enqueue();
        assert_eq!(group.next_batch(T0), 2);
    }

    #[test]
    fn a_probe_holds_no_check_back_the_breaker_decides_the_others_at_once() {
        let mut group = CheckGroup::new(1, 64, LATE);
        group.sent(1, 1, T0, true);

        assert!(!group.must_wait(T0));
    }
}
