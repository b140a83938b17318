//! HTTP callouts: scripted and real, every outcome Envoy can deliver.

use std::time::Duration;

use wasm_host::{Answer, CalloutFailures, LogLevel, Outcome, Request};

use crate::common::{Behaviour, TestServer, forward, forwarded, guest, ops, refused_addr, text};

fn callout(timeout_ms: u64) -> Request {
    ops("callout")
        .header("x-timeout-ms", timeout_ms.to_string())
        .header("x-callout-header", "extra")
        .header("x-callout-payload", "question")
}

#[test]
fn a_scripted_answer_resumes_the_request_with_the_response() {
    let mut host = guest()
        .scripted_cluster("upstream", |_| Answer::status(200).header("x-from-upstream", "yes").body("ok"))
        .build()
        .unwrap();

    let forwarded = forward(host.worker(0), callout(1000));

    assert_eq!(text(&forwarded, "x-callout-status"), "200");
    assert_eq!(text(&forwarded, "x-callout-headers"), "2");
    assert_eq!(text(&forwarded, "x-callout-body"), "ok");
    assert_eq!(text(&forwarded, "x-callout-body-size"), "2");
    assert_eq!(text(&forwarded, "x-callout-x-from-upstream"), "yes");
    assert_eq!(text(&forwarded, "x-callout-status-code"), "0");
    let sent = host.callouts();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].cluster, "upstream");
    assert_eq!(sent[0].headers.get_str(":authority"), Some("counter"));
    assert_eq!(sent[0].headers.get_str(":method"), Some("POST"));
    assert_eq!(sent[0].headers.get_str("x-extra"), Some("extra"));
    assert_eq!(sent[0].body, b"question");
    assert_eq!(sent[0].trailers.get_str("x-callout-trailer"), Some("t"));
    assert_eq!(sent[0].timeout, Some(Duration::from_millis(1000)));
}

#[test]
fn a_non_2xx_answer_reaches_the_filter_as_a_response() {
    let mut host = guest().scripted_cluster("upstream", |_| Answer::status(503)).build().unwrap();

    let forwarded = forward(host.worker(0), callout(1000));

    assert_eq!(text(&forwarded, "x-callout-status"), "503");
    assert_eq!(text(&forwarded, "x-callout-headers"), "1");
}

#[test]
fn a_delayed_answer_arrives_when_the_clock_reaches_it() {
    let mut host = guest()
        .scripted_cluster("upstream", |_| Answer::status(200).after(Duration::from_millis(300)))
        .build()
        .unwrap();
    let stream = host.worker(0).request(callout(1000));

    host.advance(Duration::from_millis(299));
    let before = host.worker(0).outcome(stream).unwrap().is_paused();
    host.advance(Duration::from_millis(1));

    assert!(before);
    assert_eq!(text(&forwarded(host.worker(0), stream), "x-callout-status"), "200");
}

#[test]
fn a_callout_that_times_out_reaches_the_filter_with_zero_headers() {
    let mut host =
        guest().scripted_cluster("upstream", |_| Answer::status(200).after(Duration::from_secs(2))).build().unwrap();
    let stream = host.worker(0).request(callout(500));

    host.advance(Duration::from_millis(500));

    let forwarded = forwarded(host.worker(0), stream);
    assert_eq!(text(&forwarded, "x-callout-headers"), "0");
    assert_eq!(text(&forwarded, "x-callout-body-size"), "0");
    assert_eq!(text(&forwarded, "x-callout-status-code"), "11");
    assert_eq!(text(&forwarded, "x-callout-status-message"), "reset");
    // Envoy: no response map after a failure; reading a value is BAD_ARGUMENT, pairs are empty.
    assert_eq!(text(&forwarded, "x-callout-read-status"), "2");
    assert_eq!(text(&forwarded, "x-callout-pairs"), "0");
}

#[test]
fn a_never_answered_callout_ends_at_its_timeout() {
    let mut host = guest().scripted_cluster("upstream", |_| Answer::never()).build().unwrap();
    let stream = host.worker(0).request(callout(250));

    host.advance(Duration::from_secs(10));

    assert_eq!(text(&forwarded(host.worker(0), stream), "x-callout-headers"), "0");
}

#[test]
fn a_connection_failure_reaches_the_filter_with_zero_headers() {
    let mut host = guest().scripted_cluster("upstream", |_| Answer::reset()).build().unwrap();

    let forwarded = forward(host.worker(0), callout(1000));

    assert_eq!(text(&forwarded, "x-callout-headers"), "0");
    assert_eq!(text(&forwarded, "x-callout-status-code"), "11");
}

#[test]
fn an_unknown_cluster_is_a_bad_argument_at_dispatch() {
    let mut host = guest().build().unwrap();

    let forwarded = forward(host.worker(0), callout(1000).header("x-cluster", "nope"));

    assert_eq!(text(&forwarded, "x-dispatch-error"), "BadArgument");
    assert!(host.callouts().is_empty());
}

#[test]
fn headers_without_an_authority_are_a_bad_argument_at_dispatch() {
    let mut host = guest().scripted_cluster("upstream", |_| Answer::status(200)).build().unwrap();

    let forwarded = forward(host.worker(0), ops("callout-no-authority"));

    assert_eq!(text(&forwarded, "x-dispatch-error"), "BadArgument");
}

#[test]
fn router_replies_turn_a_timeout_into_a_504_and_a_refused_connection_into_a_503() {
    let mut host = guest()
        .callout_failures(CalloutFailures::RouterReplies)
        .scripted_cluster("slow", |_| Answer::never())
        .scripted_cluster("down", |_| Answer::reset())
        .build()
        .unwrap();
    let slow = host.worker(0).request(callout(100).header("x-cluster", "slow"));
    let down = forward(host.worker(0), callout(100).header("x-cluster", "down"));

    host.advance(Duration::from_millis(100));

    let slow = forwarded(host.worker(0), slow);
    assert_eq!(text(&slow, "x-callout-status"), "504");
    assert_eq!(text(&slow, "x-callout-body"), "upstream request timeout");
    assert_eq!(text(&down, "x-callout-status"), "503");
}

#[test]
fn the_filter_can_deny_with_a_local_response_from_the_callout_answer() {
    let mut host = guest().scripted_cluster("upstream", |_| Answer::status(429)).build().unwrap();

    let exchange = host.worker(0).exchange(ops("callout-deny"), wasm_host::Response::ok()).unwrap();

    let response = exchange.response.unwrap();
    assert_eq!((response.status, response.body_text()), (429, "rate limited".to_owned()));
    assert_eq!(response.headers.get_str("x-denied-by"), Some("callout"));
}

#[test]
fn a_root_context_can_call_out_from_a_tick() {
    let mut host = guest()
        .plugin_configuration("tick_ms=100\ntick_callout=upstream")
        .scripted_cluster("upstream", |_| Answer::status(204))
        .build()
        .unwrap();

    host.advance(Duration::from_millis(100));

    assert_eq!(host.metric("test_guest.root_callouts"), Some(1));
    assert!(
        host.logs_at(LogLevel::Info).contains(&"root 1 callout 1 answered: headers=1 body=0 status=204".to_owned())
    );
}

#[test]
fn a_real_server_answers_a_callout() {
    let server = TestServer::start(Behaviour::Respond(
        "HTTP/1.1 200 OK\r\nx-from-upstream: real\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
    ));
    let mut host = guest().cluster("upstream", server.addr).build().unwrap();

    let forwarded = forward(host.worker(0), callout(2000));

    assert_eq!(text(&forwarded, "x-callout-status"), "200");
    assert_eq!(text(&forwarded, "x-callout-body"), "ok");
    assert_eq!(text(&forwarded, "x-callout-x-from-upstream"), "real");
    let seen = server.requests.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].starts_with("POST /check HTTP/1.1\r\n"), "{}", seen[0]);
    assert!(seen[0].to_ascii_lowercase().contains("host: counter\r\n"), "{}", seen[0]);
    assert!(seen[0].ends_with("\r\nquestion"), "{}", seen[0]);
}

#[test]
fn a_real_server_error_reaches_the_filter_as_a_response() {
    let server =
        TestServer::start(Behaviour::Respond("HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n"));
    let mut host = guest().cluster("upstream", server.addr).build().unwrap();

    let forwarded = forward(host.worker(0), callout(2000));

    assert_eq!(text(&forwarded, "x-callout-status"), "500");
}

#[test]
fn a_refused_connection_reaches_the_filter_with_zero_headers() {
    let mut host = guest().cluster("upstream", refused_addr()).build().unwrap();

    let forwarded = forward(host.worker(0), callout(2000));

    assert_eq!(text(&forwarded, "x-callout-headers"), "0");
    assert_eq!(text(&forwarded, "x-callout-status-message"), "reset");
}

#[test]
fn a_real_server_that_never_answers_times_out_on_the_virtual_clock() {
    let server = TestServer::start(Behaviour::Hold);
    let mut host =
        guest().cluster("upstream", server.addr).real_callout_wait(Duration::from_millis(50)).build().unwrap();
    let stream = host.worker(0).request(callout(1000));
    let paused = host.worker(0).outcome(stream).unwrap() == Outcome::Paused;

    host.advance(Duration::from_millis(1000));

    assert!(paused);
    assert_eq!(text(&forwarded(host.worker(0), stream), "x-callout-headers"), "0");
}
