//! All or nothing (`all_or_nothing: true` in a domain's file, Sluice's extension): a
//! request's counted descriptors spend together or not at all, in one atomic store step,
//! where envoyproxy/ratelimit counts each on its own (and its
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` approximates this in two round trips that
//! can race).
//!
//! Every counter of the request shares one hash tag, so a Redis Cluster decides them on
//! one node: the domain's, or with `all_or_nothing_key` the one named by that key's value
//! (a tenant), so that tenants spread over the cluster. The trade-off: one tag is one
//! slot, a hot spot for a domain without a key.
//!
//! A request over any limit spends nothing: unlike the independent mode, its hits are
//! not counted (a token budget charged on stream done needs the independent mode). The
//! statuses of the descriptors that would have fitted say `OK` with what they have left
//! unspent. Descriptors in shadow or quota mode, `is_negative_hits` and unlimited rules
//! are decided on their own, as in the independent mode.

use std::collections::BTreeMap;

use shared_store::{Nanos, Verdict};

use super::config::{AllOrNothing, RuleAlgorithm};
use super::decide::{Code, RlsError, RlsRequest, Status, Target, answer, hits_of, internal, limited, over, period_of};
use super::identity;
use crate::api::{CheckPlan, PlannedEntry, Scope, storage_key};
use crate::app::App;
use crate::call::{Call, Outcome};

/// The hash tag of a request's counters in `domain`: the domain's, or the slot `value`
/// (the request's value of `all_or_nothing_key`) picks.
fn tag(domain: &str, value: Option<&str>) -> String {
    let picked = [u8::from(value.is_some())];
    format!("rls-all:{}", identity::hash(&[domain.as_bytes(), value.unwrap_or("").as_bytes(), &picked]))
}

/// Decides together the descriptors among `candidates` that can be (see the module
/// docs): their indices and statuses. The others are left to be decided alone.
///
/// # Errors
/// [`RlsError::Invalid`] when more counters than a check holds (`--max-entries`) would
/// be decided together; [`RlsError::Unavailable`] when the store could not decide.
pub(super) async fn decide_together(
    app: &App,
    request: &RlsRequest,
    (targets, candidates): (&[Option<Target<'_>>], &[usize]),
    rule: &AllOrNothing,
    at: Option<Nanos>,
) -> Result<Vec<(usize, Status)>, RlsError> {
    let taken: Vec<usize> = candidates
        .iter()
        .copied()
        .filter(|i| {
            let Some(target) = &targets[*i] else { return false };
            let r = &target.rule;
            !(r.shadow_mode || r.quota_mode || r.unlimited || r.unit.is_none() || request.descriptors[*i].negative)
        })
        .collect();
    if taken.is_empty() {
        return Ok(Vec::new());
    }
    let value = rule.key.as_deref().and_then(|key| {
        request.descriptors.iter().flat_map(|d| &d.entries).find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    });
    let tag = tag(&request.domain, value);
    // One entry per counter (two descriptors of one counter spend the sum of their hits).
    let mut entries: Vec<PlannedEntry> = Vec::new();
    let mut place: BTreeMap<usize, usize> = BTreeMap::new();
    let mut forced_over = false;
    for &i in &taken {
        let Some(target) = &targets[i] else { continue };
        let Some(limit) = &target.rule.limit else {
            forced_over = true; // `requests_per_unit: 0`
            continue;
        };
        let key = storage_key(&tag, 0, &target.counter);
        let hits = hits_of(request, &request.descriptors[i]);
        let at_entry = match entries.iter().position(|e| e.storage_key == key) {
            Some(existing) => {
                entries[existing].cost = entries[existing].cost.saturating_add(hits);
                existing
            }
            None => {
                entries.push(PlannedEntry {
                    storage_key: key,
                    limit: limit.clone(),
                    cost: hits,
                    scope: Scope { policy: Some(target.rule.policy.clone()), version: 0, key: target.counter.clone() },
                    expires: None,
                });
                entries.len() - 1
            }
        };
        place.insert(i, at_entry);
    }
    if entries.len() > app.max_entries() {
        return Err(RlsError::Invalid(format!(
            "descriptors: {} counters to decide together, at most {} (--max-entries)",
            entries.len(),
            app.max_entries()
        )));
    }
    forced_over |= entries.iter().any(|e| e.cost > e.limit.capacity());
    let costs: Vec<u64> = entries.iter().map(|e| e.cost).collect();
    if forced_over {
        // Over whatever the counters hold: ask where they stand, spend nothing.
        entries.iter_mut().for_each(|e| e.cost = 0);
    }
    let outcome = if entries.is_empty() {
        None
    } else {
        let call = Call::Check(CheckPlan { entries });
        let (outcome, enforced) = app.decide_at(&call, at).await?;
        let Outcome::Check(check) = outcome else { return Err(internal()) };
        Some((check, enforced))
    };
    let admitted = !forced_over && outcome.as_ref().is_some_and(|(check, _)| check.admitted);
    let mut statuses = Vec::with_capacity(taken.len());
    for &i in &taken {
        let Some(target) = &targets[i] else { continue };
        let Some(unit) = target.rule.unit else { continue };
        let hits = hits_of(request, &request.descriptors[i]);
        let base = Status { hits, stat: Some(target.stat.clone()), ..limited(&target.rule, unit) };
        let period = period_of(&target.rule, unit);
        let fixed = target.rule.algorithm == RuleAlgorithm::FixedWindow;
        let decided = place.get(&i).and_then(|e| {
            let (check, enforced) = outcome.as_ref()?;
            Some((*check.decisions.get(*e)?, check.at, enforced.applied(*e), costs[*e]))
        });
        let status = match decided {
            None => Status {
                code: Code::OverLimit,
                decided: Code::OverLimit,
                duration_until_reset: Some(std::time::Duration::from_secs(unit.seconds())),
                ..base
            },
            Some((decision, at, overridden, cost)) => {
                let base = Status { overridden, ..base };
                let fits = decision.is_admitted() && cost <= target.rule.limit.as_ref().map_or(0, |l| l.capacity());
                match (admitted, fits) {
                    (true, _) => answer(base, &decision, at, fixed, period),
                    // It would have fitted; nothing was spent: what it has left, unspent.
                    (false, true) => {
                        let unspent = if forced_over { decision.remaining } else { decision.remaining + cost };
                        let left = shared_store::Decision { remaining: unspent, ..decision };
                        answer(base, &left, at, fixed, period)
                    }
                    (false, false) => {
                        let rejected = match decision.verdict {
                            Verdict::Rejected { .. } => decision,
                            _ => shared_store::Decision { verdict: Verdict::Exceeds, ..decision },
                        };
                        over(
                            Status { code: Code::OverLimit, decided: Code::OverLimit, ..base },
                            &rejected,
                            at,
                            fixed,
                            period,
                        )
                    }
                }
            }
        };
        statuses.push((i, status));
    }
    Ok(statuses)
}
