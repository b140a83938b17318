//! HTTP callouts: scripted and real, every outcome Envoy can deliver (the same classes
//! are compared with real Envoy in `tests/tests/envoy/callouts/`).

use std::time::Duration;

use wasm_host::{Answer, LogLevel, Message, Outcome, Request};

use sluice_testkit::peers::{HOLD_LIMIT, Peer, Step, refused};

use crate::common::{forward, forwarded, guest, ops, text};

const BEFORE_HEADERS: &str = "upstream connect error or disconnect/reset before headers. reset reason: ";

fn callout(timeout_ms: u64) -> Request {
    ops("callout")
        .header("x-timeout-ms", timeout_ms.to_string())
        .header("x-callout-header", "extra")
        .header("x-callout-payload", "question")
}

/// The response header pairs the guest read, in order, as `name: value`.
fn response_headers(message: &Message) -> Vec<String> {
    (0..).map_while(|i| message.headers.get_str(format!("x-callout-response-{i}")).map(str::to_owned)).collect()
}

/// Asserts that the guest got Envoy's router reply with this status and body.
fn assert_router_reply(message: &Message, status: &str, body: &str) {
    assert_eq!(text(message, "x-callout-status"), status);
    assert_eq!(text(message, "x-callout-body"), body);
    let length = format!("content-length: {}", body.len());
    assert_eq!(
        response_headers(message),
        [format!(":status: {status}"), length, "content-type: text/plain".to_owned()]
    );
    assert_eq!(text(message, "x-callout-status-code"), "0");
}

/// Asserts that the guest got `(0, 0, 0)` and the status of a reset.
fn assert_reset(message: &Message) {
    assert_eq!(text(message, "x-callout-headers"), "0");
    assert_eq!(text(message, "x-callout-body-size"), "0");
    assert_eq!(text(message, "x-callout-status-code"), "11");
    assert_eq!(text(message, "x-callout-status-message"), "reset");
    // Envoy: no response map after a reset; reading a value is BAD_ARGUMENT, pairs are
    // empty, the body buffer is not found.
    assert_eq!(text(message, "x-callout-read-status"), "2");
    assert_eq!(text(message, "x-callout-pairs"), "0");
    assert_eq!(text(message, "x-callout-body-read-status"), "1");
}

#[test]
fn a_scripted_answer_resumes_the_request_with_the_response() {
    let mut host = guest()
        .scripted_cluster("upstream", |_| Answer::status(200).header("x-from-upstream", "yes").body("ok"))
        .build()
        .unwrap();

    let forwarded = forward(host.worker(0), callout(1000));

    assert_eq!(text(&forwarded, "x-callout-status"), "200");
    assert_eq!(text(&forwarded, "x-callout-headers"), "3");
    assert_eq!(
        response_headers(&forwarded),
        [":status: 200", "x-from-upstream: yes", "x-envoy-upstream-service-time: 0"]
    );
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
    assert_eq!(text(&forwarded, "x-callout-headers"), "2");
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
    let forwarded = forwarded(host.worker(0), stream);
    assert_eq!(text(&forwarded, "x-callout-status"), "200");
    assert_eq!(response_headers(&forwarded)[1], "x-envoy-upstream-service-time: 300");
}

#[test]
fn an_answer_later_than_the_timeout_is_a_504_from_the_router() {
    let mut host =
        guest().scripted_cluster("upstream", |_| Answer::status(200).after(Duration::from_secs(2))).build().unwrap();
    let stream = host.worker(0).request(callout(500));

    host.advance(Duration::from_millis(500));

    assert_router_reply(&forwarded(host.worker(0), stream), "504", "upstream request timeout");
}

#[test]
fn a_never_answered_callout_is_a_504_at_its_timeout() {
    let mut host = guest().scripted_cluster("upstream", |_| Answer::never()).build().unwrap();
    let stream = host.worker(0).request(callout(250));

    host.advance(Duration::from_millis(249));
    let before = host.worker(0).outcome(stream).unwrap().is_paused();
    host.advance(Duration::from_millis(1));

    assert!(before);
    assert_router_reply(&forwarded(host.worker(0), stream), "504", "upstream request timeout");
}

#[test]
fn a_never_answered_callout_without_a_timeout_never_ends() {
    let mut host = guest().scripted_cluster("upstream", |_| Answer::never()).build().unwrap();
    let stream = host.worker(0).request(callout(0));

    host.advance(Duration::from_secs(3600));

    assert!(host.worker(0).outcome(stream).unwrap().is_paused());
}

#[test]
fn a_refused_connection_is_a_503_from_the_router() {
    let mut host = guest().scripted_cluster("upstream", |_| Answer::refused()).build().unwrap();

    let forwarded = forward(host.worker(0), callout(1000));

    assert_router_reply(&forwarded, "503", &format!("{BEFORE_HEADERS}remote connection failure"));
}

#[test]
fn a_connection_closed_before_answering_is_a_503_from_the_router() {
    let mut host = guest().scripted_cluster("upstream", |_| Answer::closed()).build().unwrap();

    let forwarded = forward(host.worker(0), callout(1000));

    assert_router_reply(&forwarded, "503", &format!("{BEFORE_HEADERS}connection termination"));
}

#[test]
fn an_answer_that_is_not_http_is_a_502_from_the_router() {
    let mut host = guest().scripted_cluster("upstream", |_| Answer::not_http()).build().unwrap();

    let forwarded = forward(host.worker(0), callout(1000));

    assert_router_reply(&forwarded, "502", &format!("{BEFORE_HEADERS}protocol error"));
}

#[test]
fn a_reset_after_the_response_head_reaches_the_filter_with_zero_headers() {
    let mut host = guest()
        .scripted_cluster("upstream", |_| Answer::status(200).header("content-length", "10").body("part").then_reset())
        .build()
        .unwrap();

    let forwarded = forward(host.worker(0), callout(1000));

    assert_reset(&forwarded);
}

#[test]
fn a_body_slower_than_the_timeout_reaches_the_filter_with_zero_headers() {
    let mut host = guest()
        .scripted_cluster("upstream", |_| {
            Answer::status(200).body("part").then_stall().after(Duration::from_millis(100))
        })
        .build()
        .unwrap();
    let early = host.worker(0).request(callout(50));
    let late = host.worker(0).request(callout(500));

    host.advance(Duration::from_millis(500));

    // The head arrives at 100 ms: a timeout before it is a 504, one after it a reset.
    assert_eq!(text(&forwarded(host.worker(0), early), "x-callout-status"), "504");
    assert_reset(&forwarded(host.worker(0), late));
}

#[test]
fn a_reset_leaves_its_status_code_for_the_later_callouts_of_the_root_context() {
    let mut host = guest()
        .scripted_cluster("broken", |_| Answer::status(200).then_reset())
        .scripted_cluster("upstream", |_| Answer::status(200))
        .build()
        .unwrap();

    let before = forward(host.worker(0), callout(1000));
    let reset = forward(host.worker(0), callout(1000).header("x-cluster", "broken"));
    let after = forward(host.worker(0), callout(1000));

    assert_eq!(text(&before, "x-callout-status-code"), "0");
    assert_eq!(text(&reset, "x-callout-status-code"), "11");
    assert_eq!(
        (text(&after, "x-callout-status-code"), text(&after, "x-callout-status-message")),
        ("11".into(), "none".into())
    );
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
        host.logs_at(LogLevel::Info).contains(&"root 1 callout 1 answered: headers=2 body=0 status=204".to_owned())
    );
}

#[test]
fn a_real_server_answers_a_callout() {
    let server = Peer::start(vec![
        Step::write("HTTP/1.1 200 OK\r\nx-from-upstream: real\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"),
        Step::Close,
    ]);
    let mut host = guest().cluster("upstream", server.addr()).build().unwrap();

    let forwarded = forward(host.worker(0), callout(2000));

    assert_eq!(text(&forwarded, "x-callout-status"), "200");
    assert_eq!(text(&forwarded, "x-callout-body"), "ok");
    assert_eq!(text(&forwarded, "x-callout-x-from-upstream"), "real");
    let seen = server.requests_as_text();
    assert_eq!(seen.len(), 1);
    // What Envoy's HTTP/1 codec and router send (trailers dropped).
    assert_eq!(
        seen[0],
        "POST /check HTTP/1.1\r\nhost: counter\r\nx-extra: extra\r\ncontent-length: 8\r\nx-envoy-internal: true\r\n\
         x-envoy-expected-rq-timeout-ms: 2000\r\n\r\nquestion"
    );
}

#[test]
fn a_real_response_keeps_its_headers_in_wire_order_and_loses_its_trailers() {
    let server = Peer::start(vec![
        Step::write(
            "HTTP/1.1 200 OK\r\nX-Dup: 1\r\nTransfer-Encoding: chunked\r\nKeep-Alive: timeout=5\r\nX-Dup: 2\r\n\r\n\
         2\r\nok\r\n0\r\nx-trailer: t\r\n\r\n",
        ),
        Step::Close,
    ]);
    let mut host = guest().cluster("upstream", server.addr()).build().unwrap();

    let forwarded = forward(host.worker(0), callout(2000));

    let mut headers = response_headers(&forwarded);
    let service_time = headers.pop().unwrap();
    assert_eq!(headers, [":status: 200", "x-dup: 1", "transfer-encoding: chunked", "x-dup: 2"]);
    assert!(service_time.starts_with("x-envoy-upstream-service-time: "), "{service_time}");
    assert_eq!(text(&forwarded, "x-callout-body"), "ok");
    assert_eq!(text(&forwarded, "x-callout-trailers"), "0");
}

#[test]
fn a_real_server_error_reaches_the_filter_as_a_response() {
    let server =
        Peer::start(vec![Step::write("HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n"), Step::Close]);
    let mut host = guest().cluster("upstream", server.addr()).build().unwrap();

    let forwarded = forward(host.worker(0), callout(2000));

    assert_eq!(text(&forwarded, "x-callout-status"), "500");
}

#[test]
fn a_real_refused_connection_is_a_503_from_the_router() {
    let mut host = guest().cluster("upstream", refused()).build().unwrap();

    let forwarded = forward(host.worker(0), callout(2000));

    assert_router_reply(&forwarded, "503", &format!("{BEFORE_HEADERS}remote connection failure"));
}

#[test]
fn a_real_server_that_closes_without_answering_is_a_503_from_the_router() {
    let server = Peer::start(vec![Step::write(""), Step::Close]);
    let mut host = guest().cluster("upstream", server.addr()).build().unwrap();

    let forwarded = forward(host.worker(0), callout(2000));

    assert_router_reply(&forwarded, "503", &format!("{BEFORE_HEADERS}connection termination"));
}

#[test]
fn a_real_answer_that_is_not_http_is_a_502_from_the_router() {
    let server = Peer::start(vec![Step::write("this is not http\r\n\r\n"), Step::Close]);
    let mut host = guest().cluster("upstream", server.addr()).build().unwrap();

    let forwarded = forward(host.worker(0), callout(2000));

    assert_router_reply(&forwarded, "502", &format!("{BEFORE_HEADERS}protocol error"));
}

#[test]
fn a_real_head_cut_short_is_a_502_from_the_router() {
    let server = Peer::start(vec![Step::write("HTTP/1.1 200 OK\r\ncontent-"), Step::Close]);
    let mut host = guest().cluster("upstream", server.addr()).build().unwrap();

    let forwarded = forward(host.worker(0), callout(2000));

    assert_eq!(text(&forwarded, "x-callout-status"), "502");
}

#[test]
fn a_real_body_cut_short_reaches_the_filter_with_zero_headers() {
    let server = Peer::start(vec![Step::write("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\npart"), Step::Close]);
    let mut host = guest().cluster("upstream", server.addr()).build().unwrap();

    let forwarded = forward(host.worker(0), callout(2000));

    assert_reset(&forwarded);
}

#[test]
fn a_real_server_that_never_answers_is_a_504_on_the_virtual_clock() {
    let server = Peer::silent();
    let mut host =
        guest().cluster("upstream", server.addr()).real_callout_wait(Duration::from_millis(50)).build().unwrap();
    let stream = host.worker(0).request(callout(1000));
    let paused = host.worker(0).outcome(stream).unwrap() == Outcome::Paused;

    host.advance(Duration::from_millis(1000));

    assert!(paused);
    assert_router_reply(&forwarded(host.worker(0), stream), "504", "upstream request timeout");
}

#[test]
fn a_real_body_slower_than_the_timeout_reaches_the_filter_with_zero_headers() {
    let server =
        Peer::start(vec![Step::write("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\npart"), Step::Wait(HOLD_LIMIT)]);
    let mut host =
        guest().cluster("upstream", server.addr()).real_callout_wait(Duration::from_millis(300)).build().unwrap();
    let stream = host.worker(0).request(callout(1000));

    host.advance(Duration::from_millis(1000));

    assert_reset(&forwarded(host.worker(0), stream));
}

#[test]
fn the_batch_bench_sends_the_requests_that_waited_for_a_call_together_in_one_call() {
    let mut host = guest()
        .plugin_configuration("bench=batch\ncluster=upstream\nin_flight=1")
        .scripted_cluster("upstream", |_| Answer::status(200).after(Duration::from_millis(10)))
        .build()
        .unwrap();
    let first = host.worker(0).request(Request::get("/").header("x-key", "a"));
    let waiting: Vec<_> = (0..3).map(|_| host.worker(0).request(Request::get("/").header("x-key", "b"))).collect();

    let out_before_the_answer = host.callouts().len();
    host.advance(Duration::from_millis(10));
    let all_waiting_paused = waiting.iter().all(|&s| host.worker(0).outcome(s).unwrap().is_paused());
    host.advance(Duration::from_millis(10));

    assert_eq!(out_before_the_answer, 1, "one call in flight: the others wait");
    assert!(matches!(host.worker(0).outcome(first), Ok(Outcome::Forwarded(_))));
    assert!(all_waiting_paused, "the three that waited are carried by the second call");
    for stream in waiting {
        assert!(matches!(host.worker(0).outcome(stream), Ok(Outcome::Forwarded(_))));
    }
    let sent = host.callouts();
    assert_eq!(sent.len(), 2, "three requests that waited went in one call");
    assert_eq!(sent[1].headers.get_str(":path"), Some("/healthz"));
}
