//! Global overshoot: every request the fleet forwarded, per policy and caller (the
//! filter's own key fingerprint), replayed in time order through an exact reference
//! token bucket of the policy's numbers (`sluice-testkit`'s, written apart from the
//! filter's). What the reference would have refused (spending nothing for it) is what
//! the fleet admitted above the budget: for a local policy on N proxies under constant
//! overload, (N − 1) × (burst + rate × T). Each policy also gets the bound its documentation promises, and the
//! admissions beyond that bound are counted apart.
//!
//! | policy | promised bound (per caller, on top of the budget) |
//! |---|---|
//! | local | none fleet-wide: each proxy keeps its own budget, so N proxies may admit N× |
//! | global, check | the tokens that refill during the longest callout (decisions are replayed at forward time) |
//! | global, lease | `rate × duration` of a grant, plus the same |
//!
//! Admissions made by a fallback (fail open, the emergency cap) are outside every bound:
//! the filter counts them (`failure_allowed`, `emergency.allowed`) and the report shows
//! them beside the overshoot. Only token buckets are replayed; other algorithms report
//! their admissions without a reference.

use shared_store::Limit;
use sluice::config::{Policy, Strategy};
use sluice_testkit::bucket::{ReferenceBucket, latency_slack};
use std::collections::{BTreeMap, HashMap};

/// One forwarded request as a policy counted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Admit {
    at: u64,
    cost: u64,
    /// The policy's numbers when it was admitted (a configuration change may raise or
    /// lower them mid-run), as an index into [`Ledger::limits`]: a long run keeps
    /// millions of admissions.
    limit: u32,
    /// Admitted by a fallback (fail open, the emergency cap): outside every promise.
    fallback: bool,
}

/// What the fleet forwarded, per policy and caller.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Per policy name, its callers.
    policies: BTreeMap<String, Callers>,
    /// Every policy's numbers seen during the run.
    limits: Vec<Limit>,
}

/// A policy's callers by fingerprint. Hashed, not ordered: every request looks its
/// caller up, and a run has tens of thousands of them; the replay sorts them.
type Callers = HashMap<u128, Caller, foldhash::fast::FixedState>;

/// One caller of a policy.
#[derive(Debug, Default, PartialEq, Eq)]
struct Caller {
    /// A readable name (its identity as the scenario or the log gave it).
    label: Option<String>,
    /// What the policy admitted for it.
    admits: Vec<Admit>,
}

/// How many of a policy's busiest callers have their remaining allowance plotted.
pub const TOP_CALLERS: usize = 3;

/// The promise a policy is held to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Promise {
    /// A local policy: each proxy has its own budget.
    PerProxy,
    /// Global: at most `slack` tokens beyond the budget per caller.
    Global {
        /// Tokens allowed beyond the budget.
        slack: u64,
    },
    /// Not a token bucket: no reference.
    Unreplayed,
}

/// A policy's overshoot over the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyOvershoot {
    /// The policy.
    pub policy: String,
    /// Admissions the reference bucket (the budget exactly) would have refused, per
    /// report interval.
    pub per_row: Vec<u64>,
    /// All of them.
    pub total: u64,
    /// The promise.
    pub promise: Promise,
    /// Admissions beyond the promise (a reference bucket with the promise's slack),
    /// fallback admissions excepted.
    pub beyond_promise: u64,
    /// Admissions a fallback made (outside the promise; they still spend the
    /// reference's budget).
    pub by_fallback: u64,
    /// The busiest callers (most admissions): their name and the budget's remaining
    /// allowance for them at each interval's end, as the reference bucket has it.
    pub top: Vec<(String, Vec<u64>)>,
}

impl Ledger {
    /// Records that `policy` admitted `cost` for caller `fingerprint` at `at` ns.
    /// `fallback`: a fallback admitted it (the filter's fallback header named the
    /// policy).
    pub fn admit(&mut self, policy: &Policy, fingerprint: u128, at: u64, cost: u64, fallback: bool) {
        let limit = match self.limits.iter().position(|l| *l == policy.limit) {
            Some(index) => index,
            None => {
                self.limits.push(policy.limit);
                self.limits.len() - 1
            }
        };
        let limit = u32::try_from(limit).unwrap_or(u32::MAX);
        self.with_caller(&policy.name, fingerprint, |caller| caller.admits.push(Admit { at, cost, limit, fallback }));
    }

    /// Changes caller `fingerprint` of policy `name`. Looked up by `&str`: a request
    /// allocates nothing here.
    fn with_caller(&mut self, name: &str, fingerprint: u128, change: impl FnOnce(&mut Caller)) {
        if !self.policies.contains_key(name) {
            let _ = self.policies.insert(name.to_owned(), Callers::default());
        }
        if let Some(callers) = self.policies.get_mut(name) {
            change(callers.entry(fingerprint).or_default());
        }
    }

    /// Adds what `other` (another proxy's ledger) recorded: its admissions after this
    /// one's, its names where this one has none.
    pub fn absorb(&mut self, other: Self) {
        let limits: Vec<u32> = other
            .limits
            .iter()
            .map(|limit| {
                let index = self.limits.iter().position(|l| l == limit).unwrap_or_else(|| {
                    self.limits.push(*limit);
                    self.limits.len() - 1
                });
                u32::try_from(index).unwrap_or(u32::MAX)
            })
            .collect();
        for (policy, callers) in other.policies {
            let mine = self.policies.entry(policy).or_default();
            for (fingerprint, caller) in callers {
                let renumbered = caller
                    .admits
                    .into_iter()
                    .map(|a| Admit { limit: limits.get(a.limit as usize).copied().unwrap_or(u32::MAX), ..a });
                let into = mine.entry(fingerprint).or_default();
                into.admits.extend(renumbered);
                if into.label.is_none() {
                    into.label = caller.label;
                }
            }
        }
    }

    /// Names caller `fingerprint` of `policy` (the first name given is kept).
    pub fn label(&mut self, policy: &str, fingerprint: u128, label: impl FnOnce() -> String) {
        self.with_caller(policy, fingerprint, |caller| {
            if caller.label.is_none() {
                caller.label = Some(label());
            }
        });
    }

    /// Replays every caller's admissions; `policies` are the configuration's (the last
    /// one's, after a change), `max_callout` the longest callout round trip in ns.
    pub fn overshoot(&self, policies: &[Policy], interval: u64, rows: usize, max_callout: u64) -> Vec<PolicyOvershoot> {
        policies
            .iter()
            .filter(|p| !p.shadow)
            .map(|policy| {
                let mut per_row = vec![0; rows];
                let mut beyond_promise = 0;
                let mut by_fallback = 0;
                let promise = promise(policy, max_callout);
                // In fingerprint order, those it admitted something for.
                let mut callers_of: Vec<(&u128, &Caller)> = self
                    .policies
                    .get(policy.name.as_str())
                    .map(|callers| callers.iter().filter(|(_, c)| !c.admits.is_empty()).collect())
                    .unwrap_or_default();
                callers_of.sort_unstable_by_key(|(fingerprint, _)| **fingerprint);
                let mut busiest: Vec<(usize, u128)> =
                    callers_of.iter().map(|(fingerprint, caller)| (caller.admits.len(), **fingerprint)).collect();
                busiest.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                busiest.truncate(TOP_CALLERS);
                let mut top = Vec::new();
                for (fingerprint, caller) in callers_of {
                    let slack = match promise {
                        Promise::Global { slack } => slack,
                        Promise::PerProxy | Promise::Unreplayed => 0,
                    };
                    let mut sorted = caller.admits.clone();
                    sorted.sort_by_key(|a| a.at);
                    let limit_of = |admit: &Admit| self.limits.get(admit.limit as usize).copied();
                    let mut references: Option<(Limit, ReferenceBucket, ReferenceBucket)> = None;
                    let tracked = busiest.iter().any(|(_, f)| f == fingerprint);
                    let mut remaining = Vec::new();
                    let sample =
                        |remaining: &mut Vec<u64>,
                         until: u64,
                         references: &Option<(Limit, ReferenceBucket, ReferenceBucket)>| {
                            while remaining.len() < rows && (remaining.len() as u64 + 1) * interval <= until {
                                let end = (remaining.len() as u64 + 1) * interval;
                                let left = match (references, sorted.first().and_then(limit_of)) {
                                    (Some((_, exact, _)), _) => exact.remaining(end),
                                    (None, Some(Limit::TokenBucket { burst, .. })) => burst,
                                    (None, _) => 0,
                                };
                                remaining.push(left);
                            }
                        };
                    for admit in &sorted {
                        if tracked {
                            sample(&mut remaining, admit.at, &references);
                        }
                        let Some(limit @ Limit::TokenBucket { rate, burst, .. }) = limit_of(admit) else { continue };
                        let (amount, per) = (rate.amount(), rate.per().0);
                        // New numbers carry the allowance left over, capped, as the filter
                        // and the service do.
                        let carried = |old: Option<&ReferenceBucket>, capacity: u64| {
                            let mut fresh = ReferenceBucket::new(amount, per, capacity);
                            if let Some(old) = old {
                                let left = old.remaining(admit.at).min(capacity);
                                fresh.charge(admit.at, capacity - left);
                            }
                            fresh
                        };
                        let (exact, promised) = match &mut references {
                            Some((current, exact, promised)) if *current == limit => (exact, promised),
                            slot => {
                                let exact = carried(slot.as_ref().map(|r| &r.1), burst);
                                let promised = carried(slot.as_ref().map(|r| &r.2), burst.saturating_add(slack));
                                let (_, exact, promised) = slot.insert((limit, exact, promised));
                                (exact, promised)
                            }
                        };
                        // A refusal of the reference spends nothing: the overshoot is what
                        // was admitted beyond what the budget allowed, not a debt.
                        if !exact.admit(admit.at, admit.cost) {
                            let row = usize::try_from(admit.at / interval.max(1)).unwrap_or(usize::MAX);
                            if let Some(slot) = per_row.get_mut(row.min(rows.saturating_sub(1))) {
                                *slot += 1;
                            }
                        }
                        // A fallback's admission is outside the promise: it is counted
                        // apart and does not spend the promise's allowance.
                        if admit.fallback {
                            by_fallback += 1;
                        } else if !promised.admit(admit.at, admit.cost) && matches!(promise, Promise::Global { .. }) {
                            beyond_promise += 1;
                        }
                    }
                    if tracked && matches!(sorted.first().and_then(limit_of), Some(Limit::TokenBucket { .. })) {
                        sample(&mut remaining, u64::MAX, &references);
                        let label = caller.label.clone().unwrap_or_else(|| format!("{fingerprint:032x}"));
                        top.push((label, remaining));
                    }
                }
                let total = per_row.iter().sum();
                PolicyOvershoot {
                    policy: policy.name.clone(),
                    per_row,
                    total,
                    promise,
                    beyond_promise,
                    by_fallback,
                    top,
                }
            })
            .collect()
    }
}

/// What the documentation promises `policy`.
pub fn promise(policy: &Policy, max_callout: u64) -> Promise {
    // The reference is a token bucket: a match that names every algorithm, so that a
    // new one says here whether its admissions can be replayed.
    let rate = match policy.limit {
        Limit::TokenBucket { rate, .. } => rate,
        Limit::LeakyBucket { .. }
        | Limit::FixedWindow { .. }
        | Limit::SlidingWindow { .. }
        | Limit::SlidingLog { .. }
        | Limit::Concurrency { .. } => return Promise::Unreplayed,
    };
    let Some(global) = &policy.global else { return Promise::PerProxy };
    let (amount, per) = (rate.amount(), rate.per().0);
    let latency = latency_slack(amount, per, max_callout);
    let slack = match global.strategy {
        Strategy::Check => latency,
        Strategy::Lease(lease) => latency.saturating_add(latency_slack(amount, per, lease.duration().0)),
    };
    Promise::Global { slack }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice::config::Config;

    fn policy(rate: &str) -> Policy {
        let json =
            format!(r#"{{"policies":[{{"name":"p","key":[{{"header":"x-user"}}],"rate":"{rate}","burst":2}}]}}"#);
        let mut policies = Config::from_json(json.as_bytes()).expect("the configuration is valid").policies;
        policies.remove(0)
    }

    #[test]
    fn a_ledger_absorbed_into_another_replays_as_one_ledger_of_both_would() {
        // Two proxies' ledgers, the policy's numbers changed mid-run (so the second
        // ledger numbers its limits in another order).
        let (slow, fast) = (policy("1/second"), policy("10/second"));
        let ms = 1_000_000;
        let first = [(&slow, 1, 0), (&slow, 1, 10 * ms), (&slow, 1, 20 * ms), (&fast, 2, 30 * ms)];
        let second = [(&fast, 1, 5 * ms), (&slow, 2, 15 * ms), (&slow, 1, 25 * ms), (&fast, 1, 35 * ms)];
        let (mut whole, mut a, mut b) = (Ledger::default(), Ledger::default(), Ledger::default());
        for (policy, caller, at) in first {
            a.admit(policy, caller, at, 1, false);
            whole.admit(policy, caller, at, 1, false);
        }
        for (policy, caller, at) in second {
            b.admit(policy, caller, at, 1, caller == 2);
            whole.admit(policy, caller, at, 1, caller == 2);
        }
        a.label("p", 1, || "one".to_owned());
        b.label("p", 1, || "another name".to_owned());
        b.label("p", 2, || "two".to_owned());
        whole.label("p", 1, || "one".to_owned());
        whole.label("p", 2, || "two".to_owned());

        a.absorb(b);

        let policies = [fast];
        assert_eq!(a.overshoot(&policies, 10 * ms, 4, ms), whole.overshoot(&policies, 10 * ms, 4, ms));
        assert_eq!(a.policies, whole.policies);
        assert!(whole.overshoot(&policies, 10 * ms, 4, ms)[0].total > 0, "the budget is overshot");
    }
}
