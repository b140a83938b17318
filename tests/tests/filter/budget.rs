//! What one request costs the filter, counted in wasm-host rather than timed: the host
//! calls it makes (each crosses from V8's compiled wasm into Envoy's C++), the host's
//! re-entries into its allocator (Envoy hands the guest bytes by calling back into it),
//! its allocations, and its 128-bit arithmetic (`__multi3`, `__udivti3`, ... are calls
//! on wasm32). Counts, not times: they are the same on every machine, so this budget can
//! never flake, and a change that adds one fails here. When a change is meant to move a
//! count, change the budget here and say what it costs in docs/benchmarks.md (section
//! "Envoy", what a request costs).

use super::*;
use sluice::host::Counter;
use wasm_host::CallCounts;

/// What is counted in the guest: the C allocator under Rust's `System` allocator on
/// `wasm32-wasip1`, the compiler's 128-bit helpers, and the instructions V8 runs as calls
/// out of the compiled code (bulk-memory copies and fills) or through a table
/// (`call_indirect`: the SDK's trait objects).
const PROBES: [&str; 11] = [
    "malloc",
    "calloc",
    "realloc",
    "__multi3",
    "__udivti3",
    "__umodti3",
    "__ashlti3",
    "__lshrti3",
    "memory.copy",
    "memory.fill",
    "call_indirect",
];

/// One local policy keyed on a header, as the Envoy benchmark's `sluice, admitted` and
/// `sluice, rejected` rows configure it.
fn local_policy(rate: &str, burst: u64) -> String {
    format!(
        r#"{{"policies":[{{"name":"key","key":[{{"header":"x-api-key"}}],"rate":"{rate}","burst":{burst}}}],
           "response":{{"headers_on_rejected":["retry_after","ratelimit"]}}}}"#
    )
}

/// What the fourth request of a key costs, the whole stream (request, response, end):
/// the first three create the key's slot and warm the worker's tables.
fn one_request(config: &str) -> (u16, CallCounts) {
    let mut host = builder(config).count_calls_to(PROBES).count_instructions().build().expect("the filter starts");
    for _ in 0..3 {
        send(&mut host, Request::get("/").header("x-api-key", "k"));
    }
    let before = host.call_counts();
    let status = status(&mut host, Request::get("/").header("x-api-key", "k"));
    (status, &host.call_counts() - &before)
}

/// Instructions the guest runs for one whole request (wasmtime's fuel, one unit per wasm
/// instruction, the probes' counting included), by path: what the request path costs
/// the guest, the same on every machine. A change that adds more than
/// [`INSTRUCTION_HEADROOM_PERCENT`] fails here and must raise the budget knowingly, with
/// the figure in its commit and in docs/benchmarks.md; one that removes more than
/// [`INSTRUCTION_SLACK_PERCENT`] must lower it, so the budget stays a measure.
const INSTRUCTIONS_LOCAL_ADMITTED: u64 = 14_151;
const INSTRUCTIONS_LOCAL_REJECTED: u64 = 16_592;
const INSTRUCTIONS_LEASE_SPEND: u64 = 20_978;
const INSTRUCTIONS_CHECK: u64 = 42_744;
const INSTRUCTION_HEADROOM_PERCENT: u64 = 2;
const INSTRUCTION_SLACK_PERCENT: u64 = 10;

fn assert_instructions(path: &str, counts: &CallCounts, budget: u64) {
    let ran = counts.instructions;
    eprintln!("{path}: {ran} instructions (budget {budget})");
    assert!(
        ran <= budget + budget * INSTRUCTION_HEADROOM_PERCENT / 100,
        "{path}: {ran} instructions, above the budget of {budget} (+{INSTRUCTION_HEADROOM_PERCENT} %): raise it \
         knowingly, with the figure in the commit and docs/benchmarks.md"
    );
    assert!(
        ran >= budget - budget * INSTRUCTION_SLACK_PERCENT / 100,
        "{path}: {ran} instructions, far below the budget of {budget}: lower it to keep it a measure"
    );
}

/// The release module's size in bytes (the build `tests/artifacts` makes, which the
/// proxies load): held as the instructions are, with the same headroom and slack. What
/// takes the space is in docs/benchmarks.md ("the local path").
const MODULE_BYTES: u64 = 1_063_713;

#[test]
fn the_release_module_stays_within_its_size_budget() {
    let bytes = std::fs::metadata(wasm()).expect("the release module is built").len();
    eprintln!("sluice.wasm: {bytes} bytes (budget {MODULE_BYTES})");

    assert!(
        bytes <= MODULE_BYTES + MODULE_BYTES * INSTRUCTION_HEADROOM_PERCENT / 100,
        "sluice.wasm is {bytes} bytes, above its budget of {MODULE_BYTES} (+{INSTRUCTION_HEADROOM_PERCENT} %): raise \
         it knowingly, with the figure in the commit and docs/benchmarks.md"
    );
    assert!(
        bytes >= MODULE_BYTES - MODULE_BYTES * INSTRUCTION_SLACK_PERCENT / 100,
        "sluice.wasm is {bytes} bytes, far below its budget of {MODULE_BYTES}: lower it to keep it a measure"
    );
}

/// Counts as `(name, count)` pairs, for a readable failure.
fn pairs(counts: &std::collections::BTreeMap<String, u64>) -> Vec<(&str, u64)> {
    counts.iter().map(|(name, n)| (name.as_str(), *n)).collect()
}

/// The host calls of an admission from a bucket kept in shared data (a local policy's,
/// or a lease's): the key header, the clock, the bucket read and written by CAS (each
/// read re-enters the allocator once, as does the header), the offered and allowed
/// counters.
const ADMISSION: [(&str, u64); 6] = [
    ("clock_time_get", 1),
    ("proxy_get_header_map_value", 1),
    ("proxy_get_shared_data", 1),
    ("proxy_increment_metric", 2),
    ("proxy_on_memory_allocate", 2),
    ("proxy_set_shared_data", 1),
];

#[test]
fn an_admitted_request_makes_only_the_host_calls_its_decision_needs() {
    let (status, counts) = one_request(&local_policy("1000000/second", 1_000_000));

    assert_eq!(status, 200);
    assert_eq!(
        pairs(&counts.host),
        ADMISSION,
        "the key header, the clock, the bucket read and written by CAS, and the offered and allowed counters"
    );
    assert_eq!(
        pairs(&counts.guest),
        // memory.copy: 31, 32 once the request's state carried the overrides that decided
        // it, 35 once concurrency policies were added, 26 once what a local request never
        // has stopped being carried inline (docs/benchmarks.md); no host call or
        // allocation was added.
        [("__multi3", 3), ("call_indirect", 7), ("malloc", 4), ("memory.copy", 26), ("memory.fill", 1)]
    );
    assert_instructions("a local policy's admitted request", &counts, INSTRUCTIONS_LOCAL_ADMITTED);
}

#[test]
fn a_rejected_request_makes_no_host_call_beyond_its_decision_and_its_reply() {
    let (status, counts) = one_request(&local_policy("1/hour", 1));

    assert_eq!(status, 429);
    assert_eq!(
        pairs(&counts.host),
        [
            ("clock_time_get", 1),
            ("proxy_get_header_map_value", 1),
            ("proxy_get_shared_data", 1),
            ("proxy_increment_metric", 3),
            ("proxy_on_memory_allocate", 2),
            ("proxy_send_local_response", 1),
        ],
        "no CAS write (nothing is spent), and the reply"
    );
    assert_eq!(pairs(&counts.guest), [("__multi3", 4), ("call_indirect", 7), ("malloc", 15), ("memory.copy", 30)]);
    assert_instructions("a local policy's rejected request", &counts, INSTRUCTIONS_LOCAL_REJECTED);
}

#[test]
fn with_metrics_flush_a_request_makes_no_metric_host_call_and_its_counts_arrive_on_the_tick() {
    let config = local_policy("1000000/second", 1_000_000).replacen('{', r#"{"metrics_flush":"1s","#, 1);
    let mut host = builder(&config).build().expect("the filter starts");
    let before = host.call_counts();
    for _ in 0..5 {
        assert_eq!(status(&mut host, Request::get("/").header("x-api-key", "k")), 200);
    }
    let calls = &host.call_counts() - &before;

    assert_eq!(calls.host("proxy_increment_metric"), 0, "{calls:?}");
    assert_eq!(metric(&host, "key", Counter::Offered), 0, "held in the VM until the flush");
    host.advance(secs(1));
    assert_eq!(metric(&host, "key", Counter::Offered), 5);
    assert_eq!(metric(&host, "key", Counter::Allowed), 5);
    assert_eq!(
        (&host.call_counts() - &before).host("proxy_increment_metric"),
        3,
        "one host call per counter that moved (offered, allowed, and keys_created for the first request's new \
         key), whatever the number of requests"
    );
    assert_accounting(&host, "key");
}

/// One lease policy whose service grants 1 000 tokens at a time, 2 ms away; a key is
/// leased from its first request.
fn leasing() -> wasm_host::HostBuilder {
    let config = r#"{
      "counter_service": {"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY", "timeout": "50ms"},
      "policies": [{"name": "key", "key": [{"header": "x-api-key"}], "rate": "100000/second", "burst": 100000,
                    "global": {"strategy": "lease", "lease": {"size": 1000, "duration": "10s", "low_water": 10, "cold_below": 0}}}]
    }"#;
    let grant = r#"{"granted":1000,"expires_in_ms":10000,"at_ns":1,"entry":{"verdict":"allowed","limit":100000,
      "remaining":99000,"reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}}"#;
    builder(config)
        .env("SLUICE_HASH_KEY", "fleet-hash-key-0123456789abcdef")
        .count_calls_to(PROBES)
        .count_instructions()
        .scripted_cluster("sluice-counter", move |_| wasm_host::Answer::status(200).body(grant).after(millis(2)))
}

#[test]
fn a_request_spent_from_its_lease_reads_only_its_lease_record() {
    let mut host = leasing().build().expect("the filter starts");
    let first = host.worker(0).request(Request::get("/").header("x-api-key", "k"));
    host.advance(millis(2));
    assert!(matches!(host.worker(0).outcome(first).unwrap(), wasm_host::Outcome::Forwarded(_)), "the grant came");
    for _ in 0..3 {
        send(&mut host, Request::get("/").header("x-api-key", "k"));
    }

    let before = host.call_counts();
    let status = status(&mut host, Request::get("/").header("x-api-key", "k"));
    let counts = &host.call_counts() - &before;

    assert_eq!(status, 200);
    assert_eq!(
        pairs(&counts.host),
        ADMISSION,
        "the lease record read and written by CAS, as a local bucket: the circuit breaker is read only for a \
         request that would wait for a refill"
    );
    assert_instructions("a lease policy's request spent from its lease", &counts, INSTRUCTIONS_LEASE_SPEND);
}

#[test]
fn a_checked_request_runs_no_more_instructions_than_its_budget() {
    let config = r#"{
      "counter_service": {"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY", "timeout": "50ms"},
      "policies": [{"name": "key", "key": [{"header": "x-api-key"}], "rate": "100000/second", "burst": 100000,
                    "global": {"strategy": "check"}}]
    }"#;
    let allowed = r#"{"admitted":true,"at_ns":1,"entries":[{"verdict":"allowed","limit":100000,"remaining":99999,
      "reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}]}"#;
    let mut host = builder(config)
        .env("SLUICE_HASH_KEY", "fleet-hash-key-0123456789abcdef")
        .count_calls_to(PROBES)
        .count_instructions()
        .scripted_cluster("sluice-counter", move |_| wasm_host::Answer::status(200).body(allowed).after(millis(2)))
        .build()
        .expect("the filter starts");
    let checked = |host: &mut Host| {
        let stream = host.worker(0).request(Request::get("/").header("x-api-key", "k"));
        host.advance(millis(2));
        assert!(matches!(host.worker(0).outcome(stream).unwrap(), wasm_host::Outcome::Forwarded(_)));
        host.worker(0).respond(stream, Response::ok()).unwrap();
    };
    for _ in 0..3 {
        checked(&mut host);
    }

    let before = host.call_counts();
    checked(&mut host);
    let counts = &host.call_counts() - &before;

    assert_eq!(counts.host("proxy_http_call"), 1, "{counts:?}");
    // Its wait for the service's answer, one sample: the one host call the wait
    // histogram adds to a request that waited (a request that did not wait makes none,
    // as the tables of the local paths hold).
    assert_eq!(counts.host("proxy_record_metric"), 1, "{counts:?}");
    assert_instructions("a check policy's admitted request", &counts, INSTRUCTIONS_CHECK);
}

#[test]
fn a_refill_answer_reads_the_breaker_once_and_the_lease_record_once_per_update() {
    let mut host = leasing().build().expect("the filter starts");
    let waiting = host.worker(0).request(Request::get("/").header("x-api-key", "k"));
    assert!(host.worker(0).outcome(waiting).unwrap().is_paused(), "it waits for the first refill");

    let before = host.call_counts();
    host.advance(millis(2));
    let counts = &host.call_counts() - &before;

    assert!(matches!(host.worker(0).outcome(waiting).unwrap(), wasm_host::Outcome::Forwarded(_)));
    assert_eq!(
        counts.host("proxy_get_shared_data"),
        3,
        "the breaker (the answer's health), the record the grant is written to, and the record the waiter spends \
         from: {counts:?}"
    );
    assert_eq!(counts.host("proxy_set_shared_data"), 2, "the grant, and the waiter's spend: {counts:?}");
}

/// The instructions of one admitted local request, by the function that ran them
/// ([`wasm_host::HostBuilder::profile_instructions`]): where the budget goes. Printed
/// with `--nocapture`, largest first.
#[test]
fn the_profile_of_an_admitted_local_request_accounts_for_every_instruction_its_budget_counts() {
    let config = local_policy("1000000/second", 1_000_000);
    // The fourth request of a key, as `one_request` sends it, on a module rewritten one
    // way or the other (without the probes, whose counting the budget includes).
    let fourth = |host: wasm_host::HostBuilder| {
        let mut host = host.build().expect("the filter starts");
        for _ in 0..3 {
            send(&mut host, Request::get("/").header("x-api-key", "k"));
        }
        let before = host.call_counts();
        let status = status(&mut host, Request::get("/").header("x-api-key", "k"));
        (status, &host.call_counts() - &before)
    };
    let (_, plain) = fourth(builder(&config).count_instructions());
    let (status, profiled) = fourth(builder(&config).profile_instructions());
    let profile = profiled.profile;

    let mut by_cost: Vec<(&String, &u64)> = profile.iter().collect();
    by_cost.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    eprintln!("{:>7}  in all", plain.instructions);
    for (name, n) in by_cost.iter().take(40) {
        eprintln!("{n:>7}  {name}");
    }
    assert_eq!(status, 200);
    assert_eq!(
        profile.values().sum::<u64>(),
        plain.instructions,
        "each function's own instructions add up to what wasmtime's fuel counts for the same request"
    );
}
