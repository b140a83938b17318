//! Whether HTTP/1.1 and h2c are served alike on one port: many streams multiplexed on one
//! HTTP/2 connection, graceful shutdown with HTTP/2 connections open, a killed service
//! restarted on the same address, and requests whose body never arrives.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::channel::{Channel, Sender};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use sluice_counter::Running;
use sluice_counter::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::api::start;
use crate::support::{Http, Protocol};

/// One HTTP/2 connection with prior knowledge, and the task driving it (it ends when
/// the connection does).
async fn h2_connection<B>(
    addr: std::net::SocketAddr,
) -> (SendRequest<B>, tokio::task::JoinHandle<Result<(), hyper::Error>>)
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.expect("h2 handshake");
    (sender, tokio::spawn(connection))
}

fn request<B>(path: &str, body: B) -> hyper::Request<B> {
    hyper::Request::builder()
        .method("POST")
        .uri(format!("http://sluice{path}"))
        .header("content-type", "application/json")
        .body(body)
        .expect("a request")
}

fn window_check(key: &str) -> Value {
    json!({"entries": [{"key": key, "limit": {"algorithm": "fixed_window", "limit": 400, "window_ms": 3_600_000}}]})
}

async fn answer(response: hyper::Response<hyper::body::Incoming>) -> (u16, Value) {
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.expect("a body").to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{status}: {e}: {body:?}")))
}

fn metric(metrics: &str, name: &str) -> Option<i64> {
    metrics.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_hundred_concurrent_streams_on_one_h2_connection_are_all_answered_and_decided_once_each() {
    let _shared = crate::support::HEAVY.read().await;
    let (running, http1) = start(Config::defaults()).await;
    let (sender, _connection) = h2_connection::<Full<Bytes>>(running.addr).await;

    let streams: Vec<_> = (0..600)
        .map(|_| {
            let mut sender = sender.clone();
            tokio::spawn(async move {
                let body = Full::new(Bytes::from(window_check("multiplexed").to_string()));
                let response = sender.send_request(request("/v1/check", body)).await.expect("an answer");
                answer(response).await
            })
        })
        .collect();
    let mut admitted = 0;
    let mut statuses = std::collections::BTreeMap::new();
    for stream in streams {
        let (status, body) = stream.await.expect("the stream task");
        *statuses.entry(status).or_insert(0) += 1;
        admitted += u32::from(body["admitted"] == true);
    }
    // The metrics come over the same h2 connection: a pooled HTTP/1.1 client may open a
    // second connection of its own while its first is still returning to the pool.
    let metrics = {
        let get = hyper::Request::get("http://sluice/metrics").body(Full::new(Bytes::new())).expect("a request");
        let response = sender.clone().send_request(get).await.expect("an answer");
        let body = response.into_body().collect().await.expect("a body").to_bytes();
        String::from_utf8_lossy(&body).into_owned()
    };
    let (_, after) = http1.post("/v1/check", &window_check("multiplexed")).await;

    assert_eq!(statuses, [(200, 600)].into(), "more streams than one connection may open at once all get answers");
    assert_eq!(admitted, 400, "each stream decided exactly once");
    assert_eq!(after["admitted"], false, "HTTP/1.1 on the same port sees the same counter");
    assert_eq!(metric(&metrics, "sluice_counter_open_connections"), Some(1), "600 streams on one connection");
    assert_eq!(metric(&metrics, "sluice_counter_decisions_total{outcome=\"admitted\"}"), Some(400));
    running.stop().await.expect("clean stop");
}

/// Starts a check on `sender` whose body is still being sent: a request in flight for
/// as long as the test wants. Returns the body's sender and the pending answer.
fn in_flight(
    sender: &SendRequest<Channel<Bytes>>,
) -> (Sender<Bytes>, tokio::task::JoinHandle<Result<hyper::Response<hyper::body::Incoming>, hyper::Error>>) {
    let (body, channel) = Channel::<Bytes>::new(4);
    let mut sender = sender.clone();
    let request = request("/v1/check", channel);
    (body, tokio::spawn(async move { sender.send_request(request).await }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_finishes_h2_streams_in_flight_and_closes_idle_h2_connections() {
    let _shared = crate::support::HEAVY.read().await;
    let (running, _) = start(Config::defaults()).await;
    let addr = running.addr;
    let (idle_sender, idle_connection) = h2_connection::<Full<Bytes>>(addr).await;
    let (busy_sender, busy_connection) = h2_connection::<Channel<Bytes>>(addr).await;
    let mut idle_sender = idle_sender;
    let (_, warm) = answer(
        idle_sender
            .send_request(request("/v1/check", Full::new(Bytes::from(window_check("idle").to_string()))))
            .await
            .expect("an answer"),
    )
    .await;
    let (mut body, pending) = in_flight(&busy_sender);
    let check = window_check("busy").to_string();
    let (first_half, second_half) = check.split_at(10);
    body.send_data(Bytes::copy_from_slice(first_half.as_bytes())).await.expect("the first half is sent");
    tokio::time::sleep(Duration::from_millis(100)).await;

    let stopping = tokio::spawn(running.stop());
    let idle_closed = tokio::time::timeout(Duration::from_secs(5), idle_connection).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let still_stopping = !stopping.is_finished();
    body.send_data(Bytes::copy_from_slice(second_half.as_bytes())).await.expect("the second half is sent");
    drop(body);
    let (status, answered) = answer(pending.await.expect("the task").expect("an answer after the drain began")).await;
    let stopped = tokio::time::timeout(Duration::from_secs(5), stopping).await;
    let busy_closed = tokio::time::timeout(Duration::from_secs(5), busy_connection).await;
    let reconnect = tokio::net::TcpStream::connect(addr).await;

    assert_eq!(warm["admitted"], true);
    assert!(idle_closed.is_ok(), "the idle h2 connection was closed by GOAWAY at once");
    assert!(still_stopping, "the server waits for the stream in flight");
    assert_eq!((status, answered["admitted"].as_bool()), (200, Some(true)), "{answered}");
    assert!(matches!(stopped, Ok(Ok(Ok(())))), "then the shutdown completes: {stopped:?}");
    assert!(busy_closed.is_ok(), "and the busy connection closes after its last stream");
    assert!(reconnect.is_err(), "nothing listens any more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_service_drops_every_connection_unanswered_and_a_new_one_starts_on_its_address() {
    let _shared = crate::support::HEAVY.read().await;
    let (running, http1) = start(Config::defaults()).await;
    let addr = running.addr;
    let (_, spent) = http1.post("/v1/check", &window_check("k")).await;
    let (busy_sender, h2_connection_task) = h2_connection::<Channel<Bytes>>(addr).await;
    let (mut body, pending) = in_flight(&busy_sender);
    body.send_data(Bytes::from_static(b"{\"entries\":")).await.expect("part of a body is sent");
    let mut held = tokio::net::TcpStream::connect(addr).await.expect("an HTTP/1.1 connection");
    tokio::time::sleep(Duration::from_millis(100)).await;

    let killed = tokio::time::timeout(Duration::from_secs(5), running.kill()).await;
    let in_flight_result = tokio::time::timeout(Duration::from_secs(5), pending).await;
    let h2_ended = tokio::time::timeout(Duration::from_secs(5), h2_connection_task).await;
    let mut buffer = [0u8; 64];
    let held_read =
        tokio::time::timeout(Duration::from_secs(5), tokio::io::AsyncReadExt::read(&mut held, &mut buffer)).await;
    let listener = tokio::net::TcpListener::bind(addr).await.expect("the address is free again at once");
    let restarted = Running::start(listener, Config::defaults()).await.expect("a new service starts");
    let fresh = Http::with(addr, Protocol::H2c);
    let (status, after) = fresh.post("/v1/check", &window_check("k")).await;
    let (_, old_client) = http1.post("/v1/check", &window_check("k")).await;

    assert_eq!(spent["entries"][0]["remaining"], 399);
    assert!(matches!(killed, Ok(Ok(()))), "kill returns once everything is dropped: {killed:?}");
    assert!(matches!(in_flight_result, Ok(Ok(Err(_)))), "the request in flight gets no answer: {in_flight_result:?}");
    assert!(h2_ended.is_ok(), "the h2 connection is gone");
    assert!(matches!(held_read, Ok(Ok(0)) | Ok(Err(_))), "the HTTP/1.1 connection is closed: {held_read:?}");
    assert_eq!((status, after["entries"][0]["remaining"].as_u64()), (200, Some(399)), "a new memory store: {after}");
    assert_eq!(old_client["entries"][0]["remaining"], 398, "a pooled client reconnects to the new service");
    restarted.stop().await.expect("clean stop");
}

/// Requests the service has seen arrive and not answered or shed: whose body is still
/// being read, being served, or refused for want of a permit (a metric the service does
/// not have reads as 0).
async fn requests_held(http: &Http) -> i64 {
    let (_, metrics) = http.get("/metrics").await;
    ["sluice_counter_reading_requests", "sluice_counter_in_flight_requests", "sluice_counter_shed_requests_total"]
        .iter()
        .map(|name| metric(&metrics, name).unwrap_or(0))
        .sum()
}

async fn wait_for_requests_held(http: &Http, count: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while requests_held(http).await < count {
        assert!(Instant::now() < deadline, "the service never saw the {count} stalled requests");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn timeouts_answered(http: &Http) -> Option<i64> {
    let (_, metrics) = http.get("/metrics").await;
    metric(&metrics, "sluice_counter_responses_total{status=\"408\"}")
}

const STALL_DEADLINE_MS: u64 = 1000;

fn stalling_config() -> Config {
    Config { max_in_flight: 16, request_timeout_ms: STALL_DEADLINE_MS, ..Config::defaults() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_never_arrive_over_http1_take_no_permit_and_get_408_at_the_deadline() {
    let _shared = crate::support::HEAVY.read().await;
    let (running, http) = start(stalling_config()).await;
    let sent = Instant::now();
    let mut stalled = Vec::new();
    for _ in 0..20 {
        let mut stream = tokio::net::TcpStream::connect(running.addr).await.expect("connect");
        let head =
            "POST /v1/check HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n";
        stream.write_all(head.as_bytes()).await.expect("the headers are sent, and no body");
        stalled.push(stream);
    }
    wait_for_requests_held(&http, 20).await;

    let (status, answered) = http.post("/v1/check", &window_check("k")).await;
    let timeouts_when_answered = timeouts_answered(&http).await;
    assert_eq!((status, answered["admitted"].as_bool()), (200, Some(true)), "not overloaded: {answered}");
    assert_eq!(timeouts_when_answered, Some(0), "the check did not wait for the stalled requests' deadline");
    let mut answers = Vec::new();
    for mut stream in stalled {
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
        assert!(matches!(read, Ok(Ok(_))), "answered, then closed: {read:?}");
        answers.push(String::from_utf8_lossy(&answer).into_owned());
    }
    let waited = sent.elapsed();

    for answer in &answers {
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains(r#""code":"request_timeout""#) && answer.contains("connection: close"), "{answer}");
    }
    assert!(waited >= Duration::from_millis(STALL_DEADLINE_MS), "not before the deadline: {waited:?}");
    assert_eq!(timeouts_answered(&http).await, Some(20));
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_streams_whose_body_never_ends_take_no_permit_and_get_408_at_the_deadline() {
    let _shared = crate::support::HEAVY.read().await;
    let (running, http) = start(stalling_config()).await;
    let (sender, _connection) = h2_connection::<Channel<Bytes>>(running.addr).await;
    let sent = Instant::now();
    let (bodies, pending): (Vec<_>, Vec<_>) = (0..20).map(|_| in_flight(&sender)).unzip();
    wait_for_requests_held(&http, 20).await;

    let other = Http::with(running.addr, Protocol::H2c);
    let (status, answered) = other.post("/v1/check", &window_check("k")).await;
    let timeouts_when_answered = timeouts_answered(&http).await;
    assert_eq!((status, answered["admitted"].as_bool()), (200, Some(true)), "not overloaded: {answered}");
    assert_eq!(timeouts_when_answered, Some(0), "the check did not wait for the stalled requests' deadline");
    let mut answers = Vec::new();
    for stream in pending {
        let response = tokio::time::timeout(Duration::from_secs(10), stream).await;
        let response = response.expect("answered within the deadline and a margin").expect("the task");
        answers.push(answer(response.expect("an answer")).await);
    }
    let waited = sent.elapsed();
    drop(bodies);

    for (status, body) in &answers {
        assert_eq!((*status, body["error"]["code"].as_str()), (408, Some("request_timeout")), "{body}");
    }
    assert!(waited >= Duration::from_millis(STALL_DEADLINE_MS), "not before the deadline: {waited:?}");
    running.stop().await.expect("clean stop");
}
