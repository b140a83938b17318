//! The lease strategy in the engine: spending a request's lease policies, waiting for a
//! refill, refilling and reconciling.
//!
//! # Who calls the service
//!
//! A refill (`POST /v1/lease`) or a charge (`POST /v1/charge`) must outlive the request
//! that asked for it: the request goes on with its token, and its stream may end before
//! the answer comes back (the SDK then drops an answer addressed to it, and the tokens
//! granted would be lost). So requests only *elect* a refill in the lease record; the
//! elected request's worker puts it in the engine's outbox, and the root context sends
//! it on its next tick and receives the answer ([`Engine::dispatch_outgoing`],
//! [`Engine::outgoing_answered`]).
//!
//! # Waiting
//!
//! A request that finds its lease empty while a refill is in flight waits, paused, at
//! most `max_waiting` per worker and at most the refill's window in time, and is retried
//! on its own worker's tick (a worker cannot wake another worker's request); it then
//! spends, is rejected (the service granted nothing), or, when the refill failed or the
//! wait ran out, takes the failure rule.
//!
//! # Reconciliation
//!
//! Units a fallback admits (emergency cap, fail open) while the service cannot decide are
//! recorded as debt in the caller's lease record, at most `max_debt`, the rest forgiven.
//! After the next successful refill, the debt is charged to the global budget, so an
//! outage's overshoot is paid back, not forgotten.

use super::compiled::{Home, Leased};
use super::lease::{Leases, Rules, Spend};
use super::resolve::{Few, Place, Resolved};
use super::wire::{self, Reason};
use super::{Begun, Engine, Pending, Stage, namespace};
use crate::host::{Call, CalloutAnswer, Callouts, Counter, Metrics, PluginCounter};
use shared_store::{Clock, Decision, Limiter, Nanos, Placement, Store, Verdict};
use sluice_protocol::{ChargeRequest, LeaseRequest};

/// How long an elected refill holds beyond the callout's deadline: the time until the
/// root's next tick sends it.
const REFILL_MARGIN: Nanos = Nanos::from_millis(100);

/// A call the root context is to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outgoing {
    /// Ask for more tokens.
    Refill(Target),
    /// Report admissions made without the service.
    Charge(Target, u64),
}

/// Whose lease a call is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    policy: usize,
    slot: Placement,
    key: u128,
    tag: String,
}

/// A call the root context sent, waiting for its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentOutgoing {
    /// The host's token.
    pub token: u32,
    /// After this, the answer will not come (the election has expired too).
    pub deadline: Nanos,
    sent_at: Nanos,
    call: Outgoing,
}

impl Engine {
    fn leased_home(&self, policy: usize) -> Option<&Leased> {
        match &self.compiled(policy)?.home {
            Home::Global { lease: Some(leased), .. } => Some(leased),
            _ => None,
        }
    }

    fn leases<'a, S: Store>(&'a self, store: &'a S) -> Leases<'a, S> {
        Leases { store, anchor: &self.anchor }
    }

    fn refill_window(&self) -> Nanos {
        self.service.as_ref().map_or(Nanos::from_secs(1), |s| s.timeout).saturating_add(REFILL_MARGIN)
    }

    fn elect(&self, pending: &Pending, resolved: &Resolved) {
        if let (Place::Global { key, lease: Some(slot), .. }, Ok(mut outbox)) =
            (&resolved.at, self.outbox.try_borrow_mut())
        {
            outbox.push(Outgoing::Refill(Target {
                policy: resolved.policy,
                slot: slot.clone(),
                key: *key,
                tag: pending.tag.clone(),
            }));
        }
    }

    /// Spends the request's lease policies: admits, waits, or rejects.
    pub(super) fn lease_stage<S: Store, C: Clock>(
        &self,
        mut pending: Pending,
        limiter: &Limiter<S, C>,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Begun {
        let now = limiter.clock().now();
        let leases = self.leases(limiter.store());
        let window = self.refill_window();
        let mut waiting = Few::new();
        for resolved in std::mem::take(&mut pending.leased) {
            let (Place::Global { lease: Some(slot), .. }, Some(leased)) =
                (&resolved.at, self.leased_home(resolved.policy))
            else {
                continue;
            };
            let rules = Rules { low_water: leased.config.low_water, refill_window: window };
            match leases.spend(slot, resolved.cost, now, rules) {
                Ok(Spend::Spent { refill }) => {
                    if refill {
                        self.elect(&pending, &resolved);
                    }
                    pending.spent.push((resolved.policy, slot.clone(), resolved.cost));
                }
                Ok(Spend::Wait { elected }) => {
                    if elected {
                        self.elect(&pending, &resolved);
                    }
                    waiting.push(resolved);
                }
                Ok(Spend::Empty { until }) => {
                    return self.lease_rejection(pending, &resolved, until, now, limiter, metrics);
                }
                Ok(Spend::Failed { reason }) => {
                    pending.global.push(resolved);
                    return self.degrade(Reason::from_index(reason), pending, limiter, room_to_pause, metrics);
                }
                Ok(Spend::Taken) => {
                    pending.global.push(resolved);
                    return self.degrade(Reason::LeaseSlotTaken, pending, limiter, room_to_pause, metrics);
                }
                Err(_) => {
                    metrics.add(resolved.policy, Counter::StoreErrors, 1);
                    pending.global.push(resolved);
                    return self.degrade(Reason::DispatchFailed, pending, limiter, room_to_pause, metrics);
                }
            }
        }
        if waiting.is_empty() {
            return self.proceed(pending, limiter, room_to_pause, metrics);
        }
        metrics.add_plugin(PluginCounter::Waiting, 1);
        pending.leased = waiting;
        pending.stage = Stage::Lease;
        pending.since = now;
        pending.deadline = now.saturating_add(window);
        Begun::Waiting(Box::new(pending))
    }

    /// Tries a request waiting for a refill again (on its worker's tick).
    pub fn retry<S: Store, C: Clock>(
        &self,
        mut pending: Box<Pending>,
        limiter: &Limiter<S, C>,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Begun {
        let now = limiter.clock().now();
        let leases = self.leases(limiter.store());
        let mut waiting = Few::new();
        let mut failure = None;
        for resolved in std::mem::take(&mut pending.leased) {
            let Place::Global { lease: Some(slot), .. } = &resolved.at else { continue };
            match leases.retry(slot, resolved.cost, now, pending.since) {
                Ok(Spend::Spent { .. }) => pending.spent.push((resolved.policy, slot.clone(), resolved.cost)),
                Ok(Spend::Empty { until }) => {
                    metrics.add_plugin(PluginCounter::Waiting, -1);
                    return self.lease_rejection(*pending, &resolved, until, now, limiter, metrics);
                }
                Ok(Spend::Failed { reason }) => {
                    failure = failure.or(Some(Reason::from_index(reason)));
                    pending.global.push(resolved);
                }
                Ok(Spend::Taken) => {
                    failure = failure.or(Some(Reason::LeaseSlotTaken));
                    pending.global.push(resolved);
                }
                Ok(Spend::Wait { .. }) if now >= pending.deadline => {
                    failure = failure.or(Some(Reason::Timeout));
                    pending.global.push(resolved);
                }
                Ok(Spend::Wait { .. }) => waiting.push(resolved),
                Err(_) => {
                    metrics.add(resolved.policy, Counter::StoreErrors, 1);
                    failure = failure.or(Some(Reason::DispatchFailed));
                    pending.global.push(resolved);
                }
            }
        }
        if waiting.is_empty() || failure.is_some() {
            metrics.add_plugin(PluginCounter::Waiting, -1);
            pending.global.extend(waiting);
            pending.stage = Stage::Check;
            return match failure {
                Some(reason) => self.degrade(reason, *pending, limiter, room_to_pause, metrics),
                None => self.proceed(*pending, limiter, room_to_pause, metrics),
            };
        }
        pending.leased = waiting;
        Begun::Waiting(pending)
    }

    /// A request that cannot wait for a refill (the worker holds `max_waiting` already).
    pub fn overflow<S: Store, C: Clock>(
        &self,
        mut pending: Box<Pending>,
        limiter: &Limiter<S, C>,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Begun {
        metrics.add_plugin(PluginCounter::Waiting, -1);
        let waiting = std::mem::take(&mut pending.leased);
        pending.global.extend(waiting);
        pending.stage = Stage::Check;
        self.degrade(Reason::LeaseQueueFull, *pending, limiter, room_to_pause, metrics)
    }

    /// The most requests a worker should hold waiting for this request's refills.
    pub fn max_waiting(&self, pending: &Pending) -> usize {
        pending
            .leased
            .iter()
            .filter_map(|r| self.leased_home(r.policy))
            .map(|l| usize::try_from(l.config.max_waiting).unwrap_or(usize::MAX))
            .min()
            .unwrap_or(usize::MAX)
    }

    /// The service granted nothing to this caller: reject with the time it said.
    fn lease_rejection<S: Store, C: Clock>(
        &self,
        pending: Pending,
        resolved: &Resolved,
        until: Nanos,
        now: Nanos,
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) -> Begun {
        metrics.add(resolved.policy, Counter::OverLimit, 1);
        let limit = self.compiled(resolved.policy).map_or(0, |c| c.policy.limit.capacity());
        let wait = until.saturating_sub(now).max(Nanos(1));
        let decision =
            Decision { verdict: Verdict::Rejected { retry_after: wait }, limit, remaining: 0, reset_after: wait };
        let status = self.response.status;
        Begun::Decided(self.reject_pending(pending, Some((resolved.policy, decision)), status, limiter, metrics))
    }

    /// Gives back lease spends of a request rejected after all.
    pub(super) fn give_back_leases<S: Store, C: Clock>(
        &self,
        spent: &[(usize, Placement, u64)],
        limiter: &Limiter<S, C>,
    ) {
        let now = limiter.clock().now();
        let leases = self.leases(limiter.store());
        for (_, slot, cost) in spent {
            let _ = leases.give_back(slot, *cost, now);
        }
    }

    /// Records what a fallback admitted for a lease policy, to be charged later.
    pub(super) fn owe<S: Store, C: Clock>(
        &self,
        policy: usize,
        slot: &Placement,
        cost: u64,
        now: Nanos,
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) {
        let Some(leased) = self.leased_home(policy) else { return };
        match self.leases(limiter.store()).owe(slot, cost, leased.config.max_debt, now) {
            Ok(0) => {}
            Ok(forgiven) => metrics.add(policy, Counter::LeaseForgiven, i64::try_from(forgiven).unwrap_or(i64::MAX)),
            Err(_) => metrics.add(policy, Counter::LeaseForgiven, i64::try_from(cost).unwrap_or(i64::MAX)),
        }
    }

    /// The calls waiting in this worker's outbox, to be sent by the root context.
    pub fn take_outgoing(&self) -> Vec<Outgoing> {
        self.outbox.try_borrow_mut().map(|mut outbox| std::mem::take(&mut *outbox)).unwrap_or_default()
    }

    /// Sends a call from the outbox; `None` when it was decided without the service (the
    /// circuit is open, or the proxy would not send it).
    pub fn dispatch_outgoing<S: Store, C: Clock>(
        &self,
        call: Outgoing,
        callouts: &mut impl Callouts,
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) -> Option<SentOutgoing> {
        let service = self.service.as_ref()?;
        let now = limiter.clock().now();
        let (target, path, body) = match &call {
            Outgoing::Refill(target) => {
                let (compiled, leased) = (self.compiled(target.policy)?, self.leased_home(target.policy)?);
                let Home::Global { spec, .. } = &compiled.home else { return None };
                let request = LeaseRequest {
                    tag: Some(target.tag.clone()),
                    key: namespace::hex128(target.key),
                    policy_version: compiled.policy.version,
                    limit: *spec,
                    tokens: leased.config.size,
                    ttl_ms: leased.config.duration_ms,
                };
                (target, wire::LEASE_PATH, serde_json::to_vec(&request).unwrap_or_default())
            }
            Outgoing::Charge(target, debt) => {
                let (compiled, leased) = (self.compiled(target.policy)?, self.leased_home(target.policy)?);
                let Home::Global { spec, .. } = &compiled.home else { return None };
                let request = ChargeRequest {
                    tag: Some(target.tag.clone()),
                    key: namespace::hex128(target.key),
                    policy_version: compiled.policy.version,
                    limit: *spec,
                    cost: *debt,
                    max_debt: leased.config.max_debt,
                };
                (target, wire::CHARGE_PATH, serde_json::to_vec(&request).unwrap_or_default())
            }
        };
        let failed = |reason: Reason| {
            if matches!(call, Outgoing::Refill(_)) {
                let _ = self.leases(limiter.store()).refill_failed(
                    &target.slot,
                    u64::try_from(reason.index()).unwrap_or(0),
                    now,
                );
            }
            None
        };
        if service.breaker.admit(limiter.store(), now) == super::breaker::Admit::Open {
            return failed(Reason::CircuitOpen);
        }
        let mut headers: Vec<(&str, &str)> = vec![
            (":method", "POST"),
            (":path", path),
            (":authority", &service.authority),
            ("content-type", "application/json"),
        ];
        if let Some(authorization) = &service.authorization {
            headers.push(("authorization", authorization.expose()));
        }
        let sent = Call { cluster: &service.cluster, headers: &headers, body: &body, timeout_ms: service.timeout_ms };
        match callouts.dispatch(&sent) {
            Ok(token) => {
                metrics.add_plugin(PluginCounter::Callouts, 1);
                if matches!(call, Outgoing::Refill(_)) {
                    metrics.add(target.policy, Counter::LeaseRefills, 1);
                }
                let deadline = now.saturating_add(self.refill_window());
                Some(SentOutgoing { token, deadline, sent_at: now, call })
            }
            Err(_) => {
                if service.breaker.record(limiter.store(), now, false) {
                    metrics.add_plugin(PluginCounter::CircuitOpened, 1);
                }
                failed(Reason::DispatchFailed)
            }
        }
    }

    /// Applies the answer to a call the root sent (or its absence: `TimedOut`).
    pub fn outgoing_answered<S: Store, C: Clock, M: Metrics>(
        &self,
        sent: SentOutgoing,
        answer: &CalloutAnswer,
        limiter: &Limiter<S, C>,
        metrics: &mut M,
    ) {
        let now = limiter.clock().now();
        let leases = self.leases(limiter.store());
        let record = |ok: bool, metrics: &mut dyn Metrics| {
            if let Some(service) = &self.service
                && service.breaker.record(limiter.store(), now, ok)
            {
                metrics.add_plugin(PluginCounter::CircuitOpened, 1);
            }
        };
        match &sent.call {
            Outgoing::Refill(target) => match wire::classify_lease(answer) {
                Ok(granted) => {
                    record(true, metrics);
                    let expires_in = Nanos::from_millis(granted.expires_in_ms);
                    let retry = Nanos(granted.entry.retry_after_ns);
                    if let Ok(expired) =
                        leases.grant(&target.slot, granted.granted, sent.sent_at, expires_in, retry, now)
                    {
                        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                        metrics.add(target.policy, Counter::LeaseGranted, count(granted.granted));
                        if expired > 0 {
                            metrics.add(target.policy, Counter::LeaseExpired, count(expired));
                        }
                    }
                    // The service answers again: charge what was admitted without it.
                    if let Ok(debt) = leases.debt(&target.slot, now)
                        && debt > 0
                        && let Ok(mut outbox) = self.outbox.try_borrow_mut()
                    {
                        outbox.push(Outgoing::Charge(target.clone(), debt));
                    }
                }
                Err(reason) => {
                    record(false, metrics);
                    let _ = leases.refill_failed(&target.slot, u64::try_from(reason.index()).unwrap_or(0), now);
                }
            },
            Outgoing::Charge(target, debt) => match wire::classify_charge(answer) {
                Ok(charged) => {
                    record(true, metrics);
                    let _ = leases.settle_debt(&target.slot, *debt, now);
                    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                    metrics.add(target.policy, Counter::LeaseReconciled, count(charged.charged));
                    if charged.forgiven > 0 {
                        metrics.add(target.policy, Counter::LeaseForgiven, count(charged.forgiven));
                    }
                }
                // Stays owed: charged after the next successful refill.
                Err(_) => record(false, metrics),
            },
        }
    }
}
