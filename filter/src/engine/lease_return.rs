//! Leased tokens a proxy will not spend, given back to the service before they expire
//! (issue 39): a grant that would otherwise strand its rest on a proxy whose caller went
//! quiet (or moved to another proxy) frees it for the rest of the fleet.
//!
//! # The rule
//!
//! The worker that applied a grant reviews it once, when a quarter of the grant's life
//! is left ([`REVIEW_WHEN_LEFT`]). It keeps what the key is expected to spend on this
//! proxy until the grant expires (its demand over the last lease life, scaled to the
//! time left, `Leases::take_surplus`) and takes the rest out of the lease record by CAS,
//! so no worker can spend it; then it credits that rest at the service (`POST
//! /v1/credit`, a settlement with an id: applied once however often it is sent,
//! `settlement.rs`). Counted as `lease.returned` once the service applied it; a credit
//! that cannot be applied counts as `lease.expired`, as the tokens would have been. So
//! for each key and proxy, `granted = spent + returned + expired`.
//!
//! Only a grant that left its budget short is reviewed: one after which the counter
//! held less than the grant itself (the answer's `entry.remaining`), so that another
//! proxy asking for as much could have been refused. A grant from a plentiful budget is
//! not: the counter refills meanwhile, and a return would most often credit a full
//! bucket (nothing given back, a callout spent). A busy key is expected to spend its
//! grant and returns nothing: returns cost a callout only where tokens would have been
//! stranded while others could use them. A credit is made in the window the grant
//! was decided in (its `at_ns`): a fixed window's grant never outlives its window, and
//! a pool merged under this grant's expiry holds only later grants' tokens, so the
//! credit never reaches a window the tokens were not counted in.
//!
//! Not returned: grants decided under an operator's override, of a policy whose
//! algorithm the service cannot credit (a leaky bucket, a sliding log), and while the
//! circuit is open (the tokens bridge the outage instead). Reviews are bounded
//! ([`MAX_PENDING_REVIEWS`] per worker; beyond it a grant is not reviewed and its rest
//! expires, counted, as before).

use super::calls::{Review, Target};
use super::evidence::counted;
use super::settlement;
use super::setup::Setup;
use crate::engine::breaker::Admit;
use crate::host::Metrics;
use shared_store::{Clock, Limiter, Nanos, Store};

/// A grant is reviewed when `1 / REVIEW_WHEN_LEFT` of its life is left: late enough that
/// the key's demand over most of the grant's life is known, early enough that the
/// service can grant the rest to another proxy before it would have expired.
pub(crate) const REVIEW_WHEN_LEFT: u64 = 4;
/// The most grants one worker waits to review.
pub(crate) const MAX_PENDING_REVIEWS: usize = 4096;
/// The most reviews one worker makes per tick (the rest on the next).
pub(crate) const MAX_REVIEWS_PER_TICK: usize = 16;

/// Remembers to review the grant of `target`'s lease applied at `now`, which expires at
/// `expires_at` and which the service decided at `at_ns` (its clock).
pub(crate) fn schedule(setup: &Setup, target: &Target, now: Nanos, expires_at: Nanos, at_ns: u64) {
    let creditable = setup.compiled(target.policy).is_some_and(|c| c.policy.limit.can_credit());
    if !creditable || expires_at <= now {
        return;
    }
    let due = Nanos(expires_at.0 - (expires_at.0 - now.0) / REVIEW_WHEN_LEFT);
    if let Ok(mut reviews) = setup.reviews.try_borrow_mut() {
        let _ = reviews.add(due, Review { target: target.clone(), expires_at, at_ns }, MAX_PENDING_REVIEWS);
    }
}

/// Reviews the grants that are due (a few per tick): each one's surplus is taken out of
/// its lease and its credit queued. While the circuit is open, due grants are dropped
/// unreviewed: their tokens stay spendable through the outage.
pub(crate) fn review_due<S: Store, C: Clock>(setup: &Setup, limiter: &Limiter<S, C>, metrics: &mut impl Metrics) {
    let now = limiter.clock().now();
    let Some(service) = setup.service.as_ref() else { return };
    let reachable = service.breaker.admit_quietly(limiter.store(), now) != Admit::Open;
    for _ in 0..MAX_REVIEWS_PER_TICK {
        let Some(review) = setup.reviews.try_borrow_mut().ok().and_then(|mut r| r.pop_due(now)) else { return };
        if !reachable {
            continue;
        }
        let Some(leased) = setup.leased_home(review.target.policy) else { continue };
        let leases = setup.leases(limiter.store());
        let taken = leases.take_surplus(&review.target.slot, review.expires_at, leased.config.duration(), now);
        if let Ok(Some(units)) = counted(review.target.policy, taken, metrics)
            && units > 0
        {
            let Target { policy, key, tag, .. } = &review.target;
            settlement::give_back_lease(setup, *policy, (*key, tag, review.at_ns), units, now, metrics);
        }
    }
}
