//! One proxy of the fleet: its wasm-host (one VM per worker, sharing the proxy's shared
//! data) on a clock of its own, the requests it has in flight, and what it saw.
//!
//! A proxy touches nothing another proxy touches: its calls to the counter service are
//! deferred ([`wasm_host::Answer::deferred`]) and decided by the fleet's
//! [`Decider`](super::decider::Decider), its refused calls' retries are its own (a retry
//! keeps its proxy), and what it counts (per class, per caller) is its own until the
//! fleet adds it up. So proxies can run on different threads, and the result does not
//! depend on which. A proxy runs ahead until the earliest time one of its calls could be
//! answered ([`Lane::run`]), and no further before that call is decided.

use super::decider::{Call, Reply};
use super::{Facts, LEDGER_KEY, Lab};
use crate::overshoot::Ledger;
use crate::record::ClassRow;
use crate::traffic::{Arrival, retry};
use sluice::config::Policy;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use wasm_host::{Host, Outcome as Seen, Request, Response, StreamId, VirtualClock};

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

/// What a proxy reads while it runs and does not change.
#[derive(Clone, Copy)]
pub(super) struct Context<'a> {
    pub(super) lab: &'a Lab,
    /// The policies in force.
    pub(super) policies: &'a [Policy],
}

/// One proxy.
pub(super) struct Lane {
    /// Its index in the fleet.
    proxy: usize,
    pub(super) host: Host,
    clock: VirtualClock,
    /// The clock's monotonic time at the run's start.
    start: u64,
    region: String,
    open: BTreeMap<u64, Open>,
    /// Every open request of each worker.
    by_worker: BTreeMap<usize, BTreeSet<u64>>,
    /// The open requests of each worker that its own work can move on (held by the
    /// filter, or whose response it holds). A request waiting for the upstream changes
    /// only when the lab answers it, so it is not looked at on every step.
    held: BTreeMap<usize, BTreeSet<u64>>,
    /// Upstream answers due: (when, request).
    responses: BTreeSet<(u64, u64)>,
    serial: u64,
    /// Arrivals the fleet gave it, in time order.
    pub(super) arrivals: VecDeque<Arrival>,
    /// Retries of the calls it refused: (when, the order they were scheduled in).
    retries: BTreeMap<(u64, u64), Arrival>,
    /// Its calls to the counter service not answered yet: (when, worker, token).
    awaiting: BTreeSet<(u64, usize, u32)>,
    /// Per class, since the fleet last took them.
    pub(super) rows: Vec<ClassRow>,
    /// What it forwarded, per policy and caller.
    pub(super) ledger: Ledger,
    /// Requests sent.
    pub(super) requests: u64,
    /// Answers given after they were due.
    pub(super) late_answers: u64,
}

/// What became of a request the filter had, after a step.
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

impl Lane {
    pub(super) fn new(proxy: usize, host: Host, clock: VirtualClock, region: String, classes: usize) -> Self {
        let start = wasm_host::Clock::monotonic_nanos(&clock);
        Self {
            proxy,
            host,
            clock,
            start,
            region,
            open: BTreeMap::new(),
            by_worker: BTreeMap::new(),
            held: BTreeMap::new(),
            responses: BTreeSet::new(),
            serial: 0,
            arrivals: VecDeque::new(),
            retries: BTreeMap::new(),
            awaiting: BTreeSet::new(),
            rows: vec![ClassRow::default(); classes],
            ledger: Ledger::default(),
            requests: 0,
            late_answers: 0,
        }
    }

    /// Moves the proxy's clock to `t` (ns from the start; never backwards).
    pub(super) fn advance_to(&self, t: u64) {
        self.clock.advance_to_monotonic(self.start + t);
    }

    /// The next instant something happens on this proxy (ns from the start).
    pub(super) fn next(&mut self) -> Option<u64> {
        let start = self.start;
        let due = self.host.workers_mut().iter().filter_map(|w| w.next_due()).min().map(|at| at.saturating_sub(start));
        let retry = self.retries.keys().next().map(|(at, _)| *at);
        let arrival = self.arrivals.front().map(|a| a.at);
        [arrival, retry, self.responses.first().map(|(at, _)| *at), due].into_iter().flatten().min()
    }

    /// Everything that happens before `until` (ns from the start) and before the
    /// earliest time a call to the service could be answered (`shortest` after it was
    /// made, for every call not answered yet); where it stopped (every instant before it
    /// is done). After each instant it tells `progress` the calls it made and the time
    /// before which it will make no more, so that they can be decided while it runs on.
    pub(super) fn run(
        &mut self,
        context: Context<'_>,
        until: u64,
        shortest: u64,
        mut progress: impl FnMut(Vec<Call>, u64),
    ) -> u64 {
        let earliest = |awaiting: &BTreeSet<(u64, usize, u32)>| {
            awaiting.first().map_or(u64::MAX, |(at, ..)| at.saturating_add(shortest))
        };
        let mut until = until.min(earliest(&self.awaiting));
        while let Some(t) = self.next().filter(|t| *t < until) {
            self.instant(context, t);
            let made = self.take_calls();
            if !made.is_empty() {
                self.awaiting.extend(made.iter().map(|c| (c.at, c.worker, c.call.token)));
                until = until.min(earliest(&self.awaiting));
            }
            // The clock only moves on: a later call is made at `t` or after.
            progress(made, t);
        }
        let reached = self.next().map_or(until, |t| t.min(until));
        progress(Vec::new(), reached);
        reached
    }

    /// The calls to the counter service its workers made since the last time.
    fn take_calls(&mut self) -> Vec<Call> {
        let (start, proxy) = (self.start, self.proxy);
        let workers = self.host.workers_mut().iter_mut().enumerate();
        let calls = workers.flat_map(|(worker, w)| {
            w.take_deferred().into_iter().map(move |call| Call {
                at: call.dispatched_at.saturating_sub(start),
                proxy,
                worker,
                call,
            })
        });
        calls.collect()
    }

    /// Gives a call its answer; counts it if the answer came after the time it was due
    /// (the fleet's scheduling is meant to make that impossible).
    pub(super) fn answer(&mut self, (worker, token, at, answer): Reply) {
        self.awaiting.remove(&(at, worker, token));
        if let Some(w) = self.host.workers_mut().get_mut(worker) {
            self.late_answers += u64::from(w.answer_deferred(token, answer));
        }
    }

    /// Requests still waiting for the filter, per class.
    pub(super) fn pending(&self, classes: &mut [ClassRow]) {
        for open in self.open.values().filter(|o| o.forwarded.is_none()) {
            if let Some(row) = classes.get_mut(open.arrival.class) {
                row.pending += 1;
            }
        }
    }

    /// Everything due at `t`.
    fn instant(&mut self, context: Context<'_>, t: u64) {
        self.advance_to(t);
        // Per worker touched: the requests it sent or answered now.
        let mut touched: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        let mut due: Vec<Arrival> = Vec::new();
        while let Some(arrival) = self.arrivals.pop_front_if(|a| a.at <= t) {
            due.push(arrival);
        }
        while let Some(entry) = self.retries.first_entry().filter(|e| e.key().0 <= t) {
            due.push(entry.remove());
        }
        due.sort_by_key(|a| (a.at, a.class, a.call));
        for arrival in due {
            let worker = arrival.worker;
            if let Some(key) = self.send(context, arrival) {
                touched.entry(worker).or_default().push(key);
            }
        }
        while let Some((at, key)) = self.responses.first().copied().filter(|(at, _)| *at <= t) {
            self.responses.remove(&(at, key));
            if let Some(open) = self.open.get(&key) {
                let w = open.arrival.worker;
                let usage = context.lab.scenario.callers.get(open.arrival.class).and_then(|c| c.usage);
                let response = match usage {
                    Some(units) => Response::ok().header("x-usage", units.to_string()),
                    None => Response::ok(),
                };
                if let Some(worker) = self.host.workers_mut().get_mut(w) {
                    let _ = worker.respond(open.id, response);
                }
                touched.entry(w).or_default().push(key);
            }
        }
        let now = self.start + t;
        for (w, worker) in self.host.workers_mut().iter_mut().enumerate() {
            if worker.next_due().is_some_and(|at| at <= now) {
                worker.run_pending();
                touched.entry(w).or_default();
            }
        }
        for (w, keys) in touched {
            self.observe(context, w, t, keys);
        }
    }

    /// Sends one request; its key among the open requests.
    fn send(&mut self, context: Context<'_>, arrival: Arrival) -> Option<u64> {
        let lab = context.lab;
        let caller = lab.scenario.callers.get(arrival.class)?;
        let (method, path, headers, source) = match arrival.entry.and_then(|e| lab.log.get(e)) {
            Some(entry) => {
                let source = entry.source.unwrap_or_else(|| SocketAddr::from((Ipv4Addr::new(10, 0, 0, 1), 40_000)));
                (entry.method.clone(), entry.path.clone(), entry.headers.clone(), source)
            }
            None => {
                let identity = format!("{}-{}", caller.name, arrival.key);
                let headers: Vec<(String, String)> = caller
                    .headers
                    .iter()
                    .map(|(name, value)| {
                        (name.clone(), value.replace("{key}", &identity).replace("{region}", &self.region))
                    })
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
        let counted: Vec<(usize, u128, u64)> = context
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
            if let Some(policy) = context.policies.get(*policy) {
                let label = || {
                    let values: Vec<String> = policy
                        .key
                        .iter()
                        .map(|part| match part {
                            sluice::config::KeyPart::Header(name) => {
                                facts_headers.iter().find(|(n, _)| n == name).map_or("-".to_owned(), |(_, v)| v.clone())
                            }
                            sluice::config::KeyPart::ClientAddress { .. } => source.ip().to_string(),
                            // The parts a scenario does not vary are told as configured.
                            other @ (sluice::config::KeyPart::Constant(_)
                            | sluice::config::KeyPart::Authority
                            | sluice::config::KeyPart::Path
                            | sluice::config::KeyPart::Method
                            | sluice::config::KeyPart::QueryParameter(_)
                            | sluice::config::KeyPart::Property(_)) => format!("{other:?}"),
                        })
                        .collect();
                    values.join(" ")
                };
                self.ledger.label(&policy.name, *fingerprint, label);
            }
        }
        let worker = self.host.workers_mut().get_mut(arrival.worker)?;
        let id = worker.request(request);
        self.requests += 1;
        if let Some(row) = self.rows.get_mut(arrival.class) {
            row.offered += 1;
            row.retries += u64::from(arrival.attempt > 0);
        }
        self.serial += 1;
        self.by_worker.entry(arrival.worker).or_default().insert(self.serial);
        self.open.insert(self.serial, Open { arrival, id, forwarded: None, counted });
        Some(self.serial)
    }

    /// What became of worker `w`'s requests after a step: those it holds, and `keys`
    /// (sent or answered in the step). A failed VM may have ended any of them, so then
    /// every one is looked at. In the order they were sent, as if all were looked at:
    /// the others cannot have changed.
    fn observe(&mut self, context: Context<'_>, w: usize, t: u64, keys: Vec<u64>) {
        let failed = self.host.workers_mut().get(w).is_none_or(|worker| worker.is_failed());
        let keys: Vec<u64> = if failed {
            self.by_worker.get(&w).map(|set| set.iter().copied().collect()).unwrap_or_default()
        } else {
            let mut all: BTreeSet<u64> = self.held.get(&w).cloned().unwrap_or_default();
            all.extend(keys);
            all.into_iter().collect()
        };
        let lab = context.lab;
        let upstream = lab.scenario.fleet.upstream_latency.nanos();
        let fallback_header = lab.config.fallback_header.as_str();
        for key in keys {
            let Some(open) = self.open.get_mut(&key) else { continue };
            let Some(worker) = self.host.workers_mut().get_mut(w) else { return };
            let class = open.arrival.class;
            let fate = match worker.outcome(open.id) {
                Ok(Seen::Paused | Seen::ResponsePaused) => Fate::Keep,
                Ok(Seen::Forwarded(_)) if open.forwarded.is_none() => Fate::Forwarded,
                Ok(Seen::Forwarded(_)) => Fate::Upstream,
                Ok(Seen::Responded(response)) if open.forwarded.is_some() => {
                    Fate::Done(response.headers.get_str(fallback_header).map(str::to_owned))
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
                    self.held.entry(w).or_default().remove(&key);
                }
                Fate::Keep => {
                    self.held.entry(w).or_default().insert(key);
                }
                Fate::Forwarded => {
                    self.held.entry(w).or_default().remove(&key);
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
                            if let Some(policy) = context.policies.get(*policy) {
                                let by_fallback = decided_by_fallback(&policy.name);
                                self.ledger.admit(policy, *fingerprint, at, *cost, by_fallback);
                            }
                        }
                    }
                    let _ = worker.finish(open.id);
                    self.close(w, key);
                }
                Fate::Refused { rejected, retry_after } => {
                    let _ = worker.finish(open.id);
                    let caller = lab.scenario.callers.get(class);
                    let next = caller.and_then(|c| retry(c, &open.arrival, t, retry_after, lab.scenario.seed));
                    if let Some(row) = self.rows.get_mut(class) {
                        if rejected {
                            row.rejected += 1;
                        } else {
                            row.failed += 1;
                        }
                        row.calls_refused += u64::from(next.is_none());
                    }
                    self.close(w, key);
                    if let Some(next) = next {
                        self.serial += 1;
                        self.retries.insert((next.at, self.serial), next);
                    }
                }
            }
        }
    }

    /// Requests let through whose upstream has not answered by the end: counted at the
    /// moment they were let through (whether a fallback decided them is not known yet).
    pub(super) fn flush_forwarded(&mut self, policies: &[Policy]) {
        for open in self.open.values() {
            let Some(at) = open.forwarded else { continue };
            for (policy, fingerprint, cost) in &open.counted {
                if let Some(policy) = policies.get(*policy) {
                    self.ledger.admit(policy, *fingerprint, at, *cost, false);
                }
            }
        }
    }

    fn close(&mut self, w: usize, key: u64) -> Option<Open> {
        if let Some(set) = self.by_worker.get_mut(&w) {
            set.remove(&key);
        }
        if let Some(set) = self.held.get_mut(&w) {
            set.remove(&key);
        }
        self.open.remove(&key)
    }
}
