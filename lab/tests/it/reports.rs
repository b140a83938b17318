//! The shipped scenarios reproduce the seeds' labs (the numbers, not the pixels); every
//! report keeps the accounting line; the same seed gives the same bytes.

use super::{lab_dir, run_shipped, run_shipped_on, run_text};
use sluice_lab::report::{self, Summary};

/// Every (scenario, configuration) pair `lab/render.sh` renders, parsed from the script,
/// so that the script and this test cannot drift apart.
fn rendered_pairs() -> Vec<(String, String)> {
    let script = std::fs::read_to_string(lab_dir().join("render.sh")).expect("lab/render.sh");
    script
        .lines()
        .filter_map(|line| line.trim().strip_prefix("run "))
        .map(|rest| {
            let mut words = rest.split_whitespace();
            (words.next().unwrap_or_default().to_owned(), words.next().unwrap_or_default().to_owned())
        })
        .collect()
}

fn summary(scenario: &str, config: &str) -> Summary {
    Summary::of(&run_shipped(scenario, config))
}

#[test]
fn every_shipped_scenario_is_rendered_by_the_script_and_keeps_the_accounting_line() {
    let pairs = rendered_pairs();
    let shipped: Vec<String> = std::fs::read_dir(lab_dir().join("scenarios"))
        .expect("lab/scenarios")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    // The four shipped today (the seeds' two labs, the game day, the retry wave): a loop
    // over nothing would prove nothing.
    assert!(shipped.len() >= 4, "the shipped scenarios were found: {shipped:?}");
    assert!(pairs.len() >= shipped.len(), "lab/render.sh renders each at least once: {pairs:?}");
    for name in &shipped {
        assert!(pairs.iter().any(|(s, _)| s == name), "lab/render.sh does not render {name}");
    }
    for (scenario, config) in &pairs {
        let summary = summary(scenario, config);
        for p in &summary.policies {
            assert!(p.accounting_holds, "{scenario} under {config}: policy {} breaks the accounting line", p.name);
        }
        for c in &summary.classes {
            assert!(c.accounting_holds, "{scenario} under {config}: class {} breaks the accounting line", c.name);
            let t = &c.totals;
            assert_eq!(t.offered, t.allowed + t.rejected + t.failed + t.pending);
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_report_byte_for_byte_and_another_seed_another() {
    let first = report::render(&run_shipped("gameday.yaml", "gameday.json"));
    let again = report::render(&run_shipped("gameday.yaml", "gameday.json"));
    assert_eq!(first, again);
    let text = std::fs::read_to_string(lab_dir().join("scenarios/launch-spike.yaml")).expect("shipped");
    let config = std::fs::read_to_string(lab_dir().join("configs/bucket-reject.json")).expect("shipped");
    let a = report::render(&run_text(&text, &config));
    let b = report::render(&run_text(&text.replace("seed: 11", "seed: 12"), &config));
    assert_ne!(a, b);
}

#[test]
fn the_report_is_the_same_whatever_the_number_of_threads_the_proxies_run_on() {
    // The game day's faults reach every path a thread could reorder: calls to a slow,
    // partitioned and restarted service, a clock step, synchronized retries.
    let one = report::render(&run_shipped_on("gameday.yaml", "gameday.json", 1));
    let three = report::render(&run_shipped_on("gameday.yaml", "gameday.json", 3));
    assert_eq!(one, three);
}

#[test]
fn no_answer_of_the_counter_service_reaches_a_proxy_after_it_was_due() {
    for (scenario, config) in
        [("gameday.yaml", "gameday.json"), ("regions-partition.yaml", "identity-check-fail-closed.json")]
    {
        let outcome = run_shipped_on(scenario, config, 2);
        assert!(outcome.service_calls > 1_000, "{scenario}: {} calls", outcome.service_calls);
        assert_eq!(outcome.late_answers, 0, "{scenario} under {config}");
        assert_eq!(outcome.late_calls, 0, "{scenario} under {config}: calls decided out of order");
    }
}

#[test]
fn a_bounded_queue_turns_the_launch_spikes_rejections_into_waits_of_at_most_two_seconds() {
    let reject = summary("launch-spike.yaml", "bucket-reject.json");
    let queue = summary("launch-spike.yaml", "bucket-queue.json");
    let (r, q) = (&reject.classes[0], &queue.classes[0]);
    assert_eq!(r.max_wait_us, 0, "a token bucket holds nothing: {r:?}");
    assert!(q.max_wait_us > 1_000_000 && q.max_wait_us <= 2_050_000, "waits up to the 2 s bound: {q:?}");
    assert!(r.totals.rejected > 0 && q.totals.rejected > 0, "the spike is larger than what either lets through");
    // The queue holds work that the bucket answers at once; both let the same long-run
    // rate through.
    assert!(reject.policies[0].allowed.abs_diff(queue.policies[0].allowed) <= 45);
}

#[test]
fn retries_are_new_offered_work_and_come_back_as_waves() {
    let s = summary("retry-wave.yaml", "bucket-reject.json");
    for class in &s.classes {
        assert!(class.totals.retries > 0, "{class:?}");
    }
    let outcome = run_shipped("retry-wave.yaml", "bucket-reject.json");
    // In step, the refused calls of the burst (10–11 s) come back one second later, all
    // at once: the class offers more at 11–12 s than its 10 per second.
    let in_step: u64 = outcome
        .series
        .rows
        .iter()
        .filter(|r| r.end > 11_000_000_000 && r.end <= 12_000_000_000)
        .map(|r| r.classes[0].retries)
        .sum();
    assert!(in_step > 0, "the wave of retries arrives a backoff later");
}

#[test]
fn failing_open_shows_up_as_global_overshoot_and_failing_closed_as_blocked_legitimate_traffic() {
    let open = summary("regions-partition.yaml", "identity-check-fail-open.json");
    let closed = summary("regions-partition.yaml", "identity-check-fail-closed.json");
    let (o, c) = (&open.policies[0], &closed.policies[0]);
    let users = |s: &Summary| s.classes.iter().find(|c| c.name == "users").cloned().expect("users");
    // Open: the partitioned region admits its abuser without a budget.
    assert!(o.failure_allowed > 0 && o.by_fallback > 0, "{o:?}");
    assert!(o.overshoot.unwrap_or(0) > 500, "{o:?}");
    assert_eq!(users(&open).totals.failed, 0, "nobody legitimate is refused: {:?}", users(&open));
    // Closed: no overshoot beyond the promise, and the partitioned region's legitimate
    // users are refused.
    assert_eq!(c.beyond_promise, 0, "{c:?}");
    assert!(c.overshoot.unwrap_or(u64::MAX) < 50, "{c:?}");
    assert!(users(&closed).totals.failed > 100, "{:?}", users(&closed));
    assert!(c.fallback_ms >= 19_000, "the partition's 20 s of fallback are measured: {c:?}");
}

#[test]
fn local_counters_duplicate_the_budget_and_leases_cut_the_callouts_of_a_central_counter() {
    let local = summary("regions-partition.yaml", "identity-local.json");
    let check = summary("regions-partition.yaml", "identity-check-fail-closed.json");
    let lease = summary("regions-partition.yaml", "identity-lease-fail-closed.json");
    assert_eq!(local.callouts, 0);
    assert!(local.policies[0].overshoot.unwrap_or(0) > 500, "{:?}", local.policies[0]);
    assert!(
        lease.callouts_per_1000 < check.callouts_per_1000,
        "{} vs {}",
        lease.callouts_per_1000,
        check.callouts_per_1000
    );
    // Leases sized to each key's demand, and cold keys checked, strand almost nothing
    // at idle users' proxies (a lease of the whole size each used to strand most of it).
    let p = &lease.policies[0];
    assert!(p.lease_granted > 0 && p.lease_expired * 20 <= p.lease_granted, "at most 5 % stranded: {p:?}");
    assert_eq!(lease.policies[0].beyond_promise, 0, "{:?}", lease.policies[0]);
}

#[test]
fn the_game_day_names_every_fallback_admission_and_keeps_the_rest_within_the_documented_bound() {
    let s = summary("gameday.yaml", "gameday.json");
    let p = s.policies.iter().find(|p| p.name == "per-user").expect("per-user");
    assert!(p.degraded > 0 && p.emergency_allowed > 0, "{p:?}");
    // What the filter counted as fallback admissions, the lab saw named in its header.
    let fallback = p.emergency_allowed + p.failure_allowed;
    assert!(p.by_fallback <= fallback && p.by_fallback + 10 >= fallback, "{p:?}");
    assert_eq!(p.beyond_promise, 0, "{p:?}");
    // A new identity per request: no per-identity limit holds it back.
    let crawler = s.classes.iter().find(|c| c.name == "crawler").expect("crawler");
    assert!(crawler.served_permille() >= 950, "{crawler:?}");
    let html =
        String::from_utf8(report::render(&run_shipped("gameday.yaml", "gameday.json")).remove(0).1).expect("UTF-8");
    // Self-contained: inline SVG, nothing fetched, no script.
    assert!(html.contains("<svg") && !html.contains("<script") && !html.contains("src=") && !html.contains("href="));
    assert!(html.contains("us partitioned from the service"));
}

#[test]
fn a_lease_that_cannot_serve_a_request_while_the_service_is_healthy_has_it_decided_by_the_service_never_degraded() {
    // 200 callers on a lease table of 4 slots: most requests find their slot held by
    // another caller's lease, with the counter service healthy throughout.
    let scenario = "name: few slots\nseed: 7\nduration: 10s\ninterval: 1s\nfleet:\n  regions:\n    - {name: all, proxies: 2}\n  workers: 1\ncallers:\n  - name: clients\n    path: /api/items\n    headers: {x-user: \"{key}\"}\n    keys: {count: 200, hot_share: 0.1}\n    rate:\n      - {at: 0s, rps: 200}\n";
    let config = r#"{"counter_service": {"cluster": "sluice-counter", "timeout": "50ms",
        "token_env": "SLUICE_COUNTER_TOKEN", "hash_key_env": "SLUICE_HASH_KEY"},
        "policies": [{"name": "per-user", "key": [{"header": "x-user"}], "rate": "300/minute", "burst": 20,
        "slots": 4, "global": {"strategy": "lease", "lease": {"size": 5, "duration": "2s"}},
        "on_failure": {"action": "deny"}}]}"#;

    let summary = Summary::of(&run_text(scenario, config));

    let p = &summary.policies[0];
    assert_eq!((p.degraded, p.failure_denied, p.failure_allowed), (0, 0, 0), "{p:?}");
    assert!(p.lease_checked > 100, "the slots could not serve most callers: {p:?}");
    assert!(p.allowed > 1000, "and the service admitted them: {p:?}");
    assert_eq!(p.beyond_promise, 0, "{p:?}");
    let verdict = report::verdict(&summary);
    assert!(verdict.contains("decided by the service per request"), "{verdict}");
    assert!(!verdict.contains("answer was not had"), "{verdict}");
}

#[test]
fn a_caller_that_moves_to_another_region_is_served_from_what_its_old_proxies_returned() {
    // One identity, a budget of 60 a minute (burst 100) leased up to 100 for 10 s: 40
    // requests a second through region eu for 2 s, then 10 a second through region us.
    // The eu proxies' leases hold what the caller no longer spends there.
    let s = summary("moving-caller.yaml", "moving-lease.json");

    let p = &s.policies[0];
    assert!(p.lease_returned > 0, "the eu proxies returned what they would not spend: {p:?}");
    let in_us = s.classes.iter().find(|c| c.name == "in-us").expect("in-us");
    // From 2 s to 20 s the budget gives back one a second: 18 at most, without returns.
    assert!(
        in_us.totals.allowed > 18 + p.lease_returned / 2,
        "us was granted what eu returned ({} returned): {in_us:?}",
        p.lease_returned
    );
    assert_eq!((p.degraded, p.beyond_promise), (0, 0), "{p:?}");
}
