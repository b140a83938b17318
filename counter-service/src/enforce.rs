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
//! * A **clamp** is a second limit, decided together with the entry's own: the entry is
//!   decided under the policy's numbers on the policy's counter, *and* under the clamp's
//!   numbers on a counter of the clamp's own ([`PlannedEntry::clamp`]: keyed by the
//!   override and the entry's key, forgotten when the override ends), all or nothing.
//!   The policy's counter never changes numbers because of an override, so nothing is
//!   carried over at either end of a clamp, a clamp can never raise a limit (what is
//!   admitted fits both), and a clamp of another algorithm or window length is simply a
//!   second limit. A lease is granted at most what both counters allow; a charge is
//!   charged to both; a credit is given back to both, to the clamp's counter only for
//!   units spent since the clamp was set (units spent before it never counted there).
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
    /// Decided also on the clamp's own counter, under its numbers.
    Clamp(AppliedOverride, Clamp),
}

/// A clamp as it applies to one entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Clamp {
    /// The clamp's numbers.
    pub limit: StoreLimit,
    /// When the override was set (Unix ns): units spent before never counted on the
    /// clamp's counter.
    pub since: Nanos,
    /// When it ends (Unix ns): its counter is forgotten then.
    pub until: Nanos,
}

impl Clamp {
    /// The clamp's counter for `entry`.
    fn counter(&self, applied: AppliedOverride, entry: &PlannedEntry) -> PlannedEntry {
        entry.clamp(&applied.id.to_string(), self.limit.clone(), self.until)
    }
}

impl Effect {
    /// Which override, and what kind.
    pub const fn applied(&self) -> AppliedOverride {
        match self {
            Self::Bypass(applied) | Self::Clamp(applied, _) => *applied,
        }
    }
}

/// What the overrides in `set` do to `entry` at `now_ms`: `None` when none applies.
pub fn effect(set: &OverrideSet, entry: &PlannedEntry, now_ms: u64) -> Option<Effect> {
    let item = set.find(&entry.scope, now_ms)?;
    let applied = AppliedOverride { id: OverrideId::parse(&item.id)?, kind: item.kind };
    match (item.kind, item.limit) {
        (OverrideKind::Bypass, _) => Some(Effect::Bypass(applied)),
        (OverrideKind::Clamp, Some(spec)) => StoreLimit::new(spec).ok().map(|limit| {
            let ns = |ms: u64| Nanos::from_millis(ms);
            Effect::Clamp(applied, Clamp { limit, since: ns(item.created_at_ms), until: ns(item.expires_at_ms) })
        }),
        // A clamp always carries its limit (validated when set); one without is no clamp.
        (OverrideKind::Clamp, None) => None,
    }
}

/// Where the store decided an entry of the original call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decided {
    /// Not at all: bypassed.
    Bypassed,
    /// At this position of the store's check, and its clamp's counter at that one.
    At(usize, Option<usize>),
}

/// A call with the overrides applied: what the store is to decide, and which override
/// decided each entry of the original call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Enforced {
    /// The call for the store when overrides changed it (clamped entries with their
    /// clamp's counter beside them, bypassed entries left out); `None` with `changed`
    /// false: the original call as it is.
    call: Option<Call>,
    changed: bool,
    /// Per entry of the original call (one for a lease, charge or credit), the override
    /// that decided it; empty when none did.
    applied: Vec<Option<AppliedOverride>>,
    /// Per entry of the original check, where the store decided it.
    decided: Vec<Decided>,
}

impl Enforced {
    /// Applies `set` to `call` at `now_ms`.
    pub fn new(call: &Call, set: &OverrideSet, now_ms: u64) -> Self {
        if set.is_empty() {
            return Self::default();
        }
        let effects: Vec<Option<Effect>> = call.entries().map(|e| effect(set, e, now_ms)).collect();
        if effects.iter().all(Option::is_none) {
            return Self::default();
        }
        let applied = effects.iter().map(|e| e.as_ref().map(Effect::applied)).collect();
        let mut store_call = call.clone();
        let mut decided = Vec::new();
        let first = effects.first().and_then(Option::as_ref);
        let keep = match (&mut store_call, first) {
            (Call::Check(plan), _) => {
                let mut kept = Vec::with_capacity(plan.entries.len() + effects.len());
                let mut clamps = Vec::new();
                for (entry, effect) in plan.entries.drain(..).zip(&effects) {
                    decided.push(match effect {
                        Some(Effect::Bypass(_)) => Decided::Bypassed,
                        Some(Effect::Clamp(applied, clamp)) => {
                            clamps.push((kept.len(), clamp.counter(*applied, &entry)));
                            kept.push(entry);
                            Decided::At(kept.len() - 1, None)
                        }
                        None => {
                            kept.push(entry);
                            Decided::At(kept.len() - 1, None)
                        }
                    });
                }
                for (at, counter) in clamps {
                    let position = kept.len();
                    kept.push(counter);
                    if let Some(slot) = decided.iter_mut().find(|d| matches!(d, Decided::At(a, None) if *a == at)) {
                        *slot = Decided::At(at, Some(position));
                    }
                }
                plan.entries = kept;
                !plan.entries.is_empty()
            }
            (_, Some(Effect::Bypass(_))) => false,
            (Call::Lease(plan), Some(Effect::Clamp(applied, clamp))) => {
                // A lease asks for at most the capacity: under the clamp, the clamp's too.
                plan.tokens = plan.tokens.min(clamp.limit.capacity());
                plan.min_tokens = plan.min_tokens.min(plan.tokens);
                plan.clamp = Some(clamp.counter(*applied, &plan.entry));
                true
            }
            (Call::Charge(plan), Some(Effect::Clamp(applied, clamp))) => {
                // A shaper's counter cannot be charged: the policy's counter alone then.
                if clamp.limit.chargeable() {
                    plan.clamp = Some(clamp.counter(*applied, &plan.entry));
                }
                true
            }
            (Call::Credit(plan), Some(Effect::Clamp(applied, clamp))) => {
                // Units spent before the clamp was set never counted on its counter.
                if clamp.limit.creditable() && plan.spent_at >= clamp.since {
                    plan.clamp = Some(clamp.counter(*applied, &plan.entry));
                }
                true
            }
            (_, None) => true,
        };
        Self { call: keep.then_some(store_call), changed: true, applied, decided }
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

    /// The outcome of the original call: the store's (for what it decided, `None` when
    /// it decided nothing), with every bypassed entry admitted without spending and every
    /// clamped one answered for both its counters, at `now`.
    pub fn complete(&self, original: &Call, decided: Option<Outcome>, now: Nanos) -> Option<Outcome> {
        if !self.changed {
            return decided;
        }
        Some(match (original, decided) {
            (Call::Check(plan), decided) => {
                let (admitted, at, decisions, carry_forgiven) = match decided {
                    Some(Outcome::Check(o)) => (o.admitted, o.at, o.decisions, o.carry_forgiven),
                    None => (true, now, Vec::new(), 0),
                    Some(_) => return None,
                };
                let mut all = Vec::with_capacity(plan.entries.len());
                for (entry, place) in plan.entries.iter().zip(&self.decided) {
                    all.push(match *place {
                        Decided::Bypassed => bypassed_decision(entry),
                        Decided::At(at, None) => *decisions.get(at)?,
                        Decided::At(at, Some(clamp)) => decisions.get(at)?.and(*decisions.get(clamp)?),
                    });
                }
                Outcome::Check(CheckOutcome { admitted, at, decisions: all, carry_forgiven })
            }
            (_, Some(outcome)) => outcome,
            (Call::Lease(plan), None) => Outcome::Lease(LeaseOutcome {
                granted: plan.tokens,
                expires_in_ms: plan.ttl_ms,
                at: now,
                decision: bypassed_decision(&plan.entry),
                refill_after: Nanos::ZERO,
                carry_forgiven: 0,
            }),
            (Call::Charge(plan), None) => Outcome::Charge(ChargeOutcome {
                charged: 0,
                forgiven: plan.entry.cost,
                duplicate: false,
                at: now,
                decision: bypassed_decision(&plan.entry),
                carry_forgiven: 0,
            }),
            (Call::Credit(plan), None) => Outcome::Credit(CreditOutcome {
                credited: 0,
                forgiven: plan.entry.cost,
                duplicate: false,
                at: now,
                decision: bypassed_decision(&plan.entry),
                carry_forgiven: 0,
            }),
        })
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
            expires: None,
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

        assert!(matches!(applied, Some(Effect::Clamp(a, limit)) if a.id.0 == 7 && limit.limit.capacity() == 3));
    }

    #[test]
    fn a_clamp_is_a_second_counter_beside_the_policys_own_whatever_its_numbers() {
        // Burst 2 on a policy of burst 1, and on a fixed window: a second limit either way.
        let set = OverrideSet::new(vec![item(1, OverrideKind::Clamp, None, 0)]);
        let window = LimitSpec::FixedWindow { limit: 100, window_ms: 1000 };
        let plan = crate::api::CheckPlan {
            entries: vec![entry("a", Some("per-tenant"), bucket(1)), entry("b", Some("per-tenant"), window)],
        };
        let call = Call::Check(plan.clone());

        let enforced = Enforced::new(&call, &set, 0);
        let Some(Call::Check(decided)) = enforced.store_call(&call) else { panic!("a check for the store") };

        assert_eq!(decided.entries.len(), 4, "both entries as they were, and a clamp counter for each");
        assert_eq!(decided.entries[..2], plan.entries[..], "the policy's counters keep the policy's numbers");
        let clamp = &decided.entries[2];
        assert_eq!(clamp.storage_key, "sluice:{a}:clamp:ovr-0000000000000001:v0:a");
        assert_eq!(clamp.limit.spec, bucket(2));
        assert_eq!(clamp.expires, Some(Nanos::from_millis(10_000)), "forgotten when the override ends");
        assert_eq!(decided.entries[3].storage_key, "sluice:{b}:clamp:ovr-0000000000000001:v0:b");
    }

    #[test]
    fn a_clamped_entry_is_answered_for_both_its_counters_and_admitted_only_if_both_admit() {
        let set = OverrideSet::new(vec![item(1, OverrideKind::Clamp, Some("a"), 0)]);
        let call = Call::Check(crate::api::CheckPlan { entries: vec![entry("a", Some("per-tenant"), bucket(10))] });
        let enforced = Enforced::new(&call, &set, 0);
        let allowed = Decision { verdict: Verdict::Allowed, limit: 10, remaining: 6, reset_after: Nanos(40) };
        let rejected = Decision {
            verdict: Verdict::Rejected { retry_after: Nanos(7) },
            limit: 2,
            remaining: 0,
            reset_after: Nanos(9),
        };
        let decided =
            CheckOutcome { admitted: false, at: Nanos(5), decisions: vec![allowed, rejected], carry_forgiven: 0 };

        let Some(Outcome::Check(all)) = enforced.complete(&call, Some(Outcome::Check(decided)), Nanos(9)) else {
            panic!("a check's outcome")
        };

        assert_eq!(all.decisions, [allowed.and(rejected)]);
        assert_eq!(all.decisions[0].retry_after(), Some(Nanos(7)));
    }

    #[test]
    fn a_keyed_clamp_above_the_policys_numbers_still_applies_and_a_keyed_override_of_another_version_hides_nothing() {
        let mut keyed = item(1, OverrideKind::Clamp, Some("a"), 0);
        keyed.limit = Some(bucket(50));
        let set = OverrideSet::new(vec![keyed, item(2, OverrideKind::Bypass, None, 0)]);
        let other_version = PlannedEntry {
            scope: Scope { version: 1, ..entry("a", Some("per-tenant"), bucket(10)).scope },
            ..entry("a", Some("per-tenant"), bucket(10))
        };

        assert_eq!(kind_for(&set, &entry("a", Some("per-tenant"), bucket(10)), 0), Some((1, OverrideKind::Clamp)));
        assert_eq!(kind_for(&set, &other_version, 0), Some((2, OverrideKind::Bypass)), "the policy-wide one applies");
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
            carry_forgiven: 0,
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
