//! `envoy-bench rls-load ADDR CONNECTIONS SECONDS [TOKEN]`: a gRPC load generator for a
//! rate limit service (RLS v3), run as its own process (pinned with `taskset` by the
//! `rls` group): `CONNECTIONS` HTTP/2 connections, each sending `ShouldRateLimit` calls
//! one after the other for `SECONDS`, for users `u0` … `u9999` in turn (domain `bench`,
//! one descriptor `user`). Prints one line: `decisions/s p50_us p99_us errors over_limit
//! cpu_share`, the last being the generator's own CPU time over the run's length (near 1:
//! the generator, not the service, was the bottleneck).

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

/// Distinct users the load cycles through.
const USERS: usize = 10_000;

struct Tally {
    latencies_us: Vec<u32>,
    errors: u64,
    over: u64,
}

async fn one_connection(addr: String, index: usize, until: Instant, token: Option<String>) -> Tally {
    let channel = tonic::transport::Endpoint::from_shared(addr)
        .expect("an address")
        .tcp_nodelay(true)
        .connect()
        .await
        .expect("connects to the service");
    let mut client = RateLimitServiceClient::new(channel);
    let mut tally = Tally { latencies_us: Vec::with_capacity(1 << 16), errors: 0, over: 0 };
    let mut user = index * 7919 % USERS;
    while Instant::now() < until {
        user = (user + 1) % USERS;
        let mut request = tonic::Request::new(RateLimitRequest {
            domain: "bench".to_owned(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry { key: "user".to_owned(), value: format!("u{user}") }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        });
        if let Some(token) = &token {
            request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().expect("metadata"));
        }
        let start = Instant::now();
        let answer = client.should_rate_limit(request).await;
        let took = u32::try_from(start.elapsed().as_micros()).unwrap_or(u32::MAX);
        match answer {
            Ok(answer) => {
                tally.latencies_us.push(took);
                if answer.into_inner().overall_code != 1 {
                    tally.over += 1;
                }
            }
            Err(_) => tally.errors += 1,
        }
    }
    tally
}

/// Runs the load and prints its line.
pub fn run(args: &[String]) {
    let [addr, connections, seconds, rest @ ..] = args else {
        panic!("usage: envoy-bench rls-load ADDR CONNECTIONS SECONDS [TOKEN]");
    };
    let connections: usize = connections.parse().expect("CONNECTIONS");
    let seconds: u64 = seconds.parse().expect("SECONDS");
    let token = rest.first().cloned();
    let cpu_before = super::cpu_ns(std::process::id()).unwrap_or(0.0);
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("a tokio runtime");
    let (tallies, took) = runtime.block_on(async {
        let start = Instant::now();
        let until = start + Duration::from_secs(seconds);
        let tasks: Vec<_> = (0..connections)
            .map(|i| tokio::spawn(one_connection(format!("http://{addr}"), i, until, token.clone())))
            .collect();
        let mut tallies = Vec::with_capacity(tasks.len());
        for task in tasks {
            tallies.push(task.await.expect("a connection's task"));
        }
        (tallies, start.elapsed())
    });
    let mut latencies: Vec<u32> = tallies.iter().flat_map(|t| t.latencies_us.iter().copied()).collect();
    latencies.sort_unstable();
    let at = |q: f64| latencies.get(((latencies.len() as f64 - 1.0) * q) as usize).copied().unwrap_or(0);
    let errors: u64 = tallies.iter().map(|t| t.errors).sum();
    let over: u64 = tallies.iter().map(|t| t.over).sum();
    let cpu_share = (super::cpu_ns(std::process::id()).unwrap_or(0.0) - cpu_before) / 1e9 / took.as_secs_f64();
    println!(
        "{:.0} {} {} {errors} {over} {cpu_share:.2}",
        latencies.len() as f64 / took.as_secs_f64(),
        at(0.5),
        at(0.99)
    );
}
