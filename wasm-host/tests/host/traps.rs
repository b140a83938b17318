//! Traps: never swallowed; the failure policy applies; other workers keep serving.

use std::time::Duration;

use wasm_host::{FailurePolicy, Outcome, Request, Response, ResponseSource};

use crate::common::{forward, guest, ops, text};

#[test]
fn a_panic_fails_the_stream_closed_and_is_reported() {
    let mut host = guest().build().unwrap();

    let exchange = host.worker(0).exchange(ops("headers,panic"), Response::ok()).unwrap();

    let response = exchange.response.unwrap();
    assert_eq!((response.status, response.source), (503, ResponseSource::FailurePolicy));
    let traps = host.traps();
    assert_eq!(traps.len(), 1);
    assert_eq!(traps[0].callback, "proxy_on_request_headers");
    assert_eq!(traps[0].context_id, 2);
    assert_eq!(traps[0].policy, FailurePolicy::FailClosed);
    assert!(
        traps[0].guest_message.as_deref().unwrap_or_default().contains("test guest panics on request 2"),
        "{:?}",
        traps[0]
    );
    assert!(traps[0].message.contains("unreachable"), "{}", traps[0].message);
    assert_eq!(host.metric("wasm_host.traps"), Some(1));
    assert!(host.worker(0).is_failed());
}

#[test]
fn a_failed_closed_worker_answers_503_without_calling_the_guest() {
    let mut host = guest().build().unwrap();
    host.worker(0).exchange(ops("panic"), Response::ok()).unwrap();

    let later = host.worker(0).exchange(ops("metrics"), Response::ok()).unwrap();

    assert_eq!(later.status(), Some(503));
    assert_eq!(host.metric("test_guest.requests"), None);
    assert_eq!(host.traps().len(), 1);
}

#[test]
fn other_workers_keep_serving_after_a_trap() {
    let mut host = guest().workers(2).build().unwrap();

    host.worker(0).exchange(ops("panic"), Response::ok()).unwrap();
    let other = host.worker(1).exchange(ops("headers"), Response::ok()).unwrap();

    assert_eq!(other.status(), Some(200));
    assert!(other.forwarded.is_some());
    assert!(!host.worker(1).is_failed());
}

#[test]
fn fail_open_lets_the_stream_and_later_requests_through() {
    let mut host = guest().failure_policy(FailurePolicy::FailOpen).build().unwrap();

    let trapped = host.worker(0).exchange(ops("headers,panic").header("x-in", "v"), Response::new(201)).unwrap();
    let later = host.worker(0).exchange(Request::get("/later"), Response::new(202)).unwrap();

    // Headers the filter changed before it trapped stay changed, as in Envoy.
    assert_eq!(trapped.forwarded.as_ref().and_then(|m| m.headers.get_str("x-got")), Some("v"));
    assert_eq!(trapped.status(), Some(201));
    assert_eq!(later.status(), Some(202));
    assert_eq!(host.metric("wasm_host.fail_open_streams"), Some(2));
}

#[test]
fn fail_reload_starts_a_fresh_vm_that_keeps_shared_data() {
    let mut host = guest().failure_policy(FailurePolicy::FailReload).build().unwrap();
    let worker = host.worker(0);
    forward(worker, ops("shared-set").header("x-key", "k").header("x-value", "kept"));
    let trapped = worker.exchange(ops("panic"), Response::ok()).unwrap();

    let after = forward(worker, ops("shared-get,ids").header("x-key", "k"));

    assert_eq!(trapped.status(), Some(503));
    assert_eq!(text(&after, "x-shared-value"), "kept");
    assert!(!host.worker(0).is_failed());
    assert_eq!(host.metric("wasm_host.vm_reloads"), Some(1));
    // Context ids keep counting on the new VM, so old and new streams never collide.
    assert!(text(&after, "x-context-id").parse::<u32>().unwrap() > 3);
}

#[test]
fn a_trap_in_a_tick_fails_the_vm_and_its_streams() {
    let mut host = guest().plugin_configuration("tick_ms=100\ntick_panic=1").build().unwrap();
    let paused = host.worker(0).request(ops("pause"));

    host.advance(Duration::from_millis(100));

    let traps = host.traps();
    assert_eq!(traps.len(), 1);
    assert_eq!(traps[0].callback, "proxy_on_tick");
    assert_eq!(host.worker(0).outcome(paused).unwrap().response().map(|r| r.status), Some(503));
    assert_eq!(host.worker(0).exchange(Request::get("/"), Response::ok()).unwrap().status(), Some(503));
}

#[test]
fn streams_held_on_a_failed_vm_get_the_failure_policy() {
    let mut host = guest().failure_policy(FailurePolicy::FailOpen).build().unwrap();
    let held = host.worker(0).request(ops("pause"));

    host.worker(0).exchange(ops("panic"), Response::ok()).unwrap();

    assert!(matches!(host.worker(0).outcome(held).unwrap(), Outcome::Forwarded(_)));
}
