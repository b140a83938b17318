//! Why a global policy could not be decided, what the failure rule does about it (one
//! [`Rule`] per cause: [`Cause::rule`] is the table, the fallback stage applies it),
//! which fallback decided instead, and how that is told: the per-cause counter, the
//! fallback header's value, and a log line at most once per [`LOG_INTERVAL`] per cause.

use super::compiled::Compiled;
use super::resolved::{Few, Resolved};
use crate::config::FailureOutcome;
use crate::host::{Counter, Reason};
use shared_store::Nanos;
use std::collections::BTreeMap;

/// The least time between two log lines about the same cause.
pub(crate) const LOG_INTERVAL: Nanos = Nanos::from_secs(10);

/// Why a global policy could not be decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// The counter service could not decide (or the lease could not wait).
    Service(Reason),
    /// Every CAS attempt on the policy's lease record lost to other workers.
    CasExhausted,
    /// The host failed a shared-data call on the policy's lease record.
    StoreError,
}

impl Cause {
    /// Every cause, in a fixed order (for the log limiter).
    const COUNT: usize = Reason::ALL.len() + 2;

    const fn index(self) -> usize {
        match self {
            Self::Service(reason) => reason.index(),
            Self::CasExhausted => Reason::ALL.len(),
            Self::StoreError => Reason::ALL.len() + 1,
        }
    }

    /// The name in logs and the fallback header.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::Service(reason) => reason.name(),
            Self::CasExhausted => "cas_exhausted",
            Self::StoreError => "store_error",
        }
    }

    /// What the failure rule does for it: the table of outcomes, one row per cause. A
    /// new failure class adds its row here (the match names every reason, so it does
    /// not compile until it has one); the fallback stage applies whatever the row says.
    pub(crate) const fn rule(self) -> Rule {
        match self {
            Self::Service(
                Reason::Timeout
                | Reason::Refused
                | Reason::Reset
                | Reason::BadStatus
                | Reason::BadBody
                | Reason::Unauthorized
                | Reason::CircuitOpen
                | Reason::DispatchFailed
                | Reason::LeaseQueueFull
                | Reason::LeaseSlotTaken
                | Reason::LeaseContended
                | Reason::LeaseCold,
            )
            | Self::CasExhausted
            | Self::StoreError => Rule::CONFIGURED,
        }
    }

    /// The per-policy counter that counts it.
    pub(crate) const fn counter(self) -> Counter {
        match self {
            Self::Service(reason) => reason.counter(),
            Self::CasExhausted => Counter::CasExhausted,
            Self::StoreError => Counter::StoreErrors,
        }
    }
}

/// What the failure rule does for one cause: the steps that decide a policy the service
/// could not, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rule {
    /// Whether the policy's emergency cap, when it has one, decides first.
    pub(crate) emergency_cap: bool,
    /// What decides then (or when the cap itself cannot): an outcome of the cause's own,
    /// or `None` for the policy's `on_failure`.
    pub(crate) outcome: Option<FailureOutcome>,
}

impl Rule {
    /// The policy's emergency cap, then its `on_failure`: the rule of every cause so far.
    pub(crate) const CONFIGURED: Self = Self { emergency_cap: true, outcome: None };

    /// What decides a policy configured with `on_failure` once its cap did not (or it
    /// has none).
    pub(crate) fn action(self, on_failure: FailureOutcome) -> FailureOutcome {
        self.outcome.unwrap_or(on_failure)
    }
}

/// Which fallback decided, for logs and the fallback header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fallback {
    /// The policy's local emergency cap.
    Emergency,
    /// Its failure action `allow`.
    FailOpen,
    /// Its failure action `deny`.
    FailClosed,
}

impl Fallback {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::Emergency => "emergency",
            Self::FailOpen => "fail_open",
            Self::FailClosed => "fail_closed",
        }
    }
}

/// What the fallback header says about a request: which fallback decided (the first
/// one), why, and for which policies, e.g. `emergency; reason=timeout; policies=tenant`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Note {
    fallback: Fallback,
    cause: Cause,
    policies: Few<usize>,
}

impl Note {
    /// The header's value, naming the policies from `policies`.
    pub(crate) fn render(&self, policies: &[Compiled]) -> String {
        let mut value = String::with_capacity(48);
        value.push_str(self.fallback.name());
        value.push_str("; reason=");
        value.push_str(self.cause.name());
        value.push_str("; policies=");
        for (i, policy) in self.policies.iter().enumerate() {
            if i > 0 {
                value.push(',');
            }
            if let Some(compiled) = policies.get(*policy) {
                value.push_str(&compiled.policy.name);
            }
        }
        value
    }

    /// Adds the policies of a later fallback of the same request.
    pub(crate) fn merge(note: Option<Self>, fallback: Fallback, cause: Cause, failed: &[(Resolved, Cause)]) -> Self {
        let mut note = note.unwrap_or(Self { fallback, cause, policies: Few::new() });
        for (resolved, _) in failed {
            if !note.policies.contains(&resolved.policy) {
                note.policies.push(resolved.policy);
            }
        }
        note
    }
}

/// One log line per cause per interval, with the count of what it stood for.
#[derive(Debug, Default)]
pub(crate) struct LogLimiter {
    last: [Option<Nanos>; Cause::COUNT],
    suppressed: [u64; Cause::COUNT],
}

impl LogLimiter {
    /// Whether to log now; when so, how many were suppressed since the last line.
    pub(crate) fn admit(&mut self, cause: Cause, now: Nanos) -> Option<u64> {
        let i = cause.index();
        let (Some(last), Some(suppressed)) = (self.last.get_mut(i), self.suppressed.get_mut(i)) else { return None };
        match last {
            Some(at) if now.saturating_sub(*at) < LOG_INTERVAL => {
                *suppressed = suppressed.saturating_add(1);
                None
            }
            _ => {
                *last = Some(now);
                Some(std::mem::take(suppressed))
            }
        }
    }
}

/// The most overrides a worker remembers having logged; beyond it, the oldest is
/// forgotten (and may be logged again sooner).
pub(crate) const MAX_OVERRIDES_LOGGED: usize = 64;

/// When each operator's override (by id) was last logged, on this worker: one line per
/// override per interval.
#[derive(Debug, Default)]
pub(crate) struct OverrideLog {
    last: BTreeMap<u64, Nanos>,
}

impl OverrideLog {
    /// Whether to log `id` at `now`.
    pub(crate) fn admit(&mut self, id: u64, now: Nanos) -> bool {
        if self.last.get(&id).is_some_and(|at| now.saturating_sub(*at) < LOG_INTERVAL) {
            return false;
        }
        if self.last.len() >= MAX_OVERRIDES_LOGGED && !self.last.contains_key(&id) {
            let oldest = self.last.iter().min_by_key(|(_, at)| **at).map(|(id, _)| *id);
            if let Some(oldest) = oldest {
                self.last.remove(&oldest);
            }
        }
        self.last.insert(id, now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_asks_the_emergency_cap_first_then_the_policys_on_failure() {
        let causes = Reason::ALL.iter().map(|r| Cause::Service(*r)).chain([Cause::CasExhausted, Cause::StoreError]);
        for cause in causes {
            assert_eq!(cause.rule(), Rule::CONFIGURED, "{cause:?}");
        }
        let deny = FailureOutcome::Deny(503);
        assert_eq!(Rule::CONFIGURED.action(FailureOutcome::Allow), FailureOutcome::Allow);
        assert_eq!(Rule { emergency_cap: false, outcome: Some(deny) }.action(FailureOutcome::Allow), deny);
    }

    #[test]
    fn an_override_is_logged_once_per_interval_and_the_log_stays_bounded() {
        let mut log = OverrideLog::default();
        let t = Nanos::from_secs(100);

        assert!(log.admit(1, t));
        assert!(!log.admit(1, t.saturating_add(Nanos::from_secs(9))));
        assert!(log.admit(2, t), "another override is its own");
        assert!(log.admit(1, t.saturating_add(LOG_INTERVAL)));
        for id in 10..10 + MAX_OVERRIDES_LOGGED as u64 {
            log.admit(id, t.saturating_add(Nanos::from_secs(id)));
        }
        assert_eq!(log.last.len(), MAX_OVERRIDES_LOGGED);
    }
}
