//! wasm-host is held to Envoy: for every example, one traffic script (keys, headers,
//! paths, methods, costs, pauses) runs through Envoy and through wasm-host, and every
//! response must have the same status, body and rate-limit headers.
//!
//! Scripts are paced so that timing cannot change a decision: Envoy runs on real time
//! (a script takes milliseconds) and wasm-host on a virtual clock moved by the same
//! pauses. One difference is known and masked: a fixed window is aligned to the clock,
//! and the two hosts' monotonic clocks have different origins, so the seconds until a
//! fixed window resets (`t`, `X-RateLimit-Reset`, `Retry-After` of a fixed-window
//! policy) are not compared; and a policy that refills faster than a script's own jitter
//! (thousands per second) is compared on its decisions, not on the tokens it has left.
//! wasm-host's README lists what is compared.

use super::*;
use sluice_tests::envoy::repo;
use sluice_tests::http::Response;
use std::time::Duration;

/// One step of a script: a request, then a pause.
struct Step {
    method: &'static str,
    path: &'static str,
    headers: Vec<(&'static str, String)>,
    pause: Duration,
}

fn get(path: &'static str) -> Step {
    Step { method: "GET", path, headers: Vec::new(), pause: Duration::ZERO }
}

fn post(path: &'static str) -> Step {
    Step { method: "POST", ..get(path) }
}

impl Step {
    fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }

    fn pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    fn times(self, n: usize) -> Vec<Self> {
        (0..n)
            .map(|_| Step { method: self.method, path: self.path, headers: self.headers.clone(), pause: self.pause })
            .collect()
    }
}

/// Policies whose numbers are not compared (see the module docs).
#[derive(Clone, Copy, Default)]
struct Masks {
    /// Fixed windows: the seconds until a reset.
    aligned: &'static [&'static str],
    /// Fast refills: what is left.
    fast: &'static [&'static str],
}

/// The script of each example, and what of its answers is not compared.
fn script(example: &str) -> (Vec<Step>, Masks) {
    let mut steps = Vec::new();
    let mut masked = Masks::default();
    match example {
        "demo.json" => steps.extend(get("/").times(8)),
        "login.json" => {
            steps.extend(post("/login").header("x-login-user", "alice").times(7));
            steps.extend(post("/login").header("x-login-user", "bob").times(4));
            steps.extend(post("/login").times(2));
            steps.push(get("/login"));
        }
        "per-api-key.json" => {
            steps.extend(get("/api/items").header("x-api-key", "k1").times(22));
            steps.extend(get("/api/items").times(3));
            steps.push(get("/other").header("x-api-key", "k1"));
        }
        "llm-tokens.json" => {
            // The upstream reports no usage: each estimate (8 000 tokens) stands; 5 fit the
            // burst of 40 000. A request without the user is rejected; other paths pass.
            steps.extend(post("/v1/chat/completions").header("x-user", "u").header("x-max-tokens", "8000").times(6));
            steps.push(post("/v1/chat/completions"));
            steps.push(get("/other").header("x-user", "u"));
            // 20 000 tokens a minute refill 333 a second: what is left and when it is
            // paid depend on the script's own timing in each host.
            masked = Masks { aligned: &["tokens-per-user"], fast: &["tokens-per-user"] };
        }
        "per-client-ip.json" => steps.extend(get("/").times(53)),
        "shadow-rollout.json" => steps.extend(get("/").header("x-api-key", "k").times(6)),
        "shaped-endpoint.json" => {
            // Slower than the rate (5/second): every request leaves at once, in both hosts.
            steps.extend(get("/export/a").pause(Duration::from_millis(250)).times(4));
            steps.push(get("/other"));
        }
        "tenant-operation.json" => {
            steps.extend(post("/reports").header("x-tenant-id", "t1").header("x-cost", "1").times(12));
            steps.extend(get("/").header("x-tenant-id", "t1").header("x-cost", "150").times(3));
            steps.push(get("/"));
            masked = Masks { aligned: &["tenant-operation"], fast: &["all-traffic"] };
        }
        other => panic!("{other} has no traffic script: add one here"),
    }
    (steps, masked)
}

/// What is compared of a response: status, body, content type and the rate-limit
/// headers, with clock-aligned resets masked.
fn comparable(status: u16, body: &[u8], header: impl Fn(&str) -> Option<String>, masked: Masks) -> String {
    let mut out = format!("{status} body={:?}", String::from_utf8_lossy(body));
    let speaks_for = |policies: &[&str]| {
        header("ratelimit").is_some_and(|v| policies.iter().any(|p| v.starts_with(&format!("\"{p}\""))))
    };
    let (aligned, fast) = (speaks_for(masked.aligned), speaks_for(masked.fast));
    for name in [
        "content-type",
        "retry-after",
        "ratelimit-policy",
        "ratelimit",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "cache-control",
    ] {
        let Some(mut value) = header(name) else { continue };
        if aligned && matches!(name, "retry-after" | "x-ratelimit-reset") {
            value = "_".to_owned();
        }
        if aligned && name == "ratelimit" {
            value = value.split(";t=").next().unwrap_or_default().to_owned() + ";t=_";
        }
        if fast && name == "x-ratelimit-remaining" {
            value = "_".to_owned();
        }
        if fast && name == "ratelimit" {
            let (policy, rest) = value.split_once(";r=").unwrap_or((&value, ""));
            let t = rest.split_once(";t=").map_or("", |(_, t)| t);
            value = format!("{policy};r=_;t={t}");
        }
        out.push_str(&format!(" {name}={value}"));
    }
    out
}

fn through_envoy(config: &str, steps: &[Step], masked: Masks) -> Vec<String> {
    let envoy = super::configs::envoy_for(config).unwrap_or_else(|e| panic!("{e}"));
    let mut connection = envoy.connect();
    steps
        .iter()
        .map(|step| {
            let mut request = Request::get(step.path).method(step.method);
            for (name, value) in &step.headers {
                request = request.header(name, value);
            }
            let response: Response = connection.send(&request).unwrap();
            std::thread::sleep(step.pause);
            comparable(response.status, &response.body, |n| response.header(n).map(str::to_owned), masked)
        })
        .collect()
}

fn through_wasm_host(config: &str, steps: &[Step], masked: Masks) -> Vec<String> {
    let mut host = wasm_host::Host::builder(sluice_artifacts::SLUICE_WASM)
        .plugin_configuration(config)
        .plugin_name("sluice")
        .root_id("sluice")
        .vm_id("sluice")
        .build()
        .unwrap();
    let source = "127.0.0.1:40000".parse().unwrap();
    steps
        .iter()
        .map(|step| {
            let mut request = wasm_host::Request::new(step.method, step.path).source(source);
            for (name, value) in &step.headers {
                request = request.header(name, value);
            }
            let upstream = wasm_host::Response::ok().body("upstream\n").header("content-type", "text/plain");
            let exchange = host.worker(0).exchange(request, upstream).unwrap();
            host.advance(step.pause);
            let response = exchange.response.as_ref().expect("wasm-host answers");
            comparable(response.status, &response.body, |n| exchange.header_str(n).map(str::to_owned), masked)
        })
        .collect()
}

#[test]
fn every_example_gets_the_same_answers_in_envoy_and_in_wasm_host() {
    let mut examples: Vec<_> = std::fs::read_dir(repo().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    examples.sort();
    assert!(examples.len() >= 7);
    for path in examples {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let config = std::fs::read_to_string(&path).unwrap();
        if config.contains("counter_service") {
            continue; // Global examples: see the counter-service tests.
        }
        let (steps, masked) = script(&name);

        let envoy = through_envoy(&config, &steps, masked);
        let host = through_wasm_host(&config, &steps, masked);

        for (i, (e, h)) in envoy.iter().zip(&host).enumerate() {
            assert_eq!(e, h, "{name}, step {i}: Envoy answered\n  {e}\nwasm-host answered\n  {h}");
        }
        // Shadow policies never reject, and the shaper's script stays below its rate.
        let limited = !matches!(name.as_str(), "shadow-rollout.json" | "shaped-endpoint.json");
        assert!(!limited || envoy.iter().any(|r| !r.starts_with("200")), "{name}: the script must reach a limit");
    }
}
