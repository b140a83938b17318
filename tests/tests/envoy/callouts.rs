//! Callouts (`proxy_http_call`) in Envoy and in wasm-host, compared: for every way an
//! upstream can answer or fail on the wire, a loopback server that does exactly that
//! (`sluice_tests::wire`), the test guest calling out to it from a request in real Envoy
//! and in wasm-host (`Cluster::Http`, the same server), and what the guest saw in each
//! host. The guest reports what it saw as request headers `x-callout-*` (header count,
//! status, body, every response header pair, `proxy_get_status`); in Envoy the request
//! then goes to an echo upstream, which sends those headers back.
//!
//! Each class also states when Envoy ends it, relative to the guest's timeout: a promise
//! Envoy keeps (a 300 ms timeout ends the call at 300 ms, within a second more; a class
//! that does not wait for its timeout ends within a second), not a benchmark. The request
//! each host sent is compared too, as the server read it.
//!
//! wasm-host runs on its virtual clock: a real callout is waited for in real time (up to
//! half a second for the classes that stall, so that a response head the server sends
//! at once has arrived), then the clock moves to the timeout.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sluice_artifacts::TEST_GUEST_WASM;
use sluice_tests::echo::{self, Echo};
use sluice_tests::envoy::{Envoy, cluster, sluice};
use sluice_tests::http::Request;
use sluice_tests::wire::{self, Step, WireServer};
use wasm_host::{Host, Outcome};

/// How much later than its deadline Envoy may end a callout.
const MARGIN: Duration = Duration::from_secs(1);
/// How much earlier than its deadline Envoy may end one: its timers count from the event
/// loop's cached time and fire on millisecond ticks (measured: 299.3 ms for 300 ms).
const EARLY: Duration = Duration::from_millis(20);
/// The timeout of classes that must not wait for it.
const LONG_TIMEOUT_MS: u64 = 3000;
/// The timeout of classes that end at it.
const SHORT_TIMEOUT_MS: u64 = 300;
/// Response header values that change from call to call.
const VARYING: &[&str] = &["x-envoy-upstream-service-time", "date"];

/// Where the callout goes.
enum Upstream {
    /// A server that plays these steps.
    Server(Vec<Step>),
    /// An address where nothing listens.
    Refused,
}

/// When Envoy ends the callout.
#[derive(Clone, Copy, Debug)]
enum Ends {
    /// At once: within [`MARGIN`] of the request, and before its timeout.
    Early,
    /// At its timeout (at most [`EARLY`] before, at most [`MARGIN`] after).
    AtTimeout,
    /// With no timeout, when the server acts, this long after the request.
    WhenServerActs(Duration),
}

struct Class {
    upstream: Upstream,
    timeout_ms: u64,
    ends: Ends,
}

/// What the guest saw: every `x-callout-*` header it added, values that vary masked.
type Seen = BTreeMap<String, String>;

fn observations<'a>(headers: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> Seen {
    let mut seen = Seen::new();
    for (name, value) in headers {
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        // Envoy's HTTP/1 codec trims the values it forwards to the echo upstream.
        let mut value = String::from_utf8_lossy(value.trim_ascii()).into_owned();
        let reported = name.starts_with("x-callout-") || name == "x-dispatch-error";
        if !reported || name == "x-callout-token" {
            continue;
        }
        if name.starts_with("x-callout-response-")
            && let Some((header, _)) = value.split_once(": ")
            && VARYING.contains(&header)
        {
            value = format!("{header}: <varies>");
        }
        seen.insert(name, value);
    }
    seen
}

/// One request whose filter calls out.
#[derive(Clone, Copy, Debug)]
struct Call {
    /// The test guest's operation: `callout`, or `callout-no-authority`.
    op: &'static str,
    cluster: &'static str,
    timeout_ms: u64,
}

impl Call {
    fn to(cluster: &'static str, timeout_ms: u64) -> Self {
        Self { op: "callout", cluster, timeout_ms }
    }

    fn headers(self) -> [(&'static str, String); 5] {
        [
            ("x-test-op", self.op.to_owned()),
            ("x-cluster", self.cluster.to_owned()),
            ("x-timeout-ms", self.timeout_ms.to_string()),
            ("x-callout-header", "extra".to_owned()),
            ("x-callout-payload", "question".to_owned()),
        ]
    }
}

/// Sends `calls` one after the other through one Envoy (one worker, so one root
/// context): what the guest saw for each, and how long each request took.
fn in_envoy(clusters: &[(&str, SocketAddr)], calls: &[Call]) -> Vec<(Seen, Duration)> {
    let echo = Echo::start();
    let builder = Envoy::builder().workers(1).sluice(sluice("").wasm(TEST_GUEST_WASM));
    let builder = clusters.iter().fold(builder, |b, (name, addr)| b.cluster(cluster(name, *addr, false)));
    let envoy =
        builder.cluster(cluster("echo", echo.addr(), false)).route_to("echo").start().unwrap_or_else(|e| panic!("{e}"));
    calls
        .iter()
        .map(|call| {
            let request = call.headers().iter().fold(Request::get("/test"), |r, (n, v)| r.header(n, v));
            let started = Instant::now();
            let response = envoy.send(&request);
            let took = started.elapsed();
            assert_eq!(response.status, 200, "{}", response.text());
            let echoed = echo::headers(&response.body);
            (observations(echoed.iter().map(|(n, v)| (n.as_bytes(), v.as_slice()))), took)
        })
        .collect()
}

/// The same calls in wasm-host (virtual clock, one worker): what the guest saw.
fn in_wasm_host(clusters: &[(&str, SocketAddr)], calls: &[Call], wait: Duration) -> Vec<Seen> {
    let builder = Host::builder(TEST_GUEST_WASM).real_callout_wait(wait);
    let mut host = clusters.iter().fold(builder, |b, (name, addr)| b.cluster(*name, *addr)).build().unwrap();
    calls
        .iter()
        .map(|call| {
            let request = call.headers().iter().fold(wasm_host::Request::get("/test"), |r, (n, v)| r.header(n, v));
            let stream = host.worker(0).request(request);
            if host.worker(0).outcome(stream).unwrap().is_paused() {
                host.advance(Duration::from_millis(call.timeout_ms));
            }
            let seen = match host.worker(0).outcome(stream).unwrap() {
                Outcome::Forwarded(message) => observations(message.headers.iter()),
                other => panic!("wasm-host did not forward the request: {other:?}"),
            };
            host.worker(0).respond(stream, wasm_host::Response::ok()).unwrap();
            host.worker(0).finish(stream).unwrap();
            seen
        })
        .collect()
}

/// Runs `class` in both hosts; asserts they agree and that Envoy kept its deadline.
fn compare(class: &Class) -> Seen {
    let server = match &class.upstream {
        Upstream::Server(steps) => Some(WireServer::start(steps.clone())),
        Upstream::Refused => None,
    };
    let addr = server.as_ref().map_or_else(wire::refused, WireServer::addr);
    // Classes that stall wait for the server this long in real time before the virtual
    // clock moves to their timeout; a response head sent at once has arrived by then.
    let wait = match class.ends {
        Ends::AtTimeout => Duration::from_millis(500),
        Ends::Early | Ends::WhenServerActs(_) => Duration::from_secs(10),
    };
    let calls = [Call::to("upstream", class.timeout_ms)];

    let (envoy, took) = in_envoy(&[("upstream", addr)], &calls).remove(0);
    let wasm_host = in_wasm_host(&[("upstream", addr)], &calls, wait).remove(0);

    eprintln!("Envoy took {took:?}; the guest saw {envoy:#?}");
    let timeout = Duration::from_millis(class.timeout_ms);
    match class.ends {
        Ends::Early => assert!(took < MARGIN.min(timeout), "Envoy took {took:?}, the timeout is {timeout:?}"),
        Ends::AtTimeout => {
            assert!(
                took + EARLY >= timeout && took <= timeout + MARGIN,
                "Envoy took {took:?}, the timeout is {timeout:?}"
            );
        }
        Ends::WhenServerActs(at) => {
            let within = took + EARLY >= at && took <= at + MARGIN;
            assert!(within, "Envoy took {took:?}, the server acted after {at:?}");
        }
    }
    assert_eq!(wasm_host, envoy, "wasm-host (left) and Envoy (right) disagree");
    if let Some(server) = &server {
        // The same request on the wire from both hosts: Envoy's first, then wasm-host's.
        let requests: Vec<String> = server.requests().iter().map(|r| String::from_utf8_lossy(r).into_owned()).collect();
        assert_eq!(requests.len(), 2, "{requests:#?}");
        assert_eq!(requests[1], requests[0], "wasm-host (left) and Envoy (right) sent different requests");
    }
    envoy
}

fn response(status: &str, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
    let mut head = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(body);
    head.into_bytes()
}

fn get<'a>(seen: &'a Seen, name: &str) -> &'a str {
    seen.get(name).map_or("", String::as_str)
}

const BEFORE_HEADERS: &str = "upstream connect error or disconnect/reset before headers. reset reason: ";

/// Asserts that the guest got a response: status, body, header pairs (masked), and
/// `proxy_get_status` code `code`.
fn assert_response(seen: &Seen, status: &str, body: &str, headers: &[&str], code: &str) {
    let pairs: Vec<&str> = (0..headers.len()).map(|i| get(seen, &format!("x-callout-response-{i}"))).collect();
    assert_eq!(
        (get(seen, "x-callout-status"), get(seen, "x-callout-body"), pairs.as_slice()),
        (status, body, headers),
        "{seen:#?}"
    );
    assert_eq!(get(seen, "x-callout-headers"), headers.len().to_string(), "{seen:#?}");
    assert_eq!((get(seen, "x-callout-status-code"), get(seen, "x-callout-status-message")), (code, "none"));
}

/// Asserts that the guest got Envoy's router reply.
fn assert_router_reply(seen: &Seen, status: &str, body: &str) {
    let length = format!("content-length: {}", body.len());
    assert_response(seen, status, body, &[&format!(":status: {status}"), &length, "content-type: text/plain"], "0");
}

/// Asserts that the guest got `(0, 0, 0)`, status `(11, "reset")`, and no response maps.
fn assert_reset(seen: &Seen) {
    let expected = [
        ("x-callout-headers", "0"),
        ("x-callout-body-size", "0"),
        ("x-callout-status-code", "11"),
        ("x-callout-status-message", "reset"),
        ("x-callout-read-status", "2"),
        ("x-callout-pairs", "0"),
        ("x-callout-body-read-status", "1"),
    ];
    for (name, value) in expected {
        assert_eq!(get(seen, name), value, "{name} in {seen:#?}");
    }
}

const SERVICE_TIME: &str = "x-envoy-upstream-service-time: <varies>";

#[test]
fn a_200_reaches_the_guest_with_the_upstream_headers_in_both_hosts() {
    let seen = compare(&Class {
        upstream: Upstream::Server(vec![Step::Write(response("200 OK", &[("x-from-upstream", "real")], "ok"))]),
        timeout_ms: LONG_TIMEOUT_MS,
        ends: Ends::Early,
    });

    assert_response(
        &seen,
        "200",
        "ok",
        &[":status: 200", "content-length: 2", "x-from-upstream: real", SERVICE_TIME],
        "0",
    );
}

#[test]
fn a_5xx_reaches_the_guest_as_a_response_in_both_hosts() {
    let seen = compare(&Class {
        upstream: Upstream::Server(vec![Step::Write(response("503 Service Unavailable", &[], "busy"))]),
        timeout_ms: LONG_TIMEOUT_MS,
        ends: Ends::Early,
    });

    assert_response(&seen, "503", "busy", &[":status: 503", "content-length: 4", SERVICE_TIME], "0");
}

#[test]
fn a_chunked_200_keeps_its_headers_in_order_and_loses_its_trailers_in_both_hosts() {
    let seen = compare(&Class {
        upstream: Upstream::Server(vec![Step::write(
            "HTTP/1.1 200 OK\r\nX-Dup: 1\r\nTransfer-Encoding: chunked\r\nX-Mixed-Case: a\r\nX-Dup: 2\r\n\
             Connection: close\r\nKeep-Alive: timeout=5\r\nx-envoy-upstream-service-time: 999\r\nx-padded: \t v \r\n\r\n\
             2\r\nok\r\n3\r\n!!!\r\n0\r\nx-trailer: t\r\n\r\n",
        )]),
        timeout_ms: LONG_TIMEOUT_MS,
        ends: Ends::Early,
    });

    let headers = [
        ":status: 200",
        "x-dup: 1",
        "transfer-encoding: chunked",
        "x-mixed-case: a",
        "x-dup: 2",
        "connection: close",
        SERVICE_TIME,
        "x-padded: v",
    ];
    assert_response(&seen, "200", "ok!!!", &headers, "0");
    assert_eq!(get(&seen, "x-callout-trailers"), "0");
}

#[test]
fn a_body_delimited_by_the_close_arrives_whole_in_both_hosts() {
    let seen = compare(&Class {
        upstream: Upstream::Server(vec![
            Step::write("HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end"),
            Step::Close,
        ]),
        timeout_ms: LONG_TIMEOUT_MS,
        ends: Ends::Early,
    });

    assert_response(&seen, "200", "until the end", &[":status: 200", "connection: close", SERVICE_TIME], "0");
}

#[test]
fn an_interim_100_is_skipped_in_both_hosts() {
    let seen = compare(&Class {
        upstream: Upstream::Server(vec![
            Step::write("HTTP/1.1 100 Continue\r\n\r\n"),
            Step::Write(response("200 OK", &[], "x")),
        ]),
        timeout_ms: LONG_TIMEOUT_MS,
        ends: Ends::Early,
    });

    assert_response(&seen, "200", "x", &[":status: 200", "content-length: 1", SERVICE_TIME], "0");
}

#[test]
fn a_refused_connection_is_a_503_in_both_hosts() {
    let seen = compare(&Class { upstream: Upstream::Refused, timeout_ms: LONG_TIMEOUT_MS, ends: Ends::Early });

    assert_router_reply(&seen, "503", &format!("{BEFORE_HEADERS}remote connection failure"));
}

#[test]
fn an_upstream_that_never_answers_is_a_504_at_the_timeout_in_both_hosts() {
    let seen = compare(&Class {
        upstream: Upstream::Server(vec![Step::Wait(wire::HOLD_LIMIT)]),
        timeout_ms: SHORT_TIMEOUT_MS,
        ends: Ends::AtTimeout,
    });

    assert_router_reply(&seen, "504", "upstream request timeout");
}

#[test]
fn a_head_cut_short_at_the_timeout_is_a_504_in_both_hosts() {
    let seen = compare(&Class {
        upstream: Upstream::Server(vec![Step::write("HTTP/1.1 200 OK\r\ncontent-")]),
        timeout_ms: SHORT_TIMEOUT_MS,
        ends: Ends::AtTimeout,
    });

    assert_router_reply(&seen, "504", "upstream request timeout");
}

#[test]
fn a_body_slower_than_the_timeout_is_a_reset_in_both_hosts() {
    let seen = compare(&Class {
        upstream: Upstream::Server(vec![Step::write("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\npart")]),
        timeout_ms: SHORT_TIMEOUT_MS,
        ends: Ends::AtTimeout,
    });

    assert_reset(&seen);
}

#[test]
fn a_reset_in_the_middle_of_the_body_is_a_reset_in_both_hosts() {
    let seen = compare(&Class {
        upstream: Upstream::Server(vec![
            Step::write("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\npart"),
            Step::Wait(Duration::from_millis(50)),
            Step::Reset,
        ]),
        timeout_ms: LONG_TIMEOUT_MS,
        ends: Ends::Early,
    });

    assert_reset(&seen);
}

#[test]
fn a_close_in_the_middle_of_the_body_is_a_reset_in_both_hosts() {
    let seen = compare(&Class {
        upstream: Upstream::Server(vec![
            Step::write("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\npart"),
            Step::Wait(Duration::from_millis(50)),
            Step::Close,
        ]),
        timeout_ms: LONG_TIMEOUT_MS,
        ends: Ends::Early,
    });

    assert_reset(&seen);
}

#[test]
fn a_bad_chunk_is_a_reset_in_both_hosts() {
    let seen = compare(&Class {
        upstream: Upstream::Server(vec![Step::write("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n")]),
        timeout_ms: LONG_TIMEOUT_MS,
        ends: Ends::Early,
    });

    assert_reset(&seen);
}

#[test]
fn an_answer_that_is_not_http_is_a_502_in_both_hosts() {
    let seen = compare(&Class {
        upstream: Upstream::Server(vec![Step::write("this is not http\r\n\r\n")]),
        timeout_ms: LONG_TIMEOUT_MS,
        ends: Ends::Early,
    });

    assert_router_reply(&seen, "502", &format!("{BEFORE_HEADERS}protocol error"));
}

#[test]
fn a_head_cut_short_by_the_close_is_a_502_in_both_hosts() {
    let seen = compare(&Class {
        upstream: Upstream::Server(vec![Step::write("HTTP/1.1 200 OK\r\n"), Step::Close]),
        timeout_ms: LONG_TIMEOUT_MS,
        ends: Ends::Early,
    });

    assert_router_reply(&seen, "502", &format!("{BEFORE_HEADERS}protocol error"));
}

#[test]
fn framing_headers_envoy_refuses_are_a_502_in_both_hosts() {
    for head in [
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nok",
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    ] {
        let seen = compare(&Class {
            upstream: Upstream::Server(vec![Step::write(head)]),
            timeout_ms: LONG_TIMEOUT_MS,
            ends: Ends::Early,
        });

        assert_router_reply(&seen, "502", &format!("{BEFORE_HEADERS}protocol error"));
    }
}

#[test]
fn a_connection_closed_without_an_answer_is_a_503_in_both_hosts() {
    let seen = compare(&Class {
        upstream: Upstream::Server(vec![Step::Close]),
        timeout_ms: LONG_TIMEOUT_MS,
        ends: Ends::Early,
    });

    assert_router_reply(&seen, "503", &format!("{BEFORE_HEADERS}connection termination"));
}

#[test]
fn a_connection_reset_without_an_answer_is_a_503_in_both_hosts() {
    let seen = compare(&Class {
        upstream: Upstream::Server(vec![Step::Reset]),
        timeout_ms: LONG_TIMEOUT_MS,
        ends: Ends::Early,
    });

    assert_router_reply(&seen, "503", &format!("{BEFORE_HEADERS}connection termination"));
}

#[test]
fn a_timeout_of_0_waits_for_a_slow_answer_in_both_hosts() {
    let delay = Duration::from_millis(1500);
    let seen = compare(&Class {
        upstream: Upstream::Server(vec![Step::Wait(delay), Step::Write(response("200 OK", &[], "late"))]),
        timeout_ms: 0,
        ends: Ends::WhenServerActs(delay),
    });

    assert_response(&seen, "200", "late", &[":status: 200", "content-length: 4", SERVICE_TIME], "0");
}

#[test]
fn a_reset_leaves_its_status_code_for_the_next_callouts_in_both_hosts() {
    let broken = WireServer::start(vec![Step::write("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\npart"), Step::Reset]);
    let fine = WireServer::start(vec![Step::Write(response("200 OK", &[], "ok"))]);
    let clusters = [("broken", broken.addr()), ("upstream", fine.addr())];
    let calls = [
        Call::to("upstream", LONG_TIMEOUT_MS),
        Call::to("broken", LONG_TIMEOUT_MS),
        Call::to("upstream", LONG_TIMEOUT_MS),
    ];

    let envoy: Vec<Seen> = in_envoy(&clusters, &calls).into_iter().map(|(seen, _)| seen).collect();
    let wasm_host = in_wasm_host(&clusters, &calls, Duration::from_secs(10));

    assert_eq!(wasm_host, envoy, "wasm-host (left) and Envoy (right) disagree");
    let ok = [":status: 200", "content-length: 2", SERVICE_TIME];
    assert_response(&envoy[0], "200", "ok", &ok, "0");
    assert_reset(&envoy[1]);
    // Envoy clears the message after the callback, never the code.
    assert_response(&envoy[2], "200", "ok", &ok, "11");
}

#[test]
fn an_unknown_cluster_or_a_missing_authority_is_a_bad_argument_in_both_hosts() {
    let fine = WireServer::start(vec![Step::Write(response("200 OK", &[], "ok"))]);
    let clusters = [("upstream", fine.addr())];
    let no_authority = Call { op: "callout-no-authority", ..Call::to("upstream", LONG_TIMEOUT_MS) };
    let calls = [Call::to("nope", LONG_TIMEOUT_MS), no_authority];

    let envoy: Vec<Seen> = in_envoy(&clusters, &calls).into_iter().map(|(seen, _)| seen).collect();
    let wasm_host = in_wasm_host(&clusters, &calls, Duration::from_secs(10));

    assert_eq!(wasm_host, envoy, "wasm-host (left) and Envoy (right) disagree");
    for seen in &envoy {
        assert_eq!(get(seen, "x-dispatch-error"), "BadArgument");
        assert_eq!(get(seen, "x-callout-headers"), "", "no callback: {seen:#?}");
    }
    assert!(fine.requests().is_empty());
}
