//! What operators' overrides do to a decision request, before the store decides it.
//!
//! An entry is matched by its scope ([`Scope`]): an override keyed to its exact key (and
//! policy version) applies before one for its whole policy, which needs the request to
//! name the policy. Within one scope a clamp applies before a bypass (the protective
//! word wins), and the override set last before older ones.
//!
//! * A **bypass** takes the entry out of the store's hands: it is admitted without
//!   spending ([`bypassed`]), a lease of it granted in full, a charge or credit of it
//!   forgiven (nothing was spent under the bypass, so nothing is settled).
//! * A **clamp** replaces the entry's limit with the clamp's, on the same counter: the
//!   store carries the counter over to the lower numbers as it does for any change of
//!   numbers (`shared_store::Limit::adopt`), so nothing already spent is forgotten, and
//!   back again when the clamp ends. A clamp that would not lower the entry's limit
//!   (another algorithm, or a number that lets more through: the policy changed since
//!   the clamp was set) is not applied; a clamp never raises a limit.
//!
//! The overrides read here are a snapshot ([`OverrideSet`]) the app refreshes when one
//! is set or removed through this instance, and on every sweep (for Redis, where another
//! instance may have set one): `--sweep-interval-ms` bounds how late an instance obeys.
//! Expiry needs no refresh: an override stops applying at its `expires_at_ms`.

use std::collections::HashMap;

use shared_store::{Decision, Nanos, Verdict};
use sluice_protocol::{AppliedOverride, OverrideId, OverrideKind};

use crate::api::{PlannedEntry, Scope};
use crate::call::{Call, Outcome};
use crate::overrides::Override;
use crate::spec::StoreLimit;
use crate::store::{ChargeOutcome, CheckOutcome, CreditOutcome, LeaseOutcome};

/// The live overrides, indexed for matching an entry.
#[derive(Clone, Debug, Default)]
pub struct OverrideSet {
    /// Policy-wide overrides, by policy name; each list in order of precedence.
    by_policy: HashMap<String, Vec<Override>>,
    /// Keyed overrides, by key hash (each for one policy version); each list in order
    /// of precedence.
    by_key: HashMap<String, Vec<Override>>,
}

impl OverrideSet {
    /// Indexes `overrides`.
    pub fn new(overrides: Vec<Override>) -> Self {
        let mut set = Self::default();
        for item in overrides {
            match &item.key {
                Some(key) => set.by_key.entry(key.hash.clone()).or_default().push(item),
                None => set.by_policy.entry(item.policy.clone()).or_default().push(item),
            }
        }
        let precedence = |a: &Override, b: &Override| {
            let clamp_first = |o: &Override| o.kind != OverrideKind::Clamp;
            (clamp_first(a), std::cmp::Reverse((a.created_at_ms, &a.id)))
                .cmp(&(clamp_first(b), std::cmp::Reverse((b.created_at_ms, &b.id))))
        };
        set.by_policy.values_mut().chain(set.by_key.values_mut()).for_each(|list| list.sort_by(precedence));
        set
    }

    /// Whether there is nothing to apply (the common case: one branch per request).
    pub fn is_empty(&self) -> bool {
        self.by_policy.is_empty() && self.by_key.is_empty()
    }

    /// The override that applies to `scope` at `now_ms`, if any.
    pub fn find(&self, scope: &Scope, now_ms: u64) -> Option<&Override> {
        // A keyed override's hash covers the policy's name, so the key (and version)
        // alone identifies it.
        let keyed = self.by_key.get(&scope.key).and_then(|list| {
            list.iter().find(|o| o.is_live(now_ms) && o.key.as_ref().is_some_and(|k| k.policy_version == scope.version))
        });
        keyed.or_else(|| {
            let list = self.by_policy.get(scope.policy.as_ref()?)?;
            list.iter().find(|o| o.is_live(now_ms))
        })
    }
}

/// What an override does to one entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Admitted without spending.
    Bypass(AppliedOverride),
    /// Decided under these lower numbers.
    Clamp(AppliedOverride, StoreLimit),
}

impl Effect {
    /// Which override, and what kind.
    pub const fn applied(&self) -> AppliedOverride {
        match self {
            Self::Bypass(applied) | Self::Clamp(applied, _) => *applied,
        }
    }
}

/// What the overrides in `set` do to `entry` at `now_ms`: `None` when none applies, or
/// when a clamp would not lower its limit.
pub fn effect(set: &OverrideSet, entry: &PlannedEntry, now_ms: u64) -> Option<Effect> {
    let item = set.find(&entry.scope, now_ms)?;
    let applied = AppliedOverride { id: OverrideId::parse(&item.id)?, kind: item.kind };
    match (item.kind, item.limit) {
        (OverrideKind::Bypass, _) => Some(Effect::Bypass(applied)),
        (OverrideKind::Clamp, Some(spec)) if spec.admits_at_most(&entry.limit.spec) => {
            StoreLimit::new(spec).ok().map(|limit| Effect::Clamp(applied, limit))
        }
        (OverrideKind::Clamp, _) => None,
    }
}

/// A call with the overrides applied: what the store is to decide, and which override
/// decided each entry of the original call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Enforced {
    /// The call for the store when overrides changed it (clamped entries under the
    /// clamp's numbers, bypassed entries left out); `None` with `changed` false: the
    /// original call as it is.
    call: Option<Call>,
    changed: bool,
    /// Per entry of the original call (one for a lease, charge or credit), the override
    /// that decided it; empty when none did.
    applied: Vec<Option<AppliedOverride>>,
}

impl Enforced {
    /// Applies `set` to `call` at `now_ms`.
    pub fn new(call: &Call, set: &OverrideSet, now_ms: u64) -> Self {
        if set.is_empty() {
            return Self::default();
        }
        let effects: Vec<Option<Effect>> = entries(call).iter().map(|e| effect(set, e, now_ms)).collect();
        if effects.iter().all(Option::is_none) {
            return Self::default();
        }
        let applied = effects.iter().map(|e| e.as_ref().map(Effect::applied)).collect();
        let mut store_call = call.clone();
        let first = effects.first().and_then(Option::as_ref);
        let keep = match (&mut store_call, first) {
            (Call::Check(plan), _) => {
                let mut kept = Vec::with_capacity(plan.entries.len());
                for (entry, effect) in plan.entries.drain(..).zip(&effects) {
                    match effect {
                        Some(Effect::Bypass(_)) => {}
                        Some(Effect::Clamp(_, limit)) => kept.push(PlannedEntry { limit: limit.clone(), ..entry }),
                        None => kept.push(entry),
                    }
                }
                plan.entries = kept;
                !plan.entries.is_empty()
            }
            (_, Some(Effect::Bypass(_))) => false,
            (Call::Lease(plan), Some(Effect::Clamp(_, limit))) => {
                // A lease asks for at most the capacity: under the clamp, the clamp's.
                plan.tokens = plan.tokens.min(limit.capacity());
                plan.min_tokens = plan.min_tokens.min(plan.tokens);
                plan.entry.limit = limit.clone();
                true
            }
            (Call::Charge(plan), Some(Effect::Clamp(_, limit))) => {
                plan.max_debt = plan.max_debt.min(limit.capacity());
                plan.entry.limit = limit.clone();
                true
            }
            (Call::Credit(plan), Some(Effect::Clamp(_, limit))) => {
                if limit.creditable() {
                    plan.entry.limit = limit.clone();
                }
                true
            }
            (_, None) => true,
        };
        Self { call: keep.then_some(store_call), changed: true, applied }
    }

    /// What the store is to decide: `None` when every entry is bypassed.
    pub fn store_call<'a>(&'a self, original: &'a Call) -> Option<&'a Call> {
        if self.changed { self.call.as_ref() } else { Some(original) }
    }

    /// The override that decided entry `index` of the original call, if one did.
    pub fn applied(&self, index: usize) -> Option<AppliedOverride> {
        self.applied.get(index).copied().flatten()
    }

    /// Every override that decided an entry, with the entry's position.
    pub fn all_applied(&self) -> impl Iterator<Item = (usize, AppliedOverride)> + '_ {
        self.applied.iter().enumerate().filter_map(|(i, a)| a.map(|a| (i, a)))
    }

    fn bypassed(&self, index: usize) -> bool {
        self.applied(index).is_some_and(|a| a.kind == OverrideKind::Bypass)
    }

    /// The outcome of the original call: the store's (for what it decided, `None` when
    /// it decided nothing) with every bypassed entry admitted without spending, at `now`.
    pub fn complete(&self, original: &Call, decided: Option<Outcome>, now: Nanos) -> Option<Outcome> {
        if !self.changed {
            return decided;
        }
        Some(match (original, decided) {
            (Call::Check(plan), decided) => {
                let (admitted, at, mut decisions) = match decided {
                    Some(Outcome::Check(o)) => (o.admitted, o.at, o.decisions.into_iter()),
                    None => (true, now, Vec::new().into_iter()),
                    Some(_) => return None,
                };
                let mut all = Vec::with_capacity(plan.entries.len());
                for (index, entry) in plan.entries.iter().enumerate() {
                    all.push(if self.bypassed(index) { bypassed_decision(entry) } else { decisions.next()? });
                }
                Outcome::Check(CheckOutcome { admitted, at, decisions: all })
            }
            (_, Some(outcome)) => outcome,
            (Call::Lease(plan), None) => Outcome::Lease(LeaseOutcome {
                granted: plan.tokens,
                expires_in_ms: plan.ttl_ms,
                at: now,
                decision: bypassed_decision(&plan.entry),
                refill_after: Nanos::ZERO,
            }),
            (Call::Charge(plan), None) => Outcome::Charge(ChargeOutcome {
                charged: 0,
                forgiven: plan.entry.cost,
                duplicate: false,
                at: now,
                decision: bypassed_decision(&plan.entry),
            }),
            (Call::Credit(plan), None) => Outcome::Credit(CreditOutcome {
                credited: 0,
                forgiven: plan.entry.cost,
                duplicate: false,
                at: now,
                decision: bypassed_decision(&plan.entry),
            }),
        })
    }
}

/// The entries of `call`, in order.
fn entries(call: &Call) -> Vec<&PlannedEntry> {
    match call {
        Call::Check(plan) => plan.entries.iter().collect(),
        Call::Lease(plan) => vec![&plan.entry],
        Call::Charge(plan) => vec![&plan.entry],
        Call::Credit(plan) => vec![&plan.entry],
    }
}

/// A bypassed entry's answer: admitted, nothing spent, so its whole capacity remains.
fn bypassed_decision(entry: &PlannedEntry) -> Decision {
    let capacity = entry.limit.capacity();
    Decision { verdict: Verdict::Allowed, limit: capacity, remaining: capacity, reset_after: Nanos::ZERO }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overrides::KeyScope;
    use sluice_protocol::LimitSpec;

    fn bucket(burst: u64) -> LimitSpec {
        LimitSpec::TokenBucket { amount: 10, per_ms: 1000, burst }
    }

    fn item(id: u64, kind: OverrideKind, key: Option<&str>, created_at_ms: u64) -> Override {
        Override {
            id: format!("ovr-{id:016x}"),
            kind,
            policy: "per-tenant".to_owned(),
            limit: (kind == OverrideKind::Clamp).then_some(bucket(2)),
            key: key.map(|hash| KeyScope { policy_version: 0, hash: hash.to_owned() }),
            created_at_ms,
            expires_at_ms: 10_000,
            reason: "r".to_owned(),
            operator: "o".to_owned(),
        }
    }

    fn entry(key: &str, policy: Option<&str>, limit: LimitSpec) -> PlannedEntry {
        PlannedEntry {
            storage_key: format!("sluice:{{{key}}}:v0:{key}"),
            limit: StoreLimit::new(limit).unwrap(),
            cost: 1,
            scope: Scope { policy: policy.map(str::to_owned), version: 0, key: key.to_owned() },
        }
    }

    fn kind_for(set: &OverrideSet, e: &PlannedEntry, now_ms: u64) -> Option<(u64, OverrideKind)> {
        effect(set, e, now_ms).map(|e| (e.applied().id.0, e.applied().kind))
    }

    #[test]
    fn a_keyed_override_comes_before_a_policy_wide_one_and_a_clamp_before_a_bypass() {
        let set = OverrideSet::new(vec![
            item(1, OverrideKind::Clamp, None, 0),
            item(2, OverrideKind::Bypass, Some("a"), 0),
            item(3, OverrideKind::Clamp, Some("b"), 0),
            item(4, OverrideKind::Bypass, Some("b"), 5),
        ]);

        assert_eq!(kind_for(&set, &entry("a", Some("per-tenant"), bucket(10)), 0), Some((2, OverrideKind::Bypass)));
        assert_eq!(kind_for(&set, &entry("b", Some("per-tenant"), bucket(10)), 0), Some((3, OverrideKind::Clamp)));
        assert_eq!(kind_for(&set, &entry("c", Some("per-tenant"), bucket(10)), 0), Some((1, OverrideKind::Clamp)));
        assert_eq!(kind_for(&set, &entry("c", None, bucket(10)), 0), None, "a policy-wide override needs the name");
        assert_eq!(kind_for(&set, &entry("a", Some("per-tenant"), bucket(10)), 10_000), None, "expired");
        let other_version = PlannedEntry {
            scope: Scope { version: 1, ..entry("a", None, bucket(10)).scope },
            ..entry("a", None, bucket(10))
        };
        assert_eq!(kind_for(&set, &other_version, 0), None, "a keyed override is for its policy version only");
    }

    #[test]
    fn of_two_clamps_for_one_scope_the_one_set_last_applies() {
        let mut later = item(7, OverrideKind::Clamp, None, 9);
        later.limit = Some(bucket(3));
        let set = OverrideSet::new(vec![item(6, OverrideKind::Clamp, None, 1), later]);

        let applied = effect(&set, &entry("a", Some("per-tenant"), bucket(10)), 0);

        assert!(matches!(applied, Some(Effect::Clamp(a, limit)) if a.id.0 == 7 && limit.capacity() == 3));
    }

    #[test]
    fn a_clamp_that_would_raise_the_entrys_limit_is_not_applied() {
        let set = OverrideSet::new(vec![item(1, OverrideKind::Clamp, None, 0)]);
        let window = LimitSpec::FixedWindow { limit: 100, window_ms: 1000 };

        assert_eq!(kind_for(&set, &entry("a", Some("per-tenant"), bucket(1)), 0), None, "burst 2 > 1");
        assert_eq!(kind_for(&set, &entry("a", Some("per-tenant"), window), 0), None, "another algorithm");
    }

    #[test]
    fn a_check_keeps_its_other_entries_and_a_bypassed_one_is_admitted_with_its_whole_capacity() {
        let set = OverrideSet::new(vec![item(2, OverrideKind::Bypass, Some("a"), 0)]);
        let plan = crate::api::CheckPlan {
            entries: vec![entry("a", Some("per-tenant"), bucket(10)), entry("b", Some("per-tenant"), bucket(10))],
        };
        let call = Call::Check(plan);

        let enforced = Enforced::new(&call, &set, 0);
        let Some(Call::Check(left)) = enforced.store_call(&call) else { panic!("a check for the store") };
        let decided = CheckOutcome {
            admitted: false,
            at: Nanos(5),
            decisions: vec![Decision {
                verdict: Verdict::Rejected { retry_after: Nanos(1) },
                limit: 10,
                remaining: 0,
                reset_after: Nanos(1),
            }],
        };
        let Some(Outcome::Check(all)) = enforced.complete(&call, Some(Outcome::Check(decided)), Nanos(9)) else {
            panic!("a check's outcome")
        };

        assert_eq!(left.entries.iter().map(|e| e.scope.key.as_str()).collect::<Vec<_>>(), ["b"]);
        assert_eq!((all.admitted, all.at, all.decisions.len()), (false, Nanos(5), 2));
        assert_eq!((all.decisions[0].verdict, all.decisions[0].remaining), (Verdict::Allowed, 10));
        assert!(!all.decisions[1].is_admitted());
        assert_eq!(enforced.all_applied().map(|(i, a)| (i, a.kind)).collect::<Vec<_>>(), [(0, OverrideKind::Bypass)]);
    }
}
