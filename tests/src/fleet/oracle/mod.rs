//! What must hold of the fleet after every step, and at the end.
//!
//! Per request (as it is observed):
//!
//! * **answered**: no stream stays paused longer than [`Scenario::max_pause`];
//! * **no degraded decision from a healthy service**: while the service has been healthy
//!   for a proxy long enough for earlier faults to have passed (a refill window twice,
//!   the breaker's cooldown), and the proxy has called it since (a breaker a fault
//!   opened stays open until a request probes), no answer carries a fallback for a
//!   service reason, nor for a lease that could not serve it (`lease_slot_taken`,
//!   `lease_contended`, `lease_cold`: the service decides those requests by a check).
//!
//! Per proxy (from its metrics and shared data):
//!
//! * **accounting**: `offered = allowed + rejected + queued` for every policy;
//! * **counted**: every policy a fallback header names was counted under some cause
//!   (`degraded.*`, `cas_exhausted`, `store_errors`) at least that often;
//! * **debt**: no lease record owes more than its policy's `max_debt`;
//! * **no trap**, ever.
//!
//! Across the fleet, per global counter (a policy, version and caller: the key the
//! service sees):
//!
//! * **spent ⊆ granted**: every unit admitted through a lease (the request was forwarded
//!   and the fallback header does not name this policy) came from a grant of that
//!   counter that was live when it was spent: granted at or before, and not past the
//!   life the service gave it, or from a check the service admitted on that counter
//!   while the request was in flight (a request its lease could not serve is checked at
//!   the service). This catches lost updates, tokens spent after their life (a lease
//!   outliving its window), and requests admitted without spending at all;
//! * **checked ⊆ admitted**: every unit admitted through a check was admitted by the
//!   service for that counter, before;
//! * **lease ledger**: per lease policy, the units the proxies spent from their leases,
//!   returned to the service and counted as expired add up to no more than they were
//!   granted: a returned token is neither spent nor expired too;
//! * **the budget**: what the service granted and admitted on one counter fits the
//!   policy's numbers (the loosest a reload put in force for that version), replayed in
//!   the service's own time, from its last restart;
//! * **emergency caps**: what a proxy's cap admitted for one caller fits the cap;
//! * **counter bound**: every unit the service counted on one counter (grants, admitted
//!   checks, and charges: of costs the responses reported above their estimates, and of
//!   admissions made without it), less what credits gave back, replayed in the service's
//!   own time from its last restart under the loosest numbers in force for that version
//!   (across a rollout: the larger burst and the larger rate), never goes past them by
//!   more than the debt the policy allows (`max_debt`) plus what the service counted as
//!   forgiven outside charges (a carry-over's cap). A counter that starts over, or whose
//!   debt is forgiven silently, admits beyond it ([`bound`]);
//! * **clamp bound**: while an operator's clamp applies to a counter (counted on the
//!   service's clock from when it was set to its expiry or removal, by the precedence the
//!   service documents), what the service counts on it fits the clamp's numbers too,
//!   with the debt bound capped at the clamp's capacity; a bypass admits without
//!   spending only where one applies;
//! * **forgiven**: a charge is charged or forgiven whole (`charged + forgiven = cost`),
//!   and forgives only what does not fit below the debt bound asked for: the counter is
//!   empty after it, and a bucket owes its `burst + max_debt` (within one unit).
//!
//! Per proxy, its own counters ([`local`]):
//!
//! * **local bound**: a local policy's units (estimates spent on arrival, costs reported
//!   above them charged and below them given back when the response ends) fit its
//!   loosest numbers per caller, plus the debt a local bucket may owe (`64 × max`) and
//!   what the proxy counted as forgiven; twice them once a caller may have spilled into
//!   the overflow bucket;
//! * **in flight**: a concurrency policy's forwarded, unanswered requests per caller never
//!   outnumber its limit.
//!
//! At the end, after a quiet, healthy period: every stream is answered, no lease
//! record holds anything (no debt, no tokens): no slot is held by a key that is gone,
//! and **costs settled**: for every policy whose response reports its cost, what the
//! proxy charged, credited and forgave adds up to how far the answers' costs were from
//! the estimates spent on them (each answer settled once, none lost), plus, for a stream
//! whose client left while shaping may have held it (admitted: its cost unknown), what
//! `on_unknown` makes of it; a stream whose client left while it waited for the service
//! settles nothing (it gives back what it spent, as a rejection does). A lease spend of
//! such a policy counts only the part of the estimate the answer used: the rest went
//! back to the lease.

mod bound;
mod ledger;
mod local;
mod observed;
mod overrides;

pub use observed::{Body, Next, Observed, Report, Sent, Violation};

use super::scenario::{Algorithm, Failure, Kind, PolicyDef, Scenario};
use super::service::{Decision, Mode};
use bound::Watched;
use local::{Local, LocalEvent, LocalKey};
use observed::{parse_fallback, parse_overridden};
use overrides::Watch;
use sluice::host::{Counter, Reason};
use sluice_testkit::bucket::{ReferenceBucket, latency_slack};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// One policy a request matched.
#[derive(Clone, Debug)]
struct Matched {
    policy: PolicyDef,
    /// The caller's key value.
    value: String,
    /// The global counter's key, as the service sees it.
    counter: Option<String>,
    cost: u64,
}

/// A stream the oracle follows.
#[derive(Clone, Debug)]
struct Followed {
    proxy: usize,
    arrived: u64,
    matched: Vec<Matched>,
    forwarded_at: Option<u64>,
}

/// The reasons that say the service could not decide.
const SERVICE_REASONS: [&str; 11] = [
    "timeout",
    "refused",
    "reset",
    "bad_status",
    "bad_body",
    "unauthorized",
    "circuit_open",
    "dispatch_failed",
    // A lease that cannot serve a request while the service is healthy has it checked
    // there instead (issue 39): never a degraded decision.
    "lease_slot_taken",
    "lease_contended",
    // A cold key is checked at the service, never leased, never degraded while it answers.
    "lease_cold",
];

/// The checks and what they have seen.
pub struct Oracle {
    /// When the run started (times in findings are from here).
    start: u64,
    max_pause: u64,
    /// How long after a fault a healthy service may still see its effects.
    linger: u64,
    /// Per proxy: since when the service has been healthy for it (`None`: it is not).
    healthy_since: Vec<Option<u64>>,
    /// Per proxy: when it first called the service since the service last turned healthy
    /// for it (the fleet's transport records it). A breaker opened by a fault stays open
    /// until a request probes, however long a proxy that never calls waits.
    probes: Arc<Mutex<Vec<Option<u64>>>>,
    hash_key: shared_store::HashKey,
    streams: BTreeMap<u64, Followed>,
    /// Per counter: units spent through leases: (the request's arrival, its admission,
    /// units). A policy spends at some moment of the request's life, not necessarily when
    /// the whole request is admitted (another policy may still make it wait).
    lease_spends: BTreeMap<String, Vec<(u64, u64, u64)>>,
    /// Per counter: what each spend was (for findings).
    spend_notes: BTreeMap<String, Vec<String>>,
    /// Per counter: units admitted through checks.
    check_admits: BTreeMap<String, Vec<(u64, u64)>>,
    /// Per counter: the policy (name, version) it belongs to.
    counters: BTreeMap<String, (String, u64)>,
    /// Per (name, version): every form the policy took (reloads).
    forms: BTreeMap<(String, u64), Vec<PolicyDef>>,
    /// Per (proxy, policy, version, caller): the emergency cap's replay.
    caps: BTreeMap<(usize, String, u64, String), ReferenceBucket>,
    /// Per (proxy, policy): answers whose fallback header named it.
    named: BTreeMap<(usize, String), u64>,
    /// Per (proxy, policy): the units by which the costs its answers reported differ from
    /// the estimates spent on them, which settling must charge, credit or forgive.
    to_settle: BTreeMap<(usize, String), u64>,
    /// Per (proxy, policy): what streams whose clients left while a shaping policy may
    /// have held them may add. Delayed by shaping, a request was admitted, and its cost
    /// is then unknown (`on_unknown`, a stream cut short); waiting for the counter
    /// service, it was not, and gives back what it spent (nothing to settle).
    may_settle: BTreeMap<(usize, String), u64>,
    /// Decisions of the service already checked against the counters' bounds.
    budget_seen: usize,
    /// Per global counter: its replay under the loosest numbers in force.
    budgets: BTreeMap<String, Watched>,
    /// Units the service's charges forgave, as their answers said.
    charge_forgiven: u64,
    /// Per counter: units of debt a carry-over forgave (the answers' `carry_forgiven`).
    carry_forgiven: BTreeMap<String, u64>,
    /// The overrides the service took.
    overrides: Vec<Watch>,
    /// The proxies' wall clock minus their monotonic clock (local windows align to it).
    real_offset: u64,
    /// The run's start on the proxies' wall clock.
    start_real: u64,
    /// How long after its arrival a request may first be known to be admitted.
    local_lag: u64,
    /// Local counters' events not yet replayed: (wall clock, order, counter, event).
    local_pending: Vec<(u64, u64, LocalKey, LocalEvent)>,
    local_seq: u64,
    locals: BTreeMap<LocalKey, Local>,
    steps: u64,
    note: String,
}

impl Oracle {
    /// The oracle of `scenario`, whose run starts at `start` (the proxies' monotonic
    /// clock), their wall clock reading `real_offset` more.
    pub fn new(scenario: &Scenario, start: u64, real_offset: u64) -> Self {
        let window = scenario.timeout_ms + 100;
        // Every form a policy will take: the numbers in force are the loosest of all of
        // them from the start (a budget replayed under one set of numbers must not be
        // surprised by a reload it has not seen yet).
        let forms = scenario.forms();
        let max_pause = std::env::var("SLUICE_FLEET_MAX_PAUSE_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(scenario.max_pause().as_nanos() as u64, |ms| ms * 1_000_000);
        Self {
            start,
            max_pause,
            linger: Duration::from_millis(2 * window + scenario.cooldown_ms + 50).as_nanos() as u64,
            healthy_since: vec![Some(start); scenario.proxies],
            probes: Arc::new(Mutex::new(vec![None; scenario.proxies])),
            hash_key: shared_store::HashKey::global(super::HASH_KEY.as_bytes()),
            streams: BTreeMap::new(),
            lease_spends: BTreeMap::new(),
            spend_notes: BTreeMap::new(),
            check_admits: BTreeMap::new(),
            counters: BTreeMap::new(),
            forms,
            caps: BTreeMap::new(),
            named: BTreeMap::new(),
            to_settle: BTreeMap::new(),
            may_settle: BTreeMap::new(),
            budget_seen: 0,
            budgets: BTreeMap::new(),
            charge_forgiven: 0,
            carry_forgiven: BTreeMap::new(),
            overrides: Vec::new(),
            real_offset,
            start_real: start + real_offset,
            // Forwarded within the longest pause, answered within 3 ms, then seen.
            local_lag: max_pause + 5_000_000,
            local_pending: Vec::new(),
            local_seq: 0,
            locals: BTreeMap::new(),
            steps: 0,
            note: String::new(),
        }
    }

    /// Takes the note of the stream the oracle saw last (for the trace).
    pub fn take_note(&mut self) -> String {
        std::mem::take(&mut self.note)
    }

    /// Where the fleet's transport records, per proxy, its first call to a healthy
    /// service (and the fleet forgets it when the service stops being healthy for it).
    pub fn probes(&self) -> Arc<Mutex<Vec<Option<u64>>>> {
        self.probes.clone()
    }

    /// The service changed how it behaves for `proxy` (every proxy: `None`).
    pub fn service_mode(&mut self, proxy: Option<usize>, mode: Mode, now: u64) {
        let mut probes = self.probes.lock().unwrap_or_else(PoisonError::into_inner);
        for (p, since) in self.healthy_since.iter_mut().enumerate() {
            if proxy.is_none_or(|x| x == p) {
                if !mode.is_healthy()
                    && let Some(probe) = probes.get_mut(p)
                {
                    *probe = None;
                }
                *since = match (mode.is_healthy(), *since) {
                    (true, Some(since)) => Some(since),
                    (true, None) => Some(now),
                    (false, _) => None,
                };
            }
        }
    }

    /// Proxy `proxy` now runs `policies`.
    pub fn reloaded(&mut self, _proxy: usize, policies: &[PolicyDef], _now: u64) {
        for p in policies {
            let forms = self.forms.entry((p.name.clone(), p.version)).or_default();
            if !forms.contains(p) {
                forms.push(p.clone());
            }
        }
    }

    fn counter(&mut self, policy: &PolicyDef, value: &str) -> String {
        let mut hasher = self.hash_key.fingerprinter(&policy.name, policy.version);
        hasher.part(value.as_bytes());
        let key = sluice::engine::namespace::hex128(hasher.finish());
        self.counters.entry(key.clone()).or_insert_with(|| (policy.name.clone(), policy.version));
        key
    }

    fn matches(&mut self, sent: &Sent, policies: &[PolicyDef]) -> Vec<Matched> {
        let mut out = Vec::new();
        for policy in policies {
            if policy.under_a && !sent.under_a {
                continue;
            }
            let value = sent.value(policy.header).to_owned();
            let counter = policy.is_global().then(|| self.counter(policy, &value));
            let cost = if policy.max_cost > 1 { sent.cost.clamp(1, policy.max_cost) } else { 1 };
            out.push(Matched { policy: policy.clone(), value, counter, cost });
        }
        out
    }

    /// Follows stream `key` of `proxy`, now `observed`; `policies` are those it arrived
    /// under (used the first time it is seen).
    #[allow(clippy::too_many_arguments)]
    pub fn stream(
        &mut self,
        proxy: usize,
        key: u64,
        arrived: u64,
        sent: &Sent,
        policies: &[PolicyDef],
        observed: &Observed,
        now: u64,
    ) -> Result<Next, Violation> {
        if !self.streams.contains_key(&key) {
            let matched = self.matches(sent, policies);
            self.streams.insert(key, Followed { proxy, arrived, matched, forwarded_at: None });
        }
        let Some(followed) = self.streams.get(&key).cloned() else { return Ok(Next::Keep) };
        match observed {
            Observed::Paused => {
                if now.saturating_sub(arrived) > self.max_pause {
                    return Err(Violation::new(
                        "answered",
                        format!(
                            "a request of proxy {proxy} ({sent:?}) has been paused {:.1} ms, more than the {:.1} ms \
                             the filter promises",
                            (now - arrived) as f64 / 1e6,
                            self.max_pause as f64 / 1e6
                        ),
                    ));
                }
                Ok(Next::Keep)
            }
            Observed::Forwarded => {
                if let Some(f) = self.streams.get_mut(&key)
                    && f.forwarded_at.is_none()
                {
                    f.forwarded_at = Some(now);
                }
                Ok(Next::Upstream)
            }
            Observed::Answered { status, local, fallback, overridden } => {
                self.streams.remove(&key);
                self.answered(&followed, sent, *status, *local, fallback.as_deref(), overridden.as_deref(), now)?;
                Ok(Next::Done)
            }
            Observed::Reset | Observed::Gone => {
                self.streams.remove(&key);
                self.note = format!("{observed:?}");
                let shaped =
                    followed.matched.iter().any(|m| matches!(m.policy.algorithm, Algorithm::LeakyBucket { .. }));
                for m in followed.matched.iter().filter(|_| shaped) {
                    if let Some(usage) = m.policy.usage {
                        let unknown = usage.on_unknown.unwrap_or(m.cost).abs_diff(m.cost);
                        *self.may_settle.entry((proxy, m.policy.name.clone())).or_insert(0) += unknown;
                    }
                }
                Ok(Next::Done)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn answered(
        &mut self,
        followed: &Followed,
        sent: &Sent,
        status: u16,
        local: bool,
        fallback: Option<&str>,
        overridden: Option<&str>,
        now: u64,
    ) -> Result<(), Violation> {
        let proxy = followed.proxy;
        let (kind, reason, mut named) = parse_fallback(fallback);
        self.note = format!("{status}{}", fallback.map(|f| format!(" [{f}]")).unwrap_or_default());
        for name in &named {
            *self.named.entry((proxy, name.clone())).or_insert(0) += 1;
        }
        if kind.is_some() && named.is_empty() {
            // A filter that does not say which policies fell back (an older build):
            // assume all of its global ones did, never blaming it for what a fallback
            // admitted; the per-policy conservation below still holds it to account.
            named = followed.matched.iter().filter(|m| m.counter.is_some()).map(|m| m.policy.name.clone()).collect();
        }
        // A lease policy whose cost the response reports is not checked yet when its lease
        // cannot serve it (the filter README): it keeps the failure rule for these reasons.
        // The header's reason is its first policy's (the others may have failed for
        // reasons of their own, such as `lease_queue_full`).
        let settled_lease_only = ["lease_slot_taken", "lease_contended"].contains(&reason.unwrap_or(""))
            && named.first().is_some_and(|name| {
                followed.matched.iter().any(|m| {
                    &m.policy.name == name && matches!(m.policy.kind, Kind::Lease { .. }) && m.policy.usage.is_some()
                })
            });
        if let Some(reason) = reason
            && SERVICE_REASONS.contains(&reason)
            && !settled_lease_only
            && let Some(since) = self.healthy_since.get(proxy).copied().flatten()
            && since.saturating_add(self.linger) <= followed.arrived
            && let Some(probe) =
                self.probes.lock().unwrap_or_else(PoisonError::into_inner).get(proxy).copied().flatten()
            && probe.saturating_add(self.linger) <= followed.arrived
        {
            return Err(Violation::new(
                "healthy",
                format!(
                    "proxy {proxy}: a healthy service (since {:.1} ms before the request) produced a degraded \
                     decision: {status} {}",
                    (followed.arrived - since) as f64 / 1e6,
                    fallback.unwrap_or("")
                ),
            ));
        }
        if local {
            return Ok(());
        }
        // Admitted: each global policy it matched paid for it, or fell back (named).
        let Some(at) = followed.forwarded_at else { return Ok(()) };
        let bypassed = parse_overridden(overridden, "bypass");
        for m in &followed.matched {
            // What the response reported settles the estimate, whoever decided it.
            let actual = sent.actual(&m.policy, m.cost);
            if m.policy.kind == Kind::Local && !matches!(m.policy.algorithm, Algorithm::Concurrency { .. }) {
                // Spent when it arrived; settled when its response ended (now).
                let key = (proxy, m.policy.name.clone(), m.policy.version, m.value.clone());
                let (arrived, ended) = (followed.arrived + self.real_offset, now + self.real_offset);
                self.local_event(arrived, key.clone(), LocalEvent::Spend(m.cost));
                match actual {
                    Some(actual) if actual > m.cost => self.local_event(ended, key, LocalEvent::Spend(actual - m.cost)),
                    Some(actual) if actual < m.cost => {
                        self.local_event(ended, key, LocalEvent::Credit(m.cost - actual, arrived));
                    }
                    _ => {}
                }
            }
            // A check-mode policy that failed open, or that an operator's bypass let
            // through, spent nowhere: nothing to settle.
            let spent_nowhere = m.policy.kind == Kind::Check
                && ((named.contains(&m.policy.name) && !matches!(m.policy.failure, Failure::Emergency { .. }))
                    || bypassed.contains(&m.policy.name));
            if let Some(actual) = actual.filter(|_| !spent_nowhere) {
                *self.to_settle.entry((proxy, m.policy.name.clone())).or_insert(0) += actual.abs_diff(m.cost);
            }
            let Some(counter) = &m.counter else { continue };
            if named.contains(&m.policy.name) {
                // Only requests decided within a millisecond of their arrival are replayed
                // (a cap spends when the failure rule runs, which for a request that then
                // waits is earlier than its admission; a subset of a bucket's admissions
                // always fits it), at their admission, a millisecond's refill of slack.
                if let Failure::Emergency { rate, burst, .. } = m.policy.failure
                    && at.saturating_sub(followed.arrived) <= 1_000_000
                {
                    // A caller's cap is its slot's bucket, or, while its slot is another
                    // caller's, the table's overflow bucket: between the two it may spend
                    // one burst more than one bucket holds (shared-store's slot tables).
                    let slack = latency_slack(rate, 1_000_000_000, 1_000_000);
                    let cap = self
                        .caps
                        .entry((proxy, m.policy.name.clone(), m.policy.version, m.value.clone()))
                        .or_insert_with(|| ReferenceBucket::new(rate, 1_000_000_000, 2 * burst + slack));
                    // A cap that could not decide falls to the action: only an `allow`
                    // may admit beyond it, and then the cap was not spent.
                    let allow = matches!(m.policy.failure, Failure::Emergency { allow: true, .. });
                    // A cost the response reports settles the cap too: an unused estimate
                    // went back to it.
                    let spent = actual.map_or(m.cost, |actual| actual.min(m.cost));
                    if !cap.admit(at, spent) && !allow {
                        return Err(Violation::new(
                            "emergency cap",
                            format!(
                                "proxy {proxy}, policy {} caller {}: admitted beyond its emergency cap \
                                 ({rate}/s, burst {burst}, and the overflow bucket's burst) failing closed: {sent:?}",
                                m.policy.name, m.value
                            ),
                        ));
                    }
                }
                continue;
            }
            if matches!(m.policy.kind, Kind::Lease { .. }) {
                let arrived = followed.arrived.saturating_sub(self.start) as f64 / 1e6;
                let note = format!(
                    "proxy {proxy}: {sent:?} arrived {arrived:.3} ms, forwarded {:.3} ms, {status} {fallback:?}",
                    at.saturating_sub(self.start) as f64 / 1e6
                );
                self.spend_notes.entry(counter.clone()).or_default().push(note);
            }
            match m.policy.kind {
                Kind::Lease { .. } => {
                    // An estimate the response did not use went back to the lease (and may
                    // be spent again); a cost above it is taken later, or owed.
                    let spent = actual.map_or(m.cost, |actual| actual.min(m.cost));
                    self.lease_spends.entry(counter.clone()).or_default().push((followed.arrived, at, spent));
                }
                Kind::Check => self.check_admits.entry(counter.clone()).or_default().push((at, m.cost)),
                Kind::Local => {}
            }
        }
        Ok(())
    }

    /// The per-proxy checks.
    pub fn proxy(
        &mut self,
        proxy: usize,
        host: &wasm_host::Host,
        policies: &[PolicyDef],
        now: u64,
    ) -> Result<(), Violation> {
        let traps = host.traps();
        if let Some(trap) = traps.first() {
            return Err(Violation::new("no trap", format!("proxy {proxy}: a worker trapped: {trap:?}")));
        }
        let metric = |policy: &str, counter: Counter| policy_metric(host, policy, counter);
        let mut names: BTreeSet<String> = policies.iter().map(|p| p.name.clone()).collect();
        names.extend(self.forms.keys().map(|(n, _)| n.clone()));
        for name in &names {
            let offered = metric(name, Counter::Offered);
            let sum = metric(name, Counter::Allowed) + metric(name, Counter::Rejected) + metric(name, Counter::Queued);
            if offered != sum {
                return Err(Violation::new(
                    "accounting",
                    format!("proxy {proxy}, policy {name}: offered {offered} != allowed + rejected + queued {sum}"),
                ));
            }
            // Every failure class the filter counts, and its store's own failures.
            let causes: u64 = Reason::ALL
                .iter()
                .map(|reason| reason.counter())
                .chain([Counter::CasExhausted, Counter::StoreErrors])
                .map(|counter| metric(name, counter))
                .sum();
            let named = self.named.get(&(proxy, name.clone())).copied().unwrap_or(0);
            if named > causes {
                return Err(Violation::new(
                    "counted",
                    format!(
                        "proxy {proxy}, policy {name}: {named} answers name it in their fallback header, but only \
                         {causes} degraded decisions were counted"
                    ),
                ));
            }
        }
        self.steps += 1;
        if self.steps.is_multiple_of(25) {
            self.debts(proxy, host, policies, false)?;
        }
        self.in_flight(proxy, host)?;
        self.local_bound(proxy, host, now + self.real_offset, false)
    }

    fn debts(
        &self,
        proxy: usize,
        host: &wasm_host::Host,
        policies: &[PolicyDef],
        settled: bool,
    ) -> Result<(), Violation> {
        for (key, value) in host.shared_data().entries() {
            let key = String::from_utf8_lossy(&key).into_owned();
            // sluice/<plugin>/<root>/l/<policy>/v<version>/<slot>
            let parts: Vec<&str> = key.split('/').collect();
            let ["sluice", _, _, "l", name, version, slot] = parts.as_slice() else { continue };
            if *slot == "meta" {
                continue;
            }
            let Some(record) = sluice::engine::inspect_lease_record(&value) else { continue };
            let version: u64 = version.trim_start_matches('v').parse().unwrap_or(0);
            let max_debt = self
                .forms
                .get(&(name.to_string(), version))
                .into_iter()
                .flatten()
                .filter_map(|p| match p.kind {
                    Kind::Lease { max_debt, .. } => Some(max_debt),
                    _ => None,
                })
                .max()
                .unwrap_or(0);
            if record.debt > max_debt {
                return Err(Violation::new(
                    "debt",
                    format!("proxy {proxy}: lease record {key} owes {} > max_debt {max_debt}", record.debt),
                ));
            }
            // A table of a version no longer configured is abandoned, and so is the
            // service's counter its debt belonged to.
            let configured = policies.iter().any(|p| p.name == *name && p.version == version);
            if settled && configured && (record.debt > 0 || record.charging > 0) {
                return Err(Violation::new(
                    "settled",
                    format!(
                        "proxy {proxy}: after a quiet, healthy end, lease record {key} still owes {} ({} in a \
                         charge): its slot is held by a key that is gone",
                        record.debt, record.charging
                    ),
                ));
            }
        }
        Ok(())
    }

    /// What must hold at the end.
    pub fn settled(
        &mut self,
        proxy: usize,
        host: &wasm_host::Host,
        policies: &[PolicyDef],
        now: u64,
    ) -> Result<(), Violation> {
        self.proxy(proxy, host, policies, now)?;
        self.local_bound(proxy, host, now + self.real_offset, true)?;
        self.debts(proxy, host, policies, true)?;
        self.costs_settled(proxy, host)
    }

    /// Every answer's reported cost was settled once: what each policy charged, credited
    /// and forgave adds up to how far the reported costs were from the estimates.
    fn costs_settled(&self, proxy: usize, host: &wasm_host::Host) -> Result<(), Violation> {
        let keys: BTreeSet<&(usize, String)> = self.to_settle.keys().chain(self.may_settle.keys()).collect();
        for (p, name) in keys {
            if *p != proxy {
                continue;
            }
            let key = (*p, name.clone());
            let expected = self.to_settle.get(&key).copied().unwrap_or(0);
            let may = self.may_settle.get(&key).copied().unwrap_or(0);
            let metric = |counter: Counter| policy_metric(host, name, counter);
            let settled = metric(Counter::CostCharged) + metric(Counter::CostCredited) + metric(Counter::CostForgiven);
            if !(expected..=expected + may).contains(&settled) {
                return Err(Violation::new(
                    "costs settled",
                    format!(
                        "proxy {proxy}, policy {name}: the answers' costs differ from their estimates by {expected} \
                         units in all (and streams whose clients left while shaping may have held them by {may} \
                         more), but {settled} were charged, credited or forgiven (charged {}, credited {}, forgiven \
                         {})",
                        metric(Counter::CostCharged),
                        metric(Counter::CostCredited),
                        metric(Counter::CostForgiven)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The fleet-wide checks against what the service decided; `proxies` are every
    /// proxy's host.
    pub fn service(
        &mut self,
        decisions: &[Decision],
        forgiven: (u64, u64),
        proxies: &[&wasm_host::Host],
        now: u64,
    ) -> Result<(), Violation> {
        let _ = now;
        self.counter_bounds(decisions, forgiven)?;
        if !self.steps.is_multiple_of(20) {
            return Ok(());
        }
        self.spent_within_grants(decisions)?;
        self.checked_within_admissions(decisions)?;
        self.conservation(decisions, proxies)?;
        self.lease_ledger(decisions, proxies)
    }
}

/// A counter of a proxy's (`sluice.<policy>.<counter>`), named by the filter's own
/// [`Counter`]: a misspelt counter does not compile, where a name would read 0.
pub(super) fn policy_metric(host: &wasm_host::Host, policy: &str, counter: Counter) -> u64 {
    host.metric(&sluice::series::policy_metric("sluice", policy, counter)).unwrap_or(0)
}
