//! The proxy-wasm glue: a root context that validates the configuration and, on its
//! tick, releases shaped requests and ends waits for the counter service that passed
//! their deadline; an HTTP context per request that asks the engine and carries out
//! its decision.
//!
//! Each Envoy worker runs its own VM, so everything here is single-threaded (`Rc`,
//! `RefCell`); workers share only the host's shared data, through [`HostStore`]. No
//! `RefCell` borrow is held across a host call that can re-enter the VM (a local reply
//! runs this filter's response callback at once).
//!
//! # Never a paused stream left behind
//!
//! A request is paused only while it is in one of three queues of its worker: shaped
//! (until its turn), waiting for its check's answer (until its deadline, which the tick
//! enforces even if the host's own timeout never fires), or waiting for a lease refill
//! (retried when a refill's answer reaches this worker, and on every tick, until its
//! deadline). Every engine answer goes through [`conclude`]: a wait is queued, or, when
//! it cannot be (a full lease queue), decided at once; a decision is carried out. So no
//! decision can be dropped (`Begun` and `Decided` are `#[must_use]`). Carrying one out
//! always ends in a host action: resume, or local reply; a local reply the host refuses
//! is retried bare, then the stream is reset, and only if that fails too is the request
//! forwarded (counted as `reply_failures`, logged): there is no outcome in which the
//! stream stays paused.
//!
//! # Calls that outlive a request
//!
//! Lease refills and charges are sent by the root context, so that their answers reach
//! it even when the request that asked has ended. A request that puts one in the
//! engine's outbox wakes its root at once through a shared queue of its own worker
//! (`proxy_on_queue_ready` runs on the next turn of the worker's event loop, not on the
//! next tick); the tick sends whatever is left. When a refill's answer arrives, the root
//! retries this worker's waiting requests at once.

use crate::abi::{self, HostLogger, HostStore, WasiClock};
use crate::config::Config;
use crate::due::DueQueue;
use crate::engine::wire::MAX_ANSWER_BYTES;
use crate::engine::{
    Begun, Decided, Disposition, Engine, LocalResponse, Outcome, Pending, SentOutgoing, Tally, anchor_key,
    establish_secret, plugin_prefix, private_cache_control,
};
use crate::host::{
    Call, CalloutAnswer, Callouts, Counter, DispatchError, HostFailure, Metrics, PluginCounter, RequestFacts,
};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use shared_store::{Clock, Limiter, Nanos};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

static LOGGER: HostLogger = HostLogger;

proxy_wasm::main! {{
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(log::LevelFilter::Info);
    // Defence in depth: there is no panic in this filter's own code (clippy forbids the
    // constructs), but if one ever happened, say why before the VM dies.
    std::panic::set_hook(Box::new(|info| abi::log(5, &format!("sluice: panic: {info}"))));
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { state: None }) });
}}

/// The longest tick while requests wait for the counter service: a wait outlives its
/// deadline by at most this (or a quarter of the timeout, if shorter).
const MAX_DEADLINE_TICK_MS: u32 = 50;
/// The tick with lease policies: refills go out, and waiting requests are retried, at
/// most this late.
const LEASE_TICK_MS: u32 = 10;

/// What every HTTP context of one configuration shares.
struct Shared {
    engine: Engine,
    limiter: Limiter<HostStore, WasiClock>,
    metrics: RefCell<HostMetrics>,
    /// Requests paused by shaping, until their turn.
    paused: RefCell<DueQueue<Tally>>,
    /// Requests waiting for the counter service's answer to their check, until their
    /// deadline.
    waiting: RefCell<DueQueue<Box<Pending>>>,
    /// Requests waiting for a lease refill, retried on every tick.
    lease_waiting: RefCell<HashMap<u32, Box<Pending>>>,
    /// Refills and charges the root context sent, by callout token.
    in_flight: RefCell<HashMap<u32, SentOutgoing>>,
    /// Headers to add to each forwarded request's response, by context id.
    response_headers: RefCell<HashMap<u32, Vec<(String, String)>>>,
    /// This worker's shared queue, through which a request wakes the root context to
    /// send what it put in the outbox (`None`: the host has no shared queues; the tick
    /// sends it).
    wake: Option<u32>,
}

/// Metric ids per policy, in [`Counter::ALL`] order, and per plugin.
struct HostMetrics {
    policies: Vec<Vec<Option<u32>>>,
    plugin: Vec<Option<u32>>,
}

impl Metrics for HostMetrics {
    fn add(&mut self, policy: usize, counter: Counter, delta: i64) {
        if let Some(Some(id)) = self.policies.get(policy).and_then(|ids| ids.get(counter.index())) {
            abi::increment_metric(*id, delta);
        }
    }

    fn add_plugin(&mut self, counter: PluginCounter, delta: i64) {
        if let Some(Some(id)) = self.plugin.get(counter.index()) {
            abi::increment_metric(*id, delta);
        }
    }
}

/// The metrics for one callback; `Lost` if they are somehow borrowed already (a
/// callback re-entered), so that counting never panics.
enum Counts<'a> {
    Host(std::cell::RefMut<'a, HostMetrics>),
    Lost,
}

impl Metrics for Counts<'_> {
    fn add(&mut self, policy: usize, counter: Counter, delta: i64) {
        if let Self::Host(metrics) = self {
            metrics.add(policy, counter, delta);
        }
    }

    fn add_plugin(&mut self, counter: PluginCounter, delta: i64) {
        if let Self::Host(metrics) = self {
            metrics.add_plugin(counter, delta);
        }
    }
}

impl Shared {
    fn counts(&self) -> Counts<'_> {
        self.metrics.try_borrow_mut().map_or(Counts::Lost, Counts::Host)
    }
}

struct Root {
    state: Option<Rc<Shared>>,
}

fn define_metrics(engine: &Engine) -> HostMetrics {
    let prefix = engine.stat_prefix();
    let policies = engine
        .policies()
        .map(|p| {
            Counter::ALL
                .iter()
                .map(|c| {
                    let global_only = matches!(c.name().split('.').next(), Some("degraded" | "emergency" | "lease"));
                    (!global_only || p.is_global())
                        .then(|| abi::define_metric(&format!("{prefix}.{}.{}", p.name, c.name()), c.is_gauge()))
                        .flatten()
                })
                .collect()
        })
        .collect();
    let global = engine.has_global();
    let plugin = PluginCounter::ALL
        .iter()
        .map(|c| {
            let service_only = c.name().starts_with("counter_service.");
            (!service_only || global)
                .then(|| abi::define_metric(&format!("{prefix}.{}", c.name()), c.is_gauge()))
                .flatten()
        })
        .collect();
    HostMetrics { policies, plugin }
}

impl Root {
    fn configure(&self) -> Result<Shared, String> {
        let bytes = abi::plugin_configuration()
            .map_err(|s| format!("cannot read the plugin configuration (host status {})", s.0))?;
        let config = Config::from_json(&bytes).map_err(|e| e.to_string())?;
        let plugin = abi::property(&["plugin_name"]).ok().flatten().unwrap_or_default();
        let root_id = abi::property(&["plugin_root_id"]).ok().flatten().unwrap_or_default();
        let prefix = plugin_prefix(&plugin, &root_id);
        let candidate = abi::random16().ok_or("the host gave no random bytes for the hash secret")?;
        let secret = establish_secret(&HostStore, &prefix, candidate).map_err(|e| e.to_string())?;
        let instance = abi::random16().ok_or("the host gave no random bytes for the worker's id")?;
        let instance = u64::from_le_bytes(std::array::from_fn(|i| instance.get(i).copied().unwrap_or(0)));
        let engine = Engine::new(config, &prefix, secret, |name| std::env::var(name).ok())?.with_instance(instance);
        engine.claim_tables(&HostStore)?;
        // One queue per worker (a queue's notifications go to its last registrant), named
        // by the worker's random id.
        let wake =
            engine.has_lease().then(|| abi::register_queue(&format!("{prefix}wake/{instance:016x}")).ok()).flatten();
        let shaping = engine
            .policies()
            .any(|p| matches!(p.limit, shared_store::Limit::LeakyBucket { max_wait, .. } if max_wait > Nanos::ZERO));
        let mut tick_ms = shaping.then_some(engine.shaping().tick_ms);
        if let Some(timeout) = engine.callout_timeout().filter(|_| engine.has_global()) {
            let quarter = u32::try_from(timeout.0 / 4_000_000).unwrap_or(MAX_DEADLINE_TICK_MS);
            let deadline_tick = quarter.clamp(1, MAX_DEADLINE_TICK_MS);
            tick_ms = Some(tick_ms.map_or(deadline_tick, |t| t.min(deadline_tick)));
        }
        if engine.has_lease() {
            tick_ms = Some(tick_ms.map_or(LEASE_TICK_MS, |t| t.min(LEASE_TICK_MS)));
        }
        if let Some(tick_ms) = tick_ms {
            abi::set_tick_period(tick_ms).map_err(|s| format!("cannot set the tick period (host status {})", s.0))?;
        }
        let metrics = define_metrics(&engine);
        let limiter = Limiter::new(HostStore, WasiClock).with_anchor_key(anchor_key(&prefix));
        Ok(Shared {
            engine,
            limiter,
            metrics: RefCell::new(metrics),
            paused: RefCell::new(DueQueue::default()),
            waiting: RefCell::new(DueQueue::default()),
            lease_waiting: RefCell::new(HashMap::new()),
            in_flight: RefCell::new(HashMap::new()),
            response_headers: RefCell::new(HashMap::new()),
            wake,
        })
    }
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _: usize) {
        let Some(shared) = &self.state else { return };
        let Some(sent) = shared.in_flight.try_borrow_mut().ok().and_then(|mut in_flight| in_flight.remove(&token))
        else {
            return;
        };
        let answer = read_answer(num_headers, body_size);
        let refill = sent.is_refill();
        answered(shared, sent, &answer);
        if refill {
            // This worker's waiters spend the grant now; other workers' on their tick.
            retry_lease_waiters(shared);
        }
        send_outgoing(shared, false);
    }
}

/// Applies the answer to a call the root sent.
fn answered(shared: &Shared, sent: SentOutgoing, answer: &CalloutAnswer) {
    let waiting =
        |waiter: u64| shared.lease_waiting.try_borrow().is_ok_and(|q| q.values().any(|p| p.waiter() == waiter));
    shared.engine.outgoing_answered(sent, answer, &shared.limiter, &mut shared.counts(), waiting);
}

/// Sends what the outbox holds (and, on the tick, the charges this worker owes).
fn send_outgoing(shared: &Shared, with_charges: bool) {
    for call in shared.engine.take_outgoing(&shared.limiter, with_charges) {
        let sent = shared.engine.dispatch_outgoing(call, &mut HostCallouts, &shared.limiter, &mut shared.counts());
        if let (Some(sent), Ok(mut in_flight)) = (sent, shared.in_flight.try_borrow_mut()) {
            in_flight.insert(sent.token, sent);
        }
    }
}

/// Retries every request of this worker that waits for a lease refill.
fn retry_lease_waiters(shared: &Shared) {
    let ids: Vec<u32> = shared.lease_waiting.try_borrow().map(|q| q.keys().copied().collect()).unwrap_or_default();
    for id in ids {
        let Some(pending) = shared.lease_waiting.try_borrow_mut().ok().and_then(|mut q| q.remove(&id)) else {
            continue;
        };
        let room = room_to_pause(shared);
        let begun = shared.engine.retry(pending, &shared.limiter, room, &mut shared.counts());
        let _ = conclude(shared, id, begun, Via::Root, Place::Kept);
    }
}

/// After a request's callback: wakes the root to send what the request put in the
/// outbox.
fn wake(shared: &Shared) {
    if shared.engine.has_outgoing()
        && let Some(token) = shared.wake
    {
        // If the host refuses, the tick sends it.
        let _ = abi::enqueue(token, b"w");
    }
}

impl RootContext for Root {
    fn on_vm_start(&mut self, _: usize) -> bool {
        true
    }

    fn on_configure(&mut self, _: usize) -> bool {
        if let Some(level) = abi::log_level() {
            log::set_max_level(match level {
                0 => log::LevelFilter::Trace,
                1 => log::LevelFilter::Debug,
                2 => log::LevelFilter::Info,
                3 => log::LevelFilter::Warn,
                _ => log::LevelFilter::Error,
            });
        }
        match self.configure() {
            Ok(shared) => {
                self.state = Some(Rc::new(shared));
                true
            }
            Err(message) => {
                log::error!("sluice: invalid configuration: {message}");
                false
            }
        }
    }

    fn on_tick(&mut self) {
        let Some(shared) = &self.state else { return };
        let now = shared.limiter.clock().now();
        // One at a time, with no borrow held while the host acts.
        while let Some((id, tally)) = shared.paused.try_borrow_mut().ok().and_then(|mut q| q.pop_due(now)) {
            let resumed = abi::set_effective_context(id).and_then(|()| abi::continue_request());
            let mut counts = shared.counts();
            match resumed {
                Ok(()) => shared.engine.release(&tally, &mut counts),
                Err(status) => {
                    log::debug!("sluice: could not resume request {id} (host status {})", status.0);
                    counts.add_plugin(PluginCounter::ResumeFailures, 1);
                    shared.engine.abandon(&tally, &mut counts);
                }
            }
        }
        while let Some((id, pending)) = shared.waiting.try_borrow_mut().ok().and_then(|mut q| q.pop_due(now)) {
            let room = room_to_pause(shared);
            let begun =
                shared.engine.complete(pending, &CalloutAnswer::TimedOut, &shared.limiter, room, &mut shared.counts());
            let _ = conclude(shared, id, begun, Via::Root, Place::New);
        }
        // Requests waiting for a lease refill: each tries again.
        retry_lease_waiters(shared);
        shared.engine.sweep_debts(&shared.limiter);
        // Refills and charges: sent by this root context, so their answers reach it even
        // when the request that asked has ended. Those whose answer can no longer come
        // count as timed out.
        send_outgoing(shared, true);
        let expired: Vec<SentOutgoing> = shared
            .in_flight
            .try_borrow_mut()
            .map(|mut in_flight| {
                let tokens: Vec<u32> = in_flight.iter().filter(|(_, s)| s.deadline <= now).map(|(t, _)| *t).collect();
                tokens.into_iter().filter_map(|t| in_flight.remove(&t)).collect()
            })
            .unwrap_or_default();
        for sent in expired {
            answered(shared, sent, &CalloutAnswer::TimedOut);
        }
    }

    fn on_queue_ready(&mut self, queue: u32) {
        let Some(shared) = &self.state else { return };
        if shared.wake != Some(queue) {
            return;
        }
        // Every wake asks the same thing: send the outbox. Drain them (bounded: the queue
        // only grows by one item per request callback).
        while abi::dequeue(queue).is_some() {}
        send_outgoing(shared, false);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Filter { id: context_id, shared: self.state.clone() }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Where a decision is carried out from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// The request's own `on_http_request_headers`: the returned action continues or
    /// pauses it.
    Headers,
    /// Another callback of the request itself (its callout's answer): it is paused and
    /// is the effective context.
    Own,
    /// The root context (a tick, a refill's answer): the request is paused, and must be
    /// made the effective context first.
    Root,
}

/// Whether a waiting request already had its place in its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// It is new to the queue: the queue's bound applies.
    New,
    /// It was waiting there already (a retry that still waits).
    Kept,
}

/// Carries out whatever the engine answered for request `id`: a wait is queued, or
/// decided at once when it cannot be; a decision is carried out. Every answer ends in
/// one of the two, so none is dropped. Returns the action for `on_http_request_headers`.
fn conclude(shared: &Shared, id: u32, begun: Begun, via: Via, place: Place) -> Action {
    let mut begun = begun;
    loop {
        begun = match begun {
            Begun::Decided(decided) => return deliver(shared, id, decided, via),
            Begun::Waiting(pending) => match hold(shared, id, pending, place) {
                Ok(()) => return Action::Pause,
                Err(pending) => {
                    let room = room_to_pause(shared);
                    if pending.waits_for_lease() {
                        Begun::Decided(shared.engine.overflow(pending, &shared.limiter, room, &mut shared.counts()))
                    } else {
                        // Its queue is borrowed, which cannot happen: time the wait out
                        // rather than hold it nowhere.
                        let answer = CalloutAnswer::TimedOut;
                        shared.engine.complete(pending, &answer, &shared.limiter, room, &mut shared.counts())
                    }
                }
            },
        };
    }
}

/// Carries out a decision for request `id` (see [`Via`]).
fn deliver(shared: &Shared, id: u32, decided: Decided, via: Via) -> Action {
    match via {
        Via::Headers => carry_out(shared, id, decided, Phase::RequestHeaders),
        Via::Own => carry_out(shared, id, decided, Phase::Later),
        Via::Root => {
            if abi::set_effective_context(id).is_err() {
                // The stream is gone: nothing is paused any more.
                let mut counts = shared.counts();
                counts.add_plugin(PluginCounter::ResumeFailures, 1);
                shared.engine.settle(&decided.tally, Disposition::Rejected, &mut counts);
                return Action::Pause;
            }
            carry_out(shared, id, decided, Phase::Later)
        }
    }
}

/// Holds a waiting request in its queue; `Err` with it when it cannot be held (a full
/// lease queue for a request new to it, or a queue already borrowed, which cannot
/// happen).
fn hold(shared: &Shared, id: u32, pending: Box<Pending>, place: Place) -> Result<(), Box<Pending>> {
    if pending.waits_for_lease() {
        let max = shared.engine.max_waiting(&pending);
        let Ok(mut queue) = shared.lease_waiting.try_borrow_mut() else { return Err(pending) };
        if place == Place::New && queue.len() >= max {
            return Err(pending);
        }
        queue.insert(id, pending);
        return Ok(());
    }
    let deadline = pending.deadline();
    match shared.waiting.try_borrow_mut() {
        Ok(mut waiting) => {
            waiting.insert(id, deadline, pending);
            Ok(())
        }
        Err(_) => Err(pending),
    }
}

fn room_to_pause(shared: &Shared) -> bool {
    let max_paused = usize::try_from(shared.engine.shaping().max_paused).unwrap_or(usize::MAX);
    shared.paused.try_borrow().is_ok_and(|paused| paused.len() < max_paused)
}

/// When a decision is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Inside `on_http_request_headers`: the returned action continues or pauses.
    RequestHeaders,
    /// Later (a callout's answer, a tick): the request is paused and must be resumed
    /// or answered by a host call.
    Later,
}

/// Carries out a decision for context `id` (the effective context) and counts what
/// really happened. Returns the action for `on_http_request_headers`.
fn carry_out(shared: &Shared, id: u32, decided: Decided, phase: Phase) -> Action {
    let Decided { outcome, tally } = decided;
    let (action, disposition) = match outcome {
        Outcome::Continue { headers } => {
            keep_headers(shared, id, headers);
            match phase {
                Phase::RequestHeaders => (Action::Continue, Disposition::Allowed),
                Phase::Later => (Action::Pause, resume(shared)),
            }
        }
        Outcome::Delay { due, headers, .. } => {
            keep_headers(shared, id, headers);
            match shared.paused.try_borrow_mut() {
                Ok(mut paused) => {
                    paused.insert(id, due, tally.clone());
                    (Action::Pause, Disposition::Queued)
                }
                // Cannot happen (nothing else holds the queue now); if it did, forwarding
                // now is better than a request held forever.
                Err(_) => match phase {
                    Phase::RequestHeaders => (Action::Continue, Disposition::Allowed),
                    Phase::Later => (Action::Pause, resume(shared)),
                },
            }
        }
        Outcome::Reject(response) => reject(shared, &response, phase),
    };
    shared.engine.settle(&tally, disposition, &mut shared.counts());
    action
}

fn keep_headers(shared: &Shared, id: u32, headers: Vec<(String, String)>) {
    if headers.is_empty() {
        return;
    }
    if let Ok(mut map) = shared.response_headers.try_borrow_mut() {
        map.insert(id, headers);
    }
}

/// Resumes the effective context's request; if the host refuses, resets it.
fn resume(shared: &Shared) -> Disposition {
    match abi::continue_request() {
        Ok(()) => Disposition::Allowed,
        Err(status) => {
            log::warn!("sluice: the host refused to resume a request (status {}); resetting it", status.0);
            shared.counts().add_plugin(PluginCounter::ResumeFailures, 1);
            let _ = abi::close_request();
            Disposition::Rejected
        }
    }
}

/// Sends a rejection; a reply the host refuses is retried bare, then the stream is
/// reset, and only then forwarded (see the module docs).
fn reject(shared: &Shared, response: &LocalResponse, phase: Phase) -> (Action, Disposition) {
    if abi::send_local_response(response.status, &response.headers, response.body.as_bytes()).is_ok() {
        return (Action::Pause, Disposition::Rejected);
    }
    shared.counts().add_plugin(PluginCounter::ReplyFailures, 1);
    if abi::send_local_response(response.status, &[], b"").is_ok() {
        log::warn!("sluice: the host refused the rejection with headers; sent the bare status");
        return (Action::Pause, Disposition::Rejected);
    }
    if abi::close_request().is_ok() {
        log::warn!("sluice: the host refused every local reply; reset the request instead");
        return (Action::Pause, Disposition::Rejected);
    }
    log::error!("sluice: the host refused to reject or reset a request; forwarding it rather than holding it");
    match phase {
        Phase::RequestHeaders => (Action::Continue, Disposition::Allowed),
        Phase::Later => (Action::Pause, resume(shared)),
    }
}

/// Reads the current request through the host.
struct HostRequest;

impl RequestFacts for HostRequest {
    fn header(&self, name: &str) -> Result<Option<Vec<u8>>, HostFailure> {
        abi::header(abi::REQUEST_HEADERS, name).map_err(|s| HostFailure { status: s.0 })
    }

    fn property(&self, path: &[&str]) -> Result<Option<Vec<u8>>, HostFailure> {
        abi::property(path).map_err(|s| HostFailure { status: s.0 })
    }
}

/// Sends callouts through the SDK, so that its dispatcher routes the answer to the
/// calling HTTP context (it knows only tokens it handed out).
///
/// The SDK's `dispatch_http_call` panics on a status other than OK, `BadArgument` and
/// `InternalFailure`; Envoy's `proxy_http_call` answers only those (and
/// `InvalidMemoryAccess` for pointers outside memory, which these are not), so that
/// panic is unreachable in Envoy. Everything else about the answer is read through
/// [`abi`], which cannot panic.
struct HostCallouts;

impl Callouts for HostCallouts {
    fn dispatch(&mut self, call: &Call<'_>) -> Result<u32, DispatchError> {
        let headers: Vec<(&str, &str)> = call.headers.to_vec();
        proxy_wasm::hostcalls::dispatch_http_call(
            call.cluster,
            headers,
            Some(call.body),
            Vec::new(),
            Duration::from_millis(u64::from(call.timeout_ms)),
        )
        .map_err(|status| DispatchError { status: status as u32 })
    }
}

/// Reads the answer to a callout: never the headers of a failed one (reading them then
/// is an error in Envoy, and a panic in the SDK's getters).
fn read_answer(num_headers: usize, body_size: usize) -> CalloutAnswer {
    if num_headers == 0 {
        return CalloutAnswer::Failed;
    }
    let status = abi::header(abi::CALL_RESPONSE_HEADERS, ":status")
        .ok()
        .flatten()
        .and_then(|s| std::str::from_utf8(&s).ok().and_then(|s| s.parse().ok()));
    let Some(status) = status else { return CalloutAnswer::Failed };
    let body = if body_size == 0 {
        Vec::new()
    } else {
        abi::buffer(abi::CALL_RESPONSE_BODY, body_size.min(MAX_ANSWER_BYTES + 1)).unwrap_or_default()
    };
    CalloutAnswer::Response { status, body }
}

struct Filter {
    id: u32,
    shared: Option<Rc<Shared>>,
}

impl Context for Filter {
    fn on_http_call_response(&mut self, _token: u32, num_headers: usize, body_size: usize, _: usize) {
        let Some(shared) = &self.shared else { return };
        // Gone when the tick ended the wait first: the late answer changes nothing.
        let Some(pending) = shared.waiting.try_borrow_mut().ok().and_then(|mut q| q.remove(self.id)) else {
            return;
        };
        let answer = read_answer(num_headers, body_size);
        let room = room_to_pause(shared);
        let begun = shared.engine.complete(pending, &answer, &shared.limiter, room, &mut shared.counts());
        let _ = conclude(shared, self.id, begun, Via::Own, Place::New);
        wake(shared);
    }
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let Some(shared) = &self.shared else { return Action::Continue };
        let room = room_to_pause(shared);
        let begun = shared.engine.begin(&HostRequest, &shared.limiter, &mut HostCallouts, room, &mut shared.counts());
        let action = conclude(shared, self.id, begun, Via::Headers, Place::New);
        wake(shared);
        action
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        let Some(shared) = &self.shared else { return Action::Continue };
        let headers = shared.response_headers.try_borrow_mut().ok().and_then(|mut map| map.remove(&self.id));
        let Some(headers) = headers else { return Action::Continue };
        for (name, value) in &headers {
            let _ = abi::replace_header(abi::RESPONSE_HEADERS, name, value.as_bytes());
        }
        let existing = abi::header(abi::RESPONSE_HEADERS, "cache-control").ok().flatten();
        if let Some(value) = private_cache_control(existing.as_deref()) {
            let _ = abi::replace_header(abi::RESPONSE_HEADERS, "cache-control", value.as_bytes());
        }
        Action::Continue
    }
}

impl Drop for Filter {
    fn drop(&mut self) {
        // A stream that ends while held: forget it, and count it.
        let Some(shared) = &self.shared else { return };
        if let Ok(mut map) = shared.response_headers.try_borrow_mut() {
            map.remove(&self.id);
        }
        let paused = shared.paused.try_borrow_mut().ok().and_then(|mut q| q.remove(self.id));
        if let Some(tally) = paused {
            shared.engine.abandon(&tally, &mut shared.counts());
        }
        let waiting = shared.waiting.try_borrow_mut().ok().and_then(|mut q| q.remove(self.id));
        let lease_waiting = shared.lease_waiting.try_borrow_mut().ok().and_then(|mut q| q.remove(&self.id));
        for pending in waiting.into_iter().chain(lease_waiting) {
            shared.engine.forget(pending, &shared.limiter, &mut shared.counts());
        }
    }
}
