//! Header maps, bodies and trailers, and local responses.

use std::time::Duration;

use wasm_host::{Headers, LogLevel, Outcome, Request, Response, ResponseSource};

use crate::common::{forward, forwarded, host, ops, text};

#[test]
fn the_filter_reads_and_edits_request_headers_as_bytes() {
    let mut host = host("");
    let request = ops("headers")
        .header("x-in", [0xc3, 0x28, b'!'])
        .header("X-Replace", "old")
        .header("x-remove", "gone")
        .header("x-remove", "gone too");

    let forwarded = forward(host.worker(0), request);

    let headers = &forwarded.headers;
    assert_eq!(headers.get("x-got"), Some(&[0xc3, 0x28, b'!'][..]));
    assert_eq!(headers.get("x-replace"), Some(&b"new"[..]));
    assert_eq!(headers.get("x-added"), Some(&b"1"[..]));
    assert!(!headers.contains("x-remove"));
    assert_eq!(headers.get("x-binary"), Some(&[0xff, 0xfe, 0x00, 0x41][..]));
    assert_eq!(text(&forwarded, "x-missing"), "absent");
    // 4 pseudo-headers, x-test-op, x-in, x-replace, x-got, x-added, x-binary, x-missing.
    assert_eq!(text(&forwarded, "x-pair-count"), "11");
}

#[test]
fn the_header_map_size_is_the_byte_size_of_names_and_values() {
    let mut host = host("");
    let request = ops("header-size");
    let expected = request.headers().byte_size();

    let forwarded = forward(host.worker(0), request);

    assert_eq!(text(&forwarded, "x-header-size"), format!("0:{expected}"));
}

#[test]
fn setting_all_pairs_replaces_the_whole_map() {
    let mut host = host("");

    let forwarded = forward(host.worker(0), ops("set-all").header("x-other", "1"));

    let names: Vec<String> = forwarded.headers.to_string_pairs().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, [":method", ":path", ":scheme", ":authority", "x-replaced-all"]);
}

#[test]
fn the_filter_edits_the_upstream_response_and_cannot_reach_released_request_headers() {
    let mut host = host("");
    let upstream = Response::ok().header("x-replace", "old").header("x-remove-me", "1");

    let exchange = host.worker(0).exchange(ops("resp-headers"), upstream).unwrap();

    let response = exchange.response.expect("a response");
    assert_eq!(response.source, ResponseSource::Upstream);
    assert_eq!(response.headers.get_str("x-filter"), Some("1"));
    assert_eq!(response.headers.get_str("x-replace"), Some("new"));
    assert!(!response.headers.contains("x-remove-me"));
    assert_eq!(response.headers.get_str("x-seen-status"), Some("200"));
    // Envoy releases the request headers once the request continued: BAD_ARGUMENT.
    assert_eq!(response.headers.get_str("x-request-header-status"), Some("2"));
}

#[test]
fn a_local_response_goes_through_the_filters_own_response_callbacks() {
    let mut host = host("");
    let request = ops("local,resp-headers").header("x-status", "429").header("x-body", "slow down");

    let exchange = host.worker(0).exchange(request, Response::ok()).unwrap();

    assert_eq!(exchange.forwarded, None);
    let response = exchange.response.expect("a local response");
    assert_eq!(response.status, 429);
    assert!(response.is_local());
    assert_eq!(response.body_text(), "slow down");
    assert_eq!(response.headers.get_all("x-local"), vec![&b"yes"[..], &b"twice"[..]]);
    assert_eq!(response.headers.get_str("content-type"), Some("text/plain"));
    assert_eq!(response.headers.get_str("content-length"), Some("9"));
    assert_eq!(response.headers.get_str("x-filter"), Some("1"));
    assert_eq!(response.headers.get_str("x-seen-status"), Some("429"));
}

#[test]
fn a_local_response_wins_even_if_the_callback_returns_continue() {
    let mut host = host("");

    let stream = host.worker(0).request(ops("local-continue"));

    let outcome = host.worker(0).outcome(stream).unwrap();
    assert_eq!(outcome.local_response().map(|r| r.status), Some(403));
}

#[test]
fn a_local_response_from_the_response_path_replaces_the_response_directly() {
    let mut host = host("");

    let exchange = host.worker(0).exchange(ops("resp-local"), Response::ok().body("upstream body")).unwrap();

    let response = exchange.response.expect("a response");
    assert_eq!(response.status, 502);
    assert_eq!(response.body_text(), "replaced");
    assert_eq!(response.headers.get_str("x-replaced"), Some("yes"));
}

#[test]
fn the_request_body_can_be_read_and_rewritten() {
    let mut host = host("");

    let forwarded = forward(host.worker(0), Request::post("/upload", "payload").header("x-test-op", "body"));

    assert_eq!(forwarded.body_bytes(), b"payload+seen");
    assert!(host.logs_at(LogLevel::Info).contains(&"request body of 7 bytes (end_of_stream=true)".to_owned()));
}

#[test]
fn a_body_callback_that_continues_releases_headers_the_filter_paused() {
    let mut host = host("");
    let worker = host.worker(0);

    let with_body = worker.request(Request::post("/", "x").header("x-test-op", "hold-headers"));
    let without_body = worker.request(ops("hold-headers"));

    assert!(matches!(worker.outcome(with_body).unwrap(), Outcome::Forwarded(_)));
    assert!(worker.outcome(without_body).unwrap().is_paused());
}

#[test]
fn a_paused_body_holds_the_request_until_the_filter_continues() {
    let mut host = host("tick_ms=10");
    let stream = host.worker(0).request(Request::post("/", "data").header("x-test-op", "hold-body"));
    let held = host.worker(0).outcome(stream).unwrap().is_paused();

    host.advance(Duration::from_millis(10));

    assert!(held);
    assert_eq!(forwarded(host.worker(0), stream).body_bytes(), b"data");
}

#[test]
fn the_filter_adds_request_trailers() {
    let mut host = host("");

    let forwarded =
        forward(host.worker(0), Request::post("/", "x").header("x-test-op", "trailers").trailer("grpc-x", "1"));

    let trailers = forwarded.trailers.expect("trailers");
    assert_eq!(trailers, Headers::from_pairs([("grpc-x", "1"), ("x-trailer-seen", "yes")]));
}

#[test]
fn the_response_body_can_be_rewritten() {
    let mut host = host("");

    let exchange = host.worker(0).exchange(ops("resp-body"), Response::ok().body("hello")).unwrap();

    assert_eq!(exchange.response.unwrap().body_text(), "hello [filtered]");
}

#[test]
fn continuing_a_stream_releases_its_request_headers_at_once() {
    let mut host = host("");

    forward(host.worker(0), ops("continue-then-read"));

    assert!(
        host.logs_at(LogLevel::Info).contains(&"after continue, reading a request header gives status 2".to_owned())
    );
}

#[test]
fn the_filter_edits_response_trailers() {
    let mut host = host("");
    let upstream = Response::ok().body("data").trailer("grpc-status", "2");

    let exchange = host.worker(0).exchange(ops("resp-trailers"), upstream).unwrap();

    let trailers = exchange.response.unwrap().trailers.unwrap();
    assert_eq!(trailers, Headers::from_pairs([("grpc-status", "0"), ("x-trailer-filtered", "yes")]));
}
