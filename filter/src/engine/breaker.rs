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
//! A probe that never reports (its worker died, its stream was reset) expires after
//! `probe_window`, and the next request probes instead.

use shared_store::{Cas, Nanos, Store, Swap};

/// Attempts at a breaker update before giving it up.
const MAX_ATTEMPTS: u32 = 8;

/// The breaker's state, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Calls flow; `failures` consecutive ones failed.
    Closed { failures: u32 },
    /// No calls until `until`.
    Open { until: Nanos },
    /// One probe is out; others wait until `until`, then may probe themselves.
    Probing { until: Nanos },
}

impl State {
    fn encode(self) -> [u8; 9] {
        let (tag, value) = match self {
            Self::Closed { failures } => (0u8, u64::from(failures)),
            Self::Open { until } => (1, until.0),
            Self::Probing { until } => (2, until.0),
        };
        let value = value.to_le_bytes();
        std::array::from_fn(|i| if i == 0 { tag } else { value.get(i - 1).copied().unwrap_or(0) })
    }

    /// Anything undecodable reads as a closed circuit: the breaker may only ever cost a
    /// timeout, never block callouts because of a bad byte.
    fn decode(bytes: &[u8]) -> Self {
        let value = bytes.get(1..9).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_le_bytes);
        match (bytes.first(), value, bytes.len()) {
            (Some(1), Some(until), 9) => Self::Open { until: Nanos(until) },
            (Some(2), Some(until), 9) => Self::Probing { until: Nanos(until) },
            (Some(0), Some(failures), 9) => Self::Closed { failures: u32::try_from(failures).unwrap_or(u32::MAX) },
            _ => Self::Closed { failures: 0 },
        }
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

    fn read(&self, store: &impl Store) -> Option<(State, Option<Cas>)> {
        match store.get(&self.key) {
            Ok(Some(entry)) => Some((State::decode(&entry.value), Some(entry.cas))),
            Ok(None) => Some((State::Closed { failures: 0 }, None)),
            Err(_) => None,
        }
    }

    fn write(&self, store: &impl Store, state: State, cas: Option<Cas>) -> Option<Swap> {
        let bytes = state.encode();
        match cas {
            Some(cas) => store.set(&self.key, &bytes, Some(cas)).ok(),
            None => shared_store::create(store, &self.anchor, &self.key, &bytes).ok(),
        }
    }

    /// Whether a request may call the service at `now`.
    pub(crate) fn admit(&self, store: &impl Store, now: Nanos) -> Admit {
        for _ in 0..MAX_ATTEMPTS {
            let Some((state, cas)) = self.read(store) else { return Admit::Call };
            match state {
                State::Closed { .. } => return Admit::Call,
                State::Open { until } | State::Probing { until } if now < until => return Admit::Open,
                State::Open { .. } | State::Probing { .. } => {
                    match self.write(store, State::Probing { until: now.saturating_add(self.probe_window) }, cas) {
                        Some(Swap::Written) => return Admit::Probe,
                        Some(Swap::Conflict) => {}
                        None => return Admit::Call,
                    }
                }
            }
        }
        // Everyone else is updating it: someone else is the probe.
        Admit::Open
    }

    /// Records a callout's result; returns whether this call opened the circuit.
    pub(crate) fn record(&self, store: &impl Store, now: Nanos, success: bool) -> bool {
        for _ in 0..MAX_ATTEMPTS {
            let Some((state, cas)) = self.read(store) else { return false };
            let next = match (state, success) {
                (State::Closed { failures: 0 }, true) => return false,
                (_, true) => State::Closed { failures: 0 },
                (State::Closed { failures }, false) if failures.saturating_add(1) >= self.failures => {
                    State::Open { until: now.saturating_add(self.cooldown) }
                }
                (State::Closed { failures }, false) => State::Closed { failures: failures.saturating_add(1) },
                (State::Probing { .. }, false) => State::Open { until: now.saturating_add(self.cooldown) },
                (State::Open { .. }, false) => return false,
            };
            match self.write(store, next, cas) {
                Some(Swap::Written) => return matches!(next, State::Open { .. }),
                Some(Swap::Conflict) => {}
                None => return false,
            }
        }
        false
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

        let opened: Vec<bool> = (0..3).map(|_| b.record(&store, T, false)).collect();

        assert_eq!(opened, [false, false, true]);
        assert_eq!(b.admit(&store, T), Admit::Open);
        assert_eq!(b.admit(&store, T.saturating_add(Nanos::from_millis(1999))), Admit::Open);
    }

    #[test]
    fn a_success_resets_the_count_of_failures() {
        let (store, b) = (MemoryStore::new(), breaker());

        b.record(&store, T, false);
        b.record(&store, T, false);
        b.record(&store, T, true);
        b.record(&store, T, false);

        assert_eq!(b.admit(&store, T), Admit::Call);
    }

    #[test]
    fn after_the_cooldown_one_request_probes_and_the_others_wait() {
        let (store, b) = (MemoryStore::new(), breaker());
        (0..3).for_each(|_| {
            b.record(&store, T, false);
        });
        let later = T.saturating_add(Nanos::from_secs(2));

        assert_eq!(b.admit(&store, later), Admit::Probe);
        assert_eq!(b.admit(&store, later), Admit::Open);
        b.record(&store, later, true);
        assert_eq!(b.admit(&store, later), Admit::Call);
    }

    #[test]
    fn a_failed_probe_opens_the_circuit_for_another_cooldown() {
        let (store, b) = (MemoryStore::new(), breaker());
        (0..3).for_each(|_| {
            b.record(&store, T, false);
        });
        let later = T.saturating_add(Nanos::from_secs(2));
        assert_eq!(b.admit(&store, later), Admit::Probe);

        assert!(b.record(&store, later, false));
        assert_eq!(b.admit(&store, later.saturating_add(Nanos::from_millis(1999))), Admit::Open);
        assert_eq!(b.admit(&store, later.saturating_add(Nanos::from_secs(2))), Admit::Probe);
    }

    #[test]
    fn a_probe_that_never_reports_is_replaced_after_its_window() {
        let (store, b) = (MemoryStore::new(), breaker());
        (0..3).for_each(|_| {
            b.record(&store, T, false);
        });
        let later = T.saturating_add(Nanos::from_secs(2));
        assert_eq!(b.admit(&store, later), Admit::Probe);

        assert_eq!(b.admit(&store, later.saturating_add(Nanos::from_millis(999))), Admit::Open);
        assert_eq!(b.admit(&store, later.saturating_add(Nanos::from_secs(1))), Admit::Probe);
    }

    #[test]
    fn garbage_in_the_breaker_key_reads_as_a_closed_circuit() {
        let (store, b) = (MemoryStore::new(), breaker());
        let _ = store.set("b", b"garbage", None).unwrap();

        assert_eq!(b.admit(&store, T), Admit::Call);
        b.record(&store, T, false);
        assert_eq!(State::decode(&store.get("b").unwrap().unwrap().value), State::Closed { failures: 1 });
    }
}
