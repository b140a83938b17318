//! Table-driven scenarios for every algorithm: burst, steady rate, window boundaries,
//! costs above capacity, exact retry-after, and clock steps in both directions.
//!
//! The same file runs natively (`cargo test`) and on `wasm32-unknown-unknown` under
//! Node (`wasm-bindgen-test-runner`), so the filter's targets give the same answers.

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use shared_store::{Decision, Limit, Nanos, Rate, State, Verdict};

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// One request in a scenario, and what the limit must answer.
struct Step {
    at: u64,
    cost: u64,
    expect: Expect,
}

#[derive(Debug, PartialEq)]
enum Expect {
    Allow { remaining: u64 },
    Delay { delay: u64 },
    Reject { retry_after: u64 },
    Exceeds,
}

fn allow(at: u64, cost: u64, remaining: u64) -> Step {
    Step { at, cost, expect: Expect::Allow { remaining } }
}
fn delay(at: u64, cost: u64, delay: u64) -> Step {
    Step { at, cost, expect: Expect::Delay { delay } }
}
fn reject(at: u64, cost: u64, retry_after: u64) -> Step {
    Step { at, cost, expect: Expect::Reject { retry_after } }
}
fn exceeds(at: u64, cost: u64) -> Step {
    Step { at, cost, expect: Expect::Exceeds }
}

fn observed(decision: &Decision) -> Expect {
    match decision.verdict {
        Verdict::Allowed => Expect::Allow { remaining: decision.remaining },
        Verdict::Delayed(d) => Expect::Delay { delay: d.0 },
        Verdict::Rejected { retry_after } => Expect::Reject { retry_after: retry_after.0 },
        Verdict::Exceeds => Expect::Exceeds,
    }
}

/// Runs `steps` in order against one key and checks every answer. Every rejection is
/// also checked for exactness: the same cost is admitted at `at + retry_after` and not
/// one nanosecond before (on the state as it stands).
fn run(name: &str, limit: Limit, steps: &[Step]) {
    let mut state: Option<State> = None;
    for (i, step) in steps.iter().enumerate() {
        let (decision, next) = limit.decide(state.as_ref(), Nanos(step.at), step.cost);
        assert_eq!(observed(&decision), step.expect, "{name}: step {i} at {} cost {}", step.at, step.cost);
        if let Verdict::Rejected { retry_after } = decision.verdict {
            let on_time = limit.decide(state.as_ref(), Nanos(step.at + retry_after.0), step.cost).0;
            assert!(on_time.is_admitted(), "{name}: step {i}: not admitted after exactly {retry_after}");
            let early = limit.decide(state.as_ref(), Nanos(step.at + retry_after.0 - 1), step.cost).0;
            assert!(!early.is_admitted(), "{name}: step {i}: admitted 1ns before {retry_after}");
        }
        if next.is_some() {
            state = next;
        }
    }
}

fn rate(amount: u64, per: u64) -> Rate {
    Rate::new(amount, Nanos(per)).unwrap()
}

#[test]
fn token_bucket_admits_the_burst_then_the_rate() {
    // 10/s (one token per 100ms), burst 3.
    let limit = Limit::token_bucket(rate(10, S), 3).unwrap();
    let t0 = 1000 * S;
    run(
        "token bucket",
        limit,
        &[
            allow(t0, 1, 2),
            allow(t0, 1, 1),
            allow(t0, 1, 0),
            reject(t0, 1, 100 * MS),
            reject(t0 + 99 * MS, 1, MS),
            allow(t0 + 100 * MS, 1, 0),
            reject(t0 + 150 * MS, 1, 50 * MS),
            allow(t0 + 200 * MS, 1, 0),
            // Idle for long: refills to the burst, never beyond.
            allow(t0 + 3600 * S, 1, 2),
            allow(t0 + 3600 * S, 2, 0),
            reject(t0 + 3600 * S, 1, 100 * MS),
        ],
    );
}

#[test]
fn token_bucket_charges_costs_and_rejects_a_cost_above_the_burst_without_spending() {
    let limit = Limit::token_bucket(rate(1, S), 5).unwrap();
    let t0 = 50 * S;
    run(
        "token bucket costs",
        limit,
        &[
            exceeds(t0, 6),
            allow(t0, 3, 2),
            reject(t0, 3, S),
            exceeds(t0, u64::MAX),
            allow(t0 + S, 3, 0),
            reject(t0 + S, 5, 5 * S),
        ],
    );
}

#[test]
fn token_bucket_rates_that_do_not_divide_a_second_stay_exact() {
    // 3 per second: a token every 333_333_333.33 ns.
    let limit = Limit::token_bucket(rate(3, S), 3).unwrap();
    let t0 = 7 * S;
    run(
        "token bucket 3/s",
        limit,
        &[
            allow(t0, 3, 0),
            reject(t0, 1, 333_333_334),
            allow(t0 + 333_333_334, 1, 0),
            reject(t0 + 333_333_334, 1, 333_333_333),
            allow(t0 + 666_666_667, 1, 0),
            // Three tokens take exactly one second: rounding never accumulates.
            reject(t0 + 666_666_667, 1, 333_333_333),
            allow(t0 + S, 1, 0),
        ],
    );
}

#[test]
fn token_bucket_never_refills_when_the_clock_steps_back() {
    let limit = Limit::token_bucket(rate(1, S), 2).unwrap();
    let t0 = 10_000 * S;
    run(
        "token bucket backward step",
        limit,
        &[
            allow(t0, 2, 0),
            // One hour earlier: nothing refills; the wait is measured from the new time.
            reject(t0 - 3600 * S, 1, 3601 * S),
            reject(t0, 1, S),
            // A step forward refills at most to the burst.
            allow(t0 + 1_000_000 * S, 1, 1),
        ],
    );
}

#[test]
fn fixed_window_resets_at_the_boundary() {
    let limit = Limit::fixed_window(2, Nanos(60 * S)).unwrap();
    let t0 = 600 * S; // the start of window 10
    run(
        "fixed window",
        limit,
        &[
            allow(t0 + 59 * S, 1, 1),
            allow(t0 + 59 * S, 1, 0),
            reject(t0 + 59 * S, 1, S),
            // The boundary burst the algorithm is known for: a full window right after.
            allow(t0 + 60 * S, 2, 0),
            reject(t0 + 61 * S, 1, 59 * S),
            exceeds(t0 + 61 * S, 3),
            // Backwards into the previous window: counted against the stored one.
            reject(t0 + 30 * S, 1, 90 * S),
            allow(t0 + 120 * S, 1, 1),
        ],
    );
}

#[test]
fn sliding_window_weights_the_previous_window() {
    let limit = Limit::sliding_window(4, Nanos(10 * S)).unwrap();
    let t0 = 100 * S; // start of window 10
    run(
        "sliding window",
        limit,
        &[
            allow(t0 + 5 * S, 4, 0),
            reject(t0 + 9 * S, 1, S + 5 * S / 2),
            // Window 11 at 2.5s: previous 4 weighs 4 × 7.5/10 = 3, so one unit fits.
            allow(t0 + 12 * S + S / 2, 1, 0),
            reject(t0 + 12 * S + S / 2, 1, 5 * S / 2),
            allow(t0 + 15 * S, 1, 0),
            exceeds(t0 + 15 * S, 5),
            // Two windows later everything has slid out.
            allow(t0 + 30 * S, 4, 0),
        ],
    );
}

#[test]
fn sliding_log_counts_exactly_the_trailing_window() {
    let limit = Limit::sliding_log(3, Nanos(10 * S)).unwrap();
    let t0 = 100 * S;
    run(
        "sliding log",
        limit,
        &[
            allow(t0, 1, 2),
            allow(t0 + 4 * S, 2, 0),
            reject(t0 + 5 * S, 1, 5 * S),
            allow(t0 + 10 * S, 1, 0),
            reject(t0 + 10 * S, 2, 4 * S),
            allow(t0 + 14 * S, 2, 0),
            exceeds(t0 + 14 * S, 4),
            // Clock back: entries stay in order and nothing expires early.
            reject(t0 + 2 * S, 1, 18 * S),
        ],
    );
}

#[test]
fn leaky_bucket_spaces_requests_and_bounds_queue_and_wait() {
    // Drains 2/s (every 500ms); queue of 3 units; waits at most 1s.
    let limit = Limit::leaky_bucket(rate(2, S), 3, Nanos(S)).unwrap();
    let t0 = 20 * S;
    run(
        "leaky bucket",
        limit,
        &[
            allow(t0, 1, 2),
            delay(t0, 1, 500 * MS),
            delay(t0, 1, S),
            // Queue full (3 units waiting).
            reject(t0, 1, 500 * MS),
            delay(t0 + 500 * MS, 1, S),
            // The wait bound bites before the queue bound for a cost of 2.
            reject(t0 + 600 * MS, 1, 400 * MS),
            exceeds(t0 + 600 * MS, 4),
            allow(t0 + 10 * S, 1, 2),
        ],
    );
}

#[test]
fn a_zero_cost_request_is_a_query_that_spends_nothing() {
    let limit = Limit::token_bucket(rate(1, S), 2).unwrap();
    run("query", limit, &[allow(S, 0, 2), allow(S, 2, 0), allow(S, 0, 0), reject(S, 1, S)]);
}

#[test]
fn decisions_report_limit_and_reset() {
    let limit = Limit::token_bucket(rate(10, S), 5).unwrap();
    let (decision, state) = limit.decide(None, Nanos(S), 2);
    assert_eq!(decision.limit, 5);
    assert_eq!(decision.remaining, 3);
    assert_eq!(decision.reset_after, Nanos(200 * MS));
    assert_eq!(limit.period(), Nanos(500 * MS));
    let (later, _) = limit.decide(state.as_ref(), Nanos(S + 100 * MS), 0);
    assert_eq!(later.reset_after, Nanos(100 * MS));
}

#[test]
fn extreme_parameters_neither_panic_nor_admit_beyond_capacity() {
    let limits = [
        Limit::token_bucket(rate(u64::MAX, 1), u64::MAX).unwrap(),
        Limit::token_bucket(rate(1, u64::MAX), 1).unwrap(),
        Limit::fixed_window(u64::MAX, Nanos(u64::MAX)).unwrap(),
        Limit::sliding_window(u64::MAX, Nanos(1)).unwrap(),
        Limit::leaky_bucket(rate(u64::MAX, u64::MAX), u64::MAX, Nanos::MAX).unwrap(),
    ];
    for limit in limits {
        let mut state = None;
        for at in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX, 3] {
            for cost in [1, u64::MAX] {
                let (decision, next) = limit.decide(state.as_ref(), Nanos(at), cost);
                assert!(cost <= limit.capacity() || !decision.is_admitted());
                if next.is_some() {
                    state = next;
                }
            }
        }
    }
}
