//! The shared behavioural suite: every scenario runs on the memory store, on a Redis
//! server and on a 3-master Redis Cluster, and over HTTP/1.1 and h2c (a memory-store
//! service on a manual clock), with the same expected answers (computed by hand from
//! the algorithms' definitions). Time is set by each call (the stores' test override,
//! or the service's clock), so nothing sleeps.

use shared_store::{Nanos, Verdict};
use sluice_protocol::EntryRequest;
use sluice_protocol::LimitSpec;

use crate::support::*;

const MS: u64 = 1000; // microseconds

fn bucket() -> LimitSpec {
    // 2 per second: one token every 500 ms; bursts of 4.
    LimitSpec::TokenBucket { amount: 2, per_ms: 1000, burst: 4 }
}

fn rejected(ms: u64) -> Verdict {
    Verdict::Rejected { retry_after: Nanos::from_millis(ms) }
}

async fn one(target: Target<'_>, tag: &str, e: EntryRequest, at_us: u64) -> shared_store::Decision {
    let outcome = target.check(tag, vec![e], t_us(at_us)).await;
    assert_eq!(outcome.decisions.len(), 1);
    assert_eq!(outcome.admitted, outcome.decisions[0].is_admitted());
    outcome.decisions[0]
}

async fn a_token_bucket_admits_its_burst_then_rejects_with_the_exact_wait(target: Target<'_>, tag: &str) {
    let mut remaining = Vec::new();
    for _ in 0..4 {
        let d = one(target, tag, entry("k", bucket(), 1), 0).await;
        assert_eq!(d.verdict, Verdict::Allowed);
        remaining.push(d.remaining);
    }
    let fifth = one(target, tag, entry("k", bucket(), 1), 0).await;

    assert_eq!(remaining, [3, 2, 1, 0]);
    assert_eq!(fifth.verdict, rejected(500));
    assert_eq!((fifth.limit, fifth.remaining, fifth.reset_after), (4, 0, Nanos::from_millis(2000)));
}

async fn a_rejected_client_is_admitted_at_exactly_retry_after_and_not_a_microsecond_before(
    target: Target<'_>,
    tag: &str,
) {
    for _ in 0..4 {
        one(target, tag, entry("k", bucket(), 1), 0).await;
    }

    let early = one(target, tag, entry("k", bucket(), 1), 500 * MS - 1).await;
    let on_time = one(target, tag, entry("k", bucket(), 1), 500 * MS).await;

    assert_eq!(early.verdict, Verdict::Rejected { retry_after: Nanos(1000) });
    assert_eq!(on_time.verdict, Verdict::Allowed);
}

async fn a_token_bucket_refills_at_its_rate_up_to_its_burst(target: Target<'_>, tag: &str) {
    for _ in 0..4 {
        one(target, tag, entry("k", bucket(), 1), 0).await;
    }

    let after_one_second = one(target, tag, entry("k", bucket(), 0), 1000 * MS).await;
    let mut admitted_after_an_hour = 0;
    for _ in 0..6 {
        if one(target, tag, entry("k", bucket(), 1), 3_600_000 * MS).await.is_admitted() {
            admitted_after_an_hour += 1;
        }
    }

    assert_eq!(after_one_second.remaining, 2);
    assert_eq!(admitted_after_an_hour, 4);
}

async fn a_fixed_window_resets_at_the_window_boundary(target: Target<'_>, tag: &str) {
    let limit = LimitSpec::FixedWindow { limit: 3, window_ms: 1000 };
    let mut admitted = 0;
    for _ in 0..3 {
        admitted += u32::from(one(target, tag, entry("k", limit, 1), 250 * MS).await.is_admitted());
    }

    let fourth = one(target, tag, entry("k", limit, 1), 250 * MS).await;
    let next_window = one(target, tag, entry("k", limit, 1), 1000 * MS).await;

    assert_eq!(admitted, 3);
    assert_eq!(fourth.verdict, rejected(750));
    assert_eq!(fourth.reset_after, Nanos::from_millis(750));
    assert_eq!((next_window.verdict, next_window.remaining), (Verdict::Allowed, 2));
}

async fn a_sliding_window_weighs_the_previous_window_by_its_overlap(target: Target<'_>, tag: &str) {
    let limit = LimitSpec::SlidingWindow { limit: 4, window_ms: 1000 };
    for _ in 0..4 {
        assert!(one(target, tag, entry("k", limit, 1), 0).await.is_admitted());
    }

    // 250 ms into the next window, 75 % of the previous 4 still counts: 3 used, 1 left.
    let fits = one(target, tag, entry("k", limit, 1), 1250 * MS).await;
    let over = one(target, tag, entry("k", limit, 1), 1250 * MS).await;
    let later = one(target, tag, entry("k", limit, 1), 1500 * MS).await;

    assert_eq!((fits.verdict, fits.remaining), (Verdict::Allowed, 0));
    assert_eq!(over.verdict, rejected(250));
    assert_eq!(later.verdict, Verdict::Allowed);
}

async fn a_sliding_log_counts_exactly_the_trailing_window(target: Target<'_>, tag: &str) {
    let limit = LimitSpec::SlidingLog { limit: 3, window_ms: 1000 };
    for at in [0, 100, 200] {
        assert!(one(target, tag, entry("k", limit, 1), at * MS).await.is_admitted());
    }

    let full = one(target, tag, entry("k", limit, 1), 300 * MS).await;
    let first_expired = one(target, tag, entry("k", limit, 1), 1000 * MS).await;
    let still_full = one(target, tag, entry("k", limit, 1), 1050 * MS).await;

    assert_eq!(full.verdict, rejected(700));
    assert_eq!(first_expired.verdict, Verdict::Allowed);
    assert_eq!(still_full.verdict, rejected(50));
}

async fn a_leaky_bucket_delays_within_its_queue_and_rejects_beyond_it(target: Target<'_>, tag: &str) {
    let limit = LimitSpec::LeakyBucket { amount: 1, per_ms: 100, max_queue: 3, max_wait_ms: 250 };
    let mut verdicts = Vec::new();
    for _ in 0..4 {
        verdicts.push(one(target, tag, entry("k", limit, 1), 0).await.verdict);
    }

    assert_eq!(
        verdicts,
        [
            Verdict::Allowed,
            Verdict::Delayed(Nanos::from_millis(100)),
            Verdict::Delayed(Nanos::from_millis(200)),
            rejected(100),
        ]
    );
}

async fn a_check_with_one_rejecting_entry_spends_nothing_on_the_others(target: Target<'_>, tag: &str) {
    let window = LimitSpec::FixedWindow { limit: 1, window_ms: 60_000 };
    let both = || vec![entry("user", bucket(), 1), entry("route", window, 1)];
    let first = target.check(tag, both(), t_us(0)).await;

    let second = target.check(tag, both(), t_us(10 * MS)).await;
    let user_after = one(target, tag, entry("user", bucket(), 0), 10 * MS).await;

    assert!(first.admitted);
    assert!(!second.admitted);
    assert_eq!(second.decisions[0].verdict, Verdict::Allowed, "the bucket alone would admit");
    assert!(matches!(second.decisions[1].verdict, Verdict::Rejected { .. }));
    assert_eq!(user_after.remaining, 3, "the rejected check spent nothing on the bucket");
}

async fn a_new_policy_version_starts_from_fresh_state(target: Target<'_>, tag: &str) {
    let small = LimitSpec::TokenBucket { amount: 1, per_ms: 60_000, burst: 2 };
    let v = |version| EntryRequest { policy_version: version, ..entry("k", small, 1) };
    one(target, tag, v(1), 0).await;
    one(target, tag, v(1), 0).await;

    let old = one(target, tag, v(1), 0).await;
    let new = one(target, tag, v(2), 0).await;

    assert!(matches!(old.verdict, Verdict::Rejected { .. }));
    assert_eq!((new.verdict, new.remaining), (Verdict::Allowed, 1));
}

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

async fn a_cost_of_zero_queries_without_spending(target: Target<'_>, tag: &str) {
    one(target, tag, entry("k", bucket(), 3), 0).await;

    let first = one(target, tag, entry("k", bucket(), 0), 100 * MS).await;
    let second = one(target, tag, entry("k", bucket(), 0), 100 * MS).await;

    assert_eq!(first, second);
    assert_eq!((first.verdict, first.remaining, first.reset_after), (Verdict::Allowed, 1, Nanos::from_millis(1400)));
}

async fn time_that_steps_backwards_never_refills(target: Target<'_>, tag: &str) {
    for _ in 0..4 {
        one(target, tag, entry("k", bucket(), 1), 10_000 * MS).await;
    }

    let earlier = one(target, tag, entry("k", bucket(), 1), 9_000 * MS).await;
    let later = one(target, tag, entry("k", bucket(), 1), 10_500 * MS).await;

    assert_eq!(earlier.verdict, rejected(500), "decided at the key's latest time, not before it");
    assert_eq!(later.verdict, Verdict::Allowed);
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

fn per_minute(burst: u64) -> LimitSpec {
    LimitSpec::TokenBucket { amount: 1, per_ms: 60_000, burst }
}

async fn a_policy_whose_numbers_change_without_a_version_bump_keeps_its_counter(target: Target<'_>, tag: &str) {
    for _ in 0..10 {
        assert!(one(target, tag, entry("k", per_minute(10), 1), 0).await.is_admitted());
    }

    let raised = one(target, tag, entry("k", per_minute(20), 1), 0).await;
    let bumped = one(target, tag, EntryRequest { policy_version: 1, ..entry("k", per_minute(20), 1) }, 0).await;
    // A minute on, one token is back: 9 of 10 spent, so 1 of 5 left under a burst of 5.
    let lowered = one(target, tag, entry("k", per_minute(5), 1), 60_000 * MS).await;
    let lowered_again = one(target, tag, entry("k", per_minute(5), 1), 60_000 * MS).await;

    assert_eq!(raised.verdict, rejected(60_000), "no fresh bucket: still empty, refilling at its rate");
    assert_eq!((raised.limit, raised.remaining), (20, 0));
    assert_eq!((bumped.verdict, bumped.remaining), (Verdict::Allowed, 19), "a new version starts afresh");
    assert_eq!((lowered.verdict, lowered.remaining), (Verdict::Allowed, 0));
    assert_eq!(lowered_again.verdict, rejected(60_000));
}

async fn a_lease_and_a_charge_share_the_counter_whatever_numbers_they_carry(target: Target<'_>, tag: &str) {
    let leased = target.lease(tag, "k", per_minute(10), 10, t_us(0)).await;

    let raised = target.lease(tag, "k", per_minute(20), 5, t_us(0)).await;
    let charged = target.charge(tag, "k", per_minute(20), (3, 2), t_us(0)).await;
    let checked = one(target, tag, entry("k", per_minute(10), 1), 0).await;

    assert_eq!(leased.granted, 10);
    assert_eq!((raised.granted, raised.decision.verdict), (0, rejected(60_000)), "the raise hands out nothing");
    assert_eq!((charged.charged, charged.forgiven), (2, 1), "empty under 20, then 2 below empty");
    // Back under 10: 22 spent is more than empty, so empty (a debt is capped at empty).
    assert_eq!(checked.verdict, rejected(60_000));
}

async fn a_window_whose_numbers_change_keeps_what_it_counted(target: Target<'_>, tag: &str) {
    let window = |limit, window_ms| LimitSpec::FixedWindow { limit, window_ms };
    for _ in 0..3 {
        assert!(one(target, tag, entry("k", window(3, 1000), 1), 250 * MS).await.is_admitted());
    }

    let raised = [
        one(target, tag, entry("k", window(5, 1000), 1), 250 * MS).await,
        one(target, tag, entry("k", window(5, 1000), 1), 250 * MS).await,
        one(target, tag, entry("k", window(5, 1000), 1), 250 * MS).await,
    ];
    // A longer window starts with what this one counted, until it ends.
    let longer = one(target, tag, entry("k", window(5, 2000), 1), 500 * MS).await;
    // Another algorithm starts exhausted.
    let logged = one(target, tag, entry("k", LimitSpec::SlidingLog { limit: 5, window_ms: 1000 }, 1), 600 * MS).await;

    assert_eq!(raised.map(|d| d.verdict), [Verdict::Allowed, Verdict::Allowed, rejected(750)]);
    assert_eq!((longer.verdict, longer.remaining), (rejected(1500), 0));
    assert_eq!(logged.verdict, rejected(1000));
}

macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            use crate::support::{Protocol, Served, Target};

            #[tokio::test]
            async fn on_the_memory_store() {
                let _shared = crate::support::HEAVY.read().await;
                super::$scenario(Target::Store(&crate::support::memory_store()), "t").await;
            }

            #[tokio::test]
            async fn on_redis() {
                let _shared = crate::support::HEAVY.read().await;
                let redis = crate::support::RedisServer::start();
                super::$scenario(Target::Store(&crate::support::redis_store(&redis)), "t").await;
                redis.assert_every_key_has_a_ttl();
            }

            #[tokio::test]
            async fn on_a_redis_cluster() {
                let _shared = crate::support::HEAVY.read().await;
                let cluster = crate::support::shared_cluster();
                super::$scenario(Target::Store(&crate::support::cluster_store(cluster)), stringify!($scenario)).await;
                cluster.assert_every_key_has_a_ttl();
            }

            #[tokio::test]
            async fn over_http1() {
                let _shared = crate::support::HEAVY.read().await;
                let served = Served::start(Protocol::Http1).await;
                super::$scenario(Target::Http(&served), "t").await;
                served.running.stop().await.expect("clean stop");
            }

            #[tokio::test]
            async fn over_h2c() {
                let _shared = crate::support::HEAVY.read().await;
                let served = Served::start(Protocol::H2c).await;
                super::$scenario(Target::Http(&served), "t").await;
                served.running.stop().await.expect("clean stop");
            }
        }
    )*};
}

on_every_store!(
    a_token_bucket_admits_its_burst_then_rejects_with_the_exact_wait,
    a_rejected_client_is_admitted_at_exactly_retry_after_and_not_a_microsecond_before,
    a_token_bucket_refills_at_its_rate_up_to_its_burst,
    a_fixed_window_resets_at_the_window_boundary,
    a_sliding_window_weighs_the_previous_window_by_its_overlap,
    a_sliding_log_counts_exactly_the_trailing_window,
    a_leaky_bucket_delays_within_its_queue_and_rejects_beyond_it,
    a_check_with_one_rejecting_entry_spends_nothing_on_the_others,
    a_new_policy_version_starts_from_fresh_state,
    a_policy_whose_numbers_change_without_a_version_bump_keeps_its_counter,
    a_lease_and_a_charge_share_the_counter_whatever_numbers_they_carry,
    a_window_whose_numbers_change_keeps_what_it_counted,
    a_lease_deducts_the_granted_tokens_from_the_global_budget,
    a_lease_with_a_minimum_grants_nothing_below_it_and_answers_the_minimums_exact_wait,
    a_lease_that_leaves_less_than_its_minimum_answers_the_exact_wait_until_the_minimum_is_back,
    a_window_lease_lives_no_longer_than_the_window_it_was_decided_in,
    a_cost_of_zero_queries_without_spending,
    time_that_steps_backwards_never_refills,
    a_charge_spends_what_was_admitted_and_forgives_beyond_the_debt_bound,
    a_counter_in_debt_admits_nothing_until_repaid_and_then_exactly_on_time,
    a_fixed_window_charge_carries_its_debt_only_to_the_end_of_the_window,
    a_sliding_log_records_at_most_256_entries_of_charges,
    a_charge_of_a_key_never_seen_starts_from_a_full_limit,
    a_charge_sent_again_with_its_id_is_applied_once_and_answered_as_the_first_time,
    a_charge_id_is_remembered_per_counter_and_a_charge_without_one_is_applied_every_time,
);
