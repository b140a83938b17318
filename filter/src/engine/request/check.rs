//! The check stage: a request's check-mode policies are decided by the counter service,
//! all of them in one callout (`POST /v1/check`), while the request waits. Before it,
//! every request with global policies gets its partition tag, which its refills and
//! charges carry too. When the service cannot decide (no service, the circuit open, the
//! call refused, failed or late), the check policies take their failure rule and the
//! request goes on to its lease policies. What an admitting check spent is credited back
//! at the service if a later stage rejects the request.

use super::admit::{check_estimate_owed, due_after, reject};
use super::fallback::apply_failure_rule;
use super::local::Admitted;
use super::state::{CheckCall, CheckSpent, CheckWait, Global, Granted, Next, Pending, ToLease};
use crate::engine::breaker::Admit;
use crate::engine::calls::UNREAD_TAG;
use crate::engine::cause::Cause;
use crate::engine::compiled::Home;
use crate::engine::headers;
use crate::engine::namespace;
use crate::engine::overridden;
use crate::engine::resolved::{Few, Place, Rare, Resolved};
use crate::engine::setup::{Service, Setup};
use crate::engine::wire;
use crate::host::{CalloutAnswer, Callouts, Counter, Metrics, PluginCounter, Reason, RequestFacts};
use shared_store::{Clock, Decision, Limiter, Nanos, Store};
use sluice_protocol::OverrideKind;

/// Tags a request that has global policies left and sends its check (or, with no check
/// policy, passes it to the lease stage).
pub(crate) fn enter<S: Store, C: Clock>(
    setup: &Setup,
    admitted: Admitted,
    request: &impl RequestFacts,
    callouts: &mut impl Callouts,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Next {
    let Admitted { granted, checked, leased } = admitted;
    let Some(service) = &setup.service else {
        // The configuration refuses global policies without a service.
        let global = Global { granted, checked, leased, tag: "none".to_owned() };
        return degrade(setup, Cause::Service(Reason::DispatchFailed), global, true, limiter, metrics);
    };
    let tag = match crate::policy::fingerprint_parts("\0partition", 0, &service.partition, request, &service.secret) {
        Ok(Some(tag)) => namespace::hex128(tag),
        Ok(None) => "none".to_owned(),
        Err(_) => {
            for resolved in checked.iter().chain(&leased) {
                metrics.add(resolved.policy, Counter::ReadFailures, 1);
            }
            // No tag could be read: the lease policies that fall back owe nothing (no
            // counter could be named to charge it to), and that is counted as forgiven.
            let global = Global { granted, checked, leased, tag: UNREAD_TAG.to_owned() };
            return degrade(setup, Cause::Service(Reason::DispatchFailed), global, true, limiter, metrics);
        }
    };
    send(setup, service, Global { granted, checked, leased, tag }, callouts, limiter, metrics)
}

/// Sends the check for the request's check policies, if it has any: at once, or, while
/// the worker has its most check calls out, with the next batch (`check_group`).
fn send<S: Store, C: Clock>(
    setup: &Setup,
    service: &Service,
    global: Global,
    callouts: &mut (impl Callouts + ?Sized),
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Next {
    if global.checked.is_empty() {
        return after_check(global.granted, global.leased, global.tag);
    }
    let now = limiter.clock().now();
    let deadline = now.saturating_add(service.timeout);
    let wait = CheckWait { call: CheckCall::Queued, deadline, sent_at: now, since: now, probe: false, global };
    let queued = service.group.try_borrow_mut().is_ok_and(|mut group| {
        let wait = group.must_wait(now);
        if wait {
            group.enqueue();
        }
        wait
    });
    if queued {
        metrics.add_plugin(PluginCounter::Waiting, 1);
        return Next::Wait(Box::new(Pending::Check(wait)));
    }
    let check = check_request(setup, &wait.global);
    match dispatch(service, vec![check], limiter, callouts, metrics) {
        Ok(sent) => {
            metrics.add_plugin(PluginCounter::Waiting, 1);
            Next::Wait(Box::new(Pending::Check(CheckWait {
                call: CheckCall::Alone(sent.token),
                ..sent.stamp(wait, 0)
            })))
        }
        Err(cause) => unsent(setup, wait, cause, limiter, metrics),
    }
}

/// Sends the checks of requests that waited to be sent, together (one alone goes as a
/// plain check); what each request does next, in order.
pub(crate) fn send_waiting<S: Store, C: Clock>(
    setup: &Setup,
    waits: Vec<CheckWait>,
    callouts: &mut (impl Callouts + ?Sized),
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Vec<Next> {
    // They stop waiting to be sent; those sent wait again, for the answer.
    metrics.add_plugin(PluginCounter::Waiting, -i64::try_from(waits.len()).unwrap_or(i64::MAX));
    let Some(service) = &setup.service else {
        // Only a configuration with a service queues a check.
        let cause = Cause::Service(Reason::DispatchFailed);
        return waits.into_iter().map(|wait| unsent(setup, wait, cause, limiter, metrics)).collect();
    };
    if let Ok(mut group) = service.group.try_borrow_mut() {
        for _ in &waits {
            group.dequeue();
        }
    }
    let checks = waits.iter().map(|wait| check_request(setup, &wait.global)).collect();
    let size = waits.len();
    match dispatch(service, checks, limiter, callouts, metrics) {
        Ok(sent) => waits
            .into_iter()
            .enumerate()
            .map(|(index, wait)| {
                let call = if size == 1 {
                    CheckCall::Alone(sent.token)
                } else {
                    CheckCall::Batch { token: sent.token, index, size }
                };
                metrics.add_plugin(PluginCounter::Waiting, 1);
                Next::Wait(Box::new(Pending::Check(CheckWait { call, ..sent.stamp(wait, index) })))
            })
            .collect(),
        Err(cause) => waits.into_iter().map(|wait| unsent(setup, wait, cause, limiter, metrics)).collect(),
    }
}

/// The check of `global`'s check policies.
fn check_request(setup: &Setup, global: &Global) -> sluice_protocol::CheckRequest {
    wire::check_request(&global.tag, &global.checked, |index| {
        let compiled = setup.compiled(index)?;
        match &compiled.home {
            Home::Global { spec, .. } => Some((compiled.policy.name.as_str(), *spec, compiled.policy.version)),
            Home::Local(_) => None,
        }
    })
}

/// A call sent.
struct SentCall {
    token: u32,
    at: Nanos,
    /// Whether it is the probe of a half-open circuit.
    probe: bool,
}

impl SentCall {
    /// `wait`, sent by this call as its `index`-th check: the probe's flag goes with its
    /// first request.
    fn stamp(&self, wait: CheckWait, index: usize) -> CheckWait {
        CheckWait { sent_at: self.at, probe: self.probe && index == 0, ..wait }
    }
}

/// Sends `checks` in one call: a plain check for one, a batch for more (counted); or
/// why it could not be sent (the circuit open, the host refused, which the breaker
/// counts once).
fn dispatch<S: Store, C: Clock>(
    service: &Service,
    mut checks: Vec<sluice_protocol::CheckRequest>,
    limiter: &Limiter<S, C>,
    callouts: &mut (impl Callouts + ?Sized),
    metrics: &mut impl Metrics,
) -> Result<SentCall, Cause> {
    let now = limiter.clock().now();
    let admit = service.breaker.admit(limiter.store(), now);
    if admit == Admit::Open {
        return Err(Cause::Service(Reason::CircuitOpen));
    }
    let size = checks.len();
    let dispatched = match checks.pop() {
        Some(check) if checks.is_empty() => service.dispatch(wire::CHECK_PATH, &wire::check_body(&check), callouts),
        last => {
            checks.extend(last);
            service.dispatch(wire::CHECKS_PATH, &wire::checks_body(checks), callouts)
        }
    };
    let Ok(token) = dispatched else {
        service.record_health(limiter.store(), now, Some(false), now, metrics);
        return Err(Cause::Service(Reason::DispatchFailed));
    };
    metrics.add_plugin(PluginCounter::Callouts, 1);
    if size > 1 {
        metrics.add_plugin(PluginCounter::CheckBatches, 1);
        metrics.add_plugin(PluginCounter::ChecksBatched, i64::try_from(size).unwrap_or(i64::MAX));
    }
    if let Ok(mut group) = service.group.try_borrow_mut() {
        if group.past_late(now) {
            metrics.add_plugin(PluginCounter::CheckCallsPastLate, 1);
        }
        group.sent(token, size, now, admit == Admit::Probe);
    }
    Ok(SentCall { token, at: now, probe: admit == Admit::Probe })
}

/// A check that could not be sent: its policies take the failure rule for `cause`.
fn unsent<S: Store, C: Clock>(
    setup: &Setup,
    wait: CheckWait,
    cause: Cause,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Next {
    degrade(setup, cause, wait.global, false, limiter, metrics)
}

/// Sends the check of lease policies their leases could not serve (`global.checked`;
/// nothing left to lease after it): decided like a check policy's, by the service's
/// answer, or by their failure rule when the service cannot answer (no service, the
/// circuit open, the call refused, failed or late).
pub(crate) fn send_for_leases<S: Store, C: Clock>(
    setup: &Setup,
    global: Global,
    callouts: &mut (impl Callouts + ?Sized),
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Next {
    let Some(service) = &setup.service else {
        return degrade(setup, Cause::Service(Reason::DispatchFailed), global, false, limiter, metrics);
    };
    send(setup, service, global, callouts, limiter, metrics)
}

/// Decides a request waiting for its check with the counter service's answer (or its
/// absence: `TimedOut`). A request whose deadline passed before its check was sent takes
/// its failure rule (a timeout, counted as `checks_unsent`, not held against the
/// service).
pub(crate) fn answered<S: Store, C: Clock>(
    setup: &Setup,
    wait: CheckWait,
    answer: &CalloutAnswer,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Next {
    let entries = wait.global.checked.len();
    let (outcome, health) = match wait.call {
        CheckCall::Queued => {
            metrics.add_plugin(PluginCounter::ChecksUnsent, 1);
            (Err(wire::unsent()), None)
        }
        CheckCall::Alone(_) => {
            let classified = wire::classify(answer, entries);
            let health = classified.as_ref().map_or_else(wire::Failure::health, |_| Some(true));
            (classified, health)
        }
        CheckCall::Batch { index, size, .. } => match wire::classify_batch(answer, size) {
            Ok(mut results) => {
                let outcome = if index < results.len() { results.swap_remove(index) } else { Err(wire::unsent()) };
                (wire::every_entry(outcome, entries), Some(true))
            }
            Err(failure) => (Err(failure), failure.health()),
        },
    };
    decide(setup, wait, outcome, health, limiter, metrics)
}

/// Decides the requests that waited for one batch's answer (its members still waiting:
/// some may have ended or timed out), reading the answer once.
pub(crate) fn batch_answered<S: Store, C: Clock>(
    setup: &Setup,
    waits: Vec<CheckWait>,
    answer: &CalloutAnswer,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Vec<Next> {
    let size = waits.iter().find_map(|w| match w.call {
        CheckCall::Batch { size, .. } => Some(size),
        _ => None,
    });
    let classified = size.map(|size| wire::classify_batch(answer, size));
    let mut results: Vec<Option<wire::CheckOutcome>> = match &classified {
        Some(Ok(results)) => results.iter().cloned().map(Some).collect(),
        _ => Vec::new(),
    };
    waits
        .into_iter()
        .map(|wait| {
            let (outcome, health) = match (&classified, wait.call) {
                (Some(Ok(_)), CheckCall::Batch { index, .. }) => {
                    #[cfg(feature = "mutant-batch-misplaced")]
                    let index = (index + 1) % results.len().max(1);
                    let outcome = results.get_mut(index).and_then(Option::take).unwrap_or(Err(wire::unsent()));
                    (wire::every_entry(outcome, wait.global.checked.len()), Some(true))
                }
                (Some(Err(failure)), CheckCall::Batch { .. }) => (Err(*failure), failure.health()),
                // Not a member of a batch: decided on its own.
                _ => return answered(setup, wait, answer, limiter, metrics),
            };
            decide(setup, wait, outcome, health, limiter, metrics)
        })
        .collect()
}

/// A waiting request leaves its call (or the queue of checks to send): the call is no
/// longer counted out once none of its requests waits for it.
pub(crate) fn leave(setup: &Setup, wait: &CheckWait) {
    let Some(service) = &setup.service else { return };
    let Ok(mut group) = service.group.try_borrow_mut() else { return };
    match wait.call.token() {
        Some(token) => group.left(token),
        None => group.dequeue(),
    }
}

/// Decides a request with its check's outcome; the breaker hears the call's `health`
/// once per call.
fn decide<S: Store, C: Clock>(
    setup: &Setup,
    wait: CheckWait,
    outcome: wire::CheckOutcome,
    health: Option<bool>,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Next {
    metrics.add_plugin(PluginCounter::Waiting, -1);
    let now = limiter.clock().now();
    if let Some(service) = &setup.service {
        let first = wait
            .call
            .token()
            .is_some_and(|token| service.group.try_borrow_mut().map_or(true, |mut group| group.first_record(token)));
        leave(setup, &wait);
        if first {
            service.record_health(limiter.store(), now, health, wait.sent_at, metrics);
        }
    }
    let CheckWait { global, .. } = wait;
    let response = match outcome {
        Ok(response) => response,
        Err(failure) => return degrade(setup, Cause::Service(failure.reason), global, false, limiter, metrics),
    };
    let Global { mut granted, checked, leased, tag } = global;
    let decisions: Few<(usize, Decision)> =
        checked.iter().zip(&response.entries).map(|(r, e)| (r.policy, e.decision())).collect();
    // Entries decided under an operator's override: counted, logged, named in the header;
    // a bypassed one spent nothing, so nothing of it is settled or credited back.
    let mut bypassed = Few::<usize>::new();
    for entry in &response.overrides {
        let Some(resolved) = checked.get(entry.entry) else { continue };
        overridden::note(setup, resolved.policy, entry.applied(), now, metrics);
        granted.overrides.push((resolved.policy, entry.applied()));
        if entry.kind == OverrideKind::Bypass {
            bypassed.push(entry.entry);
        }
    }
    if !response.admitted {
        for (policy, decision) in &decisions {
            if !decision.is_admitted() {
                metrics.add(*policy, Counter::OverLimit, 1);
            }
        }
        let strictest = headers::strictest_rejection(&decisions);
        return Next::Decided(reject(setup, granted, strictest, setup.response.status, limiter, metrics));
    }
    let delay = decisions.iter().map(|(_, d)| d.delay()).max().unwrap_or(Nanos::ZERO);
    granted.delay_until(due_after(now, delay));
    // What the service spent on an estimate is settled there once the response says;
    // what it spent is credited back if a later stage rejects the request.
    let spent = || checked.iter().enumerate().filter(|(i, _)| !bypassed.contains(i)).map(|(_, r)| r);
    granted.owed.extend(spent().filter_map(|r| check_estimate_owed(setup, r, &tag, response.at_ns, now)));
    granted.checked_spent.extend(spent().filter_map(|r| match r.at {
        Place::Global { key, .. } => {
            Some(CheckSpent { policy: r.policy, key, tag: tag.clone(), cost: r.cost, at_ns: response.at_ns })
        }
        Place::Local(_) => None,
    }));
    // (Extended: lease policies their leases could not serve are checked after the
    // request's check policies, in a check of their own.)
    granted.checked.extend(decisions);
    after_check(granted, leased, tag)
}

/// Applies the failure rule to the request's check policies (and, `with_leases`, its
/// lease policies too) for `cause`, then goes on with what is left.
fn degrade<S: Store, C: Clock>(
    setup: &Setup,
    cause: Cause,
    global: Global,
    with_leases: bool,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Next {
    let Global { granted, checked, mut leased, tag } = global;
    let mut failed: Few<(Resolved, Cause)> = checked.into_iter().map(|r| (r, cause)).collect();
    if with_leases {
        failed.extend(std::mem::take(&mut leased).into_iter().map(|r| (r, cause)));
    }
    match apply_failure_rule(setup, failed, granted, &tag, limiter, metrics) {
        Ok(granted) => after_check(granted, leased, tag),
        Err(decided) => Next::Decided(decided),
    }
}

/// After the check: the lease stage, or admission when there is no lease policy.
fn after_check(granted: Granted, leased: Rare<Resolved>, tag: String) -> Next {
    if leased.is_empty() {
        Next::Admit(granted)
    } else {
        Next::Lease(Box::new(ToLease { granted, leased, tag, to_check: Rare::new() }))
    }
}
