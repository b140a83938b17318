//! The `first_byte` group: how long an event stream's first byte takes through Envoy
//! without Sluice, with a policy whose cost is known at admission, and with the same
//! policy taking its cost from the stream's last event (the filter reads a copy of
//! every chunk as it passes). A real streaming upstream (the tests' language-model
//! upstream, each event one chunk) answers all three; requests go one at a time, in
//! turn through the three proxies (one keep-alive connection each, the order rotating),
//! so all see the same machine; the figures are percentiles of each, and the medians of
//! the paired differences.

use sluice_tests::envoy::{Envoy, cluster, sluice};
use sluice_tests::http::{Connection, Request};
use sluice_tests::llm::LlmUpstream;
use std::time::{Duration, Instant};

/// A per-user token budget that never binds, with `cost`.
fn policy(cost: &str) -> String {
    format!(
        r#"{{"policies": [{{"name": "tokens", "key": [{{"header": "x-user"}}], "rate": "1000000000/second",
            "burst": 1000000000, "cost": {cost}}}]}}"#
    )
}
const KNOWN: &str = "50";
const FROM_LAST_EVENT: &str = r#"{"response_json": "usage.total_tokens", "estimate": 50, "max": 5000}"#;
/// Requests per proxy sent before measuring.
const WARM_UP: usize = 50;

fn envoy(upstream: &LlmUpstream, cost: Option<&str>) -> Envoy {
    let builder = Envoy::builder().workers(1).cluster(cluster("llm", upstream.addr(), false)).route_to("llm");
    let builder = match cost {
        Some(cost) => builder.sluice(sluice(&policy(cost))),
        None => builder,
    };
    builder.start().unwrap_or_else(|e| panic!("{e}"))
}

/// The time from sending one streamed completion to its first body byte.
fn first_byte(connection: &mut Connection) -> Duration {
    let request = Request::post("/v1/chat/completions?tokens=70&stream=1", "{}").header("x-user", "alice");
    let start = Instant::now();
    let mut first = None;
    let response = connection
        .send_streaming(&request, |chunk| {
            if first.is_none() && !chunk.is_empty() {
                first = Some(start.elapsed());
            }
        })
        .unwrap_or_else(|e| panic!("a streamed completion failed: {e}"));
    assert_eq!(response.status, 200, "{}", response.text());
    first.unwrap_or_else(|| panic!("a stream without a body"))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).copied().unwrap_or(f64::NAN)
}

/// Runs the group: `requests` measured streams per proxy.
pub fn first_byte_group(requests: usize) {
    const NAMES: [&str; 3] = ["no filter", "sluice, cost 50 known at admission", "sluice, cost from the last event"];
    let upstream = LlmUpstream::start();
    let proxies = [envoy(&upstream, None), envoy(&upstream, Some(KNOWN)), envoy(&upstream, Some(FROM_LAST_EVENT))];
    let mut connections: Vec<Connection> = proxies.iter().map(Envoy::connect).collect();
    for _ in 0..WARM_UP {
        for connection in &mut connections {
            first_byte(connection);
        }
    }
    let mut samples: [Vec<f64>; 3] = std::array::from_fn(|_| Vec::with_capacity(requests));
    for i in 0..requests {
        // Rotate the order, so that none always follows another.
        for k in 0..3 {
            let which = (i + k) % 3;
            let took = first_byte(&mut connections[which]);
            samples[which].push(took.as_secs_f64() * 1e6);
        }
    }
    let paired = |a: usize, b: usize| {
        let mut d: Vec<f64> = samples[b].iter().zip(&samples[a]).map(|(y, x)| y - x).collect();
        d.sort_by(f64::total_cmp);
        percentile(&d, 0.5)
    };
    let (over_none, over_known) = (paired(0, 2), paired(1, 2));
    println!(
        "\n## first byte of an event stream, 1 worker, {requests} requests each (µs)\n\n| | p50 | p90 | p99 |\n|---|---:|---:|---:|"
    );
    for (name, taken) in NAMES.iter().zip(&mut samples) {
        taken.sort_by(f64::total_cmp);
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} |",
            percentile(taken, 0.5),
            percentile(taken, 0.9),
            percentile(taken, 0.99)
        );
    }
    println!(
        "\nmedian of the paired differences, cost from the last event: {over_none:.0} µs over no filter, \
         {over_known:.0} µs over the cost known at admission"
    );
    assert_eq!(upstream.served().len(), 3 * (WARM_UP + requests), "every stream was answered whole");
}
