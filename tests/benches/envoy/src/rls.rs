//! The `rls` group: Envoy's own C++ `ratelimit` filter (no wasm) calling a rate limit
//! service over RLS v3, for sluice-counter (the release binary, memory and Redis stores)
//! beside Limitador (Kuadrant's RLS server, `LIMITADOR_BIN`, built from its source for
//! the benchmark only), and sluice.wasm in check mode against the same sluice-counter's
//! JSON API; then each service alone under a gRPC load generator (`rls-load`, 64
//! connections, with 1 call in flight on each, then 4: `RLS_STREAMS`).
//! Beside them, the test guest's `bench=batch`: the least a proxy-wasm filter pays to
//! pause a request and resume it on a callout's answer, with a call per request and with
//! calls shared (group commit, 2 in flight).
//! `COUNTER_BASELINE_BIN` adds an older sluice-counter build on the memory store, as
//! "sluice-counter before", for a before-and-after in the same run.
//!
//! Envoy has one worker on CPU 0, wrk and the service share CPU 1 (as in the `global`
//! group); every row, the one without a filter too, routes to the same small upstream in
//! this process (Envoy's ratelimit filter ignores a direct response). For a service alone, the service is moved to CPU 0 and the load generator
//! runs on CPU 1. One hot key through Envoy (wrk sends one `x-user`); 10 000 users in
//! turn under the load generator. Every limit is far above the load: all decisions
//! admit. CPU per decision is the service process's CPU time (all threads, from
//! `/proc/<pid>/stat`) over the decisions made meanwhile.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sluice_testkit::redis::RedisServer;
use sluice_tests::envoy::{Envoy, EnvoyBuilder, cluster, sluice};
use std::collections::BTreeMap;

use super::{Sample, TOKEN, base, cpu_ns, measure, median, wrk};

const SLUICE_RULES: &str =
    "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 4000000000}\n";
const LIMITADOR_LIMITS: &str = "---\n- namespace: bench\n  max_value: 4000000000\n  seconds: 3600\n  conditions: []\n  variables:\n    - descriptors[0]['user']\n";

/// A rate limit service process.
struct Service {
    child: Child,
    /// Its RLS (gRPC) address.
    rls: SocketAddr,
    /// Its JSON API (sluice-counter only).
    json: SocketAddr,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Service {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Moves every thread of the service to `cpu`.
    fn pin(&self, cpu: usize) {
        let _ = Command::new("taskset")
            .args(["-a", "-p", "-c", &cpu.to_string(), &self.pid().to_string()])
            .stdout(Stdio::null())
            .status();
    }
}

fn free_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address")
}

fn wait_listening(addr: SocketAddr, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "{what} does not listen on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// sluice-counter's release binary (`SLUICE_COUNTER_BIN`, or `target/release/sluice-counter`).
fn sluice_bin() -> PathBuf {
    std::env::var_os("SLUICE_COUNTER_BIN")
        .map_or_else(|| sluice_tests::envoy::repo().join("target/release/sluice-counter"), PathBuf::from)
}

fn start_sluice(bin: &Path, dir: &Path, redis: Option<&str>) -> Service {
    let (json, rls) = (free_addr(), free_addr());
    let mut command = Command::new("taskset");
    command
        .args(["-c", "1"])
        .arg(bin)
        .args(["--listen", &json.to_string(), "--rls-listen", &rls.to_string(), "--token", TOKEN, "--log", "warn"])
        .arg("--rls-config")
        .arg(dir);
    if let Some(url) = redis {
        command.args(["--store", "redis", "--redis-url", url]);
    }
    let child = command.stdin(Stdio::null()).stdout(Stdio::null()).spawn().expect("sluice-counter starts");
    let service = Service { child, rls, json };
    wait_listening(rls, "sluice-counter");
    service
}

fn start_limitador(bin: &Path, limits: &Path, redis: Option<&str>) -> Service {
    let (http, rls) = (free_addr(), free_addr());
    let mut command = Command::new("taskset");
    command.args(["-c", "1"]).arg(bin).arg(limits).args([
        "--rls-ip",
        "127.0.0.1",
        "--rls-port",
        &rls.port().to_string(),
        "--http-ip",
        "127.0.0.1",
        "--http-port",
        &http.port().to_string(),
    ]);
    match redis {
        Some(url) => command.args(["redis", url]),
        None => command.arg("memory"),
    };
    let child = command
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("limitador-server starts");
    let service = Service { child, rls, json: http };
    wait_listening(rls, "limitador-server");
    service
}

/// One Envoy worker on CPU 0 routing to `upstream` (Envoy's ratelimit filter acts only on
/// a route to a cluster: a direct response is never limited).
fn routed(upstream: SocketAddr) -> EnvoyBuilder {
    base(1).cluster(cluster("backend", upstream, false)).route_to("backend")
}

/// Envoy's native filter asking `rls` about `x-user`, failing closed, with a timeout no
/// decision meets under this load.
fn native_envoy(rls: SocketAddr, upstream: SocketAddr) -> EnvoyBuilder {
    let filter = json!({
        "name": "envoy.filters.http.ratelimit",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": "bench",
            "failure_mode_deny": true,
            "timeout": "1s",
            "rate_limit_service": {
                "grpc_service": {
                    "envoy_grpc": { "cluster_name": "rls" },
                    "initial_metadata": [{ "key": "authorization", "value": format!("Bearer {TOKEN}") }],
                },
                "transport_api_version": "V3",
            },
            "rate_limits": [{ "actions": [{ "request_headers": { "header_name": "x-user", "descriptor_key": "user" } }] }],
        },
    });
    routed(upstream).cluster(cluster("rls", rls, true)).filter(filter)
}

/// sluice.wasm in check mode against sluice-counter's JSON API at `json`.
fn wasm_envoy(json_api: SocketAddr, upstream: SocketAddr) -> EnvoyBuilder {
    let config = r#"{"counter_service":{"cluster":"sluice-counter","hash_key_env":"H","token_env":"T","timeout":"1s"},
        "policies":[{"name":"user","key":[{"header":"x-user"}],"rate":"1000000000/second","burst":1000000000,"global":{"strategy":"check"}}]}"#;
    routed(upstream)
        .cluster(cluster("sluice-counter", json_api, true))
        .sluice(sluice(config).env("H", "bench-hash-key-0123456789abcdef").env("T", TOKEN))
}

/// The test guest's `bench=batch` (the floor under any proxy-wasm filter that asks a
/// service about each request, with its calls shared as `sluice.wasm`'s are; see
/// `wasm-host/test-guest/src/guest/batch.rs`), calling sluice-counter's `/healthz` with
/// at most `in_flight` calls out.
fn floor_envoy(json_api: SocketAddr, upstream: SocketAddr, in_flight: usize) -> EnvoyBuilder {
    routed(upstream).cluster(cluster("sluice-counter", json_api, true)).sluice(
        sluice(&format!("bench=batch\ncluster=sluice-counter\nin_flight={in_flight}"))
            .wasm(sluice_artifacts::TEST_GUEST_WASM),
    )
}

/// The services of the group: name, and how to start one.
type Start<'a> = Box<dyn Fn() -> Service + 'a>;

fn services<'a>(
    bins: &'a (PathBuf, Option<PathBuf>),
    dir: &'a Path,
    limits: &'a Path,
    redis: &'a str,
    limitador: Option<&'a Path>,
) -> Vec<(&'static str, Start<'a>)> {
    let (sluice, before) = bins;
    let mut all: Vec<(&'static str, Start<'a>)> = vec![
        ("sluice-counter, memory", Box::new(move || start_sluice(sluice, dir, None))),
        ("sluice-counter, redis", Box::new(move || start_sluice(sluice, dir, Some(redis)))),
    ];
    if let Some(before) = before {
        all.push(("sluice-counter before, memory", Box::new(move || start_sluice(before, dir, None))));
    }
    if let Some(bin) = limitador {
        all.push(("limitador, memory", Box::new(move || start_limitador(bin, limits, None))));
        all.push(("limitador, redis", Box::new(move || start_limitador(bin, limits, Some(redis)))));
    }
    all
}

/// One run of `rls-load` on CPU 1 against `addr`: decisions/s, p50, p99, errors.
fn load(addr: SocketAddr, connections: usize, streams: usize, seconds: u64, token: Option<&str>) -> (Sample, u64) {
    let exe = std::env::current_exe().expect("this binary");
    let mut command = Command::new("taskset");
    command.args(["-c", "1"]).arg(exe).args([
        "rls-load",
        &addr.to_string(),
        &connections.to_string(),
        &streams.to_string(),
        &seconds.to_string(),
    ]);
    if let Some(token) = token {
        command.arg(token);
    }
    let output = command.output().expect("rls-load runs");
    let text = String::from_utf8_lossy(&output.stdout);
    let fields: Vec<f64> = text.split_whitespace().filter_map(|f| f.parse().ok()).collect();
    let [rps, p50, p99, errors, _over, cpu_share] = fields.as_slice() else {
        panic!("rls-load printed {text:?} ({})", String::from_utf8_lossy(&output.stderr));
    };
    if *cpu_share > 0.9 {
        eprintln!("note: the load generator used {cpu_share:.2} of its core: it may have been the bottleneck");
    }
    let sample = Sample { rps: *rps, p50_us: *p50, p99_us: *p99, requests: rps * seconds as f64, ..Sample::default() };
    (sample, *errors as u64)
}

pub(crate) fn rls_group(rounds: u64, seconds: u64) {
    let limitador = std::env::var_os("LIMITADOR_BIN").map(PathBuf::from);
    if limitador.is_none() {
        eprintln!("note: LIMITADOR_BIN is not set: the Limitador rows are left out");
    }
    let dir = tempfile::tempdir().expect("a directory");
    let limits = dir.path().join("limitador.yaml");
    std::fs::write(&limits, LIMITADOR_LIMITS).expect("write the limits");
    let rules_dir = dir.path().join("rls");
    std::fs::create_dir(&rules_dir).expect("mkdir");
    std::fs::write(rules_dir.join("bench.yaml"), SLUICE_RULES).expect("write the rules");
    let redis = RedisServer::start();
    let _ =
        Command::new("taskset").args(["-a", "-p", "-c", "1", &redis.pid().to_string()]).stdout(Stdio::null()).status();
    let redis_url = redis.url();
    // The upstream every row routes to: a small HTTP/1.1 server in this process.
    let upstream = sluice_tests::upstream::Upstream::start(&[]);
    let connections = super::env_or("RLS_CONNECTIONS", 64) as usize;
    let streams: Vec<usize> = std::env::var("RLS_STREAMS")
        .unwrap_or_else(|_| "1,4".to_owned())
        .split(',')
        .map(|s| s.trim().parse().expect("RLS_STREAMS: numbers separated by commas"))
        .collect();
    let bins = (sluice_bin(), std::env::var_os("COUNTER_BASELINE_BIN").map(PathBuf::from));
    let mut rows: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    let mut service_cpu: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for round in 1..=rounds {
        let none = routed(upstream.addr()).start().unwrap_or_else(|e| panic!("{e}"));
        let sample = measure(&none, &["x-user: u1"], 32, seconds);
        rows.entry("no filter".to_owned()).or_default().push(sample);
        drop(none);
        for (name, start) in services(&bins, &rules_dir, &limits, &redis_url, limitador.as_deref()) {
            let service = start();
            let mut envoys: Vec<(String, Envoy)> = vec![(
                format!("native ratelimit → {name}"),
                native_envoy(service.rls, upstream.addr()).start().unwrap_or_else(|e| panic!("{e}")),
            )];
            if name.starts_with("sluice-counter") {
                envoys.push((
                    format!("sluice.wasm check → {name}"),
                    wasm_envoy(service.json, upstream.addr()).start().unwrap_or_else(|e| panic!("{e}")),
                ));
            }
            if name == "sluice-counter, memory" {
                // The floors, once: they call `/healthz`, which no store answers.
                for (row, in_flight) in
                    [("floor: a call per request", 1_000_000), ("floor: calls shared, 2 in flight", 2)]
                {
                    envoys.push((
                        format!("test guest, {row}"),
                        floor_envoy(service.json, upstream.addr(), in_flight).start().unwrap_or_else(|e| panic!("{e}")),
                    ));
                }
            }
            for (row, envoy) in &envoys {
                let _ = measure(envoy, &["x-user: u1"], 32, 1);
                let before = cpu_ns(service.pid());
                let sample = measure(envoy, &["x-user: u1"], 32, seconds);
                let after = cpu_ns(service.pid());
                let one = wrk(&format!("http://{}/", envoy.addr()), &["x-user: u1"], 1, seconds, None);
                eprintln!(
                    "round {round}: {row:42} {:>7.0} req/s (p50 {:.0} µs, p99 {:.0} µs), Envoy {:.0} ns/request; 1 connection p50 {:.0} µs",
                    sample.rps, sample.p50_us, sample.p99_us, sample.cpu_ns_per_request, one.p50_us
                );
                if let (Some(b), Some(a)) = (before, after) {
                    service_cpu.entry(row.clone()).or_default().push((a - b) / sample.requests.max(1.0));
                }
                rows.entry(format!("{row}, saturated")).or_default().push(sample);
                rows.entry(format!("{row}, 1 connection")).or_default().push(one);
            }
            drop(envoys);
            service.pin(0);
            for &streams in &streams {
                let _ = load(service.rls, connections, streams, 1, Some(TOKEN));
                let before = cpu_ns(service.pid());
                let (alone, errors) = load(service.rls, connections, streams, seconds, Some(TOKEN));
                let after = cpu_ns(service.pid());
                let row = alone_row(name, connections, streams);
                eprintln!(
                    "round {round}: {row:42} {:>7.0} decisions/s (p50 {:.0} µs, p99 {:.0} µs), {errors} errors",
                    alone.rps, alone.p50_us, alone.p99_us
                );
                if let (Some(b), Some(a)) = (before, after) {
                    service_cpu.entry(row.clone()).or_default().push((a - b) / alone.requests.max(1.0));
                }
                rows.entry(row).or_default().push(alone);
            }
        }
    }
    let med = |name: &str, f: fn(&Sample) -> f64| median(&mut rows[name].iter().map(f).collect::<Vec<_>>());
    println!(
        "\n## Envoy's native ratelimit filter and RLS servers\n\n| row | median req/s | median p50 µs | median p99 µs | Envoy CPU ns/request | service CPU µs/decision |\n|---|---:|---:|---:|---:|---:|"
    );
    for name in rows.keys() {
        let base_name = name.trim_end_matches(", saturated");
        let cpu = service_cpu.get_mut(base_name).map_or(f64::NAN, |v| median(v) / 1000.0);
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} | {:.0} | {cpu:.1} |",
            med(name, |s| s.rps),
            med(name, |s| s.p50_us),
            med(name, |s| s.p99_us),
            med(name, |s| s.cpu_ns_per_request),
        );
    }
    for &streams in &streams {
        let alone = |name: &str| alone_row(name, connections, streams);
        for (ours, theirs) in [
            ("sluice-counter, memory", "limitador, memory"),
            ("sluice-counter, redis", "limitador, redis"),
            ("sluice-counter, memory", "sluice-counter before, memory"),
        ] {
            let (s, l) = (alone(ours), alone(theirs));
            if rows.contains_key(&l) {
                println!(
                    "{ours} makes {:.2}× the decisions per second of {theirs} at {connections} connections × {streams} in flight, p99 {:.0} µs against {:.0} µs, CPU per decision {:.2}×",
                    med(&s, |x| x.rps) / med(&l, |x| x.rps),
                    med(&s, |x| x.p99_us),
                    med(&l, |x| x.p99_us),
                    median(service_cpu.get_mut(&s).expect("measured"))
                        / median(service_cpu.get_mut(&l).expect("measured")),
                );
            }
        }
    }
}

/// The name of a service-alone row.
fn alone_row(name: &str, connections: usize, streams: usize) -> String {
    format!("{name} alone, {connections} connections × {streams} in flight")
}
