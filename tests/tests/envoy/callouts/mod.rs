//! Callouts (`proxy_http_call`) in Envoy and in wasm-host, compared: for every way an
//! upstream can answer or fail on the wire, a loopback server that does exactly that
//! (`sluice_testkit::peers`), the test guest calling out to it from a request in real Envoy
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

use std::time::Duration;

use sluice_testkit::peers::{HOLD_LIMIT, Peer, Step};

mod compare;

use compare::*;

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
        upstream: Upstream::Server(vec![Step::Wait(HOLD_LIMIT)]),
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
    let broken = Peer::start(vec![Step::write("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\npart"), Step::Reset]);
    let fine = Peer::start(vec![Step::Write(response("200 OK", &[], "ok"))]);
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
    let fine = Peer::start(vec![Step::Write(response("200 OK", &[], "ok"))]);
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
