//! The counter service's circuit breaker, shared by every worker of the proxy through
//! shared data: after `failures` consecutive failed callouts the circuit opens for
//! `cooldown`, during which no callout is made and the failure rule applies at once;
//! then one request at a time (elected with CAS) probes the service, and its success
//! closes the circuit again.
//!
//! The breaker saves the service and the requests from a timeout each while the service
//! is down; it never decides an admission. So when shared data itself fails, it lets the
//! callout through (the callout's own failure handling still applies), and a write that
//! keeps losing races is given up (another worker's write won, which carries the same
//! news).
//!
//! A probe whose stream ends before its answer (the host then cancels its callout) is
//! given up at once, and the next request probes; one that never reports for another
//! reason (its worker died) expires after `probe_window`, and the next request probes
//! instead.
//!
//! Only what says the service is unreachable or unhealthy counts as a failure (a
//! timeout, a refused or reset call, garbage, a 5xx other than a per-key answer, a 401);
//! a per-key answer (`400`, `413`, `503 store_full`, `503 overloaded`) decides its own
//! request by its rule and leaves the breaker alone ([`super::wire::Failure::health`]).
//! And a result counts only for the state it was sent in: a success (or failure) of a
//! call sent before the circuit opened neither closes (nor reopens) it.

use shared_store::{Change, Nanos, Store, UpdateError, words};

/// Attempts at a breaker update before giving it up.
const MAX_ATTEMPTS: u32 = 8;

/// The breaker's state, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Calls flow; `failures` consecutive ones failed.
    Closed { failures: u32 },
    /// No calls until `until`; opened at `since`.
    Open { until: Nanos, since: Nanos },
    /// One probe is out; others wait until `until`, then may probe themselves. The
    /// circuit opened at `since`.
    Probing { until: Nanos, since: Nanos },
}

/// Encoded size: a tag (the variant) and two words.
const SIZE: usize = words::width(2);

impl State {
    fn encode(self) -> [u8; SIZE] {
        let (tag, a, b) = match self {
            Self::Closed { failures } => (0, u64::from(failures), 0),
            Self::Open { until, since } => (1, until.0, since.0),
            Self::Probing { until, since } => (2, until.0, since.0),
        };
        words::encode(tag, &[a, b])
    }

    /// Anything undecodable reads as a closed circuit: the breaker may only ever cost a
    /// timeout, never block callouts because of a bad byte.
    fn decode(bytes: &[u8]) -> Self {
        match words::decode::<2>(bytes) {
            Some((1, [until, since])) => Self::Open { until: Nanos(until), since: Nanos(since) },
            Some((2, [until, since])) => Self::Probing { until: Nanos(until), since: Nanos(since) },
            Some((0, [failures, _])) => Self::Closed { failures: u32::try_from(failures).unwrap_or(u32::MAX) },
            _ => Self::Closed { failures: 0 },
        }
    }

    /// The state stored in `bytes` (a missing breaker is closed).
    fn read(bytes: Option<&[u8]>) -> Self {
        bytes.map_or(Self::Closed { failures: 0 }, Self::decode)
    }
}

/// What a request may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Call the service.
    Call,
    /// Call the service as the probe of an open circuit.
    Probe,
    /// Do not call: the circuit is open.
    Open,
}

/// The breaker of one plugin.
#[derive(Debug)]
pub(crate) struct CircuitBreaker {
    key: String,
    anchor: String,
    failures: u32,
    cooldown: Nanos,
    probe_window: Nanos,
}

impl CircuitBreaker {
    /// A breaker kept under `key`, creating it through `anchor`.
    pub(crate) fn new(key: String, anchor: String, failures: u32, cooldown: Nanos, probe_window: Nanos) -> Self {
        Self { key, anchor, failures: failures.max(1), cooldown, probe_window }
    }

    /// Whether the circuit is closed at `now`, without electing a probe (for calls that
    /// can wait for it to close, such as charges).
    pub(crate) fn admit_quietly(&self, store: &impl Store, now: Nanos) -> Admit {
        let Ok(entry) = store.get(&self.key) else { return Admit::Call };
        match State::read(entry.as_ref().map(|entry| entry.value.as_slice())) {
            State::Closed { .. } => Admit::Call,
            State::Open { until, .. } | State::Probing { until, .. } if now < until => Admit::Open,
            State::Open { .. } | State::Probing { .. } => Admit::Probe,
        }
    }

    /// Whether a request may call the service at `now`.
    pub(crate) fn admit(&self, store: &impl Store, now: Nanos) -> Admit {
        let elected =
            shared_store::update(store, &self.anchor, &self.key, MAX_ATTEMPTS, |current| match State::read(current) {
                State::Closed { .. } => Change::Keep(Admit::Call),
                State::Open { until, .. } | State::Probing { until, .. } if now < until => Change::Keep(Admit::Open),
                State::Open { since, .. } | State::Probing { since, .. } => {
                    let probing = State::Probing { until: now.saturating_add(self.probe_window), since };
                    Change::Write(probing.encode(), Admit::Probe)
                }
            });
        match elected {
            Ok(landed) => landed.result,
            // Everyone else is updating it: someone else is the probe.
            Err(UpdateError::Contended { .. }) => Admit::Open,
            Err(UpdateError::Store(_)) => Admit::Call,
        }
    }

    /// Gives up the probe a request was elected for, whose answer will never come (its
    /// stream ended and the host cancelled the callout): the next request probes at once
    /// instead of waiting out the probe's window.
    pub(crate) fn release_probe(&self, store: &impl Store, now: Nanos) {
        let _ =
            shared_store::update(store, &self.anchor, &self.key, MAX_ATTEMPTS, |current| match State::read(current) {
                State::Probing { since, .. } => Change::Write(State::Open { until: now, since }.encode(), ()),
                State::Closed { .. } | State::Open { .. } => Change::Keep(()),
            });
    }

    /// Records the result of a callout sent at `sent_at`: `Some(true)` healthy,
    /// `Some(false)` unreachable or unhealthy, `None` a per-key answer that says nothing
    /// about the service. Returns whether this call opened the circuit.
    pub(crate) fn record(&self, store: &impl Store, now: Nanos, health: Option<bool>, sent_at: Nanos) -> bool {
        let Some(success) = health else { return false };
        let recorded = shared_store::update(store, &self.anchor, &self.key, MAX_ATTEMPTS, |current| {
            let open = State::Open { until: now.saturating_add(self.cooldown), since: now };
            let next = match (State::read(current), success) {
                (State::Closed { failures: 0 }, true) => return Change::Keep(false),
                // A call sent before the circuit opened says nothing about it now.
                (State::Open { since, .. } | State::Probing { since, .. }, _) if sent_at < since => {
                    return Change::Keep(false);
                }
                (_, true) => State::Closed { failures: 0 },
                (State::Closed { failures }, false) if failures.saturating_add(1) >= self.failures => open,
                (State::Closed { failures }, false) => State::Closed { failures: failures.saturating_add(1) },
                (State::Probing { .. }, false) => open,
                (State::Open { .. }, false) => return Change::Keep(false),
            };
            Change::Write(next.encode(), matches!(next, State::Open { .. }))
        });
        recorded.is_ok_and(|landed| landed.result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_store::MemoryStore;

    fn breaker() -> CircuitBreaker {
        CircuitBreaker::new("b".into(), "a".into(), 3, Nanos::from_secs(2), Nanos::from_secs(1))
    }

    const T: Nanos = Nanos(1_000_000_000_000);

    #[test]
    fn the_circuit_opens_after_consecutive_failures_and_stays_open_for_the_cooldown() {
        let (store, b) = (MemoryStore::new(), breaker());

        let opened: Vec<bool> = (0..3).map(|_| b.record(&store, T, Some(false), T)).collect();

        assert_eq!(opened, [false, false, true]);
        assert_eq!(b.admit(&store, T), Admit::Open);
        assert_eq!(b.admit(&store, T.saturating_add(Nanos::from_millis(1999))), Admit::Open);
    }

    #[test]
    fn a_success_resets_the_count_of_failures() {
        let (store, b) = (MemoryStore::new(), breaker());

        b.record(&store, T, Some(false), T);
        b.record(&store, T, Some(false), T);
        b.record(&store, T, Some(true), T);
        b.record(&store, T, Some(false), T);

        assert_eq!(b.admit(&store, T), Admit::Call);
    }

    #[test]
    fn after_the_cooldown_one_request_probes_and_the_others_wait() {
        let (store, b) = (MemoryStore::new(), breaker());
        (0..3).for_each(|_| {
            b.record(&store, T, Some(false), T);
        });
        let later = T.saturating_add(Nanos::from_secs(2));

        assert_eq!(b.admit(&store, later), Admit::Probe);
        assert_eq!(b.admit(&store, later), Admit::Open);
        b.record(&store, later, Some(true), later);
        assert_eq!(b.admit(&store, later), Admit::Call);
    }

    #[test]
    fn a_failed_probe_opens_the_circuit_for_another_cooldown() {
        let (store, b) = (MemoryStore::new(), breaker());
        (0..3).for_each(|_| {
            b.record(&store, T, Some(false), T);
        });
        let later = T.saturating_add(Nanos::from_secs(2));
        assert_eq!(b.admit(&store, later), Admit::Probe);

        assert!(b.record(&store, later, Some(false), later));
        assert_eq!(b.admit(&store, later.saturating_add(Nanos::from_millis(1999))), Admit::Open);
        assert_eq!(b.admit(&store, later.saturating_add(Nanos::from_secs(2))), Admit::Probe);
    }

    #[test]
    fn a_probe_that_never_reports_is_replaced_after_its_window() {
        let (store, b) = (MemoryStore::new(), breaker());
        (0..3).for_each(|_| {
            b.record(&store, T, Some(false), T);
        });
        let later = T.saturating_add(Nanos::from_secs(2));
        assert_eq!(b.admit(&store, later), Admit::Probe);

        assert_eq!(b.admit(&store, later.saturating_add(Nanos::from_millis(999))), Admit::Open);
        assert_eq!(b.admit(&store, later.saturating_add(Nanos::from_secs(1))), Admit::Probe);
    }

    #[test]
    fn a_success_sent_before_the_circuit_opened_does_not_close_it() {
        let (store, b) = (MemoryStore::new(), breaker());
        let early = T.saturating_sub(Nanos::from_millis(50));
        (0..3).for_each(|_| {
            b.record(&store, T, Some(false), T);
        });

        // A slow answer to a call sent before the failures, arriving now.
        b.record(&store, T.saturating_add(Nanos(1)), Some(true), early);

        assert_eq!(b.admit(&store, T.saturating_add(Nanos(2))), Admit::Open);
    }

    #[test]
    fn a_per_key_answer_neither_opens_nor_closes_the_circuit() {
        let (store, b) = (MemoryStore::new(), breaker());

        let opened: Vec<bool> = (0..10).map(|_| b.record(&store, T, None, T)).collect();

        assert!(opened.iter().all(|o| !o));
        assert_eq!(b.admit(&store, T), Admit::Call);
    }

    #[test]
    fn a_quiet_look_elects_no_probe() {
        let (store, b) = (MemoryStore::new(), breaker());
        (0..3).for_each(|_| {
            b.record(&store, T, Some(false), T);
        });
        let later = T.saturating_add(Nanos::from_secs(2));

        assert_eq!(b.admit_quietly(&store, T), Admit::Open);
        assert_eq!(b.admit_quietly(&store, later), Admit::Probe);
        assert_eq!(b.admit(&store, later), Admit::Probe, "the quiet look took nobody's probe");
    }

    #[test]
    fn garbage_in_the_breaker_key_reads_as_a_closed_circuit() {
        let (store, b) = (MemoryStore::new(), breaker());
        let _ = store.set("b", b"garbage", None).unwrap();

        assert_eq!(b.admit(&store, T), Admit::Call);
        b.record(&store, T, Some(false), T);
        assert_eq!(State::decode(&store.get("b").unwrap().unwrap().value), State::Closed { failures: 1 });
    }
}
