//! Callouts answered by the driver after dispatch (`Answer::deferred`), as a fleet run
//! on several threads answers its proxies' calls to one shared service.

use std::time::Duration;

use wasm_host::{Answer, Request};

use crate::common::{forwarded, guest, ops, text};

fn callout(timeout_ms: u64, payload: &str) -> Request {
    ops("callout").header("x-timeout-ms", timeout_ms.to_string()).header("x-callout-payload", payload)
}

#[test]
fn a_deferred_answer_is_due_its_delay_after_the_dispatch_not_after_it_was_given() {
    let mut host = guest().scripted_cluster("upstream", |_| Answer::deferred()).build().unwrap();
    let stream = host.worker(0).request(callout(1000, "question"));
    host.advance(Duration::from_millis(100));
    let waiting = host.worker(0).outcome(stream).unwrap().is_paused();

    let calls = host.worker(0).take_deferred();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].request.body, b"question");
    let late = host.worker(0).answer_deferred(calls[0].token, Answer::status(200).after(Duration::from_millis(300)));
    host.advance(Duration::from_millis(199));
    let before = host.worker(0).outcome(stream).unwrap().is_paused();
    host.advance(Duration::from_millis(1));

    assert!(waiting && before && !late);
    let forwarded = forwarded(host.worker(0), stream);
    assert_eq!(text(&forwarded, "x-callout-status"), "200");
    assert_eq!(text(&forwarded, "x-callout-body-size"), "0");
}

#[test]
fn each_deferred_call_is_handed_out_once_in_dispatch_order() {
    let mut host = guest().scripted_cluster("upstream", |_| Answer::deferred()).build().unwrap();
    let _first = host.worker(0).request(callout(1000, "first"));
    host.advance(Duration::from_millis(5));
    let _second = host.worker(0).request(callout(1000, "second"));

    let calls = host.worker(0).take_deferred();
    let again = host.worker(0).take_deferred();

    let bodies: Vec<&[u8]> = calls.iter().map(|c| c.request.body.as_slice()).collect();
    assert_eq!(bodies, [b"first".as_slice(), b"second"]);
    assert_eq!(calls[1].dispatched_at - calls[0].dispatched_at, 5_000_000);
    assert!(again.is_empty());
}

#[test]
fn an_answer_given_after_its_due_time_arrives_at_once_and_says_it_was_late() {
    let mut host = guest().scripted_cluster("upstream", |_| Answer::deferred()).build().unwrap();
    let stream = host.worker(0).request(callout(1000, "question"));
    host.advance(Duration::from_millis(100));

    let calls = host.worker(0).take_deferred();
    let late = host.worker(0).answer_deferred(calls[0].token, Answer::status(200).after(Duration::from_millis(10)));
    host.worker(0).run_pending();

    assert!(late);
    assert_eq!(text(&forwarded(host.worker(0), stream), "x-callout-status"), "200");
}

#[test]
fn an_answer_that_never_comes_is_never_late_and_the_timeout_ends_the_call() {
    let mut host = guest().scripted_cluster("upstream", |_| Answer::deferred()).build().unwrap();
    let stream = host.worker(0).request(callout(250, "question"));
    host.advance(Duration::from_millis(100));

    let calls = host.worker(0).take_deferred();
    let late = host.worker(0).answer_deferred(calls[0].token, Answer::never());
    host.advance(Duration::from_millis(149));
    let before = host.worker(0).outcome(stream).unwrap().is_paused();
    host.advance(Duration::from_millis(1));

    assert!(!late && before);
    assert_eq!(text(&forwarded(host.worker(0), stream), "x-callout-status"), "504");
}

#[test]
fn a_deferred_call_times_out_and_its_answer_after_that_is_ignored() {
    let mut host = guest().scripted_cluster("upstream", |_| Answer::deferred()).build().unwrap();
    let stream = host.worker(0).request(callout(250, "question"));
    let calls = host.worker(0).take_deferred();

    host.advance(Duration::from_millis(250));
    let late = host.worker(0).answer_deferred(calls[0].token, Answer::status(200));
    host.worker(0).run_pending();

    assert!(!late);
    assert_eq!(text(&forwarded(host.worker(0), stream), "x-callout-status"), "504");
}
