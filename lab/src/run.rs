//! The fleet on the virtual clock: one wasm-host per proxy running `sluice.wasm` with
//! the user's configuration, its workers each a VM of their own sharing the proxy's
//! shared data, the simulated counter service ([`crate::service`]) behind every proxy's
//! counter-service cluster, the upstream answering after its latency.
//!
//! Each proxy ([`lane`]) jumps from one thing to do to the next on a clock of its own:
//! an arrival or retry, an upstream's answer, anything due on a worker (ticks, callout
//! answers and timeouts, queue wakes). Proxies share only the counter service and the
//! callers' first attempts, so they run side by side, on as many threads as the fleet is
//! given ([`crew`]): a proxy runs ahead until one of its calls to the service could be
//! answered, and the service ([`decider`]) decides the calls in one order, (time, proxy,
//! worker, call), each on its clock at the call's time. The fleet applies the timeline
//! and samples the report between stretches of time. A run is a function of the
//! scenario, the configuration and the module, whatever the number of threads: the same
//! inputs give the same report, byte for byte. (The fleet tests interleave workers on
//! threads to find races; the lab measures behaviour, and races are theirs to find.)

mod crew;
mod decider;
mod lane;

use crate::access_log::Entry;
use crate::overshoot::{Ledger, PolicyOvershoot};
use crate::record::{ClassRow, Counters, Row, Series};
use crate::scenario::{Fault, Scenario};
use crate::service::{self, Mode, Service};
use crate::traffic::Traffic;
use crew::Crew;
use decider::Decider;
use lane::Lane;
use shared_store::HashKey;
use sluice::config::{Config, Policy, SecretSource};
use sluice::host::{HostFailure, RequestFacts};
use sluice_testkit::rng::Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use wasm_host::{Answer, Host, VirtualClock, Wasm};

/// The hash key the proxies are given when their configuration reads it from the
/// environment.
const HASH_KEY: &str = "sluice-lab-hash-key-0123456789ab";
/// The fleet's own key for grouping callers in the overshoot ledger (any key will do:
/// only equality matters).
const LEDGER_KEY: HashKey = HashKey::new(*b"sluice-lab-ledgr");

/// The header the lab asks the filter to name fallback decisions with, when the
/// configuration does not name one itself (the report's footer says so).
pub const LAB_FALLBACK_HEADER: &str = "x-sluice-lab-fallback";

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The filter configuration is refused (the filter's own validation).
    #[error("{file}: {error}")]
    Config {
        /// The file.
        file: String,
        /// The filter's error, naming the field.
        error: String,
    },
    /// A file could not be read.
    #[error("{file}: {error}")]
    Read {
        /// The file.
        file: String,
        /// Why.
        error: std::io::Error,
    },
    /// wasm-host refused the module or the configuration.
    #[error("the proxy would not start: {0}")]
    Host(String),
}

/// A configuration: its name (for the report), its bytes and what the filter makes of
/// them.
#[derive(Clone, Debug)]
pub struct FilterConfig {
    /// Its name (the file's).
    pub name: String,
    /// The JSON.
    pub bytes: Vec<u8>,
    /// As the filter validated it.
    pub parsed: Config,
    /// What the proxies are given: the same, plus `response.fallback_header` when the
    /// configuration names none (so that every fallback admission can be told apart).
    pub run_bytes: Vec<u8>,
    /// The header that names fallback decisions.
    pub fallback_header: String,
}

impl FilterConfig {
    /// Reads and validates the configuration at `path`.
    ///
    /// # Errors
    /// When it cannot be read, or the filter refuses it (naming the field).
    pub fn load(path: &Path) -> Result<Self, LabError> {
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|error| LabError::Read { file: file.clone(), error })?;
        Self::from_bytes(&file, bytes)
    }

    /// Validates `bytes`, named `name` in errors and reports.
    ///
    /// # Errors
    /// When the filter refuses it.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<Self, LabError> {
        let refused = |error: String| LabError::Config { file: name.to_owned(), error };
        let parsed = Config::from_json(&bytes).map_err(|e| refused(e.to_string()))?;
        let (run_bytes, fallback_header) = match &parsed.response.fallback_header {
            Some(header) => (bytes.clone(), header.clone()),
            None => {
                let mut json: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| refused(e.to_string()))?;
                if let Some(root) = json.as_object_mut() {
                    let response = root.entry("response").or_insert_with(|| serde_json::json!({}));
                    if let Some(response) = response.as_object_mut() {
                        response.insert("fallback_header".to_owned(), LAB_FALLBACK_HEADER.into());
                    }
                }
                let run_bytes = serde_json::to_vec(&json).map_err(|e| refused(e.to_string()))?;
                Config::from_json(&run_bytes).map_err(|e| refused(format!("with the lab's fallback header: {e}")))?;
                (run_bytes, LAB_FALLBACK_HEADER.to_owned())
            }
        };
        Ok(Self { name: name.to_owned(), bytes, parsed, run_bytes, fallback_header })
    }
}

/// A scenario ready to run against a configuration.
#[derive(Clone, Debug)]
pub struct Lab {
    scenario: Scenario,
    config: FilterConfig,
    /// Configurations the timeline switches to, by fault index.
    changes: BTreeMap<usize, FilterConfig>,
    wasm: PathBuf,
    /// Requests replayed from an access log, and when each is sent (ns from the start).
    log: Vec<Entry>,
    log_times: Vec<u64>,
    /// Threads to run the proxies on (the report does not depend on it).
    threads: usize,
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The scenario.
    pub scenario: Scenario,
    /// The configuration it started with.
    pub config: FilterConfig,
    /// Every policy of every configuration the run used, the last one's numbers for a
    /// name used twice.
    pub policies: Vec<Policy>,
    /// Per interval.
    pub series: Series,
    /// Per policy.
    pub overshoot: Vec<PolicyOvershoot>,
    /// Requests sent in all.
    pub requests: u64,
    /// Calls the counter service answered.
    pub service_calls: u64,
    /// Answers of the counter service that reached a proxy after they were due: always
    /// 0, as the way the proxies run side by side promises (counted so that tests hold it
    /// to that).
    pub late_answers: u64,
    /// Calls that reached the counter service after it had decided a call made later:
    /// always 0, as that promise also needs (counted for the tests).
    pub late_calls: u64,
    /// The module's size and a digest of it (for the footer).
    pub module: (usize, u64),
}

/// The request's facts as the filter's policy code reads them.
struct Facts<'a> {
    headers: &'a [(String, String)],
    source: SocketAddr,
}

impl RequestFacts for Facts<'_> {
    fn header(&self, name: &str) -> Result<Option<Vec<u8>>, HostFailure> {
        Ok(self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone().into_bytes()))
    }

    fn property(&self, path: &[&str]) -> Result<Option<Vec<u8>>, HostFailure> {
        Ok((path == ["source", "address"]).then(|| self.source.to_string().into_bytes()))
    }
}

/// A change on the timeline.
#[derive(Clone, Debug)]
enum Change {
    /// Fault `i` starts.
    Start(usize),
    /// Fault `i` ends.
    End(usize),
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

impl Lab {
    /// A lab for `scenario` (its configuration changes read relative to `base`) against
    /// `config`, running the module at `wasm`.
    ///
    /// # Errors
    /// When a configuration the timeline names cannot be read or is refused.
    pub fn new(scenario: Scenario, config: FilterConfig, base: &Path, wasm: &Path) -> Result<Self, LabError> {
        let mut changes = BTreeMap::new();
        for (i, fault) in scenario.faults.iter().enumerate() {
            if let Fault::Config { file, .. } = fault {
                changes.insert(i, FilterConfig::load(&base.join(file))?);
            }
        }
        Ok(Self {
            scenario,
            config,
            changes,
            wasm: wasm.to_path_buf(),
            log: Vec::new(),
            log_times: Vec::new(),
            threads: 1,
        })
    }

    /// Runs the proxies on `threads` threads (at least 1, at most one per proxy; 1 by
    /// default). The report is the same whatever the number. A proxy waits for the
    /// others whenever one of its calls to the service is due to be answered, so more
    /// threads than idle cores make a run slower, not faster.
    #[must_use]
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// Adds the requests of an access log, sent as caller class 0 at the pace they were
    /// logged, `speed` times faster (the first at 0).
    pub fn with_log(mut self, entries: Vec<Entry>, speed: f64) -> Self {
        let first = entries.iter().map(|e| e.at).min().unwrap_or(0);
        let mut order: Vec<(u64, Entry)> =
            entries.into_iter().map(|e| (((e.at - first) as f64 / speed.max(1e-9)) as u64, e)).collect();
        order.sort_by_key(|(at, e)| (*at, e.line));
        self.log_times = order.iter().map(|(at, _)| *at).collect();
        self.log = order.into_iter().map(|(_, e)| e).collect();
        self
    }

    /// Runs it; `progress` hears of every interval's end (ns done, ns in all).
    ///
    /// # Errors
    /// When a proxy would not start (the module, or the configuration in wasm-host).
    pub fn run(&self, mut progress: impl FnMut(u64, u64)) -> Result<Outcome, LabError> {
        let module = std::fs::read(&self.wasm)
            .map_err(|error| LabError::Read { file: self.wasm.display().to_string(), error })?;
        let (mut fleet, lanes, decider) = Fleet::new(self, &module)?;
        crew::with_crew(&lanes, self, &decider, self.threads, |crew| fleet.run(&lanes, &decider, crew, &mut progress));
        let (requests, late_answers) = fleet.finish(lanes);
        let interval = self.scenario.interval.nanos();
        let max_callout = fleet.max_callout();
        let policies = fleet.all_policies.clone();
        let rows = fleet.series.rows.len();
        let overshoot = fleet.ledger.overshoot(&policies, interval, rows, max_callout);
        let (service_calls, late_calls) = {
            let decider = lock(&decider);
            (decider.service.calls(), decider.late_calls)
        };
        Ok(Outcome {
            scenario: self.scenario.clone(),
            config: self.config.clone(),
            policies,
            series: fleet.series,
            overshoot,
            requests,
            service_calls,
            late_answers,
            late_calls,
            module: (module.len(), fnv(&module)),
        })
    }
}

/// A fleet, its proxies, and the counter service with the calls it has to decide.
type Started<'a> = (Fleet<'a>, Vec<Mutex<Lane>>, Mutex<Decider>);

/// The running fleet: the proxies ([`Lane`]s, run by a [`crew::Crew`]), and what they
/// share, which only the fleet touches, between stretches: the counter service, the
/// callers, the timeline, the report.
struct Fleet<'a> {
    lab: &'a Lab,
    traffic: Traffic,
    timeline: BTreeMap<u64, Vec<Change>>,
    active: BTreeSet<usize>,
    /// The policies in force, and every policy seen (for the counters' names).
    policies: Arc<Vec<Policy>>,
    all_policies: Vec<Policy>,
    prefix: String,
    ledger: Ledger,
    /// Events of the current interval (see [`Row::events`]).
    events: Vec<String>,
    series: Series,
}

impl<'a> Fleet<'a> {
    /// The fleet, its proxies and the counter service, ready to run.
    fn new(lab: &'a Lab, module: &[u8]) -> Result<Started<'a>, LabError> {
        let scenario = &lab.scenario;
        let clock = VirtualClock::new();
        let mut rng = Rng::new(scenario.seed ^ 0x5e41_ce00_0000_0000);
        let proxies = scenario.proxies();
        let config = &lab.config.parsed;
        let token = match config.counter_service.as_ref().and_then(|c| c.token.clone()) {
            Some(SecretSource::Inline(secret)) => secret.expose().to_owned(),
            _ => service::TOKEN.to_owned(),
        };
        let mut service = Service::with_token(&clock, proxies, scenario.fleet.service_latency.0, rng.fork(), &token);
        service.keep_decisions(false);
        let regions = scenario.proxy_regions();
        let mut lanes = Vec::with_capacity(proxies);
        for p in 0..proxies {
            let proxy_clock = VirtualClock::new();
            let mut builder = Host::builder(Wasm::bytes(module.to_vec()))
                .plugin_configuration(lab.config.run_bytes.clone())
                .plugin_name("sluice")
                .root_id("sluice")
                .vm_id("sluice")
                .workers(scenario.fleet.workers)
                .virtual_clock(proxy_clock.clone())
                .random_seed(Some(scenario.seed.wrapping_add(p as u64)))
                .capture_logs(false)
                .record_callouts(false);
            let every = std::iter::once(config).chain(lab.changes.values().map(|c| &c.parsed));
            let services: Vec<_> = every.filter_map(|c| c.counter_service.as_ref()).collect();
            let mut clusters = BTreeSet::new();
            for counter_service in services {
                if let Some(SecretSource::Env(name)) = &counter_service.token {
                    builder = builder.env(name.clone(), token.clone());
                }
                if let SecretSource::Env(name) = &counter_service.hash_key {
                    builder = builder.env(name.clone(), HASH_KEY);
                }
                if clusters.insert(counter_service.cluster.clone()) {
                    // Decided by the fleet's decider, in one order for all proxies.
                    builder = builder.scripted_cluster(counter_service.cluster.clone(), |_| Answer::deferred());
                }
            }
            let host = builder.build().map_err(|e| LabError::Host(e.to_string()))?;
            let region = regions.get(p).map_or_else(String::new, |r| (*r).to_owned());
            lanes.push(Mutex::new(Lane::new(p, host, proxy_clock, region, scenario.callers.len())));
        }
        let mut timeline: BTreeMap<u64, Vec<Change>> = BTreeMap::new();
        for (i, fault) in scenario.faults.iter().enumerate() {
            timeline.entry(fault.at().nanos()).or_default().push(Change::Start(i));
            let lasts = match fault {
                Fault::Slow { lasts, .. }
                | Fault::Down { lasts, .. }
                | Fault::Errors { lasts, .. }
                | Fault::Partition { lasts, .. } => Some(lasts.nanos()),
                Fault::Restart { .. } | Fault::ClockStep { .. } | Fault::Config { .. } => None,
            };
            if let Some(lasts) = lasts {
                timeline.entry(fault.at().nanos().saturating_add(lasts)).or_default().push(Change::End(i));
            }
        }
        let policies = config.policies.clone();
        let mut traffic = Traffic::new(scenario);
        traffic.replay(&lab.log_times, 0, proxies);
        let fleet = Self {
            lab,
            traffic,
            timeline,
            active: BTreeSet::new(),
            all_policies: policies.clone(),
            policies: Arc::new(policies),
            prefix: config.stat_prefix.clone(),
            ledger: Ledger::default(),
            events: Vec::new(),
            series: Series { interval: scenario.interval.nanos(), rows: Vec::new() },
        };
        Ok((fleet, lanes, Mutex::new(Decider::new(service, clock))))
    }

    /// Runs the scenario to its end; `progress` hears of every interval's end.
    ///
    /// The proxies run side by side ([`crew`]) from one of the fleet's points in time to
    /// the next: a change on the timeline (which applies before anything else at its
    /// instant), or just after an interval's end (which is sampled after everything at
    /// its instant). Between them the fleet alone touches the proxies and the service.
    fn run(
        &mut self,
        lanes: &[Mutex<Lane>],
        decider: &Mutex<Decider>,
        crew: &mut Crew<'_>,
        progress: &mut impl FnMut(u64, u64),
    ) {
        let end = self.lab.scenario.duration.nanos();
        let interval = self.lab.scenario.interval.nanos();
        let mut boundary = interval.min(end);
        let mut now = 0;
        loop {
            self.apply_changes(lanes, decider, now);
            let until = self.timeline.keys().next().map_or(boundary + 1, |at| (*at).min(boundary + 1));
            while let Some(at) = self.traffic.next().filter(|at| *at < until) {
                for arrival in self.traffic.due(at) {
                    if let Some(lane) = lanes.get(arrival.proxy) {
                        lock(lane).arrivals.push_back(arrival);
                    }
                }
            }
            crew.run(now, until, self.shortest_answer(decider), &self.policies);
            if until == boundary + 1 {
                self.sample(lanes, boundary);
                progress(boundary, end);
                if boundary >= end {
                    return;
                }
                boundary = (boundary + interval).min(end);
            }
            let next = lanes.iter().filter_map(|lane| lock(lane).next()).chain(self.traffic.next()).min();
            now = next.map_or(boundary, |t| t.min(boundary)).max(until);
        }
    }

    /// The shortest time after its dispatch at which a call can be answered, under the
    /// modes in force (ns; at least 1).
    fn shortest_answer(&self, decider: &Mutex<Decider>) -> u64 {
        let proxies = self.lab.scenario.proxies();
        let decider = lock(decider);
        let shortest = (0..proxies).filter_map(|p| decider.service.shortest_answer(p)).min();
        shortest.map_or(u64::MAX, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)).max(1)
    }

    /// Applies the changes on the timeline due at or before `now`, with every clock
    /// there.
    fn apply_changes(&mut self, lanes: &[Mutex<Lane>], decider: &Mutex<Decider>, now: u64) {
        let mut applied = false;
        while let Some(entry) = self.timeline.first_entry().filter(|e| *e.key() <= now) {
            if !applied {
                lock(decider).advance_to(now);
                lanes.iter().for_each(|lane| lock(lane).advance_to(now));
                applied = true;
            }
            for change in entry.remove() {
                self.change(lanes, decider, change);
            }
        }
    }

    /// A fault starts or ends.
    fn change(&mut self, lanes: &[Mutex<Lane>], decider: &Mutex<Decider>, change: Change) {
        let faults = &self.lab.scenario.faults;
        match change {
            Change::End(i) => {
                self.active.remove(&i);
            }
            Change::Start(i) => match faults.get(i) {
                Some(Fault::Restart { .. }) => lock(decider).service.restart(),
                Some(Fault::ClockStep { by, .. }) => lock(decider).service.step_clock(by.0),
                Some(Fault::Config { .. }) => {
                    if let Some(config) = self.lab.changes.get(&i) {
                        let mut refused = 0;
                        for (p, lane) in lanes.iter().enumerate() {
                            // A refused reload keeps the old configuration, as in Envoy:
                            // the report says so.
                            if let Err(e) = lock(lane).host.reconfigure(config.run_bytes.clone()) {
                                refused += 1;
                                self.events.push(format!("proxy {p} refused {}: {e}", config.name));
                            }
                        }
                        if refused == lanes.len() {
                            return;
                        }
                        self.policies = Arc::new(config.parsed.policies.clone());
                        for policy in self.policies.iter() {
                            match self.all_policies.iter_mut().find(|p| p.name == policy.name) {
                                Some(known) => *known = policy.clone(),
                                None => self.all_policies.push(policy.clone()),
                            }
                        }
                    }
                }
                Some(_) => {
                    self.active.insert(i);
                }
                None => {}
            },
        }
        self.apply_modes(&mut lock(decider).service);
    }

    /// Each proxy's service mode: the latest-started fault in force that reaches it.
    fn apply_modes(&self, service: &mut Service) {
        let scenario = &self.lab.scenario;
        let regions = scenario.proxy_regions();
        for (p, region) in regions.iter().enumerate() {
            let mut mode = Mode::Healthy;
            for i in &self.active {
                let (reaches, m) = match scenario.faults.get(*i) {
                    Some(Fault::Slow { latency, region: r, .. }) => {
                        (r.as_deref().is_none_or(|r| r == *region), Mode::Slow(latency.0))
                    }
                    Some(Fault::Down { region: r, .. }) => (r.as_deref().is_none_or(|r| r == *region), Mode::Refused),
                    Some(Fault::Errors { region: r, .. }) => {
                        (r.as_deref().is_none_or(|r| r == *region), Mode::Error500)
                    }
                    Some(Fault::Partition { region: r, .. }) => (r == region, Mode::Silent),
                    _ => (false, Mode::Healthy),
                };
                if reaches {
                    mode = m;
                }
            }
            service.set_mode(Some(p), mode);
        }
    }

    /// An interval ends at `t`.
    fn sample(&mut self, lanes: &[Mutex<Lane>], t: u64) {
        let mut counters = Counters::default();
        let mut classes = vec![ClassRow::default(); self.lab.scenario.callers.len()];
        for lane in lanes {
            let mut lane = lock(lane);
            counters.add(&lane.host.metrics(), &self.prefix);
            let rows = std::mem::replace(&mut lane.rows, vec![ClassRow::default(); classes.len()]);
            for (class, row) in classes.iter_mut().zip(&rows) {
                class.then(row);
            }
        }
        for lane in lanes {
            lock(lane).pending(&mut classes);
        }
        let faults = self.active.iter().filter_map(|i| self.lab.scenario.faults.get(*i)).map(Fault::describe).collect();
        let events = std::mem::take(&mut self.events);
        self.series.rows.push(Row { end: t, counters, classes, faults, events });
    }

    /// The end: requests still with the upstream are counted, and every proxy's ledger
    /// joins the fleet's. Returns the requests sent and the answers given late.
    fn finish(&mut self, lanes: Vec<Mutex<Lane>>) -> (u64, u64) {
        let (mut requests, mut late) = (0, 0);
        for lane in lanes {
            let mut lane = lane.into_inner().unwrap_or_else(PoisonError::into_inner);
            lane.flush_forwarded(&self.policies);
            requests += lane.requests;
            late += lane.late_answers;
            self.ledger.absorb(lane.ledger);
        }
        (requests, late)
    }

    /// The longest a callout may take to be answered in this run (ns): the healthy round
    /// trip and its jitter, or a slow fault's latency below the filter's deadline.
    fn max_callout(&self) -> u64 {
        let scenario = &self.lab.scenario;
        let healthy = scenario.fleet.service_latency.nanos().saturating_mul(3) / 2;
        let deadline =
            self.lab.config.parsed.counter_service.as_ref().map_or(0, |c| u64::from(c.timeout_ms) * 1_250_000);
        scenario
            .faults
            .iter()
            .filter_map(|f| match f {
                Fault::Slow { latency, .. } => Some(latency.nanos().min(deadline)),
                _ => None,
            })
            .fold(healthy, u64::max)
    }
}

/// A lock that a panic elsewhere does not poison: a panicking thread's panic is raised
/// again on the fleet's thread, which is all that is left to do.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The request headers `config` reads (its key parts, match conditions and cost
/// headers), for telling a replayed log's user which ones it lacks.
pub fn headers_read(config: &Config) -> Vec<String> {
    use sluice::config::{Cost, HeaderCondition, KeyPart};
    let mut names = BTreeSet::new();
    for policy in &config.policies {
        for part in &policy.key {
            match part {
                KeyPart::Header(name) => {
                    names.insert(name.clone());
                }
                // Pseudo-headers, the address and properties every replayed request has;
                // constants and query parameters are not headers.
                KeyPart::Constant(_)
                | KeyPart::ClientAddress { .. }
                | KeyPart::Authority
                | KeyPart::Path
                | KeyPart::Method
                | KeyPart::QueryParameter(_)
                | KeyPart::Property(_) => {}
            }
        }
        for condition in &policy.matcher.headers {
            let (HeaderCondition::Present(name, _) | HeaderCondition::Equals(name, _)) = condition;
            names.insert(name.clone());
        }
        if let Cost::Header { name, .. } = &policy.cost {
            names.insert(name.clone());
        }
    }
    names.into_iter().collect()
}
