//! The fleet on the virtual clock: one wasm-host per proxy running `sluice.wasm` with
//! the user's configuration, its workers each a VM of their own sharing the proxy's
//! shared data, the simulated counter service ([`crate::service`]) behind every proxy's
//! counter-service cluster, the upstream answering after its latency.
//!
//! The clock jumps from one thing to do to the next (an arrival or retry, an upstream's
//! answer, anything due on a worker: ticks, callout answers and timeouts, queue wakes; a
//! fault starting or ending; an interval's end). Workers run one after another in a fixed
//! order, so a run is a function of the scenario, the configuration and the module: the
//! same inputs give the same report, byte for byte. (The fleet tests interleave workers on
//! threads to find races; the lab measures behaviour, and races are theirs to find.)

use crate::access_log::Entry;
use crate::overshoot::{Ledger, PolicyOvershoot};
use crate::record::{ClassRow, Counters, Row, Series};
use crate::scenario::{Fault, Scenario};
use crate::service::{self, Mode, Service};
use crate::traffic::{Arrival, Traffic};
use shared_store::HashKey;
use sluice::config::{Config, Policy, SecretSource};
use sluice::host::{HostFailure, RequestFacts};
use sluice_testkit::rng::Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use wasm_host::{Clock as _, Host, Outcome as Seen, Request, Response, StreamId, VirtualClock, Wasm};

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
    /// The module's size and a digest of it (for the footer).
    pub module: (usize, u64),
}

/// A request in flight.
#[derive(Debug)]
struct Open {
    arrival: Arrival,
    id: StreamId,
    /// When the filter let it through (ns from the start).
    forwarded: Option<u64>,
    /// (policy index, caller fingerprint, cost) for every enforcing policy it matched.
    counted: Vec<(usize, u128, u64)>,
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
        Ok(Self { scenario, config, changes, wasm: wasm.to_path_buf(), log: Vec::new(), log_times: Vec::new() })
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
        let mut fleet = Fleet::new(self, &module)?;
        let end = self.scenario.duration.nanos();
        let interval = self.scenario.interval.nanos();
        let mut boundary = interval.min(end);
        loop {
            let t = fleet.next().map_or(boundary, |t| t.min(boundary));
            fleet.instant(t);
            if t == boundary {
                fleet.sample(boundary);
                progress(boundary, end);
                if boundary >= end {
                    break;
                }
                boundary = (boundary + interval).min(end);
            }
        }
        fleet.flush_forwarded();
        let max_callout = fleet.max_callout();
        let policies = fleet.all_policies.clone();
        let rows = fleet.series.rows.len();
        let overshoot = fleet.ledger.overshoot(&policies, interval, rows, max_callout);
        let service_calls = fleet.service.lock().unwrap_or_else(PoisonError::into_inner).calls();
        Ok(Outcome {
            scenario: self.scenario.clone(),
            config: self.config.clone(),
            policies,
            series: fleet.series,
            overshoot,
            requests: fleet.requests,
            service_calls,
            module: (module.len(), fnv(&module)),
        })
    }
}

/// The running fleet.
struct Fleet<'a> {
    lab: &'a Lab,
    clock: VirtualClock,
    start: u64,
    hosts: Vec<Host>,
    service: Arc<Mutex<Service>>,
    traffic: Traffic,
    timeline: BTreeMap<u64, Vec<Change>>,
    active: BTreeSet<usize>,
    /// The policies in force, and every policy seen (for the counters' names).
    policies: Vec<Policy>,
    all_policies: Vec<Policy>,
    prefix: String,
    /// Each proxy's region.
    regions: Vec<String>,
    open: BTreeMap<u64, Open>,
    /// Every open request of each worker.
    by_worker: BTreeMap<(usize, usize), BTreeSet<u64>>,
    /// The open requests of each worker that its own work can move on (held by the
    /// filter, or whose response it holds). A request waiting for the upstream changes
    /// only when the lab answers it, so it is not looked at on every step.
    held: BTreeMap<(usize, usize), BTreeSet<u64>>,
    responses: BTreeSet<(u64, u64)>,
    serial: u64,
    ledger: Ledger,
    /// Events of the current interval (see [`Row::events`]).
    events: Vec<String>,
    rows: Vec<ClassRow>,
    series: Series,
    requests: u64,
}

impl<'a> Fleet<'a> {
    fn new(lab: &'a Lab, module: &[u8]) -> Result<Self, LabError> {
        let scenario = &lab.scenario;
        let clock = VirtualClock::new();
        let mut rng = Rng::new(scenario.seed ^ 0x5e41_ce00_0000_0000);
        let proxies = scenario.proxies();
        let config = &lab.config.parsed;
        let token = match config.counter_service.as_ref().and_then(|c| c.token.clone()) {
            Some(SecretSource::Inline(secret)) => secret.expose().to_owned(),
            _ => service::TOKEN.to_owned(),
        };
        let service = Service::with_token(&clock, proxies, scenario.fleet.service_latency.0, rng.fork(), &token);
        let service = Arc::new(Mutex::new(service));
        service.lock().unwrap_or_else(PoisonError::into_inner).keep_decisions(false);
        let mut hosts = Vec::with_capacity(proxies);
        for p in 0..proxies {
            let service = service.clone();
            let mut builder = Host::builder(Wasm::bytes(module.to_vec()))
                .plugin_configuration(lab.config.run_bytes.clone())
                .plugin_name("sluice")
                .root_id("sluice")
                .vm_id("sluice")
                .workers(scenario.fleet.workers)
                .virtual_clock(clock.clone())
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
                    let service = service.clone();
                    builder = builder.scripted_cluster(counter_service.cluster.clone(), move |call| {
                        service.lock().unwrap_or_else(PoisonError::into_inner).answer(p, call)
                    });
                }
            }
            drop(service);
            hosts.push(builder.build().map_err(|e| LabError::Host(e.to_string()))?);
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
        let start = clock.monotonic_nanos();
        let mut traffic = Traffic::new(scenario);
        traffic.replay(&lab.log_times, 0, proxies);
        Ok(Self {
            lab,
            clock,
            start,
            hosts,
            service,
            traffic,
            timeline,
            active: BTreeSet::new(),
            all_policies: policies.clone(),
            policies,
            prefix: config.stat_prefix.clone(),
            regions: scenario.proxy_regions().into_iter().map(str::to_owned).collect(),
            open: BTreeMap::new(),
            by_worker: BTreeMap::new(),
            held: BTreeMap::new(),
            responses: BTreeSet::new(),
            serial: 0,
            ledger: Ledger::default(),
            events: Vec::new(),
            rows: vec![ClassRow::default(); scenario.callers.len()],
            series: Series { interval: scenario.interval.nanos(), rows: Vec::new() },
            requests: 0,
        })
    }

    /// The next instant something happens (ns from the start).
    fn next(&mut self) -> Option<u64> {
        let start = self.start;
        let due = self
            .hosts
            .iter_mut()
            .flat_map(|h| h.workers_mut().iter().filter_map(|w| w.next_due()))
            .min()
            .map(|at| at.saturating_sub(start));
        [self.traffic.next(), self.responses.first().map(|(at, _)| *at), due, self.timeline.keys().next().copied()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Everything due at `t`.
    fn instant(&mut self, t: u64) {
        self.clock.advance_to_monotonic(self.start + t);
        while let Some(entry) = self.timeline.first_entry().filter(|e| *e.key() <= t) {
            for change in entry.remove() {
                self.change(change);
            }
        }
        // Per worker touched: the requests it sent or answered now.
        let mut touched: BTreeMap<(usize, usize), Vec<u64>> = BTreeMap::new();
        for arrival in self.traffic.due(t) {
            let at = (arrival.proxy, arrival.worker);
            if let Some(key) = self.send(arrival) {
                touched.entry(at).or_default().push(key);
            }
        }
        while let Some((at, key)) = self.responses.first().copied().filter(|(at, _)| *at <= t) {
            self.responses.remove(&(at, key));
            if let Some(open) = self.open.get(&key) {
                let (p, w) = (open.arrival.proxy, open.arrival.worker);
                let usage = self.lab.scenario.callers.get(open.arrival.class).and_then(|c| c.usage);
                let response = match usage {
                    Some(units) => Response::ok().header("x-usage", units.to_string()),
                    None => Response::ok(),
                };
                if let Some(worker) = self.hosts.get_mut(p).and_then(|h| h.workers_mut().get_mut(w)) {
                    let _ = worker.respond(open.id, response);
                }
                touched.entry((p, w)).or_default().push(key);
            }
        }
        let now = self.start + t;
        for (p, host) in self.hosts.iter_mut().enumerate() {
            for (w, worker) in host.workers_mut().iter_mut().enumerate() {
                if worker.next_due().is_some_and(|at| at <= now) {
                    worker.run_pending();
                    touched.entry((p, w)).or_default();
                }
            }
        }
        for ((p, w), keys) in touched {
            self.observe(p, w, t, keys);
        }
    }

    /// Sends one request; its key among the open requests.
    fn send(&mut self, arrival: Arrival) -> Option<u64> {
        let scenario = &self.lab.scenario;
        let caller = scenario.callers.get(arrival.class)?;
        let (method, path, headers, source) = match arrival.entry.and_then(|e| self.lab.log.get(e)) {
            Some(entry) => {
                let source = entry.source.unwrap_or_else(|| SocketAddr::from((Ipv4Addr::new(10, 0, 0, 1), 40_000)));
                (entry.method.clone(), entry.path.clone(), entry.headers.clone(), source)
            }
            None => {
                let region = self.regions.get(arrival.proxy).map_or("", String::as_str);
                let identity = format!("{}-{}", caller.name, arrival.key);
                let headers: Vec<(String, String)> = caller
                    .headers
                    .iter()
                    .map(|(name, value)| (name.clone(), value.replace("{key}", &identity).replace("{region}", region)))
                    .collect();
                let octets = (arrival.key as u32).wrapping_add(arrival.class as u32 * 7_919).to_be_bytes();
                let source = SocketAddr::from((Ipv4Addr::new(10, octets[1], octets[2], octets[3]), 40_000));
                (caller.method.clone(), caller.path.clone(), headers, source)
            }
        };
        let mut request = Request::new(&method, &path).source(source);
        for (name, value) in &headers {
            if !name.starts_with(':') {
                request = request.header(name, value);
            }
        }
        let mut facts_headers = headers.clone();
        facts_headers.push((":path".to_owned(), path));
        facts_headers.push((":method".to_owned(), method));
        let facts = Facts { headers: &facts_headers, source };
        let counted: Vec<(usize, u128, u64)> = self
            .policies
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.shadow && p.matcher.matches(&facts).unwrap_or(false))
            .filter_map(|(i, p)| {
                let fingerprint = p.fingerprint(&facts, &LEDGER_KEY).ok().flatten()?;
                Some((i, fingerprint, p.cost_of(&facts).unwrap_or(1)))
            })
            .collect();
        for (policy, fingerprint, _) in &counted {
            if let Some(policy) = self.policies.get(*policy) {
                let label = || {
                    let values: Vec<String> = policy
                        .key
                        .iter()
                        .map(|part| match part {
                            sluice::config::KeyPart::Header(name) => {
                                facts_headers.iter().find(|(n, _)| n == name).map_or("-".to_owned(), |(_, v)| v.clone())
                            }
                            sluice::config::KeyPart::ClientAddress { .. } => source.ip().to_string(),
                            other => format!("{other:?}"),
                        })
                        .collect();
                    values.join(" ")
                };
                self.ledger.label(&policy.name, *fingerprint, label);
            }
        }
        let worker = self.hosts.get_mut(arrival.proxy).and_then(|h| h.workers_mut().get_mut(arrival.worker))?;
        let id = worker.request(request);
        self.requests += 1;
        if let Some(row) = self.rows.get_mut(arrival.class) {
            row.offered += 1;
            row.retries += u64::from(arrival.attempt > 0);
        }
        self.serial += 1;
        self.by_worker.entry((arrival.proxy, arrival.worker)).or_default().insert(self.serial);
        self.open.insert(self.serial, Open { arrival, id, forwarded: None, counted });
        Some(self.serial)
    }

    /// What became of worker (p, w)'s requests after a step: those it holds, and `keys`
    /// (sent or answered in the step). A failed VM may have ended any of them, so then
    /// every one is looked at. In the order they were sent, as if all were looked at:
    /// the others cannot have changed.
    fn observe(&mut self, p: usize, w: usize, t: u64, keys: Vec<u64>) {
        let failed = self.hosts.get_mut(p).and_then(|h| h.workers_mut().get(w)).is_none_or(|worker| worker.is_failed());
        let keys: Vec<u64> = if failed {
            self.by_worker.get(&(p, w)).map(|set| set.iter().copied().collect()).unwrap_or_default()
        } else {
            let mut all: BTreeSet<u64> = self.held.get(&(p, w)).cloned().unwrap_or_default();
            all.extend(keys);
            all.into_iter().collect()
        };
        let upstream = self.lab.scenario.fleet.upstream_latency.nanos();
        let fallback_header = self.lab.config.fallback_header.clone();
        for key in keys {
            let Some(open) = self.open.get_mut(&key) else { continue };
            let Some(worker) = self.hosts.get_mut(p).and_then(|h| h.workers_mut().get_mut(w)) else { return };
            let class = open.arrival.class;
            enum Fate {
                /// Held by the filter (the request or its response).
                Keep,
                /// Forwarded earlier: waits for the upstream's answer.
                Upstream,
                Forwarded,
                Done(Option<String>),
                Refused {
                    rejected: bool,
                    retry_after: Option<u64>,
                },
            }
            let fate = match worker.outcome(open.id) {
                Ok(Seen::Paused | Seen::ResponsePaused) => Fate::Keep,
                Ok(Seen::Forwarded(_)) if open.forwarded.is_none() => Fate::Forwarded,
                Ok(Seen::Forwarded(_)) => Fate::Upstream,
                Ok(Seen::Responded(response)) if open.forwarded.is_some() => {
                    Fate::Done(response.headers.get_str(&fallback_header).map(str::to_owned))
                }
                Ok(Seen::Responded(response)) => Fate::Refused {
                    rejected: response.status == 429,
                    retry_after: response.headers.get_str("retry-after").and_then(|v| v.trim().parse().ok()),
                },
                Ok(Seen::Reset) => Fate::Refused { rejected: false, retry_after: None },
                Err(_) => Fate::Done(None),
            };
            match fate {
                Fate::Upstream => {
                    self.held.entry((p, w)).or_default().remove(&key);
                }
                Fate::Keep => {
                    self.held.entry((p, w)).or_default().insert(key);
                }
                Fate::Forwarded => {
                    self.held.entry((p, w)).or_default().remove(&key);
                    open.forwarded = Some(t);
                    if let Some(row) = self.rows.get_mut(class) {
                        row.allowed += 1;
                        row.calls_served += 1;
                        let waited = t.saturating_sub(open.arrival.at);
                        row.waited_ns += waited;
                        row.waited_max_ns = row.waited_max_ns.max(waited);
                    }
                    self.responses.insert((t.saturating_add(upstream), key));
                }
                Fate::Done(fallback) => {
                    // Counted against each policy's budget at the moment it was let
                    // through; a fallback names the policies it decided.
                    if let Some(at) = open.forwarded {
                        let decided_by_fallback = |name: &str| {
                            fallback
                                .as_deref()
                                .and_then(|v| v.split("policies=").nth(1))
                                .is_some_and(|list| list.split([',', ';']).any(|p| p.trim() == name))
                        };
                        for (policy, fingerprint, cost) in &open.counted {
                            if let Some(policy) = self.policies.get(*policy) {
                                let by_fallback = decided_by_fallback(&policy.name);
                                self.ledger.admit(policy, *fingerprint, at, *cost, by_fallback);
                            }
                        }
                    }
                    let _ = worker.finish(open.id);
                    self.close(p, w, key);
                }
                Fate::Refused { rejected, retry_after } => {
                    let _ = worker.finish(open.id);
                    let retried = self.traffic.refused(&open.arrival, t, retry_after);
                    if let Some(row) = self.rows.get_mut(class) {
                        if rejected {
                            row.rejected += 1;
                        } else {
                            row.failed += 1;
                        }
                        row.calls_refused += u64::from(!retried);
                    }
                    self.close(p, w, key);
                }
            }
        }
    }

    /// Requests let through whose upstream has not answered by the end: counted at the
    /// moment they were let through (whether a fallback decided them is not known yet).
    fn flush_forwarded(&mut self) {
        for open in self.open.values() {
            let Some(at) = open.forwarded else { continue };
            for (policy, fingerprint, cost) in &open.counted {
                if let Some(policy) = self.policies.get(*policy) {
                    self.ledger.admit(policy, *fingerprint, at, *cost, false);
                }
            }
        }
    }

    fn close(&mut self, p: usize, w: usize, key: u64) {
        self.open.remove(&key);
        if let Some(set) = self.by_worker.get_mut(&(p, w)) {
            set.remove(&key);
        }
        if let Some(set) = self.held.get_mut(&(p, w)) {
            set.remove(&key);
        }
    }

    /// A fault starts or ends.
    fn change(&mut self, change: Change) {
        let faults = &self.lab.scenario.faults;
        match change {
            Change::End(i) => {
                self.active.remove(&i);
            }
            Change::Start(i) => match faults.get(i) {
                Some(Fault::Restart { .. }) => self.service.lock().unwrap_or_else(PoisonError::into_inner).restart(),
                Some(Fault::ClockStep { by, .. }) => {
                    self.service.lock().unwrap_or_else(PoisonError::into_inner).step_clock(by.0);
                }
                Some(Fault::Config { .. }) => {
                    if let Some(config) = self.lab.changes.get(&i) {
                        let mut refused = 0;
                        for (p, host) in self.hosts.iter_mut().enumerate() {
                            // A refused reload keeps the old configuration, as in Envoy:
                            // the report says so.
                            if let Err(e) = host.reconfigure(config.run_bytes.clone()) {
                                refused += 1;
                                self.events.push(format!("proxy {p} refused {}: {e}", config.name));
                            }
                        }
                        if refused == self.hosts.len() {
                            return;
                        }
                        self.policies = config.parsed.policies.clone();
                        for policy in &self.policies {
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
        self.apply_modes();
    }

    /// Each proxy's service mode: the latest-started fault in force that reaches it.
    fn apply_modes(&mut self) {
        let scenario = &self.lab.scenario;
        let regions = scenario.proxy_regions();
        let mut service = self.service.lock().unwrap_or_else(PoisonError::into_inner);
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
    fn sample(&mut self, t: u64) {
        let names: Vec<String> = self.all_policies.iter().map(|p| p.name.clone()).collect();
        let mut counters = Counters::default();
        for host in &self.hosts {
            counters.add(&host.metrics(), &self.prefix, &names);
        }
        let mut classes = std::mem::replace(&mut self.rows, vec![ClassRow::default(); self.lab.scenario.callers.len()]);
        for open in self.open.values().filter(|o| o.forwarded.is_none()) {
            if let Some(row) = classes.get_mut(open.arrival.class) {
                row.pending += 1;
            }
        }
        let faults = self.active.iter().filter_map(|i| self.lab.scenario.faults.get(*i)).map(Fault::describe).collect();
        let events = std::mem::take(&mut self.events);
        self.series.rows.push(Row { end: t, counters, classes, faults, events });
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

/// The request headers `config` reads (its key parts, match conditions and cost
/// headers), for telling a replayed log's user which ones it lacks.
pub fn headers_read(config: &Config) -> Vec<String> {
    use sluice::config::{Cost, HeaderCondition, KeyPart};
    let mut names = BTreeSet::new();
    for policy in &config.policies {
        for part in &policy.key {
            if let KeyPart::Header(name) = part {
                names.insert(name.clone());
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
