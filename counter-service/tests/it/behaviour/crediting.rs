//! Whether credits give back alike on every store: what a token bucket, a fixed window and
//! a sliding window get back of the units a check spent on an estimate and the request
//! did not use (as many as the counter can take back, and the answer says how many),
//! where nothing is given back, and how a credit is remembered by its id (scenarios of
//! the shared behavioural suite).

use shared_store::{Nanos, Verdict};
use sluice_protocol::LimitSpec;

use super::{MS, bucket, one};
use crate::support::*;

async fn a_token_bucket_credited_gets_its_units_back_and_never_more_than_its_burst(target: Target<'_>, tag: &str) {
    let spent = one(target, tag, entry("k", bucket(), 3), 0).await;

    let back = target.credit(tag, "k", bucket(), (2, t_us(0)), t_us(0)).await;
    let beyond_the_burst = target.credit(tag, "k", bucket(), (5, t_us(0)), t_us(0)).await;
    let full = target.credit(tag, "k", bucket(), (1, t_us(0)), t_us(0)).await;
    let never_seen = target.credit(tag, "never", bucket(), (1, t_us(0)), t_us(0)).await;
    let whole_burst = one(target, tag, entry("k", bucket(), 4), 0).await;

    assert_eq!(spent.remaining, 1);
    assert_eq!((back.credited, back.forgiven, back.duplicate, back.at), (2, 0, false, t_us(0)));
    // One token of debt left, at 500 ms a token.
    assert_eq!(back.decision.verdict, Verdict::Allowed);
    assert_eq!((back.decision.remaining, back.decision.reset_after), (3, Nanos::from_millis(500)));
    assert_eq!(
        (beyond_the_burst.credited, beyond_the_burst.forgiven, beyond_the_burst.decision.remaining),
        (1, 4, 4),
        "full, and no fuller: the one token missing given back, the other four forgiven"
    );
    assert_eq!(beyond_the_burst.decision.reset_after, Nanos::ZERO);
    assert_eq!((full.credited, full.forgiven, full.decision.remaining), (0, 1, 4), "nothing to give back to");
    assert_eq!((never_seen.credited, never_seen.forgiven, never_seen.decision.remaining), (0, 1, 4));
    assert_eq!((whole_burst.verdict, whole_burst.remaining), (Verdict::Allowed, 0), "the burst, not more");
}

async fn a_token_bucket_that_refilled_meanwhile_is_credited_only_up_to_full(target: Target<'_>, tag: &str) {
    one(target, tag, entry("k", bucket(), 4), 0).await;

    // 1.5 s on, three tokens are back: a credit of 3 tops the bucket up to its 4, giving
    // back the one token missing.
    let topped_up = target.credit(tag, "k", bucket(), (3, t_us(0)), t_us(1500 * MS)).await;
    let burst = one(target, tag, entry("k", bucket(), 4), 1500 * MS).await;
    let fifth = one(target, tag, entry("k", bucket(), 1), 1500 * MS).await;

    assert_eq!((topped_up.credited, topped_up.forgiven, topped_up.decision.remaining), (1, 2, 4));
    assert_eq!(burst.verdict, Verdict::Allowed);
    assert_eq!(fifth.verdict, Verdict::Rejected { retry_after: Nanos::from_millis(500) });
}

async fn a_fixed_window_is_credited_only_in_the_window_the_spend_counted_in(target: Target<'_>, tag: &str) {
    let limit = LimitSpec::FixedWindow { limit: 5, window_ms: 1000 };
    let before_the_window = Nanos(t_us(0).as_u64() - 1);
    one(target, tag, entry("k", limit, 4), 250 * MS).await;

    let same_window = target.credit(tag, "k", limit, (3, t_us(250 * MS)), t_us(500 * MS)).await;
    let spent_earlier = target.credit(tag, "k", limit, (1, before_the_window), t_us(600 * MS)).await;
    one(target, tag, entry("k", limit, 2), 1250 * MS).await;
    let window_gone = target.credit(tag, "k", limit, (2, t_us(250 * MS)), t_us(1300 * MS)).await;
    let this_window = target.credit(tag, "k", limit, (5, t_us(1250 * MS)), t_us(1300 * MS)).await;
    let at_zero = target.credit(tag, "k", limit, (1, t_us(1250 * MS)), t_us(1300 * MS)).await;

    assert_eq!((same_window.credited, same_window.decision.remaining), (3, 4));
    assert_eq!(same_window.decision.reset_after, Nanos::from_millis(500), "the count ends with its window");
    assert_eq!((spent_earlier.credited, spent_earlier.forgiven, spent_earlier.decision.remaining), (0, 1, 4));
    assert_eq!((window_gone.credited, window_gone.forgiven), (0, 2), "the window that counted it has ended");
    assert_eq!(window_gone.decision.remaining, 3);
    assert_eq!(
        (this_window.credited, this_window.forgiven, this_window.decision.remaining),
        (2, 3, 5),
        "down to zero, never below: the 2 counted given back, the rest forgiven"
    );
    assert_eq!(this_window.decision.reset_after, Nanos::ZERO);
    assert_eq!((at_zero.credited, at_zero.forgiven), (0, 1), "nothing counted: nothing to give back");
}

async fn a_sliding_window_is_credited_in_its_previous_window_once_it_has_moved_on(target: Target<'_>, tag: &str) {
    let limit = LimitSpec::SlidingWindow { limit: 4, window_ms: 1000 };
    one(target, tag, entry("k", limit, 4), 0).await;
    // Half-way into the next window, half of the previous 4 still counts: 2 used, 1 spent.
    let moved_on = one(target, tag, entry("k", limit, 1), 1500 * MS).await;

    let previous = target.credit(tag, "k", limit, (3, t_us(0)), t_us(1500 * MS)).await;
    let current = target.credit(tag, "k", limit, (1, t_us(1200 * MS)), t_us(1500 * MS)).await;
    one(target, tag, entry("k", limit, 1), 2500 * MS).await;
    let two_windows_on = target.credit(tag, "k", limit, (2, t_us(0)), t_us(2500 * MS)).await;

    assert_eq!(moved_on.remaining, 1);
    // 1 left of the previous 4, weighed by half, and 1 in this window: 1.5 used.
    assert_eq!((previous.credited, previous.decision.remaining), (3, 2));
    assert_eq!((current.credited, current.decision.remaining), (1, 3), "0.5 used");
    assert_eq!((two_windows_on.credited, two_windows_on.forgiven), (0, 2), "the spend no longer counts");
    assert_eq!(two_windows_on.decision.remaining, 3);
}

async fn a_credit_sent_again_with_its_id_is_applied_once_and_answered_as_the_first_time(target: Target<'_>, tag: &str) {
    one(target, tag, entry("k", bucket(), 4), 0).await;

    let first = target.credit_once(tag, "k", bucket(), (2, t_us(0)), Some("r-1"), t_us(0)).await;
    let again = target.credit_once(tag, "k", bucket(), (2, t_us(0)), Some("r-1"), t_us(100 * MS)).await;
    let check_after = one(target, tag, entry("k", bucket(), 0), 100 * MS).await;
    let another_id = target.credit_once(tag, "k", bucket(), (1, t_us(0)), Some("r-2"), t_us(100 * MS)).await;
    let nothing_first = target.credit_once(tag, "full", bucket(), (3, t_us(0)), Some("r-1"), t_us(0)).await;
    let nothing_again = target.credit_once(tag, "full", bucket(), (3, t_us(0)), Some("r-1"), t_us(0)).await;

    assert_eq!((first.credited, first.forgiven, first.duplicate), (2, 0, false));
    assert_eq!((again.credited, again.forgiven, again.duplicate), (2, 0, true), "the first answer, repeated");
    // 2 tokens of debt, 100 ms of which have refilled.
    assert_eq!(again.decision.reset_after, Nanos::from_millis(900), "the entry is the limit as it stands now");
    assert_eq!((check_after.remaining, check_after.reset_after), (2, Nanos::from_millis(900)), "given back once");
    assert_eq!((another_id.credited, another_id.duplicate), (1, false));
    assert_eq!((nothing_first.credited, nothing_first.forgiven), (0, 3), "another counter, another credit");
    assert_eq!(
        (nothing_again.credited, nothing_again.forgiven, nothing_again.duplicate),
        (0, 3, true),
        "what was forgiven is answered again too"
    );
}

async fn a_credit_id_and_a_charge_id_with_the_same_text_are_independent(target: Target<'_>, tag: &str) {
    let charged = target.charge_once(tag, "k", bucket(), (3, 0), Some("same"), t_us(0)).await;
    let credited = target.credit_once(tag, "k", bucket(), (2, t_us(0)), Some("same"), t_us(0)).await;
    let charged_again = target.charge_once(tag, "k", bucket(), (3, 0), Some("same"), t_us(0)).await;
    let credited_again = target.credit_once(tag, "k", bucket(), (2, t_us(0)), Some("same"), t_us(0)).await;

    assert_eq!((charged.charged, charged.duplicate, charged.decision.remaining), (3, false, 1));
    assert_eq!((credited.credited, credited.duplicate, credited.decision.remaining), (2, false, 3));
    assert_eq!((charged_again.charged, charged_again.duplicate, charged_again.decision.remaining), (3, true, 3));
    assert_eq!((credited_again.credited, credited_again.duplicate, credited_again.decision.remaining), (2, true, 3));
}

on_every_store!(
    a_token_bucket_credited_gets_its_units_back_and_never_more_than_its_burst,
    a_token_bucket_that_refilled_meanwhile_is_credited_only_up_to_full,
    a_fixed_window_is_credited_only_in_the_window_the_spend_counted_in,
    a_sliding_window_is_credited_in_its_previous_window_once_it_has_moved_on,
    a_credit_sent_again_with_its_id_is_applied_once_and_answered_as_the_first_time,
    a_credit_id_and_a_charge_id_with_the_same_text_are_independent,
);
