//! `envoy-bench rls-load ADDR CONNECTIONS STREAMS SECONDS [TOKEN]`: a gRPC load generator
//! for a rate limit service (RLS v3), run as its own process (pinned with `taskset` by the
//! `rls` group): `CONNECTIONS` HTTP/2 connections, each with `STREAMS` calls in flight at
//! once (Envoy's native filter multiplexes a worker's calls on one connection), each
//! stream sending `ShouldRateLimit` calls one after the other for `SECONDS`, for users
//! `u0` … `u9999` in turn (domain `bench`,
//! one descriptor `user`). Prints one line: `decisions/s p50_us p99_us errors over_limit
//! cpu_share`, the last being the generator's own CPU time over the run's length (near 1:
//! the generator, not the service, was the bottleneck).
//!
//! It speaks HTTP/2 with the `h2` crate directly, on a current-thread runtime, with every
//! user's request encoded once before the run: a tonic client (its channel's buffer
//! task, its codec) cost as much per call as the services it measured, and capped them.
//! Each answer is still read whole and checked: `grpc-status` 0 in its trailers, and its
//! message decoded for `overall_code`.

use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;

/// Distinct users the load cycles through.
const USERS: usize = 10_000;
/// The method's path.
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

struct Tally {
    latencies_us: Vec<u32>,
    errors: u64,
    over: u64,
}

/// User `user`'s call, as a gRPC message: the 5-byte prefix (uncompressed, length) and
/// the protobuf.
fn body(user: usize) -> Bytes {
    let message = RateLimitRequest {
        domain: "bench".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry { key: "user".to_owned(), value: format!("u{user}") }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
    .encode_to_vec();
    let mut framed = Vec::with_capacity(5 + message.len());
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(message.len()).expect("a small message").to_be_bytes());
    framed.extend_from_slice(&message);
    Bytes::from(framed)
}

/// One call: `Ok(overall_code)` when the answer is a whole gRPC message with
/// `grpc-status: 0`, `Err` otherwise.
async fn call(
    sender: &mut h2::client::SendRequest<Bytes>,
    authority: &str,
    token: Option<&str>,
    body: Bytes,
) -> Result<i32, String> {
    let mut request = http::Request::post(format!("http://{authority}{PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request.body(()).map_err(|e| e.to_string())?;
    let ready = sender.clone().ready().await.map_err(|e| e.to_string())?;
    *sender = ready;
    let (response, mut stream) = sender.send_request(request, false).map_err(|e| e.to_string())?;
    stream.send_data(body, true).map_err(|e| e.to_string())?;
    let response = response.await.map_err(|e| e.to_string())?;
    let mut incoming = response.into_body();
    let mut message = Vec::new();
    while let Some(chunk) = incoming.data().await {
        let chunk = chunk.map_err(|e| e.to_string())?;
        let _ = incoming.flow_control().release_capacity(chunk.len());
        message.extend_from_slice(chunk.chunk());
    }
    let trailers = incoming.trailers().await.map_err(|e| e.to_string())?.unwrap_or_default();
    let status = trailers.get("grpc-status").and_then(|v| v.to_str().ok()).unwrap_or("");
    if status != "0" {
        return Err(format!("grpc-status {status:?}"));
    }
    let decoded = RateLimitResponse::decode(message.get(5..).unwrap_or_default()).map_err(|e| e.to_string())?;
    Ok(decoded.overall_code)
}

/// One connection and its streams' tallies.
async fn one_connection(
    addr: String,
    index: usize,
    streams: usize,
    until: Instant,
    token: Option<String>,
    bodies: std::sync::Arc<Vec<Bytes>>,
) -> Vec<Tally> {
    let tcp = tokio::net::TcpStream::connect(&addr).await.expect("connects to the service");
    tcp.set_nodelay(true).expect("TCP_NODELAY");
    let (sender, connection) = h2::client::handshake(tcp).await.expect("an HTTP/2 handshake");
    let driver = tokio::spawn(connection);
    let tasks: Vec<_> = (0..streams)
        .map(|s| {
            let sender = sender.clone();
            tokio::spawn(one_stream(sender, addr.clone(), index * streams + s, until, token.clone(), bodies.clone()))
        })
        .collect();
    drop(sender);
    let mut tallies = Vec::with_capacity(streams);
    for task in tasks {
        tallies.push(task.await.expect("a stream's task"));
    }
    driver.abort();
    tallies
}

/// One stream's calls, one after the other.
async fn one_stream(
    mut sender: h2::client::SendRequest<Bytes>,
    addr: String,
    index: usize,
    until: Instant,
    token: Option<String>,
    bodies: std::sync::Arc<Vec<Bytes>>,
) -> Tally {
    let mut tally = Tally { latencies_us: Vec::with_capacity(1 << 16), errors: 0, over: 0 };
    let mut user = index * 7919 % USERS;
    while Instant::now() < until {
        user = (user + 1) % USERS;
        let start = Instant::now();
        let answer = call(&mut sender, &addr, token.as_deref(), bodies[user].clone()).await;
        let took = u32::try_from(start.elapsed().as_micros()).unwrap_or(u32::MAX);
        match answer {
            Ok(code) => {
                tally.latencies_us.push(took);
                if code != 1 {
                    tally.over += 1;
                }
            }
            Err(error) => {
                if tally.errors == 0 {
                    eprintln!("rls-load: {error}");
                }
                tally.errors += 1;
            }
        }
    }
    tally
}

/// Runs the load and prints its line.
pub fn run(args: &[String]) {
    let [addr, connections, streams, seconds, rest @ ..] = args else {
        panic!("usage: envoy-bench rls-load ADDR CONNECTIONS STREAMS SECONDS [TOKEN]");
    };
    let connections: usize = connections.parse().expect("CONNECTIONS");
    let streams: usize = streams.parse().expect("STREAMS");
    let seconds: u64 = seconds.parse().expect("SECONDS");
    let token = rest.first().cloned();
    let bodies = std::sync::Arc::new((0..USERS).map(body).collect::<Vec<_>>());
    let cpu_before = super::cpu_ns(std::process::id()).unwrap_or(0.0);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    let (tallies, took) = runtime.block_on(async {
        let start = Instant::now();
        let until = start + Duration::from_secs(seconds);
        let tasks: Vec<_> = (0..connections)
            .map(|i| tokio::spawn(one_connection(addr.clone(), i, streams, until, token.clone(), bodies.clone())))
            .collect();
        let mut tallies = Vec::with_capacity(tasks.len() * streams);
        for task in tasks {
            tallies.extend(task.await.expect("a connection's task"));
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
