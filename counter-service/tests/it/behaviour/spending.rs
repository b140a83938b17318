//! Whether leases and charges spend the counters alike on every store: what a lease
//! grants and deducts and how long it lives, what a charge spends, forgives and
//! remembers by id, and how a debt is repaid (scenarios of the shared behavioural suite).

use shared_store::{Nanos, Verdict};
use sluice_protocol::LimitSpec;

use super::{MS, bucket, one, per_minute, rejected};
use crate::support::*;

async fn a_lease_deducts_the_granted_tokens_from_the_global_budget(target: Target<'_>, tag: &str) {
    let limit = LimitSpec::TokenBucket { amount: 1, per_ms: 1000, burst: 10 };

    let first = target.lease(tag, "k", limit, 4, t_us(0)).await;
    let second = target.lease(tag, "k", limit, 10, t_us(0)).await;
    let check_after = one(target, tag, entry("k", limit, 1), 0).await;
    let empty = target.lease(tag, "k", limit, 5, t_us(0)).await;

    assert_eq!((first.granted, first.decision.remaining), (4, 6));
    assert_eq!((second.granted, second.decision.remaining), (6, 0), "only what is left is granted");
    assert_eq!(check_after.verdict, rejected(1000));
    assert_eq!((empty.granted, empty.decision.verdict), (0, rejected(1000)));
}

async fn a_lease_with_a_minimum_grants_nothing_below_it_and_answers_the_minimums_exact_wait(
    target: Target<'_>,
    tag: &str,
) {
    // One token a second, bursts of 10.
    let limit = LimitSpec::TokenBucket { amount: 1, per_ms: 1000, burst: 10 };
    target.lease(tag, "k", limit, 8, t_us(0)).await;

    let short = target.lease_at_least(tag, "k", limit, (5, 3), t_us(0)).await;
    let enough = target.lease_at_least(tag, "k", limit, (5, 2), t_us(0)).await;
    let empty = target.lease_at_least(tag, "k", limit, (6, 4), t_us(0)).await;
    let after_the_wait = target.lease_at_least(tag, "k", limit, (6, 4), t_us(4000 * MS)).await;

    assert_eq!((short.granted, short.decision.verdict, short.decision.remaining), (0, rejected(1000), 2));
    assert_eq!((enough.granted, enough.decision.remaining), (2, 0), "what is left, when it reaches the minimum");
    assert_eq!((empty.granted, empty.decision.verdict), (0, rejected(4000)), "the wait for 4 units, not for 1");
    assert_eq!((after_the_wait.granted, after_the_wait.decision.remaining), (4, 0));
}

async fn a_lease_that_leaves_less_than_its_minimum_answers_the_exact_wait_until_the_minimum_is_back(
    target: Target<'_>,
    tag: &str,
) {
    // One token a second, bursts of 5.
    let limit = LimitSpec::TokenBucket { amount: 1, per_ms: 1000, burst: 5 };
    one(target, tag, entry("k", limit, 4), 0).await;

    // 1.5 s on, 2.5 tokens are back: 2 are granted, half a token is left.
    let partial = target.lease_at_least(tag, "k", limit, (5, 2), t_us(1500 * MS)).await;
    let early = target.lease_at_least(tag, "k", limit, (5, 2), t_us(3000 * MS - 1)).await;
    let on_time = target.lease_at_least(tag, "k", limit, (5, 2), t_us(3000 * MS)).await;
    let enough = target.lease_at_least(tag, "enough", limit, (3, 2), t_us(0)).await;
    let whole = target.lease_at_least(tag, "whole", limit, (4, 2), t_us(0)).await;
    let window = LimitSpec::FixedWindow { limit: 5, window_ms: 1000 };
    one(target, tag, entry("window", window, 2), 250 * MS).await;
    let windowed = target.lease_at_least(tag, "window", window, (4, 2), t_us(250 * MS)).await;

    assert_eq!((partial.granted, partial.decision.remaining), (2, 0));
    assert_eq!(partial.refill_after, Nanos::from_millis(1500), "half a token left, 1.5 tokens to go");
    assert_eq!((early.granted, early.decision.verdict), (0, Verdict::Rejected { retry_after: Nanos(1000) }));
    assert_eq!(early.refill_after, Nanos::ZERO, "nothing granted: the entry's retry_after says it");
    assert_eq!((on_time.granted, on_time.refill_after), (2, Nanos::from_millis(2000)), "exactly on time");
    assert_eq!((enough.granted, enough.decision.remaining, enough.refill_after), (3, 2, Nanos::ZERO));
    assert_eq!((whole.granted, whole.decision.remaining), (4, 1), "all that was asked, and 1 left");
    assert_eq!(whole.refill_after, Nanos::from_millis(1000), "the wait for the minimum, not for 1");
    assert_eq!((windowed.granted, windowed.expires_in_ms), (3, 750));
    assert_eq!(windowed.refill_after, Nanos::from_millis(750), "the window's end");
}

async fn a_window_lease_lives_no_longer_than_the_window_it_was_decided_in(target: Target<'_>, tag: &str) {
    for (key, limit) in [
        ("fixed", LimitSpec::FixedWindow { limit: 10, window_ms: 1000 }),
        ("sliding", LimitSpec::SlidingWindow { limit: 10, window_ms: 1000 }),
    ] {
        let late = target.lease(tag, key, limit, 4, t_us(700 * MS)).await;
        let last_millisecond = target.lease(tag, key, limit, 1, t_us(999 * MS)).await;
        let too_late = target.lease(tag, key, limit, 1, t_us(999 * MS + 500)).await;

        assert_eq!((late.granted, late.expires_in_ms), (4, 300), "{key}: spent in the window that counted it");
        assert_eq!((last_millisecond.granted, last_millisecond.expires_in_ms), (1, 1), "{key}");
        assert_eq!(too_late.granted, 0, "{key}: less than a millisecond left");
        assert_eq!(too_late.decision.verdict, Verdict::Rejected { retry_after: Nanos(500_000) }, "{key}");
        assert_eq!(too_late.decision.remaining, 5, "{key}: nothing was deducted");
    }
    let bucket = target.lease(tag, "bucket", bucket(), 1, t_us(999 * MS + 500)).await;
    let log = target.lease(tag, "log", LimitSpec::SlidingLog { limit: 3, window_ms: 1000 }, 1, t_us(999 * MS)).await;

    assert_eq!((bucket.granted, bucket.expires_in_ms), (1, 1000), "a bucket's lease keeps its ttl");
    assert_eq!((log.granted, log.expires_in_ms), (1, 1000), "a sliding log's lease keeps its ttl");
}

async fn a_charge_spends_what_was_admitted_and_forgives_beyond_the_debt_bound(target: Target<'_>, tag: &str) {
    one(target, tag, entry("k", bucket(), 1), 0).await;

    let charged = target.charge(tag, "k", bucket(), (10, 2), t_us(0)).await;
    let check_after = one(target, tag, entry("k", bucket(), 1), 0).await;

    // 3 left in the bucket, then 2 below empty: 5 charged, 5 forgiven.
    assert_eq!(charged.charged, 5);
    assert_eq!(charged.at, t_us(0));
    assert_eq!((charged.decision.remaining, charged.decision.limit), (0, 4));
    // 6 tokens' worth of debt at 500 ms each: full again in 3 s, one token after 1.5 s.
    assert_eq!(charged.decision.reset_after, Nanos::from_millis(3000));
    assert_eq!(charged.decision.verdict, rejected(1500));
    assert_eq!(check_after.verdict, rejected(1500));
}

async fn a_counter_in_debt_admits_nothing_until_repaid_and_then_exactly_on_time(target: Target<'_>, tag: &str) {
    let window = LimitSpec::SlidingWindow { limit: 4, window_ms: 1000 };
    target.charge(tag, "bucket", bucket(), (8, 4), t_us(0)).await;
    target.charge(tag, "window", window, (6, 4), t_us(0)).await;

    // Time only moves forward: a store may evict a key once the clock has passed the
    // moment it would have drained (the window's, at 2 s), as the memory store's sweeper does.
    // 6 counted in window 0: in window 1, 6 × (1 − e) + 1 ≤ 4 from e = 1/2 on.
    let window_early = one(target, tag, entry("window", window, 1), 1500 * MS - 1).await;
    let window_on_time = one(target, tag, entry("window", window, 1), 1500 * MS).await;
    let bucket_early = one(target, tag, entry("bucket", bucket(), 1), 2500 * MS - 1).await;
    let bucket_on_time = one(target, tag, entry("bucket", bucket(), 1), 2500 * MS).await;

    assert_eq!(bucket_early.verdict, Verdict::Rejected { retry_after: Nanos(1000) });
    assert_eq!(bucket_on_time.verdict, Verdict::Allowed);
    assert!(matches!(window_early.verdict, Verdict::Rejected { .. }), "{window_early:?}");
    assert_eq!(window_on_time.verdict, Verdict::Allowed);
}

async fn a_fixed_window_charge_carries_its_debt_only_to_the_end_of_the_window(target: Target<'_>, tag: &str) {
    let limit = LimitSpec::FixedWindow { limit: 3, window_ms: 1000 };

    let charged = target.charge(tag, "k", limit, (5, 1), t_us(250 * MS)).await;
    let again = target.charge(tag, "k", limit, (5, 1), t_us(300 * MS)).await;
    let next_window = one(target, tag, entry("k", limit, 1), 1000 * MS).await;

    assert_eq!((charged.charged, charged.decision.verdict), (4, rejected(750)));
    assert_eq!((again.charged, again.decision.remaining), (0, 0), "already at the bound");
    assert_eq!((next_window.verdict, next_window.remaining), (Verdict::Allowed, 2));
}

async fn a_sliding_log_records_at_most_256_entries_of_charges(target: Target<'_>, tag: &str) {
    let limit = LimitSpec::SlidingLog { limit: 256, window_ms: 60_000 };
    let mut charged = 0;
    for i in 0..256 {
        charged += target.charge(tag, "k", limit, (1, 256), t_us(i)).await.charged;
    }

    let full = target.charge(tag, "k", limit, (1, 256), t_us(256)).await;
    let after_the_first_expires = target.charge(tag, "k", limit, (1, 256), t_us(60_000 * MS)).await;

    assert_eq!(charged, 256);
    assert_eq!((full.charged, full.decision.remaining), (0, 0), "a full log forgives what it cannot record");
    assert_eq!(after_the_first_expires.charged, 1);
}

async fn a_charge_of_a_key_never_seen_starts_from_a_full_limit(target: Target<'_>, tag: &str) {
    let log = LimitSpec::SlidingLog { limit: 3, window_ms: 1000 };

    let small = target.charge(tag, "a", bucket(), (1, 0), t_us(0)).await;
    let logged = target.charge(tag, "b", log, (2, 3), t_us(0)).await;
    let nothing = target.charge(tag, "c", bucket(), (0, 4), t_us(0)).await;

    assert_eq!((small.charged, small.decision.verdict, small.decision.remaining), (1, Verdict::Allowed, 3));
    assert_eq!((logged.charged, logged.decision.remaining), (2, 1));
    assert_eq!((nothing.charged, nothing.decision.remaining), (0, 4));
}

async fn a_charge_sent_again_with_its_id_is_applied_once_and_answered_as_the_first_time(target: Target<'_>, tag: &str) {
    let first = target.charge_once(tag, "k", bucket(), (6, 3), Some("c-1"), t_us(0)).await;
    let again = target.charge_once(tag, "k", bucket(), (6, 3), Some("c-1"), t_us(100 * MS)).await;
    let check_after = one(target, tag, entry("k", bucket(), 0), 100 * MS).await;
    let another_id = target.charge_once(tag, "k", bucket(), (1, 3), Some("c-2"), t_us(100 * MS)).await;

    // 4 in the bucket and 2 below empty: 6 charged; 6 units of debt drain in 3 s.
    assert_eq!((first.charged, first.forgiven, first.duplicate), (6, 0, false));
    assert_eq!((again.charged, again.forgiven, again.duplicate), (6, 0, true), "the first answer, repeated");
    assert_eq!(again.decision.reset_after, Nanos::from_millis(2900), "the entry is the limit as it stands now");
    assert_eq!(check_after.reset_after, Nanos::from_millis(2900), "nothing was spent the second time");
    assert_eq!((another_id.charged, another_id.duplicate), (1, false));
}

async fn a_charge_id_is_remembered_per_counter_and_a_charge_without_one_is_applied_every_time(
    target: Target<'_>,
    tag: &str,
) {
    let first = target.charge_once(tag, "a", bucket(), (1, 0), Some("same"), t_us(0)).await;
    let other_key = target.charge_once(tag, "b", bucket(), (1, 0), Some("same"), t_us(0)).await;
    let without = target.charge(tag, "a", bucket(), (1, 0), t_us(0)).await;
    let without_again = target.charge(tag, "a", bucket(), (1, 0), t_us(0)).await;
    let forgiven_first = target.charge_once(tag, "c", bucket(), (9, 0), Some("all"), t_us(0)).await;
    let forgiven_again = target.charge_once(tag, "c", bucket(), (9, 0), Some("all"), t_us(0)).await;

    assert_eq!((first.charged, first.duplicate), (1, false));
    assert_eq!((other_key.charged, other_key.duplicate), (1, false), "another counter, another charge");
    assert_eq!((without.charged, without.duplicate, without_again.charged), (1, false, 1));
    assert_eq!(without_again.decision.remaining, 1, "4 less the three charges of one");
    assert_eq!((forgiven_first.charged, forgiven_first.forgiven), (4, 5));
    assert_eq!(
        (forgiven_again.charged, forgiven_again.forgiven, forgiven_again.duplicate),
        (4, 5, true),
        "what was forgiven is answered again too"
    );
}

async fn a_lease_and_a_charge_share_the_counter_whatever_numbers_they_carry(target: Target<'_>, tag: &str) {
    let leased = target.lease(tag, "k", per_minute(10), 10, t_us(0)).await;

    let raised = target.lease(tag, "k", per_minute(20), 5, t_us(0)).await;
    let charged = target.charge(tag, "k", per_minute(20), (3, 2), t_us(0)).await;
    let checked = one(target, tag, entry("k", per_minute(10), 1), 0).await;

    assert_eq!(leased.granted, 10);
    assert_eq!((raised.granted, raised.decision.verdict), (0, rejected(60_000)), "the raise hands out nothing");
    assert_eq!((charged.charged, charged.forgiven), (2, 1), "empty under 20, then 2 below empty");
    // Back under 10: still 2 below empty (a debt is carried over whole, up to the new
    // capacity), so one unit waits for three tokens, a minute each.
    assert_eq!(checked.verdict, rejected(180_000));
}

on_every_store!(
    a_lease_and_a_charge_share_the_counter_whatever_numbers_they_carry,
    a_lease_deducts_the_granted_tokens_from_the_global_budget,
    a_lease_with_a_minimum_grants_nothing_below_it_and_answers_the_minimums_exact_wait,
    a_lease_that_leaves_less_than_its_minimum_answers_the_exact_wait_until_the_minimum_is_back,
    a_window_lease_lives_no_longer_than_the_window_it_was_decided_in,
    a_charge_spends_what_was_admitted_and_forgives_beyond_the_debt_bound,
    a_counter_in_debt_admits_nothing_until_repaid_and_then_exactly_on_time,
    a_fixed_window_charge_carries_its_debt_only_to_the_end_of_the_window,
    a_sliding_log_records_at_most_256_entries_of_charges,
    a_charge_of_a_key_never_seen_starts_from_a_full_limit,
    a_charge_sent_again_with_its_id_is_applied_once_and_answered_as_the_first_time,
    a_charge_id_is_remembered_per_counter_and_a_charge_without_one_is_applied_every_time,
);
