//! The policy engine: a request in, one decision across every matching policy out, with
//! the counts for metrics.
//!
//! # Two phases
//!
//! [`Engine::begin`] resolves the request ([`resolve`]), decides its local policies in one
//! atomic step that also *reserves* what it spends ([`Limiter::reserve`]), and then:
//!
//! * with no global policy, answers at once ([`Begun::Decided`]);
//! * with global policies, sends one callout to the counter service for all of them and
//!   answers [`Begun::Waiting`]; the glue keeps the [`Pending`] request and hands the
//!   answer to [`Engine::complete`], which commits the local reservation if the service
//!   admits, and refunds it if the service rejects or the failure rule rejects. So a
//!   request spends all or nothing across local and global policies: a local rejection
//!   makes no callout, a global rejection gives the local spend back. The argument that
//!   nothing is spent twice or lost is in `shared_store::limiter` ("Reservations").
//!
//! # Counting
//!
//! A decision is counted when the glue has carried it out ([`Engine::settle`]): `offered`
//! and its disposition (`allowed`, `rejected`, `queued`) move together, so
//! `offered = allowed + rejected + queued` holds at every moment, also for a local reply
//! the host refuses (the glue then settles what really happened).
//!
//! # Keys
//!
//! Local keys hash with the proxy's random secret into the policy's slot table; global
//! keys hash with the operator's key, so every proxy names the same counter and neither
//! the service nor Redis sees a raw identity. See [`namespace`].

mod breaker;
mod compiled;
mod fallback;
pub mod headers;
pub mod lease_record;
mod leased;
pub mod namespace;
mod resolve;
pub mod wire;

use crate::config::{Config, FailureOutcome, Policy, Response, Secret, SecretSource, Shaping};
use crate::host::{Call, CalloutAnswer, Callouts, Counter, Metrics, PluginCounter, RequestFacts};
use breaker::{Admit, CircuitBreaker};
use compiled::{Compiled, Home};
use fallback::Cause;
pub use headers::{private_cache_control, rate_limit_headers};
pub use lease_record::{LeaseView, inspect_lease_record};
pub use leased::{Asker, Outgoing, SentOutgoing};
pub use namespace::{anchor_key, establish_secret, plugin_prefix};
use resolve::{Few, Place, Refusal, Resolved, Secrets, resolve};
use shared_store::{
    Admission, Clock, Decision, HashKey, LimitError, Limiter, Nanos, Placement, Request, Reservation, Store,
};
use std::cell::{Cell, RefCell};
pub use wire::Reason;

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Forward it; add these headers to its response.
    Continue {
        /// Response headers (rate-limit headers on allowed responses, the fallback header).
        headers: Vec<(String, String)>,
    },
    /// Answer it locally.
    Reject(LocalResponse),
    /// Forward it at `due` (shaping), then add `headers` to its response.
    Delay {
        /// How long to hold it, from the decision.
        delay: Nanos,
        /// When it is due, on the limiter's clock.
        due: Nanos,
        /// Response headers.
        headers: Vec<(String, String)>,
    },
}

/// A local reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    /// HTTP status.
    pub status: u16,
    /// Headers.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: String,
}

/// The policies a request counts under, to [`Engine::settle`] once its fate is carried out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally(Few<usize>);

impl Tally {
    /// The policies' indices.
    pub fn policies(&self) -> &[usize] {
        &self.0
    }
}

/// What happened to a request, as carried out by the glue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Forwarded upstream.
    Allowed,
    /// Answered with a rejection (or reset).
    Rejected,
    /// Held by shaping.
    Queued,
}

/// A decision and the policies it counts under. It must be carried out (and settled):
/// dropping one would leave its stream paused and its counts unsettled.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a decision must be carried out, or its stream stays paused"]
pub struct Decided {
    /// What to do.
    pub outcome: Outcome,
    /// What to settle once done.
    pub tally: Tally,
}

/// What [`Engine::begin`] leaves the glue with: a decision to carry out, or a wait to
/// hold (and, if it cannot be held, to decide at once).
#[derive(Debug)]
#[must_use = "a decision must be carried out and a wait held, or the stream stays paused"]
pub enum Begun {
    /// Decided now.
    Decided(Decided),
    /// Waiting for the counter service's answer to callout `Pending::token` (boxed: it
    /// carries the whole request's state, and only requests with global policies wait).
    Waiting(Box<Pending>),
}

/// A waiting request: everything [`Engine::complete`] (an answer to its check) or
/// [`Engine::retry`] (a refill of its leases) needs.
#[derive(Debug)]
pub struct Pending {
    /// The host's token for the callout (check waits).
    pub token: u32,
    /// When the filter stops waiting, on the limiter's clock.
    pub deadline: Nanos,
    /// When its check was sent (a success from before the circuit opened does not
    /// close it).
    sent_at: Nanos,
    /// Whether its check is the probe of a half-open circuit.
    probe: bool,
    /// Its id while it waits for a lease refill (a grant it elected is held for it);
    /// 0 before.
    waiter: u64,
    /// What it waits for.
    stage: Stage,
    tally: Tally,
    reservation: Reservation,
    local: Few<(usize, Decision)>,
    local_due: Option<Nanos>,
    /// Check-mode policies not decided yet.
    checked: Few<Resolved>,
    /// The service's decisions for the check-mode policies.
    decisions: Few<(usize, Decision)>,
    checked_due: Option<Nanos>,
    /// Lease-mode policies not spent yet.
    leased: Few<Resolved>,
    /// Lease spends made, to give back if the request is rejected after all.
    spent: Few<(usize, Placement, u64)>,
    /// When it began waiting for a refill.
    since: Nanos,
    /// The check's hash tag, also the tag of refills.
    tag: String,
    /// Set when a fallback decided part of the request: what the fallback header says.
    fallback: Option<fallback::Note>,
    shadows: Few<Resolved>,
}

/// What a waiting request waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The answer to its check callout.
    Check,
    /// A refill of a lease (polled on the tick).
    Lease,
}

impl Pending {
    /// Whether it waits for a lease refill (polled with [`Engine::retry`] on the tick)
    /// rather than for its check's answer.
    pub fn waits_for_lease(&self) -> bool {
        self.stage == Stage::Lease
    }

    /// Its id as a lease waiter (0 when it has not waited for a refill).
    pub fn waiter(&self) -> u64 {
        self.waiter
    }
}

/// The counter service, as the request path uses it.
#[derive(Debug)]
struct Service {
    cluster: String,
    authority: String,
    timeout_ms: u32,
    timeout: Nanos,
    /// `Bearer <token>`: a [`Secret`] so that no `Debug` print shows it.
    authorization: Option<Secret>,
    partition: Vec<crate::config::KeyPart>,
    secret: HashKey,
    breaker: CircuitBreaker,
}

/// The configuration compiled against one plugin's identity and hash secrets.
#[derive(Debug)]
pub struct Engine {
    policies: Vec<Compiled>,
    response: Response,
    shaping: Shaping,
    stat_prefix: String,
    secret: HashKey,
    service: Option<Service>,
    degraded: RefCell<fallback::LogLimiter>,
    /// The key written to create keys atomically.
    anchor: String,
    /// Calls the root context is to send (lease refills and charges).
    outbox: RefCell<Vec<Outgoing>>,
    /// Keys this worker owes charges for.
    charges: RefCell<leased::PendingCharges>,
    /// This worker's instance: ids it hands out (waiters, charges) start from it.
    instance: u64,
    ids: Cell<u64>,
    /// Where the sweep for unknown debt goes on (see `leased::SWEEP_PER_TICK`).
    sweep: Cell<u64>,
}

/// Reads a secret from the configuration or from the VM's environment.
fn secret(
    source: &SecretSource,
    field: &str,
    env: &impl Fn(&str) -> Option<String>,
    min_bytes: usize,
) -> Result<String, String> {
    let value = match source {
        SecretSource::Inline(secret) => secret.expose().to_owned(),
        SecretSource::Env(name) => match env(name) {
            Some(value) if !value.is_empty() => value,
            _ => {
                return Err(format!(
                    "counter_service.{field}_env: the VM has no environment variable {name:?} \
                     (set it in vm_config.environment_variables)"
                ));
            }
        },
    };
    if value.len() < min_bytes {
        let source = match source {
            SecretSource::Inline(_) => field.to_owned(),
            SecretSource::Env(name) => format!("{field}_env ({name})"),
        };
        return Err(format!("counter_service.{source}: must be at least {min_bytes} bytes"));
    }
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("counter_service.{field}: expected visible ASCII characters without spaces"));
    }
    Ok(value)
}

impl Engine {
    /// Compiles `config` for the plugin whose keys start with `prefix` (see
    /// [`plugin_prefix`]), hashing local keys with `secret`; `env` reads the VM's
    /// environment for secrets configured by name.
    ///
    /// # Errors
    /// A message naming the field, when a secret the configuration names is missing or
    /// malformed. Secrets never appear in it.
    pub fn new(
        config: Config,
        prefix: &str,
        secret: HashKey,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let Config { policies, response, shaping, stat_prefix, counter_service } = config;
        let service = match counter_service {
            None => None,
            Some(service) => {
                let hash_key =
                    self::secret(&service.hash_key, "hash_key", &env, crate::config::global::MIN_HASH_KEY_BYTES)?;
                let authorization = match &service.token {
                    Some(source) => Some(Secret::new(format!("Bearer {}", self::secret(source, "token", &env, 1)?))),
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
                    secret: namespace::global_hash_key(hash_key.as_bytes()),
                })
            }
        };
        let policies = policies.into_iter().enumerate().map(|(i, p)| Compiled::new(i, p, prefix)).collect();
        // Tests keep this; the proxy gives each worker a random one (`with_instance`).
        let instance = secret.fingerprint(b"sluice/instance") as u64;
        Ok(Self {
            policies,
            response,
            shaping,
            stat_prefix,
            secret,
            service,
            degraded: RefCell::new(fallback::LogLimiter::default()),
            anchor: anchor_key(prefix),
            outbox: RefCell::new(Vec::new()),
            charges: RefCell::new(leased::PendingCharges::new()),
            instance,
            ids: Cell::new(0),
            sweep: Cell::new(0),
        })
    }

    /// Sets this worker's instance id (random per VM in the proxy), from which the ids
    /// of lease waiters and charges are drawn: two workers, or two proxies, never send
    /// the service the same charge id.
    #[must_use]
    pub fn with_instance(mut self, instance: u64) -> Self {
        self.instance = instance;
        self
    }

    /// A fresh id, never 0.
    fn next_id(&self) -> u64 {
        loop {
            let n = self.ids.get().wrapping_add(1);
            self.ids.set(n);
            let id = self.instance.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            if id != 0 {
                return id;
            }
        }
    }

    /// The policies, in configuration order (their index is their metric index).
    pub fn policies(&self) -> impl Iterator<Item = &Policy> {
        self.policies.iter().map(|c| &c.policy)
    }

    /// The metric name prefix.
    pub fn stat_prefix(&self) -> &str {
        &self.stat_prefix
    }

    /// How shaped requests are held.
    pub const fn shaping(&self) -> &Shaping {
        &self.shaping
    }

    /// Whether any policy is global.
    pub fn has_global(&self) -> bool {
        self.policies.iter().any(|c| c.policy.is_global())
    }

    /// Whether any policy spends leases (the root context then ticks often, to send
    /// refills and retry waiting requests).
    pub fn has_lease(&self) -> bool {
        self.policies.iter().any(|c| matches!(c.home, Home::Global { lease: Some(_), .. }))
    }

    /// The counter service's callout deadline, when there is a service.
    pub fn callout_timeout(&self) -> Option<Nanos> {
        self.service.as_ref().map(|s| s.timeout)
    }

    /// The most shared-data keys this configuration's buckets can create: slots,
    /// overflow, missing-key bucket and table record per table.
    pub fn max_keys(&self) -> u64 {
        let tables: u64 = self.policies.iter().filter_map(Compiled::table).map(compiled::Table::max_keys).sum();
        let leases: u64 = self
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
    /// A message naming the policy, or the store failure.
    pub fn claim_tables(&self, store: &impl Store) -> Result<(), String> {
        for compiled in &self.policies {
            let policy = &compiled.policy;
            let want = policy.slots.get().to_string();
            for meta in compiled.size_records() {
                match store.get(meta).map_err(|e| e.to_string())? {
                    Some(entry) if entry.value == want.as_bytes() => {}
                    Some(entry) => {
                        let had = String::from_utf8_lossy(&entry.value).into_owned();
                        return Err(format!(
                            "policies[{}].slots: policy {:?} version {} already has {had} slots in this proxy; \
                             changing the table size needs a new version",
                            compiled.index, policy.name, policy.version
                        ));
                    }
                    None => {
                        let _ = store.set(meta, want.as_bytes(), None).map_err(|e| e.to_string())?;
                    }
                }
            }
        }
        Ok(())
    }

    fn compiled(&self, index: usize) -> Option<&Compiled> {
        self.policies.get(index)
    }

    /// Decides a request's local policies and, when it has global ones, sends the
    /// callout for them (see the module docs).
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
        let secrets = Secrets { local: &self.secret, global: self.service.as_ref().map(|s| &s.secret) };
        let resolution = resolve(&self.policies, request, &secrets, metrics);

        let tally = Tally(resolution.offered);
        if let Some(refusal) = resolution.refused {
            let status = match refusal {
                Refusal::MissingKey => self.response.status,
                Refusal::Failure(status) => status,
            };
            return Begun::Decided(Decided { outcome: Outcome::Reject(self.rejection(None, status, None)), tally });
        }
        let (local, reservation, local_due) = if resolution.local.is_empty() {
            (Few::new(), Reservation::empty(), None)
        } else {
            // A reservation is only worth keeping when a later stage may give it back.
            let keep = !(resolution.checked.is_empty() && resolution.leased.is_empty());
            match self.reserve_local(&resolution.local, keep, limiter, metrics) {
                Local::Admitted { decisions, reservation, due } => (decisions, reservation, due),
                Local::Rejected(outcome) => return Begun::Decided(Decided { outcome, tally }),
                Local::Failed(Some(outcome)) => return Begun::Decided(Decided { outcome, tally }),
                Local::Failed(None) => (Few::new(), Reservation::empty(), None),
            }
        };
        let mut pending = Pending {
            token: 0,
            deadline: Nanos::ZERO,
            sent_at: Nanos::ZERO,
            probe: false,
            waiter: 0,
            stage: Stage::Check,
            tally,
            reservation,
            local,
            local_due,
            checked: resolution.checked,
            decisions: Few::new(),
            checked_due: None,
            leased: resolution.leased,
            spent: Few::new(),
            since: Nanos::ZERO,
            tag: String::new(),
            fallback: None,
            shadows: resolution.shadows,
        };
        if pending.checked.is_empty() && pending.leased.is_empty() {
            return self.proceed(pending, limiter, room_to_pause, metrics);
        }
        let Some(service) = &self.service else {
            // The configuration refuses global policies without a service.
            let cause = Cause::Service(Reason::DispatchFailed);
            return self.degrade_checks(cause, pending, true, limiter, room_to_pause, metrics);
        };
        pending.tag =
            match crate::policy::fingerprint_parts("\0partition", 0, &service.partition, request, &service.secret) {
                Ok(Some(tag)) => namespace::hex128(tag),
                Ok(None) => "none".to_owned(),
                Err(_) => {
                    for resolved in pending.checked.iter().chain(&pending.leased) {
                        metrics.add(resolved.policy, Counter::ReadFailures, 1);
                    }
                    let cause = Cause::Service(Reason::DispatchFailed);
                    return self.degrade_checks(cause, pending, true, limiter, room_to_pause, metrics);
                }
            };
        if pending.checked.is_empty() {
            return self.proceed(pending, limiter, room_to_pause, metrics);
        }
        let now = limiter.clock().now();
        let admit = service.breaker.admit(limiter.store(), now);
        if admit == Admit::Open {
            let cause = Cause::Service(Reason::CircuitOpen);
            return self.degrade_checks(cause, pending, false, limiter, room_to_pause, metrics);
        }
        pending.probe = admit == Admit::Probe;
        let tag = pending.tag.clone();
        let body = wire::check_body(&tag, &pending.checked, |index| match &self.compiled(index)?.home {
            Home::Global { spec, .. } => Some((*spec, self.compiled(index)?.policy.version)),
            Home::Local(_) => None,
        });
        let mut headers: Vec<(&str, &str)> = vec![
            (":method", "POST"),
            (":path", wire::CHECK_PATH),
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
                metrics.add_plugin(PluginCounter::Waiting, 1);
                pending.token = token;
                pending.sent_at = now;
                pending.deadline = now.saturating_add(service.timeout);
                Begun::Waiting(Box::new(pending))
            }
            Err(_) => {
                if service.breaker.record(limiter.store(), now, Some(false), now) {
                    metrics.add_plugin(PluginCounter::CircuitOpened, 1);
                }
                let cause = Cause::Service(Reason::DispatchFailed);
                self.degrade_checks(cause, pending, false, limiter, room_to_pause, metrics)
            }
        }
    }

    /// Applies the failure rule to the request's check policies (and, `with_leases`,
    /// its lease policies too) for `cause`, then goes on with what is left.
    fn degrade_checks<S: Store, C: Clock>(
        &self,
        cause: Cause,
        mut pending: Pending,
        with_leases: bool,
        limiter: &Limiter<S, C>,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Begun {
        let mut failed: Few<(Resolved, Cause)> =
            std::mem::take(&mut pending.checked).into_iter().map(|r| (r, cause)).collect();
        if with_leases {
            failed.extend(std::mem::take(&mut pending.leased).into_iter().map(|r| (r, cause)));
        }
        match self.apply_failure_rule(failed, pending, limiter, metrics) {
            Ok(pending) => self.proceed(pending, limiter, room_to_pause, metrics),
            Err(decided) => Begun::Decided(decided),
        }
    }

    /// Decides a request waiting for its check with the counter service's answer (or its
    /// absence). It may then wait for a lease refill ([`Begun::Waiting`], polled with
    /// [`Engine::retry`]).
    pub fn complete<S: Store, C: Clock>(
        &self,
        pending: Box<Pending>,
        answer: &CalloutAnswer,
        limiter: &Limiter<S, C>,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Begun {
        metrics.add_plugin(PluginCounter::Waiting, -1);
        let now = limiter.clock().now();
        let classified = wire::classify(answer, pending.checked.len());
        let health = match &classified {
            Ok(_) => Some(true),
            Err(failure) => failure.health(),
        };
        if let Some(service) = &self.service
            && service.breaker.record(limiter.store(), now, health, pending.sent_at)
        {
            metrics.add_plugin(PluginCounter::CircuitOpened, 1);
        }
        let pending = *pending;
        let response = match classified {
            Ok(response) => response,
            Err(failure) => {
                let cause = Cause::Service(failure.reason);
                return self.degrade_checks(cause, pending, false, limiter, room_to_pause, metrics);
            }
        };
        let mut pending = pending;
        let global: Few<(usize, Decision)> =
            pending.checked.iter().zip(&response.entries).map(|(r, e)| (r.policy, e.decision())).collect();
        pending.checked.clear();
        if !response.admitted {
            for (policy, decision) in &global {
                if !decision.is_admitted() {
                    metrics.add(*policy, Counter::OverLimit, 1);
                }
            }
            let strictest = headers::strictest_rejection(&global);
            return Begun::Decided(self.reject_pending(pending, strictest, self.response.status, limiter, metrics));
        }
        let delay = global.iter().map(|(_, d)| d.delay()).max().unwrap_or(Nanos::ZERO);
        pending.checked_due = (delay > Nanos::ZERO).then(|| now.saturating_add(delay));
        pending.decisions = global;
        self.proceed(pending, limiter, room_to_pause, metrics)
    }

    /// After the local and check stages: the leases, then the admission.
    fn proceed<S: Store, C: Clock>(
        &self,
        pending: Pending,
        limiter: &Limiter<S, C>,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Begun {
        if pending.leased.is_empty() {
            return Begun::Decided(self.admit(pending, limiter, room_to_pause, metrics));
        }
        self.lease_stage(pending, limiter, room_to_pause, metrics)
    }

    /// Rejects a request after some of it was spent: gives back its lease spends and its
    /// local reservation (check spends stay spent: the service has no refund).
    fn reject_pending<S: Store, C: Clock>(
        &self,
        pending: Pending,
        strictest: Option<(usize, Decision)>,
        status: u16,
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) -> Decided {
        self.give_back_leases(&pending.spent, limiter);
        self.give_back(pending.reservation, &pending.local, limiter, metrics);
        let note = pending.fallback.as_ref().map(|note| note.render(self));
        let outcome = Outcome::Reject(self.rejection(strictest, status, note.as_deref()));
        Decided { outcome, tally: pending.tally }
    }

    /// Counts a request's fate once the glue has carried it out.
    pub fn settle(&self, tally: &Tally, disposition: Disposition, metrics: &mut impl Metrics) {
        let counter = match disposition {
            Disposition::Allowed => Counter::Allowed,
            Disposition::Rejected => Counter::Rejected,
            Disposition::Queued => Counter::Queued,
        };
        for &policy in &tally.0 {
            metrics.add(policy, Counter::Offered, 1);
            metrics.add(policy, counter, 1);
        }
    }

    /// Counts a paused request released to the upstream.
    pub fn release(&self, tally: &Tally, metrics: &mut impl Metrics) {
        for &policy in &tally.0 {
            metrics.add(policy, Counter::Queued, -1);
            metrics.add(policy, Counter::Allowed, 1);
        }
    }

    /// Counts a paused request whose stream ended before its release. It spent its place
    /// in the queue, so it counts as allowed, and as abandoned.
    pub fn abandon(&self, tally: &Tally, metrics: &mut impl Metrics) {
        for &policy in &tally.0 {
            metrics.add(policy, Counter::Queued, -1);
            metrics.add(policy, Counter::Allowed, 1);
            metrics.add(policy, Counter::Abandoned, 1);
        }
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
        metrics.add_plugin(PluginCounter::Waiting, -1);
        // The host cancels an ended stream's callout: a probe's answer will not come.
        if pending.probe
            && let Some(service) = &self.service
        {
            service.breaker.release_probe(limiter.store(), limiter.clock().now());
        }
        self.give_back(pending.reservation, &pending.local, limiter, metrics);
        self.settle(&pending.tally, Disposition::Rejected, metrics);
        for &policy in &pending.tally.0 {
            metrics.add(policy, Counter::Abandoned, 1);
        }
    }

    fn reserve_local<S: Store, C: Clock>(
        &self,
        local: &[Resolved],
        keep: bool,
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) -> Local {
        let requests: Few<Request<'_>> = local
            .iter()
            .filter_map(|r| match (&r.at, self.compiled(r.policy)) {
                (Place::Local(place), Some(compiled)) => {
                    Some(Request { place, limit: &compiled.policy.limit, cost: r.cost })
                }
                _ => None,
            })
            .collect();
        let decided = if keep {
            limiter.reserve(&requests)
        } else {
            limiter.check(&requests).map(|admission| (admission, Reservation::empty()))
        };
        match decided {
            Ok((admission, reservation)) => {
                for r in local {
                    count_evidence(metrics, r.policy, &admission);
                }
                if admission.created > 0 {
                    metrics.add_plugin(PluginCounter::KeysCreated, i64::from(admission.created));
                }
                let decisions: Few<(usize, Decision)> =
                    local.iter().map(|r| r.policy).zip(admission.decisions.iter().copied()).collect();
                if !admission.admitted {
                    for (policy, decision) in &decisions {
                        if !decision.is_admitted() {
                            metrics.add(*policy, Counter::OverLimit, 1);
                        }
                    }
                    let strictest = headers::strictest_rejection(&decisions);
                    return Local::Rejected(Outcome::Reject(self.rejection(strictest, self.response.status, None)));
                }
                let delay = admission.delay();
                let due = (delay > Nanos::ZERO).then(|| admission.at.saturating_add(delay));
                Local::Admitted { decisions, reservation, due }
            }
            Err(error) => Local::Failed(self.local_failure(local, &error, metrics)),
        }
    }

    /// No local decision could be made: any `deny` among the local policies denies
    /// (`Some`); otherwise they are allowed and the request goes on (`None`).
    fn local_failure(&self, local: &[Resolved], error: &LimitError, metrics: &mut impl Metrics) -> Option<Outcome> {
        let deny = local.iter().find_map(|r| match self.compiled(r.policy)?.policy.on_failure {
            FailureOutcome::Deny(status) => Some(status),
            FailureOutcome::Allow => None,
        });
        for r in local {
            count_error(metrics, r.policy, error);
            metrics.add(r.policy, if deny.is_some() { Counter::FailureDenied } else { Counter::FailureAllowed }, 1);
        }
        log::debug!("sluice: no decision ({error}); failure outcome {}", if deny.is_some() { "deny" } else { "allow" });
        deny.map(|status| Outcome::Reject(self.rejection(None, status, None)))
    }

    /// Gives a local reservation back, counting what could not be.
    fn give_back<S: Store, C: Clock>(
        &self,
        reservation: Reservation,
        local: &[(usize, Decision)],
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) {
        if reservation.is_empty() {
            return;
        }
        let unrefunded = limiter.refund(reservation);
        if unrefunded > 0
            && let Some((policy, _)) = local.first()
        {
            metrics.add(*policy, Counter::Unrefunded, i64::from(unrefunded));
        }
    }

    /// The admitted path: keep the local spend, decide shadows, build the headers, and
    /// hold the request if a policy shapes it.
    fn admit<S: Store, C: Clock>(
        &self,
        pending: Pending,
        limiter: &Limiter<S, C>,
        room_to_pause: bool,
        metrics: &mut impl Metrics,
    ) -> Decided {
        limiter.commit(pending.reservation);
        self.decide_shadows(&pending.shadows, limiter, metrics);
        let mut decisions: Few<(usize, Decision)> = pending.local.clone();
        decisions.extend(pending.decisions.iter().copied());
        let mut headers = self.allowed_headers(&decisions);
        if let (Some(name), Some(value)) =
            (&self.response.fallback_header, pending.fallback.as_ref().map(|note| note.render(self)))
        {
            headers.push((name.clone(), value));
        }
        let due = match (pending.local_due, pending.checked_due) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let outcome = match due {
            None => Outcome::Continue { headers },
            Some(_) if !room_to_pause => Outcome::Reject(self.rejection(None, self.response.status, None)),
            Some(due) => {
                let now = limiter.clock().now();
                Outcome::Delay { delay: due.saturating_sub(now), due, headers }
            }
        };
        Decided { outcome, tally: pending.tally }
    }

    fn decide_shadows<S: Store, C: Clock>(
        &self,
        shadows: &[Resolved],
        limiter: &Limiter<S, C>,
        metrics: &mut impl Metrics,
    ) {
        for r in shadows {
            let (Place::Local(place), Some(compiled)) = (&r.at, self.compiled(r.policy)) else { continue };
            match limiter.check_one(place, &compiled.policy.limit, r.cost) {
                Ok(admission) => {
                    count_evidence(metrics, r.policy, &admission);
                    if admission.created > 0 {
                        metrics.add_plugin(PluginCounter::KeysCreated, i64::from(admission.created));
                    }
                    if !admission.admitted {
                        metrics.add(r.policy, Counter::ShadowRejected, 1);
                    }
                }
                Err(error) => count_error(metrics, r.policy, &error),
            }
        }
    }

    /// A rejection, with the headers of the decision that speaks for it (if any) and the
    /// fallback header (if a fallback decided).
    fn rejection(&self, strictest: Option<(usize, Decision)>, status: u16, fallback: Option<&str>) -> LocalResponse {
        let response = &self.response;
        let mut headers = response.headers.clone();
        if let Some((policy, decision)) = strictest
            && let Some(compiled) = self.compiled(policy)
        {
            let policy = &compiled.policy;
            let limit = match (&compiled.home, fallback) {
                (Home::Global { cap: Some(cap), .. }, Some(_)) => &cap.limit,
                _ => &policy.limit,
            };
            if rate_limit_headers(&mut headers, response.on_rejected, &policy.name, limit, &decision) {
                headers.push(("cache-control".to_owned(), "private".to_owned()));
            }
        }
        if let (Some(name), Some(value)) = (&response.fallback_header, fallback) {
            headers.push((name.clone(), value.to_owned()));
        }
        LocalResponse { status, headers, body: response.body.clone() }
    }

    fn allowed_headers(&self, decisions: &[(usize, Decision)]) -> Vec<(String, String)> {
        let sets = self.response.on_allowed;
        let mut headers = Vec::new();
        if !sets.any() {
            return headers;
        }
        if let Some((policy, decision)) = headers::strictest_admission(decisions)
            && let Some(compiled) = self.compiled(policy)
        {
            let policy = &compiled.policy;
            rate_limit_headers(&mut headers, sets, &policy.name, &policy.limit, &decision);
        }
        headers
    }
}

/// What a local reservation came to. Not boxed: it is on every request's path, and
/// moving it costs less than allocating it.
#[allow(clippy::large_enum_variant)]
enum Local {
    Admitted {
        decisions: Few<(usize, Decision)>,
        reservation: Reservation,
        due: Option<Nanos>,
    },
    Rejected(Outcome),
    /// No decision: `Some` when the failure action denies.
    Failed(Option<Outcome>),
}

fn count_evidence(metrics: &mut impl Metrics, policy: usize, admission: &Admission) {
    for (counter, value) in [
        (Counter::CasConflicts, admission.conflicts),
        (Counter::Repaired, admission.repaired),
        (Counter::Overflowed, admission.overflowed),
        (Counter::Unrefunded, admission.unrefunded),
    ] {
        if value > 0 {
            metrics.add(policy, counter, i64::from(value));
        }
    }
}

fn count_error(metrics: &mut impl Metrics, policy: usize, error: &LimitError) {
    match error {
        LimitError::Contended { attempts } => {
            metrics.add(policy, Counter::CasConflicts, i64::from(*attempts));
            metrics.add(policy, Counter::CasExhausted, 1);
        }
        LimitError::Store(_) => metrics.add(policy, Counter::StoreErrors, 1),
    }
}

#[cfg(test)]
mod global_tests;
#[cfg(test)]
mod lease_tests;
#[cfg(test)]
mod tests;
