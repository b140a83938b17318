//! The failure rule of global policies, applied to each policy the counter service (or
//! the policy's lease record) could not decide: first the policy's local emergency cap,
//! if it has one; then its failure action, `allow` (fail open) or `deny` (fail closed,
//! with its status). Every such decision is counted by policy and by its own cause,
//! logged at most once per [`LOG_INTERVAL`] per cause, and named by the fallback header
//! when one is configured.
//!
//! The rule is applied to exactly the policies that could not be decided, each with its
//! cause; the request's other policies are decided as usual before and after (a check
//! that failed leaves the lease policies to spend, a lease whose slot is taken leaves
//! the other leases to spend). All or nothing still holds: a request that a fallback
//! rejects gives back everything it had spent, and the emergency caps of a request are
//! decided together.

use super::resolve::{Few, Place, Resolved};
use super::wire::Reason;
use super::{Decided, Engine, Home, Pending, count_error, count_evidence};
use crate::config::FailureOutcome;
use crate::host::{Counter, Metrics, PluginCounter};
use shared_store::{Clock, Decision, Limiter, Nanos, Placement, Request, Store};

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

    /// The per-policy counter that counts it.
    const fn counter(self) -> Counter {
        match self {
            Self::Service(Reason::Timeout) => Counter::DegradedTimeout,
            Self::Service(Reason::Refused) => Counter::DegradedRefused,
            Self::Service(Reason::Reset) => Counter::DegradedReset,
            Self::Service(Reason::BadStatus) => Counter::DegradedBadStatus,
            Self::Service(Reason::BadBody) => Counter::DegradedBadBody,
            Self::Service(Reason::Unauthorized) => Counter::DegradedUnauthorized,
            Self::Service(Reason::CircuitOpen) => Counter::DegradedCircuitOpen,
            Self::Service(Reason::DispatchFailed) => Counter::DegradedDispatchFailed,
            Self::Service(Reason::LeaseQueueFull) => Counter::DegradedLeaseQueueFull,
            Self::Service(Reason::LeaseSlotTaken) => Counter::DegradedLeaseSlotTaken,
            Self::CasExhausted => Counter::CasExhausted,
            Self::StoreError => Counter::StoreErrors,
        }
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

/// What the fallback header says about a request: which fallback decided (the first
/// one), why, and for which policies, e.g. `emergency; reason=timeout; policies=tenant`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Note {
    fallback: Fallback,
    cause: Cause,
    policies: Few<usize>,
}

impl Note {
    /// The header's value.
    pub(crate) fn render(&self, engine: &Engine) -> String {
        let mut value = String::with_capacity(48);
        value.push_str(self.fallback.name());
        value.push_str("; reason=");
        value.push_str(self.cause.name());
        value.push_str("; policies=");
        for (i, policy) in self.policies.iter().enumerate() {
            if i > 0 {
                value.push(',');
            }
            if let Some(compiled) = engine.compiled(*policy) {
                value.push_str(&compiled.policy.name);
            }
        }
        value
    }

    /// Adds the policies of a later fallback of the same request.
    fn merge(note: Option<Self>, fallback: Fallback, cause: Cause, failed: &[(Resolved, Cause)]) -> Self {
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
    fn admit(&mut self, cause: Cause, now: Nanos) -> Option<u64> {
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

impl Engine {
    /// Counts each of `failed` under its cause, for a request rejected by another of its
    /// policies before the failure rule was needed.
    pub(super) fn count_causes(&self, failed: &[(Resolved, Cause)], metrics: &mut impl Metrics) {
        for (resolved, cause) in failed {
            metrics.add(resolved.policy, cause.counter(), 1);
        }
    }

    /// Applies the failure rule to each of `failed` (a policy and why it could not be
    /// decided; see the module docs). `Ok` with the request when it may go on (what the
    /// rule admitted is reserved on the caps, and owed by lease policies); `Err` with
    /// the rejection otherwise (everything the request spent given back).
    pub(super) fn apply_failure_rule<S: Store, C: Clock>(
        &self,
        failed: Few<(Resolved, Cause)>,
        mut pending: Pending,
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) -> Result<Pending, Decided> {
        let Some(first) = failed.first().map(|(_, cause)| *cause) else { return Ok(pending) };

        let now = limiter.clock().now();
        self.count_causes(&failed, metrics);
        // 1. A policy without a cap that fails closed rejects the request.
        let closed = failed.iter().find_map(|(r, cause)| {
            let compiled = self.compiled(r.policy)?;
            match (&compiled.home, compiled.policy.on_failure) {
                (Home::Global { cap: None, .. }, FailureOutcome::Deny(status)) => Some((status, *cause)),
                _ => None,
            }
        });
        if let Some((status, cause)) = closed {
            return Err(self.fail_closed(cause, status, &failed, pending, limiter, metrics));
        }
        // 2. The emergency caps decide together.
        let capped: Few<(usize, Placement, u64)> = failed
            .iter()
            .filter_map(|(r, _)| match &r.at {
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
                        self.log_degraded(first, Fallback::Emergency, now);
                        pending.fallback = Some(Note::merge(pending.fallback, Fallback::Emergency, first, &failed));
                        let strictest = super::headers::strictest_rejection(&decisions);
                        let status = self.response.status;
                        let rejected = self.reject_pending(pending, strictest, status, limiter, metrics);
                        return Err(rejected);
                    }
                    for (policy, _) in &decisions {
                        metrics.add(*policy, Counter::EmergencyAllowed, 1);
                    }
                    // Kept with the request's local reservation: committed or given back
                    // with it, so a later stage's rejection gives the cap's spend back.
                    pending.reservation = pending.reservation.join(reservation);
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
        for (r, cause) in &failed {
            let Some(compiled) = self.compiled(r.policy) else { continue };
            let has_cap = matches!(&compiled.home, Home::Global { cap: Some(_), .. });
            if has_cap && !cap_failed {
                continue;
            }
            match compiled.policy.on_failure {
                FailureOutcome::Deny(status) => deny = deny.or(Some((status, *cause))),
                FailureOutcome::Allow => metrics.add(r.policy, Counter::FailureAllowed, 1),
            }
        }
        if let Some((status, cause)) = deny {
            return Err(self.fail_closed(cause, status, &failed, pending, limiter, metrics));
        }
        self.log_degraded(first, fallback, now);
        // Admitted without the service: lease policies owe what they admitted.
        for (r, _) in &failed {
            self.owe(r, &pending.tag, now, limiter, metrics);
        }
        pending.fallback = Some(Note::merge(pending.fallback, fallback, first, &failed));
        Ok(pending)
    }

    fn fail_closed<S: Store, C: Clock>(
        &self,
        cause: Cause,
        status: u16,
        failed: &[(Resolved, Cause)],
        mut pending: Pending,
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) -> Decided {
        for (r, _) in failed {
            if let Some(compiled) = self.compiled(r.policy)
                && matches!(compiled.policy.on_failure, FailureOutcome::Deny(_))
            {
                metrics.add(r.policy, Counter::FailureDenied, 1);
            }
        }
        self.log_degraded(cause, Fallback::FailClosed, limiter.clock().now());
        pending.fallback = Some(Note::merge(pending.fallback, Fallback::FailClosed, cause, failed));
        self.reject_pending(pending, None, status, limiter, metrics)
    }

    fn log_degraded(&self, cause: Cause, fallback: Fallback, now: Nanos) {
        let Ok(mut limiter) = self.degraded.try_borrow_mut() else { return };
        if let Some(suppressed) = limiter.admit(cause, now) {
            log::warn!(
                "sluice: a global policy could not be decided ({}); fallback {} decided \
                 ({suppressed} more since the last line about this cause)",
                cause.name(),
                fallback.name()
            );
        }
    }
}
