//! A token bucket under constant overload admits exactly `burst + rate × T`.

use super::run_text;
use sluice_lab::report::Summary;

/// 200 requests per second, evenly spaced, from one caller for 10 s (2001 arrivals, the
/// last at T = 10 s), then silence while the last answers arrive.
fn flood(proxies: usize, workers: usize) -> String {
    format!(
        "name: closed form\nseed: 3\nduration: 11s\nfleet:\n  regions: [{{name: a, proxies: {proxies}}}]\n  workers: {workers}\n\
         callers:\n  - name: flood\n    headers: {{x-user: one}}\n    arrivals: even\n    rate: [{{at: 0s, rps: 200}}, {{at: 10001ms, rps: 0}}]\n"
    )
}

const LOCAL: &str = r#"{"policies":[{"name":"p","key":[{"header":"x-user"}],"rate":"10/second","burst":20}]}"#;
const CHECK: &str = r#"{"counter_service":{"cluster":"sluice-counter","token_env":"SLUICE_COUNTER_TOKEN","hash_key_env":"SLUICE_HASH_KEY"},
 "policies":[{"name":"p","key":[{"header":"x-user"}],"rate":"10/second","burst":20,"global":{"strategy":"check"}}]}"#;

/// burst + rate × T for burst 20, 10/s, T = 10 s.
const EXACT: u64 = 20 + 10 * 10;

#[test]
fn a_local_token_bucket_under_constant_overload_admits_burst_plus_rate_times_t_exactly() {
    let outcome = run_text(&flood(1, 2), LOCAL);
    let summary = Summary::of(&outcome);
    assert_eq!(summary.requests, 2001);
    assert_eq!(summary.classes[0].totals.allowed, EXACT, "{summary:#?}");
    assert_eq!(summary.policies[0].allowed, EXACT, "the filter's own count");
    assert_eq!(summary.policies[0].rejected, 2001 - EXACT);
    assert_eq!(summary.policies[0].overshoot, Some(0));
}

#[test]
fn three_proxies_with_a_local_bucket_each_admit_three_budgets_and_the_report_calls_two_of_them_overshoot() {
    // Each arrival goes to a proxy at random, so each proxy sees a third of the flood: it
    // admits its whole budget but for the refill that came after its own last arrival.
    let outcome = run_text(&flood(3, 2), LOCAL);
    let summary = Summary::of(&outcome);
    let allowed = summary.classes[0].totals.allowed;
    assert!((3 * EXACT - 3..=3 * EXACT).contains(&allowed), "{summary:#?}");
    // The reference bucket of the one budget takes at most EXACT of them.
    let overshoot = summary.policies[0].overshoot.expect("a token bucket is replayed");
    assert!((allowed - EXACT..=allowed - EXACT + 3).contains(&overshoot), "{overshoot} of {allowed}");
}

#[test]
fn a_global_check_policy_on_three_proxies_admits_one_budget_exactly() {
    let outcome = run_text(&flood(3, 2), CHECK);
    let summary = Summary::of(&outcome);
    assert_eq!(summary.classes[0].totals.allowed, EXACT, "{summary:#?}");
    assert_eq!(summary.policies[0].beyond_promise, 0);
    assert_eq!(summary.policies[0].degraded, 0, "a healthy service decides every request");
}

#[test]
fn numbers_raised_by_a_configuration_push_mid_run_take_effect_at_the_push_and_carry_the_allowance_over() {
    // 10/s burst 20 for 5 s, then every proxy reloads 20/s burst 20: the first 5 s admit
    // 20 + 10 × 5, the next 5 s (carried over empty) 20 × 5.
    let dir = tempfile::tempdir().expect("a temp dir");
    let raised = dir.path().join("raised.json");
    std::fs::write(&raised, LOCAL.replace("10/second", "20/second")).expect("written");
    let scenario = format!(
        "name: push\nseed: 4\nduration: 11s\nfleet:\n  regions: [{{name: a, proxies: 1}}]\n  workers: 1\n\
         callers:\n  - name: flood\n    headers: {{x-user: one}}\n    arrivals: even\n    rate: [{{at: 0s, rps: 200}}, {{at: 10001ms, rps: 0}}]\n\
         faults:\n  - {{kind: config, at: 5001ms, file: {}}}\n",
        raised.display()
    );
    let outcome = run_text(&scenario, LOCAL);
    let allowed_by = |end_ns: u64| -> u64 {
        outcome.series.rows.iter().filter(|r| r.end <= end_ns).map(|r| r.classes[0].allowed).sum()
    };
    assert_eq!(allowed_by(5_000_000_000), 20 + 10 * 5, "before the push");
    let after = allowed_by(11_000_000_000) - allowed_by(5_000_000_000);
    assert!((99..=101).contains(&after), "after the push: {after}");
    assert!(outcome.series.rows.iter().all(|r| r.events.is_empty()), "every proxy took the reload");
}
