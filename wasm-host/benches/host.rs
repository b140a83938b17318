//! The host's own costs, measured through the test guest's benchmark modes
//! (`bench=...` in its plugin configuration), so that the filter's cost can later be
//! judged against them:
//!
//! * `wasm_host_stream/noop`: one request through a filter that does nothing, for its whole life
//!   on the filter: `proxy_on_context_create`, `proxy_on_request_headers`,
//!   `proxy_on_response_headers`, `proxy_on_done`, `proxy_on_log`, `proxy_on_delete`.
//! * `wasm_host_stream/request_only`: the same without a response (`proxy_on_response_headers`
//!   not called); `request_only_no_time_limit`: the same on an engine without the epoch
//!   checks that enforce the call time limit.
//! * `wasm_host_call/*`: a request whose `proxy_on_request_headers` makes one host call
//!   `CALLS` times; (time − `wasm_host_stream/request_only`) / `CALLS` is the cost of one call.
//!   `get_header` and `get_property` return a string (a guest allocation and a copy);
//!   `shared_get_set` is a `proxy_get_shared_data` + `proxy_set_shared_data` pair.
//!
//! Method and figures: docs/benchmarks.md, section "wasm-host".
#![allow(missing_docs)]

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use wasm_host::{Host, Request, Response, Worker};

/// How many times the `host_call` benchmarks repeat the call per request.
const CALLS: usize = 100;

fn host(configuration: &str) -> Host {
    host_with(configuration, Some(Duration::from_secs(10)))
}

fn host_with(configuration: &str, call_time_limit: Option<Duration>) -> Host {
    Host::builder(sluice_artifacts::TEST_GUEST_WASM)
        .plugin_configuration(configuration)
        .call_time_limit(call_time_limit)
        .capture_logs(false)
        .record_callouts(false)
        .build()
        .expect("the test guest starts")
}

fn request() -> Request {
    Request::get("/api/v1/items?page=2")
        .header("user-agent", "bench/1.0")
        .header("accept", "*/*")
        .header("x-key", "tenant-42")
        .source("10.0.0.7:43210".parse().expect("an address"))
}

fn request_only(worker: &mut Worker, request: &Request) {
    let stream = worker.request(request.clone());
    let _ = worker.finish(stream);
}

fn benches(c: &mut Criterion) {
    let request = request();
    let response = Response::ok().header("content-type", "text/plain").header("content-length", "2");

    let mut group = c.benchmark_group("wasm_host_stream");
    let mut noop = host("bench=noop");
    group.bench_function("noop", |b| {
        b.iter(|| noop.worker(0).exchange(request.clone(), response.clone()).expect("forwarded"));
    });
    group.bench_function("request_only", |b| b.iter(|| request_only(noop.worker(0), &request)));
    let mut unchecked = host_with("bench=noop", None);
    group.bench_function("request_only_no_time_limit", |b| b.iter(|| request_only(unchecked.worker(0), &request)));
    group.finish();

    let mut group = c.benchmark_group("wasm_host_call");
    for (name, mode) in [("get_header", "get-header"), ("get_property", "get-property"), ("shared_get_set", "shared")] {
        let mut host = host(&format!("bench={mode}\ncalls={CALLS}"));
        group.bench_function(format!("{name}_x{CALLS}"), |b| b.iter(|| request_only(host.worker(0), &request)));
    }
    group.finish();
}

criterion_group! {
    name = host_benches;
    config = Criterion::default().sample_size(50).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(host_benches);
