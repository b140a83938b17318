//! `sluice.wasm` inside real Envoy (1.40, V8): what it adds per request, beside Envoy's own
//! C++ `local_ratelimit` and a no-op wasm filter, measured in one run.
//!
//! Envoy runs with one worker pinned to CPU 0 (`taskset`), `wrk` (keep-alive, saturating,
//! 32 connections) pinned to CPU 1; variants are alternated over `ROUNDS` rounds of
//! `SECONDS` each, so every variant sees the same machine; the figure per variant is the
//! median of its rounds. With the worker saturated on its core, `1 / requests per second`
//! is its CPU per request, so "added ns" is `1e9/rps(variant) - 1e9/rps(no filter)`.
//!
//! Groups (`BENCH_GROUPS`, comma-separated, default all; not `GROUPS`, which bash reserves):
//! * `local`: no filter; the no-op wasm filter; native `local_ratelimit` admitting and
//!   rejecting; Sluice admitting, rejecting, and admitting with headers on allowed
//!   responses; the test guest making the host calls of one admission and nothing else;
//!   2 workers on one hot key, native and Sluice.
//! * `calls`: the test guest making one kind of host call 20 times per request, beside
//!   its no-op mode: what one host call costs in V8 (where Sluice's time goes).
//! * `global`: no filter, and Sluice with one policy local, global in `check` mode and
//!   global in `lease` mode against `sluice-counter` (memory store, over h2c, and once
//!   in `check` mode over HTTP/1.1; pinned to CPU 1 with wrk); check mode with its checks
//!   committed together (the default) and each alone (`check, each alone`), and, by
//!   name, with any bound on calls in flight (`check, <n> in flight`); callouts per 1000
//!   requests; latency at one connection beside one loopback round trip to the service
//!   itself. `GLOBAL_MODES` (names separated by `;`) runs only the modes it names.
//!
//! * `costs`: Sluice with one local policy in front of answers that report their cost
//!   (Envoy answers a JSON document, or an event stream of 6 events, with the usage in
//!   it and in a header), the cost known at admission (a constant) beside the cost read
//!   from the response header, the JSON body, and the stream's last event: what settling
//!   to the response adds per request.
//!
//! * `rls`: Envoy's own `ratelimit` filter against sluice-counter's RLS front door (the
//!   release binary: `cargo build --release -p sluice-counter`; memory and Redis) beside
//!   Limitador (`LIMITADOR_BIN`), sluice.wasm in check mode against the same service, and
//!   each service alone under a gRPC load generator (`RLS_CONNECTIONS`, default 64, with
//!   `RLS_STREAMS` calls in flight on each, default `1,4`; `COUNTER_BASELINE_BIN` adds an
//!   older sluice-counter build); see
//!   `rls.rs`. Not in the default groups.
//! * `mixed` (issue 39): the lab's per-user lease policy under one hot caller and 10 000
//!   cold ones at a fixed rate (`MIXED_RATE`, default 2 000 a second), in check and lease
//!   mode (and the `BASELINE_WASM` build's): callouts per 1 000 requests and degraded
//!   answers; see `mixed.rs`. Not in the default groups. Build the bench with `--profile lab` for it: the
//!   load generator runs in this binary, and in the dev profile it is slower than the
//!   services it measures.
//!
//! * `first_byte`: the time to an event stream's first byte from a real streaming
//!   upstream, without Sluice and with a policy that reads the stream's last event
//!   (`FIRST_BYTE_REQUESTS` each, default 2000, alternated one by one).
//!
//! Run: `ROUNDS=5 SECONDS=8 cargo run --release -p sluice-envoy-bench` (needs `wrk`:
//! `apt-get install -y wrk`; Envoy from `envoy-config/install-envoy.sh`). `PROFILE=<variant
//! name>` instead holds one variant under load for `perf`. Figures and method:
//! docs/benchmarks.md.

use serde_json::{Value, json};
use sluice_tests::counter::{self, Counter};
use sluice_tests::envoy::{Envoy, EnvoyBuilder, sluice};
use std::collections::BTreeMap;
use std::process::Command;

mod first_byte;
mod global;
mod mixed;
mod rls;
mod rls_load;

use first_byte::first_byte_group;
use global::{global_envoy, global_group};

const TOKEN: &str = "bench-token";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// CPU time the hypervisor gave to others so far (`steal` in `/proc/stat`, in ticks)
/// and all CPU time: a run whose steal share is more than a few percent was not
/// measured on a quiet machine, whatever its load average said.
fn steal_and_total() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> =
        stat.lines().next().unwrap_or_default().split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    (fields.get(7).copied().unwrap_or(0), fields.iter().take(8).sum())
}

/// One `wrk` run: requests per second and the latency percentiles it printed (µs), and
/// the CPU time Envoy spent per request meanwhile (all its threads, from
/// `/proc/<pid>/stat`): unlike `1 / rate`, it leaves out time the machine gave to others
/// (another process, the hypervisor's steal), so it is the steadier figure on a shared
/// machine.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    requests: f64,
    cpu_ns_per_request: f64,
}

/// CPU time process `pid` has used (user + system, all threads), in ns.
fn cpu_ns(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces, so split after `)`).
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // USER_HZ is 100 on Linux.
    Some(ticks * 1e7)
}

/// `wrk` against `envoy`, with Envoy's CPU time per request.
fn measure(envoy: &Envoy, headers: &[&str], connections: u32, seconds: u64) -> Sample {
    let url = format!("http://{}/", envoy.addr());
    let before = envoy.pid().and_then(cpu_ns);
    let mut sample = wrk(&url, headers, connections, seconds, None);
    let after = envoy.pid().and_then(cpu_ns);
    if let (Some(before), Some(after)) = (before, after) {
        sample.cpu_ns_per_request = (after - before) / sample.requests.max(1.0);
    }
    sample
}

fn micros(text: &str) -> f64 {
    let (number, unit) = text.split_at(text.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(text.len()));
    let value: f64 = number.parse().unwrap_or(f64::NAN);
    match unit {
        "us" => value,
        "ms" => value * 1000.0,
        "s" => value * 1e6,
        _ => f64::NAN,
    }
}

/// Runs wrk on CPU 1 against `url` with `headers`, `connections`, for `seconds`.
fn wrk(url: &str, headers: &[&str], connections: u32, seconds: u64, script: Option<&str>) -> Sample {
    let mut command = Command::new("taskset");
    command.args(["-c", "1", "wrk", "-t1", "--latency"]).arg(format!("-c{connections}")).arg(format!("-d{seconds}s"));
    for header in headers {
        command.args(["-H", header]);
    }
    if let Some(script) = script {
        command.args(["-s", script]);
    }
    let output = command.arg(url).output().expect("wrk runs (apt-get install -y wrk)");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut sample = Sample::default();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["Requests/sec:", rps] => sample.rps = rps.parse().unwrap_or(0.0),
            [requests, "requests", "in", ..] => sample.requests = requests.parse().unwrap_or(0.0),
            ["50%", value] => sample.p50_us = micros(value),
            ["99%", value] => sample.p99_us = micros(value),
            _ => {}
        }
    }
    assert!(sample.rps > 0.0, "wrk printed no rate:\n{text}");
    if text.contains("Non-2xx") && !headers.iter().any(|h| h.contains("reject")) {
        eprintln!("note: non-2xx answers in a run meant to admit:\n{text}");
    }
    sample
}

/// The median of a variant's Envoy CPU time per request (NaN when it was not run).
fn cpu_per_request(samples: &BTreeMap<&'static str, Vec<Sample>>, name: &str) -> f64 {
    median(&mut samples.get(name).into_iter().flatten().map(|s| s.cpu_ns_per_request).collect::<Vec<_>>())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn native_local_ratelimit(tokens: u64) -> Value {
    let bucket = json!({ "max_tokens": tokens, "tokens_per_fill": tokens, "fill_interval": "1s" });
    let percent = json!({ "default_value": { "numerator": 100, "denominator": "HUNDRED" }, "runtime_key": "rl" });
    json!({
        "name": "envoy.filters.http.local_ratelimit",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
            "stat_prefix": "native",
            "token_bucket": { "max_tokens": 1_000_000_000u64, "tokens_per_fill": 1_000_000_000u64, "fill_interval": "1s" },
            "filter_enabled": percent,
            "filter_enforced": percent,
            "descriptors": [{ "entries": [{ "key": "api-key" }], "token_bucket": bucket }],
            "rate_limits": [{ "actions": [{ "request_headers": { "header_name": "x-api-key", "descriptor_key": "api-key" } }] }],
            "max_dynamic_descriptors": 10_000,
        },
    })
}

fn sluice_local(rate: &str, burst: u64, allowed_headers: bool) -> String {
    let allowed = if allowed_headers { r#","headers_on_allowed":["ratelimit"]"# } else { "" };
    format!(
        r#"{{"policies":[{{"name":"key","key":[{{"header":"x-api-key"}}],"rate":"{rate}","burst":{burst}}}],
           "response":{{"headers_on_rejected":["retry_after","ratelimit"]{allowed}}}}}"#
    )
}

/// A variant: how to build its Envoy, and the request header wrk sends.
struct Variant {
    name: &'static str,
    builder: Box<dyn Fn() -> EnvoyBuilder>,
    header: &'static str,
}

fn variant(name: &'static str, header: &'static str, builder: impl Fn() -> EnvoyBuilder + 'static) -> Variant {
    Variant { name, builder: Box::new(builder), header }
}

fn base(workers: usize) -> EnvoyBuilder {
    Envoy::builder().workers(workers).cpu(0).log_level("error")
}

fn local_group() -> Vec<Variant> {
    let noop = sluice("bench=noop").wasm(sluice_artifacts::TEST_GUEST_WASM);
    let noop2 = noop.clone();
    let admit_calls = sluice("bench=admit").wasm(sluice_artifacts::TEST_GUEST_WASM);
    let mut variants = vec![
        variant("no filter", "x-api-key: admit", || base(1)),
        variant("no-op wasm filter", "x-api-key: admit", move || base(1).sluice(noop.clone())),
        variant("native local_ratelimit, admitted", "x-api-key: admit", || {
            base(1).filter(native_local_ratelimit(1_000_000_000))
        }),
        variant("native local_ratelimit, rejected", "x-api-key: reject", || base(1).filter(native_local_ratelimit(1))),
        variant("sluice, admitted", "x-api-key: admit", || {
            base(1).sluice(sluice(&sluice_local("1000000000/second", 1_000_000_000, false)))
        }),
        variant("sluice, rejected", "x-api-key: reject", || base(1).sluice(sluice(&sluice_local("1/hour", 1, false)))),
        variant("sluice, admitted with headers_on_allowed", "x-api-key: admit", || {
            base(1).sluice(sluice(&sluice_local("1000000000/second", 1_000_000_000, true)))
        }),
        variant("sluice, admitted, metrics_flush 1s", "x-api-key: admit", || {
            let config =
                sluice_local("1000000000/second", 1_000_000_000, false).replacen('{', r#"{"metrics_flush":"1s","#, 1);
            base(1).sluice(sluice(&config))
        }),
        variant("sluice, no policy matches", "x-api-key: admit", || {
            let policy = r#"{"policies":[{"name":"key","key":[{"header":"x-api-key"}],"match":{"path_exact":"/never"},"rate":"1/hour","burst":1}]}"#;
            base(1).sluice(sluice(policy))
        }),
        // The host calls an admission makes, once each, without the filter's own code.
        variant("test guest: an admission's host calls", "x-key: admit", move || base(1).sluice(admit_calls.clone())),
        variant("2 workers, one hot key: no-op wasm filter", "x-api-key: admit", move || base(2).sluice(noop2.clone())),
        variant("2 workers, one hot key: native", "x-api-key: admit", || {
            base(2).filter(native_local_ratelimit(1_000_000_000))
        }),
        variant("2 workers, one hot key: sluice", "x-api-key: admit", || {
            base(2).sluice(sluice(&sluice_local("1000000000/second", 1_000_000_000, false)))
        }),
    ];
    for (label, wasm) in other_builds() {
        let rejecting = wasm.clone();
        let admitted: &'static str = Box::leak(format!("{label}: sluice, admitted").into_boxed_str());
        let rejected: &'static str = Box::leak(format!("{label}: sluice, rejected").into_boxed_str());
        variants.push(variant(admitted, "x-api-key: admit", move || {
            base(1).sluice(sluice(&sluice_local("1000000000/second", 1_000_000_000, false)).wasm(wasm.clone()))
        }));
        variants.push(variant(rejected, "x-api-key: reject", move || {
            base(1).sluice(sluice(&sluice_local("1/hour", 1, false)).wasm(rejecting.clone()))
        }));
    }
    variants
}

/// The answers of the `costs` group: a chat completion reporting 42 tokens, whole or
/// streamed.
fn costs_answer(streamed: bool) -> (String, &'static str) {
    if streamed {
        let mut body: String = (0..4)
            .map(|i| {
                format!("data: {{\"choices\": [{{\"delta\": {{\"content\": \"part {i}\"}}}}], \"usage\": null}}\n\n")
            })
            .collect();
        body.push_str("data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 12, \"completion_tokens\": 30, \"total_tokens\": 42}}\n\n");
        body.push_str("data: [DONE]\n\n");
        (body, "text/event-stream")
    } else {
        let body = r#"{"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there, how may I help?"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42}}"#;
        (body.to_owned(), "application/json")
    }
}

fn costs_group() -> Vec<Variant> {
    let policy = |cost: &str| {
        format!(
            r#"{{"policies":[{{"name":"key","key":[{{"header":"x-api-key"}}],"rate":"1000000000/second","burst":1000000000,"cost":{cost}}}]}}"#
        )
    };
    let rows: [(&'static str, bool, &'static str); 7] = [
        ("JSON answer: no filter", false, ""),
        ("JSON answer: sluice, cost 10 known at admission", false, "10"),
        (
            "JSON answer: sluice, cost from a response header",
            false,
            r#"{"response_header":"x-usage","estimate":10,"max":1000}"#,
        ),
        (
            "JSON answer: sluice, cost from the JSON body",
            false,
            r#"{"response_json":"usage.total_tokens","estimate":10,"max":1000}"#,
        ),
        ("event stream: no filter", true, ""),
        ("event stream: sluice, cost 10 known at admission", true, "10"),
        (
            "event stream: sluice, cost from the last event",
            true,
            r#"{"response_json":"usage.total_tokens","estimate":10,"max":1000}"#,
        ),
    ];
    rows.into_iter()
        .map(|(name, streamed, cost)| {
            let (body, content_type) = costs_answer(streamed);
            let config = (!cost.is_empty()).then(|| policy(cost));
            variant(name, "x-api-key: admit", move || {
                let envoy = base(1).answer(&body, &[("content-type", content_type), ("x-usage", "42")]);
                match &config {
                    Some(config) => envoy.sluice(sluice(config)),
                    None => envoy,
                }
            })
        })
        .collect()
}

/// `BASELINE_WASM`: an older `sluice.wasm` whose Sluice rows are measured again, named
/// `before: ...`, alternated with the current build's in every round (before and after
/// a change, on the same machine in the same run).
fn baseline_wasm() -> Option<std::path::PathBuf> {
    std::env::var_os("BASELINE_WASM").map(Into::into)
}

/// Other builds of `sluice.wasm` whose local rows are measured beside this one's, each
/// named by its label: `before` for `BASELINE_WASM`, and each `label=path` of
/// `COMPARE_WASM` (separated by `;`), for comparing build settings or changes in one
/// run.
fn other_builds() -> Vec<(String, std::path::PathBuf)> {
    let compared = std::env::var("COMPARE_WASM").unwrap_or_default();
    let compared = compared
        .split(';')
        .filter_map(|pair| pair.split_once('='))
        .map(|(label, path)| (label.trim().to_owned(), std::path::PathBuf::from(path.trim())));
    baseline_wasm().map(|path| ("before".to_owned(), path)).into_iter().chain(compared).collect()
}

fn run_group(variants: &[Variant], rounds: u64, seconds: u64) -> BTreeMap<&'static str, Vec<Sample>> {
    let mut samples: BTreeMap<&'static str, Vec<Sample>> = BTreeMap::new();
    // `VARIANTS`: run only the variants whose names contain one of these (comma-separated).
    let only: Vec<String> =
        std::env::var("VARIANTS").map(|v| v.split(',').map(str::to_owned).collect()).unwrap_or_default();
    for round in 1..=rounds {
        for v in variants.iter().filter(|v| only.is_empty() || only.iter().any(|o| v.name.contains(o.as_str()))) {
            let envoy = (v.builder)().start().unwrap_or_else(|e| panic!("{}: {e}", v.name));
            // Warm up (V8 compiles the module), then measure.
            let _ = measure(&envoy, &[v.header], 32, 1);
            // The rejected variants must see an exhausted bucket before measuring.
            let sample = measure(&envoy, &[v.header], 32, seconds);
            eprintln!(
                "round {round}: {:45} {:>9.0} req/s  p50 {:>6.0} µs  CPU {:>6.0} ns/request",
                v.name, sample.rps, sample.p50_us, sample.cpu_ns_per_request
            );
            samples.entry(v.name).or_default().push(sample);
        }
    }
    samples
}

fn report(title: &str, samples: &BTreeMap<&'static str, Vec<Sample>>, baseline: &str, order: &[&'static str]) {
    let rps = |name: &str| median(&mut samples.get(name).into_iter().flatten().map(|s| s.rps).collect::<Vec<_>>());
    let base = rps(baseline);
    let cpu = |name: &str| cpu_per_request(samples, name);
    println!(
        "\n## {title}\n\n| variant | median req/s | added ns/request over {baseline} (1/rate) | median p50 µs | Envoy CPU ns/request | added CPU ns over {baseline} |\n|---|---:|---:|---:|---:|---:|"
    );
    for name in order.iter().filter(|name| samples.contains_key(*name)) {
        let r = rps(name);
        let p50 = median(&mut samples[name].iter().map(|s| s.p50_us).collect::<Vec<_>>());
        println!(
            "| {name} | {r:.0} | {:.0} | {p50:.0} | {:.0} | {:.0} |",
            1e9 / r - 1e9 / base,
            cpu(name),
            cpu(name) - cpu(baseline)
        );
    }
}

/// How many times each host-call variant repeats its call per request.
const CALLS_PER_REQUEST: u64 = 20;

/// Each test-guest mode measured, and its row: one kind of host call made
/// [`CALLS_PER_REQUEST`] times per request; the difference from the no-op mode, divided,
/// is one call's cost in V8.
const HOST_CALLS: [(&str, &str); 6] = [
    ("noop", "test guest, no-op"),
    ("get-header", "get_header_map_value (a request header)"),
    ("get-property", "get_property (source.address)"),
    ("shared", "get_shared_data + set_shared_data"),
    ("metric", "increment_metric"),
    ("clock", "clock_time_get (WASI)"),
];

fn host_call_group() -> Vec<Variant> {
    HOST_CALLS
        .into_iter()
        .map(|(mode, row)| {
            let config = if mode == "noop" {
                "bench=noop".to_owned()
            } else {
                format!("bench={mode}\ncalls={CALLS_PER_REQUEST}")
            };
            let plugin = sluice(&config).wasm(sluice_artifacts::TEST_GUEST_WASM);
            variant(row, "x-key: k", move || base(1).sluice(plugin.clone()))
        })
        .collect()
}

/// Holds one variant of the local or host-call group (by its row name), or a global-group
/// mode (`global: check`), under load for `seconds`, announcing when the load starts,
/// so a profiler can attach to its Envoy (`perf record -g -p $(pgrep -n envoy)`).
fn profile(name: &str, seconds: u64) {
    // A global-group mode (`global: check`, ...) runs beside its own counter service.
    let mut service = None;
    let (envoy, header) = if let Some(mode) = name.strip_prefix("global: ") {
        let counter = service.insert(Counter::start(counter::with_token(counter::memory(), TOKEN)));
        (global_envoy(mode, counter), "x-tenant: acme")
    } else {
        let variants: Vec<Variant> = local_group().into_iter().chain(host_call_group()).collect();
        let v = variants.iter().find(|v| v.name == name).unwrap_or_else(|| panic!("no variant named {name:?}"));
        ((v.builder)().start().unwrap_or_else(|e| panic!("{}: {e}", v.name)), v.header)
    };
    let _ = measure(&envoy, &[header], 32, 2);
    eprintln!("profiling: load starts");
    let sample = measure(&envoy, &[header], 32, seconds);
    eprintln!("{name}: {:.0} req/s, p50 {:.0} µs", sample.rps, sample.p50_us);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("rls-load") {
        return rls_load::run(&args[2..]);
    }
    let rounds = env_or("ROUNDS", 5);
    let seconds = env_or("SECONDS", 8);
    let groups = std::env::var("BENCH_GROUPS").unwrap_or_else(|_| "local,calls,global".to_owned());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let (steal_before, total_before) = steal_and_total();
    if let Ok(name) = std::env::var("PROFILE") {
        return profile(&name, seconds);
    }
    println!("# sluice.wasm in Envoy: {rounds} rounds of {seconds} s per variant; load average before: {load}");
    if groups.contains("local") {
        let variants = local_group();
        let samples = run_group(&variants, rounds, seconds);
        let order: Vec<&'static str> = variants.iter().map(|v| v.name).collect();
        report("local policies, 1 worker (2-worker rows: over no filter at 1 worker)", &samples, "no filter", &order);
        // Envoy's CPU time per request, the steadier of the two figures.
        let cpu = |name: &str| cpu_per_request(&samples, name);
        let above_floor = |name: &str| cpu(name) - cpu("no-op wasm filter");
        println!(
            "\nEnvoy CPU per request: no-op wasm floor {:.0} ns above no filter; native adds {:.0} ns admitted, {:.0} ns \
             rejected; sluice adds above the floor {:.0} ns admitted, {:.0} ns rejected, {:.0} ns when no policy \
             matches",
            -above_floor("no filter"),
            cpu("native local_ratelimit, admitted") - cpu("no filter"),
            cpu("native local_ratelimit, rejected") - cpu("no filter"),
            above_floor("sluice, admitted"),
            above_floor("sluice, rejected"),
            above_floor("sluice, no policy matches"),
        );
        for (label, _) in other_builds() {
            println!(
                "{label}: sluice adds above the floor {:.0} ns admitted, {:.0} ns rejected",
                above_floor(&format!("{label}: sluice, admitted")),
                above_floor(&format!("{label}: sluice, rejected")),
            );
        }
        println!(
            "an admission's host calls alone (test guest) add {:.0} ns above the floor; sluice with metrics_flush \
             adds {:.0} ns admitted",
            above_floor("test guest: an admission's host calls"),
            above_floor("sluice, admitted, metrics_flush 1s")
        );
    }
    if groups.contains("calls") {
        let variants = host_call_group();
        let samples = run_group(&variants, rounds, seconds);
        let cpu = |name: &str| cpu_per_request(&samples, name);
        let floor = cpu(HOST_CALLS[0].1);
        println!(
            "\n## one host call in V8 (Envoy), from {CALLS_PER_REQUEST} per request (Envoy CPU)\n\n| call | ns per call |\n|---|---:|"
        );
        for (_, name) in &HOST_CALLS[1..] {
            println!("| {name} | {:.0} |", (cpu(name) - floor) / CALLS_PER_REQUEST as f64);
        }
    }
    if groups.contains("costs") {
        let variants = costs_group();
        let samples = run_group(&variants, rounds, seconds);
        let order: Vec<&'static str> = variants.iter().map(|v| v.name).collect();
        report("costs the response reports, 1 worker", &samples, "JSON answer: no filter", &order);
        let cpu = |name: &str| cpu_per_request(&samples, name);
        println!(
            "\nEnvoy CPU added by settling to the response, over the same policy with a cost known at admission: \
             {:.0} ns from a header, {:.0} ns from a JSON body, {:.0} ns from an event stream's last event",
            cpu("JSON answer: sluice, cost from a response header")
                - cpu("JSON answer: sluice, cost 10 known at admission"),
            cpu("JSON answer: sluice, cost from the JSON body")
                - cpu("JSON answer: sluice, cost 10 known at admission"),
            cpu("event stream: sluice, cost from the last event")
                - cpu("event stream: sluice, cost 10 known at admission"),
        );
    }
    if groups.contains("global") {
        global_group(rounds, seconds);
    }
    if groups.contains("rls") {
        rls::rls_group(rounds, seconds);
    }
    if groups.contains("mixed") {
        mixed::mixed_group(rounds, seconds);
    }
    if groups.contains("first_byte") {
        first_byte_group(env_or("FIRST_BYTE_REQUESTS", 2000) as usize);
    }
    let (steal_after, total_after) = steal_and_total();
    let share = (steal_after - steal_before) as f64 * 100.0 / (total_after - total_before).max(1) as f64;
    println!(
        "\nCPU stolen by the hypervisor during the run: {share:.1} % (above a few percent, the machine was not quiet)"
    );
}
