//! Whether every store decides alike (the shared behavioural suite): every scenario runs on
//! the memory store, on a Redis server and on a 3-master Redis Cluster, and over HTTP/1.1
//! and h2c (a memory-store service on a manual clock), with the same expected answers
//! (computed by hand from the algorithms' definitions). Time is set by each call (the
//! stores' test override, or the service's clock), so nothing sleeps.
//!
//! This file holds the checks; `behaviour/spending.rs` the leases and charges,
//! `behaviour/crediting.rs` the credits.

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

async fn a_key_rejected_under_raised_numbers_refills_at_the_raised_rate_from_then(target: Target<'_>, tag: &str) {
    for _ in 0..5 {
        assert!(one(target, tag, entry("k", per_minute(5), 1), 0).await.is_admitted());
    }
    // Raised (an operator's clamp lifted): 10 a second, bursts of 10.
    let raised = || LimitSpec::TokenBucket { amount: 10, per_ms: 1000, burst: 10 };

    let at_once = one(target, tag, entry("k", raised(), 1), 0).await;
    let later = one(target, tag, entry("k", raised(), 1), 500 * MS).await;

    assert_eq!(at_once.verdict, rejected(100), "nothing fresh: empty, refilling at the raised rate");
    assert_eq!(
        (later.verdict, later.remaining),
        (Verdict::Allowed, 4),
        "half a second at 10 a second refills 5 (carried over again from the old state, it would be 0)"
    );
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

mod crediting;
mod spending;

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
    a_window_whose_numbers_change_keeps_what_it_counted,
    a_key_rejected_under_raised_numbers_refills_at_the_raised_rate_from_then,
    a_cost_of_zero_queries_without_spending,
    time_that_steps_backwards_never_refills,
);
