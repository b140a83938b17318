//! Shared data conformance: Envoy's rules, seen from the guest.

use std::sync::Arc;
use std::thread;

use wasm_host::{Request, SetOutcome, SharedDataStore};

use crate::common::{forward, guest, host, text};

fn set(key: &str, value: &str, cas: u32) -> Request {
    Request::get("/")
        .header("x-test-op", "shared-set")
        .header("x-key", key)
        .header("x-value", value)
        .header("x-cas", cas.to_string())
}

fn get(key: &str) -> Request {
    Request::get("/").header("x-test-op", "shared-get").header("x-key", key)
}

#[test]
fn a_missing_key_reads_as_not_found() {
    let mut host = host("");

    let forwarded = forward(host.worker(0), get("nothing"));

    assert_eq!(text(&forwarded, "x-shared-value"), "missing");
}

#[test]
fn creating_a_missing_key_ignores_the_cas() {
    let mut host = host("");

    let written = forward(host.worker(0), set("k", "v", 12345));
    let read = forward(host.worker(0), get("k"));

    assert_eq!(text(&written, "x-shared-set"), "ok");
    assert_eq!(text(&read, "x-shared-value"), "v");
    assert_ne!(text(&read, "x-shared-cas"), "0");
}

#[test]
fn a_stale_cas_is_rejected() {
    let mut host = host("");
    let data = host.shared_data();
    assert_eq!(data.set("k", "first", 0), SetOutcome::Written);
    let (_, stale) = data.get("k").unwrap();
    let worker = host.worker(0);

    let fresh = forward(worker, set("k", "second", stale));
    let again = forward(worker, set("k", "third", stale));

    assert_eq!(text(&fresh, "x-shared-set"), "ok");
    assert_eq!(text(&again, "x-shared-set"), "CasMismatch");
    assert_eq!(host.shared_data().get("k").map(|(v, _)| v), Some(b"second".to_vec()));
}

#[test]
fn a_zero_cas_overwrites_unconditionally() {
    let mut host = host("");
    host.shared_data().set("k", "first", 0);

    let forwarded = forward(host.worker(0), set("k", "second", 0));

    assert_eq!(text(&forwarded, "x-shared-set"), "ok");
    assert_eq!(host.shared_data().get("k").map(|(v, _)| v), Some(b"second".to_vec()));
}

#[test]
fn cas_tokens_are_process_wide_and_keys_are_scoped_by_vm_id() {
    let store = Arc::new(SharedDataStore::new());
    let mut a = guest().vm_id("a").shared_store(Arc::clone(&store)).build().unwrap();
    let mut b = guest().vm_id("b").shared_store(Arc::clone(&store)).build().unwrap();

    forward(a.worker(0), set("k", "from a", 0));
    forward(b.worker(0), set("k", "from b", 0));
    forward(a.worker(0), set("other", "x", 0));

    let (a_value, a_cas) = a.shared_data().get("k").unwrap();
    let (b_value, b_cas) = b.shared_data().get("k").unwrap();
    let (_, other_cas) = a.shared_data().get("other").unwrap();
    assert_eq!((a_value.as_slice(), b_value.as_slice()), (&b"from a"[..], &b"from b"[..]));
    assert_eq!((a_cas, b_cas, other_cas), (1, 2, 3));
    assert_eq!(store.len(), 3);
}

#[test]
fn workers_on_real_threads_lose_no_update_when_they_follow_the_cas_protocol() {
    const WORKERS: usize = 4;
    const INCREMENTS: usize = 250;
    let mut host = guest().workers(WORKERS).build().unwrap();
    // Envoy has no atomic create: the key exists before the race starts.
    host.shared_data().set("counter", "0", 0);

    let retries: usize = thread::scope(|scope| {
        let handles: Vec<_> = host
            .workers_mut()
            .iter_mut()
            .map(|worker| {
                scope.spawn(move || {
                    (0..INCREMENTS)
                        .map(|_| {
                            let forwarded = forward(
                                worker,
                                Request::get("/").header("x-test-op", "cas-incr").header("x-key", "counter"),
                            );
                            assert_ne!(text(&forwarded, "x-cas-value"), "gave-up");
                            text(&forwarded, "x-cas-retries").parse::<usize>().unwrap()
                        })
                        .sum::<usize>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });

    let (value, _) = host.shared_data().get("counter").unwrap();
    assert_eq!(String::from_utf8(value).unwrap(), (WORKERS * INCREMENTS).to_string());
    println!("{} CAS mismatches were retried", retries);
}
