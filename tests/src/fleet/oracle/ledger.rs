//! The fleet-wide checks: what the service granted and admitted against what the proxies
//! spent, and against each counter's budget.

use super::bound::{Replay, Watched};
use super::{Oracle, Violation, policy_metric};
use crate::fleet::scenario::{Algorithm, PolicyDef};
use crate::fleet::service::Decision;
use sluice::host::Counter;
use std::collections::{BTreeMap, BTreeSet};

impl Oracle {
    /// Per global policy, from the proxies' own metrics (whatever their fallback header
    /// says): requests it let through other than by its failure rule
    /// (`allowed - failure_allowed - emergency.allowed`, over every proxy) never exceed
    /// the units the service granted it (lease) or admitted for it (check), less the
    /// leased tokens the proxies returned (credits on a counter every form of whose
    /// policy is leased: a lease policy's spends are never refunded, so its credits are
    /// returns). A request admitted without paying, or paid with a returned token, and
    /// not counted as a fallback, shows here.
    pub(super) fn conservation(&self, decisions: &[Decision], proxies: &[&wasm_host::Host]) -> Result<(), Violation> {
        let mut paid: BTreeMap<&str, u64> = BTreeMap::new();
        let mut returned: BTreeMap<&str, u64> = BTreeMap::new();
        for decision in decisions {
            let (key, units, into) = match decision {
                Decision::Grant { key, granted, .. } => (key, *granted, &mut paid),
                Decision::Check { key, cost, .. } => (key, *cost, &mut paid),
                Decision::Credit { key, credited, duplicate: false, .. } if self.leased_only(key) => {
                    (key, *credited, &mut returned)
                }
                _ => continue,
            };
            if let Some((name, _)) = self.counters.get(key) {
                *into.entry(name.as_str()).or_insert(0) += units;
            }
        }
        let names: BTreeSet<&str> = self
            .forms
            .iter()
            .filter(|(_, f)| f.iter().any(PolicyDef::is_global))
            .map(|((n, _), _)| n.as_str())
            .collect();
        for name in names {
            let metric = |host: &wasm_host::Host, counter: Counter| policy_metric(host, name, counter);
            let through: u64 = proxies
                .iter()
                .map(|h| {
                    metric(h, Counter::Allowed)
                        .saturating_sub(metric(h, Counter::FailureAllowed) + metric(h, Counter::EmergencyAllowed))
                })
                .sum();
            let given_back = returned.get(name).copied().unwrap_or(0);
            let units = paid.get(name).copied().unwrap_or(0);
            if through + given_back > units {
                return Err(Violation::new(
                    "conservation",
                    format!(
                        "policy {name}: the proxies let {through} requests through it other than by its failure rule, \
                         but the service granted or admitted only {units} units for it, {given_back} of them \
                         returned: requests were admitted without paying (or with returned tokens) and without \
                         being counted as fallbacks"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Per lease policy, fleet-wide, in units: what the proxies spent from their leases
    /// (the units of every request admitted through the policy, less those a check at
    /// the service decided instead), what they returned and what they counted as expired
    /// never add up to more than they were granted (`lease.granted`): a token is spent,
    /// returned or expired once. Tokens still live, debt repaid from grants, spends given
    /// back, and expiries not yet counted (a record not written since) only leave room.
    /// A token returned and then spent, or returned and then counted as expired, shows.
    pub(super) fn lease_ledger(&self, decisions: &[Decision], proxies: &[&wasm_host::Host]) -> Result<(), Violation> {
        let mut spent: BTreeMap<&str, u64> = BTreeMap::new();
        for (counter, spends) in &self.lease_spends {
            if let Some((name, _)) = self.counters.get(counter)
                && self.leased_only(counter)
            {
                *spent.entry(name.as_str()).or_insert(0) += spends.iter().map(|(_, _, units)| units).sum::<u64>();
            }
        }
        let mut checked: BTreeMap<&str, u64> = BTreeMap::new();
        for decision in decisions {
            if let Decision::Check { key, cost, .. } = decision
                && let Some((name, _)) = self.counters.get(key)
            {
                *checked.entry(name.as_str()).or_insert(0) += cost;
            }
        }
        // Only policies every form of which is leased.
        let mixed: BTreeSet<&str> = self
            .counters
            .iter()
            .filter(|(key, _)| !self.leased_only(key))
            .map(|(_, (name, _))| name.as_str())
            .collect();
        for (name, spent) in spent {
            if mixed.contains(name) {
                continue;
            }
            let metric = |counter: Counter| proxies.iter().map(|h| policy_metric(h, name, counter)).sum::<u64>();
            let (granted, returned, expired) =
                (metric(Counter::LeaseGranted), metric(Counter::LeaseReturned), metric(Counter::LeaseExpired));
            let from_leases = spent.saturating_sub(checked.get(name).copied().unwrap_or(0));
            if from_leases + returned + expired > granted {
                return Err(Violation::new(
                    "lease ledger",
                    format!(
                        "policy {name}: the proxies were granted {granted} tokens, but spent {from_leases} from their \
                         leases, returned {returned} and counted {expired} as expired: a token was used twice"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether every form of the policy whose counter `key` is is leased.
    fn leased_only(&self, key: &str) -> bool {
        self.counters
            .get(key)
            .and_then(|named| self.forms.get(named))
            .is_some_and(|forms| forms.iter().all(|f| matches!(f.kind, crate::fleet::scenario::Kind::Lease { .. })))
    }

    pub(super) fn spent_within_grants(&self, decisions: &[Decision]) -> Result<(), Violation> {
        for (counter, spends) in &self.lease_spends {
            // Grants as (granted at, expiring at, tokens left). A check the service
            // admitted on a lease counter (a request its lease could not serve, decided
            // by the service instead) pays for a spend made exactly then: a grant that
            // lives for an instant.
            let mut grants: Vec<(u64, u64, u64)> = decisions
                .iter()
                .filter_map(|d| match d {
                    Decision::Grant { key, granted, at, life, .. } if key == counter => {
                        Some((*at, at.saturating_add(*life), *granted))
                    }
                    Decision::Check { key, cost, at, .. } if key == counter => Some((*at, *at, *cost)),
                    _ => None,
                })
                .collect();
            // Each spend happened at some moment between its request's arrival and its
            // admission: match it to the grant that was live then and expires first,
            // spends in the order their windows close.
            let mut ordered = spends.clone();
            ordered.sort_unstable_by_key(|(from, until, _)| (*until, *from));
            for (from, until, units) in ordered {
                let mut need = units;
                while need > 0 {
                    let usable = grants
                        .iter_mut()
                        .filter(|(granted, expires, left)| *left > 0 && *granted <= until && *expires >= from)
                        .min_by_key(|(_, expires, _)| *expires);
                    let Some(grant) = usable else {
                        let (name, version) = self.counters.get(counter).cloned().unwrap_or_default();
                        let grants: Vec<String> = decisions
                            .iter()
                            .filter_map(|d| match d {
                                Decision::Grant { key, granted, at, life, .. } if key == counter => Some(format!(
                                    "{granted} at {:.3} ms for {:.0} ms",
                                    at.saturating_sub(self.start) as f64 / 1e6,
                                    *life as f64 / 1e6
                                )),
                                Decision::Check { key, cost, at, .. } if key == counter => Some(format!(
                                    "check {cost} at {:.3} ms",
                                    at.saturating_sub(self.start) as f64 / 1e6
                                )),
                                _ => None,
                            })
                            .collect();
                        let notes = self.spend_notes.get(counter).cloned().unwrap_or_default();
                        return Err(Violation::new(
                            "spent within grants",
                            format!(
                                "policy {name} v{version}, counter {counter}: {units} unit(s) admitted through its \
                                 lease by a request of {:.3}..{:.3} ms, with no grant live then to pay for them \
                                 (spent {} in all, granted {}); grants {grants:?}; spends {notes:#?}",
                                from.saturating_sub(self.start) as f64 / 1e6,
                                until.saturating_sub(self.start) as f64 / 1e6,
                                spends.iter().map(|s| s.2).sum::<u64>(),
                                decisions
                                    .iter()
                                    .map(|d| match d {
                                        Decision::Grant { key, granted, .. } if key == counter => *granted,
                                        _ => 0,
                                    })
                                    .sum::<u64>()
                            ),
                        ));
                    };
                    let take = grant.2.min(need);
                    grant.2 -= take;
                    need -= take;
                }
            }
        }
        Ok(())
    }

    pub(super) fn checked_within_admissions(&self, decisions: &[Decision]) -> Result<(), Violation> {
        for (counter, admits) in &self.check_admits {
            let mut events: Vec<(u64, u8, u64)> = decisions
                .iter()
                .filter_map(|d| match d {
                    Decision::Check { key, cost, at, .. } if key == counter => Some((*at, 0, *cost)),
                    _ => None,
                })
                .collect();
            events.extend(admits.iter().map(|(at, units)| (*at, 1, *units)));
            events.sort_unstable();
            let mut available: u64 = 0;
            for (at, kind, units) in events {
                if kind == 0 {
                    available += units;
                } else if available >= units {
                    available -= units;
                } else {
                    let (name, version) = self.counters.get(counter).cloned().unwrap_or_default();
                    return Err(Violation::new(
                        "checked within admissions",
                        format!(
                            "policy {name} v{version}, counter {counter}: admitted through a check at {:.3} ms \
                             that the service never admitted",
                            at.saturating_sub(self.start) as f64 / 1e6
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Replays the service's new decisions through each counter's bound, and each
    /// clamped counter's clamp; checks what each charge forgave. `forgiven` is what the
    /// service counted as forgiven so far (its metrics, across restarts): by charges, and
    /// by carrying counters over to other numbers.
    pub(super) fn counter_bounds(&mut self, decisions: &[Decision], forgiven: (u64, u64)) -> Result<(), Violation> {
        let (forgiven, carried) = forgiven;
        let first = self.budget_seen;
        let fresh = decisions.get(first..).unwrap_or_default().to_vec();
        self.budget_seen = decisions.len();
        for decision in &fresh {
            if let Decision::Charge { duplicate: false, forgiven, .. } = decision {
                self.charge_forgiven += forgiven;
            }
        }
        // What the service's metrics count as forgiven by charges beyond what their answers
        // said (nothing, for a service whose answers are true): any counter may have been
        // given that. What a carry-over forgave is the counter's own (below).
        let _ = carried;
        let slack = forgiven.saturating_sub(self.charge_forgiven);
        for (index, decision) in fresh.into_iter().enumerate() {
            let index = first + index;
            let (key, spend, at, overridden, what) = match decision {
                Decision::Restart { .. } => {
                    self.budgets.clear();
                    self.overrides_lost(index);
                    continue;
                }
                Decision::Grant { key, granted, service_at, overridden, spec, .. } => {
                    (key, Effect::Spend(granted), service_at, overridden, format!("grant {granted} ({spec})"))
                }
                Decision::Check { key, cost, service_at, overridden, .. } => {
                    (key, Effect::Spend(cost), service_at, overridden, format!("check {cost}"))
                }
                Decision::Charge { duplicate: true, .. } => continue,
                ref charge @ Decision::Charge {
                    ref key,
                    charged,
                    cost,
                    forgiven,
                    max_debt,
                    service_at,
                    overridden,
                    ..
                } => {
                    self.check_forgiven(charge)?;
                    let what = format!("charge {cost} max_debt {max_debt}: charged {charged}, forgiven {forgiven}");
                    (key.clone(), Effect::Spend(charged), service_at, overridden, what)
                }
                Decision::Credit { key, credited, spent_at, service_at, duplicate: false, overridden }
                    if credited > 0 =>
                {
                    let what = format!("credit {credited} spent at {:.3} ms", ms(spent_at));
                    (key, Effect::Credit { units: credited, spent_at }, service_at, overridden, what)
                }
                Decision::Credit { .. } => continue,
                Decision::CarryForgiven { keys, units, service_at } => {
                    self.carried_over(&keys, units, service_at)?;
                    continue;
                }
            };
            let Some((name, version)) = self.counters.get(&key).cloned() else { continue };
            let applies = self.applicable(index, &key, &name, version, at);
            let by = overridden.map(|o| format!(" [{} {}]", o.kind.name(), o.id)).unwrap_or_default();
            let line = format!("{:.3} ms {what}{by}", ms(at));
            if let Some(applied) = overridden
                && applied.kind == sluice_protocol::OverrideKind::Bypass
            {
                // Admitted without spending: only where a bypass applies.
                let bypass = applies.and_then(|i| self.overrides.get(i)).is_some_and(|w| w.clamp.is_none());
                if !bypass && matches!(spend, Effect::Spend(units) if units > 0) {
                    return Err(Violation::new(
                        "clamp bound",
                        format!(
                            "policy {name} v{version}, counter {key}: the service let {line} through without \
                             spending under a bypass ({}), but no bypass applies to it then",
                            applied.id
                        ),
                    ));
                }
                continue;
            }
            let Some(forms) = self.forms.get(&(name.clone(), version)) else { continue };
            let global: Vec<&PolicyDef> = forms.iter().filter(|p| p.is_global()).collect();
            let Some(numbers) = global.iter().map(|p| p.algorithm).reduce(Algorithm::loosest) else { continue };
            let allowance = global.iter().map(|p| p.max_debt()).max().unwrap_or(0);
            let watched = self.budgets.entry(key.clone()).or_insert_with(|| Watched::new(numbers, allowance));
            watched.note(line.clone());
            let past = spend.apply(&mut watched.replay, at);
            let carried = self.carry_forgiven.get(&key).copied().unwrap_or(0);
            if past > watched.allowance + slack + carried {
                return Err(Violation::new(
                    "counter bound",
                    format!(
                        "policy {name} v{version}, counter {key}: at {:.3} ms (the service's clock) the service had \
                         counted {past} units past {numbers:?} (the loosest numbers in force), beyond the debt the \
                         policy allows ({}) and what it counted as forgiven outside charges ({}): over some \
                         interval more was admitted than the numbers and the debt bound allow (a counter started \
                         over, or its debt was forgiven silently); last decisions on it {:#?}",
                        ms(at),
                        watched.allowance,
                        slack + carried,
                        watched.history
                    ),
                ));
            }
            // Under a clamp, the clamp's numbers bound the counter too.
            let Some(index) = applies else { continue };
            let Some(watch) = self.overrides.get_mut(index) else { continue };
            let Some(clamp) = watch.clamp else { continue };
            let allowance = allowance.min(clamp.capacity());
            let clamped = watch.replays.entry(key.clone()).or_insert_with(|| Watched::new(clamp, allowance));
            clamped.note(line);
            let past = spend.apply(&mut clamped.replay, at);
            if past > clamped.allowance + slack + carried {
                return Err(Violation::new(
                    "clamp bound",
                    format!(
                        "policy {name} v{version}, counter {key}: under clamp {} ({clamp:?}, until {:.3} ms on the \
                         service's clock{}), the service counted {past} units past the clamp's numbers at {:.3} ms, \
                         beyond its debt bound ({}); decisions under it {:#?}",
                        watch.id,
                        ms(watch.until),
                        if watch.keyed.is_some() { ", for this caller" } else { ", for the whole policy" },
                        ms(at),
                        clamped.allowance,
                        clamped.history
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A carry-over forgave `units` of debt on one of `keys` (the counters of one call):
    /// only where the numbers changed (counter-service/README.md: debt is kept up to the
    /// new capacity, the rest forgiven and counted). Each of them may have been given
    /// that much.
    fn carried_over(&mut self, keys: &[String], units: u64, at: u64) -> Result<(), Violation> {
        let changed = |oracle: &Self, key: &String| {
            oracle.counters.get(key).and_then(|id| oracle.forms.get(id)).is_some_and(|forms| forms.len() > 1)
        };
        if !keys.iter().any(|k| changed(self, k)) {
            return Err(Violation::new(
                "forgiven",
                format!(
                    "at {:.3} ms the service forgave {units} units of debt carrying over one of {keys:?}, whose \
                     policy's numbers never changed",
                    ms(at)
                ),
            ));
        }
        for key in keys {
            *self.carry_forgiven.entry(key.clone()).or_insert(0) += units;
        }
        Ok(())
    }

    /// A charge is charged or forgiven whole, and forgives only what does not fit below
    /// the debt bound the proxy asked for (counter-service/README.md, "Bounded debt").
    fn check_forgiven(&self, charge: &Decision) -> Result<(), Violation> {
        let Decision::Charge { key, charged, cost, forgiven, max_debt, limit, service_at, after, overridden, .. } =
            charge
        else {
            return Ok(());
        };
        let (name, version) = self.counters.get(key).cloned().unwrap_or_default();
        let bypassed = overridden.is_some_and(|o| o.kind == sluice_protocol::OverrideKind::Bypass);
        let what = format!(
            "policy {name} v{version}, counter {key}: a charge of {cost} (max_debt {max_debt}, {limit:?}) at {:.3} \
             ms was charged {charged} and forgave {forgiven}",
            ms(*service_at)
        );
        if charged + forgiven != *cost {
            return Err(Violation::new("forgiven", format!("{what}: units lost without being counted")));
        }
        if *forgiven == 0 || bypassed {
            return Ok(());
        }
        let (_, remaining, reset_after_ns) = *after;
        if remaining > 0 {
            return Err(Violation::new("forgiven", format!("{what}, though {remaining} units were left after it")));
        }
        if overridden.is_none()
            && let sluice_protocol::LimitSpec::TokenBucket { amount, per_ms, burst } = *limit
        {
            // Past the bound, a bucket owes burst + max_debt, less than one unit.
            let owed = u128::from(burst + (*max_debt).min(burst)).saturating_sub(1);
            let at_least = owed * u128::from(per_ms) * 1_000_000 / u128::from(amount.max(1));
            if u128::from(reset_after_ns) < at_least {
                return Err(Violation::new(
                    "forgiven",
                    format!(
                        "{what}, though the counter owed only {reset_after_ns} ns of refill after it, less than its \
                         burst and debt bound ({at_least} ns): it forgave what it should have owed"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What a decision does to a counter.
#[derive(Clone, Copy, Debug)]
enum Effect {
    /// Units counted.
    Spend(u64),
    /// Units given back, spent at `spent_at`.
    Credit { units: u64, spent_at: u64 },
}

impl Effect {
    /// Applies it to `replay` at `at`: how far past its numbers the counter is then.
    fn apply(self, replay: &mut Replay, at: u64) -> u64 {
        match self {
            Self::Spend(units) => replay.spend(at, units),
            Self::Credit { units, spent_at } => {
                replay.credit(at, spent_at, units);
                0
            }
        }
    }
}

/// Nanoseconds of the service's clock as milliseconds of the run (the clock starts at a
/// round second: the last 1000 s are shown).
fn ms(ns: u64) -> f64 {
    (ns % 1_000_000_000_000) as f64 / 1e6
}
