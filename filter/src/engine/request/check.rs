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
use super::state::{CheckSpent, CheckWait, Global, Granted, Next, Pending, ToLease};
use crate::engine::breaker::Admit;
use crate::engine::calls::UNREAD_TAG;
use crate::engine::cause::Cause;
use crate::engine::compiled::Home;
use crate::engine::headers;
use crate::engine::namespace;
use crate::engine::overridden;
use crate::engine::resolved::{Few, Place, Resolved};
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

/// Sends the check for the request's check policies, if it has any.
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
    let admit = service.breaker.admit(limiter.store(), now);
    if admit == Admit::Open {
        return degrade(setup, Cause::Service(Reason::CircuitOpen), global, false, limiter, metrics);
    }
    let body = wire::check_body(&global.tag, &global.checked, |index| {
        let compiled = setup.compiled(index)?;
        match &compiled.home {
            Home::Global { spec, .. } => Some((compiled.policy.name.as_str(), *spec, compiled.policy.version)),
            Home::Local(_) => None,
        }
    });
    match service.dispatch(wire::CHECK_PATH, &body, callouts) {
        Ok(token) => {
            metrics.add_plugin(PluginCounter::Callouts, 1);
            metrics.add_plugin(PluginCounter::Waiting, 1);
            let deadline = now.saturating_add(service.timeout);
            Next::Wait(Pending::Check(CheckWait {
                token,
                deadline,
                sent_at: now,
                probe: admit == Admit::Probe,
                global,
            }))
        }
        Err(_) => {
            if service.breaker.record(limiter.store(), now, Some(false), now) {
                metrics.add_plugin(PluginCounter::CircuitOpened, 1);
            }
            degrade(setup, Cause::Service(Reason::DispatchFailed), global, false, limiter, metrics)
        }
    }
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
/// absence: `TimedOut`).
pub(crate) fn answered<S: Store, C: Clock>(
    setup: &Setup,
    wait: CheckWait,
    answer: &CalloutAnswer,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Next {
    metrics.add_plugin(PluginCounter::Waiting, -1);
    let now = limiter.clock().now();
    let CheckWait { sent_at, global, .. } = wait;
    let classified = wire::classify(answer, global.checked.len());
    let health = match &classified {
        Ok(_) => Some(true),
        Err(failure) => failure.health(),
    };
    if let Some(service) = &setup.service
        && service.breaker.record(limiter.store(), now, health, sent_at)
    {
        metrics.add_plugin(PluginCounter::CircuitOpened, 1);
    }
    let response = match classified {
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
fn after_check(granted: Granted, leased: Few<Resolved>, tag: String) -> Next {
    if leased.is_empty() {
        Next::Admit(granted)
    } else {
        Next::Lease(ToLease { granted, leased, tag, to_check: Few::new() })
    }
}
