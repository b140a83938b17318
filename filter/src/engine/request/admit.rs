//! The last stage: a request every policy admitted keeps what it spent, has its shadow
//! policies decided and its rate-limit headers built, and is held if a policy shapes it;
//! a request rejected after some of it was spent gets everything back that can be given
//! back, and its reply.

use super::state::Granted;
use crate::engine::cause::Note;
use crate::engine::compiled::Home;
use crate::engine::decision::{Decided, LeasePaid, LocalResponse, Outcome, Owed, SpentFrom, Tally};
use crate::engine::evidence::{count_error, count_evidence};
use crate::engine::headers::{self, rate_limit_headers};
use crate::engine::overridden;
use crate::engine::resolved::{Place, Resolved};
use crate::engine::settlement;
use crate::engine::setup::Setup;
use crate::engine::slots;
use crate::host::{Counter, Metrics, PluginCounter};
use shared_store::{Clock, Decision, Limiter, Nanos, Reservation, Store};
use sluice_protocol::AppliedOverride;

/// The admitted path: keep the spend, decide shadows, build the headers, and hold the
/// request if a policy shapes it.
pub(crate) fn admit<S: Store, C: Clock>(
    setup: &Setup,
    granted: Granted,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Decided {
    limiter.commit(granted.reservation);
    let mut owed = granted.owed;
    decide_shadows(setup, &granted.shadows, limiter, metrics, &mut owed);
    let mut decisions = granted.local;
    decisions.extend(granted.checked.iter().copied());
    let mut headers = allowed_headers(setup, &decisions);
    if let (Some(name), Some(value)) =
        (&setup.response.fallback_header, granted.fallback.as_ref().map(|note| note.render(&setup.policies)))
    {
        headers.push((name.clone(), value));
    }
    overridden::add_header(setup, &granted.overrides, &mut headers);
    let slots = granted.slots;
    let outcome = match granted.due {
        None => Outcome::Continue { headers, slots },
        Some(due) => {
            let now = limiter.clock().now();
            Outcome::Delay { delay: due.saturating_sub(now), due, headers, slots }
        }
    };
    for o in &owed {
        metrics.add(o.policy, Counter::CostEstimated, i64::try_from(o.estimate).unwrap_or(i64::MAX));
    }
    Decided { outcome, tally: granted.tally, owed }
}

/// A request every policy admitted: [`admit`]ted, or, when a policy shapes it and no
/// more requests can be held (`room_to_pause` is false), never forwarded and so
/// [`reject`]ed with its spends given back, like any rejection after a spend.
pub(crate) fn conclude<S: Store, C: Clock>(
    setup: &Setup,
    granted: Granted,
    limiter: &Limiter<S, C>,
    room_to_pause: bool,
    metrics: &mut impl Metrics,
) -> Decided {
    if granted.due.is_some() && !room_to_pause {
        let status = setup.response.status;
        return reject(setup, granted, None, status, limiter, metrics);
    }
    admit(setup, granted, limiter, metrics)
}

/// Rejects a request after some of it was spent: gives back everything it spent
/// ([`unspend`]).
pub(crate) fn reject<S: Store, C: Clock>(
    setup: &Setup,
    granted: Granted,
    strictest: Option<(usize, Decision)>,
    status: u16,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Decided {
    let Unspent { tally, fallback, overrides } = unspend(setup, granted, limiter, metrics);
    let note = fallback.as_ref().map(|note| note.render(&setup.policies));
    let mut response = rejection(setup, strictest, status, note.as_deref());
    overridden::add_header(setup, &overrides, &mut response.headers);
    Decided::new(Outcome::Reject(response), tally)
}

/// What is left of a request once everything it spent has been given back: how it is
/// counted, and what its rejection names.
pub(crate) struct Unspent {
    pub(crate) tally: Tally,
    pub(crate) fallback: Option<Note>,
    pub(crate) overrides: Vec<(usize, AppliedOverride)>,
}

/// Gives back everything a request that will not be forwarded has spent (a rejection
/// after some of it was spent, or a stream that ended while it waited): its lease spends
/// (to the lease, while it lives), its local reservation and its concurrency slots, and
/// its check spends, credited back at the service.
pub(crate) fn unspend<S: Store, C: Clock>(
    setup: &Setup,
    granted: Granted,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Unspent {
    let now = limiter.clock().now();
    let leases = setup.leases(limiter.store());
    for spend in &granted.spent {
        // What its grant no longer holds has expired with it.
        let expired = leases.give_back(&spend.slot, spend.cost, spend.until, now).unwrap_or(spend.cost);
        if expired > 0 {
            metrics.add(spend.policy, Counter::LeaseExpired, i64::try_from(expired).unwrap_or(i64::MAX));
        }
    }
    give_back(granted.reservation, &granted.local, limiter, metrics);
    slots::release(setup, granted.slots.into_vec(), limiter, metrics);
    for spent in &granted.checked_spent {
        settlement::refund(setup, spent.policy, (spent.key, &spent.tag, spent.at_ns), spent.cost, now, metrics);
    }
    Unspent { tally: granted.tally, fallback: granted.fallback, overrides: granted.overrides }
}

/// Gives a local reservation back, counting what could not be (under the first local
/// policy).
pub(crate) fn give_back<S: Store, C: Clock>(
    reservation: Reservation,
    local: &[(usize, Decision)],
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) {
    if reservation.is_empty() {
        return;
    }
    let unrefunded = limiter.refund(reservation);
    if unrefunded > 0
        && let Some((policy, _)) = local.first()
    {
        metrics.add(*policy, Counter::Unrefunded, i64::from(unrefunded));
    }
}

/// A rejection, with the headers of the decision that speaks for it (if any) and the
/// fallback header (if a fallback decided).
pub(crate) fn rejection(
    setup: &Setup,
    strictest: Option<(usize, Decision)>,
    status: u16,
    fallback: Option<&str>,
) -> LocalResponse {
    let response = &setup.response;
    let mut headers = response.headers.clone();
    if let Some((policy, decision)) = strictest
        && let Some(compiled) = setup.compiled(policy)
    {
        let policy = &compiled.policy;
        let limit = match (&compiled.home, fallback) {
            (Home::Global { cap: Some(cap), .. }, Some(_)) => &cap.limit,
            _ => &policy.limit,
        };
        if rate_limit_headers(
            &mut headers,
            response.on_rejected,
            (&policy.name, policy.unit.as_deref()),
            limit,
            &decision,
        ) {
            headers.push(("cache-control".to_owned(), "private".to_owned()));
        }
    }
    if let (Some(name), Some(value)) = (&response.fallback_header, fallback) {
        headers.push((name.clone(), value.to_owned()));
    }
    LocalResponse { status, headers, body: response.body.clone() }
}

fn allowed_headers(setup: &Setup, decisions: &[(usize, Decision)]) -> Vec<(String, String)> {
    let sets = setup.response.on_allowed;
    let mut headers = Vec::new();
    if !sets.any() {
        return headers;
    }
    if let Some((policy, decision)) = headers::strictest_admission(decisions)
        && let Some(compiled) = setup.compiled(policy)
    {
        let policy = &compiled.policy;
        rate_limit_headers(&mut headers, sets, (&policy.name, policy.unit.as_deref()), &policy.limit, &decision);
    }
    headers
}

/// Shadow policies are decided one by one, counted, and never reject; what an admitting
/// one spent on an estimate joins `owed`.
fn decide_shadows<S: Store, C: Clock>(
    setup: &Setup,
    shadows: &[Resolved],
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
    owed: &mut Vec<Owed>,
) {
    for r in shadows {
        let (Place::Local(place), Some(compiled)) = (&r.at, setup.compiled(r.policy)) else { continue };
        match limiter.check_one(place, &compiled.policy.limit, r.cost) {
            Ok(admission) => {
                count_evidence(metrics, r.policy, &admission);
                if admission.created > 0 {
                    metrics.add_plugin(PluginCounter::KeysCreated, i64::from(admission.created));
                }
                if admission.admitted {
                    owed.extend(estimates_owed(setup, std::slice::from_ref(r), admission.at));
                } else {
                    metrics.add(r.policy, Counter::ShadowRejected, 1);
                }
            }
            Err(error) => count_error(metrics, r.policy, &error),
        }
    }
}

/// When a delay of `delay` from `at` is due, if there is one.
pub(crate) fn due_after(at: Nanos, delay: Nanos) -> Option<Nanos> {
    (delay > Nanos::ZERO).then(|| at.saturating_add(delay))
}

/// The estimates spent at `at` under policies whose cost the response reports, to settle
/// once it has been read.
pub(super) fn estimates_owed(setup: &Setup, resolved: &[Resolved], at: Nanos) -> Vec<Owed> {
    resolved
        .iter()
        .filter_map(|r| match (&r.at, setup.compiled(r.policy)) {
            (Place::Local(place), Some(compiled)) if compiled.policy.cost.settled().is_some() => {
                Some(Owed { policy: r.policy, from: SpentFrom::Local(place.clone()), estimate: r.cost, spent_at: at })
            }
            _ => None,
        })
        .collect()
}

/// The estimate a lease-mode policy spent at `at` from its lease's tokens, or a
/// fallback admitted with some of it owed to the lease record (`paid`), when the
/// response reports its cost.
pub(super) fn lease_estimate_owed(setup: &Setup, r: &Resolved, tag: &str, at: Nanos, paid: LeasePaid) -> Option<Owed> {
    let compiled = setup.compiled(r.policy)?;
    compiled.policy.cost.settled()?;
    let Place::Global { key, lease: Some(slot), .. } = &r.at else { return None };
    let from = SpentFrom::Lease { slot: slot.clone(), key: *key, tag: tag.to_owned(), paid };
    Some(Owed { policy: r.policy, from, estimate: r.cost, spent_at: at })
}

/// The estimate a check-mode policy spent at the service (at `at_ns`, on the service's
/// clock), when the response reports its cost.
pub(super) fn check_estimate_owed(setup: &Setup, r: &Resolved, tag: &str, at_ns: u64, now: Nanos) -> Option<Owed> {
    setup.compiled(r.policy)?.policy.cost.settled()?;
    let Place::Global { key, lease: None, .. } = &r.at else { return None };
    let from = SpentFrom::Check { key: *key, tag: tag.to_owned(), at_ns };
    Some(Owed { policy: r.policy, from, estimate: r.cost, spent_at: now })
}
