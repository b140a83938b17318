//! The policy engine: a request in, one decision across every matching policy out, with
//! the counts for metrics. [`Engine`] is the one place the glue calls: it forwards each
//! callback to the request path ([`request`], one stage per file) or to the calls the
//! root context sends ([`outgoing`]).
//!
//! # Two phases
//!
//! [`Engine::begin`] resolves the request, decides its local policies in one atomic step
//! that also *reserves* what it spends, and then:
//!
//! * with no global policy, answers at once ([`Begun::Decided`]);
//! * with global policies, sends one callout to the counter service for the check-mode
//!   ones and answers [`Begun::Waiting`]; the glue keeps the [`Pending`] request and
//!   hands the answer to [`Engine::complete`], which commits the local reservation if
//!   the service admits, and refunds it if the service rejects or the failure rule
//!   rejects. Lease-mode policies spend from this proxy's leases, waiting (again
//!   [`Begun::Waiting`], retried with [`Engine::retry`]) only when a lease is empty. So a
//!   request spends all or nothing across local and global policies. The argument that
//!   nothing is spent twice or lost is in `shared_store::limiter` ("Reservations").
//!
//! # Counting
//!
//! A decision is counted when the glue has carried it out ([`Engine::record`]): `offered`
//! and its disposition (`allowed`, `rejected`, `queued`) move together, so
//! `offered = allowed + rejected + queued` holds at every moment, also for a local reply
//! the host refuses (the glue then records what really happened). "Settle" means one
//! thing: an estimate spent at admission settled to the cost the response reports
//! ([`Engine::settle_cost`]).
//!
//! # Keys
//!
//! Local keys hash with the proxy's random secret into the policy's slot table; global
//! keys hash with the operator's key, so every proxy names the same counter and neither
//! the service nor Redis sees a raw identity. See [`namespace`].
//!
//! # Layers
//!
//! Inside the engine, modules import only downwards (`filter/tests/layers.rs` holds it,
//! and holds this list to its table), from the bottom:
//!
//! 1. what the stages pass and read: `decision`, `resolved`, `wire`, `namespace`,
//!    `headers`, `compiled`, `breaker`, `lease_record`, `cause`, `calls`, `check_group`,
//!    `settle_queue`, `evidence`, `secrets`, `held`, `spells`;
//! 2. the compiled configuration and the worker's bookkeeping: `setup`;
//! 3. what the service's answers leave behind: `settlement` (check-mode costs settled at
//!    the service), `lease_return` (leased tokens a proxy will not spend, given back) and
//!    `overridden` (requests decided under an operator's override: counted, named,
//!    logged); concurrency slots released and renewed: `slots`;
//! 4. the request path, and the calls the root sends: `request`, `outgoing`;
//! 5. this file, the one place the glue calls.

mod breaker;
mod calls;
mod cause;
mod check_group;
mod compiled;
mod decision;
mod evidence;
pub mod headers;
mod held;
pub mod lease_record;
mod lease_return;
pub mod namespace;
mod outgoing;
mod overridden;
mod request;
mod resolved;
mod secrets;
mod settle_queue;
mod settlement;
mod setup;
mod slots;
mod spells;
pub mod wire;

use crate::config::{Config, ConfigError, Issue, Policy, Secret, Shaping, Usage};
use crate::host::{CalloutAnswer, Callouts, Metrics, RequestFacts, Wait};
use breaker::CircuitBreaker;
use calls::PendingCharges;
pub use calls::{Asker, Outgoing, SentOutgoing, Target};
use cause::LogLimiter;
pub use compiled::MAX_OWING_REQUESTS;
use compiled::{Compiled, Home};
pub use decision::{Decided, Disposition, HeldSlots, LocalResponse, Outcome, Owed, Tally};
pub use headers::{private_cache_control, rate_limit_headers};
pub use lease_record::{LeaseView, inspect_lease_record};
pub use namespace::{anchor_key, establish_secret, plugin_prefix};
pub use request::{Begun, CheckWait, LeaseWait, Pending};

pub use crate::host::Reason;
use setup::{Service, Setup};
use shared_store::{Clock, HashKey, Limiter, Nanos, Store};
use std::cell::{Cell, RefCell};

/// Records a request's wait once it is decided (a request that still waits, for a
/// refill again or for the check its lease sent it to, is recorded when that ends).
fn count_wait(waited: (Wait, Nanos), begun: &Begun, now: Nanos, metrics: &mut impl Metrics) {
    if let Begun::Decided(_) = begun {
        let (wait, since) = waited;
        metrics.record_wait(wait, now.saturating_sub(since).as_u64() / 1_000_000);
    }
}

/// The configuration compiled against one plugin's identity and hash secrets.
#[derive(Debug)]
pub struct Engine(Setup);

impl Engine {
    /// Compiles `config` for the plugin whose keys start with `prefix` (see
    /// [`plugin_prefix`]), hashing local keys with `secret`; `env` reads the VM's
    /// environment for secrets configured by name.
    ///
    /// # Errors
    /// The field, when a secret the configuration names is missing or malformed (as
    /// validation locates its errors). Secrets never appear in it.
    pub fn new(
        config: Config,
        prefix: &str,
        secret: HashKey,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let Config { policies, response, shaping, stat_prefix, metrics_flush_ms, counter_service } = config;
        let invalid = |issue: Issue| ConfigError::Invalid(vec![issue]);
        let service = match counter_service {
            None => None,
            Some(service) => {
                let hash_key =
                    secrets::secret(&service.hash_key, "hash_key", &env, crate::config::global::MIN_HASH_KEY_BYTES)
                        .map_err(invalid)?;
                let authorization = match &service.token {
                    Some(source) => Some(Secret::new(format!(
                        "Bearer {}",
                        secrets::secret(source, "token", &env, 1).map_err(invalid)?
                    ))),
                    None => None,
                };
                let timeout = service.timeout();
                Some(Service {
                    breaker: CircuitBreaker::new(
                        namespace::breaker_key(prefix),
                        anchor_key(prefix),
                        service.breaker.failures,
                        service.breaker.cooldown,
                        timeout.saturating_add(Nanos::from_secs(1)),
                    ),
                    cluster: service.cluster,
                    authority: service.authority,
                    timeout_ms: service.timeout_ms,
                    timeout,
                    authorization,
                    partition: service.partition,
                    secret: HashKey::global(hash_key.as_bytes()),
                    group: RefCell::new(check_group::CheckGroup::new(
                        usize::try_from(service.max_checks_in_flight).unwrap_or(usize::MAX),
                        usize::try_from(service.max_checks_per_call).unwrap_or(usize::MAX),
                        Nanos(timeout.0 / 4),
                    )),
                })
            }
        };
        let policies = policies.into_iter().enumerate().map(|(i, p)| Compiled::new(i, p, prefix)).collect();
        // Tests keep this; the proxy gives each worker a random one (`with_instance`).
        let instance = secret.fingerprint(b"sluice/instance") as u64;
        Ok(Self(Setup {
            policies,
            response,
            shaping,
            stat_prefix,
            metrics_flush_ms,
            secret,
            service,
            degraded: RefCell::new(LogLimiter::default()),
            spells: RefCell::default(),
            overrides_logged: RefCell::default(),
            anchor: anchor_key(prefix),
            outbox: RefCell::new(Vec::new()),
            charges: RefCell::new(PendingCharges::new()),
            settlements: RefCell::new(settle_queue::SettleQueue::new(setup::MAX_PENDING_SETTLEMENTS)),
            reviews: RefCell::default(),
            instance,
            ids: Cell::new(0),
            sweep: Cell::new(0),
            held: RefCell::new(held::Held::default()),
        }))
    }

    /// Sets this worker's instance id (random per VM in the proxy), from which the ids
    /// of lease waiters and charges are drawn: two workers, or two proxies, never send
    /// the service the same charge id.
    #[must_use]
    pub fn with_instance(mut self, instance: u64) -> Self {
        self.0.instance = instance;
        self
    }

    /// The policies, in configuration order (their index is their metric index).
    pub fn policies(&self) -> impl Iterator<Item = &Policy> {
        self.0.policies.iter().map(|c| &c.policy)
    }

    /// The metric name prefix.
    pub fn stat_prefix(&self) -> &str {
        &self.0.stat_prefix
    }

    /// How often counts kept in the VM are handed to the proxy (`None`: each at once).
    pub const fn metrics_flush_ms(&self) -> Option<u32> {
        self.0.metrics_flush_ms
    }

    /// How shaped requests are held.
    pub const fn shaping(&self) -> &Shaping {
        &self.0.shaping
    }

    /// Whether any policy is global.
    pub fn has_global(&self) -> bool {
        self.0.policies.iter().any(|c| c.policy.is_global())
    }

    /// Whether any policy spends leases (the root context then ticks often, to send
    /// refills and retry waiting requests).
    pub fn has_lease(&self) -> bool {
        self.0.policies.iter().any(|c| matches!(c.home, Home::Global { lease: Some(_), .. }))
    }

    /// Whether the root context sends calls for the request path: lease refills and
    /// charges, settlements of check-mode costs the response reports, or checks that
    /// waited to go together (`max_checks_in_flight` above 0). A worker then wakes its
    /// root as soon as there is one to send, rather than at its next tick.
    pub fn sends_from_root(&self) -> bool {
        self.has_lease()
            || self.0.service.as_ref().is_some_and(|s| s.group.try_borrow().is_ok_and(|g| g.batches()))
                && self.0.policies.iter().any(|c| matches!(c.home, Home::Global { lease: None, .. }))
            || self
                .0
                .policies
                .iter()
                .any(|c| matches!(c.home, Home::Global { lease: None, .. }) && c.policy.cost.settled().is_some())
    }

    /// The counter service's callout deadline, when there is a service.
    pub fn callout_timeout(&self) -> Option<Nanos> {
        self.0.service.as_ref().map(|s| s.timeout)
    }

    /// The most shared-data keys this configuration's buckets can create: slots,
    /// overflow, missing-key bucket and table record per table.
    pub fn max_keys(&self) -> u64 {
        let tables: u64 = self.0.policies.iter().filter_map(Compiled::table).map(compiled::Table::max_keys).sum();
        let leases: u64 = self
            .0
            .policies
            .iter()
            .filter_map(|c| match &c.home {
                Home::Global { lease: Some(leased), .. } => Some(leased.table.max_keys().saturating_add(1)),
                _ => None,
            })
            .sum();
        tables.saturating_add(leases)
    }

    /// Records each table's slot count in shared data, or checks it against the count
    /// recorded by an earlier configuration of the same policy version: a table cannot
    /// change size in place (callers would move to other slots, some onto idle state,
    /// which would hand them a full bucket), so a new size needs a new `version`.
    ///
    /// # Errors
    /// The policy's `slots`, with what this proxy already has, or the store failure.
    pub fn claim_tables(&self, store: &impl Store) -> Result<(), ConfigError> {
        for compiled in &self.0.policies {
            let policy = &compiled.policy;
            let want = policy.slots.get().to_string();
            let path = || format!("policies[{}].slots", compiled.index);
            let failed = |e: shared_store::StoreError| {
                ConfigError::Invalid(vec![Issue {
                    path: path(),
                    message: format!("cannot record the table size: {e}"),
                }])
            };
            for meta in compiled.size_records() {
                match store.get(meta).map_err(failed)? {
                    Some(entry) if entry.value == want.as_bytes() => {}
                    Some(entry) => {
                        let had = String::from_utf8_lossy(&entry.value).into_owned();
                        return Err(ConfigError::Invalid(vec![Issue {
                            path: path(),
                            message: format!(
                                "policy {:?} version {} already has {had} slots in this proxy; \
                                 changing the table size needs a new version",
                                policy.name, policy.version
                            ),
                        }]));
                    }
                    None => {
                        let _ = store.set(meta, want.as_bytes(), None).map_err(failed)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Decides a request's local policies and, when it has global ones, goes on to the
    /// counter service or the leases (see the module docs).
    ///
    /// `room_to_pause` says whether the caller can hold one more request paused; when it
    /// cannot, a request that would be delayed is rejected instead (its place in the
    /// shaping queue stays spent: stricter, never looser).
    pub fn begin<S: Store, C: Clock>(
        &self,
        request: &impl RequestFacts,
        limiter: &Limiter<S, C>,
        callouts: &mut impl Callouts,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Begun {
        request::begin(&self.0, request, limiter, callouts, room_to_pause, metrics)
    }

    /// Decides a request waiting for its check with the counter service's answer (or its
    /// absence). It may then wait for a lease refill ([`Begun::Waiting`], polled with
    /// [`Engine::retry`]).
    pub fn complete<S: Store, C: Clock>(
        &self,
        pending: Box<Pending>,
        answer: &CalloutAnswer,
        limiter: &Limiter<S, C>,
        callouts: &mut impl Callouts,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Begun {
        let waited = pending.waited();
        let begun = request::complete(&self.0, *pending, answer, limiter, callouts, room_to_pause, metrics);
        count_wait(waited, &begun, limiter.clock().now(), metrics);
        begun
    }

    /// How many requests wait for their check to be sent that may go now, together in
    /// one call: a full call's worth at once, fewer once the worker has room for a call
    /// (0: none waits, or no room for fewer than a full call).
    /// The clock is read only when checks wait: a request that sent none pays nothing.
    pub fn checks_to_send(&self, clock: &impl Clock) -> usize {
        let group = self.0.service.as_ref().and_then(|s| s.group.try_borrow().ok());
        group.filter(|group| group.waiting() > 0).map_or(0, |group| group.next_batch(clock.now()))
    }

    /// Sends the checks of requests that waited to be sent (by stream id), together in
    /// one call (see `check_group`); what each does next, by id.
    pub fn send_checks<S: Store, C: Clock>(
        &self,
        pending: Vec<(u32, Box<Pending>)>,
        limiter: &Limiter<S, C>,
        callouts: &mut impl Callouts,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Vec<(u32, Begun)> {
        let pending = pending.into_iter().map(|(id, p)| (id, *p)).collect();
        request::send_checks(&self.0, pending, limiter, callouts, room_to_pause, metrics)
    }

    /// Decides the requests (by stream id) whose checks one batch carried, with its
    /// answer (read once); what each does next, by id.
    pub fn complete_batch<S: Store, C: Clock>(
        &self,
        pending: Vec<(u32, Box<Pending>)>,
        answer: &CalloutAnswer,
        limiter: &Limiter<S, C>,
        callouts: &mut impl Callouts,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Vec<(u32, Begun)> {
        let waited: Vec<(Wait, Nanos)> = pending.iter().map(|(_, p)| p.waited()).collect();
        let pending = pending.into_iter().map(|(id, p)| (id, *p)).collect();
        let decided = request::complete_batch(&self.0, pending, answer, limiter, callouts, room_to_pause, metrics);
        let now = limiter.clock().now();
        for (waited, (_, begun)) in waited.into_iter().zip(&decided) {
            count_wait(waited, begun, now, metrics);
        }
        decided
    }

    /// Tries a request waiting for a refill again (on its worker's tick, or at once when
    /// a refill's answer reaches its worker). A lease policy its lease cannot serve is
    /// then checked at the service through `callouts` (the request waits for that check
    /// as for its own: [`Begun::Waiting`] with [`Pending::token`]).
    pub fn retry<S: Store, C: Clock>(
        &self,
        pending: Box<Pending>,
        limiter: &Limiter<S, C>,
        callouts: &mut impl Callouts,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Begun {
        let waited = pending.waited();
        let begun = request::retry(&self.0, *pending, limiter, callouts, room_to_pause, metrics);
        count_wait(waited, &begun, limiter.clock().now(), metrics);
        begun
    }

    /// Decides a waiting request that cannot be held (the worker holds `max_waiting`
    /// already): its waiting lease policies take the failure rule (`lease_queue_full`).
    /// Always a decision.
    pub fn overflow<S: Store, C: Clock>(
        &self,
        pending: Box<Pending>,
        limiter: &Limiter<S, C>,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Decided {
        request::decide_now(&self.0, *pending, limiter, room_to_pause, metrics)
    }

    /// The most requests a worker should hold waiting for this request's refills.
    pub fn max_waiting(&self, pending: &Pending) -> usize {
        request::max_waiting(&self.0, pending)
    }

    /// Counts a request that was waiting for the counter service when its stream ended:
    /// its local reservation is given back (it was never forwarded), and if its check was
    /// the probe of a half-open circuit, the next request probes instead.
    pub fn forget<S: Store, C: Clock>(
        &self,
        pending: Box<Pending>,
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) {
        request::forget(&self.0, *pending, limiter, metrics);
    }

    /// Where the `policy`-th policy's response reports its cost, when it does.
    pub fn usage(&self, policy: usize) -> Option<&Usage> {
        self.0.compiled(policy)?.policy.cost.settled().map(|rule| &rule.usage)
    }

    /// Settles what a forwarded request spent on an estimate to the cost its response
    /// reported (`None`: it reported none), and counts it.
    pub fn settle_cost<S: Store, C: Clock>(
        &self,
        owed: &Owed,
        reported: Option<u64>,
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) {
        request::settle::settle(&self.0, owed, reported, limiter, metrics);
    }

    /// Whether any policy limits requests in flight (the root context then ticks at least
    /// every [`RENEW_EVERY`](shared_store::RENEW_EVERY), to renew its slots).
    pub fn has_concurrency(&self) -> bool {
        self.0.policies.iter().any(|c| matches!(c.policy.limit, shared_store::Limit::Concurrency { .. }))
    }

    /// Gives back the concurrency slots of a request that ended (or was not forwarded).
    pub fn release_slots<S: Store, C: Clock>(
        &self,
        slots: HeldSlots,
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) {
        slots::release(&self.0, slots.into_vec(), limiter, metrics);
    }

    /// Renews this worker's concurrency slots, when due (on the tick).
    pub fn renew_slots<S: Store, C: Clock>(&self, limiter: &Limiter<S, C>, metrics: &mut impl Metrics) {
        slots::renew(&self.0, limiter, metrics);
    }

    /// Gives back every concurrency slot this worker still holds (its root is going away).
    pub fn release_all_slots<S: Store, C: Clock>(&self, limiter: &Limiter<S, C>, metrics: &mut impl Metrics) {
        slots::release_all(&self.0, limiter, metrics);
    }

    /// Counts how long each policy has been decided by a fallback, and ends the spells
    /// gone quiet (on the tick).
    pub fn count_fallbacks<S: Store, C: Clock>(&self, limiter: &Limiter<S, C>, metrics: &mut impl Metrics) {
        if let Ok(mut spells) = self.0.spells.try_borrow_mut() {
            spells.tick(limiter.clock().now(), metrics);
        }
    }

    /// Ends every fallback spell of this worker (its root is going away).
    pub fn end_fallbacks(&self, metrics: &mut impl Metrics) {
        if let Ok(mut spells) = self.0.spells.try_borrow_mut() {
            spells.end_all(metrics);
        }
    }

    /// Counts a request's fate once the glue has carried it out.
    pub fn record(&self, tally: &Tally, disposition: Disposition, metrics: &mut impl Metrics) {
        tally.record(disposition, metrics);
    }

    /// Counts a paused request released to the upstream.
    pub fn release(&self, tally: &Tally, metrics: &mut impl Metrics) {
        tally.release(metrics);
    }

    /// Counts a paused request whose stream ended before its release. It spent its place
    /// in the queue, so it counts as allowed, and as abandoned.
    pub fn abandon(&self, tally: &Tally, metrics: &mut impl Metrics) {
        tally.release(metrics);
        tally.abandon(metrics);
    }

    /// Reads the next few lease records round this worker's lease tables, and schedules
    /// a charge for any that owes.
    pub fn sweep_debts<S: Store, C: Clock>(&self, limiter: &Limiter<S, C>) {
        outgoing::sweep_debts(&self.0, limiter);
    }

    /// Reviews the grants this worker applied whose review is due: the tokens it will
    /// not spend before they expire are taken out and returned to the service.
    pub fn review_leases<S: Store, C: Clock>(&self, limiter: &Limiter<S, C>, metrics: &mut impl Metrics) {
        lease_return::review_due(&self.0, limiter, metrics);
    }

    /// The calls waiting in this worker's outbox, to be sent by the root context; with
    /// `charges`, also the charges this worker owes (at most a few per call, and not
    /// while the circuit is open).
    pub fn take_outgoing<S: Store, C: Clock>(&self, limiter: &Limiter<S, C>, charges: bool) -> Vec<Outgoing> {
        outgoing::take_outgoing(&self.0, limiter, charges)
    }

    /// Whether the outbox holds calls to send (the glue then wakes its root context).
    pub fn has_outgoing(&self) -> bool {
        outgoing::has_outgoing(&self.0)
    }

    /// Sends a call from the outbox; `None` when it was decided without the service.
    pub fn dispatch_outgoing<S: Store, C: Clock>(
        &self,
        call: Outgoing,
        callouts: &mut impl Callouts,
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) -> Option<SentOutgoing> {
        outgoing::dispatch_outgoing(&self.0, call, callouts, limiter, metrics)
    }

    /// The root context is going away (the filter was configured again, or the VM
    /// stops): the check-mode settlements it holds, queued or in flight (`in_flight`, its
    /// calls awaiting answers) can no longer be sent or answered, and are forgiven and
    /// counted.
    pub fn retire(&self, in_flight: impl IntoIterator<Item = SentOutgoing>, metrics: &mut impl Metrics) {
        let settlements = in_flight.into_iter().filter_map(|sent| match sent.call {
            calls::Sent::Settle(settlement) => Some(settlement),
            _ => None,
        });
        settlement::retire(&self.0, settlements, metrics);
    }

    /// Applies the answer to a call the root sent (or its absence: `TimedOut`).
    /// `is_waiting` says whether a waiter (by id) still waits on this worker.
    pub fn outgoing_answered<S: Store, C: Clock, M: Metrics>(
        &self,
        sent: SentOutgoing,
        answer: &CalloutAnswer,
        limiter: &Limiter<S, C>,
        metrics: &mut M,
        is_waiting: impl Fn(u64) -> bool,
    ) {
        outgoing::outgoing_answered(&self.0, sent, answer, limiter, metrics, is_waiting);
    }
}

#[cfg(test)]
mod tests;
