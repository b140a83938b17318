//! The comparison harness: one class of upstream behaviour served on loopback, called
//! from the test guest in Envoy and in wasm-host, and what each host let the guest see.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sluice_artifacts::TEST_GUEST_WASM;
use sluice_testkit::peers::{self, Peer, Step};
use sluice_tests::echo::{self, Echo};
use sluice_tests::envoy::{Envoy, cluster, sluice};
use sluice_tests::http::Request;
use wasm_host::{Host, Outcome};

/// How much later than its deadline Envoy may end a callout.
pub(super) const MARGIN: Duration = Duration::from_secs(1);
/// How much earlier than its deadline Envoy may end one: its timers count from the event
/// loop's cached time and fire on millisecond ticks (measured: 299.3 ms for 300 ms).
pub(super) const EARLY: Duration = Duration::from_millis(20);
/// The timeout of classes that must not wait for it.
pub(super) const LONG_TIMEOUT_MS: u64 = 3000;
/// The timeout of classes that end at it.
pub(super) const SHORT_TIMEOUT_MS: u64 = 300;
/// Response header values that change from call to call.
pub(super) const VARYING: &[&str] = &["x-envoy-upstream-service-time", "date"];

/// Where the callout goes.
pub(super) enum Upstream {
    /// A server that plays these steps.
    Server(Vec<Step>),
    /// An address where nothing listens.
    Refused,
}

/// When Envoy ends the callout.
#[derive(Clone, Copy, Debug)]
pub(super) enum Ends {
    /// At once: within [`MARGIN`] of the request, and before its timeout.
    Early,
    /// At its timeout (at most [`EARLY`] before, at most [`MARGIN`] after).
    AtTimeout,
    /// With no timeout, when the server acts, this long after the request.
    WhenServerActs(Duration),
}

pub(super) struct Class {
    pub(super) upstream: Upstream,
    pub(super) timeout_ms: u64,
    pub(super) ends: Ends,
}

/// What the guest saw: every `x-callout-*` header it added, values that vary masked.
pub(super) type Seen = BTreeMap<String, String>;

pub(super) fn observations<'a>(headers: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> Seen {
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
pub(super) struct Call {
    /// The test guest's operation: `callout`, or `callout-no-authority`.
    pub(super) op: &'static str,
    pub(super) cluster: &'static str,
    pub(super) timeout_ms: u64,
}

impl Call {
    pub(super) fn to(cluster: &'static str, timeout_ms: u64) -> Self {
        Self { op: "callout", cluster, timeout_ms }
    }

    pub(super) fn headers(self) -> [(&'static str, String); 5] {
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
pub(super) fn in_envoy(clusters: &[(&str, SocketAddr)], calls: &[Call]) -> Vec<(Seen, Duration)> {
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
pub(super) fn in_wasm_host(clusters: &[(&str, SocketAddr)], calls: &[Call], wait: Duration) -> Vec<Seen> {
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
pub(super) fn compare(class: &Class) -> Seen {
    let server = match &class.upstream {
        Upstream::Server(steps) => Some(Peer::start(steps.clone())),
        Upstream::Refused => None,
    };
    let addr = server.as_ref().map_or_else(peers::refused, Peer::addr);
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

pub(super) fn response(status: &str, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
    let mut head = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(body);
    head.into_bytes()
}

pub(super) fn get<'a>(seen: &'a Seen, name: &str) -> &'a str {
    seen.get(name).map_or("", String::as_str)
}

pub(super) const BEFORE_HEADERS: &str = "upstream connect error or disconnect/reset before headers. reset reason: ";

/// Asserts that the guest got a response: status, body, header pairs (masked), and
/// `proxy_get_status` code `code`.
pub(super) fn assert_response(seen: &Seen, status: &str, body: &str, headers: &[&str], code: &str) {
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
pub(super) fn assert_router_reply(seen: &Seen, status: &str, body: &str) {
    let length = format!("content-length: {}", body.len());
    assert_response(seen, status, body, &[&format!(":status: {status}"), &length, "content-type: text/plain"], "0");
}

/// Asserts that the guest got `(0, 0, 0)`, status `(11, "reset")`, and no response maps.
pub(super) fn assert_reset(seen: &Seen) {
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

pub(super) const SERVICE_TIME: &str = "x-envoy-upstream-service-time: <varies>";
