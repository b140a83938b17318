//! The lease-mode stage of the engine (the record it spends is `lease_record.rs`):
//! spending a request's lease policies, waiting for a refill, refilling and reconciling.
//!
//! # Who calls the service
//!
//! A refill (`POST /v1/lease`) or a charge (`POST /v1/charge`) must outlive the request
//! that asked for it: the request goes on with its token, and its stream may end before
//! the answer comes back (the SDK then drops an answer addressed to it, and the tokens
//! granted would be lost). So requests only *elect* a refill in the lease record and put
//! it in the engine's outbox; the glue wakes its root context at once (a shared queue of
//! its own worker), which sends it and receives the answer ([`Engine::dispatch_outgoing`],
//! [`Engine::outgoing_answered`]); the tick sends whatever a wake missed.
//!
//! # Waiting
//!
//! A request that finds its lease empty waits, paused, at most `max_waiting` per worker
//! and at most one refill window (the callout's deadline and a margin) in time. When it
//! elected the refill itself, the grant is held for it (`min_tokens`: its cost), so no
//! request that arrived meanwhile can take what it waited for. When the answer arrives,
//! the electing worker retries its waiting requests at once; other workers retry theirs
//! on their next tick. A waiter then spends, is rejected (the service granted nothing:
//! its 429, with the service's wait), elects a refill of its own (the one it waited for
//! was spent by others), or, when the refill failed or the wait ran out, takes the
//! failure rule.
//!
//! # Reconciliation
//!
//! Units a fallback admits (emergency cap, fail open) while the service cannot decide are
//! recorded as debt in the caller's lease record, at most `max_debt`, the rest forgiven.
//! The worker that owed it schedules a charge of its own, sent by its root once the
//! circuit is closed, whatever else happens to the key; a charge carries an id, so one
//! sent again after a timeout is applied once. Debt that cannot be charged within
//! [`lease_record::DEBT_LIFE`](super::lease_record::DEBT_LIFE) is forgiven and counted. So an outage's
//! overshoot is paid back, not forgotten, and one-off identities never hold slots.

use super::breaker::Admit;
use super::compiled::{Home, Leased};
use super::fallback::Cause;
use super::lease_record::{Charge, Leases, Rules, Spend, Updated};
use super::resolve::{Few, Place, Resolved};
use super::wire::{self, Reason};
use super::{Begun, Decided, Engine, Pending, Stage, namespace};
use crate::host::{Call, CalloutAnswer, Callouts, Counter, Metrics, PluginCounter};
use shared_store::{Clock, Decision, Limiter, Nanos, Placement, Store, UpdateError, Verdict};
use sluice_protocol::{ChargeRequest, LeaseRequest};
use std::collections::BTreeMap;

/// How long an elected refill holds beyond the callout's deadline: the time until the
/// root sends it (a wake, or at worst the next tick), with room to spare.
const REFILL_MARGIN: Nanos = Nanos::from_millis(100);
/// The most keys one worker remembers to charge; beyond it, debt waits in its record
/// until the key refills again or its life ends (then it is forgiven, and counted).
pub(crate) const MAX_PENDING_CHARGES: usize = 4096;
/// The most charges one worker sends per tick.
const MAX_CHARGES_PER_TICK: usize = 16;
/// Lease records one worker reads per tick, round the tables, for debt it does not know
/// of (owed by a worker that restarted, or by an earlier configuration): every debt is
/// charged within `slots / SWEEP_PER_TICK` ticks of the service answering again.
pub(crate) const SWEEP_PER_TICK: u32 = 16;

/// A call the root context is to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outgoing {
    /// Ask for more tokens.
    Refill(Target, Asker),
    /// Report admissions made without the service (the units and id are claimed in the
    /// lease record when it is sent).
    Charge(Target),
}

/// Who asked for a refill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// A request that spent and left the lease below its low-water mark.
    LowWater,
    /// A waiting request that needs `cost` tokens: they are held for it.
    Waiter {
        /// The request's id ([`Pending`]'s).
        waiter: u64,
        /// What it costs.
        cost: u64,
    },
}

/// Whose lease a call is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub(super) policy: usize,
    pub(super) slot: Placement,
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
    call: Sent,
}

/// What was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Sent {
    Refill(Target, Asker),
    Charge(Target, Charge),
}

impl SentOutgoing {
    /// Whether it was a refill (whose answer waiting requests may be waiting for).
    pub fn is_refill(&self) -> bool {
        matches!(self.call, Sent::Refill(..))
    }
}

/// Keys this worker owes charges for, by slot key.
pub(crate) type PendingCharges = BTreeMap<String, Target>;

/// How one policy's spend went.
enum Spent {
    Done(Spend),
    Failed(Cause),
}

impl Engine {
    fn leased_home(&self, policy: usize) -> Option<&Leased> {
        match &self.compiled(policy)?.home {
            Home::Global { lease: Some(leased), .. } => Some(leased),
            _ => None,
        }
    }

    pub(super) fn leases<'a, S: Store>(&'a self, store: &'a S) -> Leases<'a, S> {
        Leases { store, anchor: &self.anchor }
    }

    pub(super) fn refill_window(&self) -> Nanos {
        self.service.as_ref().map_or(Nanos::from_secs(1), |s| s.timeout).saturating_add(REFILL_MARGIN)
    }

    fn target(&self, pending: &Pending, resolved: &Resolved) -> Option<Target> {
        let Place::Global { key, lease: Some(slot), .. } = &resolved.at else { return None };
        Some(Target { policy: resolved.policy, slot: slot.clone(), key: *key, tag: pending.tag.clone() })
    }

    fn elect(&self, pending: &Pending, resolved: &Resolved, asker: Asker) {
        if let (Some(target), Ok(mut outbox)) = (self.target(pending, resolved), self.outbox.try_borrow_mut()) {
            outbox.push(Outgoing::Refill(target, asker));
        }
    }

    /// Counts what a lease-record update reports besides its result, and turns its
    /// errors into the cause the failure rule is applied for.
    fn counted<T>(
        &self,
        policy: usize,
        updated: Result<Updated<T>, UpdateError>,
        metrics: &mut impl Metrics,
    ) -> Result<Option<T>, Cause> {
        match updated {
            Ok(Updated { result, forgiven }) => {
                if forgiven > 0 {
                    metrics.add(policy, Counter::LeaseForgiven, count(forgiven));
                }
                Ok(result)
            }
            Err(UpdateError::Contended { attempts }) => {
                metrics.add(policy, Counter::CasConflicts, i64::from(attempts));
                Err(Cause::CasExhausted)
            }
            Err(UpdateError::Store(_)) => Err(Cause::StoreError),
        }
    }

    fn spent(&self, policy: usize, updated: Result<Updated<Spend>, UpdateError>, metrics: &mut impl Metrics) -> Spent {
        match self.counted(policy, updated, metrics) {
            Ok(spend) => Spent::Done(spend.unwrap_or(Spend::Taken)),
            Err(cause) => Spent::Failed(cause),
        }
    }

    /// Spends the request's lease policies: admits, waits, or rejects. Every policy is
    /// decided: one that cannot spend (its refill failed, its slot is taken, its record
    /// cannot be written) takes its own failure rule, counted under its own cause, and
    /// the others are still spent or waited for.
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
        if pending.waiter == 0 {
            pending.waiter = self.next_id();
        }
        let mut waiting = Few::new();
        let mut failed: Few<(Resolved, Cause)> = Few::new();
        for resolved in std::mem::take(&mut pending.leased) {
            let (Place::Global { lease: Some(slot), .. }, Some(leased)) =
                (&resolved.at, self.leased_home(resolved.policy))
            else {
                continue;
            };
            let rules = Rules { low_water: leased.config.low_water, refill_window: window };
            match self.spent(resolved.policy, leases.spend(slot, resolved.cost, now, rules), metrics) {
                Spent::Done(Spend::Spent { refill }) => {
                    if refill {
                        self.elect(&pending, &resolved, Asker::LowWater);
                    }
                    pending.spent.push((resolved.policy, slot.clone(), resolved.cost));
                }
                Spent::Done(Spend::Wait { elected: mine }) => {
                    if mine {
                        self.elect(&pending, &resolved, Asker::Waiter { waiter: pending.waiter, cost: resolved.cost });
                    }
                    waiting.push(resolved);
                }
                Spent::Done(Spend::Empty { until }) => {
                    // The request is rejected; the policies that could not be decided
                    // before this one are still counted under their causes.
                    self.count_causes(&failed, metrics);
                    return Begun::Decided(self.lease_rejection(pending, &resolved, until, now, limiter, metrics));
                }
                Spent::Done(Spend::Failed { reason }) => {
                    failed.push((resolved, Cause::Service(Reason::from_index(reason))));
                }
                Spent::Done(Spend::Taken) => failed.push((resolved, Cause::Service(Reason::LeaseSlotTaken))),
                Spent::Failed(cause) => failed.push((resolved, cause)),
            }
        }
        self.open_circuit_decides(&mut waiting, &mut failed, limiter);
        if !failed.is_empty() {
            pending = match self.apply_failure_rule(failed, pending, limiter, metrics) {
                Ok(pending) => pending,
                Err(decided) => return Begun::Decided(decided),
            };
        }
        if waiting.is_empty() {
            return Begun::Decided(self.admit(pending, limiter, room_to_pause, metrics));
        }
        metrics.add_plugin(PluginCounter::Waiting, 1);
        pending.leased = waiting;
        pending.stage = Stage::Lease;
        pending.since = now;
        pending.deadline = now.saturating_add(window);
        Begun::Waiting(Box::new(pending))
    }

    /// Tries a request waiting for a refill again (on its worker's tick, or at once when
    /// a refill's answer reaches its worker). Policies that can now spend, spend; one
    /// whose refill failed, or whose wait ran out, takes the failure rule; the others go
    /// on waiting (electing a refill of their own when the one they waited for is gone).
    pub fn retry<S: Store, C: Clock>(
        &self,
        mut pending: Box<Pending>,
        limiter: &Limiter<S, C>,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Begun {
        let now = limiter.clock().now();
        let leases = self.leases(limiter.store());
        let window = self.refill_window();
        let mut waiting = Few::new();
        let mut failed: Few<(Resolved, Cause)> = Few::new();
        for resolved in std::mem::take(&mut pending.leased) {
            let (Place::Global { lease: Some(slot), .. }, Some(leased)) =
                (&resolved.at, self.leased_home(resolved.policy))
            else {
                continue;
            };
            let rules = Rules { low_water: leased.config.low_water, refill_window: window };
            let may_elect = now < pending.deadline;
            let retried = leases.retry(slot, resolved.cost, now, pending.since, pending.waiter, may_elect, rules);
            match self.spent(resolved.policy, retried, metrics) {
                Spent::Done(Spend::Spent { .. }) => pending.spent.push((resolved.policy, slot.clone(), resolved.cost)),
                Spent::Done(Spend::Empty { until }) => {
                    metrics.add_plugin(PluginCounter::Waiting, -1);
                    self.count_causes(&failed, metrics);
                    return Begun::Decided(self.lease_rejection(*pending, &resolved, until, now, limiter, metrics));
                }
                Spent::Done(Spend::Failed { reason }) => {
                    failed.push((resolved, Cause::Service(Reason::from_index(reason))));
                }
                Spent::Done(Spend::Taken) => failed.push((resolved, Cause::Service(Reason::LeaseSlotTaken))),
                Spent::Done(Spend::Wait { .. }) if now >= pending.deadline => {
                    failed.push((resolved, Cause::Service(Reason::Timeout)));
                }
                Spent::Done(Spend::Wait { elected }) => {
                    if elected {
                        self.elect(&pending, &resolved, Asker::Waiter { waiter: pending.waiter, cost: resolved.cost });
                        // Its own refill: it may wait for that one's whole window.
                        pending.deadline = pending.deadline.max(now.saturating_add(window));
                    }
                    waiting.push(resolved);
                }
                Spent::Failed(cause) => failed.push((resolved, cause)),
            }
        }
        let mut pending = *pending;
        self.open_circuit_decides(&mut waiting, &mut failed, limiter);
        if !failed.is_empty() {
            pending = match self.apply_failure_rule(failed, pending, limiter, metrics) {
                Ok(pending) => pending,
                Err(decided) => {
                    metrics.add_plugin(PluginCounter::Waiting, -1);
                    return Begun::Decided(decided);
                }
            };
        }
        if waiting.is_empty() {
            metrics.add_plugin(PluginCounter::Waiting, -1);
            pending.stage = Stage::Check;
            return Begun::Decided(self.admit(pending, limiter, room_to_pause, metrics));
        }
        pending.leased = waiting;
        Begun::Waiting(Box::new(pending))
    }

    /// While the circuit is open no refill can be sent: lease policies that would wait
    /// for one take the failure rule at once (`circuit_open`), and their elections are
    /// given up, rather than waiting for a refill that will not leave.
    fn open_circuit_decides<S: Store, C: Clock>(
        &self,
        waiting: &mut Few<Resolved>,
        failed: &mut Few<(Resolved, Cause)>,
        limiter: &Limiter<S, C>,
    ) {
        let now = limiter.clock().now();
        let open = self.service.as_ref().is_some_and(|s| s.breaker.admit_quietly(limiter.store(), now) == Admit::Open);
        if !open || waiting.is_empty() {
            return;
        }
        let leases = self.leases(limiter.store());
        let mut given_up = Vec::new();
        for resolved in std::mem::take(waiting) {
            if let Place::Global { lease: Some(slot), .. } = &resolved.at {
                let _ = leases.refill_failed(slot, u64::try_from(Reason::CircuitOpen.index()).unwrap_or(0), now);
                given_up.push(slot.key.clone());
            }
            failed.push((resolved, Cause::Service(Reason::CircuitOpen)));
        }
        // The elections just given up: nothing to send for them.
        if let Ok(mut outbox) = self.outbox.try_borrow_mut() {
            outbox.retain(|call| !matches!(call, Outgoing::Refill(target, _) if given_up.contains(&target.slot.key)));
        }
    }

    /// A request that cannot wait for a refill (the worker holds `max_waiting` already):
    /// its waiting lease policies take the failure rule (`lease_queue_full`). Always a
    /// decision.
    pub fn overflow<S: Store, C: Clock>(
        &self,
        mut pending: Box<Pending>,
        limiter: &Limiter<S, C>,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Decided {
        metrics.add_plugin(PluginCounter::Waiting, -1);
        let failed: Few<(Resolved, Cause)> = std::mem::take(&mut pending.leased)
            .into_iter()
            .map(|r| (r, Cause::Service(Reason::LeaseQueueFull)))
            .collect();
        pending.stage = Stage::Check;
        match self.apply_failure_rule(failed, *pending, limiter, metrics) {
            Err(decided) => decided,
            Ok(pending) => self.admit(pending, limiter, room_to_pause, metrics),
        }
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
    ) -> Decided {
        metrics.add(resolved.policy, Counter::OverLimit, 1);
        let limit = self.compiled(resolved.policy).map_or(0, |c| c.policy.limit.capacity());
        let wait = until.saturating_sub(now).max(Nanos(1));
        let decision =
            Decision { verdict: Verdict::Rejected { retry_after: wait }, limit, remaining: 0, reset_after: wait };
        let status = self.response.status;
        self.reject_pending(pending, Some((resolved.policy, decision)), status, limiter, metrics)
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

    /// Records what a fallback admitted for a lease policy, to be charged later (this
    /// worker schedules the charge).
    pub(super) fn owe<S: Store, C: Clock>(
        &self,
        resolved: &Resolved,
        tag: &str,
        now: Nanos,
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) {
        let (policy, cost) = (resolved.policy, resolved.cost);
        let (Some(leased), Place::Global { key, lease: Some(slot), .. }) = (self.leased_home(policy), &resolved.at)
        else {
            return;
        };
        let whose = (*key, tag_bits(tag));
        match self.counted(
            policy,
            self.leases(limiter.store()).owe(slot, cost, leased.config.max_debt, whose, now),
            metrics,
        ) {
            Ok(Some((forgiven, owes))) => {
                if forgiven > 0 {
                    metrics.add(policy, Counter::LeaseForgiven, count(forgiven));
                }
                if owes {
                    self.schedule_charge(Target { policy, slot: slot.clone(), key: *key, tag: tag.to_owned() });
                }
            }
            // The slot is another key's, or the record could not be written: nothing is
            // owed anywhere, so what the fallback admitted is forgiven.
            Ok(None) | Err(_) => metrics.add(policy, Counter::LeaseForgiven, count(cost)),
        }
    }

    /// Reads the next few lease records round this worker's lease tables, and schedules
    /// a charge for any that owes (see [`SWEEP_PER_TICK`]).
    pub fn sweep_debts<S: Store, C: Clock>(&self, limiter: &Limiter<S, C>) {
        let tables: Vec<(usize, &Leased)> = self
            .policies
            .iter()
            .filter_map(|c| match &c.home {
                Home::Global { lease: Some(leased), .. } => Some((c.index, leased)),
                _ => None,
            })
            .collect();
        let total: u64 = tables.iter().map(|(_, l)| u64::from(l.table.slots())).sum();
        if total == 0 {
            return;
        }
        let leases = self.leases(limiter.store());
        for _ in 0..SWEEP_PER_TICK {
            let mut at = self.sweep.get() % total;
            self.sweep.set(self.sweep.get().wrapping_add(1));
            for (policy, leased) in &tables {
                let slots = u64::from(leased.table.slots());
                if at >= slots {
                    at -= slots;
                    continue;
                }
                let key = leased.table.slot_key(u32::try_from(at).unwrap_or(0));
                if let Ok(Some(record)) = leases.read_slot(&key)
                    && record.debt > 0
                    && self.charges.try_borrow().is_ok_and(|c| !c.contains_key(&key))
                {
                    let slot = Placement { key, owner: record.owner, overflow: None };
                    let tag = record.tag.map_or_else(|| "none".to_owned(), namespace::hex128);
                    self.schedule_charge(Target { policy: *policy, slot, key: record.counter, tag });
                }
                break;
            }
        }
    }

    fn schedule_charge(&self, target: Target) {
        if let Ok(mut charges) = self.charges.try_borrow_mut()
            && (charges.len() < MAX_PENDING_CHARGES || charges.contains_key(&target.slot.key))
        {
            charges.insert(target.slot.key.clone(), target);
        }
    }

    /// The calls waiting in this worker's outbox, to be sent by the root context; with
    /// `charges`, also the charges this worker owes (at most a few per call, and not
    /// while the circuit is open).
    pub fn take_outgoing<S: Store, C: Clock>(&self, limiter: &Limiter<S, C>, charges: bool) -> Vec<Outgoing> {
        let mut out = self.outbox.try_borrow_mut().map(|mut outbox| std::mem::take(&mut *outbox)).unwrap_or_default();
        // While the circuit is open, charges wait; once its cooldown has passed, the first
        // charge may be the probe that closes it (a quiet proxy has no other call to probe
        // with).
        let reachable = self
            .service
            .as_ref()
            .is_some_and(|s| s.breaker.admit_quietly(limiter.store(), limiter.clock().now()) != Admit::Open);
        if charges
            && reachable
            && let Ok(mut pending) = self.charges.try_borrow_mut()
        {
            let keys: Vec<String> = pending.keys().take(MAX_CHARGES_PER_TICK).cloned().collect();
            for key in keys {
                if let Some(target) = pending.remove(&key) {
                    out.push(Outgoing::Charge(target));
                }
            }
        }
        out
    }

    /// Whether the outbox holds calls to send (the glue then wakes its root context).
    pub fn has_outgoing(&self) -> bool {
        self.outbox.try_borrow().is_ok_and(|outbox| !outbox.is_empty())
    }

    /// Sends a call from the outbox; `None` when it was decided without the service (the
    /// circuit is open, the proxy would not send it, nothing is left to charge).
    pub fn dispatch_outgoing<S: Store, C: Clock>(
        &self,
        call: Outgoing,
        callouts: &mut impl Callouts,
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) -> Option<SentOutgoing> {
        let service = self.service.as_ref()?;
        let now = limiter.clock().now();
        let window = self.refill_window();
        let leases = self.leases(limiter.store());
        let (sent, path, body) = match call {
            Outgoing::Refill(target, asker) => {
                let (compiled, leased) = (self.compiled(target.policy)?, self.leased_home(target.policy)?);
                let Home::Global { spec, .. } = &compiled.home else { return None };
                let min_tokens = match asker {
                    Asker::LowWater => 1,
                    Asker::Waiter { cost, .. } => cost.clamp(1, leased.config.size),
                };
                let request = LeaseRequest {
                    tag: Some(target.tag.clone()),
                    key: namespace::hex128(target.key),
                    policy_version: compiled.policy.version,
                    limit: *spec,
                    tokens: leased.config.size,
                    min_tokens,
                    ttl_ms: leased.config.duration_ms,
                };
                let body = serde_json::to_vec(&request).unwrap_or_default();
                (Sent::Refill(target, asker), wire::LEASE_PATH, body)
            }
            Outgoing::Charge(target) => {
                let (compiled, leased) = (self.compiled(target.policy)?, self.leased_home(target.policy)?);
                let Home::Global { spec, .. } = &compiled.home else { return None };
                let claimed = leases.claim_charge(&target.slot, self.next_id(), window, now);
                let charge = match self.counted(
                    target.policy,
                    claimed.map(|(c, aged)| Updated { result: c, forgiven: aged }),
                    metrics,
                ) {
                    Ok(Some(charge)) => charge,
                    Ok(None) => {
                        // In flight elsewhere (retried after its window), or nothing owed.
                        if let Ok(Some(record)) = leases.peek(&target.slot, now)
                            && record.debt > 0
                        {
                            self.schedule_charge(target);
                        }
                        return None;
                    }
                    Err(_) => {
                        self.schedule_charge(target);
                        return None;
                    }
                };
                let request = ChargeRequest {
                    tag: Some(target.tag.clone()),
                    key: namespace::hex128(target.key),
                    policy_version: compiled.policy.version,
                    limit: *spec,
                    cost: charge.units,
                    max_debt: leased.config.max_debt,
                    charge_id: Some(charge_id(charge.id)),
                };
                let body = serde_json::to_vec(&request).unwrap_or_default();
                (Sent::Charge(target, charge), wire::CHARGE_PATH, body)
            }
        };
        let unsent = |reason: Reason, sent: Sent, metrics: &mut dyn Metrics| {
            match sent {
                Sent::Refill(target, _) => {
                    let failed = leases.refill_failed(&target.slot, u64::try_from(reason.index()).unwrap_or(0), now);
                    if let Err(UpdateError::Contended { attempts }) = failed {
                        metrics.add(target.policy, Counter::CasConflicts, i64::from(attempts));
                    }
                }
                // Still owed: sent again once the circuit closes.
                Sent::Charge(target, _) => self.schedule_charge(target),
            }
            None
        };
        if service.breaker.admit(limiter.store(), now) == Admit::Open {
            return unsent(Reason::CircuitOpen, sent, metrics);
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
        let call = Call { cluster: &service.cluster, headers: &headers, body: &body, timeout_ms: service.timeout_ms };
        match callouts.dispatch(&call) {
            Ok(token) => {
                metrics.add_plugin(PluginCounter::Callouts, 1);
                if let Sent::Refill(target, _) = &sent {
                    metrics.add(target.policy, Counter::LeaseRefills, 1);
                }
                Some(SentOutgoing { token, deadline: now.saturating_add(window), sent_at: now, call: sent })
            }
            Err(_) => {
                if service.breaker.record(limiter.store(), now, Some(false), now) {
                    metrics.add_plugin(PluginCounter::CircuitOpened, 1);
                }
                unsent(Reason::DispatchFailed, sent, metrics)
            }
        }
    }

    /// Applies the answer to a call the root sent (or its absence: `TimedOut`).
    /// `is_waiting` says whether a waiter (by id) still waits on this worker: a grant is
    /// held only for a request that can still spend it.
    pub fn outgoing_answered<S: Store, C: Clock, M: Metrics>(
        &self,
        sent: SentOutgoing,
        answer: &CalloutAnswer,
        limiter: &Limiter<S, C>,
        metrics: &mut M,
        is_waiting: impl Fn(u64) -> bool,
    ) {
        let now = limiter.clock().now();
        let leases = self.leases(limiter.store());
        let record = |health: Option<bool>, metrics: &mut dyn Metrics| {
            if let Some(service) = &self.service
                && service.breaker.record(limiter.store(), now, health, sent.sent_at)
            {
                metrics.add_plugin(PluginCounter::CircuitOpened, 1);
            }
        };
        match &sent.call {
            Sent::Refill(target, asker) => match wire::classify_lease(answer) {
                Ok(granted) => {
                    record(Some(true), metrics);
                    let expires_in = Nanos::from_millis(granted.expires_in_ms);
                    // The service's waits; "never" (u64::MAX) is held to a minute, after
                    // which the lease asks again.
                    let wait = |ns: u64| Nanos(ns).min(Nanos::from_secs(60));
                    let retry = (wait(granted.entry.retry_after_ns), wait(granted.refill_after_ns));
                    let hold = match asker {
                        Asker::Waiter { waiter, cost } if is_waiting(*waiter) => Some((*waiter, *cost)),
                        _ => None,
                    };
                    let applied =
                        leases.grant(&target.slot, granted.granted, hold, sent.sent_at, expires_in, retry, now);
                    if let Ok(Some(expired)) = self.counted(target.policy, applied, metrics) {
                        metrics.add(target.policy, Counter::LeaseGranted, count(granted.granted));
                        if expired > 0 {
                            metrics.add(target.policy, Counter::LeaseExpired, count(expired));
                        }
                    }
                    // The service answers again: charge what was admitted without it.
                    if let Ok(Some(r)) = leases.peek(&target.slot, now)
                        && r.debt > r.charging
                    {
                        self.schedule_charge(target.clone());
                    }
                }
                Err(failure) => {
                    record(failure.health(), metrics);
                    let failed =
                        leases.refill_failed(&target.slot, u64::try_from(failure.reason.index()).unwrap_or(0), now);
                    let _ = self.counted(
                        target.policy,
                        failed.map(|()| Updated { result: Some(()), forgiven: 0 }),
                        metrics,
                    );
                }
            },
            Sent::Charge(target, charge) => match wire::classify_charge(answer) {
                Ok(charged) => {
                    record(Some(true), metrics);
                    let Ok(settled) = leases.settle_charge(&target.slot, charge.id, now) else { return };
                    // Counted by the answer that settles the charge: a duplicate answers
                    // for an earlier attempt whose own answer never came.
                    if settled.settled {
                        metrics.add(target.policy, Counter::LeaseReconciled, count(charged.charged));
                        if charged.forgiven > 0 {
                            metrics.add(target.policy, Counter::LeaseForgiven, count(charged.forgiven));
                        }
                    }
                    if settled.left > 0 {
                        self.schedule_charge(target.clone());
                    }
                }
                // Stays owed, and reserved for this charge: sent again with the same id
                // once its window has passed (the service may have applied it).
                Err(failure) => {
                    record(failure.health(), metrics);
                    self.schedule_charge(target.clone());
                }
            },
        }
    }
}

/// A check tag as the lease record keeps it: the 128-bit hash, or `None` for `"none"`
/// (no partition).
fn tag_bits(tag: &str) -> Option<u128> {
    (tag != "none").then(|| u128::from_str_radix(tag, 16).unwrap_or(0))
}

/// A charge id as the service receives it: the worker's instance and a sequence number.
fn charge_id(id: u64) -> String {
    namespace::hex128(u128::from(id))
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
