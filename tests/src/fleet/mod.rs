//! A deterministic simulation of a fleet: several proxies running the real `sluice.wasm`
//! in wasm-host (several workers each, one virtual clock), the counter service's real
//! decision code behind a scripted transport ([`service`]), a seeded scheduler that
//! interleaves requests, ticks, callouts and answers, and injects faults, and oracles
//! checked after every step ([`oracle`]).
//!
//! # One run
//!
//! A seed makes a [`Scenario`]: the fleet's shape, a random filter configuration from
//! the real schema, traffic, and a timeline of faults and events. The run moves the
//! virtual clock from one event to the next (an arrival, a fault starting or ending, a
//! reload, an upstream's answer, anything due on a worker: ticks, callout answers and
//! timeouts, queue wakes). At each instant the workers of a proxy that have something to
//! do run either one after another in a random order, or at once on threads of their
//! own, interleaved at every shared-data call ([`interleave`]): the races Envoy's worker
//! threads have. After each instant the oracles check the fleet. At the end the service
//! is healthy and quiet for a while, and the oracles check what must have settled.
//!
//! # What a scenario covers
//!
//! Every algorithm each mode allows, from the one list (`shared_store::Algorithm::ALL`):
//! local policies all of them (shaping and concurrency too), check mode the ones the
//! service decides, lease mode the leasable ones; costs the responses report (a header,
//! a JSON body, an event stream's last event; above and below the estimates, or not at
//! all); rolling updates that leave proxies on old and new numbers for a while, with and
//! without a version bump, over counters in debt; operators' clamps and bypasses
//! (policy-wide and for one caller; set, removed and expiring mid-run), set through the
//! service's admin functions; and the service's sweeper.
//!
//! # Replay
//!
//! Everything comes from the seed; a failure names it:
//!
//! ```text
//! SLUICE_FLEET_SEED=<seed> cargo test -p sluice-tests --test fleet replay -- --ignored --exact --nocapture
//! ```
//!
//! runs that seed alone and prints its trace's end (`SLUICE_FLEET_TRACE=1`: all of it;
//! `SLUICE_FLEET_MAX_PAUSE_MS` raises the pause bound, to see whether a request that waited
//! too long is ever answered; `SLUICE_FLEET_CONTENDED=lease` or `local` replays a
//! contended scenario, as its failure says). `SLUICE_FLEET_SEEDS` and
//! `SLUICE_FLEET_STEPS` make the CI run longer (see `tests/tests/fleet.rs`), and
//! `SLUICE_WASM_UNDER_TEST` runs another build of the filter (an older one, a mutant).
//! [`run_variant`] runs a deliberately wrong fleet ([`Variant`]), to show an oracle
//! catches it.

pub mod interleave;
pub mod oracle;
pub mod scenario;
pub use sluice_lab::service;
mod timeline;
mod traffic;

pub use scenario::Scenario;

use interleave::Baton;
use oracle::{Observed, Oracle, Violation};
use scenario::{PolicyDef, Shape};
use service::Service;
use sluice_testkit::rng::Rng;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use traffic::Arrivals;
use wasm_host::{Clock as _, Host, Outcome, StreamId, VirtualClock};

/// The operator's hash key every proxy is given.
pub const HASH_KEY: &str = "fleet-hash-key-0123456789abcdef";

/// What a run did, for the report of a clean run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Instants the clock stopped at.
    pub steps: u64,
    /// Requests sent.
    pub requests: u64,
    /// Of those, admitted (forwarded upstream).
    pub admitted: u64,
    /// Callouts the service answered.
    pub callouts: u64,
    /// Turns handed between interleaved workers.
    pub switches: u64,
}

/// A deliberately wrong run, for the tests that show an oracle catches it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Variant {
    /// The real thing.
    #[default]
    Real,
    /// The proxies run numbers four times the scenario's (the oracles hold them to the
    /// scenario's): every counter may admit more than its bound.
    LooserFilter,
    /// The operator's clamps never reach the service (the oracles believe they did).
    ClampsNotSet,
    /// The service forgives the debt a charge asks it to keep ([`service::Tamper`]).
    ForgiveDebt,
}

impl Variant {
    /// What the proxies are configured with when the scenario says `policies`.
    fn configured(self, policies: &[PolicyDef]) -> Vec<PolicyDef> {
        match self {
            Self::LooserFilter => policies.iter().map(PolicyDef::looser).collect(),
            _ => policies.to_vec(),
        }
    }
}

/// How a run failed: the seed, when, and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The seed (replay it with `SLUICE_FLEET_SEED`).
    pub seed: u64,
    /// The scenario's shape (`SLUICE_FLEET_CONTENDED` replays a contended one).
    pub shape: Shape,
    /// The step at which an oracle failed.
    pub step: u64,
    /// The oracle's finding.
    pub violation: Violation,
    /// The last lines of the run's trace.
    pub trace: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {} failed at step {}: {}", self.seed, self.step, self.violation)?;
        writeln!(
            f,
            "replay: SLUICE_FLEET_SEED={}{} cargo test -p sluice-tests --test fleet replay -- --ignored --exact \
             --nocapture",
            self.seed,
            self.shape.env().map(|s| format!(" SLUICE_FLEET_CONTENDED={s}")).unwrap_or_default()
        )?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// A request of the simulation, and what became of it.
#[derive(Clone, Debug)]
struct Stream {
    proxy: usize,
    worker: usize,
    id: StreamId,
    arrived: u64,
    request: oracle::Sent,
    /// When the upstream answers it (once forwarded).
    respond_at: Option<u64>,
}

/// One proxy: a host and the configuration it runs now.
struct Proxy {
    host: Host,
    policies: Vec<PolicyDef>,
    baton: Arc<Baton>,
}

/// What a worker is to do at an instant.
#[derive(Clone, Debug)]
enum Action {
    /// A request arrives.
    Arrive(oracle::Sent),
    /// The upstream answers a forwarded request; then the stream ends.
    Respond(usize),
    /// The client gives up on a paused request.
    Leave(usize),
    /// Whatever is due (ticks, answers, timeouts, queue wakes).
    Due,
}

/// Runs `scenario` with the filter at `wasm` for at most `max_steps` instants.
///
/// # Errors
/// The first oracle that fails, with the seed and the trace's tail.
pub fn run(scenario: &Scenario, wasm: &str, max_steps: u64) -> Result<Report, Box<Failure>> {
    Fleet::new(scenario, wasm, Variant::Real).run(max_steps)
}

/// Runs `scenario` as [`run`] does, deliberately wrong in the way `variant` says.
///
/// # Errors
/// The first oracle that fails, with the seed and the trace's tail.
pub fn run_variant(scenario: &Scenario, wasm: &str, max_steps: u64, variant: Variant) -> Result<Report, Box<Failure>> {
    Fleet::new(scenario, wasm, variant).run(max_steps)
}

struct Fleet<'a> {
    scenario: &'a Scenario,
    clock: VirtualClock,
    start: u64,
    proxies: Vec<Proxy>,
    service: Arc<Mutex<Service>>,
    streams: BTreeMap<u64, Stream>,
    next_stream: u64,
    rng: Rng,
    arrivals: Arrivals,
    oracle: Oracle,
    trace: Vec<String>,
    /// Prints every line of the trace as it happens (`SLUICE_FLEET_TRACE`).
    verbose: bool,
    report: Report,
    step: u64,
    variant: Variant,
    /// The scenario's changes still to come, by time.
    pending: BTreeMap<u64, Vec<timeline::Change>>,
    /// The ids of the overrides the service took, by the scenario's event.
    override_ids: BTreeMap<usize, String>,
}

impl<'a> Fleet<'a> {
    fn new(scenario: &'a Scenario, wasm: &str, variant: Variant) -> Self {
        let mut rng = Rng::new(scenario.seed ^ 0x00f1_ee70_0000_0000);
        let clock = VirtualClock::new();
        let mut service = Service::new(&clock, scenario.proxies, scenario.rtt, rng.fork()).with_admin(HASH_KEY);
        if variant == Variant::ForgiveDebt {
            service.tamper(service::Tamper::ForgiveDebt);
        }
        let service = Arc::new(Mutex::new(service));
        let config = scenario.filter_config(&variant.configured(&scenario.policies));
        let start = clock.monotonic_nanos();
        let oracle = Oracle::new(scenario, start, clock.realtime_nanos() - start);
        let probes = oracle.probes();
        let proxies = (0..scenario.proxies)
            .map(|p| {
                let baton = Baton::new(rng.fork());
                let hook = baton.clone();
                let service = service.clone();
                let (probes, clock_) = (probes.clone(), clock.clone());
                let host = Host::builder(wasm)
                    .plugin_configuration(config.clone())
                    .plugin_name("sluice")
                    .root_id("sluice")
                    .vm_id("sluice")
                    .workers(scenario.workers)
                    .virtual_clock(clock.clone())
                    .env("SLUICE_HASH_KEY", HASH_KEY)
                    .env("SLUICE_COUNTER_TOKEN", service::TOKEN)
                    .random_seed(Some(scenario.seed.wrapping_add(p as u64)))
                    .capture_logs(false)
                    .record_callouts(false)
                    .scripted_cluster("sluice-counter", move |call| {
                        let mut service = service.lock().unwrap_or_else(PoisonError::into_inner);
                        if service.mode(p).is_healthy()
                            && let Some(probe) = probes.lock().unwrap_or_else(PoisonError::into_inner).get_mut(p)
                        {
                            probe.get_or_insert(clock_.monotonic_nanos());
                        }
                        service.answer(p, call)
                    })
                    .before_shared_data(Arc::new(move |worker| hook.before_access(worker)))
                    .build()
                    .unwrap_or_else(|e| panic!("seed {}: the filter refused {config}: {e}", scenario.seed));
                Proxy { host, policies: scenario.policies.clone(), baton }
            })
            .collect();
        // Usage comes from a generator of its own: the arrivals stay those the seed made
        // before responses reported costs.
        let usage = Rng::new(scenario.seed ^ 0x05a9_e000);
        let arrivals = Arrivals { rng: rng.fork(), usage, next: start, unrounded: start, flood_serial: 0 };
        Self {
            scenario,
            clock,
            start,
            proxies,
            service,
            streams: BTreeMap::new(),
            next_stream: 0,
            rng,
            arrivals,
            oracle,
            trace: Vec::new(),
            verbose: std::env::var_os("SLUICE_FLEET_TRACE").is_some(),
            report: Report::default(),
            step: 0,
            variant,
            pending: BTreeMap::new(),
            override_ids: BTreeMap::new(),
        }
    }

    fn now(&self) -> u64 {
        self.clock.monotonic_nanos()
    }

    fn at(&self, offset: Duration) -> u64 {
        self.start + offset.as_nanos() as u64
    }

    fn note(&mut self, line: String) {
        if self.trace.len() >= 4000 {
            self.trace.drain(..2000);
        }
        let line = format!("{:>9.3} ms  {line}", (self.now() - self.start) as f64 / 1e6);
        if self.verbose {
            eprintln!("{line}");
        }
        self.trace.push(line);
    }

    fn fail(&self, violation: Violation) -> Box<Failure> {
        if self.verbose {
            // What each proxy counted, for whoever reads the whole trace.
            for (p, proxy) in self.proxies.iter().enumerate() {
                for (name, value) in proxy.host.metrics() {
                    if let wasm_host::MetricValue::Counter(v) | wasm_host::MetricValue::Gauge(v) = value
                        && v > 0
                    {
                        eprintln!("proxy {p} metric {name} = {v}");
                    }
                }
            }
        }
        let tail = self.trace.len().saturating_sub(40);
        Box::new(Failure {
            seed: self.scenario.seed,
            shape: self.scenario.shape,
            step: self.step,
            violation,
            trace: self.trace.get(tail..).unwrap_or_default().to_vec(),
        })
    }

    fn run(mut self, max_steps: u64) -> Result<Report, Box<Failure>> {
        let end = self.at(self.scenario.duration);
        self.pending = self.boundaries();
        while self.step < max_steps {
            let next = [
                Some(self.arrivals.next),
                self.pending.keys().next().copied(),
                self.streams.values().filter_map(|s| s.respond_at).min(),
                self.next_due(),
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(t) = next.filter(|t| *t <= end) else { break };
            self.clock.advance_to_monotonic(t);
            self.apply_due(t)?;
            let mut actions: BTreeMap<(usize, usize), Vec<Action>> = BTreeMap::new();
            while self.arrivals.next <= t {
                let (proxy, worker, sent) = self.arrivals.draw(self.scenario, Duration::from_nanos(t - self.start), t);
                actions.entry((proxy, worker)).or_default().push(Action::Arrive(sent));
            }
            for (key, stream) in &mut self.streams {
                if stream.respond_at.is_some_and(|at| at <= t) {
                    stream.respond_at = Some(u64::MAX);
                    actions.entry((stream.proxy, stream.worker)).or_default().push(Action::Respond(*key as usize));
                }
            }
            for (p, proxy) in self.proxies.iter_mut().enumerate() {
                for (w, worker) in proxy.host.workers_mut().iter().enumerate() {
                    if worker.next_due().is_some_and(|at| at <= t) {
                        actions.entry((p, w)).or_default().push(Action::Due);
                    }
                }
            }
            self.act(actions)?;
            self.step += 1;
            self.report.steps = self.step;
            self.check()?;
        }
        self.quiet_end()?;
        self.report.callouts = self.service.lock().unwrap_or_else(PoisonError::into_inner).calls();
        self.report.switches = self.proxies.iter().map(|p| p.baton.switches()).sum();
        Ok(self.report)
    }

    /// Applies the scenario's changes due by `t`.
    fn apply_due(&mut self, t: u64) -> Result<(), Box<Failure>> {
        while let Some(entry) = self.pending.first_entry().filter(|e| *e.key() <= t) {
            for change in entry.remove() {
                self.apply(change)?;
            }
        }
        Ok(())
    }

    fn next_due(&mut self) -> Option<u64> {
        self.proxies.iter_mut().flat_map(|p| p.host.workers_mut().iter().filter_map(|w| w.next_due())).min()
    }

    /// Carries out one instant's actions, proxy by proxy.
    fn act(&mut self, actions: BTreeMap<(usize, usize), Vec<Action>>) -> Result<(), Box<Failure>> {
        let mut by_proxy: BTreeMap<usize, Vec<(usize, Vec<Action>)>> = BTreeMap::new();
        for ((p, w), list) in actions {
            by_proxy.entry(p).or_default().push((w, list));
        }
        for (p, mut per_worker) in by_proxy {
            let interleaved = per_worker.len() > 1 && self.rng.chance(50);
            if !interleaved {
                // One after another, in a random order.
                for i in (1..per_worker.len()).rev() {
                    let j = self.rng.below(i as u64 + 1) as usize;
                    per_worker.swap(i, j);
                }
            }
            let created = Mutex::new(Vec::new());
            let streams = &self.streams;
            let now = self.clock.monotonic_nanos();
            let Some(proxy) = self.proxies.get_mut(p) else { continue };
            let run = |worker: &mut wasm_host::Worker, w: usize, list: Vec<Action>| {
                for action in list {
                    match action {
                        Action::Arrive(sent) => {
                            let id = worker.request(sent.request());
                            created.lock().unwrap_or_else(PoisonError::into_inner).push((w, id, sent));
                        }
                        Action::Respond(key) => {
                            if let Some(s) = streams.get(&(key as u64)) {
                                let _ = worker.respond(s.id, s.request.response());
                            }
                        }
                        Action::Leave(key) => {
                            if let Some(s) = streams.get(&(key as u64)) {
                                let _ = worker.finish(s.id);
                            }
                        }
                        Action::Due => worker.run_pending(),
                    }
                }
            };
            if interleaved {
                let mut slots: Vec<Option<&mut wasm_host::Worker>> =
                    proxy.host.workers_mut().iter_mut().map(Some).collect();
                let batch: Vec<(usize, (&mut wasm_host::Worker, Vec<Action>))> = per_worker
                    .into_iter()
                    .filter_map(|(w, list)| slots.get_mut(w).and_then(Option::take).map(|worker| (w, (worker, list))))
                    .collect();
                proxy.baton.run(batch, |w, (worker, list)| run(worker, w, list));
            } else {
                for (w, list) in per_worker {
                    if let Some(worker) = proxy.host.workers_mut().get_mut(w) {
                        run(worker, w, list);
                    }
                }
            }
            let mut created = created.into_inner().unwrap_or_else(PoisonError::into_inner);
            created.sort_by_key(|(w, id, _)| (*w, format!("{id:?}")));
            for (w, id, sent) in created {
                self.report.requests += 1;
                let key = self.next_stream;
                self.next_stream += 1;
                self.streams
                    .insert(key, Stream { proxy: p, worker: w, id, arrived: now, request: sent, respond_at: None });
            }
            self.observe(p)?;
        }
        Ok(())
    }

    /// Reads what became of proxy `p`'s streams, and hands each to the oracle.
    fn observe(&mut self, p: usize) -> Result<(), Box<Failure>> {
        let now = self.now();
        let keys: Vec<u64> = self.streams.iter().filter(|(_, s)| s.proxy == p).map(|(k, _)| *k).collect();
        let mut done = Vec::new();
        let mut forwarded = Vec::new();
        for key in keys {
            let Some(stream) = self.streams.get(&key) else { continue };
            let Some(proxy) = self.proxies.get_mut(p) else { continue };
            let Some(worker) = proxy.host.workers_mut().get_mut(stream.worker) else { continue };
            let observed = match worker.outcome(stream.id) {
                Err(_) => Observed::Gone,
                Ok(Outcome::Paused | Outcome::ResponsePaused) => Observed::Paused,
                Ok(Outcome::Forwarded(_)) => Observed::Forwarded,
                Ok(Outcome::Responded(response)) => Observed::Answered {
                    status: response.status,
                    local: response.is_local(),
                    fallback: response.headers.get_str("x-sluice-fallback").map(str::to_owned),
                    overridden: response.headers.get_str("x-sluice-override").map(str::to_owned),
                },
                Ok(Outcome::Reset) => Observed::Reset,
            };
            let policies = &proxy.policies;
            match self.oracle.stream(p, key, stream.arrived, &stream.request, policies, &observed, now) {
                Err(violation) => return Err(self.fail(violation)),
                Ok(oracle::Next::Keep) => {}
                Ok(oracle::Next::Upstream) => forwarded.push(key),
                Ok(oracle::Next::Done) => done.push((key, self.oracle.take_note())),
            }
        }
        for key in forwarded {
            let latency = self.rng.between(100_000, 3_000_000);
            if let Some(s) = self.streams.get_mut(&key)
                && s.respond_at.is_none()
            {
                s.respond_at = Some(now + latency);
                self.report.admitted += 1;
            }
        }
        for (key, outcome) in done {
            if let Some(s) = self.streams.remove(&key) {
                // The client has its answer: the stream ends.
                if let Some(worker) =
                    self.proxies.get_mut(p).and_then(|proxy| proxy.host.workers_mut().get_mut(s.worker))
                {
                    let _ = worker.finish(s.id);
                }
                let arrived = (s.arrived - self.start) as f64 / 1e6;
                let line =
                    format!("proxy {} worker {} {:?} (arrived {arrived:.3}): {outcome}", s.proxy, s.worker, s.request);
                self.note(line);
            }
        }
        Ok(())
    }

    /// The oracles after every instant.
    fn check(&mut self) -> Result<(), Box<Failure>> {
        let now = self.now();
        let (decisions, forgiven) = {
            let service = self.service.lock().unwrap_or_else(PoisonError::into_inner);
            (service.decisions().to_vec(), (service.forgiven(), service.carry_forgiven()))
        };
        for (p, proxy) in self.proxies.iter().enumerate() {
            let result = self.oracle.proxy(p, &proxy.host, &proxy.policies, now);
            if let Err(violation) = result {
                return Err(self.fail(violation));
            }
        }
        let hosts: Vec<&Host> = self.proxies.iter().map(|p| &p.host).collect();
        if let Err(violation) = self.oracle.service(&decisions, forgiven, &hosts, now) {
            return Err(self.fail(violation));
        }
        Ok(())
    }

    /// The end: no more traffic, the service healthy, the clock moving until every
    /// stream is answered and what must settle has (charges, expiries).
    fn quiet_end(&mut self) -> Result<(), Box<Failure>> {
        self.service.lock().unwrap_or_else(PoisonError::into_inner).set_mode(None, service::Mode::Healthy);
        self.oracle.service_mode(None, service::Mode::Healthy, self.now());
        // Of what the scenario still had to come, only the sweeper and the operator's
        // removals go on: no fault, no event after the end.
        for changes in self.pending.values_mut() {
            changes.retain(|c| matches!(c, timeline::Change::Sweep | timeline::Change::RemoveOverride(_)));
        }
        let quiet = Duration::from_millis(self.scenario.cooldown_ms + 3000);
        let until = self.now() + quiet.as_nanos() as u64;
        while self.now() < until {
            let next = [
                self.streams.values().filter_map(|s| s.respond_at).min(),
                self.next_due(),
                self.pending.keys().next().copied(),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(until)
            .min(until);
            self.clock.advance_to_monotonic(next);
            self.apply_due(next)?;
            let mut actions: BTreeMap<(usize, usize), Vec<Action>> = BTreeMap::new();
            for (key, stream) in &mut self.streams {
                if stream.respond_at.is_some_and(|at| at <= next) {
                    stream.respond_at = Some(u64::MAX);
                    actions.entry((stream.proxy, stream.worker)).or_default().push(Action::Respond(*key as usize));
                }
            }
            for (p, proxy) in self.proxies.iter_mut().enumerate() {
                for (w, worker) in proxy.host.workers_mut().iter().enumerate() {
                    if worker.next_due().is_some_and(|at| at <= next) {
                        actions.entry((p, w)).or_default().push(Action::Due);
                    }
                }
            }
            self.act(actions)?;
            self.check()?;
        }
        let now = self.now();
        for (p, proxy) in self.proxies.iter().enumerate() {
            if let Err(violation) = self.oracle.settled(p, &proxy.host, &proxy.policies, now) {
                return Err(self.fail(violation));
            }
        }
        if let Some(stream) = self.streams.values().next() {
            return Err(self.fail(Violation::new(
                "answered",
                format!(
                    "a request of proxy {} is still unanswered after the quiet end: {:?}",
                    stream.proxy, stream.request
                ),
            )));
        }
        Ok(())
    }
}
