//! The counter service in a simulated fleet (the fleet tests' and sluice-lab's): the real
//! service ([`App::handle_now`], its synchronous entry: every decision route, the
//! authentication and in-flight bounds, parsing, validation, the memory store and the
//! response bodies, byte for byte what its HTTP routes answer) called without a socket,
//! behind a scripted transport that can fail in every way the wire can, for all proxies
//! or for one region.
//!
//! The service decides at the moment a callout is dispatched and its answer travels back
//! for the round trip the scenario gives; every decision is recorded (in virtual time)
//! for the oracles: grants with their life, admitted checks, charges.

use shared_store::{Clock as _, Nanos};
use sluice_counter::App;
use sluice_counter::api::ApiError;
use sluice_counter::config::{AdminAccess, Config, Secret};
use sluice_counter::overrides::Override;
use sluice_counter::store::{CounterStore, MemoryConfig, MemoryCounters};
use sluice_protocol::{
    AppliedOverride, ChargeRequest, ChargeResponse, CheckRequest, CheckResponse, CheckResult, ChecksRequest,
    ChecksResponse, CreditRequest, CreditResponse, LeaseRequest, LeaseResponse, LimitSpec,
};
use sluice_testkit::rng::Rng;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use wasm_host::{Answer, CalloutRequest, Clock as _, VirtualClock};

/// The token the proxies present.
pub const TOKEN: &str = "fleet-token-42";

/// How the service (or the network to it) behaves for a proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// It answers after its usual round trip.
    Healthy,
    /// It answers after this long (beyond the callout deadline, a timeout).
    Slow(Duration),
    /// Nothing listens (a crashed service, a partition that refuses).
    Refused,
    /// It never answers (a partition that drops packets).
    Silent,
    /// It closes the connection without answering.
    Closed,
    /// It sends a response head, then resets.
    ResetMidAnswer,
    /// It answers 500.
    Error500,
    /// Its store is down: 503 `store_unavailable`.
    StoreDown,
    /// It answers 200 with a body that is not an answer.
    Garbage,
    /// The proxies' token is not the one it expects (a rotation gone wrong): 401.
    WrongToken,
    /// It decides and applies the call, but the answer is lost (a charge the proxy must
    /// send again, under the same id).
    AppliedButLost,
    /// It refuses the first check of each batch of checks (`POST /v1/checks`) alone, as
    /// it refuses a check it cannot decide (that check spends nothing), and decides the
    /// others; any other call it decides normally.
    OneCheckRefused,
}

impl Mode {
    /// Whether the service decides normally in this mode.
    pub const fn is_healthy(self) -> bool {
        matches!(self, Self::Healthy)
    }
}

/// What the service decided, in virtual time (the proxies' monotonic clock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A lease of `granted` tokens on counter `key`, spendable for `life`.
    Grant {
        /// The counter.
        key: String,
        /// Tokens granted.
        granted: u64,
        /// When (the proxies' clock).
        at: u64,
        /// How long they may be spent (ns).
        life: u64,
        /// When, on the service's own clock (windows align to it).
        service_at: u64,
        /// The limit and amounts asked, for findings.
        spec: String,
        /// The operator's override that decided it, if one did (a bypass spent nothing).
        overridden: Option<AppliedOverride>,
    },
    /// A check admitted `cost` on counter `key`.
    Check {
        /// The counter.
        key: String,
        /// Units admitted.
        cost: u64,
        /// When (the proxies' clock).
        at: u64,
        /// When, on the service's own clock.
        service_at: u64,
        /// The operator's override that decided this entry, if one did (a bypass spent
        /// nothing).
        overridden: Option<AppliedOverride>,
    },
    /// A charge of `charged` units on counter `key`.
    Charge {
        /// The counter.
        key: String,
        /// Units charged.
        charged: u64,
        /// When (the proxies' clock).
        at: u64,
        /// Its id was applied before.
        duplicate: bool,
        /// Units asked for (`cost`).
        cost: u64,
        /// Units forgiven, as the answer says.
        forgiven: u64,
        /// The debt bound the proxy asked for.
        max_debt: u64,
        /// The limit the proxy sent.
        limit: LimitSpec,
        /// When, on the service's own clock.
        service_at: u64,
        /// The answer's `entry.limit`, `entry.remaining` and `entry.reset_after_ns`: the
        /// counter after the charge.
        after: (u64, u64, u64),
        /// The operator's override that decided it, if one did.
        overridden: Option<AppliedOverride>,
    },
    /// A credit gave `credited` units back on counter `key`, spent at `spent_at`.
    Credit {
        /// The counter.
        key: String,
        /// Units given back (0 when there was nothing to give them back to).
        credited: u64,
        /// When they were spent, on the service's clock.
        spent_at: u64,
        /// When, on the service's own clock.
        service_at: u64,
        /// Its id was applied before.
        duplicate: bool,
        /// The operator's override that decided it, if one did.
        overridden: Option<AppliedOverride>,
    },
    /// Carrying counters over to other numbers forgave `units` of their debt (the answer's
    /// `carry_forgiven`, for the call on `keys`, admitted or not).
    CarryForgiven {
        /// The counters of the call (one for a lease, charge or credit).
        keys: Vec<String>,
        /// Units forgiven.
        units: u64,
        /// When, on the service's own clock.
        service_at: u64,
    },
    /// The service restarted: every counter is fresh from here.
    Restart {
        /// When (the proxies' clock).
        at: u64,
    },
}

/// The service's clock: the fleet's virtual wall clock, plus a step (a clock fault).
#[derive(Debug)]
pub struct ServiceClock {
    clock: VirtualClock,
    step_ns: AtomicI64,
}

impl shared_store::Clock for ServiceClock {
    fn now(&self) -> Nanos {
        let real = self.clock.realtime_nanos();
        Nanos(real.saturating_add_signed(self.step_ns.load(Ordering::SeqCst)))
    }
}

/// The simulated service.
pub struct Service {
    /// The service over its state (rebuilt when it restarts).
    app: Arc<App>,
    config: Config,
    clock: Arc<ServiceClock>,
    fleet_clock: VirtualClock,
    modes: Vec<Mode>,
    rtt: Duration,
    rng: Rng,
    decisions: Vec<Decision>,
    /// Whether decisions are recorded (the oracles need them; a long lab run does not).
    keep_decisions: bool,
    calls: u64,
    /// Prints every call (`SLUICE_FLEET_TRACE`).
    verbose: bool,
    /// What the admin API is served with ([`Service::with_admin`]); kept across restarts.
    admin: Option<AdminAccess>,
    /// Units the service counted as forgiven in its metrics, before its last restart:
    /// charges' and carry-overs'.
    forgiven_before: (u64, u64),
    /// A deliberately wrong service, for the tests that show an oracle catches one.
    tamper: Tamper,
}

/// A deliberately wrong service (tests only): how it misbehaves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tamper {
    /// It does not: the real service.
    #[default]
    None,
    /// Every charge is decided with a debt bound of 0 instead of the one asked for, so the
    /// service forgives what the proxy asked it to owe (the decisions record the bound
    /// asked for).
    ForgiveDebt,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("modes", &self.modes).field("calls", &self.calls).finish()
    }
}

fn app(config: &Config, clock: &Arc<ServiceClock>, admin: Option<&AdminAccess>) -> Arc<App> {
    let store = MemoryCounters::with_clock(
        MemoryConfig { shards: 4, max_keys: 100_000, ..MemoryConfig::default() },
        clock.clone() as Arc<dyn shared_store::Clock + Send + Sync>,
    );
    // The token is valid: this cannot fail.
    let auth = config.auth().unwrap_or_else(|e| panic!("the simulation's token is refused: {e}"));
    let app = App::new(CounterStore::Memory(store), config, auth);
    Arc::new(match admin {
        Some(access) => app.with_admin(access.clone()),
        None => app,
    })
}

/// Runs `future` to its end at once: the service's admin functions are async, but on
/// the memory store nothing in them ever waits.
///
/// # Panics
/// When the future is not ready on its first poll (it would wait for something the
/// simulation never drives).
fn at_once<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("an admin call of the simulated service waited on the memory store"),
    }
}

impl Service {
    /// A healthy service for `proxies` proxies on the fleet's clock, answering after `rtt`.
    pub fn new(clock: &VirtualClock, proxies: usize, rtt: Duration, rng: Rng) -> Self {
        Self::with_token(clock, proxies, rtt, rng, TOKEN)
    }

    /// The same, expecting `token` from the proxies (the one their configuration gives).
    pub fn with_token(clock: &VirtualClock, proxies: usize, rtt: Duration, rng: Rng, token: &str) -> Self {
        let config = Config { token: Some(Secret::from(token.to_owned())), ..Config::defaults() };
        let clock_ = Arc::new(ServiceClock { clock: clock.clone(), step_ns: AtomicI64::new(0) });
        Self {
            app: app(&config, &clock_, None),
            config,
            clock: clock_,
            fleet_clock: clock.clone(),
            modes: vec![Mode::Healthy; proxies],
            rtt,
            rng,
            decisions: Vec::new(),
            keep_decisions: true,
            calls: 0,
            verbose: std::env::var_os("SLUICE_FLEET_TRACE").is_some(),
            admin: None,
            forgiven_before: (0, 0),
            tamper: Tamper::None,
        }
    }

    /// The same service with its admin functions ([`Service::set_override`], …), keyed
    /// overrides hashed with the filters' global hash key derived from `hash_key` (their
    /// `hash_key_env`'s value). Its admin routes stay closed: the operator calls it here.
    #[must_use]
    pub fn with_admin(mut self, hash_key: &str) -> Self {
        let access = AdminAccess { token: None, hash_key: Some(shared_store::HashKey::global(hash_key.as_bytes())) };
        self.app = app(&self.config, &self.clock, Some(&access));
        self.admin = Some(access);
        self
    }

    /// Makes the service deliberately wrong (tests that show an oracle catches it).
    pub fn tamper(&mut self, tamper: Tamper) {
        self.tamper = tamper;
    }

    /// The service's clock now (ns), as its decisions are recorded (`service_at`).
    pub fn service_now(&self) -> u64 {
        self.clock.now().0
    }

    /// An operator sets an override (`POST /admin/v1/overrides` with `body`).
    ///
    /// # Errors
    /// The service's refusal.
    pub fn set_override(&self, body: &[u8]) -> Result<Override, ApiError> {
        at_once(self.app.set_override(body))
    }

    /// An operator removes override `id` (`DELETE /admin/v1/overrides/{id}`).
    ///
    /// # Errors
    /// The service's refusal (`404` for an override no longer live).
    pub fn remove_override(&self, id: &str) -> Result<Override, ApiError> {
        at_once(self.app.remove_override(id, br#"{"operator": "fleet", "reason": "the scenario says so"}"#))
    }

    /// What the service's sweeper does every `--sweep-interval-ms`: drops the memory
    /// store's idle keys and expired ids, claims expired overrides, reads the live ones
    /// again. Returns the keys dropped.
    pub fn sweep(&self) -> usize {
        let dropped = match self.app.store() {
            CounterStore::Memory(memory) => memory.sweep(None),
            _ => 0,
        };
        let _ = at_once(self.app.expire_overrides());
        at_once(self.app.refresh_overrides());
        dropped
    }

    /// Units the service counted as forgiven by charges
    /// (`sluice_counter_forgiven_tokens_total`) since it started, across restarts.
    pub fn forgiven(&self) -> u64 {
        self.forgiven_before.0 + metric(&self.app, "sluice_counter_forgiven_tokens_total")
    }

    /// Units of debt the service counted as forgiven by carrying counters over to other
    /// numbers (`sluice_counter_carry_forgiven_tokens_total`) since it started, across
    /// restarts.
    pub fn carry_forgiven(&self) -> u64 {
        self.forgiven_before.1 + metric(&self.app, "sluice_counter_carry_forgiven_tokens_total")
    }

    /// Stops (or resumes) recording decisions: a long run keeps no history.
    pub fn keep_decisions(&mut self, keep: bool) {
        self.keep_decisions = keep;
    }

    /// Sets how the service behaves for `proxy` (every proxy when `None`).
    pub fn set_mode(&mut self, proxy: Option<usize>, mode: Mode) {
        match proxy {
            Some(p) => {
                if let Some(m) = self.modes.get_mut(p) {
                    *m = mode;
                }
            }
            None => self.modes.iter_mut().for_each(|m| *m = mode),
        }
    }

    /// How the service behaves for `proxy`.
    pub fn mode(&self, proxy: usize) -> Mode {
        self.modes.get(proxy).copied().unwrap_or(Mode::Healthy)
    }

    /// The shortest time after its dispatch at which a call from `proxy` can be answered
    /// (or fail on the wire) in the mode in force; `None` if it is never answered.
    pub fn shortest_answer(&self, proxy: usize) -> Option<Duration> {
        match self.mode(proxy) {
            Mode::Slow(after) => Some(after),
            Mode::Refused | Mode::Closed => Some(self.rtt / 2),
            Mode::Silent | Mode::AppliedButLost => None,
            Mode::Healthy
            | Mode::ResetMidAnswer
            | Mode::Error500
            | Mode::StoreDown
            | Mode::Garbage
            | Mode::WrongToken
            | Mode::OneCheckRefused => Some(self.rtt),
        }
    }

    /// Restarts the service with nothing kept (its memory store lost every counter).
    pub fn restart(&mut self) {
        self.forgiven_before = (self.forgiven(), self.carry_forgiven());
        self.app = app(&self.config, &self.clock, self.admin.as_ref());
        let at = self.fleet_clock.monotonic_nanos();
        self.decisions.push(Decision::Restart { at });
    }

    /// Steps the service's wall clock by `by_ns` (negative: backwards).
    pub fn step_clock(&self, by_ns: i64) {
        let _ = self.clock.step_ns.fetch_add(by_ns, Ordering::SeqCst);
    }

    /// Every decision so far.
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
    }

    /// Calls answered (whatever the answer).
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// The answer to one callout from `proxy`.
    pub fn answer(&mut self, proxy: usize, call: &CalloutRequest) -> Answer {
        self.calls += 1;
        let path = call.headers.get_str(":path").unwrap_or("").to_owned();
        let jitter = Duration::from_micros(self.rng.below(self.rtt.as_micros() as u64 / 2 + 1));
        let rtt = self.rtt + jitter;
        let authorization = call.headers.get("authorization").map(<[u8]>::to_vec);
        if self.verbose {
            // The fleet's time, so that a trace tells when each call went out.
            eprintln!(
                "    service: {:.3} ms proxy {proxy} worker {} {path} ({:?}) {}",
                self.fleet_clock.monotonic_nanos() as f64 / 1e6,
                call.worker,
                self.mode(proxy),
                String::from_utf8_lossy(&call.body)
            );
        }
        match self.mode(proxy) {
            Mode::Healthy => self.decide(&path, authorization.as_deref(), &call.body, rtt),
            Mode::Slow(after) => self.decide(&path, authorization.as_deref(), &call.body, after),
            Mode::AppliedButLost => {
                let _ = self.decide(&path, authorization.as_deref(), &call.body, rtt);
                Answer::never()
            }
            Mode::WrongToken => self.decide(&path, Some(b"Bearer not-the-token"), &call.body, rtt),
            Mode::Refused => Answer::refused().after(rtt / 2),
            Mode::Silent => Answer::never(),
            Mode::Closed => Answer::closed().after(rtt / 2),
            Mode::ResetMidAnswer => {
                Answer::status(200).header("content-length", "100").body("{\"granted\"").then_reset().after(rtt)
            }
            Mode::Error500 => Answer::status(500).body("internal error").after(rtt),
            Mode::StoreDown => Answer::status(503)
                .header("content-type", "application/json")
                .body(r#"{"error":{"code":"store_unavailable","message":"the redis store is unreachable"}}"#)
                .after(rtt),
            Mode::Garbage => Answer::status(200).body("<html>not an answer</html>").after(rtt),
            Mode::OneCheckRefused => {
                let body = Self::spoil_first_check(&path, &call.body);
                self.decide(&path, authorization.as_deref(), body.as_deref().unwrap_or(&call.body), rtt)
            }
        }
    }

    /// A batch of checks whose first check has a tag the service refuses (`None`: not a
    /// batch).
    fn spoil_first_check(path: &str, body: &[u8]) -> Option<Vec<u8>> {
        if path != "/v1/checks" {
            return None;
        }
        let mut batch = serde_json::from_slice::<ChecksRequest>(body).ok()?;
        batch.checks.first_mut()?.tag = Some("{refused}".to_owned());
        serde_json::to_vec(&batch).ok()
    }

    /// Runs the real decision code and records what it decided.
    fn decide(&mut self, path: &str, authorization: Option<&[u8]>, body: &[u8], after: Duration) -> Answer {
        let (status, answer) = self.call(path, authorization, body);
        if self.verbose {
            eprintln!("    service answers {status} {}", String::from_utf8_lossy(&answer));
        }
        let at = self.fleet_clock.monotonic_nanos();
        if status == 200 && self.keep_decisions {
            let service_at = self.clock.now().0;
            self.record(path, body, &answer, at, service_at);
        }
        Answer::status(status).header("content-type", "application/json").body(answer).after(after)
    }

    /// One request through the service, as its HTTP server would hand it over.
    fn call(&self, path: &str, authorization: Option<&[u8]>, body: &[u8]) -> (u16, Vec<u8>) {
        if self.tamper == Tamper::ForgiveDebt
            && path == "/v1/charge"
            && let Ok(mut charge) = serde_json::from_slice::<ChargeRequest>(body)
        {
            charge.max_debt = 0;
            let body = serde_json::to_vec(&charge).unwrap_or_default();
            return self.app.handle_now("POST", path, authorization, &body);
        }
        self.app.handle_now("POST", path, authorization, body)
    }

    /// The spends of a check the service admitted.
    fn record_check(&mut self, request: CheckRequest, answer: &CheckResponse, at: u64, service_at: u64) {
        if !answer.admitted {
            return;
        }
        for (i, entry) in request.entries.into_iter().enumerate() {
            let overridden = answer.overrides.iter().find(|o| o.entry == i).map(|o| o.applied());
            self.decisions.push(Decision::Check { key: entry.key, cost: entry.cost, at, service_at, overridden });
        }
    }

    fn record(&mut self, path: &str, request: &[u8], answer: &[u8], at: u64, service_at: u64) {
        let carried = serde_json::from_slice::<serde_json::Value>(answer)
            .ok()
            .and_then(|a| a.get("carry_forgiven").and_then(serde_json::Value::as_u64))
            .filter(|units| *units > 0);
        if let Some(units) = carried {
            let keys = match serde_json::from_slice::<serde_json::Value>(request) {
                Ok(request) => match request.get("entries").and_then(serde_json::Value::as_array) {
                    Some(entries) => entries
                        .iter()
                        .filter_map(|e| e.get("key").and_then(serde_json::Value::as_str).map(str::to_owned))
                        .collect(),
                    None => {
                        request.get("key").and_then(serde_json::Value::as_str).map(str::to_owned).into_iter().collect()
                    }
                },
                Err(_) => Vec::new(),
            };
            self.decisions.push(Decision::CarryForgiven { keys, units, service_at });
        }
        match path {
            "/v1/lease" => {
                if let (Ok(request), Ok(answer)) =
                    (serde_json::from_slice::<LeaseRequest>(request), serde_json::from_slice::<LeaseResponse>(answer))
                    && answer.granted > 0
                {
                    self.decisions.push(Decision::Grant {
                        key: request.key,
                        granted: answer.granted,
                        at,
                        life: answer.expires_in_ms.saturating_mul(1_000_000),
                        service_at,
                        spec: format!("{:?} asked {} min {}", request.limit, request.tokens, request.min_tokens),
                        overridden: answer.applied,
                    });
                }
            }
            "/v1/check" => {
                if let (Ok(request), Ok(answer)) =
                    (serde_json::from_slice::<CheckRequest>(request), serde_json::from_slice::<CheckResponse>(answer))
                {
                    self.record_check(request, &answer, at, service_at);
                }
            }
            "/v1/checks" => {
                // Each check of a batch as if it had come alone.
                if let (Ok(request), Ok(answer)) =
                    (serde_json::from_slice::<ChecksRequest>(request), serde_json::from_slice::<ChecksResponse>(answer))
                {
                    for (check, result) in request.checks.into_iter().zip(answer.results) {
                        if let CheckResult::Answered(answer) = result {
                            self.record_check(check, &answer, at, service_at);
                        }
                    }
                }
            }
            "/v1/charge" => {
                if let (Ok(request), Ok(answer)) =
                    (serde_json::from_slice::<ChargeRequest>(request), serde_json::from_slice::<ChargeResponse>(answer))
                {
                    self.decisions.push(Decision::Charge {
                        key: request.key,
                        charged: answer.charged,
                        at,
                        duplicate: answer.duplicate,
                        cost: request.cost,
                        forgiven: answer.forgiven,
                        max_debt: request.max_debt,
                        limit: request.limit,
                        service_at,
                        after: (answer.entry.limit, answer.entry.remaining, answer.entry.reset_after_ns),
                        overridden: answer.applied,
                    });
                }
            }
            "/v1/credit" => {
                if let (Ok(request), Ok(answer)) =
                    (serde_json::from_slice::<CreditRequest>(request), serde_json::from_slice::<CreditResponse>(answer))
                {
                    self.decisions.push(Decision::Credit {
                        key: request.key,
                        credited: answer.credited,
                        spent_at: request.spent_at_ns,
                        service_at,
                        duplicate: answer.duplicate,
                        overridden: answer.applied,
                    });
                }
            }
            _ => {}
        }
    }
}

/// The value of the counter `name` in `app`'s metrics (0 when absent).
fn metric(app: &App, name: &str) -> u64 {
    app.metrics()
        .render(app.store())
        .lines()
        .filter(|line| line.strip_prefix(name).is_some_and(|rest| rest.starts_with([' ', '{'])))
        .filter_map(|line| line.split_whitespace().last()?.parse::<f64>().ok())
        .map(|value| value as u64)
        .sum()
}
