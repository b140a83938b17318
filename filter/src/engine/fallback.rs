//! The failure rule of global policies, applied when the counter service cannot decide
//! (slow, unreachable, an error or garbage, the circuit open): first the policy's local
//! emergency cap, if it has one; then its failure action, `allow` (fail open) or `deny`
//! (fail closed, with its status). Every such decision is counted by policy and reason,
//! logged at most once per [`LOG_INTERVAL`] per reason, and named by the fallback header
//! when one is configured.
//!
//! All or nothing still holds: a request that a fallback rejects gives its local
//! reservation back, and the emergency caps of a request are decided together.

use super::resolve::{Few, Place};
use super::wire::Reason;
use super::{Begun, Decided, Engine, Home, Pending, count_error, count_evidence};
use crate::config::FailureOutcome;
use crate::host::{Counter, Metrics, PluginCounter};
use shared_store::{Clock, Decision, Limiter, Nanos, Placement, Request, Store};

/// The least time between two log lines about the same reason.
pub(crate) const LOG_INTERVAL: Nanos = Nanos::from_secs(10);

/// The counter of a reason.
const fn degraded(reason: Reason) -> Counter {
    match reason {
        Reason::Timeout => Counter::DegradedTimeout,
        Reason::Refused => Counter::DegradedRefused,
        Reason::Reset => Counter::DegradedReset,
        Reason::BadStatus => Counter::DegradedBadStatus,
        Reason::BadBody => Counter::DegradedBadBody,
        Reason::Unauthorized => Counter::DegradedUnauthorized,
        Reason::CircuitOpen => Counter::DegradedCircuitOpen,
        Reason::DispatchFailed => Counter::DegradedDispatchFailed,
        Reason::LeaseQueueFull => Counter::DegradedLeaseQueueFull,
        Reason::LeaseSlotTaken => Counter::DegradedLeaseSlotTaken,
    }
}

/// Which fallback decided, for logs and the fallback header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fallback {
    Emergency,
    FailOpen,
    FailClosed,
}

impl Fallback {
    const fn name(self) -> &'static str {
        match self {
            Self::Emergency => "emergency",
            Self::FailOpen => "fail_open",
            Self::FailClosed => "fail_closed",
        }
    }
}

/// One log line per reason per interval, with the count of what it stood for.
#[derive(Debug, Default)]
pub(crate) struct LogLimiter {
    last: [Option<Nanos>; Reason::ALL.len()],
    suppressed: [u64; Reason::ALL.len()],
}

impl LogLimiter {
    /// Whether to log now; when so, how many were suppressed since the last line.
    fn admit(&mut self, reason: Reason, now: Nanos) -> Option<u64> {
        let i = reason.index();
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

impl Engine {
    /// Applies the failure rule of every global policy of `pending.global` (see the module
    /// docs); what it admits goes on (to the leases still to spend, then the admission).
    pub(super) fn degrade<S: Store, C: Clock>(
        &self,
        reason: Reason,
        mut pending: Pending,
        limiter: &Limiter<S, C>,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Begun {
        for resolved in &pending.global {
            metrics.add(resolved.policy, degraded(reason), 1);
        }
        // 1. A policy without a cap that fails closed rejects the request.
        let closed = pending.global.iter().find_map(|r| {
            let compiled = self.compiled(r.policy)?;
            match (&compiled.home, compiled.policy.on_failure) {
                (Home::Global { cap: None, .. }, FailureOutcome::Deny(status)) => Some(status),
                _ => None,
            }
        });
        if let Some(status) = closed {
            return Begun::Decided(self.fail_closed(reason, status, pending, limiter, metrics));
        }
        // 2. The emergency caps decide together.
        let capped: Few<(usize, Placement, u64)> = pending
            .global
            .iter()
            .filter_map(|r| match &r.at {
                Place::Global { cap: Some(place), .. } => Some((r.policy, place.clone(), r.cost)),
                _ => None,
            })
            .collect();
        let mut fallback = Fallback::FailOpen;
        let mut cap_failed = false;
        if !capped.is_empty() {
            let requests: Few<Request<'_>> = capped
                .iter()
                .filter_map(|(policy, place, cost)| {
                    let Home::Global { cap: Some(cap), .. } = &self.compiled(*policy)?.home else { return None };
                    Some(Request { place, limit: &cap.limit, cost: *cost })
                })
                .collect();
            match limiter.reserve(&requests) {
                Ok((admission, reservation)) => {
                    let decisions: Few<(usize, Decision)> =
                        capped.iter().map(|(p, _, _)| *p).zip(admission.decisions.iter().copied()).collect();
                    for (policy, _) in &decisions {
                        count_evidence(metrics, *policy, &admission);
                    }
                    if admission.created > 0 {
                        metrics.add_plugin(PluginCounter::KeysCreated, i64::from(admission.created));
                    }
                    if !admission.admitted {
                        for (policy, decision) in &decisions {
                            let counter = if decision.is_admitted() {
                                Counter::EmergencyAllowed
                            } else {
                                Counter::EmergencyRejected
                            };
                            metrics.add(*policy, counter, 1);
                        }
                        self.log_degraded(reason, Fallback::Emergency, limiter.clock().now());
                        pending.fallback = Some(header_value(Fallback::Emergency, reason));
                        let strictest = super::headers::strictest_rejection(&decisions);
                        let status = self.response.status;
                        return Begun::Decided(self.reject_pending(pending, strictest, status, limiter, metrics));
                    }
                    for (policy, _) in &decisions {
                        metrics.add(*policy, Counter::EmergencyAllowed, 1);
                    }
                    limiter.commit(reservation);
                    fallback = Fallback::Emergency;
                }
                Err(error) => {
                    for (policy, _, _) in &capped {
                        count_error(metrics, *policy, &error);
                    }
                    cap_failed = true;
                }
            }
        }
        // 3. What is left follows its failure action; a cap that could not decide too.
        let mut deny = None;
        for r in &pending.global {
            let Some(compiled) = self.compiled(r.policy) else { continue };
            let has_cap = matches!(&compiled.home, Home::Global { cap: Some(_), .. });
            if has_cap && !cap_failed {
                continue;
            }
            match compiled.policy.on_failure {
                FailureOutcome::Deny(status) => deny = deny.or(Some(status)),
                FailureOutcome::Allow => metrics.add(r.policy, Counter::FailureAllowed, 1),
            }
        }
        if let Some(status) = deny {
            return Begun::Decided(self.fail_closed(reason, status, pending, limiter, metrics));
        }
        self.log_degraded(reason, fallback, limiter.clock().now());
        // Admitted without the service: lease policies owe what they admitted.
        let now = limiter.clock().now();
        for r in std::mem::take(&mut pending.global) {
            if let Place::Global { lease: Some(slot), .. } = &r.at {
                self.owe(r.policy, slot, r.cost, now, limiter, metrics);
            }
        }
        pending.fallback = Some(header_value(fallback, reason));
        self.proceed(pending, limiter, room_to_pause, metrics)
    }

    fn fail_closed<S: Store, C: Clock>(
        &self,
        reason: Reason,
        status: u16,
        mut pending: Pending,
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) -> Decided {
        for r in &pending.global {
            if let Some(compiled) = self.compiled(r.policy)
                && matches!(compiled.policy.on_failure, FailureOutcome::Deny(_))
            {
                metrics.add(r.policy, Counter::FailureDenied, 1);
            }
        }
        self.log_degraded(reason, Fallback::FailClosed, limiter.clock().now());
        pending.fallback = Some(header_value(Fallback::FailClosed, reason));
        self.reject_pending(pending, None, status, limiter, metrics)
    }

    fn log_degraded(&self, reason: Reason, fallback: Fallback, now: Nanos) {
        let Ok(mut limiter) = self.degraded.try_borrow_mut() else { return };
        if let Some(suppressed) = limiter.admit(reason, now) {
            log::warn!(
                "sluice: the counter service could not decide ({}); fallback {} decided \
                 ({suppressed} more since the last line about this reason)",
                reason.name(),
                fallback.name()
            );
        }
    }
}

fn header_value(fallback: Fallback, reason: Reason) -> String {
    let mut value = String::with_capacity(40);
    value.push_str(fallback.name());
    value.push_str("; reason=");
    value.push_str(reason.name());
    value
}
