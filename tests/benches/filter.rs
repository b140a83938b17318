//! Filter CPU per request in wasm-host, beside the no-op filter baseline (the test
//! guest's `bench=noop` mode, as in wasm-host's own bench), measured in the same run.
//!
//! Every benchmark is one whole stream on worker 0: request headers, response headers,
//! done/log/delete, with the same request as wasm-host's bench.
//!
//! * `noop`: the test guest doing nothing (the host's own cost).
//! * `sluice/allowed`: one local token-bucket policy keyed on a header; every request
//!   admitted (the rate is too high to run out), no headers on allowed responses.
//! * `sluice/allowed_with_headers`: the same, adding `RateLimit-Policy`/`RateLimit` and
//!   `Cache-Control` to the response.
//! * `sluice/rejected`: the bucket is empty, every request gets a local 429 with
//!   `Retry-After` and `RateLimit` headers.
//! * `sluice/no_match`: the policy does not match the request (the filter's floor).
//!
//! Filter cost per request = `sluice/*` − `noop`. Method and figures: docs/benchmarks.md,
//! section "filter".
#![allow(missing_docs)]

use criterion::{Criterion, criterion_group, criterion_main};
use std::time::Duration;
use wasm_host::{Host, Request, Response};

fn host(wasm: &str, configuration: &str) -> Host {
    Host::builder(wasm)
        .plugin_configuration(configuration)
        .plugin_name("sluice")
        .root_id("sluice")
        .vm_id("sluice")
        .log_level(wasm_host::LogLevel::Warn)
        .capture_logs(false)
        .record_callouts(false)
        .build()
        .expect("the guest starts")
}

fn request() -> Request {
    Request::get("/api/v1/items?page=2")
        .header("user-agent", "bench/1.0")
        .header("accept", "*/*")
        .header("x-key", "tenant-42")
        .source("10.0.0.7:43210".parse().expect("an address"))
}

fn sluice(policy: &str, allowed_headers: &str) -> Host {
    host(
        sluice_artifacts::SLUICE_WASM,
        &format!(r#"{{"policies":[{policy}],"response":{{"headers_on_allowed":[{allowed_headers}]}}}}"#),
    )
}

const ADMITS: &str =
    r#"{"name":"bench","key":[{"header":"x-key"}],"rate":"1000000000000/second","burst":1000000000000}"#;
const REJECTS: &str = r#"{"name":"bench","key":[{"header":"x-key"}],"rate":"1/day","burst":1}"#;
const NO_MATCH: &str = r#"{"name":"bench","match":{"path_prefix":"/admin"},"key":[{"header":"x-key"}],"rate":"1/day"}"#;

fn benches(c: &mut Criterion) {
    let request = request();
    let response = Response::ok().header("content-type", "text/plain").header("content-length", "2");
    let mut group = c.benchmark_group("filter");

    let mut noop = host(sluice_artifacts::TEST_GUEST_WASM, "bench=noop");
    group.bench_function("noop", |b| {
        b.iter(|| noop.worker(0).exchange(request.clone(), response.clone()).expect("forwarded"));
    });
    for (name, mut host) in [
        ("sluice/allowed", sluice(ADMITS, "")),
        ("sluice/allowed_with_headers", sluice(ADMITS, r#""ratelimit""#)),
        ("sluice/rejected", sluice(REJECTS, "")),
        ("sluice/no_match", sluice(NO_MATCH, "")),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| host.worker(0).exchange(request.clone(), response.clone()).expect("decided"));
        });
    }
    group.finish();
}

criterion_group! {
    name = filter_benches;
    config = Criterion::default().sample_size(50).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(filter_benches);
